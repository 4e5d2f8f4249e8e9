//! Taking a worker id: refused while another live process holds it.
//!
//! Invariants:
//! 1. A worker id is taken only when no live process holds it: no alive key,
//!    or its holder ran on this boot and is gone, or its alive key went
//!    while we watched (a lease nobody renews expires within its TTL).
//! 2. A holder whose alive key outlives its TTL and a margin while we watch
//!    renews its lease, so keeps the id (as does a new registration, a new
//!    value): we refuse and name it. A heartbeat writes nothing
//!    (`registry` invariant 5), so the key's presence is the proof.
//! 3. A free id costs one read: the holder's record is read only when its
//!    alive key exists (thousands of hosts claim their ids at once when a
//!    pod starts, and each read is the leader's).

use std::time::{Duration, Instant};

use tessel_coordinator::{keys, WorkerRecord};
use tessel_kv::{KvError, KvStore};

use crate::error::{kv_err, Result, WorkerError};
use crate::host::HostFacts;

/// Extra time past the holder's TTL before its key's presence proves a
/// renewal: the leader's expiry lags the lease's deadline.
const MARGIN: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(200);

/// What to do about the current holder of an id (invariant 1), pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Nobody, or a crashed process of this host: take the id.
    Free,
    /// Someone may be alive: watch its heartbeats for this long.
    Watch(Duration),
}

/// Decides, for an id whose alive key exists (invariant 3: without one
/// it is free), from the holder's record and whether the holder's pid runs
/// here.
pub fn judge(
    holder: Option<&WorkerRecord>,
    me: &HostFacts,
    pid_running: impl Fn(u32) -> bool,
) -> Holder {
    match holder {
        Some(r) if r.info.boot_id == me.boot_id && !pid_running(r.info.pid) => Holder::Free,
        Some(r) => Holder::Watch(Duration::from_millis(r.info.ttl_ms) + MARGIN),
        // An alive key without a record: a registration cut short. Its
        // lease is at most the default TTL.
        None => Holder::Watch(Duration::from_secs(5) + MARGIN),
    }
}

fn pid_running(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Returns once `worker` may be registered by this process (invariant 1),
/// or refuses (invariant 2).
pub async fn claim(kv: &dyn KvStore, worker: &str, me: &HostFacts) -> Result<()> {
    let alive_key = keys::alive(worker);
    // Invariant 3: no alive key, nothing more to read.
    let first = match kv.try_get(alive_key.as_bytes()).await {
        Ok(v) => v,
        Err(KvError::NotFound(_)) => return Ok(()),
        Err(e) => return Err(kv_err("reading the worker id's holder")(e)),
    };
    let record: Option<WorkerRecord> = match kv.try_get(keys::info(worker).as_bytes()).await {
        Ok(v) => postcard::from_bytes(&v).ok(),
        Err(KvError::NotFound(_)) => None,
        Err(e) => return Err(kv_err("reading the worker id's holder")(e)),
    };
    let wait = match judge(record.as_ref(), me, pid_running) {
        Holder::Free => return Ok(()),
        Holder::Watch(d) => d,
    };
    let holder = match &record {
        Some(r) => format!(
            "host {}, pid {}, incarnation {}",
            r.info.hostname, r.info.pid, r.incarnation
        ),
        None => "a registration without a record".into(),
    };
    tracing::warn!(worker, %holder, ?wait, "worker id held; watching its lease");
    let deadline = Instant::now() + wait;
    loop {
        tokio::time::sleep(POLL).await;
        match kv.try_get(alive_key.as_bytes()).await {
            Err(KvError::NotFound(_)) => return Ok(()),
            // Invariant 2: renewed past its TTL, or registered anew.
            Ok(v) if v != first || Instant::now() >= deadline => {
                return Err(WorkerError::IdInUse {
                    worker: worker.into(),
                    holder,
                })
            }
            Ok(_) => {}
            Err(e) => return Err(kv_err("reading the worker id's holder")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_coordinator::{WorkerDevice, WorkerInfo};

    fn info(id: &str) -> WorkerInfo {
        WorkerInfo {
            worker_id: id.into(),
            hostname: "h".into(),
            boot_id: "b".into(),
            pid: 1,
            plugin: "cpu".into(),
            platform: "cpu".into(),
            plugin_version: "-".into(),
            devices: vec![WorkerDevice {
                kind: "cpu".into(),
                count: 1,
                memory_bytes: None,
            }],
            ttl_ms: 5000,
        }
    }

    fn record(boot: &str, pid: u32) -> WorkerRecord {
        let mut i = info("h4");
        i.boot_id = boot.into();
        i.pid = pid;
        i.ttl_ms = 5000;
        WorkerRecord {
            info: i,
            incarnation: 3,
            lease: 1,
            registered_unix_ms: 0,
        }
    }

    #[test]
    fn a_live_holder_elsewhere_is_watched_and_a_crashed_one_here_is_replaced() {
        let me = HostFacts {
            hostname: "a".into(),
            boot_id: "boot-a".into(),
        };
        // The holder ran here and its process is gone: a restart.
        assert_eq!(
            judge(Some(&record("boot-a", 7)), &me, |_| false),
            Holder::Free
        );
        // Here and running, or on another host: watch it for its TTL.
        let watch = Holder::Watch(Duration::from_millis(5000) + MARGIN);
        assert_eq!(judge(Some(&record("boot-a", 7)), &me, |_| true), watch);
        assert_eq!(judge(Some(&record("boot-b", 7)), &me, |_| false), watch);
    }

    /// Invariant 3: without an alive key an id is free, whatever the
    /// record says (a holder elsewhere whose pid runs), and costs one read,
    /// not the record's too.
    #[tokio::test]
    async fn a_free_id_costs_one_read() {
        use std::sync::Arc;
        let store = Arc::new(tessel_kv::MemoryKv::new());
        let record = postcard::to_allocvec(&record("boot-b", 1)).unwrap();
        store
            .put(tessel_coordinator::keys::info("h4").as_bytes(), &record)
            .await
            .unwrap();
        let kv = tessel_kv::CountingKv::new(store);
        let me = HostFacts {
            hostname: "here".into(),
            boot_id: "here".into(),
        };
        claim(&kv, "h4", &me).await.unwrap();
        assert_eq!(kv.ops(), 1);
    }

    /// Invariant 2 against a holder that beats: refused, and its key left
    /// as it was.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_beating_holder_keeps_its_id() {
        use std::sync::Arc;
        use tessel_coordinator::registry::{register, Heartbeat};
        let kv: Arc<dyn KvStore> = Arc::new(tessel_kv::MemoryKv::new());
        let mut i = info("h4");
        i.boot_id = "elsewhere".into();
        let fast = tessel_coordinator::LivenessConfig {
            heartbeat: Duration::from_millis(100),
            ttl: Duration::from_millis(800),
        };
        i.ttl_ms = 800;
        let reg = register(&*kv, i, fast).await.unwrap();
        let _hb = Heartbeat::start(kv.clone(), reg.clone(), fast);
        let me = HostFacts {
            hostname: "here".into(),
            boot_id: "here".into(),
        };
        let e = claim(&*kv, "h4", &me).await.unwrap_err();
        assert!(matches!(e, WorkerError::IdInUse { .. }), "{e}");
        tessel_coordinator::registry::check_current(&*kv, "h4", reg.incarnation)
            .await
            .unwrap();
        // Once it stops beating, its lease expires and the id is free
        // (waiting for the expiry itself: a loaded machine may be late).
        drop(_hb);
        let alive = tessel_coordinator::keys::alive("h4");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while kv.try_get(alive.as_bytes()).await.is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "the lease never expired"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        claim(&*kv, "h4", &me).await.unwrap();
    }
}
