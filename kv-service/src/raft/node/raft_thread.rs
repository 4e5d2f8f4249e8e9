//! The Raft core on a thread of its own (node invariant 11).
//!
//! A replica's runtime serves its clients on one thread, first come first
//! served; openraft's core, its replication tasks and the connections
//! they send on ran there too. With 16,384 simulated workers' requests
//! ready at once, a replication task waited behind them past its 500 ms
//! deadline, both followers at once, and a follower that heard nothing
//! for its election timeout deposed a leader that was only busy. Here the
//! core and its network get their own thread, runtime and UDP socket, so
//! the operating system shares the CPU between consensus and client work
//! instead of queueing one behind the other.
//!
//! The core's socket is also where its peers' Raft messages arrive
//! (invariant 12): a follower's AppendEntries used to arrive at the
//! replica's listening socket and wait there behind the clients' requests
//! (the endpoint's driver, the connection's, the stream's task: each a
//! turn of a queue thousands long), past the leader's 500 ms deadline, and
//! the leader cut its batches to a dozen entries until leases expired.
//! A peer asks the replica's listening port where the core listens
//! (`WireRequest::RaftPort`) and sends there (`network`).
//!
//! What still runs on the replica's runtime: client requests, the
//! proposer (it hands batches to the core) and the relay of keep-alives.
//!
//! The price: a replica whose runtime is wedged (a bug, not load) keeps
//! its leadership while it serves nobody; before, its silence deposed it.
//! Nothing watches for that yet.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use openraft::Raft;
use quinn::{RecvStream, SendStream};

use super::local::Answers;
use super::network::Network;
use super::{error_response, reply, ReplicaError};
use crate::raft::sm::StateMachineStore;
use crate::raft::storage::{LogStore, LogSynced};
use crate::raft::TypeConfig;
use crate::rpc::{self, Handler, PeerClient, PeerInfo};
use crate::wire::{WireRequest, WireResponse, RESET_FORBIDDEN};
use tessel_kv::KvError;

/// What the Raft thread needs to start the core.
pub(super) struct CoreParts {
    pub(super) id: u64,
    pub(super) config: Arc<openraft::Config>,
    pub(super) log: LogStore,
    pub(super) sm: StateMachineStore,
    pub(super) log_synced: LogSynced,
    /// The address the replica listens on: the core's socket binds its IP
    /// with a port of its own.
    pub(super) listen: SocketAddr,
    /// How the core's connections present themselves (a coordinator's
    /// certificate) and whom they trust.
    pub(super) client_cfg: quinn::ClientConfig,
    /// How its socket serves the peers' Raft messages (invariant 12).
    pub(super) server_cfg: quinn::ServerConfig,
}

/// The running core: its handle, and the port its socket serves peers on.
pub(super) struct Core {
    pub(super) raft: Raft<TypeConfig>,
    pub(super) port: u16,
    /// Dropped with the replica: the core's server closes, and with its
    /// handles gone the core ends.
    pub(super) stop: tokio::sync::oneshot::Sender<()>,
}

/// Starts the core on a new thread; returns its handle once it is up.
/// The thread ends when the core does (shut down, stopped by a storage
/// error, or every handle dropped).
pub(super) async fn start(parts: CoreParts) -> Result<Core, ReplicaError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("raft-core-{}", parts.id))
        .spawn(move || run(parts, tx))
        .map_err(|e| ReplicaError::Raft(format!("starting the Raft thread: {e}")))?;
    rx.await
        .map_err(|_| ReplicaError::Raft("the Raft thread ended before the core started".into()))?
}

type Started = tokio::sync::oneshot::Sender<Result<Core, ReplicaError>>;

fn run(parts: CoreParts, started: Started) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = started.send(Err(ReplicaError::Raft(format!(
                "the Raft thread's runtime: {e}"
            ))));
            return;
        }
    };
    runtime.block_on(async move {
        let (raft, port, endpoint) = match core(parts).await {
            Ok(r) => r,
            Err(e) => {
                let _ = started.send(Err(e));
                return;
            }
        };
        let mut metrics = raft.metrics();
        let server = Arc::new(CoreServer {
            raft: raft.clone(),
            port,
        });
        let serving = tokio::spawn(rpc::serve(endpoint.clone(), server));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        if started.send(Ok(Core { raft, port, stop })).is_ok() {
            let ended = async { while metrics.changed().await.is_ok() {} };
            tokio::select! {
                _ = stopped => {}
                () = ended => {}
            }
        }
        // The server's handles go with its connections, so that a replica
        // dropped without a shutdown ends its core, and then this thread.
        serving.abort();
        endpoint.close(0u32.into(), b"the Raft core ended");
        while metrics.changed().await.is_ok() {}
    });
}

async fn core(parts: CoreParts) -> Result<(Raft<TypeConfig>, u16, quinn::Endpoint), ReplicaError> {
    let bind = SocketAddr::new(parts.listen.ip(), 0);
    let listen_err = |source| ReplicaError::Listen { addr: bind, source };
    let mut endpoint = rpc::endpoint(bind, Some(parts.server_cfg)).map_err(listen_err)?;
    endpoint.set_default_client_config(parts.client_cfg);
    let port = endpoint.local_addr().map_err(listen_err)?.port();
    let network = Network {
        client: PeerClient::new(endpoint.clone()),
        log_synced: parts.log_synced,
        max_entries: parts.config.max_payload_entries as usize,
    };
    let raft = Raft::new(parts.id, parts.config, network, parts.log, parts.sm)
        .await
        .map_err(|e| ReplicaError::Raft(e.to_string()))?;
    Ok((raft, port, endpoint))
}

/// What the core's socket answers (invariant 12): Raft's messages from
/// coordinators, and where it is; a client's request is sent back to the
/// replica's listening port with `Unavailable`.
struct CoreServer {
    raft: Raft<TypeConfig>,
    port: u16,
}

impl Handler for CoreServer {
    fn handle(
        self: Arc<Self>,
        req: WireRequest,
        mut send: SendStream,
        _recv: RecvStream,
        peer: PeerInfo,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(async move {
            if let Err(why) = crate::authz::authorize(&peer.identity, &req) {
                tracing::warn!(peer = %peer.addr, %why, "Raft message refused");
                let _ = send.reset(quinn::VarInt::from_u32(RESET_FORBIDDEN));
                return;
            }
            let answer = match req {
                WireRequest::RaftPort => WireResponse::RaftPort(self.port),
                WireRequest::Client(c) | WireRequest::Forwarded(c) => {
                    let why = "this is a replica's Raft port: ask its listening port";
                    error_response(&c, KvError::Unavailable(why.into()))
                }
                raft_message => match answer_raft(&self.raft, raft_message).await {
                    Some(answer) => answer,
                    None => return,
                },
            };
            reply(&mut Answers::Stream(&mut send), answer).await;
            let _ = send.finish();
        })
    }
}

/// Raft's own messages, answered by the core; `None` for any other
/// request.
pub(super) async fn answer_raft(raft: &Raft<TypeConfig>, req: WireRequest) -> Option<WireResponse> {
    Some(match req {
        WireRequest::AppendEntries(r) => WireResponse::AppendEntries(raft.append_entries(r).await),
        WireRequest::Vote(r) => WireResponse::Vote(raft.vote(r).await),
        WireRequest::InstallSnapshot(r) => {
            WireResponse::InstallSnapshot(raft.install_snapshot(r).await)
        }
        _ => return None,
    })
}
