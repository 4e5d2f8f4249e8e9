//! `tessel worker`: the per-host agent.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use tessel_coordinator::LivenessConfig;
use tessel_harness::Ready;
use tessel_kv::KvStore;
use tessel_worker::{Worker, WorkerConfig};

use crate::args::{KvTargetArgs, PluginArg};
use crate::coordinator::wait_for_signal;

#[derive(Args)]
pub(crate) struct WorkerArgs {
    #[command(flatten)]
    pub target: KvTargetArgs,
    #[command(flatten)]
    pub plugin: PluginArg,
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
    /// The name other hosts reach this one by, for libtpu's host list
    /// (default: the kernel's host name). In a pod give `HOST.SUBDOMAIN`:
    /// the short pod name does not resolve.
    #[arg(long, value_name = "NAME")]
    pub host_name: Option<String>,
    /// The address job processes bind their transfer endpoints to (default:
    /// the address this host uses to reach the first coordinator).
    #[arg(long, value_name = "IP")]
    pub transfer_ip: Option<std::net::IpAddr>,
    /// `off` declares this worker's network trusted: its jobs' bulk
    /// transfers then go over plain TCP (set up over mutual TLS; README,
    /// "Threat model"). Every worker of a job must agree.
    #[arg(long, value_name = "on|off", default_value_t = tessel_transfer::Encryption::On)]
    pub transfer_encryption: tessel_transfer::Encryption,
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
    /// Where command jobs' attempts get their folders (the job's files,
    /// the working directory); default: a folder under the system's temp
    /// folder named after the worker.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// On SIGTERM (or `tessel drain`), how long command jobs' processes
    /// have between the preemption notice (the file at
    /// `$TESSEL_PREEMPT_FILE`) and SIGTERM; plan jobs checkpoint at their
    /// next agreed step instead.
    #[arg(long, default_value_t = 10_000)]
    pub preempt_grace_ms: u64,
    /// Also print every line of its command jobs' processes on this
    /// worker's stdout, prefixed `[JOB@ATTEMPT pRANK]` and rate-limited
    /// (the key-value service keeps them for `tessel logs` either way).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub echo_job_output: bool,
    /// Print the identity this worker derived, and where from, then exit.
    #[arg(long)]
    pub print_identity: bool,
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
    let service = args.target.service()?;
    let first = service.endpoints().first();
    let target = std::net::ToSocketAddrs::to_socket_addrs(first)
        .with_context(|| format!("cannot resolve {first:?} to choose --transfer-ip"))?
        .next()
        .with_context(|| format!("{first:?} resolves to nothing; pass --transfer-ip"))?;
    outbound_ip(target)
}

/// What command jobs' processes are told about the cluster: the
/// coordinators (or etcd) and the TLS folder, as this worker reaches them.
fn command_env(args: &WorkerArgs) -> Result<Vec<(String, String)>> {
    let mut env = vec![(
        "TESSEL_COORDINATORS".to_owned(),
        args.target.service()?.to_string(),
    )];
    if let Some(dir) = &args.target.tls.tls_dir {
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
        env.push(("TESSEL_TLS_DIR".to_owned(), dir.display().to_string()));
    }
    Ok(env)
}

/// The worker id: the flag, else its certificate's name, else the
/// hostname (unique per pod or host); and where it came from.
fn worker_identity(
    args: &WorkerArgs,
    tls: Option<&tessel_tls::TlsFiles>,
) -> (String, &'static str) {
    match (args.worker_id.clone(), tls.map(|t| t.identity())) {
        (Some(id), _) => (id, "--worker-id"),
        (
            None,
            Some(tessel_tls::Identity::Node {
                role: tessel_tls::Role::Worker,
                name,
            }),
        ) => (name.clone(), "its certificate"),
        (None, _) => (tessel_worker::HostFacts::read().hostname, "the hostname"),
    }
}

pub(crate) async fn worker(args: WorkerArgs) -> Result<()> {
    if args.print_identity {
        let tls = args.target.tls.load()?;
        let (id, source) = worker_identity(&args, tls.as_ref());
        println!("worker id {id} (from {source})");
        match tessel_cli::identity::env_index(&tessel_cli::identity::process_env) {
            Ok(Some(i)) => println!("index {} (from {})", i.index, i.source),
            Ok(None) => println!("index: none in the environment"),
            Err(e) => println!("index: {e}"),
        }
        return Ok(());
    }
    tessel_worker::reaper::start_if_init();
    let ready = crate::metrics_http::Readiness::new();
    let metrics = crate::metrics_http::serve_if(args.metrics_listen, &ready).await?;
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
            args.target.service().map(|s| s.to_string()).unwrap_or_default()
        )
    })?;
    let plugin_name = args.plugin.name();
    let plugin = args.plugin.path()?;
    let transfer_ip = transfer_ip(&args)?;
    let tls = args.target.tls.load()?;
    // Default id: the name in this worker's certificate, else the hostname.
    let (worker_id, _) = worker_identity(&args, tls.as_ref());
    let cfg = WorkerConfig {
        plugin_name,
        plugin,
        devices: args.devices,
        liveness: LivenessConfig {
            heartbeat: Duration::from_millis(args.heartbeat_ms),
            ttl: Duration::from_millis(args.ttl_ms),
        },
        slice_index: args.slice,
        host_name: args.host_name.clone(),
        echo_job_output: args.echo_job_output,
        // Read once at start: later jobs' variables must not look like the
        // platform's.
        tpu_platform_env: tessel_worker::tpu::platform_env(|k| std::env::var(k).ok()),
        transfer_ip,
        transfer_tls: tls,
        transfer_encryption: args.transfer_encryption,
        checkpoint_roots: args.checkpoint_root.clone(),
        plugin_options: args.plugin.options()?,
        work_dir: args
            .work_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("tessel-worker-{worker_id}"))),
        command_env: command_env(&args)?,
        preempt_grace: Duration::from_millis(args.preempt_grace_ms),
        worker_id,
    };
    let w = Worker::start(kv, cfg, Arc::new(tessel::plan::PlanRunner)).await?;
    // Launchers, benchmarks and tests read this line.
    let (load, ready_at) = w.plugin_load();
    let announce = |reg: &tessel_coordinator::Registration, again: bool| {
        Ready::Worker {
            worker: reg.worker_id.clone(),
            incarnation: reg.incarnation,
            again,
            plugin_ms: load.as_millis() as u64,
            plugin_ready_unix_ms: ready_at,
            metrics,
        }
        .announce()
    };
    announce(&w.registration(), false);
    let mut registered = w.registration_watch();
    tokio::spawn(async move {
        loop {
            let state = match &*registered.borrow_and_update() {
                Some(_) => Ok(()),
                None => Err("holds no lease (registering)".to_owned()),
            };
            ready.set(state);
            if registered.changed().await.is_err() {
                return;
            }
        }
    });
    w.run(wait_for_signal(), |reg| announce(reg, true)).await?;
    Ok(())
}
