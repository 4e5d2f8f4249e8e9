//! Striped payloads (sans-IO): a large payload over the network travels as
//! parts, one per connection to the peer, so that the parts are sealed,
//! sent, received and opened by different threads at once (quinn drives
//! each connection from one task).
//!
//! Invariants:
//! 1. Part `i` of `n` carries bytes `part_range(len, i, n)`; the parts tile
//!    the payload in order, without gaps or overlap.
//! 2. The first part allocates the whole buffer (header validated first) as
//!    disjoint pieces; full pieces are joined where they lie, delivered once.
//! 3. A part that disagrees with its assembly or repeats an index, a failed
//!    stream or a sender that stops waiting abandons the assembly (freed).
//! 4. Every part is acknowledged only once the whole is delivered or
//!    refused: a completed send still means delivered.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Mutex;

use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::error::{Result, TransferError};
use crate::header::TransferHeader;

/// Most parts one payload may be split into.
pub const MAX_PARTS: u32 = 16;

/// Which part of a striped payload a stream carries (header field `part`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// The sender's number for the payload, unique per sending endpoint.
    pub transfer: u64,
    /// This stripe's index.
    pub index: u32,
    /// How many stripes the payload has.
    pub count: u32,
}

impl Part {
    /// `count` in 2..=[`MAX_PARTS`] and `index` below it.
    pub fn validate(&self) -> Result<()> {
        if !(2..=MAX_PARTS).contains(&self.count) || self.index >= self.count {
            return Err(TransferError::InvalidHeader(format!(
                "part {} of {} (2 to {MAX_PARTS} parts)",
                self.index, self.count
            )));
        }
        Ok(())
    }
}

/// The bytes of a `len`-byte payload that part `index` of `count` carries
/// (invariant 1).
pub fn part_range(len: u64, index: u32, count: u32) -> Range<u64> {
    let at = |i: u32| (u128::from(len) * u128::from(i) / u128::from(count.max(1))) as u64;
    at(index)..at(index + 1)
}

/// An assembly is keyed by the sender's address (all its connections
/// share its socket) and its transfer number.
pub(crate) type AssemblyKey = (SocketAddr, u64);

/// Resolves to true once the whole payload is delivered; an error (the
/// assembly dropped without delivery) means it was abandoned.
pub(crate) type Delivery = watch::Receiver<bool>;

struct Assembly {
    /// The first part's header with its index cleared: what every other
    /// part's header must equal (invariant 3).
    header: TransferHeader,
    /// Pieces not yet claimed by their part.
    unclaimed: Vec<Option<BytesMut>>,
    /// Pieces their parts have filled.
    filled: Vec<Option<BytesMut>>,
    delivered: watch::Sender<bool>,
}

/// A payload whose parts have all arrived (its header is every part's,
/// but for the part).
pub(crate) struct Whole {
    pub data: Vec<u8>,
    /// Send `true` once `data` is in the mailbox.
    pub delivered: watch::Sender<bool>,
}

/// The striped payloads being received by one endpoint.
#[derive(Default)]
pub(crate) struct Assemblies {
    open: Mutex<HashMap<AssemblyKey, Assembly>>,
}

/// The header every part of one payload shares.
fn common(header: &TransferHeader) -> TransferHeader {
    let mut h = header.clone();
    if let Some(p) = &mut h.part {
        p.index = 0;
    }
    h
}

impl Assemblies {
    /// Takes the empty piece that `header`'s part fills (its capacity is at
    /// least the part's length), creating the assembly with a buffer from
    /// `alloc` (room for the whole length) if this is its first part.
    /// `header` must have been validated and carry a part.
    pub(crate) fn claim(
        &self,
        key: AssemblyKey,
        header: &TransferHeader,
        alloc: impl FnOnce(usize) -> Vec<u8>,
    ) -> Result<(BytesMut, Delivery)> {
        let part = header.part.ok_or_else(|| {
            TransferError::InvalidHeader("a striped transfer without its part".into())
        })?;
        let mut open = self.open.lock().expect("not poisoned");
        let assembly = open.entry(key).or_insert_with(|| {
            let len = header.byte_len;
            // An empty `Vec` becomes a `BytesMut` with its capacity and
            // without a copy, by way of a (unique) `Bytes`.
            let mut rest = BytesMut::from(bytes::Bytes::from(alloc(len as usize)));
            let mut unclaimed = Vec::with_capacity(part.count as usize);
            for i in 0..part.count - 1 {
                let r = part_range(len, i, part.count);
                let tail = rest.split_off((r.end - r.start) as usize);
                unclaimed.push(Some(std::mem::replace(&mut rest, tail)));
            }
            unclaimed.push(Some(rest));
            Assembly {
                header: common(header),
                filled: vec![None; part.count as usize],
                unclaimed,
                delivered: watch::channel(false).0,
            }
        });
        let refuse = |why: String| Err(TransferError::InvalidHeader(why));
        let result = if common(header) != assembly.header {
            refuse(format!(
                "part {} of transfer {} does not match its first part",
                part.index, part.transfer
            ))
        } else {
            match assembly.unclaimed[part.index as usize].take() {
                Some(piece) => Ok((piece, assembly.delivered.subscribe())),
                None => refuse(format!(
                    "part {} of transfer {} arrived twice",
                    part.index, part.transfer
                )),
            }
        };
        if result.is_err() {
            open.remove(&key);
        }
        result
    }

    /// Stores a filled piece; returns the whole payload once it was the
    /// last, or `None` (also when the assembly was abandoned meanwhile).
    pub(crate) fn fill(&self, key: AssemblyKey, index: u32, piece: BytesMut) -> Option<Whole> {
        let mut open = self.open.lock().expect("not poisoned");
        let assembly = open.get_mut(&key)?;
        assembly.filled[index as usize] = Some(piece);
        if assembly.filled.iter().any(Option::is_none) {
            return None;
        }
        let assembly = open.remove(&key)?;
        drop(open);
        let mut pieces = assembly.filled.into_iter().flatten();
        let mut whole = pieces.next()?;
        for piece in pieces {
            // Adjacent pieces of one buffer: joined in place.
            whole.unsplit(piece);
        }
        Some(Whole {
            data: Vec::from(whole),
            delivered: assembly.delivered,
        })
    }

    /// Drops the assembly under `key`, if any (invariant 3).
    pub(crate) fn abandon(&self, key: AssemblyKey) {
        self.open.lock().expect("not poisoned").remove(&key);
    }

    /// Assemblies waiting for parts.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open.lock().expect("not poisoned").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_pjrt::ElementType;

    fn part_header(len: u64, index: u32, count: u32) -> TransferHeader {
        let mut h = TransferHeader::new(1, 7, ElementType::U8, &[len]).unwrap();
        h.part = Some(Part {
            transfer: 3,
            index,
            count,
        });
        h
    }

    #[test]
    fn parts_tile_the_payload() {
        for len in [0u64, 1, 2, 7, 4096, 1 << 30, u64::MAX] {
            for count in 2..=MAX_PARTS {
                let mut at = 0;
                for i in 0..count {
                    let r = part_range(len, i, count);
                    assert_eq!(r.start, at, "len {len}, part {i} of {count}");
                    assert!(r.end >= r.start);
                    at = r.end;
                }
                assert_eq!(at, len);
            }
        }
    }

    #[test]
    fn parts_out_of_range_are_refused() {
        for (index, count) in [(0, 0), (0, 1), (2, 2), (0, MAX_PARTS + 1)] {
            let p = Part {
                transfer: 0,
                index,
                count,
            };
            assert!(p.validate().is_err(), "{index} of {count}");
        }
    }

    /// Fills every part in `order`; returns the whole.
    fn assemble(len: u64, count: u32, order: &[u32], cap: usize) -> Whole {
        let a = Assemblies::default();
        let key: AssemblyKey = ("127.0.0.1:9".parse().unwrap(), 3);
        let src: Vec<u8> = (0..len).map(|i| (i * 13 + i / 7) as u8).collect();
        let mut whole = None;
        for &i in order {
            let (mut piece, _) = a
                .claim(key, &part_header(len, i, count), |n| {
                    assert_eq!(n as u64, len);
                    Vec::with_capacity(cap)
                })
                .unwrap();
            let r = part_range(len, i, count);
            assert!(
                piece.is_empty() && piece.capacity() >= (r.end - r.start) as usize,
                "part {i}: len {} cap {} range {r:?}",
                piece.len(),
                piece.capacity()
            );
            piece.extend_from_slice(&src[r.start as usize..r.end as usize]);
            let got = a.fill(key, i, piece);
            assert_eq!(got.is_some(), whole.is_none() && a.len() == 0);
            whole = whole.or(got);
        }
        let whole = whole.expect("the last part completes it");
        assert_eq!(whole.data, src);
        whole
    }

    #[test]
    fn pieces_join_where_they_lie_in_any_order() {
        assemble(10, 3, &[2, 0, 1], 10);
        assemble(4099, 4, &[3, 1, 2, 0], 8192);
        assemble(5, 5, &[0, 1, 2, 3, 4], 5);
    }

    #[test]
    fn the_whole_lies_in_the_buffer_that_was_allocated() {
        let a = Assemblies::default();
        let key: AssemblyKey = ("127.0.0.1:9".parse().unwrap(), 1);
        let len = 3u64 << 20;
        let mut at = None;
        let mut whole = None;
        for i in 0..2 {
            let (mut piece, _) = a
                .claim(key, &part_header(len, i, 2), |n| {
                    let v = Vec::with_capacity(2 * n);
                    at = Some(v.as_ptr());
                    v
                })
                .unwrap();
            piece.resize((len / 2) as usize, i as u8 + 1);
            whole = a.fill(key, i, piece);
        }
        let whole = whole.unwrap();
        assert_eq!(Some(whole.data.as_ptr()), at, "joined in place, not copied");
        assert_eq!(whole.data.capacity(), 2 * len as usize);
        assert_eq!(whole.data.len(), len as usize);
        assert!(whole.data[..len as usize / 2].iter().all(|&b| b == 1));
        assert!(whole.data[len as usize / 2..].iter().all(|&b| b == 2));
    }

    #[test]
    fn a_mismatched_or_repeated_part_abandons_the_assembly() {
        let key: AssemblyKey = ("127.0.0.1:9".parse().unwrap(), 3);
        let alloc = |n: usize| Vec::with_capacity(n);

        let a = Assemblies::default();
        let (_, delivery) = a.claim(key, &part_header(100, 0, 2), alloc).unwrap();
        let mut other = part_header(100, 1, 2);
        other.tag = 8;
        assert!(a.claim(key, &other, alloc).is_err());
        assert_eq!(a.len(), 0, "abandoned");
        assert!(delivery.has_changed().is_err(), "its parts learn it");

        let a = Assemblies::default();
        a.claim(key, &part_header(100, 1, 2), alloc).unwrap();
        assert!(a.claim(key, &part_header(100, 1, 2), alloc).is_err());
        assert_eq!(a.len(), 0);

        // Another count or length is another header.
        let a = Assemblies::default();
        a.claim(key, &part_header(100, 0, 2), alloc).unwrap();
        assert!(a.claim(key, &part_header(100, 1, 3), alloc).is_err());
        let a = Assemblies::default();
        a.claim(key, &part_header(100, 0, 2), alloc).unwrap();
        assert!(a.claim(key, &part_header(101, 1, 2), alloc).is_err());
    }

    #[test]
    fn an_abandoned_assembly_delivers_nothing() {
        let key: AssemblyKey = ("127.0.0.1:9".parse().unwrap(), 3);
        let a = Assemblies::default();
        let (p0, delivery) = a
            .claim(key, &part_header(8, 0, 2), Vec::with_capacity)
            .unwrap();
        a.abandon(key);
        assert!(a.fill(key, 0, p0).is_none());
        assert_eq!(a.len(), 0);
        assert!(delivery.has_changed().is_err());
    }
}
