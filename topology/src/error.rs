use std::time::Duration;

use tessel_kv::KvError;

/// What building or exchanging a topology can fail with.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum TopologyError {
    /// A KV operation failed.
    #[error("{context}: {source}")]
    Kv {
        /// What tessel was doing.
        context: String,
        /// The KV's error.
        #[source]
        source: KvError,
    },
    /// A process index at or above the job's process count.
    #[error("process index {index} is out of range for a job of {num_processes} processes")]
    ProcessIndexOutOfRange {
        /// The index.
        index: u32,
        /// The job's process count.
        num_processes: u32,
    },
    /// A process was started for a job of another size.
    #[error("process {index} expects a job of {declared} processes, this one has {num_processes}")]
    WrongProcessCount {
        /// The process's index.
        index: u32,
        /// The size it was started for.
        declared: u32,
        /// The job's size.
        num_processes: u32,
    },
    /// Two hosts claimed the same process index.
    #[error(
        "process index {index} is already taken by another local topology \
         (there: host {existing_host}, boot id {existing_boot}; here: host {host}, boot id {boot})"
    )]
    ConflictingLocalTopology {
        /// The index.
        index: u32,
        /// The first claimant's host.
        existing_host: String,
        /// The first claimant's boot id.
        existing_boot: String,
        /// This host.
        host: String,
        /// This host's boot id.
        boot: String,
    },
    /// Processes did not publish their topology in time.
    #[error("topology exchange for job `{job}` timed out after {after:?}; processes that never arrived: {missing:?}")]
    Missing {
        /// The job (instance).
        job: String,
        /// The processes that never arrived.
        missing: Vec<u32>,
        /// How long the exchange waited.
        after: Duration,
    },
    /// Process 0 could not build the global topology.
    #[error("the topology builder (process 0) failed: {0}")]
    BuilderFailed(String),
    /// Some processes encrypt their transfers and others do not.
    #[error(
        "transfer encryption differs within the job: on for processes {}, off for {} \
         (each worker's --transfer-encryption, or the job's transfer_encryption, must agree)",
        few(on),
        few(off)
    )]
    MixedTransferEncryption {
        /// The processes whose transfers are encrypted.
        on: Vec<u32>,
        /// The processes whose transfers are not.
        off: Vec<u32>,
    },
    /// A topology breaks a rule.
    #[error("invalid topology: {0}")]
    Invalid(String),
    /// A mesh does not fit the devices.
    #[error("invalid mesh: {0}")]
    InvalidMesh(String),
    /// A stored record does not decode.
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What it was.
        what: String,
        /// What the decoder said.
        reason: String,
    },
}

impl TopologyError {
    pub(crate) fn kv(context: impl Into<String>) -> impl FnOnce(KvError) -> TopologyError {
        let context = context.into();
        move |source| TopologyError::Kv { context, source }
    }
}

/// The crate's result type.
pub type Result<T, E = TopologyError> = std::result::Result<T, E>;

/// At most the first eight of `ids`, and how many more.
fn few(ids: &[u32]) -> String {
    match ids.len() {
        0..=8 => format!("{ids:?}"),
        n => format!("{:?} and {} more", &ids[..8], n - 8),
    }
}
