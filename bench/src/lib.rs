//! tessel's benchmarks, run by `tessel-bench kv|bootstrap|heartbeat|steady|transfer|job|launch`,
//! each side by side with its peer in one run (etcd, JAX over gloo, plain
//! TCP), printing JSON lines; and their helpers.
//!
//! * [`kv`], [`bootstrap`], [`heartbeat`], [`steady`], [`transfer`], [`job`],
//!   [`launch`]: the benchmarks.
//! * [`rank_group`] and [`transfer_rank`]: processes of the hidden
//!   `tessel-bench transfer-rank` command driven over stdin/stdout (also
//!   used by the process-level collective tests).
//! * [`tessel_bin`]: the `tessel` binary the benchmarks start coordinators
//!   and workers from.
//! * [`tcp_ring`]: the ring all-reduce over plain TCP, the transfer
//!   benchmark's floor.
//! * [`jax`]: the JAX peers (`bench/jax/*.py`).
//!
//! # The modules in detail
//!
//! * **`tessel-bench`** (`bench/`) — the `tessel-bench` binary (its own, so
//!   the shipped `tessel` does not link the benchmarks; it starts the `tessel`
//!   beside it, or `$TESSEL_BIN`) and `transfer-rank`: a group of rank processes driven over stdin/stdout
//!   (JSON lines; each answer carries the wall and CPU milliseconds of every
//!   call), used by `tessel-bench transfer` and `chaos-tests/tests/collectives.rs`;
//!   `tcp_ring` is the benchmark's floor: the same ring all-reduce over plain
//!   TCP (each rank tells rank r−1 its port over the transfer endpoint on tag
//!   `u64::MAX`, outside every collective's tags), bit for bit the ring's result.

/// The `tessel` binary: `$TESSEL_BIN`, else the one beside this program
/// (`cargo build --bin tessel --bin tessel-bench` puts both in one folder).
pub fn tessel_bin() -> anyhow::Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("TESSEL_BIN") {
        return Ok(p.into());
    }
    let bin = std::env::current_exe()?.with_file_name("tessel");
    anyhow::ensure!(
        bin.is_file(),
        "{} is missing: build it with `cargo build --bin tessel`, or set TESSEL_BIN",
        bin.display()
    );
    Ok(bin)
}

mod beats;
pub mod bootstrap;
mod bootstrap_loss;
pub mod dial;
pub mod heartbeat;
pub mod jax;
pub mod job;
pub mod kv;
pub mod launch;
pub mod rank_group;
mod sim_host;
mod simulated;
pub mod steady;
pub mod tcp_ring;
mod threads;
pub mod transfer;
pub mod transfer_rank;
