//! Durable Raft storage on redb: the log, the vote, the committed index and
//! the latest snapshot live in one redb file per replica.
//!
//! Invariants:
//! 1. Nothing is acknowledged before it is on disk: `save_vote`, `append`,
//!    `truncate`, `purge` and snapshot installation commit a redb write
//!    transaction with `Durability::Immediate` (fsync) before returning or
//!    calling the flush callback.
//! 2. The state machine lives in memory ([`LocalState`]); it is durable as
//!    the latest snapshot plus the log. On start it is restored from the
//!    snapshot and openraft re-applies committed entries after it (it reads
//!    the saved committed index).
//! 3. Log entries are keyed by index; `truncate` removes `>= index`,
//!    `purge` removes `<= index` and records the purged id first.

// openraft's storage traits fix the error type (`StorageError`, ~224
// bytes); the helpers here return it too rather than convert twice.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, Vote,
};
use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::local::LocalState;
use crate::raft::{Response, TypeConfig};
use crate::state::{KvState, Output};

type NodeId = u64;
type Node = openraft::BasicNode;
type StorageResult<T> = Result<T, StorageError<NodeId>>;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
/// Page cache of the redb file.
const CACHE_BYTES: usize = 32 << 20;
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";
const SNAPSHOT: &str = "snapshot";

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

/// Opens (or creates) the store of one replica at `path`.
pub fn open(path: &Path, initial: KvState) -> StorageResult<(LogStore, StateMachineStore)> {
    // redb's default page cache may grow to 1 GiB; the log is written once
    // and read back rarely (lagging followers), so a small cache suffices.
    let db = redb::Builder::new()
        .set_cache_size(CACHE_BYTES)
        .create(path)
        .map_err(write_logs_err)?;
    let txn = db.begin_write().map_err(write_logs_err)?;
    txn.open_table(LOG).map_err(write_logs_err)?;
    txn.open_table(META).map_err(write_logs_err)?;
    txn.commit().map_err(write_logs_err)?;
    let db = Arc::new(db);
    let log = LogStore { db: db.clone() };
    let sm = StateMachineStore::open(db, initial)?;
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

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        put_meta(&self.db, COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        Ok(get_meta::<Option<LogId<NodeId>>>(&self.db, COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let txn = self.db.begin_write().map_err(write_logs_err)?;
        {
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

/// A snapshot as stored: its metadata and the serialized [`KvState`].
#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, Node>,
    data: Vec<u8>,
}

/// The replicated state machine: a [`LocalState`] plus what Raft needs.
pub struct StateMachineStore {
    db: Arc<Database>,
    local: Arc<LocalState>,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
    snapshots_built: u64,
}

impl StateMachineStore {
    fn open(db: Arc<Database>, initial: KvState) -> StorageResult<StateMachineStore> {
        let stored: Option<StoredSnapshot> = get_meta(&db, SNAPSHOT)?;
        let (state, applied, membership) = match stored {
            Some(s) => {
                let state: KvState = postcard::from_bytes(&s.data)
                    .map_err(|e| io_err(StorageIOError::read_state_machine, e))?;
                (state, s.meta.last_log_id, s.meta.last_membership)
            }
            None => (initial, None, StoredMembership::default()),
        };
        Ok(StateMachineStore {
            db,
            local: Arc::new(LocalState::new(state)),
            applied,
            membership,
            snapshots_built: 0,
        })
    }

    /// The applied state, for reads and waits.
    pub fn local(&self) -> Arc<LocalState> {
        self.local.clone()
    }
}

/// Builds a snapshot from one copy of the state taken when it was asked
/// for (the live state keeps applying meanwhile).
pub struct SnapshotBuilder {
    db: Arc<Database>,
    state: KvState,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, Node>,
    id: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let data = postcard::to_allocvec(&self.state)
            .map_err(|e| io_err(StorageIOError::read_state_machine, e))?;
        let snapshot_id = match self.applied {
            Some(id) => format!("{}-{}-{}", id.leader_id, id.index, self.id),
            None => format!("empty-{}", self.id),
        };
        let meta = SnapshotMeta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        };
        let stored = StoredSnapshot { meta, data };
        store_snapshot(&self.db, &stored)?;
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

fn store_snapshot(db: &Database, s: &StoredSnapshot) -> StorageResult<()> {
    put_meta(db, SNAPSHOT, s).map_err(|e| io_err(|a| StorageIOError::write_snapshot(None, a), e))
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
        let mut out = Vec::new();
        for e in entries {
            self.applied = Some(e.log_id);
            let r = match e.payload {
                EntryPayload::Blank => vec![Ok(Output::Ticked)],
                EntryPayload::Normal(p) => p.0.iter().map(|req| self.local.apply(req)).collect(),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(e.log_id), m);
                    vec![Ok(Output::Ticked)]
                }
            };
            out.push(Response(r));
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        self.snapshots_built += 1;
        SnapshotBuilder {
            db: self.db.clone(),
            state: self.local.snapshot(),
            applied: self.applied,
            membership: self.membership.clone(),
            id: self.snapshots_built,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let state: KvState = postcard::from_bytes(&data).map_err(|e| {
            io_err(
                |a| StorageIOError::write_snapshot(Some(meta.signature()), a),
                e,
            )
        })?;
        store_snapshot(
            &self.db,
            &StoredSnapshot {
                meta: meta.clone(),
                data,
            },
        )?;
        self.local.replace(state);
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let stored: Option<StoredSnapshot> = get_meta(&self.db, SNAPSHOT)?;
        Ok(stored.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
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
            let (log, sm) = open(&dir.path().join("raft.redb"), KvState::default())?;
            Ok((dir, log, sm))
        }
    }

    /// openraft's own storage conformance suite.
    #[test]
    fn redb_storage_passes_openrafts_suite() {
        Suite::test_all(Builder).unwrap();
    }

    #[tokio::test]
    async fn log_vote_and_snapshot_survive_reopening() {
        use openraft::{CommittedLeaderId, LogId};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.redb");
        let vote = Vote::new(3, 1);
        {
            let (mut log, mut sm) = open(&path, KvState::default()).unwrap();
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
        let (mut log, mut sm) = open(&path, KvState::default()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(1));
        assert_eq!(
            sm.local().read(|s| s.get(b"k").map(|kv| kv.value.clone())),
            Some(b"v".to_vec())
        );
    }
}
