//! What the processes of one attempt publish, typed: the only code that
//! builds or parses the per-process keys
//! (`jobs/{attempt}/processes/{index:05}/{record}`). The worker publishes
//! through it, the scheduler observes through it, and the client reads
//! results through it, so no one matches a key suffix.
//!
//! Invariants:
//! 1. A key is parsed whole: `processes/`, a five-digit index, one record
//!    name; anything else under the prefix is ignored, never miscounted.
//! 2. Each record of a process is written once per attempt by that
//!    process (the replicas check its worker's assignment).

use std::collections::BTreeMap;

use tessel_kv::KvStore;

use crate::error::{CoordinatorError, Result};
use crate::keys;

/// One of a process's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Record {
    /// SHA-256 (hex) of the global topology it holds.
    Topology,
    /// It passed the transfer barrier (its time in ms).
    TransferReady,
    /// What its run of the plan ended with (JSON).
    Result,
    /// The failure it observed.
    FailureSeen,
    /// Its host and slice.
    Host,
}

impl Record {
    fn name(self) -> &'static str {
        match self {
            Record::Topology => "topology",
            Record::TransferReady => "transfer_ready",
            Record::Result => "result",
            Record::FailureSeen => "failure_seen",
            Record::Host => "host",
        }
    }

    fn parse(s: &str) -> Option<Record> {
        [
            Record::Topology,
            Record::TransferReady,
            Record::Result,
            Record::FailureSeen,
            Record::Host,
        ]
        .into_iter()
        .find(|r| r.name() == s)
    }
}

/// The key of process `index`'s `record` in `attempt`.
pub fn key(attempt: &str, index: u32, record: Record) -> String {
    format!("jobs/{attempt}/processes/{index:05}/{}", record.name())
}

/// The prefix of every process's records of `attempt` (what a watch of
/// them follows; [`parse`] reads its keys).
pub fn prefix(attempt: &str) -> String {
    keys::process_topologies(attempt)
}

/// Invariant 1: `(index, record)` of a key under [`prefix`].
pub fn parse(attempt: &str, key: &[u8]) -> Option<(u32, Record)> {
    let rest = std::str::from_utf8(key)
        .ok()?
        .strip_prefix(&keys::process_topologies(attempt))?;
    let (index, record) = rest.split_once('/')?;
    if index.len() != 5 || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((index.parse().ok()?, Record::parse(record)?))
}

/// Writes process `index`'s `record` in `attempt`.
pub async fn publish(
    kv: &dyn KvStore,
    attempt: &str,
    index: u32,
    record: Record,
    value: &[u8],
) -> Result<()> {
    kv.put(key(attempt, index, record).as_bytes(), value)
        .await
        .map(drop)
        .map_err(CoordinatorError::kv(format!(
            "publishing process {index}'s {}",
            record.name()
        )))
}

/// Every process's records of `attempt`, by record, then process index.
pub async fn published(kv: &dyn KvStore, attempt: &str) -> Result<Published> {
    let mut out = Published::default();
    for pair in kv
        .list(keys::process_topologies(attempt).as_bytes())
        .await
        .map_err(CoordinatorError::kv("listing the attempt's processes"))?
    {
        if let Some((index, record)) = parse(attempt, &pair.key) {
            out.records
                .entry(record)
                .or_default()
                .insert(index, pair.value);
        }
    }
    Ok(out)
}

/// What an attempt's processes published ([`published`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Published {
    records: BTreeMap<Record, BTreeMap<u32, Vec<u8>>>,
}

impl Published {
    /// How many processes published `record`.
    pub fn count(&self, record: Record) -> u32 {
        self.records.get(&record).map_or(0, |m| m.len() as u32)
    }

    /// The values of `record`, in process order.
    pub fn values(&self, record: Record) -> impl Iterator<Item = (u32, &[u8])> {
        self.records
            .get(&record)
            .into_iter()
            .flat_map(|m| m.iter().map(|(i, v)| (*i, v.as_slice())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_nothing_else_is_counted() {
        let k = key("mlp.3@2", 7, Record::Result);
        assert_eq!(k, "jobs/mlp.3@2/processes/00007/result");
        assert_eq!(parse("mlp.3@2", k.as_bytes()), Some((7, Record::Result)));
        for other in [
            "jobs/mlp.3@2/processes/00007/result/x",
            "jobs/mlp.3@2/processes/7/result",
            "jobs/mlp.3@2/processes/00007/my_result",
            "jobs/mlp.3@20/processes/00007/result",
        ] {
            assert_eq!(parse("mlp.3@2", other.as_bytes()), None, "{other}");
        }
    }

    #[tokio::test]
    async fn published_records_are_grouped_by_record_in_process_order() {
        let kv = tessel_kv::MemoryKv::new();
        for i in [2, 0, 1] {
            publish(&kv, "a@1", i, Record::TransferReady, b"1.0")
                .await
                .unwrap();
        }
        publish(&kv, "a@1", 1, Record::Result, b"{}").await.unwrap();
        kv.put(b"jobs/a@1/processes/00003/resultx", b"")
            .await
            .unwrap();
        let p = published(&kv, "a@1").await.unwrap();
        assert_eq!(p.count(Record::TransferReady), 3);
        assert_eq!(p.count(Record::Result), 1);
        let order: Vec<u32> = p.values(Record::TransferReady).map(|(i, _)| i).collect();
        assert_eq!(order, [0, 1, 2]);
    }
}
