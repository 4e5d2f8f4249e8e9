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
//! 1. The whole scheduler state is one KV value (`sched/state`), replaced
//!    only by compare-and-swap from the bytes a pass read: passes of
//!    several coordinators (or of a deposed one) never interleave, so a
//!    device is never given to two jobs and no transition is lost. A job
//!    survives any coordinator's death with the KV.
//! 2. Gang scheduling: a job is placed all at once — one process per
//!    worker, on alive workers with `devices_per_process` free devices —
//!    or stays Pending with the reason visible.
//! 3. Attempt `a` of job `id` runs as instance `id@a` (its own KV
//!    namespace: topology, transfer ids, results); a restart is a new
//!    attempt, so nothing of the lost one is reused.
//! 4. Side effects (the instance's bundle, assignments, the `done` key,
//!    events) follow a committed state and are idempotent: a pass that
//!    dies after its commit is completed by the next one.
//! 5. Every transition appends one event (`sched/jobs/{id}/events/{seq}`,
//!    inserted, so it is written once), in the order of the transitions.
//! 6. A failure a restart may cure (a lost worker or peer) restarts the job
//!    while restarts remain; the job's own errors fail it. A Restarting job
//!    is placed again only once each worker of the failed attempt is known
//!    lost or alive ([`settle`]; at most [`MAX_SETTLE_MS`]), so the new
//!    attempt never lands on a worker whose lease has yet to expire.
//! 7. An attempt that ends leaves nothing for workers to run: its `done`
//!    key is written and its assignments and memberships are removed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessel_kv::{KvError, KvStore};

use crate::error::{CoordinatorError, Result};
use crate::jobs::{self, JobAssignment, JobFailure};
use crate::keys;
use crate::registry::{list_workers, WorkerState, WorkerStatus};

/// Finished jobs kept in the state for listing.
pub const KEEP_FINISHED: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Scheduled,
    Running,
    Restarting,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        JobState::Pending,
        JobState::Scheduled,
        JobState::Running,
        JobState::Restarting,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }

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
    pub id: String,
    pub name: String,
    pub state: JobState,
    pub processes: u32,
    pub devices_per_process: u32,
    /// The plugin the job asks for: a worker's plugin name or platform.
    pub plugin: String,
    pub max_restarts: u32,
    pub restarts: u32,
    /// The current (or last) attempt; 0 before the first placement.
    pub attempt: u32,
    /// The worker of each process of the current attempt.
    pub placement: Vec<String>,
    /// Why it waits, or why it failed.
    pub reason: Option<String>,
    pub submitted_unix_ms: u64,
    pub updated_unix_ms: u64,
    /// Events appended so far (the next event's sequence number).
    pub events: u64,
}

impl JobRecord {
    /// The KV namespace of the current attempt (invariant 3).
    pub fn instance(&self) -> String {
        instance(&self.id, self.attempt)
    }
}

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
    pub seq: u64,
    pub unix_ms: u64,
    pub from: JobState,
    pub to: JobState,
    pub attempt: u32,
    pub reason: Option<String>,
}

/// What the workers published about a job's current attempt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    pub cancel_requested: bool,
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
    pub worker: String,
    pub devices: u32,
    /// The names a job's `plugin` may give to run here: the plugin the
    /// worker was started with (a name or a path) and its platform.
    pub plugins: Vec<String>,
}

/// What a job asks of the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    pub name: String,
    pub processes: u32,
    pub devices_per_process: u32,
    pub plugin: String,
    pub max_restarts: u32,
}

/// How long a restart waits at most for the lost attempt's workers to
/// settle (invariant 6): past every worker's TTL, the lease of a worker
/// that stopped beating has expired.
pub const MAX_SETTLE_MS: u64 = 30_000;

/// The workers of a failed attempt, as a restart sees them (invariant 6).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// Every worker of the attempt is known alive (it beat after the
    /// failure) or known lost.
    pub done: bool,
    /// The attempt's workers that were lost: dead, or registered again.
    pub lost: Vec<String>,
}

/// A worker of a failed attempt as the registry shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptWorker {
    pub worker: String,
    /// The incarnation that joined the attempt, if it joined.
    pub joined: Option<u64>,
    /// `(incarnation, revision of its last heartbeat)` while alive.
    pub alive: Option<(u64, u64)>,
}

/// Invariant 6, pure: a worker settles as lost (dead, or a newer
/// incarnation than the one that joined) or as alive (a heartbeat at a
/// revision after the failure's); until each has, the restart waits.
pub fn settle(workers: &[AttemptWorker], failure_revision: u64) -> Settled {
    let mut s = Settled {
        done: true,
        lost: Vec::new(),
    };
    for w in workers {
        match w.alive {
            None => s.lost.push(w.worker.clone()),
            Some((inc, _)) if w.joined.is_some_and(|j| inc > j) => s.lost.push(w.worker.clone()),
            Some((_, rev)) if rev > failure_revision => {}
            Some(_) => s.done = false,
        }
    }
    s
}

/// The persisted state: every job, in submission order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SchedulerState {
    pub jobs: Vec<JobRecord>,
    /// Ids handed out so far (`NAME.N`).
    pub next_id: u64,
}

impl SchedulerState {
    pub fn decode(bytes: &[u8]) -> Result<SchedulerState> {
        postcard::from_bytes(bytes).map_err(CoordinatorError::decode("the scheduler state"))
    }

    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("always encodes")
    }

    pub fn job(&self, id: &str) -> Option<&JobRecord> {
        self.jobs.iter().find(|j| j.id == id)
    }

    /// Queues a job (Pending) and returns its id.
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
            attempt: 0,
            placement: Vec::new(),
            reason: None,
            submitted_unix_ms: now,
            updated_unix_ms: now,
            events: 0,
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
            let next: Option<(JobState, Option<String>)> = match job.state {
                _ if job.state.is_terminal() => None,
                _ if obs.cancel_requested => Some((JobState::Cancelled, Some("cancelled".into()))),
                JobState::Pending => match place(job, workers, &used) {
                    Ok(placement) => {
                        job.placement = placement;
                        job.attempt += 1;
                        Some((JobState::Scheduled, None))
                    }
                    Err(why) => {
                        if job.reason.as_deref() != Some(why.as_str()) {
                            job.reason = Some(why);
                            job.updated_unix_ms = now;
                        }
                        None
                    }
                },
                JobState::Scheduled | JobState::Running => match &obs.failure {
                    Some(f) if f.kind.is_restartable() && job.restarts < job.max_restarts => {
                        job.restarts += 1;
                        Some((JobState::Restarting, Some(f.to_string())))
                    }
                    Some(f) => Some((JobState::Failed, Some(f.to_string()))),
                    None if obs.finished == job.processes => Some((JobState::Succeeded, None)),
                    None if job.state == JobState::Scheduled && obs.ready == job.processes => {
                        Some((JobState::Running, None))
                    }
                    None => None,
                },
                // Invariant 6: wait until the lost attempt's workers are
                // known alive or lost, so the new one avoids the lost.
                JobState::Restarting
                    if obs.settled.done
                        || now >= job.updated_unix_ms.saturating_add(MAX_SETTLE_MS) =>
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
                    Some((JobState::Pending, Some(why)))
                }
                _ => None,
            };
            if let Some((to, reason)) = next {
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
                };
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

/// Queues a job: stores its bundle and adds it to the state (invariant 1).
pub async fn submit(kv: &dyn KvStore, job: &Submission, bundle: &[u8]) -> Result<String> {
    loop {
        let (old, mut state) = read_state(kv).await?;
        let id = state.submit(job, keys::unix_ms());
        // The bundle first: a job in the state always has one.
        kv.put(keys::sched_bundle(&id).as_bytes(), bundle)
            .await
            .map_err(CoordinatorError::kv("storing the job's bundle"))?;
        if commit(kv, old.as_deref(), &state).await? {
            return Ok(id);
        }
        let _ = kv.delete(keys::sched_bundle(&id).as_bytes()).await;
    }
}

/// Asks the scheduler to cancel a job; refused for a job that ended.
pub async fn cancel(kv: &dyn KvStore, id: &str) -> Result<()> {
    keys::check_id("job id", id)?;
    let (_, state) = read_state(kv).await?;
    match state.job(id) {
        None => {
            return Err(CoordinatorError::Invalid {
                what: "job id".into(),
                reason: format!("no job `{id}`"),
            })
        }
        Some(j) if j.state.is_terminal() => {
            return Err(CoordinatorError::Invalid {
                what: "cancellation".into(),
                reason: format!("job `{id}` already ended ({})", j.state),
            })
        }
        Some(_) => {}
    }
    kv.put(keys::sched_cancel(id).as_bytes(), b"cancel")
        .await
        .map_err(CoordinatorError::kv("requesting cancellation"))?;
    Ok(())
}

/// The state and the bytes it was read from (`None`: no state yet).
pub async fn read_state(kv: &dyn KvStore) -> Result<(Option<Vec<u8>>, SchedulerState)> {
    match kv.try_get(keys::SCHED_STATE.as_bytes()).await {
        Ok(bytes) => {
            let s = SchedulerState::decode(&bytes)?;
            Ok((Some(bytes), s))
        }
        Err(KvError::NotFound(_)) => Ok((None, SchedulerState::default())),
        Err(e) => Err(CoordinatorError::kv("reading the scheduler state")(e)),
    }
}

/// Compare-and-swap of the state; false when another pass won. A mismatch
/// that finds exactly `new` is this call's own write: the client retried it
/// after its first try was applied but not answered (a replica died;
/// kvstore's client invariant 2).
async fn commit(kv: &dyn KvStore, old: Option<&[u8]>, new: &SchedulerState) -> Result<bool> {
    let new = new.encode();
    match kv
        .compare_and_swap(keys::SCHED_STATE.as_bytes(), old, &new)
        .await
        .map_err(CoordinatorError::kv("writing the scheduler state"))?
    {
        tessel_kv::CasOutcome::Swapped { .. } => Ok(true),
        tessel_kv::CasOutcome::Mismatch { current } => Ok(current.as_deref() == Some(&new[..])),
    }
}

/// What the workers published about `job`'s current attempt.
async fn observe(kv: &dyn KvStore, job: &JobRecord, registry: &[WorkerStatus]) -> Result<Observed> {
    let mut o = Observed {
        cancel_requested: kv
            .try_get(keys::sched_cancel(&job.id).as_bytes())
            .await
            .is_ok(),
        ..Observed::default()
    };
    if job.state == JobState::Restarting {
        o.settled = observe_settled(kv, job, registry).await?;
    }
    if matches!(job.state, JobState::Scheduled | JobState::Running) {
        let inst = job.instance();
        o.failure = jobs::failure_of(kv, &inst).await?;
        for kv_pair in kv
            .list(keys::process_topologies(&inst).as_bytes())
            .await
            .map_err(CoordinatorError::kv("listing the job's processes"))?
        {
            if kv_pair.key.ends_with(b"/transfer_ready") {
                o.ready += 1;
            } else if kv_pair.key.ends_with(b"/result") {
                o.finished += 1;
            }
        }
    }
    Ok(o)
}

/// Invariant 6's inputs for a Restarting job: the failure's revision and
/// how each worker of the failed attempt stands now.
async fn observe_settled(
    kv: &dyn KvStore,
    job: &JobRecord,
    registry: &[WorkerStatus],
) -> Result<Settled> {
    let inst = job.instance();
    let Some((_, failure_revision)) = jobs::failure_with_revision(kv, &inst).await? else {
        // Cancelled or ended without a failure record: nothing to wait for.
        return Ok(Settled {
            done: true,
            lost: Vec::new(),
        });
    };
    let joined: BTreeMap<String, u64> = jobs::members(kv, &inst).await?.into_iter().collect();
    let workers: Vec<AttemptWorker> = job
        .placement
        .iter()
        .map(|w| AttemptWorker {
            worker: w.clone(),
            joined: joined.get(w).copied(),
            alive: registry
                .iter()
                .find(|s| &s.record.info.worker_id == w)
                .and_then(|s| match s.state {
                    WorkerState::Alive { incarnation, .. } => Some((incarnation, s.alive_revision)),
                    WorkerState::Dead => None,
                }),
        })
        .collect();
    Ok(settle(&workers, failure_revision))
}

fn capacity(registry: &[WorkerStatus]) -> Vec<WorkerCapacity> {
    registry
        .iter()
        .filter(|w| matches!(w.state, WorkerState::Alive { .. }))
        .map(|w| {
            let info = &w.record.info;
            let mut plugins = vec![info.plugin.clone()];
            if info.platform != info.plugin {
                plugins.push(info.platform.clone());
            }
            WorkerCapacity {
                devices: info.devices.iter().map(|d| d.count).sum(),
                worker: info.worker_id.clone(),
                plugins,
            }
        })
        .collect()
}

/// Invariant 4: what a committed state asks for, idempotently.
async fn carry_out(
    kv: &dyn KvStore,
    state: &SchedulerState,
    events: &[(String, JobEvent)],
    topology_timeout: Duration,
) -> Result<()> {
    for (id, e) in events {
        let bytes = postcard::to_allocvec(e).expect("always encodes");
        match kv
            .insert(keys::sched_event(id, e.seq).as_bytes(), &bytes)
            .await
        {
            Ok(_) | Err(KvError::AlreadyExists(_)) => {}
            Err(e) => return Err(CoordinatorError::kv("appending a job event")(e)),
        }
        tracing::info!(job = %id, from = %e.from, to = %e.to, attempt = e.attempt, reason = ?e.reason, "job state");
        if matches!(
            e.to,
            JobState::Restarting | JobState::Failed | JobState::Cancelled | JobState::Succeeded
        ) && e.attempt > 0
        {
            // Invariant 7. The placement is still the ended attempt's: a
            // new one is chosen in a later pass.
            let inst = instance(id, e.attempt);
            jobs::finish_job(kv, &inst).await?;
            if let Some(job) = state.job(id) {
                for w in &job.placement {
                    jobs::unassign(kv, w, &inst).await?;
                }
            }
        }
    }
    for job in &state.jobs {
        if job.state != JobState::Scheduled {
            continue;
        }
        // A Scheduled job had no failure when this pass observed it (else
        // `advance` moved it on), so its attempt still needs its processes.
        let inst = job.instance();
        let spec_key = keys::job_spec(&inst);
        if let Err(KvError::NotFound(_)) = kv.try_get(spec_key.as_bytes()).await {
            let bundle = kv
                .try_get(keys::sched_bundle(&job.id).as_bytes())
                .await
                .map_err(CoordinatorError::kv("reading the job's bundle"))?;
            kv.put(spec_key.as_bytes(), &bundle)
                .await
                .map_err(CoordinatorError::kv("placing the job's bundle"))?;
        }
        for (i, w) in job.placement.iter().enumerate() {
            if kv
                .try_get(keys::assignment(w, &inst).as_bytes())
                .await
                .is_ok()
            {
                continue;
            }
            jobs::assign(
                kv,
                w,
                &JobAssignment {
                    job: inst.clone(),
                    process_index: i as u32,
                    num_processes: job.processes,
                    topology_timeout_ms: topology_timeout.as_millis() as u64,
                },
            )
            .await?;
        }
    }
    Ok(())
}

/// One pass: observe, advance, commit, carry out.
pub async fn pass(kv: &dyn KvStore, topology_timeout: Duration) -> Result<()> {
    let started = std::time::Instant::now();
    let (old, mut state) = read_state(kv).await?;
    let registry = list_workers(kv).await?;
    let mut observed = BTreeMap::new();
    for job in state.jobs.iter().filter(|j| !j.state.is_terminal()) {
        observed.insert(job.id.clone(), observe(kv, job, &registry).await?);
    }
    let workers = capacity(&registry);
    let before = state.clone();
    let events = state.advance(&observed, &workers, keys::unix_ms());
    if state != before && !commit(kv, old.as_deref(), &state).await? {
        // Another pass won; the next one starts over.
        metrics::counter!("tessel_scheduler_passes_total", "outcome" => "superseded").increment(1);
        return Ok(());
    }
    record(&state, &workers, &events, state != before, started);
    carry_out(kv, &state, &events, topology_timeout).await
}

/// The metrics of a pass whose state is the committed one: the gauges
/// of what it saw, and (`committed`: this pass made the change) each
/// transition once, as it was committed once.
fn record(
    state: &SchedulerState,
    workers: &[WorkerCapacity],
    events: &[(String, JobEvent)],
    committed: bool,
    started: std::time::Instant,
) {
    for (st, n) in state.jobs_by_state() {
        metrics::gauge!("tessel_scheduler_jobs", "state" => st.name()).set(n as f64);
    }
    let alive: u32 = workers.iter().map(|w| w.devices).sum();
    metrics::gauge!("tessel_scheduler_workers_alive").set(workers.len() as f64);
    metrics::gauge!("tessel_scheduler_devices", "kind" => "alive").set(f64::from(alive));
    metrics::gauge!("tessel_scheduler_devices", "kind" => "in_use")
        .set(f64::from(state.devices_in_use()));
    for (id, e) in events {
        metrics::counter!("tessel_scheduler_transitions_total", "to" => e.to.name()).increment(1);
        // From submission to the first placement: the queueing time.
        if e.to == JobState::Scheduled && e.attempt == 1 {
            if let Some(job) = state.job(id) {
                let waited = e.unix_ms.saturating_sub(job.submitted_unix_ms);
                metrics::histogram!("tessel_scheduler_queue_seconds")
                    .record(waited as f64 / 1000.0);
            }
        }
    }
    let outcome = if committed { "committed" } else { "unchanged" };
    metrics::counter!("tessel_scheduler_passes_total", "outcome" => outcome).increment(1);
    metrics::histogram!("tessel_scheduler_pass_seconds").record(started.elapsed().as_secs_f64());
}

/// Runs passes every `interval` until the task is dropped; errors are
/// logged and retried (the state is in the KV, nothing is lost).
pub async fn run(kv: Arc<dyn KvStore>, interval: Duration, topology_timeout: Duration) {
    loop {
        if let Err(e) = pass(&*kv, topology_timeout).await {
            metrics::counter!("tessel_scheduler_passes_total", "outcome" => "failed").increment(1);
            tracing::warn!(error = %e, "scheduler pass failed");
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FaultyKv;

    /// A submit whose state write the client retried after it was applied
    /// keeps its one job and that job's bundle.
    #[tokio::test]
    async fn a_submit_retried_after_it_landed_keeps_its_job_and_bundle() {
        let kv = FaultyKv {
            retry_next_cas: true.into(),
            ..FaultyKv::new()
        };
        let id = submit(&kv, &sub("j", 1, 0), b"bundle").await.unwrap();
        let (_, state) = read_state(&kv).await.unwrap();
        assert_eq!(state.jobs.len(), 1);
        assert!(state.job(&id).is_some());
        assert_eq!(
            kv.try_get(keys::sched_bundle(&id).as_bytes())
                .await
                .unwrap(),
            b"bundle"
        );
    }

    fn workers(n: u32, devices: u32) -> Vec<WorkerCapacity> {
        (0..n)
            .map(|i| WorkerCapacity {
                worker: format!("w{i}"),
                devices,
                plugins: vec!["cpu".into()],
            })
            .collect()
    }

    /// A job of `processes` one-device processes on the `cpu` plugin.
    fn sub(name: &str, processes: u32, max_restarts: u32) -> Submission {
        Submission {
            name: name.into(),
            processes,
            devices_per_process: 1,
            plugin: "cpu".into(),
            max_restarts,
        }
    }

    /// Every worker of the failed attempt known alive or lost.
    fn settled(lost: &[&str]) -> Observed {
        Observed {
            settled: Settled {
                done: true,
                lost: lost.iter().map(|w| w.to_string()).collect(),
            },
            ..Default::default()
        }
    }

    fn obs(id: &str, o: Observed) -> BTreeMap<String, Observed> {
        [(id.to_owned(), o)].into_iter().collect()
    }

    fn lost(worker: &str) -> JobFailure {
        JobFailure {
            worker: Some(worker.into()),
            incarnation: Some(1),
            kind: crate::jobs::FailureKind::WorkerLost,
            reason: crate::monitor::LOST_LEASE.into(),
            unix_ms: 0,
        }
    }

    #[test]
    fn instances_name_their_job() {
        assert_eq!(job_of_instance(&instance("mlp.3", 2)), "mlp.3");
        assert_eq!(job_of_instance("direct"), "direct");
    }

    #[test]
    fn a_job_runs_through_to_success() {
        let mut s = SchedulerState::default();
        let id = s.submit(&sub("mlp", 2, 0), 0);
        assert_eq!(id, "mlp.1");
        let w = workers(2, 1);
        let e = s.advance(&BTreeMap::new(), &w, 1);
        assert_eq!(e[0].1.to, JobState::Scheduled);
        assert_eq!(s.jobs[0].placement, vec!["w0", "w1"]);
        assert_eq!(s.jobs[0].instance(), "mlp.1@1");
        let e = s.advance(
            &obs(
                &id,
                Observed {
                    ready: 2,
                    ..Default::default()
                },
            ),
            &w,
            2,
        );
        assert_eq!(e[0].1.to, JobState::Running);
        assert!(s
            .advance(
                &obs(
                    &id,
                    Observed {
                        ready: 2,
                        finished: 1,
                        ..Default::default()
                    }
                ),
                &w,
                3
            )
            .is_empty());
        let e = s.advance(
            &obs(
                &id,
                Observed {
                    ready: 2,
                    finished: 2,
                    ..Default::default()
                },
            ),
            &w,
            4,
        );
        assert_eq!(
            (e[0].1.from, e[0].1.to, e[0].1.seq),
            (JobState::Running, JobState::Succeeded, 2)
        );
    }

    #[test]
    fn gang_scheduling_is_all_or_nothing_and_waits_with_a_reason() {
        let mut s = SchedulerState::default();
        let big = s.submit(&sub("big", 3, 0), 0);
        let small = s.submit(&sub("small", 2, 0), 0);
        let e = s.advance(&BTreeMap::new(), &workers(2, 1), 1);
        // big cannot fit, small can: placed, big waits with its reason.
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].0, small);
        let b = s.job(&big).unwrap();
        assert_eq!(b.state, JobState::Pending);
        assert!(
            b.reason
                .as_deref()
                .unwrap()
                .contains("waiting for 3 workers"),
            "{:?}",
            b.reason
        );
        // Devices in use are not given twice.
        let third = s.submit(&sub("third", 1, 0), 2);
        s.advance(&BTreeMap::new(), &workers(2, 1), 3);
        assert_eq!(s.job(&third).unwrap().state, JobState::Pending);
        // Two devices per worker: room for both.
        s.advance(&BTreeMap::new(), &workers(2, 2), 4);
        assert_eq!(s.job(&third).unwrap().state, JobState::Scheduled);
    }

    #[test]
    fn a_lost_worker_restarts_while_restarts_remain_then_fails() {
        let mut s = SchedulerState::default();
        let id = s.submit(&sub("mlp", 2, 1), 0);
        let w = workers(3, 1);
        s.advance(&BTreeMap::new(), &w, 1);
        let failed = Observed {
            failure: Some(lost("w1")),
            ..Default::default()
        };
        let e = s.advance(&obs(&id, failed.clone()), &w, 2);
        assert_eq!(e[0].1.to, JobState::Restarting);
        let e = s.advance(&obs(&id, settled(&["w1"])), &w, 3);
        assert_eq!(e[0].1.to, JobState::Pending);
        assert_eq!(e[0].1.reason.as_deref(), Some("lost: worker `w1`"));
        let e = s.advance(&BTreeMap::new(), &w, 4);
        assert_eq!(e[0].1.to, JobState::Scheduled);
        assert_eq!(s.jobs[0].attempt, 2);
        assert_eq!(s.jobs[0].instance(), "mlp.1@2");
        // No restarts left: the next loss fails it.
        let e = s.advance(&obs(&id, failed), &w, 5);
        assert_eq!(e[0].1.to, JobState::Failed);
        // An error of the job itself never restarts.
        let mut s = SchedulerState::default();
        let id = s.submit(&sub("bad", 1, 5), 0);
        s.advance(&BTreeMap::new(), &w, 1);
        let compile = JobFailure {
            kind: crate::jobs::FailureKind::Job,
            reason: "program `p`: type mismatch".into(),
            ..lost("w0")
        };
        let e = s.advance(
            &obs(
                &id,
                Observed {
                    failure: Some(compile),
                    ..Default::default()
                },
            ),
            &w,
            2,
        );
        assert_eq!(e[0].1.to, JobState::Failed);
    }

    #[test]
    fn cancel_ends_any_live_state_and_frees_devices() {
        let mut s = SchedulerState::default();
        let a = s.submit(&sub("a", 2, 0), 0);
        let b = s.submit(&sub("b", 2, 0), 0);
        let w = workers(2, 1);
        s.advance(&BTreeMap::new(), &w, 1);
        assert_eq!(s.job(&b).unwrap().state, JobState::Pending);
        let count = |s: &SchedulerState, st: JobState| {
            s.jobs_by_state()
                .into_iter()
                .find(|(x, _)| *x == st)
                .unwrap()
                .1
        };
        assert_eq!(count(&s, JobState::Scheduled), 1);
        assert_eq!(count(&s, JobState::Pending), 1);
        assert_eq!(s.devices_in_use(), 2);
        let e = s.advance(
            &obs(
                &a,
                Observed {
                    cancel_requested: true,
                    ..Default::default()
                },
            ),
            &w,
            2,
        );
        assert_eq!(e[0].1.to, JobState::Cancelled);
        // b is placed on the devices a held, in the same or the next pass.
        s.advance(&BTreeMap::new(), &w, 3);
        assert_eq!(s.job(&b).unwrap().state, JobState::Scheduled);
        assert_eq!(count(&s, JobState::Cancelled), 1);
        assert_eq!(count(&s, JobState::Pending), 0);
        assert_eq!(s.devices_in_use(), 2, "b holds what a held");
        assert!(SchedulerState::decode(&s.encode()).unwrap() == s);
    }

    /// Scheduler invariant 6: a transfer error that a surviving process
    /// reports first (the peer's lease has not expired yet) restarts the
    /// job rather than failing it, and the restart waits until the lost
    /// worker is known lost, so it is not placed on it again.
    #[test]
    fn a_peer_lost_first_restarts_after_the_workers_settle() {
        let mut s = SchedulerState::default();
        let id = s.submit(&sub("mlp", 2, 3), 0);
        let w = workers(2, 1);
        s.advance(&BTreeMap::new(), &w, 1);
        let transport = JobFailure {
            worker: Some("w0".into()),
            incarnation: Some(1),
            kind: crate::jobs::FailureKind::PeerLost,
            reason: "all-reduce of `g`: transfer with 10.77.0.5:41596: connection lost".into(),
            unix_ms: 2,
        };
        let e = s.advance(
            &obs(
                &id,
                Observed {
                    failure: Some(transport),
                    ..Default::default()
                },
            ),
            &w,
            2,
        );
        assert_eq!(e[0].1.to, JobState::Restarting);
        // w1 still holds its lease: not settled, so the job waits.
        let waiting = Observed::default();
        assert!(s.advance(&obs(&id, waiting.clone()), &w, 3).is_empty());
        assert_eq!(s.jobs[0].state, JobState::Restarting);
        // w1 is declared lost; only w0 is alive now: Pending, waiting for
        // a second worker rather than placed on the lost one.
        let e = s.advance(&obs(&id, settled(&["w1"])), &w[..1], 4);
        assert_eq!(e[0].1.to, JobState::Pending);
        assert!(s.advance(&BTreeMap::new(), &w[..1], 5).is_empty());
        assert_eq!(s.jobs[0].state, JobState::Pending);
        // Past the settle bound, a job whose workers never settled moves on.
        let mut s2 = SchedulerState::default();
        let id2 = s2.submit(&sub("x", 1, 1), 0);
        s2.advance(&BTreeMap::new(), &w, 1);
        s2.advance(
            &obs(
                &id2,
                Observed {
                    failure: Some(lost("w0")),
                    ..Default::default()
                },
            ),
            &w,
            2,
        );
        assert!(s2.advance(&obs(&id2, waiting.clone()), &w, 3).is_empty());
        let e = s2.advance(&obs(&id2, waiting), &w, 2 + MAX_SETTLE_MS);
        assert_eq!(e[0].1.to, JobState::Pending);
    }

    #[test]
    fn settling_tells_lost_workers_from_live_ones() {
        let w = |name: &str, joined, alive| AttemptWorker {
            worker: name.into(),
            joined,
            alive,
        };
        // Dead, restarted (a newer incarnation), beat after the failure.
        let s = settle(
            &[
                w("dead", Some(1), None),
                w("restarted", Some(1), Some((2, 5))),
                w("alive", Some(3), Some((3, 11))),
            ],
            10,
        );
        assert_eq!(
            s,
            Settled {
                done: true,
                lost: vec!["dead".into(), "restarted".into()]
            }
        );
        // Alive but silent since the failure: not settled yet.
        let s = settle(&[w("quiet", Some(1), Some((1, 9)))], 10);
        assert!(!s.done);
        // Never joined (lost before joining) and alive since: alive.
        assert!(settle(&[w("late", None, Some((4, 12)))], 10).done);
    }

    /// A restart keeps each process on its previous worker where it can
    /// (its checkpoint blocks are there), and a job only goes to workers
    /// whose plugin it names, or waits saying which plugins exist.
    #[test]
    fn placement_keeps_processes_where_they_ran_and_respects_the_plugin() {
        let mut job = SchedulerState::default();
        job.submit(&sub("j", 3, 0), 0);
        let mut j = job.jobs.remove(0);
        let ws = workers(5, 1);
        j.placement = vec!["w3".into(), "w9".into(), "w1".into()];
        let p = place(&j, &ws, &BTreeMap::new()).unwrap();
        assert_eq!(
            p,
            vec!["w3", "w0", "w1"],
            "w9 is gone; w0 is the least used"
        );
        j.plugin = "cuda".into();
        let why = place(&j, &ws, &BTreeMap::new()).unwrap_err();
        assert!(why.contains("plugin `cuda`"), "{why}");
        assert!(why.contains("alive workers' plugins: cpu"), "{why}");
        let mut gpu = workers(3, 1);
        for g in &mut gpu {
            g.plugins = vec!["/opt/cuda_plugin.so".into(), "cuda".into()];
        }
        assert!(place(&j, &gpu, &BTreeMap::new()).is_ok(), "by platform");
    }
}
