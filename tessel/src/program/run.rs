//! Running one StableHLO program on one host: check the arguments against
//! the program's signature, split them over the partitions, execute on the
//! plugin's devices and gather the results. This is what `tessel run` does.

use tessel_pjrt::{
    Buffer, Client, ClientOptions, CompileOptions, HostBuffer, NamedValue, Plugin, Program,
};

use crate::program::mlir::{parse_signature, MlirError, Signature};
use crate::program::sharding::{ShardingError, Tiling};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// MLIR text or MLIR bytecode.
    pub program: Vec<u8>,
    /// CPU devices to create (the CPU plugin's `cpu_device_count`); by
    /// default as many as there are partitions.
    pub devices: Option<usize>,
    /// SPMD partitions; by default the module's `mhlo.num_partitions`, else 1.
    pub partitions: Option<usize>,
    /// Global (unsharded) arguments, in parameter order.
    pub args: Vec<HostBuffer>,
    /// Plugin create options (`--plugin-option`).
    pub options: Vec<NamedValue>,
}

/// Why a run failed. Each variant names the part of the request at fault.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The bytes are not MLIR.
    #[error("the program is neither MLIR bytecode nor UTF-8 MLIR text")]
    NotMlir,
    /// `@main`'s signature does not parse.
    #[error("cannot read the signature of @main: {0}")]
    Signature(#[from] MlirError),
    /// The arguments do not fit the program.
    #[error("{0}")]
    Arguments(String),
    /// An argument's sharding cannot be applied.
    #[error("{value}: {source}")]
    Sharding {
        /// The argument.
        value: String,
        /// Why.
        #[source]
        source: ShardingError,
    },
    /// The plugin failed.
    #[error(transparent)]
    Pjrt(#[from] tessel_pjrt::Error),
}

fn args_error(msg: impl Into<String>) -> RunError {
    RunError::Arguments(msg.into())
}

/// Compiles and runs `req.program`, returning the global value of each
/// result.
pub fn run_program(plugin: &Plugin, req: &RunRequest) -> Result<Vec<HostBuffer>, RunError> {
    let source = ProgramSource::parse(&req.program)?;
    let partitions = source.partitions(req.partitions)?;
    let devices = req.devices.unwrap_or(partitions);
    if devices < partitions {
        return Err(args_error(format!(
            "{partitions} partitions need at least {partitions} devices, got {devices}"
        )));
    }
    let args: Vec<&HostBuffer> = req.args.iter().collect();
    // Checked here too so bad arguments fail before a client is created.
    if let Some(sig) = &source.signature {
        check_arguments(sig, &args)?;
    }
    let client = client_with_devices(plugin, devices, &req.options)?;
    let compiled = if partitions > client.addressable_devices()?.len() {
        // A multi-node plugin's client lists other processes' devices too:
        // one program over the first `partitions` of them, this process
        // running its own.
        let assignment = plugin_order_assignment(&client, partitions)?;
        CompiledProgram::compile_global(&client, source, &assignment)?
    } else {
        CompiledProgram::compile(&client, source, partitions)?
    };
    compiled.execute(&client, &args)
}

/// The plugin's devices by (process, local id), the first `partitions` of
/// them as a device assignment.
fn plugin_order_assignment(client: &Client, partitions: usize) -> Result<Vec<i64>, RunError> {
    let devices = plugin_devices(client)?;
    let mut mesh: Vec<(u32, i32)> = devices
        .iter()
        .map(|d| (d.process_index.max(0) as u32, d.local_hardware_id))
        .collect();
    mesh.sort_unstable();
    mesh.truncate(partitions);
    crate::program::global::device_assignment(&mesh, &devices).map_err(args_error)
}

/// Every device the client lists (a multi-node plugin's: every node's).
pub fn plugin_devices(
    client: &Client,
) -> Result<Vec<crate::program::global::PluginDevice>, RunError> {
    client
        .devices()?
        .iter()
        .map(|d| {
            Ok(crate::program::global::PluginDevice {
                id: d.id()?,
                process_index: d.process_index()?,
                local_hardware_id: d.local_hardware_id()?,
            })
        })
        .collect()
}

/// A program as given: MLIR text (whose signature is read) or bytecode.
#[derive(Debug, Clone)]
pub struct ProgramSource {
    program: Program,
    /// `None` for bytecode.
    pub signature: Option<Signature>,
}

impl ProgramSource {
    /// Reads bytecode, or text with its signature.
    pub fn parse(bytes: &[u8]) -> Result<ProgramSource, RunError> {
        if bytes.starts_with(b"ML\xefR") {
            return Ok(ProgramSource {
                program: Program::mlir_bytecode(bytes.to_vec()),
                signature: None,
            });
        }
        let text = std::str::from_utf8(bytes).map_err(|_| RunError::NotMlir)?;
        Ok(ProgramSource {
            program: Program::mlir_text(text),
            signature: Some(parse_signature(text)?),
        })
    }

    /// The partitions to compile for: `requested`, which must agree with
    /// the module's `mhlo.num_partitions` where it declares one.
    pub fn partitions(&self, requested: Option<usize>) -> Result<usize, RunError> {
        let declared = self.signature.as_ref().and_then(|s| s.num_partitions);
        let partitions = match (requested, declared) {
            (Some(p), Some(d)) if p != d => {
                return Err(args_error(format!(
                "the program declares mhlo.num_partitions = {d}, but {p} partitions were requested"
            )))
            }
            (Some(p), _) | (None, Some(p)) => p,
            (None, None) => 1,
        };
        if partitions == 0 {
            return Err(args_error("partitions must be at least 1"));
        }
        Ok(partitions)
    }
}

/// A compiled program and where its partitions run: on a client's first
/// `partitions` devices ([`CompiledProgram::compile`]), or, for a global
/// program, on every device of every process, of which this process runs
/// the partitions of its own ([`CompiledProgram::compile_global`]).
pub struct CompiledProgram {
    exe: tessel_pjrt::LoadedExecutable,
    signature: Option<Signature>,
    partitions: usize,
    /// The executable's addressable devices, in its order.
    devices: Vec<tessel_pjrt::Device>,
    /// The partition each of `devices` runs.
    partition_of: Vec<usize>,
}

impl CompiledProgram {
    /// Compiles for `partitions` devices of `client`.
    pub fn compile(
        client: &Client,
        source: ProgramSource,
        partitions: usize,
    ) -> Result<CompiledProgram, RunError> {
        let options = CompileOptions::new(1, partitions);
        let compiled = CompiledProgram::build(client, source, options)?;
        if compiled.devices.len() != partitions {
            return Err(args_error(format!(
                "the executable runs on {} devices, expected {partitions}",
                compiled.devices.len()
            )));
        }
        Ok(compiled)
    }

    /// Compiles one program over every device in `assignment` (the plugin's
    /// device ids, partition by partition; [`super::global`]), of which this
    /// process runs those it can address.
    pub fn compile_global(
        client: &Client,
        source: ProgramSource,
        assignment: &[i64],
    ) -> Result<CompiledProgram, RunError> {
        let options = CompileOptions::new(1, assignment.len())
            .with_device_assignment(vec![assignment.to_vec()]);
        let mut compiled = CompiledProgram::build(client, source, options)?;
        compiled.partition_of = compiled
            .devices
            .iter()
            .map(|d| {
                let id = i64::from(d.id()?);
                assignment.iter().position(|&a| a == id).ok_or_else(|| {
                    args_error(format!(
                        "the executable runs on device {id}, which its assignment does not name"
                    ))
                })
            })
            .collect::<Result<_, RunError>>()?;
        if compiled.devices.is_empty() {
            return Err(args_error(
                "none of the program's devices is addressable by this process",
            ));
        }
        Ok(compiled)
    }

    fn build(
        client: &Client,
        source: ProgramSource,
        mut options: CompileOptions,
    ) -> Result<CompiledProgram, RunError> {
        let signature = source.signature;
        options.use_shardy_partitioner = signature.as_ref().is_some_and(|s| !s.meshes.is_empty());
        let partitions = options.num_partitions;
        let exe = client.compile(&source.program, &options)?;
        let devices = exe.addressable_devices()?;
        Ok(CompiledProgram {
            exe,
            signature,
            partitions,
            partition_of: (0..devices.len()).collect(),
            devices,
        })
    }

    /// `@main`'s signature, when compiled from text.
    pub fn signature(&self) -> Option<&Signature> {
        self.signature.as_ref()
    }

    /// Partitions over all processes.
    pub fn partitions(&self) -> usize {
        self.partitions
    }

    /// The devices this process runs the program on, in the executable's
    /// order: the order of [`Self::launch`]'s argument lists.
    pub fn devices(&self) -> &[tessel_pjrt::Device] {
        &self.devices
    }

    /// The partition [`Self::devices`]`[k]` runs.
    pub fn partition_of(&self, k: usize) -> usize {
        self.partition_of[k]
    }

    /// Whether the program may reuse parameter `i`'s buffers for a result.
    pub fn donates(&self, i: usize) -> bool {
        self.signature
            .as_ref()
            .and_then(|s| s.parameters.get(i))
            .is_some_and(|p| p.donated)
    }

    /// How parameter `i` (or result `i`, with `result`), of shape `dims`,
    /// is tiled over the partitions.
    pub fn tiling(&self, i: usize, result: bool, dims: &[i64]) -> Result<Tiling, RunError> {
        let Some(sig) = &self.signature else {
            return Ok(Tiling::replicated(dims.len(), self.partitions));
        };
        let v = if result {
            sig.results.get(i)
        } else {
            sig.parameters.get(i)
        }
        .ok_or_else(|| args_error(format!("the program has no value {i}")))?;
        Tiling::from_annotation(
            v.sharding.as_ref(),
            dims.len(),
            self.partitions,
            &sig.meshes,
        )
        .map_err(|source| RunError::Sharding {
            value: v.name.clone(),
            source,
        })
    }

    /// The shape each device's piece of parameter `i` must have, as the
    /// compiled program reports it.
    pub fn parameter_dims(&self, i: usize) -> Option<&[i64]> {
        self.exe
            .parameter_shapes()
            .and_then(|s| s.get(i))
            .map(|p| p.dims.as_slice())
    }

    /// Runs with `args[k]` the argument list of [`Self::devices`]`[k]`;
    /// the outputs, per device. Blocks until they are ready.
    pub fn launch(
        &self,
        args: Vec<Vec<tessel_pjrt::ExecuteArg<'_>>>,
    ) -> Result<Vec<Vec<Buffer>>, RunError> {
        Ok(self.exe.execute_args(args)?.wait()?)
    }

    /// Uploads `args` (whole arrays, split by the parameters' annotations),
    /// runs, and gathers each result from this process's devices.
    pub fn execute(
        &self,
        client: &Client,
        args: &[&HostBuffer],
    ) -> Result<Vec<HostBuffer>, RunError> {
        if let Some(sig) = &self.signature {
            check_arguments(sig, args)?;
        }
        let mut per_device: Vec<Vec<Buffer>> = self.devices.iter().map(|_| Vec::new()).collect();
        for (i, arg) in args.iter().enumerate() {
            let tiling = self.tiling(i, false, arg.dims())?;
            let expected = self.parameter_dims(i);
            for (k, device) in self.devices.iter().enumerate() {
                let shard = tiling.shard(arg, self.partition_of[k]).ok_or_else(|| {
                    args_error(format!(
                        "argument {i}: shape {:?} does not split evenly into tiles {:?}",
                        arg.dims(),
                        tiling.tiles
                    ))
                })?;
                if let Some(want) = expected {
                    if want != shard.dims() {
                        return Err(args_error(format!(
                            "argument {i}: each device expects {want:?}, but splitting {:?} gives {:?}; annotate the parameter with mhlo.sharding",
                            arg.dims(),
                            shard.dims()
                        )));
                    }
                }
                per_device[k].push(client.buffer_from_host(&shard, device)?);
            }
        }
        let lists: Vec<Vec<tessel_pjrt::ExecuteArg<'_>>> = per_device
            .iter()
            .map(|l| l.iter().map(tessel_pjrt::ExecuteArg::Borrow).collect())
            .collect();
        let outputs = self.launch(lists)?;

        // Gather each result from the devices that hold it.
        let num_outputs = outputs.first().map_or(0, Vec::len);
        let mut results = Vec::with_capacity(num_outputs);
        for r in 0..num_outputs {
            let shards: Vec<HostBuffer> = outputs
                .iter()
                .map(|l| l[r].to_host_blocking())
                .collect::<Result<_, _>>()?;
            let result = match self.signature.as_ref().and_then(|s| s.results.get(r)) {
                Some(v) => {
                    let tiling = self.tiling(r, true, &v.ty.dims)?;
                    let mut out = vec![0u8; v.ty.byte_len()];
                    let mut covered = 0;
                    let mut seen = std::collections::BTreeSet::new();
                    for (k, shard) in shards.iter().enumerate() {
                        let (start, _) = tiling
                            .tile(&v.ty.dims, self.partition_of[k])
                            .ok_or_else(|| args_error(format!("{}: uneven tiles", v.name)))?;
                        if seen.insert(start.clone()) {
                            if !crate::program::sharding::insert(
                                &mut out, &v.ty.dims, &start, shard,
                            ) {
                                return Err(args_error(format!(
                                    "{}: a device's output does not fit {}",
                                    v.name, v.ty
                                )));
                            }
                            covered += shard.bytes().len();
                        }
                    }
                    if covered != out.len() {
                        return Err(args_error(format!(
                            "{}: this process's devices hold only part of it (the rest is on other processes' devices)",
                            v.name
                        )));
                    }
                    HostBuffer::from_bytes(v.ty.element_type, &v.ty.dims, out)?
                }
                // Without a readable signature, results are shown as the
                // first device holds them.
                None => shards.into_iter().next().expect("at least one device"),
            };
            results.push(result);
        }
        Ok(results)
    }
}

/// Checks count, element types and global shapes of the arguments.
fn check_arguments(sig: &Signature, args: &[&HostBuffer]) -> Result<(), RunError> {
    if args.len() != sig.parameters.len() {
        let wanted: Vec<String> = sig
            .parameters
            .iter()
            .map(|p| format!("{}: {}", p.name, p.ty))
            .collect();
        return Err(args_error(format!(
            "@main takes {} arguments ({}), got {}",
            sig.parameters.len(),
            wanted.join(", "),
            args.len()
        )));
    }
    for (i, (p, a)) in sig.parameters.iter().zip(args).enumerate() {
        if p.ty.element_type != a.element_type() || p.ty.dims != a.dims() {
            return Err(args_error(format!(
                "argument {i} ({}): expected {}, got {}{:?}",
                p.name,
                p.ty,
                a.element_type(),
                a.dims()
            )));
        }
    }
    Ok(())
}

/// A client with at least `devices` devices, created with `options`. The
/// CPU plugin is asked for exactly that many (`cpu_device_count`); other
/// plugins have the devices they have (a multi-node plugin's client lists
/// every node's), and too few is an error.
pub fn client_with_devices(
    plugin: &Plugin,
    devices: usize,
    options: &[NamedValue],
) -> Result<Client, RunError> {
    let with = |extra: Option<i64>| {
        let mut o = ClientOptions::default();
        for nv in options {
            o = o.option(nv.name.clone(), nv.value.clone());
        }
        if let Some(n) = extra {
            o = o.option("cpu_device_count", n);
        }
        o
    };
    let client = Client::create(plugin, with(None))?;
    let have = client.addressable_devices()?.len();
    if client.platform_name()? == "cpu" && have != devices {
        drop(client);
        return Ok(Client::create(plugin, with(Some(devices as i64)))?);
    }
    let have = client.devices()?.len();
    if have < devices {
        return Err(args_error(format!(
            "the plugin has {have} devices, {devices} are needed"
        )));
    }
    Ok(client)
}
