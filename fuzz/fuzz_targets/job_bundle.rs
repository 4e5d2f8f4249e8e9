//! What a worker reads at `jobs/{job}/spec` and at the end of a run: job
//! bundles (postcard, then the spec's TOML and its files validated), step
//! reports and process results (JSON). Decoding never panics; an accepted
//! bundle re-encodes to one that decodes the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tessel::plan::{JobBundle, ProcessResult, StepReport};

fuzz_target!(|data: &[u8]| {
    if let Ok((bundle, job)) = JobBundle::decode(data) {
        let (again, job2) = JobBundle::decode(&bundle.encode()).unwrap();
        assert_eq!(again, bundle);
        assert_eq!(job2.spec, job.spec);
    }
    let _ = serde_json::from_slice::<StepReport>(data);
    let _ = serde_json::from_slice::<ProcessResult>(data);
});
