//! `tessel-bench heartbeat`: N simulated workers heartbeating at the
//! default period (1 s, TTL 5 s) against a real 3-replica coordinator on
//! loopback. Reported per count: the busiest coordinator's (the leader's)
//! CPU while they beat, a client put's latency meanwhile (its own
//! connection and runtime, as another process; one put every 10 ms), and
//! how long after one worker's last keep-alive its registry entry
//! disappears (its lease expired: what the monitor reacts to).
//!
//! Each simulated worker registers as a real one does
//! (`registry::register`) and runs the real `registry::Heartbeat`; they
//! share 16 connections, or have one each as real workers do
//! (`--connections per-worker`: then each connection's own QUIC
//! keep-alives, sent while it is idle, reach the leader too). Each count
//! is measured with keep-alives on each client's keep-alive stream and as
//! a request each (`--keep-alives`). Left out: the assignment watch and
//! the drain and notice reads a real worker adds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use futures::{StreamExt, TryStreamExt};
use tessel_coordinator::keys;
use tessel_coordinator::registry::{self, Heartbeat, LivenessConfig, Registration};
use tessel_harness::LocalCluster;
use tessel_kv::{Event, KvStore};
use tessel_kv_service::raft::client::RaftKv;

use crate::simulated::{
    cpu_now, cpu_since, leader_index, on_own_runtime, percents_json, quantile_ms, split,
    worker_info, KeepAlives,
};
use crate::threads;

/// `tessel-bench heartbeat`: leader load and failure detection with N heartbeating workers.
#[derive(Args)]
pub struct BenchHeartbeatArgs {
    /// Simulated-worker counts.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096")]
    pub workers: Vec<u32>,
    /// How long each count is measured, in seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// How keep-alives travel, each measured in turn: `stream` (the
    /// client's keep-alive stream to a follower, which relays them to the
    /// leader in batches), `leader` (the stream to the leader itself, as
    /// before the relay) and `requests` (a request each, as before both).
    #[arg(long, value_delimiter = ',', default_value = "stream,leader")]
    pub keep_alives: Vec<KeepAlives>,
    /// How many connections the simulated workers share, or
    /// `per-worker`: one each, as on a cluster.
    #[arg(long, default_value = "16", value_parser = parse_connections)]
    pub connections: Connections,
}

/// The simulated workers' connections.
#[derive(Clone, Copy, Debug)]
pub enum Connections {
    /// This many, shared.
    Shared(usize),
    /// One a worker.
    PerWorker,
}

fn parse_connections(s: &str) -> std::result::Result<Connections, String> {
    match s {
        "per-worker" => Ok(Connections::PerWorker),
        n => match n.parse() {
            Ok(0) | Err(_) => Err(format!("`{s}`: a count above 0, or `per-worker`")),
            Ok(n) => Ok(Connections::Shared(n)),
        },
    }
}

/// Runs the benchmark and prints a JSON line per count.
pub async fn run(args: BenchHeartbeatArgs) -> Result<()> {
    let mut cluster = LocalCluster::new(crate::tessel_bin()?)?;
    cluster.start_coordinators(3)?;
    for &n in &args.workers {
        for &how in &args.keep_alives {
            let clients = match args.connections {
                Connections::Shared(c) => (0..c)
                    .map(|_| how.client(&cluster))
                    .collect::<Result<Vec<_>>>()?,
                Connections::PerWorker => how.clients(&cluster, n as usize - 1)?,
            };
            let window = Duration::from_secs(args.seconds);
            let status = cluster.client()?;
            one(&clients, &cluster, &status, (n, how), window).await?;
        }
    }
    Ok(())
}

/// What the probe measured on its own runtime.
struct Probed {
    /// Each coordinator's CPU time in the window, in start order.
    spent: Vec<u64>,
    /// The same by thread role (`threads`).
    by_role: Vec<std::collections::BTreeMap<String, u64>>,
    elapsed: Duration,
    /// The puts' latencies, sorted.
    latencies: Vec<Duration>,
    /// From the victim's last keep-alive to its alive key's deletion.
    lost_ms: Option<f64>,
}

async fn one(
    clients: &[Arc<dyn KvStore>],
    cluster: &LocalCluster,
    status: &RaftKv,
    (n, how): (u32, KeepAlives),
    window: Duration,
) -> Result<()> {
    let liveness = LivenessConfig::default();
    // Each worker beats from its own registration on, as a real one does
    // (registering 16,384 takes longer than a TTL).
    let beats: Vec<(Registration, Heartbeat)> = futures::stream::iter(0..n - 1)
        .map(|i| {
            let kv = clients[i as usize % clients.len()].clone();
            async move {
                let info = worker_info(&format!("hb{n}{}-{i}", how.tag()), i, liveness);
                let reg = registry::register(&*kv, info, liveness).await?;
                anyhow::Ok((reg.clone(), Heartbeat::start(kv, reg, liveness)))
            }
        })
        .buffer_unordered(512)
        .try_collect()
        .await
        .context("registering the simulated workers")?;
    tracing::info!(workers = n, "registered");
    // The probe (the last worker, and a client's puts) on a runtime of its
    // own, as another process: measured, its puts wait for the KV, not
    // for the simulated workers' tasks on this runtime.
    let (addrs, tls_dir, pids) = (
        cluster.addrs.clone(),
        cluster.tls_dir(),
        cluster.coordinator_pids(),
    );
    let probed = on_own_runtime("probe", move || async move {
        let probe = how.connect(addrs.clone(), &tls_dir)?;
        let victim = how.connect(addrs, &tls_dir)?;
        probe_while_beating((probe, victim), &pids, (n, how), window).await
    })
    .await?;
    // Workers the coordinator declared lost while they beat (through the
    // window and the victim's expiry): must be none.
    let lost_while_beating = beats.iter().filter(|(_, b)| b.lost_now().is_some()).count();
    let leader = leader_index(status).await;
    let (leader_cpu_ns, followers_ns) = split(&probed.spent, leader);
    let (latencies, elapsed) = (&probed.latencies, probed.elapsed);
    let (leader_roles, follower_roles) = threads::leader_and_others(&probed.by_role, leader);
    let leader_threads = threads::json_percent(&leader_roles, elapsed);
    let followers_threads = threads::json_percent(&follower_roles, elapsed);
    println!(
        "{{\"figure\":\"heartbeat\",\"workers\":{n},\"connections\":{},\"keep_alives\":\"{}\",\"heartbeat_ms\":{},\"ttl_ms\":{},\"leader_cpu_percent_of_one_core\":{:.1},\"followers_cpu_percent_of_one_core\":{},\"leader_cpu_by_thread_percent\":{leader_threads},\"followers_cpu_by_thread_percent\":{followers_threads},\"put_p50_ms\":{:.2},\"put_p99_ms\":{:.2},\"puts\":{},\"lost_seen_after_last_beat_ms\":{},\"lost_while_beating\":{lost_while_beating}}}",
        clients.len() + 1,
        format!("{how:?}").to_lowercase(),
        liveness.heartbeat.as_millis(),
        liveness.ttl.as_millis(),
        leader_cpu_ns as f64 / elapsed.as_nanos() as f64 * 100.0,
        percents_json(&followers_ns, elapsed),
        quantile_ms(latencies, 0.5),
        quantile_ms(latencies, 0.99),
        latencies.len(),
        probed.lost_ms.map_or("null".to_owned(), |ms| format!("{ms:.0}")),
    );
    let mut regs = Vec::new();
    for (r, b) in beats {
        b.stop();
        regs.push(r);
    }
    futures::stream::iter(regs.iter().enumerate())
        .map(|(i, r)| {
            let kv = clients[i % clients.len()].clone();
            // Stopped beating above: a lease may expire before its turn.
            async move {
                match kv.revoke(r.lease).await {
                    Err(tessel_kv::KvError::LeaseNotFound(_)) => Ok(()),
                    other => other,
                }
            }
        })
        .buffer_unordered(512)
        .try_collect::<Vec<()>>()
        .await
        .context("revoking the simulated workers' leases")?;
    Ok(())
}

/// The probe's part, on its own runtime: registers the last worker (the
/// victim) and beats for it on a task and a connection of its own, as a
/// worker does; over `window`, the coordinators' CPU and a put every
/// 10 ms on another connection; then stops the victim's beats and times
/// its loss. The puts do not follow the victim's beats: a put sent as
/// the victim's keep-alive came back (the moment its follower's relayed
/// batch was answered) met the leader's busiest moment every second,
/// about one put in a hundred: the p99 measured that alignment.
async fn probe_while_beating(
    (probe, victim_kv): (Arc<dyn KvStore>, Arc<dyn KvStore>),
    coordinators: &[u32],
    (n, how): (u32, KeepAlives),
    window: Duration,
) -> Result<Probed> {
    let liveness = LivenessConfig::default();
    let victim = registry::register(
        &*victim_kv,
        worker_info(&format!("hb{n}{}-{}", how.tag(), n - 1), n - 1, liveness),
        liveness,
    )
    .await
    .context("registering the last worker")?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let beating = tokio::spawn(beat_until(victim_kv, victim.lease, liveness, stopped));
    // One period for the heartbeats to spread out.
    tokio::time::sleep(liveness.heartbeat).await;
    tracing::info!(workers = n, "heartbeats started; measuring");
    let before = cpu_now(coordinators);
    let threads_before = threads::snapshots(coordinators);
    let started = Instant::now();
    let mut latencies = Vec::new();
    while started.elapsed() < window {
        if beating.is_finished() {
            break;
        }
        let t = Instant::now();
        probe
            .put(b"bench/heartbeat/probe", b"x")
            .await
            .context("the probe's put")?;
        latencies.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    let spent = cpu_since(coordinators, &before);
    let by_role = threads::since_each(coordinators, &threads_before);
    latencies.sort_unstable();
    // The victim stops beating: how long after its last keep-alive's
    // answer its alive key is gone.
    let _ = stop.send(true);
    let last_beat = beating.await??;
    let alive = keys::alive(&victim.worker_id);
    let rev = probe.revision().await?;
    let mut events = probe.watch(alive.as_bytes(), rev + 1).await?;
    let deadline = last_beat + liveness.ttl + Duration::from_secs(10);
    let lost_ms = loop {
        match tokio::time::timeout_at(deadline.into(), events.next()).await {
            Ok(Some(Ok(Event::Delete { .. }))) => {
                break Some(last_beat.elapsed().as_secs_f64() * 1e3)
            }
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) | Err(_) => break None,
        }
    };
    Ok(Probed {
        spent,
        by_role,
        elapsed,
        latencies,
        lost_ms,
    })
}

/// The victim's keep-alive every heartbeat until `stop` says so; returns
/// when its last keep-alive was answered (none is cut off in flight).
async fn beat_until(
    kv: Arc<dyn KvStore>,
    lease: u64,
    liveness: LivenessConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<Instant> {
    loop {
        kv.keep_alive(lease)
            .await
            .context("the victim's keep-alive")?;
        let last = Instant::now();
        tokio::select! {
            () = tokio::time::sleep(liveness.heartbeat) => {}
            _ = stop.wait_for(|s| *s) => return Ok(last),
        }
    }
}
