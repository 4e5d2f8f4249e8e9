//! Properties: leases follow real (monotonic) time, never a replica's wall
//! clock: the leader's wall clock stepping an hour ahead expires no lease
//! early, stepping back half an hour delays none, and a lease no longer
//! renewed still ends about its TTL after its last renewal. A worker's
//! wall clock stepping either way mid-job fails no job and costs it no
//! registration.
//!
//! Each replica runs under libfaketime (`LD_PRELOAD`, Debian's `faketime`)
//! with its own offset file, re-read every second; only the wall clock is
//! faked (`FAKETIME_DONT_FAKE_MONOTONIC`), as an NTP step or a resumed VM
//! moves it. Not modelled: clocks that drift (run fast or slow), and jumps
//! past a certificate's validity (a TLS failure; certificates are
//! backdated an hour, so the backward step here is half an hour).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessel_chaos_tests::faults::{faketime_env, faketime_replicas, step_clock};
use tessel_chaos_tests::KvCluster;
use tessel_kv::{KvError, KvStore};

async fn present(kv: &impl KvStore, key: &[u8]) -> bool {
    match kv.try_get(key).await {
        Ok(_) => true,
        Err(KvError::NotFound(_)) => false,
        Err(e) => panic!("reading {}: {e}", String::from_utf8_lossy(key)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_wall_clock_stepping_either_way_expires_no_lease_early_or_late() {
    let mut c = KvCluster::prepare();
    let files = faketime_replicas(&mut c, 3);
    c.start_prepared(3, &[]);
    let leader = c.leader().await;
    let kv = Arc::new(c.client());

    // One lease kept alive (TTL 3 s), one left alone (TTL 30 s).
    let kept = kv.grant(Duration::from_secs(3)).await.unwrap();
    kv.put_with_lease(b"kept", b"v", kept).await.unwrap();
    let long = kv.grant(Duration::from_secs(30)).await.unwrap();
    kv.put_with_lease(b"long", b"v", long).await.unwrap();
    let renewing = Arc::new(AtomicBool::new(true));
    let keeper = {
        let (kv, renewing) = (kv.clone(), renewing.clone());
        tokio::spawn(async move {
            while renewing.load(Ordering::Relaxed) {
                let _ = kv.keep_alive(kept).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    let leader_clock = &files[leader as usize - 1];
    step_clock(leader_clock, "+1h").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(present(&*kv, b"kept").await, "no early expiry after +1 h");
    assert!(present(&*kv, b"long").await, "no early expiry after +1 h");

    step_clock(leader_clock, "-30m").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(present(&*kv, b"kept").await, "alive after -30 min");

    // Renewals stop: the lease ends about its TTL later, not 30 min later.
    renewing.store(false, Ordering::Relaxed);
    keeper.await.unwrap();
    let stopped = Instant::now();
    while present(&*kv, b"kept").await {
        assert!(
            stopped.elapsed() < Duration::from_secs(3 + 5),
            "a lease no longer renewed outlived its TTL by 5 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        stopped.elapsed() >= Duration::from_secs(2),
        "ended {:?} after the last renewal's TTL of 3 s began",
        stopped.elapsed()
    );
    assert!(present(&*kv, b"long").await, "the 30 s lease lives on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_wall_clock_stepping_mid_job_fails_nothing() {
    use tessel::client::Client;
    use tessel_chaos_tests::mlp::{mlp_dir, mlp_job};
    use tessel_chaos_tests::{job_worker_flags, spawn_worker_env};
    use tessel_coordinator::scheduler::JobState;
    use tessel_coordinator::{keys, Item, Records};

    let c = KvCluster::start(3, &[]);
    let ckpt = c.dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    let flags = job_worker_flags(&ckpt);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let clock = c.dir.path().join("clock-w0");
    let env = faketime_env(&clock);
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let env = if i == 0 { env.as_slice() } else { &[] };
            spawn_worker_env(&c, &format!("w{i}"), &flags, env)
        })
        .collect();
    let kv: Arc<dyn KvStore> = Arc::new(c.client());
    let incarnation = kv
        .try_get(keys::incarnation("w0").as_bytes())
        .await
        .unwrap();
    let client = Client::from_store(kv.clone());
    let id = client
        .submit(&mlp_job(&mlp_dir(), "job.toml", 3000, 0, &ckpt))
        .await
        .unwrap();
    Records::new(&*kv, &id)
        .wait(Item::Report(99), Duration::from_secs(120))
        .await
        .expect("the job reached step 100");
    step_clock(&clock, "+1h").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    step_clock(&clock, "-30m").await;
    let end = tokio::time::timeout(Duration::from_secs(300), client.wait(&id))
        .await
        .expect("the job ended")
        .unwrap();
    assert_eq!(end.state, JobState::Succeeded, "{:?}", end.reason);
    assert_eq!((end.attempt, end.restarts), (1, 0));
    let now = kv
        .try_get(keys::incarnation("w0").as_bytes())
        .await
        .unwrap();
    assert_eq!(now, incarnation, "w0 kept its registration");
    drop(workers);
}
