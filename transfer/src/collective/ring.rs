//! The ring: reduce-scatter and all-gather phases of chunked messages,
//! in place when the previous rank lends its chunks (invariant 10), and
//! the collectives built on them.

use std::ops::Range;

use bytes::Bytes;
use futures::future::try_join_all;
use tessel_pjrt::ElementType;

use super::arenas::copy_large;
use super::call::Call;
use super::tag::Phase;
use crate::endpoint::{Outgoing, Payload};
use crate::error::{Result, TransferError};
use crate::reduce::{
    all_gather_step, byte_segments, chunk_ranges, combine, combine_pieces_into, disjoint,
    finish_mean, reduce_scatter_step, ReduceOp,
};

/// The input of a ring all-reduce (invariant 10): the caller's bytes,
/// shared (sent as they are) or borrowed (copied once on their way out).
pub(super) enum Source<'a> {
    Shared(Bytes),
    Borrowed(&'a [u8]),
}

impl Source<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Source::Shared(b) => b,
            Source::Borrowed(b) => b,
        }
    }

    /// Bytes `range`, to send.
    fn part(&self, range: Range<usize>) -> Outgoing<'_> {
        match self {
            Source::Shared(b) => Outgoing::Shared(vec![b.slice(range)]),
            Source::Borrowed(b) => Outgoing::Borrowed(&b[range]),
        }
    }
}

/// An empty vector with room for `input`'s bytes: `input`'s own memory
/// when nothing else holds it any more (quinn lets go of sent bytes once
/// they are acknowledged, which the peer's answer normally carries), else
/// fresh.
fn reclaim(input: Bytes) -> Vec<u8> {
    let len = input.len();
    match input.try_into_mut() {
        Ok(mut m) => {
            m.clear();
            Vec::from(m)
        }
        Err(_) => {
            metrics::counter!("tessel_transfer_ring_fresh_outputs_total").increment(1);
            Vec::with_capacity(len)
        }
    }
}

/// Writes every segment's chunks, in segment order, to `out`: appended to
/// a vector, or copied into a buffer of the whole array's length (the
/// chunks' lengths were checked as they arrived).
fn write_in_order(mut out: impl std::io::Write, all: &[Vec<Outgoing<'_>>]) {
    for piece in all.iter().flatten().flat_map(Outgoing::pieces) {
        out.write_all(piece)
            .expect("the output holds the whole array");
    }
}

impl Call {
    /// Whether ring chunks from the previous rank arrive as lent files (it
    /// runs on this host) or whole in one buffer (a data channel of the
    /// unencrypted data plane): the ring then works in place (invariant
    /// 10's exception).
    pub(super) async fn in_place_ring(&self) -> Result<bool> {
        let prev = self
            .members
            .get((self.rank + self.n() - 1) % self.n())
            .await?;
        Ok(self.endpoint.same_host(prev) || self.endpoint.on_data_channel(prev))
    }

    /// One ring pass of `n - 1` steps in place (invariant 10's exception).
    /// At step `s` this rank sends the segment `schedule(s).0` of `buf` to
    /// the next rank and receives `schedule(s).1` from the previous one,
    /// combining it into `buf` with `op` (reduce phase) or storing it there
    /// (gather phase).
    pub(super) async fn ring_in_place(
        &self,
        phase: Phase,
        op: Option<ReduceOp>,
        dtype: ElementType,
        buf: &mut [u8],
        segments: &[Range<usize>],
        schedule: impl Fn(usize) -> (usize, usize),
    ) -> Result<()> {
        let n = self.n();
        let (next, prev) = ((self.rank + 1) % n, (self.rank + n - 1) % n);
        let chunk = self.chunk_len(dtype);
        // Lent files are read in place in both phases; on a data channel
        // only the gather's chunks are lent (read straight into `buf`),
        // while the reduce's are read ahead into buffers as the previous
        // chunk is folded (endpoint invariant 12).
        let streamed = self.endpoint.on_data_channel(self.members.get(next).await?);
        let lend = op.is_none() || !streamed;
        for step in 0..n - 1 {
            let (send_seg, recv_seg) = schedule(step);
            let (out_buf, in_buf) =
                disjoint(buf, segments[send_seg].clone(), segments[recv_seg].clone());
            // On a data channel, two chunks in flight: their bytes stream
            // in the order the receiver takes them, without a pause for
            // each answer (elsewhere every chunk at once).
            let chunks = out_buf.chunks(chunk).count();
            let lanes = if streamed { 2.min(chunks) } else { chunks };
            let mut per_lane: Vec<Vec<(usize, &mut [u8])>> =
                (0..lanes).map(|_| Vec::new()).collect();
            for (k, c) in out_buf.chunks_mut(chunk).enumerate() {
                per_lane[k % lanes].push((k, c));
            }
            let sends = try_join_all(per_lane.into_iter().map(|lane| async move {
                for (k, c) in lane {
                    let tag = self.tag(phase, step, k);
                    // A segment sent in the reduce phase is not read here
                    // again before the gather overwrites it: a sealed
                    // channel may encrypt it in place (invariant 12).
                    let data = match phase {
                        Phase::Reduce => Outgoing::Spent(c),
                        _ => Outgoing::Borrowed(c),
                    };
                    self.send_with(next, tag, dtype, data, lend).await?;
                }
                Ok::<(), TransferError>(())
            }));
            let recvs = async {
                for (k, dst) in in_buf.chunks_mut(chunk).enumerate() {
                    let tag = self.tag(phase, step, k);
                    let Some(op) = op else {
                        self.take_chunk_into(prev, tag, dst).await?;
                        continue;
                    };
                    let got = self.take_chunk(prev, tag, dst.len()).await?;
                    combine(op, dtype, dst, &got.contiguous())?;
                    // The next chunk's bytes land in this one's memory
                    // (endpoint invariant 7).
                    if let Payload::Owned(v) = got {
                        self.endpoint.recycle(v);
                    }
                }
                Ok(())
            };
            futures::try_join!(sends, recvs)?;
        }
        Ok(())
    }

    /// [`Self::reduce_phase`] in place: segment `r` of `buf` ends complete.
    pub(super) async fn reduce_in_place(
        &self,
        op: ReduceOp,
        dtype: ElementType,
        buf: &mut [u8],
        segs: &[Range<usize>],
    ) -> Result<()> {
        let (n, r) = (self.n(), self.rank);
        self.ring_in_place(Phase::Reduce, Some(op), dtype, buf, segs, |s| {
            reduce_scatter_step(n, r, s)
        })
        .await?;
        if op == ReduceOp::Mean {
            finish_mean(dtype, &mut buf[segs[r].clone()], n)?;
        }
        Ok(())
    }

    /// [`Self::gather_phase`] in place, segment `r` of `buf` complete.
    pub(super) async fn gather_in_place(
        &self,
        dtype: ElementType,
        buf: &mut [u8],
        segs: &[Range<usize>],
    ) -> Result<()> {
        let (n, r) = (self.n(), self.rank);
        self.ring_in_place(Phase::Gather, None, dtype, buf, segs, |s| {
            all_gather_step(n, r, s)
        })
        .await
    }

    /// Reduce-scatter leaving segment `r` complete on rank `r` (invariant
    /// 10): at step `s` rank `r` sends segment `r - s - 1` and receives
    /// `r - s - 2` (mod n), so segment `j` is folded from rank `j + 1`
    /// around to `j`. Each chunk travels on its own stream, so reducing
    /// chunk k overlaps with receiving chunk k + 1. Returns segment `r`,
    /// divided for `Mean`, chunk by chunk.
    pub(super) async fn reduce_phase(
        &self,
        op: ReduceOp,
        dtype: ElementType,
        input: &Source<'_>,
        segs: &[Range<usize>],
    ) -> Result<Vec<Bytes>> {
        let (n, r) = (self.n(), self.rank);
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let chunk = self.chunk_len(dtype);
        let own = input.bytes();
        let (first, _) = reduce_scatter_step(n, r, 0);
        let mut outgoing: Vec<Outgoing> = chunk_ranges(segs[first].clone(), chunk)
            .map(|c| input.part(c))
            .collect();
        let mut reduced = Vec::new();
        for step in 0..n - 1 {
            let (_, recv_seg) = reduce_scatter_step(n, r, step);
            let sends = outgoing.drain(..).enumerate().map(|(k, c)| {
                self.send_with(next, self.tag(Phase::Reduce, step, k), dtype, c, true)
            });
            let recvs = async {
                let mut sums = Vec::new();
                for (k, c) in chunk_ranges(segs[recv_seg].clone(), chunk).enumerate() {
                    let tag = self.tag(Phase::Reduce, step, k);
                    let got = self.take_chunk(prev, tag, c.len()).await?;
                    let mut sum = Vec::with_capacity(c.len());
                    combine_pieces_into(op, dtype, &own[c], got.pieces(), &mut sum)?;
                    sums.push(sum);
                }
                Ok(sums)
            };
            (_, reduced) = futures::try_join!(try_join_all(sends), recvs)?;
            if step + 2 < n {
                // Sent on at the next step as it is.
                outgoing = reduced
                    .drain(..)
                    .map(|sum| Outgoing::Shared(vec![Bytes::from(sum)]))
                    .collect();
            }
        }
        if op == ReduceOp::Mean {
            for sum in &mut reduced {
                finish_mean(dtype, sum, n)?;
            }
        }
        Ok(reduced.into_iter().map(Bytes::from).collect())
    }

    /// All-gather where rank `r` starts with segment `r`, given as its
    /// chunks in `own` (invariant 10): at step `s` it sends `r - s` and
    /// receives `r - s - 1` (mod n), keeping what arrives to send on at the
    /// next step as it is. Returns every segment's chunks, in segment
    /// order.
    pub(super) async fn gather_phase<'a>(
        &self,
        dtype: ElementType,
        own: Vec<Outgoing<'a>>,
        segs: &[Range<usize>],
    ) -> Result<Vec<Vec<Outgoing<'a>>>> {
        let (n, r) = (self.n(), self.rank);
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let chunk = self.chunk_len(dtype);
        let mut held: Vec<Vec<Outgoing>> = (0..n).map(|_| Vec::new()).collect();
        let mut outgoing = own;
        for step in 0..n - 1 {
            let (send_seg, recv_seg) = all_gather_step(n, r, step);
            let sends = outgoing.iter().enumerate().map(|(k, c)| {
                let tag = self.tag(Phase::Gather, step, k);
                self.send_with(next, tag, dtype, c.reborrow(), true)
            });
            let recvs = async {
                let mut got = Vec::new();
                for (k, c) in chunk_ranges(segs[recv_seg].clone(), chunk).enumerate() {
                    let tag = self.tag(Phase::Gather, step, k);
                    let chunk = self.take_chunk(prev, tag, c.len()).await?;
                    got.push(Outgoing::Shared(chunk.into_shared()));
                }
                Ok(got)
            };
            let (_, got) = futures::try_join!(try_join_all(sends), recvs)?;
            held[send_seg] = std::mem::replace(&mut outgoing, got);
        }
        held[(r + 1) % n] = outgoing;
        Ok(held)
    }

    /// The ring all-reduce (invariant 10): every segment's chunks.
    pub(super) async fn ring_all_reduce(
        &self,
        op: ReduceOp,
        dtype: ElementType,
        input: Source<'_>,
        segs: &[Range<usize>],
    ) -> Result<Vec<Vec<Outgoing<'static>>>> {
        let own = self.reduce_phase(op, dtype, &input, segs).await?;
        let own = own.into_iter().map(|b| Outgoing::Shared(vec![b])).collect();
        self.gather_phase(dtype, own, segs).await
    }

    pub(super) async fn all_reduce(
        self,
        op: ReduceOp,
        dtype: ElementType,
        mut data: Vec<u8>,
    ) -> Result<Vec<u8>> {
        let segs = byte_segments(dtype, data.len(), self.n());
        if self.shared {
            let peers = self
                .fold_in_arenas(op, dtype, &mut data, &segs, true)
                .await?;
            self.copy_folded_segments(&peers, &mut data, &segs).await?;
        } else if self.n() > 1 && self.in_place_ring().await? {
            self.reduce_in_place(op, dtype, &mut data, &segs).await?;
            self.gather_in_place(dtype, &mut data, &segs).await?;
        } else if self.n() > 1 {
            let input = Bytes::from(data);
            let all = self
                .ring_all_reduce(op, dtype, Source::Shared(input.clone()), &segs)
                .await?;
            data = reclaim(input);
            write_in_order(&mut data, &all);
        }
        Ok(data)
    }

    /// Invariant 9: `data` is the caller's buffer, named `name` in shared
    /// memory when the call is `shared`.
    pub(super) async fn all_reduce_in_place(
        self,
        op: ReduceOp,
        dtype: ElementType,
        data: &mut [u8],
        name: Option<String>,
    ) -> Result<()> {
        let segs = byte_segments(dtype, data.len(), self.n());
        if self.shared {
            let name = name.ok_or_else(|| TransferError::Stream {
                peer: "this host".into(),
                reason: "a shared call without a shared buffer".into(),
            })?;
            let peers = self.exchange_arenas(&name, data.len()).await?;
            let seg = segs[self.rank].clone();
            self.fold_own_segment(op, dtype, &peers, &mut data[seg.clone()], seg, None)?;
            self.copy_folded_segments(&peers, data, &segs).await?;
            // Nobody reads this buffer once every peer says so.
            self.post_to_all(self.tag(Phase::Gather, 1, 0), &[]).await?;
        } else if self.n() > 1 && self.in_place_ring().await? {
            self.reduce_in_place(op, dtype, data, &segs).await?;
            self.gather_in_place(dtype, data, &segs).await?;
        } else if self.n() > 1 {
            let all = self
                .ring_all_reduce(op, dtype, Source::Borrowed(data), &segs)
                .await?;
            write_in_order(&mut data[..], &all);
        }
        Ok(())
    }

    pub(super) async fn reduce_scatter(
        self,
        op: ReduceOp,
        dtype: ElementType,
        mut data: Vec<u8>,
    ) -> Result<Vec<u8>> {
        let segs = byte_segments(dtype, data.len(), self.n());
        if self.shared {
            self.fold_in_arenas(op, dtype, &mut data, &segs, false)
                .await?;
        } else if self.n() > 1 && self.in_place_ring().await? {
            self.reduce_in_place(op, dtype, &mut data, &segs).await?;
        } else if self.n() > 1 {
            let input = Source::Shared(Bytes::from(data));
            return Ok(self.reduce_phase(op, dtype, &input, &segs).await?.concat());
        }
        Ok(data[segs[self.rank].clone()].to_vec())
    }

    pub(super) async fn all_gather(self, dtype: ElementType, data: &[u8]) -> Result<Vec<u8>> {
        let len = data.len();
        if self.shared {
            let name = self.fill_arena(len, |arena| copy_large(arena.region_mut(0..len), data))?;
            let peers = self.exchange_arenas(&name, len).await?;
            let mut out = Vec::with_capacity(len * self.n());
            for peer in &peers {
                match peer {
                    Some(peer) => out.extend_from_slice(peer.region(0..len)?),
                    None => out.extend_from_slice(data),
                }
            }
            return Ok(out);
        }
        if self.n() == 1 {
            return Ok(data.to_vec());
        }
        let (n, r) = (self.n(), self.rank);
        let segs: Vec<_> = (0..n).map(|j| j * len..(j + 1) * len).collect();
        if self.in_place_ring().await? {
            let mut buf = vec![0u8; len * n];
            buf[segs[r].clone()].copy_from_slice(data);
            self.gather_in_place(dtype, &mut buf, &segs).await?;
            return Ok(buf);
        }
        let own = chunk_ranges(0..len, self.chunk_len(dtype))
            .map(|c| Outgoing::Borrowed(&data[c]))
            .collect();
        let all = self.gather_phase(dtype, own, &segs).await?;
        let mut out = Vec::with_capacity(len * n);
        write_in_order(&mut out, &all);
        Ok(out)
    }

    /// Pipelined along the ring from the root: each rank forwards chunk k
    /// to the next rank as soon as it has it.
    pub(super) async fn broadcast(
        self,
        root: usize,
        dtype: ElementType,
        mut data: Vec<u8>,
    ) -> Result<Vec<u8>> {
        let n = self.n();
        if n == 1 {
            return Ok(data);
        }
        if self.shared {
            let (len, tag) = (data.len(), self.tag(Phase::Reduce, 0, 0));
            if self.rank == root {
                let name =
                    self.fill_arena(len, |arena| copy_large(arena.region_mut(0..len), &data))?;
                let sends = (0..n)
                    .filter(|&k| k != root)
                    .map(|k| self.send(k, tag, ElementType::U8, name.as_bytes()));
                try_join_all(sends).await?;
            } else {
                let name = self.recv(root, tag).await?;
                let peer = self.peer_arena(root, &name, len)?;
                copy_large(&mut data, peer.region(0..len)?);
            }
            return Ok(data);
        }
        let next = (self.rank + 1) % n;
        let prev = (self.rank + n - 1) % n;
        let last = (root + n - 1) % n;
        let chunk = (self.chunk_bytes / dtype.size()).max(1) * dtype.size();
        let forward = self.rank != last;
        if self.rank == root {
            let sends = data
                .chunks(chunk)
                .enumerate()
                .map(|(k, c)| self.send(next, self.tag(Phase::Gather, 0, k), dtype, c));
            try_join_all(sends).await?;
            return Ok(data);
        }
        let mut sends = Vec::new();
        for (k, dst) in data.chunks_mut(chunk).enumerate() {
            let got = self.recv(prev, self.tag(Phase::Gather, 0, k)).await?;
            if got.len() != dst.len() {
                return Err(TransferError::Mismatch(format!(
                    "rank {prev} sent {} bytes for a {}-byte chunk",
                    got.len(),
                    dst.len()
                )));
            }
            dst.copy_from_slice(&got);
            if forward {
                sends.push(got);
            }
        }
        let fwd = sends
            .iter()
            .enumerate()
            .map(|(k, c)| self.send(next, self.tag(Phase::Gather, 0, k), dtype, c));
        try_join_all(fwd).await?;
        Ok(data)
    }
}
