//! Data channels ([`crate::channel`]): granted over mutual TLS, then
//! transfers over TCP, sealed ([`crate::seal`]) or plain by the job's
//! setting, with the QUIC stream's framing: header frame, exactly
//! `byte_len` bytes, one answer byte (`0` stored, `1` refused) once the
//! array is in the mailbox. A channel carries one transfer at a time; a
//! sender keeps its idle channels to a peer and opens another when all
//! are busy.
//!
//! Only payloads on the network use channels: a same-host payload's
//! header still goes over QUIC (endpoint invariant 5), and a received
//! chunk arrives in one buffer (no lent pieces on this path).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::channel::{self, ChannelAnswer, ChannelRequest, Encryption, TOKEN_LEN};
use crate::error::{Result, TransferError};
use crate::header::TransferHeader;
use crate::seal::{Side, EXPORTER_LABEL, KEY_MATERIAL};
use crate::stripe::part_range;

use super::data_channel::{DataChannel, Landing};
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
    /// A sealed channel's keying material, exported from the session
    /// that granted it.
    keys: Option<[u8; KEY_MATERIAL]>,
    expires: Instant,
}

/// The receiving side: the TCP port and the grants waiting for it.
pub(super) struct ChannelServer {
    port: u16,
    grants: Mutex<HashMap<[u8; TOKEN_LEN], Grant>>,
    job: String,
    encryption: Encryption,
}

/// Keying material for the channel of `token`, exported from the QUIC
/// connection that asked for it (seal: both ends derive the same).
pub(super) fn export_keys(
    conn: &Connection,
    token: &[u8; TOKEN_LEN],
) -> Result<[u8; KEY_MATERIAL]> {
    let mut material = [0u8; KEY_MATERIAL];
    conn.export_keying_material(&mut material, EXPORTER_LABEL, token)
        .map_err(|_| TransferError::Tls("exporting a data channel's keys failed".into()))?;
    Ok(material)
}

impl ChannelServer {
    /// Binds a TCP port on `ip`; returns the server and its accept loop.
    pub(super) fn bind(
        ip: std::net::IpAddr,
        job: String,
        encryption: Encryption,
    ) -> std::io::Result<(Arc<ChannelServer>, TcpListener)> {
        let std = std::net::TcpListener::bind(SocketAddr::new(ip, 0))?;
        std.set_nonblocking(true)?;
        let listener = TcpListener::from_std(std)?;
        let server = Arc::new(ChannelServer {
            port: listener.local_addr()?.port(),
            grants: Mutex::new(HashMap::new()),
            job,
            encryption,
        });
        Ok((server, listener))
    }

    /// The data port.
    pub(super) fn port(&self) -> u16 {
        self.port
    }

    /// The answer to a request for a channel of setting `asked` that came
    /// over mutual TLS from `remote` (endpoint invariant 11); `export`
    /// gives a sealed channel's keys for its token ([`export_keys`]).
    pub(super) fn answer(
        &self,
        request: &ChannelRequest,
        asked: Encryption,
        remote: SocketAddr,
        export: impl FnOnce(&[u8; TOKEN_LEN]) -> Result<[u8; KEY_MATERIAL]>,
    ) -> ChannelAnswer {
        if asked != self.encryption {
            return ChannelAnswer::Refused(format!(
                "this endpoint's transfer encryption is {} and the sender's is {asked}: \
                 one job cannot mix them",
                self.encryption
            ));
        }
        if request.job != self.job {
            return ChannelAnswer::Refused(format!(
                "this endpoint serves job `{}`, not `{}`",
                self.job, request.job
            ));
        }
        let token = match channel::new_token() {
            Ok(t) => t,
            Err(e) => return ChannelAnswer::Refused(e.to_string()),
        };
        let keys = match asked {
            Encryption::Off => None,
            Encryption::On => match export(&token) {
                Ok(k) => Some(k),
                Err(e) => return ChannelAnswer::Refused(e.to_string()),
            },
        };
        let mut grants = self.grants.lock().expect("not poisoned");
        let now = Instant::now();
        grants.retain(|_, g| g.expires > now);
        if grants.len() >= MAX_GRANTS {
            return ChannelAnswer::Refused(format!("{MAX_GRANTS} channels are being set up"));
        }
        grants.insert(
            token,
            Grant {
                from: request.from,
                quic_remote: remote,
                keys,
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

/// Accepts data connections until the endpoint is dropped; dropping this
/// future ends every channel it serves.
pub(super) async fn serve(
    listener: TcpListener,
    server: Arc<ChannelServer>,
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

/// One data connection: its token, then transfers until the sender
/// closes it (endpoint invariant 11).
async fn receive_channel(
    mut socket: TcpStream,
    server: &ChannelServer,
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
    let mut channel = DataChannel::new(
        socket,
        grant.keys.as_ref(),
        Side::Receiver,
        cfg.payload_stall,
    );
    // Granted only for this server's setting.
    let path = server.encryption.channel_path();
    channel
        .write_small(&[0])
        .await
        .map_err(|e| err(e.to_string()))?;
    loop {
        let body = match channel.read_frame().await {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(()),
            Err(e) => {
                let _ = channel.write_small(&[1]).await;
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
                let _ = channel.write_small(&[1]).await;
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
                            let _ = channel.write_small(&[1]).await;
                            return Err(e);
                        }
                    };
                let range = part_range(header.byte_len, part.index, part.count);
                let part_len = (range.end - range.start) as usize;
                let read = channel.read_payload(part_len, Landing::Bytes(&mut piece));
                if let Err(e) = read.await {
                    mailbox.assemblies.abandon(key);
                    return Err(err(format!("part {} of {}: {e}", part.index, part.count)));
                }
                if let Some(whole) = mailbox.assemblies.fill(key, part.index, piece) {
                    mailbox.deliver(path, header, dtype, Payload::Owned(whole.data));
                    let _ = whole.delivered.send(true);
                }
                tokio::select! {
                    d = delivery.wait_for(|d| *d) => d.is_ok(),
                    _ = channel.closed() => {
                        mailbox.assemblies.abandon(key);
                        return Ok(());
                    }
                }
            }
            // Invariant 12: the taker reads it, then hands the channel back.
            None if header.lent => {
                let (back, returned) = tokio::sync::oneshot::channel();
                let lent = LentChannel { channel, len, back };
                mailbox.deliver_incoming(path, header, dtype, Incoming::OnChannel(lent));
                match returned.await {
                    Ok(c) => channel = c,
                    // Dropped unread (a broken call discarded it): the
                    // sender learns it from the closed channel.
                    Err(_) => return Ok(()),
                }
                true
            }
            None => {
                let mut data = mailbox.buffer(len);
                channel
                    .read_payload(len, Landing::Vec(&mut data))
                    .await
                    .map_err(|e| err(format!("payload: {e}")))?;
                mailbox.deliver(path, header, dtype, Payload::Owned(data));
                true
            }
        };
        channel
            .write_small(&[if delivered { 0 } else { 1 }])
            .await
            .map_err(|e| err(e.to_string()))?;
    }
}

/// The sending side: idle channels by peer address, each with the
/// certificate of the connection that asked for it (invariant 10).
#[derive(Default)]
pub(super) struct Channels {
    idle: Mutex<HashMap<SocketAddr, Vec<(DataChannel, Verified)>>>,
}

impl TransferEndpoint {
    /// A channel to `peer`: an idle one, or a new one asked for over the
    /// QUIC connection (invariant 11).
    async fn channel(&self, peer: &Peer) -> Result<(DataChannel, Verified)> {
        let idle = self
            .channels
            .idle
            .lock()
            .expect("not poisoned")
            .get_mut(&peer.addr)
            .and_then(Vec::pop);
        if let Some((c, who)) = idle {
            self.check_reuse(peer, &who)?;
            return Ok((c, who));
        }
        let addr = peer.addr;
        let connect_err = |reason: String| TransferError::Connect { addr, reason };
        let (conn, who) = self.connection(peer).await?;
        let (mut send, mut recv) = conn
            .open_bi()
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        let request = ChannelRequest {
            from: self.rank,
            job: self.cfg.job.clone(),
        };
        send.write_all(&request.encode(self.cfg.encryption))
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
        tokio::io::AsyncWriteExt::write_all(&mut socket, &token)
            .await
            .map_err(|e| connect_err(e.to_string()))?;
        let keys = match self.cfg.encryption {
            Encryption::Off => None,
            Encryption::On => Some(export_keys(&conn, &token)?),
        };
        let stall = self.cfg.payload_stall;
        let mut channel = DataChannel::new(socket, keys.as_ref(), Side::Sender, stall);
        let ok = channel
            .read_byte()
            .await
            .map_err(|e| connect_err(format!("data channel {data_addr}: {e}")))?;
        if ok != 0 {
            return Err(connect_err(format!("data channel {data_addr} refused")));
        }
        Ok((channel, who))
    }

    /// One transfer on a channel: `header`, `payload`, the answer; the
    /// channel is kept for the next transfer only if all went well.
    pub(super) async fn send_on_channel(
        &self,
        peer: &Peer,
        header: &TransferHeader,
        payload: Outgoing<'_>,
    ) -> Result<()> {
        let stream_err = |reason: String| TransferError::Stream {
            peer: peer.addr.to_string(),
            reason,
        };
        let (mut channel, who) = self.channel(peer).await?;
        channel
            .write_small(&header.encode())
            .await
            .map_err(|e| stream_err(e.to_string()))?;
        let written = match payload {
            Outgoing::Spent(bytes) => channel.write_payload_in_place(bytes).await,
            other => channel.write_payload(other.pieces()).await,
        };
        written.map_err(|e| stream_err(e.to_string()))?;
        let ack = channel
            .read_byte()
            .await
            .map_err(|e| stream_err(format!("no acknowledgement: {e}")))?;
        if ack != 0 {
            return Err(stream_err("the receiver refused the transfer".into()));
        }
        self.channels
            .idle
            .lock()
            .expect("not poisoned")
            .entry(peer.addr)
            .or_default()
            .push((channel, who));
        Ok(())
    }
}
