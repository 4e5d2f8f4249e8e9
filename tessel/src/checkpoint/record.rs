//! The record that makes a checkpoint complete, and the pure decisions
//! around it: which records to keep, and where each process's blocks come
//! from in a restore.

use serde::{Deserialize, Serialize};

use crate::job::ShardingSpec;

/// Complete checkpoints kept per job (records, and step folders on every
/// host).
pub const KEEP: usize = 2;

/// Largest record a process decodes (it is one KV value).
pub const MAX_RECORD: usize = tessel_kv::state::MAX_VALUE;

/// A worker that holds a copy of one process's blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The worker's id.
    pub worker: String,
    /// Its host.
    pub hostname: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "worker `{}` on host {}", self.worker, self.hostname)
    }
}

/// One process's blocks: each array's file digest (SHA-256, hex, in the
/// record's array order) and where copies are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocks {
    /// Each array's file digest.
    pub digests: Vec<String>,
    /// The workers holding copies.
    pub holders: Vec<Holder>,
}

/// A complete checkpoint (`jobs/{job}/checkpoints/{step}`, JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The last step the checkpoint includes.
    pub step: u64,
    /// SHA-256 of the spec the checkpoint belongs to.
    pub spec_sha256: String,
    /// The attempt that wrote it (`id@a`).
    pub attempt: String,
    /// Every process saw every other's folder (one shared folder).
    pub shared: bool,
    /// Each array and its sharding when written.
    pub arrays: Vec<(String, ShardingSpec)>,
    /// By process index.
    pub blocks: Vec<Blocks>,
}

impl CheckpointRecord {
    /// JSON, like the other records people read with `tessel kv get`
    /// (reports, results).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record always encodes")
    }

    /// Decodes a record read from the KV, checking its shape: one digest
    /// per array for every process, names that follow [`crate::names`].
    pub fn decode(bytes: &[u8]) -> Result<CheckpointRecord, String> {
        if bytes.len() > MAX_RECORD {
            return Err(format!("a record of {} bytes", bytes.len()));
        }
        let r: CheckpointRecord =
            serde_json::from_slice(bytes).map_err(|e| format!("undecodable record: {e}"))?;
        for (name, _) in &r.arrays {
            crate::names::check("array name", name)?;
        }
        for (p, b) in r.blocks.iter().enumerate() {
            if b.digests.len() != r.arrays.len()
                || b.digests.iter().any(|d| d.len() != 64)
                || b.holders.is_empty()
            {
                return Err(format!("the blocks of process {p} are malformed"));
            }
        }
        Ok(r)
    }

    /// The workers holding process `p`'s blocks, for messages.
    pub fn holders_of(&self, p: usize) -> String {
        self.blocks
            .get(p)
            .map(|b| {
                b.holders
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    }
}

/// The steps whose records and folders stay: the newest [`KEEP`] of
/// `committed`.
pub fn retained(committed: &[u64]) -> Vec<u64> {
    let mut steps = committed.to_vec();
    steps.sort_unstable();
    steps.split_off(steps.len().saturating_sub(KEEP))
}

/// Where each process's blocks come from in a restore: `holds[q][p]` says
/// whether process `q` of the new attempt holds process `p`'s blocks.
/// Process `p` reads its own when it holds them, else the lowest process
/// that does sends them. `Err`: the processes whose blocks nobody holds.
pub fn sources(holds: &[Vec<bool>]) -> Result<Vec<usize>, Vec<usize>> {
    let n = holds.len();
    let mut from = Vec::with_capacity(n);
    let mut missing = Vec::new();
    for p in 0..n {
        if holds[p].get(p) == Some(&true) {
            from.push(p);
        } else if let Some(q) = (0..n).find(|&q| holds[q].get(p) == Some(&true)) {
            from.push(q);
        } else {
            missing.push(p);
            from.push(p);
        }
    }
    if missing.is_empty() {
        Ok(from)
    } else {
        Err(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> CheckpointRecord {
        CheckpointRecord {
            step: 99,
            spec_sha256: "s".into(),
            attempt: "j.1@1".into(),
            shared: false,
            arrays: vec![("w".into(), ShardingSpec::Replicated)],
            blocks: vec![
                Blocks {
                    digests: vec!["0".repeat(64)],
                    holders: vec![
                        Holder {
                            worker: "h4".into(),
                            hostname: "host-4".into(),
                        },
                        Holder {
                            worker: "h5".into(),
                            hostname: "host-5".into(),
                        },
                    ],
                };
                2
            ],
        }
    }

    #[test]
    fn records_round_trip_and_malformed_ones_are_refused() {
        let r = record();
        assert_eq!(CheckpointRecord::decode(&r.encode()).unwrap(), r);
        assert_eq!(
            r.holders_of(1),
            "worker `h4` on host host-4, worker `h5` on host host-5"
        );
        let mut bad = r.clone();
        bad.arrays[0].0 = "../../x".into();
        assert!(CheckpointRecord::decode(&bad.encode()).is_err());
        let mut bad = r.clone();
        bad.blocks[1].digests.clear();
        assert!(CheckpointRecord::decode(&bad.encode()).is_err());
        assert!(CheckpointRecord::decode(b"\xff\xff").is_err());
    }

    #[test]
    fn the_newest_records_are_kept() {
        assert_eq!(retained(&[300, 100, 200]), vec![200, 300]);
        assert_eq!(retained(&[100]), vec![100]);
        assert!(retained(&[]).is_empty());
    }

    /// Own blocks first, else the lowest holder; a process whose blocks
    /// nobody holds is named.
    #[test]
    fn blocks_come_from_their_owner_or_the_lowest_holder() {
        let t = true;
        let f = false;
        // Process 1 lost its disk; process 2 holds a copy (its
        // predecessor's), and so does process 0 (a shared folder).
        assert_eq!(
            sources(&[vec![t, t, f], vec![f, f, f], vec![f, t, t]]),
            Ok(vec![0, 0, 2])
        );
        assert_eq!(
            sources(&[vec![t, f, f], vec![f, f, f], vec![f, f, t]]),
            Err(vec![1])
        );
    }
}
