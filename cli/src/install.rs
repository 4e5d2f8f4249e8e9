//! `tessel install DIR`: puts this binary (and the plugins baked into its
//! image) into a folder, so that a worker can run in a user's own image:
//! an init container from tessel's image runs it into a shared volume.
//!
//! The image has no shell or `cp`, so the binary copies itself. Files are
//! written under a temporary name and renamed, so a restarted init
//! container never leaves a half-written binary behind.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Copies `/proc/self/exe` to `DIR/bin/tessel` (mode 0755) and every file
/// under `plugins` (if it exists) to `DIR/plugins/`.
pub(crate) fn install(dir: &Path, plugins: Option<PathBuf>) -> Result<()> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    copy(&exe, &bin.join("tessel"), 0o755)?;
    let mut plugin_files = 0;
    if let Some(src) = plugins.filter(|p| p.is_dir()) {
        let dst = dir.join("plugins");
        plugin_files = copy_tree(&src, &dst)?;
    }
    println!(
        "installed {} ({} plugin files)",
        bin.join("tessel").display(),
        plugin_files
    );
    Ok(())
}

fn copy(from: &Path, to: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = to.with_extension("partial");
    std::fs::copy(from, &tmp)
        .with_context(|| format!("copying {} to {}", from.display(), tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp, to).with_context(|| format!("renaming to {}", to.display()))?;
    Ok(())
}

/// Copies regular files and folders (no links) from `src` to `dst`.
fn copy_tree(src: &Path, dst: &Path) -> Result<usize> {
    std::fs::create_dir_all(dst).with_context(|| format!("creating {}", dst.display()))?;
    let mut n = 0;
    for entry in std::fs::read_dir(src).with_context(|| format!("reading {}", src.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let to = dst.join(entry.file_name());
        if kind.is_dir() {
            n += copy_tree(&entry.path(), &to)?;
        } else if kind.is_file() {
            copy(&entry.path(), &to, 0o644)?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_and_plugins_land_under_the_folder_and_a_rerun_replaces_them() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("xla/cpu")).unwrap();
        std::fs::write(src.path().join("xla/cpu/p.so"), b"plugin").unwrap();
        let out = tempfile::tempdir().unwrap();
        for _ in 0..2 {
            install(out.path(), Some(src.path().to_path_buf())).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        let bin = std::fs::metadata(out.path().join("bin/tessel")).unwrap();
        assert_eq!(bin.permissions().mode() & 0o777, 0o755);
        assert!(bin.len() > 0);
        assert_eq!(
            std::fs::read(out.path().join("plugins/xla/cpu/p.so")).unwrap(),
            b"plugin"
        );
        assert!(!out.path().join("bin/tessel.partial").exists());
    }
}
