//! The receiving side: accepting streams, validating headers, reading
//! payloads (over the network, from shared memory, or in parts), and
//! answering (invariants 1-3, 7-9).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use quinn::{Endpoint, RecvStream, SendStream, VarInt};
use tessel_pjrt::ElementType;

use crate::channel::{self, ChannelAnswer, ChannelRequest, Encryption};
use crate::error::{Result, TransferError};
use crate::header::TransferHeader;
use crate::stripe::{part_range, Part};

use super::channels::ChannelServer;
use super::ranks::Ranks;
use super::*;

pub(super) async fn accept_loop(
    endpoint: Endpoint,
    mailbox: Arc<Mailbox>,
    cfg: TransferConfig,
    channels: Arc<ChannelServer>,
    ranks: Arc<Ranks>,
) {
    while let Some(incoming) = endpoint.accept().await {
        let mailbox = mailbox.clone();
        let cfg = cfg.clone();
        let channels = channels.clone();
        let ranks = ranks.clone();
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            let remote = conn.remote_address();
            let sender = Sender {
                conn: conn.clone(),
                remote,
                who: Arc::new(tessel_tls::peer_identity(&conn)),
                ranks,
            };
            let mut credit = tessel_tls::StreamCredit::new(&conn);
            while let Ok((send, recv)) = conn.accept_bi().await {
                let open = credit.accepted();
                let mailbox = mailbox.clone();
                let cfg = cfg.clone();
                let channels = channels.clone();
                let sender = sender.clone();
                tokio::spawn(async move {
                    let received = receive(send, recv, &sender, &mailbox, &cfg, &channels);
                    if let Err(e) = received.await {
                        tracing::warn!(error = %e, "transfer refused");
                    }
                    drop(open);
                });
            }
        });
    }
}

/// Hands `take` exactly `len` payload bytes (`len` was validated against
/// the limit) in the pieces the stream delivers them in.
pub(super) async fn read_chunks(
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
pub(super) async fn read_payload<B: bytes::BufMut>(
    recv: &mut RecvStream,
    len: usize,
    data: &mut B,
) -> std::result::Result<(), String> {
    read_chunks(recv, len, |bytes| data.put_slice(&bytes)).await
}

/// Exactly `len` payload bytes in the pieces the stream hands out, without
/// copying them (invariant 9).
pub(super) async fn read_pieces(
    recv: &mut RecvStream,
    len: usize,
) -> std::result::Result<Vec<Bytes>, String> {
    let mut pieces = Vec::new();
    read_chunks(recv, len, |bytes| pieces.push(bytes)).await?;
    Ok(pieces)
}

/// Refuses a stream: stops reading it (if still reading) and answers `1`.
pub(super) async fn refuse(send: &mut SendStream, recv: Option<&mut RecvStream>) {
    if let Some(recv) = recv {
        let _ = recv.stop(VarInt::from_u32(REFUSED));
    }
    let _ = send.write_all(&[1]).await;
    let _ = send.finish();
}

/// One part of a striped payload (invariant 8, stripe invariants 2–4),
/// its header validated: fills its piece, delivers the whole if it is the
/// last, and answers once the whole is delivered or abandoned.
pub(super) async fn receive_part(
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

/// Who sent a stream: its connection's address and certificate, and the
/// job's ranks to check its claims against (invariant 13).
#[derive(Clone)]
pub(super) struct Sender {
    conn: quinn::Connection,
    remote: SocketAddr,
    who: Arc<tessel_tls::Identity>,
    ranks: Arc<Ranks>,
}

/// A request for a data channel, over mutual TLS (invariants 11 and 13).
async fn answer_channel_request(
    mut send: SendStream,
    mut recv: RecvStream,
    sender: &Sender,
    channels: &ChannelServer,
    asked: Encryption,
) -> Result<()> {
    let remote = sender.remote;
    let stream_err = |reason: String| TransferError::Stream {
        peer: remote.to_string(),
        reason,
    };
    let mut prefix = [0u8; 4];
    recv.read_exact(&mut prefix)
        .await
        .map_err(|e| stream_err(e.to_string()))?;
    let request = async {
        let mut body = vec![0u8; channel::frame_len(prefix)?];
        recv.read_exact(&mut body)
            .await
            .map_err(|e| stream_err(e.to_string()))?;
        ChannelRequest::decode(&body)
    };
    let answer = match request.await {
        Ok(r) => match sender.ranks.admit(r.from, &sender.who).await {
            // Invariant 13, with its reason for the sender.
            Err(e) => ChannelAnswer::Refused(e.to_string()),
            Ok(()) => channels.answer(&r, asked, remote, |token| {
                super::channels::export_keys(&sender.conn, token)
            }),
        },
        Err(e) => {
            refuse(&mut send, Some(&mut recv)).await;
            return Err(e);
        }
    };
    send.write_all(&answer.encode())
        .await
        .map_err(|e| stream_err(e.to_string()))?;
    let _ = send.finish();
    Ok(())
}

/// One incoming transfer (invariants 1–3).
pub(super) async fn receive(
    mut send: SendStream,
    mut recv: RecvStream,
    sender: &Sender,
    mailbox: &Mailbox,
    cfg: &TransferConfig,
    channels: &ChannelServer,
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
    if let Some(asked) = Encryption::requested(prefix) {
        return answer_channel_request(send, recv, sender, channels, asked).await;
    }
    let remote = sender.remote;
    let checked = async {
        let n = TransferHeader::frame_len(prefix)?;
        let mut body = vec![0u8; n];
        recv.read_exact(&mut body)
            .await
            .map_err(|e| stream_err(e.to_string()))?;
        let header = TransferHeader::decode(&body, max_bytes)?;
        // Invariant 13, before anything is allocated for the payload.
        sender.ranks.admit(header.from, &sender.who).await?;
        let dtype = header.dtype;
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
