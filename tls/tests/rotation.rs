//! Property: a renewed certificate is adopted without a restart. Every
//! listener and dialer built from a TLS folder presents, and trusts, what
//! the folder holds now (the same key or a new one, and a CA rotated
//! through a bundle of both), connections already up stay up, and a
//! certificate outside its validity is refused with its dates.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use tessel_tls::{
    init_ca, issue, renew, Accept, Expect, NodeCert, Role, TlsFiles, Validity, RELOAD_POLL,
};

const ALPN: &[u8] = b"rotation-test";

fn cert<'a>(role: Role, name: &'a str, hosts: &'a [String], valid: Validity) -> NodeCert<'a> {
    NodeCert {
        role,
        name,
        hosts,
        valid,
    }
}

fn local() -> Vec<String> {
    vec!["127.0.0.1".to_owned()]
}

/// A server that answers every stream with its peer's certificate (DER).
fn server(tls: &TlsFiles) -> (quinn::Endpoint, SocketAddr) {
    let cfg = tls.server_config(ALPN, Accept::AnyRole).unwrap();
    let ep = quinn::Endpoint::server(cfg, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = ep.local_addr().unwrap();
    let accept = ep.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accept.accept().await {
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                    let _ = recv.read_to_end(64).await;
                    let peer = peer_der(&conn);
                    let _ = send.write_all(&peer).await;
                    let _ = send.finish();
                }
            });
        }
    });
    (ep, addr)
}

fn peer_der(conn: &quinn::Connection) -> Vec<u8> {
    conn.peer_identity()
        .and_then(|a| {
            a.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .map(|c| c[0].to_vec())
        .unwrap_or_default()
}

/// One round trip: the server's certificate as the client saw it, and the
/// client's as the server saw it.
async fn round_trip(conn: &quinn::Connection) -> Result<(Vec<u8>, Vec<u8>), String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
    send.write_all(b"hi").await.map_err(|e| e.to_string())?;
    send.finish().map_err(|e| e.to_string())?;
    let seen = recv.read_to_end(1 << 16).await.map_err(|e| e.to_string())?;
    Ok((peer_der(conn), seen))
}

async fn dial(tls: &TlsFiles, addr: SocketAddr) -> Result<quinn::Connection, String> {
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(tls.client_config(ALPN, Expect::Coordinator).unwrap());
    ep.connect(addr, "127.0.0.1")
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())
}

/// Dials and makes one round trip: `Err` when refused at any point.
async fn exchange(tls: &TlsFiles, addr: SocketAddr) -> Result<(Vec<u8>, Vec<u8>), String> {
    round_trip(&dial(tls, addr).await?).await
}

fn der(dir: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_file(dir.join("node.pem"))
        .unwrap()
        .to_vec()
}

/// Waits (five polls at most) until a new connection shows the server's
/// and the client's certificates now on disk.
async fn until_adopted(client: &TlsFiles, addr: SocketAddr, server_dir: &Path, client_dir: &Path) {
    let limit = RELOAD_POLL * 5;
    let deadline = tokio::time::Instant::now() + limit;
    let want = (der(server_dir), der(client_dir));
    loop {
        let got = exchange(client, addr).await;
        if got.as_ref().ok() == Some(&want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not adopted within {limit:?}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Folders {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Folders {
    fn new() -> Folders {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        Folders { _tmp: tmp, root }
    }

    fn at(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_certificates_are_adopted_and_open_connections_stay_up() {
    let f = Folders::new();
    let (ca, s, c) = (f.at("ca"), f.at("server"), f.at("client"));
    init_ca(&ca).unwrap();
    let hosts = local();
    issue(
        &ca,
        &cert(Role::Coordinator, "1", &hosts, Validity::days(30)),
        &s,
    )
    .unwrap();
    issue(&ca, &cert(Role::Worker, "h4", &[], Validity::days(30)), &c).unwrap();
    let (server_tls, client_tls) = (TlsFiles::load(&s).unwrap(), TlsFiles::load(&c).unwrap());
    let (_ep, addr) = server(&server_tls);
    let open = dial(&client_tls, addr).await.unwrap();
    assert_eq!(round_trip(&open).await.unwrap(), (der(&s), der(&c)));

    // The same key, then a new key, on both sides.
    for (new_key, days) in [(false, 60), (true, 90)] {
        let before = server_tls.not_after();
        let server_cert = cert(Role::Coordinator, "1", &hosts, Validity::days(days));
        renew(&ca, &server_cert, &s, new_key, None).unwrap();
        renew(
            &ca,
            &cert(Role::Worker, "h4", &[], Validity::days(days)),
            &c,
            new_key,
            None,
        )
        .unwrap();
        until_adopted(&client_tls, addr, &s, &c).await;
        assert!(server_tls.not_after() > before);
        assert!(
            round_trip(&open).await.is_ok(),
            "the connection made before the renewal is still up"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_rotates_through_a_bundle_of_both() {
    let f = Folders::new();
    let (ca1, ca2, s, c) = (f.at("ca1"), f.at("ca2"), f.at("server"), f.at("client"));
    init_ca(&ca1).unwrap();
    init_ca(&ca2).unwrap();
    let hosts = local();
    let server_cert = cert(Role::Coordinator, "1", &hosts, Validity::days(30));
    let client_cert = cert(Role::Worker, "h4", &[], Validity::days(30));
    issue(&ca1, &server_cert, &s).unwrap();
    issue(&ca1, &client_cert, &c).unwrap();
    let old_client = f.at("old-client");
    let old_cert = cert(Role::Worker, "h5", &[], Validity::days(30));
    issue(&ca1, &old_cert, &old_client).unwrap();
    let (server_tls, client_tls) = (TlsFiles::load(&s).unwrap(), TlsFiles::load(&c).unwrap());
    let old_tls = TlsFiles::load(&old_client).unwrap();
    let (_ep, addr) = server(&server_tls);

    // A renewal from the new CA into a folder that trusts only the old
    // one is refused: its holder would stop trusting its peers.
    let e = renew(&ca2, &server_cert, &s, false, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pass --trust"), "{e}");
    // 1. Both trust both CAs; the server moves to the new CA first, and
    //    a client of the old CA still gets in.
    let both = f.at("both.pem");
    let pem = |d: &Path| std::fs::read_to_string(d.join("ca.pem")).unwrap();
    std::fs::write(&both, pem(&ca1) + &pem(&ca2)).unwrap();
    renew(&ca1, &client_cert, &c, false, Some(&both)).unwrap();
    renew(&ca1, &old_cert, &old_client, false, Some(&both)).unwrap();
    renew(&ca2, &server_cert, &s, true, Some(&both)).unwrap();
    until_adopted(&client_tls, addr, &s, &c).await;
    old_tls.reload().unwrap();
    assert!(
        exchange(&old_tls, addr).await.is_ok(),
        "an old CA's leaf, both trusted"
    );
    // 2. The client moves; then both drop the old CA.
    let only_new = ca2.join("ca.pem");
    renew(&ca2, &client_cert, &c, true, Some(&only_new)).unwrap();
    renew(&ca2, &server_cert, &s, false, Some(&only_new)).unwrap();
    until_adopted(&client_tls, addr, &s, &c).await;
    assert!(
        exchange(&old_tls, addr).await.is_err(),
        "a certificate of the retired CA got in"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_outside_its_validity_is_refused_with_its_dates() {
    let f = Folders::new();
    let (ca, s) = (f.at("ca"), f.at("server"));
    init_ca(&ca).unwrap();
    let hosts = local();
    let day = Duration::from_secs(86_400);
    let expired_at = SystemTime::now() - day;
    let expired = Validity {
        not_before: expired_at - 2 * day,
        not_after: expired_at,
    };
    issue(&ca, &cert(Role::Coordinator, "1", &hosts, expired), &s).unwrap();
    let e = TlsFiles::load(&s).unwrap_err().to_string();
    let date = time::OffsetDateTime::from(expired_at).date().to_string();
    assert!(
        e.contains("node.pem: the certificate expired at") && e.contains(&date),
        "{e} (expected {date})"
    );

    // A running process keeps its certificate when the renewal on disk is
    // already expired, and says so.
    renew(
        &ca,
        &cert(Role::Coordinator, "1", &hosts, Validity::days(1)),
        &s,
        false,
        None,
    )
    .unwrap();
    let tls = TlsFiles::load(&s).unwrap();
    let good = tls.not_after();
    renew(
        &ca,
        &cert(Role::Coordinator, "1", &hosts, expired),
        &s,
        false,
        None,
    )
    .unwrap();
    let e = tls.reload().unwrap_err().to_string();
    assert!(e.contains("expired at"), "{e}");
    assert_eq!(tls.not_after(), good, "kept the previous certificate");
    let (_ep, addr) = server(&tls);
    let client_dir = f.at("client");
    issue(
        &ca,
        &cert(Role::Client, "ops", &[], Validity::days(1)),
        &client_dir,
    )
    .unwrap();
    let client = TlsFiles::load(&client_dir).unwrap();
    assert!(exchange(&client, addr).await.is_ok());

    // Another identity is never adopted.
    renew(
        &ca,
        &cert(Role::Coordinator, "2", &hosts, Validity::days(1)),
        &s,
        false,
        None,
    )
    .unwrap();
    let e = tls.reload().unwrap_err().to_string();
    assert!(e.contains("keeping the old one"), "{e}");

    // A peer whose certificate expired while it ran is refused.
    let short = Validity {
        not_before: SystemTime::now() - day,
        not_after: SystemTime::now() + Duration::from_secs(2),
    };
    let late_dir = f.at("late");
    issue(&ca, &cert(Role::Client, "late", &[], short), &late_dir).unwrap();
    let late = TlsFiles::load(&late_dir).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        exchange(&late, addr).await.is_err(),
        "an expired client certificate got in"
    );
}
