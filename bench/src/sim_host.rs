//! One simulated host: the KV operations a `tessel worker` makes from its
//! start to its job's global topology, made with the same client code, in
//! the same order, with the same long-lived waits held open meanwhile.
//!
//! Mirrors `tessel_worker`'s agent and job process:
//! 1. claim the worker id (`claim::claim`: one read), register (two
//!    writes: the incarnation, then the lease with the record and the
//!    alive key) and heartbeat at the default period (`registry::Heartbeat`:
//!    a keep-alive a second, nothing written), on a thread of the hosts'
//!    heartbeats (`beats` says why);
//! 2. wait on the drain key (a blocking get held for the run) and follow
//!    the assignments (a listing with its revision, then a watch held for
//!    the run);
//! 3. for the assignment: hold the job's failure and end (two blocking
//!    gets for the run, `process` invariant 10), join the job (a read, one
//!    write), read its spec, exchange the topology (an insert, a blocking
//!    get) unless the job fails first, look up the two peers its
//!    communicator's ring talks to in the job's directory (two reads, as
//!    the barrier's first messages do: topology `exchange` invariant 6),
//!    and publish the digest and the transfer-ready record (two writes).
//!
//! Left out, and why: PJRT (no plugin is loaded: the client's creation and
//! device probe are the plugin's cost, measured by `--processes`); the
//! transfer layer's barrier itself (host to host, not through the KV); decoding
//! the published topology, done once for all hosts
//! (`tessel_topology::exchange_shared`; one host's decode is reported).
//! Hosts share connections, [`HOSTS_PER_CONNECTION`] each, where a real
//! host has its own: every connection is a real QUIC connection with its
//! own streams, so the leader's per-stream work is the same; its
//! per-connection work (a handshake, keep-alives while idle) is not,
//! unless `--connection-per-host` gives each host its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt;
use tessel_coordinator::attempt::{self, Record};
use tessel_coordinator::jobs::{self, JobAssignment, JobFailure};
use tessel_coordinator::registry::{self, Heartbeat, LivenessConfig, Registration};
use tessel_coordinator::{keys, Item, Records};
use tessel_kv::KvStore;
use tessel_topology::{exchange_shared, DeviceDescription, LocalTopology, TopologyCache};
use tessel_worker::host::HostFacts;
use tessel_worker::job_end::JobEnd;

use crate::beats::Beats;
use crate::simulated::worker_info;

/// Hosts on one connection: each holds up to five streams open (drain,
/// assignments, the job's end and failure, and the topology's get), and a
/// connection takes `tessel_tls` MAX_STREAMS (1,024) at once.
pub(crate) const HOSTS_PER_CONNECTION: usize = 128;

/// The steps of a host's bootstrap, in order, as [`Phases`] reports them.
pub(crate) const PHASES: [&str; 6] = [
    "registered",
    "assignment_listed",
    "spec_read",
    "topology_known",
    "neighbours_found",
    "published",
];

/// When the last host finished each step of [`PHASES`], from the start of
/// the run: where a run's time goes, step by step.
pub(crate) struct Phases {
    started: Instant,
    last_us: [AtomicU64; PHASES.len()],
}

impl Phases {
    /// Counting from now.
    pub(crate) fn new() -> Phases {
        Phases {
            started: Instant::now(),
            last_us: Default::default(),
        }
    }

    fn done(&self, step: usize) {
        let us = self.started.elapsed().as_micros() as u64;
        self.last_us[step].fetch_max(us, Ordering::Relaxed);
    }

    /// `{"registered":MS,…}`.
    pub(crate) fn json(&self) -> String {
        let each: Vec<String> = PHASES
            .iter()
            .zip(&self.last_us)
            .map(|(name, us)| format!("\"{name}\":{}", us.load(Ordering::Relaxed) / 1000))
            .collect();
        format!("{{{}}}", each.join(","))
    }
}

/// How a host's bootstrap ended.
pub(crate) enum Outcome {
    /// It knows the topology and published its digest.
    Known(RunningHost),
    /// The job failed before its topology was complete: the failure, as
    /// the host's job process stops on it.
    Failed(RunningHost, JobFailure),
}

/// A host that has its topology, still beating and waiting as a worker
/// does until [`RunningHost::stop`].
pub(crate) struct RunningHost {
    kv: Arc<dyn KvStore>,
    reg: Registration,
    heartbeat: Heartbeat,
    waits: Vec<tokio::task::JoinHandle<()>>,
    /// The job's failure and end, held until the host stops.
    end: JobEnd,
}

impl RunningHost {
    /// Whether the coordinators declared it lost although it beat.
    pub(crate) fn lost_now(&self) -> bool {
        self.heartbeat.lost_now().is_some()
    }

    /// Stops as a worker does at shutdown: heartbeat off, lease revoked.
    pub(crate) async fn stop(self) {
        self.heartbeat.stop();
        for w in &self.waits {
            w.abort();
        }
        drop(self.end);
        let _ = self.kv.revoke(self.reg.lease).await;
    }
}

/// How long a worker's blocking gets wait before asking again.
const HELD: Duration = Duration::from_secs(3600);

/// Liveness under which no keep-alive is sent within a run (a beat an
/// hour, a TTL of two): `bootstrap --without-heartbeats` measures what the
/// bootstrap costs without the heartbeats real workers send, for
/// attribution only (a real worker beats once a second).
pub(crate) const UNBEATING: LivenessConfig = LivenessConfig {
    heartbeat: Duration::from_secs(3600),
    ttl: Duration::from_secs(7200),
};

/// The id of host `i` of a run of `n`.
pub(crate) fn host_id(n: u32, i: u32) -> String {
    format!("sim{n}-{i}")
}

/// 128 bits that look random, fixed for `i`.
fn scrambled(i: u32) -> u128 {
    let x = u128::from(i)
        .wrapping_add(1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
    x ^ (x >> 61)
}

/// Host `i`'s boot id in the kernel's form (random, as on a real host: a
/// patterned one compresses where a real one does not, and the published
/// topology held every boot id until it held machines instead).
fn boot_id(i: u32) -> String {
    let h = format!("{:032x}", scrambled(i));
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A port in Linux's ephemeral range, as a worker's transfer endpoint
/// binds port 0.
fn ephemeral_port(i: u32) -> u16 {
    32768 + (scrambled(i) >> 64) as u16 % 28232
}

/// Host `i` of `n` claims its id, registers and starts beating on
/// `beats`.
async fn start(
    kv: &Arc<dyn KvStore>,
    beats: &Beats,
    (n, i): (u32, u32),
    liveness: LivenessConfig,
) -> Result<(String, HostFacts, Registration, Heartbeat)> {
    let id = host_id(n, i);
    let facts = HostFacts {
        hostname: format!("sim-host-{i}"),
        boot_id: boot_id(i),
    };
    tessel_worker::claim::claim(&**kv, &id, &facts).await?;
    let reg = registry::register(&**kv, worker_info(&id, i, liveness), liveness).await?;
    let heartbeat = beats.beat(i, reg.clone(), liveness);
    Ok((id, facts, reg, heartbeat))
}

/// Host `i` of `n`, started now, assigned process `i` of `job` (the
/// assignment is written before): returns once it published its digest,
/// or once the job failed before its topology was complete. Each step it
/// finishes is marked in `phases`, where given. It beats on `beats` as
/// `liveness` says: a real worker's default, or [`UNBEATING`].
pub(crate) async fn run(
    kv: Arc<dyn KvStore>,
    beats: &Beats,
    (n, i): (u32, u32),
    job: &str,
    cache: &TopologyCache,
    phases: Option<&Phases>,
    liveness: LivenessConfig,
) -> Result<Outcome> {
    let done = |step: usize| {
        if let Some(p) = phases {
            p.done(step);
        }
    };
    let (id, facts, reg, heartbeat) = start(&kv, beats, (n, i), liveness).await?;
    done(0);
    let drain = keys::drain(&id);
    let k = kv.clone();
    let mut waits = vec![tokio::spawn(async move {
        let _ = k.get(drain.as_bytes(), HELD).await;
    })];
    // Follow the assignments as the agent does: list them, then watch
    // from the listing's revision on.
    let prefix = keys::assignments(&id);
    let listed = kv.list_at(prefix.as_bytes()).await?;
    let mut events = kv.watch(prefix.as_bytes(), listed.revision + 1).await?;
    waits.push(tokio::spawn(async move {
        while let Some(Ok(_)) = events.next().await {}
    }));
    done(1);
    let Some(a) = listed
        .pairs
        .iter()
        .filter_map(|p| JobAssignment::decode(&p.value).ok())
        .find(|a| a.attempt == job)
    else {
        bail!("host {id} found no assignment to {job}");
    };
    // The job's failure and end, one held get each for the process's life,
    // with the worker's own code (`process` invariant 10).
    let end = JobEnd::start(kv.clone(), job);
    jobs::join_job(&*kv, job, &reg).await?;
    Records::new(&*kv, job).get(Item::Spec).await?;
    done(2);
    let local = LocalTopology {
        process_index: a.process_index,
        num_processes: a.num_processes,
        worker: id.clone(),
        hostname: facts.hostname,
        boot_id: facts.boot_id,
        slice_index: None,
        devices: vec![DeviceDescription {
            local_hardware_id: 0,
            kind: "sim".into(),
            memory_bytes: None,
            attributes: vec![],
        }],
        transfer_endpoint: Some(format!(
            "10.{}.{}.{}:{}",
            i >> 16,
            (i >> 8) & 255,
            i & 255,
            ephemeral_port(i)
        )),
        transfer_encrypted: true,
    };
    let timeout = Duration::from_millis(a.topology_timeout_ms);
    // Unless the job fails first, as a worker's job process waits
    // (`process` invariant 8): a peer lost before it published would keep
    // every other host waiting for the topology's timeout.
    let t = tokio::select! {
        t = exchange_shared(&*kv, job, &local, timeout, cache) => t?,
        f = end.failed() => {
            let f = f?;
            let running = RunningHost { kv: kv.clone(), reg, heartbeat, waits, end };
            return Ok(Outcome::Failed(running, f));
        }
    };
    if t.topology().num_devices() != n {
        bail!(
            "host {id} saw {} devices, not {n}",
            t.topology().num_devices()
        );
    }
    done(3);
    // The ring's neighbours, once each, as the communicator looks them up
    // for the barrier (the worker's `peers`).
    let neighbours: std::collections::BTreeSet<u32> = [(i + 1) % n, (i + n - 1) % n]
        .into_iter()
        .filter(|&p| p != i)
        .collect();
    for peer in neighbours {
        tessel_topology::exchange::peer(&*kv, job, peer, timeout).await?;
    }
    done(4);
    attempt::publish(&*kv, job, i, Record::Topology, t.digest().as_bytes()).await?;
    attempt::publish(&*kv, job, i, Record::TransferReady, b"0.0").await?;
    done(5);
    Ok(Outcome::Known(RunningHost {
        kv,
        reg,
        heartbeat,
        waits,
        end,
    }))
}

/// Waits for every host of `tasks` (host `i` at index `i`) to know its
/// topology, in the order they finish: the first that fails, or sees its
/// job fail, ends the wait at once with its cause, rather than after the
/// hosts before it in order (which wait out the topology's timeout when a
/// peer is gone).
pub(crate) async fn all_known(
    tasks: Vec<tokio::task::JoinHandle<Result<Outcome>>>,
) -> Result<Vec<RunningHost>> {
    let mut pending: futures::stream::FuturesUnordered<_> = tasks
        .into_iter()
        .enumerate()
        .map(|(i, t)| async move { (i, t.await) })
        .collect();
    let mut hosts = Vec::with_capacity(pending.len());
    while let Some((i, ended)) = pending.next().await {
        match ended {
            Ok(Ok(Outcome::Known(h))) => hosts.push(h),
            Ok(Ok(Outcome::Failed(_, f))) => bail!("host {i}: the job failed: {f}"),
            Ok(Err(e)) => return Err(e.context(format!("host {i}"))),
            Err(e) => bail!("host {i}: its task ended: {e}"),
        }
    }
    Ok(hosts)
}

/// Host `i` of `n` as a worker that dies during its job's bootstrap: it
/// registers, heartbeats, joins the job and reads its spec, then stops as
/// a killed process does (no more keep-alives, nothing revoked, no local
/// topology) before the topology completes. Returns when it stopped
/// beating; its lease expires a TTL after its last renewal.
pub(crate) async fn run_lost(
    kv: Arc<dyn KvStore>,
    beats: &Beats,
    (n, i): (u32, u32),
    job: &str,
) -> Result<Instant> {
    let (_, _, reg, heartbeat) = start(&kv, beats, (n, i), LivenessConfig::default()).await?;
    jobs::join_job(&*kv, job, &reg).await?;
    Records::new(&*kv, job).get(Item::Spec).await?;
    heartbeat.stop();
    Ok(Instant::now())
}
