//! An accepted connection's stream limit, raised as its streams are used.
//!
//! quinn sets up state for every stream a peer may open, as soon as it
//! may: a limit of 1,024 cost each accepted connection about 80 KiB (2,000
//! connections to a replica: 120 KiB each; docs/performance.md), whether
//! it ever opened more than one stream or not. A worker holds about ten
//! at once; a connection shared by many callers (the benchmarks' simulated
//! hosts) holds hundreds. So a connection starts at [`FIRST_STREAMS`] and
//! earns more by using them.
//!
//! Invariants:
//! 1. The limit only grows, from [`FIRST_STREAMS`] to `MAX_STREAMS`.
//! 2. Once streams open at once reach half the limit, the limit is
//!    quadrupled (capped): a burst waits at most two round trips for
//!    credit, and never for streams that are not open.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::MAX_STREAMS;

/// Streams a dialer may open at once on an accepted connection at first.
pub const FIRST_STREAMS: u32 = 64;

/// Counts an accepted connection's open streams and raises its limit. Its
/// accept loop alone calls [`StreamCredit::accepted`], so the limit is
/// plain state; the count is shared with the streams being served.
pub struct StreamCredit {
    conn: quinn::Connection,
    limit: u32,
    open: Arc<AtomicU32>,
}

/// One accepted stream, counted open until dropped.
pub struct OpenStream(Arc<AtomicU32>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl StreamCredit {
    /// For `conn`, accepted with the listener's config (its limit
    /// [`FIRST_STREAMS`]).
    pub fn new(conn: &quinn::Connection) -> StreamCredit {
        StreamCredit {
            conn: conn.clone(),
            limit: FIRST_STREAMS,
            open: Arc::new(AtomicU32::new(0)),
        }
    }

    /// A stream was accepted: hold the result while it is served.
    /// Invariants 1–2: raises the limit if the open streams earn it.
    pub fn accepted(&mut self) -> OpenStream {
        let open = self.open.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(raised) = next_limit(self.limit, open) {
            self.limit = raised;
            self.conn.set_max_concurrent_bi_streams(raised.into());
        }
        OpenStream(self.open.clone())
    }
}

/// The limit after `open` streams at once under `limit`, if it changes.
fn next_limit(limit: u32, open: u32) -> Option<u32> {
    (open.saturating_mul(2) >= limit && limit < MAX_STREAMS)
        .then(|| limit.saturating_mul(4).min(MAX_STREAMS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_grows_at_half_use_and_stops_at_the_cap() {
        assert_eq!(next_limit(FIRST_STREAMS, 31), None);
        assert_eq!(next_limit(FIRST_STREAMS, 32), Some(256));
        assert_eq!(next_limit(256, 128), Some(MAX_STREAMS));
        assert_eq!(next_limit(MAX_STREAMS, MAX_STREAMS), None);
        // Never lowered, whatever the count.
        assert_eq!(next_limit(256, 0), None);
    }
}
