//! Helpers for multi-process tests: start `tessel` processes on loopback
//! (port 0, the bound address read back from their output), kill them with
//! real signals, and clean up children and folders however a test ends.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

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

/// Starts `tessel ARGS...` and waits for its "listening on ADDR" line.
pub fn spawn_replica(args: &[String]) -> Proc {
    let mut child = Command::new(tessel_bin())
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn tessel");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.split("listening on ").nth(1) {
                let _ = tx.send(addr.trim().to_owned());
            }
        }
    });
    let addr = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(a) => a.parse().expect("address"),
        Err(_) => {
            let _ = child.kill();
            panic!("tessel {args:?} did not report its address");
        }
    };
    Proc { child, addr }
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
