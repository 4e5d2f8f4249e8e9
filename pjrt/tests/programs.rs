//! Property: StableHLO programs compiled by the real plugin compute the
//! right values — single device, tuple outputs, control flow, every program
//! encoding, and SPMD programs whose collectives span several devices.

mod common;

use common::{client, program_path, program_text};
use tessel_pjrt::{Buffer, Client, CompileOptions, HostBuffer, LoadedExecutable, Program};

fn run1(program: Program, inputs: &[HostBuffer]) -> Vec<HostBuffer> {
    let c = client(1);
    let exe = c
        .compile(&program, &CompileOptions::new(1, 1))
        .expect("compile");
    let dev = c.addressable_devices().unwrap().remove(0);
    let bufs: Vec<Buffer> = inputs
        .iter()
        .map(|h| c.buffer_from_host(h, &dev).unwrap())
        .collect();
    let refs: Vec<&Buffer> = bufs.iter().collect();
    let mut out = exe.execute(&[&refs]).unwrap().wait().unwrap();
    assert_eq!(out.len(), 1, "one device, one output list");
    out.remove(0)
        .iter()
        .map(|b| b.to_host_blocking().unwrap())
        .collect()
}

fn f32s(v: &[f32], dims: &[i64]) -> HostBuffer {
    HostBuffer::from_slice(v, dims).unwrap()
}

#[test]
fn add_of_two_matrices() {
    let out = run1(
        Program::mlir_text(program_text("add.mlir")),
        &[
            f32s(&[1., 2., 3., 4.], &[2, 2]),
            f32s(&[10., 20., 30., 40.], &[2, 2]),
        ],
    );
    assert_eq!(out[0].dims(), &[2, 2]);
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![11., 22., 33., 44.]);
    let c = client(1);
    let exe = common::add_executable(&c);
    let shapes: Vec<String> = exe
        .parameter_shapes()
        .unwrap()
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(shapes, vec!["f32[2, 2]", "f32[2, 2]"]);
    assert_eq!(exe.num_outputs(), 1);
}

#[test]
fn dot_product_of_matrices() {
    // [[1,2,3],[4,5,6]] · [[1,0],[0,1],[1,1]] = [[4,5],[10,11]]
    let out = run1(
        Program::mlir_text(program_text("dot.mlir")),
        &[
            f32s(&[1., 2., 3., 4., 5., 6.], &[2, 3]),
            f32s(&[1., 0., 0., 1., 1., 1.], &[3, 2]),
        ],
    );
    assert_eq!(out[0].dims(), &[2, 2]);
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![4., 5., 10., 11.]);
}

#[test]
fn reductions_with_tuple_outputs() {
    let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let out = run1(
        Program::mlir_text(program_text("reduce_tuple.mlir")),
        &[f32s(&x, &[3, 4])],
    );
    assert_eq!(
        out.len(),
        2,
        "the tuple result is flattened into two outputs"
    );
    assert_eq!(out[0].dims(), &[3]);
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![6., 22., 38.]);
    assert_eq!(out[1].dims(), &[] as &[i64]);
    assert_eq!(out[1].to_vec::<f32>().unwrap(), vec![11.]);
}

#[test]
fn while_loop_runs_to_its_condition() {
    for (n, pow, iters) in [(1, 1, 0), (5, 8, 3), (1000, 1024, 10)] {
        let out = run1(
            Program::mlir_text(program_text("while.mlir")),
            &[HostBuffer::scalar(n)],
        );
        assert_eq!(
            out[0].to_vec::<i32>().unwrap(),
            vec![pow],
            "smallest power of two >= {n}"
        );
        assert_eq!(out[1].to_vec::<i32>().unwrap(), vec![iters]);
    }
}

#[test]
fn mlir_bytecode_compiles_like_text() {
    let bytes = std::fs::read(program_path("add.mlirbc")).unwrap();
    let program = Program::mlir_bytecode(bytes);
    assert!(program.is_mlir_bytecode());
    let out = run1(
        program,
        &[
            f32s(&[1., 2., 3., 4.], &[2, 2]),
            f32s(&[1., 1., 1., 1.], &[2, 2]),
        ],
    );
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![2., 3., 4., 5.]);
}

#[test]
fn serialized_hlo_module_compiles() {
    let bytes = std::fs::read(program_path("add.hlo.pb")).unwrap();
    let out = run1(
        Program::hlo_proto(bytes),
        &[
            f32s(&[1., 2., 3., 4.], &[2, 2]),
            f32s(&[4., 3., 2., 1.], &[2, 2]),
        ],
    );
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![5., 5., 5., 5.]);
}

/// Compiles the 4-partition SPMD sum of `file` on a new 4-device client.
fn spmd_sum_executable(file: &str, shardy: bool) -> (Client, LoadedExecutable) {
    let c = client(4);
    let mut opts = CompileOptions::new(1, 4);
    opts.use_shardy_partitioner = shardy;
    let exe = c
        .compile(&Program::mlir_text(program_text(file)), &opts)
        .expect("compile");
    (c, exe)
}

/// Runs the SPMD sum of 1..=8 split in shards of 2 and checks that every
/// device holds the full sum: the all-reduce crossed all 4 devices.
fn check_spmd_sum(c: &Client, exe: &LoadedExecutable) {
    let devices = exe.addressable_devices().unwrap();
    assert_eq!(devices.len(), 4);
    let params = exe.parameter_shapes().expect("parameter shapes");
    assert_eq!(params.len(), 1);
    assert_eq!(params[0].dims, vec![2], "each partition takes a shard of 2");
    let shards: Vec<Buffer> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let base = (2 * i + 1) as f32;
            c.buffer_from_slice(&[base, base + 1.0], &[2], d).unwrap()
        })
        .collect();
    let lists: Vec<[&Buffer; 1]> = shards.iter().map(|b| [b]).collect();
    let lists: Vec<&[&Buffer]> = lists.iter().map(|l| &l[..]).collect();
    let out = exe.execute(&lists).unwrap().wait().unwrap();
    assert_eq!(out.len(), 4);
    for (d, outs) in out.iter().enumerate() {
        let v = outs[0].to_host_blocking().unwrap().to_vec::<f32>().unwrap();
        assert_eq!(v, vec![36.0], "device {d} holds the global sum");
        assert_eq!(outs[0].device().unwrap(), devices[d]);
    }
}

fn spmd_sum(file: &str, shardy: bool) {
    let (c, exe) = spmd_sum_executable(file, shardy);
    check_spmd_sum(&c, &exe);
}

#[test]
fn spmd_program_with_gspmd_shardings_all_reduces_across_4_devices() {
    spmd_sum("spmd_sum.mlir", false);
}

#[test]
fn spmd_program_with_shardy_shardings_all_reduces_across_4_devices() {
    spmd_sum("spmd_sum_sdy.mlir", true);
}

/// Two clients in one process run the same 4-device collective program at
/// the same time. The CPU plugin meets the participants of a collective in a
/// process-wide rendezvous keyed by the launch id and the global device ids,
/// so executions that shared a launch id would join each other's all-reduce
/// (the plugin aborts the process: "Unexpected number of participants").
#[test]
fn concurrent_collective_executions_in_one_process_stay_apart() {
    let threads: Vec<_> = ["spmd_sum.mlir", "spmd_sum_sdy.mlir"]
        .into_iter()
        .map(|file| {
            std::thread::spawn(move || {
                let (c, exe) = spmd_sum_executable(file, file.ends_with("_sdy.mlir"));
                for _ in 0..200 {
                    check_spmd_sum(&c, &exe);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread running the collective panicked");
    }
}

#[test]
fn fixed_device_assignment_places_partitions() {
    let c = client(4);
    let opts = CompileOptions::new(1, 4).with_device_assignment(vec![vec![3, 2, 1, 0]]);
    let exe = c
        .compile(&Program::mlir_text(program_text("spmd_sum.mlir")), &opts)
        .unwrap();
    let ids: Vec<i32> = exe
        .addressable_devices()
        .unwrap()
        .iter()
        .map(|d| d.id().unwrap())
        .collect();
    assert_eq!(ids, vec![3, 2, 1, 0]);
}

#[test]
fn async_execution_from_tokio_does_not_block_the_runtime() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = client(1);
        let exe = common::add_executable(&c);
        let dev = c.addressable_devices().unwrap().remove(0);
        let mut tasks = Vec::new();
        for i in 0..32 {
            let (c, exe, dev) = (c.clone(), exe.clone(), dev.clone());
            tasks.push(tokio::spawn(async move {
                let x = c.buffer_from_slice(&[i as f32; 4], &[2, 2], &dev).unwrap();
                let out = exe.execute(&[&[&x, &x]]).unwrap().finish().await.unwrap();
                let host = out[0][0].to_host().unwrap().await.unwrap();
                host.to_vec::<f32>().unwrap()
            }));
        }
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap(), vec![2.0 * i as f32; 4]);
        }
    });
}
