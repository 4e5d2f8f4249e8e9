//! One process's state while it runs a job's plan: its blocks of every
//! array, its compiled programs, and the steps.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tessel_pjrt::{Client, ElementType, HostBuffer};
use tessel_transfer::{Communicator, ReduceOp};

use super::execute::{self, Held, Input, View};
use super::resident::{Slot, Traffic};
use super::PlanError;
use crate::job::{JobSpec, PlanStep, ShardingSpec, ValidatedJob, BUILTINS};
use crate::layout::{concat_dim, process_block, shard_index, slice_dim};
use crate::program::{plugin_devices, CompiledProgram, ProgramSource};

/// With this environment variable set to `1`, a worker's plans copy every
/// program's outputs back to the host and drop them from the devices, as
/// every step did before arrays stayed there: the baseline of `tessel-bench
/// job --host-staged`.
pub const HOST_STAGED_ENV: &str = "TESSEL_HOST_STAGED";

/// A process's block of an array on the host, and how it is laid out
/// (what a checkpoint restores).
#[derive(Debug, Clone)]
pub struct ProcessBlock {
    /// The process's block.
    pub value: HostBuffer,
    /// Its current layout.
    pub sharding: ShardingSpec,
}

/// Where a process's time went (seconds, summed over steps).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PlanTimings {
    /// Compiling the programs.
    pub compile_s: f64,
    /// Initializing the arrays (or restoring them).
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
    /// Steps run.
    pub steps: u64,
    /// Wall time of the step loop (reports included).
    pub loop_s: f64,
    /// Wall time of the whole run.
    pub run_s: f64,
    /// Bytes copied host → device in the run (programs' inputs).
    #[serde(default)]
    pub to_device_bytes: u64,
    /// Bytes copied device → host (collectives, reports, checkpoints, the
    /// final arrays).
    #[serde(default)]
    pub to_host_bytes: u64,
    /// Bytes either way in the first step run (arrays first placed on
    /// their devices).
    #[serde(default)]
    pub first_step_bytes: u64,
    /// The most bytes either way in any later step, its report and
    /// checkpoint included.
    #[serde(default)]
    pub later_step_bytes_max: u64,
}

/// One process's state while it runs a job's plan.
pub struct ProcessPlan {
    job: ValidatedJob,
    /// The plan's steps, shared so a step can run while `self` changes.
    steps: std::sync::Arc<[PlanStep]>,
    process: usize,
    programs: BTreeMap<String, CompiledProgram>,
    arrays: BTreeMap<String, Held>,
    /// Bytes copied between host and device so far.
    traffic: Traffic,
    /// [`HOST_STAGED_ENV`] is set: every step copies its arrays in and out.
    host_staged: bool,
    /// Where its time went.
    pub timings: PlanTimings,
}

impl ProcessPlan {
    /// Compiles every program on `client` and initialises this process's
    /// blocks. `mesh_devices` are the job's devices in mesh order as
    /// `(process, local hardware id)`, where global programs run.
    /// Blocking (compiles).
    pub fn prepare(
        job: ValidatedJob,
        process: usize,
        client: &Client,
        mesh_devices: &[(u32, i32)],
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
            let compiled = if p.global {
                global_program(client, source, s, mesh_devices).map_err(compile_err)?
            } else {
                let partitions = p.partitions.unwrap_or(s.devices_per_process) as usize;
                let partitions = source.partitions(Some(partitions)).map_err(compile_err)?;
                CompiledProgram::compile(client, source, partitions).map_err(compile_err)?
            };
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
            traffic: Traffic::default(),
            host_staged: std::env::var_os(HOST_STAGED_ENV).is_some_and(|v| v == "1"),
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

    /// The job's spec.
    pub fn spec(&self) -> &JobSpec {
        &self.job.spec
    }

    /// Bytes copied between host and device so far.
    pub fn traffic(&self) -> Traffic {
        self.traffic
    }

    /// Brings `names` to the host (copying from the devices what is only
    /// there), for [`Self::host_value`].
    pub fn download(&mut self, names: &[String]) -> Result<(), PlanError> {
        for n in names {
            let held = self
                .arrays
                .get_mut(n)
                .ok_or_else(|| PlanError::Other(format!("no array `{n}`")))?;
            held.slot
                .host(&mut self.traffic)
                .map_err(|reason| PlanError::Array {
                    array: n.clone(),
                    reason,
                })?;
        }
        Ok(())
    }

    /// This process's block of `name` on the host, once
    /// [`Self::download`]ed, and its layout.
    pub fn host_value(&self, name: &str) -> Option<(&HostBuffer, &ShardingSpec)> {
        let held = self.arrays.get(name)?;
        Some((held.slot.host_if_there()?, &held.sharding))
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

    fn initial_block(&self, name: &str) -> Result<Held, PlanError> {
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
        Ok(Held {
            slot: Slot::on_host(value),
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
                    let inputs = inputs
                        .iter()
                        .map(|n| self.input(n, step))
                        .collect::<Result<Vec<_>, _>>()?;
                    let outputs = outputs
                        .iter()
                        .map(|n| {
                            let a = &self.job.spec.arrays[n];
                            let ty = ElementType::parse(&a.dtype).expect("validated dtype");
                            let dims = self.block_dims(n, &a.sharding)?;
                            Ok((n.clone(), a.sharding.clone(), ty, dims))
                        })
                        .collect::<Result<Vec<_>, PlanError>>()?;
                    let global = self.job.spec.programs[program].global;
                    let (job, process) = (&self.job, self.process);
                    let view = |name: &str, sharding: &ShardingSpec, block: &[i64]| {
                        view_of(job, process, global, name, sharding, block)
                    };
                    let prog = &self.programs[program];
                    // PJRT blocks: keep it off the runtime's other tasks.
                    tokio::task::block_in_place(|| {
                        execute::run(
                            prog,
                            client,
                            &mut self.arrays,
                            &mut self.traffic,
                            &inputs,
                            &outputs,
                            &view,
                            self.host_staged,
                        )
                    })
                    .map_err(|e| fail(format!("`{program}`: {e}")))?;
                    self.timings.compute_s += started.elapsed().as_secs_f64();
                }
                PlanStep::AllReduce { array, reduce } => {
                    let started = Instant::now();
                    let op = ReduceOp::parse(reduce)
                        .ok_or_else(|| fail(format!("unknown reduction `{reduce}`")))?;
                    let held = self.arrays.get_mut(array).expect("validated name");
                    if comm.size() > 1 {
                        let value = held.slot.host(&mut self.traffic).map_err(fail)?;
                        let ty = value.element_type();
                        let dims = value.dims().to_vec();
                        let bytes = value.bytes().to_vec();
                        let reduced = comm.all_reduce(op, ty, bytes).await.map_err(|source| {
                            PlanError::Collective {
                                what: format!(
                                    "step {step}, plan[{index}]: all-reduce of `{array}`"
                                ),
                                source,
                            }
                        })?;
                        held.slot.set_host(
                            HostBuffer::from_bytes(ty, &dims, reduced)
                                .map_err(|e| fail(e.to_string()))?,
                        );
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

    /// An `execute` input: a built-in scalar, or an array.
    fn input(&self, name: &str, step: u64) -> Result<Input, PlanError> {
        let per = self.job.spec.devices_per_process as usize;
        let scalar = |v: usize| Ok(Input::Scalar(v as i32));
        match name {
            "$step" => scalar(step as usize),
            "$process" => scalar(self.process),
            "$shard" => scalar(shard_index(&self.job.mesh, per, self.process)),
            _ if BUILTINS.contains(&name) => {
                Err(PlanError::Other(format!("unknown built-in `{name}`")))
            }
            _ if self.arrays.contains_key(name) => Ok(Input::Array(name.to_owned())),
            _ => Err(PlanError::Other(format!("no array `{name}`"))),
        }
    }

    /// The shape of this process's block of `name` under `sharding`.
    fn block_dims(&self, name: &str, sharding: &ShardingSpec) -> Result<Vec<i64>, PlanError> {
        let mut dims = self.job.spec.arrays[name].shape.clone();
        if let Some((d, lo, hi)) = self.block(name, sharding).map_err(PlanError::Other)? {
            dims[d] = (hi - lo) as i64;
        }
        Ok(dims)
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
            Held {
                slot: Slot::on_host(value),
                sharding: to,
            },
        );
        Ok(())
    }

    /// The global value of `array` (every process calls it together).
    pub async fn gather(
        &mut self,
        array: &str,
        comm: &mut Communicator,
    ) -> Result<HostBuffer, PlanError> {
        self.download(&[array.to_owned()])?;
        let held = &self.arrays[array];
        let value = held.slot.host_if_there().expect("downloaded");
        let ShardingSpec::Split { dim, .. } = held.sharding else {
            return Ok(value.clone());
        };
        let ty = value.element_type();
        let all = if comm.size() > 1 {
            comm.all_gather(ty, value.bytes())
                .await
                .map_err(|source| PlanError::Collective {
                    what: format!("all-gather of `{array}`"),
                    source,
                })?
        } else {
            value.bytes().to_vec()
        };
        // One block per distinct position, in order (processes that share
        // a position along the split axis hold the same block).
        let piece = value.bytes().len();
        let mut blocks: BTreeMap<usize, HostBuffer> = BTreeMap::new();
        for p in 0..comm.size() {
            let (_, lo, _) = ProcessPlan::block_of(&self.job, array, &held.sharding, p)
                .map_err(PlanError::Other)?
                .expect("split");
            if let std::collections::btree_map::Entry::Vacant(e) = blocks.entry(lo) {
                let bytes = all[p * piece..(p + 1) * piece].to_vec();
                e.insert(
                    HostBuffer::from_bytes(ty, value.dims(), bytes)
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
    pub fn restore(&mut self, blocks: Vec<(String, ProcessBlock)>) -> Result<(), String> {
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
            self.arrays.insert(
                name,
                Held {
                    slot: Slot::on_host(a.value),
                    sharding: a.sharding,
                },
            );
        }
        Ok(())
    }

    /// The scalars to report, as f64 (copied from the devices).
    pub fn scalars(&mut self, names: &[String]) -> Result<BTreeMap<String, f64>, PlanError> {
        self.download(names)?;
        Ok(names
            .iter()
            .filter_map(|n| Some((n.clone(), scalar_f64(self.host_value(n)?.0)?)))
            .collect())
    }
}

/// What a program sees of `name` (process block `block` under `sharding`):
/// the block itself, or for a global program the global array, with the
/// block's offset in it.
fn view_of(
    job: &ValidatedJob,
    process: usize,
    global: bool,
    name: &str,
    sharding: &ShardingSpec,
    block: &[i64],
) -> View {
    let mut offset = vec![0; block.len()];
    if !global {
        return View {
            dims: block.to_vec(),
            offset,
        };
    }
    if let Ok(Some((d, lo, _))) = ProcessPlan::block_of(job, name, sharding, process) {
        offset[d] = lo as i64;
    }
    View {
        dims: job.spec.arrays[name].shape.clone(),
        offset,
    }
}

/// Compiles a global program over the job's devices in mesh order.
fn global_program(
    client: &Client,
    source: ProgramSource,
    spec: &JobSpec,
    mesh_devices: &[(u32, i32)],
) -> Result<CompiledProgram, crate::program::RunError> {
    let bad = |m: String| crate::program::RunError::Arguments(m);
    if spec.processes > 1 && client.platform_name()? == "cpu" {
        return Err(bad(format!(
            "plugin `{}` runs no program across processes (CPU plugins have no cross-process \
             collectives): run a global program with processes = 1, or per-process programs \
             and all_reduce steps",
            spec.plugin
        )));
    }
    let partitions = spec.processes as usize * spec.devices_per_process as usize;
    source.partitions(Some(partitions))?;
    if mesh_devices.len() != partitions {
        return Err(bad(format!(
            "the job's topology has {} devices, the mesh {partitions}",
            mesh_devices.len()
        )));
    }
    let assignment =
        crate::program::global::device_assignment(mesh_devices, &plugin_devices(client)?)
            .map_err(bad)?;
    CompiledProgram::compile_global(client, source, &assignment)
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
