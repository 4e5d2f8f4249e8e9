//! Keep-alives answered from the leader's memory, as etcd's lessor does:
//! a keep-alive is not a log entry. At 16,384 workers beating once a
//! second, one entry each was 16,384 replicated and synced writes a second.
//!
//! Invariants:
//! 1. A keep-alive is answered from memory only by a leader a majority
//!    acknowledged recently (`quorum` invariant 3) whose term's
//!    `RenewLeases` has committed (so its applied state holds every lease
//!    granted before); otherwise it is written to the log as before.
//! 2. A lease's renewal in memory reaches the log before any request
//!    stamped past the lease's written expiry: every proposal carries the
//!    renewals of the leases that expire within [`EXTEND_HORIZON`] of its
//!    time (`ExtendLeases`, first in the proposal), and the leader proposes
//!    a `Tick` [`WAKE_AHEAD`] before the first such lease expires.
//! 3. So a lease that stops being renewed expires its TTL after its last
//!    renewal, as when every keep-alive was written; a new leader knows no
//!    renewals and extends every lease by its TTL instead (`RenewLeases`).
//! 4. Pure: what to extend and when to wake are functions of the applied
//!    state and the renewals; the node does the I/O.
//! 5. A keep-alive that reaches a leader whose last acknowledgement is too
//!    old to act on (invariant 1) waits for the next one (`quorum`
//!    `confirmed`, at most the leader lease), then is renewed from memory
//!    as of its arrival (invariant 6); only a leader whose term's `RenewLeases` has not
//!    committed writes it to the log. Refusing it sent every keep-alive of
//!    that moment as a request to the log: at 16,384 workers thousands of
//!    entries a second from a leader already too busy to be acknowledged.
//! 6. A keep-alive counts from its arrival at the leader, not from the
//!    confirmation it waits for: it is noted at once (so the proposals made
//!    meanwhile extend its lease, invariant 2) and its lease is alive if it
//!    was then; a renewal never moves a lease's last renewal back. Counted
//!    from the confirmation, waits of 1.9 s for the followers'
//!    acknowledgement (16,384 hosts bootstrapping on two cores) expired
//!    leases whose keep-alives had reached the leader in time.

use std::collections::HashMap;
use std::sync::Mutex;

use tessel_kv::state::{KvState, Op, Output};
use tessel_kv::KvError;

/// How far ahead of a proposal's time the renewals of expiring leases are
/// written (invariant 2). Twice [`WAKE_AHEAD`], so that one tick covers a
/// second of expiries and the next is a second later, not at once.
pub(super) const EXTEND_HORIZON_MS: u64 = 2_000;

/// How long before a renewed lease's written expiry the leader ticks.
pub(super) const WAKE_AHEAD_MS: u64 = 1_000;

/// Leases [`Renewals::next_wake_ms`] looks at, and how soon it looks again
/// when there are more.
const WAKE_SCAN: usize = 64;
const RESCAN_MS: u64 = 100;

/// When each lease was last renewed, in the leader's memory.
#[derive(Default)]
pub(super) struct Renewals {
    last: Mutex<HashMap<u64, u64>>,
}

impl Renewals {
    /// Answers a keep-alive of lease `id` at `now_ms` from the applied
    /// `state`: the lease's TTL, or `LeaseNotFound` for a lease that does
    /// not exist or already lived past its TTL.
    pub(super) fn keep_alive(
        &self,
        state: &KvState,
        id: u64,
        now_ms: u64,
    ) -> Result<Output, KvError> {
        let (ttl_ms, written) = state.lease(id).ok_or(KvError::LeaseNotFound(id))?;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let renewed = last.get(&id).map_or(0, |at| at.saturating_add(ttl_ms));
        if written.max(renewed) < now_ms {
            // Dead: the next tick expires it.
            return Err(KvError::LeaseNotFound(id));
        }
        let at = last.entry(id).or_insert(now_ms);
        *at = (*at).max(now_ms);
        Ok(Output::Lease { id, ttl_ms })
    }

    /// The `ExtendLeases` a proposal at `now_ms` must carry first
    /// (invariant 2), if any lease needs one.
    pub(super) fn extension(&self, state: &KvState, now_ms: u64) -> Option<Op> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let horizon = now_ms.saturating_add(EXTEND_HORIZON_MS);
        let renewed: Vec<(u64, u64)> = state
            .leases_by_expiry()
            .take_while(|&(at, _, _)| at < horizon)
            .filter_map(|(at, id, ttl)| {
                let r = *last.get(&id)?;
                (r.saturating_add(ttl) > at).then_some((id, r))
            })
            .collect();
        (!renewed.is_empty()).then_some(Op::ExtendLeases { renewed })
    }

    /// When the leader must next propose (ms), asked at `now_ms`: at the
    /// state's own next deadline, or [`WAKE_AHEAD_MS`] before a renewed
    /// lease's written expiry, whichever comes first.
    pub(super) fn next_wake_ms(&self, state: &KvState, now_ms: u64) -> Option<u64> {
        let deadline = state.next_deadline_ms();
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let mut extend = None;
        // Asked on every applied change, so it looks at a bounded number
        // of leases; past the bound it looks again a little later (never
        // later than a lease behind the bound would need).
        for (n, (at, id, ttl)) in state.leases_by_expiry().enumerate() {
            let wake = at.saturating_sub(WAKE_AHEAD_MS);
            if deadline.is_some_and(|d| wake >= d) {
                break; // Nothing earlier than the deadline lies further on.
            }
            if n == WAKE_SCAN {
                extend = Some(wake.max(now_ms.saturating_add(RESCAN_MS)));
                break;
            }
            if last.get(&id).is_some_and(|r| r.saturating_add(ttl) > at) {
                extend = Some(wake);
                break;
            }
        }
        deadline.into_iter().chain(extend).min()
    }

    /// Forgets the renewals of leases the state no longer holds.
    pub(super) fn retain_known(&self, state: &KvState) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.retain(|id, _| state.lease(*id).is_some());
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn a_renewed_lease_is_extended_before_it_expires_and_a_silent_one_is_not() {
        let mut s = MemState::default();
        let beating = grant(&mut s, 0, 5_000);
        let silent = grant(&mut s, 0, 5_000);
        let r = Renewals::default();
        for t in [1_000, 2_000, 3_000] {
            r.keep_alive(&s.state, beating, t).expect("alive");
        }
        // Both written to expire at 5,000: wake a second before.
        assert_eq!(r.next_wake_ms(&s.state, 0), Some(4_000));
        assert_eq!(r.extension(&s.state, 2_000), None, "not within 2 s yet");
        let ext = r.extension(&s.state, 3_500).expect("due within 2 s");
        assert_eq!(
            ext,
            Op::ExtendLeases {
                renewed: vec![(beating, 3_000)]
            }
        );
        apply(&mut s, 3_500, ext);
        // The silent lease's own deadline is next; the beating one is
        // written to 8,000.
        assert_eq!(r.next_wake_ms(&s.state, 0), Some(5_001));
        apply(&mut s, 5_001, Op::Tick);
        assert_eq!(s.state.lease(silent), None, "expired a TTL after its grant");
        assert_eq!(s.state.lease(beating), Some((5_000, 8_000)));
        assert_eq!(
            r.next_wake_ms(&s.state, 0),
            Some(8_001),
            "nothing renewed since"
        );
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
        assert_eq!(r.last.lock().unwrap()[&id], 1_700, "not moved back");
        let ext = r.extension(&s.state, 900).expect("due within 2 s");
        assert_eq!(
            ext,
            Op::ExtendLeases {
                renewed: vec![(id, 1_700)]
            }
        );
    }

    #[test]
    fn a_keep_alive_of_a_lease_past_its_ttl_is_refused() {
        let mut s = MemState::default();
        let id = grant(&mut s, 0, 1_000);
        let r = Renewals::default();
        r.keep_alive(&s.state, id, 900).expect("alive");
        r.keep_alive(&s.state, id, 1_800)
            .expect("renewed at 900: alive to 1,900");
        assert_eq!(
            r.keep_alive(&s.state, id, 2_801),
            Err(KvError::LeaseNotFound(id))
        );
        assert_eq!(
            r.keep_alive(&s.state, 99, 0),
            Err(KvError::LeaseNotFound(99))
        );
        apply(&mut s, 900, Op::LeaseRevoke { id });
        r.retain_known(&s.state);
        assert!(r.last.lock().unwrap().is_empty());
    }
}
