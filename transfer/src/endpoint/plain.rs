//! The unencrypted data plane ([`Encryption::Off`]): data channels granted
//! over mutual TLS ([`crate::channel`]), then transfers over plain TCP
//! with the QUIC stream's framing: header frame, exactly `byte_len` bytes,
//! one answer byte (`0` stored, `1` refused) once the array is in the
//! mailbox. A channel carries one transfer at a time; a sender keeps its
//! idle channels to a peer and opens another when all are busy.
//!
//! Only payloads on the network use channels: a same-host payload's
//! header still goes over QUIC (endpoint invariant 5), and a received
//! chunk arrives in one buffer (no lent pieces on this path).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BufMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::channel::{self, ChannelAnswer, ChannelRequest, TOKEN_LEN};
use crate::error::{Result, TransferError};
use crate::header::TransferHeader;
use crate::stripe::part_range;

use super::payload::LentChannel;
use super::*;

/// How long a grant waits for its connection, and a new connection for
/// its token.
const SETUP_DEADLINE: Duration = Duration::from_secs(10);
/// Most grants waiting for their connections at once.
const MAX_GRANTS: usize = 4096;

/// A granted channel not yet connected.
struct Grant {
    from: u32,
    /// The sender's QUIC address: striped parts assemble under it, as they
    /// do when they come over QUIC.
    quic_remote: SocketAddr,
    expires: Instant,
}

/// The receiving side: the TCP port and the grants waiting for it.
pub(super) struct PlainServer {
    port: u16,
    grants: Mutex<HashMap<[u8; TOKEN_LEN], Grant>>,
    job: String,
}

impl PlainServer {
    /// Binds a TCP port on `ip`; returns the server and its accept loop.
    pub(super) fn bind(
        ip: std::net::IpAddr,
        job: String,
    ) -> std::io::Result<(Arc<PlainServer>, TcpListener)> {
        let std = std::net::TcpListener::bind(SocketAddr::new(ip, 0))?;
        std.set_nonblocking(true)?;
        let listener = TcpListener::from_std(std)?;
        let server = Arc::new(PlainServer {
            port: listener.local_addr()?.port(),
            grants: Mutex::new(HashMap::new()),
            job,
        });
        Ok((server, listener))
    }

    /// The data port.
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// The answer to a request that came over mutual TLS from `remote`
    /// (endpoint invariant 11).
    pub(super) fn answer(&self, request: &ChannelRequest, remote: SocketAddr) -> ChannelAnswer {
        if request.job != self.job {
            return ChannelAnswer::Refused(format!(
                "this endpoint serves job `{}`, not `{}`",
                self.job, request.job
            ));
        }
        let mut grants = self.grants.lock().expect("not poisoned");
        let now = Instant::now();
        grants.retain(|_, g| g.expires > now);
        if grants.len() >= MAX_GRANTS {
            return ChannelAnswer::Refused(format!("{MAX_GRANTS} channels are being set up"));
        }
        let token = match channel::new_token() {
            Ok(t) => t,
            Err(e) => return ChannelAnswer::Refused(e.to_string()),
        };
        grants.insert(
            token,
            Grant {
                from: request.from,
                quic_remote: remote,
                expires: now + SETUP_DEADLINE,
            },
        );
        ChannelAnswer::Grant {
            port: self.port,
            token,
        }
    }

    fn redeem(&self, token: &[u8; TOKEN_LEN]) -> Option<Grant> {
        let grant = self.grants.lock().expect("not poisoned").remove(token)?;
        (grant.expires > Instant::now()).then_some(grant)
    }
}

/// What a receiver answers a channel request with when its own data
/// plane is encrypted.
pub(super) fn refuse_encrypted() -> ChannelAnswer {
    ChannelAnswer::Refused(
        "this endpoint's transfer encryption is on and the sender's is off: \
         one job cannot mix them"
            .into(),
    )
}

/// Accepts data connections until the endpoint is dropped; dropping this
/// future ends every channel it serves.
pub(super) async fn serve(
    listener: TcpListener,
    server: Arc<PlainServer>,
    mailbox: Arc<Mailbox>,
    cfg: TransferConfig,
) {
    let mut channels = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (socket, from) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors, say: not a reason to spin.
                        tracing::warn!(error = %e, "accepting a data channel");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (server, mailbox, cfg) = (server.clone(), mailbox.clone(), cfg.clone());
                channels.spawn(async move {
                    if let Err(e) = receive_channel(socket, &server, &mailbox, &cfg).await {
                        tracing::warn!(%from, error = %e, "data channel closed");
                    }
                });
            }
            Some(_) = channels.join_next(), if !channels.is_empty() => {}
        }
    }
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = TransferHeader::frame_len(prefix)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// Appends exactly `len` bytes to `data` (room reserved, no zero fill);
/// a sender silent for `stall` mid-payload is given up.
pub(super) async fn read_into<B: BufMut>(
    socket: &mut TcpStream,
    len: usize,
    data: &mut B,
    stall: Duration,
) -> std::io::Result<()> {
    let mut have = 0;
    while have < len {
        let mut room = (&mut *data).limit(len - have);
        let n = tokio::time::timeout(stall, socket.read_buf(&mut room))
            .await
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the sender sent nothing for {stall:?} mid-payload"),
                )
            })??;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        have += n;
    }
    Ok(())
}

/// One data connection: its token, then transfers until the sender
/// closes it (endpoint invariant 11).
async fn receive_channel(
    mut socket: TcpStream,
    server: &PlainServer,
    mailbox: &Mailbox,
    cfg: &TransferConfig,
) -> Result<()> {
    let err = |reason: String| TransferError::Stream {
        peer: "data channel".into(),
        reason,
    };
    let _ = socket.set_nodelay(true);
    let mut token = [0u8; TOKEN_LEN];
    tokio::time::timeout(SETUP_DEADLINE, socket.read_exact(&mut token))
        .await
        .map_err(|_| err("no token within the set-up deadline".into()))?
        .map_err(|e| err(format!("reading its token: {e}")))?;
    let grant = server
        .redeem(&token)
        .ok_or_else(|| err("a connection without a valid token".into()))?;
    socket
        .write_all(&[0])
        .await
        .map_err(|e| err(e.to_string()))?;
    loop {
        let body = match read_frame(&mut socket).await {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(()),
            Err(e) => {
                let _ = socket.write_all(&[1]).await;
                return Err(err(format!("header: {e}")));
            }
        };
        let header = match TransferHeader::decode(&body, cfg.max_bytes).and_then(|h| {
            if h.from != grant.from {
                Err(TransferError::InvalidHeader(format!(
                    "rank {} on a channel granted to rank {}",
                    h.from, grant.from
                )))
            } else if h.shm.is_some() {
                Err(TransferError::InvalidHeader(
                    "a shared-memory file on a data channel".into(),
                ))
            } else {
                Ok(h)
            }
        }) {
            Ok(h) => h,
            Err(e) => {
                // The payload that follows cannot be skipped safely: the
                // channel ends here.
                let _ = socket.write_all(&[1]).await;
                return Err(e);
            }
        };
        let dtype = header.dtype;
        let len = header.byte_len as usize;
        let delivered = match header.part {
            Some(part) => {
                let key = (grant.quic_remote, part.transfer);
                let (mut piece, mut delivery) =
                    match mailbox
                        .assemblies
                        .claim(key, &header, |len| mailbox.buffer(len))
                    {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = socket.write_all(&[1]).await;
                            return Err(e);
                        }
                    };
                let range = part_range(header.byte_len, part.index, part.count);
                let part_len = (range.end - range.start) as usize;
                if let Err(e) =
                    read_into(&mut socket, part_len, &mut piece, cfg.payload_stall).await
                {
                    mailbox.assemblies.abandon(key);
                    return Err(err(format!("part {} of {}: {e}", part.index, part.count)));
                }
                if let Some(whole) = mailbox.assemblies.fill(key, part.index, piece) {
                    mailbox.deliver("tcp", header, dtype, Payload::Owned(whole.data));
                    let _ = whole.delivered.send(true);
                }
                // The sender writes nothing until answered: a readable
                // socket means it closed (or broke the protocol).
                let mut probe = [0u8; 1];
                tokio::select! {
                    d = delivery.wait_for(|d| *d) => d.is_ok(),
                    _ = socket.peek(&mut probe) => {
                        mailbox.assemblies.abandon(key);
                        return Ok(());
                    }
                }
            }
            // Invariant 12: the taker reads it, then hands the socket back.
            None if header.lent => {
                let (back, returned) = tokio::sync::oneshot::channel();
                let stall = cfg.payload_stall;
                let lent = LentChannel {
                    socket,
                    len,
                    back,
                    stall,
                };
                mailbox.deliver_incoming("tcp", header, dtype, Incoming::OnChannel(lent));
                match returned.await {
                    Ok(s) => socket = s,
                    // Dropped unread (a broken call discarded it): the
                    // sender learns it from the closed channel.
                    Err(_) => return Ok(()),
                }
                true
            }
            None => {
                let mut data = mailbox.buffer(len);
                read_into(&mut socket, len, &mut data, cfg.payload_stall)
                    .await
                    .map_err(|e| err(format!("payload: {e}")))?;
                mailbox.deliver("tcp", header, dtype, Payload::Owned(data));
                true
            }
        };
        socket
            .write_all(&[if delivered { 0 } else { 1 }])
            .await
            .map_err(|e| err(e.to_string()))?;
    }
}

/// The sending side: idle channels by peer address.
#[derive(Default)]
pub(super) struct Channels {
    idle: Mutex<HashMap<SocketAddr, Vec<TcpStream>>>,
}

impl TransferEndpoint {
    /// A channel to `peer`: an idle one, or a new one asked for over the
    /// QUIC connection (invariant 11).
    async fn channel(&self, peer: &Peer) -> Result<TcpStream> {
        if let Some(c) = self
            .channels
            .idle
            .lock()
            .expect("not poisoned")
            .get_mut(&peer.addr)
            .and_then(Vec::pop)
        {
            return Ok(c);
        }
        let addr = peer.addr;
        let connect_err = |reason: String| TransferError::Connect { addr, reason };
        let conn = self.connection(peer).await?;
        let (mut send, mut recv) = conn
            .open_bi()
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        let request = ChannelRequest {
            from: self.rank,
            job: self.cfg.job.clone(),
        };
        send.write_all(&request.encode())
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        let _ = send.finish();
        let mut prefix = [0u8; 4];
        recv.read_exact(&mut prefix)
            .await
            .map_err(|e| connect_err(format!("asking for a data channel: {e}")))?;
        let mut body = vec![0u8; channel::frame_len(prefix)?];
        recv.read_exact(&mut body)
            .await
            .map_err(|e| connect_err(format!("asking for a data channel: {e}")))?;
        let (port, token) = match ChannelAnswer::decode(&body)? {
            ChannelAnswer::Grant { port, token } => (port, token),
            ChannelAnswer::Refused(why) => {
                return Err(TransferError::Encryption(format!(
                    "{addr} refused a data channel: {why}"
                )))
            }
        };
        let data_addr = SocketAddr::new(addr.ip(), port);
        let mut socket = TcpStream::connect(data_addr)
            .await
            .map_err(|e| connect_err(format!("data channel {data_addr}: {e}")))?;
        let _ = socket.set_nodelay(true);
        socket
            .write_all(&token)
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        let mut ok = [1u8; 1];
        socket
            .read_exact(&mut ok)
            .await
            .map_err(|e| connect_err(format!("data channel {data_addr}: {e}")))?;
        if ok[0] != 0 {
            return Err(connect_err(format!("data channel {data_addr} refused")));
        }
        Ok(socket)
    }

    /// One transfer on a channel: `header`, `payload`, the answer; the
    /// channel is kept for the next transfer only if all went well.
    pub(super) async fn send_plain(
        &self,
        peer: &Peer,
        header: &TransferHeader,
        payload: Outgoing<'_>,
    ) -> Result<()> {
        let stream_err = |reason: String| TransferError::Stream {
            peer: peer.addr.to_string(),
            reason,
        };
        let mut socket = self.channel(peer).await?;
        socket
            .write_all(&header.encode())
            .await
            .map_err(|e| stream_err(e.to_string()))?;
        for piece in payload.pieces() {
            socket
                .write_all(piece)
                .await
                .map_err(|e| stream_err(e.to_string()))?;
        }
        let mut ack = [1u8; 1];
        socket
            .read_exact(&mut ack)
            .await
            .map_err(|e| stream_err(format!("no acknowledgement: {e}")))?;
        if ack[0] != 0 {
            return Err(stream_err("the receiver refused the transfer".into()));
        }
        self.channels
            .idle
            .lock()
            .expect("not poisoned")
            .entry(peer.addr)
            .or_default()
            .push(socket);
        Ok(())
    }
}
