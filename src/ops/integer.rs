//! Integer convolution and the integer accumulation kernel: ConvInteger, and the exact i32
//! products MatMulInteger (`ops/qlinear.rs`) and the fused Q/DQ kernels of `--fusion tensorrt`
//! (`exec/qdq.rs`) share.
//!
//! Operands are 8-bit (or 4-bit) codes minus their zero points, held as i32; their products
//! are summed in an i32 accumulator, as int8 tensor cores and DP4A accumulate: exactly, with no
//! rounding at any size (an f32 running sum of such products is exact only while the partial
//! sums stay below 2^24). The accumulator wraps on overflow (two's complement, as the
//! hardware's does), which needs more than 2^31 / 255² ≈ 33,000 products of extreme uint8
//! codes in one sum.
//!
//! - `ConvInteger(x, w, x_zero_point?, w_zero_point?)`: `y = conv(x − x_zp, w − w_zp)` as
//!   int32; x and w are uint8 or int8, `x_zero_point` one value, `w_zero_point` one value or
//!   one per output channel. Padding reads the zero point (0 after the shift), as the ONNX
//!   reference pads `x − x_zp` with zeros. Attributes: Conv's (`ConvAttrs`).

use super::attrs::boxed;
use super::conv::{col2im, im2col, transpose_geometry, window, ConvAttrs};
use super::prepacked::tag::FLOAT_WEIGHTS;
use super::util::{broadcast_strides, input, opt_input};
use super::{OpCtx, OpError, OpResult, Registry};
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    r.add("ConvInteger", conv_integer_op);
    use super::InputRole::{Bias, Data, Scale, ZeroPoint};
    r.def_mut("ConvInteger")
        .parse(|n, _| boxed(ConvAttrs::parse_node(n)))
        .roles(&[Data, Data, ZeroPoint, ZeroPoint])
        .infer(|ctx, ins| {
            let mut out = super::shape::infer_as("Conv", ctx, ins, [0, 1])?;
            out[0].dtype = Some(DType::I32);
            Ok(out)
        });
    r.add("QLinearConv", qlinear_conv)
        .parse(|n, _| boxed(ConvAttrs::parse_node(n)))
        .roles(&[
            Data, Scale, ZeroPoint, Data, Scale, ZeroPoint, Scale, ZeroPoint, Bias,
        ])
        .infer(|ctx, ins| {
            let mut out = super::shape::infer_as("Conv", ctx, ins, [0, 3])?;
            out[0].dtype = super::shape::opt_fact(ins, 7)
                .or(super::shape::opt_fact(ins, 0))
                .and_then(|f| f.dtype);
            Ok(out)
        });
}

/// Work (m·n·k) from which [`igemm`] takes the f32 product when it is exact: below it the
/// conversions cost more than they save.
const F32_PRODUCT_WORK: usize = 1 << 12;

/// `c[m, n] = Σ_k a[m, k] · b[k, n]` (row-major), summed exactly in i32 (wrapping on overflow,
/// as a hardware i32 accumulator). `c` is overwritten.
pub fn igemm(m: usize, n: usize, k: usize, a: &[i32], b: &[i32], c: &mut [i32]) {
    if m * n * k >= F32_PRODUCT_WORK && exact_in_f32(m, n, k, a, b) {
        // Every partial sum is an integer below 2^24 in magnitude, which f32 holds exactly: the
        // f32 product (the MatMul kernel, in whatever order it sums) is the i32 sum itself, and
        // no i32 sum can wrap.
        let to_f32 = |v: &[i32]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        let (af, bf) = (to_f32(&a[..m * k]), to_f32(&b[..k * n]));
        let mut cf = vec![0f32; m * n];
        super::matmul::sgemm(
            crate::numeric::Accumulator::F32,
            m,
            n,
            k,
            &af,
            false,
            &bf,
            false,
            &mut cf,
            false,
        );
        for (d, &v) in c[..m * n].iter_mut().zip(&cf) {
            *d = v as i32;
        }
        return;
    }
    if n < 16 {
        // Few columns (a convolution over a handful of positions): dot products of A's rows
        // with B's columns, which vectorize along k. Wrapping i32 sums are exact in any order.
        let mut bt = vec![0i32; n * k];
        for (p, br) in b[..k * n].chunks_exact(n.max(1)).enumerate() {
            for (j, &v) in br.iter().enumerate() {
                bt[j * k + p] = v;
            }
        }
        let row = |(i, dst): (usize, &mut [i32])| {
            let ar = &a[i * k..(i + 1) * k];
            for (j, d) in dst.iter_mut().enumerate() {
                *d = idot(ar, &bt[j * k..(j + 1) * k]);
            }
        };
        if m * n * k >= 1 << 16 && m > 1 {
            c[..m * n]
                .par_chunks_mut(n.max(1))
                .enumerate()
                .for_each(row);
        } else {
            c[..m * n].chunks_mut(n.max(1)).enumerate().for_each(row);
        }
        return;
    }
    let row = |(i, dst): (usize, &mut [i32])| igemm_row(&a[i * k..(i + 1) * k], b, n, dst);
    if m * n * k >= 1 << 16 && m > 1 {
        c[..m * n].par_chunks_mut(n).enumerate().for_each(row);
    } else {
        c[..m * n].chunks_mut(n).enumerate().for_each(row);
    }
}

/// Whether every partial sum of `a · b` (in any order) is at most 2^24 in magnitude: the
/// largest row sum of |a| times the largest |b| bounds them all.
fn exact_in_f32(m: usize, n: usize, k: usize, a: &[i32], b: &[i32]) -> bool {
    let max_b = b[..k * n]
        .iter()
        .map(|v| v.unsigned_abs() as u64)
        .max()
        .unwrap_or(0);
    let max_row = a[..m * k]
        .chunks(k.max(1))
        .map(|r| r.iter().map(|v| v.unsigned_abs() as u64).sum::<u64>())
        .max()
        .unwrap_or(0);
    max_row.saturating_mul(max_b) <= 1 << 24
}

/// One row of [`igemm`]: `dst = Σ_p ar[p] · b[p, ..]`, compiled for AVX2 where the CPU has it
/// (8 lanes of 32-bit multiplies; the baseline target has no packed 32-bit multiply, and
/// integer arithmetic gives the same values either way).
fn igemm_row(ar: &[i32], b: &[i32], n: usize, dst: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { igemm_row_avx2(ar, b, n, dst) };
    }
    igemm_row_generic(ar, b, n, dst)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn igemm_row_avx2(ar: &[i32], b: &[i32], n: usize, dst: &mut [i32]) {
    igemm_row_generic(ar, b, n, dst)
}

/// `Σ a[p]·b[p]` wrapping in i32, compiled for AVX2 where the CPU has it.
fn idot(a: &[i32], b: &[i32]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { idot_avx2(a, b) };
    }
    idot_generic(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn idot_avx2(a: &[i32], b: &[i32]) -> i32 {
    idot_generic(a, b)
}

/// Eight lanes of partial sums (the compiler keeps them in one vector), added at the end.
#[inline(always)]
fn idot_generic(a: &[i32], b: &[i32]) -> i32 {
    let mut acc = [0i32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] = acc[l].wrapping_add(x[l].wrapping_mul(y[l]));
        }
    }
    let tail = ra
        .iter()
        .zip(rb)
        .fold(0i32, |s, (&x, &y)| s.wrapping_add(x.wrapping_mul(y)));
    acc.iter().fold(tail, |s, &v| s.wrapping_add(v))
}

#[inline(always)]
fn igemm_row_generic(ar: &[i32], b: &[i32], n: usize, dst: &mut [i32]) {
    dst.fill(0);
    for (p, &x) in ar.iter().enumerate() {
        if x == 0 {
            continue;
        }
        let br = &b[p * n..(p + 1) * n];
        for (d, &y) in dst.iter_mut().zip(br) {
            *d = d.wrapping_add(x.wrapping_mul(y));
        }
    }
}

/// numpy-style matmul of integer codes (1-D operands promoted and the added axis dropped,
/// batch axes broadcast), summed exactly in i32: the values and the output shape.
pub fn imatmul(
    a: &[i32],
    a_shape: &[usize],
    b: &[i32],
    b_shape: &[usize],
) -> Result<(Vec<i32>, Vec<usize>), OpError> {
    let super::matmul::MatMulDims {
        m,
        k,
        n,
        a1,
        b1,
        batch,
        batch_a,
        batch_b,
    } = super::matmul::matmul_dims(a_shape, b_shape)?;
    let (batch_a, batch_b) = (batch_a.as_slice(), batch_b.as_slice());
    let nb: usize = batch.iter().product();
    let sa = broadcast_strides(batch_a, &batch);
    let sb = broadcast_strides(batch_b, &batch);
    let mut out = vec![0i32; nb * m * n];
    for (i, dst) in out.chunks_mut((m * n).max(1)).enumerate().take(nb) {
        let (mut oa, mut ob, mut rem) = (0, 0, i);
        for d in (0..batch.len()).rev() {
            let idx = rem % batch[d];
            rem /= batch[d];
            oa += idx * sa[d];
            ob += idx * sb[d];
        }
        igemm(m, n, k, &a[oa * m * k..], &b[ob * k * n..], dst);
    }
    let mut shape = batch;
    if !a1 {
        shape.push(m);
    }
    if !b1 {
        shape.push(n);
    }
    Ok((out, shape))
}

/// Conv of integer codes (`x` [N, C, *in], `w` [M, C/group, *k]) summed exactly in i32; the
/// padding reads 0 (the zero point, once the codes are shifted). Values and output shape.
pub fn iconv(
    attrs: &ConvAttrs,
    x: &[i32],
    x_shape: &[usize],
    w: &[i32],
    w_shape: &[usize],
) -> Result<(Vec<i32>, Vec<usize>), OpError> {
    if x_shape.len() < 3 || w_shape.len() != x_shape.len() {
        return Err(OpError(format!(
            "X {x_shape:?} and W {w_shape:?} must have the same rank >= 3"
        )));
    }
    let group = attrs.group;
    let (n, c) = (x_shape[0], x_shape[1]);
    let in_sp = &x_shape[2..];
    let (m, cg) = (w_shape[0], w_shape[1]);
    let kernel: Vec<usize> = match &attrs.window.kernel_shape {
        Some(k) => k.clone(),
        None => w_shape[2..].to_vec(),
    };
    if kernel.as_slice() != &w_shape[2..] {
        return Err(OpError(format!(
            "kernel_shape {kernel:?} does not match W {w_shape:?}"
        )));
    }
    if c != cg * group || m % group != 0 {
        return Err(OpError(format!(
            "channels do not fit groups: X has {c} channels, W {w_shape:?}, group {group}"
        )));
    }
    let win = window(&attrs.window, in_sp, &kernel, false)?;
    let k_sz: usize = kernel.iter().product();
    let o_sz: usize = win.out.iter().product();
    let in_sz: usize = in_sp.iter().product();
    let mg = m / group;
    let rows = cg * k_sz;
    let mut out = vec![0i32; n * m * o_sz];
    let mut col = vec![0i32; rows * o_sz];
    for b in 0..n {
        for g in 0..group {
            let xg = &x[(b * c + g * cg) * in_sz..(b * c + (g + 1) * cg) * in_sz];
            let wg = &w[g * mg * rows..(g + 1) * mg * rows];
            let dst = &mut out[(b * m + g * mg) * o_sz..(b * m + (g + 1) * mg) * o_sz];
            im2col(xg, in_sp, &win, &mut col);
            igemm(mg, o_sz, rows, wg, &col, dst);
        }
    }
    let mut shape = vec![n, m];
    shape.extend(&win.out);
    Ok((out, shape))
}

/// ConvTranspose of integer codes (`x` [N, C, *in], `w` [C, M/group, *k]) summed exactly in
/// i32. Values and output shape.
pub fn iconv_transpose(
    attrs: &ConvAttrs,
    x: &[i32],
    x_shape: &[usize],
    w: &[i32],
    w_shape: &[usize],
) -> Result<(Vec<i32>, Vec<usize>), OpError> {
    if x_shape.len() < 3 || w_shape.len() != x_shape.len() {
        return Err(OpError(format!(
            "X {x_shape:?} and W {w_shape:?} must have the same rank >= 3"
        )));
    }
    let group = attrs.group;
    let (n, c) = (x_shape[0], x_shape[1]);
    let in_sp = x_shape[2..].to_vec();
    if w_shape[0] != c || c % group != 0 {
        return Err(OpError(format!(
            "W {w_shape:?} does not fit X {x_shape:?} with group {group}"
        )));
    }
    let mg = w_shape[1];
    let m = mg * group;
    let cg = c / group;
    let kernel: Vec<usize> = w_shape[2..].to_vec();
    let geo = transpose_geometry(attrs, &in_sp, &kernel)?;
    let k_sz: usize = kernel.iter().product();
    let in_sz: usize = in_sp.iter().product();
    let o_sz: usize = geo.out.iter().product();
    let rows = mg * k_sz;
    let mut out = vec![0i32; n * m * o_sz];
    let mut col = vec![0i32; rows * in_sz];
    let mut wt = vec![0i32; rows * cg];
    for b in 0..n {
        for g in 0..group {
            let xg = &x[(b * c + g * cg) * in_sz..(b * c + (g + 1) * cg) * in_sz];
            let wg = &w[g * cg * rows..(g + 1) * cg * rows];
            // col[mg·k, in] = Wg^T [mg·k, cg] × Xg [cg, in]
            for (ci, wrow) in wg.chunks(rows).enumerate() {
                for (r, &v) in wrow.iter().enumerate() {
                    wt[r * cg + ci] = v;
                }
            }
            igemm(rows, in_sz, cg, &wt, xg, &mut col);
            let dst = &mut out[(b * m + g * mg) * o_sz..(b * m + (g + 1) * mg) * o_sz];
            col2im(
                &col,
                &in_sp,
                &kernel,
                &geo.strides,
                &geo.dilations,
                &geo.pad_begin,
                &geo.out,
                dst,
                None,
            );
        }
    }
    let mut shape = vec![n, m];
    shape.extend(&geo.out);
    Ok((out, shape))
}

/// The codes of a uint8/int8 tensor `t` and of its zero point, as i32 (no i64 copy: a
/// weight's codes may be converted on every run), checking that both are codes of one type.
pub(crate) fn codes_and_zero_point(
    t: &Tensor,
    zp: Option<&Tensor>,
    what: &str,
) -> Result<(Vec<i32>, Option<Vec<i32>>), OpError> {
    let as_i32 = |t: &Tensor| -> Option<Vec<i32>> {
        match t.data() {
            crate::tensor::TensorData::U8(c) => Some(c.iter().map(|&x| i32::from(x)).collect()),
            crate::tensor::TensorData::I8(c) => Some(c.iter().map(|&x| i32::from(x)).collect()),
            _ => None,
        }
    };
    let Some(v) = as_i32(t) else {
        return Err(OpError(format!(
            "{what} has dtype {}, expected uint8 or int8",
            t.dtype()
        )));
    };
    let Some(z) = zp else { return Ok((v, None)) };
    if z.dtype() != t.dtype() {
        return Err(OpError(format!(
            "the zero point of {what} has dtype {} but {what} has dtype {}: they must match",
            z.dtype(),
            t.dtype()
        )));
    }
    Ok((v, as_i32(z)))
}

/// The codes of a uint8/int8 tensor minus its zero point (one value, or one per slice along
/// `axis` when `per_axis` allows it), as i32.
fn shifted_codes(
    t: &Tensor,
    zp: Option<&Tensor>,
    what: &str,
    per_axis: Option<usize>,
) -> Result<Vec<i32>, OpError> {
    let (mut v, zv) = codes_and_zero_point(t, zp, what)?;
    let (Some(z), Some(zv)) = (zp, zv) else {
        return Ok(v);
    };
    if zv.len() == 1 && z.rank() <= 1 {
        v.iter_mut().for_each(|x| *x -= zv[0]);
        return Ok(v);
    }
    match per_axis {
        Some(axis) if z.rank() == 1 && t.rank() > axis && t.shape()[axis] == zv.len() => {
            let inner: usize = t.shape()[axis + 1..].iter().product();
            for (i, x) in v.iter_mut().enumerate() {
                *x -= zv[(i / inner.max(1)) % zv.len()];
            }
            Ok(v)
        }
        _ => Err(OpError(format!(
            "the zero point of {what} has shape {:?}, expected one value{}",
            z.shape(),
            if per_axis.is_some() {
                " or one per output channel"
            } else {
                ""
            }
        ))),
    }
}

/// A convolution's weight codes minus their zero points as f32 (exact: they are integers of
/// at most 510 in magnitude), and the largest sum of their magnitudes over one output channel.
pub(crate) struct FloatWeights {
    pub w: Tensor,
    max_channel_sum: u64,
}

impl FloatWeights {
    /// The shifted codes `codes` of a weight of `shape` ([M, ...]: output channel first).
    pub(crate) fn new(codes: &[i32], shape: &[usize]) -> FloatWeights {
        let per_channel = shape.iter().skip(1).product::<usize>().max(1);
        let max_channel_sum = codes
            .chunks(per_channel)
            .map(|c| c.iter().map(|v| v.unsigned_abs() as u64).sum::<u64>())
            .max()
            .unwrap_or(0);
        let w = Tensor::from_f32(shape.to_vec(), codes.iter().map(|&v| v as f32).collect());
        FloatWeights { w, max_channel_sum }
    }

    /// Whether the float32 convolution of integer activations of magnitude at most `max_x` by
    /// these weights is exact: every partial sum of an output, in any order, is bounded by
    /// `max_x` times its channel's sum of |w|, and f32 holds integers up to 2^24 exactly, so
    /// the f32 sums are the i32 sums.
    pub(crate) fn exact_with(&self, max_x: u64) -> bool {
        max_x.saturating_mul(self.max_channel_sum) <= 1 << 24
    }

    /// The codes as i32 again (for [`iconv`], where the f32 product is not exact).
    fn ints(&self) -> Vec<i32> {
        let w = self.w.as_f32().expect("f32");
        w.iter().map(|&v| v as i32).collect()
    }
}

/// The integer convolution of the shifted codes `xv` (of `x`) by the weight codes at input
/// `wi` less the zero point at input `zi`, exactly in i32: through the float32 convolution
/// kernel (its packed panels kept with a constant weight) where that is exact
/// ([`FloatWeights::exact_with`]), through [`iconv`] otherwise. Values and output shape.
fn iconv_op(
    ctx: &OpCtx,
    attrs: &ConvAttrs,
    inputs: &[Option<&Tensor>],
    xv: &[i32],
    x_shape: &[usize],
    (wi, zi): (usize, usize),
) -> Result<(Vec<i32>, Vec<usize>), OpError> {
    let w = input(inputs, wi)?;
    let wz = opt_input(inputs, zi);
    if ctx.accumulate != crate::numeric::Accumulator::F32 {
        let wv = shifted_codes(w, wz, "w", Some(0))?;
        return iconv(attrs, xv, x_shape, &wv, w.shape());
    }
    // Kept with the weight only while the zero point is constant too.
    let keep = ctx
        .prepacked(wi)
        .filter(|_| wz.is_none() || ctx.prepacked(zi).is_some());
    let make = || -> Result<FloatWeights, OpError> {
        Ok(FloatWeights::new(
            &shifted_codes(w, wz, "w", Some(0))?,
            w.shape(),
        ))
    };
    let fw = match keep {
        Some(kept) => kept.get_or_try_insert(FLOAT_WEIGHTS, make)?,
        None => std::sync::Arc::new(make()?),
    };
    let max_x = xv
        .iter()
        .map(|v| v.unsigned_abs() as u64)
        .max()
        .unwrap_or(0);
    if !fw.exact_with(max_x) {
        return iconv(attrs, xv, x_shape, &fw.ints(), w.shape());
    }
    let x = Tensor::from_f32(x_shape.to_vec(), xv.iter().map(|&v| v as f32).collect());
    let y = super::conv::conv(ctx, attrs, &x, &fw.w, None, None, None, keep)?;
    let out = y.as_f32().expect("f32").iter().map(|&v| v as i32).collect();
    Ok((out, y.shape().to_vec()))
}

fn conv_integer_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let xv = shifted_codes(x, opt_input(inputs, 2), "x", None)?;
    let attrs = ctx.attrs::<ConvAttrs>()?;
    let (out, shape) = iconv_op(ctx, attrs, inputs, &xv, x.shape(), (1, 3))?;
    Ok(vec![Tensor::from_parts(
        shape,
        crate::tensor::TensorData::I32(out.into()),
    )])
}

/// QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B?): the integer
/// convolution of the shifted codes (exact in i32) plus the int32 bias, requantized as ONNX
/// Runtime's kernel does (MlasRequantizeOutput): `acc · (x_scale·w_scale[m] / y_scale)` in
/// f32, clamped to the code range less `y_zp` (NaN to the lower bound), rounded half to even,
/// plus `y_zp`. `w_scale` and `w_zp` may be per output channel.
fn qlinear_conv(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    use super::contrib::qlinear::CodeType;
    let x = input(inputs, 0)?;
    let xv = shifted_codes(x, opt_input(inputs, 2), "x", None)?;
    let attrs = ctx.attrs::<ConvAttrs>()?;
    let (mut acc, shape) = iconv_op(ctx, attrs, inputs, &xv, x.shape(), (3, 5))?;
    let m = shape[1];
    let per_channel = |i: usize, what: &str| -> Result<Vec<f32>, OpError> {
        let t = input(inputs, i)?;
        let v = t
            .as_f32()
            .ok_or_else(|| OpError(format!("{what} has dtype {}, expected float32", t.dtype())))?;
        if v.len() != 1 && v.len() != m {
            return Err(OpError(format!(
                "{what} has {} values, expected 1 or one per output channel ({m})",
                v.len()
            )));
        }
        Ok(v.to_vec())
    };
    let (xs, ws, ys) = (
        per_channel(1, "x_scale")?,
        per_channel(4, "w_scale")?,
        per_channel(6, "y_scale")?,
    );
    if xs.len() != 1 || ys.len() != 1 {
        return Err(OpError(
            "x_scale and y_scale must be one value each (per tensor)".into(),
        ));
    }
    let yzp = opt_input(inputs, 7);
    let ct = CodeType::of(yzp.unwrap_or(x), "y_zero_point")?;
    let yz = match yzp {
        Some(z) if z.len() == 1 => super::contrib::qlinear::codes(z)[0],
        Some(z) => {
            return Err(OpError(format!(
                "y_zero_point has shape {:?}, expected one value",
                z.shape()
            )))
        }
        None => 0,
    };
    let plane = acc.len() / (shape[0] * m).max(1);
    if let Some(b) = opt_input(inputs, 8) {
        let bv = match (b.dtype(), b.to_i64_vec()) {
            (DType::I32, Some(v)) if v.len() == m => v,
            _ => {
                return Err(OpError(format!(
                    "B is {} {:?}, expected int32 [{m}]",
                    b.dtype(),
                    b.shape()
                )))
            }
        };
        for (i, a) in acc.iter_mut().enumerate() {
            *a = a.wrapping_add(bv[(i / plane) % m] as i32);
        }
    }
    let scales: Vec<f32> = (0..m)
        .map(|c| xs[0] * ws[if ws.len() == 1 { 0 } else { c }] / ys[0])
        .collect();
    let out = acc
        .iter()
        .enumerate()
        .map(|(i, &a)| ct.quantize(a as f32 * scales[(i / plane) % m], yz))
        .collect();
    Ok(vec![ct.tensor(shape, out)])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A deterministic pseudo-random stream of codes in [lo, hi].
    pub(crate) fn codes(n: usize, seed: u64, lo: i32, hi: i32) -> Vec<i32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                lo + ((s >> 33) % (hi - lo + 1) as u64) as i32
            })
            .collect()
    }

    /// ConvInteger through the float32 convolution (codes within the f32 bound) and through
    /// the i32 one (beyond it) is the i32 convolution of the shifted codes: 1-D and 2-D,
    /// strides, pads, groups, per-channel zero points, a kept weight on a second run.
    #[test]
    fn conv_integer_through_f32_is_the_integer_convolution() {
        use crate::graph::testing::node;
        use crate::graph::Attribute;
        use crate::ops::prepacked::Prepacked;
        use crate::tensor::TensorData;
        let u8s = |shape: Vec<usize>, v: Vec<i32>| {
            Tensor::from_parts(shape, TensorData::U8(v.iter().map(|&x| x as u8).collect()))
        };
        // x shape, w shape, strides, pads, group, weight codes' range, f32 path.
        type Case<'a> = (
            &'a [usize],
            &'a [usize],
            &'a [i64],
            &'a [i64],
            i64,
            (i32, i32),
            bool,
        );
        let cases: [Case; 4] = [
            (
                &[2, 1, 600],
                &[6, 1, 256],
                &[128],
                &[0, 0],
                1,
                (0, 255),
                true,
            ),
            (
                &[1, 6, 9, 7],
                &[4, 3, 3, 3],
                &[2, 1],
                &[1, 1, 0, 1],
                2,
                (0, 255),
                true,
            ),
            (&[1, 5, 11], &[7, 5, 3], &[1], &[1, 1], 1, (120, 136), true),
            // 4096 taps of codes far from their zero points: partial sums beyond 2^24.
            (
                &[1, 1, 4100],
                &[2, 1, 4096],
                &[1],
                &[0, 0],
                1,
                (250, 255),
                false,
            ),
        ];
        for (i, (xs, ws, strides, pads, group, (lo, hi), f32_path)) in cases.into_iter().enumerate()
        {
            let mut n = node("conv", "ConvInteger", &["x", "w", "xz", "wz"], &["y"]);
            n.attrs
                .insert("strides".into(), Attribute::Ints(strides.to_vec()));
            n.attrs
                .insert("pads".into(), Attribute::Ints(pads.to_vec()));
            n.attrs.insert("group".into(), Attribute::Int(group));
            let kept: Vec<Prepacked> = (0..4).map(|_| Prepacked::default()).collect();
            let kept: Vec<Option<&Prepacked>> = kept.iter().map(Some).collect();
            let mut ctx = OpCtx::new(&n, 10);
            ctx.prepacked = &kept;
            let xn: usize = xs.iter().product();
            let wn: usize = ws.iter().product();
            let x = u8s(xs.to_vec(), codes(xn, 31 + i as u64, 0, 255));
            let w = u8s(ws.to_vec(), codes(wn, 37 + i as u64, lo, hi));
            let xz = u8s(vec![], vec![3]);
            let wz = u8s(vec![ws[0]], codes(ws[0], 41, 0, 9));
            let ins = [Some(&x), Some(&w), Some(&xz), Some(&wz)];
            let xv = shifted_codes(&x, Some(&xz), "x", None).unwrap();
            let wv = shifted_codes(&w, Some(&wz), "w", Some(0)).unwrap();
            let max_sum = wv
                .chunks(wn / ws[0])
                .map(|c| c.iter().map(|v| v.unsigned_abs() as u64).sum::<u64>())
                .max()
                .unwrap();
            assert_eq!(max_sum * 252 <= 1 << 24, f32_path, "case {i}");
            let attrs = ctx.attrs::<ConvAttrs>().unwrap();
            let (want, shape) = iconv(attrs, &xv, xs, &wv, ws).unwrap();
            for run in 0..2 {
                let y = conv_integer_op(&ctx, &ins).unwrap();
                assert_eq!(y[0].shape(), &shape[..], "case {i}");
                let got: Vec<i32> = y[0]
                    .to_i64_vec()
                    .unwrap()
                    .iter()
                    .map(|&v| v as i32)
                    .collect();
                assert_eq!(got, want, "case {i} run {run}");
            }
        }
    }

    /// Entry (i, j) of a[m×k]·b[k×n], summed in i64.
    fn exact_entry(a: &[i32], b: &[i32], (n, k): (usize, usize), (i, j): (usize, usize)) -> i64 {
        (0..k)
            .map(|p| a[i * k + p] as i64 * b[p * n + j] as i64)
            .sum()
    }

    #[test]
    fn igemm_is_exact_beyond_two_to_the_24_where_f32_rounds() {
        // 4096 products of magnitude up to 127·128: partial sums far beyond 2^24.
        let (m, n, k) = (3, 5, 4096);
        let mut a = codes(m * k, 1, 100, 127);
        let b = codes(k * n, 2, -128, -100);
        a[7] = -128;
        let mut c = vec![0i32; m * n];
        igemm(m, n, k, &a, &b, &mut c);
        let mut f32_differs = false;
        for i in 0..m {
            for j in 0..n {
                let exact = exact_entry(&a, &b, (n, k), (i, j));
                assert!(exact.abs() > 1 << 24, "the test must reach beyond 2^24");
                assert_eq!(c[i * n + j] as i64, exact, "row {i} col {j}");
                let f: f32 = (0..k)
                    .map(|p| a[i * k + p] as f32 * b[p * n + j] as f32)
                    .sum();
                f32_differs |= f as f64 != exact as f64;
            }
        }
        assert!(f32_differs, "an f32 running sum rounds some of these sums");
    }

    /// Products whose partial sums stay within 2^24 run through the f32 MatMul kernel, the
    /// others in i32: both give the exact sum, right at the bound and just beyond it (where an
    /// f32 product would round: a bound set too high fails here).
    #[test]
    fn igemm_is_exact_on_both_sides_of_the_f32_bound() {
        for (m, n, k, lo, hi, f32_path) in [
            // Row sums of |a| up to 256·255, |b| up to 255: 16,646,400 ≤ 2^24.
            (8, 64, 256, 251, 255, true),
            (5, 33, 256, -255, 255, true),
            // 1024 products of ~253·255: sums near 2^26, beyond what f32 holds exactly.
            (2, 64, 1024, 251, 255, false),
        ] {
            let a = codes(m * k, 21, lo, hi);
            let b = codes(k * n, 22, lo, hi);
            assert_eq!(exact_in_f32(m, n, k, &a, &b), f32_path, "{m}x{n}x{k}");
            let mut c = vec![0i32; m * n];
            igemm(m, n, k, &a, &b, &mut c);
            let mut f32_rounds = false;
            for i in 0..m {
                for j in 0..n {
                    let exact = exact_entry(&a, &b, (n, k), (i, j));
                    assert_eq!(c[i * n + j] as i64, exact, "{m}x{n}x{k} row {i} col {j}");
                    f32_rounds |= exact as f32 as i64 != exact;
                }
            }
            assert_eq!(f32_rounds, !f32_path, "{m}x{n}x{k}");
        }
    }

    #[test]
    fn imatmul_broadcasts_batches_and_matches_an_i64_reference() {
        let a = codes(2 * 3 * 4, 3, -128, 127);
        let b = codes(4 * 2, 4, -128, 127);
        let (c, shape) = imatmul(&a, &[2, 3, 4], &b, &[4, 2]).unwrap();
        assert_eq!(shape, vec![2, 3, 2]);
        for bi in 0..2 {
            for i in 0..3 {
                for j in 0..2 {
                    let r: i64 = (0..4)
                        .map(|p| a[bi * 12 + i * 4 + p] as i64 * b[p * 2 + j] as i64)
                        .sum();
                    assert_eq!(c[bi * 6 + i * 2 + j] as i64, r);
                }
            }
        }
        // 1-D operands drop their axis.
        let (c, shape) = imatmul(&[1, 2, 3], &[3], &[4, 5, 6], &[3]).unwrap();
        assert_eq!((c, shape), (vec![32], vec![]));
        assert!(imatmul(&[1, 2], &[2], &[1, 2, 3], &[3]).is_err());
    }

    /// Both orientations of the integer product (rows of axpys; dot products for fewer than
    /// 16 columns) give the wrapping i32 sum of a direct triple loop, overflow included.
    #[test]
    fn igemm_is_the_wrapping_sum_in_both_orientations() {
        for (m, n, k) in [
            (3, 1, 5),
            (5, 4, 37),
            (2, 15, 9),
            (4, 16, 33),
            (3, 17, 260),
            (300, 4, 260),
        ] {
            let a = codes(m * k, 7, -255, 255);
            let mut b = codes(k * n, 11, -255, 255);
            // Values whose products overflow i32: the sums wrap as a hardware accumulator.
            b[0] = i32::MAX / 3;
            let mut want = vec![0i32; m * n];
            for i in 0..m {
                for j in 0..n {
                    for p in 0..k {
                        want[i * n + j] =
                            want[i * n + j].wrapping_add(a[i * k + p].wrapping_mul(b[p * n + j]));
                    }
                }
            }
            let mut got = vec![7i32; m * n];
            igemm(m, n, k, &a, &b, &mut got);
            assert_eq!(got, want, "{m}x{n}x{k}");
        }
    }

    #[test]
    fn iconv_pads_with_the_zero_point_and_matches_a_direct_sum() {
        // 1x1x3x3 image, 1x1x2x2 kernel, pads 1: every output is a direct sum over the taps
        // inside the image.
        let attrs = ConvAttrs {
            window: super::super::conv::WindowAttrs {
                kernel_shape: None,
                strides: None,
                dilations: None,
                pads: Some(vec![1, 1, 1, 1]),
                auto_pad: super::super::conv::AutoPad::NotSet,
            },
            group: 1,
            output_padding: None,
            output_shape: None,
        };
        let x: Vec<i32> = (1..=9).collect();
        let w = vec![1, -2, 3, 100];
        let (y, shape) = iconv(&attrs, &x, &[1, 1, 3, 3], &w, &[1, 1, 2, 2]).unwrap();
        assert_eq!(shape, vec![1, 1, 4, 4]);
        for oh in 0..4i32 {
            for ow in 0..4i32 {
                let mut r = 0;
                for kh in 0..2 {
                    for kw in 0..2 {
                        let (ih, iw) = (oh + kh - 1, ow + kw - 1);
                        if (0..3).contains(&ih) && (0..3).contains(&iw) {
                            r += x[(ih * 3 + iw) as usize] * w[(kh * 2 + kw) as usize];
                        }
                    }
                }
                assert_eq!(y[(oh * 4 + ow) as usize], r, "({oh}, {ow})");
            }
        }
    }

    #[test]
    fn iconv_transpose_matches_the_float_kernel_on_small_codes() {
        let attrs = ConvAttrs {
            window: super::super::conv::WindowAttrs {
                kernel_shape: None,
                strides: Some(vec![2, 2]),
                dilations: None,
                pads: None,
                auto_pad: super::super::conv::AutoPad::NotSet,
            },
            group: 1,
            output_padding: None,
            output_shape: None,
        };
        let x = codes(2 * 3 * 3, 5, -20, 20);
        let w = codes(2 * 2 * 3 * 3, 6, -20, 20);
        let (y, shape) = iconv_transpose(&attrs, &x, &[1, 2, 3, 3], &w, &[2, 2, 3, 3]).unwrap();
        assert_eq!(shape, vec![1, 2, 7, 7]);
        // Direct definition: y[m, i·s + k] += x[c, i] · w[c, m, k].
        let mut r = vec![0i32; 2 * 49];
        for ci in 0..2 {
            for m in 0..2 {
                for ih in 0..3 {
                    for iw in 0..3 {
                        for kh in 0..3 {
                            for kw in 0..3 {
                                let (oh, ow) = (ih * 2 + kh, iw * 2 + kw);
                                r[m * 49 + oh * 7 + ow] +=
                                    x[ci * 9 + ih * 3 + iw] * w[((ci * 2 + m) * 3 + kh) * 3 + kw];
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(y, r);
    }

    #[test]
    fn conv_integer_rejects_mismatched_zero_points() {
        use crate::graph::testing::node;
        use crate::tensor::TensorData;
        let n = node("conv", "ConvInteger", &["x", "w", "xz"], &["y"]);
        let ctx = OpCtx::new(&n, 10);
        let x = Tensor::from_parts(vec![1, 1, 2, 2], TensorData::U8(vec![1, 2, 3, 4].into()));
        let w = Tensor::from_parts(vec![1, 1, 1, 1], TensorData::U8(vec![2].into()));
        let xz = Tensor::from_parts(vec![], TensorData::I8(vec![1].into()));
        let e = conv_integer_op(&ctx, &[Some(&x), Some(&w), Some(&xz)]).unwrap_err();
        assert!(e.0.contains("zero point of x"), "{e}");
        let xz = Tensor::from_parts(vec![], TensorData::U8(vec![1].into()));
        let y = conv_integer_op(&ctx, &[Some(&x), Some(&w), Some(&xz)]).unwrap();
        assert_eq!(y[0].to_i64_vec().unwrap(), vec![0, 2, 4, 6]);
    }
}
