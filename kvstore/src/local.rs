//! A replica's applied state with change notifications: the part of a
//! backend that answers reads, blocking gets, barrier waits and watches.
//!
//! Invariants:
//! 1. No lost wake-up: a waiter subscribes to change notifications before it
//!    first looks at the state, so a change applied in between is either
//!    seen by the look or wakes the wait.
//! 2. A watcher sees every event with revision >= its start exactly once, in
//!    revision order: it subscribes to live events before reading history
//!    and skips live events at or below the last historical revision.

use std::sync::Mutex;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use crate::error::{KvError, Result};
use crate::state::{Event, KvState, MemTables, Output, Request, TablesMut};
use crate::store::WatchStream;

struct Inner<S> {
    state: KvState,
    store: S,
}

/// Applied state plus notifications.
pub struct LocalState<S> {
    inner: Mutex<Inner<S>>,
    revision: watch::Sender<u64>,
    events: broadcast::Sender<Event>,
}

impl<S: TablesMut + Send> LocalState<S> {
    pub fn new(state: KvState, store: S) -> LocalState<S> {
        let (revision, _) = watch::channel(state.revision());
        let (events, _) = broadcast::channel(16 * 1024);
        LocalState {
            inner: Mutex::new(Inner { state, store }),
            revision,
            events,
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
        finish: impl FnOnce(&KvState, &mut S) -> Result<()>,
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
        Ok(())
    }

    fn publish(&self, events: Vec<Event>, revision: u64) {
        for e in events {
            // No receivers is fine: nobody watches.
            let _ = self.events.send(e);
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

    /// The value at `key` now.
    pub fn try_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.read(|_, t| t.get(key)).map(|kv| kv.map(|kv| kv.value))
    }

    /// Blocking get.
    pub async fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        self.wait_for(deadline, |_, t| {
            t.get(key).transpose().map(|r| r.map(|kv| kv.value))
        })
        .await
        .unwrap_or_else(|| {
            Err(KvError::DeadlineExceeded {
                what: format!("waiting for key `{}`", crate::show_key(key)),
                after: timeout,
            })
        })
    }

    /// Changes under `prefix` from `from` on, then live (invariant 2).
    pub fn watch(&self, prefix: &[u8], from: u64) -> Result<WatchStream> {
        let rx = self.events.subscribe();
        let (history, last) = {
            let s = self.lock();
            (
                s.state.events_since(&s.store, from.max(1), prefix)?,
                s.state.revision(),
            )
        };
        let prefix = prefix.to_vec();
        let live = futures::stream::unfold(Some(rx), move |rx| {
            let prefix = prefix.clone();
            async move {
                let mut rx = rx?;
                loop {
                    match rx.recv().await {
                        Ok(e) if e.revision() > last && e.key().starts_with(&prefix) => {
                            return Some((Ok(e), Some(rx)))
                        }
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            let err = KvError::Unavailable(format!(
                                "watcher fell {n} events behind; watch again from the last revision seen + 1"
                            ));
                            return Some((Err(err), None));
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        });
        Ok(futures::stream::iter(history.into_iter().map(Ok))
            .chain(live)
            .boxed())
    }
}

impl LocalState<MemTables> {
    /// Applies one request (memory cannot fail).
    pub fn apply(&self, req: &Request) -> Result<Output> {
        self.apply_batch([req], |_, _| Ok(()))?
            .pop()
            .unwrap_or_else(|| Err(KvError::Internal("no result".into())))
    }
}
