//! How long one durable (fsync'd) redb commit of a small log entry takes on
//! this machine: the floor under every replicated write, which openraft
//! appends (and each follower persists) before acknowledging.
//!
//!     cargo run --release -p tessel-kvstore --example redb_commit_latency

use std::time::Instant;

use redb::{Database, TableDefinition};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let db = Database::create(dir.path().join("bench.redb"))?;
    let entry = [0xabu8; 120];
    let mut lat = Vec::new();
    for i in 0..2000u64 {
        let t = Instant::now();
        let txn = db.begin_write()?;
        txn.open_table(LOG)?.insert(i, entry.as_slice())?;
        txn.commit()?;
        lat.push(t.elapsed());
    }
    lat.sort();
    let p = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    println!("{{\"figure\":\"redb_durable_commit\",\"ops\":{},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"commits_per_s\":{:.0}}}", lat.len(), p(0.5), p(0.99), 1.0 / (p(0.5) / 1e3));
    Ok(())
}
