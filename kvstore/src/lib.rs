//! tessel's key-value service.
//!
//! The semantics are those of XLA's coordination service, which PJRT's
//! distributed-runtime callbacks expect — blocking get with a timeout,
//! insert without overwrite, directory listing, delete, increment,
//! barriers — plus compare-and-swap, leases and resumable watches, which
//! tessel's coordinator uses for liveness and job state.
//!
//! * [`state`]: the deterministic state machine every backend applies.
//! * [`KvStore`]: the async interface, one for all backends.
//! * `etcd::EtcdKv` (feature `etcd`): the same interface over etcd v3.
//! * [`MemoryKv`]: an in-memory test double (never a default).
//! * [`conformance`]: the behaviour every backend must show; each backend's
//!   tests run it.
//! * [`tls`] and [`authz`]: certificates with roles, and what each role may
//!   ask of a replica.

pub mod authz;
pub mod conformance;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
mod local;
mod memory;
pub mod net;
pub mod raft;
pub mod state;
mod store;
pub mod tls;
pub mod wire;

pub use error::{check_path_component, show_key, KvError, Result};
pub use local::LocalState;
pub use memory::MemoryKv;
pub use state::{BarrierStatus, Event, KeyValue, Limits};
pub use store::{CasOutcome, KvStore, WatchStream};
