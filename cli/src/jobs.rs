//! The job commands: `submit`, `jobs`, `job`, `cancel` and `fetch`, all
//! through the scheduler ([`tessel::client::Client`]); `tessel local`
//! follows its job with [`run_scheduled`].

use std::time::Instant;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use tessel::client::{Client, JobUpdate};
use tessel::job::ValidatedJob;
use tessel::plan::{ProcessResult, StepReport};
use tessel_coordinator::scheduler::JobState;
use tessel_kv::KvStore;

/// Submits `job` to the scheduler, follows it (printing state changes and
/// reports when `print`), and returns its id and every process's result;
/// an error if it did not succeed.
pub(crate) async fn run_scheduled(
    client: &Client,
    job: &ValidatedJob,
    print: bool,
) -> Result<(String, Vec<ProcessResult>)> {
    let id = client.submit(job).await?;
    let started = Instant::now();
    let mut last: Option<(u64, Instant)> = None;
    let mut updates = client.events(&id).await?;
    while let Some(u) = updates.next().await {
        match u? {
            JobUpdate::State(e) if print => eprintln!("{}", state_line(&id, &e)),
            JobUpdate::Report(r) if print => {
                let now = Instant::now();
                let rate = match last {
                    Some((step, t)) if r.step > step => {
                        (r.step - step) as f64 / now.duration_since(t).as_secs_f64()
                    }
                    _ => (r.step + 1) as f64 / started.elapsed().as_secs_f64(),
                };
                last = Some((r.step, now));
                println!(
                    "step {:>6}  {}  ({rate:.0} steps/s)",
                    r.step + 1,
                    format_values(&r)
                );
            }
            _ => {}
        }
    }
    succeeded(client, &id).await?;
    let results = client.results(&id).await?;
    Ok((id, results))
}

pub(crate) fn state_line(id: &str, e: &tessel_coordinator::scheduler::JobEvent) -> String {
    let why = e
        .reason
        .as_ref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    format!(
        "job `{id}`: {} → {} (attempt {}){why}",
        e.from, e.to, e.attempt
    )
}

/// The job's final record once it ended; an error unless it succeeded.
async fn succeeded(client: &Client, id: &str) -> Result<tessel_coordinator::scheduler::JobRecord> {
    let rec = client.wait(id).await?;
    if rec.state != JobState::Succeeded {
        bail!(
            "job `{id}` ended {}: {}",
            rec.state,
            rec.reason.unwrap_or_else(|| "no reason recorded".into())
        );
    }
    Ok(rec)
}

fn format_values(r: &StepReport) -> String {
    r.values
        .iter()
        .map(|(k, v)| format!("{k} {v:.6}"))
        .collect::<Vec<_>>()
        .join("  ")
}

/// Prints the final report and where the step time went.
pub(crate) fn summarize(job: &ValidatedJob, results: &[ProcessResult]) {
    let Some(first) = results.first() else { return };
    let t = &first.timings;
    println!(
        "job `{}` succeeded: {} steps in {:.2} s ({:.1} steps/s, {:.3} ms per step; compile {:.2} s, init {:.3} s)",
        job.spec.name,
        t.steps,
        t.run_s,
        t.steps as f64 / t.loop_s.max(1e-9),
        1e3 * t.loop_s / t.steps.max(1) as f64,
        t.compile_s,
        t.init_s
    );
    if let Some(r) = &first.last_report {
        println!("final: {}", format_values(r));
    }
    for r in results {
        let t = &r.timings;
        let steps = t.steps.max(1) as f64;
        let share = |x: f64| 100.0 * x / t.loop_s.max(1e-9);
        println!(
            "  process {}: per step {:.3} ms compute ({:.0}%), {:.3} ms collectives ({:.0}%), {:.3} ms coordination ({:.0}%)",
            r.process,
            1e3 * t.compute_s / steps,
            share(t.compute_s),
            1e3 * t.collective_s / steps,
            share(t.collective_s),
            1e3 * t.coordination_s / steps,
            share(t.coordination_s),
        );
        println!(
            "             host↔device {} in the first step, then at most {} a step ({} in all)",
            bytes(t.first_step_bytes),
            bytes(t.later_step_bytes_max),
            bytes(t.to_device_bytes + t.to_host_bytes),
        );
    }
}

/// `n` bytes for people.
fn bytes(n: u64) -> String {
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{:.1} KiB", n as f64 / 1024.0),
        _ => format!("{:.1} MiB", n as f64 / 1_048_576.0),
    }
}

/// `tessel submit SPEC [--wait]`.
#[derive(clap::Args)]
pub(crate) struct SubmitArgs {
    /// The job spec (TOML).
    pub spec: std::path::PathBuf,
    #[command(flatten)]
    pub target: crate::args::KvTargetArgs,
    /// Follow the job with a progress bar until it ends; the exit code is
    /// 0 only if it succeeded.
    #[arg(long)]
    pub wait: bool,
}

/// `tessel jobs`, `tessel job ID`, `tessel cancel ID`.
#[derive(clap::Args)]
pub(crate) struct JobIdArgs {
    pub id: Option<String>,
    #[command(flatten)]
    pub target: crate::args::KvTargetArgs,
}

/// `tessel fetch ID ARRAY --out FILE.npy`.
#[derive(clap::Args)]
pub(crate) struct FetchArgs {
    pub id: String,
    pub array: String,
    #[arg(long, value_name = "FILE.npy")]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub target: crate::args::KvTargetArgs,
}

pub(crate) async fn client(target: &crate::args::KvTargetArgs) -> Result<Client> {
    let kv: std::sync::Arc<dyn KvStore> = std::sync::Arc::from(target.connect().await?);
    Ok(Client::from_store(kv))
}

pub(crate) async fn submit(args: SubmitArgs) -> Result<()> {
    let job = tessel::job::JobSpec::load(&args.spec)?;
    let client = client(&args.target).await?;
    let id = client.submit(&job).await?;
    println!("{id}");
    if args.wait {
        follow(&client, &id, job.spec.steps).await?;
    }
    Ok(())
}

/// Progress bar over the job's reports; state changes above it.
async fn follow(client: &Client, id: &str, steps: u64) -> Result<()> {
    let bar = indicatif::ProgressBar::new(steps);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:32} [{bar:30}] {pos}/{len} steps  {per_sec}  ETA {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let say = |line: String| {
        if bar.is_hidden() {
            eprintln!("{line}");
        } else {
            bar.println(line);
        }
    };
    let mut updates = client.events(id).await?;
    while let Some(u) = updates.next().await {
        match u? {
            JobUpdate::State(e) => say(state_line(id, &e)),
            JobUpdate::Report(r) => {
                bar.set_position(r.step + 1);
                bar.set_message(format_values(&r));
            }
        }
    }
    bar.finish();
    succeeded(client, id).await.map(drop)
}

pub(crate) async fn jobs(args: JobIdArgs) -> Result<()> {
    let client = client(&args.target).await?;
    println!(
        "{:<24} {:<10} {:>9} {:>7} {:>8}  {:<24} REASON",
        "ID", "STATE", "PROCESSES", "ATTEMPT", "RESTARTS", "WORKERS"
    );
    for j in client.list().await? {
        println!(
            "{:<24} {:<10} {:>9} {:>7} {:>8}  {:<24} {}",
            j.id,
            j.state.name(),
            format!("{}×{}", j.processes, j.devices_per_process),
            j.attempt,
            format!("{}/{}", j.restarts, j.max_restarts),
            j.placement.join(","),
            j.reason.unwrap_or_default()
        );
    }
    Ok(())
}

pub(crate) async fn job(args: JobIdArgs) -> Result<()> {
    let id = args.id.context("give a job id")?;
    let client = client(&args.target).await?;
    let j = client.job(&id).await?;
    println!("job {}  ({})", j.id, j.name);
    println!("  state      {}", j.state);
    if let Some(r) = &j.reason {
        println!("  reason     {r}");
    }
    println!(
        "  processes  {} × {} devices",
        j.processes, j.devices_per_process
    );
    println!(
        "  attempt    {} (restarts {}/{})",
        j.attempt, j.restarts, j.max_restarts
    );
    for (i, w) in j.placement.iter().enumerate() {
        println!("  process {i:<3} on worker {w}");
    }
    let reports = client.reports(&id).await?;
    for r in reports.iter().rev().take(5).rev() {
        println!("  step {:>8}  {}", r.step + 1, format_values(r));
    }
    Ok(())
}

pub(crate) async fn cancel(args: JobIdArgs) -> Result<()> {
    let id = args.id.context("give a job id")?;
    client(&args.target).await?.cancel(&id).await?;
    println!("cancellation of {id} requested");
    Ok(())
}

pub(crate) async fn fetch(args: FetchArgs) -> Result<()> {
    let a = client(&args.target)
        .await?
        .fetch(&args.id, &args.array)
        .await?;
    std::fs::write(&args.out, tessel::array::write_npy(&a))
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "{}: {}{:?} written to {}",
        args.array,
        a.element_type(),
        a.dims(),
        args.out.display()
    );
    Ok(())
}
