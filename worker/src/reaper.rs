//! Reaping orphans when tessel is a container's PID 1 (started without
//! `--init`): a command job's grandchildren that outlive their parents are
//! handed to PID 1, and would stay zombies otherwise.
//!
//! Invariants:
//! 1. Only a zombie child that no one in this process waits for is reaped:
//!    not one the worker started itself (`own`), and only once it has
//!    stayed a zombie across two scans a second apart (any waiter of ours
//!    reaps at once).
//! 2. Nothing runs unless this process is PID 1.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

static OWN: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

/// Marks `pid` as a child this process waits for itself.
pub(crate) fn own(pid: i32) {
    OWN.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(pid);
}

/// `pid` was waited for.
pub(crate) fn disown(pid: i32) {
    if let Some(s) = OWN.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
        s.remove(&pid);
    }
}

/// `(pid, parent pid, state)` from `/proc/PID/stat` (the command name may
/// hold spaces and parentheses: the fields follow the last `)`).
pub fn parse_stat(stat: &str) -> Option<(i32, i32, char)> {
    let pid = stat.split_whitespace().next()?.parse().ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((pid, ppid, state))
}

/// The zombies to reap now, given the zombie children seen in the last
/// scan (invariant 1): pure.
pub fn to_reap(zombies: &HashSet<i32>, last: &HashSet<i32>, own: &HashSet<i32>) -> Vec<i32> {
    let mut v: Vec<i32> = zombies
        .iter()
        .filter(|p| last.contains(p) && !own.contains(p))
        .copied()
        .collect();
    v.sort_unstable();
    v
}

fn zombie_children(me: i32) -> HashSet<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashSet::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| parse_stat(&s))
        .filter(|&(_, ppid, state)| ppid == me && state == 'Z')
        .map(|(pid, _, _)| pid)
        .collect()
}

/// Starts the reaper when this process is PID 1 (invariant 2).
pub fn start_if_init() {
    if std::process::id() != 1 {
        return;
    }
    tracing::info!("running as PID 1: reaping orphaned processes");
    std::thread::Builder::new()
        .name("tessel-reaper".into())
        .spawn(|| {
            let mut last = HashSet::new();
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let zombies = zombie_children(1);
                let own = OWN
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
                    .unwrap_or_default();
                for pid in to_reap(&zombies, &last, &own) {
                    let _ = nix::sys::wait::waitpid(
                        nix::unistd::Pid::from_raw(pid),
                        Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                    );
                }
                last = zombies;
            }
        })
        .expect("a thread");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_past_odd_command_names() {
        assert_eq!(parse_stat("42 (python3) Z 1 42 42 0"), Some((42, 1, 'Z')));
        assert_eq!(parse_stat("7 (a) b (c)) S 3 7"), Some((7, 3, 'S')));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn only_lingering_orphans_are_reaped() {
        let set = |v: &[i32]| v.iter().copied().collect::<HashSet<i32>>();
        // 5 is new (a waiter may still take it), 6 is ours, 7 lingered.
        assert_eq!(
            to_reap(&set(&[5, 6, 7]), &set(&[6, 7]), &set(&[6])),
            vec![7]
        );
        assert!(to_reap(&set(&[]), &set(&[7]), &set(&[])).is_empty());
    }
}
