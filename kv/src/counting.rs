//! [`CountingKv`]: a store that counts the operations it passes on, for
//! benchmarks that report operations per host and tests that hold code
//! to a number of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{BatchPut, CasOutcome, KvStore, Listing, Result, WatchStream};

/// Passes every operation on to its inner store and counts it (a watch
/// counts once, whatever it delivers later).
pub struct CountingKv {
    inner: Arc<dyn KvStore>,
    ops: AtomicU64,
}

impl CountingKv {
    /// Counts from zero.
    pub fn new(inner: Arc<dyn KvStore>) -> CountingKv {
        CountingKv {
            inner,
            ops: AtomicU64::new(0),
        }
    }

    /// Operations passed on so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    fn count(&self) -> &dyn KvStore {
        self.ops.fetch_add(1, Ordering::Relaxed);
        &*self.inner
    }
}

#[async_trait::async_trait]
impl KvStore for CountingKv {
    async fn insert(&self, k: &[u8], v: &[u8]) -> Result<u64> {
        self.count().insert(k, v).await
    }
    async fn put(&self, k: &[u8], v: &[u8]) -> Result<u64> {
        self.count().put(k, v).await
    }
    async fn put_with_lease(&self, k: &[u8], v: &[u8], l: u64) -> Result<u64> {
        self.count().put_with_lease(k, v, l).await
    }
    async fn put_batch(&self, puts: &[BatchPut]) -> Result<u64> {
        self.count().put_batch(puts).await
    }
    async fn grant_and_put(&self, l: u64, ttl: Duration, puts: &[BatchPut]) -> Result<u64> {
        self.count().grant_and_put(l, ttl, puts).await
    }
    async fn get(&self, k: &[u8], t: Duration) -> Result<Vec<u8>> {
        self.count().get(k, t).await
    }
    async fn get_serializable(&self, k: &[u8], t: Duration) -> Result<Vec<u8>> {
        self.count().get_serializable(k, t).await
    }
    async fn try_get(&self, k: &[u8]) -> Result<Vec<u8>> {
        self.count().try_get(k).await
    }
    async fn list_at(&self, p: &[u8]) -> Result<Listing> {
        self.count().list_at(p).await
    }
    async fn delete(&self, k: &[u8]) -> Result<u64> {
        self.count().delete(k).await
    }
    async fn delete_prefix(&self, p: &[u8]) -> Result<u64> {
        self.count().delete_prefix(p).await
    }
    async fn increment(&self, k: &[u8], d: i64) -> Result<i64> {
        self.count().increment(k, d).await
    }
    async fn compare_and_swap(&self, k: &[u8], e: Option<&[u8]>, v: &[u8]) -> Result<CasOutcome> {
        self.count().compare_and_swap(k, e, v).await
    }
    async fn watch(&self, p: &[u8], from: u64) -> Result<WatchStream> {
        self.count().watch(p, from).await
    }
    async fn grant(&self, ttl: Duration) -> Result<u64> {
        self.count().grant(ttl).await
    }
    async fn keep_alive(&self, l: u64) -> Result<()> {
        self.count().keep_alive(l).await
    }
    async fn revoke(&self, l: u64) -> Result<()> {
        self.count().revoke(l).await
    }
    async fn barrier(&self, id: &[u8], p: &[u8], n: u32, t: Duration) -> Result<()> {
        self.count().barrier(id, p, n, t).await
    }
    async fn cancel_barrier(&self, id: &[u8], r: &str) -> Result<()> {
        self.count().cancel_barrier(id, r).await
    }
    async fn revision(&self) -> Result<u64> {
        self.count().revision().await
    }
}
