//! Slurm's hostlist notation from the environment: any text either expands
//! to at most `MAX_HOSTS` non-empty names or is refused, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_cli::identity::hostlist::{expand, MAX_HOSTS};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(hosts) = expand(s) {
        assert!(!hosts.is_empty() && hosts.len() <= MAX_HOSTS, "{s:?}");
        assert!(hosts.iter().all(|h| !h.is_empty() && !h.contains([',', '[', ']'])), "{s:?}");
    }
});
