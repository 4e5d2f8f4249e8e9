//! Workers, the registry and the topology exchange, as real processes: a
//! 3-replica coordinator cluster and `tessel worker` processes with the CPU
//! plugin on loopback, killed with SIGKILL (workers and coordinators).
//!
//! Organised by the property each test proves.

use std::time::{Duration, Instant};

use tessel_chaos_tests::{spawn_worker, tessel_bin, KvCluster, WorkerProc};
use tessel_coordinator::attempt::Record;
use tessel_coordinator::jobs::{self, JobAssignment};
use tessel_coordinator::{registry, CoordinatorError};
use tessel_coordinator::{Item, Records};
use tessel_kv::KvStore;
use tessel_topology::GlobalTopology;

async fn assign_all(kv: &dyn KvStore, job: &str, workers: &[&str], n: u32, timeout_ms: u64) {
    for (i, w) in workers.iter().enumerate() {
        let a = JobAssignment {
            attempt: job.into(),
            process_index: i as u32,
            num_processes: n,
            topology_timeout_ms: timeout_ms,
            trace: None,
        };
        jobs::assign(kv, w, &a).await.unwrap();
    }
}

/// Every process's topology digest, once all published them.
async fn digests(kv: &dyn KvStore, job: &str, n: u32, wait: Duration) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            Records::new(kv, job)
                .wait(Item::Process(i, Record::Topology), wait)
                .await
                .unwrap_or_else(|e| panic!("process {i} of {job} published no topology: {e}")),
        );
    }
    out
}

async fn published(kv: &dyn KvStore, job: &str) -> GlobalTopology {
    tessel_topology::exchange::global(kv, job, Duration::from_secs(5))
        .await
        .unwrap()
}

fn start_workers(cluster: &KvCluster, n: usize, extra: &[&str]) -> Vec<WorkerProc> {
    (0..n)
        .map(|i| spawn_worker(cluster, &format!("w{i}"), extra))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_with_four_devices_build_one_identical_topology() {
    let cluster = KvCluster::start(3, &[]);
    let _workers = start_workers(&cluster, 4, &["--devices", "4"]);
    let kv = cluster.client();
    assign_all(&kv, "topo", &["w0", "w1", "w2", "w3"], 4, 30_000).await;
    let d = digests(&kv, "topo", 4, Duration::from_secs(60)).await;
    assert!(
        d.windows(2).all(|w| w[0] == w[1]),
        "same topology everywhere"
    );
    let t = published(&kv, "topo").await;
    assert_eq!(t.num_devices(), 16);
    let ids: Vec<u32> = t.devices.iter().map(|d| d.id).collect();
    assert_eq!(ids, (0..16).collect::<Vec<_>>(), "unique, dense global ids");
    for (p, entry) in t.processes.iter().enumerate() {
        let want: Vec<u32> = (p as u32 * 4..p as u32 * 4 + 4).collect();
        assert_eq!(
            entry.device_ids, want,
            "process {p} owns a contiguous block"
        );
    }
    // Every process published its transfer endpoint in the job's
    // directory (its local topology, not the global one), and all of them
    // pass the job's barrier over those endpoints.
    let directory = tessel_topology::exchange::directory(&kv, "topo", 4)
        .await
        .expect("every process's local topology");
    let endpoints: std::collections::BTreeSet<_> = directory
        .iter()
        .map(|p| {
            let a: std::net::SocketAddr = p
                .transfer_endpoint
                .as_deref()
                .expect("a transfer endpoint")
                .parse()
                .expect("an address");
            a
        })
        .collect();
    assert_eq!(endpoints.len(), 4, "one endpoint per process");
    for i in 0..4 {
        let ms = Records::new(&kv, "topo")
            .wait(
                Item::Process(i, Record::TransferReady),
                Duration::from_secs(60),
            )
            .await
            .unwrap_or_else(|e| panic!("process {i} never passed the transfer barrier: {e}"));
        let ms: f64 = String::from_utf8(ms).unwrap().parse().unwrap();
        assert!(ms >= 0.0);
    }
    assert_eq!(
        sha256sum_hex(&t.encode()).as_bytes(),
        &d[0][..],
        "the digest is of the published topology"
    );
    // Every worker is registered, alive, in the job.
    let ws = registry::list_workers(&kv).await.unwrap();
    assert_eq!(ws.len(), 4);
    assert!(ws
        .iter()
        .all(|w| matches!(w.state, registry::WorkerState::Alive { .. })
            && w.jobs == vec!["topo".to_string()]));

    // The same, through the CLI.
    let coordinators: Vec<String> = cluster.addrs().iter().map(|a| a.to_string()).collect();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(tessel_bin())
            .args(args)
            .args(["--coordinator", &coordinators.join(",")])
            .arg("--tls-dir")
            .arg(cluster.tls_dir())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let table = cli(&["workers"]);
    for w in ["w0", "w1", "w2", "w3"] {
        let row = table.lines().find(|l| l.starts_with(w)).expect(w);
        assert!(
            row.contains("alive") && row.contains("4×cpu") && row.ends_with("topo"),
            "{row}"
        );
    }
    let topo = cli(&["topology", "--job", "topo"]);
    assert_eq!(topo.lines().count(), 17, "a header and 16 devices:\n{topo}");
    let json: serde_json::Value =
        serde_json::from_str(&cli(&["topology", "--job", "topo", "-o", "json"])).unwrap();
    assert_eq!(json["topology"]["devices"].as_array().unwrap().len(), 16);
}

/// SHA-256 by sha256sum(1): an implementation independent of the worker's.
fn sha256sum_hex(bytes: &[u8]) -> String {
    use std::process::{Command, Stdio};
    let mut c = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    std::io::Write::write_all(c.stdin.as_mut().unwrap(), bytes).unwrap();
    drop(c.stdin.take());
    let out = c.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.split_whitespace().next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_fails_the_job_for_everyone_within_ttl_plus_one_second() {
    let cluster = KvCluster::start(3, &[]);
    let liveness = ["--heartbeat-ms", "300", "--ttl-ms", "1500"];
    let mut workers = start_workers(&cluster, 3, &liveness);
    let kv = cluster.client();
    assign_all(&kv, "fail", &["w0", "w1", "w2"], 3, 30_000).await;
    digests(&kv, "fail", 3, Duration::from_secs(60)).await;
    // Up means past the transfer barrier too: kill only then, so the
    // failure comes from the lease, not from a barrier cut short.
    for i in 0..3 {
        Records::new(&kv, "fail")
            .wait(
                Item::Process(i, Record::TransferReady),
                Duration::from_secs(30),
            )
            .await
            .unwrap();
    }
    let killed_at = Instant::now();
    workers[2].kill();
    let failure = jobs::wait_for_failure(&kv, "fail", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("a failure event");
    let after = killed_at.elapsed();
    assert!(
        after <= Duration::from_millis(1500) + Duration::from_secs(1),
        "failure event {after:?} after the kill"
    );
    assert_eq!(failure.worker.as_deref(), Some("w2"));
    assert_eq!(failure.incarnation, Some(1));
    // The surviving peers saw it too.
    for i in 0..2 {
        let seen = Records::new(&kv, "fail")
            .wait(
                Item::Process(i, Record::FailureSeen),
                Duration::from_secs(3),
            )
            .await
            .unwrap();
        assert!(String::from_utf8_lossy(&seen).contains("w2"));
    }
    // A restart is a new incarnation; the stale one is refused.
    let restarted = spawn_worker(&cluster, "w2", &liveness);
    assert_eq!(restarted.incarnation, 2);
    assert!(matches!(
        registry::check_current(&kv, "w2", 1).await,
        Err(CoordinatorError::StaleIncarnation {
            incarnation: 1,
            current: Some(2),
            ..
        })
    ));
    let stale = registry::Registration {
        worker_id: "w2".into(),
        incarnation: 1,
        lease: 0,
        renewed_at: tokio::time::Instant::now(),
    };
    assert!(jobs::join_job(&kv, "next", &stale).await.is_err());
    registry::check_current(&kv, "w2", 2).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_completes_when_the_coordinator_leader_is_killed() {
    let mut cluster = KvCluster::start(3, &[]);
    let _workers = start_workers(&cluster, 4, &["--devices", "2"]);
    let kv = cluster.client();
    let leader = cluster.leader().await;
    assign_all(&kv, "boot", &["w0", "w1", "w2", "w3"], 4, 60_000).await;
    cluster.procs.get_mut(&leader).unwrap().kill();
    let d = digests(&kv, "boot", 4, Duration::from_secs(60)).await;
    assert!(d.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(published(&kv, "boot").await.num_devices(), 8);
    // The new leader renewed every lease: no worker was declared dead for
    // the seconds in which nobody could renew.
    assert_eq!(
        jobs::wait_for_failure(&kv, "boot", Duration::from_secs(2))
            .await
            .unwrap(),
        None
    );
    let ws = registry::list_workers(&kv).await.unwrap();
    assert!(ws
        .iter()
        .all(|w| matches!(w.state, registry::WorkerState::Alive { .. })));
}

/// A follower coordinator SIGKILLed loses no worker, with the job workers'
/// liveness (300 ms beats, 1.5 s TTL): the workers whose keep-alive stream
/// went to it (about half) renew through another replica within a beat
/// (client `keep_alives` invariant 5; before, within about a second, which
/// this TTL also allowed: it passed 2 of 2 runs with that build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_coordinator_follower_loses_no_worker() {
    let mut cluster = KvCluster::start(3, &[]);
    let liveness = ["--heartbeat-ms", "300", "--ttl-ms", "1500"];
    let mut workers = start_workers(&cluster, 6, &liveness);
    let leader = cluster.leader().await;
    let follower = cluster.replica_other_than(&[leader]);
    cluster.procs.get_mut(&follower).unwrap().kill();
    // Four TTLs; a worker whose lease expired registers again meanwhile.
    for (i, w) in workers.iter_mut().enumerate() {
        let wait = if i == 0 {
            Duration::from_secs(6)
        } else {
            Duration::from_millis(100)
        };
        assert_eq!(w.registered_again(wait), None, "w{i} lost its lease");
    }
    let kv = cluster.client_without(follower);
    for w in registry::list_workers(&kv).await.unwrap() {
        assert!(
            matches!(w.state, registry::WorkerState::Alive { incarnation: 1, .. }),
            "{}: {:?}",
            w.record.info.worker_id,
            w.state
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_assignments_fail_clearly_and_never_hang_past_the_timeout() {
    let cluster = KvCluster::start(3, &[]);
    let _workers = start_workers(&cluster, 3, &[]);
    let kv = cluster.client();
    let timeout_ms = 2_000;
    let bound = Duration::from_millis(timeout_ms) + Duration::from_secs(3);

    // Two workers claim process index 1.
    for (w, i) in [("w0", 0), ("w1", 1), ("w2", 1)] {
        let a = JobAssignment {
            attempt: "dup".into(),
            process_index: i,
            num_processes: 3,
            topology_timeout_ms: timeout_ms,
            trace: None,
        };
        jobs::assign(&kv, w, &a).await.unwrap();
    }
    let f = jobs::wait_for_failure(&kv, "dup", bound)
        .await
        .unwrap()
        .expect("the duplicate fails the job");
    assert!(
        f.reason.contains("already taken") || f.reason.contains("never arrived"),
        "{f}"
    );

    // Process 1 was told the job has 3 processes; it has 2.
    let started = Instant::now();
    for (w, i, n) in [("w0", 0, 2), ("w1", 1, 3)] {
        let a = JobAssignment {
            attempt: "count".into(),
            process_index: i,
            num_processes: n,
            topology_timeout_ms: timeout_ms,
            trace: None,
        };
        jobs::assign(&kv, w, &a).await.unwrap();
    }
    let f = jobs::wait_for_failure(&kv, "count", bound)
        .await
        .unwrap()
        .expect("a wrong count fails the job");
    assert!(f.reason.contains("expects a job of 3 processes"), "{f}");
    assert!(started.elapsed() < bound);

    // Process 2 never arrives.
    let started = Instant::now();
    assign_all(&kv, "absent", &["w0", "w1"], 3, timeout_ms).await;
    let f = jobs::wait_for_failure(&kv, "absent", bound)
        .await
        .unwrap()
        .expect("a missing process fails the job");
    assert!(f.reason.contains("never arrived: [2]"), "{f}");
    assert!(started.elapsed() < bound, "{:?}", started.elapsed());
}

#[test]
fn tessel_local_prints_the_topology_and_leaves_nothing_behind() {
    let child = std::process::Command::new(tessel_bin())
        .args([
            "local",
            "--workers",
            "3",
            "--devices-per-worker",
            "2",
            "--print-topology",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let t: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(t["devices"].as_array().unwrap().len(), 6);
    assert_eq!(t["processes"].as_array().unwrap().len(), 3);
    assert!(dirs_of(pid).is_empty(), "temp folder removed");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(children_of_local(), 0, "no process outlives tessel local");
}

/// `tessel local --keep-running`, waiting until it printed the topology.
fn local_kept_running() -> std::process::Child {
    use std::io::BufRead;
    let mut child = std::process::Command::new(tessel_bin())
        .args([
            "local",
            "--workers",
            "2",
            "--print-topology",
            "--keep-running",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    // The JSON ends with a closing brace alone on its line.
    assert!(lines.any(|l| l.unwrap() == "}"), "the topology was printed");
    child
}

fn signal(child: &std::process::Child, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([format!("-{sig}"), child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn ctrl_c_stops_every_child_of_tessel_local_and_removes_its_folder() {
    let mut child = local_kept_running();
    assert!(children_of_local() > 0, "the cluster is up");
    assert_eq!(dirs_of(child.id()).len(), 1, "its folder, named by its pid");
    signal(&child, "INT");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    wait_until("no child left", || children_of_local() == 0);
    assert!(dirs_of(child.id()).is_empty(), "temp folder removed");
}

#[test]
fn children_exit_when_tessel_local_is_killed() {
    let mut child = local_kept_running();
    signal(&child, "KILL");
    let _ = child.wait();
    // Nobody could clean up after SIGKILL, but every child notices its
    // parent is gone (stdin closes) and exits.
    wait_until("no child left", || children_of_local() == 0);
    // Its folder stays until the next scratch folder of its kind is made.
    let left = dirs_of(child.id());
    assert_eq!(left.len(), 1, "{left:?}");
    let _next = tessel_harness::scratch::scratch_dir("local").unwrap();
    assert!(
        dirs_of(child.id()).is_empty(),
        "swept as its process is gone"
    );
}

/// `tessel local` folders of process `pid` (`tessel::scratch`).
fn dirs_of(pid: u32) -> Vec<String> {
    let prefix = format!("tessel-local-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Processes whose command line names a `tessel local` folder.
fn children_of_local() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains("tessel-local-"))
        .count()
}
