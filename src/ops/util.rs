//! Helpers every kernel family uses: input access, axis normalisation, NumPy broadcasting.

use super::OpError;
use crate::tensor::{strides_of, Tensor};

/// The most elements one tensor a kernel makes may have (2^31, 8 GiB of f32): beyond it a
/// shape computed from inputs (a huge Resize scale, a Tile count) is an error, not an
/// allocation that takes the machine down.
pub const MAX_ELEMENTS: usize = 1 << 31;

/// The most axes a tensor's shape may have: a declared shape input longer than this is an
/// error, not a rank to allocate dimensions for (ONNX itself sets no limit; real models stay
/// far below it).
pub const MAX_RANK: usize = 1024;

/// Runs `f` with this thread's scratch buffer in `key` (kept between calls, so hot loops do not
/// allocate and zero one each time), or with a fresh one from `make` where this thread is
/// already using it (a task it took up while waiting on rayon inside `f`).
pub fn with_scratch<T: 'static, R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<T>>,
    make: impl FnOnce() -> T,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut kept) => f(&mut kept),
        Err(_) => f(&mut make()),
    })
}

/// A float32 buffer of `n` values that `fill` writes, without zeroing it first: a kernel's
/// fresh output made with `vec![0.0; n]` and then overwritten cost a memset of every value
/// (23 % of a chain of Relus on [1, 64, 32, 32], 5 % of YOLOv8n's run).
///
/// # Safety
/// `fill` writes every one of the `n` values (through the slice or a pointer into it).
pub unsafe fn unzeroed_f32(
    n: usize,
    fill: impl FnOnce(&mut [std::mem::MaybeUninit<f32>]),
) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(n);
    fill(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: the caller's promise: all n values are written.
    unsafe { v.set_len(n) };
    v
}

/// `values` as the values they hold.
///
/// # Safety
/// Every value of `values` has been written.
pub unsafe fn assume_written<T>(values: &mut [std::mem::MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: MaybeUninit<T> has T's layout; the caller's promise: all are initialized.
    unsafe { &mut *(values as *mut [std::mem::MaybeUninit<T>] as *mut [T]) }
}

/// The element count of `shape`, or an error when it exceeds [`MAX_ELEMENTS`].
pub fn checked_len(shape: &[usize]) -> Result<usize, OpError> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| {
            OpError(format!(
                "the output shape {shape:?} has more than {MAX_ELEMENTS} elements"
            ))
        })
}

/// The required input `i`, or an error naming it.
pub fn input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Result<&'a Tensor, OpError> {
    match inputs.get(i) {
        Some(Some(t)) => Ok(t),
        _ => Err(OpError(format!("required input #{i} is missing"))),
    }
}

/// The optional input `i` (None when omitted or past the end).
pub fn opt_input<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Option<&'a Tensor> {
    inputs.get(i).copied().flatten()
}

/// The f32 buffer of input `i`, or an error naming the dtype found.
pub fn input_f32<'a>(inputs: &[Option<&'a Tensor>], i: usize) -> Result<&'a [f32], OpError> {
    let t = input(inputs, i)?;
    t.as_f32().ok_or_else(|| {
        OpError(format!(
            "input #{i} has dtype {}, expected float32",
            t.dtype()
        ))
    })
}

/// A float tensor's values as f32 (float16/bfloat16/float64 converted), or an error naming
/// `what` and the dtype found.
/// The values of a float32 tensor that, broadcast against the chained values of `shape`, gives
/// one value per channel (along `shape.axis`) and leaves the shape as it is: one value per
/// channel index, or None.
pub fn per_channel(t: &Tensor, shape: super::ChainShape) -> Option<Vec<f32>> {
    let v = t.as_f32()?;
    let (r, q) = (shape.rank, t.rank());
    if r < 2 || q > r || v.is_empty() {
        return None;
    }
    let c = shape.channels;
    let mut along_channels = false;
    for (j, &d) in t.shape().iter().enumerate() {
        let axis = j + r - q;
        if d != 1 {
            if axis != shape.axis || d != c {
                return None;
            }
            along_channels = true;
        }
    }
    Some(if along_channels {
        v.to_vec()
    } else {
        vec![v[0]; c]
    })
}

pub fn float_values(t: &Tensor, what: &str) -> Result<Vec<f32>, OpError> {
    if t.dtype().is_float() {
        Ok(t.to_f32_vec().expect("float"))
    } else {
        Err(OpError(format!(
            "{what} has dtype {}, expected a float type",
            t.dtype()
        )))
    }
}

/// A float tensor's values as f32, borrowed when they are f32 already (weights are not copied
/// on every run), converted otherwise; an error naming `what` for other dtypes.
pub fn float_slice<'a>(t: &'a Tensor, what: &str) -> Result<std::borrow::Cow<'a, [f32]>, OpError> {
    match t.as_f32() {
        Some(v) => Ok(std::borrow::Cow::Borrowed(v)),
        None => float_values(t, what).map(std::borrow::Cow::Owned),
    }
}

/// An f32 result handed back in the float type its input had.
pub fn in_dtype(t: Tensor, dtype: crate::tensor::DType) -> Tensor {
    if dtype == crate::tensor::DType::F32 {
        t
    } else {
        super::cast::cast_tensor(&t, dtype)
    }
}

/// A one-element integer tensor's value (a count, size or rate), or an error naming `what`.
pub fn scalar_int(t: &Tensor, what: &str) -> Result<i64, OpError> {
    match (t.dtype().is_int(), t.to_i64_vec().as_deref()) {
        (true, Some([v])) => Ok(*v),
        _ => Err(OpError(format!(
            "{what} must be one integer, got {} {:?}",
            t.dtype(),
            t.shape()
        ))),
    }
}

/// Input `i` read as a list of integers (shape, axes, indices, pads...).
pub fn input_i64s(inputs: &[Option<&Tensor>], i: usize) -> Result<Vec<i64>, OpError> {
    let t = input(inputs, i)?;
    if !t.dtype().is_int() {
        return Err(OpError(format!(
            "input #{i} has dtype {}, expected an integer tensor",
            t.dtype()
        )));
    }
    Ok(t.to_i64_vec().expect("integer tensor"))
}

/// Normalises a possibly negative axis into `0..rank`.
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(OpError(format!(
            "axis {axis} is out of range for rank {rank}"
        )));
    }
    Ok(a as usize)
}

/// Normalises a list of axes, rejecting duplicates.
pub fn norm_axes(axes: &[i64], rank: usize) -> Result<Vec<usize>, OpError> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(a, rank)?;
        if out.contains(&n) {
            return Err(OpError(format!("axis {a} appears twice in {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}

/// The NumPy-broadcast shape of several shapes.
pub fn broadcast_shapes(shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(OpError(format!(
                    "shapes {:?} cannot be broadcast together",
                    shapes
                )));
            }
        }
    }
    Ok(out)
}

/// Strides for reading a tensor of `shape` as if it had `out_shape` (0 on broadcast dims).
pub fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let st = strides_of(shape);
    let off = out_shape.len() - shape.len();
    (0..out_shape.len())
        .map(|i| {
            if i < off || shape[i - off] == 1 {
                0
            } else {
                st[i - off]
            }
        })
        .collect()
}

/// Output elements per task of the parallel elementwise loops (`broadcast_binary_finished`,
/// `elementwise::map_f32`; below twice this, one task):
/// 128 KiB of float32, in L2 on every core the project measures.
pub const PAR_CHUNK: usize = 1 << 15;

/// `shape` and each input's `strides` with size-1 dimensions dropped and neighbours merged
/// where every input reads them as one (equal shapes become one dimension, a scalar one
/// dimension of stride 0): the runs [`for_each_run`] visits are then as long as they can be.
fn coalesce(shape: &[usize], strides: &[Vec<usize>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut dims: Vec<usize> = Vec::with_capacity(shape.len());
    let mut st: Vec<Vec<usize>> = vec![Vec::with_capacity(shape.len()); strides.len()];
    for (d, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let merges = dims.last().is_some_and(|_| {
            strides
                .iter()
                .zip(&st)
                .all(|(s, kept)| kept.last().copied() == Some(s[d] * n))
        });
        if merges {
            *dims.last_mut().expect("checked") *= n;
            for (s, kept) in strides.iter().zip(st.iter_mut()) {
                *kept.last_mut().expect("checked") = s[d];
            }
        } else {
            dims.push(n);
            for (s, kept) in strides.iter().zip(st.iter_mut()) {
                kept.push(s[d]);
            }
        }
    }
    (dims, st)
}

/// Calls `f(position, offsets, len)` for the output positions `range` (row-major over
/// `shape`) in runs along the last dimension: `position` is the run's first output position,
/// `offsets` where each input's run starts (read with its last stride), `len` the run's
/// length. A range may start and end inside a row.
fn for_each_run(
    shape: &[usize],
    strides: &[Vec<usize>],
    range: std::ops::Range<usize>,
    mut f: impl FnMut(usize, &[usize], usize),
) {
    if range.is_empty() {
        return;
    }
    let Some(&inner) = shape.last() else {
        // Rank 0: one value.
        f(0, &vec![0; strides.len()], 1);
        return;
    };
    let rank = shape.len();
    let mut idx = vec![0usize; rank];
    let mut rest = range.start;
    for d in (0..rank).rev() {
        idx[d] = rest % shape[d];
        rest /= shape[d];
    }
    let mut offs: Vec<usize> = strides
        .iter()
        .map(|s| idx.iter().zip(s).map(|(i, s)| i * s).sum())
        .collect();
    let mut pos = range.start;
    loop {
        let len = (inner - idx[rank - 1]).min(range.end - pos);
        f(pos, &offs, len);
        pos += len;
        if pos >= range.end {
            return;
        }
        // The next row: back to its first column, then the odometer over the outer
        // dimensions (there is a next row: pos < range.end <= the element count).
        for (o, s) in offs.iter_mut().zip(strides) {
            *o -= s[rank - 1] * idx[rank - 1];
        }
        idx[rank - 1] = 0;
        let mut d = rank - 1;
        loop {
            d -= 1;
            idx[d] += 1;
            for (o, s) in offs.iter_mut().zip(strides) {
                *o += s[d];
            }
            if idx[d] < shape[d] {
                break;
            }
            for (o, s) in offs.iter_mut().zip(strides) {
                *o -= s[d] * shape[d];
            }
            idx[d] = 0;
        }
    }
}

/// Elementwise binary op with NumPy broadcasting.
pub fn broadcast_binary<A: Copy + Sync, B: Copy + Sync, O: Send>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    f: impl Fn(A, B) -> O + Sync,
) -> Result<(Vec<usize>, Vec<O>), OpError> {
    broadcast_binary_finished(a, a_shape, b, b_shape, f, |_| {})
}

/// Elementwise binary op with NumPy broadcasting, big outputs filled by parallel tasks of
/// [`PAR_CHUNK`] values; each finished piece goes through `finish` (a layer's output
/// rounding) while it is still in cache. Each value is `f` of its two inputs whatever the
/// split, so the result is the same on any number of threads.
pub fn broadcast_binary_finished<A: Copy + Sync, B: Copy + Sync, O: Send>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    f: impl Fn(A, B) -> O + Sync,
    finish: impl Fn(&mut [O]) + Sync,
) -> Result<(Vec<usize>, Vec<O>), OpError> {
    let out_shape = broadcast_shapes(&[a_shape, b_shape])?;
    let n = checked_len(&out_shape)?;
    let (shape, strides) = coalesce(
        &out_shape,
        &[
            broadcast_strides(a_shape, &out_shape),
            broadcast_strides(b_shape, &out_shape),
        ],
    );
    let (ia, ib) = (
        strides[0].last().copied().unwrap_or(0),
        strides[1].last().copied().unwrap_or(0),
    );
    let fill = |range: std::ops::Range<usize>, out: &mut [std::mem::MaybeUninit<O>]| {
        let first = range.start;
        for_each_run(&shape, &strides, range, |pos, offs, len| {
            let (oa, ob) = (offs[0], offs[1]);
            let dst = &mut out[pos - first..][..len];
            // Contiguous and broadcast runs get tight loops the compiler vectorizes.
            match (ia, ib) {
                (1, 1) => {
                    for (d, (&x, &y)) in dst.iter_mut().zip(a[oa..oa + len].iter().zip(&b[ob..])) {
                        d.write(f(x, y));
                    }
                }
                (1, 0) => {
                    let y = b[ob];
                    for (d, &x) in dst.iter_mut().zip(&a[oa..oa + len]) {
                        d.write(f(x, y));
                    }
                }
                (0, 1) => {
                    let x = a[oa];
                    for (d, &y) in dst.iter_mut().zip(&b[ob..ob + len]) {
                        d.write(f(x, y));
                    }
                }
                _ => {
                    for (k, d) in dst.iter_mut().enumerate() {
                        d.write(f(a[oa + k * ia], b[ob + k * ib]));
                    }
                }
            }
        });
    };
    let mut out: Vec<O> = Vec::with_capacity(n);
    let spare = &mut out.spare_capacity_mut()[..n];
    if n < 2 * PAR_CHUNK {
        fill(0..n, spare);
    } else {
        use rayon::prelude::*;
        spare
            .par_chunks_mut(PAR_CHUNK)
            .enumerate()
            .for_each(|(i, piece)| {
                let start = i * PAR_CHUNK;
                fill(start..start + piece.len(), piece);
                // SAFETY: `fill` wrote every value of the piece just now.
                finish(unsafe { assume_written(piece) });
            });
    }
    // SAFETY: the runs of `for_each_run` cover every position of each range, and the ranges
    // cover 0..n.
    unsafe { out.set_len(n) };
    if n < 2 * PAR_CHUNK {
        finish(&mut out);
    }
    Ok((out_shape, out))
}

/// Elementwise ternary op with broadcasting (Where, Clip with tensor bounds).
pub fn broadcast_ternary<A: Copy, B: Copy, C: Copy, O>(
    a: (&[A], &[usize]),
    b: (&[B], &[usize]),
    c: (&[C], &[usize]),
    f: impl Fn(A, B, C) -> O,
) -> Result<(Vec<usize>, Vec<O>), OpError> {
    let out_shape = broadcast_shapes(&[a.1, b.1, c.1])?;
    let n: usize = out_shape.iter().product();
    let strides = vec![
        broadcast_strides(a.1, &out_shape),
        broadcast_strides(b.1, &out_shape),
        broadcast_strides(c.1, &out_shape),
    ];
    let inner_st: Vec<usize> = strides
        .iter()
        .map(|s| s.last().copied().unwrap_or(0))
        .collect();
    let mut out = Vec::with_capacity(n);
    for_each_run(&out_shape, &strides, 0..n, |_, offs, len| {
        for k in 0..len {
            out.push(f(
                a.0[offs[0] + k * inner_st[0]],
                b.0[offs[1] + k * inner_st[1]],
                c.0[offs[2] + k * inner_st[2]],
            ));
        }
    });
    Ok((out_shape, out))
}

/// Materialises `data` (of `shape`) broadcast to `out_shape`.
pub fn broadcast_to<T: Clone>(data: &[T], shape: &[usize], out_shape: &[usize]) -> Vec<T> {
    let n: usize = out_shape.iter().product();
    if shape == out_shape {
        return data.to_vec();
    }
    let st = broadcast_strides(shape, out_shape);
    let inner_st = st.last().copied().unwrap_or(0);
    let mut out = Vec::with_capacity(n);
    for_each_run(out_shape, &[st], 0..n, |_, offs, len| {
        for k in 0..len {
            out.push(data[offs[0] + k * inner_st].clone());
        }
    });
    out
}

/// Splits a row into its `s` column phases: `src[c]`, the row's column `first + c`, goes to
/// `dst[r·per + j]` where `j·s + r = first + c` (`dst` holds `s · per` values,
/// `per · s ≥ first + src.len()`; values no column reaches are left as they are — a
/// convolution's padding). Stride 1 is a copy; stride 2 deinterleaves pairs (a loop the
/// compiler turns into vector shuffles); other strides go value by value.
pub(crate) fn split_phases(src: &[f32], first: usize, s: usize, per: usize, dst: &mut [f32]) {
    assert!(s >= 1 && per * s >= first + src.len() && dst.len() >= s * per);
    if s == 1 {
        dst[first..first + src.len()].copy_from_slice(src);
        return;
    }
    if s == 2 {
        let (even, odd) = dst.split_at_mut(per);
        // src[0] lands in phase first % 2 at index first / 2, src[1] in the other phase.
        let (to0, to1) = if first.is_multiple_of(2) {
            (even, odd)
        } else {
            (odd, even)
        };
        let (j0, j1) = (first / 2, first.div_ceil(2));
        let pairs = src.chunks_exact(2);
        let tail = pairs.remainder();
        for ((a, b), p) in to0[j0..].iter_mut().zip(to1[j1..].iter_mut()).zip(pairs) {
            *a = p[0];
            *b = p[1];
        }
        if let [last] = tail {
            to0[j0 + src.len() / 2] = *last;
        }
        return;
    }
    for (r, dst) in dst.chunks_exact_mut(per).enumerate().take(s) {
        // The phase's first column at or after `first`: q0·s + r.
        let q0 = first.saturating_sub(r).div_ceil(s);
        let c0 = q0 * s + r - first;
        if c0 < src.len() {
            let src = src[c0..].iter().step_by(s);
            dst[q0..].iter_mut().zip(src).for_each(|(d, &v)| *d = v);
        }
    }
}

/// [`split_phases`] on each of a plane's rows: row y of `src` (`iw` values) into the `row`
/// values of `dst` from `y · row` on. Stride 2 (the common strided convolution and pooling)
/// goes through AVX-512 or AVX2 shuffles where the CPU has them, the rows in one call (the
/// per-row baseline loop, 4-lane SSE, was a fifth of a 3×3/2 convolution on [1,32,56,56]).
/// AVX-512 takes a row's last values under masks: AVX2's scalar tail was half of a row of 28
/// and all of a row of 14 (the bench CNN's 3×3/2 convolutions to 14² and 7² alone −3 to −5 %
/// on one and two Zen 5 threads).
pub(crate) fn split_rows(
    src: &[f32],
    iw: usize,
    first: usize,
    s: usize,
    per: usize,
    dst: &mut [f32],
    row: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if s == 2 && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { split_rows_2_avx512(src, iw, first, per, dst, row) };
    }
    #[cfg(target_arch = "x86_64")]
    if s == 2 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { split_rows_2_avx2(src, iw, first, per, dst, row) };
    }
    for (line, out) in src.chunks_exact(iw.max(1)).zip(dst.chunks_mut(row)) {
        split_phases(line, first, s, per, out);
    }
}

/// Where a row's even-indexed and odd-indexed values start in its stride-2 phase split (as in
/// `split_phases`: value 0 lands in phase `first % 2` at `first / 2`, phases `per` apart).
fn stride2_starts(first: usize, per: usize) -> (usize, usize) {
    let (j0, j1) = (first / 2, first.div_ceil(2));
    if first.is_multiple_of(2) {
        (j0, per + j1)
    } else {
        (per + j0, j1)
    }
}

/// [`split_rows`] at stride 2 in AVX-512: 32 values at a time into 16 of each phase, a row's
/// last 1–31 under masks (no scalar tail).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn split_rows_2_avx512(
    src: &[f32],
    iw: usize,
    first: usize,
    per: usize,
    dst: &mut [f32],
    row: usize,
) {
    use std::arch::x86_64::*;
    let even_lanes = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    let odd_lanes = _mm512_add_epi32(even_lanes, _mm512_set1_epi32(1));
    let upto = |n: usize| -> __mmask16 {
        if n >= 16 {
            !0
        } else {
            (1u16 << n) - 1
        }
    };
    for (line, out) in src.chunks_exact(iw.max(1)).zip(dst.chunks_mut(row)) {
        assert!(2 * per >= first + line.len() && out.len() >= 2 * per);
        let (even_at, odd_at) = stride2_starts(first, per);
        let (from, to) = (line.as_ptr(), out.as_mut_ptr());
        let len = line.len();
        let mut c = 0;
        while c < len {
            let n = (len - c).min(32);
            // Masked-off lanes are not read (no fault, no access); the second pointer may lie
            // past the row where its mask is empty.
            let a = _mm512_maskz_loadu_ps(upto(n), from.add(c));
            let b = _mm512_maskz_loadu_ps(upto(n.saturating_sub(16)), from.wrapping_add(c + 16));
            let even = _mm512_permutex2var_ps(a, even_lanes, b);
            let odd = _mm512_permutex2var_ps(a, odd_lanes, b);
            // Within the row: the masked stores end ⌈len/2⌉ and ⌊len/2⌋ values past the phases'
            // starts, inside their phases (asserted above).
            _mm512_mask_storeu_ps(to.add(even_at + c / 2), upto(n.div_ceil(2)), even);
            _mm512_mask_storeu_ps(to.add(odd_at + c / 2), upto(n / 2), odd);
            c += 32;
        }
    }
}

/// [`split_rows`] at stride 2 in AVX2: 16 values at a time into 8 of each phase.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn split_rows_2_avx2(
    src: &[f32],
    iw: usize,
    first: usize,
    per: usize,
    dst: &mut [f32],
    row: usize,
) {
    use std::arch::x86_64::*;
    for (line, out) in src.chunks_exact(iw.max(1)).zip(dst.chunks_mut(row)) {
        assert!(2 * per >= first + line.len() && out.len() >= 2 * per);
        let (even_at, odd_at) = stride2_starts(first, per);
        let n16 = line.len() / 16 * 16;
        let (from, to) = (line.as_ptr(), out.as_mut_ptr());
        for c in (0..n16).step_by(16) {
            let a = _mm256_loadu_ps(from.add(c));
            let b = _mm256_loadu_ps(from.add(c + 8));
            // Per 128-bit half: [a0 a2 b0 b2 | a4 a6 b4 b6], then the 64-bit pairs in order.
            let even = _mm256_shuffle_ps::<0x88>(a, b);
            let odd = _mm256_shuffle_ps::<0xDD>(a, b);
            let even = _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(even)));
            let odd = _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(odd)));
            // Within the row: c/2 + 8 values past the phases' starts, inside their phases
            // (asserted above).
            _mm256_storeu_ps(to.add(even_at + c / 2), even);
            _mm256_storeu_ps(to.add(odd_at + c / 2), odd);
        }
        for (c, &v) in line.iter().enumerate().skip(n16) {
            let at = if c % 2 == 0 { even_at } else { odd_at };
            out[at + c / 2] = v;
        }
    }
}

/// How [`transpose_8x8`] moves values: AVX shuffles where the CPU has them.
#[derive(Clone, Copy)]
pub(crate) enum Transpose8 {
    #[cfg(target_arch = "x86_64")]
    Avx,
    Scalar,
}

impl Transpose8 {
    pub(crate) fn detect() -> Transpose8 {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            return Transpose8::Avx;
        }
        Transpose8::Scalar
    }
}

/// `dst[j·ld_dst + i] = src[i·ld_src + j] (+ bias[j])` for i, j < 8.
///
/// # Safety
/// `src` holds 8 rows of 8 values at stride `ld_src`, `dst` 8 rows of 8 at `ld_dst`.
pub(crate) unsafe fn transpose_8x8(
    src: *const f32,
    ld_src: usize,
    dst: *mut f32,
    ld_dst: usize,
    bias: Option<&[f32; 8]>,
    how: Transpose8,
) {
    match how {
        #[cfg(target_arch = "x86_64")]
        Transpose8::Avx => transpose_8x8_avx(src, ld_src, dst, ld_dst, bias),
        Transpose8::Scalar => {
            for j in 0..8 {
                for i in 0..8 {
                    let v = *src.add(i * ld_src + j);
                    *dst.add(j * ld_dst + i) = match bias {
                        Some(b) => v + b[j],
                        None => v,
                    };
                }
            }
        }
    }
}

/// [`transpose_8x8`] in AVX registers ([`transpose_8x8_regs`]).
///
/// # Safety
/// As [`transpose_8x8`]; the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_8x8_avx(
    src: *const f32,
    ld_src: usize,
    dst: *mut f32,
    ld_dst: usize,
    bias: Option<&[f32; 8]>,
) {
    use std::arch::x86_64::*;
    let out = transpose_8x8_regs(src, ld_src);
    for (j, &v) in out.iter().enumerate() {
        let v = match bias {
            Some(b) => _mm256_add_ps(v, _mm256_set1_ps(b[j])),
            None => v,
        };
        _mm256_storeu_ps(dst.add(j * ld_dst), v);
    }
}

/// The 8×8 block at `src` (rows `ld_src` apart) transposed into registers: register j holds
/// column j. Unpack pairs, shuffle quads, swap 128-bit halves.
///
/// # Safety
/// As [`transpose_8x8`]'s `src`; inlined into a function compiled for AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn transpose_8x8_regs(
    src: *const f32,
    ld_src: usize,
) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * ld_src)));
    let t = [
        _mm256_unpacklo_ps(r[0], r[1]),
        _mm256_unpackhi_ps(r[0], r[1]),
        _mm256_unpacklo_ps(r[2], r[3]),
        _mm256_unpackhi_ps(r[2], r[3]),
        _mm256_unpacklo_ps(r[4], r[5]),
        _mm256_unpackhi_ps(r[4], r[5]),
        _mm256_unpacklo_ps(r[6], r[7]),
        _mm256_unpackhi_ps(r[6], r[7]),
    ];
    let u = [
        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
    ];
    [
        _mm256_permute2f128_ps::<0x20>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x20>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x20>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x20>(u[3], u[7]),
        _mm256_permute2f128_ps::<0x31>(u[0], u[4]),
        _mm256_permute2f128_ps::<0x31>(u[1], u[5]),
        _mm256_permute2f128_ps::<0x31>(u[2], u[6]),
        _mm256_permute2f128_ps::<0x31>(u[3], u[7]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_rows_is_split_phases_row_by_row() {
        // Rows shorter and longer than the 16 values of the AVX2 stride-2 loop and the 32 of
        // the AVX-512 one (whole and masked), odd and even first columns, slack past each row.
        for s in 1..=3 {
            for iw in [1usize, 7, 14, 16, 28, 32, 33, 50, 64] {
                for first in 0..3 {
                    let rows = 3;
                    let src: Vec<f32> = (0..rows * iw).map(|i| i as f32 + 0.5).collect();
                    let per = (first + iw).div_ceil(s) + 1;
                    let row = s * per + 2;
                    let mut want = vec![-1.0; rows * row];
                    for (line, out) in src.chunks_exact(iw).zip(want.chunks_mut(row)) {
                        split_phases(line, first, s, per, out);
                    }
                    let mut got = vec![-1.0; rows * row];
                    split_rows(&src, iw, first, s, per, &mut got, row);
                    assert_eq!(got, want, "s {s} iw {iw} first {first}");
                }
            }
        }
    }

    #[test]
    fn split_phases_puts_column_j_s_plus_r_at_phase_r_index_j() {
        for s in 1..=4 {
            for len in 0usize..12 {
                for first in 0..4 {
                    let src: Vec<f32> = (0..len).map(|i| i as f32).collect();
                    let per = (first + len).div_ceil(s).max(1);
                    let mut dst = vec![-1.0; s * per];
                    split_phases(&src, first, s, per, &mut dst);
                    for (i, &v) in src.iter().enumerate() {
                        let col = first + i;
                        assert_eq!(
                            dst[(col % s) * per + col / s],
                            v,
                            "s {s} len {len} first {first}"
                        );
                    }
                    let written = src.len();
                    assert_eq!(dst.iter().filter(|&&v| v >= 0.0).count(), written);
                }
            }
        }
    }

    #[test]
    fn broadcasting_matches_numpy() {
        // (2,1,3) + (4,1) -> (2,4,3)
        let a: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let b: Vec<f32> = (0..4).map(|x| 10.0 * x as f32).collect();
        let (s, v) = broadcast_binary(&a, &[2, 1, 3], &b, &[4, 1], |x, y| x + y).unwrap();
        assert_eq!(s, vec![2, 4, 3]);
        assert_eq!(v[0..6], [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
        assert_eq!(v[12..15], [3.0, 4.0, 5.0]);
        assert_eq!(v[23], 35.0);
        assert!(broadcast_binary(&a, &[2, 3], &b, &[4], |x, y| x + y).is_err());
    }

    /// The broadcast of `a` and `b` value by value from each output position's index: what
    /// the run-wise, parallel loop must give.
    fn broadcast_by_index(a: &[i64], a_shape: &[usize], b: &[i64], b_shape: &[usize]) -> Vec<i64> {
        let out = broadcast_shapes(&[a_shape, b_shape]).unwrap();
        let read = |v: &[i64], shape: &[usize], idx: &[usize]| {
            let off = out.len() - shape.len();
            let (mut at, mut stride) = (0, 1);
            for d in (0..shape.len()).rev() {
                at += if shape[d] == 1 {
                    0
                } else {
                    idx[off + d] * stride
                };
                stride *= shape[d];
            }
            v[at]
        };
        let n: usize = out.iter().product();
        (0..n)
            .map(|mut p| {
                let mut idx = vec![0; out.len()];
                for d in (0..out.len()).rev() {
                    idx[d] = p % out[d];
                    p /= out[d];
                }
                read(a, a_shape, &idx) * 1000 + read(b, b_shape, &idx)
            })
            .collect()
    }

    /// Every pair of shapes — equal, scalar, bias rows and columns, outer products, size-1
    /// and empty dimensions, outputs of one task and of several whose pieces start inside
    /// rows — gives each value from its own inputs, on 1 and 3 threads, and `finish` sees
    /// every value once.
    #[test]
    fn parallel_broadcast_gives_every_value_from_its_inputs() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3], &[2, 3]),
            (&[], &[4]),
            (&[5, 1], &[1, 7]),
            (&[1, 512, 300], &[300]),
            (&[1, 2048, 1], &[257]),
            (&[3, 1, 40, 50], &[1, 6, 1, 50]),
            (&[1, 64, 1, 1], &[1, 64, 30, 30]),
            (&[70_001], &[1]),
            (&[1], &[3, 1, 1, 33_333]),
            (&[2, 0, 3], &[3]),
            (&[4, 1, 1], &[1, 1]),
        ];
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for &(sa, sb) in cases {
                let a: Vec<i64> = (0..sa.iter().product::<usize>() as i64).collect();
                let b: Vec<i64> = (0..sb.iter().product::<usize>() as i64)
                    .map(|x| x % 997)
                    .collect();
                let expected = broadcast_by_index(&a, sa, &b, sb);
                let (shape, got) = pool
                    .install(|| {
                        broadcast_binary_finished(
                            &a,
                            sa,
                            &b,
                            sb,
                            |x, y| x * 1000 + y,
                            |piece| piece.iter_mut().for_each(|v| *v = -*v - 1),
                        )
                    })
                    .unwrap();
                assert_eq!(shape, broadcast_shapes(&[sa, sb]).unwrap());
                let got: Vec<i64> = got.iter().map(|v| -v - 1).collect();
                assert!(got == expected, "{sa:?} with {sb:?} on {threads} threads");
            }
        }
    }

    #[test]
    fn coalescing_merges_what_every_input_reads_as_one() {
        let out = [2, 3, 4];
        let (a, b) = (
            broadcast_strides(&[2, 3, 4], &out),
            broadcast_strides(&[4], &out),
        );
        assert_eq!(
            coalesce(&out, &[a.clone(), a.clone()]),
            (vec![24], vec![vec![1], vec![1]])
        );
        assert_eq!(
            coalesce(&out, &[a, b]),
            (vec![6, 4], vec![vec![4, 1], vec![0, 1]])
        );
        let scalar = broadcast_strides(&[], &out);
        assert_eq!(coalesce(&out, &[scalar]), (vec![24], vec![vec![0]]));
        assert_eq!(coalesce(&[1, 1], &[vec![0, 0]]), (vec![], vec![vec![]]));
    }

    #[test]
    fn broadcast_to_expands() {
        assert_eq!(
            broadcast_to(&[1, 2], &[2, 1], &[2, 3]),
            vec![1, 1, 1, 2, 2, 2]
        );
        assert_eq!(broadcast_to(&[7], &[], &[2]), vec![7, 7]);
    }

    #[test]
    fn ternary_with_scalar() {
        let (s, v) = broadcast_ternary(
            (&[true, false][..], &[2][..]),
            (&[1.0f32][..], &[][..]),
            (&[5.0f32, 6.0][..], &[2][..]),
            |c, x, y| if c { x } else { y },
        )
        .unwrap();
        assert_eq!(s, vec![2]);
        assert_eq!(v, vec![1.0, 6.0]);
    }

    #[test]
    fn axes_normalise() {
        assert_eq!(norm_axis(-1, 4).unwrap(), 3);
        assert!(norm_axis(4, 4).is_err());
        assert_eq!(norm_axes(&[1, -2], 4).unwrap(), vec![1, 2]);
        assert!(norm_axes(&[1, -3], 4).is_err());
    }
}

/// A raw pointer into a buffer whose disjoint parts parallel tasks write (the tiles of a
/// product, the column groups of a softmax): each user documents why its tasks never touch
/// the same element.
#[derive(Clone, Copy)]
pub(crate) struct DisjointPtr(pub(crate) *mut f32);
// SAFETY: shared only between tasks that access disjoint elements (see each use).
unsafe impl Send for DisjointPtr {}
unsafe impl Sync for DisjointPtr {}
impl DisjointPtr {
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
