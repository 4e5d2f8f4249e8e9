//! Command jobs: a worker runs a command (a training script) as some of a
//! job's processes, in the conventions JAX, torchrun and tessel define,
//! and supervises them as a gang.
//!
//! * [`mod@env`] (pure): every variable a process gets.
//! * `gang`: starting, watching and stopping the processes.
//! * `logs`: their output, shipped to the key-value service in bounded
//!   chunks, and the last lines kept for a failure's summary.
//! * `echo` (pure): the same lines on the worker's stdout, prefixed and
//!   rate-limited.
//! * `run`: one placement of a command job, from rendezvous to result.
//!
//! Invariants:
//! 1. Each process leads its own process group and dies with the worker
//!    (`setpriv --pdeathsig KILL`, where installed): no orphan outlives it.
//! 2. The attempt succeeds when every process of every placement exited 0;
//!    the first non-zero exit fails it as [`FailureKind::Exited`], which
//!    restarts it while `max_restarts` allows.
//! 3. A failure anywhere, cancellation or the worker's loss stops every
//!    process: SIGTERM to its group, SIGKILL after the stop grace.
//! 4. A command that cannot start (missing program or folder) is the job's
//!    own error: restarting would fail the same way.
//! 5. On one worker, an attempt's processes start only after the previous
//!    attempt's have stopped.
//!
//! [`FailureKind::Exited`]: tessel_coordinator::jobs::FailureKind::Exited

mod echo;
pub mod env;
mod gang;
mod logs;
mod run;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One lock per command job id (module invariant 5).
pub(crate) type GangLocks = Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>;

/// A command job's processes as one worker runs them: what
/// [`crate::PreparedJob::command`] reads from a job's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLaunch {
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// The job's own environment variables (tessel's are added).
    pub env: Vec<(String, String)>,
    /// An existing folder on every host to run in; else the attempt's
    /// folder, holding `files`.
    pub workdir: Option<PathBuf>,
    /// Files shipped with the job, written into the attempt's folder.
    pub files: Vec<(PathBuf, Vec<u8>)>,
    /// Processes of the whole job.
    pub processes: u32,
    /// Processes each placement (worker) runs.
    pub processes_per_worker: u32,
    /// Devices per process.
    pub devices_per_process: u32,
    /// Given to the processes as `TESSEL_CHECKPOINT_DIR`.
    pub checkpoint_dir: Option<PathBuf>,
    /// Between SIGTERM and SIGKILL when the gang stops.
    pub stop_grace: Duration,
    /// The job's restart budget (`TORCHELASTIC_MAX_RESTARTS`).
    pub max_restarts: u32,
}
