//! Endpoint invariant 10: with per-node certificates, a transfer endpoint
//! admits workers only, and a sender reaches only the worker it means.

use std::net::SocketAddr;
use std::time::Duration;

use tessel_pjrt::ElementType;
use tessel_tls::{init_ca, Role, TlsFiles};
use tessel_transfer::{Peer, TransferConfig, TransferEndpoint, TransferError};

mod common;
use common::node;

const T: Duration = Duration::from_secs(10);

/// On data channels and on QUIC streams; a connection or channel kept
/// from an earlier transfer is checked again (one connection per peer,
/// so the second send reuses the first's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_go_only_between_the_workers_they_name() {
    for quic_payloads in [false, true] {
        transfers_go_only_between(quic_payloads).await;
    }
}

async fn transfers_go_only_between(quic_payloads: bool) {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let cfg = TransferConfig {
        quic_payloads,
        connections_per_peer: 1,
        ..TransferConfig::default()
    };
    let bind =
        |tls: &TlsFiles, rank| TransferEndpoint::bind(any, rank, Some(tls), cfg.clone()).unwrap();
    let h4 = bind(&node(&ca, dir.path(), Role::Worker, "h4"), 0);
    let h5 = bind(&node(&ca, dir.path(), Role::Worker, "h5"), 1);
    let to_h4 = Peer::new(h4.local_addr().unwrap(), None);

    h5.send_to(
        &to_h4.clone().on_worker("h4"),
        1,
        ElementType::U8,
        &[1],
        &[7],
        T,
    )
    .await
    .unwrap();
    assert_eq!(h4.recv(1, 1, T).await.unwrap().data, vec![7]);

    // The endpoint at that address is h4's, not h6's.
    let e = h5
        .send_to(
            &to_h4.clone().on_worker("h6"),
            2,
            ElementType::U8,
            &[1],
            &[7],
            T,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&e, TransferError::Connect { reason, .. } if reason.contains("expected worker `h6`, found worker `h4`")),
        "quic payloads {quic_payloads}: {e}"
    );

    // A client's certificate opens no transfers.
    let ops = bind(&node(&ca, dir.path(), Role::Client, "ops"), 2);
    let e = ops
        .send_to(&to_h4, 3, ElementType::U8, &[1], &[7], T)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            TransferError::Connect { .. } | TransferError::Stream { .. }
        ),
        "{e}"
    );
    assert!(h4.recv(2, 3, Duration::from_millis(300)).await.is_err());
}

/// Endpoint invariant 13: once the job's ranks are bound, a worker of the
/// cluster sends only as a rank that runs on it, over a sealed or a plain
/// data channel; the refusal names the rank's worker and the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_sends_only_as_the_ranks_it_runs() {
    use tessel_transfer::channel::Encryption;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    for encryption in [Encryption::On, Encryption::Off] {
        let cfg = TransferConfig {
            encryption,
            job: "j@1".into(),
            ..TransferConfig::default()
        };
        let bind = |name: &str, rank| {
            let tls = node(
                &ca,
                &dir.path().join(format!("{encryption}")),
                Role::Worker,
                name,
            );
            TransferEndpoint::bind(
                "127.0.0.1:0".parse().unwrap(),
                rank,
                Some(&tls),
                cfg.clone(),
            )
            .unwrap()
        };
        let (h4, h5) = (bind("h4", 0), bind("h5", 1));
        // h6 runs rank 2, and claims rank 0, which runs on h4.
        let impostor = bind("h6", 0);
        h5.bind_ranks(vec![
            Some("h4".into()),
            Some("h5".into()),
            Some("h6".into()),
        ]);
        let to_h5 = Peer::new(h5.local_addr().unwrap(), None).on_worker("h5");
        let e = impostor
            .send_to(&to_h5, 1, ElementType::U8, &[1], &[9], T)
            .await
            .unwrap_err();
        let named = "rank 0 runs on worker `h4`; the sender's certificate names worker `h6`";
        // A data channel's refusal carries its reason, sealed or plain.
        assert!(e.to_string().contains(named), "{encryption}: {e}");
        h4.send_to(&to_h5, 2, ElementType::U8, &[1], &[7], T)
            .await
            .unwrap();
        let got = h5.recv(0, 2, T).await.unwrap();
        assert_eq!(got.data, vec![7], "{encryption}: the rank's own worker");
        assert!(
            h5.recv(0, 1, Duration::from_millis(300)).await.is_err(),
            "{encryption}: nothing from the impostor"
        );
    }
}
