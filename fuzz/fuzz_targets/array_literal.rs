//! `--arg` literals: any text parses or fails cleanly; a parsed array's
//! bytes always match its shape.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(a) = tessel::array::parse_literal(text) {
            let n: i64 = a.dims().iter().product();
            assert_eq!(a.bytes().len(), n as usize * a.element_type().size());
            let _ = tessel::array::format_array(&a);
        }
    }
});
