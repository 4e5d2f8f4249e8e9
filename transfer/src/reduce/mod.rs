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
    /// The sum.
    Sum,
    /// The sum divided by the number of ranks.
    Mean,
    /// The largest.
    Max,
    /// The smallest.
    Min,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min];

    /// Its name (`sum`, `mean`, `max`, `min`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

    /// The operator named `s`.
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

/// `buf[send]` to send (the ring may seal it in place) and `buf[recv]`
/// to write, two ranges that do not overlap (either may be empty).
pub fn disjoint(buf: &mut [u8], send: Range<usize>, recv: Range<usize>) -> (&mut [u8], &mut [u8]) {
    debug_assert!(send.end <= recv.start || recv.end <= send.start);
    if send.end <= recv.start {
        let (lo, hi) = buf.split_at_mut(recv.start);
        (&mut lo[send], &mut hi[..recv.len()])
    } else {
        let (lo, hi) = buf.split_at_mut(send.start);
        (&mut hi[..send.len()], &mut lo[recv])
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
mod tests;
