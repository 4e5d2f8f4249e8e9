//! Client sessions: exactly-once writes for clients that retry (Raft
//! dissertation §6.3, with several calls in flight per client).
//!
//! A client that may send a write twice (its first attempt's outcome
//! unknown: a lost answer, a leader change) wraps it in [`Op::Once`] with
//! its session id, the call's sequence number and its *floor*, the lowest
//! sequence number among its calls still in flight. The state machine keeps,
//! per session, the answers of its calls at or above the floor that changed
//! the state.
//!
//! Invariants:
//! 1. A call that changed the state is applied at most once: a repeat gets
//!    the first answer and changes nothing. A call that changed nothing (an
//!    error, a CAS mismatch, a delete of nothing) and a barrier call (one
//!    arrival per participant, a cancel once) keep no answer: a repeat runs
//!    again, as if the first had not been. So every answer kept is a few
//!    bytes (those not kept may hold a value or a reason).
//! 2. A sequence number below its session's floor that the session does not
//!    hold was given up by its client (the call returned): it is refused, not
//!    applied late.
//! 3. A session holds only answers at or above its floor, at most
//!    [`MAX_CALLS_IN_FLIGHT`] (a call past that is refused unapplied), so
//!    its record stays far below a snapshot record's limit; the floor never
//!    goes down.
//! 4. A session idle for [`SESSION_IDLE_MS`] of the state's clock is
//!    forgotten, at the first request of a new [`SESSION_SWEEP_MS`] period:
//!    deterministic, so every replica forgets the same sessions at the same
//!    request. A client retries for seconds, far less than the idle time.
//! 5. A call changes its session in place ([`TablesMut::session_mut`]):
//!    its cost does not grow with the answers the session holds (a client
//!    carrying many hosts' calls held 50–100 at 16,384 simulated hosts, and
//!    each call copied them all out and back).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::*;

/// How long a session lives without a write (invariant 4).
pub const SESSION_IDLE_MS: u64 = 10 * 60 * 1000;
/// How often idle sessions are looked for (invariant 4).
pub const SESSION_SWEEP_MS: u64 = 60 * 1000;
/// The most answers a session keeps (invariant 3): about 40 bytes each.
pub const MAX_CALLS_IN_FLIGHT: usize = 4096;

/// One client's session: answers of its calls at or above `floor` that
/// changed the state (invariant 1: only successes change it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientSession {
    /// The clock of its last write.
    pub last_ms: u64,
    /// No call below this is in flight at its client (invariant 2).
    pub floor: u64,
    /// Sequence number → the answer it was given (invariant 3).
    pub done: BTreeMap<u64, Output>,
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
            Op::Once { .. }
                | Op::Tick
                | Op::RenewLeases
                | Op::ExtendLeases { .. }
                | Op::HoldLeases { .. }
                | Op::ExpireLeases { .. }
        ) {
            return Err(KvError::InvalidArgument(
                "only a client's own write can be sent once".into(),
            ));
        }
        // Read in place (invariant 5); nothing changes unless the call runs.
        let kept = t.session_mut(client)?;
        let known = kept.is_some();
        if let Some(kept) = kept {
            if let Some(first) = kept.done.get(&seq) {
                return Ok(first.clone());
            }
            if seq < kept.floor {
                return Err(KvError::InvalidArgument(format!(
                    "call {seq} of a session arrived after its client gave up on it"
                )));
            }
            let floor = kept.floor.max(floor);
            if kept.done.len() >= MAX_CALLS_IN_FLIGHT
                && kept.done.range(floor..).count() >= MAX_CALLS_IN_FLIGHT
            {
                return Err(KvError::InvalidArgument(format!(
                    "a session may have at most {MAX_CALLS_IN_FLIGHT} writes in flight"
                )));
            }
        }
        let result = match self.apply_op(t, op, events) {
            Err(KvError::Storage(e)) => return Err(KvError::Storage(e)),
            r => r,
        };
        if !known {
            t.set_session(client, Some(ClientSession::default()))?;
        }
        let session = t
            .session_mut(client)?
            .ok_or_else(|| KvError::Storage("a session just kept is gone".into()))?;
        session.floor = session.floor.max(floor);
        if session
            .done
            .first_key_value()
            .is_some_and(|(&first, _)| first < session.floor)
        {
            session.done = session.done.split_off(&session.floor);
        }
        if let Some(answer) = result.as_ref().ok().filter(|o| changed_state(op, o)) {
            session.done.insert(seq, answer.clone());
        }
        session.last_ms = self.clock_ms;
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

/// Whether `op`, answered `output` (an error leaves the state untouched:
/// `state` invariant 5), changed the state and is not a barrier call
/// (invariant 1): its answer is kept.
fn changed_state(op: &Op, output: &Output) -> bool {
    match (op, output) {
        (_, Output::Mismatch { .. }) => false,
        (Op::Delete { .. } | Op::DeletePrefix { .. }, Output::Deleted { count, .. }) => *count > 0,
        (Op::BarrierArrive { .. } | Op::BarrierCancel { .. }, _) => false,
        _ => true,
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
    fn a_call_that_changed_nothing_runs_again_and_one_that_did_does_not() {
        let mut s = MemState::default();
        let insert = |seq| {
            once(
                seq,
                1,
                Op::Insert {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    lease: None,
                },
            )
        };
        apply(
            &mut s,
            1,
            Op::Insert {
                key: b"k".to_vec(),
                value: b"old".to_vec(),
                lease: None,
            },
        )
        .unwrap();
        let first = apply(&mut s, 2, insert(1));
        assert!(matches!(first, Err(KvError::AlreadyExists(_))));
        apply(&mut s, 3, Op::Delete { key: b"k".to_vec() }).unwrap();
        // The first changed nothing: the repeat is the call.
        assert_eq!(
            apply(&mut s, 4, insert(1)),
            Ok(Output::Written { revision: 3 })
        );
        assert_eq!(
            apply(&mut s, 5, insert(1)),
            Ok(Output::Written { revision: 3 })
        );
        // A revoke of a lease without keys deletes nothing but the lease:
        // its repeat does not come back as "no such lease".
        let id = apply(&mut s, 6, Op::LeaseGrant { ttl_ms: 1000 })
            .unwrap()
            .into_lease()
            .unwrap();
        let revoke = once(2, 1, Op::LeaseRevoke { id });
        let first = apply(&mut s, 7, revoke.clone());
        assert_eq!(
            first,
            Ok(Output::Deleted {
                revision: 0,
                count: 0
            })
        );
        assert_eq!(apply(&mut s, 8, revoke), first);
        let kept = s.tables.session(7).unwrap().unwrap();
        assert_eq!(kept.done.keys().copied().collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn a_session_with_too_many_calls_in_flight_refuses_the_next_unapplied() {
        let mut s = MemState::default();
        for seq in 0..MAX_CALLS_IN_FLIGHT as u64 {
            apply(&mut s, 1, once(seq, 0, incr())).unwrap();
        }
        let before = s.tables.session(7).unwrap();
        let r = apply(&mut s, 2, once(MAX_CALLS_IN_FLIGHT as u64, 0, incr()));
        assert!(matches!(r, Err(KvError::InvalidArgument(ref m)) if m.contains("in flight")));
        assert_eq!(
            s.get(b"n").unwrap().value,
            MAX_CALLS_IN_FLIGHT.to_string().as_bytes()
        );
        // Invariant 5: changed in place only by a call that runs.
        assert_eq!(s.tables.session(7).unwrap(), before);
        // Once the oldest returned (the floor moved), the next goes in.
        let seq = MAX_CALLS_IN_FLIGHT as u64;
        assert!(apply(&mut s, 1, once(seq, 1, incr())).is_ok());
    }

    #[test]
    fn a_call_given_up_below_the_floor_is_refused_not_applied_late() {
        let mut s = MemState::default();
        apply(&mut s, 1, once(5, 5, incr())).unwrap();
        // Call 3 was abandoned: the client's floor passed it.
        let before = s.tables.session(7).unwrap();
        let late = apply(&mut s, 2, once(3, 3, incr()));
        assert!(matches!(late, Err(KvError::InvalidArgument(ref m)) if m.contains("gave up")));
        assert_eq!(s.get(b"n").unwrap().value, b"1");
        assert_eq!(s.tables.session(7).unwrap(), before, "the clock untouched");
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
