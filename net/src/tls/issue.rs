//! The cluster CA and the certificates it signs.
//!
//! * [`init_ca`]: `ca.pem` and `ca.key`. The key signs every node's
//!   certificate and never leaves the CA's host.
//! * [`issue`]: one node's folder (`ca.pem`, `node.pem`, `node.key`) for a
//!   coordinator, a worker or a client, its role and name inside.
//! * [`init_certs`]: the CA plus one certificate every node shares (tests
//!   and local experiments: any holder may act as any node).

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use super::identity::{Role, SCHEME};
use super::{io_err, TlsError, CA_CERT, CA_KEY, CERT, KEY, SERVER_NAME};

fn write(dir: &Path, name: &str, contents: &str) -> Result<(), TlsError> {
    let p = dir.join(name);
    std::fs::write(&p, contents).map_err(io_err(&p))
}

fn restrict(path: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io_err(path))
}

fn refuse_existing(path: &Path, what: &str) -> Result<(), TlsError> {
    if path.exists() {
        return Err(TlsError::Config(format!(
            "{} exists; refusing to replace {what}",
            path.display()
        )));
    }
    Ok(())
}

fn ca_params() -> Result<(CertificateParams, KeyPair), TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "tessel cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok((params, KeyPair::generate()?))
}

/// Creates a cluster CA in `dir` (`ca.pem`, `ca.key`); refuses to replace
/// one.
pub fn init_ca(dir: &Path) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    refuse_existing(&dir.join(CA_CERT), "the cluster CA")?;
    let (params, key) = ca_params()?;
    let cert = params.self_signed(&key)?;
    write(dir, CA_CERT, &cert.pem())?;
    write(dir, CA_KEY, &key.serialize_pem())?;
    restrict(&dir.join(CA_KEY))
}

/// Creates a cluster CA and one certificate every node shares, valid for
/// `hosts`, in `dir`. Refuses to replace an existing CA.
pub fn init_certs(dir: &Path, hosts: &[String]) -> Result<(), TlsError> {
    init_ca(dir)?;
    let issuer = load_issuer(dir)?;
    let mut names = vec![
        SERVER_NAME.to_owned(),
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
    ];
    names.extend(hosts.iter().filter(|h| !h.is_empty()).cloned());
    names.dedup();
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "tessel node (shared)");
    let (cert, key) = sign(params, Role::Coordinator, &issuer)?;
    write(dir, CERT, &cert)?;
    write(dir, KEY, &key)?;
    restrict(&dir.join(KEY))
}

fn load_issuer(ca_dir: &Path) -> Result<Issuer<'static, KeyPair>, TlsError> {
    let read = |name: &str| {
        let p = ca_dir.join(name);
        std::fs::read_to_string(&p).map_err(io_err(&p))
    };
    let key = KeyPair::from_pem(&read(CA_KEY)?).map_err(|_| TlsError::Pem {
        path: ca_dir.join(CA_KEY),
        what: "CA private key",
    })?;
    Issuer::from_ca_cert_pem(&read(CA_CERT)?, key).map_err(|_| TlsError::Pem {
        path: ca_dir.join(CA_CERT),
        what: "CA certificate",
    })
}

/// `params` signed for `role` (its key usages): (cert PEM, key PEM).
fn sign(
    mut params: CertificateParams,
    role: Role,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(String, String), TlsError> {
    params.extended_key_usages = match role {
        Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        Role::Coordinator | Role::Worker => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    };
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// What [`issue`] makes.
#[derive(Debug, Clone)]
pub struct NodeCert<'a> {
    /// What the node may do.
    pub role: Role,
    /// The node's name: a coordinator's replica id, a worker's id, a
    /// client's user name.
    pub name: &'a str,
    /// Host names and IPs the node serves at (coordinators: every address
    /// clients and peers dial; `*.svc` wildcards allowed).
    pub hosts: &'a [String],
}

/// Signs a certificate for `node` with the CA in `ca_dir` and writes a TLS
/// folder for it to `out`: `ca.pem`, `node.pem`, `node.key` (never the CA's
/// key). Refuses to replace an existing `node.pem`.
pub fn issue(ca_dir: &Path, node: &NodeCert<'_>, out: &Path) -> Result<(), TlsError> {
    crate::check_name(node.name).map_err(TlsError::Config)?;
    let issuer = load_issuer(ca_dir)?;
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    refuse_existing(&out.join(CERT), "a node certificate")?;
    let mut names = vec![SERVER_NAME.to_owned()];
    names.extend(node.hosts.iter().filter(|h| !h.is_empty()).cloned());
    names.dedup();
    let mut params = CertificateParams::new(names)?;
    let uri = format!("{SCHEME}{}/{}", node.role, node.name);
    params.subject_alt_names.push(SanType::URI(
        uri.clone()
            .try_into()
            .map_err(|_| TlsError::Config(format!("`{uri}` is not a valid URI")))?,
    ));
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{} {}", node.role, node.name));
    let (cert, key) = sign(params, node.role, &issuer)?;
    let ca =
        std::fs::read_to_string(ca_dir.join(CA_CERT)).map_err(io_err(&ca_dir.join(CA_CERT)))?;
    write(out, CA_CERT, &ca)?;
    write(out, CERT, &cert)?;
    write(out, KEY, &key)?;
    restrict(&out.join(KEY))
}
