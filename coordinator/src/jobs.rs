//! Which workers a job uses, and the job's failure event.
//!
//! Invariants:
//! 1. Membership is written on both sides (`jobs/{job}/members/{worker}` and
//!    `workers/{worker}/jobs/{job}`) in one batch, each holding the
//!    incarnation that joined; only the current incarnation may join.
//! 2. A job has at most one failure event: the first [`fail_job`] inserts
//!    it, later ones return the stored one, so every participant sees the
//!    same failure.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessel_kv::{BatchPut, KvError, KvStore};

use crate::error::{CoordinatorError, Result};
use crate::keys;
use crate::registry::{check_current, Registration};

/// What kind of failure ended a job's attempt: a restart can cure the
/// loss of a worker or of the connection to one, never the job's own
/// error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// A worker's lease expired, or it registered again (the monitor).
    WorkerLost,
    /// A process lost a peer: a transfer broke, a collective's deadline
    /// passed, a peer aborted for such a reason, or a process never
    /// arrived. Usually the first sign of a worker's loss.
    PeerLost,
    /// The job's own error: a program that does not compile or fails, a
    /// bad bundle, ranks that disagree, a checkpoint that cannot be
    /// restored, a command that cannot be started.
    Job,
    /// A process of a command job exited with a non-zero code or a
    /// signal: restarted while restarts remain, as torchrun does.
    Exited,
    /// Not a failure: a planned move. The attempt checkpointed and stopped
    /// for a preemption notice or a drain; the job resumes elsewhere
    /// without using its restart budget.
    Suspended,
}

impl FailureKind {
    /// Whether a new attempt may cure it.
    pub fn is_restartable(self) -> bool {
        !matches!(self, FailureKind::Job)
    }

    /// Whether it is a planned move rather than a failure.
    pub fn is_planned(self) -> bool {
        matches!(self, FailureKind::Suspended)
    }

    /// Its name, as `tessel job` and the JSON output show it.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::WorkerLost => "worker_lost",
            FailureKind::PeerLost => "peer_lost",
            FailureKind::Job => "job_error",
            FailureKind::Exited => "exited",
            FailureKind::Suspended => "suspended",
        }
    }
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFailure {
    /// The worker that reported it, or whose loss it is.
    pub worker: Option<String>,
    /// That worker's incarnation.
    pub incarnation: Option<u64>,
    /// Whether a restart may cure it.
    pub kind: FailureKind,
    /// What happened, for people.
    pub reason: String,
    /// When it was reported.
    pub unix_ms: u64,
}

impl std::fmt::Display for JobFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.worker, self.incarnation) {
            (Some(w), Some(i)) => write!(f, "worker `{w}` (incarnation {i}): {}", self.reason),
            (Some(w), None) => write!(f, "worker `{w}`: {}", self.reason),
            _ => f.write_str(&self.reason),
        }
    }
}

/// What a worker is asked to run: one process of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAssignment {
    /// The attempt (`ID@ATTEMPT`).
    pub attempt: String,
    /// The process this worker runs.
    pub process_index: u32,
    /// The attempt's process count.
    pub num_processes: u32,
    /// How long the topology exchange may take.
    pub topology_timeout_ms: u64,
    /// The job's trace context (W3C `traceparent`), so the process's spans
    /// join the job's trace.
    pub trace: Option<String>,
}

impl JobAssignment {
    /// Refuses a bad job id or a process index out of range.
    pub fn validate(&self) -> Result<()> {
        keys::check_id("job id", &self.attempt)?;
        if self.num_processes == 0 || self.process_index >= self.num_processes {
            return Err(CoordinatorError::Invalid {
                what: "assignment".into(),
                reason: format!(
                    "process {} of a job of {} processes",
                    self.process_index, self.num_processes
                ),
            });
        }
        Ok(())
    }

    /// Decodes and validates.
    pub fn decode(bytes: &[u8]) -> Result<JobAssignment> {
        let a: JobAssignment =
            postcard::from_bytes(bytes).map_err(CoordinatorError::decode("an assignment"))?;
        a.validate()?;
        Ok(a)
    }
}

/// Asks `worker` to run a process of a job.
pub async fn assign(kv: &dyn KvStore, worker: &str, a: &JobAssignment) -> Result<()> {
    keys::check_id("worker id", worker)?;
    a.validate()?;
    kv.put(
        keys::assignment(worker, &a.attempt).as_bytes(),
        &postcard::to_allocvec(a).expect("always encodes"),
    )
    .await
    .map_err(CoordinatorError::kv("writing an assignment"))?;
    Ok(())
}

/// The attempts placed on `worker` now.
pub async fn assignments(kv: &dyn KvStore, worker: &str) -> Result<Vec<JobAssignment>> {
    kv.list(keys::assignments(worker).as_bytes())
        .await
        .map_err(CoordinatorError::kv("listing a worker's assignments"))?
        .iter()
        .map(|p| JobAssignment::decode(&p.value))
        .collect()
}

/// Withdraws `worker`'s assignment to `job` and its membership, after
/// the job's attempt ended (scheduler invariant 7): a worker that was lost
/// with them would otherwise find them again when it comes back.
pub async fn unassign(kv: &dyn KvStore, worker: &str, job: &str) -> Result<()> {
    // The assignment last: it is the worker's right to write the job's keys
    // (the membership among them), so a worker withdrawing its own keeps
    // that right until its last write.
    for key in [
        keys::job_member(job, worker),
        keys::worker_job(worker, job),
        keys::assignment(worker, job),
    ] {
        kv.delete(key.as_bytes())
            .await
            .map_err(CoordinatorError::kv("withdrawing an assignment"))?;
    }
    Ok(())
}

/// Ends a job: workers leave it and drop its clients.
pub async fn finish_job(kv: &dyn KvStore, job: &str) -> Result<()> {
    kv.put(keys::job_done(job).as_bytes(), b"done")
        .await
        .map_err(CoordinatorError::kv("ending the job"))?;
    Ok(())
}

/// Adds the registered worker to `job` (invariant 1).
pub async fn join_job(kv: &dyn KvStore, job: &str, reg: &Registration) -> Result<()> {
    keys::check_id("job id", job)?;
    check_current(kv, &reg.worker_id, reg.incarnation).await?;
    let inc = reg.incarnation.to_string();
    // Both sides of the membership at once: one write, one revision.
    kv.put_batch(&[
        BatchPut::new(
            keys::worker_job(&reg.worker_id, job).as_bytes(),
            inc.as_bytes(),
            None,
        ),
        BatchPut::new(
            keys::job_member(job, &reg.worker_id).as_bytes(),
            inc.as_bytes(),
            None,
        ),
    ])
    .await
    .map_err(CoordinatorError::kv("recording the job's member"))?;
    Ok(())
}

/// Removes a worker from a job it finished, its assignment last.
pub async fn leave_job(kv: &dyn KvStore, job: &str, worker: &str) -> Result<()> {
    match kv.delete(keys::job_member(job, worker).as_bytes()).await {
        Ok(_) => {}
        // The scheduler withdrew the assignment first ([`unassign`], which
        // removes the membership too): the replicas refuse the job's keys
        // to a worker no longer assigned, and there is nothing left to do.
        Err(KvError::PermissionDenied(_))
            if kv
                .try_get(keys::assignment(worker, job).as_bytes())
                .await
                .is_err_and(|e| matches!(e, KvError::NotFound(_))) => {}
        Err(e) => return Err(CoordinatorError::kv("leaving the job")(e)),
    }
    for key in [keys::worker_job(worker, job), keys::assignment(worker, job)] {
        kv.delete(key.as_bytes())
            .await
            .map_err(CoordinatorError::kv("leaving the job"))?;
    }
    Ok(())
}

/// The job's members and the incarnations that joined.
pub async fn members(kv: &dyn KvStore, job: &str) -> Result<Vec<(String, u64)>> {
    let prefix = keys::job_members(job);
    let list = kv
        .list(prefix.as_bytes())
        .await
        .map_err(CoordinatorError::kv("listing job members"))?;
    Ok(list
        .into_iter()
        .filter_map(|p| {
            let w = std::str::from_utf8(&p.key[prefix.len()..]).ok()?.to_owned();
            let i = std::str::from_utf8(&p.value).ok()?.parse().ok()?;
            Some((w, i))
        })
        .collect())
}

/// Records the job's failure unless one is recorded; returns the stored
/// one (invariant 2).
pub async fn fail_job(kv: &dyn KvStore, job: &str, failure: &JobFailure) -> Result<JobFailure> {
    let key = keys::job_failure(job);
    let bytes = postcard::to_allocvec(failure).expect("always encodes");
    match kv.insert(key.as_bytes(), &bytes).await {
        Ok(_) => Ok(failure.clone()),
        Err(KvError::AlreadyExists(_)) => {
            let stored = kv
                .try_get(key.as_bytes())
                .await
                .map_err(CoordinatorError::kv("reading the job's failure"))?;
            postcard::from_bytes(&stored).map_err(CoordinatorError::decode("a job failure"))
        }
        Err(e) => Err(CoordinatorError::Kv {
            context: format!("recording the failure of job `{job}`"),
            source: e,
        }),
    }
}

/// Waits up to `timeout` for the job's failure event.
pub async fn wait_for_failure(
    kv: &dyn KvStore,
    job: &str,
    timeout: Duration,
) -> Result<Option<JobFailure>> {
    match kv.get(keys::job_failure(job).as_bytes(), timeout).await {
        Ok(v) => Ok(Some(
            postcard::from_bytes(&v).map_err(CoordinatorError::decode("a job failure"))?,
        )),
        Err(KvError::DeadlineExceeded { .. }) => Ok(None),
        Err(e) => Err(CoordinatorError::Kv {
            context: format!("waiting for a failure of job `{job}`"),
            source: e,
        }),
    }
}

/// The job's failure event, if there is one now.
pub async fn failure_of(kv: &dyn KvStore, job: &str) -> Result<Option<JobFailure>> {
    match kv.try_get(keys::job_failure(job).as_bytes()).await {
        Ok(v) => Ok(Some(
            postcard::from_bytes(&v).map_err(CoordinatorError::decode("a job failure"))?,
        )),
        Err(KvError::NotFound(_)) => Ok(None),
        Err(e) => Err(CoordinatorError::Kv {
            context: format!("reading the failure of job `{job}`"),
            source: e,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::register;
    use crate::registry::tests::{fast, info};
    use tessel_kv::MemoryKv;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_current_incarnation_joins_and_the_first_failure_stands() {
        let kv = MemoryKv::new();
        let old = register(&kv, info("w"), fast()).await.unwrap();
        let new = register(&kv, info("w"), fast()).await.unwrap();
        assert!(join_job(&kv, "j", &old).await.is_err());
        join_job(&kv, "j", &new).await.unwrap();
        assert_eq!(members(&kv, "j").await.unwrap(), vec![("w".into(), 2)]);
        let f1 = JobFailure {
            worker: Some("w".into()),
            incarnation: Some(2),
            kind: FailureKind::WorkerLost,
            reason: "lease expired".into(),
            unix_ms: 1,
        };
        let f2 = JobFailure {
            reason: "other".into(),
            ..f1.clone()
        };
        assert_eq!(fail_job(&kv, "j", &f1).await.unwrap(), f1);
        assert_eq!(fail_job(&kv, "j", &f2).await.unwrap(), f1);
        assert_eq!(
            wait_for_failure(&kv, "j", Duration::from_millis(10))
                .await
                .unwrap(),
            Some(f1)
        );
        assert_eq!(
            wait_for_failure(&kv, "other", Duration::from_millis(10))
                .await
                .unwrap(),
            None
        );
        leave_job(&kv, "j", "w").await.unwrap();
        assert!(members(&kv, "j").await.unwrap().is_empty());
    }
}
