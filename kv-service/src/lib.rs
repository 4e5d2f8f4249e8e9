//! tessel's replicated key-value service, and etcd instead of it: the two
//! backends of `tessel_kv::KvStore` a cluster runs on.
//!
//! * [`raft`]: replicas (openraft over a segment-file log and a redb state
//!   machine) and their client.
//! * [`rpc`], [`wire`]: the QUIC transport and its frames.
//! * [`authz`]: what each role (`tessel_tls::Identity`) may ask of a
//!   replica.
//! * `etcd::EtcdKv` (feature `etcd`): the same interface over etcd v3.

pub mod authz;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod raft;
pub mod rpc;
pub mod wire;
