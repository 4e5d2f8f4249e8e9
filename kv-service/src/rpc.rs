//! QUIC transport: one bidirectional stream per request over pooled
//! connections, every call with a deadline.
//!
//! Invariants:
//! 1. A bad stream (oversized or malformed frame) is reset alone; the
//!    connection and the server keep serving every other stream.
//! 2. At most one connection per peer address is kept; a closed one is
//!    replaced on the next call, by one dial that the calls waiting for
//!    it share.
//! 3. A one-frame stream is read to its end when the end arrived with the
//!    frame; one dropped earlier sends STOP_SENDING.
//! 4. A call gives up on a peer silent for [`SILENCE`] (a killed process
//!    sends no close); the connection stays until its idle timeout. While
//!    it waits it probes a peer silent for [`PROBE_AFTER`], so a live one
//!    is never silent that long, however rarely idle connections ping.
//! 5. A frame is copied once on each side: quinn is handed the encoded
//!    buffer itself (a copy of a written slice, in a fresh allocation,
//!    was a fifth of the leader's CPU when 4,096 hosts read one 66 KB
//!    value), and a frame is read into a buffer not zeroed first.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use serde::Serialize;

use crate::wire::{
    self, FrameError, WireRequest, WireResponse, RESET_FRAME_TOO_LARGE, RESET_MALFORMED,
};
use tessel_tls::{peer_identity, server_name, Identity};

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

/// How long a peer may send nothing while a call waits on it (invariant 4):
/// twice [`PROBE_AFTER`], so a probe of ours has gone unanswered for half
/// a second.
pub const SILENCE: Duration = Duration::from_secs(1);
const SILENCE_CHECK: Duration = Duration::from_millis(250);
/// A waiting call probes a peer it has heard nothing from for this long:
/// an empty QUIC datagram, which the peer's QUIC stack acknowledges within
/// its ACK delay whatever its application is doing. Idle connections ping
/// more rarely (`tessel_tls`), and a heartbeating worker's never do.
pub const PROBE_AFTER: Duration = Duration::from_millis(500);

/// Returns once `conn` has received nothing for [`SILENCE`] while this
/// process could run: a check that comes late (this process was starved
/// of CPU, and its datagrams wait in the socket unread) starts the count
/// again rather than blame the peer.
pub(crate) async fn until_silent(conn: &Connection) {
    let mut seen = conn.stats().udp_rx.datagrams;
    let mut since = tokio::time::Instant::now();
    let mut checked = since;
    loop {
        tokio::time::sleep(SILENCE_CHECK).await;
        let now = tokio::time::Instant::now();
        let late = now.duration_since(checked) > SILENCE_CHECK * 2;
        checked = now;
        let received = conn.stats().udp_rx.datagrams;
        if received != seen || late {
            (seen, since) = (received, now);
        } else if since.elapsed() >= SILENCE {
            return;
        } else if since.elapsed() >= PROBE_AFTER {
            // Unsent only when the connection is closing, which ends
            // the call anyway.
            let _ = conn.send_datagram(bytes::Bytes::new());
        }
    }
}

/// [`read_frame`] from a stream of `conn`, given up when the peer falls
/// silent (invariant 4).
pub async fn read_frame_from(
    conn: &Connection,
    recv: &mut RecvStream,
    max: usize,
) -> Result<Option<Vec<u8>>, ReadError> {
    tokio::select! {
        r = read_frame(recv, max) => r,
        () = until_silent(conn) => Err(ReadError::Io(format!(
            "the peer sent nothing for {SILENCE:?}"
        ))),
    }
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

/// A QUIC endpoint on `addr` (a server when `server` is given) on a
/// [`tessel_tls::udp_socket`] with [`SOCKET_BUFFER`]-byte buffers.
pub fn endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<Endpoint> {
    Endpoint::new(
        quinn::EndpointConfig::default(),
        server,
        tessel_tls::udp_socket(addr, SOCKET_BUFFER)?,
        Arc::new(quinn::TokioRuntime),
    )
}

/// A client endpoint with one pooled connection per peer.
#[derive(Clone)]
pub struct PeerClient {
    endpoint: Endpoint,
    conns: Arc<Mutex<HashMap<SocketAddr, Connection>>>,
    /// Held while a connection to the address is dialed (invariant 2).
    dialing: Arc<Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<()>>>>>,
    /// The DNS name each address was resolved from: dialed as the server
    /// name, which the peer's certificate must name.
    names: Arc<Mutex<HashMap<SocketAddr, String>>>,
}

/// `HOST:PORT` with a port, `HOST` a DNS name or an IP (`[v6]:port`).
pub fn check_host_port(target: &str) -> Result<(), String> {
    match target.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err("expected HOST:PORT".into()),
    }
}

impl PeerClient {
    /// A client on `endpoint`, whose default client config is set.
    pub fn new(endpoint: Endpoint) -> PeerClient {
        PeerClient {
            endpoint,
            conns: Arc::default(),
            dialing: Arc::default(),
            names: Arc::default(),
        }
    }

    /// The address `target` (`HOST:PORT`) names now: an IP as is, a DNS
    /// name looked up (and remembered as the name to dial it by).
    pub async fn resolve(&self, target: &str) -> Result<SocketAddr, NetError> {
        if let Ok(a) = target.parse::<SocketAddr>() {
            return Ok(a);
        }
        let unresolved = |reason: String| NetError::Resolve {
            target: target.to_owned(),
            reason,
        };
        check_host_port(target).map_err(unresolved)?;
        let addr = tokio::net::lookup_host(target)
            .await
            .map_err(|e| unresolved(e.to_string()))?
            .next()
            .ok_or_else(|| unresolved("no address".into()))?;
        let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
        self.names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, host.trim_matches(['[', ']']).to_owned());
        Ok(addr)
    }

    /// The pooled connection to `addr` while it is open.
    fn pooled(&self, addr: SocketAddr) -> Option<Connection> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns
            .get(&addr)
            .filter(|c| c.close_reason().is_none())
            .cloned()
    }

    async fn connection(&self, addr: SocketAddr) -> Result<Connection, NetError> {
        if let Some(c) = self.pooled(addr) {
            return Ok(c);
        }
        // Invariant 2: one dial at a time per address. The calls that find
        // the connection closed wait for that dial and share its
        // connection: each dialing its own made a handshake per waiting
        // call (tens of thousands when a connection carrying 128 hosts'
        // waits closed at 16,384 hosts), each replacing the last.
        let dialing = self
            .dialing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(addr)
            .or_default()
            .clone();
        let _dialing = dialing.lock().await;
        if let Some(c) = self.pooled(addr) {
            return Ok(c);
        }
        let name = self
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| server_name(addr));
        // quinn's connection driver task keeps the tracing span current at
        // `connect` (it is instrumented with `Span::current()`) until the
        // connection closes: a pooled connection opened inside a job
        // process's span kept that span, and so its trace, from ever ending.
        // A task of its own has no current span.
        let endpoint = self.endpoint.clone();
        let connecting = tokio::spawn(async move { endpoint.connect(addr, &name) })
            .await
            .map_err(|e| e.to_string())
            .and_then(|c| c.map_err(|e| e.to_string()))
            .map_err(|reason| NetError::Connect { addr, reason })?;
        // A dead peer never answers the handshake: given up as before the
        // idle timeout was long (`tessel_tls::HANDSHAKE_TIMEOUT`).
        let conn = match tokio::time::timeout(tessel_tls::HANDSHAKE_TIMEOUT, connecting).await {
            Ok(c) => c.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "no handshake within {:?}",
                tessel_tls::HANDSHAKE_TIMEOUT
            )),
        }
        .map_err(|reason| NetError::Connect { addr, reason })?;
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, conn.clone());
        Ok(conn)
    }

    /// Forgets the pooled connection to `addr` if it is still `conn`, not
    /// one another call dialed since.
    fn forget(&self, addr: SocketAddr, conn: &Connection) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if conns
            .get(&addr)
            .is_some_and(|c| c.stable_id() == conn.stable_id())
        {
            conns.remove(&addr);
        }
    }

    /// Opens a stream to `addr` and sends `req` on it; returns the
    /// connection with the stream, for [`read_frame_from`].
    pub async fn open(
        &self,
        addr: SocketAddr,
        req: &WireRequest,
    ) -> Result<(Connection, SendStream, RecvStream), NetError> {
        let stream_err = |reason: String| NetError::Stream { addr, reason };
        let mut conn = self.connection(addr).await?;
        let (mut send, recv) = match conn.open_bi().await {
            Ok(s) => s,
            Err(_) => {
                // The pooled connection died: reconnect once (invariant 2).
                self.forget(addr, &conn);
                conn = self.connection(addr).await?;
                conn.open_bi()
                    .await
                    .map_err(|e| stream_err(e.to_string()))?
            }
        };
        write_frame(&mut send, req).await.map_err(stream_err)?;
        Ok((conn, send, recv))
    }

    /// Sends `req` to `addr` and waits up to `timeout` for the answer.
    pub async fn call(
        &self,
        addr: SocketAddr,
        req: &WireRequest,
        timeout: Duration,
    ) -> Result<WireResponse, NetError> {
        let attempt = async {
            let (conn, mut send, mut recv) = self.open(addr, req).await?;
            let _ = send.finish();
            let stream_err = |reason: String| NetError::Stream { addr, reason };
            match read_frame_from(&conn, &mut recv, wire::MAX_FRAME).await {
                Ok(Some(body)) => {
                    take_end(&mut recv);
                    Ok(wire::decode(&body)?)
                }
                Ok(None) => Err(stream_err("closed without an answer".into())),
                Err(ReadError::Frame(f)) => Err(NetError::Frame(f)),
                Err(ReadError::Io(e)) => Err(stream_err(e)),
            }
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .map_err(|_| NetError::Timeout {
                addr,
                after: timeout,
            })?
    }
}

/// A peer known by its `HOST:PORT`: an address is used as is; a DNS name
/// is resolved when first used, and again after [`RESOLVE_TTL`] or a failed
/// call, so that a peer rescheduled under the same name (a pod, a
/// container) is found at its new address.
#[derive(Debug)]
pub struct NamedPeer {
    host_port: String,
    /// `Some` when `host_port` is an address: nothing to look up, no lock
    /// on the request path.
    fixed: Option<SocketAddr>,
    resolved: Mutex<Option<(SocketAddr, std::time::Instant)>>,
}

/// How long a resolved address is trusted.
pub const RESOLVE_TTL: Duration = Duration::from_secs(5);

impl NamedPeer {
    /// The peer at `host_port` (an address, or a DNS name and a port).
    pub fn new(host_port: impl Into<String>) -> NamedPeer {
        let host_port = host_port.into();
        NamedPeer {
            fixed: host_port.parse().ok(),
            host_port,
            resolved: Mutex::new(None),
        }
    }

    /// `HOST:PORT` as given.
    pub fn name(&self) -> &str {
        &self.host_port
    }

    /// Its address, or the one its name resolved to last, if any.
    pub fn last(&self) -> Option<SocketAddr> {
        self.fixed.or_else(|| {
            self.resolved
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .map(|(a, _)| a)
        })
    }

    /// Its address now: the fixed one, the cached one while fresh, else
    /// looked up.
    pub async fn addr(&self, client: &PeerClient) -> Result<SocketAddr, NetError> {
        if let Some(a) = self.fixed {
            return Ok(a);
        }
        let cached = *self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((a, at)) = cached {
            if at.elapsed() < RESOLVE_TTL {
                return Ok(a);
            }
        }
        let a = client.resolve(&self.host_port).await?;
        *self.resolved.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((a, std::time::Instant::now()));
        Ok(a)
    }

    /// Sends `req` to wherever it is now ([`PeerClient::call`]); a failure
    /// has the name looked up again before the next call.
    pub async fn call(
        &self,
        client: &PeerClient,
        req: &WireRequest,
        timeout: Duration,
    ) -> Result<WireResponse, NetError> {
        let result = match self.addr(client).await {
            Ok(addr) => client.call(addr, req, timeout).await,
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.forget();
        }
        result
    }

    /// Looks the name up again before the next call (this one failed).
    pub fn forget(&self) {
        if self.fixed.is_none() {
            *self.resolved.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
    }
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

/// Accepts connections on `endpoint` until it closes.
pub async fn serve<H: Handler>(endpoint: Endpoint, handler: Arc<H>) {
    while let Some(incoming) = endpoint.accept().await {
        let handler = handler.clone();
        tokio::spawn(async move {
            let from = incoming.remote_address();
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(%from, "refused a connection: {e}");
                    return;
                }
            };
            let peer = PeerInfo {
                addr: conn.remote_address(),
                identity: Arc::new(peer_identity(&conn)),
            };
            while let Ok((send, recv)) = conn.accept_bi().await {
                tokio::spawn(serve_stream(handler.clone(), send, recv, peer.clone()));
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ClientRequest;

    /// Answers every request with one frame, as the replicas do.
    struct Answer;

    impl Handler for Answer {
        fn handle(
            self: Arc<Self>,
            _req: WireRequest,
            mut send: SendStream,
            _recv: RecvStream,
            _peer: PeerInfo,
        ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
            Box::pin(async move {
                let _ = write_frame(&mut send, &WireResponse::Revision(Ok(7))).await;
                let _ = send.finish();
            })
        }
    }

    /// Answers after `delay`, or never.
    struct Slow(Option<Duration>);

    impl Handler for Slow {
        fn handle(
            self: Arc<Self>,
            req: WireRequest,
            send: SendStream,
            recv: RecvStream,
            peer: PeerInfo,
        ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
            Box::pin(async move {
                match self.0 {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
                Arc::new(Answer).handle(req, send, recv, peer).await
            })
        }
    }

    /// A server on a runtime of its own, which the test can stop dead: no
    /// close reaches the client, as when a process is killed.
    fn server_on_own_runtime(
        handler: impl Handler,
    ) -> (tokio::runtime::Runtime, SocketAddr, quinn::ClientConfig) {
        let (server_cfg, client_cfg) = tessel_tls::insecure_configs(wire::ALPN).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = {
            let _runtime = rt.enter();
            endpoint("127.0.0.1:0".parse().unwrap(), Some(server_cfg)).unwrap()
        };
        let addr = server.local_addr().unwrap();
        rt.spawn(serve(server, Arc::new(handler)));
        (rt, addr, client_cfg)
    }

    fn client_with(cfg: quinn::ClientConfig) -> PeerClient {
        let mut endpoint = endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
        endpoint.set_default_client_config(cfg);
        PeerClient::new(endpoint)
    }

    /// Invariant 2: the calls that find their connection closed share one
    /// dial, not a handshake each.
    #[tokio::test]
    async fn calls_that_find_the_connection_closed_share_one_dial() {
        let (rt, addr, cfg) = server_on_own_runtime(Answer);
        let client = client_with(cfg);
        let req = WireRequest::Client(ClientRequest::Revision);
        let timeout = Duration::from_secs(5);
        assert!(client.call(addr, &req, timeout).await.is_ok());
        let conn = client.connection(addr).await.unwrap();
        conn.close(0u32.into(), b"closed by the test");
        let calls = (0..64).map(|_| client.call(addr, &req, timeout));
        for answer in futures::future::join_all(calls).await {
            assert!(answer.is_ok(), "{answer:?}");
        }
        let handshakes = client.endpoint.stats().outgoing_handshakes;
        assert_eq!(handshakes, 2, "the first dial and one more");
        rt.shutdown_background();
    }

    /// Invariant 4: a peer that dies while a call waits on it is given up
    /// after `SILENCE`, well before the connection's idle timeout.
    #[tokio::test]
    async fn a_call_gives_up_on_a_peer_that_fell_silent() {
        let (rt, addr, cfg) = server_on_own_runtime(Slow(None));
        let client = client_with(cfg);
        let req = WireRequest::Client(ClientRequest::Revision);
        let started = tokio::time::Instant::now();
        let call = client.call(addr, &req, Duration::from_secs(10));
        let kill = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            rt.shutdown_background();
        };
        let (answer, ()) = tokio::join!(call, kill);
        let took = started.elapsed();
        match answer {
            Err(NetError::Stream { reason, .. }) => {
                assert!(reason.contains("sent nothing"), "{reason}")
            }
            other => panic!("expected a silent peer, got {other:?}"),
        }
        assert!(
            took < tessel_tls::IDLE_TIMEOUT,
            "gave up after {took:?}, no sooner than the idle timeout"
        );
    }

    /// Invariant 4, the other side: a live peer that takes longer than
    /// `SILENCE` (and than the idle timeout) to answer is waited for.
    #[tokio::test]
    async fn a_call_waits_for_a_slow_live_peer() {
        let slow = tessel_tls::IDLE_TIMEOUT + Duration::from_millis(500);
        let (rt, addr, cfg) = server_on_own_runtime(Slow(Some(slow)));
        let client = client_with(cfg);
        let req = WireRequest::Client(ClientRequest::Revision);
        let answer = client.call(addr, &req, slow * 2).await;
        assert!(
            matches!(answer, Ok(WireResponse::Revision(Ok(7)))),
            "{answer:?}"
        );
        rt.shutdown_background();
    }

    /// `tessel_tls`'s keep-alives: on an idle connection the dialer alone
    /// pings (a replica with thousands of workers' connections would ping
    /// each of them), and its pings keep the connection open past the idle
    /// timeout on both sides.
    #[tokio::test]
    async fn an_idle_connection_lives_on_the_dialers_keep_alives_alone() {
        let (rt, addr, cfg) = server_on_own_runtime(Answer);
        let client = client_with(cfg);
        let req = WireRequest::Client(ClientRequest::Revision);
        assert!(client
            .call(addr, &req, Duration::from_secs(5))
            .await
            .is_ok());
        let conn = client.connection(addr).await.unwrap();
        // Past the call's own loss-recovery probes (PINGs too).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = conn.stats();
        tokio::time::sleep(tessel_tls::IDLE_TIMEOUT + Duration::from_secs(1)).await;
        let after = conn.stats();
        assert!(conn.close_reason().is_none(), "{:?}", conn.close_reason());
        let sent = after.frame_tx.ping - before.frame_tx.ping;
        let received = after.frame_rx.ping - before.frame_rx.ping;
        // Every 1.2 s: three in four seconds, two at least.
        assert!(
            sent >= 2,
            "the dialer sent {sent} pings in more than an idle timeout"
        );
        assert_eq!(received, 0, "the acceptor pinged");
        assert!(client
            .call(addr, &req, Duration::from_secs(5))
            .await
            .is_ok());
        rt.shutdown_background();
    }

    /// A pooled connection opened inside a span does not hold that span
    /// open: quinn instruments its connection driver with the current
    /// span, and a job process's span would otherwise live as long as the
    /// worker's connection (and never reach its trace).
    #[tokio::test]
    async fn a_connection_opened_inside_a_span_lets_the_span_end() {
        use tracing::Instrument;
        use tracing_subscriber::layer::{Context, SubscriberExt};
        use tracing_subscriber::registry::LookupSpan;
        struct Closed(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Closed {
            fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
                let name = ctx.span(&id).map(|s| s.name().to_owned());
                self.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(name);
            }
        }
        let closed = Arc::new(Mutex::new(Vec::new()));
        let subscriber = tracing_subscriber::registry().with(Closed(closed.clone()));
        // This thread's subscriber: the test's runtime has only this thread.
        let _default = tracing::subscriber::set_default(subscriber);
        let (rt, addr, cfg) = server_on_own_runtime(Answer);
        let client = client_with(cfg);
        let req = WireRequest::Client(ClientRequest::Revision);
        let answer = client
            .call(addr, &req, Duration::from_secs(10))
            .instrument(tracing::info_span!("job_process"))
            .await;
        assert!(
            matches!(answer, Ok(WireResponse::Revision(Ok(7)))),
            "{answer:?}"
        );
        tokio::task::yield_now().await;
        let closed = closed.lock().unwrap().clone();
        assert!(
            closed.iter().any(|n| n == "job_process"),
            "still open: {closed:?}"
        );
        rt.shutdown_background();
    }

    /// Invariant 3: requests answered in one frame leave no STOP_SENDING
    /// behind, in either direction.
    #[tokio::test]
    async fn a_call_reads_both_streams_to_their_end() {
        let (rt, addr, cfg) = server_on_own_runtime(Answer);
        let client = client_with(cfg);
        let req = WireRequest::Client(ClientRequest::Revision);
        for _ in 0..50 {
            match client.call(addr, &req, Duration::from_secs(5)).await {
                Ok(WireResponse::Revision(Ok(7))) => {}
                other => panic!("unexpected answer: {other:?}"),
            }
        }
        let conn = client.connection(addr).await.unwrap();
        // Let the peer's frames for the last call arrive.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stats = conn.stats();
        assert_eq!(stats.frame_tx.stop_sending, 0, "sent: {:?}", stats.frame_tx);
        assert_eq!(
            stats.frame_rx.stop_sending, 0,
            "received: {:?}",
            stats.frame_rx
        );
        rt.shutdown_background();
    }
}
