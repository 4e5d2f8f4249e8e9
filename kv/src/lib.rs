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
//! * [`MemoryKv`]: an in-memory test double (never a default);
//!   [`CountingKv`] counts what passes through it.
//! * [`conformance`]: the behaviour every backend must show; each backend's
//!   tests run it.
//!
//! # The modules in detail
//!
//! * **`tessel-kv`** (`kv/`).
//!   * `state` — `KvState`, the deterministic state machine: insert (no
//!     overwrite), put, delete, delete-prefix, list, increment,
//!     compare-and-swap, leases, barriers, one revision per change, events of
//!     the last `history_limit` revisions kept for watches. Time enters only as
//!     `Request::now_ms` (the proposer's clock, whole milliseconds rounded
//!     down), so replicas agree. `KvState` is the small part (revision, clock,
//!     leases, decided barriers until 10 minutes past their deadline); pairs
//!     and events live in `Tables` (`MemTables` in memory; `SmTables` on disk).
//!     `MAX_KEY` and `MAX_VALUE` are the limits every other size derives from.
//!   * `AppliedState<S: TablesMut>` — a `KvState` and its tables behind one
//!     lock, with notifications for blocking gets, barrier waits and watches.
//!     Watchers share each batch's events (one `Arc<[Event]>` per batch on a
//!     broadcast channel of 1,024 batches) and copy only what is under their
//!     prefix.
//!   * `KvStore` (async trait) — the one interface of every backend;
//!     `conformance::run_all` is the behaviour each backend must pass;
//!     `MemoryKv` is the test double.

mod applied;
pub mod conformance;
mod counting;
mod error;
mod memory;
pub mod state;
mod store;
mod watchers;

pub use applied::AppliedState;
pub use counting::CountingKv;
pub use error::{check_path_component, show_key, KvError, Result};
pub use memory::MemoryKv;
pub use state::{BarrierStatus, BatchPut, Event, KeyValue, Limits};
pub use store::{check_chosen_lease, CasOutcome, KvStore, Listing, WatchStream, MAX_CHOSEN_LEASE};
