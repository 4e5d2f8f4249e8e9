//! Loading a plugin, checking its API version and calling its function table.
//!
//! Invariants:
//! 1. A plugin library, once loaded, is never unloaded: XLA plugins register
//!    global state (thread pools, static registries) that `dlclose` would
//!    leave dangling. The cache below keeps one [`Plugin`] per path.
//! 2. `PJRT_Plugin_Initialize` runs exactly once per loaded library, before
//!    any other call.
//! 3. A function-table entry is only read when the plugin's table
//!    (`PJRT_Api.struct_size`) is long enough to contain it.
//! 4. Every `PJRT_Error*` a call returns is converted to [`Error`] and
//!    destroyed exactly once.

use std::collections::HashMap;
use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, ErrorCode, Result};
use crate::ffi;
use crate::value::{read_named_values, NamedValue};

/// The minor API version this crate needs at least: its declarations follow
/// the 0.81 header, and all fields and functions it uses exist there.
pub const MIN_API_MINOR: i32 = ffi::PJRT_API_MINOR;

/// A loaded PJRT plugin. Cheap to clone.
#[derive(Clone)]
pub struct Plugin {
    pub(crate) inner: Arc<PluginInner>,
}

pub(crate) struct PluginInner {
    path: PathBuf,
    api: *const ffi::PJRT_Api,
    version: (i32, i32),
    _lib: libloading::Library,
}

// SAFETY: the PJRT C API is thread-safe by contract (the function table is
// immutable after GetPjrtApi returns and every entry may be called from any
// thread); the library handle is only kept alive, never used after load.
unsafe impl Send for PluginInner {}
// SAFETY: see `Send`.
unsafe impl Sync for PluginInner {}

static LOADED: OnceLock<Mutex<HashMap<PathBuf, Plugin>>> = OnceLock::new();

impl Plugin {
    /// Loads the plugin at `path` (once per process), checks its API version
    /// and initializes it.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin> {
        let path = path.as_ref();
        let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        let mut loaded = LOADED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(p) = loaded.get(&key) {
            return Ok(p.clone());
        }
        let plugin = Self::load_uncached(&key)?;
        loaded.insert(key, plugin.clone());
        Ok(plugin)
    }

    fn load_uncached(path: &Path) -> Result<Plugin> {
        if crate::libtpu::is_libtpu(path) {
            crate::libtpu::prepare();
        }
        // SAFETY: loading a library runs its initializers. A PJRT plugin's
        // initializers only register static state; we trust the path the
        // user named to be a PJRT plugin, and check for its entry point next.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|source| Error::Load {
            path: path.to_path_buf(),
            source,
        })?;
        type GetPjrtApi = unsafe extern "C" fn() -> *const ffi::PJRT_Api;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin
        // (pjrt_c_api.h: `const PJRT_Api* GetPjrtApi();`).
        let get: libloading::Symbol<GetPjrtApi> =
            unsafe { lib.get(b"GetPjrtApi\0") }.map_err(|source| Error::NoEntryPoint {
                path: path.to_path_buf(),
                source,
            })?;
        // SAFETY: calling the entry point has no preconditions.
        let api = unsafe { get() };
        if api.is_null() {
            return Err(Error::NullApi {
                path: path.to_path_buf(),
            });
        }
        // SAFETY: `api` is non-null and points to the plugin's static table,
        // which lives as long as the library; its first fields (struct_size,
        // extension_start, pjrt_api_version) exist in every API version.
        let version = unsafe {
            (
                (*api).pjrt_api_version.major_version,
                (*api).pjrt_api_version.minor_version,
            )
        };
        if version.0 != ffi::PJRT_API_MAJOR || version.1 < MIN_API_MINOR {
            return Err(Error::IncompatibleVersion {
                path: path.to_path_buf(),
                plugin_major: version.0,
                plugin_minor: version.1,
                required_major: ffi::PJRT_API_MAJOR,
                required_minor: MIN_API_MINOR,
            });
        }
        let plugin = Plugin {
            inner: Arc::new(PluginInner {
                path: path.to_path_buf(),
                api,
                version,
                _lib: lib,
            }),
        };
        let mut args = ffi::PJRT_Plugin_Initialize_Args::new();
        // SAFETY: args is a valid, zero-initialized args struct.
        unsafe { pjrt_call!(plugin.inner, PJRT_Plugin_Initialize, &mut args) }?;
        tracing::debug!(path = %path.display(), major = version.0, minor = version.1, "loaded PJRT plugin");
        Ok(plugin)
    }

    /// The file this plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The C API version the plugin implements, `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        self.inner.version
    }

    /// Plugin attributes (`xla_version`, `stablehlo_current_version`, ...).
    pub fn attributes(&self) -> Result<Vec<NamedValue>> {
        let mut args = ffi::PJRT_Plugin_Attributes_Args::new();
        // SAFETY: valid args struct; outputs are written by the plugin.
        unsafe { pjrt_call!(self.inner, PJRT_Plugin_Attributes, &mut args) }?;
        // SAFETY: the plugin returns `num_attributes` named values that live
        // as long as the process.
        Ok(unsafe { read_named_values(args.attributes, args.num_attributes) })
    }

    /// The plugin's raw function table, for code that calls the C API
    /// directly (benchmarks, extensions). Valid for the life of the process.
    pub fn as_raw(&self) -> *const ffi::PJRT_Api {
        self.inner.api
    }

    /// Whether two handles refer to the same loaded library.
    pub fn same_as(&self, other: &Plugin) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("api_version", &self.inner.version)
            .finish()
    }
}

impl PluginInner {
    /// The function-table entry at `offset`, if the plugin's table has it.
    pub(crate) fn entry<F: Copy>(
        &self,
        offset: usize,
        name: &'static str,
        get: impl FnOnce(&ffi::PJRT_Api) -> Option<F>,
    ) -> Result<F> {
        // SAFETY: `api` points to the plugin's static table (invariant 1);
        // struct_size is its first field in every version.
        let table = unsafe { &*self.api };
        if offset + std::mem::size_of::<usize>() > table.struct_size {
            return Err(Error::MissingFunction { function: name });
        }
        get(table).ok_or(Error::MissingFunction { function: name })
    }

    /// Converts a returned `PJRT_Error*` (null = success) into a result,
    /// destroying the error (invariant 4).
    pub(crate) fn check(&self, err: *mut ffi::PJRT_Error, function: &'static str) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        // SAFETY: `err` is a non-null error the plugin just returned to us;
        // we own it and destroy it inside `take_error`.
        let (code, message) = unsafe { self.take_error(err) };
        Err(Error::Pjrt {
            function,
            code,
            message,
        })
    }

    /// Reads code and message of `err`, then destroys it.
    ///
    /// # Safety
    /// `err` must be a live `PJRT_Error*` from this plugin, owned by the
    /// caller; it is invalid afterwards.
    pub(crate) unsafe fn take_error(&self, err: *mut ffi::PJRT_Error) -> (ErrorCode, String) {
        // SAFETY: (table) as in `entry`.
        let table = unsafe { &*self.api };
        let mut msg = ffi::PJRT_Error_Message_Args::new();
        msg.error = err;
        let message = match table.PJRT_Error_Message {
            Some(f) => {
                // SAFETY: `err` is live; the message has the error's lifetime
                // and is copied before the error is destroyed below.
                unsafe {
                    f(&mut msg);
                    bytes_to_string(msg.message, msg.message_size)
                }
            }
            None => String::from("(plugin has no PJRT_Error_Message)"),
        };
        let mut code_args = ffi::PJRT_Error_GetCode_Args::new();
        code_args.error = err;
        let code = match table.PJRT_Error_GetCode {
            // SAFETY: `err` is live. GetCode itself returns an error only for
            // malformed args; we ignore (and must not leak) it.
            Some(f) => unsafe {
                let e2 = f(&mut code_args);
                if e2.is_null() {
                    ErrorCode::from_raw(code_args.code)
                } else {
                    self.destroy_error(e2);
                    ErrorCode::Unknown
                }
            },
            None => ErrorCode::Unknown,
        };
        // SAFETY: `err` is owned by us and not used after this.
        unsafe { self.destroy_error(err) };
        (code, message)
    }

    unsafe fn destroy_error(&self, err: *mut ffi::PJRT_Error) {
        // SAFETY: (table) as in `entry`.
        let table = unsafe { &*self.api };
        if let Some(f) = table.PJRT_Error_Destroy {
            let mut d = ffi::PJRT_Error_Destroy_Args::new();
            d.error = err;
            // SAFETY: the caller owns `err`, destroyed exactly once here.
            unsafe { f(&mut d) };
        }
    }
}

/// Copies `size` bytes at `ptr` into a `String`, replacing invalid UTF-8.
///
/// # Safety
/// `ptr` must be valid for `size` bytes, or null (then `size` is ignored).
pub(crate) unsafe fn bytes_to_string(ptr: *const c_char, size: usize) -> String {
    if ptr.is_null() || size == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), size) };
    String::from_utf8_lossy(bytes).into_owned()
}
