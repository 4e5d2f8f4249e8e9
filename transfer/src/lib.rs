//! tessel's transfer layer: moves tensors between workers over QUIC
//! (quinn, mutual TLS from the cluster CA, ALPN `tessel-transfer`).
//!
//! Built so far: point to point ([`TransferEndpoint::send`] /
//! [`TransferEndpoint::recv`]) of host bytes with a validated header
//! ([`header`], sans-IO). Still to come (issue 5): PJRT buffers directly,
//! the same-host shared-memory path, and the collectives.

mod endpoint;
mod error;
pub mod header;

pub use endpoint::{Received, TransferConfig, TransferEndpoint, ALPN};
pub use error::{Result, TransferError};
pub use header::TransferHeader;
