//! A job's attempts as its events tell them: when each was placed, where
//! it ran, and how it ended (a failure's kind, or a planned move). Pure;
//! `tessel job` shows it.

use serde::{Deserialize, Serialize};

use super::{JobEvent, JobState};
use crate::jobs::FailureKind;

/// One attempt of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// Its number (from 1).
    pub attempt: u32,
    /// When it was placed.
    pub placed_unix_ms: u64,
    /// When it ended; `None` while it runs.
    pub ended_unix_ms: Option<u64>,
    /// The state it ended in: `Restarting` for an attempt another
    /// replaced, else the job's final state.
    pub end: Option<JobState>,
    /// What ended it, when it did not succeed or get cancelled.
    pub cause: Option<FailureKind>,
    /// Why, for people.
    pub reason: Option<String>,
}

/// The attempts in `events` (in sequence order), oldest first.
pub fn attempts(events: &[JobEvent]) -> Vec<Attempt> {
    let mut out: Vec<Attempt> = Vec::new();
    for e in events {
        if e.to == JobState::Scheduled {
            out.push(Attempt {
                attempt: e.attempt,
                placed_unix_ms: e.unix_ms,
                ended_unix_ms: None,
                end: None,
                cause: None,
                reason: None,
            });
            continue;
        }
        let ends = matches!(e.from, JobState::Scheduled | JobState::Running)
            && (e.to == JobState::Restarting || e.to.is_terminal());
        if let Some(a) = out.last_mut().filter(|a| ends && a.attempt == e.attempt) {
            a.ended_unix_ms = Some(e.unix_ms);
            a.end = Some(e.to);
            a.cause = e.cause;
            a.reason = e.reason.clone();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(
        seq: u64,
        from: JobState,
        to: JobState,
        attempt: u32,
        cause: Option<FailureKind>,
    ) -> JobEvent {
        JobEvent {
            seq,
            unix_ms: 100 * seq,
            from,
            to,
            attempt,
            reason: cause.map(|c| format!("{} happened", c.name())),
            cause,
            since_unix_ms: 0,
        }
    }

    /// A move, a loss and a success make three attempts, each with its
    /// end; a cancellation while Pending ends none.
    #[test]
    fn each_attempt_ends_with_its_cause() {
        use JobState::*;
        let events = [
            ev(0, Pending, Scheduled, 1, None),
            ev(1, Scheduled, Running, 1, None),
            ev(2, Running, Restarting, 1, Some(FailureKind::Suspended)),
            ev(3, Restarting, Pending, 1, None),
            ev(4, Pending, Scheduled, 2, None),
            ev(5, Scheduled, Restarting, 2, Some(FailureKind::WorkerLost)),
            ev(6, Restarting, Pending, 2, None),
            ev(7, Pending, Scheduled, 3, None),
            ev(8, Scheduled, Running, 3, None),
            ev(9, Running, Succeeded, 3, None),
        ];
        let a = attempts(&events);
        assert_eq!(a.len(), 3);
        assert_eq!(
            a.iter()
                .map(|a| (a.attempt, a.end, a.cause))
                .collect::<Vec<_>>(),
            [
                (1, Some(Restarting), Some(FailureKind::Suspended)),
                (2, Some(Restarting), Some(FailureKind::WorkerLost)),
                (3, Some(Succeeded), None),
            ]
        );
        assert_eq!((a[1].placed_unix_ms, a[1].ended_unix_ms), (400, Some(500)));
        let cancelled = [
            ev(0, Pending, Scheduled, 1, None),
            ev(1, Scheduled, Restarting, 1, Some(FailureKind::Exited)),
            ev(2, Restarting, Cancelled, 1, None),
        ];
        let a = attempts(&cancelled);
        assert_eq!(a[0].end, Some(Restarting), "the cancel ended no attempt");
        assert!(attempts(&cancelled[..1])[0].ended_unix_ms.is_none());
    }
}
