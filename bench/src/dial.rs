//! `tessel-bench dial`: what a client connection costs, dialed against a
//! real 3-replica coordinator on loopback. N clients, each with a
//! connection of its own (on shared UDP sockets, as `bootstrap
//! --connection-per-host` gives them), make one read each, one after
//! another, and keep their connections open. Reported per connection: this
//! process's CPU and resident growth (the dialing side: the handshake and
//! the connection's state, which a redial allocates again) and the
//! replicas' together (the accepting side).

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use tessel_harness::LocalCluster;
use tessel_kv::KvStore;

use crate::simulated::{usage, KeepAlives};

/// `tessel-bench dial`: CPU and memory per client connection, both sides.
#[derive(Args)]
pub struct BenchDialArgs {
    /// Connections to dial.
    #[arg(long, default_value_t = 2000)]
    pub connections: usize,
}

/// Runs the benchmark and prints its line.
pub async fn run(args: BenchDialArgs) -> Result<()> {
    let n = args.connections.max(1);
    let mut cluster = LocalCluster::new(crate::tessel_bin()?)?;
    cluster.start_coordinators(3)?;
    // A leader elected and known before the clock starts.
    cluster.client()?.revision().await?;
    let replicas = cluster.coordinator_pids();
    let clients = KeepAlives::Stream.clients(&cluster, n)?;
    let replica_usage = || replicas.iter().map(|p| usage(*p)).collect::<Vec<_>>();
    let (own_before, replicas_before) = (usage(std::process::id()), replica_usage());
    let started = Instant::now();
    for c in &clients {
        c.revision().await?;
    }
    let elapsed = started.elapsed();
    let (own, replicas_now) = (usage(std::process::id()), replica_usage());
    let per = |v: u64| v as f64 / n as f64;
    let (replicas_cpu_ns, replicas_kib) = replicas_now
        .iter()
        .zip(&replicas_before)
        .map(|(a, b)| {
            (
                a.cpu_ns.saturating_sub(b.cpu_ns),
                a.rss_kib.saturating_sub(b.rss_kib),
            )
        })
        .fold((0, 0), |(c, k), (dc, dk)| (c + dc, k + dk));
    println!(
        "{{\"figure\":\"dial\",\"connections\":{n},\"us_per_connection\":{:.0},\"dialer_cpu_us\":{:.0},\"dialer_kib\":{:.1},\"replicas_cpu_us\":{:.0},\"replicas_kib\":{:.1}}}",
        elapsed.as_secs_f64() * 1e6 / n as f64,
        per(own.cpu_ns.saturating_sub(own_before.cpu_ns)) / 1e3,
        per(own.rss_kib.saturating_sub(own_before.rss_kib)),
        per(replicas_cpu_ns) / 1e3,
        per(replicas_kib),
    );
    Ok(())
}
