//! An OTLP/HTTP trace receiver (`POST /v1/traces`, protobuf) on the
//! official OpenTelemetry protobuf definitions (`opentelemetry-proto`),
//! for tests and benchmarks: it keeps every span it is sent.
//!
//! It models what a collector does with a request (decode, answer 200 with
//! an empty `ExportTraceServiceResponse`, or 400 on a body that does not
//! decode); it does not model gzip, gRPC, retries asked by 429/503, or
//! partial success.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Request bodies larger than this are refused.
const MAX_BODY: usize = 64 << 20;

/// A span as received.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// The sender's `service.name`.
    pub service: String,
    /// The sender's other resource attributes.
    pub resource: BTreeMap<String, String>,
    /// Hex.
    pub trace_id: String,
    /// Hex.
    pub span_id: String,
    /// Hex; empty for a root span.
    pub parent_span_id: String,
    /// Its name.
    pub name: String,
    /// Start, Unix ns.
    pub start_unix_ns: u64,
    /// End, Unix ns.
    pub end_unix_ns: u64,
    /// Its attributes, as text.
    pub attributes: BTreeMap<String, String>,
    /// The status message when its status is an error.
    pub error: Option<String>,
}

/// A receiver listening on loopback; stops with its runtime.
#[derive(Clone)]
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

impl Receiver {
    /// Listens on `127.0.0.1:0` and serves on the current runtime.
    pub async fn start() -> std::io::Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let r = Receiver {
            addr: listener.local_addr()?,
            spans: Arc::default(),
        };
        let spans = r.spans.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, spans.clone()));
            }
        });
        Ok(r)
    }

    /// The value for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().expect("not poisoned").clone()
    }
}

/// HTTP/1.1 with keep-alive: one request after another on a connection.
async fn serve(stream: TcpStream, spans: Arc<Mutex<Vec<ReceivedSpan>>>) {
    let mut stream = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let post_traces = line.starts_with("POST /v1/traces ");
        let mut length = 0usize;
        loop {
            let mut header = String::new();
            if stream.read_line(&mut header).await.unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(usize::MAX);
                }
            }
        }
        if length > MAX_BODY {
            let _ = respond(&mut stream, "413 Payload Too Large").await;
            return;
        }
        let mut body = vec![0; length];
        if stream.read_exact(&mut body).await.is_err() {
            return;
        }
        let status = match ExportTraceServiceRequest::decode(body.as_slice()) {
            Ok(req) if post_traces => {
                spans.lock().expect("not poisoned").extend(flatten(req));
                "200 OK"
            }
            Ok(_) => "404 Not Found",
            Err(_) => "400 Bad Request",
        };
        if respond(&mut stream, status).await.is_err() {
            return;
        }
    }
}

async fn respond(stream: &mut BufReader<TcpStream>, status: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n"
    );
    stream.get_mut().write_all(head.as_bytes()).await
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn flatten(req: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for rs in req.resource_spans {
        let mut resource = rs
            .resource
            .map(|r| attrs(&r.attributes))
            .unwrap_or_default();
        let service = resource.remove("service.name").unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                let error = s
                    .status
                    .as_ref()
                    .filter(|st| st.code == 2)
                    .map(|st| st.message.clone());
                out.push(ReceivedSpan {
                    service: service.clone(),
                    resource: resource.clone(),
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name,
                    start_unix_ns: s.start_time_unix_nano,
                    end_unix_ns: s.end_time_unix_nano,
                    attributes: attrs(&s.attributes),
                    error,
                });
            }
        }
    }
    out
}
