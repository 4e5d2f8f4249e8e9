//! tessel's network plumbing, shared by the key-value service
//! (`tessel-kvstore`) and the transfer layer (`tessel-transfer`) without
//! either depending on the other:
//!
//! * [`tls`]: the cluster CA, per-node certificates with a role and a
//!   name, the verifiers that check them, and QUIC's TLS configurations.
//! * [`udp_socket`]: a UDP socket with the buffer sizes QUIC wants.

use std::net::SocketAddr;

pub mod tls;

/// A UDP socket bound to `addr` that asks for `buffer`-byte send and
/// receive buffers (best effort: the kernel caps both, and a smaller
/// buffer only drops more under load); an IPv6 wildcard takes IPv4 peers
/// too where the system allows, as quinn's own constructors do.
pub fn udp_socket(addr: SocketAddr, buffer: usize) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        if let Err(e) = socket.set_only_v6(false) {
            tracing::debug!(%e, "unable to make the socket dual-stack");
        }
    }
    let _ = socket.set_recv_buffer_size(buffer);
    let _ = socket.set_send_buffer_size(buffer);
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Checks a certificate name: 1–128 printable ASCII bytes without `/` or
/// spaces (it becomes part of a `tessel://` URI and of key paths).
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 128
        || !name.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
    {
        return Err(format!(
            "name `{}` must be 1-128 printable ASCII characters without `/` or spaces",
            name.escape_debug()
        ));
    }
    Ok(())
}
