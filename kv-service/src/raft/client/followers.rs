//! Which follower a client's keep-alive stream and serializable gets go to
//! (client invariants 8 and 9): followers relay keep-alives to the leader
//! in batches and answer serializable gets themselves, so that the leader
//! does less per client.
//!
//! Invariants:
//! 1. The follower is one of the replicas other than the one the client's
//!    requests go to (the leader), the same one while that replica stays: a
//!    pick made once per client spreads clients over the followers.
//! 2. It is the requests' replica itself when that is the only replica,
//!    when the client was made not to use followers, or for
//!    [`AVOID_FOLLOWERS`] after a follower's keep-alive stream refused a
//!    keep-alive or broke.

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a client uses the requests' replica after a follower's stream
/// refused a keep-alive or broke (invariant 2): a follower of an older
/// build refuses every frame, one cut off from the leader every batch.
pub(super) const AVOID_FOLLOWERS: Duration = Duration::from_secs(30);

/// A client's choice of follower.
pub(super) struct Followers {
    pick: u64,
    avoided_until: Mutex<Option<Instant>>,
    unused: bool,
}

impl Default for Followers {
    fn default() -> Self {
        Followers {
            // A random pick: the standard library's hasher keys are random
            // per process and per `RandomState`.
            pick: std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish(),
            avoided_until: Mutex::default(),
            unused: false,
        }
    }
}

impl Followers {
    /// The replica to use while the client's requests go to replica
    /// `requests` of `n`.
    pub(super) fn target(&self, requests: usize, n: usize) -> usize {
        let until = *self.avoided_until.lock().unwrap_or_else(|p| p.into_inner());
        let avoided = until.is_some_and(|t| Instant::now() < t);
        follower_for(requests, n, self.pick, avoided || self.unused)
    }

    /// Invariant 2: a follower's stream refused a keep-alive or broke.
    pub(super) fn avoid(&self) {
        let mut until = self.avoided_until.lock().unwrap_or_else(|p| p.into_inner());
        *until = Some(Instant::now() + AVOID_FOLLOWERS);
    }

    /// Invariant 2: never a follower (for comparisons).
    pub(super) fn unused(&mut self) {
        self.unused = true;
    }
}

/// Invariants 1 and 2, pure: replica `requests` itself when it is the only
/// one or followers are avoided, else one of the other `n - 1` chosen by
/// `pick`.
fn follower_for(requests: usize, n: usize, pick: u64, avoided: bool) -> usize {
    if n < 2 || avoided {
        return requests;
    }
    let others = (n - 1) as u64;
    (requests + 1 + (pick % others) as usize) % n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Invariants 1 and 2.
    #[test]
    fn keep_alives_go_to_a_follower_of_the_requests_replica() {
        for pick in 0..6 {
            for requests in 0..3 {
                let to = follower_for(requests, 3, pick, false);
                assert_ne!(to, requests, "a follower");
                assert!(to < 3);
                assert_eq!(follower_for(requests, 3, pick, true), requests);
            }
            assert_eq!(follower_for(0, 1, pick, false), 0, "the only replica");
        }
        let spread: std::collections::BTreeSet<usize> =
            (0..4).map(|pick| follower_for(0, 3, pick, false)).collect();
        assert_eq!(spread, [1, 2].into(), "both followers are picked");
    }
}
