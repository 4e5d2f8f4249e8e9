//! Where the cluster is, from the environment. A command takes each
//! setting from its flag, else from the environment, else from the current
//! context (`tessel context`). The worker exports `TESSEL_COORDINATORS`
//! and `TESSEL_TLS_DIR` to every job process, so `tessel` run inside a job
//! reaches the job's cluster with nothing else set.
//!
//! | variable | stands for |
//! |---|---|
//! | `TESSEL_COORDINATOR` (or `TESSEL_COORDINATORS`) | `--coordinator` |
//! | `TESSEL_KV` | `--kv etcd://…` |
//! | `TESSEL_TLS_DIR`, `TESSEL_TLS_CA` | `--tls-dir`, `--tls-ca` |
//! | `TESSEL_INSECURE=1` | `--insecure` |
//!
//! Empty variables count as unset; contradictory ones are refused, naming
//! both.

use std::path::PathBuf;

/// What the environment says (nothing, when it says nothing).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct EnvTarget {
    pub(crate) coordinator: Option<String>,
    pub(crate) kv: Option<String>,
    pub(crate) tls_dir: Option<PathBuf>,
    pub(crate) tls_ca: Option<PathBuf>,
    pub(crate) insecure: bool,
}

impl EnvTarget {
    /// This process's environment.
    pub(crate) fn read() -> anyhow::Result<EnvTarget> {
        EnvTarget::from_env(&|k| std::env::var(k).ok()).map_err(anyhow::Error::msg)
    }

    /// The rules, over any environment.
    pub(crate) fn from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<EnvTarget, String> {
        let var = |k: &str| {
            get(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let coordinator = var("TESSEL_COORDINATOR").or_else(|| var("TESSEL_COORDINATORS"));
        let kv = var("TESSEL_KV");
        if coordinator.is_some() && kv.is_some() {
            return Err("both TESSEL_COORDINATOR and TESSEL_KV are set: unset one".into());
        }
        let insecure = match var("TESSEL_INSECURE").as_deref() {
            None | Some("0") | Some("false") => false,
            Some("1") | Some("true") => true,
            Some(other) => return Err(format!("TESSEL_INSECURE={other:?}: give 1 or 0")),
        };
        let tls_dir = var("TESSEL_TLS_DIR").map(PathBuf::from);
        if insecure && tls_dir.is_some() {
            return Err("both TESSEL_TLS_DIR and TESSEL_INSECURE=1 are set: unset one".into());
        }
        let tls_ca = var("TESSEL_TLS_CA").map(PathBuf::from);
        if tls_ca.is_some() && tls_dir.is_none() {
            return Err("TESSEL_TLS_CA is set without TESSEL_TLS_DIR".into());
        }
        Ok(EnvTarget {
            coordinator,
            kv,
            tls_dir,
            tls_ca,
            insecure,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Result<EnvTarget, String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EnvTarget::from_env(&move |k| pairs.iter().find(|p| p.0 == k).map(|p| p.1.clone()))
    }

    #[test]
    fn the_environment_names_the_cluster_or_refuses_contradictions() {
        assert_eq!(env(&[]).unwrap(), EnvTarget::default());
        let e = env(&[("TESSEL_COORDINATORS", "a:1,b:1"), ("TESSEL_TLS_DIR", "/t")]).unwrap();
        assert_eq!(e.coordinator.as_deref(), Some("a:1,b:1"));
        assert_eq!(e.tls_dir, Some(PathBuf::from("/t")));
        let both = [
            ("TESSEL_COORDINATOR", "a:1"),
            ("TESSEL_COORDINATORS", "b:1"),
        ];
        assert_eq!(env(&both).unwrap().coordinator.as_deref(), Some("a:1"));
        assert!(
            env(&[("TESSEL_COORDINATOR", " "), ("TESSEL_INSECURE", "0")])
                .unwrap()
                .coordinator
                .is_none()
        );
        for bad in [
            &[("TESSEL_COORDINATOR", "a:1"), ("TESSEL_KV", "etcd://e:1")][..],
            &[("TESSEL_INSECURE", "yes")],
            &[("TESSEL_INSECURE", "1"), ("TESSEL_TLS_DIR", "/t")],
            &[("TESSEL_TLS_CA", "/ca.pem")],
        ] {
            let e = env(bad).unwrap_err();
            assert!(e.contains("TESSEL_"), "{e}");
        }
    }
}
