//! A whole job in one process: restore, steps, reports, checkpoints,
//! results; and the worker's hook that runs it.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tessel_trace::TARGET;
use tracing::Instrument;

use crate::job::ValidatedJob;

use super::{written_arrays, JobBundle, PlanError, PlanTimings, ProcessPlan, MAX_FETCHABLE};

/// Steps per traced batch, at most.
const STEPS_PER_SPAN: u64 = 100;

/// A traced batch of steps: the span records its last step when the
/// batch ends (dropped), so a step costs a store, not a span update.
struct StepBatch {
    span: tracing::Span,
    last: u64,
}

impl StepBatch {
    fn open(first_step: u64) -> StepBatch {
        StepBatch {
            span: tracing::info_span!(target: TARGET, "steps", first_step, last_step = tracing::field::Empty),
            last: first_step,
        }
    }
}

impl Drop for StepBatch {
    fn drop(&mut self) {
        self.span.record("last_step", self.last);
    }
}

/// One report: the step it followed and the scalars.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepReport {
    /// The step.
    pub step: u64,
    /// The scalars by array name.
    pub values: BTreeMap<String, f64>,
    /// When it was taken.
    pub unix_ms: u64,
}

/// What a process publishes when its plan is done.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProcessResult {
    /// The process's index.
    pub process: u32,
    /// Where its time went.
    pub timings: PlanTimings,
    /// Its last report, if it reported.
    pub last_report: Option<StepReport>,
    /// Reports dropped because the coordinators fell behind.
    #[serde(default)]
    pub reports_dropped: u64,
}

/// Runs a whole job in one process: decode, prepare, restore, every step,
/// reports and checkpoints, the final arrays (process 0).
pub async fn run_job_process(
    process: tessel_worker::JobProcess<'_>,
    job: ValidatedJob,
) -> Result<ProcessResult, PlanError> {
    let job_id = tessel_coordinator::scheduler::job_of_instance(process.job).to_owned();
    if job.spec.processes != process.num_processes {
        return Err(PlanError::Other(format!(
            "the spec asks for {} processes, the job was started with {}",
            job.spec.processes, process.num_processes
        )));
    }
    let index = process.process_index as usize;
    let client = process.client;
    let comm = process.communicator;
    let started = Instant::now();
    let text = job.text.clone();
    let mesh_devices: Vec<(u32, i32)> = process
        .topology
        .devices
        .iter()
        .map(|d| (d.process_index, d.local_hardware_id))
        .collect();
    let mut plan = tokio::task::block_in_place(|| {
        let _compile = tracing::info_span!(target: TARGET, "compile").entered();
        ProcessPlan::prepare(job, index, client, &mesh_devices)
    })?;
    tracing::info!(
        job = process.job,
        process = index,
        compile_s = plan.timings.compile_s,
        init_s = plan.timings.init_s,
        "plan ready"
    );
    let spec = plan.spec().clone();
    let written = written_arrays(&spec);
    let checkpoints = match &spec.checkpoint {
        Some(c) => Some(
            crate::checkpoint::Checkpoints::open(
                c,
                &text,
                process.checkpoint_roots,
                process.job,
                index,
                comm,
            )
            .await?,
        ),
        None => None,
    };
    let mut first_step = 0;
    if let Some(c) = &checkpoints {
        let restoring = c
            .restore(&*process.kv, comm, &written)
            .instrument(tracing::info_span!(target: TARGET, "restore"));
        if let Some((step, restored)) = restoring.await? {
            plan.restore(restored).map_err(PlanError::Checkpoint)?;
            first_step = step + 1;
        }
    }
    let reporter = (index == 0 && spec.report.is_some())
        .then(|| crate::report::Reporter::start(process.kv.clone(), job_id.clone()));
    let mut last_report = None;
    let suspension = super::suspend::Suspension::follow(process.kv.clone(), process.job);
    let loop_started = Instant::now();
    // Steps are traced in batches (a span per step would cost more than a
    // small step): a batch ends every STEPS_PER_SPAN steps and at a
    // checkpoint.
    let mut batch: Option<StepBatch> = None;
    for step in first_step..spec.steps {
        batch.get_or_insert_with(|| StepBatch::open(step)).last = step;
        // A plan without collectives never waits: yield once a step so the
        // worker can stop it (failure elsewhere, cancellation).
        tokio::task::yield_now().await;
        let before = plan.traffic().total();
        plan.run_step(client, step, comm).await?;
        let mut saved = false;
        if let Some(c) = &checkpoints {
            if (step + 1) % c.every == 0 && step + 1 < spec.steps {
                batch = None;
                save_checkpoint(&mut plan, c, &*process.kv, comm, step, &written).await?;
                saved = true;
            }
        }
        if let (Some(r), Some(reporter)) = (&spec.report, &reporter) {
            if (step + 1) % r.every == 0 || step + 1 == spec.steps {
                let t = Instant::now();
                let report = StepReport {
                    step,
                    values: plan.scalars(&r.arrays)?,
                    unix_ms: tessel_coordinator::unix_ms(),
                };
                reporter.send(&report);
                last_report = Some(report);
                plan.timings.coordination_s += t.elapsed().as_secs_f64();
            }
        }
        if let Some(reason) = suspension.requested() {
            let at = match suspension.step() {
                Some(at) => Some(at),
                None if index == 0 && checkpoints.is_some() => {
                    let per = loop_started.elapsed().as_secs_f64() / (step - first_step + 1) as f64;
                    match super::suspend::suspend_step(
                        step,
                        std::time::Duration::from_secs_f64(per),
                        spec.steps,
                    ) {
                        Some(at) => Some(
                            suspension
                                .choose(&*process.kv, process.job, at)
                                .await
                                .map_err(|source| PlanError::Kv {
                                    what: "choosing the suspend step".into(),
                                    source,
                                })?,
                        ),
                        None => None,
                    }
                }
                None => None,
            };
            match (&checkpoints, at) {
                // Nothing to resume from: stop now, the job restarts.
                (None, _) => return Err(PlanError::Suspended { step, reason }),
                (Some(c), Some(at)) if at == step => {
                    if !saved {
                        save_checkpoint(&mut plan, c, &*process.kv, comm, step, &written).await?;
                    }
                    tracing::info!(
                        job = process.job,
                        process = index,
                        step,
                        "suspended after a checkpoint"
                    );
                    return Err(PlanError::Suspended { step, reason });
                }
                (Some(_), Some(at)) if at < step => {
                    return Err(PlanError::SuspendMissed { step, at });
                }
                _ => {}
            }
        }
        if (step + 1 - first_step) % STEPS_PER_SPAN == 0 {
            batch = None;
        }
        let bytes = plan.traffic().total() - before;
        if step == first_step {
            plan.timings.first_step_bytes = bytes;
        } else {
            plan.timings.later_step_bytes_max = plan.timings.later_step_bytes_max.max(bytes);
        }
    }
    drop(batch);
    plan.timings.loop_s = loop_started.elapsed().as_secs_f64();
    plan.timings.first_step = first_step;
    let reports_dropped = match reporter {
        Some(r) => r.finish().await?,
        None => 0,
    };
    // The arrays the plan wrote, gathered, for `fetch` (process 0 stores
    // those that fit one KV value).
    for name in &written {
        let global = plan.gather(name, comm).await?;
        if index == 0 {
            let npy = crate::array::write_npy(&global);
            if npy.len() <= MAX_FETCHABLE {
                tessel_coordinator::Records::new(&*process.kv, &job_id)
                    .put(tessel_coordinator::Item::Array(name), &npy)
                    .await
                    .map_err(|source| PlanError::Kv {
                        what: format!("storing `{name}`"),
                        source,
                    })?;
            } else {
                tracing::warn!(array = %name, bytes = npy.len(), "too large to keep for fetch");
            }
        }
    }
    plan.timings.run_s = started.elapsed().as_secs_f64();
    plan.timings.to_device_bytes = plan.traffic().to_device;
    plan.timings.to_host_bytes = plan.traffic().to_host;
    Ok(ProcessResult {
        process: process.process_index,
        timings: plan.timings,
        last_report,
        reports_dropped,
    })
}

/// Writes this process's blocks of every array the plan writes as the
/// checkpoint of `step`.
async fn save_checkpoint(
    plan: &mut ProcessPlan,
    c: &crate::checkpoint::Checkpoints,
    kv: &dyn tessel_kv::KvStore,
    comm: &mut tessel_transfer::Communicator,
    step: u64,
    written: &[String],
) -> Result<(), PlanError> {
    let t = Instant::now();
    plan.download(written)?;
    let blocks: Vec<_> = written
        .iter()
        .map(|n| {
            let (value, sharding) = plan.host_value(n).expect("downloaded");
            (n.as_str(), value, sharding)
        })
        .collect();
    c.save(kv, comm, step, &blocks)
        .instrument(tracing::info_span!(target: TARGET, "checkpoint", step))
        .await?;
    plan.timings.checkpoint_s += t.elapsed().as_secs_f64();
    Ok(())
}

/// The [`tessel_worker::JobRunner`] the `tessel worker` command uses.
pub struct PlanRunner;

impl tessel_worker::JobRunner for PlanRunner {
    fn prepare(
        &self,
        spec: &[u8],
    ) -> Result<Box<dyn tessel_worker::PreparedJob>, tessel_worker::JobError> {
        let (_, job) =
            JobBundle::decode(spec).map_err(|e| tessel_worker::JobError::job(e.to_string()))?;
        Ok(Box::new(PreparedPlan(job)))
    }
}

/// A job's bundle, decoded and validated once per job process.
struct PreparedPlan(ValidatedJob);

#[async_trait::async_trait]
impl tessel_worker::PreparedJob for PreparedPlan {
    fn command(&self) -> Option<tessel_worker::CommandLaunch> {
        let s = &self.0.spec;
        if !s.is_command() {
            return None;
        }
        Some(tessel_worker::CommandLaunch {
            argv: s.command.clone(),
            env: s.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            workdir: s.workdir.clone(),
            files: self.0.files.clone().into_iter().collect(),
            processes: s.processes,
            processes_per_worker: s.processes_per_worker,
            devices_per_process: s.devices_per_process,
            checkpoint_dir: s.checkpoint.as_ref().map(|c| c.dir.clone()),
            stop_grace: std::time::Duration::from_millis(s.stop_grace_ms),
            max_restarts: s.max_restarts,
        })
    }

    fn client_options(&self) -> Vec<tessel_pjrt::NamedValue> {
        self.0
            .spec
            .plugin_options
            .iter()
            .map(|(name, v)| tessel_pjrt::NamedValue::new(name.clone(), v.to_value()))
            .collect()
    }

    fn transfer_encryption(&self) -> Option<tessel_transfer::Encryption> {
        self.0.spec.transfer_encryption
    }

    async fn run(
        self: Box<Self>,
        process: tessel_worker::JobProcess<'_>,
    ) -> Result<Vec<u8>, tessel_worker::JobError> {
        let r = run_job_process(process, self.0)
            .await
            .map_err(|e| tessel_worker::JobError {
                kind: e.kind(),
                message: e.to_string(),
            })?;
        Ok(serde_json::to_vec(&r).expect("encodes"))
    }
}
