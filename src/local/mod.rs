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

pub use child::{exit_with_parent, Child};
pub use cluster::LocalCluster;
pub use ready::Ready;

use std::time::Duration;

/// What starting or talking to a child can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("starting {name}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} said nothing within {timeout:?}")]
    Silent { name: String, timeout: Duration },
    #[error("{name} exited ({status})")]
    Exited { name: String, status: String },
    #[error("writing to {name}: {source}")]
    Write {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Protocol(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error(transparent)]
    Kv(#[from] tessel_kv::KvError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
