//! A filter of the keys a state machine may hold on disk: a write to a new
//! key (the common case: PJRT's `kv_put`, topology and job records) learns
//! that the key is absent without a B-tree lookup in `state.redb`.
//!
//! A scalable Bloom filter: a chain of Bloom filters, each twice the
//! capacity of the one before; keys go into the newest, lookups ask all.
//!
//! Invariants:
//! 1. No false negatives: once `insert(k)` returned, `may_contain(k)` is
//!    true for the life of the filter. Bits are only ever set.
//! 2. A key `may_contain` already reports is not inserted again, so
//!    [`KeyFilter::inserted`] counts distinct keys (less the few that were
//!    false positives when inserted) and rewriting a key costs nothing.
//! 3. Each filter in the chain is filled to at most its capacity, at about
//!    [`FALSE_POSITIVE_RATE`]; the chain's rate is at most that times the
//!    number of filters, which grows with the logarithm of the keys.
//! 4. Removing keys is not possible: a removed key stays a (harmless)
//!    positive. The owner rebuilds the filter from the keys that exist when
//!    [`KeyFilter::inserted`] far exceeds them (`sm` invariant 8).

use std::hash::Hasher;

/// Bits per key: with [`HASHES`] probes, about 0.8 % false positives.
const BITS_PER_KEY: usize = 10;
const HASHES: u32 = 7;
/// The false-positive rate of one full filter in the chain (invariant 3).
pub const FALSE_POSITIVE_RATE: f64 = 0.0082;
/// The first filter's capacity when none is asked for.
pub const MIN_CAPACITY: usize = 1 << 16;

struct Bloom {
    bits: Vec<u64>,
    capacity: usize,
    inserted: usize,
}

impl Bloom {
    fn with_capacity(capacity: usize) -> Bloom {
        let words = (capacity * BITS_PER_KEY).div_ceil(64).max(1);
        Bloom {
            bits: vec![0; words],
            capacity,
            inserted: 0,
        }
    }

    /// Bits in the filter.
    fn len(&self) -> u64 {
        self.bits.len() as u64 * 64
    }

    fn may_contain(&self, h: (u64, u64)) -> bool {
        positions(h, self.len()).all(|p| self.bits[(p / 64) as usize] & (1 << (p % 64)) != 0)
    }

    fn insert(&mut self, h: (u64, u64)) {
        for p in positions(h, self.len()) {
            self.bits[(p / 64) as usize] |= 1 << (p % 64);
        }
        self.inserted += 1;
    }
}

/// The bit positions, below `len`, of a key with hashes `(h1, h2)`: double
/// hashing (Kirsch and Mitzenmacher), each probe mapped onto `0..len` by a
/// multiply and shift rather than a division.
fn positions((h1, h2): (u64, u64), len: u64) -> impl Iterator<Item = u64> {
    (0..HASHES as u64).map(move |i| {
        let probe = h1.wrapping_add(i.wrapping_mul(h2));
        ((u128::from(probe) * u128::from(len)) >> 64) as u64
    })
}

/// Two 64-bit hashes of `key` from one SipHash pass (fixed keys: the
/// filter is rebuilt on every start, nothing depends on its layout; a key
/// chosen to collide costs a lookup, never a wrong answer). The second is
/// the first's halves swapped and mixed, odd so that one key's probes do
/// not repeat early.
fn hashes(key: &[u8]) -> (u64, u64) {
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(key);
    let h1 = hasher.finish();
    let h2 = h1.rotate_left(32).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (h1, h2)
}

/// The keys a table may hold; see the module docs.
pub struct KeyFilter {
    chain: Vec<Bloom>,
}

impl KeyFilter {
    /// An empty filter whose first link holds `capacity` keys (at least
    /// [`MIN_CAPACITY`]).
    pub fn with_capacity(capacity: usize) -> KeyFilter {
        KeyFilter {
            chain: vec![Bloom::with_capacity(capacity.max(MIN_CAPACITY))],
        }
    }

    /// A filter of `keys`, sized for twice as many.
    pub fn from_keys<K: AsRef<[u8]>, E>(
        count: usize,
        keys: impl IntoIterator<Item = Result<K, E>>,
    ) -> Result<KeyFilter, E> {
        let mut f = KeyFilter::with_capacity(count.saturating_mul(2));
        for k in keys {
            f.insert(k?.as_ref());
        }
        Ok(f)
    }

    /// False when `key` was never inserted; true when it was, and for a
    /// small fraction of other keys (invariants 1, 3).
    pub fn may_contain(&self, key: &[u8]) -> bool {
        self.holds(hashes(key))
    }

    fn holds(&self, h: (u64, u64)) -> bool {
        self.chain.iter().any(|b| b.may_contain(h))
    }

    /// Adds `key` (invariant 2: not again if it may be present).
    pub fn insert(&mut self, key: &[u8]) {
        let h = hashes(key);
        if self.holds(h) {
            return;
        }
        let last = self.chain.last().expect("the chain is never empty");
        if last.inserted >= last.capacity {
            let next = Bloom::with_capacity(last.capacity.saturating_mul(2));
            self.chain.push(next);
        }
        self.chain
            .last_mut()
            .expect("the chain is never empty")
            .insert(h);
    }

    /// Keys inserted (invariant 2).
    pub fn inserted(&self) -> usize {
        self.chain.iter().map(|b| b.inserted).sum()
    }

    /// Memory held by the bits.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.chain.iter().map(|b| b.bits.len() * 8).sum()
    }

    /// Filters in the chain (invariant 3).
    #[cfg(test)]
    fn links(&self) -> usize {
        self.chain.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Vec<u8> {
        format!("conc/64/{}/{}", i % 64, i / 64).into_bytes()
    }

    #[test]
    fn no_inserted_key_is_ever_reported_absent_while_the_chain_grows() {
        let mut f = KeyFilter::with_capacity(0);
        for i in 0..300_000 {
            f.insert(&key(i));
        }
        assert!(f.links() >= 3, "the chain grew: {} links", f.links());
        for i in 0..300_000 {
            assert!(f.may_contain(&key(i)), "key {i} lost");
        }
    }

    #[test]
    fn false_positives_stay_within_the_rate_of_the_chain() {
        let mut f = KeyFilter::with_capacity(0);
        let n = 200_000;
        for i in 0..n {
            f.insert(&key(i));
        }
        let probes = 100_000;
        let positives = (n..n + probes).filter(|&i| f.may_contain(&key(i))).count();
        let rate = positives as f64 / probes as f64;
        let bound = FALSE_POSITIVE_RATE * f.links() as f64;
        assert!(rate <= bound, "rate {rate} above {bound}");
        // And it filters: far below one.
        assert!(rate < 0.05, "rate {rate}");
    }

    #[test]
    fn rewriting_a_key_inserts_nothing() {
        let mut f = KeyFilter::with_capacity(0);
        for _ in 0..3 {
            for i in 0..1000 {
                f.insert(&key(i));
            }
        }
        assert!(f.inserted() <= 1000);
        assert!(f.inserted() >= 990, "{} of 1000", f.inserted());
    }

    #[test]
    fn a_filter_built_from_keys_holds_them_in_one_link() {
        let keys: Vec<Result<Vec<u8>, ()>> = (0..100_000).map(|i| Ok(key(i))).collect();
        let f = KeyFilter::from_keys(keys.len(), keys).unwrap();
        assert_eq!(f.links(), 1);
        assert!((0..100_000).all(|i| f.may_contain(&key(i))));
        // 10 bits per key for twice the keys.
        assert!(f.bytes() <= 2 * 100_000 * BITS_PER_KEY / 8 + 8);
    }

    #[test]
    fn an_empty_filter_holds_nothing() {
        let f = KeyFilter::with_capacity(0);
        assert!(!f.may_contain(b""));
        assert!(!f.may_contain(b"a"));
        assert_eq!(f.inserted(), 0);
    }
}
