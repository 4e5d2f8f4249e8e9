//! A UDP relay for tests: what a host that stops answering looks like to
//! QUIC, without touching the network's rules.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::UdpSocket;

/// Relays datagrams between clients and `target`; while `frozen` is set it
/// drops them all, as a dead or cut-off host would.
pub(crate) async fn relay(target: SocketAddr, frozen: Arc<AtomicBool>) -> SocketAddr {
    let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let addr = front.local_addr().unwrap();
    tokio::spawn(async move {
        let mut upstreams: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = front.recv_from(&mut buf).await {
            if frozen.load(Ordering::Relaxed) {
                continue;
            }
            let up = match upstreams.get(&from) {
                Some(up) => up.clone(),
                None => {
                    let up = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
                    let (back, front, frozen) = (up.clone(), front.clone(), frozen.clone());
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 65536];
                        while let Ok(n) = back.recv(&mut buf).await {
                            if !frozen.load(Ordering::Relaxed) {
                                let _ = front.send_to(&buf[..n], from).await;
                            }
                        }
                    });
                    upstreams.insert(from, up.clone());
                    up
                }
            };
            let _ = up.send_to(&buf[..n], target).await;
        }
    });
    addr
}
