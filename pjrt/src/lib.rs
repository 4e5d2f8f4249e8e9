//! Safe Rust over the PJRT C API, the plugin interface of OpenXLA.
//!
//! A [`Plugin`] is a shared library (the CPU plugin from the `xla-cpu-pjrt`
//! wheel, the CUDA plugin from `jax-cuda13-pjrt`, ...) loaded at run time.
//! From it a [`Client`] is created, optionally wired to a distributed
//! [`KeyValueStore`]; the client compiles StableHLO into a
//! [`LoadedExecutable`], moves host data into device [`Buffer`]s, executes,
//! and brings results back. Completion is reported by [`Event`]s, which are
//! futures.
//!
//! ```no_run
//! use tessel_pjrt::{Client, ClientOptions, CompileOptions, HostBuffer, Plugin, Program};
//! # fn main() -> tessel_pjrt::Result<()> {
//! let plugin = Plugin::load(tessel_pjrt::locate::resolve(Some("cpu"))?)?;
//! let client = Client::create(&plugin, ClientOptions::default())?;
//! let program = Program::mlir_text(
//!     "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
//!        %0 = stablehlo.add %a, %a : tensor<2xf32>
//!        return %0 : tensor<2xf32>
//!      }",
//! );
//! let exe = client.compile(&program, &CompileOptions::new(1, 1))?;
//! let device = client.addressable_devices()?.remove(0);
//! let x = client.buffer_from_host(&HostBuffer::from_slice(&[1.0f32, 2.0], &[2])?, &device)?;
//! let out = exe.execute(&[&[&x]])?.wait()?;
//! assert_eq!(out[0][0].to_host_blocking()?.to_vec::<f32>()?, vec![2.0, 4.0]);
//! # Ok(()) }
//! ```
//!
//! tessel's FFI `unsafe` code lives in this crate (the only other `unsafe`
//! is the transfer crate's shared-memory and host-memory modules). [`ffi`]
//! holds the raw declarations; every other module is a safe wrapper whose
//! `unsafe` blocks carry a `SAFETY:` comment.
//!
//! # The modules in detail
//!
//! * **`tessel-pjrt`** (`pjrt/`).
//!   * `ffi` — raw declarations of the C API structs we use, the function
//!     table (`PJRT_Api`) in header order, and a layout table (`LAYOUTS`) that
//!     `tests/abi.rs` compares field by field with the header of the installed
//!     wheel. Declarations follow API 0.81; newer plugins accept our smaller
//!     `struct_size`s.
//!   * `plugin` — `Plugin::load`: dlopen, `GetPjrtApi`, version check (major 0,
//!     minor ≥ 0.81), `PJRT_Plugin_Initialize` once. Every C call goes through
//!     `pjrt_call!`, which checks that the plugin's function table reaches the
//!     entry and turns a returned `PJRT_Error*` into `Error::Pjrt {function,
//!     code, message}`, destroying it.
//!   * `client` — `Client` (Arc), create options as named values, the KV
//!     bridge, devices, memories, compile, host→device.
//!   * `kv` — `KeyValueStore` trait and the three `extern "C"` trampolines.
//!   * `device`, `buffer`, `executable`, `event` — owning handles; `Event`
//!     implements `IntoFuture`. Each execution gets a process-unique launch id:
//!     plugins key a collective's rendezvous on it.
//!   * `compile`, `hlo` — the protobuf messages we send (CompileOptionsProto
//!     subset) and read (HloModuleProto subset), declared with prost derive.
//!   * `locate` — plugin resolution by name or path.

// The crate of tessel's FFI: every `unsafe` block of the workspace but
// the shared-memory code lives here, each with its SAFETY comment.
#![allow(unsafe_code)]

/// Calls a PJRT function by its table name, checking that the plugin's table
/// has it and converting the returned error.
///
/// Must be used inside `unsafe`: the caller guarantees that every pointer in
/// the args struct is valid for the call.
macro_rules! pjrt_call {
    ($plugin:expr, $name:ident, $args:expr) => {{
        let plugin: &$crate::plugin::PluginInner = &$plugin;
        match plugin.entry(
            ::core::mem::offset_of!($crate::ffi::PJRT_Api, $name),
            stringify!($name),
            |t| t.$name,
        ) {
            Ok(f) => {
                let err = f($args);
                plugin.check(err, stringify!($name))
            }
            Err(e) => Err(e),
        }
    }};
}

mod buffer;
mod client;
mod compile;
mod device;
mod error;
mod event;
mod executable;
pub mod ffi;
pub mod hlo;
pub mod kv;
pub mod libtpu;
pub mod locate;
mod plugin;
mod value;

pub use buffer::{Buffer, ElementType, HostBuffer, NativeType, ToHostFuture};
pub use client::{Client, ClientOptions};
pub use compile::{CompileOptions, OptionOverride, Program, ProgramFormat};
pub use device::{Device, Memory};
pub use error::{Error, ErrorCode, Result};
pub use event::{Event, EventFuture};
pub use executable::{ExecuteArg, Execution, LoadedExecutable};
pub use hlo::ParameterShape;
pub use kv::{KeyValueStore, KvError};
pub use plugin::{Plugin, MIN_API_MINOR};
pub use value::{NamedValue, Value};
