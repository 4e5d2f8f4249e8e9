//! The log as openraft's storage sees it (`Wal`): reads, and writes handed to the writer thread.

use super::*;

pub(super) fn context(path: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// A write for the writer thread.
pub(super) enum Write {
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
    pub(super) index: Arc<Mutex<Index>>,
    /// How it writes, once opened (invariant 7).
    pub(super) io: LogIo,
    pub(super) writer: Arc<WriterThread>,
}

pub(super) struct WriterThread {
    pub(super) queue: Option<mpsc::Sender<Write>>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for WriterThread {
    fn drop(&mut self) {
        self.queue.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub(super) fn gone() -> io::Error {
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

    pub(super) fn open_with(dir: &Path, segment_bytes: u64, io: LogIo) -> io::Result<Wal> {
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

    /// Holds the writer thread back until the returned sender is dropped.
    #[cfg(test)]
    pub(crate) fn pause(&self) -> mpsc::Sender<()> {
        let (release, until) = mpsc::channel();
        self.send(Write::Pause(until))
            .expect("the writer is running");
        release
    }

    pub(super) fn send(&self, write: Write) -> io::Result<()> {
        self.writer
            .queue
            .as_ref()
            .and_then(|q| q.send(write).ok())
            .ok_or_else(gone)
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
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

    pub(super) async fn write(&self, record: Record<&'static Entry<TypeConfig>>) -> io::Result<()> {
        let (done, result) = tokio::sync::oneshot::channel();
        self.send(Write::Other { record, done })?;
        result.await.map_err(|_| gone())?
    }

    /// Records the vote and syncs it before returning.
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
