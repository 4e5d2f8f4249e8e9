//! Serializable gets (etcd's `serializable` range requests): the replica
//! asked answers from its own applied state, so a value every process of a
//! job waits for (its published topology: N reads of a value that grows
//! with N) is served by the followers the clients picked, not N times by
//! the leader.
//!
//! Invariants:
//! 1. The value answered was committed: a replica applies only committed
//!    entries. It may be one the leader deleted a moment ago; readers ask
//!    this way only for keys written once (`KvStore::get_serializable`).
//! 2. A replica that knows no leader, or stops knowing one while the get
//!    waits (it was cut off), answers `Unavailable`: it may never see the
//!    key written, and the client asks the leader instead.
//! 3. A serializable get under a guard is not served here: it goes to the
//!    leader, which checks the guard and answers it as a linearizable get.
//! 4. A waiting get wakes for its key and for a change of leader, never
//!    for the Raft core's other metrics: openraft sends those at every
//!    turn of its loop, hundreds a second under load, and 16,384 hosts
//!    waiting for their topology made each turn wake thousands of gets.

use std::time::Duration;

use super::{leader_leaves, unavailable, ReplicaHandler};
use tessel_kv::KvError;

impl ReplicaHandler {
    /// Invariants 1, 2 and 4.
    pub(super) async fn serializable_get(
        &self,
        key: &[u8],
        timeout_ms: u64,
    ) -> Result<Vec<u8>, KvError> {
        let leaderless = leader_leaves(&self.raft, |leader| leader.is_some());
        tokio::select! {
            got = self.applied.get(key, Duration::from_millis(timeout_ms)) => got,
            () = leaderless => Err(unavailable(
                "this replica knows no leader: a serializable get goes to another",
            )),
        }
    }
}
