//! One transfer endpoint per job process: sends to and receives from peers
//! over QUIC (mutual TLS) and the data channels it grants.
//!
//! Protocol: one transfer at a time per QUIC stream or data channel. The
//! sender writes the header frame and exactly `byte_len` payload bytes; the
//! receiver answers one byte (`0` = stored, `1` = refused) once the payload
//! is in its mailbox, so a completed `send` means delivered. Payloads to
//! other hosts take data channels (sealed, or plain with encryption off:
//! invariant 11); same-host ones shared memory, announced over QUIC
//! (invariant 5).
//!
//! Invariants:
//! 1. Nothing is allocated for a payload before its header is validated
//!    (header invariant 1); a refused stream is reset, the rest keep serving.
//! 2. QUIC flow control is the backpressure: the payload is read into its
//!    final buffer as it arrives, and neither side buffers beyond the windows.
//! 3. Received arrays wait in a mailbox keyed by (sender rank, tag), each
//!    delivered once, in arrival order.
//! 4. Every call has a deadline; connections to a peer are reused.
//! 5. To a peer with our boot id the payload goes through a shared-memory
//!    file named in the header ([`crate::shm`]); a lent one is read in place
//!    and acknowledged once the receiver's mapping is dropped.
//! 6. Datagrams towards this host may grow to `max_udp_payload`, one per
//!    system call; towards other hosts they stay within
//!    [`GSO_MAX_UDP_PAYLOAD`], so no GSO batch passes the kernel's 64 KiB.
//! 7. A payload of at least [`MIN_SPARE`] bytes reuses a recycled buffer
//!    that fits; spares never hold more than `spare_bytes` in all.
//! 8. Up to `connections_per_peer` connections per peer, taken in turn; a
//!    network payload of at least `stripe_bytes` travels as one part each.
//! 9. A lent payload on the network is sent and delivered as shared pieces,
//!    never copied into one buffer by us ([`Outgoing::Shared`], [`Payload::Pieces`]).
//! 10. With certificates an endpoint admits only workers, and a sender checks
//!     that the peer's certificate names the worker its [`Peer`] runs on.
//! 11. A network payload travels on a data channel (unless
//!     `quic_payloads`): a TCP connection that presented a one-time token
//!     granted over mutual TLS to a sender of this job and setting,
//!     carrying that sender's rank only, in sealed records (encryption on,
//!     [`crate::seal`]) or plain (off); a sender silent for
//!     `payload_stall` (30 s) mid-message ends it. A connection or channel
//!     kept for reuse is checked against its peer's worker each time
//!     (invariant 10).
//! 12. A lent payload on a data channel stays there until taken: its taker
//!     reads it straight into place, then the channel answers and goes on.
//! 13. Once the job's ranks are bound ([`TransferEndpoint::bind_ranks`]), a
//!     header's `from` and a data channel's rank must run on the worker the
//!     sender's certificate names; anything else is refused (`ranks`).
//!
//! # The transfer protocol
//!
//! * QUIC (quinn 0.11), ALPN `tessel-transfer`, the same cluster CA and mutual
//!   TLS as the key-value protocol, admitting workers only (a sender checks
//!   the peer is the worker its `Peer` names); receive windows 16 MiB per stream, 64 MiB
//!   per connection; up to `connections_per_peer` (2) connections per peer,
//!   opened as needed and reused, transfers taking them in turn.
//! * One bidirectional stream per array: `u32` big-endian header length
//!   (1–4096), a postcard `TransferHeader {from, tag, dtype, dims, byte_len,
//!   shm, lent, part}`,
//!   then exactly `byte_len` raw bytes (never serde). The receiver checks
//!   dtype, `byte_len = size(dtype) × Π dims` (no overflow) and its limit
//!   (64 GiB by default) before allocating; a refused stream gets the byte
//!   `1` and a stop, an accepted one the byte `0` once the array is in the
//!   mailbox (keyed by sender rank and tag, delivered once, in order).
//! * Striped payloads (endpoint invariant 8, `stripe.rs`): a network payload
//!   of at least `stripe_bytes` (16 MiB) travels as one part per connection,
//!   each on its own stream with the whole array's header plus `part:
//!   Some({transfer, index, count})` (2–16 parts; part `i` carries bytes
//!   `[i·len/count, (i+1)·len/count)`). The receiver keys the assembly by the
//!   sender's address (its connections share one socket) and `transfer`; the
//!   first part allocates the whole buffer and splits it into one piece per
//!   part, each part reads into its own piece, and the last joins them in
//!   place and delivers the array. Every part is answered only once the whole
//!   is delivered (`0`) or abandoned (`1`): a part that disagrees with the
//!   first part's header or repeats an index, a part whose stream fails, or a
//!   sender that stops waiting drops the assembly. quinn drives each
//!   connection from one task, so two connections seal and open packets on
//!   two threads.
//! * Same host (equal boot ids): the header carries `shm: Some("tessel-{pid}-{n}")`
//!   and the stream no payload; the receiver accepts only names of that form,
//!   opens the file in `/dev/shm`, checks its length equals `byte_len`,
//!   reads it, then acknowledges. The file belongs to the sender, which
//!   reuses it for the next payload of the same length after the
//!   acknowledgement and removes it on failure or exit; files of dead
//!   processes are swept by the next endpoint on the host.
//! * Lent payloads on the network (`lent: true` without `shm`; endpoint
//!   invariant 9, collective invariant 10): a ring chunk is delivered in the
//!   pieces quinn's `read_chunk` hands out (slices of the decrypted
//!   datagrams), not copied into one buffer; the ring folds straight from
//!   them into fresh memory, or keeps them (all-gather), and sends that on
//!   with `write_all_chunks`, which quinn keeps by reference until
//!   acknowledged instead of copying into its send buffer. The result is
//!   written once at the end, into the input's own memory when the caller
//!   handed it over (`Bytes::try_into_mut` once quinn has let go of the
//!   sent slices).
//! * Lent files (`lent: true` with `shm`; collective invariant 7): a
//!   ring chunk of an all-reduce, reduce-scatter or all-gather is not copied
//!   out. The receiver maps the file read-only (`MAP_POPULATE`), the
//!   collective reduces or copies straight from the mapping, and the
//!   acknowledgement goes out when the mapping is dropped (or the sender
//!   stops the stream, or the connection closes); until then the sender
//!   neither writes nor shortens the file. Only the ring lends,
//!   since each ring step sends and receives at once; a sender that waits on
//!   its send before receiving (the descriptor ring, broadcast) would wait on
//!   a peer doing the same.
//! * Data channels (endpoint invariant 11, [`crate::channel`]): the
//!   endpoint also listens on a TCP port of its address. A sender asks for
//!   a channel on a QUIC stream (its rank, job and setting), gets the port
//!   and a 32-byte token valid once for 10 s, connects and presents it;
//!   the channel then carries that rank's transfers with the stream's
//!   framing (header, payload, answer byte), one at a time, and is kept
//!   for the next. Encryption on, every message is AES-128-GCM records
//!   (`crate::seal`) under keys both ends export from the QUIC
//!   connection's TLS session with the token as context: the ciphertext is
//!   read into the payload's place and opened there. A receiver of the
//!   other setting, or that serves another job, refuses the request with
//!   its reason. A lent
//!   chunk (the ring's all-gather) waits on its channel for its taker,
//!   which reads it straight into the array, and only then is answered
//!   (endpoint invariant 12); the ring keeps two chunks in flight per
//!   channel step, in the order the receiver takes them.
//! * Connection tuning: UDP socket buffers 8 MiB asked (the kernel caps
//!   them), keep-alive
//!   500 ms, idle timeout 2 s (a dead peer is noticed within 2 s). Datagram
//!   size (endpoint invariant 6): the connecting side of a transfer picks
//!   one of two client profiles. Towards a peer on this host (loopback
//!   address or same boot id) MTU discovery may reach 65,527 bytes and
//!   segmentation offload is off (one 64 KiB datagram per `sendmsg`);
//!   towards other hosts discovery stops at 6,500 bytes and GSO batches stay
//!   on. The cap exists because quinn hands the socket up to 10 datagrams per
//!   GSO send and Linux refuses a send above 64 KiB with `EMSGSIZE`, which
//!   quinn drops silently: with both large datagrams and GSO, every batch is
//!   lost and black-hole detection falls back to 1,200 bytes. On this host,
//!   should losses (a receive buffer overflowing) trigger that fallback, MTU
//!   discovery resumes after 1 s instead of quinn's minute.
//! * Receiving: the payload is read chunk by chunk (`read_chunk`) into
//!   capacity reserved from the validated header, with no zero-filling pass,
//!   and a buffer of several MiB asks for transparent huge pages
//!   (`tessel_transfer::memory::advise_huge_pages`), since faulting in a
//!   fresh buffer 4 KiB at a time is a large share of a transfer's CPU
//!   (docs/performance.md). The shared-memory read does the same.
//! * Spare buffers (endpoint invariant 7): a buffer handed back with
//!   `TransferEndpoint::recycle` (≥ 1 MiB, at most `spare_bytes`, 2 GiB by
//!   default, kept in all) receives a later payload whose length is from half
//!   its capacity to all of it, so a loop receiving the same sizes every step
//!   faults in and zeroes its memory once. `recv_buffer` recycles the host
//!   copy itself once the PJRT buffer holds the array.

mod channels;
mod config;
mod data_channel;
mod mailbox;
mod members;
mod payload;
mod ranks;
mod receive;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{Connection, Endpoint, VarInt};
use tessel_pjrt::ElementType;
use tessel_tls::{Accept, Expect, TlsFiles};

use crate::channel::Encryption;
use crate::error::{Result, TransferError};
use crate::header::TransferHeader;
use crate::shm::ShmPool;
use crate::stripe::{part_range, Part};

pub use config::{Peer, TransferConfig};
use mailbox::Mailbox;
pub use members::{Directory, Members};
use payload::Arrived;
pub use payload::Received;
pub(crate) use payload::{Incoming, Outgoing, Payload, Waiting};
use receive::accept_loop;

/// ALPN of the transfer protocol.
pub const ALPN: &[u8] = b"tessel-transfer";

/// The largest UDP payload a connection with segmentation offload may use.
/// quinn hands the socket up to 10 datagrams per GSO send and Linux refuses
/// a send above 64 KiB in all (`EMSGSIZE`, which quinn drops silently as if
/// it were a lost MTU probe): with a larger MTU every batch is lost and
/// black-hole detection falls back to 1,200-byte datagrams.
pub const GSO_MAX_UDP_PAYLOAD: u16 = 6_500;

/// Smallest buffer worth keeping as a spare (invariant 7).
pub const MIN_SPARE: usize = 1 << 20;

/// Stream reset codes.
const REFUSED: u32 = 1;

fn tls_err(e: tessel_tls::TlsError) -> TransferError {
    TransferError::Tls(e.to_string())
}

/// The certificate a connection's peer presented (invariant 10).
type Verified = Arc<tessel_tls::Identity>;

/// A worker's transfer endpoint.
pub struct TransferEndpoint {
    rank: u32,
    endpoint: Endpoint,
    /// Connection `k` (below `connections_per_peer`) to each peer address.
    /// Each with the certificate its peer presented (invariant 10).
    conns: Mutex<HashMap<(SocketAddr, usize), (Connection, Verified)>>,
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
    /// The data channels' port and grants, and their accept loop
    /// (invariant 11).
    channel_server: Arc<channels::ChannelServer>,
    channel_accept: tokio::task::JoinHandle<()>,
    /// Idle data channels to peers.
    channels: channels::Channels,
    /// The worker of each rank, once bound (invariant 13).
    ranks: Arc<ranks::Ranks>,
    cfg: TransferConfig,
    shm: ShmPool,
}

impl Drop for TransferEndpoint {
    fn drop(&mut self) {
        self.accept.abort();
        self.channel_accept.abort();
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
                let (server, client) = tessel_tls::insecure_configs(ALPN).map_err(tls_err)?;
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
            tessel_tls::udp_socket(addr, cfg.socket_buffer).map_err(|e| bind_err(e.to_string()))?;
        let endpoint = Endpoint::new(
            endpoint_cfg,
            Some(server),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(|e| bind_err(e.to_string()))?;
        let mailbox = Arc::new(Mailbox::default());
        let (channel_server, listener) =
            channels::ChannelServer::bind(addr.ip(), cfg.job.clone(), cfg.encryption)
                .map_err(|e| bind_err(format!("data channel port: {e}")))?;
        let channel_accept = tokio::spawn(channels::serve(
            listener,
            channel_server.clone(),
            mailbox.clone(),
            cfg.clone(),
        ));
        let ranks = Arc::new(ranks::Ranks::default());
        let accept = tokio::spawn(accept_loop(
            endpoint.clone(),
            mailbox.clone(),
            cfg.clone(),
            channel_server.clone(),
            ranks.clone(),
        ));
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
            channel_server,
            channel_accept,
            channels: channels::Channels::default(),
            ranks,
            shm: ShmPool::new(cfg.shm_dir.clone()),
            cfg,
        })
    }

    /// The job's ranks, by the worker each runs on (`None`: not known):
    /// from now on a sender's rank must be one of its certificate's worker
    /// (invariant 13). [`crate::Communicator::new`] binds its members.
    pub fn bind_ranks(&self, workers: Vec<Option<String>>) {
        self.ranks.bind(workers);
    }

    /// As [`Self::bind_ranks`], the ranks being a communicator's members:
    /// a rank's worker is looked up when it first sends.
    pub(crate) fn bind_members(&self, members: Arc<Members>) {
        self.ranks.bind_members(members);
    }

    /// Whether peers on this machine are reached through shared memory:
    /// the endpoint knows its boot id and is not forced onto the network
    /// ([`Self::same_host`] for a peer of this boot).
    pub(crate) fn shares_memory(&self) -> bool {
        !self.cfg.force_network && self.cfg.boot_id.is_some()
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.endpoint
            .local_addr()
            .map_err(|e| TransferError::Stream {
                peer: "local".into(),
                reason: e.to_string(),
            })
    }

    /// Where its data channels connect (invariant 11).
    pub fn data_addr(&self) -> Result<SocketAddr> {
        Ok(SocketAddr::new(
            self.local_addr()?.ip(),
            self.channel_server.port(),
        ))
    }

    /// This endpoint's rank.
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

    /// The next of `peer`'s connections in turn, with the certificate it
    /// was opened with.
    async fn connection(&self, peer: &Peer) -> Result<(Connection, Verified)> {
        let k = self.next_conn.fetch_add(1, Ordering::Relaxed) % self.cfg.connections_per_peer;
        self.connection_at(peer, k).await
    }

    async fn connection_at(&self, peer: &Peer, k: usize) -> Result<(Connection, Verified)> {
        let addr = peer.addr;
        if let Some((c, who)) = self.conns.lock().expect("not poisoned").get(&(addr, k)) {
            if c.close_reason().is_none() {
                self.check_reuse(peer, who)?;
                return Ok((c.clone(), who.clone()));
            }
        }
        let connect_err = |reason: String| TransferError::Connect { addr, reason };
        let client = self.client_config(peer)?;
        let conn = self
            .endpoint
            .connect_with(client, addr, tessel_tls::SERVER_NAME)
            .map_err(|e| connect_err(e.to_string()))?
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        let who = Arc::new(tessel_tls::peer_identity(&conn));
        self.conns
            .lock()
            .expect("not poisoned")
            .insert((addr, k), (conn.clone(), who.clone()));
        Ok((conn, who))
    }

    /// Invariant 10 for a connection or data channel opened before: the
    /// certificate `who` it was opened with must name the worker `peer`
    /// runs on now (another worker may have taken the address since).
    fn check_reuse(&self, peer: &Peer, who: &tessel_tls::Identity) -> Result<()> {
        if self.tls.is_none() {
            return Ok(());
        }
        tessel_tls::check_server(Some(who), &Expect::Worker(peer.worker.clone())).map_err(
            |reason| TransferError::Connect {
                addr: peer.addr,
                reason,
            },
        )
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
            .map(|(c, _)| c.stats())
    }

    /// Where this endpoint's shared-memory files live.
    pub(crate) fn shm_dir(&self) -> &std::path::Path {
        &self.cfg.shm_dir
    }

    /// Whether transfers to `peer` take the shared-memory path.
    pub fn same_host(&self, peer: &Peer) -> bool {
        self.shares_memory() && self.cfg.boot_id == peer.boot_id
    }

    /// Whether payloads to and from `peer` travel on data channels
    /// (invariant 11): they then arrive whole, in one buffer.
    pub(crate) fn on_data_channel(&self, peer: &Peer) -> bool {
        let quic = self.cfg.quic_payloads && self.cfg.encryption == Encryption::On;
        !quic && !self.same_host(peer)
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
        let path = match (&shm, self.on_data_channel(peer)) {
            (Some(_), _) => "shm",
            (None, true) => self.cfg.encryption.channel_path(),
            (None, false) => "quic",
        };
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
        if self.on_data_channel(peer) {
            return self.send_on_channel(peer, header, payload).await;
        }
        let conn = match conn {
            Some(k) => self.connection_at(peer, k).await?.0,
            None => self.connection(peer).await?.0,
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
            Outgoing::Spent(bytes) => send.write_all(bytes).await,
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

    /// As [`Self::recv_first`], with a lent file still in place (a payload
    /// still on its data channel is read here).
    pub(crate) async fn take_first(
        &self,
        keys: &[(u32, u64)],
        timeout: Duration,
    ) -> Result<(usize, Arrived)> {
        let taken = async {
            let (i, w) = self.wait_first(keys).await;
            Ok::<_, TransferError>((i, self.resolve(w).await?))
        };
        tokio::time::timeout(timeout, taken)
            .await
            .map_err(|_| TransferError::DeadlineExceeded {
                what: format!("receive of {keys:?}"),
                after: timeout,
            })?
    }

    /// As [`Self::take_first`], a payload on its data channel left there
    /// (invariant 12).
    pub(crate) async fn take_first_waiting(
        &self,
        keys: &[(u32, u64)],
        timeout: Duration,
    ) -> Result<(usize, Waiting)> {
        tokio::time::timeout(timeout, self.wait_first(keys))
            .await
            .map_err(|_| TransferError::DeadlineExceeded {
                what: format!("receive of {keys:?}"),
                after: timeout,
            })
    }

    async fn wait_first(&self, keys: &[(u32, u64)]) -> (usize, Waiting) {
        loop {
            let arrived = self.mailbox.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            if let Some(r) = self.take(keys) {
                return r;
            }
            arrived.await;
        }
    }

    /// A waiting array with its payload here: one still on its data
    /// channel is read into a buffer.
    pub(crate) async fn resolve(&self, w: Waiting) -> Result<Arrived> {
        let payload = match w.incoming {
            Incoming::Here(p) => p,
            Incoming::OnChannel(c) => {
                let buf = self.mailbox.buffer(c.len());
                let data = c.read_to(buf).await.map_err(|e| TransferError::Stream {
                    peer: "data channel".into(),
                    reason: format!("payload: {e}"),
                })?;
                Payload::Owned(data)
            }
        };
        Ok(Arrived {
            dtype: w.dtype,
            dims: w.dims,
            payload,
        })
    }

    fn take(&self, keys: &[(u32, u64)]) -> Option<(usize, Waiting)> {
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

#[cfg(test)]
mod tests;
