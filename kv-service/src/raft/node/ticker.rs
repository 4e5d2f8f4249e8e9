//! The leader's ticks (node invariant 3), stamped by its clock (`clock`):
//! it proposes a `Tick` when a lease or barrier falls due, when a renewed
//! lease must be held or a held one falls silent (`renewals` invariants 2
//! and 3; the proposer adds those to the tick's proposal).

use super::*;

/// Runs for as long as the replica does; ticks only while it leads.
pub(super) async fn tick_when_due(
    raft: Raft<TypeConfig>,
    leases: LeaseBook,
    proposer: Proposer,
    id: u64,
    quorum: QuorumWatch,
    leases_renewed: Arc<AtomicU64>,
) {
    let LeaseBook {
        applied,
        renewals,
        clock,
    } = &leases;
    // The clock is read outside `applied.read` (`clock::LeaderClock::now_ms`).
    let next_wake = || {
        let now = clock.now_ms();
        applied.read(|s, _| renewals.next_wake_ms(s, now))
    };
    let mut changes = applied.changes();
    let mut forgotten_at = tokio::time::Instant::now();
    loop {
        let wait = match next_wake() {
            Some(ms) => Duration::from_millis(ms.saturating_sub(clock.now_ms())),
            None => Duration::from_secs(1),
        }
        .min(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            r = changes.changed() => {
                if r.is_err() { return; }
                continue;
            }
        }
        let leader = raft.metrics().borrow().current_leader;
        let due = next_wake().is_some_and(|ms| ms <= clock.now_ms());
        if leader == Some(id)
            && due
            && renew_leases_once_per_term(&raft, &quorum, &leases_renewed, &leases)
                .await
                .is_ok()
        {
            let _ = proposer
                .propose(Request {
                    now_ms: clock.now_ms(),
                    op: Op::Tick,
                })
                .await;
        }
        if forgotten_at.elapsed() > Duration::from_secs(10) {
            applied.read(|s, _| renewals.retain_known(s));
            forgotten_at = tokio::time::Instant::now();
        }
        if raft.metrics().borrow().running_state.is_err() {
            return;
        }
    }
}
