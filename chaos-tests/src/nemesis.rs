//! A randomized nemesis: a seed decides a schedule of faults against a
//! 3-replica cluster; the same seed gives the same schedule (the run's
//! interleavings still vary with the machine).
//!
//! Invariants:
//! 1. Faults come one at a time and each is healed before the next, so a
//!    majority is always up once the fault ends.
//! 2. The schedule depends only on the seed ([`schedule`] and
//!    [`worker_schedule`] are pure).
//! 3. A job's workers get faults of their own between the replicas' ones:
//!    killed (and restarted under the same id, as a supervisor would) or
//!    paused for less or more than their lease's TTL.

use std::time::Duration;

/// Which replica a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The leader when the fault starts.
    Leader,
    /// A replica that is not the leader then.
    Follower,
}

/// One fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL, then a restart from its folder.
    Kill,
    /// SIGSTOP, then SIGCONT.
    Pause,
    /// Its wall clock stepped by this offset (libfaketime's syntax), then
    /// back.
    ClockStep(&'static str),
    /// Its data folder's filesystem filled, then freed (and the replica
    /// restarted if it exited, as a supervisor would).
    DiskFull,
    /// Its packets to one other replica dropped (one way), then let
    /// through.
    OneWay,
    /// Cut off from both other replicas both ways while clients still
    /// reach it.
    Isolate,
    /// [`Fault::Isolate`] switched on and off every 300 ms (a flapping
    /// link).
    Flap,
}

/// A fault, whom it hits, when it starts (after the previous one healed)
/// and how long it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The fault.
    pub fault: Fault,
    /// Its target.
    pub target: Target,
    /// Quiet time before it.
    pub after: Duration,
    /// How long it lasts.
    pub lasts: Duration,
}

/// A small deterministic generator (no outside randomness in tests).
pub struct Lcg(pub u64);

impl Lcg {
    /// The next value (31 bits).
    pub fn draw(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.draw() % n
    }
}

/// The schedule of `steps` faults for `seed` (invariant 2).
pub fn schedule(seed: u64, steps: usize) -> Vec<Step> {
    let mut rng = Lcg(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..steps)
        .map(|_| {
            let fault = match rng.below(8) {
                0 => Fault::Kill,
                1 => Fault::Pause,
                2 => Fault::ClockStep("+1h"),
                3 => Fault::ClockStep("-30m"),
                4 => Fault::DiskFull,
                5 => Fault::OneWay,
                6 => Fault::Isolate,
                _ => Fault::Flap,
            };
            let target = match rng.below(2) {
                0 => Target::Leader,
                _ => Target::Follower,
            };
            Step {
                fault,
                target,
                after: Duration::from_millis(300 + rng.below(1200)),
                lasts: Duration::from_millis(800 + rng.below(2400)),
            }
        })
        .collect()
}

/// One fault on one of a job's workers (invariant 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerFault {
    /// SIGKILL, then the same worker id started again.
    Kill,
    /// SIGSTOP, then SIGCONT.
    Pause,
}

/// A worker fault, whom it hits (an index among the job's workers), when
/// it starts and how long it lasts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerStep {
    /// The fault.
    pub fault: WorkerFault,
    /// The worker's index.
    pub worker: usize,
    /// Quiet time before it.
    pub after: Duration,
    /// How long it lasts: 0.5–4 s, both sides of the tests' 1.5 s TTL.
    pub lasts: Duration,
}

/// The schedule of `steps` worker faults among `workers` for `seed`
/// (invariant 2).
pub fn worker_schedule(seed: u64, steps: usize, workers: usize) -> Vec<WorkerStep> {
    let mut rng = Lcg(seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
    (0..steps)
        .map(|_| WorkerStep {
            fault: match rng.below(2) {
                0 => WorkerFault::Kill,
                _ => WorkerFault::Pause,
            },
            worker: rng.below(workers as u64) as usize,
            after: Duration::from_millis(200 + rng.below(800)),
            lasts: Duration::from_millis(500 + rng.below(3500)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_and_seeds_differ() {
        assert_eq!(schedule(7, 6), schedule(7, 6));
        assert_ne!(schedule(7, 6), schedule(8, 6));
        // Over a few seeds every fault and both targets come up.
        let all: Vec<Step> = (1..=20).flat_map(|s| schedule(s, 6)).collect();
        for f in [
            Fault::Kill,
            Fault::Pause,
            Fault::ClockStep("+1h"),
            Fault::ClockStep("-30m"),
            Fault::DiskFull,
            Fault::OneWay,
            Fault::Isolate,
            Fault::Flap,
        ] {
            assert!(all.iter().any(|s| s.fault == f), "{f:?}");
        }
        assert!(all.iter().any(|s| s.target == Target::Leader));
        assert!(all.iter().any(|s| s.target == Target::Follower));
        let workers: Vec<WorkerStep> = (1..=20).flat_map(|s| worker_schedule(s, 4, 4)).collect();
        assert_eq!(worker_schedule(7, 4, 4), worker_schedule(7, 4, 4));
        for f in [WorkerFault::Kill, WorkerFault::Pause] {
            assert!(workers.iter().any(|s| s.fault == f), "{f:?}");
        }
        let ttl = Duration::from_millis(1500);
        assert!(workers.iter().any(|s| s.lasts < ttl) && workers.iter().any(|s| s.lasts > ttl));
    }
}
