//! Starting, watching and stopping a placement's processes (module
//! invariants 1 and 3).

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::sync::mpsc;

use super::logs;

/// How a process ended, for people.
pub(crate) fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => match Signal::try_from(s) {
            Ok(sig) => format!("was killed by signal {s} ({sig})"),
            Err(_) => format!("was killed by signal {s}"),
        },
        _ => "ended".into(),
    }
}

/// `setpriv`, if installed: it makes a process die with the thread that
/// started it (`--pdeathsig`), without `unsafe` code here.
fn setpriv() -> Option<&'static Path> {
    static FOUND: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|d| d.join("setpriv"))
                .find(|p| p.is_file())
        })
        .as_deref()
}

/// A placement's processes, each leading its own process group.
pub(crate) struct Gang {
    /// Process group ids of the processes not yet seen to exit.
    running: Vec<(u32, i32)>,
    /// `(local rank, exit)` as each process ends.
    exits: mpsc::UnboundedReceiver<(u32, std::io::Result<ExitStatus>)>,
    grace: Duration,
}

/// Why a process could not be started.
#[derive(Debug)]
pub(crate) struct SpawnError(pub(crate) String);

impl Gang {
    /// Starts one process per entry of `envs`, in `dir`, its output going
    /// to `lines`. Spawned from a runtime worker thread, which lives as
    /// long as the worker: `--pdeathsig` follows that thread.
    pub(crate) fn spawn(
        argv: &[String],
        envs: Vec<Vec<(String, String)>>,
        dir: &Path,
        grace: Duration,
        lines: &mpsc::Sender<(u32, Vec<u8>)>,
    ) -> Result<(Gang, Vec<tokio::task::JoinHandle<()>>), SpawnError> {
        let (exit_tx, exits) = mpsc::unbounded_channel();
        let mut gang = Gang {
            running: Vec::new(),
            exits,
            grace,
        };
        let mut readers = Vec::new();
        for (local, env) in envs.into_iter().enumerate() {
            let local = local as u32;
            let mut cmd = match setpriv() {
                Some(sp) => {
                    let mut c = tokio::process::Command::new(sp);
                    c.args(["--pdeathsig", "KILL", "--"]).args(argv);
                    c
                }
                None => {
                    let mut c = tokio::process::Command::new(&argv[0]);
                    c.args(&argv[1..]);
                    c
                }
            };
            cmd.envs(env)
                .current_dir(dir)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            // setpriv execs the program itself: check it exists first, so
            // a missing program says so instead of setpriv's exit code.
            if setpriv().is_some() {
                resolve(&argv[0], dir).map_err(SpawnError)?;
            }
            let mut child = cmd.spawn().map_err(|e| {
                SpawnError(format!(
                    "cannot start `{}` in {}: {e}",
                    argv[0],
                    dir.display()
                ))
            })?;
            let pid = child.id().unwrap_or(0) as i32;
            crate::reaper::own(pid);
            gang.running.push((local, pid));
            if let Some(out) = child.stdout.take() {
                readers.push(tokio::spawn(logs::forward(out, local, lines.clone())));
            }
            if let Some(err) = child.stderr.take() {
                readers.push(tokio::spawn(logs::forward(err, local, lines.clone())));
            }
            let tx = exit_tx.clone();
            tokio::spawn(async move {
                let status = child.wait().await;
                crate::reaper::disown(pid);
                let _ = tx.send((local, status));
            });
        }
        Ok((gang, readers))
    }

    /// The next process to end, or `None` once none runs.
    pub(crate) async fn next_exit(&mut self) -> Option<(u32, std::io::Result<ExitStatus>)> {
        if self.running.is_empty() {
            return None;
        }
        let (local, status) = self.exits.recv().await?;
        self.running.retain(|(l, _)| *l != local);
        Some((local, status))
    }

    /// Whether any process still runs.
    pub(crate) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// SIGTERM to every group, SIGKILL to those left after the grace.
    pub(crate) async fn stop(&mut self) {
        self.signal(Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + self.grace;
        while !self.running.is_empty() {
            match tokio::time::timeout_at(deadline, self.next_exit()).await {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        left = self.running.len(),
                        "processes outlived the stop grace; SIGKILL"
                    );
                    self.signal(Signal::SIGKILL);
                    while self.next_exit().await.is_some() {}
                }
            }
        }
    }

    fn signal(&self, sig: Signal) {
        for (_, pgid) in &self.running {
            if *pgid > 0 {
                let _ = killpg(Pid::from_raw(*pgid), sig);
            }
        }
    }
}

impl Drop for Gang {
    /// Dropped with processes left (the worker lost its registration, or
    /// is shutting down): SIGTERM now, SIGKILL after the grace.
    fn drop(&mut self) {
        if self.running.is_empty() {
            return;
        }
        self.signal(Signal::SIGTERM);
        let groups: Vec<i32> = self.running.iter().map(|(_, g)| *g).collect();
        let grace = self.grace;
        std::thread::spawn(move || {
            std::thread::sleep(grace);
            for g in groups {
                let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
            }
        });
    }
}

/// `program` as the process would find it: a path (relative to `dir`), or
/// a name on `PATH`.
fn resolve(program: &str, dir: &Path) -> Result<(), String> {
    if program.contains('/') {
        let p = dir.join(program);
        return if p.is_file() {
            Ok(())
        } else {
            Err(format!(
                "cannot start `{program}`: {} does not exist",
                p.display()
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join(program).is_file()) {
        Ok(())
    } else {
        Err(format!(
            "cannot start `{program}`: not found on this host's PATH"
        ))
    }
}
