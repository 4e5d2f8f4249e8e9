//! `tessel-bench`: tessel's benchmarks, each beside its peer in one run,
//! printing JSON lines. A binary of its own, so the shipped `tessel` does
//! not carry them; it drives the `tessel` binary beside it (or
//! `$TESSEL_BIN`) for coordinators and workers.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// The same allocator as `tessel`'s, so that the figures are its figures.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tessel-bench",
    version,
    about = "tessel's benchmarks (JSON lines on stdout)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The replicated key-value service: 3 replica processes on loopback.
    Kv(tessel_bench::kv::BenchKvArgs),
    /// Worker start to global topology known by all, processes and simulated.
    Bootstrap(tessel_bench::bootstrap::BenchBootstrapArgs),
    /// What a client connection costs, dialing side and replicas'.
    Dial(tessel_bench::dial::BenchDialArgs),
    /// Simulated workers heartbeating: the leader's load, a put's latency
    /// meanwhile, and how soon a silent one is seen lost.
    Heartbeat(tessel_bench::heartbeat::BenchHeartbeatArgs),
    /// A large job's steady state: the leader's load and apply rate while
    /// process 0 reports and checkpoints and every host beats.
    Steady(tessel_bench::steady::BenchSteadyArgs),
    /// Point-to-point throughput between two processes: QUIC against TCP.
    Transfer(tessel_bench::transfer::BenchTransferArgs),
    /// A job's step time on a local cluster (default: the MLP demo), and
    /// the same training in JAX over gloo.
    Job(tessel_bench::job::BenchJobArgs),
    /// Command jobs as a launcher: start and restart of 4 Python
    /// processes, against spawning them directly and JAX's start-up.
    Launch(tessel_bench::launch::BenchLaunchArgs),
    /// (internal) One rank of a transfer group, driven over stdin/stdout.
    #[command(hide = true)]
    TransferRank(tessel_bench::transfer_rank::TransferRankArgs),
}

fn main() -> ExitCode {
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "2");
    }
    let cli = Cli::parse();
    tessel_transfer::memory::retain_large_allocations();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match cli.command {
        Command::Kv(args) => runtime.block_on(async {
            // On a runtime worker, as the tasks of a client program run:
            // the thread blocking on the runtime is not one, so each of
            // its awaits would add a wake-up from a worker to every timed
            // call of the sequential figures.
            tokio::spawn(tessel_bench::kv::run(args))
                .await
                .context("the bench task failed")?
        }),
        Command::Bootstrap(args) => runtime.block_on(tessel_bench::bootstrap::run(args)),
        Command::Dial(args) => runtime.block_on(tessel_bench::dial::run(args)),
        Command::Heartbeat(args) => runtime.block_on(tessel_bench::heartbeat::run(args)),
        Command::Steady(args) => runtime.block_on(tessel_bench::steady::run(args)),
        Command::Transfer(args) => runtime.block_on(tessel_bench::transfer::run(args)),
        Command::Job(args) => runtime.block_on(tessel_bench::job::run(args)),
        Command::Launch(args) => runtime.block_on(tessel_bench::launch::run(args)),
        Command::TransferRank(args) => runtime.block_on(tessel_bench::transfer_rank::run(args)),
    }
}
