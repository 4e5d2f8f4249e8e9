//! A group of `tessel transfer-rank` processes on loopback, driven over
//! their stdin/stdout (protocol in `src/transfer_cli.rs`).

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::{stdout_lines, tessel_bin};

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
    pub fn start(n: usize, opts: &RankOptions) -> RankGroup {
        let dir = tempfile::tempdir().expect("temp dir");
        let tls = dir.path().join("tls");
        tessel_kvstore::tls::init_certs(&tls, &["127.0.0.1".into()]).expect("certs");
        let mut ranks = Vec::new();
        let mut group = Vec::new();
        for r in 0..n {
            let mut cmd = Command::new(tessel_bin());
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
            if let Some(ids) = &opts.boot_ids {
                cmd.env("TESSEL_BOOT_ID", &ids[r]);
            }
            let mut child = cmd.spawn().expect("spawn tessel transfer-rank");
            let stdin = child.stdin.take();
            let lines = stdout_lines(&mut child);
            let mut rank = RankProc {
                child,
                stdin,
                lines,
            };
            let hello: Value = serde_json::from_str(&rank.line(Duration::from_secs(60)))
                .expect("the rank's address line");
            group.push(json!({"addr": hello["addr"], "boot_id": hello["boot_id"]}));
            ranks.push(rank);
        }
        let mut g = RankGroup { ranks, _dir: dir };
        let group = Value::Array(group);
        for r in 0..n {
            g.send(r, &group);
        }
        g
    }

    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    /// Writes one JSON line to rank `r`.
    pub fn send(&mut self, r: usize, v: &Value) {
        let stdin = self.ranks[r].stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{v}").expect("write to the rank");
        stdin.flush().expect("flush");
    }

    /// Rank `r`'s next answer.
    pub fn answer(&mut self, r: usize, timeout: Duration) -> Value {
        serde_json::from_str(&self.ranks[r].line(timeout)).expect("a JSON answer")
    }

    /// The same command to every rank; their answers in rank order.
    pub fn all(&mut self, v: &Value, timeout: Duration) -> Vec<Value> {
        for r in 0..self.len() {
            self.send(r, v);
        }
        (0..self.len()).map(|r| self.answer(r, timeout)).collect()
    }

    /// SIGKILL rank `r`.
    pub fn kill(&mut self, r: usize) {
        let _ = self.ranks[r].child.kill();
        let _ = self.ranks[r].child.wait();
    }
}

impl RankProc {
    fn line(&mut self, timeout: Duration) -> String {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => l,
            Err(e) => {
                let _ = self.child.kill();
                panic!("rank gave no answer within {timeout:?}: {e}");
            }
        }
    }
}

impl Drop for RankGroup {
    fn drop(&mut self) {
        for r in &mut self.ranks {
            r.stdin.take();
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}
