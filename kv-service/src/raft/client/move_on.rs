//! Moving a client's requests off a replica that failed them (client
//! invariants 4 and 6).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::followers::Followers;

/// Moves a client's `next` replica on from `at` when dropped armed: once
/// for all the calls that failed on (or gave up on) the same replica, so
/// they do not skip the one after it too; the next call asks where the
/// leader is (invariant 4), so a client that moved on to a follower does
/// not stay there, its calls relayed. A replica that did not answer (not
/// one that answered `Unavailable`) is no follower of the client's for a
/// while (`followers` invariant 3).
pub(super) struct MoveOn<'a> {
    pub(super) next: &'a AtomicUsize,
    pub(super) leader_sought: &'a AtomicBool,
    pub(super) followers: &'a Followers,
    pub(super) n: usize,
    pub(super) at: Option<usize>,
    pub(super) answered: bool,
}

impl Drop for MoveOn<'_> {
    fn drop(&mut self) {
        if let Some(at) = self.at {
            if !self.answered {
                self.followers.left(at % self.n);
            }
            let moved =
                self.next
                    .compare_exchange(at, at + 1, Ordering::Relaxed, Ordering::Relaxed);
            if moved.is_ok() {
                self.leader_sought.store(false, Ordering::Relaxed);
            }
        }
    }
}
