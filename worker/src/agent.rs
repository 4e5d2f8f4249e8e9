//! The per-host agent: registration, heartbeat, and its job processes.
//!
//! Invariants (2-7 are those of `process.rs`, one job process):
//! 1. A worker lost through no rival (say its lease expired while cut off)
//!    stops its old incarnation's processes, then registers again; it stops
//!    for good only when another live process took its id, or on shutdown.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tessel_coordinator::jobs::JobAssignment;
use tessel_coordinator::registry::{self, Heartbeat, Registration};
use tessel_coordinator::{keys, CoordinatorError, LivenessConfig, WorkerDevice, WorkerInfo};
use tessel_kv::{Event, KvError, KvStore};
use tessel_pjrt::{Client, ClientOptions, Plugin};
use tokio::sync::watch;

use crate::error::kv_err;
use crate::error::{Result, WorkerError};
use crate::host::HostFacts;
use crate::runner::JobRunner;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Stable across restarts (default: the hostname).
    pub worker_id: String,
    /// The plugin as the operator named it (`cpu`, `cuda`, or a path):
    /// jobs ask for it by this name or by its platform.
    pub plugin_name: String,
    /// The plugin library.
    pub plugin: PathBuf,
    /// CPU devices per client (`cpu_device_count`); other plugins have the
    /// devices they have.
    pub devices: Option<usize>,
    /// Heartbeat and lease TTL.
    pub liveness: LivenessConfig,
    /// An explicit slice index for topologies.
    pub slice_index: Option<u32>,
    /// The name other hosts reach this one by (libtpu's host list);
    /// `None`: the kernel's host name.
    pub host_name: Option<String>,
    /// The TPU variables the platform set in the worker's environment at
    /// start ([`crate::tpu::platform_env`]): kept, never overwritten.
    pub tpu_platform_env: Vec<(String, String)>,
    /// Print command jobs' output on this process's stdout too.
    pub echo_job_output: bool,
    /// Where job processes bind their transfer endpoints (an address the
    /// other workers can reach; the port is chosen per job), and the
    /// cluster's TLS files for it (`None`: `--insecure`).
    pub transfer_ip: std::net::IpAddr,
    /// The TLS files of the transfer endpoint (`None`: `--insecure`).
    pub transfer_tls: Option<tessel_tls::TlsFiles>,
    /// Whether jobs' network transfers here are encrypted
    /// (`--transfer-encryption`; off declares the network trusted). A job
    /// may ask for `on` anywhere, for `off` only where this is off.
    pub transfer_encryption: tessel_transfer::Encryption,
    /// Folders under which jobs may keep checkpoints on this host.
    pub checkpoint_roots: Vec<PathBuf>,
    /// Create options of every client of the plugin (`--plugin-option`).
    pub plugin_options: Vec<tessel_pjrt::NamedValue>,
    /// After a preemption notice, how long command jobs' processes have
    /// to checkpoint before SIGTERM (`--preempt-grace-ms`).
    pub preempt_grace: Duration,
    /// Where command jobs' attempts get their folders (`--work-dir`).
    pub work_dir: PathBuf,
    /// Variables every command job's processes get besides the job's:
    /// how to reach the coordinators (`TESSEL_COORDINATORS`,
    /// `TESSEL_TLS_DIR`).
    pub command_env: Vec<(String, String)>,
}

/// What the probe client found.
#[derive(Debug, Clone)]
pub(crate) struct PluginFacts {
    pub(crate) platform: String,
    version: String,
    devices: Vec<WorkerDevice>,
}

/// Beyond the preemption grace, for processes to stop and records to land.
const STOP_MARGIN: Duration = Duration::from_secs(15);

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A registered worker.
pub struct Worker {
    /// When the plugin was loaded and probed (unix ms).
    plugin_ready_unix_ms: u64,
    /// How long loading and probing took.
    plugin_load: Duration,
    pub(crate) kv: Arc<dyn KvStore>,
    pub(crate) cfg: WorkerConfig,
    pub(crate) plugin: Plugin,
    pub(crate) facts: PluginFacts,
    pub(crate) host: HostFacts,
    info: WorkerInfo,
    /// The registration job processes may act for; `None` while there is
    /// none (invariant 1).
    registration: watch::Sender<Option<Registration>>,
    pub(crate) runner: Arc<dyn JobRunner>,
    /// Per command job: held while this worker runs its processes of any
    /// attempt, so a new attempt starts only once the last one's stopped.
    pub(crate) gangs: crate::command::GangLocks,
    /// Each attempt's failure and end, one wait each while a process of
    /// it runs here (`process` invariant 10).
    pub(crate) ends: crate::job_end::JobEnds,
}

pub(crate) fn client_options(
    platform: &str,
    devices: Option<usize>,
    extra: &[tessel_pjrt::NamedValue],
) -> ClientOptions {
    let mut o = ClientOptions::default();
    for nv in extra {
        o = o.option(nv.name.clone(), nv.value.clone());
    }
    if platform == "cpu" {
        if let Some(n) = devices {
            o = o.option("cpu_device_count", n as i64);
        }
    }
    o
}

/// Loads the plugin and probes its devices, on a blocking thread.
async fn probe(
    path: PathBuf,
    devices: Option<usize>,
    options: Vec<tessel_pjrt::NamedValue>,
) -> Result<(Plugin, PluginFacts)> {
    tokio::task::spawn_blocking(move || -> Result<_> {
        let plugin = Plugin::load(&path)?;
        // The platform decides the options, so probe without any first
        // unless a CPU device count is asked for.
        let probe = Client::create(&plugin, client_options("", None, &options))?;
        let platform = probe.platform_name()?;
        let probe = if platform == "cpu" && devices.is_some() {
            drop(probe);
            Client::create(&plugin, client_options(&platform, devices, &options))?
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
    .map_err(|e| WorkerError::Internal(e.to_string()))?
}

/// A worker's certificate must be a worker's, for its own id (the
/// coordinators enforce the same: kv-service's `authz`).
fn check_identity(cfg: &WorkerConfig) -> Result<()> {
    use tessel_tls::{Identity, Role};
    match cfg.transfer_tls.as_ref().map(|t| t.identity()).as_ref() {
        Some(Identity::Node {
            role: Role::Worker,
            name,
        }) if *name != cfg.worker_id => Err(WorkerError::Config(format!(
            "--worker-id {} does not match this worker's certificate, which is worker `{name}`'s",
            cfg.worker_id
        ))),
        Some(id @ Identity::Node { role, .. }) if *role != Role::Worker => Err(WorkerError::Config(format!(
            "this certificate is {id}'s; a worker needs a worker certificate (`tessel certs issue --role worker --name {}`)",
            cfg.worker_id
        ))),
        _ => Ok(()),
    }
}

/// Retry pause of a worker registering again after a loss, or following
/// its assignments again after their watch broke.
const REREGISTER_BACKOFF: Duration = Duration::from_secs(1);

impl Worker {
    /// Loads the plugin, probes its devices, takes the worker id (refused
    /// while another live process holds it: [`crate::claim`]) and
    /// registers. `runner` runs the plans of jobs that carry one.
    pub async fn start(
        kv: Arc<dyn KvStore>,
        cfg: WorkerConfig,
        runner: Arc<dyn JobRunner>,
    ) -> Result<Worker> {
        tessel_coordinator::check_id("worker id", &cfg.worker_id)?;
        check_identity(&cfg)?;
        let load_started = std::time::Instant::now();
        let (plugin, facts) =
            probe(cfg.plugin.clone(), cfg.devices, cfg.plugin_options.clone()).await?;
        let plugin_load = load_started.elapsed();
        let plugin_ready_unix_ms = tessel_coordinator::unix_ms();
        let host = HostFacts::read();
        let (major, minor) = plugin.api_version();
        let info = WorkerInfo {
            worker_id: cfg.worker_id.clone(),
            hostname: host.hostname.clone(),
            boot_id: host.boot_id.clone(),
            pid: std::process::id(),
            plugin: cfg.plugin_name.clone(),
            platform: facts.platform.clone(),
            plugin_version: format!("{} / C API {major}.{minor}", facts.version),
            devices: facts.devices.clone(),
            ttl_ms: cfg.liveness.ttl.as_millis() as u64,
        };
        crate::claim::claim(&*kv, &cfg.worker_id, &host).await?;
        let reg = registry::register(&*kv, info.clone(), cfg.liveness).await?;
        tracing::info!(worker = %reg.worker_id, incarnation = reg.incarnation, "registered");
        Ok(Worker {
            plugin_ready_unix_ms,
            plugin_load,
            kv,
            cfg,
            plugin,
            facts,
            host,
            info,
            registration: watch::Sender::new(Some(reg)),
            runner,
            gangs: Default::default(),
            ends: Default::default(),
        })
    }

    /// Follows this worker's registration: `None` while it holds no lease.
    pub fn registration_watch(&self) -> watch::Receiver<Option<Registration>> {
        self.registration.subscribe()
    }

    /// The current registration.
    pub fn registration(&self) -> Registration {
        self.registration
            .borrow()
            .clone()
            .expect("registered between start and run")
    }

    /// How long loading the plugin and probing its devices took, and when
    /// it finished (unix ms).
    pub fn plugin_load(&self) -> (Duration, u64) {
        (self.plugin_load, self.plugin_ready_unix_ms)
    }

    /// Runs assigned jobs until `shutdown` completes (then stops its job
    /// processes and revokes the lease) or another process takes the
    /// worker id (invariant 1). `on_register` hears every registration
    /// after the first, with its incarnation.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
        on_register: impl Fn(&Registration),
    ) -> Result<()> {
        let me = Arc::new(self);
        tokio::pin!(shutdown);
        let running: Arc<Mutex<HashSet<String>>> = Default::default();
        let drain = tokio::spawn(me.clone().follow_drain(running.clone()));
        let _drain = AbortOnDrop(drain);
        loop {
            let reg = me.registration();
            let mut heartbeat = Heartbeat::start(me.kv.clone(), reg.clone(), me.cfg.liveness);
            let assignments = me.clone().follow_assignments(reg.clone(), running.clone());
            tokio::pin!(assignments);
            let lost = tokio::select! {
                lost = heartbeat.lost() => lost,
                r = &mut assignments => return r,
                () = &mut shutdown => {
                    // `preempt` invariant 2: the notice, then time to act
                    // on it, with the lease still held.
                    if !running.lock().expect("not poisoned").is_empty() {
                        let drain = keys::drain(&reg.worker_id);
                        let drained = me.kv.try_get(drain.as_bytes()).await.is_ok();
                        let why = format!("worker `{}` is stopping (SIGTERM)", reg.worker_id);
                        me.notify(&running, &why).await;
                        me.wait_for_processes(&running, me.cfg.preempt_grace + STOP_MARGIN).await;
                        // A drain of its own making ends with it; an
                        // operator's stays for the next start.
                        if !drained {
                            let _ = me.kv.delete(drain.as_bytes()).await;
                        }
                    }
                    heartbeat.stop();
                    me.registration.send_replace(None);
                    me.wait_for_processes(&running, Duration::from_secs(5)).await;
                    let _ = me.kv.revoke(reg.lease).await;
                    return Ok(());
                }
            };
            // Invariant 1: stop the lost incarnation's processes first.
            me.registration.send_replace(None);
            if let CoordinatorError::StaleIncarnation {
                current: Some(current),
                ..
            } = &lost
            {
                if *current > reg.incarnation {
                    return Err(WorkerError::Coordinator(lost));
                }
            }
            tracing::warn!(worker = %reg.worker_id, incarnation = reg.incarnation, error = %lost, "registration lost; registering again");
            let reg = tokio::select! {
                r = me.register_again() => r?,
                () = &mut shutdown => return Ok(()),
            };
            on_register(&reg);
            me.registration.send_replace(Some(reg));
        }
    }

    /// A new incarnation, retried until the coordinators answer.
    async fn register_again(&self) -> Result<Registration> {
        loop {
            let attempt = async {
                crate::claim::claim(&*self.kv, &self.cfg.worker_id, &self.host).await?;
                Ok::<_, WorkerError>(
                    registry::register(&*self.kv, self.info.clone(), self.cfg.liveness).await?,
                )
            };
            match tokio::time::timeout(self.cfg.liveness.ttl * 2, attempt).await {
                Ok(Ok(reg)) => return Ok(reg),
                Ok(Err(e @ WorkerError::IdInUse { .. })) => return Err(e),
                Ok(Err(e)) => tracing::warn!(error = %e, "registering again failed; retrying"),
                Err(_) => tracing::warn!("registering again timed out; retrying"),
            }
            tokio::time::sleep(REREGISTER_BACKOFF).await;
        }
    }

    /// Returns once `incarnation` is no longer this worker's registration.
    pub(crate) async fn deregistered(&self, incarnation: u64) {
        let mut rx = self.registration.subscribe();
        let _ = rx
            .wait_for(|r| r.as_ref().map(|r| r.incarnation) != Some(incarnation))
            .await;
    }

    /// Waits up to `limit` for every job process to end.
    async fn wait_for_processes(&self, running: &Mutex<HashSet<String>>, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while !running.lock().expect("not poisoned").is_empty()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts a job process for every assignment of `reg`, present and
    /// future. A watch the replicas' loss or a partition broke is followed
    /// again (invariant 1: ending here stopped the worker, racing the
    /// heartbeat's `LeaseNotFound` after a healed partition); whether the
    /// registration outlived it is the heartbeat's to say.
    async fn follow_assignments(
        self: Arc<Self>,
        reg: Registration,
        running: Arc<Mutex<HashSet<String>>>,
    ) -> Result<()> {
        loop {
            match self.clone().follow_assignments_once(&reg, &running).await {
                Err(WorkerError::Kv {
                    source: KvError::Unavailable(e),
                    ..
                }) => {
                    tracing::warn!(error = %e, "the assignment watch broke; following again");
                    tokio::time::sleep(REREGISTER_BACKOFF).await;
                }
                r => return r,
            }
        }
    }

    /// One listing and watch of [`Self::follow_assignments`], until the
    /// watch fails or ends.
    async fn follow_assignments_once(
        self: Arc<Self>,
        reg: &Registration,
        running: &Arc<Mutex<HashSet<String>>>,
    ) -> Result<()> {
        let prefix = keys::assignments(&reg.worker_id);
        // The listing, then every change after it (etcd's list-then-watch).
        let existing = self
            .kv
            .list_at(prefix.as_bytes())
            .await
            .map_err(kv_err("listing assignments"))?;
        let mut events = self
            .kv
            .watch(prefix.as_bytes(), existing.revision + 1)
            .await
            .map_err(kv_err("watching assignments"))?;
        for pair in existing.pairs {
            self.clone().launch(&pair.value, reg, running);
        }
        while let Some(ev) = events.next().await {
            if let Event::Put(pair) = ev.map_err(kv_err("watching assignments"))? {
                self.clone().launch(&pair.value, reg, running);
            }
        }
        Err(WorkerError::Internal("the assignment watch ended".into()))
    }

    fn launch(
        self: Arc<Self>,
        bytes: &[u8],
        reg: &Registration,
        running: &Arc<Mutex<HashSet<String>>>,
    ) {
        let a = match JobAssignment::decode(bytes) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "ignoring a bad assignment");
                return;
            }
        };
        if !running
            .lock()
            .expect("not poisoned")
            .insert(a.attempt.clone())
        {
            return;
        }
        let running = running.clone();
        let reg = reg.clone();
        // Every line this process logs carries its job, attempt and process
        // (as fields of `--log-format json`), and its spans join the job's
        // trace under the attempt's span.
        let id = tessel_coordinator::scheduler::job_of_instance(&a.attempt);
        let attempt = crate::command::attempt_of(&a.attempt);
        let span = tracing::info_span!(
            target: tessel_trace::TARGET,
            "job_process",
            job = %id,
            attempt,
            process = a.process_index,
            worker = %reg.worker_id,
        );
        tessel_trace::join_attempt(&span, a.trace.as_deref(), attempt);
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                let job = a.attempt.clone();
                match self.run_job(&a, &reg).await {
                    Ok(()) => {}
                    Err(WorkerError::Deregistered) => {
                        tracing::info!(job = %job, "job process stopped with its registration")
                    }
                    // A planned move (a notice or a drain) is not a failure.
                    Err(e) if e.kind().is_planned() => {
                        tracing::info!(job = %job, reason = %e, "job process suspended for a planned move")
                    }
                    Err(e) => tracing::error!(job = %job, error = %e, "job process failed"),
                }
                running.lock().expect("not poisoned").remove(&job);
            },
            span,
        ));
    }
}
