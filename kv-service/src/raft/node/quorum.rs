//! When this replica, as leader, last heard from a majority: a leader cut
//! off from its followers says so instead of holding requests it cannot
//! commit, and a fresh acknowledgement lets it answer keep-alives from
//! memory (`renewals` invariant 1).
//!
//! Invariants:
//! 1. The age is never underestimated by more than the time openraft's
//!    metrics take to reach this task: each report's `millis_since_quorum_ack`
//!    is counted from when the report arrived, and between reports the age
//!    grows with the clock.
//! 2. A replica that is not the leader has no acknowledgement: every check
//!    of a follower says "not fresh". A new leader counts from when it was
//!    elected (a majority's votes) until its first acknowledgement.
//! 3. An acknowledgement is of a message the leader sent at a time it
//!    records (openraft's `sending_time`); a follower that received it
//!    refuses to vote for another candidate for the leader lease (openraft:
//!    `election_timeout_max`). So within half that of it this replica is
//!    the only leader, the other half to spare for clocks that drift.
//! 4. Requests waiting to learn that the leadership is lost wait on one
//!    flag the watch task sets when it is, at the moment it is: none of
//!    them wakes before. Each polling the age every 250 ms was 260,000
//!    wake-ups a second on a leader holding 16,384 workers' waits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::{Raft, ServerState};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::raft::TypeConfig;
use tessel_kv::KvError;

/// How long a leader may go without a majority's acknowledgement before
/// it answers `Unavailable`: the leader lease (the longest election
/// timeout), after which the followers may well have elected another.
fn lost_after(config: &openraft::Config) -> Duration {
    Duration::from_millis(config.election_timeout_max)
}

/// How recent an acknowledgement must be for the leader to act on its own
/// (serve a read, answer a keep-alive from memory) without asking the
/// followers again (invariant 3): half the leader lease, the other half a
/// margin for clocks that drift.
fn fresh_within(config: &openraft::Config) -> Duration {
    Duration::from_millis(config.election_timeout_max / 2)
}

/// The term and time of the last acknowledgement the newest metrics
/// report (invariants 1 and 2), marking the report seen.
fn last_report(
    metrics: &mut watch::Receiver<openraft::RaftMetrics<u64, openraft::BasicNode>>,
    elected: &mut Option<(u64, Instant)>,
) -> Option<(u64, Instant)> {
    let m = metrics.borrow_and_update();
    let term = m.current_term;
    if m.state != ServerState::Leader {
        *elected = None;
    } else if elected.is_none_or(|(t, _)| t != term) {
        *elected = Some((term, Instant::now()));
    }
    match (m.state, m.millis_since_quorum_ack) {
        // Invariant 1: counted from now, this report's arrival.
        (ServerState::Leader, Some(ms)) => Instant::now()
            .checked_sub(Duration::from_millis(ms))
            .map(|at| (term, at)),
        // Invariant 2: elected, not yet acknowledged.
        (ServerState::Leader, None) => *elected,
        _ => None,
    }
}

/// The last time a majority acknowledged this replica as leader.
#[derive(Clone)]
pub(super) struct QuorumWatch {
    last_ack: Arc<Mutex<Option<(u64, Instant)>>>,
    /// Woken on every report.
    reported: Arc<Notify>,
    /// Whether a majority acknowledged this replica as leader within
    /// `lost` (invariant 4).
    held: watch::Receiver<bool>,
    fresh: Duration,
    lost: Duration,
}

impl QuorumWatch {
    /// Follows `raft`'s metrics for as long as it runs.
    pub(super) fn start(raft: &Raft<TypeConfig>, config: &openraft::Config) -> QuorumWatch {
        let last_ack = Arc::new(Mutex::new(None));
        let reported = Arc::new(Notify::new());
        let lost = lost_after(config);
        let mut metrics = raft.metrics();
        // (term, when this replica first saw itself leading it).
        let mut elected: Option<(u64, Instant)> = None;
        let mut seen = last_report(&mut metrics, &mut elected);
        let held_at = move |seen: Option<(u64, Instant)>| {
            seen.map(|(_, at)| at + lost)
                .filter(|&u| u > Instant::now())
        };
        let (held_tx, held) = watch::channel(held_at(seen).is_some());
        let watch = QuorumWatch {
            last_ack: last_ack.clone(),
            reported: reported.clone(),
            held,
            fresh: fresh_within(config),
            lost,
        };
        tokio::spawn(async move {
            loop {
                *last_ack.lock().unwrap_or_else(|p| p.into_inner()) = seen;
                reported.notify_waiters();
                // Invariant 4: flipped when it changes, and only then.
                let until = held_at(seen);
                held_tx
                    .send_if_modified(|h| std::mem::replace(h, until.is_some()) != until.is_some());
                tokio::select! {
                    changed = metrics.changed() => {
                        if changed.is_err() {
                            held_tx.send_replace(false);
                            return;
                        }
                        seen = last_report(&mut metrics, &mut elected);
                    }
                    () = tokio::time::sleep_until(until.unwrap_or_else(Instant::now)), if until.is_some() => {}
                }
            }
        });
        watch
    }

    /// The term in which a majority acknowledged this leader recently
    /// enough for it to act alone (invariant 3), if it did.
    pub(super) fn fresh_term(&self) -> Option<u64> {
        self.acked_within(self.fresh)
    }

    /// Returns once a majority has acknowledged this replica as leader of
    /// `term` recently enough (invariant 3), or `Unavailable` once it has
    /// not for the leader lease. Waiting asks nothing of the followers:
    /// openraft's heartbeats bring the acknowledgement. (A round of
    /// AppendEntries per read, openraft's `ensure_linearizable`, is what a
    /// busy leader could least afford: at 8,192 workers thousands of them
    /// pushed the heartbeats past their deadline and cost the leadership.)
    pub(super) async fn confirmed(&self, term: u64) -> Result<(), KvError> {
        loop {
            let next = self.reported.notified();
            if self.fresh_term() == Some(term) {
                return Ok(());
            }
            if self.acked_within(self.lost) != Some(term) {
                return Err(KvError::Unavailable(format!(
                    "this replica has not been acknowledged as leader of term {term} by a majority for {:?}",
                    self.lost
                )));
            }
            // Also as the acknowledgement ages without a report.
            let _ = tokio::time::timeout(self.fresh / 8, next).await;
        }
    }

    fn acked_within(&self, within: Duration) -> Option<u64> {
        let last = *self.last_ack.lock().unwrap_or_else(|p| p.into_inner());
        last.filter(|(_, at)| at.elapsed() < within)
            .map(|(term, _)| term)
    }

    /// `work`'s result, or `Unavailable` once this replica has gone the
    /// leader lease without a majority's acknowledgement as leader: what
    /// it waits for may never come, and another replica may serve it.
    pub(super) async fn unless_lost<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, KvError>>,
    ) -> Result<T, KvError> {
        tokio::select! {
            r = work => r,
            () = self.lost() => Err(KvError::Unavailable(format!(
                "this replica has not been acknowledged as leader by a majority for {:?}",
                self.lost
            ))),
        }
    }

    /// Resolves once this replica has gone `lost` without a majority's
    /// acknowledgement as leader (or is no longer leader).
    async fn lost(&self) {
        // A closed channel: the watch task ended with Raft, as lost.
        let _ = self.held.clone().wait_for(|held| !held).await;
    }
}
