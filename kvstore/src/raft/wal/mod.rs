//! The Raft log as a write-ahead log of its own: segment files in `log/`
//! under the data directory, appended to and `fdatasync`ed, as etcd's WAL
//! does. A log append is one `write` and one `fdatasync` of the new bytes
//! (0.15–0.2 ms on this machine's disk), where a redb commit rewrote the
//! B-tree path, the allocator state and the header (0.4–0.55 ms).
//!
//! Invariants:
//! 1. A record is `[length: u32 LE][crc32 of the payload: u32 LE][payload]`,
//!    the payload a postcard [`Record`] of at most [`MAX_RECORD`] bytes. A
//!    segment is [`MAGIC`], then a [`Record::State`] (the vote, committed
//!    index and purge point when it was created), then records. Replaying
//!    the segments in order rebuilds the log, the vote, the committed index
//!    and the purge point.
//! 2. Nothing is acknowledged before it is on disk: a write's records are
//!    written and `sync_data`ed before its callback runs or its caller hears
//!    back; a new segment's file and directory entry are synced before
//!    anything is written to it.
//! 3. Only the last segment may end in an invalid record (a write that
//!    never completed, hence never acknowledged): opening cuts the last
//!    segment at its first invalid record. An invalid record in an earlier
//!    segment is corruption, and opening refuses.
//! 4. Segments are deleted oldest first, and only when every entry in them
//!    is purged and a newer segment exists (it starts with the state they
//!    held).
//! 5. One writer thread owns every write, in the order they were issued.
//!    An entry is readable from the moment [`Wal::append`] queues it: it
//!    stays in memory until its record is on disk, after which recent
//!    entries stay cached up to [`CACHE_BYTES`] and older ones are read
//!    back from their segment. The cached entries are always the log's
//!    newest (appends add at the end, eviction takes the oldest), so an
//!    entry at or above the first cached index is in memory. Appends that
//!    queue up behind a sync are written and synced together.
//! 6. After a failed write or sync the log takes no more writes: part of
//!    the failed bytes may be on disk, and a shorter write over them could
//!    leave a whole, never acknowledged record behind it. Reopening cuts
//!    them (invariant 3).
//! 7. With direct I/O ([`LogIo::Direct`], the default where the file
//!    system takes `O_DIRECT`), a write goes to disk as whole
//!    [`BLOCK`]-byte blocks through a descriptor opened with `O_DIRECT |
//!    O_DSYNC`: the segment's last partial block is written again, the new
//!    records after it and zeros up to the block's end, so one `pwrite`
//!    both writes and syncs, past the page cache. A record header that is
//!    all zeros, with only zeros after it to the end of the file, is that
//!    padding and ends the segment's records; zeros with anything else
//!    after them are an invalid record (invariant 3). Where `O_DIRECT` is
//!    refused (tmpfs), writes are buffered and `sync_data`ed.
//! 8. With direct I/O the last segment is zero-filled ahead of its records
//!    (up to [`ZERO_AHEAD`] bytes past them, at most to the segment's
//!    size), after a write's callbacks have run, so that a write lands on
//!    blocks the file already has: `O_DSYNC` then syncs the data alone,
//!    with no journal commit for a new size or new blocks. The zeros read
//!    as the padding of invariant 7; a segment is cut on opening only when
//!    it ends in an invalid record, so reopening keeps them.

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
