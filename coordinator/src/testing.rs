//! Test doubles for this crate's unit tests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tessel_kv::{BatchPut, CasOutcome, KvStore, Listing, MemoryKv, Result, WatchStream};

/// [`MemoryKv`] behind a faulty network. While `retry_next_cas` is set,
/// the next compare-and-swap is applied twice, the caller hearing the
/// second answer (a client retrying a write whose first try was applied
/// but not answered), and the flag is cleared. The next plain put or
/// batch (a registration's too) waits `slow_next_put` first, when set (a
/// leader's long queue).
pub(crate) struct FaultyKv {
    pub inner: MemoryKv,
    pub retry_next_cas: AtomicBool,
    pub slow_next_put: std::sync::Mutex<Option<Duration>>,
    /// The next batch is applied at once and answered this much later (a
    /// client running behind).
    pub late_next_batch_answer: std::sync::Mutex<Option<Duration>>,
    /// The leases registrations granted (`grant_and_put`), in order.
    pub granted: std::sync::Mutex<Vec<u64>>,
    /// Every keep-alive is served this much later (a leader running
    /// behind), when set. Stricter than a replica: a keep-alive its caller
    /// drops before then is never served, where a real one already sent
    /// still renews the lease.
    pub late_keep_alives: std::sync::Mutex<Option<Duration>>,
    /// Keep-alives sent, those in flight now, and the most ever in flight
    /// at once.
    pub keep_alives: AtomicU64,
    pub in_flight: AtomicU64,
    pub most_in_flight: AtomicU64,
    /// The next insert of a key under this prefix is refused `Unavailable`
    /// unwritten (a replica lost on the way), and the prefix cleared.
    pub refuse_next_insert_under: std::sync::Mutex<Option<Vec<u8>>>,
}

impl FaultyKv {
    /// No faults until fields say otherwise.
    pub(crate) fn new() -> FaultyKv {
        FaultyKv {
            inner: MemoryKv::new(),
            retry_next_cas: AtomicBool::new(false),
            slow_next_put: std::sync::Mutex::new(None),
            late_next_batch_answer: std::sync::Mutex::new(None),
            granted: std::sync::Mutex::new(Vec::new()),
            late_keep_alives: std::sync::Mutex::new(None),
            keep_alives: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            most_in_flight: AtomicU64::new(0),
            refuse_next_insert_under: std::sync::Mutex::new(None),
        }
    }

    /// Waits `late_next_batch_answer` once, if set.
    async fn answer_late(&self) {
        let late = self
            .late_next_batch_answer
            .lock()
            .expect("not poisoned")
            .take();
        if let Some(d) = late {
            tokio::time::sleep(d).await;
        }
    }

    /// Waits `slow_next_put` once, if set.
    async fn slow_down(&self) {
        let slow = self.slow_next_put.lock().expect("not poisoned").take();
        if let Some(d) = slow {
            tokio::time::sleep(d).await;
        }
    }
}

#[async_trait::async_trait]
impl KvStore for FaultyKv {
    async fn insert(&self, k: &[u8], v: &[u8]) -> Result<u64> {
        {
            let mut refuse = self.refuse_next_insert_under.lock().expect("not poisoned");
            if refuse.as_ref().is_some_and(|p| k.starts_with(p)) {
                *refuse = None;
                return Err(tessel_kv::KvError::Unavailable(
                    "the replica was lost on the way".into(),
                ));
            }
        }
        self.inner.insert(k, v).await
    }
    async fn put(&self, k: &[u8], v: &[u8]) -> Result<u64> {
        self.slow_down().await;
        self.inner.put(k, v).await
    }
    async fn put_with_lease(&self, k: &[u8], v: &[u8], l: u64) -> Result<u64> {
        self.inner.put_with_lease(k, v, l).await
    }
    async fn put_batch(&self, puts: &[BatchPut]) -> Result<u64> {
        self.slow_down().await;
        let applied = self.inner.put_batch(puts).await;
        self.answer_late().await;
        applied
    }
    async fn grant_and_put(&self, l: u64, ttl: Duration, puts: &[BatchPut]) -> Result<u64> {
        self.slow_down().await;
        let applied = self.inner.grant_and_put(l, ttl, puts).await;
        self.granted.lock().expect("not poisoned").push(l);
        self.answer_late().await;
        applied
    }
    async fn get(&self, k: &[u8], t: Duration) -> Result<Vec<u8>> {
        self.inner.get(k, t).await
    }
    async fn try_get(&self, k: &[u8]) -> Result<Vec<u8>> {
        self.inner.try_get(k).await
    }
    async fn list_at(&self, p: &[u8]) -> Result<Listing> {
        self.inner.list_at(p).await
    }
    async fn delete(&self, k: &[u8]) -> Result<u64> {
        self.inner.delete(k).await
    }
    async fn delete_prefix(&self, p: &[u8]) -> Result<u64> {
        self.inner.delete_prefix(p).await
    }
    async fn increment(&self, k: &[u8], d: i64) -> Result<i64> {
        self.inner.increment(k, d).await
    }
    async fn compare_and_swap(&self, k: &[u8], e: Option<&[u8]>, v: &[u8]) -> Result<CasOutcome> {
        if self.retry_next_cas.swap(false, Ordering::SeqCst) {
            self.inner.compare_and_swap(k, e, v).await?;
        }
        self.inner.compare_and_swap(k, e, v).await
    }
    async fn watch(&self, p: &[u8], r: u64) -> Result<WatchStream> {
        self.inner.watch(p, r).await
    }
    async fn grant(&self, ttl: Duration) -> Result<u64> {
        self.inner.grant(ttl).await
    }
    async fn keep_alive(&self, l: u64) -> Result<()> {
        self.keep_alives.fetch_add(1, Ordering::Relaxed);
        let now = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        self.most_in_flight.fetch_max(now, Ordering::AcqRel);
        /// Counts the keep-alive out when it ends, answered or dropped.
        struct Out<'a>(&'a AtomicU64);
        impl Drop for Out<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _out = Out(&self.in_flight);
        let late = *self.late_keep_alives.lock().unwrap();
        if let Some(late) = late {
            tokio::time::sleep(late).await;
        }
        self.inner.keep_alive(l).await
    }
    async fn revoke(&self, l: u64) -> Result<()> {
        self.inner.revoke(l).await
    }
    async fn barrier(&self, id: &[u8], who: &[u8], n: u32, t: Duration) -> Result<()> {
        self.inner.barrier(id, who, n, t).await
    }
    async fn cancel_barrier(&self, id: &[u8], reason: &str) -> Result<()> {
        self.inner.cancel_barrier(id, reason).await
    }
    async fn revision(&self) -> Result<u64> {
        self.inner.revision().await
    }
}
