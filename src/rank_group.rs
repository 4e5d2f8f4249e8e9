//! A group of `tessel transfer-rank` processes on loopback, driven over
//! their stdin/stdout (the protocol is described in the binary's
//! `transfer_cli` module): used by the multi-process tests and by
//! `tessel bench transfer`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

/// What can go wrong driving the group.
#[derive(Debug, thiserror::Error)]
pub enum RankGroupError {
    #[error("cannot start rank {rank}: {source}")]
    Spawn { rank: usize, source: std::io::Error },
    #[error("cannot create the group's TLS folder: {0}")]
    Tls(String),
    #[error("rank {rank} gave no answer within {timeout:?}")]
    Silent { rank: usize, timeout: Duration },
    #[error("rank {rank} answered {line:?}, not JSON")]
    NotJson { rank: usize, line: String },
    #[error("cannot write to rank {rank}: {source}")]
    Write { rank: usize, source: std::io::Error },
}

pub type Result<T, E = RankGroupError> = std::result::Result<T, E>;

/// How to start the group.
#[derive(Debug, Clone, Default)]
pub struct RankOptions {
    /// Use the network between ranks on this host.
    pub force_network: bool,
    /// A boot id per rank (`TESSEL_BOOT_ID`), to make ranks look like
    /// different hosts; `None`: the real one.
    pub boot_ids: Option<Vec<String>>,
    pub timeout_ms: Option<u64>,
    pub chunk_bytes: Option<usize>,
    /// Keep same-host collectives on the ring (`--no-arenas`).
    pub no_arenas: bool,
}

struct RankProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

/// The ranks, killed (SIGKILL) when dropped, with their TLS folder.
pub struct RankGroup {
    ranks: Vec<RankProc>,
    _dir: tempfile::TempDir,
}

impl RankGroup {
    /// Starts `n` ranks of `tessel` (the binary at `bin`) and tells each
    /// the group.
    pub fn start(bin: &Path, n: usize, opts: &RankOptions) -> Result<RankGroup> {
        let tls_err = |e: String| RankGroupError::Tls(e);
        let dir = crate::scratch::scratch_dir("ranks").map_err(|e| tls_err(e.to_string()))?;
        let tls = dir.path().join("tls");
        tessel_net::tls::init_certs(&tls, &["127.0.0.1".into()])
            .map_err(|e| tls_err(e.to_string()))?;
        let mut g = RankGroup {
            ranks: Vec::new(),
            _dir: dir,
        };
        let mut group = Vec::new();
        for r in 0..n {
            let mut cmd = Command::new(bin);
            cmd.args(["transfer-rank", "--rank", &r.to_string()])
                .arg("--tls-dir")
                .arg(&tls)
                .env(
                    "RUST_LOG",
                    std::env::var("TESSEL_CHAOS_LOG").unwrap_or_else(|_| "error".into()),
                )
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit());
            if opts.force_network {
                cmd.arg("--force-network");
            }
            if let Some(t) = opts.timeout_ms {
                cmd.args(["--timeout-ms", &t.to_string()]);
            }
            if let Some(c) = opts.chunk_bytes {
                cmd.args(["--chunk-bytes", &c.to_string()]);
            }
            if opts.no_arenas {
                cmd.arg("--no-arenas");
            }
            if let Some(ids) = &opts.boot_ids {
                cmd.env("TESSEL_BOOT_ID", &ids[r]);
            }
            let mut child = cmd
                .spawn()
                .map_err(|source| RankGroupError::Spawn { rank: r, source })?;
            let stdin = child.stdin.take();
            let lines = stdout_lines(&mut child);
            g.ranks.push(RankProc {
                child,
                stdin,
                lines,
            });
            let hello = g.answer(r, Duration::from_secs(60))?;
            group.push(json!({"addr": hello["addr"], "boot_id": hello["boot_id"]}));
        }
        let group = Value::Array(group);
        for r in 0..n {
            g.send(r, &group)?;
        }
        Ok(g)
    }

    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    /// Writes one JSON line to rank `r`.
    pub fn send(&mut self, r: usize, v: &Value) -> Result<()> {
        let write_err = |source| RankGroupError::Write { rank: r, source };
        let stdin = self.ranks[r]
            .stdin
            .as_mut()
            .ok_or_else(|| write_err(std::io::ErrorKind::BrokenPipe.into()))?;
        writeln!(stdin, "{v}").map_err(write_err)?;
        stdin.flush().map_err(write_err)
    }

    /// Rank `r`'s next answer.
    pub fn answer(&mut self, r: usize, timeout: Duration) -> Result<Value> {
        let line = self.ranks[r]
            .lines
            .recv_timeout(timeout)
            .map_err(|_| RankGroupError::Silent { rank: r, timeout })?;
        serde_json::from_str(&line).map_err(|_| RankGroupError::NotJson { rank: r, line })
    }

    /// The same command to every rank; their answers in rank order.
    pub fn all(&mut self, v: &Value, timeout: Duration) -> Result<Vec<Value>> {
        for r in 0..self.len() {
            self.send(r, v)?;
        }
        (0..self.len()).map(|r| self.answer(r, timeout)).collect()
    }

    /// Rank `r`'s process id.
    pub fn pid(&self, r: usize) -> u32 {
        self.ranks[r].child.id()
    }

    /// SIGKILL rank `r`.
    pub fn kill(&mut self, r: usize) {
        let _ = self.ranks[r].child.kill();
        let _ = self.ranks[r].child.wait();
    }
}

/// A channel of the child's stdout lines, read by a thread.
fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    rx
}

impl Drop for RankGroup {
    /// Closes every rank's stdin (their end of input: they clean up and
    /// exit), then SIGKILLs whatever is still running after 5 s.
    fn drop(&mut self) {
        for r in &mut self.ranks {
            r.stdin.take();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        for r in &mut self.ranks {
            while matches!(r.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}
