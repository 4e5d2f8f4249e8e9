//! An unreachable collector never holds a job up: with the endpoint at a
//! port where nothing listens, ending spans stays a queue hand-off, and the
//! spans that cannot go are dropped and counted. (Its own process: export
//! is installed once per process.)

use std::time::{Duration, Instant};

use tessel_trace::export::{dropped_spans, Telemetry, QUEUE};
use tracing_subscriber::layer::SubscriberExt;

#[test]
fn spans_for_an_unreachable_collector_are_dropped_and_counted_without_waiting() {
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{closed}"));
    let telemetry = Telemetry::from_env("unreachable-test").unwrap().unwrap();
    let subscriber = tracing_subscriber::registry().with(telemetry.layer());
    let n = 4 * QUEUE;
    let started = Instant::now();
    tracing::subscriber::with_default(subscriber, || {
        for step in 0..n {
            let _s = tracing::info_span!(target: tessel_trace::TARGET, "steps", step).entered();
        }
    });
    let spent = started.elapsed();
    // A span costs microseconds, never an export's round trip.
    assert!(spent < Duration::from_secs(2), "{n} spans took {spent:?}");
    drop(telemetry);
    let by = Instant::now() + Duration::from_secs(20);
    while dropped_spans() < (n - QUEUE) as u64 {
        assert!(
            Instant::now() < by,
            "only {} of {n} counted dropped",
            dropped_spans()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
