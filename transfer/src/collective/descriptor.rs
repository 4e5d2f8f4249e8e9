//! What a rank is about to do, and the frame it travels in around the
//! descriptor ring (invariants 2 and 6).

use serde::{Deserialize, Serialize};
use tessel_pjrt::ElementType;

use crate::error::{Result, TransferError};
use crate::reduce::{all_reduce_is_small, ReduceOp};

/// The collectives a descriptor can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CollectiveKind {
    /// Every rank ends with the reduction of all inputs.
    AllReduce,
    /// Every rank ends with its slice of the reduction.
    ReduceScatter,
    /// Every rank ends with every rank's input.
    AllGather,
    /// Every rank ends with the root's input.
    Broadcast,
    /// No data; returns once every rank arrived.
    Barrier,
    /// Every rank sends a value to every other (all-to-all).
    Exchange,
}

impl CollectiveKind {
    /// Its name in messages and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::Exchange => "exchange",
        }
    }
}

impl std::fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a rank is about to do (invariant 2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    /// The collective.
    pub kind: CollectiveKind,
    /// The reduction, for reducing kinds.
    pub op: Option<ReduceOp>,
    /// The element type.
    #[serde(with = "crate::dtype")]
    pub dtype: ElementType,
    /// This rank's input, in bytes.
    pub bytes: u64,
    /// The root, for a broadcast.
    pub root: Option<u32>,
    /// This rank reaches every member through shared memory (invariant 8).
    pub shared: bool,
    /// An all-reduce on a [`crate::CollectiveBuffer`] (invariant 9).
    pub in_place: bool,
}

/// Largest encoded descriptor.
pub(super) const MAX_DESCRIPTOR: usize = 1024;

impl Descriptor {
    /// The wire form (postcard).
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a descriptor always encodes")
    }

    /// Decodes a peer's descriptor: bounded size, a known kind and dtype.
    pub fn decode(bytes: &[u8]) -> Result<Descriptor> {
        let bad =
            |why: String| TransferError::InvalidHeader(format!("collective descriptor: {why}"));
        if bytes.len() > MAX_DESCRIPTOR {
            return Err(bad(format!("{} bytes, over {MAX_DESCRIPTOR}", bytes.len())));
        }
        postcard::from_bytes(bytes).map_err(|e| bad(e.to_string()))
    }
}

/// What travels around the descriptor ring: the encoded descriptor and,
/// for a small all-reduce, the rank's data (`u16` LE length, descriptor,
/// data).
pub struct DescriptorFrame;

impl DescriptorFrame {
    /// The frame of `d` carrying `data` (empty unless the all-reduce is small).
    pub fn encode(d: &Descriptor, data: &[u8]) -> Vec<u8> {
        let desc = d.encode();
        let mut out = Vec::with_capacity(2 + desc.len() + data.len());
        out.extend_from_slice(&(desc.len() as u16).to_le_bytes());
        out.extend_from_slice(&desc);
        out.extend_from_slice(data);
        out
    }

    /// The descriptor (validated) and the data that came with it. Data is
    /// accepted only where the descriptor says it belongs: a small
    /// all-reduce, exactly its byte count.
    pub fn decode(bytes: &[u8]) -> Result<(Descriptor, &[u8])> {
        let bad = |why: String| TransferError::InvalidHeader(format!("descriptor frame: {why}"));
        if bytes.len() < 2 {
            return Err(bad("shorter than its length prefix".into()));
        }
        let len = u16::from_le_bytes([bytes[0], bytes[1]]) as usize;
        let desc = bytes
            .get(2..2 + len)
            .ok_or_else(|| bad(format!("announces {len} descriptor bytes, has fewer")))?;
        let d = Descriptor::decode(desc)?;
        let data = &bytes[2 + len..];
        let want = if d.carries_data() {
            d.bytes as usize
        } else {
            0
        };
        if data.len() != want {
            return Err(bad(format!(
                "{} bytes of data with a descriptor of {d}",
                data.len()
            )));
        }
        Ok((d, data))
    }
}

impl Descriptor {
    /// Whether the rank's data rides with the descriptor (invariant 6).
    pub(super) fn carries_data(&self) -> bool {
        self.kind == CollectiveKind::AllReduce && all_reduce_is_small(self.bytes as usize)
    }

    /// Whether a call of more than one rank would move data through
    /// arenas if every rank offers them (invariant 8): at least a byte,
    /// and neither a barrier nor a small all-reduce.
    pub(super) fn wants_arenas(&self) -> bool {
        self.bytes > 0 && self.kind != CollectiveKind::Barrier && !self.carries_data()
    }

    /// How a call of `n` ranks that agreed on this descriptor runs (with
    /// arenas if `shared`), as the metrics label it.
    pub(super) fn algorithm(&self, n: usize, shared: bool) -> &'static str {
        if n == 1 {
            "local"
        } else if self.kind == CollectiveKind::Barrier {
            "descriptors"
        } else if self.kind == CollectiveKind::Exchange {
            "point_to_point"
        } else if self.carries_data() {
            "small"
        } else if shared {
            "arena"
        } else {
            "ring"
        }
    }

    /// The same call, whatever the ranks' paths (invariants 2 and 8).
    pub(super) fn same_call(&self, other: &Descriptor) -> bool {
        Descriptor {
            shared: self.shared,
            ..other.clone()
        } == *self
    }
}

impl std::fmt::Display for Descriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(op) = self.op {
            write!(f, " {}", op.name())?;
        }
        if self.in_place {
            write!(f, " in place")?;
        }
        write!(f, " of {} bytes of {}", self.bytes, self.dtype)?;
        if let Some(root) = self.root {
            write!(f, " from root {root}")?;
        }
        Ok(())
    }
}

pub(super) fn descriptor(
    kind: CollectiveKind,
    op: Option<ReduceOp>,
    dtype: ElementType,
    bytes: usize,
    root: Option<u32>,
) -> Descriptor {
    Descriptor {
        kind,
        op,
        dtype,
        bytes: bytes as u64,
        root,
        shared: false,
        in_place: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_bad_ones_are_refused() {
        let d = descriptor(
            CollectiveKind::AllReduce,
            Some(ReduceOp::Mean),
            ElementType::BF16,
            64,
            None,
        );
        assert_eq!(Descriptor::decode(&d.encode()).unwrap(), d);
        assert_eq!(d.to_string(), "all_reduce mean of 64 bytes of bf16");
        // Paths may differ between ranks; in place or not may not.
        let shared = Descriptor {
            shared: true,
            ..d.clone()
        };
        assert!(shared.same_call(&d) && d.same_call(&shared));
        let in_place = Descriptor {
            in_place: true,
            ..d.clone()
        };
        assert!(!in_place.same_call(&d) && !d.same_call(&in_place));
        assert_eq!(
            in_place.to_string(),
            "all_reduce mean in place of 64 bytes of bf16"
        );
        // An unknown kind or dtype byte refuses the descriptor.
        let mut bad = d.encode();
        bad[0] = 6;
        assert!(Descriptor::decode(&bad).is_err(), "kind");
        let mut bad = d.encode();
        bad[3] = 99;
        assert!(Descriptor::decode(&bad).is_err(), "dtype");
        assert!(Descriptor::decode(&[0xff; 5]).is_err());
        assert!(Descriptor::decode(&vec![0; MAX_DESCRIPTOR + 1]).is_err());
    }

    #[test]
    fn frames_carry_data_only_for_a_small_all_reduce() {
        let small = descriptor(
            CollectiveKind::AllReduce,
            Some(ReduceOp::Sum),
            ElementType::F32,
            8,
            None,
        );
        let frame = DescriptorFrame::encode(&small, &[1; 8]);
        let (d, data) = DescriptorFrame::decode(&frame).unwrap();
        assert_eq!((d, data), (small.clone(), &[1u8; 8][..]));
        // Data of the wrong length, or data where none belongs, is refused.
        assert!(DescriptorFrame::decode(&DescriptorFrame::encode(&small, &[1; 4])).is_err());
        let big = descriptor(
            CollectiveKind::AllReduce,
            Some(ReduceOp::Sum),
            ElementType::F32,
            1 << 20,
            None,
        );
        assert!(DescriptorFrame::decode(&DescriptorFrame::encode(&big, &[1; 8])).is_err());
        assert!(DescriptorFrame::decode(&DescriptorFrame::encode(&big, &[])).is_ok());
        let barrier = descriptor(CollectiveKind::Barrier, None, ElementType::U8, 0, None);
        assert!(DescriptorFrame::decode(&DescriptorFrame::encode(&barrier, &[])).is_ok());
        // Truncated frames.
        assert!(DescriptorFrame::decode(&[5]).is_err());
        assert!(DescriptorFrame::decode(&[200, 0, 1, 2]).is_err());
    }
}
