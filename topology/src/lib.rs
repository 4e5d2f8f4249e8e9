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

mod collective;
mod error;
pub mod exchange;
pub mod keys;
mod mesh;
mod types;

pub use collective::{collective_id, random_id, Clique, CollectiveId, COLLECTIVE_ID_BYTES};
pub use error::{Result, TopologyError};
pub use exchange::exchange;
pub use mesh::Mesh;
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
