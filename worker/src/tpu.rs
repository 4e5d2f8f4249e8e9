//! The environment libtpu reads to join a multi-host slice (and, across
//! slices, a multislice job): `TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`, and
//! with several slices `MEGASCALE_COORDINATOR_ADDRESS`,
//! `MEGASCALE_NUM_SLICES`, `MEGASCALE_SLICE_ID`. This module is the one
//! place tessel decides them.
//!
//! Where the platform set them in the worker's environment (GKE's TPU
//! webhook, JobSet, a user's pod spec), they describe the physical slice
//! and are kept: the job must then match them (its processes of a slice in
//! the platform's worker order). Otherwise they are built from the names
//! the job's hosts advertise (`tessel worker --host-name`: in a pod
//! `HOST.SUBDOMAIN`, since the short pod name does not resolve).
//!
//! Invariants:
//! 1. Processes are numbered slice-major, as JAX numbers them: slices in
//!    ascending order of their index, the processes of a slice in process
//!    order; a process's `TPU_WORKER_ID` is its rank within its slice.
//! 2. Every slice has as many processes as every other (libtpu's slices are
//!    alike), or the job is refused before any client exists.
//! 3. A variable the platform set is never overwritten; one that
//!    contradicts the job's placement refuses the job, naming both.

use std::collections::BTreeMap;
use std::time::Duration;

use tessel_coordinator::attempt::Record;
use tessel_coordinator::{Item, Records};
use tessel_kv::KvStore;

use crate::error::kv_err;
use crate::error::{Result, WorkerError};

/// The variables this module decides.
pub const TPU_VARS: &[&str] = &[
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "MEGASCALE_COORDINATOR_ADDRESS",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
];

/// Those of [`TPU_VARS`] that `lookup` (the worker's environment as it
/// started, before any job set one) has: what the platform set.
pub fn platform_env(lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    TPU_VARS
        .iter()
        .filter_map(|k| {
            lookup(k)
                .filter(|v| !v.is_empty())
                .map(|v| ((*k).to_owned(), v))
        })
        .collect()
}

/// Where one process of the job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpuHost {
    /// The name other hosts reach it by (what `TPU_WORKER_HOSTNAMES`
    /// lists when the platform gave no list).
    pub hostname: String,
    /// Its slice (`tessel worker --slice`; 0 without one).
    pub slice: u32,
}

/// The variables to set for process `me` of a job whose processes run on
/// `hosts` (in process order), given what the platform set (`platform`,
/// from [`platform_env`]): every variable the platform left unset.
pub fn tpu_env(
    hosts: &[TpuHost],
    me: usize,
    platform: &[(String, String)],
) -> std::result::Result<Vec<(String, String)>, String> {
    let mut slices: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (p, h) in hosts.iter().enumerate() {
        slices.entry(h.slice).or_default().push(p);
    }
    let per_slice = slices.values().next().map_or(0, Vec::len);
    if let Some((s, ps)) = slices.iter().find(|(_, ps)| ps.len() != per_slice) {
        return Err(format!(
            "slice {s} has {} processes, another {per_slice}: every slice of a TPU job needs as many",
            ps.len()
        ));
    }
    let mine = hosts.get(me).ok_or_else(|| format!("no process {me}"))?;
    let slice_id = slices
        .keys()
        .position(|&s| s == mine.slice)
        .expect("listed");
    let members = &slices[&mine.slice];
    let worker_id = members.iter().position(|&p| p == me).expect("listed");
    let names: Vec<&str> = members
        .iter()
        .map(|&p| hosts[p].hostname.as_str())
        .collect();
    let mut env = vec![
        ("TPU_WORKER_ID".to_owned(), worker_id.to_string()),
        ("TPU_WORKER_HOSTNAMES".to_owned(), names.join(",")),
    ];
    if slices.len() > 1 {
        let first = slices.values().next().expect("one")[0];
        env.extend([
            (
                "MEGASCALE_COORDINATOR_ADDRESS".to_owned(),
                hosts[first].hostname.clone(),
            ),
            ("MEGASCALE_NUM_SLICES".to_owned(), slices.len().to_string()),
            ("MEGASCALE_SLICE_ID".to_owned(), slice_id.to_string()),
        ]);
    }
    // Invariant 3: the platform's values stand; they must agree with the
    // placement where the placement decides (rank, slice count, hosts).
    let set = |k: &str| {
        platform
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    if let Some(id) = set("TPU_WORKER_ID") {
        if id.trim() != worker_id.to_string() {
            return Err(format!(
                "this host is TPU worker {id} (TPU_WORKER_ID, set by the platform) but runs the job's \
                 process {me}, rank {worker_id} of its slice: place the job's processes in the slice's worker order"
            ));
        }
    }
    if let Some(list) = set("TPU_WORKER_HOSTNAMES") {
        let n = list.split(',').filter(|h| !h.trim().is_empty()).count();
        if n != per_slice {
            return Err(format!(
                "the platform's slice has {n} hosts (TPU_WORKER_HOSTNAMES) but the job runs {per_slice} \
                 processes in it: a TPU job takes whole slices"
            ));
        }
    }
    if let Some(n) = set("MEGASCALE_NUM_SLICES") {
        if n.trim() != slices.len().to_string() {
            return Err(format!(
                "the platform says {n} slices (MEGASCALE_NUM_SLICES) but the job runs in {}",
                slices.len()
            ));
        }
    }
    env.retain(|(k, _)| set(k).is_none());
    Ok(env)
}

/// Publishes this process's host and slice under the job and reads every
/// other process's, within `timeout`.
pub(crate) async fn exchange_hosts(
    kv: &dyn KvStore,
    job: &str,
    me: u32,
    n: u32,
    mine: &TpuHost,
    timeout: Duration,
) -> Result<Vec<TpuHost>> {
    let value = format!("{} {}", mine.slice, mine.hostname);
    Records::new(kv, job)
        .first(Item::Process(me, Record::Host), value.as_bytes())
        .await
        .map_err(kv_err("publishing this process's host"))?;
    let mut hosts = Vec::with_capacity(n as usize);
    for p in 0..n {
        let v = Records::new(kv, job)
            .wait(Item::Process(p, Record::Host), timeout)
            .await
            .map_err(kv_err("reading the job's hosts"))?;
        let text = String::from_utf8_lossy(&v);
        let (slice, hostname) = text
            .split_once(' ')
            .and_then(|(s, h)| Some((s.parse().ok()?, h.to_owned())))
            .ok_or_else(|| WorkerError::Internal(format!("process {p}'s host record `{text}`")))?;
        hosts.push(TpuHost { hostname, slice });
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, slice: u32) -> TpuHost {
        TpuHost {
            hostname: name.to_owned(),
            slice,
        }
    }

    fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn two_slices_of_four_hosts_get_their_ranks_and_the_megascale_coordinator() {
        // Processes listed out of slice order: slice 7 is the second slice.
        let hosts: Vec<TpuHost> = (0..8)
            .map(|p| host(&format!("h{p}"), if p % 2 == 0 { 3 } else { 7 }))
            .collect();
        let env = tpu_env(&hosts, 5, &[]).unwrap();
        assert_eq!(get(&env, "TPU_WORKER_HOSTNAMES"), Some("h1,h3,h5,h7"));
        assert_eq!(get(&env, "TPU_WORKER_ID"), Some("2"));
        assert_eq!(get(&env, "MEGASCALE_SLICE_ID"), Some("1"));
        assert_eq!(get(&env, "MEGASCALE_NUM_SLICES"), Some("2"));
        assert_eq!(get(&env, "MEGASCALE_COORDINATOR_ADDRESS"), Some("h0"));
        let env0 = tpu_env(&hosts, 0, &[]).unwrap();
        assert_eq!(get(&env0, "TPU_WORKER_HOSTNAMES"), Some("h0,h2,h4,h6"));
        assert_eq!(get(&env0, "TPU_WORKER_ID"), Some("0"));
        assert_eq!(get(&env0, "MEGASCALE_SLICE_ID"), Some("0"));
    }

    #[test]
    fn one_slice_needs_no_megascale_and_uneven_slices_are_refused() {
        let hosts = vec![host("a", 0), host("b", 0)];
        let env = tpu_env(&hosts, 1, &[]).unwrap();
        assert_eq!(get(&env, "TPU_WORKER_ID"), Some("1"));
        assert_eq!(get(&env, "MEGASCALE_NUM_SLICES"), None);
        let e = tpu_env(&[host("a", 0), host("b", 0), host("c", 1)], 0, &[]).unwrap_err();
        assert!(e.contains("as many"), "{e}");
    }

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn what_the_platform_set_is_kept_and_only_the_rest_is_built() {
        let hosts = vec![host("w-0.hosts.ml.svc", 0), host("w-1.hosts.ml.svc", 0)];
        let platform = vars(&[
            ("TPU_WORKER_ID", "1"),
            ("TPU_WORKER_HOSTNAMES", "10.0.0.5,10.0.0.6"),
        ]);
        assert!(tpu_env(&hosts, 1, &platform).unwrap().is_empty());
        // Nothing set: built from the advertised, resolvable names.
        let env = tpu_env(&hosts, 1, &[]).unwrap();
        assert_eq!(
            get(&env, "TPU_WORKER_HOSTNAMES"),
            Some("w-0.hosts.ml.svc,w-1.hosts.ml.svc")
        );
        // Only the hosts set: the worker id is still built.
        let env = tpu_env(&hosts, 0, &platform[1..]).unwrap();
        assert_eq!(env, vars(&[("TPU_WORKER_ID", "0")]));
    }

    #[test]
    fn a_placement_that_contradicts_the_platform_is_refused_naming_both() {
        let hosts = vec![host("a", 0), host("b", 0)];
        let e = tpu_env(&hosts, 0, &vars(&[("TPU_WORKER_ID", "1")])).unwrap_err();
        assert!(e.contains("TPU worker 1") && e.contains("rank 0"), "{e}");
        let e = tpu_env(&hosts, 0, &vars(&[("TPU_WORKER_HOSTNAMES", "a,b,c,d")])).unwrap_err();
        assert!(e.contains("4 hosts") && e.contains("2"), "{e}");
        let e = tpu_env(&hosts, 0, &vars(&[("MEGASCALE_NUM_SLICES", "2")])).unwrap_err();
        assert!(e.contains("2 slices"), "{e}");
        assert_eq!(
            platform_env(|k| (k == "TPU_WORKER_ID").then(|| "3".to_owned())),
            vars(&[("TPU_WORKER_ID", "3")])
        );
    }
}
