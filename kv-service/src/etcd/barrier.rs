//! Barriers on etcd: keys under `tessel/b/{hex id}/`, an outcome written
//! once by a create-only transaction, all under one lease of the timeout
//! plus the retention.

use super::*;

impl EtcdKv {
    /// One arrival at a barrier (invariants 3 and 7).
    pub(super) async fn arrive(
        &self,
        id: &[u8],
        participant: &[u8],
        participants: u32,
        timeout: Duration,
    ) -> Result<()> {
        let outcome_key = self.barrier_key(id, "outcome");
        let (stored, lease) = self.barrier_meta(id, participants, timeout).await?;
        let (count, deadline_ms) = std::str::from_utf8(&stored)
            .ok()
            .and_then(|s| s.split_once(' '))
            .and_then(|(n, d)| Some((n.parse::<u32>().ok()?, d.parse::<u64>().ok()?)))
            .ok_or_else(|| {
                KvError::Internal(format!("barrier `{}`: bad metadata", show_key(id)))
            })?;
        if count != participants {
            return Err(KvError::InvalidArgument(format!(
                "barrier `{}` has {count} participants, not {participants}",
                show_key(id)
            )));
        }
        let arrived_prefix = self.barrier_key(id, "a/");
        let arrival = [&arrived_prefix[..], hex(participant).as_bytes()].concat();
        let count_only = || GetOptions::new().with_prefix().with_count_only();
        // Arrive only while undecided; read the outcome otherwise.
        let r = self
            .txn(
                Txn::new()
                    .when([Compare::create_revision(
                        outcome_key.clone(),
                        CompareOp::Equal,
                        0,
                    )])
                    .and_then([
                        TxnOp::put(arrival, "", with_lease(lease)),
                        TxnOp::get(arrived_prefix.clone(), Some(count_only())),
                    ])
                    .or_else([TxnOp::get(outcome_key.clone(), None)]),
            )
            .await?;
        if !r.succeeded() {
            let kv = first_get(&r)
                .ok_or_else(|| KvError::Internal("barrier outcome vanished".into()))?;
            return barrier_result(id, kv.value());
        }
        let arrived = r
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(g) => Some(g.count() as u32),
                _ => None,
            })
            .unwrap_or(0);
        let now = unix_ms();
        if arrived >= participants && now < deadline_ms {
            return self.decide_barrier(id, "passed", lease).await;
        }
        let timed_out = format!("failed:timed out with {arrived} of {participants} participants");
        if now >= deadline_ms {
            return self.decide_barrier(id, &timed_out, lease).await;
        }
        let wait = Duration::from_millis(deadline_ms - now);
        let until = Instant::now() + wait;
        match self
            .wait_for_key(&outcome_key, header_revision(r.header()) + 1, until)
            .await?
        {
            Some(v) => barrier_result(id, &v),
            None => {
                // Count again: the message names who made it.
                let n = self
                    .kv
                    .clone()
                    .get(arrived_prefix, Some(count_only()))
                    .await
                    .map(|r| r.count() as u32)
                    .unwrap_or(arrived);
                let reason = format!("failed:timed out with {n} of {participants} participants");
                self.decide_barrier(id, &reason, lease).await
            }
        }
    }

    /// A barrier's metadata (`"{participants} {deadline_unix_ms}"`) and
    /// lease; the first arrival writes both (invariants 3 and 7).
    pub(super) async fn barrier_meta(
        &self,
        id: &[u8],
        participants: u32,
        timeout: Duration,
    ) -> Result<(Vec<u8>, i64)> {
        let key = self.barrier_key(id, "meta");
        if let (Some(kv), _) = self.read(&key).await? {
            return Ok((kv.value().to_vec(), kv.lease()));
        }
        let meta = format!(
            "{participants} {}",
            unix_ms().saturating_add(timeout.as_millis() as u64)
        );
        let lease = self
            .grant(timeout.saturating_add(self.opts.barrier_retention))
            .await? as i64;
        let r = self
            .txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.clone(), meta.clone(), with_lease(lease))])
                    .or_else([TxnOp::get(key, None)]),
            )
            .await?;
        if r.succeeded() {
            return Ok((meta.into_bytes(), lease));
        }
        // Someone else arrived first: theirs holds.
        if let Err(e) = self.revoke(lease as u64).await {
            tracing::debug!(error = %e, "revoking an unused barrier lease");
        }
        first_get(&r)
            .map(|kv| (kv.value().to_vec(), kv.lease()))
            .ok_or(KvError::LeaseNotFound(lease as u64))
    }

    /// Writes a barrier's outcome unless one exists; returns the stored one
    /// (invariant 3).
    pub(super) async fn decide_barrier(&self, id: &[u8], outcome: &str, lease: i64) -> Result<()> {
        let key = self.barrier_key(id, "outcome");
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), outcome, with_lease(lease))])
            .or_else([TxnOp::get(key, None)]);
        let r = self.txn(txn).await?;
        if r.succeeded() {
            return barrier_result(id, outcome.as_bytes());
        }
        match first_get(&r) {
            Some(kv) => barrier_result(id, kv.value()),
            None => Err(KvError::Internal("barrier outcome vanished".into())),
        }
    }
}

pub(super) fn barrier_result(id: &[u8], stored: &[u8]) -> Result<()> {
    match stored.strip_prefix(b"failed:") {
        None => Ok(()),
        Some(reason) => Err(KvError::BarrierFailed {
            id: id.to_vec(),
            reason: String::from_utf8_lossy(reason).into_owned(),
        }),
    }
}
