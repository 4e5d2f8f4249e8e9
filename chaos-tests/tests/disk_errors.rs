//! Properties: a replica whose Raft log or state file returns EIO stops and exits
//! (nonzero) rather than serving from a log it could not write; the rest
//! lose no acknowledged write, and it rejoins from its folder once the disk
//! serves again. A slow log, on the leader or a follower, costs latency,
//! not an election; a stalled state file costs neither.
//!
//! The faults come from an LD_PRELOAD shim (`chaos-tests/shim/`) on each
//! replica's `pwrite`/`fsync`/`fdatasync` of its log or state files;
//! device-mapper's error and delay targets are not used: this machine's
//! kernel has no device-mapper (no `device-mapper` in /proc/misc, no
//! /dev/mapper/control). The shim's comment says what it models and what
//! not.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tessel_chaos_tests::faults::{disk_fault_env, disk_shim};
use tessel_chaos_tests::{sample, scrape, KvCluster};
use tessel_kv::KvStore;
use tessel_kv_service::raft::client::RaftKv;

/// Three replicas under the shim; returns the cluster and each replica's
/// fault file (index `id - 1`).
fn cluster() -> (KvCluster, Vec<PathBuf>) {
    let mut c = KvCluster::prepare();
    let shim = disk_shim(c.dir.path());
    let faults: Vec<PathBuf> = (1..=3)
        .map(|id| c.dir.path().join(format!("disk-fault-{id}")))
        .collect();
    for (id, f) in (1..=3).zip(&faults) {
        c.env.insert(id, disk_fault_env(&shim, f, &c.data_dir(id)));
    }
    c.start_prepared(3, &["--metrics-listen", "127.0.0.1:0"]);
    (c, faults)
}

/// Seconds replica `id`'s state flushes took so far (all kinds).
fn flush_seconds(c: &KvCluster, id: u64) -> f64 {
    let addr = c.procs[&id].metrics.as_deref().expect("metrics");
    let name = "tessel_kv_state_flush_seconds_sum";
    ["kind=\"buffered\"", "kind=\"durable\""]
        .iter()
        .filter_map(|kind| sample(&scrape(addr), name, &[kind]))
        .sum()
}

/// When process `pid` exited (became a zombie), polled every 5 ms in the
/// background so that a put in flight does not delay the observation.
fn exit_time(pid: u32) -> tokio::task::JoinHandle<Instant> {
    tokio::spawn(async move {
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rsplit_once(") ").map(|(_, s)| s.chars().next());
            if matches!(state, None | Some(Some('Z'))) {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// Puts `eio/{n}` one after another until the replica `victim` exits;
/// returns the acknowledged `n`s.
async fn put_until_exit(c: &mut KvCluster, victim: u64, from: u32) -> Vec<u32> {
    let kv = c.client();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut acked = Vec::new();
    let mut n = from;
    loop {
        assert!(
            Instant::now() < deadline,
            "replica {victim} still runs 60 s after its log failed"
        );
        let key = format!("eio/{n}");
        let put = tokio::time::timeout(Duration::from_secs(20), kv.put(key.as_bytes(), b"v"));
        if let Ok(Ok(_)) = put.await {
            acked.push(n);
        }
        n += 1;
        if let Some(status) = c.procs.get_mut(&victim).unwrap().child.try_wait() {
            assert!(
                !status.success(),
                "a replica whose log failed exits nonzero"
            );
            return acked;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_returns_eio_stops_its_replica_and_nothing_acknowledged_is_lost() {
    let (mut c, faults) = cluster();
    let mut acked = Vec::new();
    let mut from = 0;
    // The log of a follower, then the leader's; then the state machine's
    // file of a follower.
    for (which, file) in [
        ("follower", "log/"),
        ("leader", "log/"),
        ("follower", "state.redb"),
    ] {
        let leader = c.leader().await;
        let victim = match which {
            "leader" => leader,
            _ => c.replica_other_than(&[leader]),
        };
        let exited = exit_time(c.procs[&victim].pid());
        let failed_at = Instant::now();
        std::fs::write(&faults[victim as usize - 1], format!("eio {file}")).unwrap();
        let got = put_until_exit(&mut c, victim, from).await;
        eprintln!(
            "{which} {victim}: its {file} failing, it exited after {:?}; {} puts acked meanwhile",
            exited.await.unwrap() - failed_at,
            got.len()
        );
        from += got.len() as u32 + 1000;
        acked.extend(got);
        // The disk serves again; a supervisor restarts it, and it rejoins.
        std::fs::write(&faults[victim as usize - 1], "").unwrap();
        let back = c.restart_and_prove_rejoined(victim).await;
        eprintln!("{which} {victim}: back in a quorum {back:?} after its restart");
    }
    let kv = c.client();
    for n in &acked {
        let key = format!("eio/{n}");
        assert_eq!(
            kv.try_get(key.as_bytes()).await.unwrap(),
            b"v",
            "acknowledged {key}"
        );
    }
}

/// Sequential puts for 5 s; their latencies, sorted.
async fn put_for_5s(kv: &impl KvStore, prefix: &str) -> Vec<Duration> {
    let mut latencies = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let t = Instant::now();
        let key = format!("{prefix}/{}", latencies.len());
        kv.put(key.as_bytes(), b"v").await.unwrap();
        latencies.push(t.elapsed());
    }
    latencies.sort();
    latencies
}

/// [`put_for_5s`] with `fault` in the fault file `file`, healed after: how
/// many puts, their p50 and p99.
async fn put_for_5s_under(
    kv: &impl KvStore,
    file: &std::path::Path,
    fault: &str,
    prefix: &str,
) -> (usize, Duration, Duration) {
    std::fs::write(file, fault).unwrap();
    let l = put_for_5s(kv, prefix).await;
    std::fs::write(file, "").unwrap();
    (l.len(), l[l.len() / 2], l[l.len() * 99 / 100])
}

/// A cluster under the shim whose disks are slowed, the leader's then a
/// follower's, with no election allowed meanwhile.
struct SlowedInTurn {
    c: KvCluster,
    faults: Vec<PathBuf>,
    kv: RaftKv,
    leader: u64,
    follower: u64,
    term: u64,
}

impl SlowedInTurn {
    async fn start() -> SlowedInTurn {
        let (c, faults) = cluster();
        let leader = c.leader().await;
        let follower = c.replica_other_than(&[leader]);
        let kv = c.client();
        let term = term(&kv).await;
        SlowedInTurn {
            c,
            faults,
            kv,
            leader,
            follower,
            term,
        }
    }

    /// The leader, then a follower: (who, id, its fault file).
    fn in_turn(&self) -> [(&'static str, u64, &PathBuf); 2] {
        [("leader", self.leader), ("follower", self.follower)]
            .map(|(who, id)| (who, id, &self.faults[id as usize - 1]))
    }

    /// No new term, and the same leader.
    async fn assert_no_election(&self) {
        assert_eq!(
            term(&self.kv).await,
            self.term,
            "a slow disk caused an election"
        );
        assert_eq!(
            self.c.leader().await,
            self.leader,
            "the leader kept its place"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_log_costs_latency_but_no_election() {
    let t = SlowedInTurn::start().await;
    for (who, _, file) in t.in_turn() {
        let (n, p50, p99) = put_for_5s_under(&t.kv, file, "slow 100 log/", who).await;
        eprintln!("the {who}'s log 100 ms a write: {n} puts, p50 {p50:?}, p99 {p99:?}");
        assert!(p99 < Duration::from_secs(2), "{who}: p99 {p99:?}");
    }
    t.assert_no_election().await;
}

/// The first `Some` of `f`, polled every 100 ms until `within`.
async fn until<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(t) = f() {
            return Some(t);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// The highest term any replica reports.
async fn term(kv: &RaftKv) -> u64 {
    let mut terms = Vec::new();
    for (_, s) in kv.cluster_status().await {
        terms.push(s.unwrap().term);
    }
    terms.into_iter().max().unwrap()
}

/// A state file whose every write and sync stalls 2 s (a disk that hangs
/// behind a full queue): flushes run on their own thread behind an overlay
/// that reads consult (`sm` invariants 1, 6), so writes keep committing,
/// nothing is lost and leadership stays; the replica serves on afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_state_file_delays_flushes_not_writes_or_leadership() {
    let t = SlowedInTurn::start().await;
    let c = &t.c;
    for (who, id, file) in t.in_turn() {
        let prefix = format!("stall-{who}");
        let flushed_before = flush_seconds(c, id);
        let (n, p50, p99) = put_for_5s_under(&t.kv, file, "slow 2000 state.redb", &prefix).await;
        // A flush is timed when it ends: the one the stall held ends now.
        let stalled = until(Duration::from_secs(60), || {
            let took = flush_seconds(c, id) - flushed_before;
            (took >= 2.0).then_some(took)
        })
        .await
        .unwrap_or_else(|| panic!("{who}: no flush took the stall's 2 s"));
        eprintln!(
            "the {who}'s state file 2 s a write: {n} puts, p50 {p50:?}, p99 {p99:?}; flushes took {stalled:.1} s"
        );
        assert!(p99 < Duration::from_secs(2), "{who}: p99 {p99:?}");
        // Every acknowledged put, asked of the stalled replica.
        let own = c.client_of(id);
        let listed = own.list(format!("{prefix}/").as_bytes()).await.unwrap();
        assert_eq!(listed.len(), n, "{who}: acknowledged puts");
    }
    t.assert_no_election().await;
}
