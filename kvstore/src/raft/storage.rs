//! Durable Raft storage: the log, the vote and the committed index in a
//! write-ahead log of segment files (`log/`, see [`super::wal`]); the
//! state machine (`sm`) in `state.redb` and snapshot files beside it.
//!
//! Invariants:
//! 1. Nothing is acknowledged before it is on disk: `save_vote`,
//!    `truncate` and `purge` return, and `append` calls its flush
//!    callback, only once their records are synced.
//! 2. The state machine is durable in its own file up to a batch boundary
//!    (see [`super::sm`]); on start openraft re-applies the committed
//!    entries after its applied id (it reads the saved committed index).
//! 3. Entries are keyed by index; `truncate` removes `>= index`, `purge`
//!    removes `<= index` and records the purged id.
//! 4. The committed index is written with the next append, in the same
//!    sync, not on its own: openraft saves it between a write's quorum and
//!    its apply, where a sync of its own cost one on every write. After a
//!    crash it may read back older than it was, never newer, so a
//!    restarted replica applies less at start and learns the rest from the
//!    leader; it never applies an entry that was not committed.
//! 5. `append` returns once its entries are queued and readable; the log's
//!    writer thread syncs them and then reports the flush. (openraft 0.9
//!    awaits that report before it replicates, so this overlaps nothing
//!    today; it keeps the sync off the runtime's worker threads.)
//! 6. A data directory written by an older tessel (the log in
//!    `raft.redb`) is migrated once: its log, vote, committed index and
//!    purge point are written to `log.migrating/`, synced, renamed to
//!    `log/`, and only then is `raft.redb` removed.

// openraft's storage traits fix the error type (`StorageError`, ~224
// bytes); the helpers here return it too rather than convert twice.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, RaftLogReader, StorageError, StorageIOError, Vote};

use crate::raft::sm::StateMachineStore;
use crate::raft::wal::{LogIo, LogMeta, Wal};
use crate::raft::TypeConfig;
use crate::state::KvState;

type NodeId = u64;
type StorageResult<T> = Result<T, StorageError<NodeId>>;

/// The log's directory in a data directory.
const LOG_DIR: &str = "log";

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
pub fn open(
    dir: &Path,
    initial: KvState,
    io: LogIo,
) -> StorageResult<(LogStore, StateMachineStore)> {
    migrate_redb_log(dir).map_err(write_logs_err)?;
    let wal = Wal::open_with_io(&dir.join(LOG_DIR), io).map_err(write_logs_err)?;
    let log = LogStore {
        wal,
        unsaved_committed: Default::default(),
    };
    let sm = StateMachineStore::open(dir, initial)?;
    Ok((log, sm))
}

/// Invariant 6.
fn migrate_redb_log(dir: &Path) -> std::io::Result<()> {
    use redb::{ReadableTable, TableDefinition};
    const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
    let old = dir.join("raft.redb");
    if !old.exists() {
        return Ok(());
    }
    if dir.join(LOG_DIR).exists() {
        // Migrated; the crash came before the old file was removed.
        return std::fs::remove_file(&old);
    }
    let err = |e: &dyn std::fmt::Display| {
        std::io::Error::other(format!("migrating {}: {e}", old.display()))
    };
    let db = redb::Database::open(&old).map_err(|e| err(&e))?;
    let txn = db.begin_read().map_err(|e| err(&e))?;
    let meta_table = txn.open_table(META).map_err(|e| err(&e))?;
    let get = |key: &str| -> std::io::Result<Option<Vec<u8>>> {
        Ok(meta_table
            .get(key)
            .map_err(|e| err(&e))?
            .map(|v| v.value().to_vec()))
    };
    if get("snapshot")?.is_some() {
        return Err(err(
            &"written by a tessel before 2026-11-23 (state machine inside the log file); start this replica from an empty data directory",
        ));
    }
    fn decode<T: serde::de::DeserializeOwned>(b: Option<Vec<u8>>) -> std::io::Result<Option<T>> {
        b.map(|b| postcard::from_bytes(&b).map_err(std::io::Error::other))
            .transpose()
    }
    let meta = LogMeta {
        vote: decode(get("vote")?)?,
        committed: decode::<Option<LogId<NodeId>>>(get("committed")?)?.flatten(),
        last_purged: decode(get("last_purged")?)?,
    };
    let mut entries = Vec::new();
    for item in txn
        .open_table(LOG)
        .map_err(|e| err(&e))?
        .iter()
        .map_err(|e| err(&e))?
    {
        let (_, v) = item.map_err(|e| err(&e))?;
        entries.push(postcard::from_bytes::<Entry<TypeConfig>>(v.value()).map_err(|e| err(&e))?);
    }
    let staging = dir.join("log.migrating");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    Wal::create_from(&staging, &meta, entries)?;
    std::fs::rename(&staging, dir.join(LOG_DIR))?;
    std::fs::File::open(dir)?.sync_all()?;
    drop((meta_table, txn, db));
    std::fs::remove_file(&old)
}

/// The Raft log, vote and committed index.
#[derive(Clone)]
pub struct LogStore {
    wal: Wal,
    /// The committed index openraft reported, not yet written
    /// (invariant 4).
    unsaved_committed: Arc<std::sync::Mutex<Option<Option<LogId<NodeId>>>>>,
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        self.wal.read(range).map_err(read_logs_err)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        Ok(LogState {
            last_purged_log_id: self.wal.meta().last_purged,
            last_log_id: self.wal.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        self.wal
            .save_vote(*vote)
            .await
            .map_err(|e| io_err(StorageIOError::write_vote, e))
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(self.wal.meta().vote)
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
        Ok(self.wal.meta().committed)
    }

    /// Invariant 5.
    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let committed = self.unsaved_committed.lock().expect("not poisoned").take();
        self.wal
            .append(
                entries.into_iter().collect(),
                committed,
                Box::new(move |io| callback.log_io_completed(io)),
            )
            .map_err(write_logs_err)
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.wal
            .truncate(log_id.index)
            .await
            .map_err(write_logs_err)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.wal.purge(log_id).await.map_err(write_logs_err)
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
            let (log, sm) = open(dir.path(), KvState::default(), LogIo::Direct)?;
            Ok((dir, log, sm))
        }
    }

    /// openraft's own storage conformance suite.
    #[test]
    fn log_and_state_machine_pass_openrafts_suite() {
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
            let (mut log, _sm) = open(dir.path(), KvState::default(), LogIo::Direct).unwrap();
            log.blocking_append([blank(1), blank(2)]).await.unwrap();
            log.save_committed(Some(id(1))).await.unwrap();
            assert_eq!(log.read_committed().await.unwrap(), Some(id(1)));
        }
        // Dropped without another append: the saved value never reached the
        // file (a crash at this point reads back the older one).
        {
            let (mut log, _sm) = open(dir.path(), KvState::default(), LogIo::Direct).unwrap();
            assert_eq!(log.read_committed().await.unwrap(), None);
            log.save_committed(Some(id(2))).await.unwrap();
            log.blocking_append([blank(3)]).await.unwrap();
        }
        let (mut log, _sm) = open(dir.path(), KvState::default(), LogIo::Direct).unwrap();
        assert_eq!(log.read_committed().await.unwrap(), Some(id(2)));
    }

    /// Invariant 6: a data directory whose log is in `raft.redb` (the
    /// format before 2026-11-23 13:00) opens with its log, vote, committed
    /// index and purge point, and the old file is gone afterwards.
    #[tokio::test]
    async fn a_log_in_redb_is_migrated_once_with_nothing_lost() {
        use openraft::{CommittedLeaderId, EntryPayload};
        const LOG: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("log");
        const META: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("meta");
        let dir = tempfile::tempdir().unwrap();
        let id = |i| LogId::new(CommittedLeaderId::new(2, 1), i);
        let entries: Vec<Entry<TypeConfig>> = (4..=9)
            .map(|i| Entry {
                log_id: id(i),
                payload: EntryPayload::Blank,
            })
            .collect();
        let vote = Vote::new(2, 1);
        {
            let db = redb::Database::create(dir.path().join("raft.redb")).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut meta = txn.open_table(META).unwrap();
                let put = |m: &mut redb::Table<&str, &[u8]>, k, v: Vec<u8>| {
                    m.insert(k, v.as_slice()).unwrap();
                };
                put(&mut meta, "vote", postcard::to_allocvec(&vote).unwrap());
                put(
                    &mut meta,
                    "committed",
                    postcard::to_allocvec(&Some(id(7))).unwrap(),
                );
                put(
                    &mut meta,
                    "last_purged",
                    postcard::to_allocvec(&id(3)).unwrap(),
                );
                let mut log = txn.open_table(LOG).unwrap();
                for e in &entries {
                    let bytes = postcard::to_allocvec(e).unwrap();
                    log.insert(e.log_id.index, bytes.as_slice()).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        for _ in 0..2 {
            let (mut log, _sm) = open(dir.path(), KvState::default(), LogIo::Direct).unwrap();
            assert!(!dir.path().join("raft.redb").exists());
            assert_eq!(log.read_vote().await.unwrap(), Some(vote));
            assert_eq!(log.read_committed().await.unwrap(), Some(id(7)));
            let state = log.get_log_state().await.unwrap();
            assert_eq!(state.last_purged_log_id, Some(id(3)));
            assert_eq!(state.last_log_id, Some(id(9)));
            assert_eq!(log.try_get_log_entries(4..=9).await.unwrap(), entries);
        }
    }

    #[tokio::test]
    async fn log_vote_and_snapshot_survive_reopening() {
        use openraft::storage::RaftStateMachine;
        use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftSnapshotBuilder};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path();
        let vote = Vote::new(3, 1);
        {
            let (mut log, mut sm) = open(path, KvState::default(), LogIo::Direct).unwrap();
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
        let (mut log, mut sm) = open(path, KvState::default(), LogIo::Direct).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(1));
        assert_eq!(sm.local().try_get(b"k").unwrap(), Some(b"v".to_vec()));
    }
}
