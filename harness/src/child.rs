//! One child `tessel` process.
//!
//! Invariants:
//! 1. A child is killed (SIGKILL) when its [`Child`] is dropped, however
//!    the parent's code path ends.
//! 2. With [`Child::spawn`]'s `exit_with_parent`, the child gets
//!    `--exit-with-parent` and a pipe on stdin: if the parent dies without
//!    dropping (SIGKILL), the pipe closes and the child exits.
//! 3. Stdout is read by a thread into a channel; every wait has a deadline.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{LocalError, Ready};

/// A running child process.
pub struct Child {
    name: String,
    child: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Child {
    /// Starts `cmd` with stdout and stdin piped (invariants 2, 3); with
    /// `exit_with_parent` it also gets `--exit-with-parent`. `RUST_LOG`
    /// is `error` unless the caller's environment sets it.
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        exit_with_parent: bool,
    ) -> Result<Child, LocalError> {
        if exit_with_parent {
            cmd.arg("--exit-with-parent");
        }
        if std::env::var_os("RUST_LOG").is_none() {
            // Children's warnings (elections during start-up) are noise
            // here; RUST_LOG=warn shows them.
            cmd.env("RUST_LOG", "error");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|source| LocalError::Spawn {
                name: name.into(),
                source,
            })?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Child {
            name: name.into(),
            stdin: child.stdin.take(),
            child,
            lines,
        })
    }

    /// The name it was started with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next stdout line within `timeout` (invariant 3).
    pub fn next_line(&mut self, timeout: Duration) -> Result<String, LocalError> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(LocalError::Silent {
                name: self.name.clone(),
                timeout,
            }),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(LocalError::Exited {
                name: self.name.clone(),
                status: self.child.wait().map(|s| s.to_string()).unwrap_or_default(),
            }),
        }
    }

    /// Waits for the first line for which `pick` says something.
    pub fn wait_for<T>(
        &mut self,
        timeout: Duration,
        pick: impl Fn(&str) -> Option<T>,
    ) -> Result<T, LocalError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.next_line(left).map_err(|e| match e {
                LocalError::Silent { name, .. } => LocalError::Silent { name, timeout },
                e => e,
            })?;
            if let Some(t) = pick(&line) {
                return Ok(t);
            }
        }
    }

    /// Waits for its readiness line.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Ready, LocalError> {
        self.wait_for(timeout, Ready::parse)
    }

    /// Writes one line to its stdin.
    pub fn send_line(&mut self, line: &str) -> Result<(), LocalError> {
        let name = self.name.clone();
        let stdin = self.stdin.as_mut().ok_or_else(|| LocalError::Exited {
            name: name.clone(),
            status: "stdin closed".into(),
        })?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|source| LocalError::Write { name, source })
    }

    /// Closes its stdin (a child with `--exit-with-parent` exits).
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Sends `signal` (SIGTERM, SIGSTOP, SIGCONT…).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// Whether it has exited (and how).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until it exits or `deadline` passes, then SIGKILLs it.
    pub fn reap_by(&mut self, deadline: Instant) {
        while Instant::now() < deadline {
            if self.try_wait().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }

    /// Stops a group at once: SIGTERM to all, then reap each by `grace`.
    pub fn terminate_all(children: &mut [Child], grace: Duration) {
        for c in children.iter() {
            c.signal(nix::sys::signal::Signal::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        for c in children.iter_mut() {
            c.reap_by(deadline);
        }
    }

    /// SIGKILL (resuming it first if stopped), and reap.
    pub fn kill(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Child {
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
