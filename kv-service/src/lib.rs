//! tessel's replicated key-value service, and etcd instead of it: the two
//! backends of `tessel_kv::KvStore` a cluster runs on.
//!
//! * [`raft`]: replicas (openraft over a segment-file log and a redb state
//!   machine) and their client.
//! * [`rpc`], [`wire`]: the QUIC transport and its frames.
//! * [`authz`]: what each role (`tessel_tls::Identity`) may ask of a
//!   replica.
//! * `etcd::EtcdKv` (feature `etcd`): the same interface over etcd v3.
//!
//! # The modules in detail
//!
//! * **`tessel-kv-service`** (`kv-service/`).
//!   * `raft::storage` + `raft::wal` — openraft's `RaftLogStorage` over a
//!     log of segment files (see "The Raft log").
//!   * `raft::sm` — openraft's `RaftStateMachine` on `state.redb` (see "The
//!     state machine"); snapshots are files (see Formats).
//!   * `raft::node` — `Replica`: storage + openraft + QUIC server. Followers
//!     relay client requests once; `RaftKv` asks which replica leads and goes
//!     there directly. Reads: see "Reads". The leader proposes `Tick`s when
//!     leases or barriers fall due and `RenewLeases` before its first write of
//!     a term, and groups concurrent writes into one `Proposal` per log entry
//!     (group commit; one proposal in flight, the writes arriving meanwhile
//!     form the next; its requests shared, not copied, by openraft's clones).
//!   * `raft::client` — `RaftKv`, on an endpoint of its own or on a shared
//!     `ClientEndpoint` (one UDP socket for many clients in a process).
//!   * `net`, `wire` — the QUIC transport and frames (see the protocol below);
//!     `net::NamedPeer` is a replica by `HOST:PORT` (an address used as is; a
//!     name looked up again 5 s after its last lookup and after a failed call) (Raft links and `RaftKv` alike:
//!     a replica rescheduled under its name is found at its new address);
//!     `authz` — what each certificate's role may ask.
//!   * `etcd` (feature `etcd`) — `EtcdKv`: the same trait over etcd v3. Keys
//!     under `tessel/k/`; blocking get reads at revision R then watches from
//!     R + 1; increment and compare-and-swap are transactions on
//!     `mod_revision`/`value`; leases are etcd leases (whole seconds); barriers
//!     are keys under `tessel/b/{hex id}/` whose outcome a create-only
//!     transaction writes once, all on one etcd lease of the barrier's timeout
//!     plus its retention. `etcd::server` starts real `etcd` processes for
//!     tests and benchmarks.

pub mod authz;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod raft;
pub mod rpc;
pub mod wire;
