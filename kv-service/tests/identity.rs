//! Property: with per-node certificates (`tls::issue`), a replica knows
//! who asks and allows each role only its own: a client cannot register
//! as a worker, a worker cannot write another worker's keys, and a client
//! only accepts a coordinator whose certificate names the address it
//! dialed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tessel_kv::{KvError, KvStore};
use tessel_kv_service::raft::client::RaftKv;
use tessel_kv_service::raft::node::{wait_for_leader, Replica, ReplicaConfig};
use tessel_kv_service::raft::wal::LogIo;
use tessel_tls::{init_ca, issue, server_name, Expect, Identity, NodeCert, Role, TlsFiles};

fn node(ca: &Path, out: &Path, role: Role, name: &str, hosts: &[&str]) -> TlsFiles {
    let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
    issue(
        ca,
        &NodeCert {
            role,
            name,
            hosts: &hosts,
            valid: tessel_tls::Validity::days(30),
        },
        out,
    )
    .unwrap();
    TlsFiles::load(out).unwrap()
}

async fn one_replica(dir: &Path, tls: &TlsFiles) -> (Replica, SocketAddr) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let replica = Replica::start(ReplicaConfig {
        id: 1,
        listen: any,
        peers: BTreeMap::from([(1, any.to_string())]),
        data_dir: dir.join("r1"),
        tls: Some(tls.clone()),
        raft: ReplicaConfig::default_raft(),
        log_io: LogIo::Buffered,
    })
    .await
    .unwrap();
    assert!(wait_for_leader(&[&replica], Duration::from_secs(10))
        .await
        .is_some());
    let addr = replica.local_addr().unwrap();
    (replica, addr)
}

/// A folder with a cluster CA (`ca/`) and coordinator 1's certificate.
fn cluster_ca() -> (tempfile::TempDir, std::path::PathBuf, TlsFiles) {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let coord = node(
        &ca,
        &dir.path().join("c1"),
        Role::Coordinator,
        "1",
        &["127.0.0.1"],
    );
    (dir, ca, coord)
}

fn denied<T: std::fmt::Debug>(r: Result<T, KvError>) -> String {
    match r {
        Err(KvError::PermissionDenied(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_writes_only_its_own_keys() {
    let (dir, ca, coord) = cluster_ca();
    assert_eq!(
        coord.identity(),
        Identity::Node {
            role: Role::Coordinator,
            name: "1".into()
        }
    );
    let (_replica, addr) = one_replica(dir.path(), &coord).await;

    let h4 = node(&ca, &dir.path().join("h4"), Role::Worker, "h4", &[]);
    let kv = RaftKv::connect(vec![addr], Some(&h4)).unwrap();
    kv.put(b"workers/h4/info", b"me").await.unwrap();
    // Its attempts' keys need the scheduler's assignment.
    let result = b"jobs/j.1@1/processes/00000/result";
    let why = denied(kv.put(result, b"{}").await);
    assert!(
        why.contains("worker `h4` may not write `jobs/j.1@1/processes/00000/result`: it holds no assignment `assignments/h4/j.1@1`"),
        "{why}"
    );
    let admin = RaftKv::connect(vec![addr], Some(&coord)).unwrap();
    admin.put(b"assignments/h4/j.1@1", b"p0").await.unwrap();
    kv.put(result, b"{}").await.unwrap();
    let why = denied(kv.put(b"workers/h5/alive", b"1 0").await);
    assert!(
        why.contains("worker `h4` may not write `workers/h5/alive`"),
        "{why}"
    );
    denied(kv.put(b"sched/state", b"x").await);
    let lease = kv.grant(Duration::from_secs(5)).await.unwrap();
    assert_eq!(kv.try_get(result).await.unwrap(), b"{}");
    kv.keep_alive(lease).await.unwrap();

    let ops = node(&ca, &dir.path().join("ops"), Role::Client, "ops", &[]);
    let kv = RaftKv::connect(vec![addr], Some(&ops)).unwrap();
    // Cannot register as a worker, nor hold the lease a worker needs.
    denied(kv.increment(b"workers/h9/incarnation", 1).await);
    denied(kv.grant(Duration::from_secs(5)).await);
    denied(kv.put(b"assignments/h4/j@1", b"x").await);
    // Submitting and reading are its business.
    kv.put(b"sched/jobs/j.1/cancel", b"cancel").await.unwrap();
    assert_eq!(kv.try_get(b"workers/h4/info").await.unwrap(), b"me");
    // Nor write a job's keys, however it is named.
    let why = denied(kv.put(result, b"forged").await);
    assert!(why.contains("client `ops` may not write"), "{why}");
    assert_eq!(kv.try_get(result).await.unwrap(), b"{}", "nothing written");
    // Nor can it join the replica set.
    let e = kv
        .add_replica(2, "127.0.0.1:9".parse().unwrap())
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("may not change the replica set"),
        "{e}"
    );
}

/// A worker cannot forge another attempt's reports or results, nor read
/// another job's arrays and logs; an assignment ending takes its rights
/// away at once (the replicas check it when they apply the write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_acts_only_for_the_attempts_assigned_to_it() {
    let (dir, ca, coord) = cluster_ca();
    let (_replica, addr) = one_replica(dir.path(), &coord).await;
    let admin = RaftKv::connect(vec![addr], Some(&coord)).unwrap();
    admin.put(b"assignments/h4/a@1", b"p0").await.unwrap();
    admin.put(b"assignments/h5/b@2", b"p0").await.unwrap();
    admin.put(b"jobs/b@2/arrays/w", b"secret").await.unwrap();
    admin
        .put(b"jobs/b/logs/00002/00000/0000000000", b"log")
        .await
        .unwrap();

    let h4 = node(&ca, &dir.path().join("h4"), Role::Worker, "h4", &[]);
    let kv = RaftKv::connect(vec![addr], Some(&h4)).unwrap();
    // Its own attempt: results, checkpoint records (by job id), logs.
    kv.put(b"jobs/a@1/processes/00000/result", b"ok")
        .await
        .unwrap();
    kv.put(b"jobs/a/checkpoints/000000000002", b"rec")
        .await
        .unwrap();
    kv.put(b"jobs/a/logs/00001/00000/0000000000", b"line")
        .await
        .unwrap();
    kv.put(b"jobs/a@1/arrays/w", b"mine").await.unwrap();
    assert_eq!(kv.try_get(b"jobs/a@1/arrays/w").await.unwrap(), b"mine");
    // Another's: refused, and nothing written.
    let revision = admin.revision().await.unwrap();
    for key in [
        &b"jobs/b@2/processes/00000/result"[..],
        b"jobs/b@2/failure",
        b"jobs/b/checkpoints/000000000009",
        b"jobs/b@2/reports/000000000001",
    ] {
        let why = denied(kv.put(key, b"forged").await);
        assert!(why.contains("worker `h4` may not write"), "{why}");
    }
    denied(kv.delete_prefix(b"jobs/b@2/").await);
    assert_eq!(admin.revision().await.unwrap(), revision, "nothing written");
    // Another job's arrays and logs are not its to read; its spec is.
    let why = denied(kv.try_get(b"jobs/b@2/arrays/w").await);
    assert!(why.contains("may not read `jobs/b@2/arrays/w`"), "{why}");
    denied(kv.list(b"jobs/b/logs/").await);
    denied(kv.list(b"jobs/").await);
    admin.put(b"jobs/b@2/spec", b"spec").await.unwrap();
    assert_eq!(kv.try_get(b"jobs/b@2/spec").await.unwrap(), b"spec");
    // Unassigned, the rights go with the assignment.
    admin.delete(b"assignments/h4/a@1").await.unwrap();
    denied(kv.put(b"jobs/a@1/processes/00000/result", b"late").await);
    assert_eq!(
        admin
            .try_get(b"jobs/a@1/processes/00000/result")
            .await
            .unwrap(),
        b"ok"
    );
}

/// A client refuses a coordinator whose certificate does not name the
/// address it dialed, and a worker certificate posing as a coordinator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_accept_only_the_coordinator_at_the_dialed_address() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let ops = node(&ca, &dir.path().join("ops"), Role::Client, "ops", &[]);
    for (name, role, hosts, why) in [
        (
            "elsewhere",
            Role::Coordinator,
            &["10.1.2.3"][..],
            "does not name 127.0.0.1",
        ),
        (
            "impostor",
            Role::Worker,
            &["127.0.0.1"][..],
            "expected a coordinator, found worker `impostor`",
        ),
    ] {
        let server = node(&ca, &dir.path().join(name), role, name, hosts);
        let sub = dir.path().join(format!("data-{name}"));
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let replica = Replica::start(ReplicaConfig {
            id: 1,
            listen: any,
            peers: BTreeMap::from([(1, any.to_string())]),
            data_dir: sub,
            tls: Some(server),
            raft: ReplicaConfig::default_raft(),
            log_io: LogIo::Buffered,
        })
        .await
        .unwrap();
        let addr = replica.local_addr().unwrap();
        let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        client.set_default_client_config(
            ops.client_config(tessel_kv_service::wire::ALPN, Expect::Coordinator)
                .unwrap(),
        );
        let e = client
            .connect(addr, &server_name(addr))
            .unwrap()
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{name}: {e}");
        replica.shutdown().await;
    }
}
