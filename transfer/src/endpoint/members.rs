//! A job's ranks, each looked up the first time it is needed.
//!
//! The global topology every process reads holds no peer's address or
//! name (topology `types` invariant 7): with them, N processes read N
//! entries each, and at 16,384 hosts that was a gigabyte through the
//! coordinators. A process talks to few of its peers (a ring: the ranks
//! before and after it; abort messages aside), so it asks a [`Directory`]
//! for those it needs, once each.
//!
//! Invariants:
//! 1. Each rank is looked up at most once while lookups succeed; a failed
//!    lookup is not remembered, so the next use asks again.
//! 2. Whether a rank runs on this machine is known before any lookup (the
//!    topology's machines), so choosing between shared memory and the
//!    network looks nothing up.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::OnceCell;

use super::config::Peer;
use crate::error::{Result, TransferError};

/// Where a job's ranks are found: in tessel, each process's local topology
/// in the coordinators' key-value service.
pub trait Directory: Send + Sync + 'static {
    /// Rank `rank`'s peer: its address, boot id and worker.
    fn peer(&self, rank: u32) -> BoxFuture<'_, Result<Peer>>;
}

/// The ranks of a communicator (invariants 1-2).
pub struct Members {
    peers: Vec<OnceCell<Peer>>,
    /// Whether each rank runs on this machine (invariant 2).
    local: Vec<bool>,
    directory: Option<Arc<dyn Directory>>,
}

impl Members {
    /// Ranks known already, rank `i` at `peers[i]`; `local` says whether
    /// one runs on this machine.
    pub fn known(peers: Vec<Peer>, local: impl Fn(&Peer) -> bool) -> Members {
        Members {
            local: peers.iter().map(local).collect(),
            peers: peers
                .into_iter()
                .map(|p| OnceCell::new_with(Some(p)))
                .collect(),
            directory: None,
        }
    }

    /// `local.len()` ranks, looked up in `directory` when first needed;
    /// `local[i]`: whether rank `i` runs on this machine.
    pub fn lazy(local: Vec<bool>, directory: Arc<dyn Directory>) -> Members {
        Members {
            peers: local.iter().map(|_| OnceCell::new()).collect(),
            local,
            directory: Some(directory),
        }
    }

    /// How many ranks.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Whether rank `rank` runs on this machine (invariant 2).
    pub fn on_this_machine(&self, rank: usize) -> bool {
        self.local.get(rank).copied().unwrap_or(false)
    }

    /// Rank `rank`'s peer, looked up now if it was not yet (invariant 1).
    /// Borrowed: a ring asks for its neighbour at every chunk it sends.
    pub async fn get(&self, rank: usize) -> Result<&Peer> {
        let cell = self.peers.get(rank).ok_or_else(|| {
            TransferError::InvalidArgument(format!("rank {rank} of a group of {}", self.len()))
        })?;
        cell.get_or_try_init(|| async {
            match &self.directory {
                Some(d) => d.peer(rank as u32).await,
                None => Err(TransferError::InvalidArgument(format!(
                    "rank {rank} is not known"
                ))),
            }
        })
        .await
    }

    /// Its peer's worker, where the certificate check needs it.
    pub(super) async fn worker(&self, rank: usize) -> Result<Option<&str>> {
        Ok(self.get(rank).await?.worker.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Counts its lookups; rank 2's first lookup fails.
    #[derive(Default)]
    struct Counting {
        asked: AtomicU32,
        failed_once: AtomicU32,
    }

    impl Directory for Counting {
        fn peer(&self, rank: u32) -> BoxFuture<'_, Result<Peer>> {
            Box::pin(async move {
                self.asked.fetch_add(1, Ordering::Relaxed);
                if rank == 2 && self.failed_once.fetch_add(1, Ordering::Relaxed) == 0 {
                    return Err(TransferError::Stream {
                        peer: "directory".into(),
                        reason: "unavailable".into(),
                    });
                }
                let addr = format!("127.0.0.1:{}", 7000 + rank).parse().unwrap();
                Ok(Peer::new(addr, None).on_worker(format!("w{rank}")))
            })
        }
    }

    #[tokio::test]
    async fn a_rank_is_looked_up_once_and_a_failed_lookup_again() {
        let d = Arc::new(Counting::default());
        let m = Members::lazy(vec![true, false, false], d.clone());
        assert_eq!(m.len(), 3);
        assert!(m.on_this_machine(0) && !m.on_this_machine(1) && !m.on_this_machine(9));
        assert_eq!(d.asked.load(Ordering::Relaxed), 0, "invariant 2");
        let one = m.get(1).await.unwrap();
        assert_eq!(one.addr.port(), 7001);
        assert_eq!(m.worker(1).await.unwrap(), Some("w1"));
        assert_eq!(d.asked.load(Ordering::Relaxed), 1, "once");
        assert!(m.get(2).await.is_err());
        assert_eq!(m.get(2).await.unwrap().addr.port(), 7002, "asked again");
        assert_eq!(d.asked.load(Ordering::Relaxed), 3);
        let e = m.get(3).await.unwrap_err().to_string();
        assert!(e.contains("rank 3 of a group of 3"), "{e}");
    }

    #[tokio::test]
    async fn known_ranks_look_nothing_up() {
        let peers: Vec<Peer> = (0..2)
            .map(|i| Peer::new(format!("127.0.0.1:{}", 9000 + i).parse().unwrap(), None))
            .collect();
        let m = Members::known(peers, |p| p.addr.port() == 9001);
        assert!(!m.on_this_machine(0) && m.on_this_machine(1));
        assert_eq!(m.get(1).await.unwrap().addr.port(), 9001);
        assert_eq!(m.worker(0).await.unwrap(), None);
    }
}
