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
//! * [`job_end`]: a job's failure and end, one held wait each, shared by
//!   every phase of its processes.
//! * [`tpu`]: the environment libtpu reads to join a multi-host slice.
//! * [`preempt`]: preemption notices and drains.
//! * [`reaper`]: orphans reaped when tessel is a container's PID 1.
//! * [`command`]: command jobs (a training script as the job's processes,
//!   supervised as a gang).
//!
//! # The modules in detail
//!
//! * **`tessel-worker`** (`worker/`).
//!   * `agent` — `Worker::start` (load plugin, probe devices, check the
//!     certificate, claim the id, register) and `Worker::run` (heartbeat;
//!     follow assignments; on a lost registration stop that incarnation's
//!     processes and register again).
//!   * `claim` — a worker id is taken only when no live process holds it.
//!   * `process` — one job process: withdraw an ended attempt's assignment,
//!     or join, per-node client, bind a transfer endpoint (rank = process
//!     index), exchange, barrier over a `Communicator` (each peer looked up
//!     in the job's directory when first needed, `peers`, and checked to be
//!     the worker its local topology names), publish digest, run the plan through
//!     the job the `JobRunner` prepared (stopped by a failure event or
//!     `done`), publish the result, wait for done/failure.
//!   * `runner` — `JobRunner::prepare` decodes a job's spec once per job
//!     process into a `PreparedJob` (its plugin options, its command, or its
//!     plan, run with a `JobProcess`); `JobError` (message and `FailureKind`).
//!     The hook: the worker crate knows nothing of job specs.
//!   * `job_kv` — `JobKv`: PJRT's `KeyValueStore` over the coordinator's
//!     store, under `jobs/{job}/pjrt/`; `put` is an insert, as in XLA.

pub mod agent;
pub mod claim;
pub mod command;
mod error;
pub mod host;
pub mod job_end;
pub mod job_kv;
mod peers;
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
