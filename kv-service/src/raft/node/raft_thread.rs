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
//! What still runs on the replica's runtime: the server (a follower's
//! AppendEntries arrive at the replica's one listening socket and are
//! handed to the core from there), client requests, the proposer (it
//! hands batches to the core) and the relay of keep-alives.
//!
//! The price: a replica whose runtime is wedged (a bug, not load) keeps
//! its leadership while it serves nobody; before, its silence deposed it.
//! Nothing watches for that yet.

use std::net::SocketAddr;
use std::sync::Arc;

use openraft::Raft;

use super::network::Network;
use super::ReplicaError;
use crate::raft::sm::StateMachineStore;
use crate::raft::storage::{LogStore, LogSynced};
use crate::raft::TypeConfig;
use crate::rpc::{self, PeerClient};

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
}

/// Starts the core on a new thread; returns its handle once it is up.
/// The thread ends when the core does (shut down, stopped by a storage
/// error, or every handle dropped).
pub(super) async fn start(parts: CoreParts) -> Result<Raft<TypeConfig>, ReplicaError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("raft-core-{}", parts.id))
        .spawn(move || run(parts, tx))
        .map_err(|e| ReplicaError::Raft(format!("starting the Raft thread: {e}")))?;
    rx.await
        .map_err(|_| ReplicaError::Raft("the Raft thread ended before the core started".into()))?
}

type Started = tokio::sync::oneshot::Sender<Result<Raft<TypeConfig>, ReplicaError>>;

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
        let raft = match core(parts).await {
            Ok(r) => r,
            Err(e) => {
                let _ = started.send(Err(e));
                return;
            }
        };
        // Only the metrics are held here, never a handle: a replica
        // dropped without a shutdown ends its core, and then this thread.
        let mut metrics = raft.metrics();
        if started.send(Ok(raft)).is_err() {
            return;
        }
        while metrics.changed().await.is_ok() {}
    });
}

async fn core(parts: CoreParts) -> Result<Raft<TypeConfig>, ReplicaError> {
    let bind = SocketAddr::new(parts.listen.ip(), 0);
    let mut endpoint =
        rpc::endpoint(bind, None).map_err(|source| ReplicaError::Listen { addr: bind, source })?;
    endpoint.set_default_client_config(parts.client_cfg);
    let network = Network {
        client: PeerClient::new(endpoint),
        log_synced: parts.log_synced,
        max_entries: parts.config.max_payload_entries as usize,
    };
    Raft::new(parts.id, parts.config, network, parts.log, parts.sm)
        .await
        .map_err(|e| ReplicaError::Raft(e.to_string()))
}
