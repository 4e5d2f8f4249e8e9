//! What the simulated-worker benchmarks share: a simulated host's worker
//! record, how its keep-alives travel, and a process's CPU and memory as
//! `/proc` reports them.

use std::sync::Arc;

use anyhow::Result;
use tessel_coordinator::{LivenessConfig, WorkerDevice, WorkerInfo};
use tessel_harness::LocalCluster;
use tessel_kv::KvStore;
use tessel_kv_service::raft::client::{ClientEndpoint, RaftKv};
use tessel_tls::TlsFiles;

/// The record worker `id`, simulated host `i`, registers with: one device.
pub(crate) fn worker_info(id: &str, i: u32, liveness: LivenessConfig) -> WorkerInfo {
    WorkerInfo {
        worker_id: id.to_owned(),
        hostname: format!("sim-host-{i}"),
        boot_id: format!("sim-boot-{i}"),
        pid: i,
        plugin: "simulated".into(),
        platform: "simulated".into(),
        plugin_version: "-".into(),
        devices: vec![WorkerDevice {
            kind: "sim".into(),
            count: 1,
            memory_bytes: None,
        }],
        ttl_ms: liveness.ttl.as_millis() as u64,
    }
}

/// A process's CPU time so far and its peak resident memory, from
/// `/proc` (zeros where it cannot be read).
#[derive(Default)]
pub(crate) struct Usage {
    pub(crate) cpu_ns: u64,
    pub(crate) peak_kib: u64,
    /// Resident now (`VmRSS`).
    pub(crate) rss_kib: u64,
}

pub(crate) fn usage(pid: u32) -> Usage {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
    let cpu_ns = stat_cpu_ns(&read("stat"));
    let status = read("status");
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    Usage {
        cpu_ns,
        peak_kib: kib("VmHWM:"),
        rss_kib: kib("VmRSS:"),
    }
}

/// The CPU time in a `/proc` `stat` line (a process's, all its threads,
/// or a thread's): utime and stime, in USER_HZ ticks (100 a second in
/// /proc on every Linux architecture); fields 14 and 15, counted after the
/// command name, which may hold spaces.
pub(crate) fn stat_cpu_ns(stat: &str) -> u64 {
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after_name
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    ticks * 10_000_000
}

/// Each coordinator's CPU time so far, to measure from.
pub(crate) fn cpu_now(coordinators: &[u32]) -> Vec<u64> {
    coordinators.iter().map(|p| usage(*p).cpu_ns).collect()
}

/// Each coordinator's CPU time since `before` ([`cpu_now`]), split into
/// the leader's (replica `leader` in start order; `None`: the busiest) and
/// the others', in start order. Followers relay keep-alives (node `relay`),
/// so the leader is not always the busiest.
pub(crate) fn cpu_split(
    coordinators: &[u32],
    before: &[u64],
    leader: Option<usize>,
) -> (u64, Vec<u64>) {
    split(&cpu_since(coordinators, before), leader)
}

/// Each coordinator's CPU time since `before` ([`cpu_now`]), in start order.
pub(crate) fn cpu_since(coordinators: &[u32], before: &[u64]) -> Vec<u64> {
    coordinators
        .iter()
        .zip(before)
        .map(|(p, b)| usage(*p).cpu_ns.saturating_sub(*b))
        .collect()
}

/// `spent` ([`cpu_since`]) as [`cpu_split`] splits it.
pub(crate) fn split(spent: &[u64], leader: Option<usize>) -> (u64, Vec<u64>) {
    let at = leader_at(spent, leader);
    let others = (0..spent.len()).filter(|&i| i != at).map(|i| spent[i]);
    (spent.get(at).copied().unwrap_or(0), others.collect())
}

/// Which of the coordinators that spent `spent` counts as the leader:
/// `leader`, or the busiest where none said it leads.
pub(crate) fn leader_at(spent: &[u64], leader: Option<usize>) -> usize {
    let busiest = (0..spent.len()).max_by_key(|&i| spent[i]).unwrap_or(0);
    leader.filter(|&l| l < spent.len()).unwrap_or(busiest)
}

/// Which replica leads now, by its index among the client's replicas (the
/// harness's start order), if one says so.
pub(crate) async fn leader_index(kv: &RaftKv) -> Option<usize> {
    kv.cluster_status()
        .await
        .into_iter()
        .position(|(_, s)| s.is_ok_and(|s| s.leader == Some(s.id)))
}

/// CPU time over `elapsed` as percent of one core, one decimal, as JSON.
pub(crate) fn percents_json(ns: &[u64], elapsed: std::time::Duration) -> String {
    let each: Vec<String> = ns
        .iter()
        .map(|n| format!("{:.1}", *n as f64 / elapsed.as_nanos() as f64 * 100.0))
        .collect();
    format!("[{}]", each.join(","))
}

/// Quantile `q` of `sorted` latencies, in milliseconds.
pub(crate) fn quantile_ms(sorted: &[std::time::Duration], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3
}

/// Connections that share one UDP socket in [`KeepAlives::clients`]: the
/// coordinators see a connection each; the benchmark's side is spread
/// over a few sockets (one would be one task's work).
const CONNECTIONS_PER_ENDPOINT: usize = 1024;

/// How the simulated workers' keep-alives travel.
#[derive(Clone, Copy, Debug, Default, clap::ValueEnum)]
pub enum KeepAlives {
    /// On each client's keep-alive stream, to a follower that relays them
    /// to the leader in batches.
    #[default]
    Stream,
    /// On each client's keep-alive stream to the leader itself, as before
    /// followers relayed them.
    Leader,
    /// As a request each.
    Requests,
}

impl KeepAlives {
    /// Marks the simulated workers' names, new ones for each way.
    pub(crate) fn tag(self) -> &'static str {
        match self {
            KeepAlives::Stream => "s",
            KeepAlives::Leader => "l",
            KeepAlives::Requests => "r",
        }
    }

    pub(crate) fn client(self, cluster: &LocalCluster) -> Result<Arc<dyn KvStore>> {
        self.connect(cluster.addrs.clone(), &cluster.tls_dir())
    }

    /// A client of the replicas at `addrs` with the cluster's certificates
    /// in `tls_dir`, made on the runtime that calls it (its QUIC endpoint's
    /// driver runs there).
    pub(crate) fn connect(
        self,
        addrs: Vec<std::net::SocketAddr>,
        tls_dir: &std::path::Path,
    ) -> Result<Arc<dyn KvStore>> {
        let tls = TlsFiles::load(tls_dir)?;
        Ok(self.wrap(RaftKv::connect(addrs, Some(&tls))?))
    }

    fn wrap(self, kv: RaftKv) -> Arc<dyn KvStore> {
        match self {
            KeepAlives::Stream => Arc::new(kv),
            KeepAlives::Leader => Arc::new(kv.keep_alives_to_leader()),
            KeepAlives::Requests => Arc::new(kv.keep_alives_as_requests()),
        }
    }

    /// `count` clients, each with a connection of its own (as many
    /// workers have), on one UDP endpoint per [`CONNECTIONS_PER_ENDPOINT`].
    pub(crate) fn clients(
        self,
        cluster: &LocalCluster,
        count: usize,
    ) -> Result<Vec<Arc<dyn KvStore>>> {
        let tls = TlsFiles::load(&cluster.tls_dir())?;
        let mut out = Vec::with_capacity(count);
        let mut endpoint = None;
        for i in 0..count {
            if i % CONNECTIONS_PER_ENDPOINT == 0 {
                endpoint = Some(ClientEndpoint::for_replicas(&cluster.addrs, Some(&tls))?);
            }
            let ep = endpoint.as_ref().expect("made above");
            out.push(self.wrap(RaftKv::connect_via(ep, cluster.addrs.clone())?));
        }
        Ok(out)
    }
}

/// A thread running a current-thread runtime of its own until dropped,
/// as a client in a process of its own has: its tasks' wake-ups do not
/// queue behind the simulated hosts' thousands of tasks on the benchmark's
/// runtime (the operating system still shares the machine's cores among
/// all). Clients its tasks use must be made on it (quinn drives an
/// endpoint on the runtime that made it).
pub(crate) struct OwnRuntime {
    handle: tokio::runtime::Handle,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl OwnRuntime {
    /// Starts thread `name` and its runtime.
    pub(crate) fn start(name: &str) -> Result<OwnRuntime> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                // Its tasks run until the owner drops its end.
                let _ = rt.block_on(stopped);
            })?;
        let handle = handle_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the {name} thread ended at its start"))??;
        Ok(OwnRuntime {
            handle,
            _stop: stop,
        })
    }

    /// Where to spawn onto it, or to enter it to make a client.
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

/// Runs `work` on an [`OwnRuntime`] of its own, which ends with it. Its
/// clients must be made inside `work` ([`KeepAlives::connect`]).
pub(crate) async fn on_own_runtime<T, F, Fut>(name: &str, work: F) -> Result<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let rt = OwnRuntime::start(name)?;
    rt.handle()
        .spawn(async move { work().await })
        .await
        .map_err(|e| anyhow::anyhow!("the {name} thread's work ended: {e}"))?
}
