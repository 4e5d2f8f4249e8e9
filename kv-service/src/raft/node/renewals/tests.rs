//! The leader's memory of renewals: what it holds, expires and wakes for.

use super::*;
use tessel_kv::state::{MemState, Request};

fn apply(s: &mut MemState, now_ms: u64, op: Op) -> Output {
    s.apply(&Request { now_ms, op }).0.expect("applies")
}

fn grant(s: &mut MemState, now_ms: u64, ttl_ms: u64) -> u64 {
    apply(s, now_ms, Op::LeaseGrant { ttl_ms })
        .into_lease()
        .expect("a lease")
}

/// Applies what a proposal at `now_ms` would carry first; returns it.
fn propose(s: &mut MemState, r: &Renewals, now_ms: u64) -> Vec<Op> {
    let ops = r.lease_ops(&s.state, now_ms);
    for op in &ops {
        apply(s, now_ms, op.clone());
    }
    apply(s, now_ms, Op::Tick);
    ops
}

/// Invariants 2 and 3: a renewed lease is held before its written expiry
/// (the leader waking a second ahead), its row written once however often
/// it is renewed, and expired a TTL after its last renewal; a lease never
/// renewed expires with time, as before.
#[test]
fn a_renewed_lease_is_held_once_and_expires_a_ttl_after_its_last_renewal() {
    let mut s = MemState::default();
    let beating = grant(&mut s, 0, 5_000);
    let silent = grant(&mut s, 0, 5_000);
    let r = Renewals::default();
    assert_eq!(r.next_wake_ms(&s.state, 0), Some(5_001), "grants' expiry");
    for t in [1_000, 2_000] {
        r.keep_alive(&s.state, beating, t).expect("alive");
        assert_eq!(propose(&mut s, &r, t), vec![], "not within 2 s yet");
    }
    assert_eq!(
        r.next_wake_ms(&s.state, 2_000),
        Some(4_000),
        "a second before its written expiry"
    );
    r.keep_alive(&s.state, beating, 3_000).expect("alive");
    assert_eq!(
        propose(&mut s, &r, 3_500),
        vec![Op::HoldLeases { ids: vec![beating] }]
    );
    assert_eq!(s.state.lease(beating), Some((5_000, HELD)));
    s.state.take_changed_leases().expect("encodes");
    for t in [4_000, 6_000, 7_000] {
        r.keep_alive(&s.state, beating, t).expect("alive");
        assert_eq!(propose(&mut s, &r, t), vec![], "nothing to write");
    }
    let rows = s.state.take_changed_leases().expect("encodes");
    assert_eq!(rows.len(), 1, "the silent one's expiry alone: {rows:?}");
    assert_eq!(s.state.lease(silent), None, "expired a TTL after its grant");
    assert_eq!(
        r.next_wake_ms(&s.state, 7_000),
        Some(12_001),
        "when the held one falls silent"
    );
    assert_eq!(propose(&mut s, &r, 12_000), vec![], "alive through 12,000");
    assert_eq!(
        propose(&mut s, &r, 12_001),
        vec![Op::ExpireLeases { ids: vec![beating] }]
    );
    assert_eq!(s.state.lease(beating), None);
    assert_eq!(r.next_wake_ms(&s.state, 12_001), None, "nothing left");
}

/// Invariant 2: a lease that ends within its first TTL is never held,
/// however often it was renewed.
#[test]
fn a_lease_revoked_within_its_first_ttl_is_never_held() {
    let mut s = MemState::default();
    let id = grant(&mut s, 0, 5_000);
    let r = Renewals::default();
    for t in [1_000, 2_000] {
        r.keep_alive(&s.state, id, t).expect("alive");
        assert_eq!(propose(&mut s, &r, t), vec![]);
    }
    apply(&mut s, 2_500, Op::LeaseRevoke { id });
    assert_eq!(propose(&mut s, &r, 3_500), vec![], "nothing to hold");
    r.retain_known(&s.state);
    assert!(r.memory().last.is_empty());
}

/// Invariant 6: a keep-alive answered late, as of its arrival, neither
/// moves the renewal back nor finds dead a lease that was alive then.
#[test]
fn a_keep_alive_counts_from_its_arrival_and_never_moves_a_renewal_back() {
    let mut s = MemState::default();
    let id = grant(&mut s, 0, 1_000);
    let r = Renewals::default();
    r.keep_alive(&s.state, id, 900).expect("alive");
    r.keep_alive(&s.state, id, 1_700).expect("alive");
    // One that arrived at 800, answered after the one of 1,700.
    r.keep_alive(&s.state, id, 800)
        .expect("alive when it arrived");
    assert_eq!(r.memory().last[&id], (1_700, 1_000), "not moved back");
    assert_eq!(
        propose(&mut s, &r, 900),
        vec![Op::HoldLeases { ids: vec![id] }],
        "renewed past its written expiry, 1,000"
    );
    assert_eq!(propose(&mut s, &r, 2_700), vec![], "alive through 2,700");
}

/// Invariant 3: a lease past its TTL, unknown, or chosen to expire is
/// refused; an expiry whose proposal failed is proposed again.
#[test]
fn a_keep_alive_of_a_lease_past_its_ttl_or_being_expired_is_refused() {
    let mut s = MemState::default();
    let id = grant(&mut s, 0, 1_000);
    let r = Renewals::default();
    r.keep_alive(&s.state, id, 900).expect("alive");
    r.keep_alive(&s.state, id, 1_800)
        .expect("renewed at 900: alive to 1,900");
    apply(&mut s, 1_800, Op::HoldLeases { ids: vec![id] });
    assert_eq!(
        r.keep_alive(&s.state, id, 2_801),
        Err(KvError::LeaseNotFound(id))
    );
    assert_eq!(
        r.keep_alive(&s.state, 99, 0),
        Err(KvError::LeaseNotFound(99))
    );
    let expire = vec![Op::ExpireLeases { ids: vec![id] }];
    // Chosen, and its proposal lost: refused meanwhile, and chosen again.
    assert_eq!(r.lease_ops(&s.state, 2_801), expire);
    assert_eq!(
        r.keep_alive(&s.state, id, 2_802),
        Err(KvError::LeaseNotFound(id)),
        "being expired"
    );
    assert_eq!(r.next_wake_ms(&s.state, 2_850), Some(2_801 + RESCAN_MS));
    assert_eq!(propose(&mut s, &r, 2_901), expire);
    assert_eq!(s.state.lease(id), None);
    r.retain_known(&s.state);
    let m = r.memory();
    assert!(m.last.is_empty() && m.by_deadline.is_empty() && m.expiring.is_empty());
}

/// Invariant 4: a new leader counts every held lease as renewed when its
/// term's `RenewLeases` committed, and forgets what it noted before.
#[test]
fn a_new_leader_counts_held_leases_from_its_term() {
    let mut s = MemState::default();
    let held = grant(&mut s, 0, 1_000);
    let timed = grant(&mut s, 0, 1_000);
    apply(&mut s, 500, Op::HoldLeases { ids: vec![held] });
    let r = Renewals::default();
    // Noted in an earlier term of this replica: long silent since.
    r.keep_alive(&s.state, held, 600).expect("alive");
    apply(&mut s, 9_000, Op::RenewLeases);
    r.promote(&s.state, 9_000, 2);
    r.keep_alive(&s.state, timed, 9_100).expect("alive");
    r.promote(&s.state, 9_200, 2);
    assert!(r.memory().last.contains_key(&timed), "once a term");
    assert_eq!(s.state.lease(timed), Some((1_000, 10_000)), "RenewLeases");
    assert_eq!(r.memory().last[&held], (9_000, 1_000), "the term's start");
    assert_eq!(r.next_wake_ms(&s.state, 9_200), Some(9_000), "to hold it");
    assert_eq!(
        propose(&mut s, &r, 9_200),
        vec![Op::HoldLeases { ids: vec![timed] }]
    );
    assert_eq!(r.next_wake_ms(&s.state, 9_200), Some(10_001));
    assert_eq!(
        propose(&mut s, &r, 10_001),
        vec![Op::ExpireLeases { ids: vec![held] }]
    );
    assert_eq!(
        s.state.lease(timed),
        Some((1_000, HELD)),
        "renewed at 9,100"
    );
}
