//! Reads on the leader: linearizable ones, and guarded ones.
//!
//! Invariants:
//! 1. A read waits for a majority's recent acknowledgement (`quorum`) and
//!    for the read floor (the leader's whole log as of its first read in
//!    the term), so it never sees less than the leader acknowledged (node
//!    invariant 2; `raft` module docs, "Reads").
//! 2. A guarded read (`authz` invariant 4) goes ahead once linearizable and
//!    only if its guard holds.

use std::time::Duration;

use futures::future::BoxFuture;
use openraft::BasicNode;
use tessel_kv::state::Guard;
use tessel_kv::KvError;

use super::{unavailable, ReplicaHandler};
use crate::wire::ClientRequest;

/// How long a linearizable read waits for its floor to be applied.
const READ_FLOOR_WAIT: Duration = Duration::from_secs(2);

impl ReplicaHandler {
    /// Invariant 1. Boxed: the wait is 1 KB, and a request's future holds
    /// the room for it as long as the request waits after it (a blocking
    /// get, a watch).
    pub(super) fn linearizable(&self) -> BoxFuture<'_, Result<(), KvError>> {
        Box::pin(self.confirm_linearizable())
    }

    async fn confirm_linearizable(&self) -> Result<(), KvError> {
        let failed = |e: String| unavailable(format!("linearizable read: {e}"));
        // A majority's recent acknowledgement confirms leadership: its
        // members refuse other candidates for the leader lease after it
        // (`quorum` invariant 3), so no round of AppendEntries per read.
        let term_now = self.raft.metrics().borrow().current_term;
        self.quorum
            .confirmed(term_now)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (term, last_log, applied) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let applied = m.last_applied.map_or(0, |l| l.index);
            (m.current_term, m.last_log_index.unwrap_or(0), applied)
        };
        let floor = {
            let mut f = self.read_floor.lock().expect("not poisoned");
            match *f {
                Some((t, index)) if t == term => index,
                _ => {
                    *f = Some((term, last_log));
                    last_log
                }
            }
        };
        if applied >= floor {
            return Ok(());
        }
        let raft = self.raft.clone();
        let floor_reached = move |m: &openraft::RaftMetrics<u64, BasicNode>| {
            m.current_term != term || m.last_applied.is_some_and(|l| l.index >= floor)
        };
        raft.wait(Some(READ_FLOOR_WAIT))
            .metrics(floor_reached, "the read floor")
            .await
            .map_err(|e| failed(e.to_string()))?;
        // Still the leader of that term once the floor is applied.
        if self.raft.metrics().borrow().current_term != term {
            return Err(failed("leadership moved while reading".into()));
        }
        Ok(())
    }

    /// Invariant 2: `request`, once `guard` holds; else the request back
    /// with why.
    pub(super) async fn unguard(
        &self,
        guard: Guard,
        request: ClientRequest,
    ) -> Result<ClientRequest, (ClientRequest, KvError)> {
        let holds = match self.linearizable().await {
            Ok(()) => self.applied.read(|_, t| guard.holds(t)),
            Err(e) => Err(e),
        };
        match holds {
            Ok(true) => Ok(request),
            Ok(false) => {
                let key = match &request {
                    ClientRequest::Get { key, .. }
                    | ClientRequest::GetSerializable { key, .. }
                    | ClientRequest::TryGet { key } => key.clone(),
                    ClientRequest::List { prefix }
                    | ClientRequest::ListAt { prefix }
                    | ClientRequest::Watch { prefix, .. } => prefix.clone(),
                    _ => Vec::new(),
                };
                let e = guard.refusal("read", &key);
                Err((request, e))
            }
            Err(e) => Err((request, e)),
        }
    }
}
