//! Helpers shared by the integration tests: the plugin under test is
//! `TESSEL_PJRT_PLUGIN` (a name or a path), `cpu` by default.
#![allow(dead_code)]

use std::path::PathBuf;

use tessel_pjrt::{Client, ClientOptions, Plugin};

pub fn plugin() -> Plugin {
    let path = tessel_pjrt::locate::resolve(None).unwrap_or_else(|e| panic!("{e}"));
    Plugin::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// A client with `devices` CPU devices.
pub fn client(devices: i64) -> Client {
    Client::create(
        &plugin(),
        ClientOptions::default().option("cpu_device_count", devices),
    )
    .expect("client")
}

pub fn program_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(name)
}

pub fn program_text(name: &str) -> String {
    std::fs::read_to_string(program_path(name)).expect("program file")
}
