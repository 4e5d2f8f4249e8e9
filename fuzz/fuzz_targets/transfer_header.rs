//! Transfer headers come from peers: the frame length and the decoder never
//! panic, and an accepted header is within the limit and consistent (a part
//! of a striped payload included).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_transfer::TransferHeader;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let prefix: [u8; 4] = data[..4].try_into().unwrap();
    if let Ok(n) = TransferHeader::frame_len(prefix) {
        let body = &data[4..data.len().min(4 + n)];
        if let Ok(h) = TransferHeader::decode(body, 1 << 30) {
            assert!(h.byte_len <= 1 << 30);
            assert_eq!(TransferHeader::decode(&h.encode()[4..], 1 << 30).unwrap(), h);
            if let Some(p) = h.part {
                // A part of a striped payload: within its count, on the
                // network path, and its bytes within the payload.
                assert!(p.index < p.count && h.shm.is_none());
                let r = tessel_transfer::stripe::part_range(h.byte_len, p.index, p.count);
                assert!(r.start <= r.end && r.end <= h.byte_len);
            }
        }
    }
});
