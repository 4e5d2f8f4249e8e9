//! Helpers for the container tests: commands that must succeed, the image
//! under test, and the repository's folders.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `cmd`, panics with its output unless it succeeds; its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `docker ARGS`, which must succeed; its stdout.
pub fn docker(args: &[&str]) -> String {
    run(Command::new("docker").args(args))
}

/// The image under test: `$TESSEL_IMAGE`, which must exist
/// (`./scripts/test` builds it with `scripts/image --debug --plugins cpu`).
pub fn image() -> String {
    let image = std::env::var("TESSEL_IMAGE").unwrap_or_else(|_| "tessel:0.1.0-cpu".into());
    let ok = Command::new("docker")
        .args(["image", "inspect", &image])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "no image {image}: run scripts/image --plugins cpu (./scripts/test does)"
    );
    image
}

/// A container's exit code once it has stopped.
pub fn exit_code(container: &str) -> i32 {
    docker(&["inspect", "-f", "{{.State.ExitCode}}", container])
        .trim()
        .parse()
        .expect("an exit code")
}

/// Containers and networks removed when dropped (`docker rm -f`,
/// `docker network rm`), however the test ends.
#[derive(Default)]
pub struct Cleanup {
    /// Container names.
    pub containers: Vec<String>,
    /// Network names, removed after the containers.
    pub networks: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = Command::new("docker").args(["rm", "-f", "-v", c]).output();
        }
        for n in &self.networks {
            let _ = Command::new("docker").args(["network", "rm", n]).output();
        }
    }
}
