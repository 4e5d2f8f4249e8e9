//! A TLS folder that follows its files: cert-manager (or an operator)
//! renews `node.pem`/`node.key`/`ca.pem` in place, and every listener and
//! dialer built from the folder presents, and trusts, what is on disk now.
//!
//! Invariants:
//! 1. Handshakes read the current certificate, key and CA bundle
//!    ([`Current`]); a connection already up keeps its session.
//! 2. A change is adopted only once the whole folder parses (`files`
//!    invariants 1-2: key matching certificate, inside its validity);
//!    until then the previous one keeps serving, and the failure is
//!    logged once per content.
//! 3. A renewal never changes who a process is: a new certificate naming
//!    another identity is refused.
//! 4. The watcher holds the folder weakly: it ends when the last handle
//!    is dropped.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use rustls::client::ResolvesClientCert;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::SignatureScheme;

use super::files::{read_source, show_time, Loaded};
use super::TlsError;

/// How often the files are looked at: a renewal is picked up within this.
pub const RELOAD_POLL: Duration = Duration::from_secs(1);

/// The folder and what was last loaded from it.
pub(super) struct Current {
    dir: PathBuf,
    ca: Option<PathBuf>,
    loaded: RwLock<Arc<Loaded>>,
}

impl std::fmt::Debug for Current {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = self.get();
        f.debug_struct("TlsFiles")
            .field("dir", &self.dir)
            .field("identity", &l.identity)
            .field("not_after", &show_time(l.not_after))
            .field("ca_certificates", &l.ca.len())
            .finish_non_exhaustive()
    }
}

impl Current {
    /// Loads `dir` and starts watching it.
    pub(super) fn open(dir: &Path, ca: Option<&Path>) -> Result<Arc<Current>, TlsError> {
        let loaded = Loaded::parse(dir, ca, read_source(dir, ca)?)?;
        let current = Arc::new(Current {
            dir: dir.to_path_buf(),
            ca: ca.map(Path::to_path_buf),
            loaded: RwLock::new(Arc::new(loaded)),
        });
        let weak = Arc::downgrade(&current);
        std::thread::Builder::new()
            .name("tls-reload".into())
            .spawn(move || watch(weak))
            .map_err(|e| TlsError::Config(format!("starting the TLS file watcher: {e}")))?;
        Ok(current)
    }

    /// What handshakes use now (invariant 1).
    pub(super) fn get(&self) -> Arc<Loaded> {
        self.loaded.read().expect("not poisoned").clone()
    }

    /// Looks at the files once; `Ok(true)` when a change was adopted.
    pub(super) fn reload(&self) -> Result<bool, TlsError> {
        let source = read_source(&self.dir, self.ca.as_deref())?;
        let old = self.get();
        if source.iter().map(Vec::len).sum::<usize>() == old.source.len()
            && source.concat() == old.source
        {
            return Ok(false);
        }
        let new = Loaded::parse(&self.dir, self.ca.as_deref(), source)?;
        if new.identity != old.identity {
            // Invariant 3.
            return Err(TlsError::Config(format!(
                "{}: the renewed certificate is {}, this process is {}; keeping the old one",
                self.dir.display(),
                new.identity,
                old.identity
            )));
        }
        tracing::info!(
            dir = %self.dir.display(),
            identity = %new.identity,
            not_after = %show_time(new.not_after),
            new_key = new.key.secret_der() != old.key.secret_der(),
            "reloaded the TLS certificate"
        );
        *self.loaded.write().expect("not poisoned") = Arc::new(new);
        Ok(true)
    }
}

/// Invariants 2 and 4. Each poll also publishes the metrics operators
/// alert on (set every time: the recorder may be installed after the load):
/// `tessel_tls_certificate_expiry_seconds{identity}` (Unix time) and
/// `tessel_tls_reloads_total{identity, result="adopted"|"refused"}`.
fn watch(current: Weak<Current>) {
    let mut last_error = String::new();
    loop {
        std::thread::sleep(RELOAD_POLL);
        let Some(current) = current.upgrade() else {
            return;
        };
        let identity = current.get().identity.to_string();
        let result = current.reload();
        metrics::gauge!("tessel_tls_certificate_expiry_seconds", "identity" => identity.clone())
            .set(current.get().not_after as f64);
        match result {
            Ok(adopted) => {
                if adopted {
                    metrics::counter!("tessel_tls_reloads_total", "identity" => identity, "result" => "adopted").increment(1);
                }
                last_error.clear()
            }
            Err(e) => {
                let e = e.to_string();
                if e != last_error {
                    metrics::counter!("tessel_tls_reloads_total", "identity" => identity, "result" => "refused").increment(1);
                    tracing::warn!(dir = %current.dir.display(), "TLS files changed but were not adopted, still serving the previous ones: {e}");
                    last_error = e;
                }
            }
        }
    }
}

/// Hands every handshake the current certificate (invariant 1).
#[derive(Debug)]
pub(super) struct Resolver(pub(super) Arc<Current>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get().certified.clone())
    }
}

impl ResolvesClientCert for Resolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get().certified.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}
