//! The cluster CA and the certificates it signs.
//!
//! * [`init_ca`]: `ca.pem` and `ca.key`. The key signs every node's
//!   certificate and never leaves the CA's host.
//! * [`issue`]: one node's folder (`ca.pem`, `node.pem`, `node.key`) for a
//!   coordinator, a worker or a client, its role and name inside.
//! * [`renew`]: a new certificate in an existing folder (the same key or
//!   a new one), written so that a process watching the folder adopts it.
//! * [`init_certs`]: the CA plus one certificate every node shares (tests
//!   and local experiments: any holder may act as any node).
//!
//! The CA lives [`CA_DAYS`], a node's certificate what its issuer asks
//! ([`Validity`]): leaves are renewed many times under one CA.

use std::path::Path;
use std::time::{Duration, SystemTime};

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

/// How long a CA made by [`init_ca`] lives: ten years, so that its leaves
/// are renewed many times before it is rotated (README, "Identity").
pub const CA_DAYS: u32 = 3650;
/// A node certificate's default life.
pub const NODE_DAYS: u32 = 365;

/// When a certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Not before.
    pub not_before: SystemTime,
    /// Not after.
    pub not_after: SystemTime,
}

impl Validity {
    /// From an hour ago (clock skew between hosts) for `days` days.
    pub fn days(days: u32) -> Validity {
        let now = SystemTime::now();
        Validity {
            not_before: now - Duration::from_secs(3600),
            not_after: now + Duration::from_secs(u64::from(days) * 86_400),
        }
    }

    fn apply(&self, params: &mut CertificateParams) {
        params.not_before = self.not_before.into();
        params.not_after = self.not_after.into();
    }
}

fn ca_params() -> Result<(CertificateParams, KeyPair), TlsError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    Validity::days(CA_DAYS).apply(&mut params);
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
    Validity::days(NODE_DAYS).apply(&mut params);
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

/// `params` signed for `role` (its key usages) with a new key:
/// (cert PEM, key PEM).
fn sign(
    params: CertificateParams,
    role: Role,
    issuer: &Issuer<'_, KeyPair>,
) -> Result<(String, String), TlsError> {
    sign_with(params, role, issuer, KeyPair::generate()?)
}

/// [`sign`] with `key`.
fn sign_with(
    mut params: CertificateParams,
    role: Role,
    issuer: &Issuer<'_, KeyPair>,
    key: KeyPair,
) -> Result<(String, String), TlsError> {
    params.extended_key_usages = match role {
        Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        Role::Coordinator | Role::Worker => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    };
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
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
    /// When it is valid.
    pub valid: Validity,
}

fn node_params(node: &NodeCert<'_>) -> Result<CertificateParams, TlsError> {
    crate::check_name(node.name).map_err(TlsError::Config)?;
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
    node.valid.apply(&mut params);
    Ok(params)
}

/// Signs a certificate for `node` with the CA in `ca_dir` and writes a TLS
/// folder for it to `out`: `ca.pem`, `node.pem`, `node.key` (never the CA's
/// key). Refuses to replace an existing `node.pem`.
pub fn issue(ca_dir: &Path, node: &NodeCert<'_>, out: &Path) -> Result<(), TlsError> {
    let params = node_params(node)?;
    let issuer = load_issuer(ca_dir)?;
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    refuse_existing(&out.join(CERT), "a node certificate")?;
    let (cert, key) = sign(params, node.role, &issuer)?;
    let ca =
        std::fs::read_to_string(ca_dir.join(CA_CERT)).map_err(io_err(&ca_dir.join(CA_CERT)))?;
    write(out, CA_CERT, &ca)?;
    write(out, CERT, &cert)?;
    write(out, KEY, &key)?;
    restrict(&out.join(KEY))
}

/// Writes `contents` to `dir/name` by a rename, so that a reader sees the
/// old file or the new one, never a part.
fn replace(dir: &Path, name: &str, contents: &str, private: bool) -> Result<(), TlsError> {
    let tmp = dir.join(format!(".{name}.new"));
    std::fs::write(&tmp, contents).map_err(io_err(&tmp))?;
    if private {
        restrict(&tmp)?;
    }
    let dst = dir.join(name);
    std::fs::rename(&tmp, &dst).map_err(io_err(&dst))
}

/// Renews the certificate in the existing folder `out` with the CA in
/// `ca_dir`: the same key unless `new_key`. `ca.pem` becomes `trust`'s
/// bundle when given (a CA rotation), else stays; either way it must trust
/// the signing CA. The key is replaced before the certificate, each by a
/// rename: a watcher sees at worst a pair that does not match yet, and
/// keeps the old one until it does (`reload` invariant 2).
pub fn renew(
    ca_dir: &Path,
    node: &NodeCert<'_>,
    out: &Path,
    new_key: bool,
    trust: Option<&Path>,
) -> Result<(), TlsError> {
    let params = node_params(node)?;
    let issuer = load_issuer(ca_dir)?;
    let key_path = out.join(KEY);
    if !out.join(CERT).is_file() {
        return Err(TlsError::Config(format!(
            "{} has no node.pem to renew (issue one first)",
            out.display()
        )));
    }
    let key = if new_key {
        KeyPair::generate()?
    } else {
        let pem = std::fs::read_to_string(&key_path).map_err(io_err(&key_path))?;
        KeyPair::from_pem(&pem).map_err(|_| TlsError::Pem {
            path: key_path.clone(),
            what: "private key",
        })?
    };
    let bundle_path = trust.map_or_else(|| out.join(CA_CERT), Path::to_path_buf);
    let bundle = std::fs::read_to_string(&bundle_path).map_err(io_err(&bundle_path))?;
    let signing_ca =
        std::fs::read_to_string(ca_dir.join(CA_CERT)).map_err(io_err(&ca_dir.join(CA_CERT)))?;
    if !bundle.contains(signing_ca.trim()) {
        return Err(TlsError::Config(format!(
            "{} does not hold the CA in {} that signs the renewal; pass --trust with a bundle of both CAs",
            bundle_path.display(),
            ca_dir.display()
        )));
    }
    let (cert, key_pem) = sign_with(params, node.role, &issuer, key)?;
    if trust.is_some() {
        replace(out, CA_CERT, &bundle, false)?;
    }
    if new_key {
        replace(out, KEY, &key_pem, true)?;
    }
    replace(out, CERT, &cert, false)
}
