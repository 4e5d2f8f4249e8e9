//! The job spec's types, its errors, and where its files come from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::validate::Validation;
use crate::program::mlir::{Signature, TensorType};

/// Built-in scalar inputs (`s32[]`): the step number, this process's index,
/// and the index of the shard a device holds along the first mesh axis.
pub const BUILTINS: [&str; 3] = ["$step", "$process", "$shard"];

/// A job as submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The job's name, unique among live jobs.
    pub name: String,
    /// How many processes (hosts) run it, one worker each.
    pub processes: u32,
    /// Devices each process uses.
    #[serde(default = "one")]
    pub devices_per_process: u32,
    /// The PJRT plugin's name, e.g. `cpu` or `cuda`.
    #[serde(default = "default_plugin")]
    pub plugin: String,
    /// Named axes, outermost first: `"data=4"`, `"data=2,model=2"`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mesh: String,
    /// Programs by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub programs: BTreeMap<String, ProgramSpec>,
    /// Arrays by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub arrays: BTreeMap<String, ArraySpec>,
    /// How many times the plan runs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub steps: u64,
    /// What one step does, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plan: Vec<PlanStep>,
    /// A command job instead of a plan: the program and its arguments,
    /// started `processes` times (`["python3", "train.py"]`), in the
    /// environment JAX and torchrun scripts expect ([`crate::job`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// A command job's processes per worker (each worker runs this many;
    /// it divides `processes`).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub processes_per_worker: u32,
    /// A command job's files, relative to the spec's folder: shipped with
    /// the job (within the bundle's limit) into each attempt's folder on
    /// every host, where the command runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<PathBuf>,
    /// Instead of `files`: an absolute folder that exists on every host
    /// (a shared file system, or the image), where the command runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
    /// Milliseconds between SIGTERM and SIGKILL when a command job's
    /// processes are stopped.
    #[serde(default = "default_grace", skip_serializing_if = "is_default_grace")]
    pub stop_grace_ms: u64,
    /// Scalars to report while it runs.
    #[serde(default)]
    pub report: Option<ReportSpec>,
    /// Where and how often to checkpoint.
    #[serde(default)]
    pub checkpoint: Option<CheckpointSpec>,
    /// How many times a failed attempt is restarted.
    #[serde(default)]
    pub max_restarts: u32,
    /// Create options of every process's plugin client, with the types the
    /// plugin checks (`memory_fraction = 0.8` is a float, `preallocate =
    /// false` a bool, `visible_devices = [0]` an integer list). They add
    /// to, and override, the worker's `--plugin-option`s.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugin_options: BTreeMap<String, PluginOption>,
    /// A command job's environment variables (tessel's own are added and
    /// cannot be set here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// `"on"` or `"off"`: whether the job's network transfers are
    /// encrypted; unset, as its workers run them (`--transfer-encryption`).
    /// `off` runs only on workers started with it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer_encryption: Option<tessel_transfer::Encryption>,
}

impl JobSpec {
    /// Whether it runs a command rather than a plan.
    pub fn is_command(&self) -> bool {
        !self.command.is_empty()
    }

    /// What the scheduler places: one per worker. A plan job's processes,
    /// or a command job's `processes / processes_per_worker`.
    pub fn placements(&self) -> u32 {
        if self.is_command() {
            self.processes / self.processes_per_worker.max(1)
        } else {
            self.processes
        }
    }

    /// Devices each placement needs.
    pub fn devices_per_placement(&self) -> u32 {
        if self.is_command() {
            // Saturating: a spec is bounded only once validated.
            self.devices_per_process
                .saturating_mul(self.processes_per_worker)
        } else {
            self.devices_per_process
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Ten seconds, torchrun's default too.
fn default_grace() -> u64 {
    10_000
}

fn is_default_grace(ms: &u64) -> bool {
    *ms == default_grace()
}

/// A plugin create option's value, typed as the plugin checks it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PluginOption {
    /// `true` or `false`.
    Bool(bool),
    /// A whole number (64 bits).
    Int(i64),
    /// A number with a point (sent as a 32-bit float).
    Float(f64),
    /// Text.
    Text(String),
    /// A list of whole numbers.
    Ints(Vec<i64>),
}

impl PluginOption {
    /// The PJRT named value.
    pub fn to_value(&self) -> tessel_pjrt::Value {
        use tessel_pjrt::Value;
        match self {
            PluginOption::Bool(b) => Value::Bool(*b),
            PluginOption::Int(i) => Value::Int64(*i),
            PluginOption::Float(f) => Value::Float(*f as f32),
            PluginOption::Text(t) => Value::String(t.clone()),
            PluginOption::Ints(v) => Value::Int64List(v.clone()),
        }
    }

    /// Parses `--plugin-option NAME=VALUE`'s value: `true`/`false`, an
    /// integer, a number with `.` or an exponent, `[1,2]`, else text
    /// (quote it, `"8"`, to send digits as text).
    pub fn parse(text: &str) -> Result<PluginOption, String> {
        let t = text.trim();
        if let Some(inner) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            return inner
                .split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
                .map(|x| {
                    x.parse::<i64>()
                        .map_err(|_| format!("`{x}` in `{t}` is not an integer"))
                })
                .collect::<Result<_, _>>()
                .map(PluginOption::Ints);
        }
        if let Some(q) = t.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
            return Ok(PluginOption::Text(q.to_owned()));
        }
        Ok(match t {
            "true" => PluginOption::Bool(true),
            "false" => PluginOption::Bool(false),
            _ if t.parse::<i64>().is_ok() => PluginOption::Int(t.parse().expect("checked")),
            _ if t.parse::<f64>().is_ok()
                && !t.eq_ignore_ascii_case("nan")
                && !t.to_ascii_lowercase().contains("inf") =>
            {
                PluginOption::Float(t.parse().expect("checked"))
            }
            _ => PluginOption::Text(t.to_owned()),
        })
    }
}

fn one() -> u32 {
    1
}

fn default_plugin() -> String {
    "cpu".into()
}

/// A StableHLO program and its compile options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramSpec {
    /// MLIR text, relative to the spec's folder.
    pub file: PathBuf,
    /// Copies of the program (data-parallel replicas).
    #[serde(default = "one")]
    pub replicas: u32,
    /// SPMD partitions over a process's devices (default: all of them).
    #[serde(default)]
    pub partitions: Option<u32>,
    /// One program over every device of every process (partitions = the
    /// job's devices, in mesh order), its collectives the plugin's own.
    /// Its signature takes the global arrays. CPU plugins run it only in a
    /// job of one process.
    #[serde(default)]
    pub global: bool,
}

/// A named array.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArraySpec {
    /// Element type: `f32`, `f64`, `s32`, ...
    pub dtype: String,
    /// The global shape.
    pub shape: Vec<i64>,
    /// How it is laid over the mesh.
    #[serde(default)]
    pub sharding: ShardingSpec,
    /// Its initial values.
    #[serde(default)]
    pub init: Init,
}

/// How an array is laid over the mesh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(try_from = "ShardingRepr", into = "ShardingRepr")]
pub enum ShardingSpec {
    /// `"replicated"`: every device holds all of it.
    #[default]
    Replicated,
    /// `{ split = "data", dim = 0 }`: dimension `dim` cut along `split`.
    Split {
        /// The mesh axis it is cut along.
        split: String,
        /// The dimension cut.
        dim: usize,
    },
}

/// `"replicated"` or `{ split, dim }` as written in TOML.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum ShardingRepr {
    Name(String),
    Split { split: String, dim: usize },
}

impl TryFrom<ShardingRepr> for ShardingSpec {
    type Error = String;
    fn try_from(r: ShardingRepr) -> Result<Self, String> {
        match r {
            ShardingRepr::Name(n) if n == "replicated" => Ok(ShardingSpec::Replicated),
            ShardingRepr::Name(n) => Err(format!(
                "unknown sharding `{n}` (\"replicated\" or {{ split = AXIS, dim = N }})"
            )),
            ShardingRepr::Split { split, dim } => Ok(ShardingSpec::Split { split, dim }),
        }
    }
}

impl From<ShardingSpec> for ShardingRepr {
    fn from(s: ShardingSpec) -> Self {
        match s {
            ShardingSpec::Replicated => ShardingRepr::Name("replicated".into()),
            ShardingSpec::Split { split, dim } => ShardingRepr::Split { split, dim },
        }
    }
}

impl ShardingSpec {
    pub(super) fn describe(&self) -> String {
        match self {
            ShardingSpec::Replicated => "replicated".into(),
            ShardingSpec::Split { split, dim } => format!("dimension {dim} split along {split}"),
        }
    }
}

/// Initial values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Init {
    /// All zeros.
    #[default]
    Zeros,
    /// Every element `value`.
    Constant {
        /// The value.
        value: f64,
    },
    /// Normally distributed, reproducible from `seed`.
    Normal {
        /// The mean.
        mean: f64,
        /// The standard deviation.
        std: f64,
        /// The seed.
        seed: u64,
    },
    /// Uniform in `[low, high)`, reproducible from `seed`.
    Uniform {
        /// The lower bound.
        low: f64,
        /// The upper bound.
        high: f64,
        /// The seed.
        seed: u64,
    },
    /// A `.npy` file of the global shape, split by the sharding.
    Npy {
        /// The file, relative to the spec's folder.
        file: PathBuf,
    },
}

/// One step of the plan, run `steps` times in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum PlanStep {
    /// Runs a program on its named inputs, binding its outputs.
    Execute {
        /// The program's name.
        program: String,
        /// The arrays (or builtins) passed in, in order.
        inputs: Vec<String>,
        /// The arrays its results become, in order.
        outputs: Vec<String>,
    },
    /// Reduces an array across processes (on every shard).
    AllReduce {
        /// The array.
        array: String,
        /// sum, mean, max, min.
        reduce: String,
    },
    /// Gathers a split array so every device holds all of it.
    AllGather {
        /// The array.
        array: String,
    },
    /// Lays an array out anew.
    Reshard {
        /// The array.
        array: String,
        /// The new layout.
        sharding: ShardingSpec,
    },
}

/// Scalars reported every `every` steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpec {
    /// The arrays reported (each must be a scalar).
    pub arrays: Vec<String>,
    /// Report every this many steps.
    pub every: u64,
}

/// Checkpoints every `every` steps into `dir` (absolute; it must lie
/// under a `--checkpoint-root` of every worker that runs the job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// The folder (absolute).
    pub dir: PathBuf,
    /// Checkpoint every this many steps (a plan's; a command job's
    /// processes get `dir` as `TESSEL_CHECKPOINT_DIR` and choose).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub every: u64,
}

/// One problem with a spec, at a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field, as a path (`arrays.w.shape`).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Why a spec was refused.
#[derive(Debug, thiserror::Error)]
pub enum JobSpecError {
    /// The file could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file is not valid TOML for a spec.
    #[error("{path}: {reason}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// The spec's fields break rules, every one listed.
    #[error("invalid job spec:\n  {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  "))]
    Invalid(Vec<FieldError>),
}

/// Where a spec's files (programs, `.npy` initializers) come from: a
/// folder on the submitter's disk, or the copies a job carries.
pub trait SpecFiles {
    /// The file at `path` (relative to the spec), or why it cannot be read.
    fn read(&self, path: &Path) -> Result<Vec<u8>, String>;
}

/// Files relative to a folder.
pub struct FolderFiles(pub PathBuf);

impl SpecFiles for FolderFiles {
    fn read(&self, path: &Path) -> Result<Vec<u8>, String> {
        let full = self.0.join(path);
        std::fs::read(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))
    }
}

impl SpecFiles for BTreeMap<PathBuf, Vec<u8>> {
    fn read(&self, path: &Path) -> Result<Vec<u8>, String> {
        self.get(path)
            .cloned()
            .ok_or_else(|| format!("{} is not among the job's files", path.display()))
    }
}

/// A spec that passed every check, with what the checks learned.
#[derive(Debug, Clone)]
pub struct ValidatedJob {
    /// The spec as parsed.
    pub spec: JobSpec,
    /// The spec's own text (TOML), as it travels to the workers.
    pub text: String,
    /// The contents of every file the spec names, by the path it names.
    pub files: BTreeMap<PathBuf, Vec<u8>>,
    /// The spec's folder (the files it names are relative to it); `.`
    /// when the spec did not come from a file.
    pub base: PathBuf,
    /// The mesh's axes (name, size), outermost first.
    pub mesh: Vec<(String, usize)>,
    /// Each program's `@main` signature.
    pub signatures: BTreeMap<String, Signature>,
    /// Each array's type as one process holds it.
    pub local_types: BTreeMap<String, TensorType>,
}

impl JobSpec {
    /// Parses a TOML spec (syntax and field names only).
    pub fn from_toml(text: &str, path: &Path) -> Result<JobSpec, JobSpecError> {
        toml::from_str(text).map_err(|e| JobSpecError::Syntax {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }

    /// Reads, parses and validates a spec file.
    pub fn load(path: &Path) -> Result<ValidatedJob, JobSpecError> {
        let text = std::fs::read_to_string(path).map_err(|e| JobSpecError::Read {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let spec = JobSpec::from_toml(&text, path)?;
        spec.validate_in(path.parent().unwrap_or(Path::new(".")))
    }

    /// Validates with the files of `folder`, which is also the job's base.
    pub fn validate_in(&self, folder: &Path) -> Result<ValidatedJob, JobSpecError> {
        let mut job = self.validate(&FolderFiles(folder.to_owned()))?;
        job.base = folder.to_owned();
        Ok(job)
    }

    /// Every check of the module docs, reading files from `files`.
    pub fn validate(&self, files: &dyn SpecFiles) -> Result<ValidatedJob, JobSpecError> {
        let mut v = Validation::default();
        v.check(self, files);
        if v.errors.is_empty() {
            Ok(ValidatedJob {
                spec: self.clone(),
                text: toml::to_string(self).expect("a spec always encodes"),
                files: v.files,
                base: PathBuf::from("."),
                mesh: v.mesh,
                signatures: v.signatures,
                local_types: v.local_types,
            })
        } else {
            Err(JobSpecError::Invalid(v.errors))
        }
    }
}
