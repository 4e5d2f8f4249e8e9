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
