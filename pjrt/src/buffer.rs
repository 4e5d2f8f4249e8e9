//! Element types, host arrays and device buffers.
//!
//! Invariants:
//! 1. A [`Buffer`] owns its `PJRT_Buffer*` and destroys it exactly once;
//!    it holds its client alive.
//! 2. Memory the plugin writes into asynchronously (device-to-host copies)
//!    is owned by the pending [`ToHostFuture`] and is not freed before the
//!    copy's event completes, even if the future is dropped early.
//! 3. A [`HostBuffer`]'s byte length always equals
//!    `element_type.size() × product(dims)`.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use half::{bf16, f16};

use crate::client::Client;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::event::{Event, EventFuture};
use crate::ffi;

/// Element type of an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// Boolean.
    Pred,
    /// Signed 8-bit integer.
    S8,
    /// Signed 16-bit integer.
    S16,
    /// Signed 32-bit integer.
    S32,
    /// Signed 64-bit integer.
    S64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// bfloat16.
    BF16,
}

impl ElementType {
    /// Every supported type.
    pub const ALL: [ElementType; 13] = [
        ElementType::Pred,
        ElementType::S8,
        ElementType::S16,
        ElementType::S32,
        ElementType::S64,
        ElementType::U8,
        ElementType::U16,
        ElementType::U32,
        ElementType::U64,
        ElementType::F16,
        ElementType::F32,
        ElementType::F64,
        ElementType::BF16,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        use ElementType::*;
        match self {
            Pred | S8 | U8 => 1,
            S16 | U16 | F16 | BF16 => 2,
            S32 | U32 | F32 => 4,
            S64 | U64 | F64 => 8,
        }
    }

    /// The name used in StableHLO (`f32`, `i32`, `ui8`, `i1`, ...).
    pub fn mlir_name(self) -> &'static str {
        use ElementType::*;
        match self {
            Pred => "i1",
            S8 => "i8",
            S16 => "i16",
            S32 => "i32",
            S64 => "i64",
            U8 => "ui8",
            U16 => "ui16",
            U32 => "ui32",
            U64 => "ui64",
            F16 => "f16",
            F32 => "f32",
            F64 => "f64",
            BF16 => "bf16",
        }
    }

    /// The short name used by XLA and on tessel's command line (`f32`,
    /// `s32`, `u8`, `pred`, ...).
    pub fn name(self) -> &'static str {
        use ElementType::*;
        match self {
            Pred => "pred",
            S8 => "s8",
            S16 => "s16",
            S32 => "s32",
            S64 => "s64",
            U8 => "u8",
            U16 => "u16",
            U32 => "u32",
            U64 => "u64",
            F16 => "f16",
            F32 => "f32",
            F64 => "f64",
            BF16 => "bf16",
        }
    }

    /// Parses an XLA or MLIR name (`f32`, `s32`/`i32`, `u8`/`ui8`, `pred`/`i1`).
    pub fn parse(name: &str) -> Option<ElementType> {
        ElementType::ALL
            .into_iter()
            .find(|t| t.name() == name || t.mlir_name() == name)
    }

    pub(crate) fn to_raw(self) -> ffi::PJRT_Buffer_Type {
        use ElementType::*;
        match self {
            Pred => ffi::PJRT_Buffer_Type_PRED,
            S8 => ffi::PJRT_Buffer_Type_S8,
            S16 => ffi::PJRT_Buffer_Type_S16,
            S32 => ffi::PJRT_Buffer_Type_S32,
            S64 => ffi::PJRT_Buffer_Type_S64,
            U8 => ffi::PJRT_Buffer_Type_U8,
            U16 => ffi::PJRT_Buffer_Type_U16,
            U32 => ffi::PJRT_Buffer_Type_U32,
            U64 => ffi::PJRT_Buffer_Type_U64,
            F16 => ffi::PJRT_Buffer_Type_F16,
            F32 => ffi::PJRT_Buffer_Type_F32,
            F64 => ffi::PJRT_Buffer_Type_F64,
            BF16 => ffi::PJRT_Buffer_Type_BF16,
        }
    }

    pub(crate) fn from_raw(raw: ffi::PJRT_Buffer_Type) -> Result<ElementType> {
        ElementType::ALL
            .into_iter()
            .find(|t| t.to_raw() == raw)
            .ok_or_else(|| Error::InvalidArgument(format!("unsupported PJRT element type {raw}")))
    }
}

impl std::fmt::Display for ElementType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Rust types that map to an [`ElementType`].
pub trait NativeType: Copy + Send + Sync + 'static + private::Sealed {
    /// The element type of `Self`.
    const TYPE: ElementType;
    /// The slice's bytes (native byte order, which PJRT expects).
    fn as_bytes(data: &[Self]) -> &[u8];
    /// Decodes native-order bytes; `bytes.len()` is a multiple of the size.
    fn from_bytes(bytes: &[u8]) -> Vec<Self>;
}

mod private {
    pub trait Sealed {}
}

macro_rules! native_pod {
    ($($t:ty => $e:ident),*) => {$(
        impl private::Sealed for $t {}
        impl NativeType for $t {
            const TYPE: ElementType = ElementType::$e;
            fn as_bytes(data: &[Self]) -> &[u8] { bytemuck::cast_slice(data) }
            fn from_bytes(bytes: &[u8]) -> Vec<Self> { bytemuck::pod_collect_to_vec(bytes) }
        }
    )*};
}
native_pod!(i8 => S8, i16 => S16, i32 => S32, i64 => S64, u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    f16 => F16, f32 => F32, f64 => F64, bf16 => BF16);

impl private::Sealed for bool {}
impl NativeType for bool {
    const TYPE: ElementType = ElementType::Pred;
    fn as_bytes(data: &[Self]) -> &[u8] {
        bytemuck::cast_slice(data)
    }
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}

/// Number of elements of `dims`, or an error for negative or overflowing dims.
pub(crate) fn element_count(dims: &[i64]) -> Result<usize> {
    dims.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d)
            .map_err(|_| Error::InvalidArgument(format!("negative dimension {d} in {dims:?}")))?;
        acc.checked_mul(d)
            .ok_or_else(|| Error::InvalidArgument(format!("shape {dims:?} overflows")))
    })
}

pub(crate) fn check_size(ty: ElementType, dims: &[i64], len: usize) -> Result<()> {
    let want = element_count(dims)?
        .checked_mul(ty.size())
        .ok_or_else(|| Error::InvalidArgument(format!("shape {dims:?} overflows")))?;
    if want != len {
        return Err(Error::InvalidArgument(format!(
            "{ty}{dims:?} needs {want} bytes, got {len}"
        )));
    }
    Ok(())
}

/// An array in host memory: element type, dimensions (row-major) and bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBuffer {
    element_type: ElementType,
    dims: Vec<i64>,
    data: Vec<u8>,
}

impl HostBuffer {
    /// From raw bytes; fails unless their length matches the shape.
    pub fn from_bytes(
        element_type: ElementType,
        dims: &[i64],
        data: Vec<u8>,
    ) -> Result<HostBuffer> {
        check_size(element_type, dims, data.len())?;
        Ok(HostBuffer {
            element_type,
            dims: dims.to_vec(),
            data,
        })
    }

    /// From a typed slice; fails unless its length matches the shape.
    pub fn from_slice<T: NativeType>(data: &[T], dims: &[i64]) -> Result<HostBuffer> {
        Self::from_bytes(T::TYPE, dims, T::as_bytes(data).to_vec())
    }

    /// A scalar.
    pub fn scalar<T: NativeType>(v: T) -> HostBuffer {
        HostBuffer {
            element_type: T::TYPE,
            dims: Vec::new(),
            data: T::as_bytes(&[v]).to_vec(),
        }
    }

    /// The element type.
    pub fn element_type(&self) -> ElementType {
        self.element_type
    }

    /// The dimensions.
    pub fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// The elements' bytes, native order.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The elements' bytes, native order.
    pub fn into_bytes(self) -> Vec<u8> {
        self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len() / self.element_type.size()
    }

    /// Whether it has no element.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The elements as `T`; fails if `T` is not the element type.
    pub fn to_vec<T: NativeType>(&self) -> Result<Vec<T>> {
        if T::TYPE != self.element_type {
            return Err(Error::InvalidArgument(format!(
                "array is {}, asked for {}",
                self.element_type,
                T::TYPE
            )));
        }
        Ok(T::from_bytes(&self.data))
    }
}

/// An array on a device.
pub struct Buffer {
    client: Client,
    raw: *mut ffi::PJRT_Buffer,
    /// Element type and dimensions, read once: a PJRT buffer's shape never
    /// changes.
    shape: OnceLock<(ElementType, Vec<i64>)>,
}

// SAFETY: PJRT buffers may be used and destroyed from any thread.
unsafe impl Send for Buffer {}
// SAFETY: see `Send`; shared methods only query or copy.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// # Safety
    /// `raw` must be a live buffer of `client` that nobody else destroys.
    pub(crate) unsafe fn from_raw(client: Client, raw: *mut ffi::PJRT_Buffer) -> Buffer {
        Buffer {
            client,
            raw,
            shape: OnceLock::new(),
        }
    }

    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Buffer {
        self.raw
    }

    /// The client that owns it.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The raw `PJRT_Buffer*`, valid while this handle lives.
    pub fn as_raw(&self) -> *mut ffi::PJRT_Buffer {
        self.raw
    }

    /// Element type and dimensions (queried once, then cached).
    pub(crate) fn shape(&self) -> Result<&(ElementType, Vec<i64>)> {
        if let Some(s) = self.shape.get() {
            return Ok(s);
        }
        let mut ty = ffi::PJRT_Buffer_ElementType_Args::new();
        ty.buffer = self.raw;
        let mut dims = ffi::PJRT_Buffer_Dimensions_Args::new();
        dims.buffer = self.raw;
        // SAFETY: the buffer is live (invariant 1); dims live as long as it
        // and are copied at once.
        let shape = unsafe {
            pjrt_call!(self.client.plugin_inner(), PJRT_Buffer_ElementType, &mut ty)?;
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Buffer_Dimensions,
                &mut dims
            )?;
            let d = if dims.dims.is_null() || dims.num_dims == 0 {
                Vec::new()
            } else {
                std::slice::from_raw_parts(dims.dims, dims.num_dims).to_vec()
            };
            (ElementType::from_raw(ty.type_)?, d)
        };
        Ok(self.shape.get_or_init(|| shape))
    }

    /// Element type.
    pub fn element_type(&self) -> Result<ElementType> {
        Ok(self.shape()?.0)
    }

    /// Dimensions.
    pub fn dims(&self) -> Result<Vec<i64>> {
        Ok(self.shape()?.1.clone())
    }

    /// Bytes the buffer occupies on its device.
    pub fn on_device_size(&self) -> Result<usize> {
        let mut args = ffi::PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Buffer_OnDeviceSizeInBytes,
                &mut args
            )
        }?;
        Ok(args.on_device_size_in_bytes)
    }

    /// The device holding the buffer.
    pub fn device(&self) -> Result<Device> {
        let mut args = ffi::PJRT_Buffer_Device_Args::new();
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        unsafe { pjrt_call!(self.client.plugin_inner(), PJRT_Buffer_Device, &mut args) }?;
        Ok(Device::new(self.client.clone(), args.device))
    }

    /// Frees the device memory now; the handle stays valid but unusable.
    pub fn delete(&self) -> Result<()> {
        let mut args = ffi::PJRT_Buffer_Delete_Args::new();
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        unsafe { pjrt_call!(self.client.plugin_inner(), PJRT_Buffer_Delete, &mut args) }
    }

    /// Whether the device memory was freed (by [`Buffer::delete`] or donation).
    pub fn is_deleted(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Buffer_IsDeleted_Args::new();
        args.buffer = self.raw;
        // SAFETY: the buffer is live.
        unsafe { pjrt_call!(self.client.plugin_inner(), PJRT_Buffer_IsDeleted, &mut args) }?;
        Ok(args.is_deleted)
    }

    /// An event that completes when the buffer's contents are ready.
    pub fn ready(&self) -> Result<Event> {
        let mut args = ffi::PJRT_Buffer_ReadyEvent_Args::new();
        args.buffer = self.raw;
        // SAFETY: the buffer is live; the event is new and ours.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Buffer_ReadyEvent,
                &mut args
            )?;
            Ok(Event::from_raw(
                self.client.inner.plugin.inner.clone(),
                args.event,
            ))
        }
    }

    /// Copies the buffer to another device of the same client.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer> {
        let mut args = ffi::PJRT_Buffer_CopyToDevice_Args::new();
        args.buffer = self.raw;
        args.dst_device = device.raw();
        // SAFETY: buffer and device are live; the new buffer is ours.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Buffer_CopyToDevice,
                &mut args
            )?;
            Ok(Buffer::from_raw(self.client.clone(), args.dst_buffer))
        }
    }

    /// A host vector with room for the whole buffer, not yet initialized,
    /// and the copy into it. Its length is set only once the copy's event
    /// completes successfully ([`set_len_after_copy`]).
    fn start_host_copy(&self) -> Result<(PendingHost, Event)> {
        let (element_type, dims) = self.shape()?.clone();
        let len = element_count(&dims)? * element_type.size();
        let mut data = Vec::<u8>::with_capacity(len);
        // The plugin only writes into the destination; handing it
        // uninitialized capacity avoids zeroing memory it overwrites.
        let event = self.copy_to_host_raw(data.spare_capacity_mut().as_mut_ptr().cast(), len)?;
        Ok((
            PendingHost {
                element_type,
                dims,
                data,
                len,
            },
            event,
        ))
    }

    /// Starts copying the buffer to host memory; `.await` the result.
    pub fn to_host(&self) -> Result<ToHostFuture> {
        let (host, event) = self.start_host_copy()?;
        Ok(ToHostFuture {
            host: Some(host),
            event: event.into_future(),
        })
    }

    /// Copies the buffer to host memory, blocking the calling thread.
    pub fn to_host_blocking(&self) -> Result<HostBuffer> {
        let (host, event) = self.start_host_copy()?;
        event.wait()?;
        host.filled()
    }

    /// Copies into `dst`, which must have exactly the buffer's byte size;
    /// blocks until done.
    pub fn copy_into_host_blocking(&self, dst: &mut [u8]) -> Result<()> {
        self.copy_to_host_raw(dst.as_mut_ptr(), dst.len())?.wait()
    }

    /// Starts a copy into `len` bytes at `dst`. The caller must keep that
    /// memory alive and untouched until the returned event completes
    /// (invariant 2).
    fn copy_to_host_raw(&self, dst: *mut u8, len: usize) -> Result<Event> {
        let mut args = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw;
        // Ask for the size the plugin will write, and refuse a mismatch
        // rather than let it write out of bounds.
        // SAFETY: with dst null the plugin only reports dst_size.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Buffer_ToHostBuffer,
                &mut args
            )
        }?;
        if args.dst_size != len {
            return Err(Error::InvalidArgument(format!(
                "host copy needs {} bytes, destination has {len}",
                args.dst_size
            )));
        }
        args.dst = dst.cast();
        args.event = std::ptr::null_mut();
        // SAFETY: dst has dst_size bytes; callers keep it alive until the
        // event completes.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Buffer_ToHostBuffer,
                &mut args
            )?;
            Ok(Event::from_raw(
                self.client.inner.plugin.inner.clone(),
                args.event,
            ))
        }
    }
}

/// The destination of a device-to-host copy in flight: `len` bytes of
/// `data`'s capacity that the plugin is writing.
struct PendingHost {
    element_type: ElementType,
    dims: Vec<i64>,
    data: Vec<u8>,
    len: usize,
}

impl PendingHost {
    /// The host array, once the copy's event has completed successfully.
    fn filled(mut self) -> Result<HostBuffer> {
        // SAFETY: only called after the copy's event succeeded; the plugin
        // then wrote exactly `len` bytes (the size it reported, checked in
        // copy_to_host_raw), and `len` <= capacity by construction.
        unsafe { self.data.set_len(self.len) };
        HostBuffer::from_bytes(self.element_type, &self.dims, self.data)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Buffer_Destroy_Args::new();
        args.buffer = self.raw;
        // SAFETY: we own the buffer (invariant 1); it is not used after this.
        let destroyed =
            unsafe { pjrt_call!(self.client.plugin_inner(), PJRT_Buffer_Destroy, &mut args) };
        if let Err(e) = destroyed {
            tracing::warn!("PJRT_Buffer_Destroy: {e}");
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer({}{:?})",
            self.element_type().map(|t| t.name()).unwrap_or("?"),
            self.dims().unwrap_or_default()
        )
    }
}

/// A device-to-host copy in flight. Dropping it before completion blocks
/// until the copy is done, so the plugin never writes into freed memory.
pub struct ToHostFuture {
    host: Option<PendingHost>,
    event: EventFuture,
}

impl Future for ToHostFuture {
    type Output = Result<HostBuffer>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<HostBuffer>> {
        match Pin::new(&mut self.event).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                let host = self.host.take();
                Poll::Ready(r.and_then(|()| {
                    host.ok_or_else(|| {
                        Error::Internal("ToHostFuture polled after completion".into())
                    })?
                    .filled()
                }))
            }
        }
    }
}

impl Drop for ToHostFuture {
    fn drop(&mut self) {
        if self.host.is_some() {
            self.event.block_until_done();
        }
    }
}
