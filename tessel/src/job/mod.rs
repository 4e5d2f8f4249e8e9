//! `JobSpec`: what a user submits (a TOML file for the CLI, this struct for
//! the API), and its validation at submit time.
//!
//! ```toml
//! name = "mlp"
//! processes = 4
//! devices_per_process = 1
//! plugin = "cpu"
//! mesh = "data=4"
//! steps = 100
//! max_restarts = 2
//!
//! [programs.train_step]
//! file = "train_step.mlir"        # relative to the spec's folder
//!
//! [arrays.w]
//! dtype = "f32"
//! shape = [8, 4]
//! init = { kind = "normal", mean = 0.0, std = 0.1, seed = 1 }
//!
//! [arrays.x]
//! dtype = "f32"
//! shape = [256, 8]
//! sharding = { split = "data", dim = 0 }
//! init = { kind = "npy", file = "x.npy" }
//!
//! [[plan]]
//! op = "execute"
//! program = "train_step"
//! inputs = ["w", "x", "$step"]
//! outputs = ["grad", "loss"]
//!
//! [[plan]]
//! op = "all_reduce"
//! array = "grad"
//! reduce = "mean"
//!
//! [report]
//! arrays = ["loss"]
//! every = 10
//!
//! [checkpoint]
//! dir = "/var/lib/tessel/checkpoints/mlp"   # absolute, under every worker's --checkpoint-root
//! every = 50
//! ```
//!
//! Invariants of a [`ValidatedJob`]:
//! 1. Every name it uses (program, array, mesh axis, built-in) resolves,
//!    and every file it names exists (and programs parse).
//! 2. The mesh covers exactly `processes × devices_per_process` devices and
//!    every split dimension divides evenly over its axis.
//! 3. Every `execute` step's inputs and outputs have the program's types as
//!    laid out at that point of the plan (the plan is followed twice, since a
//!    step starts with the layouts the previous one left).
//! 4. Errors name the field (`plan[1].inputs[2]`, `arrays.w.shape`) and
//!    all of them are reported at once.
//! 5. Every name a worker may turn into a path follows [`crate::names`]; the
//!    checkpoint folder is absolute. Spec files travel in the bundle.
//! 6. A global program takes and returns global arrays; the pieces its
//!    shardings give a process's devices lie in (results: cover) that
//!    process's block, and a CPU plugin runs it only with one process.
//! 7. A command job (`command = [...]`) has no plan fields; its processes
//!    divide over workers evenly, its files are plain relative paths that
//!    travel in the bundle, and its `env` sets none of tessel's variables.
//! 8. Counts are bounded before they are multiplied: at most
//!    [`tessel_topology::MAX_DEVICES`] devices in all, mesh axes as
//!    [`tessel_topology::Mesh::check_axes`] says, at most 1 TiB per array;
//!    no size wraps and none is zero where it divides.
//!
//! A command job runs an existing script as the job's processes:
//!
//! ```toml
//! name = "train"
//! processes = 4
//! processes_per_worker = 1
//! command = ["python3", "train.py", "--steps", "500"]
//! files = ["train.py"]          # shipped; or workdir = "/srv/project" on every host
//! max_restarts = 3
//! [env]
//! XLA_FLAGS = "--xla_force_host_platform_device_count=1"
//! [checkpoint]
//! dir = "/var/lib/tessel/checkpoints/train"   # TESSEL_CHECKPOINT_DIR
//! ```

mod command;
mod global;
mod spec;
mod validate;

pub use command::SET_BY_TESSEL;
pub use global::{check_plugin_option_name, single_process_refusal, SINGLE_PROCESS_PLUGINS};
pub use spec::*;
