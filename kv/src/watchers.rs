//! The live watchers of an [`crate::AppliedState`], indexed by prefix: a
//! batch of events reaches only the watchers whose prefix covers one of
//! its keys.
//!
//! Invariants:
//! 1. Publishing a batch costs a hash lookup per event and distinct prefix
//!    length in use, and a message per watcher it concerns: not a wake-up
//!    of every watcher (thousands of workers each watch their own
//!    assignments, and every batch woke them all).
//! 2. A watcher gets, for each batch, exactly the batch's events under its
//!    prefix, in order, as one message; batches arrive in publishing order.
//! 3. A watcher [`BACKLOG`] messages behind is dropped from the index; it
//!    reads what it has, then learns that it fell behind.
//! 4. Once the index is closed (its state is gone), every watcher ends
//!    after what it has.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::state::Event;

/// Messages a watcher may fall behind before it is dropped (invariant 3).
pub(crate) const BACKLOG: usize = 1024;

/// One batch's events for one watcher.
type Batch = Arc<[Event]>;

/// Every live watcher, by prefix.
#[derive(Default)]
pub(crate) struct Watchers {
    index: Mutex<Index>,
}

#[derive(Default)]
struct Index {
    by_prefix: HashMap<Vec<u8>, Vec<Entry>>,
    /// How many prefixes of each length are in `by_prefix` (invariant 1).
    lengths: BTreeMap<usize, usize>,
    next_id: u64,
    closed: bool,
}

struct Entry {
    id: u64,
    tx: mpsc::Sender<Batch>,
    lagged: Arc<AtomicBool>,
}

/// A watcher's place in the index, given up on drop.
pub(crate) struct Subscription {
    rx: mpsc::Receiver<Batch>,
    lagged: Arc<AtomicBool>,
    watchers: Arc<Watchers>,
    prefix: Vec<u8>,
    id: u64,
}

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new watcher of `prefix`: it gets every batch published from now on.
    pub(crate) fn subscribe(self: &Arc<Self>, prefix: &[u8]) -> Subscription {
        let (tx, rx) = mpsc::channel(BACKLOG);
        let lagged = Arc::new(AtomicBool::new(false));
        let mut index = self.lock();
        let id = index.next_id;
        index.next_id += 1;
        if !index.closed {
            index.add(
                prefix,
                Entry {
                    id,
                    tx,
                    lagged: lagged.clone(),
                },
            );
        }
        Subscription {
            rx,
            lagged,
            watchers: self.clone(),
            prefix: prefix.to_vec(),
            id,
        }
    }

    /// Hands each watcher the events of `events` under its prefix
    /// (invariants 1-3).
    pub(crate) fn publish(&self, events: &[Event]) {
        let mut index = self.lock();
        if index.by_prefix.is_empty() {
            return;
        }
        // Per watcher, in the order first reached: its events, in order.
        let mut out: Vec<(&Vec<u8>, &Entry, Vec<Event>)> = Vec::new();
        let mut slot: HashMap<u64, usize> = HashMap::new();
        for e in events {
            let key = e.key();
            for &len in index.lengths.keys() {
                if len > key.len() {
                    break;
                }
                let Some((prefix, entries)) = index.by_prefix.get_key_value(&key[..len]) else {
                    continue;
                };
                for w in entries {
                    let i = *slot.entry(w.id).or_insert_with(|| {
                        out.push((prefix, w, Vec::new()));
                        out.len() - 1
                    });
                    out[i].2.push(e.clone());
                }
            }
        }
        let mut gone = Vec::new();
        for (prefix, w, batch) in out {
            match w.tx.try_send(batch.into()) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    w.lagged.store(true, Ordering::Relaxed);
                    gone.push((prefix.clone(), w.id));
                }
                Err(mpsc::error::TrySendError::Closed(_)) => gone.push((prefix.clone(), w.id)),
            }
        }
        for (prefix, id) in gone {
            index.remove(&prefix, id);
        }
    }

    /// Ends every watcher after what it has (invariant 4).
    pub(crate) fn close(&self) {
        let mut index = self.lock();
        index.closed = true;
        index.by_prefix.clear();
        index.lengths.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_prefix.values().map(Vec::len).sum()
    }
}

impl Index {
    fn add(&mut self, prefix: &[u8], entry: Entry) {
        let entries = self.by_prefix.entry(prefix.to_vec()).or_default();
        if entries.is_empty() {
            *self.lengths.entry(prefix.len()).or_default() += 1;
        }
        entries.push(entry);
    }

    fn remove(&mut self, prefix: &[u8], id: u64) {
        let Some(entries) = self.by_prefix.get_mut(prefix) else {
            return;
        };
        entries.retain(|e| e.id != id);
        if entries.is_empty() {
            self.by_prefix.remove(prefix);
            if let Some(n) = self.lengths.get_mut(&prefix.len()) {
                *n -= 1;
                if *n == 0 {
                    self.lengths.remove(&prefix.len());
                }
            }
        }
    }
}

impl Subscription {
    /// The next batch for this watcher: `Ok(None)` once the state is gone,
    /// `Err(())` once it fell behind (invariants 3, 4).
    pub(crate) async fn recv(&mut self) -> Result<Option<Batch>, ()> {
        match self.rx.recv().await {
            Some(b) => Ok(Some(b)),
            None if self.lagged.load(Ordering::Relaxed) => Err(()),
            None => Ok(None),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.watchers.lock().remove(&self.prefix, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::KeyValue;

    fn put(key: &str, revision: u64) -> Event {
        Event::Put(KeyValue {
            key: key.into(),
            value: vec![],
            create_revision: revision,
            mod_revision: revision,
            lease: None,
        })
    }

    fn keys(b: &[Event]) -> Vec<&[u8]> {
        b.iter().map(Event::key).collect()
    }

    #[tokio::test]
    async fn a_watcher_gets_only_its_prefix_one_message_a_batch_and_leaves_on_drop() {
        let w = Arc::new(Watchers::default());
        let mut a = w.subscribe(b"a/");
        let mut all = w.subscribe(b"");
        let mut ab = w.subscribe(b"a/b");
        w.publish(&[put("a/1", 1), put("b/1", 1), put("a/b2", 1)]);
        w.publish(&[put("c", 2)]);
        let got = a.recv().await.unwrap().unwrap();
        assert_eq!(keys(&got), [&b"a/1"[..], b"a/b2"]);
        let got = all.recv().await.unwrap().unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(keys(&all.recv().await.unwrap().unwrap()), [&b"c"[..]]);
        assert_eq!(keys(&ab.recv().await.unwrap().unwrap()), [&b"a/b2"[..]]);
        assert!(a.rx.try_recv().is_err(), "nothing under a/ in batch 2");
        assert_eq!(w.len(), 3);
        drop(ab);
        drop(all);
        assert_eq!(w.len(), 1);
        assert_eq!(w.lock().lengths.keys().copied().collect::<Vec<_>>(), [2]);
        w.close();
        assert_eq!(a.recv().await, Ok(None), "ended with its state");
    }

    #[tokio::test]
    async fn a_watcher_that_falls_behind_reads_what_it_has_then_learns_so() {
        let w = Arc::new(Watchers::default());
        let mut slow = w.subscribe(b"k");
        for r in 0..=BACKLOG as u64 {
            w.publish(&[put("k", r + 1)]);
        }
        assert_eq!(w.len(), 0, "dropped from the index");
        for _ in 0..BACKLOG {
            assert!(slow.recv().await.unwrap().is_some());
        }
        assert_eq!(slow.recv().await, Err(()));
    }
}
