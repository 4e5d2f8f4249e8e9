//! `PJRT_Client`: devices, compilation and host-to-device transfers.
//!
//! Invariants:
//! 1. The PJRT client is destroyed after every buffer, executable and
//!    device handle made from it: each of those holds an `Arc` of
//!    [`ClientInner`].
//! 2. The [`KvBridge`] given to the plugin outlives the PJRT client:
//!    `ClientInner::drop` destroys the client before its fields (the bridge)
//!    are dropped.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use crate::buffer::{Buffer, HostBuffer};
use crate::compile::{CompileOptions, Program};
use crate::device::{Device, Memory};
use crate::error::{Error, Result};
use crate::executable::LoadedExecutable;
use crate::ffi;
use crate::kv::{self, KeyValueStore, KvBridge, Waits};
use crate::plugin::{bytes_to_string, Plugin, PluginInner};
use crate::value::{NamedValue, RawNamedValues, Value};

/// The debug option a mocked multi-node client compiles with.
const MOCK_NO_SHARDING: (&str, crate::compile::OptionOverride) = (
    "xla_gpu_shard_autotuning",
    crate::compile::OptionOverride::Bool(false),
);

/// Options for [`Client::create`].
#[derive(Clone, Default)]
pub struct ClientOptions {
    options: Vec<NamedValue>,
    kv_store: Option<Arc<dyn KeyValueStore>>,
    kv_wait_limit: Option<Duration>,
    waits: Arc<Waits>,
}

impl ClientOptions {
    /// Adds a named create option (`cpu_device_count`, `num_nodes`,
    /// `node_id`, `visible_devices`, ...).
    pub fn option(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        self.options.push(NamedValue::new(name, value));
        self
    }

    /// Wires the distributed-runtime callbacks to `store`.
    pub fn kv_store(mut self, store: Arc<dyn KeyValueStore>) -> Self {
        self.kv_store = Some(store);
        self
    }

    /// No get the plugin makes through the store waits longer than
    /// `limit`, whatever timeout it asks for: a plugin that waits for a
    /// key nobody writes gets `DEADLINE_EXCEEDED` instead of hanging.
    pub fn kv_wait_limit(mut self, limit: Duration) -> Self {
        self.kv_wait_limit = Some(limit);
        self
    }

    /// The named options set so far.
    pub fn options(&self) -> &[NamedValue] {
        &self.options
    }
}

/// A PJRT client. Cheap to clone; all clones share one PJRT client.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Plugin,
    pub(crate) raw: *mut ffi::PJRT_Client,
    kv: Option<Box<KvBridge>>,
    /// Created with `enable_mock_nccl = true` (see [`Client::compile`]).
    mock_nccl: bool,
}

// SAFETY: PJRT clients are thread-safe by contract; the bridge is Sync.
unsafe impl Send for ClientInner {}
// SAFETY: see `Send`.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_Client_Destroy_Args::new();
        args.client = self.raw;
        // SAFETY: every handle made from this client holds an Arc of this
        // struct, so none is left (invariant 1).
        if let Err(e) = unsafe { pjrt_call!(self.plugin.inner, PJRT_Client_Destroy, &mut args) } {
            tracing::warn!("PJRT_Client_Destroy: {e}");
        }
        // `self.kv` is dropped after this body: invariant 2.
    }
}

impl Client {
    /// Creates a client. If a key-value store is set, the plugin's
    /// distributed-runtime callbacks call it; a panic inside the store
    /// during creation is re-raised here once the plugin has returned.
    pub fn create(plugin: &Plugin, options: ClientOptions) -> Result<Client> {
        let mock_nccl = options
            .options
            .iter()
            .any(|o| o.name == "enable_mock_nccl" && o.value == Value::Bool(true));
        let raw_opts = RawNamedValues::new(&options.options);
        let bridge = options
            .kv_store
            .map(|s| KvBridge::with(s, options.waits.clone(), options.kv_wait_limit));
        let mut args = ffi::PJRT_Client_Create_Args::new();
        args.create_options = raw_opts.as_ptr();
        args.num_options = raw_opts.len();
        if let Some(b) = &bridge {
            args.kv_get_callback = kv::get_callback();
            args.kv_get_user_arg = b.user_arg();
            args.kv_try_get_callback = kv::try_get_callback();
            args.kv_try_get_user_arg = b.user_arg();
            args.kv_put_callback = kv::put_callback();
            args.kv_put_user_arg = b.user_arg();
        }
        // SAFETY: options and the bridge outlive the call; the bridge lives
        // as long as the client (invariant 2).
        let result = unsafe { pjrt_call!(plugin.inner, PJRT_Client_Create, &mut args) };
        let panic = bridge.as_ref().and_then(|b| b.take_panic());
        let client = match result {
            Ok(()) => Client {
                inner: Arc::new(ClientInner {
                    plugin: plugin.clone(),
                    raw: args.client,
                    kv: bridge,
                    mock_nccl,
                }),
            },
            Err(e) => {
                if let Some(p) = panic {
                    resume_unwind(p);
                }
                return Err(e);
            }
        };
        if let Some(p) = panic {
            drop(client);
            resume_unwind(p);
        }
        Ok(client)
    }

    /// [`Client::create`] with a deadline: the plugin runs on a thread of
    /// its own, and if it has not returned within `limit` that thread is
    /// abandoned (the client, should it come later, is destroyed there)
    /// and [`Error::CreateTimedOut`] names the keys the plugin was blocked
    /// on. A panic in the store is re-raised here.
    pub fn create_within(
        plugin: &Plugin,
        options: ClientOptions,
        limit: Duration,
    ) -> Result<Client> {
        let waits = options.waits.clone();
        let plugin = plugin.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("pjrt-client-create".into())
            .spawn(move || {
                let r = catch_unwind(AssertUnwindSafe(|| Client::create(&plugin, options)));
                let _ = tx.send(r);
            })
            .map_err(|e| {
                Error::Internal(format!("cannot start a thread for client creation: {e}"))
            })?;
        match rx.recv_timeout(limit) {
            Ok(Ok(r)) => r,
            Ok(Err(panic)) => resume_unwind(panic),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Error::CreateTimedOut {
                after: limit,
                waiting: waits.keys(),
            }),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::Internal(
                "the client creation thread ended without an answer".into(),
            )),
        }
    }

    pub(crate) fn plugin_inner(&self) -> &PluginInner {
        &self.inner.plugin.inner
    }

    /// The plugin this client was created from.
    pub fn plugin(&self) -> &Plugin {
        &self.inner.plugin
    }

    /// The raw `PJRT_Client*`, valid while any clone of this client lives.
    pub fn as_raw(&self) -> *mut ffi::PJRT_Client {
        self.inner.raw
    }

    /// Whether this client was given a key-value store.
    pub fn has_kv_store(&self) -> bool {
        self.inner.kv.is_some()
    }

    /// Platform name, e.g. `cpu` or `cuda`.
    pub fn platform_name(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformName_Args::new();
        args.client = self.inner.raw;
        // SAFETY: the client is live; outputs have the client's lifetime.
        unsafe {
            pjrt_call!(self.plugin_inner(), PJRT_Client_PlatformName, &mut args)?;
            Ok(bytes_to_string(args.platform_name, args.platform_name_size))
        }
    }

    /// Platform version string.
    pub fn platform_version(&self) -> Result<String> {
        let mut args = ffi::PJRT_Client_PlatformVersion_Args::new();
        args.client = self.inner.raw;
        // SAFETY: the client is live; outputs have the client's lifetime.
        unsafe {
            pjrt_call!(self.plugin_inner(), PJRT_Client_PlatformVersion, &mut args)?;
            Ok(bytes_to_string(
                args.platform_version,
                args.platform_version_size,
            ))
        }
    }

    /// Index of this process among the processes of a multi-node client.
    pub fn process_index(&self) -> Result<i32> {
        let mut args = ffi::PJRT_Client_ProcessIndex_Args::new();
        args.client = self.inner.raw;
        // SAFETY: the client is live.
        unsafe { pjrt_call!(self.plugin_inner(), PJRT_Client_ProcessIndex, &mut args) }?;
        Ok(args.process_index)
    }

    fn device_list(&self, ptr: *const *mut ffi::PJRT_Device, n: usize) -> Vec<Device> {
        if ptr.is_null() {
            return Vec::new();
        }
        // SAFETY: the plugin returned `n` device pointers owned by the client.
        let raw = unsafe { std::slice::from_raw_parts(ptr, n) };
        raw.iter().map(|&d| Device::new(self.clone(), d)).collect()
    }

    /// All devices of all processes.
    pub fn devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_Client_Devices_Args::new();
        args.client = self.inner.raw;
        // SAFETY: the client is live.
        unsafe { pjrt_call!(self.plugin_inner(), PJRT_Client_Devices, &mut args) }?;
        Ok(self.device_list(args.devices, args.num_devices))
    }

    /// Devices this process can use.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_Client_AddressableDevices_Args::new();
        args.client = self.inner.raw;
        // SAFETY: the client is live.
        unsafe {
            pjrt_call!(
                self.plugin_inner(),
                PJRT_Client_AddressableDevices,
                &mut args
            )
        }?;
        Ok(self.device_list(args.addressable_devices, args.num_addressable_devices))
    }

    /// The device with global id `id`.
    pub fn lookup_device(&self, id: i32) -> Result<Device> {
        let mut args = ffi::PJRT_Client_LookupDevice_Args::new();
        args.client = self.inner.raw;
        args.id = id;
        // SAFETY: the client is live.
        unsafe { pjrt_call!(self.plugin_inner(), PJRT_Client_LookupDevice, &mut args) }?;
        Ok(Device::new(self.clone(), args.device))
    }

    /// Memories this process can use.
    pub fn addressable_memories(&self) -> Result<Vec<Memory>> {
        let mut args = ffi::PJRT_Client_AddressableMemories_Args::new();
        args.client = self.inner.raw;
        // SAFETY: the client is live.
        unsafe {
            pjrt_call!(
                self.plugin_inner(),
                PJRT_Client_AddressableMemories,
                &mut args
            )
        }?;
        Ok(Memory::list(
            self,
            args.addressable_memories,
            args.num_addressable_memories,
        ))
    }

    /// The plugin's default assignment of `replicas` × `partitions` to
    /// device ids, as `assignment[replica][partition]`.
    pub fn default_device_assignment(
        &self,
        replicas: usize,
        partitions: usize,
    ) -> Result<Vec<Vec<i32>>> {
        if replicas == 0 || partitions == 0 {
            return Err(Error::InvalidArgument(
                "replicas and partitions must both be at least 1".into(),
            ));
        }
        let total = replicas
            .checked_mul(partitions)
            .filter(|&t| t <= i32::MAX as usize)
            .ok_or_else(|| Error::InvalidArgument("replicas × partitions is too large".into()))?;
        let mut out = vec![0i32; total];
        let mut args = ffi::PJRT_Client_DefaultDeviceAssignment_Args::new();
        args.client = self.inner.raw;
        args.num_replicas = replicas as i32;
        args.num_partitions = partitions as i32;
        args.default_assignment_size = total;
        args.default_assignment = out.as_mut_ptr();
        // SAFETY: `out` has room for `total` ints.
        unsafe {
            pjrt_call!(
                self.plugin_inner(),
                PJRT_Client_DefaultDeviceAssignment,
                &mut args
            )
        }?;
        Ok(out.chunks(partitions).map(<[i32]>::to_vec).collect())
    }

    /// Compiles `program` with `options`.
    ///
    /// A client that mocks other nodes (`enable_mock_nccl`) compiles with
    /// XLA's sharded autotuning off: that shares autotuning results through
    /// the key-value store, and no mocked node ever publishes its share, so
    /// compiling any multi-device program would wait forever (seen with
    /// jax-cuda13-pjrt 0.11.2, JAX's own mock mode included).
    pub fn compile(&self, program: &Program, options: &CompileOptions) -> Result<LoadedExecutable> {
        options.validate()?;
        let mocked = self.inner.mock_nccl
            && !options
                .overrides
                .iter()
                .any(|(n, _)| n == MOCK_NO_SHARDING.0);
        let encoded = if mocked {
            options
                .clone()
                .with_override(MOCK_NO_SHARDING.0, MOCK_NO_SHARDING.1.clone())
                .encode()
        } else {
            options.encode()
        };
        let format = program.format().as_str();
        let mut raw_program = ffi::PJRT_Program::new();
        // The plugin reads the code but the C type is non-const.
        raw_program.code = program.code().as_ptr().cast_mut().cast();
        raw_program.code_size = program.code().len();
        raw_program.format = format.as_ptr().cast();
        raw_program.format_size = format.len();
        let mut args = ffi::PJRT_Client_Compile_Args::new();
        args.client = self.inner.raw;
        args.program = &raw_program;
        args.compile_options = encoded.as_ptr().cast();
        args.compile_options_size = encoded.len();
        // SAFETY: program and options outlive the call; the plugin does not
        // write to `code` when compiling.
        unsafe { pjrt_call!(self.plugin_inner(), PJRT_Client_Compile, &mut args) }?;
        // SAFETY: the plugin returned a new executable we own.
        Ok(unsafe { LoadedExecutable::from_raw(self.clone(), args.executable) })
    }

    /// Copies a host array to `device`. The host data may be reused as soon
    /// as this returns.
    pub fn buffer_from_host(&self, host: &HostBuffer, device: &Device) -> Result<Buffer> {
        self.buffer_from_bytes(host.element_type(), host.dims(), host.bytes(), device)
    }

    /// Copies a typed host slice with `dims` to `device`.
    pub fn buffer_from_slice<T: crate::NativeType>(
        &self,
        data: &[T],
        dims: &[i64],
        device: &Device,
    ) -> Result<Buffer> {
        self.buffer_from_bytes(T::TYPE, dims, T::as_bytes(data), device)
    }

    /// Copies raw little-endian bytes of `ty` with `dims` to `device`.
    pub fn buffer_from_bytes(
        &self,
        ty: crate::ElementType,
        dims: &[i64],
        bytes: &[u8],
        device: &Device,
    ) -> Result<Buffer> {
        crate::buffer::check_size(ty, dims, bytes.len())?;
        if !Arc::ptr_eq(&device.client().inner, &self.inner) {
            return Err(Error::InvalidArgument(
                "device belongs to another client".into(),
            ));
        }
        let mut args = ffi::PJRT_Client_BufferFromHostBuffer_Args::new();
        args.client = self.inner.raw;
        args.data = bytes.as_ptr().cast();
        args.type_ = ty.to_raw();
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics = ffi::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        args.device = device.raw();
        // SAFETY: `bytes` holds exactly the array (checked above) and stays
        // valid for the call; with ImmutableOnlyDuringCall the plugin copies
        // it before returning.
        unsafe {
            pjrt_call!(
                self.plugin_inner(),
                PJRT_Client_BufferFromHostBuffer,
                &mut args
            )
        }?;
        // SAFETY: both outputs are new objects we own.
        let (buffer, done) = unsafe {
            (
                Buffer::from_raw(self.clone(), args.buffer),
                (!args.done_with_host_buffer.is_null()).then(|| {
                    crate::event::Event::from_raw(
                        self.inner.plugin.inner.clone(),
                        args.done_with_host_buffer,
                    )
                }),
            )
        };
        if let Some(done) = done {
            done.wait()?;
        }
        Ok(buffer)
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("plugin", &self.inner.plugin)
            .field("kv_store", &self.inner.kv.is_some())
            .finish()
    }
}
