//! The leader's end of a lease keep-alive stream (etcd's `LeaseKeepAlive`):
//! one long-lived stream per client carries all its keep-alives, so a
//! keep-alive costs a frame each way, not a stream of its own with its
//! task, its set-up and its end (`wire` module docs).
//!
//! Invariants:
//! 1. A frame is answered from memory only where a request would be
//!    (`renewals` invariant 1) and only by the leader; every other frame
//!    is answered `Unavailable`, and the client sends that keep-alive as a
//!    request, which takes the usual path (node invariant 1).
//! 2. Answers go in the order of the frames, one each.
//! 3. A frame over [`KEEP_ALIVE_MAX_FRAME`] or one that does not decode ends
//!    this stream alone (`rpc` invariant 1); so does the caller going away.

use quinn::{RecvStream, SendStream, VarInt};

use super::{unavailable, ReplicaHandler};
use crate::rpc::{self, ReadError};
use crate::wire::{
    self, KeepAliveFrame, WireResponse, KEEP_ALIVE_MAX_FRAME, RESET_FRAME_TOO_LARGE,
    RESET_MALFORMED,
};
use tessel_kv::state::Output;
use tessel_kv::KvError;

/// Serves one keep-alive stream until its caller finishes or drops it.
pub(super) async fn serve(handler: &ReplicaHandler, send: &mut SendStream, mut recv: RecvStream) {
    loop {
        let body = match rpc::read_frame(&mut recv, KEEP_ALIVE_MAX_FRAME).await {
            Ok(Some(b)) => b,
            Ok(None) | Err(ReadError::Io(_)) => return,
            Err(ReadError::Frame(e)) => {
                tracing::warn!("ending a keep-alive stream: {e}");
                let _ = recv.stop(VarInt::from_u32(RESET_FRAME_TOO_LARGE));
                let _ = send.reset(VarInt::from_u32(RESET_FRAME_TOO_LARGE));
                return;
            }
        };
        let answer = match wire::decode::<KeepAliveFrame>(&body) {
            Ok(f) => handler.renew_on_stream(f.lease),
            Err(e) => {
                tracing::warn!("ending a keep-alive stream: {e}");
                let _ = recv.stop(VarInt::from_u32(RESET_MALFORMED));
                let _ = send.reset(VarInt::from_u32(RESET_MALFORMED));
                return;
            }
        };
        if rpc::write_frame(send, &WireResponse::Output(answer))
            .await
            .is_err()
        {
            return;
        }
    }
}

impl ReplicaHandler {
    /// Invariant 1.
    fn renew_on_stream(&self, lease: u64) -> Result<Output, KvError> {
        let leads = self.raft.metrics().borrow().current_leader == Some(self.id);
        if !(leads && self.may_renew_from_memory()) {
            return Err(unavailable(
                "this replica does not renew leases from memory now: send the keep-alive as a request",
            ));
        }
        self.renew_from_memory(lease)
    }

    /// Renews lease `id` now, in memory (where `may_renew_from_memory`
    /// says so): for a keep-alive on a stream and one sent as a request.
    pub(super) fn renew_from_memory(&self, id: u64) -> Result<Output, KvError> {
        let now = self.clock.now_ms();
        self.applied
            .read(|s, _| self.renewals.keep_alive(s, id, now))
    }
}
