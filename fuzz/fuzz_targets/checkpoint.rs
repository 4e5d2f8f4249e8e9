//! What a restarting process reads about checkpoints: records from the KV
//! (JSON) and blocks from a peer (postcard). Decoding never panics, an
//! accepted record re-encodes to itself, and every accepted name stays
//! inside the folder it is joined to.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel::checkpoint::{decode_blocks, encode_blocks, CheckpointRecord};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = CheckpointRecord::decode(data) {
        assert_eq!(CheckpointRecord::decode(&r.encode()).unwrap(), r);
        for (name, _) in &r.arrays {
            assert!(tessel::names::check("array", name).is_ok());
        }
    }
    if let Ok(blocks) = decode_blocks(data) {
        assert_eq!(decode_blocks(&encode_blocks(&blocks)).unwrap(), blocks);
    }
});
