//! The HloModuleProto decoder behind argument checking never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_pjrt::hlo::{entry_parameter_shapes, module_of_module_with_config};

fuzz_target!(|data: &[u8]| {
    let _ = entry_parameter_shapes(data);
    if let Some(m) = module_of_module_with_config(data) {
        let _ = entry_parameter_shapes(&m);
    }
});
