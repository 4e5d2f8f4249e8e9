//! Global topologies decoded once per process and shared: for a process
//! that runs several of a job's processes (a host's worker with one per
//! device, or the simulated hosts of `tessel-bench bootstrap`, thousands
//! in one process). Each still makes every KV operation of its own; only
//! the decoding of the same published bytes, and the digest, are shared.
//!
//! Invariants:
//! 1. An entry is returned only for bytes equal to those it was decoded
//!    from (compared in full): a job's published value is written once
//!    (`exchange` invariant 2), but nothing here depends on it.
//! 2. Bounded: at most [`MAX_ENTRIES`] jobs' topologies are kept; the
//!    oldest goes first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::Result;
use crate::types::GlobalTopology;

/// Jobs whose topology a cache keeps (invariant 2).
const MAX_ENTRIES: usize = 16;

/// A global topology as this process knows it.
#[derive(Debug)]
pub struct Known {
    topology: GlobalTopology,
    digest: OnceLock<String>,
}

impl Known {
    pub(crate) fn new(topology: GlobalTopology) -> Known {
        Known {
            topology,
            digest: OnceLock::new(),
        }
    }

    /// The topology.
    pub fn topology(&self) -> &GlobalTopology {
        &self.topology
    }

    /// Its digest ([`crate::digest`]), computed once.
    pub fn digest(&self) -> &str {
        self.digest.get_or_init(|| crate::digest(&self.topology))
    }

    pub(crate) fn into_topology(self) -> GlobalTopology {
        self.topology
    }
}

type Slot = Arc<OnceLock<Result<Arc<Known>>>>;
/// (job, the published bytes, their decoding once done).
type Entry = (String, Arc<[u8]>, Slot);

/// Decoded global topologies, by job (invariants 1-2).
#[derive(Default)]
pub struct TopologyCache {
    entries: Mutex<VecDeque<Entry>>,
}

impl TopologyCache {
    /// An empty cache.
    pub fn new() -> TopologyCache {
        TopologyCache::default()
    }

    /// `bytes`, job `job`'s published value, decoded by `decode` unless
    /// the same bytes were decoded already (by another caller meanwhile
    /// too: it waits for that one).
    pub(crate) fn decoded(
        &self,
        job: &str,
        bytes: &[u8],
        decode: impl FnOnce(&[u8]) -> Result<GlobalTopology>,
    ) -> Result<Arc<Known>> {
        let slot = {
            let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
            let found = entries
                .iter()
                .find(|(j, b, _)| j == job && **b == *bytes)
                .map(|(_, _, s)| s.clone());
            found.unwrap_or_else(|| {
                if entries.len() == MAX_ENTRIES {
                    entries.pop_front();
                }
                let slot = Slot::default();
                entries.push_back((job.to_owned(), bytes.into(), slot.clone()));
                slot
            })
        };
        slot.get_or_init(|| decode(bytes).map(|t| Arc::new(Known::new(t))))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TopologyError;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn the_same_bytes_are_decoded_once_and_other_bytes_again() {
        let cache = TopologyCache::new();
        let decodes = AtomicU32::new(0);
        let decode = |_: &[u8]| {
            decodes.fetch_add(1, Ordering::Relaxed);
            Ok(GlobalTopology {
                processes: vec![],
                devices: vec![],
                num_slices: 0,
            })
        };
        let a = cache.decoded("j", b"one", decode).unwrap();
        let b = cache.decoded("j", b"one", decode).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(decodes.load(Ordering::Relaxed), 1);
        let c = cache.decoded("j", b"two", decode).unwrap();
        assert!(
            !Arc::ptr_eq(&a, &c),
            "other bytes are not the same topology"
        );
        cache.decoded("k", b"one", decode).unwrap();
        assert_eq!(decodes.load(Ordering::Relaxed), 3);
        let bad = cache.decoded("x", b"?", |_| Err(TopologyError::Invalid("bad".into())));
        assert!(bad.is_err());
        for i in 0..MAX_ENTRIES {
            cache.decoded(&format!("f{i}"), b"one", decode).unwrap();
        }
        assert_eq!(cache.entries.lock().unwrap().len(), MAX_ENTRIES);
    }
}
