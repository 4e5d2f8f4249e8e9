//! A replica's QUIC stack on a thread of its own (invariant 6 of the
//! module): the endpoint's and every connection's driver, which read the
//! socket, acknowledge, probe and send, run on a one-thread runtime that
//! does nothing else.
//!
//! On the replica's own runtime (one thread, `--worker-threads`) they
//! waited behind every request task woken before them. At 16,384
//! simulated hosts that queue passed a second on a busy replica: its
//! acknowledgements stopped, its clients found it silent (`silence`
//! invariant 1 assumes a live peer's QUIC stack answers within its ACK
//! delay, however busy its application), dialled again by the hundred
//! (handshakes aborted in the replica's log) and sent their keep-alives
//! elsewhere or late, and leases of live workers expired
//! (docs/performance.md, "The QUIC stack on its own thread").
//!
//! Requests are still served on the replica's runtime, so a busy replica
//! is slow but never silent. Keep-alive streams are the exception: a
//! frame's work is a few microseconds and no lock an apply holds, and
//! served here it wakes no other thread (node `keep_alives` invariant 4).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use quinn::{AsyncTimer, AsyncUdpSocket, Runtime, TokioRuntime};
use tokio::runtime::Handle;

/// quinn's tokio runtime, with its tasks, timers and socket on the I/O
/// thread's runtime instead of the caller's.
#[derive(Debug)]
pub(crate) struct IoThread(Handle);

impl IoThread {
    /// The process's I/O thread, started on first use and kept for the
    /// process's life (endpoints of several in-process replicas share it).
    pub(crate) fn shared() -> io::Result<Arc<IoThread>> {
        static SHARED: Mutex<Option<Arc<IoThread>>> = Mutex::new(None);
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = &*shared {
            return Ok(t.clone());
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("quic-io".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
        Ok(shared.insert(Arc::new(IoThread(handle))).clone())
    }

    /// An "I/O thread" that is `runtime`, the drivers back with the caller:
    /// tests stop it with the runtime, as a killed process's QUIC stack
    /// stops with it.
    pub(crate) fn on(runtime: Handle) -> IoThread {
        IoThread(runtime)
    }

    /// The I/O thread's runtime, for tasks whose owner keeps them in a
    /// `JoinSet` (aborted with it).
    pub(crate) fn handle(&self) -> &Handle {
        &self.0
    }

    /// Runs `task` on the I/O thread.
    pub(crate) fn spawn_here<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.0.spawn(task)
    }
}

impl Runtime for IoThread {
    fn new_timer(&self, t: Instant) -> Pin<Box<dyn AsyncTimer>> {
        // A timer belongs to the runtime it is made in.
        let _on = self.0.enter();
        TokioRuntime.new_timer(t)
    }

    fn spawn(&self, future: Pin<Box<dyn Future<Output = ()> + Send>>) {
        self.0.spawn(future);
    }

    fn wrap_udp_socket(&self, sock: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
        // The socket is registered with the I/O thread's reactor.
        let _on = self.0.enter();
        TokioRuntime.wrap_udp_socket(sock)
    }

    fn now(&self) -> Instant {
        TokioRuntime.now()
    }
}
