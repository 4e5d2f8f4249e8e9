//! openraft's state machine over the tables: apply, snapshot, install.

use super::*;

/// The replicated state machine: a [`AppliedState`] over `state.redb` plus
/// what Raft needs.
pub struct StateMachineStore {
    pub(super) db: Arc<Database>,
    pub(super) dir: PathBuf,
    pub(super) shared: Arc<AppliedState<SmTables>>,
    pub(super) limits: Limits,
    pub(super) applied: Option<LogId<NodeId>>,
    pub(super) membership: StoredMembership<NodeId, Node>,
    pub(super) snapshots_built: u64,
    /// How far the log is on disk, where a log says (storage invariant 5).
    pub(super) log_synced: Option<LogSynced>,
}

/// The current snapshot; written as `snapshot.tmp` first (invariant 3).
pub(super) fn snapshot_path(dir: &Path) -> PathBuf {
    dir.join("snapshot")
}

pub(super) fn received_path(dir: &Path) -> PathBuf {
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
        txn.open_table(SESSIONS)
            .map_err(|e| sm_err(ErrorVerb::Write, e))?;
        let limits = initial.limits();
        let state = read_state(&txn)
            .map_err(|e| sm_err(ErrorVerb::Read, e))?
            .unwrap_or(initial);
        txn.commit().map_err(|e| sm_err(ErrorVerb::Write, e))?;
        let txn = db.begin_read().map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let applied = read_sm::<Option<LogId<NodeId>>>(&txn, APPLIED)?.flatten();
        let membership = read_sm(&txn, MEMBERSHIP)?.unwrap_or_default();
        drop(txn);
        let db = Arc::new(db);
        Ok(StateMachineStore {
            shared: Arc::new(AppliedState::new(
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

    /// Applies entries only once `log` has them on disk (storage invariant 5).
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
    pub fn applied(&self) -> Arc<AppliedState<SmTables>> {
        self.shared.clone()
    }
}

/// Runs blocking disk work: through `block_in_place` on a multi-threaded
/// runtime, so that the worker's other tasks move on meanwhile; directly
/// elsewhere (a current-thread runtime cannot hand its tasks over).
pub(super) fn outside_the_runtime<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Builds a snapshot from one read transaction taken when it was asked for
/// (the state machine keeps applying meanwhile).
pub struct SnapshotBuilder {
    pub(super) dir: PathBuf,
    pub(super) txn: Option<ReadTransaction>,
    pub(super) state: KvState,
    pub(super) applied: Option<LogId<NodeId>>,
    pub(super) membership: StoredMembership<NodeId, Node>,
    pub(super) id: u64,
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
            state: Box::new(self.state.clone()),
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
            self.shared.apply_batch(requests, |state, tables| {
                tables.end_batch(state, applied, &membership)
            })
        };
        // Waiting for a flush in flight (a full overlay): let the runtime
        // move this worker's other tasks elsewhere meanwhile.
        let results = if self.shared.read(|_, t| t.may_wait()) {
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
            .shared
            .update(|state, tables| tables.flush(state, applied, &membership, true))
            .ok()
            .and_then(|()| self.db.begin_read().ok());
        SnapshotBuilder {
            dir: self.dir.clone(),
            txn,
            state: self.shared.state(),
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
        outside_the_runtime(|| self.shared.update(|_, tables| tables.adopt_flush(true)))
            .map_err(bad)?;
        let copy = snapshot_path(&self.dir).with_extension("tmp");
        let loaded = {
            let (db, copy, meta, limits) =
                (self.db.clone(), copy.clone(), meta.clone(), self.limits);
            tokio::task::spawn_blocking(move || load_snapshot(&db, file, &copy, &meta, limits))
                .await
        };
        let (txn, mut state) = loaded
            .map_err(|e| snap_err(Some(meta), ErrorVerb::Write, e))?
            .map_err(bad)?;
        let (applied, membership) = (meta.last_log_id, meta.last_membership.clone());
        self.shared
            .update(|s, tables| {
                // The snapshot's leases replace every row (invariant 9).
                state.mark_all_leases_changed();
                let rows = StateRows::take(&mut state)?;
                commit_with_state(txn, &rows, applied, &membership, true)?;
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
