//! Sealed data channels: records of AES-128-GCM over TCP (sans-IO).
//!
//! With encryption on, a data channel ([`crate::channel`]) carries its
//! bytes as records:
//!
//! ```text
//! record := u32 big-endian n (1..=MAX_RECORD) | n bytes of ciphertext | 16-byte tag
//! nonce  := 4 zero bytes | u64 big-endian record number (per direction, from 0)
//! aad    := the record's 4 length bytes
//! ```
//!
//! The keys are never sent: both ends export them from the mutual-TLS
//! session that granted the channel (RFC 5705, [`EXPORTER_LABEL`], the
//! channel's token as context), one key per direction.
//!
//! Invariants:
//! 1. A (key, nonce) pair seals one record only: each direction has its own
//!    key, each channel its own keys (the token is fresh), and the record
//!    number only grows; a number that would wrap ends the channel.
//! 2. A record is accepted only in order and unaltered: a dropped,
//!    repeated, reordered, truncated or changed record fails its tag, and
//!    the channel ends with [`TransferError::Encryption`].
//! 3. A record's length is checked before anything is read for it, and
//!    its plaintext is used only once its tag has been checked.
//! 4. Every message is whole records: a payload as records of at most
//!    [`RECORD`] bytes, a header frame or an answer byte as one.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_128_GCM};

use crate::error::{Result, TransferError};

/// Plaintext bytes a writer puts in one record.
pub const RECORD: usize = 256 << 10;
/// The largest record a reader accepts.
pub const MAX_RECORD: usize = RECORD;
/// Bytes of a record's tag.
pub const TAG_LEN: usize = 16;
/// The RFC 5705 label the channel keys are exported under.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-tessel-data-channel";
/// Bytes of keying material a channel needs: a key for each direction.
pub const KEY_MATERIAL: usize = 32;

/// Which end of a channel this is: the sender (it dialed) or the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The end that asked for the channel and sends transfers on it.
    Sender,
    /// The end that granted it and answers.
    Receiver,
}

/// One direction's key and its next record number.
struct Direction {
    key: LessSafeKey,
    next: u64,
}

impl Direction {
    fn new(key: &[u8]) -> Direction {
        Direction {
            key: LessSafeKey::new(UnboundKey::new(&AES_128_GCM, key).expect("16-byte key")),
            next: 0,
        }
    }

    /// The next record's nonce (invariant 1).
    fn nonce(&mut self) -> Result<Nonce> {
        let n = self.next;
        self.next = n.checked_add(1).ok_or_else(|| {
            TransferError::Encryption("a data channel ran out of record numbers".into())
        })?;
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&n.to_be_bytes());
        Ok(Nonce::assume_unique_for_key(nonce))
    }
}

/// Seals the records this end writes.
pub struct Sealer(Direction);

/// Opens the records this end reads.
pub struct Opener(Direction);

/// This end's sealer and opener, from the channel's keying material.
pub fn keys(material: &[u8; KEY_MATERIAL], side: Side) -> (Sealer, Opener) {
    let (to_receiver, to_sender) = material.split_at(KEY_MATERIAL / 2);
    let (mine, theirs) = match side {
        Side::Sender => (to_receiver, to_sender),
        Side::Receiver => (to_sender, to_receiver),
    };
    (Sealer(Direction::new(mine)), Opener(Direction::new(theirs)))
}

impl Sealer {
    /// Clears `record` and leaves room for its length: append the
    /// plaintext (1..=[`MAX_RECORD`] bytes), then [`Sealer::seal`].
    pub fn begin(record: &mut Vec<u8>) {
        record.clear();
        record.extend_from_slice(&[0; 4]);
    }

    /// Seals the plaintext after the length in place and appends the tag:
    /// `record` is then ready to write.
    pub fn seal(&mut self, record: &mut Vec<u8>) -> Result<()> {
        if record.len() < 4 {
            return Err(TransferError::Encryption(
                "a record without its length".into(),
            ));
        }
        let (head, body) = record.split_at_mut(4);
        let (prefix, tag) = self.seal_in_place(body)?;
        head.copy_from_slice(&prefix);
        record.extend_from_slice(&tag);
        Ok(())
    }

    /// Seals `body` (1..=[`MAX_RECORD`] bytes) in place as the next
    /// record; returns the length and tag to write around it.
    pub fn seal_in_place(&mut self, body: &mut [u8]) -> Result<([u8; 4], [u8; TAG_LEN])> {
        let n = body.len();
        if !(1..=MAX_RECORD).contains(&n) {
            return Err(TransferError::Encryption(format!(
                "a record of {n} bytes (1..={MAX_RECORD})"
            )));
        }
        let prefix = (n as u32).to_be_bytes();
        let nonce = self.0.nonce()?;
        let tag = self
            .0
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(prefix), body)
            .map_err(|_| TransferError::Encryption("sealing a record failed".into()))?;
        Ok((prefix, tag.as_ref().try_into().expect("16-byte tag")))
    }

    /// `plain` as one record (a header frame or an answer byte).
    pub fn record(&mut self, plain: &[u8]) -> Result<Vec<u8>> {
        let mut record = Vec::with_capacity(4 + plain.len() + TAG_LEN);
        Sealer::begin(&mut record);
        record.extend_from_slice(plain);
        self.seal(&mut record)?;
        Ok(record)
    }
}

/// The ciphertext length a record's first four bytes announce, checked
/// before it is read (invariant 3).
pub fn record_len(prefix: [u8; 4]) -> Result<usize> {
    crate::header::prefixed_len(prefix, MAX_RECORD, "a data channel record")
}

impl Opener {
    /// Opens the next record in place: `body` is its ciphertext (the
    /// length `prefix` announced), `tag` its tag (invariant 2).
    pub fn open(&mut self, prefix: [u8; 4], body: &mut [u8], tag: [u8; TAG_LEN]) -> Result<()> {
        if record_len(prefix)? != body.len() {
            return Err(TransferError::Encryption(format!(
                "a record announced {} bytes and has {}",
                u32::from_be_bytes(prefix),
                body.len()
            )));
        }
        let nonce = self.0.nonce()?;
        self.0
            .key
            .open_in_place_separate_tag(nonce, Aad::from(prefix), Tag::from(tag), body, 0..)
            .map(|_| ())
            .map_err(|_| {
                TransferError::Encryption(
                    "a data channel record failed authentication: changed, replayed, \
                     reordered, or not sealed by the peer"
                        .into(),
                )
            })
    }

    /// Opens every record in `bytes`, which must hold whole records only;
    /// returns the plaintext (what a reader does, on one buffer).
    pub fn open_all(&mut self, mut bytes: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let cut =
                |what: &str| TransferError::Encryption(format!("a record cut short in its {what}"));
            let prefix: [u8; 4] = bytes
                .get(..4)
                .ok_or_else(|| cut("length"))?
                .try_into()
                .expect("4");
            let n = record_len(prefix)?;
            let rest = &bytes[4..];
            if rest.len() < n + TAG_LEN {
                return Err(cut("body"));
            }
            let start = out.len();
            out.extend_from_slice(&rest[..n]);
            let tag = rest[n..n + TAG_LEN].try_into().expect("16");
            self.open(prefix, &mut out[start..], tag)?;
            bytes = &rest[n + TAG_LEN..];
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> ((Sealer, Opener), (Sealer, Opener)) {
        let material: [u8; KEY_MATERIAL] = std::array::from_fn(|i| i as u8 * 7 + 1);
        (
            keys(&material, Side::Sender),
            keys(&material, Side::Receiver),
        )
    }

    fn sealed(sealer: &mut Sealer, messages: &[&[u8]]) -> Vec<u8> {
        messages
            .iter()
            .flat_map(|m| sealer.record(m).unwrap())
            .collect()
    }

    #[test]
    fn each_direction_opens_what_the_other_sealed() {
        let ((mut s_seal, mut s_open), (mut r_seal, mut r_open)) = pair();
        let wire = sealed(&mut s_seal, &[b"header", &[9; 1000], b"x"]);
        let mut want = b"header".to_vec();
        want.extend([9; 1000]);
        want.push(b'x');
        assert_eq!(r_open.open_all(&wire).unwrap(), want);
        let back = sealed(&mut r_seal, &[&[0]]);
        assert_eq!(s_open.open_all(&back).unwrap(), vec![0]);
    }

    #[test]
    fn a_record_opens_only_with_the_other_directions_key() {
        let ((mut s_seal, mut s_open), _) = pair();
        // The sender's own opener holds the receiver's key: its own
        // record must not open (a reflected record is refused).
        let wire = sealed(&mut s_seal, &[b"hello"]);
        assert!(s_open.open_all(&wire).is_err());
    }

    #[test]
    fn changed_replayed_reordered_and_cut_records_are_refused() {
        let ((mut s_seal, _), _) = pair();
        let wire = sealed(&mut s_seal, &[b"first", b"second"]);
        let first_len = 4 + 5 + TAG_LEN;
        let fresh = || pair().1 .1;
        // Changed: any byte of length, body or tag.
        for i in 0..wire.len() {
            let mut bad = wire.clone();
            bad[i] ^= 0x20;
            assert!(fresh().open_all(&bad).is_err(), "byte {i} flipped");
        }
        // Replayed: the first record twice.
        let mut replay = wire[..first_len].to_vec();
        replay.extend_from_slice(&wire[..first_len]);
        assert!(fresh().open_all(&replay).is_err());
        // Reordered: the second first.
        let mut swapped = wire[first_len..].to_vec();
        swapped.extend_from_slice(&wire[..first_len]);
        assert!(fresh().open_all(&swapped).is_err());
        // Dropped: the second alone.
        assert!(fresh().open_all(&wire[first_len..]).is_err());
        // Cut short.
        assert!(fresh().open_all(&wire[..wire.len() - 1]).is_err());
        assert!(fresh().open_all(&wire).is_ok());
    }

    #[test]
    fn lengths_are_bounded_before_reading() {
        assert!(record_len(0u32.to_be_bytes()).is_err());
        assert!(record_len((MAX_RECORD as u32 + 1).to_be_bytes()).is_err());
        assert_eq!(
            record_len((MAX_RECORD as u32).to_be_bytes()).unwrap(),
            MAX_RECORD
        );
        let ((mut s_seal, _), _) = pair();
        let mut empty = Vec::new();
        Sealer::begin(&mut empty);
        assert!(s_seal.seal(&mut empty).is_err());
        let mut big = Vec::new();
        Sealer::begin(&mut big);
        big.resize(4 + MAX_RECORD + 1, 0);
        assert!(s_seal.seal(&mut big).is_err());
    }

    #[test]
    fn the_same_plaintext_seals_differently_each_record() {
        let ((mut s_seal, _), _) = pair();
        assert_ne!(
            s_seal.record(b"same").unwrap(),
            s_seal.record(b"same").unwrap()
        );
    }
}
