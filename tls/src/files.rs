//! One parsed TLS folder: the CA bundle, this node's chain and key, who
//! the certificate says we are, and when it stops being valid.
//!
//! Invariants:
//! 1. A folder parses only whole: a CA bundle, a chain whose first
//!    certificate carries a well-formed identity, a key that matches it.
//! 2. A certificate outside its validity (expired, or not yet valid) is
//!    refused at load with its dates, so a process never starts, or
//!    switches, to a certificate its peers would refuse.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::identity::{identity_of, Identity};
use super::{io_err, TlsError, CA_CERT, CERT, KEY};

/// A parsed folder (invariant 1).
pub(super) struct Loaded {
    pub(super) ca: Vec<CertificateDer<'static>>,
    pub(super) key: PrivateKeyDer<'static>,
    pub(super) identity: Identity,
    /// When the certificate expires, seconds since the Unix epoch.
    pub(super) not_after: i64,
    /// The chain and key as rustls serves them.
    pub(super) certified: Arc<CertifiedKey>,
    /// The CA bundle's verifiers, built once per bundle.
    pub(super) server_verifier: Arc<rustls::client::WebPkiServerVerifier>,
    pub(super) client_verifier: Arc<dyn rustls::server::danger::ClientCertVerifier>,
    /// The bytes it was parsed from (the watcher compares them).
    pub(super) source: Vec<u8>,
}

fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = || TlsError::Pem {
        path: path.to_path_buf(),
        what: "certificate",
    };
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    if certs.is_empty() {
        return Err(bad());
    }
    Ok(certs)
}

/// The folder exists and holds what a node needs, or says what is missing.
fn check_folder(dir: &Path, ca: Option<&Path>) -> Result<(), TlsError> {
    if !dir.is_dir() {
        return Err(TlsError::Config(format!(
            "TLS folder {} does not exist (create one with `tessel certs init` and `tessel certs issue`)",
            dir.display()
        )));
    }
    let needed: &[&str] = if ca.is_some() {
        &[CERT, KEY]
    } else {
        &[CA_CERT, CERT, KEY]
    };
    for name in needed {
        if !dir.join(name).is_file() {
            return Err(TlsError::Config(format!(
                "TLS folder {} has no {name} (a node's folder holds ca.pem, node.pem and node.key)",
                dir.display()
            )));
        }
    }
    match ca {
        Some(ca) if !ca.is_file() => Err(TlsError::Config(format!(
            "the CA bundle {} does not exist",
            ca.display()
        ))),
        _ => Ok(()),
    }
}

/// The three files' bytes, in one buffer (what a change is detected on).
pub(super) fn read_source(dir: &Path, ca: Option<&Path>) -> Result<[Vec<u8>; 3], TlsError> {
    check_folder(dir, ca)?;
    let read = |p: &Path| std::fs::read(p).map_err(io_err(p));
    let ca = ca.map_or_else(|| dir.join(CA_CERT), Path::to_path_buf);
    // The key first, so that an unreadable key (its owner, its mode) says
    // so instead of looking malformed.
    Ok([read(&dir.join(KEY))?, read(&dir.join(CERT))?, read(&ca)?])
}

/// Seconds since the epoch, as a UTC date a person reads (RFC 3339).
pub fn show_time(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{unix} (Unix time)"))
}

fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs() as i64
}

impl Loaded {
    /// Parses a folder's files (invariants 1 and 2).
    pub(super) fn parse(
        dir: &Path,
        ca_file: Option<&Path>,
        [key_pem, cert_pem, ca_pem]: [Vec<u8>; 3],
    ) -> Result<Loaded, TlsError> {
        let (key_path, cert_path) = (dir.join(KEY), dir.join(CERT));
        let ca_path = ca_file.map_or_else(|| dir.join(CA_CERT), Path::to_path_buf);
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::Pem {
            path: key_path.clone(),
            what: "private key",
        })?;
        let chain = certs(&cert_path, &cert_pem)?;
        let ca = certs(&ca_path, &ca_pem)?;
        let identity = identity_of(&chain[0]).ok_or_else(|| {
            TlsError::Config(format!(
                "{}: a malformed tessel:// identity",
                cert_path.display()
            ))
        })?;
        let (not_before, not_after) = validity(&chain[0]).ok_or_else(|| TlsError::Pem {
            path: cert_path.clone(),
            what: "X.509 certificate",
        })?;
        let now = now_unix();
        if now > not_after {
            return Err(TlsError::Expired {
                path: cert_path,
                not_after: show_time(not_after),
            });
        }
        if now < not_before {
            return Err(TlsError::Config(format!(
                "{}: the certificate is not valid before {} (is this host's clock right?)",
                cert_path.display(),
                show_time(not_before)
            )));
        }
        let signing = super::provider()
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| TlsError::Config(format!("{}: {e}", key_path.display())))?;
        let certified = CertifiedKey::new(chain, signing);
        certified.keys_match().map_err(|e| {
            TlsError::Config(format!(
                "{} does not match {} ({e})",
                key_path.display(),
                cert_path.display()
            ))
        })?;
        let mut roots = rustls::RootCertStore::empty();
        for c in &ca {
            roots
                .add(c.clone())
                .map_err(|e| TlsError::Config(format!("{}: {e}", ca_path.display())))?;
        }
        let (roots, provider) = (Arc::new(roots), super::provider());
        let config = |e: rustls::server::VerifierBuilderError| {
            TlsError::Config(format!("{}: {e}", ca_path.display()))
        };
        let server_verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(config)?;
        let client_verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(config)?;
        Ok(Loaded {
            ca,
            key,
            identity,
            not_after,
            certified: Arc::new(certified),
            server_verifier,
            client_verifier,
            source: [key_pem, cert_pem, ca_pem].concat(),
        })
    }
}

/// (not before, not after) in seconds since the epoch.
fn validity(cert: &CertificateDer<'_>) -> Option<(i64, i64)> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert).ok()?;
    let v = x509.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}
