//! The embedded Raft backend: openraft 0.9 (storage-v2) over a log of
//! segment files and a redb state machine.
//!
//! * [`storage`]: openraft's log storage, checked with openraft's storage
//!   suite together with [`sm`].
//! * [`wal`]: the log itself: segment files appended and `fdatasync`ed.
//! * [`sm`]: the state machine on disk (redb) and its snapshot files.
//! * [`key_filter`]: the keys the state machine may hold, to skip lookups
//!   of new keys.
//! * [`node`]: one replica: openraft, the QUIC server, request routing and
//!   group proposals.
//! * [`client`]: [`client::RaftKv`], the client-facing `KvStore`.
//!
//! # The replicated store
//!
//! ## Reads (`kv-service/src/raft/node/`)
//! A read first calls openraft's `ensure_linearizable` (the leader confirms
//! its leadership with a quorum and applies everything committed before that
//! point), then waits for the read floor: everything in the leader's log as
//! of its first read in the term. The committed index is saved lazily (it
//! rides with the next append), so a leader that resumed its term after a
//! restart could hold a committed index older than writes it had
//! acknowledged, and openraft's check alone would then serve a stale read
//! (the restart-everything process test caught this). A replica that reopens
//! with a committed vote for itself now saves it uncommitted and holds an
//! election; the floor stays as the reads' own guarantee. A leader never
//! drops its own log, so the wait ends while it leads; if it stops leading
//! the read fails and the client tries another replica.
//!
//! ## The Raft log (`kv-service/src/raft/wal/`, `storage.rs`)
//! Segment files in `log/` of the data folder. A record is
//! `[length: u32 LE][crc32 of the payload: u32 LE][payload]`, the payload a
//! postcard `Record` (`State`, `Entry`, `Committed`, `Vote`, `Truncate`,
//! `Purge`) of at most `MAX_RECORD` bytes; a segment starts with `MAGIC` and
//! a `State` record (the vote, committed index and purge point when it was
//! created), so replaying the segments in order rebuilds everything. One
//! writer thread owns every write: appends that queue behind a sync are
//! written and synced together. With direct I/O (the default where the file
//! system takes `O_DIRECT`) a write re-writes the segment's last partial
//! 4 KiB block, the new records after it and zeros to the block's end, in
//! one `pwrite` through an `O_DIRECT | O_DSYNC` descriptor: it writes and
//! syncs past the page cache. After a write's callbacks the last segment is
//! zero-filled up to a megabyte ahead, so the next write lands on blocks the
//! file has and `O_DSYNC` needs no journal commit for a new size. Where
//! `O_DIRECT` is refused (tmpfs) or with `--log-io buffered`, writes go
//! through the page cache and `fdatasync`.
//!
//! On start only a torn write at the end of the last segment is cut; damage
//! anywhere else refuses to start. After a failed write the log takes no
//! more: part of the failed bytes may be on disk, and a shorter write over
//! them could leave a whole, never acknowledged record behind it.
//!
//! The leader's own entries are reported flushed as soon as they are
//! queued, because openraft 0.9 awaits that report before anything else,
//! replication included: the leader's sync and the followers' then overlap
//! instead of following one another. Own entries are those whose leader id
//! is this replica's committed vote for itself; a follower saves the
//! leader's vote before it appends, so it never takes this path. openraft
//! may then count the leader in a quorum before its entries are on its
//! disk, so `LogSynced` (how far the log really is on disk) holds back
//! everything that could act on such a commit: the state machine applies
//! (and answers) only synced entries, the commit index sent to followers is
//! bounded by it, the committed index saved is written after the entries it
//! covers, and a replica that reopens with a committed vote for itself saves
//! it uncommitted, because openraft 0.9 would otherwise resume leading that
//! term and could write new entries under log ids a follower already holds
//! but this replica lost in the crash.
//!
//! The committed index is not written on its own: openraft saves it between
//! a write's quorum and its apply, where a sync of its own would cost one on
//! every write. It rides with the next append, so after a crash it reads
//! back older, never newer: a restarted replica applies less at start and
//! learns the rest from the leader.
//!
//! ## The state machine (`kv-service/src/raft/sm/`)
//! Applied batches collect in an in-memory overlay (bounded by
//! `FLUSH_BYTES`/`FLUSH_ENTRIES`, at most `FLUSH_INTERVAL` old at the end of
//! a batch) that reads consult first. A due flush runs on a thread of its
//! own while the next batches apply into a fresh overlay; a batch waits for
//! it only when the live overlay is full, and a synchronous flush (before a
//! snapshot) or an installed snapshot waits for it first. Reads consult the
//! live overlay, the one in flight, then the tables as of the previous flush
//! (read transactions opened when that flush was adopted, so its writes are
//! never seen twice). Flushes commit without fsync; the first after
//! `DURABLE_INTERVAL` (10 s) and the one before a snapshot commit with fsync
//! (which also lets redb reuse freed pages); a crash costs at most
//! re-applying the entries since the last fsync.
//!
//! The state (revision, clock, barriers) is stored without its leases, and
//! each lease as a row of the leases table: a flush writes the rows changed
//! since the last one (`kv::state` invariant 11), not every lease (a
//! keep-alive sent as a request changes one; those answered from the
//! leader's memory change none once the lease is held). `leases-at` names the applied log id the rows
//! go with; a file an older build wrote last holds the leases inside the
//! state, and opening it drops the rows and writes them all again (`sm`
//! invariant 9).
//!
//! The history table holds the events of each flush as one record keyed by
//! the last revision in it (one insert per flush); reading from a revision
//! starts at the first key at or above it and filters; forgetting below a
//! revision drops the records keyed below it. Snapshots carry records under
//! the same keys.
//!
//! The sessions table holds each client session (`tessel_kv::state`
//! sessions) under its id, one small record each (the answers of its calls
//! in flight), written through the overlays like a pair and carried by
//! snapshots (version 2); an idle session is removed by the request that
//! starts the next sweep period, the same on every replica.
//!
//! Below the overlays a scalable Bloom filter (`key_filter`, about 10 bits
//! per key) holds every key the tables may hold: built from the tables on
//! opening and after a snapshot, fed every key written to the live overlay.
//! Removed keys stay in it; once it holds more than twice the tables' keys
//! (plus `MIN_CAPACITY`), the next flush's thread builds a new one from the
//! tables it committed, and adopting the flush adds the live overlay's keys.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use tessel_kv::state::{Output, Request};
use tessel_kv::KvError;

pub mod client;
pub mod key_filter;
pub mod node;
pub mod sm;
pub mod storage;
pub mod wal;

pub use openraft::SnapshotPolicy;

/// One log entry: state-machine requests proposed together (the leader
/// groups concurrent writes so that one append and one fsync serve them
/// all), applied in order. Shared, not copied, by the clones openraft
/// takes of an entry (one per follower it is sent to, one to apply it);
/// encoded as the plain sequence of requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Proposal(pub Arc<Vec<Request>>);

impl Proposal {
    /// An entry of several requests, applied in order.
    pub fn new(reqs: Vec<Request>) -> Proposal {
        Proposal(Arc::new(reqs))
    }

    /// An entry of one request.
    pub fn one(req: Request) -> Proposal {
        Proposal::new(vec![req])
    }

    /// Bytes of keys and values carried.
    pub fn payload_bytes(&self) -> usize {
        self.0.iter().map(|r| r.op.payload_bytes()).sum()
    }
}

/// The results of applying one log entry, one per request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response(pub Vec<Result<Output, KvError>>);

impl Response {
    /// The result of a one-request proposal.
    pub fn single(self) -> Result<Output, KvError> {
        self.0
            .into_iter()
            .next()
            .unwrap_or_else(|| Err(KvError::Internal("an empty response".into())))
    }
}

openraft::declare_raft_types!(
    /// tessel's Raft group: each entry is a [`Proposal`] of state-machine
    /// [`Request`]s.
    pub TypeConfig:
        D = Proposal,
        R = Response,
        NodeId = u64,
        Node = openraft::BasicNode,
        SnapshotData = tokio::fs::File,
);

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_kv::state::Op;

    /// Sharing a proposal's requests changed nothing on the wire or in the
    /// log: it encodes as the plain sequence of its requests.
    #[test]
    fn a_proposal_encodes_as_its_plain_requests() {
        let reqs: Vec<Request> = (0..3u8)
            .map(|i| Request {
                now_ms: 7,
                op: Op::Put {
                    key: vec![i],
                    value: vec![i; 5],
                    lease: None,
                },
            })
            .collect();
        let shared = postcard::to_allocvec(&Proposal::new(reqs.clone())).unwrap();
        assert_eq!(shared, postcard::to_allocvec(&reqs).unwrap());
        let back: Proposal = postcard::from_bytes(&shared).unwrap();
        assert_eq!(*back.0, reqs);
    }
}
