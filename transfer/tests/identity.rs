//! Endpoint invariant 10: with per-node certificates, a transfer endpoint
//! admits workers only, and a sender reaches only the worker it means.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tessel_pjrt::ElementType;
use tessel_tls::{init_ca, issue, NodeCert, Role, TlsFiles};
use tessel_transfer::{Peer, TransferConfig, TransferEndpoint, TransferError};

const T: Duration = Duration::from_secs(10);

fn node(ca: &Path, dir: &Path, role: Role, name: &str) -> TlsFiles {
    let out = dir.join(name);
    issue(
        ca,
        &NodeCert {
            role,
            name,
            hosts: &[],
            valid: tessel_tls::Validity::days(30),
        },
        &out,
    )
    .unwrap();
    TlsFiles::load(&out).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_go_only_between_the_workers_they_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let bind = |tls: &TlsFiles, rank| {
        TransferEndpoint::bind(any, rank, Some(tls), TransferConfig::default()).unwrap()
    };
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
        "{e}"
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
