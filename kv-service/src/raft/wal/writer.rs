//! The writer thread: one `pwrite` per append, syncs, segments, zero-fill ahead.

use super::*;

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.wal"))
}

pub(super) struct Segment {
    pub(super) seq: u64,
    pub(super) file: Arc<SegmentFile>,
    /// The highest entry index written to it.
    pub(super) max_index: Option<u64>,
}

/// The writer thread's side (invariant 5).
pub(super) struct Writer {
    pub(super) dir: PathBuf,
    /// Oldest first; the last one takes the writes.
    pub(super) segments: VecDeque<Segment>,
    /// Bytes in the last segment.
    pub(super) tail_len: u64,
    /// Bytes of the last segment's magic and state record when this
    /// process started it (0 for one it reopened): it rotates only once
    /// it holds more.
    pub(super) head_len: u64,
    /// [`SEGMENT_BYTES`] but in tests.
    pub(super) segment_bytes: u64,
    pub(super) index: Arc<Mutex<Index>>,
    pub(super) buf: Vec<u8>,
    /// Why a write failed, after which none is attempted (invariant 6).
    pub(super) failed: Option<String>,
    /// Direct I/O until the file system refuses it (invariant 7).
    pub(super) io: LogIo,
    /// The last segment opened for direct writes, if `io` is direct.
    pub(super) direct: Option<File>,
    /// The last segment's bytes from the start of its last partial block
    /// to its end, which a direct write writes again (invariant 7).
    pub(super) tail_block: Vec<u8>,
    /// The last segment's length on disk: its records, then the zeros
    /// of invariants 7 and 8.
    pub(super) file_len: u64,
    /// Where a direct write is put together; block-aligned from
    /// [`aligned_start`].
    pub(super) staging: Vec<u8>,
}

/// The first block-aligned offset into `buf`.
pub(super) fn aligned_start(buf: &[u8]) -> usize {
    (BLOCK - buf.as_ptr().addr() % BLOCK) % BLOCK
}

impl Writer {
    /// A writer with no segment open yet.
    pub(super) fn new(
        dir: &Path,
        segment_bytes: u64,
        index: Arc<Mutex<Index>>,
        io: LogIo,
    ) -> Writer {
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
    pub(super) fn open_tail(&mut self) -> io::Result<()> {
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
    pub(super) fn zero_ahead(&mut self) {
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

    pub(super) fn run(mut self, rx: &mpsc::Receiver<Write>) {
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

    pub(super) fn segment(&self) -> &Segment {
        self.segments.back().expect("a segment is always open")
    }

    /// Starts segment `seq` with the state on disk (invariants 1, 2).
    pub(super) fn start_segment(&mut self, seq: u64) -> io::Result<()> {
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
    pub(super) fn write_buf(&mut self) -> io::Result<(Arc<SegmentFile>, u64)> {
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

    pub(super) fn write_buf_once(&mut self) -> io::Result<(Arc<SegmentFile>, u64)> {
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
    pub(super) fn write_appends(&mut self, batch: &Batch) -> io::Result<()> {
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
    pub(super) fn write_other(
        &mut self,
        record: Record<&'static Entry<TypeConfig>>,
    ) -> io::Result<()> {
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
    pub(super) fn delete_purged(&mut self, purged: u64) -> io::Result<()> {
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
pub(super) type Batch = [(
    Vec<Arc<Entry<TypeConfig>>>,
    Option<Option<LogId<NodeId>>>,
    Box<dyn FnOnce(io::Result<()>) + Send>,
)];
