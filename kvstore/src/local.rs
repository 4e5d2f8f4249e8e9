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
use crate::state::{Event, KvState, Output, Request};
use crate::store::WatchStream;

/// Applied state plus notifications.
pub struct LocalState {
    state: Mutex<KvState>,
    revision: watch::Sender<u64>,
    events: broadcast::Sender<Event>,
}

impl LocalState {
    pub fn new(state: KvState) -> LocalState {
        let (revision, _) = watch::channel(state.revision());
        let (events, _) = broadcast::channel(16 * 1024);
        LocalState {
            state: Mutex::new(state),
            revision,
            events,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KvState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a request and notifies waiters and watchers.
    pub fn apply(&self, req: &Request) -> Result<Output> {
        let (result, events, revision) = {
            let mut s = self.lock();
            let (r, ev) = s.apply(req);
            (r, ev, s.revision())
        };
        self.publish(events, revision);
        result
    }

    /// Replaces the whole state (snapshot installation) and wakes everyone.
    pub fn replace(&self, state: KvState) {
        let revision = state.revision();
        *self.lock() = state;
        self.revision.send_replace(revision);
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
    pub fn read<T>(&self, f: impl FnOnce(&KvState) -> T) -> T {
        f(&self.lock())
    }

    /// A copy of the state (for snapshots).
    pub fn snapshot(&self) -> KvState {
        self.lock().clone()
    }

    /// Waits until `f` returns `Some` or `deadline` passes (invariant 1).
    pub async fn wait_for<T>(
        &self,
        deadline: Instant,
        f: impl Fn(&KvState) -> Option<T>,
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

    /// Blocking get.
    pub async fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        self.wait_for(deadline, |s| s.get(key).map(|kv| kv.value.clone()))
            .await
            .ok_or_else(|| KvError::DeadlineExceeded {
                what: format!("waiting for key `{}`", crate::show_key(key)),
                after: timeout,
            })
    }

    /// Changes under `prefix` from `from` on, then live (invariant 2).
    pub fn watch(&self, prefix: &[u8], from: u64) -> Result<WatchStream> {
        let rx = self.events.subscribe();
        let (history, last) = {
            let s = self.lock();
            (s.events_since(from.max(1), prefix)?, s.revision())
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
