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
//!    silent), even if no caller waited to see it fail. The lane's task
//!    finds it silent when keep-alives have waited on it for
//!    [`UNACKNOWLEDGED`] and its replica sent nothing meanwhile (a live
//!    one acknowledges a frame within 25 ms, however slow its answer; the
//!    requests' own replica, which leaving costs a search for the leader,
//!    gets [`rpc::SILENCE`], as a request does), and fails it when it is
//!    not open [`rpc::SILENCE`] after its first keep-alive. Before, a dead
//!    follower was found only once the connection had been silent for
//!    `rpc::SILENCE` (four 300 ms beats lost), and one whose handshake
//!    went unanswered after `tessel_tls::HANDSHAKE_TIMEOUT` (2 s): more than
//!    the 1.5 s TTL the tests' workers use. The keep-alives waiting give a
//!    follower a sixth of the shortest TTL answered so far, at least
//!    [`UNACKNOWLEDGED`] and at most [`rpc::SILENCE`].
//! 6. Only time this process could watch counts as the replica's silence:
//!    a check that comes more than twice its period late (this process
//!    starved of CPU, the replica's datagrams unread in the socket) starts
//!    the count again, as `rpc` silence invariant 1 does (one
//!    `rpc::Watched` counts for both). One check a lane, not a timer a
//!    keep-alive; and a keep-alive's failure replaces only the lane it was
//!    sent on. At 16,384 simulated hosts the benchmark's
//!    own runtime ran 0.4–0.8 s late: verdicts on live followers dropped
//!    every keep-alive of their lanes to requests, and each of those,
//!    failing, replaced the lane that had replaced theirs (6,177 dropped
//!    and 1,352 verdicts in one failing run: docs/performance.md).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{RecvStream, SendStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::RETRY_BUDGET;
use crate::rpc::{self, Link, NamedPeer, PeerClient, Watched};
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
    /// The stream failed, or is about to: nothing more will be answered.
    failed: AtomicBool,
    /// Whether the lane's replica is a follower (its patience, invariant 5).
    follower: AtomicBool,
}

impl LaneState {
    /// Invariant 5: nothing will come of this stream.
    fn broken(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// A client's keep-alive stream, opened when first needed.
#[derive(Default)]
pub(super) struct KeepAlives {
    lane: Mutex<Option<Lane>>,
    answered: AtomicU64,
    /// The shortest lease TTL the stream has answered with, in ms (0:
    /// none yet): the keep-alive waiting gives its follower a sixth of it
    /// (invariant 5); shared with the lanes' tasks.
    ttl_ms: Arc<AtomicU64>,
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
        if self.unknown.load(Ordering::Relaxed) {
            return Renewal::Unknown;
        }
        let (tx, rx) = oneshot::channel();
        let state = {
            let mut lane = self.lane.lock().unwrap_or_else(|p| p.into_inner());
            if lane
                .as_ref()
                .is_some_and(|l| l.at == at && l.state.broken())
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
                let state = Arc::<LaneState>::default();
                let lane_task = LaneTask {
                    client: client.clone(),
                    replicas: replicas.clone(),
                    at,
                    unknown: self.unknown.clone(),
                    ttl_ms: self.ttl_ms.clone(),
                    state: state.clone(),
                };
                tokio::spawn(lane_task.drive(queued));
                *lane = Some(Lane { at, asks, state });
            }
            let sent = lane.as_ref().map(|l| {
                l.state.follower.store(follower, Ordering::Relaxed);
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
        // Invariants 5 and 6: the lane's task drops the keep-alives waiting
        // on a stream that broke or fell silent.
        let renewal = match tokio::time::timeout(RETRY_BUDGET, rx).await {
            Ok(Ok(Err(KvError::Unavailable(_)))) => Renewal::Refused,
            Ok(Ok(done)) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                if let Ok(Output::Lease { ttl_ms, .. }) = done {
                    let shorter = |seen: u64| (seen == 0 || ttl_ms < seen).then_some(ttl_ms);
                    let _ = self
                        .ttl_ms
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, shorter);
                }
                return Renewal::Answered(done);
            }
            Ok(Err(_)) | Err(_) if self.unknown.load(Ordering::Relaxed) => Renewal::Unknown,
            Ok(Err(_)) | Err(_) => Renewal::Broken,
        };
        // Invariants 2 and 6: its own lane replaced on the next keep-alive,
        // not one that replaced it meanwhile.
        let mut lane = self.lane.lock().unwrap_or_else(|p| p.into_inner());
        if lane.as_ref().is_some_and(|l| Arc::ptr_eq(&l.state, &state)) {
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

/// A lane's task: what it needs to open and watch its stream.
struct LaneTask {
    client: PeerClient,
    replicas: Arc<[NamedPeer]>,
    /// The replica, by index.
    at: usize,
    unknown: Arc<AtomicBool>,
    ttl_ms: Arc<AtomicU64>,
    state: Arc<LaneState>,
}

impl LaneTask {
    /// Opens the stream to replica `at` (its address as the client's
    /// requests resolve it) and carries `asks` on it until every sender is
    /// gone and every keep-alive sent is answered, or the stream fails;
    /// dropping a waiting ask's sender tells its caller to send a request
    /// instead (invariant 3), and `state` tells the next keep-alives how it
    /// goes (invariant 5).
    async fn drive(self, mut asks: mpsc::UnboundedReceiver<Ask>) {
        let open = WireRequest::Client(ClientRequest::KeepAliveStream);
        let opening = async {
            let addr = self.replicas[self.at].addr(&self.client).await?;
            self.client.open(addr, &open).await
        };
        // Invariants 5 and 6: not open `rpc::SILENCE` after the first
        // keep-alive (this task's start), counting what was watched.
        let opened = tokio::select! {
            opened = opening => opened.ok(),
            () = watch_for(rpc::SILENCE) => None,
        };
        let ended = match opened {
            Some((conn, send, recv)) => self.carry(&conn, send, recv, &mut asks).await,
            None => Ended::Failed,
        };
        if ended == Ended::Failed {
            self.state.failed.store(true, Ordering::Release);
        }
    }

    /// How long keep-alives may wait on a replica that sends nothing
    /// (invariant 5).
    fn patience(&self) -> Duration {
        if !self.state.follower.load(Ordering::Relaxed) {
            return rpc::SILENCE;
        }
        let sixth = Duration::from_millis(self.ttl_ms.load(Ordering::Relaxed) / 6);
        UNACKNOWLEDGED.max(sixth.min(rpc::SILENCE))
    }

    /// Carries asks until the stream ends; a replica that resets it as
    /// malformed before answering anything sets `unknown` (invariant 4),
    /// before the asks waiting are dropped.
    async fn carry(
        &self,
        conn: &Link,
        mut send: SendStream,
        mut recv: RecvStream,
        asks: &mut mpsc::UnboundedReceiver<Ask>,
    ) -> Ended {
        let mut answered = false;
        let mut waiting: VecDeque<oneshot::Sender<Result<Output>>> = VecDeque::new();
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = [0u8; 2048];
        let mut replaced = false;
        let silent = conn.until_silent();
        tokio::pin!(silent);
        // Invariants 5 and 6, while keep-alives wait: the datagrams the
        // connection had received when the count (re)started.
        let mut watched = Watched::from_now();
        let mut seen = 0;
        let check = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(check);
        loop {
            if replaced && waiting.is_empty() {
                let _ = send.finish();
                return Ended::Replaced;
            }
            // Each branch is cancel-safe: an ask stays queued, and `read`
            // returns bytes only when it completes.
            tokio::select! {
                ask = asks.recv(), if !replaced => {
                    let Some((lease, tx)) = ask else {
                        // Those sent are still answered (invariant 6).
                        replaced = true;
                        continue;
                    };
                    if waiting.is_empty() {
                        watched.restart();
                        seen = conn.stats().udp_rx.datagrams;
                        check.as_mut().reset(Instant::now() + self.patience() / 5);
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
                            self.unknown.store(true, Ordering::Relaxed);
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
                    // An answer proves the replica alive; the keep-alives
                    // still waiting need proof from now on.
                    watched.restart();
                    seen = conn.stats().udp_rx.datagrams;
                }
                () = &mut check, if !waiting.is_empty() => {
                    let patience = self.patience();
                    let period = patience / 5;
                    let rx = conn.stats().udp_rx.datagrams;
                    if rx != seen {
                        watched.restart();
                        seen = rx;
                    } else if watched.check(period).is_some_and(|w| w >= patience) {
                        // Nothing more comes of it: the next keep-alives
                        // go elsewhere before this task has ended.
                        self.state.failed.store(true, Ordering::Release);
                        return Ended::Failed;
                    }
                    check.as_mut().reset(Instant::now() + period);
                }
                () = &mut silent, if !waiting.is_empty() => return Ended::Failed,
            }
        }
    }
}

/// Returns once `patience` of time this process could watch has passed
/// (invariant 6).
async fn watch_for(patience: Duration) {
    let period = patience / 5;
    let mut watched = Watched::from_now();
    loop {
        tokio::time::sleep(period).await;
        if watched.check(period).is_some_and(|w| w >= patience) {
            return;
        }
    }
}

/// Why a stream's task ended.
#[derive(PartialEq, Eq)]
enum Ended {
    /// Every sender of asks is gone (the client replaced the lane), and
    /// every keep-alive sent was answered.
    Replaced,
    /// The replica does not know the stream (invariant 4).
    Unknown,
    /// The stream broke or its replica fell silent (invariant 5).
    Failed,
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
