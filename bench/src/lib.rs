//! tessel's benchmarks, run by `tessel bench kv|bootstrap|transfer|job|launch`,
//! each side by side with its peer in one run (etcd, JAX over gloo, plain
//! TCP), printing JSON lines; and their helpers.
//!
//! * [`kv`], [`bootstrap`], [`transfer`], [`job`], [`launch`]: the benchmarks.
//! * [`rank_group`] and [`transfer_rank`]: processes of the hidden `tessel
//!   transfer-rank` command driven over stdin/stdout (also used by the
//!   process-level collective tests).
//! * [`tcp_ring`]: the ring all-reduce over plain TCP, the transfer
//!   benchmark's floor.
//! * [`jax`]: the JAX peers (`bench/jax/*.py`).

pub mod bootstrap;
pub mod jax;
pub mod job;
pub mod kv;
pub mod launch;
pub mod rank_group;
pub mod tcp_ring;
pub mod transfer;
pub mod transfer_rank;
