//! tessel's transfer layer: moves tensors between workers over QUIC
//! (quinn, mutual TLS from the cluster CA, ALPN `tessel-transfer`).
//!
//! - Point to point ([`TransferEndpoint::send_to`] /
//!   [`TransferEndpoint::recv`]) of host bytes with a validated header
//!   ([`header`], sans-IO); peers on the same host (same boot id) exchange
//!   payloads through shared memory.
//! - Collectives ([`Communicator`]): ring all-reduce, reduce-scatter,
//!   all-gather, broadcast, barrier; reductions in [`reduce`] (sans-IO,
//!   with the single-process reference).

mod collective;
mod endpoint;
mod error;
pub mod header;
pub mod reduce;
pub mod shm;
pub mod testing;

pub use collective::{CollectiveConfig, Communicator, Descriptor};
pub use endpoint::{Peer, Received, TransferConfig, TransferEndpoint, ALPN};
pub use error::{Result, TransferError};
pub use header::TransferHeader;
pub use reduce::ReduceOp;
