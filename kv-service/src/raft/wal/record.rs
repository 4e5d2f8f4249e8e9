//! Records in a segment: framing with a length and a crc32, and reading a segment back.

use super::*;

/// One record of a segment; `E` is an entry when read, a reference to one
/// when written (serde encodes both the same).
#[derive(Debug, Serialize, Deserialize)]
pub enum Record<E> {
    /// The whole meta (first record of a segment).
    State(LogMeta),
    /// A log entry.
    Entry(E),
    /// The committed log id changed.
    Committed(Option<LogId<NodeId>>),
    /// The vote changed.
    Vote(Vote<NodeId>),
    /// Entries at and above this index are gone.
    Truncate(u64),
    /// Entries at and below this id are gone.
    Purge(LogId<NodeId>),
}

/// A record as read back.
pub type ReadRecord = Record<Entry<TypeConfig>>;

pub(super) fn encode(buf: &mut Vec<u8>, record: &Record<&Entry<TypeConfig>>) -> io::Result<u32> {
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

pub(super) fn decode(payload: &[u8], crc: u32) -> Result<ReadRecord, String> {
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
pub(super) fn zeros_to_end(input: &mut impl Read) -> io::Result<bool> {
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
pub(super) fn read_full(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
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
