//! Job specs come from users: parsing and validating any text never
//! panics (files are resolved against a folder that does not exist).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel::job::JobSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::path::Path::new("/nonexistent/job.toml");
    if let Ok(spec) = JobSpec::from_toml(text, path) {
        let _ = spec.validate(std::path::Path::new("/nonexistent"));
    }
});
