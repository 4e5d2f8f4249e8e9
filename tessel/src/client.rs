//! Submitting and following jobs: the Rust API behind `tessel submit`,
//! `jobs`, `job`, `cancel` and `fetch`.
//!
//! ```no_run
//! use futures::StreamExt;
//! use tessel::client::{Client, JobUpdate};
//! use tessel::job::JobSpec;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let tls = tessel_tls::TlsFiles::load("tls".as_ref())?;
//! let client = Client::connect(&["127.0.0.1:7000".parse()?], Some(&tls))?;
//! let job = JobSpec::load("examples/mlp-data-parallel/job.toml".as_ref())?;
//! let id = client.submit(&job).await?;
//! let mut updates = client.events(&id).await?;
//! while let Some(update) = updates.next().await {
//!     match update? {
//!         JobUpdate::State(e) => println!("{id}: {} → {}", e.from, e.to),
//!         JobUpdate::Report(r) => println!("step {}: {:?}", r.step, r.values),
//!     }
//! }
//! let done = client.wait(&id).await?;
//! println!("{id} ended {}", done.state);
//! let w1 = client.fetch(&id, "w1").await?;
//! println!("w1: {:?}", w1.dims());
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tessel_coordinator::records::Series;
use tessel_coordinator::scheduler::{self, JobEvent, JobRecord};
use tessel_coordinator::{Item, Records};
use tessel_kv::{Event, KvError, KvStore};
use tessel_pjrt::HostBuffer;

use crate::job::ValidatedJob;
use crate::plan::{JobBundle, ProcessResult, StepReport, MAX_BUNDLE};

/// What a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No job has that id.
    #[error("no job `{0}`")]
    NoSuchJob(String),
    /// The spec did not validate (every problem, each naming its field).
    #[error(transparent)]
    Spec(#[from] crate::job::JobSpecError),
    /// The job has not succeeded (yet).
    #[error("job `{job}` is {state}: arrays can be fetched once it has succeeded")]
    NotFinished {
        /// The job.
        job: String,
        /// Its state.
        state: &'static str,
    },
    /// The job kept no such array.
    #[error("job `{job}` has no array `{array}` to fetch (only arrays the plan writes, up to 4 MiB, are kept)")]
    NoSuchArray {
        /// The job.
        job: String,
        /// The array.
        array: String,
    },
    /// The spec and its files exceed what a job may carry.
    #[error("the job with its files is {bytes} bytes; at most {MAX_BUNDLE} travel with a job")]
    TooLarge {
        /// Their size.
        bytes: usize,
    },
    /// A KV operation failed.
    #[error("{context}: {source}")]
    Kv {
        /// What the client was doing.
        context: &'static str,
        /// The KV's error.
        #[source]
        source: KvError,
    },
    /// The scheduler refused the request.
    #[error(transparent)]
    Coordinator(#[from] tessel_coordinator::CoordinatorError),
    /// A stored record did not decode.
    #[error("{0}")]
    Decode(String),
}

fn kv_err(context: &'static str) -> impl FnOnce(KvError) -> ClientError {
    move |source| ClientError::Kv { context, source }
}

/// A change of a job: a state transition or a step report.
#[derive(Debug, Clone, PartialEq)]
pub enum JobUpdate {
    /// A state transition.
    State(JobEvent),
    /// A step's reported scalars.
    Report(StepReport),
}

/// A piece of a command job's process output: whole lines, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    /// The process (its rank).
    pub process: u32,
    /// Its place among the process's chunks.
    pub seq: u64,
    /// The lines, each ending in a newline.
    pub text: String,
}

/// A connection to a tessel cluster's coordinators.
#[derive(Clone)]
pub struct Client {
    kv: Arc<dyn KvStore>,
}

impl Client {
    /// Connects to the coordinator replicas at `addrs` (any of them
    /// serves; mutual TLS with the cluster's files, or `None` for a cluster
    /// started with `--insecure`).
    pub fn connect(
        addrs: &[SocketAddr],
        tls: Option<&tessel_tls::TlsFiles>,
    ) -> Result<Client, ClientError> {
        let kv = tessel_kv_service::raft::client::RaftKv::connect(addrs.to_vec(), tls)
            .map_err(kv_err("connecting to the coordinators"))?;
        Ok(Client { kv: Arc::new(kv) })
    }

    /// A client over any key-value backend (etcd, or a test double).
    pub fn from_store(kv: Arc<dyn KvStore>) -> Client {
        Client { kv }
    }

    /// Queues a validated job; returns its id (`NAME.N`).
    pub async fn submit(&self, job: &ValidatedJob) -> Result<String, ClientError> {
        let bundle = JobBundle::new(job).encode();
        if bundle.len() > MAX_BUNDLE {
            return Err(ClientError::TooLarge {
                bytes: bundle.len(),
            });
        }
        let s = &job.spec;
        // Every job gets a trace context (a few random bytes): coordinators
        // and workers that export traces join it, whether or not this
        // process exports.
        let trace = tessel_trace::JobTrace::new();
        let started = tessel_coordinator::unix_ms();
        let submission = scheduler::Submission {
            name: s.name.clone(),
            processes: s.placements(),
            devices_per_process: s.devices_per_placement(),
            plugin: s.plugin.clone(),
            max_restarts: s.max_restarts,
            trace: Some(trace.to_string()),
        };
        let id = scheduler::submit(&*self.kv, &submission, &bundle).await?;
        tessel_trace::record(
            &trace,
            tessel_trace::JobSpan {
                name: "submit",
                id: tessel_trace::Parent::None,
                parent: tessel_trace::Parent::Root,
                start_unix_ms: started,
                end_unix_ms: tessel_coordinator::unix_ms(),
                attributes: vec![
                    tessel_trace::KeyValue::new("tessel.job.id", id.clone()),
                    tessel_trace::KeyValue::new("tessel.bundle_bytes", bundle.len() as i64),
                ],
                error: None,
            },
        );
        Ok(id)
    }

    /// Validates a spec built in Rust (files read from `folder`) and
    /// queues it.
    pub async fn submit_spec(
        &self,
        spec: &crate::job::JobSpec,
        folder: &std::path::Path,
    ) -> Result<String, ClientError> {
        self.submit(&spec.validate_in(folder)?).await
    }

    /// Every job the scheduler knows (finished ones: the newest few
    /// hundred), in submission order.
    pub async fn list(&self) -> Result<Vec<JobRecord>, ClientError> {
        Ok(scheduler::read_state(&*self.kv).await?.1.jobs)
    }

    /// The job with id `id`.
    pub async fn job(&self, id: &str) -> Result<JobRecord, ClientError> {
        self.list()
            .await?
            .into_iter()
            .find(|j| j.id == id)
            .ok_or_else(|| ClientError::NoSuchJob(id.to_owned()))
    }

    /// Asks the scheduler to stop the job and free its devices.
    pub async fn cancel(&self, id: &str) -> Result<(), ClientError> {
        Ok(scheduler::cancel(&*self.kv, id).await?)
    }

    /// The job's state changes and reports from its beginning, then live.
    /// Ends when the job has ended (after its last event).
    pub async fn events(
        &self,
        id: &str,
    ) -> Result<Pin<Box<dyn Stream<Item = Result<JobUpdate, ClientError>> + Send>>, ClientError>
    {
        self.job(id).await?;
        let states = self
            .watch(
                &Series::Events.prefix(id),
                "watching the job's events",
                |v| {
                    postcard::from_bytes::<JobEvent>(v)
                        .map(JobUpdate::State)
                        .map_err(|e| e.to_string())
                },
            )
            .await?;
        let reports = self
            .watch(
                &Series::Reports.prefix(id),
                "watching the job's reports",
                |v| {
                    serde_json::from_slice::<StepReport>(v)
                        .map(JobUpdate::Report)
                        .map_err(|e| e.to_string())
                },
            )
            .await?;
        let merged = Box::pin(futures::stream::select(states, reports));
        // Ends right after the terminal state change.
        let merged = futures::stream::unfold((merged, false), |(mut s, ended)| async move {
            if ended {
                return None;
            }
            let item = s.next().await?;
            let end = matches!(&item, Ok(JobUpdate::State(e)) if e.to.is_terminal());
            Some((item, (s, end)))
        });
        Ok(Box::pin(merged))
    }

    /// Every put under `prefix` from the oldest retained revision on,
    /// decoded; deletions are skipped.
    async fn watch(
        &self,
        prefix: &str,
        context: &'static str,
        decode: fn(&[u8]) -> Result<JobUpdate, String>,
    ) -> Result<impl Stream<Item = Result<JobUpdate, ClientError>>, ClientError> {
        let events = self
            .kv
            .watch(prefix.as_bytes(), 0)
            .await
            .map_err(kv_err(context))?;
        Ok(events.filter_map(move |ev| async move {
            match ev {
                Ok(Event::Put(p)) => Some(decode(&p.value).map_err(ClientError::Decode)),
                Ok(Event::Delete { .. }) => None,
                Err(e) => Some(Err(kv_err(context)(e))),
            }
        }))
    }

    /// Waits until the job has ended; returns its final record.
    pub async fn wait(&self, id: &str) -> Result<JobRecord, ClientError> {
        loop {
            let j = self.job(id).await?;
            if j.state.is_terminal() {
                return Ok(j);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What every process of the job's current attempt published when its
    /// plan finished (timings, last report), by process index.
    pub async fn results(&self, id: &str) -> Result<Vec<ProcessResult>, ClientError> {
        let job = self.job(id).await?;
        let published = tessel_coordinator::attempt::published(&*self.kv, &job.instance()).await?;
        let mut results: Vec<ProcessResult> = published
            .values(tessel_coordinator::attempt::Record::Result)
            .map(|(_, v)| serde_json::from_slice(v).map_err(|e| ClientError::Decode(e.to_string())))
            .collect::<Result<_, _>>()?;
        results.sort_by_key(|r| r.process);
        Ok(results)
    }

    /// The final value of an array the job's plan wrote, gathered.
    pub async fn fetch(&self, id: &str, array: &str) -> Result<HostBuffer, ClientError> {
        let value = Records::new(&*self.kv, id)
            .get(Item::Array(array))
            .await
            .map_err(kv_err("reading the array"))?;
        match value {
            Some(bytes) => {
                crate::array::read_npy(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
            }
            // Which of the job or the array is missing, or too early.
            None if !self.job(id).await?.state.is_terminal() => Err(ClientError::NotFinished {
                job: id.to_owned(),
                state: self.job(id).await?.state.name(),
            }),
            None => Err(ClientError::NoSuchArray {
                job: id.to_owned(),
                array: array.to_owned(),
            }),
        }
    }

    /// The logs of a command job's attempt (default: its current one), in
    /// order per process, from chunk `after[p] + 1` on for process `p`
    /// (everything kept, when absent); the attempt read.
    pub async fn logs(
        &self,
        id: &str,
        attempt: Option<u32>,
        process: Option<u32>,
        after: &BTreeMap<u32, u64>,
    ) -> Result<(u32, Vec<LogChunk>), ClientError> {
        let attempt = match attempt {
            Some(a) => a,
            None => self.job(id).await?.attempt,
        };
        let chunks: Vec<LogChunk> = Records::new(&*self.kv, id)
            .logs(attempt, process)
            .await
            .map_err(kv_err("reading the job's logs"))?
            .into_iter()
            .filter(|l| after.get(&l.process).is_none_or(|&last| l.seq > last))
            .map(|l| LogChunk {
                process: l.process,
                seq: l.seq,
                text: String::from_utf8_lossy(&l.bytes).into_owned(),
            })
            .collect();
        Ok((attempt, chunks))
    }

    /// The job's step reports so far, in step order.
    pub async fn reports(&self, id: &str) -> Result<Vec<StepReport>, ClientError> {
        Records::new(&*self.kv, id)
            .reports()
            .await
            .map_err(kv_err("reading the job's reports"))?
            .iter()
            .map(|(_, v)| serde_json::from_slice(v).map_err(|e| ClientError::Decode(e.to_string())))
            .collect()
    }

    /// The job's attempts so far, oldest first, each with how it ended (a
    /// failure's kind, or a planned move), from its events.
    pub async fn attempts(&self, id: &str) -> Result<Vec<scheduler::Attempt>, ClientError> {
        let events: Vec<JobEvent> = Records::new(&*self.kv, id)
            .events()
            .await
            .map_err(kv_err("reading the job's events"))?
            .iter()
            .map(|(_, v)| postcard::from_bytes(v).map_err(|e| ClientError::Decode(e.to_string())))
            .collect::<Result<_, _>>()?;
        Ok(scheduler::attempts(&events))
    }

    /// The first failure of attempt `attempt` (from 1) of job `id`.
    pub async fn failure(
        &self,
        id: &str,
        attempt: u32,
    ) -> Result<Option<tessel_coordinator::JobFailure>, ClientError> {
        let instance = scheduler::instance(id, attempt);
        Ok(tessel_coordinator::jobs::failure_of(&*self.kv, &instance).await?)
    }

    /// Every registered worker: its record, liveness and drain.
    pub async fn workers(&self) -> Result<Vec<tessel_coordinator::WorkerStatus>, ClientError> {
        Ok(tessel_coordinator::registry::list_workers(&*self.kv).await?)
    }
}
