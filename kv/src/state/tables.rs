//! Where a [`KvState`]'s pairs and events live: the [`Tables`] traits, and
//! their in-memory form ([`MemTables`], [`MemState`]).

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::*;

/// Where the key-value pairs and the recent events of a [`KvState`] live:
/// in memory ([`MemTables`]) or in the replica's redb file
/// (`raft::sm::SmTables`). Reads; see [`TablesMut`] for writes.
///
/// Storage failures are `KvError::Storage`; every other error is the
/// caller's.
pub trait Tables {
    /// The pair at `key`, if any.
    fn get(&self, key: &[u8]) -> Result<Option<KeyValue>>;
    /// All pairs whose key starts with `prefix`, in key order.
    fn list(&self, prefix: &[u8]) -> Result<Vec<KeyValue>>;
    /// How many keys there are.
    fn count(&self) -> Result<u64>;
    /// Recorded events with revision >= `from` under `prefix`, in order.
    fn events(&self, from: u64, prefix: &[u8]) -> Result<Vec<Event>>;
    /// Client session `client`, if it is kept.
    fn session(&self, client: u128) -> Result<Option<ClientSession>>;
    /// The sessions whose last write is before `before_ms`.
    fn idle_sessions(&self, before_ms: u64) -> Result<Vec<u128>>;
}

/// The writes [`KvState::apply`] makes.
pub trait TablesMut: Tables {
    /// Writes a pair, replacing any at its key; `created`: no pair was
    /// there (tables keep their key count from it, as counting by
    /// scanning made every status probe cost as much as the keys written).
    fn insert(&mut self, kv: &KeyValue, created: bool) -> Result<()>;
    /// Whether the key was there.
    fn remove(&mut self, key: &[u8]) -> Result<bool>;
    /// Records the events of one revision (all carry `revision`).
    fn record(&mut self, revision: u64, events: &[Event]) -> Result<()>;
    /// Drops recorded events with revisions below `revision`.
    fn forget_below(&mut self, revision: u64) -> Result<()>;
    /// Keeps (`Some`) or forgets (`None`) client session `client`.
    fn set_session(&mut self, client: u128, session: Option<ClientSession>) -> Result<()>;
    /// Client session `client`, if it is kept, to change in place: a
    /// session holds an answer per call in flight, and copying it out
    /// and back for every call cost as much as the calls its client had
    /// in flight (`sessions` invariant 5).
    fn session_mut(&mut self, client: u128) -> Result<Option<&mut ClientSession>>;
}

/// Tables in memory: the test double's and the unit tests' storage.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemTables {
    data: BTreeMap<Vec<u8>, KeyValue>,
    history: VecDeque<Event>,
    sessions: BTreeMap<u128, ClientSession>,
}

impl Tables for MemTables {
    fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        Ok(self.data.get(key).cloned())
    }

    fn list(&self, prefix: &[u8]) -> Result<Vec<KeyValue>> {
        Ok(self
            .data
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect())
    }

    fn count(&self) -> Result<u64> {
        Ok(self.data.len() as u64)
    }

    fn events(&self, from: u64, prefix: &[u8]) -> Result<Vec<Event>> {
        Ok(self
            .history
            .iter()
            .filter(|e| e.revision() >= from && e.key().starts_with(prefix))
            .cloned()
            .collect())
    }

    fn session(&self, client: u128) -> Result<Option<ClientSession>> {
        Ok(self.sessions.get(&client).cloned())
    }

    fn idle_sessions(&self, before_ms: u64) -> Result<Vec<u128>> {
        Ok(self
            .sessions
            .iter()
            .filter(|(_, s)| s.last_ms < before_ms)
            .map(|(c, _)| *c)
            .collect())
    }
}

impl TablesMut for MemTables {
    fn insert(&mut self, kv: &KeyValue, _created: bool) -> Result<()> {
        self.data.insert(kv.key.clone(), kv.clone());
        Ok(())
    }

    fn remove(&mut self, key: &[u8]) -> Result<bool> {
        Ok(self.data.remove(key).is_some())
    }

    fn record(&mut self, _revision: u64, events: &[Event]) -> Result<()> {
        self.history.extend(events.iter().cloned());
        Ok(())
    }

    fn forget_below(&mut self, revision: u64) -> Result<()> {
        while self
            .history
            .front()
            .is_some_and(|e| e.revision() < revision)
        {
            self.history.pop_front();
        }
        Ok(())
    }

    fn set_session(&mut self, client: u128, session: Option<ClientSession>) -> Result<()> {
        match session {
            Some(s) => self.sessions.insert(client, s),
            None => self.sessions.remove(&client),
        };
        Ok(())
    }

    fn session_mut(&mut self, client: u128) -> Result<Option<&mut ClientSession>> {
        Ok(self.sessions.get_mut(&client))
    }
}

/// A [`KvState`] with its tables in memory: the whole state of the
/// in-memory test double, and what the unit tests and fuzz targets drive.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemState {
    /// Revision, clock, leases and barriers.
    pub state: KvState,
    /// The pairs and recent events.
    pub tables: MemTables,
}

impl MemState {
    /// An empty state with `limits`, keeping `history_limit` revisions of events.
    pub fn new(limits: Limits, history_limit: usize) -> MemState {
        MemState {
            state: KvState::new(limits, history_limit),
            tables: MemTables::default(),
        }
    }

    /// [`KvState::apply`]; memory cannot fail.
    pub fn apply(&mut self, req: &Request) -> (Result<Output>, Vec<Event>) {
        self.state
            .apply(&mut self.tables, req)
            .expect("memory tables never fail")
    }

    /// The pair at `key`.
    pub fn get(&self, key: &[u8]) -> Option<KeyValue> {
        self.tables.data.get(key).cloned()
    }

    /// The pairs under `prefix`, in key order.
    pub fn list(&self, prefix: &[u8]) -> Vec<KeyValue> {
        self.tables.list(prefix).expect("memory tables never fail")
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.tables.data.len()
    }

    /// Whether there is no key.
    pub fn is_empty(&self) -> bool {
        self.tables.data.is_empty()
    }

    /// The revision of the last change.
    pub fn revision(&self) -> u64 {
        self.state.revision()
    }

    /// Retained events with revision >= `from` under `prefix`.
    pub fn events_since(&self, from: u64, prefix: &[u8]) -> Result<Vec<Event>> {
        self.state.events_since(&self.tables, from, prefix)
    }

    /// Where barrier `id` stands, while the state remembers it.
    pub fn barrier(&self, id: &[u8]) -> Option<&BarrierStatus> {
        self.state.barrier(id)
    }
}
