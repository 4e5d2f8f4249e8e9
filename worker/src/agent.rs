//! The per-host agent.
//!
//! Invariants:
//! 1. A worker registers once per process start (a new incarnation) and is
//!    alive exactly while its heartbeat keeps the lease; when the
//!    registration is lost (expired, or a newer incarnation took over) the
//!    agent stops: it never acts for a stale incarnation.
//! 2. Each job process gets its own PJRT client (the per-node client) whose
//!    KV callbacks are bound to that job's namespace; the client lives until
//!    the job is done or failed.
//! 3. Every job process publishes a digest of the global topology it holds,
//!    then whether its transfer layer is connected (invariant 5), and
//!    records any failure event it observed, so the submitter (and tests)
//!    can check what each process saw.
//! 4. PJRT calls that may block — client creation and destruction, where a
//!    plugin may call back into the KV and wait — run on blocking threads,
//!    never on the async runtime's workers.
//! 5. Each job process binds its own transfer endpoint (rank = process
//!    index), publishes its address in its local topology, and passes a
//!    barrier with every other process of the job over the transfer layer
//!    (mutual TLS; shared memory on the same host) after the exchange.
//! 6. A job with a plan (`jobs/{job}/spec`) runs it once the barrier has
//!    passed; a process that finishes publishes its result, one that fails
//!    fails the job (invariant 2 of `jobs`: everyone sees that failure). A
//!    failure elsewhere or the job's end (cancellation) stops the plan at
//!    its next await.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tessel_coordinator::jobs::{self, JobAssignment, JobFailure};
use tessel_coordinator::registry::{self, Heartbeat, Registration};
use tessel_coordinator::{keys, LivenessConfig, WorkerDevice, WorkerInfo};
use tessel_kvstore::{Event, KvStore};
use tessel_pjrt::{Client, ClientOptions, Plugin};
use tessel_topology::{exchange, DeviceDescription, GlobalTopology, LocalTopology};
use tessel_transfer::{CollectiveConfig, Communicator, Peer, TransferConfig, TransferEndpoint};

use crate::error::{Result, WorkerError};
use crate::host::HostFacts;
use crate::job_kv::JobKv;
use crate::runner::{JobProcess, JobRunner};

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Stable across restarts (default: the hostname).
    pub worker_id: String,
    pub plugin: PathBuf,
    /// CPU devices per client (`cpu_device_count`); other plugins have the
    /// devices they have.
    pub devices: Option<usize>,
    pub liveness: LivenessConfig,
    /// An explicit slice index for topologies.
    pub slice_index: Option<u32>,
    /// Where job processes bind their transfer endpoints (an address the
    /// other workers can reach; the port is chosen per job), and the
    /// cluster's TLS files for it (`None`: `--insecure`).
    pub transfer_ip: std::net::IpAddr,
    pub transfer_tls: Option<tessel_kvstore::tls::TlsFiles>,
}

/// What the probe client found.
#[derive(Debug, Clone)]
struct PluginFacts {
    platform: String,
    version: String,
    devices: Vec<WorkerDevice>,
}

/// A registered worker.
pub struct Worker {
    /// When the plugin was loaded and probed (unix ms).
    plugin_ready_unix_ms: u64,
    /// How long loading and probing took.
    plugin_load: Duration,
    kv: Arc<dyn KvStore>,
    cfg: WorkerConfig,
    plugin: Plugin,
    facts: PluginFacts,
    host: HostFacts,
    registration: Registration,
    runner: Option<Arc<dyn JobRunner>>,
}

/// The job's communicator: one member per process, at the transfer
/// endpoint its topology entry names.
fn communicator(
    endpoint: Arc<TransferEndpoint>,
    topology: &GlobalTopology,
    job: &str,
    timeout: Duration,
) -> Result<Communicator> {
    let members = topology
        .processes
        .iter()
        .map(|p| {
            let addr = p
                .transfer_endpoint
                .as_deref()
                .and_then(|a| a.parse().ok())
                .ok_or_else(|| {
                    WorkerError::Internal(format!(
                        "process {} published no usable transfer endpoint ({:?})",
                        p.process_index, p.transfer_endpoint
                    ))
                })?;
            Ok(Peer::new(addr, Some(p.boot_id.clone())))
        })
        .collect::<Result<Vec<_>>>()?;
    let digest = tessel_topology::sha256_hex(job.as_bytes());
    let group = u16::from_str_radix(&digest[..4], 16).unwrap_or(0);
    Ok(Communicator::new(
        endpoint,
        members,
        group,
        CollectiveConfig {
            timeout,
            ..CollectiveConfig::default()
        },
    )?)
}

fn client_options(platform: &str, devices: Option<usize>) -> ClientOptions {
    let mut o = ClientOptions::default();
    if platform == "cpu" {
        if let Some(n) = devices {
            o = o.option("cpu_device_count", n as i64);
        }
    }
    o
}

impl Worker {
    /// Loads the plugin, probes its devices and registers.
    pub async fn start(kv: Arc<dyn KvStore>, cfg: WorkerConfig) -> Result<Worker> {
        let path = cfg.plugin.clone();
        let devices = cfg.devices;
        let load_started = std::time::Instant::now();
        let (plugin, facts) = tokio::task::spawn_blocking(move || -> Result<_> {
            let plugin = Plugin::load(&path)?;
            // The platform decides the options, so probe without any first
            // unless a CPU device count is asked for.
            let probe = Client::create(&plugin, ClientOptions::default())?;
            let platform = probe.platform_name()?;
            let probe = if platform == "cpu" && devices.is_some() {
                drop(probe);
                Client::create(&plugin, client_options(&platform, devices))?
            } else {
                probe
            };
            let mut by_kind: Vec<WorkerDevice> = Vec::new();
            for d in probe.addressable_devices()? {
                let kind = d.kind()?;
                match by_kind.iter_mut().find(|w| w.kind == kind) {
                    Some(w) => w.count += 1,
                    None => by_kind.push(WorkerDevice {
                        kind,
                        count: 1,
                        memory_bytes: d.memory_limit().ok().flatten(),
                    }),
                }
            }
            let version = probe.platform_version()?;
            Ok((
                plugin,
                PluginFacts {
                    platform,
                    version,
                    devices: by_kind,
                },
            ))
        })
        .await
        .map_err(|e| WorkerError::Internal(e.to_string()))??;
        let plugin_load = load_started.elapsed();
        let plugin_ready_unix_ms = keys::unix_ms();
        let host = HostFacts::read();
        let (major, minor) = plugin.api_version();
        let info = WorkerInfo {
            worker_id: cfg.worker_id.clone(),
            hostname: host.hostname.clone(),
            boot_id: host.boot_id.clone(),
            pid: std::process::id(),
            plugin_name: format!("{} ({})", facts.platform, plugin.path().display()),
            plugin_version: format!("{} / C API {major}.{minor}", facts.version),
            devices: facts.devices.clone(),
            transfer_addr: None,
        };
        let registration = registry::register(&*kv, info, cfg.liveness).await?;
        tracing::info!(
            worker = %registration.worker_id,
            incarnation = registration.incarnation,
            "registered"
        );
        Ok(Worker {
            plugin_ready_unix_ms,
            plugin_load,
            kv,
            cfg,
            plugin,
            facts,
            host,
            registration,
            runner: None,
        })
    }

    /// Who runs the plans of jobs that carry one (invariant 6). Without a
    /// runner, such a job fails with a message saying so.
    pub fn with_runner(mut self, runner: Arc<dyn JobRunner>) -> Worker {
        self.runner = Some(runner);
        self
    }

    pub fn registration(&self) -> &Registration {
        &self.registration
    }

    /// How long loading the plugin and probing its devices took, and when
    /// it finished (unix ms).
    pub fn plugin_load(&self) -> (Duration, u64) {
        (self.plugin_load, self.plugin_ready_unix_ms)
    }

    /// Runs assigned jobs until `shutdown` completes (then revokes the
    /// lease) or the registration is lost (invariant 1).
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        let me = Arc::new(self);
        let mut heartbeat =
            Heartbeat::start(me.kv.clone(), me.registration.clone(), me.cfg.liveness);
        let assignments = me.clone().follow_assignments();
        tokio::pin!(shutdown, assignments);
        tokio::select! {
            lost = heartbeat.lost() => Err(WorkerError::Coordinator(lost)),
            r = &mut assignments => r,
            () = &mut shutdown => {
                heartbeat.stop();
                let _ = me.kv.revoke(me.registration.lease).await;
                Ok(())
            }
        }
    }

    /// Starts a job process for every assignment, present and future.
    async fn follow_assignments(self: Arc<Self>) -> Result<()> {
        let prefix = keys::assignments(&self.registration.worker_id);
        let rev = self
            .kv
            .revision()
            .await
            .map_err(kv_err("reading the revision"))?;
        let mut events = self
            .kv
            .watch(prefix.as_bytes(), rev + 1)
            .await
            .map_err(kv_err("watching assignments"))?;
        let running: Arc<Mutex<HashSet<String>>> = Default::default();
        let existing = self
            .kv
            .list(prefix.as_bytes())
            .await
            .map_err(kv_err("listing assignments"))?;
        for pair in existing {
            self.clone().launch(&pair.value, &running);
        }
        while let Some(ev) = events.next().await {
            if let Event::Put(pair) = ev.map_err(kv_err("watching assignments"))? {
                self.clone().launch(&pair.value, &running);
            }
        }
        Err(WorkerError::Internal("the assignment watch ended".into()))
    }

    fn launch(self: Arc<Self>, bytes: &[u8], running: &Arc<Mutex<HashSet<String>>>) {
        let a = match JobAssignment::decode(bytes) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "ignoring a bad assignment");
                return;
            }
        };
        if !running.lock().expect("not poisoned").insert(a.job.clone()) {
            return;
        }
        let running = running.clone();
        tokio::spawn(async move {
            let job = a.job.clone();
            if let Err(e) = self.run_job(&a).await {
                tracing::error!(job = %job, error = %e, "job process failed");
            }
            running.lock().expect("not poisoned").remove(&job);
        });
    }

    /// One job process (2, 3, 5, 6). A failure is recorded while the
    /// process's client and transfer endpoint still exist: peers finishing
    /// a collective with it would otherwise see it vanish and record that
    /// instead (`jobs`, invariant 2).
    async fn run_job(&self, a: &JobAssignment) -> Result<()> {
        let mut client = None;
        let mut comm = None;
        let running = metrics::gauge!("tessel_worker_job_processes_running");
        running.increment(1.0);
        let started = std::time::Instant::now();
        let outcome = self.job_process(a, &mut client, &mut comm).await;
        running.decrement(1.0);
        let label = if outcome.is_ok() { "ended" } else { "failed" };
        metrics::counter!("tessel_worker_job_processes_total", "outcome" => label).increment(1);
        metrics::histogram!("tessel_worker_job_process_seconds", "outcome" => label)
            .record(started.elapsed().as_secs_f64());
        if let Err(e) = &outcome {
            self.record_failure(a, e).await;
        }
        drop(comm);
        // Drop the client off the runtime (invariant 4).
        if let Some(client) = client {
            let _ = tokio::task::spawn_blocking(move || drop(client)).await;
        }
        outcome
    }

    /// Fails the job with `e` unless it already failed, and records the
    /// job's first failure as the one this process saw (invariant 3).
    async fn record_failure(&self, a: &JobAssignment, e: &WorkerError) {
        let failure = JobFailure {
            worker: Some(self.registration.worker_id.clone()),
            incarnation: Some(self.registration.incarnation),
            reason: e.to_string(),
            unix_ms: keys::unix_ms(),
        };
        if let Ok(first) = jobs::fail_job(&*self.kv, &a.job, &failure).await {
            let _ = self
                .kv
                .put(
                    keys::process_failure_seen(&a.job, a.process_index).as_bytes(),
                    first.to_string().as_bytes(),
                )
                .await;
        }
    }

    /// Client, transfer endpoint, topology, a barrier of every process over
    /// the transfer layer, the plan, then the wait for the end; `client`
    /// and `comm` receive the resources so the caller outlives them.
    async fn job_process(
        &self,
        a: &JobAssignment,
        client: &mut Option<Client>,
        comm: &mut Option<Communicator>,
    ) -> Result<()> {
        jobs::join_job(&*self.kv, &a.job, &self.registration).await?;
        let client = &*client.insert(self.job_client(a).await?);
        let endpoint = Arc::new(TransferEndpoint::bind(
            SocketAddr::new(self.cfg.transfer_ip, 0),
            a.process_index,
            self.cfg.transfer_tls.as_ref(),
            TransferConfig {
                boot_id: Some(self.host.boot_id.clone()),
                ..TransferConfig::default()
            },
        )?);
        let mut local = self.describe(client, a).await?;
        local.transfer_endpoint = Some(endpoint.local_addr()?.to_string());
        let timeout = Duration::from_millis(a.topology_timeout_ms);
        let started = std::time::Instant::now();
        let topology = exchange(&*self.kv, &a.job, &local, timeout).await?;
        metrics::histogram!("tessel_worker_topology_exchange_seconds")
            .record(started.elapsed().as_secs_f64());
        tracing::info!(
            job = %a.job,
            process = a.process_index,
            devices = topology.num_devices(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "global topology known"
        );
        self.kv
            .put(
                keys::process_topology(&a.job, a.process_index).as_bytes(),
                topology_digest(&topology).as_bytes(),
            )
            .await
            .map_err(kv_err("publishing the topology digest"))?;
        let comm = comm.insert(communicator(endpoint, &topology, &a.job, timeout)?);
        let barrier = std::time::Instant::now();
        comm.barrier().await?;
        tracing::info!(
            job = %a.job,
            process = a.process_index,
            barrier_ms = barrier.elapsed().as_secs_f64() * 1e3,
            "transfer layer connected"
        );
        self.kv
            .put(
                keys::process_transfer_ready(&a.job, a.process_index).as_bytes(),
                format!("{:.1}", barrier.elapsed().as_secs_f64() * 1e3).as_bytes(),
            )
            .await
            .map_err(kv_err("publishing transfer readiness"))?;
        self.run_plan(a, client, comm).await?;
        self.wait_for_end(a).await
    }

    /// Invariant 6: runs the job's plan, if it has one.
    async fn run_plan(
        &self,
        a: &JobAssignment,
        client: &Client,
        comm: &mut Communicator,
    ) -> Result<()> {
        let spec = self
            .kv
            .try_get(keys::job_spec(&a.job).as_bytes())
            .await
            .map(Some)
            .or_else(|e| match e {
                tessel_kvstore::KvError::NotFound(_) => Ok(None),
                e => Err(e),
            })
            .map_err(kv_err("reading the job's spec"))?;
        if let Some(spec) = spec {
            let runner = self.runner.as_ref().ok_or_else(|| {
                WorkerError::Internal("this worker was started without a job runner".into())
            })?;
            let run = runner.run(JobProcess {
                job: &a.job,
                process_index: a.process_index,
                num_processes: a.num_processes,
                spec,
                client,
                communicator: comm,
                kv: &*self.kv,
            });
            // A failure elsewhere (a process's error, a lost worker) stops
            // this process's plan at its next await instead of leaving it
            // waiting in a collective until the deadline.
            // Cancellation (the job's `done` key) stops it the same way.
            let result = tokio::select! {
                r = run => Some(r.map_err(WorkerError::Job)?),
                f = self.job_failed(&a.job) => {
                    let f = f?;
                    return Err(WorkerError::Job(format!("the job failed: {f}")));
                }
                d = self.job_done(&a.job) => {
                    d?;
                    tracing::info!(job = %a.job, process = a.process_index, "job ended before its plan did");
                    None
                }
            };
            if let Some(result) = result {
                self.kv
                    .put(
                        keys::process_result(&a.job, a.process_index).as_bytes(),
                        &result,
                    )
                    .await
                    .map_err(kv_err("publishing the process's result"))?;
            }
        }
        Ok(())
    }

    async fn job_client(&self, a: &JobAssignment) -> Result<Client> {
        let plugin = self.plugin.clone();
        let mut options = client_options(&self.facts.platform, self.cfg.devices);
        if self.facts.platform != "cpu" {
            // Plugins that exchange topology themselves (CUDA) do it through
            // the job's namespace.
            options = options
                .option("num_nodes", a.num_processes as i64)
                .option("node_id", a.process_index as i64);
        }
        let store = Arc::new(JobKv::new(
            self.kv.clone(),
            &a.job,
            tokio::runtime::Handle::current(),
        ));
        let options = options.kv_store(store);
        tokio::task::spawn_blocking(move || Client::create(&plugin, options))
            .await
            .map_err(|e| WorkerError::Internal(e.to_string()))?
            .map_err(WorkerError::from)
    }

    async fn describe(&self, client: &Client, a: &JobAssignment) -> Result<LocalTopology> {
        // Device queries are cheap, non-blocking FFI reads.
        let mut devices = Vec::new();
        for d in client.addressable_devices()? {
            let mut attributes: Vec<(String, String)> = d
                .attributes()?
                .into_iter()
                .map(|nv| (nv.name, nv.value.to_string()))
                .collect();
            attributes.sort();
            devices.push(DeviceDescription {
                local_hardware_id: d.local_hardware_id()?,
                kind: d.kind()?,
                memory_bytes: d.memory_limit().ok().flatten(),
                attributes,
            });
        }
        Ok(LocalTopology {
            process_index: a.process_index,
            num_processes: a.num_processes,
            hostname: self.host.hostname.clone(),
            boot_id: self.host.boot_id.clone(),
            slice_index: self.cfg.slice_index,
            devices,
            transfer_endpoint: None,
        })
    }

    /// Returns the job's failure event once there is one.
    async fn job_failed(&self, job: &str) -> Result<JobFailure> {
        loop {
            if let Some(f) =
                jobs::wait_for_failure(&*self.kv, job, Duration::from_secs(3600)).await?
            {
                return Ok(f);
            }
        }
    }

    /// Returns once the job's `done` key exists.
    async fn job_done(&self, job: &str) -> Result<()> {
        let done = keys::job_done(job);
        loop {
            match self
                .kv
                .get(done.as_bytes(), Duration::from_secs(3600))
                .await
            {
                Ok(_) => return Ok(()),
                Err(tessel_kvstore::KvError::DeadlineExceeded { .. }) => continue,
                Err(e) => return Err(kv_err("waiting for the job's end")(e)),
            }
        }
    }

    /// Waits for `done`, or for a failure event, which it records.
    async fn wait_for_end(&self, a: &JobAssignment) -> Result<()> {
        tokio::select! {
            d = self.job_done(&a.job) => d?,
            f = self.job_failed(&a.job) => {
                let f = f?;
                tracing::warn!(job = %a.job, failure = %f, "job failed");
                self.kv
                    .put(
                        keys::process_failure_seen(&a.job, a.process_index).as_bytes(),
                        f.to_string().as_bytes(),
                    )
                    .await
                    .map_err(kv_err("recording the failure"))?;
            }
        }
        jobs::leave_job(&*self.kv, &a.job, &self.registration.worker_id).await?;
        self.kv
            .delete(keys::assignment(&self.registration.worker_id, &a.job).as_bytes())
            .await
            .map_err(kv_err("removing the assignment"))?;
        Ok(())
    }
}

/// SHA-256 of the encoded topology, in hex.
pub fn topology_digest(t: &GlobalTopology) -> String {
    tessel_topology::sha256_hex(&t.encode())
}

fn kv_err(context: &'static str) -> impl FnOnce(tessel_kvstore::KvError) -> WorkerError {
    move |source| WorkerError::Kv {
        context: context.into(),
        source,
    }
}
