//! `tessel local`: coordinators and workers as processes on this machine,
//! for a job spec or to print a topology.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use tessel::local::LocalCluster;
use tessel_coordinator::jobs::{self, JobAssignment};
use tessel_coordinator::keys;
use tessel_kv::KvStore;

use crate::args::PluginArg;
use crate::coordinator::wait_for_signal;
use crate::nodes::read_topology;

#[derive(Args)]
pub(crate) struct LocalArgs {
    /// A job spec to run on the fresh cluster: one worker per process of
    /// the spec; exits with the job's status.
    pub job: Option<PathBuf>,
    /// Where to write every array's final value (`NAME.npy`).
    #[arg(long, value_name = "DIR", requires = "job")]
    pub out: Option<PathBuf>,
    /// Coordinator replicas to start.
    #[arg(long, default_value_t = 3)]
    pub coordinators: u64,
    /// Worker processes to start (without a job spec).
    #[arg(long, default_value_t = 2, conflicts_with = "job")]
    pub workers: u32,
    /// CPU devices per worker (without a job spec).
    #[arg(long, default_value_t = 2, conflicts_with = "job")]
    pub devices_per_worker: usize,
    #[command(flatten)]
    pub plugin: PluginArg,
    /// Print the job's global topology as JSON and exit.
    #[arg(long)]
    pub print_topology: bool,
    /// How long the topology exchange may take.
    #[arg(long, default_value_t = 60_000)]
    pub timeout_ms: u64,
    /// Keep the cluster up after printing, until Ctrl-C, to explore it with
    /// `tessel workers`, `tessel topology`, `tessel kv` (the addresses and
    /// the TLS folder are printed on stderr).
    #[arg(long)]
    pub keep_running: bool,
}

pub(crate) async fn local(args: LocalArgs) -> Result<()> {
    if args.job.is_none() && !args.print_topology {
        bail!("give a job spec to run, or --print-topology to bring the cluster up and print its topology");
    }
    if args.job.is_some() && args.print_topology {
        bail!("--print-topology is for a cluster without a job");
    }
    if args.workers == 0 || args.coordinators == 0 {
        bail!("--workers and --coordinators must be at least 1");
    }
    // Refuse a bad spec before starting anything.
    let job = match &args.job {
        Some(path) => Some(tessel::job::JobSpec::load(path)?),
        None => None,
    };
    args.plugin.options()?; // refuse a malformed option before starting anything
    let mut cluster = LocalCluster::new(std::env::current_exe()?)?;
    cluster.worker_args = args.plugin.option_args();
    let result = tokio::select! {
        r = async {
            match &job {
                Some(job) if job.spec.is_command() => {
                    crate::logs::run_command_local(&mut cluster, args.coordinators, job).await
                }
                Some(job) => crate::jobs::run_on_local(&mut cluster, &args, job).await,
                None => run_local(&mut cluster, &args).await,
            }
        } => r,
        () = wait_for_signal() => {
            if args.keep_running { Ok(()) } else { Err(anyhow::anyhow!("interrupted")) }
        }
    };
    drop(cluster);
    result
}

async fn run_local(cluster: &mut LocalCluster, args: &LocalArgs) -> Result<()> {
    cluster.start_coordinators(args.coordinators)?;
    let kv = cluster.client()?;
    let plugin = args.plugin.path()?;
    cluster.start_workers(
        args.workers,
        &plugin.display().to_string(),
        args.devices_per_worker,
    )?;
    let job = format!("local-{}", std::process::id());
    for i in 0..args.workers {
        let a = JobAssignment {
            job: job.clone(),
            process_index: i,
            num_processes: args.workers,
            topology_timeout_ms: args.timeout_ms,
        };
        jobs::assign(&kv, &format!("w{i}"), &a).await?;
    }
    let wait = Duration::from_millis(args.timeout_ms) + Duration::from_secs(5);
    let topology = tokio::select! {
        t = read_topology(&kv, &job, wait) => t?,
        f = jobs::wait_for_failure(&kv, &job, wait) => match f? {
            Some(f) => bail!("job `{job}` failed: {f}"),
            None => bail!("job `{job}`: no topology within {wait:?}"),
        },
    };
    // Every process holds the same topology (the digests it published).
    let want = tessel_topology::digest(&topology);
    for i in 0..args.workers {
        let key = keys::process_topology(&job, i);
        let got = kv.get(key.as_bytes(), wait).await?;
        if got != want.as_bytes() {
            bail!("process {i} holds a different topology");
        }
    }
    println!("{}", serde_json::to_string_pretty(&topology)?);
    jobs::finish_job(&kv, &job).await?;
    if args.keep_running {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        eprintln!(
            "cluster up: --coordinator {} --tls-dir {} (job `{job}`); Ctrl-C stops it",
            cluster
                .addrs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            cluster.tls_dir().display()
        );
        std::future::pending::<()>().await;
    }
    Ok(())
}
