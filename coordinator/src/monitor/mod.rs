//! Turns lost workers into job failure events.
//!
//! Invariants:
//! 1. A job that a worker incarnation joined gets a failure event once
//!    that incarnation is gone: its alive key deleted (lease expired or
//!    revoked) or overwritten by a newer incarnation. A join applied after
//!    its worker's alive key was deleted (joining checks the incarnation,
//!    then writes) fails the job too.
//! 2. Nothing is missed across monitor restarts: the watch is opened at
//!    revision R before the registry is listed, and the listing is acted
//!    on first, so a loss either shows in the listing or arrives as an
//!    event after R; an event older than the listing's copy of its key is
//!    skipped, so a replayed loss never fails the jobs of the incarnation
//!    that came after it.
//! 3. The monitor holds no state a restart would need; several monitors
//!    write each failure once (failures are inserts).
//! 4. It runs where the replica leads (`serve` invariant 2), keeps the
//!    registry's alive keys and joined jobs in memory from its watch
//!    (`monitor/index.rs`), and records failures concurrently: a registration or a
//!    loss costs no read, and a thousand workers leaving at once do not
//!    hold the next loss behind a thousand round trips (at 4,096 workers,
//!    a loss was recorded 5 s late behind such a queue).

mod index;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tessel_kv::KvStore;
use tokio::task::JoinSet;

use crate::error::{CoordinatorError, Result};
use crate::jobs::{fail_job, FailureKind, JobFailure};
use crate::keys;
use index::{Index, Lost};

/// The reason of a failure event for a worker whose lease expired.
pub const LOST_LEASE: &str = "lost its lease";
/// The reason for a worker that registered again (a new incarnation).
pub const RESTARTED: &str = "restarted";

/// How often a monitor that does not run asks whether its replica leads,
/// and one that runs whether it still does.
const LEADERSHIP_POLL: Duration = Duration::from_millis(200);

/// Jobs a monitor remembers having failed, at most (then it forgets them
/// all: recording one again is an insert that finds it).
const REMEMBERED: usize = 65_536;

/// Watches the registry and fails the jobs of lost workers while `leads`
/// says this monitor's replica leads (invariant 4; always, attached to
/// etcd); starts again after an error or an ended watch.
pub async fn run(kv: Arc<dyn KvStore>, leads: impl Fn() -> bool + Send + Sync + 'static) {
    loop {
        while !leads() {
            tokio::time::sleep(LEADERSHIP_POLL).await;
        }
        let stepped_down = async {
            while leads() {
                tokio::time::sleep(LEADERSHIP_POLL).await;
            }
        };
        tokio::select! {
            r = run_once(&kv) => {
                let why = r.err().map_or("the watch ended".to_owned(), |e| e.to_string());
                tracing::warn!(error = %why, "monitor restarting");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            () = stepped_down => tracing::info!("the replica no longer leads: the monitor waits"),
        }
    }
}

/// Records failures concurrently, each job once (invariant 4).
struct Recorder {
    kv: Arc<dyn KvStore>,
    tasks: JoinSet<Result<()>>,
    recorded: HashSet<String>,
}

impl Recorder {
    fn record(&mut self, lost: Vec<Lost>) {
        for l in lost {
            if self.recorded.len() >= REMEMBERED {
                self.recorded.clear();
            }
            if !self.recorded.insert(l.job.clone()) {
                continue;
            }
            let kv = self.kv.clone();
            self.tasks.spawn(async move {
                let failure = JobFailure {
                    worker: Some(l.worker.clone()),
                    incarnation: l.incarnation,
                    kind: FailureKind::WorkerLost,
                    reason: l.reason.into(),
                    unix_ms: keys::unix_ms(),
                };
                fail_job(&*kv, &l.job, &failure).await?;
                tracing::info!(job = %l.job, worker = %l.worker, reason = l.reason, "job failed");
                Ok(())
            });
        }
    }
}

async fn run_once(kv: &Arc<dyn KvStore>) -> Result<()> {
    let listing = kv
        .list_at(keys::WORKERS.as_bytes())
        .await
        .map_err(CoordinatorError::kv("listing workers"))?;
    let mut events = kv
        .watch(keys::WORKERS.as_bytes(), listing.revision + 1)
        .await
        .map_err(CoordinatorError::kv("watching the registry"))?;
    let (mut index, lost) = Index::listed(&listing.pairs, listing.revision);
    drop(listing);
    let mut recorder = Recorder {
        kv: kv.clone(),
        tasks: JoinSet::new(),
        recorded: HashSet::new(),
    };
    recorder.record(lost);
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                None => return Ok(()),
                Some(ev) => {
                    let ev = ev.map_err(CoordinatorError::kv("watching the registry"))?;
                    recorder.record(index.apply(&ev));
                }
            },
            Some(done) = recorder.tasks.join_next() => match done {
                // A failure not recorded: start again (the listing finds
                // it, invariant 2).
                Ok(recorded) => recorded?,
                // Tasks are never aborted while the set lives.
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            },
        }
    }
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
        let monitor = tokio::spawn(run(kv.clone(), || true));
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

    /// Invariants 2 and 4: a monitor whose replica does not lead records
    /// nothing; once it leads, its listing finds the loss that happened
    /// meanwhile, and a new incarnation's start fails the old one's job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_monitor_acts_only_while_its_replica_leads_and_then_misses_nothing() {
        let kv: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let leads = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = leads.clone();
        let monitor = tokio::spawn(run(kv.clone(), move || {
            flag.load(std::sync::atomic::Ordering::Relaxed)
        }));
        let a = register(&*kv, info("a"), fast()).await.unwrap();
        join_job(&*kv, "j", &a).await.unwrap();
        let b = register(&*kv, info("b"), fast()).await.unwrap();
        join_job(&*kv, "k", &b).await.unwrap();
        kv.revoke(a.lease).await.unwrap();
        let b2 = register(&*kv, info("b"), fast()).await.unwrap();
        let _beats = Heartbeat::start(kv.clone(), b2, fast());
        tokio::time::sleep(Duration::from_millis(600)).await;
        for job in ["j", "k"] {
            assert_eq!(
                wait_for_failure(&*kv, job, Duration::ZERO).await.unwrap(),
                None,
                "recorded by a monitor whose replica does not lead"
            );
        }
        leads.store(true, std::sync::atomic::Ordering::Relaxed);
        let j = wait_for_failure(&*kv, "j", Duration::from_secs(3))
            .await
            .unwrap()
            .expect("the loss while it did not lead");
        assert_eq!(
            (j.worker.as_deref(), j.reason.as_str()),
            (Some("a"), LOST_LEASE)
        );
        let k = wait_for_failure(&*kv, "k", Duration::from_secs(3))
            .await
            .unwrap()
            .expect("the restart while it did not lead");
        assert_eq!((k.incarnation, k.reason.as_str()), (Some(1), RESTARTED));
        monitor.abort();
    }
}
