//! A client's session (`tessel_kv::state` sessions): its id, the number of
//! its next call and its calls in flight, whose lowest is the floor every
//! call carries (client invariant 2).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tessel_kv::state::Op;

/// The session of one [`super::KvClient`].
pub(super) struct Session {
    id: u128,
    next: AtomicU64,
    in_flight: Mutex<BTreeSet<u64>>,
}

/// A call in flight; dropping it ends the call (returned or given up).
pub(super) struct Call<'a> {
    session: &'a Session,
    seq: u64,
    floor: u64,
}

impl Session {
    pub(super) fn new() -> Session {
        Session {
            id: session_id(),
            next: AtomicU64::new(0),
            in_flight: Mutex::new(BTreeSet::new()),
        }
    }

    /// Starts a call: the next number, in flight until the call is dropped.
    pub(super) fn begin(&self) -> Call<'_> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        in_flight.insert(seq);
        let floor = in_flight.first().copied().unwrap_or(seq);
        Call {
            session: self,
            seq,
            floor,
        }
    }
}

impl Call<'_> {
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

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let mut in_flight = self
            .session
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        in_flight.remove(&self.seq);
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
    fn sessions_have_ids_of_their_own() {
        let ids: BTreeSet<u128> = (0..1000).map(|_| session_id()).collect();
        assert_eq!(ids.len(), 1000);
    }
}
