//! A tessel cluster on simulated hosts ([`crate::hosts`]): coordinators
//! and workers each on a host of their own, with per-node certificates
//! from one CA, started as real processes, killed with real signals and
//! cut off by iptables.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tessel_kv_service::raft::client::RaftKv;
use tessel_tls::{init_ca, issue, renew, NodeCert, Role, TlsFiles, Validity};

use crate::hosts::{Host, Hosts};
use crate::relay::DelayRelay;
use crate::{spawn_replica_cmd, spawn_worker_cmd, tessel_bin, Proc, WorkerProc};

/// Coordinators on some hosts, workers on others.
pub struct HostCluster {
    /// Declared before `hosts`: processes die before their namespaces go.
    pub coordinators: BTreeMap<String, Proc>,
    /// Workers by name.
    pub workers: BTreeMap<String, WorkerProc>,
    relays: Vec<DelayRelay>,
    /// The simulated hosts.
    pub hosts: Hosts,
    /// The CA's folder (on the test's side).
    pub ca: PathBuf,
    /// Every folder issued: (folder, role, name, hosts).
    issued: Vec<(PathBuf, Role, String, Vec<String>)>,
}

fn node_cert<'a>(role: Role, name: &'a str, hosts: &'a [String], days: u32) -> NodeCert<'a> {
    NodeCert {
        role,
        name,
        hosts,
        valid: Validity::days(days),
    }
}

impl HostCluster {
    /// Hosts `coordinators` and `workers` (by name), the coordinators
    /// started (the first forms the cluster, the others join), each with
    /// its certificate.
    pub fn start(coordinators: &[&str], workers: &[&str]) -> HostCluster {
        let names: Vec<&str> = coordinators.iter().chain(workers).copied().collect();
        let hosts = Hosts::new(&names);
        // The CA's host is the test's: its key never reaches a host.
        let ca = hosts.scratch().join("ca");
        init_ca(&ca).unwrap();
        let mut c = HostCluster {
            coordinators: BTreeMap::new(),
            workers: BTreeMap::new(),
            relays: Vec::new(),
            hosts,
            ca,
            issued: Vec::new(),
        };
        // The test process is a client (the submitter).
        c.node_tls(c.tester_tls(), Role::Client, "tester", &[]);
        for (i, name) in coordinators.iter().enumerate() {
            let host = c.hosts.host(name).clone();
            // Dialed at its own address, or through a relay on the bridge.
            let sans = vec![host.ip.to_string(), c.hosts.gateway().to_string()];
            let id = (i + 1).to_string();
            c.node_tls(c.tls_on(name), Role::Coordinator, &id, &sans);
            let join = c.coordinators.values().next().map(|p| p.addr);
            let p = c.spawn_coordinator(&host, i as u64 + 1, join);
            c.coordinators.insert(name.to_string(), p);
        }
        for name in workers {
            c.node_tls(c.tls_on(name), Role::Worker, name, &[]);
        }
        c
    }

    fn node_tls(&mut self, out: PathBuf, role: Role, name: &str, hosts: &[String]) {
        issue(&self.ca, &node_cert(role, name, hosts, 30), &out)
            .unwrap_or_else(|e| panic!("issuing {role} {name}: {e}"));
        self.issued
            .push((out, role, name.to_owned(), hosts.to_vec()));
    }

    /// Renews every certificate issued, valid `days` from now, with the
    /// same keys or new ones (`tessel certs issue --renew [--new-key]`);
    /// the running processes are not told.
    pub fn renew_all(&self, days: u32, new_key: bool) {
        for (out, role, name, hosts) in &self.issued {
            renew(
                &self.ca,
                &node_cert(*role, name, hosts, days),
                out,
                new_key,
                None,
            )
            .unwrap_or_else(|e| panic!("renewing {role} {name}: {e}"));
        }
    }

    /// Where host `name`'s TLS folder lies on its disk, seen from the
    /// test process.
    pub fn tls_on(&self, name: &str) -> PathBuf {
        self.hosts.host(name).disk.join("disk").join("tls")
    }

    /// The same folder as its host sees it.
    pub fn tls_inside(&self) -> PathBuf {
        self.hosts.disk().join("tls")
    }

    /// The test process's own (client) TLS folder.
    pub fn tester_tls(&self) -> PathBuf {
        self.hosts.scratch().join("tester-tls")
    }

    /// Copies host `from`'s TLS folder onto host `to`'s disk (a stolen or
    /// misplaced certificate); returns the path `to` sees it at.
    pub fn copy_tls(&self, from: &str, to: &str) -> PathBuf {
        let dest = self
            .hosts
            .host(to)
            .disk
            .join("disk")
            .join(format!("tls-of-{from}"));
        std::fs::create_dir_all(&dest).unwrap();
        for f in ["ca.pem", "node.pem", "node.key"] {
            std::fs::copy(self.tls_on(from).join(f), dest.join(f)).unwrap();
        }
        self.hosts.disk().join(format!("tls-of-{from}"))
    }

    fn spawn_coordinator(&self, host: &Host, id: u64, join: Option<SocketAddr>) -> Proc {
        let listen = format!("{}:0", host.ip);
        let mut cmd = self.hosts.command(host, &tessel_bin());
        cmd.args(["coordinator", "--id", &id.to_string(), "--listen", &listen])
            .args(["--metrics-listen", &format!("{}:0", host.ip)])
            .arg("--data-dir")
            .arg(self.hosts.disk().join("coordinator"))
            .arg("--tls-dir")
            .arg(self.tls_inside());
        match join {
            Some(j) => cmd.args(["--join", &j.to_string()]),
            None => cmd.args(["--peers", &format!("{id}={listen}")]),
        };
        spawn_replica_cmd(cmd)
    }

    /// Every coordinator's key-value address.
    pub fn coordinator_addrs(&self) -> Vec<SocketAddr> {
        self.coordinators.values().map(|p| p.addr).collect()
    }

    /// A client of the coordinators, from the test process.
    pub fn client(&self) -> RaftKv {
        let tls = TlsFiles::load(&self.tester_tls()).unwrap();
        RaftKv::connect(self.coordinator_addrs(), Some(&tls)).unwrap()
    }

    /// Relays that delay every datagram between the workers and the
    /// coordinators by `delay` each way; workers started afterwards use
    /// them.
    pub async fn add_latency(&mut self, delay: Duration) {
        for addr in self.coordinator_addrs() {
            let listen = SocketAddr::new(self.hosts.gateway().into(), 0);
            self.relays
                .push(DelayRelay::start(listen, addr, delay).await);
        }
    }

    /// Sets the delay of the relays [`Self::add_latency`] started, each
    /// way, for the datagrams that arrive from now on: the same workers
    /// on the same path, with and without latency.
    pub fn set_latency(&self, delay: Duration) {
        for r in &self.relays {
            r.set_delay(delay);
        }
    }

    /// The coordinator addresses workers are given.
    fn worker_targets(&self) -> String {
        let addrs: Vec<String> = match self.relays.is_empty() {
            true => self
                .coordinator_addrs()
                .iter()
                .map(|a| a.to_string())
                .collect(),
            false => self.relays.iter().map(|r| r.addr.to_string()).collect(),
        };
        addrs.join(",")
    }

    /// `tessel worker` on host `name` with the TLS folder `tls` (as the
    /// host sees it), checkpoints allowed under the host's disk and the
    /// shared folder, and `extra` flags.
    pub fn worker_command(
        &self,
        name: &str,
        tls: &std::path::Path,
        extra: &[&str],
    ) -> std::process::Command {
        let host = self.hosts.host(name).clone();
        let mut cmd = self.hosts.command(&host, &tessel_bin());
        cmd.args(["worker", "--coordinator", &self.worker_targets()])
            .arg("--tls-dir")
            .arg(tls)
            .args(["--plugin", "cpu", "--devices", "2"])
            .arg("--checkpoint-root")
            .arg(self.hosts.disk())
            .arg("--checkpoint-root")
            .arg(self.hosts.shared())
            .args(extra);
        cmd
    }

    /// Starts the worker of host `name` and waits for its registration.
    pub fn start_worker(&mut self, name: &str, extra: &[&str]) -> u64 {
        let w = spawn_worker_cmd(self.worker_command(name, &self.tls_inside(), extra), name)
            .unwrap_or_else(|e| panic!("{e}"));
        let inc = w.incarnation;
        self.workers.insert(name.to_string(), w);
        inc
    }

    /// SIGKILL to the worker of host `name`.
    pub fn kill_worker(&mut self, name: &str) {
        if let Some(w) = self.workers.get_mut(name) {
            w.kill();
        }
    }

    /// The host named `name`.
    pub fn host(&self, name: &str) -> Host {
        self.hosts.host(name).clone()
    }
}
