//! A process's CPU time by thread role, from `/proc/PID/task`: where a
//! replica's time goes without a profiler, reported by the benchmarks
//! beside each replica's total.
//!
//! A replica names its threads by role: `quic-io` (its QUIC stack),
//! `raft-core-N` (the Raft core, its replication, and the applying of
//! entries), `tokio-rt-worker` (the request runtime: reads, waits,
//! watches, relays), `state-flush` (the state's writes to redb),
//! `raft-log-writer` (the log's), `tessel` (the main thread). A trailing
//! `-N` is dropped, so the replicas' threads of one role add up. CPU of
//! threads that ended within the window is counted as `ended`: the
//! process's total, which keeps it, less its live threads'.

use std::collections::BTreeMap;

use crate::simulated::{leader_at, stat_cpu_ns};

/// Each live thread's role and CPU time so far, and the process's total.
#[derive(Default)]
pub(crate) struct Threads {
    total_ns: u64,
    by_tid: BTreeMap<u32, (String, u64)>,
}

/// `pid`'s threads now (empty where `/proc` cannot be read).
pub(crate) fn snapshot(pid: u32) -> Threads {
    let read = |path: String| std::fs::read_to_string(path).unwrap_or_default();
    let mut by_tid = BTreeMap::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            let stat = read(format!("/proc/{pid}/task/{tid}/stat"));
            if let Some(name) = thread_name(&stat) {
                by_tid.insert(tid, (role(name).to_owned(), stat_cpu_ns(&stat)));
            }
        }
    }
    Threads {
        total_ns: stat_cpu_ns(&read(format!("/proc/{pid}/stat"))),
        by_tid,
    }
}

/// CPU time (ns) by role between `before` and `after`, with `ended`.
pub(crate) fn since(before: &Threads, after: &Threads) -> BTreeMap<String, u64> {
    let mut roles: BTreeMap<String, u64> = BTreeMap::new();
    let mut live = 0;
    for (tid, (role, ns)) in &after.by_tid {
        let from = before.by_tid.get(tid).map_or(0, |(_, b)| *b);
        let spent = ns.saturating_sub(from);
        live += spent;
        *roles.entry(role.clone()).or_default() += spent;
    }
    let total = after.total_ns.saturating_sub(before.total_ns);
    roles.insert("ended".into(), total.saturating_sub(live));
    roles
}

/// Each of `pids` now ([`snapshot`]), to measure from.
pub(crate) fn snapshots(pids: &[u32]) -> Vec<Threads> {
    pids.iter().map(|p| snapshot(*p)).collect()
}

/// The CPU by role of each of `pids` since `before` ([`snapshots`]).
pub(crate) fn since_each(pids: &[u32], before: &[Threads]) -> Vec<BTreeMap<String, u64>> {
    pids.iter()
        .zip(before)
        .map(|(p, b)| since(b, &snapshot(*p)))
        .collect()
}

/// `spent` ([`since_each`]) split into the leader's and the others'
/// together, the leader picked as `simulated::split` picks it.
pub(crate) fn leader_and_others(
    spent: &[BTreeMap<String, u64>],
    leader: Option<usize>,
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let totals: Vec<u64> = spent.iter().map(|roles| roles.values().sum()).collect();
    let at = leader_at(&totals, leader);
    let mut others: BTreeMap<String, u64> = BTreeMap::new();
    for roles in spent
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != at)
        .map(|(_, r)| r)
    {
        for (role, ns) in roles {
            *others.entry(role.clone()).or_default() += ns;
        }
    }
    (spent.get(at).cloned().unwrap_or_default(), others)
}

/// `{"quic-io":MS,…}`, roles under 10 ms (one `/proc` tick) left out.
pub(crate) fn json_ms(roles: &BTreeMap<String, u64>) -> String {
    json(roles, |ns| (ns / 1_000_000).to_string())
}

/// `{"quic-io":PERCENT,…}` of one core over `elapsed`, one decimal;
/// roles under 10 ms left out.
pub(crate) fn json_percent(roles: &BTreeMap<String, u64>, elapsed: std::time::Duration) -> String {
    let of = elapsed.as_nanos().max(1) as f64;
    json(roles, |ns| format!("{:.1}", ns as f64 / of * 100.0))
}

fn json(roles: &BTreeMap<String, u64>, value: impl Fn(u64) -> String) -> String {
    let each: Vec<String> = roles
        .iter()
        .filter(|(_, ns)| **ns >= 10_000_000)
        .map(|(role, ns)| format!("\"{role}\":{}", value(*ns)))
        .collect();
    format!("{{{}}}", each.join(","))
}

/// The thread's name in a `stat` line: between the first `(` and the last
/// `)`, as it may hold either.
fn thread_name(stat: &str) -> Option<&str> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    stat.get(open + 1..close)
}

/// A thread's name without a trailing `-N` (`raft-core-2` → `raft-core`).
fn role(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((stem, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => stem,
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_role_is_the_name_without_its_number() {
        assert_eq!(role("raft-core-12"), "raft-core");
        assert_eq!(role("tokio-rt-worker"), "tokio-rt-worker");
        assert_eq!(role("quic-io"), "quic-io");
        assert_eq!(role("odd-"), "odd-");
        let stat = "42 (a) b-3) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0";
        assert_eq!(thread_name(stat), Some("a) b-3"));
        assert_eq!(stat_cpu_ns(stat), 3_000_000_000);
    }

    /// A named thread's CPU is counted under its role, and a thread that
    /// ends within the window under `ended`.
    #[test]
    fn a_threads_cpu_is_counted_under_its_role_or_as_ended() {
        let before = snapshot(std::process::id());
        let thread = |name: &str, then: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    spin_own_cpu();
                    then()
                })
                .unwrap()
        };
        thread("spin-1", Box::new(|| {})).join().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let held = thread(
            "spin-2",
            Box::new(move || {
                let _ = rx.recv();
            }),
        );
        // spin-2 is still alive here, its CPU spent.
        let deadline = Instant::now() + Duration::from_secs(20);
        let roles = loop {
            let roles = since(&before, &snapshot(std::process::id()));
            if roles.get("spin").copied().unwrap_or(0) >= 50_000_000 || Instant::now() > deadline {
                break roles;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        tx.send(()).unwrap();
        held.join().unwrap();
        let of = |role: &str| roles.get(role).copied().unwrap_or(0);
        assert!(of("spin") >= 50_000_000, "{roles:?}");
        assert!(of("ended") >= 50_000_000, "spin-1's CPU: {roles:?}");
        assert!(!roles.contains_key("spin-2"), "{roles:?}");
    }

    /// Spends 60 ms of this thread's own CPU, however loaded the machine.
    fn spin_own_cpu() {
        let started = Instant::now();
        let mut x = 0u64;
        while own_cpu_ns() < 60_000_000 && started.elapsed() < Duration::from_secs(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
    }

    fn own_cpu_ns() -> u64 {
        stat_cpu_ns(&std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default())
    }
}
