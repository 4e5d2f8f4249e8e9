use tessel_kv::KvError;

/// What a coordinator operation can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoordinatorError {
    #[error("{context}: {source}")]
    Kv {
        context: String,
        #[source]
        source: KvError,
    },
    #[error("worker `{worker}` incarnation {incarnation} is stale (current: {current:?})")]
    StaleIncarnation {
        worker: String,
        incarnation: u64,
        current: Option<u64>,
    },
    #[error("worker `{0}` is not registered")]
    UnknownWorker(String),
    #[error("invalid {what}: {reason}")]
    Invalid { what: String, reason: String },
    #[error("cannot decode {what}: {reason}")]
    Decode { what: String, reason: String },
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

pub type Result<T, E = CoordinatorError> = std::result::Result<T, E>;
