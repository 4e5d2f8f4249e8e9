//! A command job's output on the worker's own stdout, where `kubectl logs`
//! and every cluster log agent look, beside the copy in the key-value
//! service. Each line is prefixed with its job, attempt and process:
//!
//! ```text
//! [mlp-3a2f@1 p0] step 100 loss 0.42
//! ```
//!
//! A token bucket per job on a worker bounds what it echoes, so a chatty
//! job cannot starve the worker (or its node's log pipeline); lines over the budget
//! are counted, not echoed, and the count is printed once the budget
//! returns. The KV copy keeps every line either way.

use std::time::Instant;

/// Sustained bytes per second a job's processes on one worker echo.
pub(crate) const RATE: f64 = 512.0 * 1024.0;
/// Bytes it may echo in a burst.
pub(crate) const BURST: f64 = 2.0 * 1024.0 * 1024.0;

/// What to do with one line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Echo it; `dropped` lines were left out before it.
    Echo { dropped: u64 },
    /// Over the budget: leave it out.
    Drop,
}

/// The token bucket, pure: the caller passes the time.
#[derive(Debug)]
pub(crate) struct EchoBudget {
    tokens: f64,
    last: Instant,
    dropped: u64,
    rate: f64,
    burst: f64,
}

impl EchoBudget {
    pub(crate) fn new(now: Instant) -> Self {
        Self::with(now, RATE, BURST)
    }

    pub(crate) fn with(now: Instant, rate: f64, burst: f64) -> Self {
        EchoBudget {
            tokens: burst,
            last: now,
            dropped: 0,
            rate,
            burst,
        }
    }

    /// Whether a line of `len` bytes is echoed at `now`.
    pub(crate) fn admit(&mut self, now: Instant, len: usize) -> Admit {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        let cost = len as f64 + 1.0;
        if self.tokens < cost {
            self.dropped += 1;
            return Admit::Drop;
        }
        self.tokens -= cost;
        Admit::Echo {
            dropped: std::mem::take(&mut self.dropped),
        }
    }
}

/// The echoed line for global rank `rank` of `job`'s `attempt`.
pub(crate) fn format_line(job: &str, attempt: u32, rank: u32, line: &[u8], dropped: u64) -> String {
    let prefix = format!("[{job}@{attempt} p{rank}]");
    let text = String::from_utf8_lossy(line);
    if dropped == 0 {
        format!("{prefix} {text}\n")
    } else {
        format!("{prefix} … {dropped} lines not echoed (over the worker's log rate; all are in `tessel logs`)\n{prefix} {text}\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_over_the_budget_is_counted_and_reported_when_it_refills() {
        let t0 = Instant::now();
        // 100 bytes a second, 1,000 in a burst.
        let mut b = EchoBudget::with(t0, 100.0, 1000.0);
        let mut echoed = 0;
        for _ in 0..50 {
            if b.admit(t0, 99) != Admit::Drop {
                echoed += 1;
            }
        }
        assert_eq!(echoed, 10, "the burst holds ten 100-byte lines");
        // A second later one more line fits and reports the 40 left out.
        assert_eq!(
            b.admit(t0 + Duration::from_secs(1), 99),
            Admit::Echo { dropped: 40 }
        );
        assert_eq!(
            b.admit(t0 + Duration::from_secs(2), 99),
            Admit::Echo { dropped: 0 }
        );
        // The bucket never holds more than the burst.
        let mut b = EchoBudget::with(t0, 100.0, 1000.0);
        let later = t0 + Duration::from_secs(3600);
        let n = (0..50)
            .filter(|_| b.admit(later, 99) != Admit::Drop)
            .count();
        assert_eq!(n, 10);
    }

    #[test]
    fn lines_name_their_job_attempt_and_process() {
        assert_eq!(
            format_line("mlp-1", 2, 3, b"loss 0.5", 0),
            "[mlp-1@2 p3] loss 0.5\n"
        );
        let s = format_line("j", 0, 0, b"x", 7);
        assert!(s.starts_with("[j@0 p0] … 7 lines not echoed"), "{s}");
        assert!(s.ends_with("[j@0 p0] x\n"));
    }
}
