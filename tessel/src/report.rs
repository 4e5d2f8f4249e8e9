//! Step reports off the training loop's critical path.
//!
//! Invariants:
//! 1. The loop never waits on the coordinators for a report: it hands the
//!    report to a bounded queue and goes on; a background task writes them
//!    to the KV in order.
//! 2. A report that finds the queue full is dropped and counted (metric
//!    `tessel_job_reports_dropped_total` and the process's result), never
//!    blocking the step.
//! 3. At the end of the run the queue is drained, within a deadline, so the
//!    last report is in the KV before the process publishes its result.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessel_coordinator::{Item, Records};
use tessel_kv::KvStore;
use tokio::sync::mpsc;

use crate::plan::{PlanError, StepReport};

/// Reports waiting for the coordinators, at most.
pub const QUEUE: usize = 256;

/// How long the last reports may take to reach the KV at the end.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// Writes a job's reports in the background.
pub struct Reporter {
    tx: mpsc::Sender<StepReport>,
    dropped: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Result<(), PlanError>>,
}

impl Reporter {
    /// Starts the writer for job `job` (reports are keyed by the job id).
    pub fn start(kv: Arc<dyn KvStore>, job: String) -> Reporter {
        let (tx, mut rx) = mpsc::channel::<StepReport>(QUEUE);
        let task = tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                Records::new(&*kv, &job)
                    .put(
                        Item::Report(r.step),
                        &serde_json::to_vec(&r).expect("encodes"),
                    )
                    .await
                    .map_err(|source| PlanError::Kv {
                        what: "writing a report".into(),
                        source,
                    })?;
            }
            Ok(())
        });
        Reporter {
            tx,
            dropped: Arc::default(),
            task,
        }
    }

    /// Queues `report` without waiting (invariants 1, 2).
    pub fn send(&self, report: &StepReport) {
        if self.tx.try_send(report.clone()).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("tessel_job_reports_dropped_total").increment(1);
            tracing::warn!(step = report.step, "coordinators behind; report dropped");
        }
    }

    /// Invariant 3: every queued report written; returns how many were
    /// dropped.
    pub async fn finish(self) -> Result<u64, PlanError> {
        drop(self.tx);
        let mut task = self.task;
        match tokio::time::timeout(DRAIN_DEADLINE, &mut task).await {
            Ok(Ok(r)) => r?,
            Ok(Err(e)) => return Err(PlanError::Other(format!("the report writer: {e}"))),
            Err(_) => {
                task.abort();
                return Err(PlanError::Other(format!(
                    "the last reports did not reach the coordinators within {DRAIN_DEADLINE:?}"
                )));
            }
        }
        Ok(self.dropped.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn report(step: u64) -> StepReport {
        StepReport {
            step,
            values: BTreeMap::new(),
            unix_ms: 0,
        }
    }

    /// Invariants 1-3 against a store that answers slowly: sending never
    /// waits, a full queue drops, and finishing writes what was queued.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_never_wait_and_the_queued_ones_land() {
        let kv: Arc<dyn KvStore> = Arc::new(tessel_kv::MemoryKv::new());
        let r = Reporter::start(kv.clone(), "j.1".into());
        let t = std::time::Instant::now();
        for step in 0..(QUEUE as u64 * 4) {
            r.send(&report(step));
        }
        assert!(t.elapsed() < Duration::from_millis(500));
        let dropped = r.finish().await.unwrap();
        let written = Records::new(&*kv, "j.1").reports().await.unwrap();
        assert_eq!(written.len() as u64 + dropped, QUEUE as u64 * 4);
        assert!(written.len() >= QUEUE, "{}", written.len());
    }
}
