//! Logs and traces of a `tessel` process.
//!
//! `--log-format text|json`: log lines on stderr. JSON is one object a line
//! (`timestamp`, `level`, `target`, the event's fields flattened beside
//! `message`, and the enclosing spans' fields, such as a job process's
//! `job`, `attempt`, `process` and `worker`, in `spans`), as log pipelines
//! (Loki, Fluent Bit, Vector) take it. The choice is put in the
//! environment, so processes tessel starts log alike.
//!
//! Traces: with an OTLP endpoint in the standard OpenTelemetry variables,
//! spans of target [`tessel_trace::TARGET`] are exported
//! ([`tessel_trace::export`]). `RUST_LOG` filters the log lines only, so
//! `RUST_LOG=warn` does not switch the spans off.

use tessel_trace::export::Telemetry;
use tracing::Subscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The variable that carries the format to child processes.
pub(crate) const ENV: &str = "TESSEL_LOG_FORMAT";

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// For people.
    #[default]
    Text,
    /// One JSON object a line.
    Json,
}

/// Starts logging to stderr at `RUST_LOG`'s levels (default: warnings),
/// and trace export when configured; keep the returned guard until exit
/// (dropping it flushes the last spans). `service` names this process in
/// traces. Call while no other thread runs (it sets [`ENV`]).
pub(crate) fn init(format: LogFormat, service: &str) -> Option<Telemetry> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    if format == LogFormat::Json {
        std::env::set_var(ENV, "json");
    }
    let telemetry = Telemetry::from_env(service).unwrap_or_else(|e| {
        eprintln!("warning: {e}; traces are not exported");
        None
    });
    let registry = tracing_subscriber::registry();
    match (format, &telemetry) {
        // No export: RUST_LOG filters everything, so a disabled span or
        // event costs what it did before traces existed.
        (LogFormat::Text, None) => registry.with(filter).with(text()).init(),
        (LogFormat::Json, None) => registry.with(filter).with(json()).init(),
        // RUST_LOG filters the lines only: the spans have their own filter.
        (LogFormat::Text, Some(t)) => registry
            .with(text().with_filter(filter))
            .with(t.layer())
            .init(),
        (LogFormat::Json, Some(t)) => registry
            .with(json().with_filter(filter))
            .with(t.layer())
            .init(),
    }
    telemetry
}

fn text<S: Subscriber + for<'a> LookupSpan<'a>>() -> impl Layer<S> {
    tracing_subscriber::fmt::layer().with_writer(std::io::stderr)
}

fn json<S: Subscriber + for<'a> LookupSpan<'a>>() -> impl Layer<S> {
    tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(true)
        .with_writer(std::io::stderr)
}
