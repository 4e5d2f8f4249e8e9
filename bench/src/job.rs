//! `tessel bench job`: a job spec (by default the MLP demo) on a fresh local
//! cluster, its step time and where it goes; with `--jax PYTHON`, the same
//! model, data layout and global batch in JAX over gloo, in the same run.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use tessel::pjrt::locate;

use tessel::local::LocalCluster;

/// `tessel bench job`: a training job end to end, tessel against JAX.
#[derive(Args)]
pub struct BenchJobArgs {
    /// The job spec.
    #[arg(default_value = "examples/mlp-data-parallel/job.toml")]
    pub spec: PathBuf,
    /// Steps (overrides the spec's).
    #[arg(long, default_value_t = 2000)]
    pub steps: u64,
    /// Runs of each system (each figure is reported per run).
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Also run the MLP in JAX (CPU, gloo, one process per tessel process)
    /// with this Python, which must have `jax` installed.
    #[arg(long, value_name = "PYTHON")]
    pub jax: Option<PathBuf>,
}

const JAX_MLP: &str = include_str!("../jax/mlp.py");

/// Runs the benchmark and prints its table.
pub async fn run(args: BenchJobArgs) -> Result<()> {
    let mut job = tessel::job::JobSpec::load(&args.spec)?;
    job.spec.steps = args.steps;
    let job = job.spec.validate(&job.files)?;
    let s = &job.spec;
    let plugin = locate::resolve(Some(&s.plugin))?;
    let mut tessel_ms = Vec::new();
    for _ in 0..args.repeat {
        let mut cluster = LocalCluster::new(std::env::current_exe()?)?;
        cluster.start_coordinators(3)?;
        let kv = cluster.client()?;
        cluster.start_workers(
            s.processes,
            &plugin.display().to_string(),
            s.devices_per_process as usize,
        )?;
        let client = tessel::client::Client::from_store(std::sync::Arc::new(kv));
        let id = client.submit(&job).await?;
        let end = client.wait(&id).await?;
        anyhow::ensure!(
            end.state == tessel_coordinator::scheduler::JobState::Succeeded,
            "job `{id}` ended {}: {:?}",
            end.state,
            end.reason
        );
        let results = client.results(&id).await?;
        drop(cluster);
        // The slowest process sets the pace; shares are its own.
        let slowest = results
            .iter()
            .max_by(|a, b| a.timings.loop_s.total_cmp(&b.timings.loop_s))
            .expect("at least one process");
        let t = &slowest.timings;
        let step_ms = 1e3 * t.loop_s / t.steps as f64;
        let share = |x: f64| (1000.0 * x / t.loop_s).round() / 1000.0;
        let last = results[0].last_report.as_ref().map(|r| r.values.clone());
        println!(
            "{}",
            json!({"figure": "job_step", "system": "tessel", "spec": s.name,
                   "processes": s.processes, "devices_per_process": s.devices_per_process,
                   "steps": t.steps, "step_ms": (step_ms * 1000.0).round() / 1000.0,
                   "steps_per_s": (1e3 / step_ms).round(),
                   "share": {"compute": share(t.compute_s), "collectives": share(t.collective_s),
                             "coordination": share(t.coordination_s),
                             "other": share(t.loop_s - t.compute_s - t.collective_s - t.coordination_s)},
                   "compile_s": (t.compile_s * 1000.0).round() / 1000.0,
                   "final": last})
        );
        tessel_ms.push(step_ms);
    }
    let Some(python) = &args.jax else {
        return Ok(());
    };
    if s.devices_per_process != 1 {
        bail!("the JAX peer runs one device per process; use a spec with devices_per_process = 1");
    }
    let data = std::path::absolute(args.spec.parent().unwrap_or(std::path::Path::new(".")))?;
    let mut jax_ms = Vec::new();
    for _ in 0..args.repeat {
        let out = crate::jax::run_group(
            python,
            JAX_MLP,
            s.processes,
            &[
                data.display().to_string(),
                args.steps.to_string(),
                "20".into(),
            ],
        )?;
        let step_ms = out
            .iter()
            .filter_map(|v| v["step_ms"].as_f64())
            .fold(0.0, f64::max);
        println!(
            "{}",
            json!({"figure": "job_step", "system": "jax-gloo", "processes": s.processes,
                   "steps": args.steps, "step_ms": (step_ms * 1000.0).round() / 1000.0,
                   "steps_per_s": (1e3 / step_ms).round(),
                   "final": {"loss": out[0]["loss"], "accuracy": out[0]["accuracy"]}})
        );
        jax_ms.push(step_ms);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (t, j) = (median(&mut tessel_ms), median(&mut jax_ms));
    println!(
        "{}",
        json!({"figure": "job_step_ratio", "tessel_over_jax": (t / j * 1000.0).round() / 1000.0,
               "tessel_step_ms": t, "jax_step_ms": j})
    );
    Ok(())
}
