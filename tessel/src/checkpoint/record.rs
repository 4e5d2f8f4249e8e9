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
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

/// One process's blocks in a record written before version 2: each
/// array's file digest (SHA-256, hex, in the record's array order) and
/// where copies are. Still read, so that a job restarted across an
/// upgrade restores its checkpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocks {
    /// Each array's file digest.
    pub digests: Vec<String>,
    /// The workers holding copies.
    pub holders: Vec<Holder>,
}

/// One process's blocks (version 2): one digest for all its arrays
/// ([`blocks_digest`]) and the workers holding copies, as indices into
/// the record's `workers`. Its size does not grow with the arrays, nor a
/// holder's name with the processes it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessBlocks {
    /// [`blocks_digest`] of its arrays' file digests.
    pub digest: String,
    /// Indices into [`CheckpointRecord::workers`].
    pub holders: Vec<u32>,
}

/// The digest of one process's blocks: SHA-256 (hex) over its arrays'
/// file digests (hex), in the record's array order.
pub fn blocks_digest(digests: &[String]) -> String {
    tessel_topology::sha256_hex(digests.concat().as_bytes())
}

/// A complete checkpoint (`jobs/{job}/checkpoints/{step}`, JSON).
///
/// Version 2 lists each process as [`ProcessBlocks`] beside one table of
/// holders: about 100 bytes a process whatever the arrays, so a record of
/// 16,384 processes stays under the KV's value limit. A record written
/// before lists each process's digest of every array and its holders'
/// names in `blocks` (about 200 bytes a process plus 67 an array): it
/// passed the limit from about 10,000 processes with 4 arrays, 3,500
/// with 16. Both decode; [`CheckpointRecord::new`] writes version 2.
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
    /// By process index, in records before version 2 (empty from it on).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<Blocks>,
    /// Version 2: every worker holding blocks, once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<Holder>,
    /// Version 2: by process index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessBlocks>,
}

impl CheckpointRecord {
    /// A record (version 2) of `processes`: each one's [`blocks_digest`]
    /// and the workers holding its blocks.
    pub fn new(
        step: u64,
        spec_sha256: String,
        attempt: String,
        shared: bool,
        arrays: Vec<(String, ShardingSpec)>,
        processes: Vec<(String, Vec<Holder>)>,
    ) -> CheckpointRecord {
        let mut workers: Vec<Holder> = Vec::new();
        let mut index: std::collections::HashMap<Holder, u32> = Default::default();
        let processes = processes
            .into_iter()
            .map(|(digest, holders)| ProcessBlocks {
                digest,
                holders: holders
                    .into_iter()
                    .map(|h| {
                        *index.entry(h.clone()).or_insert_with(|| {
                            workers.push(h);
                            workers.len() as u32 - 1
                        })
                    })
                    .collect(),
            })
            .collect();
        CheckpointRecord {
            step,
            spec_sha256,
            attempt,
            shared,
            arrays,
            blocks: Vec::new(),
            workers,
            processes,
        }
    }

    /// JSON, like the other records people read with `tessel kv get`
    /// (reports, results).
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a record always encodes")
    }

    /// Decodes a record read from the KV, checking its shape: every
    /// process with a digest per array (before version 2) or one digest
    /// and holders in the table (version 2), in one form only; names that
    /// follow [`crate::names`].
    pub fn decode(bytes: &[u8]) -> Result<CheckpointRecord, String> {
        if bytes.len() > MAX_RECORD {
            return Err(format!("a record of {} bytes", bytes.len()));
        }
        let r: CheckpointRecord =
            serde_json::from_slice(bytes).map_err(|e| format!("undecodable record: {e}"))?;
        for (name, _) in &r.arrays {
            crate::names::check("array name", name)?;
        }
        if !r.blocks.is_empty() && (!r.processes.is_empty() || !r.workers.is_empty()) {
            return Err("a record with blocks in both forms".into());
        }
        let hex = |d: &String| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit());
        for (p, b) in r.blocks.iter().enumerate() {
            if b.digests.len() != r.arrays.len()
                || !b.digests.iter().all(hex)
                || b.holders.is_empty()
            {
                return Err(format!("the blocks of process {p} are malformed"));
            }
        }
        for (p, b) in r.processes.iter().enumerate() {
            if !hex(&b.digest)
                || b.holders.is_empty()
                || b.holders.iter().any(|&h| h as usize >= r.workers.len())
            {
                return Err(format!("the blocks of process {p} are malformed"));
            }
        }
        Ok(r)
    }

    /// How many processes the checkpoint holds blocks of.
    pub fn num_processes(&self) -> usize {
        self.blocks.len().max(self.processes.len())
    }

    /// Whether `digests` (process `p`'s arrays' file digests, in the
    /// record's array order) are the ones recorded.
    pub fn matches(&self, p: usize, digests: &[String]) -> bool {
        match (self.blocks.get(p), self.processes.get(p)) {
            (Some(b), _) => b.digests == digests,
            (None, Some(b)) => b.digest == blocks_digest(digests),
            (None, None) => false,
        }
    }

    /// The workers holding process `p`'s blocks.
    pub fn holders(&self, p: usize) -> Vec<&Holder> {
        match (self.blocks.get(p), self.processes.get(p)) {
            (Some(b), _) => b.holders.iter().collect(),
            (None, Some(b)) => b
                .holders
                .iter()
                .filter_map(|&h| self.workers.get(h as usize))
                .collect(),
            (None, None) => Vec::new(),
        }
    }

    /// The workers holding process `p`'s blocks, for messages.
    pub fn holders_of(&self, p: usize) -> String {
        self.holders(p)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
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
            workers: vec![],
            processes: vec![],
        }
    }

    fn holder(i: u32) -> Holder {
        Holder {
            worker: format!("h{i}"),
            hostname: format!("host-{i}"),
        }
    }

    fn digests(p: usize, arrays: usize) -> Vec<String> {
        (0..arrays)
            .map(|a| tessel_topology::sha256_hex(format!("{p}/{a}").as_bytes()))
            .collect()
    }

    /// `n` processes on per-host disks: each held by its worker and its
    /// successor's.
    fn record_v2(n: usize, arrays: usize) -> CheckpointRecord {
        CheckpointRecord::new(
            7,
            "s".repeat(64),
            "job@1".into(),
            false,
            (0..arrays)
                .map(|a| (format!("a{a}"), ShardingSpec::Replicated))
                .collect(),
            (0..n)
                .map(|p| {
                    let holders = vec![holder(p as u32), holder(((p + 1) % n) as u32)];
                    (blocks_digest(&digests(p, arrays)), holders)
                })
                .collect(),
        )
    }

    #[test]
    fn a_record_lists_each_holder_once_and_matches_only_its_digests() {
        let r = record_v2(3, 2);
        assert_eq!(CheckpointRecord::decode(&r.encode()).unwrap(), r);
        assert_eq!(r.workers.len(), 3, "each worker once");
        assert_eq!(r.num_processes(), 3);
        assert_eq!(
            r.holders_of(2),
            "worker `h2` on host host-2, worker `h0` on host host-0"
        );
        assert!(r.matches(1, &digests(1, 2)));
        assert!(!r.matches(1, &digests(2, 2)), "another process's");
        let mut swapped = digests(1, 2);
        swapped.reverse();
        assert!(!r.matches(1, &swapped), "the arrays' order counts");
        assert!(!r.matches(1, &digests(1, 1)), "one array short");
        assert!(!r.matches(3, &digests(3, 2)), "no such process");
        let mut bad = r.clone();
        bad.processes[1].holders = vec![3];
        assert!(
            CheckpointRecord::decode(&bad.encode()).is_err(),
            "no such holder"
        );
        let mut bad = r.clone();
        bad.processes[0].digest = "z".repeat(64);
        assert!(CheckpointRecord::decode(&bad.encode()).is_err(), "not hex");
        let mut bad = r.clone();
        bad.blocks = record().blocks;
        assert!(
            CheckpointRecord::decode(&bad.encode()).is_err(),
            "both forms"
        );
    }

    /// What the new form is for: a pod-scale job's record stays one KV
    /// value where the form before passed the limit.
    #[test]
    fn a_record_of_16384_processes_and_16_arrays_fits_in_one_value() {
        let (n, arrays) = (16_384, 16);
        let r = record_v2(n, arrays);
        let bytes = r.encode();
        assert!(bytes.len() < MAX_RECORD, "{} bytes", bytes.len());
        assert_eq!(CheckpointRecord::decode(&bytes).unwrap().num_processes(), n);
        let before = CheckpointRecord {
            blocks: (0..n)
                .map(|p| Blocks {
                    digests: digests(p, arrays),
                    holders: r.holders(p).into_iter().cloned().collect(),
                })
                .collect(),
            workers: vec![],
            processes: vec![],
            ..r
        };
        assert!(before.encode().len() > MAX_RECORD);
    }

    /// A record written before version 2 still decodes and is read the
    /// same way: a job restarted across an upgrade restores it.
    #[test]
    fn records_round_trip_and_malformed_ones_are_refused() {
        let r = record();
        assert_eq!(CheckpointRecord::decode(&r.encode()).unwrap(), r);
        assert_eq!(
            r.holders_of(1),
            "worker `h4` on host host-4, worker `h5` on host host-5"
        );
        assert_eq!(r.num_processes(), 2);
        assert!(r.matches(1, &["0".repeat(64)]));
        assert!(!r.matches(1, &["1".repeat(64)]));
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
