//! The per-node client's KV callbacks, bound to one job's namespace.
//!
//! PJRT calls `kv_get`/`kv_try_get`/`kv_put` from its own threads and
//! waits for the answer, so [`JobKv`] blocks that thread on the async
//! store through a runtime handle. It must not be called from a runtime
//! worker thread (the worker creates clients in `spawn_blocking`).
//!
//! Invariants:
//! 1. Every key the plugin uses lives under `jobs/{job}/pjrt/`, `job` the
//!    attempt's instance (`ID@A`): attempts never see each other's keys.
//! 2. `put` is an insert, as in XLA's coordination service: a second put of
//!    the same key is AlreadyExists.

use std::sync::Arc;
use std::time::Duration;

use tessel_kv::{KvError, KvStore};
use tessel_pjrt::kv::{KeyValueStore, KvError as PjrtKvError};
use tokio::runtime::Handle;

/// The job's PJRT key-value namespace.
pub fn namespace(job: &str) -> String {
    format!("jobs/{job}/pjrt/")
}

/// [`KeyValueStore`] over the coordinator's store, under one job.
pub struct JobKv {
    kv: Arc<dyn KvStore>,
    prefix: Vec<u8>,
    runtime: Handle,
}

impl JobKv {
    /// The KV of job `job`, blocking calls run on `runtime`.
    pub fn new(kv: Arc<dyn KvStore>, job: &str, runtime: Handle) -> JobKv {
        JobKv {
            kv,
            prefix: namespace(job).into_bytes(),
            runtime,
        }
    }

    fn key(&self, key: &[u8]) -> Vec<u8> {
        [&self.prefix[..], key].concat()
    }
}

fn to_pjrt(e: KvError, timeout: Duration) -> PjrtKvError {
    match e {
        KvError::NotFound(_) => PjrtKvError::NotFound,
        KvError::AlreadyExists(_) => PjrtKvError::AlreadyExists,
        KvError::DeadlineExceeded { .. } => PjrtKvError::DeadlineExceeded(timeout),
        KvError::InvalidArgument(m) => PjrtKvError::InvalidArgument(m),
        KvError::Unavailable(m) => PjrtKvError::Unavailable(m),
        other => PjrtKvError::Internal(other.to_string()),
    }
}

impl KeyValueStore for JobKv {
    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, PjrtKvError> {
        let k = self.key(key);
        let got = self
            .runtime
            .block_on(self.kv.get(&k, timeout))
            .map_err(|e| to_pjrt(e, timeout));
        tracing::debug!(key = %tessel_kv::show_key(&k), ?timeout, bytes = got.as_ref().map_or(0, Vec::len), ok = got.is_ok(), "pjrt kv_get");
        got
    }

    fn try_get(&self, key: &[u8]) -> Result<Vec<u8>, PjrtKvError> {
        let k = self.key(key);
        self.runtime
            .block_on(self.kv.try_get(&k))
            .map_err(|e| to_pjrt(e, Duration::ZERO))
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), PjrtKvError> {
        let k = self.key(key);
        tracing::debug!(key = %tessel_kv::show_key(&k), bytes = value.len(), "pjrt kv_put");
        self.runtime
            .block_on(self.kv.insert(&k, value))
            .map(drop)
            .map_err(|e| to_pjrt(e, Duration::ZERO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_kv::MemoryKv;

    #[test]
    fn keys_live_in_the_job_namespace_and_put_does_not_overwrite() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let kv: Arc<dyn KvStore> = rt.block_on(async { Arc::new(MemoryKv::new()) });
        let a = JobKv::new(kv.clone(), "a", rt.handle().clone());
        let b = JobKv::new(kv.clone(), "b", rt.handle().clone());
        a.put(b"k", b"1").unwrap();
        assert_eq!(a.put(b"k", b"2"), Err(PjrtKvError::AlreadyExists));
        assert_eq!(b.try_get(b"k"), Err(PjrtKvError::NotFound));
        assert_eq!(
            rt.block_on(kv.try_get(b"jobs/a/pjrt/k")).unwrap(),
            b"1".to_vec()
        );
        assert!(matches!(
            b.get(b"k", Duration::from_millis(50)),
            Err(PjrtKvError::DeadlineExceeded(_))
        ));
        // A put from another thread wakes a blocked get.
        let b2 = JobKv::new(kv, "b", rt.handle().clone());
        let t = std::thread::spawn(move || b2.get(b"late", Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(50));
        b.put(b"late", b"v").unwrap();
        assert_eq!(t.join().unwrap().unwrap(), b"v");
    }

    /// What XLA refuses with "Different local topology for node N has been
    /// set previously" cannot happen: a restarted attempt writes the
    /// plugin's topology and clique ids (binary) into a fresh namespace.
    #[test]
    fn each_attempt_gets_a_fresh_namespace_for_binary_plugin_values() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let kv: Arc<dyn KvStore> = rt.block_on(async { Arc::new(MemoryKv::new()) });
        let first = JobKv::new(kv.clone(), "mlp.3@1", rt.handle().clone());
        let second = JobKv::new(kv.clone(), "mlp.3@2", rt.handle().clone());
        let clique: Vec<u8> = (0..128u8).map(|i| i.wrapping_mul(37)).collect();
        let key = b"root_process: 0; clique: 0,1";
        first
            .put(b"local_topology/cuda/0", &[0, 1, 2, 0xff])
            .unwrap();
        first.put(key, &clique).unwrap();
        assert_eq!(
            second.try_get(b"local_topology/cuda/0"),
            Err(PjrtKvError::NotFound)
        );
        second.put(b"local_topology/cuda/0", &[9, 9]).unwrap();
        assert_eq!(first.try_get(key).unwrap(), clique, "binary-safe");
        assert_eq!(
            second.try_get(b"local_topology/cuda/0").unwrap(),
            vec![9, 9]
        );
    }
}
