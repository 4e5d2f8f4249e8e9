//! `tessel-bench heartbeat`: N simulated workers heartbeating at the
//! default period (1 s, TTL 5 s) against a real 3-replica coordinator on
//! loopback. Reported per count: the busiest coordinator's (the leader's)
//! CPU while they beat, a client put's latency meanwhile (its own
//! connection, one put every 10 ms), and how long after one worker's last
//! keep-alive its registry entry disappears (its lease expired: what the
//! monitor reacts to).
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
    cpu_now, cpu_split, leader_index, percents_json, quantile_ms, worker_info, KeepAlives,
};

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
            let probe = how.client(&cluster)?;
            let window = Duration::from_secs(args.seconds);
            let pids = cluster.coordinator_pids();
            let status = cluster.client()?;
            one(&clients, &*probe, (&pids, &status), n, how, window).await?;
        }
    }
    Ok(())
}

async fn one(
    clients: &[Arc<dyn KvStore>],
    probe: &dyn KvStore,
    (coordinators, status): (&[u32], &RaftKv),
    n: u32,
    how: KeepAlives,
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
    // The last worker beats here, so its last keep-alive is known.
    let victim = registry::register(
        probe,
        worker_info(&format!("hb{n}{}-{}", how.tag(), n - 1), n - 1, liveness),
        liveness,
    )
    .await
    .context("registering the last worker")?;
    let mut last_beat = Instant::now();
    // One period for the heartbeats to spread out.
    let settle = Instant::now() + liveness.heartbeat;
    while Instant::now() < settle {
        probe
            .keep_alive(victim.lease)
            .await
            .context("the victim's keep-alive while the heartbeats start")?;
        last_beat = Instant::now();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::info!(workers = n, "heartbeats started; measuring");
    let before = cpu_now(coordinators);
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut next_beat = Instant::now();
    while started.elapsed() < window {
        if Instant::now() >= next_beat {
            probe
                .keep_alive(victim.lease)
                .await
                .context("the victim's keep-alive")?;
            last_beat = Instant::now();
            next_beat = last_beat + liveness.heartbeat;
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
    // Workers the coordinator declared lost while they beat: must be none.
    let lost_while_beating = beats.iter().filter(|(_, b)| b.lost_now().is_some()).count();
    let leader = leader_index(status).await;
    let (leader_cpu_ns, followers_ns) = cpu_split(coordinators, &before, leader);
    latencies.sort_unstable();
    // The victim stops beating: how long until its alive key is gone.
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
    println!(
        "{{\"figure\":\"heartbeat\",\"workers\":{n},\"connections\":{},\"keep_alives\":\"{}\",\"heartbeat_ms\":{},\"ttl_ms\":{},\"leader_cpu_percent_of_one_core\":{:.1},\"followers_cpu_percent_of_one_core\":{},\"put_p50_ms\":{:.2},\"put_p99_ms\":{:.2},\"puts\":{},\"lost_seen_after_last_beat_ms\":{},\"lost_while_beating\":{lost_while_beating}}}",
        clients.len() + 1,
        format!("{how:?}").to_lowercase(),
        liveness.heartbeat.as_millis(),
        liveness.ttl.as_millis(),
        leader_cpu_ns as f64 / elapsed.as_nanos() as f64 * 100.0,
        percents_json(&followers_ns, elapsed),
        quantile_ms(&latencies, 0.5),
        quantile_ms(&latencies, 0.99),
        latencies.len(),
        lost_ms.map_or("null".to_owned(), |ms| format!("{ms:.0}")),
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
