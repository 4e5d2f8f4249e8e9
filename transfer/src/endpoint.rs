//! One QUIC endpoint per worker: sends to and receives from peers.
//!
//! Protocol: one bidirectional stream per transfer. The sender writes the
//! header frame and exactly `byte_len` payload bytes, then finishes its
//! side; the receiver answers one byte (`0` = stored, `1` = refused) once
//! the payload is in its mailbox, so a completed `send` means delivered.
//!
//! Invariants:
//! 1. Nothing is allocated for a payload before its header is validated
//!    against the receiver's limit (header invariant 1); a refused stream is
//!    reset and the endpoint keeps serving every other stream.
//! 2. QUIC flow control is the backpressure: the receiver reads the payload
//!    into its final buffer as it arrives, so a slow receiver slows the
//!    sender, and neither side buffers more than the windows.
//! 3. Received arrays wait in a mailbox keyed by (sender rank, tag) until
//!    a `recv` takes them; each is delivered once, in arrival order.
//! 4. Every call has a deadline; connections to a peer are reused.
//! 5. Same-host path: to a peer with our boot id (unless `force_network`),
//!    the sender writes the payload to a file of the shared-memory folder
//!    (tmpfs, see [`crate::shm`]) and sends only the header naming it; the
//!    receiver checks the name and the file's length against the validated
//!    header and reads it before acknowledging. A collective's ring lends
//!    its files instead ([`TransferEndpoint::send_with`], shm invariant 3):
//!    the receiver maps the file, its consumer reduces or copies straight
//!    from the mapping, and the acknowledgement waits until it is done.
//! 6. Datagram sizes: a connection to a peer on this host (loopback address
//!    or our boot id) may grow its datagrams to `max_udp_payload` (64 KiB
//!    on loopback) and sends them one per system call; a connection to
//!    another host batches datagrams with segmentation offload and never
//!    exceeds [`GSO_MAX_UDP_PAYLOAD`], so no batch can pass the kernel's
//!    64 KiB limit for one GSO send.
//! 7. Spare buffers: a payload of at least [`MIN_SPARE`] bytes is read into
//!    a buffer handed back with [`TransferEndpoint::recycle`] when one fits
//!    (capacity from the length to twice it), else into fresh memory;
//!    spares never hold more than `spare_bytes` in all. Fresh memory costs
//!    a page fault and the zeroing of every page (a fifth of a 1 GiB
//!    transfer's CPU here); a loop that receives the same sizes every step
//!    pays that once. [`TransferEndpoint::recv_buffer`] recycles by itself.
//! 8. Several connections: up to `connections_per_peer` connections to each
//!    peer, opened as needed; transfers take them in turn, and a network
//!    payload of at least `stripe_bytes` travels as one part per connection
//!    (header field `part`, [`crate::stripe`]), so that different threads
//!    seal and open its packets at once (quinn drives each connection from
//!    one task).
//! 9. No copies of our own on the network path of a lent payload (a
//!    collective's ring chunk): the sender may hand over shared pieces
//!    ([`Outgoing::Shared`]), which quinn keeps until they are
//!    acknowledged instead of copying them into its send buffer, and the
//!    receiver delivers the pieces `read_chunk` hands out
//!    ([`Payload::Pieces`]) instead of copying them into one buffer. The
//!    ring reduces straight from the pieces and sends them on as they
//!    are.
//! 10. With certificates, an endpoint admits only workers (the cluster-wide
//!     certificate passes), and a sender verifies that the peer's
//!     certificate names the worker its [`Peer`] says it runs on.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use tessel_net::tls::{Accept, Expect, TlsFiles};
use tessel_pjrt::ElementType;
use tokio::sync::Notify;

use crate::error::{Result, TransferError};
use crate::header::TransferHeader;
use crate::shm::ShmPool;
use crate::stripe::{part_range, Assemblies, Part};

/// ALPN of the transfer protocol.
pub const ALPN: &[u8] = b"tessel-transfer";

/// The largest UDP payload a connection with segmentation offload may use.
/// quinn hands the socket up to 10 datagrams per GSO send and Linux refuses
/// a send above 64 KiB in all (`EMSGSIZE`, which quinn drops silently as if
/// it were a lost MTU probe): with a larger MTU every batch of a transfer
/// was lost, black-hole detection fell back to 1,200 bytes, and 1 GiB moved
/// at 0.43 GB/s on loopback.
pub const GSO_MAX_UDP_PAYLOAD: u16 = 6_500;

/// Smallest buffer worth keeping as a spare (invariant 7).
pub const MIN_SPARE: usize = 1 << 20;

/// Stream reset codes.
const REFUSED: u32 = 1;

/// Limits and QUIC tuning.
#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// The largest payload a peer may announce.
    pub max_bytes: u64,
    /// Per-stream and per-connection receive windows.
    pub stream_window: u64,
    pub connection_window: u64,
    /// This host's boot id: peers with the same one get the shared-memory
    /// path (invariant 5). `None` disables it.
    pub boot_id: Option<String>,
    /// Use the network even to peers on this host.
    pub force_network: bool,
    /// Largest UDP payload MTU discovery may reach towards a peer on this
    /// host (a loopback address or our boot id), and the largest this
    /// endpoint accepts. Loopback carries 64 KiB datagrams, so such
    /// connections send one large datagram per system call without
    /// segmentation offload (invariant 6).
    pub max_udp_payload: u16,
    /// Largest UDP payload MTU discovery may reach towards other hosts,
    /// whose connections batch datagrams with segmentation offload (GSO).
    /// Capped at [`GSO_MAX_UDP_PAYLOAD`]; real paths usually stop at
    /// 1,452 bytes (Ethernet) or ~8,950 (jumbo frames), which discovery
    /// finds by itself.
    pub remote_udp_payload: u16,
    /// UDP socket buffers asked of the kernel (capped by
    /// `net.core.rmem_max`/`wmem_max`): a burst that overflows the receive
    /// buffer is lost and costs a congestion-window cut.
    pub socket_buffer: usize,
    /// Where shared-memory files live (a tmpfs).
    pub shm_dir: PathBuf,
    /// Most bytes of recycled buffers kept for later payloads
    /// (invariant 7).
    pub spare_bytes: usize,
    /// Connections to each peer (0 counts as 1); transfers take them in
    /// turn (invariant 8).
    pub connections_per_peer: usize,
    /// A network payload of at least this many bytes travels as one part
    /// per connection (invariant 8; 0: never).
    pub stripe_bytes: usize,
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            max_bytes: 64 << 30,
            stream_window: 16 << 20,
            connection_window: 64 << 20,
            boot_id: None,
            force_network: false,
            max_udp_payload: 65527,
            remote_udp_payload: GSO_MAX_UDP_PAYLOAD,
            socket_buffer: 8 << 20,
            shm_dir: PathBuf::from("/dev/shm"),
            spare_bytes: 2 << 30,
            connections_per_peer: 2,
            stripe_bytes: 16 << 20,
        }
    }
}

/// Where a peer listens, which host it runs on, and who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The peer's boot id, when known (same as ours → shared memory).
    pub boot_id: Option<String>,
    /// The worker the peer runs on, when known: its certificate must name
    /// it (invariant 10).
    pub worker: Option<String>,
}

impl Peer {
    pub fn new(addr: SocketAddr, boot_id: Option<String>) -> Peer {
        Peer {
            addr,
            boot_id,
            worker: None,
        }
    }

    /// The same peer, whose certificate must name worker `worker`.
    pub fn on_worker(self, worker: impl Into<String>) -> Peer {
        Peer {
            worker: Some(worker.into()),
            ..self
        }
    }
}

impl TransferConfig {
    /// Transport settings; `same_host` picks the large-datagram profile
    /// (invariant 6).
    fn transport(&self, same_host: bool) -> Arc<quinn::TransportConfig> {
        let mut t = quinn::TransportConfig::default();
        let clamp = |v: u64| VarInt::from_u64(v).unwrap_or(VarInt::MAX);
        t.stream_receive_window(clamp(self.stream_window));
        t.receive_window(clamp(self.connection_window));
        t.send_window(self.connection_window);
        t.max_concurrent_bidi_streams(clamp(4096));
        let mut mtu = quinn::MtuDiscoveryConfig::default();
        if same_host {
            mtu.upper_bound(self.max_udp_payload);
            // Losses here are a receive buffer overflowing, not the path:
            // should they make black-hole detection fall back to 1,200
            // bytes, discovery climbs back after a second, not a minute.
            mtu.black_hole_cooldown(Duration::from_secs(1));
            t.enable_segmentation_offload(false);
        } else {
            mtu.upper_bound(self.remote_udp_payload.min(GSO_MAX_UDP_PAYLOAD));
        }
        t.mtu_discovery_config(Some(mtu));

        t.keep_alive_interval(Some(Duration::from_millis(500)));
        // A dead peer is noticed within 2 s (as in the KV transport).
        t.max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(Duration::from_secs(2)).expect("small"),
        ));
        Arc::new(t)
    }
}

/// An array received from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub dtype: ElementType,
    pub dims: Vec<u64>,
    pub data: Vec<u8>,
}

/// A received payload: bytes read off the stream or out of a file, a lent
/// file mapped in place (shm invariant 3; dropping it lets the sender
/// have the file back), or a lent payload in the pieces it arrived in
/// (invariant 9).
pub(crate) enum Payload {
    Owned(Vec<u8>),
    Mapped(crate::shm::ShmMapping),
    Pieces(Vec<Bytes>),
}

/// One slice, or shared pieces, as the slices they are in order.
fn slices<'a>(one: Option<&'a [u8]>, many: &'a [Bytes]) -> impl Iterator<Item = &'a [u8]> + Clone {
    one.into_iter().chain(many.iter().map(|b| &b[..]))
}

impl Payload {
    pub(crate) fn len(&self) -> usize {
        self.pieces().map(<[u8]>::len).sum()
    }

    /// The bytes in order, as one or more slices.
    pub(crate) fn pieces(&self) -> impl Iterator<Item = &[u8]> + Clone {
        match self {
            Payload::Owned(v) => slices(Some(v), &[]),
            Payload::Mapped(m) => slices(Some(m), &[]),
            Payload::Pieces(p) => slices(None, p),
        }
    }

    /// The bytes in one slice (pieces are joined).
    pub(crate) fn contiguous(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            Payload::Owned(v) => v.as_slice().into(),
            Payload::Mapped(m) => (&m[..]).into(),
            Payload::Pieces(p) if p.len() == 1 => (&p[0][..]).into(),
            Payload::Pieces(p) => p.concat().into(),
        }
    }

    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self {
            Payload::Owned(v) => v,
            Payload::Mapped(m) => m.to_vec(),
            Payload::Pieces(p) => p.concat(),
        }
    }

    /// The bytes as shared pieces to keep or send on: received bytes
    /// without a copy, a mapping copied (its sender waits until it is
    /// dropped).
    pub(crate) fn into_shared(self) -> Vec<Bytes> {
        match self {
            Payload::Owned(v) => vec![Bytes::from(v)],
            Payload::Mapped(m) => vec![Bytes::copy_from_slice(&m)],
            Payload::Pieces(p) => p,
        }
    }
}

/// What a send carries: borrowed bytes, which the stream copies on their
/// way out, or shared pieces, which it keeps until the peer acknowledges
/// them and never copies (invariant 9).
#[derive(Clone, Debug)]
pub(crate) enum Outgoing<'a> {
    Borrowed(&'a [u8]),
    Shared(Vec<Bytes>),
}

impl<'a> Outgoing<'a> {
    pub(crate) fn len(&self) -> usize {
        self.pieces().map(<[u8]>::len).sum()
    }

    /// The bytes in order, as one or more slices.
    pub(crate) fn pieces(&self) -> impl Iterator<Item = &[u8]> + Clone {
        match self {
            Outgoing::Borrowed(b) => slices(Some(b), &[]),
            Outgoing::Shared(p) => slices(None, p),
        }
    }

    /// Bytes `range` of these.
    fn range(&self, range: std::ops::Range<usize>) -> Outgoing<'a> {
        match self {
            Outgoing::Borrowed(b) => Outgoing::Borrowed(&b[range]),
            Outgoing::Shared(pieces) => {
                let mut out = Vec::new();
                let mut at = 0;
                for p in pieces {
                    let (start, end) = (at, at + p.len());
                    at = end;
                    let (lo, hi) = (range.start.max(start), range.end.min(end));
                    if lo < hi {
                        out.push(p.slice(lo - start..hi - start));
                    }
                }
                Outgoing::Shared(out)
            }
        }
    }
}

/// An array waiting in the mailbox.
pub(crate) struct Arrived {
    pub dtype: ElementType,
    pub dims: Vec<u64>,
    pub payload: Payload,
}

impl From<Arrived> for Received {
    fn from(a: Arrived) -> Received {
        Received {
            dtype: a.dtype,
            dims: a.dims,
            data: a.payload.into_vec(),
        }
    }
}

#[derive(Default)]
struct Mailbox {
    slots: Mutex<HashMap<(u32, u64), VecDeque<Arrived>>>,
    arrived: Notify,
    spares: Mutex<Spares>,
    /// Striped payloads being received (invariant 8).
    assemblies: Assemblies,
}

/// Recycled buffers (invariant 7).
#[derive(Default)]
struct Spares {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl Spares {
    /// Keeps `buf` if it is large enough and fits under `limit`.
    fn put(&mut self, mut buf: Vec<u8>, limit: usize) {
        let cap = buf.capacity();
        if cap >= MIN_SPARE && self.bytes + cap <= limit {
            buf.clear();
            self.bytes += cap;
            self.buffers.push(buf);
        }
    }

    /// The smallest spare whose capacity is from `len` to twice it.
    fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        let (i, _) = self
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len && b.capacity() / 2 <= len)
            .min_by_key(|(_, b)| b.capacity())?;
        let buf = self.buffers.swap_remove(i);
        self.bytes -= buf.capacity();
        Some(buf)
    }
}

impl Mailbox {
    /// An empty buffer with room for `len` bytes: a spare, or fresh
    /// memory advised to use huge pages.
    fn buffer(&self, len: usize) -> Vec<u8> {
        if len >= MIN_SPARE {
            if let Some(b) = self.spares.lock().expect("not poisoned").take(len) {
                return b;
            }
        }
        let mut data = Vec::with_capacity(len);
        crate::memory::advise_huge_pages(data.spare_capacity_mut());
        data
    }

    /// Puts the array `header` announced in its slot, counts it as
    /// received over `path`, and wakes the receivers (invariant 3).
    fn deliver(
        &self,
        path: &'static str,
        header: TransferHeader,
        dtype: ElementType,
        payload: Payload,
    ) {
        metrics::counter!("tessel_transfer_received_bytes_total", "path" => path)
            .increment(header.byte_len);
        self.slots
            .lock()
            .expect("not poisoned")
            .entry((header.from, header.tag))
            .or_default()
            .push_back(Arrived {
                dtype,
                dims: header.dims,
                payload,
            });
        self.arrived.notify_waiters();
    }
}

fn tls_err(e: tessel_net::tls::TlsError) -> TransferError {
    TransferError::Tls(e.to_string())
}

/// A worker's transfer endpoint.
pub struct TransferEndpoint {
    rank: u32,
    endpoint: Endpoint,
    /// Connection `k` (below `connections_per_peer`) to each peer address.
    conns: Mutex<HashMap<(SocketAddr, usize), Connection>>,
    /// Round robin over a peer's connections.
    next_conn: AtomicUsize,
    /// Numbers this endpoint's striped payloads (stripe invariant 1).
    next_transfer: AtomicU64,
    /// The cluster's certificates (`None`: `--insecure`, whose client
    /// settings are made once).
    tls: Option<TlsFiles>,
    insecure_client: Option<quinn::ClientConfig>,
    mailbox: Arc<Mailbox>,
    accept: tokio::task::JoinHandle<()>,
    cfg: TransferConfig,
    shm: ShmPool,
}

impl Drop for TransferEndpoint {
    fn drop(&mut self) {
        self.accept.abort();
        self.endpoint.close(VarInt::from_u32(0), b"closed");
    }
}

impl TransferEndpoint {
    /// Binds `addr` (port 0 picks one) for `rank`; `tls: None` is
    /// `--insecure`.
    pub fn bind(
        addr: SocketAddr,
        rank: u32,
        tls: Option<&TlsFiles>,
        cfg: TransferConfig,
    ) -> Result<TransferEndpoint> {
        let cfg = TransferConfig {
            connections_per_peer: cfg.connections_per_peer.max(1),
            ..cfg
        };
        let (mut server, insecure_client) = match tls {
            Some(t) => (
                t.server_config(ALPN, Accept::Workers).map_err(tls_err)?,
                None,
            ),
            None => {
                let (server, client) = tessel_net::tls::insecure_configs(ALPN).map_err(tls_err)?;
                (server, Some(client))
            }
        };
        // The server side of a transfer only acknowledges.
        server.transport_config(cfg.transport(false));
        let bind_err = |reason: String| TransferError::Bind { addr, reason };
        let mut endpoint_cfg = quinn::EndpointConfig::default();
        endpoint_cfg
            .max_udp_payload_size(cfg.max_udp_payload.max(1200))
            .map_err(|e| bind_err(e.to_string()))?;
        let socket =
            tessel_net::udp_socket(addr, cfg.socket_buffer).map_err(|e| bind_err(e.to_string()))?;
        let endpoint = Endpoint::new(
            endpoint_cfg,
            Some(server),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(|e| bind_err(e.to_string()))?;
        let mailbox = Arc::new(Mailbox::default());
        let accept = tokio::spawn(accept_loop(endpoint.clone(), mailbox.clone(), cfg.clone()));
        Ok(TransferEndpoint {
            rank,
            endpoint,
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicUsize::new(0),
            next_transfer: AtomicU64::new(0),
            tls: tls.cloned(),
            insecure_client,
            mailbox,
            accept,
            shm: ShmPool::new(cfg.shm_dir.clone()),
            cfg,
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.endpoint
            .local_addr()
            .map_err(|e| TransferError::Stream {
                peer: "local".into(),
                reason: e.to_string(),
            })
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Client settings for `peer`: its transport profile (invariant 6),
    /// and a certificate check for the worker it runs on (invariant 10).
    fn client_config(&self, peer: &Peer) -> Result<quinn::ClientConfig> {
        let mut c = match (&self.tls, &self.insecure_client) {
            (Some(t), _) => t
                .client_config(ALPN, Expect::Worker(peer.worker.clone()))
                .map_err(tls_err)?,
            (None, Some(c)) => c.clone(),
            (None, None) => unreachable!("bind sets one or the other"),
        };
        c.transport_config(self.cfg.transport(self.on_this_host(peer)));
        Ok(c)
    }

    async fn connection(&self, peer: &Peer) -> Result<Connection> {
        let k = self.next_conn.fetch_add(1, Ordering::Relaxed) % self.cfg.connections_per_peer;
        self.connection_at(peer, k).await
    }

    async fn connection_at(&self, peer: &Peer, k: usize) -> Result<Connection> {
        let addr = peer.addr;
        if let Some(c) = self.conns.lock().expect("not poisoned").get(&(addr, k)) {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        let connect_err = |reason: String| TransferError::Connect { addr, reason };
        let client = self.client_config(peer)?;
        let conn = self
            .endpoint
            .connect_with(client, addr, tessel_net::tls::SERVER_NAME)
            .map_err(|e| connect_err(e.to_string()))?
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        self.conns
            .lock()
            .expect("not poisoned")
            .insert((addr, k), conn.clone());
        Ok(conn)
    }

    /// Sends an array over the network to `peer` under `tag`; returns once
    /// the peer stored it (invariant 4: within `timeout`).
    pub async fn send(
        &self,
        peer: SocketAddr,
        tag: u64,
        dtype: ElementType,
        dims: &[u64],
        data: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        self.send_to(&Peer::new(peer, None), tag, dtype, dims, data, timeout)
            .await
    }

    /// Sends a PJRT buffer (copied to host memory first) to `peer` under
    /// `tag`.
    pub async fn send_buffer(
        &self,
        peer: &Peer,
        tag: u64,
        buffer: &tessel_pjrt::Buffer,
        timeout: Duration,
    ) -> Result<()> {
        let pjrt = |e: tessel_pjrt::Error| TransferError::Pjrt(e.to_string());
        let host = buffer.to_host().map_err(pjrt)?.await.map_err(pjrt)?;
        let dims: Vec<u64> = host.dims().iter().map(|&d| d as u64).collect();
        self.send_to(peer, tag, host.element_type(), &dims, host.bytes(), timeout)
            .await
    }

    /// Receives the next array `from` sent under `tag` onto `device` (the
    /// receiver chooses the device).
    pub async fn recv_buffer(
        &self,
        from: u32,
        tag: u64,
        device: &tessel_pjrt::Device,
        timeout: Duration,
    ) -> Result<tessel_pjrt::Buffer> {
        let got = self.recv(from, tag, timeout).await?;
        let dims = got
            .dims
            .iter()
            .map(|&d| i64::try_from(d))
            .collect::<std::result::Result<Vec<i64>, _>>()
            .map_err(|_| TransferError::InvalidHeader(format!("dimensions {:?}", got.dims)))?;
        let buffer = device
            .client()
            .buffer_from_bytes(got.dtype, &dims, &got.data, device)
            .map_err(|e| TransferError::Pjrt(e.to_string()));
        self.recycle(got.data);
        buffer
    }

    /// Hands a buffer that held a received array back for later payloads
    /// (invariant 7); kept only if at least [`MIN_SPARE`] bytes and within
    /// `spare_bytes`, else freed.
    pub fn recycle(&self, buf: Vec<u8>) {
        self.mailbox
            .spares
            .lock()
            .expect("not poisoned")
            .put(buf, self.cfg.spare_bytes);
    }

    /// QUIC statistics of the connection to `peer` (for benchmarks).
    pub fn connection_stats(&self, peer: SocketAddr) -> Option<quinn::ConnectionStats> {
        self.conns
            .lock()
            .expect("not poisoned")
            .get(&(peer, 0))
            .map(|c| c.stats())
    }

    /// Where this endpoint's shared-memory files live.
    pub(crate) fn shm_dir(&self) -> &std::path::Path {
        &self.cfg.shm_dir
    }

    /// Whether transfers to `peer` take the shared-memory path.
    pub fn same_host(&self, peer: &Peer) -> bool {
        !self.cfg.force_network && self.same_boot_id(peer)
    }

    fn same_boot_id(&self, peer: &Peer) -> bool {
        self.cfg.boot_id.is_some() && self.cfg.boot_id == peer.boot_id
    }

    /// Whether the network path to `peer` stays inside this host
    /// (invariant 6).
    fn on_this_host(&self, peer: &Peer) -> bool {
        peer.addr.ip().is_loopback() || self.same_boot_id(peer)
    }

    /// Sends an array to `peer` under `tag`, through shared memory when the
    /// peer is on this host (invariant 5), else over QUIC; returns once the
    /// peer stored it.
    pub async fn send_to(
        &self,
        peer: &Peer,
        tag: u64,
        dtype: ElementType,
        dims: &[u64],
        data: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        self.send_with(
            peer,
            tag,
            dtype,
            dims,
            Outgoing::Borrowed(data),
            timeout,
            false,
        )
        .await
    }

    /// [`Self::send_to`] of borrowed or shared bytes, or with `lend` for a
    /// taker that consumes the array at once, as a collective's ring does
    /// (never for a mailbox that may hold it): a same-host peer reads the
    /// file in place and the call returns only once the peer's consumer is
    /// done with it (invariant 5), a network peer keeps the pieces the
    /// bytes arrived in (invariant 9).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn send_with(
        &self,
        peer: &Peer,
        tag: u64,
        dtype: ElementType,
        dims: &[u64],
        data: Outgoing<'_>,
        timeout: Duration,
        lend: bool,
    ) -> Result<()> {
        let mut header = TransferHeader::new(self.rank, tag, dtype, dims)?;
        let len = data.len();
        if header.byte_len != len as u64 {
            return Err(TransferError::InvalidHeader(format!(
                "{}{dims:?} is {} bytes, the data has {len}",
                dtype.name(),
                header.byte_len,
            )));
        }
        header.lent = lend;
        let shm = if self.same_host(peer) {
            let f = self
                .shm
                .write(data.pieces())
                .map_err(|e| TransferError::Stream {
                    peer: peer.addr.to_string(),
                    reason: format!("shared memory in {}: {e}", self.cfg.shm_dir.display()),
                })?;
            header.shm = Some(f.name.clone());
            Some(f)
        } else {
            None
        };
        let payload = match shm {
            Some(_) => Outgoing::Borrowed(&[]),
            None => data,
        };
        let addr = peer.addr;
        let k = self.cfg.connections_per_peer;
        let attempt = async {
            if shm.is_some() || k < 2 || self.cfg.stripe_bytes == 0 || len < self.cfg.stripe_bytes {
                return self.send_stream(peer, None, &header, payload).await;
            }
            // Stripe invariant 1: one part per connection.
            let count = (k as u32).min(crate::stripe::MAX_PARTS);
            let transfer = self.next_transfer.fetch_add(1, Ordering::Relaxed);
            let parts = (0..count).map(|index| {
                let mut h = header.clone();
                h.part = Some(Part {
                    transfer,
                    index,
                    count,
                });
                let r = part_range(len as u64, index, count);
                let part = payload.range(r.start as usize..r.end as usize);
                async move { self.send_stream(peer, Some(index as usize), &h, part).await }
            });
            futures::future::try_join_all(parts).await.map(|_| ())
        };
        let result = tokio::time::timeout(timeout, attempt).await.map_err(|_| {
            TransferError::DeadlineExceeded {
                what: format!("send of tag {tag} to {addr}"),
                after: timeout,
            }
        })?;
        let path = if shm.is_some() { "shm" } else { "quic" };
        if let Some(f) = shm {
            self.shm.release(f, result.is_ok());
        }
        match &result {
            Ok(()) => metrics::counter!("tessel_transfer_sent_bytes_total", "path" => path)
                .increment(len as u64),
            Err(_) => metrics::counter!("tessel_transfer_send_failures_total", "path" => path)
                .increment(1),
        }
        result
    }

    /// One stream: `header`, then `payload`, then the receiver's answer;
    /// on connection `conn` to the peer, or the next in turn.
    async fn send_stream(
        &self,
        peer: &Peer,
        conn: Option<usize>,
        header: &TransferHeader,
        payload: Outgoing<'_>,
    ) -> Result<()> {
        let stream_err = |reason: String| TransferError::Stream {
            peer: peer.addr.to_string(),
            reason,
        };
        let conn = match conn {
            Some(k) => self.connection_at(peer, k).await?,
            None => self.connection(peer).await?,
        };
        let (mut send, mut recv) = conn
            .open_bi()
            .await
            .map_err(|e| stream_err(e.to_string()))?;
        send.write_all(&header.encode())
            .await
            .map_err(|e| stream_err(e.to_string()))?;
        match payload {
            Outgoing::Borrowed(bytes) => send.write_all(bytes).await,
            Outgoing::Shared(mut pieces) => send.write_all_chunks(&mut pieces).await,
        }
        .map_err(|e| stream_err(e.to_string()))?;
        send.finish().map_err(|e| stream_err(e.to_string()))?;
        let mut ack = [0u8; 1];
        recv.read_exact(&mut ack)
            .await
            .map_err(|e| stream_err(format!("no acknowledgement: {e}")))?;
        match ack[0] {
            0 => Ok(()),
            _ => Err(stream_err("the receiver refused the transfer".into())),
        }
    }

    /// Takes the next array `from` sent under `tag`, waiting up to
    /// `timeout` (invariant 3).
    pub async fn recv(&self, from: u32, tag: u64, timeout: Duration) -> Result<Received> {
        self.recv_first(&[(from, tag)], timeout)
            .await
            .map(|(_, r)| r)
            .map_err(|e| match e {
                TransferError::DeadlineExceeded { after, .. } => TransferError::DeadlineExceeded {
                    what: format!("receive of tag {tag} from rank {from}"),
                    after,
                },
                e => e,
            })
    }

    /// Takes the next array under the first of `keys` (sender rank, tag)
    /// that has one, waiting up to `timeout`; returns the key's index.
    pub async fn recv_first(
        &self,
        keys: &[(u32, u64)],
        timeout: Duration,
    ) -> Result<(usize, Received)> {
        let (i, a) = self.take_first(keys, timeout).await?;
        Ok((i, a.into()))
    }

    /// As [`Self::recv_first`], with a lent payload still in place.
    pub(crate) async fn take_first(
        &self,
        keys: &[(u32, u64)],
        timeout: Duration,
    ) -> Result<(usize, Arrived)> {
        let wait = async {
            loop {
                let arrived = self.mailbox.arrived.notified();
                tokio::pin!(arrived);
                arrived.as_mut().enable();
                if let Some(r) = self.take(keys) {
                    return r;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| TransferError::DeadlineExceeded {
                what: format!("receive of {keys:?}"),
                after: timeout,
            })
    }

    fn take(&self, keys: &[(u32, u64)]) -> Option<(usize, Arrived)> {
        let mut slots = self.mailbox.slots.lock().expect("not poisoned");
        for (i, key) in keys.iter().enumerate() {
            let Some(queue) = slots.get_mut(key) else {
                continue;
            };
            let r = queue.pop_front();
            if queue.is_empty() {
                slots.remove(key);
            }
            if let Some(r) = r {
                return Some((i, r));
            }
        }
        None
    }

    /// Drops every waiting array whose tag `matches` (what a broken
    /// collective left behind).
    pub fn discard(&self, matches: impl Fn(u64) -> bool) {
        self.mailbox
            .slots
            .lock()
            .expect("not poisoned")
            .retain(|(_, tag), _| !matches(*tag));
    }
}

async fn accept_loop(endpoint: Endpoint, mailbox: Arc<Mailbox>, cfg: TransferConfig) {
    while let Some(incoming) = endpoint.accept().await {
        let mailbox = mailbox.clone();
        let cfg = cfg.clone();
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            let remote = conn.remote_address();
            while let Ok((send, recv)) = conn.accept_bi().await {
                let mailbox = mailbox.clone();
                let cfg = cfg.clone();
                tokio::spawn(async move {
                    if let Err(e) = receive(send, recv, remote, &mailbox, &cfg).await {
                        tracing::warn!(error = %e, "transfer refused");
                    }
                });
            }
        });
    }
}

/// Hands `take` exactly `len` payload bytes (`len` was validated against
/// the limit) in the pieces the stream delivers them in.
async fn read_chunks(
    recv: &mut RecvStream,
    len: usize,
    mut take: impl FnMut(Bytes),
) -> std::result::Result<(), String> {
    let mut have = 0;
    while have < len {
        let chunk = recv
            .read_chunk(len - have, true)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("the stream ended after {have} of {len} bytes"))?;
        have += chunk.bytes.len();
        take(chunk.bytes);
    }
    Ok(())
}

/// Appends exactly `len` payload bytes to `data`, an empty buffer with
/// room for them: a spare, or fresh capacity without a zero-filling pass
/// (invariant 7).
async fn read_payload<B: bytes::BufMut>(
    recv: &mut RecvStream,
    len: usize,
    data: &mut B,
) -> std::result::Result<(), String> {
    read_chunks(recv, len, |bytes| data.put_slice(&bytes)).await
}

/// Exactly `len` payload bytes in the pieces the stream hands out, without
/// copying them (invariant 9).
async fn read_pieces(recv: &mut RecvStream, len: usize) -> std::result::Result<Vec<Bytes>, String> {
    let mut pieces = Vec::new();
    read_chunks(recv, len, |bytes| pieces.push(bytes)).await?;
    Ok(pieces)
}

/// Refuses a stream: stops reading it (if still reading) and answers `1`.
async fn refuse(send: &mut SendStream, recv: Option<&mut RecvStream>) {
    if let Some(recv) = recv {
        let _ = recv.stop(VarInt::from_u32(REFUSED));
    }
    let _ = send.write_all(&[1]).await;
    let _ = send.finish();
}

/// One part of a striped payload (invariant 8, stripe invariants 2–4),
/// its header validated: fills its piece, delivers the whole if it is the
/// last, and answers once the whole is delivered or abandoned.
async fn receive_part(
    mut send: SendStream,
    mut recv: RecvStream,
    remote: SocketAddr,
    header: TransferHeader,
    dtype: ElementType,
    part: Part,
    mailbox: &Mailbox,
) -> Result<()> {
    let stream_err = |reason: String| TransferError::Stream {
        peer: remote.to_string(),
        reason,
    };
    let key = (remote, part.transfer);
    let (mut piece, mut delivery) = match mailbox
        .assemblies
        .claim(key, &header, |len| mailbox.buffer(len))
    {
        Ok(claimed) => claimed,
        Err(e) => {
            refuse(&mut send, Some(&mut recv)).await;
            return Err(e);
        }
    };
    let range = part_range(header.byte_len, part.index, part.count);
    if let Err(e) = read_payload(&mut recv, (range.end - range.start) as usize, &mut piece).await {
        mailbox.assemblies.abandon(key);
        return Err(stream_err(format!(
            "part {} of {}: {e}",
            part.index, part.count
        )));
    }
    if let Some(whole) = mailbox.assemblies.fill(key, part.index, piece) {
        mailbox.deliver("quic", header, dtype, Payload::Owned(whole.data));
        let _ = whole.delivered.send(true);
    }
    let delivered = tokio::select! {
        d = delivery.wait_for(|d| *d) => d.is_ok(),
        _ = send.stopped() => {
            // The sender stopped waiting (it gave up, or its connection
            // closed): nothing of this payload may stay behind.
            mailbox.assemblies.abandon(key);
            return Ok(());
        }
    };
    send.write_all(&[if delivered { 0 } else { 1 }])
        .await
        .map_err(|e| stream_err(e.to_string()))?;
    let _ = send.finish();
    if delivered {
        Ok(())
    } else {
        Err(stream_err(format!(
            "part {} of {}: another part of the payload failed",
            part.index, part.count
        )))
    }
}

/// One incoming transfer (invariants 1–3).
async fn receive(
    mut send: SendStream,
    mut recv: RecvStream,
    remote: SocketAddr,
    mailbox: &Mailbox,
    cfg: &TransferConfig,
) -> Result<()> {
    let max_bytes = cfg.max_bytes;
    let stream_err = |reason: String| TransferError::Stream {
        peer: "incoming".into(),
        reason,
    };
    let mut prefix = [0u8; 4];
    recv.read_exact(&mut prefix)
        .await
        .map_err(|e| stream_err(e.to_string()))?;
    let checked = async {
        let n = TransferHeader::frame_len(prefix)?;
        let mut body = vec![0u8; n];
        recv.read_exact(&mut body)
            .await
            .map_err(|e| stream_err(e.to_string()))?;
        let header = TransferHeader::decode(&body, max_bytes)?;
        let dtype = header.element_type()?;
        Ok::<_, TransferError>((header, dtype))
    }
    .await;
    let (header, dtype) = match checked {
        Ok(h) => h,
        Err(e) => {
            refuse(&mut send, Some(&mut recv)).await;
            return Err(e);
        }
    };
    if let Some(part) = header.part {
        // Header invariant 4: a part is never in a shared-memory file.
        return receive_part(send, recv, remote, header, dtype, part, mailbox).await;
    }
    // Set for a mapped lent payload: fires when the mapping is dropped.
    let mut released = None;
    let payload = match &header.shm {
        Some(name) => {
            let got = if header.lent {
                crate::shm::map(&cfg.shm_dir, name, header.byte_len).map(|m| match m {
                    Some((mapping, on_release)) => {
                        released = Some(on_release);
                        Payload::Mapped(mapping)
                    }
                    None => Payload::Owned(Vec::new()),
                })
            } else {
                crate::shm::read(
                    &cfg.shm_dir,
                    name,
                    header.byte_len,
                    mailbox.buffer(header.byte_len as usize),
                )
                .map(Payload::Owned)
            };
            match got {
                Ok(p) => p,
                Err(e) => {
                    refuse(&mut send, None).await;
                    return Err(e);
                }
            }
        }
        None if header.lent => read_pieces(&mut recv, header.byte_len as usize)
            .await
            .map(Payload::Pieces)
            .map_err(|e| stream_err(format!("payload: {e}")))?,
        None => {
            let len = header.byte_len as usize;
            let mut data = mailbox.buffer(len);
            read_payload(&mut recv, len, &mut data)
                .await
                .map_err(|e| stream_err(format!("payload: {e}")))?;
            Payload::Owned(data)
        }
    };
    let path = if header.shm.is_some() { "shm" } else { "quic" };
    mailbox.deliver(path, header, dtype, payload);
    if let Some(released) = released {
        // Shm invariant 3: the sender has its file back only once the
        // mapping is dropped (taken and used, or discarded). A sender that
        // gave up, or a connection that closed, ends the wait: the sender
        // then removes the file, and the mapping stays valid until dropped.
        tokio::select! {
            _ = released => {}
            _ = send.stopped() => return Ok(()),
        }
    }
    send.write_all(&[0])
        .await
        .map_err(|e| stream_err(e.to_string()))?;
    let _ = send.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(30);

    /// Two endpoints with the same boot id, sharing a memory folder.
    fn same_host_pair(shm: &std::path::Path) -> (TransferEndpoint, TransferEndpoint, Peer) {
        let cfg = TransferConfig {
            boot_id: Some("test-boot".into()),
            shm_dir: shm.to_path_buf(),
            ..TransferConfig::default()
        };
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let a = TransferEndpoint::bind(any, 0, None, cfg.clone()).unwrap();
        let b = TransferEndpoint::bind(any, 1, None, cfg).unwrap();
        let to_b = Peer::new(b.local_addr().unwrap(), Some("test-boot".into()));
        (a, b, to_b)
    }

    /// Endpoint invariant 5 / shm invariant 3: a lent payload is read in
    /// place and the send completes only once the taker drops it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lent_payload_is_acknowledged_when_its_taker_is_done() {
        let shm = tempfile::tempdir().unwrap();
        let (a, b, to_b) = same_host_pair(shm.path());
        let a = Arc::new(a);
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let sending = {
            let (a, to_b, data) = (a.clone(), to_b.clone(), data.clone());
            tokio::spawn(async move {
                a.send_with(
                    &to_b,
                    7,
                    ElementType::U8,
                    &[data.len() as u64],
                    Outgoing::Borrowed(&data),
                    T,
                    true,
                )
                .await
            })
        };
        let (_, got) = b.take_first(&[(0, 7)], T).await.unwrap();
        assert!(matches!(got.payload, Payload::Mapped(_)), "read in place");
        assert_eq!(got.payload.pieces().collect::<Vec<_>>().concat(), data);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!sending.is_finished(), "acknowledged while still mapped");
        drop(got);
        tokio::time::timeout(T, sending)
            .await
            .expect("acknowledged once dropped")
            .unwrap()
            .unwrap();
        // A plain send on the same path is stored, not lent.
        a.send_to(&to_b, 8, ElementType::U8, &[3], b"abc", T)
            .await
            .unwrap();
        let (_, got) = b.take_first(&[(0, 8)], T).await.unwrap();
        assert!(matches!(got.payload, Payload::Owned(_)));
    }

    /// Invariant 7: a recycled buffer receives the next payload that fits;
    /// one too large for it, too small to keep, or over the limit does not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn recycled_buffers_receive_later_payloads_within_the_limit() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let a = TransferEndpoint::bind(any, 0, None, TransferConfig::default()).unwrap();
        let cfg = TransferConfig {
            spare_bytes: 5 << 20,
            ..TransferConfig::default()
        };
        let b = TransferEndpoint::bind(any, 1, None, cfg).unwrap();
        let to_b = b.local_addr().unwrap();
        let send = |tag: u64, len: usize| {
            let data = vec![tag as u8; len];
            let a = &a;
            async move {
                a.send(to_b, tag, ElementType::U8, &[len as u64], &data, T)
                    .await
                    .unwrap()
            }
        };
        send(1, 3 << 20).await;
        let first = b.recv(0, 1, T).await.unwrap().data;
        let (ptr, cap) = (first.as_ptr(), first.capacity());
        b.recycle(first);
        send(2, 2 << 20).await;
        let second = b.recv(0, 2, T).await.unwrap().data;
        assert_eq!(second.as_ptr(), ptr, "the spare was reused");
        assert_eq!(second.capacity(), cap);
        assert!(second.iter().all(|&x| x == 2), "holds the new payload");
        b.recycle(second);
        // Over twice the spare's size would waste it: fresh memory instead.
        send(3, 1 << 20).await;
        let third = b.recv(0, 3, T).await.unwrap().data;
        assert_ne!(third.as_ptr(), ptr);
        assert_eq!(third.len(), 1 << 20);
        // The limit: 3 MiB kept, another 3 MiB would pass 5 MiB.
        b.recycle(vec![0; 3 << 20]);
        assert_eq!(b.mailbox.spares.lock().unwrap().bytes, 3 << 20);
        b.recycle(vec![0; 100]);
        assert_eq!(
            b.mailbox.spares.lock().unwrap().buffers.len(),
            1,
            "small or over the limit: freed"
        );
    }

    /// Two endpoints over the network, the sender striping payloads of
    /// 1 MiB or more over three connections.
    fn striping_pair() -> (TransferEndpoint, TransferEndpoint, Peer) {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let cfg = TransferConfig {
            connections_per_peer: 3,
            stripe_bytes: 1 << 20,
            ..TransferConfig::default()
        };
        let a = TransferEndpoint::bind(any, 0, None, cfg).unwrap();
        let b = TransferEndpoint::bind(any, 1, None, TransferConfig::default()).unwrap();
        let to_b = Peer::new(b.local_addr().unwrap(), None);
        (a, b, to_b)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lent_network_payload_keeps_its_pieces_both_ways() {
        let (a, b, to_b) = striping_pair();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        // Shared pieces, cut anywhere, one of them empty.
        let shared = Outgoing::Shared(vec![
            Bytes::copy_from_slice(&data[..1]),
            Bytes::new(),
            Bytes::copy_from_slice(&data[1..2_000_001]),
            Bytes::copy_from_slice(&data[2_000_001..]),
        ]);
        let dims = [data.len() as u64];
        // Under the stripe size (one stream) and over it (parts).
        for (tag, stripe) in [(1, false), (2, true)] {
            let part = if stripe {
                shared.clone()
            } else {
                shared.range(0..900_000)
            };
            let want = part.pieces().collect::<Vec<_>>().concat();
            let dims = [want.len() as u64];
            a.send_with(&to_b, tag, ElementType::U8, &dims, part, T, true)
                .await
                .unwrap();
            let (_, got) = b.take_first(&[(0, tag)], T).await.unwrap();
            match (&got.payload, stripe) {
                (Payload::Pieces(p), false) => assert!(p.len() > 1, "{} pieces", p.len()),
                (Payload::Owned(_), true) => {}
                _ => panic!("tag {tag}: an unexpected kind of payload"),
            }
            assert_eq!(got.payload.into_vec(), want);
        }
        // Not lent: one buffer, as a mailbox keeps it.
        a.send_with(&to_b, 3, ElementType::U8, &dims, shared, T, false)
            .await
            .unwrap();
        let (_, got) = b.take_first(&[(0, 3)], T).await.unwrap();
        assert!(matches!(got.payload, Payload::Owned(_)));
        assert_eq!(got.payload.into_vec(), data);
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(start.elapsed() < T, "{what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Invariant 8: a large payload travels as one part per connection and
    /// arrives whole, byte for byte; a small one takes one stream.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_striped_payload_arrives_whole() {
        let (a, b, to_b) = striping_pair();
        let len = (3 << 20) + 5;
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4099) as u8).collect();
        let dims = [len as u64];
        let (sent, got) = tokio::join!(
            a.send_to(&to_b, 4, ElementType::U8, &dims, &data, T),
            b.recv(0, 4, T)
        );
        sent.unwrap();
        let got = got.unwrap();
        assert_eq!((got.dtype, &got.dims[..]), (ElementType::U8, &dims[..]));
        assert!(got.data == data, "byte for byte");
        let conns = (a.conns.lock().unwrap().keys())
            .filter(|(addr, _)| *addr == to_b.addr)
            .count();
        assert_eq!(conns, 3, "one part per connection");
        assert_eq!(b.mailbox.assemblies.len(), 0);
        // Under the threshold: one stream, delivered as before.
        a.send_to(&to_b, 5, ElementType::U8, &[3], &[7, 8, 9], T)
            .await
            .unwrap();
        assert_eq!(b.recv(0, 5, T).await.unwrap().data, [7, 8, 9]);
    }

    /// Stripe invariants 3 and 4: a sender that gives up after one part
    /// leaves nothing behind, and parts that do not belong together are
    /// refused and deliver nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_incomplete_or_mismatched_striped_payload_leaves_nothing() {
        let (a, b, to_b) = striping_pair();
        let part = |tag: u64, transfer: u64, index: u32| {
            let mut h = TransferHeader::new(0, tag, ElementType::U8, &[8]).unwrap();
            h.part = Some(Part {
                transfer,
                index,
                count: 2,
            });
            h
        };
        // Part 0 of 2, then the sender gives up before part 1.
        let p = part(1, 1000, 0);
        let gave_up = tokio::time::timeout(
            Duration::from_millis(300),
            a.send_stream(&to_b, Some(0), &p, Outgoing::Borrowed(&[1; 4])),
        )
        .await;
        assert!(gave_up.is_err(), "part 0 waits for the whole");
        until("the abandoned assembly is dropped", || {
            b.mailbox.assemblies.len() == 0
        })
        .await;
        // Part 0 of 2 from a sender whose endpoint then closes while the
        // part waits (its connections close, as when its process dies).
        let c = Arc::new(striping_pair().0);
        let sending = tokio::spawn({
            let (c, to_b, p) = (c.clone(), to_b.clone(), part(1, 1001, 0));
            async move {
                c.send_stream(&to_b, Some(0), &p, Outgoing::Borrowed(&[1; 4]))
                    .await
            }
        });
        until("part 0 waits for part 1", || {
            b.mailbox.assemblies.len() == 1
        })
        .await;
        c.endpoint.close(VarInt::from_u32(0), b"gone");
        assert!(sending.await.unwrap().is_err());
        until("the dead sender's assembly is dropped", || {
            b.mailbox.assemblies.len() == 0
        })
        .await;

        // Sends `(header, byte)` on connection 0 and, 100 ms later, the
        // second one on connection 1.
        let send_apart = |(p, x): (TransferHeader, u8), (q, y): (TransferHeader, u8)| {
            let (a, to_b) = (&a, &to_b);
            async move {
                let (x, y) = ([x; 4], [y; 4]);
                tokio::join!(
                    a.send_stream(to_b, Some(0), &p, Outgoing::Borrowed(&x)),
                    async {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        a.send_stream(to_b, Some(1), &q, Outgoing::Borrowed(&y))
                            .await
                    }
                )
            }
        };
        // Two parts of one transfer under different tags.
        let (first, second) = send_apart((part(2, 1001, 0), 1), (part(3, 1001, 1), 2)).await;
        assert!(first.is_err() && second.is_err(), "both refused");
        assert_eq!(b.mailbox.assemblies.len(), 0);
        // A repeated part.
        let p = part(4, 1002, 1);
        let (first, again) = send_apart((p.clone(), 1), (p, 1)).await;
        assert!(first.is_err() && again.is_err(), "both refused");
        assert_eq!(b.mailbox.assemblies.len(), 0);
        assert!(
            b.mailbox.slots.lock().unwrap().is_empty(),
            "nothing delivered"
        );
        // The endpoint still serves whole payloads.
        let data = vec![9u8; 2 << 20];
        let dims = [data.len() as u64];
        let (sent, got) = tokio::join!(
            a.send_to(&to_b, 6, ElementType::U8, &dims, &data, T),
            b.recv(0, 6, T)
        );
        sent.unwrap();
        assert!(got.unwrap().data == data);
    }

    /// A lent payload nobody takes does not hold its sender to the
    /// deadline once the receiving endpoint is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lent_payload_left_in_a_dropped_endpoint_releases_its_sender() {
        let shm = tempfile::tempdir().unwrap();
        let (a, b, to_b) = same_host_pair(shm.path());
        let a = Arc::new(a);
        let sending = {
            let (a, to_b) = (a.clone(), to_b.clone());
            tokio::spawn(async move {
                a.send_with(
                    &to_b,
                    1,
                    ElementType::U8,
                    &[4096],
                    Outgoing::Borrowed(&[1; 4096]),
                    T,
                    true,
                )
                .await
            })
        };
        // Wait until it arrived, then drop the receiver without taking it.
        let arrived = async {
            while b.mailbox.slots.lock().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(T, arrived).await.unwrap();
        drop(b);
        let started = std::time::Instant::now();
        let _ = tokio::time::timeout(Duration::from_secs(10), sending)
            .await
            .expect("the sender is released well before its deadline");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
