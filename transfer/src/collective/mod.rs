//! Collectives over a group of processes, one [`TransferEndpoint`] each:
//! ring all-reduce (reduce-scatter then all-gather, chunk-pipelined),
//! all-gather, reduce-scatter, broadcast, barrier and exchange. When every
//! member runs on this host they read each other's arenas in shared memory
//! instead (invariant 8). Every call starts with a ring all-gather of a small
//! [`Descriptor`], which doubles as the barrier; a small all-reduce rides in
//! it ([`DescriptorFrame`]). "Collectives", below, has the steps.
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
//! 12. In the in-place ring's reduce phase a segment, once sent, is not read
//!     again before the gather overwrites it: its send may consume it (a
//!     sealed data channel encrypts it where it lies instead of copying it).
//!
//! # Collectives
//!
//! Tags are `group (16 bits) | call sequence (24) | phase (2) | step (10) |
//! chunk (12)`; phases: descriptor, reduce, gather, abort. One call:
//!
//! 1. Descriptor exchange: a ring all-gather of every rank's `Descriptor
//!    {kind, op, dtype, bytes, root, shared}` (step s: pass on rank r−s's,
//!    take rank r−s−1's; only neighbours connect, so a job of n processes
//!    opens n connections, not n²). If any differs (`shared` aside), every
//!    rank fails with the same `Mismatch` listing all of them in rank order;
//!    no data moves. `shared` says the rank reaches every member through
//!    shared memory (same boot id, network not forced, arenas on); the call
//!    uses arenas (step 5) when every descriptor says so. Each
//!    message is a `DescriptorFrame`: `u16` LE descriptor length, the
//!    descriptor (postcard), then — only for an all-reduce of ≤ 64 KiB
//!    (`SMALL_ALL_REDUCE`) — the rank's data. Such an all-reduce is complete
//!    after the exchange: every rank folds the n inputs in rank order
//!    (`((x0 ⊕ x1) ⊕ …) ⊕ x(n−1)`, mean divides at the end). Frames are
//!    forwarded whole, so ranks that disagree on the size still finish the
//!    exchange and fail with the same `Mismatch`.
//! 2. All-reduce = reduce-scatter + all-gather over a ring (rank r sends to
//!    r+1). The array is cut into n segments (`segment(count, n, j)`);
//!    reduce-scatter step s: send segment r−s−1, receive r−s−2 and fold it in
//!    (incoming ⊕ own), so segment j is folded from rank j+1 around to rank
//!    j, which ends with it complete (mean divides there). All-gather step s:
//!    send segment r−s, receive r−s−1. Each segment travels as chunks of
//!    ≤ 4 MiB: reducing chunk k overlaps with receiving chunk k+1. What a
//!    rank received at step s is what it sends at step s+1, without a copy
//!    (collective invariant 10).
//! 3. Broadcast is a chunked pipeline along the ring from the root; barrier
//!    is the descriptor exchange alone.
//! 4. One deadline per call. The first rank to fail sends `abort` (its reason)
//!    to every rank; waits also watch for aborts, so everyone fails at once.
//!    The failed call's input is dropped (no partial result), its waiting
//!    messages are discarded, and the communicator refuses later calls.
//! 5. Arenas (collective invariant 8, shm invariant 4), when every member is
//!    on this host: each communicator keeps one tmpfs file
//!    (`tessel-{pid}-{n}`, as large as the largest call so far, reserved
//!    with `posix_fallocate` before the descriptor offers it, so a full tmpfs
//!    or a call over `max_arena_bytes` means the ring, never a `SIGBUS`), mapped
//!    read-write by its owner and read-only by its peers for the
//!    communicator's life, so after the first call nothing is mapped or
//!    faulted in. All-reduce: each rank writes the other ranks' segments of
//!    its input into its arena and sends the arena's name to every peer
//!    (reduce phase, step 0; a peer maps a name it has not seen, checking its
//!    form and that the file is long enough); it then folds its own segment
//!    from all arenas in the ring's order (`((x[r+1] ⊕ x[r+2]) ⊕ …) ⊕ x[r]`,
//!    16 KiB at a time, `reduce::fold_onto`; up to 4 ranks, aligned, in one
//!    fused pass per block that reads each input element once), so results equal the ring's bit
//!    for bit, writing it into its data and its arena; an empty message to
//!    every peer (gather phase, step 0); then it copies every other rank's
//!    folded segment out of that rank's arena, each as soon as that rank's
//!    message arrives. Reduce-scatter stops after the
//!    fold; all-gather writes the whole input and copies every peer's;
//!    broadcast: the root writes and posts, the others copy. An owner writes
//!    its arena only after the call's descriptor exchange (which no rank
//!    finishes before every rank has left the previous call) and before its
//!    post, except its folded segment, read only after the second message.
//!    With 4 ranks, a 64 MiB all-reduce moves 48 MiB in per rank, folds 64 MiB into 16 and
//!    copies 48 MiB out, against the ring's 96 MiB through tmpfs files in six
//!    dependent steps. Copies in and out of arenas of 1 MiB or more use streaming
//!    (non-temporal) stores (`tessel_transfer::memory::copy_streaming`),
//!    fenced before the message that follows them: their destinations are
//!    not read again by the copying core during the call, and skipping the
//!    read for ownership of every destination line is a third less memory
//!    traffic per copied byte.
//! 6. In place (collective invariant 9): `Communicator::buffer(len)` makes a
//!    `CollectiveBuffer`, a tmpfs file of its own (a `ShmArena`) when step 5
//!    would apply, else a `Vec`. `all_reduce_in_place` posts the buffer's
//!    name instead of filling an arena (no copy in), folds its segment into
//!    the buffer, copies the others' folded segments into the buffer after
//!    the second post, and sends a third, empty message to every peer: a
//!    rank returns only when every peer has said it stopped reading its
//!    buffer, so the caller may write it at once. The descriptor's
//!    `in_place` flag is compared (an in-place rank waits for that third
//!    message). A failed call swaps the buffer's storage for zeroed private
//!    memory; the old file keeps its bytes for peers that still map it. Each
//!    rank keeps its two most recently used mappings of each peer's files.
//!
//! ## What the invariants guard
//! * Arenas are reserved before the descriptor offers them (over
//!   `max_arena_bytes`, or no room in the folder: the descriptor says no), and
//!   the `shared` flag is left out of the mismatch comparison, so every rank
//!   picks the same algorithm. An owner writes its arena only after the
//!   call's descriptor exchange, which no rank completes before every rank
//!   has left the previous call, and before its first post, except its
//!   folded segment, which nobody reads before the second post: bytes never
//!   change under a reader.
//! * An in-place all-reduce's descriptor says `in_place` (compared, since the
//!   two all-reduces end differently); the call ends with a third post, after
//!   which no peer reads the caller's buffer. A failed call replaces the
//!   buffer's storage with zeroed memory, so neither the caller nor a peer
//!   still reading the old bytes sees a partial result, and what the caller
//!   writes next never reaches a peer of the broken call.
//! * The ring's reduce-scatter folds a received chunk, in the pieces it
//!   arrived in, with the rank's input into fresh memory and sends that as
//!   it is at the next step; the all-gather forwards what arrives as it is.
//!   Every segment is written once into the result at the end (for
//!   `all_reduce`, the input's own memory once the stream let go of it). The
//!   exception: a rank whose previous rank is on this host receives lent
//!   files whose senders wait until the mapping is dropped, so it folds or
//!   copies them at once, straight into the caller's buffer.
//! * A rank may leave a call before its peers opened its arena by name, and
//!   grows its arena for the next call before that call's descriptor
//!   exchange; the replaced arena is kept until the next replacement, by
//!   which time no peer can still be in the call that used it.

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

use crate::endpoint::{Members, Peer, TransferEndpoint};
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
    members: Arc<Members>,
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
        let members = Members::known(members, |p| endpoint.same_host(p));
        Communicator::with_members(endpoint, members, group, cfg)
    }

    /// As [`Self::new`], with members that may be looked up when first
    /// needed (`endpoint::members`): a ring looks up two.
    pub fn with_members(
        endpoint: Arc<TransferEndpoint>,
        members: Members,
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
        // Endpoint invariant 13: each member sends only as itself.
        let members = Arc::new(members);
        endpoint.bind_members(members.clone());
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
            && self.endpoint.shares_memory()
            && (0..self.size()).all(|r| r == self.rank || self.members.on_this_machine(r))
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
    members: &Arc<Members>,
    rank: usize,
    base: Tag,
    reason: &str,
) {
    for r in (0..members.len()).filter(|&r| r != rank) {
        let endpoint = endpoint.clone();
        let members = members.clone();
        let bytes = reason.as_bytes().to_vec();
        tokio::spawn(async move {
            let Ok(peer) = members.get(r).await else {
                return;
            };
            let _ = endpoint
                .send_to(
                    peer,
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
