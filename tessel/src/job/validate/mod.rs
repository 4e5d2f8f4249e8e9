//! Every check of a spec (the module invariants of [`crate::job`]), all
//! errors reported at once.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tessel_pjrt::ElementType;

use super::spec::*;
use crate::array::{checked_size, MAX_JOB_ARRAY_BYTES};
use crate::program::mlir::{parse_signature, Signature, TensorType};
use tessel_topology::MAX_DEVICES;

#[derive(Default)]
pub(super) struct Validation {
    pub(super) errors: Vec<FieldError>,
    pub(super) mesh: Vec<(String, usize)>,
    pub(super) signatures: BTreeMap<String, Signature>,
    pub(super) local_types: BTreeMap<String, TensorType>,
    pub(super) files: BTreeMap<PathBuf, Vec<u8>>,
}

/// The job's device count, if within [`MAX_DEVICES`] (invariant 8).
fn job_devices(s: &JobSpec) -> Option<usize> {
    (s.processes as usize)
        .checked_mul(s.devices_per_process as usize)
        .filter(|&n| n <= MAX_DEVICES)
}

impl Validation {
    fn err(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    pub(super) fn err_at(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.err(field, message);
    }

    pub(super) fn check(&mut self, s: &JobSpec, base: &dyn SpecFiles) {
        // The scheduler's own rule: it derives ids from the name (`NAME.N`,
        // attempts `NAME.N@A`) that no name can collide with.
        if let Err(e) = tessel_coordinator::scheduler::check_job_name(&s.name) {
            self.err("name", e);
        }
        if s.processes == 0 {
            self.err("processes", "at least 1");
        }
        if s.devices_per_process == 0 {
            self.err("devices_per_process", "at least 1");
        }
        if job_devices(s).is_none() {
            self.err(
                "devices_per_process",
                format!(
                    "{} processes × {} devices is more than {MAX_DEVICES}, the most a job can have",
                    s.processes, s.devices_per_process
                ),
            );
        }
        if s.is_command() {
            self.check_command(s, base);
            return;
        }
        self.refuse_command_fields(s);
        if s.steps == 0 {
            self.err("steps", "at least 1");
        }
        self.check_mesh(s);
        for name in s.plugin_options.keys() {
            if let Err(e) = super::global::check_plugin_option_name(name) {
                self.err(format!("plugin_options.{name}"), e);
            }
        }
        for (name, p) in &s.programs {
            self.check_program(s, name, p, base);
        }
        for (name, a) in &s.arrays {
            self.check_array(s, name, a, base);
        }
        self.check_plan(s);
        if s.plan.is_empty() {
            self.err("plan", "no steps");
        }
        if let Some(r) = &s.report {
            if r.every == 0 {
                self.err("report.every", "at least 1");
            }
            for (i, a) in r.arrays.iter().enumerate() {
                match s.arrays.get(a) {
                    None => self.err(
                        format!("report.arrays[{i}]"),
                        format!("unknown array `{a}`"),
                    ),
                    Some(spec) if !spec.shape.is_empty() => self.err(
                        format!("report.arrays[{i}]"),
                        format!(
                            "`{a}` has shape {:?}; only scalars are reported",
                            spec.shape
                        ),
                    ),
                    Some(_) => {}
                }
            }
        }
        if let Some(c) = &s.checkpoint {
            if c.every == 0 {
                self.err("checkpoint.every", "at least 1");
            }
            if let Err(e) = crate::names::check_absolute_dir("checkpoint.dir", &c.dir) {
                self.err("checkpoint.dir", e);
            }
        }
    }

    /// The mesh's axes, kept only when they cover exactly the job's
    /// devices, so later checks (splits, process blocks) see sizes that
    /// divide and products that cannot wrap (invariant 8).
    fn check_mesh(&mut self, s: &JobSpec) {
        let Some(want) = job_devices(s) else {
            return; // Said by `check`.
        };
        match tessel_topology::Mesh::parse_axes(&s.mesh) {
            Ok(axes) => {
                let devices: usize = axes.iter().map(|(_, n)| n).product();
                if devices != want {
                    self.err(
                        "mesh",
                        format!(
                            "`{}` has {devices} devices, the job has {want} ({} processes × {} devices)",
                            s.mesh, s.processes, s.devices_per_process
                        ),
                    );
                } else {
                    self.mesh = axes;
                }
            }
            Err(e) => self.err("mesh", e.to_string()),
        }
    }

    fn check_program(&mut self, s: &JobSpec, name: &str, p: &ProgramSpec, base: &dyn SpecFiles) {
        let field = format!("programs.{name}");
        if let Err(e) = crate::names::check("program name", name) {
            self.err(&field, e);
        }
        if p.replicas == 0 {
            self.err(format!("{field}.replicas"), "at least 1");
        }
        let partitions = p.partitions.unwrap_or(s.devices_per_process);
        if p.global {
            if p.partitions.is_some() || p.replicas != 1 {
                self.err(
                    format!("{field}.global"),
                    "a global program runs one partition per device of the job: leave out partitions and replicas",
                );
            }
            if s.processes > 1 && super::global::SINGLE_PROCESS_PLUGINS.contains(&s.plugin.as_str())
            {
                self.err(
                    format!("{field}.global"),
                    super::global::single_process_refusal(&s.plugin),
                );
            }
        } else if partitions == 0 || p.replicas * partitions > s.devices_per_process {
            self.err(
                format!("{field}.partitions"),
                format!(
                    "{} replicas × {partitions} partitions do not fit the {} devices of a process",
                    p.replicas, s.devices_per_process
                ),
            );
        }
        let path = &p.file;
        let text = base
            .read(path)
            .and_then(|b| String::from_utf8(b).map_err(|_| "not UTF-8 MLIR text".to_owned()));
        match text {
            Err(e) => self.err(format!("{field}.file"), e),
            Ok(text) => match parse_signature(&text) {
                Ok(sig) => {
                    if p.global {
                        self.check_global_signature(s, &field, &sig);
                    }
                    self.signatures.insert(name.to_owned(), sig);
                    self.files.insert(path.clone(), text.into_bytes());
                }
                Err(e) => self.err(format!("{field}.file"), format!("{}: {e}", path.display())),
            },
        }
    }

    /// A global program's partition count and Shardy meshes against the job.
    fn check_global_signature(&mut self, s: &JobSpec, field: &str, sig: &Signature) {
        let devices = s.processes as usize * s.devices_per_process as usize;
        if let Some(n) = sig.num_partitions {
            if n != devices {
                self.err(
                    format!("{field}.file"),
                    format!("mhlo.num_partitions = {n}, the job has {devices} devices"),
                );
            }
        }
        for (mesh, axes) in &sig.meshes {
            // An empty mesh is invalid, and says so itself.
            if *axes != self.mesh && !self.mesh.is_empty() {
                let show = |a: &[(String, usize)]| {
                    a.iter()
                        .map(|(n, k)| format!("{n}={k}"))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                self.err(
                    format!("{field}.file"),
                    format!(
                        "mesh @{mesh} is `{}`, the job's mesh is `{}`",
                        show(axes),
                        show(&self.mesh)
                    ),
                );
            }
        }
    }

    fn check_array(&mut self, s: &JobSpec, name: &str, a: &ArraySpec, base: &dyn SpecFiles) {
        let field = format!("arrays.{name}");
        if BUILTINS.contains(&name) || name.starts_with('$') {
            self.err(&field, "names starting with `$` are reserved for built-ins");
        } else if let Err(e) = crate::names::check("array name", name) {
            self.err(&field, e);
        }
        let Some(dtype) = ElementType::parse(&a.dtype) else {
            self.err(
                format!("{field}.dtype"),
                format!("unknown dtype `{}`", a.dtype),
            );
            return;
        };
        if let Some(d) = a.shape.iter().find(|&&d| d < 0) {
            self.err(format!("{field}.shape"), format!("negative dimension {d}"));
            return;
        }
        // Invariant 8: the byte count, formed step by step, stays bounded.
        if checked_size(dtype, &a.shape, MAX_JOB_ARRAY_BYTES).is_err() {
            self.err(
                format!("{field}.shape"),
                format!(
                    "{dtype}{:?} is more than {} GiB, the most an array can hold",
                    a.shape,
                    MAX_JOB_ARRAY_BYTES >> 30
                ),
            );
            return;
        }
        if let Some(local) =
            self.local_shape(s, &format!("{field}.sharding"), &a.shape, &a.sharding)
        {
            self.local_types.insert(
                name.to_owned(),
                TensorType {
                    element_type: dtype,
                    dims: local,
                },
            );
        }
        match &a.init {
            Init::Npy { file } => match base.read(file) {
                Err(e) => self.err(format!("{field}.init.file"), e),
                Ok(bytes) => match crate::array::read_npy(&bytes) {
                    Err(e) => self.err(
                        format!("{field}.init.file"),
                        format!("{}: {e}", file.display()),
                    ),
                    Ok(b) if b.element_type() != dtype || b.dims() != a.shape.as_slice() => self
                        .err(
                            format!("{field}.init.file"),
                            format!(
                                "{} holds {}{:?}, the array is {dtype}{:?}",
                                file.display(),
                                b.element_type(),
                                b.dims(),
                                a.shape
                            ),
                        ),
                    Ok(_) => {
                        self.files.insert(file.clone(), bytes);
                    }
                },
            },
            Init::Normal { std, .. } if std.is_nan() || *std < 0.0 => {
                self.err(format!("{field}.init.std"), "must be ≥ 0");
            }
            Init::Uniform { low, high, .. }
                if low.partial_cmp(high) != Some(std::cmp::Ordering::Less) =>
            {
                self.err(format!("{field}.init"), "low must be below high");
            }
            _ => {}
        }
    }

    /// The shape one process holds (invariant 2): a split dimension is cut
    /// over the axis, of which a process holds the coordinates its devices
    /// cover (devices of a process are contiguous, row-major over the mesh).
    fn local_shape(
        &mut self,
        s: &JobSpec,
        field: &str,
        shape: &[i64],
        sharding: &ShardingSpec,
    ) -> Option<Vec<i64>> {
        let ShardingSpec::Split { split, dim } = sharding else {
            return Some(shape.to_vec());
        };
        if self.mesh.is_empty() {
            return None; // The mesh's own error says why.
        }
        let Some(k) = self.mesh.iter().position(|(a, _)| a == split) else {
            let axes: Vec<&str> = self.mesh.iter().map(|(a, _)| a.as_str()).collect();
            self.err(
                field,
                format!("unknown mesh axis `{split}` (axes: {})", axes.join(", ")),
            );
            return None;
        };
        if *dim >= shape.len() {
            self.err(
                field,
                format!("dimension {dim} of a rank-{} array", shape.len()),
            );
            return None;
        }
        let size = self.mesh[k].1 as i64;
        if shape[*dim] % size != 0 {
            self.err(
                field,
                format!(
                    "dimension {dim} ({}) does not divide over `{split}` ({size})",
                    shape[*dim]
                ),
            );
            return None;
        }
        let per_process = s.devices_per_process.max(1) as usize;
        let mut count = None;
        for p in 0..s.processes as usize {
            match crate::layout::process_block(&self.mesh, per_process, p, k) {
                Ok((_, n)) if count.is_none_or(|c| c == n) => count = Some(n),
                Ok(_) => {
                    self.err(field, "processes would hold blocks of different sizes");
                    return None;
                }
                Err(e) => {
                    self.err(field, e);
                    return None;
                }
            }
        }
        let covered = count.unwrap_or(1);
        let mut local = shape.to_vec();
        local[*dim] = shape[*dim] / size * covered as i64;
        Some(local)
    }
}

mod plan;

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Only the signature matters to validation.
    const TRAIN: &str = r#"module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<8x4xf32>, %arg1: tensor<64x8xf32>, %arg2: tensor<i32>) -> (tensor<8x4xf32>, tensor<f32>) {
    %c = stablehlo.constant dense<0.0> : tensor<f32>
    return %arg0, %c : tensor<8x4xf32>, tensor<f32>
  }
}
"#;

    const SPEC: &str = r#"
name = "mlp"
processes = 4
mesh = "data=4"
steps = 10

[programs.train]
file = "train.mlir"

[arrays.w]
dtype = "f32"
shape = [8, 4]
init = { kind = "normal", mean = 0.0, std = 0.1, seed = 1 }

[arrays.x]
dtype = "f32"
shape = [256, 8]
sharding = { split = "data", dim = 0 }
init = { kind = "npy", file = "x.npy" }

[arrays.grad]
dtype = "f32"
shape = [8, 4]

[arrays.loss]
dtype = "f32"
shape = []

[[plan]]
op = "execute"
program = "train"
inputs = ["w", "x", "$step"]
outputs = ["grad", "loss"]

[[plan]]
op = "all_reduce"
array = "grad"
reduce = "mean"

[report]
arrays = ["loss"]
every = 5
"#;

    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("train.mlir"), TRAIN).unwrap();
        let x = tessel_pjrt::HostBuffer::from_slice(&[0f32; 256 * 8], &[256, 8]).unwrap();
        std::fs::write(dir.path().join("x.npy"), crate::array::write_npy(&x)).unwrap();
        let wrong = tessel_pjrt::HostBuffer::from_slice(&[0f32; 8], &[8]).unwrap();
        std::fs::write(
            dir.path().join("wrong.npy"),
            crate::array::write_npy(&wrong),
        )
        .unwrap();
        std::fs::write(dir.path().join("junk.npy"), b"not an array").unwrap();
        dir
    }

    fn validate(text: &str) -> Result<ValidatedJob, JobSpecError> {
        let dir = folder();
        let path = dir.path().join("job.toml");
        std::fs::write(&path, text).unwrap();
        JobSpec::load(&path)
    }

    /// The spec with `from` replaced by `to`, and the errors it gets.
    fn errors(from: &str, to: &str) -> Vec<FieldError> {
        assert!(SPEC.contains(from), "{from}");
        match validate(&SPEC.replacen(from, to, 1)) {
            Err(JobSpecError::Invalid(e)) => e,
            other => panic!("expected field errors, got {other:?}"),
        }
    }

    fn has(errors: &[FieldError], field: &str, words: &str) -> bool {
        errors
            .iter()
            .any(|e| e.field == field && e.message.contains(words))
    }

    #[test]
    fn a_valid_spec_passes_with_process_local_types() {
        let v = validate(SPEC).unwrap();
        assert_eq!(v.mesh, vec![("data".to_string(), 4)]);
        assert_eq!(
            v.local_types["x"].dims,
            vec![64, 8],
            "256 rows over 4 processes"
        );
        assert_eq!(v.local_types["w"].dims, vec![8, 4], "replicated");
        assert_eq!(v.signatures["train"].parameters.len(), 3);
    }

    /// Invariant 3: inputs are checked with the layout they have at that
    /// point of the plan, which repeats.
    #[test]
    fn execute_inputs_follow_the_layouts_of_earlier_steps() {
        let gather_x = "[[plan]]\nop = \"all_gather\"\narray = \"x\"\n\n";
        let reshard_x = "[[plan]]\nop = \"reshard\"\narray = \"x\"\nsharding = \"replicated\"\n\n";
        let first_step = "[[plan]]\nop = \"execute\"";
        // Gathered before `train`, which takes 64 rows: refused in the
        // first pass already.
        for before in [gather_x, reshard_x] {
            let e = errors(first_step, &format!("{before}{first_step}"));
            assert!(
                has(&e, "plan[1].inputs[1]", "f32[256, 8] per process"),
                "{e:?}"
            );
            assert!(!e[0].message.contains("second step"), "{e:?}");
        }
        // Gathered after it: the first step passes, the second sees the
        // whole array.
        let e = errors("[report]", &format!("{gather_x}[report]"));
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            has(&e, "plan[0].inputs[1]", "f32[256, 8] per process")
                && e[0].message.contains("from the second step on"),
            "{e:?}"
        );
        // Split again before the next step: every step sees 64 rows.
        let split_x = "[[plan]]\nop = \"reshard\"\narray = \"x\"\nsharding = { split = \"data\", dim = 0 }\n\n";
        let spec = SPEC.replacen("[report]", &format!("{gather_x}{split_x}[report]"), 1);
        validate(&spec).unwrap();
        // The validated job still carries the declared layouts.
        assert_eq!(validate(&spec).unwrap().local_types["x"].dims, vec![64, 8]);
    }

    #[test]
    fn two_devices_per_process_hold_two_shards() {
        let spec = SPEC
            .replace("processes = 4", "processes = 2\ndevices_per_process = 2")
            .replace(
                "file = \"train.mlir\"",
                "file = \"train.mlir\"\npartitions = 1",
            );
        let e = match validate(&spec) {
            Err(JobSpecError::Invalid(e)) => e,
            other => panic!("{other:?}"),
        };
        // Each process now holds 128 rows; the program takes 64.
        assert!(
            has(&e, "plan[0].inputs[1]", "f32[128, 8] per process"),
            "{e:?}"
        );
    }

    #[test]
    fn unknown_names_are_refused_naming_the_field() {
        assert!(has(
            &errors(r#"inputs = ["w", "x""#, r#"inputs = ["w3", "x""#),
            "plan[0].inputs[0]",
            "unknown array `w3`"
        ));
        assert!(has(
            &errors(r#"program = "train""#, r#"program = "eval""#),
            "plan[0].program",
            "unknown program"
        ));
        assert!(has(
            &errors("split = \"data\"", "split = \"model\""),
            "arrays.x.sharding",
            "unknown mesh axis `model`"
        ));
        assert!(has(
            &errors("reduce = \"mean\"", "reduce = \"median\""),
            "plan[1].reduce",
            "unknown reduction"
        ));
        assert!(has(
            &errors(r#"arrays = ["loss"]"#, r#"arrays = ["w"]"#),
            "report.arrays[0]",
            "only scalars"
        ));
        assert!(has(
            &errors("dtype = \"f32\"", "dtype = \"f128\""),
            "arrays.w.dtype",
            "unknown dtype"
        ));
    }

    #[test]
    fn the_spec_text_round_trips_and_names_shardings() {
        let v = validate(&SPEC.replace(
            "dtype = \"f32\"\nshape = [8, 4]\ninit",
            "dtype = \"f32\"\nshape = [8, 4]\nsharding = \"replicated\"\ninit",
        ))
        .unwrap();
        let again = JobSpec::from_toml(&v.text, Path::new("again")).unwrap();
        assert_eq!(again, v.spec);
        assert_eq!(v.spec.arrays["w"].sharding, ShardingSpec::Replicated);
        let bad = SPEC.replace(
            "sharding = { split = \"data\", dim = 0 }",
            "sharding = \"rows\"",
        );
        match validate(&bad) {
            Err(JobSpecError::Syntax { reason, .. }) => {
                assert!(reason.contains("unknown sharding `rows`"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// Invariant 5: names that would become paths outside their folder,
    /// and relative checkpoint folders, are refused at validation.
    #[test]
    fn names_that_become_paths_follow_one_rule() {
        let e = errors(
            "[arrays.grad]",
            "[arrays.\"../../../../../../../../../tmp/x/PWNED\"]",
        );
        assert!(
            has(
                &e,
                "arrays.../../../../../../../../../tmp/x/PWNED",
                "letters, digits"
            ),
            "{e:?}"
        );
        let e = errors("[programs.train]", "[programs.\"../train\"]");
        assert!(has(&e, "programs.../train", "letters, digits"), "{e:?}");
        let e = errors(
            "[report]",
            "[checkpoint]\ndir = \"ckpt\"\nevery = 5\n\n[report]",
        );
        assert!(has(&e, "checkpoint.dir", "is relative"), "{e:?}");
        let e = errors(
            "[report]",
            "[checkpoint]\ndir = \"/var/ckpt/../../etc\"\nevery = 5\n\n[report]",
        );
        assert!(has(&e, "checkpoint.dir", "no `.` or `..`"), "{e:?}");
    }

    #[test]
    fn missing_files_are_refused() {
        assert!(has(
            &errors("train.mlir", "nope.mlir"),
            "programs.train.file",
            "cannot read"
        ));
        assert!(has(
            &errors("x.npy", "nope.npy"),
            "arrays.x.init.file",
            "cannot read"
        ));
        assert!(has(
            &errors("x.npy", "wrong.npy"),
            "arrays.x.init.file",
            "holds f32[8], the array is f32[256, 8]"
        ));
        assert!(has(
            &errors("x.npy", "junk.npy"),
            "arrays.x.init.file",
            "NUMPY magic"
        ));
    }

    #[test]
    fn signatures_must_match_array_types() {
        let e = errors("shape = [8, 4]\ninit", "shape = [8, 5]\ninit");
        assert!(
            has(&e, "plan[0].inputs[0]", "`w` is f32[8, 5] per process"),
            "{e:?}"
        );
        let e = errors(
            r#"outputs = ["grad", "loss"]"#,
            r#"outputs = ["loss", "grad"]"#,
        );
        assert!(has(&e, "plan[0].outputs[0]", "result 0"), "{e:?}");
        let e = errors(r#"inputs = ["w", "x", "$step"]"#, r#"inputs = ["w", "x"]"#);
        assert!(
            has(&e, "plan[0].inputs", "takes 3 parameters, 2 given"),
            "{e:?}"
        );
    }

    #[test]
    fn the_mesh_must_cover_the_devices_and_splits_divide() {
        assert!(has(
            &errors("mesh = \"data=4\"", "mesh = \"data=8\""),
            "mesh",
            "8 devices, the job has 4"
        ));
        assert!(has(
            &errors("shape = [256, 8]", "shape = [254, 8]"),
            "arrays.x.sharding",
            "does not divide"
        ));
    }

    /// Invariant 8: meshes and sizes found to panic, pass or wrap are
    /// refused with a message, never a panic or a negative shape.
    #[test]
    fn sizes_are_bounded_before_they_are_multiplied() {
        for (mesh, words) in [
            ("data=0", "size 0"),
            ("data=4,data=1", "named twice"),
            ("data=18446744073709551615", "more than 1048576 devices"),
            ("data=65536,model=65536", "more than 1048576 devices"),
            ("data=-4", "not a number"),
            ("", "needs an axis"),
        ] {
            let e = errors("mesh = \"data=4\"", &format!("mesh = \"{mesh}\""));
            assert!(has(&e, "mesh", words), "{mesh}: {e:?}");
            assert!(
                !e.iter()
                    .any(|e| e.message.contains('-') && e.message.contains("f32[")),
                "{mesh}: no wrapped shape in {e:?}"
            );
        }
        // The scheduler checks the same bound of what it places.
        assert_eq!(
            tessel_coordinator::scheduler::MAX_JOB_DEVICES,
            MAX_DEVICES as u64
        );
        let e = errors(
            "processes = 4",
            "processes = 4294967295\ndevices_per_process = 4294967295",
        );
        assert!(has(&e, "devices_per_process", "more than 1048576"), "{e:?}");
        let e = errors(
            "shape = [8, 4]\ninit",
            "shape = [9223372036854775807, 4]\ninit",
        );
        assert!(has(&e, "arrays.w.shape", "more than 1024 GiB"), "{e:?}");
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let e = errors("steps = 10", "steps = 0\nmax_restarts = 1")
            .into_iter()
            .chain(errors("processes = 4", "processes = 0"))
            .collect::<Vec<_>>();
        assert!(has(&e, "steps", "at least 1"));
        assert!(has(&e, "processes", "at least 1"));
        let spec = SPEC
            .replace("steps = 10", "steps = 0")
            .replace("every = 5", "every = 0");
        match validate(&spec) {
            Err(JobSpecError::Invalid(e)) => assert!(e.len() >= 2, "{e:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_fields_and_bad_toml_are_syntax_errors() {
        let e = validate(&SPEC.replace("steps = 10", "steps = 10\nepochs = 3")).unwrap_err();
        assert!(
            matches!(&e, JobSpecError::Syntax { reason, .. } if reason.contains("epochs")),
            "{e}"
        );
        let e = validate("name = ").unwrap_err();
        assert!(matches!(e, JobSpecError::Syntax { .. }));
        let e = validate(&SPEC.replace("op = \"all_reduce\"", "op = \"all_to_all\"")).unwrap_err();
        assert!(e.to_string().contains("all_to_all"), "{e}");
    }
}
