//! `tessel-bench bootstrap --lose-one`: a host lost while its job's
//! topology is being built, at pod scale.
//!
//! One simulated host (the middle one) registers, joins the job and reads
//! its spec, then stops as a killed worker does: no more keep-alives,
//! nothing revoked, no local topology. Every other host runs its bootstrap
//! as in `bootstrap` and, as a worker's job process does, stops waiting
//! for the topology once the job's failure is recorded (`process`
//! invariant 8). The failure comes from the coordinators' real monitors:
//! the lost host's lease expires a TTL after its last renewal, its alive
//! key goes with it, and the monitor fails the jobs it joined.
//!
//! Reported, from the moment the host stopped beating: its alive key
//! gone (`alive_gone_after_loss_ms`: its lease expired), the failure
//! recorded (`failure_after_loss_ms`, as a watcher of the key sees it) and
//! the last host stopped on it (`all_stopped_after_loss_ms`). The run
//! fails if any host ends otherwise (a topology, an error, no answer
//! within the deadline) or names another cause.
//!
//! Left out: the restart. These jobs are assigned by the benchmark, not
//! submitted, so no scheduler pass restarts them; a scheduler's restart
//! reads the one failure key (`chaos-tests`: `jobs.rs` fails a job whose
//! worker is killed during the topology exchange within its TTL,
//! `scheduler.rs` restarts a job after a lost worker). A worker lost
//! before it joined the job is not a job failure for the monitor; the
//! scheduler's pass sees it lost among the attempt's placement.
//!
//! What the imitation does not do: the lost host shares its QUIC
//! connection with other hosts, so the connection stays up, where a killed
//! worker's closes. It holds no waits, so nothing of its is left for the
//! replica to end; its lease ends exactly as a killed worker's does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use tessel_coordinator::jobs::{self, FailureKind};
use tessel_coordinator::{keys, LivenessConfig};
use tessel_kv::{CountingKv, Event, KvStore};
use tessel_topology::TopologyCache;

use crate::beats::Beats;
use crate::bootstrap::{assign_all, dyn_clients};
use crate::sim_host::{self, Outcome};

/// How long after the loss every host must have stopped.
const DEADLINE_AFTER_TTL: Duration = Duration::from_secs(60);

/// Loses host `n / 2` of `n` during the bootstrap of a fresh job; prints
/// the figure `bootstrap_lost_worker`.
pub(crate) async fn run(
    clients: &[Arc<CountingKv>],
    beats: &Beats,
    n: u32,
    run: usize,
) -> Result<()> {
    if n < 2 {
        bail!("--lose-one needs at least 2 simulated hosts");
    }
    let job = format!("bench-lost-{n}-{run}");
    let lost = n / 2;
    assign_all(&dyn_clients(clients), &job, n).await?;
    let ttl = LivenessConfig::default().ttl;
    let deadline = ttl + DEADLINE_AFTER_TTL;
    // The failure, as a watcher of the key sees it arrive.
    let watcher: Arc<dyn KvStore> = clients[0].clone();
    let failure_job = job.clone();
    let recorded = tokio::spawn(async move {
        let f = jobs::wait_for_failure(&*watcher, &failure_job, deadline).await;
        (f, Instant::now())
    });
    // The lost host's alive key, as a watcher sees it go: its lease
    // expired (what the monitor reacts to).
    let alive = keys::alive(&sim_host::host_id(n, lost));
    let rev = clients[0].revision().await?;
    let mut events = clients[0].watch(alive.as_bytes(), rev + 1).await?;
    let gone = tokio::spawn(async move {
        loop {
            match tokio::time::timeout(deadline, events.next()).await {
                Ok(Some(Ok(Event::Delete { .. }))) => return Some(Instant::now()),
                Ok(Some(Ok(_))) => continue,
                _ => return None,
            }
        }
    });
    let cache = Arc::new(TopologyCache::new());
    let started = Instant::now();
    let lost_host = {
        let kv: Arc<dyn KvStore> = clients[lost as usize % clients.len()].clone();
        let (job, beats) = (job.clone(), beats.clone());
        tokio::spawn(async move { sim_host::run_lost(kv, &beats, (n, lost), &job).await })
    };
    let tasks: Vec<_> = (0..n)
        .filter(|&i| i != lost)
        .map(|i| {
            let kv: Arc<dyn KvStore> = clients[i as usize % clients.len()].clone();
            let job = job.clone();
            let (cache, beats) = (cache.clone(), beats.clone());
            tokio::spawn(async move {
                let liveness = LivenessConfig::default();
                let outcome = sim_host::run(kv, &beats, (n, i), &job, &cache, None, liveness).await;
                (outcome, Instant::now())
            })
        })
        .collect();
    let lost_at = lost_host.await??;
    let mut last = lost_at;
    let mut hosts = Vec::with_capacity(n as usize);
    let mut ended_otherwise = Vec::new();
    let lost_id = sim_host::host_id(n, lost);
    for (i, t) in tasks.into_iter().enumerate() {
        let left = (lost_at + deadline).saturating_duration_since(Instant::now());
        let (outcome, at) = tokio::time::timeout(left, t)
            .await
            .with_context(|| format!("a host was still waiting {deadline:?} after the loss"))??;
        last = last.max(at);
        match outcome {
            Ok(Outcome::Failed(h, f)) if f.worker.as_deref() == Some(lost_id.as_str()) => {
                hosts.push(h)
            }
            Ok(Outcome::Failed(h, f)) => {
                ended_otherwise.push(format!("host {i}: another failure: {f}"));
                hosts.push(h);
            }
            Ok(Outcome::Known(h)) => {
                ended_otherwise.push(format!("host {i}: a topology without host {lost}"));
                hosts.push(h);
            }
            Err(e) => ended_otherwise.push(format!("host {i}: {e:#}")),
        }
    }
    let (failure, recorded_at) = recorded.await?;
    let gone_at = gone
        .await?
        .context("the lost host's alive key was not deleted")?;
    let failure = failure?.context("no failure recorded")?;
    let result = if !ended_otherwise.is_empty() {
        Err(anyhow::anyhow!(
            "{} hosts ended otherwise, e.g. {}",
            ended_otherwise.len(),
            ended_otherwise[0]
        ))
    } else if failure.kind != FailureKind::WorkerLost {
        Err(anyhow::anyhow!("the failure recorded was {failure}"))
    } else {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "{{\"figure\":\"bootstrap_lost_worker\",\"workers\":{n},\"lost_after_start_ms\":{:.0},\"ttl_ms\":{},\"alive_gone_after_loss_ms\":{:.0},\"failure_after_loss_ms\":{:.0},\"all_stopped_after_loss_ms\":{:.0},\"hosts_stopped_on_it\":{},\"failure\":{}}}",
            ms(lost_at - started),
            ttl.as_millis(),
            ms(gone_at.saturating_duration_since(lost_at)),
            ms(recorded_at.saturating_duration_since(lost_at)),
            ms(last - lost_at),
            hosts.len(),
            serde_json::Value::String(failure.to_string()),
        );
        Ok(())
    };
    jobs::finish_job(&*clients[0], &job).await?;
    futures::future::join_all(hosts.into_iter().map(sim_host::RunningHost::stop)).await;
    result
}
