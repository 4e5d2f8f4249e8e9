//! The transport's invariants, on real QUIC connections.

use super::*;
use std::sync::Mutex;

use crate::wire::{ClientRequest, WireResponse};

/// Answers every request with one frame, as the replicas do.
struct Answer;

impl Handler for Answer {
    fn handle(
        self: Arc<Self>,
        _req: WireRequest,
        mut send: SendStream,
        _recv: RecvStream,
        _peer: PeerInfo,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(async move {
            let _ = write_frame(&mut send, &WireResponse::Revision(Ok(7))).await;
            let _ = send.finish();
        })
    }
}

/// Answers after a while, or never.
enum Slow {
    Never,
    After(Duration),
    /// Holding its runtime's only thread meanwhile, as a backlog of
    /// request tasks does.
    Holding(Duration),
}

impl Handler for Slow {
    fn handle(
        self: Arc<Self>,
        req: WireRequest,
        send: SendStream,
        recv: RecvStream,
        peer: PeerInfo,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(async move {
            match *self {
                Slow::Never => std::future::pending().await,
                Slow::After(delay) => tokio::time::sleep(delay).await,
                Slow::Holding(delay) => std::thread::sleep(delay),
            }
            Arc::new(Answer).handle(req, send, recv, peer).await
        })
    }
}

/// A server on a runtime of its own, which the test can stop dead: no
/// close reaches the client, as when a process is killed.
fn server_on_own_runtime(
    handler: impl Handler,
) -> (tokio::runtime::Runtime, SocketAddr, quinn::ClientConfig) {
    let (server_cfg, client_cfg) = tessel_tls::insecure_configs(wire::ALPN).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // Its QUIC stack too: the process's QUIC thread would outlive it.
    let io = Arc::new(IoThread::on(rt.handle().clone()));
    let server = endpoint_on(
        "127.0.0.1:0".parse().unwrap(),
        Some(server_cfg),
        Some(io.clone()),
    )
    .unwrap();
    let addr = server.local_addr().unwrap();
    rt.spawn(async move { serve_on(server, Arc::new(handler), &io).await });
    (rt, addr, client_cfg)
}

fn client_with(cfg: quinn::ClientConfig) -> PeerClient {
    let mut endpoint = endpoint("127.0.0.1:0".parse().unwrap(), None).unwrap();
    endpoint.set_default_client_config(cfg);
    PeerClient::new(endpoint)
}

/// Answers as [`Answer`] does, noting each connection a request came on
/// (one identity is made per connection).
#[derive(Default)]
struct Connections(Mutex<std::collections::HashSet<usize>>);

impl Handler for Connections {
    fn handle(
        self: Arc<Self>,
        req: WireRequest,
        send: SendStream,
        recv: RecvStream,
        peer: PeerInfo,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        self.0
            .lock()
            .unwrap()
            .insert(Arc::as_ptr(&peer.identity) as usize);
        Arc::new(Answer).handle(req, send, recv, peer)
    }
}

/// The answers of `n` calls to `addr` made at once.
async fn at_once(
    client: &PeerClient,
    addr: SocketAddr,
    n: usize,
) -> Vec<Result<WireResponse, NetError>> {
    let calls: Vec<_> = (0..n)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let req = WireRequest::Client(ClientRequest::Revision);
                client.call(addr, &req, Duration::from_secs(60)).await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(n);
    for c in calls {
        answers.push(c.await.unwrap());
    }
    answers
}

/// Invariant 2: calls that find no connection wait for one dial rather
/// than each making its own (a herd of handshakes at the peer).
#[tokio::test]
async fn calls_that_find_no_connection_share_one_dial() {
    let (server_cfg, client_cfg) = tessel_tls::insecure_configs(wire::ALPN).unwrap();
    let server = endpoint("127.0.0.1:0".parse().unwrap(), Some(server_cfg)).unwrap();
    let addr = server.local_addr().unwrap();
    let seen = Arc::new(Connections::default());
    tokio::spawn(serve(server, seen.clone()));
    let client = client_with(client_cfg);
    for answer in at_once(&client, addr, 64).await {
        assert!(matches!(answer, Ok(WireResponse::Revision(Ok(7)))));
    }
    assert_eq!(
        seen.0.lock().unwrap().len(),
        1,
        "connections the calls came on"
    );
}

/// Invariant 4, the dial: a peer that never answers the handshake is
/// given up after `tessel_tls::HANDSHAKE_TIMEOUT`, well before the
/// connection's idle timeout. Invariant 2: every call waiting for that dial
/// fails with it, and the next call dials again.
#[tokio::test]
async fn a_dial_to_a_dead_peer_is_given_up_after_the_handshake_timeout() {
    // A socket nobody reads: a killed process's port, without the ICMP.
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    let (server_cfg, client_cfg) = tessel_tls::insecure_configs(wire::ALPN).unwrap();
    let client = client_with(client_cfg);
    let started = tokio::time::Instant::now();
    for answer in at_once(&client, addr, 8).await {
        assert!(
            matches!(answer, Err(NetError::Connect { .. })),
            "{answer:?}"
        );
    }
    let took = started.elapsed();
    assert!(
        took < tessel_tls::IDLE_TIMEOUT / 2,
        "gave up after {took:?}"
    );
    // The peer comes up at that address: the failed dial is not reused.
    drop(dead);
    let server = endpoint(addr, Some(server_cfg)).unwrap();
    tokio::spawn(serve(server, Arc::new(Answer)));
    let req = WireRequest::Client(ClientRequest::Revision);
    let answer = client.call(addr, &req, Duration::from_secs(10)).await;
    assert!(
        matches!(answer, Ok(WireResponse::Revision(Ok(7)))),
        "{answer:?}"
    );
}

/// Invariant 4, before the request is sent: a call that waits for stream
/// credit from a peer that died is given up after `SILENCE` too.
#[tokio::test]
async fn a_call_waiting_for_a_stream_to_a_dead_peer_gives_up() {
    let (rt, addr, cfg) = server_on_own_runtime(Slow::Never);
    let client = client_with(cfg);
    let req = WireRequest::Client(ClientRequest::Revision);
    // Every stream the peer allows, waiting on it (`tessel_tls`: 1,024 at
    // most, granted as they are used).
    let waiting: Vec<_> = (0..1024)
        .map(|_| {
            let client = client.clone();
            let req = WireRequest::Client(ClientRequest::Revision);
            tokio::spawn(async move { client.call(addr, &req, Duration::from_secs(60)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    rt.shutdown_background();
    let started = tokio::time::Instant::now();
    let answer = client.call(addr, &req, Duration::from_secs(8)).await;
    let took = started.elapsed();
    match answer {
        Err(NetError::Stream { reason, .. }) => {
            assert!(reason.contains("sent nothing"), "{reason}")
        }
        other => panic!("expected a silent peer, got {other:?}"),
    }
    assert!(took < SILENCE * 3, "gave up after {took:?}");
    for w in waiting {
        assert!(w.await.unwrap().is_err());
    }
}

/// Invariant 4: a peer that dies while a call waits on it is given up
/// after `SILENCE`, well before the connection's idle timeout.
#[tokio::test]
async fn a_call_gives_up_on_a_peer_that_fell_silent() {
    let (rt, addr, cfg) = server_on_own_runtime(Slow::Never);
    let client = client_with(cfg);
    let req = WireRequest::Client(ClientRequest::Revision);
    let started = tokio::time::Instant::now();
    let call = client.call(addr, &req, Duration::from_secs(10));
    let kill = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        rt.shutdown_background();
    };
    let (answer, ()) = tokio::join!(call, kill);
    let took = started.elapsed();
    match answer {
        Err(NetError::Stream { reason, .. }) => {
            assert!(reason.contains("sent nothing"), "{reason}")
        }
        other => panic!("expected a silent peer, got {other:?}"),
    }
    assert!(
        took < SILENCE * 3,
        "gave up after {took:?}, not about `SILENCE` after the peer died"
    );
}

/// Invariant 4, the other side: a live peer that takes longer than
/// `SILENCE` (and than the idle timeout) to answer is waited for.
#[tokio::test]
async fn a_call_waits_for_a_slow_live_peer() {
    let slow = tessel_tls::IDLE_TIMEOUT + Duration::from_millis(500);
    let (rt, addr, cfg) = server_on_own_runtime(Slow::After(slow));
    let client = client_with(cfg);
    let req = WireRequest::Client(ClientRequest::Revision);
    let answer = client.call(addr, &req, slow * 2).await;
    assert!(
        matches!(answer, Ok(WireResponse::Revision(Ok(7)))),
        "{answer:?}"
    );
    rt.shutdown_background();
}

/// Invariant 6: a server whose request runtime is stuck for three times
/// `SILENCE` still acknowledges on its QUIC thread, so the call waits for
/// its answer instead of finding it silent (with the drivers on that
/// runtime, the call gave up after `SILENCE`).
#[tokio::test]
async fn a_server_busy_with_requests_is_slow_but_never_silent() {
    let (server_cfg, client_cfg) = tessel_tls::insecure_configs(wire::ALPN).unwrap();
    let requests = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = endpoint("127.0.0.1:0".parse().unwrap(), Some(server_cfg)).unwrap();
    let addr = server.local_addr().unwrap();
    let busy = SILENCE * 3;
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let serving = std::thread::spawn(move || {
        requests.block_on(async move {
            tokio::spawn(serve(server, Arc::new(Slow::Holding(busy))));
            let _ = finished.await;
        })
    });
    let client = client_with(client_cfg);
    let req = WireRequest::Client(ClientRequest::Revision);
    let started = tokio::time::Instant::now();
    let answer = client.call(addr, &req, busy * 2).await;
    assert!(
        matches!(answer, Ok(WireResponse::Revision(Ok(7)))),
        "{answer:?} after {:?}",
        started.elapsed()
    );
    assert!(started.elapsed() >= busy);
    let _ = done.send(());
    serving.join().unwrap();
}

/// `tessel_tls`'s keep-alives: on an idle connection the dialer alone
/// pings (a replica with thousands of workers' connections would ping
/// each of them), and its pings keep the connection open past the idle
/// timeout on both sides.
#[tokio::test]
async fn an_idle_connection_lives_on_the_dialers_keep_alives_alone() {
    let (rt, addr, cfg) = server_on_own_runtime(Answer);
    let client = client_with(cfg);
    let req = WireRequest::Client(ClientRequest::Revision);
    assert!(client
        .call(addr, &req, Duration::from_secs(5))
        .await
        .is_ok());
    let conn = client.connection(addr).await.unwrap();
    // Past the call's own loss-recovery probes (PINGs too).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = conn.stats();
    tokio::time::sleep(tessel_tls::IDLE_TIMEOUT + Duration::from_secs(1)).await;
    let after = conn.stats();
    assert!(conn.close_reason().is_none(), "{:?}", conn.close_reason());
    let sent = after.frame_tx.ping - before.frame_tx.ping;
    let received = after.frame_rx.ping - before.frame_rx.ping;
    // Every 1.2 s: three in four seconds, two at least.
    assert!(
        sent >= 2,
        "the dialer sent {sent} pings in more than an idle timeout"
    );
    assert_eq!(received, 0, "the acceptor pinged");
    assert!(client
        .call(addr, &req, Duration::from_secs(5))
        .await
        .is_ok());
    rt.shutdown_background();
}

/// A pooled connection opened inside a span does not hold that span
/// open: quinn instruments its connection driver with the current
/// span, and a job process's span would otherwise live as long as the
/// worker's connection (and never reach its trace).
#[tokio::test]
async fn a_connection_opened_inside_a_span_lets_the_span_end() {
    use tracing::Instrument;
    use tracing_subscriber::layer::{Context, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;
    struct Closed(Arc<Mutex<Vec<String>>>);
    impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Closed {
        fn on_close(&self, id: tracing::span::Id, ctx: Context<'_, S>) {
            let name = ctx.span(&id).map(|s| s.name().to_owned());
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(name);
        }
    }
    let closed = Arc::new(Mutex::new(Vec::new()));
    let subscriber = tracing_subscriber::registry().with(Closed(closed.clone()));
    // This thread's subscriber: the test's runtime has only this thread.
    let _default = tracing::subscriber::set_default(subscriber);
    let (rt, addr, cfg) = server_on_own_runtime(Answer);
    let client = client_with(cfg);
    let req = WireRequest::Client(ClientRequest::Revision);
    let answer = client
        .call(addr, &req, Duration::from_secs(10))
        .instrument(tracing::info_span!("job_process"))
        .await;
    assert!(
        matches!(answer, Ok(WireResponse::Revision(Ok(7)))),
        "{answer:?}"
    );
    tokio::task::yield_now().await;
    let closed = closed.lock().unwrap().clone();
    assert!(
        closed.iter().any(|n| n == "job_process"),
        "still open: {closed:?}"
    );
    rt.shutdown_background();
}

/// Invariant 3: requests answered in one frame leave no STOP_SENDING
/// behind, in either direction.
#[tokio::test]
async fn a_call_reads_both_streams_to_their_end() {
    let (rt, addr, cfg) = server_on_own_runtime(Answer);
    let client = client_with(cfg);
    let req = WireRequest::Client(ClientRequest::Revision);
    for _ in 0..50 {
        match client.call(addr, &req, Duration::from_secs(5)).await {
            Ok(WireResponse::Revision(Ok(7))) => {}
            other => panic!("unexpected answer: {other:?}"),
        }
    }
    let conn = client.connection(addr).await.unwrap();
    // Let the peer's frames for the last call arrive.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stats = conn.stats();
    assert_eq!(stats.frame_tx.stop_sending, 0, "sent: {:?}", stats.frame_tx);
    assert_eq!(
        stats.frame_rx.stop_sending, 0,
        "received: {:?}",
        stats.frame_rx
    );
    rt.shutdown_background();
}
