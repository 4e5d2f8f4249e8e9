//! Helpers shared by the integration tests: the plugin under test is
//! `TESSEL_PJRT_PLUGIN` (a name or a path), `cpu` by default.
#![allow(dead_code)]

use std::path::PathBuf;

use tessel_pjrt::{Client, ClientOptions, Plugin};

pub(crate) fn plugin() -> Plugin {
    let path = tessel_pjrt::locate::resolve(None).unwrap_or_else(|e| panic!("{e}"));
    Plugin::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// A client with `devices` CPU devices.
pub(crate) fn client(devices: i64) -> Client {
    Client::create(
        &plugin(),
        ClientOptions::default().option("cpu_device_count", devices),
    )
    .expect("client")
}

pub(crate) fn program_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(name)
}

pub(crate) fn program_text(name: &str) -> String {
    std::fs::read_to_string(program_path(name)).expect("program file")
}

/// `add.mlir` (two f32[2,2] summed) compiled for one device.
pub(crate) fn add_executable(c: &Client) -> tessel_pjrt::LoadedExecutable {
    c.compile(
        &tessel_pjrt::Program::mlir_text(program_text("add.mlir")),
        &tessel_pjrt::CompileOptions::new(1, 1),
    )
    .expect("compile add.mlir")
}

/// The folder holding `pjrt_c_api.h` of the installed CPU wheel.
pub(crate) fn header_dir() -> PathBuf {
    let so = tessel_pjrt::locate::resolve(Some("cpu")).unwrap_or_else(|e| panic!("{e}"));
    let dir = so.parent().unwrap().join("include");
    assert!(
        dir.join("pjrt_c_api.h").is_file(),
        "no pjrt_c_api.h beside {}",
        so.display()
    );
    dir
}

/// Compiles C `source` (with the plugin header on the include path) into a
/// shared library or an executable in `out`.
pub(crate) fn cc(source: &std::path::Path, out: &std::path::Path, shared: bool) {
    let mut cmd = std::process::Command::new("cc");
    if shared {
        cmd.args(["-shared", "-fPIC"]);
    }
    let status = cmd
        .arg("-I")
        .arg(header_dir())
        .arg("-o")
        .arg(out)
        .arg(source)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc {} failed", source.display());
}
