//! The error type of every key-value operation.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Shows a key for messages: UTF-8 as text, anything else escaped.
pub fn show_key(key: &[u8]) -> String {
    key.escape_ascii().to_string()
}

/// Ids used as one component of a key path (job, worker, stream ids): 1–128
/// bytes, no `/`, spaces or control characters. The reason on refusal.
pub fn check_path_component(what: &str, s: &str) -> std::result::Result<(), String> {
    if s.is_empty()
        || s.len() > 128
        || s.bytes()
            .any(|b| b == b'/' || b == b' ' || b.is_ascii_control())
    {
        return Err(format!(
            "{what} `{}` must be 1-128 bytes without `/`, spaces or control characters",
            s.escape_debug()
        ));
    }
    Ok(())
}

/// What a key-value operation can fail with. Serializable: the replicated
/// state machine returns it as part of a command's result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum KvError {
    /// No pair at the key.
    #[error("key `{}` not found", show_key(.0))]
    NotFound(Vec<u8>),
    /// A pair is already at the key (insert).
    #[error("key `{}` already exists", show_key(.0))]
    AlreadyExists(Vec<u8>),
    /// A wait ran past its deadline.
    #[error("{what}: deadline of {after:?} exceeded")]
    DeadlineExceeded {
        /// What waited.
        what: String,
        /// The deadline.
        after: Duration,
    },
    /// The request breaks a rule (size, name, shape).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The lease expired or was revoked.
    #[error("lease {0} not found (expired or revoked)")]
    LeaseNotFound(u64),
    /// The request is beyond what the client's certificate allows.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The barrier timed out or was cancelled.
    #[error("barrier `{}` failed: {reason}", show_key(.id))]
    BarrierFailed {
        /// The barrier.
        id: Vec<u8>,
        /// Why.
        reason: String,
    },
    /// The events asked for are no longer kept.
    #[error("revision {requested} is compacted; the oldest retained is {oldest}")]
    Compacted {
        /// The revision asked for.
        requested: u64,
        /// The oldest revision kept.
        oldest: u64,
    },
    /// No replica could answer (no quorum, or none reachable).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A bug or a broken invariant.
    #[error("internal error: {0}")]
    Internal(String),
    /// The replica's disk failed it; the replica stops serving.
    #[error("storage failure: {0}")]
    Storage(String),
}

/// The crate's result type.
pub type Result<T, E = KvError> = std::result::Result<T, E>;
