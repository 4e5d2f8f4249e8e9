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
    pub vote: Option<Vote<NodeId>>,
    pub committed: Option<LogId<NodeId>>,
    pub last_purged: Option<LogId<NodeId>>,
}

/// One record of a segment; `E` is an entry when read, a reference to one
/// when written (serde encodes both the same).
#[derive(Debug, Serialize, Deserialize)]
pub enum Record<E> {
    State(LogMeta),
    Entry(E),
    Committed(Option<LogId<NodeId>>),
    Vote(Vote<NodeId>),
    /// Entries at and above this index are gone.
    Truncate(u64),
    /// Entries at and below this id are gone.
    Purge(LogId<NodeId>),
}

pub type ReadRecord = Record<Entry<TypeConfig>>;

fn encode(buf: &mut Vec<u8>, record: &Record<&Entry<TypeConfig>>) -> io::Result<u32> {
    let start = buf.len();
    buf.extend_from_slice(&[0; RECORD_HEADER]);
    let mut out = postcard::to_extend(record, std::mem::take(buf)).map_err(io::Error::other)?;
    let len = out.len() - start - RECORD_HEADER;
    if len > MAX_RECORD as usize {
        out.truncate(start);
        *buf = out;
        return Err(io::Error::other(format!(
            "a log record of {len} bytes is over the limit of {MAX_RECORD}"
        )));
    }
    let crc = crc32fast::hash(&out[start + RECORD_HEADER..]);
    out[start..start + 4].copy_from_slice(&(len as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    *buf = out;
    Ok((len + RECORD_HEADER) as u32)
}

fn decode(payload: &[u8], crc: u32) -> Result<ReadRecord, String> {
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    postcard::from_bytes(payload).map_err(|e| format!("undecodable record: {e}"))
}

/// How a segment read by [`read_segment`] ended.
#[derive(Debug, PartialEq, Eq)]
pub struct SegmentEnd {
    /// Bytes up to the end of the last valid record.
    pub valid_len: u64,
    /// Why reading stopped before the end of the input, if it did.
    pub invalid: Option<String>,
}

/// Reads a segment (invariant 1), handing each valid record and its offset
/// and length to `each`; stops at the end or at the first invalid record.
/// Never allocates more than the bytes actually present.
pub fn read_segment(input: impl Read, mut each: impl FnMut(u64, u32, ReadRecord)) -> SegmentEnd {
    let mut input = BufReader::with_capacity(1 << 20, input);
    let mut magic = [0u8; 8];
    let stop = |offset, why: String| SegmentEnd {
        valid_len: offset,
        invalid: Some(why),
    };
    let mut offset = match read_full(&mut input, &mut magic) {
        Ok(8) if &magic == MAGIC => 8u64,
        Ok(0) => {
            return SegmentEnd {
                valid_len: 0,
                invalid: None,
            }
        }
        Ok(_) => return stop(0, "no segment header".into()),
        Err(e) => return stop(0, e.to_string()),
    };
    let mut payload = Vec::new();
    loop {
        let mut header = [0u8; RECORD_HEADER];
        match read_full(&mut input, &mut header) {
            Ok(0) => {
                return SegmentEnd {
                    valid_len: offset,
                    invalid: None,
                }
            }
            Ok(n) if header[..n].iter().all(|&b| b == 0) => {
                // Invariant 7: a direct write's padding, if only zeros
                // follow.
                return match zeros_to_end(&mut input) {
                    Ok(true) => SegmentEnd {
                        valid_len: offset,
                        invalid: None,
                    },
                    Ok(false) => stop(offset, "data after zero padding".into()),
                    Err(e) => stop(offset, e.to_string()),
                };
            }
            Ok(RECORD_HEADER) => {}
            Ok(n) => return stop(offset, format!("a record header cut short after {n} bytes")),
            Err(e) => return stop(offset, e.to_string()),
        }
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        if len > MAX_RECORD {
            return stop(offset, format!("a record of {len} bytes is over the limit"));
        }
        payload.clear();
        match (&mut input).take(len as u64).read_to_end(&mut payload) {
            Ok(n) if n == len as usize => {}
            Ok(n) => return stop(offset, format!("a record cut short at {n} of {len} bytes")),
            Err(e) => return stop(offset, e.to_string()),
        }
        match decode(&payload, crc) {
            Ok(record) => each(offset, len + RECORD_HEADER as u32, record),
            Err(why) => return stop(offset, why),
        }
        offset += (len as usize + RECORD_HEADER) as u64;
    }
}

/// Whether the rest of `input` is zeros.
fn zeros_to_end(input: &mut impl Read) -> io::Result<bool> {
    let mut buf = [0u8; BLOCK];
    loop {
        match input.read(&mut buf) {
            Ok(0) => return Ok(true),
            Ok(n) if buf[..n].iter().all(|&b| b == 0) => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn context(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

struct SegmentFile {
    path: PathBuf,
    file: File,
}

/// Where an entry's record lies.
#[derive(Clone)]
struct RecordAt {
    segment: Arc<SegmentFile>,
    offset: u64,
    len: u32,
}

impl RecordAt {
    fn read(&self) -> io::Result<Entry<TypeConfig>> {
        let mut buf = vec![0; self.len as usize];
        let path = &self.segment.path;
        self.segment
            .file
            .read_exact_at(&mut buf, self.offset)
            .map_err(|e| context(path, "reading", e))?;
        let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        match decode(&buf[RECORD_HEADER..], crc) {
            Ok(Record::Entry(e)) => Ok(e),
            Ok(_) => Err(io::Error::other(format!(
                "{} at {}: not an entry record",
                path.display(),
                self.offset
            ))),
            Err(why) => Err(io::Error::other(format!(
                "{} at {}: {why}",
                path.display(),
                self.offset
            ))),
        }
    }
}

/// What readers see (invariant 5).
#[derive(Default)]
struct Index {
    /// Entries on disk, by index.
    durable: BTreeMap<u64, (LogId<NodeId>, RecordAt)>,
    /// Entries in memory with their encoded size: every one not yet on
    /// disk, and recent durable ones.
    cached: BTreeMap<u64, (Arc<Entry<TypeConfig>>, usize)>,
    cached_bytes: usize,
    /// As of the last write on disk.
    meta: LogMeta,
}

impl Index {
    fn forget_from(&mut self, index: u64) {
        self.durable.split_off(&index);
        for (_, (_, bytes)) in self.cached.split_off(&index) {
            self.cached_bytes -= bytes;
        }
    }

    fn forget_to(&mut self, index: u64) {
        self.durable = self.durable.split_off(&(index + 1));
        let kept = self.cached.split_off(&(index + 1));
        for (_, (_, bytes)) in std::mem::replace(&mut self.cached, kept) {
            self.cached_bytes -= bytes;
        }
    }

    /// Drops durable entries from memory, oldest first, down to the budget.
    fn evict(&mut self) {
        while self.cached_bytes > CACHE_BYTES {
            let Some((&i, _)) = self.cached.first_key_value() else {
                return;
            };
            if !self.durable.contains_key(&i) {
                return;
            }
            let (_, bytes) = self.cached.remove(&i).expect("present");
            self.cached_bytes -= bytes;
        }
    }

    /// A replayed record (invariant 1).
    fn replay(&mut self, record: ReadRecord, at: RecordAt) {
        match record {
            Record::Entry(e) => {
                let i = e.log_id.index;
                if self.meta.last_purged.is_none_or(|p| i > p.index) {
                    self.durable.insert(i, (e.log_id, at));
                }
            }
            other => self.apply_meta(&other),
        }
    }

    /// What a record other than an entry does, replayed or just written.
    fn apply_meta<E>(&mut self, record: &Record<E>) {
        match record {
            Record::State(meta) => self.meta = meta.clone(),
            Record::Entry(_) => {}
            Record::Committed(c) => self.meta.committed = *c,
            Record::Vote(v) => self.meta.vote = Some(*v),
            Record::Truncate(i) => self.forget_from(*i),
            Record::Purge(id) => {
                self.forget_to(id.index);
                self.meta.last_purged = Some(*id);
            }
        }
    }
}

/// A write for the writer thread.
enum Write {
    Append {
        entries: Vec<Arc<Entry<TypeConfig>>>,
        committed: Option<Option<LogId<NodeId>>>,
        done: Box<dyn FnOnce(io::Result<()>) + Send>,
    },
    Other {
        record: Record<&'static Entry<TypeConfig>>,
        done: tokio::sync::oneshot::Sender<io::Result<()>>,
    },
    /// Holds the writer until the sender side drops.
    #[cfg(test)]
    Pause(mpsc::Receiver<()>),
}

/// The log of one replica. Clones share it; the last one dropped lets the
/// writer thread finish what was queued and joins it.
#[derive(Clone)]
pub struct Wal {
    index: Arc<Mutex<Index>>,
    /// How it writes, once opened (invariant 7).
    io: LogIo,
    writer: Arc<WriterThread>,
}

struct WriterThread {
    queue: Option<mpsc::Sender<Write>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for WriterThread {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn gone() -> io::Error {
    io::Error::other("the log writer thread is gone")
}

impl Wal {
    /// Opens the log in `dir` (created if missing), replaying its segments.
    pub fn open(dir: &Path) -> io::Result<Wal> {
        Self::open_with(dir, SEGMENT_BYTES, LogIo::Direct)
    }

    /// [`Wal::open`] with the given way of writing (invariant 7).
    pub fn open_with_io(dir: &Path, io: LogIo) -> io::Result<Wal> {
        Self::open_with(dir, SEGMENT_BYTES, io)
    }

    fn open_with(dir: &Path, segment_bytes: u64, io: LogIo) -> io::Result<Wal> {
        std::fs::create_dir_all(dir).map_err(|e| context(dir, "creating", e))?;
        let mut seqs = Vec::new();
        for item in std::fs::read_dir(dir).map_err(|e| context(dir, "listing", e))? {
            let name = item.map_err(|e| context(dir, "listing", e))?.file_name();
            let name = name.to_string_lossy();
            if let Some(seq) = name
                .strip_suffix(".wal")
                .and_then(|s| s.parse::<u64>().ok())
            {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        let mut index = Index::default();
        let mut segments = VecDeque::new();
        // Bytes in the last segment, once it has replayed.
        let mut tail_len = None;
        for (n, &seq) in seqs.iter().enumerate() {
            let last = n + 1 == seqs.len();
            let path = segment_path(dir, seq);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| context(&path, "opening", e))?;
            let segment = Arc::new(SegmentFile { path, file });
            let path = &segment.path;
            let (mut records, mut max_index) = (0u64, None);
            let end = read_segment(&segment.file, |offset, len, record| {
                records += 1;
                if let Record::Entry(e) = &record {
                    max_index = max_index.max(Some(e.log_id.index));
                }
                let at = RecordAt {
                    segment: segment.clone(),
                    offset,
                    len,
                };
                index.replay(record, at);
            });
            if let Some(why) = &end.invalid {
                if !last {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{} is corrupt at byte {} ({why}) and is not the last segment; the log cannot be trusted",
                            path.display(),
                            end.valid_len
                        ),
                    ));
                }
                tracing::warn!(
                    "{}: cutting an incomplete write at byte {} ({why})",
                    path.display(),
                    end.valid_len
                );
            }
            if records == 0 {
                // Invariant 2: a segment holds nothing acknowledged until
                // its state record is synced; a new one replaces it below.
                if last {
                    std::fs::remove_file(path).map_err(|e| context(path, "removing", e))?;
                    break;
                }
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} holds no records and is not the last segment",
                        path.display()
                    ),
                ));
            }
            if last {
                // Invariant 3: nothing of the cut write stays behind to be
                // read after the next one. Zeros alone are kept (8).
                if end.invalid.is_some() {
                    segment
                        .file
                        .set_len(end.valid_len)
                        .and_then(|()| segment.file.sync_all())
                        .map_err(|e| context(path, "cutting", e))?;
                }
                tail_len = Some(end.valid_len);
            }
            segments.push_back(Segment {
                seq,
                file: segment,
                max_index,
            });
        }
        let index = Arc::new(Mutex::new(index));
        let mut writer = Writer::new(dir, segment_bytes, index.clone(), io);
        writer.segments = segments;
        match tail_len {
            Some(len) => {
                writer.tail_len = len;
                writer.open_tail()?;
            }
            None => writer.start_segment(seqs.last().map_or(0, |s| s + 1))?,
        }
        let io = writer.io;
        let (queue, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("raft-log-writer".into())
            .spawn(move || writer.run(&rx))?;
        Ok(Wal {
            index,
            io,
            writer: Arc::new(WriterThread {
                queue: Some(queue),
                thread: Some(thread),
            }),
        })
    }

    /// Writes a new log in `dir` (created) holding `meta` and `entries`,
    /// synced; for migrating a data directory of an older format.
    pub fn create_from(
        dir: &Path,
        meta: &LogMeta,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> io::Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| context(dir, "creating", e))?;
        let index = Index {
            meta: meta.clone(),
            ..Index::default()
        };
        let mut writer = Writer::new(
            dir,
            SEGMENT_BYTES,
            Arc::new(Mutex::new(index)),
            LogIo::Direct,
        );
        writer.start_segment(0)?;
        for e in entries {
            encode(&mut writer.buf, &Record::Entry(&e))?;
            if writer.buf.len() >= 8 << 20 {
                writer.write_buf()?;
                writer.buf.clear();
            }
        }
        writer.write_buf().map(drop)
    }

    /// Holds the writer thread back until the returned sender is dropped.
    #[cfg(test)]
    pub(crate) fn pause(&self) -> mpsc::Sender<()> {
        let (release, until) = mpsc::channel();
        self.send(Write::Pause(until))
            .expect("the writer is running");
        release
    }

    fn send(&self, write: Write) -> io::Result<()> {
        self.writer
            .queue
            .as_ref()
            .and_then(|q| q.send(write).ok())
            .ok_or_else(gone)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().expect("not poisoned")
    }

    /// How the log writes: [`LogIo::Buffered`] where direct I/O was asked
    /// for but the file system refused it.
    pub fn io(&self) -> LogIo {
        self.io
    }

    /// The vote, committed index and purge point on disk.
    pub fn meta(&self) -> LogMeta {
        self.lock().meta.clone()
    }

    /// The id of the last entry, on disk or queued (the cached ones are
    /// the newest, invariant 5).
    pub fn last_log_id(&self) -> Option<LogId<NodeId>> {
        let index = self.lock();
        let cached = index.cached.last_key_value().map(|(_, (e, _))| e.log_id);
        let durable = index.durable.last_key_value().map(|(_, (id, _))| *id);
        cached.or(durable).or(index.meta.last_purged)
    }

    /// The entries in `range` that the log holds: from disk below the
    /// first cached index, from memory from there on (invariant 5).
    pub fn read(&self, range: impl RangeBounds<u64>) -> io::Result<Vec<Entry<TypeConfig>>> {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        let (on_disk, cached): (Vec<RecordAt>, Vec<Arc<Entry<TypeConfig>>>) = {
            let index = self.lock();
            let first_cached = index.cached.keys().next().copied().unwrap_or(u64::MAX);
            let on_disk = index
                .durable
                .range(range)
                .take_while(|(&i, _)| i < first_cached)
                .map(|(_, (_, at))| at.clone())
                .collect();
            let cached = index.cached.range(range).map(|(_, (e, _))| e.clone());
            (on_disk, cached.collect())
        };
        let mut out = on_disk
            .iter()
            .map(RecordAt::read)
            .collect::<io::Result<Vec<_>>>()?;
        out.extend(cached.iter().map(|e| (**e).clone()));
        Ok(out)
    }

    /// Queues `entries` (readable from now on) and the committed index to
    /// write before them; `done` runs once they are on disk.
    pub fn append(
        &self,
        entries: Vec<Entry<TypeConfig>>,
        committed: Option<Option<LogId<NodeId>>>,
        done: Box<dyn FnOnce(io::Result<()>) + Send>,
    ) -> io::Result<()> {
        let entries: Vec<_> = entries.into_iter().map(Arc::new).collect();
        {
            let mut index = self.lock();
            for e in &entries {
                let i = e.log_id.index;
                // Not yet encoded: counted once it is (invariant 5).
                if let Some((_, bytes)) = index.cached.insert(i, (e.clone(), 0)) {
                    index.cached_bytes -= bytes;
                }
            }
        }
        self.send(Write::Append {
            entries,
            committed,
            done,
        })
    }

    async fn write(&self, record: Record<&'static Entry<TypeConfig>>) -> io::Result<()> {
        let (done, result) = tokio::sync::oneshot::channel();
        self.send(Write::Other { record, done })?;
        result.await.map_err(|_| gone())?
    }

    pub async fn save_vote(&self, vote: Vote<NodeId>) -> io::Result<()> {
        self.write(Record::Vote(vote)).await
    }

    /// Removes the entries at and above `index`.
    pub async fn truncate(&self, index: u64) -> io::Result<()> {
        self.lock().forget_from(index);
        self.write(Record::Truncate(index)).await
    }

    /// Removes the entries at and below `id`.
    pub async fn purge(&self, id: LogId<NodeId>) -> io::Result<()> {
        self.write(Record::Purge(id)).await
    }
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.wal"))
}

struct Segment {
    seq: u64,
    file: Arc<SegmentFile>,
    /// The highest entry index written to it.
    max_index: Option<u64>,
}

/// The writer thread's side (invariant 5).
struct Writer {
    dir: PathBuf,
    /// Oldest first; the last one takes the writes.
    segments: VecDeque<Segment>,
    /// Bytes in the last segment.
    tail_len: u64,
    /// Bytes of the last segment's magic and state record when this
    /// process started it (0 for one it reopened): it rotates only once
    /// it holds more.
    head_len: u64,
    /// [`SEGMENT_BYTES`] but in tests.
    segment_bytes: u64,
    index: Arc<Mutex<Index>>,
    buf: Vec<u8>,
    /// Why a write failed, after which none is attempted (invariant 6).
    failed: Option<String>,
    /// Direct I/O until the file system refuses it (invariant 7).
    io: LogIo,
    /// The last segment opened for direct writes, if `io` is direct.
    direct: Option<File>,
    /// The last segment's bytes from the start of its last partial block
    /// to its end, which a direct write writes again (invariant 7).
    tail_block: Vec<u8>,
    /// The last segment's length on disk: its records, then the zeros
    /// of invariants 7 and 8.
    file_len: u64,
    /// Where a direct write is put together; block-aligned from
    /// [`aligned_start`].
    staging: Vec<u8>,
}

/// The first block-aligned offset into `buf`.
fn aligned_start(buf: &[u8]) -> usize {
    (BLOCK - buf.as_ptr().addr() % BLOCK) % BLOCK
}

impl Writer {
    /// A writer with no segment open yet.
    fn new(dir: &Path, segment_bytes: u64, index: Arc<Mutex<Index>>, io: LogIo) -> Writer {
        Writer {
            dir: dir.to_path_buf(),
            segments: VecDeque::new(),
            tail_len: 0,
            head_len: 0,
            segment_bytes,
            index,
            buf: Vec::new(),
            failed: None,
            io,
            direct: None,
            tail_block: Vec::new(),
            file_len: 0,
            staging: Vec::new(),
        }
    }

    /// Prepares direct writes to the last segment, which holds `tail_len`
    /// bytes worth keeping (invariant 7); falls back to buffered writes
    /// for good where the file system refuses `O_DIRECT`.
    fn open_tail(&mut self) -> io::Result<()> {
        self.direct = None;
        self.tail_block.clear();
        if self.io == LogIo::Buffered {
            return Ok(());
        }
        let path = self.segment().file.path.clone();
        let direct = match OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(
                    "{}: the file system refuses O_DIRECT; the log writes through the page cache",
                    self.dir.display()
                );
                self.io = LogIo::Buffered;
                return Ok(());
            }
            Err(e) => return Err(context(&path, "opening", e)),
        };
        let start = self.tail_len - self.tail_len % BLOCK as u64;
        self.tail_block.resize((self.tail_len - start) as usize, 0);
        let segment = self.segment().file.clone();
        segment
            .file
            .read_exact_at(&mut self.tail_block, start)
            .map_err(|e| context(&path, "reading", e))?;
        self.file_len = segment
            .file
            .metadata()
            .map_err(|e| context(&path, "reading", e))?
            .len();
        self.direct = Some(direct);
        Ok(())
    }

    /// Invariant 8: zero-fills the last segment ahead of its records. A
    /// failure here loses nothing (the next write extends the file
    /// itself), so it is logged and not kept as the log's failure.
    fn zero_ahead(&mut self) {
        let Some(direct) = &self.direct else { return };
        let limit = self.segment_bytes.next_multiple_of(BLOCK as u64);
        let from = self.file_len.next_multiple_of(BLOCK as u64);
        if self.failed.is_some() || from >= limit || from >= self.tail_len + ZERO_AHEAD / 2 {
            return;
        }
        let to = (self.tail_len + ZERO_AHEAD)
            .next_multiple_of(BLOCK as u64)
            .min(limit);
        self.staging.clear();
        self.staging.resize((to - from) as usize + BLOCK, 0);
        let start = aligned_start(&self.staging);
        let zeros = &self.staging[start..start + (to - from) as usize];
        match direct.write_all_at(zeros, from) {
            Ok(()) => {
                self.file_len = to;
                metrics::counter!("tessel_kv_log_zeroed_bytes_total").increment(to - from);
            }
            Err(e) => tracing::warn!(
                "{}: zero-filling ahead of the log: {e}",
                self.segment().file.path.display()
            ),
        }
    }

    fn run(mut self, rx: &mpsc::Receiver<Write>) {
        let mut next = None;
        loop {
            let write = match next.take() {
                Some(w) => w,
                None => match rx.recv() {
                    Ok(w) => w,
                    Err(_) => return,
                },
            };
            match write {
                Write::Other { record, done } => {
                    let _ = done.send(self.write_other(record));
                    self.zero_ahead();
                }
                #[cfg(test)]
                Write::Pause(until) => {
                    let _ = until.recv();
                }
                Write::Append {
                    entries,
                    committed,
                    done,
                } => {
                    let mut batch = vec![(entries, committed, done)];
                    loop {
                        match rx.try_recv() {
                            Ok(Write::Append {
                                entries,
                                committed,
                                done,
                            }) => batch.push((entries, committed, done)),
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    let result = self.write_appends(&batch).map_err(|e| e.to_string());
                    for (_, _, done) in batch {
                        done(result.clone().map_err(io::Error::other));
                    }
                    // Off the batch's path, unless the next one is queued.
                    self.zero_ahead();
                }
            }
        }
    }

    fn segment(&self) -> &Segment {
        self.segments.back().expect("a segment is always open")
    }

    /// Starts segment `seq` with the state on disk (invariants 1, 2).
    fn start_segment(&mut self, seq: u64) -> io::Result<()> {
        let path = segment_path(&self.dir, seq);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| context(&path, "creating", e))?;
        let meta = self.index.lock().expect("not poisoned").meta.clone();
        let mut buf = MAGIC.to_vec();
        encode(&mut buf, &Record::<&Entry<TypeConfig>>::State(meta))?;
        file.write_all_at(&buf, 0)
            .and_then(|()| file.sync_all())
            .map_err(|e| context(&path, "writing", e))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| context(&self.dir, "syncing", e))?;
        self.segments.push_back(Segment {
            seq,
            file: Arc::new(SegmentFile { path, file }),
            max_index: None,
        });
        self.tail_len = buf.len() as u64;
        self.head_len = self.tail_len;
        self.open_tail()
    }

    /// Writes `self.buf` at the end of the log and syncs it; returns the
    /// segment and the offset it went to.
    fn write_buf(&mut self) -> io::Result<(Arc<SegmentFile>, u64)> {
        if let Some(why) = &self.failed {
            return Err(io::Error::other(format!(
                "the log takes no more writes after a failed one ({why})"
            )));
        }
        let started = std::time::Instant::now();
        let result = self.write_buf_once();
        match &result {
            Ok(_) => {
                metrics::histogram!("tessel_kv_log_sync_seconds")
                    .record(started.elapsed().as_secs_f64());
                metrics::counter!("tessel_kv_log_syncs_total").increment(1);
                metrics::counter!("tessel_kv_log_bytes_total").increment(self.buf.len() as u64);
            }
            Err(e) => {
                metrics::counter!("tessel_kv_log_write_failures_total").increment(1);
                self.failed = Some(e.to_string());
            }
        }
        result
    }

    fn write_buf_once(&mut self) -> io::Result<(Arc<SegmentFile>, u64)> {
        if self.tail_len > self.head_len
            && self.tail_len + self.buf.len() as u64 > self.segment_bytes
        {
            let seq = self.segment().seq + 1;
            self.start_segment(seq)?;
        }
        let segment = self.segment().file.clone();
        let at = self.tail_len;
        let written = match &self.direct {
            // Invariant 7: the last partial block again, the new bytes,
            // zeros to the block's end; O_DSYNC makes it one call.
            Some(direct) => {
                let kept = self.tail_block.len();
                let total = kept + self.buf.len();
                let padded = total.next_multiple_of(BLOCK);
                self.staging.clear();
                self.staging.resize(padded + BLOCK, 0);
                let from = aligned_start(&self.staging);
                let out = &mut self.staging[from..from + padded];
                out[..kept].copy_from_slice(&self.tail_block);
                out[kept..total].copy_from_slice(&self.buf);
                let written = direct.write_all_at(out, at - kept as u64);
                self.file_len = self.file_len.max(at - kept as u64 + padded as u64);
                // `out` starts on a block boundary of the file, so its
                // last partial block is the segment's.
                self.tail_block.clear();
                self.tail_block
                    .extend_from_slice(&out[total - total % BLOCK..total]);
                written
            }
            None => segment
                .file
                .write_all_at(&self.buf, at)
                .and_then(|()| segment.file.sync_data()),
        };
        written.map_err(|e| context(&segment.path, "writing", e))?;
        self.tail_len += self.buf.len() as u64;
        Ok((segment, at))
    }

    /// Writes a batch of appends with one sync (invariants 2, 5).
    fn write_appends(&mut self, batch: &Batch) -> io::Result<()> {
        self.buf.clear();
        let mut placed = Vec::new();
        let mut committed = None;
        for (entries, c, _) in batch {
            if let Some(c) = c {
                committed = Some(*c);
                encode(&mut self.buf, &Record::Committed(*c))?;
            }
            for e in entries {
                let offset = self.buf.len() as u64;
                let len = encode(&mut self.buf, &Record::Entry(&**e))?;
                placed.push((e, offset, len));
            }
        }
        let (segment, at) = self.write_buf()?;
        metrics::counter!("tessel_kv_log_appends_total").increment(batch.len() as u64);
        metrics::counter!("tessel_kv_log_entries_total").increment(placed.len() as u64);
        let tail = self.segments.back_mut().expect("a segment is always open");
        let mut index = self.index.lock().expect("not poisoned");
        if let Some(c) = committed {
            index.meta.committed = c;
        }
        for (e, offset, len) in placed {
            let i = e.log_id.index;
            tail.max_index = tail.max_index.max(Some(i));
            // A truncate may have dropped it meanwhile; its record is then
            // undone by the truncate record written after it.
            let queued = match index.cached.get_mut(&i) {
                Some((cached, bytes)) if Arc::ptr_eq(cached, e) => {
                    *bytes = len as usize;
                    true
                }
                _ => false,
            };
            if queued {
                index.cached_bytes += len as usize;
                let at = RecordAt {
                    segment: segment.clone(),
                    offset: at + offset,
                    len,
                };
                index.durable.insert(i, (e.log_id, at));
            }
        }
        index.evict();
        Ok(())
    }

    /// Writes a vote, truncate or purge record and syncs it.
    fn write_other(&mut self, record: Record<&'static Entry<TypeConfig>>) -> io::Result<()> {
        self.buf.clear();
        encode(&mut self.buf, &record)?;
        self.write_buf()?;
        // A truncate's entries left memory when it was queued; nothing was
        // appended since (openraft awaits it), so applying it again drops
        // nothing more.
        self.index.lock().expect("not poisoned").apply_meta(&record);
        if let Record::Purge(id) = record {
            self.delete_purged(id.index)?;
        }
        Ok(())
    }

    /// Invariant 4.
    fn delete_purged(&mut self, purged: u64) -> io::Result<()> {
        while self.segments.len() > 1 {
            let oldest = self.segments.front().expect("len > 1");
            if oldest.max_index.is_some_and(|m| m > purged) {
                break;
            }
            let path = &oldest.file.path;
            std::fs::remove_file(path).map_err(|e| context(path, "removing", e))?;
            self.segments.pop_front();
        }
        Ok(())
    }
}

/// Appends queued together.
type Batch = [(
    Vec<Arc<Entry<TypeConfig>>>,
    Option<Option<LogId<NodeId>>>,
    Box<dyn FnOnce(io::Result<()>) + Send>,
)];

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::raft::Proposal;
    use tessel_kv::state::{Op, Request};

    fn id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn entry(term: u64, index: u64, value_bytes: usize) -> Entry<TypeConfig> {
        Entry {
            log_id: id(term, index),
            payload: EntryPayload::Normal(Proposal::one(Request {
                now_ms: index,
                op: Op::Put {
                    key: index.to_le_bytes().to_vec(),
                    value: vec![index as u8; value_bytes],
                    lease: None,
                },
            })),
        }
    }

    async fn append(wal: &Wal, entries: Vec<Entry<TypeConfig>>, committed: Option<LogId<u64>>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        wal.append(
            entries,
            committed.map(Some),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        )
        .unwrap();
        rx.await.unwrap().unwrap();
    }

    /// A log in 256-byte segments holding entries `1..=n` of 200 bytes,
    /// each appended on its own (so each one starts a segment).
    async fn small_segment_log(n: u64) -> (tempfile::TempDir, PathBuf, Wal) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let wal = Wal::open_with(&path, 256, LogIo::Direct).unwrap();
        for i in 1..=n {
            append(&wal, vec![entry(1, i, 200)], None).await;
        }
        (dir, path, wal)
    }

    /// Bytes up to the end of a segment file's last valid record.
    fn valid_len(segment: &Path) -> u64 {
        let end = read_segment(File::open(segment).unwrap(), |_, _, _| {});
        assert_eq!(end.invalid, None, "{}", segment.display());
        end.valid_len
    }

    fn segments(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "wal"))
            .collect();
        v.sort();
        v
    }

    /// What the log must read back, kept beside it.
    #[derive(Default)]
    struct Model {
        entries: BTreeMap<u64, Entry<TypeConfig>>,
        meta: LogMeta,
    }

    impl Model {
        fn check(&self, wal: &Wal, when: &str) {
            let read = wal.read(..).unwrap();
            let want: Vec<_> = self.entries.values().cloned().collect();
            assert_eq!(read, want, "entries {when}");
            assert_eq!(wal.meta(), self.meta, "meta {when}");
            let last = self
                .entries
                .values()
                .last()
                .map(|e| e.log_id)
                .or(self.meta.last_purged);
            assert_eq!(wal.last_log_id(), last, "last log id {when}");
        }
    }

    /// Invariants 1–4 against a model, with direct writes (invariant 7).
    #[tokio::test]
    async fn the_log_reads_back_what_a_model_holds_across_reopenings() {
        model_run(LogIo::Direct).await;
    }

    /// The same with writes through the page cache.
    #[tokio::test]
    async fn the_log_reads_back_what_a_model_holds_across_reopenings_buffered() {
        model_run(LogIo::Buffered).await;
    }

    /// Random appends (some large enough to leave the cache), truncates,
    /// purges, votes and reopenings, with segments small enough to rotate
    /// and be deleted often.
    async fn model_run(io: LogIo) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let segment_bytes = 16 << 10;
        let mut wal = Wal::open_with(&path, segment_bytes, io).unwrap();
        if wal.io() != io {
            eprintln!(
                "{}: no O_DIRECT here; the log writes buffered",
                path.display()
            );
        }
        // Closed segments of direct writes end in padding (invariant 7).
        let mut padded_segments = 0;
        let mut model = Model::default();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut term = 1;
        let mut high = 0;
        for step in 0..600 {
            let last = model.entries.keys().last().copied();
            let first = model.meta.last_purged.map_or(1, |p| p.index + 1);
            match next(10) {
                0..=4 => {
                    let start = last.map_or(first, |l| l + 1);
                    let n = 1 + next(4);
                    let big = if next(20) == 0 {
                        3 << 20
                    } else {
                        next(300) as usize
                    };
                    let entries: Vec<_> = (start..start + n).map(|i| entry(term, i, big)).collect();
                    let committed = (next(2) == 0).then(|| id(term, start));
                    append(&wal, entries.clone(), committed).await;
                    for e in entries {
                        high = high.max(e.log_id.index);
                        model.entries.insert(e.log_id.index, e);
                    }
                    if committed.is_some() {
                        model.meta.committed = committed;
                    }
                }
                5 if last.is_some() => {
                    let at = first + next(last.unwrap() - first + 1);
                    wal.truncate(at).await.unwrap();
                    model.entries.split_off(&at);
                    term += 1;
                }
                6 if last.is_some() => {
                    let to = first + next(last.unwrap() - first + 1);
                    let purged = model.entries[&to].log_id;
                    wal.purge(purged).await.unwrap();
                    model.entries = model.entries.split_off(&(to + 1));
                    model.meta.last_purged = Some(purged);
                }
                7 => {
                    let vote = Vote::new(term, next(3));
                    wal.save_vote(vote).await.unwrap();
                    model.meta.vote = Some(vote);
                }
                _ => {
                    let effective = wal.io();
                    drop(wal);
                    let segs = segments(&path);
                    for closed in &segs[..segs.len() - 1] {
                        let len = std::fs::metadata(closed).unwrap().len();
                        let valid = valid_len(closed);
                        // Unpadded when it was cut on opening and then
                        // rotated before its next write.
                        let padded = len > valid;
                        if effective == LogIo::Direct {
                            assert!(!padded || len % BLOCK as u64 == 0, "{len} {valid}");
                        } else {
                            assert!(!padded, "{len} {valid}");
                        }
                        padded_segments += usize::from(padded);
                    }
                    wal = Wal::open_with(&path, segment_bytes, io).unwrap();
                }
            }
            model.check(&wal, &format!("after step {step}"));
        }
        let direct = wal.io() == LogIo::Direct;
        assert_eq!(
            direct,
            padded_segments > 0,
            "{padded_segments} closed segments end in padding ({:?})",
            wal.io()
        );
        drop(wal);
        let wal = Wal::open_with(&path, segment_bytes, io).unwrap();
        model.check(&wal, "at the end");
        // Invariant 4: once the purge point passes every index ever
        // written, only the segment taking writes is left.
        let start = model.entries.keys().last().map_or(1, |l| l + 1);
        let entries: Vec<_> = (start..=start.max(high))
            .map(|i| entry(term, i, 10))
            .collect();
        let last = entries.last().unwrap().log_id;
        append(&wal, entries, None).await;
        wal.purge(last).await.unwrap();
        assert_eq!(segments(&path).len(), 1, "{:?}", segments(&path));
        drop(wal);
        let wal = Wal::open_with(&path, segment_bytes, io).unwrap();
        assert_eq!(wal.read(..).unwrap(), vec![]);
        assert_eq!(wal.last_log_id(), Some(last));
    }

    /// Invariant 3: a write cut short at the end of the last segment is
    /// dropped on opening, and the log goes on from there.
    #[tokio::test]
    async fn a_torn_write_at_the_end_is_cut_and_the_log_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let wal = Wal::open(&path).unwrap();
        append(&wal, (1..=3).map(|i| entry(1, i, 10)).collect(), None).await;
        drop(wal);
        let last = segments(&path).pop().unwrap();
        let good_len = valid_len(&last);
        // Half of a record: its header promises more than follows (after
        // the padding of a direct write, invariant 7).
        let mut torn = Vec::new();
        encode(&mut torn, &Record::Entry(&entry(1, 4, 10))).unwrap();
        torn.truncate(torn.len() / 2);
        let f = OpenOptions::new().append(true).open(&last).unwrap();
        std::io::Write::write_all(&mut &f, &torn).unwrap();
        drop(f);

        let wal = Wal::open(&path).unwrap();
        assert_eq!(std::fs::metadata(&last).unwrap().len(), good_len);
        assert_eq!(wal.last_log_id(), Some(id(1, 3)));
        append(&wal, vec![entry(1, 4, 10)], None).await;
        drop(wal);
        let wal = Wal::open(&path).unwrap();
        let want: Vec<_> = (1..=4).map(|i| entry(1, i, 10)).collect();
        assert_eq!(wal.read(..).unwrap(), want);
    }

    /// Invariant 2: a segment created just before a crash, with not even
    /// its state record on disk, is replaced and the log goes on after the
    /// segment before it.
    #[tokio::test]
    async fn an_empty_segment_left_by_a_crash_is_replaced() {
        let (_dir, path, wal) = small_segment_log(3).await;
        wal.save_vote(Vote::new(1, 1)).await.unwrap();
        drop(wal);
        let segs = segments(&path);
        let next = segs.len() as u64 + 10;
        std::fs::File::create(segment_path(&path, next)).unwrap();
        for round in 0..2 {
            let wal = Wal::open_with(&path, 256, LogIo::Direct).unwrap();
            let want: Vec<_> = (1..=3 + round).map(|i| entry(1, i, 200)).collect();
            assert_eq!(wal.read(..).unwrap(), want, "round {round}");
            assert_eq!(wal.meta().vote, Some(Vote::new(1, 1)));
            append(&wal, vec![entry(1, 4 + round, 200)], None).await;
        }
        let wal = Wal::open_with(&path, 256, LogIo::Direct).unwrap();
        assert_eq!(wal.last_log_id(), Some(id(1, 5)));
    }

    /// Invariant 3: a damaged record in a segment that is not the last
    /// stops the replica from opening its log.
    #[tokio::test]
    async fn a_damaged_record_before_the_last_segment_refuses_to_open() {
        let (_dir, path, wal) = small_segment_log(4).await;
        drop(wal);
        let segs = segments(&path);
        assert!(segs.len() >= 2, "{segs:?}");
        let n = valid_len(&segs[0]) as usize;
        let mut bytes = std::fs::read(&segs[0]).unwrap();
        bytes[n - 1] ^= 0xff;
        std::fs::write(&segs[0], bytes).unwrap();
        let err = Wal::open_with(&path, 256, LogIo::Direct)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("corrupt"), "{err}");
    }

    /// Invariant 5: queued entries are readable before they are on disk,
    /// and their callback runs only once they are.
    #[tokio::test]
    async fn entries_are_readable_when_queued_and_reported_once_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let wal = Wal::open(&path).unwrap();
        let release = wal.pause();
        let flushed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let f = flushed.clone();
        wal.append(
            vec![entry(1, 1, 10), entry(1, 2, 10)],
            None,
            Box::new(move |r| {
                f.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = tx.send(r);
            }),
        )
        .unwrap();
        assert_eq!(
            wal.read(1..=2).unwrap(),
            vec![entry(1, 1, 10), entry(1, 2, 10)]
        );
        assert_eq!(wal.last_log_id(), Some(id(1, 2)));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!flushed.load(std::sync::atomic::Ordering::SeqCst));
        drop(release);
        rx.await.unwrap().unwrap();
        // Group commit left the entries readable from disk too.
        drop(wal);
        let wal = Wal::open(&path).unwrap();
        assert_eq!(
            wal.read(..).unwrap(),
            vec![entry(1, 1, 10), entry(1, 2, 10)]
        );
    }

    /// Invariant 7: zeros after the last record end a segment, however
    /// few of them there are; zeros followed by anything else do not.
    #[test]
    fn zero_padding_ends_a_segment_and_data_after_it_is_invalid() {
        let mut seg = MAGIC.to_vec();
        encode(&mut seg, &Record::Entry(&entry(1, 1, 10))).unwrap();
        let records_end = seg.len() as u64;
        let read = |bytes: &[u8]| {
            let mut n = 0;
            let end = read_segment(bytes, |_, _, _| n += 1);
            (n, end)
        };
        for zeros in [0, 1, 7, 8, 9, BLOCK] {
            let mut padded = seg.clone();
            padded.resize(seg.len() + zeros, 0);
            let (n, end) = read(&padded);
            assert_eq!(
                (n, end.valid_len, end.invalid),
                (1, records_end, None),
                "{zeros} zeros"
            );
        }
        for after in [RECORD_HEADER, RECORD_HEADER + 100, BLOCK - 1] {
            let mut bad = seg.clone();
            bad.resize(seg.len() + after + 1, 0);
            *bad.last_mut().unwrap() = 1;
            let (n, end) = read(&bad);
            assert_eq!(n, 1);
            assert_eq!(end.valid_len, records_end);
            assert_eq!(end.invalid.as_deref(), Some("data after zero padding"));
        }
    }

    /// Invariant 8: the last segment is zero-filled ahead of its records,
    /// reopening keeps the zeros, and the writes after it land inside the
    /// file (its length stays put) and read back.
    #[tokio::test]
    async fn the_last_segment_is_zero_filled_ahead_and_writes_land_inside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let wal = Wal::open(&path).unwrap();
        if wal.io() != LogIo::Direct {
            eprintln!(
                "{}: no O_DIRECT here; nothing is zero-filled",
                path.display()
            );
            return;
        }
        append(&wal, vec![entry(1, 1, 100)], None).await;
        // Written after the zero-fill that follows the append's callback.
        wal.save_vote(Vote::new(1, 1)).await.unwrap();
        let seg = segments(&path).pop().unwrap();
        let zeroed = std::fs::metadata(&seg).unwrap().len();
        assert!(
            zeroed >= valid_len(&seg) + ZERO_AHEAD / 2,
            "{zeroed} bytes on disk, {} of records",
            valid_len(&seg)
        );
        drop(wal);
        let wal = Wal::open(&path).unwrap();
        assert_eq!(std::fs::metadata(&seg).unwrap().len(), zeroed);
        let mut want = vec![entry(1, 1, 100)];
        for i in 2..=20 {
            let e = entry(1, i, 1000);
            append(&wal, vec![e.clone()], None).await;
            want.push(e);
        }
        assert_eq!(std::fs::metadata(&seg).unwrap().len(), zeroed);
        drop(wal);
        assert_eq!(Wal::open(&path).unwrap().read(..).unwrap(), want);
    }

    /// Invariant 7: a direct write goes out in whole blocks from an
    /// aligned buffer, and appends that start and end mid-block, across
    /// blocks and exactly on a boundary all read back, also after a
    /// reopen in the middle of a block.
    #[tokio::test]
    async fn direct_writes_of_any_length_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut want = Vec::new();
        let mut i = 0;
        for round in 0..3 {
            let wal = Wal::open(&path).unwrap();
            for value_bytes in [0, 1, 100, 4000, 4096, 5000, 9000, 3] {
                i += 1;
                let e = entry(1, i, value_bytes);
                append(&wal, vec![e.clone()], None).await;
                want.push(e);
            }
            assert_eq!(wal.read(..).unwrap(), want, "round {round}");
            if wal.io() == LogIo::Direct {
                let seg = segments(&path).pop().unwrap();
                let len = std::fs::metadata(&seg).unwrap().len();
                assert_eq!(len % BLOCK as u64, 0, "{len}");
            }
        }
        let wal = Wal::open(&path).unwrap();
        assert_eq!(wal.read(..).unwrap(), want);
    }
}
