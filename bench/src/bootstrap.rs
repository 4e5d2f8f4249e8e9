//! `tessel-bench bootstrap`: from worker start to a global topology known
//! by every process, against a real 3-replica coordinator on loopback.
//!
//! * Processes: N `tessel worker` processes with the CPU plugin (one device
//!   each). The job's assignments are written first, so each worker starts
//!   its job process as soon as it has registered. Reported: first spawn to
//!   the last process's topology digest (`total_ms`), the slowest plugin
//!   load, and the time from the last plugin being ready to the last digest
//!   (`after_plugin_ms`: what tessel's coordination costs).
//! * Simulated: N hosts in this process (`bench/src/sim_host.rs`) that make a
//!   real worker's KV operations, heartbeats and waits, without PJRT; every
//!   KV operation is counted. Each fetches the published topology itself;
//!   decoding those bytes (N entries, which a real host does once on its
//!   own CPU) is done once for all of them here, else N² decoding on this
//!   machine's two cores starves the replicas being measured. One host's
//!   decode is reported (`decode_ms_per_host`): add it to predict a
//!   cluster. `phases_ms` says when the last host finished each step of
//!   its bootstrap (`sim_host::PHASES`), from the run's start.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use futures::StreamExt;
use tessel::pjrt::locate;
use tessel_coordinator::attempt::{self, Record};
use tessel_coordinator::jobs::{self, JobAssignment};
use tessel_coordinator::registry::LivenessConfig;

use tessel_kv::{CountingKv, Event, KvStore, WatchStream};
use tessel_topology::TopologyCache;

use tessel_harness::{Child, LocalCluster, Ready};
use tessel_kv_service::raft::client::RaftKv;

use crate::beats::Beats;
use crate::sim_host::{self, HOSTS_PER_CONNECTION};
use crate::simulated::KeepAlives;
use crate::simulated::{cpu_now, cpu_split, leader_index, usage};
use crate::threads;

/// `tessel-bench bootstrap`: time from start to a global topology, tessel against JAX.
#[derive(Args)]
pub struct BenchBootstrapArgs {
    /// Worker-process counts (`none` for none).
    #[arg(long, default_value = "4,16,64", value_parser = parse_counts)]
    pub processes: Counts,
    /// Simulated-worker counts (`none` for none).
    #[arg(long, default_value = "256,1024", value_parser = parse_counts)]
    pub simulated: Counts,
    /// Plugin for the worker processes.
    #[arg(long, value_name = "NAME|PATH")]
    pub plugin: Option<String>,
    /// Also time `jax.distributed.initialize` (CPU, gloo) for the same
    /// process counts with this Python, which must have `jax` installed.
    #[arg(long, value_name = "PYTHON")]
    pub jax: Option<std::path::PathBuf>,
    /// How the simulated hosts' keep-alives travel: on each client's
    /// keep-alive stream, or as a request each (as before it).
    #[arg(long, value_enum, default_value_t)]
    pub keep_alives: KeepAlives,
    /// Instead of a bootstrap that completes, lose one simulated host
    /// after it joined and before it published its topology: measures how
    /// long the job's failure takes to be recorded and to stop every other
    /// host (`bench/src/bootstrap_loss.rs`).
    #[arg(long)]
    pub lose_one: bool,
    /// Give each simulated host a connection of its own, as on a cluster
    /// (opened when the host starts, inside the timed window; its QUIC
    /// keep-alives reach the leader while it is idle), instead of
    /// sharing one among 128. Not with `--lose-one`.
    #[arg(long, conflicts_with = "lose_one")]
    pub connection_per_host: bool,
    /// Attribution only, not a goal figure: the simulated hosts send no
    /// keep-alive during the run (a beat an hour, a TTL of two), where a
    /// real worker beats once a second for as long as the run lasts. The
    /// difference to a run without it is what the heartbeats cost.
    #[arg(long, conflicts_with = "lose_one")]
    pub without_heartbeats: bool,
}

/// One JAX process (bench/jax/bootstrap.py, embedded).
const JAX_SCRIPT: &str = include_str!("../jax/bootstrap.py");

/// A comma-separated list of process counts.
#[derive(Debug, Clone)]
pub struct Counts(Vec<u32>);

fn parse_counts(s: &str) -> Result<Counts, String> {
    if s == "none" {
        return Ok(Counts(Vec::new()));
    }
    s.split(',')
        .map(|c| match c.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("`{c}` is not a positive count")),
        })
        .collect::<Result<_, _>>()
        .map(Counts)
}

/// Runs the benchmark and prints its table.
pub async fn run(args: BenchBootstrapArgs) -> Result<()> {
    let mut cluster = LocalCluster::new(crate::tessel_bin()?)?;
    cluster.start_coordinators(3)?;
    let kv = cluster.client()?;
    let plugin = locate::resolve(args.plugin.as_deref())?;
    for &n in &args.processes.0 {
        processes(&mut cluster, &kv, &plugin, n).await?;
        if let Some(python) = &args.jax {
            jax_processes(python, n)?;
        }
    }
    // Simulated hosts share connections (`sim_host` says why and how).
    let largest = args.simulated.0.iter().copied().max().unwrap_or(0) as usize;
    let mut clients: Vec<Arc<CountingKv>> = Vec::new();
    for _ in 0..largest.div_ceil(HOSTS_PER_CONNECTION).max(MIN_CONNECTIONS) {
        clients.push(Arc::new(CountingKv::new(
            args.keep_alives.client(&cluster)?,
        )));
    }
    let liveness = if args.without_heartbeats {
        sim_host::UNBEATING
    } else {
        LivenessConfig::default()
    };
    for (run, &n) in args.simulated.0.iter().enumerate() {
        let used = (n as usize)
            .div_ceil(HOSTS_PER_CONNECTION)
            .max(MIN_CONNECTIONS);
        let shared = &clients[..used];
        let pids = cluster.coordinator_pids();
        // Keep-alives on as many connections as the hosts' requests.
        let beating = if args.connection_per_host {
            n as usize
        } else {
            used
        };
        let beats = Beats::start(
            args.keep_alives,
            &cluster.addrs,
            &cluster.tls_dir(),
            beating,
        )?;
        if args.lose_one {
            crate::bootstrap_loss::run(shared, &beats, n, run).await?;
        } else if args.connection_per_host {
            let own: Vec<Arc<CountingKv>> = args
                .keep_alives
                .clients(&cluster, n as usize)?
                .into_iter()
                .map(|inner| Arc::new(CountingKv::new(inner)))
                .collect();
            simulated(shared, (&own, &beats), (n, run), (&pids, &kv), liveness).await?;
        } else {
            simulated(shared, (shared, &beats), (n, run), (&pids, &kv), liveness).await?;
        }
    }
    Ok(())
}

/// Every simulated host of `n` assigned its process of `job`, over the
/// hosts' connections (not timed).
pub(crate) async fn assign_all(clients: &[Arc<dyn KvStore>], job: &str, n: u32) -> Result<()> {
    let assign: Vec<_> = (0..n)
        .map(|i| {
            let kv = clients[i as usize % clients.len()].clone();
            let a = assignment(job, i, n);
            tokio::spawn(async move { jobs::assign(&*kv, &sim_host::host_id(n, i), &a).await })
        })
        .collect();
    for a in assign {
        a.await??;
    }
    Ok(())
}

/// Process `i` of `n` of `job`, with a topology wait long enough for any
/// count measured.
pub(crate) fn assignment(job: &str, i: u32, n: u32) -> JobAssignment {
    JobAssignment {
        attempt: job.to_owned(),
        process_index: i,
        num_processes: n,
        topology_timeout_ms: 300_000,
        trace: None,
    }
}

/// Unix ms of each process's digest, as this process sees it arrive.
async fn digest_arrivals(job: String, mut events: WatchStream, n: u32) -> Result<Vec<u64>> {
    let mut seen = std::collections::BTreeMap::new();
    while (seen.len() as u32) < n {
        if let Event::Put(p) = events.next().await.context("the watch ended")?? {
            if let Some((i, Record::Topology)) = attempt::parse(&job, &p.key) {
                seen.entry(i).or_insert_with(tessel_coordinator::unix_ms);
            }
        }
    }
    Ok(seen.into_values().collect())
}

async fn processes(
    cluster: &mut LocalCluster,
    kv: &dyn KvStore,
    plugin: &std::path::Path,
    n: u32,
) -> Result<()> {
    let job = format!("bench-processes-{n}");
    for i in 0..n {
        jobs::assign(kv, &format!("b{n}-{i}"), &assignment(&job, i, n)).await?;
    }
    let rev = kv.revision().await?;
    let events = kv.watch(attempt::prefix(&job).as_bytes(), rev + 1).await?;
    let arrivals = tokio::spawn(digest_arrivals(job.clone(), events, n));
    let started_unix = tessel_coordinator::unix_ms();
    let started = Instant::now();
    let mut workers = Vec::new();
    for i in 0..n {
        let id = format!("b{n}-{i}");
        let cmd = cluster.worker_command(&id, &plugin.display().to_string(), 1);
        workers.push(Child::spawn(&format!("worker {id}"), cmd, true)?);
    }
    let spawned_ms = started.elapsed().as_secs_f64() * 1e3;
    let arrivals = tokio::time::timeout(Duration::from_secs(600), arrivals)
        .await
        .context("no topology within 600 s")???;
    let last = *arrivals.iter().max().context("no arrivals")?;
    let mut loads = Vec::new();
    let mut ready_at = Vec::new();
    for w in &mut workers {
        let Ready::Worker {
            plugin_ms,
            plugin_ready_unix_ms,
            ..
        } = w.wait_ready(Duration::from_secs(10))?
        else {
            anyhow::bail!("{} announced something else", w.name());
        };
        loads.push(plugin_ms);
        ready_at.push(plugin_ready_unix_ms);
    }
    loads.sort_unstable();
    let last_ready = *ready_at.iter().max().context("no worker")?;
    println!(
        "{{\"figure\":\"bootstrap_processes\",\"workers\":{n},\"total_ms\":{},\"spawn_ms\":{spawned_ms:.0},\"plugin_load_ms_median\":{},\"plugin_load_ms_max\":{},\"after_plugin_ms\":{}}}",
        last.saturating_sub(started_unix),
        loads[loads.len() / 2],
        loads[loads.len() - 1],
        last.saturating_sub(last_ready)
    );
    jobs::finish_job(kv, &job).await?;
    Child::terminate_all(&mut workers, Duration::from_secs(5));
    Ok(())
}

/// Connections the simulated hosts share: at least 16.
const MIN_CONNECTIONS: usize = 16;

fn total_ops(clients: &[Arc<CountingKv>]) -> u64 {
    clients.iter().map(|c| c.ops()).sum()
}

/// `jax.distributed.initialize` in `n` Python processes: spawn of the
/// first to the last one knowing the global devices, and that minus the
/// slowest `import jax`.
fn jax_processes(python: &std::path::Path, n: u32) -> Result<()> {
    let started_unix = tessel_coordinator::unix_ms() as f64;
    let mut imported = Vec::new();
    let mut known = Vec::new();
    for v in crate::jax::run_group(python, JAX_SCRIPT, n, &[])? {
        imported.push(v["imported_unix_ms"].as_f64().context("imported_unix_ms")?);
        known.push(v["known_unix_ms"].as_f64().context("known_unix_ms")?);
    }
    let last_known = known.iter().cloned().fold(f64::MIN, f64::max);
    let last_import = imported.iter().cloned().fold(f64::MIN, f64::max);
    println!(
        "{{\"figure\":\"bootstrap_jax\",\"processes\":{n},\"total_ms\":{:.0},\"after_import_ms\":{:.0}}}",
        last_known - started_unix,
        last_known - last_import
    );
    Ok(())
}

/// `n` simulated hosts over `clients` (host `i` on `clients[i % len]`),
/// beating on `beats`, their assignments written over `assigners` first.
async fn simulated(
    assigners: &[Arc<CountingKv>],
    (clients, beats): (&[Arc<CountingKv>], &Beats),
    (n, run): (u32, usize),
    (coordinators, status): (&[u32], &RaftKv),
    liveness: LivenessConfig,
) -> Result<()> {
    let job = format!("bench-simulated-{n}-{run}");
    // Assignments first (not timed), as `--processes` writes them.
    assign_all(&dyn_clients(assigners), &job, n).await?;
    let cpu_before = cpu_now(coordinators);
    let threads_before = threads::snapshots(coordinators);
    let own_before = usage(std::process::id());
    let before = total_ops(clients) + beats.ops();
    let cache = Arc::new(TopologyCache::new());
    let phases = Arc::new(sim_host::Phases::new());
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let kv: Arc<dyn KvStore> = clients[i as usize % clients.len()].clone();
            let job = job.clone();
            let cache = cache.clone();
            let phases = phases.clone();
            let beats = beats.clone();
            tokio::spawn(async move {
                sim_host::run(kv, &beats, (n, i), &job, &cache, Some(&phases), liveness).await
            })
        })
        .collect();
    let hosts = sim_host::all_known(tasks).await?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let ops = total_ops(clients) + beats.ops() - before;
    let leader = leader_index(status).await;
    let (leader_cpu_ns, followers_ns) = cpu_split(coordinators, &cpu_before, leader);
    let by_role = threads::since_each(coordinators, &threads_before);
    let (leader_roles, follower_roles) = threads::leader_and_others(&by_role, leader);
    let leader_threads = threads::json_ms(&leader_roles);
    let followers_threads = threads::json_ms(&follower_roles);
    let leader_peak_kib = leader.map_or(0, |l| usage(coordinators[l]).peak_kib);
    let own = usage(std::process::id());
    let published = clients[0]
        .try_get(tessel_topology::keys::global(&job).as_bytes())
        .await?;
    let topology_bytes = published.len();
    // What each host does alone with the bytes (shared above).
    let decode_started = Instant::now();
    let one = tessel_topology::exchange::Published::decode(&published)?;
    if let tessel_topology::exchange::Published::Topology(t) = &one {
        tessel_topology::digest(t);
    }
    let decode_ms = decode_started.elapsed().as_secs_f64() * 1e3;
    println!(
        "{{\"figure\":\"bootstrap_simulated\",\"workers\":{n},\"heartbeat_ms\":{},\"total_ms\":{ms:.0},\"ms_per_1000_workers\":{:.0},\"kv_ops\":{ops},\"kv_ops_per_worker\":{:.2},\"topology_bytes\":{topology_bytes},\"decode_ms_per_host\":{decode_ms:.1},\"leader_cpu_ms\":{},\"followers_cpu_ms\":{:?},\"leader_peak_rss_mib\":{},\"leader_cpu_by_thread_ms\":{leader_threads},\"followers_cpu_by_thread_ms\":{followers_threads},\"cpu_us_per_simulated_worker\":{:.0},\"kib_per_simulated_worker\":{:.1},\"phases_ms\":{}}}",
        liveness.heartbeat.as_millis(),
        ms * 1000.0 / n as f64,
        ops as f64 / n as f64,
        leader_cpu_ns / 1_000_000,
        followers_ns.iter().map(|n| n / 1_000_000).collect::<Vec<_>>(),
        leader_peak_kib / 1024,
        own.cpu_ns.saturating_sub(own_before.cpu_ns) as f64 / 1e3 / n as f64,
        // The benchmark's resident growth while every host holds its
        // waits: a host's tasks, streams and share of its connection.
        own.rss_kib.saturating_sub(own_before.rss_kib) as f64 / n as f64,
        phases.json(),
    );
    jobs::finish_job(&*clients[0], &job).await?;
    futures::future::join_all(hosts.into_iter().map(sim_host::RunningHost::stop)).await;
    Ok(())
}

/// The same clients, as stores.
pub(crate) fn dyn_clients(clients: &[Arc<CountingKv>]) -> Vec<Arc<dyn KvStore>> {
    clients
        .iter()
        .map(|c| c.clone() as Arc<dyn KvStore>)
        .collect()
}
