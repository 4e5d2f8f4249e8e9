//! The ring all-reduce over plain TCP: the floor that `tessel-bench
//! transfer` measures beside the network path (`tcp_ring`).
//!
//! Same segments, same steps and same reduction order as
//! `tessel_transfer`'s ring (`tessel_transfer::reduce` module docs), so the
//! result equals the network path's bit for bit. What it leaves out is
//! everything but moving and folding bytes: no encryption, no framing, no
//! acknowledgements, no copy but the kernel's. A segment is written
//! straight from the array, and read straight into it (all-gather) or into
//! one chunk of scratch that is folded into it (reduce-scatter).
//!
//! Invariants:
//! 1. Rank r writes only to r+1 and reads only from r−1, one TCP connection
//!    each way; a step's write has its own thread, so no rank blocks on a
//!    full socket buffer nobody drains.
//! 2. The steps are the ring's own (`reduce_scatter_step`, `all_gather_step`);
//!    a step starts only after the previous one ended.
//! 3. Every read and write has the command's deadline as its socket timeout:
//!    a rank that dies or stalls fails the others, never hangs them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::time::Duration;

use anyhow::{Context, Result};
use tessel::pjrt::ElementType;
use tessel_transfer::reduce::{
    all_gather_step, byte_segments, combine, disjoint, finish_mean, reduce_scatter_step,
};
use tessel_transfer::{Peer, ReduceOp, TransferEndpoint};

/// Endpoint tag on which a rank tells rank r−1 its listening port. The
/// collectives' tags carry their group (1 in `transfer-rank`) in the top
/// 16 bits, so this one is never theirs.
const PORT_TAG: u64 = u64::MAX;

/// One rank's two connections of the ring.
pub struct TcpRing {
    rank: usize,
    n: usize,
    /// To rank + 1.
    next: TcpStream,
    /// From rank − 1.
    prev: TcpStream,
}

impl TcpRing {
    /// Listens on loopback port 0, tells rank r−1 the port over `endpoint`,
    /// connects to rank r+1's and accepts rank r−1's connection.
    pub async fn connect(
        endpoint: &TransferEndpoint,
        members: &[Peer],
        rank: usize,
        timeout: Duration,
    ) -> Result<TcpRing> {
        let n = members.len();
        anyhow::ensure!(n >= 2, "the TCP ring needs two ranks or more");
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port().to_le_bytes();
        let prev_rank = (rank + n - 1) % n;
        endpoint
            .send_to(
                &members[prev_rank],
                PORT_TAG,
                ElementType::U8,
                &[2],
                &port,
                timeout,
            )
            .await?;
        let next_rank = (rank + 1) % n;
        let got = endpoint.recv(next_rank as u32, PORT_TAG, timeout).await?;
        let port: [u8; 2] = got
            .data
            .as_slice()
            .try_into()
            .context("rank r+1 sent no port")?;
        let next_addr = SocketAddr::from(([127, 0, 0, 1], u16::from_le_bytes(port)));
        tokio::task::spawn_blocking(move || -> Result<TcpRing> {
            // The kernel completes this handshake into rank r+1's backlog
            // whether or not it accepts yet, so connect-then-accept cannot
            // deadlock around the ring.
            let next = TcpStream::connect_timeout(&next_addr, timeout)
                .with_context(|| format!("connecting to rank {next_rank}"))?;
            let (prev, _) = listener.accept().context("accepting rank r-1")?;
            for s in [&next, &prev] {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
            }
            Ok(TcpRing {
                rank,
                n,
                next,
                prev,
            })
        })
        .await?
    }

    /// All-reduces `data` (elements of `dtype`) in place across the ring,
    /// reading at most `chunk_bytes` at a time.
    pub fn all_reduce(
        &mut self,
        op: ReduceOp,
        dtype: ElementType,
        data: &mut [u8],
        chunk_bytes: usize,
    ) -> Result<()> {
        let size = dtype.size();
        anyhow::ensure!(
            data.len() % size == 0,
            "{} bytes is not a whole number of {}",
            data.len(),
            dtype.name()
        );
        let (n, r) = (self.n, self.rank);
        let segs = byte_segments(dtype, data.len(), n);
        let chunk = (chunk_bytes / size).max(1) * size;
        let mut scratch = vec![0u8; chunk];
        for s in 0..n - 1 {
            let (send, recv) = reduce_scatter_step(n, r, s);
            self.step(data, &segs[send], &segs[recv], chunk, |own, prev| {
                let incoming = &mut scratch[..own.len()];
                prev.read_exact(incoming)?;
                combine(op, dtype, own, incoming)?;
                Ok(())
            })?;
        }
        if op == ReduceOp::Mean {
            finish_mean(dtype, &mut data[segs[r].clone()], n)?;
        }
        for s in 0..n - 1 {
            let (send, recv) = all_gather_step(n, r, s);
            self.step(data, &segs[send], &segs[recv], chunk, |own, prev| {
                prev.read_exact(own)?;
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Writes `data[send]` to rank r+1 while `take` handles `data[recv]`
    /// from rank r−1, `chunk` bytes at a time.
    fn step(
        &mut self,
        data: &mut [u8],
        send: &Range<usize>,
        recv: &Range<usize>,
        chunk: usize,
        mut take: impl FnMut(&mut [u8], &mut TcpStream) -> Result<()>,
    ) -> Result<()> {
        let (out, into) = disjoint(data, send.clone(), recv.clone());
        let next = &mut self.next;
        let prev = &mut self.prev;
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || next.write_all(out));
            let read = into.chunks_mut(chunk).try_for_each(|c| take(c, prev));
            let wrote = writer.join().expect("the ring's writer thread panicked");
            read.context("receiving from rank r-1")?;
            wrote.context("sending to rank r+1")
        })
    }
}
