//! The async interface every backend implements.

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;

use crate::error::Result;
use crate::state::{BatchPut, Event, KeyValue};

/// A stream of changes under a prefix, in revision order.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<Event>> + Send>>;

/// The pairs under a prefix as of one revision ([`KvStore::list_at`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Listing {
    /// Every pair under the prefix at `revision`, in key order.
    pub pairs: Vec<KeyValue>,
    /// The revision of the latest change when the pairs were read.
    pub revision: u64,
}

/// The result of [`KvStore::compare_and_swap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasOutcome {
    /// The value was written.
    Swapped {
        /// The write's revision.
        revision: u64,
    },
    /// The current value (`None`: absent) differed from the expected one.
    Mismatch {
        /// The value found.
        current: Option<Vec<u8>>,
    },
}

impl From<std::result::Result<u64, Option<Vec<u8>>>> for CasOutcome {
    fn from(r: std::result::Result<u64, Option<Vec<u8>>>) -> Self {
        match r {
            Ok(revision) => CasOutcome::Swapped { revision },
            Err(current) => CasOutcome::Mismatch { current },
        }
    }
}

/// The largest lease id a caller may choose ([`KvStore::grant_and_put`]):
/// etcd's ids are positive 64-bit signed integers.
pub const MAX_CHOSEN_LEASE: u64 = i64::MAX as u64;

/// Refuses a lease id a caller may not choose (0, or past
/// [`MAX_CHOSEN_LEASE`]).
pub fn check_chosen_lease(lease: u64) -> Result<()> {
    if lease == 0 || lease > MAX_CHOSEN_LEASE {
        return Err(crate::KvError::InvalidArgument(format!(
            "a chosen lease id is 1 to {MAX_CHOSEN_LEASE}, not {lease}"
        )));
    }
    Ok(())
}

/// Key-value operations with XLA coordination-service semantics. Keys and
/// values are bytes. Every write returns the revision it was given.
#[async_trait::async_trait]
pub trait KvStore: Send + Sync {
    /// Writes unless the key exists ([`crate::KvError::AlreadyExists`]).
    async fn insert(&self, key: &[u8], value: &[u8]) -> Result<u64>;
    /// Writes, overwriting.
    async fn put(&self, key: &[u8], value: &[u8]) -> Result<u64>;
    /// Writes a key that is deleted when `lease` expires or is revoked.
    async fn put_with_lease(&self, key: &[u8], value: &[u8], lease: u64) -> Result<u64>;
    /// Writes every put at one revision, or none of them (etcd's
    /// transaction without compares): one round trip and one log entry for
    /// records that belong together. At most [`crate::state::MAX_BATCH`]
    /// distinct keys; a missing lease refuses the whole batch.
    async fn put_batch(&self, puts: &[BatchPut]) -> Result<u64>;
    /// Waits until the key exists or `timeout` passes
    /// ([`crate::KvError::DeadlineExceeded`]).
    async fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>>;
    /// [`KvStore::get`] answered by any replica from what it applied
    /// (etcd's serializable read): never a value that was not committed,
    /// but it may miss a deletion the leader acknowledged a moment ago. For
    /// keys written once that many processes wait for (a job's published
    /// topology), so that followers serve them. The default is
    /// [`KvStore::get`].
    async fn get_serializable(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        self.get(key, timeout).await
    }
    /// The value now, or [`crate::KvError::NotFound`].
    async fn try_get(&self, key: &[u8]) -> Result<Vec<u8>>;
    /// Every pair under a directory prefix, in key order.
    async fn list(&self, prefix: &[u8]) -> Result<Vec<KeyValue>> {
        Ok(self.list_at(prefix).await?.pairs)
    }
    /// [`KvStore::list`] with the revision it was read at (etcd's range
    /// response header): a watch from the next revision misses no change
    /// after the listing and repeats none before it.
    async fn list_at(&self, prefix: &[u8]) -> Result<Listing>;
    /// Deletes a key; returns how many were deleted (0 or 1).
    async fn delete(&self, key: &[u8]) -> Result<u64>;
    /// Deletes every key under `prefix`; returns how many.
    async fn delete_prefix(&self, prefix: &[u8]) -> Result<u64>;
    /// Adds `delta` to the decimal integer at `key` (missing = 0).
    async fn increment(&self, key: &[u8], delta: i64) -> Result<i64>;
    /// Writes `value` if the current value is `expected` (`None` = absent).
    async fn compare_and_swap(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<CasOutcome>;
    /// Changes under `prefix` from revision `from_revision` on (0 or 1 = from
    /// the oldest retained), then live.
    async fn watch(&self, prefix: &[u8], from_revision: u64) -> Result<WatchStream>;
    /// A lease of `ttl`; returns its id.
    async fn grant(&self, ttl: Duration) -> Result<u64>;
    /// Grants lease `lease` of `ttl` (an id the caller chose, 1 to
    /// [`MAX_CHOSEN_LEASE`]; [`crate::KvError::AlreadyExists`] while one
    /// holds it) and writes `puts`, which may bind keys to it, as
    /// [`KvStore::put_batch`] does. Where the backend can (tessel's
    /// replicas, memory) it is one write: the lease cannot expire before
    /// its keys are bound. etcd grants first, then writes, and revokes the
    /// lease if the write fails.
    async fn grant_and_put(&self, lease: u64, ttl: Duration, puts: &[BatchPut]) -> Result<u64>;
    /// Renews a lease for its whole TTL.
    async fn keep_alive(&self, lease: u64) -> Result<()>;
    /// Ends a lease now, deleting its keys.
    async fn revoke(&self, lease: u64) -> Result<()>;
    /// `participant` arrives at barrier `id` of `participants` members and
    /// waits until all arrived. A timeout or a cancel gives every participant
    /// the same [`crate::KvError::BarrierFailed`].
    async fn barrier(
        &self,
        id: &[u8],
        participant: &[u8],
        participants: u32,
        timeout: Duration,
    ) -> Result<()>;
    /// Fails barrier `id` for everyone waiting or arriving later.
    async fn cancel_barrier(&self, id: &[u8], reason: &str) -> Result<()>;
    /// The revision of the latest change.
    async fn revision(&self) -> Result<u64>;
}
