//! The state machine: revisions, leases, barriers, limits, determinism across replicas and snapshots.

use super::*;

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
fn leases_expire_their_keys_in_one_revision() {
    let mut s = MemState::default();
    let (r, _) = s.apply(&req(1000, Op::LeaseGrant { ttl_ms: 500 }));
    let Ok(Output::Lease { id, .. }) = r else {
        panic!("{r:?}")
    };
    for k in ["w/1", "w/2"] {
        must(
            &mut s,
            req(
                1100,
                Op::Put {
                    key: k.into(),
                    value: vec![],
                    lease: Some(id),
                },
            ),
        );
    }
    must(&mut s, req(1200, Op::LeaseKeepAlive { id }));
    let (_, ev) = s.apply(&req(1700, Op::Tick));
    assert!(ev.is_empty(), "kept alive through 1700");
    assert_eq!(s.state.next_deadline_ms(), Some(1701));
    let (_, ev) = s.apply(&req(1701, Op::Tick));
    assert_eq!(ev.len(), 2);
    assert!(ev.iter().all(|e| e.revision() == 3));
    assert!(s.list(b"w/").is_empty());
    assert_eq!(
        s.apply(&req(1800, Op::LeaseKeepAlive { id })).0,
        Err(KvError::LeaseNotFound(id))
    );
    assert_eq!(
        s.apply(&req(
            1800,
            Op::Put {
                key: "x".into(),
                value: vec![],
                lease: Some(id)
            }
        ))
        .0,
        Err(KvError::LeaseNotFound(id))
    );
}

/// Grants a lease of `ttl_ms` at `now` and puts `key` under it.
fn leased_key(s: &mut MemState, now: u64, ttl_ms: u64, key: &str) -> u64 {
    let id = s
        .apply(&req(now, Op::LeaseGrant { ttl_ms }))
        .0
        .unwrap()
        .into_lease()
        .unwrap();
    let put = Op::Put {
        key: key.into(),
        value: b"v".to_vec(),
        lease: Some(id),
    };
    must(s, req(now, put));
    id
}

/// Invariant 6: a keep-alive stamped `t` may have been sent at
/// `t + 0.999`, so the lease lives through `t + ttl`; the tick that
/// ends it is the one `next_deadline_ms` asks for.
#[test]
fn a_lease_lives_its_whole_ttl_after_a_keep_alive() {
    let mut s = MemState::default();
    let id = leased_key(&mut s, 0, 100, "k");
    must(&mut s, req(57, Op::LeaseKeepAlive { id }));
    let due = s.state.next_deadline_ms().expect("a lease is pending");
    assert_eq!(due, 158);
    must(&mut s, req(due - 1, Op::Tick));
    assert!(s.get(b"k").is_some(), "alive through 157");
    must(&mut s, req(due, Op::Tick));
    assert!(s.get(b"k").is_none(), "ended by the tick at its deadline");
    assert_eq!(s.state.next_deadline_ms(), None);
}

#[test]
fn a_key_rewritten_without_its_lease_survives_the_lease() {
    let mut s = MemState::default();
    let Ok(Output::Lease { id, .. }) = s.apply(&req(0, Op::LeaseGrant { ttl_ms: 10 })).0 else {
        panic!()
    };
    must(
        &mut s,
        req(
            0,
            Op::Put {
                key: "k".into(),
                value: "1".into(),
                lease: Some(id),
            },
        ),
    );
    must(&mut s, req(0, put("k", "2")));
    must(&mut s, req(100, Op::Tick));
    assert_eq!(s.get(b"k").unwrap().value, b"2");
}

#[test]
fn the_clock_never_goes_backwards() {
    let mut s = MemState::default();
    must(&mut s, req(1000, Op::Tick));
    must(&mut s, req(10, Op::Tick));
    assert_eq!(s.state.clock_ms(), 1000);
}

#[test]
fn a_new_leader_renews_overdue_leases_before_expiring_them() {
    let mut s = MemState::new(Limits::default(), 100);
    leased_key(&mut s, 0, 1000, "k");
    // No leader for 3 s, then a new one renews first.
    must(&mut s, req(3000, Op::RenewLeases));
    assert!(s.get(b"k").is_some(), "renewed, not expired");
    must(&mut s, req(4000, Op::Tick));
    assert!(s.get(b"k").is_some());
    must(&mut s, req(4001, Op::Tick));
    assert!(s.get(b"k").is_none(), "expires a TTL after the renewal");
}

#[test]
fn an_extension_saves_a_lease_renewed_in_time_even_when_applied_after_its_expiry() {
    let mut s = MemState::new(Limits::default(), 100);
    let id = leased_key(&mut s, 0, 1000, "k");
    let dead = leased_key(&mut s, 0, 1000, "d");
    // Renewed at 900 in the leader's memory, written down at 1500: the
    // lease lives to 1900, the one not renewed expires.
    must(
        &mut s,
        req(
            1500,
            Op::ExtendLeases {
                renewed: vec![(id, 900), (404, 900)],
            },
        ),
    );
    assert!(s.get(b"k").is_some(), "extended before expiring");
    assert!(s.get(b"d").is_none(), "not renewed: expired");
    assert_eq!(s.state.lease(dead), None);
    must(&mut s, req(1900, Op::Tick));
    assert!(s.get(b"k").is_some());
    must(&mut s, req(1901, Op::Tick));
    assert!(s.get(b"k").is_none(), "expires a TTL after its renewal");
}

#[test]
fn an_extension_never_shortens_a_lease_nor_reaches_past_the_clock() {
    let mut s = MemState::new(Limits::default(), 100);
    let id = leased_key(&mut s, 0, 1000, "k");
    must(&mut s, req(800, Op::LeaseKeepAlive { id }));
    let older = Op::ExtendLeases {
        renewed: vec![(id, 100)],
    };
    must(&mut s, req(850, older));
    assert_eq!(s.state.lease(id), Some((1000, 1800)), "not shortened");
    let future = Op::ExtendLeases {
        renewed: vec![(id, 1_000_000)],
    };
    must(&mut s, req(900, future));
    assert_eq!(s.state.lease(id), Some((1000, 1900)), "capped at the clock");
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

/// Invariant 7: through grants, keep-alives, revokes, expiries and a
/// renewal, the expiry index is exactly the leases' deadlines, a state read
/// back from its bytes rebuilds it, and the next deadline is the earliest.
#[test]
fn the_expiry_index_follows_every_lease_change_and_survives_encoding() {
    let mut s = MemState::default();
    let mut ids = Vec::new();
    for i in 0..50u64 {
        let (r, _) = s.apply(&req(
            1000 + i,
            Op::LeaseGrant {
                ttl_ms: 100 + i * 7 % 300,
            },
        ));
        let Ok(Output::Lease { id, .. }) = r else {
            panic!("{r:?}")
        };
        ids.push(id);
    }
    let check = |s: &MemState| {
        let want: BTreeSet<(u64, u64)> = s
            .state
            .leases
            .iter()
            .map(|(id, l)| (l.expires_at_ms, *id))
            .collect();
        assert_eq!(s.state.expiry, want);
        let earliest = s.state.leases.values().map(|l| l.expires_at_ms + 1).min();
        assert_eq!(s.state.next_deadline_ms(), earliest);
        let back: KvState =
            postcard::from_bytes(&postcard::to_allocvec(&s.state).unwrap()).unwrap();
        assert_eq!(back, s.state);
    };
    check(&s);
    for (i, id) in ids.iter().enumerate() {
        let op = match i % 3 {
            0 => Op::LeaseKeepAlive { id: *id },
            1 => Op::LeaseRevoke { id: *id },
            _ => continue,
        };
        must(&mut s, req(1100 + i as u64, op));
        check(&s);
    }
    let (_, _) = s.apply(&req(1250, Op::Tick));
    check(&s);
    assert!(s.state.leases.len() < 34, "some expired at 1250");
    must(&mut s, req(1260, Op::RenewLeases));
    check(&s);
    let renewed = ids.iter().map(|id| (*id, 1500)).collect();
    must(&mut s, req(1500, Op::ExtendLeases { renewed }));
    check(&s);
    let (_, _) = s.apply(&req(5000, Op::Tick));
    assert!(s.state.leases.is_empty() && s.state.expiry.is_empty());
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

/// Invariant 13: a held lease outlives any time and any keep-alive; only
/// the leader's expiry (or a revoke) ends it, with its keys in one
/// revision, and nothing falls due for it meanwhile.
#[test]
fn a_held_lease_ends_only_when_the_leader_expires_it() {
    let mut s = MemState::new(Limits::default(), 100);
    let held = leased_key(&mut s, 0, 1000, "h");
    let timed = leased_key(&mut s, 0, 1000, "t");
    must(
        &mut s,
        req(
            500,
            Op::HoldLeases {
                ids: vec![held, 404],
            },
        ),
    );
    assert_eq!(s.state.lease(held), Some((1000, HELD)));
    assert_eq!(s.state.next_deadline_ms(), Some(1001), "the timed one only");
    must(&mut s, req(10_000, Op::LeaseKeepAlive { id: held }));
    must(&mut s, req(10_000, Op::RenewLeases));
    must(
        &mut s,
        req(
            10_000,
            Op::ExtendLeases {
                renewed: vec![(held, 9_000)],
            },
        ),
    );
    assert_eq!(s.state.lease(held), Some((1000, HELD)), "still held");
    assert_eq!(
        s.state.lease(timed),
        None,
        "the timed lease expired with time"
    );
    assert!(s.get(b"t").is_none());
    assert_eq!(s.state.next_deadline_ms(), None, "nothing falls due");
    let rev = s.state.revision();
    let events = must(
        &mut s,
        req(
            10_001,
            Op::ExpireLeases {
                ids: vec![held, 404],
            },
        ),
    );
    assert_eq!(s.state.lease(held), None);
    assert!(s.get(b"h").is_none());
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].revision(), rev + 1, "its keys in one revision");
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

/// Invariant 11: after every kind of lease change, the state without its
/// leases plus the rows changed so far reads back as the state; a
/// keep-alive or a key put under a lease changes one row, not every lease.
#[test]
fn stored_lease_rows_follow_every_lease_change() {
    let mut s = MemState::default();
    let mut rows: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut step = |s: &mut MemState, r: Request| {
        let _ = s.apply(&r);
        let changed = s.state.take_changed_leases().unwrap();
        let n = changed.len();
        for (id, row) in changed {
            match row {
                Some(row) => rows.insert(id, row),
                None => rows.remove(&id),
            };
        }
        let mut back: KvState =
            postcard::from_bytes(&s.state.encode_without_leases().unwrap()).unwrap();
        assert!(back.leases.is_empty());
        for (id, row) in &rows {
            back.add_stored_lease(*id, row).unwrap();
        }
        assert_eq!(back, s.state, "after {r:?}");
        assert_eq!(back.expiry, s.state.expiry);
        n
    };
    for i in 0..20 {
        assert_eq!(
            step(&mut s, req(1000, Op::LeaseGrant { ttl_ms: 100 + i })),
            1
        );
    }
    let leased = |key: &str, lease| Op::Put {
        key: key.into(),
        value: b"v".to_vec(),
        lease: Some(lease),
    };
    assert_eq!(step(&mut s, req(1001, leased("a", 1))), 1);
    assert_eq!(
        step(&mut s, req(1002, leased("a", 1))),
        0,
        "same key, same lease"
    );
    assert_eq!(
        step(&mut s, req(1003, leased("a", 2))),
        2,
        "moved to another lease"
    );
    assert_eq!(step(&mut s, req(1004, Op::LeaseKeepAlive { id: 3 })), 1);
    assert_eq!(step(&mut s, req(1005, Op::LeaseRevoke { id: 2 })), 1);
    let renewed = vec![(4, 1050), (5, 1050)];
    assert_eq!(step(&mut s, req(1050, Op::ExtendLeases { renewed })), 2);
    // Expiries (the shortest leases, 101 ms and on) drop their rows.
    assert!(step(&mut s, req(1110, Op::Tick)) > 0);
    assert!(s.state.leases.len() < 19);
    assert_eq!(
        step(&mut s, req(1120, Op::RenewLeases)),
        s.state.leases.len()
    );
    step(&mut s, req(9000, Op::Tick));
    assert!(rows.is_empty() && s.state.leases.is_empty());
}

/// Invariant 12: the chosen lease and its keys come at one revision, expire
/// together, and a granted id skips the chosen ones in use.
#[test]
fn a_chosen_lease_comes_with_its_keys_and_is_never_granted_again() {
    let mut s = MemState::default();
    let grant_put = |lease: u64, key: &str| Op::GrantPutBatch {
        lease,
        ttl_ms: 100,
        puts: vec![
            BatchPut::new(key.as_bytes(), b"record", None),
            BatchPut::new(format!("{key}/alive").as_bytes(), b"1", Some(lease)),
        ],
    };
    let ev = must(&mut s, req(0, grant_put(1, "w")));
    assert!(ev.iter().all(|e| e.revision() == 1), "{ev:?}");
    assert_eq!(s.state.lease(1).map(|(ttl, _)| ttl), Some(100));
    let (r, _) = s.apply(&req(0, grant_put(1, "v")));
    assert!(matches!(r, Err(KvError::AlreadyExists(_))), "{r:?}");
    assert!(s.get(b"v").is_none(), "a refused grant writes nothing");
    let (r, _) = s.apply(&req(0, Op::LeaseGrant { ttl_ms: 100 }));
    assert_eq!(r, Ok(Output::Lease { id: 2, ttl_ms: 100 }));
    must(&mut s, req(101, Op::Tick));
    assert!(s.get(b"w/alive").is_none(), "expired with its lease");
    assert!(s.get(b"w").is_some());
}
