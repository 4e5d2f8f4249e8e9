//! A command job's output: every line of every process, shipped to the
//! key-value service in chunks under `jobs/{id}/logs/{attempt}/{process}/`
//! (bounded: the newest [`MAX_CHUNKS`] kept), and its last lines kept here
//! for a failure's summary. Logs are best effort: a store that refuses a
//! chunk loses that chunk, never the job.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessel_coordinator::{Item, Records};
use tessel_kv::KvStore;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::sync::mpsc;

/// Longest line kept; the rest is cut and marked.
pub(crate) const MAX_LINE: usize = 4096;
/// A chunk is shipped once this many bytes wait, or every [`FLUSH_EVERY`].
pub(crate) const CHUNK: usize = 32 * 1024;
/// Chunks kept per process and attempt (2 MiB); older ones are deleted.
pub(crate) const MAX_CHUNKS: u64 = 64;
/// Lines kept for a failure's summary.
pub(crate) const TAIL: usize = 12;
const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// One process's output as it is shipped, pure.
#[derive(Debug, Default)]
pub(crate) struct ProcessLog {
    pending: Vec<u8>,
    next_seq: u64,
    tail: VecDeque<String>,
}

impl ProcessLog {
    /// Adds a line (without its newline), cut to [`MAX_LINE`].
    pub(crate) fn push(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(&line[..line.len().min(MAX_LINE)]);
        let text = if line.len() > MAX_LINE {
            format!("{text}… [{} bytes cut]", line.len() - MAX_LINE)
        } else {
            text.into_owned()
        };
        self.pending.extend_from_slice(text.as_bytes());
        self.pending.push(b'\n');
        if self.tail.len() == TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(text);
    }

    /// Whether a chunk should go now.
    pub(crate) fn full(&self) -> bool {
        self.pending.len() >= CHUNK
    }

    /// The next chunk to ship, its sequence number, and the chunk that
    /// falls out of the kept window with it.
    pub(crate) fn take(&mut self) -> Option<(u64, Vec<u8>, Option<u64>)> {
        if self.pending.is_empty() {
            return None;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let expired = seq.checked_sub(MAX_CHUNKS);
        Some((seq, std::mem::take(&mut self.pending), expired))
    }
}

/// The last lines of every local process, by local rank.
pub(crate) type Tails = Arc<Mutex<BTreeMap<u32, VecDeque<String>>>>;

/// Ships the lines of a placement's processes until every sender is gone.
pub(crate) struct Shipper {
    kv: Arc<dyn KvStore>,
    job_id: String,
    attempt: u32,
    /// Global rank of local process 0.
    first_rank: u32,
    logs: BTreeMap<u32, ProcessLog>,
    tails: Tails,
    /// `None`: lines go to the key-value service only.
    echo: Option<super::echo::EchoBudget>,
}

impl Shipper {
    pub(crate) fn new(kv: Arc<dyn KvStore>, job_id: &str, attempt: u32, first_rank: u32) -> Self {
        Shipper {
            kv,
            job_id: job_id.to_owned(),
            attempt,
            first_rank,
            logs: BTreeMap::new(),
            tails: Tails::default(),
            echo: Some(super::echo::EchoBudget::new(std::time::Instant::now())),
        }
    }

    /// Whether lines are also echoed on the worker's stdout.
    pub(crate) fn echo_lines(mut self, on: bool) -> Self {
        if !on {
            self.echo = None;
        }
        self
    }

    pub(crate) fn tails(&self) -> Tails {
        self.tails.clone()
    }

    /// Receives `(local rank, line)` until the channel closes, shipping
    /// as it goes and everything at the end.
    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<(u32, Vec<u8>)>) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        loop {
            tokio::select! {
                line = rx.recv() => match line {
                    Some((local, line)) => {
                        self.echo(local, &line);
                        let log = self.logs.entry(local).or_default();
                        log.push(&line);
                        self.tails.lock().expect("not poisoned").insert(local, log.tail.clone());
                        if log.full() {
                            self.flush(local).await;
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    let locals: Vec<u32> = self.logs.keys().copied().collect();
                    for local in locals {
                        self.flush(local).await;
                    }
                }
            }
        }
        let locals: Vec<u32> = self.logs.keys().copied().collect();
        for local in locals {
            self.flush(local).await;
        }
    }

    /// Echoes a line on the worker's stdout, within the budget.
    fn echo(&mut self, local: u32, line: &[u8]) {
        use std::io::Write;
        let line = &line[..line.len().min(MAX_LINE)];
        let Some(budget) = &mut self.echo else {
            return;
        };
        if let super::echo::Admit::Echo { dropped } =
            budget.admit(std::time::Instant::now(), line.len())
        {
            let text = super::echo::format_line(
                &self.job_id,
                self.attempt,
                self.first_rank + local,
                line,
                dropped,
            );
            // A closed stdout must not stop the job or its KV copy.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
        }
    }

    async fn flush(&mut self, local: u32) {
        let Some((seq, bytes, expired)) = self.logs.get_mut(&local).and_then(ProcessLog::take)
        else {
            return;
        };
        let rank = self.first_rank + local;
        let records = Records::new(&*self.kv, &self.job_id);
        let log = |seq| Item::Log {
            attempt: self.attempt,
            process: rank,
            seq,
        };
        if let Err(e) = records.put(log(seq), &bytes).await {
            tracing::warn!(job = %self.job_id, process = rank, error = %e, "a log chunk was lost");
        }
        if let Some(old) = expired {
            let _ = records.delete(log(old)).await;
        }
    }
}

/// Reads `stream` line by line into `tx` as local process `local`'s.
pub(crate) async fn forward(
    stream: impl AsyncRead + Unpin,
    local: u32,
    tx: mpsc::Sender<(u32, Vec<u8>)>,
) {
    // Bounded reads: a line longer than the cut is read in pieces.
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_LINE as u64 * 4)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                if tx.send((local, line.clone())).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_and_chunks_rotate_out_of_the_window() {
        let mut log = ProcessLog::default();
        log.push(&vec![b'x'; MAX_LINE + 10]);
        let (seq, bytes, expired) = log.take().unwrap();
        assert_eq!((seq, expired), (0, None));
        assert!(String::from_utf8(bytes)
            .unwrap()
            .ends_with("[10 bytes cut]\n"));
        assert!(log.take().is_none(), "nothing pending, nothing shipped");
        for i in 1..=MAX_CHUNKS {
            log.push(format!("line {i}").as_bytes());
            let (seq, bytes, expired) = log.take().unwrap();
            assert_eq!(seq, i);
            assert_eq!(bytes, format!("line {i}\n").into_bytes());
            assert_eq!(expired, (i >= MAX_CHUNKS).then(|| i - MAX_CHUNKS));
        }
        // The tail holds the newest lines, in order.
        assert_eq!(log.tail.len(), TAIL);
        assert_eq!(log.tail.back().unwrap(), &format!("line {MAX_CHUNKS}"));
    }

    #[test]
    fn a_chunk_is_due_once_enough_waits() {
        let mut log = ProcessLog::default();
        let line = vec![b'a'; 1000];
        while !log.full() {
            log.push(&line);
        }
        assert!(log.pending.len() >= CHUNK && log.pending.len() < CHUNK + 1001);
    }
}
