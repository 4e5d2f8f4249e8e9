//! The job scheduler: a queue of submitted jobs, gang-scheduled onto
//! registered workers, driven through a persisted state machine.
//!
//! ```text
//! Pending ──placed──▶ Scheduled ──every process ready──▶ Running ──all results──▶ Succeeded
//!    ▲                    │                                  │
//!    │                    └──────────── failure ─────────────┤──▶ Failed
//!    └──── Restarting ◀── a worker was lost, restarts left ──┘
//! any non-terminal state ──cancel──▶ Cancelled
//! ```
//!
//! The decision logic ([`SchedulerState::advance`]) is pure; [`run`] is the
//! I/O around it: it reads what the workers published, advances the state,
//! commits it and then carries out what the new state asks for.
//!
//! Invariants:
//! 1. The whole state is one KV value (`sched/state`) replaced only by CAS
//!    from the bytes a pass read: passes never interleave, a device is never
//!    given twice, and the scheduler survives any coordinator's death.
//! 2. Gang scheduling: a job is placed all at once (one process per worker
//!    with enough free devices and its plugin) or stays Pending with a reason.
//! 3. Attempt `a` of job `id` runs as instance `id@a`, its own KV namespace:
//!    nothing of a lost attempt is reused.
//! 4. Side effects (bundle, assignments, `done`, events) follow a committed
//!    state and are idempotent: the next pass completes a dead one's. The
//!    assignments are derived from the state at every pass; a transition's
//!    event and its ended attempt's cleanup only from the pass that made
//!    it, so one that failed part-way is carried out again, first, by the
//!    next pass of the same process (a coordinator killed in between leaves
//!    them undone).
//! 5. Every transition appends one event, inserted once, in transition order;
//!    its log line, metrics and trace spans come from the pass that inserted it.
//! 6. A lost worker or peer restarts the job while restarts remain, placed only
//!    once each old worker is known lost or alive ([`settle`]: alive a TTL
//!    and a margin after the failure; at most [`MAX_SETTLE_MS`]); the job's
//!    own errors fail it.
//! 7. An ended attempt leaves nothing to run: `done` written, assignments and
//!    memberships removed.
//! 8. Restarts back off ([`restart_backoff_ms`]); a process's non-zero exit
//!    restarts like a lost worker.
//! 9. A planned move (`Suspended`: a notice or a drain) restarts the job
//!    without using `max_restarts`; it counts in `suspensions`.
//! 10. The scheduler checks what it places itself ([`check_request`]),
//!     whichever client wrote it: a job it could never run correctly fails
//!     at once, naming why, instead of being placed.
//! 11. A restart's timers (back-off, settle) run from the job's last change,
//!     stamped by whichever coordinator's wall clock made it. A pass whose
//!     clock is behind that stamp (a coordinator that ran ahead, or its own
//!     clock stepped back) stamps it again with its own: a clock step delays
//!     a restart by at most one back-off and settle, never by the step.
//! 12. A placed worker found dead before it joined the attempt fails the
//!     attempt (`WorkerLost`) at the next pass, as the monitor fails one
//!     that joined: a host that died just before or after its placement
//!     (alive until its TTL ran out) held every other process in the
//!     topology exchange for its timeout (120 s) first.
//!
//! # Restarts
//!
//! * `JobFailure.kind`: `WorkerLost` (the monitor: lease expired, new
//!   incarnation), `PeerLost` (a process: a transfer broke, a collective's
//!   deadline passed, a peer aborted, the topology exchange timed out, the
//!   KV was unreachable), `Exited` (a command job's process exited non-zero
//!   or by a signal), `Suspended` (not a failure: an attempt stopped for a
//!   preemption notice or a drain), `Job` (everything else: compile errors,
//!   bad bundles, mismatches, restore failures, a command that cannot
//!   start). `Suspended` always restarts; the others but `Job` restart while
//!   `max_restarts` allows, after a back-off of 0, 1, 2, 4 … 30 s
//!   (`scheduler::restart_backoff_ms`).
//! * A Restarting job goes Pending only once `scheduler::settle` says every
//!   worker of the failed attempt is lost (dead, or a newer incarnation than
//!   the one that joined) or alive (still alive its TTL and a second after
//!   the job turned Restarting: its lease was renewed since), or 30 s
//!   passed; the Pending event names the lost workers. Placement then
//!   avoids the dead and keeps each process on its previous worker where
//!   it can.
//! * When an attempt ends, the scheduler writes its `done` key and deletes
//!   its assignments and memberships; a worker that comes back withdraws any
//!   assignment whose attempt is done instead of running it.
//! * A worker that loses its registration (its lease expired while it was
//!   cut off) stops that incarnation's job processes and registers again
//!   with a new incarnation; it stops for good only when another live
//!   process took its id. A new process takes an id only when its alive key
//!   is absent, its holder ran on this boot and is gone, or the holder wrote
//!   no heartbeat for its TTL (`claim`).
mod history;
mod pass;
mod spans;

pub use history::{attempts, Attempt};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessel_kv::{KvError, KvStore};

use crate::error::{CoordinatorError, Result};
use crate::jobs::{self, FailureKind, JobAssignment, JobFailure};
use crate::keys;
use crate::registry::{list_workers, RegistryView, WorkerState, WorkerStatus};

pub use pass::{cancel, pass, read_state, run, submit, LOST_BEFORE_JOINING};

/// Finished jobs kept in the state for listing.
pub const KEEP_FINISHED: usize = 256;

/// A job's place in its life (its transitions are in the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Waiting for workers.
    Pending,
    /// Placed; its processes are starting.
    Scheduled,
    /// Every process passed the transfer barrier.
    Running,
    /// An attempt failed; the next waits for the last to settle.
    Restarting,
    /// Every process published its result.
    Succeeded,
    /// Failed past its restarts, or with a job error.
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

impl JobState {
    /// Every state, in order.
    pub const ALL: [JobState; 7] = [
        JobState::Pending,
        JobState::Scheduled,
        JobState::Running,
        JobState::Restarting,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// Whether the job has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

    /// The state's name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            JobState::Pending => "Pending",
            JobState::Scheduled => "Scheduled",
            JobState::Running => "Running",
            JobState::Restarting => "Restarting",
            JobState::Succeeded => "Succeeded",
            JobState::Failed => "Failed",
            JobState::Cancelled => "Cancelled",
        }
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One job as the scheduler tracks it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// `NAME.N`, unique for the life of the cluster.
    pub id: String,
    /// The spec's name.
    pub name: String,
    /// Where it stands.
    pub state: JobState,
    /// Processes it needs.
    pub processes: u32,
    /// Devices each process needs.
    pub devices_per_process: u32,
    /// The plugin the job asks for: a worker's plugin name or platform.
    pub plugin: String,
    /// Restarts allowed.
    pub max_restarts: u32,
    /// Restarts so far (failures only).
    pub restarts: u32,
    /// Planned moves so far (a notice or a drain suspended an attempt):
    /// not failures, so not counted in `restarts` (invariant 9).
    pub suspensions: u32,
    /// The current (or last) attempt; 0 before the first placement.
    pub attempt: u32,
    /// The worker of each process of the current attempt.
    pub placement: Vec<String>,
    /// Why it waits, or why it failed.
    pub reason: Option<String>,
    /// When it was submitted.
    pub submitted_unix_ms: u64,
    /// When its record last changed.
    pub updated_unix_ms: u64,
    /// Events appended so far (the next event's sequence number).
    pub events: u64,
    /// When it entered its current state.
    pub state_since_unix_ms: u64,
    /// When its current (or last) attempt was placed.
    pub placed_unix_ms: u64,
    /// Its trace context (W3C `traceparent`; `tessel_trace::JobTrace`),
    /// given at submit.
    pub trace: Option<String>,
}

impl JobRecord {
    /// The KV namespace of the current attempt (invariant 3).
    pub fn instance(&self) -> String {
        instance(&self.id, self.attempt)
    }
}

/// The KV namespace of attempt `attempt` of job `id`: `ID@ATTEMPT`.
pub fn instance(id: &str, attempt: u32) -> String {
    format!("{id}@{attempt}")
}

/// The job an instance belongs to (`mlp.3@2` → `mlp.3`); a job run without
/// the scheduler is its own instance. Job names cannot hold `@`.
pub fn job_of_instance(instance: &str) -> &str {
    instance.split_once('@').map_or(instance, |(id, _)| id)
}

/// A state change, as appended to the job's events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEvent {
    /// Its position in the job's events.
    pub seq: u64,
    /// When it happened.
    pub unix_ms: u64,
    /// The state before.
    pub from: JobState,
    /// The state after.
    pub to: JobState,
    /// The attempt it happened in.
    pub attempt: u32,
    /// Why, when there is a reason to give.
    pub reason: Option<String>,
    /// For the end of an attempt: what ended it (a failure's kind, or
    /// [`FailureKind::Suspended`] for a planned move).
    pub cause: Option<FailureKind>,
    /// When the job entered `from`.
    pub since_unix_ms: u64,
}

/// What the workers published about a job's current attempt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// A user asked to cancel it.
    pub cancel_requested: bool,
    /// The first failure a process published.
    pub failure: Option<JobFailure>,
    /// Processes past the transfer barrier.
    pub ready: u32,
    /// Processes that published their result.
    pub finished: u32,
    /// For a Restarting job: how its last attempt's workers stand.
    pub settled: Settled,
}

/// An alive worker and its devices.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerCapacity {
    /// The worker's id.
    pub worker: String,
    /// Devices it has free.
    pub devices: u32,
    /// The names a job's `plugin` may give to run here: the plugin the
    /// worker was started with (a name or a path) and its platform.
    pub plugins: Vec<String>,
}

/// What a job asks of the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The spec's name.
    pub name: String,
    /// Processes it needs.
    pub processes: u32,
    /// Devices each process needs.
    pub devices_per_process: u32,
    /// The plugin it asks for.
    pub plugin: String,
    /// Restarts allowed.
    pub max_restarts: u32,
    /// Its trace context (W3C `traceparent`), if the submitter gave one.
    pub trace: Option<String>,
}

/// How long a restart waits at most for the lost attempt's workers to
/// settle (invariant 6): past every worker's TTL, the lease of a worker
/// that stopped beating has expired.
pub const MAX_SETTLE_MS: u64 = 30_000;

/// How long the `restarts`-th restart waits after its attempt failed
/// (invariant 8): the first at once, then 1 s doubling up to 30 s, so a
/// job that fails at start cannot storm the cluster.
pub fn restart_backoff_ms(restarts: u32) -> u64 {
    match restarts {
        0 | 1 => 0,
        r => 1000u64.saturating_mul(1 << (r - 2).min(5)).min(30_000),
    }
}

/// The workers of a failed attempt, as a restart sees them (invariant 6).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// Every worker of the attempt is known alive (its lease outlived the
    /// failure by its TTL) or known lost.
    pub done: bool,
    /// The attempt's workers that were lost: dead, or registered again.
    pub lost: Vec<String>,
}

/// A worker of a failed attempt as the registry shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptWorker {
    /// The worker's id.
    pub worker: String,
    /// The incarnation that joined the attempt, if it joined.
    pub joined: Option<u64>,
    /// The incarnation holding its alive key, while alive.
    pub alive: Option<u64>,
    /// Its lease's TTL.
    pub ttl_ms: u64,
}

/// How far past a worker's TTL its alive key must last to prove it lived
/// after the failure (invariant 6): the leader's expiry and the registry's
/// watch lag behind the lease's deadline by this much at most, on a
/// loaded leader.
pub const SETTLE_MARGIN_MS: u64 = 1_000;

/// Invariant 6, pure: a worker settles as lost (dead, or a newer
/// incarnation than the one that joined) or as alive (alive still
/// `waited_ms` after the job turned Restarting, past its TTL and
/// [`SETTLE_MARGIN_MS`]: a lease not renewed since the failure would have
/// expired; `registry` invariant 5); until each has, the restart waits.
pub fn settle(workers: &[AttemptWorker], waited_ms: u64) -> Settled {
    let mut s = Settled {
        done: true,
        lost: Vec::new(),
    };
    for w in workers {
        match w.alive {
            None => s.lost.push(w.worker.clone()),
            Some(inc) if w.joined.is_some_and(|j| inc > j) => s.lost.push(w.worker.clone()),
            Some(_) if waited_ms >= w.ttl_ms.saturating_add(SETTLE_MARGIN_MS) => {}
            Some(_) => s.done = false,
        }
    }
    s
}

/// The persisted state: every job, in submission order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SchedulerState {
    /// Live jobs, then up to [`KEEP_FINISHED`] ended ones.
    pub jobs: Vec<JobRecord>,
    /// Ids handed out so far (`NAME.N`).
    pub next_id: u64,
}

impl SchedulerState {
    /// Decodes the persisted form.
    pub fn decode(bytes: &[u8]) -> Result<SchedulerState> {
        postcard::from_bytes(bytes).map_err(CoordinatorError::decode("the scheduler state"))
    }

    /// The persisted form (postcard).
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("always encodes")
    }

    /// The job with id `id`.
    pub fn job(&self, id: &str) -> Option<&JobRecord> {
        self.jobs.iter().find(|j| j.id == id)
    }

    /// Queues a job (Pending) and returns its id; [`SchedulerState::advance`]
    /// fails it at once if [`check_request`] refuses it (invariant 10).
    pub fn submit(&mut self, job: &Submission, now: u64) -> String {
        self.next_id += 1;
        let id = format!("{}.{}", job.name, self.next_id);
        self.jobs.push(JobRecord {
            id: id.clone(),
            name: job.name.clone(),
            state: JobState::Pending,
            processes: job.processes,
            devices_per_process: job.devices_per_process,
            plugin: job.plugin.clone(),
            max_restarts: job.max_restarts,
            restarts: 0,
            suspensions: 0,
            attempt: 0,
            placement: Vec::new(),
            reason: None,
            submitted_unix_ms: now,
            updated_unix_ms: now,
            events: 0,
            state_since_unix_ms: now,
            placed_unix_ms: 0,
            trace: job.trace.clone(),
        });
        id
    }

    /// How many jobs are in each state, in [`JobState::ALL`]'s order.
    pub fn jobs_by_state(&self) -> [(JobState, usize); 7] {
        JobState::ALL.map(|st| (st, self.jobs.iter().filter(|j| j.state == st).count()))
    }

    /// Devices held by Scheduled and Running jobs.
    pub fn devices_in_use(&self) -> u32 {
        self.used().values().sum()
    }

    /// Devices in use per worker (Scheduled and Running jobs).
    fn used(&self) -> BTreeMap<String, u32> {
        let mut used = BTreeMap::new();
        for j in &self.jobs {
            if matches!(j.state, JobState::Scheduled | JobState::Running) {
                for w in &j.placement {
                    *used.entry(w.clone()).or_insert(0) += j.devices_per_process;
                }
            }
        }
        used
    }

    /// One pass of the state machine over every job, in submission order
    /// (earlier jobs are placed first). Returns the events to append.
    pub fn advance(
        &mut self,
        observed: &BTreeMap<String, Observed>,
        workers: &[WorkerCapacity],
        now: u64,
    ) -> Vec<(String, JobEvent)> {
        let mut events = Vec::new();
        for i in 0..self.jobs.len() {
            let none = Observed::default();
            let obs = observed.get(&self.jobs[i].id).unwrap_or(&none);
            let used = self.used();
            let job = &mut self.jobs[i];
            let from = job.state;
            // Invariant 11.
            if job.state == JobState::Restarting && job.updated_unix_ms > now {
                job.updated_unix_ms = now;
            }
            let next: Option<(JobState, Option<String>, Option<FailureKind>)> = match job.state {
                _ if job.state.is_terminal() => None,
                _ if obs.cancel_requested => {
                    Some((JobState::Cancelled, Some("cancelled".into()), None))
                }
                JobState::Pending => {
                    let checked = check_request(
                        &job.name,
                        job.processes,
                        job.devices_per_process,
                        &job.plugin,
                    );
                    match checked.map(|()| place(job, workers, &used)) {
                        // Invariant 10.
                        Err(why) => Some((JobState::Failed, Some(why), Some(FailureKind::Job))),
                        Ok(Ok(placement)) => {
                            job.placement = placement;
                            job.attempt += 1;
                            job.placed_unix_ms = now;
                            Some((JobState::Scheduled, None, None))
                        }
                        Ok(Err(why)) => {
                            if job.reason.as_deref() != Some(why.as_str()) {
                                job.reason = Some(why);
                                job.updated_unix_ms = now;
                            }
                            None
                        }
                    }
                }
                JobState::Scheduled | JobState::Running => match &obs.failure {
                    // Invariant 9: a planned move is not a failure.
                    Some(f) if f.kind.is_planned() => {
                        job.suspensions += 1;
                        Some((JobState::Restarting, Some(f.to_string()), Some(f.kind)))
                    }
                    Some(f) if f.kind.is_restartable() && job.restarts < job.max_restarts => {
                        job.restarts += 1;
                        Some((JobState::Restarting, Some(f.to_string()), Some(f.kind)))
                    }
                    Some(f) => Some((JobState::Failed, Some(f.to_string()), Some(f.kind))),
                    None if obs.finished == job.processes => {
                        Some((JobState::Succeeded, None, None))
                    }
                    None if job.state == JobState::Scheduled && obs.ready == job.processes => {
                        Some((JobState::Running, None, None))
                    }
                    None => None,
                },
                // Invariant 6: wait until the lost attempt's workers are
                // known alive or lost, so the new one avoids the lost.
                JobState::Restarting
                    if (obs.settled.done
                        || now >= job.updated_unix_ms.saturating_add(MAX_SETTLE_MS))
                        && now
                            >= job
                                .updated_unix_ms
                                .saturating_add(restart_backoff_ms(job.restarts)) =>
                {
                    let why = match obs.settled.lost.as_slice() {
                        [] if obs.settled.done => "no worker was lost".to_owned(),
                        [] => "its workers did not settle in time".to_owned(),
                        lost => format!(
                            "lost: {}",
                            lost.iter()
                                .map(|w| format!("worker `{w}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    };
                    Some((JobState::Pending, Some(why), None))
                }
                _ => None,
            };
            if let Some((to, reason, cause)) = next {
                job.state = to;
                job.reason = reason.clone();
                job.updated_unix_ms = now;
                let e = JobEvent {
                    seq: job.events,
                    unix_ms: now,
                    from,
                    to,
                    attempt: job.attempt,
                    reason,
                    cause,
                    since_unix_ms: job.state_since_unix_ms,
                };
                job.state_since_unix_ms = now;
                job.events += 1;
                events.push((job.id.clone(), e));
            }
        }
        // Keep the newest finished jobs only.
        let finished = self.jobs.iter().filter(|j| j.state.is_terminal()).count();
        if finished > KEEP_FINISHED {
            let mut drop = finished - KEEP_FINISHED;
            self.jobs.retain(|j| {
                if drop > 0 && j.state.is_terminal() {
                    drop -= 1;
                    false
                } else {
                    true
                }
            });
        }
        events
    }
}

/// The most devices one job may hold: the job spec's bound
/// (`tessel_topology::MAX_DEVICES`; a test in `tessel` keeps them equal).
pub const MAX_JOB_DEVICES: u64 = 1 << 20;

/// The rule for a job's name, the spec's and the scheduler's (invariant
/// 10): ids are `NAME.N` and attempts `NAME.N@A`, so a name is 1-64
/// letters, digits, `-` or `_`.
pub fn check_job_name(name: &str) -> std::result::Result<(), String> {
    let good = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if name.is_empty() || name.len() > 64 || !name.chars().all(good) {
        return Err(format!(
            "`{}`: 1-64 letters, digits, `-` or `_`",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// Invariant 10: what a job must be for the scheduler to place it, however
/// it was submitted: a name by [`check_job_name`], at least one process
/// and one device each, at most [`MAX_JOB_DEVICES`] in all, a plugin name
/// that can be a key.
pub fn check_request(
    name: &str,
    processes: u32,
    devices_per_process: u32,
    plugin: &str,
) -> std::result::Result<(), String> {
    check_job_name(name).map_err(|e| format!("invalid submission: the name {e}"))?;
    let devices = u64::from(processes) * u64::from(devices_per_process);
    if processes == 0 || devices_per_process == 0 || devices > MAX_JOB_DEVICES {
        return Err(format!(
            "invalid submission: {processes} processes × {devices_per_process} devices (1 to {MAX_JOB_DEVICES} devices in all)"
        ));
    }
    tessel_kv::check_path_component("plugin", plugin)
        .map_err(|e| format!("invalid submission: {e}"))
}

/// Invariant 2: one process per worker, on workers with the job's plugin
/// and enough free devices. A restart keeps each process on the worker
/// that ran it before when it can (its checkpoint blocks are there); the
/// rest go to the least used (then by id, for determinism).
pub fn place(
    job: &JobRecord,
    workers: &[WorkerCapacity],
    used: &BTreeMap<String, u32>,
) -> std::result::Result<Vec<String>, String> {
    let with_plugin: Vec<&WorkerCapacity> = workers
        .iter()
        .filter(|w| w.plugins.contains(&job.plugin))
        .collect();
    let mut fit: Vec<(u32, &str)> = with_plugin
        .iter()
        .filter_map(|w| {
            let u = used.get(&w.worker).copied().unwrap_or(0);
            (w.devices.saturating_sub(u) >= job.devices_per_process)
                .then_some((u, w.worker.as_str()))
        })
        .collect();
    if fit.len() < job.processes as usize {
        let mut plugins: Vec<&str> = workers
            .iter()
            .flat_map(|w| w.plugins.first().map(String::as_str))
            .collect();
        plugins.sort_unstable();
        plugins.dedup();
        return Err(format!(
            "waiting for {} workers with plugin `{}` and {} free devices each; {} of {} alive workers have them{}",
            job.processes,
            job.plugin,
            job.devices_per_process,
            fit.len(),
            workers.len(),
            if with_plugin.len() < workers.len() {
                format!(" (alive workers' plugins: {})", plugins.join(", "))
            } else {
                String::new()
            }
        ));
    }
    fit.sort();
    let mut placement: Vec<Option<String>> = job
        .placement
        .iter()
        .map(|w| fit.iter().any(|(_, f)| f == w).then(|| w.clone()))
        .collect();
    placement.resize(job.processes as usize, None);
    let kept: Vec<String> = placement.iter().flatten().cloned().collect();
    let mut rest = fit
        .iter()
        .map(|(_, w)| *w)
        .filter(|w| !kept.iter().any(|p| p == w));
    Ok(placement
        .into_iter()
        .map(|p| p.unwrap_or_else(|| rest.next().expect("enough fit workers").to_owned()))
        .collect())
}

#[cfg(test)]
mod tests;
