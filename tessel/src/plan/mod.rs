//! Running a job's plan in one of its processes.
//!
//! A [`JobBundle`] is what travels to the workers (`jobs/{job}/spec`): the
//! spec's text and the files it names. Each process validates it again,
//! compiles the programs for its local devices, initialises its block of
//! every array ([`crate::init`]) and runs the plan `steps` times. Between
//! steps an array stays where the last step left it ([`resident`]): on the
//! devices as a program's pieces, or on the host after a collective.
//! `execute` places its inputs by the program's own sharding annotations,
//! over the process's devices or, for a global program, as this process's
//! part of one program over every device of the job; the collectives run
//! over the job's [`Communicator`](tessel_transfer::Communicator).
//!
//! Invariants:
//! 1. Every process holds, for each array, the block its devices cover
//!    ([`crate::layout`]); after `all_reduce` every process holds the same
//!    bytes (the communicator's fixed reduction order).
//! 2. Process 0 writes the reports; every value it reports is its own
//!    block, so a reported scalar should be one the plan all-reduced.
//! 3. A process never hands out a partial step: an error in any step ends
//!    the run with that error, naming the step (`plan[i]`) and the array.

mod bundle;
mod execute;
mod process;
pub mod resident;
mod run;
pub mod suspend;

pub use bundle::{JobBundle, MAX_BUNDLE, MAX_FETCHABLE};
pub use process::{
    scalar_f64, written_arrays, PlanTimings, ProcessBlock, ProcessPlan, HOST_STAGED_ENV,
};
pub use run::{run_job_process, PlanRunner, ProcessResult, StepReport};

use tessel_coordinator::jobs::FailureKind;

use crate::job::JobSpecError;
use crate::program::RunError;

/// Why a process's run of the plan failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The job's bundle does not decode.
    #[error("bad job bundle: {0}")]
    Bundle(String),
    /// The spec in the bundle does not validate.
    #[error(transparent)]
    Spec(#[from] JobSpecError),
    /// A program did not compile.
    #[error("program `{program}`: {source}")]
    Compile {
        /// The program.
        program: String,
        /// The compiler's error.
        #[source]
        source: RunError,
    },
    /// An array could not be initialized.
    #[error("arrays.{array}: {reason}")]
    Array {
        /// The array.
        array: String,
        /// Why.
        reason: String,
    },
    /// A step of the plan failed.
    #[error("step {step}, plan[{index}]: {reason}")]
    Step {
        /// The step number.
        step: u64,
        /// The position in the plan.
        index: usize,
        /// Why.
        reason: String,
    },
    /// A collective between the processes failed: in a step, a
    /// checkpoint or the final gather.
    #[error("{what}: {source}")]
    Collective {
        /// What was being done.
        what: String,
        /// The transfer error.
        #[source]
        source: tessel_transfer::TransferError,
    },
    /// The coordinators' key-value service failed.
    #[error("{what}: {source}")]
    Kv {
        /// What was being done.
        what: String,
        /// The KV's error.
        #[source]
        source: tessel_kv::KvError,
    },
    /// A checkpoint could not be written or restored.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// Stopped after checkpointing at `step` for a preemption notice; the
    /// job resumes from there.
    #[error("suspended at step {step} for a preemption notice: {reason}")]
    Suspended {
        /// The step checkpointed.
        step: u64,
        /// The notice's reason.
        reason: String,
    },
    /// The suspend step was learnt too late ([`suspend`] invariant 2).
    #[error("step {step}: the suspend step {at} had already passed; restarting from the newest periodic checkpoint")]
    SuspendMissed {
        /// Where this process was.
        step: u64,
        /// The step chosen.
        at: u64,
    },
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

impl PlanError {
    /// Whether a restart may cure it (scheduler invariant 6): a lost peer
    /// or coordinator may; everything else is the job's own error.
    pub fn kind(&self) -> FailureKind {
        match self {
            PlanError::Collective { source, .. } if source.is_peer_loss() => FailureKind::PeerLost,
            PlanError::Kv { .. } => FailureKind::PeerLost,
            PlanError::Suspended { .. } | PlanError::SuspendMissed { .. } => FailureKind::Suspended,
            _ => FailureKind::Job,
        }
    }

    /// The same error, said to have happened at `plan[index]` of `step`.
    fn at(self, step: u64, index: usize) -> PlanError {
        match self {
            PlanError::Collective { what, source } => PlanError::Collective {
                what: format!("step {step}, plan[{index}]: {what}"),
                source,
            },
            e => PlanError::Step {
                step,
                index,
                reason: e.to_string(),
            },
        }
    }
}
