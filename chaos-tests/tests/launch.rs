//! Command jobs on real workers: JAX's and torchrun's conventions, the
//! gang restarted after a SIGKILLed process and a lost worker (ending as an
//! undisturbed run, with no process of an old attempt left), and bad
//! commands failing with their cause. The JAX tests need JAX 0.10.2
//! (`./scripts/test` installs it and sets `TESSEL_JAX_PYTHON`).
//!
//! Organised by the property each test proves.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tessel::client::{Client, JobUpdate};
use tessel::job::{JobSpec, ValidatedJob};
use tessel_chaos_tests::{spawn_worker_cmd, tessel_bin, KvCluster, WorkerProc};

use tessel_coordinator::scheduler::{JobEvent, JobState};
use tessel_kv::KvStore;

const LIVENESS: [&str; 4] = ["--heartbeat-ms", "300", "--ttl-ms", "1500"];

/// The Python with JAX 0.10.2; the JAX tests fail without it, saying how
/// to get it.
fn jax_python() -> PathBuf {
    let p = std::env::var_os("TESSEL_JAX_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tessel/jax/bin/python3")
        });
    assert!(
        p.exists(),
        "no Python with JAX at {}: run ./scripts/test (it installs JAX 0.10.2), or set TESSEL_JAX_PYTHON",
        p.display()
    );
    p
}

fn example_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/jax-launch")
}

/// `n` workers `w0..` whose `python3` is `python` (when given).
fn workers(cluster: &KvCluster, n: usize, python: Option<&Path>) -> BTreeMap<String, WorkerProc> {
    let coordinators: Vec<String> = cluster.addrs().iter().map(|a| a.to_string()).collect();
    (0..n)
        .map(|i| {
            let id = format!("w{i}");
            let mut cmd = Command::new(tessel_bin());
            cmd.args(["worker", "--coordinator", &coordinators.join(",")])
                .arg("--tls-dir")
                .arg(cluster.tls_dir())
                .args(["--plugin", "cpu", "--devices", "2", "--worker-id", &id])
                .args(LIVENESS)
                .arg("--work-dir")
                .arg(cluster.dir.path().join("work").join(&id));
            if let Some(py) = python {
                let bin = py.parent().unwrap();
                let path = std::env::var_os("PATH").unwrap_or_default();
                let mut dirs = vec![bin.to_owned()];
                dirs.extend(std::env::split_paths(&path));
                cmd.env("PATH", std::env::join_paths(dirs).unwrap());
            }
            let w = spawn_worker_cmd(cmd, &id).unwrap_or_else(|e| panic!("{e}"));
            (id, w)
        })
        .collect()
}

fn spec(text: &str, dir: &Path) -> ValidatedJob {
    JobSpec::from_toml(text, "job.toml".as_ref())
        .unwrap()
        .validate_in(dir)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Every line of attempt `attempt`, as `(process, line)`.
async fn lines(client: &Client, id: &str, attempt: u32) -> Vec<(u32, String)> {
    let (_, chunks) = client
        .logs(id, Some(attempt), None, &BTreeMap::new())
        .await
        .unwrap();
    chunks
        .iter()
        .flat_map(|c| c.text.lines().map(move |l| (c.process, l.to_owned())))
        .collect()
}

/// Waits until a line of `attempt` satisfies `pred`; that line.
async fn wait_line(
    client: &Client,
    id: &str,
    attempt: u32,
    within: Duration,
    pred: impl Fn(u32, &str) -> bool,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some((_, l)) = lines(client, id, attempt)
            .await
            .into_iter()
            .find(|(p, l)| pred(*p, l))
        {
            return l;
        }
        let j = client.job(id).await.unwrap();
        assert!(
            Instant::now() < deadline && !j.state.is_terminal(),
            "{id}: no such line in attempt {attempt} ({} {:?}): {:?}",
            j.state,
            j.reason,
            lines(client, id, attempt).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Processes on this machine started for job `id`: `(pid, attempt, rank)`,
/// read from their environments.
fn processes_of(id: &str) -> Vec<(i32, u32, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: BTreeMap<String, String> = env
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let s = String::from_utf8_lossy(kv);
                s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect();
        if vars.get("TESSEL_JOB_ID").map(String::as_str) == Some(id) {
            let n = |k: &str| vars.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
            out.push((pid, n("TESSEL_ATTEMPT"), n("TESSEL_PROCESS_INDEX")));
        }
    }
    out
}

/// Waits until no process of job `id` is left; how long that took.
fn none_left(id: &str, within: Duration) -> Duration {
    let start = Instant::now();
    while !processes_of(id).is_empty() {
        assert!(
            start.elapsed() < within,
            "processes of {id} still running after {within:?}: {:?}",
            processes_of(id)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

async fn events(client: &Client, id: &str) -> Vec<JobEvent> {
    let mut out = Vec::new();
    let mut s = client.events(id).await.unwrap();
    while let Some(u) = s.next().await {
        if let JobUpdate::State(e) = u.unwrap() {
            out.push(e);
        }
    }
    out
}

/// The script a PyTorch program would run under torchrun: every variable
/// torchrun sets is present and consistent, and the master port really
/// is a rendezvous point (rank 0 listens there, the others connect).
const TORCHRUN_CHECK: &str = r#"
import json, os, socket, sys, time
names = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
         "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RESTART_COUNT", "GROUP_WORLD_SIZE",
         "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TESSEL_JOB_ID",
         "TESSEL_ATTEMPT", "TESSEL_COORDINATORS", "TESSEL_TLS_DIR", "TESSEL_WORK_DIR"]
missing = [n for n in names if n not in os.environ]
assert not missing, missing
env = {n: os.environ[n] for n in names}
rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
addr = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
if rank == 0:
    s = socket.create_server(addr)
    seen = set()
    while len(seen) < world - 1:
        c, _ = s.accept()
        seen.add(int(c.recv(16)))
    assert seen == set(range(1, world)), seen
else:
    for _ in range(200):
        try:
            socket.create_connection(addr).sendall(str(rank).encode())
            break
        except OSError:
            time.sleep(0.05)
    else:
        sys.exit("rank %d never reached the master" % rank)
print(json.dumps(env), flush=True)
"#;

/// Four processes, two per worker, see torchrun's and JAX's variables,
/// consistent across processes (ranks 0..3 once each, one master), and
/// meet at the master address; `tessel logs` shows each line with its
/// process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_launcher_variable_is_set_and_consistent_across_four_processes() {
    let cluster = KvCluster::start(3, &[]);
    let _ws = workers(&cluster, 2, None);
    let client = Client::from_store(Arc::new(cluster.client()) as Arc<dyn KvStore>);
    let dir = cluster.dir.path().join("spec");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("check.py"), TORCHRUN_CHECK).unwrap();
    let job = spec(
        "name = \"env\"\nprocesses = 4\nprocesses_per_worker = 2\n\
         command = [\"python3\", \"check.py\"]\nfiles = [\"check.py\"]\n",
        &dir,
    );
    let id = client.submit(&job).await.unwrap();
    let end = client.wait(&id).await.unwrap();
    assert_eq!(end.state, JobState::Succeeded, "{:?}", end.reason);
    let envs: Vec<(u32, serde_json::Value)> = lines(&client, &id, 1)
        .await
        .into_iter()
        .filter(|(_, l)| l.starts_with('{'))
        .map(|(p, l)| (p, serde_json::from_str(&l).unwrap()))
        .collect();
    assert_eq!(envs.len(), 4, "{envs:?}");
    let field = |e: &serde_json::Value, k: &str| e[k].as_str().unwrap().to_owned();
    let num = |e: &serde_json::Value, k: &str| field(e, k).parse::<u32>().unwrap();
    let mut ranks = BTreeSet::new();
    let mut masters = BTreeSet::new();
    for (process, e) in &envs {
        let rank = num(e, "RANK");
        assert!(ranks.insert(rank));
        assert_eq!(rank, *process, "the log names the process");
        assert_eq!(num(e, "GROUP_RANK") * 2 + num(e, "LOCAL_RANK"), rank);
        assert_eq!(num(e, "ROLE_RANK"), rank);
        assert_eq!(num(e, "JAX_PROCESS_ID"), rank);
        assert_eq!(
            (
                num(e, "WORLD_SIZE"),
                num(e, "LOCAL_WORLD_SIZE"),
                num(e, "GROUP_WORLD_SIZE")
            ),
            (4, 2, 2)
        );
        assert_eq!(num(e, "JAX_NUM_PROCESSES"), 4);
        assert_eq!(num(e, "TORCHELASTIC_RESTART_COUNT"), 0);
        assert_eq!(field(e, "TESSEL_JOB_ID"), id);
        assert!(field(e, "JAX_COORDINATOR_ADDRESS").starts_with(&field(e, "MASTER_ADDR")));
        masters.insert((
            field(e, "MASTER_ADDR"),
            field(e, "MASTER_PORT"),
            field(e, "JAX_COORDINATOR_ADDRESS"),
        ));
    }
    assert_eq!(ranks, (0..4).collect());
    assert_eq!(masters.len(), 1, "{masters:?}");
    // The same through the CLI, each line prefixed with its process.
    let out = cluster.cli(&["logs", &id, "--process", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines().count() >= 1 && text.lines().all(|l| l.starts_with("[2] ")),
        "{text}"
    );
}

/// The single-process run's final line (4 CPU devices in one process).
fn reference(python: &Path, steps: u32) -> String {
    let out = Command::new(python)
        .arg(example_dir().join("train.py"))
        .args(["--steps", &steps.to_string()])
        .env_remove("TESSEL_CHECKPOINT_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with("final w"))
        .unwrap()
        .to_owned()
}

/// A real JAX program over 4 processes (gloo psum across processes).
/// SIGKILL of one of its processes restarts the whole gang, which resumes
/// from the script's own checkpoint; then the loss of a worker does the
/// same; the job ends with the single-process run's exact values and no
/// process of an earlier attempt survives (pdeathsig, process groups).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_restarts_after_a_killed_process_and_a_lost_worker_and_ends_as_an_undisturbed_run() {
    let python = jax_python();
    let steps = 150;
    let want = reference(&python, steps);
    let cluster = KvCluster::start(3, &[]);
    let mut ws = workers(&cluster, 5, Some(&python));
    let client = Client::from_store(Arc::new(cluster.client()) as Arc<dyn KvStore>);
    let ckpt = cluster.dir.path().join("ckpt");
    let text = std::fs::read_to_string(example_dir().join("job.toml"))
        .unwrap()
        .replace(
            "\"--steps\", \"200\"",
            &format!("\"--steps\", \"{steps}\", \"--every\", \"10\", \"--step-sleep\", \"0.04\""),
        )
        // JAX catches SIGTERM (its preemption sync): it stops at SIGKILL.
        .replace("max_restarts = 3", "max_restarts = 3\nstop_grace_ms = 2000")
        + &format!("\n[checkpoint]\ndir = \"{}\"\n", ckpt.display());
    let id = client.submit(&spec(&text, &example_dir())).await.unwrap();

    // Attempt 1: past the checkpoint of step 30, kill process 2 itself.
    wait_line(&client, &id, 1, Duration::from_secs(120), |p, l| {
        p == 0 && l.starts_with("step 30 ")
    })
    .await;
    let (pid, _, _) = *processes_of(&id)
        .iter()
        .find(|(_, a, r)| (*a, *r) == (1, 2))
        .expect("process 2 of attempt 1 runs here");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let resumed = wait_line(&client, &id, 2, Duration::from_secs(120), |_, l| {
        l.starts_with("resumed from step")
    })
    .await;
    let from: u32 = resumed.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(from >= 30, "{resumed}");
    assert!(
        processes_of(&id).iter().all(|(_, a, _)| *a == 2),
        "attempt 1 left processes: {:?}",
        processes_of(&id)
    );

    // Attempt 2: past its next checkpoint, kill a worker it runs on.
    wait_line(&client, &id, 2, Duration::from_secs(120), |p, l| {
        p == 0 && l.starts_with(&format!("step {} ", from + 20))
    })
    .await;
    let victim = client.job(&id).await.unwrap().placement[1].clone();
    ws.get_mut(&victim).unwrap().kill();

    let end = client.wait(&id).await.unwrap();
    assert_eq!(end.state, JobState::Succeeded, "{:?}", end.reason);
    assert_eq!((end.restarts, end.attempt), (2, 3));
    assert!(!end.placement.contains(&victim));
    let third = lines(&client, &id, 3).await;
    assert!(
        third
            .iter()
            .any(|(_, l)| l.starts_with("resumed from step")),
        "{third:?}"
    );
    let last = third
        .iter()
        .find(|(_, l)| l.starts_with("final w"))
        .map(|(_, l)| l.clone());
    assert_eq!(last.as_deref(), Some(want.as_str()));
    none_left(&id, Duration::from_secs(5));
}

/// The example through `tessel local`: the same values as one process.
#[test]
fn the_jax_example_through_tessel_local_matches_one_process() {
    let python = jax_python();
    let want = reference(&python, 200);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![python.parent().unwrap().to_owned()];
    dirs.extend(std::env::split_paths(&path));
    let out = Command::new(tessel_bin())
        .arg("local")
        .arg(example_dir().join("job.toml"))
        .env("PATH", std::env::join_paths(dirs).unwrap())
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.lines().any(|l| l == format!("[0] {want}")),
        "{stdout}"
    );
}

/// A missing program or folder fails the job at once with the cause (no
/// restart could help); a script that exits 3 is restarted with growing
/// back-off and then fails naming the exit and its last line; a process
/// that ignores SIGTERM is killed after the grace when the job is
/// cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commands_fail_with_their_cause_and_exits_restart_with_back_off() {
    let cluster = KvCluster::start(3, &[]);
    let _ws = workers(&cluster, 1, None);
    let client = Client::from_store(Arc::new(cluster.client()) as Arc<dyn KvStore>);
    let dir = cluster.dir.path();
    let job = |name: &str, extra: &str| {
        spec(
            &format!("name = \"{name}\"\nprocesses = 1\nmax_restarts = 2\n{extra}"),
            dir,
        )
    };

    for (name, extra, words) in [
        (
            "missing",
            "command = [\"no-such-program-4711\"]",
            "cannot start `no-such-program-4711`: not found",
        ),
        (
            "nowhere",
            "command = [\"python3\", \"-c\", \"pass\"]\nworkdir = \"/no/such/folder\"",
            "workdir /no/such/folder does not exist",
        ),
    ] {
        let id = client.submit(&job(name, extra)).await.unwrap();
        let end = client.wait(&id).await.unwrap();
        assert_eq!(end.state, JobState::Failed);
        assert_eq!(end.restarts, 0, "its own error is not restarted");
        assert!(
            end.reason.as_deref().unwrap().contains(words),
            "{:?}",
            end.reason
        );
    }

    let id = client
        .submit(&job(
            "exits",
            "command = [\"python3\", \"-c\", \"import sys; print('bad things', file=sys.stderr); sys.exit(3)\"]",
        ))
        .await
        .unwrap();
    let end = client.wait(&id).await.unwrap();
    assert_eq!(
        (end.state, end.restarts, end.attempt),
        (JobState::Failed, 2, 3)
    );
    let why = end.reason.unwrap();
    assert!(
        why.contains("process 0 exited with code 3") && why.contains("bad things"),
        "{why}"
    );
    // The second restart waited its back-off (1 s) after the failure.
    let ev = events(&client, &id).await;
    let restarting: Vec<u64> = ev
        .iter()
        .filter(|e| e.to == JobState::Restarting)
        .map(|e| e.unix_ms)
        .collect();
    let pending: Vec<u64> = ev
        .iter()
        .filter(|e| e.from == JobState::Restarting)
        .map(|e| e.unix_ms)
        .collect();
    assert_eq!((restarting.len(), pending.len()), (2, 2), "{ev:?}");
    assert!(pending[1] - restarting[1] >= 1000, "{ev:?}");

    let id = client
        .submit(&job(
            "stubborn",
            "stop_grace_ms = 1500\ncommand = [\"python3\", \"-c\", \"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)\"]",
        ))
        .await
        .unwrap();
    wait_line(&client, &id, 1, Duration::from_secs(60), |_, l| {
        l == "ready"
    })
    .await;
    assert_eq!(processes_of(&id).len(), 1);
    client.cancel(&id).await.unwrap();
    let took = tokio::task::spawn_blocking({
        let id = id.clone();
        move || none_left(&id, Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert!(
        took >= Duration::from_millis(1000),
        "it ignored SIGTERM, yet went in {took:?}"
    );
    assert_eq!(client.wait(&id).await.unwrap().state, JobState::Cancelled);
}

/// A worker that is PID 1 of its namespace (a container started without
/// `--init`) reaps the orphans its jobs leave: a script's child that
/// outlives the script exits and does not stay a zombie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_is_pid_1_reaps_orphaned_grandchildren() {
    let cluster = KvCluster::start(1, &[]);
    let coordinators: Vec<String> = cluster.addrs().iter().map(|a| a.to_string()).collect();
    // `--kill-child`: the worker dies with unshare, as a container's PID 1
    // dies with its container (a worker cut off from its coordinators
    // keeps trying, agent invariant 1, so it would outlive the test).
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(tessel_bin())
        .args(["worker", "--coordinator", &coordinators.join(",")])
        .arg("--tls-dir")
        .arg(cluster.tls_dir())
        .args(["--plugin", "cpu", "--devices", "1", "--worker-id", "init"])
        .arg("--work-dir")
        .arg(cluster.dir.path().join("work"));
    let w = spawn_worker_cmd(cmd, "init").unwrap_or_else(|e| panic!("{e}"));
    // The tessel process is unshare's child, PID 1 inside.
    let unshare = w.child.pid() as i32;
    let children = |parent: i32, state: Option<char>| -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter_map(|s| tessel_worker::reaper::parse_stat(&s))
            .filter(|&(_, pp, st)| pp == parent && state.is_none_or(|want| st == want))
            .map(|(p, _, _)| p)
            .collect()
    };
    let init = *children(unshare, None)
        .first()
        .expect("tessel runs under unshare");
    let client = Client::from_store(Arc::new(cluster.client()) as Arc<dyn KvStore>);
    let job = spec(
        "name = \"orphans\"\nprocesses = 1\ncommand = [\"python3\", \"-c\", \"import subprocess; [subprocess.Popen(['sleep', '0.3']) for _ in range(3)]; print('left three children', flush=True)\"]\n",
        cluster.dir.path(),
    );
    let id = client.submit(&job).await.unwrap();
    let end = client.wait(&id).await.unwrap();
    assert_eq!(end.state, JobState::Succeeded, "{:?}", end.reason);
    // The sleeps were reparented to PID 1 and exited; within a few scans
    // no zombie is left under it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let zombies = children(init, Some('Z'));
        if zombies.is_empty() && Instant::now() > deadline - Duration::from_secs(6) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "zombies left under PID 1: {zombies:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(w);
}
