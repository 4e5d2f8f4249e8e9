//! Element types on the wire: one byte, the type's index in
//! [`ElementType::ALL`]; an unknown byte refuses the whole message.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tessel_pjrt::ElementType;

/// The type's byte.
pub fn code(t: ElementType) -> u8 {
    ElementType::ALL
        .iter()
        .position(|&x| x == t)
        .expect("every type is in ALL") as u8
}

/// The type of a byte, if it names one.
pub fn from_code(c: u8) -> Option<ElementType> {
    ElementType::ALL.get(c as usize).copied()
}

/// `#[serde(with = "crate::dtype")]`.
pub fn serialize<S: Serializer>(t: &ElementType, s: S) -> Result<S::Ok, S::Error> {
    code(*t).serialize(s)
}

/// `#[serde(with = "crate::dtype")]`.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ElementType, D::Error> {
    let c = u8::deserialize(d)?;
    from_code(c).ok_or_else(|| serde::de::Error::custom(format!("unknown dtype {c}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_one_byte_and_other_bytes_none() {
        for t in ElementType::ALL {
            assert_eq!(from_code(code(t)), Some(t));
        }
        assert_eq!(from_code(ElementType::ALL.len() as u8), None);
    }
}
