//! An in-memory backend: a test double for other crates' unit tests. It has
//! the full semantics but no durability or replication; tessel never uses it
//! as a default.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::applied::AppliedState;
use crate::error::{KvError, Result};
use crate::state::{BatchPut, KvState, Limits, MemTables, Op, Output, Request};
use crate::store::{CasOutcome, KvStore, Listing, WatchStream};

/// The in-memory test double. Create it inside a tokio runtime: a task
/// expires leases and barriers on time.
pub struct MemoryKv {
    applied: Arc<AppliedState<MemTables>>,
    epoch: Instant,
}

impl MemoryKv {
    /// An empty store with default limits.
    pub fn new() -> MemoryKv {
        MemoryKv::with_limits(Limits::default())
    }

    /// An empty store with `limits`.
    pub fn with_limits(limits: Limits) -> MemoryKv {
        let applied = Arc::new(AppliedState::new(
            KvState::new(limits, 100_000),
            MemTables::default(),
        ));
        let epoch = Instant::now();
        tokio::spawn(expiry_task(Arc::downgrade(&applied), epoch));
        MemoryKv { applied, epoch }
    }

    fn propose(&self, op: Op) -> Result<Output> {
        self.applied.apply(&Request {
            now_ms: now_ms(self.epoch),
            op,
        })
    }
}

impl Default for MemoryKv {
    fn default() -> Self {
        MemoryKv::new()
    }
}

fn now_ms(epoch: Instant) -> u64 {
    epoch.elapsed().as_millis() as u64
}

/// Ticks the clock whenever a lease or barrier is due; ends with the store.
/// It re-plans after every change, since a new lease or barrier may be due
/// before the deadline it was sleeping towards.
async fn expiry_task(applied: Weak<AppliedState<MemTables>>, epoch: Instant) {
    let Some(mut changes) = applied.upgrade().map(|l| l.changes()) else {
        return;
    };
    loop {
        let Some(l) = applied.upgrade() else { return };
        let next = l.read(|s, _| s.next_deadline_ms());
        drop(l);
        // A tick stamped with the deadline expires what is due (state
        // invariant 6 keeps a lease for its whole TTL).
        let wake = match next {
            Some(ms) => epoch + Duration::from_millis(ms),
            None => Instant::now() + Duration::from_secs(3600),
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        }
        let Some(l) = applied.upgrade() else { return };
        let _ = l.apply(&Request {
            now_ms: now_ms(epoch),
            op: Op::Tick,
        });
    }
}

#[async_trait::async_trait]
impl KvStore for MemoryKv {
    async fn insert(&self, key: &[u8], value: &[u8]) -> Result<u64> {
        self.propose(Op::Insert {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: None,
        })?
        .into_revision()
    }

    async fn put(&self, key: &[u8], value: &[u8]) -> Result<u64> {
        self.propose(Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: None,
        })?
        .into_revision()
    }

    async fn put_with_lease(&self, key: &[u8], value: &[u8], lease: u64) -> Result<u64> {
        self.propose(Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: Some(lease),
        })?
        .into_revision()
    }

    async fn put_batch(&self, puts: &[BatchPut]) -> Result<u64> {
        self.propose(Op::PutBatch {
            puts: puts.to_vec(),
        })?
        .into_revision()
    }

    async fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        self.applied.read(|s, _| s.limits().check_key(key))?;
        self.applied.get(key, timeout).await
    }

    async fn try_get(&self, key: &[u8]) -> Result<Vec<u8>> {
        self.applied
            .try_get(key)?
            .ok_or_else(|| KvError::NotFound(key.to_vec()))
    }

    async fn list_at(&self, prefix: &[u8]) -> Result<Listing> {
        self.applied.list_at(prefix)
    }

    async fn delete(&self, key: &[u8]) -> Result<u64> {
        self.propose(Op::Delete { key: key.to_vec() })?
            .into_deleted()
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> Result<u64> {
        self.propose(Op::DeletePrefix {
            prefix: prefix.to_vec(),
        })?
        .into_deleted()
    }

    async fn increment(&self, key: &[u8], delta: i64) -> Result<i64> {
        self.propose(Op::Increment {
            key: key.to_vec(),
            delta,
        })?
        .into_counter()
    }

    async fn compare_and_swap(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<CasOutcome> {
        let op = Op::CompareAndSwap {
            key: key.to_vec(),
            expected: expected.map(<[u8]>::to_vec),
            value: value.to_vec(),
        };
        Ok(self.propose(op)?.into_cas()?.into())
    }

    async fn watch(&self, prefix: &[u8], from_revision: u64) -> Result<WatchStream> {
        self.applied.watch(prefix, from_revision)
    }

    async fn grant(&self, ttl: Duration) -> Result<u64> {
        self.propose(Op::LeaseGrant {
            ttl_ms: ttl.as_millis() as u64,
        })?
        .into_lease()
    }

    async fn grant_and_put(&self, lease: u64, ttl: Duration, puts: &[BatchPut]) -> Result<u64> {
        self.propose(Op::GrantPutBatch {
            lease,
            ttl_ms: ttl.as_millis() as u64,
            puts: puts.to_vec(),
        })?
        .into_revision()
    }

    async fn keep_alive(&self, lease: u64) -> Result<()> {
        self.propose(Op::LeaseKeepAlive { id: lease }).map(drop)
    }

    async fn revoke(&self, lease: u64) -> Result<()> {
        self.propose(Op::LeaseRevoke { id: lease }).map(drop)
    }

    async fn barrier(
        &self,
        id: &[u8],
        participant: &[u8],
        participants: u32,
        timeout: Duration,
    ) -> Result<()> {
        let op = Op::barrier_arrive(id, participant, participants, timeout);
        let status = self.propose(op)?.into_barrier()?;
        if let Some(r) = status.outcome(id) {
            return r;
        }
        // The expiry task fails the barrier at its deadline for everyone;
        // the grace covers a late tick.
        let deadline = Instant::now() + timeout + Duration::from_secs(1);
        match self
            .applied
            .wait_for(deadline, |s, _| s.barrier(id).and_then(|b| b.outcome(id)))
            .await
        {
            Some(r) => r,
            None => Err(KvError::DeadlineExceeded {
                what: format!("barrier `{}`", crate::show_key(id)),
                after: timeout,
            }),
        }
    }

    async fn cancel_barrier(&self, id: &[u8], reason: &str) -> Result<()> {
        self.propose(Op::BarrierCancel {
            id: id.to_vec(),
            reason: reason.to_owned(),
        })
        .map(drop)
    }

    async fn revision(&self) -> Result<u64> {
        Ok(self.applied.read(|s, _| s.revision()))
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_backend_passes_the_conformance_suite() {
        let store = super::MemoryKv::new();
        crate::conformance::run_all(&store).await;
    }
}
