//! Property: a concurrent history of writes and reads, recorded while the
//! leader process is killed (twice), is linearizable. Writes whose outcome
//! the client could not learn count as unknown.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessel_chaos_tests::linearizability::{check, Kind, Op};
use tessel_chaos_tests::nemesis::Lcg;
use tessel_chaos_tests::KvCluster;
use tessel_kv::{KvError, KvStore};

const KEYS: [&str; 4] = ["lin/a", "lin/b", "lin/c", "lin/d"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_recorded_under_leader_kills_is_linearizable() {
    let mut cluster = KvCluster::start(3, &[]);
    let start = Instant::now();
    let now = move || start.elapsed().as_micros() as u64;
    let history: Arc<Mutex<BTreeMap<String, Vec<Op>>>> = Arc::default();
    let mut clients = Vec::new();
    for c in 0..4u64 {
        let kv = cluster.client();
        let history = history.clone();
        clients.push(tokio::spawn(async move {
            let mut rng = Lcg(c + 1);
            for n in 0..40u64 {
                tokio::time::sleep(Duration::from_millis(40)).await;
                let key = KEYS[(rng.draw() % KEYS.len() as u64) as usize];
                let invoke = now();
                let op = if rng.draw() % 2 == 0 {
                    let v = c * 1000 + n;
                    let r = kv.put(key.as_bytes(), &v.to_le_bytes()).await;
                    Some(Op {
                        invoke,
                        // A failed write may still have been applied.
                        complete: r.is_ok().then(now),
                        kind: Kind::Write(v),
                    })
                } else {
                    match kv.try_get(key.as_bytes()).await {
                        Ok(bytes) => Some(Op {
                            invoke,
                            complete: Some(now()),
                            kind: Kind::Read(Some(u64::from_le_bytes(bytes.try_into().unwrap()))),
                        }),
                        Err(KvError::NotFound(_)) => Some(Op {
                            invoke,
                            complete: Some(now()),
                            kind: Kind::Read(None),
                        }),
                        // A failed read has no effect.
                        Err(_) => None,
                    }
                };
                if let Some(op) = op {
                    history
                        .lock()
                        .unwrap()
                        .entry(key.to_owned())
                        .or_default()
                        .push(op);
                }
            }
        }));
    }
    // Kill the leader twice while the clients run; restart the first victim
    // so that a majority survives the second kill.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let first = cluster.leader().await;
    cluster.procs.get_mut(&first).unwrap().kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.restart(first);
    let second = cluster.leader().await;
    cluster.procs.get_mut(&second).unwrap().kill();
    for c in clients {
        c.await.unwrap();
    }
    let history = history.lock().unwrap().clone();
    let total: usize = history.values().map(Vec::len).sum();
    let writes = history
        .values()
        .flatten()
        .filter(|o| matches!(o.kind, Kind::Write(_)))
        .count();
    assert!(
        total >= 100 && writes >= 30,
        "enough history to mean something: {total} ops, {writes} writes"
    );
    let span_ms = history
        .values()
        .flatten()
        .filter_map(|o| o.complete)
        .max()
        .unwrap_or(0)
        / 1000;
    assert!(
        span_ms > 2500,
        "the history spans both kills ({span_ms} ms)"
    );
    check(&history).unwrap();
}
