//! A follower's relay of keep-alives: the frames of every keep-alive stream
//! a follower serves reach the leader in batches (`RenewMany`), so the
//! leader handles one request a batch instead of a frame each way per
//! keep-alive. With 16,384 workers beating once a second those frames were
//! half of the leader's core (docs/performance.md, "Relayed keep-alives");
//! clients open their streams on followers for this (client `keep_alives`
//! invariant 2).
//!
//! Invariants:
//! 1. One batch in flight at a time. The keep-alives that arrive while it
//!    is, or within [`LINGER`] of the first after a pause, form the next
//!    (≤ [`RENEW_MANY_MAX`]).
//! 2. Every keep-alive handed in is answered once: with the leader's result
//!    for its lease, or `Unavailable` when the batch found no leader, no
//!    answer within [`DEADLINE`] or an answer of another shape; the client
//!    then sends that keep-alive as a request (client `keep_alives`
//!    invariant 1).
//! 3. The leader renews a relayed lease when the batch reaches it, after
//!    its holder sent the keep-alive: no lease counts as renewed before its
//!    holder renewed it, and a lease whose holder stopped still expires its
//!    TTL after the last keep-alive plus at most one batch's delay.
//! 4. A batch in flight to a leader this replica no longer follows ends
//!    `Unavailable` at once: a new leader renews every lease for one TTL
//!    from its term's start (`renewals` invariant 4), and the keep-alives
//!    queued meanwhile must reach it within that TTL, not wait out a dead
//!    leader's silence behind the batch (invariant 1).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};

use super::{leader_leaves, unavailable, Replica, ReplicaHandler};
use crate::wire::{ClientRequest, WireRequest, WireResponse, RENEW_MANY_MAX};
use tessel_kv::state::Output;
use tessel_kv::KvError;

/// How long the first keep-alive after a pause waits for others to join
/// its batch (invariant 1): a keep-alive's answer is this much later, a
/// second's beats of a thousand workers are 50 batches, not a thousand.
pub(super) const LINGER: Duration = Duration::from_millis(20);

/// How long a batch waits for the leader's answer (invariant 2). Longer
/// than a heartbeat interval, after which a worker gives its keep-alive up
/// (coordinator `registry` invariant 4): a leader slow for a moment then
/// costs late keep-alives, not a request each sent to it on top. A leader
/// gone ends the batch sooner, when its connection falls silent.
pub(super) const DEADLINE: Duration = Duration::from_secs(2);

type Answer = Result<Output, KvError>;

/// The keep-alives waiting for the next batch.
#[derive(Default)]
pub(super) struct Relay {
    queue: Mutex<Vec<(u64, oneshot::Sender<Answer>)>>,
    wake: Notify,
    /// Keep-alives the leader answered through this relay.
    relayed: AtomicU64,
}

impl Replica {
    /// Keep-alives this replica relayed to the leader and got answered
    /// (also `tessel_kv_keep_alives_relayed_total`).
    pub fn keep_alives_relayed(&self) -> u64 {
        self.handler.relay.relayed.load(Ordering::Relaxed)
    }
}

impl Relay {
    /// Queues a keep-alive of `lease` for the next batch; the receiver gets
    /// its answer (invariant 2).
    pub(super) fn ask(&self, lease: u64) -> oneshot::Receiver<Answer> {
        let (tx, rx) = oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((lease, tx));
        self.wake.notify_one();
        rx
    }

    fn take(&self) -> Vec<(u64, oneshot::Sender<Answer>)> {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let cut = queue.len().min(RENEW_MANY_MAX);
        let rest = queue.split_off(cut);
        std::mem::replace(&mut *queue, rest)
    }
}

/// Sends `relay`'s batches to the leader, one at a time, for as long as
/// the replica lives (invariant 1).
pub(super) async fn run(handler: Weak<ReplicaHandler>, relay: Arc<Relay>) {
    loop {
        relay.wake.notified().await;
        tokio::time::sleep(LINGER).await;
        loop {
            let batch = relay.take();
            if batch.is_empty() {
                break;
            }
            let Some(h) = handler.upgrade() else { return };
            let leases: Vec<u64> = batch.iter().map(|(lease, _)| *lease).collect();
            match h.renew_at_leader(leases).await {
                Ok(answers) => {
                    let n = answers.len() as u64;
                    relay.relayed.fetch_add(n, Ordering::Relaxed);
                    metrics::counter!("tessel_kv_keep_alives_relayed_total").increment(n);
                    for ((_, tx), answer) in batch.into_iter().zip(answers) {
                        let _ = tx.send(answer);
                    }
                }
                Err(e) => {
                    for (_, tx) in batch {
                        let _ = tx.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}

impl ReplicaHandler {
    /// The leader's answers to one batch, one a lease in order, or why
    /// there are none (always `Unavailable`: invariant 2).
    async fn renew_at_leader(&self, leases: Vec<u64>) -> Result<Vec<Answer>, KvError> {
        let n = leases.len();
        let leader = self.raft.metrics().borrow().current_leader;
        let leader = leader.ok_or_else(|| unavailable("no leader known"))?;
        if leader == self.id {
            // It leads since the keep-alives were queued.
            return Ok(self.renew_many(&leases).await);
        }
        let addr = self
            .leader_addr(leader, &self.control)
            .await
            .ok_or_else(|| unavailable(format!("leader {leader} has no address")))?;
        let req = WireRequest::Forwarded(ClientRequest::RenewMany { leases });
        // Invariant 4; a leader gone falls silent too (`rpc` invariant 4).
        let replaced = leader_leaves(&self.raft, |now| now == Some(leader));
        let answer = tokio::select! {
            answer = self.control.call(addr, &req, DEADLINE) => answer,
            () = replaced => {
                return Err(unavailable(format!("leader {leader} was replaced during a relayed batch")));
            }
        };
        match answer {
            Err(e) => Err(unavailable(format!("a relayed batch: {e}"))),
            Ok(WireResponse::Renewed(answers)) if answers.len() == n => Ok(answers),
            Ok(WireResponse::Output(Err(e))) => Err(unavailable(format!(
                "the leader refused a relayed batch: {e}"
            ))),
            Ok(_) => Err(unavailable(format!(
                "the leader answered a relayed batch of {n} otherwise"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_at_most_its_limit_in_arrival_order() {
        let relay = Relay::default();
        let _waiting: Vec<_> = (0..RENEW_MANY_MAX as u64 + 3)
            .map(|l| relay.ask(l))
            .collect();
        let first = relay.take();
        assert_eq!(first.len(), RENEW_MANY_MAX);
        assert_eq!(first[0].0, 0);
        let rest: Vec<u64> = relay.take().iter().map(|(l, _)| *l).collect();
        let max = RENEW_MANY_MAX as u64;
        assert_eq!(rest, vec![max, max + 1, max + 2]);
        assert!(relay.take().is_empty());
    }
}
