//! The `tessel` command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use tessel::array::{format_array, parse_literal, read_npy, write_npy};
use tessel::pjrt::{locate, Client, ClientOptions, HostBuffer, Plugin};
use tessel::run::{run_program, RunRequest};

/// mimalloc, not glibc's malloc, for Rust's allocations in every `tessel`
/// process (the plugin's own C allocations keep glibc's). Replicas and
/// clients allocate per request (QUIC stream state, frames, overlay
/// entries), and glibc's malloc, free and fastbin consolidation were ~13 %
/// of the machine's samples at 64 clients: interleaved `bench kv` rounds
/// (2026-11-25) gave 84.7 against 93.5 µs of CPU per put at 64 clients,
/// and 18.4 k against 17.5 k puts/s. Values handed to the plugin are freed
/// through our own deleter, never by the plugin's `free`.
///
/// Built with `no_thp`: mimalloc otherwise asks for transparent huge pages
/// (`MADV_HUGEPAGE`) on its segments, and every touched segment then holds
/// a whole 2 MiB page. An idle replica held 49 MiB instead of 22 MiB, and
/// a leader after 1 M keys 130-154 MiB instead of 111 MiB; three
/// interleaved `bench kv` rounds ran no slower without them (64 clients:
/// 19.6 k against 18.1 k puts/s, medians).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "tessel", version, about = "Multi-host ML jobs on PJRT")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Exit when stdin closes (set by `tessel local` on its children).
    #[arg(long, global = true, hide = true)]
    exit_with_parent: bool,
}

mod bench_bootstrap;
mod bench_jax;
mod bench_job;
mod bench_kv;
mod bench_transfer;
mod cluster_cli;
mod job_cli;
mod metrics_http;
mod node_cli;
mod procs;
mod tcp_ring;
mod transfer_cli;

#[derive(Subcommand)]
enum Command {
    /// Create certificates for the cluster's mutual TLS.
    Certs {
        #[command(subcommand)]
        command: cluster_cli::CertsCommand,
    },
    /// Run one replica of the replicated key-value service.
    Coordinator(cluster_cli::CoordinatorArgs),
    /// Read and write the key-value service.
    Kv(cluster_cli::KvArgs),
    /// Run the per-host agent: register, keep a lease, run job processes.
    Worker(node_cli::WorkerArgs),
    /// Registered workers: state, incarnation, last heartbeat.
    Workers(node_cli::WorkersArgs),
    /// A job's global device topology.
    Topology(node_cli::TopologyArgs),
    /// Start coordinators and workers as processes on this machine.
    Local(node_cli::LocalArgs),
    /// Submit a job spec to the cluster's scheduler (prints the job id).
    Submit(job_cli::SubmitArgs),
    /// Jobs the scheduler knows: state, attempt, workers, reason.
    Jobs(job_cli::JobIdArgs),
    /// One job: state, placement, restarts, last reports.
    Job(job_cli::JobIdArgs),
    /// Cancel a job (its devices are freed).
    Cancel(job_cli::JobIdArgs),
    /// Write an array a finished job's plan wrote to a `.npy` file.
    Fetch(job_cli::FetchArgs),
    /// Benchmarks (JSON lines on stdout).
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Inspect and change the replica set.
    Cluster {
        #[command(subcommand)]
        command: cluster_cli::ClusterCommand,
    },
    /// Inspect PJRT plugins.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Check a job spec (TOML) without a cluster: names, files, program
    /// signatures against array shapes, mesh against devices.
    Validate {
        /// The job spec.
        spec: PathBuf,
    },
    /// Compare two `.npy` arrays: same type and shape, and the largest
    /// element-wise difference within `--atol` (exit code 1 if not).
    Compare {
        a: PathBuf,
        b: PathBuf,
        /// Largest allowed absolute difference.
        #[arg(long, default_value_t = 0.0)]
        atol: f64,
    },
    /// (internal) One rank of a transfer group, driven over stdin/stdout.
    #[command(hide = true)]
    TransferRank(transfer_cli::TransferRankArgs),
    /// Compile and run a StableHLO program (MLIR text or bytecode) on this host.
    Run {
        /// The program: a `.mlir` file (text or bytecode) whose entry is `@main`.
        program: PathBuf,
        #[command(flatten)]
        plugin: PluginArg,
        /// CPU devices to create (default: one per partition).
        #[arg(long)]
        devices: Option<usize>,
        /// SPMD partitions (default: the module's mhlo.num_partitions, else 1).
        #[arg(long)]
        partitions: Option<usize>,
        /// An argument, in parameter order: a `.npy` file or a literal such as
        /// `f32[2,2]=1,2,3,4` (one value fills the shape: `f32[1000]=0`).
        #[arg(long = "arg", value_name = "SPEC")]
        args: Vec<String>,
        /// Write each output to DIR/output<N>.npy.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The replicated key-value service: 3 replica processes on loopback.
    Kv(bench_kv::BenchKvArgs),
    /// Worker start to global topology known by all, processes and simulated.
    Bootstrap(bench_bootstrap::BenchBootstrapArgs),
    /// Point-to-point throughput between two processes: QUIC against TCP.
    Transfer(bench_transfer::BenchTransferArgs),
    /// A job's step time on a local cluster (default: the MLP demo), and
    /// the same training in JAX over gloo.
    Job(bench_job::BenchJobArgs),
}

#[derive(Subcommand)]
enum PluginCommand {
    /// API version, platform, attributes and devices of a plugin.
    Info {
        #[command(flatten)]
        plugin: PluginArg,
    },
}

#[derive(clap::Args)]
struct PluginArg {
    /// A plugin name (cpu, cuda, cpu-lammps, cpu-fastatomstruct) or the path
    /// of a PJRT plugin library. Default: $TESSEL_PJRT_PLUGIN, else cpu.
    #[arg(long, value_name = "NAME|PATH")]
    plugin: Option<String>,
}

impl PluginArg {
    fn load(&self) -> Result<Plugin> {
        let path = locate::resolve(self.plugin.as_deref())?;
        Ok(Plugin::load(&path)?)
    }
}

fn main() -> ExitCode {
    // XLA's own logging goes to stderr at INFO; keep errors only unless the
    // user asks for more. Set before any plugin is loaded, while no other
    // thread exists.
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "2");
    }
    let cli = Cli::parse();
    // Large host buffers are reused rather than unmapped and faulted in
    // again, for the commands that move tensors; a coordinator keeps no
    // tensors, and retaining its peak heap would only inflate its memory.
    if !matches!(cli.command, Command::Coordinator(_)) {
        tessel_transfer::memory::retain_large_allocations();
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", report(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each once: many of our errors already say
/// their source in their own message.
fn report(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out
}

fn run(cli: Cli) -> Result<()> {
    if cli.exit_with_parent {
        procs::exit_with_parent();
    }
    // `threads`: the runtime's worker threads; `None`, one per core.
    let runtime_with = |threads: Option<usize>| {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = threads {
            builder.worker_threads(n);
        }
        builder
            .enable_all()
            .build()
            .context("cannot start the async runtime")
    };
    let runtime = || runtime_with(None);
    match cli.command {
        Command::Certs { command } => cluster_cli::certs(command),
        Command::Coordinator(args) => {
            runtime_with(Some(args.worker_threads.into()))?.block_on(cluster_cli::coordinator(args))
        }
        Command::Kv(args) => runtime()?.block_on(cluster_cli::kv(args)),
        Command::Worker(args) => runtime()?.block_on(node_cli::worker(args)),
        Command::Workers(args) => runtime()?.block_on(node_cli::workers(args)),
        Command::Topology(args) => runtime()?.block_on(node_cli::topology(args)),
        Command::Local(args) => runtime()?.block_on(node_cli::local(args)),
        Command::Submit(args) => runtime()?.block_on(job_cli::submit(args)),
        Command::Jobs(args) => runtime()?.block_on(job_cli::jobs(args)),
        Command::Job(args) => runtime()?.block_on(job_cli::job(args)),
        Command::Cancel(args) => runtime()?.block_on(job_cli::cancel(args)),
        Command::Fetch(args) => runtime()?.block_on(job_cli::fetch(args)),
        Command::Cluster { command } => runtime()?.block_on(cluster_cli::cluster(command)),
        Command::Bench {
            command: BenchCommand::Kv(args),
        } => runtime()?.block_on(async {
            // On a runtime worker, as the tasks of a client program run:
            // the thread blocking on the runtime is not one, so each of
            // its awaits would add a wake-up from a worker to every timed
            // call of the sequential figures.
            tokio::spawn(bench_kv::run(args))
                .await
                .context("the bench task failed")?
        }),
        Command::Bench {
            command: BenchCommand::Bootstrap(args),
        } => runtime()?.block_on(bench_bootstrap::run(args)),
        Command::Bench {
            command: BenchCommand::Transfer(args),
        } => runtime()?.block_on(bench_transfer::run(args)),
        Command::Bench {
            command: BenchCommand::Job(args),
        } => runtime()?.block_on(bench_job::run(args)),
        Command::Validate { spec } => validate_spec(&spec),
        Command::Compare { a, b, atol } => compare_arrays(&a, &b, atol),
        Command::TransferRank(args) => runtime()?.block_on(transfer_cli::run(args)),
        Command::Plugin {
            command: PluginCommand::Info { plugin },
        } => plugin_info(&plugin.load()?),
        Command::Run {
            program,
            plugin,
            devices,
            partitions,
            args,
            out,
        } => {
            let code = std::fs::read(&program)
                .with_context(|| format!("cannot read {}", program.display()))?;
            let args = args
                .iter()
                .map(|s| parse_arg(s))
                .collect::<Result<Vec<_>>>()?;
            let plugin = plugin.load()?;
            let request = RunRequest {
                program: code,
                devices,
                partitions,
                args,
            };
            let outputs = run_program(&plugin, &request)
                .with_context(|| format!("running {}", program.display()))?;
            for (i, o) in outputs.iter().enumerate() {
                println!(
                    "output {i}: {}{:?} = {}",
                    o.element_type(),
                    o.dims(),
                    format_array(o)
                );
            }
            if let Some(dir) = out {
                write_outputs(&dir, &outputs)?;
            }
            Ok(())
        }
    }
}

fn validate_spec(path: &Path) -> Result<()> {
    let v = tessel::job::JobSpec::load(path)?;
    let s = &v.spec;
    println!(
        "{}: job `{}` is valid — {} processes × {} devices, mesh {}, {} steps of {} operations",
        path.display(),
        s.name,
        s.processes,
        s.devices_per_process,
        s.mesh,
        s.steps,
        s.plan.len()
    );
    for (name, t) in &v.local_types {
        println!("  {name}: {t} per process");
    }
    Ok(())
}

fn compare_arrays(a: &Path, b: &Path, atol: f64) -> Result<()> {
    let load = |p: &Path| -> Result<HostBuffer> {
        let data = std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?;
        read_npy(&data).with_context(|| p.display().to_string())
    };
    let (x, y) = (load(a)?, load(b)?);
    if x.element_type() != y.element_type() || x.dims() != y.dims() {
        bail!(
            "{} is {}{:?}, {} is {}{:?}",
            a.display(),
            x.element_type(),
            x.dims(),
            b.display(),
            y.element_type(),
            y.dims()
        );
    }
    let (xs, ys) = (tessel::array::to_f64(&x), tessel::array::to_f64(&y));
    let (mut worst, mut at) = (0.0f64, 0usize);
    for (i, (p, q)) in xs.iter().zip(&ys).enumerate() {
        let d = (p - q).abs();
        if d > worst || d.is_nan() {
            (worst, at) = (d, i);
        }
    }
    let name = a.file_name().unwrap_or_default().to_string_lossy();
    println!(
        "{name}: {}{:?}, max |a - b| = {worst:.3e} (element {at}), tolerance {atol:.1e}",
        x.element_type(),
        x.dims()
    );
    if worst > atol || worst.is_nan() {
        bail!(
            "{} and {} differ by {worst:e} > {atol:e}",
            a.display(),
            b.display()
        );
    }
    Ok(())
}

/// `--arg`: an existing file is read as `.npy`, anything else is a literal.
fn parse_arg(spec: &str) -> Result<HostBuffer> {
    let path = Path::new(spec);
    if path.is_file() {
        let data = std::fs::read(path).with_context(|| format!("cannot read {spec}"))?;
        return read_npy(&data).with_context(|| format!("--arg {spec}"));
    }
    if spec.ends_with(".npy") && !spec.contains('=') {
        bail!("--arg {spec}: no such file");
    }
    parse_literal(spec).with_context(|| format!("--arg {spec}"))
}

fn write_outputs(dir: &Path, outputs: &[HostBuffer]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (i, o) in outputs.iter().enumerate() {
        let path = dir.join(format!("output{i}.npy"));
        std::fs::write(&path, write_npy(o))
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn plugin_info(plugin: &Plugin) -> Result<()> {
    let (major, minor) = plugin.api_version();
    println!("plugin      {}", plugin.path().display());
    println!("C API       {major}.{minor}");
    println!("attributes");
    for a in plugin.attributes()? {
        println!("  {:<28} {}", a.name, a.value);
    }
    let client = Client::create(plugin, ClientOptions::default())?;
    println!(
        "platform    {} ({})",
        client.platform_name()?,
        client.platform_version()?
    );
    println!("process     {}", client.process_index()?);
    let devices = client.devices()?;
    let addressable = client.addressable_devices()?.len();
    println!("devices     {} ({addressable} addressable)", devices.len());
    let rows: Vec<[String; 6]> = devices
        .iter()
        .map(|d| -> Result<[String; 6]> {
            let memories: Vec<String> = d
                .memories()?
                .iter()
                .map(|m| m.kind())
                .collect::<Result<_, _>>()?;
            Ok([
                d.id()?.to_string(),
                d.process_index()?.to_string(),
                d.kind()?,
                d.local_hardware_id()?.to_string(),
                memories.join(","),
                d.debug_string()?,
            ])
        })
        .collect::<Result<_>>()?;
    let header = ["ID", "PROCESS", "KIND", "LOCAL", "MEMORIES", "DESCRIPTION"];
    let widths: Vec<usize> = (0..6)
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 6]| {
        let s: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("  {}", s.join("  ").trim_end());
    };
    line(header);
    for r in &rows {
        line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]);
    }
    for d in &devices {
        let attrs = d.attributes()?;
        if !attrs.is_empty() {
            let list: Vec<String> = attrs
                .iter()
                .map(|a| format!("{}={}", a.name, a.value))
                .collect();
            println!("  device {} attributes: {}", d.id()?, list.join(" "));
        }
    }
    Ok(())
}
