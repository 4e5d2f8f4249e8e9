//! Client sessions: exactly-once writes for clients that retry (Raft
//! dissertation §6.3, with several calls in flight per client).
//!
//! A client that may send a write twice (its first attempt's outcome
//! unknown: a lost answer, a leader change) wraps it in [`Op::Once`] with
//! its session id, the call's sequence number and its *floor*, the lowest
//! sequence number among its calls still in flight. The state machine keeps,
//! per session, the outcome of every call at or above the floor.
//!
//! Invariants:
//! 1. A sequence number is applied at most once per session: a repeat
//!    answers the first outcome (success or error) and changes nothing else.
//! 2. A sequence number below its session's floor that the session does not
//!    hold was given up by its client (the call returned): it is refused, not
//!    applied late.
//! 3. A session holds only outcomes at or above its floor, so its size is
//!    the client's calls in flight; the floor never goes down.
//! 4. A session idle for [`SESSION_IDLE_MS`] of the state's clock is
//!    forgotten, at the first request of a new [`SESSION_SWEEP_MS`] period:
//!    deterministic, so every replica forgets the same sessions at the same
//!    request. A client retries for seconds, far less than the idle time.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::*;

/// How long a session lives without a write (invariant 4).
pub const SESSION_IDLE_MS: u64 = 10 * 60 * 1000;
/// How often idle sessions are looked for (invariant 4).
pub const SESSION_SWEEP_MS: u64 = 60 * 1000;

/// One client's session: outcomes of its calls at or above `floor`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientSession {
    /// The clock of its last write.
    pub last_ms: u64,
    /// No call below this is in flight at its client (invariant 2).
    pub floor: u64,
    /// Sequence number → the outcome it was answered (invariant 3).
    pub done: BTreeMap<u64, Result<Output>>,
}

impl KvState {
    /// Applies `op` as call `seq` of session `client` (invariants 1–3).
    pub(super) fn apply_once(
        &mut self,
        t: &mut impl TablesMut,
        once: (u128, u64, u64),
        op: &Op,
        events: &mut Vec<Event>,
    ) -> Result<Output> {
        let (client, seq, floor) = once;
        if floor > seq {
            return Err(KvError::InvalidArgument(format!(
                "call {seq} of a session cannot have the floor {floor}"
            )));
        }
        if matches!(
            op,
            Op::Once { .. } | Op::Tick | Op::RenewLeases | Op::ExtendLeases { .. }
        ) {
            return Err(KvError::InvalidArgument(
                "only a client's own write can be sent once".into(),
            ));
        }
        let mut session = t.session(client)?.unwrap_or_default();
        if let Some(first) = session.done.get(&seq) {
            return first.clone();
        }
        if seq < session.floor {
            return Err(KvError::InvalidArgument(format!(
                "call {seq} of a session arrived after its client gave up on it"
            )));
        }
        let result = match self.apply_op(t, op, events) {
            Err(KvError::Storage(e)) => return Err(KvError::Storage(e)),
            r => r,
        };
        session.floor = session.floor.max(floor);
        session.done = session.done.split_off(&session.floor);
        session.done.insert(seq, result.clone());
        session.last_ms = self.clock_ms;
        t.set_session(client, Some(&session))?;
        result
    }

    /// Forgets idle sessions when `before_ms` and the clock now lie in
    /// different sweep periods (invariant 4).
    pub(super) fn sweep_sessions(&self, t: &mut impl TablesMut, before_ms: u64) -> Result<()> {
        if before_ms / SESSION_SWEEP_MS == self.clock_ms / SESSION_SWEEP_MS {
            return Ok(());
        }
        let idle_before = self.clock_ms.saturating_sub(SESSION_IDLE_MS);
        for client in t.idle_sessions(idle_before)? {
            t.set_session(client, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn once(seq: u64, floor: u64, op: Op) -> Op {
        Op::Once {
            client: 7,
            seq,
            floor,
            op: Box::new(op),
        }
    }

    fn incr() -> Op {
        Op::Increment {
            key: b"n".to_vec(),
            delta: 1,
        }
    }

    fn apply(s: &mut MemState, now_ms: u64, op: Op) -> Result<Output> {
        s.apply(&Request { now_ms, op }).0
    }

    #[test]
    fn a_repeated_call_is_applied_once_and_gets_its_first_answer() {
        let mut s = MemState::default();
        let first = apply(&mut s, 1, once(0, 0, incr()));
        assert_eq!(
            first,
            Ok(Output::Counter {
                revision: 1,
                value: 1
            })
        );
        // The retry, after another client's write.
        apply(&mut s, 2, incr()).unwrap();
        assert_eq!(apply(&mut s, 3, once(0, 0, incr())), first);
        assert_eq!(s.get(b"n").unwrap().value, b"2");
        assert_eq!(s.revision(), 2);
    }

    #[test]
    fn a_repeated_cas_reports_its_swap_not_a_mismatch() {
        let mut s = MemState::default();
        let cas = Op::CompareAndSwap {
            key: b"k".to_vec(),
            expected: None,
            value: b"v".to_vec(),
        };
        let first = apply(&mut s, 1, once(4, 4, cas.clone())).unwrap();
        assert_eq!(first, Output::Swapped { revision: 1 });
        assert_eq!(apply(&mut s, 2, once(4, 4, cas)), Ok(first));
    }

    #[test]
    fn an_error_is_kept_as_the_answer_too() {
        let mut s = MemState::default();
        let revoke = once(1, 1, Op::LeaseRevoke { id: 99 });
        let first = apply(&mut s, 1, revoke.clone());
        assert_eq!(first, Err(KvError::LeaseNotFound(99)));
        assert_eq!(apply(&mut s, 2, revoke), first);
    }

    #[test]
    fn a_call_given_up_below_the_floor_is_refused_not_applied_late() {
        let mut s = MemState::default();
        apply(&mut s, 1, once(5, 5, incr())).unwrap();
        // Call 3 was abandoned: the client's floor passed it.
        let late = apply(&mut s, 2, once(3, 3, incr()));
        assert!(matches!(late, Err(KvError::InvalidArgument(ref m)) if m.contains("gave up")));
        assert_eq!(s.get(b"n").unwrap().value, b"1");
    }

    #[test]
    fn a_session_keeps_only_the_calls_in_flight() {
        let mut s = MemState::default();
        for seq in 0..100 {
            // The client has calls seq-1 and seq in flight.
            apply(&mut s, 1, once(seq, seq.saturating_sub(1), incr())).unwrap();
        }
        let session = s.tables.session(7).unwrap().unwrap();
        assert_eq!(session.floor, 98);
        assert_eq!(session.done.keys().copied().collect::<Vec<_>>(), [98, 99]);
    }

    #[test]
    fn an_idle_session_is_forgotten_at_the_next_sweep() {
        let mut s = MemState::default();
        apply(&mut s, 1_000, once(0, 0, incr())).unwrap();
        apply(&mut s, SESSION_IDLE_MS, Op::Tick).unwrap();
        assert!(
            s.tables.session(7).unwrap().is_some(),
            "not idle long enough"
        );
        apply(&mut s, SESSION_IDLE_MS + SESSION_SWEEP_MS + 1_000, Op::Tick).unwrap();
        assert_eq!(s.tables.session(7).unwrap(), None);
    }

    #[test]
    fn only_a_clients_own_write_can_be_sent_once() {
        let mut s = MemState::default();
        for op in [Op::Tick, Op::RenewLeases, once(1, 1, incr())] {
            let r = apply(&mut s, 1, once(2, 2, op));
            assert!(matches!(r, Err(KvError::InvalidArgument(_))), "{r:?}");
        }
        let r = apply(&mut s, 1, once(2, 3, incr()));
        assert!(matches!(r, Err(KvError::InvalidArgument(_))), "{r:?}");
    }
}
