//! One replica: storage, openraft, the QUIC server, and request routing.
//!
//! Invariants:
//! 1. Client requests are served by the leader; a follower forwards one once,
//!    marked [`WireRequest::Forwarded`], never again; a replica that cannot
//!    serve answers `Unavailable` and the client tries another.
//! 2. A read waits for `ensure_linearizable` and for the read floor (the
//!    leader's whole log as of its first read in the term), so it never sees
//!    less than the leader acknowledged (`raft` module docs, "Reads").
//! 3. Time in requests is the leader's clock (`clock`: monotonic, never
//!    the wall's); only the leader proposes `Tick`s, when a lease or
//!    barrier is due.
//! 4. A leader's first write of its term is preceded by `RenewLeases`, so no
//!    lease expires for the leaderless gap; until it commits, client writes
//!    answer `Unavailable` and ticks wait.
//! 5. Writes arriving while a proposal is in flight form the next one (group
//!    commit), applied in arrival order, each with its own result and revision.
//! 6. Every request is authorized by its connection's certificate first
//!    ([`crate::authz`]); the leader trusts only coordinators' relays.
//! 7. A storage error stops the Raft core (openraft never counts an entry
//!    durable that its log could not write); [`Replica::stopped`] says so,
//!    and its process exits so that a supervisor restarts it from disk.
//! 8. A waiting client request (a blocking get, a barrier, a watch) is
//!    served only while its caller listens: a stopped stream or a closed
//!    connection ends it and its wait.
//! 9. Keep-alives on a keep-alive stream are answered by the leader from
//!    memory, relayed by a follower in batches (`relay`), or refused
//!    `Unavailable` (`keep_alives` invariant 1).
//! 10. Raft's messages and the relay's batches travel on connections of
//!     their own, never on the ones that forward client requests: a
//!     connection takes 1,024 streams at once, and a follower forwarding
//!     that many blocking gets left a relayed batch waiting for a stream
//!     past its deadline, so the keep-alives it carried went unanswered.
//! 11. The Raft core, its replication and its connections run on a thread,
//!     runtime and socket of their own (`raft_thread`): client work queued
//!     on the replica's runtime never delays a heartbeat to a follower.
//! 12. A follower forwards waiting requests (blocking gets, barriers,
//!     watches) on a connection apart from the one for other requests, and
//!     answers `Unavailable` when it gets no stream to the leader within
//!     `FORWARD_OPEN` (2 s); the client then tries another replica. Held waits
//!     that filled the one connection's 1,024 streams left every write
//!     forwarded after them waiting past its caller's retry budget (16,384
//!     simulated hosts: docs/performance.md).

mod clock;
mod keep_alives;
mod local;
mod membership;
mod network;
mod proposer;
mod quorum;
mod raft_thread;
mod reads;
mod relay;
mod renewals;
mod serializable;
mod status;
mod ticker;

use clock::LeaderClock;
use proposer::*;
use quorum::QuorumWatch;
use renewals::Renewals;
use ticker::tick_when_due;

use crate::raft::client::KvClient;
use local::Answers;
pub use local::{InProcess, LocalKv};
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Raft, ServerState};
use quinn::{RecvStream, SendStream};

use crate::raft::sm::SmTables;
use crate::raft::wal::LogIo;
use crate::raft::{storage, Proposal, TypeConfig};
use crate::rpc::{self, Handler, NamedPeer, NetError, PeerClient};
use crate::wire::{self, ClientRequest, WireRequest, WireResponse};
use tessel_kv::state::{BarrierStatus, KvState, Op, Output, Request};
use tessel_kv::AppliedState;
use tessel_kv::KvError;
use tessel_tls::TlsFiles;

/// How long a follower waits for a stream to the leader to forward a
/// request on (invariant 12): the handshake's own bound, so a connection
/// being dialed is not given up sooner than it would be.
const FORWARD_OPEN: Duration = tessel_tls::HANDSHAKE_TIMEOUT;

/// How a replica is set up.
#[derive(Clone)]
pub struct ReplicaConfig {
    /// This replica's Raft id.
    pub id: u64,
    /// Where it listens (clients and peers).
    pub listen: SocketAddr,
    /// The initial voters (id → `HOST:PORT`, a DNS name or an IP), this
    /// replica included. Used once, to form the cluster on first start;
    /// names are resolved again whenever a link to the peer is (re)made.
    pub peers: BTreeMap<u64, String>,
    /// Its log, state machine and snapshots.
    pub data_dir: PathBuf,
    /// `None` means `--insecure`.
    pub tls: Option<TlsFiles>,
    /// Raft timing ([`ReplicaConfig::default_raft`]).
    pub raft: openraft::Config,
    /// How the Raft log writes ([`LogIo::Direct`] unless the file system
    /// refuses it; `wal` invariant 7).
    pub log_io: LogIo,
}

impl ReplicaConfig {
    /// Raft timing for a LAN or loopback: 500 ms heartbeats (openraft also
    /// uses this as the deadline of each AppendEntries, which must fit a
    /// 4 MiB value), elections after 1–2 s of silence, snapshots every
    /// 20 000 entries.
    pub fn default_raft() -> openraft::Config {
        openraft::Config {
            cluster_name: "tessel".into(),
            heartbeat_interval: 500,
            election_timeout_min: 1000,
            election_timeout_max: 2000,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(20_000),
            max_in_snapshot_log_to_keep: 1000,
            ..Default::default()
        }
    }
}

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// The data folder could not be opened or used.
    #[error("storage: {0}")]
    Storage(String),
    /// The certificates could not be loaded.
    #[error("TLS: {0}")]
    Tls(#[from] tessel_tls::TlsError),
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// openraft refused to start.
    #[error("raft: {0}")]
    Raft(String),
}

/// A running replica.
pub struct Replica {
    /// Its Raft id.
    pub id: u64,
    /// The openraft handle.
    pub raft: Raft<TypeConfig>,
    applied: Arc<AppliedState<SmTables>>,
    endpoint: quinn::Endpoint,
    handler: Arc<ReplicaHandler>,
}

impl Replica {
    /// Opens the data folder, starts Raft and the server, and on first start
    /// forms the cluster from `peers`.
    pub async fn start(cfg: ReplicaConfig) -> Result<Replica, ReplicaError> {
        std::fs::create_dir_all(&cfg.data_dir).map_err(|e| ReplicaError::Storage(e.to_string()))?;
        let (log, sm) = storage::open(&cfg.data_dir, cfg.id, KvState::default(), cfg.log_io)
            .await
            .map_err(|e| ReplicaError::Storage(e.to_string()))?;
        let log_synced = log.synced();
        let applied = sm.applied();
        let (server_cfg, client_cfg) = match &cfg.tls {
            Some(t) => (
                t.server_config(wire::ALPN, tessel_tls::Accept::AnyRole)?,
                t.client_config(wire::ALPN, tessel_tls::Expect::Coordinator)?,
            ),
            None => tessel_tls::insecure_configs(wire::ALPN)?,
        };
        let mut endpoint =
            rpc::endpoint(cfg.listen, Some(server_cfg)).map_err(|source| ReplicaError::Listen {
                addr: cfg.listen,
                source,
            })?;
        endpoint.set_default_client_config(client_cfg.clone());
        let bound = endpoint
            .local_addr()
            .map_err(|source| ReplicaError::Listen {
                addr: cfg.listen,
                source,
            })?;
        // With port 0, this replica's entry in the peer list is its real address.
        let mut peers = cfg.peers.clone();
        if let Some(a) = peers.get_mut(&cfg.id) {
            if a.parse::<SocketAddr>().is_ok_and(|a| a.port() == 0) {
                *a = bound.to_string();
            }
        }
        // Invariant 10: the relayed keep-alives on connections of their
        // own (the consensus has its own socket: invariant 11).
        let client = PeerClient::new(endpoint.clone());
        let waits = PeerClient::new(endpoint.clone());
        let control = PeerClient::new(endpoint.clone());
        let config = Arc::new(
            cfg.raft
                .clone()
                .validate()
                .map_err(|e| ReplicaError::Raft(e.to_string()))?,
        );
        // Invariant 11.
        let raft = raft_thread::start(raft_thread::CoreParts {
            id: cfg.id,
            config: config.clone(),
            log,
            sm,
            log_synced,
            listen: bound,
            client_cfg,
        })
        .await?;
        let leases_renewed = Arc::new(AtomicU64::new(0));
        let quorum = QuorumWatch::start(&raft, &config);
        let leases = LeaseBook {
            applied: applied.clone(),
            renewals: Arc::new(Renewals::default()),
            clock: Arc::new(LeaderClock::new(&raft, applied.clone())),
        };
        let proposer = Proposer::start(raft.clone(), quorum.clone(), leases.clone());
        let handler = Arc::new(ReplicaHandler {
            id: cfg.id,
            raft: raft.clone(),
            applied: applied.clone(),
            client,
            waits,
            control,
            leases_renewed: leases_renewed.clone(),
            proposer: proposer.clone(),
            quorum: quorum.clone(),
            leases: leases.clone(),
            read_floor: std::sync::Mutex::new(None),
            relay: Arc::default(),
            quic: rpc::server_thread(),
        });
        let relaying = relay::run(Arc::downgrade(&handler), handler.relay.clone());
        tokio::spawn(relaying);
        tokio::spawn(rpc::serve(endpoint.clone(), handler.clone()));
        tokio::spawn(tick_when_due(
            raft.clone(),
            leases,
            proposer,
            cfg.id,
            quorum,
            leases_renewed,
        ));
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| ReplicaError::Raft(e.to_string()))?;
        if !initialized && !peers.is_empty() {
            let members: BTreeMap<u64, BasicNode> = peers
                .iter()
                .map(|(id, a)| (*id, BasicNode::new(a.clone())))
                .collect();
            // Every replica of a new cluster initializes with the same voters;
            // the identical first log entry makes that safe, and a replica
            // that already learned of the cluster refuses (ignored).
            if let Err(e) = raft.initialize(members).await {
                tracing::info!("initialize: {e}");
            }
        }
        Ok(Replica {
            id: cfg.id,
            raft,
            applied,
            endpoint,
            handler,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Its readiness: the leader it knows, or why it serves nothing.
    pub fn readiness_probe(&self) -> impl Fn() -> Result<u64, String> + Send + Sync + 'static {
        let metrics = self.raft.metrics();
        move || {
            let m = metrics.borrow();
            match (&m.running_state, m.current_leader) {
                (Err(e), _) => Err(format!("its Raft core stopped: {e}")),
                (Ok(()), Some(leader)) => Ok(leader),
                (Ok(()), None) => Err("no leader known".into()),
            }
        }
    }

    /// Whether it leads now (as far as it knows).
    pub fn leads_probe(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let (metrics, id) = (self.raft.metrics(), self.id);
        move || metrics.borrow().current_leader == Some(id)
    }

    /// Resolves, with why, once the Raft core stopped (invariant 7).
    pub fn stopped(&self) -> impl Future<Output = String> + Send + 'static {
        let mut metrics = self.raft.metrics();
        async move {
            loop {
                if let Err(e) = &metrics.borrow_and_update().running_state {
                    return e.to_string();
                }
                if metrics.changed().await.is_err() {
                    return "the Raft core ended".into();
                }
            }
        }
    }

    /// A client of this replica for its own process: no network, the
    /// replica's authority (`local` invariant 1).
    pub fn local_client(&self) -> LocalKv {
        KvClient::new(InProcess::new(self.handler.clone()))
    }

    /// This replica's applied state.
    pub fn applied(&self) -> Arc<AppliedState<SmTables>> {
        self.applied.clone()
    }

    /// Stops Raft and the server.
    pub async fn shutdown(self) {
        let _ = self.raft.shutdown().await;
        self.endpoint.close(0u32.into(), b"shutdown");
    }
}

struct ReplicaHandler {
    id: u64,
    raft: Raft<TypeConfig>,
    applied: Arc<AppliedState<SmTables>>,
    /// Forwards client requests to the leader.
    client: PeerClient,
    /// Forwards the waiting ones (invariant 12).
    waits: PeerClient,
    /// Carries the relay's batches (invariant 10; Raft's messages have the
    /// core's own socket, invariant 11).
    control: PeerClient,
    leases_renewed: Arc<AtomicU64>,
    proposer: Proposer,
    quorum: QuorumWatch,
    /// The leader's clock and its memory of renewals.
    leases: LeaseBook,
    /// (term, log index) of invariant 2's read floor.
    read_floor: std::sync::Mutex<Option<(u64, u64)>>,
    relay: Arc<relay::Relay>,
    /// Where keep-alive streams are served (`keep_alives` invariant 4).
    quic: Arc<rpc::IoThread>,
}

async fn reply(send: &mut Answers<'_>, r: WireResponse) {
    if let Err(e) = send.frame(r).await {
        tracing::debug!("reply failed: {e}");
    }
}

/// Resolves once the leader this replica knows no longer passes `keep`,
/// or its Raft core ended. Woken by openraft's server metrics (vote,
/// leader, membership) alone, never by its other metrics
/// (`serializable` invariant 4).
async fn leader_leaves(raft: &Raft<TypeConfig>, keep: impl Fn(Option<u64>) -> bool) {
    let mut metrics = raft.server_metrics();
    while keep(metrics.borrow_and_update().current_leader) {
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

fn unavailable(msg: impl Into<String>) -> KvError {
    KvError::Unavailable(msg.into())
}

/// The answer to give when a request fails before producing its own.
fn error_response(req: &ClientRequest, e: KvError) -> WireResponse {
    match req {
        ClientRequest::Get { .. }
        | ClientRequest::GetSerializable { .. }
        | ClientRequest::TryGet { .. } => WireResponse::Value(Err(e)),
        ClientRequest::List { .. } => WireResponse::List(Err(e)),
        ClientRequest::ListAt { .. } => WireResponse::Listing(Err(e)),
        ClientRequest::Revision => WireResponse::Revision(Err(e)),
        ClientRequest::Watch { .. } => WireResponse::Event(Err(e)),
        ClientRequest::AddReplica { .. } | ClientRequest::RemoveReplica { .. } => {
            WireResponse::Done(Err(e))
        }
        ClientRequest::Guarded { request, .. } => error_response(request, e),
        _ => WireResponse::Output(Err(e)),
    }
}

/// A request under the guard its authorization gave it: a write becomes
/// [`Op::Guarded`] (checked when applied), a read [`ClientRequest::Guarded`]
/// (checked once linearizable).
fn guarded(req: WireRequest, guard: tessel_kv::state::Guard) -> WireRequest {
    let wrap = |c: ClientRequest| match c {
        ClientRequest::Write(op) => ClientRequest::Write(Op::Guarded {
            guard,
            op: Box::new(op),
        }),
        read => ClientRequest::Guarded {
            guard,
            request: Box::new(read),
        },
    };
    match req {
        WireRequest::Client(c) => WireRequest::Client(wrap(c)),
        WireRequest::Forwarded(c) => WireRequest::Forwarded(wrap(c)),
        other => other,
    }
}

impl Handler for ReplicaHandler {
    fn handle(
        self: Arc<Self>,
        req: WireRequest,
        mut send: SendStream,
        recv: RecvStream,
        peer: rpc::PeerInfo,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(async move {
            // Invariant 6: the certificate's role decides what it may ask.
            let req = match crate::authz::authorize(&peer.identity, &req) {
                Ok(None) => req,
                Ok(Some(guard)) => guarded(req, guard),
                Err(why) => {
                    tracing::warn!(peer = %peer.addr, %why, "request refused");
                    match &req {
                        WireRequest::Client(c) | WireRequest::Forwarded(c) => {
                            reply(
                                &mut Answers::Stream(&mut send),
                                error_response(c, KvError::PermissionDenied(why)),
                            )
                            .await
                        }
                        _ => {
                            let _ = send.reset(quinn::VarInt::from_u32(wire::RESET_FORBIDDEN));
                            return;
                        }
                    }
                    let _ = send.finish();
                    return;
                }
            };
            match req {
                WireRequest::AppendEntries(r) => {
                    reply(
                        &mut Answers::Stream(&mut send),
                        WireResponse::AppendEntries(Box::pin(self.raft.append_entries(r)).await),
                    )
                    .await
                }
                WireRequest::Vote(r) => {
                    let vote = WireResponse::Vote(Box::pin(self.raft.vote(r)).await);
                    reply(&mut Answers::Stream(&mut send), vote).await
                }
                WireRequest::InstallSnapshot(r) => {
                    reply(
                        &mut Answers::Stream(&mut send),
                        WireResponse::InstallSnapshot(
                            Box::pin(self.raft.install_snapshot(r)).await,
                        ),
                    )
                    .await
                }
                WireRequest::Client(ClientRequest::Status) => {
                    let status = WireResponse::Status(self.status());
                    reply(&mut Answers::Stream(&mut send), status).await
                }
                WireRequest::Client(ClientRequest::KeepAliveStream) => {
                    // It finishes the stream itself, on the QUIC thread.
                    return keep_alives::serve_on_quic_thread(self, send, recv).await;
                }
                WireRequest::Client(c) => self.listened(c, &mut send, false).await,
                WireRequest::Forwarded(c) => self.listened(c, &mut send, true).await,
            }
            let _ = send.finish();
        })
    }
}

impl ReplicaHandler {
    /// [`Self::route`] until the caller stops the stream or its connection
    /// ends (invariant 8): a blocking get or watch whose caller went away
    /// (a call that timed out, a worker that died) frees its stream, its
    /// task and its key's wait now, not at its own timeout an hour later.
    async fn listened(&self, req: ClientRequest, send: &mut SendStream, forwarded: bool) {
        if !req.waits() {
            // A write or a plain read ends by itself: no watch on the
            // caller (each poll of it takes the connection's lock).
            return self.route(req, &mut Answers::Stream(send), forwarded).await;
        }
        let gone = send.stopped();
        let mut answers = Answers::Stream(send);
        tokio::select! {
            () = self.route(req, &mut answers, forwarded) => {}
            _ = gone => {}
        }
    }

    /// Serves as leader, or forwards once (invariant 1); a serializable
    /// get is this replica's own (`serializable`).
    async fn route(&self, req: ClientRequest, send: &mut Answers<'_>, forwarded: bool) {
        if let ClientRequest::GetSerializable { key, timeout_ms } = &req {
            let got = self.serializable_get(key, *timeout_ms).await;
            return reply(send, WireResponse::Value(got)).await;
        }
        let mut leader = self.raft.metrics().borrow().current_leader;
        if leader.is_none() {
            // An election may be under way: give it a moment.
            let _ = Box::pin(
                self.raft
                    .wait(Some(Duration::from_secs(2)))
                    .metrics(|m| m.current_leader.is_some(), "a leader"),
            )
            .await;
            leader = self.raft.metrics().borrow().current_leader;
        }
        match leader {
            Some(l) if l == self.id => self.serve(req, send).await,
            // Invariant 12; the address resolved by the client that dials
            // it, which remembers the name its certificate must carry.
            Some(l) if !forwarded => {
                let peer = self.forwarder(&req);
                match Box::pin(self.leader_addr(l, peer)).await {
                    Some(addr) => Box::pin(self.forward(peer, addr, req, send)).await,
                    None => {
                        reply(
                            send,
                            error_response(&req, unavailable(format!("leader {l} has no address"))),
                        )
                        .await
                    }
                }
            }
            _ => {
                let why = if forwarded {
                    "this replica is no longer the leader"
                } else {
                    "no leader"
                };
                reply(send, error_response(&req, unavailable(why))).await
            }
        }
    }

    /// Where leader `l` listens, as its membership entry resolves now.
    /// Resolved by `via`, the client that dials it (a DNS name is dialed by
    /// the name it resolved from).
    async fn leader_addr(&self, l: u64, via: &PeerClient) -> Option<SocketAddr> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        let target = m.membership().get_node(&l).map(|n| n.addr.clone())?;
        via.resolve(&target).await.ok()
    }

    /// The client that forwards `req` (invariant 12).
    fn forwarder(&self, req: &ClientRequest) -> &PeerClient {
        if req.waits() {
            &self.waits
        } else {
            &self.client
        }
    }

    /// Relays a request to the leader at `addr`, over `peer`
    /// ([`Self::forwarder`]), and every answer frame back.
    async fn forward(
        &self,
        peer: &PeerClient,
        addr: SocketAddr,
        req: ClientRequest,
        send: &mut Answers<'_>,
    ) {
        let forwarded = WireRequest::Forwarded(req.clone());
        let opening = peer.open(addr, &forwarded);
        let (conn, mut up, mut down) = match tokio::time::timeout(FORWARD_OPEN, opening).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return reply(send, error_response(&req, unavailable(e.to_string()))).await
            }
            Err(_) => {
                let why = format!("no stream to the leader within {FORWARD_OPEN:?}");
                return reply(send, error_response(&req, unavailable(why))).await;
            }
        };
        let _ = up.finish();
        loop {
            match rpc::read_frame_from(&conn, &mut down, wire::MAX_FRAME).await {
                Ok(Some(body)) => {
                    if send.relay(body).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    return reply(send, error_response(&req, unavailable(e.to_string()))).await
                }
            }
        }
    }

    /// `renewals` invariant 1: a leader recently acknowledged by a
    /// majority, whose term's `RenewLeases` has committed.
    pub(super) fn may_renew_from_memory(&self) -> bool {
        let term = self.raft.metrics().borrow().current_term;
        self.quorum.fresh_term() == Some(term)
            && self.leases_renewed.load(Ordering::Acquire) == term
    }

    /// Serves a request on the leader.
    async fn serve(&self, req: ClientRequest, send: &mut Answers<'_>) {
        let req = match req {
            ClientRequest::Guarded { guard, request } => {
                match Box::pin(self.unguard(guard, *request)).await {
                    Ok(r) => r,
                    Err((r, e)) => return reply(send, error_response(&r, e)).await,
                }
            }
            req => req,
        };
        let response = match req {
            // `renewals` invariants 1 and 5: from memory where it may, once
            // the leadership is confirmed; written only where it may not.
            ClientRequest::Write(Op::LeaseKeepAlive { id })
                if self.leases_renewed.load(Ordering::Acquire)
                    == self.raft.metrics().borrow().current_term =>
            {
                WireResponse::Output(Box::pin(self.renew_one(id)).await)
            }
            ClientRequest::Write(op) => WireResponse::Output(Box::pin(self.write(op)).await),
            // A guarded serializable get is served as a linearizable one.
            ClientRequest::Get { key, timeout_ms }
            | ClientRequest::GetSerializable { key, timeout_ms } => {
                let r = match self.linearizable().await {
                    // A leader cut off from its majority may never see the
                    // key written: the client asks another replica.
                    Ok(()) => {
                        let wait = self.applied.get(&key, Duration::from_millis(timeout_ms));
                        Box::pin(self.quorum.unless_lost(wait)).await
                    }
                    Err(e) => Err(e),
                };
                WireResponse::Value(r)
            }
            ClientRequest::TryGet { key } => WireResponse::Value(
                self.linearizable()
                    .await
                    .and_then(|()| self.applied.try_get(&key)?.ok_or(KvError::NotFound(key))),
            ),
            ClientRequest::List { prefix } => WireResponse::List(
                self.linearizable()
                    .await
                    .and_then(|()| self.applied.list_at(&prefix).map(|l| l.pairs)),
            ),
            ClientRequest::ListAt { prefix } => WireResponse::Listing(
                self.linearizable()
                    .await
                    .and_then(|()| self.applied.list_at(&prefix)),
            ),
            ClientRequest::Revision => WireResponse::Revision(
                self.linearizable()
                    .await
                    .map(|()| self.applied.read(|s, _| s.revision())),
            ),
            ClientRequest::WaitBarrier { id, timeout_ms } => {
                let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
                let decided = Box::pin(self.applied.wait_for(deadline, |s, _| {
                    s.barrier(&id)
                        .filter(|b| !matches!(b, BarrierStatus::Waiting { .. }))
                        .cloned()
                }))
                .await;
                WireResponse::Output(Ok(Output::Barrier(decided.unwrap_or(
                    BarrierStatus::Waiting {
                        arrived: 0,
                        participants: 0,
                    },
                ))))
            }
            ClientRequest::Watch { prefix, from } => {
                if let Err(e) = self.linearizable().await {
                    return reply(send, WireResponse::Event(Err(e))).await;
                }
                let mut events = match self.applied.watch(&prefix, from) {
                    Ok(s) => s,
                    Err(e) => return reply(send, WireResponse::Event(Err(e))).await,
                };
                while let Some(e) = events.next().await {
                    let end = e.is_err();
                    if send.frame(WireResponse::Event(e)).await.is_err() || end {
                        return;
                    }
                }
                return;
            }
            ClientRequest::Status => WireResponse::Status(self.status()),
            ClientRequest::AddReplica { id, addr } => {
                WireResponse::Done(Box::pin(self.add_replica(id, addr)).await)
            }
            ClientRequest::RemoveReplica { id } => {
                WireResponse::Done(Box::pin(self.remove_replica(id)).await)
            }
            ClientRequest::Guarded { request, .. } => error_response(
                &request,
                KvError::InvalidArgument("a guard inside a guard".into()),
            ),
            ClientRequest::RenewMany { leases } => {
                WireResponse::Renewed(Box::pin(self.renew_many(&leases)).await)
            }
            ClientRequest::KeepAliveStream => WireResponse::Output(Err(KvError::InvalidArgument(
                "a keep-alive stream is neither relayed nor local (invariant 9)".into(),
            ))),
        };
        reply(send, response).await;
    }

    /// A write on the leader: validated before it can enter the log, then
    /// proposed. Boxed by its caller, as are the other rare or large arms
    /// of [`Self::serve`], so that a held blocking get or watch keeps a
    /// small future (each of the thousands waiting held 4.5 KB).
    async fn write(&self, op: Op) -> Result<Output, KvError> {
        self.applied.read(|s, _| s.limits().check_op(&op))?;
        renew_leases_once_per_term(&self.raft, &self.quorum, &self.leases_renewed, &self.leases)
            .await?;
        self.proposer
            .propose(Request {
                now_ms: self.leases.clock.now_ms(),
                op,
            })
            .await
    }
}

/// Waits until some replica of `replicas` reports itself leader.
pub async fn wait_for_leader(replicas: &[&Replica], timeout: Duration) -> Option<u64> {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        for r in replicas {
            let m = r.raft.metrics().borrow().clone();
            if m.state == ServerState::Leader {
                return Some(r.id);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
