//! A linearizability checker for histories of single-key registers
//! (Wing & Gong's search with memoization, per key: registers compose):
//! writes, deletes, reads and compare-and-swaps.
//!
//! A write whose outcome is unknown (it timed out or its connection broke)
//! may take effect at any point after it was invoked, or never. A read
//! that failed has no effect and is left out of the history.

use std::collections::{BTreeMap, HashSet};

/// One completed or indeterminate operation on one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Invocation time (any monotonic unit).
    pub invoke: u64,
    /// Completion time; `None` for a write with unknown outcome.
    pub complete: Option<u64>,
    /// What the operation did.
    pub kind: Kind,
}

/// An operation on the one register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Wrote the value.
    Write(u64),
    /// Read the value (`None`: the key did not exist).
    Read(Option<u64>),
    /// Deleted the key.
    Delete,
    /// Compare-and-swap: `new` if the value was `expect`; when known,
    /// `found` is `None` for a swap, else the value the mismatch reported.
    Cas {
        /// The value expected (`None`: absent).
        expect: Option<u64>,
        /// The value written on a match.
        new: u64,
        /// `Some(v)`: a mismatch that found `v` (`Some(None)`: absent).
        found: Option<Option<u64>>,
    },
}

/// Checks every key's history; returns the first key that has no
/// linearization.
pub fn check(history: &BTreeMap<String, Vec<Op>>) -> Result<(), String> {
    for (key, ops) in history {
        if !linearizable(ops) {
            return Err(format!("history of key {key} is not linearizable: {ops:?}"));
        }
    }
    Ok(())
}

/// Whether one register's history has a linearization starting from
/// "absent".
pub fn linearizable(ops: &[Op]) -> bool {
    assert!(
        ops.len() <= 64,
        "the search handles up to 64 operations per key"
    );
    let mut seen = HashSet::new();
    search(ops, 0u64, None, &mut seen)
}

fn search(
    ops: &[Op],
    done: u64,
    value: Option<u64>,
    seen: &mut HashSet<(u64, Option<u64>)>,
) -> bool {
    // Success once every operation with a known outcome is linearized.
    let required_left = ops
        .iter()
        .enumerate()
        .any(|(i, o)| done & (1 << i) == 0 && o.complete.is_some());
    if !required_left {
        return true;
    }
    if !seen.insert((done, value)) {
        return false;
    }
    // An operation may go next only if it was invoked before every pending
    // known operation completed.
    let horizon = ops
        .iter()
        .enumerate()
        .filter(|(i, _)| done & (1 << i) == 0)
        .filter_map(|(_, o)| o.complete)
        .min()
        .unwrap_or(u64::MAX);
    for (i, o) in ops.iter().enumerate() {
        if done & (1 << i) != 0 || o.invoke > horizon {
            continue;
        }
        let next = match o.kind {
            Kind::Write(v) => Some(Some(v)),
            Kind::Delete => Some(None),
            Kind::Read(r) => (r == value).then_some(value),
            // Unknown outcome: if it took effect here, it swapped on a
            // match and did nothing otherwise.
            Kind::Cas { expect, new, .. } if o.complete.is_none() => {
                Some(if value == expect { Some(new) } else { value })
            }
            Kind::Cas {
                expect,
                new,
                found: None,
            } => (value == expect).then_some(Some(new)),
            Kind::Cas {
                expect,
                found: Some(found),
                ..
            } => (value != expect && value == found).then_some(value),
        };
        if let Some(v) = next {
            if search(ops, done | (1 << i), v, seen) {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(invoke: u64, complete: Option<u64>, v: u64) -> Op {
        Op {
            invoke,
            complete,
            kind: Kind::Write(v),
        }
    }
    fn r(invoke: u64, complete: u64, v: Option<u64>) -> Op {
        Op {
            invoke,
            complete: Some(complete),
            kind: Kind::Read(v),
        }
    }

    #[test]
    fn sequential_histories() {
        assert!(linearizable(&[w(0, Some(1), 1), r(2, 3, Some(1))]));
        assert!(
            !linearizable(&[w(0, Some(1), 1), r(2, 3, None)]),
            "a completed write must be seen"
        );
        assert!(
            !linearizable(&[w(0, Some(1), 1), w(2, Some(3), 2), r(4, 5, Some(1))]),
            "no going back"
        );
    }

    #[test]
    fn concurrent_operations_may_order_either_way() {
        // A read overlapping a write may see the old or the new value.
        assert!(linearizable(&[w(0, Some(10), 1), r(1, 2, None)]));
        assert!(linearizable(&[w(0, Some(10), 1), r(1, 2, Some(1))]));
        // But two sequential reads inside the write cannot see new then old.
        assert!(!linearizable(&[
            w(0, Some(10), 1),
            r(1, 2, Some(1)),
            r(3, 4, None)
        ]));
    }

    #[test]
    fn unknown_writes_may_or_may_not_happen() {
        assert!(linearizable(&[w(0, None, 7), r(5, 6, None)]));
        assert!(linearizable(&[w(0, None, 7), r(5, 6, Some(7))]));
        // ...but not before they were invoked.
        assert!(!linearizable(&[r(0, 1, Some(7)), w(2, None, 7)]));
    }

    fn cas(
        invoke: u64,
        complete: Option<u64>,
        expect: Option<u64>,
        new: u64,
        found: Option<Option<u64>>,
    ) -> Op {
        Op {
            invoke,
            complete,
            kind: Kind::Cas { expect, new, found },
        }
    }

    #[test]
    fn deletes_and_compare_and_swaps() {
        let del = |i, c| Op {
            invoke: i,
            complete: Some(c),
            kind: Kind::Delete,
        };
        assert!(linearizable(&[w(0, Some(1), 1), del(2, 3), r(4, 5, None)]));
        assert!(!linearizable(&[
            w(0, Some(1), 1),
            del(2, 3),
            r(4, 5, Some(1))
        ]));
        // A swap needs its expected value; a mismatch reports what was there.
        assert!(linearizable(&[
            w(0, Some(1), 1),
            cas(2, Some(3), Some(1), 2, None),
            r(4, 5, Some(2))
        ]));
        assert!(!linearizable(&[
            w(0, Some(1), 1),
            cas(2, Some(3), Some(9), 2, None)
        ]));
        assert!(linearizable(&[
            w(0, Some(1), 1),
            cas(2, Some(3), Some(9), 2, Some(Some(1)))
        ]));
        assert!(!linearizable(&[
            w(0, Some(1), 1),
            cas(2, Some(3), Some(1), 2, Some(Some(1)))
        ]));
        assert!(!linearizable(&[
            w(0, Some(1), 1),
            cas(2, Some(3), Some(9), 2, Some(None))
        ]));
        // Unknown: may have swapped, or not.
        assert!(linearizable(&[
            w(0, Some(1), 1),
            cas(2, None, Some(1), 2, None),
            r(4, 5, Some(2))
        ]));
        assert!(linearizable(&[
            w(0, Some(1), 1),
            cas(2, None, Some(1), 2, None),
            r(4, 5, Some(1))
        ]));
        assert!(!linearizable(&[
            w(0, Some(1), 1),
            cas(2, None, Some(7), 2, None),
            r(4, 5, Some(2))
        ]));
    }

    #[test]
    fn reads_of_values_never_written_fail() {
        assert!(!linearizable(&[r(0, 1, Some(3))]));
    }
}
