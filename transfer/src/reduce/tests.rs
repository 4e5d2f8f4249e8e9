//! Reductions against exact and reference results, in every dtype and order.

use super::*;

#[test]
fn chunks_cover_a_segment_in_order() {
    let got: Vec<_> = chunk_ranges(10..35, 10).collect();
    assert_eq!(got, vec![10..20, 20..30, 30..35]);
    assert_eq!(chunk_ranges(7..7, 4).count(), 0);
    assert_eq!(
        chunk_ranges(0..3, 0).count(),
        3,
        "a chunk is at least a byte"
    );
}

#[test]
fn pieces_split_anywhere_combine_as_one_buffer() {
    let mut seed = 7u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) as usize
    };
    for dtype in REDUCIBLE {
        for op in ReduceOp::ALL {
            // Over FOLD_BLOCK, so blocks and pieces cross.
            let count = 9000 + next() % 100;
            let bytes = count * dtype.size();
            let gen = |salt: u64| -> Vec<u8> {
                (0..bytes)
                    .map(|i| ((i as u64 * 31 + salt * 17) % 251) as u8 & 0x3f)
                    .collect()
            };
            let (own, incoming) = (gen(1), gen(2));
            let mut want = own.clone();
            combine(op, dtype, &mut want, &incoming).unwrap();
            // Cuts anywhere, empty pieces included.
            let mut cuts: Vec<usize> = (0..40).map(|_| next() % (bytes + 1)).collect();
            cuts.extend([0, 0, bytes]);
            cuts.sort();
            let pieces: Vec<&[u8]> = std::iter::once(0)
                .chain(cuts.iter().copied())
                .zip(cuts.iter().copied())
                .map(|(a, b)| &incoming[a..b])
                .collect();
            let mut out = vec![0xAA];
            combine_pieces_into(op, dtype, &own, pieces, &mut out).unwrap();
            assert_eq!(out[0], 0xAA, "appends");
            assert_eq!(&out[1..], &want[..], "{op:?} {}", dtype.name());
        }
    }
    let own = vec![0u8; 16];
    let mut out = Vec::new();
    for pieces in [
        vec![&own[..12]],
        vec![&own[..], &own[..4]],
        vec![&own[..14]],
    ] {
        out.clear();
        assert!(
            combine_pieces_into(ReduceOp::Sum, ElementType::F32, &own, pieces, &mut out).is_err()
        );
    }
    assert!(
        combine_pieces_into(ReduceOp::Sum, ElementType::Pred, &own, [&own[..]], &mut out).is_err()
    );
}

#[test]
fn disjoint_halves() {
    let mut v: Vec<u8> = (0..10).collect();
    let (a, b) = disjoint(&mut v, 0..3, 5..10);
    assert_eq!(a, &[0, 1, 2]);
    b[0] = 99;
    let (a, b) = disjoint(&mut v, 5..7, 1..2);
    assert_eq!(a, &[99, 6]);
    assert_eq!(b, &[1]);
}

#[test]
fn ring_schedules_visit_every_segment_once_per_pass() {
    // Reduce phase: the segment a rank receives at step s is the one
    // it sends at step s + 1, and after n - 1 steps rank r has received
    // segment r last.
    for n in 2..7usize {
        for r in 0..n {
            let send = |s: usize| reduce_scatter_step(n, r, s).0;
            let recv = |s: usize| reduce_scatter_step(n, r, s).1;
            for s in 0..n - 2 {
                assert_eq!(recv(s), send(s + 1));
            }
            assert_eq!(recv(n - 2), r);
            // What rank r sends at step s is what r + 1 receives.
            let recv_next = |s: usize| reduce_scatter_step(n, (r + 1) % n, s).1;
            for s in 0..n - 1 {
                assert_eq!(send(s), recv_next(s));
            }
        }
    }
}

fn bytes<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

#[test]
fn integer_ops_are_exact_and_sums_wrap() {
    let a = bytes(&[1i32, -5, i32::MAX, 7]);
    let b = bytes(&[2i32, 3, 1, -7]);
    let mut own = a.clone();
    combine(ReduceOp::Sum, ElementType::S32, &mut own, &b).unwrap();
    assert_eq!(own, bytes(&[3i32, -2, i32::MIN, 0]));
    let mut own = a.clone();
    combine(ReduceOp::Max, ElementType::S32, &mut own, &b).unwrap();
    assert_eq!(own, bytes(&[2i32, 3, i32::MAX, 7]));
    let mut own = a;
    combine(ReduceOp::Min, ElementType::S32, &mut own, &b).unwrap();
    assert_eq!(own, bytes(&[1i32, -5, 1, -7]));
    let mut m = bytes(&[7i64, -7]);
    finish_mean(ElementType::S64, &mut m, 2).unwrap();
    assert_eq!(m, bytes(&[3i64, -3]), "toward zero");
}

#[test]
fn half_types_round_through_f32() {
    let a = bytes(&[f16::from_f32(1.5).to_bits(), f16::from_f32(-2.0).to_bits()]);
    let b = bytes(&[f16::from_f32(0.25).to_bits(), f16::from_f32(8.0).to_bits()]);
    let mut own = a;
    combine(ReduceOp::Sum, ElementType::F16, &mut own, &b).unwrap();
    let v: Vec<u16> = bytemuck::pod_collect_to_vec(&own);
    assert_eq!(f16::from_bits(v[0]).to_f32(), 1.75);
    assert_eq!(f16::from_bits(v[1]).to_f32(), 6.0);
    let mut own = bytes(&[bf16::from_f32(3.0).to_bits()]);
    combine(
        ReduceOp::Max,
        ElementType::BF16,
        &mut own,
        &bytes(&[bf16::from_f32(4.0).to_bits()]),
    )
    .unwrap();
    let v: Vec<u16> = bytemuck::pod_collect_to_vec(&own);
    assert_eq!(bf16::from_bits(v[0]).to_f32(), 4.0);
}

#[test]
fn unaligned_buffers_give_the_same_result() {
    let a: Vec<f32> = (0..33).map(|i| i as f32 * 0.1).collect();
    let b: Vec<f32> = (0..33).map(|i| 1.0 / (i as f32 + 1.0)).collect();
    let mut aligned = bytes(&a);
    combine(ReduceOp::Sum, ElementType::F32, &mut aligned, &bytes(&b)).unwrap();
    let mut backing = [0u8; 1 + 33 * 4];
    backing[1..].copy_from_slice(&bytes(&a));
    let mut inc = [0u8; 1 + 33 * 4];
    inc[1..].copy_from_slice(&bytes(&b));
    combine(
        ReduceOp::Sum,
        ElementType::F32,
        &mut backing[1..],
        &inc[1..],
    )
    .unwrap();
    assert_eq!(&backing[1..], &aligned[..]);
}

#[test]
fn unsupported_types_and_lengths_are_refused() {
    let mut own = vec![0u8; 4];
    assert!(combine(ReduceOp::Sum, ElementType::U8, &mut own, &[0; 4]).is_err());
    assert!(combine(ReduceOp::Sum, ElementType::F32, &mut own, &[0; 8]).is_err());
    assert!(combine(ReduceOp::Sum, ElementType::F64, &mut own, &[0; 4]).is_err());
}

#[test]
fn segments_cover_the_array_without_overlap() {
    for count in [0usize, 1, 5, 7, 1000] {
        for n in 1..6 {
            let mut next = 0;
            for j in 0..n {
                let r = segment(count, n, j);
                assert_eq!(r.start, next);
                next = r.end;
            }
            assert_eq!(next, count);
        }
    }
}

#[test]
fn reference_follows_the_documented_order() {
    let x = [1e8f32, 1.0, -1e8];
    // Large: three ranks, three segments of k elements; segment j is
    // folded from rank j+1: ((x[j+1] + x[j+2]) + x[j]).
    let k = SMALL_ALL_REDUCE / 4 / 3 + 1;
    let inputs: Vec<Vec<u8>> = (0..3).map(|r| bytes(&vec![x[r]; 3 * k])).collect();
    let out = reference_reduce(ReduceOp::Sum, ElementType::F32, &inputs).unwrap();
    let out: Vec<f32> = bytemuck::pod_collect_to_vec(&out);
    let order = |j: usize| (x[(j + 1) % 3] + x[(j + 2) % 3]) + x[j];
    assert_eq!([out[0], out[k], out[2 * k]], [order(0), order(1), order(2)]);
    // The order matters for these values: not every segment is equal.
    assert_ne!(out[0], out[k]);
    // Small: every element folded in rank order, ((x[0] + x[1]) + x[2]).
    let inputs: Vec<Vec<u8>> = (0..3).map(|r| bytes(&[x[r]; 3])).collect();
    let out = reference_reduce(ReduceOp::Sum, ElementType::F32, &inputs).unwrap();
    let out: Vec<f32> = bytemuck::pod_collect_to_vec(&out);
    assert_eq!(out, vec![(x[0] + x[1]) + x[2]; 3]);
}

/// `fold_onto` over each segment's inputs in the ring's order equals
/// the ring's reference bit for bit, across block boundaries, with
/// NaNs of different payloads and zeros of both signs (where the
/// operand order shows in the result bits).
#[test]
fn folding_a_segment_in_one_place_equals_the_ring() {
    let count_for = |dtype: ElementType| 2 * FOLD_BLOCK / dtype.size() + 7;
    for dtype in REDUCIBLE {
        for op in ReduceOp::ALL {
            // 2 to 4 ranks take the fused fold, 1 and 5 the blocks.
            for n in 1..=5usize {
                let count = count_for(dtype);
                let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (n as u64) << 8;
                let mut next = move || {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state
                };
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|_| {
                        (0..count)
                            .flat_map(|_| special_or_random(dtype, next()))
                            .collect()
                    })
                    .collect();
                let want = reference_ring_reduce(op, dtype, &inputs).unwrap();
                let size = dtype.size();
                for j in 0..n {
                    let seg = segment(count, n, j);
                    let bytes = seg.start * size..seg.end * size;
                    let others: Vec<&[u8]> = (1..n)
                        .map(|step| &inputs[(j + step) % n][bytes.clone()])
                        .collect();
                    let mut own = inputs[j][bytes.clone()].to_vec();
                    let mut copy = vec![0u8; own.len()];
                    fold_onto(op, dtype, &others, &mut own, Some(&mut copy), n).unwrap();
                    let what = format!("{} {} segment {j} of {n}", op.name(), dtype.name());
                    assert!(own == want[bytes.clone()], "{what}");
                    assert!(copy == own, "{what}: copy");
                    // Unaligned for the dtype: the blocks again.
                    let mut shifted = vec![0u8; own.len() + 1];
                    shifted[1..].copy_from_slice(&inputs[j][bytes.clone()]);
                    fold_onto(op, dtype, &others, &mut shifted[1..], None, n).unwrap();
                    assert!(shifted[1..] == want[bytes.clone()], "{what}: unaligned");
                }
            }
        }
    }
    let mut own = vec![0u8; 8];
    assert!(fold_onto(
        ReduceOp::Sum,
        ElementType::F32,
        &[&[0u8; 4]],
        &mut own,
        None,
        2
    )
    .is_err());
}

/// One element's bytes: mostly random, sometimes a NaN with a random
/// payload or a zero of either sign.
fn special_or_random(dtype: ElementType, r: u64) -> Vec<u8> {
    let pick = r % 8;
    let x = (r >> 8) as u32;
    match dtype {
        ElementType::F32 => {
            let v = match pick {
                0 => f32::from_bits(0x7fc0_0000 | (x & 0x3f_ffff) | 1),
                1 => -0.0,
                2 => 0.0,
                _ => (x % 2000) as f32 / 7.0 - 140.0,
            };
            bytes(&[v])
        }
        ElementType::F64 => {
            let v = match pick {
                0 => f64::from_bits(0x7ff8_0000_0000_0000 | (r >> 16) | 1),
                1 => -0.0,
                2 => 0.0,
                _ => (x % 2000) as f64 / 7.0 - 140.0,
            };
            bytes(&[v])
        }
        ElementType::F16 => {
            let v = match pick {
                0 => 0x7e00 | (x as u16 & 0x1ff) | 1,
                1 => f16::NEG_ZERO.to_bits(),
                _ => f16::from_f32((x % 200) as f32 / 7.0 - 14.0).to_bits(),
            };
            bytes(&[v])
        }
        ElementType::BF16 => {
            let v = match pick {
                0 => 0x7fc0 | (x as u16 & 0x3f) | 1,
                1 => bf16::NEG_ZERO.to_bits(),
                _ => bf16::from_f32((x % 200) as f32 / 7.0 - 14.0).to_bits(),
            };
            bytes(&[v])
        }
        ElementType::S32 => bytes(&[x as i32]),
        ElementType::S64 => bytes(&[r as i64]),
        _ => unreachable!(),
    }
}
