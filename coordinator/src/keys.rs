//! The coordinator's key-value keys (also in ARCHITECTURE.md).
//!
//! * `workers/{worker}/incarnation`: a counter, incremented by every
//!   registration of that worker id.
//! * `workers/{worker}/info`: the latest [`WorkerRecord`] (postcard).
//! * `workers/{worker}/alive`: `"{incarnation} {unix_ms}"`, attached to the
//!   incarnation's lease and written by its registration alone (heartbeats
//!   write nothing); gone = dead.
//! * `workers/{worker}/jobs/{job}`: the incarnation that joined the job.
//! * `jobs/{job}/members/{worker}`: the same, from the job's side.
//! * `jobs/{job}/failure`: the job's first [`JobFailure`] (postcard),
//!   inserted once.
//! * `assignments/{worker}/{job}`: a [`JobAssignment`] (postcard): the
//!   worker runs process `process_index` of the job.
//! * `jobs/{job}/processes/{index:05}/topology`: SHA-256 (hex) of the
//!   global topology that process holds.
//! * `jobs/{job}/processes/{index:05}/transfer_ready`: the process passed
//!   the job's barrier over the transfer layer (value: its time in ms).
//! * `jobs/{job}/processes/{index:05}/failure_seen`: the failure that
//!   process observed.
//! * `jobs/{job}/done`: the job is over; workers leave it and drop its
//!   clients.
//!
//! [`WorkerRecord`]: crate::WorkerRecord
//! [`JobFailure`]: crate::JobFailure
//! [`JobAssignment`]: crate::jobs::JobAssignment

use crate::error::{CoordinatorError, Result};

/// Worker ids and job ids are path components
/// ([`tessel_kv::check_path_component`]).
pub fn check_id(what: &str, s: &str) -> Result<()> {
    tessel_kv::check_path_component(what, s).map_err(|reason| CoordinatorError::Invalid {
        what: what.into(),
        reason,
    })
}

/// Every worker's keys.
pub const WORKERS: &str = "workers/";

/// The counter of a worker's registrations.
pub fn incarnation(worker: &str) -> String {
    format!("workers/{worker}/incarnation")
}

/// A worker's [`crate::WorkerRecord`].
pub fn info(worker: &str) -> String {
    format!("workers/{worker}/info")
}

/// A worker's liveness key (bound to its lease): `"{incarnation} {unix_ms}"`.
pub fn alive(worker: &str) -> String {
    format!("workers/{worker}/alive")
}

/// Worker `worker` joined `job`.
pub(crate) fn worker_job(worker: &str, job: &str) -> String {
    format!("workers/{worker}/jobs/{job}")
}

/// The workers that joined a job.
pub(crate) fn job_members(job: &str) -> String {
    format!("jobs/{job}/members/")
}

/// Worker `worker` is a member of `job`.
pub(crate) fn job_member(job: &str, worker: &str) -> String {
    format!("jobs/{job}/members/{worker}")
}

/// The log chunks of process `process` of attempt `attempt` of job `id`
/// (a command job's output), or of every process with `None`.
pub(crate) fn job_logs(id: &str, attempt: u32, process: Option<u32>) -> String {
    match process {
        Some(p) => format!("jobs/{id}/logs/{attempt:05}/{p:05}/"),
        None => format!("jobs/{id}/logs/{attempt:05}/"),
    }
}

/// One log chunk (see [`job_logs`]), numbered from 0 in order.
pub(crate) fn job_log(id: &str, attempt: u32, process: u32, seq: u64) -> String {
    format!("jobs/{id}/logs/{attempt:05}/{process:05}/{seq:010}")
}

/// Where process 0 of a command job's attempt publishes the rendezvous
/// address its processes meet at (`host jax_port torch_port`).
pub(crate) fn job_rendezvous(job: &str) -> String {
    format!("jobs/{job}/rendezvous")
}

/// A request that a running attempt checkpoint and stop (a preemption
/// notice): `"{grace_ms} {reason}"`. Plan processes checkpoint at a step
/// they agree on; command processes find their notice file.
pub(crate) fn job_suspend(job: &str) -> String {
    format!("jobs/{job}/suspend")
}

/// The step at which a suspended plan's processes checkpoint and stop,
/// chosen by process 0.
pub(crate) fn job_suspend_step(job: &str) -> String {
    format!("jobs/{job}/suspend_step")
}

/// A drain request for a worker: no new placements, and its running
/// processes are told to checkpoint and stop (the value: why).
pub fn drain(worker: &str) -> String {
    format!("workers/{worker}/drain")
}

/// A job's first failure (written once).
pub(crate) fn job_failure(job: &str) -> String {
    format!("jobs/{job}/failure")
}

/// The attempts the scheduler placed on a worker.
pub fn assignments(worker: &str) -> String {
    format!("assignments/{worker}/")
}

/// The scheduler placed attempt `job` on `worker`.
pub(crate) fn assignment(worker: &str, job: &str) -> String {
    format!("assignments/{worker}/{job}")
}

/// Every process's keys of a job.
pub(crate) fn process_topologies(job: &str) -> String {
    format!("jobs/{job}/processes/")
}

/// The job's bundle: its spec text and the files it names.
pub(crate) fn job_spec(job: &str) -> String {
    format!("jobs/{job}/spec")
}

/// Reported scalars, one key per reported step (zero-padded, so a listing
/// is in step order).
pub(crate) fn job_reports(job: &str) -> String {
    format!("jobs/{job}/reports/")
}

/// Reported scalars of step `step`.
pub(crate) fn job_report(job: &str, step: u64) -> String {
    format!("jobs/{job}/reports/{step:012}")
}

/// An array's final value (`.npy`), written by process 0 at the end.
pub(crate) fn job_array(job: &str, array: &str) -> String {
    format!("jobs/{job}/arrays/{array}")
}

/// A job's complete checkpoints, one record per step (written by the
/// job's process 0; keyed by the job id, not the attempt).
pub(crate) fn job_checkpoints(job: &str) -> String {
    format!("jobs/{job}/checkpoints/")
}

/// The checkpoint record of step `step`.
pub(crate) fn job_checkpoint(job: &str, step: u64) -> String {
    format!("jobs/{job}/checkpoints/{step:012}")
}

/// Every process finished.
pub(crate) fn job_done(job: &str) -> String {
    format!("jobs/{job}/done")
}

/// The scheduler's whole state (one value, replaced by compare-and-swap).
pub const SCHED_STATE: &str = "sched/state";

/// A submitted job's bundle (spec and files), copied to each attempt.
pub(crate) fn sched_bundle(job: &str) -> String {
    format!("sched/jobs/{job}/bundle")
}

/// A request to cancel the job.
pub(crate) fn sched_cancel(job: &str) -> String {
    format!("sched/jobs/{job}/cancel")
}

/// The job's state changes, in order.
pub(crate) fn sched_events(job: &str) -> String {
    format!("sched/jobs/{job}/events/")
}

/// Event `seq` of a job.
pub(crate) fn sched_event(job: &str, seq: u64) -> String {
    format!("sched/jobs/{job}/events/{seq:012}")
}

/// `workers/{worker}/alive` → the worker id.
pub fn parse_alive(key: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(key).ok()?;
    s.strip_prefix(WORKERS)?.strip_suffix("/alive")
}

/// `workers/{worker}/jobs/{job}` → `(worker, job)`.
pub fn parse_worker_job(key: &[u8]) -> Option<(&str, &str)> {
    let s = std::str::from_utf8(key).ok()?;
    let (worker, job) = s.strip_prefix(WORKERS)?.split_once("/jobs/")?;
    (!worker.contains('/') && !job.is_empty() && !job.contains('/')).then_some((worker, job))
}

/// `"{incarnation} {unix_ms}"`.
pub fn alive_value(incarnation: u64, unix_ms: u64) -> String {
    format!("{incarnation} {unix_ms}")
}

/// Parses [`alive_value`]: `(incarnation, unix_ms)`.
pub fn parse_alive_value(v: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(v).ok()?;
    let (i, t) = s.split_once(' ')?;
    Some((i.parse().ok()?, t.parse().ok()?))
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        assert_eq!(parse_alive(alive("w-1").as_bytes()), Some("w-1"));
        assert_eq!(parse_alive(b"workers/w/info"), None);
        assert_eq!(
            parse_alive_value(alive_value(3, 99).as_bytes()),
            Some((3, 99))
        );
        assert!(check_id("worker id", "a/b").is_err());
        assert!(check_id("worker id", "").is_err());
        assert!(check_id("worker id", "host-1.w0").is_ok());
    }
}
