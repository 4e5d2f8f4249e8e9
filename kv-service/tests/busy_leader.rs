//! Properties:
//! * a leader whose runtime is busy keeps its leadership (node invariant
//!   11): its Raft core heartbeats its followers from a thread of its own,
//!   so client work queued on the replica's runtime (here: its one worker
//!   thread held for twice the longest election timeout) deposes nobody.
//!   Before, 16,384 simulated workers' requests delayed the leader's
//!   AppendEntries past their deadline and the followers held elections in
//!   the middle of the bootstrap;
//! * followers whose runtimes are busy still take the leader's entries
//!   (node invariant 12): they arrive at each follower's Raft core, not
//!   behind its clients' requests, so the leader's writes commit and no
//!   election is held.
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

/// Three replicas, each on a runtime of its own, and a client's runtime.
struct Cluster {
    _dir: tempfile::TempDir,
    tls: TlsFiles,
    client_rt: tokio::runtime::Runtime,
    runtimes: Vec<tokio::runtime::Runtime>,
    replicas: Vec<Replica>,
    addrs: Vec<SocketAddr>,
    /// The leader's index, and its term.
    at: usize,
    term: u64,
}

fn cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    init_certs(&dir.path().join("tls"), &[]).unwrap();
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let client_rt = replica_runtime();
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
            // Clients are made (and their sockets driven) on the client's runtime.
            let _clients = client_rt.enter();
            let kv = RaftKv::connect(addrs.clone(), Some(&tls)).unwrap();
            client_rt
                .block_on(kv.add_replica(id, addr))
                .expect("a replica joins");
        }
        replicas.push(replica);
        addrs.push(addr);
    }
    let refs: Vec<&Replica> = replicas.iter().collect();
    let leader = client_rt
        .block_on(wait_for_leader(&refs, Duration::from_secs(10)))
        .expect("a leader");
    let at = replicas.iter().position(|r| r.id == leader).unwrap();
    let term = replicas[at].raft.metrics().borrow().current_term;
    Cluster {
        _dir: dir,
        tls,
        client_rt,
        runtimes,
        replicas,
        addrs,
        at,
        term,
    }
}

impl Cluster {
    /// Every replica still in the leader's term, under the same leader.
    fn assert_no_election(&self, while_: &str) {
        let leader = self.replicas[self.at].id;
        for r in &self.replicas {
            let m = r.raft.metrics().borrow().clone();
            assert_eq!(
                (m.current_term, m.current_leader),
                (self.term, Some(leader)),
                "replica {} held no election while {while_}",
                r.id
            );
        }
    }

    fn shutdown(self) {
        for (r, rt) in self.replicas.into_iter().zip(&self.runtimes) {
            rt.block_on(r.shutdown());
        }
    }
}

/// Holds a replica runtime's one worker thread for `busy`.
fn hold(rt: &tokio::runtime::Runtime, busy: Duration) {
    rt.spawn(async move { std::thread::sleep(busy) });
}

#[test]
fn a_leader_whose_runtime_is_busy_keeps_its_followers() {
    let c = cluster();
    let _clients = c.client_rt.enter();
    let kv = RaftKv::connect(c.addrs.clone(), Some(&c.tls)).unwrap();
    c.client_rt.block_on(kv.put(b"k", b"v")).unwrap();

    // The leader's runtime does nothing else for 4 s: twice the longest
    // election timeout (`ReplicaConfig::default_raft`).
    let busy = Duration::from_secs(4);
    hold(&c.runtimes[c.at], busy);
    std::thread::sleep(busy + Duration::from_millis(500));
    c.assert_no_election("the leader was busy");
    // And the leader serves again once its runtime is free.
    c.client_rt
        .block_on(tokio::time::timeout(
            Duration::from_secs(10),
            kv.put(b"k", b"after"),
        ))
        .expect("a write within 10 s")
        .unwrap();
    c.shutdown();
}

#[test]
fn followers_whose_runtimes_are_busy_still_commit_the_leaders_writes() {
    let c = cluster();
    let _clients = c.client_rt.enter();
    // The leader alone: a follower would forward through its busy runtime.
    let kv = RaftKv::connect(vec![c.addrs[c.at]], Some(&c.tls)).unwrap();
    c.client_rt.block_on(kv.put(b"k", b"v")).unwrap();

    // Both followers' runtimes do nothing else for 4 s: twice the longest
    // election timeout.
    let busy = Duration::from_secs(4);
    let started = std::time::Instant::now();
    for (i, rt) in c.runtimes.iter().enumerate() {
        if i != c.at {
            hold(rt, busy);
        }
    }
    // A write needs a follower's acknowledgement: it commits now, not
    // after the followers' runtimes are free.
    for n in 0..10u32 {
        let value = format!("while busy {n}");
        c.client_rt
            .block_on(tokio::time::timeout(
                Duration::from_secs(1),
                kv.put(b"k", value.as_bytes()),
            ))
            .expect("a write within 1 s while the followers' runtimes are busy")
            .unwrap();
    }
    assert!(
        started.elapsed() < busy,
        "the writes were done before the followers' runtimes were free"
    );
    std::thread::sleep(busy.saturating_sub(started.elapsed()) + Duration::from_millis(500));
    c.assert_no_election("the followers were busy");
    c.shutdown();
}
