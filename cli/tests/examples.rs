//! Property: the demo job really trains — run through the library on the
//! real plugin, over 4 devices, the loss falls by orders of magnitude and
//! the fitted weights match the ones that generated the data.

use std::path::Path;

use tessel::array::read_npy;
use tessel::pjrt::{locate, HostBuffer, Plugin};
use tessel::program::{run_program, RunRequest};

fn npy(name: &str) -> HostBuffer {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("examples/linear-regression")
        .join(name);
    read_npy(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn linear_regression_over_four_devices_converges() {
    let plugin = Plugin::load(locate::resolve(None).unwrap()).unwrap();
    let program = std::fs::read(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .join("examples/linear-regression/train.mlir"),
    )
    .unwrap();
    let out = run_program(
        &plugin,
        &RunRequest {
            program,
            devices: None,
            partitions: None,
            args: vec![npy("w0.npy"), npy("x.npy"), npy("y.npy")],
            options: Vec::new(),
        },
    )
    .unwrap();
    let w = out[0].to_vec::<f32>().unwrap();
    let losses = out[1].to_vec::<f32>().unwrap();
    assert_eq!(losses.len(), 200);
    assert!(losses[0] > 1.0, "starts far off: {}", losses[0]);
    assert!(
        *losses.last().unwrap() < 1e-3,
        "converges: {}",
        losses.last().unwrap()
    );
    assert!(
        losses.windows(2).all(|p| p[1] <= p[0] * 1.0001),
        "the loss never rises"
    );
    // The data has noise of 0.01, so the fit cannot be exact; 0.005 is well
    // inside what 256 samples pin down and far below any weight (|w| > 0.1).
    let w_true = npy("w_true.npy").to_vec::<f32>().unwrap();
    for (i, (a, b)) in w.iter().zip(&w_true).enumerate() {
        assert!((a - b).abs() < 0.005, "w[{i}] = {a}, generated with {b}");
    }
}
