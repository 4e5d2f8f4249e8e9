//! Certificate verifiers that check who a peer is, not only that the
//! cluster CA signed its certificate.
//!
//! Invariants:
//! 1. Every chain is verified by rustls's WebPKI verifiers against the
//!    cluster CA (as the name `tessel`, which every certificate carries).
//! 2. A server passes only in the role the client expects (a coordinator
//!    also naming the dialed address, or the worker meant); a client only in
//!    a role the server serves.
//! 3. The cluster-wide certificate passes every role check; a malformed
//!    identity passes none.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// The handshake-signature checks every verifier here makes the same
/// way, with the provider's algorithms (`self.algorithms`).
macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algorithms.supported_schemes()
        }
    };
}

use super::identity::{identity_of, Identity, Role};
use super::SERVER_NAME;

/// Whom a client means to reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// A replica, whose certificate must name the address dialed.
    Coordinator,
    /// A worker's transfer endpoint: any worker, or the one named.
    Worker(Option<String>),
}

/// Which clients a server admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// Any role (the replica authorizes each request by the identity).
    AnyRole,
    /// Workers only (transfer endpoints).
    Workers,
}

fn refuse(why: String) -> rustls::Error {
    rustls::Error::General(why)
}

/// Invariant 2 for servers, pure: `identity` presented when `expect`ed.
pub fn check_server(identity: Option<&Identity>, expect: &Expect) -> Result<(), String> {
    match (identity, expect) {
        (None, _) => Err("the certificate's tessel:// identity is malformed".into()),
        (Some(Identity::Shared | Identity::Anonymous), _) => Ok(()),
        (
            Some(Identity::Node {
                role: Role::Coordinator,
                ..
            }),
            Expect::Coordinator,
        ) => Ok(()),
        (
            Some(Identity::Node {
                role: Role::Worker,
                name,
            }),
            Expect::Worker(want),
        ) => match want {
            Some(w) if w != name => Err(format!("expected worker `{w}`, found worker `{name}`")),
            _ => Ok(()),
        },
        (Some(found), _) => Err(format!(
            "expected {}, found {found}",
            match expect {
                Expect::Coordinator => "a coordinator".to_owned(),
                Expect::Worker(Some(w)) => format!("worker `{w}`"),
                Expect::Worker(None) => "a worker".to_owned(),
            }
        )),
    }
}

/// Invariant 2 for clients, pure.
pub fn check_client(identity: Option<&Identity>, accept: Accept) -> Result<(), String> {
    match (identity, accept) {
        (None, _) => Err("the certificate's tessel:// identity is malformed".into()),
        (Some(_), Accept::AnyRole) => Ok(()),
        (Some(id), Accept::Workers) if id.may_be(Role::Worker) => Ok(()),
        (Some(id), Accept::Workers) => Err(format!("{id} may not open transfers; workers only")),
    }
}

/// The WebPKI verifiers of the CA bundle in use now (built once per
/// bundle loaded; they follow renewals).
pub(super) trait Trust: Send + Sync + std::fmt::Debug {
    /// Verifies servers' chains.
    fn server(&self) -> Arc<WebPkiServerVerifier>;
    /// Verifies clients' chains.
    fn client(&self) -> Arc<dyn ClientCertVerifier>;
}

/// Verifies a server's chain and its identity (invariants 1-3).
#[derive(Debug)]
pub(super) struct ServerVerifier {
    trust: Arc<dyn Trust>,
    expect: Expect,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerVerifier {
    pub(super) fn new(
        trust: Arc<dyn Trust>,
        provider: &CryptoProvider,
        expect: Expect,
    ) -> ServerVerifier {
        ServerVerifier {
            trust,
            algorithms: provider.signature_verification_algorithms,
            expect,
        }
    }
}

fn tessel_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME).expect("a valid DNS name")
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let inner = self.trust.server();
        inner.verify_server_cert(end_entity, intermediates, &tessel_name(), ocsp, now)?;
        let identity = identity_of(end_entity);
        check_server(identity.as_ref(), &self.expect).map_err(refuse)?;
        // A coordinator's certificate names the address it serves at.
        if let (Some(Identity::Node { .. }), Expect::Coordinator) = (&identity, &self.expect) {
            inner
                .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
                .map_err(|e| {
                    refuse(format!(
                        "the coordinator's certificate does not name {} ({e}); issue it with --hosts including that address",
                        server_name.to_str()
                    ))
                })?;
        }
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

/// Verifies a client's chain and admits only the roles `accept` names.
#[derive(Debug)]
pub(super) struct ClientVerifier {
    trust: Arc<dyn Trust>,
    accept: Accept,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientVerifier {
    /// The current WebPKI client verifier of `trust`, wrapped.
    pub(super) fn new(
        trust: Arc<dyn Trust>,
        provider: &CryptoProvider,
        accept: Accept,
    ) -> ClientVerifier {
        ClientVerifier {
            trust,
            algorithms: provider.signature_verification_algorithms,
            accept,
        }
    }
}

impl ClientCertVerifier for ClientVerifier {
    /// No hints: the bundle changes with renewals, and tessel's clients
    /// present their one certificate whatever the hints.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.trust
            .client()
            .verify_client_cert(end_entity, intermediates, now)?;
        check_client(identity_of(end_entity).as_ref(), self.accept).map_err(refuse)?;
        Ok(ClientCertVerified::assertion())
    }

    handshake_signatures!();
}

/// Accepts every server certificate (checking only the handshake
/// signatures). Used only with `--insecure`.
#[derive(Debug)]
pub(super) struct AcceptAnyServer {
    algorithms: WebPkiSupportedAlgorithms,
}

impl AcceptAnyServer {
    pub(super) fn new(provider: &CryptoProvider) -> AcceptAnyServer {
        AcceptAnyServer {
            algorithms: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(role: Role, name: &str) -> Identity {
        Identity::node(role, name)
    }

    #[test]
    fn servers_are_accepted_only_in_the_expected_role_and_name() {
        let w4 = node(Role::Worker, "h4");
        assert!(check_server(Some(&w4), &Expect::Worker(Some("h4".into()))).is_ok());
        assert!(check_server(Some(&w4), &Expect::Worker(None)).is_ok());
        let e = check_server(Some(&w4), &Expect::Worker(Some("h5".into()))).unwrap_err();
        assert!(e.contains("expected worker `h5`"), "{e}");
        assert!(check_server(Some(&w4), &Expect::Coordinator).is_err());
        let client = node(Role::Client, "ops");
        assert!(check_server(Some(&client), &Expect::Coordinator).is_err());
        assert!(check_server(Some(&node(Role::Coordinator, "1")), &Expect::Coordinator).is_ok());
        // Invariant 3.
        assert!(check_server(Some(&Identity::Shared), &Expect::Coordinator).is_ok());
        assert!(check_server(None, &Expect::Worker(None)).is_err());
    }

    #[test]
    fn transfer_endpoints_admit_workers_only() {
        assert!(check_client(Some(&node(Role::Worker, "h4")), Accept::Workers).is_ok());
        assert!(check_client(Some(&Identity::Shared), Accept::Workers).is_ok());
        let e = check_client(Some(&node(Role::Client, "ops")), Accept::Workers).unwrap_err();
        assert!(e.contains("workers only"), "{e}");
        assert!(check_client(Some(&node(Role::Coordinator, "1")), Accept::Workers).is_err());
        assert!(check_client(Some(&node(Role::Client, "ops")), Accept::AnyRole).is_ok());
        assert!(check_client(None, Accept::AnyRole).is_err());
    }
}
