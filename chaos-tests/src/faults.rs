//! Faults a test injects into processes on this machine, each undone when
//! its value is dropped:
//! * [`Tmpfs`]: a size-limited filesystem for a data folder, filled to
//!   ENOSPC by a filler file and freed by removing it;
//! * [`faketime_env`] and [`step_clock`]: a process's wall clock under
//!   libfaketime (Debian's `faketime`), stepped through its offset file;
//!   monotonic time is left real, as an NTP step or a resumed VM does;
//! * [`disk_shim`] and [`disk_fault_env`]: an LD_PRELOAD shim
//!   (`chaos-tests/shim/disk_faults.c`, built with cc) that fails a
//!   process's writes and syncs on some files with EIO, or slows them,
//!   while a fault file says so;
//! * [`PortDrop`]: iptables rules on loopback dropping UDP datagrams from
//!   one port to another (one-way partitions between QUIC endpoints);
//!   [`udp_ports`] names every port a process sends from, so that a cut
//!   between two processes covers all their sockets, as a cut between two
//!   hosts does (a replica's Raft core has a socket of its own, node
//!   invariant 11).
//!   Rules carry the test process's pid, and [`sweep_stale_rules`] removes
//!   those of tests that died without dropping theirs.
//!
//! These need root, as the simulated hosts do.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// libfaketime's library, from Debian's `faketime`.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A tmpfs mounted at a folder, lazily unmounted when dropped (processes
/// still using it keep it until they end).
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`48m`) at `at`.
    pub fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs at {} needs root", at.display());
        Tmpfs(at.to_owned())
    }

    /// Writes a filler file until the filesystem is full; returns it.
    pub fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0x5a; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The environment that puts a process's wall clock under libfaketime,
/// offset by what `file` holds (`+0`, `+1h`, `-30m`), re-read every second.
pub fn faketime_env(file: &Path) -> Vec<(String, String)> {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's faketime (scripts/test does)"
    );
    if !file.exists() {
        std::fs::write(file, "+0").unwrap();
    }
    [
        ("LD_PRELOAD", LIBFAKETIME.to_owned()),
        ("FAKETIME_TIMESTAMP_FILE", file.display().to_string()),
        ("FAKETIME_CACHE_DURATION", "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec()
}

/// Puts every replica of `c` (ids `1..=n`, not started yet) under
/// libfaketime; returns each one's offset file (index `id - 1`).
pub fn faketime_replicas(c: &mut crate::KvCluster, n: u64) -> Vec<PathBuf> {
    (1..=n)
        .map(|id| {
            let file = c.dir.path().join(format!("clock-{id}"));
            c.env.insert(id, faketime_env(&file));
            file
        })
        .collect()
}

/// Steps the wall clock of the processes reading `file` to `offset`, and
/// waits until libfaketime's one-second cache has seen it.
pub async fn step_clock(file: &Path, offset: &str) {
    std::fs::write(file, offset).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

/// Builds the disk-fault shim into `dir`; returns the library's path.
pub fn disk_shim(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("shim/disk_faults.c");
    let out = dir.join("disk_faults.so");
    let ok = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-ldl")
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "building {} with cc failed", src.display());
    out
}

/// The environment that puts the shim under a process: writes and syncs
/// of files whose path contains `matching` fail or slow down as `fault`
/// says (`eio`, `slow MS`, or empty: nothing).
pub fn disk_fault_env(shim: &Path, fault: &Path, matching: &Path) -> Vec<(String, String)> {
    if !fault.exists() {
        std::fs::write(fault, "").unwrap();
    }
    [
        ("LD_PRELOAD", shim.display().to_string()),
        ("TESSEL_FAULT_FILE", fault.display().to_string()),
        ("TESSEL_FAULT_MATCH", matching.display().to_string()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .to_vec()
}

/// The local ports of process `pid`'s UDP sockets (IPv4 and IPv6), read
/// from its open files and `/proc/PID/net/udp{,6}`; empty if it is gone.
pub fn udp_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["udp", "udp6"] {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(inode)) = (f.get(1), f.get(9)) else {
                continue;
            };
            let port = local
                .rsplit_once(':')
                .map(|(_, p)| u16::from_str_radix(p, 16));
            if let (true, Some(Ok(port))) = (inodes.iter().any(|i| i == inode), port) {
                ports.push(port);
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

fn tag() -> String {
    format!("tessel-test-{}", std::process::id())
}

fn iptables(op: &str, from: u16, to: u16, tag: &str) -> bool {
    Command::new("iptables")
        .args([op, "OUTPUT", "-o", "lo", "-p", "udp"])
        .args(["--sport", &from.to_string(), "--dport", &to.to_string()])
        .args(["-m", "comment", "--comment", tag, "-j", "DROP"])
        .status()
        .is_ok_and(|s| s.success())
}

/// Datagrams on loopback from each `(from, to)` UDP port pair dropped
/// while it lives.
pub struct PortDrop(Vec<(u16, u16)>);

impl PortDrop {
    /// Drops what goes from port `from` to port `to`, for every pair.
    pub fn new(pairs: &[(u16, u16)]) -> PortDrop {
        for &(from, to) in pairs {
            assert!(iptables("-I", from, to, &tag()), "iptables needs root");
        }
        PortDrop(pairs.to_vec())
    }

    /// Datagrams the rules of this test process have dropped so far (a
    /// cut that drops nothing was not a cut).
    pub fn dropped(&self) -> u64 {
        let out = Command::new("iptables")
            .args(["-L", "OUTPUT", "-v", "-n", "-x"])
            .output()
            .expect("iptables");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&tag()))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for PortDrop {
    fn drop(&mut self) {
        for &(from, to) in &self.0 {
            iptables("-D", from, to, &tag());
        }
    }
}

/// Removes the rules of test processes that are gone.
pub fn sweep_stale_rules() {
    let Ok(out) = Command::new("iptables").args(["-S", "OUTPUT"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(pid) = line
            .split_whitespace()
            .find_map(|w| w.trim_matches('"').strip_prefix("tessel-test-"))
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let rule: Vec<&str> = line.split_whitespace().skip(2).collect();
        let _ = Command::new("iptables")
            .args(["-D", "OUTPUT"])
            .args(rule.iter().map(|w| w.trim_matches('"')))
            .status();
    }
}
