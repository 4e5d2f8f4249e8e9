//! Who a certificate says its holder is.
//!
//! A per-node certificate (`tessel certs issue`) carries its role and
//! name as a URI subject alternative name, `tessel://ROLE/NAME`, beside
//! the DNS name `tessel` every certificate of the cluster carries (chains
//! are verified against it) and, for coordinators, the host names and IPs
//! clients dial. The cluster-wide certificate of `tessel certs init` has no
//! such URI: its holder may act as any node (tests, local experiments).

use rustls::pki_types::CertificateDer;

/// The URI scheme of identities.
pub(super) const SCHEME: &str = "tessel://";

/// What a node is allowed to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A replica of the key-value service (and the scheduler beside it).
    Coordinator,
    /// A per-host agent: registers under its own name, runs job processes.
    Worker,
    /// A submitter or operator: jobs and reads, nothing of the registry.
    Client,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 3] = [Role::Coordinator, Role::Worker, Role::Client];

    /// Its name in a URI (`coordinator`, `worker`, `client`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Coordinator => "coordinator",
            Role::Worker => "worker",
            Role::Client => "client",
        }
    }

    /// The role named `s`.
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == s)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Who is on the other end of a connection (or holds a TLS folder).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// A per-node certificate.
    Node {
        /// What it may do.
        role: Role,
        /// Its node's name.
        name: String,
    },
    /// The cluster-wide certificate: any role.
    Shared,
    /// `--insecure`: no certificate at all.
    Anonymous,
}

impl Identity {
    /// A per-node identity.
    pub fn node(role: Role, name: &str) -> Identity {
        Identity::Node {
            role,
            name: name.to_owned(),
        }
    }

    /// Whether the holder may act as `role`.
    pub fn may_be(&self, role: Role) -> bool {
        match self {
            Identity::Node { role: r, .. } => *r == role,
            Identity::Shared | Identity::Anonymous => true,
        }
    }

    /// The name of a per-node certificate.
    pub fn name(&self) -> Option<&str> {
        match self {
            Identity::Node { name, .. } => Some(name),
            _ => None,
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identity::Node { role, name } => write!(f, "{role} `{name}`"),
            Identity::Shared => f.write_str("the cluster-wide certificate"),
            Identity::Anonymous => f.write_str("an unauthenticated peer (--insecure)"),
        }
    }
}

/// The identity a DER certificate carries; `Shared` when it names none,
/// `None` when it is not a certificate or names a malformed identity.
pub fn identity_of(cert: &CertificateDer<'_>) -> Option<Identity> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert).ok()?;
    let san = match x509.subject_alternative_name() {
        Ok(Some(san)) => san,
        Ok(None) => return Some(Identity::Shared),
        Err(_) => return None,
    };
    let mut found = None;
    for name in &san.value.general_names {
        if let x509_parser::extensions::GeneralName::URI(uri) = name {
            if let Some(rest) = uri.strip_prefix(SCHEME) {
                if found.is_some() {
                    return None; // two identities: refuse
                }
                let (role, name) = rest.split_once('/')?;
                let role = Role::parse(role)?;
                crate::check_name(name).ok()?;
                found = Some(Identity::Node {
                    role,
                    name: name.to_owned(),
                });
            }
        }
    }
    Some(found.unwrap_or(Identity::Shared))
}

/// The identity a connection's peer presented: `Anonymous` when it
/// presented no certificate (`--insecure`). The handshake already refused
/// a certificate whose identity is malformed; should one get here anyway,
/// it gets a client's rights.
pub fn peer_identity(conn: &quinn::Connection) -> Identity {
    let Some(chain) = conn
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
    else {
        return Identity::Anonymous;
    };
    chain
        .first()
        .and_then(identity_of)
        .unwrap_or(Identity::Node {
            role: Role::Client,
            name: String::new(),
        })
}
