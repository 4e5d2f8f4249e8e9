//! [`KvStore`] over an etcd v3 cluster (cargo feature `etcd`).
//!
//! Key layout under the namespace (default `tessel/`):
//! * `{ns}k/{key}`: user keys, values as given.
//! * `{ns}b/{hex(id)}/meta`: a barrier's participant count and deadline
//!   (`"{participants} {deadline_unix_ms}"`), written by its first arrival.
//! * `{ns}b/{hex(id)}/a/{hex(participant)}`: one key per arrival.
//! * `{ns}b/{hex(id)}/outcome`: `passed` or `failed:{reason}`.
//!
//! Invariants:
//! 1. Revisions are etcd's: cluster-wide and monotonic, advanced also by
//!    barrier bookkeeping and other users of the same etcd.
//! 2. A blocking get reads at revision R and watches from R + 1 if the key
//!    is missing: a put in between is replayed, never lost.
//! 3. A barrier's outcome is written once by a create-only transaction, and
//!    everyone returns the stored outcome: all participants see the same.
//! 4. Sizes are checked against [`Limits`] before anything is sent (etcd's
//!    `--max-request-bytes` must exceed the value limit).
//! 5. Lease TTLs are rounded up to whole seconds.
//! 6. Transport errors and `Unavailable` are retried until the deadline,
//!    with [`crate::raft::client::RaftKv`]'s write ambiguity.
//! 7. A barrier's keys share one lease of its timeout plus
//!    [`EtcdOptions::barrier_retention`], so etcd forgets a barrier as the
//!    state machine does (`state` invariant 4).

pub mod server;

mod barrier;
mod watch;

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions, KvClient,
    LeaseClient, LeaseGrantOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchClient,
    WatchOptions,
};
use futures::StreamExt;
use tokio::time::Instant;

use tessel_kv::state::{increment_value, BatchPut, Event, KeyValue, Limits, BARRIER_RETENTION_MS};
use tessel_kv::{show_key, KvError, Result};
use tessel_kv::{CasOutcome, KvStore, Listing, WatchStream};

/// Largest gRPC message read from etcd: the value limit plus headroom.
const MAX_MESSAGE: usize = 64 << 20;

/// How the client reaches etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Prefix of every key tessel writes.
    pub namespace: Vec<u8>,
    /// Size limits tessel enforces before etcd sees a request.
    pub limits: Limits,
    /// Deadline of one call, retries included (blocking calls add their own
    /// timeout).
    pub request_timeout: Duration,
    /// How long a barrier's keys outlive its timeout (invariant 7).
    pub barrier_retention: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            namespace: b"tessel/".to_vec(),
            limits: Limits::default(),
            request_timeout: Duration::from_secs(15),
            barrier_retention: Duration::from_millis(BARRIER_RETENTION_MS),
        }
    }
}

/// Parses `etcd://h1:2379,h2:2379` into endpoint URLs.
pub fn parse_url(url: &str) -> Result<Vec<String>> {
    let rest = url.strip_prefix("etcd://").ok_or_else(|| {
        KvError::InvalidArgument(format!("`{url}`: expected etcd://HOST:PORT[,HOST:PORT..]"))
    })?;
    let endpoints: Vec<String> = rest
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|hp| format!("http://{hp}"))
        .collect();
    if endpoints.is_empty() {
        return Err(KvError::InvalidArgument(format!(
            "`{url}` names no etcd endpoint"
        )));
    }
    Ok(endpoints)
}

/// A [`KvStore`] backed by etcd.
pub struct EtcdKv {
    kv: KvClient,
    watch: WatchClient,
    lease: LeaseClient,
    opts: EtcdOptions,
}

impl EtcdKv {
    /// Connects to the endpoints (`http://HOST:PORT`).
    pub async fn connect(endpoints: &[String], opts: EtcdOptions) -> Result<EtcdKv> {
        let connect = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        let client = tokio::time::timeout(
            opts.request_timeout,
            Client::connect(endpoints, Some(connect)),
        )
        .await
        .map_err(|_| KvError::Unavailable(format!("no etcd endpoint of {endpoints:?} answered")))?
        .map_err(|e| map_err(e, None))?;
        Ok(EtcdKv {
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
            watch: client.watch_client().max_decoding_message_size(MAX_MESSAGE),
            lease: client.lease_client(),
            opts,
        })
    }

    fn data_key(&self, key: &[u8]) -> Vec<u8> {
        [&self.opts.namespace[..], b"k/", key].concat()
    }

    fn barrier_key(&self, id: &[u8], rest: &str) -> Vec<u8> {
        [
            &self.opts.namespace[..],
            b"b/",
            hex(id).as_bytes(),
            b"/",
            rest.as_bytes(),
        ]
        .concat()
    }

    /// Strips the data prefix from a key etcd returned.
    fn user_key(&self, key: &[u8]) -> Vec<u8> {
        key[self.opts.namespace.len() + 2..].to_vec()
    }

    fn convert(&self, kv: &etcd_client::KeyValue) -> KeyValue {
        KeyValue {
            key: self.user_key(kv.key()),
            value: kv.value().to_vec(),
            create_revision: kv.create_revision() as u64,
            mod_revision: kv.mod_revision() as u64,
            lease: (kv.lease() != 0).then_some(kv.lease() as u64),
        }
    }

    /// Runs `call` until it succeeds, fails for good, or the deadline passes
    /// (invariant 6).
    async fn retry<T, F, Fut>(&self, extra: Duration, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let deadline = Instant::now() + self.opts.request_timeout + extra;
        let mut backoff = Duration::from_millis(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let err = match tokio::time::timeout(left, call()).await {
                Ok(Err(KvError::Unavailable(e))) => KvError::Unavailable(e),
                Ok(r) => return r,
                Err(_) => KvError::Unavailable("etcd did not answer in time".into()),
            };
            if Instant::now() + backoff >= deadline {
                return Err(err);
            }
            tracing::debug!(error = %err, "etcd call failed; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        self.retry(Duration::ZERO, || {
            let mut kv = self.kv.clone();
            let txn = txn.clone();
            async move { kv.txn(txn).await.map_err(|e| map_err(e, None)) }
        })
        .await
    }

    /// The key's current pair, and the revision the read was made at.
    async fn read(&self, key: &[u8]) -> Result<(Option<etcd_client::KeyValue>, u64)> {
        let key = key.to_vec();
        self.retry(Duration::ZERO, || {
            let mut kv = self.kv.clone();
            let key = key.clone();
            async move {
                let mut r = kv.get(key, None).await.map_err(|e| map_err(e, None))?;
                let rev = header_revision(r.header());
                Ok((r.take_kvs().into_iter().next(), rev))
            }
        })
        .await
    }

    async fn put_raw(&self, key: Vec<u8>, value: &[u8], opts: Option<PutOptions>) -> Result<u64> {
        self.retry(Duration::ZERO, || {
            let mut kv = self.kv.clone();
            let (key, value, opts) = (key.clone(), value.to_vec(), opts.clone());
            async move {
                let r = kv.put(key, value, opts).await;
                r.map(|r| header_revision(r.header()))
                    .map_err(|e| map_err(e, None))
            }
        })
        .await
    }

    /// Waits until `key` exists, watching from `from` (invariant 2); `None`
    /// at the deadline.
    async fn wait_for_key(
        &self,
        key: &[u8],
        from: u64,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>> {
        let mut from = from;
        loop {
            if Instant::now() >= deadline {
                return Ok(None);
            }
            let opened = tokio::time::timeout_at(deadline, async {
                let mut w = self.watch.clone();
                w.watch(
                    key.to_vec(),
                    Some(WatchOptions::new().with_start_revision(from as i64)),
                )
                .await
            })
            .await;
            let mut stream = match opened {
                Err(_) => return Ok(None),
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    let e = map_err(e, None);
                    if !matches!(e, KvError::Unavailable(_)) {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            loop {
                let msg = match tokio::time::timeout_at(deadline, stream.message()).await {
                    Err(_) => return Ok(None),
                    Ok(Ok(Some(m))) => m,
                    // The stream broke: watch again from where we were.
                    Ok(Ok(None)) | Ok(Err(_)) => break,
                };
                if msg.canceled() {
                    if msg.compact_revision() > 0 {
                        // Compacted past `from`: re-read instead.
                        let (kv, rev) = self.read(key).await?;
                        if let Some(kv) = kv {
                            return Ok(Some(kv.value().to_vec()));
                        }
                        from = rev + 1;
                    }
                    break;
                }
                for ev in msg.events() {
                    if let (EventType::Put, Some(kv)) = (ev.event_type(), ev.kv()) {
                        return Ok(Some(kv.value().to_vec()));
                    }
                    if let Some(kv) = ev.kv() {
                        from = kv.mod_revision() as u64 + 1;
                    }
                }
            }
        }
    }
}

/// Put options attaching `lease` (0: none, as etcd reports it).
fn with_lease(lease: i64) -> Option<PutOptions> {
    (lease != 0).then(|| PutOptions::new().with_lease(lease))
}

/// A lease's TTL as etcd takes it (invariant 5): whole seconds, rounded up.
fn ttl_secs(ttl: Duration) -> i64 {
    ttl.as_millis().div_ceil(1000).max(1) as i64
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> u64 {
    h.map(|h| h.revision() as u64).unwrap_or(0)
}

fn first_get(r: &etcd_client::TxnResponse) -> Option<etcd_client::KeyValue> {
    r.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
        _ => None,
    })
}

/// Maps an etcd-client error; `lease` names the lease a "not found" is
/// about.
fn map_err(e: etcd_client::Error, lease: Option<u64>) -> KvError {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::GRpcStatus(s) => {
            let msg = s.message().to_owned();
            if msg.contains("lease not found") {
                return KvError::LeaseNotFound(lease.unwrap_or(0));
            }
            if msg.contains("lease already exists") {
                return KvError::AlreadyExists(
                    format!("lease {}", lease.unwrap_or(0)).into_bytes(),
                );
            }
            match s.code() {
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Aborted
                | Code::Unknown
                    if msg.contains("leader")
                        || msg.contains("timed out")
                        || s.code() != Code::Unknown =>
                {
                    KvError::Unavailable(format!("etcd: {msg}"))
                }
                Code::InvalidArgument | Code::ResourceExhausted | Code::OutOfRange => {
                    KvError::InvalidArgument(format!("etcd: {msg}"))
                }
                _ => KvError::Internal(format!("etcd: {}: {msg}", s.code())),
            }
        }
        E::TransportError(e) => KvError::Unavailable(format!("etcd transport: {e}")),
        E::IoError(e) => KvError::Unavailable(format!("etcd i/o: {e}")),
        E::EndpointError(e) => KvError::Unavailable(format!("etcd endpoint: {e}")),
        E::WatchError(e) => KvError::Unavailable(format!("etcd watch: {e}")),
        E::LeaseKeepAliveError(e) if e.contains("lease not found") => {
            KvError::LeaseNotFound(lease.unwrap_or(0))
        }
        E::LeaseKeepAliveError(e) => KvError::Unavailable(format!("etcd keep-alive: {e}")),
        E::InvalidArgs(e) => KvError::InvalidArgument(e),
        E::InvalidUri(e) => KvError::InvalidArgument(format!("etcd endpoint: {e}")),
        other => KvError::Internal(format!("etcd: {other}")),
    }
}

#[async_trait::async_trait]
impl KvStore for EtcdKv {
    async fn insert(&self, key: &[u8], value: &[u8]) -> Result<u64> {
        self.opts.limits.check_key(key)?;
        self.opts.limits.check_value(value)?;
        let k = self.data_key(key);
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(k, value, None)]);
        let r = self.txn(txn).await?;
        if !r.succeeded() {
            return Err(KvError::AlreadyExists(key.to_vec()));
        }
        Ok(header_revision(r.header()))
    }

    async fn put(&self, key: &[u8], value: &[u8]) -> Result<u64> {
        self.opts.limits.check_key(key)?;
        self.opts.limits.check_value(value)?;
        self.put_raw(self.data_key(key), value, None).await
    }

    async fn put_with_lease(&self, key: &[u8], value: &[u8], lease: u64) -> Result<u64> {
        self.opts.limits.check_key(key)?;
        self.opts.limits.check_value(value)?;
        self.put_raw(
            self.data_key(key),
            value,
            Some(PutOptions::new().with_lease(lease as i64)),
        )
        .await
        .map_err(|e| match e {
            KvError::LeaseNotFound(_) => KvError::LeaseNotFound(lease),
            e => e,
        })
    }

    async fn put_batch(&self, puts: &[BatchPut]) -> Result<u64> {
        self.opts.limits.check_batch(puts)?;
        // One etcd transaction: one revision, all or none.
        let ops: Vec<TxnOp> = puts
            .iter()
            .map(|p| {
                let opts = p.lease.map(|l| PutOptions::new().with_lease(l as i64));
                TxnOp::put(self.data_key(&p.key), p.value.clone(), opts)
            })
            .collect();
        match self.txn(Txn::new().and_then(ops)).await {
            Ok(r) => Ok(header_revision(r.header())),
            // etcd names no lease: name the batch's, when it has one.
            Err(KvError::LeaseNotFound(_)) => Err(KvError::LeaseNotFound(
                puts.iter().find_map(|p| p.lease).unwrap_or(0),
            )),
            Err(e) => Err(e),
        }
    }

    async fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        self.opts.limits.check_key(key)?;
        let deadline = Instant::now() + timeout;
        let k = self.data_key(key);
        let (kv, rev) = self.read(&k).await?;
        if let Some(kv) = kv {
            return Ok(kv.value().to_vec());
        }
        match self.wait_for_key(&k, rev + 1, deadline).await? {
            Some(v) => Ok(v),
            None => Err(KvError::DeadlineExceeded {
                what: format!("get `{}`", show_key(key)),
                after: timeout,
            }),
        }
    }

    async fn try_get(&self, key: &[u8]) -> Result<Vec<u8>> {
        self.opts.limits.check_key(key)?;
        match self.read(&self.data_key(key)).await?.0 {
            Some(kv) => Ok(kv.value().to_vec()),
            None => Err(KvError::NotFound(key.to_vec())),
        }
    }

    async fn list_at(&self, prefix: &[u8]) -> Result<Listing> {
        self.opts.limits.check_key(prefix)?;
        let p = self.data_key(prefix);
        let mut r = self
            .retry(Duration::ZERO, || {
                let mut kv = self.kv.clone();
                let p = p.clone();
                async move {
                    kv.get(p, Some(GetOptions::new().with_prefix()))
                        .await
                        .map_err(|e| map_err(e, None))
                }
            })
            .await?;
        // The header's revision is the store's when the range was read.
        let revision = header_revision(r.header());
        let pairs = r.take_kvs().iter().map(|kv| self.convert(kv)).collect();
        Ok(Listing { pairs, revision })
    }

    async fn delete(&self, key: &[u8]) -> Result<u64> {
        self.opts.limits.check_key(key)?;
        let k = self.data_key(key);
        self.retry(Duration::ZERO, || {
            let mut kv = self.kv.clone();
            let k = k.clone();
            async move {
                kv.delete(k, None)
                    .await
                    .map(|r| r.deleted() as u64)
                    .map_err(|e| map_err(e, None))
            }
        })
        .await
    }

    async fn delete_prefix(&self, prefix: &[u8]) -> Result<u64> {
        self.opts.limits.check_key(prefix)?;
        let p = self.data_key(prefix);
        self.retry(Duration::ZERO, || {
            let mut kv = self.kv.clone();
            let p = p.clone();
            async move {
                kv.delete(p, Some(DeleteOptions::new().with_prefix()))
                    .await
                    .map(|r| r.deleted() as u64)
                    .map_err(|e| map_err(e, None))
            }
        })
        .await
    }

    async fn increment(&self, key: &[u8], delta: i64) -> Result<i64> {
        self.opts.limits.check_key(key)?;
        let k = self.data_key(key);
        // Read, then write only if nobody wrote in between; else again.
        loop {
            let (kv, _) = self.read(&k).await?;
            let value = increment_value(key, kv.as_ref().map(|kv| kv.value()), delta)?;
            let guard = match &kv {
                None => Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                Some(kv) => Compare::mod_revision(k.clone(), CompareOp::Equal, kv.mod_revision()),
            };
            let put_opts = kv.is_some().then(|| PutOptions::new().with_ignore_lease());
            let txn = Txn::new().when([guard]).and_then([TxnOp::put(
                k.clone(),
                value.to_string(),
                put_opts,
            )]);
            if self.txn(txn).await?.succeeded() {
                return Ok(value);
            }
        }
    }

    async fn compare_and_swap(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<CasOutcome> {
        self.opts.limits.check_key(key)?;
        self.opts.limits.check_value(value)?;
        let k = self.data_key(key);
        let guard = match expected {
            None => Compare::create_revision(k.clone(), CompareOp::Equal, 0),
            Some(v) => Compare::value(k.clone(), CompareOp::Equal, v),
        };
        let mut when = vec![guard];
        if expected.is_some() {
            // A value comparison on a missing key is false, as wanted; the
            // existence check makes that explicit.
            when.push(Compare::create_revision(k.clone(), CompareOp::Greater, 0));
        }
        // A swapped key keeps its lease, as in the state machine.
        let put_opts = expected
            .is_some()
            .then(|| PutOptions::new().with_ignore_lease());
        let txn = Txn::new()
            .when(when)
            .and_then([TxnOp::put(k.clone(), value, put_opts)])
            .or_else([TxnOp::get(k, None)]);
        let r = self.txn(txn).await?;
        if r.succeeded() {
            return Ok(CasOutcome::Swapped {
                revision: header_revision(r.header()),
            });
        }
        Ok(CasOutcome::Mismatch {
            current: first_get(&r).map(|kv| kv.value().to_vec()),
        })
    }

    async fn watch(&self, prefix: &[u8], from_revision: u64) -> Result<WatchStream> {
        self.watch_prefix(prefix, from_revision).await
    }

    async fn grant(&self, ttl: Duration) -> Result<u64> {
        let secs = ttl_secs(ttl);
        self.retry(Duration::ZERO, || {
            let mut l = self.lease.clone();
            async move {
                l.grant(secs, None)
                    .await
                    .map(|r| r.id() as u64)
                    .map_err(|e| map_err(e, None))
            }
        })
        .await
    }

    /// Two round trips: etcd grants no lease inside a transaction.
    async fn grant_and_put(&self, lease: u64, ttl: Duration, puts: &[BatchPut]) -> Result<u64> {
        self.opts.limits.check_batch(puts)?;
        tessel_kv::check_chosen_lease(lease)?;
        let secs = ttl_secs(ttl);
        // A retry of a grant that took but went unanswered finds the id
        // taken: its own (ids are chosen at random from 2^63).
        let tried = std::sync::atomic::AtomicBool::new(false);
        self.retry(Duration::ZERO, || {
            let mut l = self.lease.clone();
            let retried = tried.swap(true, std::sync::atomic::Ordering::Relaxed);
            async move {
                let opts = LeaseGrantOptions::new().with_id(lease as i64);
                match l
                    .grant(secs, Some(opts))
                    .await
                    .map_err(|e| map_err(e, Some(lease)))
                {
                    Err(KvError::AlreadyExists(_)) if retried => Ok(()),
                    r => r.map(drop),
                }
            }
        })
        .await?;
        let written = self.put_batch(puts).await;
        if written.is_err() {
            let _ = self.lease.clone().revoke(lease as i64).await;
        }
        written
    }

    async fn keep_alive(&self, lease: u64) -> Result<()> {
        self.retry(Duration::ZERO, || {
            let mut l = self.lease.clone();
            async move {
                // etcd-client reads the first answer itself and refuses a
                // TTL of 0, which is how etcd says the lease is gone.
                l.keep_alive(lease as i64)
                    .await
                    .map(drop)
                    .map_err(|e| map_err(e, Some(lease)))
            }
        })
        .await
    }

    async fn revoke(&self, lease: u64) -> Result<()> {
        self.retry(Duration::ZERO, || {
            let mut l = self.lease.clone();
            async move {
                l.revoke(lease as i64)
                    .await
                    .map(drop)
                    .map_err(|e| map_err(e, Some(lease)))
            }
        })
        .await
    }

    async fn barrier(
        &self,
        id: &[u8],
        participant: &[u8],
        participants: u32,
        timeout: Duration,
    ) -> Result<()> {
        self.opts.limits.check_key(id)?;
        self.opts.limits.check_key(participant)?;
        if participants == 0 {
            return Err(KvError::InvalidArgument(
                "a barrier needs at least one participant".into(),
            ));
        }
        match self.arrive(id, participant, participants, timeout).await {
            // Invariant 7: forgotten meanwhile; start it afresh.
            Err(KvError::LeaseNotFound(_)) => self
                .arrive(id, participant, participants, timeout)
                .await
                .map_err(|e| match e {
                    KvError::LeaseNotFound(_) => KvError::Internal(format!(
                        "barrier `{}` expired while arriving twice",
                        show_key(id)
                    )),
                    e => e,
                }),
            r => r,
        }
    }

    async fn cancel_barrier(&self, id: &[u8], reason: &str) -> Result<()> {
        self.opts.limits.check_key(id)?;
        let lease = match self.read(&self.barrier_key(id, "meta")).await? {
            (Some(meta), _) => meta.lease(),
            // Nobody arrived yet: the outcome alone, kept for the retention.
            (None, _) => self.grant(self.opts.barrier_retention).await? as i64,
        };
        match self
            .decide_barrier(id, &format!("failed:cancelled: {reason}"), lease)
            .await
        {
            Ok(()) | Err(KvError::BarrierFailed { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn revision(&self) -> Result<u64> {
        let key = self.opts.namespace.clone();
        self.retry(Duration::ZERO, || {
            let mut kv = self.kv.clone();
            let key = key.clone();
            async move {
                kv.get(key, Some(GetOptions::new().with_count_only()))
                    .await
                    .map(|r| header_revision(r.header()))
                    .map_err(|e| map_err(e, None))
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::barrier::barrier_result;
    use super::*;

    #[test]
    fn urls_parse_into_endpoints() {
        assert_eq!(
            parse_url("etcd://a:1,b:2").unwrap(),
            vec!["http://a:1".to_string(), "http://b:2".to_string()]
        );
        assert!(parse_url("http://a:1").is_err());
        assert!(parse_url("etcd://").is_err());
    }

    #[test]
    fn barrier_outcomes_decode() {
        assert_eq!(barrier_result(b"b", b"passed"), Ok(()));
        assert_eq!(
            barrier_result(b"b", b"failed:cancelled: x"),
            Err(KvError::BarrierFailed {
                id: b"b".to_vec(),
                reason: "cancelled: x".into()
            })
        );
    }
}
