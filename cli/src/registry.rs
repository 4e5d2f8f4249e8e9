//! The worker registry's commands: `tessel workers` (what it says),
//! `tessel drain` (a request to a worker) and `tessel topology` (a job's
//! global topology as its workers published it).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tessel_coordinator::keys;
use tessel_coordinator::registry::{list_workers, WorkerState, WorkerStatus};
use tessel_kv::KvStore;
use tessel_topology::{GlobalTopology, LocalTopology};

use crate::args::KvTargetArgs;
use crate::output::{print_document, print_table, OutputArgs};

#[derive(Args)]
pub(crate) struct WorkersArgs {
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub target: KvTargetArgs,
}

/// `tessel drain WORKER [--undo] [--reason TEXT]`.
#[derive(Args)]
pub(crate) struct DrainArgs {
    /// The worker's id.
    pub worker: String,
    /// Why (shown to the job's processes in their notice).
    #[arg(long, default_value = "tessel drain")]
    pub reason: String,
    /// Take placements again.
    #[arg(long)]
    pub undo: bool,
    #[command(flatten)]
    pub target: KvTargetArgs,
}

/// Marks a worker drained: no new placements there, and every attempt it
/// runs gets a preemption notice (plans checkpoint at an agreed step and
/// resume elsewhere; command jobs' processes find their notice file).
pub(crate) async fn drain(args: DrainArgs) -> Result<()> {
    tessel_coordinator::check_id("worker id", &args.worker)?;
    let kv = args.target.connect().await?;
    let key = keys::drain(&args.worker);
    if args.undo {
        kv.delete(key.as_bytes()).await?;
        println!("worker `{}` takes placements again", args.worker);
    } else {
        kv.put(key.as_bytes(), args.reason.as_bytes()).await?;
        println!("worker `{}` drained: {}", args.worker, args.reason);
    }
    Ok(())
}

/// A worker as `workers -o json` shows it (docs/schemas/worker-list.json).
#[derive(Serialize)]
struct WorkerView<'a> {
    id: &'a str,
    /// `alive`, `drained` (alive, taking no placements) or `dead`.
    state: &'static str,
    incarnation: u64,
    /// Since when its current incarnation is alive.
    alive_since_unix_ms: Option<u64>,
    hostname: &'a str,
    boot_id: &'a str,
    pid: u32,
    plugin: &'a str,
    platform: &'a str,
    devices: Vec<DeviceView<'a>>,
    jobs: &'a [String],
    drained: Option<&'a str>,
}

/// Devices of one kind, as the schema names them.
#[derive(Serialize)]
struct DeviceView<'a> {
    kind: &'a str,
    count: u32,
}

impl<'a> From<&'a WorkerStatus> for WorkerView<'a> {
    fn from(w: &'a WorkerStatus) -> WorkerView<'a> {
        let info = &w.record.info;
        let (state, since) = match (&w.state, &w.drained) {
            (WorkerState::Alive { since_unix_ms, .. }, None) => ("alive", Some(*since_unix_ms)),
            (WorkerState::Alive { since_unix_ms, .. }, Some(_)) => {
                ("drained", Some(*since_unix_ms))
            }
            (WorkerState::Dead, _) => ("dead", None),
        };
        WorkerView {
            id: &info.worker_id,
            state,
            incarnation: w.record.incarnation,
            alive_since_unix_ms: since,
            hostname: &info.hostname,
            boot_id: &info.boot_id,
            pid: info.pid,
            plugin: &info.plugin,
            platform: &info.platform,
            devices: info
                .devices
                .iter()
                .map(|d| DeviceView {
                    kind: &d.kind,
                    count: d.count,
                })
                .collect(),
            jobs: &w.jobs,
            drained: w.drained.as_deref(),
        }
    }
}

pub(crate) async fn workers(args: WorkersArgs) -> Result<()> {
    let kv = args.target.connect().await?;
    let all = list_workers(&*kv).await?;
    let views: Vec<WorkerView> = all.iter().map(WorkerView::from).collect();
    if args.output.json() {
        return print_document("WorkerList", &serde_json::json!({ "workers": views }));
    }
    let now = tessel_coordinator::unix_ms();
    let mut header = vec![
        "WORKER",
        "STATE",
        "INC",
        "ALIVE FOR",
        "HOST",
        "PID",
        "DEVICES",
        "JOBS",
    ];
    if args.output.wide() {
        header.extend(["PLUGIN", "PLATFORM", "BOOT", "DRAINED"]);
    }
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|w| {
            let devices: Vec<String> = w
                .devices
                .iter()
                .map(|d| format!("{}×{}", d.count, d.kind))
                .collect();
            let mut row = vec![
                w.id.to_owned(),
                w.state.to_owned(),
                w.incarnation.to_string(),
                w.alive_since_unix_ms.map_or("-".into(), |t| {
                    format!("{:.0} s", now.saturating_sub(t) as f64 / 1e3)
                }),
                w.hostname.to_owned(),
                w.pid.to_string(),
                devices.join(","),
                w.jobs.join(","),
            ];
            if args.output.wide() {
                row.extend([
                    w.plugin.to_owned(),
                    w.platform.to_owned(),
                    w.boot_id.get(..8).unwrap_or(w.boot_id).to_owned(),
                    w.drained.unwrap_or("-").to_owned(),
                ]);
            }
            row
        })
        .collect();
    print_table(&header, &rows);
    Ok(())
}

#[derive(Args)]
pub(crate) struct TopologyArgs {
    #[command(flatten)]
    pub target: KvTargetArgs,
    #[arg(long)]
    pub job: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

pub(crate) async fn read_topology(
    kv: &dyn KvStore,
    job: &str,
    wait: Duration,
) -> Result<GlobalTopology> {
    tessel_topology::exchange::global(kv, job, wait)
        .await
        .with_context(|| format!("no topology for job `{job}`"))
}

fn topology_table(t: &GlobalTopology, locals: &BTreeMap<u32, LocalTopology>, wide: bool) {
    let mut header = vec![
        "DEVICE", "PROCESS", "SLICE", "LOCAL ID", "KIND", "HOST", "BOOT",
    ];
    if wide {
        header.extend(["WORKER", "MEMORY", "ENDPOINT"]);
    }
    let rows: Vec<Vec<String>> = t
        .devices
        .iter()
        .map(|d| {
            let l = locals.get(&d.process_index);
            let mut row = vec![
                d.id.to_string(),
                d.process_index.to_string(),
                d.slice.to_string(),
                d.local_hardware_id.to_string(),
                d.kind.clone(),
                l.map_or("-".into(), |l| l.hostname.clone()),
                l.map_or("-", |l| l.boot_id.get(..8).unwrap_or(&l.boot_id))
                    .to_owned(),
            ];
            if wide {
                row.extend([
                    l.map_or("-".into(), |l| l.worker.clone()),
                    d.memory_bytes.map_or("-".into(), |b| b.to_string()),
                    l.and_then(|l| l.transfer_endpoint.clone())
                        .unwrap_or_else(|| "-".into()),
                ]);
            }
            row
        })
        .collect();
    print_table(&header, &rows);
}

pub(crate) async fn topology(args: TopologyArgs) -> Result<()> {
    let kv = args.target.connect().await?;
    // A scheduled job's id names its current attempt (`ID@A`).
    let (_, state) = tessel_coordinator::scheduler::read_state(&*kv).await?;
    let job = match state.job(&args.job) {
        Some(j) if j.attempt > 0 => j.instance(),
        Some(j) => bail!("job `{}` is {} and has no topology yet", j.id, j.state),
        None => args.job.clone(),
    };
    let t = read_topology(&*kv, &job, Duration::ZERO).await?;
    let locals = directory(&*kv, &job).await?;
    if args.output.json() {
        // Version 1's document: each process's boot id, not its machine,
        // and its worker, host and endpoint, from its local topology.
        let mut doc = serde_json::to_value(&t)?;
        if let Some(ps) = doc["processes"].as_array_mut() {
            for p in ps.iter_mut().filter_map(|p| p.as_object_mut()) {
                p.remove("machine");
                let i = p["process_index"].as_u64().unwrap_or(u64::MAX);
                let l = u32::try_from(i).ok().and_then(|i| locals.get(&i));
                let text = |f: fn(&LocalTopology) -> &str| l.map_or("", f).to_owned();
                p.insert("worker".into(), text(|l| &l.worker).into());
                p.insert("hostname".into(), text(|l| &l.hostname).into());
                p.insert("boot_id".into(), text(|l| &l.boot_id).into());
                let endpoint = l.and_then(|l| l.transfer_endpoint.clone());
                p.insert("transfer_endpoint".into(), endpoint.into());
            }
        }
        return print_document(
            "Topology",
            &serde_json::json!({ "job": job, "topology": doc }),
        );
    }
    topology_table(&t, &locals, args.output.wide());
    Ok(())
}

/// Each process's local topology (its worker, host, boot id and endpoint:
/// the job's directory, which the global topology leaves out): one
/// listing, for people and scripts; a job's processes read only the
/// peers they talk to.
async fn directory(kv: &dyn KvStore, job: &str) -> Result<BTreeMap<u32, LocalTopology>> {
    let prefix = tessel_topology::keys::local_prefix(job);
    let pairs = kv
        .list(prefix.as_bytes())
        .await
        .with_context(|| format!("listing the local topologies of `{job}`"))?;
    Ok(pairs
        .iter()
        .filter_map(|p| {
            let i = tessel_topology::keys::parse_local(job, &p.key)?;
            Some((i, LocalTopology::decode(&p.value).ok()?))
        })
        .collect())
}
