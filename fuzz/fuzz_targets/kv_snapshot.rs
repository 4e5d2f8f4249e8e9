//! A Raft snapshot as a replica receives it: any bytes are refused or read
//! without panicking and without a record over the limits, and a snapshot
//! that reads has counted every pair and event record.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_kv_service::raft::sm::{read_snapshot, SnapshotRecord};
use tessel_kv::state::Limits;

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_key: 64, max_value: 256 };
    let mut records = 0u64;
    let read = read_snapshot(&mut &data[..], limits, None, |r| {
        if let SnapshotRecord::Pair(kv) = &r {
            assert!(kv.key.len() <= 64 && kv.value.len() <= 256);
        }
        records += 1;
        Ok(())
    });
    if read.is_ok() {
        assert!(records as usize <= data.len() / 4);
    }
});
