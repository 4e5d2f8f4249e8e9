//! Collectives over a group of processes, one [`TransferEndpoint`] each:
//! ring all-reduce (reduce-scatter then all-gather, chunk-pipelined),
//! all-gather, reduce-scatter, broadcast, barrier and exchange. When every
//! member runs on this host they read each other's arenas in shared memory
//! instead (invariant 8). Every call starts with a ring all-gather of a small
//! [`Descriptor`], which doubles as the barrier; a small all-reduce rides in
//! it ([`DescriptorFrame`]). ARCHITECTURE.md, "Collectives", has the steps.
//!
//! Invariants:
//! 1. Every rank calls the same collectives in the same order; call `n` uses
//!    sequence `n` in all its tags ([`tag::Tag`]), so calls never meet.
//! 2. Before data moves every rank holds every descriptor; if they differ,
//!    every rank fails with the same [`TransferError::Mismatch`], nothing sent.
//! 3. One deadline per call; a failing rank sends `abort` to all, and they
//!    fail at once with [`TransferError::Aborted`].
//! 4. A failed call hands out nothing and breaks the communicator: later
//!    calls fail with [`TransferError::Broken`].
//! 5. Float results follow [`crate::reduce`]'s order, so they equal
//!    [`crate::reduce::reference_reduce`] bit for bit.
//! 6. The algorithm depends only on the descriptors: ranks that agree pick
//!    the same one; ranks that differ still finish the descriptor ring.
//! 7. Only the ring's chunks are lent to same-host peers (endpoint invariant
//!    5): a ring step sends and receives at once, so every loan has a taker.
//! 8. Same-host calls use arenas (shm invariant 4) only when every descriptor
//!    offers one; an owner writes its arena only between the call's descriptor
//!    exchange and its post (its folded segment: before the second post).
//! 9. An in-place all-reduce's [`CollectiveBuffer`] may be written again only
//!    after the call's third post; a failed call gives it zeroed storage.
//! 10. The ring copies nothing between receiving a chunk and sending it on
//!     (endpoint invariant 9); the input is only read while the ring runs.
//! 11. A replaced arena is retired until the next replacement, since a peer
//!     may still open the old one by name until it passes a descriptor exchange.

mod arenas;
mod buffer;
mod call;
mod descriptor;
mod ring;
mod tag;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use tessel_pjrt::ElementType;

pub use buffer::CollectiveBuffer;
pub use descriptor::{CollectiveKind, Descriptor, DescriptorFrame};

use crate::endpoint::{Peer, TransferEndpoint};
use crate::error::{Result, TransferError};
use crate::reduce::{all_reduce_is_small, check_reducible, fold_in_rank_order, ReduceOp};
use crate::shm::ShmArena;
use arenas::Arenas;
use buffer::Storage;
use call::Call;
use descriptor::descriptor;
use tag::{Phase, Tag, MAX_CHUNKS, MAX_STEPS};

/// Tuning and limits of a communicator.
#[derive(Debug, Clone)]
pub struct CollectiveConfig {
    /// Deadline of one collective call.
    pub timeout: Duration,
    /// Largest message of a ring step (chunks pipeline sending with
    /// reducing).
    pub chunk_bytes: usize,
    /// Groups whose members all run on this host use arenas in shared
    /// memory instead of the ring (invariant 8). Off: the ring, for
    /// comparison; a group uses arenas only if every rank has this on.
    pub arenas: bool,
    /// Largest arena a rank keeps (it lives in the shared-memory folder,
    /// beside the caller's own copy of the data); larger calls take the
    /// ring, as do calls for which the folder has no room.
    pub max_arena_bytes: usize,
}

impl Default for CollectiveConfig {
    fn default() -> Self {
        CollectiveConfig {
            timeout: Duration::from_secs(60),
            chunk_bytes: 4 << 20,
            arenas: true,
            max_arena_bytes: 2 << 30,
        }
    }
}

/// A group of processes that run collectives together; rank `i` is
/// `members[i]`.
pub struct Communicator {
    endpoint: Arc<TransferEndpoint>,
    members: Vec<Peer>,
    rank: usize,
    group: u16,
    seq: u64,
    cfg: CollectiveConfig,
    broken: Option<String>,
    arenas: Arc<Mutex<Arenas>>,
}

impl Communicator {
    /// `group` separates communicators that share endpoints (e.g. the first
    /// two bytes of the clique's `CollectiveId`). The endpoint's rank is this
    /// process's rank in `members`.
    pub fn new(
        endpoint: Arc<TransferEndpoint>,
        members: Vec<Peer>,
        group: u16,
        cfg: CollectiveConfig,
    ) -> Result<Communicator> {
        let rank = endpoint.rank() as usize;
        if members.is_empty() || rank >= members.len() {
            return Err(TransferError::InvalidArgument(format!(
                "rank {rank} of a group of {}",
                members.len()
            )));
        }
        if members.len() > MAX_STEPS {
            return Err(TransferError::InvalidArgument(format!(
                "{} members, at most {MAX_STEPS}",
                members.len()
            )));
        }
        if cfg.chunk_bytes < 8 {
            return Err(TransferError::InvalidArgument(
                "chunk_bytes must be at least 8".into(),
            ));
        }
        Ok(Communicator {
            endpoint,
            members,
            rank,
            group,
            seq: 0,
            cfg,
            broken: None,
            arenas: Arc::default(),
        })
    }

    /// This rank's index.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Sums (or means, maxes, mins) `data` element-wise across all ranks;
    /// every rank gets the same bytes.
    pub async fn all_reduce(
        &mut self,
        op: ReduceOp,
        dtype: ElementType,
        data: Vec<u8>,
    ) -> Result<Vec<u8>> {
        check_reducible(dtype)?;
        let d = self.offer_arenas(descriptor(
            CollectiveKind::AllReduce,
            Some(op),
            dtype,
            data.len(),
            None,
        ));
        if self.size() > 1 && all_reduce_is_small(data.len()) {
            return self.small_all_reduce(d, op, dtype, data).await;
        }
        self.run(d, |call| call.all_reduce(op, dtype, data)).await
    }

    /// An all-reduce whose data rides with the descriptors (invariant 6),
    /// folded in rank order once every rank's has arrived.
    async fn small_all_reduce(
        &mut self,
        d: Descriptor,
        op: ReduceOp,
        dtype: ElementType,
        data: Vec<u8>,
    ) -> Result<Vec<u8>> {
        self.run_with(d, data, |_, frames| async move {
            fold_in_rank_order(op, dtype, &frames)
        })
        .await
    }

    /// A buffer of `len` bytes (zeroed) for [`Self::all_reduce_in_place`]:
    /// in shared memory when every member runs on this host, arenas are on
    /// and the size is over the small all-reduce's and within
    /// `max_arena_bytes` (and the folder has room), else private.
    pub fn buffer(&self, len: usize) -> CollectiveBuffer {
        let call = descriptor(CollectiveKind::AllReduce, None, ElementType::U8, len, None);
        if len <= self.cfg.max_arena_bytes && self.arenas_apply(&call) {
            match ShmArena::create(self.endpoint.shm_dir(), len) {
                Ok(a) => {
                    return CollectiveBuffer {
                        storage: Storage::Shared(a),
                    }
                }
                Err(e) => tracing::warn!(
                    bytes = len,
                    dir = %self.endpoint.shm_dir().display(),
                    error = %e,
                    "no shared-memory buffer; in-place all-reduces take the ring"
                ),
            }
        }
        CollectiveBuffer::private(len)
    }

    /// [`Self::all_reduce`] of `buf`'s bytes, leaving the result in `buf`
    /// (invariant 9). Every rank must call this one, not `all_reduce`. On
    /// an error `buf` holds zeros, and the communicator is broken.
    pub async fn all_reduce_in_place(
        &mut self,
        op: ReduceOp,
        dtype: ElementType,
        buf: &mut CollectiveBuffer,
    ) -> Result<()> {
        check_reducible(dtype)?;
        let len = buf.len();
        if len % dtype.size() != 0 {
            return Err(TransferError::InvalidArgument(format!(
                "{len} bytes are not a whole number of {} elements",
                dtype.name()
            )));
        }
        let mut d = descriptor(CollectiveKind::AllReduce, Some(op), dtype, len, None);
        d.in_place = true;
        d.shared = self.arenas_apply(&d) && buf.is_shared();
        let result = if self.size() > 1 && all_reduce_is_small(len) {
            let data = buf.as_slice().to_vec();
            self.small_all_reduce(d, op, dtype, data)
                .await
                .map(|out| buf.as_mut_slice().copy_from_slice(&out))
        } else {
            let name = buf.shared_name();
            self.run(d, |call| {
                call.all_reduce_in_place(op, dtype, buf.as_mut_slice(), name)
            })
            .await
        };
        if result.is_err() {
            buf.replace_with_zeros();
        }
        result
    }

    /// Reduces across ranks and gives rank `r` segment `r` of the result
    /// (segments as in [`crate::reduce::segment`]).
    pub async fn reduce_scatter(
        &mut self,
        op: ReduceOp,
        dtype: ElementType,
        data: Vec<u8>,
    ) -> Result<Vec<u8>> {
        check_reducible(dtype)?;
        let d = self.offer_arenas(descriptor(
            CollectiveKind::ReduceScatter,
            Some(op),
            dtype,
            data.len(),
            None,
        ));
        self.run(d, |call| call.reduce_scatter(op, dtype, data))
            .await
    }

    /// Concatenates every rank's `data` in rank order (equal sizes).
    pub async fn all_gather(&mut self, dtype: ElementType, data: &[u8]) -> Result<Vec<u8>> {
        let d = self.offer_arenas(descriptor(
            CollectiveKind::AllGather,
            None,
            dtype,
            data.len(),
            None,
        ));
        self.run(d, |call| call.all_gather(dtype, data)).await
    }

    /// Every rank gets `root`'s `data`; the others pass a buffer of the same
    /// length (its contents are ignored).
    pub async fn broadcast(
        &mut self,
        root: u32,
        dtype: ElementType,
        data: Vec<u8>,
    ) -> Result<Vec<u8>> {
        if root as usize >= self.size() {
            return Err(TransferError::InvalidArgument(format!(
                "root {root} of a group of {}",
                self.size()
            )));
        }
        let d = self.offer_arenas(descriptor(
            CollectiveKind::Broadcast,
            None,
            dtype,
            data.len(),
            Some(root),
        ));
        self.run(d, |call| call.broadcast(root as usize, dtype, data))
            .await
    }

    /// Point-to-point messages as one call that every rank makes together
    /// (invariant 1): this rank sends each `(rank, bytes)` of `sends` and
    /// receives one message from each rank of `from`, of any size, all
    /// under the call's deadline. Returns what arrived, in `from`'s order.
    /// At most one message per pair of ranks.
    pub async fn exchange(
        &mut self,
        sends: Vec<(usize, Vec<u8>)>,
        from: &[usize],
    ) -> Result<Vec<Vec<u8>>> {
        let n = self.size();
        let bad = |what: &str, ranks: Vec<usize>| {
            let mut sorted = ranks.clone();
            sorted.sort_unstable();
            sorted.dedup();
            (ranks.iter().any(|&r| r >= n || r == self.rank) || sorted.len() != ranks.len()).then(
                || {
                    TransferError::InvalidArgument(format!(
                        "exchange {what} ranks {ranks:?}: each once, not this rank ({}), below {n}",
                        self.rank
                    ))
                },
            )
        };
        if let Some(e) = bad("to", sends.iter().map(|(r, _)| *r).collect())
            .or_else(|| bad("from", from.to_vec()))
        {
            return Err(e);
        }
        let from = from.to_vec();
        let d = descriptor(CollectiveKind::Exchange, None, ElementType::U8, 0, None);
        self.run(d, |call| async move {
            let tag = call.tag(Phase::Reduce, 0, 0);
            let sent = try_join_all(
                sends
                    .iter()
                    .map(|(to, data)| call.send(*to, tag, ElementType::U8, data)),
            );
            let received = try_join_all(from.iter().map(|&f| call.recv(f, tag)));
            let (_, got) = futures::try_join!(sent, received)?;
            Ok(got)
        })
        .await
    }

    /// Returns once every rank has entered it.
    pub async fn barrier(&mut self) -> Result<()> {
        let d = self.offer_arenas(descriptor(
            CollectiveKind::Barrier,
            None,
            ElementType::U8,
            0,
            None,
        ));
        self.run(d, |_| async { Ok(()) }).await
    }

    /// `d`, saying whether this rank reaches every member through shared
    /// memory and holds an arena for it (invariant 8).
    fn offer_arenas(&self, d: Descriptor) -> Descriptor {
        let shared = self.arenas_apply(&d) && self.reserve_arena(d.bytes as usize);
        Descriptor { shared, ..d }
    }

    /// Whether the call `d` would move its data through shared memory
    /// (invariants 8 and 9): arenas on, more than one rank, every member
    /// reached through shared memory, and data the arenas carry.
    fn arenas_apply(&self, d: &Descriptor) -> bool {
        self.cfg.arenas
            && self.size() > 1
            && d.wants_arenas()
            && self
                .members
                .iter()
                .enumerate()
                .all(|(r, p)| r == self.rank || self.endpoint.same_host(p))
    }

    /// Makes this rank's arena at least `len` bytes long before the call
    /// commits to arenas; false (the ring then) if shared memory has no
    /// room for it.
    fn reserve_arena(&self, len: usize) -> bool {
        if len > self.cfg.max_arena_bytes {
            return false;
        }
        let mut arenas = self.arenas.lock().expect("not poisoned");
        if arenas.mine.as_ref().is_some_and(|a| a.len() >= len) {
            return true;
        }
        // Invariant 11: this rank may have left the last call before its
        // peers opened that arena; the one retired before it is past use.
        arenas.retired = arenas.mine.take();
        match ShmArena::create(self.endpoint.shm_dir(), len) {
            Ok(a) => {
                arenas.mine = Some(a);
                true
            }
            Err(e) => {
                tracing::warn!(
                    bytes = len,
                    dir = %self.endpoint.shm_dir().display(),
                    error = %e,
                    "no shared-memory arena; collectives take the ring"
                );
                false
            }
        }
    }

    /// One call: invariants 1–4 around the collective's own steps.
    async fn run<T, F, Fut>(&mut self, d: Descriptor, body: F) -> Result<T>
    where
        F: FnOnce(Call) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        self.run_with(d, Vec::new(), |call, _| body(call)).await
    }

    /// `run`, with `attached` travelling with the descriptor; the body gets
    /// every rank's attachment in rank order.
    async fn run_with<T, F, Fut>(&mut self, d: Descriptor, attached: Vec<u8>, body: F) -> Result<T>
    where
        F: FnOnce(Call, Vec<Vec<u8>>) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        if let Some(reason) = &self.broken {
            return Err(TransferError::Broken(reason.clone()));
        }
        if self.size() > 1 && d.bytes as usize / self.size() / self.cfg.chunk_bytes >= MAX_CHUNKS {
            return Err(TransferError::InvalidArgument(format!(
                "{} bytes need more than {MAX_CHUNKS} chunks of {} bytes per rank; raise chunk_bytes",
                d.bytes, self.cfg.chunk_bytes
            )));
        }
        let seq = self.seq;
        self.seq += 1;
        let mut call = Call {
            endpoint: self.endpoint.clone(),
            members: self.members.clone(),
            rank: self.rank,
            base: Tag::call(self.group, seq),
            deadline: Instant::now() + self.cfg.timeout,
            timeout: self.cfg.timeout,
            chunk_bytes: self.cfg.chunk_bytes,
            what: format!("{} #{seq}", d.kind),
            shared: false,
            arenas: self.arenas.clone(),
        };
        let endpoint = self.endpoint.clone();
        let members = self.members.clone();
        let rank = self.rank;
        let base = call.base;
        let what = call.what.clone();
        let started = Instant::now();
        let mut algorithm = "none";
        let result = match call.exchange_descriptors(&d, attached).await {
            Ok((frames, shared)) => {
                call.shared = shared;
                algorithm = d.algorithm(self.size(), shared);
                body(call, frames).await
            }
            Err(e) => Err(e),
        };
        let kind = d.kind.name();
        match &result {
            Ok(_) => {
                metrics::histogram!("tessel_collective_seconds", "kind" => kind, "algorithm" => algorithm)
                    .record(started.elapsed().as_secs_f64());
                metrics::counter!("tessel_collective_bytes_total", "kind" => kind)
                    .increment(d.bytes);
            }
            Err(_) => {
                metrics::counter!("tessel_collective_failures_total", "kind" => kind).increment(1)
            }
        }
        if let Err(e) = &result {
            let reason = format!("{what} failed: {e}");
            if !matches!(
                e,
                TransferError::Aborted { .. } | TransferError::Mismatch(_)
            ) {
                tell_others(&endpoint, &members, rank, base, &reason);
            }
            endpoint.discard(move |tag| base.holds(tag));
            self.broken = Some(reason);
        }
        result
    }
}

/// Invariant 3: best effort, in the background, bounded.
fn tell_others(
    endpoint: &Arc<TransferEndpoint>,
    members: &[Peer],
    rank: usize,
    base: Tag,
    reason: &str,
) {
    for (r, peer) in members.iter().enumerate() {
        if r == rank {
            continue;
        }
        let endpoint = endpoint.clone();
        let peer = peer.clone();
        let bytes = reason.as_bytes().to_vec();
        tokio::spawn(async move {
            let _ = endpoint
                .send_to(
                    &peer,
                    base.abort(),
                    ElementType::U8,
                    &[bytes.len() as u64],
                    &bytes,
                    Duration::from_secs(2),
                )
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Invariant 8: a rank offers arenas only when every member shares its
    /// host, the call is one that uses them, and an arena of the call's
    /// size fits the limit and the shared-memory folder.
    #[tokio::test]
    async fn arenas_are_offered_only_where_they_can_be_used() {
        use crate::endpoint::TransferConfig;
        let shm = tempfile::tempdir().unwrap();
        let endpoint = |dir: &std::path::Path| {
            let cfg = TransferConfig {
                boot_id: Some("here".into()),
                shm_dir: dir.to_path_buf(),
                ..TransferConfig::default()
            };
            let any = "127.0.0.1:0".parse().unwrap();
            Arc::new(TransferEndpoint::bind(any, 0, None, cfg).unwrap())
        };
        let peer = |port: u16, boot: &str| {
            Peer::new(
                std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                Some(boot.into()),
            )
        };
        let comm = |ep: &Arc<TransferEndpoint>, other: Peer, max_arena_bytes: usize| {
            let cfg = CollectiveConfig {
                max_arena_bytes,
                ..CollectiveConfig::default()
            };
            Communicator::new(ep.clone(), vec![peer(1, "here"), other], 0, cfg).unwrap()
        };
        let sum = Some(ReduceOp::Sum);
        let offered =
            |c: &Communicator, kind: CollectiveKind, op: Option<ReduceOp>, bytes: usize| {
                let d = descriptor(kind, op, ElementType::F32, bytes, None);
                c.offer_arenas(d).shared
            };
        let ep = endpoint(shm.path());
        let c = comm(&ep, peer(2, "here"), 1 << 20);
        assert!(offered(&c, CollectiveKind::AllReduce, sum, 1 << 20));
        assert!(offered(&c, CollectiveKind::AllGather, None, 8));
        let files = || std::fs::read_dir(shm.path()).unwrap().count();
        assert_eq!(files(), 1, "reserved");
        assert!(
            !offered(&c, CollectiveKind::AllReduce, sum, (1 << 20) + 4),
            "over the limit"
        );
        assert!(!offered(&c, CollectiveKind::AllReduce, sum, 64), "small");
        assert!(!offered(&c, CollectiveKind::Barrier, None, 0));
        assert!(!offered(&c, CollectiveKind::AllGather, None, 0), "empty");
        // In-place buffers (invariant 9): shared where arenas would be.
        let mut buf = c.buffer(1 << 20);
        assert!(buf.is_shared() && buf.len() == 1 << 20, "{buf:?}");
        assert_eq!(files(), 2, "the arena and the buffer");
        buf.as_mut_slice()[5] = 7;
        assert_eq!(buf.as_slice()[5], 7);
        assert!(!c.buffer(64).is_shared(), "small");
        assert!(!c.buffer((1 << 20) + 4).is_shared(), "over the limit");
        assert_eq!(c.buffer(0).len(), 0);
        buf.replace_with_zeros();
        assert!(!buf.is_shared() && buf.as_slice() == vec![0; 1 << 20]);
        assert_eq!(files(), 1, "a replaced buffer's file is gone");
        drop(c);
        assert_eq!(files(), 0, "removed");
        let elsewhere = comm(&ep, peer(2, "there"), 1 << 30);
        assert!(!offered(
            &elsewhere,
            CollectiveKind::AllReduce,
            sum,
            1 << 20
        ));
        assert!(!elsewhere.buffer(1 << 20).is_shared());
        // No room in the folder (here: no folder): the ring, not a failure.
        let gone = endpoint(&shm.path().join("missing"));
        let c = comm(&gone, peer(2, "here"), 1 << 30);
        assert!(!offered(&c, CollectiveKind::AllReduce, sum, 1 << 20));
        assert!(!c.buffer(1 << 20).is_shared());
    }
}
