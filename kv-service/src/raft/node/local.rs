//! A replica's own process as a client of it, with no network between:
//! [`LocalKv`] hands requests to the replica's router (the same one its
//! QUIC server uses), and [`Answers`] carries the answers back either on a
//! QUIC stream or on a channel. The coordinator's monitor and scheduler run
//! on it, so no component dials its own process (and no certificate has to
//! name an address for that).
//!
//! Invariants:
//! 1. A local request takes the path a remote one takes after its
//!    authorization: led here when this replica leads, forwarded once to
//!    the leader otherwise (node invariant 1). It acts with the replica's
//!    own authority, which is the coordinator's.
//! 2. `Unavailable` is retried with backoff until the request's wait plus
//!    the client's retry budget; a watch resumes after its last event, and
//!    gives up after a budget of streams that each broke within it (one
//!    that served a whole budget, quiet or not, starts the count again).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use quinn::SendStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::ReplicaHandler;
use crate::raft::client::{retryable, unexpected, KvClient, Transport, RETRY_BUDGET};
use crate::rpc;
use crate::wire::{self, ClientRequest, WireResponse};
use tessel_kv::{KvError, Result, WatchStream};

/// Where a request's answer frames go.
pub(super) enum Answers<'a> {
    /// A QUIC stream: a client or a peer replica.
    Stream(&'a mut SendStream),
    /// This process's own services ([`LocalKv`]).
    Local(mpsc::Sender<WireResponse>),
}

impl Answers<'_> {
    /// Sends one answer; an error means the asker is gone. Boxed: the
    /// write is 0.9 KB, and every request's future held room for it for
    /// as long as the request waited (a blocking get, a watch; a leader
    /// held 80,000 such futures at 16,384 hosts).
    pub(super) fn frame(
        &mut self,
        r: WireResponse,
    ) -> BoxFuture<'_, std::result::Result<(), String>> {
        Box::pin(async move {
            match self {
                Answers::Stream(s) => rpc::write_frame(s, &r).await,
                Answers::Local(tx) => tx.send(r).await.map_err(|_| "the asker left".into()),
            }
        })
    }

    /// Relays one encoded answer of the leader's.
    pub(super) async fn relay(&mut self, body: Vec<u8>) -> std::result::Result<(), String> {
        match self {
            Answers::Stream(s) => {
                // `rpc` invariant 5: the body itself, not a copy.
                let len = (body.len() as u32).to_be_bytes();
                let mut chunks = [
                    bytes::Bytes::copy_from_slice(&len),
                    bytes::Bytes::from(body),
                ];
                s.write_all_chunks(&mut chunks)
                    .await
                    .map_err(|e| e.to_string())
            }
            Answers::Local(_) => {
                let r = wire::decode::<WireResponse>(&body).map_err(|e| e.to_string())?;
                self.frame(r).await
            }
        }
    }
}

/// Requests handed to a replica in this process.
#[derive(Clone)]
pub struct InProcess {
    handler: Arc<ReplicaHandler>,
}

/// A [`tessel_kv::KvStore`] on a replica of this process
/// ([`super::Replica::local_client`]).
pub type LocalKv = KvClient<InProcess>;

impl InProcess {
    pub(super) fn new(handler: Arc<ReplicaHandler>) -> InProcess {
        InProcess { handler }
    }

    /// Invariant 1: the answers to `req`, as the router gives them.
    fn open(&self, req: ClientRequest) -> mpsc::Receiver<WireResponse> {
        let (tx, rx) = mpsc::channel(16);
        let handler = self.handler.clone();
        tokio::spawn(async move { handler.route(req, &mut Answers::Local(tx), false).await });
        rx
    }
}

const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

#[async_trait::async_trait]
impl Transport for InProcess {
    async fn request(&self, req: ClientRequest, wait: Duration) -> Result<WireResponse> {
        let deadline = Instant::now() + wait + RETRY_BUDGET;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let answer = self.open(req.clone()).recv().await.ok_or_else(|| {
                KvError::Unavailable("the replica of this process stopped".into())
            })?;
            // Invariant 2.
            match retryable(&answer) {
                Some(e) if Instant::now() + backoff >= deadline => return Err(e),
                Some(_) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                None => return Ok(answer),
            }
        }
    }

    async fn watch(&self, prefix: &[u8], from: u64) -> Result<WatchStream> {
        let st = WatchState {
            transport: self.clone(),
            prefix: prefix.to_vec(),
            next_from: from,
            rx: None,
            opened: Instant::now(),
            unavailable_since: None,
        };
        Ok(futures::stream::unfold(st, |mut st| async move {
            loop {
                let rx = match &mut st.rx {
                    Some(rx) => rx,
                    None => {
                        st.opened = Instant::now();
                        st.rx.insert(st.transport.open(ClientRequest::Watch {
                            prefix: st.prefix.clone(),
                            from: st.next_from,
                        }))
                    }
                };
                match rx.recv().await {
                    Some(WireResponse::Event(Ok(e))) => {
                        st.unavailable_since = None;
                        st.next_from = e.revision() + 1;
                        return Some((Ok(e), st));
                    }
                    Some(WireResponse::Event(Err(e))) if !matches!(e, KvError::Unavailable(_)) => {
                        return Some((Err(e), st))
                    }
                    Some(WireResponse::Event(Err(_))) | None => {
                        // Invariant 2: again from the next revision (an
                        // `Unavailable`, or a forward to the leader that
                        // broke off). A stream that lived a whole budget
                        // was serving: its break starts a new count.
                        if st.opened.elapsed() >= RETRY_BUDGET {
                            st.unavailable_since = None;
                        }
                        let since = *st.unavailable_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= RETRY_BUDGET {
                            let e = KvError::Unavailable("watch: no leader answers".into());
                            return Some((Err(e), st));
                        }
                        st.rx = None;
                        tokio::time::sleep(MAX_BACKOFF).await;
                    }
                    Some(other) => return Some((Err(unexpected(other)), st)),
                }
            }
        })
        .boxed())
    }
}

struct WatchState {
    transport: InProcess,
    prefix: Vec<u8>,
    next_from: u64,
    rx: Option<mpsc::Receiver<WireResponse>>,
    /// When `rx` was opened.
    opened: Instant,
    /// Since when only `Unavailable` (or broken streams) came.
    unavailable_since: Option<Instant>,
}
