//! The job commands: `submit`, `jobs`, `job`, `cancel` and `fetch`, all
//! through the scheduler ([`tessel::client::Client`]); `tessel local`
//! follows its job with [`run_scheduled`].

use std::time::Instant;

use anyhow::{Context, Result};
use futures::StreamExt;
use serde::Serialize;
use tessel::client::{Client, JobUpdate};
use tessel::job::ValidatedJob;
use tessel::plan::{ProcessResult, StepReport};
use tessel_coordinator::scheduler::{JobRecord, JobState};
use tessel_kv::KvStore;

use crate::exit::{self, Exit};
use crate::output::{print_document, print_table, OutputArgs};

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
    outcome(&id, &client.wait(&id).await?)?;
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

/// `tessel submit SPEC [--wait [--timeout D]]`.
#[derive(clap::Args)]
pub(crate) struct SubmitArgs {
    /// The job spec (TOML).
    pub spec: std::path::PathBuf,
    #[command(flatten)]
    pub target: crate::args::KvTargetArgs,
    /// Follow the job until it ends (a progress bar; a command job's
    /// output, each line prefixed with its process) and exit with its
    /// outcome: 0 succeeded, 5 failed, 6 cancelled (docs/operations.md).
    #[arg(long)]
    pub wait: bool,
    /// With `--wait`: stop waiting after this long (`90s`, `15m`, `2h`)
    /// and exit 7; the job runs on.
    #[arg(long, value_name = "DURATION", requires = "wait", value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
}

/// `90`, `90s`, `15m`, `2h`.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (n, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = n
        .parse()
        .map_err(|_| format!("`{s}` is not a duration such as 90s, 15m or 2h"))?;
    let scale = match unit {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("`{s}`: the unit must be ms, s, m or h")),
    };
    std::time::Duration::try_from_secs_f64(n * scale).map_err(|e| format!("`{s}`: {e}"))
}

/// `tessel jobs`.
#[derive(clap::Args)]
pub(crate) struct JobsArgs {
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub target: crate::args::KvTargetArgs,
}

/// `tessel job ID`, `tessel cancel ID`.
#[derive(clap::Args)]
pub(crate) struct JobIdArgs {
    /// The job's id (`NAME.N`, as `tessel submit` printed it).
    pub id: String,
    #[command(flatten)]
    pub target: crate::args::KvTargetArgs,
}

/// `tessel job ID [-o json]`.
#[derive(clap::Args)]
pub(crate) struct JobArgs {
    #[command(flatten)]
    pub job: JobIdArgs,
    #[command(flatten)]
    pub output: OutputArgs,
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
    if !args.wait {
        return Ok(());
    }
    let follow = follow(&client, &id, &job);
    let end = match args.timeout {
        None => follow.await?,
        Some(t) => match tokio::time::timeout(t, follow).await {
            Ok(end) => end?,
            Err(_) => {
                return Err(Exit::new(
                    exit::TIMEOUT,
                    format!("job `{id}` did not end within {t:?}; it runs on (`tessel cancel {id}` stops it)"),
                )
                .into())
            }
        },
    };
    outcome(&id, &end)
}

/// The exit a job's end calls for: 0 when it succeeded, else the code of
/// its end (docs/operations.md).
fn outcome(id: &str, end: &JobRecord) -> Result<()> {
    let why = || {
        end.reason
            .clone()
            .unwrap_or_else(|| "no reason recorded".into())
    };
    match end.state {
        JobState::Succeeded => Ok(()),
        JobState::Cancelled => {
            Err(Exit::new(exit::JOB_CANCELLED, format!("job `{id}` was cancelled")).into())
        }
        _ => Err(Exit::new(exit::JOB_FAILED, format!("job `{id}` failed: {}", why())).into()),
    }
}

/// Follows the job until it ends; its final record. State changes go to
/// stderr; a plan job's reports drive a progress bar, a command job's
/// output goes to stdout, each line prefixed with its process.
async fn follow(client: &Client, id: &str, job: &ValidatedJob) -> Result<JobRecord> {
    if job.spec.is_command() {
        let states = async {
            let mut updates = client.events(id).await?;
            while let Some(u) = updates.next().await {
                if let JobUpdate::State(e) = u? {
                    eprintln!("{}", state_line(id, &e));
                }
            }
            anyhow::Ok(())
        };
        let (s, l) = tokio::join!(
            states,
            crate::logs::print_logs(client, id, None, None, true)
        );
        s.and(l)?;
        return Ok(client.wait(id).await?);
    }
    let bar = indicatif::ProgressBar::new(job.spec.steps);
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
    Ok(client.wait(id).await?)
}

/// A job as `-o json` shows it (docs/schemas/job-list.json, job.json).
#[derive(Serialize)]
struct JobView<'a> {
    id: &'a str,
    name: &'a str,
    state: JobState,
    processes: u32,
    devices_per_process: u32,
    plugin: &'a str,
    attempt: u32,
    restarts: u32,
    max_restarts: u32,
    suspensions: u32,
    placement: &'a [String],
    reason: Option<&'a str>,
    submitted_unix_ms: u64,
    updated_unix_ms: u64,
}

impl<'a> From<&'a JobRecord> for JobView<'a> {
    fn from(j: &'a JobRecord) -> JobView<'a> {
        JobView {
            id: &j.id,
            name: &j.name,
            state: j.state,
            processes: j.processes,
            devices_per_process: j.devices_per_process,
            plugin: &j.plugin,
            attempt: j.attempt,
            restarts: j.restarts,
            max_restarts: j.max_restarts,
            suspensions: j.suspensions,
            placement: &j.placement,
            reason: j.reason.as_deref(),
            submitted_unix_ms: j.submitted_unix_ms,
            updated_unix_ms: j.updated_unix_ms,
        }
    }
}

pub(crate) async fn jobs(args: JobsArgs) -> Result<()> {
    let client = client(&args.target).await?;
    let list = client.list().await?;
    if args.output.json() {
        let jobs: Vec<JobView> = list.iter().map(JobView::from).collect();
        return print_document("JobList", &serde_json::json!({ "jobs": jobs }));
    }
    let mut header = vec![
        "ID",
        "STATE",
        "PROCESSES",
        "ATTEMPT",
        "RESTARTS",
        "WORKERS",
        "REASON",
    ];
    if args.output.wide() {
        header.splice(5..5, ["MOVES", "PLUGIN", "AGE"]);
    }
    let now = tessel_coordinator::unix_ms();
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|j| {
            let mut row = vec![
                j.id.clone(),
                j.state.name().into(),
                format!("{}×{}", j.processes, j.devices_per_process),
                j.attempt.to_string(),
                format!("{}/{}", j.restarts, j.max_restarts),
                j.placement.join(","),
                j.reason.clone().unwrap_or_default(),
            ];
            if args.output.wide() {
                let age = now.saturating_sub(j.submitted_unix_ms) / 1000;
                row.splice(
                    5..5,
                    [
                        j.suspensions.to_string(),
                        j.plugin.clone(),
                        format!("{age}s"),
                    ],
                );
            }
            row
        })
        .collect();
    print_table(&header, &rows);
    Ok(())
}

/// Whether the current attempt's transfers are encrypted, once its
/// processes built their topology (they all agree: `types` invariant 5, the topology builder).
async fn transfer_encryption(kv: &dyn KvStore, j: &JobRecord) -> Option<&'static str> {
    if j.attempt == 0 {
        return None;
    }
    let t = tessel_topology::exchange::global(kv, &j.instance(), std::time::Duration::ZERO)
        .await
        .ok()?;
    Some(if t.transfer_encrypted() { "on" } else { "off" })
}

pub(crate) async fn job(args: JobArgs) -> Result<()> {
    let id = &args.job.id;
    let kv: std::sync::Arc<dyn KvStore> = std::sync::Arc::from(args.job.target.connect().await?);
    let client = Client::from_store(kv.clone());
    let j = client.job(id).await?;
    let attempts = client.attempts(id).await?;
    let reports = client.reports(id).await?;
    let last = &reports[reports.len().saturating_sub(5)..];
    let encryption = transfer_encryption(&*kv, &j).await;
    if args.output.json() {
        let attempts: Vec<serde_json::Value> = attempts
            .iter()
            .map(|a| {
                serde_json::json!({
                    "attempt": a.attempt,
                    "placed_unix_ms": a.placed_unix_ms,
                    "ended_unix_ms": a.ended_unix_ms,
                    "end": a.end,
                    "cause": a.cause.map(|c| c.name()),
                    "reason": a.reason,
                })
            })
            .collect();
        let reports: Vec<serde_json::Value> = last
            .iter()
            .map(|r| serde_json::json!({ "step": r.step + 1, "values": r.values, "unix_ms": r.unix_ms }))
            .collect();
        return print_document(
            "Job",
            &serde_json::json!({
                "job": JobView::from(&j),
                "transfer_encryption": encryption,
                "attempts": attempts,
                "reports": reports,
            }),
        );
    }
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
        "  attempt    {} (restarts {}/{}, planned moves {})",
        j.attempt, j.restarts, j.max_restarts, j.suspensions
    );
    match encryption {
        Some("off") => println!("  transfers  unencrypted (plain TCP, set up over mutual TLS)"),
        Some(_) => println!("  transfers  encrypted (AES-128-GCM over TCP, keyed by mutual TLS)"),
        None => {}
    }
    for (i, w) in j.placement.iter().enumerate() {
        println!("  process {i:<3} on worker {w}");
    }
    for a in &attempts {
        let end = match (a.end, a.cause) {
            (None, _) => "running".to_owned(),
            (Some(_), Some(c)) if c.is_planned() => "moved (planned, not a failure)".to_owned(),
            (Some(e), Some(c)) => format!("{e} ({})", c.name()),
            (Some(e), None) => e.to_string(),
        };
        let why = a
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        println!("  attempt {:<3} {end}{why}", a.attempt);
    }
    for r in last {
        println!("  step {:>8}  {}", r.step + 1, format_values(r));
    }
    Ok(())
}

pub(crate) async fn cancel(args: JobIdArgs) -> Result<()> {
    let id = args.id;
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
