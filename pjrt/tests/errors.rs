//! Property: every bad input becomes a typed error naming what is wrong —
//! nothing aborts the process, nothing is silently accepted.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{client, program_text};
use tessel_pjrt::{CompileOptions, Error, ErrorCode, ExecuteArg, HostBuffer, Plugin, Program};

/// Builds a shared library from C source with the system compiler.
fn build_so(dir: &Path, name: &str, source: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    let so = dir.join(format!("{name}.so"));
    std::fs::write(&c, source).unwrap();
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .status()
        .expect("cc");
    assert!(status.success(), "cc failed");
    so
}

#[test]
fn a_missing_file_names_the_path() {
    let e = Plugin::load("/nonexistent/plugin.so").unwrap_err();
    assert!(matches!(e, Error::Load { .. }), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/plugin.so"));
}

#[test]
fn a_library_without_get_pjrt_api_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let so = build_so(
        dir.path(),
        "notaplugin",
        "int answer(void) { return 42; }\n",
    );
    let e = Plugin::load(&so).unwrap_err();
    assert!(matches!(e, Error::NoEntryPoint { .. }), "{e:?}");
    assert!(e.to_string().contains("GetPjrtApi"), "{e}");
}

#[test]
fn an_old_api_version_is_refused_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    // A table whose header claims C API 0.40: struct_size, extension_start,
    // then PJRT_Api_Version {struct_size, extension_start, major, minor}.
    let src = r#"
        #include <stddef.h>
        struct version { size_t struct_size; void* ext; int major; int minor; };
        struct api { size_t struct_size; void* ext; struct version v; void* fns[4]; };
        static struct api table = { sizeof(struct api), 0, { sizeof(struct version), 0, 0, 40 }, {0} };
        const struct api* GetPjrtApi(void) { return &table; }
    "#;
    let so = build_so(dir.path(), "oldplugin", src);
    let e = Plugin::load(&so).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IncompatibleVersion {
                plugin_major: 0,
                plugin_minor: 40,
                required_major: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("0.40") && msg.contains(&format!("x >= {}", tessel_pjrt::MIN_API_MINOR)),
        "{msg}"
    );
}

#[test]
fn malformed_mlir_returns_the_compiler_message() {
    let c = client(1);
    let e = c
        .compile(
            &Program::mlir_text("func.func @main( this is not mlir"),
            &CompileOptions::new(1, 1),
        )
        .unwrap_err();
    match &e {
        Error::Pjrt {
            function, message, ..
        } => {
            assert_eq!(*function, "PJRT_Client_Compile");
            assert!(message.contains("error"), "{message}");
        }
        other => panic!("expected a plugin error, got {other:?}"),
    }
}

#[test]
fn a_type_error_in_the_program_is_reported() {
    let c = client(1);
    let text = "func.func public @main(%a: tensor<2xf32>, %b: tensor<2xi32>) -> tensor<2xf32> {\n  %0 = stablehlo.add %a, %b : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}";
    let e = c
        .compile(&Program::mlir_text(text), &CompileOptions::new(1, 1))
        .unwrap_err();
    assert!(matches!(e, Error::Pjrt { .. }), "{e:?}");
}

#[test]
fn zero_replicas_never_reach_the_plugin() {
    let c = client(1);
    let e = c
        .compile(
            &Program::mlir_text(program_text("add.mlir")),
            &CompileOptions::new(1, 0),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}

#[test]
fn wrong_argument_count_is_an_error() {
    let c = client(1);
    let exe = common::add_executable(&c);
    let dev = c.addressable_devices().unwrap().remove(0);
    let a = c.buffer_from_slice(&[1f32; 4], &[2, 2], &dev).unwrap();
    let e = exe.execute(&[&[&a]]).and_then(|x| x.wait()).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
}

#[test]
fn wrong_dtype_or_shape_is_an_error() {
    let c = client(1);
    let exe = common::add_executable(&c);
    let dev = c.addressable_devices().unwrap().remove(0);
    let good = c.buffer_from_slice(&[1f32; 4], &[2, 2], &dev).unwrap();
    let wrong_type = c.buffer_from_slice(&[1i32; 4], &[2, 2], &dev).unwrap();
    let wrong_shape = c.buffer_from_slice(&[1f32; 4], &[4], &dev).unwrap();
    // The CPU plugin itself does not check; tessel does, against the
    // compiled program's parameter shapes.
    for (bad, got) in [(&wrong_type, "s32[2, 2]"), (&wrong_shape, "f32[4]")] {
        let e = exe
            .execute(&[&[&good, bad]])
            .and_then(|x| x.wait())
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("argument 1") && msg.contains("f32[2, 2]") && msg.contains(got),
            "{msg}"
        );
    }
}

#[test]
fn argument_lists_for_the_wrong_number_of_devices_are_an_error() {
    let c = client(2);
    let exe = common::add_executable(&c);
    let dev = c.addressable_devices().unwrap().remove(0);
    let a = c.buffer_from_slice(&[1f32; 4], &[2, 2], &dev).unwrap();
    assert!(
        exe.execute(&[&[&a, &a], &[&a, &a]]).is_err(),
        "2 lists for a 1-device executable"
    );
    assert!(matches!(exe.execute(&[]), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        exe.execute(&[&[&a, &a], &[&a]]),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn partial_donation_is_refused() {
    let c = client(2);
    let exe = c
        .compile(
            &Program::mlir_text(
                program_text("spmd_sum.mlir")
                    .replace("4", "2")
                    .replace("8x", "4x"),
            ),
            &CompileOptions::new(1, 2),
        )
        .unwrap();
    let devs = exe.addressable_devices().unwrap();
    let a = c.buffer_from_slice(&[1f32; 2], &[2], &devs[0]).unwrap();
    let b = c.buffer_from_slice(&[1f32; 2], &[2], &devs[1]).unwrap();
    let r = exe.execute_args(vec![
        vec![ExecuteArg::Donate(a)],
        vec![ExecuteArg::Borrow(&b)],
    ]);
    assert!(matches!(r, Err(Error::InvalidArgument(ref m)) if m.contains("donated")));
}

#[test]
fn host_data_of_the_wrong_size_never_reaches_the_plugin() {
    let c = client(1);
    let dev = c.addressable_devices().unwrap().remove(0);
    let e = c.buffer_from_slice(&[1f32; 3], &[2, 2], &dev).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    assert!(HostBuffer::from_bytes(tessel_pjrt::ElementType::F64, &[2], vec![0; 15]).is_err());
    assert!(HostBuffer::from_bytes(tessel_pjrt::ElementType::F32, &[-1], vec![]).is_err());
    assert!(
        HostBuffer::from_bytes(tessel_pjrt::ElementType::F32, &[i64::MAX, i64::MAX], vec![])
            .is_err()
    );
}

#[test]
fn reading_as_the_wrong_type_is_an_error() {
    let h = HostBuffer::from_slice(&[1f32, 2.0], &[2]).unwrap();
    assert!(h.to_vec::<i32>().is_err());
}

#[test]
fn unknown_device_and_impossible_assignment_are_errors() {
    let c = client(2);
    assert!(c.lookup_device(999).is_err());
    assert!(matches!(
        c.default_device_assignment(0, 1),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn a_device_of_another_client_is_refused() {
    let c1 = client(1);
    let c2 = client(1);
    let d2 = c2.addressable_devices().unwrap().remove(0);
    let e = c1.buffer_from_slice(&[1f32], &[1], &d2).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
}
