//! A client's session (`tessel_kv::state` sessions): its id, the number of
//! its next call and its calls in flight, whose lowest is the floor every
//! call carries (client invariant 2).
//!
//! A session's calls from its floor on number at most
//! [`MAX_CALLS_IN_FLIGHT`] (the state keeps their answers): when one slow
//! call holds the floor while that many others were made, new calls start
//! a fresh session, and the slow call's retries still carry the old one.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tessel_kv::state::{Op, MAX_CALLS_IN_FLIGHT};

/// The sessions of one [`super::KvClient`]: the one new calls join.
pub(super) struct Session {
    current: Mutex<Arc<Calls>>,
}

/// One session's id and calls.
struct Calls {
    id: u128,
    /// The next call's number, and the calls in flight.
    state: Mutex<(u64, BTreeSet<u64>)>,
}

/// A call in flight; dropping it ends the call (returned or given up).
pub(super) struct Call {
    session: Arc<Calls>,
    seq: u64,
    floor: u64,
}

impl Calls {
    fn new() -> Arc<Calls> {
        Arc::new(Calls {
            id: session_id(),
            state: Mutex::new((0, BTreeSet::new())),
        })
    }

    /// A new call's number and floor, unless the session is full.
    fn begin(&self) -> Option<(u64, u64)> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (next, in_flight) = &mut *state;
        let floor = in_flight.first().copied().unwrap_or(*next);
        if *next - floor >= MAX_CALLS_IN_FLIGHT as u64 {
            return None;
        }
        let seq = *next;
        *next += 1;
        in_flight.insert(seq);
        Some((seq, floor))
    }
}

impl Session {
    pub(super) fn new() -> Session {
        Session {
            current: Mutex::new(Calls::new()),
        }
    }

    /// Starts a call: the next number, in flight until the call is dropped.
    pub(super) fn begin(&self) -> Call {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some((seq, floor)) = current.begin() {
                return Call {
                    session: current.clone(),
                    seq,
                    floor,
                };
            }
            *current = Calls::new();
        }
    }
}

impl Call {
    /// `op` as this call of its session.
    pub(super) fn wrap(&self, op: Op) -> Op {
        Op::Once {
            client: self.session.id,
            seq: self.seq,
            floor: self.floor,
            op: Box::new(op),
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let mut state = self.session.state.lock().unwrap_or_else(|e| e.into_inner());
        state.1.remove(&self.seq);
    }
}

/// 128 bits no other client has: SipHash, under the keys std draws from
/// the OS for each `RandomState`, of this process, the time and a count.
/// Unique without a dependency, and never failing (sessions are made in
/// constructors that cannot fail).
fn session_id() -> u128 {
    use std::hash::BuildHasher;
    static MADE: AtomicU64 = AtomicU64::new(0);
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let half = |salt: u8| {
        let keys = std::collections::hash_map::RandomState::new();
        keys.hash_one((salt, made, std::process::id(), std::time::SystemTime::now()))
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_oldest_call_still_in_flight() {
        let s = Session::new();
        let a = s.begin();
        let b = s.begin();
        assert_eq!((a.seq, a.floor, b.seq, b.floor), (0, 0, 1, 0));
        drop(a);
        let c = s.begin();
        assert_eq!((c.seq, c.floor), (2, 1));
        drop(b);
        drop(c);
        let d = s.begin();
        assert_eq!((d.seq, d.floor), (3, 3));
    }

    #[test]
    fn a_slow_call_holding_the_floor_sends_new_calls_to_a_new_session() {
        let s = Session::new();
        let slow = s.begin();
        let max = MAX_CALLS_IN_FLIGHT as u64;
        for seq in 1..max {
            let c = s.begin();
            assert_eq!((c.session.id, c.seq, c.floor), (slow.session.id, seq, 0));
        }
        // The state would keep a full session's answers from the floor on.
        let next = s.begin();
        assert_ne!(next.session.id, slow.session.id);
        assert_eq!((next.seq, next.floor), (0, 0));
        assert_eq!(
            slow.wrap(Op::Tick),
            slow.wrap(Op::Tick),
            "its retries keep its session"
        );
    }

    #[test]
    fn sessions_have_ids_of_their_own() {
        let ids: BTreeSet<u128> = (0..1000).map(|_| session_id()).collect();
        assert_eq!(ids.len(), 1000);
    }
}
