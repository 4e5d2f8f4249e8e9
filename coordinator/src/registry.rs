//! The worker registry.
//!
//! Invariants:
//! 1. Each registration of a worker id gets the next incarnation and a fresh
//!    lease; the alive key names the incarnation holding it.
//! 2. A stale incarnation is refused everywhere ([`check_current`]):
//!    registering revokes the predecessor's lease, so its heartbeat stops
//!    at its next keep-alive, and it joins nothing.
//! 3. A worker is alive exactly while its alive key (bound to its lease)
//!    exists: one that stops beating is dead within its TTL.
//! 4. One keep-alive at a time: a beat that finds the last one unanswered
//!    sends nothing, and one unanswered for a TTL is given up and another
//!    sent at once (its lease has expired unless it was renewed; the next
//!    answer says which). Giving up after an interval and sending another
//!    doubled a late leader's work (the abandoned keep-alive is still
//!    served): 70,901 late beats in one 16,384-host bootstrap; giving up
//!    after half a TTL, 5 of 8 such runs failed, against 3 of 28. Moving off
//!    a dead replica is the KV client's work, within its own deadlines.
//! 5. A heartbeat writes nothing: its keep-alive is answered from the
//!    leader's memory. Proof that a worker lived after some moment is its
//!    alive key outliving that moment by its TTL (a lease nobody renews
//!    expires within it). A timestamp written once a TTL by each worker
//!    was 3,300 replicated writes a second at 16,384 workers.
//! 6. Each worker beats at its own phase within the interval, so workers
//!    started together do not all beat in one instant.
//! 7. A registration that took longer than a heartbeat interval renews its
//!    lease at once, and one that finds it gone then grants another and
//!    tries again, a few times: the heartbeat's first beat, up to an
//!    interval later, came too late for leases aged seconds by a slow
//!    answer. (On etcd, which grants before it writes, so does one whose
//!    lease expired before its keys were bound to it.)
//! 8. The lease, the record and the alive key are written together
//!    (`grant_and_put`: one write, one revision): an alive worker always
//!    has the record it registered with, its lease cannot expire before
//!    its alive key is bound to it (a leader's queue held a separate
//!    record's write for a TTL when 16,384 workers registered at once), and
//!    registering costs two writes (incarnation, then lease and keys).
//! 9. The lease's id is the worker's choice, random among 2^63; one that is
//!    taken is chosen again.
//! 10. The first beat comes an interval and the worker's phase after the
//!     request that last renewed the lease was sent (its grant, or
//!     invariant 7's renewal), never sooner: a lease granted a moment ago
//!     needs no renewal yet, and the first renewal comes no later after the
//!     grant than when beats counted from the registration's answer (under
//!     two intervals). Counted from the answer, a worker registered
//!     quickly renewed the lease it had just been granted: every host's
//!     keep-alive in a 1,024-host bootstrap, and 0.3 to 1 a host at 4,096
//!     and 16,384 (docs/performance.md).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tessel_kv::{BatchPut, KeyValue, KvError, KvStore};
use tokio::sync::watch;

use crate::error::{CoordinatorError, Result};
use crate::keys;

mod view;
pub use view::RegistryView;

/// Heartbeat interval and lease TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessConfig {
    /// How often a worker renews its lease.
    pub heartbeat: Duration,
    /// How long a silent worker stays alive.
    pub ttl: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        LivenessConfig {
            heartbeat: Duration::from_secs(1),
            ttl: Duration::from_secs(5),
        }
    }
}

impl LivenessConfig {
    /// Refuses a TTL shorter than two heartbeats.
    pub fn validate(&self) -> Result<()> {
        if self.heartbeat.is_zero() || self.ttl < self.heartbeat * 2 {
            return Err(CoordinatorError::Invalid {
                what: "liveness settings".into(),
                reason: format!(
                    "the lease TTL ({:?}) must be at least two heartbeats ({:?})",
                    self.ttl, self.heartbeat
                ),
            });
        }
        Ok(())
    }
}

/// Devices of one kind on a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerDevice {
    /// The kind the plugin reports (`cpu`, `H100`, ...).
    pub kind: String,
    /// How many.
    pub count: u32,
    /// Memory of one device, when the plugin reports it.
    pub memory_bytes: Option<u64>,
}

/// What a worker tells the registry about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Stable across restarts of the same worker (default: the hostname).
    pub worker_id: String,
    /// The host's name.
    pub hostname: String,
    /// The host's boot id (processes sharing one share memory).
    pub boot_id: String,
    /// The worker's process id.
    pub pid: u32,
    /// The plugin as the worker was started with it: a name (`cpu`,
    /// `cuda`) or a path. A job's `plugin` names it, or its platform.
    pub plugin: String,
    /// The plugin's platform (`cpu`, `cuda`, `tpu`).
    pub platform: String,
    /// The plugin's version and C API version, for people.
    pub plugin_version: String,
    /// The devices the plugin sees.
    pub devices: Vec<WorkerDevice>,
    /// The worker's lease TTL: how long it may be silent before it is
    /// dead (and how long a new process waits before taking its id).
    pub ttl_ms: u64,
}

/// The registry's record of a registration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// What the worker said.
    pub info: WorkerInfo,
    /// Counts registrations under this id; the newest wins.
    pub incarnation: u64,
    /// The lease its alive key is bound to.
    pub lease: u64,
    /// When it registered.
    pub registered_unix_ms: u64,
}

/// A successful registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The worker's id.
    pub worker_id: String,
    /// The incarnation this process holds.
    pub incarnation: u64,
    /// The lease its heartbeat renews.
    pub lease: u64,
    /// When the request that last renewed the lease was sent: the first
    /// beat counts from it (invariant 10).
    pub renewed_at: tokio::time::Instant,
}

/// Registers a worker (invariant 1).
pub async fn register(
    kv: &dyn KvStore,
    info: WorkerInfo,
    liveness: LivenessConfig,
) -> Result<Registration> {
    keys::check_id("worker id", &info.worker_id)?;
    liveness.validate()?;
    let id = info.worker_id.clone();
    let incarnation =
        kv.increment(keys::incarnation(&id).as_bytes(), 1)
            .await
            .map_err(CoordinatorError::kv(format!("registering worker `{id}`")))? as u64;
    // Invariant 2: the predecessor's lease, revoked once this one is in.
    let predecessor = match incarnation {
        1 => None,
        _ => match kv.try_get(keys::info(&id).as_bytes()).await {
            Ok(v) => postcard::from_bytes::<WorkerRecord>(&v)
                .ok()
                .map(|r| r.lease),
            Err(KvError::NotFound(_)) => None,
            Err(e) => return Err(CoordinatorError::kv("reading the previous registration")(e)),
        },
    };
    // Invariants 7 and 9: a lease found gone, or an id taken, is replaced.
    let mut tries = 0;
    loop {
        tries += 1;
        let began = tokio::time::Instant::now();
        let mut renewed_at = began;
        let lease = chosen_lease(&id, incarnation, tries);
        let record = WorkerRecord {
            info: info.clone(),
            incarnation,
            lease,
            registered_unix_ms: keys::unix_ms(),
        };
        // Invariant 8: the lease, the record and the alive key in one write.
        let alive = kv
            .grant_and_put(
                lease,
                liveness.ttl,
                &[
                    BatchPut::new(
                        keys::info(&id).as_bytes(),
                        &postcard::to_allocvec(&record).expect("always encodes"),
                        None,
                    ),
                    BatchPut::new(
                        keys::alive(&id).as_bytes(),
                        keys::alive_value(incarnation, keys::unix_ms()).as_bytes(),
                        Some(lease),
                    ),
                ],
            )
            .await;
        // Invariant 7: a registration slow enough to age its lease renews
        // it at once, before its heartbeat's first beat (up to an interval
        // later).
        let alive = match alive {
            Ok(rev) if began.elapsed() > liveness.heartbeat => {
                let renewing = tokio::time::Instant::now();
                match tokio::time::timeout(liveness.heartbeat, kv.keep_alive(lease)).await {
                    Ok(Err(e @ KvError::LeaseNotFound(_))) => Err(e),
                    Ok(Ok(())) => {
                        renewed_at = renewing;
                        Ok(rev)
                    }
                    _ => Ok(rev),
                }
            }
            other => other,
        };
        match alive {
            Ok(_) => {
                if let Some(old) = predecessor.filter(|&old| old != lease) {
                    // Gone already when the predecessor is dead; if not,
                    // it expires within its TTL anyway.
                    match kv.revoke(old).await {
                        Ok(()) | Err(KvError::LeaseNotFound(_)) => {}
                        Err(e) => {
                            tracing::warn!(worker = %id, lease = old, error = %e, "the previous incarnation's lease not revoked")
                        }
                    }
                }
                return Ok(Registration {
                    worker_id: id,
                    incarnation,
                    lease,
                    renewed_at,
                });
            }
            Err(KvError::LeaseNotFound(_)) if tries < REGISTER_TRIES => {
                tracing::warn!(worker = %id, lease, "the new lease was gone when the registration was answered; granting another");
            }
            // Invariant 9: another lease holds the id (by chance).
            Err(KvError::AlreadyExists(_)) if tries < REGISTER_TRIES => {}
            Err(e) => return Err(CoordinatorError::kv("writing the worker record")(e)),
        }
    }
}

/// Grants a registration tries when the lease expires on the way
/// (invariant 7) or its id is taken (invariant 9).
const REGISTER_TRIES: u32 = 3;

/// The id registration `incarnation` of `worker` asks for on try `tries`
/// (invariant 9): random, from 1 to [`tessel_kv::MAX_CHOSEN_LEASE`].
fn chosen_lease(worker: &str, incarnation: u64, tries: u32) -> u64 {
    use std::hash::BuildHasher;
    // The standard library's hasher keys are random per `RandomState`.
    let h = std::collections::hash_map::RandomState::new().hash_one((
        worker,
        incarnation,
        tries,
        keys::unix_ms(),
    ));
    1 + h % tessel_kv::MAX_CHOSEN_LEASE
}

/// Refuses anything from an incarnation that is not the worker's latest
/// (invariant 2).
pub async fn check_current(kv: &dyn KvStore, worker: &str, incarnation: u64) -> Result<()> {
    let current = match kv.try_get(keys::incarnation(worker).as_bytes()).await {
        Ok(v) => std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok()),
        Err(KvError::NotFound(_)) => return Err(CoordinatorError::UnknownWorker(worker.into())),
        Err(e) => {
            return Err(CoordinatorError::Kv {
                context: format!("reading worker `{worker}`'s incarnation"),
                source: e,
            })
        }
    };
    if current != Some(incarnation) {
        return Err(CoordinatorError::StaleIncarnation {
            worker: worker.into(),
            incarnation,
            current,
        });
    }
    Ok(())
}

/// Keeps a registration alive in the background; ends, reporting why, when
/// the lease is gone or a newer incarnation took over.
pub struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
    lost: watch::Receiver<Option<CoordinatorError>>,
}

impl Heartbeat {
    /// Starts renewing `reg`'s lease every heartbeat.
    pub fn start(kv: Arc<dyn KvStore>, reg: Registration, liveness: LivenessConfig) -> Heartbeat {
        let (tx, lost) = watch::channel(None);
        let task = tokio::spawn(async move {
            let err = heartbeat_loop(&*kv, &reg, liveness).await;
            tracing::warn!(worker = %reg.worker_id, incarnation = reg.incarnation, error = %err, "heartbeat stopped");
            let _ = tx.send(Some(err));
        });
        Heartbeat { task, lost }
    }

    /// Waits until the registration is lost, and says why.
    pub async fn lost(&mut self) -> CoordinatorError {
        loop {
            if let Some(e) = self.lost.borrow_and_update().clone() {
                return e;
            }
            if self.lost.changed().await.is_err() {
                return CoordinatorError::Invalid {
                    what: "heartbeat".into(),
                    reason: "the heartbeat task ended".into(),
                };
            }
        }
    }

    /// Why the registration was lost, if it was by now.
    pub fn lost_now(&self) -> Option<CoordinatorError> {
        self.lost.borrow().clone()
    }

    /// Stops renewing (the lease then expires by itself).
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Invariant 6: a phase of this incarnation's own, in [0, 1).
fn phase(worker_id: &str, incarnation: u64) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (worker_id, incarnation).hash(&mut h);
    (h.finish() % 1024) as f64 / 1024.0
}

/// When `reg`'s first beat is due (invariants 6 and 10).
fn first_beat(reg: &Registration, liveness: LivenessConfig) -> tokio::time::Instant {
    reg.renewed_at
        + liveness.heartbeat
        + liveness
            .heartbeat
            .mul_f64(phase(&reg.worker_id, reg.incarnation))
}

/// Invariants 4–6 and 10: a keep-alive every interval, one at a time,
/// and nothing written.
async fn heartbeat_loop(
    kv: &dyn KvStore,
    reg: &Registration,
    liveness: LivenessConfig,
) -> CoordinatorError {
    let mut tick = tokio::time::interval_at(first_beat(reg, liveness), liveness.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut again = false;
    loop {
        if !std::mem::take(&mut again) {
            tick.tick().await;
        }
        let started = std::time::Instant::now();
        let beat = kv.keep_alive(reg.lease);
        tokio::pin!(beat);
        // Invariant 4: the beats that come meanwhile send nothing.
        let beat = loop {
            tokio::select! {
                beat = &mut beat => break Some(beat),
                _ = tick.tick() => {
                    metrics::counter!("tessel_worker_heartbeats_total", "outcome" => "late")
                        .increment(1);
                    if started.elapsed() >= liveness.ttl {
                        break None;
                    }
                }
            }
        };
        let Some(beat) = beat else {
            metrics::counter!("tessel_worker_heartbeats_total", "outcome" => "timed_out")
                .increment(1);
            tracing::warn!(ttl = ?liveness.ttl, "keep-alive unanswered for a TTL; sending another");
            again = true;
            continue;
        };
        let outcome = if beat.is_ok() { "ok" } else { "failed" };
        metrics::counter!("tessel_worker_heartbeats_total", "outcome" => outcome).increment(1);
        match beat {
            Ok(()) => metrics::histogram!("tessel_worker_heartbeat_seconds")
                .record(started.elapsed().as_secs_f64()),
            Err(KvError::LeaseNotFound(_)) => return lease_lost(kv, reg).await,
            Err(e) => {
                // The lease's TTL leaves room for a few failed beats.
                tracing::warn!(error = %e, "heartbeat failed; retrying");
            }
        }
    }
}

/// Why a registration's lease is gone: a successor revoked it
/// (invariant 2; `current` names it, so the process can stop rather than
/// register again), or it expired (`current` is this incarnation or
/// unknown).
async fn lease_lost(kv: &dyn KvStore, reg: &Registration) -> CoordinatorError {
    let current = match check_current(kv, &reg.worker_id, reg.incarnation).await {
        Err(CoordinatorError::StaleIncarnation { current, .. }) => current,
        _ => None,
    };
    CoordinatorError::StaleIncarnation {
        worker: reg.worker_id.clone(),
        incarnation: reg.incarnation,
        current,
    }
}

/// Alive or dead, as the registry sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState {
    /// Its lease is live.
    Alive {
        /// The incarnation that holds it.
        incarnation: u64,
        /// Since when: the alive key's write, by its registration (a
        /// heartbeat writes nothing, invariant 5).
        since_unix_ms: u64,
    },
    /// Its lease expired or was revoked.
    Dead,
}

/// A registered worker and its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStatus {
    /// Its registration.
    pub record: WorkerRecord,
    /// Alive or dead.
    pub state: WorkerState,
    /// Jobs the worker joined (and has not left).
    pub jobs: Vec<String>,
    /// Why it is drained (`tessel drain`, or its preemption): no new
    /// placements go there.
    pub drained: Option<String>,
}

/// Every registered worker, by id.
pub async fn list_workers(kv: &dyn KvStore) -> Result<Vec<WorkerStatus>> {
    let all = kv
        .list(keys::WORKERS.as_bytes())
        .await
        .map_err(CoordinatorError::kv("listing workers"))?;
    statuses(all.iter())
}

/// The workers the registry's pairs (all of `workers/`) describe.
fn statuses<'a>(all: impl Iterator<Item = &'a KeyValue>) -> Result<Vec<WorkerStatus>> {
    let mut records: BTreeMap<String, WorkerRecord> = BTreeMap::new();
    let mut alive: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut jobs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut drained: BTreeMap<String, String> = BTreeMap::new();
    for pair in all {
        let Ok(key) = std::str::from_utf8(&pair.key) else {
            continue;
        };
        let Some(rest) = key.strip_prefix(keys::WORKERS) else {
            continue;
        };
        let Some((worker, what)) = rest.split_once('/') else {
            continue;
        };
        if what == "info" {
            let r: WorkerRecord = postcard::from_bytes(&pair.value)
                .map_err(CoordinatorError::decode("a worker record"))?;
            records.insert(worker.into(), r);
        } else if what == "alive" {
            if let Some((inc, t)) = keys::parse_alive_value(&pair.value) {
                alive.insert(worker.into(), (inc, t));
            }
        } else if what == "drain" {
            drained.insert(
                worker.into(),
                String::from_utf8_lossy(&pair.value).into_owned(),
            );
        } else if let Some(job) = what.strip_prefix("jobs/") {
            jobs.entry(worker.into()).or_default().push(job.into());
        }
    }
    Ok(records
        .into_iter()
        .map(|(id, record)| {
            let state = match alive.get(&id) {
                Some(&(incarnation, t)) if incarnation == record.incarnation => {
                    WorkerState::Alive {
                        incarnation,
                        since_unix_ms: t,
                    }
                }
                _ => WorkerState::Dead,
            };
            WorkerStatus {
                record,
                state,
                jobs: jobs.remove(&id).unwrap_or_default(),
                drained: drained.remove(&id),
            }
        })
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testing::FaultyKv;
    use tessel_kv::MemoryKv;

    pub(crate) fn info(id: &str) -> WorkerInfo {
        WorkerInfo {
            worker_id: id.into(),
            hostname: "h".into(),
            boot_id: "b".into(),
            pid: 1,
            plugin: "cpu".into(),
            platform: "cpu".into(),
            plugin_version: "0.81".into(),
            devices: vec![WorkerDevice {
                kind: "cpu".into(),
                count: 4,
                memory_bytes: None,
            }],
            ttl_ms: 800,
        }
    }

    pub(crate) fn fast() -> LivenessConfig {
        LivenessConfig {
            heartbeat: Duration::from_millis(100),
            ttl: Duration::from_millis(800),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_new_incarnation_makes_the_old_one_stale() {
        let kv: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let first = register(&*kv, info("w"), fast()).await.unwrap();
        assert_eq!(first.incarnation, 1);
        let mut hb = Heartbeat::start(kv.clone(), first.clone(), fast());
        check_current(&*kv, "w", 1).await.unwrap();
        let second = register(&*kv, info("w"), fast()).await.unwrap();
        assert_eq!(second.incarnation, 2);
        assert!(matches!(
            check_current(&*kv, "w", 1).await,
            Err(CoordinatorError::StaleIncarnation {
                incarnation: 1,
                current: Some(2),
                ..
            })
        ));
        // Invariant 2: its lease revoked, it stops at its next beat (well
        // within its TTL) and learns which incarnation took over.
        assert!(matches!(
            kv.keep_alive(first.lease).await,
            Err(KvError::LeaseNotFound(_))
        ));
        let lost = tokio::time::timeout(fast().ttl / 2, hb.lost())
            .await
            .expect("the stale heartbeat stops");
        assert!(
            matches!(
                lost,
                CoordinatorError::StaleIncarnation {
                    current: Some(2),
                    ..
                }
            ),
            "{lost}"
        );
        let s = list_workers(&*kv).await.unwrap();
        assert!(
            matches!(s[0].state, WorkerState::Alive { incarnation: 2, .. }),
            "{s:?}"
        );
        assert!(matches!(
            check_current(&*kv, "nobody", 1).await,
            Err(CoordinatorError::UnknownWorker(_))
        ));
    }

    /// Invariant 8: the registration's write waited in a queue for twice
    /// the TTL; its lease, granted as it was applied, is the one the worker
    /// lives on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_registration_held_in_a_queue_keeps_the_lease_granted_with_it() {
        let kv = Arc::new(FaultyKv::new());
        *kv.slow_next_put.lock().unwrap() = Some(fast().ttl * 2);
        let reg = register(&*kv, info("w"), fast()).await.unwrap();
        assert_eq!(reg.incarnation, 1);
        assert_eq!(*kv.granted.lock().unwrap(), [reg.lease], "one lease");
        let workers = list_workers(&*kv).await.unwrap();
        assert!(
            matches!(workers[0].state, WorkerState::Alive { incarnation: 1, .. }),
            "{workers:?}"
        );
        let _hb = Heartbeat::start(kv.clone(), reg.clone(), fast());
        tokio::time::sleep(fast().ttl * 2).await;
        check_current(&*kv, "w", 1).await.unwrap();
        assert!(kv.inner.keep_alive(reg.lease).await.is_ok(), "kept alive");
    }

    /// Invariant 7: the record was written in time but its answer came a
    /// TTL later (a client running behind): the lease found gone when
    /// renewed at once is replaced, and the worker is alive on another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_registration_answered_after_its_lease_expired_takes_another() {
        let kv = Arc::new(FaultyKv::new());
        *kv.late_next_batch_answer.lock().unwrap() = Some(fast().ttl * 2);
        let reg = register(&*kv, info("w"), fast()).await.unwrap();
        let granted = kv.granted.lock().unwrap().clone();
        assert_eq!(
            granted.len(),
            2,
            "the first lease expired: a second was granted"
        );
        assert_eq!(reg.lease, granted[1]);
        let _hb = Heartbeat::start(kv.clone(), reg.clone(), fast());
        tokio::time::sleep(fast().ttl * 2).await;
        let workers = list_workers(&*kv).await.unwrap();
        assert!(
            matches!(workers[0].state, WorkerState::Alive { incarnation: 1, .. }),
            "{workers:?}"
        );
        assert!(kv.inner.keep_alive(reg.lease).await.is_ok(), "kept alive");
    }

    /// Invariant 4: keep-alives served 2.5 intervals late (a leader
    /// running behind) are waited for, one at a time, and keep the worker
    /// alive. The old loop sent one an interval (what `sent` counts); in
    /// this double, which never serves a dropped keep-alive, none of them
    /// would also have renewed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_keep_alive_is_waited_for_and_never_sent_twice() {
        let kv = Arc::new(FaultyKv::new());
        let reg = register(&*kv, info("w"), fast()).await.unwrap();
        let late = fast().heartbeat * 5 / 2;
        *kv.late_keep_alives.lock().unwrap() = Some(late);
        let mut hb = Heartbeat::start(kv.clone(), reg, fast());
        tokio::select! {
            lost = hb.lost() => panic!("lost: {lost}"),
            () = tokio::time::sleep(fast().ttl * 3) => {}
        }
        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!(kv.most_in_flight.load(Relaxed), 1, "two in flight");
        // A beat every 300 ms (250 ms late, then the next tick) over 2.4 s.
        let sent = kv.keep_alives.load(Relaxed);
        assert!((5..=10).contains(&sent), "{sent} keep-alives");
        check_current(&*kv, "w", 1).await.unwrap();
    }

    /// Invariant 10: no keep-alive within an interval of the lease's
    /// grant, whatever the worker's phase; the first comes at its phase
    /// after that interval. Counted from the heartbeat's start, as before,
    /// a worker whose phase is under a half beat within half an interval.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_first_beat_comes_an_interval_after_the_grant() {
        use std::sync::atomic::Ordering::Relaxed;
        let kv = Arc::new(FaultyKv::new());
        // An id whose phase is under a half: its old first beat came before
        // half an interval.
        let id = (0..)
            .map(|i| format!("w{i}"))
            .find(|id| phase(id, 1) < 0.5)
            .unwrap();
        let reg = register(&*kv, info(&id), fast()).await.unwrap();
        let due = first_beat(&reg, fast());
        assert!(due >= reg.renewed_at + fast().heartbeat);
        let _hb = Heartbeat::start(kv.clone(), reg, fast());
        tokio::time::sleep_until(due - Duration::from_millis(20)).await;
        assert_eq!(
            kv.keep_alives.load(Relaxed),
            0,
            "a beat before its due time"
        );
        tokio::time::sleep_until(due + fast().ttl).await;
        assert!(
            kv.keep_alives.load(Relaxed) >= 1,
            "no beat after its due time"
        );
    }

    /// Invariants 3 and 5: a worker is alive while it beats, for many
    /// TTLs, and its beats write nothing (the revision stands still); it
    /// is dead within its TTL once the heartbeat stops.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_worker_is_alive_while_it_beats_without_writing_and_dead_after_its_ttl() {
        let kv: Arc<dyn KvStore> = Arc::new(MemoryKv::new());
        let reg = register(&*kv, info("w"), fast()).await.unwrap();
        let before = kv.revision().await.unwrap();
        let mut hb = Heartbeat::start(kv.clone(), reg, fast());
        tokio::select! {
            lost = hb.lost() => panic!("lost: {lost}"),
            () = tokio::time::sleep(fast().ttl * 3) => {}
        }
        assert_eq!(kv.revision().await.unwrap(), before, "a beat wrote");
        let s = list_workers(&*kv).await.unwrap();
        assert!(
            matches!(s[0].state, WorkerState::Alive { incarnation: 1, .. }),
            "{s:?}"
        );
        hb.stop();
        tokio::time::sleep(Duration::from_millis(1300)).await;
        let s = list_workers(&*kv).await.unwrap();
        assert_eq!(s[0].state, WorkerState::Dead);
    }

    #[test]
    fn liveness_settings_are_checked() {
        let bad = LivenessConfig {
            heartbeat: Duration::from_secs(1),
            ttl: Duration::from_secs(1),
        };
        assert!(bad.validate().is_err());
        assert!(LivenessConfig::default().validate().is_ok());
    }
}
