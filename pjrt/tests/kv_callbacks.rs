//! Property: the distributed-runtime callbacks behave as PJRT requires —
//! values come back through the deleter contract, errors keep their status
//! codes, bytes need not be UTF-8, concurrent callers are safe, and a panic
//! in the store never unwinds into C (it is re-raised once C returns).
//!
//! The trampolines are invoked exactly as a plugin invokes them: through
//! their C function pointers, with a `callback_error` that builds the
//! plugin's error object. A fake plugin built from C against the real header
//! then proves the wiring through `PJRT_Client_Create`.

// Calls the C trampolines as a plugin would: in pjrt/, where `unsafe`
// lives.
#![allow(unsafe_code)]

mod common;

use std::collections::HashMap;
use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tessel_pjrt::ffi;
use tessel_pjrt::kv::{self, KvBridge};
use tessel_pjrt::{Client, ClientOptions, Error, ErrorCode, KeyValueStore, KvError, Plugin};

/// In-memory test double with XLA's semantics: put does not overwrite, get
/// blocks until the key appears or the timeout passes.
#[derive(Default)]
struct MemStore {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
}

impl KeyValueStore for MemStore {
    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, KvError> {
        let deadline = Instant::now() + timeout;
        let mut map = self.map.lock().unwrap();
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(KvError::DeadlineExceeded(timeout));
            }
            map = self.changed.wait_timeout(map, deadline - now).unwrap().0;
        }
    }
    fn try_get(&self, key: &[u8]) -> Result<Vec<u8>, KvError> {
        self.map
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .ok_or(KvError::NotFound)
    }
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        let mut map = self.map.lock().unwrap();
        if map.contains_key(key) {
            return Err(KvError::AlreadyExists);
        }
        map.insert(key.to_vec(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }
}

struct PanickingStore;
impl KeyValueStore for PanickingStore {
    fn get(&self, _: &[u8], _: Duration) -> Result<Vec<u8>, KvError> {
        panic!("store exploded in get")
    }
    fn try_get(&self, _: &[u8]) -> Result<Vec<u8>, KvError> {
        panic!("store exploded in try_get")
    }
    fn put(&self, _: &[u8], _: &[u8]) -> Result<(), KvError> {
        panic!("store exploded in put")
    }
}

/// The plugin side of an error: what `callback_error` builds.
#[derive(Debug)]
struct PluginError {
    code: ffi::PJRT_Error_Code,
    message: String,
}

unsafe extern "C" fn make_error(
    code: ffi::PJRT_Error_Code,
    msg: *const c_char,
    len: usize,
) -> *mut ffi::PJRT_Error {
    // SAFETY: the trampolines pass a message valid for `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(msg.cast::<u8>(), len) };
    let e = Box::new(PluginError {
        code,
        message: String::from_utf8_lossy(bytes).into_owned(),
    });
    Box::into_raw(e).cast()
}

fn take_error(e: *mut ffi::PJRT_Error) -> Option<PluginError> {
    // SAFETY: every non-null error came from `make_error`'s Box, taken once.
    (!e.is_null()).then(|| *unsafe { Box::from_raw(e.cast::<PluginError>()) })
}

/// Calls the trampolines like a plugin.
struct FakePlugin {
    bridge: Box<KvBridge>,
    callback_error: ffi::PJRT_CallbackError,
}

impl FakePlugin {
    fn new(store: Arc<dyn KeyValueStore>) -> FakePlugin {
        FakePlugin {
            bridge: KvBridge::new(store),
            callback_error: Some(make_error),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), PluginError> {
        let mut a = ffi::PJRT_KeyValuePutCallback_Args::new();
        a.key = key.as_ptr().cast();
        a.key_size = key.len();
        a.value = value.as_ptr().cast();
        a.value_size = value.len();
        a.callback_error = &mut self.callback_error;
        a.user_arg = self.bridge.user_arg();
        let f = kv::put_callback().unwrap();
        // SAFETY: `a` is a complete args struct whose pointers outlive the call.
        take_error(unsafe { f(&mut a) }).map_or(Ok(()), Err)
    }

    fn get(&mut self, key: &[u8], timeout_ms: i32) -> Result<Vec<u8>, PluginError> {
        let mut a = ffi::PJRT_KeyValueGetCallback_Args::new();
        a.key = key.as_ptr().cast();
        a.key_size = key.len();
        a.timeout_in_ms = timeout_ms;
        a.callback_error = &mut self.callback_error;
        a.user_arg = self.bridge.user_arg();
        let f = kv::get_callback().unwrap();
        // SAFETY: `a` is a complete args struct whose pointers outlive the call.
        if let Some(e) = take_error(unsafe { f(&mut a) }) {
            return Err(e);
        }
        Ok(copy_and_free(
            a.value,
            a.value_size,
            a.value_deleter_callback,
        ))
    }

    fn try_get(&mut self, key: &[u8]) -> Result<Vec<u8>, PluginError> {
        let mut a = ffi::PJRT_KeyValueTryGetCallback_Args::new();
        a.key = key.as_ptr().cast();
        a.key_size = key.len();
        a.callback_error = &mut self.callback_error;
        a.user_arg = self.bridge.user_arg();
        let f = kv::try_get_callback().unwrap();
        // SAFETY: `a` is a complete args struct whose pointers outlive the call.
        if let Some(e) = take_error(unsafe { f(&mut a) }) {
            return Err(e);
        }
        Ok(copy_and_free(
            a.value,
            a.value_size,
            a.value_deleter_callback,
        ))
    }
}

/// What a plugin does with a returned value: copy it, then call the deleter.
fn copy_and_free(
    value: *mut c_char,
    size: usize,
    deleter: ffi::PJRT_KeyValueGetCallback_ValueDeleter,
) -> Vec<u8> {
    assert!(
        !value.is_null(),
        "a value pointer is returned even for empty values"
    );
    // SAFETY: the callback returned `value` valid for `size` bytes until its deleter runs.
    let v = unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec();
    // SAFETY: the value is deleted once, with the deleter returned beside it.
    unsafe { deleter.expect("value deleter")(value) };
    v
}

fn mem_plugin() -> FakePlugin {
    FakePlugin::new(Arc::new(MemStore::default()))
}

#[test]
fn put_then_get_returns_the_value_through_the_deleter() {
    let mut p = mem_plugin();
    p.put(b"k", b"value").unwrap();
    assert_eq!(p.get(b"k", 100).unwrap(), b"value");
    assert_eq!(p.try_get(b"k").unwrap(), b"value");
}

#[test]
fn keys_and_values_are_bytes_not_strings() {
    let mut p = mem_plugin();
    let key = [0xffu8, 0x00, 0xfe, b'/', 0x80];
    let value: Vec<u8> = (0..=255u8).collect();
    p.put(&key, &value).unwrap();
    assert_eq!(p.get(&key, 100).unwrap(), value);
}

#[test]
fn empty_keys_and_values_are_allowed() {
    let mut p = mem_plugin();
    p.put(b"", b"").unwrap();
    assert_eq!(p.get(b"", 10).unwrap(), b"");
}

#[test]
fn missing_key_is_not_found_at_once() {
    let mut p = mem_plugin();
    let e = p.try_get(b"absent").unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound.to_raw());
    assert!(e.message.contains("not found"), "{}", e.message);
}

#[test]
fn blocking_get_times_out_with_deadline_exceeded() {
    let mut p = mem_plugin();
    let start = Instant::now();
    let e = p.get(b"absent", 50).unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::DeadlineExceeded.to_raw(),
        "{}",
        e.message
    );
    assert!(
        start.elapsed() >= Duration::from_millis(50),
        "returned before its deadline"
    );
}

#[test]
fn blocking_get_is_woken_by_a_later_put() {
    let store = Arc::new(MemStore::default());
    let writer = store.clone();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        writer.put(b"late", b"here").unwrap();
    });
    let mut p = FakePlugin::new(store);
    assert_eq!(p.get(b"late", 10_000).unwrap(), b"here");
    t.join().unwrap();
}

#[test]
fn a_second_put_is_already_exists() {
    let mut p = mem_plugin();
    p.put(b"once", b"1").unwrap();
    let e = p.put(b"once", b"2").unwrap_err();
    assert_eq!(e.code, ErrorCode::AlreadyExists.to_raw());
    assert_eq!(p.get(b"once", 10).unwrap(), b"1", "the first value is kept");
}

#[test]
fn every_store_error_keeps_its_code() {
    struct Failing(KvError);
    impl KeyValueStore for Failing {
        fn get(&self, _: &[u8], _: Duration) -> Result<Vec<u8>, KvError> {
            Err(self.0.clone())
        }
        fn try_get(&self, _: &[u8]) -> Result<Vec<u8>, KvError> {
            Err(self.0.clone())
        }
        fn put(&self, _: &[u8], _: &[u8]) -> Result<(), KvError> {
            Err(self.0.clone())
        }
    }
    let cases = [
        (KvError::NotFound, ffi::PJRT_Error_Code_NOT_FOUND),
        (
            KvError::DeadlineExceeded(Duration::from_secs(1)),
            ffi::PJRT_Error_Code_DEADLINE_EXCEEDED,
        ),
        (KvError::AlreadyExists, ffi::PJRT_Error_Code_ALREADY_EXISTS),
        (
            KvError::InvalidArgument("x".into()),
            ffi::PJRT_Error_Code_INVALID_ARGUMENT,
        ),
        (
            KvError::Unavailable("no leader".into()),
            ffi::PJRT_Error_Code_UNAVAILABLE,
        ),
        (KvError::Internal("x".into()), ffi::PJRT_Error_Code_INTERNAL),
    ];
    for (err, code) in cases {
        let mut p = FakePlugin::new(Arc::new(Failing(err.clone())));
        assert_eq!(p.get(b"k", 1).unwrap_err().code, code, "{err}");
        assert_eq!(p.try_get(b"k").unwrap_err().code, code, "{err}");
        let put = p.put(b"k", b"v").unwrap_err();
        assert_eq!(put.code, code, "{err}");
        assert_eq!(put.message, err.to_string());
    }
}

#[test]
fn a_panicking_store_becomes_an_internal_error_and_the_panic_is_kept() {
    let mut p = FakePlugin::new(Arc::new(PanickingStore));
    let e = p.put(b"k", b"v").unwrap_err();
    assert_eq!(e.code, ErrorCode::Internal.to_raw());
    assert!(e.message.contains("store exploded in put"), "{}", e.message);
    // Later panics do not replace the first payload.
    assert!(p.get(b"k", 1).is_err());
    assert!(p.try_get(b"k").is_err());
    let payload = p.bridge.take_panic().expect("payload kept for re-raising");
    assert_eq!(
        *payload.downcast::<&str>().unwrap(),
        "store exploded in put"
    );
    assert!(p.bridge.take_panic().is_none());
}

#[test]
fn a_null_user_arg_is_an_invalid_argument() {
    let mut cb: ffi::PJRT_CallbackError = Some(make_error);
    let mut a = ffi::PJRT_KeyValuePutCallback_Args::new();
    a.callback_error = &mut cb;
    a.user_arg = ptr::null_mut();
    // SAFETY: a complete args struct (the null user_arg is what is tested).
    let e = take_error(unsafe { kv::put_callback().unwrap()(&mut a) }).unwrap();
    assert_eq!(e.code, ffi::PJRT_Error_Code_INVALID_ARGUMENT);
    // A non-empty key behind a null pointer is refused too, not read.
    let mut p = mem_plugin();
    let mut a = ffi::PJRT_KeyValueTryGetCallback_Args::new();
    a.key_size = 4;
    a.callback_error = &mut cb;
    a.user_arg = p.bridge.user_arg();
    // SAFETY: a complete args struct (the null key is what is tested).
    let e = take_error(unsafe { kv::try_get_callback().unwrap()(&mut a) }).unwrap();
    assert_eq!(e.code, ffi::PJRT_Error_Code_INVALID_ARGUMENT);
    p.put(b"still", b"works").unwrap();
}

#[test]
fn concurrent_callers_see_consistent_values() {
    let store: Arc<dyn KeyValueStore> = Arc::new(MemStore::default());
    let bridge = KvBridge::new(store);
    let user_arg = bridge.user_arg() as usize;
    std::thread::scope(|s| {
        for t in 0..8u32 {
            s.spawn(move || {
                let mut p = FakePluginRef {
                    user_arg,
                    cb: Some(make_error),
                };
                for i in 0..500u32 {
                    let key = format!("{t}/{i}").into_bytes();
                    let value = (t * 1_000_000 + i).to_le_bytes();
                    p.put(&key, &value);
                    // Read our own key and another thread's (possibly not yet written).
                    assert_eq!(p.get(&key), value);
                    let other = format!("{}/{i}", (t + 1) % 8).into_bytes();
                    let _ = p.try_get(&other);
                }
            });
        }
    });
    assert!(bridge.take_panic().is_none());
}

/// A thread's view of a shared bridge (the bridge outlives the scope).
struct FakePluginRef {
    user_arg: usize,
    cb: ffi::PJRT_CallbackError,
}

impl FakePluginRef {
    fn put(&mut self, key: &[u8], value: &[u8]) {
        let mut a = ffi::PJRT_KeyValuePutCallback_Args::new();
        a.key = key.as_ptr().cast();
        a.key_size = key.len();
        a.value = value.as_ptr().cast();
        a.value_size = value.len();
        a.callback_error = &mut self.cb;
        a.user_arg = self.user_arg as *mut _;
        // SAFETY: `a` is a complete args struct whose pointers outlive the call.
        assert!(take_error(unsafe { kv::put_callback().unwrap()(&mut a) }).is_none());
    }
    fn get(&mut self, key: &[u8]) -> Vec<u8> {
        let mut a = ffi::PJRT_KeyValueGetCallback_Args::new();
        a.key = key.as_ptr().cast();
        a.key_size = key.len();
        a.timeout_in_ms = 1000;
        a.callback_error = &mut self.cb;
        a.user_arg = self.user_arg as *mut _;
        // SAFETY: `a` is a complete args struct whose pointers outlive the call.
        assert!(take_error(unsafe { kv::get_callback().unwrap()(&mut a) }).is_none());
        copy_and_free(a.value, a.value_size, a.value_deleter_callback)
    }
    fn try_get(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let mut a = ffi::PJRT_KeyValueTryGetCallback_Args::new();
        a.key = key.as_ptr().cast();
        a.key_size = key.len();
        a.callback_error = &mut self.cb;
        a.user_arg = self.user_arg as *mut _;
        // SAFETY: `a` is a complete args struct whose pointers outlive the call.
        match take_error(unsafe { kv::try_get_callback().unwrap()(&mut a) }) {
            None => Some(copy_and_free(
                a.value,
                a.value_size,
                a.value_deleter_callback,
            )),
            Some(e) => {
                assert_eq!(e.code, ffi::PJRT_Error_Code_NOT_FOUND);
                None
            }
        }
    }
}

// ---- Through PJRT_Client_Create of a plugin built from C -----------------

fn fake_plugin() -> Plugin {
    use std::sync::OnceLock;
    // In the build's own scratch folder: a temporary folder held by a
    // static is never dropped, so it was left in /tmp on every run.
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    let so = PATH.get_or_init(|| {
        let so = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kv_plugin.so");
        let src =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kv_plugin.c");
        common::cc(&src, &so, true);
        so
    });
    Plugin::load(so).unwrap()
}

#[test]
fn a_plugin_exchanges_through_our_store_during_client_creation() {
    let store = Arc::new(MemStore::default());
    let client = Client::create(
        &fake_plugin(),
        ClientOptions::default().kv_store(store.clone()),
    )
    .unwrap();
    assert!(client.has_kv_store());
    assert_eq!(
        store.try_get(b"fake/node\x80").unwrap(),
        vec![0xff, 0x00, b'v']
    );
    // The client holds the store until it is destroyed.
    assert_eq!(Arc::strong_count(&store), 2);
    drop(client);
    assert_eq!(
        Arc::strong_count(&store),
        1,
        "the store is released with the client"
    );
}

#[test]
fn a_store_error_fails_client_creation_with_its_code() {
    struct Down;
    impl KeyValueStore for Down {
        fn get(&self, _: &[u8], _: Duration) -> Result<Vec<u8>, KvError> {
            Err(KvError::Unavailable("coordinator down".into()))
        }
        fn try_get(&self, _: &[u8]) -> Result<Vec<u8>, KvError> {
            Err(KvError::Unavailable("coordinator down".into()))
        }
        fn put(&self, _: &[u8], _: &[u8]) -> Result<(), KvError> {
            Err(KvError::Unavailable("coordinator down".into()))
        }
    }
    let e = Client::create(
        &fake_plugin(),
        ClientOptions::default().kv_store(Arc::new(Down)),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Pjrt {
                code: ErrorCode::Unavailable,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("coordinator down"));
}

#[test]
fn a_store_panic_during_client_creation_is_re_raised_after_c_returns() {
    let plugin = fake_plugin();
    let r = catch_unwind(AssertUnwindSafe(|| {
        Client::create(
            &plugin,
            ClientOptions::default().kv_store(Arc::new(PanickingStore)),
        )
    }));
    let payload = r.expect_err("the panic reaches the Rust caller");
    assert_eq!(
        *payload.downcast::<&str>().unwrap(),
        "store exploded in put"
    );
}

#[test]
fn without_a_store_the_plugin_sees_no_callbacks() {
    let e = Client::create(&fake_plugin(), ClientOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Pjrt {
                code: ErrorCode::FailedPrecondition,
                ..
            }
        ),
        "{e:?}"
    );
}

// ---- Bounded client creation (a plugin waiting for a peer) --------------

#[test]
fn a_plugin_waiting_for_a_key_nobody_writes_gets_deadline_exceeded_at_the_wait_limit() {
    let store = Arc::new(MemStore::default());
    let started = Instant::now();
    let e = Client::create(
        &fake_plugin(),
        ClientOptions::default()
            .option("wait_key", "peer/1/topology")
            .kv_store(store)
            .kv_wait_limit(Duration::from_millis(300)),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Pjrt {
                code: ErrorCode::DeadlineExceeded,
                ..
            }
        ),
        "{e:?}"
    );
    // The plugin asked for a day; the limit held.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn client_creation_past_its_limit_names_the_key_the_plugin_waits_for() {
    let store = Arc::new(MemStore::default());
    let started = Instant::now();
    let e = Client::create_within(
        &fake_plugin(),
        ClientOptions::default()
            .option("wait_key", "peer/1/topology")
            .kv_store(store.clone()),
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    match &e {
        Error::CreateTimedOut { waiting, .. } => assert_eq!(waiting, &["peer/1/topology"]),
        other => panic!("{other:?}"),
    }
    assert_eq!(e.code(), ErrorCode::DeadlineExceeded);
    assert!(
        e.to_string()
            .contains("`peer/1/topology`, which no process has written"),
        "{e}"
    );
    // The abandoned thread finishes once the key appears: its client is
    // destroyed there, releasing the store.
    store.put(b"peer/1/topology", b"late").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Arc::strong_count(&store) > 1 {
        assert!(
            Instant::now() < deadline,
            "the abandoned creation never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_plugin_busy_elsewhere_times_out_saying_it_waited_for_no_key() {
    let e = Client::create_within(
        &fake_plugin(),
        ClientOptions::default()
            .option("sleep_ms", 1500i64)
            .kv_store(Arc::new(MemStore::default())),
        Duration::from_millis(200),
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::CreateTimedOut { waiting, .. } if waiting.is_empty()),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("not waiting for a key-value key"),
        "{e}"
    );
    // Within the limit it is an ordinary creation.
    let client = Client::create_within(
        &fake_plugin(),
        ClientOptions::default().kv_store(Arc::new(MemStore::default())),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(client.has_kv_store());
}
