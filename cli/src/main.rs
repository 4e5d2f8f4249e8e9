//! The `tessel` command: one file per command group, the library
//! (`tessel`) doing the work. The benchmarks are another binary,
//! `tessel-bench`, so this one does not carry them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};

mod args;
mod certs;
mod cluster;
mod context;
mod coordinator;
mod exit;
mod install;
mod jobs;
mod kv;
mod local;
mod logging;
mod logs;
mod metrics_http;
mod output;
mod program;
mod registry;
mod target_env;
mod worker;

/// mimalloc for Rust's allocations (the plugin's C allocations keep
/// glibc's): replicas and clients allocate per request, where glibc's
/// malloc costs CPU (docs/performance.md). Built without transparent huge
/// pages, so a touched segment does not hold 2 MiB. Values handed to the
/// plugin are freed through our own deleter, never by its `free`.
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
    /// Log lines (stderr) as text or as JSON, one object a line, with a
    /// job process's job, attempt and process as fields.
    #[arg(long, global = true, value_enum, env = logging::ENV, default_value_t)]
    log_format: logging::LogFormat,
}

/// The shells `tessel completions` writes for.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Subcommand)]
enum Command {
    /// Create certificates for the cluster's mutual TLS.
    Certs {
        #[command(subcommand)]
        command: certs::CertsCommand,
    },
    /// Named clusters to talk to (coordinators and TLS folder), like
    /// kubeconfig's contexts.
    Context {
        #[command(subcommand)]
        command: context::ContextCommand,
    },
    /// Run one replica of the replicated key-value service.
    Coordinator(coordinator::CoordinatorArgs),
    /// Read and write the key-value service.
    Kv(kv::KvArgs),
    /// Run the per-host agent: register, keep a lease, run job processes.
    Worker(worker::WorkerArgs),
    /// Registered workers: state, incarnation, last heartbeat.
    Workers(registry::WorkersArgs),
    /// Probe a coordinator's or worker's health at its `--metrics-listen`
    /// address (exit 0 when healthy; with `--ready`, when ready).
    Health {
        /// `HOST:PORT` of its `--metrics-listen`.
        addr: String,
        /// Ask whether it is ready (a replica that knows a leader, a
        /// worker that holds its lease), not only alive.
        #[arg(long)]
        ready: bool,
    },
    /// Drain a worker: no new placements; its running attempts checkpoint
    /// and move (`--undo` to take placements again).
    Drain(registry::DrainArgs),
    /// A job's global device topology.
    Topology(registry::TopologyArgs),
    /// Start coordinators and workers as processes on this machine.
    Local(local::LocalArgs),
    /// Submit a job spec to the cluster's scheduler (prints the job id).
    Submit(jobs::SubmitArgs),
    /// Jobs the scheduler knows: state, attempt, workers, reason.
    Jobs(jobs::JobsArgs),
    /// One job: state, placement, restarts, each attempt's end, last
    /// reports.
    Job(jobs::JobArgs),
    /// Cancel a job (its devices are freed).
    Cancel(jobs::JobIdArgs),
    /// Write an array a finished job's plan wrote to a `.npy` file.
    Fetch(jobs::FetchArgs),
    /// A command job's output, each line prefixed with its process.
    Logs(logs::LogsArgs),
    /// Copy this binary to DIR/bin/tessel and the plugins in
    /// $TESSEL_PLUGIN_DIR to DIR/plugins (an init container that puts
    /// tessel into a user's image).
    Install {
        /// The folder (a volume the worker's container mounts).
        dir: std::path::PathBuf,
    },
    /// Print a completion script for SHELL (bash, zsh, fish):
    /// `tessel completions bash > /etc/bash_completion.d/tessel`,
    /// `tessel completions zsh > "${fpath[1]}/_tessel"`,
    /// `tessel completions fish > ~/.config/fish/completions/tessel.fish`.
    Completions {
        /// The shell.
        shell: Shell,
    },
    /// Inspect and change the replica set.
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
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
    /// Compile and run a StableHLO program (MLIR text or bytecode) on this host.
    Run {
        /// The program: a `.mlir` file (text or bytecode) whose entry is `@main`.
        program: PathBuf,
        #[command(flatten)]
        plugin: args::PluginArg,
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
enum PluginCommand {
    /// API version, platform, attributes and devices of a plugin.
    Info {
        #[command(flatten)]
        plugin: args::PluginArg,
        #[command(flatten)]
        output: output::OutputArgs,
    },
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
    let service = match cli.command {
        Command::Coordinator(_) => "tessel-coordinator",
        Command::Worker(_) => "tessel-worker",
        _ => "tessel",
    };
    // Flushes the last spans when main returns.
    let _telemetry = logging::init(cli.log_format, service);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", report(&e));
            ExitCode::from(exit::code(&e))
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
        tessel_harness::exit_with_parent();
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
        Command::Certs { command } => certs::certs(command),
        Command::Context { command } => context::context(command),
        Command::Coordinator(args) => {
            runtime_with(Some(args.worker_threads.into()))?.block_on(coordinator::coordinator(args))
        }
        Command::Kv(args) => runtime()?.block_on(kv::kv(args)),
        Command::Worker(args) => runtime()?.block_on(worker::worker(args)),
        Command::Workers(args) => runtime()?.block_on(registry::workers(args)),
        Command::Drain(args) => runtime()?.block_on(registry::drain(args)),
        Command::Health { addr, ready } => runtime()?.block_on(metrics_http::probe(&addr, ready)),
        Command::Topology(args) => runtime()?.block_on(registry::topology(args)),
        Command::Local(args) => runtime()?.block_on(local::local(args)),
        Command::Submit(args) => runtime()?.block_on(jobs::submit(args)),
        Command::Jobs(args) => runtime()?.block_on(jobs::jobs(args)),
        Command::Job(args) => runtime()?.block_on(jobs::job(args)),
        Command::Cancel(args) => runtime()?.block_on(jobs::cancel(args)),
        Command::Fetch(args) => runtime()?.block_on(jobs::fetch(args)),
        Command::Logs(args) => runtime()?.block_on(logs::logs(args)),
        Command::Cluster { command } => runtime()?.block_on(cluster::cluster(command)),
        Command::Install { dir } => install::install(
            &dir,
            std::env::var_os(tessel::pjrt::locate::PLUGIN_DIR_ENV).map(Into::into),
        ),
        Command::Validate { spec } => program::validate_spec(&spec),
        Command::Completions { shell } => {
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            clap_complete::generate(shell, &mut Cli::command(), "tessel", &mut std::io::stdout());
            Ok(())
        }
        Command::Compare { a, b, atol } => program::compare_arrays(&a, &b, atol),
        Command::Plugin {
            command: PluginCommand::Info { plugin, output },
        } => program::plugin_info(&plugin.load()?, output),
        Command::Run {
            program,
            plugin,
            devices,
            partitions,
            args,
            out,
        } => program::run(
            &program,
            &plugin,
            devices,
            partitions,
            &args,
            out.as_deref(),
        ),
    }
}
