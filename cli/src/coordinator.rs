//! `tessel coordinator`: flags and the environment into a
//! [`tessel_coordinator::serve`] backend (one replica of the key-value
//! service, or etcd attached); the library runs it with the failure monitor
//! and the scheduler beside it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use tessel_cli::identity;
use tessel_coordinator::serve::{serve, Backend};
use tessel_harness::Ready;
use tessel_kv_service::raft::node::ReplicaConfig;
use tessel_kv_service::raft::wal::LogIo;

use crate::args::{Endpoints, TlsArgs};

#[derive(Args)]
pub(crate) struct CoordinatorArgs {
    /// This replica's id (never reuse the id of a removed replica);
    /// default: from the environment (`identity`: a Kubernetes index or
    /// StatefulSet ordinal, or `SLURM_PROCID`, plus 1).
    #[arg(long)]
    pub id: Option<u64>,
    /// Print the identity this replica derived, and where from, then exit.
    #[arg(long)]
    pub print_identity: bool,
    /// Address to listen on (`0.0.0.0:7000`, an IP, or a DNS name this
    /// host's address has, looked up until it resolves); port 0 picks a
    /// free port (printed on start).
    #[arg(long, value_name = "HOST:PORT", required_unless_present_any = ["kv", "print_identity"])]
    pub listen: Option<String>,
    /// Attach to an etcd cluster (`etcd://HOST:PORT[,..]`) instead of
    /// running a replica: only the coordinator's failure monitor runs here.
    #[arg(long, value_name = "URL", conflicts_with_all = ["id", "listen", "peers", "join", "data_dir"])]
    pub kv: Option<String>,
    /// Initial voters, `1=HOST:PORT,2=HOST:PORT,...`, used to form a new
    /// cluster on first start (this replica included). HOST may be a DNS
    /// name (a headless service's pods): it is looked up whenever a link to
    /// the peer is made, and a name that does not resolve yet is retried.
    #[arg(long, value_delimiter = ',', value_parser = parse_peer)]
    pub peers: Vec<(u64, String)>,
    /// Derive `--peers` from the environment, every replica on the port of
    /// `--listen`: a StatefulSet's pods (`HOSTNAME`, `TESSEL_REPLICAS`,
    /// `TESSEL_PEER_DOMAIN`) or a Slurm job step's nodes, one replica per
    /// node (`SLURM_STEP_NODELIST`, else `SLURM_JOB_NODELIST`; names
    /// suffixed with `TESSEL_PEER_DOMAIN` when set).
    #[arg(long, conflicts_with_all = ["peers", "join"])]
    pub peers_from_env: bool,
    /// Join the cluster that the replica at ADDR belongs to.
    #[arg(long, value_name = "ADDR", conflicts_with = "peers")]
    pub join: Option<String>,
    #[arg(long, value_name = "DIR", required_unless_present_any = ["kv", "print_identity"])]
    pub data_dir: Option<PathBuf>,
    /// Take a snapshot (and compact the log) every N entries.
    #[arg(long, default_value_t = 20_000)]
    pub snapshot_every: u64,
    /// Log entries kept behind a snapshot for lagging followers; beyond
    /// that they catch up by snapshot.
    #[arg(long, default_value_t = 1000)]
    pub keep_log_entries: u64,
    /// Serve this process's metrics in Prometheus's text format at
    /// `http://HOST:PORT/metrics` (port 0 picks one, printed on start).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<SocketAddr>,
    /// Threads of the replica's async runtime. Its hot path is serial (the
    /// Raft core, the state machine, the log's writer thread), so more
    /// threads mostly add wake-ups between them (docs/performance.md).
    /// Blocking disk work still hands the other tasks to a fresh thread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: u16,
    /// How the Raft log reaches the disk: `direct` writes whole blocks
    /// with O_DIRECT and O_DSYNC, one call per write (falls back to
    /// `buffered` where the file system refuses O_DIRECT); `buffered`
    /// writes through the page cache, then fdatasync.
    #[arg(long, default_value = "direct", value_parser = parse_log_io)]
    pub log_io: LogIo,
    #[command(flatten)]
    pub tls: TlsArgs,
}

fn parse_log_io(s: &str) -> Result<LogIo, String> {
    match s {
        "direct" => Ok(LogIo::Direct),
        "buffered" => Ok(LogIo::Buffered),
        _ => Err(format!("`{s}`: expected direct or buffered")),
    }
}

fn parse_peer(s: &str) -> Result<(u64, String), String> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected ID=HOST:PORT"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: bad replica id"))?;
    let addr = addr.trim();
    tessel_kv_service::rpc::check_host_port(addr).map_err(|e| format!("`{s}`: {e}"))?;
    Ok((id, addr.to_owned()))
}

/// The port of `--listen`, which peers derived from the environment share.
fn listen_port(listen: &str) -> Result<u16> {
    match listen.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()) {
        Some(0) | None => bail!(
            "--peers-from-env needs a fixed port in --listen (every replica listens on it), not `{listen}`"
        ),
        Some(p) => Ok(p),
    }
}

/// `--listen`: an address, or a name looked up until it resolves (a pod's
/// own DNS record may appear a little after the pod starts).
async fn listen_addr(listen: &str) -> Result<SocketAddr> {
    if let Ok(a) = listen.parse() {
        return Ok(a);
    }
    tessel_kv_service::rpc::check_host_port(listen)
        .map_err(|e| anyhow::anyhow!("--listen {listen}: {e}"))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        match tokio::net::lookup_host(listen).await.map(|mut a| a.next()) {
            Ok(Some(a)) => return Ok(a),
            r => {
                let why = match r {
                    Err(e) => e.to_string(),
                    _ => "no address".into(),
                };
                if std::time::Instant::now() > deadline {
                    bail!("--listen {listen} does not resolve: {why}");
                }
                tracing::warn!(listen, why, "--listen does not resolve yet; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    }
}

pub(crate) async fn coordinator(args: CoordinatorArgs) -> Result<()> {
    let ready = crate::metrics_http::Readiness::new();
    let metrics = crate::metrics_http::serve_if(args.metrics_listen, &ready).await?;
    let (backend, announce) = match &args.kv {
        Some(url) => {
            let etcd = Endpoints::parse_etcd(url).map_err(anyhow::Error::msg)?;
            let kv = std::sync::Arc::from(crate::args::connect_etcd(&etcd).await?);
            (Backend::Attached(kv), format!("etcd://{etcd}"))
        }
        None => match replica_backend(&args).await? {
            Some(b) => (b, String::new()),
            None => return Ok(()), // --print-identity
        },
    };
    let served = serve(backend, move |r| ready.set(r)).await?;
    match (served.id(), served.addr()) {
        // Launchers read this line (the port, when `--listen` said 0).
        (Some(id), Some(listen)) => Ready::Coordinator {
            id,
            listen,
            metrics,
        },
        _ => Ready::Attached {
            kv: announce,
            metrics,
        },
    }
    .announce();
    // `serve` invariant 4: a replica whose Raft core stopped exits.
    let stopped = served.stopped();
    tokio::select! {
        _ = wait_for_signal() => {}
        why = stopped => {
            tracing::error!(why, "the replica's Raft core stopped; exiting so that a supervisor restarts it");
            served.shutdown().await;
            anyhow::bail!("the replica stopped serving: {why}");
        }
    }
    served.shutdown().await;
    Ok(())
}

/// A replica's backend from the flags and the environment; `None` after
/// printing the identity (`--print-identity`).
async fn replica_backend(args: &CoordinatorArgs) -> Result<Option<Backend>> {
    let env = &identity::process_env;
    let (id, source) = identity::replica_id(args.id, env)?;
    let peers: BTreeMap<u64, String> = match (args.peers_from_env, &args.listen) {
        (false, _) => args.peers.iter().cloned().collect(),
        (true, Some(listen)) => {
            let (peers, from) = identity::env_peers(env, listen_port(listen)?)?;
            if args.print_identity {
                let list: Vec<String> = peers.iter().map(|(i, a)| format!("{i}={a}")).collect();
                println!("peers {} (from {from})", list.join(","));
            }
            peers
        }
        (true, None) => bail!("--peers-from-env takes the port from --listen: give --listen"),
    };
    if args.print_identity {
        println!("replica id {id} (from {source})");
        return Ok(None);
    }
    let (Some(listen), Some(data_dir)) = (args.listen.clone(), args.data_dir.clone()) else {
        bail!("give --listen and --data-dir, or --kv etcd://…");
    };
    if args.join.is_none() && !peers.is_empty() && !peers.contains_key(&id) {
        bail!("--peers must include this replica (id {id})");
    }
    let mut raft = ReplicaConfig::default_raft();
    raft.snapshot_policy = openraft_snapshot_policy(args.snapshot_every);
    raft.max_in_snapshot_log_to_keep = args.keep_log_entries;
    let join = match &args.join {
        Some(j) => Some(Endpoints::parse(j).map_err(anyhow::Error::msg)?.0),
        None => None,
    };
    let config = ReplicaConfig {
        id,
        listen: listen_addr(&listen).await?,
        peers,
        data_dir,
        tls: args.tls.load()?,
        raft,
        log_io: args.log_io,
    };
    Ok(Some(Backend::Replica {
        config: Box::new(config),
        join,
    }))
}

fn openraft_snapshot_policy(every: u64) -> tessel_kv_service::raft::SnapshotPolicy {
    tessel_kv_service::raft::SnapshotPolicy::LogsSinceLast(every.max(1))
}

pub(crate) async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
