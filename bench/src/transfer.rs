//! `tessel-bench transfer`: point-to-point throughput between two processes
//! on loopback, tessel's transfer endpoint (sealed data channels, and
//! QUIC streams) against a plain TCP stream in the same run.
//!
//! This process receives; a child `tessel-bench transfer --send-to …`
//! sends `--bytes` `--repeat` times over each path. Throughput is measured
//! on the receiving side, from the first byte of a transfer to its last.
//!
//! Then the all-reduce: `--ranks` groups of `tessel-bench transfer-rank`
//! processes, each path (network: sealed data channels between all ranks,
//! TCP in AES-128-GCM records keyed from the mutual-TLS session, the
//! default; network-quic: the same bytes on QUIC streams, the path before;
//! network-plain: the unencrypted data plane, data channels of plain TCP
//! (`--transfer-encryption off`); shm: shared-memory
//! arenas; shm-in-place: the same on buffers that live in shared memory,
//! which the input is written into, through `all_reduce_in_place`;
//! shm-ring: the ring with its chunks lent through shared memory; tcp-ring:
//! the same ring over plain TCP, the floor under the network path),
//! `--all-reduce-bytes` of f32 summed `--repeat` times after one warm-up,
//! each call after a barrier that follows every rank's writing of its
//! input. A call's time is the slowest rank's. Every path's result must
//! equal the others' bit for bit (they share one reduction order), or the
//! bench fails;
//! algorithm bandwidth is bytes / time, bus bandwidth that × 2(n−1)/n (the
//! bytes each rank moves in a ring, as nccl-tests reports it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use tessel::pjrt::ElementType;
use tessel_tls::{init_certs, TlsFiles};
use tessel_transfer::{TransferConfig, TransferEndpoint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `tessel-bench transfer`: collectives and point-to-point over the transfer layer.
#[derive(Args)]
pub struct BenchTransferArgs {
    /// Bytes per transfer.
    #[arg(long, default_value_t = 1 << 30)]
    pub bytes: u64,
    /// Transfers per path (the best and the median are reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// Bytes of f32 per all-reduce (0 skips the all-reduce figures).
    #[arg(long, default_value_t = 64 << 20)]
    pub all_reduce_bytes: u64,
    /// Group sizes for the all-reduce.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    pub ranks: Vec<usize>,
    /// Paths for the all-reduce: `network` (sealed data channels even
    /// between processes of this host), `network-quic` (encrypted payloads
    /// on QUIC streams), `shm` (shared-memory arenas), `shm-in-place`
    /// (arenas, on buffers in shared memory: `all_reduce_in_place`),
    /// `shm-ring` (the ring, its chunks lent through shared memory) and
    /// `tcp-ring` (the ring over plain TCP: no encryption, no framing, no
    /// copy but the kernel's; the floor under `network`), `network-plain`
    /// (the unencrypted data plane: `--transfer-encryption off`).
    #[arg(long, value_delimiter = ',', default_value = "network,network-quic,network-plain,tcp-ring,shm,shm-in-place,shm-ring", value_parser = ["network", "network-quic", "network-plain", "tcp-ring", "shm", "shm-in-place", "shm-ring"])]
    pub paths: Vec<String>,
    /// Largest message of a ring step (the collectives' chunk size).
    #[arg(long, default_value_t = 4 << 20)]
    pub chunk_bytes: usize,
    /// Also time JAX's all-reduce (CPU, gloo; `pmap` + `psum` across
    /// processes) for the same sizes with this Python, which must have
    /// `jax` installed.
    #[arg(long, value_name = "PYTHON")]
    pub jax: Option<PathBuf>,
    /// Connections per peer for the QUIC point-to-point figure, one line
    /// each (a payload travels as one part per connection).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub connections: Vec<usize>,
    /// Skip the point-to-point figures.
    #[arg(long)]
    pub no_point_to_point: bool,
    /// (internal) Run as the sender: QUIC address, TCP address, TLS folder.
    #[arg(long, hide = true, num_args = 3, value_names = ["QUIC", "TCP", "TLS"])]
    pub send_to: Option<Vec<String>>,
}

const T: Duration = Duration::from_secs(600);

/// Runs the benchmark and prints its table.
pub async fn run(args: BenchTransferArgs) -> Result<()> {
    if let Some(to) = &args.send_to {
        return sender(&args, to).await;
    }
    aead_throughput(args.repeat)?;
    if !args.no_point_to_point {
        point_to_point(&args).await?;
    }
    if args.all_reduce_bytes > 0 {
        for &n in &args.ranks {
            let mut first: Option<(&str, String)> = None;
            for path in &args.paths {
                let digest = all_reduce(&args, n, path)?;
                match &first {
                    None => first = Some((path, digest)),
                    Some((p, d)) => anyhow::ensure!(
                        *d == digest,
                        "{n} ranks: the {path} path's result differs from the {p} path's"
                    ),
                }
            }
            if let Some(python) = &args.jax {
                jax_all_reduce(&args, python, n)?;
            }
        }
    }
    Ok(())
}

/// Times one path; returns the digest of its result.
fn all_reduce(args: &BenchTransferArgs, n: usize, path: &str) -> Result<String> {
    use crate::rank_group::{RankGroup, RankOptions};
    anyhow::ensure!(n >= 1, "--ranks: at least 1");
    let count = (args.all_reduce_bytes / 4) as usize;
    let opts = RankOptions {
        force_network: matches!(
            path,
            "network" | "network-quic" | "network-plain" | "tcp-ring"
        ),
        plain: path == "network-plain",
        quic_payloads: path == "network-quic",
        no_arenas: path == "shm-ring",
        timeout_ms: Some(T.as_millis() as u64),
        chunk_bytes: Some(args.chunk_bytes),
        ..RankOptions::default()
    };
    let mut g = RankGroup::start(&std::env::current_exe()?, n, &opts)?;
    let op = match path {
        "tcp-ring" => "tcp_ring_all_reduce",
        _ => "all_reduce",
    };
    let cmd = |repeat: u32| {
        serde_json::json!({"op": op, "reduce": "sum", "dtype": "f32",
                           "count": count, "seed": 1, "repeat": repeat, "barrier": true,
                           "in_place": path == "shm-in-place"})
    };
    // Every rank's wall and CPU times, and the digest all ranks agree on.
    type Times = Vec<Vec<f64>>;
    let check = |answers: Vec<serde_json::Value>| -> Result<(Times, Times, String)> {
        let digest = answers[0]["sha256"].as_str().unwrap_or_default().to_owned();
        let (mut ms, mut cpu) = (Vec::new(), Vec::new());
        for a in answers {
            anyhow::ensure!(a["ok"] == true, "all-reduce failed: {a}");
            anyhow::ensure!(a["sha256"] == digest.as_str(), "ranks disagree: {a}");
            ms.push(serde_json::from_value(a["ms"].clone())?);
            cpu.push(serde_json::from_value(a["cpu_ms"].clone())?);
        }
        Ok((ms, cpu, digest))
    };
    check(g.all(&cmd(1), T)?)?;
    let (per_rank, cpu, digest) = check(g.all(&cmd(args.repeat), T)?)?;
    report_all_reduce(n, path, count * 4, &per_rank, Some(&cpu));
    Ok(digest)
}

/// What encryption alone costs: AES-128-GCM (the cipher the endpoints
/// offer first) from `ring`, the library rustls uses under QUIC, sealing
/// and opening 64 MiB in place, one record per datagram of the sizes QUIC
/// sends (loopback's 65,527 bytes, Ethernet's 1,452), in this process on
/// one core. Every byte of the network path is sealed once and opened
/// once, so this bounds it from below.
fn aead_throughput(repeat: u32) -> Result<()> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
    const TAG: usize = 16;
    const TOTAL: usize = 64 << 20;
    let key = LessSafeKey::new(
        UnboundKey::new(&AES_128_GCM, &[7; 16]).map_err(|_| anyhow::anyhow!("AES key"))?,
    );
    let nonce = |i: usize| {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&(i as u64).to_be_bytes());
        Nonce::assume_unique_for_key(n)
    };
    for record in [65_527usize, 1_452] {
        let records = TOTAL / record;
        let mut buf: Vec<u8> = (0..records * (record + TAG)).map(|i| i as u8).collect();
        let (mut seal, mut open) = (Vec::new(), Vec::new());
        for _ in 0..repeat.max(1) {
            let t = Instant::now();
            for (i, slot) in buf.chunks_exact_mut(record + TAG).enumerate() {
                let (text, tag) = slot.split_at_mut(record);
                let sealed = key
                    .seal_in_place_separate_tag(nonce(i), Aad::empty(), text)
                    .map_err(|_| anyhow::anyhow!("seal"))?;
                tag.copy_from_slice(sealed.as_ref());
            }
            seal.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            for (i, slot) in buf.chunks_exact_mut(record + TAG).enumerate() {
                key.open_in_place(nonce(i), Aad::empty(), slot)
                    .map_err(|_| anyhow::anyhow!("open: record {i} does not authenticate"))?;
            }
            open.push(t.elapsed().as_secs_f64());
        }
        let gbps = |mut secs: Vec<f64>| {
            secs.sort_by(f64::total_cmp);
            (records * record) as f64 / secs[secs.len() / 2] / 1e9
        };
        println!(
            "{{\"figure\":\"aead\",\"cipher\":\"AES-128-GCM\",\"record_bytes\":{record},\"bytes\":{},\"seal_gb_s\":{:.2},\"open_gb_s\":{:.2}}}",
            records * record,
            gbps(seal),
            gbps(open)
        );
    }
    Ok(())
}

/// One JAX process (bench/jax/allreduce.py, embedded).
const JAX_SCRIPT: &str = include_str!("../jax/allreduce.py");

fn jax_all_reduce(args: &BenchTransferArgs, python: &std::path::Path, n: usize) -> Result<()> {
    let count = args.all_reduce_bytes / 4;
    let extra = [count.to_string(), args.repeat.to_string()];
    let lines = crate::jax::run_group(python, JAX_SCRIPT, n as u32, &extra)?;
    // The fair peer (its input on the device once), then the same with a
    // fresh host input every call (the script's docstring).
    for (field, path) in [("ms", "jax_gloo"), ("ms_host_input", "jax_gloo_host_input")] {
        let per_rank: Vec<Vec<f64>> = lines
            .iter()
            .map(|v| Ok(serde_json::from_value(v[field].clone())?))
            .collect::<Result<_>>()?;
        report_all_reduce(n, path, count as usize * 4, &per_rank, None);
    }
    Ok(())
}

/// One JSON line: per call the slowest rank's time, best and median of
/// the calls, algorithm and bus bandwidth at the median; with `cpu`, the
/// median over calls of the CPU time all ranks' processes spent in a call
/// (user and system; the kernel's softirq work on loopback packets is
/// accounted apart and not in it).
fn report_all_reduce(
    n: usize,
    path: &str,
    bytes: usize,
    per_rank: &[Vec<f64>],
    cpu: Option<&[Vec<f64>]>,
) {
    let per_call = |per_rank: &[Vec<f64>], fold: fn(f64, f64) -> f64| -> Vec<f64> {
        let calls = per_rank.iter().map(Vec::len).min().unwrap_or(0);
        let mut v: Vec<f64> = (0..calls)
            .map(|i| per_rank.iter().map(|r| r[i]).fold(0.0, fold))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let ms = per_call(per_rank, f64::max);
    if ms.is_empty() {
        return;
    }
    let (best, median) = (ms[0], ms[ms.len() / 2]);
    let algbw = bytes as f64 / (median / 1e3) / 1e9;
    let cpu = cpu
        .map(|c| per_call(c, |a, b| a + b))
        .filter(|c| !c.is_empty())
        .map(|c| format!(",\"cpu_ms\":{:.1}", c[c.len() / 2]))
        .unwrap_or_default();
    println!(
        "{{\"figure\":\"all_reduce\",\"ranks\":{n},\"path\":\"{path}\",\"dtype\":\"f32\",\"bytes\":{bytes},\"runs\":{},\"best_ms\":{best:.1},\"median_ms\":{median:.1},\"algbw_gb_s\":{algbw:.2},\"busbw_gb_s\":{:.2}{cpu}}}",
        ms.len(),
        algbw * 2.0 * (n as f64 - 1.0) / n as f64
    );
}

/// The point-to-point runs of the endpoint, in the order both sides take
/// them: each connection count over sealed data channels (the default),
/// then over QUIC streams (`quic_payloads`); (name, quic_payloads,
/// connections).
fn p2p_runs(connections: &[usize]) -> Vec<(&'static str, bool, usize)> {
    [("sealed", false), ("quic", true)]
        .into_iter()
        .flat_map(|(name, quic)| connections.iter().map(move |&k| (name, quic, k)))
        .collect()
}

async fn point_to_point(args: &BenchTransferArgs) -> Result<()> {
    let dir = tessel_harness::scratch::scratch_dir("benchtransfer")?;
    let tls_dir = dir.path().join("tls");
    init_certs(&tls_dir, &["127.0.0.1".into()])?;
    let tls = TlsFiles::load(&tls_dir)?;
    let quic = TransferEndpoint::bind(
        "127.0.0.1:0".parse()?,
        0,
        Some(&tls),
        TransferConfig::default(),
    )?;
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["transfer", "--bytes", &args.bytes.to_string()])
        .args(["--all-reduce-bytes", "0"])
        .args(["--repeat", &args.repeat.to_string()])
        .args([
            "--connections",
            &connections_arg(&args.connections)?,
            "--send-to",
        ])
        .arg(quic.local_addr()?.to_string())
        .arg(tcp.local_addr()?.to_string())
        .arg(&tls_dir)
        .spawn()
        .context("starting the sender")?;

    let runs = p2p_runs(&args.connections);
    let mut endpoint_s = Vec::new();
    for _ in &runs {
        let mut secs = Vec::new();
        for _ in 0..args.repeat {
            // The sender's first bytes arrive with its header: time from the
            // moment the array is in the mailbox backwards is not possible,
            // so the sender sends a marker first (its endpoint's address)
            // and we time from it.
            let marker = quic.recv(1, 0, T).await?;
            let t = Instant::now();
            let got = quic.recv(1, 1, T).await?;
            secs.push(t.elapsed().as_secs_f64());
            anyhow::ensure!(got.data.len() as u64 == args.bytes, "short transfer");
            // Both paths receive into memory already faulted in after the
            // first run: the TCP path reads into one buffer, QUIC reuses the
            // last, which it must have back before the next payload's header
            // comes (else that payload gets fresh pages), so the sender
            // waits for word that it has.
            quic.recycle(got.data);
            let sender: SocketAddr = std::str::from_utf8(&marker.data)?.parse()?;
            quic.send(sender, 2, ElementType::U8, &[1], &[1], T).await?;
        }
        endpoint_s.push(secs);
    }
    let (mut stream, _) = tcp.accept().await?;
    stream.set_nodelay(true)?;
    let mut tcp_s = Vec::new();
    let mut buf = vec![0u8; args.bytes as usize];
    for _ in 0..args.repeat {
        let mut marker = [0u8; 1];
        stream.read_exact(&mut marker).await?;
        let t = Instant::now();
        stream.read_exact(&mut buf).await?;
        tcp_s.push(t.elapsed().as_secs_f64());
    }
    let _ = child.wait();
    let endpoint = runs
        .iter()
        .zip(endpoint_s)
        .map(|((name, _, k), secs)| (format!("\"path\":\"{name}\",\"connections\":{k}"), secs));
    for (path, mut secs) in endpoint.chain([("\"path\":\"tcp\"".to_owned(), tcp_s)]) {
        secs.sort_by(f64::total_cmp);
        let gbps = |s: f64| args.bytes as f64 / s / 1e9;
        println!(
            "{{\"figure\":\"point_to_point\",{path},\"bytes\":{},\"runs\":{},\"best_gb_s\":{:.2},\"median_gb_s\":{:.2}}}",
            args.bytes,
            secs.len(),
            gbps(secs[0]),
            gbps(secs[secs.len() / 2])
        );
    }
    Ok(())
}

fn connections_arg(connections: &[usize]) -> Result<String> {
    anyhow::ensure!(
        !connections.is_empty() && connections.iter().all(|&k| k >= 1),
        "--connections: one or more counts of at least 1"
    );
    Ok(connections
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(","))
}

async fn sender(args: &BenchTransferArgs, to: &[String]) -> Result<()> {
    let quic_to: SocketAddr = to[0].parse()?;
    let tcp_to: SocketAddr = to[1].parse()?;
    let tls = TlsFiles::load(&PathBuf::from(&to[2]))?;
    let data: Vec<u8> = (0..args.bytes).map(|i| i as u8).collect();
    // Every endpoint lives to the end: closing one could cut off its answer
    // to the receiver's last word.
    let mut endpoints = Vec::new();
    for (_, quic_payloads, k) in p2p_runs(&args.connections) {
        let cfg = TransferConfig {
            connections_per_peer: k,
            quic_payloads,
            ..TransferConfig::default()
        };
        let ep = TransferEndpoint::bind("127.0.0.1:0".parse()?, 1, Some(&tls), cfg)?;
        let me = ep.local_addr()?.to_string();
        for _ in 0..args.repeat {
            let marker = me.as_bytes();
            ep.send(
                quic_to,
                0,
                ElementType::U8,
                &[marker.len() as u64],
                marker,
                T,
            )
            .await?;
            ep.send(quic_to, 1, ElementType::U8, &[args.bytes], &data, T)
                .await?;
            ep.recv(0, 2, T).await?;
        }
        if let Some(st) = ep.connection_stats(quic_to).filter(|_| quic_payloads) {
            eprintln!(
                "quic sender, {k} connection(s), the first: path MTU {} B, {} datagrams in {} send calls ({} B each on average), {} lost packets, congestion window {} B",
                st.path.current_mtu,
                st.udp_tx.datagrams,
                st.udp_tx.ios,
                st.udp_tx.bytes / st.udp_tx.datagrams.max(1),
                st.path.lost_packets,
                st.path.cwnd
            );
        }
        endpoints.push(ep);
    }
    let mut s = tokio::net::TcpStream::connect(tcp_to).await?;
    s.set_nodelay(true)?;
    for _ in 0..args.repeat {
        s.write_all(&[1]).await?;
        s.write_all(&data).await?;
    }
    s.flush().await?;
    Ok(())
}
