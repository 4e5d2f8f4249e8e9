//! tessel's coordinator: the worker registry, liveness and failure events.
//!
//! All coordinator state lives in the key-value service ([`KvStore`]), so
//! any coordinator process can take over after a leader change or a crash;
//! the [`monitor`] is stateless and every coordinator may run one (its
//! writes are inserts, so several monitors write each event once).
//!
//! * [`registry`]: a worker registers ([`WorkerInfo`]) and gets a worker
//!   id and an incarnation; its lease is its liveness.
//! * [`jobs`]: which workers a job uses, and the job's failure event.
//! * [`monitor`]: turns expired leases into job failure events.
//! * [`scheduler`]: the job queue, gang scheduling, the job state machine
//!   and restarts.
//!
//! The keys are listed in [`keys`] and in ARCHITECTURE.md.
//!
//! [`KvStore`]: tessel_kv::KvStore

pub mod attempt;
mod error;
pub mod jobs;
pub mod keys;
pub mod monitor;
pub mod records;
pub mod registry;
pub mod scheduler;
pub mod serve;
#[cfg(test)]
mod testing;

pub use error::{CoordinatorError, Result};
pub use jobs::JobFailure;
pub use keys::{check_id, unix_ms};
pub use records::{Item, Records};
pub use registry::{
    Heartbeat, LivenessConfig, Registration, WorkerDevice, WorkerInfo, WorkerRecord, WorkerState,
    WorkerStatus,
};
