//! What a transfer carries, out and in.

use bytes::Bytes;
use tessel_pjrt::ElementType;

/// An array received from a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The element type.
    pub dtype: ElementType,
    /// The dimensions.
    pub dims: Vec<u64>,
    /// The elements' bytes.
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
pub(super) fn slices<'a>(
    one: Option<&'a [u8]>,
    many: &'a [Bytes],
) -> impl Iterator<Item = &'a [u8]> + Clone {
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
/// way out, shared pieces, which it keeps until the peer acknowledges
/// them and never copies (invariant 9), or bytes the caller no longer
/// needs, which a sealed data channel encrypts where they are instead of
/// copying them first (elsewhere: as borrowed).
#[derive(Debug)]
pub(crate) enum Outgoing<'a> {
    Borrowed(&'a [u8]),
    Shared(Vec<Bytes>),
    Spent(&'a mut [u8]),
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
            Outgoing::Spent(b) => slices(Some(b), &[]),
        }
    }

    /// The same bytes again, without a copy (spent ones as borrowed).
    pub(crate) fn reborrow(&self) -> Outgoing<'_> {
        match self {
            Outgoing::Borrowed(b) => Outgoing::Borrowed(b),
            Outgoing::Shared(p) => Outgoing::Shared(p.clone()),
            Outgoing::Spent(b) => Outgoing::Borrowed(b),
        }
    }

    /// Bytes `range` of these (spent ones as borrowed).
    pub(super) fn range(&self, range: std::ops::Range<usize>) -> Outgoing<'_> {
        match self {
            Outgoing::Borrowed(b) => Outgoing::Borrowed(&b[range]),
            Outgoing::Spent(b) => Outgoing::Borrowed(&b[range]),
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

/// An array taken from the mailbox, its payload here.
pub(crate) struct Arrived {
    pub dtype: ElementType,
    pub dims: Vec<u64>,
    pub payload: Payload,
}

/// A lent payload still on its data channel (invariant 12): the taker
/// reads its bytes straight where they belong, and the channel then
/// answers and serves the next transfer.
pub(crate) struct LentChannel {
    pub(super) channel: super::data_channel::DataChannel,
    pub(super) len: usize,
    pub(super) back: tokio::sync::oneshot::Sender<super::data_channel::DataChannel>,
}

impl LentChannel {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Reads the payload into `dst`, exactly its length.
    pub(crate) async fn read_into(self, dst: &mut [u8]) -> std::io::Result<()> {
        self.read(super::data_channel::Landing::Slice(dst)).await
    }

    /// Reads the payload into `buf`, an empty buffer with room for it.
    pub(super) async fn read_to(self, mut buf: Vec<u8>) -> std::io::Result<Vec<u8>> {
        self.read(super::data_channel::Landing::Vec(&mut buf))
            .await?;
        Ok(buf)
    }

    /// Reads the payload to `landing`, then hands the channel back.
    async fn read(mut self, landing: super::data_channel::Landing<'_>) -> std::io::Result<()> {
        self.channel.read_payload(self.len, landing).await?;
        let _ = self.back.send(self.channel);
        Ok(())
    }
}

/// What waits in the mailbox: a payload here, or one on its channel.
pub(crate) enum Incoming {
    Here(Payload),
    OnChannel(LentChannel),
}

/// An array waiting in the mailbox (invariant 3).
pub(crate) struct Waiting {
    pub dtype: ElementType,
    pub dims: Vec<u64>,
    pub incoming: Incoming,
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
