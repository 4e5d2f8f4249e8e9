//! The behaviour every backend must show. Each backend's tests call
//! [`run_all`] on a live store; every check works under its own key prefix,
//! so one store (a whole Raft cluster, an etcd cluster) serves them all.
//! A failed check panics with what it expected.

use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::error::KvError;
use crate::state::Event;
use crate::store::{CasOutcome, KvStore};

/// Runs every check in turn.
pub async fn run_all(store: &dyn KvStore) {
    insert_does_not_overwrite_but_put_does(store).await;
    missing_keys_are_not_found_at_once(store).await;
    blocking_get_times_out(store).await;
    blocking_get_is_woken_by_a_put(store).await;
    keys_and_values_are_bytes(store).await;
    list_returns_a_directory_in_key_order(store).await;
    delete_and_delete_prefix(store).await;
    increments_are_atomic(store).await;
    compare_and_swap_decides_on_the_current_value(store).await;
    revisions_increase_with_every_write(store).await;
    watches_resume_from_a_revision_and_follow_live(store).await;
    a_watch_from_a_listings_revision_misses_and_repeats_nothing(store).await;
    leases_delete_their_keys_on_expiry_and_revoke(store).await;
    barriers_pass_when_everyone_arrives(store).await;
    barrier_timeouts_and_cancels_fail_everyone_alike(store).await;
    oversized_writes_are_refused_and_write_nothing(store).await;
    a_batch_writes_all_its_keys_at_one_revision_or_none(store).await;
    a_lease_granted_with_its_keys_binds_them_and_a_taken_id_is_refused(store).await;
}

/// Insert refuses an existing key; put overwrites it.
pub async fn insert_does_not_overwrite_but_put_does(store: &dyn KvStore) {
    store.insert(b"conf/insert/k", b"first").await.unwrap();
    let e = store.insert(b"conf/insert/k", b"second").await.unwrap_err();
    assert_eq!(e, KvError::AlreadyExists(b"conf/insert/k".to_vec()));
    assert_eq!(store.try_get(b"conf/insert/k").await.unwrap(), b"first");
    store.put(b"conf/insert/k", b"third").await.unwrap();
    assert_eq!(store.try_get(b"conf/insert/k").await.unwrap(), b"third");
}

/// A try-get of a missing key fails at once with `NotFound`.
pub async fn missing_keys_are_not_found_at_once(store: &dyn KvStore) {
    let start = Instant::now();
    let e = store.try_get(b"conf/missing/k").await.unwrap_err();
    assert_eq!(e, KvError::NotFound(b"conf/missing/k".to_vec()));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "try_get does not wait"
    );
}

/// A blocking get of a missing key fails at its deadline.
pub async fn blocking_get_times_out(store: &dyn KvStore) {
    let start = Instant::now();
    let e = store
        .get(b"conf/timeout/k", Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(e, KvError::DeadlineExceeded { .. }), "{e:?}");
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "returned before the deadline"
    );
}

/// A blocking get returns as soon as the key is written.
pub async fn blocking_get_is_woken_by_a_put(store: &dyn KvStore) {
    let (got, ()) = tokio::join!(store.get(b"conf/wake/k", Duration::from_secs(10)), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store.insert(b"conf/wake/k", b"late").await.unwrap();
    });
    assert_eq!(got.unwrap(), b"late");
}

/// Keys and values are arbitrary bytes, kept exactly.
pub async fn keys_and_values_are_bytes(store: &dyn KvStore) {
    let key = b"conf/bytes/\xff\x00\xfe".to_vec();
    let value: Vec<u8> = (0..=255u8).collect();
    store.put(&key, &value).await.unwrap();
    assert_eq!(
        store.get(&key, Duration::from_secs(1)).await.unwrap(),
        value
    );
    store.put(b"conf/bytes/empty", b"").await.unwrap();
    assert_eq!(store.try_get(b"conf/bytes/empty").await.unwrap(), b"");
}

/// A list returns exactly the keys under a prefix, in key order.
pub async fn list_returns_a_directory_in_key_order(store: &dyn KvStore) {
    for k in [
        "conf/list/d/2",
        "conf/list/d/1",
        "conf/list/d/10",
        "conf/list/dx",
        "conf/list/e",
    ] {
        store.put(k.as_bytes(), k.as_bytes()).await.unwrap();
    }
    let keys: Vec<Vec<u8>> = store
        .list(b"conf/list/d/")
        .await
        .unwrap()
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    assert_eq!(
        keys,
        vec![
            b"conf/list/d/1".to_vec(),
            b"conf/list/d/10".to_vec(),
            b"conf/list/d/2".to_vec()
        ]
    );
    assert!(store.list(b"conf/list/none/").await.unwrap().is_empty());
}

/// Delete removes one key, delete-prefix every key under a prefix.
pub async fn delete_and_delete_prefix(store: &dyn KvStore) {
    for k in [
        "conf/del/a",
        "conf/del/dir/1",
        "conf/del/dir/2",
        "conf/del/dirx",
    ] {
        store.put(k.as_bytes(), b"v").await.unwrap();
    }
    assert_eq!(store.delete(b"conf/del/a").await.unwrap(), 1);
    assert_eq!(
        store.delete(b"conf/del/a").await.unwrap(),
        0,
        "deleting a missing key is not an error"
    );
    assert_eq!(store.delete_prefix(b"conf/del/dir/").await.unwrap(), 2);
    assert!(store.try_get(b"conf/del/dir/1").await.is_err());
    assert_eq!(
        store.try_get(b"conf/del/dirx").await.unwrap(),
        b"v",
        "only the directory"
    );
}

/// Concurrent increments lose no update.
pub async fn increments_are_atomic(store: &dyn KvStore) {
    assert_eq!(
        store.increment(b"conf/incr/n", 5).await.unwrap(),
        5,
        "missing counts as 0"
    );
    let all = futures::future::join_all((0..20).map(|_| store.increment(b"conf/incr/n", 1))).await;
    let mut seen: Vec<i64> = all.into_iter().map(Result::unwrap).collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (6..=25).collect::<Vec<_>>(),
        "every increment saw a distinct value"
    );
    assert_eq!(store.increment(b"conf/incr/n", -25).await.unwrap(), 0);
    store.put(b"conf/incr/text", b"abc").await.unwrap();
    assert!(matches!(
        store.increment(b"conf/incr/text", 1).await,
        Err(KvError::InvalidArgument(_))
    ));
}

/// Compare-and-swap writes only over the value expected.
pub async fn compare_and_swap_decides_on_the_current_value(store: &dyn KvStore) {
    let k = b"conf/cas/k";
    assert!(matches!(
        store.compare_and_swap(k, None, b"1").await.unwrap(),
        CasOutcome::Swapped { .. }
    ));
    assert_eq!(
        store.compare_and_swap(k, None, b"2").await.unwrap(),
        CasOutcome::Mismatch {
            current: Some(b"1".to_vec())
        }
    );
    assert_eq!(
        store.compare_and_swap(k, Some(b"9"), b"2").await.unwrap(),
        CasOutcome::Mismatch {
            current: Some(b"1".to_vec())
        }
    );
    assert!(matches!(
        store.compare_and_swap(k, Some(b"1"), b"2").await.unwrap(),
        CasOutcome::Swapped { .. }
    ));
    assert_eq!(store.try_get(k).await.unwrap(), b"2");
}

/// Every write raises the revision.
pub async fn revisions_increase_with_every_write(store: &dyn KvStore) {
    let r0 = store.revision().await.unwrap();
    let r1 = store.put(b"conf/rev/a", b"1").await.unwrap();
    let r2 = store.put(b"conf/rev/a", b"2").await.unwrap();
    let r3 = store.insert(b"conf/rev/b", b"1").await.unwrap();
    assert!(r0 < r1 && r1 < r2 && r2 < r3, "{r0} {r1} {r2} {r3}");
    assert!(store.revision().await.unwrap() >= r3);
}

async fn next_event(s: &mut crate::WatchStream) -> Event {
    tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("an event within 5 s")
        .expect("the stream is open")
        .expect("no watch error")
}

/// A watch replays events from a revision, then follows new ones.
pub async fn watches_resume_from_a_revision_and_follow_live(store: &dyn KvStore) {
    let r1 = store.put(b"conf/watch/a", b"1").await.unwrap();
    store.put(b"conf/watch/b", b"2").await.unwrap();
    store.put(b"conf/watchx", b"other prefix").await.unwrap();
    store.delete(b"conf/watch/a").await.unwrap();
    let mut w = store.watch(b"conf/watch/", r1).await.unwrap();
    let e = next_event(&mut w).await;
    assert!(
        matches!(&e, Event::Put(kv) if kv.key == b"conf/watch/a" && kv.mod_revision == r1),
        "{e:?}"
    );
    assert!(matches!(next_event(&mut w).await, Event::Put(kv) if kv.key == b"conf/watch/b"));
    assert!(
        matches!(next_event(&mut w).await, Event::Delete { key, .. } if key == b"conf/watch/a")
    );
    // Live from here on.
    let r = store.put(b"conf/watch/c", b"3").await.unwrap();
    let e = next_event(&mut w).await;
    assert!(
        matches!(&e, Event::Put(kv) if kv.key == b"conf/watch/c" && kv.mod_revision == r),
        "{e:?}"
    );
}

/// A listing's revision is the store's when it was read: a watch from the
/// next one delivers every later change under the prefix and none of the
/// pairs listed (etcd's list-then-watch).
pub async fn a_watch_from_a_listings_revision_misses_and_repeats_nothing(store: &dyn KvStore) {
    store.put(b"conf/listat/a", b"1").await.unwrap();
    let rb = store.put(b"conf/listat/b", b"2").await.unwrap();
    // A write outside the prefix still moves the store's revision.
    let other = store.put(b"conf/listatx", b"other prefix").await.unwrap();
    let listing = store.list_at(b"conf/listat/").await.unwrap();
    let keys: Vec<&[u8]> = listing.pairs.iter().map(|p| &p.key[..]).collect();
    assert_eq!(keys, [&b"conf/listat/a"[..], b"conf/listat/b"]);
    assert_eq!(listing.pairs[1].mod_revision, rb);
    assert!(listing.revision >= other, "{} < {other}", listing.revision);
    assert_eq!(
        store.list(b"conf/listat/").await.unwrap(),
        listing.pairs,
        "list is list_at's pairs"
    );
    let rc = store.put(b"conf/listat/c", b"3").await.unwrap();
    assert!(rc > listing.revision, "{rc} <= {}", listing.revision);
    let mut w = store
        .watch(b"conf/listat/", listing.revision + 1)
        .await
        .unwrap();
    let e = next_event(&mut w).await;
    assert!(
        matches!(&e, Event::Put(kv) if kv.key == b"conf/listat/c" && kv.mod_revision == rc),
        "the first event after the listing: {e:?}"
    );
}

/// A lease's keys go when it expires or is revoked, not while it is kept alive.
pub async fn leases_delete_their_keys_on_expiry_and_revoke(store: &dyn KvStore) {
    // A TTL well above the renewal interval, so a slow renewal on a loaded
    // machine does not lose the lease.
    let ttl = Duration::from_millis(1500);
    let lease = store.grant(ttl).await.unwrap();
    store
        .put_with_lease(b"conf/lease/alive", b"1", lease)
        .await
        .unwrap();
    let mut w = store.watch(b"conf/lease/", 0).await.unwrap();
    // Renew for 3.5 s: longer than the TTL on every backend (etcd rounds
    // TTLs up to whole seconds, with a minimum of its own).
    let mut renewed = Instant::now();
    for _ in 0..14 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        renewed = Instant::now();
        store.keep_alive(lease).await.unwrap();
    }
    assert_eq!(
        store.try_get(b"conf/lease/alive").await.unwrap(),
        b"1",
        "kept alive past its TTL"
    );
    // Stop renewing: the key goes, and watchers see it go.
    assert!(matches!(next_event(&mut w).await, Event::Put(_)));
    let gone = tokio::time::timeout(Duration::from_secs(8), w.next())
        .await
        .expect("the key expires within 8 s")
        .expect("the stream is open")
        .expect("no watch error");
    assert!(
        matches!(&gone, Event::Delete { key, .. } if key == b"conf/lease/alive"),
        "{gone:?}"
    );
    assert!(
        renewed.elapsed() >= ttl,
        "expired {:?} after the last renewal, before its TTL",
        renewed.elapsed()
    );
    assert!(
        store.try_get(b"conf/lease/alive").await.is_err(),
        "expired with its lease"
    );
    assert_eq!(
        store.keep_alive(lease).await,
        Err(KvError::LeaseNotFound(lease))
    );
    // Compare-and-swap and increment keep the key's lease.
    let l3 = store.grant(Duration::from_secs(60)).await.unwrap();
    store
        .put_with_lease(b"conf/lease/cas", b"1", l3)
        .await
        .unwrap();
    store
        .put_with_lease(b"conf/lease/n", b"1", l3)
        .await
        .unwrap();
    assert!(matches!(
        store
            .compare_and_swap(b"conf/lease/cas", Some(b"1"), b"2")
            .await
            .unwrap(),
        CasOutcome::Swapped { .. }
    ));
    store.increment(b"conf/lease/n", 1).await.unwrap();
    store.revoke(l3).await.unwrap();
    assert!(
        store.try_get(b"conf/lease/cas").await.is_err(),
        "a swapped key keeps its lease"
    );
    assert!(
        store.try_get(b"conf/lease/n").await.is_err(),
        "an incremented key keeps its lease"
    );
    let l2 = store.grant(Duration::from_secs(60)).await.unwrap();
    store
        .put_with_lease(b"conf/lease/revoked", b"1", l2)
        .await
        .unwrap();
    store.revoke(l2).await.unwrap();
    assert!(store.try_get(b"conf/lease/revoked").await.is_err());
    assert_eq!(
        store.put_with_lease(b"conf/lease/x", b"1", l2).await,
        Err(KvError::LeaseNotFound(l2))
    );
}

/// A barrier passes for everyone once all participants arrive.
pub async fn barriers_pass_when_everyone_arrives(store: &dyn KvStore) {
    let t = Duration::from_secs(10);
    let (a, b, c) = tokio::join!(
        store.barrier(b"conf/barrier/ok", b"w0", 3, t),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            store.barrier(b"conf/barrier/ok", b"w1", 3, t).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store.barrier(b"conf/barrier/ok", b"w2", 3, t).await
        },
    );
    assert_eq!((a, b, c), (Ok(()), Ok(()), Ok(())));
    // Arriving after it passed returns at once.
    store
        .barrier(b"conf/barrier/ok", b"w0", 3, t)
        .await
        .unwrap();
}

/// A barrier's timeout or cancel fails every participant with the same reason.
pub async fn barrier_timeouts_and_cancels_fail_everyone_alike(store: &dyn KvStore) {
    let t = Duration::from_millis(300);
    let (a, b) = tokio::join!(
        store.barrier(b"conf/barrier/slow", b"w0", 3, t),
        store.barrier(b"conf/barrier/slow", b"w1", 3, t),
    );
    let (a, b) = (a.unwrap_err(), b.unwrap_err());
    assert!(matches!(&a, KvError::BarrierFailed { .. }), "{a:?}");
    assert_eq!(a, b, "the same error for every participant");
    let late = store
        .barrier(b"conf/barrier/slow", b"w2", 3, t)
        .await
        .unwrap_err();
    assert_eq!(late, a, "a late arrival gets the same error");
    let (waiting, ()) = tokio::join!(
        store.barrier(b"conf/barrier/cancel", b"w0", 2, Duration::from_secs(10)),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store
                .cancel_barrier(b"conf/barrier/cancel", "job cancelled")
                .await
                .unwrap();
        }
    );
    assert!(
        matches!(waiting, Err(KvError::BarrierFailed { reason, .. }) if reason.contains("job cancelled"))
    );
    // Cancelled before anyone arrived: the arrivals still fail.
    store
        .cancel_barrier(b"conf/barrier/early", "job cancelled")
        .await
        .unwrap();
    let late = store
        .barrier(b"conf/barrier/early", b"w0", 1, Duration::from_secs(10))
        .await;
    assert!(
        matches!(&late, Err(KvError::BarrierFailed { reason, .. }) if reason.contains("job cancelled")),
        "{late:?}"
    );
}

/// An oversized key or value is refused and writes nothing.
pub async fn oversized_writes_are_refused_and_write_nothing(store: &dyn KvStore) {
    let before = store.revision().await.unwrap();
    let big_key = vec![b'k'; 4097];
    let big_value = vec![0u8; (4 << 20) + 1];
    assert!(matches!(
        store.put(&big_key, b"v").await,
        Err(KvError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.put(b"conf/big/v", &big_value).await,
        Err(KvError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.insert(b"conf/big/v", &big_value).await,
        Err(KvError::InvalidArgument(_))
    ));
    assert!(store.try_get(b"conf/big/v").await.is_err());
    assert_eq!(store.revision().await.unwrap(), before, "nothing written");
    // At the limits exactly is fine.
    store
        .put(&vec![b'k'; 4096], &vec![0u8; 4 << 20])
        .await
        .unwrap();
}

/// A batch of puts is one write: all its keys at one revision, bound to
/// their leases; refused whole (nothing written) for a missing lease, a
/// key named twice, or a size over the limits.
pub async fn a_batch_writes_all_its_keys_at_one_revision_or_none(store: &dyn KvStore) {
    use crate::state::{BatchPut, MAX_BATCH};
    let lease = store.grant(Duration::from_secs(60)).await.unwrap();
    let rev = store
        .put_batch(&[
            BatchPut::new(b"conf/batch/a", b"1", None),
            BatchPut::new(b"conf/batch/b", b"2", Some(lease)),
        ])
        .await
        .unwrap();
    let got = store.list(b"conf/batch/").await.unwrap();
    assert_eq!(got.len(), 2);
    for kv in &got {
        assert_eq!(kv.mod_revision, rev, "one revision for the batch");
    }
    assert_eq!(store.revision().await.unwrap(), rev);
    let mut w = store.watch(b"conf/batch/", rev).await.unwrap();
    for key in [&b"conf/batch/a"[..], b"conf/batch/b"] {
        let e = next_event(&mut w).await;
        assert_eq!((e.key(), e.revision()), (key, rev));
    }
    let gone = store.grant(Duration::from_secs(60)).await.unwrap();
    store.revoke(gone).await.unwrap();
    let before = store.revision().await.unwrap();
    let refused = [
        vec![
            BatchPut::new(b"conf/batch/c", b"3", None),
            BatchPut::new(b"conf/batch/d", b"4", Some(gone)),
        ],
        vec![
            BatchPut::new(b"conf/batch/c", b"3", None),
            BatchPut::new(b"conf/batch/c", b"4", None),
        ],
        vec![],
        (0..=MAX_BATCH)
            .map(|i| BatchPut::new(format!("conf/batch/c{i}").as_bytes(), b"", None))
            .collect(),
        vec![
            BatchPut::new(b"conf/batch/c", &vec![0u8; 3 << 20], None),
            BatchPut::new(b"conf/batch/e", &vec![0u8; 3 << 20], None),
        ],
    ];
    for puts in refused {
        let e = store.put_batch(&puts).await.unwrap_err();
        assert!(
            matches!(e, KvError::LeaseNotFound(_) | KvError::InvalidArgument(_)),
            "{e}"
        );
    }
    assert!(matches!(
        store.try_get(b"conf/batch/c").await,
        Err(KvError::NotFound(_))
    ));
    assert_eq!(store.revision().await.unwrap(), before, "nothing written");
    store.revoke(lease).await.unwrap();
    let left: Vec<_> = store.list(b"conf/batch/").await.unwrap();
    assert_eq!(left.len(), 1, "the leased key went with its lease");
    assert_eq!(left[0].key, b"conf/batch/a");
}

/// `grant_and_put`: the lease the caller chose holds the keys bound to it;
/// an id in use, 0, or a batch that would be refused grants nothing.
pub async fn a_lease_granted_with_its_keys_binds_them_and_a_taken_id_is_refused(
    store: &dyn KvStore,
) {
    use crate::state::BatchPut;
    use crate::store::MAX_CHOSEN_LEASE;
    // New for each run: an etcd cluster outlives a test's store.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let id = 1 + nanos % (MAX_CHOSEN_LEASE / 2);
    let ttl = Duration::from_secs(60);
    let rev = store
        .grant_and_put(
            id,
            ttl,
            &[
                BatchPut::new(b"conf/chosen/record", b"1", None),
                BatchPut::new(b"conf/chosen/alive", b"2", Some(id)),
            ],
        )
        .await
        .unwrap();
    let got = store.list(b"conf/chosen/").await.unwrap();
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|kv| kv.mod_revision == rev), "one revision");
    store.keep_alive(id).await.unwrap();
    let again = [BatchPut::new(b"conf/chosen/other", b"3", Some(id))];
    let e = store.grant_and_put(id, ttl, &again).await.unwrap_err();
    assert!(matches!(e, KvError::AlreadyExists(_)), "{e}");
    let e = store.grant_and_put(0, ttl, &again).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)), "{e}");
    let twice = [
        BatchPut::new(b"conf/chosen/other", b"3", Some(id + 1)),
        BatchPut::new(b"conf/chosen/other", b"4", None),
    ];
    let e = store.grant_and_put(id + 1, ttl, &twice).await.unwrap_err();
    assert!(matches!(e, KvError::InvalidArgument(_)), "{e}");
    assert!(
        matches!(
            store.keep_alive(id + 1).await,
            Err(KvError::LeaseNotFound(_))
        ),
        "a refused batch grants no lease"
    );
    assert!(matches!(
        store.try_get(b"conf/chosen/other").await,
        Err(KvError::NotFound(_))
    ));
    let granted = store.grant(ttl).await.unwrap();
    assert_ne!(granted, id, "a granted id is never a chosen one in use");
    store.revoke(granted).await.unwrap();
    store.revoke(id).await.unwrap();
    let left = store.list(b"conf/chosen/").await.unwrap();
    assert_eq!(left.len(), 1, "the bound key went with its lease");
    assert_eq!(left[0].key, b"conf/chosen/record");
}
