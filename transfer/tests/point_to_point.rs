//! Point-to-point transfers between two endpoints over loopback QUIC with
//! mutual TLS: every dtype, many small arrays, a large one, and what must
//! be refused.

use std::net::SocketAddr;
use std::time::Duration;

use tessel_pjrt::ElementType;
use tessel_tls::{init_certs, TlsFiles};
use tessel_transfer::{TransferConfig, TransferEndpoint, TransferError, TransferHeader, ALPN};

const T: Duration = Duration::from_secs(60);

/// The path-MTU test measures what loss does to datagram sizes: the other
/// tests' transfers on the same two cores made its receiver drop
/// datagrams, quinn then took the path for a black hole and fell back to
/// 1,200 bytes. It runs alone; the others share.
static ALONE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn certs() -> (tempfile::TempDir, TlsFiles) {
    let dir = tempfile::tempdir().unwrap();
    init_certs(&dir.path().join("tls"), &["127.0.0.1".into()]).unwrap();
    let tls = TlsFiles::load(&dir.path().join("tls")).unwrap();
    (dir, tls)
}

fn pair(tls: &TlsFiles, cfg: TransferConfig) -> (TransferEndpoint, TransferEndpoint, SocketAddr) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = TransferEndpoint::bind(any, 0, Some(tls), cfg.clone()).unwrap();
    let b = TransferEndpoint::bind(any, 1, Some(tls), cfg).unwrap();
    let b_addr = b.local_addr().unwrap();
    (a, b, b_addr)
}

/// Deterministic bytes that differ at every position of a period.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dtype_arrives_byte_for_byte() {
    let _shared = ALONE.read().await;
    let (_d, tls) = certs();
    for (a, b, to) in [pair(&tls, TransferConfig::default()), pair(&tls, on_quic())] {
        every_dtype(&a, &b, to).await;
    }
}

/// Encrypted payloads on QUIC streams instead of sealed data channels.
fn on_quic() -> TransferConfig {
    TransferConfig {
        quic_payloads: true,
        ..TransferConfig::default()
    }
}

async fn every_dtype(a: &TransferEndpoint, b: &TransferEndpoint, to: SocketAddr) {
    for (i, dtype) in ElementType::ALL.into_iter().enumerate() {
        let dims = [3u64, 5, 7];
        let data = pattern(105 * dtype.size(), i as u8);
        a.send(to, i as u64, dtype, &dims, &data, T).await.unwrap();
        let got = b.recv(0, i as u64, T).await.unwrap();
        assert_eq!((got.dtype, got.dims.as_slice()), (dtype, &dims[..]));
        assert_eq!(got.data, data, "{}", dtype.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_small_arrays_arrive_in_order_per_tag() {
    let _shared = ALONE.read().await;
    let (_d, tls) = certs();
    let (a, b, to) = pair(&tls, TransferConfig::default());
    let a = std::sync::Arc::new(a);
    // 100 concurrent senders, 100 arrays each, on their own tags.
    let senders: Vec<_> = (0..100u64)
        .map(|tag| {
            let a = a.clone();
            tokio::spawn(async move {
                for k in 0..100u32 {
                    let data = [tag as u32, k].map(u32::to_le_bytes).concat();
                    a.send(to, tag, ElementType::U32, &[2], &data, T)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for tag in 0..100u64 {
        for k in 0..100u32 {
            let got = b.recv(0, tag, T).await.unwrap();
            assert_eq!(got.data, [tag as u32, k].map(u32::to_le_bytes).concat());
        }
    }
    for s in senders {
        s.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_array_streams_through() {
    let _shared = ALONE.read().await;
    let (_d, tls) = certs();
    for (a, b, to) in [pair(&tls, TransferConfig::default()), pair(&tls, on_quic())] {
        large_array(&a, &b, to).await;
    }
}

async fn large_array(a: &TransferEndpoint, b: &TransferEndpoint, to: SocketAddr) {
    let len = 256usize << 20;
    let data = pattern(len, 7);
    let dims = [len as u64 / 4];
    let (sent, got) = tokio::join!(
        a.send(to, 1, ElementType::F32, &dims, &data, T),
        b.recv(0, 1, T)
    );
    sent.unwrap();
    assert!(got.unwrap().data == data, "256 MiB byte for byte");
}

/// This host's address on its default route (not loopback): connecting a
/// UDP socket sends nothing, it only asks the routing table.
fn non_loopback_ip() -> std::net::IpAddr {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.connect("198.51.100.1:9")
        .expect("this test needs an IPv4 route other than loopback");
    let ip = s.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "the default route leaves through {ip}");
    ip
}

/// Sends `len` bytes from a fresh endpoint on `ip` to one on the same
/// address and returns the sender's path MTU after checking the bytes.
async fn path_mtu_after(ip: std::net::IpAddr, tls: &TlsFiles, len: usize) -> u16 {
    let bind = SocketAddr::new(ip, 0);
    let a = TransferEndpoint::bind(bind, 0, Some(tls), on_quic()).unwrap();
    let b = TransferEndpoint::bind(bind, 1, Some(tls), on_quic()).unwrap();
    let to = b.local_addr().unwrap();
    let data = pattern(len, 3);
    let dims = [len as u64];
    let (sent, got) = tokio::join!(
        a.send(to, 1, ElementType::U8, &dims, &data, T),
        b.recv(0, 1, T)
    );
    sent.unwrap();
    assert!(got.unwrap().data == data, "{len} bytes byte for byte");
    a.connection_stats(to).unwrap().path.current_mtu
}

/// Invariant 6 of the endpoint: datagrams grow past Ethernet's size on
/// loopback (they fell back to 1,200 bytes when GSO batches of large
/// datagrams were silently refused by the kernel), and towards an address
/// that is not known to be on this host they stay within a GSO batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_grow_on_this_host_and_stay_within_gso_batches_elsewhere() {
    let _alone = ALONE.write().await;
    let (_d, tls) = certs();
    let len = 64usize << 20;
    let loopback = path_mtu_after("127.0.0.1".parse().unwrap(), &tls, len).await;
    assert!(loopback > 8_000, "loopback path MTU {loopback}");
    let other = path_mtu_after(non_loopback_ip(), &tls, len).await;
    assert!(
        other > 1_500 && other <= tessel_transfer::GSO_MAX_UDP_PAYLOAD,
        "path MTU {other} towards a non-loopback address"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_limit_and_lying_headers_are_refused_and_the_endpoint_keeps_serving() {
    let _shared = ALONE.read().await;
    let (_d, tls) = certs();
    let small = TransferConfig {
        max_bytes: 1 << 20,
        ..TransferConfig::default()
    };
    let (a, b, to) = pair(&tls, small);
    let big = vec![0u8; 2 << 20];
    let e = a
        .send(to, 1, ElementType::U8, &[2 << 20], &big, T)
        .await
        .unwrap_err();
    assert!(matches!(e, TransferError::Stream { .. }), "{e}");

    // A raw client announcing 1 TiB: refused from the header alone.
    let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    client.set_default_client_config(
        tls.client_config(ALPN, tessel_tls::Expect::Worker(None))
            .unwrap(),
    );
    let conn = client
        .connect(to, tessel_tls::SERVER_NAME)
        .unwrap()
        .await
        .unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let tib = TransferHeader::new(9, 9, ElementType::U8, &[1 << 40]).unwrap();
    send.write_all(&tib.encode()).await.unwrap();
    let mut ack = [0u8; 1];
    recv.read_exact(&mut ack).await.unwrap();
    assert_eq!(ack, [1], "refused");

    // Everyone else is still served.
    a.send(to, 2, ElementType::U8, &[3], b"abc", T)
        .await
        .unwrap();
    assert_eq!(b.recv(0, 2, T).await.unwrap().data, b"abc");
    // A send whose data does not match its shape never leaves.
    assert!(matches!(
        a.send(to, 3, ElementType::F32, &[2], b"abc", T).await,
        Err(TransferError::InvalidHeader(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_from_another_ca_is_refused() {
    let _shared = ALONE.read().await;
    let (_d1, tls) = certs();
    let (_d2, other) = certs();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let b = TransferEndpoint::bind(any, 1, Some(&tls), TransferConfig::default()).unwrap();
    let stranger = TransferEndpoint::bind(any, 0, Some(&other), TransferConfig::default()).unwrap();
    let e = stranger
        .send(
            b.local_addr().unwrap(),
            1,
            ElementType::U8,
            &[1],
            b"x",
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            TransferError::Connect { .. } | TransferError::Stream { .. }
        ),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_with_nothing_sent_times_out() {
    let _shared = ALONE.read().await;
    let (_d, tls) = certs();
    let (_a, b, _) = pair(&tls, TransferConfig::default());
    assert!(matches!(
        b.recv(0, 1, Duration::from_millis(100)).await,
        Err(TransferError::DeadlineExceeded { .. })
    ));
}

/// A PJRT buffer on one client arrives on the device the receiver picks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pjrt_buffers_arrive_on_the_chosen_device() {
    let _shared = ALONE.read().await;
    use tessel_pjrt::{locate, Client, ClientOptions, Plugin};
    let plugin = Plugin::load(locate::resolve(Some("cpu")).expect("the CPU plugin")).unwrap();
    let opts = || ClientOptions::default().option("cpu_device_count", 2i64);
    let sender = Client::create(&plugin, opts()).unwrap();
    let receiver = Client::create(&plugin, opts()).unwrap();
    let (_d, tls) = certs();
    let (a, b, to) = pair(&tls, TransferConfig::default());
    let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
    let src = sender
        .buffer_from_slice(&values, &[2, 3, 4], &sender.devices().unwrap()[0])
        .unwrap();
    let peer = tessel_transfer::Peer::new(to, None);
    a.send_buffer(&peer, 7, &src, T).await.unwrap();
    let device = receiver.devices().unwrap()[1].clone();
    let got = b.recv_buffer(0, 7, &device, T).await.unwrap();
    assert_eq!(got.dims().unwrap(), vec![2, 3, 4]);
    assert_eq!(got.element_type().unwrap(), ElementType::F32);
    assert_eq!(got.device().unwrap().id().unwrap(), device.id().unwrap());
    assert_eq!(
        got.to_host()
            .unwrap()
            .await
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        values
    );
}
