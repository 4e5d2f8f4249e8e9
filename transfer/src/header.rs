//! The header in front of every transfer (sans-IO).
//!
//! Frame: `u32` big-endian length (≤ [`MAX_HEADER`]), then the postcard
//! encoding of [`TransferHeader`]; the payload follows, exactly `byte_len`
//! raw bytes (tensors never go through serde).
//!
//! Invariants:
//! 1. A header is accepted only with a known dtype ([`crate::dtype`]) and
//!    dims giving exactly `byte_len` bytes (no overflow) within the
//!    receiver's limit; only then is anything allocated.
//! 2. Decoding never panics and never allocates more than the frame.
//! 3. `lent` marks a ring chunk for a waiting taker: read in place (shm
//!    invariant 3) or kept in the pieces it arrived in (endpoint invariant 9).
//! 4. `part` comes only without `shm`, with 2 to [`MAX_PARTS`](crate::stripe::MAX_PARTS)
//!    parts and an index below their count; dtype, dims and `byte_len`
//!    describe the whole payload ([`crate::stripe`]).

use serde::{Deserialize, Serialize};
use tessel_pjrt::ElementType;

use crate::error::{Result, TransferError};
use crate::stripe::Part;

/// Largest encoded header.
pub const MAX_HEADER: usize = 4096;
/// Most dimensions a transferred array may have.
pub const MAX_DIMS: usize = 32;

/// What follows on the stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferHeader {
    /// The sender's rank.
    pub from: u32,
    /// Matches a send with a receive.
    pub tag: u64,
    /// The element type.
    #[serde(with = "crate::dtype")]
    pub dtype: ElementType,
    /// The dimensions.
    pub dims: Vec<u64>,
    /// The payload's length in bytes.
    pub byte_len: u64,
    /// Same-host path: the payload is not on the stream but in this file of
    /// the shared-memory folder (`tessel-…`, no separators); the receiver
    /// reads and removes it.
    pub shm: Option<String>,
    /// The payload goes straight to a waiting taker (invariant 3): a
    /// `shm` file is read in place and acknowledged only once done with;
    /// bytes on the stream may stay in the pieces they arrived in.
    pub lent: bool,
    /// The stream carries this part of a striped payload (invariant 4).
    pub part: Option<Part>,
}

/// `body` behind its length, `u32` big-endian (the frames of the
/// transfer protocol and of data channels' set-up).
pub(crate) fn length_prefixed(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// The body length in a frame's first four bytes: from 1 to `max`.
pub(crate) fn prefixed_len(prefix: [u8; 4], max: usize, what: &str) -> Result<usize> {
    let n = u32::from_be_bytes(prefix) as usize;
    if n == 0 || n > max {
        return Err(TransferError::InvalidHeader(format!(
            "{what} of {n} bytes (1..={max})"
        )));
    }
    Ok(n)
}

impl TransferHeader {
    /// A header for an array; refuses too many dimensions or too many bytes.
    pub fn new(from: u32, tag: u64, dtype: ElementType, dims: &[u64]) -> Result<TransferHeader> {
        let h = TransferHeader {
            from,
            tag,
            dtype,
            dims: dims.to_vec(),
            byte_len: expected_len(dtype, dims)?,
            shm: None,
            lent: false,
            part: None,
        };
        Ok(h)
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.dtype
    }

    /// Invariant 1.
    pub fn validate(&self, max_bytes: u64) -> Result<()> {
        if self.dims.len() > MAX_DIMS {
            return Err(TransferError::InvalidHeader(format!(
                "{} dimensions, over {MAX_DIMS}",
                self.dims.len()
            )));
        }
        let want = expected_len(self.dtype, &self.dims)?;
        if want != self.byte_len {
            return Err(TransferError::InvalidHeader(format!(
                "{}{:?} is {want} bytes, the header says {}",
                self.dtype, self.dims, self.byte_len
            )));
        }
        if let Some(name) = &self.shm {
            check_shm_name(name)?;
        }
        if let Some(part) = &self.part {
            part.validate()?;
            if self.shm.is_some() {
                return Err(TransferError::InvalidHeader(
                    "a part of a striped payload in a shared-memory file".into(),
                ));
            }
        }
        if self.byte_len > max_bytes {
            return Err(TransferError::TooLarge {
                announced: self.byte_len,
                max: max_bytes,
            });
        }
        Ok(())
    }

    /// The length-prefixed frame.
    pub fn encode(&self) -> Vec<u8> {
        length_prefixed(&postcard::to_allocvec(self).expect("a header always encodes"))
    }

    /// The body length in a frame's first four bytes (refused above
    /// [`MAX_HEADER`]).
    pub fn frame_len(prefix: [u8; 4]) -> Result<usize> {
        prefixed_len(prefix, MAX_HEADER, "a header")
    }

    /// Decodes a frame body and validates it against `max_bytes`.
    pub fn decode(body: &[u8], max_bytes: u64) -> Result<TransferHeader> {
        let h: TransferHeader =
            postcard::from_bytes(body).map_err(|e| TransferError::InvalidHeader(e.to_string()))?;
        h.validate(max_bytes)?;
        Ok(h)
    }
}

/// Prefix of every shared-memory file name.
pub const SHM_PREFIX: &str = "tessel-";

/// A shared-memory file name a peer may name: `tessel-` then at most 64
/// ASCII letters, digits or dashes (so it can only name our own files, in
/// the shared-memory folder).
pub fn check_shm_name(name: &str) -> Result<()> {
    let rest = name.strip_prefix(SHM_PREFIX).unwrap_or("");
    if rest.is_empty()
        || rest.len() > 64
        || !rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(TransferError::InvalidHeader(format!(
            "shared-memory name {name:?} is not `{SHM_PREFIX}` and up to 64 letters, digits or dashes"
        )));
    }
    Ok(())
}

fn expected_len(dtype: ElementType, dims: &[u64]) -> Result<u64> {
    dims.iter()
        .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| TransferError::InvalidHeader(format!("{dims:?} overflows")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stripe::MAX_PARTS;

    #[test]
    fn headers_round_trip_and_are_checked() {
        let h = TransferHeader::new(3, 9, ElementType::BF16, &[4, 5]).unwrap();
        assert_eq!(h.byte_len, 40);
        let frame = h.encode();
        let n = TransferHeader::frame_len(frame[..4].try_into().unwrap()).unwrap();
        assert_eq!(
            TransferHeader::decode(&frame[4..4 + n], 1 << 20).unwrap(),
            h
        );

        let mut lie = h.clone();
        lie.byte_len = 41;
        assert!(
            lie.validate(1 << 20).is_err(),
            "length must match the shape"
        );
        let tib = TransferHeader::new(0, 0, ElementType::U8, &[1 << 40]).unwrap();
        assert_eq!(
            tib.validate(1 << 30),
            Err(TransferError::TooLarge {
                announced: 1 << 40,
                max: 1 << 30
            })
        );
        // An unknown dtype byte refuses the header when it is decoded.
        let mut frame = h.encode();
        let at = 4 + 2; // length prefix, `from`, `tag` (one byte each here)
        assert_eq!(frame[at], crate::dtype::code(ElementType::BF16));
        frame[at] = 99;
        assert!(TransferHeader::decode(&frame[4..], 1 << 20).is_err());
        assert!(TransferHeader::new(0, 0, ElementType::F64, &[u64::MAX, 2]).is_err());
        assert!(TransferHeader::frame_len([0xff; 4]).is_err());
        assert!(TransferHeader::decode(&[0xff; 9], 1 << 20).is_err());
        for name in [
            "../etc/passwd",
            "tessel-",
            "tessel-a/b",
            "other-1",
            "tessel-a.b",
        ] {
            let mut shm = h.clone();
            shm.shm = Some(name.into());
            assert!(shm.validate(1 << 20).is_err(), "{name}");
        }
        let mut shm = h.clone();
        shm.shm = Some("tessel-12-34".into());
        shm.validate(1 << 20).unwrap();
        shm.lent = true;
        shm.validate(1 << 20).unwrap();
        let mut lent = h.clone();
        lent.lent = true;
        lent.validate(1 << 20).unwrap();

        let mut part = h.clone();
        part.part = Some(Part {
            transfer: 5,
            index: 1,
            count: MAX_PARTS,
        });
        let frame = part.encode();
        assert_eq!(TransferHeader::decode(&frame[4..], 1 << 20).unwrap(), part);
        let mut bad = part.clone();
        bad.part = Some(Part {
            transfer: 5,
            index: 2,
            count: 2,
        });
        assert!(bad.validate(1 << 20).is_err(), "index beyond the count");
        let mut bad = part.clone();
        bad.shm = Some("tessel-12-34".into());
        assert!(bad.validate(1 << 20).is_err(), "a part in a file");
    }
}
