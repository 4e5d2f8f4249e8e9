//! Applied batches waiting to be flushed, and the flush thread (invariants of the module).

use super::*;

/// Writes applied since a flush began (`None` in `data`: removed).
#[derive(Default, Clone)]
pub(super) struct Overlay {
    pub(super) data: BTreeMap<Vec<u8>, Option<KeyValue>>,
    pub(super) history: BTreeMap<u64, Vec<Event>>,
    /// (key, revision) of every event in `history` (invariant 12).
    pub(super) keyed: BTreeSet<(Vec<u8>, u64)>,
    pub(super) forget_below: Option<u64>,
    /// Client sessions written (`None`: forgotten).
    pub(super) sessions: BTreeMap<u128, Option<ClientSession>>,
    /// Keys created less keys removed: the tables' count is the base's
    /// plus the overlays' (invariant 10).
    pub(super) keys_delta: i64,
}

impl Overlay {
    pub(super) fn entries(&self) -> usize {
        self.data.len() + self.history.len() + self.sessions.len()
    }

    /// Its revisions and indexed events: what a kept overlay counts
    /// against `KEPT_ENTRIES` (invariant 11).
    pub(super) fn history_entries(&self) -> usize {
        self.history.len() + self.keyed.len()
    }

    /// Adds `events`, all of `revision`, to the history and its index.
    pub(super) fn record(&mut self, revision: u64, events: &[Event]) {
        for e in events {
            self.keyed.insert((e.key().to_vec(), revision));
        }
        let of_revision = self.history.entry(revision).or_default();
        of_revision.extend(events.iter().cloned());
    }

    /// Appends this overlay's events under `prefix` from revision `from`
    /// to `out`, in revision order: through the index where it answers
    /// (invariant 12), else from every revision since `from`.
    pub(super) fn events_into(&self, from: u64, prefix: &[u8], out: &mut Vec<Event>) {
        let mut add = |events: &Vec<Event>| {
            out.extend(
                events
                    .iter()
                    .filter(|e| e.key().starts_with(prefix))
                    .cloned(),
            )
        };
        match self.revisions_under(from, prefix) {
            Some(revisions) => revisions
                .iter()
                .filter_map(|r| self.history.get(r))
                .for_each(&mut add),
            None => self.history.range(from..).for_each(|(_, e)| add(e)),
        }
    }

    /// The revisions from `from` on with an event under `prefix`, sorted,
    /// from the index; `None` for no prefix (every event is under it) or
    /// one with more than `INDEX_BUDGET` events here (invariant 12).
    fn revisions_under(&self, from: u64, prefix: &[u8]) -> Option<Vec<u64>> {
        if prefix.is_empty() {
            return None;
        }
        let mut under = (self.keyed.range((prefix.to_vec(), 0)..))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|&(_, r)| r);
        let mut revisions: Vec<u64> = under.by_ref().take(INDEX_BUDGET).collect();
        if under.next().is_some() {
            return None;
        }
        revisions.retain(|&r| r >= from);
        revisions.sort_unstable();
        revisions.dedup();
        Some(revisions)
    }
}

/// What a flush commits with the overlay (invariant 1).
pub(super) struct FlushCommit {
    /// The state's rows changed since the last flush (invariant 9).
    pub(super) state: StateRows,
    pub(super) applied: Option<LogId<NodeId>>,
    pub(super) membership: StoredMembership<NodeId, Node>,
    pub(super) durable: bool,
    /// Build a new key filter from the committed tables (invariant 8).
    pub(super) rebuild_filter: bool,
}

/// What a flush reports: the key filter it built when asked (invariant 8).
pub(super) type FlushResult = Result<Option<KeyFilter>>;

/// An overlay being written by the flush thread (invariant 6).
pub(super) struct Flushing {
    pub(super) overlay: Arc<Overlay>,
    pub(super) durable: bool,
}

/// The thread that writes overlays, one per state machine for its life
/// (invariant 6), rather than a new thread (a clone, a fresh stack, a
/// fresh allocator heap) for each of up to ten flushes a second. With at
/// most one flush in flight, one result channel serves them all: the
/// result in it is the flush in flight's.
pub(super) struct Flusher {
    pub(super) jobs: Option<std::sync::mpsc::Sender<(Arc<Overlay>, FlushCommit)>>,
    pub(super) results: std::sync::mpsc::Receiver<FlushResult>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl Flusher {
    pub(super) fn start(db: Arc<Database>) -> Result<Flusher> {
        let (jobs, queue) = std::sync::mpsc::channel::<(Arc<Overlay>, FlushCommit)>();
        let (done, results) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("state-flush".into())
            .spawn(move || {
                lower_priority();
                for (overlay, commit) in queue {
                    let written = write_overlay(&db, &overlay, &commit);
                    // Before the result: the state machine then holds the
                    // only copy, and keeps its history without a clone.
                    drop((overlay, commit));
                    let _ = done.send(written);
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
    pub(super) fn flush(&self, overlay: Arc<Overlay>, commit: FlushCommit) -> Result<()> {
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

/// The flush thread's nice value: background work, which a replica's
/// latency-bound threads (its QUIC thread, Raft core, log writer and
/// apply) preempt. A flush is CPU work in bursts (a second's changed
/// rows, B-tree inserts: 5-20 ms at 16,384 beating workers) that
/// delayed every write which met it: a client put's p99 was a flush's
/// length (`tessel-bench heartbeat`; docs/performance.md). Under
/// sustained load it still runs (nice is a weight, not a gate), and a
/// full overlay makes the apply wait for it (invariant 6): 16,384 hosts'
/// bootstrap, which saturates the cores, was no slower in 3 pairs.
const FLUSH_NICE: i32 = 10;

/// Lowers this thread's priority to [`FLUSH_NICE`]; where the system
/// refuses, it runs as it was.
fn lower_priority() {
    let thread = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(thread), FLUSH_NICE) {
        tracing::debug!("the state-flush thread keeps its priority: {e}");
    }
}

/// Writes `o` and `c` to `db` in one transaction (invariants 1, 5); then,
/// when asked, builds a key filter of the committed tables (invariant 8).
pub(super) fn write_overlay(
    db: &Database,
    o: &Overlay,
    c: &FlushCommit,
) -> Result<Option<KeyFilter>> {
    let started = std::time::Instant::now();
    let result = write_overlay_once(db, o, c);
    let kind = if c.durable { "durable" } else { "buffered" };
    metrics::histogram!("tessel_kv_state_flush_seconds", "kind" => kind)
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("tessel_kv_state_flushed_keys_total").increment(o.data.len() as u64);
    if result.is_err() {
        // A full or failing disk; the Raft core stops on it next (`node`
        // invariant 7).
        metrics::counter!("tessel_kv_state_flush_failures_total").increment(1);
    }
    result?;
    if !c.rebuild_filter {
        return Ok(None);
    }
    filter_of(&open_read(db, DATA)?).map(Some)
}

pub(super) fn write_overlay_once(db: &Database, o: &Overlay, c: &FlushCommit) -> Result<()> {
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
        let mut sessions = txn.open_table(SESSIONS).map_err(storage)?;
        for (client, s) in &o.sessions {
            match s {
                Some(s) => {
                    let bytes = postcard::to_allocvec(s).map_err(storage)?;
                    sessions.insert(client, bytes.as_slice()).map_err(storage)?;
                }
                None => {
                    sessions.remove(client).map_err(storage)?;
                }
            }
        }
    }
    commit_with_state(txn, &c.state, c.applied, &c.membership, c.durable)
}
