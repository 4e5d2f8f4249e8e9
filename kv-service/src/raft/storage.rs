//! Durable Raft storage: the log, the vote and the committed index in a
//! write-ahead log of segment files (`log/`, see [`super::wal`]); the
//! state machine (`sm`) in `state.redb` and snapshot files beside it.
//!
//! Invariants:
//! 1. Nothing is acknowledged before it is on disk: `save_vote`, `truncate`
//!    and `purge` return, and `append` reports its flush, once synced (but 5).
//! 2. The state machine is durable in its own file up to a batch boundary
//!    ([`super::sm`]); on start openraft re-applies committed entries after it.
//! 3. Entries are keyed by index; `truncate` removes `>= index`, `purge`
//!    removes `<= index` and records the purged id.
//! 4. The committed index rides with the next append's sync, never alone:
//!    after a crash it reads back older than it was, never newer.
//! 5. The leader's own entries are reported flushed once queued, so its sync
//!    overlaps the followers' (`raft` module docs, "The Raft log"); until synced
//!    ([`LogSynced`]) nothing acts on a commit that counted them:
//!    - (5a) the state machine applies (and answers) only synced entries;
//!    - (5b) the commit index sent to followers is bounded by the synced one;
//!    - (5c) the committed index saved is never ahead of its entries (4);
//!    - (5d) a replica reopening with a committed vote for itself saves it
//!      uncommitted, so it holds an election instead of resuming the term.

// openraft's storage traits fix the error type (`StorageError`, ~224
// bytes); the helpers here return it too rather than convert twice.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, RaftLogReader, StorageError, StorageIOError, Vote};
use tokio::sync::watch;

use crate::raft::sm::StateMachineStore;
use crate::raft::wal::{LogIo, Wal};
use crate::raft::TypeConfig;
use tessel_kv::state::KvState;

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

/// Opens (or creates) the stores of replica `id` in `dir`.
pub async fn open(
    dir: &Path,
    id: NodeId,
    initial: KvState,
    io: LogIo,
) -> StorageResult<(LogStore, StateMachineStore)> {
    let wal = Wal::open_with_io(&dir.join(LOG_DIR), io).map_err(write_logs_err)?;
    // Invariant 5d.
    if let Some(vote) = wal.meta().vote {
        if vote.is_committed() && vote.leader_id().voted_for() == Some(id) {
            let uncommitted = Vote::new(vote.leader_id().term, id);
            wal.save_vote(uncommitted)
                .await
                .map_err(|e| io_err(StorageIOError::write_vote, e))?;
        }
    }
    let (synced, _) = watch::channel(Synced::Through(wal.last_log_id()));
    let log = LogStore {
        wal,
        id,
        synced: Arc::new(synced),
        unsaved_committed: Default::default(),
    };
    let mut sm = StateMachineStore::open(dir, initial)?;
    sm.apply_when_synced(log.synced());
    Ok((log, sm))
}

/// How far the log is on disk (invariant 5): the last entry of the newest
/// append whose sync completed, or the log's failure, after which nothing
/// more will be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Synced {
    Through(Option<LogId<NodeId>>),
    Failed,
}

/// A view of how far the log is on disk (invariant 5a, 5b).
#[derive(Clone)]
pub struct LogSynced(watch::Receiver<Synced>);

impl LogSynced {
    /// Waits until the entry at `index` is on disk; fails once the log
    /// has failed (nothing more will be).
    pub async fn wait_through(&mut self, index: u64) -> StorageResult<()> {
        let synced = self
            .0
            .wait_for(|s| match s {
                Synced::Through(last) => last.is_some_and(|l| l.index >= index),
                Synced::Failed => true,
            })
            .await
            .map(|s| *s);
        match synced {
            Ok(Synced::Through(_)) => Ok(()),
            Ok(Synced::Failed) | Err(_) => Err(write_logs_err(std::io::Error::other(format!(
                "the log failed before entry {index} was on disk"
            )))),
        }
    }

    /// `committed`, or the last entry on disk if that is older (5b).
    pub fn bound(&self, committed: Option<LogId<NodeId>>) -> Option<LogId<NodeId>> {
        match *self.0.borrow() {
            Synced::Through(last) => committed.min(last),
            Synced::Failed => None,
        }
    }
}

/// The Raft log, vote and committed index.
#[derive(Clone)]
pub struct LogStore {
    wal: Wal,
    /// This replica's id: whose entries are its own (invariant 5).
    id: NodeId,
    synced: Arc<watch::Sender<Synced>>,
    /// The committed index openraft reported, not yet written
    /// (invariant 4).
    unsaved_committed: Arc<std::sync::Mutex<Option<Option<LogId<NodeId>>>>>,
}

impl LogStore {
    /// How far this log is on disk (invariant 5).
    pub fn synced(&self) -> LogSynced {
        LogSynced(self.synced.subscribe())
    }

    /// Whether `entries` are this replica's own, as leader of the term it
    /// voted itself into (invariant 5).
    fn own(&self, entries: &[Entry<TypeConfig>]) -> bool {
        self.wal.meta().vote.is_some_and(|vote| {
            vote.is_committed()
                && vote.leader_id().voted_for() == Some(self.id)
                && entries
                    .iter()
                    .all(|e| e.log_id.leader_id == *vote.leader_id())
        })
    }
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

    /// Invariants 5 and 7.
    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        let Some(last) = entries.last().map(|e| e.log_id) else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        let (now, when_synced) = if self.own(&entries) {
            (Some(callback), None)
        } else {
            (None, Some(callback))
        };
        let committed = self.unsaved_committed.lock().expect("not poisoned").take();
        let synced = self.synced.clone();
        self.wal
            .append(
                entries,
                committed,
                Box::new(move |io| {
                    synced.send_modify(|s| {
                        *s = match (&io, *s) {
                            (Ok(()), Synced::Through(_)) => Synced::Through(Some(last)),
                            _ => Synced::Failed,
                        }
                    });
                    if let Some(callback) = when_synced {
                        callback.log_io_completed(io);
                    }
                }),
            )
            .map_err(write_logs_err)?;
        if let Some(callback) = now {
            callback.log_io_completed(Ok(()));
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.wal
            .truncate(log_id.index)
            .await
            .map_err(write_logs_err)?;
        let last = self.wal.last_log_id();
        self.synced.send_if_modified(|s| match s {
            Synced::Through(Some(l)) if l.index >= log_id.index => {
                *s = Synced::Through(last);
                true
            }
            _ => false,
        });
        Ok(())
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
            let (log, mut sm) = open(dir.path(), 1, KvState::default(), LogIo::Direct).await?;
            // The suite applies entries it never appended to the log, which
            // a replica never does (invariant 5a is tested below).
            sm.apply_without_waiting_for_the_log();
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
            let (mut log, _sm) = open(dir.path(), 1, KvState::default(), LogIo::Direct)
                .await
                .unwrap();
            log.blocking_append([blank(1), blank(2)]).await.unwrap();
            log.save_committed(Some(id(1))).await.unwrap();
            assert_eq!(log.read_committed().await.unwrap(), Some(id(1)));
        }
        // Dropped without another append: the saved value never reached the
        // file (a crash at this point reads back the older one).
        {
            let (mut log, _sm) = open(dir.path(), 1, KvState::default(), LogIo::Direct)
                .await
                .unwrap();
            assert_eq!(log.read_committed().await.unwrap(), None);
            log.save_committed(Some(id(2))).await.unwrap();
            log.blocking_append([blank(3)]).await.unwrap();
        }
        let (mut log, _sm) = open(dir.path(), 1, KvState::default(), LogIo::Direct)
            .await
            .unwrap();
        assert_eq!(log.read_committed().await.unwrap(), Some(id(2)));
    }

    fn put(term: u64, leader: u64, index: u64, key: &[u8]) -> Entry<TypeConfig> {
        use openraft::{CommittedLeaderId, EntryPayload};
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, leader), index),
            payload: EntryPayload::Normal(crate::raft::Proposal::one(tessel_kv::state::Request {
                now_ms: 5,
                op: tessel_kv::state::Op::Put {
                    key: key.to_vec(),
                    value: b"v".to_vec(),
                    lease: None,
                },
            })),
        }
    }

    /// Invariant 5: while the log's writer is held back, the leader's own
    /// entries are reported flushed at once, but the state machine does
    /// not apply them and the commit index sent to followers stays at
    /// what is on disk; another leader's entries are reported only once
    /// they are on disk.
    #[tokio::test]
    async fn own_entries_are_reported_at_once_and_applied_only_once_synced() {
        use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut sm) = open(dir.path(), 1, KvState::default(), LogIo::Direct)
            .await
            .unwrap();
        let synced = log.synced();
        let applied = sm.applied();
        log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
        let own = put(2, 1, 1, b"own");
        let release = log.wal.pause();
        tokio::time::timeout(Duration::from_secs(5), log.blocking_append([own.clone()]))
            .await
            .expect("own entries are reported while the writer is held back")
            .unwrap();
        assert_eq!(synced.bound(Some(own.log_id)), None);
        let apply = tokio::spawn(async move { sm.apply([own]).await.map(|_| sm) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!apply.is_finished(), "applied before it was on disk");
        assert_eq!(applied.try_get(b"own").unwrap(), None);
        drop(release);
        let _sm = apply.await.unwrap().unwrap();
        assert_eq!(applied.try_get(b"own").unwrap(), Some(b"v".to_vec()));
        let on_disk = Some(LogId::new(openraft::CommittedLeaderId::new(2, 1), 1));
        assert_eq!(synced.bound(Some(put(2, 1, 9, b"x").log_id)), on_disk);

        // A follower of replica 2: its entries wait for the disk.
        log.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        let release = log.wal.pause();
        let theirs = log.blocking_append([put(3, 2, 2, b"theirs")]);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), theirs)
                .await
                .is_err(),
            "a follower's entry was reported before it was on disk"
        );
        assert_eq!(synced.bound(Some(put(3, 2, 2, b"x").log_id)), on_disk);
        drop(release);
        log.blocking_append([put(3, 2, 3, b"more")]).await.unwrap();
        assert_eq!(
            synced
                .bound(Some(put(3, 2, 3, b"x").log_id))
                .map(|l| l.index),
            Some(3)
        );
    }

    /// Invariant 5d: a replica that opens with a committed vote for itself
    /// holds an election instead of resuming the term; anyone else's
    /// committed vote is kept as it was.
    #[tokio::test]
    async fn a_committed_vote_for_itself_opens_uncommitted() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut log, _sm) = open(dir.path(), 1, KvState::default(), LogIo::Direct)
                .await
                .unwrap();
            log.save_vote(&Vote::new_committed(4, 1)).await.unwrap();
        }
        {
            let (mut log, _sm) = open(dir.path(), 1, KvState::default(), LogIo::Direct)
                .await
                .unwrap();
            assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(4, 1)));
            log.save_vote(&Vote::new_committed(5, 2)).await.unwrap();
        }
        let (mut log, _sm) = open(dir.path(), 1, KvState::default(), LogIo::Direct)
            .await
            .unwrap();
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new_committed(5, 2))
        );
    }

    #[tokio::test]
    async fn log_vote_and_snapshot_survive_reopening() {
        use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
        use openraft::{CommittedLeaderId, EntryPayload, LogId, RaftSnapshotBuilder};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path();
        let vote = Vote::new(3, 1);
        {
            let (mut log, mut sm) = open(path, 1, KvState::default(), LogIo::Direct)
                .await
                .unwrap();
            log.save_vote(&vote).await.unwrap();
            let req = tessel_kv::state::Request {
                now_ms: 5,
                op: tessel_kv::state::Op::Put {
                    key: b"k".to_vec(),
                    value: b"v".to_vec(),
                    lease: None,
                },
            };
            let entry = Entry::<TypeConfig> {
                log_id: LogId::new(CommittedLeaderId::new(3, 1), 1),
                payload: EntryPayload::Normal(crate::raft::Proposal::one(req)),
            };
            log.blocking_append([entry.clone()]).await.unwrap();
            sm.apply([entry]).await.unwrap();
            sm.get_snapshot_builder()
                .await
                .build_snapshot()
                .await
                .unwrap();
        }
        let (mut log, mut sm) = open(path, 1, KvState::default(), LogIo::Direct)
            .await
            .unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(1));
        assert_eq!(sm.applied().try_get(b"k").unwrap(), Some(b"v".to_vec()));
    }
}
