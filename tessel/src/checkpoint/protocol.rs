//! Saving and restoring a checkpoint across a job's processes: blocks on
//! each host's disk, their digests gathered, one record in the KV
//! (invariants 1, 3-5 of [`crate::checkpoint`]).

use std::path::PathBuf;

use tessel_coordinator::{Item, Records};
use tessel_kv::KvStore;
use tessel_pjrt::ElementType;
use tessel_transfer::Communicator;

use super::disk::CheckpointDir;
use super::record::{blocks_digest, retained, sources, CheckpointRecord, Holder, KEEP};
use crate::job::CheckpointSpec;
use crate::plan::{PlanError, ProcessBlock};

/// Bytes of a process's blocks digest as it travels in the all-gather
/// (hex text).
const DIGEST_LEN: usize = 64;

/// One process's view of its job's checkpoints.
pub struct Checkpoints {
    dir: CheckpointDir,
    /// Checkpoint every this many steps.
    pub every: u64,
    job: String,
    attempt: String,
    spec_sha256: String,
    process: usize,
    n: usize,
    shared: bool,
    /// Each process's worker and host, by index: the job's directory,
    /// read by process 0 when it first commits (topology `exchange`
    /// invariant 6).
    holders: tokio::sync::OnceCell<Vec<Holder>>,
}

/// A process's blocks as they travel between processes (postcard).
pub fn encode_blocks(blocks: &[(String, Vec<u8>)]) -> Vec<u8> {
    postcard::to_allocvec(blocks).expect("blocks always encode")
}

/// Decodes blocks a peer sent, refusing names that break the rule.
pub fn decode_blocks(bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    let blocks: Vec<(String, Vec<u8>)> =
        postcard::from_bytes(bytes).map_err(|e| format!("undecodable blocks: {e}"))?;
    for (name, _) in &blocks {
        crate::names::check("array name", name)?;
    }
    Ok(blocks)
}

fn collective(what: &str) -> impl FnOnce(tessel_transfer::TransferError) -> PlanError + '_ {
    move |source| PlanError::Collective {
        what: what.to_owned(),
        source,
    }
}

fn kv_err(what: &str) -> impl FnOnce(tessel_kv::KvError) -> PlanError + '_ {
    move |source| PlanError::Kv {
        what: what.to_owned(),
        source,
    }
}

fn blocking<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, PlanError> {
    tokio::task::block_in_place(f).map_err(PlanError::Checkpoint)
}

impl Checkpoints {
    /// The job's folder on this host, confined to `roots`; then whether
    /// every process sees one folder (probe files, invariant 4).
    pub async fn open(
        spec: &CheckpointSpec,
        spec_text: &str,
        roots: &[PathBuf],
        instance: &str,
        process: usize,
        comm: &mut Communicator,
    ) -> Result<Checkpoints, PlanError> {
        let job = tessel_coordinator::scheduler::job_of_instance(instance).to_owned();
        let attempt_no: u32 = instance
            .split_once('@')
            .and_then(|(_, a)| a.parse().ok())
            .unwrap_or(0);
        let root = blocking(|| crate::names::under_root(&spec.dir, roots))?;
        let dir = CheckpointDir::new(&root, &job).map_err(PlanError::Checkpoint)?;
        let n = comm.size();
        let shared = if n == 1 {
            true
        } else {
            blocking(|| dir.write_probe(attempt_no, process))?;
            comm.barrier()
                .await
                .map_err(collective("checkpoint folder probe"))?;
            let sees = dir.sees_probes(attempt_no, n);
            let all = comm
                .all_gather(ElementType::U8, &[u8::from(sees)])
                .await
                .map_err(collective("checkpoint folder probe"))?;
            dir.remove_probe(attempt_no, process);
            all.iter().all(|&s| s == 1)
        };
        tracing::info!(job = %job, process, shared, dir = %dir.path().display(), "checkpoints");
        Ok(Checkpoints {
            dir,
            every: spec.every,
            job,
            attempt: instance.to_owned(),
            spec_sha256: tessel_topology::sha256_hex(spec_text.as_bytes()),
            process,
            n,
            shared,
            holders: tokio::sync::OnceCell::new(),
        })
    }

    /// Whether every process keeps its checkpoints in one shared folder.
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// Invariant 3: the newest complete checkpoint of this spec, as process
    /// 0 chose it, restored into `written`'s blocks of this process; `None`
    /// when there is none.
    pub async fn restore(
        &self,
        kv: &dyn KvStore,
        comm: &mut Communicator,
        written: &[String],
    ) -> Result<Option<(u64, Vec<(String, ProcessBlock)>)>, PlanError> {
        let chosen = if self.process == 0 {
            self.newest(kv)
                .await?
                .map(|r| r.encode())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let chosen = self
            .broadcast(comm, chosen, "choosing the checkpoint")
            .await?;
        if chosen.is_empty() {
            return Ok(None);
        }
        let record = CheckpointRecord::decode(&chosen).map_err(PlanError::Checkpoint)?;
        let names: Vec<&String> = record.arrays.iter().map(|(n, _)| n).collect();
        if names != written.iter().collect::<Vec<_>>() {
            return Err(PlanError::Checkpoint(format!(
                "step {} holds arrays {names:?}, the plan writes {written:?}",
                record.step
            )));
        }
        let step = record.step;
        let mine = self.dir.read_blocks(step, self.process, written, |d| {
            record.matches(self.process, d)
        });
        let blocks = match (mine, self.n) {
            (Some(b), 1) => b,
            (None, 1) => return Err(self.missing(&record, &[0])),
            (mine, n) => {
                // Who lacks their own, then who holds what they lack.
                let own = comm
                    .all_gather(ElementType::U8, &[u8::from(mine.is_some())])
                    .await
                    .map_err(collective("restoring a checkpoint"))?;
                if own.iter().all(|&o| o == 1) {
                    mine.expect("held")
                } else {
                    let mut holds = vec![0u8; n];
                    for p in (0..n).filter(|&p| own[p] == 0) {
                        let have = blocking(|| {
                            Ok(self
                                .dir
                                .read_blocks(step, p, written, |d| record.matches(p, d)))
                        })?;
                        holds[p] = u8::from(have.is_some());
                    }
                    holds[self.process] = u8::from(mine.is_some());
                    let all = comm
                        .all_gather(ElementType::U8, &holds)
                        .await
                        .map_err(collective("restoring a checkpoint"))?;
                    let matrix: Vec<Vec<bool>> = all
                        .chunks(n)
                        .map(|c| c.iter().map(|&b| b == 1).collect())
                        .collect();
                    let from =
                        sources(&matrix).map_err(|missing| self.missing(&record, &missing))?;
                    self.fetch(comm, &record, &from, mine, written).await?
                }
            }
        };
        let arrays = blocks
            .into_iter()
            .zip(&record.arrays)
            .map(|((name, bytes), (_, sharding))| {
                let value = crate::array::read_npy(&bytes)
                    .map_err(|e| PlanError::Checkpoint(format!("step {step}, `{name}`: {e}")))?;
                Ok((
                    name,
                    ProcessBlock {
                        value,
                        sharding: sharding.clone(),
                    },
                ))
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        tracing::info!(job = %self.job, process = self.process, step, attempt = %record.attempt, "restored from checkpoint");
        Ok(Some((step, arrays)))
    }

    /// Sends the blocks this process is the source of, and receives its own
    /// when another process is theirs; checks what arrives.
    async fn fetch(
        &self,
        comm: &mut Communicator,
        record: &CheckpointRecord,
        from: &[usize],
        mine: Option<Vec<(String, Vec<u8>)>>,
        names: &[String],
    ) -> Result<Vec<(String, Vec<u8>)>, PlanError> {
        let step = record.step;
        let mut sends = Vec::new();
        for (p, &q) in from.iter().enumerate() {
            if q == self.process && p != self.process {
                let blocks = blocking(|| {
                    self.dir
                        .read_blocks(step, p, names, |d| record.matches(p, d))
                        .ok_or_else(|| format!("the blocks of process {p} vanished"))
                })?;
                sends.push((p, encode_blocks(&blocks)));
            }
        }
        let source = from[self.process];
        let recv: Vec<usize> = if source == self.process {
            vec![]
        } else {
            vec![source]
        };
        let got = comm
            .exchange(sends, &recv)
            .await
            .map_err(collective("sending checkpoint blocks"))?;
        match (mine, got.into_iter().next()) {
            (Some(b), _) => Ok(b),
            (None, Some(bytes)) => {
                let blocks = decode_blocks(&bytes).map_err(PlanError::Checkpoint)?;
                let digests: Vec<String> =
                    blocks.iter().map(|(_, b)| super::disk::digest(b)).collect();
                let same_names = blocks.iter().map(|(n, _)| n).eq(names.iter());
                if !same_names || !record.matches(self.process, &digests) {
                    return Err(PlanError::Checkpoint(format!(
                        "the copy of process {}'s blocks of step {step} that process {source} sent differs from the record",
                        self.process
                    )));
                }
                tracing::info!(
                    process = self.process,
                    source,
                    step,
                    "checkpoint blocks fetched from a peer"
                );
                Ok(blocks)
            }
            (None, None) => Err(self.missing(record, &[self.process])),
        }
    }

    fn missing(&self, r: &CheckpointRecord, missing: &[usize]) -> PlanError {
        let each: Vec<String> = missing
            .iter()
            .map(|&p| format!("process {p} (written to {})", r.holders_of(p)))
            .collect();
        PlanError::Checkpoint(format!(
            "the newest complete checkpoint (step {}) cannot be restored: no worker of this attempt holds the blocks of {}; bring one of those workers back, or give the job a folder every worker sees",
            r.step,
            each.join("; ")
        ))
    }

    /// The newest record of this spec and process count (process 0).
    async fn newest(&self, kv: &dyn KvStore) -> Result<Option<CheckpointRecord>, PlanError> {
        let pairs = Records::new(kv, &self.job)
            .checkpoints()
            .await
            .map_err(kv_err("reading the checkpoint records"))?;
        Ok(pairs
            .iter()
            .filter_map(|(_, value)| match CheckpointRecord::decode(value) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring a checkpoint record");
                    None
                }
            })
            .filter(|r| r.spec_sha256 == self.spec_sha256 && r.num_processes() == self.n)
            .max_by_key(|r| r.step))
    }

    /// Process 0's `data` on every process (any length).
    async fn broadcast(
        &self,
        comm: &mut Communicator,
        data: Vec<u8>,
        what: &str,
    ) -> Result<Vec<u8>, PlanError> {
        if self.n == 1 {
            return Ok(data);
        }
        let len = (data.len() as u64).to_le_bytes().to_vec();
        let len = comm
            .broadcast(0, ElementType::U64, len)
            .await
            .map_err(collective(what))?;
        let len = u64::from_le_bytes(len.try_into().expect("8 bytes")) as usize;
        if len == 0 {
            return Ok(Vec::new());
        }
        if len > super::record::MAX_RECORD {
            return Err(PlanError::Checkpoint(format!("a {len}-byte record")));
        }
        let data = if self.process == 0 {
            data
        } else {
            vec![0; len]
        };
        comm.broadcast(0, ElementType::U8, data)
            .await
            .map_err(collective(what))
    }

    /// Invariants 1, 4 and 5: this process's blocks of `step` (and its copy
    /// of its predecessor's on per-host disks), the digests gathered,
    /// process 0's record, then every folder pruned to the kept steps.
    pub async fn save(
        &self,
        kv: &dyn KvStore,
        comm: &mut Communicator,
        step: u64,
        arrays: &[(&str, &tessel_pjrt::HostBuffer, &crate::job::ShardingSpec)],
    ) -> Result<(), PlanError> {
        let blocks: Vec<(String, Vec<u8>)> = arrays
            .iter()
            .map(|(n, a, _)| (n.to_string(), crate::array::write_npy(a)))
            .collect();
        let digests = blocking(|| self.dir.write_blocks(step, self.process, &blocks))?;
        let n = self.n;
        let replicate = !self.shared && n > 1;
        let prev = (self.process + n - 1) % n;
        let copy = if replicate {
            let next = (self.process + 1) % n;
            let got = comm
                .exchange(vec![(next, encode_blocks(&blocks))], &[prev])
                .await
                .map_err(collective("copying checkpoint blocks to the next process"))?;
            let theirs = decode_blocks(&got[0]).map_err(PlanError::Checkpoint)?;
            Some(blocking(|| self.dir.write_blocks(step, prev, &theirs))?)
        } else {
            None
        };
        drop(blocks);
        // Every process's blocks are durable once this returns. One digest
        // a process travels ([`blocks_digest`]), whatever its arrays.
        let mine = blocks_digest(&digests).into_bytes();
        let all = if n == 1 {
            mine
        } else {
            comm.all_gather(ElementType::U8, &mine)
                .await
                .map_err(collective("checkpoint digests"))?
        };
        let digest_of = |p: usize| {
            String::from_utf8_lossy(&all[p * DIGEST_LEN..(p + 1) * DIGEST_LEN]).into_owned()
        };
        if let Some(copy) = copy {
            if blocks_digest(&copy) != digest_of(prev) {
                return Err(PlanError::Checkpoint(format!(
                    "the copy of process {prev}'s blocks of step {step} differs from what it wrote"
                )));
            }
        }
        let mut keep = [u64::MAX; KEEP];
        if self.process == 0 {
            let holders = self
                .holders
                .get_or_try_init(|| async {
                    let directory =
                        tessel_topology::exchange::directory(kv, &self.attempt, n as u32)
                            .await
                            .map_err(|e| {
                                PlanError::Checkpoint(format!("the job's directory: {e}"))
                            })?;
                    Ok::<_, PlanError>(
                        directory
                            .into_iter()
                            .map(|l| Holder {
                                worker: l.worker,
                                hostname: l.hostname,
                            })
                            .collect(),
                    )
                })
                .await?;
            let record = CheckpointRecord::new(
                step,
                self.spec_sha256.clone(),
                self.attempt.clone(),
                self.shared,
                arrays
                    .iter()
                    .map(|(name, _, sharding)| (name.to_string(), (*sharding).clone()))
                    .collect(),
                (0..n)
                    .map(|p| {
                        let holders = if replicate {
                            vec![holders[p].clone(), holders[(p + 1) % n].clone()]
                        } else {
                            vec![holders[p].clone()]
                        };
                        (digest_of(p), holders)
                    })
                    .collect(),
            );
            // A put, not an insert: these blocks are the ones on disk now,
            // whatever an earlier attempt recorded for this step.
            let records = Records::new(kv, &self.job);
            records
                .put(Item::Checkpoint(step), &record.encode())
                .await
                .map_err(kv_err("committing the checkpoint"))?;
            let committed: Vec<u64> = records
                .checkpoints()
                .await
                .map_err(kv_err("listing the checkpoint records"))?
                .into_iter()
                .map(|(step, _)| step)
                .collect();
            let kept = retained(&committed);
            for old in committed.iter().filter(|s| !kept.contains(s)) {
                records
                    .delete(Item::Checkpoint(*old))
                    .await
                    .map_err(kv_err("removing an old checkpoint record"))?;
            }
            for (slot, s) in keep.iter_mut().zip(&kept) {
                *slot = *s;
            }
        }
        // Process 0's kept steps reach everyone once its record is in.
        let keep: Vec<u8> = keep.iter().flat_map(|s| s.to_le_bytes()).collect();
        let keep = if n == 1 {
            keep
        } else {
            comm.broadcast(0, ElementType::U64, keep)
                .await
                .map_err(collective("checkpoint retention"))?
        };
        let keep: Vec<u64> = keep
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .filter(|&s| s != u64::MAX)
            .collect();
        blocking(|| self.dir.prune(&keep))
    }
}
