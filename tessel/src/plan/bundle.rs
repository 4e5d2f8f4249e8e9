//! What travels to the workers: the spec and its files.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::PlanError;
use crate::job::{JobSpec, ValidatedJob};

/// Largest final array kept in the KV for `fetch` (as `.npy`).
pub const MAX_FETCHABLE: usize = tessel_kv::state::MAX_VALUE;

/// Largest encoded bundle a worker decodes (it also has to fit one KV value).
pub const MAX_BUNDLE: usize = tessel_kv::state::MAX_VALUE;

/// A job as it travels to the workers (`jobs/{job}/spec`). Reports go to
/// `jobs/{job}/reports/` and checkpoint records to
/// `jobs/{job}/checkpoints/`, where `job` is the job the running instance
/// belongs to (the same for every attempt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobBundle {
    /// The spec (TOML).
    pub spec: String,
    /// Every file the spec names, by the path it names.
    pub files: Vec<(String, Vec<u8>)>,
}

impl JobBundle {
    /// The bundle of a validated job.
    pub fn new(job: &ValidatedJob) -> JobBundle {
        JobBundle {
            spec: job.text.clone(),
            files: job
                .files
                .iter()
                .map(|(p, b)| (p.display().to_string(), b.clone()))
                .collect(),
        }
    }

    /// The wire form (postcard).
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a bundle always encodes")
    }

    /// Decodes and validates a bundle (size limit first).
    pub fn decode(bytes: &[u8]) -> Result<(JobBundle, ValidatedJob), PlanError> {
        if bytes.len() > MAX_BUNDLE {
            return Err(PlanError::Bundle(format!(
                "{} bytes, at most {MAX_BUNDLE}",
                bytes.len()
            )));
        }
        let bundle: JobBundle =
            postcard::from_bytes(bytes).map_err(|e| PlanError::Bundle(e.to_string()))?;
        let spec = JobSpec::from_toml(&bundle.spec, "job spec".as_ref())?;
        let files: BTreeMap<PathBuf, Vec<u8>> = bundle
            .files
            .iter()
            .map(|(p, b)| (PathBuf::from(p), b.clone()))
            .collect();
        let job = spec.validate(&files)?;
        Ok((bundle, job))
    }
}
