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
//! 3. A replica the client's requests left after a failed or abandoned
//!    call is no follower of its for [`AVOID_FOLLOWERS`]: when a leader
//!    dies, its clients' requests move to the next leader, whose followers
//!    include the dead one, and half of them picked it for their
//!    keep-alives. The pick is among the others then (the requests'
//!    replica when none is left).

use std::collections::HashMap;
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
    /// Invariant 3: replicas left, by index, until when.
    left: Mutex<HashMap<usize, Instant>>,
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
            left: Mutex::default(),
            unused: false,
        }
    }
}

impl Followers {
    /// The replica to use while the client's requests go to replica
    /// `requests` of `n`.
    pub(super) fn target(&self, requests: usize, n: usize) -> usize {
        let until = *self.avoided_until.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let avoided = until.is_some_and(|t| now < t);
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        left.retain(|_, until| now < *until);
        follower_for(requests, n, self.pick, avoided || self.unused, |i| {
            left.contains_key(&i)
        })
    }

    /// Invariant 3: the client's requests left replica `i` (of those it
    /// was given) after a failed or abandoned call.
    pub(super) fn left(&self, i: usize) {
        let mut left = self.left.lock().unwrap_or_else(|p| p.into_inner());
        left.insert(i, Instant::now() + AVOID_FOLLOWERS);
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

/// Invariants 1 to 3, pure: replica `requests` itself when it is the only
/// one, followers are avoided or every other replica was `left`, else one
/// of the others not left, chosen by `pick`.
fn follower_for(
    requests: usize,
    n: usize,
    pick: u64,
    avoided: bool,
    left: impl Fn(usize) -> bool,
) -> usize {
    if n < 2 || avoided {
        return requests;
    }
    let others: Vec<usize> = (1..n)
        .map(|k| (requests + k) % n)
        .filter(|&i| !left(i))
        .collect();
    if others.is_empty() {
        return requests;
    }
    others[(pick % others.len() as u64) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Invariants 1 and 2.
    #[test]
    fn keep_alives_go_to_a_follower_of_the_requests_replica() {
        let none = |_| false;
        for pick in 0..6 {
            for requests in 0..3 {
                let to = follower_for(requests, 3, pick, false, none);
                assert_ne!(to, requests, "a follower");
                assert!(to < 3);
                assert_eq!(follower_for(requests, 3, pick, true, none), requests);
            }
            assert_eq!(follower_for(0, 1, pick, false, none), 0, "the only replica");
        }
        let spread: std::collections::BTreeSet<usize> = (0..4)
            .map(|pick| follower_for(0, 3, pick, false, none))
            .collect();
        assert_eq!(spread, [1, 2].into(), "both followers are picked");
    }

    /// Invariant 3: the replica the requests left (the dead leader) is no
    /// client's follower; with every other one left, the requests' own.
    #[test]
    fn no_keep_alives_go_to_a_replica_the_requests_left() {
        for pick in 0..6 {
            assert_eq!(follower_for(2, 3, pick, false, |i| i == 0), 1);
            assert_eq!(follower_for(1, 3, pick, false, |i| i != 1), 1);
        }
        let mut followers = Followers::default();
        followers.left(0);
        for _ in 0..4 {
            followers.pick = followers.pick.wrapping_add(1);
            assert_eq!(followers.target(2, 3), 1, "never the one left");
        }
    }
}
