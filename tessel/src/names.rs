//! The one rule for names that become file paths: job ids, array and
//! program names, and the components of the files a job carries.
//!
//! A name is 1–128 bytes of `[A-Za-z0-9_.-]` and does not start with a
//! dot, so it is never `.`, `..` or hidden, holds no separator, and joined
//! to a folder stays inside it. Specs are checked at validation; the
//! worker checks again where it writes ([`confined`]).

use std::path::{Component, Path, PathBuf};

/// Longest name.
pub const MAX_NAME: usize = 128;

/// Checks `name` against the rule; the refusal names `what`.
pub fn check(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{what} `{}`: use 1-{MAX_NAME} letters, digits, `_`, `.` or `-`, not starting with `.`",
            name.escape_debug()
        ))
    }
}

/// Checks a relative path whose every component follows the rule (a
/// file a job carries: `grad.mlir`, `data/x.npy`).
pub fn check_relative(what: &str, path: &Path) -> Result<(), String> {
    let text = path.to_string_lossy();
    if path.as_os_str().is_empty() || path.is_absolute() {
        return Err(format!(
            "{what} `{text}`: a path relative to the spec's folder"
        ));
    }
    for c in path.components() {
        match c {
            Component::Normal(part) => check(what, &part.to_string_lossy())
                .map_err(|_| format!("{what} `{text}`: each part of the path must use letters, digits, `_`, `.` or `-` and not start with `.`"))?,
            _ => return Err(format!("{what} `{text}`: no `..`, `.` or root in the path")),
        }
    }
    Ok(())
}

/// `dir/name`, refusing a `name` that breaks the rule: the path a worker
/// writes is always inside `dir`.
pub fn confined(dir: &Path, what: &str, name: &str) -> Result<PathBuf, String> {
    check(what, name)?;
    Ok(dir.join(name))
}

/// Checks that `dir` is an absolute path without `.` or `..` parts.
pub fn check_absolute_dir(what: &str, dir: &Path) -> Result<(), String> {
    let text = dir.to_string_lossy();
    if !dir.is_absolute() {
        return Err(format!(
            "{what} `{text}` is relative: give an absolute path under a folder every worker was started with (`--checkpoint-root`)"
        ));
    }
    if dir
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(format!("{what} `{text}`: no `.` or `..` parts"));
    }
    Ok(())
}

/// `dir` (absolute) resolved on this host, if it lies under one of
/// `roots`: created, then compared with symbolic links resolved, so a
/// link inside a root cannot lead out of it.
pub fn under_root(dir: &Path, roots: &[PathBuf]) -> Result<PathBuf, String> {
    check_absolute_dir("checkpoint.dir", dir)?;
    if roots.is_empty() {
        return Err(format!(
            "checkpoint.dir `{}`: this worker keeps no checkpoints (start it with `--checkpoint-root DIR`)",
            dir.display()
        ));
    }
    let Some(root) = roots.iter().find(|r| dir.starts_with(r)) else {
        let list: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        return Err(format!(
            "checkpoint.dir `{}` is not under this worker's --checkpoint-root ({})",
            dir.display(),
            list.join(", ")
        ));
    };
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let real = dir
        .canonicalize()
        .map_err(|e| format!("resolving {}: {e}", dir.display()))?;
    let real_root = root
        .canonicalize()
        .map_err(|e| format!("resolving {}: {e}", root.display()))?;
    if !real.starts_with(&real_root) {
        return Err(format!(
            "checkpoint.dir `{}` leads to {} through a symbolic link, outside --checkpoint-root {}",
            dir.display(),
            real.display(),
            root.display()
        ));
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_their_folder_are_refused() {
        for good in ["w1", "mlp.3", "grad_4x1.mlir", "a-b", "x.npy"] {
            check("name", good).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "../../../../etc/PWNED",
            "a/b",
            "a\\b",
            "a b",
            "é",
            "nul\0",
            &"x".repeat(MAX_NAME + 1),
        ] {
            assert!(check("name", bad).is_err(), "{bad:?}");
        }
        let dir = Path::new("/ckpt/job");
        assert_eq!(
            confined(dir, "array", "w1").unwrap(),
            Path::new("/ckpt/job/w1")
        );
        assert!(confined(dir, "array", "../../x").is_err());
    }

    #[test]
    fn carried_files_are_relative_paths_of_good_names() {
        check_relative("file", Path::new("data/x.npy")).unwrap();
        for bad in ["/etc/passwd", "../x.npy", "a/../../b", "./x", ""] {
            assert!(check_relative("file", Path::new(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn checkpoint_folders_must_lie_under_a_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let roots = [root.clone()];
        let inside = root.join("job-a");
        assert!(under_root(&inside, &roots).unwrap().ends_with("job-a"));
        assert!(under_root(Path::new("relative/dir"), &roots)
            .unwrap_err()
            .contains("relative"));
        assert!(under_root(&tmp.path().join("elsewhere"), &roots)
            .unwrap_err()
            .contains("not under"));
        assert!(under_root(&root.join("../escape"), &roots).is_err());
        assert!(under_root(&inside, &[])
            .unwrap_err()
            .contains("--checkpoint-root"));
        // A link inside the root that leads out of it.
        std::os::unix::fs::symlink(tmp.path(), root.join("link")).unwrap();
        assert!(under_root(&root.join("link/out"), &roots)
            .unwrap_err()
            .contains("symbolic link"));
    }
}
