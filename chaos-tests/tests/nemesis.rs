//! Property: under a seeded schedule of faults (kills, pauses, wall-clock
//! steps, full disks, one-way, two-way and flapping partitions of the
//! leader or a follower: `nemesis::schedule`), a history of puts, reads,
//! deletes and compare-and-swaps from four clients is linearizable; a watch delivers
//! every acknowledged write's revision once, in order; a lease kept alive
//! never expires.
//!
//! Five seeds run here; `scripts/soak` runs many (`TESSEL_NEMESIS_SEEDS`).
//! A failing seed prints its schedule and reruns with
//! `TESSEL_NEMESIS_SEEDS=N cargo test -p tessel-chaos-tests --test nemesis -- --ignored`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tessel_chaos_tests::faults::{
    faketime_replicas, step_clock, sweep_stale_rules, udp_ports, PortDrop, Tmpfs,
};
use tessel_chaos_tests::linearizability::{check, Kind, Op};
use tessel_chaos_tests::nemesis::{
    schedule, worker_schedule, Fault, Lcg, Step, Target, WorkerFault,
};
use tessel_chaos_tests::{leader_of, KvCluster, Signal};
use tessel_kv::{CasOutcome, Event, KvStore};

const KEYS: usize = 8;
const OPS_PER_CLIENT: u64 = 100;
const OP_DEADLINE: Duration = Duration::from_millis(1500);
/// How long a flapping link stays cut, then open.
const FLAP: Duration = Duration::from_millis(300);

type History = Arc<Mutex<BTreeMap<String, Vec<Op>>>>;
/// Acknowledged puts and swaps: (revision, key, value).
type Acked = Arc<Mutex<Vec<(u64, String, u64)>>>;

fn decode(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().expect("8-byte values only"))
}

/// One client: `OPS_PER_CLIENT` operations, key `(n + c) % KEYS` (about
/// 50 per key, within the checker's 64).
async fn client(c: u64, kv: Arc<dyn KvStore>, t0: Instant, history: History, acked: Acked) {
    let now = || t0.elapsed().as_micros() as u64;
    let mut rng = Lcg(c * 7919 + 1);
    let mut last_seen: BTreeMap<usize, Option<u64>> = BTreeMap::new();
    for n in 0..OPS_PER_CLIENT {
        tokio::time::sleep(Duration::from_millis(60 + rng.below(60))).await;
        let k = ((n + c) % KEYS as u64) as usize;
        let key = format!("nem/{k}");
        let v = c * 100_000 + n + 1;
        let invoke = now();
        let (kind, ok) = match rng.below(20) {
            0..=7 => {
                match tokio::time::timeout(OP_DEADLINE, kv.put(key.as_bytes(), &v.to_le_bytes()))
                    .await
                {
                    Ok(Ok(rev)) => {
                        acked.lock().unwrap().push((rev, key.clone(), v));
                        (Kind::Write(v), true)
                    }
                    _ => (Kind::Write(v), false),
                }
            }
            8..=13 => match tokio::time::timeout(OP_DEADLINE, kv.try_get(key.as_bytes())).await {
                Ok(Ok(b)) => (Kind::Read(Some(decode(&b))), true),
                Ok(Err(tessel_kv::KvError::NotFound(_))) => (Kind::Read(None), true),
                _ => continue, // A failed read has no effect.
            },
            14..=16 => {
                let expect = last_seen.get(&k).copied().flatten();
                let (bytes, new) = (expect.map(u64::to_le_bytes), v.to_le_bytes());
                let cas = kv.compare_and_swap(key.as_bytes(), bytes.as_ref().map(|b| &b[..]), &new);
                let (found, ok) = match tokio::time::timeout(OP_DEADLINE, cas).await {
                    Ok(Ok(CasOutcome::Swapped { revision })) => {
                        acked.lock().unwrap().push((revision, key.clone(), v));
                        (None, true)
                    }
                    Ok(Ok(CasOutcome::Mismatch { current })) => {
                        (Some(current.as_deref().map(decode)), true)
                    }
                    _ => (None, false),
                };
                (
                    Kind::Cas {
                        expect,
                        new: v,
                        found,
                    },
                    ok,
                )
            }
            _ => match tokio::time::timeout(OP_DEADLINE, kv.delete(key.as_bytes())).await {
                Ok(Ok(_)) => (Kind::Delete, true),
                _ => (Kind::Delete, false),
            },
        };
        last_seen.insert(
            k,
            match &kind {
                Kind::Read(r) => *r,
                Kind::Write(v) if ok => Some(*v),
                Kind::Cas { found: Some(f), .. } if ok => *f,
                Kind::Cas { new, .. } if ok => Some(*new),
                Kind::Delete if ok => None,
                _ => last_seen.get(&k).copied().flatten(),
            },
        );
        let complete = ok.then(now);
        history.lock().unwrap().entry(key).or_default().push(Op {
            invoke,
            complete,
            kind,
        });
    }
}

/// Every event under `nem/`, re-watching after the last revision seen
/// whenever the stream breaks, until `stop` and the last acknowledged
/// write's revision is reached. Not until the stream is quiet for a while:
/// a quiet stream does not show the watch caught up (one being resumed
/// after a replica's loss says nothing meanwhile), and taking it so would
/// report a slow watch as a lost write; a lost event still fails, here or
/// in the check.
async fn watcher(kv: Arc<dyn KvStore>, stop: Arc<AtomicBool>, acked: Acked) -> Vec<Event> {
    let mut events: Vec<Event> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut target = None;
    while Instant::now() < deadline {
        let from = events.last().map_or(1, |e| e.revision() + 1);
        if let Ok(mut stream) = kv.watch(b"nem/", from).await {
            loop {
                if stop.load(Ordering::Relaxed) && target.is_none() {
                    let last = acked.lock().unwrap().iter().map(|(rev, ..)| *rev).max();
                    target = Some(last.unwrap_or(0));
                }
                let reached = |events: &Vec<Event>| {
                    target.is_some_and(|t| events.last().map_or(0, |e| e.revision()) >= t)
                };
                if reached(&events) {
                    return events;
                }
                match tokio::time::timeout(Duration::from_millis(500), stream.next()).await {
                    Ok(Some(Ok(e))) => events.push(e),
                    Ok(_) => break,
                    Err(_) => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let last = events.last().map(|e| e.revision());
    panic!("the watch did not catch up within 180 s: last revision watched {last:?}, wanted {target:?}");
}

/// A lease of 10 s, with a key, kept alive every second until `stop`;
/// returns the lease and the longest time between acknowledged
/// keep-alives.
async fn lease_keeper(kv: Arc<dyn KvStore>, stop: Arc<AtomicBool>) -> (u64, Duration) {
    let lease = kv.grant(Duration::from_secs(10)).await.unwrap();
    kv.put_with_lease(b"nem-lease/k", b"v", lease)
        .await
        .unwrap();
    let (mut last, mut gap) = (Instant::now(), Duration::ZERO);
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(3), kv.keep_alive(lease)).await
        {
            gap = gap.max(last.elapsed());
            last = Instant::now();
        }
    }
    gap = gap.max(last.elapsed());
    (lease, gap)
}

/// Fields drop in this order: the replicas' tmpfs mounts first, so that
/// the cluster's temporary folder, which holds the mount points, can then
/// be removed (it was left behind, with the TLS keys, on every run).
struct Rig {
    disks: Vec<Tmpfs>,
    c: KvCluster,
    clocks: Vec<PathBuf>,
}

impl Rig {
    fn start() -> Rig {
        sweep_stale_rules();
        let mut c = KvCluster::prepare();
        let disks: Vec<Tmpfs> = (1..=3)
            .map(|id| Tmpfs::mount(&c.data_dir(id), "64m"))
            .collect();
        let clocks = faketime_replicas(&mut c, 3);
        c.start_prepared(3, &[]);
        Rig { disks, c, clocks }
    }

    /// Every port replica `id` sends from: its listening socket and its
    /// Raft core's (node invariant 11), as a cut between hosts covers all
    /// of a host's sockets.
    fn ports(&self, id: u64) -> Vec<u16> {
        let ports = udp_ports(self.c.procs[&id].pid());
        assert!(
            ports.contains(&self.c.procs[&id].addr.port()),
            "replica {id}'s sockets {ports:?} lack its listening port"
        );
        ports
    }

    /// The port pairs that carry what replica `from` sends to `to`.
    fn carrying(&self, from: u64, to: u64) -> Vec<(u16, u16)> {
        let to = self.ports(to);
        self.ports(from)
            .into_iter()
            .flat_map(|f| to.iter().map(move |&t| (f, t)))
            .collect()
    }

    /// Restarts every replica that exited (a supervisor's job).
    fn supervise(&mut self) {
        for id in 1..=3 {
            if self
                .c
                .procs
                .get_mut(&id)
                .unwrap()
                .child
                .try_wait()
                .is_some()
            {
                self.c.restart(id);
            }
        }
    }

    async fn apply(&mut self, step: &Step) {
        // A replica may exit after the last check (a full disk's leader
        // serves for seconds first); a supervisor would have restarted it.
        self.supervise();
        let leader = leader_of(&self.c.client(), Duration::from_secs(30)).await;
        let v = match step.target {
            Target::Leader => leader,
            Target::Follower => self.c.replica_other_than(&[leader]),
        };
        let others: Vec<u64> = (1..=3).filter(|&i| i != v).collect();
        let i = v as usize - 1;
        match &step.fault {
            Fault::Kill => {
                self.c.procs.get_mut(&v).unwrap().kill();
                tokio::time::sleep(step.lasts).await;
                self.c.restart(v);
            }
            Fault::Pause => {
                self.c.procs[&v].signal(Signal::SIGSTOP);
                tokio::time::sleep(step.lasts).await;
                self.c.procs[&v].signal(Signal::SIGCONT);
            }
            Fault::ClockStep(offset) => {
                step_clock(&self.clocks[i], offset).await;
                tokio::time::sleep(step.lasts).await;
                step_clock(&self.clocks[i], "+0").await;
            }
            Fault::DiskFull => {
                let filler = self.disks[i].fill();
                tokio::time::sleep(step.lasts).await;
                std::fs::remove_file(filler).unwrap();
            }
            Fault::OneWay => {
                let cut = PortDrop::new(&self.carrying(v, others[0]));
                tokio::time::sleep(step.lasts).await;
                proven(|| cut.dropped()).await;
            }
            Fault::Isolate | Fault::Flap => {
                let pairs: Vec<(u16, u16)> = others
                    .iter()
                    .flat_map(|&o| [self.carrying(v, o), self.carrying(o, v)].concat())
                    .collect();
                let (flap, end) = (step.fault == Fault::Flap, Instant::now() + step.lasts);
                let mut dropped = 0;
                while Instant::now() < end {
                    let cut = PortDrop::new(&pairs);
                    let on = if flap { FLAP } else { step.lasts };
                    tokio::time::sleep(on).await;
                    dropped += cut.dropped();
                    if Instant::now() >= end && dropped == 0 {
                        proven(|| cut.dropped()).await;
                    }
                    drop(cut);
                    if flap {
                        tokio::time::sleep(FLAP).await;
                    }
                }
            }
        }
        self.supervise();
    }
}

/// Keeps a cut in place until it has dropped a datagram, at most 10 s
/// more: a link can be quiet for a second (its far end down and left on
/// silence, `rpc` invariant 4), and a cut that never dropped anything
/// tested nothing.
async fn proven(dropped: impl Fn() -> u64) {
    let until = Instant::now() + Duration::from_secs(10);
    while dropped() == 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(dropped() > 0, "the cut dropped nothing, kept 10 s longer");
}

async fn run_seed(seed: u64) {
    let steps = schedule(seed, 5);
    eprintln!("nemesis seed {seed}: {steps:?}");
    let mut rig = Rig::start();
    let t0 = Instant::now();
    let (history, acked): (History, Acked) = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let kv = |rig: &Rig| -> Arc<dyn KvStore> { Arc::new(rig.c.client()) };
    // The history's clients retry as every tessel client does: each write
    // is applied once however often it is sent (`client` invariant 2).
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let kv = Arc::new(rig.c.client());
            tokio::spawn(client(c, kv, t0, history.clone(), acked.clone()))
        })
        .collect();
    let watch = tokio::spawn(watcher(kv(&rig), stop.clone(), acked.clone()));
    let keeper = tokio::spawn(lease_keeper(kv(&rig), stop.clone()));
    for step in &steps {
        tokio::time::sleep(step.after).await;
        rig.apply(step).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (lease, gap) = keeper.await.unwrap();
    let events = watch.await.unwrap();

    // One last read of every key joins the history.
    let kv = kv(&rig);
    for k in 0..KEYS {
        let key = format!("nem/{k}");
        let invoke = t0.elapsed().as_micros() as u64;
        let value = match kv.try_get(key.as_bytes()).await {
            Ok(b) => Some(decode(&b)),
            Err(tessel_kv::KvError::NotFound(_)) => None,
            Err(e) => panic!("seed {seed}: reading {key} after the faults: {e}"),
        };
        let complete = Some(t0.elapsed().as_micros() as u64);
        let op = Op {
            invoke,
            complete,
            kind: Kind::Read(value),
        };
        history.lock().unwrap().entry(key).or_default().push(op);
    }
    let history = history.lock().unwrap().clone();
    let acknowledged = history
        .values()
        .flatten()
        .filter(|o| o.complete.is_some())
        .count();
    eprintln!("seed {seed}: {acknowledged} operations acknowledged, {} events watched, longest keep-alive gap {gap:?}", events.len());
    assert!(
        acknowledged >= 150,
        "seed {seed}: too little history ({acknowledged})"
    );
    check(&history).unwrap_or_else(|e| panic!("seed {seed}: {e}"));

    // The watch: each revision once, in order, every acknowledged write there.
    assert!(
        events.windows(2).all(|w| w[0].revision() < w[1].revision()),
        "seed {seed}: watch revisions repeat or go back"
    );
    let by_rev: BTreeMap<u64, &Event> = events.iter().map(|e| (e.revision(), e)).collect();
    for (rev, key, v) in acked.lock().unwrap().iter() {
        match by_rev.get(rev) {
            Some(Event::Put(kv)) if kv.key == key.as_bytes() && decode(&kv.value) == *v => {}
            other => panic!("seed {seed}: write of {key} at revision {rev} watched as {other:?}"),
        }
    }
    // The lease: kept alive at least every 8 s, so it lives.
    if gap < Duration::from_secs(8) {
        assert!(
            kv.try_get(b"nem-lease/k").await.is_ok(),
            "seed {seed}: lease {lease} expired though renewed every {gap:?} at worst"
        );
    }
}

/// Jobs under the nemesis: the MLP demo runs while seed 11's schedule
/// (the leader isolated, a follower paused, a follower isolated, the
/// leader's disk full) hits the coordinators and, between those, its own
/// workers are killed and restarted or paused past their TTL (nemesis
/// invariant 3); it ends Succeeded with exactly the parameters of a calm
/// run, and its events' causes are printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_under_the_nemesis_ends_with_a_calm_runs_parameters() {
    use tessel::client::Client;
    use tessel_chaos_tests::mlp::{mlp_dir, mlp_job, mlp_params};
    use tessel_chaos_tests::{job_worker_flags, spawn_worker};
    use tessel_coordinator::scheduler::JobState;

    let mut rig = Rig::start();
    let ckpt = rig.c.dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    let flags = job_worker_flags(&ckpt);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut workers: Vec<_> = (0..4)
        .map(|i| spawn_worker(&rig.c, &format!("w{i}"), &flags))
        .collect();
    let client = Client::from_store(Arc::new(rig.c.client()));
    // Every worker fault may cost a restart, as may the coordinators'.
    let job = || mlp_job(&mlp_dir(), "job.toml", 1500, 12, &ckpt);
    let calm = client.submit(&job()).await.unwrap();
    let done = client.wait(&calm).await.unwrap();
    assert_eq!(done.state, JobState::Succeeded, "{:?}", done.reason);

    let id = client.submit(&job()).await.unwrap();
    let steps = schedule(11, 4);
    let worker_steps = worker_schedule(11, 4, workers.len());
    eprintln!("the job's nemesis: {steps:?}, on its workers {worker_steps:?}");
    let mut running_at_a_worker_fault = 0;
    for (step, w) in steps.iter().zip(&worker_steps) {
        tokio::time::sleep(step.after).await;
        rig.apply(step).await;
        tokio::time::sleep(w.after).await;
        let status = client.job(&id).await.unwrap();
        running_at_a_worker_fault += usize::from(!status.state.is_terminal());
        let name = format!("w{}", w.worker);
        match w.fault {
            WorkerFault::Kill => {
                workers[w.worker].kill();
                tokio::time::sleep(w.lasts).await;
                workers[w.worker] = spawn_worker(&rig.c, &name, &flags);
            }
            WorkerFault::Pause => {
                workers[w.worker].child.signal(Signal::SIGSTOP);
                tokio::time::sleep(w.lasts).await;
                workers[w.worker].child.signal(Signal::SIGCONT);
            }
        }
    }
    let end = tokio::time::timeout(Duration::from_secs(300), client.wait(&id))
        .await
        .expect("the job ended within 300 s of the last fault")
        .unwrap();
    let kv = rig.c.client();
    let causes: Vec<String> = tessel_coordinator::Records::new(&kv, &id)
        .events()
        .await
        .unwrap()
        .iter()
        .filter_map(|(_, v)| {
            let e: tessel_coordinator::scheduler::JobEvent = postcard::from_bytes(v).ok()?;
            Some(format!(
                "{} → {}: {}",
                e.from,
                e.to,
                e.reason.unwrap_or_default()
            ))
        })
        .collect();
    eprintln!(
        "the job under the nemesis: {} after {} attempt(s), {} restart(s); {causes:#?}",
        end.state, end.attempt, end.restarts
    );
    assert_eq!(end.state, JobState::Succeeded, "{:?}", end.reason);
    assert!(
        running_at_a_worker_fault > 0,
        "the job ended before any worker fault: they tested nothing"
    );
    assert_eq!(
        mlp_params(&client, &id).await,
        mlp_params(&client, &calm).await,
        "the parameters of a calm run"
    );
}

macro_rules! seeds {
    ($($name:ident = $seed:expr),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            run_seed($seed).await;
        }
    )*};
}

seeds!(seed_1 = 1, seed_2 = 2, seed_3 = 3, seed_4 = 4, seed_5 = 5);

/// `TESSEL_NEMESIS_SEEDS=FIRST-LAST` (or one seed): the soak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the soak: scripts/soak"]
async fn soak() {
    let spec = std::env::var("TESSEL_NEMESIS_SEEDS").unwrap_or_else(|_| "1-100".into());
    let (first, last) = match spec.split_once('-') {
        Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
        None => (spec.parse().unwrap(), spec.parse().unwrap()),
    };
    for seed in first..=last {
        run_seed(seed).await;
    }
}
