//! `tessel-bench job`: a job spec (by default the MLP demo) on a fresh local
//! cluster, its step time, where it goes and the bytes a step copies
//! between host and device; with `--jax PYTHON`, the same model, data
//! layout and global batch in JAX in the same run: over gloo, one process
//! per tessel process, or for a one-process global program, one jitted
//! step over the same devices.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;
use tessel::pjrt::locate;

use tessel_harness::LocalCluster;

/// `tessel-bench job`: a training job end to end, tessel against JAX.
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
    /// Copy every program's outputs to the host and back each step (how
    /// plans ran before arrays stayed on their devices): the baseline for
    /// the device-resident figure.
    #[arg(long)]
    pub host_staged: bool,
    /// A create option of the workers' plugin clients (`tessel worker
    /// --plugin-option`); repeat for several.
    #[arg(long = "plugin-option", value_name = "NAME=VALUE")]
    pub plugin_option: Vec<String>,
    /// Trace export of the cluster's processes, each mode a run per
    /// repeat, interleaved: `off` (no endpoint), `receiver` (an OTLP
    /// receiver in this process), `unreachable` (an endpoint where nothing
    /// listens).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub tracing: Vec<TraceMode>,
}

/// Where the cluster's spans go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceMode {
    /// No OTLP endpoint set.
    Off,
    /// An OTLP receiver in this process.
    Receiver,
    /// An endpoint where nothing listens.
    Unreachable,
}

const JAX_MLP: &str = include_str!("../jax/mlp.py");
const JAX_MLP_GLOBAL: &str = include_str!("../jax/mlp_global.py");

/// Runs the benchmark and prints its table.
pub async fn run(args: BenchJobArgs) -> Result<()> {
    let mut job = tessel::job::JobSpec::load(&args.spec)?;
    job.spec.steps = args.steps;
    let job = job.spec.validate(&job.files)?;
    let s = &job.spec;
    let global = s.programs.values().any(|p| p.global);
    let plugin = locate::resolve(Some(&s.plugin))?;
    let mut tessel_ms = Vec::new();
    let modes = if args.tracing.is_empty() {
        vec![None]
    } else {
        args.tracing.iter().copied().map(Some).collect()
    };
    let receiver = tessel_trace::receiver::Receiver::start().await?;
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    for (_, mode) in (0..args.repeat).flat_map(|r| modes.iter().map(move |m| (r, *m))) {
        // The cluster's processes inherit it.
        match mode {
            None | Some(TraceMode::Off) => std::env::remove_var("OTEL_EXPORTER_OTLP_ENDPOINT"),
            Some(TraceMode::Receiver) => {
                std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
            }
            Some(TraceMode::Unreachable) => {
                std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{closed}"))
            }
        }
        let received_before = receiver.spans().len();
        let mut cluster = LocalCluster::new(crate::tessel_bin()?)?;
        cluster.worker_args = args
            .plugin_option
            .iter()
            .flat_map(|o| ["--plugin-option".to_owned(), o.clone()])
            .collect();
        if args.host_staged {
            // The workers inherit it.
            std::env::set_var(tessel::plan::HOST_STAGED_ENV, "1");
        }
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
        let spans = receiver.spans().len() - received_before;
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
            json!({"figure": "job_step", "system": if args.host_staged { "tessel-host-staged" } else { "tessel" }, "spec": s.name,
                   "tracing": mode.map(|m| format!("{m:?}").to_lowercase()), "spans_received": spans,
                   "processes": s.processes, "devices_per_process": s.devices_per_process,
                   "steps": t.steps, "step_ms": (step_ms * 1000.0).round() / 1000.0,
                   "steps_per_s": (1e3 / step_ms).round(),
                   "share": {"compute": share(t.compute_s), "collectives": share(t.collective_s),
                             "coordination": share(t.coordination_s),
                             "other": share(t.loop_s - t.compute_s - t.collective_s - t.coordination_s)},
                   "compile_s": (t.compile_s * 1000.0).round() / 1000.0,
                   "host_device_bytes": {"first_step": t.first_step_bytes,
                                         "later_step_max": t.later_step_bytes_max,
                                         "total": t.to_device_bytes + t.to_host_bytes},
                   "final": last})
        );
        tessel_ms.push(step_ms);
    }
    let Some(python) = &args.jax else {
        return Ok(());
    };
    let (script, processes, system) = match (global, s.processes, s.devices_per_process) {
        (true, 1, n) => (JAX_MLP_GLOBAL, 1, format!("jax-jit-{n}-devices")),
        (false, n, 1) => (JAX_MLP, n, "jax-gloo".to_owned()),
        _ => bail!(
            "the JAX peers run one device per process (gloo) or one process's devices (a global \
             program); this spec is {} × {}",
            s.processes,
            s.devices_per_process
        ),
    };
    let data = std::path::absolute(args.spec.parent().unwrap_or(std::path::Path::new(".")))?;
    let mut jax_ms = Vec::new();
    for _ in 0..args.repeat {
        let out = crate::jax::run_group(
            python,
            script,
            processes,
            &[
                data.display().to_string(),
                args.steps.to_string(),
                "20".into(),
                s.devices_per_process.to_string(),
            ],
        )?;
        let step_ms = out
            .iter()
            .filter_map(|v| v["step_ms"].as_f64())
            .fold(0.0, f64::max);
        println!(
            "{}",
            json!({"figure": "job_step", "system": system, "processes": s.processes,
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
