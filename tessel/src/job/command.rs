//! The checks of a command job (invariant 7 of [`crate::job`]).

use std::path::Path;

use super::spec::{JobSpec, SpecFiles};
use super::validate::Validation;

/// Longest command line, all arguments together.
const MAX_ARGV: usize = 64 * 1024;

/// Variables tessel sets for every process of a command job.
pub use tessel_worker::command::env::SET_BY_TESSEL;

impl Validation {
    pub(super) fn check_command(&mut self, s: &JobSpec, base: &dyn SpecFiles) {
        let plan_fields = [
            ("mesh", !s.mesh.is_empty()),
            ("programs", !s.programs.is_empty()),
            ("arrays", !s.arrays.is_empty()),
            ("steps", s.steps != 0),
            ("plan", !s.plan.is_empty()),
            ("report", s.report.is_some()),
            ("plugin_options", !s.plugin_options.is_empty()),
        ];
        for (field, set) in plan_fields {
            if set {
                self.err_at(
                    field,
                    "a command job runs its command, not a plan: remove it",
                );
            }
        }
        if s.command[0].is_empty() {
            self.err_at("command[0]", "empty program name");
        }
        if s.command.iter().map(String::len).sum::<usize>() > MAX_ARGV {
            self.err_at("command", format!("longer than {MAX_ARGV} bytes"));
        }
        for (i, arg) in s.command.iter().enumerate() {
            if arg.contains('\0') {
                self.err_at(format!("command[{i}]"), "contains a NUL byte");
            }
        }
        let k = s.processes_per_worker;
        if k == 0 {
            self.err_at("processes_per_worker", "at least 1");
        } else if s.processes % k != 0 {
            self.err_at(
                "processes_per_worker",
                format!("{k} does not divide processes = {}", s.processes),
            );
        }
        for (name, value) in &s.env {
            if let Err(e) = check_env_name(name) {
                self.err_at(format!("env.{name}"), e);
            }
            if value.contains('\0') {
                self.err_at(format!("env.{name}"), "contains a NUL byte");
            }
        }
        if let Some(dir) = &s.workdir {
            if !s.files.is_empty() {
                self.err_at(
                    "workdir",
                    "give `files` (shipped with the job) or `workdir` (a folder on every host), not both",
                );
            }
            if !dir.is_absolute() {
                self.err_at(
                    "workdir",
                    format!("{}: an absolute folder on every host", dir.display()),
                );
            }
        }
        for (i, f) in s.files.iter().enumerate() {
            self.check_shipped(&format!("files[{i}]"), f, base);
        }
        if let Some(c) = &s.checkpoint {
            if let Err(e) = crate::names::check_absolute_dir("checkpoint.dir", &c.dir) {
                self.err_at("checkpoint.dir", e);
            }
        }
    }

    fn check_shipped(&mut self, field: &str, path: &Path, base: &dyn SpecFiles) {
        if let Err(e) = crate::names::check_relative(field, path) {
            self.err_at(field, e);
            return;
        }
        match base.read(path) {
            Ok(bytes) => {
                self.files.insert(path.to_owned(), bytes);
            }
            Err(e) => self.err_at(field, e),
        }
    }

    /// A plan job has no command: its command-only fields are mistakes.
    pub(super) fn refuse_command_fields(&mut self, s: &JobSpec) {
        let fields = [
            ("processes_per_worker", s.processes_per_worker != 1),
            ("files", !s.files.is_empty()),
            ("workdir", s.workdir.is_some()),
            ("env", !s.env.is_empty()),
        ];
        for (field, set) in fields {
            if set {
                self.err_at(field, "only a command job (one with `command`) has it");
            }
        }
        if s.mesh.is_empty() {
            self.err_at(
                "mesh",
                "missing: a job has a `mesh` and a `plan`, or a `command`",
            );
        }
    }
}

/// A variable name a job may set: `[A-Za-z_][A-Za-z0-9_]*`, not one of
/// tessel's.
fn check_env_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') || name.len() > 256 {
        return Err("a variable name is a letter or `_`, then letters, digits or `_`".into());
    }
    if SET_BY_TESSEL.contains(&name) {
        return Err(format!("{name} is set by tessel for every process"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use crate::job::{JobSpec, JobSpecError};

    fn spec(extra: &str) -> Result<crate::job::ValidatedJob, JobSpecError> {
        let text = format!(
            "name = \"train\"\nprocesses = 4\ncommand = [\"python3\", \"train.py\"]\n{extra}"
        );
        let files: BTreeMap<PathBuf, Vec<u8>> =
            [(PathBuf::from("train.py"), b"print(1)".to_vec())].into();
        JobSpec::from_toml(&text, "job.toml".as_ref())?.validate(&files)
    }

    fn errors(extra: &str) -> String {
        match spec(extra) {
            Err(JobSpecError::Invalid(e)) => e
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn a_command_job_ships_its_files_and_places_per_worker() {
        let job = spec("processes_per_worker = 2\nfiles = [\"train.py\"]\n[env]\nSTEPS = \"5\"\n")
            .unwrap();
        assert!(job.spec.is_command());
        assert_eq!(job.spec.placements(), 2);
        assert_eq!(job.spec.devices_per_placement(), 2);
        assert_eq!(job.files[&PathBuf::from("train.py")], b"print(1)");
        // The text that travels parses back to the same spec.
        let again = JobSpec::from_toml(&job.text, "t".as_ref()).unwrap();
        assert_eq!(again, job.spec);
    }

    #[test]
    fn bad_command_jobs_say_which_field() {
        for (extra, words) in [
            (
                "processes_per_worker = 3",
                "processes_per_worker: 3 does not divide processes = 4",
            ),
            ("mesh = \"data=4\"", "mesh: a command job runs its command"),
            ("files = [\"../x.py\"]", "files[0]"),
            (
                "files = [\"missing.py\"]",
                "files[0]: missing.py is not among the job's files",
            ),
            ("workdir = \"rel\"", "workdir: rel: an absolute folder"),
            ("workdir = \"/srv\"\nfiles = [\"train.py\"]", "not both"),
            ("[env]\nRANK = \"3\"", "env.RANK: RANK is set by tessel"),
            ("[env]\n\"A-B\" = \"3\"", "env.A-B: a variable name"),
        ] {
            let e = errors(extra);
            assert!(e.contains(words), "{extra}: {e}");
        }
        let e = JobSpec::from_toml(
            "name = \"x\"\nprocesses = 1\ncommand = [\"\"]",
            "t".as_ref(),
        )
        .unwrap()
        .validate(&BTreeMap::<PathBuf, Vec<u8>>::new())
        .unwrap_err()
        .to_string();
        assert!(e.contains("command[0]: empty program name"), "{e}");
        // A plan job has no command fields, and a job needs one or the other.
        let e = JobSpec::from_toml(
            "name = \"x\"\nprocesses = 1\n[env]\nA = \"1\"",
            "t".as_ref(),
        )
        .unwrap()
        .validate(&BTreeMap::<PathBuf, Vec<u8>>::new())
        .unwrap_err()
        .to_string();
        assert!(e.contains("env: only a command job"), "{e}");
        assert!(e.contains("mesh: missing"), "{e}");
    }
}
