//! Data channels (endpoint invariant 11): bulk bytes over TCP, sealed
//! (encryption on, the default) or plain (off), channels only for workers
//! of the same job and setting that asked over mutual TLS, and clear
//! refusals otherwise.

use std::path::Path;
use std::time::Duration;

use tessel_pjrt::ElementType;
use tessel_tls::{init_ca, issue, NodeCert, Role, TlsFiles};
use tessel_transfer::{Encryption, Peer, TransferConfig, TransferEndpoint, TransferError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(30);

/// The socket count is the whole process's: the test that reads it runs
/// alone, the others share.
static ALONE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn node(ca: &Path, dir: &Path, role: Role, name: &str) -> TlsFiles {
    let out = dir.join(name);
    let valid = tessel_tls::Validity::days(30);
    let cert = NodeCert {
        role,
        name,
        hosts: &[],
        valid,
    };
    issue(ca, &cert, &out).unwrap();
    TlsFiles::load(&out).unwrap()
}

fn cfg(encryption: Encryption, job: &str) -> TransferConfig {
    TransferConfig {
        encryption,
        job: job.into(),
        ..TransferConfig::default()
    }
}

fn bind(tls: &TlsFiles, rank: u32, cfg: TransferConfig) -> TransferEndpoint {
    TransferEndpoint::bind("127.0.0.1:0".parse().unwrap(), rank, Some(tls), cfg).unwrap()
}

fn bytes(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_arrive_byte_for_byte_in_either_setting_and_their_bulk_bypasses_quic() {
    for setting in [Encryption::On, Encryption::Off] {
        transfers_arrive_byte_for_byte(setting).await;
    }
}

async fn transfers_arrive_byte_for_byte(setting: Encryption) {
    let _shared = ALONE.read().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let a = bind(
        &node(&ca, dir.path(), Role::Worker, "a"),
        0,
        cfg(setting, "j@1"),
    );
    let b = bind(
        &node(&ca, dir.path(), Role::Worker, "b"),
        1,
        cfg(setting, "j@1"),
    );
    let to_b = Peer::new(b.local_addr().unwrap(), None).on_worker("b");
    assert!(b.data_addr().is_ok());
    // Small ones, reusing the channel, and a striped large one (two parts);
    // sizes that end mid-record and on a record's end (256 KiB).
    for tag in 0..50u64 {
        let data = bytes(1000 + tag as usize);
        a.send_to(&to_b, tag, ElementType::U8, &[data.len() as u64], &data, T)
            .await
            .unwrap();
        assert_eq!(b.recv(0, tag, T).await.unwrap().data, data);
    }
    let large = bytes(40 << 20);
    a.send_to(&to_b, 99, ElementType::U8, &[large.len() as u64], &large, T)
        .await
        .unwrap();
    assert!(b.recv(0, 99, T).await.unwrap().data == large);
    for (tag, len) in [(100, 256 << 10), (101, (256 << 10) + 1), (102, 3 << 20)] {
        let data = bytes(len);
        a.send_to(&to_b, tag, ElementType::U8, &[len as u64], &data, T)
            .await
            .unwrap();
        assert!(b.recv(0, tag, T).await.unwrap().data == data, "{len} bytes");
    }
    // QUIC carried the set-up only.
    let quic = a.connection_stats(to_b.addr).expect("a QUIC connection");
    assert!(
        quic.udp_tx.bytes < 1 << 20,
        "{} bytes over QUIC",
        quic.udp_tx.bytes
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_connection_without_a_granted_token_delivers_nothing() {
    let _shared = ALONE.read().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let b = bind(
        &node(&ca, dir.path(), Role::Worker, "b"),
        1,
        cfg(Encryption::Off, "j@1"),
    );
    let mut s = tokio::net::TcpStream::connect(b.data_addr().unwrap())
        .await
        .unwrap();
    // A made-up token, then a well-formed transfer.
    s.write_all(&[7u8; 32]).await.unwrap();
    let header = tessel_transfer::TransferHeader::new(0, 5, ElementType::U8, &[3]).unwrap();
    let _ = s.write_all(&header.encode()).await;
    let _ = s.write_all(b"abc").await;
    let mut answer = [0u8; 1];
    let n = tokio::time::timeout(T, s.read(&mut answer)).await.unwrap();
    assert!(
        matches!(n, Ok(0) | Err(_)),
        "closed without an answer: {n:?}"
    );
    let e = b.recv(0, 5, Duration::from_millis(300)).await.unwrap_err();
    assert!(matches!(e, TransferError::DeadlineExceeded { .. }), "{e}");
}

async fn send(from: &TransferEndpoint, to: &TransferEndpoint) -> Result<(), TransferError> {
    let peer = Peer::new(to.local_addr().unwrap(), None);
    from.send_to(&peer, 1, ElementType::U8, &[1], &[7], T).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channels_are_refused_across_jobs_settings_and_certificates() {
    let _shared = ALONE.read().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let worker = |name| node(&ca, dir.path(), Role::Worker, name);
    let (wa, wb) = (worker("a"), worker("b"));

    // Another job (or another attempt of this one).
    let a = bind(&wa, 0, cfg(Encryption::Off, "j@2"));
    let b = bind(&wb, 1, cfg(Encryption::Off, "j@1"));
    let e = send(&a, &b).await.unwrap_err();
    assert!(
        matches!(&e, TransferError::Encryption(m) if m.contains("serves job `j@1`, not `j@2`")),
        "{e}"
    );

    // Settings that differ, either way round.
    let on = bind(&wb, 1, cfg(Encryption::On, "j@2"));
    let e = send(&a, &on).await.unwrap_err();
    assert!(
        matches!(&e, TransferError::Encryption(m) if m.contains("transfer encryption is on and the sender's is off")),
        "{e}"
    );
    let a_on = bind(&wa, 0, cfg(Encryption::On, "j@1"));
    let e = send(&a_on, &b).await.unwrap_err();
    assert!(
        matches!(&e, TransferError::Encryption(m) if m.contains("transfer encryption is off and the sender's is on")),
        "{e}"
    );

    // A client's certificate, and a worker of another CA, never get a
    // grant, in either setting.
    let other = tempfile::tempdir().unwrap();
    init_ca(&other.path().join("ca")).unwrap();
    let foreign = node(&other.path().join("ca"), other.path(), Role::Worker, "a");
    let ops = node(&ca, dir.path(), Role::Client, "ops");
    for setting in [Encryption::Off, Encryption::On] {
        let b = bind(&wb, 1, cfg(setting, "j@1"));
        let o = bind(&ops, 2, cfg(setting, "j@1"));
        let e = send(&o, &b).await.unwrap_err();
        assert!(matches!(e, TransferError::Connect { .. }), "{e}");
        let f = bind(&foreign, 0, cfg(setting, "j@1"));
        let e = send(&f, &b).await.unwrap_err();
        assert!(matches!(e, TransferError::Connect { .. }), "{e}");

        // Nothing of the above was delivered; a sender of the job still is.
        let a1 = bind(&wa, 0, cfg(setting, "j@1"));
        send(&a1, &b).await.unwrap();
        assert_eq!(b.recv(0, 1, T).await.unwrap().data, vec![7]);
        assert!(b.recv(2, 1, Duration::from_millis(100)).await.is_err());
    }
}

/// TCP sockets this process holds: `/proc/self/fd` entries whose socket
/// inode `/proc/self/net/tcp{,6}` lists (QUIC's UDP socket drains on its
/// own schedule and is not what this counts).
fn open_tcp_sockets() -> usize {
    let mut inodes = std::collections::HashSet::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        for line in std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            if let Some(inode) = line.split_whitespace().nth(9) {
                inodes.insert(format!("socket:[{inode}]"));
            }
        }
    }
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|t| inodes.contains(&*t.to_string_lossy()))
                .unwrap_or(false)
        })
        .count()
}

/// Dropped endpoints leave no data channel or listener behind (their
/// tasks end with them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_endpoints_leave_no_socket_behind() {
    let _alone = ALONE.write().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    init_ca(&ca).unwrap();
    let (wa, wb) = (
        node(&ca, dir.path(), Role::Worker, "a"),
        node(&ca, dir.path(), Role::Worker, "b"),
    );
    let before = open_tcp_sockets();
    for setting in [Encryption::Off, Encryption::On] {
        let a = bind(&wa, 0, cfg(setting, "j@1"));
        let b = bind(&wb, 1, cfg(setting, "j@1"));
        let to_b = Peer::new(b.local_addr().unwrap(), None);
        // Several channels at once, then idle ones kept.
        let data = bytes(1 << 20);
        let dims = [data.len() as u64];
        let sends = (0..4u64).map(|tag| a.send_to(&to_b, tag, ElementType::U8, &dims, &data, T));
        futures::future::try_join_all(sends).await.unwrap();
        assert!(
            open_tcp_sockets() > before + 4,
            "channels open while in use"
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while open_tcp_sockets() > before && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(open_tcp_sockets(), before, "every socket closed");
}
