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
//!
//! # The modules in detail
//!
//! * **`tessel-coordinator`** (`coordinator/`).
//!   * `serve` — the coordinator process as a library: `serve(Backend)`
//!     starts a replica (its certificate checked, a cluster joined) or
//!     attaches to etcd, then the failure monitor and the scheduler; the CLI
//!     parses flags and calls it. Its own services still dial this replica
//!     over QUIC (by the name it listens on, or the loopback).
//!   * `attempt` — the per-process records of an attempt
//!     (`jobs/{attempt}/processes/{i:05}/{topology|transfer_ready|result|
//!     failure_seen|host}`): `publish`, `published` (keys parsed whole).
//!   * `registry` — `register` (incarnation counter, lease, record, alive
//!     key), `Heartbeat` (keep-alive + compare-and-swap of the alive key, each
//!     given up after one interval; stops when another incarnation holds the
//!     key, while a retried write that finds its own value succeeds),
//!     `check_current`, `list_workers`.
//!   * `jobs` — `JobAssignment`, `assign`, `join_job`/`leave_job`,
//!     `fail_job` (first failure wins, with its `FailureKind`: `WorkerLost`,
//!     `PeerLost`, `Job`), `wait_for_failure`, `finish_job`.
//!   * `monitor` — watches `workers/`; a deleted alive key (lease gone) or a
//!     newer incarnation fails every job the lost incarnation joined.
//!     Stateless: a reconcile pass on start; every coordinator runs one.
//!   * `scheduler` — `SchedulerState::advance` (pure: placement, transitions,
//!     restarts, settling, cancel → events) and `pass` (observe what workers
//!     published, advance, compare-and-swap `sched/state`, then carry out:
//!     bundles and assignments of Scheduled attempts, `done` and unassignment
//!     of ended ones, events); `run` repeats passes every 500 ms in every
//!     coordinator. A compare-and-swap mismatch that finds exactly its own new
//!     state is its own retried write.

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
