//! Helpers for multi-process tests: start `tessel` processes on loopback
//! (port 0, the bound address read back from their output), kill them with
//! real signals, and clean up children and folders however a test ends.

pub mod cluster;
pub mod hosts;
pub mod linearizability;
pub mod relay;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tessel_kvstore::raft::client::RaftKv;
use tessel_net::tls::{init_certs, TlsFiles};

/// The `tessel` binary built alongside these tests.
pub fn tessel_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let bin = dir.join("tessel");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build --bin tessel`",
        bin.display()
    );
    bin
}

/// A child process that is killed (SIGKILL) when dropped.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    /// `HOST:PORT` of its metrics, when started with `--metrics-listen`.
    pub metrics: Option<String>,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal by name (STOP, CONT, TERM) with kill(1).
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([format!("-{name}"), self.pid().to_string()])
            .status()
            .expect("kill(1)")
            .success();
        assert!(ok, "kill -{name} {}", self.pid());
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Resume a stopped child so SIGKILL is not delayed, then kill it.
        let _ = Command::new("kill")
            .args(["-CONT", &self.pid().to_string()])
            .status();
        self.kill();
    }
}

/// A channel of the child's stdout lines, read by a thread.
fn stdout_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// A `tessel worker` process, killed (SIGKILL) when dropped.
pub struct WorkerProc {
    pub child: Child,
    pub incarnation: u64,
    /// `HOST:PORT` of its metrics, when started with `--metrics-listen`.
    pub metrics: Option<String>,
    /// Its stdout lines after the registration line.
    pub lines: mpsc::Receiver<String>,
}

impl WorkerProc {
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `within` for a line that `pick` takes.
    pub fn wait_line<T>(&self, within: Duration, pick: impl Fn(&str) -> Option<T>) -> Option<T> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self.lines.recv_timeout(left).ok()?;
            if let Some(t) = pick(&line) {
                return Some(t);
            }
        }
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The incarnation in a worker's "registered as incarnation N" line.
pub fn registered_incarnation(line: &str) -> Option<u64> {
    line.split(" registered as incarnation ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn log_level() -> String {
    std::env::var("TESSEL_CHAOS_LOG").unwrap_or_else(|_| "error".into())
}

/// Starts `tessel worker` against `cluster` as `worker_id` with `extra`
/// flags, and waits for its registration line.
pub fn spawn_worker(cluster: &KvCluster, worker_id: &str, extra: &[&str]) -> WorkerProc {
    let coordinators: Vec<String> = cluster.addrs().iter().map(|a| a.to_string()).collect();
    let mut cmd = Command::new(tessel_bin());
    cmd.args(["worker", "--coordinator", &coordinators.join(",")])
        .arg("--tls-dir")
        .arg(cluster.tls_dir())
        .args(["--plugin", "cpu", "--worker-id", worker_id])
        .args(extra);
    spawn_worker_cmd(cmd, worker_id).unwrap_or_else(|e| panic!("{e}"))
}

/// Starts a prepared `tessel worker` command and waits for its
/// registration line; the error carries what it printed when it exited or
/// fell silent.
pub fn spawn_worker_cmd(mut cmd: Command, name: &str) -> Result<WorkerProc, String> {
    let mut child = cmd
        .env("RUST_LOG", log_level())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tessel worker");
    let stderr = stderr_tail(&mut child);
    let rx = stdout_lines(&mut child);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut metrics = None;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "worker {name} did not register: {}",
                stderr.lock().unwrap().join("\n")
            ));
        };
        metrics = metrics.or_else(|| metrics_address(&line));
        if let Some(incarnation) = registered_incarnation(&line) {
            return Ok(WorkerProc {
                child,
                incarnation,
                metrics,
                lines: rx,
            });
        }
    }
}

/// The last lines a child wrote to stderr (also echoed to ours).
fn stderr_tail(child: &mut Child) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    let tail = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stderr = child.stderr.take().expect("stderr");
    let t = tail.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            let mut t = t.lock().unwrap();
            t.push(line);
            if t.len() > 20 {
                t.remove(0);
            }
        }
    });
    tail
}

/// Starts `tessel ARGS...` and waits for its "listening on ADDR" line.
pub fn spawn_replica(args: &[String]) -> Proc {
    let mut cmd = Command::new(tessel_bin());
    cmd.args(args);
    spawn_replica_cmd(cmd, args.iter().any(|a| a == "--join"))
}

/// Starts a prepared `tessel coordinator` command and waits for its
/// "listening on ADDR" line (and "joined", when `joining`).
pub fn spawn_replica_cmd(mut cmd: Command, joining: bool) -> Proc {
    let mut child = cmd
        .env("RUST_LOG", log_level())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn tessel");
    let rx = stdout_lines(&mut child);
    // A joining replica is only a member once it printed "joined": until
    // then the cluster may be in a joint configuration.
    let (mut addr, mut metrics) = (None, None);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while addr.is_none() || joining {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            let _ = child.kill();
            panic!(
                "{cmd:?} did not report its address{}",
                if joining { " and join" } else { "" }
            );
        };
        if let Some(a) = line.split("listening on ").nth(1) {
            addr = Some(a.trim().parse().expect("address"));
        }
        metrics = metrics.or_else(|| metrics_address(&line));
        if line.ends_with(" joined") {
            break;
        }
    }
    let addr = addr.expect("address reported");
    Proc {
        child,
        addr,
        metrics,
    }
}

/// The address in a "metrics on http://HOST:PORT/metrics" line.
fn metrics_address(line: &str) -> Option<String> {
    let addr = line.strip_prefix("metrics on http://")?;
    Some(addr.trim_end_matches("/metrics").to_owned())
}

/// `GET /metrics` from `addr`; the body.
pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

/// The value of the first sample whose line starts with `name` and
/// contains every one of `labels`.
pub fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A replica's command line.
pub struct ReplicaSpec<'a> {
    pub id: u64,
    pub listen: String,
    pub data_dir: &'a Path,
    pub tls_dir: &'a Path,
    /// `Some(addr)`: join the cluster of `addr`; `None`: bootstrap alone.
    pub join: Option<SocketAddr>,
    pub extra: &'a [&'a str],
}

pub fn replica_args(s: &ReplicaSpec<'_>) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "coordinator".into(),
        "--id".into(),
        s.id.to_string(),
        "--listen".into(),
        s.listen.clone(),
        "--data-dir".into(),
        s.data_dir.display().to_string(),
        "--tls-dir".into(),
        s.tls_dir.display().to_string(),
    ];
    match s.join {
        Some(j) => a.extend(["--join".into(), j.to_string()]),
        None => a.extend(["--peers".into(), format!("{}={}", s.id, s.listen)]),
    }
    a.extend(s.extra.iter().map(|x| x.to_string()));
    a
}

/// A cluster of `tessel coordinator` processes with mutual TLS.
pub struct KvCluster {
    /// Holds the data and TLS folders; removed on drop.
    pub dir: tempfile::TempDir,
    pub tls: TlsFiles,
    pub procs: BTreeMap<u64, Proc>,
}

impl KvCluster {
    pub fn tls_dir(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("replica-{id}"))
    }

    /// Replica 1 bootstraps alone; the others join it.
    pub fn start(n: u64, extra: &[&str]) -> KvCluster {
        let dir = tempfile::tempdir().unwrap();
        init_certs(&dir.path().join("tls"), &["127.0.0.1".into()]).unwrap();
        let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
        let mut c = KvCluster {
            dir,
            tls,
            procs: BTreeMap::new(),
        };
        let first = c.spawn(1, "127.0.0.1:0".into(), None, extra);
        c.procs.insert(1, first);
        for id in 2..=n {
            let p = c.spawn(id, "127.0.0.1:0".into(), Some(c.procs[&1].addr), extra);
            c.procs.insert(id, p);
        }
        c
    }

    pub fn spawn(&self, id: u64, listen: String, join: Option<SocketAddr>, extra: &[&str]) -> Proc {
        let data = self.data_dir(id);
        let tls = self.tls_dir();
        spawn_replica(&replica_args(&ReplicaSpec {
            id,
            listen,
            data_dir: &data,
            tls_dir: &tls,
            join,
            extra,
        }))
    }

    /// Restarts replica `id` on its old address from its data folder.
    pub fn restart(&mut self, id: u64) {
        let addr = self.procs[&id].addr;
        let data = self.data_dir(id);
        let tls = self.tls_dir();
        let mut args = replica_args(&ReplicaSpec {
            id,
            listen: addr.to_string(),
            data_dir: &data,
            tls_dir: &tls,
            join: None,
            extra: &[],
        });
        // The cluster is already formed: no peer list needed.
        let at = args.iter().position(|a| a == "--peers").unwrap();
        args.drain(at..at + 2);
        let p = spawn_replica(&args);
        self.procs.insert(id, p);
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.procs.values().map(|p| p.addr).collect()
    }

    pub fn client(&self) -> RaftKv {
        RaftKv::connect(self.addrs(), Some(&self.tls)).unwrap()
    }

    /// A client that knows only replica `id`.
    pub fn client_of(&self, id: u64) -> RaftKv {
        RaftKv::connect(vec![self.procs[&id].addr], Some(&self.tls)).unwrap()
    }

    pub async fn leader(&self) -> u64 {
        for _ in 0..200 {
            for (_, s) in self.client().cluster_status().await {
                if let Ok(s) = s {
                    if s.state == "Leader" {
                        return s.id;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no leader");
    }
}
