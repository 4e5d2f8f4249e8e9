//! The state machine's vocabulary: the requests a replica applies
//! ([`Request`], [`Op`]), what they return ([`Output`]), the events they
//! make ([`Event`]), and the size limits checked before anything is written.

use serde::{Deserialize, Serialize};

use super::guard::Guard;
use crate::error::{show_key, KvError, Result};

/// Size limits checked before anything is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// The longest key, in bytes.
    pub max_key: usize,
    /// The largest value, in bytes.
    pub max_value: usize,
}

/// The longest key every backend stores.
pub const MAX_KEY: usize = 4 << 10;
/// The largest value every backend stores: what one record a job keeps in
/// the KV (a bundle, an array for `fetch`, a checkpoint record) may be.
pub const MAX_VALUE: usize = 4 << 20;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key: MAX_KEY,
            max_value: MAX_VALUE,
        }
    }
}

impl Limits {
    /// Refuses an empty key or one over the limit.
    pub fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.len() > self.max_key {
            return Err(KvError::InvalidArgument(format!(
                "key of {} bytes exceeds the {}-byte limit",
                key.len(),
                self.max_key
            )));
        }
        Ok(())
    }

    /// Checks every key and value an operation carries, before it is
    /// proposed (so oversized data never enters the log).
    pub fn check_op(&self, op: &Op) -> Result<()> {
        match op {
            Op::Put { key, value, .. } | Op::Insert { key, value, .. } => {
                self.check_key(key)?;
                self.check_value(value)
            }
            Op::CompareAndSwap {
                key,
                expected,
                value,
            } => {
                self.check_key(key)?;
                self.check_value(value)?;
                expected.as_deref().map_or(Ok(()), |e| self.check_value(e))
            }
            Op::Delete { key } | Op::Increment { key, .. } => self.check_key(key),
            Op::DeletePrefix { prefix } => self.check_key(prefix),
            Op::BarrierArrive {
                id, participant, ..
            } => {
                self.check_key(id)?;
                self.check_key(participant)
            }
            Op::BarrierCancel { id, reason } => {
                self.check_key(id)?;
                self.check_value(reason.as_bytes())
            }
            Op::LeaseGrant { .. }
            | Op::LeaseKeepAlive { .. }
            | Op::LeaseRevoke { .. }
            | Op::Tick
            | Op::RenewLeases
            | Op::ExtendLeases { .. }
            | Op::HoldLeases { .. }
            | Op::ExpireLeases { .. } => Ok(()),
            Op::Guarded { op, .. } | Op::Once { op, .. } => self.check_op(op),
            Op::PutBatch { puts } | Op::GrantPutBatch { puts, .. } => self.check_batch(puts),
        }
    }

    /// Refuses an empty batch, one over [`MAX_BATCH`] puts or over
    /// [`Limits::max_value`] bytes of values, or one naming a key twice
    /// (which of its values would win is not obvious, so etcd refuses it too).
    pub fn check_batch(&self, puts: &[BatchPut]) -> Result<()> {
        if puts.is_empty() || puts.len() > MAX_BATCH {
            return Err(KvError::InvalidArgument(format!(
                "a batch holds 1 to {MAX_BATCH} puts, not {}",
                puts.len()
            )));
        }
        let mut total = 0usize;
        let mut keys = std::collections::BTreeSet::new();
        for p in puts {
            self.check_key(&p.key)?;
            total = total.saturating_add(p.value.len());
            if !keys.insert(&p.key[..]) {
                return Err(KvError::InvalidArgument(format!(
                    "a batch puts `{}` twice",
                    show_key(&p.key)
                )));
            }
        }
        if total > self.max_value {
            return Err(KvError::InvalidArgument(format!(
                "a batch's values of {total} bytes exceed the {}-byte limit",
                self.max_value
            )));
        }
        Ok(())
    }

    /// Refuses a value over the limit.
    pub fn check_value(&self, value: &[u8]) -> Result<()> {
        if value.len() > self.max_value {
            return Err(KvError::InvalidArgument(format!(
                "value of {} bytes exceeds the {}-byte limit",
                value.len(),
                self.max_value
            )));
        }
        Ok(())
    }
}

/// A stored value and its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    /// The key.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The value.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// Revision of the write that created the key.
    pub create_revision: u64,
    /// Revision of the last write to the key.
    pub mod_revision: u64,
    /// The lease the key is bound to (deleted with it), if any.
    pub lease: Option<u64>,
}

/// A change, as seen by watchers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A key was written.
    Put(KeyValue),
    /// A key was deleted.
    Delete {
        /// The deleted key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The revision of the deletion.
        revision: u64,
    },
}

impl Event {
    /// The revision of the change.
    pub fn revision(&self) -> u64 {
        match self {
            Event::Put(kv) => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
        }
    }

    /// The key changed.
    pub fn key(&self) -> &[u8] {
        match self {
            Event::Put(kv) => &kv.key,
            Event::Delete { key, .. } => key,
        }
    }

    /// Bytes of key and value carried (for sizing buffers and records).
    pub fn payload_bytes(&self) -> usize {
        match self {
            Event::Put(kv) => kv.key.len() + kv.value.len(),
            Event::Delete { key, .. } => key.len(),
        }
    }
}

/// A write, with the proposer's clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The proposer's clock, whole milliseconds rounded down (invariant 6).
    pub now_ms: u64,
    /// The operation.
    pub op: Op,
}

/// The operations that change state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Writes, overwriting.
    Put {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The value.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        /// A lease to bind the key to.
        lease: Option<u64>,
    },
    /// Writes unless the key exists (XLA's default).
    Insert {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The value.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        /// A lease to bind the key to.
        lease: Option<u64>,
    },
    /// Deletes a key (absent: nothing changes).
    Delete {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// Deletes every key under a prefix.
    DeletePrefix {
        /// The prefix.
        #[serde(with = "serde_bytes")]
        prefix: Vec<u8>,
    },
    /// Adds `delta` to the decimal integer at `key` (missing = 0).
    Increment {
        /// The counter's key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// What to add (may be negative).
        delta: i64,
    },
    /// Writes `value` if the current value is `expected` (`None` = absent).
    CompareAndSwap {
        /// The key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// The value expected now.
        #[serde(with = "serde_bytes")]
        expected: Option<Vec<u8>>,
        /// The value to write.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// A new lease.
    LeaseGrant {
        /// How long it lives without a keep-alive.
        ttl_ms: u64,
    },
    /// Renews a lease for its whole TTL.
    LeaseKeepAlive {
        /// The lease.
        id: u64,
    },
    /// Ends a lease now, deleting its keys.
    LeaseRevoke {
        /// The lease.
        id: u64,
    },
    /// `participant` arrives at barrier `id` of `participants` members.
    BarrierArrive {
        /// The barrier.
        #[serde(with = "serde_bytes")]
        id: Vec<u8>,
        /// Who arrives.
        #[serde(with = "serde_bytes")]
        participant: Vec<u8>,
        /// How many must arrive.
        participants: u32,
        /// How long the barrier waits from its first arrival.
        timeout_ms: u64,
    },
    /// Fails a barrier for every participant.
    BarrierCancel {
        /// The barrier.
        #[serde(with = "serde_bytes")]
        id: Vec<u8>,
        /// Why, as the participants will see it.
        reason: String,
    },
    /// Only advances the clock (expiring leases and barriers).
    Tick,
    /// A new leader's first write: every lease lives at least its TTL from
    /// now, renewed before anything expires, so no lease dies for the time
    /// no leader could renew it (as etcd's lessor does on promotion).
    RenewLeases,
    /// `op`, applied only if `guard` holds ([`Guard`], invariant 1): the
    /// replica's form of a worker's write to a job's keys.
    Guarded {
        /// What must exist.
        guard: Guard,
        /// The write.
        op: Box<Op>,
    },
    // Appended: a variant's position is its number in the log's and the
    // snapshots' encoding (postcard).
    /// Keep-alives the leader answered from memory, written down before
    /// they matter: each lease lives at least its TTL from its renewal
    /// (`(lease, renewed at ms)`, a time no later than the request's).
    /// Applied before anything expires; unknown leases are skipped. No
    /// longer proposed (leases are held instead, [`Op::HoldLeases`]);
    /// applied from logs and snapshots older builds wrote.
    ExtendLeases {
        /// (lease, when it was last renewed).
        renewed: Vec<(u64, u64)>,
    },
    /// `op` as call `seq` of client session `client`, applied at most once
    /// (the `sessions` invariants): what a client that retries sends.
    Once {
        /// The session (the client's random id).
        client: u128,
        /// The call's sequence number in its session.
        seq: u64,
        /// The lowest sequence number among the client's calls in flight.
        floor: u64,
        /// The write.
        op: Box<Op>,
    },
    /// Several puts as one write: all or none, at one revision (etcd's
    /// transaction without compares). At most [`MAX_BATCH`] distinct keys,
    /// their values [`Limits::max_value`] bytes in all.
    PutBatch {
        /// The puts, in order.
        puts: Vec<BatchPut>,
    },
    /// A new lease with the id its client chose, and a batch of puts that
    /// may bind keys to it, as one write: the lease cannot expire before
    /// its keys are bound to it (a worker's registration: its record and
    /// its alive key). The id is refused while a lease holds it.
    GrantPutBatch {
        /// The new lease's id (not 0).
        lease: u64,
        /// How long it lives without a keep-alive.
        ttl_ms: u64,
        /// The puts, as [`Op::PutBatch`]'s.
        puts: Vec<BatchPut>,
    },
    /// Leases the leader renews from memory from now on: each lives until
    /// an [`Op::ExpireLeases`] or a revoke ends it, not its TTL past a
    /// written time ([`HELD`]; state invariant 13). Unknown leases are
    /// skipped.
    HoldLeases {
        /// The leases.
        ids: Vec<u64>,
    },
    /// Leases the leader found silent for their TTL, ended with their keys
    /// as an expiry ends them. Unknown leases are skipped.
    ExpireLeases {
        /// The leases.
        ids: Vec<u64>,
    },
}

/// The written expiry of a held lease ([`Op::HoldLeases`]): never reached.
pub const HELD: u64 = u64::MAX;

/// The most puts one [`Op::PutBatch`] carries (etcd's default too).
pub const MAX_BATCH: usize = 128;

/// One put of an [`Op::PutBatch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchPut {
    /// The key.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// The value.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// A lease to bind the key to.
    pub lease: Option<u64>,
}

impl BatchPut {
    /// A put of `value` at `key`, bound to `lease` if given.
    pub fn new(key: &[u8], value: &[u8], lease: Option<u64>) -> BatchPut {
        BatchPut {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
        }
    }
}

/// The value an increment of `delta` gives the counter at `key` holding
/// `current` (decimal text; `None` = 0). Shared by every backend.
pub fn increment_value(key: &[u8], current: Option<&[u8]>, delta: i64) -> Result<i64> {
    let current = match current {
        None => 0,
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<i64>().ok())
            .ok_or_else(|| {
                KvError::InvalidArgument(format!(
                    "key `{}` does not hold a decimal integer",
                    show_key(key)
                ))
            })?,
    };
    current.checked_add(delta).ok_or_else(|| {
        KvError::InvalidArgument(format!("incrementing `{}` overflows", show_key(key)))
    })
}

impl Op {
    /// The key (or prefix, or barrier id) the operation writes, if any.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Op::Put { key, .. }
            | Op::Insert { key, .. }
            | Op::Delete { key }
            | Op::Increment { key, .. }
            | Op::CompareAndSwap { key, .. } => Some(key),
            Op::DeletePrefix { prefix } => Some(prefix),
            Op::BarrierArrive { id, .. } | Op::BarrierCancel { id, .. } => Some(id),
            Op::Guarded { op, .. } | Op::Once { op, .. } => op.key(),
            Op::PutBatch { puts } | Op::GrantPutBatch { puts, .. } => {
                puts.first().map(|p| &p.key[..])
            }
            Op::LeaseGrant { .. }
            | Op::LeaseKeepAlive { .. }
            | Op::LeaseRevoke { .. }
            | Op::Tick
            | Op::RenewLeases
            | Op::ExtendLeases { .. }
            | Op::HoldLeases { .. }
            | Op::ExpireLeases { .. } => None,
        }
    }

    /// Bytes of keys and values this operation carries (for sizing batches
    /// and messages).
    pub fn payload_bytes(&self) -> usize {
        match self {
            Op::Put { key, value, .. } | Op::Insert { key, value, .. } => key.len() + value.len(),
            Op::CompareAndSwap {
                key,
                expected,
                value,
            } => key.len() + value.len() + expected.as_ref().map_or(0, Vec::len),
            Op::Delete { key } | Op::Increment { key, .. } => key.len(),
            Op::DeletePrefix { prefix } => prefix.len(),
            Op::BarrierArrive {
                id, participant, ..
            } => id.len() + participant.len(),
            Op::BarrierCancel { id, reason } => id.len() + reason.len(),
            Op::LeaseGrant { .. }
            | Op::LeaseKeepAlive { .. }
            | Op::LeaseRevoke { .. }
            | Op::Tick
            | Op::RenewLeases => 0,
            Op::ExtendLeases { renewed } => renewed.len() * 16,
            Op::HoldLeases { ids } | Op::ExpireLeases { ids } => ids.len() * 8,
            Op::Guarded { op, .. } => op.payload_bytes(),
            Op::Once { op, .. } => 32 + op.payload_bytes(),
            Op::PutBatch { puts } | Op::GrantPutBatch { puts, .. } => {
                puts.iter().map(|p| p.key.len() + p.value.len()).sum()
            }
        }
    }

    /// `participant` arrives at barrier `id` of `participants`, failing
    /// after `timeout`.
    pub fn barrier_arrive(
        id: &[u8],
        participant: &[u8],
        participants: u32,
        timeout: std::time::Duration,
    ) -> Op {
        Op::BarrierArrive {
            id: id.to_vec(),
            participant: participant.to_vec(),
            participants,
            timeout_ms: timeout.as_millis() as u64,
        }
    }
}

/// The result of a successful operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Output {
    /// A write; `revision` is 0 when nothing changed.
    Written {
        /// The write's revision.
        revision: u64,
    },
    /// A delete.
    Deleted {
        /// Its revision (0: nothing was deleted).
        revision: u64,
        /// Keys deleted.
        count: u64,
    },
    /// An increment.
    Counter {
        /// Its revision.
        revision: u64,
        /// The counter's new value.
        value: i64,
    },
    /// A compare-and-swap that wrote.
    Swapped {
        /// Its revision.
        revision: u64,
    },
    /// A compare-and-swap that found another value.
    Mismatch {
        /// What it found (`None`: absent).
        current: Option<Vec<u8>>,
    },
    /// A granted or renewed lease.
    Lease {
        /// The lease.
        id: u64,
        /// Its TTL.
        ttl_ms: u64,
    },
    /// A barrier arrival, and where the barrier stands.
    Barrier(BarrierStatus),
    /// A tick (or a lease renewal) applied.
    Ticked,
}

impl Output {
    fn unexpected(self, wanted: &str) -> KvError {
        KvError::Internal(format!(
            "expected {wanted} from the state machine, got {self:?}"
        ))
    }

    /// The revision of a write.
    pub fn into_revision(self) -> Result<u64> {
        match self {
            Output::Written { revision } => Ok(revision),
            o => Err(o.unexpected("a write")),
        }
    }

    /// How many keys a delete removed.
    pub fn into_deleted(self) -> Result<u64> {
        match self {
            Output::Deleted { count, .. } => Ok(count),
            o => Err(o.unexpected("a delete")),
        }
    }

    /// A counter's new value.
    pub fn into_counter(self) -> Result<i64> {
        match self {
            Output::Counter { value, .. } => Ok(value),
            o => Err(o.unexpected("a counter")),
        }
    }

    /// A compare-and-swap's outcome: `Ok(revision)` swapped,
    /// `Err(current)` mismatched.
    pub fn into_cas(self) -> Result<std::result::Result<u64, Option<Vec<u8>>>> {
        match self {
            Output::Swapped { revision } => Ok(Ok(revision)),
            Output::Mismatch { current } => Ok(Err(current)),
            o => Err(o.unexpected("a compare-and-swap")),
        }
    }

    /// A lease id.
    pub fn into_lease(self) -> Result<u64> {
        match self {
            Output::Lease { id, .. } => Ok(id),
            o => Err(o.unexpected("a lease")),
        }
    }

    /// A barrier's status.
    pub fn into_barrier(self) -> Result<BarrierStatus> {
        match self {
            Output::Barrier(b) => Ok(b),
            o => Err(o.unexpected("a barrier status")),
        }
    }
}

impl BarrierStatus {
    /// `None` while waiting; otherwise what every participant is told.
    pub fn outcome(&self, id: &[u8]) -> Option<Result<()>> {
        match self {
            BarrierStatus::Passed => Some(Ok(())),
            BarrierStatus::Failed { reason } => Some(Err(KvError::BarrierFailed {
                id: id.to_vec(),
                reason: reason.clone(),
            })),
            BarrierStatus::Waiting { .. } => None,
        }
    }
}

/// Where a barrier stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BarrierStatus {
    /// Not every participant has arrived yet.
    Waiting {
        /// Participants that arrived.
        arrived: u32,
        /// Participants the barrier waits for.
        participants: u32,
    },
    /// Every participant arrived before the deadline.
    Passed,
    /// It timed out or was cancelled.
    Failed {
        /// Why, the same for every participant.
        reason: String,
    },
}
