//! `tessel` processes on this machine: the one harness that `tessel
//! local`, the benchmarks and the process-level tests start children
//! with.
//!
//! * [`Ready`]: the JSON line a daemon prints once it serves — the only
//!   thing a launcher reads from it.
//! * [`Child`]: one child process, killed when dropped, stdout read with
//!   deadlines.
//! * [`LocalCluster`]: coordinators and workers on loopback.

mod child;
mod cluster;
mod ready;
pub mod scratch;

pub use child::{exit_with_parent, Child};
pub use cluster::LocalCluster;
pub use ready::Ready;

use std::time::Duration;

/// What starting or talking to a child can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The child could not be started.
    #[error("starting {name}: {source}")]
    Spawn {
        /// The child's name.
        name: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The child printed no readiness line in time.
    #[error("{name} said nothing within {timeout:?}")]
    Silent {
        /// The child's name.
        name: String,
        /// How long it was given.
        timeout: Duration,
    },
    /// The child exited before it was ready.
    #[error("{name} exited ({status})")]
    Exited {
        /// The child's name.
        name: String,
        /// How it exited.
        status: String,
    },
    /// Writing to the child's stdin failed.
    #[error("writing to {name}: {source}")]
    Write {
        /// The child's name.
        name: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The child said something unexpected.
    #[error("{0}")]
    Protocol(String),
    /// Certificates could not be made or read.
    #[error("TLS: {0}")]
    Tls(String),
    /// A KV operation failed.
    #[error(transparent)]
    Kv(#[from] tessel_kv::KvError),
    /// A file or pipe failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
