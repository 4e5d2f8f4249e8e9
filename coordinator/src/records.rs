//! A job's and its attempts' records in the key-value service, typed: with
//! [`crate::attempt`] (the per-process records' layout, and all of them at
//! once) the only code that lays out or parses their keys. The worker, the job process, the scheduler, the
//! client and the CLI hold a [`Records`] for a job or an attempt id and
//! name what they read or write by an [`Item`]; series (reports,
//! checkpoints, logs) come back parsed, in order.
//!
//! Which id a record is under (the layout is in ARCHITECTURE.md): reports,
//! arrays, checkpoints and logs live under the job id, so they outlast its
//! attempts; the spec, `done`, the notice, the suspend step and the
//! rendezvous under the attempt id (`{job}@{n}`), so a new attempt starts
//! clean.
//!
//! Invariants:
//! 1. A series key is parsed whole (its fixed-width numbers, nothing after
//!    them); anything else under the prefix is skipped, never miscounted.
//! 2. [`Records::first`] returns the value in force: the first writer's,
//!    whoever asks, so processes that race to choose agree.

use std::time::Duration;

use tessel_kv::{KvError, KvStore};

use crate::attempt::Record;
use crate::keys;

/// One value of a job or an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// The attempt's bundle: its spec text and the files it names.
    Spec,
    /// The attempt is over; workers leave it.
    Done,
    /// A preemption notice for the attempt: `"{grace_ms} {reason}"`.
    Notice,
    /// The step at which a suspended attempt's processes stop (process 0
    /// chooses it).
    SuspendStep,
    /// Where a command attempt's processes meet (`host jax_port
    /// torch_port`), chosen by process 0.
    Rendezvous,
    /// An array's final value (`.npy`), by the job id.
    Array(&'a str),
    /// The scalars reported at a step, by the job id.
    Report(u64),
    /// The checkpoint record of a step, by the job id.
    Checkpoint(u64),
    /// A record of one of the attempt's processes ([`Record`]).
    Process(u32, Record),
    /// One chunk of a command process's output, by the job id.
    Log {
        /// The attempt's number.
        attempt: u32,
        /// The process's rank.
        process: u32,
        /// The chunk's number, from 0.
        seq: u64,
    },
}

impl Item<'_> {
    fn key(&self, id: &str) -> String {
        match *self {
            Item::Spec => keys::job_spec(id),
            Item::Done => keys::job_done(id),
            Item::Notice => keys::job_suspend(id),
            Item::SuspendStep => keys::job_suspend_step(id),
            Item::Rendezvous => keys::job_rendezvous(id),
            Item::Array(name) => keys::job_array(id, name),
            Item::Report(step) => keys::job_report(id, step),
            Item::Checkpoint(step) => keys::job_checkpoint(id, step),
            Item::Process(index, record) => crate::attempt::key(id, index, record),
            Item::Log {
                attempt,
                process,
                seq,
            } => keys::job_log(id, attempt, process, seq),
        }
    }
}

/// A series a client follows from its start ([`Series::prefix`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    /// The job's state changes ([`crate::scheduler::JobEvent`], postcard).
    Events,
    /// The job's step reports (JSON).
    Reports,
}

impl Series {
    /// The prefix a watch of job `job`'s series follows (the watch streams
    /// of `tessel_kv` take a prefix; each value decodes as the series says).
    pub fn prefix(self, job: &str) -> String {
        match self {
            Series::Events => keys::sched_events(job),
            Series::Reports => keys::job_reports(job),
        }
    }
}

/// One log chunk ([`Records::logs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The process's rank.
    pub process: u32,
    /// The chunk's number.
    pub seq: u64,
    /// The bytes it holds.
    pub bytes: Vec<u8>,
}

/// The records of one job or attempt id.
#[derive(Clone, Copy)]
pub struct Records<'a> {
    kv: &'a dyn KvStore,
    id: &'a str,
}

impl<'a> Records<'a> {
    /// The records of job or attempt `id`.
    pub fn new(kv: &'a dyn KvStore, id: &'a str) -> Records<'a> {
        Records { kv, id }
    }

    /// The value of `item`, `None` while there is none.
    pub async fn get(&self, item: Item<'_>) -> Result<Option<Vec<u8>>, KvError> {
        match self.kv.try_get(item.key(self.id).as_bytes()).await {
            Ok(v) => Ok(Some(v)),
            Err(KvError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits up to `timeout` for `item` (`DeadlineExceeded` after it).
    pub async fn wait(&self, item: Item<'_>, timeout: Duration) -> Result<Vec<u8>, KvError> {
        self.kv.get(item.key(self.id).as_bytes(), timeout).await
    }

    /// Writes `item`, replacing what was there.
    pub async fn put(&self, item: Item<'_>, value: &[u8]) -> Result<(), KvError> {
        self.kv
            .put(item.key(self.id).as_bytes(), value)
            .await
            .map(drop)
    }

    /// Writes `item` unless it exists; invariant 2: the value in force.
    pub async fn first(&self, item: Item<'_>, value: &[u8]) -> Result<Vec<u8>, KvError> {
        let key = item.key(self.id);
        match self.kv.insert(key.as_bytes(), value).await {
            Ok(_) => Ok(value.to_vec()),
            Err(KvError::AlreadyExists(_)) => self.kv.try_get(key.as_bytes()).await,
            Err(e) => Err(e),
        }
    }

    /// Removes `item` (absent is fine).
    pub async fn delete(&self, item: Item<'_>) -> Result<(), KvError> {
        self.kv.delete(item.key(self.id).as_bytes()).await.map(drop)
    }

    /// The job's reports, in step order.
    pub async fn reports(&self) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        self.numbered(&keys::job_reports(self.id)).await
    }

    /// The job's state changes ([`Series::Events`]), in order.
    pub async fn events(&self) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        self.numbered(&Series::Events.prefix(self.id)).await
    }

    /// The job's checkpoint records, in step order.
    pub async fn checkpoints(&self) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        self.numbered(&keys::job_checkpoints(self.id)).await
    }

    /// The log chunks of attempt number `attempt`, of one process or all,
    /// in process then chunk order.
    pub async fn logs(&self, attempt: u32, process: Option<u32>) -> Result<Vec<LogEntry>, KvError> {
        let all = keys::job_logs(self.id, attempt, None);
        let pairs = self
            .kv
            .list(keys::job_logs(self.id, attempt, process).as_bytes())
            .await?;
        Ok(pairs
            .into_iter()
            .filter_map(|p| {
                let rest = std::str::from_utf8(&p.key).ok()?.strip_prefix(&all)?;
                let (process, seq) = rest.split_once('/')?;
                Some(LogEntry {
                    process: number(process, 5)? as u32,
                    seq: number(seq, 10)?,
                    bytes: p.value,
                })
            })
            .collect())
    }

    /// Invariant 1: the values under `prefix` whose key ends in a
    /// twelve-digit number.
    async fn numbered(&self, prefix: &str) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        let pairs = self.kv.list(prefix.as_bytes()).await?;
        let mut out: Vec<(u64, Vec<u8>)> = pairs
            .into_iter()
            .filter_map(|p| {
                let rest = std::str::from_utf8(&p.key).ok()?.strip_prefix(prefix)?;
                Some((number(rest, 12)?, p.value))
            })
            .collect();
        out.sort_by_key(|(n, _)| *n);
        Ok(out)
    }
}

/// Invariant 1: exactly `width` ASCII digits.
fn number(s: &str, width: usize) -> Option<u64> {
    (s.len() == width && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_kv::MemoryKv;

    #[tokio::test]
    async fn series_come_back_in_order_and_foreign_keys_are_skipped() {
        let kv = MemoryKv::new();
        let r = Records::new(&kv, "mlp.1");
        for step in [12, 3, 100] {
            r.put(Item::Report(step), step.to_string().as_bytes())
                .await
                .unwrap();
        }
        kv.put(b"jobs/mlp.1/reports/12x", b"odd").await.unwrap();
        kv.put(b"jobs/mlp.10/reports/000000000001", b"other job")
            .await
            .unwrap();
        let steps: Vec<u64> = r.reports().await.unwrap().iter().map(|p| p.0).collect();
        assert_eq!(steps, [3, 12, 100]);
        for (process, seq) in [(1, 0), (0, 1), (0, 0)] {
            let log = Item::Log {
                attempt: 2,
                process,
                seq,
            };
            r.put(log, b"x").await.unwrap();
        }
        let got: Vec<(u32, u64)> = r
            .logs(2, None)
            .await
            .unwrap()
            .iter()
            .map(|l| (l.process, l.seq))
            .collect();
        assert_eq!(got, [(0, 0), (0, 1), (1, 0)]);
        assert_eq!(r.logs(2, Some(1)).await.unwrap().len(), 1);
        assert!(r.logs(3, None).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn the_first_value_stays_in_force() {
        let kv = MemoryKv::new();
        let r = Records::new(&kv, "mlp.1@0");
        assert_eq!(r.get(Item::SuspendStep).await.unwrap(), None);
        assert_eq!(r.first(Item::SuspendStep, b"7").await.unwrap(), b"7");
        assert_eq!(r.first(Item::SuspendStep, b"9").await.unwrap(), b"7");
        r.delete(Item::SuspendStep).await.unwrap();
        assert_eq!(r.get(Item::SuspendStep).await.unwrap(), None);
    }
}
