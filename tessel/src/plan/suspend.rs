//! Suspend and resume on a preemption notice, as Pathways does: every
//! process of a running plan checkpoints at one step chosen after the
//! notice, off the periodic schedule, and the attempt ends so the job
//! resumes from exactly that step.
//!
//! Invariants:
//! 1. Process 0 chooses the step: the step it is at plus a margin of at
//!    least [`MARGIN`] of wall time, so every process (they move in step
//!    through the plan's collectives) learns it before reaching it.
//! 2. A process that learns the step only after passing it fails the
//!    attempt as a lost peer: the job restarts from the newest periodic
//!    checkpoint instead, never from a partial one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessel_coordinator::{Item, Records};
use tessel_kv::{KvError, KvStore};

/// The least wall time between choosing the step and reaching it.
pub const MARGIN: Duration = Duration::from_millis(200);

/// The step to suspend at, chosen at the end of step `now` (invariant 1),
/// or `None` when the plan would end first anyway.
pub fn suspend_step(now: u64, step_time: Duration, steps: u64) -> Option<u64> {
    let per = step_time.as_secs_f64().max(1e-6);
    let margin = ((MARGIN.as_secs_f64() / per).ceil() as u64).max(2);
    let at = now.saturating_add(margin);
    (at + 1 < steps).then_some(at)
}

#[derive(Default)]
struct Seen {
    reason: Option<String>,
    step: Option<u64>,
}

/// Follows an attempt's notice and, once chosen, its suspend step.
pub struct Suspension {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Suspension {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn wait_for(kv: &dyn KvStore, job: &str, item: Item<'_>) -> Vec<u8> {
    loop {
        match Records::new(kv, job)
            .wait(item, Duration::from_secs(3600))
            .await
        {
            Ok(v) => return v,
            Err(KvError::DeadlineExceeded { .. }) => {}
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

impl Suspension {
    /// Starts following attempt `job`'s keys.
    pub fn follow(kv: Arc<dyn KvStore>, job: &str) -> Suspension {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (job, s) = (job.to_owned(), seen.clone());
        let task = tokio::spawn(async move {
            let v = wait_for(&*kv, &job, Item::Notice).await;
            let (_, reason) = tessel_worker::preempt::parse_notice(&v);
            s.lock().expect("not poisoned").reason = Some(reason);
            let v = wait_for(&*kv, &job, Item::SuspendStep).await;
            s.lock().expect("not poisoned").step = String::from_utf8_lossy(&v).parse().ok();
        });
        Suspension { seen, task }
    }

    /// The notice's reason, once there is one.
    pub fn requested(&self) -> Option<String> {
        self.seen.lock().expect("not poisoned").reason.clone()
    }

    /// The chosen step, once known.
    pub fn step(&self) -> Option<u64> {
        self.seen.lock().expect("not poisoned").step
    }

    /// Process 0: publishes `step` (the first choice stands) and returns
    /// the step in force.
    pub async fn choose(&self, kv: &dyn KvStore, job: &str, step: u64) -> Result<u64, KvError> {
        let first = Records::new(kv, job)
            .first(Item::SuspendStep, step.to_string().as_bytes())
            .await?;
        let chosen = String::from_utf8_lossy(&first).parse().unwrap_or(step);
        self.seen.lock().expect("not poisoned").step = Some(chosen);
        Ok(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_leaves_every_process_time_to_learn_it() {
        // 2 ms steps: 100 steps of margin; 1 s steps: the minimum of 2.
        assert_eq!(suspend_step(500, Duration::from_millis(2), 2000), Some(600));
        assert_eq!(suspend_step(10, Duration::from_secs(1), 2000), Some(12));
        // Too close to the end: the plan just finishes.
        assert_eq!(suspend_step(1950, Duration::from_millis(2), 2000), None);
        assert_eq!(suspend_step(0, Duration::ZERO, 3), None);
    }
}
