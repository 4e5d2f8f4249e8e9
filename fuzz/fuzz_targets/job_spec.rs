//! Job specs come from users: parsing and validating any text never
//! panics (with no files at all, and with every file name it asks for
//! holding a small valid program), and an accepted spec's own text parses
//! back to it.
#![no_main]
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use tessel::job::{FolderFiles, JobSpec};

const PROGRAM: &str = "func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}\n";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("/nonexistent/job.toml");
    if let Ok(spec) = JobSpec::from_toml(text, path) {
        let _ = spec.validate(&FolderFiles(PathBuf::from("/nonexistent")));
        let files: BTreeMap<PathBuf, Vec<u8>> = spec
            .programs
            .values()
            .map(|p| (p.file.clone(), PROGRAM.as_bytes().to_vec()))
            .collect();
        if let Ok(job) = spec.validate(&files) {
            assert_eq!(JobSpec::from_toml(&job.text, path).unwrap(), spec);
        }
    }
});
