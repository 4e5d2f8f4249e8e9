//! `tessel kv --kv etcd://…` against a real 3-member etcd cluster. Built only
//! with `--features etcd`.
#![cfg(feature = "etcd")]

use std::process::{Command, Output};

use tessel_kv_service::etcd::server::EtcdServers;

fn tessel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(args)
        .output()
        .expect("run tessel")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_commands_work_against_etcd() {
    let etcd = EtcdServers::start(3).await.unwrap();
    let url = etcd.url();
    let kv = |rest: &[&str]| {
        let mut a = vec!["kv", "--kv", url.as_str()];
        a.extend_from_slice(rest);
        tessel(&a)
    };
    let o = kv(&["insert", "jobs/a", "1"]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).starts_with("revision "));
    let dup = kv(&["insert", "jobs/a", "2"]);
    assert_eq!(dup.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&dup.stderr).contains("already exists"),
        "{dup:?}"
    );
    assert_eq!(
        stdout(&kv(&["get", "jobs/a", "--timeout-ms", "1000"])),
        "1\n"
    );
    assert_eq!(stdout(&kv(&["incr", "jobs/n", "5"])), "5\n");
    let list = stdout(&kv(&["list", "jobs/"]));
    assert!(
        list.contains("jobs/a\t1") && list.contains("jobs/n\t5"),
        "{list}"
    );
    let missing = kv(&["get", "jobs/none", "--timeout-ms", "300"]);
    assert_eq!(missing.status.code(), Some(7), "a deadline passed");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("deadline"));
}

#[test]
fn a_malformed_etcd_url_is_refused() {
    let o = tessel(&["kv", "--kv", "http://127.0.0.1:2379", "try-get", "k"]);
    assert_eq!(o.status.code(), Some(2), "bad input");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("etcd://"),
        "{o:?}"
    );
}

/// Kills its child when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str]) -> Child {
    Child(
        Command::new(env!("CARGO_BIN_EXE_tessel"))
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("TESSEL_TEST_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn tessel"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_and_the_coordinator_run_on_etcd() {
    use std::time::{Duration, Instant};
    use tessel_coordinator::attempt::Record;
    use tessel_coordinator::jobs::{self, JobAssignment};
    use tessel_coordinator::{Item, Records};
    use tessel_kv_service::etcd::{EtcdKv, EtcdOptions};

    let etcd = EtcdServers::start(3).await.unwrap();
    let url = etcd.url();
    let _monitor = spawn(&["coordinator", "--kv", &url]);
    let worker = |id: &str| {
        spawn(&[
            "worker",
            "--kv",
            &url,
            "--plugin",
            "cpu",
            "--devices",
            "2",
            "--worker-id",
            id,
            "--heartbeat-ms",
            "500",
            "--ttl-ms",
            "2000",
            // Transfers between workers: no cluster CA in this test.
            "--insecure",
        ])
    };
    let _w0 = worker("w0");
    let mut w1 = worker("w1");
    let kv = EtcdKv::connect(&etcd.endpoints(), EtcdOptions::default())
        .await
        .unwrap();
    for i in 0..2u32 {
        let a = JobAssignment {
            attempt: "e".into(),
            process_index: i,
            num_processes: 2,
            topology_timeout_ms: 60_000,
            trace: None,
        };
        jobs::assign(&kv, &format!("w{i}"), &a).await.unwrap();
    }
    let mut digests = Vec::new();
    for i in 0..2 {
        digests.push(
            Records::new(&kv, "e")
                .wait(Item::Process(i, Record::Topology), Duration::from_secs(60))
                .await
                .unwrap(),
        );
    }
    assert_eq!(digests[0], digests[1], "one topology");
    // Kill only once both passed the transfer barrier, so the failure comes
    // from the lease, not from a barrier cut short.
    for i in 0..2 {
        Records::new(&kv, "e")
            .wait(
                Item::Process(i, Record::TransferReady),
                Duration::from_secs(60),
            )
            .await
            .unwrap();
    }
    // SIGKILL a worker: its etcd lease (2 s) expires and the job fails.
    let killed = Instant::now();
    let _ = w1.0.kill();
    let f = jobs::wait_for_failure(&kv, "e", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("a failure event");
    assert_eq!(f.worker.as_deref(), Some("w1"));
    assert!(killed.elapsed() < Duration::from_secs(2) + Duration::from_secs(2));
}
