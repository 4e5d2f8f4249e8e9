//! What the transfer tests share: certificates of their own CA.

use std::path::Path;

use tessel_tls::{issue, NodeCert, Role, TlsFiles};

/// A certificate of CA `ca` for `name` in role `role`, issued into `dir`.
pub(crate) fn node(ca: &Path, dir: &Path, role: Role, name: &str) -> TlsFiles {
    let out = dir.join(name);
    issue(
        ca,
        &NodeCert {
            role,
            name,
            hosts: &[],
            valid: tessel_tls::Validity::days(30),
        },
        &out,
    )
    .unwrap();
    TlsFiles::load(&out).unwrap()
}
