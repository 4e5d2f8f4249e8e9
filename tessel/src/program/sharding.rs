//! From a sharding annotation to concrete tiles: which block of a global
//! array each partition holds, and how to split and reassemble arrays.
//!
//! Invariants:
//! 1. A [`Tiling`] of an array of rank r has r tile counts; every partition
//!    maps to one tile coordinate, and every tile is held by at least one
//!    partition (replicas hold the same tile).
//! 2. Splitting then assembling with the same tiling returns the original
//!    array byte for byte.
//! 3. Dimensions must divide evenly by their tile counts; uneven (padded)
//!    shardings are refused rather than guessed.

use std::collections::BTreeMap;

use tessel_pjrt::HostBuffer;

use crate::program::mlir::ShardingAnnotation;

/// Why a sharding cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardingError {
    /// A sharding tessel cannot apply.
    #[error("unsupported sharding `{sharding}`: {reason}")]
    Unsupported {
        /// The sharding as written.
        sharding: String,
        /// Why.
        reason: String,
    },
    /// A sharding that does not fit the shape or devices.
    #[error("sharding `{sharding}` does not fit: {reason}")]
    Mismatch {
        /// The sharding as written.
        sharding: String,
        /// Why.
        reason: String,
    },
}

fn unsupported(s: &str, reason: impl Into<String>) -> ShardingError {
    ShardingError::Unsupported {
        sharding: s.to_owned(),
        reason: reason.into(),
    }
}

fn mismatch(s: &str, reason: impl Into<String>) -> ShardingError {
    ShardingError::Mismatch {
        sharding: s.to_owned(),
        reason: reason.into(),
    }
}

/// Tiles of an array over `partitions` partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiling {
    /// Number of tiles along each dimension.
    pub tiles: Vec<usize>,
    /// Tile coordinate held by each partition.
    pub coords: Vec<Vec<usize>>,
}

impl Tiling {
    /// Every partition holds the whole array.
    pub fn replicated(rank: usize, partitions: usize) -> Tiling {
        Tiling {
            tiles: vec![1; rank],
            coords: vec![vec![0; rank]; partitions],
        }
    }

    /// The tiling an annotation describes for an array of `rank` over
    /// `partitions` partitions. No annotation means replicated.
    pub fn from_annotation(
        annotation: Option<&ShardingAnnotation>,
        rank: usize,
        partitions: usize,
        meshes: &BTreeMap<String, Vec<(String, usize)>>,
    ) -> Result<Tiling, ShardingError> {
        match annotation {
            None => Ok(Tiling::replicated(rank, partitions)),
            Some(ShardingAnnotation::Gspmd(s)) => gspmd(s, rank, partitions),
            Some(ShardingAnnotation::Shardy { mesh, dims }) => {
                shardy(mesh, dims, rank, partitions, meshes)
            }
        }
    }

    /// Shape of one tile of an array of shape `dims` (invariant 3).
    pub fn tile_dims(&self, dims: &[i64]) -> Option<Vec<i64>> {
        if dims.len() != self.tiles.len() {
            return None;
        }
        dims.iter()
            .zip(&self.tiles)
            .map(|(&d, &t)| (d % t as i64 == 0).then_some(d / t as i64))
            .collect()
    }

    /// Where `partition`'s tile of an array of shape `dims` starts, and its
    /// shape.
    pub fn tile(&self, dims: &[i64], partition: usize) -> Option<(Vec<i64>, Vec<i64>)> {
        let tile = self.tile_dims(dims)?;
        let coord = self.coords.get(partition)?;
        let start = coord
            .iter()
            .zip(&tile)
            .map(|(&c, &t)| c as i64 * t)
            .collect();
        Some((start, tile))
    }

    /// The block of `global` held by `partition`.
    pub fn shard(&self, global: &HostBuffer, partition: usize) -> Option<HostBuffer> {
        let (start, tile) = self.tile(global.dims(), partition)?;
        extract(global, &start, &tile)
    }

    /// Reassembles the global array of shape `dims` from per-partition
    /// shards (the first holder of each tile wins).
    pub fn assemble(&self, dims: &[i64], shards: &[HostBuffer]) -> Option<HostBuffer> {
        let tile = self.tile_dims(dims)?;
        let first = shards.first()?;
        let ty = first.element_type();
        let size = ty.size();
        let total = dims.iter().product::<i64>() as usize * size;
        let mut out = vec![0u8; total];
        let mut done = std::collections::BTreeSet::new();
        for (coord, shard) in self.coords.iter().zip(shards) {
            if shard.element_type() != ty || shard.dims() != tile.as_slice() {
                return None;
            }
            if !done.insert(coord.clone()) {
                continue;
            }
            let start: Vec<i64> = coord
                .iter()
                .zip(&tile)
                .map(|(&c, &t)| c as i64 * t)
                .collect();
            let mut offset = 0;
            copy_block(dims, &tile, &start, size, |dst, len| {
                out[dst..dst + len].copy_from_slice(&shard.bytes()[offset..offset + len]);
                offset += len;
            });
        }
        let expected: usize = self.tiles.iter().product();
        if done.len() != expected {
            return None;
        }
        HostBuffer::from_bytes(ty, dims, out).ok()
    }
}

/// The block of `a` at `start` with shape `shape`; `None` when it does not
/// lie inside `a`.
pub fn extract(a: &HostBuffer, start: &[i64], shape: &[i64]) -> Option<HostBuffer> {
    let dims = a.dims();
    let inside = start.len() == dims.len()
        && shape.len() == dims.len()
        && (0..dims.len())
            .all(|d| start[d] >= 0 && shape[d] >= 0 && start[d] + shape[d] <= dims[d]);
    if !inside {
        return None;
    }
    if start.iter().all(|&s| s == 0) && shape == dims {
        return Some(a.clone());
    }
    let size = a.element_type().size();
    let mut out = Vec::with_capacity(shape.iter().product::<i64>() as usize * size);
    copy_block(dims, shape, start, size, |src, len| {
        out.extend_from_slice(&a.bytes()[src..src + len])
    });
    HostBuffer::from_bytes(a.element_type(), shape, out).ok()
}

/// Writes `tile` into `out`, the bytes of an array of shape `dims` and
/// `tile`'s element type, at `start`; false when it does not fit.
pub fn insert(out: &mut [u8], dims: &[i64], start: &[i64], tile: &HostBuffer) -> bool {
    let shape = tile.dims();
    let size = tile.element_type().size();
    let fits = start.len() == dims.len()
        && shape.len() == dims.len()
        && (0..dims.len()).all(|d| start[d] >= 0 && start[d] + shape[d] <= dims[d])
        && out.len() == dims.iter().product::<i64>() as usize * size;
    if !fits {
        return false;
    }
    let mut offset = 0;
    copy_block(dims, shape, start, size, |dst, len| {
        out[dst..dst + len].copy_from_slice(&tile.bytes()[offset..offset + len]);
        offset += len;
    });
    true
}

/// Calls `f(byte offset in the global array, byte length)` for each
/// contiguous run of the block at `start` with shape `block`, in row-major
/// order of the block.
fn copy_block(
    global: &[i64],
    block: &[i64],
    start: &[i64],
    elem: usize,
    mut f: impl FnMut(usize, usize),
) {
    let rank = global.len();
    if rank == 0 {
        f(0, elem);
        return;
    }
    if block.contains(&0) {
        return;
    }
    let strides: Vec<usize> = (0..rank)
        .map(|d| global[d + 1..].iter().product::<i64>() as usize)
        .collect();
    let run = block[rank - 1] as usize * elem;
    let mut idx = vec![0i64; rank - 1];
    loop {
        let offset: usize = (0..rank - 1)
            .map(|d| (start[d] + idx[d]) as usize * strides[d])
            .sum::<usize>()
            + start[rank - 1] as usize;
        f(offset * elem, run);
        // Advance the outer index (odometer over dims 0..rank-1).
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < block[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut out = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        out[d] = i % dims[d];
        i /= dims[d];
    }
    out
}

fn parse_usize_list(s: &str, whole: &str) -> Result<Vec<usize>, ShardingError> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse::<usize>()
                .map_err(|_| unsupported(whole, format!("bad number `{x}`")))
        })
        .collect()
}

/// GSPMD's HloSharding text: `{replicated}`, `{maximal device=N}`,
/// `{devices=[a,b]<=[N]}` (optionally `<=[x,y]T(1,0)`), `{devices=[a,b]0,2,1,3}`,
/// each optionally with `last_tile_dim_replicate`.
fn gspmd(s: &str, rank: usize, partitions: usize) -> Result<Tiling, ShardingError> {
    let body = s
        .trim()
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .ok_or_else(|| unsupported(s, "expected `{...}`"))?
        .trim();
    if body == "replicated" || body.starts_with("maximal") {
        // A maximal sharding places the whole array on one device; as an
        // input every partition is given the whole array.
        return Ok(Tiling::replicated(rank, partitions));
    }
    let rest = body
        .strip_prefix("devices=[")
        .ok_or_else(|| unsupported(s, "expected replicated, maximal or devices=[...]"))?;
    let (tile_text, rest) = rest
        .split_once(']')
        .ok_or_else(|| unsupported(s, "unclosed `[`"))?;
    let mut tiles = parse_usize_list(tile_text, s)?;
    let (assignment_text, flags) = match rest.find(|c: char| c.is_whitespace()) {
        Some(i) => (&rest[..i], rest[i..].trim()),
        None => (rest, ""),
    };
    let replicate_last = match flags {
        "" => false,
        "last_tile_dim_replicate" => true,
        other => return Err(unsupported(s, format!("flag `{other}`"))),
    };
    let count: usize = tiles.iter().product();
    let devices: Vec<usize> = if let Some(iota) = assignment_text.strip_prefix("<=[") {
        let (reshape_text, transpose) = iota
            .split_once(']')
            .ok_or_else(|| unsupported(s, "unclosed `<=[`"))?;
        let reshape = parse_usize_list(reshape_text, s)?;
        if reshape.iter().product::<usize>() != count {
            return Err(mismatch(s, "iota size differs from the tile count"));
        }
        let perm = match transpose
            .strip_prefix("T(")
            .and_then(|t| t.strip_suffix(')'))
        {
            Some(p) => parse_usize_list(p, s)?,
            None if transpose.is_empty() => (0..reshape.len()).collect(),
            None => return Err(unsupported(s, format!("`{transpose}` after the iota"))),
        };
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        if sorted != (0..reshape.len()).collect::<Vec<_>>() {
            return Err(unsupported(s, "transpose is not a permutation"));
        }
        // Element k of the transposed array is the iota value at the
        // un-permuted coordinate.
        let tdims: Vec<usize> = perm.iter().map(|&p| reshape[p]).collect();
        (0..count)
            .map(|k| {
                let tc = unravel(k, &tdims);
                let mut orig = vec![0; reshape.len()];
                for (i, &p) in perm.iter().enumerate() {
                    orig[p] = tc[i];
                }
                orig.iter()
                    .zip(&reshape)
                    .fold(0, |acc, (&c, &d)| acc * d + c)
            })
            .collect()
    } else {
        parse_usize_list(assignment_text, s)?
    };
    if devices.len() != count {
        return Err(mismatch(
            s,
            format!("{} devices listed for {count} tiles", devices.len()),
        ));
    }
    if count != partitions {
        return Err(mismatch(
            s,
            format!("{count} tiles for {partitions} partitions"),
        ));
    }
    let tile_rank = if replicate_last { rank + 1 } else { rank };
    if tiles.len() != tile_rank {
        return Err(mismatch(
            s,
            format!(
                "{} tile dimensions for an array of rank {rank}",
                tiles.len()
            ),
        ));
    }
    let mut coords = vec![None; partitions];
    for (k, &dev) in devices.iter().enumerate() {
        let c = unravel(k, &tiles);
        let slot = coords
            .get_mut(dev)
            .ok_or_else(|| mismatch(s, format!("device {dev} out of range")))?;
        *slot = Some(c[..rank].to_vec());
    }
    if replicate_last {
        tiles.pop();
    }
    let coords = coords
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| mismatch(s, "not every partition holds a tile"))?;
    Ok(Tiling { tiles, coords })
}

/// Shardy: each dimension split over the named mesh axes (major to minor);
/// partition p sits at the row-major coordinate p of the mesh.
fn shardy(
    mesh: &str,
    dims: &[Vec<String>],
    rank: usize,
    partitions: usize,
    meshes: &BTreeMap<String, Vec<(String, usize)>>,
) -> Result<Tiling, ShardingError> {
    let label = format!("@{mesh}");
    let axes = meshes
        .get(mesh)
        .ok_or_else(|| mismatch(&label, "no such sdy.mesh in the module"))?;
    let sizes: Vec<usize> = axes.iter().map(|(_, n)| *n).collect();
    if sizes.iter().product::<usize>() != partitions {
        return Err(mismatch(
            &label,
            format!(
                "mesh has {} devices for {partitions} partitions",
                sizes.iter().product::<usize>()
            ),
        ));
    }
    // An empty list means fully replicated (e.g. a scalar result).
    if !dims.is_empty() && dims.len() != rank {
        return Err(mismatch(
            &label,
            format!("{} dimension shardings for rank {rank}", dims.len()),
        ));
    }
    let axis_index = |name: &str| {
        axes.iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| mismatch(&label, format!("unknown mesh axis `{name}`")))
    };
    let per_dim: Vec<Vec<usize>> = (0..rank)
        .map(|d| {
            dims.get(d).map_or(Ok(Vec::new()), |names| {
                names.iter().map(|n| axis_index(n)).collect()
            })
        })
        .collect::<Result<_, _>>()?;
    let tiles: Vec<usize> = per_dim
        .iter()
        .map(|ax| ax.iter().map(|&a| sizes[a]).product())
        .collect();
    let coords = (0..partitions)
        .map(|p| {
            let mc = unravel(p, &sizes);
            per_dim
                .iter()
                .map(|ax| ax.iter().fold(0, |acc, &a| acc * sizes[a] + mc[a]))
                .collect()
        })
        .collect();
    Ok(Tiling { tiles, coords })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iota(dims: &[i64]) -> HostBuffer {
        let n: i64 = dims.iter().product();
        HostBuffer::from_slice(&(0..n as i32).collect::<Vec<_>>(), dims).unwrap()
    }

    fn g(s: &str, rank: usize, partitions: usize) -> Result<Tiling, ShardingError> {
        Tiling::from_annotation(
            Some(&ShardingAnnotation::Gspmd(s.into())),
            rank,
            partitions,
            &BTreeMap::new(),
        )
    }

    #[test]
    fn one_dimensional_split() {
        let t = g("{devices=[4]<=[4]}", 1, 4).unwrap();
        let a = iota(&[8]);
        let shards: Vec<_> = (0..4).map(|p| t.shard(&a, p).unwrap()).collect();
        assert_eq!(shards[2].to_vec::<i32>().unwrap(), vec![4, 5]);
        assert_eq!(t.assemble(&[8], &shards).unwrap(), a);
    }

    #[test]
    fn two_dimensional_split_with_explicit_and_transposed_devices() {
        let a = iota(&[4, 6]);
        // Devices listed explicitly: tile (0,1) is held by device 2.
        let t = g("{devices=[2,2]0,2,1,3}", 2, 4).unwrap();
        assert_eq!(t.coords[2], vec![0, 1]);
        assert_eq!(
            t.shard(&a, 2).unwrap().to_vec::<i32>().unwrap(),
            vec![3, 4, 5, 9, 10, 11]
        );
        // <=[2,2]T(1,0) is the same assignment written as a transposed iota.
        assert_eq!(g("{devices=[2,2]<=[2,2]T(1,0)}", 2, 4).unwrap(), t);
        let shards: Vec<_> = (0..4).map(|p| t.shard(&a, p).unwrap()).collect();
        assert_eq!(t.assemble(&[4, 6], &shards).unwrap(), a);
    }

    #[test]
    fn partial_replication() {
        let t = g("{devices=[2,1,2]<=[4] last_tile_dim_replicate}", 2, 4).unwrap();
        assert_eq!(t.tiles, vec![2, 1]);
        assert_eq!(
            t.coords,
            vec![vec![0, 0], vec![0, 0], vec![1, 0], vec![1, 0]]
        );
        let a = iota(&[2, 3]);
        let shards: Vec<_> = (0..4).map(|p| t.shard(&a, p).unwrap()).collect();
        assert_eq!(t.assemble(&[2, 3], &shards).unwrap(), a);
    }

    #[test]
    fn replicated_and_maximal_give_everyone_everything() {
        for s in ["{replicated}", "{maximal device=1}"] {
            let t = g(s, 2, 3).unwrap();
            assert_eq!(t.shard(&iota(&[2, 2]), 2).unwrap(), iota(&[2, 2]));
        }
        let scalar = HostBuffer::scalar(7i32);
        let t = Tiling::replicated(0, 2);
        assert_eq!(t.shard(&scalar, 1).unwrap(), scalar);
        assert_eq!(
            t.assemble(&[], &[scalar.clone(), scalar.clone()]).unwrap(),
            scalar
        );
    }

    #[test]
    fn shardy_over_a_two_axis_mesh() {
        let meshes = BTreeMap::from([(
            "m".to_owned(),
            vec![("data".to_owned(), 2), ("model".to_owned(), 2)],
        )]);
        let ann = ShardingAnnotation::Shardy {
            mesh: "m".into(),
            dims: vec![vec!["model".into()], vec![]],
        };
        let t = Tiling::from_annotation(Some(&ann), 2, 4, &meshes).unwrap();
        assert_eq!(t.tiles, vec![2, 1]);
        // Device p = (data, model) row-major; dim 0 follows `model`.
        assert_eq!(
            t.coords,
            vec![vec![0, 0], vec![1, 0], vec![0, 0], vec![1, 0]]
        );
        let both = ShardingAnnotation::Shardy {
            mesh: "m".into(),
            dims: vec![vec!["data".into(), "model".into()]],
        };
        let t = Tiling::from_annotation(Some(&both), 1, 4, &meshes).unwrap();
        assert_eq!(t.coords, vec![vec![0], vec![1], vec![2], vec![3]]);
    }

    #[test]
    fn shardings_that_do_not_fit_are_refused() {
        assert!(
            g("{devices=[4]<=[4]}", 1, 2).is_err(),
            "4 tiles on 2 partitions"
        );
        assert!(g("{devices=[2,2]<=[4]}", 1, 4).is_err(), "rank mismatch");
        assert!(
            g("{devices=[2]0,0}", 1, 2).is_err(),
            "a partition without a tile"
        );
        assert!(g("{devices=[2]0,5}", 1, 2).is_err());
        assert!(g("{manual}", 1, 2).is_err());
        assert!(g("{devices=[2]<=[2] last_tile_dims={manual}}", 1, 2).is_err());
        let t = g("{devices=[4]<=[4]}", 1, 4).unwrap();
        assert!(
            t.shard(&iota(&[6]), 0).is_none(),
            "6 does not split in 4 (invariant 3)"
        );
        let meshes = BTreeMap::new();
        let ann = ShardingAnnotation::Shardy {
            mesh: "nope".into(),
            dims: vec![],
        };
        assert!(Tiling::from_annotation(Some(&ann), 0, 1, &meshes).is_err());
    }
}
