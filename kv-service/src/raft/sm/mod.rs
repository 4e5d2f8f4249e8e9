//! The replicated state machine on disk: key-value pairs and recent events
//! in a redb file of their own (`state.redb`), snapshots as files streamed
//! from it. A replica's memory grows with its keys only by the key filter
//! (invariant 8). The `raft` module docs, "The state machine", tell how it flows.
//!
//! Invariants:
//! 1. Applied batches collect in an overlay that reads consult first; a flush
//!    writes it with the [`KvState`], applied log id and membership in one
//!    transaction, so after a crash the file is at a batch boundary.
//! 2. Flushes skip fsync except the first after [`DURABLE_INTERVAL`] and the
//!    one before a snapshot; the log is purged only up to a snapshot, so what
//!    the log no longer holds is durable here.
//! 3. A snapshot is streamed from one read transaction to a file, fsynced and
//!    renamed into place: the current snapshot is always complete.
//! 4. A received snapshot is checked record by record (sizes, header, counts);
//!    a bad one installs nothing, a good one replaces the tables in one commit.
//! 5. The history table keys each flush's events by its last revision: record
//!    `k` holds revisions `<= k` and above the previous key.
//! 6. At most one flush is in flight (on its own thread), so flushes commit in
//!    order; reads see the live overlay, the one in flight, then the tables.
//! 7. An entry is applied only once the log holds it on disk
//!    ([`StateMachineStore::apply_when_synced`]; storage invariant 5a).
//! 8. Every key in the tables is in the [`KeyFilter`] (no false negatives);
//!    a key it does not hold is absent below the overlays.
//! 9. `STATE` holds the state without its leases and `LEASES` a row per
//!    lease, each flush writing the rows changed since the last (`kv::state`
//!    invariant 11); `LEASES_AT` equals `APPLIED` in every such commit.
//!    Where it does not (a file an older build wrote last), `STATE` holds
//!    every lease and the rows are stale: they are dropped on opening.
//! 10. The key count is the tables' length plus each overlay's keys created
//!     less keys removed, kept as they are applied: counting reads no key.
//! 11. The last overlays flushed stay in memory, at most `KEPT_OVERLAYS`
//!     of them holding at most `KEPT_ENTRIES` revisions and events in all
//!     (the newest always stays): history from the first revision they
//!     hold on is read from them, never decoded from the table.
//! 12. Each overlay indexes its events by (key, revision): a watch on a
//!     narrow prefix replays only its own events, not every event since
//!     its revision, so N workers' watches cost O(N), not O(N²).
//! 13. The lease rows a flush writes are encoded as the batches that
//!     changed them end, in order, and written in that order; they are
//!     dropped with the overlays when a snapshot replaces the tables.

// openraft's storage traits fix the error type (`StorageError`).
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufReader, BufWriter, Read, Write};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use redb::{Database, Durability, ReadTransaction, ReadableTable, ReadableTableMetadata};
use redb::{TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

use crate::raft::key_filter::{self, KeyFilter};
use crate::raft::storage::LogSynced;
use crate::raft::{Response, TypeConfig};
use tessel_kv::state::{ClientSession, Event, KeyValue, KvState, Limits, Output};
use tessel_kv::state::{Tables, TablesMut};
use tessel_kv::AppliedState;
use tessel_kv::{KvError, Result};

type NodeId = u64;
type Node = openraft::BasicNode;
type StorageResult<T> = std::result::Result<T, StorageError<NodeId>>;

/// Key → [`StoredValue`].
const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("data");
/// Revision → its events (postcard `Vec<Event>`).
const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
/// Client session id → its postcard [`ClientSession`] (`kv::state`
/// sessions): in the tables, not the state, because the state is written
/// whole with every flush and there is a session per client.
const SESSIONS: TableDefinition<u128, &[u8]> = TableDefinition::new("sessions");
/// Lease id → its row (`KvState::take_changed_leases`, invariant 9).
const LEASES: TableDefinition<u64, &[u8]> = TableDefinition::new("leases");
/// [`STATE`], [`APPLIED`], [`MEMBERSHIP`], [`LEASES_AT`].
const SM: TableDefinition<&str, &[u8]> = TableDefinition::new("sm");
const STATE: &str = "state";
const APPLIED: &str = "applied";
const MEMBERSHIP: &str = "membership";
/// [`APPLIED`] as of the last commit that wrote [`LEASES`] (invariant 9).
const LEASES_AT: &str = "leases-at";

/// Page cache of `state.redb`: the hot pages (new keys land together);
/// cold reads come from the OS page cache, which a replica's RSS does not
/// count.
const CACHE_BYTES: usize = 16 << 20;
/// The overlay is flushed once it holds this many bytes or entries, or is
/// this old (invariant 2). The log keeps the data safe meanwhile, so the
/// interval only bounds replay after a crash. redb rewrites each page that
/// holds a changed row, and rows changed a second apart often share one:
/// with 16,384 workers renewing leases (and, then, rewriting their alive
/// keys once a TTL), a flush every 100 ms wrote 9,500 pages a second, one
/// a second 3,700 (and took a third off the put's p50). At 16,384
/// simulated hosts the tables outgrow [`CACHE_BYTES`] and a flush's rows
/// rarely share a page: 8,192 entries a flush cost each replica's flush
/// thread 0.66-0.72 s in their bootstrap (after 1,024 and 4,096 hosts'
/// keys), 32,768 0.43-0.50 s, and the run 0.6 s less in the median.
/// The entries' bound is wide enough that the live overlay does not fill
/// while the flush before it runs, which would hold the next batch until
/// that flush ends (invariant 6): on a busy machine the flush thread (at
/// nice 10) took up to 1.8 s, and with 32,768 entries the appliers of one
/// 16,384-host bootstrap waited 7 times, 1.9 s in all and up to 983 ms at
/// once; with 131,072 none waited, and 1 M keys take the same memory.
const FLUSH_BYTES: usize = 8 << 20;
const FLUSH_ENTRIES: usize = 128 * 1024;
const FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Overlays kept in memory after their flush (invariant 11): a few
/// seconds of history under load, at most this many times `FLUSH_BYTES`,
/// and up to as much again in the index's copies of the keys (invariant 12).
const KEPT_OVERLAYS: usize = 4;
/// Revisions and events (the index's entries) the kept overlays may hold
/// in all (invariant 11): about what four overlays of 8,192 entries held
/// before flushes took 32,768, so that a replica holding 1 M keys stays
/// within its memory (`tessel-bench kv`: 99-123 MiB a replica, against
/// 90-98 with the smaller flushes).
const KEPT_ENTRIES: usize = 32 * 1024;
/// The most events under a prefix that a read takes from an overlay's
/// index (invariant 12): past it, reading the revisions since `from`
/// costs no more than walking the index would.
const INDEX_BUDGET: usize = 256;
/// Time between fsyncs of `state.redb` (invariant 2); the log's fsyncs
/// keep the data safe meanwhile. Each one writes back everything written
/// since the last and runs on the flush thread (invariant 6), but the
/// log's own fsyncs on the same disk wait behind it (100–230 ms under a
/// 64-client load here); every second instead of every ten gave more,
/// shorter stalls (~25 ms) and no better tail.
pub const DURABLE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// The snapshot header (state, leases, barriers) may not exceed this.
pub const MAX_SNAPSHOT_HEADER: usize = 64 << 20;
/// A history record's events travel in records of about this many bytes.
const EVENTS_PER_RECORD_BYTES: usize = 1 << 20;
/// 2: client sessions (`Session` records, a `Trailer` that counts them);
/// version 1 files (no sessions, an `End`) are still read.
const SNAPSHOT_VERSION: u32 = 2;

fn storage<E: std::fmt::Display>(e: E) -> KvError {
    KvError::Storage(e.to_string())
}

fn sm_err(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::new(
        ErrorSubject::StateMachine,
        verb,
        AnyError::error(e.to_string()),
    )
    .into()
}

fn snap_err(
    meta: Option<&SnapshotMeta<NodeId, Node>>,
    verb: ErrorVerb,
    e: impl std::fmt::Display,
) -> StorageError<NodeId> {
    let subject = match meta {
        Some(m) => ErrorSubject::Snapshot(Some(m.signature())),
        None => ErrorSubject::Snapshot(None),
    };
    StorageIOError::new(subject, verb, AnyError::error(e.to_string())).into()
}

mod overlay;
mod snapshot;
mod store;
mod tables;

use overlay::*;
use snapshot::*;
pub use snapshot::{max_record, read_record, read_snapshot, SnapshotRecord};
pub use store::{SnapshotBuilder, StateMachineStore};
pub use tables::SmTables;
use tables::*;

#[cfg(test)]
mod tests;
