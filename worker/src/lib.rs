//! tessel's per-host agent.
//!
//! A worker loads a PJRT plugin, registers with the coordinator (worker
//! id, incarnation, lease), keeps its lease alive, and runs the job
//! processes assigned to it: for each, a per-node PJRT client whose KV
//! callbacks are bound to the job's namespace ([`JobKv`]), and the global
//! topology exchange over the coordinator's KV. A job that carries a plan
//! (`jobs/{job}/spec`) is then run by the [`JobRunner`] the binary gives
//! the worker.
//!
//! * [`agent`]: start (plugin, id, registration), the heartbeat and
//!   registering again after a loss, following assignments.
//! * [`claim`]: taking a worker id only when no live process holds it.
//! * `process`: one job process, from client to result.
//! * [`tpu`]: the environment libtpu reads to join a multi-host slice.
//! * [`preempt`]: preemption notices and drains.
//! * [`reaper`]: orphans reaped when tessel is a container's PID 1.
//! * [`command`]: command jobs (a training script as the job's processes,
//!   supervised as a gang).

pub mod agent;
pub mod claim;
pub mod command;
mod error;
pub mod host;
pub mod job_kv;
pub mod preempt;
mod process;
pub mod reaper;
pub mod runner;
pub mod tpu;

pub use agent::{Worker, WorkerConfig};
pub use command::CommandLaunch;
pub use error::{Result, WorkerError};
pub use host::HostFacts;
pub use job_kv::JobKv;
pub use runner::{JobError, JobProcess, JobRunner, PreparedJob};
