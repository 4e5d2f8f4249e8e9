//! The embedded Raft backend: openraft 0.9 (storage-v2) over a log of
//! segment files and a redb state machine.
//!
//! * [`storage`]: openraft's log storage, checked with openraft's storage
//!   suite together with [`sm`].
//! * [`wal`]: the log itself: segment files appended and `fdatasync`ed.
//! * [`sm`]: the state machine on disk (redb) and its snapshot files.
//! * [`key_filter`]: the keys the state machine may hold, to skip lookups
//!   of new keys.
//! * [`node`]: one replica: openraft, the QUIC server, request routing and
//!   group proposals.
//! * [`client`]: [`client::RaftKv`], the client-facing `KvStore`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use tessel_kv::state::{Output, Request};
use tessel_kv::KvError;

pub mod client;
pub mod key_filter;
pub mod node;
pub mod sm;
pub mod storage;
pub mod wal;

pub use openraft::SnapshotPolicy;

/// One log entry: state-machine requests proposed together (the leader
/// groups concurrent writes so that one append and one fsync serve them
/// all), applied in order. Shared, not copied, by the clones openraft
/// takes of an entry (one per follower it is sent to, one to apply it);
/// encoded as the plain sequence of requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Proposal(pub Arc<Vec<Request>>);

impl Proposal {
    /// An entry of several requests, applied in order.
    pub fn new(reqs: Vec<Request>) -> Proposal {
        Proposal(Arc::new(reqs))
    }

    /// An entry of one request.
    pub fn one(req: Request) -> Proposal {
        Proposal::new(vec![req])
    }

    /// Bytes of keys and values carried.
    pub fn payload_bytes(&self) -> usize {
        self.0.iter().map(|r| r.op.payload_bytes()).sum()
    }
}

/// The results of applying one log entry, one per request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response(pub Vec<Result<Output, KvError>>);

impl Response {
    /// The result of a one-request proposal.
    pub fn single(self) -> Result<Output, KvError> {
        self.0
            .into_iter()
            .next()
            .unwrap_or_else(|| Err(KvError::Internal("an empty response".into())))
    }
}

openraft::declare_raft_types!(
    /// tessel's Raft group: each entry is a [`Proposal`] of state-machine
    /// [`Request`]s.
    pub TypeConfig:
        D = Proposal,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = tokio::fs::File,
);

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_kv::state::Op;

    /// Sharing a proposal's requests changed nothing on the wire or in the
    /// log: it encodes as the plain sequence of its requests.
    #[test]
    fn a_proposal_encodes_as_its_plain_requests() {
        let reqs: Vec<Request> = (0..3u8)
            .map(|i| Request {
                now_ms: 7,
                op: Op::Put {
                    key: vec![i],
                    value: vec![i; 5],
                    lease: None,
                },
            })
            .collect();
        let shared = postcard::to_allocvec(&Proposal::new(reqs.clone())).unwrap();
        assert_eq!(shared, postcard::to_allocvec(&reqs).unwrap());
        let back: Proposal = postcard::from_bytes(&shared).unwrap();
        assert_eq!(*back.0, reqs);
    }
}
