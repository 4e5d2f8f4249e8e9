//! A userspace UDP relay that adds latency (this kernel has no netem):
//! clients send to [`DelayRelay::addr`], every datagram reaches the
//! target the relay's delay later, and every answer reaches the client
//! that delay later again. One upstream socket per client keeps QUIC's
//! connections apart. Traffic goes only to the target given (a host of
//! the test). The delay can be changed while it runs
//! ([`DelayRelay::set_delay`]): a test can compare the same processes on
//! the same path with and without it, turn by turn.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A running relay; stops when dropped.
pub struct DelayRelay {
    /// Where it listens (it forwards to its target).
    pub addr: SocketAddr,
    /// The delay each way, in microseconds, read as each datagram arrives.
    delay_us: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends what the queue holds, each datagram at its due time, in order.
fn delayed_sender(
    socket: Arc<UdpSocket>,
    to: SocketAddr,
) -> mpsc::UnboundedSender<(Instant, Vec<u8>)> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((due, datagram)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            let _ = socket.send_to(&datagram, to).await;
        }
    });
    tx
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl DelayRelay {
    /// Listens on `listen` (port 0 picks one) and relays to `target`.
    pub async fn start(listen: SocketAddr, target: SocketAddr, delay: Duration) -> DelayRelay {
        let front = Arc::new(UdpSocket::bind(listen).await.expect("bind the relay"));
        let addr = front.local_addr().unwrap();
        let delay_us = Arc::new(AtomicU64::new(micros(delay)));
        let current = delay_us.clone();
        // A datagram is due its arrival plus the delay at that moment: one
        // that arrives after a change may be due before one queued ahead
        // of it, and is sent right after it (order is kept).
        let due = move || Instant::now() + Duration::from_micros(current.load(Ordering::Relaxed));
        let task = tokio::spawn(async move {
            let any: SocketAddr = if target.is_ipv4() {
                "0.0.0.0:0"
            } else {
                "[::]:0"
            }
            .parse()
            .unwrap();
            let mut upstream: HashMap<SocketAddr, mpsc::UnboundedSender<(Instant, Vec<u8>)>> =
                HashMap::new();
            let mut buf = vec![0u8; 65_536];
            loop {
                let Ok((n, client)) = front.recv_from(&mut buf).await else {
                    return;
                };
                let at = due();
                let tx = upstream.entry(client).or_insert_with(|| {
                    let back = std::net::UdpSocket::bind(any).expect("bind");
                    back.set_nonblocking(true).unwrap();
                    let back = Arc::new(UdpSocket::from_std(back).unwrap());
                    // Answers go back to the client through the front.
                    let to_client = delayed_sender(front.clone(), client);
                    let reader = back.clone();
                    let due = due.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 65_536];
                        while let Ok((n, _)) = reader.recv_from(&mut buf).await {
                            if to_client.send((due(), buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                    });
                    delayed_sender(back, target)
                });
                let _ = tx.send((at, buf[..n].to_vec()));
            }
        });
        DelayRelay {
            addr,
            delay_us,
            task,
        }
    }

    /// Delays the datagrams that arrive from now on by `delay` each way.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us.store(micros(delay), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn datagrams_arrive_late_both_ways_and_in_order() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let target = server.local_addr().unwrap();
        let relay = DelayRelay::start(
            "127.0.0.1:0".parse().unwrap(),
            target,
            Duration::from_millis(50),
        )
        .await;
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let started = Instant::now();
        for i in 0..10u8 {
            client.send_to(&[i], relay.addr).await.unwrap();
        }
        let mut buf = [0u8; 8];
        let mut from = None;
        for i in 0..10u8 {
            let (n, f) = server.recv_from(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], &[i]);
            from = Some(f);
        }
        assert!(started.elapsed() >= Duration::from_millis(50));
        server.send_to(b"ok", from.unwrap()).await.unwrap();
        let (n, f) = client.recv_from(&mut buf).await.unwrap();
        assert_eq!((&buf[..n], f), (&b"ok"[..], relay.addr));
        assert!(started.elapsed() >= Duration::from_millis(100));
    }

    /// A changed delay holds for the datagrams that arrive after it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_changed_delay_holds_for_what_arrives_next() {
        let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let relay = DelayRelay::start(
            "127.0.0.1:0".parse().unwrap(),
            server.local_addr().unwrap(),
            Duration::from_secs(2),
        )
        .await;
        relay.set_delay(Duration::ZERO);
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let started = Instant::now();
        client.send_to(b"now", relay.addr).await.unwrap();
        let mut buf = [0u8; 8];
        let (n, _) = server.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"now");
        assert!(started.elapsed() < Duration::from_secs(2), "not delayed");
        relay.set_delay(Duration::from_millis(100));
        let started = Instant::now();
        client.send_to(b"later", relay.addr).await.unwrap();
        let (n, _) = server.recv_from(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"later");
        assert!(started.elapsed() >= Duration::from_millis(100));
    }
}
