//! The replica's end of a lease keep-alive stream (etcd's `LeaseKeepAlive`):
//! one long-lived stream per client carries all its keep-alives, so a
//! keep-alive costs a frame each way, not a stream of its own with its
//! task, its set-up and its end (`wire` module docs).
//!
//! Invariants:
//! 1. A frame is answered from memory only where a request would be
//!    (`renewals` invariants 1 and 5: once the leadership is confirmed)
//!    and only by the leader; a follower relays it
//!    to the leader (`relay`); every other frame is answered `Unavailable`,
//!    and the client sends that keep-alive as a request, which takes the
//!    usual path (node invariant 1).
//! 2. Answers go in the order of the frames, one each; up to [`IN_FLIGHT`]
//!    frames may wait for theirs, the stream is not read further meanwhile.
//! 3. A frame over [`KEEP_ALIVE_MAX_FRAME`] or one that does not decode ends
//!    this stream alone (`rpc` invariant 1); so does the caller going away.
//! 4. The stream is read and answered on the replica's QUIC thread (`rpc`
//!    invariant 6), where its packets arrive: a relayed keep-alive wakes
//!    the replica's runtime once a batch, not twice a frame (its frame's
//!    arrival, then its answer's write). Nothing there takes the state's
//!    lock, which an apply holds: the leader's own answers are made on the
//!    replica's runtime. The stream's task ends with the request's task on
//!    that runtime, so a replica stopped with its runtime serves nothing.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use quinn::{RecvStream, SendStream, VarInt};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};

use super::{unavailable, ReplicaHandler};
use crate::rpc::{self, ReadError};
use crate::wire::{
    self, KeepAliveFrame, WireResponse, KEEP_ALIVE_MAX_FRAME, RENEW_MANY_MAX,
    RESET_FRAME_TOO_LARGE, RESET_MALFORMED,
};
use tessel_kv::state::{KvState, Output};
use tessel_kv::KvError;

/// Frames of one stream waiting for their answers (invariant 2): a
/// bound on what one client holds. A worker has a lease or two, but a
/// client may carry many hosts' leases (the benchmark's simulated hosts,
/// 128 to a connection): a stream answers at most this many frames per
/// relay round trip, and at 64, 128 leases a second on a stream whose
/// relayed batches took a second (seen at 16,384 hosts) fell behind for
/// good.
const IN_FLIGHT: usize = 1024;

/// A frame's answer: made on the replica's runtime (invariant 4), or on its
/// way back from the leader.
enum Pending {
    Answering(JoinHandle<Result<Output, KvError>>),
    Relayed(oneshot::Receiver<Result<Output, KvError>>),
}

impl Pending {
    async fn answer(self) -> Result<Output, KvError> {
        match self {
            Pending::Answering(task) => task
                .await
                .unwrap_or_else(|_| Err(unavailable("the replica's runtime stopped"))),
            Pending::Relayed(rx) => rx
                .await
                .unwrap_or_else(|_| Err(unavailable("the relay to the leader ended"))),
        }
    }
}

/// Serves one keep-alive stream on the QUIC thread until its caller
/// finishes or drops it (invariant 4); called on the replica's runtime.
pub(super) async fn serve_on_quic_thread(
    handler: Arc<ReplicaHandler>,
    mut send: SendStream,
    recv: RecvStream,
) {
    let runtime = Handle::current();
    let quic = handler.quic.clone();
    // Dropped with the request's task, the set aborts the stream's.
    let mut served = JoinSet::new();
    served.spawn_on(
        async move {
            serve(&handler, &runtime, &mut send, recv).await;
            let _ = send.finish();
        },
        quic.handle(),
    );
    let _ = served.join_next().await;
}

/// Serves one keep-alive stream until its caller finishes or drops it.
async fn serve(
    handler: &Arc<ReplicaHandler>,
    runtime: &Handle,
    send: &mut SendStream,
    mut recv: RecvStream,
) {
    let (pending, mut answers) = mpsc::channel::<Pending>(IN_FLIGHT);
    // Reads frames until the stream ends; a bad one's reset code.
    let read = async move {
        // Dropped when reading ends, so that `write` ends once it has
        // answered every frame read.
        let pending = pending;
        loop {
            let body = match rpc::read_frame(&mut recv, KEEP_ALIVE_MAX_FRAME).await {
                Ok(Some(b)) => b,
                Ok(None) | Err(ReadError::Io(_)) => return None,
                Err(ReadError::Frame(e)) => {
                    tracing::warn!("ending a keep-alive stream: {e}");
                    let _ = recv.stop(VarInt::from_u32(RESET_FRAME_TOO_LARGE));
                    return Some(RESET_FRAME_TOO_LARGE);
                }
            };
            let Ok(frame) = wire::decode::<KeepAliveFrame>(&body) else {
                tracing::warn!("ending a keep-alive stream: an undecodable frame");
                let _ = recv.stop(VarInt::from_u32(RESET_MALFORMED));
                return Some(RESET_MALFORMED);
            };
            if pending
                .send(handler.renew_on_stream(frame.lease, runtime))
                .await
                .is_err()
            {
                return None;
            }
        }
    };
    let write = async {
        while let Some(p) = answers.recv().await {
            let answer = WireResponse::Output(p.answer().await);
            if rpc::write_frame(send, &answer).await.is_err() {
                return;
            }
        }
    };
    let mut ended = None;
    {
        tokio::pin!(read, write);
        let mut reading = true;
        loop {
            tokio::select! {
                // After the caller's end, the frames read are still
                // answered (the sender went with `read`).
                e = &mut read, if reading => {
                    reading = false;
                    ended = e;
                    if ended.is_some() {
                        break;
                    }
                }
                () = &mut write => break,
            }
        }
    }
    if let Some(code) = ended {
        let _ = send.reset(VarInt::from_u32(code));
    }
}

impl ReplicaHandler {
    /// Invariants 1 and 4.
    fn renew_on_stream(self: &Arc<Self>, lease: u64, runtime: &Handle) -> Pending {
        let leader = self.raft.metrics().borrow().current_leader;
        if leader.is_some_and(|l| l != self.id) {
            return Pending::Relayed(self.relay.ask(lease));
        }
        let me = self.clone();
        Pending::Answering(runtime.spawn(async move { me.renew_one(lease).await }))
    }

    /// One keep-alive, as [`Self::renew_many`] answers it: on a stream, or
    /// sent as a request to a leader whose term's `RenewLeases` committed.
    pub(super) async fn renew_one(&self, lease: u64) -> Result<Output, KvError> {
        self.renew_many(&[lease])
            .await
            .pop()
            .expect("one answer a lease")
    }

    /// The leader's answers to a follower's batch (`relay`) or to one
    /// keep-alive, in order: from memory where it may (invariant 1), once
    /// its leadership is confirmed (`renewals` invariant 5), as of their
    /// arrival (`renewals` invariant 6); else `Unavailable` each.
    pub(super) async fn renew_many(&self, leases: &[u64]) -> Vec<Result<Output, KvError>> {
        let refused = |why: KvError| vec![Err(why); leases.len()];
        if leases.len() > RENEW_MANY_MAX {
            return refused(unavailable("a batch over the limit"));
        }
        let arrived = self.leases.clock.now_ms();
        let renew = |s: &KvState| -> Vec<Result<Output, KvError>> {
            leases
                .iter()
                .map(|&id| self.leases.renewals.keep_alive(s, id, arrived))
                .collect()
        };
        // At once where this replica may (it leads: a follower is never
        // fresh, `quorum` invariant 2).
        if !self.may_renew_from_memory() {
            // `renewals` invariant 6: noted now, so that the proposals made
            // while the confirmation is awaited extend these leases; the
            // answers wait for it, and are read from the state as it is
            // then (a lease revoked meanwhile is gone).
            self.applied.read(|s, _| renew(s));
            if let Err(e) = self.confirmed_for_renewals().await {
                return refused(e);
            }
        }
        self.applied.read(|s, _| renew(s))
    }

    /// `renewals` invariant 5: returns once this leader, its term's
    /// `RenewLeases` committed, has a majority's recent acknowledgement (at
    /// once, or at the next one: `quorum` `confirmed`); `Unavailable` where
    /// it may not renew from memory, or when no acknowledgement came within
    /// the leader lease.
    async fn confirmed_for_renewals(&self) -> Result<(), KvError> {
        let refused = || {
            unavailable(
                "this replica does not renew leases from memory now: send the keep-alive as a request",
            )
        };
        let (term, leader) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.current_term, m.current_leader)
        };
        if leader != Some(self.id) || self.leases_renewed.load(Ordering::Acquire) != term {
            return Err(refused());
        }
        self.quorum.confirmed(term).await?;
        if !self.may_renew_from_memory() {
            return Err(refused());
        }
        Ok(())
    }
}
