//! Arrays waiting to be taken, and the spare buffers received payloads
//! reuse (invariants 3 and 7).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tessel_pjrt::ElementType;
use tokio::sync::Notify;

use crate::header::TransferHeader;
use crate::stripe::Assemblies;

use super::*;

#[derive(Default)]
pub(super) struct Mailbox {
    pub(super) slots: Mutex<HashMap<(u32, u64), VecDeque<Waiting>>>,
    pub(super) arrived: Notify,
    pub(super) spares: Mutex<Spares>,
    /// Striped payloads being received (invariant 8).
    pub(super) assemblies: Assemblies,
}

/// Recycled buffers (invariant 7).
#[derive(Default)]
pub(super) struct Spares {
    pub(super) buffers: Vec<Vec<u8>>,
    pub(super) bytes: usize,
}

impl Spares {
    /// Keeps `buf` if it is large enough and fits under `limit`.
    pub(super) fn put(&mut self, mut buf: Vec<u8>, limit: usize) {
        let cap = buf.capacity();
        if cap >= MIN_SPARE && self.bytes + cap <= limit {
            buf.clear();
            self.bytes += cap;
            self.buffers.push(buf);
        }
    }

    /// The smallest spare whose capacity is from `len` to twice it.
    pub(super) fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        let (i, _) = self
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len && b.capacity() / 2 <= len)
            .min_by_key(|(_, b)| b.capacity())?;
        let buf = self.buffers.swap_remove(i);
        self.bytes -= buf.capacity();
        Some(buf)
    }
}

impl Mailbox {
    /// An empty buffer with room for `len` bytes: a spare, or fresh
    /// memory advised to use huge pages.
    pub(super) fn buffer(&self, len: usize) -> Vec<u8> {
        if len >= MIN_SPARE {
            if let Some(b) = self.spares.lock().expect("not poisoned").take(len) {
                return b;
            }
        }
        let mut data = Vec::with_capacity(len);
        crate::memory::advise_huge_pages(data.spare_capacity_mut());
        data
    }

    /// Puts the array `header` announced in its slot, counts it as
    /// received over `path`, and wakes the receivers (invariant 3).
    pub(super) fn deliver(
        &self,
        path: &'static str,
        header: TransferHeader,
        dtype: ElementType,
        payload: Payload,
    ) {
        self.deliver_incoming(path, header, dtype, Incoming::Here(payload));
    }

    /// [`Self::deliver`] of a payload here or still on its channel.
    pub(super) fn deliver_incoming(
        &self,
        path: &'static str,
        header: TransferHeader,
        dtype: ElementType,
        incoming: Incoming,
    ) {
        metrics::counter!("tessel_transfer_received_bytes_total", "path" => path)
            .increment(header.byte_len);
        self.slots
            .lock()
            .expect("not poisoned")
            .entry((header.from, header.tag))
            .or_default()
            .push_back(Waiting {
                dtype,
                dims: header.dims,
                incoming,
            });
        self.arrived.notify_waiters();
    }
}
