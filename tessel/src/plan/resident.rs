//! Where a process keeps an array between steps: on its devices, in the
//! pieces the last program left there, on the host, or both. Bytes cross
//! between host and device only when a step needs them on the other side.
//!
//! Invariants:
//! 1. A slot holds at least one copy of the process's block; when it holds
//!    both, they are equal (a write replaces both with one).
//! 2. A device copy is used as it is when a program wants exactly its
//!    pieces (same devices, same places in the block): a training loop's
//!    steady state copies nothing.
//! 3. Every byte copied between host and device is counted in [`Traffic`]
//!    and in the `tessel_plan_host_device_bytes_total` metric.

use tessel_pjrt::{Buffer, Client, Device, ElementType, HostBuffer};

use crate::program::sharding::{extract, insert};

/// Bytes copied between host and device.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Traffic {
    /// Host → device.
    pub to_device: u64,
    /// Device → host.
    pub to_host: u64,
}

impl Traffic {
    /// Both directions.
    pub fn total(&self) -> u64 {
        self.to_device + self.to_host
    }

    fn up(&mut self, bytes: usize) {
        self.to_device += bytes as u64;
        metrics::counter!("tessel_plan_host_device_bytes_total", "direction" => "to_device")
            .increment(bytes as u64);
    }

    fn down(&mut self, bytes: usize) {
        self.to_host += bytes as u64;
        metrics::counter!("tessel_plan_host_device_bytes_total", "direction" => "to_host")
            .increment(bytes as u64);
    }
}

/// One device's piece of a process's block.
pub struct Piece {
    /// The plugin's id of the device that holds it.
    pub device: i32,
    /// Where it starts in the block.
    pub start: Vec<i64>,
    /// The buffer.
    pub buffer: Buffer,
}

/// Where a piece must be for a program: on `device`, the block's part at
/// `start` of shape `shape`.
pub struct Want<'a> {
    /// The device.
    pub device: &'a Device,
    /// Where the piece starts in the block.
    pub start: Vec<i64>,
    /// Its shape.
    pub shape: Vec<i64>,
}

/// A process's block of one array (invariant 1).
pub struct Slot {
    ty: ElementType,
    dims: Vec<i64>,
    host: Option<HostBuffer>,
    device: Option<Vec<Piece>>,
}

impl Slot {
    /// A block on the host.
    pub fn on_host(value: HostBuffer) -> Slot {
        Slot {
            ty: value.element_type(),
            dims: value.dims().to_vec(),
            host: Some(value),
            device: None,
        }
    }

    /// A block as pieces on devices (a program's output).
    pub fn on_devices(ty: ElementType, dims: Vec<i64>, pieces: Vec<Piece>) -> Slot {
        Slot {
            ty,
            dims,
            host: None,
            device: Some(pieces),
        }
    }

    /// The block's element type.
    pub fn element_type(&self) -> ElementType {
        self.ty
    }

    /// The block's shape.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// The block on the host, copied from the devices if it is not there.
    pub fn host(&mut self, traffic: &mut Traffic) -> Result<&HostBuffer, String> {
        if self.host.is_none() {
            let pieces = self
                .device
                .as_ref()
                .ok_or("an array was consumed by a program without being replaced")?;
            let mut out = vec![0u8; self.dims.iter().product::<i64>() as usize * self.ty.size()];
            let mut seen = std::collections::BTreeSet::new();
            let mut covered = 0;
            for p in pieces {
                if !seen.insert(p.start.clone()) {
                    continue; // a replica of a piece already copied
                }
                let piece = p.buffer.to_host_blocking().map_err(|e| e.to_string())?;
                traffic.down(piece.bytes().len());
                if !insert(&mut out, &self.dims, &p.start, &piece) {
                    return Err(format!(
                        "a device's piece {:?} at {:?} does not fit the block {:?}",
                        piece.dims(),
                        p.start,
                        self.dims
                    ));
                }
                covered += piece.bytes().len();
            }
            if covered != out.len() {
                return Err(format!(
                    "the devices hold {covered} of the block's {} bytes",
                    out.len()
                ));
            }
            let value =
                HostBuffer::from_bytes(self.ty, &self.dims, out).map_err(|e| e.to_string())?;
            self.host = Some(value);
        }
        Ok(self.host.as_ref().expect("just set"))
    }

    /// The block on the host without copying; `None` if only devices hold it.
    pub fn host_if_there(&self) -> Option<&HostBuffer> {
        self.host.as_ref()
    }

    /// Makes the device copy exactly `want`, piece by piece, copying from
    /// the host unless it already is (invariant 2).
    pub fn place(
        &mut self,
        client: &Client,
        want: &[Want<'_>],
        traffic: &mut Traffic,
    ) -> Result<(), String> {
        if self.placed_as(want)? {
            return Ok(());
        }
        let host = self.host(traffic)?.clone();
        let mut pieces = Vec::with_capacity(want.len());
        for w in want {
            let tile = extract(&host, &w.start, &w.shape).ok_or_else(|| {
                format!(
                    "the piece {:?} at {:?} lies outside the process's block {:?}",
                    w.shape, w.start, self.dims
                )
            })?;
            let buffer = client
                .buffer_from_host(&tile, w.device)
                .map_err(|e| e.to_string())?;
            traffic.up(tile.bytes().len());
            pieces.push(Piece {
                device: w.device.id().map_err(|e| e.to_string())?,
                start: w.start.clone(),
                buffer,
            });
        }
        self.device = Some(pieces);
        Ok(())
    }

    fn placed_as(&self, want: &[Want<'_>]) -> Result<bool, String> {
        let Some(pieces) = &self.device else {
            return Ok(false);
        };
        if pieces.len() != want.len() {
            return Ok(false);
        }
        for (p, w) in pieces.iter().zip(want) {
            let dims = p.buffer.dims().map_err(|e| e.to_string())?;
            if p.device != w.device.id().map_err(|e| e.to_string())?
                || p.start != w.start
                || dims != w.shape
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The device pieces, in the order [`Self::place`] was given.
    pub fn pieces(&self) -> &[Piece] {
        self.device.as_deref().unwrap_or(&[])
    }

    /// Hands the device pieces to a program that consumes them (donation);
    /// the slot keeps its host copy, if any.
    pub fn take_pieces(&mut self) -> Vec<Piece> {
        self.device.take().unwrap_or_default()
    }

    /// Replaces the block with a host value (a collective's result).
    pub fn set_host(&mut self, value: HostBuffer) {
        *self = Slot::on_host(value);
    }
}
