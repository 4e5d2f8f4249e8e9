//! Element-wise reductions on raw little-endian arrays (sans-IO), and the
//! single-process reference of every collective.
//!
//! Reduction order (what makes float results reproducible): the ring
//! all-reduce and reduce-scatter cut an array of `count` elements into one
//! segment per rank, segment `j` being elements
//! `[j * count / n, (j + 1) * count / n)`. Segment `j` is folded left along
//! the ring starting after its owner: `((x[j+1] ⊕ x[j+2]) ⊕ …) ⊕ x[j]`
//! (ranks mod `n`). An all-reduce of at most [`SMALL_ALL_REDUCE`] bytes
//! (with more than one rank) is instead folded in rank order on every rank:
//! `((x[0] ⊕ x[1]) ⊕ …) ⊕ x[n-1]`. [`reference_reduce`] applies exactly
//! these orders, so a distributed result equals it bit for bit.
//!
//! Invariants:
//! 1. Integer sums wrap (two's complement) and are therefore exact modulo
//!    2^bits and independent of order; integer means divide the sum by the
//!    rank count, rounding toward zero.
//! 2. `f16` and `bf16` are combined in `f32` and rounded back after every
//!    step (as the reference does), so the rounding sequence is fixed.
//! 3. `max`/`min` on floats follow IEEE maxNum/minNum (a NaN operand loses).

use std::ops::Range;

use half::{bf16, f16};
use tessel_pjrt::ElementType;

use crate::error::{Result, TransferError};

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
}

impl ReduceOp {
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];

    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

    pub fn parse(s: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.into_iter().find(|op| op.name() == s)
    }
}

/// The element types collectives reduce.
pub const REDUCIBLE: [ElementType; 6] = [
    ElementType::F32,
    ElementType::F64,
    ElementType::F16,
    ElementType::BF16,
    ElementType::S32,
    ElementType::S64,
];

/// Fails unless `dtype` is one of [`REDUCIBLE`].
pub fn check_reducible(dtype: ElementType) -> Result<()> {
    if REDUCIBLE.contains(&dtype) {
        Ok(())
    } else {
        Err(TransferError::InvalidArgument(format!(
            "{} cannot be reduced (supported: f32, f64, f16, bf16, s32, s64)",
            dtype.name()
        )))
    }
}

/// `own[i] = incoming[i] ⊕ own[i]` for every element. Both slices hold the
/// same number of `dtype` elements. For `Mean` this sums; [`finish_mean`]
/// divides once at the end.
pub fn combine(op: ReduceOp, dtype: ElementType, own: &mut [u8], incoming: &[u8]) -> Result<()> {
    combine_as::<true>(op, dtype, own, incoming)
}

/// `acc[i] = acc[i] ⊕ next[i]`: the fold's next step with the running
/// value as the left operand, as the ring applies it (the running value
/// is what arrives, `next` is the receiver's own).
fn accumulate(op: ReduceOp, dtype: ElementType, acc: &mut [u8], next: &[u8]) -> Result<()> {
    combine_as::<false>(op, dtype, acc, next)
}

/// `own = other ⊕ own` (`OTHER_LEFT`) or `own = own ⊕ other`: the operand
/// order matters bit for bit only for NaN payloads and signed zeros under
/// max/min, but the documented order is the one applied.
fn combine_as<const OTHER_LEFT: bool>(
    op: ReduceOp,
    dtype: ElementType,
    own: &mut [u8],
    other: &[u8],
) -> Result<()> {
    check_reducible(dtype)?;
    if own.len() != other.len() || own.len() % dtype.size() != 0 {
        return Err(TransferError::InvalidArgument(format!(
            "cannot combine {} bytes with {} bytes of {}",
            other.len(),
            own.len(),
            dtype.name()
        )));
    }
    // `zip` hands the closure (other, own); `ordered` puts them in the
    // operator's order.
    fn ordered<const OTHER_LEFT: bool, T>(other: T, own: T) -> (T, T) {
        if OTHER_LEFT {
            (other, own)
        } else {
            (own, other)
        }
    }
    match dtype {
        ElementType::F32 => zip::<f32>(own, other, |a, b| {
            let (l, r) = ordered::<OTHER_LEFT, _>(a, b);
            float_op(op, l, r)
        }),
        ElementType::F64 => zip::<f64>(own, other, |a, b| {
            let (l, r) = ordered::<OTHER_LEFT, _>(a, b);
            float_op(op, l, r)
        }),
        ElementType::F16 => zip::<u16>(own, other, |a, b| {
            let (l, r) = ordered::<OTHER_LEFT, _>(a, b);
            f16_op(op, l, r)
        }),
        ElementType::BF16 => zip::<u16>(own, other, |a, b| {
            let (l, r) = ordered::<OTHER_LEFT, _>(a, b);
            bf16_op(op, l, r)
        }),
        ElementType::S32 => zip::<i32>(own, other, |a, b| {
            let (l, r) = ordered::<OTHER_LEFT, _>(a, b);
            int_op(op, l, r)
        }),
        ElementType::S64 => zip::<i64>(own, other, |a, b| {
            let (l, r) = ordered::<OTHER_LEFT, _>(a, b);
            int_op(op, l, r)
        }),
        _ => unreachable!("checked by check_reducible"),
    }
    Ok(())
}

/// Bytes folded at a time by [`fold_onto`]: the running block and one
/// block of each input stay in the first-level cache.
const FOLD_BLOCK: usize = 16 << 10;

/// The ring's fold of one segment computed in one place:
/// `own = ((others[0] ⊕ others[1]) ⊕ …) ⊕ own`, divided by `ranks` for
/// `Mean`, and the result also written to `copy` when given. Bit for bit
/// what the ring computes for the segment whose owner holds `own` when
/// `others` are the other ranks' segments starting after the owner (module
/// docs); block by block, so every input is read once.
pub fn fold_onto(
    op: ReduceOp,
    dtype: ElementType,
    others: &[&[u8]],
    own: &mut [u8],
    mut copy: Option<&mut [u8]>,
    ranks: usize,
) -> Result<()> {
    check_reducible(dtype)?;
    let len = own.len();
    if others.iter().any(|o| o.len() != len)
        || copy.as_ref().is_some_and(|c| c.len() != len)
        || len % dtype.size() != 0
    {
        return Err(TransferError::InvalidArgument(format!(
            "cannot fold {} arrays into {len} bytes of {}",
            others.len(),
            dtype.name()
        )));
    }
    // u64 words: the running block is aligned for every dtype.
    let mut words = vec![0u64; FOLD_BLOCK / 8];
    let block = (FOLD_BLOCK / dtype.size()) * dtype.size();
    let mut at = 0;
    while at < len {
        let end = (at + block).min(len);
        if !fold_fused(op, dtype, others, at..end, &mut own[at..end]) {
            let acc = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..end - at];
            match others.split_first() {
                Some((first, rest)) => {
                    acc.copy_from_slice(&first[at..end]);
                    for o in rest {
                        accumulate(op, dtype, acc, &o[at..end])?;
                    }
                    accumulate(op, dtype, acc, &own[at..end])?;
                }
                None => acc.copy_from_slice(&own[at..end]),
            }
            own[at..end].copy_from_slice(acc);
        }
        if op == ReduceOp::Mean {
            finish_mean(dtype, &mut own[at..end], ranks)?;
        }
        if let Some(c) = copy.as_deref_mut() {
            c[at..end].copy_from_slice(&own[at..end]);
        }
        at = end;
    }
    Ok(())
}

/// [`fold_onto`]'s fold of the block `range` into `own` (that block of
/// the owner's segment) when one to three other ranks' blocks come in (up
/// to 4 ranks) and every slice is aligned for the dtype: each element is
/// read once from every input and written once,
/// `own = ((others[0] ⊕ others[1]) ⊕ others[2]) ⊕ own`, the same
/// operations in the same order as the block-at-a-time path. False,
/// touching nothing, otherwise.
fn fold_fused(
    op: ReduceOp,
    dtype: ElementType,
    others: &[&[u8]],
    range: Range<usize>,
    own: &mut [u8],
) -> bool {
    fn float<T: FloatLike + bytemuck::Pod>(
        op: ReduceOp,
        others: &[&[u8]],
        range: Range<usize>,
        own: &mut [u8],
    ) -> bool {
        // The operator outside the loop, so that it vectorizes.
        match op {
            ReduceOp::Sum | ReduceOp::Mean => fused::<T>(others, range, own, |l, r| l + r),
            ReduceOp::Max => fused::<T>(others, range, own, |l: T, r| l.max_num(r)),
            ReduceOp::Min => fused::<T>(others, range, own, |l: T, r| l.min_num(r)),
        }
    }
    match dtype {
        ElementType::F32 => float::<f32>(op, others, range, own),
        ElementType::F64 => float::<f64>(op, others, range, own),
        ElementType::F16 => fused::<u16>(others, range, own, |l, r| f16_op(op, l, r)),
        ElementType::BF16 => fused::<u16>(others, range, own, |l, r| bf16_op(op, l, r)),
        ElementType::S32 => fused::<i32>(others, range, own, |l, r| int_op(op, l, r)),
        ElementType::S64 => fused::<i64>(others, range, own, |l, r| int_op(op, l, r)),
        _ => false,
    }
}

/// `own = g(…g(g(others[0][range], others[1][range]), …), own)`
/// element-wise for one to three `others` viewed as `T` (all of
/// `range`'s length, as `fold_onto` checked); false if there are more,
/// none, or a slice is not aligned for `T`.
fn fused<T: bytemuck::Pod>(
    others: &[&[u8]],
    range: Range<usize>,
    own: &mut [u8],
    g: impl Fn(T, T) -> T,
) -> bool {
    let Ok(out) = bytemuck::try_cast_slice_mut::<u8, T>(own) else {
        return false;
    };
    fn view<'a, T: bytemuck::Pod>(o: &'a [u8], range: &Range<usize>) -> Option<&'a [T]> {
        bytemuck::try_cast_slice(&o[range.clone()]).ok()
    }
    let input = |o| view::<T>(o, &range);
    match others {
        [a] => {
            let Some(a) = input(a) else { return false };
            for (o, a) in out.iter_mut().zip(a) {
                *o = g(*a, *o);
            }
        }
        [a, b] => {
            let (Some(a), Some(b)) = (input(a), input(b)) else {
                return false;
            };
            for ((o, a), b) in out.iter_mut().zip(a).zip(b) {
                *o = g(g(*a, *b), *o);
            }
        }
        [a, b, c] => {
            let (Some(a), Some(b), Some(c)) = (input(a), input(b), input(c)) else {
                return false;
            };
            for (((o, a), b), c) in out.iter_mut().zip(a).zip(b).zip(c) {
                *o = g(g(g(*a, *b), *c), *o);
            }
        }
        _ => return false,
    }
    true
}

/// `l ⊕ r` of two f16 bit patterns, computed in f32 and rounded back.
fn f16_op(op: ReduceOp, l: u16, r: u16) -> u16 {
    let (l, r) = (f16::from_bits(l).to_f32(), f16::from_bits(r).to_f32());
    f16::from_f32(float_op(op, l, r)).to_bits()
}

/// `l ⊕ r` of two bf16 bit patterns, computed in f32 and rounded back.
fn bf16_op(op: ReduceOp, l: u16, r: u16) -> u16 {
    let (l, r) = (bf16::from_bits(l).to_f32(), bf16::from_bits(r).to_f32());
    bf16::from_f32(float_op(op, l, r)).to_bits()
}

/// Divides every element by `ranks` (the last step of `Mean`).
pub fn finish_mean(dtype: ElementType, data: &mut [u8], ranks: usize) -> Result<()> {
    check_reducible(dtype)?;
    let n = ranks as f64;
    match dtype {
        ElementType::F32 => map::<f32>(data, |x| x / ranks as f32),
        ElementType::F64 => map::<f64>(data, |x| x / n),
        ElementType::F16 => map::<u16>(data, |x| {
            f16::from_f32(f16::from_bits(x).to_f32() / ranks as f32).to_bits()
        }),
        ElementType::BF16 => map::<u16>(data, |x| {
            bf16::from_f32(bf16::from_bits(x).to_f32() / ranks as f32).to_bits()
        }),
        ElementType::S32 => map::<i32>(data, |x| x / ranks as i32),
        ElementType::S64 => map::<i64>(data, |x| x / ranks as i64),
        _ => unreachable!("checked by check_reducible"),
    }
    Ok(())
}

trait FloatLike: Copy + std::ops::Add<Output = Self> + PartialOrd {
    fn max_num(self, other: Self) -> Self;
    fn min_num(self, other: Self) -> Self;
}

impl FloatLike for f32 {
    fn max_num(self, other: Self) -> Self {
        self.max(other)
    }
    fn min_num(self, other: Self) -> Self {
        self.min(other)
    }
}

impl FloatLike for f64 {
    fn max_num(self, other: Self) -> Self {
        self.max(other)
    }
    fn min_num(self, other: Self) -> Self {
        self.min(other)
    }
}

fn float_op<T: FloatLike>(op: ReduceOp, incoming: T, own: T) -> T {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => incoming + own,
        ReduceOp::Max => incoming.max_num(own),
        ReduceOp::Min => incoming.min_num(own),
    }
}

trait IntLike: Copy + Ord {
    fn wrapping_sum(self, other: Self) -> Self;
}

impl IntLike for i32 {
    fn wrapping_sum(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
}

impl IntLike for i64 {
    fn wrapping_sum(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
}

fn int_op<T: IntLike>(op: ReduceOp, incoming: T, own: T) -> T {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => incoming.wrapping_sum(own),
        ReduceOp::Max => incoming.max(own),
        ReduceOp::Min => incoming.min(own),
    }
}

/// Applies `f(incoming, own)` element-wise in place; aligned buffers are
/// viewed as `T` directly (vectorizable), others go element by element.
fn zip<T: bytemuck::Pod>(own: &mut [u8], incoming: &[u8], f: impl Fn(T, T) -> T) {
    if let (Ok(a), Ok(b)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(own),
        bytemuck::try_cast_slice::<u8, T>(incoming),
    ) {
        for (x, y) in a.iter_mut().zip(b) {
            *x = f(*y, *x);
        }
        return;
    }
    let size = std::mem::size_of::<T>();
    for (x, y) in own.chunks_exact_mut(size).zip(incoming.chunks_exact(size)) {
        let r = f(
            bytemuck::pod_read_unaligned(y),
            bytemuck::pod_read_unaligned(x),
        );
        x.copy_from_slice(bytemuck::bytes_of(&r));
    }
}

fn map<T: bytemuck::Pod>(data: &mut [u8], f: impl Fn(T) -> T) {
    if let Ok(a) = bytemuck::try_cast_slice_mut::<u8, T>(data) {
        for x in a.iter_mut() {
            *x = f(*x);
        }
        return;
    }
    let size = std::mem::size_of::<T>();
    for x in data.chunks_exact_mut(size) {
        let r = f(bytemuck::pod_read_unaligned(x));
        x.copy_from_slice(bytemuck::bytes_of(&r));
    }
}

/// Element range `[start, end)` of segment `j` when `count` elements are cut
/// into `n` segments.
pub fn segment(count: usize, n: usize, j: usize) -> std::ops::Range<usize> {
    let at = |i: usize| ((i as u128 * count as u128) / n as u128) as usize;
    at(j)..at(j + 1)
}

/// Byte ranges of the `n` segments of `bytes` bytes of `dtype` elements
/// ([`segment`] in bytes).
pub fn byte_segments(dtype: ElementType, bytes: usize, n: usize) -> Vec<Range<usize>> {
    let size = dtype.size();
    let count = bytes / size;
    (0..n)
        .map(|j| {
            let r = segment(count, n, j);
            r.start * size..r.end * size
        })
        .collect()
}

/// Step `s` of the ring's reduce-scatter for rank `r` of `n`: the segment it
/// sends to rank r+1 (`r − s − 1`) and the one it receives from rank r−1
/// and folds (`r − s − 2`, mod n), so that segment `j` is folded from rank
/// `j + 1` around to `j` (module docs) and ends complete on rank `j`.
pub fn reduce_scatter_step(n: usize, r: usize, s: usize) -> (usize, usize) {
    ((r + 2 * n - s - 1) % n, (r + 2 * n - s - 2) % n)
}

/// Step `s` of the ring's all-gather for rank `r` of `n`, which starts
/// with segment `r` complete: the segment it sends (`r − s`) and the one it
/// receives (`r − s − 1`, mod n).
pub fn all_gather_step(n: usize, r: usize, s: usize) -> (usize, usize) {
    ((r + n - s) % n, (r + 2 * n - s - 1) % n)
}

/// `buf[send]` to read and `buf[recv]` to write, two ranges that do not
/// overlap (either may be empty).
pub fn disjoint(buf: &mut [u8], send: Range<usize>, recv: Range<usize>) -> (&[u8], &mut [u8]) {
    debug_assert!(send.end <= recv.start || recv.end <= send.start);
    if send.end <= recv.start {
        let (lo, hi) = buf.split_at_mut(recv.start);
        (&lo[send], &mut hi[..recv.len()])
    } else {
        let (lo, hi) = buf.split_at_mut(send.start);
        (&hi[..send.len()], &mut lo[recv])
    }
}

/// The ranges of at most `chunk` bytes (at least one) that `segment`
/// travels in, in order; none for an empty segment.
pub fn chunk_ranges(segment: Range<usize>, chunk: usize) -> impl Iterator<Item = Range<usize>> {
    let chunk = chunk.max(1);
    let end = segment.end;
    segment
        .step_by(chunk)
        .map(move |start| start..(start + chunk).min(end))
}

/// Appends `incoming[i] ⊕ own[i]` for every element to `out` (the operands
/// of [`combine`]), where `incoming` is the concatenation of `pieces`,
/// split anywhere, even inside an element. Nothing is written to `own`:
/// the ring reduces a received chunk, in the pieces it arrived in, into
/// fresh memory that it then sends on without a copy. Block by block, each
/// block of `incoming` is copied into `out` and `own` folded onto it there,
/// both aligned whatever the pieces' alignment.
pub fn combine_pieces_into<'p>(
    op: ReduceOp,
    dtype: ElementType,
    own: &[u8],
    pieces: impl IntoIterator<Item = &'p [u8]>,
    out: &mut Vec<u8>,
) -> Result<()> {
    check_reducible(dtype)?;
    let size = dtype.size();
    let mismatch = |got: usize| {
        TransferError::InvalidArgument(format!(
            "cannot combine {got} bytes with {} bytes of {}",
            own.len(),
            dtype.name()
        ))
    };
    // Whole elements of `incoming` starting at byte `at`.
    let mut fold = |bytes: &[u8], at: usize| -> Result<()> {
        let Some(own) = own.get(at..at + bytes.len()) else {
            return Err(mismatch(at + bytes.len()));
        };
        for (block, mine) in bytes.chunks(FOLD_BLOCK).zip(own.chunks(FOLD_BLOCK)) {
            let from = out.len();
            out.extend_from_slice(block);
            accumulate(op, dtype, &mut out[from..], mine)?;
        }
        Ok(())
    };
    // An element split between pieces is put together here.
    let mut split = [0u8; 8];
    let mut held = 0;
    let mut at = 0;
    for mut piece in pieces {
        if held > 0 {
            let take = (size - held).min(piece.len());
            split[held..held + take].copy_from_slice(&piece[..take]);
            held += take;
            piece = &piece[take..];
            if held < size {
                continue;
            }
            fold(&split[..size], at)?;
            at += size;
        }
        let whole = piece.len() - piece.len() % size;
        if whole > 0 {
            fold(&piece[..whole], at)?;
            at += whole;
        }
        held = piece.len() - whole;
        split[..held].copy_from_slice(&piece[whole..]);
    }
    if held > 0 || at != own.len() {
        return Err(mismatch(at + held));
    }
    Ok(())
}

/// Largest all-reduce whose data travels with the descriptors and is
/// reduced in rank order (module docs).
pub const SMALL_ALL_REDUCE: usize = 64 << 10;

/// Whether an all-reduce of `bytes` takes the small path.
pub fn all_reduce_is_small(bytes: usize) -> bool {
    bytes <= SMALL_ALL_REDUCE
}

/// Every rank's input, checked: at least one, equal lengths, whole elements.
fn check_inputs(dtype: ElementType, inputs: &[Vec<u8>]) -> Result<&Vec<u8>> {
    let Some(first) = inputs.first() else {
        return Err(TransferError::InvalidArgument("no inputs".into()));
    };
    if inputs.iter().any(|i| i.len() != first.len()) || first.len() % dtype.size() != 0 {
        return Err(TransferError::InvalidArgument(
            "inputs differ in length".into(),
        ));
    }
    Ok(first)
}

/// The small all-reduce's order: `((x[0] ⊕ x[1]) ⊕ …) ⊕ x[n-1]`, the mean
/// divided at the end. What every rank computes from the gathered inputs.
pub fn fold_in_rank_order(op: ReduceOp, dtype: ElementType, inputs: &[Vec<u8>]) -> Result<Vec<u8>> {
    let mut acc = check_inputs(dtype, inputs)?.clone();
    for x in &inputs[1..] {
        combine(op, dtype, &mut acc, x)?;
    }
    if op == ReduceOp::Mean {
        finish_mean(dtype, &mut acc, inputs.len())?;
    }
    Ok(acc)
}

/// The single-process reference of `all_reduce`: every rank's result, in
/// the documented order (module docs). `inputs[r]` is rank r's array.
pub fn reference_reduce(op: ReduceOp, dtype: ElementType, inputs: &[Vec<u8>]) -> Result<Vec<u8>> {
    let first = check_inputs(dtype, inputs)?;
    if inputs.len() > 1 && all_reduce_is_small(first.len()) {
        return fold_in_rank_order(op, dtype, inputs);
    }
    reference_ring_reduce(op, dtype, inputs)
}

/// The ring's order at any size: what `reduce_scatter` computes (each rank
/// keeping its segment) and what a large `all_reduce` computes.
pub fn reference_ring_reduce(
    op: ReduceOp,
    dtype: ElementType,
    inputs: &[Vec<u8>],
) -> Result<Vec<u8>> {
    let n = inputs.len();
    let size = dtype.size();
    let first = check_inputs(dtype, inputs)?;
    let count = first.len() / size;
    let mut out = vec![0u8; first.len()];
    for j in 0..n {
        let r = segment(count, n, j);
        let bytes = r.start * size..r.end * size;
        // Starts at rank j+1, folds j+2, …, ends with j.
        let mut acc = inputs[(j + 1) % n][bytes.clone()].to_vec();
        for step in 2..=n {
            let rank = (j + step) % n;
            let mut own = inputs[rank][bytes.clone()].to_vec();
            combine(op, dtype, &mut own, &acc)?;
            acc = own;
        }
        if op == ReduceOp::Mean {
            finish_mean(dtype, &mut acc, n)?;
        }
        out[bytes].copy_from_slice(&acc);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
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
                combine_pieces_into(ReduceOp::Sum, ElementType::F32, &own, pieces, &mut out)
                    .is_err()
            );
        }
        assert!(
            combine_pieces_into(ReduceOp::Sum, ElementType::Pred, &own, [&own[..]], &mut out)
                .is_err()
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
}
