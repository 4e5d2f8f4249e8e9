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
//! 4. Every call has a deadline; a connection per peer is reused.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{Connection, Endpoint, RecvStream, SendStream, VarInt};
use tessel_kvstore::tls::TlsFiles;
use tessel_pjrt::ElementType;
use tokio::sync::Notify;

use crate::error::{Result, TransferError};
use crate::header::TransferHeader;

/// ALPN of the transfer protocol.
pub const ALPN: &[u8] = b"tessel-transfer";

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
}

impl Default for TransferConfig {
    fn default() -> Self {
        TransferConfig {
            max_bytes: 64 << 30,
            stream_window: 16 << 20,
            connection_window: 64 << 20,
        }
    }
}

impl TransferConfig {
    fn transport(&self) -> Arc<quinn::TransportConfig> {
        let mut t = quinn::TransportConfig::default();
        let clamp = |v: u64| VarInt::from_u64(v).unwrap_or(VarInt::MAX);
        t.stream_receive_window(clamp(self.stream_window));
        t.receive_window(clamp(self.connection_window));
        t.send_window(self.connection_window);
        t.max_concurrent_bidi_streams(clamp(4096));
        t.keep_alive_interval(Some(Duration::from_millis(500)));
        t.max_idle_timeout(Some(
            quinn::IdleTimeout::try_from(Duration::from_secs(5)).expect("small"),
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

#[derive(Default)]
struct Mailbox {
    slots: Mutex<HashMap<(u32, u64), VecDeque<Received>>>,
    arrived: Notify,
}

/// A worker's transfer endpoint.
pub struct TransferEndpoint {
    rank: u32,
    endpoint: Endpoint,
    conns: Mutex<HashMap<SocketAddr, Connection>>,
    mailbox: Arc<Mailbox>,
    accept: tokio::task::JoinHandle<()>,
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
        let tls_err = |e: tessel_kvstore::tls::TlsError| TransferError::Tls(e.to_string());
        let (mut server, mut client) = match tls {
            Some(t) => (
                t.server_config(ALPN).map_err(tls_err)?,
                t.client_config(ALPN).map_err(tls_err)?,
            ),
            None => tessel_kvstore::tls::insecure_configs(ALPN).map_err(tls_err)?,
        };
        server.transport_config(cfg.transport());
        client.transport_config(cfg.transport());
        let mut endpoint = Endpoint::server(server, addr).map_err(|e| TransferError::Bind {
            addr,
            reason: e.to_string(),
        })?;
        endpoint.set_default_client_config(client);
        let mailbox = Arc::new(Mailbox::default());
        let accept = tokio::spawn(accept_loop(endpoint.clone(), mailbox.clone(), cfg));
        Ok(TransferEndpoint {
            rank,
            endpoint,
            conns: Mutex::new(HashMap::new()),
            mailbox,
            accept,
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

    async fn connection(&self, peer: SocketAddr) -> Result<Connection> {
        if let Some(c) = self.conns.lock().expect("not poisoned").get(&peer) {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        let connect_err = |reason: String| TransferError::Connect { addr: peer, reason };
        let conn = self
            .endpoint
            .connect(peer, tessel_kvstore::tls::SERVER_NAME)
            .map_err(|e| connect_err(e.to_string()))?
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        self.conns
            .lock()
            .expect("not poisoned")
            .insert(peer, conn.clone());
        Ok(conn)
    }

    /// Sends an array to `peer` under `tag`; returns once the peer stored
    /// it (invariant 4: within `timeout`).
    pub async fn send(
        &self,
        peer: SocketAddr,
        tag: u64,
        dtype: ElementType,
        dims: &[u64],
        data: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        let header = TransferHeader::new(self.rank, tag, dtype, dims)?;
        if header.byte_len != data.len() as u64 {
            return Err(TransferError::InvalidHeader(format!(
                "{}{dims:?} is {} bytes, the data has {}",
                dtype.name(),
                header.byte_len,
                data.len()
            )));
        }
        let attempt = async {
            let conn = self.connection(peer).await?;
            let stream_err = |reason: String| TransferError::Stream {
                peer: peer.to_string(),
                reason,
            };
            let (mut send, mut recv) = conn
                .open_bi()
                .await
                .map_err(|e| stream_err(e.to_string()))?;
            send.write_all(&header.encode())
                .await
                .map_err(|e| stream_err(e.to_string()))?;
            send.write_all(data)
                .await
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
        };
        tokio::time::timeout(timeout, attempt).await.map_err(|_| {
            TransferError::DeadlineExceeded {
                what: format!("send of tag {tag} to {peer}"),
                after: timeout,
            }
        })?
    }

    /// Takes the next array `from` sent under `tag`, waiting up to
    /// `timeout` (invariant 3).
    pub async fn recv(&self, from: u32, tag: u64, timeout: Duration) -> Result<Received> {
        let wait = async {
            loop {
                let arrived = self.mailbox.arrived.notified();
                tokio::pin!(arrived);
                arrived.as_mut().enable();
                if let Some(r) = self.take(from, tag) {
                    return r;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| TransferError::DeadlineExceeded {
                what: format!("receive of tag {tag} from rank {from}"),
                after: timeout,
            })
    }

    fn take(&self, from: u32, tag: u64) -> Option<Received> {
        let mut slots = self.mailbox.slots.lock().expect("not poisoned");
        let queue = slots.get_mut(&(from, tag))?;
        let r = queue.pop_front();
        if queue.is_empty() {
            slots.remove(&(from, tag));
        }
        r
    }
}

async fn accept_loop(endpoint: Endpoint, mailbox: Arc<Mailbox>, cfg: TransferConfig) {
    while let Some(incoming) = endpoint.accept().await {
        let mailbox = mailbox.clone();
        let cfg = cfg.clone();
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok((send, recv)) = conn.accept_bi().await {
                let mailbox = mailbox.clone();
                let max = cfg.max_bytes;
                tokio::spawn(async move {
                    if let Err(e) = receive(send, recv, &mailbox, max).await {
                        tracing::warn!(error = %e, "transfer refused");
                    }
                });
            }
        });
    }
}

/// One incoming transfer (invariants 1–3).
async fn receive(
    mut send: SendStream,
    mut recv: RecvStream,
    mailbox: &Mailbox,
    max_bytes: u64,
) -> Result<()> {
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
            let _ = recv.stop(VarInt::from_u32(REFUSED));
            let _ = send.write_all(&[1]).await;
            let _ = send.finish();
            return Err(e);
        }
    };
    let mut data = vec![0u8; header.byte_len as usize];
    recv.read_exact(&mut data)
        .await
        .map_err(|e| stream_err(format!("payload: {e}")))?;
    {
        let mut slots = mailbox.slots.lock().expect("not poisoned");
        slots
            .entry((header.from, header.tag))
            .or_default()
            .push_back(Received {
                dtype,
                dims: header.dims,
                data,
            });
    }
    mailbox.arrived.notify_waiters();
    send.write_all(&[0])
        .await
        .map_err(|e| stream_err(e.to_string()))?;
    let _ = send.finish();
    Ok(())
}
