//! What applying committed writes to a replica's state machine costs
//! (the overlay, then `state.redb`), for batches of 1
//! and of 64 puts, with 100 k keys already stored; flushes included. Then
//! how long reopening it takes at 1 M keys (reading the state and
//! building the key filter from every key).
//!
//!     cargo run --release -p tessel-kv-service --example sm_apply_cost

use std::time::Instant;

use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use tessel_kv::state::{KvState, Op, Request};
use tessel_kv_service::raft::sm::StateMachineStore;
use tessel_kv_service::raft::{Proposal, TypeConfig};

fn entry(index: u64, keys: std::ops::Range<u64>) -> Entry<TypeConfig> {
    let reqs = keys
        .map(|k| Request {
            now_ms: index,
            op: Op::Put {
                key: format!("mem/{k:08}").into_bytes(),
                value: vec![7; 64],
                lease: None,
            },
        })
        .collect();
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Proposal::new(reqs)),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut sm = StateMachineStore::open(dir.path(), KvState::default())?;
    let mut index = 1;
    for chunk in 0..100u64 {
        sm.apply([entry(index, chunk * 1000..(chunk + 1) * 1000)])
            .await?;
        index += 1;
    }
    for batch in [1u64, 64] {
        // Long enough to include the flushes to redb the overlay takes.
        let rounds = 64_000 / batch;
        let t = Instant::now();
        for r in 0..rounds {
            let first = (r * batch * 7919) % 100_000;
            sm.apply([entry(index, first..first + batch)]).await?;
            index += 1;
        }
        let per_batch = t.elapsed().as_secs_f64() / rounds as f64;
        println!(
            "{{\"figure\":\"sm_apply\",\"batch\":{batch},\"us_per_batch\":{:.1},\"us_per_put\":{:.1}}}",
            per_batch * 1e6,
            per_batch * 1e6 / batch as f64
        );
    }
    let keys = 1_000_000u64;
    for chunk in 100..keys / 1000 {
        sm.apply([entry(index, chunk * 1000..(chunk + 1) * 1000)])
            .await?;
        index += 1;
    }
    drop(sm);
    let t = Instant::now();
    let sm = StateMachineStore::open(dir.path(), KvState::default())?;
    println!(
        "{{\"figure\":\"sm_open\",\"keys\":{keys},\"ms\":{:.0}}}",
        t.elapsed().as_secs_f64() * 1e3
    );
    drop(sm);
    Ok(())
}
