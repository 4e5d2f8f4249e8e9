//! tessel's device topology.
//!
//! * [`LocalTopology`]: what one process has (devices, host, transfer
//!   endpoint).
//! * [`GlobalTopology`]: every process of a job and its devices with global
//!   ids, built deterministically by [`GlobalTopology::build`] (pure).
//! * [`mod@exchange`]: the exchange of local topologies over the key-value
//!   service, with the semantics of XLA's `ExchangeTopologies`.
//! * [`Mesh`]: named axes over the global devices.
//! * [`CollectiveId`]: one id per clique of devices, agreed over the KV.
//!
//! The KV keys this crate writes are listed in [`keys`].
//!
//! # The modules in detail
//!
//! * **`tessel-topology`** (`topology/`).
//!   * `types` — `LocalTopology` (process index, process count, worker, host,
//!     boot id, optional slice, devices, transfer endpoint) and
//!     `GlobalTopology::build`, pure: global ids by slice, then process, then
//!     local hardware id; slices from explicit indices, else boot ids. Every
//!     decoded value is validated.
//!   * `exchange` — XLA's `ExchangeTopologies` over `KvStore`: insert own
//!     local topology (same bytes on restart accepted, different refused);
//!     process 0 lists and watches the others, builds, publishes a `Published`
//!     (topology or failure); the rest blocking-get it. Timeouts name the
//!     processes that never arrived. `exchange_shared` decodes the published
//!     value once for all of a process's callers (`shared::TopologyCache`).
//!     The global topology holds no names or addresses: `peer` reads one
//!     process's from its local topology (the job's directory), `directory`
//!     all of them.
//!   * `mesh` — `Mesh`: named axes over the devices in global-id order,
//!     refusing shapes whose innermost axis would split a host unevenly;
//!     `groups_along(axis)` gives the cliques of a collective.
//!   * `collective` — `CollectiveId` per `Clique` (sorted devices + stream):
//!     the owner of the lowest device generates and inserts; the rest
//!     blocking-get; reuse after.

mod collective;
mod error;
pub mod exchange;
pub mod keys;
mod mesh;
mod shared;
mod types;
mod wire;

pub use collective::{collective_id, random_id, Clique, CollectiveId, COLLECTIVE_ID_BYTES};
pub use error::{Result, TopologyError};
pub use exchange::{exchange, exchange_shared};
pub use mesh::{Mesh, MAX_DEVICES};
pub use shared::{Known, TopologyCache};
pub use types::{DeviceDescription, GlobalDevice, GlobalTopology, LocalTopology, ProcessEntry};

/// SHA-256 of `bytes`, in lowercase hex (KV keys of collective ids, the
/// topology digests workers publish).
pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest of a global topology every process publishes (SHA-256 of
/// its encoding, hex): equal digests, the same topology.
pub fn digest(t: &GlobalTopology) -> String {
    sha256_hex(&t.encode())
}
