//! The endpoint in one process: spares, stripes, refusals.

use super::*;
use bytes::Bytes;

const T: Duration = Duration::from_secs(30);

/// Two endpoints with the same boot id, sharing a memory folder.
fn same_host_pair(shm: &std::path::Path) -> (TransferEndpoint, TransferEndpoint, Peer) {
    let cfg = TransferConfig {
        boot_id: Some("test-boot".into()),
        shm_dir: shm.to_path_buf(),
        ..TransferConfig::default()
    };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = TransferEndpoint::bind(any, 0, None, cfg.clone()).unwrap();
    let b = TransferEndpoint::bind(any, 1, None, cfg).unwrap();
    let to_b = Peer::new(b.local_addr().unwrap(), Some("test-boot".into()));
    (a, b, to_b)
}

/// Endpoint invariant 5 / shm invariant 3: a lent payload is read in
/// place and the send completes only once the taker drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_payload_is_acknowledged_when_its_taker_is_done() {
    let shm = tempfile::tempdir().unwrap();
    let (a, b, to_b) = same_host_pair(shm.path());
    let a = Arc::new(a);
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let sending = {
        let (a, to_b, data) = (a.clone(), to_b.clone(), data.clone());
        tokio::spawn(async move {
            a.send_with(
                &to_b,
                7,
                ElementType::U8,
                &[data.len() as u64],
                Outgoing::Borrowed(&data),
                T,
                true,
            )
            .await
        })
    };
    let (_, got) = b.take_first(&[(0, 7)], T).await.unwrap();
    assert!(matches!(got.payload, Payload::Mapped(_)), "read in place");
    assert_eq!(got.payload.pieces().collect::<Vec<_>>().concat(), data);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!sending.is_finished(), "acknowledged while still mapped");
    drop(got);
    tokio::time::timeout(T, sending)
        .await
        .expect("acknowledged once dropped")
        .unwrap()
        .unwrap();
    // A plain send on the same path is stored, not lent.
    a.send_to(&to_b, 8, ElementType::U8, &[3], b"abc", T)
        .await
        .unwrap();
    let (_, got) = b.take_first(&[(0, 8)], T).await.unwrap();
    assert!(matches!(got.payload, Payload::Owned(_)));
}

/// Invariant 7: a recycled buffer receives the next payload that fits;
/// one too large for it, too small to keep, or over the limit does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_buffers_receive_later_payloads_within_the_limit() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = TransferEndpoint::bind(any, 0, None, TransferConfig::default()).unwrap();
    let cfg = TransferConfig {
        spare_bytes: 5 << 20,
        ..TransferConfig::default()
    };
    let b = TransferEndpoint::bind(any, 1, None, cfg).unwrap();
    let to_b = b.local_addr().unwrap();
    let send = |tag: u64, len: usize| {
        let data = vec![tag as u8; len];
        let a = &a;
        async move {
            a.send(to_b, tag, ElementType::U8, &[len as u64], &data, T)
                .await
                .unwrap()
        }
    };
    send(1, 3 << 20).await;
    let first = b.recv(0, 1, T).await.unwrap().data;
    let (ptr, cap) = (first.as_ptr(), first.capacity());
    b.recycle(first);
    send(2, 2 << 20).await;
    let second = b.recv(0, 2, T).await.unwrap().data;
    assert_eq!(second.as_ptr(), ptr, "the spare was reused");
    assert_eq!(second.capacity(), cap);
    assert!(second.iter().all(|&x| x == 2), "holds the new payload");
    b.recycle(second);
    // Over twice the spare's size would waste it: fresh memory instead.
    send(3, 1 << 20).await;
    let third = b.recv(0, 3, T).await.unwrap().data;
    assert_ne!(third.as_ptr(), ptr);
    assert_eq!(third.len(), 1 << 20);
    // The limit: 3 MiB kept, another 3 MiB would pass 5 MiB.
    b.recycle(vec![0; 3 << 20]);
    assert_eq!(b.mailbox.spares.lock().unwrap().bytes, 3 << 20);
    b.recycle(vec![0; 100]);
    assert_eq!(
        b.mailbox.spares.lock().unwrap().buffers.len(),
        1,
        "small or over the limit: freed"
    );
}

/// Two endpoints over the network, the sender striping payloads of
/// 1 MiB or more over three connections.
fn striping_pair() -> (TransferEndpoint, TransferEndpoint, Peer) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    // Payloads on QUIC streams: what these tests are about.
    let quic = TransferConfig {
        quic_payloads: true,
        ..TransferConfig::default()
    };
    let cfg = TransferConfig {
        connections_per_peer: 3,
        stripe_bytes: 1 << 20,
        ..quic.clone()
    };
    let a = TransferEndpoint::bind(any, 0, None, cfg).unwrap();
    let b = TransferEndpoint::bind(any, 1, None, quic).unwrap();
    let to_b = Peer::new(b.local_addr().unwrap(), None);
    (a, b, to_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_network_payload_keeps_its_pieces_both_ways() {
    let (a, b, to_b) = striping_pair();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    // Shared pieces, cut anywhere, one of them empty.
    let shared = Outgoing::Shared(vec![
        Bytes::copy_from_slice(&data[..1]),
        Bytes::new(),
        Bytes::copy_from_slice(&data[1..2_000_001]),
        Bytes::copy_from_slice(&data[2_000_001..]),
    ]);
    let dims = [data.len() as u64];
    // Under the stripe size (one stream) and over it (parts).
    for (tag, stripe) in [(1, false), (2, true)] {
        let part = if stripe {
            shared.reborrow()
        } else {
            shared.range(0..900_000)
        };
        let want = part.pieces().collect::<Vec<_>>().concat();
        let dims = [want.len() as u64];
        a.send_with(&to_b, tag, ElementType::U8, &dims, part, T, true)
            .await
            .unwrap();
        let (_, got) = b.take_first(&[(0, tag)], T).await.unwrap();
        match (&got.payload, stripe) {
            (Payload::Pieces(p), false) => assert!(p.len() > 1, "{} pieces", p.len()),
            (Payload::Owned(_), true) => {}
            _ => panic!("tag {tag}: an unexpected kind of payload"),
        }
        assert_eq!(got.payload.into_vec(), want);
    }
    // Not lent: one buffer, as a mailbox keeps it.
    a.send_with(&to_b, 3, ElementType::U8, &dims, shared, T, false)
        .await
        .unwrap();
    let (_, got) = b.take_first(&[(0, 3)], T).await.unwrap();
    assert!(matches!(got.payload, Payload::Owned(_)));
    assert_eq!(got.payload.into_vec(), data);
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < T, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Invariant 8: a large payload travels as one part per connection and
/// arrives whole, byte for byte; a small one takes one stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_striped_payload_arrives_whole() {
    let (a, b, to_b) = striping_pair();
    let len = (3 << 20) + 5;
    let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4099) as u8).collect();
    let dims = [len as u64];
    let (sent, got) = tokio::join!(
        a.send_to(&to_b, 4, ElementType::U8, &dims, &data, T),
        b.recv(0, 4, T)
    );
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!((got.dtype, &got.dims[..]), (ElementType::U8, &dims[..]));
    assert!(got.data == data, "byte for byte");
    let conns = (a.conns.lock().unwrap().keys())
        .filter(|(addr, _)| *addr == to_b.addr)
        .count();
    assert_eq!(conns, 3, "one part per connection");
    assert_eq!(b.mailbox.assemblies.len(), 0);
    // Under the threshold: one stream, delivered as before.
    a.send_to(&to_b, 5, ElementType::U8, &[3], &[7, 8, 9], T)
        .await
        .unwrap();
    assert_eq!(b.recv(0, 5, T).await.unwrap().data, [7, 8, 9]);
}

/// Stripe invariants 3 and 4: a sender that gives up after one part
/// leaves nothing behind, and parts that do not belong together are
/// refused and deliver nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_or_mismatched_striped_payload_leaves_nothing() {
    let (a, b, to_b) = striping_pair();
    let part = |tag: u64, transfer: u64, index: u32| {
        let mut h = TransferHeader::new(0, tag, ElementType::U8, &[8]).unwrap();
        h.part = Some(Part {
            transfer,
            index,
            count: 2,
        });
        h
    };
    // Part 0 of 2, then the sender gives up before part 1.
    let p = part(1, 1000, 0);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        a.send_stream(&to_b, Some(0), &p, Outgoing::Borrowed(&[1; 4])),
    )
    .await;
    assert!(gave_up.is_err(), "part 0 waits for the whole");
    until("the abandoned assembly is dropped", || {
        b.mailbox.assemblies.len() == 0
    })
    .await;
    // Part 0 of 2 from a sender whose endpoint then closes while the
    // part waits (its connections close, as when its process dies).
    let c = Arc::new(striping_pair().0);
    let sending = tokio::spawn({
        let (c, to_b, p) = (c.clone(), to_b.clone(), part(1, 1001, 0));
        async move {
            c.send_stream(&to_b, Some(0), &p, Outgoing::Borrowed(&[1; 4]))
                .await
        }
    });
    until("part 0 waits for part 1", || {
        b.mailbox.assemblies.len() == 1
    })
    .await;
    c.endpoint.close(VarInt::from_u32(0), b"gone");
    assert!(sending.await.unwrap().is_err());
    until("the dead sender's assembly is dropped", || {
        b.mailbox.assemblies.len() == 0
    })
    .await;

    // Sends `(header, byte)` on connection 0 and, 100 ms later, the
    // second one on connection 1.
    let send_apart = |(p, x): (TransferHeader, u8), (q, y): (TransferHeader, u8)| {
        let (a, to_b) = (&a, &to_b);
        async move {
            let (x, y) = ([x; 4], [y; 4]);
            tokio::join!(
                a.send_stream(to_b, Some(0), &p, Outgoing::Borrowed(&x)),
                async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    a.send_stream(to_b, Some(1), &q, Outgoing::Borrowed(&y))
                        .await
                }
            )
        }
    };
    // Two parts of one transfer under different tags.
    let (first, second) = send_apart((part(2, 1001, 0), 1), (part(3, 1001, 1), 2)).await;
    assert!(first.is_err() && second.is_err(), "both refused");
    assert_eq!(b.mailbox.assemblies.len(), 0);
    // A repeated part.
    let p = part(4, 1002, 1);
    let (first, again) = send_apart((p.clone(), 1), (p, 1)).await;
    assert!(first.is_err() && again.is_err(), "both refused");
    assert_eq!(b.mailbox.assemblies.len(), 0);
    assert!(
        b.mailbox.slots.lock().unwrap().is_empty(),
        "nothing delivered"
    );
    // The endpoint still serves whole payloads.
    let data = vec![9u8; 2 << 20];
    let dims = [data.len() as u64];
    let (sent, got) = tokio::join!(
        a.send_to(&to_b, 6, ElementType::U8, &dims, &data, T),
        b.recv(0, 6, T)
    );
    sent.unwrap();
    assert!(got.unwrap().data == data);
}

/// A lent payload nobody takes does not hold its sender to the
/// deadline once the receiving endpoint is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_payload_left_in_a_dropped_endpoint_releases_its_sender() {
    let shm = tempfile::tempdir().unwrap();
    let (a, b, to_b) = same_host_pair(shm.path());
    let a = Arc::new(a);
    let sending = {
        let (a, to_b) = (a.clone(), to_b.clone());
        tokio::spawn(async move {
            a.send_with(
                &to_b,
                1,
                ElementType::U8,
                &[4096],
                Outgoing::Borrowed(&[1; 4096]),
                T,
                true,
            )
            .await
        })
    };
    // Wait until it arrived, then drop the receiver without taking it.
    let arrived = async {
        while b.mailbox.slots.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(T, arrived).await.unwrap();
    drop(b);
    let started = std::time::Instant::now();
    let _ = tokio::time::timeout(Duration::from_secs(10), sending)
        .await
        .expect("the sender is released well before its deadline");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Invariant 11: a granted channel carries the transfers of the rank it
/// was granted to and no other, and a token opens one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_channel_carries_only_its_rank_and_a_token_opens_it_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = plain_receiver(TransferConfig::default().payload_stall);
    let token = grant(&b);
    let transfer = |rank: u32, tag: u64| {
        let mut out = TransferHeader::new(rank, tag, ElementType::U8, &[3])
            .unwrap()
            .encode();
        out.extend_from_slice(b"abc");
        out
    };
    let mut s = present(&b, &token).await;
    let mut answer = [9u8; 1];
    s.write_all(&transfer(0, 1)).await.unwrap();
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(answer, [0]);
    assert_eq!(b.recv(0, 1, T).await.unwrap().data, b"abc");

    // Rank 2's header on rank 0's channel: refused, and the channel ends.
    s.write_all(&transfer(2, 2)).await.unwrap();
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(answer, [1]);
    assert!(matches!(s.read(&mut answer).await, Ok(0) | Err(_)));
    assert!(b.recv(2, 2, Duration::from_millis(100)).await.is_err());

    // The same token again opens nothing.
    let mut again = tokio::net::TcpStream::connect(b.data_addr().unwrap())
        .await
        .unwrap();
    again.write_all(&token).await.unwrap();
    assert!(matches!(again.read(&mut answer).await, Ok(0) | Err(_)));

    // Oversized headers on a granted channel: a frame over 4 KiB, and an
    // array over the endpoint's limit; each is refused and ends the
    // channel, and the endpoint keeps serving.
    let open = || granted_channel(&b);
    let too_large = TransferHeader::new(0, 3, ElementType::F32, &[1 << 40])
        .unwrap()
        .encode();
    for frame in [(5000u32).to_be_bytes().to_vec(), too_large] {
        let mut s = open().await;
        s.write_all(&frame).await.unwrap();
        let mut answer = [9u8; 1];
        s.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, [1], "refused");
        assert!(
            matches!(s.read(&mut answer).await, Ok(0) | Err(_)),
            "and closed"
        );
    }
    let mut s = open().await;
    s.write_all(&transfer(0, 4)).await.unwrap();
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(answer, [0]);
    assert_eq!(b.recv(0, 4, T).await.unwrap().data, b"abc");
}

/// A data channel whose sender stalls mid-payload ends after
/// `payload_stall`, delivers nothing, and the endpoint keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_stalled_mid_payload_ends_its_channel_after_the_stall_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stall = Duration::from_millis(300);
    let b = plain_receiver(stall);
    let open = || granted_channel(&b);
    // A 1,000-byte array, of which 10 bytes come.
    let mut s = open().await;
    let header = TransferHeader::new(0, 1, ElementType::U8, &[1000]).unwrap();
    s.write_all(&header.encode()).await.unwrap();
    s.write_all(&[7; 10]).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut answer = [9u8; 1];
    let ended = tokio::time::timeout(T, s.read(&mut answer)).await;
    assert!(matches!(ended, Ok(Ok(0) | Err(_))), "{ended:?}");
    let took = started.elapsed();
    assert!(took >= stall && took < stall * 10, "ended after {took:?}");
    assert!(b.recv(0, 1, Duration::from_millis(100)).await.is_err());
    // The endpoint still serves a whole transfer on a new channel.
    let mut s = open().await;
    let mut whole = TransferHeader::new(0, 2, ElementType::U8, &[3])
        .unwrap()
        .encode();
    whole.extend_from_slice(b"abc");
    s.write_all(&whole).await.unwrap();
    s.read_exact(&mut answer).await.unwrap();
    assert_eq!(answer, [0]);
    assert_eq!(b.recv(0, 2, T).await.unwrap().data, b"abc");
}

/// An endpoint of rank 1 of job `j@1` with encryption off.
fn plain_receiver(payload_stall: Duration) -> TransferEndpoint {
    receiver(Encryption::Off, payload_stall)
}

/// An endpoint of rank 1 of job `j@1`.
fn receiver(encryption: Encryption, payload_stall: Duration) -> TransferEndpoint {
    let cfg = TransferConfig {
        encryption,
        job: "j@1".into(),
        payload_stall,
        ..TransferConfig::default()
    };
    TransferEndpoint::bind("127.0.0.1:0".parse().unwrap(), 1, None, cfg).unwrap()
}

/// A data channel's token for rank 0 of `b`'s job.
fn grant(b: &TransferEndpoint) -> [u8; 32] {
    grant_as(b, Encryption::Off).unwrap()
}

/// Keying material the tests' sealed channels get instead of a TLS
/// session's.
const MATERIAL: [u8; crate::seal::KEY_MATERIAL] = [0x5a; crate::seal::KEY_MATERIAL];

/// `b`'s answer to rank 0 asking for a channel of setting `asked`.
fn grant_as(b: &TransferEndpoint, asked: Encryption) -> std::result::Result<[u8; 32], String> {
    use crate::channel::{ChannelAnswer, ChannelRequest};
    let request = ChannelRequest {
        from: 0,
        job: "j@1".into(),
    };
    let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
    match b
        .channel_server
        .answer(&request, asked, from, |_| Ok(MATERIAL))
    {
        ChannelAnswer::Grant { token, .. } => Ok(token),
        ChannelAnswer::Refused(why) => Err(why),
    }
}

/// A connection to `b`'s data port that presented `token` and was
/// accepted.
async fn present(b: &TransferEndpoint, token: &[u8; 32]) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(b.data_addr().unwrap())
        .await
        .unwrap();
    s.write_all(token).await.unwrap();
    let mut ok = [9u8; 1];
    s.read_exact(&mut ok).await.unwrap();
    assert_eq!(ok, [0], "the token opens the channel");
    s
}

/// A data channel to `b` granted to rank 0.
async fn granted_channel(b: &TransferEndpoint) -> tokio::net::TcpStream {
    present(b, &grant(b)).await
}

/// A sealed channel to `b` granted to rank 0, as its sender: the socket,
/// and the sender's sealer and opener.
async fn sealed_channel(
    b: &TransferEndpoint,
) -> (
    tokio::net::TcpStream,
    crate::seal::Sealer,
    crate::seal::Opener,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let token = grant_as(b, Encryption::On).unwrap();
    let (sealer, mut opener) = crate::seal::keys(&MATERIAL, crate::seal::Side::Sender);
    let mut s = tokio::net::TcpStream::connect(b.data_addr().unwrap())
        .await
        .unwrap();
    s.write_all(&token).await.unwrap();
    let mut ok = [0u8; 4 + 1 + crate::seal::TAG_LEN];
    s.read_exact(&mut ok).await.unwrap();
    assert_eq!(
        opener.open_all(&ok).unwrap(),
        [0],
        "a sealed `0` opens the channel"
    );
    (s, sealer, opener)
}

/// The receiver's sealed answer on `s`, if one comes and opens.
async fn answer(
    s: &mut tokio::net::TcpStream,
    opener: &mut crate::seal::Opener,
) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut record = [0u8; 4 + 1 + crate::seal::TAG_LEN];
    s.read_exact(&mut record).await.ok()?;
    opener.open_all(&record).ok()
}

/// A sealed channel carries a transfer whose records it can open, and
/// ends on a record changed on the way, replayed or not sealed at all,
/// delivering nothing of it, or on an array over the limit; a plain
/// request is refused with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_channel_delivers_only_records_the_sender_sealed_in_order() {
    use tokio::io::AsyncWriteExt;
    let b = receiver(Encryption::On, TransferConfig::default().payload_stall);
    let why = grant_as(&b, Encryption::Off).unwrap_err();
    assert!(
        why.contains("encryption is on and the sender's is off"),
        "{why}"
    );

    let header = |tag: u64, len: u64| TransferHeader::new(0, tag, ElementType::U8, &[len]).unwrap();
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    // Whole records: the header frame, then the payload in two.
    let transfer = |sealer: &mut crate::seal::Sealer, tag: u64| {
        let mut wire = sealer
            .record(&header(tag, payload.len() as u64).encode())
            .unwrap();
        wire.extend(sealer.record(&payload[..200_000]).unwrap());
        wire.extend(sealer.record(&payload[200_000..]).unwrap());
        wire
    };
    let (mut s, mut sealer, mut opener) = sealed_channel(&b).await;
    s.write_all(&transfer(&mut sealer, 1)).await.unwrap();
    assert_eq!(answer(&mut s, &mut opener).await.unwrap(), [0]);
    assert!(b.recv(0, 1, T).await.unwrap().data == payload);

    // A changed byte in the payload's second record, in its header record,
    // a replayed record, or a header frame in the clear: the channel ends
    // and nothing is delivered.
    type Spoil = fn(&mut Vec<u8>);
    let kinds: [(&str, Spoil); 3] = [
        ("payload changed", |w| {
            let at = w.len() - 500;
            w[at] ^= 1;
        }),
        ("header changed", |w| w[8] ^= 0x80),
        ("record replayed", |w| {
            let first = w[..4 + 1].to_vec();
            let n = u32::from_be_bytes(first[..4].try_into().unwrap()) as usize;
            let record = w[..4 + n + crate::seal::TAG_LEN].to_vec();
            w.splice(0..0, record);
        }),
    ];
    for (i, (what, spoil)) in kinds.into_iter().enumerate() {
        let tag = 10 + i as u64;
        let (mut s, mut sealer, mut opener) = sealed_channel(&b).await;
        let mut wire = transfer(&mut sealer, tag);
        spoil(&mut wire);
        let _ = s.write_all(&wire).await;
        let answered = tokio::time::timeout(T, answer(&mut s, &mut opener))
            .await
            .unwrap();
        assert!(answered.is_none_or(|a| a != [0]), "{what}: not stored");
        assert!(
            b.recv(0, tag, Duration::from_millis(200)).await.is_err(),
            "{what}: nothing delivered"
        );
    }
    let (mut s, _, mut opener) = sealed_channel(&b).await;
    // (Long enough to fill the record its length prefix announces.)
    let mut clear = header(20, 100).encode();
    clear.extend_from_slice(&[7; 100]);
    let _ = s.write_all(&clear).await;
    let answered = tokio::time::timeout(T, answer(&mut s, &mut opener))
        .await
        .unwrap();
    assert!(
        answered.is_none_or(|a| a != [0]),
        "a clear transfer is not stored"
    );
    assert!(b.recv(0, 20, Duration::from_millis(200)).await.is_err());

    // A sealed header announcing an array over the limit: refused.
    let (mut s, mut sealer, mut opener) = sealed_channel(&b).await;
    let huge = TransferHeader::new(0, 21, ElementType::F32, &[1 << 40]).unwrap();
    s.write_all(&sealer.record(&huge.encode()).unwrap())
        .await
        .unwrap();
    let answered = tokio::time::timeout(T, answer(&mut s, &mut opener))
        .await
        .unwrap();
    assert_eq!(answered, Some(vec![1]), "refused with a sealed `1`");

    // The endpoint still serves a sealed sender.
    let (mut s, mut sealer, mut opener) = sealed_channel(&b).await;
    s.write_all(&transfer(&mut sealer, 30)).await.unwrap();
    assert_eq!(answer(&mut s, &mut opener).await.unwrap(), [0]);
    assert!(b.recv(0, 30, T).await.unwrap().data == payload);
}
