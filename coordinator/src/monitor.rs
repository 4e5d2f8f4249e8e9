//! Turns lost workers into job failure events.
//!
//! Invariants:
//! 1. A job that a worker incarnation joined gets a failure event once
//!    that incarnation is gone: its alive key deleted (lease expired or
//!    revoked) or overwritten by a newer incarnation.
//! 2. Nothing is missed across monitor restarts: the watch is opened at
//!    revision R before a full reconcile pass reads the registry, so a loss
//!    either shows in the pass or arrives as an event after R.
//! 3. The monitor holds no state a restart would need; several monitors
//!    write each failure once (failures are inserts).

use std::sync::Arc;

use futures::StreamExt;
use tessel_kv::{Event, KvStore};

use crate::error::{CoordinatorError, Result};
use crate::jobs::{fail_job, JobFailure};
use crate::keys;
use crate::registry::{list_workers, WorkerState};

/// Fails every job that `worker` joined with an incarnation older than
/// `alive` (`None`: the worker has no live incarnation).
pub async fn fail_jobs_of(
    kv: &dyn KvStore,
    worker: &str,
    alive: Option<u64>,
    reason: &str,
) -> Result<Vec<String>> {
    let prefix = keys::worker_jobs(worker);
    let joined = kv
        .list(prefix.as_bytes())
        .await
        .map_err(CoordinatorError::kv("listing a worker's jobs"))?;
    let mut failed = Vec::new();
    for pair in joined {
        let Ok(job) = std::str::from_utf8(&pair.key[prefix.len()..]) else {
            continue;
        };
        let inc: Option<u64> = std::str::from_utf8(&pair.value)
            .ok()
            .and_then(|s| s.parse().ok());
        if let (Some(inc), Some(alive)) = (inc, alive) {
            if inc >= alive {
                continue;
            }
        }
        let failure = JobFailure {
            worker: Some(worker.into()),
            incarnation: inc,
            kind: crate::jobs::FailureKind::WorkerLost,
            reason: reason.into(),
            unix_ms: keys::unix_ms(),
        };
        fail_job(kv, job, &failure).await?;
        tracing::info!(job, worker, reason, "job failed");
        failed.push(job.to_owned());
    }
    Ok(failed)
}

/// The reason of a failure event for a worker whose lease expired.
pub const LOST_LEASE: &str = "lost its lease";
/// The reason for a worker that registered again (a new incarnation).
pub const RESTARTED: &str = "restarted";

/// Fails the jobs of every worker that is not alive (invariant 2's pass).
pub async fn reconcile(kv: &dyn KvStore) -> Result<()> {
    for w in list_workers(kv).await? {
        if w.jobs.is_empty() {
            continue;
        }
        let alive = match w.state {
            WorkerState::Alive { incarnation, .. } => Some(incarnation),
            WorkerState::Dead => None,
        };
        let reason = if alive.is_some() {
            RESTARTED
        } else {
            LOST_LEASE
        };
        fail_jobs_of(kv, &w.record.info.worker_id, alive, reason).await?;
    }
    Ok(())
}

/// Watches the registry and fails the jobs of lost workers, until the
/// store's watch ends; retries on errors.
pub async fn run(kv: Arc<dyn KvStore>) -> Result<()> {
    loop {
        match run_once(&*kv).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "monitor restarting");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
}

async fn run_once(kv: &dyn KvStore) -> Result<()> {
    let rev = kv
        .revision()
        .await
        .map_err(CoordinatorError::kv("reading the revision"))?;
    let mut events = kv
        .watch(keys::WORKERS.as_bytes(), rev + 1)
        .await
        .map_err(CoordinatorError::kv("watching the registry"))?;
    reconcile(kv).await?;
    // The incarnation last seen alive per worker: a cache that saves a
    // listing per heartbeat, rebuilt after a restart (invariant 3).
    let mut seen: std::collections::HashMap<String, u64> = Default::default();
    while let Some(ev) = events.next().await {
        match ev.map_err(CoordinatorError::kv("watching the registry"))? {
            Event::Delete { key, .. } => {
                if let Some(worker) = keys::parse_alive(&key) {
                    seen.remove(worker);
                    fail_jobs_of(kv, worker, None, LOST_LEASE).await?;
                }
            }
            Event::Put(p) => {
                if let (Some(worker), Some((inc, _))) =
                    (keys::parse_alive(&p.key), keys::parse_alive_value(&p.value))
                {
                    if seen.get(worker) != Some(&inc) {
                        fail_jobs_of(kv, worker, Some(inc), RESTARTED).await?;
                        seen.insert(worker.to_owned(), inc);
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{join_job, wait_for_failure};
    use crate::registry::tests::{fast, info};
    use crate::registry::{register, Heartbeat};
    use std::time::{Duration, Instant};
    use tessel_kv::MemoryKv;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_worker_fails_its_jobs_within_ttl() {
        let kv: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let monitor = tokio::spawn(run(kv.clone()));
        let a = register(&*kv, info("a"), fast()).await.unwrap();
        let b = register(&*kv, info("b"), fast()).await.unwrap();
        let _hb_a = Heartbeat::start(kv.clone(), a.clone(), fast());
        let hb_b = Heartbeat::start(kv.clone(), b.clone(), fast());
        join_job(&*kv, "j", &a).await.unwrap();
        join_job(&*kv, "j", &b).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            wait_for_failure(&*kv, "j", Duration::ZERO).await.unwrap(),
            None,
            "no failure while both beat"
        );
        let stopped = Instant::now();
        hb_b.stop();
        let f = wait_for_failure(&*kv, "j", Duration::from_secs(3))
            .await
            .unwrap()
            .expect("a failure event");
        assert!(stopped.elapsed() < fast().ttl + Duration::from_secs(1));
        assert_eq!(f.worker.as_deref(), Some("b"));
        monitor.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reconcile_catches_losses_that_happened_while_no_monitor_ran() {
        let kv = MemoryKv::new();
        let a = register(&kv, info("a"), fast()).await.unwrap();
        join_job(&kv, "j", &a).await.unwrap();
        // A restart with no monitor running.
        register(&kv, info("a"), fast()).await.unwrap();
        reconcile(&kv).await.unwrap();
        let f = wait_for_failure(&kv, "j", Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(f.incarnation, Some(1));
        assert_eq!(f.reason, "restarted");
    }
}
