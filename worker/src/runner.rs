//! The hook through which a job process runs a job's plan.
//!
//! The worker owns the resources of a job process — its PJRT client, its
//! communicator over the transfer layer, the job's KV namespace — and knows
//! nothing of job specs. The `tessel` crate, which does, implements
//! [`JobRunner`] and hands it to the worker ([`crate::Worker::with_runner`]).

use tessel_kvstore::KvStore;
use tessel_pjrt::Client;
use tessel_transfer::Communicator;

/// One process of a job, ready to run: connected to every other process.
pub struct JobProcess<'a> {
    pub job: &'a str,
    pub process_index: u32,
    pub num_processes: u32,
    /// The bytes at `jobs/{job}/spec`, as the submitter wrote them.
    pub spec: Vec<u8>,
    pub client: &'a Client,
    pub communicator: &'a mut Communicator,
    pub kv: &'a dyn KvStore,
}

/// Runs a job's plan in one process.
#[async_trait::async_trait]
pub trait JobRunner: Send + Sync {
    /// Runs to the end of the plan and returns what the process reports
    /// (stored at `jobs/{job}/processes/{i}/result`), or why it failed
    /// (which fails the job for every process).
    async fn run(&self, process: JobProcess<'_>) -> Result<Vec<u8>, String>;
}
