//! openraft's network over the replicas' QUIC connections: AppendEntries,
//! votes and snapshots, each with its deadline.

use super::*;

/// openraft's view of the network: RPCs over [`PeerClient`].
#[derive(Clone)]
pub(super) struct Network {
    pub(super) client: PeerClient,
    /// Bounds the commit index sent to followers (storage invariant 5b).
    pub(super) log_synced: storage::LogSynced,
}

pub(super) struct PeerLink {
    pub(super) client: PeerClient,
    pub(super) target: u64,
    /// The peer's `HOST:PORT` as in the membership, looked up again after
    /// a while or a failed call (a rescheduled pod keeps its name, not its
    /// IP).
    pub(super) peer: NamedPeer,
    pub(super) log_synced: storage::LogSynced,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerLink;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerLink {
        PeerLink {
            client: self.client.clone(),
            log_synced: self.log_synced.clone(),
            target,
            peer: NamedPeer::new(node.addr.clone()),
        }
    }
}

/// A transport error as openraft wants it: unreachable peers back off.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct LinkError(String);

impl PeerLink {
    pub(super) async fn rpc<E>(
        &self,
        req: WireRequest,
        option: &RPCOption,
    ) -> Result<WireResponse, RPCError<u64, BasicNode, E>>
    where
        E: std::error::Error,
    {
        let result = self.peer.call(&self.client, &req, option.hard_ttl()).await;
        result.map_err(|e| match e {
            NetError::Resolve { .. } | NetError::Connect { .. } | NetError::Timeout { .. } => {
                RPCError::Unreachable(Unreachable::new(&e))
            }
            other => RPCError::Network(NetworkError::new(&other)),
        })
    }

    pub(super) fn unexpected<E: std::error::Error>(r: WireResponse) -> RPCError<u64, BasicNode, E> {
        RPCError::Network(NetworkError::new(&LinkError(format!(
            "unexpected answer {r:?}"
        ))))
    }
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        // Storage invariant 5b: followers apply only what is on this disk.
        rpc.leader_commit = self.log_synced.bound(rpc.leader_commit);
        // Entries that would not fit one frame: ask openraft for fewer.
        let fits = entries_within(&rpc.entries, crate::wire::MAX_FRAME / 2);
        if fits < rpc.entries.len() {
            return Err(RPCError::PayloadTooLarge(
                openraft::error::PayloadTooLarge::new_entries_hint(fits.max(1) as u64),
            ));
        }
        match self.rpc(WireRequest::AppendEntries(rpc), &option).await? {
            WireResponse::AppendEntries(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            other => Err(Self::unexpected(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        match self.rpc(WireRequest::InstallSnapshot(rpc), &option).await? {
            WireResponse::InstallSnapshot(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            other => Err(Self::unexpected(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        match self.rpc(WireRequest::Vote(rpc), &option).await? {
            WireResponse::Vote(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            other => Err(Self::unexpected(other)),
        }
    }
}

/// How many leading entries carry at most `budget` payload bytes (at least
/// one: a single entry always goes, the frame limit refuses it if needed).
pub(super) fn entries_within(entries: &[openraft::Entry<TypeConfig>], budget: usize) -> usize {
    let mut used = 0;
    for (i, e) in entries.iter().enumerate() {
        if let openraft::EntryPayload::Normal(p) = &e.payload {
            used += p.payload_bytes();
        }
        if used > budget && i > 0 {
            return i;
        }
    }
    entries.len()
}
