use tessel_coordinator::jobs::FailureKind;
use tessel_coordinator::CoordinatorError;
use tessel_kv::KvError;
use tessel_topology::TopologyError;

use crate::runner::JobError;

/// What running a worker can fail with.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The plugin failed.
    #[error("PJRT: {0}")]
    Pjrt(#[from] tessel_pjrt::Error),
    /// Registration or the scheduler's keys failed.
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// The topology exchange failed.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The transfer layer failed.
    #[error("transfer: {0}")]
    Transfer(#[from] tessel_transfer::TransferError),
    /// A KV operation failed.
    #[error("{context}: {source}")]
    Kv {
        /// What the worker was doing.
        context: String,
        /// The KV's error.
        #[source]
        source: KvError,
    },
    /// The job's plan failed in this process, or the job failed elsewhere.
    #[error(transparent)]
    Job(#[from] JobError),
    /// This worker lost its registration while the process ran.
    #[error("the worker lost its registration")]
    Deregistered,
    /// Another live process holds this worker id.
    #[error("worker id `{worker}` is in use by a live worker: {holder}")]
    IdInUse {
        /// The worker id.
        worker: String,
        /// Who holds it (host, pid).
        holder: String,
    },
    /// A setting breaks a rule.
    #[error("{0}")]
    Config(String),
    /// A bug or a broken invariant.
    #[error("internal error: {0}")]
    Internal(String),
}

impl WorkerError {
    /// Whether a restart of the job may cure this failure (scheduler
    /// invariant 6): the loss of a peer, of the coordinators or of this
    /// worker's registration may; the job's own errors may not.
    pub fn kind(&self) -> FailureKind {
        match self {
            WorkerError::Job(e) => e.kind,
            WorkerError::Transfer(e) if e.is_peer_loss() => FailureKind::PeerLost,
            WorkerError::Topology(
                TopologyError::Missing { .. }
                | TopologyError::BuilderFailed(_)
                | TopologyError::Kv { .. },
            ) => FailureKind::PeerLost,
            WorkerError::Kv { .. } => FailureKind::PeerLost,
            // A plugin still waiting for other processes' keys at the
            // deadline: a peer did not come (a restart may cure it).
            WorkerError::Pjrt(tessel_pjrt::Error::CreateTimedOut { waiting, .. })
                if !waiting.is_empty() =>
            {
                FailureKind::PeerLost
            }
            WorkerError::Coordinator(CoordinatorError::Kv { .. }) => FailureKind::PeerLost,
            WorkerError::Coordinator(
                CoordinatorError::StaleIncarnation { .. } | CoordinatorError::UnknownWorker(_),
            )
            | WorkerError::Deregistered => FailureKind::WorkerLost,
            _ => FailureKind::Job,
        }
    }
}

/// The worker's one conversion of a KV error: what it was doing.
pub(crate) fn kv_err(context: &'static str) -> impl FnOnce(KvError) -> WorkerError {
    move |source| WorkerError::Kv {
        context: context.into(),
        source,
    }
}

/// The crate's result type.
pub type Result<T, E = WorkerError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_transfer::TransferError;

    /// A transfer that broke because a peer vanished restarts the job; a
    /// disagreement between ranks or a compile error fails it.
    #[test]
    fn peer_losses_are_told_from_the_jobs_own_errors() {
        let lost = WorkerError::Transfer(TransferError::Stream {
            peer: "10.77.0.5:41596".into(),
            reason: "no acknowledgement: connection lost".into(),
        });
        assert_eq!(lost.kind(), FailureKind::PeerLost);
        let aborted = WorkerError::Transfer(TransferError::Aborted {
            rank: 1,
            reason: "deadline".into(),
        });
        assert_eq!(aborted.kind(), FailureKind::PeerLost);
        let mismatch = WorkerError::Transfer(TransferError::Mismatch("sizes".into()));
        assert_eq!(mismatch.kind(), FailureKind::Job);
        let missing = WorkerError::Topology(TopologyError::Missing {
            job: "j".into(),
            missing: vec![1],
            after: std::time::Duration::from_secs(1),
        });
        assert_eq!(missing.kind(), FailureKind::PeerLost);
        assert_eq!(
            WorkerError::Job(JobError::job("program `p`: type mismatch")).kind(),
            FailureKind::Job
        );
        assert_eq!(WorkerError::Deregistered.kind(), FailureKind::WorkerLost);
    }

    /// A plugin still waiting for another process's keys at the deadline
    /// is a lost peer (a restart may cure it); one stuck elsewhere is the
    /// job's own failure, with the plugin's account in the message.
    #[test]
    fn a_client_creation_past_its_deadline_says_what_it_waited_for() {
        let timed_out = |waiting: Vec<String>| {
            WorkerError::Pjrt(tessel_pjrt::Error::CreateTimedOut {
                after: std::time::Duration::from_secs(120),
                waiting,
            })
        };
        let peer = timed_out(vec!["local_topology/cuda/1".into()]);
        assert_eq!(peer.kind(), FailureKind::PeerLost);
        assert!(
            peer.to_string()
                .contains("waiting for `local_topology/cuda/1`, which no process has written"),
            "{peer}"
        );
        assert_eq!(timed_out(vec![]).kind(), FailureKind::Job);
    }
}
