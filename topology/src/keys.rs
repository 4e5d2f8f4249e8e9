//! The key-value keys of a job's topology (the schema is also in
//! ARCHITECTURE.md).
//!
//! * `jobs/{job}/topology/local/{index:05}`: a process's [`LocalTopology`]
//!   (postcard), inserted once; re-inserting the same bytes is accepted.
//! * `jobs/{job}/topology/global`: the builder's [`Published`] outcome.
//! * `jobs/{job}/collectives/{stream}/{sha256(devices) hex}`: a clique's
//!   collective id.
//!
//! [`LocalTopology`]: crate::LocalTopology
//! [`Published`]: crate::exchange::Published

/// Job ids and stream keys are path components
/// ([`tessel_kv::check_path_component`]).
pub fn check_component(what: &str, s: &str) -> crate::Result<()> {
    tessel_kv::check_path_component(what, s).map_err(crate::TopologyError::Invalid)
}

/// Every process's local topology.
pub fn local_prefix(job: &str) -> String {
    format!("jobs/{job}/topology/local/")
}

/// Process `index`'s local topology.
pub fn local(job: &str, index: u32) -> String {
    format!("jobs/{job}/topology/local/{index:05}")
}

/// The builder's [`crate::exchange::Published`] outcome.
pub fn global(job: &str) -> String {
    format!("jobs/{job}/topology/global")
}

/// A clique's collective id.
pub fn collective(job: &str, stream: &str, digest_hex: &str) -> String {
    format!("jobs/{job}/collectives/{stream}/{digest_hex}")
}

/// The process index in a local-topology key, if it is one.
pub fn parse_local(job: &str, key: &[u8]) -> Option<u32> {
    let rest = key.strip_prefix(local_prefix(job).as_bytes())?;
    std::str::from_utf8(rest).ok()?.parse().ok()
}
