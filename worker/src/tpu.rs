//! The environment libtpu reads to join a multi-host slice (and, across
//! slices, a multislice job), computed from where the job's processes run,
//! as JAX's cloud TPU cluster detection and GKE's TPU pods expect it:
//! `TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`, and with several slices
//! `MEGASCALE_COORDINATOR_ADDRESS`, `MEGASCALE_NUM_SLICES`,
//! `MEGASCALE_SLICE_ID`.
//!
//! Invariants:
//! 1. Processes are numbered slice-major, as JAX numbers them: slices in
//!    ascending order of their index, the processes of a slice in process
//!    order; a process's `TPU_WORKER_ID` is its rank within its slice.
//! 2. Every slice has as many processes as every other (libtpu's slices are
//!    alike), or the job is refused before any client exists.

use std::collections::BTreeMap;
use std::time::Duration;

use tessel_coordinator::keys;
use tessel_kv::{KvError, KvStore};

use crate::error::{Result, WorkerError};
use crate::process::kv_err;

/// Where one process of the job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpuHost {
    /// The host's name (what `TPU_WORKER_HOSTNAMES` lists).
    pub hostname: String,
    /// Its slice (`tessel worker --slice`; 0 without one).
    pub slice: u32,
}

/// The variables for process `me` of a job whose processes run on `hosts`
/// (in process order).
pub fn tpu_env(hosts: &[TpuHost], me: usize) -> std::result::Result<Vec<(String, String)>, String> {
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
        ("TPU_SKIP_MDS_QUERY".to_owned(), "true".to_owned()),
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
    match kv
        .insert(keys::process_host(job, me).as_bytes(), value.as_bytes())
        .await
    {
        Ok(_) | Err(KvError::AlreadyExists(_)) => {}
        Err(e) => return Err(kv_err("publishing this process's host")(e)),
    }
    let mut hosts = Vec::with_capacity(n as usize);
    for p in 0..n {
        let v = kv
            .get(keys::process_host(job, p).as_bytes(), timeout)
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
        let env = tpu_env(&hosts, 5).unwrap();
        assert_eq!(get(&env, "TPU_WORKER_HOSTNAMES"), Some("h1,h3,h5,h7"));
        assert_eq!(get(&env, "TPU_WORKER_ID"), Some("2"));
        assert_eq!(get(&env, "MEGASCALE_SLICE_ID"), Some("1"));
        assert_eq!(get(&env, "MEGASCALE_NUM_SLICES"), Some("2"));
        assert_eq!(get(&env, "MEGASCALE_COORDINATOR_ADDRESS"), Some("h0"));
        let env0 = tpu_env(&hosts, 0).unwrap();
        assert_eq!(get(&env0, "TPU_WORKER_HOSTNAMES"), Some("h0,h2,h4,h6"));
        assert_eq!(get(&env0, "TPU_WORKER_ID"), Some("0"));
        assert_eq!(get(&env0, "MEGASCALE_SLICE_ID"), Some("0"));
    }

    #[test]
    fn one_slice_needs_no_megascale_and_uneven_slices_are_refused() {
        let hosts = vec![host("a", 0), host("b", 0)];
        let env = tpu_env(&hosts, 1).unwrap();
        assert_eq!(get(&env, "TPU_WORKER_ID"), Some("1"));
        assert_eq!(get(&env, "MEGASCALE_NUM_SLICES"), None);
        let e = tpu_env(&[host("a", 0), host("b", 0), host("c", 1)], 0).unwrap_err();
        assert!(e.contains("as many"), "{e}");
    }
}
