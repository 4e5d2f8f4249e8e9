//! What `tessel cluster status` shows of one replica.

use super::ReplicaHandler;
use crate::wire::ReplicaStatus;
use tessel_kv::state::Tables;

impl ReplicaHandler {
    /// This replica's view: its Raft state, membership and applied state.
    pub(super) fn status(&self) -> ReplicaStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let (mut members, mut learners) = (Vec::new(), Vec::new());
        for (id, node) in membership.nodes() {
            let entry = (*id, node.addr.clone());
            if voters.contains(id) {
                members.push(entry);
            } else {
                learners.push(entry);
            }
        }
        let (revision, keys) = self
            .applied
            .read(|s, t| (s.revision(), t.count().unwrap_or(0)));
        ReplicaStatus {
            id: self.id,
            state: format!("{:?}", m.state),
            leader: m.current_leader,
            term: m.current_term,
            members,
            learners,
            last_log_index: m.last_log_index,
            applied: m.last_applied.map(|l| l.index),
            snapshot: m.snapshot.map(|l| l.index),
            purged: m.purged.map(|l| l.index),
            revision,
            keys,
        }
    }
}
