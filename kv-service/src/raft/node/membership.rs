//! Changes to the replica set, on the leader: a new replica joins as a
//! learner and is promoted once it caught up; a removed one's id is never
//! reused.

use std::collections::BTreeSet;

use openraft::BasicNode;

use super::{unavailable, ReplicaHandler};
use tessel_kv::KvError;

impl ReplicaHandler {
    fn voters(&self) -> BTreeSet<u64> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        m.membership().voter_ids().collect()
    }

    pub(super) async fn add_replica(&self, id: u64, addr: String) -> Result<(), KvError> {
        crate::rpc::check_host_port(&addr)
            .map_err(|e| KvError::InvalidArgument(format!("replica address {addr:?}: {e}")))?;
        let voters = self.voters();
        if voters.contains(&id) {
            return Ok(());
        }
        self.raft
            .add_learner(id, BasicNode::new(addr), true)
            .await
            .map_err(|e| unavailable(format!("add learner {id}: {e}")))?;
        let mut new = voters;
        new.insert(id);
        self.raft
            .change_membership(new, false)
            .await
            .map(drop)
            .map_err(|e| unavailable(format!("promote {id}: {e}")))
    }

    pub(super) async fn remove_replica(&self, id: u64) -> Result<(), KvError> {
        let mut voters = self.voters();
        if !voters.remove(&id) {
            return Err(KvError::NotFound(id.to_string().into_bytes()));
        }
        if voters.is_empty() {
            return Err(KvError::InvalidArgument(
                "cannot remove the last voter".into(),
            ));
        }
        self.raft
            .change_membership(voters, false)
            .await
            .map(drop)
            .map_err(|e| unavailable(format!("remove {id}: {e}")))
    }
}
