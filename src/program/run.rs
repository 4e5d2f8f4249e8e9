//! Running one StableHLO program on one host: check the arguments against
//! the program's signature, split them over the partitions, execute on the
//! plugin's devices and gather the results. This is what `tessel run` does.

use tessel_pjrt::{Buffer, Client, ClientOptions, CompileOptions, HostBuffer, Plugin, Program};

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
    let client = client_with_devices(plugin, devices)?;
    let compiled = CompiledProgram::compile(&client, source, partitions)?;
    compiled.execute(&client, &args)
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

/// A program compiled for a client's first `partitions` devices: it takes
/// whole arrays, splits them over the devices by the parameters' sharding
/// annotations, and reassembles the results.
pub struct CompiledProgram {
    exe: tessel_pjrt::LoadedExecutable,
    signature: Option<Signature>,
    partitions: usize,
    devices: Vec<tessel_pjrt::Device>,
}

impl CompiledProgram {
    /// Compiles for `partitions` devices of `client`.
    pub fn compile(
        client: &Client,
        source: ProgramSource,
        partitions: usize,
    ) -> Result<CompiledProgram, RunError> {
        let signature = source.signature;
        let mut options = CompileOptions::new(1, partitions);
        options.use_shardy_partitioner = signature.as_ref().is_some_and(|s| !s.meshes.is_empty());
        let exe = client.compile(&source.program, &options)?;
        let devices = exe.addressable_devices()?;
        if devices.len() != partitions {
            return Err(args_error(format!(
                "the executable runs on {} devices, expected {partitions}",
                devices.len()
            )));
        }
        Ok(CompiledProgram {
            exe,
            signature,
            partitions,
            devices,
        })
    }

    /// `@main`'s signature, when compiled from text.
    pub fn signature(&self) -> Option<&Signature> {
        self.signature.as_ref()
    }

    /// Uploads `args` (whole arrays, split by the parameters' annotations),
    /// runs, and gathers each result.
    pub fn execute(
        &self,
        client: &Client,
        args: &[&HostBuffer],
    ) -> Result<Vec<HostBuffer>, RunError> {
        let (signature, partitions) = (&self.signature, self.partitions);
        if let Some(sig) = signature {
            check_arguments(sig, args)?;
        }
        // Split every argument into its per-partition shards and upload them.
        let mut per_device: Vec<Vec<Buffer>> = (0..partitions).map(|_| Vec::new()).collect();
        for (i, arg) in args.iter().enumerate() {
            let tiling = match signature {
                Some(sig) => {
                    let p = &sig.parameters[i];
                    Tiling::from_annotation(
                        p.sharding.as_ref(),
                        arg.dims().len(),
                        partitions,
                        &sig.meshes,
                    )
                    .map_err(|source| RunError::Sharding {
                        value: format!("argument {i} ({})", p.name),
                        source,
                    })?
                }
                None => Tiling::replicated(arg.dims().len(), partitions),
            };
            let expected = self.exe.parameter_shapes().and_then(|s| s.get(i));
            for (p, device) in self.devices.iter().enumerate() {
                let shard = tiling.shard(arg, p).ok_or_else(|| {
                    args_error(format!(
                        "argument {i}: shape {:?} does not split evenly into tiles {:?}",
                        arg.dims(),
                        tiling.tiles
                    ))
                })?;
                if let Some(want) = expected {
                    if want.dims != shard.dims() {
                        return Err(args_error(format!(
                            "argument {i}: each device expects {want}, but splitting {:?} gives {:?}; annotate the parameter with mhlo.sharding",
                            arg.dims(),
                            shard.dims()
                        )));
                    }
                }
                per_device[p].push(client.buffer_from_host(&shard, device)?);
            }
        }
        let lists: Vec<Vec<&Buffer>> = per_device.iter().map(|l| l.iter().collect()).collect();
        let lists: Vec<&[&Buffer]> = lists.iter().map(Vec::as_slice).collect();
        let outputs = self.exe.execute(&lists)?.wait()?;

        // Gather each result from the devices that hold it.
        let num_outputs = outputs.first().map_or(0, Vec::len);
        let mut results = Vec::with_capacity(num_outputs);
        for r in 0..num_outputs {
            let shards: Vec<HostBuffer> = outputs
                .iter()
                .map(|l| l[r].to_host_blocking())
                .collect::<Result<_, _>>()?;
            let result = match signature.as_ref().and_then(|s| s.results.get(r)) {
                Some(v) => {
                    let sig = signature.as_ref().expect("checked above");
                    let tiling = Tiling::from_annotation(
                        v.sharding.as_ref(),
                        v.ty.dims.len(),
                        partitions,
                        &sig.meshes,
                    )
                    .map_err(|source| RunError::Sharding {
                        value: v.name.clone(),
                        source,
                    })?;
                    tiling.assemble(&v.ty.dims, &shards).ok_or_else(|| {
                        args_error(format!(
                            "{}: the devices' outputs do not assemble into {}",
                            v.name, v.ty
                        ))
                    })?
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

/// A client with at least `devices` devices. The CPU plugin is asked for
/// exactly that many (`cpu_device_count`); other plugins have the devices
/// they have, and too few is an error.
pub fn client_with_devices(plugin: &Plugin, devices: usize) -> Result<Client, RunError> {
    let client = Client::create(plugin, ClientOptions::default())?;
    let have = client.addressable_devices()?.len();
    if client.platform_name()? == "cpu" && have != devices {
        drop(client);
        return Ok(Client::create(
            plugin,
            ClientOptions::default().option("cpu_device_count", devices as i64),
        )?);
    }
    if have < devices {
        return Err(args_error(format!(
            "the plugin has {have} devices, {devices} are needed"
        )));
    }
    Ok(client)
}
