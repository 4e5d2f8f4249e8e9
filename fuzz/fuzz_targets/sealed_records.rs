//! A sealed data channel's records come from the network: the length
//! check and the opener never panic, whatever the bytes, and accept only
//! records sealed by the other side's key in order (a record sealed here
//! from the fuzzer's plaintext opens to it; the input itself, never
//! sealed by that key, opens only if empty).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_transfer::seal::{keys, record_len, Side, KEY_MATERIAL, MAX_RECORD};

fuzz_target!(|data: &[u8]| {
    let material = [7u8; KEY_MATERIAL];
    let (_, mut opener) = keys(&material, Side::Receiver);
    let opened = opener.open_all(data);
    assert!(opened.is_err() || data.is_empty());
    if data.len() >= 4 {
        if let Ok(n) = record_len(data[..4].try_into().unwrap()) {
            assert!((1..=MAX_RECORD).contains(&n));
        }
    }
    let (mut sealer, _) = keys(&material, Side::Sender);
    let (_, mut opener) = keys(&material, Side::Receiver);
    let plain = &data[..data.len().min(MAX_RECORD)];
    if !plain.is_empty() {
        let record = sealer.record(plain).unwrap();
        assert_eq!(opener.open_all(&record).unwrap(), plain);
    }
});
