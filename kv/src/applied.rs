//! A replica's applied state with change notifications: the part of a
//! backend that answers reads, blocking gets, barrier waits and watches.
//!
//! Invariants:
//! 1. No lost wake-up: a waiter subscribes before it first looks at the
//!    state, so a change in between is seen by the look or wakes the wait.
//! 2. A watcher sees every event from its start revision exactly once, in
//!    order: it subscribes before reading history and skips replayed ones.
//! 3. Live events are published once per batch to the watchers of the
//!    prefixes they fall under (`watchers`): a watcher wakes only for a
//!    batch with events for it.
//! 4. A blocking get waits on its key alone: a batch wakes the gets of the
//!    keys it wrote, not every waiter (thousands of processes wait on one
//!    topology key while thousands of others write theirs).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::error::{KvError, Result};
use crate::state::{Event, KvState, MemTables, Output, Request, TablesMut};
use crate::store::{Listing, WatchStream};
use crate::watchers::{Subscription, Watchers};

struct Inner<S> {
    state: KvState,
    store: S,
}

/// Applied state plus notifications.
pub struct AppliedState<S> {
    inner: Mutex<Inner<S>>,
    revision: watch::Sender<u64>,
    /// Invariant 3.
    watchers: Arc<Watchers>,
    /// Invariant 4.
    keys: Mutex<KeyWaiters>,
}

/// The keys blocking gets wait for, each with how many wait (invariant 4).
type KeyWaiters = HashMap<Vec<u8>, (Arc<Notify>, usize)>;

/// A blocking get's place in [`AppliedState::keys`], given up on drop.
struct KeyWait<'a> {
    keys: &'a Mutex<KeyWaiters>,
    key: &'a [u8],
    notify: Arc<Notify>,
}

impl Drop for KeyWait<'_> {
    fn drop(&mut self) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, n)) = keys.get_mut(self.key) {
            *n -= 1;
            if *n == 0 {
                keys.remove(self.key);
            }
        }
    }
}

impl<S: TablesMut + Send> AppliedState<S> {
    /// Serves `state` over `store`.
    pub fn new(state: KvState, store: S) -> AppliedState<S> {
        let (revision, _) = watch::channel(state.revision());
        AppliedState {
            inner: Mutex::new(Inner { state, store }),
            revision,
            watchers: Arc::default(),
            keys: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<S>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies requests in order, hands the state and the tables to
    /// `finish` (which may commit them), then notifies waiters and
    /// watchers. The outer `Err` is a storage failure: nothing is published
    /// and the replica must stop.
    pub fn apply_batch<'r>(
        &self,
        reqs: impl IntoIterator<Item = &'r Request>,
        finish: impl FnOnce(&mut KvState, &mut S) -> Result<()>,
    ) -> Result<Vec<Result<Output>>> {
        let (results, events, revision) = {
            let mut guard = self.lock();
            let Inner { state, store } = &mut *guard;
            let mut results = Vec::new();
            let mut events = Vec::new();
            for req in reqs {
                let (r, ev) = state.apply(store, req)?;
                results.push(r);
                events.extend(ev);
            }
            finish(state, store)?;
            (results, events, state.revision())
        };
        self.publish(events, revision);
        Ok(results)
    }

    /// Changes the state and its tables under the lock (a snapshot
    /// installed, a forced flush), then wakes everyone.
    pub fn update(&self, f: impl FnOnce(&mut KvState, &mut S) -> Result<()>) -> Result<()> {
        let revision = {
            let mut guard = self.lock();
            let Inner { state, store } = &mut *guard;
            f(state, store)?;
            state.revision()
        };
        self.revision.send_replace(revision);
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        for (notify, _) in keys.values() {
            notify.notify_waiters();
        }
        Ok(())
    }

    fn publish(&self, events: Vec<Event>, revision: u64) {
        {
            let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            if !keys.is_empty() {
                for e in &events {
                    if let Event::Put(kv) = e {
                        if let Some((notify, _)) = keys.get(&kv.key) {
                            notify.notify_waiters();
                        }
                    }
                }
            }
        }
        if !events.is_empty() {
            self.watchers.publish(&events);
        }
        // Always notify: barrier and lease outcomes change without events.
        self.revision.send_modify(|r| *r = revision);
    }

    /// Notified after every change (the value is the revision).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// Reads the state.
    pub fn read<T>(&self, f: impl FnOnce(&KvState, &S) -> T) -> T {
        let guard = self.lock();
        f(&guard.state, &guard.store)
    }

    /// A copy of the small part of the state.
    pub fn state(&self) -> KvState {
        self.lock().state.clone()
    }

    /// Waits until `f` returns `Some` or `deadline` passes (invariant 1).
    pub async fn wait_for<T>(
        &self,
        deadline: Instant,
        f: impl Fn(&KvState, &S) -> Option<T>,
    ) -> Option<T> {
        let mut rx = self.revision.subscribe();
        loop {
            if let Some(v) = self.read(&f) {
                return Some(v);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                // Deadline passed, or the state is being torn down.
                _ => return self.read(&f),
            }
        }
    }

    /// The pairs under `prefix` now, with the revision they are at: one
    /// read of the state.
    pub fn list_at(&self, prefix: &[u8]) -> Result<Listing> {
        self.read(|s, t| {
            Ok(Listing {
                pairs: t.list(prefix)?,
                revision: s.revision(),
            })
        })
    }

    /// The value at `key` now.
    pub fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(|_, t| t.get(key)).map(|kv| kv.map(|kv| kv.value))
    }

    /// Blocking get (invariants 1 and 4).
    pub async fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let wait = self.wait_on(key);
        let look = || self.read(|_, t| t.get(key).transpose());
        loop {
            let notified = wait.notify.notified();
            tokio::pin!(notified);
            // Invariant 1: registered before the look.
            notified.as_mut().enable();
            if let Some(r) = look() {
                return r.map(|kv| kv.value);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        look().map_or_else(
            || {
                Err(KvError::DeadlineExceeded {
                    what: format!("waiting for key `{}`", crate::show_key(key)),
                    after: timeout,
                })
            },
            |r| r.map(|kv| kv.value),
        )
    }

    fn wait_on<'a>(&'a self, key: &'a [u8]) -> KeyWait<'a> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let (notify, n) = keys
            .entry(key.to_vec())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        *n += 1;
        KeyWait {
            keys: &self.keys,
            key,
            notify: notify.clone(),
        }
    }

    /// Changes under `prefix` from `from` on, then live (invariant 2).
    pub fn watch(&self, prefix: &[u8], from: u64) -> Result<WatchStream> {
        let sub = self.watchers.subscribe(prefix);
        let (history, last) = {
            let s = self.lock();
            (
                s.state.events_since(&s.store, from.max(1), prefix)?,
                s.state.revision(),
            )
        };
        let live = futures::stream::unfold(
            Some(LiveEvents {
                sub,
                after: last,
                batch: Arc::from([]),
                next: 0,
            }),
            |live| async move {
                let mut live = live?;
                match live.next().await {
                    Ok(Some(e)) => Some((Ok(e), Some(live))),
                    Ok(None) => None,
                    Err(e) => Some((Err(e), None)),
                }
            },
        );
        Ok(futures::stream::iter(history.into_iter().map(Ok))
            .chain(live)
            .boxed())
    }
}

/// A watcher's live events: the batches published after it subscribed
/// (invariant 3), from revision `after + 1` on (invariant 2).
struct LiveEvents {
    sub: Subscription,
    after: u64,
    batch: Arc<[Event]>,
    /// The first event of `batch` not yet looked at.
    next: usize,
}

impl LiveEvents {
    /// The next event under the prefix; `None` once the state is gone.
    async fn next(&mut self) -> Result<Option<Event>> {
        loop {
            while let Some(e) = self.batch.get(self.next) {
                self.next += 1;
                if e.revision() > self.after {
                    return Ok(Some(e.clone()));
                }
            }
            match self.sub.recv().await {
                Ok(Some(batch)) => (self.batch, self.next) = (batch, 0),
                Ok(None) => return Ok(None),
                Err(()) => {
                    return Err(KvError::Unavailable(format!(
                        "watcher fell {} batches of events behind; watch again from the last revision seen + 1",
                        crate::watchers::BACKLOG
                    )))
                }
            }
        }
    }
}

impl<S> Drop for AppliedState<S> {
    fn drop(&mut self) {
        // Watches end with the state (`watchers` invariant 4).
        self.watchers.close();
    }
}

impl AppliedState<MemTables> {
    /// Applies one request (memory cannot fail).
    pub fn apply(&self, req: &Request) -> Result<Output> {
        self.apply_batch([req], |_, _| Ok(()))?
            .pop()
            .unwrap_or_else(|| Err(KvError::Internal("no result".into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Limits, Op};
    use futures::FutureExt;

    fn applied() -> AppliedState<MemTables> {
        AppliedState::new(
            KvState::new(Limits::default(), 100_000),
            MemTables::default(),
        )
    }

    fn put(key: &str) -> Request {
        Request {
            now_ms: 0,
            op: Op::Put {
                key: key.into(),
                value: b"v".to_vec(),
                lease: None,
            },
        }
    }

    /// Invariants 2 and 3: from batches that mix prefixes, a watcher gets
    /// exactly the events under its own, once each, in revision order.
    #[tokio::test]
    async fn a_watcher_gets_only_its_prefix_from_shared_batches() {
        let l = applied();
        l.apply(&put("a/0")).unwrap();
        let mut a = l.watch(b"a/", 1).unwrap();
        let mut b = l.watch(b"b/", 1).unwrap();
        let batch = [put("b/1"), put("a/2"), put("c/3"), put("a/4")];
        l.apply_batch(&batch, |_, _| Ok(())).unwrap();
        l.apply(&put("b/5")).unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            let e = a.next().await.unwrap().unwrap();
            got.push((e.revision(), String::from_utf8(e.key().to_vec()).unwrap()));
        }
        assert_eq!(
            got,
            [(1, "a/0".into()), (3, "a/2".into()), (5, "a/4".into())]
        );
        let mut got = Vec::new();
        for _ in 0..2 {
            got.push(b.next().await.unwrap().unwrap().revision());
        }
        assert_eq!(got, [2, 6]);
        // Nothing else is under either prefix.
        l.apply(&put("c/7")).unwrap();
        assert!(a.next().now_or_never().is_none());
        assert!(b.next().now_or_never().is_none());
    }

    /// A watcher that falls more than the backlog behind gets what it
    /// has, in order, then is told to watch again, and the watch ends there.
    #[tokio::test]
    async fn a_watcher_that_falls_behind_is_told_to_watch_again() {
        let l = applied();
        let mut w = l.watch(b"k/", 1).unwrap();
        for i in 0..=crate::watchers::BACKLOG {
            l.apply(&put(&format!("k/{i}"))).unwrap();
        }
        for revision in 1..=crate::watchers::BACKLOG as u64 {
            assert_eq!(w.next().await.unwrap().unwrap().revision(), revision);
        }
        match w.next().await {
            Some(Err(KvError::Unavailable(m))) => assert!(m.contains("watch again"), "{m}"),
            other => panic!("expected the lag error, got {other:?}"),
        }
        assert!(w.next().await.is_none());
    }

    /// Invariant 4: each blocking get returns when its own key is written,
    /// not before (writes of other keys leave it waiting), the deadline
    /// still holds, and every waiter's place is given up when it returns.
    #[tokio::test]
    async fn a_blocking_get_waits_for_its_own_key_only() {
        let l = Arc::new(applied());
        let gets: Vec<_> = (0..100)
            .map(|i| {
                let l = l.clone();
                tokio::spawn(async move {
                    l.get(format!("k/{i}").as_bytes(), Duration::from_secs(10))
                        .await
                })
            })
            .collect();
        let expires = l.get(b"never", Duration::from_millis(50));
        for i in 0..100 {
            l.apply(&put(&format!("other/{i}"))).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(l.keys.lock().unwrap().len(), 100, "every get is waiting");
        assert!(gets.iter().all(|g| !g.is_finished()));
        assert!(matches!(
            expires.await,
            Err(KvError::DeadlineExceeded { .. })
        ));
        for i in 0..100 {
            l.apply(&put(&format!("k/{i}"))).unwrap();
        }
        for g in gets {
            assert_eq!(g.await.unwrap().unwrap(), b"v");
        }
        assert!(l.keys.lock().unwrap().is_empty());
        // A key already there answers at once.
        assert_eq!(l.get(b"k/1", Duration::ZERO).await.unwrap(), b"v");
    }
}
