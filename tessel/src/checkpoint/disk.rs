//! A job's checkpoint folder on one host.
//!
//! ```text
//! {checkpoint.dir}/{job}/step-{step:012}/process-{p:05}/{array}.npy
//! {checkpoint.dir}/{job}/probes/{attempt}-{p:05}
//! ```
//!
//! Invariants:
//! 1. Every path is built from names that follow [`crate::names`], under a
//!    folder the worker confined to its `--checkpoint-root`.
//! 2. A block file and its folders are fsynced before the writer reports
//!    the block's digest: a digest in a record means bytes on disk.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::names;

/// One job's checkpoint folder on this host.
pub struct CheckpointDir {
    dir: PathBuf,
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> String {
    let path = path.display().to_string();
    move |e| format!("{what} {path}: {e}")
}

fn sync_dir(path: &Path) -> Result<(), String> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing", path))
}

/// SHA-256 of `bytes`, in hex.
pub fn digest(bytes: &[u8]) -> String {
    tessel_topology::sha256_hex(bytes)
}

/// `dir/{name}.npy` for an array name that follows the rule.
fn block_path(dir: &Path, name: &str) -> Result<PathBuf, String> {
    names::check("array name", name)?;
    Ok(dir.join(format!("{name}.npy")))
}

impl CheckpointDir {
    /// The folder of `job` under `root` (already confined: invariant 1).
    pub fn new(root: &Path, job: &str) -> Result<CheckpointDir, String> {
        Ok(CheckpointDir {
            dir: names::confined(root, "job id", job)?,
        })
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:012}"))
    }

    fn process_dir(&self, step: u64, process: usize) -> PathBuf {
        self.step_dir(step).join(format!("process-{process:05}"))
    }

    /// Writes and fsyncs process `process`'s blocks of `step` (this
    /// process's own, or the copy it keeps of a peer's); returns each
    /// file's digest, in order (invariant 2).
    pub fn write_blocks(
        &self,
        step: u64,
        process: usize,
        blocks: &[(String, Vec<u8>)],
    ) -> Result<Vec<String>, String> {
        let dir = self.process_dir(step, process);
        std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        let mut digests = Vec::with_capacity(blocks.len());
        for (name, bytes) in blocks {
            let path = block_path(&dir, name)?;
            let mut f = File::create(&path).map_err(io("creating", &path))?;
            f.write_all(bytes)
                .and_then(|()| f.sync_all())
                .map_err(io("writing", &path))?;
            digests.push(digest(bytes));
        }
        sync_dir(&dir)?;
        sync_dir(&self.step_dir(step))?;
        sync_dir(&self.dir)?;
        Ok(digests)
    }

    /// Process `process`'s blocks of `step` for `names`, if this host holds
    /// every one of them and `recorded` accepts their digests (in `names`'
    /// order): the record's check (`CheckpointRecord::matches`).
    pub fn read_blocks(
        &self,
        step: u64,
        process: usize,
        names: &[String],
        recorded: impl Fn(&[String]) -> bool,
    ) -> Option<Vec<(String, Vec<u8>)>> {
        let dir = self.process_dir(step, process);
        let mut out = Vec::with_capacity(names.len());
        let mut digests = Vec::with_capacity(names.len());
        for name in names {
            let path = block_path(&dir, name).ok()?;
            let bytes = std::fs::read(&path).ok()?;
            digests.push(digest(&bytes));
            out.push((name.clone(), bytes));
        }
        if !recorded(&digests) {
            tracing::warn!(dir = %dir.display(), "checkpoint blocks differ from their record");
            return None;
        }
        Some(out)
    }

    /// Removes every step folder not in `keep`.
    pub fn prune(&self, keep: &[u64]) -> Result<(), String> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("listing", &self.dir)(e)),
        };
        for e in entries.filter_map(Result::ok) {
            let step = e
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("step-"))
                .and_then(|s| s.parse::<u64>().ok());
            if let Some(step) = step.filter(|s| !keep.contains(s)) {
                match std::fs::remove_dir_all(self.step_dir(step)) {
                    Ok(()) => {}
                    // Another process sharing the folder removed it first.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io("removing", &self.step_dir(step))(e)),
                }
            }
        }
        Ok(())
    }

    /// The step folders on this host, ascending.
    pub fn steps(&self) -> Vec<u64> {
        let mut steps: Vec<u64> = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter_map(|e| e.file_name().to_str()?.strip_prefix("step-")?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        steps.sort_unstable();
        steps
    }

    fn probe(&self, attempt: u32, process: usize) -> PathBuf {
        self.dir
            .join("probes")
            .join(format!("{attempt}-{process:05}"))
    }

    /// Leaves a probe file for the other processes of `attempt` to find.
    pub fn write_probe(&self, attempt: u32, process: usize) -> Result<(), String> {
        let path = self.probe(attempt, process);
        let dir = path.parent().expect("a folder");
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
        File::create(&path)
            .and_then(|f| f.sync_all())
            .map_err(io("creating", &path))?;
        sync_dir(dir)
    }

    /// Whether this host sees the probe of every one of `n` processes.
    pub fn sees_probes(&self, attempt: u32, n: usize) -> bool {
        (0..n).all(|p| self.probe(attempt, p).exists())
    }

    /// Removes this process's probe file of `attempt`.
    pub fn remove_probe(&self, attempt: u32, process: usize) {
        let _ = std::fs::remove_file(self.probe(attempt, process));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_read_back_only_with_their_digests() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path(), "job.1").unwrap();
        let blocks = vec![("w".to_string(), b"npy bytes".to_vec())];
        let d = dir.write_blocks(9, 1, &blocks).unwrap();
        assert_eq!(d, vec![digest(b"npy bytes")]);
        let names = vec!["w".to_string()];
        let recorded = |want: Vec<String>| move |got: &[String]| got == want;
        assert_eq!(
            dir.read_blocks(9, 1, &names, recorded(d.clone())),
            Some(blocks.clone())
        );
        assert_eq!(
            dir.read_blocks(9, 0, &names, recorded(d.clone())),
            None,
            "another process's"
        );
        let wrong = vec![digest(b"other")];
        assert_eq!(
            dir.read_blocks(9, 1, &names, recorded(wrong)),
            None,
            "a stale file"
        );
        // Names are confined (invariant 1).
        let evil = vec![("../../PWNED".to_string(), b"x".to_vec())];
        assert!(dir.write_blocks(9, 1, &evil).is_err());
        assert!(CheckpointDir::new(tmp.path(), "..").is_err());
        assert!(!tmp.path().join("PWNED.npy").exists());
    }

    #[test]
    fn pruning_keeps_only_the_given_steps() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path(), "j").unwrap();
        for step in [9, 19, 29] {
            dir.write_blocks(step, 0, &[("w".into(), vec![1])]).unwrap();
        }
        dir.prune(&[19, 29]).unwrap();
        assert_eq!(dir.steps(), vec![19, 29]);
        dir.write_probe(1, 0).unwrap();
        dir.prune(&[29]).unwrap();
        assert_eq!(dir.steps(), vec![29], "probes are not steps");
    }

    #[test]
    fn probes_tell_a_shared_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path(), "j").unwrap();
        dir.write_probe(2, 0).unwrap();
        assert!(!dir.sees_probes(2, 2));
        dir.write_probe(2, 1).unwrap();
        assert!(dir.sees_probes(2, 2));
        dir.remove_probe(2, 1);
        assert!(!dir.sees_probes(2, 2));
    }
}
