//! Collectives over a group of processes, one [`TransferEndpoint`] each:
//! ring all-reduce (reduce-scatter then all-gather, chunk-pipelined),
//! all-gather, reduce-scatter, broadcast and barrier. When every member
//! runs on this host they skip the ring and read each other's arenas in
//! shared memory instead (invariant 8).
//!
//! Every collective starts with a ring all-gather of a small
//! [`Descriptor`] (what the rank is about to do: kind, operator, dtype,
//! bytes, root): only neighbours connect. It doubles as the barrier. An
//! all-reduce of at most [`SMALL_ALL_REDUCE`](crate::reduce::SMALL_ALL_REDUCE) bytes sends its data along
//! with the descriptor ([`DescriptorFrame`]) and reduces locally once every
//! rank's data has arrived: `n - 1` hops instead of `3(n - 1)`, which is
//! what a step of data-parallel training on small models waits for.
//!
//! Invariants:
//! 1. Every rank calls the same collectives in the same order; the `n`th
//!    call on a communicator uses sequence number `n` in all its tags, so
//!    messages of different calls never meet.
//! 2. Before any data moves, every rank holds every rank's descriptor; if
//!    they differ, every rank fails with the same [`TransferError::Mismatch`]
//!    (built from the full list in rank order) and nothing else is sent.
//! 3. One deadline per call. A rank that fails (deadline, lost peer) tells
//!    every other rank (`abort` messages), which fail at once with
//!    [`TransferError::Aborted`] instead of waiting out their deadline.
//! 4. A failed call hands out nothing (input buffers are taken by value and
//!    dropped) and breaks the communicator: later calls fail with
//!    [`TransferError::Broken`] and its waiting messages are discarded.
//! 5. Float results follow the order documented in [`crate::reduce`], so
//!    they equal [`crate::reduce::reference_reduce`] bit for bit.
//! 6. Whether an all-reduce is small depends only on its descriptor, so
//!    ranks whose descriptors agree use the same algorithm; ranks whose
//!    descriptors differ still complete the descriptor ring (a frame is
//!    forwarded whole) and fail with the same `Mismatch`.
//! 7. Only the ring's chunks are lent to same-host peers (read in place,
//!    acknowledged once reduced or copied: endpoint invariant 5): a ring
//!    step sends and receives at once, so every lent chunk has a taker
//!    that is not itself waiting on a send. Descriptors, aborts and the
//!    other sends are stored copies, since their sender may wait on them
//!    before it receives.
//! 8. Between processes of one host, all-reduce, reduce-scatter,
//!    all-gather and broadcast of at least one byte (an all-reduce: over
//!    the small size) use arenas (shm invariant 4) instead of the ring. Each
//!    descriptor says whether its rank reaches every member through shared
//!    memory and holds an arena of the call's size (reserved before the
//!    descriptor is sent; over `max_arena_bytes`, or no room in the folder:
//!    no); the arenas are used only when all say so (the flag is left out
//!    of invariant 2's comparison), so every rank picks the same algorithm.
//!    A rank writes its input into its arena and posts the arena's name to
//!    every peer (a broadcast: the root alone); peers read what they need
//!    straight from the arenas. An all-reduce folds its own segment in the
//!    ring's order ([`fold_onto`]: results equal the ring's bit for bit)
//!    into its data and its arena, posts a second time, and then copies the
//!    other ranks' folded segments. An owner writes its arena only after
//!    the call's descriptor exchange, which no rank completes before every
//!    rank has left the previous call, and before its first post, except
//!    its folded segment, which nobody reads before the second post: bytes
//!    never change under a reader.
//! 9. An in-place all-reduce ([`Communicator::all_reduce_in_place`]) runs
//!    on a [`CollectiveBuffer`], which lives in shared memory when every
//!    member is on this host ([`Communicator::buffer`]): peers then read
//!    the caller's bytes where the caller wrote them, with invariant 8's
//!    steps minus the copy in (the buffer is posted instead of an arena).
//!    Its descriptor says `in_place` (compared under invariant 2, since
//!    the two kinds of all-reduce end differently), and the call ends with
//!    a third post, after which no peer reads the buffer any more: only
//!    then may the caller write it again. A failed call replaces the
//!    buffer's storage with zeroed memory, so that neither the caller nor
//!    a peer still reading the old bytes sees a partial result, and what
//!    the caller writes next never reaches a peer of the broken call.
//! 10. The ring copies nothing of its own between receiving a chunk and
//!     sending it on (endpoint invariant 9). The reduce-scatter folds a
//!     received chunk, in the pieces it arrived in, with the rank's input
//!     into fresh memory ([`combine_pieces_into`]) and sends that at the
//!     next step as it is; the all-gather keeps what arrives and sends it
//!     on as it is. The input is read, never written, while the ring runs:
//!     every segment is written once into the result at the end, which
//!     for [`Communicator::all_reduce`] is the input's own memory once the
//!     stream has let go of it. The first send is the input itself
//!     (shared when the caller handed it over, else copied by the
//!     stream). The exception: a rank whose previous rank runs on this
//!     host works in place, as every ring did before. Its chunks arrive as
//!     lent files whose senders wait until the mapping is dropped, so they
//!     must be folded or copied out at once, and folding or copying them
//!     straight into the caller's buffer is the one copy they need.
//! 11. A rank may leave a call before its peers have opened its arena by
//!     name, and grows its arena for the next call before that call's
//!     descriptor exchange. So a replaced arena is kept (retired) until
//!     the next replacement: by then this rank has passed a descriptor
//!     exchange, which no peer completes before leaving the call that
//!     used the retired arena.

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use serde::{Deserialize, Serialize};
use tessel_pjrt::ElementType;

use bytes::Bytes;

use crate::endpoint::{Outgoing, Payload, Peer, TransferEndpoint};
use crate::error::{Result, TransferError};
use crate::reduce::{
    all_gather_step, all_reduce_is_small, byte_segments, check_reducible, chunk_ranges, combine,
    combine_pieces_into, disjoint, finish_mean, fold_in_rank_order, fold_onto, reduce_scatter_step,
    ReduceOp,
};
use crate::shm::{PeerArena, ShmArena};

/// Peer mappings kept per rank (its arena and, say, one in-place buffer).
const PEER_MAPPINGS: usize = 2;

/// Copies between arenas and buffers of at least this many bytes bypass
/// the cache ([`copy_large`]).
const STREAMING_COPY_MIN: usize = 1 << 20;

/// Copies `src` into `dst` (equal lengths); large copies with streaming
/// stores ([`crate::memory::copy_streaming`]). The arenas'
/// copies (an input into the arena, peers' folded segments out of theirs)
/// write megabytes that this rank does not read again during the call, so
/// reading each destination line into the cache first is wasted memory
/// traffic, and on two cores shared by four ranks memory traffic is the
/// call's time: a 4-process in-place all-reduce of 64 MiB measured 48–50
/// → 41–43 ms (README, performance).
fn copy_large(dst: &mut [u8], src: &[u8]) {
    match src.len() >= STREAMING_COPY_MIN {
        true => crate::memory::copy_streaming(dst, src),
        false => dst.copy_from_slice(src),
    }
}

/// The input of a ring all-reduce (invariant 10): the caller's bytes,
/// shared (sent as they are) or borrowed (copied once on their way out).
enum Source<'a> {
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

/// Tag phases (2 bits).
const PHASE_DESCRIPTOR: u64 = 0;
const PHASE_REDUCE: u64 = 1;
const PHASE_GATHER: u64 = 2;
const PHASE_ABORT: u64 = 3;
/// Most ring steps (10 bits) and chunks per message group (12 bits).
const MAX_STEPS: usize = 1 << 10;
const MAX_CHUNKS: usize = 1 << 12;

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

/// What a rank is about to do (invariant 2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    pub kind: String,
    pub op: Option<ReduceOp>,
    pub dtype: String,
    pub bytes: u64,
    pub root: Option<u32>,
    /// This rank reaches every member through shared memory (invariant 8).
    pub shared: bool,
    /// An all-reduce on a [`CollectiveBuffer`] (invariant 9).
    pub in_place: bool,
}

/// The collectives a descriptor can name.
const KINDS: [&str; 6] = [
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "barrier",
    "exchange",
];

/// Largest encoded descriptor.
pub const MAX_DESCRIPTOR: usize = 1024;

impl Descriptor {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a descriptor always encodes")
    }

    /// Decodes a peer's descriptor: bounded size, a known kind and dtype.
    pub fn decode(bytes: &[u8]) -> Result<Descriptor> {
        let bad =
            |why: String| TransferError::InvalidHeader(format!("collective descriptor: {why}"));
        if bytes.len() > MAX_DESCRIPTOR {
            return Err(bad(format!("{} bytes, over {MAX_DESCRIPTOR}", bytes.len())));
        }
        let d: Descriptor = postcard::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
        if !KINDS.contains(&d.kind.as_str()) {
            return Err(bad(format!("unknown kind {:?}", d.kind)));
        }
        if ElementType::parse(&d.dtype).is_none() {
            return Err(bad(format!("unknown dtype {:?}", d.dtype)));
        }
        Ok(d)
    }
}

/// What travels around the descriptor ring: the encoded descriptor and,
/// for a small all-reduce, the rank's data (`u16` LE length, descriptor,
/// data).
pub struct DescriptorFrame;

impl DescriptorFrame {
    pub fn encode(d: &Descriptor, data: &[u8]) -> Vec<u8> {
        let desc = d.encode();
        let mut out = Vec::with_capacity(2 + desc.len() + data.len());
        out.extend_from_slice(&(desc.len() as u16).to_le_bytes());
        out.extend_from_slice(&desc);
        out.extend_from_slice(data);
        out
    }

    /// The descriptor (validated) and the data that came with it. Data is
    /// accepted only where the descriptor says it belongs: a small
    /// all-reduce, exactly its byte count.
    pub fn decode(bytes: &[u8]) -> Result<(Descriptor, &[u8])> {
        let bad = |why: String| TransferError::InvalidHeader(format!("descriptor frame: {why}"));
        if bytes.len() < 2 {
            return Err(bad("shorter than its length prefix".into()));
        }
        let len = u16::from_le_bytes([bytes[0], bytes[1]]) as usize;
        let desc = bytes
            .get(2..2 + len)
            .ok_or_else(|| bad(format!("announces {len} descriptor bytes, has fewer")))?;
        let d = Descriptor::decode(desc)?;
        let data = &bytes[2 + len..];
        let want = if d.carries_data() {
            d.bytes as usize
        } else {
            0
        };
        if data.len() != want {
            return Err(bad(format!(
                "{} bytes of data with a descriptor of {d}",
                data.len()
            )));
        }
        Ok((d, data))
    }
}

impl Descriptor {
    /// Whether the rank's data rides with the descriptor (invariant 6).
    fn carries_data(&self) -> bool {
        self.kind == "all_reduce" && all_reduce_is_small(self.bytes as usize)
    }

    /// Whether a call of more than one rank would move data through
    /// arenas if every rank offers them (invariant 8): at least a byte,
    /// and neither a barrier nor a small all-reduce.
    fn wants_arenas(&self) -> bool {
        self.bytes > 0 && self.kind != "barrier" && !self.carries_data()
    }

    /// How a call of `n` ranks that agreed on this descriptor runs (with
    /// arenas if `shared`), as the metrics label it.
    fn algorithm(&self, n: usize, shared: bool) -> &'static str {
        if n == 1 {
            "local"
        } else if self.kind == "barrier" {
            "descriptors"
        } else if self.kind == "exchange" {
            "point_to_point"
        } else if self.carries_data() {
            "small"
        } else if shared {
            "arena"
        } else {
            "ring"
        }
    }

    /// The kind as a static label (descriptors are validated on decode and
    /// built from literals here).
    fn kind_label(&self) -> &'static str {
        KINDS
            .into_iter()
            .find(|k| *k == self.kind)
            .unwrap_or("unknown")
    }

    /// The same call, whatever the ranks' paths (invariants 2 and 8).
    fn same_call(&self, other: &Descriptor) -> bool {
        Descriptor {
            shared: self.shared,
            ..other.clone()
        } == *self
    }
}

impl std::fmt::Display for Descriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(op) = self.op {
            write!(f, " {}", op.name())?;
        }
        if self.in_place {
            write!(f, " in place")?;
        }
        write!(f, " of {} bytes of {}", self.bytes, self.dtype)?;
        if let Some(root) = self.root {
            write!(f, " from root {root}")?;
        }
        Ok(())
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

/// The arenas of the same-host path (invariant 8): this rank's, and its
/// mappings of the peers' arenas and buffers by rank (the most recently
/// used first, at most [`PEER_MAPPINGS`] each), kept from call to call.
#[derive(Default)]
struct Arenas {
    mine: Option<ShmArena>,
    /// The arena `mine` replaced, kept (invariant 11): a peer of the call
    /// that used it may still be opening it by name.
    retired: Option<ShmArena>,
    peers: Vec<Vec<Arc<PeerArena>>>,
}

/// A buffer for [`Communicator::all_reduce_in_place`] (invariant 9): in
/// shared memory when the communicator that made it reaches every member
/// that way, else in private memory. Write the input with
/// [`Self::as_mut_slice`], read the result with [`Self::as_slice`].
pub struct CollectiveBuffer {
    storage: Storage,
}

enum Storage {
    Shared(ShmArena),
    Private(Vec<u8>),
}

impl CollectiveBuffer {
    /// A zeroed buffer of `len` bytes in private memory.
    pub fn private(len: usize) -> CollectiveBuffer {
        CollectiveBuffer {
            storage: Storage::Private(vec![0; len]),
        }
    }

    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::Shared(a) => a.len(),
            Storage::Private(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether peers on this host can read it in place.
    pub fn is_shared(&self) -> bool {
        matches!(self.storage, Storage::Shared(_))
    }

    pub fn as_slice(&self) -> &[u8] {
        match &self.storage {
            Storage::Shared(a) => a.region(0..a.len()),
            Storage::Private(v) => v,
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Shared(a) => {
                let len = a.len();
                a.region_mut(0..len)
            }
            Storage::Private(v) => v,
        }
    }

    /// The shared-memory file's name, for the peers.
    fn shared_name(&self) -> Option<String> {
        match &self.storage {
            Storage::Shared(a) => Some(a.name().to_owned()),
            Storage::Private(_) => None,
        }
    }

    /// After a failed call (invariant 9): fresh zeroed memory of the same
    /// length; the old file keeps its bytes for whoever still maps it.
    fn replace_with_zeros(&mut self) {
        self.storage = Storage::Private(vec![0; self.len()]);
    }
}

impl std::fmt::Debug for CollectiveBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectiveBuffer")
            .field("len", &self.len())
            .field("shared", &self.is_shared())
            .finish()
    }
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

    pub fn rank(&self) -> usize {
        self.rank
    }

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
        let d = self.offer_arenas(descriptor("all_reduce", Some(op), dtype, data.len(), None));
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
        let call = descriptor("all_reduce", None, ElementType::U8, len, None);
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
        let mut d = descriptor("all_reduce", Some(op), dtype, len, None);
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
            "reduce_scatter",
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
        let d = self.offer_arenas(descriptor("all_gather", None, dtype, data.len(), None));
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
        let d = self.offer_arenas(descriptor("broadcast", None, dtype, data.len(), Some(root)));
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
        let d = descriptor("exchange", None, ElementType::U8, 0, None);
        self.run(d, |call| async move {
            let tag = call.tag(PHASE_REDUCE, 0, 0);
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
        let d = self.offer_arenas(descriptor("barrier", None, ElementType::U8, 0, None));
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
            base: (u64::from(self.group) << 48) | ((seq & 0xff_ffff) << 24),
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
        let kind = d.kind_label();
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
            let prefix = base >> 24;
            endpoint.discard(move |tag| tag >> 24 == prefix);
            self.broken = Some(reason);
        }
        result
    }
}

fn descriptor(
    kind: &str,
    op: Option<ReduceOp>,
    dtype: ElementType,
    bytes: usize,
    root: Option<u32>,
) -> Descriptor {
    Descriptor {
        kind: kind.into(),
        op,
        dtype: dtype.name().into(),
        bytes: bytes as u64,
        root,
        shared: false,
        in_place: false,
    }
}

/// Invariant 3: best effort, in the background, bounded.
fn tell_others(
    endpoint: &Arc<TransferEndpoint>,
    members: &[Peer],
    rank: usize,
    base: u64,
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
                    base | (PHASE_ABORT << 22),
                    ElementType::U8,
                    &[bytes.len() as u64],
                    &bytes,
                    Duration::from_secs(2),
                )
                .await;
        });
    }
}

/// The state of one collective call.
struct Call {
    endpoint: Arc<TransferEndpoint>,
    members: Vec<Peer>,
    rank: usize,
    base: u64,
    deadline: Instant,
    timeout: Duration,
    chunk_bytes: usize,
    what: String,
    /// Every rank is on this host: arenas instead of the ring (invariant 8).
    shared: bool,
    arenas: Arc<Mutex<Arenas>>,
}

impl Call {
    fn n(&self) -> usize {
        self.members.len()
    }

    /// Every rank but this one, in order.
    fn others(&self) -> Vec<usize> {
        (0..self.n()).filter(|&k| k != self.rank).collect()
    }

    fn tag(&self, phase: u64, step: usize, chunk: usize) -> u64 {
        self.base | (phase << 22) | ((step as u64) << 12) | chunk as u64
    }

    fn left(&self) -> Result<Duration> {
        self.deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| self.deadline_exceeded())
    }

    fn deadline_exceeded(&self) -> TransferError {
        TransferError::DeadlineExceeded {
            what: self.what.clone(),
            after: self.timeout,
        }
    }

    async fn send(&self, to: usize, tag: u64, dtype: ElementType, data: &[u8]) -> Result<()> {
        self.send_with(to, tag, dtype, Outgoing::Borrowed(data), false)
            .await
    }

    /// `lend`: a ring chunk, lent to a same-host peer (invariant 7) or
    /// kept in its pieces by a network peer (invariant 10).
    async fn send_with(
        &self,
        to: usize,
        tag: u64,
        dtype: ElementType,
        data: Outgoing<'_>,
        lend: bool,
    ) -> Result<()> {
        let count = (data.len() / dtype.size()) as u64;
        let (peer, left) = (&self.members[to], self.left()?);
        self.endpoint
            .send_with(peer, tag, dtype, &[count], data, left, lend)
            .await
            .map_err(|e| match e {
                TransferError::DeadlineExceeded { .. } => self.deadline_exceeded(),
                e => e,
            })
    }

    /// Waits for `tag` from `from`, or an abort from anyone (invariant 3).
    async fn recv(&self, from: usize, tag: u64) -> Result<Vec<u8>> {
        self.take(from, tag).await.map(Payload::into_vec)
    }

    /// As [`Self::recv`], with a lent payload still in place.
    async fn take(&self, from: usize, tag: u64) -> Result<Payload> {
        let abort = self.base | (PHASE_ABORT << 22);
        let mut keys = vec![(from as u32, tag)];
        keys.extend(
            (0..self.n())
                .filter(|&r| r != self.rank)
                .map(|r| (r as u32, abort)),
        );
        let (i, got) = self
            .endpoint
            .take_first(&keys, self.left()?)
            .await
            .map_err(|e| match e {
                TransferError::DeadlineExceeded { .. } => self.deadline_exceeded(),
                e => e,
            })?;
        if i > 0 {
            return Err(TransferError::Aborted {
                rank: keys[i].0,
                reason: String::from_utf8_lossy(&got.payload.into_vec()).into_owned(),
            });
        }
        Ok(got.payload)
    }

    /// A ring chunk of `len` bytes from `from` under `tag`.
    async fn take_chunk(&self, from: usize, tag: u64, len: usize) -> Result<Payload> {
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
    fn chunk_len(&self, dtype: ElementType) -> usize {
        (self.chunk_bytes / dtype.size()).max(1) * dtype.size()
    }

    /// Invariant 2; returns what every rank attached, in rank order, and
    /// whether every rank reaches every other through shared memory
    /// (invariant 8).
    async fn exchange_descriptors(
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
            let tag = self.tag(PHASE_DESCRIPTOR, step, 0);
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

    /// Lets `fill` write this rank's arena (reserved at least `len` bytes
    /// long before its descriptor said `shared`); returns its name
    /// (invariant 8).
    fn fill_arena(&self, len: usize, fill: impl FnOnce(&mut ShmArena)) -> Result<String> {
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
    async fn post_to_all(&self, tag: u64, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
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
    fn peer_arena(&self, from: usize, name: &[u8], min_len: usize) -> Result<Arc<PeerArena>> {
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
    async fn exchange_arenas(
        &self,
        name: &str,
        min_len: usize,
    ) -> Result<Vec<Option<Arc<PeerArena>>>> {
        let names = self
            .post_to_all(self.tag(PHASE_REDUCE, 0, 0), name.as_bytes())
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
    async fn fold_in_arenas(
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
    fn fold_own_segment(
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
    async fn copy_folded_segments(
        &self,
        peers: &[Option<Arc<PeerArena>>],
        data: &mut [u8],
        segs: &[Range<usize>],
    ) -> Result<()> {
        use futures::stream::{FuturesUnordered, TryStreamExt};
        let tag = self.tag(PHASE_GATHER, 0, 0);
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

    /// Whether ring chunks from the previous rank arrive as lent files (it
    /// runs on this host): the ring then works in place (invariant 10).
    fn lent_files_arrive(&self) -> bool {
        let prev = (self.rank + self.n() - 1) % self.n();
        self.endpoint.same_host(&self.members[prev])
    }

    /// One ring pass of `n - 1` steps in place (invariant 10's exception).
    /// At step `s` this rank sends the segment `schedule(s).0` of `buf` to
    /// the next rank and receives `schedule(s).1` from the previous one,
    /// combining it into `buf` with `op` (reduce phase) or storing it there
    /// (gather phase).
    async fn ring_in_place(
        &self,
        phase: u64,
        op: Option<ReduceOp>,
        dtype: ElementType,
        buf: &mut [u8],
        segments: &[Range<usize>],
        schedule: impl Fn(usize) -> (usize, usize),
    ) -> Result<()> {
        let n = self.n();
        let (next, prev) = ((self.rank + 1) % n, (self.rank + n - 1) % n);
        let chunk = self.chunk_len(dtype);
        for step in 0..n - 1 {
            let (send_seg, recv_seg) = schedule(step);
            let (out_buf, in_buf) =
                disjoint(buf, segments[send_seg].clone(), segments[recv_seg].clone());
            let sends = out_buf.chunks(chunk).enumerate().map(|(k, c)| {
                let tag = self.tag(phase, step, k);
                self.send_with(next, tag, dtype, Outgoing::Borrowed(c), true)
            });
            let recvs = async {
                for (k, dst) in in_buf.chunks_mut(chunk).enumerate() {
                    let tag = self.tag(phase, step, k);
                    let got = self.take_chunk(prev, tag, dst.len()).await?;
                    let got = got.contiguous();
                    match op {
                        Some(op) => combine(op, dtype, dst, &got)?,
                        None => dst.copy_from_slice(&got),
                    }
                }
                Ok(())
            };
            futures::try_join!(try_join_all(sends), recvs)?;
        }
        Ok(())
    }

    /// [`Self::reduce_phase`] in place: segment `r` of `buf` ends complete.
    async fn reduce_in_place(
        &self,
        op: ReduceOp,
        dtype: ElementType,
        buf: &mut [u8],
        segs: &[Range<usize>],
    ) -> Result<()> {
        let (n, r) = (self.n(), self.rank);
        self.ring_in_place(PHASE_REDUCE, Some(op), dtype, buf, segs, |s| {
            reduce_scatter_step(n, r, s)
        })
        .await?;
        if op == ReduceOp::Mean {
            finish_mean(dtype, &mut buf[segs[r].clone()], n)?;
        }
        Ok(())
    }

    /// [`Self::gather_phase`] in place, segment `r` of `buf` complete.
    async fn gather_in_place(
        &self,
        dtype: ElementType,
        buf: &mut [u8],
        segs: &[Range<usize>],
    ) -> Result<()> {
        let (n, r) = (self.n(), self.rank);
        self.ring_in_place(PHASE_GATHER, None, dtype, buf, segs, |s| {
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
    async fn reduce_phase(
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
                self.send_with(next, self.tag(PHASE_REDUCE, step, k), dtype, c, true)
            });
            let recvs = async {
                let mut sums = Vec::new();
                for (k, c) in chunk_ranges(segs[recv_seg].clone(), chunk).enumerate() {
                    let tag = self.tag(PHASE_REDUCE, step, k);
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
    async fn gather_phase<'a>(
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
                let tag = self.tag(PHASE_GATHER, step, k);
                self.send_with(next, tag, dtype, c.clone(), true)
            });
            let recvs = async {
                let mut got = Vec::new();
                for (k, c) in chunk_ranges(segs[recv_seg].clone(), chunk).enumerate() {
                    let tag = self.tag(PHASE_GATHER, step, k);
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
    async fn ring_all_reduce(
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

    async fn all_reduce(
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
        } else if self.n() > 1 && self.lent_files_arrive() {
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
    async fn all_reduce_in_place(
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
            self.post_to_all(self.tag(PHASE_GATHER, 1, 0), &[]).await?;
        } else if self.n() > 1 && self.lent_files_arrive() {
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

    async fn reduce_scatter(
        self,
        op: ReduceOp,
        dtype: ElementType,
        mut data: Vec<u8>,
    ) -> Result<Vec<u8>> {
        let segs = byte_segments(dtype, data.len(), self.n());
        if self.shared {
            self.fold_in_arenas(op, dtype, &mut data, &segs, false)
                .await?;
        } else if self.n() > 1 && self.lent_files_arrive() {
            self.reduce_in_place(op, dtype, &mut data, &segs).await?;
        } else if self.n() > 1 {
            let input = Source::Shared(Bytes::from(data));
            return Ok(self.reduce_phase(op, dtype, &input, &segs).await?.concat());
        }
        Ok(data[segs[self.rank].clone()].to_vec())
    }

    async fn all_gather(self, dtype: ElementType, data: &[u8]) -> Result<Vec<u8>> {
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
        if self.lent_files_arrive() {
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
    async fn broadcast(
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
            let (len, tag) = (data.len(), self.tag(PHASE_REDUCE, 0, 0));
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
                .map(|(k, c)| self.send(next, self.tag(PHASE_GATHER, 0, k), dtype, c));
            try_join_all(sends).await?;
            return Ok(data);
        }
        let mut sends = Vec::new();
        for (k, dst) in data.chunks_mut(chunk).enumerate() {
            let got = self.recv(prev, self.tag(PHASE_GATHER, 0, k)).await?;
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
            .map(|(k, c)| self.send(next, self.tag(PHASE_GATHER, 0, k), dtype, c));
        try_join_all(fwd).await?;
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_bad_ones_are_refused() {
        let d = descriptor(
            "all_reduce",
            Some(ReduceOp::Mean),
            ElementType::BF16,
            64,
            None,
        );
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        assert_eq!(d.to_string(), "all_reduce mean of 64 bytes of bf16");
        // Paths may differ between ranks; in place or not may not.
        let shared = Descriptor {
            shared: true,
            ..d.clone()
        };
        assert!(shared.same_call(&d) && d.same_call(&shared));
        let in_place = Descriptor {
            in_place: true,
            ..d.clone()
        };
        assert!(!in_place.same_call(&d) && !d.same_call(&in_place));
        assert_eq!(
            in_place.to_string(),
            "all_reduce mean in place of 64 bytes of bf16"
        );
        let mut bad = d.clone();
        bad.kind = "all_to_all".into();
        assert!(Descriptor::decode(&bad.encode()).is_err());
        bad = d.clone();
        bad.dtype = "f8".into();
        assert!(Descriptor::decode(&bad.encode()).is_err());
        assert!(Descriptor::decode(&[0xff; 5]).is_err());
        assert!(Descriptor::decode(&vec![0; MAX_DESCRIPTOR + 1]).is_err());
    }

    #[test]
    fn frames_carry_data_only_for_a_small_all_reduce() {
        let small = descriptor("all_reduce", Some(ReduceOp::Sum), ElementType::F32, 8, None);
        let frame = DescriptorFrame::encode(&small, &[1; 8]);
        let (d, data) = DescriptorFrame::decode(&frame).unwrap();
        assert_eq!((d, data), (small.clone(), &[1u8; 8][..]));
        // Data of the wrong length, or data where none belongs, is refused.
        assert!(DescriptorFrame::decode(&DescriptorFrame::encode(&small, &[1; 4])).is_err());
        let big = descriptor(
            "all_reduce",
            Some(ReduceOp::Sum),
            ElementType::F32,
            1 << 20,
            None,
        );
        assert!(DescriptorFrame::decode(&DescriptorFrame::encode(&big, &[1; 8])).is_err());
        assert!(DescriptorFrame::decode(&DescriptorFrame::encode(&big, &[])).is_ok());
        let barrier = descriptor("barrier", None, ElementType::U8, 0, None);
        assert!(DescriptorFrame::decode(&DescriptorFrame::encode(&barrier, &[])).is_ok());
        // Truncated frames.
        assert!(DescriptorFrame::decode(&[5]).is_err());
        assert!(DescriptorFrame::decode(&[200, 0, 1, 2]).is_err());
    }

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
        let offered = |c: &Communicator, kind: &str, op: Option<ReduceOp>, bytes: usize| {
            let d = descriptor(kind, op, ElementType::F32, bytes, None);
            c.offer_arenas(d).shared
        };
        let ep = endpoint(shm.path());
        let c = comm(&ep, peer(2, "here"), 1 << 20);
        assert!(offered(&c, "all_reduce", sum, 1 << 20));
        assert!(offered(&c, "all_gather", None, 8));
        let files = || std::fs::read_dir(shm.path()).unwrap().count();
        assert_eq!(files(), 1, "reserved");
        assert!(
            !offered(&c, "all_reduce", sum, (1 << 20) + 4),
            "over the limit"
        );
        assert!(!offered(&c, "all_reduce", sum, 64), "small");
        assert!(!offered(&c, "barrier", None, 0));
        assert!(!offered(&c, "all_gather", None, 0), "empty");
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
        assert!(!offered(&elsewhere, "all_reduce", sum, 1 << 20));
        assert!(!elsewhere.buffer(1 << 20).is_shared());
        // No room in the folder (here: no folder): the ring, not a failure.
        let gone = endpoint(&shm.path().join("missing"));
        let c = comm(&gone, peer(2, "here"), 1 << 30);
        assert!(!offered(&c, "all_reduce", sum, 1 << 20));
        assert!(!c.buffer(1 << 20).is_shared());
    }
}
