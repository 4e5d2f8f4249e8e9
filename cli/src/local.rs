//! `tessel local`: coordinators and workers as processes on this machine,
//! for a job spec or to print a topology.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use futures::StreamExt;
use tessel::client::{Client, JobUpdate};
use tessel::job::ValidatedJob;
use tessel::pjrt::locate;
use tessel_coordinator::attempt::Record;
use tessel_coordinator::jobs::{self, JobAssignment};
use tessel_coordinator::scheduler::JobState;
use tessel_coordinator::{Item, Records};
use tessel_harness::LocalCluster;

use crate::args::PluginArg;
use crate::coordinator::wait_for_signal;
use crate::registry::read_topology;

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
                    run_command_local(&mut cluster, args.coordinators, job).await
                }
                Some(job) => run_on_local(&mut cluster, &args, job).await,
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
            attempt: job.clone(),
            process_index: i,
            num_processes: args.workers,
            topology_timeout_ms: args.timeout_ms,
            trace: None,
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
        let got = Records::new(&kv, &job)
            .wait(Item::Process(i, Record::Topology), wait)
            .await?;
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

/// `tessel local JOB.toml`: a fresh cluster with one worker per process;
/// the job goes through the scheduler like any other.
async fn run_on_local(
    cluster: &mut LocalCluster,
    args: &LocalArgs,
    job: &ValidatedJob,
) -> Result<()> {
    // `--plugin` stands in for the spec's plugin, so the workers started
    // with it match the job.
    let mut job = job.clone();
    if let Some(p) = &args.plugin.plugin {
        job.spec.plugin = p.clone();
        job.text = toml::to_string(&job.spec).context("encoding the spec")?;
    }
    let job = &job;
    let s = &job.spec;
    let plugin = locate::resolve(Some(&s.plugin))?;
    cluster.start_coordinators(args.coordinators)?;
    let kv = cluster.client()?;
    if let Some(c) = &s.checkpoint {
        cluster.checkpoint_roots = vec![c.dir.clone()];
    }
    cluster.start_workers(s.processes, &s.plugin, s.devices_per_process as usize)?;
    eprintln!(
        "{} processes × {} devices ({}), mesh {}, {} steps",
        s.processes,
        s.devices_per_process,
        plugin.display(),
        s.mesh,
        s.steps
    );
    let client = Client::from_store(std::sync::Arc::new(kv));
    let (id, results) = crate::jobs::run_scheduled(&client, job, true).await?;
    crate::jobs::summarize(job, &results);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for name in tessel::plan::written_arrays(&job.spec) {
            let a = client.fetch(&id, &name).await?;
            let path = dir.join(format!("{name}.npy"));
            std::fs::write(&path, tessel::array::write_npy(&a))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        println!("final arrays written to {}", dir.display());
    }
    Ok(())
}

/// `tessel local JOB.toml` for a command job: one worker per placement,
/// the job's output on stdout, its state changes on stderr; an error
/// unless it succeeded.
async fn run_command_local(
    cluster: &mut LocalCluster,
    coordinators: u64,
    job: &ValidatedJob,
) -> Result<()> {
    let s = &job.spec;
    cluster.start_coordinators(coordinators)?;
    let kv = cluster.client()?;
    if let Some(c) = &s.checkpoint {
        cluster.checkpoint_roots = vec![c.dir.clone()];
    }
    cluster.start_workers(
        s.placements(),
        &s.plugin,
        s.devices_per_placement() as usize,
    )?;
    eprintln!(
        "{} processes ({} per worker) of `{}`",
        s.processes,
        s.processes_per_worker,
        s.command.join(" ")
    );
    let client = Client::from_store(std::sync::Arc::new(kv));
    let id = client.submit(job).await?;
    let states = async {
        let mut updates = client.events(&id).await?;
        while let Some(u) = updates.next().await {
            if let JobUpdate::State(e) = u? {
                eprintln!("{}", crate::jobs::state_line(&id, &e));
            }
        }
        anyhow::Ok(())
    };
    let (a, b) = tokio::join!(
        states,
        crate::logs::print_logs(&client, &id, None, None, true)
    );
    a?;
    b?;
    let rec = client.wait(&id).await?;
    if rec.state != JobState::Succeeded {
        bail!(
            "job `{id}` ended {}: {}",
            rec.state,
            rec.reason.unwrap_or_else(|| "no reason recorded".into())
        );
    }
    Ok(())
}
