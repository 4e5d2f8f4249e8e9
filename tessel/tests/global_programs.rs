//! Properties of global programs and device-resident arrays, on OpenXLA's
//! CPU plugin with four devices in one process:
//! a program compiled over a device assignment that is not the plugin's own
//! order still gives every device the piece of its partition, and results
//! come back in place; an array placed on its devices is reused as it is,
//! so a loop copies nothing between host and device after the first step.

use tessel::pjrt::{locate, Client, ClientOptions, ElementType, HostBuffer, Plugin};
use tessel::plan::resident::{Slot, Traffic, Want};
use tessel::program::{CompiledProgram, ProgramSource};

/// Doubles an f32[8] split four ways.
const DOUBLE: &str = r#"module @double attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) -> (tensor<8xf32> {mhlo.sharding = "{devices=[4]<=[4]}"}) {
    %0 = stablehlo.add %arg0, %arg0 : tensor<8xf32>
    return %0 : tensor<8xf32>
  }
}"#;

fn client() -> Client {
    let plugin = Plugin::load(locate::resolve(Some("cpu")).unwrap()).unwrap();
    Client::create(
        &plugin,
        ClientOptions::default().option("cpu_device_count", 4i64),
    )
    .unwrap()
}

fn iota() -> HostBuffer {
    HostBuffer::from_slice(&[0f32, 1., 2., 3., 4., 5., 6., 7.], &[8]).unwrap()
}

#[test]
fn a_scrambled_device_assignment_still_gives_each_partition_its_piece() {
    let client = client();
    let source = ProgramSource::parse(DOUBLE.as_bytes()).unwrap();
    // Partition 0 on device 3, partition 1 on device 1, ...
    let assignment = [3i64, 1, 0, 2];
    let prog = CompiledProgram::compile_global(&client, source, &assignment).unwrap();
    assert_eq!(prog.partitions(), 4);
    for (k, d) in prog.devices().iter().enumerate() {
        assert_eq!(
            assignment[prog.partition_of(k)],
            i64::from(d.id().unwrap()),
            "device {k} of the executable runs the partition assigned to it"
        );
    }
    let out = prog.execute(&client, &[&iota()]).unwrap();
    assert_eq!(
        out[0].to_vec::<f32>().unwrap(),
        vec![0., 2., 4., 6., 8., 10., 12., 14.]
    );
}

#[test]
fn an_array_placed_on_its_devices_is_reused_and_copied_back_once() {
    let client = client();
    let devices = client.addressable_devices().unwrap();
    let want: Vec<Want<'_>> = devices
        .iter()
        .enumerate()
        .map(|(k, d)| Want {
            device: d,
            start: vec![2 * k as i64],
            shape: vec![2],
        })
        .collect();
    let mut slot = Slot::on_host(iota());
    let mut t = Traffic::default();
    slot.place(&client, &want, &mut t).unwrap();
    assert_eq!(t.to_device, 32, "the four pieces, once");
    slot.place(&client, &want, &mut t).unwrap();
    assert_eq!(t.to_device, 32, "placed as wanted: nothing copied");
    // A block that lives only on the devices comes back whole, once.
    let pieces = slot.take_pieces();
    let mut slot = Slot::on_devices(ElementType::F32, vec![8], pieces);
    let back = slot.host(&mut t).unwrap().clone();
    assert_eq!(back, iota());
    assert_eq!(t.to_host, 32);
    slot.host(&mut t).unwrap();
    assert_eq!(t.to_host, 32, "kept on the host once copied");
    // Replicas of a piece are copied back once.
    let replicated: Vec<Want<'_>> = devices
        .iter()
        .map(|d| Want {
            device: d,
            start: vec![0],
            shape: vec![8],
        })
        .collect();
    let mut whole = Slot::on_host(iota());
    whole.place(&client, &replicated, &mut t).unwrap();
    let pieces = whole.take_pieces();
    let mut whole = Slot::on_devices(ElementType::F32, vec![8], pieces);
    let before = t.to_host;
    whole.host(&mut t).unwrap();
    assert_eq!(t.to_host - before, 32);
}
