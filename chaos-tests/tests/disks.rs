//! Properties: a replica whose disk fills up under writes stops
//! acknowledging and exits (nonzero, for its supervisor to restart it)
//! instead of living on while serving nothing; the majority keeps serving
//! and loses no acknowledged write; restarted once space returns, the
//! replica catches up and counts in a quorum again. A worker whose
//! checkpoint folder is full fails its job naming the disk, recording no
//! checkpoint.
//!
//! Each replica's data folder is its own size-limited tmpfs (mounted by
//! the test, which runs as root like the host tests); "full" is a filler
//! file written until ENOSPC, and "space returns" is its removal.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessel_chaos_tests::faults::Tmpfs;
use tessel_chaos_tests::KvCluster;
use tessel_kv::KvStore;

fn value(i: u32) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; 100 << 10];
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

enum Which {
    Follower,
    Leader,
}

async fn full_disk(which: Which) {
    let mut c = KvCluster::prepare();
    let disks: Vec<Tmpfs> = (1..=3)
        .map(|id| Tmpfs::mount(&c.data_dir(id), "48m"))
        .collect();
    c.start_prepared(3, &[]);
    let leader = c.leader().await;
    let victim = match which {
        Which::Leader => leader,
        Which::Follower => c.replica_other_than(&[leader]),
    };
    let kv = Arc::new(c.client());
    kv.put(b"before", b"full").await.unwrap();
    let filler = disks[victim as usize - 1].fill();
    let filled = Instant::now();

    // 100 KB puts until the victim has exited and 20 more were acked.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut acked, mut exited, mut after) = (Vec::new(), None, 0);
    let mut i = 0u32;
    while after < 20 {
        assert!(
            Instant::now() < deadline,
            "replica {victim} (full disk) exited: {exited:?}; {} puts acked",
            acked.len()
        );
        let (key, v) = (format!("full/{i:04}"), value(i));
        let put = tokio::time::timeout(Duration::from_secs(20), kv.put(key.as_bytes(), &v));
        if let Ok(Ok(_)) = put.await {
            acked.push(i);
            after += exited.is_some() as u32;
        }
        i += 1;
        if exited.is_none() {
            exited = c.procs.get_mut(&victim).unwrap().child.try_wait();
            if exited.is_some() {
                eprintln!(
                    "replica {victim} exited {:?} after its disk filled",
                    filled.elapsed()
                );
            }
        }
    }
    let status = exited.unwrap();
    assert!(
        !status.success(),
        "a replica that cannot write exits nonzero: {status}"
    );

    // Nothing acknowledged is lost.
    let kv2 = c.client_without(victim);
    for &i in &acked {
        let v = kv2.try_get(format!("full/{i:04}").as_bytes()).await;
        assert_eq!(v.unwrap(), value(i), "acknowledged put {i}");
    }

    // Space returns; the supervisor (this test) restarts it, and it
    // rejoins.
    std::fs::remove_file(filler).unwrap();
    let back = c.restart_and_prove_rejoined(victim).await;
    eprintln!(
        "replica {victim} restarted and in a quorum {back:?} after space returned; {} puts acked, none lost",
        acked.len()
    );
    let kv = c.client();
    for &i in &acked {
        let v = kv.try_get(format!("full/{i:04}").as_bytes()).await;
        assert_eq!(
            v.unwrap(),
            value(i),
            "acknowledged put {i} after the restart"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_disk_fills_exits_and_rejoins_losing_nothing() {
    full_disk(Which::Follower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_disk_fills_exits_and_rejoins_losing_nothing() {
    full_disk(Which::Leader).await;
}

/// A full checkpoint folder on the workers: the job fails at once naming
/// the file and the disk's error (a job error: another attempt would meet
/// the same disk), and no checkpoint is recorded, since a record follows
/// every block's fsync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_checkpoint_disk_fails_the_job_naming_it_and_records_nothing() {
    use tessel::client::Client;
    use tessel_chaos_tests::mlp::{mlp_dir, mlp_job};
    use tessel_coordinator::scheduler::JobState;
    use tessel_coordinator::Records;

    let cluster = KvCluster::start(3, &[]);
    let root = cluster.dir.path().join("ckpt");
    let disk = Tmpfs::mount(&root, "4m");
    let _filler = disk.fill();
    let flags = tessel_chaos_tests::job_worker_flags(&root);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _workers: Vec<_> = (0..4)
        .map(|i| tessel_chaos_tests::spawn_worker(&cluster, &format!("w{i}"), &flags))
        .collect();
    let kv: Arc<dyn KvStore> = Arc::new(cluster.client());
    let client = Client::from_store(kv.clone());
    let id = client
        .submit(&mlp_job(&mlp_dir(), "job.toml", 300, 1, &root))
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(180), client.wait(&id))
        .await
        .expect("the job ended within 180 s")
        .unwrap();
    let why = end.reason.clone().unwrap_or_default();
    assert_eq!(end.state, JobState::Failed, "{why}");
    assert!(why.contains("No space left on device"), "{why}");
    let records = Records::new(&*kv, &id).checkpoints().await.unwrap();
    assert!(records.is_empty(), "{} checkpoints recorded", records.len());
    eprintln!("the job failed: {why}");
}
