//! The state machine applies any decodable request without panicking, and
//! keeps its invariants: revisions never go down, and a snapshot round
//! trips.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_kv::state::{Limits, MemState, Request};

fuzz_target!(|data: &[u8]| {
    let mut state = MemState::new(Limits { max_key: 64, max_value: 256 }, 16);
    let mut rest = data;
    while let Ok((req, tail)) = postcard::take_from_bytes::<Request>(rest) {
        let before = state.revision();
        let _ = state.apply(&req);
        assert!(state.revision() >= before);
        rest = tail;
    }
    let snap = postcard::to_allocvec(&state).unwrap();
    assert_eq!(postcard::from_bytes::<MemState>(&snap).unwrap(), state);
});
