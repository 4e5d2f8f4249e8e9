//! Collective descriptors come from peers: decoding never panics, and an
//! accepted descriptor re-encodes to one that decodes the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_transfer::Descriptor;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = Descriptor::decode(data) {
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        let _ = d.to_string();
    }
});
