use tessel_kv::KvError;

/// What a coordinator operation can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoordinatorError {
    /// A KV operation failed.
    #[error("{context}: {source}")]
    Kv {
        /// What the coordinator was doing.
        context: String,
        /// The KV's error.
        #[source]
        source: KvError,
    },
    /// A newer registration of the worker took over.
    #[error("worker `{worker}` incarnation {incarnation} is stale (current: {current:?})")]
    StaleIncarnation {
        /// The worker.
        worker: String,
        /// The incarnation that acted.
        incarnation: u64,
        /// The current one, if any.
        current: Option<u64>,
    },
    /// No worker registered under that id.
    #[error("worker `{0}` is not registered")]
    UnknownWorker(String),
    /// The replica could not start (its storage, its address, its TLS).
    #[error("{0}")]
    Replica(String),
    /// The certificate is not a coordinator's.
    #[error("this certificate is {0}'s; a coordinator needs a coordinator certificate (`tessel certs issue --role coordinator`)")]
    NotACoordinator(String),
    /// An argument or setting breaks a rule.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was refused.
        what: String,
        /// Why.
        reason: String,
    },
    /// A stored record did not decode.
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What it was.
        what: String,
        /// What the decoder said.
        reason: String,
    },
}

impl CoordinatorError {
    pub(crate) fn kv(context: impl Into<String>) -> impl FnOnce(KvError) -> CoordinatorError {
        let context = context.into();
        move |source| CoordinatorError::Kv { context, source }
    }

    pub(crate) fn decode(what: &str) -> impl FnOnce(postcard::Error) -> CoordinatorError + '_ {
        move |e| CoordinatorError::Decode {
            what: what.into(),
            reason: e.to_string(),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = CoordinatorError> = std::result::Result<T, E>;
