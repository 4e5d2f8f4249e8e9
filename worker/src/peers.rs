//! A job's peers for its communicator, looked up in the job's directory
//! (topology `exchange` invariant 6) when the communicator first needs
//! them: a ring looks up the processes before and after this one, not all
//! of them.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tessel_kv::KvStore;
use tessel_topology::{exchange, GlobalTopology};
use tessel_transfer::{Directory, Members, Peer, TransferError};

/// Process `rank`'s peer, from its local topology in job `job`'s
/// directory: the address its transfer endpoint published, its boot id
/// (this host's: shared memory), the worker its certificate must name.
struct KvPeers {
    kv: Arc<dyn KvStore>,
    job: String,
    wait: Duration,
}

impl Directory for KvPeers {
    fn peer(&self, rank: u32) -> BoxFuture<'_, tessel_transfer::Result<Peer>> {
        Box::pin(async move {
            let failed = |reason: String| TransferError::Stream {
                peer: format!("process {rank} of job `{}`", self.job),
                reason,
            };
            let l = exchange::peer(&*self.kv, &self.job, rank, self.wait)
                .await
                .map_err(|e| failed(format!("looking it up: {e}")))?;
            let addr = l
                .transfer_endpoint
                .as_deref()
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| {
                    failed(format!(
                        "it published no usable transfer endpoint ({:?})",
                        l.transfer_endpoint
                    ))
                })?;
            let peer = Peer::new(addr, Some(l.boot_id));
            // Its certificate must name this worker (`endpoint` invariant 10).
            Ok(match l.worker.as_str() {
                "" => peer,
                w => peer.on_worker(w),
            })
        })
    }
}

/// The members of job `job`'s communicator, as process `me` of `topology`
/// sees them: which run on its machine from the topology, each peer from
/// the directory when first needed (waiting up to `wait` for its entry).
pub(crate) fn members(
    kv: Arc<dyn KvStore>,
    job: &str,
    topology: &GlobalTopology,
    me: u32,
    wait: Duration,
) -> Option<Members> {
    let machine = topology.processes.get(me as usize)?.machine;
    let local = topology
        .processes
        .iter()
        .map(|p| p.machine == machine)
        .collect();
    let directory = KvPeers {
        kv,
        job: job.to_owned(),
        wait,
    };
    Some(Members::lazy(local, Arc::new(directory)))
}
