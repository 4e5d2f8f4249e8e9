//! Who this process is, from its flags or its environment, so that one
//! command line serves every host of a cluster. In this order:
//!
//! 1. explicit flags (`--id`, `--worker-id`);
//! 2. Kubernetes: an Indexed Job's `JOB_COMPLETION_INDEX` (JobSet pods
//!    too), else a StatefulSet's ordinal, the number ending `HOSTNAME`
//!    (`tessel-coordinator-2`), when `KUBERNETES_SERVICE_HOST` is set;
//! 3. Slurm: `SLURM_PROCID` (with `SLURM_JOB_ID`);
//! 4. for a worker id, the name its certificate gives, else the hostname.
//!
//! A coordinator's replica id is the index + 1 (ids start at 1).
//! `--print-identity` shows what was derived, and from where.

/// Reads one environment variable.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// An index derived from the environment, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Index {
    pub index: u64,
    pub source: &'static str,
}

/// The process's index among its peers by rule 2 or 3, if any applies.
pub(crate) fn env_index(env: Env<'_>) -> Result<Option<Index>, String> {
    let num = |name: &str, source: &'static str| -> Result<Option<Index>, String> {
        match env(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(|index| Some(Index { index, source }))
                .map_err(|_| format!("{name}={v:?} is not a number")),
        }
    };
    if let Some(i) = num(
        "JOB_COMPLETION_INDEX",
        "JOB_COMPLETION_INDEX (a Kubernetes Indexed Job)",
    )? {
        return Ok(Some(i));
    }
    if env("KUBERNETES_SERVICE_HOST").is_some() {
        if let Some(host) = env("HOSTNAME") {
            if let Some((_, n)) = host.rsplit_once('-') {
                if let Ok(index) = n.parse() {
                    return Ok(Some(Index {
                        index,
                        source: "the StatefulSet ordinal in HOSTNAME",
                    }));
                }
            }
        }
    }
    if env("SLURM_JOB_ID").is_some() {
        return num("SLURM_PROCID", "SLURM_PROCID");
    }
    Ok(None)
}

/// A coordinator's replica id: `--id`, else the environment's index + 1.
pub(crate) fn replica_id(flag: Option<u64>, env: Env<'_>) -> Result<(u64, String), String> {
    if let Some(id) = flag {
        return Ok((id, "--id".into()));
    }
    match env_index(env)? {
        Some(i) => Ok((i.index + 1, format!("{} + 1", i.source))),
        None => Err("no --id, and no JOB_COMPLETION_INDEX, StatefulSet hostname or SLURM_PROCID to derive one from".into()),
    }
}

/// The process's environment.
pub(crate) fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn flags_then_kubernetes_then_slurm() {
        let k8s_sts = env(&[
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("HOSTNAME", "tessel-coordinator-2"),
        ]);
        assert_eq!(replica_id(Some(7), &k8s_sts).unwrap().0, 7);
        assert_eq!(replica_id(None, &k8s_sts).unwrap().0, 3);
        let indexed = env(&[
            ("JOB_COMPLETION_INDEX", "4"),
            ("KUBERNETES_SERVICE_HOST", "x"),
            ("HOSTNAME", "w-9"),
        ]);
        assert_eq!(env_index(&indexed).unwrap().unwrap().index, 4);
        let slurm = env(&[
            ("SLURM_JOB_ID", "77"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NODELIST", "n[1-3]"),
        ]);
        assert_eq!(
            replica_id(None, &slurm).unwrap(),
            (2, "SLURM_PROCID + 1".into())
        );
        // A hostname ordinal counts only inside Kubernetes.
        assert_eq!(env_index(&env(&[("HOSTNAME", "box-3")])).unwrap(), None);
        assert!(replica_id(None, &env(&[])).unwrap_err().contains("no --id"));
        assert!(env_index(&env(&[("JOB_COMPLETION_INDEX", "x")]))
            .unwrap_err()
            .contains("not a number"));
    }
}
