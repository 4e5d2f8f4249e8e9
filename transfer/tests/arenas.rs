//! Arenas between ranks of one host (collective invariant 8), with four
//! endpoints of this process that share a boot id.

use std::net::SocketAddr;
use std::sync::Arc;

use tessel_pjrt::ElementType;
use tessel_tls::{init_certs, TlsFiles};
use tessel_transfer::{CollectiveConfig, Communicator, Peer, TransferConfig, TransferEndpoint};

/// A rank that leaves a call early and grows its arena for the next one
/// must not take the old arena's name away from a peer still opening it:
/// calls of growing sizes, back to back, each checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_arena_stays_readable_for_slower_peers() {
    let dir = tempfile::tempdir().unwrap();
    init_certs(&dir.path().join("tls"), &["127.0.0.1".into()]).unwrap();
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    let shm = tempfile::tempdir().unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let cfg = TransferConfig {
        boot_id: Some("one host".into()),
        shm_dir: shm.path().to_path_buf(),
        ..TransferConfig::default()
    };
    let n = 4;
    let endpoints: Vec<Arc<TransferEndpoint>> = (0..n)
        .map(|r| Arc::new(TransferEndpoint::bind(any, r, Some(&tls), cfg.clone()).unwrap()))
        .collect();
    let members: Vec<Peer> = endpoints
        .iter()
        .map(|e| Peer::new(e.local_addr().unwrap(), Some("one host".into())))
        .collect();
    let tasks: Vec<_> = endpoints
        .into_iter()
        .enumerate()
        .map(|(r, e)| {
            let members = members.clone();
            tokio::spawn(async move {
                let mut c = Communicator::new(e, members, 3, CollectiveConfig::default()).unwrap();
                for round in 0..20usize {
                    let len = 1 << (round % 10);
                    let mine = vec![r as u8 ^ round as u8; len];
                    let all = c.all_gather(ElementType::U8, &mine).await.unwrap();
                    for k in 0..n as usize {
                        assert!(all[k * len..(k + 1) * len]
                            .iter()
                            .all(|&b| b == k as u8 ^ round as u8));
                    }
                    let root = c
                        .broadcast(0, ElementType::U8, vec![round as u8; len * 3])
                        .await
                        .unwrap();
                    assert!(root.iter().all(|&b| b == round as u8));
                }
                c
            })
        })
        .collect();
    let mut keep = Vec::new();
    for t in tasks {
        keep.push(t.await.unwrap());
    }
}
