//! How long one durable append of a small log entry takes on this machine,
//! for the two stores measured for the Raft log, in one run: a redb commit
//! with fsync (the store the log first used) and an append to
//! [`tessel_kv_service::raft::wal::Wal`] on its writer thread, the caller woken
//! by the flush callback, both ways it can write: direct (one `pwrite` of
//! whole blocks with `O_DIRECT | O_DSYNC`, the default) and buffered
//! (`pwrite` + `fdatasync`). Every replicated write waits for one on the
//! leader and one on a follower. Then both ways again after idle gaps of
//! 0–5 ms: on this project's virtual machine a sync
//! after the disk and the CPUs were idle takes several times longer, and
//! in a replicated write each disk idles while the other replica's sync
//! and the network round trip run (`blocking_get_wakeup` in `bench kv`
//! waits 5 ms before each write).
//!
//!     cargo run --release -p tessel-kv-service --example log_append_latency

use std::time::{Duration, Instant};

use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use redb::{Database, TableDefinition};
use tessel_kv::state::{Op, Request};
use tessel_kv_service::raft::wal::{LogIo, Wal};
use tessel_kv_service::raft::{Proposal, TypeConfig};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const APPENDS: u64 = 2000;

fn entry(i: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), i),
        payload: EntryPayload::Normal(Proposal::one(Request {
            now_ms: i,
            op: Op::Put {
                key: format!("bench/{i:08}").into_bytes(),
                value: vec![0xab; 64],
                lease: None,
            },
        })),
    }
}

fn report(figure: &str, mut lat: Vec<Duration>) {
    lat.sort();
    let p = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    println!(
        "{{\"figure\":\"{figure}\",\"ops\":{},\"p50_ms\":{:.3},\"p99_ms\":{:.3}}}",
        lat.len(),
        p(0.5),
        p(0.99)
    );
}

/// One durable append through the log's writer thread, timed from the
/// call to the flush callback's wake-up.
async fn timed_append(
    wal: &Wal,
    e: Entry<TypeConfig>,
) -> Result<Duration, Box<dyn std::error::Error>> {
    let t = Instant::now();
    let (tx, rx) = tokio::sync::oneshot::channel();
    wal.append(
        vec![e],
        None,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    )?;
    rx.await??;
    Ok(t.elapsed())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let db = Database::create(dir.path().join("bench.redb"))?;
    let direct = Wal::open_with_io(&dir.path().join("log"), LogIo::Direct)?;
    if direct.io() != LogIo::Direct {
        return Err("this file system refuses O_DIRECT; nothing to compare".into());
    }
    let buffered = Wal::open_with_io(&dir.path().join("log-buffered"), LogIo::Buffered)?;
    let (mut redb_lat, mut direct_lat, mut buffered_lat) = (Vec::new(), Vec::new(), Vec::new());
    // Interleaved, so that both see the same disk weather.
    for i in 1..=APPENDS {
        let e = entry(i);
        let t = Instant::now();
        let bytes = postcard::to_allocvec(&e)?;
        let txn = db.begin_write()?;
        txn.open_table(LOG)?.insert(i, bytes.as_slice())?;
        txn.commit()?;
        redb_lat.push(t.elapsed());

        direct_lat.push(timed_append(&direct, e.clone()).await?);
        buffered_lat.push(timed_append(&buffered, e).await?);
    }
    report("redb_durable_commit", redb_lat);
    report("wal_durable_append_direct", direct_lat);
    report("wal_durable_append_buffered", buffered_lat);
    let mut next = APPENDS + 1;
    for gap_ms in [0.0, 0.5, 1.0, 2.0, 5.0, 0.0] {
        let (mut d, mut b) = (Vec::new(), Vec::new());
        for _ in 0..400 {
            for (wal, lat) in [(&direct, &mut d), (&buffered, &mut b)] {
                if gap_ms > 0.0 {
                    // The thread itself idles (tokio's timer rounds to 1 ms).
                    std::thread::sleep(Duration::from_secs_f64(gap_ms / 1e3));
                }
                lat.push(timed_append(wal, entry(next)).await?);
            }
            next += 1;
        }
        report(
            &format!("wal_durable_append_direct_after_{gap_ms}_ms_idle"),
            d,
        );
        report(
            &format!("wal_durable_append_buffered_after_{gap_ms}_ms_idle"),
            b,
        );
    }
    Ok(())
}
