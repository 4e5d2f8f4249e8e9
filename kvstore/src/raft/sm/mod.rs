//! The replicated state machine on disk: key-value pairs and recent events
//! in a redb file of their own (`state.redb`), snapshots as files streamed
//! from it. A replica's memory grows with the number of keys only by the
//! key filter's bits (invariant 8; ~10 bits per key).
//!
//! Invariants:
//! 1. Applied batches collect in an in-memory overlay (bounded by
//!    `FLUSH_BYTES`/`FLUSH_ENTRIES`, at most `FLUSH_INTERVAL` old at the end
//!    of a batch unless a flush is in flight, invariant 6) that reads
//!    consult first. A flush writes the overlay, the
//!    [`KvState`], the applied log id and the membership in one redb
//!    transaction: after a crash the file is at a batch boundary, and
//!    openraft re-applies the committed entries after its applied id from
//!    the log.
//! 2. Flushes commit without fsync (`Durability::None`); the first one
//!    after [`DURABLE_INTERVAL`] and the one before a snapshot is taken
//!    commit with fsync (which also lets redb reuse freed pages). Openraft
//!    purges the log only up to a snapshot, so what the log no longer holds
//!    is durable here; a crash costs at most the re-application of the
//!    entries since the last fsync.
//! 3. A snapshot is built from one read transaction, streamed to a file
//!    record by record (memory stays bounded by one record), fsynced and
//!    renamed into place; the current snapshot is always complete.
//! 4. A received snapshot is checked record by record (frame sizes against
//!    this replica's limits, the header against the announced meta, the
//!    trailer's counts); a bad one installs nothing. A good one replaces
//!    the tables in one transaction, committed under the state's lock.
//! 5. The history table holds the events of each flush as one record keyed
//!    by the last revision in it (one insert per flush, not one per
//!    revision), so a record with key `k` holds only revisions `<= k` and
//!    above the previous record's key. Reads from a revision start at the
//!    first key at or above it and filter by revision; forgetting below a
//!    revision drops the records whose key is below it. Files written with
//!    one record per revision are the special case of one revision a flush.
//!    Snapshots carry records under the same keys.
//! 6. A due flush runs on a thread of its own while batches keep applying
//!    into a new live overlay; at most one is in flight, so flushes commit
//!    in order. Reads consult the live overlay, then the one in flight,
//!    then the tables as they were before it (read transactions opened
//!    when the previous flush was adopted, so its writes are never seen
//!    twice). A batch waits for the flush in flight only when the live
//!    overlay is full, and a synchronous flush (before a snapshot) or an
//!    installed snapshot waits for it first.
//! 7. An entry is applied only once the log holds it on disk, when the
//!    log says how far that is ([`StateMachineStore::apply_when_synced`];
//!    storage invariant 7a): a leader's own entries may be committed in
//!    openraft's view before they are.
//! 8. Every key in the tables is in the [`KeyFilter`]: it is built from the
//!    tables on opening and after a snapshot replaced them, and every key
//!    written to the live overlay goes into it. A read below the overlays
//!    of a key the filter does not hold answers "absent" without a lookup.
//!    Removed keys stay in the filter; once it holds more than twice the
//!    keys of the tables (plus [`key_filter::MIN_CAPACITY`]), the next
//!    flush's thread builds a new one from the tables it committed, and
//!    adopting the flush adds the live overlay's keys to it.

// openraft's storage traits fix the error type (`StorageError`).
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
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
use tessel_kv::state::{Event, KeyValue, KvState, Limits, Output, Tables, TablesMut};
use tessel_kv::LocalState;
use tessel_kv::{KvError, Result};

type NodeId = u64;
type Node = openraft::BasicNode;
type StorageResult<T> = std::result::Result<T, StorageError<NodeId>>;

/// Key → [`StoredValue`].
const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("data");
/// Revision → its events (postcard `Vec<Event>`).
const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
/// [`STATE`], [`APPLIED`], [`MEMBERSHIP`].
const SM: TableDefinition<&str, &[u8]> = TableDefinition::new("sm");
const STATE: &str = "state";
const APPLIED: &str = "applied";
const MEMBERSHIP: &str = "membership";

/// Page cache of `state.redb`: the hot pages (new keys land together);
/// cold reads come from the OS page cache, which a replica's RSS does not
/// count.
const CACHE_BYTES: usize = 16 << 20;
/// The overlay is flushed once it holds this many bytes or entries, or is
/// this old (invariant 2).
const FLUSH_BYTES: usize = 8 << 20;
const FLUSH_ENTRIES: usize = 8 * 1024;
const FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);
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
const SNAPSHOT_VERSION: u32 = 1;

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
