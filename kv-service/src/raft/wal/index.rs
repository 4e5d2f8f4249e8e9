//! Where each entry lies: segments and the records in them.

use super::*;

pub(super) struct SegmentFile {
    pub(super) path: PathBuf,
    pub(super) file: File,
}

/// Where an entry's record lies.
#[derive(Clone)]
pub(super) struct RecordAt {
    pub(super) segment: Arc<SegmentFile>,
    pub(super) offset: u64,
    pub(super) len: u32,
}

impl RecordAt {
    pub(super) fn read(&self) -> io::Result<Entry<TypeConfig>> {
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
pub(super) struct Index {
    /// Entries on disk, by index.
    pub(super) durable: BTreeMap<u64, (LogId<NodeId>, RecordAt)>,
    /// Entries in memory with their encoded size: every one not yet on
    /// disk, and recent durable ones.
    pub(super) cached: BTreeMap<u64, (Arc<Entry<TypeConfig>>, usize)>,
    pub(super) cached_bytes: usize,
    /// As of the last write on disk.
    pub(super) meta: LogMeta,
}

impl Index {
    pub(super) fn forget_from(&mut self, index: u64) {
        self.durable.split_off(&index);
        for (_, (_, bytes)) in self.cached.split_off(&index) {
            self.cached_bytes -= bytes;
        }
    }

    pub(super) fn forget_to(&mut self, index: u64) {
        self.durable = self.durable.split_off(&(index + 1));
        let kept = self.cached.split_off(&(index + 1));
        for (_, (_, bytes)) in std::mem::replace(&mut self.cached, kept) {
            self.cached_bytes -= bytes;
        }
    }

    /// Drops durable entries from memory, oldest first, down to the budget.
    pub(super) fn evict(&mut self) {
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
    pub(super) fn replay(&mut self, record: ReadRecord, at: RecordAt) {
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
    pub(super) fn apply_meta<E>(&mut self, record: &Record<E>) {
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
