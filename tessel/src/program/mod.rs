//! One StableHLO program on one host: its `@main` signature ([`mlir`]),
//! how its arguments split over partitions ([`sharding`]), and compiling
//! and running it ([`run_program`], [`CompiledProgram`]) — what `tessel
//! run` does, and what a job's `execute` step runs.

pub mod global;
pub mod mlir;
mod run;
pub mod sharding;

pub use run::{
    client_with_devices, plugin_devices, run_program, CompiledProgram, ProgramSource, RunError,
    RunRequest,
};
