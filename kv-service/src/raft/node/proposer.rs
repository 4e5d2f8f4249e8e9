//! Group commit (invariant 5): client writes that arrive while a proposal is
//! in flight form the next one; leases renewed before a term's first write.

use super::*;

/// Most requests in one proposal, and the payload bytes after which a
/// proposal takes no more (a single larger request goes alone).
pub(super) const MAX_PROPOSAL_REQUESTS: usize = 1024;
pub(super) const MAX_PROPOSAL_BYTES: usize = 1 << 20;
/// Proposals in flight at once. One: the leader's own log sync overlaps
/// the followers' (storage invariant 5), so a second proposal overlaps
/// little and halves the batches, while each proposal costs every replica
/// a log write and two AppendEntries round trips (docs/performance.md).
pub(super) const PROPOSALS_IN_FLIGHT: usize = 1;

pub(super) type Waiter = tokio::sync::oneshot::Sender<Result<Output, KvError>>;

/// Groups concurrent client writes into one log entry (invariant 5).
#[derive(Clone)]
pub(super) struct Proposer {
    pub(super) queue: tokio::sync::mpsc::UnboundedSender<(Request, Waiter)>,
}

impl Proposer {
    pub(super) fn start(
        raft: Raft<TypeConfig>,
        quorum: QuorumWatch,
        leases: LeaseBook,
    ) -> Proposer {
        let (queue, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(propose_loop(raft, quorum, leases, rx));
        Proposer { queue }
    }

    pub(super) async fn propose(&self, req: Request) -> Result<Output, KvError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.queue
            .send((req, tx))
            .map_err(|_| unavailable("the replica is shutting down"))?;
        rx.await
            .unwrap_or_else(|_| Err(unavailable("the proposal was dropped")))
    }
}

/// What the proposer needs to hold the leases the leader renews and expire
/// the silent ones (`renewals` invariants 2 and 3): the applied state and
/// the renewals.
#[derive(Clone)]
pub(super) struct LeaseBook {
    pub(super) applied: Arc<AppliedState<SmTables>>,
    pub(super) renewals: Arc<Renewals>,
    pub(super) clock: Arc<LeaderClock>,
}

impl LeaseBook {
    /// The `HoldLeases` and `ExpireLeases` a proposal formed now must
    /// start with, if any.
    fn lease_ops(&self) -> Vec<Request> {
        let now_ms = self.clock.now_ms();
        self.applied
            .read(|s, _| self.renewals.lease_ops(s, now_ms))
            .into_iter()
            .map(|op| Request { now_ms, op })
            .collect()
    }

    /// `renewals` invariant 4, once this leader's `RenewLeases` of `term`
    /// committed.
    fn promote(&self, term: u64) {
        let now_ms = self.clock.now_ms();
        self.applied
            .read(|s, _| self.renewals.promote(s, now_ms, term));
    }
}

pub(super) async fn propose_loop(
    raft: Raft<TypeConfig>,
    quorum: QuorumWatch,
    leases: LeaseBook,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<(Request, Waiter)>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(PROPOSALS_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // Everything that queued while the previous proposals were busy.
        let mut bytes = first.0.op.payload_bytes();
        let mut batch = vec![first];
        while batch.len() < MAX_PROPOSAL_REQUESTS && bytes < MAX_PROPOSAL_BYTES {
            match rx.try_recv() {
                Ok(next) => {
                    bytes += next.0.op.payload_bytes();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        metrics::histogram!("tessel_kv_proposal_requests").record(batch.len() as f64);
        let raft = raft.clone();
        let quorum = quorum.clone();
        // Formed while no other proposal is in flight (one slot), so the
        // applied state holds every hold and expiry proposed before.
        let lease_ops = leases.lease_ops();
        tokio::spawn(async move {
            let (reqs, waiters): (Vec<Request>, Vec<Waiter>) = batch.into_iter().unzip();
            let first = lease_ops.len();
            let reqs: Vec<Request> = lease_ops.into_iter().chain(reqs).collect();
            // A leader cut off from its majority answers rather than hold
            // the writes (they may still commit: client invariant 2).
            let write = async {
                raft.client_write(Proposal::new(reqs))
                    .await
                    .map_err(|e| unavailable(format!("write: {e}")))
            };
            match quorum.unless_lost(write).await {
                Ok(resp) => {
                    let answers = resp.data.0.into_iter().skip(first);
                    for (w, r) in waiters.into_iter().zip(answers) {
                        let _ = w.send(r);
                    }
                }
                Err(e) => {
                    for w in waiters {
                        let _ = w.send(Err(e.clone()));
                    }
                }
            }
            drop(slot);
        });
    }
}

/// Proposes [`Op::RenewLeases`] once per term, before this leader's first
/// write or tick of the term (invariant 4). Until it has succeeded, no
/// write or tick may be proposed: one stamped with this leader's clock
/// would expire the leases that fell due while nobody could renew them.
pub(super) async fn renew_leases_once_per_term(
    raft: &Raft<TypeConfig>,
    quorum: &QuorumWatch,
    renewed: &AtomicU64,
    leases: &LeaseBook,
) -> Result<(), KvError> {
    let clock = &leases.clock;
    let term = raft.metrics().borrow().current_term;
    if renewed.load(Ordering::Acquire) == term {
        return Ok(());
    }
    let renew = async {
        raft.client_write(Proposal::one(Request {
            now_ms: clock.now_ms(),
            op: Op::RenewLeases,
        }))
        .await
        .map_err(|e| unavailable(format!("renewing leases: {e}")))
    };
    quorum.unless_lost(renew).await.map_err(|e| {
        tracing::warn!(term, error = %e, "renewing leases failed");
        e
    })?;
    // Before any keep-alive is answered from memory (`renewals` invariant 1).
    leases.promote(term);
    renewed.store(term, Ordering::Release);
    tracing::info!(term, "renewed every lease for the new term");
    Ok(())
}
