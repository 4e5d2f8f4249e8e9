//! A set of byte strings (a lease's keys, a barrier's arrivals) encoded
//! as a sequence of byte strings. serde's default writes each `Vec<u8>`
//! as a sequence of `u8`, one call per byte; postcard writes both forms
//! alike (a varint length, then the bytes), so this changes no stored or
//! replicated byte, only the time: the apply path encodes the row of
//! every lease a renewal changed (8,000 and more a second at 16,384
//! workers).

use std::collections::BTreeSet;

use serde::{Deserialize, Deserializer, Serializer};

pub(super) fn serialize<S: Serializer>(set: &BTreeSet<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(set.iter().map(|k| serde_bytes::Bytes::new(k)))
}

pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeSet<Vec<u8>>, D::Error> {
    let keys = Vec::<serde_bytes::ByteBuf>::deserialize(d)?;
    Ok(keys
        .into_iter()
        .map(serde_bytes::ByteBuf::into_vec)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    /// The layout before this module: serde's default for the set.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct DerivedLayout {
        ttl: u64,
        keys: BTreeSet<Vec<u8>>,
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct AsBytes {
        ttl: u64,
        #[serde(with = "super")]
        keys: BTreeSet<Vec<u8>>,
    }

    /// Rows written by either build read the same in the other.
    #[test]
    fn the_bytes_are_those_of_the_default_layout() {
        let long = vec![7u8; 300];
        for keys in [
            vec![],
            vec![b"workers/w0/alive".to_vec()],
            vec![long, vec![], b"a".to_vec()],
        ] {
            let keys: BTreeSet<Vec<u8>> = keys.into_iter().collect();
            let old = postcard::to_allocvec(&DerivedLayout {
                ttl: 5000,
                keys: keys.clone(),
            })
            .unwrap();
            let new = postcard::to_allocvec(&AsBytes {
                ttl: 5000,
                keys: keys.clone(),
            })
            .unwrap();
            assert_eq!(old, new);
            let read: AsBytes = postcard::from_bytes(&old).unwrap();
            assert_eq!(read.keys, keys);
            let back: DerivedLayout = postcard::from_bytes(&new).unwrap();
            assert_eq!(back.keys, keys);
        }
    }
}
