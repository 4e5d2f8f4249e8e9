//! The registry kept current by a watch (as a Kubernetes informer keeps
//! its cache): listed once, then changed event by event, so a scheduler
//! pass reads it from memory instead of listing every worker's keys on
//! the leader twice a second (at 16,384 workers, 50,000 pairs a pass).
//!
//! Invariants:
//! 1. After [`RegistryView::workers`] the view holds what a listing at the
//!    revision of the last event it applied would: the watch starts at the
//!    revision read before the listing, and an event older than what the
//!    view holds for its key is skipped (a put) or ignored (a delete).
//! 2. A watch that ends or fails (a compacted start, a lost replica) drops
//!    the view, and the next call lists again: never a view with a gap.
//! 3. Only the events already delivered are applied: a call never waits
//!    for the watch.

use std::collections::BTreeMap;

use futures::FutureExt;
use futures::StreamExt;
use tessel_kv::{Event, KeyValue, KvStore, WatchStream};

use super::{statuses, WorkerStatus};
use crate::error::{CoordinatorError, Result};
use crate::keys;

/// The registry in memory, with the watch that keeps it current.
#[derive(Default)]
pub struct RegistryView {
    current: Option<Current>,
}

struct Current {
    pairs: BTreeMap<Vec<u8>, KeyValue>,
    events: WatchStream,
}

impl RegistryView {
    /// A view that lists on its first use.
    pub fn new() -> RegistryView {
        RegistryView::default()
    }

    /// Every registered worker, as [`super::list_workers`] would say.
    pub async fn workers(&mut self, kv: &dyn KvStore) -> Result<Vec<WorkerStatus>> {
        let mut current = match self.current.take() {
            Some(c) => c,
            None => Current::list(kv).await?,
        };
        // Invariants 2 and 3.
        let whole = current.catch_up();
        let workers = statuses(current.pairs.values());
        if whole {
            self.current = Some(current);
        }
        workers
    }
}

impl Current {
    async fn list(kv: &dyn KvStore) -> Result<Current> {
        let prefix = keys::WORKERS.as_bytes();
        let listing = kv
            .list_at(prefix)
            .await
            .map_err(CoordinatorError::kv("listing workers"))?;
        let events = kv
            .watch(prefix, listing.revision + 1)
            .await
            .map_err(CoordinatorError::kv("watching the registry"))?;
        let pairs = listing
            .pairs
            .into_iter()
            .map(|p| (p.key.clone(), p))
            .collect();
        Ok(Current { pairs, events })
    }

    /// Applies the events delivered so far; `false` when the watch ended.
    fn catch_up(&mut self) -> bool {
        loop {
            match self.events.next().now_or_never() {
                None => return true,
                Some(Some(Ok(event))) => self.apply(event),
                Some(Some(Err(_)) | None) => return false,
            }
        }
    }

    /// Invariant 1.
    fn apply(&mut self, event: Event) {
        let held = self.pairs.get(event.key()).map(|p| p.mod_revision);
        if held.is_some_and(|r| r >= event.revision()) {
            return;
        }
        match event {
            Event::Put(pair) => {
                self.pairs.insert(pair.key.clone(), pair);
            }
            Event::Delete { key, .. } => {
                self.pairs.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::registry::tests::info;
    use crate::registry::{list_workers, register, LivenessConfig};
    use tessel_kv::MemoryKv;

    /// Waits until the view says what a listing says (events arrive
    /// asynchronously), or fails after a deadline.
    async fn agrees(view: &mut RegistryView, kv: &dyn KvStore) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let seen = view.workers(kv).await.unwrap();
            let listed = list_workers(kv).await.unwrap();
            // From events, not from a listing again (invariant 2's).
            assert!(view.current.is_some(), "the watch ended");
            if seen == listed {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the view says {seen:?}, a listing {listed:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Invariant 1: registrations, a drain, a death and a new incarnation
    /// show in the view as in a listing, from one listing and the events.
    #[tokio::test]
    async fn the_view_follows_the_registry_as_a_listing_sees_it() {
        let kv: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let liveness = LivenessConfig {
            heartbeat: Duration::from_millis(100),
            ttl: Duration::from_millis(300),
        };
        let a = register(&*kv, info("a"), liveness).await.unwrap();
        let mut view = RegistryView::new();
        agrees(&mut view, &*kv).await;
        let _b = register(&*kv, info("b"), liveness).await.unwrap();
        kv.put(keys::drain("b").as_bytes(), b"maintenance")
            .await
            .unwrap();
        agrees(&mut view, &*kv).await;
        assert_eq!(view.workers(&*kv).await.unwrap().len(), 2);
        // `a` dies (its lease ends), then comes back as a new incarnation.
        kv.revoke(a.lease).await.unwrap();
        agrees(&mut view, &*kv).await;
        let dead = view.workers(&*kv).await.unwrap();
        assert!(dead.iter().any(
            |w| w.record.info.worker_id == "a" && w.state == crate::registry::WorkerState::Dead
        ));
        register(&*kv, info("a"), liveness).await.unwrap();
        kv.delete(keys::drain("b").as_bytes()).await.unwrap();
        agrees(&mut view, &*kv).await;
    }

    /// Invariant 1's order: an event older than the listing changes
    /// nothing; a newer one replaces or deletes.
    #[test]
    fn an_event_older_than_the_view_is_skipped() {
        let pair = |v: &[u8], rev: u64| KeyValue {
            key: b"workers/a/drain".to_vec(),
            value: v.to_vec(),
            create_revision: 1,
            mod_revision: rev,
            lease: None,
        };
        let mut c = Current {
            pairs: BTreeMap::from([(pair(b"new", 5).key.clone(), pair(b"new", 5))]),
            events: futures::stream::empty().boxed(),
        };
        c.apply(Event::Put(pair(b"old", 4)));
        c.apply(Event::Delete {
            key: b"workers/a/drain".to_vec(),
            revision: 5,
        });
        assert_eq!(c.pairs[&b"workers/a/drain"[..]].value, b"new");
        c.apply(Event::Put(pair(b"newer", 6)));
        assert_eq!(c.pairs[&b"workers/a/drain"[..]].value, b"newer");
        c.apply(Event::Delete {
            key: b"workers/a/drain".to_vec(),
            revision: 7,
        });
        assert!(c.pairs.is_empty());
    }

    /// Invariant 2: a watch that ended drops the view; the next call lists.
    #[tokio::test]
    async fn a_view_whose_watch_ended_lists_again() {
        let kv = MemoryKv::new();
        let mut view = RegistryView {
            current: Some(Current {
                pairs: BTreeMap::new(),
                events: futures::stream::empty().boxed(),
            }),
        };
        register(&kv, info("a"), LivenessConfig::default())
            .await
            .unwrap();
        assert!(view.workers(&kv).await.unwrap().is_empty(), "the old view");
        assert!(view.current.is_none(), "dropped");
        assert_eq!(view.workers(&kv).await.unwrap().len(), 1, "listed again");
    }
}
