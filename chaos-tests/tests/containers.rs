//! The Compose deployment as real containers on a private Docker network
//! (`deploy/compose/`, the image from `scripts/image --plugins cpu`): the
//! demo to success against the single-device reference, and faults as a
//! user's cluster sees them: `docker kill` of the coordinator leader,
//! `docker stop` of a worker, `docker network disconnect` of a worker.
//! Needs the Docker Engine, docker-compose and `$TESSEL_IMAGE`
//! (`./scripts/test` builds it). Everything the test starts is removed
//! when it ends, however it ends.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessel::client::Client;
use tessel::job::ValidatedJob;
use tessel_chaos_tests::docker::{exit_code, image, repo, run};
use tessel_chaos_tests::mlp::{mlp_job, mlp_params as params};
use tessel_chaos_tests::{leader_of, tessel_bin};

use tessel_coordinator::scheduler::JobState;
use tessel_coordinator::{Item, Records};
use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;

/// A Compose project, taken down with its volumes and network when
/// dropped.
struct Project {
    name: String,
    net: String,
    dir: tempfile::TempDir,
    image: String,
}

impl Project {
    fn compose(&self) -> Command {
        let mut c = Command::new("docker-compose");
        c.current_dir(repo().join("deploy/compose"))
            .args(["-p", &self.name])
            .env("TESSEL_IMAGE", &self.image)
            .env("NET", &self.net)
            .env("TLS", self.dir.path().join("tls"))
            .env("JOBDIR", self.dir.path().join("job"));
        c
    }

    fn container(&self, service: &str) -> String {
        format!("{}_{service}_1", self.name)
    }

    fn docker(&self, args: &[&str]) -> String {
        run(Command::new("docker").args(args))
    }

    fn addrs(&self) -> Vec<std::net::SocketAddr> {
        (1..=3)
            .map(|i| format!("{}.1{i}:7000", self.net).parse().unwrap())
            .collect()
    }

    fn client(&self) -> RaftKv {
        let tls = tessel_tls::TlsFiles::load(&self.dir.path().join("tls/submit")).unwrap();
        RaftKv::connect(self.addrs(), Some(&tls)).unwrap()
    }

    /// A project's folder (the job, the certificates' place), nothing
    /// started.
    fn new(image: &str) -> Project {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(
            &repo().join("examples/mlp-data-parallel"),
            &dir.path().join("job"),
        );
        let pid = std::process::id();
        Project {
            name: format!("tesseltest{pid}"),
            net: format!("10.{}.{}", 200 + pid % 50, pid % 250),
            dir,
            image: image.to_owned(),
        }
    }

    /// Starts the project: certificates, then every service but the
    /// submitter (`with_submit`: it too).
    fn up(image: &str, with_submit: bool) -> Project {
        let p = Project::new(image);
        run(Command::new(repo().join("deploy/compose/certs"))
            .env("TESSEL_IMAGE", &p.image)
            .env("NET", &p.net)
            .env("TLS", p.dir.path().join("tls")));
        let mut c = p.compose();
        c.args(["up", "-d"]);
        if !with_submit {
            c.args(["worker-1", "worker-2", "worker-3"]);
        }
        run(&mut c);
        p
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let _ = self
            .compose()
            .args(["down", "-v", "--remove-orphans", "-t", "5"])
            .output();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// The 2 × 2 demo with checkpoints and restarts, for the fault tests.
fn faulty_job(project: &Project, steps: u64) -> ValidatedJob {
    let dir = project.dir.path().join("job");
    mlp_job(&dir, "job-2x2.toml", steps, 2, "/data/ckpt/mlp".as_ref())
}

async fn leader(kv: &RaftKv) -> u64 {
    leader_of(kv, Duration::from_secs(60)).await
}

/// `deploy/compose/up` run twice by a user other than root (uid 1000, in
/// the docker group, as a developer's account is): both runs end with the
/// demo's success, the second keeps every certificate, and the containers
/// run as that user and read its keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_up_runs_again_and_again_for_a_caller_other_than_root() {
    use std::os::unix::fs::PermissionsExt;
    let p = Project::new(&image());
    let home = p.dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(p.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    run(Command::new("chown")
        .args(["-R", "1000:1000"])
        .arg(p.dir.path()));
    let docker_gid = run(Command::new("getent").args(["group", "docker"]));
    let docker_gid = docker_gid
        .trim()
        .split(':')
        .nth(2)
        .expect("a docker group")
        .to_owned();
    let up = || {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=1000",
            "--regid=1000",
            &format!("--groups={docker_gid}"),
        ])
        .arg(repo().join("deploy/compose/up"))
        .env("HOME", &home)
        .env("COMPOSE_PROJECT_NAME", &p.name)
        .env("TESSEL_IMAGE", &p.image)
        .env("NET", &p.net)
        .env("TLS", p.dir.path().join("tls"))
        .env("JOBDIR", p.dir.path().join("job"));
        let started = Instant::now();
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "./up as uid 1000 failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        started.elapsed()
    };
    let first = up();
    let cert = |n: &str| std::fs::read(p.dir.path().join("tls").join(n).join("node.pem")).unwrap();
    let before = (cert("coordinator-1"), cert("worker-2"), cert("submit"));
    let second = up();
    assert_eq!(
        before,
        (cert("coordinator-1"), cert("worker-2"), cert("submit")),
        "a second ./certs replaced certificates"
    );
    let user = p.docker(&[
        "inspect",
        "-f",
        "{{.Config.User}}",
        &p.container("worker-1"),
    ]);
    assert_eq!(user.trim(), "1000:1000", "the containers run as the caller");
    eprintln!(
        "compose as uid 1000: ./up {:.1} s, again {:.1} s",
        first.as_secs_f64(),
        second.as_secs_f64()
    );
}

/// `docker-compose up` runs the demo to success (the submitter exits 0),
/// and the parameters equal the single-device reference within 1e-4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_cluster_runs_the_demo_to_the_single_device_result() {
    let p = Project::up(&image(), true);
    let started = Instant::now();
    let code = p.docker(&["wait", &p.container("submit")]);
    assert_eq!(
        code.trim(),
        "0",
        "the submitter failed: {}",
        run(p.compose().args(["logs", "--no-color", "submit"]))
    );
    eprintln!(
        "compose: up → the demo's job succeeded in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let client = Client::from_store(Arc::new(p.client()) as Arc<dyn KvStore>);
    let id = client.list().await.unwrap()[0].id.clone();
    let out = p.dir.path().join("ref");
    run(Command::new(tessel_bin())
        .arg("local")
        .arg(repo().join("examples/mlp-data-parallel/reference.toml"))
        .arg("--out")
        .arg(&out));
    for name in ["w1", "b1", "w2", "b2"] {
        let got = tessel::array::to_f64(&client.fetch(&id, name).await.unwrap());
        let want = tessel::array::to_f64(
            &tessel::array::read_npy(&std::fs::read(out.join(format!("{name}.npy"))).unwrap())
                .unwrap(),
        );
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(diff < 1e-4, "{name}: {diff}");
    }
}

/// Submits `job` and waits (120 s at most) for its report of step 299:
/// it is well under way.
async fn submit_past_step_299(client: &Client, kv: &RaftKv, job: &ValidatedJob) -> String {
    let id = client.submit(job).await.unwrap();
    Records::new(kv, &id)
        .wait(Item::Report(299), Duration::from_secs(120))
        .await
        .unwrap();
    id
}

/// The job succeeded on a second attempt, away from `victim`, with the
/// parameters of the undisturbed run; `planned`: the move was a
/// suspension (counted apart), else a restart after a failure.
async fn moved_and_undisturbed(
    client: &Client,
    id: &str,
    victim: &str,
    want: &[Vec<u8>],
    planned: bool,
) {
    let end = client.wait(id).await.unwrap();
    let (restarts, suspensions) = if planned { (0, 1) } else { (1, 0) };
    assert_eq!(
        (end.state, end.restarts, end.suspensions, end.attempt),
        (JobState::Succeeded, restarts, suspensions, 2),
        "{:?}",
        end.reason
    );
    assert!(!end.placement.iter().any(|w| w == victim));
    assert_eq!(params(client, id).await, want);
}

/// Faults by container mid-job: `docker kill` of the coordinator leader
/// (the job succeeds on its first attempt), `docker stop` of a worker
/// (graceful: its process checkpoints and the job restarts elsewhere before
/// its TTL could pass), `docker network disconnect` of a worker (lost
/// within TTL + 1 s, restarted from its checkpoint); each ends with the
/// parameters of an undisturbed run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_faults_end_with_the_undisturbed_result() {
    let p = Project::up(&image(), false);
    let kv = p.client();
    let client = Client::from_store(Arc::new(p.client()) as Arc<dyn KvStore>);
    let job = faulty_job(&p, 1500);
    let calm = client.submit(&job).await.unwrap();
    let end = client.wait(&calm).await.unwrap();
    assert_eq!(end.state, JobState::Succeeded, "{:?}", end.reason);
    let want = params(&client, &calm).await;

    // The coordinator leader killed.
    let id = submit_past_step_299(&client, &kv, &job).await;
    let l = leader(&kv).await;
    p.docker(&["kill", &p.container(&format!("coordinator-{l}"))]);
    let end = client.wait(&id).await.unwrap();
    assert_eq!(
        (end.state, end.attempt),
        (JobState::Succeeded, 1),
        "{:?}",
        end.reason
    );
    assert_eq!(params(&client, &id).await, want);
    run(p.compose().args(["up", "-d", &format!("coordinator-{l}")]));

    // A worker stopped (SIGTERM): it restarts before the TTL (5 s) could
    // have declared the worker lost.
    let id = submit_past_step_299(&client, &kv, &job).await;
    let victim = client.job(&id).await.unwrap().placement[0].clone();
    let stopped = Instant::now();
    p.docker(&["stop", "-t", "30", &p.container(&victim)]);
    assert_eq!(
        exit_code(&p.container(&victim)),
        0,
        "a SIGTERM stop is a success"
    );
    // A planned move: no restart used.
    moved_and_undisturbed(&client, &id, &victim, &want, true).await;
    eprintln!(
        "docker stop of a worker: job done {:.1} s later",
        stopped.elapsed().as_secs_f64()
    );
    run(p.compose().args(["up", "-d", &victim]));

    // A worker cut off from the network.
    let id = submit_past_step_299(&client, &kv, &job).await;
    let victim = client.job(&id).await.unwrap().placement[1].clone();
    let network = format!("{}_tessel", p.name);
    p.docker(&["network", "disconnect", &network, &p.container(&victim)]);
    moved_and_undisturbed(&client, &id, &victim, &want, false).await;
}

/// A worker container whose certificate comes from another CA is refused
/// by the cluster's coordinators and says so; a coordinator container
/// whose peers do not resolve stays up, says so and keeps retrying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_certificate_is_refused_and_unresolvable_peers_are_retried() {
    let p = Project::up(&image(), false);
    let other = p.dir.path().join("other-ca");
    run(Command::new(tessel_bin())
        .args(["certs", "init"])
        .arg(&other)
        .args(["--hosts", "intruder"]));
    run(Command::new("chown")
        .args(["-R", "10001:10001"])
        .arg(&other));
    let network = format!("{}_tessel", p.name);
    let out = Command::new("timeout")
        .args(["120", "docker", "run", "--rm", "--network", &network, "-v"])
        .arg(format!("{}:/tls:ro", other.display()))
        .args([
            &p.image,
            "worker",
            "--coordinator",
            "coordinator-1:7000,coordinator-2:7000",
        ])
        .args([
            "--tls-dir",
            "/tls",
            "--plugin",
            "cpu",
            "--worker-id",
            "intruder",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a foreign worker started: {err}");
    assert!(err.contains("cluster's CA"), "{err}");
    let workers = run(Command::new(tessel_bin())
        .args([
            "workers",
            "--coordinator",
            &format!("{}.11:7000", p.net),
            "--tls-dir",
        ])
        .arg(p.dir.path().join("tls/submit")));
    assert!(!workers.contains("intruder"), "{workers}");

    let name = format!("{}-lonely", p.name);
    p.docker(&[
        "run",
        "-d",
        "--name",
        &name,
        &p.image,
        "coordinator",
        "--id",
        "1",
        "--listen",
        "0.0.0.0:7000",
        "--peers",
        "1=127.0.0.1:7000,2=nowhere.invalid:7000",
        "--data-dir",
        "/data/r",
        "--insecure",
    ]);
    std::thread::sleep(Duration::from_secs(5));
    let state = p.docker(&["inspect", "-f", "{{.State.Running}}", &name]);
    let logs = Command::new("docker")
        .args(["logs", &name])
        .output()
        .unwrap();
    let _ = Command::new("docker").args(["rm", "-f", &name]).output();
    assert_eq!(state.trim(), "true", "it gave up");
    let text = String::from_utf8_lossy(&logs.stderr);
    assert!(
        text.contains("cannot resolve nowhere.invalid:7000"),
        "{text}"
    );
}

/// An image started with neither `--tls-dir` nor `--insecure` refuses to
/// start, saying why in one line.
#[test]
fn a_container_without_tls_or_insecure_refuses_to_start() {
    let out = Command::new("docker")
        .args([
            "run",
            "--rm",
            &image(),
            "coordinator",
            "--id",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            "/data/r",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "bad input: {err}");
    assert!(
        err.contains("--tls-dir") && err.contains("--insecure"),
        "{err}"
    );
}

/// Every coordinator stopped (SIGTERM: each exits 0) and started again at a
/// new address under its old name, as a rescheduled pod is: the workers,
/// still running, find them by name and hold their leases, and the
/// submitter (which names the coordinators too) runs the demo to success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinators_moved_to_new_addresses_are_found_again_by_name() {
    let p = Project::up(&image(), false);
    let network = format!("{}_tessel", p.name);
    let started = |c: &str| p.docker(&["inspect", "-f", "{{.State.StartedAt}}", c]);
    let workers: Vec<(String, String)> = (1..=3)
        .map(|i| p.container(&format!("worker-{i}")))
        .map(|w| (started(&w), w))
        .collect();
    let names: Vec<String> = (1..=3)
        .map(|i| p.container(&format!("coordinator-{i}")))
        .collect();
    let mut stop = vec!["stop", "-t", "10"];
    stop.extend(names.iter().map(String::as_str));
    p.docker(&stop);
    for (i, name) in (1..=3).zip(&names) {
        assert_eq!(exit_code(name), 0, "coordinator-{i} after SIGTERM");
        p.docker(&["network", "disconnect", &network, name]);
        let (ip, alias) = (format!("{}.3{i}", p.net), format!("coordinator-{i}"));
        p.docker(&[
            "network", "connect", "--ip", &ip, "--alias", &alias, &network, name,
        ]);
    }
    let mut start = vec!["start"];
    start.extend(names.iter().map(String::as_str));
    p.docker(&start);
    let mut up = p.compose();
    up.args(["up", "-d", "--no-deps", "submit"]);
    run(&mut up);
    let submit = p.container("submit");
    let deadline = Instant::now() + Duration::from_secs(240);
    while p
        .docker(&["inspect", "-f", "{{.State.Running}}", &submit])
        .trim()
        == "true"
    {
        assert!(
            Instant::now() < deadline,
            "the submitter still runs after 240 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        exit_code(&submit),
        0,
        "the submitter failed after the move: {}",
        run(p.compose().args(["logs", "--no-color", "submit"]))
    );
    for (before, w) in &workers {
        assert_eq!(&started(w), before, "{w} was restarted");
    }
}

/// Host firewall rules between containers (the bridge's traffic passes
/// `DOCKER-USER`), deleted when dropped.
struct Cut(Vec<Vec<String>>);

impl Cut {
    fn between(a: &str, others: &[String]) -> Cut {
        let mut rules = Vec::new();
        for o in others {
            for (s, d) in [(a, o.as_str()), (o.as_str(), a)] {
                let rule: Vec<String> = ["DOCKER-USER", "-s", s, "-d", d, "-j", "DROP"]
                    .iter()
                    .map(|x| x.to_string())
                    .collect();
                run(Command::new("iptables").arg("-I").args(&rule));
                rules.push(rule);
            }
        }
        Cut(rules)
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        for r in &self.0 {
            let _ = Command::new("iptables").arg("-D").args(r).output();
        }
    }
}

/// The coordinator leader cut off from the other two for 15 s while a
/// client writes: writes go on through the majority, and after the heal
/// every replica's applied index agrees and no acknowledged write is lost;
/// then `docker restart` of every coordinator brings the cluster back from
/// its volumes with every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_and_a_restart_of_every_coordinator_lose_no_acknowledged_write() {
    let p = Project::up(&image(), false);
    let kv = p.client();
    let l = leader(&kv).await;
    let ip = |i: u64| format!("{}.1{i}", p.net);
    let others: Vec<String> = (1..=3).filter(|&i| i != l).map(ip).collect();
    let mut acked = Vec::new();
    {
        let _cut = Cut::between(&ip(l), &others);
        let until = Instant::now() + Duration::from_secs(15);
        let mut n = 0u64;
        while Instant::now() < until {
            let key = format!("partition/{n:06}");
            n += 1;
            if tokio::time::timeout(Duration::from_secs(3), kv.put(key.as_bytes(), b"v"))
                .await
                .is_ok_and(|r| r.is_ok())
            {
                acked.push(key);
            }
        }
    }
    assert!(
        acked.len() > 10,
        "writes stopped during the partition: {} acknowledged",
        acked.len()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let applied: Vec<Option<u64>> = kv
            .cluster_status()
            .await
            .into_iter()
            .map(|(_, s)| s.ok().and_then(|s| s.applied))
            .collect();
        if applied.iter().all(|a| a.is_some() && *a == applied[0]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "applied indexes disagree: {applied:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for key in &acked {
        assert_eq!(
            kv.try_get(key.as_bytes()).await.unwrap(),
            b"v",
            "{key} lost"
        );
    }
    let names: Vec<String> = (1..=3)
        .map(|i| p.container(&format!("coordinator-{i}")))
        .collect();
    let mut restart = vec!["restart", "-t", "10"];
    restart.extend(names.iter().map(String::as_str));
    p.docker(&restart);
    leader(&kv).await;
    for key in &acked {
        assert_eq!(
            kv.try_get(key.as_bytes()).await.unwrap(),
            b"v",
            "{key} lost across the restart"
        );
    }
}
