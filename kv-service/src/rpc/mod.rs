//! QUIC transport: one bidirectional stream per request over pooled
//! connections, every call with a deadline.
//!
//! Invariants:
//! 1. A bad stream (oversized or malformed frame) is reset alone; the
//!    connection and the server keep serving every other stream.
//! 2. At most one connection per peer address is kept; a closed one is
//!    replaced on the next call, by one dial that every call finding no
//!    connection meanwhile waits for.
//! 3. A one-frame stream is read to its end when the end arrived with the
//!    frame; one dropped earlier sends STOP_SENDING.
//! 4. A call gives up on a peer silent for [`SILENCE`] (a killed process
//!    sends no close) at every step after the dial: waiting for a stream,
//!    sending, reading the answer; the connection stays until its idle
//!    timeout, and a dial gives up after `tessel_tls::HANDSHAKE_TIMEOUT`. While
//!    it waits it probes a peer silent for [`PROBE_AFTER`], so a live one
//!    is never silent that long, however rarely idle connections ping.
//! 5. A frame is copied once on each side: quinn is handed the encoded
//!    buffer itself (a copy of a written slice, in a fresh allocation,
//!    was a fifth of the leader's CPU when 4,096 hosts read one 66 KB
//!    value), and a frame is read into a buffer not zeroed first.
//! 6. A server's QUIC stack runs on a thread of its own (`io_thread`): a
//!    replica busy with requests is slow to answer but never silent.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use quinn::{Endpoint, RecvStream, SendStream, VarInt};
use serde::Serialize;

use crate::wire::{self, FrameError, WireRequest, RESET_FRAME_TOO_LARGE, RESET_MALFORMED};
use tessel_tls::{peer_identity, Identity};

mod io_thread;
pub(crate) use io_thread::IoThread;
mod peer;
mod silence;
pub use peer::{check_host_port, NamedPeer, PeerClient, RESOLVE_TTL};
pub(crate) use silence::Watched;
pub use silence::{Link, PROBE_AFTER, SILENCE};
#[cfg(test)]
mod tests;

/// Transport failures.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NetError {
    /// A peer's `HOST:PORT` does not resolve (it is retried later).
    #[error("cannot resolve {target}: {reason}")]
    Resolve {
        /// The peer as configured.
        target: String,
        /// Why.
        reason: String,
    },
    /// The connection could not be made.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The peer did not answer in time.
    #[error("no answer from {addr} within {after:?}")]
    Timeout {
        /// The peer.
        addr: SocketAddr,
        /// How long it was given.
        after: Duration,
    },
    /// The stream broke.
    #[error("stream to {addr}: {reason}")]
    Stream {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// A frame was too large or did not decode.
    #[error("{0}")]
    Frame(#[from] FrameError),
}

/// Reads one frame; `None` when the peer finished the stream cleanly.
pub async fn read_frame(recv: &mut RecvStream, max: usize) -> Result<Option<Vec<u8>>, ReadError> {
    let mut header = [0u8; 4];
    match recv.read_exact(&mut header).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(ReadError::Io(e.to_string())),
    }
    let len = wire::frame_len(header, max).map_err(ReadError::Frame)?;
    // Invariant 5: the body as quinn's chunks arrive, into one buffer
    // that is not zeroed first.
    let mut body = Vec::with_capacity(len);
    while body.len() < len {
        match recv.read_chunk(len - body.len(), true).await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(ReadError::Io(format!(
                    "the stream ended {} bytes into a frame of {len}",
                    body.len()
                )))
            }
            Err(e) => return Err(ReadError::Io(e.to_string())),
        }
    }
    Ok(Some(body))
}

/// Takes the peer's end of stream when it has already arrived, without
/// waiting for it (invariant 3).
fn take_end(recv: &mut RecvStream) {
    let mut probe = [0u8; 1];
    let _ = recv.read(&mut probe).now_or_never();
}

/// [`read_frame`] from a stream of `link`, given up when the peer falls
/// silent (invariant 4).
pub async fn read_frame_from(
    link: &Link,
    recv: &mut RecvStream,
    max: usize,
) -> Result<Option<Vec<u8>>, ReadError> {
    link.unless_silent(read_frame(recv, max))
        .await
        .unwrap_or_else(|| Err(ReadError::Io(silence::silent_reason())))
}

/// Why a frame could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// Too large or undecodable.
    #[error("{0}")]
    Frame(FrameError),
    /// The stream failed.
    #[error("{0}")]
    Io(String),
}

/// Encodes and writes one frame.
pub async fn write_frame<T: Serialize>(send: &mut SendStream, msg: &T) -> Result<(), String> {
    let frame = wire::encode(msg, wire::MAX_FRAME).map_err(|e| e.to_string())?;
    // Invariant 5: quinn takes the buffer itself.
    send.write_chunk(bytes::Bytes::from(frame))
        .await
        .map_err(|e| e.to_string())
}

/// Socket buffers asked for (the kernel caps them at `net.core.rmem_max`
/// and `wmem_max`). With the default ~208 KiB a replica's socket dropped
/// datagrams when 64 clients' requests arrived while its one thread was
/// busy (`RcvbufErrors` in `/proc/net/snmp`: 97–155 in a 25 s benchmark),
/// and each drop cost a client QUIC's loss-recovery wait.
pub const SOCKET_BUFFER: usize = 4 << 20;

/// A QUIC endpoint on `addr` on a [`tessel_tls::udp_socket`] with
/// [`SOCKET_BUFFER`]-byte buffers: a server when `server` is given, its
/// drivers on the process's QUIC thread (invariant 6); a client's on the
/// caller's runtime.
pub fn endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<Endpoint> {
    let io = match server {
        Some(_) => Some(IoThread::shared()?),
        None => None,
    };
    endpoint_on(addr, server, io)
}

/// [`endpoint`], its drivers on `io` where given.
fn endpoint_on(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
    io: Option<Arc<IoThread>>,
) -> std::io::Result<Endpoint> {
    let runtime: Arc<dyn quinn::Runtime> = match io {
        Some(io) => io,
        None => Arc::new(quinn::TokioRuntime),
    };
    Endpoint::new(
        quinn::EndpointConfig::default(),
        server,
        tessel_tls::udp_socket(addr, SOCKET_BUFFER)?,
        runtime,
    )
}

/// Who sent a request: the connection's address and the identity its
/// certificate carries.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    /// The connection's remote address.
    pub addr: SocketAddr,
    /// What its certificate says it is.
    pub identity: Arc<Identity>,
}

/// What a server does with one decoded request: writes its answer frames
/// to `send` (one, or several for a watch), reading further frames from
/// `recv` where the request [continues](WireRequest::continues).
pub trait Handler: Send + Sync + 'static {
    /// Answers `req` from `peer` on `send`.
    fn handle(
        self: Arc<Self>,
        req: WireRequest,
        send: SendStream,
        recv: RecvStream,
        peer: PeerInfo,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
}

/// Accepts connections on `endpoint` (made by [`endpoint`] with a server
/// configuration) until it closes: accepting and the handshakes on the
/// QUIC thread, as its drivers (invariant 6: a busy replica still
/// completes a dial within its deadline); each connection's requests on
/// the caller's runtime.
pub async fn serve<H: Handler>(endpoint: Endpoint, handler: Arc<H>) {
    serve_on(endpoint, handler, &server_thread()).await
}

/// The QUIC thread a server's endpoint runs on (invariant 6). [`endpoint`]
/// started the shared thread, so this finds it; were it gone, the caller's
/// runtime stands in: slower under load, not wrong.
pub(crate) fn server_thread() -> Arc<IoThread> {
    IoThread::shared().unwrap_or_else(|_| Arc::new(IoThread::on(tokio::runtime::Handle::current())))
}

/// [`serve`] for an endpoint whose drivers run on `io`.
async fn serve_on<H: Handler>(endpoint: Endpoint, handler: Arc<H>, io: &IoThread) {
    let requests = tokio::runtime::Handle::current();
    let _ = io
        .spawn_here(async move {
            while let Some(incoming) = endpoint.accept().await {
                let handler = handler.clone();
                let requests = requests.clone();
                tokio::spawn(async move {
                    let from = incoming.remote_address();
                    match incoming.await {
                        Ok(conn) => drop(requests.spawn(serve_connection(conn, handler))),
                        Err(e) => tracing::warn!(%from, "refused a connection: {e}"),
                    }
                });
            }
        })
        .await;
}

/// Serves the streams of `conn` until it closes.
async fn serve_connection<H: Handler>(conn: quinn::Connection, handler: Arc<H>) {
    let peer = PeerInfo {
        addr: conn.remote_address(),
        identity: Arc::new(peer_identity(&conn)),
    };
    let mut credit = tessel_tls::StreamCredit::new(&conn);
    while let Ok((send, recv)) = conn.accept_bi().await {
        let open = credit.accepted();
        let served = serve_stream(handler.clone(), send, recv, peer.clone());
        tokio::spawn(async move {
            served.await;
            drop(open);
        });
    }
}

async fn serve_stream<H: Handler>(
    handler: Arc<H>,
    mut send: SendStream,
    mut recv: RecvStream,
    info: PeerInfo,
) {
    let peer = info.addr;
    // Invariant 1: problems with this stream end this stream only.
    let body = match read_frame(&mut recv, wire::MAX_FRAME).await {
        Ok(Some(b)) => b,
        Ok(None) => return,
        Err(ReadError::Frame(e)) => {
            tracing::warn!(%peer, "refusing stream: {e}");
            let _ = recv.stop(VarInt::from_u32(RESET_FRAME_TOO_LARGE));
            let _ = send.reset(VarInt::from_u32(RESET_FRAME_TOO_LARGE));
            return;
        }
        Err(ReadError::Io(e)) => {
            tracing::debug!(%peer, "stream read failed: {e}");
            return;
        }
    };
    match wire::decode::<WireRequest>(&body) {
        Ok(req) => {
            // Invariant 3; a continuing stream's next bytes are frames.
            if !req.continues() {
                take_end(&mut recv);
            }
            handler.handle(req, send, recv, info).await
        }
        Err(e) => {
            tracing::warn!(%peer, "refusing stream: {e}");
            let _ = send.reset(VarInt::from_u32(RESET_MALFORMED));
        }
    }
}
