//! `endpoint::members`: a communicator whose ranks are looked up when
//! first needed, as a worker's are in the job's directory. Six workers
//! with certificates of their own run a barrier and all-reduces over the
//! network path on loopback QUIC.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tessel_pjrt::ElementType;
use tessel_tls::{init_ca, Role};
mod common;

use tessel_transfer::{
    CollectiveConfig, Communicator, Directory, Members, Peer, ReduceOp, TransferConfig,
    TransferEndpoint,
};

/// The job's directory, as one rank asks it: records which ranks it was
/// asked for.
struct Book {
    peers: Arc<Vec<Peer>>,
    asked: Mutex<Vec<u32>>,
}

impl Directory for Book {
    fn peer(&self, rank: u32) -> BoxFuture<'_, tessel_transfer::Result<Peer>> {
        self.asked.lock().unwrap().push(rank);
        let peer = self.peers[rank as usize].clone();
        Box::pin(async move { Ok(peer) })
    }
}

fn endpoints(ca: &Path, dir: &Path, names: &[&str]) -> Vec<Arc<TransferEndpoint>> {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let cfg = TransferConfig {
        job: "lazy@1".into(),
        ..TransferConfig::default()
    };
    names
        .iter()
        .enumerate()
        .map(|(r, name)| {
            let tls = common::node(ca, dir, Role::Worker, name);
            Arc::new(TransferEndpoint::bind(any, r as u32, Some(&tls), cfg.clone()).unwrap())
        })
        .collect()
}

/// A ring looks up the two ranks beside it, once each, however many
/// calls it makes, and its results are the eager communicator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_looks_up_its_two_neighbours_once() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let names: Vec<String> = (0..6).map(|r| format!("w{r}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let eps = endpoints(&ca, dir.path(), &names);
    let n = eps.len();
    let peers: Arc<Vec<Peer>> = Arc::new(
        eps.iter()
            .zip(&names)
            .map(|(e, w)| Peer::new(e.local_addr().unwrap(), None).on_worker(*w))
            .collect(),
    );
    let books: Vec<Arc<Book>> = (0..n)
        .map(|_| {
            Arc::new(Book {
                peers: peers.clone(),
                asked: Mutex::new(Vec::new()),
            })
        })
        .collect();
    let tasks: Vec<_> = eps
        .iter()
        .zip(&books)
        .enumerate()
        .map(|(r, (e, book))| {
            let members = Members::lazy(vec![false; n], book.clone());
            let mut c =
                Communicator::with_members(e.clone(), members, 9, CollectiveConfig::default())
                    .unwrap();
            tokio::spawn(async move {
                c.barrier().await.unwrap();
                // Large enough for the ring (not the descriptors' small
                // all-reduce), then a small one.
                let big: Vec<f32> = (0..100_000).map(|i| (i % 7) as f32 + r as f32).collect();
                let sum = c
                    .all_reduce(
                        ReduceOp::Sum,
                        ElementType::F32,
                        bytemuck::cast_slice(&big).to_vec(),
                    )
                    .await
                    .unwrap();
                let small = c
                    .all_reduce(ReduceOp::Sum, ElementType::F32, 1f32.to_le_bytes().to_vec())
                    .await
                    .unwrap();
                (sum, small, c)
            })
        })
        .collect();
    let mut kept = Vec::new();
    for (r, t) in tasks.into_iter().enumerate() {
        let (sum, small, c) = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .unwrap()
            .unwrap();
        let sum: &[f32] = bytemuck::cast_slice(&sum);
        // Σ over ranks of (i % 7 + rank) = 6 (i % 7) + 15.
        assert!(
            sum.iter()
                .enumerate()
                .all(|(i, &v)| v == 6.0 * (i % 7) as f32 + 15.0),
            "rank {r}"
        );
        assert_eq!(small, 6f32.to_le_bytes().to_vec());
        kept.push(c);
    }
    for (r, book) in books.iter().enumerate() {
        let asked = book.asked.lock().unwrap().clone();
        let distinct: BTreeSet<u32> = asked.iter().copied().collect();
        let neighbours: BTreeSet<u32> = [(r + 1) % n, (r + n - 1) % n]
            .into_iter()
            .map(|x| x as u32)
            .collect();
        assert_eq!(distinct, neighbours, "rank {r} looked up {asked:?}");
        assert_eq!(asked.len(), 2, "rank {r}: once each ({asked:?})");
    }
}

/// Endpoint invariant 13 through the lookup: a rank's first message makes
/// the receiver look up who runs that rank, and a worker that claims a
/// rank of another worker is refused, naming both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_claimed_by_another_worker_is_refused_after_its_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let eps = endpoints(&ca, dir.path(), &["w0", "w1"]);
    let impostor = endpoints(&ca, dir.path(), &["w9"]).remove(0);
    let peers: Arc<Vec<Peer>> = Arc::new(vec![
        Peer::new(eps[0].local_addr().unwrap(), None).on_worker("w0"),
        Peer::new(eps[1].local_addr().unwrap(), None).on_worker("w1"),
    ]);
    let book = Arc::new(Book {
        peers: peers.clone(),
        asked: Mutex::new(Vec::new()),
    });
    let _c = Communicator::with_members(
        eps[1].clone(),
        Members::lazy(vec![false; 2], book.clone()),
        9,
        CollectiveConfig::default(),
    )
    .unwrap();
    let t = Duration::from_secs(10);
    // w9 claims rank 0 (its endpoint's rank), which runs on w0.
    let e = impostor
        .send_to(&peers[1], 5, ElementType::U8, &[1], &[1], t)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("rank 0 runs on worker `w0`; the sender's certificate names worker `w9`"),
        "{e}"
    );
    assert_eq!(*book.asked.lock().unwrap(), vec![0], "looked up to check");
    eps[0]
        .send_to(&peers[1], 6, ElementType::U8, &[1], &[7], t)
        .await
        .unwrap();
    assert_eq!(eps[1].recv(0, 6, t).await.unwrap().data, vec![7]);
    assert_eq!(*book.asked.lock().unwrap(), vec![0], "once");
}
