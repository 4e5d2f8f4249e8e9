//! Data channel requests and answers come from peers (the data
//! channels' set-up): the frame length and both decoders never panic,
//! and what they accept re-encodes to the same frame.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_transfer::channel::{frame_len, ChannelAnswer, ChannelRequest, MAX_FRAME};
use tessel_transfer::Encryption;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let prefix: [u8; 4] = data[..4].try_into().unwrap();
    if let Ok(n) = frame_len(prefix) {
        assert!(n <= MAX_FRAME);
        let body = &data[4..data.len().min(4 + n)];
        if let Ok(r) = ChannelRequest::decode(body) {
            assert_eq!(ChannelRequest::decode(&r.encode(Encryption::On)[8..]).unwrap(), r);
        }
        if let Ok(a) = ChannelAnswer::decode(body) {
            assert_eq!(ChannelAnswer::decode(&a.encode()[4..]).unwrap(), a);
        }
    }
});
