//! The state machine, pure, and a submit retried after it landed.

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

/// Two coordinators' passes that read the same state and advance it in
/// the same millisecond commit the same bytes, and both carry it out:
/// each event is appended (and logged, counted, traced) by one of them.
#[tokio::test]
async fn two_passes_that_commit_the_same_state_announce_each_event_once() {
    let kv = tessel_kv::MemoryKv::new();
    submit(&kv, &sub("j", 1, 0), b"bundle").await.unwrap();
    let (old, read) = read_state(&kv).await.unwrap();
    let now = keys::unix_ms();
    let advance = |mut s: SchedulerState| {
        let events = s.advance(&BTreeMap::new(), &workers(1, 1), now);
        (s, events)
    };
    let (a, a_events) = advance(read.clone());
    let (b, b_events) = advance(read);
    assert_eq!(a_events.len(), 1);
    assert!(pass::commit(&kv, old.as_deref(), &a).await.unwrap());
    assert!(pass::commit(&kv, old.as_deref(), &b).await.unwrap());
    let t = Duration::from_secs(1);
    assert_eq!(
        pass::carry_out(&kv, &a, &a_events, t, &mut None)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        pass::carry_out(&kv, &b, &b_events, t, &mut None)
            .await
            .unwrap(),
        0
    );
}

/// Invariant 4: a cancellation committed by a pass whose event could not
/// be appended (the KV failed after the commit) is still appended, and
/// its attempt still ended (`done` written, assignments removed), by the
/// next pass: no later pass derives that transition again.
#[tokio::test]
async fn a_transition_whose_event_failed_after_its_commit_is_carried_out_by_the_next_pass() {
    use crate::registry::{self, tests::info, LivenessConfig};
    let kv = FaultyKv::new();
    let reg = registry::register(&kv, info("a"), LivenessConfig::default())
        .await
        .unwrap();
    let id = submit(&kv, &sub("j", 1, 0), b"bundle").await.unwrap();
    let t = Duration::from_secs(120);
    let mut unfinished = None;
    pass::pass_in(&kv, None, t, &mut unfinished).await.unwrap();
    let (_, state) = read_state(&kv).await.unwrap();
    let inst = state.job(&id).unwrap().instance();
    let assignment = keys::assignment(&reg.worker_id, &inst);
    assert!(kv.try_get(assignment.as_bytes()).await.is_ok(), "placed");

    cancel(&kv, &id).await.unwrap();
    *kv.refuse_next_insert_under.lock().unwrap() = Some(b"sched/jobs/".to_vec());
    let failed = pass::pass_in(&kv, None, t, &mut unfinished).await;
    assert!(failed.is_err(), "the event's insert failed: {failed:?}");
    let (_, state) = read_state(&kv).await.unwrap();
    let job = state.job(&id).unwrap().clone();
    assert_eq!(
        job.state,
        JobState::Cancelled,
        "committed before the failure"
    );
    let cancelled = keys::sched_event(&id, job.events - 1);
    assert!(
        kv.try_get(cancelled.as_bytes()).await.is_err(),
        "not appended yet"
    );
    assert!(
        kv.try_get(assignment.as_bytes()).await.is_ok(),
        "not ended yet"
    );

    pass::pass_in(&kv, None, t, &mut unfinished).await.unwrap();
    let event = kv.try_get(cancelled.as_bytes()).await.expect("appended");
    let event: JobEvent = postcard::from_bytes(&event).unwrap();
    assert_eq!(event.to, JobState::Cancelled);
    assert!(
        kv.try_get(assignment.as_bytes()).await.is_err(),
        "the cancelled attempt's assignment removed"
    );
    assert!(
        kv.try_get(keys::job_done(&inst).as_bytes()).await.is_ok(),
        "the cancelled attempt's `done` written"
    );
    assert!(unfinished.is_none(), "nothing left to carry out");
}

/// Invariant 12: a placed worker dead before it joined fails the attempt
/// at the next pass, naming it; while it lives, or once it joined (the
/// monitor's case), the pass records nothing.
#[tokio::test]
async fn a_placed_worker_lost_before_joining_fails_the_attempt_at_the_next_pass() {
    use crate::registry::{self, tests::info, LivenessConfig};
    let kv = tessel_kv::MemoryKv::new();
    let liveness = LivenessConfig::default();
    let mut regs = Vec::new();
    for w in ["a", "b", "c"] {
        regs.push(registry::register(&kv, info(w), liveness).await.unwrap());
    }
    let id = submit(&kv, &sub("j", 3, 0), b"bundle").await.unwrap();
    let t = Duration::from_secs(120);
    pass::pass(&kv, t).await.unwrap();
    let (_, state) = read_state(&kv).await.unwrap();
    let job = state.job(&id).unwrap().clone();
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.placement.len(), 3);
    let inst = job.instance();
    let by = |w: &str| regs.iter().find(|r| r.worker_id == w).unwrap().clone();
    jobs::join_job(&kv, &inst, &by("a")).await.unwrap();
    jobs::join_job(&kv, &inst, &by("b")).await.unwrap();
    pass::pass(&kv, t).await.unwrap();
    assert_eq!(jobs::failure_of(&kv, &inst).await.unwrap(), None);
    // `b` joined, then died: the monitor's to record, not the pass's.
    kv.revoke(by("b").lease).await.unwrap();
    pass::pass(&kv, t).await.unwrap();
    assert_eq!(jobs::failure_of(&kv, &inst).await.unwrap(), None);
    kv.revoke(by("c").lease).await.unwrap();
    pass::pass(&kv, t).await.unwrap();
    let failure = jobs::failure_of(&kv, &inst)
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(failure.kind, FailureKind::WorkerLost);
    assert_eq!(failure.worker.as_deref(), Some("c"));
    assert_eq!(failure.reason, pass::LOST_BEFORE_JOINING);
    let (_, state) = read_state(&kv).await.unwrap();
    assert_ne!(state.job(&id).unwrap().state, JobState::Scheduled);
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
        trace: None,
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
        ttl_ms: 5_000,
    };
    let proof = 5_000 + SETTLE_MARGIN_MS;
    // Dead, restarted (a newer incarnation): lost at once.
    let s = settle(
        &[w("dead", Some(1), None), w("restarted", Some(1), Some(2))],
        0,
    );
    assert_eq!(
        s,
        Settled {
            done: true,
            lost: vec!["dead".into(), "restarted".into()]
        }
    );
    // Alive, but not yet for a TTL and the margin since the failure: its
    // lease may be one nobody renews any more.
    assert!(!settle(&[w("quiet", Some(1), Some(1))], proof - 1).done);
    // Alive past them: it renewed after the failure.
    let s = settle(
        &[w("alive", Some(3), Some(3)), w("gone", Some(1), None)],
        proof,
    );
    assert_eq!(
        s,
        Settled {
            done: true,
            lost: vec!["gone".into()]
        }
    );
    // Never joined (lost before joining) and alive past them: alive.
    assert!(settle(&[w("late", None, Some(4))], proof).done);
    // Each worker by its own TTL.
    let short = AttemptWorker {
        ttl_ms: 1_000,
        ..w("short", Some(1), Some(1))
    };
    assert!(settle(std::slice::from_ref(&short), 1_000 + SETTLE_MARGIN_MS).done);
    assert!(
        !settle(
            &[short, w("long", Some(1), Some(1))],
            1_000 + SETTLE_MARGIN_MS
        )
        .done
    );
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

#[test]
fn a_process_that_exits_restarts_the_job_with_growing_back_off() {
    assert_eq!(
        (1..=8).map(restart_backoff_ms).collect::<Vec<_>>(),
        [0, 1000, 2000, 4000, 8000, 16000, 30000, 30000]
    );
    let mut s = SchedulerState::default();
    let id = s.submit(&sub("cmd", 1, 3), 0);
    let w = workers(1, 1);
    let exited = Observed {
        failure: Some(JobFailure {
            kind: crate::jobs::FailureKind::Exited,
            reason: "process 0 exited with code 3".into(),
            ..lost("w0")
        }),
        ..Default::default()
    };
    let mut now = 10;
    s.advance(&BTreeMap::new(), &w, now);
    for restart in 1..=3u32 {
        now += 1;
        let e = s.advance(&obs(&id, exited.clone()), &w, now);
        assert_eq!(e[0].1.to, JobState::Restarting);
        let failed_at = now;
        let wait = restart_backoff_ms(restart);
        if wait > 0 {
            // Settled, but the back-off has not passed: it stays.
            assert!(s
                .advance(&obs(&id, settled(&[])), &w, failed_at + wait - 1)
                .is_empty());
        }
        now = failed_at + wait;
        let e = s.advance(&obs(&id, settled(&[])), &w, now);
        assert_eq!(e[0].1.to, JobState::Pending, "restart {restart}");
        s.advance(&BTreeMap::new(), &w, now);
        assert_eq!(s.jobs[0].attempt, restart + 1);
    }
    // Past max_restarts the exit fails it, naming the exit.
    let e = s.advance(&obs(&id, exited), &w, now + 1);
    assert_eq!(e[0].1.to, JobState::Failed);
    assert!(e[0]
        .1
        .reason
        .as_deref()
        .unwrap()
        .contains("exited with code 3"));
}

/// Invariant 11: a restart stamped by a coordinator an hour ahead waits
/// one back-off from the next pass of a coordinator with the right time,
/// not an hour.
#[test]
fn a_restart_stamped_by_a_clock_that_ran_ahead_waits_its_back_off_not_the_step() {
    let mut s = SchedulerState::default();
    let id = s.submit(&sub("j", 1, 5), 0);
    let w = workers(1, 1);
    let failed = |now| Observed {
        failure: Some(JobFailure {
            unix_ms: now,
            ..lost("w0")
        }),
        ..Default::default()
    };
    let hour = 3_600_000;
    let mut now = 10;
    s.advance(&BTreeMap::new(), &w, now);
    // Two restarts (the second backs off 1 s), the second stamped by a
    // coordinator whose clock is an hour ahead.
    for ahead in [0, hour] {
        now += 1;
        s.advance(&obs(&id, failed(now + ahead)), &w, now + ahead);
        if ahead == 0 {
            s.advance(&obs(&id, settled(&[])), &w, now);
            s.advance(&BTreeMap::new(), &w, now);
        }
    }
    assert_eq!(s.jobs[0].state, JobState::Restarting);
    // The coordinators with the right time: re-stamped, then the back-off.
    assert!(s.advance(&obs(&id, settled(&[])), &w, now + 1).is_empty());
    assert_eq!(s.jobs[0].updated_unix_ms, now + 1);
    let e = s.advance(&obs(&id, settled(&[])), &w, now + 1 + restart_backoff_ms(2));
    assert_eq!(e[0].1.to, JobState::Pending);
}

/// Invariant 9: a job with no restart budget is suspended three times
/// (notices, drains) and each time comes back; the moves are counted as
/// suspensions and their events carry the cause, and the first real
/// failure after them still fails it.
#[test]
fn planned_moves_do_not_use_the_restart_budget() {
    let mut s = SchedulerState::default();
    let id = s.submit(&sub("moved", 1, 0), 0);
    let w = workers(2, 1);
    let suspended = Observed {
        failure: Some(JobFailure {
            kind: crate::jobs::FailureKind::Suspended,
            reason: "suspended at step 7 for a preemption notice: worker `w0` drained".into(),
            ..lost("w0")
        }),
        ..Default::default()
    };
    let mut now = 1;
    s.advance(&BTreeMap::new(), &w, now);
    for moved in 1..=3u32 {
        now += 1;
        let e = s.advance(&obs(&id, suspended.clone()), &w, now);
        assert_eq!(e[0].1.to, JobState::Restarting, "move {moved}");
        assert_eq!(e[0].1.cause, Some(crate::jobs::FailureKind::Suspended));
        now += 1;
        let e = s.advance(&obs(&id, settled(&[])), &w, now);
        assert_eq!(e[0].1.to, JobState::Pending);
        s.advance(&BTreeMap::new(), &w, now);
        assert_eq!(
            (s.jobs[0].restarts, s.jobs[0].suspensions, s.jobs[0].attempt),
            (0, moved, moved + 1)
        );
    }
    let failed = Observed {
        failure: Some(lost("w0")),
        ..Default::default()
    };
    let e = s.advance(&obs(&id, failed), &w, now + 1);
    assert_eq!(e[0].1.to, JobState::Failed);
    assert_eq!(e[0].1.cause, Some(crate::jobs::FailureKind::WorkerLost));
}

/// Invariant 10: a submission no spec check would pass (a client that
/// wrote the state itself) fails at once with its cause; it is never
/// placed, nor does it stop the valid job behind it.
#[test]
fn a_submission_the_cli_would_refuse_fails_naming_why() {
    let mut s = SchedulerState::default();
    let mut zero = sub("zero", 0, 3);
    let mut huge = sub("huge", u32::MAX, 0);
    huge.devices_per_process = u32::MAX;
    let slash = sub("../x", 1, 0);
    zero.max_restarts = 3;
    let ids: Vec<String> = [zero, huge, slash].iter().map(|j| s.submit(j, 0)).collect();
    let ok = s.submit(&sub("fine", 2, 0), 0);
    let e = s.advance(&BTreeMap::new(), &workers(2, 1), 1);
    assert_eq!(e.len(), 4, "{e:?}");
    for (id, words) in ids
        .iter()
        .zip(["0 processes", "4294967295 processes", "name"])
    {
        let j = s.job(id).unwrap();
        assert_eq!(j.state, JobState::Failed, "{id}");
        let why = j.reason.as_deref().unwrap();
        assert!(
            why.starts_with("invalid submission") && why.contains(words),
            "{why}"
        );
        assert!(j.placement.is_empty(), "{id} was never placed");
    }
    assert_eq!(s.job(&ok).unwrap().state, JobState::Scheduled);
}
