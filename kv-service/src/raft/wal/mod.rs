//! The Raft log as a write-ahead log of its own: segment files in `log/`
//! under the data directory, appended to and synced, as etcd's WAL does: one
//! write and one sync per append, where a B-tree commit rewrites more
//! (docs/performance.md). The format is at the end of these docs; the `raft`
//! module docs tell the story ("The Raft log").
//!
//! Invariants:
//! 1. A record is `[len: u32 LE][crc32: u32 LE][postcard Record]`; a segment is
//!    [`MAGIC`], a [`Record::State`], then records. Replaying the segments in
//!    order rebuilds the log, vote, committed index and purge point.
//! 2. Nothing is acknowledged before it is on disk: records are synced before
//!    a write's callback runs; a new segment and its directory entry first.
//! 3. Only the last segment may end in an invalid record (a write never
//!    acknowledged): opening cuts it there; anywhere else, opening refuses.
//! 4. Segments are deleted oldest first, only when every entry in them is
//!    purged and a newer segment (starting with their state) exists.
//! 5. One writer thread owns every write, in issue order. An entry is readable
//!    once queued; the cache always holds the newest entries (up to
//!    [`CACHE_BYTES`]), older ones are read back from their segment.
//! 6. After a failed write or sync the log takes no more writes (a shorter
//!    write over partial bytes could leave a whole unacknowledged record).
//! 7. With [`LogIo::Direct`] a write is whole [`BLOCK`]s through `O_DIRECT |
//!    O_DSYNC`, zero-padded; a zero header followed only by zeros ends the
//!    records, zeros followed by anything else are invalid (3).
//! 8. With direct I/O the last segment is zero-filled up to [`ZERO_AHEAD`]
//!    past its records after a write's callbacks, so a write needs no journal
//!    commit for a new size; the zeros read as 7's padding.
//!
//! # The segment file format
//!
//! A segment is `log/{seq:020}.wal` in a replica's data dir: the 8 bytes `TSLWAL\0\x01`, then records of
//! `u32` little-endian payload length, `u32` crc32 of the payload, and the
//! postcard `Record`: first a `State {vote, committed, last_purged}` as of
//! the segment's creation, then `Entry`, `Committed`, `Vote`, `Truncate
//! (index)` and `Purge(log id)` in the order written. Payloads ≤ 256 MiB; a
//! segment takes no more records past 64 MiB. Reading stops at the first
//! record that is short, over the limit, fails its checksum or does not
//! decode; that is a torn write only in the last segment.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::ops::RangeBounds;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

use openraft::{Entry, LogId, Vote};
use serde::{Deserialize, Serialize};

use crate::raft::TypeConfig;

type NodeId = u64;

/// The first bytes of every segment file (format version 1).
pub const MAGIC: &[u8; 8] = b"TSLWAL\x00\x01";
/// A segment takes no more records once it is this long (a write that
/// would cross it goes to a new segment whole).
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// The largest record payload written or read back.
pub const MAX_RECORD: u32 = 256 << 20;
/// Encoded bytes of durable entries kept in memory for readers.
pub const CACHE_BYTES: usize = 8 << 20;
const RECORD_HEADER: usize = 8;
/// How far ahead of its records the last segment is zero-filled
/// (invariant 8): one such write (~0.6 ms here) every megabyte of log.
pub const ZERO_AHEAD: u64 = 1 << 20;
/// The unit of a direct write (invariant 7): a multiple of every logical
/// block size Linux allows for `O_DIRECT` (512 to 4096).
pub const BLOCK: usize = 4096;

/// How the log's writes reach the disk (invariant 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogIo {
    /// Whole blocks with `O_DIRECT | O_DSYNC`, one `pwrite` per write;
    /// buffered where the file system refuses `O_DIRECT`.
    Direct,
    /// `pwrite` of the new bytes, then `fdatasync`.
    Buffered,
}

/// The vote, committed index and purge point.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogMeta {
    /// The last vote.
    pub vote: Option<Vote<NodeId>>,
    /// The last committed log id known.
    pub committed: Option<LogId<NodeId>>,
    /// The last purged log id.
    pub last_purged: Option<LogId<NodeId>>,
}

mod index;
mod log;
mod record;
mod writer;

use index::*;
pub use log::Wal;
use log::*;
use record::*;
pub use record::{read_segment, ReadRecord, Record, SegmentEnd};
use writer::*;

#[cfg(test)]
mod tests;
