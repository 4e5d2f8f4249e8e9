//! Property: data survives every trip — host to device to host for every
//! element type, device to device, through execution — and buffer handles
//! report their shape, size, device and deletion truthfully.

mod common;

use common::client;
use half::{bf16, f16};
use tessel_pjrt::{CompileOptions, ElementType, ExecuteArg, HostBuffer, NativeType, Program};

fn sample<T: NativeType>(make: impl Fn(usize) -> T) -> HostBuffer {
    let v: Vec<T> = (0..6).map(make).collect();
    HostBuffer::from_slice(&v, &[2, 3]).unwrap()
}

fn samples() -> Vec<HostBuffer> {
    vec![
        sample(|i| i % 2 == 0),
        sample(|i| i as i8 - 3),
        sample(|i| i as i16 * -1000),
        sample(|i| i as i32 * 100_000 - 7),
        sample(|i| (i as i64) << 40),
        sample(|i| 250 - i as u8),
        sample(|i| 65_000 - i as u16),
        sample(|i| 4_000_000_000 - i as u32),
        sample(|i| u64::MAX - i as u64),
        sample(|i| f16::from_f32(i as f32 * 0.5)),
        sample(|i| i as f32 * 1.25 - 2.0),
        sample(|i| i as f64 / 3.0),
        sample(|i| bf16::from_f32(i as f32 * -8.0)),
    ]
}

#[test]
fn every_element_type_round_trips_through_a_device() {
    let c = client(1);
    let dev = c.addressable_devices().unwrap().remove(0);
    let all = samples();
    assert_eq!(
        all.len(),
        ElementType::ALL.len(),
        "one sample per supported type"
    );
    for host in all {
        let buf = c.buffer_from_host(&host, &dev).unwrap();
        assert_eq!(buf.element_type().unwrap(), host.element_type());
        assert_eq!(buf.dims().unwrap(), vec![2, 3]);
        assert!(buf.on_device_size().unwrap() >= host.bytes().len());
        let back = buf.to_host_blocking().unwrap();
        assert_eq!(back, host, "{} round trip", host.element_type());
    }
}

#[test]
fn every_element_type_passes_through_an_executed_program() {
    let c = client(1);
    let dev = c.addressable_devices().unwrap().remove(0);
    for host in samples() {
        let t = host.element_type().mlir_name();
        let text = format!(
            "func.func public @main(%a: tensor<2x3x{t}>, %b: tensor<2x3x{t}>) -> (tensor<2x3x{t}>, tensor<2x3x{t}>) {{\n  return %b, %a : tensor<2x3x{t}>, tensor<2x3x{t}>\n}}"
        );
        let exe = c
            .compile(&Program::mlir_text(text), &CompileOptions::new(1, 1))
            .unwrap();
        let a = c.buffer_from_host(&host, &dev).unwrap();
        let zeros =
            HostBuffer::from_bytes(host.element_type(), &[2, 3], vec![0; host.bytes().len()])
                .unwrap();
        let b = c.buffer_from_host(&zeros, &dev).unwrap();
        let out = exe.execute(&[&[&a, &b]]).unwrap().wait().unwrap();
        assert_eq!(out[0][0].to_host_blocking().unwrap(), zeros);
        assert_eq!(
            out[0][1].to_host_blocking().unwrap(),
            host,
            "{t} through execution"
        );
    }
}

#[test]
fn copy_to_another_device_keeps_contents() {
    let c = client(2);
    let devs = c.addressable_devices().unwrap();
    let host = HostBuffer::from_slice(&[1.5f64, -2.5, 1e300], &[3]).unwrap();
    let a = c.buffer_from_host(&host, &devs[0]).unwrap();
    let b = a.copy_to_device(&devs[1]).unwrap();
    assert_eq!(b.device().unwrap(), devs[1]);
    assert_eq!(a.device().unwrap(), devs[0]);
    assert_eq!(b.to_host_blocking().unwrap(), host);
}

#[test]
fn async_host_copy_resolves_to_the_data() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let c = client(1);
    let dev = c.addressable_devices().unwrap().remove(0);
    let data: Vec<u32> = (0..1 << 20).collect();
    let buf = c.buffer_from_slice(&data, &[1 << 20], &dev).unwrap();
    buf.ready().unwrap().wait().unwrap();
    let host = rt.block_on(buf.to_host().unwrap()).unwrap();
    assert_eq!(host.to_vec::<u32>().unwrap(), data);
}

#[test]
fn dropping_a_pending_host_copy_is_safe() {
    let c = client(1);
    let dev = c.addressable_devices().unwrap().remove(0);
    let buf = c
        .buffer_from_slice(&vec![7u8; 8 << 20], &[8 << 20], &dev)
        .unwrap();
    for _ in 0..20 {
        drop(buf.to_host().unwrap());
    }
    assert_eq!(buf.to_host_blocking().unwrap().bytes()[..4], [7, 7, 7, 7]);
}

#[test]
fn delete_frees_and_is_reported() {
    let c = client(1);
    let dev = c.addressable_devices().unwrap().remove(0);
    let buf = c.buffer_from_slice(&[1i32, 2, 3], &[3], &dev).unwrap();
    assert!(!buf.is_deleted().unwrap());
    buf.delete().unwrap();
    assert!(buf.is_deleted().unwrap());
    let err = buf.to_host_blocking().unwrap_err();
    assert!(err.to_string().to_lowercase().contains("delet"), "{err}");
}

#[test]
fn donated_arguments_are_consumed_and_borrowed_ones_survive() {
    let c = client(1);
    let dev = c.addressable_devices().unwrap().remove(0);
    // Output 0 aliases parameter 0, so the plugin may reuse its memory.
    let text = "func.func public @main(%a: tensor<4xf32> {tf.aliasing_output = 0 : i32}, %b: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = stablehlo.add %a, %b : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}";
    let exe = c
        .compile(&Program::mlir_text(text), &CompileOptions::new(1, 1))
        .unwrap();
    let a = c
        .buffer_from_slice(&[1f32, 2., 3., 4.], &[4], &dev)
        .unwrap();
    let b = c.buffer_from_slice(&[10f32; 4], &[4], &dev).unwrap();
    let out = exe
        .execute_args(vec![vec![ExecuteArg::Donate(a), ExecuteArg::Borrow(&b)]])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        out[0][0]
            .to_host_blocking()
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![11., 12., 13., 14.]
    );
    assert!(!b.is_deleted().unwrap());
    assert_eq!(
        b.to_host_blocking().unwrap().to_vec::<f32>().unwrap(),
        vec![10.; 4]
    );
}
