//! The on-disk state machine against the in-memory one, snapshots, the key filter.

use super::*;
use tessel_kv::state::{MemState, Op, Request, SESSION_IDLE_MS};

/// Every kind of write, with leases expiring, prefixes deleted inside a
/// batch, counters and barriers; some sent once in two client sessions,
/// some of those twice, and the sessions forgotten at the end.
fn requests() -> Vec<Request> {
    let mut out = Vec::new();
    for (i, r) in plain_requests().into_iter().enumerate() {
        let i = i as u64;
        if i % 3 != 0 || matches!(r.op, Op::Tick) {
            out.push(r);
            continue;
        }
        let once = Request {
            // Past the sessions' idle time at the end (a sweep).
            now_ms: if i >= 390 {
                r.now_ms + 3 * SESSION_IDLE_MS
            } else {
                r.now_ms
            },
            op: Op::Once {
                client: 1 + u128::from(i % 2 == 0),
                seq: i,
                floor: i.saturating_sub(30),
                op: Box::new(r.op),
            },
        };
        if i % 9 == 0 {
            out.push(once.clone());
        }
        out.push(once);
    }
    out
}

fn plain_requests() -> Vec<Request> {
    (0..400u64)
        .map(|i| {
            let key = format!("k/{}", i % 23).into_bytes();
            let op = match i % 10 {
                0 => Op::LeaseGrant { ttl_ms: 40 },
                1 => Op::Put {
                    key,
                    value: i.to_le_bytes().to_vec(),
                    lease: Some(i / 10 + 1),
                },
                2 => Op::Insert {
                    key,
                    value: vec![1; (i % 7) as usize],
                    lease: None,
                },
                3 => Op::Increment {
                    key: b"n".to_vec(),
                    delta: i as i64,
                },
                4 => Op::DeletePrefix {
                    prefix: format!("k/{}", i % 3).into_bytes(),
                },
                5 => Op::Delete { key },
                6 => Op::CompareAndSwap {
                    key,
                    expected: None,
                    value: b"cas".to_vec(),
                },
                7 => Op::BarrierArrive {
                    id: format!("b{}", i % 4).into_bytes(),
                    participant: format!("p{i}").into_bytes(),
                    participants: 3,
                    timeout_ms: 30,
                },
                8 => Op::Put {
                    key: format!("k/{}", (i + 5) % 23).into_bytes(),
                    value: b"plain".to_vec(),
                    lease: None,
                },
                _ => Op::Tick,
            };
            Request { now_ms: i * 3, op }
        })
        .collect()
}

/// The same state, pairs and retained events.
fn assert_same(applied: &AppliedState<SmTables>, mem: &MemState) {
    assert_eq!(applied.state(), mem.state);
    assert_eq!(applied.read(|_, t| t.list(b"")).unwrap(), mem.list(b""));
    assert_eq!(applied.read(|_, t| t.count()).unwrap(), mem.len() as u64);
    let sessions = |t: &dyn Fn(u128) -> Option<ClientSession>| [1, 2].map(t);
    assert_eq!(
        applied
            .read(|_, t| Ok::<_, KvError>(sessions(&|c| t.session(c).unwrap())))
            .unwrap(),
        sessions(&|c| mem.tables.session(c).unwrap()),
    );
    assert_eq!(
        applied.read(|_, t| t.idle_sessions(u64::MAX)).unwrap(),
        mem.tables.idle_sessions(u64::MAX).unwrap()
    );
    // From every retained revision: a flushed record may begin below
    // the revision asked for (invariant 5); under narrow prefixes read
    // through the index as under none (invariant 12).
    for from in mem.state.compacted_below()..=mem.state.revision() + 1 {
        for prefix in ["", "k/", "k/1", "k/17", "n", "absent"].map(str::as_bytes) {
            assert_eq!(
                applied
                    .read(|s, t| s.events_since(t, from, prefix))
                    .unwrap(),
                mem.events_since(from, prefix).unwrap(),
                "events from revision {from} under {prefix:?}"
            );
        }
    }
}

/// Invariant 12: an overlay's index gives the events a scan of its
/// history would, whether a prefix's events fit the index's budget or not.
#[test]
fn an_overlays_index_reads_what_a_scan_of_its_history_does() {
    let mut o = Overlay::default();
    let put = |key: String, revision: u64| {
        Event::Put(KeyValue {
            key: key.into_bytes(),
            value: vec![],
            create_revision: revision,
            mod_revision: revision,
            lease: None,
        })
    };
    // Past the budget under "wide/", a few under "narrow/", and revisions
    // holding events of both (a delete of a prefix, a transaction).
    for r in 1..=2 * INDEX_BUDGET as u64 {
        let mut events = vec![put(format!("wide/{}", r % 40), r)];
        if r % 50 == 0 {
            events.push(put(format!("narrow/{}", r % 3), r));
        }
        o.record(r, &events);
    }
    for from in [0, 1, 100, 300, 512, 513] {
        for prefix in [
            "", "wide/", "wide/1", "narrow/", "narrow/2", "nar", "absent",
        ] {
            let mut got = Vec::new();
            o.events_into(from, prefix.as_bytes(), &mut got);
            let scanned: Vec<Event> = (o.history.range(from..))
                .flat_map(|(_, e)| e)
                .filter(|e| e.key().starts_with(prefix.as_bytes()))
                .cloned()
                .collect();
            assert_eq!(got, scanned, "from {from} under {prefix:?}");
        }
    }
}

#[tokio::test]
async fn redb_tables_agree_with_memory_tables_batch_by_batch() {
    let dir = tempfile::tempdir().unwrap();
    let initial = KvState::new(Limits::default(), 50);
    let sm = StateMachineStore::open(dir.path(), initial).unwrap();
    let applied = sm.applied();
    let mut mem = MemState::new(Limits::default(), 50);
    let reqs = requests();
    let mut rest = reqs.as_slice();
    let mut size = 1;
    while !rest.is_empty() {
        let (batch, tail) = rest.split_at(size.min(rest.len()));
        let got = applied
            .apply_batch(batch, |state, t| {
                // Some batches stay in the overlay, some are flushed
                // (with or without fsync, at once or on the flush
                // thread, invariant 6): reads merge them all.
                let none = StoredMembership::default();
                match size % 4 {
                    0 => Ok(()),
                    1 => t.flush(state, None, &none, false),
                    2 => t.flush(state, None, &none, true),
                    _ => {
                        t.last_flush -= FLUSH_INTERVAL;
                        t.end_batch(state, None, &none)
                    }
                }
            })
            .unwrap();
        let want: Vec<_> = batch.iter().map(|r| mem.apply(r).0).collect();
        assert_eq!(got, want);
        assert_same(&applied, &mem);
        rest = tail;
        size = size % 9 + 1;
    }
    assert!(mem.len() > 3 && mem.state.compacted_below() > 1);
    // What was flushed, lease rows included (invariant 9), reopens as it was.
    applied
        .update(|state, t| t.flush(state, None, &StoredMembership::default(), true))
        .unwrap();
    drop((sm, applied));
    let reopened = StateMachineStore::open(dir.path(), KvState::new(Limits::default(), 50));
    assert_same(&reopened.unwrap().applied(), &mem);
    assert!(mem.state.leases_by_expiry().count() > 0);
}

/// Invariant 13: lease rows encoded as each batch ends, some leases
/// changed again in later batches with no flush between, reopen as the
/// state that applied those batches holds its leases (the last row wins).
#[tokio::test]
async fn lease_rows_taken_batch_by_batch_reopen_as_their_last_change() {
    let dir = tempfile::tempdir().unwrap();
    let sm = StateMachineStore::open(dir.path(), KvState::new(Limits::default(), 50)).unwrap();
    let applied = sm.applied();
    let mut mem = MemState::new(Limits::default(), 50);
    let none = StoredMembership::default();
    for r in requests() {
        applied
            .apply_batch(std::slice::from_ref(&r), |state, t| {
                // No flush due: the rows wait, encoded.
                t.last_flush = std::time::Instant::now();
                t.end_batch(state, None, &none)
            })
            .unwrap();
        let _ = mem.apply(&r);
    }
    let (rows, leases) = applied
        .read(|_, t| {
            let ids: BTreeSet<u64> = t.lease_rows.iter().map(|(id, _)| *id).collect();
            Ok::<_, KvError>((t.lease_rows.len(), ids.len()))
        })
        .unwrap();
    assert!(
        rows > leases,
        "a lease changed in several batches: {rows} rows, {leases} leases"
    );
    applied
        .update(|state, t| t.flush(state, None, &none, true))
        .unwrap();
    drop((sm, applied));
    let reopened = StateMachineStore::open(dir.path(), KvState::new(Limits::default(), 50));
    assert_same(&reopened.unwrap().applied(), &mem);
    assert!(mem.state.leases_by_expiry().count() > 0);
}

/// Applies `reqs` to `sm` and `mem`, then flushes `sm`.
fn apply_and_flush(sm: &StateMachineStore, mem: &mut MemState, reqs: &[Request]) {
    let none = StoredMembership::default();
    let applied = sm.applied();
    applied
        .apply_batch(reqs, |state, t| t.flush(state, None, &none, true))
        .unwrap();
    for r in reqs {
        let _ = mem.apply(r);
    }
}

#[tokio::test]
async fn a_file_whose_state_holds_every_lease_opens_with_them_and_drops_stale_rows() {
    let dir = tempfile::tempdir().unwrap();
    let initial = || KvState::new(Limits::default(), 50);
    let mut mem = MemState::new(Limits::default(), 50);
    let reqs = plain_requests();
    let (first, rest) = reqs.split_at(reqs.len() / 2);
    let sm = StateMachineStore::open(dir.path(), initial()).unwrap();
    apply_and_flush(&sm, &mut mem, first);
    assert!(mem.state.leases_by_expiry().count() > 0);
    // As an older build leaves it: the state whole (leases inline), no
    // LEASES_AT, and a row for a lease that is gone.
    let whole = postcard::to_allocvec(&sm.applied().state()).unwrap();
    drop(sm);
    {
        let db = Database::open(dir.path().join("state.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut sm = txn.open_table(SM).unwrap();
            sm.insert(STATE, whole.as_slice()).unwrap();
            sm.remove(LEASES_AT).unwrap();
            let mut leases = txn.open_table(LEASES).unwrap();
            leases.insert(999_999, [0u8; 3].as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let sm = StateMachineStore::open(dir.path(), initial()).unwrap();
    assert_same(&sm.applied(), &mem);
    // Its first flush writes every lease as a row: reopened, the rows alone
    // hold them.
    apply_and_flush(&sm, &mut mem, rest);
    drop(sm);
    let sm = StateMachineStore::open(dir.path(), initial()).unwrap();
    assert_same(&sm.applied(), &mem);
    let rows = open_read(&sm.db, LEASES).unwrap().len().unwrap();
    assert_eq!(rows as usize, mem.state.leases_by_expiry().count());
}

#[tokio::test]
async fn a_snapshot_installs_the_same_state_and_survives_reopening() {
    use tokio::io::AsyncReadExt;
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let initial = || KvState::new(Limits::default(), 50);
    let mut leader = StateMachineStore::open(a.path(), initial()).unwrap();
    let mut mem = MemState::new(Limits::default(), 50);
    for r in requests() {
        leader
            .applied()
            .apply_batch([&r], |state, t| {
                t.end_batch(state, None, &StoredMembership::default())
            })
            .unwrap();
        let _ = mem.apply(&r);
    }
    let mut snap = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let mut bytes = Vec::new();
    snap.snapshot.read_to_end(&mut bytes).await.unwrap();
    {
        let mut follower = StateMachineStore::open(b.path(), initial()).unwrap();
        // A corrupt copy installs nothing.
        let mut bad = follower.begin_receiving_snapshot().await.unwrap();
        bad.write_all(&bytes[..bytes.len() - 3]).await.unwrap();
        assert!(follower.install_snapshot(&snap.meta, bad).await.is_err());
        assert_eq!(follower.applied().read(|_, t| t.count()).unwrap(), 0);
        let mut good = follower.begin_receiving_snapshot().await.unwrap();
        good.write_all(&bytes).await.unwrap();
        follower.install_snapshot(&snap.meta, good).await.unwrap();
        assert_same(&follower.applied(), &mem);
        let current = follower.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, snap.meta);
    }
    let reopened = StateMachineStore::open(b.path(), initial()).unwrap();
    assert_same(&reopened.applied(), &mem);
}

#[tokio::test]
async fn the_key_filter_holds_every_key_and_is_rebuilt_after_churn() {
    let dir = tempfile::tempdir().unwrap();
    let sm = StateMachineStore::open(dir.path(), KvState::new(Limits::default(), 50)).unwrap();
    let applied = sm.applied();
    let put = |key: String| Request {
        now_ms: 0,
        op: Op::Put {
            key: key.into_bytes(),
            value: b"v".to_vec(),
            lease: None,
        },
    };
    let flush_now = |state: &mut KvState, t: &mut SmTables| {
        t.last_flush -= FLUSH_INTERVAL;
        t.end_batch(state, None, &StoredMembership::default())
    };
    let kept: Vec<_> = (0..500).map(|i| put(format!("kept/{i}"))).collect();
    applied.apply_batch(&kept, flush_now).unwrap();
    // Rounds of keys written and removed again, flushed on the flush
    // thread: the filter keeps the removed keys until it is rebuilt.
    let mut largest = 0;
    for round in 0..90 {
        let mut batch: Vec<Request> = (0..1000)
            .map(|i| put(format!("churn/{round}/{i}")))
            .collect();
        batch.push(Request {
            now_ms: 0,
            op: Op::DeletePrefix {
                prefix: format!("churn/{round}/").into_bytes(),
            },
        });
        // Kept, and in the live overlay when the flush of the round
        // before, which may have rebuilt the filter, is adopted.
        batch.push(put(format!("late/{round}")));
        applied.apply_batch(&batch, flush_now).unwrap();
        largest = largest.max(applied.read(|_, t| t.filter.inserted()));
    }
    let (inserted, count) = applied.read(|_, t| (t.filter.inserted(), t.count().unwrap()));
    assert_eq!(count, 500 + 90);
    assert!(largest > 2 * 500 + key_filter::MIN_CAPACITY, "{largest}");
    assert!(
        inserted < largest / 2,
        "not rebuilt: {inserted} of {largest}"
    );
    // No key the tables hold is missing from the rebuilt filter, and
    // reads still find every kept key and none of the removed ones.
    applied.read(|_, t| {
        for i in 0..500 {
            let key = format!("kept/{i}");
            assert!(t.filter.may_contain(key.as_bytes()));
            assert!(t.get(key.as_bytes()).unwrap().is_some(), "{key}");
        }
        for round in 0..90 {
            let key = format!("late/{round}");
            assert!(t.get(key.as_bytes()).unwrap().is_some(), "{key}");
        }
        assert!(t.get(b"churn/3/7").unwrap().is_none());
    });
    // And after reopening, from the file alone.
    drop((applied, sm));
    let sm = StateMachineStore::open(dir.path(), KvState::new(Limits::default(), 50)).unwrap();
    let reopened = sm.applied().read(|_, t| t.filter.inserted());
    assert_eq!(reopened, 500 + 90);
}

#[test]
fn prefix_ends_bound_exactly_the_prefixed_keys() {
    assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
    assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
    assert_eq!(prefix_end(b"\xff\xff"), None);
    assert_eq!(prefix_end(b""), None);
}

#[test]
fn records_over_the_limit_or_cut_short_are_refused() {
    let mut big = Vec::new();
    big.extend_from_slice(&(1u32 << 30).to_le_bytes());
    assert!(matches!(
        read_record(&mut big.as_slice(), 1 << 20),
        Err(KvError::InvalidArgument(_))
    ));
    let mut cut = Vec::new();
    write_record(
        &mut cut,
        &SnapshotRecord::End {
            pairs: 1,
            event_records: 2,
        },
    )
    .unwrap();
    cut.pop();
    assert!(read_record(&mut cut.as_slice(), 1 << 20).is_err());
    assert!(read_record(&mut [].as_slice(), 1 << 20).unwrap().is_none());
}

#[test]
fn version_1_snapshots_are_still_read_and_each_version_ends_its_own_way() {
    let file = |version: u32, records: &[SnapshotRecord]| {
        let mut out = Vec::new();
        let header = SnapshotRecord::Header {
            version,
            meta: SnapshotMeta::default(),
            state: Box::default(),
        };
        for r in std::iter::once(&header).chain(records) {
            write_record(&mut out, r).unwrap();
        }
        out
    };
    let read =
        |bytes: Vec<u8>| read_snapshot(&mut bytes.as_slice(), Limits::default(), None, |_| Ok(()));
    let end = || SnapshotRecord::End {
        pairs: 0,
        event_records: 0,
    };
    let session = || SnapshotRecord::Session {
        client: 9,
        session: ClientSession::default(),
    };
    let trailer = |sessions| SnapshotRecord::Trailer {
        pairs: 0,
        event_records: 0,
        sessions,
    };
    assert!(read(file(1, &[end()])).is_ok());
    assert!(read(file(2, &[session(), trailer(1)])).is_ok());
    for (version, records) in [
        (1, vec![session(), end()]),
        (1, vec![trailer(0)]),
        (2, vec![end()]),
        (2, vec![session(), trailer(0)]),
        (3, vec![trailer(0)]),
    ] {
        let e = read(file(version, &records)).unwrap_err();
        assert!(matches!(e, KvError::InvalidArgument(_)), "{version}: {e}");
    }
}

#[tokio::test]
async fn kept_history_is_bounded_in_overlays_and_entries_and_keeps_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let sm = StateMachineStore::open(dir.path(), KvState::new(Limits::default(), 50)).unwrap();
    let applied = sm.applied();
    let none = StoredMembership::default();
    let puts = |from: usize, n: usize| -> Vec<Request> {
        (from..from + n)
            .map(|i| Request {
                now_ms: 0,
                op: Op::Put {
                    key: format!("h/{i}").into_bytes(),
                    value: b"v".to_vec(),
                    lease: None,
                },
            })
            .collect()
    };
    let held = |t: &SmTables| -> (usize, usize) {
        let entries = t.flushed.iter().map(Overlay::history_entries);
        (t.flushed.len(), entries.sum())
    };
    let mut next = 0;
    let mut flush = |n: usize| {
        let batch = puts(next, n);
        next += n;
        applied
            .apply_batch(&batch, |state, t| t.flush(state, None, &none, false))
            .unwrap();
        applied.read(|_, t| held(t))
    };
    // Small flushes: the count bounds them.
    for _ in 0..2 * KEPT_OVERLAYS {
        flush(10);
    }
    assert_eq!(flush(10), (KEPT_OVERLAYS, KEPT_OVERLAYS * 20));
    // Large ones: the entries do; each put is a revision and an event.
    let (overlays, entries) = flush(KEPT_ENTRIES / 4);
    assert!(entries <= KEPT_ENTRIES, "{entries} entries kept");
    assert!(overlays >= 2, "{overlays} kept");
    // One over the bound alone is still kept, alone.
    let (overlays, entries) = flush(KEPT_ENTRIES);
    assert_eq!((overlays, entries), (1, 2 * KEPT_ENTRIES));
    // Its events are still read from memory and in full.
    let got = applied.read(|_, t| {
        let mut out = Vec::new();
        for o in &t.flushed {
            o.events_into(0, b"h/", &mut out);
        }
        out.len()
    });
    assert_eq!(got, KEPT_ENTRIES);
}
