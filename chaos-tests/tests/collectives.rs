//! The transfer layer between real processes on loopback
//! (`tessel-bench transfer-rank`), organised by the property each test proves.
//! Inputs are `testing::pattern(dtype, count, rank, seed)`, so this process
//! computes every expected result itself with the single-process reference.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tessel_bench::rank_group::{RankGroup, RankOptions};
use tessel_chaos_tests::tessel_bench_bin;
use tessel_pjrt::ElementType;
use tessel_topology::sha256_hex;
use tessel_transfer::reduce::{reference_reduce, reference_ring_reduce, segment, REDUCIBLE};
use tessel_transfer::testing::pattern;
use tessel_transfer::ReduceOp;

const T: Duration = Duration::from_secs(120);

fn ok(answers: &[Value]) -> Vec<String> {
    answers
        .iter()
        .enumerate()
        .map(|(r, a)| {
            assert_eq!(a["ok"], true, "rank {r}: {a}");
            a["sha256"].as_str().expect("digest").to_owned()
        })
        .collect()
}

fn inputs(n: usize, dtype: ElementType, count: usize, seed: u64) -> Vec<Vec<u8>> {
    (0..n as u32)
        .map(|r| pattern(dtype, count, r, seed))
        .collect()
}

/// How the ranks of one host reach each other.
#[derive(Clone, Copy)]
enum Path {
    /// Shared-memory arenas (the default between processes of a host).
    Arenas,
    /// The ring, its chunks lent through shared memory (`--no-arenas`).
    ShmRing,
    /// Sealed data channels, set up over QUIC (`--force-network`: the
    /// default between hosts).
    Network,
    /// Encrypted payloads on QUIC streams (`--force-network
    /// --quic-payloads`, the path before sealed channels).
    Quic,
    /// Data channels of plain TCP set up over QUIC (`--force-network
    /// --transfer-encryption off`).
    Plain,
}

impl Path {
    fn options(self) -> RankOptions {
        RankOptions {
            force_network: matches!(self, Path::Network | Path::Quic | Path::Plain),
            plain: matches!(self, Path::Plain),
            quic_payloads: matches!(self, Path::Quic),
            no_arenas: matches!(self, Path::ShmRing),
            ..RankOptions::default()
        }
    }
}

/// The benchmark's floor, the ring over plain TCP (`tcp_ring_all_reduce`),
/// computes what the ring computes, bit for bit: every reducible dtype and
/// operator, several chunks per segment, uneven segments.
#[test]
fn the_plain_tcp_ring_matches_the_ring_reference() {
    let n = 3;
    let mut g = RankGroup::start(
        &tessel_bench_bin(),
        n,
        &RankOptions {
            chunk_bytes: Some(256),
            ..Path::Network.options()
        },
    )
    .unwrap();
    for (i, dtype) in REDUCIBLE.into_iter().enumerate() {
        for op in ReduceOp::ALL {
            let (count, seed) = (1003, 20 * i as u64 + op as u64);
            let cmd = json!({"op": "tcp_ring_all_reduce", "reduce": op.name(),
                             "dtype": dtype.name(), "count": count, "seed": seed, "repeat": 2});
            let want = reference_ring_reduce(op, dtype, &inputs(n, dtype, count, seed)).unwrap();
            for (r, d) in ok(&g.all(&cmd, T).unwrap()).iter().enumerate() {
                assert_eq!(
                    d,
                    &sha256_hex(&want),
                    "{} {} on rank {r}",
                    op.name(),
                    dtype.name()
                );
            }
        }
    }
}

/// Every collective, every reducible dtype and operator, equal bit for bit
/// to the single-process reference, for `n` ranks on `path`.
fn collectives_match_the_reference(n: usize, path: Path) {
    let mut g = RankGroup::start(
        &tessel_bench_bin(),
        n,
        &RankOptions {
            // Small chunks: several per segment, and uneven segments.
            chunk_bytes: Some(256),
            ..path.options()
        },
    )
    .unwrap();
    // Both all-reduce algorithms: data riding with the descriptors (small)
    // and the chunked ring (over SMALL_ALL_REDUCE bytes for every dtype),
    // on owned data and in place (on a buffer in shared memory, except
    // over the network).
    let large = tessel_transfer::reduce::SMALL_ALL_REDUCE / 2 + 3;
    for (i, dtype, count, in_place) in REDUCIBLE.into_iter().enumerate().flat_map(|(i, d)| {
        [(i, d, 1003), (i, d, large)]
            .into_iter()
            .flat_map(|(i, d, c)| [(i, d, c, false), (i, d, c, true)])
    }) {
        for op in ReduceOp::ALL {
            let seed = 10 * i as u64 + op as u64;
            let cmd = json!({"op": "all_reduce", "reduce": op.name(), "dtype": dtype.name(),
                             "count": count, "seed": seed, "in_place": in_place});
            let want = reference_reduce(op, dtype, &inputs(n, dtype, count, seed)).unwrap();
            let got = ok(&g.all(&cmd, T).unwrap());
            for (r, d) in got.iter().enumerate() {
                assert_eq!(
                    d,
                    &sha256_hex(&want),
                    "all_reduce {} {} of {count} (in place: {in_place}) on rank {r} of {n}",
                    op.name(),
                    dtype.name()
                );
            }
        }
    }

    let count = 1003;
    let dtype = ElementType::S64;
    let cmd =
        json!({"op": "reduce_scatter", "reduce": "sum", "dtype": "s64", "count": count, "seed": 5});
    let full = reference_ring_reduce(ReduceOp::Sum, dtype, &inputs(n, dtype, count, 5)).unwrap();
    for (r, d) in ok(&g.all(&cmd, T).unwrap()).iter().enumerate() {
        let seg = segment(count, n, r);
        let want = &full[seg.start * 8..seg.end * 8];
        assert_eq!(d, &sha256_hex(want), "reduce_scatter on rank {r} of {n}");
    }

    let cmd = json!({"op": "all_gather", "dtype": "bf16", "count": 333, "seed": 6});
    let want = inputs(n, ElementType::BF16, 333, 6).concat();
    for d in ok(&g.all(&cmd, T).unwrap()) {
        assert_eq!(d, sha256_hex(&want), "all_gather of {n}");
    }

    let root = n - 1;
    let cmd = json!({"op": "broadcast", "root": root, "dtype": "f64", "count": 999, "seed": 7});
    let want = pattern(ElementType::F64, 999, root as u32, 7);
    for d in ok(&g.all(&cmd, T).unwrap()) {
        assert_eq!(d, sha256_hex(&want), "broadcast of {n}");
    }
    ok(&g.all(&json!({"op": "barrier"}), T).unwrap());

    // Arrays whose arena copies take the streaming path (each rank's
    // segment, all-gather piece and broadcast at least a megabyte).
    // (A group of their own, after the first is gone: 256-byte chunks would
    // be too many for them.)
    if matches!(path, Path::Arenas) {
        drop(g);
        let mut g = RankGroup::start(&tessel_bench_bin(), n, &path.options()).unwrap();
        let count = (1 << 20) + 7;
        for (op, in_place) in [(ReduceOp::Sum, false), (ReduceOp::Max, true)] {
            let cmd = json!({"op": "all_reduce", "reduce": op.name(), "dtype": "f32",
                             "count": count, "seed": 8, "in_place": in_place});
            let want =
                reference_reduce(op, ElementType::F32, &inputs(n, ElementType::F32, count, 8))
                    .unwrap();
            for (r, d) in ok(&g.all(&cmd, T).unwrap()).iter().enumerate() {
                assert_eq!(
                    d,
                    &sha256_hex(&want),
                    "large all_reduce (in place: {in_place}) on rank {r} of {n}"
                );
            }
        }
        let cmd = json!({"op": "all_gather", "dtype": "bf16", "count": 600_001, "seed": 9});
        let want = inputs(n, ElementType::BF16, 600_001, 9).concat();
        for d in ok(&g.all(&cmd, T).unwrap()) {
            assert_eq!(d, sha256_hex(&want), "large all_gather of {n}");
        }
        let cmd =
            json!({"op": "broadcast", "root": 0, "dtype": "f64", "count": 140_001, "seed": 10});
        let want = pattern(ElementType::F64, 140_001, 0, 10);
        for d in ok(&g.all(&cmd, T).unwrap()) {
            assert_eq!(d, sha256_hex(&want), "large broadcast of {n}");
        }
    }
}

#[test]
fn collectives_of_two_ranks_over_shared_memory_match_the_reference() {
    collectives_match_the_reference(2, Path::Arenas);
}

#[test]
fn collectives_of_three_ranks_over_shared_memory_match_the_reference() {
    collectives_match_the_reference(3, Path::Arenas);
}

#[test]
fn collectives_of_four_ranks_over_shared_memory_match_the_reference() {
    collectives_match_the_reference(4, Path::Arenas);
}

#[test]
fn collectives_of_three_ranks_on_the_shared_memory_ring_match_the_reference() {
    collectives_match_the_reference(3, Path::ShmRing);
}

#[test]
fn collectives_of_two_ranks_over_the_network_match_the_reference() {
    collectives_match_the_reference(2, Path::Network);
}

#[test]
fn collectives_of_three_ranks_over_the_network_match_the_reference() {
    collectives_match_the_reference(3, Path::Network);
}

#[test]
fn collectives_of_four_ranks_over_the_network_match_the_reference() {
    collectives_match_the_reference(4, Path::Network);
}

#[test]
fn collectives_of_three_ranks_on_quic_streams_match_the_reference() {
    collectives_match_the_reference(3, Path::Quic);
}

#[test]
fn collectives_of_two_ranks_over_plain_tcp_match_the_reference() {
    collectives_match_the_reference(2, Path::Plain);
}

#[test]
fn collectives_of_three_ranks_over_plain_tcp_match_the_reference() {
    collectives_match_the_reference(3, Path::Plain);
}

/// Ranks that look like two hosts (two boot ids): shared memory inside a
/// host, the network across (sealed data channels, or plain TCP ones), in
/// one ring.
fn mixed_paths_in_one_ring(plain: bool) {
    let ids = ["host-a", "host-a", "host-b", "host-b"]
        .map(String::from)
        .to_vec();
    let mut g = RankGroup::start(
        &tessel_bench_bin(),
        4,
        &RankOptions {
            boot_ids: Some(ids),
            chunk_bytes: Some(1024),
            plain,
            ..RankOptions::default()
        },
    )
    .unwrap();
    for (op, in_place) in [("mean", false), ("sum", true)] {
        let cmd = json!({"op": "all_reduce", "reduce": op, "dtype": "f32", "count": 100_000,
                         "seed": 3, "in_place": in_place});
        let want = reference_reduce(
            ReduceOp::parse(op).unwrap(),
            ElementType::F32,
            &inputs(4, ElementType::F32, 100_000, 3),
        )
        .unwrap();
        for d in ok(&g.all(&cmd, T).unwrap()) {
            assert_eq!(d, sha256_hex(&want), "{op}, in place: {in_place}");
        }
    }
}

#[test]
fn mixed_paths_in_one_ring_match_the_reference() {
    mixed_paths_in_one_ring(false);
}

#[test]
fn mixed_paths_with_plain_tcp_in_one_ring_match_the_reference() {
    mixed_paths_in_one_ring(true);
}

/// Two ranks, on `path`.
fn pair(path: Path) -> RankGroup {
    RankGroup::start(&tessel_bench_bin(), 2, &path.options()).unwrap()
}

/// 1 GiB point to point, and 10,000 small arrays of every dtype, byte for
/// byte (the sender's digest of what it sent equals the receiver's).
fn point_to_point(path: Path) {
    let mut g = pair(path);
    let count = (1usize << 30) / 8;
    g.send(
        0,
        &json!({"op": "send", "to": 1, "tag": 0, "dtype": "s64", "count": count, "seed": 1}),
    )
    .unwrap();
    g.send(
        1,
        &json!({"op": "recv", "from": 0, "tag": 0, "dtype": "s64", "count": count}),
    )
    .unwrap();
    let sent = ok(&[g.answer(0, T).unwrap()]);
    let got = ok(&[g.answer(1, T).unwrap()]);
    assert_eq!(sent, got, "1 GiB");

    let mut tag = 1u64 << 32;
    for dtype in ElementType::ALL {
        let repeat = 770; // 13 dtypes × 770 = 10,010 arrays
        g.send(
            0,
            &json!({"op": "send", "to": 1, "tag": tag, "dtype": dtype.name(), "count": 17,
                    "seed": 2, "repeat": repeat}),
        )
        .unwrap();
        g.send(
            1,
            &json!({"op": "recv", "from": 0, "tag": tag, "dtype": dtype.name(), "count": 17,
                    "repeat": repeat}),
        )
        .unwrap();
        let sent = ok(&[g.answer(0, T).unwrap()]);
        let got = ok(&[g.answer(1, T).unwrap()]);
        assert_eq!(sent, got, "{}", dtype.name());
        tag += 1 << 20;
    }
}

#[test]
fn point_to_point_over_the_network_is_byte_exact() {
    point_to_point(Path::Network);
}

#[test]
fn point_to_point_over_plain_tcp_is_byte_exact() {
    point_to_point(Path::Plain);
}

#[test]
fn point_to_point_over_shared_memory_is_byte_exact() {
    point_to_point(Path::Arenas);
    assert!(
        no_shm_files_left(),
        "every shared-memory file is removed after its transfer"
    );
}

/// CPU time a process has used, in clock ticks (`/proc/PID/stat`: user and
/// system time, the 14th and 15th fields).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    // Fields counted from the state (the 3rd): utime is the 14th.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// SIGKILL of a sender in the middle of a striped payload (512 MiB over
/// two connections, the network path): the receiver's wait ends at its
/// deadline with nothing handed out, and it keeps receiving from others,
/// striped payloads included (stripe invariants 3 and 4: the half-filled
/// assembly is dropped once the dead sender's connections time out; a
/// build that printed it showed both parts failing 4–14 MB in).
#[test]
fn a_sender_killed_mid_payload_leaves_the_receiver_serving() {
    let deadline_ms = 10_000;
    let mut g = RankGroup::start(
        &tessel_bench_bin(),
        3,
        &RankOptions {
            force_network: true,
            timeout_ms: Some(deadline_ms),
            ..RankOptions::default()
        },
    )
    .unwrap();
    let (sender, receiver, other) = (0, 1, 2);
    let receiver_pid = g.pid(receiver);
    // `from` sends `mib` MiB to the receiver under `tag`.
    let transfer = |g: &mut RankGroup, from: usize, tag: u64, mib: usize| {
        let count = (mib << 20) / 8;
        g.send(
            from,
            &json!({"op": "send", "to": receiver, "tag": tag, "dtype": "s64", "count": count,
                    "seed": tag}),
        )
        .unwrap();
        g.send(
            receiver,
            &json!({"op": "recv", "from": from, "tag": tag, "dtype": "s64", "count": count}),
        )
        .unwrap();
    };
    // 16 MiB, striped: opens both connections (their handshakes cost CPU).
    transfer(&mut g, sender, 0, 16);
    let (sent, got) = (g.answer(sender, T).unwrap(), g.answer(receiver, T).unwrap());
    assert_eq!(ok(&[sent]), ok(&[got]));

    transfer(&mut g, sender, 1, 512);
    // The sender first makes its array (seconds, while the receiver waits
    // idle), then sends it in a fraction of that: once the receiver has
    // spent 30 ms of CPU, the payload is on its way.
    let idle = cpu_ticks(receiver_pid);
    let start = Instant::now();
    while cpu_ticks(receiver_pid) < idle + 3 {
        assert!(start.elapsed() < T, "the receiver never got busy");
        std::thread::sleep(Duration::from_millis(2));
    }
    g.kill(sender);
    let a = g
        .answer(receiver, Duration::from_millis(deadline_ms + 5_000))
        .unwrap();
    assert_eq!(a["ok"], false, "nothing arrives: {a}");
    assert!(a.get("sha256").is_none(), "no partial payload");

    transfer(&mut g, other, 2, 64);
    let sent = ok(&[g.answer(other, T).unwrap()]);
    let got = ok(&[g.answer(receiver, T).unwrap()]);
    assert_eq!(
        sent, got,
        "64 MiB from another rank, striped, after the kill"
    );
}

fn no_shm_files_left() -> bool {
    // Files of processes that are gone (this test's ranks are).
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok).all(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(pid) = name
                    .strip_prefix("tessel-")
                    .and_then(|r| r.split('-').next())
                else {
                    return true;
                };
                std::path::Path::new(&format!("/proc/{pid}")).exists()
            })
        })
        .unwrap_or(true)
}

/// Different sizes or dtypes → every rank gets the same error, at once.
#[test]
fn mismatched_collectives_fail_the_same_way_on_every_rank() {
    for path in [Path::Arenas, Path::Network, Path::Plain] {
        // Sizes that differ, and sizes that differ in algorithm (small
        // data riding with the descriptors against the ring).
        for (other, bytes) in [(200, 800), (20_000, 80_000)] {
            let mut g = RankGroup::start(
                &tessel_bench_bin(),
                3,
                &RankOptions {
                    timeout_ms: Some(30_000),
                    ..path.options()
                },
            )
            .unwrap();
            let started = Instant::now();
            for r in 0..3 {
                let count = if r == 1 { other } else { 100 };
                g.send(
                    r,
                    &json!({"op": "all_reduce", "reduce": "sum", "dtype": "f32", "count": count, "seed": 1}),
                ).unwrap();
            }
            let errors: Vec<String> = (0..3)
                .map(|r| {
                    let a = g.answer(r, T).unwrap();
                    assert_eq!(a["ok"], false, "rank {r}: {a}");
                    a["error"].as_str().unwrap().to_owned()
                })
                .collect();
            assert!(
                errors.iter().all(|e| e == &errors[0]),
                "the same error everywhere: {errors:?}"
            );
            let want = format!("rank 1: all_reduce sum of {bytes} bytes of f32");
            assert!(errors[0].contains(&want), "{}", errors[0]);
            assert!(started.elapsed() < Duration::from_secs(10), "no hang");
        }

        // In place on one rank, not on the other: the two end differently
        // over arenas, so they must not meet.
        let mut g = pair(path);
        for r in 0..2 {
            g.send(
                r,
                &json!({"op": "all_reduce", "reduce": "sum", "dtype": "f32", "count": 20_000,
                        "seed": 1, "in_place": r == 0}),
            )
            .unwrap();
        }
        let (a, b) = (g.answer(0, T).unwrap(), g.answer(1, T).unwrap());
        assert_eq!((&a["ok"], &b["ok"]), (&json!(false), &json!(false)));
        assert_eq!(a["error"], b["error"]);
        let error = a["error"].as_str().unwrap();
        assert!(
            error.contains("rank 0: all_reduce sum in place of 80000 bytes"),
            "{error}"
        );

        // A dtype mismatch in a fresh group.
        let mut g = RankGroup::start(&tessel_bench_bin(), 2, &RankOptions::default()).unwrap();
        g.send(
            0,
            &json!({"op": "all_gather", "dtype": "f32", "count": 10, "seed": 1}),
        )
        .unwrap();
        g.send(
            1,
            &json!({"op": "all_gather", "dtype": "s32", "count": 10, "seed": 1}),
        )
        .unwrap();
        let (a, b) = (g.answer(0, T).unwrap(), g.answer(1, T).unwrap());
        assert_eq!(a["ok"], false);
        assert_eq!(a["error"], b["error"]);
    }
}

/// SIGKILL of a rank mid-all-reduce: every other rank fails within the
/// deadline (and hands out nothing); the communicator is then broken.
fn a_killed_rank_fails_the_others(path: Path, in_place: bool) {
    let deadline_ms = 10_000;
    let mut g = RankGroup::start(
        &tessel_bench_bin(),
        4,
        &RankOptions {
            timeout_ms: Some(deadline_ms),
            ..path.options()
        },
    )
    .unwrap();
    // Warm up the connections, then a long series of all-reduces.
    ok(&g
        .all(
            &json!({"op": "all_reduce", "reduce": "sum", "dtype": "f32", "count": 1024, "seed": 1}),
            T,
        )
        .unwrap());
    let cmd = json!({"op": "all_reduce", "reduce": "sum", "dtype": "f32",
                     "count": 4 << 20, "seed": 1, "repeat": 1000, "in_place": in_place});
    for r in 0..4 {
        g.send(r, &cmd).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let killed_at = Instant::now();
    g.kill(2);
    for r in [0, 1, 3] {
        let a = g
            .answer(r, Duration::from_millis(deadline_ms + 5_000))
            .unwrap();
        eprintln!("rank {r} after {:?}: {a}", killed_at.elapsed());
        assert_eq!(a["ok"], false, "rank {r} must fail: {a}");
        assert!(a.get("sha256").is_none(), "no partial result");
        assert!(
            killed_at.elapsed() < Duration::from_millis(deadline_ms + 1_000),
            "rank {r} failed {:?} after the kill: {a}",
            killed_at.elapsed()
        );
    }
    for r in [0, 1, 3] {
        g.send(r, &json!({"op": "barrier"})).unwrap();
        let a = g.answer(r, T).unwrap();
        assert_eq!(a["ok"], false);
        assert!(a["error"].as_str().unwrap().contains("broken"), "{a}");
    }
}

#[test]
fn a_killed_rank_fails_the_others_within_the_deadline_over_the_network() {
    a_killed_rank_fails_the_others(Path::Network, false);
}

#[test]
fn a_killed_rank_fails_the_others_within_the_deadline_on_quic_streams() {
    a_killed_rank_fails_the_others(Path::Quic, false);
}

#[test]
fn a_killed_rank_fails_the_others_within_the_deadline_over_plain_tcp() {
    a_killed_rank_fails_the_others(Path::Plain, false);
}

#[test]
fn a_killed_rank_fails_the_others_within_the_deadline_over_arenas() {
    a_killed_rank_fails_the_others(Path::Arenas, false);
}

#[test]
fn a_killed_rank_fails_the_others_within_the_deadline_in_place() {
    a_killed_rank_fails_the_others(Path::Arenas, true);
}
