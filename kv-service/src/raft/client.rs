//! The client of the replicated service: [`KvStore`] over a
//! [`Transport`]: QUIC to any replica ([`RaftKv`]), or inside a replica's
//! own process ([`crate::raft::node::LocalKv`], for the coordinator's own
//! monitor and scheduler, which never dial their own process).
//!
//! Invariants:
//! 1. A transport error or `Unavailable` is retried on the next replica with
//!    backoff until the deadline; every other answer is final.
//! 2. A retried write is applied at most once and answered as it was the
//!    first time: every write but a keep-alive (which is idempotent, and
//!    the leader answers from memory) travels as `Op::Once` in the client's
//!    session (`tessel_kv::state` sessions invariants). A call that gives up
//!    leaves its outcome unknown, and the state refuses its late copies.
//! 3. A watch that loses its replica resumes after the last event it
//!    delivered: no event lost or repeated.
//! 4. Requests go to the leader directly when its address is known (asked
//!    before the first request and after a call failed or was given up);
//!    else a follower forwards. Correctness never depends on the hint.
//! 5. Replicas named by DNS are looked up again after a while and after a
//!    failed call: a replica rescheduled under its name is found again.
//! 6. A client's concurrent calls all go to the same replica (the leader,
//!    once known); only a failed or abandoned call moves them on, not an
//!    abandoned wait (a blocking get or a barrier: its caller may just no
//!    longer need it). Spreading them made followers relay most calls, and
//!    thousands of blocked gets filled a follower's one connection to the
//!    leader; so did moving on from every wait a worker dropped.
//! 7. A call waits for a replica that is alive, however busy, until its
//!    deadline: giving up on a slow leader after a fixed time re-sent the
//!    writes queued there, adding to its queue (a retry storm at 8,192
//!    workers). Dead and cut-off replicas are left by other means (above).
//! 8. A keep-alive goes first on the client's keep-alive stream
//!    (`keep_alives`), and as a request only where that gives no answer.
//! 9. A serializable get goes to the client's follower (`followers`), and
//!    as a linearizable get, in the time left, where that answers
//!    `Unavailable` or nothing (an older replica, one cut off).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use crate::rpc::{self, NamedPeer, PeerClient};
use crate::wire::{self, ClientRequest, ReplicaStatus, WireRequest, WireResponse};
use tessel_kv::state::{BatchPut, Limits, Op, Output};
use tessel_kv::{CasOutcome, KvStore, Listing, WatchStream};
use tessel_kv::{KvError, Result};
use tessel_tls::TlsFiles;

mod followers;
mod keep_alives;
mod move_on;
mod session;
use followers::Followers;
use keep_alives::{KeepAlives, Renewal};
use move_on::MoveOn;
use session::Session;

/// How long a request keeps trying replicas, beyond its own timeout.
pub(crate) const RETRY_BUDGET: Duration = Duration::from_secs(15);

/// How long the search for the leader waits for a replica's status
/// (invariant 4), as long as a dial waits for a handshake: a replica that
/// says nothing in that time is skipped, as a request would skip it.
const STATUS_WAIT: Duration = tessel_tls::HANDSHAKE_TIMEOUT;

/// How long past its own timeout a serializable get waits for the
/// follower's answer (invariant 9), which comes at that timeout.
const GET_MARGIN: Duration = Duration::from_secs(2);

/// A QUIC endpoint, one UDP socket, with the credentials clients present:
/// one process's clients may share it (a load generator's do), and quinn
/// then drives all their connections from one socket.
#[derive(Clone)]
pub struct ClientEndpoint(quinn::Endpoint);

impl ClientEndpoint {
    /// An endpoint on an ephemeral port of every local address of the
    /// family of `replicas` (IPv6 when the first is); `tls: None` means
    /// `--insecure`.
    pub fn for_replicas(replicas: &[SocketAddr], tls: Option<&TlsFiles>) -> Result<ClientEndpoint> {
        let client_cfg = match tls {
            Some(t) => t.client_config(wire::ALPN, tessel_tls::Expect::Coordinator),
            None => tessel_tls::insecure_configs(wire::ALPN).map(|(_, c)| c),
        }
        .map_err(|e| KvError::InvalidArgument(e.to_string()))?;
        let ipv6 = replicas.first().is_some_and(SocketAddr::is_ipv6);
        let bind: SocketAddr = if ipv6 { "[::]:0" } else { "0.0.0.0:0" }
            .parse()
            .expect("literal address");
        let mut endpoint =
            rpc::endpoint(bind, None).map_err(|e| KvError::Unavailable(e.to_string()))?;
        endpoint.set_default_client_config(client_cfg);
        Ok(ClientEndpoint(endpoint))
    }
}

/// How a client's requests reach a replica.
#[async_trait::async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Sends `req` and returns its answer; `Unavailable` is retried until
    /// `wait` plus the retry budget (invariant 1).
    async fn request(&self, req: ClientRequest, wait: Duration) -> Result<WireResponse>;

    /// The events under `prefix` from revision `from`, resumed after the
    /// last one delivered when the stream breaks (invariant 3).
    async fn watch(&self, prefix: &[u8], from: u64) -> Result<WatchStream>;

    /// Renews `lease` by a cheaper way than a request, where the
    /// transport has one (invariant 8); `None`: send it as a request.
    async fn keep_alive(&self, _lease: u64) -> Option<Result<Output>> {
        None
    }

    /// Asks a follower for a serializable get where the transport can
    /// (invariant 9); `None`: ask as a linearizable get.
    async fn get_serializable(&self, _key: &[u8], _wait: Duration) -> Option<Result<WireResponse>> {
        None
    }
}

/// A [`KvStore`] whose requests go through transport `T`.
pub struct KvClient<T> {
    transport: T,
    limits: Limits,
    session: Session,
}

/// A client of a replicated key-value cluster, over QUIC.
pub type RaftKv = KvClient<Quic>;

/// Requests over QUIC to any replica of a cluster.
pub struct Quic {
    replicas: Arc<[NamedPeer]>,
    client: PeerClient,
    next: AtomicUsize,
    /// Whether `next` was pointed at the leader since the last retry
    /// (invariant 4).
    leader_sought: AtomicBool,
    /// `None`: every keep-alive is a request ([`RaftKv::keep_alives_as_requests`]).
    keep_alives: Option<KeepAlives>,
    /// The follower of invariants 8 and 9.
    followers: Followers,
}

impl KvClient<Quic> {
    /// A client for the replicas at `addrs`, on an endpoint of its own;
    /// `tls: None` means `--insecure`.
    pub fn connect(addrs: Vec<SocketAddr>, tls: Option<&TlsFiles>) -> Result<RaftKv> {
        RaftKv::connect_via(&ClientEndpoint::for_replicas(&addrs, tls)?, addrs)
    }

    /// A client for the replicas at `targets` (`HOST:PORT`, HOST a DNS name
    /// or an address), looked up now and again later (invariant 5). At
    /// least one must resolve now: its family picks the endpoint's.
    pub async fn connect_named(targets: &[String], tls: Option<&TlsFiles>) -> Result<RaftKv> {
        let mut first = None;
        let mut why = Vec::new();
        for t in targets {
            rpc::check_host_port(t).map_err(|e| KvError::InvalidArgument(format!("`{t}`: {e}")))?;
            if first.is_none() {
                match tokio::net::lookup_host(t.as_str())
                    .await
                    .map(|mut a| a.next())
                {
                    Ok(Some(a)) => first = Some(a),
                    Ok(None) => why.push(format!("{t}: no address")),
                    Err(e) => why.push(format!("{t}: {e}")),
                }
            }
        }
        let Some(first) = first else {
            return Err(KvError::Unavailable(format!(
                "no coordinator address resolves ({})",
                why.join("; ")
            )));
        };
        let endpoint = ClientEndpoint::for_replicas(&[first], tls)?;
        RaftKv::with_replicas(&endpoint, targets.iter().map(NamedPeer::new).collect())
    }

    /// A client for the replicas at `addrs` whose connections go through
    /// `endpoint`, beside those of every other client on it. Each client
    /// still has connections of its own.
    pub fn connect_via(endpoint: &ClientEndpoint, addrs: Vec<SocketAddr>) -> Result<RaftKv> {
        let replicas = addrs.iter().map(|a| NamedPeer::new(a.to_string()));
        RaftKv::with_replicas(endpoint, replicas.collect())
    }

    fn with_replicas(endpoint: &ClientEndpoint, replicas: Vec<NamedPeer>) -> Result<RaftKv> {
        if replicas.is_empty() {
            return Err(KvError::InvalidArgument(
                "no coordinator address given".into(),
            ));
        }
        Ok(KvClient::new(Quic {
            replicas: replicas.into(),
            client: PeerClient::new(endpoint.0.clone()),
            next: AtomicUsize::new(0),
            leader_sought: AtomicBool::new(false),
            keep_alives: Some(KeepAlives::default()),
            followers: Followers::default(),
        }))
    }

    /// This client with every keep-alive sent as a request of its own, as
    /// before the keep-alive stream: for comparing the two.
    pub fn keep_alives_as_requests(mut self) -> RaftKv {
        self.transport.keep_alives = None;
        self
    }

    /// This client with its keep-alive stream and serializable gets on the
    /// leader itself, as before followers served them: for comparing.
    pub fn keep_alives_to_leader(mut self) -> RaftKv {
        self.transport.followers.unused();
        self
    }

    /// How many keep-alives its keep-alive stream answered (invariant 8).
    pub fn keep_alives_on_stream(&self) -> u64 {
        self.transport
            .keep_alives
            .as_ref()
            .map_or(0, KeepAlives::answered)
    }

    /// The replica the next request goes to first, as it was given.
    pub fn replica(&self) -> &str {
        let q = &self.transport;
        q.replicas[q.next.load(Ordering::Relaxed) % q.replicas.len()].name()
    }

    /// The status every replica reports (unreachable ones as errors), by
    /// the name each was given.
    pub async fn cluster_status(&self) -> Vec<(String, Result<ReplicaStatus>)> {
        let q = &self.transport;
        let mut out = Vec::new();
        for replica in q.replicas.iter() {
            let status = WireRequest::Client(ClientRequest::Status);
            let r = match replica
                .call(&q.client, &status, Duration::from_secs(3))
                .await
            {
                Ok(WireResponse::Status(s)) => Ok(s),
                Ok(other) => Err(unexpected(other)),
                Err(e) => Err(KvError::Unavailable(e.to_string())),
            };
            out.push((replica.name().to_owned(), r));
        }
        out
    }
}

impl Quic {
    /// Points `next` at the leader the current replica reports, when its
    /// address is one of ours (invariant 4). An unreachable replica is
    /// skipped, as a request would skip it; otherwise failures leave `next`
    /// alone and the request that follows finds its way by retrying.
    async fn seek_leader(&self) {
        let i = self.next.load(Ordering::Relaxed) % self.replicas.len();
        let asked = &self.replicas[i];
        let status = WireRequest::Client(ClientRequest::Status);
        let s = match asked.call(&self.client, &status, STATUS_WAIT).await {
            Ok(WireResponse::Status(s)) => s,
            Ok(_) => return,
            Err(_) => {
                self.followers.left(i);
                self.next.store(i + 1, Ordering::Relaxed);
                return;
            }
        };
        // The membership's address of the leader: one of ours as given
        // (a DNS name) or as it resolved.
        let Some(leader) = s
            .leader
            .and_then(|l| s.members.iter().find(|(id, _)| *id == l))
        else {
            return;
        };
        let ip = leader.1.parse::<SocketAddr>().ok();
        let ours = self
            .replicas
            .iter()
            .position(|r| r.name() == leader.1 || (ip.is_some() && r.last() == ip));
        if let Some(i) = ours {
            self.next.store(i, Ordering::Relaxed);
        }
    }

    /// [`Self::seek_leader`] unless `next` was pointed at the leader since
    /// the last retry (invariant 4).
    async fn seek_leader_once(&self) {
        if self.replicas.len() > 1 && !self.leader_sought.swap(true, Ordering::Relaxed) {
            self.seek_leader().await;
        }
    }

    /// Sends `req`, trying replicas in turn (invariant 1).
    async fn call(&self, req: ClientRequest, wait: Duration) -> Result<WireResponse> {
        let deadline = Instant::now() + wait + RETRY_BUDGET;
        let mut last_error = KvError::Unavailable("no replica answered".into());
        let mut backoff = Duration::from_millis(20);
        self.seek_leader_once().await;
        while Instant::now() < deadline {
            for _ in 0..self.replicas.len() {
                let at = self.next.load(Ordering::Relaxed);
                let replica = &self.replicas[at % self.replicas.len()];
                // Invariant 7: a live replica is waited for until the
                // deadline; a dead one is noticed once it has been silent
                // for `rpc::SILENCE` (rpc invariant 4), and a leader cut
                // off from its majority answers `Unavailable`.
                let per_call = deadline.saturating_duration_since(Instant::now());
                if per_call.is_zero() {
                    // The last real attempt's error stands (not "no answer
                    // within 0ns" from the replicas after it).
                    break;
                }
                // Invariant 6: `next` stays on this replica while the call
                // runs; a failure, or a caller giving up (dropping this
                // future), moves it on. Not a caller giving up a wait: a
                // worker drops one of two waits whenever the other ends.
                let mut move_on = MoveOn {
                    next: &self.next,
                    leader_sought: &self.leader_sought,
                    followers: &self.followers,
                    n: self.replicas.len(),
                    at: (!req.waits()).then_some(at),
                    answered: false,
                };
                let call = WireRequest::Client(req.clone());
                let failed = match replica.call(&self.client, &call, per_call).await {
                    Ok(resp) => match retryable(&resp) {
                        Some(e) => {
                            move_on.answered = true;
                            e
                        }
                        None => {
                            move_on.at = None;
                            return Ok(resp);
                        }
                    },
                    Err(e) => KvError::Unavailable(e.to_string()),
                };
                // A failure moves on, a wait's too.
                move_on.at = Some(at);
                last_error = failed;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
        Err(last_error)
    }
}

#[async_trait::async_trait]
impl Transport for Quic {
    async fn request(&self, req: ClientRequest, wait: Duration) -> Result<WireResponse> {
        self.call(req, wait).await
    }

    async fn keep_alive(&self, lease: u64) -> Option<Result<Output>> {
        let keep_alives = self.keep_alives.as_ref()?;
        self.seek_leader_once().await;
        let at = self.next.load(Ordering::Relaxed);
        let replica = at % self.replicas.len();
        let lane = self.followers.target(replica, self.replicas.len());
        match keep_alives
            .renew(&self.client, &self.replicas, (lane, lane != replica), lease)
            .await
        {
            Renewal::Answered(answer) => Some(answer),
            Renewal::Unknown => None,
            Renewal::Refused | Renewal::Broken if lane != replica => {
                // A follower that does not relay (an older build, one
                // without a leader): the request goes to the leader.
                self.followers.avoid();
                None
            }
            Renewal::Refused => {
                // A live follower, or a leader new to its term: the request
                // that follows asks where the leader is first (invariant 4).
                self.leader_sought.store(false, Ordering::Relaxed);
                None
            }
            Renewal::Broken => {
                // The replica is gone or silent: the request goes to the
                // next one, as a failed call moves on (invariant 6).
                drop(MoveOn {
                    next: &self.next,
                    leader_sought: &self.leader_sought,
                    followers: &self.followers,
                    n: self.replicas.len(),
                    at: Some(at),
                    answered: false,
                });
                None
            }
        }
    }

    async fn get_serializable(&self, key: &[u8], wait: Duration) -> Option<Result<WireResponse>> {
        let n = self.replicas.len();
        self.seek_leader_once().await;
        let requests = self.next.load(Ordering::Relaxed) % n;
        // The follower the keep-alives go to: its connection is open.
        let at = self.followers.target(requests, n);
        if at == requests {
            return None;
        }
        let req = WireRequest::Client(ClientRequest::GetSerializable {
            key: key.to_vec(),
            timeout_ms: wait.as_millis() as u64,
        });
        let answer = self.replicas[at].call(&self.client, &req, wait + GET_MARGIN);
        Some(
            answer
                .await
                .map_err(|e| KvError::Unavailable(e.to_string())),
        )
    }

    async fn watch(&self, prefix: &[u8], from_revision: u64) -> Result<WatchStream> {
        // Check the start is valid now, so a compacted start fails here.
        let first = open_watch(&self.client, &self.replicas, prefix, from_revision)
            .await
            .ok_or_else(|| KvError::Unavailable("no replica accepts the watch".into()))?;
        let state = WatchState {
            client: self.client.clone(),
            replicas: self.replicas.clone(),
            prefix: prefix.to_vec(),
            next_from: from_revision,
            recv: Some(first),
        };
        Ok(futures::stream::unfold(state, |mut st| async move {
            loop {
                if st.recv.is_none() {
                    st.recv = open_watch(&st.client, &st.replicas, &st.prefix, st.next_from).await;
                    if st.recv.is_none() {
                        let e = KvError::Unavailable("watch: no replica answers".into());
                        return Some((Err(e), st));
                    }
                }
                let recv = st.recv.as_mut().expect("set above");
                match rpc::read_frame(recv, wire::MAX_FRAME).await {
                    Ok(Some(body)) => match wire::decode::<WireResponse>(&body) {
                        Ok(WireResponse::Event(Ok(e))) => {
                            st.next_from = e.revision() + 1;
                            return Some((Ok(e), st));
                        }
                        Ok(WireResponse::Event(Err(KvError::Unavailable(_)))) => st.recv = None,
                        Ok(WireResponse::Event(Err(e))) => return Some((Err(e), st)),
                        Ok(other) => return Some((Err(unexpected(other)), st)),
                        Err(e) => return Some((Err(KvError::Internal(e.to_string())), st)),
                    },
                    // Invariant 3: resume elsewhere from the next revision.
                    Ok(None) | Err(_) => st.recv = None,
                }
            }
        })
        .boxed())
    }
}

impl<T: Transport> KvClient<T> {
    /// A client whose requests go through `transport`.
    pub fn new(transport: T) -> KvClient<T> {
        KvClient {
            transport,
            limits: Limits::default(),
            session: Session::new(),
        }
    }

    /// The transport its requests go through.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    async fn request(&self, req: ClientRequest, wait: Duration) -> Result<WireResponse> {
        self.transport.request(req, wait).await
    }

    async fn write(&self, op: Op) -> Result<Output> {
        // Refuse oversized data here rather than ship it to be refused.
        self.limits.check_op(&op)?;
        // Invariant 2; `_call` leaves the calls in flight when this returns
        // or is dropped.
        let (op, _call) = match op {
            Op::LeaseKeepAlive { .. } => (op, None),
            op => {
                let call = self.session.begin();
                (call.wrap(op), Some(call))
            }
        };
        match self
            .request(ClientRequest::Write(op), Duration::ZERO)
            .await?
        {
            WireResponse::Output(r) => r,
            other => Err(unexpected(other)),
        }
    }

    /// Adds replica `id` at `addr` (learner, then voter once caught up).
    pub async fn add_replica(&self, id: u64, addr: SocketAddr) -> Result<()> {
        match self
            .request(
                ClientRequest::AddReplica {
                    id,
                    addr: addr.to_string(),
                },
                Duration::from_secs(60),
            )
            .await?
        {
            WireResponse::Done(r) => r,
            other => Err(unexpected(other)),
        }
    }

    /// Removes replica `id` from the voters.
    pub async fn remove_replica(&self, id: u64) -> Result<()> {
        match self
            .request(ClientRequest::RemoveReplica { id }, Duration::from_secs(30))
            .await?
        {
            WireResponse::Done(r) => r,
            other => Err(unexpected(other)),
        }
    }
}

/// The error of an answer that asks to be retried elsewhere or later.
pub(crate) fn retryable(resp: &WireResponse) -> Option<KvError> {
    let err = match resp {
        WireResponse::Done(Err(e))
        | WireResponse::Output(Err(e))
        | WireResponse::Value(Err(e))
        | WireResponse::List(Err(e))
        | WireResponse::Listing(Err(e))
        | WireResponse::Revision(Err(e))
        | WireResponse::Event(Err(e)) => e,
        _ => return None,
    };
    matches!(err, KvError::Unavailable(_)).then(|| err.clone())
}

pub(crate) fn unexpected(r: WireResponse) -> KvError {
    KvError::Internal(format!("unexpected answer {r:?}"))
}

#[async_trait::async_trait]
impl<T: Transport> KvStore for KvClient<T> {
    async fn insert(&self, key: &[u8], value: &[u8]) -> Result<u64> {
        self.write(Op::Insert {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: None,
        })
        .await?
        .into_revision()
    }

    async fn put(&self, key: &[u8], value: &[u8]) -> Result<u64> {
        self.write(Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: None,
        })
        .await?
        .into_revision()
    }

    async fn put_with_lease(&self, key: &[u8], value: &[u8], lease: u64) -> Result<u64> {
        self.write(Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: Some(lease),
        })
        .await?
        .into_revision()
    }

    async fn put_batch(&self, puts: &[BatchPut]) -> Result<u64> {
        self.write(Op::PutBatch {
            puts: puts.to_vec(),
        })
        .await?
        .into_revision()
    }

    async fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let req = ClientRequest::Get {
            key: key.to_vec(),
            timeout_ms: timeout.as_millis() as u64,
        };
        match self.request(req, timeout).await? {
            WireResponse::Value(r) => r,
            other => Err(unexpected(other)),
        }
    }

    async fn get_serializable(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        let started = Instant::now();
        match self.transport.get_serializable(key, timeout).await {
            // Invariant 9: a follower's answer, or the leader's.
            Some(Ok(WireResponse::Value(r))) if !matches!(r, Err(KvError::Unavailable(_))) => r,
            _ => {
                self.get(key, timeout.saturating_sub(started.elapsed()))
                    .await
            }
        }
    }

    async fn try_get(&self, key: &[u8]) -> Result<Vec<u8>> {
        match self
            .request(ClientRequest::TryGet { key: key.to_vec() }, Duration::ZERO)
            .await?
        {
            WireResponse::Value(r) => r,
            other => Err(unexpected(other)),
        }
    }

    async fn list_at(&self, prefix: &[u8]) -> Result<Listing> {
        match self
            .request(
                ClientRequest::ListAt {
                    prefix: prefix.to_vec(),
                },
                Duration::ZERO,
            )
            .await?
        {
            WireResponse::Listing(r) => r,
            other => Err(unexpected(other)),
        }
    }

    async fn delete(&self, key: &[u8]) -> Result<u64> {
        self.write(Op::Delete { key: key.to_vec() })
            .await?
            .into_deleted()
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> Result<u64> {
        self.write(Op::DeletePrefix {
            prefix: prefix.to_vec(),
        })
        .await?
        .into_deleted()
    }

    async fn increment(&self, key: &[u8], delta: i64) -> Result<i64> {
        self.write(Op::Increment {
            key: key.to_vec(),
            delta,
        })
        .await?
        .into_counter()
    }

    async fn compare_and_swap(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<CasOutcome> {
        let op = Op::CompareAndSwap {
            key: key.to_vec(),
            expected: expected.map(<[u8]>::to_vec),
            value: value.to_vec(),
        };
        Ok(self.write(op).await?.into_cas()?.into())
    }

    async fn watch(&self, prefix: &[u8], from_revision: u64) -> Result<WatchStream> {
        self.transport.watch(prefix, from_revision).await
    }

    async fn grant(&self, ttl: Duration) -> Result<u64> {
        self.write(Op::LeaseGrant {
            ttl_ms: ttl.as_millis() as u64,
        })
        .await?
        .into_lease()
    }

    async fn grant_and_put(&self, lease: u64, ttl: Duration, puts: &[BatchPut]) -> Result<u64> {
        self.write(Op::GrantPutBatch {
            lease,
            ttl_ms: ttl.as_millis() as u64,
            puts: puts.to_vec(),
        })
        .await?
        .into_revision()
    }

    async fn keep_alive(&self, lease: u64) -> Result<()> {
        if let Some(answer) = self.transport.keep_alive(lease).await {
            return answer.map(drop);
        }
        self.write(Op::LeaseKeepAlive { id: lease }).await.map(drop)
    }

    async fn revoke(&self, lease: u64) -> Result<()> {
        self.write(Op::LeaseRevoke { id: lease }).await.map(drop)
    }

    async fn barrier(
        &self,
        id: &[u8],
        participant: &[u8],
        participants: u32,
        timeout: Duration,
    ) -> Result<()> {
        let op = Op::barrier_arrive(id, participant, participants, timeout);
        let status = self.write(op).await?.into_barrier()?;
        if let Some(r) = status.outcome(id) {
            return r;
        }
        let wait = timeout + Duration::from_secs(2);
        let req = ClientRequest::WaitBarrier {
            id: id.to_vec(),
            timeout_ms: wait.as_millis() as u64,
        };
        match self.request(req, wait).await? {
            WireResponse::Output(Ok(Output::Barrier(s))) => {
                s.outcome(id).unwrap_or(Err(KvError::DeadlineExceeded {
                    what: format!("barrier `{}`", tessel_kv::show_key(id)),
                    after: timeout,
                }))
            }
            WireResponse::Output(Err(e)) => Err(e),
            other => Err(unexpected(other)),
        }
    }

    async fn cancel_barrier(&self, id: &[u8], reason: &str) -> Result<()> {
        self.write(Op::BarrierCancel {
            id: id.to_vec(),
            reason: reason.to_owned(),
        })
        .await?
        .into_barrier()
        .map(drop)
    }

    async fn revision(&self) -> Result<u64> {
        match self
            .request(ClientRequest::Revision, Duration::ZERO)
            .await?
        {
            WireResponse::Revision(r) => r,
            other => Err(unexpected(other)),
        }
    }
}

struct WatchState {
    client: PeerClient,
    replicas: Arc<[NamedPeer]>,
    prefix: Vec<u8>,
    next_from: u64,
    recv: Option<quinn::RecvStream>,
}

/// Opens a watch stream on the first replica that accepts it, trying for
/// up to the retry budget. A refused start (a compacted revision) arrives as
/// the stream's first frame.
async fn open_watch(
    client: &PeerClient,
    replicas: &[NamedPeer],
    prefix: &[u8],
    from: u64,
) -> Option<quinn::RecvStream> {
    let deadline = Instant::now() + RETRY_BUDGET;
    while Instant::now() < deadline {
        for replica in replicas {
            let req = WireRequest::Client(ClientRequest::Watch {
                prefix: prefix.to_vec(),
                from,
            });
            let Ok(addr) = replica.addr(client).await else {
                continue;
            };
            if let Ok((_, mut send, recv)) = client.open(addr, &req).await {
                let _ = send.finish();
                return Some(recv);
            }
            replica.forget();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
