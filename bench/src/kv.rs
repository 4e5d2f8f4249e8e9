//! `tessel-bench kv`: the replicated key-value service under load.
//!
//! Starts three `tessel coordinator` processes on loopback (mutual TLS,
//! the Raft log synced on every append), drives them from this process over
//! QUIC, and prints one JSON line per figure. With `--etcd` it also starts
//! a 3-member etcd cluster (Debian's `etcd-server`, fsync on) and measures
//! each figure on tessel and then at once on etcd, so that the two figures
//! of a pair are seconds apart rather than minutes: this machine's speed
//! drifts within minutes, and a ratio of figures taken apart measured the
//! drift as much as the systems. Every line names its `system`.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args;
use tessel_harness::{Child, Ready};
use tessel_kv::KvStore;
use tessel_kv_service::raft::client::{ClientEndpoint, RaftKv};
use tessel_tls::{init_certs, TlsFiles};

/// `tessel-bench kv`: the key-value service's latency and throughput, against etcd.
#[derive(Args)]
pub struct BenchKvArgs {
    /// Sequential puts for the latency figures.
    #[arg(long, default_value_t = 2000)]
    pub sequential: usize,
    /// Seconds of load at each concurrency level.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Keys of 64-byte values to load before measuring memory.
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: usize,
    /// Extra arguments for every replica (repeat), e.g.
    /// `--replica-arg=--snapshot-every --replica-arg=100000`.
    #[arg(long = "replica-arg", allow_hyphen_values = true)]
    pub replica_args: Vec<String>,
    /// Also run the load against a local 3-member etcd (needs a tessel
    /// built with `--features etcd` and `etcd` on the PATH).
    #[arg(long)]
    pub etcd: bool,
}

/// The value every put writes.
const VALUE: [u8; 64] = [0xab; 64];

/// The system under load.
enum Target {
    Tessel {
        addrs: Vec<SocketAddr>,
        /// Every client's connections go through it, one UDP socket, as
        /// a QUIC application's would; each client has its own
        /// connections. It costs the load generator less CPU than a
        /// socket per client, which leaves more to the replicas.
        endpoint: ClientEndpoint,
    },
    #[cfg(feature = "etcd")]
    Etcd { endpoints: Vec<String> },
}

impl Target {
    fn name(&self) -> &'static str {
        match self {
            Target::Tessel { .. } => "tessel",
            #[cfg(feature = "etcd")]
            Target::Etcd { .. } => "etcd",
        }
    }

    /// A client with its own connection, to every node or only to `node`.
    async fn client(&self, node: Option<usize>) -> Result<Arc<dyn KvStore>> {
        Ok(match self {
            Target::Tessel { addrs, endpoint } => {
                let addrs = node.map_or_else(|| addrs.clone(), |i| vec![addrs[i]]);
                Arc::new(RaftKv::connect_via(endpoint, addrs)?)
            }
            #[cfg(feature = "etcd")]
            Target::Etcd { endpoints } => {
                use tessel_kv_service::etcd::{EtcdKv, EtcdOptions};
                let eps = node.map_or_else(|| endpoints.clone(), |i| vec![endpoints[i].clone()]);
                Arc::new(EtcdKv::connect(&eps, EtcdOptions::default()).await?)
            }
        })
    }
}

/// A replica process (killed when dropped) and its address.
fn spawn(args: &[String]) -> Result<(Child, SocketAddr)> {
    let mut cmd = Command::new(crate::tessel_bin()?);
    // Replicas complain about each other while the bench tears them down.
    cmd.args(args).stderr(Stdio::null());
    let mut child = Child::spawn("coordinator", cmd, true)?;
    match child.wait_ready(Duration::from_secs(60))? {
        Ready::Coordinator { listen, .. } => Ok((child, listen)),
        other => anyhow::bail!("a coordinator announced {other:?}"),
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time (user + system, all threads) a process has used so far, in
/// seconds; `/proc/PID/stat` counts it in USER_HZ ticks, 100 per second on
/// Linux's x86 and arm ABIs.
fn cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name, which may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// CPU seconds of the load generator (this process) and of every node.
fn cpu_all(pids: &[u32]) -> Vec<Option<f64>> {
    std::iter::once(std::process::id())
        .chain(pids.iter().copied())
        .map(cpu_s)
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Runs the benchmark and prints its table.
pub async fn run(args: BenchKvArgs) -> Result<()> {
    let dir = tessel_harness::scratch::scratch_dir("benchkv")?;
    let tls_dir = dir.path().join("tls");
    init_certs(&tls_dir, &["127.0.0.1".into()])?;
    let tls = TlsFiles::load(&tls_dir)?;
    let replica = |id: u64, join: Option<SocketAddr>| -> Vec<String> {
        let mut a: Vec<String> = vec![
            "coordinator".into(),
            "--id".into(),
            id.to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            dir.path().join(format!("r{id}")).display().to_string(),
            "--tls-dir".into(),
            tls_dir.display().to_string(),
        ];
        match join {
            Some(j) => a.extend(["--join".into(), j.to_string()]),
            None => a.extend(["--peers".into(), format!("{id}=127.0.0.1:0")]),
        }
        a.extend(args.replica_args.iter().cloned());
        a
    };
    // Kept running until the end; dropping them stops the replicas.
    let mut procs = vec![spawn(&replica(1, None))?];
    let first = procs[0].1;
    for id in 2..=3 {
        procs.push(spawn(&replica(id, Some(first)))?);
    }
    let addrs: Vec<SocketAddr> = procs.iter().map(|(_, a)| *a).collect();
    let endpoint = ClientEndpoint::for_replicas(&addrs, Some(&tls))?;
    let pids = procs.iter().map(|(c, _)| c.pid()).collect();
    let mut systems = vec![System::new(Target::Tessel { addrs, endpoint }, pids).await?];
    // Kept running until the end; dropping it stops the members.
    let _etcd = if args.etcd {
        let (etcd, system) = start_etcd().await?;
        systems.push(system);
        Some(etcd)
    } else {
        None
    };
    // Each figure on every system before the next figure (module docs).
    for s in &systems {
        sequential_puts(&args, s).await?;
    }
    for s in &systems {
        sequential_reads(&args, s).await?;
    }
    for clients in [1usize, 16, 64] {
        for s in &systems {
            concurrent_puts(&args, s, clients).await?;
        }
    }
    for s in &systems {
        blocking_get_wakeup(s).await?;
    }
    for s in &systems {
        memory(&args, s).await?;
    }
    drop(procs);
    Ok(())
}

/// A system under load, its node processes, and a client of it for the
/// sequential figures.
struct System {
    target: Target,
    pids: Vec<u32>,
    kv: Arc<dyn KvStore>,
}

impl System {
    /// Connects the sequential figures' client (and, for tessel, finds
    /// the leader) with one unmeasured put.
    async fn new(target: Target, pids: Vec<u32>) -> Result<System> {
        let kv = target.client(None).await?;
        kv.put(b"bench/warmup", b"x").await?;
        Ok(System { target, pids, kv })
    }
}

#[cfg(feature = "etcd")]
async fn start_etcd() -> Result<(tessel_kv_service::etcd::server::EtcdServers, System)> {
    let etcd = tessel_kv_service::etcd::server::EtcdServers::start(3).await?;
    let target = Target::Etcd {
        endpoints: etcd.endpoints(),
    };
    let system = System::new(target, (0..3).filter_map(|i| etcd.pid(i)).collect()).await?;
    Ok((etcd, system))
}

#[cfg(not(feature = "etcd"))]
async fn start_etcd() -> Result<((), System)> {
    bail!("--etcd needs a tessel built with `--features etcd`")
}

/// Sequential puts: latency of one write at a time.
async fn sequential_puts(args: &BenchKvArgs, s: &System) -> Result<()> {
    let (system, kv) = (s.target.name(), &s.kv);
    let mut lat = Vec::with_capacity(args.sequential);
    for i in 0..args.sequential {
        let t = Instant::now();
        kv.put(format!("seq/{i}").as_bytes(), &VALUE).await?;
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "{{\"system\":\"{system}\",\"figure\":\"sequential_put\",\"ops\":{},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"max_ms\":{:.3}}}",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        percentile(&lat, 1.0)
    );
    Ok(())
}

/// Sequential linearizable reads: the leader confirms its leadership with
/// a round of heartbeats, the same network path as a write without the two
/// disk commits, so the difference is what the disks cost.
async fn sequential_reads(args: &BenchKvArgs, s: &System) -> Result<()> {
    let (system, kv) = (s.target.name(), &s.kv);
    let mut lat = Vec::with_capacity(args.sequential);
    for _ in 0..args.sequential {
        let t = Instant::now();
        kv.revision().await?;
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "{{\"system\":\"{system}\",\"figure\":\"sequential_linearizable_read\",\"ops\":{},\"p50_ms\":{:.3},\"p99_ms\":{:.3}}}",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
    Ok(())
}

/// `clients` concurrent clients, each with its own connection (tessel's
/// through one endpoint, see `Target::Tessel`). Each one connects (and,
/// for tessel, finds the leader) with one unmeasured put before the timed
/// window: the figures are steady-state puts, not 64 handshakes at once.
async fn concurrent_puts(args: &BenchKvArgs, s: &System, clients: usize) -> Result<()> {
    let (system, target, pids) = (s.target.name(), &s.target, &s.pids);
    let mut ready = Vec::with_capacity(clients);
    for c in 0..clients {
        let client = target.client(None).await?;
        client
            .put(format!("warm/{clients}/{c}").as_bytes(), &VALUE)
            .await?;
        ready.push(client);
    }
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for (c, client) in ready.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                if client
                    .put(format!("conc/{clients}/{c}/{i}").as_bytes(), &VALUE)
                    .await
                    .is_ok()
                {
                    lat.push(t.elapsed());
                }
                i += 1;
            }
            lat
        }));
    }
    let started = Instant::now();
    let cpu_before = cpu_all(pids);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Where the CPU went: microseconds per acknowledged put, for the
    // load generator first, then each node in `pids` order.
    let cpu_us: Vec<String> = cpu_all(pids)
        .iter()
        .zip(&cpu_before)
        .map(|(after, before)| match (after, before) {
            (Some(a), Some(b)) => format!("{:.1}", (a - b) * 1e6 / all.len().max(1) as f64),
            // A process gone (or unreadable) mid-phase, as `rss_kib`.
            _ => "null".into(),
        })
        .collect();
    all.sort();
    println!(
        "{{\"system\":\"{system}\",\"figure\":\"concurrent_put\",\"clients\":{clients},\"ops\":{},\"puts_per_s\":{:.0},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"p999_ms\":{:.3},\"max_ms\":{:.3},\"cpu_us_per_put\":{{\"load\":{},\"nodes\":[{}]}}}}",
        all.len(),
        all.len() as f64 / elapsed,
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        percentile(&all, 0.999),
        percentile(&all, 1.0),
        cpu_us[0],
        cpu_us[1..].join(",")
    );
    Ok(())
}

/// Blocking-get wake-up: a get waits on replica 2; the put goes through
/// replica 3. Latency from sending the put to the get returning, and the
/// insert's own acknowledgement beside it: the get cannot wake before the
/// write is applied, so a slow wake-up with an equally slow insert is the
/// write's latency, not the wake-up's.
async fn blocking_get_wakeup(s: &System) -> Result<()> {
    let (system, target) = (s.target.name(), &s.target);
    let waiter = target.client(Some(1)).await?;
    let writer = target.client(Some(2)).await?;
    let mut wake = Vec::new();
    let mut acks = Vec::new();
    for i in 0..200 {
        let key = format!("wake/{i}");
        let w = waiter.clone();
        let k = key.clone();
        let get = tokio::spawn(async move {
            w.get(k.as_bytes(), Duration::from_secs(10)).await?;
            Ok::<Instant, anyhow::Error>(Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let sent = Instant::now();
        writer.insert(key.as_bytes(), &VALUE).await?;
        acks.push(sent.elapsed());
        let woke = get.await??;
        wake.push(woke.saturating_duration_since(sent));
    }
    wake.sort();
    acks.sort();
    println!(
        "{{\"system\":\"{system}\",\"figure\":\"blocking_get_wakeup\",\"ops\":{},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"insert_p50_ms\":{:.3},\"insert_p99_ms\":{:.3}}}",
        wake.len(),
        percentile(&wake, 0.5),
        percentile(&wake, 0.99),
        percentile(&acks, 0.5),
        percentile(&acks, 0.99)
    );
    Ok(())
}

/// Memory after loading `keys` keys of [`VALUE`]'s size, 64 writers.
async fn memory(args: &BenchKvArgs, s: &System) -> Result<()> {
    let (system, target, pids) = (s.target.name(), &s.target, &s.pids);
    let loaded = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    let writers = 64;
    for w in 0..writers {
        let client = target.client(None).await?;
        let loaded = loaded.clone();
        let n = args.keys;
        tasks.push(tokio::spawn(async move {
            let mut i = w;
            while i < n {
                if client
                    .put(format!("mem/{i:08}").as_bytes(), &VALUE)
                    .await
                    .is_ok()
                {
                    loaded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                i += writers;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss: Vec<String> = pids
        .iter()
        .map(|&pid| rss_kib(pid).map_or("null".into(), |k| format!("{:.1}", k as f64 / 1024.0)))
        .collect();
    let n = loaded.load(std::sync::atomic::Ordering::Relaxed);
    if n != args.keys {
        bail!("only {n} of {} keys were written", args.keys);
    }
    println!(
        "{{\"system\":\"{system}\",\"figure\":\"memory\",\"keys\":{n},\"value_bytes\":{},\"load_s\":{secs:.1},\"rss_mib_per_replica\":[{}]}}",
        VALUE.len(),
        rss.join(",")
    );
    Ok(())
}
