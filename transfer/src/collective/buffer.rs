//! A caller's buffer for the in-place all-reduce (invariant 9).

use crate::shm::ShmArena;

/// A buffer for [`crate::Communicator::all_reduce_in_place`] (invariant 9): in
/// shared memory when the communicator that made it reaches every member
/// that way, else in private memory. Write the input with
/// [`Self::as_mut_slice`], read the result with [`Self::as_slice`].
pub struct CollectiveBuffer {
    pub(super) storage: Storage,
}

pub(super) enum Storage {
    Shared(ShmArena),
    Private(Vec<u8>),
}

impl CollectiveBuffer {
    /// A zeroed buffer of `len` bytes in private memory.
    pub fn private(len: usize) -> CollectiveBuffer {
        CollectiveBuffer {
            storage: Storage::Private(vec![0; len]),
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::Shared(a) => a.len(),
            Storage::Private(v) => v.len(),
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether peers on this host can read it in place.
    pub fn is_shared(&self) -> bool {
        matches!(self.storage, Storage::Shared(_))
    }

    /// The bytes (the result, after the call).
    pub fn as_slice(&self) -> &[u8] {
        match &self.storage {
            Storage::Shared(a) => a.region(0..a.len()),
            Storage::Private(v) => v,
        }
    }

    /// The bytes (write the input here).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Shared(a) => {
                let len = a.len();
                a.region_mut(0..len)
            }
            Storage::Private(v) => v,
        }
    }

    /// The shared-memory file's name, for the peers.
    pub(super) fn shared_name(&self) -> Option<String> {
        match &self.storage {
            Storage::Shared(a) => Some(a.name().to_owned()),
            Storage::Private(_) => None,
        }
    }

    /// After a failed call (invariant 9): fresh zeroed memory of the same
    /// length; the old file keeps its bytes for whoever still maps it.
    pub(super) fn replace_with_zeros(&mut self) {
        self.storage = Storage::Private(vec![0; self.len()]);
    }
}

impl std::fmt::Debug for CollectiveBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectiveBuffer")
            .field("len", &self.len())
            .field("shared", &self.is_shared())
            .finish()
    }
}
