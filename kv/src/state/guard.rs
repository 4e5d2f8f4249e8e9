//! A condition on the state that an operation needs to be applied: the
//! replicas' least-privilege rule for workers ("a worker writes only the
//! keys of attempts assigned to it") is decided here, at apply time, so
//! that it holds against every concurrent assignment change.
//!
//! Invariants:
//! 1. A guarded operation is applied only if one of the guard's
//!    alternatives exists when it is applied; otherwise nothing is written
//!    and the caller gets [`KvError::PermissionDenied`] naming who asked,
//!    the key, and what was missing.
//! 2. A guard is added by the replica that authorized the request, never
//!    taken from a client (the wire form of a client's request has none).

use serde::{Deserialize, Serialize};

use super::tables::Tables;
use crate::error::{show_key, KvError, Result};

/// One alternative: a key that must exist, or a prefix with a key under it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Needed {
    /// The key (or prefix).
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// Whether any key under `key` will do.
    pub prefix: bool,
}

/// What must exist for a request to go ahead (invariant 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guard {
    /// Who asked, as the refusal will name it (`worker `h4``).
    pub who: String,
    /// Any one of these will do.
    pub any_of: Vec<Needed>,
}

impl Guard {
    /// Whether one of the alternatives exists in `t`.
    pub fn holds(&self, t: &impl Tables) -> Result<bool> {
        for n in &self.any_of {
            let found = if n.prefix {
                !t.list(&n.key)?.is_empty()
            } else {
                t.get(&n.key)?.is_some()
            };
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The refusal of an access to `key` (invariant 1).
    pub fn refusal(&self, access: &str, key: &[u8]) -> KvError {
        let needed: Vec<String> = self
            .any_of
            .iter()
            .map(|n| format!("`{}{}`", show_key(&n.key), if n.prefix { "*" } else { "" }))
            .collect();
        KvError::PermissionDenied(format!(
            "{} may not {access} `{}`: it holds no assignment {}",
            self.who,
            show_key(key),
            needed.join(" or ")
        ))
    }
}
