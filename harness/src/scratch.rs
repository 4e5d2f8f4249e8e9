//! Scratch folders of `tessel local`, the benchmarks and rank groups:
//! certificates, replicas' data dirs (up to a million keys for `bench kv`).
//!
//! Invariants:
//! 1. A folder is `{tmp}/tessel-{what}-{pid}-{random}`, removed when its
//!    [`tempfile::TempDir`] is dropped.
//! 2. Folders of processes that died without dropping them are removed by
//!    the next folder of the same kind on the host; a live one's never.

use std::path::Path;

/// A fresh scratch folder of kind `what` (letters only) in the system's
/// temporary folder, after sweeping those of dead processes (invariant 2).
pub fn scratch_dir(what: &str) -> std::io::Result<tempfile::TempDir> {
    scratch_dir_in(&std::env::temp_dir(), what)
}

/// [`scratch_dir`] inside `parent`.
pub fn scratch_dir_in(parent: &Path, what: &str) -> std::io::Result<tempfile::TempDir> {
    assert!(
        what.chars().all(|c| c.is_ascii_alphabetic()),
        "a scratch kind is letters only"
    );
    let prefix = format!("tessel-{what}-");
    if let Ok(entries) = std::fs::read_dir(parent) {
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    tempfile::Builder::new()
        .prefix(&format!("{prefix}{}-", std::process::id()))
        .tempdir_in(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_of_dead_processes_are_swept_and_live_ones_kept() {
        let parent = tempfile::tempdir().unwrap();
        // Above the kernel's largest pid: never a live process.
        let dead = parent.path().join("tessel-bench-4194305-abc");
        let live = parent
            .path()
            .join(format!("tessel-bench-{}-xyz", std::process::id()));
        let other_kind = parent.path().join("tessel-local-4194305-abc");
        for d in [&dead, &live, &other_kind] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("data"), b"x").unwrap();
        }
        let fresh = scratch_dir_in(parent.path(), "bench").unwrap();
        assert!(!dead.exists(), "a dead process's folder is swept");
        assert!(live.exists() && other_kind.exists());
        let name = fresh
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(name.starts_with(&format!("tessel-bench-{}-", std::process::id())));
        let path = fresh.path().to_path_buf();
        drop(fresh);
        assert!(!path.exists());
    }
}
