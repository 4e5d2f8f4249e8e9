//! `.npy` decoding: any bytes decode or fail cleanly, never allocate past
//! the announced (and bounded) size, and what decodes re-encodes to an
//! equal array.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel::array::{read_npy, write_npy};

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = read_npy(data) {
        let again = read_npy(&write_npy(&a)).expect("our own encoding decodes");
        assert_eq!(again, a);
    }
});
