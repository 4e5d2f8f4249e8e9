//! Keep-alives answered from the leader's memory, and leases expired by
//! the leader, as etcd's lessor does: a keep-alive is not a log entry, and
//! neither is its effect. At 16,384 workers beating once a second, one
//! entry each was 16,384 replicated and synced writes a second; writing
//! each renewal down before the lease's written expiry (`ExtendLeases`)
//! still rewrote every lease's row every 2.7 s on every replica (6,000 rows
//! a second at 16,384 workers).
//!
//! Invariants:
//! 1. A keep-alive is answered from memory only by a leader a majority
//!    acknowledged recently (`quorum` invariant 3) whose term's
//!    `RenewLeases` has committed (so its applied state holds every lease
//!    granted before); otherwise it is written to the log as before.
//! 2. A lease this leader renewed is held (`HoldLeases`, `kv::state`
//!    invariant 13) before its written expiry: every proposal holds the
//!    renewed leases whose written expiry falls within [`HOLD_HORIZON_MS`]
//!    of its time (first in it), and the leader ticks [`WAKE_AHEAD_MS`]
//!    before the first such expiry. A held lease's row is written once; a
//!    lease that ends within its first TTL (a short job's) is never held.
//! 3. A held lease lives its TTL past its last renewal in this leader's
//!    memory; one silent for longer is expired by the next proposal
//!    (`ExpireLeases`, first in it), and the leader ticks when the first
//!    falls due. From the moment it is chosen to expire, keep-alives of it
//!    are refused: no lease is both answered alive and expired.
//! 4. A new leader knows no renewals: when its term's `RenewLeases` has
//!    committed, every held lease counts as renewed then ([`Renewals::promote`],
//!    etcd's `Promote`), as every other lease is renewed by `RenewLeases`
//!    itself. So a lease that stops being renewed expires its TTL after its
//!    last renewal, or after the new term's start.
//! 5. A keep-alive that reaches a leader whose last acknowledgement is too
//!    old to act on (invariant 1) waits for the next one (`quorum`
//!    `confirmed`, at most the leader lease), then is renewed from memory
//!    as of its arrival (invariant 6); only a leader whose term's `RenewLeases` has not
//!    committed writes it to the log. Refusing it sent every keep-alive of
//!    that moment as a request to the log: at 16,384 workers thousands of
//!    entries a second from a leader already too busy to be acknowledged.
//! 6. A keep-alive counts from its arrival at the leader, not from the
//!    confirmation it waits for: it is noted at once (so the proposals made
//!    meanwhile hold its lease, invariant 2) and its lease is alive if it
//!    was then; a renewal never moves a lease's last renewal back. Counted
//!    from the confirmation, waits of 1.9 s for the followers'
//!    acknowledgement (16,384 hosts bootstrapping on two cores) expired
//!    leases whose keep-alives had reached the leader in time.
//! 7. Pure: what to hold, what to expire and when to wake are functions of
//!    the applied state and the memory; the node does the I/O.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;

use tessel_kv::state::{KvState, Op, Output, HELD};
use tessel_kv::KvError;

/// How far ahead of a proposal's time a renewed lease's written expiry
/// must fall for the proposal to hold it (invariant 2). Twice
/// [`WAKE_AHEAD_MS`], so that one tick covers a second of expiries and
/// the next is a second later, not at once.
pub(super) const HOLD_HORIZON_MS: u64 = 2_000;

/// How long before a renewed lease's written expiry the leader ticks.
pub(super) const WAKE_AHEAD_MS: u64 = 1_000;

/// Leases [`Renewals::next_wake_ms`] looks at, and how soon it looks again
/// when there are more.
const WAKE_SCAN: usize = 64;
const RESCAN_MS: u64 = 100;

/// When each lease was last renewed, in the leader's memory.
#[derive(Default)]
pub(super) struct Renewals {
    memory: Mutex<Memory>,
}

#[derive(Default)]
struct Memory {
    /// Lease → (last renewal, TTL), ms.
    last: HashMap<u64, (u64, u64)>,
    /// `(last renewal + TTL, lease)` of every lease in `last`.
    by_deadline: BTreeSet<(u64, u64)>,
    /// Leases chosen to expire (invariant 3).
    expiring: HashSet<u64>,
    /// When the expiries in `expiring` were last proposed: if they have
    /// not applied [`RESCAN_MS`] later, the leader wakes to propose them
    /// again (a fixed time, so that the wake falls due).
    expiring_since: u64,
    /// The term [`Renewals::promote`] last counted from.
    term: u64,
}

impl Memory {
    /// Notes a renewal of `id` at `at`, never moving it back (invariant 6).
    fn renew(&mut self, id: u64, ttl_ms: u64, at: u64) {
        if let Some(&(last, ttl)) = self.last.get(&id) {
            if last >= at {
                return;
            }
            self.by_deadline.remove(&(last.saturating_add(ttl), id));
        }
        self.last.insert(id, (at, ttl_ms));
        self.by_deadline.insert((at.saturating_add(ttl_ms), id));
    }

    /// Whether `id` was renewed late enough to outlive `at`, its written
    /// expiry: then it must be held before `at` (invariant 2).
    fn renewed_past(&self, id: u64, at: u64) -> bool {
        self.last
            .get(&id)
            .is_some_and(|&(r, ttl)| r.saturating_add(ttl) > at)
    }

    fn forget(&mut self, id: u64) {
        if let Some((last, ttl)) = self.last.remove(&id) {
            self.by_deadline.remove(&(last.saturating_add(ttl), id));
        }
        self.expiring.remove(&id);
    }
}

impl Renewals {
    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers a keep-alive of lease `id` at `now_ms` from the applied
    /// `state`: the lease's TTL, or `LeaseNotFound` for a lease that does
    /// not exist, already lived past its TTL, or is being expired.
    pub(super) fn keep_alive(
        &self,
        state: &KvState,
        id: u64,
        now_ms: u64,
    ) -> Result<Output, KvError> {
        let (ttl_ms, written) = state.lease(id).ok_or(KvError::LeaseNotFound(id))?;
        let mut m = self.memory();
        let renewed = m.last.get(&id).map(|&(at, _)| at.saturating_add(ttl_ms));
        let alive_until = if written == HELD {
            // Invariants 3 and 4: a held lease this leader does not know
            // (held by a client's own `HoldLeases`) counts from now.
            renewed.unwrap_or(now_ms)
        } else {
            written.max(renewed.unwrap_or(0))
        };
        if alive_until < now_ms || m.expiring.contains(&id) {
            return Err(KvError::LeaseNotFound(id));
        }
        m.renew(id, ttl_ms, now_ms);
        Ok(Output::Lease { id, ttl_ms })
    }

    /// What a proposal at `now_ms` must carry first, if anything: the
    /// leases to hold (invariant 2) and those to expire (invariant 3).
    /// Called while no other proposal is in flight, so `state` holds every
    /// hold and expiry proposed before.
    pub(super) fn lease_ops(&self, state: &KvState, now_ms: u64) -> Vec<Op> {
        let mut m = self.memory();
        let m = &mut *m;
        let mut ops = Vec::new();
        // Held leases sort last, past any horizon.
        let horizon = now_ms.saturating_add(HOLD_HORIZON_MS);
        let hold: Vec<u64> = state
            .leases_by_expiry()
            .take_while(|&(at, _, _)| at < horizon)
            .filter(|&(at, id, _)| m.renewed_past(id, at))
            .map(|(_, id, _)| id)
            .collect();
        if !hold.is_empty() {
            ops.push(Op::HoldLeases { ids: hold });
        }
        // The ones proposed before are gone, or their proposal failed and
        // they are proposed again.
        let mut expire: Vec<u64> = Vec::new();
        m.expiring.retain(|&id| {
            let present = state.lease(id).is_some();
            if present {
                expire.push(id);
            }
            present
        });
        let due: Vec<u64> = m
            .by_deadline
            .iter()
            .take_while(|&&(deadline, _)| deadline < now_ms)
            .map(|&(_, id)| id)
            .collect();
        for id in due {
            match state.lease(id) {
                Some((_, HELD)) => {
                    m.forget(id);
                    m.expiring.insert(id);
                    expire.push(id);
                }
                // Not held: its written expiry rules it.
                Some(_) => {}
                None => m.forget(id),
            }
        }
        if !expire.is_empty() {
            ops.push(Op::ExpireLeases { ids: expire });
        }
        if !m.expiring.is_empty() {
            m.expiring_since = now_ms;
        }
        ops
    }

    /// When the leader must next propose (ms), asked at `now_ms`: at the
    /// state's own next deadline, [`WAKE_AHEAD_MS`] before a renewed
    /// lease's written expiry, when a held lease falls silent, or when
    /// expiries proposed have not applied, whichever comes first.
    pub(super) fn next_wake_ms(&self, state: &KvState, now_ms: u64) -> Option<u64> {
        let deadline = state.next_deadline_ms();
        let m = self.memory();
        let retry = (m.expiring.iter())
            .any(|&id| state.lease(id).is_some())
            .then(|| m.expiring_since.saturating_add(RESCAN_MS));
        // Asked on every applied change, so each scan looks at a bounded
        // number of leases; past the bound it looks again a little later
        // (never later than a lease behind the bound would need).
        let bounded = |n: usize, wake: u64| {
            (n == WAKE_SCAN).then(|| wake.max(now_ms.saturating_add(RESCAN_MS)))
        };
        let mut hold = None;
        for (n, (at, id, _)) in state.leases_by_expiry().enumerate() {
            let wake = at.saturating_sub(WAKE_AHEAD_MS);
            if at == HELD || deadline.is_some_and(|d| wake >= d) {
                break; // Nothing earlier lies further on.
            }
            if let Some(later) = bounded(n, wake) {
                hold = Some(later);
                break;
            }
            if m.renewed_past(id, at) {
                hold = Some(wake);
                break;
            }
        }
        let mut silent = None;
        for (n, &(at, id)) in m.by_deadline.iter().enumerate() {
            let wake = at.saturating_add(1);
            if deadline.is_some_and(|d| wake >= d) {
                break;
            }
            if let Some(later) = bounded(n, wake) {
                silent = Some(later);
                break;
            }
            if state.lease(id).is_some_and(|(_, w)| w == HELD) {
                silent = Some(wake);
                break;
            }
        }
        [deadline, retry, hold, silent].into_iter().flatten().min()
    }

    /// Invariant 4: called once this leader's `RenewLeases` of `term` has
    /// committed, before it answers from memory; every held lease counts
    /// as renewed at `now_ms`, and what an earlier term of this replica
    /// noted is forgotten. Once a term: a second caller that renewed the
    /// same term concurrently forgets nothing noted since.
    pub(super) fn promote(&self, state: &KvState, now_ms: u64, term: u64) {
        let mut m = self.memory();
        if m.term >= term {
            return;
        }
        *m = Memory {
            term,
            ..Memory::default()
        };
        for (_, id, ttl) in state.leases_by_expiry().filter(|&(at, _, _)| at == HELD) {
            m.renew(id, ttl, now_ms);
        }
    }

    /// Forgets the renewals of leases the state no longer holds.
    pub(super) fn retain_known(&self, state: &KvState) {
        let mut m = self.memory();
        let gone: Vec<u64> = (m.last.keys())
            .filter(|&&id| state.lease(id).is_none())
            .copied()
            .collect();
        for id in gone {
            m.forget(id);
        }
        m.expiring.retain(|&id| state.lease(id).is_some());
    }
}

#[cfg(test)]
mod tests;
