//! The scheduler's spans of a job's trace, from its events: how long it
//! queued, each attempt (placed → ended, with the cause), each restart
//! (ended → queued again), and the job itself (submitted → ended). Written
//! once the event is committed (invariant 4), by the leader's pass; the
//! span ids of the job and of each attempt come from the job's
//! `JobTrace`, so workers' spans hang under them (tessel_trace invariant
//! 2). Pure [`spans`]; [`record`] hands them to the exporter.

use tessel_trace::{JobSpan, JobTrace, KeyValue, Parent};

use super::{JobEvent, JobRecord, JobState};

/// Exports the spans event `e` of `job` closes (nothing when the job has
/// no trace or export is off).
pub(super) fn record(job: &JobRecord, e: &JobEvent) {
    if !tessel_trace::export::enabled() {
        return;
    }
    let Some(trace) = job.trace.as_deref().and_then(|t| JobTrace::parse(t).ok()) else {
        return;
    };
    for span in spans(job, e) {
        tessel_trace::record(&trace, span);
    }
}

/// The spans event `e` of `job` closes.
pub(super) fn spans(job: &JobRecord, e: &JobEvent) -> Vec<JobSpan> {
    let base = || {
        vec![
            KeyValue::new("tessel.job.id", job.id.clone()),
            KeyValue::new("tessel.attempt", i64::from(e.attempt)),
        ]
    };
    let span = |name, id, parent, start, attributes, error| JobSpan {
        name,
        id,
        parent,
        start_unix_ms: start,
        end_unix_ms: e.unix_ms,
        attributes,
        error,
    };
    let mut out = Vec::new();
    match e.from {
        JobState::Pending => {
            let mut a = base();
            if e.to == JobState::Scheduled {
                a.push(KeyValue::new("tessel.placement", job.placement.join(",")));
            }
            out.push(span(
                "queued",
                Parent::None,
                Parent::Root,
                e.since_unix_ms,
                a,
                None,
            ));
        }
        JobState::Scheduled | JobState::Running
            if e.to == JobState::Restarting || e.to.is_terminal() =>
        {
            let mut a = base();
            a.push(KeyValue::new("tessel.placement", job.placement.join(",")));
            a.push(KeyValue::new("tessel.end", e.to.name()));
            let mut error = None;
            if let Some(c) = e.cause {
                a.push(KeyValue::new("tessel.cause", c.name()));
                if !c.is_planned() {
                    error = Some(e.reason.clone().unwrap_or_else(|| c.name().into()));
                }
            }
            out.push(span(
                "attempt",
                Parent::Attempt(e.attempt),
                Parent::Root,
                job.placed_unix_ms,
                a,
                error,
            ));
        }
        JobState::Restarting => {
            let mut a = base();
            a.push(KeyValue::new("tessel.restarts", i64::from(job.restarts)));
            a.push(KeyValue::new(
                "tessel.suspensions",
                i64::from(job.suspensions),
            ));
            if let Some(r) = &e.reason {
                a.push(KeyValue::new("tessel.reason", r.clone()));
            }
            out.push(span(
                "restart",
                Parent::None,
                Parent::Root,
                e.since_unix_ms,
                a,
                None,
            ));
        }
        _ => {}
    }
    if e.to.is_terminal() {
        let a = vec![
            KeyValue::new("tessel.job.id", job.id.clone()),
            KeyValue::new("tessel.job.name", job.name.clone()),
            KeyValue::new("tessel.state", e.to.name()),
            KeyValue::new("tessel.processes", i64::from(job.processes)),
            KeyValue::new("tessel.attempts", i64::from(job.attempt)),
            KeyValue::new("tessel.restarts", i64::from(job.restarts)),
            KeyValue::new("tessel.suspensions", i64::from(job.suspensions)),
        ];
        let error =
            (e.to == JobState::Failed).then(|| e.reason.clone().unwrap_or_else(|| "failed".into()));
        out.push(span(
            "job",
            Parent::Root,
            Parent::None,
            job.submitted_unix_ms,
            a,
            error,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::FailureKind;
    use crate::scheduler::{SchedulerState, Submission};

    /// A job placed, lost, restarted and finished: each event closes the
    /// span of the interval it ends, under the job's root; the attempt's
    /// span carries its cause and is an error only for a failure.
    #[test]
    fn each_event_closes_the_span_of_what_it_ends() {
        let mut s = SchedulerState::default();
        let id = s.submit(
            &Submission {
                name: "j".into(),
                processes: 1,
                devices_per_process: 1,
                plugin: "cpu".into(),
                max_restarts: 1,
                trace: Some(JobTrace::new().to_string()),
            },
            100,
        );
        let mut job = s.job(&id).unwrap().clone();
        job.placement = vec!["w0".into()];
        job.placed_unix_ms = 150;
        let ev = |from, to, since, at, cause: Option<FailureKind>| JobEvent {
            seq: 0,
            unix_ms: at,
            from,
            to,
            attempt: 1,
            reason: cause.map(|c| format!("{} it was", c.name())),
            cause,
            since_unix_ms: since,
        };
        let names = |v: &[JobSpan]| {
            v.iter()
                .map(|s| (s.name, s.parent, s.start_unix_ms))
                .collect::<Vec<_>>()
        };
        let queued = spans(
            &job,
            &ev(JobState::Pending, JobState::Scheduled, 100, 150, None),
        );
        assert_eq!(names(&queued), [("queued", Parent::Root, 100)]);
        let running = ev(JobState::Scheduled, JobState::Running, 150, 160, None);
        assert!(spans(&job, &running).is_empty(), "the attempt goes on");
        let lost = spans(
            &job,
            &ev(
                JobState::Running,
                JobState::Restarting,
                160,
                300,
                Some(FailureKind::WorkerLost),
            ),
        );
        assert_eq!(names(&lost), [("attempt", Parent::Root, 150)]);
        assert_eq!(lost[0].id, Parent::Attempt(1));
        assert!(lost[0].error.as_deref().unwrap().contains("worker_lost"));
        let moved = spans(
            &job,
            &ev(
                JobState::Running,
                JobState::Restarting,
                160,
                300,
                Some(FailureKind::Suspended),
            ),
        );
        assert!(moved[0].error.is_none(), "a planned move is not an error");
        let restart = spans(
            &job,
            &ev(JobState::Restarting, JobState::Pending, 300, 320, None),
        );
        assert_eq!(names(&restart), [("restart", Parent::Root, 300)]);
        let done = spans(
            &job,
            &ev(JobState::Running, JobState::Succeeded, 330, 900, None),
        );
        assert_eq!(
            names(&done),
            [("attempt", Parent::Root, 150), ("job", Parent::None, 100)]
        );
        assert_eq!(done[1].id, Parent::Root);
        assert!(done
            .iter()
            .all(|s| s.end_unix_ms == 900 && s.error.is_none()));
    }
}
