//! Checkpoints of a job's arrays on disk.
//!
//! ```text
//! {checkpoint_dir}/{job}/step-{step:012}/process-{p:05}/{array}.npy
//! {checkpoint_dir}/{job}/step-{step:012}/manifest.json
//! ```
//!
//! Invariants:
//! 1. A checkpoint counts only when its manifest exists. Each process
//!    writes and fsyncs its blocks (files and folder); the processes pass a
//!    barrier; then process 0 writes the manifest to a temporary file,
//!    fsyncs it, renames it into place and fsyncs the folder. A crash at
//!    any point leaves either no manifest (ignored) or a complete one.
//! 2. A manifest names the spec it belongs to (SHA-256 of the spec text):
//!    a checkpoint of another spec under the same job id is never loaded.
//! 3. The manifest records each array's sharding at the time, so a block
//!    is restored as the layout it was written in.
//! 4. Process 0 keeps the newest [`KEEP`] complete checkpoints and removes
//!    older ones after a new manifest is in place.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::array::{read_npy, write_npy};
use crate::job::ShardingSpec;
use crate::plan::LocalArray;

/// Complete checkpoints kept per job.
pub const KEEP: usize = 2;

/// What a complete checkpoint holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The last step the checkpoint includes.
    pub step: u64,
    pub spec_sha256: String,
    pub processes: u32,
    /// Each array and its sharding when written.
    pub arrays: Vec<(String, ShardingSpec)>,
}

/// One job's checkpoint folder.
pub struct CheckpointDir {
    dir: PathBuf,
    spec_sha256: String,
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

impl CheckpointDir {
    pub fn new(dir: PathBuf, spec_text: &str) -> CheckpointDir {
        CheckpointDir {
            dir,
            spec_sha256: tessel_topology::sha256_hex(spec_text.as_bytes()),
        }
    }

    fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:012}"))
    }

    fn process_dir(&self, step: u64, process: usize) -> PathBuf {
        self.step_dir(step).join(format!("process-{process:05}"))
    }

    /// Writes and fsyncs this process's blocks (invariant 1, first half).
    pub fn write_blocks(
        &self,
        step: u64,
        process: usize,
        blocks: &[(&str, &LocalArray)],
    ) -> Result<(), String> {
        let dir = self.process_dir(step, process);
        std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        for (name, a) in blocks {
            let path = dir.join(format!("{name}.npy"));
            let mut f = File::create(&path).map_err(io("creating", &path))?;
            f.write_all(&write_npy(&a.value))
                .and_then(|()| f.sync_all())
                .map_err(io("writing", &path))?;
        }
        sync_dir(&dir)?;
        sync_dir(&self.step_dir(step))?;
        Ok(())
    }

    /// Process 0, after the barrier: the manifest, atomically (invariant
    /// 1), then retention (invariant 4).
    pub fn commit(
        &self,
        step: u64,
        processes: u32,
        blocks: &[(&str, &LocalArray)],
    ) -> Result<(), String> {
        let m = Manifest {
            step,
            spec_sha256: self.spec_sha256.clone(),
            processes,
            arrays: blocks
                .iter()
                .map(|(n, a)| (n.to_string(), a.sharding.clone()))
                .collect(),
        };
        let dir = self.step_dir(step);
        let tmp = dir.join("manifest.json.tmp");
        let path = dir.join("manifest.json");
        let mut f = File::create(&tmp).map_err(io("creating", &tmp))?;
        f.write_all(&serde_json::to_vec_pretty(&m).expect("encodes"))
            .and_then(|()| f.sync_all())
            .map_err(io("writing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming", &tmp))?;
        sync_dir(&dir)?;
        let complete = self.complete()?;
        for old in complete.iter().rev().skip(KEEP) {
            let _ = std::fs::remove_dir_all(self.step_dir(*old));
        }
        Ok(())
    }

    fn manifest(&self, step: u64) -> Option<Manifest> {
        let bytes = std::fs::read(self.step_dir(step).join("manifest.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Steps with a manifest of this spec, oldest first (invariants 1, 2).
    fn complete(&self) -> Result<Vec<u64>, String> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("listing", &self.dir)(e)),
        };
        let mut steps: Vec<u64> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("step-")?
                    .parse::<u64>()
                    .ok()
            })
            .filter(|&s| {
                self.manifest(s)
                    .is_some_and(|m| m.spec_sha256 == self.spec_sha256 && m.step == s)
            })
            .collect();
        steps.sort_unstable();
        Ok(steps)
    }

    /// The newest complete checkpoint of this spec.
    pub fn latest(&self) -> Result<Option<u64>, String> {
        Ok(self.complete()?.last().copied())
    }

    /// This process's blocks of checkpoint `step` for `names`.
    pub fn read(
        &self,
        step: u64,
        process: usize,
        names: &[String],
    ) -> Result<Vec<(String, LocalArray)>, String> {
        let m = self
            .manifest(step)
            .ok_or_else(|| format!("checkpoint {step} has no manifest"))?;
        let dir = self.process_dir(step, process);
        let mut out = Vec::new();
        for name in names {
            let Some((_, sharding)) = m.arrays.iter().find(|(n, _)| n == name) else {
                return Err(format!("checkpoint {step} does not hold `{name}`"));
            };
            let path = dir.join(format!("{name}.npy"));
            let bytes = std::fs::read(&path).map_err(io("reading", &path))?;
            let value = read_npy(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
            out.push((
                name.clone(),
                LocalArray {
                    value,
                    sharding: sharding.clone(),
                },
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_pjrt::HostBuffer;

    fn block(v: f32) -> LocalArray {
        LocalArray {
            value: HostBuffer::from_slice(&[v, v], &[2]).unwrap(),
            sharding: ShardingSpec::Replicated,
        }
    }

    #[test]
    fn only_checkpoints_with_a_manifest_of_this_spec_count() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join("job"), "spec A");
        assert_eq!(dir.latest().unwrap(), None);
        let w = block(1.0);
        for step in [9, 19, 29] {
            for p in 0..2 {
                dir.write_blocks(step, p, &[("w", &w)]).unwrap();
            }
        }
        // Blocks without a manifest: not a checkpoint.
        assert_eq!(dir.latest().unwrap(), None);
        dir.commit(9, 2, &[("w", &w)]).unwrap();
        dir.commit(19, 2, &[("w", &w)]).unwrap();
        assert_eq!(dir.latest().unwrap(), Some(19));
        let got = dir.read(19, 1, &["w".into()]).unwrap();
        assert_eq!(got[0].1.value.bytes(), w.value.bytes());
        // Another spec under the same folder sees none of them.
        let other = CheckpointDir::new(tmp.path().join("job"), "spec B");
        assert_eq!(other.latest().unwrap(), None);
        // Retention: the newest two stay.
        dir.commit(29, 2, &[("w", &w)]).unwrap();
        assert_eq!(dir.complete().unwrap(), vec![19, 29]);
        assert!(!tmp.path().join("job/step-000000000009").exists());
        assert!(dir.read(29, 0, &["nope".into()]).is_err());
    }
}
