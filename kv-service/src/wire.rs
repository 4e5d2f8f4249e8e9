//! The wire protocol of the key-value service, without I/O.
//!
//! Every request opens one bidirectional QUIC stream. Each direction
//! carries frames: a 4-byte big-endian length, then that many bytes of a
//! postcard-encoded message. A request stream carries one [`WireRequest`];
//! the response is one [`WireResponse`] frame, or for a watch a sequence of
//! them until either side closes.
//!
//! Invariants:
//! 1. A length above the receiver's maximum is refused before any
//!    allocation ([`frame_len`]); the stream is then reset with
//!    [`RESET_FRAME_TOO_LARGE`].
//! 2. Decoding never panics on any bytes ([`decode`]; fuzzed in `fuzz/`).
//!
//! # The key-value wire protocol
//!
//! * QUIC (quinn 0.11), ALPN `tessel-kv`, TLS 1.3 with rustls/ring, AES-128-GCM
//!   offered first (both protocols; cheaper per packet than ring's default
//!   AES-256 first). Every server requires a client certificate signed by the
//!   cluster CA and every client verifies servers against it (see Identity
//!   below); `--insecure` disables both (tests only). A client dials a
//!   replica with its IP as the server name. Every request is authorized by
//!   the identity in the connection's certificate before anything else
//!   (`authz`); a refusal answers `PermissionDenied`.
//! * One bidirectional stream per request over one pooled connection per peer.
//!   Each direction carries frames: `u32` big-endian length, then a postcard
//!   message. Maximum 16 MiB; a larger announced length is refused before
//!   reading (stream reset, code 1); an undecodable body resets with code 2.
//!   Either way only that stream ends.
//! * Request (`WireRequest`): `AppendEntries`, `Vote`, `InstallSnapshot`
//!   (Raft, between replicas); `Client(ClientRequest)` and
//!   `Forwarded(ClientRequest)` (a follower's relay; never relayed again).
//!   `ClientRequest`: `Write(Op)`, `Get{key, timeout_ms}`, `TryGet`, `List`,
//!   `ListAt` (the pairs and their revision, etcd's range), `Revision`,
//!   `Watch{prefix, from}`, `WaitBarrier`, `Status`, `AddReplica{id, addr}`,
//!   `RemoveReplica{id}`, `KeepAliveStream`, `RenewMany{leases}`,
//!   `GetSerializable{key, timeout_ms}` (answered by the replica asked,
//!   from its own state: never forwarded).
//! * Response (`WireResponse`): one frame, except `Watch`, which streams
//!   `Event` frames until either side closes. Errors travel as `KvError`;
//!   `Unavailable` means "try another replica".
//! * `KeepAliveStream` (etcd's `LeaseKeepAlive`) keeps its stream open: the
//!   client then sends [`KeepAliveFrame`]s (≤ [`KEEP_ALIVE_MAX_FRAME`]
//!   bytes) and the replica answers each with one `Output` frame, in order.
//!   A leader that may renew from memory answers from it; a follower
//!   relays the frames of all its streams to the leader as `RenewMany`
//!   batches (a request of replicas only, answered `Renewed`); anything
//!   else is `Unavailable`, and the client sends that keep-alive as a `Write`.
//! * Raft RPC deadlines: AppendEntries gets openraft's heartbeat interval
//!   (250 ms), elections start after 1–2 s of silence. Each log entry is a
//!   `Proposal` (the requests the leader grouped: ≤ 1024 of them, ≤ 1 MiB of
//!   keys and values unless one request alone is larger); an AppendEntries
//!   whose payload would pass half a frame answers openraft with
//!   `PayloadTooLarge` and a smaller entry count.
//! * QUIC transport: UDP socket buffers of 4 MiB asked for (`net::endpoint`;
//!   the kernel caps them at `rmem_max`/`wmem_max`), keep-alive every 500 ms, idle timeout 2 s (a killed peer
//!   sends no close), 1024 concurrent streams per connection (waiting gets
//!   and watches hold one each). A call waiting for its answer gives up once
//!   the peer has sent nothing for 1 s (`net::SILENCE`; a live peer answers
//!   the keep-alives), so a request to a killed replica moves on after
//!   1–1.25 s rather than the idle timeout; the connection is left to the
//!   idle timeout, so a slow but live peer loses only that call. A receiver
//!   takes the sender's end of stream when it came with the frame, so that
//!   dropping the stream sends no STOP_SENDING (a spurious frame per request).
//! * A replica runs its tasks on one runtime thread by default
//!   (`--worker-threads`): the Raft core, the state machine worker and the
//!   log's writer thread are serial (docs/performance.md).

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};

use crate::raft::TypeConfig;
use tessel_kv::state::{Event, Guard, KeyValue, Op, Output};
use tessel_kv::{KvError, Listing};

/// ALPN protocol of the key-value service.
pub const ALPN: &[u8] = b"tessel-kv";
/// Default maximum frame: a 4 MiB value plus headroom, and snapshot chunks.
pub const MAX_FRAME: usize = 16 << 20;
/// Stream reset code: the peer announced a frame above our maximum.
pub const RESET_FRAME_TOO_LARGE: u32 = 1;
/// Stream reset code: the request could not be decoded.
pub const RESET_MALFORMED: u32 = 2;
/// Stream reset code: the peer's certificate does not allow the request
/// (a Raft message from a non-coordinator).
pub const RESET_FORBIDDEN: u32 = 3;

/// Everything a stream can ask.
#[derive(Debug, Serialize, Deserialize)]
pub enum WireRequest {
    /// Raft log replication.
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// A Raft vote.
    Vote(VoteRequest<u64>),
    /// A chunk of a Raft snapshot.
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A key-value client's request.
    Client(ClientRequest),
    /// A client request relayed by a follower; never relayed again.
    Forwarded(ClientRequest),
}

/// Requests of key-value clients. Any replica accepts them; followers
/// forward them to the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClientRequest {
    /// A write, proposed through Raft.
    Write(Op),
    /// Blocking get.
    Get {
        /// The key.
        key: Vec<u8>,
        /// How long to wait for it.
        timeout_ms: u64,
    },
    /// Get without waiting.
    TryGet {
        /// The key.
        key: Vec<u8>,
    },
    /// The pairs under a prefix.
    List {
        /// The prefix.
        prefix: Vec<u8>,
    },
    /// The current revision.
    Revision,
    /// Events from `from` on; the response is a stream of frames.
    Watch {
        /// The prefix.
        prefix: Vec<u8>,
        /// The first revision wanted.
        from: u64,
    },
    /// Waits until barrier `id` is decided.
    WaitBarrier {
        /// The barrier.
        id: Vec<u8>,
        /// How long to wait.
        timeout_ms: u64,
    },
    /// This replica's view of the cluster (never forwarded).
    Status,
    /// Adds a replica: as a learner until it caught up, then as a voter.
    AddReplica {
        /// The new replica's id.
        id: u64,
        /// Its address (`host:port`).
        addr: String,
    },
    /// Removes a replica from the voters (its id is never reused).
    RemoveReplica {
        /// The replica's id.
        id: u64,
    },
    /// A read served only if `guard` holds once the read is linearizable
    /// (`crate::authz` invariant 4). Added by the replica that authorized
    /// the request; refused from anyone but a coordinator.
    Guarded {
        /// What must exist.
        guard: Guard,
        /// The read.
        request: Box<ClientRequest>,
    },
    /// Opens a lease keep-alive stream: [`KeepAliveFrame`]s follow on the
    /// same stream, each answered by one `Output` frame (module docs).
    /// Never forwarded as a stream: a follower relays its frames to the
    /// leader in [`ClientRequest::RenewMany`] batches.
    KeepAliveStream,
    /// Renews these leases from the leader's memory, answered by
    /// [`WireResponse::Renewed`]: a follower's batch of the keep-alives its
    /// streams carried (≤ [`RENEW_MANY_MAX`]). Only replicas may send it.
    RenewMany {
        /// The leases, in the order of the answers.
        leases: Vec<u64>,
    },
    /// A blocking get the replica asked answers from its own applied state
    /// (etcd's serializable read; `KvStore::get_serializable`), or
    /// `Unavailable` once it knows no leader.
    GetSerializable {
        /// The key.
        key: Vec<u8>,
        /// How long to wait for it.
        timeout_ms: u64,
    },
    /// The pairs under a prefix with the revision they were read at,
    /// answered by [`WireResponse::Listing`] (`List` answers the pairs
    /// alone, for clients before it).
    ListAt {
        /// The prefix.
        prefix: Vec<u8>,
    },
}

/// The most leases one [`ClientRequest::RenewMany`] carries.
pub const RENEW_MANY_MAX: usize = 4096;

/// One keep-alive on a [`ClientRequest::KeepAliveStream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepAliveFrame {
    /// The lease to renew.
    pub lease: u64,
}

/// The largest frame a keep-alive stream carries (a lease id is at most
/// 10 bytes in postcard); a larger one ends the stream (invariant 1).
pub const KEEP_ALIVE_MAX_FRAME: usize = 16;

impl ClientRequest {
    /// Whether it waits for something to happen (a blocking get, a
    /// barrier, a watch): its caller may give it up because it no longer
    /// needs it, which says nothing of the replica serving it.
    pub fn waits(&self) -> bool {
        match self {
            ClientRequest::Get { timeout_ms, .. }
            | ClientRequest::GetSerializable { timeout_ms, .. }
            | ClientRequest::WaitBarrier { timeout_ms, .. } => *timeout_ms > 0,
            ClientRequest::Watch { .. } => true,
            _ => false,
        }
    }
}

impl WireRequest {
    /// Whether frames of the asker follow the request on its stream (a
    /// keep-alive stream): its end is then not read with the request.
    pub fn continues(&self) -> bool {
        matches!(self, WireRequest::Client(ClientRequest::KeepAliveStream))
    }
}

/// One replica's view, for `tessel cluster status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// The replica's id.
    pub id: u64,
    /// Leader, Follower, Candidate or Learner.
    pub state: String,
    /// The leader it knows of.
    pub leader: Option<u64>,
    /// Its Raft term.
    pub term: u64,
    /// Voters (id, address).
    pub members: Vec<(u64, String)>,
    /// Learners (id, address).
    pub learners: Vec<(u64, String)>,
    /// The last index in its log.
    pub last_log_index: Option<u64>,
    /// The last index it applied.
    pub applied: Option<u64>,
    /// Last log index covered by this replica's latest snapshot.
    pub snapshot: Option<u64>,
    /// Log entries up to here were deleted (compacted into a snapshot).
    pub purged: Option<u64>,
    /// Its state machine's revision.
    pub revision: u64,
    /// Keys in its state machine.
    pub keys: u64,
}

/// Everything a stream can answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum WireResponse {
    /// Answers `AppendEntries`.
    AppendEntries(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    /// Answers `Vote`.
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    /// Answers `InstallSnapshot`.
    InstallSnapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    /// Answers a write.
    Output(Result<Output, KvError>),
    /// Answers a get.
    Value(#[serde(with = "value_bytes")] Result<Vec<u8>, KvError>),
    /// Answers a list.
    List(Result<Vec<KeyValue>, KvError>),
    /// Answers `Revision`.
    Revision(Result<u64, KvError>),
    /// One event of a watch.
    Event(Result<Event, KvError>),
    /// Answers `Status`.
    Status(ReplicaStatus),
    /// Answers requests with nothing to return.
    Done(Result<(), KvError>),
    /// Answers `RenewMany`: one result a lease, in its order.
    Renewed(Vec<Result<Output, KvError>>),
    /// Answers `ListAt`.
    Listing(Result<Listing, KvError>),
}

/// A get's answer with its bytes as one byte string. postcard writes the
/// same bytes as for `Result<Vec<u8>, _>` (a length, then the bytes), but
/// in one copy instead of a call per byte each way: every process of a job
/// reads its global topology, so the cost is paid N times.
mod value_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use tessel_kv::KvError;

    #[derive(Serialize)]
    enum Ref<'a> {
        Ok(#[serde(with = "serde_bytes")] &'a [u8]),
        Err(&'a KvError),
    }

    #[derive(Deserialize)]
    enum Owned {
        Ok(#[serde(with = "serde_bytes")] Vec<u8>),
        Err(KvError),
    }

    pub(super) fn serialize<S: Serializer>(
        v: &Result<Vec<u8>, KvError>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Ok(b) => Ref::Ok(b),
            Err(e) => Ref::Err(e),
        }
        .serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Result<Vec<u8>, KvError>, D::Error> {
        Ok(match Owned::deserialize(d)? {
            Owned::Ok(b) => Ok(b),
            Owned::Err(e) => Err(e),
        })
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A frame announced a length above the limit.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// The announced length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The bytes do not decode.
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// The length in a frame header, refused above `max` (invariant 1).
pub fn frame_len(header: [u8; 4], max: usize) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(len)
}

/// A whole frame: header and encoded message.
pub fn encode<T: Serialize>(msg: &T, max: usize) -> Result<Vec<u8>, FrameError> {
    // Sized first, so a large value is not copied each time the buffer
    // grows (a value is counted, not walked: it is serialized as bytes).
    let size = postcard::serialize_with_flavor(msg, postcard::ser_flavors::Size::default())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    let mut head = Vec::with_capacity(4 + size);
    head.extend_from_slice(&[0u8; 4]);
    let mut frame =
        postcard::to_extend(msg, head).map_err(|e| FrameError::Malformed(e.to_string()))?;
    let len = frame.len() - 4;
    if len > max || len > u32::MAX as usize {
        return Err(FrameError::TooLarge { len, max });
    }
    frame[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(frame)
}

/// Decodes a frame body (invariant 2).
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, FrameError> {
    postcard::from_bytes(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let req = WireRequest::Client(ClientRequest::Write(Op::Put {
            key: b"k\xff".to_vec(),
            value: vec![1, 2, 3],
            lease: Some(7),
        }));
        let frame = encode(&req, MAX_FRAME).unwrap();
        let len = frame_len(frame[..4].try_into().unwrap(), MAX_FRAME).unwrap();
        assert_eq!(len, frame.len() - 4);
        let back: WireRequest = decode(&frame[4..]).unwrap();
        assert_eq!(format!("{back:?}"), format!("{req:?}"));
    }

    #[test]
    fn oversized_frames_are_refused_both_ways() {
        assert_eq!(
            frame_len(u32::MAX.to_be_bytes(), MAX_FRAME),
            Err(FrameError::TooLarge {
                len: u32::MAX as usize,
                max: MAX_FRAME
            })
        );
        let big = WireResponse::Value(Ok(vec![0; 100]));
        assert!(matches!(encode(&big, 50), Err(FrameError::TooLarge { .. })));
    }

    /// A get's answer is laid out as `Result<Vec<u8>, KvError>` is, so
    /// replicas and clients of either build understand each other.
    #[test]
    fn a_value_is_encoded_as_a_plain_result_of_bytes() {
        #[derive(Serialize)]
        enum Plain {
            _A,
            _B,
            _C,
            _D,
            Value(Result<Vec<u8>, KvError>),
        }
        let bytes: Vec<u8> = (0..=255).collect();
        for (ours, plain) in [
            (
                WireResponse::Value(Ok(bytes.clone())),
                Plain::Value(Ok(bytes)),
            ),
            (
                WireResponse::Value(Err(KvError::NotFound(b"k".to_vec()))),
                Plain::Value(Err(KvError::NotFound(b"k".to_vec()))),
            ),
        ] {
            let a = postcard::to_allocvec(&ours).unwrap();
            assert_eq!(a, postcard::to_allocvec(&plain).unwrap());
            let back: WireResponse = postcard::from_bytes(&a).unwrap();
            assert_eq!(format!("{back:?}"), format!("{ours:?}"));
        }
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        for bytes in [&b""[..], b"\xff\xff\xff\xff\xff", b"\x03\x09", &[0x7f; 64]] {
            assert!(decode::<WireRequest>(bytes).is_err(), "{bytes:?}");
        }
    }
}
