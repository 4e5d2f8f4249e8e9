//! Coordinator records read from the KV: assignments (validated on
//! decode), worker records and job failures never panic the decoder.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_coordinator::jobs::{JobAssignment, JobFailure};
use tessel_coordinator::{keys, WorkerRecord};

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = JobAssignment::decode(data) {
        assert!(a.process_index < a.num_processes);
    }
    let _ = postcard::from_bytes::<WorkerRecord>(data);
    let _ = postcard::from_bytes::<JobFailure>(data);
    let _ = keys::parse_alive(data);
    let _ = keys::parse_alive_value(data);
});
