//! Job plans on real worker processes: the MLP demo against a single
//! device, gathering and resharding, a program that does not compile, a
//! bad bundle, a worker killed mid-job or lost during the topology
//! exchange, and a worker's metrics.
//!
//! Organised by the property each test proves.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tessel::job::JobSpec;
use tessel::plan::JobBundle;
use tessel_chaos_tests::{sample, scrape, spawn_worker, spawn_worker_env, tessel_bin, KvCluster};
use tessel_coordinator::attempt::Record;
use tessel_coordinator::jobs::{self, JobAssignment};
use tessel_coordinator::{Item, Records};
use tessel_kv::KvStore;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/mlp-data-parallel")
        .join(name)
}

/// `tessel local SPEC --out DIR`; returns stdout.
fn run_local(spec: &Path, out: &Path) -> String {
    let o = Command::new(tessel_bin())
        .arg("local")
        .arg(spec)
        .arg("--out")
        .arg(out)
        .env("RUST_LOG", "error")
        .output()
        .expect("run tessel local");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "tessel local {} failed:\n{stdout}\n{}",
        spec.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

fn load(path: &Path) -> Vec<f64> {
    let b = tessel::array::read_npy(&std::fs::read(path).unwrap()).unwrap();
    tessel::array::to_f64(&b)
}

/// `final: accuracy A  loss L` → (A, L).
fn final_values(stdout: &str) -> (f64, f64) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("final:"))
        .unwrap_or_else(|| panic!("no final line in\n{stdout}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let value = |name| {
        let i = words.iter().position(|w| *w == name).unwrap();
        words[i + 1].parse::<f64>().unwrap()
    };
    (value("accuracy"), value("loss"))
}

/// The MLP demo: the loss falls below 0.3 and accuracy passes 90% on 4
/// processes × 1 device and on 2 × 2, and both end with the parameters
/// a single device reaches over the same global batches, within 1e-4.
///
/// Why 1e-4: each step's gradient is the mean of per-process means instead
/// of one mean over 256 rows, so sums are rounded in a different order
/// (f32, ~6e-8 relative per operation); 1000 SGD steps at learning rate 1
/// carry that into the parameters (measured: ≤ 1.1e-5 on weights of
/// magnitude up to 3). A wrong all-reduce (sum instead of mean, a rank
/// missing, stale gradients) moves them by far more than 1e-2.
#[test]
fn data_parallel_training_matches_one_device() {
    let dir = tempfile::tempdir().unwrap();
    let reference = run_local(&example("reference.toml"), &dir.path().join("ref"));
    for spec in ["job.toml", "job-2x2.toml"] {
        let out = dir.path().join(spec);
        let stdout = run_local(&example(spec), &out);
        let (accuracy, loss) = final_values(&stdout);
        assert!(loss < 0.3, "{spec}: final loss {loss}");
        assert!(accuracy > 0.9, "{spec}: final accuracy {accuracy}");
        assert_eq!(final_values(&reference).0, accuracy, "{spec}");
        for p in ["w1", "b1", "w2", "b2"] {
            let a = load(&out.join(format!("{p}.npy")));
            let b = load(&dir.path().join("ref").join(format!("{p}.npy")));
            assert_eq!(a.len(), b.len());
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(worst < 1e-4, "{spec}: {p} differs by {worst}");
        }
        // The first report's loss is well above the last one: it fell.
        let first = stdout
            .lines()
            .find(|l| l.starts_with("step"))
            .and_then(|l| l.split("loss ").nth(1))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap();
        assert!(
            first > 2.0 * loss,
            "{spec}: loss went from {first} to {loss}"
        );
    }
}

/// One training-step program over four devices of one process (the
/// all-reduce inside the program, no all_reduce step) ends with the
/// parameters one device reaches over the same batches, within 1e-4 (as
/// above); its arrays stay on the devices: after the first step a step
/// copies at most the two reported scalars between host and device.
#[test]
fn a_global_program_over_four_devices_matches_one_device_and_keeps_its_arrays_there() {
    let dir = tempfile::tempdir().unwrap();
    run_local(&example("reference.toml"), &dir.path().join("ref"));
    let spec = example("../mlp-global-spmd/job.toml");
    let stdout = run_local(&spec, &dir.path().join("global"));
    let (accuracy, loss) = final_values(&stdout);
    assert!(
        loss < 0.3 && accuracy > 0.9,
        "loss {loss}, accuracy {accuracy}"
    );
    for p in ["w1", "b1", "w2", "b2"] {
        let a = load(&dir.path().join("global").join(format!("{p}.npy")));
        let b = load(&dir.path().join("ref").join(format!("{p}.npy")));
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-4, "{p} differs by {worst}");
    }
    let traffic = stdout
        .lines()
        .find(|l| l.contains("host↔device"))
        .unwrap_or_else(|| panic!("no traffic line in\n{stdout}"));
    assert!(
        traffic.contains("then at most 8 B a step"),
        "only the reports' two f32 scalars cross after the first step: {traffic}"
    );
}

/// A plan that gathers a split array, computes on the whole of it, and
/// splits the result again, on 2 processes: every process sees the whole
/// input in order, and the blocks the result is cut into gather back to
/// the whole (a process keeping the wrong block would show).
#[test]
fn gathered_and_resharded_arrays_keep_their_order() {
    let dir = tempfile::tempdir().unwrap();
    let a = tessel_pjrt::HostBuffer::from_slice(&[1f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    std::fs::write(dir.path().join("a.npy"), tessel::array::write_npy(&a)).unwrap();
    std::fs::write(
        dir.path().join("double.mlir"),
        "func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  \
         %0 = stablehlo.add %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n",
    )
    .unwrap();
    let spec = dir.path().join("job.toml");
    std::fs::write(
        &spec,
        "name = \"relayout\"\nprocesses = 2\nmesh = \"data=2\"\nsteps = 2\n\n\
         [programs.double]\nfile = \"double.mlir\"\n\n\
         [arrays.a]\ndtype = \"f32\"\nshape = [4]\nsharding = { split = \"data\", dim = 0 }\n\
         init = { kind = \"npy\", file = \"a.npy\" }\n\n\
         [arrays.b]\ndtype = \"f32\"\nshape = [4]\ninit = { kind = \"constant\", value = 0.0 }\n\n\
         [[plan]]\nop = \"all_gather\"\narray = \"a\"\n\n\
         [[plan]]\nop = \"execute\"\nprogram = \"double\"\ninputs = [\"a\"]\noutputs = [\"b\"]\n\n\
         [[plan]]\nop = \"reshard\"\narray = \"b\"\nsharding = { split = \"data\", dim = 0 }\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    run_local(&spec, &out);
    assert_eq!(load(&out.join("a.npy")), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(load(&out.join("b.npy")), vec![2.0, 4.0, 6.0, 8.0]);
}

/// Puts the bundle of `spec` (with `steps` steps) as job `id` and assigns
/// process i to worker `w{i}`.
async fn submit(kv: &dyn KvStore, id: &str, spec_path: &Path, steps: Option<u64>) {
    let text = std::fs::read_to_string(spec_path).unwrap();
    let mut spec = JobSpec::from_toml(&text, spec_path).unwrap();
    if let Some(s) = steps {
        spec.steps = s;
    }
    let job = spec.validate_in(spec_path.parent().unwrap()).unwrap();
    let bundle = JobBundle::new(&job).encode();
    Records::new(kv, id).put(Item::Spec, &bundle).await.unwrap();
    assign(kv, id, spec.processes).await;
}

async fn assign(kv: &dyn KvStore, id: &str, n: u32) {
    for i in 0..n {
        let a = JobAssignment {
            attempt: id.into(),
            process_index: i,
            num_processes: n,
            topology_timeout_ms: 30_000,
            trace: None,
        };
        jobs::assign(kv, &format!("w{i}"), &a).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_fails_the_running_job_for_everyone() {
    let cluster = KvCluster::start(3, &[]);
    let liveness = ["--heartbeat-ms", "300", "--ttl-ms", "1500"];
    let mut workers: Vec<_> = (0..4)
        .map(|i| spawn_worker(&cluster, &format!("w{i}"), &liveness))
        .collect();
    let kv = cluster.client();
    submit(&kv, "long", &example("job.toml"), Some(10_000_000)).await;
    // Running: the first report (after step 100) is in.
    Records::new(&kv, "long")
        .wait(Item::Report(99), Duration::from_secs(120))
        .await
        .expect("a report within 120 s");
    let killed = Instant::now();
    workers[1].kill();
    let failure = jobs::wait_for_failure(&kv, "long", Duration::from_secs(15))
        .await
        .unwrap()
        .expect("a failure event");
    // Either the lease expired (the worker) or a peer's collective broke
    // first (the transport names the lost rank); both within ttl + 2 s.
    assert!(
        killed.elapsed() < Duration::from_millis(3500),
        "{:?}",
        killed.elapsed()
    );
    let text = failure.to_string();
    assert!(
        failure.worker.as_deref() == Some("w1")
            || text.contains("rank 1")
            || text.contains("127.0.0.1"),
        "{text}"
    );
    // Every surviving process stopped its plan and saw the failure.
    for i in [0, 2, 3] {
        Records::new(&kv, "long")
            .wait(
                Item::Process(i, Record::FailureSeen),
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|e| panic!("process {i} saw no failure: {e}"));
    }
}

/// A worker lost during the topology exchange (stopped as soon as it
/// joined, before it published its local topology) fails the job for
/// everyone within its lease's TTL: the other process stops waiting at
/// once (`process` invariant 8), not after the 30 s topology timeout. The
/// stop races the worker's next steps; a round where the worker published
/// first (its peer then meets the loss in the transfer barrier, another
/// path) is run again with new workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_lost_during_the_topology_exchange_fails_the_job_within_its_ttl() {
    let cluster = KvCluster::start(3, &[]);
    let liveness = ["--heartbeat-ms", "300", "--ttl-ms", "1500"];
    let kv = cluster.client();
    for round in 0..3 {
        let job = format!("boot{round}");
        let names = [format!("a{round}"), format!("b{round}")];
        let workers: Vec<_> = names
            .iter()
            .map(|w| spawn_worker(&cluster, w, &liveness))
            .collect();
        for (i, w) in names.iter().enumerate() {
            let a = JobAssignment {
                attempt: job.clone(),
                process_index: i as u32,
                num_processes: 2,
                topology_timeout_ms: 30_000,
                trace: None,
            };
            jobs::assign(&kv, w, &a).await.unwrap();
        }
        let member = format!("jobs/{job}/members/{}", names[1]);
        kv.get(member.as_bytes(), Duration::from_secs(60))
            .await
            .expect("joined");
        workers[1].child.signal(nix::sys::signal::Signal::SIGSTOP);
        let stopped = Instant::now();
        let local = tessel_topology::keys::local(&job, 1);
        if kv.try_get(local.as_bytes()).await.is_ok() {
            eprintln!("round {round}: the worker published before it was stopped; again");
            continue;
        }
        let failure = jobs::wait_for_failure(&kv, &job, Duration::from_secs(15))
            .await
            .unwrap()
            .expect("a failure event");
        Records::new(&kv, &job)
            .wait(
                Item::Process(0, Record::FailureSeen),
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|e| panic!("process 0 saw no failure: {e} (the job's: {failure})"));
        // TTL 1.5 s, the monitor's notice, the process's stop: well under
        // the topology timeout.
        assert!(
            stopped.elapsed() < Duration::from_secs(6),
            "{:?}",
            stopped.elapsed()
        );
        return;
    }
    panic!("in three rounds the worker published its topology before it could be stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_does_not_compile_fails_the_job_with_the_compilers_message() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.mlir"),
        "func.func public @main(%a: tensor<2xf32>, %b: tensor<2xi32>) -> tensor<2xf32> {\n  %0 = stablehlo.add %a, %b : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}\n",
    )
    .unwrap();
    let spec = dir.path().join("job.toml");
    std::fs::write(
        &spec,
        r#"
name = "bad"
processes = 2
mesh = "data=2"
steps = 1

[programs.bad]
file = "bad.mlir"

[arrays.a]
dtype = "f32"
shape = [2]

[arrays.b]
dtype = "s32"
shape = [2]

[[plan]]
op = "execute"
program = "bad"
inputs = ["a", "b"]
outputs = ["a"]
"#,
    )
    .unwrap();
    let cluster = KvCluster::start(3, &[]);
    let _workers: Vec<_> = (0..2)
        .map(|i| spawn_worker(&cluster, &format!("w{i}"), &[]))
        .collect();
    let kv = cluster.client();
    submit(&kv, "bad", &spec, None).await;
    let failure = jobs::wait_for_failure(&kv, "bad", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the job fails");
    let text = failure.to_string();
    assert!(text.contains("program `bad`"), "{text}");
    assert!(
        text.to_lowercase().contains("type"),
        "the compiler's words: {text}"
    );

    // A bundle that is not one fails the job too, saying so.
    Records::new(&kv, "junk")
        .put(Item::Spec, b"\xff\xff not a bundle")
        .await
        .unwrap();
    assign(&kv, "junk", 2).await;
    let failure = jobs::wait_for_failure(&kv, "junk", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the job fails");
    assert!(failure.to_string().contains("bad job bundle"), "{failure}");
}

/// `tessel worker --metrics-listen`: the worker's job processes record
/// their collectives and transfers, and the worker its job processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_serves_the_metrics_of_its_job_processes() {
    let cluster = KvCluster::start(1, &[]);
    let metrics = ["--metrics-listen", "127.0.0.1:0"];
    let workers: Vec<_> = (0..2)
        .map(|i| {
            spawn_worker(
                &cluster,
                &format!("w{i}"),
                if i == 0 { &metrics } else { &[] },
            )
        })
        .collect();
    let addr = workers[0].metrics.clone().expect("a metrics address");
    let kv = cluster.client();
    let steps = 5;
    submit(&kv, "metered", &example("job-2x2.toml"), Some(steps)).await;
    for i in 0..2 {
        Records::new(&kv, "metered")
            .wait(Item::Process(i, Record::Result), Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("process {i} finished no plan: {e}"));
    }
    let text = scrape(&addr);
    // One gradient all-reduce per step, small enough to ride with the
    // descriptors; the ranks' readiness barrier; both through shared
    // memory (the two workers share this host).
    let all_reduces = sample(
        &text,
        "tessel_collective_seconds_count",
        &[r#"kind="all_reduce""#, r#"algorithm="small""#],
    )
    .unwrap_or_else(|| panic!("no all-reduce timings in\n{text}"));
    assert!(all_reduces >= steps as f64, "{all_reduces} all-reduces");
    assert!(
        sample(
            &text,
            "tessel_collective_seconds_bucket",
            &[r#"kind="barrier""#]
        )
        .is_some(),
        "{text}"
    );
    let sent = sample(
        &text,
        "tessel_transfer_sent_bytes_total",
        &[r#"path="shm""#],
    );
    assert!(sent.is_some_and(|b| b > 0.0), "{text}");
    assert_eq!(
        sample(&text, "tessel_worker_job_processes_running", &[]),
        Some(1.0)
    );
    // The worker's first beat comes an interval and its phase after its
    // registration (`registry` invariant 10), which a short job may
    // outrun: under two seconds at the default interval.
    let beat = |b: f64| b >= 1.0;
    let ok = [r#"outcome="ok""#];
    scraped_until(&addr, "tessel_worker_heartbeats_total", &ok, beat, 10).await;
    // Ending the job ends the process, which the worker counts.
    tessel_coordinator::jobs::finish_job(&kv, "metered")
        .await
        .unwrap();
    let ended = [r#"outcome="ended""#];
    let text = scraped_until(
        &addr,
        "tessel_worker_job_processes_total",
        &ended,
        |n| n == 1.0,
        30,
    )
    .await;
    assert_eq!(
        sample(&text, "tessel_worker_job_processes_running", &[]),
        Some(0.0)
    );
}

/// Scrapes `addr` until the sample `name` with `labels` passes `done`, and
/// returns that scrape; fails the test after `seconds`.
async fn scraped_until(
    addr: &str,
    name: &str,
    labels: &[&str],
    done: impl Fn(f64) -> bool,
    seconds: u64,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let text = scrape(addr);
        if sample(&text, name, labels).is_some_and(&done) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{name} {labels:?} not there within {seconds} s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Assigns process i of job `id` to worker `workers[i]`.
async fn assign_to(kv: &dyn KvStore, id: &str, workers: &[&str]) {
    for (i, w) in workers.iter().enumerate() {
        let a = JobAssignment {
            attempt: id.into(),
            process_index: i as u32,
            num_processes: workers.len() as u32,
            topology_timeout_ms: 30_000,
            trace: None,
        };
        jobs::assign(kv, w, &a).await.unwrap();
    }
}

/// `types` invariant 5 (the topology builder) with real workers, each looking like its own host
/// (its own boot id, so the gradients cross the network): a job whose
/// workers disagree on `--transfer-encryption` fails at bootstrap naming
/// both sides; the same job on workers that all have it off runs to the
/// end over plain TCP, and its topology says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_unencrypted_workers_runs_and_one_that_mixes_settings_is_refused() {
    let cluster = KvCluster::start(3, &[]);
    let spawn = |name: &str, encryption: &str| {
        let flags = ["--devices", "1", "--transfer-encryption", encryption];
        let boot = vec![("TESSEL_BOOT_ID".to_owned(), format!("host-{name}"))];
        spawn_worker_env(&cluster, name, &flags, &boot)
    };
    let _workers: Vec<_> = [("p0", "off"), ("p1", "off"), ("p2", "off"), ("p3", "off")]
        .into_iter()
        .chain([("e3", "on")])
        .map(|(name, e)| spawn(name, e))
        .collect();
    let kv = cluster.client();
    let put = |id: &'static str| {
        let kv = &kv;
        async move {
            let path = example("job.toml");
            let mut spec =
                JobSpec::from_toml(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
            spec.steps = 20;
            let job = spec.validate_in(path.parent().unwrap()).unwrap();
            let bundle = JobBundle::new(&job).encode();
            Records::new(kv, id).put(Item::Spec, &bundle).await.unwrap();
        }
    };

    put("mixed").await;
    assign_to(&kv, "mixed", &["p0", "p1", "p2", "e3"]).await;
    let failure = jobs::wait_for_failure(&kv, "mixed", Duration::from_secs(120))
        .await
        .unwrap()
        .expect("a failure event");
    let text = failure.to_string();
    assert!(
        text.contains("transfer encryption differs within the job")
            && text.contains("on for processes [3], off for [0, 1, 2]"),
        "{text}"
    );

    put("plain").await;
    assign_to(&kv, "plain", &["p0", "p1", "p2", "p3"]).await;
    for i in 0..4 {
        Records::new(&kv, "plain")
            .wait(Item::Process(i, Record::Result), Duration::from_secs(180))
            .await
            .unwrap_or_else(|e| panic!("process {i} has no result: {e}"));
    }
    assert!(jobs::failure_of(&kv, "plain").await.unwrap().is_none());
    let t = tessel_topology::exchange::global(&kv, "plain", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!t.transfer_encrypted());
    assert_eq!(t.num_slices, 4, "four hosts, so the network path");
}
