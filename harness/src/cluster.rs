//! Coordinators and workers as processes on this machine (`tessel
//! local`, the benchmarks): on loopback, with one shared certificate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tessel_kv_service::raft::client::RaftKv;
use tessel_tls::TlsFiles;

use super::{Child, LocalError, Ready};

/// How long a child may take to say it is ready.
const START: Duration = Duration::from_secs(120);

/// Everything started so far; dropping it stops every child (workers
/// first) and removes the folder.
pub struct LocalCluster {
    exe: PathBuf,
    /// The workers, in the order started.
    pub workers: Vec<Child>,
    coordinators: Vec<Child>,
    /// The coordinators' addresses, in start order.
    pub addrs: Vec<SocketAddr>,
    /// `--checkpoint-root` of every worker started from now on.
    pub checkpoint_roots: Vec<PathBuf>,
    /// More arguments for every worker (`--plugin-option`s).
    pub worker_args: Vec<String>,
    dir: tempfile::TempDir,
}

impl LocalCluster {
    /// A folder with the cluster's certificates; `exe` is the `tessel`
    /// binary to start. Nothing runs yet.
    pub fn new(exe: PathBuf) -> Result<LocalCluster, LocalError> {
        let dir = crate::scratch::scratch_dir("local").map_err(LocalError::Io)?;
        tessel_tls::init_certs(&dir.path().join("tls"), &["127.0.0.1".into()])
            .map_err(|e| LocalError::Tls(e.to_string()))?;
        Ok(LocalCluster {
            exe,
            workers: Vec::new(),
            coordinators: Vec::new(),
            addrs: Vec::new(),
            checkpoint_roots: Vec::new(),
            worker_args: Vec::new(),
            dir,
        })
    }

    /// The cluster's TLS folder.
    pub fn tls_dir(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    /// The cluster's scratch folder (removed with it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client of the coordinators started so far.
    pub fn client(&self) -> Result<RaftKv, LocalError> {
        let tls = TlsFiles::load(&self.tls_dir()).map_err(|e| LocalError::Tls(e.to_string()))?;
        RaftKv::connect(self.addrs.clone(), Some(&tls)).map_err(LocalError::Kv)
    }

    /// `tessel ARGS`, the binary of this cluster.
    pub fn command(&self) -> Command {
        Command::new(&self.exe)
    }

    /// `tessel worker` for worker `id` of this cluster, with `plugin` a
    /// name or a path.
    pub fn worker_command(&self, id: &str, plugin: &str, devices: usize) -> Command {
        let mut cmd = self.command();
        cmd.args(["worker", "--coordinator"])
            .arg(self.coordinator_list())
            .arg("--tls-dir")
            .arg(self.tls_dir())
            .args(["--plugin", plugin, "--devices", &devices.to_string()])
            .args(["--worker-id", id])
            // Nothing reads a local worker's stdout past its ready line:
            // job output is followed through the key-value service.
            .args(["--echo-job-output", "false"])
            // Command jobs' folders go with the cluster's.
            .arg("--work-dir")
            .arg(self.dir.path().join("work").join(id));
        for root in &self.checkpoint_roots {
            cmd.arg("--checkpoint-root").arg(root);
        }
        cmd.args(&self.worker_args);
        cmd
    }

    fn coordinator_list(&self) -> String {
        let addrs: Vec<String> = self.addrs.iter().map(ToString::to_string).collect();
        addrs.join(",")
    }

    /// Starts `n` workers `w0..` with `devices` devices each and waits
    /// until every one has registered.
    pub fn start_workers(
        &mut self,
        n: u32,
        plugin: &str,
        devices: usize,
    ) -> Result<(), LocalError> {
        for i in 0..n {
            let cmd = self.worker_command(&format!("w{i}"), plugin, devices);
            self.workers
                .push(Child::spawn(&format!("worker w{i}"), cmd, true)?);
        }
        for w in &mut self.workers {
            w.wait_ready(START)?;
        }
        Ok(())
    }

    /// Starts `n` coordinator replicas: the first forms the cluster, the
    /// others join it.
    pub fn start_coordinators(&mut self, n: u64) -> Result<(), LocalError> {
        for id in 1..=n {
            let mut cmd = self.command();
            cmd.args([
                "coordinator",
                "--id",
                &id.to_string(),
                "--listen",
                "127.0.0.1:0",
            ])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("replica-{id}")))
            .arg("--tls-dir")
            .arg(self.tls_dir());
            match self.addrs.first() {
                None => cmd.args(["--peers", &format!("{id}=127.0.0.1:0")]),
                Some(first) => cmd.args(["--join", &first.to_string()]),
            };
            let mut p = Child::spawn(&format!("coordinator {id}"), cmd, true)?;
            let Ready::Coordinator { listen, .. } = p.wait_ready(START)? else {
                return Err(LocalError::Protocol(format!(
                    "coordinator {id} announced something else"
                )));
            };
            self.addrs.push(listen);
            self.coordinators.push(p);
        }
        Ok(())
    }

    /// The coordinators' process ids, in start order.
    pub fn coordinator_pids(&self) -> Vec<u32> {
        self.coordinators.iter().map(Child::pid).collect()
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // Workers first (they revoke their leases), then coordinators,
        // all at once so none outlives its peers long enough to complain.
        Child::terminate_all(&mut self.workers, Duration::from_secs(3));
        Child::terminate_all(&mut self.coordinators, Duration::from_secs(3));
    }
}
