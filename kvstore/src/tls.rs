//! Mutual TLS for every QUIC connection of the cluster.
//!
//! `tessel certs init DIR --hosts ...` ([`init_certs`]) creates a cluster CA
//! and one certificate signed by it, valid for server and client
//! authentication, with the given host names plus the fixed name
//! [`SERVER_NAME`] that peers verify. Every replica and client loads the
//! folder ([`TlsFiles::load`]): servers demand a client certificate from the
//! same CA, clients verify the server against it, so a peer holding a
//! certificate of another CA is refused at the handshake.
//!
//! Without a TLS folder a process must say `--insecure`
//! ([`insecure_configs`]): an ephemeral self-signed server certificate and a
//! client that accepts any server and presents none. For tests and local
//! experiments only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// The name every server certificate carries and every client verifies.
pub const SERVER_NAME: &str = "tessel";

/// What can go wrong setting up TLS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: not a PEM {what}")]
    Pem { path: PathBuf, what: &'static str },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// File names inside a TLS folder.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const CERT: &str = "node.pem";
pub const KEY: &str = "node.key";

/// Creates a cluster CA and a certificate for `hosts` in `dir`. Refuses to
/// overwrite an existing CA.
pub fn init_certs(dir: &Path, hosts: &[String]) -> Result<(), TlsError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let ca_path = dir.join(CA_CERT);
    if ca_path.exists() {
        return Err(TlsError::Config(format!(
            "{} exists; refusing to replace the cluster CA",
            ca_path.display()
        )));
    }
    let (ca_params, ca_key) = ca_params()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let (cert, key) = leaf(hosts, &issuer)?;
    let write = |name: &str, contents: String| {
        let p = dir.join(name);
        std::fs::write(&p, contents).map_err(io_err(&p))
    };
    write(CA_CERT, ca_cert.pem())?;
    write(CA_KEY, issuer.key().serialize_pem())?;
    write(CERT, cert)?;
    write(KEY, key)?;
    restrict(&dir.join(CA_KEY))?;
    restrict(&dir.join(KEY))
}

fn restrict(path: &Path) -> Result<(), TlsError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(io_err(path))?;
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

/// A certificate for servers and clients, signed by `issuer`: (cert PEM, key PEM).
fn leaf(hosts: &[String], issuer: &Issuer<'_, KeyPair>) -> Result<(String, String), TlsError> {
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
        .push(DnType::CommonName, "tessel node");
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The certificates of one TLS folder.
pub struct TlsFiles {
    ca: Vec<CertificateDer<'static>>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for TlsFiles {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca_certificates", &self.ca.len())
            .field("chain_certificates", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl Clone for TlsFiles {
    fn clone(&self) -> Self {
        TlsFiles {
            ca: self.ca.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|_| TlsError::Pem {
            path: path.to_path_buf(),
            what: "certificate",
        })?
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::Pem {
            path: path.to_path_buf(),
            what: "certificate",
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

impl TlsFiles {
    /// Loads `ca.pem`, `node.pem` and `node.key` from `dir`.
    pub fn load(dir: &Path) -> Result<TlsFiles, TlsError> {
        let key_path = dir.join(KEY);
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|_| TlsError::Pem {
            path: key_path,
            what: "private key",
        })?;
        Ok(TlsFiles {
            ca: certs(&dir.join(CA_CERT))?,
            chain: certs(&dir.join(CERT))?,
            key,
        })
    }

    fn roots(&self) -> Result<rustls::RootCertStore, TlsError> {
        let mut roots = rustls::RootCertStore::empty();
        for c in &self.ca {
            roots
                .add(c.clone())
                .map_err(|e| TlsError::Config(e.to_string()))?;
        }
        Ok(roots)
    }

    /// A server that requires a client certificate from the cluster CA.
    pub fn server_config(&self, alpn: &[u8]) -> Result<quinn::ServerConfig, TlsError> {
        let provider = provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(self.roots()?),
            provider.clone(),
        )
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        tls.alpn_protocols = vec![alpn.to_vec()];
        quic_server(tls)
    }

    /// A client that verifies servers against the cluster CA and presents
    /// its own certificate.
    pub fn client_config(&self, alpn: &[u8]) -> Result<quinn::ClientConfig, TlsError> {
        let mut tls = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(e.to_string()))?;
        tls.alpn_protocols = vec![alpn.to_vec()];
        quic_client(tls)
    }
}

/// ring's suites with AES-128-GCM first (ring lists AES-256 first): QUIC
/// seals and opens every packet with the suite's cipher, and 10 AES rounds
/// instead of 14 are cheaper per byte on the transfer path.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(p)
}

/// How long a silent peer keeps its connection: a killed process sends no
/// close, so without this a request to it waits for its full deadline.
/// Keep-alives every half second keep idle connections to live peers.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
const KEEP_ALIVE: Duration = Duration::from_millis(500);

/// Requests in flight per connection. Blocking gets and watches hold a
/// stream each, so quinn's default (100) would let 100 waiting gets starve
/// the writes that would wake them. Not much more: quinn keeps the state of
/// up to this many streams per connection for reuse (about 360 bytes each
/// here), and at 8192 the leader of `tessel bench kv` held ~2.9 MB per
/// client connection (~250 MB of its 386 MB with 1 M keys).
const MAX_STREAMS: u32 = 1024;

fn transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.max_concurrent_bidi_streams(MAX_STREAMS.into());
    t.keep_alive_interval(Some(KEEP_ALIVE));
    t.max_idle_timeout(Some(
        quinn::IdleTimeout::try_from(IDLE_TIMEOUT).expect("a small timeout"),
    ));
    Arc::new(t)
}

fn quic_server(tls: rustls::ServerConfig) -> Result<quinn::ServerConfig, TlsError> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut c = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    c.transport_config(transport());
    Ok(c)
}

fn quic_client(tls: rustls::ClientConfig) -> Result<quinn::ClientConfig, TlsError> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut c = quinn::ClientConfig::new(Arc::new(crypto));
    c.transport_config(transport());
    Ok(c)
}

/// `--insecure`: a throwaway self-signed server and a client that trusts any
/// server. No authentication at all.
pub fn insecure_configs(
    alpn: &[u8],
) -> Result<(quinn::ServerConfig, quinn::ClientConfig), TlsError> {
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec![SERVER_NAME.to_owned()])?.self_signed(&key)?;
    let key_der = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key_der)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    server.alpn_protocols = vec![alpn.to_vec()];
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider())))
        .with_no_client_auth();
    client.alpn_protocols = vec![alpn.to_vec()];
    Ok((quic_server(server)?, quic_client(client)?))
}

/// Accepts every server certificate (checking only the handshake
/// signatures). Used only with `--insecure`.
#[derive(Debug)]
struct AcceptAnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    /// Both ends offer AES-128-GCM first, so a connection between tessel
    /// processes negotiates it.
    #[test]
    fn aes_128_gcm_is_preferred() {
        let suites: Vec<_> = super::provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(suites[0], rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert!(suites.contains(&rustls::CipherSuite::TLS13_AES_256_GCM_SHA384));
        assert_eq!(
            suites.len(),
            rustls::crypto::ring::default_provider().cipher_suites.len()
        );
    }
}
