//! Property: a lease stays alive when the follower its client's keep-alive
//! stream goes to is gone without a word, though its caller sends one
//! keep-alive at a time, as a worker's heartbeat does (coordinator
//! `registry` invariant 4): the keep-alive waiting on a stream whose
//! follower stopped answering goes as a request after a sixth of the TTL
//! of silence, one on a stream that never opened after a second (client
//! `keep_alives` invariant 5).
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
use std::time::{Duration, Instant};

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

/// Beats `lease` for `beats` intervals as a worker's heartbeat does
/// (coordinator `registry` invariant 4): one keep-alive at a time, a beat
/// that finds the last one unanswered sends none. Returns the longest a
/// keep-alive took (one that fails fails the test).
async fn beat(kv: &RaftKv, lease: u64, beats: usize) -> Duration {
    let mut tick = tokio::time::interval(BEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut longest = Duration::ZERO;
    let mut n = 0;
    while n < beats {
        tick.tick().await;
        n += 1;
        let started = Instant::now();
        let keep_alive = kv.keep_alive(lease);
        tokio::pin!(keep_alive);
        loop {
            tokio::select! {
                beat = &mut keep_alive => {
                    beat.expect("the lease is alive");
                    break;
                }
                _ = tick.tick() => n += 1,
            }
        }
        longest = longest.max(started.elapsed());
    }
    longest
}

/// Beats `lease`, which holds the key `held`, for three TTLs, and checks
/// that no keep-alive took longer than `within` and the key is there.
async fn outlives_three_ttls(kv: &RaftKv, lease: u64, within: Duration) {
    let beats = 3 * TTL.as_millis() as usize / BEAT.as_millis() as usize;
    let longest = beat(kv, lease, beats).await;
    assert!(longest < within, "a keep-alive took {longest:?}");
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
    // The stream never opens: given up `rpc::SILENCE` after the first
    // keep-alive, which then goes as a request, within the TTL.
    outlives_three_ttls(&kv, lease, TTL).await;
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
    let longest = beat(&kv, lease, 5).await;
    assert!(longest < BEAT, "the stream through the relay: {longest:?}");
    let on_stream = kv.keep_alives_on_stream();
    assert!(on_stream >= 4, "{on_stream} answered on the stream");
    frozen.store(true, Ordering::Relaxed);
    // Client `keep_alives` invariant 5 on the keep-alive waiting: a sixth
    // of the TTL its stream answered with (250 ms) of silence, then a
    // request; not a request's patience (`rpc::SILENCE`, 1 s).
    outlives_three_ttls(&kv, lease, TTL / 2).await;
    leader.shutdown().await;
}
