//! The state machine's redb tables: values, history, state; reads through the overlays (`SmTables`).

use super::*;

/// A value as stored under its key (the key is not repeated).
#[derive(Serialize, Deserialize)]
pub(super) struct StoredValue<'a> {
    #[serde(borrow, with = "serde_bytes")]
    pub(super) value: &'a [u8],
    pub(super) create_revision: u64,
    pub(super) mod_revision: u64,
    pub(super) lease: Option<u64>,
}

pub(super) fn encode_value(kv: &KeyValue) -> Result<Vec<u8>> {
    postcard::to_allocvec(&StoredValue {
        value: &kv.value,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        lease: kv.lease,
    })
    .map_err(storage)
}

pub(super) fn decode_value(key: &[u8], bytes: &[u8]) -> Result<KeyValue> {
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
pub(super) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
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
pub(super) fn open_read<K: redb::Key + 'static, V: redb::Value + 'static>(
    db: &Database,
    def: TableDefinition<K, V>,
) -> Result<redb::ReadOnlyTable<K, V>> {
    let txn = db.begin_read().map_err(storage)?;
    txn.open_table(def).map_err(storage)
}

pub(super) fn get_in(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
) -> Result<Option<KeyValue>> {
    let got = table.get(key).map_err(storage)?;
    got.map(|v| decode_value(key, v.value())).transpose()
}

pub(super) fn list_in(
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

pub(super) fn events_in(
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

/// The tables of `state.redb` under overlays of the batches applied since
/// the last flush (invariant 1): reads see the live overlay first, then
/// the one being flushed, then the tables as of the last flush.
pub struct SmTables {
    pub(super) db: Arc<Database>,
    pub(super) live: Overlay,
    /// Key and value bytes in the live overlay.
    pub(super) bytes: usize,
    pub(super) flushing: Option<Flushing>,
    pub(super) flusher: Flusher,
    pub(super) last_flush: std::time::Instant,
    pub(super) last_durable: std::time::Instant,
    /// The tables as of the last flush this replica adopted, opened once
    /// per flush rather than once per read, and never newer than the
    /// overlay being flushed (a read would see its writes twice).
    pub(super) base: redb::ReadOnlyTable<&'static [u8], &'static [u8]>,
    pub(super) base_history: redb::ReadOnlyTable<u64, &'static [u8]>,
    pub(super) base_sessions: redb::ReadOnlyTable<u128, &'static [u8]>,
    /// Every key in the tables and overlays (invariant 8).
    pub(super) filter: KeyFilter,
    /// The history of the last overlays flushed, oldest first: events from
    /// the first revision they hold on are read from them (invariant 11).
    pub(super) flushed: std::collections::VecDeque<Overlay>,
    /// The lease rows changed since the last flush, encoded as each batch
    /// ended, in the order they changed (a later row of a lease replaces
    /// an earlier one when written): a flush's apply-path pause is not a
    /// second's renewals encoded at once (invariant 13).
    pub(super) lease_rows: Vec<(u64, Option<Vec<u8>>)>,
}

/// A key filter of every key in `table` (invariant 8).
pub(super) fn filter_of(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
) -> Result<KeyFilter> {
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
    pub(super) fn new(db: Arc<Database>) -> Result<SmTables> {
        let base = open_read(&db, DATA)?;
        Ok(SmTables {
            filter: filter_of(&base)?,
            base,
            base_history: open_read(&db, HISTORY)?,
            base_sessions: open_read(&db, SESSIONS)?,
            flusher: Flusher::start(db.clone())?,
            db,
            live: Overlay::default(),
            bytes: 0,
            flushing: None,
            last_flush: std::time::Instant::now(),
            last_durable: std::time::Instant::now(),
            flushed: Default::default(),
            lease_rows: Vec::new(),
        })
    }

    /// Whether the live overlay is due for a flush (large or old).
    pub(super) fn flush_due(&self) -> bool {
        self.overlay_full() || self.last_flush.elapsed() >= FLUSH_INTERVAL
    }

    pub(super) fn overlay_full(&self) -> bool {
        self.bytes >= FLUSH_BYTES || self.live.entries() >= FLUSH_ENTRIES
    }

    /// Whether the key filter holds far more keys than the tables, most of
    /// them removed since (invariant 8).
    pub(super) fn filter_stale(&self) -> Result<bool> {
        let keys = self.base.len().map_err(storage)? as usize;
        Ok(self.filter.inserted() > 2 * keys + key_filter::MIN_CAPACITY)
    }

    /// Whether ending a batch now could wait for a flush to finish.
    pub(super) fn may_wait(&self) -> bool {
        self.flushing.is_some() && self.overlay_full()
    }

    /// Ends an applied batch: adopts a finished flush, and starts one when
    /// the live overlay is due (invariant 2), with fsync when the last one
    /// is [`DURABLE_INTERVAL`] ago. Waits for the flush in flight only when
    /// the live overlay is full (invariant 6).
    pub(super) fn end_batch(
        &mut self,
        state: &mut KvState,
        applied: Option<LogId<NodeId>>,
        membership: &StoredMembership<NodeId, Node>,
    ) -> Result<()> {
        self.take_lease_rows(state)?;
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
    pub(super) fn flush(
        &mut self,
        state: &mut KvState,
        applied: Option<LogId<NodeId>>,
        membership: &StoredMembership<NodeId, Node>,
        durable: bool,
    ) -> Result<()> {
        self.adopt_flush(true)?;
        let (overlay, commit) = self.freeze(state, applied, membership, durable)?;
        let rebuilt = write_overlay(&self.db, &overlay, &commit)?;
        self.reopen_base(durable)?;
        self.keep_flushed(overlay);
        self.adopt_filter(rebuilt);
        Ok(())
    }

    /// Takes a filter a flush rebuilt from the tables it committed, with
    /// the keys written to the live overlay since (invariant 8).
    pub(super) fn adopt_filter(&mut self, rebuilt: Option<KeyFilter>) {
        let Some(mut filter) = rebuilt else { return };
        for (k, v) in &self.live.data {
            if v.is_some() {
                filter.insert(k);
            }
        }
        self.filter = filter;
    }

    /// Takes the live overlay to be written, with what commits with it.
    pub(super) fn freeze(
        &mut self,
        state: &mut KvState,
        applied: Option<LogId<NodeId>>,
        membership: &StoredMembership<NodeId, Node>,
        durable: bool,
    ) -> Result<(Overlay, FlushCommit)> {
        // The state first: if it cannot be encoded, no row is taken.
        let core = state.encode_without_leases()?;
        self.take_lease_rows(state)?;
        let commit = FlushCommit {
            state: StateRows {
                core,
                leases: std::mem::take(&mut self.lease_rows),
            },
            applied,
            membership: membership.clone(),
            durable,
            rebuild_filter: self.filter_stale()?,
        };
        Ok((self.take_live(), commit))
    }

    /// Encodes the rows of the leases `state` changed since it was last
    /// asked (invariant 13).
    fn take_lease_rows(&mut self, state: &mut KvState) -> Result<()> {
        let rows = state.take_changed_leases()?;
        self.lease_rows.extend(rows);
        Ok(())
    }

    /// Keeps the history of `overlay`, just flushed, for reads of recent
    /// history (invariant 11), and lets the oldest kept go. Its pairs go:
    /// the tables hold them, and the events hold their values again.
    fn keep_flushed(&mut self, overlay: Overlay) {
        self.flushed.push_back(Overlay {
            history: overlay.history,
            keyed: overlay.keyed,
            forget_below: overlay.forget_below,
            ..Overlay::default()
        });
        let mut entries: usize = self.flushed.iter().map(Overlay::history_entries).sum();
        while self.flushed.len() > 1
            && (self.flushed.len() > KEPT_OVERLAYS || entries > KEPT_ENTRIES)
        {
            let oldest = self.flushed.pop_front().expect("more than one kept");
            entries -= oldest.history_entries();
        }
    }

    /// Empties the live overlay and restarts its size and age.
    pub(super) fn take_live(&mut self) -> Overlay {
        self.bytes = 0;
        self.last_flush = std::time::Instant::now();
        std::mem::take(&mut self.live)
    }

    /// Adopts the flush in flight once its thread is done (or, with
    /// `wait`, after waiting for it): the tables then hold its overlay.
    pub(super) fn adopt_flush(&mut self, wait: bool) -> Result<()> {
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
        // Unshared: the flush thread drops its copy before it reports.
        self.keep_flushed(Arc::unwrap_or_clone(f.overlay));
        self.adopt_filter(rebuilt);
        Ok(())
    }

    pub(super) fn reopen_base(&mut self, durable: bool) -> Result<()> {
        self.base = open_read(&self.db, DATA)?;
        self.base_history = open_read(&self.db, HISTORY)?;
        self.base_sessions = open_read(&self.db, SESSIONS)?;
        if durable {
            self.last_durable = self.last_flush;
        }
        Ok(())
    }

    /// Forgets the overlays when a snapshot replaced the tables (the
    /// caller finished any flush first, see `adopt_flush`).
    pub(super) fn discard(&mut self) -> Result<()> {
        debug_assert!(self.flushing.is_none());
        // The snapshot's commit wrote every row of its leases (invariant
        // 9): rows of the state it replaced must not follow them.
        self.lease_rows.clear();
        self.take_live();
        self.reopen_base(false)?;
        self.flushed.clear();
        self.filter = filter_of(&self.base)?;
        Ok(())
    }

    /// The overlays, oldest first (the one in flight, then the live one):
    /// a later write to a key wins.
    pub(super) fn overlays(&self) -> impl DoubleEndedIterator<Item = &Overlay> {
        let flushing = self.flushing.as_ref().map(|f| &*f.overlay);
        flushing.into_iter().chain(std::iter::once(&self.live))
    }

    /// The value at `key` below the live overlay.
    pub(super) fn get_below_live(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        match self.flushing.as_ref().and_then(|f| f.overlay.data.get(key)) {
            Some(written) => Ok(written.clone()),
            // Invariant 8: not in the filter, so not in the tables.
            None if !self.filter.may_contain(key) => Ok(None),
            None => get_in(&self.base, key),
        }
    }
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
        // Invariant 10: the base's length and the overlays' deltas, with
        // no key read (a status probe ran this once per key written).
        let base = self.base.len().map_err(storage)? as i64;
        let delta: i64 = self.overlays().map(|o| o.keys_delta).sum();
        Ok((base + delta).max(0) as u64)
    }

    fn events(&self, from: u64, prefix: &[u8]) -> Result<Vec<Event>> {
        let from = (self.flushed.iter())
            .chain(self.overlays())
            .filter_map(|o| o.forget_below)
            .fold(from, u64::max);
        // Invariant 11: a watch from a recent revision (every worker's, a
        // moment after it read the revision) reads no table; decoding
        // every record since `from` for each one cost the leader 40 % of
        // its time at 16,384 workers.
        let kept_from = (self.flushed.iter()).find_map(|o| o.history.keys().next().copied());
        let (mut out, kept) = match kept_from {
            Some(first) if from >= first => (Vec::new(), self.flushed.range(..)),
            _ => (
                events_in(&self.base_history, from, prefix)?,
                self.flushed.range(0..0),
            ),
        };
        for o in kept.chain(self.overlays()) {
            o.events_into(from, prefix, &mut out);
        }
        Ok(out)
    }

    fn session(&self, client: u128) -> Result<Option<ClientSession>> {
        // The newest overlay that wrote it, else the tables.
        if let Some(written) = self.overlays().rev().find_map(|o| o.sessions.get(&client)) {
            return Ok(written.clone());
        }
        let got = self.base_sessions.get(client).map_err(storage)?;
        got.map(|v| postcard::from_bytes(v.value()).map_err(storage))
            .transpose()
    }

    fn idle_sessions(&self, before_ms: u64) -> Result<Vec<u128>> {
        let mut all = BTreeMap::new();
        for item in self.base_sessions.iter().map_err(storage)? {
            let (client, v) = item.map_err(storage)?;
            let s: ClientSession = postcard::from_bytes(v.value()).map_err(storage)?;
            all.insert(client.value(), s.last_ms);
        }
        for o in self.overlays() {
            for (client, s) in &o.sessions {
                match s {
                    Some(s) => all.insert(*client, s.last_ms),
                    None => all.remove(client),
                };
            }
        }
        Ok(all
            .into_iter()
            .filter(|(_, last)| *last < before_ms)
            .map(|(c, _)| c)
            .collect())
    }
}

impl TablesMut for SmTables {
    fn insert(&mut self, kv: &KeyValue, created: bool) -> Result<()> {
        self.bytes += kv.key.len() + kv.value.len();
        self.live.keys_delta += i64::from(created);
        self.filter.insert(&kv.key);
        self.live.data.insert(kv.key.clone(), Some(kv.clone()));
        Ok(())
    }

    fn remove(&mut self, key: &[u8]) -> Result<bool> {
        let existed = self.get(key)?.is_some();
        self.live.keys_delta -= i64::from(existed);
        self.bytes += key.len();
        self.live.data.insert(key.to_vec(), None);
        Ok(existed)
    }

    fn record(&mut self, revision: u64, events: &[Event]) -> Result<()> {
        self.bytes += events.iter().map(Event::payload_bytes).sum::<usize>();
        self.live.record(revision, events);
        Ok(())
    }

    /// Only records the bound: reads skip what is below it, and the flush
    /// drops it from the table and never writes it from the overlay.
    fn forget_below(&mut self, revision: u64) -> Result<()> {
        let bound = self.overlays().filter_map(|o| o.forget_below).max();
        self.live.forget_below = Some(bound.unwrap_or(0).max(revision));
        Ok(())
    }

    fn set_session(&mut self, client: u128, session: Option<ClientSession>) -> Result<()> {
        // A session is a few dozen bytes a call in flight: the overlay's
        // byte bound is for values, so count a nominal size.
        self.bytes += 64;
        self.live.sessions.insert(client, session);
        Ok(())
    }

    /// Copies the session into the live overlay once, where an older
    /// overlay or the tables hold it; changed there from then on.
    fn session_mut(&mut self, client: u128) -> Result<Option<&mut ClientSession>> {
        if !self.live.sessions.contains_key(&client) {
            let Some(kept) = self.session(client)? else {
                return Ok(None);
            };
            self.set_session(client, Some(kept))?;
        }
        Ok(self.live.sessions.get_mut(&client).and_then(Option::as_mut))
    }
}

/// The state as a commit writes it (invariant 9).
pub(super) struct StateRows {
    /// The state without its leases.
    core: Vec<u8>,
    /// The lease rows changed since the last commit (`None`: gone).
    leases: Vec<(u64, Option<Vec<u8>>)>,
}

impl StateRows {
    /// Encodes `state` on the apply thread: the encoding, not a clone,
    /// crosses to the flush thread (a clone of every lease, and freeing
    /// it afterwards, cost more than encoding it).
    pub(super) fn take(state: &mut KvState) -> Result<StateRows> {
        Ok(StateRows {
            core: state.encode_without_leases()?,
            leases: state.take_changed_leases()?,
        })
    }
}

/// Records the state's rows and Raft's bookkeeping in `txn` and commits it.
pub(super) fn commit_with_state(
    mut txn: WriteTransaction,
    state: &StateRows,
    applied: Option<LogId<NodeId>>,
    membership: &StoredMembership<NodeId, Node>,
    durable: bool,
) -> Result<()> {
    {
        let mut leases = txn.open_table(LEASES).map_err(storage)?;
        for (id, row) in &state.leases {
            match row {
                Some(row) => leases.insert(id, row.as_slice()).map_err(storage)?,
                None => leases.remove(id).map_err(storage)?,
            };
        }
        let mut sm = txn.open_table(SM).map_err(storage)?;
        sm.insert(STATE, state.core.as_slice()).map_err(storage)?;
        let applied = postcard::to_allocvec(&applied).map_err(storage)?;
        sm.insert(APPLIED, applied.as_slice()).map_err(storage)?;
        sm.insert(LEASES_AT, applied.as_slice()).map_err(storage)?;
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

/// The state `txn` holds, `None` in a new file: [`STATE`] with the lease
/// rows, or, where an older build wrote last, `STATE` alone with every
/// lease counted as changed and the stale rows dropped (invariant 9).
pub(super) fn read_state(txn: &WriteTransaction) -> Result<Option<KvState>> {
    let sm = txn.open_table(SM).map_err(storage)?;
    let Some(core) = sm.get(STATE).map_err(storage)? else {
        return Ok(None);
    };
    let mut state: KvState = postcard::from_bytes(core.value()).map_err(storage)?;
    let get = |key| -> Result<Option<Vec<u8>>> {
        Ok(sm.get(key).map_err(storage)?.map(|v| v.value().to_vec()))
    };
    let rows_current = matches!(get(LEASES_AT)?, Some(at) if Some(&at) == get(APPLIED)?.as_ref());
    let mut leases = txn.open_table(LEASES).map_err(storage)?;
    if rows_current {
        for row in leases.iter().map_err(storage)? {
            let (id, row) = row.map_err(storage)?;
            state.add_stored_lease(id.value(), row.value())?;
        }
    } else {
        leases.retain(|_, _| false).map_err(storage)?;
        state.mark_all_leases_changed();
    }
    Ok(Some(state))
}

pub(super) fn read_sm<T: for<'de> Deserialize<'de>>(
    txn: &ReadTransaction,
    key: &str,
) -> StorageResult<Option<T>> {
    let table = txn.open_table(SM).map_err(|e| sm_err(ErrorVerb::Read, e))?;
    let got = table.get(key).map_err(|e| sm_err(ErrorVerb::Read, e))?;
    got.map(|v| postcard::from_bytes(v.value()))
        .transpose()
        .map_err(|e| sm_err(ErrorVerb::Read, e))
}
