//! Coordinator records read from the KV: assignments (validated on
//! decode), worker records, job failures, the scheduler's state and job
//! events never panic the decoder; an accepted scheduler state re-encodes
//! to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_coordinator::jobs::{JobAssignment, JobFailure};
use tessel_coordinator::scheduler::{JobEvent, SchedulerState};
use tessel_coordinator::{keys, WorkerRecord};

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = JobAssignment::decode(data) {
        assert!(a.process_index < a.num_processes);
    }
    let _ = postcard::from_bytes::<WorkerRecord>(data);
    let _ = postcard::from_bytes::<JobFailure>(data);
    if let Ok(s) = SchedulerState::decode(data) {
        assert_eq!(SchedulerState::decode(&s.encode()).unwrap(), s);
    }
    let _ = postcard::from_bytes::<JobEvent>(data);
    let _ = keys::parse_alive(data);
    let _ = keys::parse_alive_value(data);
});
