//! A Raft log segment as a replica reads it back from disk after a crash:
//! any bytes are read without panicking, records come in order within the
//! input and the size limit, and reading stops cleanly at the first
//! invalid record or at zeros that run to the end (the zero-fill ahead).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_kv_service::raft::wal::{read_segment, MAX_RECORD};

fuzz_target!(|data: &[u8]| {
    let mut end_of_last = 0u64;
    let end = read_segment(data, |offset, len, _record| {
        assert!(offset >= end_of_last && offset >= 8);
        assert!(len as u64 <= MAX_RECORD as u64 + 8);
        end_of_last = offset + len as u64;
    });
    assert!(end.valid_len >= end_of_last);
    assert!(end.valid_len <= data.len() as u64);
    if end.invalid.is_none() {
        // Valid to the end, or zeros from the last record on (`wal`
        // invariants 7 and 8: they end the records). The soak found the
        // old assertion, valid to the end only, out of date.
        let rest = &data[end.valid_len as usize..];
        assert!(rest.iter().all(|&b| b == 0), "{rest:?}");
    }
});
