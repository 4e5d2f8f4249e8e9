//! A data channel's bytes: raw on the unencrypted data plane, sealed
//! records with encryption on ([`crate::seal`], whose invariant 4 fixes
//! how messages map to records).
//!
//! Payloads land where they belong: plain bytes are read straight into
//! the destination, and sealed ciphertext too, then opened there in place,
//! so neither path copies a payload after the kernel has.

use std::io::{self, IoSlice};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::header::TransferHeader;
use crate::seal::{self, Opener, Sealer, Side, KEY_MATERIAL, RECORD, TAG_LEN};

/// A connected data channel.
pub(crate) struct DataChannel {
    socket: TcpStream,
    sealed: Option<Box<Sealed>>,
    /// Once a message has begun, each read must make progress within this
    /// (`TransferConfig::payload_stall`).
    stall: Duration,
}

struct Sealed {
    sealer: Sealer,
    opener: Opener,
    /// The record being written, reused (capacity for a whole one).
    record: Vec<u8>,
}

/// Where a payload's bytes go.
pub(crate) enum Landing<'a> {
    /// Appended to an empty buffer with room reserved (no zero fill).
    Vec(&'a mut Vec<u8>),
    /// The same, for a striped part's piece.
    Bytes(&'a mut BytesMut),
    /// Over memory of exactly the payload's length (the all-gather's
    /// result).
    Slice(&'a mut [u8]),
}

fn invalid(e: crate::TransferError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// `read`, given up after `stall` without progress.
async fn timed<T>(
    stall: Duration,
    read: impl std::future::Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout(stall, read).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the peer sent nothing for {stall:?} mid-message"),
        )
    })?
}

/// Appends exactly `n` bytes from `socket` to `buf`.
async fn append<B: BufMut>(
    socket: &mut TcpStream,
    buf: &mut B,
    n: usize,
    stall: Duration,
) -> io::Result<()> {
    let mut have = 0;
    while have < n {
        let mut room = (&mut *buf).limit(n - have);
        let got = timed(stall, socket.read_buf(&mut room)).await?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        have += got;
    }
    Ok(())
}

impl Landing<'_> {
    /// Reads the next `n` bytes into place; returns them.
    async fn land(
        &mut self,
        socket: &mut TcpStream,
        at: usize,
        n: usize,
        stall: Duration,
    ) -> io::Result<&mut [u8]> {
        match self {
            Landing::Vec(v) => {
                append(socket, &mut **v, n, stall).await?;
                let len = v.len();
                Ok(&mut v[len - n..])
            }
            Landing::Bytes(b) => {
                append(socket, &mut **b, n, stall).await?;
                let len = b.len();
                Ok(&mut b[len - n..])
            }
            Landing::Slice(s) => {
                // Each read must come within `stall`, not the whole: a
                // large payload on a slow network is not a stall.
                let dst = &mut s[at..at + n];
                let mut have = 0;
                while have < n {
                    let got = timed(stall, socket.read(&mut dst[have..])).await?;
                    if got == 0 {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    have += got;
                }
                Ok(dst)
            }
        }
    }

    /// Room for the payload: a slice must be exactly `len`.
    fn check(&self, len: usize) -> io::Result<()> {
        match self {
            Landing::Slice(s) if s.len() != len => Err(io::Error::other(format!(
                "{} bytes wanted of a {len}-byte payload",
                s.len()
            ))),
            _ => Ok(()),
        }
    }
}

impl DataChannel {
    /// A channel on `socket`: sealed with the keys from `material` (this
    /// end being `side`), or plain without.
    pub(super) fn new(
        socket: TcpStream,
        material: Option<&[u8; KEY_MATERIAL]>,
        side: Side,
        stall: Duration,
    ) -> DataChannel {
        let sealed = material.map(|m| {
            let (sealer, opener) = seal::keys(m, side);
            Box::new(Sealed {
                sealer,
                opener,
                record: Vec::new(),
            })
        });
        DataChannel {
            socket,
            sealed,
            stall,
        }
    }

    /// Writes a header frame or an answer byte (one record when sealed).
    pub(super) async fn write_small(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.sealed {
            None => self.socket.write_all(bytes).await,
            Some(s) => {
                let record = s.sealer.record(bytes).map_err(invalid)?;
                self.socket.write_all(&record).await
            }
        }
    }

    /// Writes a payload given as slices in order (records of [`RECORD`]
    /// bytes when sealed, whatever the slices' bounds).
    pub(super) async fn write_payload<'p>(
        &mut self,
        pieces: impl Iterator<Item = &'p [u8]>,
    ) -> io::Result<()> {
        let DataChannel { socket, sealed, .. } = self;
        let Some(s) = sealed else {
            for piece in pieces {
                socket.write_all(piece).await?;
            }
            return Ok(());
        };
        if s.record.capacity() < 4 + RECORD + TAG_LEN {
            s.record = Vec::with_capacity(4 + RECORD + TAG_LEN);
        }
        Sealer::begin(&mut s.record);
        for mut piece in pieces {
            while !piece.is_empty() {
                let take = (RECORD + 4 - s.record.len()).min(piece.len());
                s.record.extend_from_slice(&piece[..take]);
                piece = &piece[take..];
                if s.record.len() == RECORD + 4 {
                    s.sealer.seal(&mut s.record).map_err(invalid)?;
                    socket.write_all(&s.record).await?;
                    Sealer::begin(&mut s.record);
                }
            }
        }
        if s.record.len() > 4 {
            s.sealer.seal(&mut s.record).map_err(invalid)?;
            socket.write_all(&s.record).await?;
        }
        Ok(())
    }

    /// Writes a payload the caller no longer needs: sealed, its records
    /// are encrypted where they are (no copy), so it is left as
    /// ciphertext.
    pub(super) async fn write_payload_in_place(&mut self, payload: &mut [u8]) -> io::Result<()> {
        let DataChannel { socket, sealed, .. } = self;
        let Some(s) = sealed else {
            return socket.write_all(payload).await;
        };
        for body in payload.chunks_mut(RECORD) {
            let (prefix, tag) = s.sealer.seal_in_place(body).map_err(invalid)?;
            let mut parts = [
                IoSlice::new(&prefix),
                IoSlice::new(body),
                IoSlice::new(&tag),
            ];
            let mut left = &mut parts[..];
            while !left.is_empty() {
                let n = socket.write_vectored(left).await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                IoSlice::advance_slices(&mut left, n);
            }
        }
        Ok(())
    }

    /// The next header frame's body; `None` if the peer closed the
    /// channel between transfers.
    pub(super) async fn read_frame(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut prefix = [0u8; 4];
        match self.socket.read_exact(&mut prefix).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        if self.sealed.is_none() {
            let n = TransferHeader::frame_len(prefix).map_err(invalid)?;
            let mut body = vec![0u8; n];
            timed(self.stall, self.socket.read_exact(&mut body)).await?;
            return Ok(Some(body));
        }
        let mut body = self
            .read_record(prefix, 5..=4 + crate::header::MAX_HEADER)
            .await?;
        let framed =
            TransferHeader::frame_len(body[..4].try_into().expect("4")).map_err(invalid)?;
        if framed != body.len() - 4 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a header frame of {framed} bytes in a record of {}",
                    body.len()
                ),
            ));
        }
        body.drain(..4);
        Ok(Some(body))
    }

    /// Reads one answer byte (one record when sealed).
    pub(super) async fn read_byte(&mut self) -> io::Result<u8> {
        let mut prefix = [0u8; 4];
        if self.sealed.is_none() {
            self.socket.read_exact(&mut prefix[..1]).await?;
            return Ok(prefix[0]);
        }
        self.socket.read_exact(&mut prefix).await?;
        Ok(self.read_record(prefix, 1..=1).await?[0])
    }

    /// The rest of a small sealed record whose length `prefix` announced
    /// (within `allowed`), opened: a header frame or an answer byte.
    async fn read_record(
        &mut self,
        prefix: [u8; 4],
        allowed: std::ops::RangeInclusive<usize>,
    ) -> io::Result<Vec<u8>> {
        let n = seal::record_len(prefix).map_err(invalid)?;
        if !allowed.contains(&n) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a record of {n} bytes where {allowed:?} belong"),
            ));
        }
        let mut record = vec![0u8; n + TAG_LEN];
        timed(self.stall, self.socket.read_exact(&mut record)).await?;
        let tag = record[n..].try_into().expect("16");
        record.truncate(n);
        let s = self.sealed.as_mut().expect("a sealed channel");
        s.opener.open(prefix, &mut record, tag).map_err(invalid)?;
        Ok(record)
    }

    /// Reads exactly `len` payload bytes into `dst`; a sender silent for
    /// the stall deadline mid-payload is given up.
    pub(super) async fn read_payload(
        &mut self,
        len: usize,
        mut dst: Landing<'_>,
    ) -> io::Result<()> {
        dst.check(len)?;
        let DataChannel {
            socket,
            sealed,
            stall,
        } = self;
        let stall = *stall;
        let Some(s) = sealed else {
            dst.land(socket, 0, len, stall).await?;
            return Ok(());
        };
        // A record's tag and the next one's length come in one read.
        let mut between = [0u8; TAG_LEN + 4];
        let mut have = 0;
        if len > 0 {
            timed(stall, socket.read_exact(&mut between[TAG_LEN..])).await?;
        }
        while have < len {
            let prefix: [u8; 4] = between[TAG_LEN..].try_into().expect("4");
            let n = seal::record_len(prefix).map_err(invalid)?;
            if n > len - have {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "a record of {n} bytes where {} of the payload remain",
                        len - have
                    ),
                ));
            }
            let body = dst.land(socket, have, n, stall).await?;
            let more = have + n < len;
            let trailer = if more {
                &mut between[..]
            } else {
                &mut between[..TAG_LEN]
            };
            timed(stall, socket.read_exact(trailer)).await?;
            let tag = between[..TAG_LEN].try_into().expect("16");
            s.opener.open(prefix, body, tag).map_err(invalid)?;
            have += n;
        }
        Ok(())
    }

    /// Waits until the socket is readable: between a payload and its
    /// answer the sender writes nothing, so that means it closed the
    /// channel (or broke the protocol).
    pub(super) async fn closed(&self) {
        let mut probe = [0u8; 1];
        let _ = self.socket.peek(&mut probe).await;
    }
}
