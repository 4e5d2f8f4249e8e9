//! The state of one collective call: tags, deadline, sends and receives
//! that watch for aborts, and the descriptor exchange (invariants 1-3).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessel_pjrt::ElementType;

use super::arenas::Arenas;
use super::descriptor::{Descriptor, DescriptorFrame};
use super::tag::{Phase, Tag};
use crate::endpoint::{Incoming, Members, Outgoing, Payload, TransferEndpoint, Waiting};
use crate::error::{Result, TransferError};

/// The state of one collective call.
pub(super) struct Call {
    pub(super) endpoint: Arc<TransferEndpoint>,
    pub(super) members: Arc<Members>,
    pub(super) rank: usize,
    pub(super) base: Tag,
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
    pub(super) chunk_bytes: usize,
    pub(super) what: String,
    /// Every rank is on this host: arenas instead of the ring (invariant 8).
    pub(super) shared: bool,
    pub(super) arenas: Arc<Mutex<Arenas>>,
}

impl Call {
    pub(super) fn n(&self) -> usize {
        self.members.len()
    }

    /// Every rank but this one, in order.
    pub(super) fn others(&self) -> Vec<usize> {
        (0..self.n()).filter(|&k| k != self.rank).collect()
    }

    pub(super) fn tag(&self, phase: Phase, step: usize, chunk: usize) -> u64 {
        self.base.at(phase, step, chunk)
    }

    pub(super) fn left(&self) -> Result<Duration> {
        self.deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| self.deadline_exceeded())
    }

    pub(super) fn deadline_exceeded(&self) -> TransferError {
        TransferError::DeadlineExceeded {
            what: self.what.clone(),
            after: self.timeout,
        }
    }

    pub(super) async fn send(
        &self,
        to: usize,
        tag: u64,
        dtype: ElementType,
        data: &[u8],
    ) -> Result<()> {
        self.send_with(to, tag, dtype, Outgoing::Borrowed(data), false)
            .await
    }

    /// `lend`: a ring chunk, lent to a same-host peer (invariant 7) or
    /// kept in its pieces by a network peer (invariant 10).
    pub(super) async fn send_with(
        &self,
        to: usize,
        tag: u64,
        dtype: ElementType,
        data: Outgoing<'_>,
        lend: bool,
    ) -> Result<()> {
        let count = (data.len() / dtype.size()) as u64;
        let peer = self.members.get(to).await?;
        let left = self.left()?;
        self.endpoint
            .send_with(peer, tag, dtype, &[count], data, left, lend)
            .await
            .map_err(|e| match e {
                TransferError::DeadlineExceeded { .. } => self.deadline_exceeded(),
                e => e,
            })
    }

    /// Waits for `tag` from `from`, or an abort from anyone (invariant 3).
    pub(super) async fn recv(&self, from: usize, tag: u64) -> Result<Vec<u8>> {
        self.take(from, tag).await.map(Payload::into_vec)
    }

    /// As [`Self::recv`], with a lent payload still in place.
    pub(super) async fn take(&self, from: usize, tag: u64) -> Result<Payload> {
        let waiting = self.take_waiting(from, tag).await?;
        let resolved = tokio::time::timeout(self.left()?, self.endpoint.resolve(waiting));
        Ok(resolved
            .await
            .map_err(|_| self.deadline_exceeded())??
            .payload)
    }

    /// As [`Self::take`], a payload on its data channel left there
    /// (endpoint invariant 12).
    async fn take_waiting(&self, from: usize, tag: u64) -> Result<Waiting> {
        let abort = self.base.abort();
        let mut keys = vec![(from as u32, tag)];
        keys.extend(
            (0..self.n())
                .filter(|&r| r != self.rank)
                .map(|r| (r as u32, abort)),
        );
        let (i, got) = self
            .endpoint
            .take_first_waiting(&keys, self.left()?)
            .await
            .map_err(|e| match e {
                TransferError::DeadlineExceeded { .. } => self.deadline_exceeded(),
                e => e,
            })?;
        if i > 0 {
            let reason = self.endpoint.resolve(got).await?.payload.into_vec();
            return Err(TransferError::Aborted {
                rank: keys[i].0,
                reason: String::from_utf8_lossy(&reason).into_owned(),
            });
        }
        Ok(got)
    }

    /// A ring chunk from `from` under `tag`, written into `dst`: read
    /// straight into it off its data channel (endpoint invariant 12), else
    /// copied.
    pub(super) async fn take_chunk_into(
        &self,
        from: usize,
        tag: u64,
        dst: &mut [u8],
    ) -> Result<()> {
        let mismatch = |got: usize| {
            TransferError::Mismatch(format!(
                "rank {from} sent {got} bytes for a {}-byte chunk",
                dst.len()
            ))
        };
        match self.take_waiting(from, tag).await?.incoming {
            Incoming::OnChannel(c) if c.len() != dst.len() => Err(mismatch(c.len())),
            Incoming::OnChannel(c) => {
                let read = tokio::time::timeout(self.left()?, c.read_into(dst));
                read.await
                    .map_err(|_| self.deadline_exceeded())?
                    .map_err(|e| TransferError::Stream {
                        peer: format!("rank {from}"),
                        reason: format!("chunk: {e}"),
                    })
            }
            Incoming::Here(p) if p.len() != dst.len() => Err(mismatch(p.len())),
            Incoming::Here(p) => {
                let mut at = 0;
                for piece in p.pieces() {
                    dst[at..at + piece.len()].copy_from_slice(piece);
                    at += piece.len();
                }
                if let Payload::Owned(v) = p {
                    self.endpoint.recycle(v);
                }
                Ok(())
            }
        }
    }

    /// A ring chunk of `len` bytes from `from` under `tag`.
    pub(super) async fn take_chunk(&self, from: usize, tag: u64, len: usize) -> Result<Payload> {
        let got = self.take(from, tag).await?;
        if got.len() != len {
            return Err(TransferError::Mismatch(format!(
                "rank {from} sent {} bytes for a {len}-byte chunk",
                got.len(),
            )));
        }
        Ok(got)
    }

    /// Bytes per ring chunk: whole elements, at least one.
    pub(super) fn chunk_len(&self, dtype: ElementType) -> usize {
        (self.chunk_bytes / dtype.size()).max(1) * dtype.size()
    }

    /// Invariant 2; returns what every rank attached, in rank order, and
    /// whether every rank reaches every other through shared memory
    /// (invariant 8).
    pub(super) async fn exchange_descriptors(
        &self,
        mine: &Descriptor,
        attached: Vec<u8>,
    ) -> Result<(Vec<Vec<u8>>, bool)> {
        if self.n() == 1 {
            return Ok((vec![attached], false));
        }
        // A ring all-gather: at step s, pass on the descriptor of rank
        // r - s (our own first) and take that of rank r - s - 1. Only
        // neighbours connect, and every rank ends with all of them.
        let (n, r) = (self.n(), self.rank);
        let next = (r + 1) % n;
        let prev = (r + n - 1) % n;
        let mut all: Vec<Option<Descriptor>> = vec![None; n];
        let mut data: Vec<Vec<u8>> = vec![Vec::new(); n];
        all[r] = Some(mine.clone());
        let mut forward = DescriptorFrame::encode(mine, &attached);
        data[r] = attached;
        for step in 0..n - 1 {
            let tag = self.tag(Phase::Descriptor, step, 0);
            let (_, got) = futures::try_join!(
                self.send(next, tag, ElementType::U8, &forward),
                self.recv(prev, tag)
            )?;
            let origin = (r + 2 * n - step - 1) % n;
            let (d, payload) =
                DescriptorFrame::decode(&got).map_err(|e| TransferError::Stream {
                    peer: format!("rank {prev}"),
                    reason: format!("descriptor of rank {origin}: {e}"),
                })?;
            all[origin] = Some(d);
            data[origin] = payload.to_vec();
            forward = got;
        }
        let all: Vec<Descriptor> = all.into_iter().flatten().collect();
        if all.iter().any(|d| !d.same_call(mine)) {
            let list = all
                .iter()
                .enumerate()
                .map(|(r, d)| format!("rank {r}: {d}"))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(TransferError::Mismatch(list));
        }
        Ok((data, all.iter().all(|d| d.shared)))
    }
}
