//! The key-value wire protocol: any header and body is refused or decoded
//! without panicking, for every message type (a keep-alive stream's frames
//! too), and a decoded request re-encodes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_kv_service::wire::{
    decode, encode, frame_len, KeepAliveFrame, WireRequest, WireResponse, MAX_FRAME,
};

fuzz_target!(|data: &[u8]| {
    if data.len() >= 4 {
        let header: [u8; 4] = data[..4].try_into().unwrap();
        if let Ok(len) = frame_len(header, MAX_FRAME) {
            assert!(len <= MAX_FRAME);
        }
    }
    if let Ok(req) = decode::<WireRequest>(data) {
        encode(&req, usize::MAX).expect("a decoded request re-encodes");
    }
    let _ = decode::<WireResponse>(data);
    let _ = decode::<KeepAliveFrame>(data);
});
