//! Property: SIGTERM is a graceful stop with exit code 0. The coordinator
//! leader stopped under write load loses no acknowledged write and its log
//! reopens (it restarts from its folder and serves every write); a worker
//! stopped deregisters at once (its lease revoked, not left to expire).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessel_chaos_tests::{spawn_worker, write_in_background, KvCluster as Cluster, Signal};
use tessel_coordinator::registry::{list_workers, WorkerState};
use tessel_kv::KvStore;

/// Waits up to 15 s for `child` to exit; its exit code.
fn exit_code(child: &mut tessel_harness::Child) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait() {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} still runs 15 s after SIGTERM", child.name());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_stopped_leader_exits_0_and_loses_no_acknowledged_write() {
    let mut c = Cluster::start(3, &[]);
    let kv = Arc::new(c.client());
    let writer = write_in_background(kv.clone(), "term", 400);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let old = c.leader().await;
    let p = c.procs.get_mut(&old).unwrap();
    p.signal(Signal::SIGTERM);
    assert_eq!(exit_code(&mut p.child), Some(0), "the leader after SIGTERM");
    let acked = writer.await.unwrap();
    assert!(acked.len() > 300, "{} acknowledged", acked.len());
    // Its log reopens: restarted from its folder, it serves every write.
    c.restart(old);
    let own = c.client_of(old);
    own.put(b"term/after", b"ok").await.unwrap();
    for i in &acked {
        let v = own.try_get(format!("term/{i:04}").as_bytes()).await;
        assert_eq!(v.unwrap(), i.to_le_bytes(), "acknowledged write {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_stopped_worker_exits_0_and_deregisters_at_once() {
    let c = Cluster::start(3, &[]);
    // A TTL far longer than the test: only a revoke ends the lease in time.
    let mut w = spawn_worker(&c, "w-term", &["--ttl-ms", "60000"]);
    let kv = c.client();
    let alive = |all: &[tessel_coordinator::registry::WorkerStatus]| {
        all.iter().any(|s| {
            s.record.info.worker_id == "w-term" && matches!(s.state, WorkerState::Alive { .. })
        })
    };
    assert!(alive(&list_workers(&kv).await.unwrap()));
    w.child.signal(Signal::SIGTERM);
    assert_eq!(exit_code(&mut w.child), Some(0), "the worker after SIGTERM");
    assert!(
        !alive(&list_workers(&kv).await.unwrap()),
        "the worker is still registered as alive after it stopped"
    );
}
