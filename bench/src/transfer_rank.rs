//! `tessel-bench transfer-rank` (hidden): one rank of a transfer group driven
//! over stdin/stdout, for the multi-process tests and `tessel-bench
//! transfer`.
//!
//! Protocol (one JSON value per line):
//! 1. The rank binds port 0 and prints `{"rank":R,"addr":"IP:PORT","boot_id":"…"}`.
//! 2. It reads the group: `[{"addr":"…","boot_id":"…"}, …]` in rank order.
//! 3. It then runs one [`RankCommand`] per line and answers each with
//!    `{"ok":true,"sha256":"…","ms":[…],"cpu_ms":[…]}` (the digest of the
//!    last result; the wall time of every repetition, and the CPU time this
//!    process spent in it) or `{"ok":false,"error":"…"}`.
//!    Inputs come from `tessel_transfer::testing::pattern(dtype, count,
//!    rank, seed)`, so the driver can compute the expected digest itself.
//!    End of input ends the process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use tessel::pjrt::ElementType;
use tessel_tls::TlsFiles;
use tessel_transfer::testing::pattern;
use tessel_transfer::{
    CollectiveConfig, Communicator, Encryption, Peer, ReduceOp, TransferConfig, TransferEndpoint,
};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::tcp_ring::TcpRing;

/// `tessel-bench transfer-rank`: one rank of a transfer benchmark group, driven by JSON commands on stdin.
#[derive(Args)]
pub struct TransferRankArgs {
    /// This rank's index in the group.
    #[arg(long)]
    pub rank: u32,
    /// The cluster's TLS folder (`tessel certs init`).
    #[arg(long, conflicts_with = "insecure")]
    pub tls_dir: Option<PathBuf>,
    /// Plain QUIC without TLS (benchmarks on one host only).
    #[arg(long)]
    pub insecure: bool,
    /// Use the network even to ranks on this host.
    #[arg(long)]
    pub force_network: bool,
    /// Deadline of each collective.
    #[arg(long, default_value_t = 60_000)]
    pub timeout_ms: u64,
    /// Largest message of a ring step.
    #[arg(long, default_value_t = 4 << 20)]
    pub chunk_bytes: usize,
    /// Keep collectives between ranks of this host on the ring instead
    /// of shared-memory arenas.
    #[arg(long)]
    pub no_arenas: bool,
    /// `off`: network payloads over data channels of plain TCP, set up
    /// over mutual TLS (`on`: sealed data channels).
    #[arg(long, value_name = "on|off", default_value_t = Encryption::On)]
    pub transfer_encryption: Encryption,
    /// Encrypted network payloads on QUIC streams instead of sealed data
    /// channels (`TransferConfig::quic_payloads`: the path before them).
    #[arg(long)]
    pub quic_payloads: bool,
}

/// A member of the group as the driver passes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankAddress {
    /// The rank's transfer address.
    pub addr: SocketAddr,
    /// The rank's boot id (ranks that share one may share memory).
    pub boot_id: Option<String>,
}

/// One command (the tag is `op`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RankCommand {
    /// Ring all-reduce of `count` elements of pattern data.
    AllReduce {
        /// sum, mean, max or min.
        reduce: String,
        /// The element type.
        dtype: String,
        /// Elements per rank.
        count: usize,
        /// Seed of the pattern data.
        seed: u64,
        /// Calls timed.
        #[serde(default = "one")]
        repeat: u32,
        /// A barrier after every rank wrote its input and before the
        /// clock starts, so that a call's time is the collective's and not
        /// the skew of ranks still writing inputs on shared cores.
        #[serde(default)]
        barrier: bool,
        /// Through `Communicator::all_reduce_in_place` on a buffer from
        /// `Communicator::buffer`, which the input is written into.
        #[serde(default)]
        in_place: bool,
    },
    /// The same ring all-reduce over plain TCP between the ranks
    /// (`tcp_ring` module): `repeat` calls, each after a barrier, on
    /// connections set up once per command.
    TcpRingAllReduce {
        /// sum, mean, max or min.
        reduce: String,
        /// The element type.
        dtype: String,
        /// Elements per rank.
        count: usize,
        /// Seed of the pattern data.
        seed: u64,
        /// Calls timed.
        #[serde(default = "one")]
        repeat: u32,
    },
    /// Reduce-scatter of `count` elements.
    ReduceScatter {
        /// sum, mean, max or min.
        reduce: String,
        /// The element type.
        dtype: String,
        /// Elements per rank.
        count: usize,
        /// Seed of the pattern data.
        seed: u64,
    },
    /// All-gather of `count` elements from each rank.
    AllGather {
        /// The element type.
        dtype: String,
        /// Elements per rank.
        count: usize,
        /// Seed of the pattern data.
        seed: u64,
    },
    /// Broadcast of `count` elements from `root`.
    Broadcast {
        /// The rank that sends.
        root: u32,
        /// The element type.
        dtype: String,
        /// Elements.
        count: usize,
        /// Seed of the pattern data.
        seed: u64,
    },
    /// A barrier of the whole group.
    Barrier,
    /// `repeat` arrays of `count` elements to rank `to` on tags
    /// `tag..tag+repeat`, up to 64 at a time; array i is pattern(i, seed).
    /// The digest is of the concatenation sent.
    Send {
        /// The receiving rank.
        to: u32,
        /// The first tag.
        tag: u64,
        /// The element type.
        dtype: String,
        /// Elements per array.
        count: usize,
        /// Seed of the pattern data.
        seed: u64,
        /// Arrays sent.
        #[serde(default = "one")]
        repeat: u32,
    },
    /// Receives what the matching `send` sent, checks dtype and shape, and
    /// digests the concatenation.
    Recv {
        /// The sending rank.
        from: u32,
        /// The first tag.
        tag: u64,
        /// The element type.
        dtype: String,
        /// Elements per array.
        count: usize,
        /// Arrays received.
        #[serde(default = "one")]
        repeat: u32,
    },
}

fn one() -> u32 {
    1
}

/// Runs the rank until stdin closes: one JSON result line per command.
pub async fn run(args: TransferRankArgs) -> Result<()> {
    let tls = match (&args.tls_dir, args.insecure) {
        (Some(dir), _) => Some(TlsFiles::load(dir)?),
        (None, true) => None,
        (None, false) => bail!("pass --tls-dir DIR, or --insecure"),
    };
    let boot_id = tessel_worker::HostFacts::read().boot_id;
    let cfg = TransferConfig {
        boot_id: Some(boot_id.clone()),
        force_network: args.force_network,
        encryption: args.transfer_encryption,
        quic_payloads: args.quic_payloads,
        job: "transfer-rank".into(),
        ..TransferConfig::default()
    };
    let endpoint = Arc::new(TransferEndpoint::bind(
        "127.0.0.1:0".parse()?,
        args.rank,
        tls.as_ref(),
        cfg,
    )?);
    println!(
        "{}",
        serde_json::json!({"rank": args.rank, "addr": endpoint.local_addr()?.to_string(), "boot_id": boot_id})
    );
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let group: Vec<RankAddress> = serde_json::from_str(
        &lines
            .next_line()
            .await?
            .context("stdin closed before the group")?,
    )
    .context("the group line")?;
    let members: Vec<Peer> = group
        .iter()
        .map(|m| Peer::new(m.addr, m.boot_id.clone()))
        .collect();
    let mut comm = Communicator::new(
        endpoint.clone(),
        members.clone(),
        1,
        CollectiveConfig {
            timeout: Duration::from_millis(args.timeout_ms),
            chunk_bytes: args.chunk_bytes,
            arenas: !args.no_arenas,
            ..CollectiveConfig::default()
        },
    )?;
    let timeout = Duration::from_millis(args.timeout_ms);
    while let Some(line) = lines.next_line().await? {
        let answer = match serde_json::from_str::<RankCommand>(&line) {
            Ok(cmd) => {
                let at = Place {
                    endpoint: &endpoint,
                    members: &members,
                    rank: args.rank,
                    timeout,
                    chunk_bytes: args.chunk_bytes,
                };
                execute(&mut comm, &at, cmd).await
            }
            Err(e) => Err(anyhow::anyhow!("bad command {line:?}: {e}")),
        };
        let json = match answer {
            Ok((digest, laps)) => serde_json::json!({
                "ok": true, "sha256": digest, "ms": laps.ms, "cpu_ms": laps.cpu_ms
            }),
            Err(e) => serde_json::json!({"ok": false, "error": format!("{e:#}")}),
        };
        println!("{json}");
    }
    Ok(())
}

fn dtype(name: &str) -> Result<ElementType> {
    ElementType::parse(name).with_context(|| format!("unknown dtype {name:?}"))
}

fn op(name: &str) -> Result<ReduceOp> {
    ReduceOp::parse(name).with_context(|| format!("unknown reduction {name:?}"))
}

/// When a timed section started, on the wall clock and in this process's
/// CPU time (all its threads, user and kernel).
#[derive(Clone, Copy)]
struct Stopwatch {
    wall: Instant,
    cpu: Duration,
}

impl Stopwatch {
    fn start() -> Stopwatch {
        Stopwatch {
            wall: Instant::now(),
            cpu: process_cpu_time(),
        }
    }
}

fn process_cpu_time() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// Every repetition's wall and CPU milliseconds.
#[derive(Default)]
struct Laps {
    ms: Vec<f64>,
    cpu_ms: Vec<f64>,
}

impl Laps {
    fn lap(&mut self, since: Stopwatch) {
        self.ms.push(since.wall.elapsed().as_secs_f64() * 1e3);
        let cpu = process_cpu_time().saturating_sub(since.cpu);
        self.cpu_ms.push(cpu.as_secs_f64() * 1e3);
    }
}

/// Where a command runs: this rank and its group.
struct Place<'a> {
    endpoint: &'a TransferEndpoint,
    members: &'a [Peer],
    rank: u32,
    timeout: Duration,
    chunk_bytes: usize,
}

async fn execute(
    comm: &mut Communicator,
    at: &Place<'_>,
    cmd: RankCommand,
) -> Result<(String, Laps)> {
    let Place {
        endpoint,
        members,
        rank,
        timeout,
        chunk_bytes,
    } = *at;
    let digest = tessel_topology::sha256_hex;
    let mut laps = Laps::default();
    let mut timed = Stopwatch::start();
    let out = match cmd {
        RankCommand::AllReduce {
            reduce,
            dtype: t,
            count,
            seed,
            repeat,
            barrier,
            in_place,
        } => {
            let (op, t) = (op(&reduce)?, dtype(&t)?);
            let mut buf = in_place.then(|| comm.buffer(count * t.size()));
            let mut last = Vec::new();
            for _ in 0..repeat.max(1) {
                let input = pattern(t, count, rank, seed);
                if let Some(buf) = &mut buf {
                    buf.as_mut_slice().copy_from_slice(&input);
                }
                if barrier {
                    comm.barrier().await?;
                }
                timed = Stopwatch::start();
                match &mut buf {
                    Some(buf) => comm.all_reduce_in_place(op, t, buf).await?,
                    None => last = comm.all_reduce(op, t, input).await?,
                }
                laps.lap(timed);
            }
            match buf {
                Some(buf) => buf.as_slice().to_vec(),
                None => last,
            }
        }
        RankCommand::TcpRingAllReduce {
            reduce,
            dtype: t,
            count,
            seed,
            repeat,
        } => {
            let (op, t) = (op(&reduce)?, dtype(&t)?);
            let mut ring = TcpRing::connect(endpoint, members, rank as usize, timeout).await?;
            let mut data = Vec::new();
            for _ in 0..repeat.max(1) {
                data = pattern(t, count, rank, seed);
                comm.barrier().await?;
                timed = Stopwatch::start();
                let done;
                (ring, data, done) = tokio::task::spawn_blocking(move || {
                    let done = ring.all_reduce(op, t, &mut data, chunk_bytes);
                    (ring, data, done)
                })
                .await?;
                done?;
                laps.lap(timed);
            }
            data
        }
        RankCommand::ReduceScatter {
            reduce,
            dtype: t,
            count,
            seed,
        } => {
            let (op, t) = (op(&reduce)?, dtype(&t)?);
            let out = comm
                .reduce_scatter(op, t, pattern(t, count, rank, seed))
                .await?;
            laps.lap(timed);
            out
        }
        RankCommand::AllGather {
            dtype: t,
            count,
            seed,
        } => {
            let t = dtype(&t)?;
            let out = comm.all_gather(t, &pattern(t, count, rank, seed)).await?;
            laps.lap(timed);
            out
        }
        RankCommand::Broadcast {
            root,
            dtype: t,
            count,
            seed,
        } => {
            let t = dtype(&t)?;
            let input = if rank == root {
                pattern(t, count, rank, seed)
            } else {
                vec![0; count * t.size()]
            };
            let out = comm.broadcast(root, t, input).await?;
            laps.lap(timed);
            out
        }
        RankCommand::Barrier => {
            comm.barrier().await?;
            laps.lap(timed);
            Vec::new()
        }
        RankCommand::Send {
            to,
            tag,
            dtype: t,
            count,
            seed,
            repeat,
        } => {
            let t = dtype(&t)?;
            let peer = members.get(to as usize).context("no such rank")?;
            let dims = [count as u64];
            let arrays: Vec<Vec<u8>> = (0..repeat).map(|i| pattern(t, count, i, seed)).collect();
            timed = Stopwatch::start();
            for (b, batch) in arrays.chunks(64).enumerate() {
                let sends = batch.iter().enumerate().map(|(k, data)| {
                    let i = (b * 64 + k) as u64;
                    endpoint.send_to(peer, tag + i, t, &dims, data, timeout)
                });
                futures::future::try_join_all(sends).await?;
            }
            laps.lap(timed);
            arrays.concat()
        }
        RankCommand::Recv {
            from,
            tag,
            dtype: t,
            count,
            repeat,
        } => {
            let t = dtype(&t)?;
            let mut all = Vec::new();
            timed = Stopwatch::start();
            for i in 0..repeat {
                let got = endpoint.recv(from, tag + u64::from(i), timeout).await?;
                if got.dtype != t || got.dims != [count as u64] {
                    bail!(
                        "array {i}: {}{:?}, expected {}[{count}]",
                        got.dtype.name(),
                        got.dims,
                        t.name()
                    );
                }
                if all.is_empty() {
                    all = got.data;
                } else {
                    all.extend_from_slice(&got.data);
                }
            }
            laps.lap(timed);
            all
        }
    };
    Ok((digest(&out), laps))
}
