//! Finding a dead peer while calls wait on it (invariant 4): one watch per
//! connection, not one per call.
//!
//! Each waiting call ran its own 250 ms check before: at 16,384 simulated
//! hosts, ~80,000 held gets and watches woke four times a second each to
//! read their connection's statistics (under its lock) and were polled
//! again, reads included; the timer wheel, those polls and quinn's
//! `Chunks::new` were the top of the benchmark's profile, and the
//! benchmark used two thirds of the machine. Now a connection's watch
//! runs while any call waits on it and wakes them only when it finds the
//! peer silent.
//!
//! Invariants:
//! 1. A connection is found silent once it has received nothing for
//!    [`SILENCE`] while calls waited on it (counted from the watch's start,
//!    when the first of them began), nor for [`PROBE_ANSWER`] since a
//!    probe of ours (invariant 2) left this process, and this process
//!    could run: a check that comes late (this process starved of CPU, the
//!    peer's datagrams unread in the socket) starts the count again rather
//!    than blame the peer. Every call waiting then is woken, with its
//!    failure.
//! 2. While calls wait, a peer silent for [`PROBE_AFTER`] is probed, so a
//!    live one (whose QUIC stack acknowledges within its ACK delay, however
//!    busy its application) is never silent that long. The probe counts
//!    from when quinn sent it (its DATAGRAM frame counted sent), not from
//!    when it was queued: a busy process's connection task may send it
//!    hundreds of milliseconds later, and at 16,384 simulated hosts
//!    verdicts counted from the queueing failed live leaders by the
//!    thousand (docs/performance.md).
//! 3. The watch holds the connection only while calls wait on it: an
//!    unused pooled connection still closes when it is dropped.

use std::future::Future;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use quinn::Connection;
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a peer may send nothing while a call waits on it: twice
/// [`PROBE_AFTER`], so a probe of ours has gone unanswered for half a
/// second.
pub const SILENCE: Duration = Duration::from_secs(1);
const SILENCE_CHECK: Duration = Duration::from_millis(250);
/// A waiting call's peer is probed after this long without a datagram
/// (invariant 2): an empty QUIC datagram. Idle connections ping more
/// rarely (`tessel_tls`), and a heartbeating worker's never do.
pub const PROBE_AFTER: Duration = Duration::from_millis(500);
/// How long a probe that left this process goes unanswered before the
/// peer is found silent (invariant 1): the rest of [`SILENCE`]. A probe
/// leaves [`PROBE_AFTER`] into a silence at the earliest, so a verdict
/// also implies [`SILENCE`] without a datagram.
pub(crate) const PROBE_ANSWER: Duration = SILENCE.saturating_sub(PROBE_AFTER);

/// Why a call gave up on a silent peer.
pub(crate) fn silent_reason() -> String {
    format!("the peer sent nothing for {SILENCE:?}")
}

/// A connection with its watch for silence.
#[derive(Clone)]
pub struct Link {
    conn: Connection,
    silence: Arc<Silence>,
}

impl Deref for Link {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

struct Silence {
    /// Calls waiting, and whether the watch task runs (invariant 3).
    state: Mutex<Waiting>,
    /// Counts the times the connection was found silent.
    found: watch::Sender<u64>,
}

#[derive(Default)]
struct Waiting {
    calls: usize,
    watching: bool,
}

impl Link {
    /// `conn`, watched while calls wait on it.
    pub(crate) fn new(conn: Connection) -> Link {
        let silence = Silence {
            state: Mutex::default(),
            found: watch::Sender::new(0),
        };
        Link {
            conn,
            silence: Arc::new(silence),
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.silence.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once the connection is found silent (invariant 1).
    pub(crate) async fn until_silent(&self) {
        let mut found = self.silence.found.subscribe();
        let _waiting = CheckIn::new(self);
        // Ends with `Err` only if the sender is gone, which `self` holds.
        let _ = found.changed().await;
    }

    /// `work`, or `None` once the connection is found silent. Work done at
    /// once (a stream with credit, a write into the send buffer) does not
    /// check in.
    pub(crate) async fn unless_silent<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        let mut work = std::pin::pin!(work);
        if let Some(r) = work.as_mut().now_or_never() {
            return Some(r);
        }
        tokio::select! {
            r = work => Some(r),
            () = self.until_silent() => None,
        }
    }
}

/// One waiting call, counted while it lives; the first starts the watch.
struct CheckIn<'a>(&'a Link);

impl<'a> CheckIn<'a> {
    fn new(link: &'a Link) -> CheckIn<'a> {
        let mut w = link.waiting();
        w.calls += 1;
        if !w.watching {
            w.watching = true;
            tokio::spawn(watch_silence(link.clone()));
        }
        CheckIn(link)
    }
}

impl Drop for CheckIn<'_> {
    fn drop(&mut self) {
        self.0.waiting().calls -= 1;
    }
}

/// A probe sent while calls waited, until anything is received.
#[derive(Clone, Copy)]
enum Probe {
    /// None sent since the last datagram received.
    None,
    /// Queued; quinn had sent this many DATAGRAM frames before it.
    Queued(u64),
    /// Seen sent by the check at this instant.
    Sent(Instant),
}

/// Counts the time this process could watch (invariant 1): from its
/// start, restarted by a check that comes more than twice its period late.
/// A connection's watch and a keep-alive lane's check (client
/// `keep_alives` invariant 6) both count silence with it.
pub(crate) struct Watched {
    since: Instant,
    checked: Instant,
}

impl Watched {
    pub(crate) fn from_now() -> Watched {
        let now = Instant::now();
        Watched {
            since: now,
            checked: now,
        }
    }

    /// Counts again from now.
    pub(crate) fn restart(&mut self) {
        *self = Watched::from_now();
    }

    /// How long was watched, at a check `period` after the last; `None`
    /// when this check came late, which starts the count again.
    pub(crate) fn check(&mut self, period: Duration) -> Option<Duration> {
        let now = Instant::now();
        let late = now.duration_since(self.checked) > period * 2;
        self.checked = now;
        if late {
            self.since = now;
            return None;
        }
        Some(now.duration_since(self.since))
    }
}

/// Checks `link` every [`SILENCE_CHECK`] while calls wait on it.
async fn watch_silence(link: Link) {
    let mut seen = link.conn.stats().udp_rx.datagrams;
    let mut watched = Watched::from_now();
    let mut probe = Probe::None;
    loop {
        tokio::time::sleep(SILENCE_CHECK).await;
        let watched_for = watched.check(SILENCE_CHECK);
        {
            let mut w = link.waiting();
            if w.calls == 0 {
                // Invariant 3: the next call starts another watch.
                w.watching = false;
                return;
            }
        }
        let stats = link.conn.stats();
        let silent_for = match watched_for {
            Some(d) if stats.udp_rx.datagrams == seen => d,
            _ => {
                (seen, probe) = (stats.udp_rx.datagrams, Probe::None);
                watched.restart();
                continue;
            }
        };
        let now = Instant::now();
        probe = match probe {
            Probe::None if silent_for >= PROBE_AFTER => {
                // Unsent only when the connection is closing, which ends
                // the calls anyway.
                let _ = link.conn.send_datagram(bytes::Bytes::new());
                Probe::Queued(stats.frame_tx.datagram)
            }
            Probe::Queued(before) if stats.frame_tx.datagram > before => Probe::Sent(now),
            Probe::Sent(at) if now.duration_since(at) >= PROBE_ANSWER => {
                link.silence.found.send_modify(|n| *n += 1);
                watched.restart();
                Probe::None
            }
            unchanged => unchanged,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Invariant 1 (and client `keep_alives` invariant 6): a check that
    /// comes late (this process starved) starts the count again; checks on
    /// time add up.
    #[test]
    fn a_check_that_comes_late_starts_the_count_again() {
        let period = Duration::from_millis(100);
        let mut watched = Watched::from_now();
        std::thread::sleep(period);
        assert!(
            watched.check(period).is_some_and(|w| w >= period),
            "on time: counted"
        );
        std::thread::sleep(period * 3);
        assert!(
            watched.check(period).is_none_or(|w| w < period),
            "late: not counted"
        );
        std::thread::sleep(period);
        let counted = watched.check(period).unwrap_or_default();
        assert!(counted >= period && counted < period * 3, "{counted:?}");
    }
}
