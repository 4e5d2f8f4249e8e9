//! The Rust API end to end, as a program of your own would use it:
//!
//! 1. start a local cluster (3 coordinators and 4 one-device workers, as
//!    processes of the `tessel` binary) with [`LocalCluster`];
//! 2. submit the data-parallel MLP (`examples/mlp-data-parallel/job.toml`)
//!    with [`Client::submit`] and follow its state changes and reports
//!    with [`Client::events`];
//! 3. fetch a parameter with [`Client::fetch`] and check it against the
//!    same training on one device (`reference.toml`), within 1e-4.
//!
//! `rust-submit [--steps N] [--tessel PATH]`: the `tessel` binary defaults
//! to the one beside this program (`cargo build --bin tessel`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use tessel::client::{Client, JobUpdate};
use tessel::job::JobSpec;
use tessel_harness::LocalCluster;

/// Where the example's job lives.
fn job_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mlp-data-parallel")
}

/// Submits the job at `spec` with `steps`, prints its state changes and
/// every 100th report, and returns the final `w1` as f64s.
async fn train(client: &Client, spec: &Path, steps: u64) -> Result<Vec<f64>> {
    let mut job = JobSpec::load(spec)?;
    // The bundle carries the spec's text: change both.
    job.spec.steps = steps;
    job.text = toml::to_string(&job.spec)?;
    let id = client.submit(&job).await?;
    let mut updates = client.events(&id).await?;
    while let Some(update) = updates.next().await {
        match update? {
            JobUpdate::State(e) => {
                println!("{id}: {} -> {}", e.from, e.to);
                if e.to.is_terminal() {
                    break;
                }
            }
            JobUpdate::Report(r) if (r.step + 1) % 100 == 0 => {
                println!("{id}: step {} {:?}", r.step + 1, r.values)
            }
            JobUpdate::Report(_) => {}
        }
    }
    let record = client.job(&id).await?;
    if record.state.to_string() != "Succeeded" {
        bail!("{id} ended {} ({:?})", record.state, record.reason);
    }
    let w1 = client.fetch(&id, "w1").await?;
    Ok(tessel::array::to_f64(&w1))
}

fn tessel_bin(args: &[String]) -> Result<PathBuf> {
    if let Some(i) = args.iter().position(|a| a == "--tessel") {
        return Ok(PathBuf::from(args.get(i + 1).context("--tessel PATH")?));
    }
    let me = std::env::current_exe()?;
    let bin = me.with_file_name("tessel");
    if !bin.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --bin tessel`, or pass --tessel PATH",
            bin.display()
        );
    }
    Ok(bin)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let steps = match args.iter().position(|a| a == "--steps") {
        Some(i) => args.get(i + 1).context("--steps N")?.parse()?,
        None => 1000,
    };
    let mut cluster = LocalCluster::new(tessel_bin(&args)?)?;
    cluster.start_coordinators(3)?;
    cluster.start_workers(4, "cpu", 1)?;
    let client = Client::from_store(Arc::new(cluster.client()?));

    let parallel = train(&client, &job_dir().join("job.toml"), steps).await?;
    let single = train(&client, &job_dir().join("reference.toml"), steps).await?;
    let worst = parallel
        .iter()
        .zip(&single)
        .map(|(a, b)| (a - b).abs())
        // A NaN is the worst of all, never skipped.
        .fold(0.0, |m: f64, d| if d.is_nan() || d > m { d } else { m });
    println!("w1: 4 processes vs one device after {steps} steps: max |a - b| = {worst:.2e}");
    if parallel.len() != single.len() || worst.is_nan() || worst > 1e-4 {
        bail!("the data-parallel w1 differs from one device's by {worst:e}");
    }
    println!("ok");
    Ok(())
}
