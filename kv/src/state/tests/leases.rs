//! Leases: expiry, keep-alives, renewals, holds, the expiry index and the
//! stored rows.

use super::*;

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
