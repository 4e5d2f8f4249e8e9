//! Export end to end, against the OTLP receiver: a worker-style `tracing`
//! span under an attempt's span, and the scheduler's recorded spans, reach
//! it in one trace with the agreed ids; other spans do not. One test per
//! process: export is installed once.

use std::time::Duration;

use opentelemetry::KeyValue;
use tessel_trace::export::Telemetry;
use tessel_trace::receiver::Receiver;
use tessel_trace::{record, JobSpan, JobTrace, Parent, TARGET};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_of_every_kind_join_the_jobs_trace() {
    let receiver = Receiver::start().await.unwrap();
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint());
    std::env::set_var("OTEL_SERVICE_NAME", "export-test");
    let telemetry = tokio::task::spawn_blocking(|| Telemetry::from_env("unused").unwrap().unwrap())
        .await
        .unwrap();
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let trace = JobTrace::new();
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!(target: TARGET, "job_process", process = 3);
        span.set_parent(trace.attempt_context(2)).unwrap();
        let _in = span.enter();
        let _compile = tracing::info_span!(target: TARGET, "compile").entered();
        let _not = tracing::info_span!("not_exported").entered();
    });
    record(
        &trace,
        JobSpan {
            name: "attempt",
            id: Parent::Attempt(2),
            parent: Parent::Root,
            start_unix_ms: 1_000,
            end_unix_ms: 2_000,
            attributes: vec![KeyValue::new("tessel.attempt", 2)],
            error: Some("worker `w1` lost".into()),
        },
    );
    tokio::task::spawn_blocking(move || drop(telemetry))
        .await
        .unwrap();
    let mut spans = receiver.spans();
    for _ in 0..50 {
        if spans.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        spans = receiver.spans();
    }
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(spans.len(), 3, "{names:?}");
    let by = |n: &str| spans.iter().find(|s| s.name == n).unwrap();
    let attempt = format!("{}", trace.attempt_span(2));
    assert!(spans
        .iter()
        .all(|s| s.trace_id == trace.trace_id.to_string()));
    assert!(spans.iter().all(|s| s.service == "export-test"));
    assert_eq!(by("job_process").parent_span_id, attempt);
    assert_eq!(by("job_process").attributes["process"], "3");
    assert_eq!(by("compile").parent_span_id, by("job_process").span_id);
    assert_eq!(by("attempt").span_id, attempt);
    assert_eq!(by("attempt").parent_span_id, trace.root.to_string());
    assert_eq!(by("attempt").error.as_deref(), Some("worker `w1` lost"));
    assert_eq!(by("attempt").start_unix_ns, 1_000_000_000);
    assert_eq!(tessel_trace::export::dropped_spans(), 0);
}
