//! Simulated hosts on one machine: each a network namespace on a private
//! bridge (10.77.N.0/24), and every process started in it gets that
//! host's hostname, its own `/dev/shm`, its own boot id and its own disk
//! (a folder mounted at the same path on every host, [`Hosts::disk`]), so
//! nothing is shared between hosts unless a test says so
//! ([`Hosts::shared`]). Partitions are iptables rules inside a host's
//! namespace.
//!
//! Invariants:
//! 1. Everything is named after this process's pid and a counter
//!    (`t{pid}n{k}…`), so parallel runs and successive tests never meet,
//!    and a run finds and removes what a dead run left behind.
//! 2. Dropping [`Hosts`] kills every process in its namespaces and removes
//!    the namespaces, the bridge, its forwarding rule and the folders,
//!    however the test ended.
//! 3. Traffic stays on the bridge: only addresses of namespaces made here
//!    (and the bridge's own, for the test process) are ever used.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One simulated host.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its hostname.
    pub name: String,
    /// Its network namespace.
    pub ns: String,
    /// Its address on the bridge.
    pub ip: Ipv4Addr,
    /// This host's own folder, mounted at [`Hosts::disk`] inside it.
    pub disk: PathBuf,
    /// The boot id its processes see.
    pub boot_id: String,
}

/// A bridge and the hosts on it.
pub struct Hosts {
    tag: String,
    bridge: String,
    subnet: u8,
    dir: tempfile::TempDir,
    /// The hosts, in the order made.
    pub hosts: Vec<Host>,
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run(Command::new("ip").args(args))
}

/// The FORWARD rule that lets the bridge carry traffic between its ports
/// (Docker sets the chain's policy to DROP).
fn forward_rule(op: &str, bridge: &str) -> Result<(), String> {
    run(Command::new("iptables").args([op, "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]))
}

/// The pid in a name of ours (`t{pid}n…`).
fn owner(name: &str) -> Option<&str> {
    let (pid, _) = name.strip_prefix('t')?.split_once('n')?;
    pid.bytes().all(|b| b.is_ascii_digit()).then_some(pid)
}

/// Hosts made by this process so far (invariant 1).
static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Removes what runs of dead processes left (invariant 1).
fn sweep_stale() {
    let alive = |pid: &str| Path::new(&format!("/proc/{pid}")).exists();
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let ns = line.split_whitespace().next().unwrap_or("");
            if let Some(pid) = owner(ns) {
                if !alive(pid) {
                    kill_all_in(ns);
                    let _ = ip(&["netns", "del", ns]);
                }
            }
        }
    }
    if let Ok(out) = Command::new("ip")
        .args(["-o", "link", "show", "type", "bridge"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split(':').nth(1).unwrap_or("").trim();
            if let Some(pid) = owner(name) {
                if !alive(pid) {
                    let _ = forward_rule("-D", name);
                    let _ = ip(&["link", "del", name]);
                }
            }
        }
    }
}

/// SIGKILL to every process in namespace `ns`; waits (up to 5 s) until
/// they are gone, so the namespace goes with its interfaces.
fn kill_all_in(ns: &str) {
    let pids = || -> Vec<String> {
        Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = pids();
        if left.is_empty() || std::time::Instant::now() > deadline {
            return;
        }
        for pid in &left {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Whether this machine can make hosts: root, `ip`, `unshare`, `iptables`.
pub fn available() -> Result<(), String> {
    for tool in ["ip", "unshare", "iptables", "mount"] {
        if Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            return Err(format!(
                "`{tool}` is missing (Debian: iproute2, util-linux, iptables)"
            ));
        }
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_default();
    if uid != "0" {
        return Err("simulated hosts need root (network namespaces, mounts, iptables)".into());
    }
    Ok(())
}

impl Hosts {
    /// A bridge with `names.len()` hosts, `10.77.N.2` onwards; panics
    /// naming what is missing when the machine cannot make them.
    pub fn new(names: &[&str]) -> Hosts {
        if let Err(e) = available() {
            panic!("cannot simulate hosts: {e}");
        }
        sweep_stale();
        let pid = std::process::id();
        let k = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("t{pid}n{k}");
        let bridge = format!("{tag}br");
        // A /24 per set of hosts (invariant 1); 10.77.0.0/16 is ours.
        let subnet = ((pid + k) % 250) as u8 + 1;
        let dir = tempfile::Builder::new()
            .prefix("tessel-hosts-")
            .tempdir()
            .expect("a temp dir");
        std::fs::create_dir_all(dir.path().join("disk")).unwrap();
        std::fs::create_dir_all(dir.path().join("shared")).unwrap();
        std::fs::create_dir_all(dir.path().join("scratch")).unwrap();
        let mut h = Hosts {
            tag,
            bridge,
            subnet,
            dir,
            hosts: Vec::new(),
        };
        h.setup(names)
            .unwrap_or_else(|e| panic!("setting up simulated hosts: {e}"));
        h
    }

    fn setup(&mut self, names: &[&str]) -> Result<(), String> {
        let br = self.bridge.clone();
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&[
            "addr",
            "add",
            &format!("10.77.{}.1/24", self.subnet),
            "dev",
            &br,
        ])?;
        ip(&["link", "set", &br, "up"])?;
        forward_rule("-I", &br)?;
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{}-{i}", self.tag);
            let veth = format!("{}v{i}", self.tag);
            let peer = format!("{}p{i}", self.tag);
            let addr = Ipv4Addr::new(10, 77, self.subnet, i as u8 + 2);
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer])?;
            ip(&["link", "set", &peer, "netns", &ns])?;
            ip(&["link", "set", &veth, "master", &br])?;
            ip(&["link", "set", &veth, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &peer,
            ])?;
            ip(&["-n", &ns, "link", "set", &peer, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let disk = self.dir.path().join("hosts").join(name);
            std::fs::create_dir_all(disk.join("disk")).map_err(|e| e.to_string())?;
            let boot_id = format!("{:08x}-sim-{name}", pid_hash(&ns));
            std::fs::write(disk.join("boot_id"), format!("{boot_id}\n"))
                .map_err(|e| e.to_string())?;
            self.hosts.push(Host {
                name: name.to_string(),
                ns,
                ip: addr,
                disk,
                boot_id,
            });
        }
        Ok(())
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name}"))
    }

    /// The path at which every host sees its own disk.
    pub fn disk(&self) -> PathBuf {
        self.dir.path().join("disk")
    }

    /// A folder of the test's own, which no host is told about.
    pub fn scratch(&self) -> PathBuf {
        self.dir.path().join("scratch")
    }

    /// A folder every host sees (a shared file system).
    pub fn shared(&self) -> PathBuf {
        self.dir.path().join("shared")
    }

    /// The bridge's own address, which the test process uses to reach
    /// the hosts (and they it).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, 1)
    }

    /// `program args…` to run inside `host`: its namespace, hostname,
    /// `/dev/shm`, boot id and disk.
    pub fn command(&self, host: &Host, program: &Path) -> Command {
        let script = format!(
            "set -e; hostname {name}; mount -t tmpfs -o size=256m tmpfs /dev/shm; \
             mount --bind {boot} /proc/sys/kernel/random/boot_id; \
             mount --bind {disk} {at}; exec \"$@\"",
            name = host.name,
            boot = host.disk.join("boot_id").display(),
            disk = host.disk.join("disk").display(),
            at = self.disk().display(),
        );
        let mut c = Command::new("ip");
        c.args([
            "netns", "exec", &host.ns, "unshare", "--uts", "--mount", "sh", "-c",
        ])
        .arg(script)
        .arg("sh")
        .arg(program);
        c
    }

    /// Cuts `host` off from every other host (all its traffic but
    /// loopback is dropped), or only from `peers` when given.
    pub fn partition(&self, host: &Host, peers: &[&Host]) {
        let iptables = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &host.ns, "iptables"];
            all.extend_from_slice(args);
            ip(&all).unwrap_or_else(|e| panic!("{e}"));
        };
        if peers.is_empty() {
            iptables(&["-A", "INPUT", "!", "-i", "lo", "-j", "DROP"]);
            iptables(&["-A", "OUTPUT", "!", "-o", "lo", "-j", "DROP"]);
        } else {
            for p in peers {
                let a = p.ip.to_string();
                iptables(&["-A", "INPUT", "-s", &a, "-j", "DROP"]);
                iptables(&["-A", "OUTPUT", "-d", &a, "-j", "DROP"]);
            }
        }
    }

    /// Removes every partition rule of `host`.
    pub fn heal(&self, host: &Host) {
        for chain in ["INPUT", "OUTPUT"] {
            ip(&["netns", "exec", &host.ns, "iptables", "-F", chain])
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// SIGKILL to every process running in `host`.
    pub fn kill_all(&self, host: &Host) {
        kill_all_in(&host.ns);
    }
}

fn pid_hash(s: &str) -> u32 {
    s.bytes().fold(2_166_136_261u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(16_777_619)
    })
}

impl Drop for Hosts {
    /// Invariant 2.
    fn drop(&mut self) {
        for h in &self.hosts {
            kill_all_in(&h.ns);
        }
        for (i, h) in self.hosts.iter().enumerate() {
            let _ = ip(&["link", "del", &format!("{}v{i}", self.tag)]);
            let _ = ip(&["netns", "del", &h.ns]);
        }
        let _ = forward_rule("-D", &self.bridge);
        let _ = ip(&["link", "del", &self.bridge]);
        // Mount points inside the namespaces went with them; the folders
        // go with the temp dir.
    }
}
