//! `tessel` processes on this machine: the one harness that `tessel
//! local`, the benchmarks and the process-level tests start children
//! with.
//!
//! * [`Ready`]: the JSON line a daemon prints once it serves — the only
//!   thing a launcher reads from it.
//! * [`Child`]: one child process, killed when dropped, stdout read with
//!   deadlines.
//! * [`LocalCluster`]: coordinators and workers on loopback.
//!
//! # The modules in detail
//!
//! * **`tessel-harness`** (`harness/`) — the one process harness: `Child` (a
//!   `tessel` child process, killed when dropped, read through its readiness
//!   line), `LocalCluster` (coordinators and workers on loopback), `Ready` (the
//!   line itself, see Formats), `scratch` (temp folders, dead processes'
//!   swept). `tessel local`, the benchmarks, the example and chaos-tests use it.
//!
//! # Containers, health and identity
//!
//! * `scripts/image` imports a root file system with `docker import`: the
//!   stripped binary, the libraries `ldd` finds for it and for `setpriv` (and
//!   for baked plugins, under `/opt/tessel/plugins`, `TESSEL_PLUGIN_DIR`), the
//!   CA bundle, `/etc/passwd` with user 10001, `/data` and `/work`.
//! * `--metrics-listen` serves `/metrics`, `/healthz` (alive) and `/readyz`
//!   (`metrics_http::Readiness`: a replica that knows a leader, polled every
//!   250 ms; a worker whose registration watch holds a lease); `tessel
//!   health` is its client.
//! * `tessel_cli::identity` (pure, the environment passed in): a coordinator's
//!   replica id from `--id`, else `JOB_COMPLETION_INDEX`, a StatefulSet
//!   ordinal (only with `KUBERNETES_SERVICE_HOST`), or `SLURM_PROCID`, plus 1;
//!   a worker's id from `--worker-id`, its certificate, or the hostname.
//!   `env_peers` (`--peers-from-env`, every replica on `--listen`'s port):
//!   Kubernetes, `{HOSTNAME minus -INDEX}-{0..TESSEL_REPLICAS}` under
//!   `TESSEL_PEER_DOMAIN`; Slurm, the nodes of `SLURM_STEP_NODELIST` (else
//!   `SLURM_JOB_NODELIST`, `SLURM_NODELIST`) in order, refused unless each
//!   node runs one task and task i runs on node i (`SLURMD_NODENAME`).
//!   `identity::hostlist` expands Slurm's `tux[1-3,07-08]` notation (bounded
//!   to 65,536 names; fuzzed).
//! * A coordinator dials itself (its monitor and scheduler) on the loopback
//!   when bound to `0.0.0.0`, by its `--listen` name when given one (its
//!   certificate names the name, not the address it has today), else at its
//!   address.
//! * `deploy/compose/` (Compose: fixed addresses, everything dials the
//!   coordinators by DNS name, per-node certificates) and `helm/tessel/` (a
//!   StatefulSet with `--peers-from-env`: ids the ordinals + 1, peers the
//!   pods' stable names in a headless service with
//!   `publishNotReadyAddresses`; workers a StatefulSet per slice, in tessel's
//!   image or the user's with `tessel install` in an init container; one
//!   shared certificate naming the services' wildcard names and 127.0.0.1).
//! * libtpu: `tessel_pjrt::libtpu` sets `TPU_SKIP_MDS_QUERY=true` before any
//!   load of a `libtpu*.so` unless set; `worker::tpu` keeps the TPU variables
//!   the worker's environment had at start (the platform's) and builds only
//!   the others, from `--host-name`s exchanged under
//!   `jobs/{job}/processes/{i}/host`.
//! * A client created with `enable_mock_nccl` compiles with
//!   `xla_gpu_shard_autotuning=false` (`CompileOptions::overrides`, sent as
//!   `env_option_overrides`): sharded autotuning would wait for the mocked
//!   nodes' results.
//! * `tessel cluster status` exits 0 / 3 (a replica unreachable) / 4 (no
//!   agreed leader, or fewer than a majority of voters answering).
//! * `worker::reaper`: a worker that is PID 1 scans `/proc` every second and
//!   reaps zombie children it did not start itself once they linger across
//!   two scans (its own children are waited for by the gang).
//! * `HostFacts::boot_id` is `BOOT/shm-DEV`: containers of one machine share
//!   the kernel's boot id but not `/dev/shm`, and the transfer layer uses
//!   shared memory only between processes with equal ids.

mod child;
mod cluster;
mod ready;
pub mod scratch;

pub use child::{exit_with_parent, Child};
pub use cluster::LocalCluster;
pub use ready::Ready;

use std::time::Duration;

/// What starting or talking to a child can fail with.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// The child could not be started.
    #[error("starting {name}: {source}")]
    Spawn {
        /// The child's name.
        name: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The child printed no readiness line in time.
    #[error("{name} said nothing within {timeout:?}")]
    Silent {
        /// The child's name.
        name: String,
        /// How long it was given.
        timeout: Duration,
    },
    /// The child exited before it was ready.
    #[error("{name} exited ({status})")]
    Exited {
        /// The child's name.
        name: String,
        /// How it exited.
        status: String,
    },
    /// Writing to the child's stdin failed.
    #[error("writing to {name}: {source}")]
    Write {
        /// The child's name.
        name: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The child said something unexpected.
    #[error("{0}")]
    Protocol(String),
    /// Certificates could not be made or read.
    #[error("TLS: {0}")]
    Tls(String),
    /// A KV operation failed.
    #[error(transparent)]
    Kv(#[from] tessel_kv::KvError),
    /// A file or pipe failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
