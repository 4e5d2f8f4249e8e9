//! The node-side commands: `worker`, `workers`, `topology`, `local`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use tessel::pjrt::locate;
use tessel_coordinator::jobs::{self, JobAssignment};
use tessel_coordinator::registry::{list_workers, WorkerState};
use tessel_coordinator::{keys, LivenessConfig};
use tessel_kv::KvStore;
use tessel_topology::exchange::Published;
use tessel_topology::GlobalTopology;
use tessel_worker::{topology_digest, Worker, WorkerConfig};

use crate::cluster_cli::{wait_for_signal, KvTargetArgs};
use crate::procs::ChildProc;

#[derive(Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub target: KvTargetArgs,
    /// A plugin name (cpu, cuda, cpu-lammps, cpu-fastatomstruct) or a path.
    #[arg(long, value_name = "NAME|PATH")]
    pub plugin: Option<String>,
    /// CPU devices per client (the CPU plugin's `cpu_device_count`).
    #[arg(long)]
    pub devices: Option<usize>,
    /// This worker's id, stable across restarts (default: the hostname).
    #[arg(long)]
    pub worker_id: Option<String>,
    /// Heartbeat interval.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// Lease TTL: a worker silent this long is dead.
    #[arg(long, default_value_t = 5000)]
    pub ttl_ms: u64,
    /// An explicit slice index for the topology (default: by boot id).
    #[arg(long)]
    pub slice: Option<u32>,
    /// The address job processes bind their transfer endpoints to (default:
    /// the address this host uses to reach the first coordinator).
    #[arg(long, value_name = "IP")]
    pub transfer_ip: Option<std::net::IpAddr>,
    /// Serve this process's metrics (its job processes' transfers and
    /// collectives included) in Prometheus's text format at
    /// `http://HOST:PORT/metrics` (port 0 picks one, printed on start).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<SocketAddr>,
    /// A folder under which jobs may keep checkpoints on this host (an
    /// absolute path; repeat for several). Without one, jobs that
    /// checkpoint fail on this worker, saying so.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_root: Vec<PathBuf>,
}

/// The local address of the route to `target` (no packet is sent).
fn outbound_ip(target: SocketAddr) -> Result<std::net::IpAddr> {
    let any: SocketAddr = if target.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let socket = std::net::UdpSocket::bind(any)?;
    socket
        .connect(target)
        .with_context(|| format!("no route to {target}"))?;
    Ok(socket.local_addr()?.ip())
}

/// Where this worker's job processes listen for transfers.
fn transfer_ip(args: &WorkerArgs) -> Result<std::net::IpAddr> {
    if let Some(ip) = args.transfer_ip {
        return Ok(ip);
    }
    let first = match (&args.target.coordinator, &args.target.kv) {
        (Some(list), _) => list.split(',').next().unwrap_or_default().trim().to_owned(),
        (None, Some(url)) => url
            .trim_start_matches("etcd://")
            .split(',')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned(),
        (None, None) => String::new(),
    };
    let target = std::net::ToSocketAddrs::to_socket_addrs(&first)
        .with_context(|| format!("cannot resolve {first:?} to choose --transfer-ip"))?
        .next()
        .with_context(|| format!("{first:?} resolves to nothing; pass --transfer-ip"))?;
    outbound_ip(target)
}

pub async fn worker(args: WorkerArgs) -> Result<()> {
    crate::metrics_http::serve_if(args.metrics_listen).await?;
    for root in &args.checkpoint_root {
        if !root.is_absolute() {
            bail!(
                "--checkpoint-root {}: give an absolute path",
                root.display()
            );
        }
    }
    let kv: Arc<dyn KvStore> = Arc::from(args.target.connect().await?);
    kv.revision().await.with_context(|| {
        format!(
            "cannot reach the coordinators ({}); are they up, and is this worker's certificate from the cluster's CA?",
            args.target.describe()
        )
    })?;
    let plugin_name = args
        .plugin
        .clone()
        .or_else(|| {
            std::env::var(locate::PLUGIN_ENV)
                .ok()
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "cpu".into());
    let plugin = locate::resolve(Some(&plugin_name))?;
    let transfer_ip = transfer_ip(&args)?;
    let tls = args.target.tls.load()?;
    // Default id: the name in this worker's certificate, else the hostname.
    let worker_id = match (args.worker_id, tls.as_ref().map(|t| t.identity())) {
        (Some(id), _) => id,
        (
            None,
            Some(tessel_net::tls::Identity::Node {
                role: tessel_net::tls::Role::Worker,
                name,
            }),
        ) => name.clone(),
        (None, _) => tessel_worker::HostFacts::read().hostname,
    };
    let cfg = WorkerConfig {
        worker_id,
        plugin_name,
        plugin,
        devices: args.devices,
        liveness: LivenessConfig {
            heartbeat: Duration::from_millis(args.heartbeat_ms),
            ttl: Duration::from_millis(args.ttl_ms),
        },
        slice_index: args.slice,
        transfer_ip,
        transfer_tls: tls,
        checkpoint_roots: args.checkpoint_root.clone(),
    };
    let w = Worker::start(kv, cfg, Arc::new(tessel::plan::PlanRunner)).await?;
    // Launchers, benchmarks and tests read this line.
    let (load, ready_at) = w.plugin_load();
    println!(
        "worker {} registered as incarnation {} (plugin ready in {} ms, at {ready_at})",
        w.registration().worker_id,
        w.registration().incarnation,
        load.as_millis()
    );
    w.run(wait_for_signal(), |reg| {
        println!(
            "worker {} registered as incarnation {} (again, after losing its registration)",
            reg.worker_id, reg.incarnation
        )
    })
    .await?;
    Ok(())
}

#[derive(Args)]
pub struct WorkersArgs {
    #[command(flatten)]
    pub target: KvTargetArgs,
}

pub async fn workers(args: WorkersArgs) -> Result<()> {
    let kv = args.target.connect().await?;
    let now = keys::unix_ms();
    println!(
        "{:<16} {:<6} {:>5} {:>15} {:<20} {:>7}  {:<28} JOBS",
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
        let devices: Vec<String> = w
            .record
            .info
            .devices
            .iter()
            .map(|d| format!("{}×{}", d.count, d.kind))
            .collect();
        println!(
            "{:<16} {:<6} {:>5} {:>15} {:<20} {:>7}  {:<28} {}",
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
pub struct TopologyArgs {
    #[command(flatten)]
    pub target: KvTargetArgs,
    #[arg(long)]
    pub job: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

async fn read_topology(kv: &dyn KvStore, job: &str, wait: Duration) -> Result<GlobalTopology> {
    let key = tessel_topology::keys::global(job);
    let bytes = kv
        .get(key.as_bytes(), wait)
        .await
        .with_context(|| format!("no topology for job `{job}`"))?;
    match Published::decode(&bytes)? {
        Published::Topology(t) => Ok(t),
        Published::Failed(reason) => bail!("the topology exchange of job `{job}` failed: {reason}"),
    }
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

pub async fn topology(args: TopologyArgs) -> Result<()> {
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

#[derive(Args)]
pub struct LocalArgs {
    /// A job spec to run on the fresh cluster: one worker per process of
    /// the spec; exits with the job's status.
    pub job: Option<PathBuf>,
    /// Where to write every array's final value (`NAME.npy`).
    #[arg(long, value_name = "DIR", requires = "job")]
    pub out: Option<PathBuf>,
    /// Coordinator replicas to start.
    #[arg(long, default_value_t = 3)]
    pub coordinators: u64,
    /// Worker processes to start (without a job spec).
    #[arg(long, default_value_t = 2, conflicts_with = "job")]
    pub workers: u32,
    /// CPU devices per worker (without a job spec).
    #[arg(long, default_value_t = 2, conflicts_with = "job")]
    pub devices_per_worker: usize,
    /// A plugin name or path for the workers.
    #[arg(long, value_name = "NAME|PATH")]
    pub plugin: Option<String>,
    /// Print the job's global topology as JSON and exit.
    #[arg(long)]
    pub print_topology: bool,
    /// How long the topology exchange may take.
    #[arg(long, default_value_t = 60_000)]
    pub timeout_ms: u64,
    /// Keep the cluster up after printing, until Ctrl-C, to explore it with
    /// `tessel workers`, `tessel topology`, `tessel kv` (the addresses and
    /// the TLS folder are printed on stderr).
    #[arg(long)]
    pub keep_running: bool,
}

/// Everything `tessel local` started; dropping it stops every child and
/// removes the folder.
pub(crate) struct LocalCluster {
    pub workers: Vec<ChildProc>,
    /// `--checkpoint-root` of every worker started from now on.
    pub checkpoint_roots: Vec<PathBuf>,
    coordinators: Vec<ChildProc>,
    pub addrs: Vec<String>,
    dir: tempfile::TempDir,
}

impl LocalCluster {
    /// A folder with the cluster's certificates; nothing started yet.
    pub fn new() -> Result<LocalCluster> {
        let dir = tessel::scratch::scratch_dir("local")?;
        tessel_net::tls::init_certs(&dir.path().join("tls"), &["127.0.0.1".into()])?;
        Ok(LocalCluster {
            workers: Vec::new(),
            checkpoint_roots: Vec::new(),
            coordinators: Vec::new(),
            addrs: Vec::new(),
            dir,
        })
    }

    pub fn tls_dir(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    /// A client of the coordinators started so far.
    pub fn client(&self) -> Result<tessel_kvstore::raft::client::RaftKv> {
        let tls = tessel_net::tls::TlsFiles::load(&self.tls_dir())?;
        Ok(tessel_kvstore::raft::client::RaftKv::connect(
            self.addrs
                .iter()
                .map(|a| a.parse())
                .collect::<Result<_, _>>()?,
            Some(&tls),
        )?)
    }

    /// `tessel worker` arguments for worker `id` of this cluster, with
    /// `plugin` a name or a path.
    pub fn worker_args(&self, id: &str, plugin: &str, devices: usize) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "worker".into(),
            "--coordinator".into(),
            self.addrs.join(","),
            "--tls-dir".into(),
            self.tls_dir().display().to_string(),
            "--plugin".into(),
            plugin.into(),
            "--devices".into(),
            devices.to_string(),
            "--worker-id".into(),
            id.into(),
        ];
        for root in &self.checkpoint_roots {
            args.extend(["--checkpoint-root".into(), root.display().to_string()]);
        }
        args
    }

    /// Starts `n` workers `w0..` with `devices` devices each and waits
    /// until every one has registered.
    pub fn start_workers(&mut self, n: u32, plugin: &str, devices: usize) -> Result<()> {
        for i in 0..n {
            let wargs = self.worker_args(&format!("w{i}"), plugin, devices);
            self.workers
                .push(ChildProc::spawn(&format!("worker w{i}"), &wargs, &[])?);
        }
        for w in &mut self.workers {
            w.wait_for(Duration::from_secs(120), |l| {
                l.contains(" registered as incarnation ").then_some(())
            })?;
        }
        Ok(())
    }

    /// Starts `n` coordinator replicas: the first forms the cluster, the
    /// others join it.
    pub fn start_coordinators(&mut self, n: u64) -> Result<()> {
        for id in 1..=n {
            let mut args: Vec<String> = vec![
                "coordinator".into(),
                "--id".into(),
                id.to_string(),
                "--listen".into(),
                "127.0.0.1:0".into(),
                "--data-dir".into(),
                self.dir
                    .path()
                    .join(format!("replica-{id}"))
                    .display()
                    .to_string(),
                "--tls-dir".into(),
                self.tls_dir().display().to_string(),
            ];
            match self.addrs.first() {
                None => args.extend(["--peers".into(), format!("{id}=127.0.0.1:0")]),
                Some(first) => args.extend(["--join".into(), first.clone()]),
            }
            let mut p = ChildProc::spawn(&format!("coordinator {id}"), &args, &[])?;
            let addr = p.wait_for(Duration::from_secs(60), |line| {
                line.split("listening on ")
                    .nth(1)
                    .map(|a| a.trim().to_owned())
            })?;
            if id > 1 {
                p.wait_for(Duration::from_secs(60), |l| {
                    l.ends_with(" joined").then_some(())
                })?;
            }
            self.addrs.push(addr);
            self.coordinators.push(p);
        }
        Ok(())
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // Workers first (they revoke their leases), then coordinators,
        // all at once so none outlives its peers long enough to complain.
        ChildProc::terminate_all(&mut self.workers, Duration::from_secs(3));
        ChildProc::terminate_all(&mut self.coordinators, Duration::from_secs(3));
    }
}

pub async fn local(args: LocalArgs) -> Result<()> {
    if args.job.is_none() && !args.print_topology {
        bail!("give a job spec to run, or --print-topology to bring the cluster up and print its topology");
    }
    if args.job.is_some() && args.print_topology {
        bail!("--print-topology is for a cluster without a job");
    }
    if args.workers == 0 || args.coordinators == 0 {
        bail!("--workers and --coordinators must be at least 1");
    }
    // Refuse a bad spec before starting anything.
    let job = match &args.job {
        Some(path) => Some(tessel::job::JobSpec::load(path)?),
        None => None,
    };
    let mut cluster = LocalCluster::new()?;
    let result = tokio::select! {
        r = async {
            match &job {
                Some(job) => crate::job_cli::run_on_local(&mut cluster, &args, job).await,
                None => run_local(&mut cluster, &args).await,
            }
        } => r,
        () = wait_for_signal() => {
            if args.keep_running { Ok(()) } else { Err(anyhow::anyhow!("interrupted")) }
        }
    };
    drop(cluster);
    result
}

async fn run_local(cluster: &mut LocalCluster, args: &LocalArgs) -> Result<()> {
    cluster.start_coordinators(args.coordinators)?;
    let kv = cluster.client()?;
    let plugin = locate::resolve(args.plugin.as_deref())?;
    cluster.start_workers(
        args.workers,
        &plugin.display().to_string(),
        args.devices_per_worker,
    )?;
    let job = format!("local-{}", std::process::id());
    for i in 0..args.workers {
        let a = JobAssignment {
            job: job.clone(),
            process_index: i,
            num_processes: args.workers,
            topology_timeout_ms: args.timeout_ms,
        };
        jobs::assign(&kv, &format!("w{i}"), &a).await?;
    }
    let wait = Duration::from_millis(args.timeout_ms) + Duration::from_secs(5);
    let topology = tokio::select! {
        t = read_topology(&kv, &job, wait) => t?,
        f = jobs::wait_for_failure(&kv, &job, wait) => match f? {
            Some(f) => bail!("job `{job}` failed: {f}"),
            None => bail!("job `{job}`: no topology within {wait:?}"),
        },
    };
    // Every process holds the same topology (the digests it published).
    let want = topology_digest(&topology);
    for i in 0..args.workers {
        let key = keys::process_topology(&job, i);
        let got = kv.get(key.as_bytes(), wait).await?;
        if got != want.as_bytes() {
            bail!("process {i} holds a different topology");
        }
    }
    println!("{}", serde_json::to_string_pretty(&topology)?);
    jobs::finish_job(&kv, &job).await?;
    if args.keep_running {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        eprintln!(
            "cluster up: --coordinator {} --tls-dir {} (job `{job}`); Ctrl-C stops it",
            cluster.addrs.join(","),
            cluster.tls_dir().display()
        );
        std::future::pending::<()>().await;
    }
    Ok(())
}
