//! Creates a client wired to an in-memory, recording key-value store and
//! reports what the plugin did with it: which keys it wrote and read, then
//! the devices and a small computation. With the CUDA plugin and
//! `--nodes 1 --node-id 0` this shows the plugin's distributed-runtime
//! exchange going through our callbacks.
//!
//!     cargo run --release -p tessel-pjrt --example kv_probe -- --plugin cuda --nodes 1 --node-id 0
//!
//! `scripts/gpu-check` builds this here and runs it on a GPU machine.
//! The store is an in-memory test double (XLA's semantics: put refuses to
//! overwrite, get blocks until the key appears); it lives only in this probe.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tessel_pjrt::{Client, ClientOptions, CompileOptions, KeyValueStore, KvError, Plugin, Program};

#[derive(Default)]
struct RecordingStore {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
    log: Mutex<Vec<String>>,
}

impl RecordingStore {
    fn note(&self, op: &str, key: &[u8], detail: String) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{op:<7} {} {detail}", String::from_utf8_lossy(key)));
    }
}

impl KeyValueStore for RecordingStore {
    fn get(&self, key: &[u8], timeout: Duration) -> Result<Vec<u8>, KvError> {
        let deadline = Instant::now() + timeout;
        let mut map = self.map.lock().unwrap();
        loop {
            if let Some(v) = map.get(key) {
                let v = v.clone();
                drop(map);
                self.note("get", key, format!("-> {} bytes", v.len()));
                return Ok(v);
            }
            let now = Instant::now();
            if now >= deadline {
                drop(map);
                self.note(
                    "get",
                    key,
                    format!("-> deadline exceeded after {timeout:?}"),
                );
                return Err(KvError::DeadlineExceeded(timeout));
            }
            map = self.changed.wait_timeout(map, deadline - now).unwrap().0;
        }
    }

    fn try_get(&self, key: &[u8]) -> Result<Vec<u8>, KvError> {
        let r = self
            .map
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .ok_or(KvError::NotFound);
        self.note("try_get", key, format!("-> {:?}", r.as_ref().map(Vec::len)));
        r
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), KvError> {
        let mut map = self.map.lock().unwrap();
        if map.contains_key(key) {
            drop(map);
            self.note("put", key, "-> already exists".into());
            return Err(KvError::AlreadyExists);
        }
        map.insert(key.to_vec(), value.to_vec());
        self.changed.notify_all();
        drop(map);
        self.note("put", key, format!("{} bytes", value.len()));
        Ok(())
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let spec = arg(&args, "--plugin");
    let path = tessel_pjrt::locate::resolve(spec.as_deref())?;
    let plugin = Plugin::load(&path)?;
    println!(
        "plugin {} (C API {:?})",
        path.display(),
        plugin.api_version()
    );
    let store = Arc::new(RecordingStore::default());
    let mut options = ClientOptions::default().kv_store(store.clone());
    if let Some(n) = arg(&args, "--nodes") {
        options = options.option("num_nodes", n.parse::<i64>()?);
    }
    if let Some(n) = arg(&args, "--node-id") {
        options = options.option("node_id", n.parse::<i64>()?);
    }
    let started = Instant::now();
    let client = Client::create(&plugin, options)?;
    println!(
        "client: {} {} in {:?}, process {}",
        client.platform_name()?,
        client.platform_version()?,
        started.elapsed(),
        client.process_index()?
    );
    for d in client.devices()? {
        println!(
            "  device {} process {} kind {:?} local {} addressable {}",
            d.id()?,
            d.process_index()?,
            d.kind()?,
            d.local_hardware_id()?,
            d.is_addressable()?
        );
    }
    let log = store.log.lock().unwrap().clone();
    println!("key-value operations by the plugin: {}", log.len());
    for line in log {
        println!("  {line}");
    }
    let exe = client.compile(
        &Program::mlir_text(
            "func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = stablehlo.multiply %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}",
        ),
        &CompileOptions::new(1, 1),
    )?;
    let dev = client.addressable_devices()?.remove(0);
    let x = client.buffer_from_slice(&[1f32, 2., 3., 4.], &[4], &dev)?;
    let out = exe.execute(&[&[&x]])?.wait()?;
    println!(
        "square([1,2,3,4]) = {:?}",
        out[0][0].to_host_blocking()?.to_vec::<f32>()?
    );
    Ok(())
}
