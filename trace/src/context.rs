//! The trace context a job carries: W3C `traceparent` text in its record.
//!
//! Invariants:
//! 1. A job's spans share its trace id; its root span has id `root`.
//! 2. Attempt `n`'s span id is a pure function of `root` and `n`, never 0,
//!    so every worker and the scheduler agree on it without talking.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

use crate::TraceError;

/// A job's trace id and root span id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobTrace {
    /// The trace.
    pub trace_id: TraceId,
    /// The job's root span.
    pub root: SpanId,
}

impl JobTrace {
    /// A new trace for a job being submitted.
    pub fn new() -> JobTrace {
        let ids = RandomIdGenerator::default();
        JobTrace {
            trace_id: ids.new_trace_id(),
            root: ids.new_span_id(),
        }
    }

    /// Parses W3C `traceparent` text (version 00).
    pub fn parse(text: &str) -> Result<JobTrace, TraceError> {
        let bad = || TraceError::BadTraceparent(text.chars().take(80).collect());
        let parts: Vec<&str> = text.split('-').collect();
        let [version, trace, span, flags] = parts.as_slice() else {
            return Err(bad());
        };
        let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
        if *version != "00" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
            return Err(bad());
        }
        let trace_id = TraceId::from_hex(trace).map_err(|_| bad())?;
        let root = SpanId::from_hex(span).map_err(|_| bad())?;
        if trace_id == TraceId::INVALID || root == SpanId::INVALID {
            return Err(bad());
        }
        Ok(JobTrace { trace_id, root })
    }

    /// Invariant 2: the span id of attempt `attempt`.
    pub fn attempt_span(&self, attempt: u32) -> SpanId {
        let root = u64::from_be_bytes(self.root.to_bytes());
        let id = splitmix(root ^ splitmix(u64::from(attempt).wrapping_add(0x7e55e1)));
        SpanId::from_bytes(id.max(1).to_be_bytes())
    }

    /// A context whose (remote) parent is attempt `attempt`'s span: what a
    /// worker's spans of that attempt hang under.
    pub fn attempt_context(&self, attempt: u32) -> Context {
        Context::new().with_remote_span_context(SpanContext::new(
            self.trace_id,
            self.attempt_span(attempt),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ))
    }
}

/// Makes `span` (a `tracing` span of target [`crate::TARGET`]) a child of
/// attempt `attempt`'s span in the trace `traceparent` names; nothing when
/// there is no (valid) trace or no exporter to join it.
pub fn join_attempt(span: &tracing::Span, traceparent: Option<&str>, attempt: u32) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if let Some(t) = traceparent.and_then(|t| JobTrace::parse(t).ok()) {
        // Fails only where no exporter's layer is installed.
        let _ = span.set_parent(t.attempt_context(attempt));
    }
}

impl Default for JobTrace {
    fn default() -> JobTrace {
        JobTrace::new()
    }
}

impl std::fmt::Display for JobTrace {
    /// W3C `traceparent`: `00-TRACE-SPAN-01` (sampled).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "00-{}-{}-01", self.trace_id, self.root)
    }
}

/// A bijective mix of 64 bits (splitmix64's finalizer).
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips_and_bad_ones_are_refused() {
        let t = JobTrace::new();
        assert_eq!(JobTrace::parse(&t.to_string()).unwrap(), t);
        for bad in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0af7651916cd43dd8448eb211c80319g-b7ad6b7169203331-01",
        ] {
            assert!(JobTrace::parse(bad).is_err(), "{bad}");
        }
    }

    /// Invariant 2: the same root and attempt give the same id everywhere;
    /// attempts and jobs differ.
    #[test]
    fn attempt_spans_are_agreed_and_distinct() {
        let t = JobTrace::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        let ids: Vec<SpanId> = (1..=100).map(|a| t.attempt_span(a)).collect();
        let mut unique = ids.clone();
        unique.sort_by_key(|s| s.to_bytes());
        unique.dedup();
        assert_eq!(unique.len(), 100);
        assert!(!ids.contains(&t.root) && !ids.contains(&SpanId::INVALID));
        assert_eq!(
            JobTrace::parse(&t.to_string()).unwrap().attempt_span(7),
            ids[6]
        );
        assert_ne!(JobTrace::new().attempt_span(1), t.attempt_span(1));
    }
}
