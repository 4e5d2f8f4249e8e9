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
//!
//! # Command jobs
//!
//! A spec with `command` instead of a plan (`tessel/src/job/command.rs` validates
//! it) is placed like any job, one placement per worker of
//! `processes_per_worker` processes. The worker, seeing a command in the
//! bundle (`PreparedJob::command`), creates no PJRT client: it writes the
//! shipped files into the attempt's folder under `--work-dir`, takes the
//! job's gang lock (an earlier attempt's processes here must have stopped),
//! and placement 0 picks two free ports on its transfer address and inserts
//! `jobs/{attempt}/rendezvous` (`host jax_port torch_port`); the others read
//! it. `command::env` (pure) gives each process torchrun's variables
//! (`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `GROUP_WORLD_SIZE`, `ROLE_RANK`,
//! `ROLE_WORLD_SIZE`, `ROLE_NAME`, `TORCHELASTIC_RESTART_COUNT`,
//! `TORCHELASTIC_MAX_RESTARTS`, `TORCHELASTIC_RUN_ID`), JAX's
//! (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`,
//! `JAX_LOCAL_DEVICE_IDS` off CPU) and tessel's (`TESSEL_JOB_ID`,
//! `TESSEL_ATTEMPT`, `TESSEL_PROCESS_INDEX`, `TESSEL_NUM_PROCESSES`,
//! `TESSEL_LOCAL_RANK`, `TESSEL_WORKER_ID`, `TESSEL_WORK_DIR`,
//! `TESSEL_CHECKPOINT_DIR`, `TESSEL_PREEMPT_FILE`, `TESSEL_COORDINATORS`,
//! `TESSEL_TLS_DIR`); a job's `env` cannot set these. `gang` starts each process as the leader of its own
//! process group, through `setpriv --pdeathsig KILL` so it dies with the
//! worker, with stdout and stderr piped to `logs`, which ships lines in
//! chunks of ≤ 32 KiB every 200 ms to `jobs/{id}/logs/{attempt}/{rank}/{seq}`,
//! deleting chunks older than the newest 64, and keeps each process's last
//! 12 lines; `echo` prints each line on the worker's stdout as
//! `[JOB@ATTEMPT pRANK] line` within a token bucket per job (512 KiB/s, 2 MiB
//! bursts; lines over it are counted and the count printed later). The placement publishes `transfer_ready` once its processes are
//! started (the scheduler's Running) and its `result` once all exited 0 (its
//! Succeeded). The first non-zero exit records an `Exited` failure naming the
//! process, its code or signal and its last lines; a failure elsewhere,
//! `done` or a lost registration stops the gang (SIGTERM to each group,
//! SIGKILL after `stop_grace_ms`).

mod echo;
pub mod env;
mod gang;
mod logs;
mod run;

pub(crate) use run::attempt_of;

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
