//! Deterministic arrays for tests and benchmarks of the transfer layer
//! (the collectives never use this): every process can regenerate any
//! rank's input, so a single-process reference needs no data shipped.

use half::{bf16, f16};
use tessel_pjrt::ElementType;

/// `count` elements of `dtype` for (`rank`, `seed`): floats in [-4, 4)
/// (exact in every float type's range, varied mantissas), integers over the
/// whole range (sums wrap), other types as raw bytes.
pub fn pattern(dtype: ElementType, count: usize, rank: u32, seed: u64) -> Vec<u8> {
    let mut state = seed ^ (u64::from(rank) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // splitmix64
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let unit = |x: u64| (x >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0;
    let mut out = Vec::with_capacity(count * dtype.size());
    for _ in 0..count {
        let x = next();
        match dtype {
            ElementType::F32 => out.extend_from_slice(&(unit(x) as f32).to_le_bytes()),
            ElementType::F64 => out.extend_from_slice(&unit(x).to_le_bytes()),
            ElementType::F16 => out.extend_from_slice(&f16::from_f64(unit(x)).to_le_bytes()),
            ElementType::BF16 => out.extend_from_slice(&bf16::from_f64(unit(x)).to_le_bytes()),
            other => out.extend_from_slice(&x.to_le_bytes()[..other.size()]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_deterministic_and_differ_by_rank() {
        let a = pattern(ElementType::F32, 100, 0, 7);
        assert_eq!(a, pattern(ElementType::F32, 100, 0, 7));
        assert_ne!(a, pattern(ElementType::F32, 100, 1, 7));
        assert_eq!(pattern(ElementType::BF16, 5, 0, 1).len(), 10);
        let v: Vec<f32> = bytemuck::pod_collect_to_vec(&a);
        assert!(v.iter().all(|x| (-4.0..4.0).contains(x)));
    }
}
