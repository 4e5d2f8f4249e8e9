//! The client side: one pooled connection per peer (invariant 2), calls
//! bounded by their deadline and by the peer's silence (invariant 4), and
//! peers known by a DNS name.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use quinn::{Endpoint, RecvStream, SendStream};

use super::silence::silent_reason;
use super::{read_frame_from, take_end, write_frame, Link, NetError, ReadError};
use crate::wire::{self, WireRequest, WireResponse};
use tessel_tls::server_name;

/// A client endpoint with one pooled connection per peer.
#[derive(Clone)]
pub struct PeerClient {
    endpoint: Endpoint,
    conns: Arc<Mutex<HashMap<SocketAddr, Link>>>,
    /// The dial under way to each peer, shared by every call that finds no
    /// connection meanwhile (invariant 2).
    dials: Arc<Mutex<HashMap<SocketAddr, Dial>>>,
    /// The DNS name each address was resolved from: dialed as the server
    /// name, which the peer's certificate must name.
    names: Arc<Mutex<HashMap<SocketAddr, String>>>,
}

/// `HOST:PORT` with a port, `HOST` a DNS name or an IP (`[v6]:port`).
pub fn check_host_port(target: &str) -> Result<(), String> {
    match target.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err("expected HOST:PORT".into()),
    }
}

/// A dial under way: its outcome for every call that waits for it, the
/// connection or why there is none.
type Dial = Shared<BoxFuture<'static, Result<Link, String>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PeerClient {
    /// A client on `endpoint`, whose default client config is set.
    pub fn new(endpoint: Endpoint) -> PeerClient {
        PeerClient {
            endpoint,
            conns: Arc::default(),
            dials: Arc::default(),
            names: Arc::default(),
        }
    }

    /// The address `target` (`HOST:PORT`) names now: an IP as is, a DNS
    /// name looked up (and remembered as the name to dial it by).
    pub async fn resolve(&self, target: &str) -> Result<SocketAddr, NetError> {
        if let Ok(a) = target.parse::<SocketAddr>() {
            return Ok(a);
        }
        let unresolved = |reason: String| NetError::Resolve {
            target: target.to_owned(),
            reason,
        };
        check_host_port(target).map_err(unresolved)?;
        let addr = tokio::net::lookup_host(target)
            .await
            .map_err(|e| unresolved(e.to_string()))?
            .next()
            .ok_or_else(|| unresolved("no address".into()))?;
        let host = target.rsplit_once(':').map_or(target, |(h, _)| h);
        lock(&self.names).insert(addr, host.trim_matches(['[', ']']).to_owned());
        Ok(addr)
    }

    /// The pooled connection to `addr` while it is open.
    fn pooled(&self, addr: SocketAddr) -> Option<Link> {
        let conns = lock(&self.conns);
        conns
            .get(&addr)
            .filter(|c| c.close_reason().is_none())
            .cloned()
    }

    /// The pooled connection to `addr`, or a new one, pooled (invariant 2).
    /// The calls that find none while one is dialed wait for that dial:
    /// each dialing its own, the simulated hosts of a 1,024- and a
    /// 16,384-host run (up to 128 on a client, reading from a follower at
    /// once) made 2,469 handshakes for 548 connections (a handshake costs
    /// the peer about 0.6 ms of CPU), and the replicas of a slow machine
    /// saw hundreds aborted past their deadline a run.
    pub(super) async fn connection(&self, addr: SocketAddr) -> Result<Link, NetError> {
        if let Some(c) = self.pooled(addr) {
            return Ok(c);
        }
        let dial = {
            let mut dials = lock(&self.dials);
            // Again under the dials' lock: a dial pools its connection
            // before it leaves `dials`.
            if let Some(c) = self.pooled(addr) {
                return Ok(c);
            }
            dials.entry(addr).or_insert_with(|| self.dial(addr)).clone()
        };
        dial.await
            .map_err(|reason| NetError::Connect { addr, reason })
    }

    /// Starts a dial to `addr`, which pools its connection, then leaves
    /// `dials`, whatever becomes of the calls waiting for it. Only the dial
    /// removes its entry, no other is started while it is there, and it is
    /// started under the dials' lock (so cannot end before its entry is
    /// in): the entry it removes is its own.
    fn dial(&self, addr: SocketAddr) -> Dial {
        let name = lock(&self.names)
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| server_name(addr));
        let (endpoint, conns, dials) = (
            self.endpoint.clone(),
            self.conns.clone(),
            self.dials.clone(),
        );
        // A task of its own has no current tracing span. quinn's connection
        // driver keeps the span current at `connect` until the connection
        // closes: one opened inside a job process's span kept that span,
        // and so its trace, from ever ending.
        let task = tokio::spawn(async move {
            let link = handshake(&endpoint, addr, &name).await;
            if let Ok(link) = &link {
                lock(&conns).insert(addr, link.clone());
            }
            lock(&dials).remove(&addr);
            link.map_err(|e| match e {
                NetError::Connect { reason, .. } => reason,
                other => other.to_string(),
            })
        });
        let done = async move { task.await.unwrap_or_else(|e| Err(e.to_string())) };
        done.boxed().shared()
    }

    /// Forgets the pooled connection to `addr` if it is still `conn`, not
    /// one another call dialed since.
    fn forget(&self, addr: SocketAddr, conn: &Link) {
        let mut conns = lock(&self.conns);
        if conns
            .get(&addr)
            .is_some_and(|c| c.stable_id() == conn.stable_id())
        {
            conns.remove(&addr);
        }
    }

    /// Opens a stream to `addr` and sends `req` on it; returns the
    /// connection with the stream, for [`read_frame_from`]. Given up when
    /// the peer falls silent (invariant 4): a stream can wait for credit
    /// the peer would give, a write for its flow control.
    pub async fn open(
        &self,
        addr: SocketAddr,
        req: &WireRequest,
    ) -> Result<(Link, SendStream, RecvStream), NetError> {
        let stream_err = |reason: String| NetError::Stream { addr, reason };
        let silent = || stream_err(silent_reason());
        let mut conn = self.connection(addr).await?;
        let (mut send, recv) = match conn.unless_silent(conn.open_bi()).await {
            Some(Ok(s)) => s,
            Some(Err(_)) => {
                // The pooled connection died: reconnect once (invariant 2).
                self.forget(addr, &conn);
                conn = self.connection(addr).await?;
                conn.unless_silent(conn.open_bi())
                    .await
                    .ok_or_else(silent)?
                    .map_err(|e| stream_err(e.to_string()))?
            }
            None => return Err(silent()),
        };
        conn.unless_silent(write_frame(&mut send, req))
            .await
            .ok_or_else(silent)?
            .map_err(stream_err)?;
        Ok((conn, send, recv))
    }

    /// Sends `req` to `addr` and waits up to `timeout` for the answer.
    pub async fn call(
        &self,
        addr: SocketAddr,
        req: &WireRequest,
        timeout: Duration,
    ) -> Result<WireResponse, NetError> {
        let attempt = async {
            let (conn, mut send, mut recv) = self.open(addr, req).await?;
            let _ = send.finish();
            let stream_err = |reason: String| NetError::Stream { addr, reason };
            match read_frame_from(&conn, &mut recv, wire::MAX_FRAME).await {
                Ok(Some(body)) => {
                    take_end(&mut recv);
                    Ok(wire::decode(&body)?)
                }
                Ok(None) => Err(stream_err("closed without an answer".into())),
                Err(ReadError::Frame(f)) => Err(NetError::Frame(f)),
                Err(ReadError::Io(e)) => Err(stream_err(e)),
            }
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .map_err(|_| NetError::Timeout {
                addr,
                after: timeout,
            })?
    }
}

/// One handshake with `addr`, given up after
/// [`tessel_tls::HANDSHAKE_TIMEOUT`]: a dead peer never answers one.
async fn handshake(endpoint: &Endpoint, addr: SocketAddr, name: &str) -> Result<Link, NetError> {
    let failed = |reason: String| NetError::Connect { addr, reason };
    let connecting = endpoint
        .connect(addr, name)
        .map_err(|e| failed(e.to_string()))?;
    match tokio::time::timeout(tessel_tls::HANDSHAKE_TIMEOUT, connecting).await {
        Ok(c) => c.map(Link::new).map_err(|e| failed(e.to_string())),
        Err(_) => Err(failed(format!(
            "no handshake within {:?}",
            tessel_tls::HANDSHAKE_TIMEOUT
        ))),
    }
}

/// A peer known by its `HOST:PORT`: an address is used as is; a DNS name
/// is resolved when first used, and again after [`RESOLVE_TTL`] or a failed
/// call, so that a peer rescheduled under the same name (a pod, a
/// container) is found at its new address.
#[derive(Debug)]
pub struct NamedPeer {
    host_port: String,
    /// `Some` when `host_port` is an address: nothing to look up, no lock
    /// on the request path.
    fixed: Option<SocketAddr>,
    resolved: Mutex<Option<(SocketAddr, std::time::Instant)>>,
}

/// How long a resolved address is trusted.
pub const RESOLVE_TTL: Duration = Duration::from_secs(5);

impl NamedPeer {
    /// The peer at `host_port` (an address, or a DNS name and a port).
    pub fn new(host_port: impl Into<String>) -> NamedPeer {
        let host_port = host_port.into();
        NamedPeer {
            fixed: host_port.parse().ok(),
            host_port,
            resolved: Mutex::new(None),
        }
    }

    /// `HOST:PORT` as given.
    pub fn name(&self) -> &str {
        &self.host_port
    }

    /// Its address, or the one its name resolved to last, if any.
    pub fn last(&self) -> Option<SocketAddr> {
        self.fixed.or_else(|| lock(&self.resolved).map(|(a, _)| a))
    }

    /// Its address now: the fixed one, the cached one while fresh, else
    /// looked up.
    pub async fn addr(&self, client: &PeerClient) -> Result<SocketAddr, NetError> {
        if let Some(a) = self.fixed {
            return Ok(a);
        }
        let cached = *lock(&self.resolved);
        if let Some((a, at)) = cached {
            if at.elapsed() < RESOLVE_TTL {
                return Ok(a);
            }
        }
        let a = client.resolve(&self.host_port).await?;
        *lock(&self.resolved) = Some((a, std::time::Instant::now()));
        Ok(a)
    }

    /// Sends `req` to wherever it is now ([`PeerClient::call`]); a failure
    /// has the name looked up again before the next call.
    pub async fn call(
        &self,
        client: &PeerClient,
        req: &WireRequest,
        timeout: Duration,
    ) -> Result<WireResponse, NetError> {
        let result = match self.addr(client).await {
            Ok(addr) => client.call(addr, req, timeout).await,
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.forget();
        }
        result
    }

    /// Looks the name up again before the next call (this one failed).
    pub fn forget(&self) {
        if self.fixed.is_none() {
            *lock(&self.resolved) = None;
        }
    }
}
