//! The cluster's TLS, shared by the key-value service
//! (`tessel-kv-service`) and the transfer layer (`tessel-transfer`) without
//! either depending on the other: the cluster CA, per-node certificates with
//! a role and a name, the verifiers that check them, QUIC's TLS
//! configurations, and [`udp_socket`] (a UDP socket with the buffer sizes
//! QUIC wants).
//!
//! Mutual TLS for every QUIC connection of the cluster.
//!
//! `tessel certs init` ([`init_ca`]) creates a cluster CA; `tessel certs
//! issue` ([`issue`]) signs one certificate per coordinator, worker and
//! client with its role and name ([`Identity`]). Every process loads its
//! folder ([`TlsFiles::load`]): servers demand a client certificate from
//! the same CA, clients verify the server against it, so a peer holding a
//! certificate of another CA is refused at the handshake. Beyond the chain,
//! clients check that the server is who they meant to reach, and servers
//! which roles they admit ([`Expect`], [`Accept`]); the replica authorizes each
//! request by the identity (`tessel_kv_service::authz`). `tessel certs init --hosts`
//! also makes one certificate every node shares ([`init_certs`]): for
//! tests, it passes every check.
//!
//! Without a TLS folder a process must say `--insecure`
//! ([`insecure_configs`]): an ephemeral self-signed server certificate and a
//! client that accepts any server and presents none. For tests and local
//! experiments only.
//!
//! # The modules in detail
//!
//! * **`tessel-tls`** (`tls/`) — `tls` (the cluster CA, per-node certificates
//!   with a `tessel://ROLE/NAME` URI, identities, rustls verifiers, `TlsFiles`)
//!   and `udp_socket` (sockets with large buffers), shared by the key-value
//!   service and the transfer layer.
//!
//! # Identity
//!
//! * `tessel certs init DIR --ca-only` makes the cluster CA (`ca.pem`,
//!   `ca.key`); `tessel certs issue CA_DIR --role R --name N [--hosts ..]
//!   --out DIR` signs a node's certificate and writes its folder (`ca.pem`,
//!   `node.pem`, `node.key`). `ca.key` never leaves the CA's host.
//! * A node certificate carries the DNS name `tessel` (chains are verified
//!   against it), the `--hosts` names and IPs, and its identity as a URI
//!   subject alternative name `tessel://{role}/{name}`; roles `coordinator`,
//!   `worker`, `client`. Client certificates are for client authentication
//!   only. `tessel certs init DIR --hosts ..` also makes one certificate all
//!   nodes share (no URI): it passes every check (tests, `tessel local`).
//! * Clients check the server (`verify::ServerVerifier`): a replica must be a
//!   coordinator whose certificate also names the address dialed; a transfer
//!   peer must be a worker, the one the topology names when known.
//!   Servers check clients (`verify::ClientVerifier`): replicas admit every
//!   role and authorize per request; transfer endpoints admit workers only.
//! * `authz::authorize` (pure) answers allow, refuse, or allow under a guard.
//!   Raft messages, forwarded and guarded requests and replica set changes
//!   come from coordinators only. A worker writes `workers/{its name}/`,
//!   `assignments/{its name}/` and keys outside tessel's zones; a write to
//!   `jobs/{J}/…` is wrapped as `Op::Guarded` (`kv/src/state/guard.rs`): the
//!   state machine applies it only if `assignments/{name}/{J}` exists (for a
//!   job-level `J` without `@`: that key or any `assignments/{name}/{J}@*`),
//!   at apply time, so no race with the scheduler's unassignment lets a
//!   worker write another attempt's keys; otherwise `PermissionDenied`,
//!   nothing written. A worker's read of `jobs/{J}/arrays/` or `logs/` is
//!   wrapped as `ClientRequest::Guarded` and checked on the leader after the
//!   linearizable wait; a listing over several jobs is refused. A client
//!   writes `sched/state`, `sched/jobs/{id}/bundle|cancel`,
//!   `workers/{w}/drain` and keys outside the zones, holds no leases. A
//!   prefix request is allowed only where it would be for every key under it.
//! * `TlsFiles` follows its folder (`tls/reload.rs`): handshakes take the
//!   certificate, key and CA bundle from `Current` (rustls cert resolvers and
//!   verifiers that read it per handshake); a watcher thread polls the files
//!   every second and swaps in a folder that parses whole (key matching
//!   certificate, inside its validity, the same identity), else logs once and
//!   keeps the old. `--tls-ca FILE` trusts a bundle kept apart (CA rotation).
//!   Certificates carry a validity (`--days`, CA ten years);
//!   `tessel certs issue --renew [--new-key] [--trust BUNDLE]` replaces
//!   them in place by renames. Metrics: `tessel_tls_certificate_expiry_seconds`,
//!   `tessel_tls_reloads_total{result}`.
//! * The chart's `perPod` mode: each pod's `tls` volume is cert-manager's
//!   csi-driver, `tessel://{role}/${POD_NAME}`; `shared` mode mounts one
//!   Secret. `tessel context` (`cli/src/context.rs`) keeps named
//!   (coordinators, TLS folder) pairs in `~/.config/tessel/config.toml`.
//! * A worker refuses to start with a certificate of another role, or with a
//!   `--worker-id` other than its certificate's name (which is the default
//!   id); a coordinator refuses a non-coordinator certificate.

mod credit;
mod files;
mod identity;
mod issue;
mod reload;
mod verify;

pub use credit::{OpenStream, StreamCredit, FIRST_STREAMS};
pub use files::show_time;
pub use identity::{identity_of, peer_identity, Identity, Role};
pub use issue::{init_ca, init_certs, issue, renew, NodeCert, Validity, CA_DAYS, NODE_DAYS};
pub use reload::RELOAD_POLL;
pub use verify::{check_client, check_server, Accept, Expect};

use reload::{Current, Resolver};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{CertificateParams, KeyPair};
use rustls::pki_types::PrivateKeyDer;

/// The DNS name every certificate of the cluster carries; chains are
/// verified against it.
pub const SERVER_NAME: &str = "tessel";

/// What can go wrong setting up TLS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// rcgen could not make a key or certificate.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file holds no PEM of the kind expected.
    #[error("{path}: not a PEM {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        what: &'static str,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// The certificate is past its validity.
    #[error("{path}: the certificate expired at {not_after}; renew it (`tessel certs issue --renew`, or your issuer)")]
    Expired {
        /// The certificate file.
        path: PathBuf,
        /// When it expired (RFC 3339, UTC).
        not_after: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// File names inside a TLS folder.
pub const CA_CERT: &str = "ca.pem";
/// The CA's key (only on the host that issues certificates).
pub const CA_KEY: &str = "ca.key";
/// This node's certificate.
pub const CERT: &str = "node.pem";
/// This node's key.
pub const KEY: &str = "node.key";

/// One TLS folder, followed on disk (see [`RELOAD_POLL`]): listeners and dialers
/// built from it present and trust what the folder holds now.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    current: Arc<Current>,
}

impl verify::Trust for Current {
    fn server(&self) -> Arc<rustls::client::WebPkiServerVerifier> {
        self.get().server_verifier.clone()
    }

    fn client(&self) -> Arc<dyn rustls::server::danger::ClientCertVerifier> {
        self.get().client_verifier.clone()
    }
}

impl TlsFiles {
    /// Loads `ca.pem`, `node.pem` and `node.key` from `dir` and watches
    /// them for renewals; refuses a certificate outside its validity.
    pub fn load(dir: &Path) -> Result<TlsFiles, TlsError> {
        Self::load_trusting(dir, None)
    }

    /// [`TlsFiles::load`], trusting the CA bundle in `ca` (when given)
    /// instead of the folder's `ca.pem`: a trust bundle mounted apart
    /// (trust-manager's), old and new CA while a CA rotates.
    pub fn load_trusting(dir: &Path, ca: Option<&Path>) -> Result<TlsFiles, TlsError> {
        Ok(TlsFiles {
            current: Current::open(dir, ca)?,
        })
    }

    /// Who this folder's certificate says we are.
    pub fn identity(&self) -> Identity {
        self.current.get().identity.clone()
    }

    /// When the certificate in use now stops being valid (seconds since
    /// the Unix epoch).
    pub fn not_after(&self) -> i64 {
        self.current.get().not_after
    }

    /// Looks at the files now instead of at the next poll; `Ok(true)` when
    /// a renewal was adopted.
    pub fn reload(&self) -> Result<bool, TlsError> {
        self.current.reload()
    }

    /// A server that requires a client certificate from the cluster CA, of
    /// a role `accept` admits.
    pub fn server_config(
        &self,
        alpn: &[u8],
        accept: Accept,
    ) -> Result<quinn::ServerConfig, TlsError> {
        let provider = provider();
        let verifier = verify::ClientVerifier::new(self.current.clone(), &provider, accept);
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(Arc::new(verifier))
            .with_cert_resolver(Arc::new(Resolver(self.current.clone())));
        tls.alpn_protocols = vec![alpn.to_vec()];
        quic_server(tls)
    }

    /// A client that verifies servers against the cluster CA, accepts only
    /// the server it `expect`s, and presents its own certificate.
    pub fn client_config(
        &self,
        alpn: &[u8],
        expect: Expect,
    ) -> Result<quinn::ClientConfig, TlsError> {
        let provider = provider();
        let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verify::ServerVerifier::new(
                self.current.clone(),
                &provider,
                expect,
            )))
            .with_client_cert_resolver(Arc::new(Resolver(self.current.clone())));
        tls.alpn_protocols = vec![alpn.to_vec()];
        quic_client(tls)
    }
}

/// The server name to dial `addr` with: its IP, which a coordinator's
/// certificate must name.
pub fn server_name(addr: std::net::SocketAddr) -> String {
    addr.ip().to_string()
}

/// ring's suites with AES-128-GCM first (ring lists AES-256 first): QUIC
/// seals and opens every packet with the suite's cipher, and 10 AES rounds
/// instead of 14 are cheaper per byte on the transfer path.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(p)
}

/// How long a silent peer keeps its connection. Not what finds a dead
/// peer: a waiting call gives that up after `tessel_kv_service` rpc's
/// `SILENCE` (1 s), counting only while its own process runs, and a
/// handshake after [`HANDSHAKE_TIMEOUT`]. Long because quinn's timer
/// counts while a starved process sends nothing: at 2 s, the replicas of a
/// 16,384-host bootstrap dropped the connections of a benchmark whose
/// runtime woke seconds late, and the replicas' own to each other (tens
/// of thousands of redials in a run), failing every call waiting on them.
/// Pings after `KEEP_ALIVE` (1.2 s) without a packet keep idle connections to
/// live peers. The dialing side alone sends them: the other side's
/// acknowledgements are the dialer's sign of life, its pings the
/// acceptor's, so a replica does not also ping each of thousands of
/// workers' connections. QUIC restarts the timer on any packet received,
/// so a worker whose lease keep-alive is answered every second (the
/// heartbeat's default period) sends none: at half a second each worker
/// also sent a ping and the leader its acknowledgement every second, two
/// of the five packets the leader handled per worker (4,096 workers with
/// a connection each: leader CPU 58 → 50 %). A lost ping is sent again
/// after a probe timeout, well inside the idle timeout, which quinn also
/// stretches to three probe timeouts on a slow path.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a dial waits for the peer's handshake: a killed process never
/// answers one, and a call to it should move on as soon as a silent
/// connection's would.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
const KEEP_ALIVE: Duration = Duration::from_millis(1200);
/// Unread datagrams a connection keeps (quinn drops the oldest beyond it);
/// a larger datagram ends the connection.
const DATAGRAM_BUFFER: usize = 256;

/// Requests in flight per connection, at most. Blocking gets and watches
/// hold a stream each, so quinn's default (100) would let 100 waiting gets
/// starve the writes that would wake them. Not much more: quinn keeps the
/// state of up to this many streams per connection for reuse, and at 8192
/// the leader of `tessel-bench kv` held ~2.9 MB per client connection
/// (~250 MB of its 386 MB with 1 M keys). An accepted connection starts at
/// [`FIRST_STREAMS`] and earns more by using them ([`StreamCredit`]).
const MAX_STREAMS: u32 = 1024;

fn transport(dialer: bool) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    // Only the dialing side opens streams, and only bidirectional ones:
    // the dialer accepts none, the acceptor no unidirectional ones. quinn
    // sets up every stream the peer may open as the connection is made
    // (1,124 slots were 88 KiB of a dialed connection, `tessel-bench
    // dial`, paid again at every redial). The acceptor's limit starts low
    // and grows with use ([`StreamCredit`]).
    let accepted = if dialer { 0 } else { FIRST_STREAMS };
    t.max_concurrent_bidi_streams(accepted.into());
    t.max_concurrent_uni_streams(0u32.into());
    t.keep_alive_interval(dialer.then_some(KEEP_ALIVE));
    // Datagrams are only the liveness probes of a waiting call (`kv-service`
    // rpc invariant 4), never read: keep a few bytes of them, not quinn's
    // default megabyte per connection.
    t.datagram_receive_buffer_size(Some(DATAGRAM_BUFFER));
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(IDLE_TIMEOUT).expect("a small timeout"),
    ));
    Arc::new(t)
}

fn quic_server(tls: rustls::ServerConfig) -> Result<quinn::ServerConfig, TlsError> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut c = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    c.transport_config(transport(false));
    Ok(c)
}

fn quic_client(tls: rustls::ClientConfig) -> Result<quinn::ClientConfig, TlsError> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut c = quinn::ClientConfig::new(Arc::new(crypto));
    c.transport_config(transport(true));
    Ok(c)
}

/// `--insecure`: a throwaway self-signed server and a client that trusts any
/// server. No authentication at all.
pub fn insecure_configs(
    alpn: &[u8],
) -> Result<(quinn::ServerConfig, quinn::ClientConfig), TlsError> {
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec![SERVER_NAME.to_owned()])?.self_signed(&key)?;
    // (`--insecure` clients accept this and any other server.)
    let key_der = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key_der)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    server.alpn_protocols = vec![alpn.to_vec()];
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verify::AcceptAnyServer::new(&provider())))
        .with_no_client_auth();
    client.alpn_protocols = vec![alpn.to_vec()];
    Ok((quic_server(server)?, quic_client(client)?))
}

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

#[cfg(test)]
mod tests {
    /// Both ends offer AES-128-GCM first, so a connection between tessel
    /// processes negotiates it.
    #[test]
    fn aes_128_gcm_is_preferred() {
        let suites: Vec<_> = super::provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(suites[0], rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert!(suites.contains(&rustls::CipherSuite::TLS13_AES_256_GCM_SHA384));
        assert_eq!(
            suites.len(),
            rustls::crypto::ring::default_provider().cipher_suites.len()
        );
    }
}
