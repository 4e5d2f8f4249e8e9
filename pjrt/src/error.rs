//! The crate's error type.

use std::fmt;
use std::path::PathBuf;

use crate::ffi;

/// Status codes of `PJRT_Error` (absl status codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The operation was cancelled.
    Cancelled,
    /// An error without a better code.
    Unknown,
    /// The caller passed a bad argument.
    InvalidArgument,
    /// A deadline passed first.
    DeadlineExceeded,
    /// Something named was not found.
    NotFound,
    /// Something being created already exists.
    AlreadyExists,
    /// The caller may not do this.
    PermissionDenied,
    /// Out of memory or another resource.
    ResourceExhausted,
    /// The system is not in the state this needs.
    FailedPrecondition,
    /// Aborted, often by a concurrency conflict.
    Aborted,
    /// Past a valid range.
    OutOfRange,
    /// The plugin does not implement this.
    Unimplemented,
    /// A bug in the plugin or the caller.
    Internal,
    /// Temporarily unavailable; retrying may help.
    Unavailable,
    /// Data was lost or corrupted.
    DataLoss,
    /// The caller has no valid credentials.
    Unauthenticated,
}

impl ErrorCode {
    /// The code a plugin reported; codes we do not know become `Unknown`.
    pub fn from_raw(code: ffi::PJRT_Error_Code) -> Self {
        use ErrorCode::*;
        match code {
            ffi::PJRT_Error_Code_CANCELLED => Cancelled,
            ffi::PJRT_Error_Code_INVALID_ARGUMENT => InvalidArgument,
            ffi::PJRT_Error_Code_DEADLINE_EXCEEDED => DeadlineExceeded,
            ffi::PJRT_Error_Code_NOT_FOUND => NotFound,
            ffi::PJRT_Error_Code_ALREADY_EXISTS => AlreadyExists,
            ffi::PJRT_Error_Code_PERMISSION_DENIED => PermissionDenied,
            ffi::PJRT_Error_Code_RESOURCE_EXHAUSTED => ResourceExhausted,
            ffi::PJRT_Error_Code_FAILED_PRECONDITION => FailedPrecondition,
            ffi::PJRT_Error_Code_ABORTED => Aborted,
            ffi::PJRT_Error_Code_OUT_OF_RANGE => OutOfRange,
            ffi::PJRT_Error_Code_UNIMPLEMENTED => Unimplemented,
            ffi::PJRT_Error_Code_INTERNAL => Internal,
            ffi::PJRT_Error_Code_UNAVAILABLE => Unavailable,
            ffi::PJRT_Error_Code_DATA_LOSS => DataLoss,
            ffi::PJRT_Error_Code_UNAUTHENTICATED => Unauthenticated,
            _ => Unknown,
        }
    }

    /// The raw `PJRT_Error_Code`.
    pub fn to_raw(self) -> ffi::PJRT_Error_Code {
        use ErrorCode::*;
        match self {
            Cancelled => ffi::PJRT_Error_Code_CANCELLED,
            Unknown => ffi::PJRT_Error_Code_UNKNOWN,
            InvalidArgument => ffi::PJRT_Error_Code_INVALID_ARGUMENT,
            DeadlineExceeded => ffi::PJRT_Error_Code_DEADLINE_EXCEEDED,
            NotFound => ffi::PJRT_Error_Code_NOT_FOUND,
            AlreadyExists => ffi::PJRT_Error_Code_ALREADY_EXISTS,
            PermissionDenied => ffi::PJRT_Error_Code_PERMISSION_DENIED,
            ResourceExhausted => ffi::PJRT_Error_Code_RESOURCE_EXHAUSTED,
            FailedPrecondition => ffi::PJRT_Error_Code_FAILED_PRECONDITION,
            Aborted => ffi::PJRT_Error_Code_ABORTED,
            OutOfRange => ffi::PJRT_Error_Code_OUT_OF_RANGE,
            Unimplemented => ffi::PJRT_Error_Code_UNIMPLEMENTED,
            Internal => ffi::PJRT_Error_Code_INTERNAL,
            Unavailable => ffi::PJRT_Error_Code_UNAVAILABLE,
            DataLoss => ffi::PJRT_Error_Code_DATA_LOSS,
            Unauthenticated => ffi::PJRT_Error_Code_UNAUTHENTICATED,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Everything that can go wrong in this crate. Plugin errors keep the
/// function that failed, the plugin's code and its message.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plugin's shared library would not load.
    #[error("cannot load PJRT plugin {path}: {source}")]
    Load {
        /// The library's path.
        path: PathBuf,
        /// What the dynamic loader said.
        #[source]
        source: libloading::Error,
    },
    /// The library has no `GetPjrtApi`.
    #[error("{path} is not a PJRT plugin (no GetPjrtApi symbol): {source}")]
    NoEntryPoint {
        /// The library's path.
        path: PathBuf,
        /// What the dynamic loader said.
        #[source]
        source: libloading::Error,
    },
    /// `GetPjrtApi` returned null.
    #[error("GetPjrtApi of {path} returned a null table")]
    NullApi {
        /// The library's path.
        path: PathBuf,
    },
    /// The plugin's C API version is not one tessel can use.
    #[error(
        "PJRT plugin {path} implements C API {plugin_major}.{plugin_minor}; tessel needs {required_major}.x with x >= {required_minor}"
    )]
    IncompatibleVersion {
        /// The library's path.
        path: PathBuf,
        /// The plugin's major version.
        plugin_major: i32,
        /// The plugin's minor version.
        plugin_minor: i32,
        /// The major version tessel needs.
        required_major: i32,
        /// The least minor version tessel needs.
        required_minor: i32,
    },
    /// The plugin's function table lacks a function tessel calls.
    #[error("PJRT plugin does not provide {function} (its function table ends before it)")]
    MissingFunction {
        /// The function's name.
        function: &'static str,
    },
    /// A PJRT function returned an error.
    #[error("{function} failed: {code}: {message}")]
    Pjrt {
        /// The function's name.
        function: &'static str,
        /// The plugin's status code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },
    /// No plugin by that name is installed.
    #[error(
        "PJRT plugin `{name}` not found (looked in {searched}); install it with:\n    {install}"
    )]
    PluginNotFound {
        /// The name asked for.
        name: String,
        /// Where tessel looked.
        searched: String,
        /// The command that installs it.
        install: String,
    },
    /// `PJRT_Client_Create` did not return within the caller's limit; the
    /// plugin goes on, on a thread the caller abandoned.
    #[error(
        "the plugin's client creation did not finish within {after:?}; {}",
        waits_text(waiting)
    )]
    CreateTimedOut {
        /// The limit.
        after: std::time::Duration,
        /// The keys the plugin was blocked on when the limit passed.
        waiting: Vec<String>,
    },
    /// tessel refused an argument before calling the plugin.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The PJRT status code this error corresponds to.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Pjrt { code, .. } => *code,
            Error::InvalidArgument(_) => ErrorCode::InvalidArgument,
            Error::PluginNotFound { .. } => ErrorCode::NotFound,
            Error::MissingFunction { .. } => ErrorCode::Unimplemented,
            Error::IncompatibleVersion { .. } => ErrorCode::FailedPrecondition,
            Error::CreateTimedOut { .. } => ErrorCode::DeadlineExceeded,
            _ => ErrorCode::Internal,
        }
    }
}

fn waits_text(keys: &[String]) -> String {
    if keys.is_empty() {
        "it was not waiting for a key-value key (it waits on something else: a device, a driver, a peer's network)".into()
    } else {
        format!(
            "it was waiting for {}, which no process has written",
            keys.iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
