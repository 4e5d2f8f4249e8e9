//! Child `tessel` processes for `tessel local` and the benchmarks.
//!
//! Invariants:
//! 1. A child is killed (SIGKILL) when its [`ChildProc`] is dropped, however
//!    the parent's code path ends.
//! 2. A child started with [`ChildProc::spawn`] gets `--exit-with-parent`
//!    and a pipe on stdin: if the parent dies without dropping (SIGKILL), the
//!    pipe closes and the child exits, so no orphan outlives its parent.
//! 3. The child's stdout is read by a thread into a channel; callers wait
//!    for lines with a deadline, never forever.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub struct ChildProc {
    pub name: String,
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl ChildProc {
    /// Starts this `tessel` binary with `args` (invariant 2).
    pub fn spawn(name: &str, args: &[String], envs: &[(&str, String)]) -> Result<ChildProc> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(args)
            .arg("--exit-with-parent")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if std::env::var_os("RUST_LOG").is_none() {
            // Children's warnings (elections during start-up) are noise
            // here; RUST_LOG=warn shows them.
            cmd.env("RUST_LOG", "error");
        }
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(ChildProc {
            name: name.into(),
            child,
            lines,
        })
    }

    /// Waits for the first stdout line for which `pick` says something.
    pub fn wait_for<T>(
        &mut self,
        timeout: Duration,
        pick: impl Fn(&str) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(t) = pick(&line) {
                        return Ok(t);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!("{} did not report in {timeout:?}", self.name)
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    bail!("{} exited ({status:?}) before reporting", self.name)
                }
            }
        }
    }

    /// Sends SIGTERM.
    pub fn signal_term(&self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }

    /// Waits until it exits or `deadline` passes, then SIGKILLs it.
    pub fn reap_by(&mut self, deadline: Instant) {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }

    /// Stops a group at once: SIGTERM to all, then reap each by `grace`.
    pub fn terminate_all(procs: &mut [ChildProc], grace: Duration) {
        for p in procs.iter() {
            p.signal_term();
        }
        let deadline = Instant::now() + grace;
        for p in procs.iter_mut() {
            p.reap_by(deadline);
        }
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// For children: exit when the parent's end of stdin closes (invariant 2).
pub fn exit_with_parent() {
    std::thread::spawn(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        eprintln!("tessel: parent gone; exiting");
        std::process::exit(0);
    });
}
