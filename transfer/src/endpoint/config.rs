//! Limits and QUIC tuning of an endpoint, and who its peers are.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quinn::VarInt;

use super::GSO_MAX_UDP_PAYLOAD;
use crate::channel::Encryption;

/// Limits and QUIC tuning.
#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// The largest payload a peer may announce.
    pub max_bytes: u64,
    /// Per-stream and per-connection receive windows.
    pub stream_window: u64,
    /// The receive window of a connection.
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
    /// Whether network payloads are encrypted: they travel over data
    /// channels set up over mutual TLS (invariant 11), of sealed records
    /// (on) or plain TCP (off).
    pub encryption: Encryption,
    /// With encryption on, send network payloads on QUIC streams instead
    /// of sealed data channels (the path before them, kept to compare:
    /// `tessel-bench transfer --paths network-quic`). Receiving takes
    /// either.
    pub quic_payloads: bool,
    /// The job (attempt) this endpoint serves: a data channel is granted
    /// only to a sender of the same job (invariant 11).
    pub job: String,
    /// How long a data channel waits for more of a payload it started
    /// before it ends (a stalled or vanished sender; TCP has no QUIC
    /// keep-alives to tell).
    pub payload_stall: Duration,
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
            encryption: Encryption::On,
            quic_payloads: false,
            job: String::new(),
            payload_stall: Duration::from_secs(30),
        }
    }
}

impl TransferConfig {
    /// Transport settings; `same_host` picks the large-datagram profile
    /// (invariant 6).
    pub(super) fn transport(&self, same_host: bool) -> Arc<quinn::TransportConfig> {
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

/// Where a peer listens, which host it runs on, and who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its endpoint's address.
    pub addr: SocketAddr,
    /// The peer's boot id, when known (same as ours → shared memory).
    pub boot_id: Option<String>,
    /// The worker the peer runs on, when known: its certificate must name
    /// it (invariant 10).
    pub worker: Option<String>,
}

impl Peer {
    /// A peer at `addr` with boot id `boot_id`.
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
