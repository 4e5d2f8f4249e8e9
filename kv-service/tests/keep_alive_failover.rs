//! Property: a lease stays alive when the follower its client's keep-alive
//! stream goes to is gone without a word, though every caller gives each
//! keep-alive up after one heartbeat interval, as a worker's heartbeat
//! does (coordinator `registry` invariant 4): a beat is lost to a stream
//! whose follower stopped answering, and the beats of a second to one whose
//! follower never answered (client `keep_alives` invariant 5).
//!
//! A cluster of one real replica stands for the leader; the client is given
//! a second address, its one follower, which goes silent: a bound UDP
//! socket that never answers (a host gone before the stream opened), or a
//! relay to the leader that stops relaying while the stream is open (a
//! follower killed, frozen or cut off under it). Either is what a dead host
//! looks like to QUIC: a killed process's port answers ICMP, which quinn
//! does not read. Before `keep_alives` invariant 5 the stream's failure
//! showed only when its connection had been silent for a second (four
//! beats lost) or its handshake timed out (2 s: the lease, of the 1.5 s
//! TTL the chaos tests' workers use, expired).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;
use tessel_kv_service::raft::node::{wait_for_leader, Replica, ReplicaConfig};
use tessel_kv_service::raft::wal::LogIo;

mod udp_relay;
use udp_relay::relay;

/// The chaos tests' workers' heartbeat and TTL.
const BEAT: Duration = Duration::from_millis(300);
const TTL: Duration = Duration::from_millis(1500);

async fn leader(dir: &std::path::Path) -> Replica {
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let leader = Replica::start(ReplicaConfig {
        id: 1,
        listen: any_port,
        peers: BTreeMap::from([(1, any_port.to_string())]),
        data_dir: dir.join("r1"),
        tls: None,
        raft: ReplicaConfig::default_raft(),
        log_io: LogIo::Direct,
    })
    .await
    .unwrap();
    assert!(
        wait_for_leader(&[&leader], Duration::from_secs(10))
            .await
            .is_some(),
        "a cluster of one elects itself"
    );
    leader
}

/// Beats `lease` for `beats` intervals, each keep-alive given up after
/// one; how many were given up (one that fails fails the test).
async fn beat(kv: &RaftKv, lease: u64, beats: usize) -> usize {
    let mut tick = tokio::time::interval(BEAT);
    let mut given_up = 0;
    for _ in 0..beats {
        tick.tick().await;
        match tokio::time::timeout(BEAT, kv.keep_alive(lease)).await {
            Ok(beat) => beat.expect("the lease is alive"),
            Err(_) => given_up += 1,
        }
    }
    given_up
}

/// Beats `lease`, which holds the key `held`, for three TTLs, and checks
/// that at most `given_up` keep-alives were given up and the key is there.
async fn outlives_three_ttls(kv: &RaftKv, lease: u64, given_up: usize) {
    let beats = 3 * TTL.as_millis() as usize / BEAT.as_millis() as usize;
    let lost = beat(kv, lease, beats).await;
    assert!(lost <= given_up, "{lost} keep-alives given up");
    assert_eq!(kv.try_get(b"held").await, Ok(b"v".to_vec()), "alive");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_outlives_a_follower_silent_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let leader = leader(dir.path()).await;
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addrs = vec![leader.local_addr().unwrap(), silent.local_addr().unwrap()];
    let kv = RaftKv::connect(addrs, None).unwrap();
    let lease = kv.grant(TTL).await.unwrap();
    kv.put_with_lease(b"held", b"v", lease).await.unwrap();
    // The beats of `rpc::SILENCE`, and one more.
    outlives_three_ttls(&kv, lease, 5).await;
    assert!(
        kv.keep_alives_on_stream() > 0,
        "the stream moved to the leader"
    );
    drop(silent);
    leader.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_outlives_its_streams_follower_falling_silent() {
    let dir = tempfile::tempdir().unwrap();
    let leader = leader(dir.path()).await;
    let frozen = Arc::new(AtomicBool::new(false));
    let follower = relay(leader.local_addr().unwrap(), frozen.clone()).await;
    let kv = RaftKv::connect(vec![leader.local_addr().unwrap(), follower], None).unwrap();
    let lease = kv.grant(TTL).await.unwrap();
    kv.put_with_lease(b"held", b"v", lease).await.unwrap();
    assert_eq!(beat(&kv, lease, 5).await, 0, "the stream through the relay");
    let on_stream = kv.keep_alives_on_stream();
    assert!(on_stream >= 4, "{on_stream} answered on the stream");
    frozen.store(true, Ordering::Relaxed);
    outlives_three_ttls(&kv, lease, 2).await;
    leader.shutdown().await;
}
