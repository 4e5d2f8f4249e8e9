//! The distributed-runtime key-value callbacks of `PJRT_Client_Create`.
//!
//! Multi-node plugins (CUDA with `num_nodes` > 1, TPU) exchange topology and
//! NCCL ids through a key-value store that the caller provides as three C
//! callbacks. This module bridges them to the [`KeyValueStore`] trait.
//!
//! Invariants:
//! 1. No panic crosses the FFI boundary: each trampoline runs the store in
//!    `catch_unwind`, returns `INTERNAL`, and keeps the payload in the
//!    [`KvBridge`] for the Rust caller to re-raise (git2-rs's model).
//! 2. Errors keep their meaning: [`KvError::NotFound`] becomes `NOT_FOUND`,
//!    `DeadlineExceeded` becomes `DEADLINE_EXCEEDED`, and so on.
//! 3. Keys and values are bytes; nothing assumes UTF-8.
//! 4. A value handed to the plugin is allocated here with a length header and
//!    freed only by [`free_value`], which the plugin calls exactly once.
//! 5. `user_arg` points to a [`KvBridge`] that outlives every call: the
//!    [`crate::Client`] owns the bridge and destroys the PJRT client first.
//!
//! # The KV callback bridge
//!
//! `ClientOptions::kv_store(store)` boxes a `KvBridge` (the store and a panic
//! slot) whose address is the `user_arg` of all three callbacks. The
//! trampolines:
//!
//! | callback | store call | errors → PJRT code |
//! |---|---|---|
//! | `kv_get(key, timeout_in_ms)` | `get(key, timeout)` (blocks) | `DeadlineExceeded` → `DEADLINE_EXCEEDED` |
//! | `kv_try_get(key)` | `try_get(key)` | `NotFound` → `NOT_FOUND` |
//! | `kv_put(key, value)` | `put(key, value)` | `AlreadyExists` → `ALREADY_EXISTS` |
//!
//! `InvalidArgument`, `Unavailable` and `Internal` map to their codes. Keys and
//! values are bytes. Returned values are allocated with a 16-byte length header
//! and freed by our `value_deleter_callback`. A store that panics yields
//! `INTERNAL` to the plugin; the payload is kept and `Client::create`
//! re-raises it after the plugin returns (git2-rs's model).

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::ErrorCode;
use crate::ffi;

/// What a key-value operation can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// No value at the key (yet).
    #[error("key not found")]
    NotFound,
    /// A wait ran past its deadline.
    #[error("deadline exceeded after {0:?}")]
    DeadlineExceeded(Duration),
    /// The key is already set.
    #[error("key already exists")]
    AlreadyExists,
    /// The request breaks a rule.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The store cannot answer now.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Anything else.
    #[error("internal error: {0}")]
    Internal(String),
}

impl KvError {
    /// The PJRT status code this error is reported with.
    pub fn code(&self) -> ErrorCode {
        match self {
            KvError::NotFound => ErrorCode::NotFound,
            KvError::DeadlineExceeded(_) => ErrorCode::DeadlineExceeded,
            KvError::AlreadyExists => ErrorCode::AlreadyExists,
            KvError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            KvError::Unavailable(_) => ErrorCode::Unavailable,
            KvError::Internal(_) => ErrorCode::Internal,
        }
    }
}

/// The store behind a client's distributed-runtime callbacks. Called from
/// plugin threads, possibly concurrently; calls may block.
pub trait KeyValueStore: Send + Sync + 'static {
    /// Blocks until `key` exists or `timeout` passes
    /// ([`KvError::DeadlineExceeded`]).
    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, KvError>;
    /// Returns the value at once, or [`KvError::NotFound`].
    fn try_get(&self, key: &[u8]) -> Result<Vec<u8>, KvError>;
    /// Stores `value`. XLA's coordination service refuses to overwrite
    /// ([`KvError::AlreadyExists`]); a store may choose either.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError>;
}

/// The keys a plugin is blocked on right now: what a caller that gives up
/// waiting for the plugin reports.
#[derive(Debug, Default)]
pub struct Waits {
    next: AtomicU64,
    keys: Mutex<BTreeMap<u64, Vec<u8>>>,
}

impl Waits {
    fn enter(&self, key: &[u8]) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, key.to_vec());
        id
    }

    fn leave(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Vec<u8>>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The keys waited for now, in the order the waits began (bytes shown
    /// as text where they are UTF-8, escaped where not).
    pub fn keys(&self) -> Vec<String> {
        self.lock()
            .values()
            .map(|k| k.escape_ascii().to_string())
            .collect()
    }
}

/// The `user_arg` behind the three callbacks: the store, the first panic
/// caught while calling it, the keys being waited for, and the longest wait
/// allowed.
pub struct KvBridge {
    store: Arc<dyn KeyValueStore>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    waits: Arc<Waits>,
    cap: Option<Duration>,
}

impl KvBridge {
    /// A bridge on the heap, so that its address is stable (invariant 5).
    pub fn new(store: Arc<dyn KeyValueStore>) -> Box<KvBridge> {
        Self::with(store, Arc::default(), None)
    }

    /// A bridge that records its blocked gets in `waits` and lets no get
    /// wait longer than `cap`, whatever timeout the plugin asks for (XLA's
    /// GPU client asks for up to a day).
    pub fn with(
        store: Arc<dyn KeyValueStore>,
        waits: Arc<Waits>,
        cap: Option<Duration>,
    ) -> Box<KvBridge> {
        Box::new(KvBridge {
            store,
            panic: Mutex::new(None),
            waits,
            cap,
        })
    }

    /// A blocking get, capped and recorded.
    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, KvError> {
        let timeout = self.cap.map_or(timeout, |c| timeout.min(c));
        let id = self.waits.enter(key);
        let r = self.run(|s| s.get(key, timeout));
        self.waits.leave(id);
        r
    }

    /// The `user_arg` to give the plugin with [`get_callback`] and friends.
    pub fn user_arg(&self) -> *mut c_void {
        (self as *const KvBridge).cast_mut().cast()
    }

    /// The panic payload of the first store call that panicked, if any.
    pub fn take_panic(&self) -> Option<Box<dyn Any + Send>> {
        self.panic.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// Runs `f` against the store, turning a panic into `Internal` and
    /// keeping the payload (invariant 1).
    fn run<T>(
        &self,
        f: impl FnOnce(&dyn KeyValueStore) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        match catch_unwind(AssertUnwindSafe(|| f(&*self.store))) {
            Ok(r) => r,
            Err(payload) => {
                let msg = panic_message(&*payload);
                let mut slot = self.panic.lock().unwrap_or_else(|p| p.into_inner());
                if slot.is_none() {
                    *slot = Some(payload);
                }
                Err(KvError::Internal(format!(
                    "key-value store panicked: {msg}"
                )))
            }
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

/// `PJRT_KeyValueGetCallback`.
pub fn get_callback() -> ffi::PJRT_KeyValueGetCallback {
    Some(kv_get)
}
/// `PJRT_KeyValueTryGetCallback`.
pub fn try_get_callback() -> ffi::PJRT_KeyValueTryGetCallback {
    Some(kv_try_get)
}
/// `PJRT_KeyValuePutCallback`.
pub fn put_callback() -> ffi::PJRT_KeyValuePutCallback {
    Some(kv_put)
}

/// Header in front of every value we hand out: its length, padded so the
/// payload stays 16-byte aligned.
const HEADER: usize = 16;

fn value_layout(len: usize) -> Option<Layout> {
    Layout::from_size_align(HEADER.checked_add(len)?, 16).ok()
}

/// Copies `value` into memory the plugin releases with [`free_value`].
fn alloc_value(value: &[u8]) -> Result<*mut c_char, KvError> {
    let layout = value_layout(value.len()).ok_or_else(|| {
        KvError::Internal(format!(
            "a value of {} bytes cannot be returned",
            value.len()
        ))
    })?;
    // SAFETY: the layout has a non-zero size (at least HEADER).
    let base = unsafe { alloc(layout) };
    if base.is_null() {
        handle_alloc_error(layout);
    }
    // SAFETY: `base` has HEADER + len bytes, 16-aligned; we write the length
    // in the first 8 and the value after the header.
    unsafe {
        base.cast::<usize>().write(value.len());
        ptr::copy_nonoverlapping(value.as_ptr(), base.add(HEADER), value.len());
        Ok(base.add(HEADER).cast())
    }
}

/// The value deleter given to the plugin (invariant 4).
///
/// # Safety
/// `value` must be null or a pointer returned by one of our callbacks and
/// not yet freed.
pub unsafe extern "C" fn free_value(value: *mut c_char) {
    if value.is_null() {
        return;
    }
    // SAFETY: `value` came from `alloc_value`, so HEADER bytes before it is
    // the allocation's start, holding the length.
    unsafe {
        let base = value.cast::<u8>().sub(HEADER);
        let len = base.cast::<usize>().read();
        // The layout was valid when the value was allocated.
        if let Some(layout) = value_layout(len) {
            dealloc(base, layout);
        }
    }
}

/// Builds the error the plugin expects through its `callback_error`.
///
/// # Safety
/// `callback_error` must be null or point to the plugin's error constructor.
unsafe fn plugin_error(
    callback_error: *mut ffi::PJRT_CallbackError,
    err: &KvError,
) -> *mut ffi::PJRT_Error {
    let ctor = if callback_error.is_null() {
        None
    } else {
        // SAFETY: non-null, so the plugin's constructor (the caller's
        // contract).
        unsafe { *callback_error }
    };
    match ctor {
        Some(f) => {
            let msg = err.to_string();
            // SAFETY: the constructor copies `msg` during the call.
            unsafe { f(err.code().to_raw(), msg.as_ptr().cast(), msg.len()) }
        }
        None => {
            tracing::error!("PJRT plugin gave no callback_error; cannot report: {err}");
            ptr::null_mut()
        }
    }
}

/// Borrows `len` bytes at `ptr`; null with len 0 is the empty slice.
///
/// # Safety
/// `ptr` must be valid for `len` bytes for `'a`, or null.
unsafe fn bytes<'a>(ptr: *const c_char, len: usize) -> Result<&'a [u8], KvError> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(KvError::InvalidArgument(format!(
            "null pointer with size {len}"
        )));
    }
    // SAFETY: guaranteed by the caller.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// # Safety
/// `user_arg` must be null or point to a live [`KvBridge`].
unsafe fn bridge<'a>(user_arg: *mut c_void) -> Result<&'a KvBridge, KvError> {
    if user_arg.is_null() {
        return Err(KvError::InvalidArgument("null user_arg".into()));
    }
    // SAFETY: guaranteed by the caller (invariant 5).
    Ok(unsafe { &*user_arg.cast::<KvBridge>() })
}

/// Hands a looked-up value to the plugin through the out-fields of a get
/// args struct (value, size, deleter), or returns the plugin's error.
///
/// # Safety
/// `callback_error` must be null or the plugin's error constructor.
unsafe fn return_value(
    result: Result<Vec<u8>, KvError>,
    value: &mut *mut c_char,
    value_size: &mut usize,
    deleter: &mut ffi::PJRT_KeyValueGetCallback_ValueDeleter,
    callback_error: *mut ffi::PJRT_CallbackError,
) -> *mut ffi::PJRT_Error {
    match result.and_then(|v| alloc_value(&v).map(|p| (p, v.len()))) {
        Ok((p, len)) => {
            *value = p;
            *value_size = len;
            *deleter = Some(free_value);
            ptr::null_mut()
        }
        // SAFETY: guaranteed by the caller.
        Err(e) => unsafe { plugin_error(callback_error, &e) },
    }
}

/// `kv_get`: blocking get with the plugin's timeout.
///
/// # Safety
/// Called by a plugin with a valid args struct whose `user_arg` is a live
/// [`KvBridge`].
pub unsafe extern "C" fn kv_get(
    args: *mut ffi::PJRT_KeyValueGetCallback_Args,
) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes a valid, exclusive args struct for the call.
    let Some(args) = (unsafe { args.as_mut() }) else {
        return ptr::null_mut();
    };
    let timeout = Duration::from_millis(args.timeout_in_ms.max(0) as u64);
    // SAFETY: key is valid for key_size bytes for the call.
    let result = unsafe { bytes(args.key, args.key_size) }.and_then(|key| {
        // SAFETY: user_arg is the bridge we registered with the client.
        unsafe { bridge(args.user_arg) }.and_then(|b| b.get(key, timeout))
    });
    // SAFETY: the out-fields belong to the args struct; callback_error
    // comes from the plugin.
    unsafe {
        return_value(
            result,
            &mut args.value,
            &mut args.value_size,
            &mut args.value_deleter_callback,
            args.callback_error,
        )
    }
}

/// `kv_try_get`: NotFound at once when the key is absent.
///
/// # Safety
/// As [`kv_get`].
pub unsafe extern "C" fn kv_try_get(
    args: *mut ffi::PJRT_KeyValueTryGetCallback_Args,
) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes a valid, exclusive args struct for the call.
    let Some(args) = (unsafe { args.as_mut() }) else {
        return ptr::null_mut();
    };
    // SAFETY: key is valid for key_size bytes; user_arg is our bridge.
    let result = unsafe { bytes(args.key, args.key_size) }
        .and_then(|key| unsafe { bridge(args.user_arg) }.and_then(|b| b.run(|s| s.try_get(key))));
    // SAFETY: the out-fields belong to the args struct; callback_error
    // comes from the plugin.
    unsafe {
        return_value(
            result,
            &mut args.value,
            &mut args.value_size,
            &mut args.value_deleter_callback,
            args.callback_error,
        )
    }
}

/// `kv_put`.
///
/// # Safety
/// As [`kv_get`].
pub unsafe extern "C" fn kv_put(
    args: *mut ffi::PJRT_KeyValuePutCallback_Args,
) -> *mut ffi::PJRT_Error {
    // SAFETY: the plugin passes a valid args struct for the call.
    let Some(args) = (unsafe { args.as_ref() }) else {
        return ptr::null_mut();
    };
    // SAFETY: key is valid for key_size bytes for the call.
    let result = unsafe { bytes(args.key, args.key_size) }.and_then(|key| {
        // SAFETY: value is valid for value_size bytes for the call.
        unsafe { bytes(args.value, args.value_size) }.and_then(|value| {
            // SAFETY: user_arg is the bridge we registered with the client.
            unsafe { bridge(args.user_arg) }.and_then(|b| b.run(|s| s.put(key, value)))
        })
    });
    match result {
        Ok(()) => ptr::null_mut(),
        // SAFETY: callback_error comes from the plugin.
        Err(e) => unsafe { plugin_error(args.callback_error, &e) },
    }
}
