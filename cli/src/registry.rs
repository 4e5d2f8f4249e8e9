//! The worker registry's commands: `tessel workers` (what it says),
//! `tessel drain` (a request to a worker) and `tessel topology` (a job's
//! global topology as its workers published it).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use tessel_coordinator::keys;
use tessel_coordinator::registry::{list_workers, WorkerState};
use tessel_kv::KvStore;
use tessel_topology::GlobalTopology;

use crate::args::KvTargetArgs;

#[derive(Args)]
pub(crate) struct WorkersArgs {
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

pub(crate) async fn workers(args: WorkersArgs) -> Result<()> {
    let kv = args.target.connect().await?;
    let now = tessel_coordinator::unix_ms();
    println!(
        "{:<16} {:<7} {:>5} {:>15} {:<20} {:>7}  {:<28} JOBS",
        "WORKER", "STATE", "INC", "LAST HEARTBEAT", "HOST", "PID", "DEVICES"
    );
    for w in list_workers(&*kv).await? {
        let (state, beat) = match w.state {
            WorkerState::Alive {
                last_heartbeat_unix_ms,
                ..
            } => (
                "alive",
                format!(
                    "{:.1} s ago",
                    now.saturating_sub(last_heartbeat_unix_ms) as f64 / 1e3
                ),
            ),
            WorkerState::Dead => ("dead", "-".into()),
        };
        let state = match (&w.state, &w.drained) {
            (WorkerState::Alive { .. }, Some(_)) => "drained",
            _ => state,
        };
        let devices: Vec<String> = w
            .record
            .info
            .devices
            .iter()
            .map(|d| format!("{}×{}", d.count, d.kind))
            .collect();
        println!(
            "{:<16} {:<7} {:>5} {:>15} {:<20} {:>7}  {:<28} {}",
            w.record.info.worker_id,
            state,
            w.record.incarnation,
            beat,
            w.record.info.hostname,
            w.record.info.pid,
            devices.join(","),
            w.jobs.join(",")
        );
    }
    Ok(())
}

#[derive(Args)]
pub(crate) struct TopologyArgs {
    #[command(flatten)]
    pub target: KvTargetArgs,
    #[arg(long)]
    pub job: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
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

fn print_table(t: &GlobalTopology) {
    println!(
        "{:>6} {:>7} {:>5} {:>8}  {:<10} {:<20} BOOT",
        "DEVICE", "PROCESS", "SLICE", "LOCAL ID", "KIND", "HOST"
    );
    for d in &t.devices {
        let p = &t.processes[d.process_index as usize];
        println!(
            "{:>6} {:>7} {:>5} {:>8}  {:<10} {:<20} {}",
            d.id,
            d.process_index,
            d.slice,
            d.local_hardware_id,
            d.kind,
            p.hostname,
            p.boot_id.get(..8).unwrap_or(&p.boot_id)
        );
    }
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
    if args.json {
        println!("{}", serde_json::to_string_pretty(&t)?);
    } else {
        print_table(&t);
    }
    Ok(())
}
