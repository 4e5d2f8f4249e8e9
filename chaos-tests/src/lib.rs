//! Helpers for multi-process tests: start `tessel` processes (on loopback,
//! or on simulated hosts: [`hosts`], [`cluster`]) with the library's one
//! harness (`tessel_harness::Child`, their readiness line read back), kill
//! them with real signals, and clean up children and folders however a
//! test ends.

pub mod cluster;
pub mod docker;
pub mod faults;
pub mod hosts;
pub mod linearizability;
pub mod mlp;
pub mod nemesis;
pub mod relay;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub use nix::sys::signal::Signal;
use tessel_harness::{Child, Ready};

use tessel_kv_service::raft::client::RaftKv;
use tessel_tls::{init_certs, TlsFiles};

/// The `tessel` binary built alongside these tests.
pub fn tessel_bin() -> PathBuf {
    built_bin("tessel")
}

/// The `tessel-bench` binary (its hidden `transfer-rank` drives the
/// process-level collective tests).
pub fn tessel_bench_bin() -> PathBuf {
    built_bin("tessel-bench")
}

fn built_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    let bin = dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build --bin {name}`",
        bin.display()
    );
    bin
}

/// A coordinator process, killed (SIGKILL) when dropped.
pub struct Proc {
    /// The process.
    pub child: Child,
    /// Its key-value address.
    pub addr: SocketAddr,
    /// `HOST:PORT` of its metrics, when started with `--metrics-listen`.
    pub metrics: Option<String>,
}

impl Proc {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Sends a signal (SIGSTOP, SIGCONT, SIGTERM…).
    pub fn signal(&self, signal: Signal) {
        self.child.signal(signal);
    }
}

/// A `tessel worker` process, killed (SIGKILL) when dropped.
pub struct WorkerProc {
    /// The process.
    pub child: Child,
    /// Its incarnation at its first registration.
    pub incarnation: u64,
    /// `HOST:PORT` of its metrics, when started with `--metrics-listen`.
    pub metrics: Option<String>,
}

impl WorkerProc {
    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Waits up to `within` for its next registration (as a new
    /// incarnation, after a lost one); its incarnation.
    pub fn registered_again(&mut self, within: Duration) -> Option<u64> {
        self.child
            .wait_for(within, |line| match Ready::parse(line)? {
                Ready::Worker {
                    incarnation,
                    again: true,
                    ..
                } => Some(incarnation),
                _ => None,
            })
            .ok()
    }
}

fn log_level() -> String {
    std::env::var("TESSEL_CHAOS_LOG").unwrap_or_else(|_| "error".into())
}

/// Starts `tessel worker` against `cluster` as `worker_id` with `extra`
/// flags, and waits for its registration.
pub fn spawn_worker(cluster: &KvCluster, worker_id: &str, extra: &[&str]) -> WorkerProc {
    spawn_worker_env(cluster, worker_id, extra, &[])
}

/// The flags of a job's workers in these tests: one CPU device,
/// checkpoints under `root`, beating every 300 ms with a 1.5 s TTL.
pub fn job_worker_flags(root: &Path) -> Vec<String> {
    job_worker_flags_beating(root, 300, 1500)
}

/// [`job_worker_flags`] beating every `heartbeat_ms` with a TTL of
/// `ttl_ms`.
pub fn job_worker_flags_beating(root: &Path, heartbeat_ms: u64, ttl_ms: u64) -> Vec<String> {
    let root = root.display().to_string();
    let (heartbeat_ms, ttl_ms) = (heartbeat_ms.to_string(), ttl_ms.to_string());
    [
        "--devices",
        "1",
        "--checkpoint-root",
        &root,
        "--heartbeat-ms",
        &heartbeat_ms,
        "--ttl-ms",
        &ttl_ms,
    ]
    .iter()
    .map(|f| f.to_string())
    .collect()
}

/// [`spawn_worker`] with more environment variables.
pub fn spawn_worker_env(
    cluster: &KvCluster,
    worker_id: &str,
    extra: &[&str],
    env: &[(String, String)],
) -> WorkerProc {
    let coordinators: Vec<String> = cluster.addrs().iter().map(|a| a.to_string()).collect();
    let mut cmd = Command::new(tessel_bin());
    cmd.args(["worker", "--coordinator", &coordinators.join(",")])
        .arg("--tls-dir")
        .arg(cluster.tls_dir())
        .args(["--plugin", "cpu", "--worker-id", worker_id])
        .args(extra)
        .envs(env.iter().map(|(k, v)| (k, v)));
    spawn_worker_cmd(cmd, worker_id).unwrap_or_else(|e| panic!("{e}"))
}

/// Starts a prepared `tessel worker` command and waits for its
/// registration; the error carries what it said when it exited or fell
/// silent.
pub fn spawn_worker_cmd(mut cmd: Command, name: &str) -> Result<WorkerProc, String> {
    let stderr = tempfile::NamedTempFile::new().expect("a temp file");
    cmd.env("RUST_LOG", log_level())
        .stderr(stderr.reopen().expect("reopen"));
    let mut child = Child::spawn(name, cmd, false).map_err(|e| e.to_string())?;
    match child.wait_ready(Duration::from_secs(60)) {
        Ok(Ready::Worker {
            incarnation,
            metrics,
            ..
        }) => Ok(WorkerProc {
            child,
            incarnation,
            metrics: metrics.map(|m| m.to_string()),
        }),
        other => {
            child.kill();
            Err(format!(
                "worker {name} did not register ({other:?}): {}",
                std::fs::read_to_string(stderr.path()).unwrap_or_default()
            ))
        }
    }
}

/// Starts `tessel ARGS...` (a coordinator) and waits until it is ready.
pub fn spawn_replica(args: &[String]) -> Proc {
    spawn_replica_env(args, &[])
}

/// [`spawn_replica`] with more environment variables.
pub fn spawn_replica_env(args: &[String], env: &[(String, String)]) -> Proc {
    let mut cmd = Command::new(tessel_bin());
    cmd.args(args).envs(env.iter().map(|(k, v)| (k, v)));
    spawn_replica_cmd(cmd)
}

/// Starts a prepared `tessel coordinator` command and waits until it is
/// ready (with `--join`: a member).
pub fn spawn_replica_cmd(mut cmd: Command) -> Proc {
    cmd.env("RUST_LOG", log_level());
    let mut child = Child::spawn("coordinator", cmd, false).expect("spawn tessel");
    match child.wait_ready(Duration::from_secs(60)) {
        Ok(Ready::Coordinator {
            listen, metrics, ..
        }) => Proc {
            child,
            addr: listen,
            metrics: metrics.map(|m| m.to_string()),
        },
        other => panic!("a coordinator did not start: {other:?}"),
    }
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
    /// The replica id.
    pub id: u64,
    /// `HOST:PORT` to listen on.
    pub listen: String,
    /// Its data folder.
    pub data_dir: &'a Path,
    /// The cluster's TLS folder.
    pub tls_dir: &'a Path,
    /// `Some(addr)`: join the cluster of `addr`; `None`: bootstrap alone.
    pub join: Option<SocketAddr>,
    /// More arguments, appended.
    pub extra: &'a [&'a str],
}

/// The `tessel` arguments that start the replica.
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
    /// The cluster's client certificate.
    pub tls: TlsFiles,
    /// Replicas by id.
    pub procs: BTreeMap<u64, Proc>,
    /// More environment for replica `id`'s process, each time it starts.
    pub env: BTreeMap<u64, Vec<(String, String)>>,
}

impl KvCluster {
    /// The cluster's TLS folder.
    pub fn tls_dir(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    /// Replica `id`'s data folder.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("replica-{id}"))
    }

    /// Replica 1 bootstraps alone; the others join it.
    pub fn start(n: u64, extra: &[&str]) -> KvCluster {
        let mut c = KvCluster::prepare();
        c.start_prepared(n, extra);
        c
    }

    /// The folders and certificates, no replica started yet (a test may
    /// mount something at a [`KvCluster::data_dir`] first).
    pub fn prepare() -> KvCluster {
        let dir = tempfile::tempdir().unwrap();
        init_certs(&dir.path().join("tls"), &["127.0.0.1".into()]).unwrap();
        let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
        KvCluster {
            dir,
            tls,
            procs: BTreeMap::new(),
            env: BTreeMap::new(),
        }
    }

    /// [`KvCluster::start`] on a prepared cluster.
    pub fn start_prepared(&mut self, n: u64, extra: &[&str]) {
        let c = self;
        let first = c.spawn(1, "127.0.0.1:0".into(), None, extra);
        c.procs.insert(1, first);
        for id in 2..=n {
            let p = c.spawn(id, "127.0.0.1:0".into(), Some(c.procs[&1].addr), extra);
            c.procs.insert(id, p);
        }
    }

    /// Starts replica `id` (not yet in `procs`).
    pub fn spawn(&self, id: u64, listen: String, join: Option<SocketAddr>, extra: &[&str]) -> Proc {
        let data = self.data_dir(id);
        let tls = self.tls_dir();
        let args = replica_args(&ReplicaSpec {
            id,
            listen,
            data_dir: &data,
            tls_dir: &tls,
            join,
            extra,
        });
        spawn_replica_env(&args, self.env.get(&id).map_or(&[], Vec::as_slice))
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
        let p = spawn_replica_env(&args, self.env.get(&id).map_or(&[], Vec::as_slice));
        self.procs.insert(id, p);
    }

    /// Every replica's address.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.procs.values().map(|p| p.addr).collect()
    }

    /// A client that knows every replica.
    pub fn client(&self) -> RaftKv {
        RaftKv::connect(self.addrs(), Some(&self.tls)).unwrap()
    }

    /// `tessel ARGS --coordinator (every replica) --tls-dir (the
    /// cluster's)`, run to its end.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        let addrs: Vec<String> = self.addrs().iter().map(|a| a.to_string()).collect();
        Command::new(tessel_bin())
            .args(args)
            .args(["--coordinator", &addrs.join(",")])
            .arg("--tls-dir")
            .arg(self.tls_dir())
            .output()
            .unwrap()
    }

    /// A client that knows only replica `id`.
    pub fn client_of(&self, id: u64) -> RaftKv {
        RaftKv::connect(vec![self.procs[&id].addr], Some(&self.tls)).unwrap()
    }

    /// The first replica that is none of `not` (a follower, given the
    /// leader).
    pub fn replica_other_than(&self, not: &[u64]) -> u64 {
        *self
            .procs
            .keys()
            .find(|id| !not.contains(id))
            .expect("a replica left")
    }

    /// A client of every replica but `id` (the survivors of its loss).
    pub fn client_without(&self, id: u64) -> RaftKv {
        let addrs = self
            .procs
            .iter()
            .filter(|(i, _)| **i != id)
            .map(|(_, p)| p.addr)
            .collect();
        RaftKv::connect(addrs, Some(&self.tls)).unwrap()
    }

    /// Restarts replica `id` (a supervisor's part) and proves it rejoined
    /// a cluster of three: with the third replica (not the leader, so no
    /// election) stopped, a write commits only with it. Returns how long
    /// that took from the restart, start-up included.
    pub async fn restart_and_prove_rejoined(&mut self, id: u64) -> Duration {
        let back = std::time::Instant::now();
        self.restart(id);
        let leader = self.leader().await;
        let other = self.replica_other_than(&[id, leader]);
        self.procs[&other].signal(Signal::SIGSTOP);
        let kv = self.client();
        let value = id.to_le_bytes();
        let put = tessel_kv::KvStore::put(&kv, b"rejoined", &value);
        let done = tokio::time::timeout(Duration::from_secs(30), put).await;
        self.procs[&other].signal(Signal::SIGCONT);
        match done {
            Ok(Ok(_)) => back.elapsed(),
            other_outcome => {
                panic!("no write with replica {id} back and {other} stopped: {other_outcome:?}")
            }
        }
    }

    /// The leader's id, once one is elected (panics after 20 s).
    pub async fn leader(&self) -> u64 {
        leader_of(&self.client(), Duration::from_secs(20)).await
    }
}

/// Puts `{prefix}/{i:04}` = `i` (little-endian) for `i` in `0..n`, one at a
/// time, in the background; the `i` of every acknowledged put.
pub fn write_in_background(
    kv: std::sync::Arc<RaftKv>,
    prefix: &str,
    n: u32,
) -> tokio::task::JoinHandle<Vec<u32>> {
    use tessel_kv::KvStore;
    let prefix = prefix.to_owned();
    tokio::spawn(async move {
        let mut acked = Vec::new();
        for i in 0..n {
            let key = format!("{prefix}/{i:04}");
            if kv.put(key.as_bytes(), &i.to_le_bytes()).await.is_ok() {
                acked.push(i);
            }
        }
        acked
    })
}

/// The id of the replica that `kv` finds reporting itself leader, once one
/// does (panics after `within`).
pub async fn leader_of(kv: &RaftKv, within: Duration) -> u64 {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        for (_, s) in kv.cluster_status().await {
            if let Ok(s) = s {
                if s.state == "Leader" {
                    return s.id;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no leader within {within:?}");
}
