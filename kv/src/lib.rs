//! tessel's key-value interface.
//!
//! The semantics are those of XLA's coordination service, which PJRT's
//! distributed-runtime callbacks expect — blocking get with a timeout,
//! insert without overwrite, directory listing, delete, increment,
//! barriers — plus compare-and-swap, leases and resumable watches, which
//! tessel's coordinator uses for liveness and job state.
//!
//! * [`KvStore`]: the async interface, one for all backends (the
//!   replicated store and etcd live in `tessel-kv-service`).
//! * [`state`]: the deterministic state machine every backend applies.
//! * [`AppliedState`]: applied state with the notifications blocking gets,
//!   barrier waits and watches need.
//! * [`MemoryKv`]: an in-memory test double (never a default).
//! * [`conformance`]: the behaviour every backend must show; each backend's
//!   tests run it.

mod applied;
pub mod conformance;
mod error;
mod memory;
pub mod state;
mod store;

pub use applied::AppliedState;
pub use error::{check_path_component, show_key, KvError, Result};
pub use memory::MemoryKv;
pub use state::{BarrierStatus, Event, KeyValue, Limits};
pub use store::{CasOutcome, KvStore, WatchStream};
