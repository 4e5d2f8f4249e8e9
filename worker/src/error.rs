use tessel_coordinator::CoordinatorError;
use tessel_kvstore::KvError;
use tessel_topology::TopologyError;

/// What running a worker can fail with.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("PJRT: {0}")]
    Pjrt(#[from] tessel_pjrt::Error),
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error("transfer: {0}")]
    Transfer(#[from] tessel_transfer::TransferError),
    #[error("{context}: {source}")]
    Kv {
        context: String,
        #[source]
        source: KvError,
    },
    /// The job's plan failed in this process, or the job failed elsewhere.
    #[error("{0}")]
    Job(String),
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = WorkerError> = std::result::Result<T, E>;
