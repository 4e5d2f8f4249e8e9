//! A job's failure and its end, as this worker's processes of the attempt
//! wait for them: one blocking get each, held while any of them runs
//! (`process` invariant 10). The topology exchange, the transfer barrier,
//! the plan and the wait for the end each stop on them; with a get of their
//! own, a process opened four gets of the failure and two of `done`, and
//! cancelled all but the last two (at 4,096 hosts, 4,096 cancellations
//! reached the leader the moment the topology arrived).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tessel_coordinator::jobs::{self, JobFailure};
use tessel_coordinator::{CoordinatorError, Item, Records};
use tessel_kv::{KvError, KvStore};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::error::{kv_err, Result, WorkerError};

/// How long one get waits before asking again.
const HELD: Duration = Duration::from_secs(3600);

/// The two waits of one attempt, shared by its processes on this worker
/// (and held the same way by the benchmarks' simulated hosts). Dropping it
/// ends both gets.
pub struct JobEnd {
    failed: watch::Receiver<Option<std::result::Result<JobFailure, CoordinatorError>>>,
    done: watch::Receiver<Option<std::result::Result<(), KvError>>>,
    tasks: [AbortHandle; 2],
}

impl Drop for JobEnd {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl JobEnd {
    /// Opens both gets for attempt `job`.
    pub fn start(kv: Arc<dyn KvStore>, job: &str) -> JobEnd {
        let (failed_tx, failed) = watch::channel(None);
        let (done_tx, done) = watch::channel(None);
        let (k, j) = (kv.clone(), job.to_owned());
        let failure = tokio::spawn(async move {
            let r = loop {
                match jobs::wait_for_failure(&*k, &j, HELD).await {
                    Ok(Some(f)) => break Ok(f),
                    Ok(None) => continue,
                    Err(e) => break Err(e),
                }
            };
            let _ = failed_tx.send(Some(r));
        });
        let j = job.to_owned();
        let end = tokio::spawn(async move {
            let records = Records::new(&*kv, &j);
            let r = loop {
                match records.wait(Item::Done, HELD).await {
                    Ok(_) => break Ok(()),
                    Err(KvError::DeadlineExceeded { .. }) => continue,
                    Err(e) => break Err(e),
                }
            };
            let _ = done_tx.send(Some(r));
        });
        JobEnd {
            failed,
            done,
            tasks: [failure.abort_handle(), end.abort_handle()],
        }
    }

    /// The job's failure event, once there is one.
    pub async fn failed(&self) -> Result<JobFailure> {
        settled(&self.failed, "the job's failure")
            .await?
            .map_err(Into::into)
    }

    /// Returns once the job's `done` key exists.
    pub async fn done(&self) -> Result<()> {
        settled(&self.done, "the job's end")
            .await?
            .map_err(kv_err("waiting for the job's end"))
    }
}

/// The value `rx` was given, once it has one.
async fn settled<T: Clone>(rx: &watch::Receiver<Option<T>>, what: &str) -> Result<T> {
    let mut rx = rx.clone();
    let seen = rx
        .wait_for(Option::is_some)
        .await
        .map_err(|_| WorkerError::Internal(format!("the wait for {what} ended")))?;
    Ok(seen.clone().expect("waited for a value"))
}

/// Each attempt's [`JobEnd`] while some holder keeps it.
#[derive(Default)]
pub(crate) struct JobEnds {
    by_job: Mutex<HashMap<String, Weak<JobEnd>>>,
}

impl JobEnds {
    /// The attempt's waits: the ones already held, else new ones.
    pub(crate) fn of(&self, kv: &Arc<dyn KvStore>, job: &str) -> Arc<JobEnd> {
        let mut by_job = self.by_job.lock().expect("not poisoned");
        if let Some(end) = by_job.get(job).and_then(Weak::upgrade) {
            return end;
        }
        by_job.retain(|_, e| e.strong_count() > 0);
        let end = Arc::new(JobEnd::start(kv.clone(), job));
        by_job.insert(job.to_owned(), Arc::downgrade(&end));
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_coordinator::jobs::{fail_job, FailureKind};
    use tessel_kv::MemoryKv;

    /// Every phase of every process of the attempt sees the one failure
    /// and the one end, from one get each; once no one holds them, the
    /// gets end.
    #[tokio::test]
    async fn every_waiter_of_an_attempt_shares_one_wait_for_its_failure_and_end() {
        let kv: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let ends = JobEnds::default();
        let a = ends.of(&kv, "j@1");
        let b = ends.of(&kv, "j@1");
        assert!(Arc::ptr_eq(&a, &b), "one pair of waits for the attempt");
        assert!(
            !Arc::ptr_eq(&a, &ends.of(&kv, "k@1")),
            "another attempt's own"
        );
        let failure = JobFailure {
            worker: Some("w".into()),
            incarnation: Some(1),
            kind: FailureKind::WorkerLost,
            reason: "lost its lease".into(),
            unix_ms: 1,
        };
        let (first, second, ()) = tokio::join!(a.failed(), b.failed(), async {
            fail_job(&*kv, "j@1", &failure).await.unwrap();
        });
        assert_eq!(first.unwrap(), failure);
        assert_eq!(second.unwrap(), failure);
        // A later phase sees it at once.
        assert_eq!(a.failed().await.unwrap(), failure);
        jobs::finish_job(&*kv, "j@1").await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), a.done())
            .await
            .expect("the end seen")
            .unwrap();
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "dropped with its last holder");
    }
}
