//! Collective descriptors and the frames that carry them come from peers:
//! decoding never panics, and what is accepted re-encodes to bytes that
//! decode the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_transfer::{Descriptor, DescriptorFrame};

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = Descriptor::decode(data) {
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        let _ = d.to_string();
    }
    if let Ok((d, payload)) = DescriptorFrame::decode(data) {
        let again = DescriptorFrame::encode(&d, payload);
        let (d2, p2) = DescriptorFrame::decode(&again).unwrap();
        assert_eq!((d2, p2), (d, payload));
    }
});
