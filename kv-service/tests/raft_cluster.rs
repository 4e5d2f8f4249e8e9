//! Property: a 3-replica Raft cluster over QUIC with mutual TLS behaves
//! exactly like the specification (the conformance suite, through any
//! replica, and in a replica's own process), applies a write sent twice
//! once, frees the streams of calls their callers gave up, refuses peers
//! whose certificate is from another CA, and renews leases on one
//! keep-alive stream that follows the leader, also through a follower
//! whose forwards fill its connection to the leader, and ends that stream
//! with the replica's runtime.
//! (Replicas run as tasks here; the process-level tests kill real
//! processes.)

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tessel_kv::{CasOutcome, KvStore, WatchStream};
use tessel_kv_service::raft::client::{KvClient, RaftKv, Transport};
use tessel_kv_service::raft::node::{wait_for_leader, Replica, ReplicaConfig};
use tessel_kv_service::raft::wal::LogIo;
use tessel_kv_service::wire::{ClientRequest, WireRequest, WireResponse};
use tessel_tls::{init_certs, TlsFiles};

/// Three replicas, each bound to port 0 (a reserved-then-released port
/// can be taken by a parallel test before the replica binds it): the
/// first forms a cluster of one, the others join it.
async fn cluster(dir: &std::path::Path, tls: &TlsFiles) -> (Vec<Replica>, Vec<SocketAddr>) {
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut replicas = Vec::new();
    let mut addrs = Vec::new();
    for id in 1..=3u64 {
        let cfg = ReplicaConfig {
            id,
            listen: any_port,
            peers: if id == 1 {
                BTreeMap::from([(1, any_port.to_string())])
            } else {
                BTreeMap::new()
            },
            data_dir: dir.join(format!("r{id}")),
            tls: Some(tls.clone()),
            raft: ReplicaConfig::default_raft(),
            log_io: LogIo::Direct,
        };
        let replica = Replica::start(cfg).await.unwrap();
        let addr = replica.local_addr().unwrap();
        if id == 1 {
            assert!(
                wait_for_leader(&[&replica], Duration::from_secs(10))
                    .await
                    .is_some(),
                "the first replica leads its cluster of one"
            );
        } else {
            RaftKv::connect(addrs.clone(), Some(tls))
                .unwrap()
                .add_replica(id, addr)
                .await
                .unwrap();
        }
        replicas.push(replica);
        addrs.push(addr);
    }
    let refs: Vec<&Replica> = replicas.iter().collect();
    assert!(
        wait_for_leader(&refs, Duration::from_secs(10))
            .await
            .is_some(),
        "a leader is elected"
    );
    (replicas, addrs)
}

/// Three replicas in a folder of their own (kept while the first is
/// held), and the leader's id.
async fn running_cluster() -> (tempfile::TempDir, Vec<Replica>, u64) {
    let dir = tempfile::tempdir().unwrap();
    init_certs(&dir.path().join("tls"), &[]).unwrap();
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let (replicas, _) = cluster(dir.path(), &tls).await;
    let all: Vec<&Replica> = replicas.iter().collect();
    let leader = wait_for_leader(&all, Duration::from_secs(10))
        .await
        .unwrap();
    (dir, replicas, leader)
}

/// A write of the term through any replica: until its lease renewal has
/// committed, the leader too answers keep-alives `Unavailable` (`renewals`
/// invariant 1).
async fn write_of_the_term(replicas: &[Replica], tls: &TlsFiles) {
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.local_addr().unwrap()).collect();
    RaftKv::connect(addrs, Some(tls))
        .unwrap()
        .put(b"k", b"v")
        .await
        .unwrap();
}

/// A running cluster whose leader has written in its term, its TLS files,
/// and the address of one of its followers.
async fn a_follower_after_the_terms_write(
) -> (tempfile::TempDir, Vec<Replica>, TlsFiles, SocketAddr) {
    let (dir, replicas, leader) = running_cluster().await;
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    write_of_the_term(&replicas, &tls).await;
    let follower = replicas.iter().find(|r| r.id != leader).unwrap();
    let at = follower.local_addr().unwrap();
    (dir, replicas, tls, at)
}

/// A client endpoint of its own that presents the coordinators'
/// certificate.
fn coordinator_endpoint(tls: &TlsFiles) -> quinn::Endpoint {
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(
        tls.client_config(
            tessel_kv_service::wire::ALPN,
            tessel_tls::Expect::Coordinator,
        )
        .unwrap(),
    );
    endpoint
}

/// A raw peer client on a connection of its own, as a coordinator.
fn coordinator_peer(tls: &TlsFiles) -> tessel_kv_service::rpc::PeerClient {
    tessel_kv_service::rpc::PeerClient::new(coordinator_endpoint(tls))
}

/// The address of the replica that reports itself leader.
async fn leader_addr(addrs: &[SocketAddr], tls: &TlsFiles) -> String {
    let kv = RaftKv::connect(addrs.to_vec(), Some(tls)).unwrap();
    kv.cluster_status()
        .await
        .into_iter()
        .find_map(|(a, s)| s.ok().filter(|s| s.leader == Some(s.id)).map(|_| a))
        .expect("a leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_pass_the_conformance_suite_through_any_replica() {
    let dir = tempfile::tempdir().unwrap();
    init_certs(&dir.path().join("tls"), &[]).unwrap();
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let (replicas, addrs) = cluster(dir.path(), &tls).await;
    // A client that knows only one replica is served through it: followers
    // forward to the leader.
    for (i, &addr) in addrs.iter().enumerate() {
        let kv = RaftKv::connect(vec![addr], Some(&tls)).unwrap();
        kv.put(format!("only/{i}").as_bytes(), b"x").await.unwrap();
    }
    // A client that knows them all moves to the leader, whichever replica
    // it asks first (client invariant 4).
    let leader = leader_addr(&addrs, &tls).await;
    for start in 0..3 {
        let mut order = addrs.clone();
        order.rotate_left(start);
        let kv = RaftKv::connect(order, Some(&tls)).unwrap();
        kv.put(format!("start/{start}").as_bytes(), b"x")
            .await
            .unwrap();
        assert_eq!(kv.replica(), leader, "starting at {start}");
        // Waits given up by their callers (a worker drops one of two
        // waits when the other ends) leave it there (client invariant 6).
        // (Two: each would move it one replica on, three back to the start.)
        for i in 0..2 {
            let key = format!("never/{start}/{i}");
            let wait = kv.get(key.as_bytes(), Duration::from_secs(60));
            assert!(tokio::time::timeout(Duration::from_millis(50), wait)
                .await
                .is_err());
        }
        assert_eq!(kv.replica(), leader, "after abandoned waits");
    }
    let kv = RaftKv::connect(addrs.clone(), Some(&tls)).unwrap();
    tessel_kv::conformance::run_all(&kv).await;
    // Every replica applied the same state (followers may trail the
    // leader's last write by a heartbeat or two: wait, with a deadline).
    use tessel_kv::state::Tables;
    let snapshot = || -> Vec<_> {
        replicas
            .iter()
            .map(|r| {
                let local = r.applied();
                (local.state(), local.read(|_, t| t.list(b"")).unwrap())
            })
            .collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut states = snapshot();
    while !states.windows(2).all(|w| w[0] == w[1]) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        states = snapshot();
    }
    assert!(states[0].1.len() > 3, "the tables hold the suite's keys");
    assert!(states.windows(2).all(|w| w[0] == w[1]));
    for r in replicas {
        r.shutdown().await;
    }
}

/// A replica's own process (the coordinator's monitor and scheduler) is
/// served in-process, with the same semantics, through a follower too (it
/// forwards to the leader as it does for remote clients).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_own_process_passes_the_conformance_suite_in_process() {
    let (_dir, replicas, leader) = running_cluster().await;
    let follower = replicas.iter().find(|r| r.id != leader).unwrap();
    tessel_kv::conformance::run_all(&follower.local_client()).await;
    let on_leader = replicas.iter().find(|r| r.id == leader).unwrap();
    let keys = on_leader.local_client().list(b"").await.unwrap();
    assert!(
        keys.len() > 3,
        "the leader's own client reads the suite's keys"
    );
    for r in replicas {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_a_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    init_certs(&dir.path().join("tls"), &[]).unwrap();
    init_certs(&dir.path().join("other"), &[]).unwrap();
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let other = TlsFiles::load(&dir.path().join("other")).unwrap();
    let (replicas, addrs) = cluster(dir.path(), &tls).await;
    let stranger = RaftKv::connect(addrs.clone(), Some(&other)).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(40), stranger.try_get(b"k"))
        .await
        .unwrap();
    assert!(
        matches!(r, Err(tessel_kv::KvError::Unavailable(_))),
        "{r:?}"
    );
    let insecure = RaftKv::connect(addrs.clone(), None).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(40), insecure.try_get(b"k"))
        .await
        .unwrap();
    assert!(
        matches!(r, Err(tessel_kv::KvError::Unavailable(_))),
        "no client certificate: {r:?}"
    );
    let member = RaftKv::connect(addrs, Some(&tls)).unwrap();
    member.put(b"k", b"v").await.unwrap();
    for r in replicas {
        r.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_frame_resets_its_stream_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    init_certs(&dir.path().join("tls"), &[]).unwrap();
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let (replicas, addrs) = cluster(dir.path(), &tls).await;
    let endpoint = coordinator_endpoint(&tls);
    let conn = endpoint
        .connect(addrs[0], tessel_tls::SERVER_NAME)
        .unwrap()
        .await
        .unwrap();

    // A header announcing 1 GiB: refused without reading (or allocating) it.
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&(1u32 << 30).to_be_bytes()).await.unwrap();
    let r = recv.read_to_end(1 << 20).await;
    assert!(r.is_err(), "the stream is reset: {r:?}");

    // Garbage of a plausible length: also refused.
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&8u32.to_be_bytes()).await.unwrap();
    send.write_all(&[0xee; 8]).await.unwrap();
    let _ = send.finish();
    assert!(recv.read_to_end(1 << 20).await.is_err());

    // The same connection still serves well-formed requests.
    let client = tessel_kv_service::rpc::PeerClient::new(endpoint.clone());
    let req = tessel_kv_service::wire::WireRequest::Client(
        tessel_kv_service::wire::ClientRequest::Status,
    );
    let resp = client
        .call(addrs[0], &req, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(matches!(
        resp,
        tessel_kv_service::wire::WireResponse::Status(_)
    ));
    assert!(conn.close_reason().is_none(), "the connection survived");
    for r in replicas {
        r.shutdown().await;
    }
}

/// A transport that loses its first answer to every write: the write goes
/// twice, as a client's retry sends it after an answer lost to a cut link
/// or a leader change.
struct LosesFirstAnswer<T>(T);

#[async_trait::async_trait]
impl<T: Transport> Transport for LosesFirstAnswer<T> {
    async fn request(&self, req: ClientRequest, wait: Duration) -> tessel_kv::Result<WireResponse> {
        if matches!(req, ClientRequest::Write(_)) {
            let _lost = self.0.request(req.clone(), wait).await;
        }
        self.0.request(req, wait).await
    }

    async fn watch(&self, prefix: &[u8], from: u64) -> tessel_kv::Result<WatchStream> {
        self.0.watch(prefix, from).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_was_lost_is_applied_once_when_sent_again() {
    let (_dir, replicas, leader) = running_cluster().await;
    // Through a follower, which forwards each copy to the leader.
    let follower = replicas.iter().find(|r| r.id != leader).unwrap();
    let kv = KvClient::new(LosesFirstAnswer(
        follower.local_client().transport().clone(),
    ));
    let start = kv.revision().await.unwrap();
    assert_eq!(kv.increment(b"n", 5).await, Ok(5));
    assert_eq!(kv.increment(b"n", 5).await, Ok(10));
    assert_eq!(
        kv.compare_and_swap(b"c", None, b"v").await,
        Ok(CasOutcome::Swapped {
            revision: start + 3
        })
    );
    assert_eq!(kv.insert(b"i", b"v").await, Ok(start + 4));
    assert_eq!(kv.put(b"p", b"v").await, Ok(start + 5));
    assert_eq!(kv.delete(b"p").await, Ok(1));
    let lease = kv.grant(Duration::from_secs(60)).await.unwrap();
    kv.revoke(lease).await.unwrap();
    assert_eq!(kv.revision().await, Ok(start + 6), "one revision a change");
    assert_eq!(
        kv.grant(Duration::from_secs(60)).await,
        Ok(lease + 1),
        "one lease a grant"
    );
    for r in replicas {
        r.shutdown().await;
    }
}

/// Node invariant 8: blocking gets and watches whose callers gave up free
/// their streams at once. More than a connection's streams (1,024) are
/// abandoned, gets and watches each, directly and through a follower; if
/// the replicas held them until their hour-long timeouts, the next call on
/// the connection would find no stream to open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_waits_free_their_streams() {
    let (_dir, replicas, leader) = running_cluster().await;
    let follower = replicas.iter().find(|r| r.id != leader).unwrap();
    let tls = TlsFiles::load(&_dir.path().join("tls")).unwrap();
    for via in [leader, follower.id] {
        let addr = replicas
            .iter()
            .find(|r| r.id == via)
            .unwrap()
            .local_addr()
            .unwrap();
        let kv = RaftKv::connect(vec![addr], Some(&tls)).unwrap();
        for wave in 0..2 {
            let gets = (0..1100).map(|i| {
                let kv = &kv;
                async move {
                    let key = format!("absent/{via}/{wave}/{i}");
                    let get = kv.get(key.as_bytes(), Duration::from_secs(3600));
                    tokio::time::timeout(Duration::from_millis(500), get).await
                }
            });
            let outcomes = futures::future::join_all(gets).await;
            assert!(outcomes.iter().all(|o| o.is_err()), "every get gave up");
            // Watches, opened and dropped.
            let watches = (0..600).map(|i| {
                let kv = &kv;
                async move {
                    let prefix = format!("watched/{via}/{wave}/{i}/");
                    tokio::time::timeout(Duration::from_secs(10), kv.watch(prefix.as_bytes(), 0))
                        .await
                        .expect("opened")
                        .unwrap()
                }
            });
            let opened = futures::future::join_all(watches).await;
            drop(opened);
        }
        let key = format!("present/{via}");
        let put_then_get = async {
            kv.put(key.as_bytes(), b"v").await.unwrap();
            kv.get(key.as_bytes(), Duration::from_secs(1))
                .await
                .unwrap()
        };
        let got = tokio::time::timeout(Duration::from_secs(5), put_then_get).await;
        assert_eq!(
            got.as_deref(),
            Ok(&b"v"[..]),
            "served after the abandoned gets (via {via})"
        );
    }
    for r in replicas {
        r.shutdown().await;
    }
}

/// Client invariant 8, `node::keep_alives` and `node::relay`: keep-alives
/// ride the client's one stream to a follower, which relays them to the
/// leader, and keep a lease past its TTL; when the leader goes, they are
/// sent as requests until a stream answers them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_ride_one_stream_through_a_follower_and_follow_a_new_leader() {
    let (dir, mut replicas, leader) = running_cluster().await;
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.local_addr().unwrap()).collect();
    let kv = RaftKv::connect(addrs, Some(&tls)).unwrap();
    // The workers' TTL: a leader change takes a few seconds.
    let lease = kv.grant(Duration::from_secs(5)).await.unwrap();
    kv.put_with_lease(b"held", b"v", lease).await.unwrap();
    for _ in 0..12 {
        kv.keep_alive(lease).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        kv.try_get(b"held").await,
        Ok(b"v".to_vec()),
        "alive past its TTL"
    );
    assert_eq!(kv.keep_alives_on_stream(), 12, "each on the stream");
    let relayed: Vec<(u64, u64)> = replicas
        .iter()
        .map(|r| (r.id, r.keep_alives_relayed()))
        .filter(|&(_, n)| n > 0)
        .collect();
    assert!(
        matches!(relayed[..], [(id, 12)] if id != leader),
        "all through one follower: {relayed:?} (leader {leader})"
    );
    let gone = replicas.iter().position(|r| r.id == leader).unwrap();
    replicas.remove(gone).shutdown().await;
    let before = kv.keep_alives_on_stream();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while kv.keep_alives_on_stream() < before + 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no stream to the new leader"
        );
        kv.keep_alive(lease).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(
        kv.try_get(b"held").await,
        Ok(b"v".to_vec()),
        "kept through the change"
    );
    // A lease that does not exist is a final answer from the stream.
    let before = kv.keep_alives_on_stream();
    assert!(matches!(
        kv.keep_alive(lease + 1000).await,
        Err(tessel_kv::KvError::LeaseNotFound(_))
    ));
    assert_eq!(kv.keep_alives_on_stream(), before + 1);
    for r in replicas {
        r.shutdown().await;
    }
}

/// `node::serializable` invariants 1 and 2 and client invariant 9: a
/// serializable get waits on a follower for a key written later and gets
/// it; a replica left without a leader answers one `Unavailable` at once
/// rather than waiting out its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_get_is_served_by_a_follower_until_it_knows_no_leader() {
    use tessel_kv_service::wire::{self, WireRequest};
    let (dir, mut replicas, leader) = running_cluster().await;
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.local_addr().unwrap()).collect();
    let kv = std::sync::Arc::new(RaftKv::connect(addrs, Some(&tls)).unwrap());
    kv.put(b"first", b"v").await.unwrap();
    let waiter = {
        let kv = kv.clone();
        tokio::spawn(async move { kv.get_serializable(b"later", Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    kv.put(b"later", b"w").await.unwrap();
    assert_eq!(waiter.await.unwrap(), Ok(b"w".to_vec()));
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(
        tls.client_config(wire::ALPN, tessel_tls::Expect::Coordinator)
            .unwrap(),
    );
    let client = tessel_kv_service::rpc::PeerClient::new(endpoint);
    let ask = |key: &[u8]| {
        WireRequest::Client(ClientRequest::GetSerializable {
            key: key.to_vec(),
            timeout_ms: 30_000,
        })
    };
    let follower = replicas.iter().position(|r| r.id != leader).unwrap();
    let at = replicas[follower].local_addr().unwrap();
    let served = client
        .call(at, &ask(b"first"), Duration::from_secs(5))
        .await;
    assert!(
        matches!(&served, Ok(WireResponse::Value(Ok(v))) if v == b"v"),
        "{served:?}"
    );
    // The other two go: the last one can elect no leader.
    let last = replicas.remove(follower);
    for r in replicas {
        r.shutdown().await;
    }
    let asked = std::time::Instant::now();
    let answer = client
        .call(at, &ask(b"never"), Duration::from_secs(40))
        .await;
    assert!(
        matches!(
            answer,
            Ok(WireResponse::Value(Err(tessel_kv::KvError::Unavailable(_))))
        ),
        "{answer:?}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
    last.shutdown().await;
}

/// `node::keep_alives` invariants 1–3 on the wire: every replica answers
/// each frame with the leader's answer (a follower relays it), in order,
/// also after the caller ended its side, and then ends the stream; an
/// oversized frame ends that stream alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_stream_is_answered_by_every_replica_and_bad_frames_end_it() {
    use tessel_kv_service::wire::{self, KeepAliveFrame};
    let (dir, replicas, leader) = running_cluster().await;
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    write_of_the_term(&replicas, &tls).await;
    let client = coordinator_peer(&tls);
    let open = WireRequest::Client(ClientRequest::KeepAliveStream);
    let answer = |mut recv: quinn::RecvStream| async move {
        let body = tessel_kv_service::rpc::read_frame(&mut recv, wire::MAX_FRAME).await;
        (
            body.map(|b| b.map(|b| wire::decode::<WireResponse>(&b).unwrap())),
            recv,
        )
    };
    for r in &replicas {
        let addr = r.local_addr().unwrap();
        let (_conn, mut send, recv) = client.open(addr, &open).await.unwrap();
        for _ in 0..2 {
            tessel_kv_service::rpc::write_frame(&mut send, &KeepAliveFrame { lease: 77 })
                .await
                .unwrap();
        }
        // The caller's end: the frames sent are still answered, then the
        // replica ends its side too.
        send.finish().unwrap();
        let (first, recv) = answer(recv).await;
        let (second, recv) = answer(recv).await;
        let end = tokio::time::timeout(Duration::from_secs(10), answer(recv)).await;
        assert!(matches!(end, Ok((Ok(None), _))), "replica {}: no end", r.id);
        for a in [first, second] {
            match a {
                Ok(Some(WireResponse::Output(Err(tessel_kv::KvError::LeaseNotFound(77))))) => {}
                other => panic!("replica {} (leader {leader}): {other:?}", r.id),
            }
        }
    }
    let addr = replicas
        .iter()
        .find(|r| r.id == leader)
        .unwrap()
        .local_addr()
        .unwrap();
    let (conn, mut send, mut recv) = client.open(addr, &open).await.unwrap();
    send.write_all(&1000u32.to_be_bytes()).await.unwrap();
    assert!(
        recv.read_to_end(1 << 10).await.is_err(),
        "the stream is reset"
    );
    let status = WireRequest::Client(ClientRequest::Status);
    let served = client.call(addr, &status, Duration::from_secs(5)).await;
    assert!(matches!(served, Ok(WireResponse::Status(_))), "{served:?}");
    assert!(conn.close_reason().is_none(), "the connection survived");
    for r in replicas {
        r.shutdown().await;
    }
}

/// `node::keep_alives` invariant 4: a keep-alive stream is served on the
/// process's QUIC thread, which outlives a replica's runtime, but it ends
/// with the request that opened it. With the replicas' runtime stopped (as
/// a test stops a replica), the stream's connection closes, as a killed
/// process's would, instead of staying open on the QUIC thread.
#[test]
fn a_keep_alive_stream_ends_with_its_replicas_runtime() {
    use tessel_kv_service::rpc::{read_frame, write_frame};
    use tessel_kv_service::wire::{self, KeepAliveFrame};
    let runtime = |threads| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
            .unwrap()
    };
    let (replicas_runtime, client_runtime) = (runtime(2), runtime(1));
    let (dir, replicas, _) = replicas_runtime.block_on(running_cluster());
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let peer = client_runtime.block_on(async { coordinator_peer(&tls) });
    let addr = replicas[0].local_addr().unwrap();
    let (conn, _send, _recv) = client_runtime.block_on(async {
        let open = WireRequest::Client(ClientRequest::KeepAliveStream);
        let (conn, mut send, mut recv) = peer.open(addr, &open).await.unwrap();
        write_frame(&mut send, &KeepAliveFrame { lease: 77 })
            .await
            .unwrap();
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            read_frame(&mut recv, wire::MAX_FRAME),
        )
        .await;
        assert!(matches!(answer, Ok(Ok(Some(_)))), "served: {answer:?}");
        (conn, send, recv)
    });
    replicas_runtime.shutdown_background();
    let closed = client_runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), conn.closed()).await });
    assert!(
        closed.is_ok(),
        "the connection stayed open after its replica's runtime stopped"
    );
    // Dropped after the client's runtime: nothing of theirs runs any more.
    drop(client_runtime);
    drop(replicas);
}

/// Node invariant 10: a follower whose connection to the leader is full of
/// forwarded blocking gets (1,024 streams at once) still relays keep-alives:
/// the frames on its keep-alive stream get the leader's answer, not the
/// relay's `Unavailable` after its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_full_of_forwarded_gets_still_relays_keep_alives() {
    use tessel_kv_service::wire::{self, KeepAliveFrame};
    let (_dir, replicas, tls, at) = a_follower_after_the_terms_write().await;
    // Blocking gets sent to the follower, which forwards them: 1,200 over
    // two connections, more than its connection to the leader carries at
    // once. Their streams stay open while `held` lives.
    let getters = [coordinator_peer(&tls), coordinator_peer(&tls)];
    let mut held = Vec::new();
    for i in 0..1200 {
        let get = WireRequest::Client(ClientRequest::Get {
            key: format!("absent/{i}").into_bytes(),
            timeout_ms: 3_600_000,
        });
        held.push(getters[i % 2].open(at, &get).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let peer = coordinator_peer(&tls);
    let open = WireRequest::Client(ClientRequest::KeepAliveStream);
    let (_conn, mut send, mut recv) = peer.open(at, &open).await.unwrap();
    tessel_kv_service::rpc::write_frame(&mut send, &KeepAliveFrame { lease: 77 })
        .await
        .unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        tessel_kv_service::rpc::read_frame(&mut recv, wire::MAX_FRAME),
    )
    .await
    .expect("an answer within 10 s")
    .unwrap()
    .map(|b| wire::decode::<WireResponse>(&b).unwrap());
    assert!(
        matches!(
            answer,
            Some(WireResponse::Output(Err(
                tessel_kv::KvError::LeaseNotFound(77)
            )))
        ),
        "the leader's answer, relayed: {answer:?}"
    );
    drop(held);
    for r in replicas {
        r.shutdown().await;
    }
}

/// Node invariant 12: a follower whose connection to the leader is full of
/// forwarded blocking gets refuses the next get within its bound, rather
/// than holding it with no stream, and still forwards a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_full_of_forwarded_gets_still_forwards_writes() {
    use tessel_kv_service::rpc::read_frame;
    use tessel_kv_service::wire::{self, MAX_FRAME};
    let (_dir, replicas, tls, at) = a_follower_after_the_terms_write().await;
    let get = |i: usize| {
        WireRequest::Client(ClientRequest::Get {
            key: format!("absent/{i}").into_bytes(),
            timeout_ms: 3_600_000,
        })
    };
    // Held gets through the follower, in waves, until one is refused while
    // more than a connection's streams (1,024) are held. Before the bound,
    // none ever was: each waited for a stream for good.
    let getters: Vec<_> = (0..4).map(|_| coordinator_peer(&tls)).collect();
    let open = |n: usize| {
        let getter = &getters[n % getters.len()];
        async move {
            let req = get(n);
            tokio::time::timeout(Duration::from_secs(10), getter.open(at, &req))
                .await
                .expect("a stream to the follower within 10 s")
                .unwrap()
        }
    };
    // The first one dials the follower's connection to the leader, which
    // the others then share.
    let mut held = vec![open(usize::MAX).await];
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut refused = None;
    for wave in 0..8 {
        let size = if wave == 0 { 1100 } else { 100 };
        for i in 0..size {
            held.push(open(wave * 10_000 + i).await);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut unanswered = Vec::new();
        let mut answers = Vec::new();
        for (conn, send, mut recv) in held {
            let read =
                tokio::time::timeout(Duration::from_millis(1), read_frame(&mut recv, MAX_FRAME));
            match read.await {
                Ok(Ok(Some(body))) => answers.push(wire::decode::<WireResponse>(&body).unwrap()),
                _ => unanswered.push((conn, send, recv)),
            }
        }
        held = unanswered;
        if held.len() >= 1024 && !answers.is_empty() {
            refused = answers.pop();
            break;
        }
    }
    assert!(
        matches!(
            refused,
            Some(WireResponse::Value(Err(tessel_kv::KvError::Unavailable(_))))
        ),
        "a get refused with {} held: {refused:?}",
        held.len()
    );
    // A write, forwarded on a connection of its own.
    let put = WireRequest::Client(ClientRequest::Write(tessel_kv::state::Op::Put {
        key: b"written/through/a/full/follower".to_vec(),
        value: b"v".to_vec(),
        lease: None,
    }));
    let peer = coordinator_peer(&tls);
    let answer = peer.call(at, &put, Duration::from_secs(20)).await;
    assert!(
        matches!(answer, Ok(WireResponse::Output(Ok(_)))),
        "the write, forwarded: {answer:?}"
    );
    drop(held);
    for r in replicas {
        r.shutdown().await;
    }
}
