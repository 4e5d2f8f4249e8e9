//! Where a job's arrays live: which block of a split array each process
//! holds, and cutting and joining host arrays along one dimension. Pure
//! functions; the plan runner ([`crate::plan`]) does the I/O.
//!
//! Invariants:
//! 1. Devices are numbered row-major over the mesh and process `p` holds
//!    devices `p·D .. (p+1)·D` (`D` devices per process).
//! 2. A process's coordinates along an axis form one contiguous block, or
//!    the layout is refused ([`process_block`] fails): a process-local
//!    array is always one slice of the global one.
//! 3. `concat_dim(slices)` of the `slice_dim` pieces that tile a dimension
//!    gives back the original array, byte for byte.

use tessel_pjrt::HostBuffer;

/// A mesh: named axes with their sizes, outermost first.
pub type MeshAxes = [(String, usize)];

/// The coordinates along axis `axis` that process `process`'s devices
/// cover, as `(first, count)` (invariants 1, 2).
pub fn process_block(
    mesh: &MeshAxes,
    devices_per_process: usize,
    process: usize,
    axis: usize,
) -> Result<(usize, usize), String> {
    let size = mesh[axis].1;
    let inner: usize = mesh[axis + 1..].iter().map(|(_, n)| n).product();
    let mut coords: Vec<usize> = (0..devices_per_process)
        .map(|i| ((process * devices_per_process + i) / inner.max(1)) % size)
        .collect();
    coords.sort_unstable();
    coords.dedup();
    let first = coords[0];
    if coords.iter().enumerate().any(|(i, &c)| c != first + i) {
        return Err(format!(
            "process {process} would hold coordinates {coords:?} of axis `{}`, which are not one block; \
             order the mesh axes so a process's devices are contiguous along it",
            mesh[axis].0
        ));
    }
    Ok((first, coords.len()))
}

/// The process's first coordinate along the mesh's first axis (`$shard`).
pub fn shard_index(mesh: &MeshAxes, devices_per_process: usize, process: usize) -> usize {
    let inner: usize = mesh[1..].iter().map(|(_, n)| n).product();
    (process * devices_per_process / inner.max(1)) % mesh[0].1
}

/// `(outer, len, inner)`: elements before, along and after `dim`.
fn split_at_dim(dims: &[i64], dim: usize) -> (usize, usize, usize) {
    let outer: i64 = dims[..dim].iter().product();
    let inner: i64 = dims[dim + 1..].iter().product();
    (outer as usize, dims[dim] as usize, inner as usize)
}

/// Elements `lo..hi` of dimension `dim`.
pub fn slice_dim(a: &HostBuffer, dim: usize, lo: usize, hi: usize) -> HostBuffer {
    let (outer, len, inner) = split_at_dim(a.dims(), dim);
    assert!(lo <= hi && hi <= len, "slice {lo}..{hi} of {len}");
    let es = a.element_type().size();
    let row = inner * es;
    let mut out = Vec::with_capacity(outer * (hi - lo) * row);
    for o in 0..outer {
        let base = o * len * row;
        out.extend_from_slice(&a.bytes()[base + lo * row..base + hi * row]);
    }
    let mut dims = a.dims().to_vec();
    dims[dim] = (hi - lo) as i64;
    HostBuffer::from_bytes(a.element_type(), &dims, out).expect("sizes computed from the dims")
}

/// Joins `pieces` (equal in every dimension but `dim`) along `dim`.
pub fn concat_dim(pieces: &[HostBuffer], dim: usize) -> HostBuffer {
    let first = &pieces[0];
    let es = first.element_type().size();
    let (outer, _, inner) = split_at_dim(first.dims(), dim);
    let total: usize = pieces.iter().map(|p| p.dims()[dim] as usize).sum();
    let mut out = Vec::with_capacity(outer * total * inner * es);
    for o in 0..outer {
        for p in pieces {
            let row = p.dims()[dim] as usize * inner * es;
            out.extend_from_slice(&p.bytes()[o * row..(o + 1) * row]);
        }
    }
    let mut dims = first.dims().to_vec();
    dims[dim] = total as i64;
    HostBuffer::from_bytes(first.element_type(), &dims, out).expect("sizes computed from the dims")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(axes: &[(&str, usize)]) -> Vec<(String, usize)> {
        axes.iter().map(|(a, n)| (a.to_string(), *n)).collect()
    }

    #[test]
    fn processes_hold_contiguous_blocks_in_row_major_order() {
        let m = mesh(&[("data", 4)]);
        assert_eq!(process_block(&m, 1, 2, 0), Ok((2, 1)));
        assert_eq!(process_block(&m, 2, 1, 0), Ok((2, 2)));
        let m = mesh(&[("data", 2), ("model", 2)]);
        // Two devices per process: process 1 holds data row 1, both model columns.
        assert_eq!(process_block(&m, 2, 1, 0), Ok((1, 1)));
        assert_eq!(process_block(&m, 2, 1, 1), Ok((0, 2)));
        assert_eq!(shard_index(&m, 2, 1), 1);
        assert_eq!(shard_index(&mesh(&[("data", 4)]), 1, 3), 3);
    }

    #[test]
    fn a_scattered_block_is_refused() {
        // x=2 outer, data=3 inner, 2 devices per process: process 1 holds
        // devices 2 and 3, which are data coordinates 2 and 0.
        let m = mesh(&[("x", 2), ("data", 3)]);
        assert!(process_block(&m, 2, 1, 1).is_err());
        assert_eq!(process_block(&m, 2, 1, 0), Ok((0, 2)));
        assert_eq!(process_block(&m, 3, 1, 1), Ok((0, 3)));
    }

    #[test]
    fn slices_concatenate_back_to_the_original() {
        let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let a = HostBuffer::from_slice(&v, &[2, 4, 3]).unwrap();
        for dim in 0..3 {
            let len = a.dims()[dim] as usize;
            let pieces: Vec<_> = (0..len).map(|i| slice_dim(&a, dim, i, i + 1)).collect();
            assert_eq!(concat_dim(&pieces, dim).bytes(), a.bytes(), "dim {dim}");
        }
        let mid = slice_dim(&a, 1, 1, 3);
        assert_eq!(mid.dims(), &[2, 2, 3]);
        assert_eq!(
            mid.to_vec::<f32>().unwrap(),
            vec![3., 4., 5., 6., 7., 8., 15., 16., 17., 18., 19., 20.]
        );
    }
}
