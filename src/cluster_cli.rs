//! The coordinator-side commands: `certs`, `coordinator`, `kv`, `cluster`.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use futures::StreamExt;
use tessel_kv::{show_key, Event, KvStore};
use tessel_kvstore::raft::client::RaftKv;
use tessel_kvstore::raft::node::{Replica, ReplicaConfig};
use tessel_kvstore::raft::wal::LogIo;
use tessel_net::tls::{init_certs, TlsFiles};

/// Where to find the TLS folder, or `--insecure`.
#[derive(Args, Clone)]
pub struct TlsArgs {
    /// Folder with ca.pem, node.pem and node.key (from `tessel certs init`).
    #[arg(long, value_name = "DIR", conflicts_with = "insecure")]
    pub tls_dir: Option<PathBuf>,
    /// Run without TLS authentication (tests and local experiments only).
    #[arg(long)]
    pub insecure: bool,
}

impl TlsArgs {
    /// The loaded certificates, `None` for `--insecure`; neither is an error.
    pub fn load(&self) -> Result<Option<TlsFiles>> {
        match (&self.tls_dir, self.insecure) {
            (Some(dir), _) => Ok(Some(TlsFiles::load(dir)?)),
            (None, true) => Ok(None),
            (None, false) => bail!("give --tls-dir DIR (see `tessel certs init`) or --insecure"),
        }
    }
}

#[derive(Subcommand)]
pub enum CertsCommand {
    /// Create a cluster CA (ca.pem, ca.key) and, unless --ca-only, one
    /// certificate every node shares (node.pem, node.key: for tests and
    /// local experiments; a cluster issues one per node with `issue`).
    Init {
        dir: PathBuf,
        /// Host names and IPs the shared certificate is valid for, comma
        /// separated.
        #[arg(long, value_delimiter = ',', conflicts_with = "ca_only")]
        hosts: Vec<String>,
        /// Only the CA.
        #[arg(long)]
        ca_only: bool,
    },
    /// Sign a certificate for one coordinator, worker or client with the
    /// CA in CA_DIR, and write the node's TLS folder (ca.pem, node.pem,
    /// node.key; never ca.key) to --out.
    Issue {
        /// The folder with ca.pem and ca.key.
        ca_dir: PathBuf,
        /// coordinator, worker or client.
        #[arg(long, value_parser = parse_role)]
        role: tessel_net::tls::Role,
        /// The node's name: a coordinator's replica id, a worker's id, a
        /// client's user name.
        #[arg(long)]
        name: String,
        /// Host names and IPs the node serves at, comma separated (a
        /// coordinator: every address clients and peers dial; `*.` DNS
        /// wildcards allowed).
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
        /// The folder to write.
        #[arg(long)]
        out: PathBuf,
    },
}

fn parse_role(s: &str) -> Result<tessel_net::tls::Role, String> {
    tessel_net::tls::Role::parse(s)
        .ok_or_else(|| format!("`{s}`: expected coordinator, worker or client"))
}

#[derive(Args)]
pub struct CoordinatorArgs {
    /// This replica's id (never reuse the id of a removed replica).
    #[arg(long, required_unless_present = "kv")]
    pub id: Option<u64>,
    /// Address to listen on; port 0 picks a free port (printed on start).
    #[arg(long, value_name = "HOST:PORT", required_unless_present = "kv")]
    pub listen: Option<SocketAddr>,
    /// Attach to an etcd cluster (`etcd://HOST:PORT[,..]`) instead of
    /// running a replica: only the coordinator's failure monitor runs here.
    #[arg(long, value_name = "URL", conflicts_with_all = ["id", "listen", "peers", "join", "data_dir"])]
    pub kv: Option<String>,
    /// Initial voters, `1=HOST:PORT,2=HOST:PORT,...`, used to form a new
    /// cluster on first start (this replica included).
    #[arg(long, value_delimiter = ',', value_parser = parse_peer)]
    pub peers: Vec<(u64, SocketAddr)>,
    /// Join the cluster that the replica at ADDR belongs to.
    #[arg(long, value_name = "ADDR", conflicts_with = "peers")]
    pub join: Option<String>,
    #[arg(long, value_name = "DIR", required_unless_present = "kv")]
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
    /// threads mostly add wake-ups between them; one measured best with
    /// replicas sharing a machine's cores (README, Performance). Blocking
    /// disk work still hands the other tasks to a fresh thread.
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

fn parse_peer(s: &str) -> Result<(u64, SocketAddr), String> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected ID=HOST:PORT"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: bad replica id"))?;
    let addr = resolve(addr).map_err(|e| format!("`{s}`: {e}"))?;
    Ok((id, addr))
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.trim()
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {addr}"))?
        .next()
        .with_context(|| format!("{addr} resolves to nothing"))
}

fn coordinators(list: &str) -> Result<Vec<SocketAddr>> {
    list.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(resolve)
        .collect()
}

/// Which key-value service to talk to: tessel's replicas or etcd.
#[derive(Args, Clone)]
pub struct KvTargetArgs {
    /// tessel coordinator (replica) addresses, comma separated.
    #[arg(long, value_name = "ADDR[,ADDR..]", required_unless_present = "kv")]
    pub coordinator: Option<String>,
    /// An etcd cluster instead: `etcd://HOST:PORT[,HOST:PORT..]` (needs a
    /// tessel built with `--features etcd`).
    #[arg(long, value_name = "URL", conflicts_with = "coordinator")]
    pub kv: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl KvTargetArgs {
    /// The service, for messages.
    pub fn describe(&self) -> String {
        match (&self.coordinator, &self.kv) {
            (_, Some(url)) => url.clone(),
            (Some(list), None) => list.clone(),
            (None, None) => "none given".into(),
        }
    }

    /// A client of the chosen service.
    pub async fn connect(&self) -> Result<Box<dyn KvStore>> {
        if let Some(url) = &self.kv {
            return connect_etcd(url).await;
        }
        let addrs = self.coordinator.as_deref().unwrap_or_default();
        Ok(Box::new(RaftKv::connect(
            coordinators(addrs)?,
            self.tls.load()?.as_ref(),
        )?))
    }
}

#[cfg(feature = "etcd")]
async fn connect_etcd(url: &str) -> Result<Box<dyn KvStore>> {
    use tessel_kvstore::etcd::{parse_url, EtcdKv, EtcdOptions};
    let endpoints = parse_url(url)?;
    let kv = EtcdKv::connect(&endpoints, EtcdOptions::default())
        .await
        .with_context(|| format!("connecting to {url}"))?;
    Ok(Box::new(kv))
}

#[cfg(not(feature = "etcd"))]
async fn connect_etcd(url: &str) -> Result<Box<dyn KvStore>> {
    bail!("`--kv {url}`: this tessel was built without etcd support; rebuild with `cargo build --features etcd`")
}

#[derive(Args)]
pub struct KvArgs {
    #[command(flatten)]
    pub target: KvTargetArgs,
    #[command(subcommand)]
    pub op: KvOp,
}

#[derive(Subcommand)]
pub enum KvOp {
    /// Write, overwriting.
    Put { key: String, value: String },
    /// Write unless the key exists.
    Insert { key: String, value: String },
    /// Wait for a key (blocking get).
    Get {
        key: String,
        #[arg(long, default_value_t = 0)]
        timeout_ms: u64,
    },
    /// Read a key now.
    TryGet { key: String },
    /// Every pair under a prefix.
    List { prefix: String },
    /// Delete a key, or with --prefix everything under it.
    Del {
        key: String,
        #[arg(long)]
        prefix: bool,
    },
    /// Print changes under a prefix.
    Watch {
        prefix: String,
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Stop after N events.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Add to a counter (missing = 0).
    Incr {
        key: String,
        #[arg(default_value_t = 1, allow_hyphen_values = true)]
        delta: i64,
    },
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Leader, term, members and log indices as each replica sees them.
    Status {
        #[arg(long, value_name = "ADDR[,ADDR..]")]
        coordinator: String,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Remove a replica from the voters.
    Remove {
        #[arg(long, value_name = "ADDR[,ADDR..]")]
        coordinator: String,
        #[command(flatten)]
        tls: TlsArgs,
        id: u64,
    },
}

pub fn certs(cmd: CertsCommand) -> Result<()> {
    match cmd {
        CertsCommand::Init {
            dir, ca_only: true, ..
        } => {
            tessel_net::tls::init_ca(&dir)?;
            println!(
                "created the cluster CA in {} (ca.key signs every node's certificate: keep it on this host)",
                dir.display()
            );
            Ok(())
        }
        CertsCommand::Init { dir, hosts, .. } => {
            init_certs(&dir, &hosts)?;
            println!(
                "created the cluster CA and one certificate every node shares in {}",
                dir.display()
            );
            eprintln!(
                "warning: node.pem serves every coordinator, worker and client alike; for a cluster, issue one per node with `tessel certs issue`"
            );
            Ok(())
        }
        CertsCommand::Issue {
            ca_dir,
            role,
            name,
            hosts,
            out,
        } => {
            tessel_net::tls::issue(
                &ca_dir,
                &tessel_net::tls::NodeCert {
                    role,
                    name: &name,
                    hosts: &hosts,
                },
                &out,
            )?;
            println!(
                "issued {role} `{name}`'s certificate into {} (ca.pem, node.pem, node.key)",
                out.display()
            );
            Ok(())
        }
    }
}

async fn scheduler(kv: std::sync::Arc<dyn KvStore>) {
    tessel_coordinator::scheduler::run(
        kv,
        std::time::Duration::from_millis(500),
        std::time::Duration::from_secs(120),
    )
    .await
}

pub async fn coordinator(args: CoordinatorArgs) -> Result<()> {
    crate::metrics_http::serve_if(args.metrics_listen).await?;
    if let Some(url) = &args.kv {
        let kv: std::sync::Arc<dyn KvStore> = std::sync::Arc::from(connect_etcd(url).await?);
        println!("coordinator attached to {url}");
        let monitor = tokio::spawn(tessel_coordinator::monitor::run(kv.clone()));
        let scheduler = tokio::spawn(scheduler(kv));
        wait_for_signal().await;
        monitor.abort();
        scheduler.abort();
        return Ok(());
    }
    let (Some(id), Some(listen), Some(data_dir)) = (args.id, args.listen, args.data_dir.clone())
    else {
        bail!("give --id, --listen and --data-dir, or --kv etcd://…");
    };
    let tls = args.tls.load()?;
    if let Some(t) = &tls {
        use tessel_net::tls::{Identity, Role};
        match t.identity() {
            Identity::Node {
                role: Role::Coordinator,
                ..
            }
            | Identity::Anonymous => {}
            Identity::Shared => tracing::warn!(
                "this coordinator uses the cluster-wide certificate: any holder may act as any node; issue per-node certificates with `tessel certs issue`"
            ),
            other => bail!(
                "this certificate is {other}'s; a coordinator needs a coordinator certificate (`tessel certs issue --role coordinator`)"
            ),
        }
    }
    let mut raft = ReplicaConfig::default_raft();
    raft.snapshot_policy = openraft_snapshot_policy(args.snapshot_every);
    raft.max_in_snapshot_log_to_keep = args.keep_log_entries;
    let peers: BTreeMap<u64, SocketAddr> = args.peers.iter().copied().collect();
    if args.join.is_none() && !peers.is_empty() && !peers.contains_key(&id) {
        bail!("--peers must include this replica (id {id})");
    }
    let cfg = ReplicaConfig {
        id,
        listen,
        peers,
        data_dir,
        tls: tls.clone(),
        raft,
        log_io: args.log_io,
    };
    let replica = Replica::start(cfg).await?;
    let addr = replica.local_addr()?;
    // Tests and scripts read this line to learn the port.
    println!("replica {id} listening on {addr}");
    if let Some(join) = &args.join {
        let kv = RaftKv::connect(coordinators(join)?, tls.as_ref())?;
        kv.add_replica(id, addr)
            .await
            .with_context(|| format!("joining the cluster of {join}"))?;
        println!("replica {id} joined");
    }
    // The coordinator's failure monitor, through this replica (every
    // replica runs one; their writes are idempotent inserts).
    let monitor_kv: std::sync::Arc<dyn KvStore> =
        std::sync::Arc::new(RaftKv::connect(vec![addr], tls.as_ref())?);
    let monitor = tokio::spawn(tessel_coordinator::monitor::run(monitor_kv.clone()));
    // The scheduler too: passes commit by compare-and-swap of one value,
    // so replicas' passes never interleave.
    let scheduler = tokio::spawn(scheduler(monitor_kv));
    wait_for_signal().await;
    monitor.abort();
    scheduler.abort();
    eprintln!("replica {id} shutting down");
    replica.shutdown().await;
    Ok(())
}

fn openraft_snapshot_policy(every: u64) -> tessel_kvstore::raft::SnapshotPolicy {
    tessel_kvstore::raft::SnapshotPolicy::LogsSinceLast(every.max(1))
}

pub async fn wait_for_signal() {
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

fn show(bytes: &[u8]) -> String {
    show_key(bytes)
}

pub async fn kv(args: KvArgs) -> Result<()> {
    let kv = args.target.connect().await?;
    match args.op {
        KvOp::Put { key, value } => println!(
            "revision {}",
            kv.put(key.as_bytes(), value.as_bytes()).await?
        ),
        KvOp::Insert { key, value } => println!(
            "revision {}",
            kv.insert(key.as_bytes(), value.as_bytes()).await?
        ),
        KvOp::Get { key, timeout_ms } => {
            println!(
                "{}",
                show(
                    &kv.get(key.as_bytes(), Duration::from_millis(timeout_ms))
                        .await?
                )
            )
        }
        KvOp::TryGet { key } => println!("{}", show(&kv.try_get(key.as_bytes()).await?)),
        KvOp::List { prefix } => {
            for e in kv.list(prefix.as_bytes()).await? {
                println!(
                    "{}\t{}\t(revision {})",
                    show(&e.key),
                    show(&e.value),
                    e.mod_revision
                );
            }
        }
        KvOp::Del { key, prefix } => {
            let n = if prefix {
                kv.delete_prefix(key.as_bytes()).await?
            } else {
                kv.delete(key.as_bytes()).await?
            };
            println!("deleted {n}");
        }
        KvOp::Incr { key, delta } => println!("{}", kv.increment(key.as_bytes(), delta).await?),
        KvOp::Watch {
            prefix,
            from,
            count,
        } => {
            let mut events = kv.watch(prefix.as_bytes(), from).await?;
            let mut seen = 0;
            while count.is_none_or(|c| seen < c) {
                let Some(e) = events.next().await else { break };
                match e? {
                    Event::Put(kv) => println!(
                        "{} put {} {}",
                        kv.mod_revision,
                        show(&kv.key),
                        show(&kv.value)
                    ),
                    Event::Delete { key, revision } => println!("{revision} delete {}", show(&key)),
                }
                seen += 1;
            }
        }
    }
    Ok(())
}

pub async fn cluster(cmd: ClusterCommand) -> Result<()> {
    match cmd {
        ClusterCommand::Status { coordinator, tls } => {
            let kv = RaftKv::connect(coordinators(&coordinator)?, tls.load()?.as_ref())?;
            println!(
                "{:<22} {:>3}  {:<10} {:>6} {:>6} {:>9} {:>9} {:>9}  MEMBERS",
                "REPLICA", "ID", "STATE", "LEADER", "TERM", "LAST LOG", "APPLIED", "REVISION"
            );
            for (addr, status) in kv.cluster_status().await {
                match status {
                    Ok(s) => {
                        let opt = |v: Option<u64>| v.map_or("-".into(), |x| x.to_string());
                        let members: Vec<String> = s
                            .members
                            .iter()
                            .map(|(id, a)| format!("{id}={a}"))
                            .collect();
                        println!(
                            "{:<22} {:>3}  {:<10} {:>6} {:>6} {:>9} {:>9} {:>9}  {}",
                            addr.to_string(),
                            s.id,
                            s.state,
                            opt(s.leader),
                            s.term,
                            opt(s.last_log_index),
                            opt(s.applied),
                            s.revision,
                            members.join(",")
                        );
                    }
                    Err(e) => println!("{:<22} unreachable: {e}", addr.to_string()),
                }
            }
            Ok(())
        }
        ClusterCommand::Remove {
            coordinator,
            tls,
            id,
        } => {
            let kv = RaftKv::connect(coordinators(&coordinator)?, tls.load()?.as_ref())?;
            kv.remove_replica(id).await?;
            println!("removed replica {id}");
            Ok(())
        }
    }
}
