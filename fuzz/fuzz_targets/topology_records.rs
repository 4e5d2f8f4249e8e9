//! Topology records read from the KV: decoding never panics, and whatever
//! decodes is valid, re-encodes to a value that decodes equal, and builds
//! (or fails to build) without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel_topology::exchange::Published;
use tessel_topology::{GlobalTopology, LocalTopology, Mesh};

fuzz_target!(|data: &[u8]| {
    if let Ok(l) = LocalTopology::decode(data) {
        assert_eq!(LocalTopology::decode(&l.encode()).unwrap(), l);
        let _ = GlobalTopology::build(l.num_processes, std::slice::from_ref(&l));
    }
    if let Ok(g) = GlobalTopology::decode(data) {
        assert_eq!(GlobalTopology::decode(&g.encode()).unwrap(), g);
        let n = g.devices.len();
        let _ = Mesh::new(&g, &[("x".to_string(), n)]);
    }
    let _ = Published::decode(data);
    if let Ok(spec) = std::str::from_utf8(data) {
        let _ = Mesh::parse_axes(spec);
    }
});
