//! openraft's network over the replicas' QUIC connections: AppendEntries,
//! votes and snapshots, each with its deadline.
//!
//! Invariants:
//! 1. An AppendEntries carries at most [`EntriesCap`] entries for its
//!    follower: halved after one that got no answer within openraft's
//!    deadline (the heartbeat interval), grown by a quarter after one at
//!    the cap that was answered. openraft sends the same range again after
//!    a timeout, so a follower that cannot take it within the deadline (its
//!    disk slow, its CPU shared) otherwise never catches up: with 16,384
//!    workers writing, followers got 300 entries a second, each time too
//!    many, and the leader's writes stopped committing.

use super::*;

/// openraft's view of the network: RPCs over [`PeerClient`].
#[derive(Clone)]
pub(super) struct Network {
    pub(super) client: PeerClient,
    /// Bounds the commit index sent to followers (storage invariant 5b).
    pub(super) log_synced: storage::LogSynced,
    /// The most entries openraft sends at once (`max_payload_entries`):
    /// where [`EntriesCap`] starts and stops growing.
    pub(super) max_entries: usize,
}

pub(super) struct PeerLink {
    /// Invariant 1.
    pub(super) cap: EntriesCap,
    /// Entries of the AppendEntries under way: still set at the next one
    /// when openraft dropped it at its deadline.
    pub(super) in_flight: Option<usize>,
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
            cap: EntriesCap::new(self.max_entries),
            in_flight: None,
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
        if let Some(sent) = self.in_flight.take() {
            self.cap.timed_out(sent);
        }
        // Entries that would not fit one frame, or more than this follower
        // took in time: ask openraft for fewer.
        let fits = entries_within(&rpc.entries, crate::wire::MAX_FRAME / 2).min(self.cap.get());
        if fits < rpc.entries.len() {
            return Err(RPCError::PayloadTooLarge(
                openraft::error::PayloadTooLarge::new_entries_hint(fits.max(1) as u64),
            ));
        }
        let sent = rpc.entries.len();
        self.in_flight = Some(sent);
        let answer = self.rpc(WireRequest::AppendEntries(rpc), &option).await;
        self.in_flight = None;
        match &answer {
            Ok(_) => self.cap.answered(sent),
            Err(RPCError::Unreachable(_)) => self.cap.timed_out(sent),
            Err(_) => {}
        }
        match answer? {
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

/// How many entries a follower's next AppendEntries may carry
/// (invariant 1), pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct EntriesCap {
    cap: usize,
    max: usize,
}

impl EntriesCap {
    /// No cap below `max` (openraft's own) until a timeout.
    pub(super) fn new(max: usize) -> EntriesCap {
        EntriesCap { cap: max, max }
    }

    pub(super) fn get(&self) -> usize {
        self.cap
    }

    /// `sent` entries got no answer in time.
    pub(super) fn timed_out(&mut self, sent: usize) {
        if sent > 0 {
            self.cap = self.cap.min(sent / 2).max(1);
        }
    }

    /// `sent` entries were answered in time.
    pub(super) fn answered(&mut self, sent: usize) {
        if sent >= self.cap {
            self.cap = (self.cap + self.cap / 4 + 1).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::EntriesCap;

    /// Invariant 1: halved by each timeout of a batch at the cap, never
    /// below one; grown only by answered batches that used it; heartbeats
    /// (no entries) change nothing.
    #[test]
    fn a_follower_that_times_out_gets_smaller_batches_until_it_keeps_up() {
        let mut cap = EntriesCap::new(300);
        cap.timed_out(300);
        assert_eq!(cap.get(), 150);
        cap.timed_out(0);
        cap.answered(0);
        assert_eq!(cap.get(), 150);
        cap.timed_out(150);
        cap.timed_out(75);
        assert_eq!(cap.get(), 37);
        // A smaller batch answered says nothing about the cap.
        cap.answered(10);
        assert_eq!(cap.get(), 37);
        cap.answered(37);
        assert_eq!(cap.get(), 47);
        for _ in 0..5 {
            cap.timed_out(cap.get());
        }
        assert_eq!(cap.get(), 1);
        cap.timed_out(1);
        assert_eq!(cap.get(), 1);
        cap.answered(1);
        assert_eq!(cap.get(), 2);
        for _ in 0..40 {
            cap.answered(cap.get());
        }
        assert_eq!(cap.get(), 300);
    }
}
