//! The embedded Raft backend: openraft 0.9 (storage-v2) over a log of
//! segment files and a redb state machine.
//!
//! * [`storage`]: openraft's log storage, checked with openraft's storage
//!   suite together with [`sm`].
//! * [`wal`]: the log itself: segment files appended and `fdatasync`ed.
//! * [`sm`]: the state machine on disk (redb) and its snapshot files.
//! * [`node`]: one replica: openraft, the QUIC server, request routing and
//!   group proposals.
//! * [`client`]: [`client::RaftKv`], the client-facing `KvStore`.

use serde::{Deserialize, Serialize};

use crate::error::KvError;
use crate::state::{Output, Request};

pub mod client;
pub mod node;
pub mod sm;
pub mod storage;
pub mod wal;

pub use openraft::SnapshotPolicy;

/// One log entry: state-machine requests proposed together (the leader
/// groups concurrent writes so that one append and one fsync serve them
/// all), applied in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Proposal(pub Vec<Request>);

impl Proposal {
    pub fn one(req: Request) -> Proposal {
        Proposal(vec![req])
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
