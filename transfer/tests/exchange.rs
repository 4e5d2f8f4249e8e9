//! `Communicator::exchange`: point-to-point messages of any size as one
//! collective call, between three endpoints of this process on loopback
//! QUIC with mutual TLS (over the network path, not shared memory).

use std::net::SocketAddr;
use std::sync::Arc;

use tessel_tls::{init_certs, TlsFiles};
use tessel_transfer::{
    CollectiveConfig, Communicator, Peer, TransferConfig, TransferEndpoint, TransferError,
};

fn group(n: usize) -> (tempfile::TempDir, Vec<Communicator>) {
    let dir = tempfile::tempdir().unwrap();
    init_certs(&dir.path().join("tls"), &["127.0.0.1".into()]).unwrap();
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let endpoints: Vec<Arc<TransferEndpoint>> = (0..n)
        .map(|r| {
            Arc::new(
                TransferEndpoint::bind(any, r as u32, Some(&tls), TransferConfig::default())
                    .unwrap(),
            )
        })
        .collect();
    let members: Vec<Peer> = endpoints
        .iter()
        .map(|e| Peer::new(e.local_addr().unwrap(), None))
        .collect();
    let comms = endpoints
        .into_iter()
        .map(|e| Communicator::new(e, members.clone(), 7, CollectiveConfig::default()).unwrap())
        .collect();
    (dir, comms)
}

/// Each rank sends its successor a message of its own size and receives
/// its predecessor's: every message arrives whole, in `from`'s order, and
/// a later collective on the same communicators still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_different_sizes_reach_their_ranks() {
    let (_dir, comms) = group(3);
    let n = comms.len();
    let message = |r: usize| vec![r as u8 + 1; 1000 * (r + 1) + r];
    let tasks: Vec<_> = comms
        .into_iter()
        .enumerate()
        .map(|(r, mut c)| {
            tokio::spawn(async move {
                let got = c
                    .exchange(vec![((r + 1) % n, message(r))], &[(r + n - 1) % n])
                    .await
                    .unwrap();
                c.barrier().await.unwrap();
                // Kept until every rank is done: a dropped endpoint
                // closes connections a peer may still be sending on.
                (r, got, c)
            })
        })
        .collect();
    let mut done = Vec::new();
    for t in tasks {
        let (r, got, c) = t.await.unwrap();
        assert_eq!(got, vec![message((r + n - 1) % n)], "rank {r}");
        done.push(c);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_to_itself_or_twice_to_a_rank_are_refused() {
    let (_dir, mut comms) = group(2);
    let c = &mut comms[0];
    for (sends, from) in [
        (vec![(0, vec![1])], vec![]),
        (vec![(1, vec![1]), (1, vec![2])], vec![]),
        (vec![], vec![5]),
    ] {
        let e = c.exchange(sends, &from).await.unwrap_err();
        assert!(matches!(e, TransferError::InvalidArgument(_)), "{e}");
    }
}
