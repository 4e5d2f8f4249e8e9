//! Property: a leader whose runtime is busy keeps its leadership (node
//! invariant 11): its Raft core heartbeats its followers from a thread of
//! its own, so client work queued on the replica's runtime (here: its one
//! worker thread held for twice the longest election timeout) deposes
//! nobody. Before, 16,384 simulated workers' requests delayed the leader's
//! AppendEntries past their deadline and the followers held elections in
//! the middle of the bootstrap.
//!
//! Each replica runs on a runtime of its own, with one worker thread, as
//! `tessel coordinator` does (`--worker-threads 1`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;
use tessel_kv_service::raft::node::{wait_for_leader, Replica, ReplicaConfig};
use tessel_kv_service::raft::wal::LogIo;
use tessel_tls::{init_certs, TlsFiles};

/// A runtime like a coordinator's: one worker thread.
fn replica_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

fn config(id: u64, dir: &std::path::Path, tls: &TlsFiles) -> ReplicaConfig {
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    ReplicaConfig {
        id,
        listen: any_port,
        // The first forms a cluster of one; the others join it.
        peers: if id == 1 {
            BTreeMap::from([(1, any_port.to_string())])
        } else {
            BTreeMap::new()
        },
        data_dir: dir.join(format!("r{id}")),
        tls: Some(tls.clone()),
        raft: ReplicaConfig::default_raft(),
        log_io: LogIo::Direct,
    }
}

#[test]
fn a_leader_whose_runtime_is_busy_keeps_its_followers() {
    let dir = tempfile::tempdir().unwrap();
    init_certs(&dir.path().join("tls"), &[]).unwrap();
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let client_rt = replica_runtime();
    // Clients are made (and their sockets driven) on the client's runtime.
    let _clients = client_rt.enter();
    let runtimes: Vec<_> = (0..3).map(|_| replica_runtime()).collect();
    let mut replicas: Vec<Replica> = Vec::new();
    let mut addrs = Vec::new();
    for (i, rt) in runtimes.iter().enumerate() {
        let id = i as u64 + 1;
        let replica = rt
            .block_on(Replica::start(config(id, dir.path(), &tls)))
            .unwrap();
        let addr = replica.local_addr().unwrap();
        if id == 1 {
            let led = rt.block_on(wait_for_leader(&[&replica], Duration::from_secs(10)));
            assert!(led.is_some(), "the first replica leads its cluster of one");
        } else {
            let kv = RaftKv::connect(addrs.clone(), Some(&tls)).unwrap();
            client_rt
                .block_on(kv.add_replica(id, addr))
                .expect("a replica joins");
        }
        replicas.push(replica);
        addrs.push(addr);
    }
    let kv = RaftKv::connect(addrs.clone(), Some(&tls)).unwrap();
    client_rt.block_on(kv.put(b"k", b"v")).unwrap();
    let refs: Vec<&Replica> = replicas.iter().collect();
    let leader = client_rt
        .block_on(wait_for_leader(&refs, Duration::from_secs(10)))
        .expect("a leader");
    let at = replicas.iter().position(|r| r.id == leader).unwrap();
    let term = replicas[at].raft.metrics().borrow().current_term;

    // The leader's runtime does nothing else for 4 s: twice the longest
    // election timeout (`ReplicaConfig::default_raft`).
    let busy = Duration::from_secs(4);
    runtimes[at].spawn(async move { std::thread::sleep(busy) });
    std::thread::sleep(busy + Duration::from_millis(500));

    for r in &replicas {
        let m = r.raft.metrics().borrow().clone();
        assert_eq!(
            (m.current_term, m.current_leader),
            (term, Some(leader)),
            "replica {} held no election while the leader was busy",
            r.id
        );
    }
    // And the leader serves again once its runtime is free.
    client_rt
        .block_on(tokio::time::timeout(
            Duration::from_secs(10),
            kv.put(b"k", b"after"),
        ))
        .expect("a write within 10 s")
        .unwrap();
    for (r, rt) in replicas.into_iter().zip(&runtimes) {
        rt.block_on(r.shutdown());
    }
}
