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

/// A value as stored under its key (the key is not repeated).
#[derive(Serialize, Deserialize)]
struct StoredValue<'a> {
    #[serde(borrow, with = "serde_bytes")]
    value: &'a [u8],
    create_revision: u64,
    mod_revision: u64,
    lease: Option<u64>,
}

fn encode_value(kv: &KeyValue) -> Result<Vec<u8>> {
    postcard::to_allocvec(&StoredValue {
        value: &kv.value,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        lease: kv.lease,
    })
    .map_err(storage)
}

fn decode_value(key: &[u8], bytes: &[u8]) -> Result<KeyValue> {
    let v: StoredValue = postcard::from_bytes(bytes).map_err(storage)?;
    Ok(KeyValue {
        key: key.to_vec(),
        value: v.value.to_vec(),
        create_revision: v.create_revision,
        mod_revision: v.mod_revision,
        lease: v.lease,
    })
}

/// The smallest key greater than every key starting with `prefix`
/// (`None`: no bound).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// `def` as of the last commit.
fn open_read<K: redb::Key + 'static, V: redb::Value + 'static>(
    db: &Database,
    def: TableDefinition<K, V>,
) -> Result<redb::ReadOnlyTable<K, V>> {
    let txn = db.begin_read().map_err(storage)?;
    txn.open_table(def).map_err(storage)
}

fn get_in(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
) -> Result<Option<KeyValue>> {
    let got = table.get(key).map_err(storage)?;
    got.map(|v| decode_value(key, v.value())).transpose()
}

fn list_in(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    prefix: &[u8],
) -> Result<Vec<KeyValue>> {
    let end = prefix_end(prefix);
    let range = match &end {
        Some(end) => table.range::<&[u8]>(prefix..end.as_slice()),
        None => table.range::<&[u8]>(prefix..),
    }
    .map_err(storage)?;
    let mut out = Vec::new();
    for item in range {
        let (k, v) = item.map_err(storage)?;
        out.push(decode_value(k.value(), v.value())?);
    }
    Ok(out)
}

fn events_in(
    table: &impl ReadableTable<u64, &'static [u8]>,
    from: u64,
    prefix: &[u8],
) -> Result<Vec<Event>> {
    let mut out = Vec::new();
    for item in table.range(from..).map_err(storage)? {
        let (_, v) = item.map_err(storage)?;
        let events: Vec<Event> = postcard::from_bytes(v.value()).map_err(storage)?;
        // A record may begin below `from` (invariant 5).
        out.extend(
            events
                .into_iter()
                .filter(|e| e.revision() >= from && e.key().starts_with(prefix)),
        );
    }
    Ok(out)
}

/// Writes applied since a flush began (`None` in `data`: removed).
#[derive(Default)]
struct Overlay {
    data: BTreeMap<Vec<u8>, Option<KeyValue>>,
    history: BTreeMap<u64, Vec<Event>>,
    forget_below: Option<u64>,
}

impl Overlay {
    fn entries(&self) -> usize {
        self.data.len() + self.history.len()
    }
}

/// What a flush commits with the overlay (invariant 1).
struct FlushCommit {
    state: KvState,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
    durable: bool,
    /// Build a new key filter from the committed tables (invariant 8).
    rebuild_filter: bool,
}

/// What a flush reports: the key filter it built when asked (invariant 8).
type FlushResult = Result<Option<KeyFilter>>;

/// An overlay being written by the flush thread (invariant 6).
struct Flushing {
    overlay: Arc<Overlay>,
    durable: bool,
}

/// The thread that writes overlays, one per state machine for its life
/// (invariant 6), rather than a new thread (a clone, a fresh stack, a
/// fresh allocator heap) for each of up to ten flushes a second. With at
/// most one flush in flight, one result channel serves them all: the
/// result in it is the flush in flight's.
struct Flusher {
    jobs: Option<std::sync::mpsc::Sender<(Arc<Overlay>, FlushCommit)>>,
    results: std::sync::mpsc::Receiver<FlushResult>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Flusher {
    fn start(db: Arc<Database>) -> Result<Flusher> {
        let (jobs, queue) = std::sync::mpsc::channel::<(Arc<Overlay>, FlushCommit)>();
        let (done, results) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("state-flush".into())
            .spawn(move || {
                for (overlay, commit) in queue {
                    let _ = done.send(write_overlay(&db, &overlay, &commit));
                }
            })
            .map_err(storage)?;
        Ok(Flusher {
            jobs: Some(jobs),
            results,
            thread: Some(thread),
        })
    }

    /// Queues `overlay`; its result comes through `results`.
    fn flush(&self, overlay: Arc<Overlay>, commit: FlushCommit) -> Result<()> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send((overlay, commit)).ok())
            .ok_or_else(|| storage("the state flush thread is gone"))
    }
}

impl Drop for Flusher {
    /// Ends the thread once its queue is done: a flush in flight commits,
    /// and nothing holds the database open once the tables are gone (a
    /// replica reopened in the same process would find it locked).
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The tables of `state.redb` under overlays of the batches applied since
/// the last flush (invariant 1): reads see the live overlay first, then
/// the one being flushed, then the tables as of the last flush.
pub struct SmTables {
    db: Arc<Database>,
    live: Overlay,
    /// Key and value bytes in the live overlay.
    bytes: usize,
    flushing: Option<Flushing>,
    flusher: Flusher,
    last_flush: std::time::Instant,
    last_durable: std::time::Instant,
    /// The tables as of the last flush this replica adopted, opened once
    /// per flush rather than once per read, and never newer than the
    /// overlay being flushed (a read would see its writes twice).
    base: redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    base_history: redb::ReadOnlyTable<u64, &'static [u8]>,
    /// Every key in the tables and overlays (invariant 8).
    filter: KeyFilter,
}

/// A key filter of every key in `table` (invariant 8).
fn filter_of(table: &impl ReadableTable<&'static [u8], &'static [u8]>) -> Result<KeyFilter> {
    let started = std::time::Instant::now();
    let count = table.len().map_err(storage)? as usize;
    let keys = table
        .iter()
        .map_err(storage)?
        .map(|item| item.map(|(k, _)| k.value().to_vec()).map_err(storage));
    let filter = KeyFilter::from_keys(count, keys)?;
    metrics::histogram!("tessel_kv_state_filter_build_seconds")
        .record(started.elapsed().as_secs_f64());
    Ok(filter)
}

impl SmTables {
    fn new(db: Arc<Database>) -> Result<SmTables> {
        let base = open_read(&db, DATA)?;
        Ok(SmTables {
            filter: filter_of(&base)?,
            base,
            base_history: open_read(&db, HISTORY)?,
            flusher: Flusher::start(db.clone())?,
            db,
            live: Overlay::default(),
            bytes: 0,
            flushing: None,
            last_flush: std::time::Instant::now(),
            last_durable: std::time::Instant::now(),
        })
    }

    /// Whether the live overlay is due for a flush (large or old).
    fn flush_due(&self) -> bool {
        self.overlay_full() || self.last_flush.elapsed() >= FLUSH_INTERVAL
    }

    fn overlay_full(&self) -> bool {
        self.bytes >= FLUSH_BYTES || self.live.entries() >= FLUSH_ENTRIES
    }

    /// Whether the key filter holds far more keys than the tables, most of
    /// them removed since (invariant 8).
    fn filter_stale(&self) -> Result<bool> {
        let keys = self.base.len().map_err(storage)? as usize;
        Ok(self.filter.inserted() > 2 * keys + key_filter::MIN_CAPACITY)
    }

    /// Whether ending a batch now could wait for a flush to finish.
    fn may_wait(&self) -> bool {
        self.flushing.is_some() && self.overlay_full()
    }

    /// Ends an applied batch: adopts a finished flush, and starts one when
    /// the live overlay is due (invariant 2), with fsync when the last one
    /// is [`DURABLE_INTERVAL`] ago. Waits for the flush in flight only when
    /// the live overlay is full (invariant 6).
    fn end_batch(
        &mut self,
        state: &KvState,
        applied: Option<LogId<NodeId>>,
        membership: &StoredMembership<NodeId, Node>,
    ) -> Result<()> {
        self.adopt_flush(false)?;
        if !self.flush_due() || (self.flushing.is_some() && !self.overlay_full()) {
            return Ok(());
        }
        self.adopt_flush(true)?;
        let durable = self.last_durable.elapsed() >= DURABLE_INTERVAL;
        let (overlay, commit) = self.freeze(state, applied, membership, durable)?;
        let overlay = Arc::new(overlay);
        self.flusher.flush(overlay.clone(), commit)?;
        self.flushing = Some(Flushing { overlay, durable });
        Ok(())
    }

    /// Writes the live overlay, the state and Raft's bookkeeping in one
    /// transaction (invariant 1) before returning, with fsync when
    /// `durable` (invariant 2); a flush in flight finishes first.
    fn flush(
        &mut self,
        state: &KvState,
        applied: Option<LogId<NodeId>>,
        membership: &StoredMembership<NodeId, Node>,
        durable: bool,
    ) -> Result<()> {
        self.adopt_flush(true)?;
        let (overlay, commit) = self.freeze(state, applied, membership, durable)?;
        let rebuilt = write_overlay(&self.db, &overlay, &commit)?;
        self.reopen_base(durable)?;
        self.adopt_filter(rebuilt);
        Ok(())
    }

    /// Takes a filter a flush rebuilt from the tables it committed, with
    /// the keys written to the live overlay since (invariant 8).
    fn adopt_filter(&mut self, rebuilt: Option<KeyFilter>) {
        let Some(mut filter) = rebuilt else { return };
        for (k, v) in &self.live.data {
            if v.is_some() {
                filter.insert(k);
            }
        }
        self.filter = filter;
    }

    /// Takes the live overlay to be written, with what commits with it.
    fn freeze(
        &mut self,
        state: &KvState,
        applied: Option<LogId<NodeId>>,
        membership: &StoredMembership<NodeId, Node>,
        durable: bool,
    ) -> Result<(Overlay, FlushCommit)> {
        let commit = FlushCommit {
            state: state.clone(),
            applied,
            membership: membership.clone(),
            durable,
            rebuild_filter: self.filter_stale()?,
        };
        Ok((self.take_live(), commit))
    }

    /// Empties the live overlay and restarts its size and age.
    fn take_live(&mut self) -> Overlay {
        self.bytes = 0;
        self.last_flush = std::time::Instant::now();
        std::mem::take(&mut self.live)
    }

    /// Adopts the flush in flight once its thread is done (or, with
    /// `wait`, after waiting for it): the tables then hold its overlay.
    fn adopt_flush(&mut self, wait: bool) -> Result<()> {
        use std::sync::mpsc::TryRecvError;
        let results = &self.flusher.results;
        let result = match &self.flushing {
            None => return Ok(()),
            Some(_) if wait => results.recv().ok(),
            Some(_) => match results.try_recv() {
                Ok(r) => Some(r),
                Err(TryRecvError::Empty) => return Ok(()),
                Err(TryRecvError::Disconnected) => None,
            },
        };
        let f = self.flushing.take().expect("matched above");
        let rebuilt =
            result.ok_or_else(|| storage("the state flush thread panicked or is gone"))??;
        self.reopen_base(f.durable)?;
        self.adopt_filter(rebuilt);
        Ok(())
    }

    fn reopen_base(&mut self, durable: bool) -> Result<()> {
        self.base = open_read(&self.db, DATA)?;
        self.base_history = open_read(&self.db, HISTORY)?;
        if durable {
            self.last_durable = self.last_flush;
        }
        Ok(())
    }

    /// Forgets the overlays when a snapshot replaced the tables (the
    /// caller finished any flush first, see `adopt_flush`).
    fn discard(&mut self) -> Result<()> {
        debug_assert!(self.flushing.is_none());
        self.take_live();
        self.reopen_base(false)?;
        self.filter = filter_of(&self.base)?;
        Ok(())
    }

    /// The overlays, oldest first (the one in flight, then the live one):
    /// a later write to a key wins.
    fn overlays(&self) -> impl Iterator<Item = &Overlay> {
        let flushing = self.flushing.as_ref().map(|f| &*f.overlay);
        flushing.into_iter().chain(std::iter::once(&self.live))
    }

    /// The value at `key` below the live overlay.
    fn get_below_live(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        match self.flushing.as_ref().and_then(|f| f.overlay.data.get(key)) {
            Some(written) => Ok(written.clone()),
            // Invariant 8: not in the filter, so not in the tables.
            None if !self.filter.may_contain(key) => Ok(None),
            None => get_in(&self.base, key),
        }
    }
}

/// Writes `o` and `c` to `db` in one transaction (invariants 1, 5); then,
/// when asked, builds a key filter of the committed tables (invariant 8).
fn write_overlay(db: &Database, o: &Overlay, c: &FlushCommit) -> Result<Option<KeyFilter>> {
    let started = std::time::Instant::now();
    let result = write_overlay_once(db, o, c);
    let kind = if c.durable { "durable" } else { "buffered" };
    metrics::histogram!("tessel_kv_state_flush_seconds", "kind" => kind)
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("tessel_kv_state_flushed_keys_total").increment(o.data.len() as u64);
    result?;
    if !c.rebuild_filter {
        return Ok(None);
    }
    filter_of(&open_read(db, DATA)?).map(Some)
}

fn write_overlay_once(db: &Database, o: &Overlay, c: &FlushCommit) -> Result<()> {
    let txn = db.begin_write().map_err(storage)?;
    {
        let mut data = txn.open_table(DATA).map_err(storage)?;
        for (k, v) in &o.data {
            match v {
                Some(kv) => {
                    let bytes = encode_value(kv)?;
                    data.insert(k.as_slice(), bytes.as_slice())
                        .map_err(storage)?;
                }
                None => {
                    data.remove(k.as_slice()).map_err(storage)?;
                }
            }
        }
        // Invariant 5: the overlay's events go in as one record, keyed by
        // the last revision among them.
        let mut history = txn.open_table(HISTORY).map_err(storage)?;
        let kept = o.forget_below.unwrap_or(0);
        if let Some((&last, _)) = o.history.range(kept..).next_back() {
            let events: Vec<&Event> = o.history.range(kept..).flat_map(|(_, e)| e).collect();
            let bytes = postcard::to_allocvec(&events).map_err(storage)?;
            history.insert(last, bytes.as_slice()).map_err(storage)?;
        }
        if let Some(below) = o.forget_below {
            history.retain_in(..below, |_, _| false).map_err(storage)?;
        }
    }
    commit_with_state(txn, &c.state, c.applied, &c.membership, c.durable)
}

impl Tables for SmTables {
    fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        match self.live.data.get(key) {
            Some(written) => Ok(written.clone()),
            None => self.get_below_live(key),
        }
    }

    fn list(&self, prefix: &[u8]) -> Result<Vec<KeyValue>> {
        let mut all: BTreeMap<Vec<u8>, KeyValue> = list_in(&self.base, prefix)?
            .into_iter()
            .map(|kv| (kv.key.clone(), kv))
            .collect();
        for o in self.overlays() {
            for (k, v) in o
                .data
                .range(prefix.to_vec()..)
                .take_while(|(k, _)| k.starts_with(prefix))
            {
                match v {
                    Some(kv) => all.insert(k.clone(), kv.clone()),
                    None => all.remove(k),
                };
            }
        }
        Ok(all.into_values().collect())
    }

    fn count(&self) -> Result<u64> {
        let base = &self.base;
        let mut n = base.len().map_err(storage)?;
        let mut count = |existed: bool, exists: bool| match (existed, exists) {
            (false, true) => n += 1,
            (true, false) => n -= 1,
            _ => {}
        };
        if let Some(f) = &self.flushing {
            for (k, v) in &f.overlay.data {
                count(get_in(base, k)?.is_some(), v.is_some());
            }
        }
        for (k, v) in &self.live.data {
            count(self.get_below_live(k)?.is_some(), v.is_some());
        }
        Ok(n)
    }

    fn events(&self, from: u64, prefix: &[u8]) -> Result<Vec<Event>> {
        let from = self
            .overlays()
            .filter_map(|o| o.forget_below)
            .fold(from, u64::max);
        let mut out = events_in(&self.base_history, from, prefix)?;
        for o in self.overlays() {
            for events in o.history.range(from..).map(|(_, e)| e) {
                out.extend(
                    events
                        .iter()
                        .filter(|e| e.key().starts_with(prefix))
                        .cloned(),
                );
            }
        }
        Ok(out)
    }
}

impl TablesMut for SmTables {
    fn insert(&mut self, kv: &KeyValue) -> Result<()> {
        self.bytes += kv.key.len() + kv.value.len();
        self.filter.insert(&kv.key);
        self.live.data.insert(kv.key.clone(), Some(kv.clone()));
        Ok(())
    }

    fn remove(&mut self, key: &[u8]) -> Result<bool> {
        let existed = self.get(key)?.is_some();
        self.bytes += key.len();
        self.live.data.insert(key.to_vec(), None);
        Ok(existed)
    }

    fn record(&mut self, revision: u64, events: &[Event]) -> Result<()> {
        self.bytes += events.iter().map(Event::payload_bytes).sum::<usize>();
        self.live
            .history
            .entry(revision)
            .or_default()
            .extend(events.iter().cloned());
        Ok(())
    }

    /// Only records the bound: reads skip what is below it, and the flush
    /// drops it from the table and never writes it from the overlay.
    fn forget_below(&mut self, revision: u64) -> Result<()> {
        let bound = self.overlays().filter_map(|o| o.forget_below).max();
        self.live.forget_below = Some(bound.unwrap_or(0).max(revision));
        Ok(())
    }
}

/// Records the state and Raft's bookkeeping in `txn` and commits it.
fn commit_with_state(
    mut txn: WriteTransaction,
    state: &KvState,
    applied: Option<LogId<NodeId>>,
    membership: &StoredMembership<NodeId, Node>,
    durable: bool,
) -> Result<()> {
    {
        let mut sm = txn.open_table(SM).map_err(storage)?;
        let state = postcard::to_allocvec(state).map_err(storage)?;
        sm.insert(STATE, state.as_slice()).map_err(storage)?;
        let applied = postcard::to_allocvec(&applied).map_err(storage)?;
        sm.insert(APPLIED, applied.as_slice()).map_err(storage)?;
        let membership = postcard::to_allocvec(membership).map_err(storage)?;
        sm.insert(MEMBERSHIP, membership.as_slice())
            .map_err(storage)?;
    }
    txn.set_durability(if durable {
        Durability::Immediate
    } else {
        Durability::None
    });
    txn.commit().map_err(storage)
}

fn read_sm<T: for<'de> Deserialize<'de>>(
    txn: &ReadTransaction,
    key: &str,
) -> StorageResult<Option<T>> {
    let table = txn.open_table(SM).map_err(|e| sm_err(ErrorVerb::Read, e))?;
    let got = table.get(key).map_err(|e| sm_err(ErrorVerb::Read, e))?;
    got.map(|v| postcard::from_bytes(v.value()))
        .transpose()
        .map_err(|e| sm_err(ErrorVerb::Read, e))
}

/// The replicated state machine: a [`LocalState`] over `state.redb` plus
/// what Raft needs.
pub struct StateMachineStore {
    db: Arc<Database>,
    dir: PathBuf,
    local: Arc<LocalState<SmTables>>,
    limits: Limits,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
    snapshots_built: u64,
    /// How far the log is on disk, where a log says (invariant 7).
    log_synced: Option<LogSynced>,
}

/// The current snapshot; written as `snapshot.tmp` first (invariant 3).
fn snapshot_path(dir: &Path) -> PathBuf {
    dir.join("snapshot")
}

fn received_path(dir: &Path) -> PathBuf {
    dir.join("snapshot.recv")
}

impl StateMachineStore {
    /// Opens (or creates) `dir/state.redb`; `initial` is the state of an
    /// empty replica (its limits bound received snapshots).
    pub fn open(dir: &Path, initial: KvState) -> StorageResult<StateMachineStore> {
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(dir.join("state.redb"))
            .map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let txn = db.begin_write().map_err(|e| sm_err(ErrorVerb::Write, e))?;
        txn.open_table(DATA)
            .map_err(|e| sm_err(ErrorVerb::Write, e))?;
        txn.open_table(SM)
            .map_err(|e| sm_err(ErrorVerb::Write, e))?;
        txn.open_table(HISTORY)
            .map_err(|e| sm_err(ErrorVerb::Write, e))?;
        txn.commit().map_err(|e| sm_err(ErrorVerb::Write, e))?;
        let txn = db.begin_read().map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let limits = initial.limits();
        let state = read_sm::<KvState>(&txn, STATE)?.unwrap_or(initial);
        let applied = read_sm::<Option<LogId<NodeId>>>(&txn, APPLIED)?.flatten();
        let membership = read_sm(&txn, MEMBERSHIP)?.unwrap_or_default();
        drop(txn);
        let db = Arc::new(db);
        Ok(StateMachineStore {
            local: Arc::new(LocalState::new(
                state,
                SmTables::new(db.clone()).map_err(|e| sm_err(ErrorVerb::Read, e))?,
            )),
            db,
            dir: dir.to_path_buf(),
            limits,
            applied,
            membership,
            snapshots_built: 0,
            log_synced: None,
        })
    }

    /// Applies entries only once `log` has them on disk (invariant 7).
    pub fn apply_when_synced(&mut self, log: LogSynced) {
        self.log_synced = Some(log);
    }

    /// Undoes [`Self::apply_when_synced`], for tests that apply entries
    /// they never appended to a log.
    #[cfg(test)]
    pub(crate) fn apply_without_waiting_for_the_log(&mut self) {
        self.log_synced = None;
    }

    /// The applied state, for reads and waits.
    pub fn local(&self) -> Arc<LocalState<SmTables>> {
        self.local.clone()
    }
}

/// Runs blocking disk work: through `block_in_place` on a multi-threaded
/// runtime, so that the worker's other tasks move on meanwhile; directly
/// elsewhere (a current-thread runtime cannot hand its tasks over).
fn outside_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A snapshot file: framed records (u32 little-endian length, postcard).
/// The first is a [`SnapshotRecord::Header`], the last an `End`.
#[derive(Serialize, Deserialize)]
pub enum SnapshotRecord {
    Header {
        version: u32,
        meta: SnapshotMeta<NodeId, Node>,
        state: KvState,
    },
    Pair(KeyValue),
    /// Some of the events of the history record keyed `revision`, the last
    /// revision among them (invariant 5); large records span several.
    Events {
        revision: u64,
        events: Vec<Event>,
    },
    End {
        pairs: u64,
        event_records: u64,
    },
}

fn write_record(out: &mut impl Write, r: &SnapshotRecord) -> Result<()> {
    write_frame(out, &postcard::to_allocvec(r).map_err(storage)?)
}

fn write_frame(out: &mut impl Write, bytes: &[u8]) -> Result<()> {
    out.write_all(&(bytes.len() as u32).to_le_bytes())
        .map_err(storage)?;
    out.write_all(bytes).map_err(storage)
}

/// Reads one record of at most `max` bytes; `Ok(None)` at a clean end of
/// file.
pub fn read_record(input: &mut impl Read, max: usize) -> Result<Option<SnapshotRecord>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(storage(e)),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(KvError::InvalidArgument(format!(
            "snapshot record of {len} bytes exceeds the {max}-byte limit"
        )));
    }
    let mut buf = vec![0u8; len];
    input.read_exact(&mut buf).map_err(|e| {
        KvError::InvalidArgument(format!("snapshot truncated inside a record: {e}"))
    })?;
    postcard::from_bytes(&buf)
        .map(Some)
        .map_err(|e| KvError::InvalidArgument(format!("malformed snapshot record: {e}")))
}

/// The largest record a replica with `limits` accepts after the header.
pub fn max_record(limits: Limits) -> usize {
    limits.max_key + limits.max_value + EVENTS_PER_RECORD_BYTES + 4096
}

/// Streams the tables of `txn` and `header` into `path` (invariant 3).
fn write_snapshot(path: &Path, txn: &ReadTransaction, header: &SnapshotRecord) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp).map_err(storage)?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let head = postcard::to_allocvec(header).map_err(storage)?;
    if head.len() > MAX_SNAPSHOT_HEADER {
        return Err(KvError::Storage(format!(
            "leases and barriers take {} bytes, over the {MAX_SNAPSHOT_HEADER}-byte snapshot header limit",
            head.len()
        )));
    }
    write_frame(&mut out, &head)?;
    let mut pairs = 0u64;
    let data = txn.open_table(DATA).map_err(storage)?;
    for item in data.iter().map_err(storage)? {
        let (k, v) = item.map_err(storage)?;
        write_record(
            &mut out,
            &SnapshotRecord::Pair(decode_value(k.value(), v.value())?),
        )?;
        pairs += 1;
    }
    let mut event_records = 0u64;
    let history = txn.open_table(HISTORY).map_err(storage)?;
    for item in history.iter().map_err(storage)? {
        let (revision, v) = item.map_err(storage)?;
        let revision = revision.value();
        let mut events: Vec<Event> = postcard::from_bytes(v.value()).map_err(storage)?;
        // Records of about EVENTS_PER_RECORD_BYTES: split off the events
        // after the first that reaches it, until none are left.
        while !events.is_empty() {
            let mut bytes = 0;
            let take = events
                .iter()
                .position(|e| {
                    bytes += 32 + e.payload_bytes();
                    bytes >= EVENTS_PER_RECORD_BYTES
                })
                .map_or(events.len(), |i| i + 1);
            let rest = events.split_off(take);
            write_record(&mut out, &SnapshotRecord::Events { revision, events })?;
            event_records += 1;
            events = rest;
        }
    }
    write_record(
        &mut out,
        &SnapshotRecord::End {
            pairs,
            event_records,
        },
    )?;
    let file = out.into_inner().map_err(|e| storage(e.error()))?;
    file.sync_all().map_err(storage)?;
    std::fs::rename(&tmp, path).map_err(storage)?;
    sync_dir(path)
}

fn sync_dir(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(storage)?;
    }
    Ok(())
}

/// Reads a snapshot's header; checks its version and, when given, that it
/// is the snapshot the leader announced.
fn read_snapshot_header(
    input: &mut impl Read,
    expected: Option<&SnapshotMeta<NodeId, Node>>,
) -> Result<(SnapshotMeta<NodeId, Node>, KvState)> {
    match read_record(input, MAX_SNAPSHOT_HEADER)? {
        Some(SnapshotRecord::Header {
            version,
            meta,
            state,
        }) => {
            if version != SNAPSHOT_VERSION {
                return Err(KvError::InvalidArgument(format!(
                    "snapshot format {version}, this replica reads {SNAPSHOT_VERSION}"
                )));
            }
            if let Some(expected) = expected {
                if meta.last_log_id != expected.last_log_id
                    || meta.snapshot_id != expected.snapshot_id
                {
                    return Err(KvError::InvalidArgument(format!(
                        "snapshot header says {:?}, the leader announced {:?}",
                        meta.signature(),
                        expected.signature()
                    )));
                }
            }
            Ok((meta, state))
        }
        _ => Err(KvError::InvalidArgument(
            "a snapshot must start with its header".into(),
        )),
    }
}

/// Reads a whole snapshot (invariant 4): the header (checked against
/// `expected` when given), then every record within `limits`, each pair
/// and event record handed to `each`, up to a trailer whose counts match.
pub fn read_snapshot(
    input: &mut impl Read,
    limits: Limits,
    expected: Option<&SnapshotMeta<NodeId, Node>>,
    mut each: impl FnMut(SnapshotRecord) -> Result<()>,
) -> Result<(SnapshotMeta<NodeId, Node>, KvState)> {
    let header = read_snapshot_header(input, expected)?;
    let (mut pairs, mut event_records) = (0u64, 0u64);
    let max = max_record(limits);
    loop {
        match read_record(input, max)? {
            Some(SnapshotRecord::Pair(kv)) => {
                limits.check_key(&kv.key)?;
                limits.check_value(&kv.value)?;
                pairs += 1;
                each(SnapshotRecord::Pair(kv))?;
            }
            Some(r @ SnapshotRecord::Events { .. }) => {
                event_records += 1;
                each(r)?;
            }
            Some(SnapshotRecord::End {
                pairs: p,
                event_records: e,
            }) => {
                if (p, e) != (pairs, event_records) {
                    return Err(KvError::InvalidArgument(format!(
                        "snapshot trailer counts {p} pairs and {e} event records, the file held {pairs} and {event_records}"
                    )));
                }
                return Ok(header);
            }
            Some(SnapshotRecord::Header { .. }) => {
                return Err(KvError::InvalidArgument("a second snapshot header".into()))
            }
            None => {
                return Err(KvError::InvalidArgument(
                    "snapshot ends without its trailer".into(),
                ))
            }
        }
    }
}

/// Reads the header of the snapshot at `path`.
fn read_header(path: &Path) -> Result<(SnapshotMeta<NodeId, Node>, KvState)> {
    let file = std::fs::File::open(path).map_err(storage)?;
    read_snapshot_header(&mut BufReader::new(file), None)
}

/// Loads the snapshot in `file` into a new write transaction replacing the
/// tables, checked against `expected` (invariant 4), and copies it to
/// `copy_to`. Uncommitted.
fn load_snapshot(
    db: &Database,
    file: std::fs::File,
    copy_to: &Path,
    expected: &SnapshotMeta<NodeId, Node>,
    limits: Limits,
) -> Result<(WriteTransaction, KvState)> {
    let copy = BufWriter::with_capacity(1 << 20, std::fs::File::create(copy_to).map_err(storage)?);
    let mut input = Tee {
        input: BufReader::with_capacity(1 << 20, file),
        copy,
    };
    let txn = db.begin_write().map_err(storage)?;
    txn.delete_table(DATA).map_err(storage)?;
    txn.delete_table(HISTORY).map_err(storage)?;
    let (_, state) = {
        let mut data = txn.open_table(DATA).map_err(storage)?;
        let mut history = txn.open_table(HISTORY).map_err(storage)?;
        read_snapshot(&mut input, limits, Some(expected), |record| {
            match record {
                SnapshotRecord::Pair(kv) => {
                    let bytes = encode_value(&kv)?;
                    data.insert(kv.key.as_slice(), bytes.as_slice())
                        .map_err(storage)?;
                }
                SnapshotRecord::Events {
                    revision,
                    mut events,
                } => {
                    if let Some(before) = history.get(revision).map_err(storage)? {
                        let mut all: Vec<Event> =
                            postcard::from_bytes(before.value()).map_err(storage)?;
                        all.append(&mut events);
                        events = all;
                    }
                    let bytes = postcard::to_allocvec(&events).map_err(storage)?;
                    history
                        .insert(revision, bytes.as_slice())
                        .map_err(storage)?;
                }
                SnapshotRecord::Header { .. } | SnapshotRecord::End { .. } => {}
            }
            Ok(())
        })?
    };
    let copy = input.copy.into_inner().map_err(|e| storage(e.error()))?;
    copy.sync_all().map_err(storage)?;
    Ok((txn, state))
}

/// Reads `input` and writes what it read to `copy`.
struct Tee<R, W> {
    input: R,
    copy: W,
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.input.read(buf)?;
        self.copy.write_all(&buf[..n])?;
        Ok(n)
    }
}

/// Builds a snapshot from one read transaction taken when it was asked for
/// (the state machine keeps applying meanwhile).
pub struct SnapshotBuilder {
    dir: PathBuf,
    txn: Option<ReadTransaction>,
    state: KvState,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
    id: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let snapshot_id = match self.applied {
            Some(id) => format!("{}-{}-{}", id.leader_id, id.index, self.id),
            None => format!("empty-{}", self.id),
        };
        let meta = SnapshotMeta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        };
        let header = SnapshotRecord::Header {
            version: SNAPSHOT_VERSION,
            meta: meta.clone(),
            state: self.state.clone(),
        };
        let txn = self
            .txn
            .take()
            .ok_or_else(|| snap_err(Some(&meta), ErrorVerb::Write, "built twice"))?;
        let path = snapshot_path(&self.dir);
        let written = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || write_snapshot(&path, &txn, &header)).await
        };
        written
            .map_err(|e| snap_err(Some(&meta), ErrorVerb::Write, e))?
            .map_err(|e| snap_err(Some(&meta), ErrorVerb::Write, e))?;
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| snap_err(Some(&meta), ErrorVerb::Read, e))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, Node>)> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        if let (Some(log), Some(last)) = (&mut self.log_synced, entries.last()) {
            log.wait_through(last.log_id.index).await?;
        }
        let mut applied = self.applied;
        let mut membership = self.membership.clone();
        for e in &entries {
            applied = Some(e.log_id);
            if let EntryPayload::Membership(m) = &e.payload {
                membership = StoredMembership::new(Some(e.log_id), m.clone());
            }
        }
        let requests = entries.iter().flat_map(|e| match &e.payload {
            EntryPayload::Normal(p) => p.0.as_slice(),
            _ => &[],
        });
        let apply = || {
            self.local.apply_batch(requests, |state, tables| {
                tables.end_batch(state, applied, &membership)
            })
        };
        // Waiting for a flush in flight (a full overlay): let the runtime
        // move this worker's other tasks elsewhere meanwhile.
        let results = if self.local.read(|_, t| t.may_wait()) {
            outside_the_runtime(apply)
        } else {
            apply()
        }
        .map_err(|e| sm_err(ErrorVerb::Write, e))?;
        self.applied = applied;
        self.membership = membership;
        let mut results = results.into_iter();
        Ok(entries
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(p) => Response(results.by_ref().take(p.0.len()).collect()),
                _ => Response(vec![Ok(Output::Ticked)]),
            })
            .collect())
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        self.snapshots_built += 1;
        // Invariant 2: durable before the log can be purged up to here. A
        // failure here leaves the builder without a transaction; building
        // then fails and openraft reports it.
        let (applied, membership) = (self.applied, self.membership.clone());
        let txn = self
            .local
            .update(|state, tables| tables.flush(state, applied, &membership, true))
            .ok()
            .and_then(|()| self.db.begin_read().ok());
        SnapshotBuilder {
            dir: self.dir.clone(),
            txn,
            state: self.local.state(),
            applied: self.applied,
            membership: self.membership.clone(),
            id: self.snapshots_built,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<tokio::fs::File>> {
        // Read back by `install_snapshot`: readable as well as writable.
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(received_path(&self.dir))
            .await
            .map_err(|e| snap_err(None, ErrorVerb::Write, e))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<tokio::fs::File>,
    ) -> StorageResult<()> {
        let bad = |e: KvError| snap_err(Some(meta), ErrorVerb::Write, e);
        let io = |e: std::io::Error| snap_err(Some(meta), ErrorVerb::Write, e);
        let mut snapshot = *snapshot;
        snapshot.flush().await.map_err(io)?;
        snapshot.rewind().await.map_err(io)?;
        let file = snapshot.into_std().await;
        // A flush still in flight would commit its overlay over the
        // snapshot's tables.
        outside_the_runtime(|| self.local.update(|_, tables| tables.adopt_flush(true)))
            .map_err(bad)?;
        let copy = snapshot_path(&self.dir).with_extension("tmp");
        let loaded = {
            let (db, copy, meta, limits) =
                (self.db.clone(), copy.clone(), meta.clone(), self.limits);
            tokio::task::spawn_blocking(move || load_snapshot(&db, file, &copy, &meta, limits))
                .await
        };
        let (txn, state) = loaded
            .map_err(|e| snap_err(Some(meta), ErrorVerb::Write, e))?
            .map_err(bad)?;
        let (applied, membership) = (meta.last_log_id, meta.last_membership.clone());
        self.local
            .update(|s, tables| {
                commit_with_state(txn, &state, applied, &membership, true)?;
                tables.discard()?;
                *s = state;
                Ok(())
            })
            .map_err(bad)?;
        self.applied = applied;
        self.membership = membership;
        let current = snapshot_path(&self.dir);
        let _ = std::fs::remove_file(received_path(&self.dir));
        std::fs::rename(&copy, &current)
            .map_err(storage)
            .and_then(|()| sync_dir(&current))
            .map_err(bad)
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let path = snapshot_path(&self.dir);
        if !path.exists() {
            return Ok(None);
        }
        let (meta, _) = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || read_header(&path))
                .await
                .map_err(|e| snap_err(None, ErrorVerb::Read, e))?
                .map_err(|e| snap_err(None, ErrorVerb::Read, e))?
        };
        let file = tokio::fs::File::open(&path)
            .await
            .map_err(|e| snap_err(Some(&meta), ErrorVerb::Read, e))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_kv::state::{MemState, Op, Request};

    /// Every kind of write, with leases expiring, prefixes deleted inside a
    /// batch, counters and barriers.
    fn requests() -> Vec<Request> {
        (0..400u64)
            .map(|i| {
                let key = format!("k/{}", i % 23).into_bytes();
                let op = match i % 10 {
                    0 => Op::LeaseGrant { ttl_ms: 40 },
                    1 => Op::Put {
                        key,
                        value: i.to_le_bytes().to_vec(),
                        lease: Some(i / 10 + 1),
                    },
                    2 => Op::Insert {
                        key,
                        value: vec![1; (i % 7) as usize],
                        lease: None,
                    },
                    3 => Op::Increment {
                        key: b"n".to_vec(),
                        delta: i as i64,
                    },
                    4 => Op::DeletePrefix {
                        prefix: format!("k/{}", i % 3).into_bytes(),
                    },
                    5 => Op::Delete { key },
                    6 => Op::CompareAndSwap {
                        key,
                        expected: None,
                        value: b"cas".to_vec(),
                    },
                    7 => Op::BarrierArrive {
                        id: format!("b{}", i % 4).into_bytes(),
                        participant: format!("p{i}").into_bytes(),
                        participants: 3,
                        timeout_ms: 30,
                    },
                    8 => Op::Put {
                        key: format!("k/{}", (i + 5) % 23).into_bytes(),
                        value: b"plain".to_vec(),
                        lease: None,
                    },
                    _ => Op::Tick,
                };
                Request { now_ms: i * 3, op }
            })
            .collect()
    }

    /// The same state, pairs and retained events.
    fn assert_same(local: &LocalState<SmTables>, mem: &MemState) {
        assert_eq!(local.state(), mem.state);
        assert_eq!(local.read(|_, t| t.list(b"")).unwrap(), mem.list(b""));
        assert_eq!(local.read(|_, t| t.count()).unwrap(), mem.len() as u64);
        // From every retained revision: a flushed record may begin below
        // the revision asked for (invariant 5).
        for from in mem.state.compacted_below()..=mem.state.revision() + 1 {
            assert_eq!(
                local.read(|s, t| s.events_since(t, from, b"")).unwrap(),
                mem.events_since(from, b"").unwrap(),
                "events from revision {from}"
            );
        }
    }

    #[tokio::test]
    async fn redb_tables_agree_with_memory_tables_batch_by_batch() {
        let dir = tempfile::tempdir().unwrap();
        let initial = KvState::new(Limits::default(), 50);
        let sm = StateMachineStore::open(dir.path(), initial).unwrap();
        let local = sm.local();
        let mut mem = MemState::new(Limits::default(), 50);
        let reqs = requests();
        let mut rest = reqs.as_slice();
        let mut size = 1;
        while !rest.is_empty() {
            let (batch, tail) = rest.split_at(size.min(rest.len()));
            let got = local
                .apply_batch(batch, |state, t| {
                    // Some batches stay in the overlay, some are flushed
                    // (with or without fsync, at once or on the flush
                    // thread, invariant 6): reads merge them all.
                    let none = StoredMembership::default();
                    match size % 4 {
                        0 => Ok(()),
                        1 => t.flush(state, None, &none, false),
                        2 => t.flush(state, None, &none, true),
                        _ => {
                            t.last_flush -= FLUSH_INTERVAL;
                            t.end_batch(state, None, &none)
                        }
                    }
                })
                .unwrap();
            let want: Vec<_> = batch.iter().map(|r| mem.apply(r).0).collect();
            assert_eq!(got, want);
            assert_same(&local, &mem);
            rest = tail;
            size = size % 9 + 1;
        }
        assert!(mem.len() > 3 && mem.state.compacted_below() > 1);
    }

    #[tokio::test]
    async fn a_snapshot_installs_the_same_state_and_survives_reopening() {
        use tokio::io::AsyncReadExt;
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let initial = || KvState::new(Limits::default(), 50);
        let mut leader = StateMachineStore::open(a.path(), initial()).unwrap();
        let mut mem = MemState::new(Limits::default(), 50);
        for r in requests() {
            leader
                .local()
                .apply_batch([&r], |state, t| {
                    t.end_batch(state, None, &StoredMembership::default())
                })
                .unwrap();
            let _ = mem.apply(&r);
        }
        let mut snap = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let mut bytes = Vec::new();
        snap.snapshot.read_to_end(&mut bytes).await.unwrap();
        {
            let mut follower = StateMachineStore::open(b.path(), initial()).unwrap();
            // A corrupt copy installs nothing.
            let mut bad = follower.begin_receiving_snapshot().await.unwrap();
            bad.write_all(&bytes[..bytes.len() - 3]).await.unwrap();
            assert!(follower.install_snapshot(&snap.meta, bad).await.is_err());
            assert_eq!(follower.local().read(|_, t| t.count()).unwrap(), 0);
            let mut good = follower.begin_receiving_snapshot().await.unwrap();
            good.write_all(&bytes).await.unwrap();
            follower.install_snapshot(&snap.meta, good).await.unwrap();
            assert_same(&follower.local(), &mem);
            let current = follower.get_current_snapshot().await.unwrap().unwrap();
            assert_eq!(current.meta, snap.meta);
        }
        let reopened = StateMachineStore::open(b.path(), initial()).unwrap();
        assert_same(&reopened.local(), &mem);
    }

    #[tokio::test]
    async fn the_key_filter_holds_every_key_and_is_rebuilt_after_churn() {
        let dir = tempfile::tempdir().unwrap();
        let sm = StateMachineStore::open(dir.path(), KvState::new(Limits::default(), 50)).unwrap();
        let local = sm.local();
        let put = |key: String| Request {
            now_ms: 0,
            op: Op::Put {
                key: key.into_bytes(),
                value: b"v".to_vec(),
                lease: None,
            },
        };
        let flush_now = |state: &KvState, t: &mut SmTables| {
            t.last_flush -= FLUSH_INTERVAL;
            t.end_batch(state, None, &StoredMembership::default())
        };
        let kept: Vec<_> = (0..500).map(|i| put(format!("kept/{i}"))).collect();
        local.apply_batch(&kept, flush_now).unwrap();
        // Rounds of keys written and removed again, flushed on the flush
        // thread: the filter keeps the removed keys until it is rebuilt.
        let mut largest = 0;
        for round in 0..90 {
            let mut batch: Vec<Request> = (0..1000)
                .map(|i| put(format!("churn/{round}/{i}")))
                .collect();
            batch.push(Request {
                now_ms: 0,
                op: Op::DeletePrefix {
                    prefix: format!("churn/{round}/").into_bytes(),
                },
            });
            // Kept, and in the live overlay when the flush of the round
            // before, which may have rebuilt the filter, is adopted.
            batch.push(put(format!("late/{round}")));
            local.apply_batch(&batch, flush_now).unwrap();
            largest = largest.max(local.read(|_, t| t.filter.inserted()));
        }
        let (inserted, count) = local.read(|_, t| (t.filter.inserted(), t.count().unwrap()));
        assert_eq!(count, 500 + 90);
        assert!(largest > 2 * 500 + key_filter::MIN_CAPACITY, "{largest}");
        assert!(
            inserted < largest / 2,
            "not rebuilt: {inserted} of {largest}"
        );
        // No key the tables hold is missing from the rebuilt filter, and
        // reads still find every kept key and none of the removed ones.
        local.read(|_, t| {
            for i in 0..500 {
                let key = format!("kept/{i}");
                assert!(t.filter.may_contain(key.as_bytes()));
                assert!(t.get(key.as_bytes()).unwrap().is_some(), "{key}");
            }
            for round in 0..90 {
                let key = format!("late/{round}");
                assert!(t.get(key.as_bytes()).unwrap().is_some(), "{key}");
            }
            assert!(t.get(b"churn/3/7").unwrap().is_none());
        });
        // And after reopening, from the file alone.
        drop((local, sm));
        let sm = StateMachineStore::open(dir.path(), KvState::new(Limits::default(), 50)).unwrap();
        let reopened = sm.local().read(|_, t| t.filter.inserted());
        assert_eq!(reopened, 500 + 90);
    }

    #[test]
    fn prefix_ends_bound_exactly_the_prefixed_keys() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn records_over_the_limit_or_cut_short_are_refused() {
        let mut big = Vec::new();
        big.extend_from_slice(&(1u32 << 30).to_le_bytes());
        assert!(matches!(
            read_record(&mut big.as_slice(), 1 << 20),
            Err(KvError::InvalidArgument(_))
        ));
        let mut cut = Vec::new();
        write_record(
            &mut cut,
            &SnapshotRecord::End {
                pairs: 1,
                event_records: 2,
            },
        )
        .unwrap();
        cut.pop();
        assert!(read_record(&mut cut.as_slice(), 1 << 20).is_err());
        assert!(read_record(&mut [].as_slice(), 1 << 20).unwrap().is_none());
    }
}
