//! Devices, their descriptions and memories. The plugin owns these objects;
//! our handles keep the client (their owner) alive.

use crate::client::Client;
use crate::error::Result;
use crate::ffi;
use crate::plugin::bytes_to_string;
use crate::value::{read_named_values, NamedValue};

/// A device of a client, addressable or not.
#[derive(Clone)]
pub struct Device {
    client: Client,
    raw: *mut ffi::PJRT_Device,
}

// SAFETY: device handles are immutable plugin objects owned by the client,
// usable from any thread.
unsafe impl Send for Device {}
// SAFETY: see `Send`.
unsafe impl Sync for Device {}

/// Reads a `(ptr, size)` string output of a description query.
macro_rules! description_string {
    ($self:ident, $fn:ident, $args:ident, $ptr:ident, $len:ident) => {{
        let mut a = ffi::$args::new();
        a.device_description = $self.description()?;
        // SAFETY: the description is live as long as the client; the string
        // output has the description's lifetime and is copied at once.
        unsafe {
            pjrt_call!($self.client.plugin_inner(), $fn, &mut a)?;
            Ok(bytes_to_string(a.$ptr, a.$len))
        }
    }};
}

impl Device {
    pub(crate) fn new(client: Client, raw: *mut ffi::PJRT_Device) -> Device {
        Device { client, raw }
    }

    pub(crate) fn raw(&self) -> *mut ffi::PJRT_Device {
        self.raw
    }

    /// The client this device belongs to.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn description(&self) -> Result<*mut ffi::PJRT_DeviceDescription> {
        let mut args = ffi::PJRT_Device_GetDescription_Args::new();
        args.device = self.raw;
        // SAFETY: the device is live as long as the client.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Device_GetDescription,
                &mut args
            )
        }?;
        Ok(args.device_description)
    }

    /// Global device id, unique across all processes.
    pub fn id(&self) -> Result<i32> {
        let mut args = ffi::PJRT_DeviceDescription_Id_Args::new();
        args.device_description = self.description()?;
        // SAFETY: the description is live.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_DeviceDescription_Id,
                &mut args
            )
        }?;
        Ok(args.id)
    }

    /// Index of the process that owns this device.
    pub fn process_index(&self) -> Result<i32> {
        let mut args = ffi::PJRT_DeviceDescription_ProcessIndex_Args::new();
        args.device_description = self.description()?;
        // SAFETY: the description is live.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_DeviceDescription_ProcessIndex,
                &mut args
            )
        }?;
        Ok(args.process_index)
    }

    /// Device kind, e.g. `cpu` or `NVIDIA H100 80GB HBM3`.
    pub fn kind(&self) -> Result<String> {
        description_string!(
            self,
            PJRT_DeviceDescription_Kind,
            PJRT_DeviceDescription_Kind_Args,
            device_kind,
            device_kind_size
        )
    }

    /// Verbose description for debugging.
    pub fn debug_string(&self) -> Result<String> {
        description_string!(
            self,
            PJRT_DeviceDescription_DebugString,
            PJRT_DeviceDescription_DebugString_Args,
            debug_string,
            debug_string_size
        )
    }

    /// Short description, e.g. `CpuDevice(id=0)`.
    pub fn to_display_string(&self) -> Result<String> {
        description_string!(
            self,
            PJRT_DeviceDescription_ToString,
            PJRT_DeviceDescription_ToString_Args,
            to_string,
            to_string_size
        )
    }

    /// Plugin-specific attributes (e.g. `coords`, `compute_capability`).
    pub fn attributes(&self) -> Result<Vec<NamedValue>> {
        let mut args = ffi::PJRT_DeviceDescription_Attributes_Args::new();
        args.device_description = self.description()?;
        // SAFETY: the description is live; attributes have its lifetime and
        // are copied at once.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_DeviceDescription_Attributes,
                &mut args
            )?;
            Ok(read_named_values(args.attributes, args.num_attributes))
        }
    }

    /// Whether this process can use the device.
    pub fn is_addressable(&self) -> Result<bool> {
        let mut args = ffi::PJRT_Device_IsAddressable_Args::new();
        args.device = self.raw;
        // SAFETY: the device is live.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Device_IsAddressable,
                &mut args
            )
        }?;
        Ok(args.is_addressable)
    }

    /// Hardware id local to the owning process (-1 if not addressable).
    pub fn local_hardware_id(&self) -> Result<i32> {
        let mut args = ffi::PJRT_Device_LocalHardwareId_Args::new();
        args.device = self.raw;
        // SAFETY: the device is live.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Device_LocalHardwareId,
                &mut args
            )
        }?;
        Ok(args.local_hardware_id)
    }

    /// The device's memory limit in bytes (`bytes_limit` of
    /// `PJRT_Device_MemoryStats`), `None` where the plugin does not report
    /// it (the CPU plugin: UNIMPLEMENTED).
    pub fn memory_limit(&self) -> Result<Option<u64>> {
        let mut args = ffi::PJRT_Device_MemoryStats_Args::new();
        args.device = self.raw;
        // SAFETY: the device is live; the plugin fills the output fields.
        let r = unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Device_MemoryStats,
                &mut args
            )
        };
        match r {
            Ok(()) => Ok((args.bytes_limit_is_set && args.bytes_limit >= 0)
                .then_some(args.bytes_limit as u64)),
            Err(crate::Error::Pjrt {
                code: crate::ErrorCode::Unimplemented,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Memories this device can address.
    pub fn memories(&self) -> Result<Vec<Memory>> {
        let mut args = ffi::PJRT_Device_AddressableMemories_Args::new();
        args.device = self.raw;
        // SAFETY: the device is live.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Device_AddressableMemories,
                &mut args
            )
        }?;
        Ok(Memory::list(&self.client, args.memories, args.num_memories))
    }

    /// The device's default memory.
    pub fn default_memory(&self) -> Result<Memory> {
        let mut args = ffi::PJRT_Device_DefaultMemory_Args::new();
        args.device = self.raw;
        // SAFETY: the device is live.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Device_DefaultMemory,
                &mut args
            )
        }?;
        Ok(Memory {
            client: self.client.clone(),
            raw: args.memory,
        })
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Device) -> bool {
        self.raw == other.raw
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_display_string() {
            Ok(s) => f.write_str(&s),
            Err(_) => write!(f, "Device({:p})", self.raw),
        }
    }
}

/// A memory space (device memory, pinned host memory, ...).
#[derive(Clone)]
pub struct Memory {
    client: Client,
    raw: *mut ffi::PJRT_Memory,
}

// SAFETY: memory handles are immutable plugin objects owned by the client.
unsafe impl Send for Memory {}
// SAFETY: see `Send`.
unsafe impl Sync for Memory {}

impl Memory {
    pub(crate) fn list(
        client: &Client,
        ptr: *const *mut ffi::PJRT_Memory,
        n: usize,
    ) -> Vec<Memory> {
        if ptr.is_null() {
            return Vec::new();
        }
        // SAFETY: the plugin returned `n` memory pointers owned by the client.
        let raw = unsafe { std::slice::from_raw_parts(ptr, n) };
        raw.iter()
            .map(|&m| Memory {
                client: client.clone(),
                raw: m,
            })
            .collect()
    }

    /// Memory id, unique within the client.
    pub fn id(&self) -> Result<i32> {
        let mut args = ffi::PJRT_Memory_Id_Args::new();
        args.memory = self.raw;
        // SAFETY: the memory is live as long as the client.
        unsafe { pjrt_call!(self.client.plugin_inner(), PJRT_Memory_Id, &mut args) }?;
        Ok(args.id)
    }

    /// Memory kind, e.g. `device` or `pinned_host`.
    pub fn kind(&self) -> Result<String> {
        let mut args = ffi::PJRT_Memory_Kind_Args::new();
        args.memory = self.raw;
        // SAFETY: the memory is live; the string is copied at once.
        unsafe {
            pjrt_call!(self.client.plugin_inner(), PJRT_Memory_Kind, &mut args)?;
            Ok(bytes_to_string(args.kind, args.kind_size))
        }
    }

    /// Verbose description for debugging.
    pub fn debug_string(&self) -> Result<String> {
        let mut args = ffi::PJRT_Memory_DebugString_Args::new();
        args.memory = self.raw;
        // SAFETY: the memory is live; the string is copied at once.
        unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_Memory_DebugString,
                &mut args
            )?;
            Ok(bytes_to_string(args.debug_string, args.debug_string_size))
        }
    }
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind() {
            Ok(k) => write!(f, "Memory({k})"),
            Err(_) => write!(f, "Memory({:p})", self.raw),
        }
    }
}
