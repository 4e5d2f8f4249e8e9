//! The key-value state machine: every write is a [`Request`] applied in log
//! order, so replicas that apply the same requests hold the same state.
//!
//! Invariants:
//! 1. Determinism: `apply` depends only on the state and the request; time
//!    enters only as `Request::now_ms`, and the clock never goes backwards.
//! 2. A request that changes data advances `revision` by exactly one, and all
//!    its events carry it; one that fails or changes nothing leaves it.
//! 3. A key attached to a lease is deleted in the step that expires or
//!    revokes the lease.
//! 4. A barrier passes once all arrived, fails at its deadline or cancel, and
//!    never changes outcome; it is forgotten [`BARRIER_RETENTION_MS`] later.
//! 5. User errors are results, never panics: `apply` returns `Err(KvError)`
//!    and leaves the state untouched.
//! 6. A lease lives through millisecond `t + ttl` after a grant or keep-alive
//!    stamped `t` (stamps round down) and ends with the first request stamped
//!    after it ([`KvState::next_deadline_ms`]).
//! 7. `expiry` holds exactly `(expires_at_ms, id)` of every lease: finding
//!    what expires costs O(log n) a request, not a scan of every lease (a
//!    cluster of 16,384 workers holds as many).
//! 8. `ExtendLeases` only lengthens leases, to at most their TTL past the
//!    request's clock, and is applied before the request expires anything.
//! 9. A write sent [`Op::Once`] that changed the state is applied at most
//!    once, and a repeat gets the first answer (`sessions` invariants); its
//!    client's session is updated even when it fails (an exception to
//!    invariant 5).
//! 10. An [`Op::PutBatch`] writes all its keys at one revision or none: it
//!     is refused before anything changes if any put would be.
//! 11. `changed_leases` holds every lease created, changed or dropped since
//!     the last [`KvState::take_changed_leases`] (maybe more): a replica that
//!     stores those rows stores every lease as it is.
//! 12. An [`Op::GrantPutBatch`] grants its lease and writes its puts at one
//!     revision, or does neither; lease ids a client chose are never given
//!     again by [`Op::LeaseGrant`], which skips ids in use.
//! 13. A held lease ([`Op::HoldLeases`]: its written expiry is [`HELD`])
//!     never expires with time: only [`Op::ExpireLeases`] or a revoke ends
//!     it, so its liveness is the leader's to judge (etcd's lessor), and a
//!     keep-alive no longer rewrites its row. Nothing else makes a lease
//!     held or unholds one ([`Op::LeaseKeepAlive`] only lengthens).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{show_key, KvError, Result};

mod byte_set;
mod guard;
pub use guard::{Guard, Needed};
mod ops;
pub use ops::*;
mod sessions;
pub use sessions::{ClientSession, MAX_CALLS_IN_FLIGHT, SESSION_IDLE_MS, SESSION_SWEEP_MS};
mod stored;
mod tables;
pub use tables::{MemState, MemTables, Tables, TablesMut};

/// How long a decided barrier outlives its deadline (invariant 4).
pub const BARRIER_RETENTION_MS: u64 = 10 * 60 * 1000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Lease {
    ttl_ms: u64,
    /// The last millisecond the lease lives through (invariant 6).
    expires_at_ms: u64,
    #[serde(with = "byte_set")]
    keys: BTreeSet<Vec<u8>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Barrier {
    participants: u32,
    #[serde(with = "byte_set")]
    arrived: BTreeSet<Vec<u8>>,
    deadline_ms: u64,
    status: BarrierStatus,
}

/// The replicated state apart from its [`Tables`]: revision, clock, leases,
/// barriers. It does not grow with the keys, but it does with the leases
/// (one per worker), so a replica stores the leases apart, a row each,
/// writing only those changed since its last flush (`stored`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "stored::StateFields")]
pub struct KvState {
    limits: Limits,
    revision: u64,
    clock_ms: u64,
    next_lease: u64,
    leases: BTreeMap<u64, Lease>,
    barriers: BTreeMap<Vec<u8>, Barrier>,
    /// How many revisions of events the tables keep for watchers.
    history_limit: u64,
    /// Invariant 7; not stored, rebuilt from `leases` when read.
    #[serde(skip_serializing)]
    expiry: BTreeSet<(u64, u64)>,
    /// Invariant 11; not stored, not replicated.
    #[serde(skip_serializing)]
    changed_leases: BTreeSet<u64>,
}

/// Invariant 7's index of `leases`.
fn expiry_index(leases: &BTreeMap<u64, Lease>) -> BTreeSet<(u64, u64)> {
    leases
        .iter()
        .map(|(id, l)| (l.expires_at_ms, *id))
        .collect()
}

impl Default for KvState {
    fn default() -> Self {
        KvState::new(Limits::default(), 100_000)
    }
}

impl KvState {
    /// An empty state with `limits`, keeping `history_limit` revisions of events.
    pub fn new(limits: Limits, history_limit: usize) -> KvState {
        KvState {
            limits,
            revision: 0,
            clock_ms: 0,
            next_lease: 1,
            leases: BTreeMap::new(),
            barriers: BTreeMap::new(),
            history_limit: history_limit.max(1) as u64,
            expiry: BTreeSet::new(),
            changed_leases: BTreeSet::new(),
        }
    }

    /// The size limits it enforces.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The revision of the last change.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The clock of the last applied request (ms).
    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    /// Events with revisions below this are no longer retained: the tables
    /// keep the last `history_limit` revisions.
    pub fn compacted_below(&self) -> u64 {
        (self.revision + 1)
            .saturating_sub(self.history_limit)
            .max(1)
    }

    /// Retained events with revision >= `from` under `prefix`.
    pub fn events_since(&self, t: &impl Tables, from: u64, prefix: &[u8]) -> Result<Vec<Event>> {
        let oldest = self.compacted_below();
        if from < oldest {
            return Err(KvError::Compacted {
                requested: from,
                oldest,
            });
        }
        t.events(from, prefix)
    }

    /// Where barrier `id` stands, while the state remembers it.
    pub fn barrier(&self, id: &[u8]) -> Option<&BarrierStatus> {
        self.barriers.get(id).map(|b| &b.status)
    }

    /// Lease `id`'s TTL and the last millisecond it lives through, if it
    /// exists.
    pub fn lease(&self, id: u64) -> Option<(u64, u64)> {
        self.leases.get(&id).map(|l| (l.ttl_ms, l.expires_at_ms))
    }

    /// Every lease as `(expires_at_ms, id, ttl_ms)`, the soonest to expire
    /// first.
    pub fn leases_by_expiry(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.expiry
            .iter()
            .map(|&(at, id)| (at, id, self.leases[&id].ttl_ms))
    }

    /// The earliest time at which something expires, if anything can: a
    /// request stamped with it (a `Tick`) expires it (invariant 6).
    pub fn next_deadline_ms(&self) -> Option<u64> {
        // Held leases sort last and never fall due (invariant 13).
        let lease = (self.expiry.first())
            .filter(|(at, _)| *at != HELD)
            .map(|(at, _)| at.saturating_add(1));
        let barrier = self
            .barriers
            .values()
            .filter(|b| matches!(b.status, BarrierStatus::Waiting { .. }))
            .map(|b| b.deadline_ms)
            .min();
        lease.into_iter().chain(barrier).min()
    }

    /// Applies one request to this state and `t`; returns its result and
    /// the events it caused (expiries included, even when the operation
    /// itself fails). `Err` only for a storage failure, after which the
    /// state must be thrown away.
    pub fn apply(
        &mut self,
        t: &mut impl TablesMut,
        req: &Request,
    ) -> Result<(Result<Output>, Vec<Event>)> {
        let mut events = Vec::new();
        let clock_before = self.clock_ms;
        self.clock_ms = self.clock_ms.max(req.now_ms);
        match &req.op {
            Op::RenewLeases => {
                let now = self.clock_ms;
                for (id, l) in self.leases.iter_mut() {
                    l.expires_at_ms = l.expires_at_ms.max(now.saturating_add(l.ttl_ms));
                    self.changed_leases.insert(*id);
                }
                self.expiry = expiry_index(&self.leases);
            }
            // Before expiring anything: these leases were alive (invariant 8).
            Op::ExtendLeases { renewed } => {
                let clock = self.clock_ms;
                for &(id, at) in renewed {
                    self.lengthen(id, |ttl| at.min(clock).saturating_add(ttl));
                }
            }
            Op::HoldLeases { ids } => {
                for &id in ids {
                    self.lengthen(id, |_| HELD);
                }
            }
            _ => {}
        }
        let before = self.revision;
        if let Op::ExpireLeases { ids } = &req.op {
            for &id in ids {
                if self.leases.contains_key(&id) {
                    tracing::info!(lease = id, "lease expired: silent for its TTL");
                    self.drop_lease(t, id, &mut events)?;
                }
            }
        }
        self.expire(t, &mut events)?;
        self.sweep_sessions(t, clock_before)?;
        let result = match self.apply_op(t, &req.op, &mut events) {
            Err(KvError::Storage(e)) => return Err(KvError::Storage(e)),
            r => r,
        };
        // Events come in revision order, one run per new revision.
        for of_revision in events.chunk_by(|a, b| a.revision() == b.revision()) {
            t.record(of_revision[0].revision(), of_revision)?;
        }
        if self.revision > before {
            t.forget_below(self.compacted_below())?;
        }
        Ok((result, events))
    }

    fn bump(&mut self) -> u64 {
        self.revision += 1;
        self.revision
    }

    /// Expires leases and barriers whose time has come (invariants 3, 4, 6).
    fn expire(&mut self, t: &mut impl TablesMut, events: &mut Vec<Event>) -> Result<()> {
        let now = self.clock_ms;
        // Invariant 7: the leases due are the index's first entries.
        let expired: Vec<u64> = self
            .expiry
            .iter()
            .take_while(|(at, _)| *at < now)
            .map(|(_, id)| *id)
            .collect();
        for id in expired {
            let l = &self.leases[&id];
            tracing::info!(
                lease = id,
                ttl_ms = l.ttl_ms,
                overdue_ms = now - l.expires_at_ms,
                "lease expired"
            );
            self.drop_lease(t, id, events)?;
        }
        for b in self.barriers.values_mut() {
            if matches!(b.status, BarrierStatus::Waiting { .. }) && b.deadline_ms <= now {
                b.status = BarrierStatus::Failed {
                    reason: format!(
                        "timed out with {} of {} participants",
                        b.arrived.len(),
                        b.participants
                    ),
                };
            }
        }
        // Past their deadline every barrier is decided (above).
        self.barriers
            .retain(|_, b| b.deadline_ms.saturating_add(BARRIER_RETENTION_MS) > now);
        Ok(())
    }

    /// Removes a lease and its keys in one revision.
    fn drop_lease(
        &mut self,
        t: &mut impl TablesMut,
        id: u64,
        events: &mut Vec<Event>,
    ) -> Result<u64> {
        let Some(lease) = self.leases.remove(&id) else {
            return Ok(0);
        };
        self.changed_leases.insert(id);
        self.expiry.remove(&(lease.expires_at_ms, id));
        let mut keys = Vec::new();
        for k in lease.keys {
            if t.get(&k)?.is_some_and(|kv| kv.lease == Some(id)) {
                keys.push(k);
            }
        }
        if keys.is_empty() {
            return Ok(0);
        }
        let revision = self.bump();
        let count = keys.len() as u64;
        for key in keys {
            t.remove(&key)?;
            events.push(Event::Delete { key, revision });
        }
        Ok(count)
    }

    /// Moves lease `id`'s expiry to `until(its TTL)` where that is later,
    /// keeping the index (invariant 7) and the changed rows (invariant 11);
    /// the lease's TTL, `None` for an unknown lease.
    fn lengthen(&mut self, id: u64, until: impl FnOnce(u64) -> u64) -> Option<u64> {
        let l = self.leases.get_mut(&id)?;
        let at = until(l.ttl_ms);
        if at > l.expires_at_ms {
            self.expiry.remove(&(l.expires_at_ms, id));
            l.expires_at_ms = at;
            self.expiry.insert((at, id));
            self.changed_leases.insert(id);
        }
        Some(l.ttl_ms)
    }

    /// Lease `id` of `ttl_ms`, from now, with no keys yet.
    fn new_lease(&mut self, id: u64, ttl_ms: u64) {
        let expires_at_ms = self.clock_ms.saturating_add(ttl_ms);
        self.leases.insert(
            id,
            Lease {
                ttl_ms,
                expires_at_ms,
                keys: BTreeSet::new(),
            },
        );
        self.expiry.insert((expires_at_ms, id));
        self.changed_leases.insert(id);
    }

    fn check_lease(&self, lease: Option<u64>) -> Result<()> {
        match lease {
            Some(id) if !self.leases.contains_key(&id) => Err(KvError::LeaseNotFound(id)),
            _ => Ok(()),
        }
    }

    /// Writes `key` at `revision`, already taken ([`Self::bump`]; a batch's
    /// puts share one); `current` is what the tables hold for it.
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        t: &mut impl TablesMut,
        key: &[u8],
        current: Option<&KeyValue>,
        value: Vec<u8>,
        lease: Option<u64>,
        revision: u64,
        events: &mut Vec<Event>,
    ) -> Result<()> {
        let create_revision = current.map_or(revision, |kv| kv.create_revision);
        if let Some(old) = current.and_then(|kv| kv.lease) {
            if Some(old) != lease {
                if let Some(l) = self.leases.get_mut(&old) {
                    if l.keys.remove(key) {
                        self.changed_leases.insert(old);
                    }
                }
            }
        }
        if let Some(id) = lease {
            if let Some(l) = self.leases.get_mut(&id) {
                if l.keys.insert(key.to_vec()) {
                    self.changed_leases.insert(id);
                }
            }
        }
        let kv = KeyValue {
            key: key.to_vec(),
            value,
            create_revision,
            mod_revision: revision,
            lease,
        };
        t.insert(&kv, current.is_none())?;
        events.push(Event::Put(kv));
        Ok(())
    }

    /// Invariants 10 and 12: `puts` at one revision, after granting
    /// `grant` (a chosen id and its TTL) if given; everything that can fail
    /// is checked first (the values' total bounds each value).
    fn put_batch(
        &mut self,
        t: &mut impl TablesMut,
        puts: &[BatchPut],
        grant: Option<(u64, u64)>,
        events: &mut Vec<Event>,
    ) -> Result<Output> {
        if let Some((lease, ttl_ms)) = grant {
            crate::check_chosen_lease(lease)?;
            check_ttl(ttl_ms)?;
            if self.leases.contains_key(&lease) {
                return Err(KvError::AlreadyExists(
                    format!("lease {lease}").into_bytes(),
                ));
            }
        }
        self.limits.check_batch(puts)?;
        let granted = grant.map(|(lease, _)| lease);
        for p in puts.iter().filter(|p| p.lease != granted) {
            self.check_lease(p.lease)?;
        }
        if let Some((lease, ttl_ms)) = grant {
            self.new_lease(lease, ttl_ms);
        }
        let revision = self.bump();
        for p in puts {
            let current = t.get(&p.key)?;
            self.write(
                t,
                &p.key,
                current.as_ref(),
                p.value.clone(),
                p.lease,
                revision,
                events,
            )?;
        }
        Ok(Output::Written { revision })
    }

    fn apply_op(
        &mut self,
        t: &mut impl TablesMut,
        op: &Op,
        events: &mut Vec<Event>,
    ) -> Result<Output> {
        let limits = self.limits;
        match op {
            Op::Put { key, value, lease } => {
                limits.check_key(key)?;
                limits.check_value(value)?;
                self.check_lease(*lease)?;
                let current = t.get(key)?;
                let revision = self.bump();
                self.write(
                    t,
                    key,
                    current.as_ref(),
                    value.clone(),
                    *lease,
                    revision,
                    events,
                )?;
                Ok(Output::Written { revision })
            }
            Op::Insert { key, value, lease } => {
                limits.check_key(key)?;
                limits.check_value(value)?;
                self.check_lease(*lease)?;
                if t.get(key)?.is_some() {
                    return Err(KvError::AlreadyExists(key.clone()));
                }
                let revision = self.bump();
                self.write(t, key, None, value.clone(), *lease, revision, events)?;
                Ok(Output::Written { revision })
            }
            Op::Delete { key } => {
                limits.check_key(key)?;
                if !t.remove(key)? {
                    return Ok(Output::Deleted {
                        revision: 0,
                        count: 0,
                    });
                }
                let revision = self.bump();
                events.push(Event::Delete {
                    key: key.clone(),
                    revision,
                });
                Ok(Output::Deleted { revision, count: 1 })
            }
            Op::DeletePrefix { prefix } => {
                limits.check_key(prefix)?;
                let keys: Vec<Vec<u8>> = t.list(prefix)?.into_iter().map(|kv| kv.key).collect();
                if keys.is_empty() {
                    return Ok(Output::Deleted {
                        revision: 0,
                        count: 0,
                    });
                }
                let revision = self.bump();
                let count = keys.len() as u64;
                for key in keys {
                    t.remove(&key)?;
                    events.push(Event::Delete { key, revision });
                }
                Ok(Output::Deleted { revision, count })
            }
            Op::Increment { key, delta } => {
                limits.check_key(key)?;
                let current = t.get(key)?;
                let value = increment_value(key, current.as_ref().map(|kv| &kv.value[..]), *delta)?;
                let lease = current.as_ref().and_then(|kv| kv.lease);
                let revision = self.bump();
                let text = value.to_string().into_bytes();
                self.write(t, key, current.as_ref(), text, lease, revision, events)?;
                Ok(Output::Counter { revision, value })
            }
            Op::CompareAndSwap {
                key,
                expected,
                value,
            } => {
                limits.check_key(key)?;
                limits.check_value(value)?;
                let current = t.get(key)?;
                let value_now = current.as_ref().map(|kv| kv.value.clone());
                if value_now != *expected {
                    return Ok(Output::Mismatch { current: value_now });
                }
                let lease = current.as_ref().and_then(|kv| kv.lease);
                let revision = self.bump();
                self.write(
                    t,
                    key,
                    current.as_ref(),
                    value.clone(),
                    lease,
                    revision,
                    events,
                )?;
                Ok(Output::Swapped { revision })
            }
            Op::LeaseGrant { ttl_ms } => {
                check_ttl(*ttl_ms)?;
                // Invariant 12: past the ids clients chose.
                while self.leases.contains_key(&self.next_lease) {
                    self.next_lease += 1;
                }
                let id = self.next_lease;
                self.next_lease += 1;
                self.new_lease(id, *ttl_ms);
                Ok(Output::Lease {
                    id,
                    ttl_ms: *ttl_ms,
                })
            }
            Op::LeaseKeepAlive { id } => {
                let now = self.clock_ms;
                // Only lengthens (invariant 13): a held lease stays held.
                // Every other lease's expiry is at most its TTL past the
                // clock, so this is `now + ttl` as it always was.
                let ttl_ms = (self.lengthen(*id, |ttl| now.saturating_add(ttl)))
                    .ok_or(KvError::LeaseNotFound(*id))?;
                Ok(Output::Lease { id: *id, ttl_ms })
            }
            Op::LeaseRevoke { id } => {
                if !self.leases.contains_key(id) {
                    return Err(KvError::LeaseNotFound(*id));
                }
                let count = self.drop_lease(t, *id, events)?;
                Ok(Output::Deleted {
                    revision: if count > 0 { self.revision } else { 0 },
                    count,
                })
            }
            Op::BarrierArrive {
                id,
                participant,
                participants,
                timeout_ms,
            } => {
                limits.check_key(id)?;
                limits.check_key(participant)?;
                if *participants == 0 {
                    return Err(KvError::InvalidArgument(
                        "a barrier needs at least one participant".into(),
                    ));
                }
                let deadline_ms = self.clock_ms.saturating_add(*timeout_ms);
                let b = self.barriers.entry(id.clone()).or_insert_with(|| Barrier {
                    participants: *participants,
                    arrived: BTreeSet::new(),
                    deadline_ms,
                    status: BarrierStatus::Waiting {
                        arrived: 0,
                        participants: *participants,
                    },
                });
                // A count of 0: cancelled before anyone arrived.
                if b.participants != *participants && b.participants != 0 {
                    return Err(KvError::InvalidArgument(format!(
                        "barrier `{}` has {} participants, not {participants}",
                        show_key(id),
                        b.participants
                    )));
                }
                if let BarrierStatus::Waiting { .. } = b.status {
                    b.arrived.insert(participant.clone());
                    let arrived = b.arrived.len() as u32;
                    b.status = if arrived >= b.participants {
                        BarrierStatus::Passed
                    } else {
                        BarrierStatus::Waiting {
                            arrived,
                            participants: b.participants,
                        }
                    };
                }
                Ok(Output::Barrier(b.status.clone()))
            }
            Op::BarrierCancel { id, reason } => {
                // Cancelled before anyone arrived: kept for the retention
                // from now (invariant 4), so late arrivals fail too.
                let now = self.clock_ms;
                let b = self.barriers.entry(id.clone()).or_insert_with(|| Barrier {
                    participants: 0,
                    arrived: BTreeSet::new(),
                    deadline_ms: now,
                    status: BarrierStatus::Waiting {
                        arrived: 0,
                        participants: 0,
                    },
                });
                if let BarrierStatus::Waiting { .. } = b.status {
                    b.status = BarrierStatus::Failed {
                        reason: format!("cancelled: {reason}"),
                    };
                }
                Ok(Output::Barrier(b.status.clone()))
            }
            Op::PutBatch { puts } => self.put_batch(t, puts, None, events),
            Op::GrantPutBatch {
                lease,
                ttl_ms,
                puts,
            } => self.put_batch(t, puts, Some((*lease, *ttl_ms)), events),
            Op::Tick
            | Op::RenewLeases
            | Op::ExtendLeases { .. }
            | Op::HoldLeases { .. }
            | Op::ExpireLeases { .. } => Ok(Output::Ticked),
            Op::Guarded { guard, op } => {
                if !guard.holds(t)? {
                    return Err(guard.refusal("write", op.key().unwrap_or_default()));
                }
                self.apply_op(t, op, events)
            }
            Op::Once {
                client,
                seq,
                floor,
                op,
            } => self.apply_once(t, (*client, *seq, *floor), op, events),
        }
    }
}

/// Refuses a lease of no time at all.
fn check_ttl(ttl_ms: u64) -> Result<()> {
    if ttl_ms == 0 {
        return Err(KvError::InvalidArgument(
            "lease TTL must be positive".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
