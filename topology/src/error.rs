use std::time::Duration;

use tessel_kv::KvError;

/// What building or exchanging a topology can fail with.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum TopologyError {
    #[error("{context}: {source}")]
    Kv {
        context: String,
        #[source]
        source: KvError,
    },
    #[error("process index {index} is out of range for a job of {num_processes} processes")]
    ProcessIndexOutOfRange { index: u32, num_processes: u32 },
    #[error("process {index} expects a job of {declared} processes, this one has {num_processes}")]
    WrongProcessCount {
        index: u32,
        declared: u32,
        num_processes: u32,
    },
    #[error(
        "process index {index} is already taken by another local topology \
         (there: host {existing_host}, boot id {existing_boot}; here: host {host}, boot id {boot})"
    )]
    ConflictingLocalTopology {
        index: u32,
        existing_host: String,
        existing_boot: String,
        host: String,
        boot: String,
    },
    #[error("topology exchange for job `{job}` timed out after {after:?}; processes that never arrived: {missing:?}")]
    Missing {
        job: String,
        missing: Vec<u32>,
        after: Duration,
    },
    #[error("the topology builder (process 0) failed: {0}")]
    BuilderFailed(String),
    #[error("invalid topology: {0}")]
    Invalid(String),
    #[error("invalid mesh: {0}")]
    InvalidMesh(String),
    #[error("cannot decode {what}: {reason}")]
    Decode { what: String, reason: String },
}

impl TopologyError {
    pub(crate) fn kv(context: impl Into<String>) -> impl FnOnce(KvError) -> TopologyError {
        let context = context.into();
        move |source| TopologyError::Kv { context, source }
    }
}

pub type Result<T, E = TopologyError> = std::result::Result<T, E>;
