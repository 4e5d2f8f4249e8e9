//! tessel runs multi-host ML jobs on PJRT, the plugin runtime of OpenXLA.
//!
//! This crate is tessel's public Rust API (the `tessel` command is the
//! `tessel-cli` crate in `cli/`, the benchmarks the `tessel-bench` crate;
//! `examples/rust-submit/` submits and follows a job from Rust end to end):
//! * jobs: [`job::JobSpec`] (what a user submits, validated at submit
//!   time), [`client`] (submitting and following jobs: the API behind
//!   `tessel submit`, `jobs`, `job`, `cancel`, `fetch`), [`plan`] (running a
//!   job's plan in one of its processes), [`layout`] and [`init`] (which
//!   block of each array a process holds, and its initial values),
//!   [`checkpoint`] (a job's arrays on disk, complete once recorded in
//!   the KV), [`report`] (step reports off the critical path), [`names`]
//!   (the one rule for names that become paths);
//! * one program on one host: [`mod@array`] (inline literals and `.npy`
//!   files) and [`program`] (its signature, sharding, compile and run);
//! * processes on this machine: the `tessel-harness` crate (`harness/`).
//!
//! The safe PJRT binding is re-exported as [`pjrt`]; the key-value service,
//! scheduler, workers, topology and transfers are the workspace's other
//! crates (`ARCHITECTURE.md`).
//!
//! One program on the CPU plugin (`./scripts/test` installs it):
//!
//! ```
//! use tessel::{array, program};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let plugin = tessel::pjrt::Plugin::load(tessel::pjrt::locate::resolve(Some("cpu"))?)?;
//! let program = b"func.func @main(%a: tensor<2x2xf32>, %b: tensor<2x2xf32>) -> tensor<2x2xf32> {
//!   %0 = stablehlo.dot %a, %b : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
//!   return %0 : tensor<2x2xf32>
//! }".to_vec();
//! let request = program::RunRequest {
//!     program,
//!     devices: None,
//!     partitions: None,
//!     args: vec![array::parse_literal("f32[2,2]=1,2,3,4")?, array::parse_literal("f32[2,2]=1,0,0,1")?],
//!     options: Vec::new(),
//! };
//! let outputs = program::run_program(&plugin, &request)?;
//! assert_eq!(outputs[0], array::parse_literal("f32[2,2]=1,2,3,4")?);
//! # Ok(()) }
//! ```
//!
//! # The modules in detail
//!
//! * **`tessel`** (`tessel/`). Pure, unit-tested logic; I/O at the edges.
//!   * `program` — `mlir` reads `@main`'s signature (types, sharding
//!     annotations, Shardy meshes, replica/partition counts); `sharding` turns
//!     GSPMD and Shardy annotations into a `Tiling` and splits and reassembles
//!     host arrays; `run` checks arguments against the signature, compiles
//!     (`CompiledProgram`), splits, executes and gathers; `global` (pure)
//!     orders the plugin's global devices into the job's device assignment
//!     (mesh order) for a `global = true` program and finds which partitions
//!     are this process's.
//!   * `job` — `JobSpec` (TOML) in `spec`, `validate(&dyn SpecFiles)` →
//!     `ValidatedJob` (mesh, signatures, process-local types, the files' bytes);
//!     `global` checks global programs (pieces per process, the plugins that
//!     cannot run one across processes, plugin option names: `num_nodes` and
//!     `node_id` are tessel's); `command` checks command jobs.
//!   * `layout` (pure) — `process_block(mesh, D, p, axis)`: the contiguous
//!     block of an axis a process's devices cover; `slice_dim`/`concat_dim`.
//!   * `init` (pure) — counter-based initializers generating one block.
//!   * `plan` — `JobBundle` (what travels to workers), `ProcessPlan` (compile,
//!     initialize, `run_step`: execute / all_reduce / all_gather / reshard,
//!     each array a `ProcessBlock`), `run_job_process` (restore, steps,
//!     reports, checkpoints, final arrays) and `PlanRunner`, the
//!     `tessel_worker::JobRunner` the `tessel worker` command installs.
//!     `resident` keeps each array where the last program left it (a `Slot`:
//!     on the host, or device buffers with their `Piece`s) and counts every
//!     host↔device byte (`Traffic`, `tessel_plan_host_device_bytes_total`);
//!     `execute` reuses buffers already placed as a program wants them,
//!     honours donation, and copies to the host only for collectives,
//!     reports, checkpoints and fetch. `suspend` follows a preemption notice
//!     (see Preemption).
//!   * `checkpoint` — `disk` (a job's folder on one host: blocks, digests,
//!     pruning, probe files), `record` (`CheckpointRecord`, pure retention and
//!     restore-source choice), `protocol` (`Checkpoints`: open, save, restore).
//!   * `client` — `Client` over any `KvStore`: submit, list, job, cancel,
//!     events (state changes + reports as a `Stream`), wait, fetch, results.
//!   * `names` — the one rule for names a worker turns into paths. `report` —
//!     step reports through a bounded background queue (dropped and counted
//!     when full).

pub use tessel_pjrt as pjrt;

pub mod array;
pub mod checkpoint;
pub mod client;
pub mod init;
pub mod job;
pub mod layout;
pub mod names;
pub mod plan;
pub mod program;
pub mod report;
