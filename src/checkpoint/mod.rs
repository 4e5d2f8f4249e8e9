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
//! 1. A checkpoint is complete only when its record is in the KV
//!    (`jobs/{job}/checkpoints/{step}`). Process 0 writes it after every
//!    process's blocks (and copies) are fsynced: the all-gather of their
//!    digests is that barrier. Blocks without a record are never loaded.
//! 2. A record names the spec (SHA-256), each array's sharding, every
//!    block file's digest and the workers holding each process's blocks;
//!    a restore checks every file against its digest.
//! 3. A new attempt restores exactly one step everywhere: process 0 picks
//!    the newest record of the spec and broadcasts it. If some process's
//!    blocks are on no worker of the attempt, every process fails with
//!    the same error naming them and their hosts.
//! 4. Shared or not is decided at each attempt's start: every process
//!    writes a probe file and reports whether it sees all of them.
//! 5. Retention: the newest [`KEEP`] records stay; after each checkpoint
//!    process 0 broadcasts them and every process prunes its folder.

mod disk;
mod protocol;
mod record;

pub use disk::{digest, CheckpointDir};
pub use protocol::{decode_blocks, encode_blocks, Checkpoints};
pub use record::{retained, sources, Blocks, CheckpointRecord, Holder, KEEP, MAX_RECORD};
