//! `--metrics-listen`: the process's metrics (the `metrics` crate's
//! recorder) in Prometheus's text format at `GET /metrics`.
//!
//! Invariants:
//! 1. A request is read up to its blank line, at most [`MAX_REQUEST`]
//!    bytes and [`READ_DEADLINE`]; a larger, slower or malformed one is
//!    answered 400 and closed, and the listener keeps serving others.
//! 2. Only `GET /metrics` (any query string) is served; any other path is
//!    404, any other method 405.

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

/// Serves this process's metrics at `http://LISTEN/metrics` when asked;
/// returns the bound address (for the readiness line).
pub(crate) async fn serve_if(listen: Option<SocketAddr>) -> Result<Option<SocketAddr>> {
    match listen {
        Some(listen) => Ok(Some(serve(listen).await?)),
        None => Ok(None),
    }
}

/// Installs the recorder and serves it on `listen` (port 0 picks one);
/// returns the bound address.
async fn serve(listen: SocketAddr) -> Result<SocketAddr> {
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
                    tokio::spawn(answer(stream, handle.clone()));
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

async fn answer(mut stream: tokio::net::TcpStream, handle: PrometheusHandle) {
    let head = tokio::time::timeout(READ_DEADLINE, read_head(&mut stream)).await;
    let (status, body) = match head {
        Ok(Some(head)) => match route(&head) {
            200 => (200, handle.render()),
            404 => (404, "not found: only /metrics is served\n".to_owned()),
            405 => (405, "only GET is served\n".to_owned()),
            _ => (400, "bad request\n".to_owned()),
        },
        _ => (400, "bad request\n".to_owned()),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
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

/// The status a request head gets (invariant 2); 400 if its request line
/// does not parse.
fn route(head: &[u8]) -> u16 {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return 400;
    };
    if !version.starts_with(b"HTTP/1.") || parts.next().is_some() {
        return 400;
    }
    if method != b"GET" {
        return 405;
    }
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    if path == b"/metrics" {
        200
    } else {
        404
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn only_get_metrics_is_served() {
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), 200);
        assert_eq!(route(b"GET /metrics?name=x HTTP/1.0\r\n\r\n"), 200);
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), 404);
        assert_eq!(route(b"GET /metricsx HTTP/1.1\r\n\r\n"), 404);
        assert_eq!(route(b"POST /metrics HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(route(b"GET /metrics\r\n\r\n"), 400);
        assert_eq!(route(b"GET /metrics SPDY/3\r\n\r\n"), 400);
        assert_eq!(route(b"GET /metrics HTTP/1.1 extra\r\n\r\n"), 400);
        assert_eq!(route(b"\r\n\r\n"), 400);
        assert_eq!(route(&[0xff; 40]), 400);
    }
}
