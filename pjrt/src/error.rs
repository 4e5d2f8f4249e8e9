//! The crate's error type.

use std::fmt;
use std::path::PathBuf;

use crate::ffi;

/// Status codes of `PJRT_Error` (absl status codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
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
    #[error("cannot load PJRT plugin {path}: {source}")]
    Load {
        path: PathBuf,
        #[source]
        source: libloading::Error,
    },
    #[error("{path} is not a PJRT plugin (no GetPjrtApi symbol): {source}")]
    NoEntryPoint {
        path: PathBuf,
        #[source]
        source: libloading::Error,
    },
    #[error("GetPjrtApi of {path} returned a null table")]
    NullApi { path: PathBuf },
    #[error(
        "PJRT plugin {path} implements C API {plugin_major}.{plugin_minor}; tessel needs {required_major}.x with x >= {required_minor}"
    )]
    IncompatibleVersion {
        path: PathBuf,
        plugin_major: i32,
        plugin_minor: i32,
        required_major: i32,
        required_minor: i32,
    },
    #[error("PJRT plugin does not provide {function} (its function table ends before it)")]
    MissingFunction { function: &'static str },
    #[error("{function} failed: {code}: {message}")]
    Pjrt {
        function: &'static str,
        code: ErrorCode,
        message: String,
    },
    #[error(
        "PJRT plugin `{name}` not found (looked in {searched}); install it with:\n    {install}"
    )]
    PluginNotFound {
        name: String,
        searched: String,
        install: String,
    },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
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
            _ => ErrorCode::Internal,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
