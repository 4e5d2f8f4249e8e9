//! One job process on this worker: its client, transfer endpoint,
//! topology, barrier, plan, and the wait for the job's end.
//!
//! Invariants (the agent's, continued):
//! 2. Each job process gets its own PJRT client with KV callbacks bound to
//!    the job's namespace, living until the job is done or failed.
//! 3. Every job process publishes the digest of its global topology, then its
//!    transfer readiness (5), and records any failure it observed.
//! 4. PJRT calls that may block (client creation and destruction, which may
//!    call back into the KV) run on blocking threads.
//! 5. Each job process binds its own transfer endpoint (rank = process index)
//!    and passes a barrier with every other process after the exchange.
//! 6. A plan runs once the barrier passed; a finished process publishes its
//!    result, a failed one fails the job with its kind; a failure elsewhere
//!    or cancellation stops the plan at its next await.
//! 7. An assignment whose attempt already ended (`done`) is withdrawn, not
//!    run: a worker that comes back never reruns an old attempt.
//! 8. A failure elsewhere also stops the topology exchange and the transfer
//!    barrier: a peer lost before it arrived is seen within its lease's
//!    TTL, not after the topology timeout.
//! 9. A process's transfers are encrypted unless its worker allows them off
//!    (`--transfer-encryption off`) and the job does not ask for them on; a
//!    job that asks for them off on a worker that keeps them on fails.
//! 10. The job's failure and its end are each one blocking get, held while
//!     this worker runs a process of the attempt and shared by every phase
//!     that stops on them (`job_end`), not a get of their own each.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tessel_coordinator::attempt::{self, Record};
use tessel_coordinator::jobs::{self, JobAssignment, JobFailure};
use tessel_coordinator::{Item, Records, Registration};
use tessel_kv::KvStore;
use tessel_pjrt::{Client, ClientOptions};
use tessel_topology::{exchange, DeviceDescription, GlobalTopology, LocalTopology};
use tessel_trace::TARGET;
use tessel_transfer::{
    CollectiveConfig, Communicator, Encryption, TransferConfig, TransferEndpoint,
};
use tracing::Instrument;

use crate::agent::{client_options, Worker};
use crate::error::{kv_err, Result, WorkerError};
use crate::job_kv::JobKv;
use crate::runner::{JobProcess, PreparedJob};

/// How long recording a failure may take: a worker cut off from the
/// coordinators gives up, and the monitor records its loss instead.
const RECORD_DEADLINE: Duration = Duration::from_secs(5);

/// The job's communicator: one member per process, each looked up in the
/// job's directory when the communicator first talks to it
/// (`peers`).
fn communicator(
    endpoint: Arc<TransferEndpoint>,
    kv: Arc<dyn KvStore>,
    topology: &GlobalTopology,
    me: u32,
    job: &str,
    timeout: Duration,
) -> Result<Communicator> {
    let members = crate::peers::members(kv, job, topology, me, timeout)
        .ok_or_else(|| WorkerError::Internal(format!("process {me} is not in the topology")))?;
    let digest = tessel_topology::sha256_hex(job.as_bytes());
    let group = u16::from_str_radix(&digest[..4], 16).unwrap_or(0);
    Ok(Communicator::with_members(
        endpoint,
        members,
        group,
        CollectiveConfig {
            timeout,
            ..CollectiveConfig::default()
        },
    )?)
}

/// This process stops because the job failed elsewhere: the job's failure,
/// as this process's error (recording it finds the first one stored).
fn failed_elsewhere(f: JobFailure) -> WorkerError {
    WorkerError::Job(crate::runner::JobError {
        kind: f.kind,
        message: format!("the job failed: {f}"),
    })
}

impl Worker {
    /// One job process for registration `reg` (invariants 2-7). Stops
    /// early, without recording a failure of its own, when `reg` stops
    /// being this worker's registration. A failure is recorded while the
    /// process's client and transfer endpoint still exist: peers finishing
    /// a collective with it would otherwise see it vanish and record that
    /// instead (`jobs`, invariant 2).
    pub(crate) async fn run_job(&self, a: &JobAssignment, reg: &Registration) -> Result<()> {
        if self.attempt_ended(a, reg).await? {
            return Ok(());
        }
        // Invariant 10: the waits every phase shares, for the process's life.
        let _ends = self.ends.of(&self.kv, &a.attempt);
        let mut client = None;
        let mut comm = None;
        let running = metrics::gauge!("tessel_worker_job_processes_running");
        running.increment(1.0);
        let started = std::time::Instant::now();
        let outcome = tokio::select! {
            r = self.job_process(a, reg, &mut client, &mut comm) => r,
            () = self.deregistered(reg.incarnation) => Err(WorkerError::Deregistered),
        };
        running.decrement(1.0);
        let label = if outcome.is_ok() { "ended" } else { "failed" };
        metrics::counter!("tessel_worker_job_processes_total", "outcome" => label).increment(1);
        metrics::histogram!("tessel_worker_job_process_seconds", "outcome" => label)
            .record(started.elapsed().as_secs_f64());
        // A process stopped because this worker lost its registration or
        // is shutting down records nothing: the monitor records the loss
        // (the lease expired or was revoked) for every job it joined.
        match &outcome {
            Ok(()) | Err(WorkerError::Deregistered) => {}
            Err(e) => self.record_failure(a, reg, e).await,
        }
        drop(comm);
        // Drop the client off the runtime (invariant 4).
        if let Some(client) = client {
            let _ = tokio::task::spawn_blocking(move || drop(client)).await;
        }
        outcome
    }

    /// Invariant 7: true (and the assignment withdrawn) when the attempt
    /// ended while this worker was away.
    async fn attempt_ended(&self, a: &JobAssignment, reg: &Registration) -> Result<bool> {
        let done = Records::new(&*self.kv, &a.attempt)
            .get(Item::Done)
            .await
            .map_err(kv_err("reading whether the job ended"))?;
        if done.is_some() {
            tracing::info!(job = %a.attempt, "withdrawing the assignment of an ended attempt");
            jobs::unassign(&*self.kv, &reg.worker_id, &a.attempt).await?;
        }
        Ok(done.is_some())
    }

    /// Fails the job with `e` unless it already failed, and records the
    /// job's first failure as the one this process saw (invariant 3).
    /// Bounded: a worker cut off from the coordinators gives up.
    pub(crate) async fn record_failure(
        &self,
        a: &JobAssignment,
        reg: &Registration,
        e: &WorkerError,
    ) {
        let failure = JobFailure {
            worker: Some(reg.worker_id.clone()),
            incarnation: Some(reg.incarnation),
            kind: e.kind(),
            reason: e.to_string(),
            unix_ms: tessel_coordinator::unix_ms(),
        };
        let record = async {
            if let Ok(first) = jobs::fail_job(&*self.kv, &a.attempt, &failure).await {
                let seen = first.to_string();
                let _ = attempt::publish(
                    &*self.kv,
                    &a.attempt,
                    a.process_index,
                    Record::FailureSeen,
                    seen.as_bytes(),
                )
                .await;
            }
        };
        if tokio::time::timeout(RECORD_DEADLINE, record).await.is_err() {
            tracing::warn!(job = %a.attempt, failure = %failure, "could not record the failure");
        }
    }

    /// Client, transfer endpoint, topology, a barrier of every process over
    /// the transfer layer, the plan, then the wait for the end; `client`
    /// and `comm` receive the resources so the caller outlives them.
    async fn job_process(
        &self,
        a: &JobAssignment,
        reg: &Registration,
        client: &mut Option<Client>,
        comm: &mut Option<Communicator>,
    ) -> Result<()> {
        jobs::join_job(&*self.kv, &a.attempt, reg).await?;
        // The spec, read once: it says whether this is a command job, the
        // client's options, and the plan.
        let spec = Records::new(&*self.kv, &a.attempt)
            .get(Item::Spec)
            .await
            .map_err(kv_err("reading the job's spec"))?;
        let job = spec.map(|s| self.runner.prepare(&s)).transpose()?;
        if let Some(launch) = job.as_ref().and_then(|j| j.command()) {
            return self.run_command(a, reg, launch).await;
        }
        // The plugin's client for this process (the plugin itself was
        // loaded when the worker started).
        let created = self
            .job_client(a, job.as_deref())
            .instrument(tracing::info_span!(target: TARGET, "create_client"))
            .await?;
        let client = &*client.insert(created);
        let encryption = transfer_encryption(
            self.cfg.transfer_encryption,
            job.as_ref().and_then(|j| j.transfer_encryption()),
            &self.cfg.worker_id,
        )?;
        let endpoint = Arc::new(TransferEndpoint::bind(
            SocketAddr::new(self.cfg.transfer_ip, 0),
            a.process_index,
            self.cfg.transfer_tls.as_ref(),
            TransferConfig {
                boot_id: Some(self.host.boot_id.clone()),
                encryption,
                job: a.attempt.to_string(),
                ..TransferConfig::default()
            },
        )?);
        let mut local = self.describe(client, a).await?;
        local.transfer_endpoint = Some(endpoint.local_addr()?.to_string());
        local.transfer_encrypted = encryption.is_on();
        let timeout = Duration::from_millis(a.topology_timeout_ms);
        let started = std::time::Instant::now();
        let topology = self
            .unless_failed(a, async {
                let span = tracing::info_span!(target: TARGET, "topology_exchange");
                Ok(exchange(&*self.kv, &a.attempt, &local, timeout)
                    .instrument(span)
                    .await?)
            })
            .await?;
        metrics::histogram!("tessel_worker_topology_exchange_seconds")
            .record(started.elapsed().as_secs_f64());
        tracing::info!(
            job = %a.attempt,
            process = a.process_index,
            devices = topology.num_devices(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "global topology known"
        );
        let digest = tessel_topology::digest(&topology);
        attempt::publish(
            &*self.kv,
            &a.attempt,
            a.process_index,
            Record::Topology,
            digest.as_bytes(),
        )
        .await?;
        let comm = comm.insert(communicator(
            endpoint,
            self.kv.clone(),
            &topology,
            a.process_index,
            &a.attempt,
            timeout,
        )?);
        let barrier = std::time::Instant::now();
        self.unless_failed(a, async {
            let span = tracing::info_span!(target: TARGET, "transfer_barrier");
            Ok(comm.barrier().instrument(span).await?)
        })
        .await?;
        tracing::info!(
            job = %a.attempt,
            process = a.process_index,
            barrier_ms = barrier.elapsed().as_secs_f64() * 1e3,
            "transfer layer connected"
        );
        let ms = format!("{:.1}", barrier.elapsed().as_secs_f64() * 1e3);
        attempt::publish(
            &*self.kv,
            &a.attempt,
            a.process_index,
            Record::TransferReady,
            ms.as_bytes(),
        )
        .await?;
        if let Some(job) = job {
            self.run_plan(a, job, client, comm, &topology).await?;
        }
        self.wait_for_end(a, reg).await
    }

    /// Invariant 6: runs the job's plan (a job without a spec has none).
    async fn run_plan(
        &self,
        a: &JobAssignment,
        job: Box<dyn PreparedJob>,
        client: &Client,
        comm: &mut Communicator,
        topology: &GlobalTopology,
    ) -> Result<()> {
        let run = job.run(JobProcess {
            job: &a.attempt,
            process_index: a.process_index,
            num_processes: a.num_processes,
            client,
            communicator: comm,
            kv: self.kv.clone(),
            topology,
            checkpoint_roots: &self.cfg.checkpoint_roots,
        });
        // A failure elsewhere (a process's error, a lost worker) stops
        // this process's plan at its next await instead of leaving it
        // waiting in a collective until the deadline. Cancellation (the
        // job's `done` key) stops it the same way.
        let run = run.instrument(tracing::info_span!(target: TARGET, "plan"));
        let result = tokio::select! {
            r = run => r?,
            f = self.job_failed(&a.attempt) => return Err(failed_elsewhere(f?)),
            d = self.job_done(&a.attempt) => {
                d?;
                tracing::info!(job = %a.attempt, process = a.process_index, "job ended before its plan did");
                return Ok(());
            }
        };
        attempt::publish(
            &*self.kv,
            &a.attempt,
            a.process_index,
            Record::Result,
            &result,
        )
        .await?;
        Ok(())
    }

    async fn job_client(&self, a: &JobAssignment, job: Option<&dyn PreparedJob>) -> Result<Client> {
        let plugin = self.plugin.clone();
        // The job's own options override the worker's, name by name.
        let mut named = self.cfg.plugin_options.clone();
        if let Some(job) = job {
            for nv in job.client_options() {
                named.retain(|o| o.name != nv.name);
                named.push(nv);
            }
        }
        let mut options = client_options(&self.facts.platform, self.cfg.devices, &named);
        if self.facts.platform == "tpu" {
            self.set_tpu_env(a).await?;
        }
        if self.facts.platform != "cpu" {
            // Plugins that exchange topology themselves (CUDA) do it through
            // the job's namespace.
            options = options
                .option("num_nodes", a.num_processes as i64)
                .option("node_id", a.process_index as i64);
        }
        let store = Arc::new(JobKv::new(
            self.kv.clone(),
            &a.attempt,
            tokio::runtime::Handle::current(),
        ));
        // Every wait has the job's bootstrap deadline: each get the plugin
        // makes, and its client creation as a whole (a plugin blocked
        // elsewhere is abandoned on its thread, naming what it waited for).
        // The gets' limit comes first, so that a plugin can report a missing
        // peer in its own words; the overall one catches any other wait.
        let limit = Duration::from_millis(a.topology_timeout_ms);
        let options: ClientOptions = options.kv_store(store).kv_wait_limit(limit);
        let overall = limit + Duration::from_secs(5);
        tokio::task::spawn_blocking(move || Client::create_within(&plugin, options, overall))
            .await
            .map_err(|e| WorkerError::Internal(e.to_string()))?
            .map_err(WorkerError::from)
    }

    /// libtpu reads the slice's hosts from its environment when the client
    /// is created: exchange them, then set it (`tpu` invariant 1).
    async fn set_tpu_env(&self, a: &JobAssignment) -> Result<()> {
        let mine = crate::tpu::TpuHost {
            hostname: self
                .cfg
                .host_name
                .clone()
                .unwrap_or_else(|| self.host.hostname.clone()),
            slice: self.cfg.slice_index.unwrap_or(0),
        };
        let hosts = crate::tpu::exchange_hosts(
            &*self.kv,
            &a.attempt,
            a.process_index,
            a.num_processes,
            &mine,
            Duration::from_millis(a.topology_timeout_ms),
        )
        .await?;
        let env = crate::tpu::tpu_env(&hosts, a.process_index as usize, &self.cfg.tpu_platform_env)
            .map_err(WorkerError::Config)?;
        for (k, v) in env {
            tracing::info!(job = %a.attempt, var = %k, value = %v, "libtpu environment");
            // The worker runs one TPU job process at a time (the chips are
            // the process's), and libtpu reads these only at client creation.
            std::env::set_var(k, v);
        }
        Ok(())
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
            worker: self.cfg.worker_id.clone(),
            hostname: self.host.hostname.clone(),
            boot_id: self.host.boot_id.clone(),
            slice_index: self.cfg.slice_index,
            devices,
            transfer_endpoint: None,
            transfer_encrypted: true,
        })
    }

    /// `step`, unless the job fails first (invariant 8): the topology
    /// exchange and the transfer barrier wait for every peer, and a peer
    /// lost before it arrived would keep them waiting for their timeout.
    async fn unless_failed<T>(
        &self,
        a: &JobAssignment,
        step: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::select! {
            r = step => r,
            f = self.job_failed(&a.attempt) => Err(failed_elsewhere(f?)),
        }
    }

    /// Returns the job's failure event once there is one (invariant 10).
    pub(crate) async fn job_failed(&self, job: &str) -> Result<JobFailure> {
        self.ends.of(&self.kv, job).failed().await
    }

    /// Returns once the job's `done` key exists (invariant 10).
    pub(crate) async fn job_done(&self, job: &str) -> Result<()> {
        self.ends.of(&self.kv, job).done().await
    }

    /// Waits for `done`, or for a failure event, which it records.
    pub(crate) async fn wait_for_end(&self, a: &JobAssignment, reg: &Registration) -> Result<()> {
        tokio::select! {
            d = self.job_done(&a.attempt) => d?,
            f = self.job_failed(&a.attempt) => {
                let f = f?;
                tracing::warn!(job = %a.attempt, failure = %f, "job failed");
                let seen = f.to_string();
                attempt::publish(
                    &*self.kv,
                    &a.attempt,
                    a.process_index,
                    Record::FailureSeen,
                    seen.as_bytes(),
                )
                .await?;
            }
        }
        jobs::leave_job(&*self.kv, &a.attempt, &reg.worker_id).await?;
        Ok(())
    }
}

/// The encryption of a job's transfers on this worker (invariant 9): what
/// the job asks for, else the worker's; a job may not turn it off where
/// the worker keeps it on.
pub(crate) fn transfer_encryption(
    worker: Encryption,
    job: Option<Encryption>,
    worker_id: &str,
) -> Result<Encryption> {
    match (worker, job) {
        (Encryption::On, Some(Encryption::Off)) => Err(WorkerError::Config(format!(
            "the job asks for transfer encryption off, but worker `{worker_id}` keeps it on \
             (start it with --transfer-encryption off where the network is trusted)"
        ))),
        (w, j) => Ok(j.unwrap_or(w)),
    }
}

#[cfg(test)]
mod encryption_tests {
    use super::*;

    #[test]
    fn a_job_may_turn_encryption_on_anywhere_and_off_only_where_the_worker_has_it_off() {
        use Encryption::{Off, On};
        assert_eq!(transfer_encryption(On, None, "w").unwrap(), On);
        assert_eq!(transfer_encryption(Off, None, "w").unwrap(), Off);
        assert_eq!(transfer_encryption(Off, Some(On), "w").unwrap(), On);
        assert_eq!(transfer_encryption(Off, Some(Off), "w").unwrap(), Off);
        let e = transfer_encryption(On, Some(Off), "w7").unwrap_err();
        assert!(e.to_string().contains("worker `w7` keeps it on"), "{e}");
    }
}
