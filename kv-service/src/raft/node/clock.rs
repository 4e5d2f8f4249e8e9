//! The clock a leader stamps requests with (node invariant 3).
//!
//! Everything the state machine times is a duration (a lease's TTL, a
//! barrier's timeout), so its clock need not be the wall's, only advance
//! at the rate of real time while a leader serves. Invariants:
//! 1. A leader's clock is the state machine's clock as it found it in its
//!    term, advanced by this process's monotonic time: the wall clock never
//!    enters, so a replica whose wall clock jumps (either way) or starts
//!    wrong expires no lease early and none late.
//! 2. It never runs backwards within a term; a new term starts again from
//!    the applied clock, so a leaderless gap is not counted (it only
//!    lengthens leases, as `RenewLeases` at every term's start does).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use openraft::{Raft, RaftMetrics};
use tessel_kv::AppliedState;
use tokio::sync::watch;

use crate::raft::sm::SmTables;
use crate::raft::TypeConfig;

/// Invariant 1's anchor: the term, the state's clock then, and when.
struct Anchor {
    term: u64,
    base_ms: u64,
    at: Instant,
}

/// A replica's leader clock.
pub(super) struct LeaderClock {
    metrics: watch::Receiver<RaftMetrics<u64, openraft::BasicNode>>,
    applied: Arc<AppliedState<SmTables>>,
    anchor: Mutex<Option<Anchor>>,
}

impl LeaderClock {
    pub(super) fn new(raft: &Raft<TypeConfig>, applied: Arc<AppliedState<SmTables>>) -> Self {
        LeaderClock {
            metrics: raft.metrics(),
            applied,
            anchor: Mutex::new(None),
        }
    }

    /// Now, in the state machine's milliseconds. Never call it inside
    /// `applied.read` (it may read the applied state itself).
    pub(super) fn now_ms(&self) -> u64 {
        let term = self.metrics.borrow().current_term;
        let mut anchor = self.anchor.lock().expect("not poisoned");
        match &*anchor {
            Some(a) if a.term == term => {
                a.base_ms.saturating_add(a.at.elapsed().as_millis() as u64)
            }
            _ => {
                let base_ms = self.applied.read(|s, _| s.clock_ms());
                *anchor = Some(Anchor {
                    term,
                    base_ms,
                    at: Instant::now(),
                });
                base_ms
            }
        }
    }
}
