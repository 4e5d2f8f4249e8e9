//! The coordinator process as a library (as etcd's `embed` is): a
//! replica of the key-value service (or an attachment to etcd), the
//! failure monitor and the scheduler, started by [`serve`] and stopped by
//! [`Served::shutdown`]. The `tessel coordinator` command parses flags and
//! calls it.
//!
//! Invariants:
//! 1. A replica starts only under a coordinator certificate (or the
//!    cluster-wide one, with a warning, or `--insecure`).
//! 2. The monitor and the scheduler's passes run where the replica leads
//!    (every coordinator's, attached to etcd). Their writes are idempotent
//!    inserts and compare-and-swaps, so two of them (a leadership moving
//!    mid-pass) never interleave; a follower's would only read the whole
//!    registry through the leader again (at 16,384 workers, the passes
//!    were a third of the leader's CPU with two followers; each follower's
//!    monitor watch relayed every registry event).
//! 3. The monitor and the scheduler reach this replica in-process
//!    ([`Replica::local_client`]): never over the network, so no
//!    certificate has to name an address for them.
//! 4. A replica whose Raft core stopped (a disk full or failing) is not
//!    ready, and [`Served::stopped`] resolves: the process exits nonzero,
//!    for its supervisor to restart it from disk once the disk serves
//!    again, instead of living on while serving nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;
use tessel_kv_service::raft::node::{Replica, ReplicaConfig};
use tessel_tls::{Identity, Role};

use crate::error::{CoordinatorError, Result};

/// How often a scheduler pass runs, and how long a job may stay
/// unplaceable before it says why.
const SCHEDULER_PASS: Duration = Duration::from_millis(500);
const SCHEDULER_PATIENCE: Duration = Duration::from_secs(120);

/// What to serve.
pub enum Backend {
    /// A replica of tessel's key-value service.
    Replica {
        /// Its configuration.
        config: Box<ReplicaConfig>,
        /// Replicas of a cluster to join (`HOST:PORT`), if any.
        join: Option<Vec<String>>,
    },
    /// An existing store (etcd): only the monitor and the scheduler run.
    Attached(Arc<dyn KvStore>),
}

/// A running coordinator.
pub struct Served {
    replica: Option<Replica>,
    addr: Option<SocketAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts `backend`, then the monitor and the scheduler on it;
/// `readiness` hears, every 250 ms, whether the replica knows a leader.
pub async fn serve(
    backend: Backend,
    readiness: impl Fn(std::result::Result<(), String>) + Send + 'static,
) -> Result<Served> {
    let (replica, addr, kv) = match backend {
        Backend::Attached(kv) => {
            readiness(Ok(()));
            (None, None, kv)
        }
        Backend::Replica { config, join } => {
            check_certificate(config.tls.as_ref())?;
            let tls = config.tls.clone();
            let id = config.id;
            let replica = Replica::start(*config)
                .await
                .map_err(|e| CoordinatorError::Replica(e.to_string()))?;
            let addr = replica.local_addr().map_err(|e| {
                CoordinatorError::Replica(format!("the replica's bound address: {e}"))
            })?;
            if let Some(join) = join {
                let kv = RaftKv::connect_named(&join, tls.as_ref())
                    .await
                    .map_err(CoordinatorError::kv(format!("reaching {}", join.join(","))))?;
                kv.add_replica(id, addr)
                    .await
                    .map_err(CoordinatorError::kv(format!(
                        "joining the cluster of {}",
                        join.join(",")
                    )))?;
            }
            // Invariant 3.
            let kv: Arc<dyn KvStore> = Arc::new(replica.local_client());
            (Some(replica), Some(addr), kv)
        }
    };
    let mut tasks = Vec::new();
    if let Some(r) = &replica {
        let probe = r.readiness_probe();
        tasks.push(tokio::spawn(async move {
            loop {
                readiness(probe().map(|_| ()));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }));
    }
    // Invariant 2.
    let leads = replica.as_ref().map(|r| Arc::new(r.leads_probe()));
    let monitor_leads = leads.clone();
    tasks.push(tokio::spawn(crate::monitor::run(kv.clone(), move || {
        monitor_leads.as_ref().is_none_or(|leads| leads())
    })));
    tasks.push(tokio::spawn(crate::scheduler::run(
        kv,
        SCHEDULER_PASS,
        SCHEDULER_PATIENCE,
        move || leads.as_ref().is_none_or(|leads| leads()),
    )));
    Ok(Served {
        replica,
        addr,
        tasks,
    })
}

impl Served {
    /// The replica's bound address (`None` when attached to etcd).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Resolves, with why, when the replica's Raft core stopped on an
    /// error (invariant 4); never when attached to etcd.
    pub fn stopped(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        let stopped = self.replica.as_ref().map(|r| r.stopped());
        async move {
            match stopped {
                Some(s) => s.await,
                None => std::future::pending().await,
            }
        }
    }

    /// Its Raft id.
    pub fn id(&self) -> Option<u64> {
        self.replica.as_ref().map(|r| r.id)
    }

    /// Stops the monitor, the scheduler and the replica (after its
    /// in-flight writes).
    pub async fn shutdown(self) {
        for t in self.tasks {
            t.abort();
        }
        if let Some(r) = self.replica {
            tracing::info!(id = r.id, "replica shutting down");
            r.shutdown().await;
        }
    }
}

/// Invariant 1.
fn check_certificate(tls: Option<&tessel_tls::TlsFiles>) -> Result<()> {
    match tls.map(|t| t.identity()) {
        None | Some(Identity::Anonymous) => Ok(()),
        Some(Identity::Node {
            role: Role::Coordinator,
            ..
        }) => Ok(()),
        Some(Identity::Shared) => {
            tracing::warn!(
                "this coordinator uses the cluster-wide certificate: any holder may act as any node; issue per-node certificates with `tessel certs issue`"
            );
            Ok(())
        }
        Some(other) => Err(CoordinatorError::NotACoordinator(other.to_string())),
    }
}
