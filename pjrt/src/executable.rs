//! Compiled programs and their execution.
//!
//! Invariants:
//! 1. A [`LoadedExecutable`] owns its `PJRT_LoadedExecutable*` and destroys
//!    it exactly once, after every [`Execution`] made from it has handed out
//!    its outputs (executions hold the executable alive).
//! 2. Every output buffer and completion event the plugin returns is
//!    wrapped (and so destroyed) even when a later step fails.

use std::sync::Arc;

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
    events: Vec<Event>,
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
    fn check_arguments(&self, args: &[Vec<ExecuteArg<'_>>]) -> Result<()> {
        let Some(params) = &self.inner.parameters else {
            return Ok(());
        };
        for (d, list) in args.iter().enumerate() {
            if list.len() != params.len() {
                return Err(Error::InvalidArgument(format!(
                    "program `{}` takes {} arguments, device {d} was given {}",
                    self.inner.name,
                    params.len(),
                    list.len()
                )));
            }
            for (i, (arg, want)) in list.iter().zip(params).enumerate() {
                let b = arg.buffer();
                let got = ParameterShape {
                    element_type: Some(b.element_type()?),
                    dims: b.dims()?,
                };
                if got != *want {
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
        let lists = args
            .iter()
            .map(|l| l.iter().map(|b| ExecuteArg::Borrow(b)).collect())
            .collect();
        self.execute_args(lists)
    }

    /// Launches the program; arguments may be donated. Donation must be the
    /// same for an argument index on every device.
    pub fn execute_args(&self, args: Vec<Vec<ExecuteArg<'_>>>) -> Result<Execution> {
        let num_devices = args.len();
        if num_devices == 0 {
            return Err(Error::InvalidArgument(
                "execute needs at least one device's argument list".into(),
            ));
        }
        let num_args = args[0].len();
        if let Some((d, l)) = args.iter().enumerate().find(|(_, l)| l.len() != num_args) {
            return Err(Error::InvalidArgument(format!(
                "device 0 has {num_args} arguments but device {d} has {}",
                l.len()
            )));
        }
        let mut non_donatable = Vec::new();
        for i in 0..num_args {
            let donated = args
                .iter()
                .filter(|l| matches!(l[i], ExecuteArg::Donate(_)))
                .count();
            if donated == 0 {
                non_donatable.push(i as i64);
            } else if donated != num_devices {
                return Err(Error::InvalidArgument(format!(
                    "argument {i} is donated on some devices but not on others"
                )));
            }
        }
        let client = &self.inner.client;
        self.check_arguments(&args)?;
        if let Some(a) = args
            .iter()
            .flatten()
            .find(|a| !Arc::ptr_eq(&a.buffer().client().inner, &client.inner))
        {
            return Err(Error::InvalidArgument(format!(
                "argument {:?} belongs to another client",
                a.buffer()
            )));
        }

        let raw_lists: Vec<Vec<*mut ffi::PJRT_Buffer>> = args
            .iter()
            .map(|l| l.iter().map(|a| a.buffer().raw()).collect())
            .collect();
        let raw_list_ptrs: Vec<*const *mut ffi::PJRT_Buffer> =
            raw_lists.iter().map(|l| l.as_ptr()).collect();
        let n_out = self.inner.num_outputs;
        let mut outputs: Vec<Vec<*mut ffi::PJRT_Buffer>> =
            vec![vec![std::ptr::null_mut(); n_out]; num_devices];
        let output_ptrs: Vec<*mut *mut ffi::PJRT_Buffer> =
            outputs.iter_mut().map(|l| l.as_mut_ptr()).collect();
        let mut events: Vec<*mut ffi::PJRT_Event> = vec![std::ptr::null_mut(); num_devices];

        let mut options = ffi::PJRT_ExecuteOptions::new();
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();

        let mut exec = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        exec.executable = self.inner.raw;
        exec.options = &mut options;
        exec.argument_lists = raw_list_ptrs.as_ptr();
        exec.num_devices = num_devices;
        exec.num_args = num_args;
        exec.output_lists = output_ptrs.as_ptr();
        exec.device_complete_events = events.as_mut_ptr();
        // SAFETY: every array outlives the call and has the sizes stated:
        // num_devices lists of num_args live buffers, num_devices output
        // arrays of num_outputs slots, num_devices event slots.
        unsafe {
            pjrt_call!(
                client.plugin_inner(),
                PJRT_LoadedExecutable_Execute,
                &mut exec
            )
        }?;
        // Donated buffers are consumed: their handles are destroyed here.
        drop(args);

        let plugin = client.inner.plugin.inner.clone();
        // SAFETY: on success the plugin filled every slot with a new buffer
        // or event that we own (invariant 2).
        let outputs = outputs
            .into_iter()
            .map(|l| {
                l.into_iter()
                    .map(|b| unsafe { Buffer::from_raw(client.clone(), b) })
                    .collect()
            })
            .collect();
        let events = events
            .into_iter()
            .filter(|e| !e.is_null())
            .map(|e| unsafe { Event::from_raw(plugin.clone(), e) })
            .collect();
        Ok(Execution {
            outputs,
            events,
            _executable: self.clone(),
        })
    }
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
    let format = unsafe { bytes_to_string(program.format, program.format_size) };
    match format.as_str() {
        "hlo" => Some(code),
        "hlo_with_config" => crate::hlo::module_of_module_with_config(&code),
        _ => None,
    }
}
