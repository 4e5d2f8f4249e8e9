//! The etcd backend against a real 3-member etcd cluster (three `etcd`
//! processes on loopback). Built only with `--features etcd`; needs Debian's
//! `etcd-server` (`scripts/test` installs it).
#![cfg(feature = "etcd")]

use std::sync::Arc;
use std::time::Duration;

use tessel_kv::{conformance, KvError, KvStore};
use tessel_kv_service::etcd::server::EtcdServers;
use tessel_kv_service::etcd::{EtcdKv, EtcdOptions};

async fn client(endpoints: &[String]) -> EtcdKv {
    EtcdKv::connect(endpoints, EtcdOptions::default())
        .await
        .expect("connect to etcd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_backend_passes_the_conformance_suite() {
    let etcd = EtcdServers::start(3).await.unwrap();
    let kv = client(&etcd.endpoints()).await;
    conformance::run_all(&kv).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_get_through_one_member_is_woken_by_a_put_through_another() {
    let etcd = EtcdServers::start(3).await.unwrap();
    let on_1 = client(&[etcd.endpoint(1)]).await;
    let on_2 = client(&[etcd.endpoint(2)]).await;
    let (got, put) = tokio::join!(on_1.get(b"wake/k", Duration::from_secs(10)), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        on_2.insert(b"wake/k", b"v").await
    });
    put.unwrap();
    assert_eq!(got.unwrap(), b"v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_under_load_loses_no_acknowledged_write() {
    let mut etcd = EtcdServers::start(3).await.unwrap();
    let kv = Arc::new(client(&etcd.endpoints()).await);
    let writer = {
        let kv = kv.clone();
        tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..400u32 {
                let key = format!("load/{i:04}");
                if kv.put(key.as_bytes(), &i.to_le_bytes()).await.is_ok() {
                    acked.push(i);
                }
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = etcd.leader().await.unwrap();
    etcd.kill(leader);
    let acked = writer.await.unwrap();
    assert!(
        acked.len() > 300,
        "only {} of 400 writes succeeded",
        acked.len()
    );
    for i in &acked {
        let key = format!("load/{i:04}");
        assert_eq!(
            kv.try_get(key.as_bytes()).await.unwrap(),
            i.to_le_bytes(),
            "acknowledged {key}"
        );
    }
    kv.put(b"after/kill", b"ok").await.unwrap();

    // Every member killed at once and restarted from its data dir.
    for i in 0..3 {
        etcd.kill(i);
    }
    etcd.restart(&[0, 1, 2]).await.unwrap();
    let kv = client(&etcd.endpoints()).await;
    assert_eq!(kv.try_get(b"after/kill").await.unwrap(), b"ok");
    // A write whose answer was lost to the kill may still have landed.
    assert!(kv.list(b"load/").await.unwrap().len() >= acked.len());
}

/// Invariant 7 of the etcd backend: a decided barrier's keys go away with
/// its lease, and its id can then hold a new barrier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_barrier_is_forgotten_after_its_retention() {
    let etcd = EtcdServers::start(3).await.unwrap();
    let opts = EtcdOptions {
        barrier_retention: Duration::from_secs(1),
        ..EtcdOptions::default()
    };
    let kv = EtcdKv::connect(&etcd.endpoints(), opts).await.unwrap();
    let timeout = Duration::from_secs(1);
    kv.barrier(b"retained", b"w0", 1, timeout).await.unwrap();
    kv.cancel_barrier(b"never-started", "job cancelled")
        .await
        .unwrap();
    // Within the retention the outcome holds, and so does the count.
    kv.barrier(b"retained", b"w1", 1, timeout).await.unwrap();
    let wrong = kv.barrier(b"retained", b"w0", 2, timeout).await;
    assert!(
        matches!(wrong, Err(KvError::InvalidArgument(_))),
        "{wrong:?}"
    );
    let raw = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .unwrap();
    let barrier_keys = || {
        let mut raw = raw.kv_client();
        async move {
            raw.get(
                "tessel/b/",
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_count_only(),
                ),
            )
            .await
            .unwrap()
            .count()
        }
    };
    assert!(barrier_keys().await >= 4, "meta, arrivals and outcomes");
    // The leases run 2 s (timeout plus retention; etcd checks expiry every
    // 500 ms, and may extend a lease across a leader change).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while barrier_keys().await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "barrier keys outlived their lease"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Forgotten: the id holds a new barrier of another size.
    let fresh = kv.barrier(b"retained", b"w0", 2, timeout).await;
    assert!(
        matches!(&fresh, Err(KvError::BarrierFailed { reason, .. }) if reason.contains("1 of 2")),
        "{fresh:?}"
    );
    kv.barrier(b"never-started", b"w0", 1, timeout)
        .await
        .unwrap();
}
