//! OTLP export through a bounded queue, configured by the standard
//! OpenTelemetry variables.
//!
//! Invariants:
//! 1. Ending or recording a span never blocks: a full queue drops the span
//!    and counts it (`tessel_trace_spans_dropped_total`).
//! 2. One thread exports, in batches of up to [`BATCH`] spans, at least
//!    every [`INTERVAL`]; a failed export drops its batch (counted), so an
//!    unreachable collector costs the job nothing but that thread's time.
//! 3. Nothing is installed unless an OTLP endpoint is configured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use tracing_subscriber::filter::{Filtered, Targets};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::{TraceError, TARGET};

/// Spans waiting for export, at most.
pub const QUEUE: usize = 4096;
/// Spans per export request, at most.
pub const BATCH: usize = 512;
/// The longest a span waits for its batch.
pub const INTERVAL: Duration = Duration::from_secs(1);

enum Msg {
    Span(Box<SpanData>),
    Flush(SyncSender<()>),
}

/// The export queue, once installed (invariant 3).
static QUEUE_TX: OnceLock<SyncSender<Msg>> = OnceLock::new();

/// Spans dropped so far (a full queue, a failed export); also the
/// `tessel_trace_spans_dropped_total` metric.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Spans this process dropped instead of exporting them.
pub fn dropped_spans() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

fn dropped(n: u64) {
    DROPPED.fetch_add(n, Ordering::Relaxed);
    metrics::counter!("tessel_trace_spans_dropped_total").increment(n);
}

/// Whether spans are exported from this process.
pub fn enabled() -> bool {
    QUEUE_TX.get().is_some()
}

/// Queues `span` for export (invariant 1); nothing without an exporter.
pub(crate) fn submit(span: SpanData) {
    let Some(tx) = QUEUE_TX.get() else { return };
    match tx.try_send(Msg::Span(Box::new(span))) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => dropped(1),
    }
}

/// Waits up to `timeout` for every span queued so far to be exported.
fn flush(timeout: Duration) {
    let Some(tx) = QUEUE_TX.get() else { return };
    let deadline = Instant::now() + timeout;
    let (done_tx, done_rx) = sync_channel(1);
    let mut msg = Msg::Flush(done_tx);
    loop {
        match tx.try_send(msg) {
            Ok(()) => break,
            Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                msg = m;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return,
        }
    }
    let _ = done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
}

/// Whether the environment asks for trace export: an OTLP endpoint set,
/// the SDK not disabled, the traces exporter not `none`. Only
/// `http/protobuf` is spoken; another protocol is an error.
pub fn configured() -> Result<bool, TraceError> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none")
    {
        return Ok(false);
    }
    if var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        && var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
    {
        return Ok(false);
    }
    for k in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = var(k) {
            if p != "http/protobuf" {
                return Err(TraceError::Exporter(format!(
                    "{k}={p}: tessel exports over http/protobuf only (an OpenTelemetry Collector, Jaeger and Tempo take it on port 4318)"
                )));
            }
            break;
        }
    }
    Ok(true)
}

/// Trace export for this process; flushes (within 5 s) when dropped.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Installs export when [`configured`]; `service` names this process
    /// (`service.name`) unless `OTEL_SERVICE_NAME` does.
    pub fn from_env(service: &str) -> Result<Option<Telemetry>, TraceError> {
        if !configured()? {
            return Ok(None);
        }
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(service.to_owned());
        }
        let resource = resource
            .with_attributes([KeyValue::new("process.pid", i64::from(std::process::id()))])
            .build();
        exporter.set_resource(&resource);
        let (tx, rx) = sync_channel(QUEUE);
        if QUEUE_TX.set(tx).is_err() {
            return Err(TraceError::Exporter("export is already installed".into()));
        }
        std::thread::Builder::new()
            .name("tessel-trace-export".into())
            .spawn(move || export_loop(exporter, rx))
            .map_err(|e| TraceError::Exporter(e.to_string()))?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Bounded)
            .with_resource(resource)
            .build();
        Ok(Some(Telemetry { provider }))
    }

    /// The `tracing` layer that turns spans of target [`TARGET`] into
    /// OpenTelemetry spans (other spans and events stay logs only).
    #[allow(clippy::type_complexity)]
    pub fn layer<S>(
        &self,
    ) -> Filtered<
        tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
        Targets,
        S,
    >
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        // A target filter decides per callsite, once: other callsites
        // never reach this layer.
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("tessel"))
            .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE))
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        flush(Duration::from_secs(5));
        let _ = self.provider.shutdown_with_timeout(Duration::from_secs(1));
    }
}

/// The provider's one processor: ended spans into the queue.
#[derive(Debug)]
struct Bounded;

impl SpanProcessor for Bounded {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        submit(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        flush(Duration::from_secs(5));
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Invariant 2.
fn export_loop(exporter: opentelemetry_otlp::SpanExporter, rx: Receiver<Msg>) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH);
    let mut next = Instant::now() + INTERVAL;
    let send = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        match futures::executor::block_on(exporter.export(std::mem::take(batch))) {
            Ok(()) => metrics::counter!("tessel_trace_spans_exported_total").increment(n),
            Err(e) => {
                metrics::counter!("tessel_trace_export_failures_total").increment(1);
                dropped(n);
                tracing::debug!(error = %e, spans = n, "trace export failed; spans dropped");
            }
        }
    };
    loop {
        match rx.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Ok(Msg::Span(s)) => {
                batch.push(*s);
                if batch.len() >= BATCH {
                    send(&mut batch);
                }
            }
            Ok(Msg::Flush(done)) => {
                send(&mut batch);
                let _ = done.send(());
            }
            Err(RecvTimeoutError::Timeout) => {
                send(&mut batch);
                next = Instant::now() + INTERVAL;
            }
            Err(RecvTimeoutError::Disconnected) => {
                send(&mut batch);
                return;
            }
        }
    }
}
