//! Preemption notices on real workers: SIGTERM to a worker suspends a
//! running plan at a step its processes agree on, off the periodic
//! schedule, and the job resumes from exactly that step to the result of
//! an undisturbed run; `tessel drain` gives a command job's processes
//! their notice file, then SIGTERM after the grace, and the job moves.
//!
//! Organised by the property each test proves.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessel::client::Client;
use tessel::job::{JobSpec, ValidatedJob};
use tessel_chaos_tests::mlp::{mlp_dir, mlp_job, mlp_params as params};
use tessel_chaos_tests::{spawn_worker, KvCluster, WorkerProc};

use tessel_coordinator::scheduler::JobState;
use tessel_coordinator::{Item, Records};
use tessel_kv::KvStore;

fn flags(cluster: &KvCluster, id: &str) -> Vec<String> {
    [
        "--heartbeat-ms",
        "300",
        "--ttl-ms",
        "1500",
        "--devices",
        "1",
        "--preempt-grace-ms",
        "2000",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "--checkpoint-root".into(),
        cluster.dir.path().join("ckpt").display().to_string(),
        "--work-dir".into(),
        cluster
            .dir
            .path()
            .join("work")
            .join(id)
            .display()
            .to_string(),
    ])
    .collect()
}

/// The MLP demo with `steps` and checkpoints every 100 steps under `ckpt`.
fn mlp(steps: u64, max_restarts: u32, ckpt: &Path) -> ValidatedJob {
    mlp_job(&mlp_dir(), "job.toml", steps, max_restarts, ckpt)
}

fn workers(cluster: &KvCluster, n: usize) -> Vec<(String, WorkerProc)> {
    (0..n)
        .map(|i| {
            let id = format!("w{i}");
            let f = flags(cluster, &id);
            let f: Vec<&str> = f.iter().map(String::as_str).collect();
            let w = spawn_worker(cluster, &id, &f);
            (id, w)
        })
        .collect()
}

/// SIGTERM to one worker of a running MLP job: every process checkpoints
/// at the step process 0 chose after the notice (not a periodic one), the
/// worker exits by itself, and the new attempt's first step is the one
/// after it; the parameters equal an undisturbed run's, bit for bit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_suspends_a_plan_at_an_agreed_step_and_it_resumes_exactly_there() {
    let cluster = KvCluster::start(3, &[]);
    let mut ws = workers(&cluster, 5);
    let kv: Arc<dyn KvStore> = Arc::new(cluster.client());
    let client = Client::from_store(kv.clone());
    let ckpt = cluster.dir.path().join("ckpt");

    let calm = client.submit(&mlp(1000, 0, &ckpt)).await.unwrap();
    assert_eq!(client.wait(&calm).await.unwrap().state, JobState::Succeeded);

    // No restart budget: a planned move must not need one.
    let id = client.submit(&mlp(1000, 0, &ckpt)).await.unwrap();
    Records::new(&*kv, &id)
        .wait(Item::Report(299), Duration::from_secs(120))
        .await
        .expect("the job reached step 300");
    let victim = client.job(&id).await.unwrap().placement[2].clone();
    let (_, w) = ws.iter_mut().find(|(n, _)| *n == victim).unwrap();
    let noticed = Instant::now();
    w.child.signal(nix::sys::signal::Signal::SIGTERM);

    let end = client.wait(&id).await.unwrap();
    assert_eq!(end.state, JobState::Succeeded, "{:?}", end.reason);
    assert_eq!(
        (end.restarts, end.suspensions, end.attempt),
        (0, 1, 2),
        "a planned move, not a restart"
    );
    assert!(!end.placement.contains(&victim));
    let step: u64 = Records::new(&*kv, &format!("{id}@1"))
        .get(Item::SuspendStep)
        .await
        .unwrap()
        .map(|v| String::from_utf8(v).unwrap().parse().unwrap())
        .expect("process 0 chose a suspend step");
    assert!(
        step >= 300 && (step + 1) % 100 != 0,
        "step {step} is not off the schedule"
    );
    let results = client.results(&id).await.unwrap();
    assert!(!results.is_empty());
    for r in &results {
        assert_eq!(r.timings.first_step, step + 1, "process {}", r.process);
    }
    assert_eq!(params(&client, &id).await, params(&client, &calm).await);
    // The preempted worker left by itself once its process had acted.
    let by = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = w.child.try_wait() {
            break s;
        }
        assert!(Instant::now() < by, "the preempted worker did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    assert!(noticed.elapsed() < Duration::from_secs(60));
}

/// A command job whose script watches `$TESSEL_PREEMPT_FILE`: `tessel
/// drain` of its worker shows it the notice, SIGTERM follows after the
/// grace, and the job restarts on another worker; the drained worker
/// takes no placement until `--undo`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_gives_its_processes_the_notice_then_sigterm_and_the_job_moves() {
    let cluster = KvCluster::start(3, &[]);
    let _ws = workers(&cluster, 2);
    let client = Client::from_store(Arc::new(cluster.client()) as Arc<dyn KvStore>);
    let script = r#"
import os, time
if os.environ["TESSEL_ATTEMPT"] != "1":
    print("attempt", os.environ["TESSEL_ATTEMPT"], flush=True)
    raise SystemExit(0)
print("ready", flush=True)
path = os.environ["TESSEL_PREEMPT_FILE"]
while not os.path.exists(path):
    time.sleep(0.05)
print("noticed:", open(path).read().strip(), flush=True)
time.sleep(600)  # a checkpoint would go here; SIGTERM comes after the grace
"#;
    let dir: PathBuf = cluster.dir.path().join("spec");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("job.py"), script).unwrap();
    let job = JobSpec::from_toml(
        "name = \"moving\"\nprocesses = 1\nmax_restarts = 0\ncommand = [\"python3\", \"job.py\"]\nfiles = [\"job.py\"]\n",
        "job.toml".as_ref(),
    )
    .unwrap()
    .validate_in(&dir)
    .unwrap();
    let id = client.submit(&job).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let lines = |attempt| {
        let client = client.clone();
        let id = id.clone();
        async move {
            let (_, chunks) = client
                .logs(&id, Some(attempt), None, &Default::default())
                .await
                .unwrap();
            chunks.into_iter().map(|c| c.text).collect::<String>()
        }
    };
    while !lines(1).await.contains("ready") {
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let victim = client.job(&id).await.unwrap().placement[0].clone();
    let drain = |extra: &[&str]| {
        let out = cluster.cli(&[&["drain", victim.as_str()][..], extra].concat());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let drained_at = Instant::now();
    drain(&["--reason", "node maintenance"]);
    let end = client.wait(&id).await.unwrap();
    assert_eq!(end.state, JobState::Succeeded, "{:?}", end.reason);
    assert_eq!(
        (end.restarts, end.suspensions, end.attempt),
        (0, 1, 2),
        "a planned move, not a restart"
    );
    assert_ne!(end.placement[0], victim);
    assert!(
        drained_at.elapsed() >= Duration::from_secs(2),
        "the grace was not given"
    );
    let first = lines(1).await;
    assert!(
        first.contains("noticed: worker `") && first.contains("node maintenance"),
        "{first}"
    );
    assert!(lines(2).await.contains("attempt 2"));
    // `tessel job` tells the move from a failure, attempt by attempt.
    let out = cluster.cli(&["job", &id, "-o", "json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ends: Vec<(&str, &str)> = doc["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["end"].as_str().unwrap(),
                a["cause"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(ends, [("Restarting", "suspended"), ("Succeeded", "-")]);
    // Drained: a new job waits for the other worker only... until undone.
    let rec = client.workers().await.unwrap();
    let v = rec
        .iter()
        .find(|w| w.record.info.worker_id == victim)
        .unwrap();
    assert!(v.drained.is_some());
    drain(&["--undo"]);
    let rec = client.workers().await.unwrap();
    assert!(rec.iter().all(|w| w.drained.is_none()));
}
