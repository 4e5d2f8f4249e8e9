//! Durable Raft storage on redb: the log, the vote and the committed index
//! live in `raft.redb`; the state machine (`sm`) in `state.redb` and
//! snapshot files beside it.
//!
//! Invariants:
//! 1. Nothing is acknowledged before it is on disk: `save_vote`, `append`,
//!    `truncate` and `purge` commit a redb write
//!    transaction with `Durability::Immediate` (fsync) before returning or
//!    calling the flush callback.
//! 2. The state machine is durable in its own file up to a batch boundary
//!    (see [`super::sm`]); on start openraft re-applies the committed
//!    entries after its applied id (it reads the saved committed index).
//! 3. Log entries are keyed by index; `truncate` removes `>= index`,
//!    `purge` removes `<= index` and records the purged id first.
//! 4. The committed index is written with the next append, in the same
//!    transaction, not on its own: openraft saves it between a write's
//!    quorum and its apply, where a commit of its own cost an fsync on
//!    every write. After a crash it may read back older than it was, never
//!    newer, so a restarted replica applies less at start and learns the
//!    rest from the leader; it never applies an entry that was not
//!    committed.

// openraft's storage traits fix the error type (`StorageError`, ~224
// bytes); the helpers here return it too rather than convert twice.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::raft::sm::StateMachineStore;
use crate::raft::TypeConfig;
use crate::state::KvState;

type NodeId = u64;
type StorageResult<T> = Result<T, StorageError<NodeId>>;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Page cache of the redb file.
const CACHE_BYTES: usize = 16 << 20;
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";
/// Where older versions kept the state machine's snapshot.
const OLD_SNAPSHOT: &str = "snapshot";

fn io_err<E: std::error::Error + 'static>(
    make: impl FnOnce(AnyError) -> StorageIOError<NodeId>,
    e: E,
) -> StorageError<NodeId> {
    make(AnyError::new(&e)).into()
}

fn read_logs_err<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    io_err(StorageIOError::read_logs, e)
}

fn write_logs_err<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    io_err(StorageIOError::write_logs, e)
}

/// Opens (or creates) the stores of one replica in `dir`.
pub fn open(dir: &Path, initial: KvState) -> StorageResult<(LogStore, StateMachineStore)> {
    // redb's default page cache may grow to 1 GiB; the log is written once
    // and read back rarely (lagging followers), so a small cache suffices.
    let db = redb::Builder::new()
        .set_cache_size(CACHE_BYTES)
        .create(dir.join("raft.redb"))
        .map_err(write_logs_err)?;
    let txn = db.begin_write().map_err(write_logs_err)?;
    txn.open_table(LOG).map_err(write_logs_err)?;
    txn.open_table(META).map_err(write_logs_err)?;
    txn.commit().map_err(write_logs_err)?;
    if get_meta::<serde::de::IgnoredAny>(&db, OLD_SNAPSHOT)?.is_some() {
        return Err(read_logs_err(std::io::Error::other(format!(
            "{} was written by a tessel before 2026-11-23 (state machine inside the log file); start this replica from an empty data directory",
            dir.display()
        ))));
    }
    let log = LogStore {
        db: Arc::new(db),
        unsaved_committed: Default::default(),
    };
    let sm = StateMachineStore::open(dir, initial)?;
    Ok((log, sm))
}

fn get_meta<T: for<'de> Deserialize<'de>>(db: &Database, key: &str) -> StorageResult<Option<T>> {
    let txn = db.begin_read().map_err(read_logs_err)?;
    let table = txn.open_table(META).map_err(read_logs_err)?;
    match table.get(key).map_err(read_logs_err)? {
        None => Ok(None),
        Some(v) => postcard::from_bytes(v.value())
            .map(Some)
            .map_err(read_logs_err),
    }
}

fn put_meta<T: Serialize>(db: &Database, key: &str, value: &T) -> StorageResult<()> {
    let bytes = postcard::to_allocvec(value).map_err(write_logs_err)?;
    let txn = db.begin_write().map_err(write_logs_err)?;
    txn.open_table(META)
        .map_err(write_logs_err)?
        .insert(key, bytes.as_slice())
        .map_err(write_logs_err)?;
    txn.commit().map_err(write_logs_err)
}

/// The Raft log, vote and committed index.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// The committed index openraft reported, not yet written
    /// (invariant 4).
    unsaved_committed: Arc<std::sync::Mutex<Option<Option<LogId<NodeId>>>>>,
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let txn = self.db.begin_read().map_err(read_logs_err)?;
        let table = txn.open_table(LOG).map_err(read_logs_err)?;
        let mut out = Vec::new();
        for item in table.range(range).map_err(read_logs_err)? {
            let (_, v) = item.map_err(read_logs_err)?;
            out.push(postcard::from_bytes(v.value()).map_err(read_logs_err)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged: Option<LogId<NodeId>> = get_meta(&self.db, LAST_PURGED)?;
        let txn = self.db.begin_read().map_err(read_logs_err)?;
        let table = txn.open_table(LOG).map_err(read_logs_err)?;
        let last = match table.last().map_err(read_logs_err)? {
            Some((_, v)) => {
                let e: Entry<TypeConfig> =
                    postcard::from_bytes(v.value()).map_err(read_logs_err)?;
                Some(e.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        put_meta(&self.db, VOTE, vote).map_err(|e| io_err(StorageIOError::write_vote, e))
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        get_meta(&self.db, VOTE).map_err(|e| io_err(StorageIOError::read_vote, e))
    }

    /// Invariant 4: kept until the next append writes it.
    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        *self.unsaved_committed.lock().expect("not poisoned") = Some(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        if let Some(c) = *self.unsaved_committed.lock().expect("not poisoned") {
            return Ok(c);
        }
        Ok(get_meta::<Option<LogId<NodeId>>>(&self.db, COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let txn = self.db.begin_write().map_err(write_logs_err)?;
        {
            if let Some(c) = self.unsaved_committed.lock().expect("not poisoned").take() {
                let bytes = postcard::to_allocvec(&c).map_err(write_logs_err)?;
                txn.open_table(META)
                    .map_err(write_logs_err)?
                    .insert(COMMITTED, bytes.as_slice())
                    .map_err(write_logs_err)?;
            }
            let mut table = txn.open_table(LOG).map_err(write_logs_err)?;
            for e in entries {
                let bytes = postcard::to_allocvec(&e).map_err(write_logs_err)?;
                table
                    .insert(e.log_id.index, bytes.as_slice())
                    .map_err(write_logs_err)?;
            }
        }
        // Invariant 1: durable before the flush is reported.
        let result = txn.commit();
        let io = result
            .as_ref()
            .map(|_| ())
            .map_err(|e| std::io::Error::other(e.to_string()));
        callback.log_io_completed(io);
        result.map_err(write_logs_err)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let txn = self.db.begin_write().map_err(write_logs_err)?;
        txn.open_table(LOG)
            .map_err(write_logs_err)?
            .retain_in(log_id.index.., |_, _| false)
            .map_err(write_logs_err)?;
        txn.commit().map_err(write_logs_err)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let bytes = postcard::to_allocvec(&log_id).map_err(write_logs_err)?;
        let txn = self.db.begin_write().map_err(write_logs_err)?;
        txn.open_table(META)
            .map_err(write_logs_err)?
            .insert(LAST_PURGED, bytes.as_slice())
            .map_err(write_logs_err)?;
        txn.open_table(LOG)
            .map_err(write_logs_err)?
            .retain_in(..=log_id.index, |_, _| false)
            .map_err(write_logs_err)?;
        txn.commit().map_err(write_logs_err)
    }
}

#[cfg(test)]
mod tests {
    use openraft::testing::{StoreBuilder, Suite};

    use super::*;

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Builder {
        async fn build(&self) -> StorageResult<(tempfile::TempDir, LogStore, StateMachineStore)> {
            let dir = tempfile::tempdir().map_err(write_logs_err)?;
            let (log, sm) = open(dir.path(), KvState::default())?;
            Ok((dir, log, sm))
        }
    }

    /// openraft's own storage conformance suite.
    #[test]
    fn redb_storage_passes_openrafts_suite() {
        Suite::test_all(Builder).unwrap();
    }

    /// Invariant 4: the committed index is written with the next append,
    /// so after a crash it reads back older than it was, never newer.
    #[tokio::test]
    async fn the_committed_index_is_written_with_the_next_append() {
        use openraft::storage::RaftLogStorageExt;
        use openraft::{CommittedLeaderId, EntryPayload};
        let dir = tempfile::tempdir().unwrap();
        let id = |i| LogId::new(CommittedLeaderId::new(1, 1), i);
        let blank = |i| Entry::<TypeConfig> {
            log_id: id(i),
            payload: EntryPayload::Blank,
        };
        {
            let (mut log, _sm) = open(dir.path(), KvState::default()).unwrap();
            log.blocking_append([blank(1), blank(2)]).await.unwrap();
            log.save_committed(Some(id(1))).await.unwrap();
            assert_eq!(log.read_committed().await.unwrap(), Some(id(1)));
        }
        // Dropped without another append: the saved value never reached the
        // file (a crash at this point reads back the older one).
        {
            let (mut log, _sm) = open(dir.path(), KvState::default()).unwrap();
            assert_eq!(log.read_committed().await.unwrap(), None);
            log.save_committed(Some(id(2))).await.unwrap();
            log.blocking_append([blank(3)]).await.unwrap();
        }
        let (mut log, _sm) = open(dir.path(), KvState::default()).unwrap();
        assert_eq!(log.read_committed().await.unwrap(), Some(id(2)));
    }

    #[tokio::test]
    async fn log_vote_and_snapshot_survive_reopening() {
        use openraft::storage::RaftStateMachine;
        use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftSnapshotBuilder};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path();
        let vote = Vote::new(3, 1);
        {
            let (mut log, mut sm) = open(path, KvState::default()).unwrap();
            log.save_vote(&vote).await.unwrap();
            let req = crate::state::Request {
                now_ms: 5,
                op: crate::state::Op::Put {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    lease: None,
                },
            };
            let entry = Entry::<TypeConfig> {
                log_id: LogId::new(CommittedLeaderId::new(3, 1), 1),
                payload: EntryPayload::Normal(crate::raft::Proposal::one(req)),
            };
            sm.apply([entry]).await.unwrap();
            sm.get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
        }
        let (mut log, mut sm) = open(path, KvState::default()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(1));
        assert_eq!(sm.local().try_get(b"k").unwrap(), Some(b"v".to_vec()));
    }
}
