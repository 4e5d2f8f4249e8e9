//! Who a process is, and who its peers are, from its flags or its
//! environment, so that one command line serves every host of a cluster.
//! The rules are pure (the environment is a function passed in); the
//! `tessel` command applies them and `--print-identity` shows the result.
//!
//! An index, in this order:
//! 1. explicit flags (`--id`, `--worker-id`);
//! 2. Kubernetes: an Indexed Job's `JOB_COMPLETION_INDEX` (JobSet pods
//!    too), else a StatefulSet's ordinal, the number ending `HOSTNAME`
//!    (`tessel-coordinator-2`), when `KUBERNETES_SERVICE_HOST` is set;
//! 3. Slurm: `SLURM_PROCID` (with `SLURM_JOB_ID`);
//! 4. for a worker id, the name its certificate gives, else the hostname.
//!
//! A coordinator's replica id is the index + 1 (ids start at 1). Its peers
//! ([`env_peers`]) follow the same order: the pods `HOSTNAME`'s prefix
//! names, `TESSEL_REPLICAS` of them under `TESSEL_PEER_DOMAIN`; else the
//! nodes of the Slurm job step, one replica per node.

pub mod hostlist;

use std::collections::BTreeMap;

/// Reads one environment variable.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Why no identity or no peers could be derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// A variable that should hold a number does not.
    #[error("{name}={value:?} is not a number")]
    NotANumber {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
    },
    /// Neither a flag nor the environment gives an index.
    #[error("no --id, and no JOB_COMPLETION_INDEX, StatefulSet hostname or SLURM_PROCID to derive one from")]
    NoIndex,
    /// A Slurm hostlist that does not parse.
    #[error("hostlist `{list}`: {why}")]
    Hostlist {
        /// The list (its first 200 characters).
        list: String,
        /// What is wrong, and where.
        why: String,
    },
    /// The environment does not say who the peers are.
    #[error("peers from the environment: {0}")]
    Peers(String),
}

/// An index derived from the environment, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Index {
    /// The index, from 0.
    pub index: u64,
    /// The variable it came from, in words.
    pub source: &'static str,
}

fn number(env: Env<'_>, name: &str) -> Result<Option<u64>, IdentityError> {
    env(name)
        .map(|v| {
            v.trim().parse().map_err(|_| IdentityError::NotANumber {
                name: name.into(),
                value: v,
            })
        })
        .transpose()
}

/// Slurm's rank variable, and the source of an index read from it.
const SLURM_PROCID: &str = "SLURM_PROCID";

/// The process's index among its peers by rule 2 or 3, if any applies.
pub fn env_index(env: Env<'_>) -> Result<Option<Index>, IdentityError> {
    if let Some(index) = number(env, "JOB_COMPLETION_INDEX")? {
        let source = "JOB_COMPLETION_INDEX (a Kubernetes Indexed Job)";
        return Ok(Some(Index { index, source }));
    }
    if env("KUBERNETES_SERVICE_HOST").is_some() {
        if let Some(index) = env("HOSTNAME").and_then(|h| ordinal(&h).map(|(_, n)| n)) {
            let source = "the StatefulSet ordinal in HOSTNAME";
            return Ok(Some(Index { index, source }));
        }
    }
    if env("SLURM_JOB_ID").is_some() {
        if let Some(index) = number(env, SLURM_PROCID)? {
            return Ok(Some(Index {
                index,
                source: SLURM_PROCID,
            }));
        }
    }
    Ok(None)
}

/// `tessel-coordinator-2` → (`tessel-coordinator`, 2).
fn ordinal(host: &str) -> Option<(&str, u64)> {
    let (base, n) = host.rsplit_once('-')?;
    Some((base, n.parse().ok()?)).filter(|_| !base.is_empty())
}

/// A coordinator's replica id: `--id`, else the environment's index + 1.
pub fn replica_id(flag: Option<u64>, env: Env<'_>) -> Result<(u64, String), IdentityError> {
    if let Some(id) = flag {
        return Ok((id, "--id".into()));
    }
    match env_index(env)? {
        Some(i) => Ok((i.index + 1, format!("{} + 1", i.source))),
        None => Err(IdentityError::NoIndex),
    }
}

/// The replicas' ids and `HOST:PORT`s, this one's included, and where they
/// came from; `port` is the port every replica listens on.
pub fn env_peers(
    env: Env<'_>,
    port: u16,
) -> Result<(BTreeMap<u64, String>, String), IdentityError> {
    let fail = |why: String| Err(IdentityError::Peers(why));
    let Some(index) = env_index(env)? else {
        return fail("neither Kubernetes (JOB_COMPLETION_INDEX or a StatefulSet's HOSTNAME) nor Slurm (SLURM_JOB_ID, SLURM_PROCID) is in the environment; give --peers".into());
    };
    let domain = env("TESSEL_PEER_DOMAIN").map(|d| d.trim_matches('.').to_owned());
    let host = |name: &str| match &domain {
        Some(d) => format!("{name}.{d}:{port}"),
        None => format!("{name}:{port}"),
    };
    let ids = |names: &[String]| -> BTreeMap<u64, String> {
        (1..).zip(names.iter().map(|n| host(n))).collect()
    };
    if index.source != SLURM_PROCID {
        // Kubernetes: pods named `<set>-<index>` (a StatefulSet's, and an
        // Indexed Job's hostnames alike), reached through the headless
        // Service that `TESSEL_PEER_DOMAIN` names.
        let Some(hostname) = env("HOSTNAME") else {
            return fail("HOSTNAME is not set".into());
        };
        let base = match ordinal(&hostname) {
            Some((base, n)) if n == index.index => base,
            _ => {
                return fail(format!(
                    "HOSTNAME `{hostname}` does not end with -{}",
                    index.index
                ))
            }
        };
        let Some(n) = number(env, "TESSEL_REPLICAS")? else {
            return fail(
                "set TESSEL_REPLICAS to the number of replicas (the StatefulSet's replicas)".into(),
            );
        };
        if domain.is_none() {
            return fail(
                "set TESSEL_PEER_DOMAIN to the headless Service's domain (`SERVICE.NAMESPACE.svc`)"
                    .into(),
            );
        }
        if index.index >= n || n > 1024 {
            return fail(format!(
                "index {} is not below TESSEL_REPLICAS={n} (at most 1024)",
                index.index
            ));
        }
        let names: Vec<String> = (0..n).map(|i| format!("{base}-{i}")).collect();
        let source = format!("{base}-0…{} from HOSTNAME and TESSEL_REPLICAS", n - 1);
        return Ok((ids(&names), source));
    }
    // Slurm: the job step's nodes in order, one replica per node; task i
    // runs on node i (`srun --ntasks-per-node=1`, block distribution).
    let Some((var, list)) = [
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ]
    .into_iter()
    .find_map(|v| env(v).map(|l| (v, l))) else {
        return fail("SLURM_STEP_NODELIST, SLURM_JOB_NODELIST and SLURM_NODELIST are unset".into());
    };
    let nodes = hostlist::expand(&list)?;
    if let Some(per_node) = env("SLURM_STEP_TASKS_PER_NODE").or_else(|| env("SLURM_TASKS_PER_NODE"))
    {
        if !one_task_per_node(&per_node) {
            return fail(format!("tasks per node `{per_node}`: run one coordinator per node (srun --ntasks-per-node=1)"));
        }
    }
    let Some(own) = nodes.get(index.index as usize) else {
        return fail(format!(
            "SLURM_PROCID={} but {var} has {} nodes",
            index.index,
            nodes.len()
        ));
    };
    if let Some(here) = env("SLURMD_NODENAME") {
        if &here != own {
            return fail(format!("task {} runs on {here}, not on node {} of {var} ({own}): run one task per node (srun --ntasks-per-node=1)", index.index, index.index));
        }
    }
    Ok((ids(&nodes), format!("{var}={list}")))
}

/// `SLURM_TASKS_PER_NODE`: `1(x3)`, `2,1(x2)`: whether every count is 1.
fn one_task_per_node(spec: &str) -> bool {
    spec.split(',')
        .all(|part| part.split('(').next().is_some_and(|n| n.trim() == "1"))
}

/// The process's environment (an empty variable counts as unset).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests;
