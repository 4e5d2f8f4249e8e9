//! Property: the replicated key-value service, run as separate OS
//! processes on loopback with real disks, survives the loss of a minority of
//! replicas (and of all of them, restarted from disk) without losing an
//! acknowledged write; lagging replicas catch up; membership can change.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tessel_chaos_tests::{write_in_background, KvCluster as Cluster, Signal};
use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_reads_through_different_replicas_are_linearizable() {
    let c = Cluster::start(3, &[]);
    let (k1, k2, k3) = (c.client_of(1), c.client_of(2), c.client_of(3));
    for (i, w) in [&k1, &k2, &k3].iter().enumerate() {
        let key = format!("lin/{i}");
        w.put(key.as_bytes(), b"v").await.unwrap();
        // Acknowledged through one replica, visible at once through every one.
        for r in [&k1, &k2, &k3] {
            assert_eq!(r.try_get(key.as_bytes()).await.unwrap(), b"v");
        }
    }
    // A blocking get on replica 2 is woken by a put on replica 3.
    let (got, ()) = tokio::join!(k2.get(b"wake/me", Duration::from_secs(20)), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        k3.insert(b"wake/me", b"now").await.unwrap();
    });
    assert_eq!(got.unwrap(), b"now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_under_write_load_loses_no_acknowledged_write() {
    let mut c = Cluster::start(3, &[]);
    let kv = Arc::new(c.client());
    let writer = write_in_background(kv.clone(), "load", 400);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let old = c.leader().await;
    c.procs.get_mut(&old).unwrap().kill();
    let acked = writer.await.unwrap();
    assert!(
        acked.len() > 300,
        "writes continue after the kill: {} acknowledged",
        acked.len()
    );
    let new = c.leader().await;
    assert_ne!(new, old, "a new leader was elected");
    let kv = c.client_without(old);
    for i in &acked {
        let v = kv.try_get(format!("load/{i:04}").as_bytes()).await.unwrap();
        assert_eq!(v, i.to_le_bytes(), "acknowledged write {i} is readable");
    }
    kv.put(b"after/kill", b"ok").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_every_replica_and_restarting_from_disk_loses_nothing() {
    let mut c = Cluster::start(3, &[]);
    let kv = c.client();
    for i in 0..100u32 {
        kv.put(format!("durable/{i}").as_bytes(), &i.to_le_bytes())
            .await
            .unwrap();
    }
    let lease_free_revision = kv.revision().await.unwrap();
    for p in c.procs.values_mut() {
        p.kill();
    }
    for id in 1..=3 {
        c.restart(id);
    }
    let kv = c.client();
    for i in 0..100u32 {
        assert_eq!(
            kv.try_get(format!("durable/{i}").as_bytes()).await.unwrap(),
            i.to_le_bytes()
        );
    }
    assert!(kv.revision().await.unwrap() >= lease_free_revision);
    kv.put(b"after/restart", b"ok").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_follower_catches_up_by_snapshot_after_compaction() {
    let c = Cluster::start(3, &["--snapshot-every", "50", "--keep-log-entries", "0"]);
    let leader = c.leader().await;
    let follower = *c.procs.keys().find(|id| **id != leader).unwrap();
    let status_of = |statuses: &[(
        String,
        Result<tessel_kv_service::wire::ReplicaStatus, tessel_kv::KvError>,
    )],
                     id: u64| {
        statuses
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok())
            .find(|s| s.id == id)
            .cloned()
    };
    let applied_before = status_of(&c.client().cluster_status().await, follower)
        .unwrap()
        .applied
        .unwrap_or(0);
    c.procs[&follower].signal(Signal::SIGSTOP);
    let kv = c.client_without(follower);
    for i in 0..300u32 {
        kv.put(format!("snap/{i}").as_bytes(), &i.to_le_bytes())
            .await
            .unwrap();
    }
    // Purging is the leader's own business, after a snapshot and once no
    // AppendEntries to the stopped follower is in flight (each waits out
    // its deadline, the heartbeat interval): wait for it, with a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let purged = loop {
        let purged = status_of(&kv.cluster_status().await, leader)
            .unwrap()
            .purged
            .unwrap_or(0);
        if purged > applied_before || std::time::Instant::now() > deadline {
            break purged;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        purged > applied_before,
        "the leader compacted past the follower (purged {purged}, follower applied {applied_before})"
    );
    c.procs[&follower].signal(Signal::SIGCONT);
    // The follower's log position was compacted away on the leader: it
    // can only catch up by installing a snapshot.
    let target = kv.revision().await.unwrap();
    let mut caught_up = false;
    for _ in 0..150 {
        let statuses = c.client().cluster_status().await;
        let rev = |id: u64| {
            statuses
                .iter()
                .filter_map(|(_, s)| s.as_ref().ok())
                .find(|s| s.id == id)
                .map(|s| (s.revision, s.keys))
        };
        if rev(follower).is_some_and(|(r, _)| r >= target) && rev(follower) == rev(leader) {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        caught_up,
        "the follower reached the leader's revision and key count"
    );
    let only_follower = c.client_of(follower);
    assert_eq!(
        only_follower.try_get(b"snap/299").await.unwrap(),
        299u32.to_le_bytes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_replica_joins_and_one_is_removed() {
    let mut c = Cluster::start(3, &[]);
    let kv = c.client();
    kv.put(b"before/join", b"1").await.unwrap();
    let fourth = c.spawn(4, "127.0.0.1:0".into(), Some(c.procs[&1].addr), &[]);
    c.procs.insert(4, fourth);
    let only_new = c.client_of(4);
    assert_eq!(only_new.try_get(b"before/join").await.unwrap(), b"1");
    c.client().remove_replica(1).await.unwrap();
    c.procs.get_mut(&1).unwrap().kill();
    let rest: Vec<SocketAddr> = [2u64, 3, 4].iter().map(|id| c.procs[id].addr).collect();
    let kv = RaftKv::connect(rest, Some(&c.tls)).unwrap();
    kv.put(b"after/remove", b"2").await.unwrap();
    let statuses = kv.cluster_status().await;
    for (_, s) in statuses {
        let s = s.unwrap();
        let ids: Vec<u64> = s.members.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, vec![2, 3, 4], "replica {} sees the new voters", s.id);
    }
}

/// `tessel cluster status` tells a script what state the replicas are in:
/// 0 with all three answering and one leader, 3 with one replica down (the
/// other two still agree), 4 with two down (no quorum, no agreed leader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_exits_3_with_a_replica_down_and_4_without_quorum() {
    let mut c = Cluster::start(3, &[]);
    let leader = c.leader().await;
    let addrs: Vec<String> = c.procs.values().map(|p| p.addr.to_string()).collect();
    let status = |c: &Cluster| {
        let out = std::process::Command::new(tessel_chaos_tests::tessel_bin())
            .args(["cluster", "status", "--coordinator", &addrs.join(",")])
            .arg("--tls-dir")
            .arg(c.tls_dir())
            .output()
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let (code, out) = status(&c);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("leader {leader}")), "{out}");
    let follower = *c.procs.keys().find(|id| **id != leader).unwrap();
    c.procs.get_mut(&follower).unwrap().kill();
    let (code, out) = status(&c);
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("did not answer"), "{out}");
    // The survivor may still remember the old leader: one voter of three
    // is no quorum all the same.
    c.procs.get_mut(&leader).unwrap().kill();
    let (code, out) = status(&c);
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains("no agreed leader") && out.contains("no quorum"),
        "{out}"
    );
}
