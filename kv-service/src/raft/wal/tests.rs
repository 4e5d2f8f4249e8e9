//! The segment-file log against a model, direct and buffered; torn writes; zero-fill.

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
