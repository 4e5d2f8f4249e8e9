//! `tessel-bench launch`: command jobs as a launcher. Four processes of a
//! trivial Python command on a fresh local cluster: submit → every process
//! started, and a SIGKILLed process → every process of the next attempt
//! started; beside, in the same run, the interpreter's own start-up (the
//! same 4 processes spawned directly) and, with `--jax`, JAX's own start-up
//! of 4 processes (`jax.distributed.initialize`); and the worker's memory
//! per supervised process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use tessel::client::Client;
use tessel::job::{JobSpec, ValidatedJob};
use tessel_coordinator::scheduler;
use tessel_harness::LocalCluster;

/// `tessel-bench launch`.
#[derive(Args)]
pub struct BenchLaunchArgs {
    /// The Python the processes run.
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// Processes per job (one per worker).
    #[arg(long, default_value_t = 4)]
    pub processes: u32,
    /// Runs (each figure is reported per run).
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// Also time JAX's start-up of the same processes with this Python.
    #[arg(long, value_name = "PYTHON")]
    pub jax: Option<PathBuf>,
    /// Processes one worker supervises for the memory figure.
    #[arg(long, default_value_t = 16)]
    pub rss_processes: u32,
}

/// Prints its start time and attempt; the first attempt then waits to be
/// killed, later ones end at once.
const SCRIPT: &str = "import os, sys, time\n\
print('start', repr(time.time()), os.environ['TESSEL_ATTEMPT'], flush=True)\n\
if os.environ['TESSEL_ATTEMPT'] == '1':\n    time.sleep(600)\n";

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

fn job(python: &Path, processes: u32, per_worker: u32) -> Result<ValidatedJob> {
    let text = format!(
        "name = \"launch\"\nprocesses = {processes}\nprocesses_per_worker = {per_worker}\n\
         max_restarts = 1\nstop_grace_ms = 1000\ncommand = [{:?}, \"-c\", {:?}]\n",
        python.display().to_string(),
        SCRIPT
    );
    Ok(JobSpec::from_toml(&text, "launch.toml".as_ref())?
        .validate(&BTreeMap::<PathBuf, Vec<u8>>::new())?)
}

/// The latest start time printed by each of `n` processes of `attempt`.
async fn started(
    client: &Client,
    id: &str,
    attempt: u32,
    n: usize,
    within: Duration,
) -> Result<f64> {
    let deadline = Instant::now() + within;
    loop {
        let (_, chunks) = client
            .logs(id, Some(attempt), None, &BTreeMap::new())
            .await?;
        let times: Vec<f64> = chunks
            .iter()
            .flat_map(|c| c.text.lines())
            .filter_map(|l| l.strip_prefix("start ")?.split(' ').next()?.parse().ok())
            .collect();
        if times.len() >= n {
            return Ok(times.into_iter().fold(0.0, f64::max));
        }
        if Instant::now() > deadline {
            bail!(
                "attempt {attempt} of {id}: {} of {n} processes started",
                times.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pid of process `rank` of `attempt` of job `id`, from /proc.
fn pid_of(id: &str, attempt: u32, rank: u32) -> Option<i32> {
    let want = [
        format!("TESSEL_JOB_ID={id}"),
        format!("TESSEL_ATTEMPT={attempt}"),
        format!("TESSEL_PROCESS_INDEX={rank}"),
    ];
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let env = std::fs::read(e.path().join("environ")).ok()?;
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        want.iter()
            .all(|w| vars.contains(&w.as_bytes()))
            .then_some(pid)
    })
}

fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    Ok(kb * 1024)
}

/// Spawns `n` copies of `python -c code` with per-rank environments and
/// returns the latest time each printed as its last line, less the spawn
/// time: the peer's start-up.
fn spawn_all(
    python: &Path,
    code: &str,
    n: u32,
    env: impl Fn(u32) -> Vec<(String, String)>,
) -> Result<f64> {
    let t0 = now();
    let children: Vec<_> = (0..n)
        .map(|r| {
            Command::new(python)
                .args(["-c", code])
                .envs(env(r))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    let mut latest: f64 = 0.0;
    for c in children {
        let out = c.wait_with_output()?;
        if !out.status.success() {
            bail!("{} -c … failed", python.display());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let t: f64 = text.lines().last().context("no output")?.trim().parse()?;
        latest = latest.max(t);
    }
    Ok(latest - t0)
}

/// Runs the benchmark and prints its JSON lines.
pub async fn run(args: BenchLaunchArgs) -> Result<()> {
    let n = args.processes;
    let ms = |s: f64| (s * 1e5).round() / 100.0;
    for _ in 0..args.repeat {
        let interp = spawn_all(
            &args.python,
            "import time; print(repr(time.time()))",
            n,
            |_| vec![],
        )?;
        println!(
            "{}",
            json!({"figure": "launch_start", "system": "python-spawn", "processes": n, "ms": ms(interp)})
        );

        let mut cluster = LocalCluster::new(crate::tessel_bin()?)?;
        cluster.start_coordinators(3)?;
        let kv = cluster.client()?;
        cluster.start_workers(n, "cpu", 1)?;
        let client = Client::from_store(Arc::new(kv));
        let t_submit = now();
        let id = client.submit(&job(&args.python, n, 1)?).await?;
        let first = started(&client, &id, 1, n as usize, Duration::from_secs(60)).await?;
        let pid = pid_of(&id, 1, n / 2).context("the process to kill is not on this machine")?;
        let t_kill = now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        let second = started(&client, &id, 2, n as usize, Duration::from_secs(60)).await?;
        let failure = client
            .failure(&id, 1)
            .await?
            .context("no failure recorded")?;
        let end = client.wait(&id).await?;
        if end.state != scheduler::JobState::Succeeded {
            bail!("job `{id}` ended {}: {:?}", end.state, end.reason);
        }
        println!(
            "{}",
            json!({"figure": "launch_start", "system": "tessel", "processes": n,
            "ms": ms(first - t_submit), "over_python_spawn_ms": ms(first - t_submit - interp)})
        );
        println!(
            "{}",
            json!({"figure": "launch_restart", "system": "tessel", "processes": n,
            "from_kill_ms": ms(second - t_kill),
            "from_failure_recorded_ms": ms(second - failure.unix_ms as f64 / 1e3)})
        );
        drop(cluster);

        if let Some(jax) = &args.jax {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let code = "import time, os, jax\n\
jax.config.update('jax_platforms', 'cpu')\n\
jax.distributed.initialize(num_processes=int(os.environ['N']), process_id=int(os.environ['R']))\n\
print(repr(time.time()))";
            let t = spawn_all(jax, code, n, |r| {
                vec![
                    (
                        "JAX_COORDINATOR_ADDRESS".into(),
                        format!("127.0.0.1:{port}"),
                    ),
                    ("N".into(), n.to_string()),
                    ("R".into(), r.to_string()),
                ]
            })?;
            println!(
                "{}",
                json!({"figure": "launch_start", "system": "jax-distributed-initialize", "processes": n, "ms": ms(t)})
            );
        }
    }

    // Memory: one worker, then the same worker supervising k processes.
    let k = args.rss_processes;
    let mut cluster = LocalCluster::new(crate::tessel_bin()?)?;
    cluster.start_coordinators(1)?;
    let kv = cluster.client()?;
    cluster.start_workers(1, "cpu", k as usize)?;
    let worker = cluster.workers[0].pid();
    let client = Client::from_store(Arc::new(kv));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_bytes(worker)?;
    let id = client.submit(&job(&args.python, k, k)?).await?;
    started(&client, &id, 1, k as usize, Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = rss_bytes(worker)?;
    client.cancel(&id).await?;
    client.wait(&id).await?;
    println!(
        "{}",
        json!({"figure": "supervised_rss", "system": "tessel", "processes": k,
        "worker_rss_bytes": {"idle": before, "supervising": during},
        "per_process_bytes": during.saturating_sub(before) / u64::from(k)})
    );
    Ok(())
}
