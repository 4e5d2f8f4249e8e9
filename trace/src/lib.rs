//! A job's trace (OpenTelemetry): one trace per job, from submit to its
//! end, joined by the coordinators, every attempt's workers and processes.
//!
//! * [`JobTrace`]: the trace context a job carries in its record (W3C
//!   `traceparent` text): the trace id and the id of the job's root span.
//!   Attempt `n`'s span id is derived from it ([`JobTrace::attempt_span`]),
//!   so a worker can parent its spans under an attempt span the scheduler
//!   writes only when the attempt ends.
//! * [`export`]: with `OTEL_EXPORTER_OTLP_ENDPOINT` (or `…_TRACES_ENDPOINT`)
//!   set, spans go over OTLP/HTTP (protobuf) through a bounded queue: a
//!   slow or absent collector drops spans (counted in
//!   `tessel_trace_spans_dropped_total`), never slows the job. Without it
//!   nothing is installed, and recording a span costs a check of a
//!   `OnceLock`.
//! * [`record`]: spans with times and ids of their own (the scheduler's
//!   view of a job: queued, each attempt, each restart, the job), written
//!   straight to the export queue.
//! * Worker-side spans are `tracing` spans with target [`TARGET`]; only
//!   those are exported (`tracing-opentelemetry`), the rest of the logging
//!   is not.

mod context;
mod error;
pub mod export;
#[cfg(feature = "receiver")]
pub mod receiver;
mod record;

pub use context::{join_attempt, JobTrace};
pub use error::TraceError;
pub use opentelemetry::KeyValue;
pub use record::{record, JobSpan, Parent};

/// The `tracing` target of the spans that are exported.
pub const TARGET: &str = "tessel::trace";
