//! Where the simulated hosts' heartbeats run: a thread and a runtime of
//! their own, with QUIC connections of their own made there.
//!
//! On a cluster each host's heartbeat runs on the host's own CPU: a beat
//! is due, its task runs. On the benchmark's runtime it waited behind the
//! other hosts' bootstrap tasks (16,384 hosts on two cores: 17,000-22,000
//! beats a run polled over 0.5 s after they were due, up to 5.5 s, and
//! 2 of 4 runs failed with a live host's lease expired). On a thread of
//! their own, 1,000-6,400 beats a run were that late and 5 of 8 runs
//! completed (docs/performance.md, "At pod scale"). Their CPU is still the
//! benchmark's, counted in a simulated host's cost. The thread keeps the
//! default priority: at nice -10 it took the cores from the replicas that
//! answer the beats, and 3 of 3 runs failed.
//!
//! What differs from a real worker: a real worker's keep-alives share its
//! agent's one connection with its requests; here they travel on
//! connections of their own, as many hosts to one as the requests'
//! ([`crate::sim_host::HOSTS_PER_CONNECTION`], or one a host with
//! `--connection-per-host`). The replicas see the same streams and frames,
//! and that many more connections.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use tessel_coordinator::registry::{Heartbeat, LivenessConfig, Registration};
use tessel_kv::{CountingKv, KvStore};

use crate::simulated::{KeepAlives, OwnRuntime};

/// The hosts' heartbeats' thread, runtime and connections; the thread
/// ends when the last clone is dropped (its tasks with it).
#[derive(Clone)]
pub(crate) struct Beats {
    clients: Arc<[Arc<CountingKv>]>,
    // After the clients: they are dropped while their runtime runs.
    on: Arc<OwnRuntime>,
}

impl Beats {
    /// Starts the thread and makes `connections` clients of the replicas
    /// at `addrs` on it, keep-alives travelling as `how` says.
    pub(crate) fn start(
        how: KeepAlives,
        addrs: &[SocketAddr],
        tls_dir: &Path,
        connections: usize,
    ) -> Result<Beats> {
        let on = OwnRuntime::start("heartbeats")?;
        // Made on that runtime: their endpoints' drivers run there.
        let clients = {
            let _on = on.handle().enter();
            (0..connections.max(1))
                .map(|_| {
                    how.connect(addrs.to_vec(), tls_dir)
                        .map(|c| Arc::new(CountingKv::new(c)))
                })
                .collect::<Result<Arc<[_]>>>()?
        };
        Ok(Beats {
            clients,
            on: Arc::new(on),
        })
    }

    /// Starts host `i`'s heartbeat for `reg` on this thread, over its
    /// share of the connections.
    pub(crate) fn beat(&self, i: u32, reg: Registration, liveness: LivenessConfig) -> Heartbeat {
        let kv: Arc<dyn KvStore> = self.clients[i as usize % self.clients.len()].clone();
        let _on = self.on.handle().enter();
        Heartbeat::start(kv, reg, liveness)
    }

    /// Keep-alives sent so far, as KV operations.
    pub(crate) fn ops(&self) -> u64 {
        self.clients.iter().map(|c| c.ops()).sum()
    }
}
