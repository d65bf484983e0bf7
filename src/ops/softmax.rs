//! Softmax, LogSoftmax and Hardmax.
//!
//! Opset < 13 coerces the input to 2-D at `axis` (default 1) and normalizes each row of the
//! flattened inner dims; opset >= 13 normalizes along the single `axis` (default -1).
//! Softmax's exponentials are MLAS's (`exp(x − max)` as ONNX Runtime's softmax kernel computes
//! each one); their sum accumulates in f64 in a fixed order ([`Sum8`]), so large logits stay
//! exact and the result is the same on every machine and thread count. LogSoftmax sums f64
//! exponentials of the shifted values.

use super::logistic::softmax_exp;
use super::util::{input, norm_axis};
use super::{OpCtx, OpError, OpResult, Registry};
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    r.add("Softmax", |c, i| softmax_like(c, i, Kind::Softmax));
    r.add("LogSoftmax", |c, i| softmax_like(c, i, Kind::LogSoftmax));
    r.add("Hardmax", |c, i| softmax_like(c, i, Kind::Hardmax));
    for op in ["Softmax", "LogSoftmax", "Hardmax"] {
        r.def_mut(op)
            .parse(|n, opset| {
                let legacy = opset < 13;
                super::attrs::boxed(
                    super::attrs::Attrs::new(n)
                        .int_or("axis", if legacy { 1 } else { -1 })
                        .map(|axis| SoftmaxAttrs { axis }),
                )
            })
            .infer(super::shape::same_as_input);
    }
    for op in ["Softmax", "LogSoftmax"] {
        r.def_mut(op).flops(|_, _, outs| {
            5 * outs
                .first()
                .map_or(0, |s| s.iter().product::<usize>() as u64)
        });
    }
}

/// Softmax's, LogSoftmax's and Hardmax's `axis` (default 1 before opset 13, -1 from it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SoftmaxAttrs {
    pub axis: i64,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Softmax,
    LogSoftmax,
    Hardmax,
}

/// `MlasComputeSumExpF32KernelFma3` (ONNX Runtime 1.32 on an AVX2 CPU) on a row in place:
/// every value becomes `exp(x + neg_max)` ([`softmax_exp`]) and the returned sum adds them as the
/// kernel does, bit for bit: one 8-lane accumulator taking the row 8 values at a time (lane
/// `k mod 8`, the last partial vector zero-padded), reduced as `((a0+a1)+(a2+a3)) +
/// ((a4+a5)+(a6+a7))`.
pub(crate) fn mlas_sum_exp(v: &mut [f32], neg_max: f32) -> f32 {
    // `softmax_exp`'s nine `mul_add`s are instructions where FMA is enabled, else calls to
    // libm's `fmaf` (the same values).
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { mlas_sum_exp_fma(v, neg_max) };
    }
    mlas_sum_exp_with(v, neg_max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn mlas_sum_exp_fma(v: &mut [f32], neg_max: f32) -> f32 {
    mlas_sum_exp_with(v, neg_max)
}

#[inline(always)]
fn mlas_sum_exp_with(v: &mut [f32], neg_max: f32) -> f32 {
    let mut lanes = [0f32; 8];
    for chunk in v.chunks_mut(8) {
        for (l, x) in lanes.iter_mut().zip(chunk.iter_mut()) {
            *x = softmax_exp(*x, neg_max);
            *l += *x;
        }
    }
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

/// `MlasComputeSoftmax` of one row in place, bit for bit (ONNX Runtime's attention kernels):
/// the row's maximum, [`mlas_sum_exp`], then every exponential times `1/sum` (f32).
pub(crate) fn mlas_softmax_row(v: &mut [f32]) {
    if v.is_empty() {
        return;
    }
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = mlas_sum_exp(v, -max);
    let inv = 1.0 / sum;
    v.iter_mut().for_each(|x| *x *= inv);
}

/// Softmax of one contiguous row in place (the attention kernels' probabilities).
pub(crate) fn softmax_row(v: &mut [f32]) {
    if !v.is_empty() {
        softmax_contiguous(v);
    }
}

/// Softmax of one row in place with one more logit, `sink`, counted in the denominator only
/// (ONNX Runtime's smooth softmax and attention sinks): `exp(x − m) / (Σ exp(x − m) +
/// exp(sink − m))`, `m` the maximum of the row and the sink.
pub(crate) fn smooth_softmax_row(v: &mut [f32], sink: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { smooth_softmax_row_fma(v, sink) };
    }
    smooth_softmax_row_with(v, sink)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn smooth_softmax_row_fma(v: &mut [f32], sink: f32) {
    smooth_softmax_row_with(v, sink)
}

#[inline(always)]
fn smooth_softmax_row_with(v: &mut [f32], sink: f32) {
    let neg_max = -row_max(v).max(sink);
    v.iter_mut().for_each(|x| *x = softmax_exp(*x, neg_max));
    normalize_plus(v, softmax_exp(sink, neg_max) as f64);
}

/// Lanes a task of a softmax along an inner axis walks at once.
const COLUMNS: usize = 256;

/// A row's sum of exponentials in f64: value k goes into partial sum k mod 8, and the
/// partials are added as ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) — one fixed order for every
/// layout and machine (the vector loop keeps the eight partials in two registers).
#[derive(Clone, Copy)]
struct Sum8([f64; 8]);

impl Sum8 {
    fn total(&self) -> f64 {
        let p = &self.0;
        ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
    }
}

/// The maximum of a row, in 8 lanes (max is order-free; f32::max skips a NaN, which the
/// exponentials then carry into the sum).
#[inline(always)]
fn row_max(v: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = m.max(x);
        }
    }
    chunks.remainder().iter().fold(
        lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max),
        |m, &x| m.max(x),
    )
}

/// Divides a row of exponentials by their [`Sum8`] (as `· (1/sum)` in f32). The sum is a loop
/// of its own after the exponentials' (one loop doing both ran at a third of the speed).
#[inline(always)]
fn normalize(v: &mut [f32]) {
    normalize_plus(v, 0.0)
}

/// [`normalize`] with `extra` added to the sum last.
#[inline(always)]
fn normalize_plus(v: &mut [f32], extra: f64) {
    let mut sum = Sum8([0.0; 8]);
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for (s, x) in sum.0.iter_mut().zip(c) {
            *s += *x as f64;
        }
    }
    for (s, x) in sum.0.iter_mut().zip(chunks.remainder()) {
        *s += *x as f64;
    }
    let inv = (1.0 / (sum.total() + extra)) as f32;
    v.iter_mut().for_each(|x| *x *= inv);
}

/// Softmax of the rows of `len` values of `dst`, read from the same rows of `src` (or from
/// `dst` itself, in place).
#[inline(always)]
fn softmax_rows_generic(src: Option<&[f32]>, dst: &mut [f32], len: usize) {
    for (r, row) in dst.chunks_mut(len).enumerate() {
        match src {
            Some(src) => {
                let src = &src[r * len..(r + 1) * len];
                let neg_max = -row_max(src);
                for (d, &x) in row.iter_mut().zip(src) {
                    *d = softmax_exp(x, neg_max);
                }
            }
            None => {
                let neg_max = -row_max(row);
                row.iter_mut().for_each(|x| *x = softmax_exp(*x, neg_max));
            }
        }
        normalize(row);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_rows_fma(src: Option<&[f32]>, dst: &mut [f32], len: usize) {
    softmax_rows_generic(src, dst, len)
}

/// Softmax of contiguous rows: [`softmax_exp`] of every value, divided by their [`Sum8`] (as
/// `· (1/sum)` in f32), from `src` into `dst` or in place in `dst`; compiled for AVX2+FMA
/// where the CPU has them.
fn softmax_rows(src: Option<&[f32]>, dst: &mut [f32], len: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features the function was compiled for.
        return unsafe { softmax_rows_fma(src, dst, len) };
    }
    softmax_rows_generic(src, dst, len)
}

/// [`softmax_rows`] over a whole tensor, in parallel tasks of about 2^12 values (whole rows)
/// above 2^14 values.
fn softmax_last_axis(src: Option<&[f32]>, dst: &mut [f32], len: usize) {
    if dst.len() < 1 << 14 {
        return softmax_rows(src, dst, len);
    }
    let rows = ((1 << 12) / len).max(1) * len;
    match src {
        Some(src) => dst
            .par_chunks_mut(rows)
            .zip(src.par_chunks(rows))
            .for_each(|(d, s)| softmax_rows(Some(s), d, len)),
        None => dst
            .par_chunks_mut(rows)
            .for_each(|d| softmax_rows(None, d, len)),
    }
}

/// Softmax of one contiguous row in place.
fn softmax_contiguous(v: &mut [f32]) {
    softmax_rows(None, v, v.len())
}

/// Softmax down `w ≤ COLUMNS` columns of `len` rows (row k at `b + k·inner`): each column the
/// operations of [`lane`] in its order — MLAS's exponential, value k into partial sum k mod 8
/// ([`Sum8`]) — with the partials kept as 8 rows of COLUMNS sums, so the loops over a row run
/// across columns and vectorize.
///
/// # Safety
/// `b` is valid for reads and writes of `w` values at `k·inner` for every k < len, and no other
/// thread touches them.
#[inline(always)]
unsafe fn softmax_columns_generic(b: *mut f32, inner: usize, len: usize, w: usize) {
    let row = |k: usize| std::slice::from_raw_parts_mut(b.add(k * inner), w);
    let mut max = [f32::NEG_INFINITY; COLUMNS];
    for k in 0..len {
        for (m, &x) in max.iter_mut().zip(row(k).iter()) {
            *m = m.max(x);
        }
    }
    let neg_max: [f32; COLUMNS] = std::array::from_fn(|c| -max[c]);
    let mut partial = [[0f64; COLUMNS]; 8];
    for k in 0..len {
        for ((s, x), &m) in partial[k % 8].iter_mut().zip(row(k)).zip(&neg_max) {
            let e = softmax_exp(*x, m);
            *x = e;
            *s += e as f64;
        }
    }
    let inv: [f32; COLUMNS] = std::array::from_fn(|c| {
        let p: [f64; 8] = std::array::from_fn(|i| partial[i][c]);
        (1.0 / Sum8(p).total()) as f32
    });
    for k in 0..len {
        for (x, &i) in row(k).iter_mut().zip(&inv) {
            *x *= i;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_columns_fma(b: *mut f32, inner: usize, len: usize, w: usize) {
    softmax_columns_generic(b, inner, len, w)
}

/// [`softmax_columns_generic`], compiled for AVX2+FMA where the CPU has them (same bits).
///
/// # Safety
/// As [`softmax_columns_generic`].
unsafe fn softmax_columns(b: *mut f32, inner: usize, len: usize, w: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return softmax_columns_fma(b, inner, len, w);
    }
    softmax_columns_generic(b, inner, len, w)
}

/// Normalizes one strided lane of `len` values (the same operations as
/// [`softmax_contiguous`] for Softmax).
fn lane(v: &mut [f32], base: usize, len: usize, stride: usize, kind: Kind) {
    let at = |k: usize| base + k * stride;
    let max = (0..len).map(|k| v[at(k)]).fold(f32::NEG_INFINITY, f32::max);
    match kind {
        Kind::Hardmax => {
            let first = (0..len).find(|&k| v[at(k)] == max).unwrap_or(0);
            for k in 0..len {
                v[at(k)] = if k == first { 1.0 } else { 0.0 };
            }
        }
        Kind::Softmax => {
            let mut sum = Sum8([0.0; 8]);
            for k in 0..len {
                let e = softmax_exp(v[at(k)], -max);
                v[at(k)] = e;
                sum.0[k % 8] += e as f64;
            }
            let inv = (1.0 / sum.total()) as f32;
            for k in 0..len {
                v[at(k)] *= inv;
            }
        }
        Kind::LogSoftmax => {
            let sum: f64 = (0..len).map(|k| ((v[at(k)] - max) as f64).exp()).sum();
            let lse = max as f64 + sum.ln();
            for k in 0..len {
                v[at(k)] = (v[at(k)] as f64 - lse) as f32;
            }
        }
    }
}

fn softmax_like(ctx: &OpCtx, inputs: &[Option<&Tensor>], kind: Kind) -> OpResult {
    let x = input(inputs, 0)?;
    if !x.dtype().is_float() {
        return Err(OpError(format!("dtype {} is not supported", x.dtype())));
    }
    let shape = x.shape().to_vec();
    let rank = shape.len().max(1);
    let legacy = ctx.opset < 13;
    let axis = norm_axis(ctx.attrs::<SoftmaxAttrs>()?.axis, rank)?;
    let dims = if shape.is_empty() {
        vec![1]
    } else {
        shape.clone()
    };
    let (outer, len, inner) = if legacy {
        (
            dims[..axis].iter().product::<usize>(),
            dims[axis..].iter().product::<usize>(),
            1,
        )
    } else {
        (
            dims[..axis].iter().product::<usize>(),
            dims[axis],
            dims[axis + 1..].iter().product::<usize>(),
        )
    };
    if let (Some(src), true) = (x.as_f32(), len > 0 && inner == 1 && kind == Kind::Softmax) {
        // Contiguous rows (the last axis), read from the input into an output that is not
        // zeroed or copied first (every row is written whole), in parallel above 2^14 values.
        let fill = |out: &mut [std::mem::MaybeUninit<f32>]| {
            // SAFETY: each row is written by its exponentials before the sum reads it.
            softmax_last_axis(Some(src), unsafe { super::util::assume_written(out) }, len)
        };
        // SAFETY: as above; the row chunks of `out` and `src` match and cover both.
        let out = unsafe { super::util::unzeroed_f32(src.len(), fill) };
        return Ok(vec![Tensor::from_f32(shape, out)]);
    }
    let mut v = x.to_f32_vec().expect("float");
    if len > 0 && outer * inner > 0 && inner >= COLUMNS && kind == Kind::Softmax {
        // An axis before the last (YOLOv8's DFL: [1, 16, 4, 8400] along 16): the lanes run
        // down the columns of each [len × inner] block, so walk its rows, COLUMNS lanes at a
        // time (contiguous reads, tasks over columns as well as blocks). Each lane sees the
        // same operations in the same order as `lane`, so the bits are the same.
        let block = len * inner;
        v.par_chunks_mut(block).for_each(|b| {
            let cols: Vec<usize> = (0..inner).step_by(COLUMNS).collect();
            let b = super::util::DisjointPtr(b.as_mut_ptr());
            cols.par_iter().for_each(|&c0| {
                let w = COLUMNS.min(inner - c0);
                // SAFETY: each task reads and writes only its own columns c0..c0 + w of every
                // row of this block, disjoint from the other tasks'.
                unsafe { softmax_columns(b.get().add(c0), inner, len, w) };
            });
        });
    } else if len > 0 && outer * inner > 0 && inner == 1 && kind == Kind::Softmax {
        // Contiguous rows (the last axis) of a 16-bit or f64 input, in place in its f32 copy.
        softmax_last_axis(None, &mut v, len);
    } else if len > 0 && outer * inner > 0 {
        let block = len * inner;
        v.par_chunks_mut(block).for_each(|b| {
            for i in 0..inner {
                lane(b, i, len, inner, kind);
            }
        });
    }
    let t = Tensor::from_f32(shape, v);
    Ok(vec![if x.dtype() == DType::F32 {
        t
    } else {
        super::cast::cast_tensor(&t, x.dtype())
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Node;

    /// The FMA builds of MLAS's sum of exponentials and of the smooth softmax give the
    /// portable builds' bits (each `mul_add` one rounding either way).
    #[test]
    fn the_fma_builds_give_the_portable_bits() {
        let row: Vec<f32> = (0..37)
            .map(|i| ((i * 7919) % 113) as f32 * 0.173 - 9.0)
            .collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut portable = row.clone();
        let sum = mlas_sum_exp_with(&mut portable, -10.5);
        let mut smooth = row.clone();
        smooth_softmax_row_with(&mut smooth, 1.5);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            let mut fused = row.clone();
            // SAFETY: the CPU has FMA (checked).
            let fused_sum = unsafe { mlas_sum_exp_fma(&mut fused, -10.5) };
            assert_eq!(
                (fused_sum.to_bits(), bits(&fused)),
                (sum.to_bits(), bits(&portable))
            );
            let mut fused = row.clone();
            // SAFETY: as above.
            unsafe { smooth_softmax_row_fma(&mut fused, 1.5) };
            assert_eq!(bits(&fused), bits(&smooth));
        }
        let exact: f64 = row.iter().map(|&x| (x as f64 - 10.5).exp()).sum();
        assert!((sum as f64 - exact).abs() < 1e-5 * exact);
    }

    fn run(op: &str, opset: i64, x: &Tensor) -> Vec<f32> {
        let node = Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec!["y".into()],
            attrs: Default::default(),
            ..Default::default()
        };
        let k = Registry::global().get("", op).unwrap();
        k(&OpCtx::new(&node, opset), &[Some(x)]).unwrap()[0]
            .to_f32_vec()
            .unwrap()
    }

    /// Along an inner axis (columns walked in blocks, in parallel) the bits are those of the
    /// lane-by-lane loop, with a NaN, infinities and a partial last block of columns.
    #[test]
    fn softmax_along_an_inner_axis_is_the_lane_by_lane_result() {
        let (outer, len, inner) = (2, 5, 3 * COLUMNS + 7);
        let mut x: Vec<f32> = (0..outer * len * inner)
            .map(|i| ((i * 37 % 1001) as f32 - 500.0) / 40.0)
            .collect();
        x[3] = f32::NAN;
        x[inner + 9] = f32::INFINITY;
        x[2 * inner + 10] = f32::NEG_INFINITY;
        let mut node = Node {
            name: "n".into(),
            op_type: "Softmax".into(),
            outputs: vec!["y".into()],
            ..Default::default()
        };
        node.attrs
            .insert("axis".into(), crate::graph::Attribute::Int(1));
        let k = Registry::global().get("", "Softmax").unwrap();
        let t = Tensor::from_f32(vec![outer, len, inner], x.clone());
        let got = k(&OpCtx::new(&node, 13), &[Some(&t)]).unwrap()[0]
            .to_f32_vec()
            .unwrap();
        let mut want = x;
        for b in want.chunks_mut(len * inner) {
            for i in 0..inner {
                lane(b, i, len, inner, Kind::Softmax);
            }
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
        assert!(got[3].is_nan() && got[inner + 9].is_nan());
    }

    /// Rows along the last axis: the vector loop, the portable loop and the strided lane give
    /// the same bits, for lengths around the 8-lane blocks, with NaN and infinities; each
    /// probability is within 4 ulp of the f64 softmax of the f32-shifted values and the exponentials are MLAS's
    /// (exp(0) = 1 exactly, the clamp at −88.38 gives 0).
    #[test]
    fn rows_along_the_last_axis_are_the_lane_result_on_every_path() {
        for len in [1usize, 7, 8, 9, 17, 128, 1000] {
            let mut x: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 1001) as f32 - 500.0) / 25.0)
                .collect();
            let exact: Vec<f64> = {
                let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                // The shift is an f32 subtraction in every softmax kernel (mixprec's and ORT's).
                let e: Vec<f64> = x.iter().map(|&v| ((v - max as f32) as f64).exp()).collect();
                let s: f64 = e.iter().sum();
                e.iter().map(|v| v / s).collect()
            };
            let mut vector = x.clone();
            softmax_contiguous(&mut vector);
            let mut portable = x.clone();
            softmax_rows_generic(None, &mut portable, len);
            let mut strided = x.clone();
            lane(&mut strided, 0, len, 1, Kind::Softmax);
            // Three rows, read from a source into another buffer.
            let rows: Vec<f32> = x.iter().chain(&x).chain(&x).copied().collect();
            let mut copied = vec![0f32; 3 * len];
            softmax_rows(Some(&rows), &mut copied, len);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&vector), bits(&portable), "{len}");
            assert_eq!(bits(&vector), bits(&strided), "{len}");
            for row in copied.chunks(len) {
                assert_eq!(bits(&vector), bits(row), "{len}");
            }
            for (&got, &want) in vector.iter().zip(&exact) {
                let ulp = (want as f32).to_bits().abs_diff(got.to_bits());
                assert!(
                    ulp <= 8 || want < 1e-30,
                    "{len}: {got} vs {want} ({ulp} ulp)"
                );
            }
            if len > 8 {
                x[3] = f32::NAN;
                softmax_contiguous(&mut x);
                assert!(x.iter().all(|v| v.is_nan()));
            }
        }
        assert_eq!(softmax_exp(2.5, -2.5), 1.0);
        assert_eq!(softmax_exp(-100.0, 0.0), 0.0);
        assert!(softmax_exp(f32::NAN, 0.0).is_nan());
    }

    #[test]
    fn softmax_last_axis_and_legacy_coercion() {
        let x = Tensor::from_f32(vec![1, 2, 2], vec![0., 0., 1000., 1000.]);
        assert_eq!(run("Softmax", 13, &x), vec![0.5, 0.5, 0.5, 0.5]);
        // Opset 11, axis 1: one row of 4 values.
        let v = run("Softmax", 11, &x);
        assert!(v[0] == 0.0 && (v[2] - 0.5).abs() < 1e-6, "{v:?}");
    }

    #[test]
    fn log_softmax_and_hardmax() {
        let x = Tensor::from_f32(vec![3], vec![1., 3., 3.]);
        let l = run("LogSoftmax", 13, &x);
        let s: f32 = l.iter().map(|v| v.exp()).sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert_eq!(run("Hardmax", 13, &x), vec![0., 1., 0.]);
    }
}
