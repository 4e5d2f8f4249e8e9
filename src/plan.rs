//! Running a job's plan in one of its processes.
//!
//! A [`JobBundle`] is what travels to the workers (`jobs/{job}/spec`): the
//! spec's text and the files it names. Each process validates it again,
//! compiles the programs for its local devices, initialises its block of
//! every array ([`crate::init`]) and runs the plan `steps` times. Arrays
//! live on the host between steps as process-local blocks; `execute` splits
//! them over the process's devices by the program's own sharding
//! annotations, the collectives run over the job's [`Communicator`].
//!
//! Invariants:
//! 1. Every process holds, for each array, the block its devices cover
//!    ([`crate::layout`]); after `all_reduce` every process holds the same
//!    bytes (the communicator's fixed reduction order).
//! 2. Process 0 writes the reports; every value it reports is its own
//!    block, so a reported scalar should be one the plan all-reduced.
//! 3. A process never hands out a partial step: an error in any step ends
//!    the run with that error, naming the step (`plan[i]`) and the array.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tessel_coordinator::jobs::FailureKind;
use tessel_pjrt::{Client, ElementType, HostBuffer};
use tessel_transfer::{Communicator, ReduceOp};

use crate::job::{JobSpec, JobSpecError, PlanStep, ShardingSpec, ValidatedJob, BUILTINS};
use crate::layout::{concat_dim, process_block, shard_index, slice_dim};
use crate::run::{CompiledProgram, ProgramSource, RunError};

/// Largest final array kept in the KV for `fetch` (as `.npy`).
pub const MAX_FETCHABLE: usize = (4 << 20) - 4096;

/// Largest encoded bundle a worker decodes (it also has to fit one KV value).
pub const MAX_BUNDLE: usize = 4 << 20;

/// A job as it travels to the workers (`jobs/{job}/spec`). Reports go to
/// `jobs/{job}/reports/` and checkpoint records to
/// `jobs/{job}/checkpoints/`, where `job` is the job the running instance
/// belongs to (the same for every attempt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobBundle {
    /// The spec (TOML).
    pub spec: String,
    /// Every file the spec names, by the path it names.
    pub files: Vec<(String, Vec<u8>)>,
}

impl JobBundle {
    pub fn new(job: &ValidatedJob) -> JobBundle {
        JobBundle {
            spec: job.text.clone(),
            files: job
                .files
                .iter()
                .map(|(p, b)| (p.display().to_string(), b.clone()))
                .collect(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a bundle always encodes")
    }

    /// Decodes and validates a bundle (size limit first).
    pub fn decode(bytes: &[u8]) -> Result<(JobBundle, ValidatedJob), PlanError> {
        if bytes.len() > MAX_BUNDLE {
            return Err(PlanError::Bundle(format!(
                "{} bytes, at most {MAX_BUNDLE}",
                bytes.len()
            )));
        }
        let bundle: JobBundle =
            postcard::from_bytes(bytes).map_err(|e| PlanError::Bundle(e.to_string()))?;
        let spec = JobSpec::from_toml(&bundle.spec, "job spec".as_ref())?;
        let files: BTreeMap<PathBuf, Vec<u8>> = bundle
            .files
            .iter()
            .map(|(p, b)| (PathBuf::from(p), b.clone()))
            .collect();
        let job = spec.validate(&files)?;
        Ok((bundle, job))
    }
}

/// Why a process's run of the plan failed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("bad job bundle: {0}")]
    Bundle(String),
    #[error(transparent)]
    Spec(#[from] JobSpecError),
    #[error("program `{program}`: {source}")]
    Compile {
        program: String,
        #[source]
        source: RunError,
    },
    #[error("arrays.{array}: {reason}")]
    Array { array: String, reason: String },
    #[error("step {step}, plan[{index}]: {reason}")]
    Step {
        step: u64,
        index: usize,
        reason: String,
    },
    /// A collective between the processes failed: in a step, a
    /// checkpoint or the final gather.
    #[error("{what}: {source}")]
    Collective {
        what: String,
        #[source]
        source: tessel_transfer::TransferError,
    },
    /// The coordinators' key-value service failed.
    #[error("{what}: {source}")]
    Kv {
        what: String,
        #[source]
        source: tessel_kv::KvError,
    },
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("{0}")]
    Other(String),
}

impl PlanError {
    /// Whether a restart may cure it (scheduler invariant 6): a lost peer
    /// or coordinator may; everything else is the job's own error.
    pub fn kind(&self) -> FailureKind {
        match self {
            PlanError::Collective { source, .. } if source.is_peer_loss() => FailureKind::PeerLost,
            PlanError::Kv { .. } => FailureKind::PeerLost,
            _ => FailureKind::Job,
        }
    }

    /// The same error, said to have happened at `plan[index]` of `step`.
    fn at(self, step: u64, index: usize) -> PlanError {
        match self {
            PlanError::Collective { what, source } => PlanError::Collective {
                what: format!("step {step}, plan[{index}]: {what}"),
                source,
            },
            e => PlanError::Step {
                step,
                index,
                reason: e.to_string(),
            },
        }
    }
}

/// A process's block of an array and how it is laid out now.
#[derive(Debug, Clone)]
pub struct LocalArray {
    pub value: HostBuffer,
    pub sharding: ShardingSpec,
}

/// Where a process's time went (seconds, summed over steps).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PlanTimings {
    pub compile_s: f64,
    pub init_s: f64,
    /// `execute` steps: host↔device copies and the programs.
    pub compute_s: f64,
    /// `all_reduce`, `all_gather`, `reshard` over the transfer layer.
    pub collective_s: f64,
    /// Reports to the KV.
    pub coordination_s: f64,
    /// Writing checkpoints (files, fsync, the barrier, the manifest).
    pub checkpoint_s: f64,
    /// The step the run started at (after a restore: the checkpoint's + 1).
    pub first_step: u64,
    pub steps: u64,
    /// Wall time of the step loop (reports included).
    pub loop_s: f64,
    pub run_s: f64,
}

/// One process's state while it runs a job's plan.
pub struct ProcessPlan {
    job: ValidatedJob,
    /// The plan's steps, shared so a step can run while `self` changes.
    steps: std::sync::Arc<[PlanStep]>,
    process: usize,
    programs: BTreeMap<String, CompiledProgram>,
    arrays: BTreeMap<String, LocalArray>,
    pub timings: PlanTimings,
}

impl ProcessPlan {
    /// Compiles every program on `client` and initialises this process's
    /// blocks. Blocking (compiles).
    pub fn prepare(
        job: ValidatedJob,
        process: usize,
        client: &Client,
    ) -> Result<ProcessPlan, PlanError> {
        let s = &job.spec;
        if process >= s.processes as usize {
            return Err(PlanError::Other(format!(
                "process {process} of a job of {} processes",
                s.processes
            )));
        }
        let have = client
            .addressable_devices()
            .map_err(|e| PlanError::Other(e.to_string()))?
            .len();
        if have < s.devices_per_process as usize {
            return Err(PlanError::Other(format!(
                "the job needs {} devices per process, this worker's client has {have}",
                s.devices_per_process
            )));
        }
        let started = Instant::now();
        let mut programs = BTreeMap::new();
        for (name, p) in &s.programs {
            let compile_err = |source| PlanError::Compile {
                program: name.clone(),
                source,
            };
            let source = ProgramSource::parse(&job.files[&p.file]).map_err(compile_err)?;
            let partitions = p.partitions.unwrap_or(s.devices_per_process) as usize;
            let partitions = source.partitions(Some(partitions)).map_err(compile_err)?;
            let compiled =
                CompiledProgram::compile(client, source, partitions).map_err(compile_err)?;
            programs.insert(name.clone(), compiled);
        }
        let compile_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let mut plan = ProcessPlan {
            steps: job.spec.plan.clone().into(),
            job,
            process,
            programs,
            arrays: BTreeMap::new(),
            timings: PlanTimings {
                compile_s,
                ..PlanTimings::default()
            },
        };
        let names: Vec<String> = plan.job.spec.arrays.keys().cloned().collect();
        for name in names {
            let a = plan.initial_block(&name)?;
            plan.arrays.insert(name, a);
        }
        plan.timings.init_s = started.elapsed().as_secs_f64();
        Ok(plan)
    }

    pub fn spec(&self) -> &JobSpec {
        &self.job.spec
    }

    pub fn array(&self, name: &str) -> Option<&LocalArray> {
        self.arrays.get(name)
    }

    /// The block `(dim, lo, hi)` of the global array this process holds
    /// under `sharding`; `None` when it holds all of it.
    fn block(
        &self,
        name: &str,
        sharding: &ShardingSpec,
    ) -> Result<Option<(usize, usize, usize)>, String> {
        ProcessPlan::block_of(&self.job, name, sharding, self.process)
    }

    fn initial_block(&self, name: &str) -> Result<LocalArray, PlanError> {
        let spec = &self.job.spec.arrays[name];
        let err = |reason: String| PlanError::Array {
            array: name.to_owned(),
            reason,
        };
        let ty = ElementType::parse(&spec.dtype).ok_or_else(|| err("unknown dtype".into()))?;
        let block = self.block(name, &spec.sharding).map_err(err)?;
        let value = match &spec.init {
            crate::job::Init::Npy { file } => {
                let global = crate::array::read_npy(&self.job.files[file])
                    .map_err(|e| err(e.to_string()))?;
                match block {
                    Some((d, lo, hi)) => slice_dim(&global, d, lo, hi),
                    None => global,
                }
            }
            init => crate::init::generate(init, ty, &spec.shape, block).map_err(err)?,
        };
        Ok(LocalArray {
            value,
            sharding: spec.sharding.clone(),
        })
    }

    /// Runs every step of the plan once, as step number `step`.
    pub async fn run_step(
        &mut self,
        client: &Client,
        step: u64,
        comm: &mut Communicator,
    ) -> Result<(), PlanError> {
        let steps = self.steps.clone();
        for (index, op) in steps.iter().enumerate() {
            let fail = |reason: String| PlanError::Step {
                step,
                index,
                reason,
            };
            match op {
                PlanStep::Execute {
                    program,
                    inputs,
                    outputs,
                } => {
                    let started = Instant::now();
                    let args = inputs
                        .iter()
                        .map(|n| self.input(n, step))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(fail)?;
                    let args: Vec<&HostBuffer> = args.iter().map(|a| a.as_ref()).collect();
                    let prog = &self.programs[program];
                    // PJRT blocks: keep it off the runtime's other tasks.
                    let results = tokio::task::block_in_place(|| prog.execute(client, &args))
                        .map_err(|e| fail(format!("`{program}`: {e}")))?;
                    for (name, value) in outputs.iter().zip(results) {
                        let sharding = self.job.spec.arrays[name].sharding.clone();
                        self.arrays
                            .insert(name.clone(), LocalArray { value, sharding });
                    }
                    self.timings.compute_s += started.elapsed().as_secs_f64();
                }
                PlanStep::AllReduce { array, reduce } => {
                    let started = Instant::now();
                    let op = ReduceOp::parse(reduce)
                        .ok_or_else(|| fail(format!("unknown reduction `{reduce}`")))?;
                    let local = self.arrays.get_mut(array).expect("validated name");
                    if comm.size() > 1 {
                        let ty = local.value.element_type();
                        let dims = local.value.dims().to_vec();
                        let bytes = std::mem::replace(&mut local.value, HostBuffer::scalar(0u8))
                            .into_bytes();
                        let reduced = comm.all_reduce(op, ty, bytes).await.map_err(|source| {
                            PlanError::Collective {
                                what: format!(
                                    "step {step}, plan[{index}]: all-reduce of `{array}`"
                                ),
                                source,
                            }
                        })?;
                        local.value = HostBuffer::from_bytes(ty, &dims, reduced)
                            .map_err(|e| fail(e.to_string()))?;
                    }
                    self.timings.collective_s += started.elapsed().as_secs_f64();
                }
                PlanStep::AllGather { array } => {
                    let started = Instant::now();
                    self.reshard(array, ShardingSpec::Replicated, comm)
                        .await
                        .map_err(|e| e.at(step, index))?;
                    self.timings.collective_s += started.elapsed().as_secs_f64();
                }
                PlanStep::Reshard { array, sharding } => {
                    let started = Instant::now();
                    self.reshard(array, sharding.clone(), comm)
                        .await
                        .map_err(|e| e.at(step, index))?;
                    self.timings.collective_s += started.elapsed().as_secs_f64();
                }
            }
        }
        self.timings.steps += 1;
        Ok(())
    }

    /// An `execute` input: a built-in scalar, or the array itself (not a
    /// copy).
    fn input(&self, name: &str, step: u64) -> Result<Cow<'_, HostBuffer>, String> {
        let per = self.job.spec.devices_per_process as usize;
        let scalar = |v: usize| Ok(Cow::Owned(HostBuffer::scalar(v as i32)));
        match name {
            "$step" => scalar(step as usize),
            "$process" => scalar(self.process),
            "$shard" => scalar(shard_index(&self.job.mesh, per, self.process)),
            _ if BUILTINS.contains(&name) => Err(format!("unknown built-in `{name}`")),
            _ => self
                .arrays
                .get(name)
                .map(|a| Cow::Borrowed(&a.value))
                .ok_or_else(|| format!("no array `{name}`")),
        }
    }

    /// Lays `array` out as `to`: slicing needs nothing from the others,
    /// un-splitting gathers every process's block.
    async fn reshard(
        &mut self,
        array: &str,
        to: ShardingSpec,
        comm: &mut Communicator,
    ) -> Result<(), PlanError> {
        let current = self.arrays[array].sharding.clone();
        if current == to {
            return Ok(());
        }
        let global = self.gather(array, comm).await?;
        let value = match self.block(array, &to).map_err(PlanError::Other)? {
            Some((d, lo, hi)) => slice_dim(&global, d, lo, hi),
            None => global,
        };
        self.arrays.insert(
            array.to_owned(),
            LocalArray {
                value,
                sharding: to,
            },
        );
        Ok(())
    }

    /// The global value of `array` (every process calls it together).
    pub async fn gather(
        &self,
        array: &str,
        comm: &mut Communicator,
    ) -> Result<HostBuffer, PlanError> {
        let local = self
            .arrays
            .get(array)
            .ok_or_else(|| PlanError::Other(format!("no array `{array}`")))?;
        let ShardingSpec::Split { dim, .. } = local.sharding else {
            return Ok(local.value.clone());
        };
        let ty = local.value.element_type();
        let all = if comm.size() > 1 {
            comm.all_gather(ty, local.value.bytes())
                .await
                .map_err(|source| PlanError::Collective {
                    what: format!("all-gather of `{array}`"),
                    source,
                })?
        } else {
            local.value.bytes().to_vec()
        };
        // One block per distinct position, in order (processes that share
        // a position along the split axis hold the same block).
        let piece = local.value.bytes().len();
        let mut blocks: BTreeMap<usize, HostBuffer> = BTreeMap::new();
        for p in 0..comm.size() {
            let (_, lo, _) = ProcessPlan::block_of(&self.job, array, &local.sharding, p)
                .map_err(PlanError::Other)?
                .expect("split");
            if let std::collections::btree_map::Entry::Vacant(e) = blocks.entry(lo) {
                let bytes = all[p * piece..(p + 1) * piece].to_vec();
                e.insert(
                    HostBuffer::from_bytes(ty, local.value.dims(), bytes)
                        .map_err(|e| PlanError::Other(e.to_string()))?,
                );
            }
        }
        let pieces: Vec<HostBuffer> = blocks.into_values().collect();
        Ok(concat_dim(&pieces, dim))
    }

    fn block_of(
        job: &ValidatedJob,
        array: &str,
        sharding: &ShardingSpec,
        process: usize,
    ) -> Result<Option<(usize, usize, usize)>, String> {
        let ShardingSpec::Split { split, dim } = sharding else {
            return Ok(None);
        };
        let k = job
            .mesh
            .iter()
            .position(|(a, _)| a == split)
            .ok_or_else(|| format!("unknown mesh axis `{split}`"))?;
        let per = job.spec.devices_per_process as usize;
        let (first, count) = process_block(&job.mesh, per, process, k)?;
        let chunk = job.spec.arrays[array].shape[*dim] as usize / job.mesh[k].1;
        Ok(Some((*dim, first * chunk, (first + count) * chunk)))
    }

    /// Replaces arrays with restored blocks, checking each against the
    /// block this process holds under the recorded sharding.
    pub fn restore(&mut self, blocks: Vec<(String, LocalArray)>) -> Result<(), String> {
        for (name, a) in blocks {
            let spec = self
                .job
                .spec
                .arrays
                .get(&name)
                .ok_or_else(|| format!("the checkpoint holds unknown array `{name}`"))?;
            let mut dims = spec.shape.clone();
            if let Some((d, lo, hi)) = self.block(&name, &a.sharding)? {
                dims[d] = (hi - lo) as i64;
            }
            if a.value.dims() != dims.as_slice() || a.value.element_type().name() != spec.dtype {
                return Err(format!(
                    "checkpointed `{name}` is {}{:?}, this process holds {}{dims:?}",
                    a.value.element_type(),
                    a.value.dims(),
                    spec.dtype
                ));
            }
            self.arrays.insert(name, a);
        }
        Ok(())
    }

    /// The scalars to report, as f64.
    pub fn scalars(&self, names: &[String]) -> BTreeMap<String, f64> {
        names
            .iter()
            .filter_map(|n| Some((n.clone(), scalar_f64(&self.arrays.get(n)?.value)?)))
            .collect()
    }
}

/// The arrays a plan writes (outputs of `execute`, targets of
/// collectives), sorted: what checkpoints hold and what `fetch` can get.
/// The others keep their initial values, which a restart recreates.
pub fn written_arrays(spec: &JobSpec) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for op in &spec.plan {
        match op {
            PlanStep::Execute { outputs, .. } => names.extend(outputs.iter().cloned()),
            PlanStep::AllReduce { array, .. }
            | PlanStep::AllGather { array }
            | PlanStep::Reshard { array, .. } => names.push(array.clone()),
        }
    }
    names.sort();
    names.dedup();
    names
}

/// The value of a one-element array as f64.
pub fn scalar_f64(b: &HostBuffer) -> Option<f64> {
    match crate::array::to_f64(b).as_slice() {
        [v] => Some(*v),
        _ => None,
    }
}

/// One report: the step it followed and the scalars.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StepReport {
    pub step: u64,
    pub values: BTreeMap<String, f64>,
    pub unix_ms: u64,
}

/// What a process publishes when its plan is done.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProcessResult {
    pub process: u32,
    pub timings: PlanTimings,
    pub last_report: Option<StepReport>,
    /// Reports dropped because the coordinators fell behind.
    #[serde(default)]
    pub reports_dropped: u64,
}

/// Runs a whole job in one process: decode, prepare, restore, every step,
/// reports and checkpoints, the final arrays (process 0).
pub async fn run_job_process(
    process: tessel_worker::JobProcess<'_>,
) -> Result<ProcessResult, PlanError> {
    let (_, job) = JobBundle::decode(&process.spec)?;
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
    let mut plan = tokio::task::block_in_place(|| ProcessPlan::prepare(job, index, client))?;
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
                process.topology,
                comm,
            )
            .await?,
        ),
        None => None,
    };
    let mut first_step = 0;
    if let Some(c) = &checkpoints {
        if let Some((step, restored)) = c.restore(&*process.kv, comm, &written).await? {
            plan.restore(restored).map_err(PlanError::Checkpoint)?;
            first_step = step + 1;
        }
    }
    let reporter = (index == 0 && spec.report.is_some())
        .then(|| crate::report::Reporter::start(process.kv.clone(), job_id.clone()));
    let mut last_report = None;
    let loop_started = Instant::now();
    for step in first_step..spec.steps {
        // A plan without collectives never waits: yield once a step so the
        // worker can stop it (failure elsewhere, cancellation).
        tokio::task::yield_now().await;
        plan.run_step(client, step, comm).await?;
        if let Some(c) = &checkpoints {
            if (step + 1) % c.every == 0 && step + 1 < spec.steps {
                let t = Instant::now();
                let blocks: Vec<(&str, &LocalArray)> = written
                    .iter()
                    .map(|n| (n.as_str(), plan.array(n).expect("declared")))
                    .collect();
                c.save(&*process.kv, comm, step, &blocks).await?;
                plan.timings.checkpoint_s += t.elapsed().as_secs_f64();
            }
        }
        let (Some(r), Some(reporter)) = (&spec.report, &reporter) else {
            continue;
        };
        if (step + 1) % r.every == 0 || step + 1 == spec.steps {
            let t = Instant::now();
            let report = StepReport {
                step,
                values: plan.scalars(&r.arrays),
                unix_ms: tessel_coordinator::keys::unix_ms(),
            };
            reporter.send(&report);
            last_report = Some(report);
            plan.timings.coordination_s += t.elapsed().as_secs_f64();
        }
    }
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
                process
                    .kv
                    .put(
                        tessel_coordinator::keys::job_array(&job_id, name).as_bytes(),
                        &npy,
                    )
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
    Ok(ProcessResult {
        process: process.process_index,
        timings: plan.timings,
        last_report,
        reports_dropped,
    })
}

/// The [`tessel_worker::JobRunner`] the `tessel worker` command uses.
pub struct PlanRunner;

#[async_trait::async_trait]
impl tessel_worker::JobRunner for PlanRunner {
    async fn run(
        &self,
        process: tessel_worker::JobProcess<'_>,
    ) -> Result<Vec<u8>, tessel_worker::JobError> {
        let r = run_job_process(process)
            .await
            .map_err(|e| tessel_worker::JobError {
                kind: e.kind(),
                message: e.to_string(),
            })?;
        Ok(serde_json::to_vec(&r).expect("encodes"))
    }
}
