//! Snapshot files: records written in key order, read back with limits.
//!
//! # The snapshot file format
//!
//! A file sent in openraft's chunks: records of `u32` little-endian length + postcard
//! `SnapshotRecord`: one `Header {version 2, meta, state: KvState}` (≤ 64
//! MiB), then `Pair(KeyValue)`s in key order, `Events {revision, events}`
//! (a history record's events, keyed by the last revision among them,
//! split into records of about 1 MiB), `Session {client, session}`s, and a
//! `Trailer {pairs, event_records, sessions}` whose counts must match
//! (version 1: no sessions, an `End {pairs, event_records}`). After the
//! header a record may not exceed the receiving replica's key and value
//! limits plus 1 MiB; the header must match the announced snapshot meta. A bad file
//! installs nothing.

use super::*;

/// A snapshot file: framed records (u32 little-endian length, postcard).
/// The first is a [`SnapshotRecord::Header`], the last an `End`.
#[derive(Serialize, Deserialize)]
pub enum SnapshotRecord {
    /// The first record: what the snapshot covers and the state apart from its tables.
    Header {
        /// The format's version.
        version: u32,
        /// openraft's metadata (last log id, membership).
        meta: SnapshotMeta<NodeId, Node>,
        /// Revision, clock, leases and barriers (boxed: one a file, and
        /// larger than the other records).
        state: Box<KvState>,
    },
    /// One key-value pair, in key order.
    Pair(KeyValue),
    /// Some of the events of the history record keyed `revision`, the last
    /// revision among them (invariant 5); large records span several.
    Events {
        /// The history record's key.
        revision: u64,
        /// Its events.
        events: Vec<Event>,
    },
    /// The last record of a version 1 file, with counts the reader checks.
    End {
        /// Pairs written.
        pairs: u64,
        /// Event records written.
        event_records: u64,
    },
    // Appended (version 2): a variant's position is its number.
    /// One client session (`kv::state` sessions).
    Session {
        /// The session's id.
        client: u128,
        /// What it holds.
        session: ClientSession,
    },
    /// The last record of a version 2 file, with counts the reader checks.
    Trailer {
        /// Pairs written.
        pairs: u64,
        /// Event records written.
        event_records: u64,
        /// Sessions written.
        sessions: u64,
    },
}

pub(super) fn write_record(out: &mut impl Write, r: &SnapshotRecord) -> Result<()> {
    write_frame(out, &postcard::to_allocvec(r).map_err(storage)?)
}

pub(super) fn write_frame(out: &mut impl Write, bytes: &[u8]) -> Result<()> {
    out.write_all(&(bytes.len() as u32).to_le_bytes())
        .map_err(storage)?;
    out.write_all(bytes).map_err(storage)
}

/// Reads one record of at most `max` bytes; `Ok(None)` at a clean end of
/// file.
pub fn read_record(input: &mut impl Read, max: usize) -> Result<Option<SnapshotRecord>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(storage(e)),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(KvError::InvalidArgument(format!(
            "snapshot record of {len} bytes exceeds the {max}-byte limit"
        )));
    }
    let mut buf = vec![0u8; len];
    input.read_exact(&mut buf).map_err(|e| {
        KvError::InvalidArgument(format!("snapshot truncated inside a record: {e}"))
    })?;
    postcard::from_bytes(&buf)
        .map(Some)
        .map_err(|e| KvError::InvalidArgument(format!("malformed snapshot record: {e}")))
}

/// The largest record a replica with `limits` accepts after the header.
pub fn max_record(limits: Limits) -> usize {
    limits.max_key + limits.max_value + EVENTS_PER_RECORD_BYTES + 4096
}

/// Streams the tables of `txn` and `header` into `path` (invariant 3).
pub(super) fn write_snapshot(
    path: &Path,
    txn: &ReadTransaction,
    header: &SnapshotRecord,
) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp).map_err(storage)?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let head = postcard::to_allocvec(header).map_err(storage)?;
    if head.len() > MAX_SNAPSHOT_HEADER {
        return Err(KvError::Storage(format!(
            "leases and barriers take {} bytes, over the {MAX_SNAPSHOT_HEADER}-byte snapshot header limit",
            head.len()
        )));
    }
    write_frame(&mut out, &head)?;
    let mut pairs = 0u64;
    let data = txn.open_table(DATA).map_err(storage)?;
    for item in data.iter().map_err(storage)? {
        let (k, v) = item.map_err(storage)?;
        write_record(
            &mut out,
            &SnapshotRecord::Pair(decode_value(k.value(), v.value())?),
        )?;
        pairs += 1;
    }
    let mut event_records = 0u64;
    let history = txn.open_table(HISTORY).map_err(storage)?;
    for item in history.iter().map_err(storage)? {
        let (revision, v) = item.map_err(storage)?;
        let revision = revision.value();
        let mut events: Vec<Event> = postcard::from_bytes(v.value()).map_err(storage)?;
        // Records of about EVENTS_PER_RECORD_BYTES: split off the events
        // after the first that reaches it, until none are left.
        while !events.is_empty() {
            let mut bytes = 0;
            let take = events
                .iter()
                .position(|e| {
                    bytes += 32 + e.payload_bytes();
                    bytes >= EVENTS_PER_RECORD_BYTES
                })
                .map_or(events.len(), |i| i + 1);
            let rest = events.split_off(take);
            write_record(&mut out, &SnapshotRecord::Events { revision, events })?;
            event_records += 1;
            events = rest;
        }
    }
    let mut sessions = 0u64;
    for item in txn
        .open_table(SESSIONS)
        .map_err(storage)?
        .iter()
        .map_err(storage)?
    {
        let (client, v) = item.map_err(storage)?;
        let session = postcard::from_bytes(v.value()).map_err(storage)?;
        let client = client.value();
        write_record(&mut out, &SnapshotRecord::Session { client, session })?;
        sessions += 1;
    }
    write_record(
        &mut out,
        &SnapshotRecord::Trailer {
            pairs,
            event_records,
            sessions,
        },
    )?;
    let file = out.into_inner().map_err(|e| storage(e.error()))?;
    file.sync_all().map_err(storage)?;
    std::fs::rename(&tmp, path).map_err(storage)?;
    sync_dir(path)
}

pub(super) fn sync_dir(path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(storage)?;
    }
    Ok(())
}

/// Reads a snapshot's header; checks its version and, when given, that it
/// is the snapshot the leader announced.
pub(super) fn read_snapshot_header(
    input: &mut impl Read,
    expected: Option<&SnapshotMeta<NodeId, Node>>,
) -> Result<(u32, SnapshotMeta<NodeId, Node>, KvState)> {
    match read_record(input, MAX_SNAPSHOT_HEADER)? {
        Some(SnapshotRecord::Header {
            version,
            meta,
            state,
        }) => {
            if !(1..=SNAPSHOT_VERSION).contains(&version) {
                return Err(KvError::InvalidArgument(format!(
                    "snapshot format {version}, this replica reads 1 to {SNAPSHOT_VERSION}"
                )));
            }
            if let Some(expected) = expected {
                if meta.last_log_id != expected.last_log_id
                    || meta.snapshot_id != expected.snapshot_id
                {
                    return Err(KvError::InvalidArgument(format!(
                        "snapshot header says {:?}, the leader announced {:?}",
                        meta.signature(),
                        expected.signature()
                    )));
                }
            }
            Ok((version, meta, *state))
        }
        _ => Err(KvError::InvalidArgument(
            "a snapshot must start with its header".into(),
        )),
    }
}

/// Reads a whole snapshot (invariant 4): the header (checked against
/// `expected` when given), then every record within `limits`, each pair
/// and event record handed to `each`, up to a trailer whose counts match.
pub fn read_snapshot(
    input: &mut impl Read,
    limits: Limits,
    expected: Option<&SnapshotMeta<NodeId, Node>>,
    mut each: impl FnMut(SnapshotRecord) -> Result<()>,
) -> Result<(SnapshotMeta<NodeId, Node>, KvState)> {
    let (version, meta, state) = read_snapshot_header(input, expected)?;
    let (mut pairs, mut event_records, mut sessions) = (0u64, 0u64, 0u64);
    let max = max_record(limits);
    let counted = |p: u64, e: u64, s: u64, held: (u64, u64, u64)| {
        if (p, e, s) != held {
            return Err(KvError::InvalidArgument(format!(
                "snapshot trailer counts {p} pairs, {e} event records and {s} sessions, the file held {} and {} and {}",
                held.0, held.1, held.2
            )));
        }
        Ok((meta.clone(), state.clone()))
    };
    loop {
        match read_record(input, max)? {
            Some(SnapshotRecord::Pair(kv)) => {
                limits.check_key(&kv.key)?;
                limits.check_value(&kv.value)?;
                pairs += 1;
                each(SnapshotRecord::Pair(kv))?;
            }
            Some(r @ SnapshotRecord::Events { .. }) => {
                event_records += 1;
                each(r)?;
            }
            Some(r @ SnapshotRecord::Session { .. }) if version >= 2 => {
                sessions += 1;
                each(r)?;
            }
            Some(SnapshotRecord::End {
                pairs: p,
                event_records: e,
            }) if version == 1 => return counted(p, e, 0, (pairs, event_records, sessions)),
            Some(SnapshotRecord::Trailer {
                pairs: p,
                event_records: e,
                sessions: s,
            }) if version >= 2 => return counted(p, e, s, (pairs, event_records, sessions)),
            Some(SnapshotRecord::Session { .. })
            | Some(SnapshotRecord::End { .. })
            | Some(SnapshotRecord::Trailer { .. }) => {
                return Err(KvError::InvalidArgument(format!(
                    "a record that a version {version} snapshot does not have"
                )))
            }
            Some(SnapshotRecord::Header { .. }) => {
                return Err(KvError::InvalidArgument("a second snapshot header".into()))
            }
            None => {
                return Err(KvError::InvalidArgument(
                    "snapshot ends without its trailer".into(),
                ))
            }
        }
    }
}

/// Reads the header of the snapshot at `path`.
pub(super) fn read_header(path: &Path) -> Result<(SnapshotMeta<NodeId, Node>, KvState)> {
    let file = std::fs::File::open(path).map_err(storage)?;
    let (_, meta, state) = read_snapshot_header(&mut BufReader::new(file), None)?;
    Ok((meta, state))
}

/// Loads the snapshot in `file` into a new write transaction replacing the
/// tables, checked against `expected` (invariant 4), and copies it to
/// `copy_to`. Uncommitted.
pub(super) fn load_snapshot(
    db: &Database,
    file: std::fs::File,
    copy_to: &Path,
    expected: &SnapshotMeta<NodeId, Node>,
    limits: Limits,
) -> Result<(WriteTransaction, KvState)> {
    let copy = BufWriter::with_capacity(1 << 20, std::fs::File::create(copy_to).map_err(storage)?);
    let mut input = Tee {
        input: BufReader::with_capacity(1 << 20, file),
        copy,
    };
    let txn = db.begin_write().map_err(storage)?;
    txn.delete_table(DATA).map_err(storage)?;
    txn.delete_table(HISTORY).map_err(storage)?;
    txn.delete_table(SESSIONS).map_err(storage)?;
    txn.delete_table(LEASES).map_err(storage)?;
    let (_, state) = {
        let mut data = txn.open_table(DATA).map_err(storage)?;
        let mut history = txn.open_table(HISTORY).map_err(storage)?;
        let mut sessions = txn.open_table(SESSIONS).map_err(storage)?;
        read_snapshot(&mut input, limits, Some(expected), |record| {
            match record {
                SnapshotRecord::Pair(kv) => {
                    let bytes = encode_value(&kv)?;
                    data.insert(kv.key.as_slice(), bytes.as_slice())
                        .map_err(storage)?;
                }
                SnapshotRecord::Events {
                    revision,
                    mut events,
                } => {
                    if let Some(before) = history.get(revision).map_err(storage)? {
                        let mut all: Vec<Event> =
                            postcard::from_bytes(before.value()).map_err(storage)?;
                        all.append(&mut events);
                        events = all;
                    }
                    let bytes = postcard::to_allocvec(&events).map_err(storage)?;
                    history
                        .insert(revision, bytes.as_slice())
                        .map_err(storage)?;
                }
                SnapshotRecord::Session { client, session } => {
                    let bytes = postcard::to_allocvec(&session).map_err(storage)?;
                    sessions.insert(client, bytes.as_slice()).map_err(storage)?;
                }
                SnapshotRecord::Header { .. }
                | SnapshotRecord::End { .. }
                | SnapshotRecord::Trailer { .. } => {}
            }
            Ok(())
        })?
    };
    let copy = input.copy.into_inner().map_err(|e| storage(e.error()))?;
    copy.sync_all().map_err(storage)?;
    Ok((txn, state))
}

/// Reads `input` and writes what it read to `copy`.
pub(super) struct Tee<R, W> {
    pub(super) input: R,
    pub(super) copy: W,
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.input.read(buf)?;
        self.copy.write_all(&buf[..n])?;
        Ok(n)
    }
}
