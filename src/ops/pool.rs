//! MaxPool, AveragePool, LpPool and the global pools.

use super::attrs::{boxed, opset_free, AttrError, Attrs};
use super::conv::{window, WindowAttrs};
use super::util::input;
use super::{OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::{DimFact, Fact};
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    r.add("MaxPool", max_pool);
    r.add("AveragePool", avg_pool);
    r.add("LpPool", lp_pool);
    r.add("GlobalAveragePool", global_avg_pool);
    r.add("GlobalMaxPool", global_max_pool);
    r.add("GlobalLpPool", global_lp_pool);
    for op in ["MaxPool", "AveragePool", "LpPool"] {
        r.def_mut(op)
            .parse(|n, _| boxed(PoolAttrs::parse(n)))
            .infer(pool_facts)
            .flops(|node, _, outs| {
                let out = outs
                    .first()
                    .map_or(0, |s| s.iter().product::<usize>() as u64);
                let k: u64 = opset_free::<PoolAttrs>(node)
                    .map(|a| a.kernel.iter().map(|&d| d as u64).product())
                    .unwrap_or(1);
                out * k
            });
    }
    r.def_mut("GlobalLpPool")
        .parse(|n, _| boxed(Attrs::new(n).int_or("p", 2).map(LpNorm)));
    for op in ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"] {
        r.def_mut(op)
            .infer(|_, ins| {
                let x = super::shape::fact(ins, 0)?;
                let shape = x.shape.as_ref().map(|s| {
                    s.iter()
                        .enumerate()
                        .map(|(i, d)| if i < 2 { d.clone() } else { DimFact::known(1) })
                        .collect()
                });
                Ok(vec![Fact::new(x.dtype, shape)])
            })
            .flops(|_, ins, _| {
                ins.first()
                    .cloned()
                    .flatten()
                    .map_or(0, |s| s.iter().product::<usize>() as u64)
            });
    }
}

/// MaxPool's, AveragePool's and LpPool's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolAttrs {
    /// `kernel_shape` (required).
    pub kernel: Vec<usize>,
    pub window: WindowAttrs,
    pub ceil_mode: bool,
    /// MaxPool's `storage_order` 1: Indices count column-major.
    pub storage_col_major: bool,
    /// AveragePool's `count_include_pad`.
    pub count_include_pad: bool,
    /// LpPool's `p`.
    pub p: i64,
}

impl PoolAttrs {
    pub(crate) fn parse(node: &crate::graph::Node) -> Result<PoolAttrs, AttrError> {
        let a = Attrs::new(node);
        let window = WindowAttrs::parse(&a)?;
        let kernel = window
            .kernel_shape
            .clone()
            .ok_or_else(|| AttrError::new("kernel_shape", "missing (the op needs it)"))?;
        let storage_order = a.int_or("storage_order", 0)?;
        if !(0..=1).contains(&storage_order) {
            return Err(AttrError::new(
                "storage_order",
                format!("must be 0 (row-major) or 1 (column-major), got {storage_order}"),
            ));
        }
        Ok(PoolAttrs {
            kernel,
            window,
            ceil_mode: a.flag("ceil_mode", false)?,
            storage_col_major: storage_order == 1,
            count_include_pad: a.flag("count_include_pad", false)?,
            p: a.int_or("p", 2)?,
        })
    }
}

/// GlobalLpPool's `p`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LpNorm(pub i64);

/// [N, C, spatial...] to [N, C, windows...]; MaxPool's Indices are int64 of the same shape.
fn pool_facts(ctx: &super::InferCtx, ins: &[Option<&Fact>]) -> super::shape::FactsResult {
    let x = super::shape::fact(ins, 0)?;
    let attrs = ctx.attrs::<PoolAttrs>()?;
    let kernel = &attrs.kernel;
    let rank = kernel.len() + 2;
    let mut out: Vec<DimFact> = (0..rank).map(|_| ctx.unknown_dim()).collect();
    if let Some(s) = &x.shape {
        if s.len() != rank {
            return Err(OpError(format!(
                "kernel_shape {kernel:?} does not match input {}",
                x.shape_string()
            )));
        }
        out[0] = s[0].clone();
        out[1] = s[1].clone();
        if let Some(sp) = s[2..]
            .iter()
            .map(DimFact::as_known)
            .collect::<Option<Vec<_>>>()
        {
            let w = window(&attrs.window, &sp, kernel, attrs.ceil_mode)?;
            for (i, o) in w.out.iter().enumerate() {
                out[2 + i] = DimFact::known(*o);
            }
        }
    }
    Ok(vec![
        Fact::new(x.dtype, Some(out.clone())),
        Fact::new(Some(DType::I64), Some(out)),
    ])
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Max,
    Avg { count_pad: bool },
    Lp(f32),
}

/// The input's values as f32: read in place when they are f32.
fn as_f32(t: &Tensor) -> Result<std::borrow::Cow<'_, [f32]>, OpError> {
    if let Some(v) = t.as_f32() {
        Ok(std::borrow::Cow::Borrowed(v))
    } else if t.dtype().is_float() || t.dtype().is_int() {
        Ok(std::borrow::Cow::Owned(
            t.to_f32_vec().expect("float or int"),
        ))
    } else {
        Err(OpError(format!("dtype {} is not supported", t.dtype())))
    }
}

/// `acc[i] = max(acc[i], src[i])`, a NaN in either winning (IEEE maximum,
/// docs/numerics.md). Branch-free, a compare and a select per column: which of two values is
/// larger is unpredictable, a branch on it mispredicts about half the time.
#[inline(always)]
fn max_into_generic(acc: &mut [f32], src: &[f32]) {
    for (d, &v) in acc.iter_mut().zip(src) {
        let take = (v > *d) | v.is_nan();
        *d = if take { v } else { *d };
    }
}

/// [`max_into_generic`]'s rule on 8 lanes: `v` where `v > d` or `v` is NaN, else `d`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn max_lanes(
    d: std::arch::x86_64::__m256,
    v: std::arch::x86_64::__m256,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // MAXPS(v, d) is `v > d ? v : d`, d when either is NaN: then v where v is NaN.
    let r = _mm256_max_ps(v, d);
    _mm256_blendv_ps(r, v, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v))
}

/// [`max_into_generic`] 8 columns at a time, the same values (signed zeros and NaN included)
/// through MAXPS and one blend, stored whole: written as compare-and-select, the compiler
/// stores through `vmaskmovps`, microcoded and slow on AMD cores.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_into_avx2(acc: &mut [f32], src: &[f32]) {
    use std::arch::x86_64::*;
    let n = acc.len().min(src.len());
    let n8 = n / 8 * 8;
    if n < 8 {
        return max_into_short(&mut acc[..n], &src[..n]);
    }
    let mut step = |i: usize| {
        let d = _mm256_loadu_ps(acc.as_ptr().add(i));
        let v = _mm256_loadu_ps(src.as_ptr().add(i));
        _mm256_storeu_ps(acc.as_mut_ptr().add(i), max_lanes(d, v));
    };
    for i in (0..n8).step_by(8) {
        step(i);
    }
    if n8 < n {
        // The last 8 columns again, overlapping: a maximum taken twice with the same values
        // is the same (a NaN stays the NaN of `src`), and no masked store (microcoded on AMD)
        // or scalar tail is needed.
        step(n - 8);
    }
}

/// [`max_into_generic`] for fewer than 8 columns, compiled for the baseline: inlined into AVX2
/// code the compare-and-select loop would be vectorized with masked stores (see above).
#[inline(never)]
fn max_into_short(acc: &mut [f32], src: &[f32]) {
    max_into_generic(acc, src)
}

/// `out[x]` = the maximum over `taps` (in their order, from −∞) of `tap[x]`, under
/// [`max_into_generic`]'s rule: every tap's run as long as `out`.
#[inline(always)]
fn fold_max_generic(taps: &[&[f32]], out: &mut [f32]) {
    out.fill(f32::NEG_INFINITY);
    for tap in taps {
        max_into_generic(out, tap);
    }
}

/// [`fold_max_generic`] 8 columns at a time in one register across all taps: each output is
/// loaded from no accumulator and stored once (the tap-by-tap passes stored and re-read every
/// column once per tap). The same values: the same maxima and blends in the same tap order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fold_max_avx2(taps: &[&[f32]], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len();
    if n < 8 {
        out.fill(f32::NEG_INFINITY);
        for tap in taps {
            max_into_short(out, tap);
        }
        return;
    }
    assert!(taps.iter().all(|t| t.len() >= n));
    let step = |i: usize| {
        let mut d = _mm256_set1_ps(f32::NEG_INFINITY);
        for tap in taps {
            d = max_lanes(d, _mm256_loadu_ps(tap.as_ptr().add(i)));
        }
        d
    };
    let n8 = n / 8 * 8;
    for i in (0..n8).step_by(8) {
        _mm256_storeu_ps(out.as_mut_ptr().add(i), step(i));
    }
    if n8 < n {
        // The last 8 columns again, overlapping: recomputed from the taps, the same values.
        _mm256_storeu_ps(out.as_mut_ptr().add(n - 8), step(n - 8));
    }
}

/// [`max_into_generic`] compiled for 8-lane AVX2 where the CPU has it (the same values; the
/// pooling calls the AVX2 loop from its own AVX2 code, `Rows2d::plane_avx2`).
#[cfg(test)]
fn max_into(acc: &mut [f32], src: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { max_into_avx2(acc, src) };
    }
    max_into_generic(acc, src)
}

fn back(t: Tensor, dtype: DType) -> Tensor {
    if dtype == DType::F32 {
        t
    } else {
        super::cast::cast_tensor(&t, dtype)
    }
}

/// A kernel that pools one whole plane (input plane, output plane).
#[cfg(target_arch = "x86_64")]
type PlanePool = Box<dyn Fn(&[f32], &mut [f32]) + Sync>;

/// Bands of output rows a 3×3 stride-2 max pool of `outputs` values over planes of `oh` rows
/// splits into: two per thread where it is worth a fork, else one.
#[cfg(target_arch = "x86_64")]
fn row_bands(outputs: usize, oh: usize) -> usize {
    let threads = rayon::current_num_threads();
    if threads > 1 && outputs >= 1 << 16 {
        (2 * threads).min(oh)
    } else {
        1
    }
}

/// The 3×3 stride-2 max pool of every plane of `xv` (`in_sz` values each) into `out`, a task
/// per band of output rows over all planes: the rows a convolution before it wrote in the
/// same thread's cache (its tasks are bands of rows too), where a task per plane read every
/// plane half from the other core's (the bench CNN's [1,32,112,112] pool at two threads on
/// Intel 54 → 48 µs).
#[cfg(target_arch = "x86_64")]
fn pool_in_row_bands(
    stem: &stride2::Plane,
    xv: &[f32],
    out: &mut [f32],
    in_sz: usize,
    bands: usize,
) {
    let (oh, ow) = (stem.oh, stem.ow);
    let o_sz = oh * ow;
    let planes = out.len() / o_sz.max(1);
    assert!(xv.len() >= planes * in_sz && out.len() == planes * o_sz);
    let dst = super::util::DisjointPtr(out.as_mut_ptr());
    (0..bands).into_par_iter().for_each(|b| {
        let rows = oh * b / bands..oh * (b + 1) / bands;
        for p in 0..planes {
            // SAFETY: rows `rows` of plane p: inside `out` (asserted above), written by this
            // band's task alone.
            let piece = unsafe {
                std::slice::from_raw_parts_mut(
                    dst.get().add(p * o_sz + rows.start * ow),
                    rows.len() * ow,
                )
            };
            // SAFETY: the caller chose this path only where the CPU has AVX-512F.
            unsafe { stem.pool_rows_avx512(&xv[p * in_sz..(p + 1) * in_sz], piece, rows.clone()) };
        }
    });
}

fn pool(ctx: &OpCtx, inputs: &[Option<&Tensor>], kind: Kind) -> OpResult {
    let x = input(inputs, 0)?;
    if x.rank() < 3 {
        return Err(OpError(format!(
            "input must have rank >= 3, got {:?}",
            x.shape()
        )));
    }
    let node = ctx.node;
    let attrs = ctx.attrs::<PoolAttrs>()?;
    let kernel = &attrs.kernel;
    let in_sp = &x.shape()[2..];
    if kernel.len() != in_sp.len() {
        return Err(OpError(format!(
            "kernel_shape {kernel:?} does not match input {:?}",
            x.shape()
        )));
    }
    let w = window(&attrs.window, in_sp, kernel, attrs.ceil_mode)?;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let xv = as_f32(x)?;
    let in_sz: usize = in_sp.iter().product();
    let o_sz: usize = w.out.iter().product();
    let r = in_sp.len();
    let k_sz: usize = kernel.iter().product();
    let want_indices = kind == Kind::Max && node.outputs.len() > 1 && !node.outputs[1].is_empty();
    let storage_col_major = attrs.storage_col_major;
    // Not zeroed first: every path below writes each output value (the 2-D rows fill their
    // accumulators, `compute_plane` assigns every output).
    let total = n * c * o_sz;
    let mut out_buffer: Vec<f32> = Vec::with_capacity(total);
    // SAFETY: written whole before it is read (above); set_len below, once the planes are done.
    let out = unsafe { super::util::assume_written(&mut out_buffer.spare_capacity_mut()[..total]) };
    let mut idx_out = vec![0i64; if want_indices { n * c * o_sz } else { 0 }];
    let compute_plane = |p: usize, plane: &mut [f32], idx_plane: Option<&mut [i64]>| {
        let img = &xv[p * in_sz..(p + 1) * in_sz];
        let mut idx_plane = idx_plane;
        let mut oidx = vec![0usize; r];
        let mut kidx = vec![0usize; r];
        for (oi, dst) in plane.iter_mut().enumerate() {
            let mut rem = oi;
            for d in (0..r).rev() {
                oidx[d] = rem % w.out[d];
                rem /= w.out[d];
            }
            let mut acc = match kind {
                Kind::Max => f32::NEG_INFINITY,
                _ => 0.0,
            };
            let mut best = 0usize;
            let mut count = 0usize;
            let mut count_pad = 0usize;
            for ki in 0..k_sz {
                let mut rem = ki;
                for d in (0..r).rev() {
                    kidx[d] = rem % kernel[d];
                    rem /= kernel[d];
                }
                let mut off = 0usize;
                let mut inside = true;
                let mut in_padded = true;
                for d in 0..r {
                    let i = (oidx[d] * w.strides[d] + kidx[d] * w.dilations[d]) as isize
                        - w.pad_begin[d] as isize;
                    if i < 0 || i >= in_sp[d] as isize {
                        inside = false;
                        // Positions in the explicit padding count for count_include_pad;
                        // positions beyond it (ceil_mode overhang) never do.
                        if i < -(w.pad_begin[d] as isize) || i >= (in_sp[d] + w.pad_end[d]) as isize
                        {
                            in_padded = false;
                        }
                    } else {
                        off = off * in_sp[d] + i as usize;
                    }
                }
                if in_padded {
                    count_pad += 1;
                }
                if !inside {
                    continue;
                }
                let v = img[off];
                count += 1;
                match kind {
                    Kind::Max => {
                        if v > acc || v.is_nan() {
                            acc = v;
                            best = off;
                        }
                    }
                    Kind::Avg { .. } => acc += v,
                    Kind::Lp(pw) => acc += v.abs().powf(pw),
                }
            }
            *dst = match kind {
                Kind::Max => acc,
                Kind::Avg { count_pad: true } => acc / count_pad.max(1) as f32,
                Kind::Avg { count_pad: false } => acc / count.max(1) as f32,
                Kind::Lp(pw) => acc.powf(1.0 / pw),
            };
            if let Some(ip) = idx_plane.as_deref_mut() {
                let local = if storage_col_major {
                    // Column-major index within the spatial plane.
                    let mut rem = best;
                    let mut coords = vec![0usize; r];
                    for d in (0..r).rev() {
                        coords[d] = rem % in_sp[d];
                        rem /= in_sp[d];
                    }
                    let mut o = 0usize;
                    for d in (0..r).rev() {
                        o = o * in_sp[d] + coords[d];
                    }
                    o
                } else {
                    best
                };
                ip[oi] = (p * in_sz + local) as i64;
            }
        }
    };
    if r == 2 && !want_indices && !matches!(kind, Kind::Lp(_)) {
        // The common 2-D case without the generic N-D index arithmetic: per output row and
        // column, the range of kernel taps inside the image (and inside image + padding, for
        // count_include_pad) is computed once.
        let taps = |d: usize, o: usize| -> ((usize, usize), usize) {
            let (k, s, dl) = (kernel[d], w.strides[d], w.dilations[d]);
            let (pb, pe, n) = (
                w.pad_begin[d] as isize,
                w.pad_end[d] as isize,
                in_sp[d] as isize,
            );
            let pos = |t: usize| (o * s + t * dl) as isize - pb;
            let inside: Vec<usize> = (0..k).filter(|&t| (0..n).contains(&pos(t))).collect();
            let padded = (0..k).filter(|&t| (-pb..n + pe).contains(&pos(t))).count();
            let range = match (inside.first(), inside.last()) {
                (Some(&lo), Some(&hi)) => (lo, hi + 1),
                _ => (0, 0),
            };
            (range, padded)
        };
        let (oh, ow) = (w.out[0], w.out[1]);
        // Small planes (YOLOv8's SPPF pools 5×5 planes) go several to a task: a task per
        // plane cost more in scheduling than the pooling.
        let planes_per_task = (1usize << 15).div_ceil((o_sz * k_sz).max(1));
        // The 3×3 stride-2 pool split into bands of output rows instead, and how many (set
        // with its whole-plane form below).
        #[cfg(target_arch = "x86_64")]
        let mut banded: Option<(stride2::Plane, usize)> = None;
        // The AVX-512 paths that pool a whole plane at once, where one applies.
        #[cfg(target_arch = "x86_64")]
        let vector_plane: Option<PlanePool> =
            if kind != Kind::Max || !std::arch::is_x86_feature_detected!("avx512f") {
                None
            } else if kernel[..] == [3, 3]
                && w.strides[..] == [2, 2]
                && w.dilations[..] == [1, 1]
                && w.pad_begin.iter().all(|&p| p <= 1)
            {
                let stem = stride2::Plane {
                    ih: in_sp[0],
                    iw: in_sp[1],
                    pad: (w.pad_begin[0], w.pad_begin[1]),
                    oh,
                    ow,
                };
                let bands = row_bands(n * c * o_sz, oh);
                banded = (bands > 1).then_some((stem, bands));
                // SAFETY: the CPU has the feature the function was compiled for (above).
                Some(Box::new(move |img, plane| unsafe {
                    stem.pool_avx512(img, plane)
                }))
            } else if w.strides[..] == [1, 1] && ow == in_sp[1] && in_sp[1] < flat::LANES {
                // Stride 1 keeping the row length (YOLOv8's SPPF: 5×5 windows on 5×5–20×20
                // planes) over rows narrower than a vector: each plane one flat run of values.
                let flat = flat::Plane::new(
                    (in_sp[0], in_sp[1]),
                    oh,
                    (kernel[0], kernel[1]),
                    (w.dilations[0], w.dilations[1]),
                    (w.pad_begin[0], w.pad_begin[1]),
                );
                // SAFETY: the CPU has the feature the function was compiled for (above).
                Some(Box::new(move |img, plane| unsafe {
                    flat.pool_avx512(img, plane)
                }))
            } else {
                None
            };
        #[cfg(target_arch = "x86_64")]
        if let Some(pool_plane) = vector_plane {
            match banded {
                Some((stem, bands)) => pool_in_row_bands(&stem, &xv, out, in_sz, bands),
                None => out
                    .par_chunks_mut(o_sz.max(1))
                    .with_min_len(planes_per_task)
                    .enumerate()
                    .for_each(|(p, plane)| pool_plane(&xv[p * in_sz..(p + 1) * in_sz], plane)),
            }
            let mut shape = vec![n, c];
            shape.extend(&w.out);
            // SAFETY: every value was written above.
            unsafe { out_buffer.set_len(total) };
            return Ok(vec![back(Tensor::from_f32(shape, out_buffer), x.dtype())]);
        }
        let rows: Vec<((usize, usize), usize)> = (0..oh).map(|y| taps(0, y)).collect();
        let cols: Vec<((usize, usize), usize)> = (0..ow).map(|x| taps(1, x)).collect();
        let iw = in_sp[1];
        let (sh, sw) = (w.strides[0], w.strides[1]);
        let (dh, dw) = (w.dilations[0], w.dilations[1]);
        let (ph, pw) = (w.pad_begin[0], w.pad_begin[1]);
        // With a column stride s, each input row is split into its s phases (columns j·s + r
        // for r < s, `per` values each), so every tap reads a contiguous run and the loops
        // below vectorize; with stride 1 the row is its only phase.
        let per = iw.div_ceil(sw);
        let row_len = per * sw;
        // For each kernel column b, the output columns whose tap lies inside the image, and
        // where the first one's tap lies in a phase-split row: output column x reads input
        // column x·s + b·dw − pw, phase r, index x + t within it. (Worked out per output row
        // and tap before 2026-11-27: two integer divisions per row and tap; the bench CNN's
        // Relu + 3×3/2 MaxPool 88 → 83 µs without them.)
        let col_range: Vec<(usize, usize, usize)> = (0..kernel[1])
            .map(|b| {
                let mut inside = (0..ow).filter(|&x0| cols[x0].0 .0 <= b && b < cols[x0].0 .1);
                match inside.next() {
                    Some(lo) => {
                        let hi = inside.next_back().unwrap_or(lo) + 1;
                        let first = lo * sw + b * dw - pw;
                        (lo, hi, first % sw * per + first / sw)
                    }
                    None => (0, 0, 0),
                }
            })
            .collect();
        out.par_chunks_mut(o_sz.max(1))
            .with_min_len(planes_per_task)
            .enumerate()
            .for_each_init(Vec::new, |phases, (p, plane)| {
                let img = &xv[p * in_sz..(p + 1) * in_sz];
                let img: &[f32] = if sw == 1 {
                    img
                } else {
                    // Not zeroed again for each plane: every column a tap reads is written
                    // below (the slots past a row's end hold another plane's values, unread).
                    phases.resize(in_sp[0] * row_len, 0.0);
                    super::util::split_rows(img, iw, 0, sw, per, phases, row_len);
                    phases
                };
                let rows2d = Rows2d {
                    kind,
                    rows: &rows,
                    cols: &cols,
                    col_range: &col_range,
                    ow,
                    steps: (sh, dh, ph),
                    row_len,
                };
                rows2d.plane(img, plane);
            });
    } else if want_indices {
        out.par_chunks_mut(o_sz.max(1))
            .zip(idx_out.par_chunks_mut(o_sz.max(1)))
            .enumerate()
            .for_each(|(p, (pl, ip))| compute_plane(p, pl, Some(ip)));
    } else {
        out.par_chunks_mut(o_sz.max(1))
            .enumerate()
            .for_each(|(p, pl)| compute_plane(p, pl, None));
    }
    let mut shape = vec![n, c];
    shape.extend(&w.out);
    // SAFETY: every value was written above.
    unsafe { out_buffer.set_len(total) };
    let mut res = vec![back(Tensor::from_f32(shape.clone(), out_buffer), x.dtype())];
    if want_indices {
        res.push(Tensor::from_i64(shape, idx_out));
    }
    Ok(res)
}

thread_local! {
    /// Each thread's row maxima of the separable max pooling (`Rows2d::plane_with`).
    static ROW_MAXIMA: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The 2-D pooling of one plane, row by row (see `pool`): the window's rows and columns inside
/// the image per output row and column, per kernel column the output columns it reaches, the
/// steps (row stride, dilation, padding; column stride, dilation, padding) and the phase split
/// of the input rows.
struct Rows2d<'a> {
    kind: Kind,
    rows: &'a [((usize, usize), usize)],
    cols: &'a [((usize, usize), usize)],
    col_range: &'a [(usize, usize, usize)],
    ow: usize,
    steps: (usize, usize, usize),
    row_len: usize,
}

impl Rows2d<'_> {
    /// Pools `img` (the plane, phase-split when the column stride is above 1) into `plane`.
    fn plane(&self, img: &[f32], plane: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has the feature the function was compiled for.
            return unsafe { self.plane_avx2(img, plane) };
        }
        self.plane_with(img, plane, max_into_generic, fold_max_generic)
    }

    /// [`Rows2d::plane`] compiled for AVX2 once per plane: the row maxima inline (a dispatch
    /// per kernel tap and output row cost more than the maxima on YOLOv8n's 10×10 SPPF planes).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn plane_avx2(&self, img: &[f32], plane: &mut [f32]) {
        // SAFETY (of the calls): this function runs only where the CPU has AVX2.
        self.plane_with(
            img,
            plane,
            |acc, src| unsafe { max_into_avx2(acc, src) },
            |taps, out| unsafe { fold_max_avx2(taps, out) },
        )
    }

    #[inline(always)]
    fn plane_with(
        &self,
        img: &[f32],
        plane: &mut [f32],
        max: impl Fn(&mut [f32], &[f32]),
        fold_max: impl Fn(&[&[f32]], &mut [f32]),
    ) {
        let Rows2d {
            kind,
            rows,
            cols,
            col_range,
            ow,
            row_len,
            ..
        } = *self;
        let (sh, dh, ph) = self.steps;
        // Input row iy's maxima over the kernel's columns, into `into` (one value per output
        // column): taps in the kernel's column order.
        let row_maxima = |iy: usize, into: &mut [f32]| {
            into.fill(f32::NEG_INFINITY);
            let row = &img[iy * row_len..(iy + 1) * row_len];
            for &(lo, hi, src) in col_range {
                if lo < hi {
                    max(&mut into[lo..hi], &row[src..src + (hi - lo)]);
                }
            }
        };
        if kind == Kind::Max && sh == 1 && rows.iter().any(|r| r.0 .1 - r.0 .0 > 1) {
            // Separable: each input row's maxima over the kernel's columns once, then per
            // output row the maximum of its kernel rows' maxima (ONNX Runtime's pooling works
            // the same way). Each output is still the first largest value of its window in
            // (kernel row, column) order, or its last NaN: the operation keeps the first of
            // equal values and the last NaN, so grouping the taps by rows changes nothing.
            let ih = img.len() / row_len;
            return crate::ops::util::with_scratch(&ROW_MAXIMA, Vec::new, |h: &mut Vec<f32>| {
                h.resize(ih * ow, 0.0);
                for (iy, into) in h.chunks_exact_mut(ow).enumerate() {
                    row_maxima(iy, into);
                }
                for (y, &((a_lo, a_hi), _)) in rows.iter().enumerate() {
                    let acc = &mut plane[y * ow..(y + 1) * ow];
                    acc.fill(f32::NEG_INFINITY);
                    for a in a_lo..a_hi {
                        let iy = y * sh + a * dh - ph;
                        max(acc, &h[iy * ow..(iy + 1) * ow]);
                    }
                }
            });
        }
        // Max pooling's interior columns, where every kernel column's tap lies inside the
        // image: all of an output's taps at once (`fold_max`), each output stored once. The
        // columns outside it (the padding's) take their taps one by one below. (Tap by tap
        // everywhere before 2026-11-27: a tap's run one column short of a whole number of
        // vectors re-read the values the run before had just stored across two stores, a
        // store-forwarding stall per tap and row.)
        let interior = match kind {
            Kind::Max => col_range
                .iter()
                .fold((0, ow), |(l, h), &(lo, hi, _)| (l.max(lo), h.min(hi))),
            _ => (0, 0),
        };
        let (x_lo, x_hi) = if interior.0 < interior.1 {
            interior
        } else {
            (0, 0)
        };
        let mut taps: Vec<&[f32]> = Vec::new();
        for (y, &((a_lo, a_hi), a_pad)) in rows.iter().enumerate() {
            // Accumulate a whole output row at once: independent accumulators per
            // column instead of one dependent chain per output.
            let acc = &mut plane[y * ow..(y + 1) * ow];
            if x_lo < x_hi {
                taps.clear();
                for a in a_lo..a_hi {
                    let iy = y * sh + a * dh - ph;
                    let row = &img[iy * row_len..(iy + 1) * row_len];
                    taps.extend(col_range.iter().map(|&(lo, _, src)| {
                        let at = src + x_lo - lo;
                        &row[at..at + (x_hi - x_lo)]
                    }));
                }
                fold_max(&taps, &mut acc[x_lo..x_hi]);
            }
            let init = if kind == Kind::Max {
                f32::NEG_INFINITY
            } else {
                0.0
            };
            acc[..x_lo].fill(init);
            acc[x_hi.max(x_lo)..].fill(init);
            for a in a_lo..a_hi {
                let iy = y * sh + a * dh - ph;
                let row = &img[iy * row_len..(iy + 1) * row_len];
                for &(lo, hi, src) in col_range {
                    // This tap's columns outside the interior (done above).
                    for (from, to) in [(lo, hi.min(x_lo)), (lo.max(x_hi), hi)] {
                        if from >= to {
                            continue;
                        }
                        let acc = &mut acc[from..to];
                        let at = src + from - lo;
                        let src = &row[at..at + (to - from)];
                        if kind == Kind::Max {
                            max(acc, src);
                        } else {
                            for (d, &v) in acc.iter_mut().zip(src) {
                                *d += v;
                            }
                        }
                    }
                }
            }
            if let Kind::Avg { count_pad } = kind {
                for (x0, d) in acc.iter_mut().enumerate() {
                    let ((b_lo, b_hi), b_pad) = cols[x0];
                    let n = if count_pad {
                        a_pad * b_pad
                    } else {
                        (a_hi - a_lo) * (b_hi - b_lo)
                    };
                    *d /= n.max(1) as f32;
                }
            }
        }
    }
}

/// Max pooling with a 3×3 window at stride 2 (padding 0 or 1; ResNet's stem pool and most
/// CNNs' downsampling pools) in AVX-512, without the phase-split copy of the general 2-D path:
/// 16 outputs' three column taps come from two loads of a row by two permutes (the even and odd
/// columns) and an alignment, each input row's maxima over its three columns once, then each
/// output row the maximum of its three rows' maxima. The general path spent ~1.1 ns an output
/// on the bench CNN's [1,32,112,112] pool (per-row tap lists and the phase copy; ONNX
/// Runtime's NCHWc pool ~0.2 ns). The same values: the same rule (a larger value or a NaN
/// replaces the running maximum) in the same tap order per row, and rows in order — grouping
/// the taps by rows changes nothing (see `Rows2d::plane_with`).
#[cfg(target_arch = "x86_64")]
mod stride2 {
    use std::arch::x86_64::*;

    thread_local! {
        /// Each thread's row maxima (one row of `ow` rounded up to 16 per input row).
        static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// One plane's geometry: input rows and columns, the top and left padding (0 or 1), the
    /// output rows and columns.
    #[derive(Clone, Copy)]
    pub(super) struct Plane {
        pub ih: usize,
        pub iw: usize,
        pub pad: (usize, usize),
        pub oh: usize,
        pub ow: usize,
    }

    /// `d` replaced by `v` where `v` is larger or NaN (`max_into_generic`'s rule).
    #[inline(always)]
    pub(super) unsafe fn rule(d: __m512, v: __m512) -> __m512 {
        // MAXPS(v, d) is `v > d ? v : d`, d when either is NaN: then v where v is NaN.
        _mm512_mask_mov_ps(
            _mm512_max_ps(v, d),
            _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v),
            v,
        )
    }

    impl Plane {
        /// Pools `img` (ih × iw) into `plane` (oh × ow).
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn pool_avx512(&self, img: &[f32], plane: &mut [f32]) {
            self.pool_rows_avx512(img, plane, 0..self.oh)
        }

        /// Pools output rows `rows` of `img` (ih × iw) into `out` (those rows, ow each).
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn pool_rows_avx512(
            &self,
            img: &[f32],
            out: &mut [f32],
            rows: std::ops::Range<usize>,
        ) {
            let Plane {
                ih,
                iw,
                pad: (pt, pl),
                oh,
                ow,
            } = *self;
            assert!(img.len() >= ih * iw && rows.end <= oh && out.len() >= rows.len() * ow);
            if rows.is_empty() {
                return;
            }
            // The input rows the output rows' windows reach.
            let (r_lo, r_hi) = (
                (2 * rows.start).saturating_sub(pt),
                (2 * rows.end + 1 - pt).min(ih),
            );
            let stride = ow.div_ceil(16) * 16;
            let even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            let odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
            let lowest = _mm512_set1_ps(f32::NEG_INFINITY);
            let lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
            // The lanes of 16 columns from `start` that lie inside the row.
            let inside = |start: isize| -> __mmask16 {
                let col = _mm512_add_epi32(_mm512_set1_epi32(start as i32), lanes);
                _mm512_cmpge_epi32_mask(col, _mm512_setzero_si512())
                    & _mm512_cmplt_epi32_mask(col, _mm512_set1_epi32(iw as i32))
            };
            // Per block of 16 output columns: the first column its windows read (output column
            // x reads columns 2x − pl, 2x + 1 − pl, 2x + 2 − pl) and, where some of its 33
            // columns lie outside the row, the lanes of its three loads that lie inside — the
            // same for every row, so worked out once (per row they cost more than the maxima).
            let blocks: Vec<(isize, Option<[__mmask16; 3]>)> = (0..ow)
                .step_by(16)
                .map(|x0| {
                    let s = (2 * x0) as isize - pl as isize;
                    let plain = s >= 0 && s as usize + 33 <= iw;
                    (
                        s,
                        (!plain).then(|| [inside(s), inside(s + 16), inside(s + 32)]),
                    )
                })
                .collect();
            super::super::util::with_scratch(&ROWS, Vec::new, |h: &mut Vec<f32>| {
                h.resize(ih * stride, 0.0);
                // Each input row's maxima over the three columns of every output column.
                for (r, hrow) in h.chunks_exact_mut(stride).enumerate().take(r_hi).skip(r_lo) {
                    let row = img.as_ptr().add(r * iw);
                    for (j, &(s, masks)) in blocks.iter().enumerate() {
                        let x0 = 16 * j;
                        let (a, b, c) = match masks {
                            None => {
                                // All 33 columns inside the row: plain loads.
                                let at = row.add(s as usize);
                                let (a, b) = (_mm512_loadu_ps(at), _mm512_loadu_ps(at.add(16)));
                                (a, b, _mm512_set1_ps(*at.add(32)))
                            }
                            Some([ka, kb, kc]) => {
                                // Masked-off lanes are not read (no fault, no access).
                                let load = |k: __mmask16, at: isize| {
                                    _mm512_mask_loadu_ps(lowest, k, row.wrapping_offset(at))
                                };
                                (load(ka, s), load(kb, s + 16), load(kc, s + 32))
                            }
                        };
                        let t0 = _mm512_permutex2var_ps(a, even, b);
                        let t1 = _mm512_permutex2var_ps(a, odd, b);
                        // Columns s + 2j + 2: the even ones one lane on, then column s + 32.
                        let t2 = _mm512_castsi512_ps(_mm512_alignr_epi32::<1>(
                            _mm512_castps_si512(c),
                            _mm512_castps_si512(t0),
                        ));
                        let m = rule(rule(t0, t1), t2);
                        _mm512_storeu_ps(hrow.as_mut_ptr().add(x0), m);
                    }
                }
                // Each output row: its three input rows' maxima, in row order.
                let out_rows = out.chunks_exact_mut(ow.max(1)).take(rows.len());
                for (y, out) in rows.clone().zip(out_rows) {
                    // Input rows 2y − pt .. 2y + 2 − pt inside the image.
                    let first = (2 * y).saturating_sub(pt);
                    let last = (2 * y + 3 - pt).min(ih);
                    if last == first + 3 {
                        // All three rows inside the image (every output row but the edges'):
                        // straight-line loads and maxima, no loop over the rows (the loop was
                        // 11 % of a [1,32,112,112] pool on one Zen 5 thread).
                        let r0 = h.as_ptr().add(first * stride);
                        let (r1, r2) = (r0.add(stride), r0.add(2 * stride));
                        for x0 in (0..ow).step_by(16) {
                            let row_max = |r: *const f32| _mm512_loadu_ps(r.add(x0));
                            let m = rule(rule(row_max(r0), row_max(r1)), row_max(r2));
                            let mask = crate::numeric::lanes16(x0, ow);
                            _mm512_mask_storeu_ps(out.as_mut_ptr().add(x0), mask, m);
                        }
                        continue;
                    }
                    for x0 in (0..ow).step_by(16) {
                        let mut m = lowest;
                        for r in first..last {
                            let v = _mm512_loadu_ps(h.as_ptr().add(r * stride + x0));
                            m = if r == first { v } else { rule(m, v) };
                        }
                        let mask = crate::numeric::lanes16(x0, ow);
                        _mm512_mask_storeu_ps(out.as_mut_ptr().add(x0), mask, m);
                    }
                }
            })
        }
    }
}

/// Max pooling at stride 1 where an output row is as long as an input row (`ow == iw`: the
/// padding of the columns makes up the window's reach) on planes whose rows are shorter than
/// a vector, in AVX-512: the row-by-row path there ran a call per kernel tap and row on runs
/// of 5–10 values (YOLOv8n's SPPF pools at 5×5 and 10×10: 4.5× ONNX Runtime's time). Flat,
/// output (y, x) sits at y·w + x, its row maxima's row and column taps at offsets from there
/// that are the same for every position, so a plane is whole vectors of 16 positions, each
/// tap one masked load (lanes whose tap lies outside the image are not read and hold −∞,
/// which the rule leaves as it is). The same values: each input row's maxima over the
/// kernel's columns in column order, then each output the maximum of its kernel rows' maxima
/// in row order, under the one rule (`max_into_generic`): grouping by rows changes nothing
/// (see `Rows2d::plane_with`).
#[cfg(target_arch = "x86_64")]
mod flat {
    use std::arch::x86_64::*;

    pub(super) const LANES: usize = 16;

    thread_local! {
        /// Each thread's row maxima (ih × w, rounded up to whole vectors).
        static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// One tap of a pass: its offset from the position it serves, and per vector of 16
    /// positions the lanes whose tap lies inside the plane.
    struct Tap {
        offset: isize,
        inside: Vec<__mmask16>,
    }

    /// A plane's geometry and the taps of both passes, worked out once for every plane.
    pub(super) struct Plane {
        ih: usize,
        w: usize,
        oh: usize,
        columns: Vec<Tap>,
        rows: Vec<Tap>,
    }

    impl Plane {
        /// Input rows and columns (`hw`), output rows, the kernel, its dilations and its
        /// top and left padding; the output has `hw.1` columns.
        pub(super) fn new(
            hw: (usize, usize),
            oh: usize,
            kernel: (usize, usize),
            dilation: (usize, usize),
            pad: (usize, usize),
        ) -> Plane {
            let (ih, w) = hw;
            // The taps of positions 0..len of a w-wide flat plane, `count` of them, tap t
            // moving the position's row (`across_rows`) or column by `step(t)`: inside where
            // that row (of `ih`) or column (of `w`) exists.
            let taps =
                |len: usize, count: usize, step: &dyn Fn(usize) -> isize, across_rows: bool| {
                    let unit = if across_rows { w as isize } else { 1 };
                    let blocks = len.div_ceil(LANES);
                    (0..count)
                        .map(|t| Tap {
                            offset: step(t) * unit,
                            inside: (0..blocks)
                                .map(|b| {
                                    (0..LANES).fold(0u16, |m, l| {
                                        let i = b * LANES + l;
                                        let ok = i < len && {
                                            let (coord, limit) = match across_rows {
                                                false => ((i % w) as isize, w as isize),
                                                true => ((i / w) as isize, ih as isize),
                                            };
                                            (0..limit).contains(&(coord + step(t)))
                                        };
                                        m | (u16::from(ok) << l)
                                    })
                                })
                                .collect(),
                        })
                        .collect::<Vec<Tap>>()
                };
            let column = |t: usize| (t * dilation.1) as isize - pad.1 as isize;
            let row = |t: usize| (t * dilation.0) as isize - pad.0 as isize;
            Plane {
                ih,
                w,
                oh,
                columns: taps(ih * w, kernel.1, &column, false),
                rows: taps(oh * w, kernel.0, &row, true),
            }
        }

        /// Pools `img` (ih × w) into `plane` (oh × w).
        #[target_feature(enable = "avx512f")]
        pub(super) unsafe fn pool_avx512(&self, img: &[f32], plane: &mut [f32]) {
            let Plane { ih, w, oh, .. } = *self;
            assert!(img.len() >= ih * w && plane.len() >= oh * w);
            let lowest = _mm512_set1_ps(f32::NEG_INFINITY);
            // Positions `at..at + 16` of `src` under `taps`: the running maximum over them.
            let fold = |taps: &[Tap], src: *const f32, b: usize| {
                let at = (b * LANES) as isize;
                taps.iter().fold(lowest, |m, tap| {
                    // SAFETY: a lane is read only where its tap lies inside the plane `src`
                    // points to (`inside`); masked-off lanes are not accessed.
                    let v = unsafe {
                        _mm512_mask_loadu_ps(
                            lowest,
                            tap.inside[b],
                            src.wrapping_offset(at + tap.offset),
                        )
                    };
                    super::stride2::rule(m, v)
                })
            };
            super::super::util::with_scratch(&ROWS, Vec::new, |h: &mut Vec<f32>| {
                let blocks = (ih * w).div_ceil(LANES);
                h.resize(blocks * LANES, 0.0);
                for b in 0..blocks {
                    _mm512_storeu_ps(
                        h.as_mut_ptr().add(b * LANES),
                        fold(&self.columns, img.as_ptr(), b),
                    );
                }
                let len = oh * w;
                for b in 0..len.div_ceil(LANES) {
                    let mask = crate::numeric::lanes16(b * LANES, len);
                    let m = fold(&self.rows, h.as_ptr(), b);
                    _mm512_mask_storeu_ps(plane.as_mut_ptr().add(b * LANES), mask, m);
                }
            })
        }
    }
}

fn max_pool(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    pool(ctx, inputs, Kind::Max)
}

fn avg_pool(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let count_pad = ctx.attrs::<PoolAttrs>()?.count_include_pad;
    pool(ctx, inputs, Kind::Avg { count_pad })
}

fn lp_pool(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let p = ctx.attrs::<PoolAttrs>()?.p as f32;
    pool(ctx, inputs, Kind::Lp(p))
}

fn global(inputs: &[Option<&Tensor>], f: impl Fn(&[f32]) -> f32 + Sync) -> OpResult {
    let x = input(inputs, 0)?;
    if x.rank() < 2 {
        return Err(OpError(format!(
            "input must have rank >= 2, got {:?}",
            x.shape()
        )));
    }
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let sp: usize = x.shape()[2..].iter().product();
    let xv = as_f32(x)?;
    // Planes go to tasks of at least GLOBAL_TASK_VALUES values, and a pool of fewer than two
    // such tasks runs on the calling thread: the bench CNN's [1,256,7,7] average (12 Ki
    // values, a plane a task) took 1.5–1.9× its one-thread time on two threads (Zen 5,
    // Intel), the fork and the collect costing more than the sums. Each plane is the same
    // fold either way.
    const GLOBAL_TASK_VALUES: usize = 1 << 14;
    let out: Vec<f32> = if sp == 0 {
        vec![0.0; n * c]
    } else if xv.len() >= 2 * GLOBAL_TASK_VALUES {
        xv.par_chunks(sp)
            .with_min_len(GLOBAL_TASK_VALUES.div_ceil(sp))
            .map(&f)
            .collect()
    } else {
        xv.chunks(sp).map(&f).collect()
    };
    let mut shape = vec![n, c];
    shape.extend(std::iter::repeat_n(1, x.rank() - 2));
    Ok(vec![back(Tensor::from_f32(shape, out), x.dtype())])
}

fn global_avg_pool(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    global(inputs, |v| v.iter().sum::<f32>() / v.len() as f32)
}

fn global_max_pool(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    global(inputs, |v| {
        v.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    })
}

fn global_lp_pool(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let p = ctx.attrs::<LpNorm>()?.0 as f32;
    global(inputs, move |v| {
        v.iter().map(|x| x.abs().powf(p)).sum::<f32>().powf(1.0 / p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Attribute, Node};

    fn node(op: &str, attrs: &[(&str, Attribute)]) -> Node {
        crate::graph::testing::node_with(op, attrs)
    }

    #[test]
    fn max_and_avg_pool_with_padding() {
        let x = Tensor::from_f32(vec![1, 1, 2, 2], vec![1., 2., 3., 4.]);
        let attrs = [
            ("kernel_shape", Attribute::Ints(vec![2, 2])),
            ("pads", Attribute::Ints(vec![1, 1, 0, 0])),
        ];
        let n = node("MaxPool", &attrs);
        let y = max_pool(&OpCtx::new(&n, 12), &[Some(&x)])
            .unwrap()
            .remove(0);
        assert_eq!(y.as_f32().unwrap(), &[1., 2., 3., 4.]);
        let n = node("AveragePool", &attrs);
        let y = avg_pool(&OpCtx::new(&n, 12), &[Some(&x)])
            .unwrap()
            .remove(0);
        assert_eq!(y.as_f32().unwrap(), &[1., 1.5, 2., 2.5]);
        let mut a = attrs.to_vec();
        a.push(("count_include_pad", Attribute::Int(1)));
        let n = node("AveragePool", &a);
        let y = avg_pool(&OpCtx::new(&n, 12), &[Some(&x)])
            .unwrap()
            .remove(0);
        assert_eq!(y.as_f32().unwrap(), &[0.25, 0.75, 1.0, 2.5]);
    }

    /// The vector row maximum is the scalar one bit for bit: NaN on either side, signed
    /// zeros both ways round, lengths around the 8-lane blocks.
    #[test]
    fn the_vector_row_maximum_is_the_scalar_one() {
        let pool = [
            0.0,
            -0.0,
            1.5,
            -2.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            3.0,
        ];
        for len in [0usize, 1, 7, 8, 9, 31, 64] {
            let acc: Vec<f32> = (0..len).map(|i| pool[(i * 3) % 8]).collect();
            let src: Vec<f32> = (0..len).map(|i| pool[(i * 5 + 1) % 8]).collect();
            let mut scalar = acc.clone();
            max_into_generic(&mut scalar, &src);
            let mut vector = acc.clone();
            max_into(&mut vector, &src);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&vector), bits(&scalar), "{len}");
        }
    }

    /// Every 2-D max pooling path (separable with stride 1, row by row otherwise; AVX2 rows
    /// and short rows) gives each output the first largest value of its window in (kernel
    /// row, column) order, or its last NaN — bit for bit, with NaN payloads, signed zeros,
    /// padding, dilations, strides and rows narrower and wider than a vector.
    #[test]
    fn max_pooling_is_the_windows_tap_order_maximum() {
        // 13 columns: interiors under a vector; 45: interiors of whole vectors and a partial
        // one (the all-taps fold of the interior columns, its last vector overlapping).
        // 64 and 33 columns: the 3×3 stride-2 pool's AVX-512 path on whole and partial
        // vectors of 16 outputs, even and odd rows. 5×5, 10×10, 6×7 and 4×3: rows under a
        // vector, each plane pooled flat at stride 1 where the output rows keep the input's
        // length (the flat vectors span several rows).
        for (h, w) in [
            (11usize, 13usize),
            (9, 45),
            (20, 64),
            (7, 33),
            (5, 5),
            (10, 10),
            (6, 7),
            (4, 3),
        ] {
            max_pooling_is_the_windows_tap_order_maximum_on(h, w);
        }
    }

    fn max_pooling_is_the_windows_tap_order_maximum_on(h: usize, w: usize) {
        let x: Vec<f32> = (0..2 * h * w)
            .map(|i| match i % 17 {
                3 => f32::from_bits(0x7fc0_0000 | i as u32), // NaNs told apart by payload
                5 | 11 => 0.0,
                7 => -0.0,
                _ => ((i * 37 % 23) as f32 - 11.0) / 4.0,
            })
            .collect();
        let ints = |v: &[i64]| Attribute::Ints(v.to_vec());
        for ceil in [0, 1] {
            for (k, strides, dil, pads) in [
                ([3, 3], [1, 1], [1, 1], [1, 1, 1, 1]),
                ([5, 5], [1, 1], [1, 1], [2, 2, 2, 2]),
                ([2, 3], [1, 1], [2, 1], [0, 1, 1, 0]),
                ([3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
                ([3, 3], [2, 2], [1, 1], [0, 0, 0, 0]),
                ([3, 3], [2, 2], [1, 1], [1, 0, 0, 1]),
                ([3, 3], [2, 2], [1, 1], [0, 1, 1, 0]),
                ([3, 2], [1, 2], [1, 2], [1, 0, 1, 2]),
                ([3, 3], [1, 3], [1, 1], [0, 2, 1, 1]),
                // Stride 1, output rows as long as the input's: dilated columns, one row
                // fewer than the input (no row padding), asymmetric and wider padding.
                ([3, 3], [1, 1], [1, 2], [1, 2, 1, 2]),
                ([2, 3], [1, 1], [1, 1], [0, 1, 0, 1]),
                ([4, 2], [1, 1], [2, 1], [3, 0, 3, 1]),
            ] {
                let n = node(
                    "MaxPool",
                    &[
                        ("kernel_shape", ints(&k)),
                        ("strides", ints(&strides)),
                        ("dilations", ints(&dil)),
                        ("pads", ints(&pads)),
                        ("ceil_mode", Attribute::Int(ceil)),
                    ],
                );
                let xt = Tensor::from_f32(vec![1, 2, h, w], x.clone());
                let y = max_pool(&OpCtx::new(&n, 12), &[Some(&xt)])
                    .unwrap()
                    .remove(0);
                let (oh, ow) = (y.shape()[2], y.shape()[3]);
                let got = y.as_f32().unwrap();
                for c in 0..2 {
                    for (oy, ox) in (0..oh).flat_map(|a| (0..ow).map(move |b| (a, b))) {
                        let mut acc = f32::NEG_INFINITY;
                        for (a, b) in (0..k[0]).flat_map(|a| (0..k[1]).map(move |b| (a, b))) {
                            let iy = (oy as i64 * strides[0] + a * dil[0]) - pads[0];
                            let ix = (ox as i64 * strides[1] + b * dil[1]) - pads[1];
                            if (0..h as i64).contains(&iy) && (0..w as i64).contains(&ix) {
                                let v = x[c * h * w + iy as usize * w + ix as usize];
                                if v > acc || v.is_nan() {
                                    acc = v;
                                }
                            }
                        }
                        let g = got[(c * oh + oy) * ow + ox];
                        assert_eq!(
                            g.to_bits(),
                            acc.to_bits(),
                            "{w} {k:?} {strides:?} ceil {ceil} ({oy}, {ox})"
                        );
                    }
                }
            }
        }
    }

    /// The 3×3 stride-2 pool split into bands of output rows over all planes gives every
    /// plane's values as pooled whole, for any number of bands and both paddings.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn row_bands_pool_what_whole_planes_pool() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        for (ih, iw, pad) in [
            (20usize, 64usize, 1usize),
            (7, 33, 1),
            (9, 45, 0),
            (21, 17, 0),
        ] {
            let out_len = |i: usize| (i + 2 * pad - 3) / 2 + 1;
            let (oh, ow) = (out_len(ih), out_len(iw));
            let stem = stride2::Plane {
                ih,
                iw,
                pad: (pad, pad),
                oh,
                ow,
            };
            let planes = 3;
            let x: Vec<f32> = (0..planes * ih * iw)
                .map(|i| match i % 13 {
                    4 => f32::from_bits(0x7fc0_0000 | i as u32),
                    _ => ((i * 29 % 31) as f32 - 15.0) / 8.0,
                })
                .collect();
            let mut whole = vec![0f32; planes * oh * ow];
            for (p, plane) in whole.chunks_exact_mut(oh * ow).enumerate() {
                // SAFETY: the CPU has AVX-512F (checked above).
                unsafe { stem.pool_avx512(&x[p * ih * iw..(p + 1) * ih * iw], plane) };
            }
            for bands in 1..=oh.min(5) {
                let mut banded = vec![f32::NAN; planes * oh * ow];
                pool_in_row_bands(&stem, &x, &mut banded, ih * iw, bands);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&banded),
                    bits(&whole),
                    "{ih}×{iw} pad {pad}, {bands} bands"
                );
            }
        }
    }

    #[test]
    fn max_pool_propagates_a_nan_anywhere_in_the_window() {
        // IEEE 754-2019 maximum (numpy, PyTorch); ORT's MLAS kernel keeps a NaN only when it
        // is last in the window (docs/numerics.md).
        let nan = f32::NAN;
        let x = Tensor::from_f32(vec![1, 1, 2, 4], vec![nan, 1., 2., 3., 4., 5., 6., nan]);
        let attrs = [
            ("kernel_shape", Attribute::Ints(vec![2, 2])),
            ("strides", Attribute::Ints(vec![2, 2])),
        ];
        let n = node("MaxPool", &attrs);
        let y = max_pool(&OpCtx::new(&n, 12), &[Some(&x)])
            .unwrap()
            .remove(0);
        let v = y.as_f32().unwrap();
        assert!(v[0].is_nan() && v[1].is_nan(), "{v:?}");
        let inf = Tensor::from_f32(vec![1, 1, 2, 2], vec![f32::NEG_INFINITY; 4]);
        let n = node("MaxPool", &attrs[..1]);
        let y = max_pool(&OpCtx::new(&n, 12), &[Some(&inf)])
            .unwrap()
            .remove(0);
        assert_eq!(y.as_f32().unwrap(), &[f32::NEG_INFINITY]);
    }

    #[test]
    fn bad_attributes_are_load_errors() {
        use crate::ops::attrs::testing::assert_rejected;
        let k = ("kernel_shape", Attribute::Ints(vec![2, 2]));
        assert_rejected("MaxPool", &[], "kernel_shape", "missing");
        assert_rejected(
            "AveragePool",
            &[k.clone(), ("pads", Attribute::Ints(vec![0; 6]))],
            "pads",
            "expected 4 values (2 spatial dims x 2), got 6",
        );
        assert_rejected(
            "MaxPool",
            &[k.clone(), ("storage_order", Attribute::Int(2))],
            "storage_order",
            "got 2",
        );
        assert_rejected(
            "LpPool",
            &[k, ("p", Attribute::Float(2.0))],
            "p",
            "expected an int, got a float",
        );
        assert_rejected(
            "GlobalLpPool",
            &[("p", Attribute::Ints(vec![]))],
            "p",
            "an int",
        );
    }

    #[test]
    fn global_pools_split_over_threads_give_each_plane_its_own_fold() {
        // 4 planes of 128² (64 Ki values: the parallel path) and of 8² (the calling thread's):
        // each output is its plane's left-to-right sum over its size.
        for side in [128usize, 8] {
            let values: Vec<f32> = (0..4 * side * side)
                .map(|i| ((i * 7919) % 1000) as f32 * 0.37 - 150.0)
                .collect();
            let x = Tensor::from_f32(vec![1, 4, side, side], values.clone());
            let n = node("GlobalAveragePool", &[]);
            let y = global_avg_pool(&OpCtx::new(&n, 12), &[Some(&x)])
                .unwrap()
                .remove(0);
            let want: Vec<f32> = values
                .chunks(side * side)
                .map(|p| p.iter().sum::<f32>() / p.len() as f32)
                .collect();
            assert_eq!(y.shape(), &[1, 4, 1, 1]);
            assert_eq!(y.as_f32().unwrap(), &want[..]);
        }
    }

    #[test]
    fn global_average() {
        let x = Tensor::from_f32(vec![1, 2, 2], vec![1., 3., 10., 20.]);
        let n = node("GlobalAveragePool", &[]);
        let y = global_avg_pool(&OpCtx::new(&n, 12), &[Some(&x)])
            .unwrap()
            .remove(0);
        assert_eq!(y.shape(), &[1, 2, 1]);
        assert_eq!(y.as_f32().unwrap(), &[2., 15.]);
    }
}
