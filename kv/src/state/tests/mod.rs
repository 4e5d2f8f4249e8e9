//! The state machine: revisions, leases, barriers, limits, determinism across replicas and snapshots.

use super::*;

mod leases;

fn req(now_ms: u64, op: Op) -> Request {
    Request { now_ms, op }
}

/// Applies a request that must succeed; returns its events.
fn must(s: &mut MemState, r: Request) -> Vec<Event> {
    let (res, ev) = s.apply(&r);
    res.unwrap_or_else(|e| panic!("{r:?}: {e}"));
    ev
}

fn put(key: &str, value: &str) -> Op {
    Op::Put {
        key: key.into(),
        value: value.into(),
        lease: None,
    }
}

#[test]
fn revisions_advance_once_per_change() {
    let mut s = MemState::default();
    let (r, ev) = s.apply(&req(0, put("a", "1")));
    assert_eq!(r, Ok(Output::Written { revision: 1 }));
    assert_eq!(ev.len(), 1);
    must(&mut s, req(0, put("a", "2")));
    let kv = s.get(b"a").unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision), (1, 2));
    // A failed insert and a delete of nothing change nothing.
    let (r, ev) = s.apply(&req(
        0,
        Op::Insert {
            key: "a".into(),
            value: "3".into(),
            lease: None,
        },
    ));
    assert_eq!(r, Err(KvError::AlreadyExists(b"a".to_vec())));
    assert!(ev.is_empty());
    must(&mut s, req(0, Op::Delete { key: "zz".into() }));
    assert_eq!(s.revision(), 2);
    must(&mut s, req(0, put("b/1", "x")));
    must(&mut s, req(0, put("b/2", "y")));
    let (r, ev) = s.apply(&req(
        0,
        Op::DeletePrefix {
            prefix: "b/".into(),
        },
    ));
    assert_eq!(
        r,
        Ok(Output::Deleted {
            revision: 5,
            count: 2
        })
    );
    assert!(
        ev.iter().all(|e| e.revision() == 5),
        "one revision for the whole delete"
    );
}

#[test]
fn list_is_by_prefix_in_key_order() {
    let mut s = MemState::default();
    for k in ["job/2", "job/1", "jobs", "job/10", "other"] {
        must(&mut s, req(0, put(k, k)));
    }
    let keys: Vec<Vec<u8>> = s.list(b"job/").into_iter().map(|kv| kv.key).collect();
    assert_eq!(
        keys,
        vec![b"job/1".to_vec(), b"job/10".to_vec(), b"job/2".to_vec()]
    );
}

#[test]
fn increment_and_compare_and_swap() {
    let mut s = MemState::default();
    let inc = |d| Op::Increment {
        key: "n".into(),
        delta: d,
    };
    assert_eq!(
        s.apply(&req(0, inc(5))).0,
        Ok(Output::Counter {
            revision: 1,
            value: 5
        })
    );
    assert_eq!(
        s.apply(&req(0, inc(-7))).0,
        Ok(Output::Counter {
            revision: 2,
            value: -2
        })
    );
    must(&mut s, req(0, put("t", "text")));
    assert!(matches!(
        s.apply(&req(
            0,
            Op::Increment {
                key: "t".into(),
                delta: 1
            }
        ))
        .0,
        Err(KvError::InvalidArgument(_))
    ));
    let cas = |e: Option<&str>, v: &str| Op::CompareAndSwap {
        key: "c".into(),
        expected: e.map(Into::into),
        value: v.into(),
    };
    assert_eq!(
        s.apply(&req(0, cas(None, "1"))).0,
        Ok(Output::Swapped { revision: 4 })
    );
    assert_eq!(
        s.apply(&req(0, cas(None, "2"))).0,
        Ok(Output::Mismatch {
            current: Some(b"1".to_vec())
        })
    );
    assert_eq!(
        s.apply(&req(0, cas(Some("1"), "2"))).0,
        Ok(Output::Swapped { revision: 5 })
    );
}

#[test]
fn the_clock_never_goes_backwards() {
    let mut s = MemState::default();
    must(&mut s, req(1000, Op::Tick));
    must(&mut s, req(10, Op::Tick));
    assert_eq!(s.state.clock_ms(), 1000);
}

#[test]
fn barriers_pass_fail_and_stay_decided() {
    let mut s = MemState::default();
    let arrive = |p: &str| Op::BarrierArrive {
        id: "b".into(),
        participant: p.into(),
        participants: 2,
        timeout_ms: 100,
    };
    assert_eq!(
        s.apply(&req(0, arrive("w0"))).0,
        Ok(Output::Barrier(BarrierStatus::Waiting {
            arrived: 1,
            participants: 2
        }))
    );
    assert_eq!(
        s.apply(&req(0, arrive("w0"))).0,
        Ok(Output::Barrier(BarrierStatus::Waiting {
            arrived: 1,
            participants: 2
        })),
        "arriving twice counts once"
    );
    assert_eq!(
        s.apply(&req(50, arrive("w1"))).0,
        Ok(Output::Barrier(BarrierStatus::Passed))
    );
    must(&mut s, req(500, Op::Tick));
    assert_eq!(
        s.barrier(b"b"),
        Some(&BarrierStatus::Passed),
        "a passed barrier never fails"
    );
    // A second barrier times out with one participant.
    let other = Op::BarrierArrive {
        id: "t".into(),
        participant: "w0".into(),
        participants: 2,
        timeout_ms: 100,
    };
    must(&mut s, req(500, other));
    must(&mut s, req(600, Op::Tick));
    assert!(
        matches!(s.barrier(b"t"), Some(BarrierStatus::Failed { reason }) if reason.contains("1 of 2"))
    );
    let wrong = Op::BarrierArrive {
        id: "t".into(),
        participant: "w9".into(),
        participants: 3,
        timeout_ms: 1,
    };
    assert!(matches!(
        s.apply(&req(600, wrong)).0,
        Err(KvError::InvalidArgument(_))
    ));
    must(
        &mut s,
        req(
            600,
            Op::BarrierCancel {
                id: "c".into(),
                reason: "job cancelled".into(),
            },
        ),
    );
    assert!(
        matches!(s.barrier(b"c"), Some(BarrierStatus::Failed { reason }) if reason.contains("job cancelled"))
    );
}

#[test]
fn decided_barriers_are_forgotten_after_their_retention() {
    let mut s = MemState::default();
    let arrive = |id: &str, p: &str| Op::BarrierArrive {
        id: id.into(),
        participant: p.into(),
        participants: 2,
        timeout_ms: 100,
    };
    // Both deadlines at 100 (the clock at the first arrival + 100).
    must(&mut s, req(0, arrive("passed", "w0")));
    must(&mut s, req(0, arrive("failed", "w0")));
    must(&mut s, req(10, arrive("passed", "w1")));
    let kept_until = 100 + BARRIER_RETENTION_MS;
    // A late arrival within the retention gets the outcome.
    assert_eq!(
        s.apply(&req(kept_until - 1, arrive("passed", "w0"))).0,
        Ok(Output::Barrier(BarrierStatus::Passed))
    );
    assert!(matches!(
        s.apply(&req(kept_until - 1, arrive("failed", "w1"))).0,
        Ok(Output::Barrier(BarrierStatus::Failed { .. }))
    ));
    // After it, both are gone and the id starts a new barrier.
    must(&mut s, req(kept_until, Op::Tick));
    assert_eq!(s.barrier(b"passed"), None);
    assert_eq!(s.barrier(b"failed"), None);
    assert_eq!(
        s.state.barriers.len(),
        0,
        "the persisted state shrinks back"
    );
    assert_eq!(
        s.apply(&req(kept_until, arrive("passed", "w0"))).0,
        Ok(Output::Barrier(BarrierStatus::Waiting {
            arrived: 1,
            participants: 2
        }))
    );
    // Cancelled before anyone arrived: kept from the cancel on, and
    // arrivals of any count get the cancel.
    let cancel = Op::BarrierCancel {
        id: "early".into(),
        reason: "job cancelled".into(),
    };
    let cancelled_at = kept_until + 5_000;
    must(&mut s, req(cancelled_at, cancel));
    let late = req(
        cancelled_at + BARRIER_RETENTION_MS - 1,
        arrive("early", "w0"),
    );
    assert!(matches!(
        s.apply(&late).0,
        Ok(Output::Barrier(BarrierStatus::Failed { reason })) if reason.contains("job cancelled")
    ));
    must(&mut s, req(cancelled_at + BARRIER_RETENTION_MS, Op::Tick));
    assert_eq!(s.barrier(b"early"), None);
}

#[test]
fn oversized_keys_and_values_write_nothing() {
    let mut s = MemState::new(
        Limits {
            max_key: 4,
            max_value: 8,
        },
        10,
    );
    assert!(matches!(
        s.apply(&req(0, put("toolong", "v"))).0,
        Err(KvError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.apply(&req(0, put("k", "123456789"))).0,
        Err(KvError::InvalidArgument(_))
    ));
    assert_eq!((s.revision(), s.len()), (0, 0));
}

#[test]
fn a_guarded_write_applies_only_while_its_guard_holds() {
    let mut s = MemState::default();
    let guard = Guard {
        who: "worker `h4`".into(),
        any_of: vec![
            Needed {
                key: b"assignments/h4/j@1".to_vec(),
                prefix: false,
            },
            Needed {
                key: b"assignments/h4/k@".to_vec(),
                prefix: true,
            },
        ],
    };
    let guarded = |key: &str| Op::Guarded {
        guard: guard.clone(),
        op: Box::new(put(key, "forged")),
    };
    match s.apply(&req(0, guarded("jobs/j@1/done"))).0 {
        Err(KvError::PermissionDenied(why)) => assert!(
            why.contains("worker `h4` may not write `jobs/j@1/done`")
                && why.contains("`assignments/h4/j@1` or `assignments/h4/k@*`"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!((s.revision(), s.len()), (0, 0), "nothing written");
    must(&mut s, req(1, put("assignments/h4/k@3", "a")));
    must(&mut s, req(2, guarded("jobs/k/checkpoints/1")));
    must(&mut s, req(3, put("assignments/h4/j@1", "a")));
    must(&mut s, req(4, guarded("jobs/j@1/done")));
    assert_eq!(s.get(b"jobs/j@1/done").unwrap().value, b"forged");
    must(
        &mut s,
        req(
            5,
            Op::Delete {
                key: b"assignments/h4/j@1".to_vec(),
            },
        ),
    );
    must(
        &mut s,
        req(
            6,
            Op::Delete {
                key: b"assignments/h4/k@3".to_vec(),
            },
        ),
    );
    let before = s.revision();
    assert!(s.apply(&req(7, guarded("jobs/j@1/result"))).0.is_err());
    assert_eq!(
        s.revision(),
        before,
        "invariant 1: nothing written once unassigned"
    );
}

#[test]
fn history_serves_watchers_until_compacted() {
    let mut s = MemState::new(Limits::default(), 3);
    for i in 0..5 {
        must(&mut s, req(0, put(&format!("k{i}"), "v")));
    }
    let ev = s.events_since(3, b"").unwrap();
    assert_eq!(
        ev.iter().map(Event::revision).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    assert_eq!(
        s.events_since(2, b""),
        Err(KvError::Compacted {
            requested: 2,
            oldest: 3
        })
    );
    assert_eq!(s.events_since(5, b"k4").unwrap().len(), 1);
}

#[test]
fn replicas_applying_the_same_requests_agree() {
    let reqs: Vec<Request> = (0..200u64)
        .map(|i| {
            let op = match i % 6 {
                0 => Op::LeaseGrant { ttl_ms: 30 },
                1 => Op::Put {
                    key: format!("k{}", i % 17).into(),
                    value: i.to_le_bytes().to_vec(),
                    lease: Some(i / 6 + 1),
                },
                2 => Op::Increment {
                    key: "n".into(),
                    delta: i as i64,
                },
                3 => Op::DeletePrefix {
                    prefix: format!("k{}", i % 3).into(),
                },
                4 => Op::BarrierArrive {
                    id: format!("b{}", i % 4).into(),
                    participant: format!("p{i}").into(),
                    participants: 3,
                    timeout_ms: 20,
                },
                _ => Op::Tick,
            };
            req(i * 7, op)
        })
        .collect();
    let run = || {
        let mut s = MemState::default();
        let outs: Vec<_> = reqs.iter().map(|r| s.apply(r)).collect();
        (s, outs)
    };
    let (a, out_a) = run();
    let (b, out_b) = run();
    assert_eq!(a, b);
    assert_eq!(out_a, out_b);
    // And a snapshot restores the same state.
    let snap = postcard::to_allocvec(&a).unwrap();
    assert_eq!(postcard::from_bytes::<MemState>(&snap).unwrap(), a);
}

#[test]
fn operations_keep_their_numbers_in_the_log() {
    // A variant's position is its number in logs and snapshots on disk:
    // new ones are appended, never inserted.
    let number = |op: &Op| postcard::to_allocvec(op).unwrap()[0];
    assert_eq!(number(&Op::Tick), 11);
    assert_eq!(number(&Op::RenewLeases), 12);
    let guarded = Op::Guarded {
        guard: Guard {
            who: "w".into(),
            any_of: vec![],
        },
        op: Box::new(Op::Tick),
    };
    assert_eq!(number(&guarded), 13);
    assert_eq!(number(&Op::ExtendLeases { renewed: vec![] }), 14);
    let once = Op::Once {
        client: 1,
        seq: 0,
        floor: 0,
        op: Box::new(Op::Tick),
    };
    assert_eq!(number(&once), 15);
    assert_eq!(number(&Op::PutBatch { puts: vec![] }), 16);
    assert_eq!(number(&Op::HoldLeases { ids: vec![] }), 18);
    assert_eq!(number(&Op::ExpireLeases { ids: vec![] }), 19);
}

/// Invariant 10: a batch's puts share one revision and its events that
/// revision; a batch that cannot be applied whole changes nothing.
#[test]
fn a_batch_is_applied_whole_at_one_revision_or_not_at_all() {
    let mut s = MemState::default();
    must(&mut s, req(0, put("a", "0")));
    let lease = match s.apply(&req(0, Op::LeaseGrant { ttl_ms: 1000 })).0 {
        Ok(Output::Lease { id, .. }) => id,
        other => panic!("{other:?}"),
    };
    let batch = |puts: Vec<BatchPut>| req(0, Op::PutBatch { puts });
    let ev = must(
        &mut s,
        batch(vec![
            BatchPut::new(b"a", b"1", None),
            BatchPut::new(b"b", b"2", Some(lease)),
        ]),
    );
    assert_eq!(s.revision(), 2);
    assert_eq!(ev.iter().map(Event::revision).collect::<Vec<_>>(), [2, 2]);
    let a = s.get(b"a").unwrap();
    assert_eq!((a.create_revision, a.mod_revision), (1, 2));
    assert_eq!(s.get(b"b").unwrap().lease, Some(lease));
    // The second put's lease is missing: the first is not written either.
    let (r, ev) = s.apply(&batch(vec![
        BatchPut::new(b"c", b"3", None),
        BatchPut::new(b"d", b"4", Some(lease + 1)),
    ]));
    assert_eq!(r, Err(KvError::LeaseNotFound(lease + 1)));
    assert!(ev.is_empty());
    assert!(s.get(b"c").is_none());
    assert_eq!(s.revision(), 2);
    // Expiry takes the leased key, in one revision of its own.
    let ev = must(&mut s, req(1001, Op::Tick));
    assert_eq!(ev.len(), 1);
    assert!(s.get(b"b").is_none() && s.get(b"a").is_some());
}
