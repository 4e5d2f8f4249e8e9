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
//! 2. Raft's messages go to the peer's core ([`CoreRoute`]): its port is
//!    asked of the peer's listening port (`RaftPort`) and kept while calls
//!    to it work. A connection that fails after calls succeeded has the
//!    port asked again (the peer restarted, on a new port); a port that
//!    was never reached, or a peer that has none (an older version), sends
//!    to the listening port, where the replica answers Raft too, and the
//!    port is asked again after [`ASK_AGAIN`].

use std::time::Instant;

use super::*;

/// How long Raft's messages go to a peer's listening port before its core's
/// port is asked for again (invariant 2).
pub(super) const ASK_AGAIN: Duration = Duration::from_secs(30);

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
    /// Invariant 2.
    pub(super) route: CoreRoute,
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
            route: CoreRoute::Unknown,
        }
    }
}

/// A transport error as openraft wants it: unreachable peers back off.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct LinkError(String);

impl PeerLink {
    pub(super) async fn rpc<E>(
        &mut self,
        req: WireRequest,
        option: &RPCOption,
    ) -> Result<WireResponse, RPCError<u64, BasicNode, E>>
    where
        E: std::error::Error,
    {
        let ttl = option.hard_ttl();
        let result = tokio::time::timeout(ttl, self.send(&req, ttl)).await;
        let result = match result {
            Ok(r) => r,
            Err(_) => Err(NetError::Timeout {
                addr: self.peer.last().unwrap_or(([0, 0, 0, 0], 0).into()),
                after: ttl,
            }),
        };
        if result.is_err() {
            self.peer.forget();
        }
        result.map_err(|e| match e {
            NetError::Resolve { .. } | NetError::Connect { .. } | NetError::Timeout { .. } => {
                RPCError::Unreachable(Unreachable::new(&e))
            }
            other => RPCError::Network(NetworkError::new(&other)),
        })
    }

    /// `req` to the peer's core, its port asked for first when not known
    /// (invariant 2).
    async fn send(&mut self, req: &WireRequest, ttl: Duration) -> Result<WireResponse, NetError> {
        let listening = self.peer.addr(&self.client).await?;
        let to = match self.route.target(listening, Instant::now()) {
            Some(to) => to,
            None => {
                let asked = self.client.call(listening, &WireRequest::RaftPort, ttl);
                let port = match asked.await {
                    Ok(WireResponse::RaftPort(port)) => Some(port),
                    // No such request: a replica of an older version.
                    Ok(_) | Err(NetError::Stream { .. } | NetError::Frame(_)) => None,
                    Err(e) => return Err(e),
                };
                let to = self.route.found(listening, port, Instant::now());
                self.client.same_host(to, listening);
                to
            }
        };
        let result = self.client.call(to, req, ttl).await;
        match &result {
            Ok(_) => self.route.answered(),
            Err(NetError::Connect { .. }) => self.route.unreachable(Instant::now()),
            Err(NetError::Stream { .. }) => self.route.broken(),
            Err(_) => {}
        }
        result
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

/// Where a peer's Raft messages go (invariant 2), pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CoreRoute {
    /// Ask the peer's listening port.
    Unknown,
    /// The core's address, found through the listening address `via`;
    /// `proven` once a call to it was answered.
    Core {
        via: SocketAddr,
        at: SocketAddr,
        proven: bool,
    },
    /// The listening address itself, since `since`.
    Listening { via: SocketAddr, since: Instant },
}

impl CoreRoute {
    /// Where to send now, or `None` to ask first. A peer found at a new
    /// listening address (a rescheduled pod) is asked again.
    pub(super) fn target(&self, listening: SocketAddr, now: Instant) -> Option<SocketAddr> {
        match *self {
            CoreRoute::Core { via, at, .. } if via == listening => Some(at),
            CoreRoute::Listening { via, since }
                if via == listening && now.duration_since(since) < ASK_AGAIN =>
            {
                Some(via)
            }
            _ => None,
        }
    }

    /// The answer to the question: the core's port, or none (older
    /// peers). Returns where to send.
    pub(super) fn found(&mut self, via: SocketAddr, port: Option<u16>, now: Instant) -> SocketAddr {
        *self = match port {
            Some(port) => CoreRoute::Core {
                via,
                at: SocketAddr::new(via.ip(), port),
                proven: false,
            },
            None => CoreRoute::Listening { via, since: now },
        };
        self.target(via, now).unwrap_or(via)
    }

    /// A call was answered.
    pub(super) fn answered(&mut self) {
        if let CoreRoute::Core { proven, .. } = self {
            *proven = true;
        }
    }

    /// No connection could be made: a core that answered before moved (ask
    /// again); one never reached is not reachable from here (use the
    /// listening port).
    pub(super) fn unreachable(&mut self, now: Instant) {
        if let CoreRoute::Core { via, proven, .. } = *self {
            *self = if proven {
                CoreRoute::Unknown
            } else {
                CoreRoute::Listening { via, since: now }
            };
        }
    }

    /// The connection broke (closed, or the peer fell silent): ask again.
    pub(super) fn broken(&mut self) {
        if matches!(self, CoreRoute::Core { .. }) {
            *self = CoreRoute::Unknown;
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
    use super::{CoreRoute, EntriesCap, ASK_AGAIN};
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    /// Invariant 2: the core's port once asked, kept while it answers and
    /// across timeouts; asked again after a proven core's connection fails,
    /// or when the peer's address changes.
    #[test]
    fn raft_messages_go_to_the_core_port_asked_for_and_kept_while_it_answers() {
        let via: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let core: SocketAddr = "10.0.0.2:41000".parse().unwrap();
        let now = Instant::now();
        let mut route = CoreRoute::Unknown;
        assert_eq!(route.target(via, now), None);
        assert_eq!(route.found(via, Some(41000), now), core);
        route.answered();
        assert_eq!(route.target(via, now + ASK_AGAIN * 10), Some(core));
        // Rescheduled at a new address: ask there.
        assert_eq!(route.target("10.0.0.9:7000".parse().unwrap(), now), None);
        // Restarted on a new port: the old one refuses connections.
        route.unreachable(now);
        assert_eq!(route, CoreRoute::Unknown);
        route.found(via, Some(41001), now);
        route.answered();
        route.broken();
        assert_eq!(route.target(via, now), None);
    }

    /// Invariant 2: a core port never reached (a NAT, a Service exposing
    /// one port) or never offered (an older peer) falls back to the
    /// listening port, asked again after `ASK_AGAIN`.
    #[test]
    fn a_core_port_that_cannot_be_reached_falls_back_to_the_listening_port() {
        let via: SocketAddr = "10.0.0.2:7000".parse().unwrap();
        let now = Instant::now();
        let mut route = CoreRoute::Unknown;
        route.found(via, Some(41000), now);
        route.unreachable(now);
        assert_eq!(route.target(via, now + Duration::from_secs(1)), Some(via));
        assert_eq!(route.target(via, now + ASK_AGAIN), None);
        // Errors on the listening port change nothing here.
        route.unreachable(now);
        route.broken();
        assert_eq!(route.target(via, now), Some(via));
        let mut older = CoreRoute::Unknown;
        assert_eq!(older.found(via, None, now), via);
        assert_eq!(older.target(via, now + ASK_AGAIN / 2), Some(via));
    }

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
