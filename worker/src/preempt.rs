//! Preemption notices: a worker about to go (SIGTERM: a node drain, a spot
//! reclaim) or drained on demand (`tessel drain`) tells every attempt it
//! runs to checkpoint and stop, and takes no new placements.
//!
//! Invariants:
//! 1. The notice is `jobs/{attempt}/suspend` = `"{grace_ms} {reason}"`,
//!    inserted once per attempt: every process of the attempt, on every
//!    worker, sees the same notice.
//! 2. A worker stopping on SIGTERM keeps its lease until its processes
//!    have acted on the notice (or the grace and the stop grace passed):
//!    the scheduler learns of the loss from the processes' own records.
//!
//! # Preemption
//!
//! A worker given SIGTERM with attempts running, or one whose
//! `workers/{w}/drain` key appears (`tessel drain`), inserts
//! `jobs/{attempt}/suspend` = `"{grace_ms} {reason}"` for each attempt it runs
//! and writes its drain key (the scheduler places nothing on drained
//! workers). A SIGTERMed worker keeps its lease until its processes acted
//! (at most the grace + 15 s), then deregisters and removes a drain key of
//! its own making.
//!
//! * Command jobs: every placement writes the reason to the attempt's
//!   `$TESSEL_PREEMPT_FILE`, sends SIGTERM after the grace, and records a
//!   `PeerLost` failure at the grace's end (not when its own processes are
//!   done: others may still be checkpointing); exits after the notice are
//!   not failures.
//! * Plan jobs: every process follows the notice. Process 0, at its next step
//!   boundary, chooses the suspend step: its step plus at least 200 ms of
//!   steps (≥ 2), inserted at `jobs/{attempt}/suspend_step`. Every process
//!   checkpoints at that step (off the periodic schedule) and stops with
//!   `Suspended`, a `PeerLost` failure; the next attempt restores that
//!   checkpoint and starts at the step after it. A process that learns the
//!   step only after passing it fails with `SuspendMissed` and the job
//!   restarts from the newest periodic checkpoint. Without checkpoints the
//!   plan stops at once and restarts from step 0.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessel_coordinator::{keys, Item, Records};
use tessel_kv::KvError;

use crate::agent::Worker;

/// A notice as stored: its grace and its reason.
pub fn parse_notice(value: &[u8]) -> (Duration, String) {
    let text = String::from_utf8_lossy(value);
    let (grace, reason) = text.split_once(' ').unwrap_or((&text, ""));
    (
        Duration::from_millis(grace.parse().unwrap_or(0)),
        reason.to_owned(),
    )
}

impl Worker {
    /// Invariant 1 for every attempt this worker runs, and marks the
    /// worker drained so no new placement comes here.
    pub(crate) async fn notify(&self, running: &Mutex<HashSet<String>>, reason: &str) {
        let drain = keys::drain(&self.cfg.worker_id);
        if let Err(e) = self.kv.put(drain.as_bytes(), reason.as_bytes()).await {
            tracing::warn!(error = %e, "could not mark this worker drained");
        }
        let jobs: Vec<String> = running
            .lock()
            .expect("not poisoned")
            .iter()
            .cloned()
            .collect();
        let value = format!("{} {reason}", self.cfg.preempt_grace.as_millis());
        for job in jobs {
            match Records::new(&*self.kv, &job)
                .first(Item::Notice, value.as_bytes())
                .await
            {
                Ok(_) => tracing::info!(job = %job, reason, "preemption notice given"),
                Err(e) => tracing::warn!(job = %job, error = %e, "could not give the notice"),
            }
        }
    }

    /// Follows this worker's drain key: when it appears, every attempt
    /// running here gets the notice. Runs until the worker stops.
    pub(crate) async fn follow_drain(self: Arc<Self>, running: Arc<Mutex<HashSet<String>>>) {
        let key = keys::drain(&self.cfg.worker_id);
        loop {
            match self.kv.get(key.as_bytes(), Duration::from_secs(3600)).await {
                Ok(reason) => {
                    let reason = format!(
                        "worker `{}` drained: {}",
                        self.cfg.worker_id,
                        String::from_utf8_lossy(&reason)
                    );
                    self.notify(&running, &reason).await;
                    // Until it is undone; attempts placed meanwhile (none,
                    // by the scheduler's rule) would not be told.
                    while self.kv.try_get(key.as_bytes()).await.is_ok() {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
                Err(KvError::DeadlineExceeded { .. }) => {}
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }

    /// Waits for the attempt's notice; its grace and reason.
    pub(crate) async fn notice(&self, job: &str) -> (Duration, String) {
        let records = Records::new(&*self.kv, job);
        loop {
            match records.wait(Item::Notice, Duration::from_secs(3600)).await {
                Ok(v) => return parse_notice(&v),
                Err(KvError::DeadlineExceeded { .. }) => {}
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_carry_their_grace_and_reason() {
        assert_eq!(
            parse_notice(b"1500 worker `w` is stopping (SIGTERM)"),
            (
                Duration::from_millis(1500),
                "worker `w` is stopping (SIGTERM)".into()
            )
        );
        assert_eq!(parse_notice(b"junk"), (Duration::ZERO, String::new()));
    }
}
