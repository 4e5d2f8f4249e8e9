//! Spans with ids and times of their own: the scheduler writes a job's
//! spans when it knows how they ended (an attempt's span at its end, the
//! root at the job's), under ids every process derives from the job's
//! [`JobTrace`].

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks};

use crate::JobTrace;

/// Which span of the job a recorded span is, or hangs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parent {
    /// No parent: the job's root span itself.
    None,
    /// Under the job's root span.
    Root,
    /// Under attempt `n`'s span.
    Attempt(u32),
}

/// A span of a job, with its own times.
#[derive(Debug, Clone)]
pub struct JobSpan {
    /// Its name (`job`, `attempt`, `queued`, `restart`, `submit`).
    pub name: &'static str,
    /// Its id: `Root` the job's root span's, `Attempt(n)` attempt `n`'s,
    /// `None` a new one.
    pub id: Parent,
    /// Its parent.
    pub parent: Parent,
    /// When it began (Unix ms).
    pub start_unix_ms: u64,
    /// When it ended (Unix ms).
    pub end_unix_ms: u64,
    /// Its attributes.
    pub attributes: Vec<KeyValue>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

fn at(unix_ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(unix_ms)
}

fn id_of(trace: &JobTrace, which: Parent) -> SpanId {
    match which {
        Parent::None => RandomIdGenerator::default().new_span_id(),
        Parent::Root => trace.root,
        Parent::Attempt(n) => trace.attempt_span(n),
    }
}

/// Queues `span` of the job traced by `trace` for export (a no-op where
/// export is not installed).
pub fn record(trace: &JobTrace, span: JobSpan) {
    if !crate::export::enabled() {
        return;
    }
    let parent = match span.parent {
        Parent::None => SpanId::INVALID,
        p => id_of(trace, p),
    };
    let data = SpanData {
        span_context: SpanContext::new(
            trace.trace_id,
            id_of(trace, span.id),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: parent,
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: Cow::Borrowed(span.name),
        start_time: at(span.start_unix_ms),
        end_time: at(span.end_unix_ms.max(span.start_unix_ms)),
        attributes: span.attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: span.error.map_or(Status::Unset, Status::error),
        instrumentation_scope: InstrumentationScope::builder("tessel").build(),
    };
    crate::export::submit(data);
}
