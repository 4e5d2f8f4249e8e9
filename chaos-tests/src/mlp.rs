//! The MLP demo as the fault tests run it: a spec with checkpoints and
//! restarts, and its trained parameters.

use std::path::Path;

use tessel::client::Client;
use tessel::job::{JobSpec, ValidatedJob};

/// `examples/mlp-data-parallel/FILE` with `steps`, `max_restarts` and
/// checkpoints every 100 steps under `ckpt` (absolute), its files read
/// from `dir` (the example's folder, or a copy of it).
pub fn mlp_job(dir: &Path, file: &str, steps: u64, max_restarts: u32, ckpt: &Path) -> ValidatedJob {
    let text = std::fs::read_to_string(dir.join(file)).unwrap();
    let mut spec = JobSpec::from_toml(&text, file.as_ref()).unwrap();
    spec.steps = steps;
    spec.max_restarts = max_restarts;
    spec.checkpoint = Some(tessel::job::CheckpointSpec {
        dir: ckpt.to_owned(),
        every: 100,
    });
    spec.validate_in(dir).unwrap()
}

/// The example's own folder.
pub fn mlp_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mlp-data-parallel")
}

/// The trained parameters of job `id`, as bytes.
pub async fn mlp_params(client: &Client, id: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for p in ["w1", "b1", "w2", "b2"] {
        out.push(client.fetch(id, p).await.unwrap().bytes().to_vec());
    }
    out
}
