//! tessel's transfer layer: moves tensors between workers over QUIC
//! (quinn, mutual TLS from the cluster CA, ALPN `tessel-transfer`).
//!
//! - Point to point ([`TransferEndpoint::send_to`] /
//!   [`TransferEndpoint::recv`]) of host bytes with a validated header
//!   ([`header`], sans-IO); peers on the same host (same boot id) exchange
//!   payloads through shared memory.
//! - Collectives ([`Communicator`]): ring all-reduce, reduce-scatter,
//!   all-gather, broadcast, barrier, or, between processes of one host,
//!   the same calls over shared-memory arenas, and an in-place all-reduce
//!   on a [`CollectiveBuffer`] that peers on this host read where the
//!   caller wrote it; reductions in [`reduce`]
//!   (sans-IO, with the single-process reference, which both paths equal
//!   bit for bit).
//! - Host memory for large payloads ([`memory`]): allocator settings, huge
//!   pages, streaming copies.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tessel_transfer::{CollectiveConfig, Communicator, Peer, ReduceOp, TransferConfig, TransferEndpoint};
//! use tessel_pjrt::ElementType;
//! # async fn example(peers: Vec<std::net::SocketAddr>, rank: u32) -> tessel_transfer::Result<()> {
//! let tls = tessel_tls::TlsFiles::load("tls".as_ref()).unwrap();
//! let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok();
//! let cfg = TransferConfig { boot_id: boot_id.clone(), ..TransferConfig::default() };
//! // Each process binds its endpoint and learns the others' addresses
//! // (tessel's workers publish them in the job's topology).
//! let endpoint = Arc::new(TransferEndpoint::bind("0.0.0.0:0".parse().unwrap(), rank, Some(&tls), cfg)?);
//! let members = peers.into_iter().map(|a| Peer::new(a, None)).collect();
//! let mut comm = Communicator::new(endpoint, members, 0, CollectiveConfig::default())?;
//! let grads: Vec<f32> = vec![0.5; 1024];
//! let mean = comm
//!     .all_reduce(ReduceOp::Mean, ElementType::F32, bytemuck::cast_slice(&grads).to_vec())
//!     .await?;
//! assert_eq!(mean.len(), 4096);
//! # Ok(()) }
//! ```

mod collective;
pub mod dtype;
mod endpoint;
mod error;
pub mod header;
pub mod memory;
pub mod reduce;
pub mod shm;
pub mod stripe;
pub mod testing;

pub use collective::{
    CollectiveBuffer, CollectiveConfig, CollectiveKind, Communicator, Descriptor, DescriptorFrame,
};
pub use endpoint::{
    Peer, Received, TransferConfig, TransferEndpoint, ALPN, GSO_MAX_UDP_PAYLOAD, MIN_SPARE,
};
pub use error::{Result, TransferError};
pub use header::TransferHeader;
pub use reduce::ReduceOp;
