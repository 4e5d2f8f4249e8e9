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
//!   (the one rule for names that become paths), [`identity`] (a process's
//!   index and peers from Kubernetes' or Slurm's environment);
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

pub use tessel_pjrt as pjrt;

pub mod array;
pub mod checkpoint;
pub mod client;
pub mod identity;
pub mod init;
pub mod job;
pub mod layout;
pub mod names;
pub mod plan;
pub mod program;
pub mod report;
