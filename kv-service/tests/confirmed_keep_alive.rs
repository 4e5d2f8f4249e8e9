//! Property (`renewals` invariant 5): a keep-alive that reaches a leader
//! whose last acknowledgement by a majority is too old to act on waits for
//! the next one and is renewed from memory, not written to the log.
//!
//! Two real replicas; the leader reaches its follower through a UDP relay
//! that can drop every datagram, as a follower too busy or cut off does.
//! Elections are slowed (3–4 s) so that the follower stays a follower
//! while the leader's acknowledgement ages past half its lease (2 s).
//! Before, such a keep-alive was refused on the stream and then written to
//! the log as a request: an entry per keep-alive, from the leader least
//! able to afford it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;
use tessel_kv_service::raft::node::{wait_for_leader, Replica, ReplicaConfig};
use tessel_kv_service::raft::wal::LogIo;

mod udp_relay;
use udp_relay::relay;

fn slow_elections() -> openraft::Config {
    openraft::Config {
        election_timeout_min: 3000,
        election_timeout_max: 4000,
        ..ReplicaConfig::default_raft()
    }
}

async fn start(dir: &std::path::Path, id: u64, peers: BTreeMap<u64, String>) -> Replica {
    Replica::start(ReplicaConfig {
        id,
        listen: "127.0.0.1:0".parse().unwrap(),
        peers,
        data_dir: dir.join(format!("r{id}")),
        tls: None,
        raft: slow_elections(),
        log_io: LogIo::Direct,
    })
    .await
    .unwrap()
}

async fn last_log_index(kv: &RaftKv) -> Option<u64> {
    kv.cluster_status()
        .await
        .into_iter()
        .find_map(|(_, s)| s.ok())
        .and_then(|s| s.last_log_index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_to_an_unacknowledged_leader_waits_for_the_next_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let any = "127.0.0.1:0".to_string();
    let leader = start(dir.path(), 1, BTreeMap::from([(1, any)])).await;
    assert!(
        wait_for_leader(&[&leader], Duration::from_secs(10))
            .await
            .is_some(),
        "a cluster of one elects itself"
    );
    let follower = start(dir.path(), 2, BTreeMap::new()).await;
    let cut = Arc::new(AtomicBool::new(false));
    let via = relay(follower.local_addr().unwrap(), cut.clone()).await;
    let kv = RaftKv::connect(vec![leader.local_addr().unwrap()], None).unwrap();
    kv.add_replica(2, via).await.unwrap();
    let lease = kv.grant(Duration::from_secs(60)).await.unwrap();
    kv.put_with_lease(b"held", b"v", lease).await.unwrap();
    kv.keep_alive(lease).await.unwrap();
    let before = last_log_index(&kv).await;

    // Past half the leader lease without an acknowledgement, then the
    // follower back while the keep-alive waits.
    cut.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let heal = {
        let cut = cut.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            cut.store(false, Ordering::Relaxed);
        })
    };
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(10), kv.keep_alive(lease))
        .await
        .expect("answered")
        .expect("renewed once acknowledged");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited for the acknowledgement ({:?})",
        started.elapsed()
    );
    heal.await.unwrap();
    assert_eq!(
        last_log_index(&kv).await,
        before,
        "renewed from memory: nothing written"
    );

    follower.shutdown().await;
    leader.shutdown().await;
}
