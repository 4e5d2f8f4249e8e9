//! Overhead of the safe API against the raw C API, and transfer throughput
//! against memcpy, measured in one run on the real CPU plugin
//! (`TESSEL_PJRT_PLUGIN` picks another).
//!
//!     cargo bench -p tessel-pjrt
//!
//! (a) execute + wait of a 1-element f32 add: safe blocking API, safe async
//!     API (`.await` on a current-thread tokio runtime), and a raw FFI loop
//!     making the same C calls (Execute, Event_Await, Event_Destroy,
//!     Buffer_Destroy).
//! (b) 64 MiB host→device and device→host, against `memcpy` of 64 MiB
//!     between two already-allocated host buffers.

// The raw C API loop is the peer: in pjrt/, where `unsafe` lives.
#![allow(unsafe_code)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tessel_pjrt::ffi;
use tessel_pjrt::{Client, ClientOptions, CompileOptions, Plugin, Program};

const ADD: &str = "func.func public @main(%a: tensor<f32>, %b: tensor<f32>) -> tensor<f32> {\n  %0 = stablehlo.add %a, %b : tensor<f32>\n  return %0 : tensor<f32>\n}";

fn client() -> Client {
    let path = tessel_pjrt::locate::resolve(None).expect("plugin");
    let plugin = Plugin::load(path).expect("load");
    Client::create(
        &plugin,
        ClientOptions::default().option("cpu_device_count", 1i64),
    )
    .expect("client")
}

/// The same C calls as the safe path, with no wrapper in between.
unsafe fn raw_execute(
    api: &ffi::PJRT_Api,
    exe: *mut ffi::PJRT_LoadedExecutable,
    args: &[*mut ffi::PJRT_Buffer; 2],
) {
    let mut out: [*mut ffi::PJRT_Buffer; 1] = [std::ptr::null_mut()];
    let out_lists = [out.as_mut_ptr()];
    let arg_lists = [args.as_ptr()];
    let mut events: [*mut ffi::PJRT_Event; 1] = [std::ptr::null_mut()];
    let mut options = ffi::PJRT_ExecuteOptions::new();
    let non_donatable = [0i64, 1];
    options.non_donatable_input_indices = non_donatable.as_ptr();
    options.num_non_donatable_input_indices = 2;
    let mut a = ffi::PJRT_LoadedExecutable_Execute_Args::new();
    a.executable = exe;
    a.options = &mut options;
    a.argument_lists = arg_lists.as_ptr();
    a.num_devices = 1;
    a.num_args = 2;
    a.output_lists = out_lists.as_ptr();
    a.device_complete_events = events.as_mut_ptr();
    // SAFETY: arrays sized as declared; exe and args are live.
    unsafe {
        assert!(api.PJRT_LoadedExecutable_Execute.unwrap()(&mut a).is_null());
        let mut w = ffi::PJRT_Event_Await_Args::new();
        w.event = events[0];
        assert!(api.PJRT_Event_Await.unwrap()(&mut w).is_null());
        let mut d = ffi::PJRT_Event_Destroy_Args::new();
        d.event = events[0];
        api.PJRT_Event_Destroy.unwrap()(&mut d);
        let mut b = ffi::PJRT_Buffer_Destroy_Args::new();
        b.buffer = out[0];
        api.PJRT_Buffer_Destroy.unwrap()(&mut b);
    }
}

fn execute_overhead(c: &mut Criterion) {
    let client = client();
    let exe = client
        .compile(&Program::mlir_text(ADD), &CompileOptions::new(1, 1))
        .unwrap();
    let dev = client.addressable_devices().unwrap().remove(0);
    let a = client.buffer_from_slice(&[1.0f32], &[], &dev).unwrap();
    let b = client.buffer_from_slice(&[2.0f32], &[], &dev).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // SAFETY: the table lives as long as the process.
    let api = unsafe { &*client.plugin().as_raw() };
    let raw_args = [a.as_raw(), b.as_raw()];

    let mut g = c.benchmark_group("execute_1_element_add");
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("raw_ffi", |bench| {
        // SAFETY: exe and both buffers outlive the loop.
        bench.iter(|| unsafe { raw_execute(api, exe.as_raw(), black_box(&raw_args)) })
    });
    g.bench_function("safe_blocking", |bench| {
        bench.iter(|| black_box(exe.execute(&[&[&a, &b]]).unwrap().wait().unwrap()))
    });
    g.bench_function("safe_async_await", |bench| {
        bench.iter(|| {
            black_box(
                rt.block_on(async { exe.execute(&[&[&a, &b]]).unwrap().finish().await.unwrap() }),
            )
        })
    });
    g.finish();
}

fn transfers(c: &mut Criterion) {
    const BYTES: usize = 64 << 20;
    // As the tessel binary does at start-up (tessel_transfer::memory):
    // glibc keeps large blocks in the heap instead of unmapping them.
    let tuned = std::env::var_os("TESSEL_DEFAULT_MALLOC").is_none() && {
        const LIMIT: libc::c_int = 1 << 30;
        // SAFETY: mallopt only adjusts allocator parameters; it is safe to
        // call at any time from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, LIMIT) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, LIMIT) == 1
        }
    };
    eprintln!("host allocator retains large allocations: {tuned}");
    let client = client();
    let dev = client.addressable_devices().unwrap().remove(0);
    let src: Vec<f32> = (0..BYTES / 4).map(|i| i as f32).collect();
    let mut dst = vec![0f32; BYTES / 4];
    let on_device = client
        .buffer_from_slice(&src, &[(BYTES / 4) as i64], &dev)
        .unwrap();

    let mut g = c.benchmark_group("transfer_64MiB");
    g.throughput(Throughput::Bytes(BYTES as u64));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("memcpy", |bench| {
        bench.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    g.bench_function("host_to_device", |bench| {
        bench.iter(|| {
            black_box(
                client
                    .buffer_from_slice(black_box(&src), &[(BYTES / 4) as i64], &dev)
                    .unwrap(),
            )
        })
    });
    g.bench_function("device_to_host_into", |bench| {
        bench.iter(|| {
            on_device
                .copy_into_host_blocking(bytemuck::cast_slice_mut(&mut dst))
                .unwrap();
            black_box(&dst);
        })
    });
    g.bench_function("device_to_host_alloc", |bench| {
        bench.iter(|| black_box(on_device.to_host_blocking().unwrap()))
    });
    g.finish();
}

criterion_group!(benches, execute_overhead, transfers);
criterion_main!(benches);
