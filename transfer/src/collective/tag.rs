//! Message tags of a communicator's calls (invariant 1): 64 bits of
//! group (16) | call sequence (24) | phase (2) | step (10) | chunk (12).

/// Most ring steps (10 bits) and chunks per message group (12 bits).
pub(super) const MAX_STEPS: usize = 1 << 10;
pub(super) const MAX_CHUNKS: usize = 1 << 12;

/// What a message of a call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Descriptor = 0,
    Reduce = 1,
    Gather = 2,
    Abort = 3,
}

/// One call's tags; [`Tag::at`] names a message within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tag(u64);

impl Tag {
    /// Call `seq` of communicator `group` (the sequence wraps at 2^24).
    pub(super) fn call(group: u16, seq: u64) -> Tag {
        Tag((u64::from(group) << 48) | ((seq & 0xff_ffff) << 24))
    }

    /// The message of `phase`, ring `step` (< [`MAX_STEPS`]) and `chunk`
    /// (< [`MAX_CHUNKS`]) of this call.
    pub(super) fn at(self, phase: Phase, step: usize, chunk: usize) -> u64 {
        debug_assert!(step < MAX_STEPS && chunk < MAX_CHUNKS);
        self.0 | ((phase as u64) << 22) | ((step as u64) << 12) | chunk as u64
    }

    /// The call's abort message.
    pub(super) fn abort(self) -> u64 {
        self.at(Phase::Abort, 0, 0)
    }

    /// Whether `tag` is a message of this call.
    pub(super) fn holds(self, tag: u64) -> bool {
        tag >> 24 == self.0 >> 24
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_of_different_calls_phases_steps_and_chunks_never_meet() {
        let a = Tag::call(7, 1);
        let b = Tag::call(7, 2);
        let other = Tag::call(8, 1);
        let t = a.at(Phase::Reduce, 3, 4);
        assert!(a.holds(t) && !b.holds(t) && !other.holds(t));
        assert_ne!(t, a.at(Phase::Gather, 3, 4));
        assert_ne!(t, a.at(Phase::Reduce, 4, 4));
        assert_ne!(t, a.at(Phase::Reduce, 3, 5));
        assert_ne!(a.abort(), a.at(Phase::Descriptor, 0, 0));
        assert_eq!(Tag::call(7, 1 + (1 << 24)), a, "the sequence wraps");
        assert!(a.holds(a.at(Phase::Gather, MAX_STEPS - 1, MAX_CHUNKS - 1)));
    }
}
