//! [`KvState`] as a replica stores it: whole (snapshots, older files), or
//! without its leases plus a row per lease, where a flush writes only the
//! rows changed since the last one (invariant 11). A worker's heartbeat
//! changes its lease's row, not the whole state: at 16,384 workers the
//! whole state was most of what a flush wrote.

use super::*;

/// [`KvState`] as stored: its fields in order, without the index.
#[derive(Deserialize)]
pub(super) struct StateFields {
    limits: Limits,
    revision: u64,
    clock_ms: u64,
    next_lease: u64,
    leases: BTreeMap<u64, Lease>,
    barriers: BTreeMap<Vec<u8>, Barrier>,
    history_limit: u64,
}

impl From<StateFields> for KvState {
    fn from(f: StateFields) -> KvState {
        let expiry = expiry_index(&f.leases);
        KvState {
            limits: f.limits,
            revision: f.revision,
            clock_ms: f.clock_ms,
            next_lease: f.next_lease,
            leases: f.leases,
            barriers: f.barriers,
            history_limit: f.history_limit,
            expiry,
            changed_leases: BTreeSet::new(),
        }
    }
}

/// Replicas with the same leases, barriers and counters are equal, whatever
/// they have stored of them yet (`changed_leases`); `expiry` follows from
/// the leases.
impl PartialEq for KvState {
    fn eq(&self, other: &KvState) -> bool {
        self.limits == other.limits
            && self.revision == other.revision
            && self.clock_ms == other.clock_ms
            && self.next_lease == other.next_lease
            && self.leases == other.leases
            && self.barriers == other.barriers
            && self.history_limit == other.history_limit
    }
}

impl Eq for KvState {}

fn encoding(e: postcard::Error) -> KvError {
    KvError::Internal(format!("encoding the state: {e}"))
}

impl KvState {
    /// The stored form without the leases: it decodes as a `KvState` that
    /// has none, to which [`Self::add_stored_lease`] adds their rows. The
    /// leases are set aside while it is encoded (moving a map moves no
    /// lease), so the layout stays the one `KvState` derives.
    pub fn encode_without_leases(&mut self) -> Result<Vec<u8>> {
        let leases = std::mem::take(&mut self.leases);
        let encoded = postcard::to_allocvec(self);
        self.leases = leases;
        encoded.map_err(encoding)
    }

    /// The leases changed since the last call (invariant 11), each as
    /// `(id, its row)`, `None` for one that is gone.
    pub fn take_changed_leases(&mut self) -> Result<Vec<(u64, Option<Vec<u8>>)>> {
        let changed = std::mem::take(&mut self.changed_leases);
        changed
            .into_iter()
            .map(|id| {
                let row = self.leases.get(&id).map(postcard::to_allocvec).transpose();
                Ok((id, row.map_err(encoding)?))
            })
            .collect()
    }

    /// Counts every lease as changed: the next rows taken are all of them
    /// (a state read whole, from a snapshot or an older file).
    pub fn mark_all_leases_changed(&mut self) {
        self.changed_leases = self.leases.keys().copied().collect();
    }

    /// Adds lease `id` from its row (as [`Self::take_changed_leases`] gave
    /// it) to this state.
    pub fn add_stored_lease(&mut self, id: u64, row: &[u8]) -> Result<()> {
        let lease: Lease = postcard::from_bytes(row)
            .map_err(|e| KvError::Storage(format!("lease {id}'s stored row: {e}")))?;
        self.expiry.insert((lease.expires_at_ms, id));
        self.leases.insert(id, lease);
        Ok(())
    }
}
