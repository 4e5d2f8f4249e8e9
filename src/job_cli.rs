//! Running a job spec on a cluster and following it: the bundle goes to
//! `jobs/{job}/spec`, every worker gets an assignment, reports are printed
//! as they arrive, and the job ends when every process has published its
//! result (or with the job's failure event).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use tessel::job::ValidatedJob;
use tessel::pjrt::locate;
use tessel::plan::{JobBundle, ProcessResult, StepReport};
use tessel_coordinator::jobs::{self, JobAssignment};
use tessel_coordinator::keys;
use tessel_kvstore::{Event, KvStore};

use crate::node_cli::{LocalArgs, LocalCluster};

/// `tessel local JOB.toml`: a fresh cluster with one worker per process.
pub async fn run_on_local(
    cluster: &mut LocalCluster,
    args: &LocalArgs,
    job: &ValidatedJob,
) -> Result<()> {
    let s = &job.spec;
    let plugin = locate::resolve(Some(args.plugin.as_deref().unwrap_or(&s.plugin)))?;
    cluster.start_coordinators(args.coordinators)?;
    let kv = cluster.client()?;
    cluster.start_workers(s.processes, &plugin, s.devices_per_process as usize)?;
    let out = match &args.out {
        Some(d) => Some(std::path::absolute(d).context("resolving --out")?),
        None => None,
    };
    let id = format!("{}-{}", s.name, std::process::id());
    let workers: Vec<String> = (0..s.processes).map(|i| format!("w{i}")).collect();
    eprintln!(
        "job `{id}`: {} processes × {} devices ({}), mesh {}, {} steps",
        s.processes,
        s.devices_per_process,
        plugin.display(),
        s.mesh,
        s.steps
    );
    let results = submit_and_follow(&kv, &id, job, out, &workers, args.timeout_ms, true).await?;
    summarize(job, &results);
    if let Some(d) = &args.out {
        println!("final arrays written to {}", d.display());
    }
    jobs::finish_job(&kv, &id).await?;
    Ok(())
}

/// Puts the bundle, assigns process `i` to `workers[i]`, prints reports
/// and returns every process's result.
pub async fn submit_and_follow(
    kv: &dyn KvStore,
    id: &str,
    job: &ValidatedJob,
    out: Option<std::path::PathBuf>,
    workers: &[String],
    topology_timeout_ms: u64,
    print_reports: bool,
) -> Result<Vec<ProcessResult>> {
    let bundle = JobBundle::new(id, job, &job.base, out).encode();
    if bundle.len() > tessel::plan::MAX_BUNDLE {
        bail!(
            "the job with its files is {} bytes; at most {} travel with a job",
            bundle.len(),
            tessel::plan::MAX_BUNDLE
        );
    }
    kv.put(keys::job_spec(id).as_bytes(), &bundle)
        .await
        .context("storing the job's spec")?;
    let rev = kv.revision().await?;
    let mut reports = kv.watch(keys::job_reports(id).as_bytes(), rev + 1).await?;
    let n = job.spec.processes;
    for (i, w) in workers.iter().enumerate() {
        let a = JobAssignment {
            job: id.to_owned(),
            process_index: i as u32,
            num_processes: n,
            topology_timeout_ms,
        };
        jobs::assign(kv, w, &a).await?;
    }
    let started = Instant::now();
    let results = async {
        let mut out = Vec::new();
        for i in 0..n {
            let key = keys::process_result(id, i);
            let bytes = loop {
                match kv.get(key.as_bytes(), Duration::from_secs(3600)).await {
                    Ok(b) => break b,
                    Err(tessel_kvstore::KvError::DeadlineExceeded { .. }) => continue,
                    Err(e) => return Err(anyhow::Error::from(e)),
                }
            };
            out.push(serde_json::from_slice::<ProcessResult>(&bytes)?);
        }
        Ok(out)
    };
    let failure = async {
        loop {
            if let Some(f) = jobs::wait_for_failure(kv, id, Duration::from_secs(3600)).await? {
                return anyhow::Ok(f);
            }
        }
    };
    tokio::pin!(results, failure);
    let mut last: Option<(u64, Instant)> = None;
    loop {
        tokio::select! {
            ev = reports.next() => {
                let Some(ev) = ev else { bail!("the report watch ended") };
                if let (true, Event::Put(pair)) = (print_reports, ev?) {
                    if let Ok(r) = serde_json::from_slice::<StepReport>(&pair.value) {
                        let now = Instant::now();
                        let rate = match last {
                            Some((step, t)) if r.step > step => {
                                (r.step - step) as f64 / now.duration_since(t).as_secs_f64()
                            }
                            _ => (r.step + 1) as f64 / started.elapsed().as_secs_f64(),
                        };
                        last = Some((r.step, now));
                        println!("step {:>6}  {}  ({rate:.0} steps/s)", r.step + 1, format_values(&r));
                    }
                }
            }
            r = &mut results => return r,
            f = &mut failure => bail!("job `{id}` failed: {}", f?),
        }
    }
}

fn format_values(r: &StepReport) -> String {
    r.values
        .iter()
        .map(|(k, v)| format!("{k} {v:.6}"))
        .collect::<Vec<_>>()
        .join("  ")
}

/// Prints the final report and where the step time went.
fn summarize(job: &ValidatedJob, results: &[ProcessResult]) {
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
    }
}

/// `tessel submit SPEC [--wait]`.
#[derive(clap::Args)]
pub struct SubmitArgs {
    /// The job spec (TOML).
    pub spec: std::path::PathBuf,
    #[command(flatten)]
    pub target: crate::cluster_cli::KvTargetArgs,
    /// Follow the job with a progress bar until it ends; the exit code is
    /// 0 only if it succeeded.
    #[arg(long)]
    pub wait: bool,
}

/// `tessel jobs`, `tessel job ID`, `tessel cancel ID`.
#[derive(clap::Args)]
pub struct JobIdArgs {
    pub id: Option<String>,
    #[command(flatten)]
    pub target: crate::cluster_cli::KvTargetArgs,
}

/// `tessel fetch ID ARRAY --out FILE.npy`.
#[derive(clap::Args)]
pub struct FetchArgs {
    pub id: String,
    pub array: String,
    #[arg(long, value_name = "FILE.npy")]
    pub out: std::path::PathBuf,
    #[command(flatten)]
    pub target: crate::cluster_cli::KvTargetArgs,
}

async fn client(target: &crate::cluster_cli::KvTargetArgs) -> Result<tessel::client::Client> {
    let kv: std::sync::Arc<dyn KvStore> = std::sync::Arc::from(target.connect().await?);
    Ok(tessel::client::Client::from_store(kv))
}

pub async fn submit(args: SubmitArgs) -> Result<()> {
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
async fn follow(client: &tessel::client::Client, id: &str, steps: u64) -> Result<()> {
    use tessel::client::JobUpdate;
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
            JobUpdate::State(e) => {
                let why = e.reason.map(|r| format!(": {r}")).unwrap_or_default();
                say(format!(
                    "{id}: {} → {} (attempt {}){why}",
                    e.from, e.to, e.attempt
                ));
            }
            JobUpdate::Report(r) => {
                bar.set_position(r.step + 1);
                bar.set_message(format_values(&r));
            }
        }
    }
    bar.finish();
    let rec = client.wait(id).await?;
    match rec.state {
        tessel_coordinator::scheduler::JobState::Succeeded => Ok(()),
        s => bail!(
            "job `{id}` ended {s}: {}",
            rec.reason.unwrap_or_else(|| "no reason recorded".into())
        ),
    }
}

pub async fn jobs(args: JobIdArgs) -> Result<()> {
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

pub async fn job(args: JobIdArgs) -> Result<()> {
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
    let reports = client
        .store()
        .list(keys::job_reports(&id).as_bytes())
        .await?;
    for pair in reports.iter().rev().take(5).rev() {
        if let Ok(r) = serde_json::from_slice::<StepReport>(&pair.value) {
            println!("  step {:>8}  {}", r.step + 1, format_values(&r));
        }
    }
    Ok(())
}

pub async fn cancel(args: JobIdArgs) -> Result<()> {
    let id = args.id.context("give a job id")?;
    client(&args.target).await?.cancel(&id).await?;
    println!("cancellation of {id} requested");
    Ok(())
}

pub async fn fetch(args: FetchArgs) -> Result<()> {
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
