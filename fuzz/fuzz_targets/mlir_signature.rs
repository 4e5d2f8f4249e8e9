//! The @main signature reader never panics, whatever the text.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = tessel::program::mlir::parse_signature(text);
    }
});
