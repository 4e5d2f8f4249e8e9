//! The hook through which a job process runs a job's plan.
//!
//! The worker owns the resources of a job process — its PJRT client, its
//! communicator over the transfer layer, the job's KV namespace — and knows
//! nothing of job specs. The `tessel` crate, which does, implements
//! [`JobRunner`] and hands it to the worker ([`crate::Worker::start`]).

use std::path::PathBuf;
use std::sync::Arc;

use tessel_coordinator::jobs::FailureKind;
use tessel_kv::KvStore;
use tessel_pjrt::Client;
use tessel_topology::GlobalTopology;
use tessel_transfer::Communicator;

/// One process of a job, ready to run: connected to every other process.
pub struct JobProcess<'a> {
    /// The attempt (`ID@ATTEMPT`).
    pub job: &'a str,
    /// This process's index.
    pub process_index: u32,
    /// The attempt's process count.
    pub num_processes: u32,
    /// The worker's PJRT client.
    pub client: &'a Client,
    /// Connected to every other process.
    pub communicator: &'a mut Communicator,
    /// The coordinators' KV.
    pub kv: Arc<dyn KvStore>,
    /// Every process of the job: its worker, host and boot id.
    pub topology: &'a GlobalTopology,
    /// Folders under which this worker lets jobs keep checkpoints
    /// (`tessel worker --checkpoint-root`); none: checkpoints are refused.
    pub checkpoint_roots: &'a [PathBuf],
}

/// Why a job process failed, and whether a restart may cure it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct JobError {
    /// Whether a restart may cure it.
    pub kind: FailureKind,
    /// What happened.
    pub message: String,
}

impl JobError {
    /// The job's own error: restarting would fail the same way.
    pub fn job(message: impl Into<String>) -> JobError {
        JobError {
            kind: FailureKind::Job,
            message: message.into(),
        }
    }
}

/// Reads a job's spec once per job process ([`JobRunner::prepare`]):
/// what the worker then asks of the job, decoded and checked once.
pub trait JobRunner: Send + Sync {
    /// Decodes and checks a job's spec (the bytes at `jobs/{job}/spec`).
    fn prepare(&self, spec: &[u8]) -> Result<Box<dyn PreparedJob>, JobError>;
}

/// A job's spec as one process uses it: its plugin options, its command
/// (a command job) or its plan.
#[async_trait::async_trait]
pub trait PreparedJob: Send + Sync {
    /// The plugin create options the spec asks for; they add to, and
    /// override, the worker's own.
    fn client_options(&self) -> Vec<tessel_pjrt::NamedValue> {
        Vec::new()
    }

    /// Whether the job asks for its network transfers encrypted or not;
    /// `None`: as the worker runs them (`--transfer-encryption`).
    fn transfer_encryption(&self) -> Option<tessel_transfer::Encryption> {
        None
    }

    /// The command a command job runs, or `None` for a job with a plan:
    /// the worker then starts the command's processes instead of a PJRT
    /// client ([`crate::command`]).
    fn command(&self) -> Option<crate::CommandLaunch> {
        None
    }

    /// Runs to the end of the plan and returns what the process reports
    /// (stored at `jobs/{job}/processes/{i}/result`), or why it failed
    /// (which fails the job for every process).
    async fn run(self: Box<Self>, process: JobProcess<'_>) -> Result<Vec<u8>, JobError>;
}
