//! tessel's transfer layer: moves tensors between workers over QUIC
//! (quinn, mutual TLS from the cluster CA, ALPN `tessel-transfer`) and,
//! for the bulk bytes between hosts, data channels that QUIC grants: TCP
//! in AES-128-GCM records ([`seal`]) or, on a trusted network, plain.
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
//!
//! # The modules in detail
//!
//! * **`tessel-transfer`** (`transfer/`).
//!   * `endpoint` — one `TransferEndpoint` per job process: `send_to(peer,
//!     tag, dtype, dims, bytes)` returns once the peer stored the array;
//!     `recv(from, tag)` / `recv_first(keys)` take it from the mailbox;
//!     `send_buffer` / `recv_buffer` move PJRT buffers. Peers with our boot id
//!     get the shared-memory path unless `force_network`.
//!   * `collective` — `Communicator` over `members: Vec<Peer>` (rank = index):
//!     every call first all-gathers `Descriptor`s around the ring (the barrier
//!     and the mismatch check), then runs ring steps of chunked messages, or,
//!     when every member is on this host, reads the members' arenas in place;
//!     `exchange` sends each rank its own message; a failure is broadcast as
//!     `abort` and breaks the communicator. See "Collectives".
//!   * `reduce` — sum/mean/max/min on f32, f64, f16, bf16, s32, s64 in place;
//!     `reference_reduce` applies the ring's exact order in one process;
//!     `fold_onto` folds one segment in that order in one place (arenas); the
//!     ring's segments and steps, shared with the benchmark's TCP ring.
//!   * `memory` — opt-in glibc tuning for large transfers, huge-page advice,
//!     `copy_streaming` (SSE2 non-temporal stores).

pub mod channel;
mod collective;
pub mod dtype;
mod endpoint;
mod error;
pub mod header;
pub mod memory;
pub mod reduce;
pub mod seal;
pub mod shm;
pub mod stripe;
pub mod testing;

pub use channel::Encryption;
pub use collective::{
    CollectiveBuffer, CollectiveConfig, CollectiveKind, Communicator, Descriptor, DescriptorFrame,
};
pub use endpoint::{
    Directory, Members, Peer, Received, TransferConfig, TransferEndpoint, ALPN,
    GSO_MAX_UDP_PAYLOAD, MIN_SPARE,
};
pub use error::{Result, TransferError};
pub use header::TransferHeader;
pub use reduce::ReduceOp;
