use std::net::SocketAddr;
use std::time::Duration;

/// What a transfer can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("invalid transfer header: {0}")]
    InvalidHeader(String),
    #[error("{announced} bytes announced, over the {max}-byte limit")]
    TooLarge { announced: u64, max: u64 },
    #[error("cannot reach {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("transfer with {peer}: {reason}")]
    Stream { peer: String, reason: String },
    #[error("{what}: deadline of {after:?} exceeded")]
    DeadlineExceeded { what: String, after: Duration },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("PJRT: {0}")]
    Pjrt(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("ranks disagree on the collective: {0}")]
    Mismatch(String),
    #[error("rank {rank} aborted the collective: {reason}")]
    Aborted { rank: u32, reason: String },
    #[error("the communicator is broken by an earlier failure ({0}); create a new one")]
    Broken(String),
    #[error("cannot bind {addr}: {reason}")]
    Bind { addr: SocketAddr, reason: String },
}

impl TransferError {
    /// Whether this is the loss of a peer (or of the way to it) rather than
    /// a disagreement or a bad argument: a broken connection or stream, a
    /// deadline, a peer that aborted (which it does only for such
    /// reasons: a mismatch reaches every rank by itself), or a
    /// communicator an earlier such failure broke.
    pub fn is_peer_loss(&self) -> bool {
        matches!(
            self,
            TransferError::Connect { .. }
                | TransferError::Stream { .. }
                | TransferError::DeadlineExceeded { .. }
                | TransferError::Aborted { .. }
                | TransferError::Broken(_)
        )
    }
}

pub type Result<T, E = TransferError> = std::result::Result<T, E>;
