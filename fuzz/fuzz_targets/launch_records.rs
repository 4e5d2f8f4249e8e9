//! What command jobs and preemption read back from the key-value service:
//! the rendezvous address and a notice. Any bytes decode or are refused
//! cleanly; a decoded rendezvous encodes back to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_worker::command::env::Rendezvous;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(r) = Rendezvous::decode(&text) {
        assert_eq!(Rendezvous::decode(&r.encode()), Some(r));
    }
    let _ = tessel_worker::preempt::parse_notice(data);
});
