//! Initial values of a job's arrays, generated one process-local block at a
//! time.
//!
//! Invariants:
//! 1. Random initializers are counter-based: element `i` of the global array
//!    is a function of `(seed, i)` only, so a process generates just its
//!    block and every process count starts from the same values.
//! 2. SplitMix64 over `seed · φ ⊕ splitmix(i)`; uniform draws take the top
//!    53 bits, normal draws are Box–Muller over draws `2i` and `2i+1`;
//!    computed in f64, rounded once to the array's type (integers saturate).

use half::{bf16, f16};
use tessel_pjrt::{ElementType, HostBuffer};

use crate::job::Init;

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform draw in `[0, 1)` for counter `i` (invariant 2).
fn uniform(seed: u64, i: u64) -> f64 {
    let h = mix(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ mix(i));
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The value of global element `i`.
fn value(init: &Init, i: u64) -> f64 {
    match *init {
        Init::Zeros | Init::Npy { .. } => 0.0,
        Init::Constant { value } => value,
        Init::Uniform { low, high, seed } => low + (high - low) * uniform(seed, i),
        Init::Normal { mean, std, seed } => {
            let u1 = 1.0 - uniform(seed, 2 * i); // (0, 1]
            let u2 = uniform(seed, 2 * i + 1);
            mean + std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        }
    }
}

fn encode(ty: ElementType, v: f64, out: &mut Vec<u8>) {
    match ty {
        ElementType::F64 => out.extend_from_slice(&v.to_le_bytes()),
        ElementType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        ElementType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
        ElementType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
        ElementType::S8 => out.extend_from_slice(&(v.round() as i8).to_le_bytes()),
        ElementType::S16 => out.extend_from_slice(&(v.round() as i16).to_le_bytes()),
        ElementType::S32 => out.extend_from_slice(&(v.round() as i32).to_le_bytes()),
        ElementType::S64 => out.extend_from_slice(&(v.round() as i64).to_le_bytes()),
        ElementType::U8 => out.extend_from_slice(&(v.round() as u8).to_le_bytes()),
        ElementType::U16 => out.extend_from_slice(&(v.round() as u16).to_le_bytes()),
        ElementType::U32 => out.extend_from_slice(&(v.round() as u32).to_le_bytes()),
        ElementType::U64 => out.extend_from_slice(&(v.round() as u64).to_le_bytes()),
        ElementType::Pred => out.push(u8::from(v != 0.0)),
    }
}

/// The block `lo..hi` of dimension `dim` (the whole array when `block` is
/// `None`) of an array of global shape `dims` initialised by `init`, which
/// must not be `Npy` (files are sliced by the caller).
pub fn generate(
    init: &Init,
    ty: ElementType,
    dims: &[i64],
    block: Option<(usize, usize, usize)>,
) -> Result<HostBuffer, String> {
    let (dim, lo, hi) = block.unwrap_or((0, 0, dims.first().copied().unwrap_or(1) as usize));
    let (outer, len, inner) = if dims.is_empty() {
        (1, 1, 1)
    } else {
        let outer: i64 = dims[..dim].iter().product();
        let inner: i64 = dims[dim + 1..].iter().product();
        (outer as u64, dims[dim] as u64, inner as u64)
    };
    let count = outer * (hi - lo) as u64 * inner;
    let mut out = Vec::with_capacity(count as usize * ty.size());
    for o in 0..outer {
        for j in lo as u64..hi as u64 {
            for k in 0..inner {
                encode(ty, value(init, (o * len + j) * inner + k), &mut out);
            }
        }
    }
    let mut local = dims.to_vec();
    if !local.is_empty() {
        local[dim] = (hi - lo) as i64;
    }
    HostBuffer::from_bytes(ty, &local, out).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{concat_dim, slice_dim};

    #[test]
    fn blocks_are_slices_of_the_global_array() {
        let init = Init::Normal {
            mean: 0.5,
            std: 2.0,
            seed: 7,
        };
        let dims = [6, 4, 3];
        let global = generate(&init, ElementType::F32, &dims, None).unwrap();
        for dim in 0..3 {
            let len = dims[dim] as usize;
            let half = len / 2;
            let a = generate(&init, ElementType::F32, &dims, Some((dim, 0, half))).unwrap();
            let b = generate(&init, ElementType::F32, &dims, Some((dim, half, len))).unwrap();
            assert_eq!(a.bytes(), slice_dim(&global, dim, 0, half).bytes());
            assert_eq!(concat_dim(&[a, b], dim).bytes(), global.bytes());
        }
    }

    #[test]
    fn draws_have_the_asked_moments_and_depend_on_the_seed() {
        let n = 100_000;
        let normal = |seed| {
            generate(
                &Init::Normal {
                    mean: 1.0,
                    std: 3.0,
                    seed,
                },
                ElementType::F64,
                &[n],
                None,
            )
            .unwrap()
            .to_vec::<f64>()
            .unwrap()
        };
        let v = normal(1);
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert!((var.sqrt() - 3.0).abs() < 0.05, "std {}", var.sqrt());
        assert_ne!(v, normal(2));
        let u = generate(
            &Init::Uniform {
                low: -1.0,
                high: 1.0,
                seed: 3,
            },
            ElementType::F32,
            &[n],
            None,
        )
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
        assert!(u.iter().all(|x| (-1.0..1.0).contains(x)));
        let m = u.iter().sum::<f32>() / n as f32;
        assert!(m.abs() < 0.02, "mean {m}");
    }

    #[test]
    fn constants_scalars_and_integer_types() {
        let c = generate(&Init::Constant { value: 2.6 }, ElementType::S32, &[3], None).unwrap();
        assert_eq!(c.to_vec::<i32>().unwrap(), vec![3, 3, 3]);
        let s = generate(
            &Init::Constant { value: 0.25 },
            ElementType::BF16,
            &[],
            None,
        )
        .unwrap();
        assert_eq!(s.dims(), &[] as &[i64]);
        assert_eq!(s.to_vec::<bf16>().unwrap(), vec![bf16::from_f32(0.25)]);
        let z = generate(&Init::Zeros, ElementType::Pred, &[2, 2], None).unwrap();
        assert_eq!(z.bytes(), &[0, 0, 0, 0]);
    }
}
