//! A group of `tessel-bench transfer-rank` processes on loopback, driven over
//! their stdin/stdout (the protocol is described in
//! [`crate::transfer_rank`]): used by the multi-process tests and by
//! `tessel-bench transfer`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use tessel_harness::{Child, LocalError};

/// What can go wrong driving the group.
#[derive(Debug, thiserror::Error)]
pub enum RankGroupError {
    /// A rank's process failed.
    #[error("rank {rank}: {source}")]
    Child {
        /// The rank.
        rank: usize,
        /// What failed.
        source: LocalError,
    },
    /// Certificates could not be made.
    #[error("cannot create the group's TLS folder: {0}")]
    Tls(String),
    /// A rank printed something that is not JSON.
    #[error("rank {rank} answered {line:?}, not JSON")]
    NotJson {
        /// The rank.
        rank: usize,
        /// What it printed.
        line: String,
    },
}

/// The module's result type.
pub type Result<T, E = RankGroupError> = std::result::Result<T, E>;

/// How to start the group.
#[derive(Debug, Clone, Default)]
pub struct RankOptions {
    /// Use the network between ranks on this host.
    pub force_network: bool,
    /// A boot id per rank (`TESSEL_BOOT_ID`), to make ranks look like
    /// different hosts; `None`: the real one.
    pub boot_ids: Option<Vec<String>>,
    /// Deadline of each collective (`--timeout-ms`).
    pub timeout_ms: Option<u64>,
    /// Largest ring message (`--chunk-bytes`).
    pub chunk_bytes: Option<usize>,
    /// Keep same-host collectives on the ring (`--no-arenas`).
    pub no_arenas: bool,
    /// Network payloads over plain TCP (`--transfer-encryption off`).
    pub plain: bool,
    /// Encrypted network payloads over QUIC streams (`--quic-payloads`).
    pub quic_payloads: bool,
}

/// The ranks, killed (SIGKILL) when dropped, with their TLS folder.
pub struct RankGroup {
    ranks: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl RankGroup {
    /// Starts `n` ranks of `tessel` (the binary at `bin`) and tells each
    /// the group.
    pub fn start(bin: &Path, n: usize, opts: &RankOptions) -> Result<RankGroup> {
        let tls_err = |e: String| RankGroupError::Tls(e);
        let dir =
            tessel_harness::scratch::scratch_dir("ranks").map_err(|e| tls_err(e.to_string()))?;
        let tls = dir.path().join("tls");
        tessel_tls::init_certs(&tls, &["127.0.0.1".into()]).map_err(|e| tls_err(e.to_string()))?;
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
            if opts.plain {
                cmd.args(["--transfer-encryption", "off"]);
            }
            if opts.quic_payloads {
                cmd.arg("--quic-payloads");
            }
            if let Some(ids) = &opts.boot_ids {
                cmd.env("TESSEL_BOOT_ID", &ids[r]);
            }
            let child = Child::spawn(&format!("rank {r}"), cmd, false)
                .map_err(|source| RankGroupError::Child { rank: r, source })?;
            g.ranks.push(child);
            let hello = g.answer(r, Duration::from_secs(60))?;
            group.push(json!({"addr": hello["addr"], "boot_id": hello["boot_id"]}));
        }
        let group = Value::Array(group);
        for r in 0..n {
            g.send(r, &group)?;
        }
        Ok(g)
    }

    /// How many ranks.
    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    /// Whether there is no rank.
    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    /// Writes one JSON line to rank `r`.
    pub fn send(&mut self, r: usize, v: &Value) -> Result<()> {
        self.ranks[r]
            .send_line(&v.to_string())
            .map_err(|source| RankGroupError::Child { rank: r, source })
    }

    /// Rank `r`'s next answer.
    pub fn answer(&mut self, r: usize, timeout: Duration) -> Result<Value> {
        let line = self.ranks[r]
            .next_line(timeout)
            .map_err(|source| RankGroupError::Child { rank: r, source })?;
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
        self.ranks[r].pid()
    }

    /// SIGKILL rank `r`.
    pub fn kill(&mut self, r: usize) {
        self.ranks[r].kill();
    }
}

impl Drop for RankGroup {
    /// Closes every rank's stdin (their end of input: they clean up and
    /// exit), then SIGKILLs whatever is still running after 5 s.
    fn drop(&mut self) {
        for r in &mut self.ranks {
            r.close_stdin();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        for r in &mut self.ranks {
            r.reap_by(deadline);
        }
    }
}
