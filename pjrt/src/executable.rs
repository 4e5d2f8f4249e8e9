//! Compiled programs and their execution.
//!
//! Invariants:
//! 1. A [`LoadedExecutable`] destroys its handle exactly once, after every
//!    [`Execution`] made from it handed out its outputs.
//! 2. Every output buffer and event the plugin returns is wrapped (and so
//!    destroyed) even when a later step fails.
//! 3. No two executions that could run at once share a launch id: plugins
//!    key a collective's rendezvous on it, and a shared id joins two
//!    clients' all-reduces (the plugin then aborts the process).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::buffer::Buffer;
use crate::client::Client;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::ffi;
use crate::hlo::{entry_parameter_shapes, ParameterShape};
use crate::plugin::{bytes_to_string, PluginInner};

/// A program compiled for the client's devices.
#[derive(Clone)]
pub struct LoadedExecutable {
    inner: Arc<ExecutableInner>,
}

struct ExecutableInner {
    client: Client,
    raw: *mut ffi::PJRT_LoadedExecutable,
    num_outputs: usize,
    name: String,
    /// Per-partition parameter shapes; `None` when the plugin cannot say.
    parameters: Option<Vec<ParameterShape>>,
}

// SAFETY: PJRT executables may be executed concurrently from any thread.
unsafe impl Send for ExecutableInner {}
// SAFETY: see `Send`.
unsafe impl Sync for ExecutableInner {}

impl Drop for ExecutableInner {
    fn drop(&mut self) {
        let mut args = ffi::PJRT_LoadedExecutable_Destroy_Args::new();
        args.executable = self.raw;
        // SAFETY: we own the executable (invariant 1).
        if let Err(e) = unsafe {
            pjrt_call!(
                self.client.plugin_inner(),
                PJRT_LoadedExecutable_Destroy,
                &mut args
            )
        } {
            tracing::warn!("PJRT_LoadedExecutable_Destroy: {e}");
        }
    }
}

/// Per-call arrays: on the stack for up to 8 devices × arguments.
type Scratch<T> = SmallVec<[T; 8]>;

/// One argument of one device's argument list.
pub enum ExecuteArg<'a> {
    /// The buffer stays valid after execution.
    Borrow(&'a Buffer),
    /// The program may reuse the buffer's memory for an output; the buffer
    /// is consumed.
    Donate(Buffer),
}

impl ExecuteArg<'_> {
    fn buffer(&self) -> &Buffer {
        match self {
            ExecuteArg::Borrow(b) => b,
            ExecuteArg::Donate(b) => b,
        }
    }
}

/// Outputs of a launched execution, per device, and its completion events.
pub struct Execution {
    outputs: Vec<Vec<Buffer>>,
    events: Scratch<Event>,
    _executable: LoadedExecutable,
}

impl Execution {
    /// Waits (asynchronously) for every device to finish and returns the
    /// outputs, `outputs[device][output]`.
    pub async fn finish(self) -> Result<Vec<Vec<Buffer>>> {
        for ev in self.events {
            ev.await?;
        }
        Ok(self.outputs)
    }

    /// Blocks until every device has finished and returns the outputs.
    pub fn wait(self) -> Result<Vec<Vec<Buffer>>> {
        for ev in self.events {
            ev.wait()?;
        }
        Ok(self.outputs)
    }
}

impl LoadedExecutable {
    /// # Safety
    /// `raw` must be a live executable of `client` that we own.
    pub(crate) unsafe fn from_raw(
        client: Client,
        raw: *mut ffi::PJRT_LoadedExecutable,
    ) -> LoadedExecutable {
        let mut get = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        get.loaded_executable = raw;
        let mut num_outputs = 0;
        let mut name = String::new();
        let mut parameters = None;
        // SAFETY: `raw` is live. GetExecutable returns a new
        // PJRT_Executable we must destroy; we query it and destroy it here.
        unsafe {
            if pjrt_call!(
                client.plugin_inner(),
                PJRT_LoadedExecutable_GetExecutable,
                &mut get
            )
            .is_ok()
            {
                let mut n = ffi::PJRT_Executable_NumOutputs_Args::new();
                n.executable = get.executable;
                if pjrt_call!(client.plugin_inner(), PJRT_Executable_NumOutputs, &mut n).is_ok() {
                    num_outputs = n.num_outputs;
                }
                let mut nm = ffi::PJRT_Executable_Name_Args::new();
                nm.executable = get.executable;
                if pjrt_call!(client.plugin_inner(), PJRT_Executable_Name, &mut nm).is_ok() {
                    name = bytes_to_string(nm.executable_name, nm.executable_name_size);
                }
                parameters = optimized_program(client.plugin_inner(), get.executable)
                    .and_then(|m| entry_parameter_shapes(&m));
                if parameters.is_none() {
                    tracing::warn!(
                        "plugin did not report parameter shapes; arguments are not checked"
                    );
                }
                let mut d = ffi::PJRT_Executable_Destroy_Args::new();
                d.executable = get.executable;
                let _ = pjrt_call!(client.plugin_inner(), PJRT_Executable_Destroy, &mut d);
            }
        }
        LoadedExecutable {
            inner: Arc::new(ExecutableInner {
                client,
                raw,
                num_outputs,
                name,
                parameters,
            }),
        }
    }

    /// The raw `PJRT_LoadedExecutable*`, valid while any clone lives.
    pub fn as_raw(&self) -> *mut ffi::PJRT_LoadedExecutable {
        self.inner.raw
    }

    /// The program's name (its module name).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Number of outputs per device (tuple results are flattened).
    pub fn num_outputs(&self) -> usize {
        self.inner.num_outputs
    }

    /// Per-device parameter shapes, when the plugin reports its optimized
    /// program; arguments are checked against them before execution.
    pub fn parameter_shapes(&self) -> Option<&[ParameterShape]> {
        self.inner.parameters.as_deref()
    }

    /// Checks every argument's element type and dimensions.
    fn check_arguments(&self, lists: &[&[&Buffer]]) -> Result<()> {
        let Some(params) = &self.inner.parameters else {
            return Ok(());
        };
        for (d, list) in lists.iter().enumerate() {
            if list.len() != params.len() {
                return Err(Error::InvalidArgument(format!(
                    "program `{}` takes {} arguments, device {d} was given {}",
                    self.inner.name,
                    params.len(),
                    list.len()
                )));
            }
            for (i, (b, want)) in list.iter().zip(params).enumerate() {
                let (ty, dims) = b.shape()?;
                if want.element_type != Some(*ty) || want.dims != *dims {
                    let got = ParameterShape {
                        element_type: Some(*ty),
                        dims: dims.clone(),
                    };
                    return Err(Error::InvalidArgument(format!(
                        "argument {i} of `{}` on device {d}: expected {want}, got {got}",
                        self.inner.name
                    )));
                }
            }
        }
        Ok(())
    }

    /// The devices the executable runs on, in execution order.
    pub fn addressable_devices(&self) -> Result<Vec<Device>> {
        let mut args = ffi::PJRT_LoadedExecutable_AddressableDevices_Args::new();
        args.executable = self.inner.raw;
        // SAFETY: the executable is live.
        unsafe {
            pjrt_call!(
                self.inner.client.plugin_inner(),
                PJRT_LoadedExecutable_AddressableDevices,
                &mut args
            )?;
            if args.addressable_devices.is_null() {
                return Ok(Vec::new());
            }
            Ok(
                std::slice::from_raw_parts(args.addressable_devices, args.num_addressable_devices)
                    .iter()
                    .map(|&d| Device::new(self.inner.client.clone(), d))
                    .collect(),
            )
        }
    }

    /// Launches the program with borrowed arguments, `args[device][arg]`,
    /// one list per addressable device of the executable.
    pub fn execute(&self, args: &[&[&Buffer]]) -> Result<Execution> {
        self.launch(args, &[])
    }

    /// Launches the program; arguments may be donated. Donation must be the
    /// same for an argument index on every device.
    pub fn execute_args(&self, args: Vec<Vec<ExecuteArg<'_>>>) -> Result<Execution> {
        let num_args = args.first().map_or(0, Vec::len);
        let mut donated = vec![false; num_args];
        for (i, flag) in donated.iter_mut().enumerate() {
            let n = args
                .iter()
                .filter(|l| matches!(l.get(i), Some(ExecuteArg::Donate(_))))
                .count();
            if n != 0 && n != args.len() {
                return Err(Error::InvalidArgument(format!(
                    "argument {i} is donated on some devices but not on others"
                )));
            }
            *flag = n != 0;
        }
        let views: Vec<Vec<&Buffer>> = args
            .iter()
            .map(|l| l.iter().map(ExecuteArg::buffer).collect())
            .collect();
        let lists: Vec<&[&Buffer]> = views.iter().map(Vec::as_slice).collect();
        let execution = self.launch(&lists, &donated);
        // Donated buffers are consumed: their handles are destroyed here.
        drop(views);
        drop(args);
        execution
    }

    /// Validates and launches. `donated[i]` marks argument i donated on every
    /// device; an empty slice donates nothing.
    fn launch(&self, lists: &[&[&Buffer]], donated: &[bool]) -> Result<Execution> {
        let num_devices = lists.len();
        if num_devices == 0 {
            return Err(Error::InvalidArgument(
                "execute needs at least one device's argument list".into(),
            ));
        }
        let num_args = lists[0].len();
        if let Some((d, l)) = lists.iter().enumerate().find(|(_, l)| l.len() != num_args) {
            return Err(Error::InvalidArgument(format!(
                "device 0 has {num_args} arguments but device {d} has {}",
                l.len()
            )));
        }
        let client = &self.inner.client;
        self.check_arguments(lists)?;
        if let Some(b) = lists
            .iter()
            .flat_map(|l| l.iter())
            .find(|b| !Arc::ptr_eq(&b.client().inner, &client.inner))
        {
            return Err(Error::InvalidArgument(format!(
                "argument {b:?} belongs to another client"
            )));
        }
        let non_donatable: Scratch<i64> = (0..num_args)
            .filter(|&i| !donated.get(i).copied().unwrap_or(false))
            .map(|i| i as i64)
            .collect();

        // Flat arrays, one allocation each, with per-device row pointers.
        let raw_args: Scratch<*mut ffi::PJRT_Buffer> = lists
            .iter()
            .flat_map(|l| l.iter().map(|b| b.raw()))
            .collect();
        let arg_rows: Scratch<*const *mut ffi::PJRT_Buffer> = (0..num_devices)
            .map(|d| raw_args[d * num_args..].as_ptr())
            .collect();
        let n_out = self.inner.num_outputs;
        let mut outputs: Scratch<*mut ffi::PJRT_Buffer> =
            smallvec::smallvec![std::ptr::null_mut(); num_devices * n_out];
        let out_base = outputs.as_mut_ptr();
        // SAFETY: d * n_out <= outputs.len(), so each row pointer stays in
        // (or one past the end of) the allocation.
        let out_rows: Scratch<*mut *mut ffi::PJRT_Buffer> = (0..num_devices)
            .map(|d| unsafe { out_base.add(d * n_out) })
            .collect();
        let mut events: Scratch<*mut ffi::PJRT_Event> =
            smallvec::smallvec![std::ptr::null_mut(); num_devices];

        let mut options = ffi::PJRT_ExecuteOptions::new();
        options.launch_id = next_launch_id();
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();

        let mut exec = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        exec.executable = self.inner.raw;
        exec.options = &mut options;
        exec.argument_lists = arg_rows.as_ptr();
        exec.num_devices = num_devices;
        exec.num_args = num_args;
        exec.output_lists = out_rows.as_ptr();
        exec.device_complete_events = events.as_mut_ptr();
        // SAFETY: every array outlives the call and has the sizes stated:
        // num_devices rows of num_args live buffers, num_devices rows of
        // num_outputs output slots, num_devices event slots.
        unsafe {
            pjrt_call!(
                client.plugin_inner(),
                PJRT_LoadedExecutable_Execute,
                &mut exec
            )
        }?;

        let plugin = &client.inner.plugin.inner;
        // On success the plugin filled every slot with a new buffer or event
        // that we own (invariant 2).
        let outputs = (0..num_devices)
            .map(|d| {
                outputs[d * n_out..(d + 1) * n_out]
                    .iter()
                    // SAFETY: a new buffer of ours, wrapped once (above).
                    .map(|&b| unsafe { Buffer::from_raw(client.clone(), b) })
                    .collect()
            })
            .collect();
        let events = events
            .into_iter()
            .filter(|e| !e.is_null())
            // SAFETY: a new, non-null event of ours, wrapped once (above).
            .map(|e| unsafe { Event::from_raw(plugin.clone(), e) })
            .collect();
        Ok(Execution {
            outputs,
            events,
            _executable: self.clone(),
        })
    }
}

/// A launch id no other execution of this process has used in the last
/// 2^31 - 1 launches (invariant 3); never 0, the id of a caller that sets
/// none.
fn next_launch_id() -> i32 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) % i32::MAX as u64;
    n as i32 + 1
}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedExecutable")
            .field("name", &self.inner.name)
            .field("num_outputs", &self.inner.num_outputs)
            .finish()
    }
}

/// The optimized program as a serialized `HloModuleProto`, if the plugin
/// provides it (as `hlo`, or inside an `HloModuleProtoWithConfig`).
///
/// # Safety
/// `executable` must be a live executable of `plugin`.
unsafe fn optimized_program(
    plugin: &PluginInner,
    executable: *mut ffi::PJRT_Executable,
) -> Option<Vec<u8>> {
    let mut program = ffi::PJRT_Program::new();
    let mut args = ffi::PJRT_Executable_OptimizedProgram_Args::new();
    args.executable = executable;
    args.program = &mut program;
    // SAFETY: with code null the plugin only reports code_size.
    unsafe { pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut args) }.ok()?;
    let mut code = vec![0u8; program.code_size];
    program.code = code.as_mut_ptr().cast();
    // SAFETY: `code` has code_size bytes for the plugin to fill.
    unsafe { pjrt_call!(plugin, PJRT_Executable_OptimizedProgram, &mut args) }.ok()?;
    // SAFETY: on success the plugin set `format` to `format_size` bytes it
    // keeps alive with the executable (or null).
    let format = unsafe { bytes_to_string(program.format, program.format_size) };
    match format.as_str() {
        "hlo" => Some(code),
        "hlo_with_config" => crate::hlo::module_of_module_with_config(&code),
        _ => None,
    }
}
