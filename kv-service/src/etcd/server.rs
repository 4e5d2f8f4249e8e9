//! A real etcd cluster of `etcd` processes on loopback, for tests and
//! benchmarks (Debian's `etcd-server`).
//!
//! etcd needs every peer URL before the first member starts, so ports are
//! picked by binding port 0 and releasing it just before `etcd` starts.
//! Another process may take one in that window (an outgoing connection's
//! ephemeral port comes from the same range, and other clusters of the same
//! test binary start beside this one): a cluster whose member could not
//! bind its port is torn down and formed again on fresh ports.
//! Every process is killed and its data removed when the value is dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use etcd_client::Client;

use tessel_kv::{KvError, Result};

/// The request size etcd accepts: above tessel's 4 MiB value limit.
pub const MAX_REQUEST_BYTES: u64 = 10 << 20;

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// Clusters formed before giving up when a member finds its port taken.
const START_ATTEMPTS: usize = 4;

/// What a member's log says when its port was taken.
const PORT_TAKEN: &str = "address already in use";

/// Lines of a member's log an error quotes (the log goes with the cluster).
const LOG_TAIL_LINES: usize = 5;

/// N `etcd` processes forming one cluster.
pub struct EtcdServers {
    members: Vec<Member>,
    dir: tempfile::TempDir,
    initial_cluster: String,
    binary: PathBuf,
}

fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| KvError::Unavailable(format!("no free port: {e}")))
}

/// The `etcd` binary: `$TESSEL_ETCD`, else `etcd` on the PATH.
pub fn etcd_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TESSEL_ETCD") {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            KvError::Unavailable(
                "no `etcd` binary on the PATH (Debian: apt-get install etcd-server)".into(),
            )
        })
}

impl EtcdServers {
    /// Starts `n` members and waits until every one answers.
    pub async fn start(n: usize) -> Result<EtcdServers> {
        let mut attempt = 1;
        loop {
            let last = attempt == START_ATTEMPTS;
            if let Some(cluster) = Self::start_once(n, last).await? {
                return Ok(cluster);
            }
            tracing::warn!("etcd cluster on taken ports (attempt {attempt}), forming it again");
            attempt += 1;
        }
    }

    /// One attempt; `None` when a member found its port taken, unless this
    /// is the `last` attempt (then that is an error like any other).
    async fn start_once(n: usize, last: bool) -> Result<Option<EtcdServers>> {
        let binary = etcd_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("tessel-etcd-")
            .tempdir()
            .map_err(|e| KvError::Internal(format!("temp dir: {e}")))?;
        let mut members = Vec::new();
        for i in 0..n {
            members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                child: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdServers {
            members,
            dir,
            initial_cluster,
            binary,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for i in 0..n {
            if let Err(e) = cluster.wait_ready(i).await {
                let port_taken = (0..n).any(|j| cluster.log_text(j).contains(PORT_TAKEN));
                return if port_taken && !last {
                    Ok(None)
                } else {
                    Err(e)
                };
            }
        }
        Ok(Some(cluster))
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let m = &self.members[i];
        let data = self.dir.path().join(&m.name);
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", m.name)))
            .map_err(|e| KvError::Internal(format!("etcd log file: {e}")))?;
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(&self.binary)
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "tessel"])
            // Faster elections than the defaults (100 ms / 1 s), as the
            // Raft replicas use; fsync stays on.
            .args(["--heartbeat-interval", "100"])
            .args(["--election-timeout", "1000"])
            .args(["--max-request-bytes", &MAX_REQUEST_BYTES.to_string()])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| KvError::Unavailable(format!("cannot start etcd: {e}")))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self, i: usize) -> Result<()> {
        let endpoint = self.endpoint(i);
        for _ in 0..200 {
            if let Some(c) = self.members[i].child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(KvError::Unavailable(format!(
                        "etcd member {i} exited with {status}; its log ends: {}",
                        self.log_tail(i)
                    )));
                }
            }
            if let Ok(Ok(mut c)) =
                tokio::time::timeout(Duration::from_secs(1), Client::connect([&endpoint], None))
                    .await
            {
                if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(1), c.status()).await {
                    if s.leader() != 0 {
                        return Ok(());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(KvError::Unavailable(format!(
            "etcd member {i} not ready in 20 s; its log ends: {}",
            self.log_tail(i)
        )))
    }

    /// Member `i`'s log so far (empty if unreadable).
    fn log_text(&self, i: usize) -> String {
        std::fs::read_to_string(self.log(i)).unwrap_or_default()
    }

    /// The last lines of member `i`'s log, on one line.
    fn log_tail(&self, i: usize) -> String {
        let text = self.log_text(i);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join(" | ")
    }

    /// Member `i`'s log file.
    pub fn log(&self, i: usize) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", self.members[i].name))
    }

    /// The server's data folder.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `http://127.0.0.1:PORT` of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's endpoint.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The `etcd://` URL of the whole cluster.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// The process id of member `i`, if running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    /// The index of the member that leads now.
    pub async fn leader(&self) -> Result<usize> {
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                continue;
            }
            let Ok(Ok(mut c)) = tokio::time::timeout(
                Duration::from_secs(1),
                Client::connect([self.endpoint(i)], None),
            )
            .await
            else {
                continue;
            };
            if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(1), c.status()).await {
                let me = s.header().map(|h| h.member_id()).unwrap_or(0);
                if me != 0 && s.leader() == me {
                    return Ok(i);
                }
            }
        }
        Err(KvError::Unavailable("no etcd member leads".into()))
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Restarts members from their data dirs (killing any still running),
    /// all before waiting, since a lone member has no quorum; waits until
    /// each answers.
    pub async fn restart(&mut self, members: &[usize]) -> Result<()> {
        for &i in members {
            self.kill(i);
            self.spawn(i)?;
        }
        for &i in members {
            self.wait_ready(i).await?;
        }
        Ok(())
    }
}

impl Drop for EtcdServers {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
