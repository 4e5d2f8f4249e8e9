use std::net::SocketAddr;
use std::time::Duration;

/// What a transfer can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// A transfer header that does not decode or breaks a rule.
    #[error("invalid transfer header: {0}")]
    InvalidHeader(String),
    /// A peer announced more bytes than the limit.
    #[error("{announced} bytes announced, over the {max}-byte limit")]
    TooLarge {
        /// What it announced.
        announced: u64,
        /// The limit.
        max: u64,
    },
    /// A connection to a peer failed.
    #[error("cannot reach {addr}: {reason}")]
    Connect {
        /// The peer's address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// A stream to or from a peer broke.
    #[error("transfer with {peer}: {reason}")]
    Stream {
        /// The peer.
        peer: String,
        /// Why.
        reason: String,
    },
    /// A wait ran past its deadline.
    #[error("{what}: deadline of {after:?} exceeded")]
    DeadlineExceeded {
        /// What waited.
        what: String,
        /// The deadline.
        after: Duration,
    },
    /// Certificates or keys could not be used.
    #[error("TLS: {0}")]
    Tls(String),
    /// A device buffer could not be read or written.
    #[error("PJRT: {0}")]
    Pjrt(String),
    /// The caller passed a bad argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Ranks called different collectives (kind, type, size or root).
    #[error("ranks disagree on the collective: {0}")]
    Mismatch(String),
    /// Another rank gave up on the collective.
    #[error("rank {rank} aborted the collective: {reason}")]
    Aborted {
        /// The rank.
        rank: u32,
        /// Its reason.
        reason: String,
    },
    /// An earlier failure left the communicator unusable.
    #[error("the communicator is broken by an earlier failure ({0}); create a new one")]
    Broken(String),
    /// Endpoints of one job disagree on encrypting the data plane, or a
    /// data channel was refused.
    #[error("data plane: {0}")]
    Encryption(String),
    /// The endpoint's socket could not be bound.
    #[error("cannot bind {addr}: {reason}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
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

/// The crate's result type.
pub type Result<T, E = TransferError> = std::result::Result<T, E>;
