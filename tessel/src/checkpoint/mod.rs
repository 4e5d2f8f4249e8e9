//! Checkpoints of a job's arrays: blocks on each host's disk, and one
//! record in the replicated KV that makes a checkpoint complete.
//!
//! How disks are used: `checkpoint.dir` (absolute) must lie under a
//! `--checkpoint-root` of every worker. If every process of an attempt
//! sees the others' files there (a shared folder: NFS, a cluster file
//! system), each block is written once. Otherwise (each host its own
//! disk) each process also keeps a copy of its predecessor's blocks, so
//! the loss of any one host leaves every block on another; a restarted
//! process that lacks its blocks gets them from a process of the new
//! attempt that holds them, over the transfer layer. The scheduler keeps
//! each process on the worker that ran it where it can.
//!
//! Invariants:
//! 1. A checkpoint counts only once its record is in the KV; process 0
//!    writes it after the all-gather of every process's block digests, which
//!    follows their fsync. Blocks without a record are never loaded.
//! 2. A record names the spec's SHA-256, each array's sharding, every block's
//!    digest and the workers holding copies; a restore checks every digest.
//! 3. An attempt restores the one step process 0 broadcasts, or every process
//!    fails with the same error naming the blocks no worker of it holds.
//! 4. Shared or not is decided at each attempt's start: every process writes
//!    a probe file and reports whether it sees all of them.
//! 5. The newest [`KEEP`] records stay; after each checkpoint process 0
//!    broadcasts them and every process prunes its folder.
//!
//! # Checkpoints
//!
//! 1. Open (each attempt, every process): `checkpoint.dir` must be absolute
//!    and under one of the worker's `--checkpoint-root`s (symbolic links
//!    resolved); the job's folder is `{dir}/{job id}`. Each process writes a
//!    probe file `probes/{attempt}-{p}`, a barrier, then an all-gather of
//!    "I see every probe": all yes = one shared folder.
//! 2. Save (every `every` steps, every process): write and fsync its blocks
//!    (`step-{s}/process-{p}/{array}.npy`); on per-host disks also send them
//!    to process p+1 (`Communicator::exchange`) and write and fsync the
//!    copy of p−1's; all-gather of the blocks' SHA-256 digests (the barrier:
//!    every block is durable); process 0 puts the `CheckpointRecord`
//!    (digests, holders: the workers of p and, per-host, of p+1), deletes
//!    records beyond the newest 2, and broadcasts the kept steps; every
//!    process prunes its folder to them.
//! 3. Restore (each attempt's start): process 0 picks the newest record of
//!    the spec with the job's process count and broadcasts it; each process
//!    reads its own blocks if its disk holds them with the recorded digests;
//!    an all-gather says who lacks theirs, a second which processes hold the
//!    missing ones (`record::sources`: the lowest holder), and
//!    `Communicator::exchange` carries them, checked against the digests.
//!    A block no process holds fails every process with the same message,
//!    naming the holders.

mod disk;
mod protocol;
mod record;

pub use disk::{digest, CheckpointDir};
pub use protocol::{decode_blocks, encode_blocks, Checkpoints};
pub use record::{
    blocks_digest, retained, sources, Blocks, CheckpointRecord, Holder, ProcessBlocks, KEEP,
    MAX_RECORD,
};
