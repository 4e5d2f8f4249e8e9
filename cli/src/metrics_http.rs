//! `--metrics-listen`: the process's metrics (the `metrics` crate's
//! recorder) in Prometheus's text format at `GET /metrics`, and its health
//! for probes: `GET /healthz` (200 while it serves) and `GET /readyz` (200
//! once ready: a replica that knows a leader, a worker that holds its
//! lease; else 503 saying why).
//!
//! Invariants:
//! 1. A request is read up to its blank line, at most [`MAX_REQUEST`]
//!    bytes and [`READ_DEADLINE`]; a larger, slower or malformed one is
//!    answered 400 and closed, and the listener keeps serving others.
//! 2. Only `GET` of `/metrics`, `/healthz` and `/readyz` (any query
//!    string) is served; any other path is 404, any other method 405.
//!
//! # Metrics tessel records
//!
//! Library crates record through the `metrics` facade (a no-op unless a
//! recorder is installed); `tessel coordinator --metrics-listen` and
//! `tessel worker --metrics-listen` install
//! `metrics-exporter-prometheus`'s recorder and serve it at `GET /metrics`
//! from a small HTTP/1.1 responder in `cli/src/metrics_http.rs` (8 KiB request
//! heads, 5 s to send one; anything else 400/404/405). Names:
//! `tessel_kv_log_*` (the log's writer thread), `tessel_kv_state_flush*`
//! (the state machine's flushes), `tessel_kv_state_filter_build_seconds`
//! (building the key filter from the tables), `tessel_kv_proposal_requests` (the
//! leader's group commit); `tessel_transfer_*` (bytes and failures by path,
//! in `TransferEndpoint`), `tessel_collective_*` (per call, by kind and
//! algorithm, in `Communicator::run_with`); `tessel_worker_*` (job processes
//! and topology exchanges, in the worker's `run_job`; heartbeats, in
//! `coordinator::registry`'s heartbeat loop); `tessel_scheduler_*` (in
//! `scheduler::pass`, outside the pure `advance`: gauges from the committed
//! state by every coordinator's pass, each transition counted once by the
//! pass that committed it).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MAX_REQUEST: usize = 8 << 10;
const READ_DEADLINE: Duration = Duration::from_secs(5);
/// Histogram buckets of every `*_seconds` metric: 50 µs to 5 s.
const SECONDS: [f64; 12] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 5.0,
];

/// Whether the process is ready, or why not; set by its owner.
#[derive(Clone)]
pub(crate) struct Readiness(std::sync::Arc<std::sync::Mutex<Result<(), String>>>);

impl Readiness {
    pub(crate) fn new() -> Readiness {
        Readiness(std::sync::Arc::new(std::sync::Mutex::new(Err(
            "starting".into()
        ))))
    }

    pub(crate) fn set(&self, state: Result<(), String>) {
        *self.0.lock().expect("not poisoned") = state;
    }

    fn get(&self) -> Result<(), String> {
        self.0.lock().expect("not poisoned").clone()
    }
}

/// Serves this process's metrics and health at `http://LISTEN/` when
/// asked; returns the bound address (for the readiness line).
pub(crate) async fn serve_if(
    listen: Option<SocketAddr>,
    ready: &Readiness,
) -> Result<Option<SocketAddr>> {
    match listen {
        Some(listen) => Ok(Some(serve(listen, ready.clone()).await?)),
        None => Ok(None),
    }
}

/// Installs the recorder and serves it on `listen` (port 0 picks one);
/// returns the bound address.
async fn serve(listen: SocketAddr, ready: Readiness) -> Result<SocketAddr> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS)
        .context("metrics buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen for metrics on {listen}"))?;
    let addr = listener.local_addr()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(answer(stream, handle.clone(), ready.clone()));
                }
                Err(e) => {
                    tracing::warn!("metrics listener: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(addr)
}

async fn answer(mut stream: tokio::net::TcpStream, handle: PrometheusHandle, ready: Readiness) {
    let head = tokio::time::timeout(READ_DEADLINE, read_head(&mut stream)).await;
    let (status, body) = match head.ok().flatten().map(|h| route(&h)) {
        Some(Route::Metrics) => (200, handle.render()),
        Some(Route::Health) => (200, "ok\n".to_owned()),
        Some(Route::Ready) => match ready.get() {
            Ok(()) => (200, "ready\n".to_owned()),
            Err(why) => (503, format!("not ready: {why}\n")),
        },
        Some(Route::NotFound) => (
            404,
            "not found: /metrics, /healthz and /readyz are served\n".to_owned(),
        ),
        Some(Route::BadMethod) => (405, "only GET is served\n".to_owned()),
        Some(Route::Bad) | None => (400, "bad request\n".to_owned()),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "Bad Request",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
    // A lingering close: closing with unread bytes (an oversized request)
    // would send a reset that can destroy the answer before it is read.
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

/// The request up to its blank line; `None` past [`MAX_REQUEST`] bytes or
/// at the end of the stream (invariant 1).
async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    Some(head)
}

/// What a request asks for (invariant 2).
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics,
    Health,
    Ready,
    NotFound,
    BadMethod,
    Bad,
}

/// Where a request head goes; `Bad` if its request line does not parse.
fn route(head: &[u8]) -> Route {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::Bad;
    };
    if !version.starts_with(b"HTTP/1.") || parts.next().is_some() {
        return Route::Bad;
    }
    if method != b"GET" {
        return Route::BadMethod;
    }
    match target.split(|&b| b == b'?').next().unwrap_or_default() {
        b"/metrics" => Route::Metrics,
        b"/healthz" => Route::Health,
        b"/readyz" => Route::Ready,
        _ => Route::NotFound,
    }
}

/// `tessel health ADDR [--ready]`: exit 0 when the process at ADDR (its
/// `--metrics-listen`) is healthy (ready), else 1 with its answer; for exec
/// probes.
pub(crate) async fn probe(addr: &str, ready: bool) -> Result<()> {
    use anyhow::bail;
    let path = if ready { "/readyz" } else { "/healthz" };
    let ask = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut answer = Vec::new();
        (&mut s).take(64 << 10).read_to_end(&mut answer).await?;
        anyhow::Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    let answer = tokio::time::timeout(READ_DEADLINE, ask)
        .await
        .with_context(|| format!("{addr} did not answer within {READ_DEADLINE:?}"))?
        .with_context(|| format!("asking {addr}{path}"))?;
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b).trim();
    if answer.starts_with("HTTP/1.1 200") {
        println!("{body}");
        Ok(())
    } else {
        bail!("{addr}{path}: {body}")
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn only_get_of_metrics_and_health_is_served() {
        use super::Route::*;
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Metrics);
        assert_eq!(route(b"GET /metrics?name=x HTTP/1.0\r\n\r\n"), Metrics);
        assert_eq!(route(b"GET /healthz HTTP/1.1\r\n\r\n"), Health);
        assert_eq!(route(b"GET /readyz HTTP/1.1\r\n\r\n"), Ready);
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), NotFound);
        assert_eq!(route(b"GET /metricsx HTTP/1.1\r\n\r\n"), NotFound);
        assert_eq!(route(b"POST /metrics HTTP/1.1\r\n\r\n"), BadMethod);
        assert_eq!(route(b"GET /metrics\r\n\r\n"), Bad);
        assert_eq!(route(b"GET /metrics SPDY/3\r\n\r\n"), Bad);
        assert_eq!(route(b"GET /metrics HTTP/1.1 extra\r\n\r\n"), Bad);
        assert_eq!(route(b"\r\n\r\n"), Bad);
        assert_eq!(route(&[0xff; 40]), Bad);
    }
}
