//! The same-host path (invariants 8, 9, 11): each rank's arena, its
//! mappings of the peers', and the calls that fold and copy through them.

use std::ops::Range;
use std::sync::Arc;

use futures::future::try_join_all;

use tessel_pjrt::ElementType;

use super::call::Call;
use super::tag::Phase;
use crate::error::{Result, TransferError};
use crate::reduce::{fold_onto, ReduceOp};
use crate::shm::{PeerArena, ShmArena};

/// Peer mappings kept per rank (its arena and, say, one in-place buffer).
pub(super) const PEER_MAPPINGS: usize = 2;

/// Copies between arenas and buffers of at least this many bytes bypass
/// the cache ([`copy_large`]).
const STREAMING_COPY_MIN: usize = 1 << 20;

/// Copies `src` into `dst` (equal lengths); large copies with streaming
/// stores ([`crate::memory::copy_streaming`]). The arenas'
/// copies (an input into the arena, peers' folded segments out of theirs)
/// write megabytes that this rank does not read again during the call, so
/// reading each destination line into the cache first is wasted memory
/// traffic, and with ranks sharing cores memory traffic is the call's
/// time (docs/performance.md).
pub(super) fn copy_large(dst: &mut [u8], src: &[u8]) {
    match src.len() >= STREAMING_COPY_MIN {
        true => crate::memory::copy_streaming(dst, src),
        false => dst.copy_from_slice(src),
    }
}

/// The arenas of the same-host path (invariant 8): this rank's, and its
/// mappings of the peers' arenas and buffers by rank (the most recently
/// used first, at most [`PEER_MAPPINGS`] each), kept from call to call.
#[derive(Default)]
pub(super) struct Arenas {
    pub(super) mine: Option<ShmArena>,
    /// The arena `mine` replaced, kept (invariant 11): a peer of the call
    /// that used it may still be opening it by name.
    pub(super) retired: Option<ShmArena>,
    pub(super) peers: Vec<Vec<Arc<PeerArena>>>,
}

impl Call {
    /// Lets `fill` write this rank's arena (reserved at least `len` bytes
    /// long before its descriptor said `shared`); returns its name
    /// (invariant 8).
    pub(super) fn fill_arena(
        &self,
        len: usize,
        fill: impl FnOnce(&mut ShmArena),
    ) -> Result<String> {
        let mut arenas = self.arenas.lock().expect("not poisoned");
        let arena = arenas
            .mine
            .as_mut()
            .filter(|a| a.len() >= len)
            .ok_or_else(|| TransferError::Stream {
                peer: "this host".into(),
                reason: format!("no {len}-byte arena reserved"),
            })?;
        fill(arena);
        Ok(arena.name().to_owned())
    }

    /// Sends `payload` to every other rank under `tag` and takes one
    /// message from each; returns them by rank (this rank's slot empty).
    pub(super) async fn post_to_all(&self, tag: u64, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
        let others = self.others();
        let sends = others
            .iter()
            .map(|&k| self.send(k, tag, ElementType::U8, payload));
        let recvs = others.iter().map(|&k| self.recv(k, tag));
        let (_, got) = futures::try_join!(try_join_all(sends), try_join_all(recvs))?;
        let mut by_rank = vec![Vec::new(); self.n()];
        for (k, message) in others.into_iter().zip(got) {
            by_rank[k] = message;
        }
        Ok(by_rank)
    }

    /// The arena rank `from` named, at least `min_len` bytes long: the
    /// mapping kept from an earlier call when the name is the same.
    pub(super) fn peer_arena(
        &self,
        from: usize,
        name: &[u8],
        min_len: usize,
    ) -> Result<Arc<PeerArena>> {
        let bad = |reason: String| TransferError::Stream {
            peer: format!("rank {from}"),
            reason,
        };
        let name =
            std::str::from_utf8(name).map_err(|_| bad("an arena name not in UTF-8".into()))?;
        let mut arenas = self.arenas.lock().expect("not poisoned");
        arenas.peers.resize_with(self.n(), Vec::new);
        let known = &mut arenas.peers[from];
        let kept = known
            .iter()
            .position(|a| a.name() == name)
            .map(|i| known.remove(i));
        let arena = match kept {
            Some(a) if a.len() >= min_len => a,
            _ => Arc::new(
                PeerArena::open(self.endpoint.shm_dir(), name, min_len)
                    .map_err(|e| bad(format!("arena: {e}")))?,
            ),
        };
        known.insert(0, arena.clone());
        known.truncate(PEER_MAPPINGS);
        Ok(arena)
    }

    /// Posts this rank's arena `name` to every peer and maps theirs, each
    /// at least `min_len` bytes; indexed by rank, `None` for this one.
    pub(super) async fn exchange_arenas(
        &self,
        name: &str,
        min_len: usize,
    ) -> Result<Vec<Option<Arc<PeerArena>>>> {
        let names = self
            .post_to_all(self.tag(Phase::Reduce, 0, 0), name.as_bytes())
            .await?;
        (0..self.n())
            .map(|k| match k == self.rank {
                true => Ok(None),
                false => self.peer_arena(k, &names[k], min_len).map(Some),
            })
            .collect()
    }

    /// The reduce half of the same-host path (invariant 8): publishes the
    /// other ranks' segments of `data`, then folds this rank's segment from
    /// every arena in the ring's order into `data` (and into the arena when
    /// `publish`, for the others to copy). Returns the peers' arenas.
    pub(super) async fn fold_in_arenas(
        &self,
        op: ReduceOp,
        dtype: ElementType,
        data: &mut [u8],
        segs: &[Range<usize>],
        publish: bool,
    ) -> Result<Vec<Option<Arc<PeerArena>>>> {
        let r = self.rank;
        let name = self.fill_arena(data.len(), |arena| {
            for (j, seg) in segs.iter().enumerate() {
                if j != r {
                    copy_large(arena.region_mut(seg.clone()), &data[seg.clone()]);
                }
            }
        })?;
        let peers = self.exchange_arenas(&name, data.len()).await?;
        let seg = segs[r].clone();
        let mut arenas = self.arenas.lock().expect("not poisoned");
        let copy = match publish {
            true => Some(
                arenas
                    .mine
                    .as_mut()
                    .expect("filled above")
                    .region_mut(seg.clone()),
            ),
            false => None,
        };
        self.fold_own_segment(op, dtype, &peers, &mut data[seg.clone()], seg, copy)?;
        Ok(peers)
    }

    /// Folds this rank's segment `seg` (`own`: its bytes here) from every
    /// peer's arena in the ring's order, into `own` and `copy`.
    pub(super) fn fold_own_segment(
        &self,
        op: ReduceOp,
        dtype: ElementType,
        peers: &[Option<Arc<PeerArena>>],
        own: &mut [u8],
        seg: Range<usize>,
        copy: Option<&mut [u8]>,
    ) -> Result<()> {
        let (n, r) = (self.n(), self.rank);
        let others = (1..n)
            .filter_map(|step| peers[(r + step) % n].as_ref())
            .map(|peer| peer.region(seg.clone()))
            .collect::<Result<Vec<&[u8]>>>()?;
        fold_onto(op, dtype, &others, own, copy, n)
    }

    /// The end of an all-reduce through arenas: tells every peer that
    /// this rank's fold is in place, and copies each peer's folded segment
    /// as soon as that peer says the same.
    pub(super) async fn copy_folded_segments(
        &self,
        peers: &[Option<Arc<PeerArena>>],
        data: &mut [u8],
        segs: &[Range<usize>],
    ) -> Result<()> {
        use futures::stream::{FuturesUnordered, TryStreamExt};
        let tag = self.tag(Phase::Gather, 0, 0);
        let others = self.others();
        let sends = try_join_all(
            others
                .iter()
                .map(|&k| self.send(k, tag, ElementType::U8, &[])),
        );
        let copies = async {
            let mut folded: FuturesUnordered<_> = others
                .iter()
                .map(|&k| async move { self.recv(k, tag).await.map(|_| k) })
                .collect();
            while let Some(k) = folded.try_next().await? {
                let peer = peers[k].as_ref().ok_or_else(|| TransferError::Stream {
                    peer: format!("rank {k}"),
                    reason: "no arena mapped".into(),
                })?;
                copy_large(&mut data[segs[k].clone()], peer.region(segs[k].clone())?);
            }
            Ok(())
        };
        futures::try_join!(sends, copies)?;
        Ok(())
    }
}
