//! The I/O around the state machine: read what the workers published,
//! advance, commit by compare-and-swap, carry out (invariants 1, 4-7).

use super::*;

/// Queues a job: stores its bundle and adds it to the state (invariant 1).
/// Refused at once if [`check_request`] would fail it (invariant 10).
pub async fn submit(kv: &dyn KvStore, job: &Submission, bundle: &[u8]) -> Result<String> {
    let checked = check_request(
        &job.name,
        job.processes,
        job.devices_per_process,
        &job.plugin,
    );
    checked.map_err(|reason| CoordinatorError::Invalid {
        what: "submission".into(),
        reason,
    })?;
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
/// kv-service's client invariant 2), or another coordinator's pass that
/// read the same state in the same millisecond and so wrote the same
/// bytes: both go on to carry it out, which invariant 4 allows.
pub(super) async fn commit(
    kv: &dyn KvStore,
    old: Option<&[u8]>,
    new: &SchedulerState,
) -> Result<bool> {
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

/// The registry by worker id, built once a pass: with 16,384 workers a
/// search of the list for each worker of an attempt was 2^28 comparisons.
type ById<'a> = std::collections::HashMap<&'a str, &'a WorkerStatus>;

/// What the workers published about `job`'s current attempt.
async fn observe(kv: &dyn KvStore, job: &JobRecord, registry: &ById<'_>) -> Result<Observed> {
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
        if o.failure.is_none() && job.state == JobState::Scheduled {
            o.failure = fail_lost_before_joining(kv, job, &inst, registry).await?;
        }
        let published = crate::attempt::published(kv, &inst).await?;
        o.ready = published.count(crate::attempt::Record::TransferReady);
        o.finished = published.count(crate::attempt::Record::Result);
    }
    Ok(o)
}

/// Invariant 12: the failure of a Scheduled attempt one of whose placed
/// workers is dead and never joined it, recorded as the monitor records a
/// joined one's (`monitor` invariant 1), if there is such a worker. No
/// read unless the registry shows a placed worker dead.
async fn fail_lost_before_joining(
    kv: &dyn KvStore,
    job: &JobRecord,
    inst: &str,
    registry: &ById<'_>,
) -> Result<Option<JobFailure>> {
    let alive = |w: &str| {
        registry
            .get(w)
            .is_some_and(|s| matches!(s.state, WorkerState::Alive { .. }))
    };
    let dead: Vec<&String> = job.placement.iter().filter(|w| !alive(w)).collect();
    if dead.is_empty() {
        return Ok(None);
    }
    let joined: BTreeSet<String> = jobs::members(kv, inst)
        .await?
        .into_iter()
        .map(|(w, _)| w)
        .collect();
    let Some(worker) = dead.into_iter().find(|w| !joined.contains(*w)) else {
        // Each joined before it died: the monitor's to record.
        return Ok(None);
    };
    let failure = JobFailure {
        worker: Some(worker.clone()),
        incarnation: None,
        kind: FailureKind::WorkerLost,
        reason: LOST_BEFORE_JOINING.into(),
        unix_ms: keys::unix_ms(),
    };
    Ok(Some(jobs::fail_job(kv, inst, &failure).await?))
}

/// The reason a failure of invariant 12 gives.
pub const LOST_BEFORE_JOINING: &str = "lost before it joined the attempt";

/// Invariant 6's inputs for a Restarting job: how each worker of the
/// failed attempt stands now, and how long ago the job turned Restarting.
async fn observe_settled(
    kv: &dyn KvStore,
    job: &JobRecord,
    registry: &ById<'_>,
) -> Result<Settled> {
    let inst = job.instance();
    if jobs::failure_of(kv, &inst).await?.is_none() {
        // Cancelled or ended without a failure record: nothing to wait for.
        return Ok(Settled {
            done: true,
            lost: Vec::new(),
        });
    }
    let joined: BTreeMap<String, u64> = jobs::members(kv, &inst).await?.into_iter().collect();
    let workers: Vec<AttemptWorker> = job
        .placement
        .iter()
        .map(|w| {
            let status = registry.get(w.as_str());
            AttemptWorker {
                worker: w.clone(),
                joined: joined.get(w).copied(),
                alive: status.and_then(|s| match s.state {
                    WorkerState::Alive { incarnation, .. } => Some(incarnation),
                    WorkerState::Dead => None,
                }),
                ttl_ms: status.map_or(0, |s| s.record.info.ttl_ms),
            }
        })
        .collect();
    let waited_ms = keys::unix_ms().saturating_sub(job.updated_unix_ms);
    Ok(settle(&workers, waited_ms))
}

fn capacity(registry: &[WorkerStatus]) -> Vec<WorkerCapacity> {
    registry
        .iter()
        .filter(|w| matches!(w.state, WorkerState::Alive { .. }) && w.drained.is_none())
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

/// Invariant 4: what a committed state asks for, idempotently. Returns
/// how many of `events` this call appended (invariant 5: the others were
/// appended by a pass that committed the same state). Events not carried
/// out whole are left in `unfinished`.
pub(super) async fn carry_out(
    kv: &dyn KvStore,
    state: &SchedulerState,
    events: &[(String, JobEvent)],
    topology_timeout: Duration,
    unfinished: &mut Option<Unfinished>,
) -> Result<usize> {
    let appended = append_or_keep(kv, state, events, unfinished).await?;
    place(kv, state, topology_timeout).await?;
    Ok(appended)
}

/// The transitions of a committed state whose events and ended attempts'
/// cleanup failed part-way (invariant 4): no later pass derives them again
/// (the state has moved on), so this process's next pass carries them out
/// first.
pub(super) struct Unfinished {
    state: SchedulerState,
    events: Vec<(String, JobEvent)>,
}

/// Carries out what `unfinished` holds, if anything; on failure keeps
/// what is left.
async fn finish(kv: &dyn KvStore, unfinished: &mut Option<Unfinished>) -> Result<()> {
    match unfinished.take() {
        Some(u) => append_or_keep(kv, &u.state, &u.events, unfinished)
            .await
            .map(drop),
        None => Ok(()),
    }
}

/// [`append`], leaving in `unfinished` the events not carried out whole.
async fn append_or_keep(
    kv: &dyn KvStore,
    state: &SchedulerState,
    events: &[(String, JobEvent)],
    unfinished: &mut Option<Unfinished>,
) -> Result<usize> {
    append(kv, state, events).await.map_err(|(done, e)| {
        *unfinished = Some(Unfinished {
            state: state.clone(),
            events: events[done..].to_vec(),
        });
        e
    })
}

/// Each event appended, then its ended attempt's cleanup (invariant 7).
/// Returns how many this call appended; on failure, how many events were
/// carried out whole before it.
async fn append(
    kv: &dyn KvStore,
    state: &SchedulerState,
    events: &[(String, JobEvent)],
) -> std::result::Result<usize, (usize, CoordinatorError)> {
    let mut appended = 0;
    for (done, (id, e)) in events.iter().enumerate() {
        let bytes = postcard::to_allocvec(e).expect("always encodes");
        match kv
            .insert(keys::sched_event(id, e.seq).as_bytes(), &bytes)
            .await
        {
            Ok(_) => {
                appended += 1;
                announce(state, id, e);
            }
            Err(KvError::AlreadyExists(_)) => {}
            Err(err) => return Err((done, CoordinatorError::kv("appending a job event")(err))),
        }
        if matches!(
            e.to,
            JobState::Restarting | JobState::Failed | JobState::Cancelled | JobState::Succeeded
        ) && e.attempt > 0
        {
            // Invariant 7. The placement is still the ended attempt's: a
            // new one is chosen in a later pass.
            let inst = instance(id, e.attempt);
            jobs::finish_job(kv, &inst)
                .await
                .map_err(|err| (done, err))?;
            if let Some(job) = state.job(id) {
                for w in &job.placement {
                    jobs::unassign(kv, w, &inst)
                        .await
                        .map_err(|err| (done, err))?;
                }
            }
        }
    }
    Ok(appended)
}

/// The assignments of every Scheduled job's attempt, derived from the
/// state at every pass.
async fn place(kv: &dyn KvStore, state: &SchedulerState, topology_timeout: Duration) -> Result<()> {
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
                    attempt: inst.clone(),
                    process_index: i as u32,
                    num_processes: job.processes,
                    topology_timeout_ms: topology_timeout.as_millis() as u64,
                    trace: job.trace.clone(),
                },
            )
            .await?;
        }
    }
    Ok(())
}

/// Invariant 5: an event's log line, metrics and spans, from the pass
/// that appended it only. Two coordinators' passes that read the same
/// state in the same millisecond commit the same bytes, and both carry it
/// out (see [`commit`]); only one of them appends each event.
fn announce(state: &SchedulerState, id: &str, e: &JobEvent) {
    tracing::info!(job = %id, from = %e.from, to = %e.to, attempt = e.attempt, reason = ?e.reason, "job state");
    metrics::counter!("tessel_scheduler_transitions_total", "to" => e.to.name()).increment(1);
    let Some(job) = state.job(id) else { return };
    // From submission to the first placement: the queueing time.
    if e.to == JobState::Scheduled && e.attempt == 1 {
        let waited = e.unix_ms.saturating_sub(job.submitted_unix_ms);
        metrics::histogram!("tessel_scheduler_queue_seconds").record(waited as f64 / 1000.0);
    }
    spans::record(job, e);
}

/// One pass: observe, advance, commit, carry out.
pub async fn pass(kv: &dyn KvStore, topology_timeout: Duration) -> Result<()> {
    pass_in(kv, None, topology_timeout, &mut None).await
}

/// A pass that reads the registry from `view` where given (it lists it
/// otherwise).
pub(super) async fn pass_in(
    kv: &dyn KvStore,
    view: Option<&mut RegistryView>,
    topology_timeout: Duration,
    unfinished: &mut Option<Unfinished>,
) -> Result<()> {
    finish(kv, unfinished).await?;
    let started = std::time::Instant::now();
    let (old, mut state) = read_state(kv).await?;
    let registry = match view {
        Some(v) => v.workers(kv).await?,
        None => list_workers(kv).await?,
    };
    let by_id: ById<'_> = registry
        .iter()
        .map(|s| (s.record.info.worker_id.as_str(), s))
        .collect();
    let mut observed = BTreeMap::new();
    for job in state.jobs.iter().filter(|j| !j.state.is_terminal()) {
        observed.insert(job.id.clone(), observe(kv, job, &by_id).await?);
    }
    let workers = capacity(&registry);
    let before = state.clone();
    let events = state.advance(&observed, &workers, keys::unix_ms());
    if state != before && !commit(kv, old.as_deref(), &state).await? {
        // Another pass won; the next one starts over.
        metrics::counter!("tessel_scheduler_passes_total", "outcome" => "superseded").increment(1);
        return Ok(());
    }
    record(&state, &workers, state != before, started);
    carry_out(kv, &state, &events, topology_timeout, unfinished).await?;
    Ok(())
}

/// The metrics of a pass whose state is the committed one: the gauges
/// of what it saw and whether it changed the state (`committed`).
fn record(
    state: &SchedulerState,
    workers: &[WorkerCapacity],
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
    let outcome = if committed { "committed" } else { "unchanged" };
    metrics::counter!("tessel_scheduler_passes_total", "outcome" => outcome).increment(1);
    metrics::histogram!("tessel_scheduler_pass_seconds").record(started.elapsed().as_secs_f64());
}

/// Runs passes every `interval` until the task is dropped, while `leads`
/// says this process should (`serve` invariant 2); errors are logged and
/// retried (the state is in the KV, nothing is lost).
pub async fn run(
    kv: Arc<dyn KvStore>,
    interval: Duration,
    topology_timeout: Duration,
    leads: impl Fn() -> bool + Send + 'static,
) {
    // The registry from a watch, not a listing each pass; dropped (its
    // watch with it) while another coordinator leads.
    let mut view: Option<RegistryView> = None;
    let mut unfinished: Option<Unfinished> = None;
    loop {
        // Which coordinator's gauges are current: the one that passes.
        let leading = leads();
        metrics::gauge!("tessel_scheduler_leading").set(if leading { 1.0 } else { 0.0 });
        if !leading {
            view = None;
            // The leader now cannot know them; they are idempotent.
            if let Err(e) = finish(&*kv, &mut unfinished).await {
                tracing::warn!(error = %e, "carrying out an earlier pass's transitions failed");
            }
            tokio::time::sleep(interval).await;
            continue;
        }
        let registry = view.get_or_insert_with(RegistryView::new);
        if let Err(e) = pass_in(&*kv, Some(registry), topology_timeout, &mut unfinished).await {
            metrics::counter!("tessel_scheduler_passes_total", "outcome" => "failed").increment(1);
            tracing::warn!(error = %e, "scheduler pass failed");
        }
        tokio::time::sleep(interval).await;
    }
}
