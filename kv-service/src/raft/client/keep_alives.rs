//! A client's keep-alive stream (etcd's `LeaseKeepAlive`): one long-lived
//! stream, to a follower that relays it to the leader in batches (node
//! `relay`), carries every keep-alive of the client, answered in order
//! (`wire` module docs). It only makes a keep-alive cheaper: whatever it
//! cannot answer is sent as a request.
//!
//! Invariants:
//! 1. A keep-alive the stream answers with a lease's TTL or a final error
//!    is done; `Unavailable`, a broken stream, or no answer within the
//!    retry budget sends it again as a request (client invariant 1).
//! 2. The stream goes to the client's follower (`followers`); a follower's
//!    stream that refuses a keep-alive or breaks makes the client avoid
//!    followers for a while. When the target changes, or the stream answers
//!    `Unavailable` or breaks, it is replaced on the next keep-alive.
//! 3. Every keep-alive waiting on the stream fails at once when its
//!    connection falls silent (`rpc` invariant 4) or the stream breaks.
//! 4. A replica that does not know the stream (an older build resets it as
//!    malformed before any answer) turns the stream off for this client:
//!    its keep-alives go as requests from then on, as before.
//! 5. A keep-alive, the one waiting or the next, finds the stream broken
//!    when it failed (it could not be opened, broke, or its replica fell
//!    silent), even if no caller waited to see it fail; when a keep-alive
//!    has waited on it for [`UNACKNOWLEDGED`] and its replica sent
//!    nothing meanwhile (a live
//!    one acknowledges a frame within 25 ms, however slow its answer; the
//!    requests' own replica, which leaving costs a search for the leader,
//!    gets [`rpc::SILENCE`], as a request does); and when its stream is
//!    not open [`rpc::SILENCE`] after its first keep-alive. Before, a dead
//!    follower was found only once the connection had been silent for
//!    `rpc::SILENCE` (four 300 ms beats lost), and one whose handshake
//!    went unanswered after `tessel_tls::HANDSHAKE_TIMEOUT` (2 s): more than
//!    the 1.5 s TTL the tests' workers use. The keep-alive waiting gives a
//!    follower a sixth of the shortest TTL answered so far, at least
//!    [`UNACKNOWLEDGED`] and at most [`rpc::SILENCE`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use quinn::{Connection, RecvStream, SendStream};
use tokio::sync::{mpsc, oneshot};

use super::RETRY_BUDGET;
use crate::rpc::{self, Link, NamedPeer, PeerClient};
use crate::wire::{
    self, ClientRequest, KeepAliveFrame, WireRequest, WireResponse, RESET_MALFORMED,
};
use tessel_kv::state::Output;
use tessel_kv::{KvError, Result};

type Ask = (u64, oneshot::Sender<Result<Output>>);

/// How long a keep-alive may wait on a stream whose replica sends nothing
/// at all before the stream counts as broken (invariant 5): ten times
/// QUIC's acknowledgement delay, and shorter than the shortest heartbeat
/// the tests use (300 ms).
const UNACKNOWLEDGED: Duration = Duration::from_millis(250);

/// The stream to one replica, driven by a task of its own.
struct Lane {
    /// The index of the replica among the client's.
    at: usize,
    asks: mpsc::UnboundedSender<Ask>,
    state: Arc<LaneState>,
}

/// What a lane's task tells the keep-alives that come next (invariant 5).
#[derive(Default)]
struct LaneState {
    /// The stream failed.
    failed: AtomicBool,
    /// The stream's connection, once open.
    conn: OnceLock<Link>,
    /// When the first keep-alive was handed to the task.
    first_ask: OnceLock<Instant>,
    /// While keep-alives wait for answers: since when (the oldest's send,
    /// or the last answer), and the datagrams the connection had received
    /// by then.
    waiting_since: Mutex<Option<(Instant, u64)>>,
}

impl LaneState {
    /// Invariant 5: nothing will come of this stream, or nothing has come
    /// of it for `patience` while a keep-alive waits on it.
    fn broken(&self, patience: Duration) -> bool {
        if self.failed.load(Ordering::Acquire) {
            return true;
        }
        let Some(conn) = self.conn.get() else {
            return self
                .first_ask
                .get()
                .is_some_and(|t| t.elapsed() >= rpc::SILENCE);
        };
        let since = *self.waiting_since.lock().unwrap_or_else(|p| p.into_inner());
        since.is_some_and(|(t, rx)| t.elapsed() >= patience && conn.stats().udp_rx.datagrams == rx)
    }

    fn waiting_since(&self, conn: &Connection, waiting: bool) {
        let since = waiting.then(|| (Instant::now(), conn.stats().udp_rx.datagrams));
        *self.waiting_since.lock().unwrap_or_else(|p| p.into_inner()) = since;
    }
}

/// A client's keep-alive stream, opened when first needed.
#[derive(Default)]
pub(super) struct KeepAlives {
    lane: Mutex<Option<Lane>>,
    answered: AtomicU64,
    /// The shortest lease TTL the stream has answered with, in ms (0:
    /// none yet): the keep-alive waiting gives its follower a sixth of it
    /// (invariant 5).
    ttl_ms: AtomicU64,
    /// Invariant 4.
    unknown: Arc<AtomicBool>,
}

impl KeepAlives {
    /// Keep-alives the stream answered (for tests and benchmarks).
    pub(super) fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// Renews `lease` on the stream to replica `at`, a follower or the
    /// requests' own replica; anything but [`Renewal::Answered`] means the
    /// keep-alive must go as a request (invariant 1).
    pub(super) async fn renew(
        &self,
        client: &PeerClient,
        replicas: &Arc<[NamedPeer]>,
        (at, follower): (usize, bool),
        lease: u64,
    ) -> Renewal {
        let patience = if follower {
            UNACKNOWLEDGED
        } else {
            rpc::SILENCE
        };
        if self.unknown.load(Ordering::Relaxed) {
            return Renewal::Unknown;
        }
        let (tx, rx) = oneshot::channel();
        let state = {
            let mut lane = self.lane.lock().unwrap_or_else(|p| p.into_inner());
            if lane
                .as_ref()
                .is_some_and(|l| l.at == at && l.state.broken(patience))
            {
                // Invariant 5: seen by no caller, so seen now.
                *lane = None;
                return Renewal::Broken;
            }
            let usable = lane
                .as_ref()
                .is_some_and(|l| l.at == at && !l.asks.is_closed());
            if !usable {
                let (asks, queued) = mpsc::unbounded_channel();
                let (client, replicas) = (client.clone(), replicas.clone());
                let unknown = self.unknown.clone();
                let state = Arc::<LaneState>::default();
                tokio::spawn(drive(client, replicas, at, queued, unknown, state.clone()));
                *lane = Some(Lane { at, asks, state });
            }
            let sent = lane.as_ref().map(|l| {
                l.state.first_ask.get_or_init(Instant::now);
                l.asks.send((lease, tx))
            });
            match (sent, lane.as_ref()) {
                (Some(Ok(())), Some(l)) => l.state.clone(),
                _ => {
                    *lane = None;
                    return Renewal::Broken;
                }
            }
        };
        // Invariant 5, for this keep-alive too (the heartbeat sends no other
        // while it waits, `registry` invariant 4), with a sixth of the
        // lease's TTL as patience, between `UNACKNOWLEDGED` and a request's:
        // a 1.5 s lease needs its keep-alive moved within a beat, while a
        // follower overloaded for a quarter second is common when thousands
        // of hosts with 5 s leases start at once, and each keep-alive it
        // costs becomes a request to the leader.
        let sixth = Duration::from_millis(self.ttl_ms.load(Ordering::Relaxed) / 6);
        let waiting = patience.max(sixth.min(rpc::SILENCE));
        let silent = async {
            loop {
                tokio::time::sleep(waiting / 5).await;
                if state.broken(waiting) {
                    return;
                }
            }
        };
        let answer = tokio::select! {
            answer = tokio::time::timeout(RETRY_BUDGET, rx) => Some(answer),
            () = silent => None,
        };
        let renewal = match answer {
            Some(Ok(Ok(Err(KvError::Unavailable(_))))) => Renewal::Refused,
            Some(Ok(Ok(done))) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                if let Ok(Output::Lease { ttl_ms, .. }) = done {
                    let shorter = |seen: u64| (seen == 0 || ttl_ms < seen).then_some(ttl_ms);
                    let _ = self
                        .ttl_ms
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, shorter);
                }
                return Renewal::Answered(done);
            }
            Some(Ok(Err(_)) | Err(_)) if self.unknown.load(Ordering::Relaxed) => Renewal::Unknown,
            None | Some(Ok(Err(_)) | Err(_)) => Renewal::Broken,
        };
        // Invariant 2: replaced on the next keep-alive.
        let mut lane = self.lane.lock().unwrap_or_else(|p| p.into_inner());
        if lane.as_ref().is_some_and(|l| l.at == at) {
            *lane = None;
        }
        renewal
    }
}

/// What the stream made of a keep-alive.
pub(super) enum Renewal {
    /// The lease's TTL, or a final error.
    Answered(Result<Output>),
    /// `Unavailable` from a live replica: not the leader, or one that may
    /// not renew from memory yet.
    Refused,
    /// The stream could not be opened, broke, or its replica fell silent.
    Broken,
    /// The replicas do not know the stream (invariant 4).
    Unknown,
}

/// Opens the stream to replica `at` (its address as the client's requests
/// resolve it) and carries `asks` on it until every sender is gone or the
/// stream fails; dropping a waiting ask's sender tells its caller to send a
/// request instead (invariant 3), and `state` tells the next keep-alives
/// how it goes (invariant 5).
async fn drive(
    client: PeerClient,
    replicas: Arc<[NamedPeer]>,
    at: usize,
    mut asks: mpsc::UnboundedReceiver<Ask>,
    unknown: Arc<AtomicBool>,
    state: Arc<LaneState>,
) {
    let open = WireRequest::Client(ClientRequest::KeepAliveStream);
    let opened = match replicas[at].addr(&client).await {
        Ok(addr) => client.open(addr, &open).await,
        Err(e) => Err(e),
    };
    let ended = match opened {
        Ok((conn, send, recv)) => {
            let _ = state.conn.set(conn.clone());
            carry(&conn, send, recv, &mut asks, &unknown, &state).await
        }
        Err(_) => Ended::Failed,
    };
    if ended == Ended::Failed {
        state.failed.store(true, Ordering::Release);
    }
}

/// Why a stream's task ended.
#[derive(PartialEq, Eq)]
enum Ended {
    /// Every sender of asks is gone: the client replaced the lane.
    Replaced,
    /// The replica does not know the stream (invariant 4).
    Unknown,
    /// The stream broke or its replica fell silent (invariant 5).
    Failed,
}

/// Carries asks until the stream ends; a replica that resets it as
/// malformed before answering anything sets `unknown` (invariant 4), before
/// the asks waiting are dropped.
async fn carry(
    conn: &Link,
    mut send: SendStream,
    mut recv: RecvStream,
    asks: &mut mpsc::UnboundedReceiver<Ask>,
    unknown: &AtomicBool,
    state: &LaneState,
) -> Ended {
    let mut answered = false;
    let mut waiting: VecDeque<oneshot::Sender<Result<Output>>> = VecDeque::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 2048];
    let silent = conn.until_silent();
    tokio::pin!(silent);
    loop {
        // Each branch is cancel-safe: an ask stays queued, and `read`
        // returns bytes only when it completes.
        tokio::select! {
            ask = asks.recv() => {
                let Some((lease, tx)) = ask else {
                    let _ = send.finish();
                    return Ended::Replaced;
                };
                if waiting.is_empty() {
                    state.waiting_since(conn, true);
                }
                if rpc::write_frame(&mut send, &KeepAliveFrame { lease }).await.is_err() {
                    return Ended::Failed;
                }
                waiting.push_back(tx);
            }
            read = recv.read(&mut chunk) => {
                let n = match read {
                    Ok(Some(n)) => n,
                    Err(quinn::ReadError::Reset(code))
                        if !answered && code.into_inner() == u64::from(RESET_MALFORMED) =>
                    {
                        tracing::info!("the replica does not know keep-alive streams: keep-alives go as requests");
                        unknown.store(true, Ordering::Relaxed);
                        return Ended::Unknown;
                    }
                    Ok(None) | Err(_) => return Ended::Failed,
                };
                buf.extend_from_slice(&chunk[..n]);
                while let Some(answer) = next_answer(&mut buf) {
                    let Ok(answer) = answer else { return Ended::Failed };
                    // Invariant 2 of `node::keep_alives`: in order.
                    let Some(tx) = waiting.pop_front() else { return Ended::Failed };
                    answered = true;
                    let _ = tx.send(answer);
                }
                // An answer proves the replica alive; the keep-alives still
                // waiting need proof from now on.
                state.waiting_since(conn, !waiting.is_empty());
            }
            () = &mut silent, if !waiting.is_empty() => return Ended::Failed,
        }
    }
}

/// The next whole answer frame at the front of `buf`, taken off it; an
/// error ends the stream.
fn next_answer(buf: &mut Vec<u8>) -> Option<std::result::Result<Result<Output>, ()>> {
    let header: [u8; 4] = buf.get(..4)?.try_into().expect("four bytes");
    let Ok(len) = wire::frame_len(header, wire::MAX_FRAME) else {
        return Some(Err(()));
    };
    let body = buf.get(4..4 + len)?;
    let answer = match wire::decode::<WireResponse>(body) {
        Ok(WireResponse::Output(r)) => Ok(r),
        _ => Err(()),
    };
    buf.drain(..4 + len);
    Some(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::Pin;
    use std::time::Duration;

    use quinn::VarInt;
    use tessel_kv::KvStore;

    use crate::raft::client::RaftKv;
    use crate::rpc::{self, Handler, PeerInfo};
    use crate::wire::{self, ClientRequest, WireRequest, WireResponse, RESET_MALFORMED};
    use tessel_kv::state::{Op, Output};

    /// A replica of a build before the stream: it cannot decode the
    /// request, so it does what `rpc::serve_stream` does with an
    /// undecodable one (resets its answer as malformed, drops the rest);
    /// it answers a keep-alive sent as a request.
    #[derive(Default)]
    struct Older {
        streams: AtomicU64,
    }

    impl Handler for Older {
        fn handle(
            self: Arc<Self>,
            req: WireRequest,
            mut send: SendStream,
            recv: RecvStream,
            _peer: PeerInfo,
        ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
            Box::pin(async move {
                let answer = match req {
                    WireRequest::Client(ClientRequest::KeepAliveStream) => {
                        self.streams.fetch_add(1, Ordering::Relaxed);
                        let _ = send.reset(VarInt::from_u32(RESET_MALFORMED));
                        drop(recv);
                        return;
                    }
                    WireRequest::Client(ClientRequest::Write(Op::LeaseKeepAlive { id })) => {
                        WireResponse::Output(Ok(Output::Lease { id, ttl_ms: 5000 }))
                    }
                    other => panic!("unexpected {other:?}"),
                };
                let _ = rpc::write_frame(&mut send, &answer).await;
                let _ = send.finish();
            })
        }
    }

    /// Invariant 4: against a replica that does not know the stream,
    /// keep-alives go as requests, and the stream is tried once.
    #[tokio::test]
    async fn a_replica_that_does_not_know_the_stream_gets_requests() {
        let (server_cfg, _) = tessel_tls::insecure_configs(wire::ALPN).unwrap();
        let server = rpc::endpoint("127.0.0.1:0".parse().unwrap(), Some(server_cfg)).unwrap();
        let addr = server.local_addr().unwrap();
        let older = Arc::new(Older::default());
        tokio::spawn(rpc::serve(server, older.clone()));
        let kv = RaftKv::connect(vec![addr], None).unwrap();
        for _ in 0..5 {
            let beat = tokio::time::timeout(Duration::from_secs(10), kv.keep_alive(7)).await;
            assert_eq!(beat, Ok(Ok(())));
        }
        assert_eq!(kv.keep_alives_on_stream(), 0);
        assert_eq!(older.streams.load(Ordering::Relaxed), 1, "tried once");
    }
}
