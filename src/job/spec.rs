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
    pub name: String,
    pub processes: u32,
    #[serde(default = "one")]
    pub devices_per_process: u32,
    #[serde(default = "default_plugin")]
    pub plugin: String,
    /// Named axes, outermost first: `"data=4"`, `"data=2,model=2"`.
    pub mesh: String,
    pub programs: BTreeMap<String, ProgramSpec>,
    pub arrays: BTreeMap<String, ArraySpec>,
    pub steps: u64,
    pub plan: Vec<PlanStep>,
    #[serde(default)]
    pub report: Option<ReportSpec>,
    #[serde(default)]
    pub checkpoint: Option<CheckpointSpec>,
    #[serde(default)]
    pub max_restarts: u32,
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
    #[serde(default = "one")]
    pub replicas: u32,
    /// SPMD partitions over a process's devices (default: all of them).
    #[serde(default)]
    pub partitions: Option<u32>,
}

/// A named array.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArraySpec {
    pub dtype: String,
    /// The global shape.
    pub shape: Vec<i64>,
    #[serde(default)]
    pub sharding: ShardingSpec,
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
    Split { split: String, dim: usize },
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
    #[default]
    Zeros,
    Constant {
        value: f64,
    },
    Normal {
        mean: f64,
        std: f64,
        seed: u64,
    },
    Uniform {
        low: f64,
        high: f64,
        seed: u64,
    },
    /// A `.npy` file of the global shape, split by the sharding.
    Npy {
        file: PathBuf,
    },
}

/// One step of the plan, run `steps` times in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum PlanStep {
    Execute {
        program: String,
        inputs: Vec<String>,
        outputs: Vec<String>,
    },
    AllReduce {
        array: String,
        /// sum, mean, max, min.
        reduce: String,
    },
    AllGather {
        array: String,
    },
    Reshard {
        array: String,
        sharding: ShardingSpec,
    },
}

/// Scalars reported every `every` steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpec {
    pub arrays: Vec<String>,
    pub every: u64,
}

/// Checkpoints every `every` steps into `dir` (absolute; it must lie
/// under a `--checkpoint-root` of every worker that runs the job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    pub dir: PathBuf,
    pub every: u64,
}

/// One problem with a spec, at a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
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
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Syntax { path: PathBuf, reason: String },
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
    pub spec: JobSpec,
    /// The spec's own text (TOML), as it travels to the workers.
    pub text: String,
    /// The contents of every file the spec names, by the path it names.
    pub files: BTreeMap<PathBuf, Vec<u8>>,
    /// The spec's folder (the files it names are relative to it); `.`
    /// when the spec did not come from a file.
    pub base: PathBuf,
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
