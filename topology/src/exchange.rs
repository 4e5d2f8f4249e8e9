//! The topology exchange over the key-value service, with the semantics of
//! XLA's `ExchangeTopologies`: each process inserts its local topology, one
//! builder (process 0) assembles the global one, everyone else waits for it.
//!
//! Invariants:
//! 1. A process's local topology is inserted once. Re-inserting the same
//!    bytes (a restart) is accepted; different bytes under the same index
//!    (a duplicate index, or a restart on other hardware) is an error.
//! 2. The builder publishes exactly one [`Published`] value, the topology or
//!    the reason it could not build one, so no process waits past its
//!    timeout for a builder that already failed.
//! 3. KV operations are linear in the number of processes: each process
//!    makes one insert and one blocking get; the builder one listing and,
//!    unless every process is in it, one watch from the listing's revision,
//!    which delivers the processes that arrive after it.
//! 4. Every process returns the bytes the builder published, so all hold
//!    the same topology.
//! 5. The published value is compressed, in columns that compress
//!    (`wire`): N processes each read it, so N times its size crosses the
//!    network and the replicas' memory. It holds what every process needs
//!    (machines, slices, devices) and nothing that tells one process from
//!    another: a regular cluster's value does not grow with its processes,
//!    so the N reads cost O(N) bytes, not O(N²). (With each process's
//!    endpoint, worker and host name in it, 16,384 hosts read 1 GB:
//!    docs/performance.md.)
//! 6. A peer's name and address (its worker, host, transfer endpoint and
//!    boot id: the job's directory, `types` invariant 7) are read from its
//!    local topology, by the processes that need that peer ([`peer`]), or
//!    all at once by one reader ([`directory`]). Local topologies are
//!    written once (invariant 1) and the global one is built from them, so
//!    what a reader finds is what the builder read. A process needs the
//!    peers it talks to (a ring: two), so the directory costs O(N) reads
//!    in all.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tessel_kv::{Event, KvError, KvStore};
use tokio::time::Instant;

use crate::error::{Result, TopologyError};
use crate::keys;
use crate::shared::{Known, TopologyCache};
use crate::types::{GlobalTopology, LocalTopology};
use crate::wire::{Columns, Stored};

/// The first byte of a compressed [`Published`]: zstd of its stored form
/// (`wire::Stored`). (An uncompressed one starts with its variant, 0 or
/// 1, and is still read, so readers of an older builder's value
/// understand it.)
const COMPRESSED: u8 = 2;

/// The most a published value may decompress to: a cap on what a value
/// from the network can make a reader allocate (a global topology of the
/// most processes with eight devices each is about 12 MiB).
const MAX_DECOMPRESSED: usize = 64 << 20;

/// What the builder publishes (invariant 5; stored as `wire::Stored`).
#[derive(Debug, Clone, PartialEq)]
pub enum Published {
    /// The global topology.
    Topology(GlobalTopology),
    /// Why the builder could not build it.
    Failed(String),
}

impl Published {
    /// Decodes and validates.
    pub fn decode(bytes: &[u8]) -> Result<Published> {
        let bad = |reason: String| TopologyError::Decode {
            what: "a published topology".into(),
            reason,
        };
        let plain;
        let bytes = match bytes.split_first() {
            Some((&COMPRESSED, rest)) => {
                plain = zstd::bulk::decompress(rest, MAX_DECOMPRESSED)
                    .map_err(|e| bad(format!("decompressing: {e}")))?;
                &plain[..]
            }
            _ => bytes,
        };
        let stored: Stored = postcard::from_bytes(bytes).map_err(|e| bad(e.to_string()))?;
        // Each form validates what it rebuilds (`wire` invariant 3).
        Ok(match stored {
            Stored::Legacy(t) => Published::Topology(t.decode()?),
            Stored::Failed(reason) => Published::Failed(reason),
            Stored::Compact(t) => Published::Topology(t.decode()?),
            Stored::Columns(t) => Published::Topology(t.decode()?),
        })
    }

    fn encode(&self) -> Vec<u8> {
        let stored = match self {
            Published::Topology(t) => Stored::Columns(Columns::encode(t)),
            Published::Failed(reason) => Stored::Failed(reason.clone()),
        };
        let plain = postcard::to_allocvec(&stored).expect("always encodes");
        let mut out = vec![COMPRESSED];
        out.extend(zstd::bulk::compress(&plain, ZSTD_LEVEL).expect("compressing into memory"));
        out
    }
}

/// zstd's default level (3.9x smaller for 4,096 simulated hosts,
/// docs/performance.md); built once, read by every process.
const ZSTD_LEVEL: i32 = 3;

/// Exchanges `local` with the other processes of `job` and returns the
/// global topology, or fails within `timeout` naming what went wrong.
pub async fn exchange(
    kv: &dyn KvStore,
    job: &str,
    local: &LocalTopology,
    timeout: Duration,
) -> Result<GlobalTopology> {
    let known = exchange_in(kv, job, local, timeout, None).await?;
    // Not shared without a cache: this is the only reference.
    Ok(match Arc::try_unwrap(known) {
        Ok(k) => k.into_topology(),
        Err(shared) => shared.topology().clone(),
    })
}

/// [`exchange`], decoding the published value once for all of this
/// process's callers that share `cache` (every KV operation is still each
/// caller's own).
pub async fn exchange_shared(
    kv: &dyn KvStore,
    job: &str,
    local: &LocalTopology,
    timeout: Duration,
    cache: &TopologyCache,
) -> Result<Arc<Known>> {
    exchange_in(kv, job, local, timeout, Some(cache)).await
}

async fn exchange_in(
    kv: &dyn KvStore,
    job: &str,
    local: &LocalTopology,
    timeout: Duration,
    cache: Option<&TopologyCache>,
) -> Result<Arc<Known>> {
    keys::check_component("job id", job)?;
    local.validate()?;
    let deadline = Instant::now() + timeout;
    publish_local(kv, job, local).await?;
    let known = if local.process_index == 0 {
        build_and_publish(kv, job, local.num_processes, deadline, timeout, cache).await?
    } else {
        wait_for_global(kv, job, local.num_processes, deadline, timeout, cache).await?
    };
    let topology = known.topology();
    if topology.num_processes() != local.num_processes {
        return Err(TopologyError::WrongProcessCount {
            index: local.process_index,
            declared: local.num_processes,
            num_processes: topology.num_processes(),
        });
    }
    Ok(known)
}

/// Job `job`'s published value, decoded (once per `cache` where one is
/// given).
fn open(job: &str, bytes: &[u8], cache: Option<&TopologyCache>) -> Result<Arc<Known>> {
    let decode = |b: &[u8]| match Published::decode(b)? {
        Published::Topology(t) => Ok(t),
        Published::Failed(reason) => Err(TopologyError::BuilderFailed(reason)),
    };
    match cache {
        Some(c) => c.decoded(job, bytes, decode),
        None => decode(bytes).map(|t| Arc::new(Known::new(t))),
    }
}

/// Invariant 1.
async fn publish_local(kv: &dyn KvStore, job: &str, local: &LocalTopology) -> Result<()> {
    let key = keys::local(job, local.process_index);
    let bytes = local.encode();
    match kv.insert(key.as_bytes(), &bytes).await {
        Ok(_) => Ok(()),
        Err(KvError::AlreadyExists(_)) => {
            let existing = kv
                .try_get(key.as_bytes())
                .await
                .map_err(TopologyError::kv(format!("reading {key}")))?;
            if existing == bytes {
                return Ok(());
            }
            let (existing_host, existing_boot) = match LocalTopology::decode(&existing) {
                Ok(e) => (e.hostname, e.boot_id),
                Err(_) => ("(undecodable)".into(), "(undecodable)".into()),
            };
            Err(TopologyError::ConflictingLocalTopology {
                index: local.process_index,
                existing_host,
                existing_boot,
                host: local.hostname.clone(),
                boot: local.boot_id.clone(),
            })
        }
        Err(e) => Err(TopologyError::Kv {
            context: format!("inserting {key}"),
            source: e,
        }),
    }
}

async fn build_and_publish(
    kv: &dyn KvStore,
    job: &str,
    n: u32,
    deadline: Instant,
    timeout: Duration,
    cache: Option<&TopologyCache>,
) -> Result<Arc<Known>> {
    let built = gather(kv, job, n, deadline, timeout)
        .await
        .and_then(|locals| GlobalTopology::build(n, &locals));
    let published = match &built {
        Ok(t) => Published::Topology(t.clone()),
        Err(e) => Published::Failed(e.to_string()),
    };
    let key = keys::global(job);
    match kv.insert(key.as_bytes(), &published.encode()).await {
        Ok(_) => built.map(|t| Arc::new(Known::new(t))),
        // A restarted builder: the first outcome stands (invariant 4).
        Err(KvError::AlreadyExists(_)) => read_published(kv, job, cache).await,
        Err(e) => Err(TopologyError::Kv {
            context: format!("publishing {key}"),
            source: e,
        }),
    }
}

/// Every local topology, or the processes that never arrived: one listing,
/// then one watch for the rest (invariant 3).
async fn gather(
    kv: &dyn KvStore,
    job: &str,
    n: u32,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<LocalTopology>> {
    let prefix = keys::local_prefix(job);
    let mut got: BTreeMap<u32, LocalTopology> = BTreeMap::new();
    // Watch from the listing's revision on, so nothing falls between the
    // two; a listing that holds every process needs no watch.
    let rev = list_into(kv, job, n, &mut got).await?;
    if got.len() as u32 >= n {
        return Ok(got.into_values().collect());
    }
    let mut events = kv
        .watch(prefix.as_bytes(), rev + 1)
        .await
        .map_err(TopologyError::kv("watching local topologies"))?;
    while (got.len() as u32) < n {
        let next = tokio::time::timeout_at(deadline, events.next()).await;
        let event = match next {
            Err(_) => return Err(missing_error(kv, job, n, timeout).await),
            Ok(None) => {
                return Err(TopologyError::Kv {
                    context: "watching local topologies".into(),
                    source: KvError::Unavailable("the watch ended".into()),
                })
            }
            Ok(Some(e)) => e.map_err(TopologyError::kv("watching local topologies"))?,
        };
        if let Event::Put(pair) = event {
            accept(job, n, &mut got, &pair.key, &pair.value)?;
        }
    }
    Ok(got.into_values().collect())
}

/// Every local topology of job `job` listed now, into `got`; returns the
/// revision of the listing.
async fn list_into(
    kv: &dyn KvStore,
    job: &str,
    n: u32,
    got: &mut BTreeMap<u32, LocalTopology>,
) -> Result<u64> {
    let listing = kv
        .list_at(keys::local_prefix(job).as_bytes())
        .await
        .map_err(TopologyError::kv("listing local topologies"))?;
    for pair in listing.pairs {
        accept(job, n, got, &pair.key, &pair.value)?;
    }
    Ok(listing.revision)
}

/// Takes one local-topology key into `got`.
fn accept(
    job: &str,
    n: u32,
    got: &mut BTreeMap<u32, LocalTopology>,
    key: &[u8],
    value: &[u8],
) -> Result<()> {
    if let Some(i) = keys::parse_local(job, key) {
        if i >= n {
            return Err(TopologyError::ProcessIndexOutOfRange {
                index: i,
                num_processes: n,
            });
        }
        got.insert(i, LocalTopology::decode(value)?);
    }
    Ok(())
}

/// Which processes have not inserted their local topology.
async fn missing_error(kv: &dyn KvStore, job: &str, n: u32, after: Duration) -> TopologyError {
    let present: Vec<u32> = match kv.list(keys::local_prefix(job).as_bytes()).await {
        Ok(l) => l
            .iter()
            .filter_map(|p| keys::parse_local(job, &p.key))
            .collect(),
        Err(e) => {
            return TopologyError::Kv {
                context: "listing local topologies after a timeout".into(),
                source: e,
            }
        }
    };
    TopologyError::Missing {
        job: job.into(),
        missing: (0..n).filter(|i| !present.contains(i)).collect(),
        after,
    }
}

/// Process `index`'s entry in job `job`'s directory (invariant 6): its
/// local topology, waiting up to `wait` for it. Read serializable, from
/// the client's follower where it has one: the entry is written once, and
/// a replica that has not applied it yet waits for it.
pub async fn peer(
    kv: &dyn KvStore,
    job: &str,
    index: u32,
    wait: Duration,
) -> Result<LocalTopology> {
    keys::check_component("job id", job)?;
    let key = keys::local(job, index);
    let bytes = kv
        .get_serializable(key.as_bytes(), wait)
        .await
        .map_err(TopologyError::kv(format!("reading {key}")))?;
    let l = LocalTopology::decode(&bytes)?;
    if l.process_index != index {
        return Err(TopologyError::Invalid(format!(
            "{key} holds process {}",
            l.process_index
        )));
    }
    Ok(l)
}

/// Job `job`'s whole directory (invariant 6), by process index: one
/// listing, for a reader that needs every peer (`tessel topology`, the
/// checkpoint record's holders). Fails naming the processes whose entry
/// is missing.
pub async fn directory(kv: &dyn KvStore, job: &str, n: u32) -> Result<Vec<LocalTopology>> {
    keys::check_component("job id", job)?;
    let mut got = BTreeMap::new();
    list_into(kv, job, n, &mut got).await?;
    if let Some((i, l)) = got.iter().find(|(&i, l)| l.process_index != i) {
        return Err(TopologyError::Invalid(format!(
            "{} holds process {}",
            keys::local(job, *i),
            l.process_index
        )));
    }
    if got.len() as u32 != n {
        let missing: Vec<u32> = (0..n).filter(|i| !got.contains_key(i)).collect();
        return Err(TopologyError::Invalid(format!(
            "job `{job}` has no local topology from processes {missing:?}"
        )));
    }
    Ok(got.into_values().collect())
}

/// Job `job`'s global topology, waiting up to `wait` for its builder
/// (for readers outside the job: `tessel topology`, tests).
pub async fn global(kv: &dyn KvStore, job: &str, wait: Duration) -> Result<GlobalTopology> {
    let key = keys::global(job);
    let bytes = kv
        .get(key.as_bytes(), wait)
        .await
        .map_err(TopologyError::kv(format!("waiting for {key}")))?;
    match Published::decode(&bytes)? {
        Published::Topology(t) => Ok(t),
        Published::Failed(reason) => Err(TopologyError::BuilderFailed(reason)),
    }
}

async fn read_published(
    kv: &dyn KvStore,
    job: &str,
    cache: Option<&TopologyCache>,
) -> Result<Arc<Known>> {
    let key = keys::global(job);
    let bytes = kv
        .try_get(key.as_bytes())
        .await
        .map_err(TopologyError::kv(format!("reading {key}")))?;
    open(job, &bytes, cache)
}

async fn wait_for_global(
    kv: &dyn KvStore,
    job: &str,
    n: u32,
    deadline: Instant,
    timeout: Duration,
    cache: Option<&TopologyCache>,
) -> Result<Arc<Known>> {
    let key = keys::global(job);
    let left = deadline.saturating_duration_since(Instant::now());
    // Written once (invariant 2): any replica that has it may answer, so
    // the N reads of it are spread over the followers (invariant 5).
    match kv.get_serializable(key.as_bytes(), left).await {
        Ok(bytes) => open(job, &bytes, cache),
        Err(KvError::DeadlineExceeded { .. }) => Err(missing_error(kv, job, n, timeout).await),
        Err(e) => Err(TopologyError::Kv {
            context: format!("waiting for {key}"),
            source: e,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::tests::local;
    use tessel_kv::MemoryKv;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_process_gets_the_same_topology() {
        let kv = std::sync::Arc::new(MemoryKv::new());
        let tasks: Vec<_> = (0..4)
            .rev()
            .map(|i| {
                let kv = kv.clone();
                tokio::spawn(async move {
                    exchange(&*kv, "j1", &local(i, 4, "b", 4), Duration::from_secs(5)).await
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.unwrap().unwrap());
        }
        assert!(all.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(all[0].num_devices(), 16);
    }

    /// Invariant 6: each process's name and address are read from its
    /// own entry, not from the global topology; the whole directory in
    /// one listing, which names the processes missing from it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_is_found_in_the_directory_the_builder_read() {
        let kv = std::sync::Arc::new(MemoryKv::new());
        let tasks: Vec<_> = (0..3)
            .map(|i| {
                let kv = kv.clone();
                tokio::spawn(async move {
                    exchange(&*kv, "j2", &local(i, 3, "b", 1), Duration::from_secs(5)).await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let wait = Duration::from_secs(1);
        let p = peer(&*kv, "j2", 2, wait).await.unwrap();
        assert_eq!(p, local(2, 3, "b", 1));
        assert_eq!(p.transfer_endpoint.as_deref(), Some("127.0.0.1:7002"));
        let all = directory(&*kv, "j2", 3).await.unwrap();
        assert_eq!(all, (0..3).map(|i| local(i, 3, "b", 1)).collect::<Vec<_>>());
        // Not there (yet): the wait ends with the KV's deadline.
        let e = peer(&*kv, "j2", 5, Duration::from_millis(50)).await;
        assert!(matches!(e, Err(TopologyError::Kv { .. })), "{e:?}");
        // An entry under another process's key is refused.
        kv.put(
            keys::local("j3", 0).as_bytes(),
            &local(1, 2, "b", 1).encode(),
        )
        .await
        .unwrap();
        let e = peer(&*kv, "j3", 0, wait).await.unwrap_err().to_string();
        assert!(e.contains("holds process 1"), "{e}");
        let e = directory(&*kv, "j3", 2).await.unwrap_err().to_string();
        assert!(e.contains("holds process 1"), "{e}");
        let e = directory(&*kv, "j2", 4).await.unwrap_err().to_string();
        assert!(e.contains("no local topology from processes [3]"), "{e}");
    }

    /// Invariant 5: the published value is compressed and reads back;
    /// an uncompressed one (an older builder's, in the form before the
    /// columns) still reads; a value that would decompress past the cap,
    /// or is not zstd, is refused.
    #[test]
    fn a_published_topology_is_compressed_and_bounded() {
        let locals: Vec<LocalTopology> = (0..512).map(|i| local(i, 512, "host", 1)).collect();
        let t = GlobalTopology::build(512, &locals).unwrap();
        let old = crate::wire::legacy::Global::from_topology(&t, &locals);
        let plain = postcard::to_allocvec(&Stored::Legacy(old)).unwrap();
        let p = Published::Topology(t);
        let packed = p.encode();
        assert_eq!(packed[0], COMPRESSED);
        assert!(
            packed.len() * 3 < plain.len(),
            "{} vs {}",
            packed.len(),
            plain.len()
        );
        assert_eq!(Published::decode(&packed).unwrap(), p);
        assert_eq!(Published::decode(&plain).unwrap(), p);
        let bomb = [
            vec![COMPRESSED],
            zstd::bulk::compress(&vec![0u8; MAX_DECOMPRESSED + 1], ZSTD_LEVEL).unwrap(),
        ]
        .concat();
        assert!(Published::decode(&bomb).is_err());
        assert!(Published::decode(&[COMPRESSED, 1, 2, 3]).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_with_the_same_topology_is_accepted_a_different_one_is_not() {
        let kv = MemoryKv::new();
        let me = local(1, 2, "b", 2);
        publish_local(&kv, "j", &me).await.unwrap();
        publish_local(&kv, "j", &me).await.unwrap();
        let mut other = me.clone();
        other.boot_id = "new-boot".into();
        let e = publish_local(&kv, "j", &other).await.unwrap_err();
        assert!(e.to_string().contains("already taken"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_process_that_never_arrives_is_named_to_everyone() {
        let kv = std::sync::Arc::new(MemoryKv::new());
        let t = Duration::from_millis(400);
        let (l0, l1) = (local(0, 3, "b", 1), local(1, 3, "b", 1));
        let (a, b) = tokio::join!(exchange(&*kv, "j2", &l0, t), exchange(&*kv, "j2", &l1, t));
        for e in [a.unwrap_err(), b.unwrap_err()] {
            let s = e.to_string();
            assert!(s.contains("[2]"), "{s}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wrong_process_count_fails_everyone_promptly() {
        let kv = std::sync::Arc::new(MemoryKv::new());
        let t = Duration::from_secs(10);
        let started = Instant::now();
        let (l0, l1) = (local(0, 2, "b", 1), local(1, 3, "b", 1));
        let (a, b) = tokio::join!(exchange(&*kv, "j3", &l0, t), exchange(&*kv, "j3", &l1, t));
        assert!(
            matches!(a, Err(TopologyError::WrongProcessCount { .. })),
            "{a:?}"
        );
        assert!(matches!(b, Err(TopologyError::BuilderFailed(_))), "{b:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
