//! The embedded Raft backend: openraft 0.9 (storage-v2) over redb.
//!
//! Built so far: the Raft type configuration and durable storage
//! ([`storage`]), checked with openraft's storage suite. Still to come: the
//! replica process, its QUIC transport and the client-facing `KvStore`.

use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::error::KvError;
use crate::state::{Output, Request};

pub mod client;
pub mod node;
pub mod storage;

pub use openraft::SnapshotPolicy;

/// The result of applying one log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response(pub Result<Output, KvError>);

openraft::declare_raft_types!(
    /// tessel's Raft group: requests are state-machine [`Request`]s.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);
