//! `tessel-bench steady`: a large job's steady state against a real
//! 3-replica coordinator on loopback: what the KV carries once N simulated
//! hosts know their topology and the job runs.
//!
//! The hosts bootstrap as in `bootstrap` (`bench/src/sim_host.rs`), then
//! keep beating and holding a worker's waits (drain, assignments, the
//! job's end and failure). Process 0 does what a plan's process 0 does in
//! the KV: a report a step through the real `tessel::report::Reporter`
//! (a background writer, never blocking the step), and every
//! `--checkpoint-every` steps the checkpoint commit (`checkpoint`
//! protocol, step 2): the real `CheckpointRecord` for N processes and
//! `--arrays` arrays on per-host disks (two holders a block), put, the
//! records listed, those beyond the newest 2 deleted. Meanwhile a client
//! on its own connection puts every 10 ms. At the end every process
//! publishes its `ProcessResult`.
//!
//! Reported: the leader's CPU and its apply rate (log entries and writes a
//! second, from its status), the probe's put p50/p99, the reports written
//! and dropped, each checkpoint commit's time and the record's size
//! (beside the size the form before version 2 had: a record over the KV's
//! 4 MiB value limit fails the checkpoint), and the time for all N
//! results. Left out: the steps' compute and the
//! collectives (host to host, not through the KV).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use tessel::checkpoint::{blocks_digest, retained, Blocks, CheckpointRecord, Holder};
use tessel::job::ShardingSpec;
use tessel::plan::{PlanTimings, ProcessResult, StepReport};
use tessel::report::Reporter;
use tessel_coordinator::attempt::{self, Record};
use tessel_coordinator::registry::LivenessConfig;
use tessel_coordinator::{jobs, Item, Records};
use tessel_harness::LocalCluster;
use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;
use tessel_topology::TopologyCache;

use crate::beats::Beats;
use crate::bootstrap::assign_all;
use crate::sim_host::{self, HOSTS_PER_CONNECTION};
use crate::simulated::{
    cpu_now, cpu_split, leader_index, on_own_runtime, percents_json, quantile_ms, KeepAlives,
};

/// `tessel-bench steady`: the KV's load while a large job runs.
#[derive(Args)]
pub struct BenchSteadyArgs {
    /// Simulated hosts (one process each).
    #[arg(long, default_value_t = 4096)]
    pub workers: u32,
    /// How long the job runs after its bootstrap, in seconds.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// A step every this many milliseconds (a report each).
    #[arg(long, default_value_t = 100)]
    pub step_ms: u64,
    /// A checkpoint every this many steps.
    #[arg(long, default_value_t = 50)]
    pub checkpoint_every: u64,
    /// Arrays in each checkpoint (a digest each per process).
    #[arg(long, default_value_t = 4)]
    pub arrays: usize,
    /// How the hosts' keep-alives travel.
    #[arg(long, value_enum, default_value_t)]
    pub keep_alives: KeepAlives,
}

/// Runs the benchmark and prints one JSON line.
pub async fn run(args: BenchSteadyArgs) -> Result<()> {
    let n = args.workers;
    if n < 2 || args.step_ms == 0 || args.checkpoint_every == 0 || args.arrays == 0 {
        bail!("--workers ≥ 2, and --step-ms, --checkpoint-every and --arrays > 0");
    }
    let mut cluster = LocalCluster::new(crate::tessel_bin()?)?;
    cluster.start_coordinators(3)?;
    let clients = (0..(n as usize).div_ceil(HOSTS_PER_CONNECTION).max(16))
        .map(|_| args.keep_alives.client(&cluster))
        .collect::<Result<Vec<_>>>()?;
    let beats = Beats::start(
        args.keep_alives,
        &cluster.addrs,
        &cluster.tls_dir(),
        clients.len(),
    )?;
    let status = cluster.client()?;
    let job = format!("bench-steady-{n}");
    assign_all(&clients, &job, n).await?;
    let cache = Arc::new(TopologyCache::new());
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (kv, job, cache, beats) = (
                clients[i as usize % clients.len()].clone(),
                job.clone(),
                cache.clone(),
                beats.clone(),
            );
            tokio::spawn(async move {
                let liveness = LivenessConfig::default();
                sim_host::run(kv, &beats, (n, i), &job, &cache, None, liveness).await
            })
        })
        .collect();
    let hosts = crate::sim_host::all_known(tasks)
        .await
        .context("the job's bootstrap")?;
    let bootstrap_ms = started.elapsed().as_secs_f64() * 1e3;

    let pids = cluster.coordinator_pids();
    let cpu_before = cpu_now(&pids);
    let (applied_before, revision_before) = leader_progress(&status).await?;
    let window = Duration::from_secs(args.seconds);
    // The probe on a runtime of its own, as another process (`simulated`
    // `on_own_runtime`).
    let (addrs, tls_dir) = (cluster.addrs.clone(), cluster.tls_dir());
    let probing = tokio::spawn(on_own_runtime("probe", move || async move {
        let probe = KeepAlives::Stream.connect(addrs, &tls_dir)?;
        probe_puts(&*probe, window).await
    }));
    let kv0 = clients[0].clone();
    let reporter = Reporter::start(kv0.clone(), job.clone());
    let holders: Vec<Holder> = (0..n)
        .map(|i| Holder {
            worker: sim_host::host_id(n, i),
            hostname: format!("sim-host-{i}"),
        })
        .collect();
    let mut commits_ms = Vec::new();
    let (mut record_bytes, mut record_bytes_before) = (0, 0);
    let mut step = 0u64;
    let begun = Instant::now();
    let mut next = begun;
    while begun.elapsed() < window {
        step += 1;
        reporter.send(&StepReport {
            step,
            values: BTreeMap::from([("loss".to_owned(), 1.0 / step as f64)]),
            unix_ms: tessel_coordinator::unix_ms(),
        });
        if step % args.checkpoint_every == 0 {
            let (record, before) = record_of(&job, step, args.arrays, &holders);
            let bytes = record.encode();
            record_bytes = bytes.len();
            record_bytes_before = before;
            let t = Instant::now();
            commit(&*kv0, &job, step, &bytes).await.with_context(|| {
                format!(
                    "committing the checkpoint of step {step} ({} bytes)",
                    bytes.len()
                )
            })?;
            commits_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        next += Duration::from_millis(args.step_ms);
        tokio::time::sleep_until(next.into()).await;
    }
    let dropped = reporter.finish().await?;
    let elapsed = begun.elapsed();
    let mut latencies = probing.await??;
    let (applied_after, revision_after) = leader_progress(&status).await?;
    let leader = leader_index(&status).await;
    let (leader_cpu_ns, followers_ns) = cpu_split(&pids, &cpu_before, leader);

    // Every process publishes its result, as at the end of a plan.
    let t = Instant::now();
    let results: Vec<_> = (0..n)
        .map(|i| {
            let (kv, job) = (clients[i as usize % clients.len()].clone(), job.clone());
            let result = ProcessResult {
                process: i,
                timings: PlanTimings {
                    steps: step,
                    ..PlanTimings::default()
                },
                last_report: None,
                reports_dropped: 0,
            };
            tokio::spawn(async move {
                let json = serde_json::to_vec(&result).expect("encodes");
                attempt::publish(&*kv, &job, i, Record::Result, &json).await
            })
        })
        .collect();
    for r in results {
        r.await??;
    }
    let results_ms = t.elapsed().as_secs_f64() * 1e3;
    let lost = hosts.iter().filter(|h| h.lost_now()).count();

    latencies.sort_unstable();
    let secs = elapsed.as_secs_f64();
    commits_ms.sort_by(f64::total_cmp);
    println!(
        "{{\"figure\":\"steady\",\"workers\":{n},\"bootstrap_ms\":{bootstrap_ms:.0},\"seconds\":{secs:.1},\"steps\":{step},\"reports_dropped\":{dropped},\"checkpoints\":{},\"checkpoint_record_bytes\":{record_bytes},\"checkpoint_record_bytes_before_v2\":{record_bytes_before},\"checkpoint_commit_ms_max\":{:.0},\"leader_cpu_percent_of_one_core\":{:.1},\"followers_cpu_percent_of_one_core\":{},\"leader_entries_per_s\":{:.0},\"leader_writes_per_s\":{:.0},\"put_p50_ms\":{:.2},\"put_p99_ms\":{:.2},\"results_ms\":{results_ms:.0},\"lost_while_beating\":{lost}}}",
        commits_ms.len(),
        commits_ms.last().copied().unwrap_or(0.0),
        leader_cpu_ns as f64 / elapsed.as_nanos() as f64 * 100.0,
        percents_json(&followers_ns, elapsed),
        (applied_after - applied_before) as f64 / secs,
        (revision_after - revision_before) as f64 / secs,
        quantile_ms(&latencies, 0.5),
        quantile_ms(&latencies, 0.99),
    );
    jobs::finish_job(&*clients[0], &job).await?;
    futures::future::join_all(hosts.into_iter().map(sim_host::RunningHost::stop)).await;
    Ok(())
}

/// The record process 0 writes at `step` on per-host disks: every
/// process's blocks, held by its worker and its successor's; and the size
/// the same record had in the form before version 2 (`checkpoint`'s
/// `Blocks`), for the side-by-side figure.
fn record_of(job: &str, step: u64, arrays: usize, holders: &[Holder]) -> (CheckpointRecord, usize) {
    let n = holders.len();
    let digests = |p: usize| -> Vec<String> {
        (0..arrays)
            .map(|a| tessel_topology::sha256_hex(format!("{step}/{p}/{a}").as_bytes()))
            .collect()
    };
    let held = |p: usize| vec![holders[p].clone(), holders[(p + 1) % n].clone()];
    let record = CheckpointRecord::new(
        step,
        tessel_topology::sha256_hex(job.as_bytes()),
        format!("{job}@0"),
        false,
        (0..arrays)
            .map(|a| (format!("array{a}"), ShardingSpec::Replicated))
            .collect(),
        (0..n)
            .map(|p| (blocks_digest(&digests(p)), held(p)))
            .collect(),
    );
    let before = CheckpointRecord {
        blocks: (0..n)
            .map(|p| Blocks {
                digests: digests(p),
                holders: held(p),
            })
            .collect(),
        workers: Vec::new(),
        processes: Vec::new(),
        ..record.clone()
    };
    let before_bytes = before.encode().len();
    (record, before_bytes)
}

/// Process 0's commit: the record put, the records listed, those beyond
/// the newest kept deleted (`checkpoint` protocol, step 2).
async fn commit(kv: &dyn KvStore, job: &str, step: u64, record: &[u8]) -> Result<()> {
    let records = Records::new(kv, job);
    records.put(Item::Checkpoint(step), record).await?;
    let committed: Vec<u64> = records
        .checkpoints()
        .await?
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    let kept = retained(&committed);
    for old in committed.iter().filter(|s| !kept.contains(s)) {
        records.delete(Item::Checkpoint(*old)).await?;
    }
    Ok(())
}

/// The leader's applied log index and its state machine's revision.
async fn leader_progress(kv: &RaftKv) -> Result<(u64, u64)> {
    for (_, s) in kv.cluster_status().await {
        if let Ok(s) = s {
            if s.state == "Leader" {
                return Ok((s.applied.unwrap_or(0), s.revision));
            }
        }
    }
    bail!("no replica reports itself leader")
}

/// A put every 10 ms for `window` on its own connection: each one's time.
async fn probe_puts(probe: &dyn KvStore, window: Duration) -> Result<Vec<Duration>> {
    let started = Instant::now();
    let mut latencies = Vec::new();
    while started.elapsed() < window {
        let t = Instant::now();
        probe
            .put(b"bench/steady/probe", b"x")
            .await
            .context("the probe's put")?;
        latencies.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(latencies)
}
