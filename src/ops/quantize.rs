//! QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear: the Q/DQ nodes of models
//! quantized ahead of time (ONNX Runtime's quantization tools, TensorRT's explicit
//! quantization).
//!
//! - `QuantizeLinear(x, scale, zero_point?)`: `y = saturate(round_half_even(x / scale) + zp)`.
//! - `DequantizeLinear(x, scale, zero_point?)`: `y = (x - zp) * scale`.
//! - Scale and zero point are per tensor (one value), per axis (1-D along `axis`, opset 13+)
//!   or blocked (opset 21+: same rank as `x`, dimension `axis` is `ceil(x.shape[axis] /
//!   block_size)`).
//!
//! Quantized types: uint8, int8, uint16, int16, uint4 and int4 (integers: round half to
//! even, add the zero point, clamp to the type's range — int4 saturates to [-8, 7]); the four
//! float8 types (`y = cast(x / scale)`, rounding to nearest even; the `saturate` attribute,
//! opset 19+, default 1, clamps out-of-range values to ±max, `saturate=0` gives inf/NaN as
//! Cast does; the zero point must be 0) and float4e2m1 (`y = cast(x / scale + zp)`, always
//! saturating to ±6), as the ONNX reference implementation computes them. DequantizeLinear
//! reads all of these (and int32); a float8 or float4 zero point must be zero.
//! A NaN input quantizes to the zero point for integer types and to NaN for float8.

use super::attrs::{boxed, AttrError, Attrs};
use super::util::{input, norm_axis, opt_input};
use super::{OpCtx, OpError, OpResult, Registry};
use crate::lowbit::{F4E2M1, F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, I4, U4};
use crate::tensor::{DType, Tensor, TensorData};
use half::{bf16, f16};

pub fn register(r: &mut Registry) {
    r.add("QuantizeLinear", quantize_linear);
    r.add("DequantizeLinear", dequantize_linear);
    r.add("DynamicQuantizeLinear", dynamic_quantize_linear);
    use super::InputRole::{Data, Scale, ZeroPoint};
    for op in ["QuantizeLinear", "DequantizeLinear"] {
        r.def_mut(op)
            .parse(|n, opset| boxed(QuantAttrs::parse(n, opset)));
    }
    r.def_mut("QuantizeLinear")
        .roles(&[Data, Scale, ZeroPoint])
        .infer(|ctx, ins| {
            let x = super::shape::fact(ins, 0)?;
            let dtype = match super::shape::opt_fact(ins, 2) {
                Some(z) => z.dtype,
                None => Some(ctx.attrs::<QuantAttrs>()?.output_dtype.unwrap_or(DType::U8)),
            };
            Ok(vec![Fact::new(dtype, x.shape.clone())])
        });
    r.def_mut("DequantizeLinear")
        .roles(&[Data, Scale, ZeroPoint])
        .infer(|ctx, ins| {
            let x = super::shape::fact(ins, 0)?;
            let scale = super::shape::fact(ins, 1)?;
            let dtype = match ctx.attrs::<QuantAttrs>()?.output_dtype {
                Some(d) => Some(d),
                None => scale.dtype,
            };
            Ok(vec![Fact::new(dtype, x.shape.clone())])
        });
    r.def_mut("DynamicQuantizeLinear").infer(|_, ins| {
        let x = super::shape::fact(ins, 0)?;
        Ok(vec![
            Fact::new(Some(DType::U8), x.shape.clone()),
            Fact::typed(DType::F32, vec![]),
            Fact::typed(DType::U8, vec![]),
        ])
    });
}

use crate::graph::fact::Fact;

/// QuantizeLinear's and DequantizeLinear's attributes, for the node's opset.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantAttrs {
    /// The per-axis or blocked axis (default 1).
    pub axis: i64,
    /// Blocked quantization's block size (opset 21+; 0: not blocked).
    pub block_size: usize,
    /// float8 targets clamp out-of-range values (opset 19+, default 1).
    pub saturate: bool,
    /// The output type set by the attribute (QuantizeLinear 21+: a quantized type;
    /// DequantizeLinear 23+: float32, float16 or bfloat16); None when unset or 0.
    pub output_dtype: Option<DType>,
    /// QuantizeLinear's division type (opset 23+: float32, float16 or bfloat16).
    pub precision: Option<DType>,
}

impl QuantAttrs {
    fn parse(node: &crate::graph::Node, opset: i64) -> Result<QuantAttrs, AttrError> {
        let a = Attrs::new(node);
        let quantize = node.op_type == "QuantizeLinear";
        let block_size = if opset >= 21 {
            a.int_or("block_size", 0)?
        } else {
            0
        };
        if block_size < 0 {
            return Err(AttrError::new(
                "block_size",
                format!("must be >= 0, got {block_size}"),
            ));
        }
        let float = |d: &DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
        let typed = |name: &str, from: i64, ok: &dyn Fn(&DType) -> bool, what: &str| {
            if opset < from || a.int(name)? == Some(0) {
                return Ok(None);
            }
            match a.dtype(name)? {
                Some(d) if !ok(&d) => Err(AttrError::new(
                    name,
                    format!("{d} is not supported (expected {what})"),
                )),
                d => Ok(d),
            }
        };
        let output_dtype = if quantize {
            typed(
                "output_dtype",
                21,
                &|d| quant_range(*d).is_ok(),
                "uint8, int8, uint16, int16, uint4, int4, a float8 type or float4e2m1",
            )?
        } else {
            typed("output_dtype", 23, &float, "float32, float16 or bfloat16")?
        };
        let precision = if quantize {
            typed("precision", 23, &float, "float32, float16 or bfloat16")?
        } else {
            None
        };
        Ok(QuantAttrs {
            axis: a.int_or("axis", 1)?,
            block_size: block_size as usize,
            saturate: opset < 19 || a.flag("saturate", true)?,
            output_dtype,
            precision,
        })
    }
}

/// The integer range of a quantized type, or an error naming the unsupported type.
fn quant_range(dtype: DType) -> Result<(f64, f64), OpError> {
    Ok(match dtype {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::U4 => (0.0, 15.0),
        DType::I4 => (-8.0, 7.0),
        // Float targets: the range is applied by their conversion (saturate attribute).
        d if d.is_fp8() || d == DType::F4E2M1 => (f64::NEG_INFINITY, f64::INFINITY),
        other => {
            return Err(OpError(format!(
                "quantized type {other} is not supported (expected uint8, int8, uint16, int16, uint4, int4, a float8 type or float4e2m1)"
            )))
        }
    })
}

/// How scale and zero point map onto the elements of `x`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// One value for the whole tensor.
    PerTensor,
    /// One value per index of `axis`: param = idx[axis].
    PerAxis { axis: usize },
    /// Blocks of `block` along `axis`: param = (outer, idx[axis] / block, inner).
    Blocked { axis: usize, block: usize },
}

/// Checks the scale's shape against `x` and the node's attributes and returns the layout.
fn layout(ctx: &OpCtx, x_shape: &[usize], scale: &Tensor) -> Result<Layout, OpError> {
    let attrs = ctx.attrs::<QuantAttrs>()?;
    let block_size = attrs.block_size;
    // A single value (scalar or shape [1]) applies to every element, whatever the mode.
    if scale.len() == 1 && scale.rank() <= 1 {
        return Ok(Layout::PerTensor);
    }
    if ctx.opset < 13 {
        return Err(OpError(format!(
            "scale has shape {:?}, but opset {} only supports a per-tensor scale (per-axis needs opset 13)",
            scale.shape(),
            ctx.opset
        )));
    }
    let axis = norm_axis(attrs.axis, x_shape.len())?;
    if block_size == 0 {
        if scale.rank() != 1 || scale.shape()[0] != x_shape[axis] {
            return Err(OpError(format!(
                "scale has shape {:?}: per-axis quantization along axis {axis} of input {:?} needs a 1-D scale of {} values (or set block_size for blocked quantization)",
                scale.shape(),
                x_shape,
                x_shape[axis]
            )));
        }
        return Ok(Layout::PerAxis { axis });
    }
    let block = block_size;
    let mut want = x_shape.to_vec();
    want[axis] = x_shape[axis].div_ceil(block);
    if scale.shape() != want.as_slice() {
        return Err(OpError(format!(
            "scale has shape {:?}: blocked quantization of input {:?} with block_size {block} along axis {axis} needs shape {want:?}",
            scale.shape(),
            x_shape
        )));
    }
    Ok(Layout::Blocked { axis, block })
}

/// For every element of a tensor of `shape`, the index of its scale/zero point.
fn param_indices(shape: &[usize], layout: Layout) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let (axis, block) = match layout {
        Layout::PerTensor => return vec![0; n],
        Layout::PerAxis { axis } => (axis, 0),
        Layout::Blocked { axis, block } => (axis, block),
    };
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = Vec::with_capacity(n);
    for o in 0..outer {
        for k in 0..len {
            for i in 0..inner {
                out.push(if block == 0 {
                    k
                } else {
                    (o * len.div_ceil(block) + k / block) * inner + i
                });
            }
        }
    }
    out
}

/// The zero point's values as f64 after checking its shape matches the scale's.
fn zero_points(zp: Option<&Tensor>, scale: &Tensor) -> Result<Option<Vec<f64>>, OpError> {
    let Some(z) = zp else { return Ok(None) };
    if z.len() != scale.len() || (z.rank() > 1 || scale.rank() > 1) && z.shape() != scale.shape() {
        return Err(OpError(format!(
            "zero point has shape {:?} but scale has shape {:?}: they must match",
            z.shape(),
            scale.shape()
        )));
    }
    let v = z.to_f64_vec().ok_or_else(|| {
        OpError(format!(
            "zero point has dtype {}, which is not numeric",
            z.dtype()
        ))
    })?;
    Ok(Some(v))
}

/// A float input as f32 values (plus its dtype), or an error naming what was found.
fn float_values(t: &Tensor, what: &str, allow_int32: bool) -> Result<Vec<f32>, OpError> {
    let ok = t.dtype() == DType::F32
        || t.dtype() == DType::F16
        || t.dtype() == DType::BF16
        || (allow_int32 && t.dtype() == DType::I32);
    if !ok {
        return Err(OpError(format!(
            "{what} has dtype {}, expected float32, float16 or bfloat16{}",
            t.dtype(),
            if allow_int32 { " or int32" } else { "" }
        )));
    }
    Ok(t.to_f32_vec().expect("numeric"))
}

/// Rounds an f32 to the precision `d` (f32, f16 or bf16) and back.
fn round_to(d: DType, x: f32) -> f32 {
    match d {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// `code(x / s)` of every value for an 8-bit type of `range` with zero point `z`, handed to `to`
/// as an i32 inside the range:
/// `clamp(round_half_even(x / s) + z, range)`, NaN to `nan + z` (clamped: QuantizeLinear's
/// NaN goes to the range's minimum, ONNX Runtime's rule, as the general loop of
/// [`quantize_linear`]; DynamicQuantizeLinear's to the zero point); the loop compiled for AVX2
/// where the CPU has it (`roundps`: the baseline target rounds through a libm call per
/// value), in parallel pieces above 64K values.
fn quantize_8bit<T: Copy + Default + Send + Sync>(
    xs: &[f32],
    s: f32,
    z: f32,
    (lo, hi): (f32, f32),
    nan: f32,
    to: impl Fn(i32) -> T + Sync + Copy,
) -> Vec<T> {
    #[inline(always)]
    fn fill<T>(src: &[f32], dst: &mut [T], code: impl Fn(f32) -> T) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = code(x);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn fill_avx2<T>(src: &[f32], dst: &mut [T], code: impl Fn(f32) -> T) {
        fill(src, dst, code)
    }
    let code = move |x: f32| {
        let q = x / s;
        let r = if q.is_nan() { nan } else { q.round_ties_even() };
        let code = (r + z).max(lo).min(hi);
        // SAFETY: `code` is a finite integer inside the 8-bit range (NaN went to `lo`, an
        // infinity saturates), which i32 holds: the unchecked conversion vectorizes, where a
        // saturating `as u8` went lane by lane.
        to(unsafe { code.to_int_unchecked::<i32>() })
    };
    let piece = |src: &[f32], dst: &mut [T]| {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has the feature the function was compiled for.
            return unsafe { fill_avx2(src, dst, code) };
        }
        fill(src, dst, code)
    };
    const PIECE: usize = 1 << 14;
    let mut out = vec![T::default(); xs.len()];
    if xs.len() > 4 * PIECE {
        use rayon::prelude::*;
        out.par_chunks_mut(PIECE)
            .zip(xs.par_chunks(PIECE))
            .for_each(|(d, s)| piece(s, d));
    } else {
        piece(xs, &mut out);
    }
    out
}

fn quantize_linear(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let scale = input(inputs, 1)?;
    let zp = opt_input(inputs, 2);
    let attrs = ctx.attrs::<QuantAttrs>()?;
    let out_dtype = match zp {
        Some(z) => {
            if let Some(d) = attrs.output_dtype {
                if d != z.dtype() {
                    return Err(OpError(format!(
                        "output_dtype {d} differs from the zero point's type {}",
                        z.dtype()
                    )));
                }
            }
            z.dtype()
        }
        None => attrs.output_dtype.unwrap_or(DType::U8),
    };
    let (qmin, qmax) = quant_range(out_dtype)?;
    let sv = float_values(scale, "y_scale", false)?;
    let layout = layout(ctx, x.shape(), scale)?;
    let zv = zero_points(zp, scale)?;
    if out_dtype.is_fp8() {
        require_zero(zv.as_deref(), out_dtype)?;
    }
    let saturate = attrs.saturate;
    // The division happens in the inputs' common type (float16 only if both are float16),
    // or in the `precision` attribute's type (opset 23+); int32 inputs divide in f64.
    let precision = attrs.precision;
    let div_type = precision.unwrap_or(if x.dtype() == scale.dtype() {
        x.dtype()
    } else {
        DType::F32
    });
    // The common case, a float32 tensor to 8-bit codes with one scale: the same arithmetic
    // in f32 (below 2^24 every step is exact, beyond it the code saturates either way), in
    // vectors.
    if let (Some(xs), [s], DType::F32, DType::F32, DType::U8 | DType::I8) =
        (x.as_f32(), &sv[..], scale.dtype(), div_type, out_dtype)
    {
        let z = zv.as_ref().map_or(0.0, |z| z[0]) as f32;
        let range = (qmin as f32, qmax as f32);
        // The codes are integers inside the type's range: the casts are exact.
        let data = if out_dtype == DType::U8 {
            TensorData::U8(quantize_8bit(xs, *s, z, range, range.0 - z, |v| v as u8).into())
        } else {
            TensorData::I8(quantize_8bit(xs, *s, z, range, range.0 - z, |v| v as i8).into())
        };
        return Ok(vec![Tensor::from_parts(x.shape().to_vec(), data)]);
    }
    let xv = float_values(x, "input x", true)?;
    let idx = param_indices(x.shape(), layout);
    let mut q = Vec::with_capacity(xv.len());
    for (i, &xi) in xv.iter().enumerate() {
        let p = idx[i];
        let quot = if x.dtype() == DType::I32 && precision.is_none() {
            let xi = match x.data() {
                TensorData::I32(v) => v[i] as f64,
                _ => unreachable!("dtype checked"),
            };
            xi / sv[p] as f64
        } else {
            round_to(div_type, round_to(div_type, xi) / round_to(div_type, sv[p])) as f64
        };
        let z = zv.as_ref().map_or(0.0, |z| z[p]);
        if out_dtype.is_fp8() {
            // The float8 conversion does the rounding (and saturation).
            q.push(quot);
        } else if out_dtype == DType::F4E2M1 {
            // As the ONNX reference: the zero point is added in float, then converted.
            q.push((quot as f32 + z as f32) as f64);
        } else {
            // NaN quantizes to the type's minimum, as in ONNX Runtime (its kernels clamp with
            // maxps/minps, which return the bound for a NaN); ±inf saturate.
            let r = if quot.is_nan() {
                qmin - z
            } else {
                quot.round_ties_even()
            };
            q.push((r + z).clamp(qmin, qmax));
        }
    }
    let data = match out_dtype {
        DType::U8 => TensorData::U8(q.iter().map(|&v| v as u8).collect()),
        DType::I8 => TensorData::I8(q.iter().map(|&v| v as i8).collect()),
        DType::U16 => TensorData::U16(q.iter().map(|&v| v as u16).collect()),
        DType::I16 => TensorData::I16(q.iter().map(|&v| v as i16).collect()),
        DType::U4 => TensorData::U4(q.iter().map(|&v| U4::saturating(v as i64)).collect()),
        DType::I4 => TensorData::I4(q.iter().map(|&v| I4::saturating(v as i64)).collect()),
        DType::F8E4M3FN => {
            TensorData::F8E4M3FN(q.iter().map(|&v| F8E4M3FN::from_f64(v, saturate)).collect())
        }
        DType::F8E4M3FNUZ => TensorData::F8E4M3FNUZ(
            q.iter()
                .map(|&v| F8E4M3FNUZ::from_f64(v, saturate))
                .collect(),
        ),
        DType::F8E5M2 => {
            TensorData::F8E5M2(q.iter().map(|&v| F8E5M2::from_f64(v, saturate)).collect())
        }
        DType::F8E5M2FNUZ => TensorData::F8E5M2FNUZ(
            q.iter()
                .map(|&v| F8E5M2FNUZ::from_f64(v, saturate))
                .collect(),
        ),
        DType::F4E2M1 => TensorData::F4E2M1(q.iter().map(|&v| F4E2M1::from_f64(v, true)).collect()),
        _ => unreachable!("quant_range accepted it"),
    };
    Ok(vec![Tensor::from_parts(x.shape().to_vec(), data)])
}

fn dequantize_linear(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let scale = input(inputs, 1)?;
    let zp = opt_input(inputs, 2);
    if !matches!(
        x.dtype(),
        DType::U8 | DType::I8 | DType::U16 | DType::I16 | DType::I32
    ) && !x.dtype().is_low_bit()
    {
        return Err(OpError(format!(
            "input x has dtype {}, expected uint8, int8, uint16, int16, int32, uint4, int4, a float8 type or float4e2m1",
            x.dtype()
        )));
    }
    if let Some(z) = zp {
        if z.dtype() != x.dtype() {
            return Err(OpError(format!(
                "zero point has dtype {} but x has dtype {}: they must match",
                z.dtype(),
                x.dtype()
            )));
        }
    }
    let sv = float_values(scale, "x_scale", false)?;
    let out_dtype = ctx
        .attrs::<QuantAttrs>()?
        .output_dtype
        .unwrap_or(scale.dtype());
    let layout = layout(ctx, x.shape(), scale)?;
    let zv = zero_points(zp, scale)?;
    if x.dtype().is_fp8() || x.dtype() == DType::F4E2M1 {
        require_zero(zv.as_deref(), x.dtype())?;
    }
    // As the ONNX reference: x and the zero point as f32, subtract, multiply in f32.
    // 8-bit codes with one scale (activations; weights are folded at load) are read straight
    // from the codes, one pass the compiler vectorizes; the rest through the general loop.
    let z0 = zv.as_ref().map_or(0.0, |z| z[0] as f32);
    let y: Vec<f32> = match (x.data(), &sv[..]) {
        (TensorData::U8(v), &[s]) => v.iter().map(|&c| (c as f32 - z0) * s).collect(),
        (TensorData::I8(v), &[s]) => v.iter().map(|&c| (c as f32 - z0) * s).collect(),
        _ => {
            let xv = x.to_f32_vec().ok_or_else(|| {
                OpError(format!(
                    "input has dtype {}, which is not numeric",
                    x.dtype()
                ))
            })?;
            let idx = param_indices(x.shape(), layout);
            xv.iter()
                .zip(&idx)
                .map(|(&xi, &p)| {
                    let z = zv.as_ref().map_or(0.0, |z| z[p] as f32);
                    (xi - z) * sv[p]
                })
                .collect()
        }
    };
    let t = Tensor::from_f32(x.shape().to_vec(), y);
    Ok(vec![if out_dtype == DType::F32 {
        t
    } else {
        super::cast::cast_tensor(&t, out_dtype)
    }])
}

/// Float8/float4 zero points carry no offset: ONNX requires them to be zero.
fn require_zero(zv: Option<&[f64]>, dtype: DType) -> Result<(), OpError> {
    match zv {
        Some(z) if z.iter().any(|&v| v != 0.0) => Err(OpError(format!(
            "the zero point of a {dtype} quantization must be 0"
        ))),
        _ => Ok(()),
    }
}

/// The smallest and largest of `xs` and 0, NaNs skipped. Each running extreme is kept with a
/// compare and select, `x < lo ? x : lo`: a NaN compares false and leaves the extreme as it
/// was (`f32::min`'s skipping), and the extremes never hold a NaN. With AVX that select is
/// `minps`/`maxps` itself (which return the second operand for a NaN), over four registers of
/// each; the compiler's own vectorization of the portable loop shuffled lanes between
/// registers at every step and took longer than the quantization that follows.
fn range_with_zero(xs: &[f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { range_with_zero_avx(xs) };
    }
    extremes_with_zero(xs, 0.0, 0.0)
}

/// [`range_with_zero`]'s portable loop, starting from the extremes `lo` and `hi`.
fn extremes_with_zero(xs: &[f32], lo: f32, hi: f32) -> (f32, f32) {
    xs.iter().fold((lo, hi), |(lo, hi), &x| {
        (if x < lo { x } else { lo }, if x > hi { x } else { hi })
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn range_with_zero_avx(xs: &[f32]) -> (f32, f32) {
    use std::arch::x86_64::*;
    let zero = _mm256_setzero_ps();
    let (mut lo, mut hi) = ([zero; 4], [zero; 4]);
    let chunks = xs.chunks_exact(32);
    let rest = chunks.remainder();
    for ch in chunks {
        for k in 0..4 {
            // SAFETY: `ch` holds 32 values, lanes 8k..8k+8 among them.
            let v = unsafe { _mm256_loadu_ps(ch.as_ptr().add(8 * k)) };
            lo[k] = _mm256_min_ps(v, lo[k]);
            hi[k] = _mm256_max_ps(v, hi[k]);
        }
    }
    let (mut los, mut his) = ([0f32; 32], [0f32; 32]);
    for k in 0..4 {
        // SAFETY: each store writes 8 of the arrays' 32 values.
        unsafe {
            _mm256_storeu_ps(los.as_mut_ptr().add(8 * k), lo[k]);
            _mm256_storeu_ps(his.as_mut_ptr().add(8 * k), hi[k]);
        }
    }
    let (lo, _) = extremes_with_zero(&los, 0.0, 0.0);
    let (_, hi) = extremes_with_zero(&his, 0.0, 0.0);
    extremes_with_zero(rest, lo, hi)
}

fn dynamic_quantize_linear(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let xv = x
        .as_f32()
        .ok_or_else(|| OpError(format!("input x has dtype {}, expected float32", x.dtype())))?;
    if xv.is_empty() {
        return Err(OpError(
            "input x is empty: its range (and so the scale) is undefined".into(),
        ));
    }
    let (qmin, qmax) = (0.0f32, 255.0f32);
    // The range always includes 0 so that 0 is exactly representable.
    let (minx, maxx) = range_with_zero(xv);
    let scale = if maxx == minx { 1.0 } else { maxx - minx } / (qmax - qmin);
    let zp = (qmin - minx / scale).clamp(qmin, qmax).round_ties_even();
    // NaN to the zero point (its quotient taken as 0).
    let y = quantize_8bit(xv, scale, zp, (qmin, qmax), 0.0, |v| v as u8);
    Ok(vec![
        Tensor::from_parts(x.shape().to_vec(), TensorData::U8(y.into())),
        Tensor::scalar_f32(scale),
        Tensor::from_parts(vec![], TensorData::U8(vec![zp as u8].into())),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Attribute, Node};

    fn node(op: &str, attrs: &[(&str, i64)]) -> Node {
        Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec!["y".into()],
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), Attribute::Int(*v)))
                .collect(),
            ..Default::default()
        }
    }

    fn run(
        f: fn(&OpCtx, &[Option<&Tensor>]) -> OpResult,
        n: &Node,
        opset: i64,
        inputs: &[Option<&Tensor>],
    ) -> OpResult {
        f(&OpCtx::new(n, opset), inputs)
    }

    /// The vector path of float32 → 8-bit per-tensor QuantizeLinear gives the codes of the
    /// general loop's arithmetic (f64 after the f32 division): ties, NaN, ±inf, values far
    /// beyond the range, a zero scale, uint8 and int8 with zero points, small and parallel sizes.
    #[test]
    fn eight_bit_codes_of_the_vector_path_are_the_general_loops() {
        let mut seed = 11u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as u32
        };
        for (n, s) in [(1000usize, 0.037f32), (70_000, 0.5), (300, 0.0)] {
            let mut x: Vec<f32> = (0..n)
                .map(|_| (next() as f32 / u32::MAX as f32 - 0.5) * 20.0)
                .collect();
            let specials = [
                f32::NAN,
                f32::INFINITY,
                -f32::INFINITY,
                2.5 * s,
                -0.5 * s,
                1e30,
                -1e30,
            ];
            x[..specials.len()].copy_from_slice(&specials);
            for (dtype, z) in [(DType::U8, 128i64), (DType::I8, -3), (DType::U8, 0)] {
                let (qmin, qmax) = quant_range(dtype).unwrap();
                let zt = Tensor::from_parts(
                    vec![],
                    match dtype {
                        DType::U8 => TensorData::U8(vec![z as u8].into()),
                        _ => TensorData::I8(vec![z as i8].into()),
                    },
                );
                let xt = Tensor::from_f32(vec![n], x.clone());
                let st = Tensor::from_f32(vec![], vec![s]);
                let y = run(
                    quantize_linear,
                    &node("QuantizeLinear", &[]),
                    19,
                    &[Some(&xt), Some(&st), Some(&zt)],
                )
                .unwrap();
                let want: Vec<i64> = x
                    .iter()
                    .map(|&v| {
                        let quot = (v / s) as f64;
                        let z = z as f64;
                        let r = if quot.is_nan() {
                            qmin - z
                        } else {
                            quot.round_ties_even()
                        };
                        (r + z).clamp(qmin, qmax) as i64
                    })
                    .collect();
                assert_eq!(y[0].dtype(), dtype);
                assert_eq!(
                    y[0].to_i64_vec().unwrap(),
                    want,
                    "{n} values, scale {s}, {dtype}"
                );
            }
        }
    }

    /// 8-bit codes with one scale dequantize straight from the codes: `(x − z) · s` in f32,
    /// uint8 and int8, with and without a zero point, every code.
    #[test]
    fn eight_bit_codes_with_one_scale_dequantize_in_f32() {
        let s = 0.0371f32;
        for (dtype, z) in [
            (DType::U8, Some(131i64)),
            (DType::I8, Some(-5)),
            (DType::I8, None),
        ] {
            let codes: Vec<i64> = match dtype {
                DType::U8 => (0..=255).collect(),
                _ => (-128..=127).collect(),
            };
            let of = |v: &[i64], shape: Vec<usize>| {
                Tensor::from_parts(
                    shape,
                    match dtype {
                        DType::U8 => TensorData::U8(v.iter().map(|&c| c as u8).collect()),
                        _ => TensorData::I8(v.iter().map(|&c| c as i8).collect()),
                    },
                )
            };
            let xt = of(&codes, vec![codes.len()]);
            let st = Tensor::from_f32(vec![], vec![s]);
            let zt = z.map(|z| of(&[z], vec![]));
            let y = run(
                dequantize_linear,
                &node("DequantizeLinear", &[]),
                19,
                &[Some(&xt), Some(&st), zt.as_ref()],
            )
            .unwrap();
            let want: Vec<f32> = codes
                .iter()
                .map(|&c| (c as f32 - z.unwrap_or(0) as f32) * s)
                .collect();
            assert_eq!(y[0].as_f32().unwrap(), &want[..], "{dtype} {z:?}");
        }
    }

    fn u8s(v: &[u8]) -> Tensor {
        Tensor::from_parts(vec![v.len()], TensorData::U8(v.to_vec().into()))
    }

    #[test]
    fn quantize_rounds_half_to_even_and_saturates() {
        let n = node("QuantizeLinear", &[]);
        let x = Tensor::from_f32(vec![8], vec![0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0, 5.0]);
        let s = Tensor::scalar_f32(1.0);
        let y = run(quantize_linear, &n, 13, &[Some(&x), Some(&s)])
            .unwrap()
            .remove(0);
        // No zero point: uint8, negatives saturate to 0.
        assert_eq!(
            y.data(),
            &TensorData::U8(vec![0, 2, 2, 0, 0, 255, 0, 5].into())
        );
        let z = Tensor::from_parts(vec![], TensorData::I8(vec![0].into()));
        let y = run(quantize_linear, &n, 13, &[Some(&x), Some(&s), Some(&z)])
            .unwrap()
            .remove(0);
        assert_eq!(
            y.data(),
            &TensorData::I8(vec![0, 2, 2, 0, -2, 127, -128, 5].into())
        );
    }

    #[test]
    fn quantize_nan_gives_the_minimum_as_onnxruntime() {
        let n = node("QuantizeLinear", &[]);
        let x = Tensor::from_f32(vec![3], vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY]);
        let s = Tensor::scalar_f32(1.0);
        let z = Tensor::from_parts(vec![], TensorData::U8(vec![7].into()));
        let y = run(quantize_linear, &n, 19, &[Some(&x), Some(&s), Some(&z)]).unwrap();
        assert_eq!(y[0].data(), &TensorData::U8(vec![0, 255, 0].into()));
        let z = Tensor::from_parts(vec![], TensorData::I8(vec![7].into()));
        let y = run(quantize_linear, &n, 19, &[Some(&x), Some(&s), Some(&z)]).unwrap();
        assert_eq!(y[0].data(), &TensorData::I8(vec![-128, 127, -128].into()));
    }

    #[test]
    fn per_axis_round_trip() {
        let n = node("QuantizeLinear", &[("axis", 0)]);
        let x = Tensor::from_f32(vec![2, 2], vec![2.0, 4.0, 10.0, -10.0]);
        let s = Tensor::from_f32(vec![2], vec![2.0, 10.0]);
        let z = u8s(&[10, 100]);
        let y = run(quantize_linear, &n, 13, &[Some(&x), Some(&s), Some(&z)])
            .unwrap()
            .remove(0);
        assert_eq!(y.data(), &TensorData::U8(vec![11, 12, 101, 99].into()));
        let dn = node("DequantizeLinear", &[("axis", 0)]);
        let back = run(dequantize_linear, &dn, 13, &[Some(&y), Some(&s), Some(&z)])
            .unwrap()
            .remove(0);
        assert_eq!(back.as_f32().unwrap(), x.as_f32().unwrap());
    }

    #[test]
    fn blocked_dequantize_with_remainder_block() {
        let n = node("DequantizeLinear", &[("axis", 1), ("block_size", 2)]);
        let x = Tensor::from_parts(vec![1, 3], TensorData::I8(vec![1, 2, 3].into()));
        let s = Tensor::from_f32(vec![1, 2], vec![1.0, 10.0]);
        let y = run(dequantize_linear, &n, 21, &[Some(&x), Some(&s)])
            .unwrap()
            .remove(0);
        assert_eq!(y.as_f32().unwrap(), &[1.0, 2.0, 30.0]);
        let bad = Tensor::from_f32(vec![1, 3], vec![1.0; 3]);
        let e = run(dequantize_linear, &n, 21, &[Some(&x), Some(&bad)]).unwrap_err();
        assert!(e.0.contains("needs shape [1, 2]"), "{e}");
    }

    #[test]
    fn errors_are_clear() {
        let n = node("QuantizeLinear", &[]);
        let x = Tensor::from_f32(vec![1, 3], vec![1.0; 3]);
        let s = Tensor::from_f32(vec![2], vec![1.0, 1.0]);
        let e = run(quantize_linear, &n, 13, &[Some(&x), Some(&s)]).unwrap_err();
        assert!(e.0.contains("1-D scale of 3 values"), "{e}");
        let e = run(quantize_linear, &n, 10, &[Some(&x), Some(&s)]).unwrap_err();
        assert!(e.0.contains("per-tensor"), "{e}");
        let z = Tensor::from_parts(vec![], TensorData::I32(vec![0].into()));
        let s1 = Tensor::scalar_f32(1.0);
        let e = run(quantize_linear, &n, 13, &[Some(&x), Some(&s1), Some(&z)]).unwrap_err();
        assert!(e.0.contains("int32 is not supported"), "{e}");
        let dn = node("DequantizeLinear", &[]);
        let xq = u8s(&[1]);
        let zq = Tensor::from_parts(vec![], TensorData::I8(vec![0].into()));
        let e = run(
            dequantize_linear,
            &dn,
            13,
            &[Some(&xq), Some(&s1), Some(&zq)],
        )
        .unwrap_err();
        assert!(e.0.contains("must match"), "{e}");
        let e = run(dequantize_linear, &dn, 13, &[Some(&x), Some(&s1)]).unwrap_err();
        assert!(e.0.contains("float32"), "{e}");
    }

    #[test]
    fn dequantize_float16_scale_gives_float16() {
        let n = node("DequantizeLinear", &[]);
        let x = Tensor::from_parts(vec![2], TensorData::I8(vec![-3, 4].into()));
        let s = Tensor::from_parts(vec![], TensorData::F16(vec![f16::from_f32(0.5)].into()));
        let y = run(dequantize_linear, &n, 19, &[Some(&x), Some(&s)])
            .unwrap()
            .remove(0);
        assert_eq!(y.dtype(), DType::F16);
        assert_eq!(y.to_f32_vec().unwrap(), vec![-1.5, 2.0]);
    }

    #[test]
    fn dynamic_quantize_includes_zero() {
        let n = node("DynamicQuantizeLinear", &[]);
        let x = Tensor::from_f32(vec![6], vec![0.0, 2.0, -3.0, -2.5, 1.34, 0.5]);
        let out = run(dynamic_quantize_linear, &n, 11, &[Some(&x)]).unwrap();
        assert_eq!(
            out[0].data(),
            &TensorData::U8(vec![153, 255, 0, 26, 221, 179].into())
        );
        assert!((out[1].as_f32().unwrap()[0] - 5.0 / 255.0).abs() < 1e-7);
        assert_eq!(out[2].data(), &TensorData::U8(vec![153].into()));
        // All-zero input: scale 1/255, zero point 0.
        let z = Tensor::from_f32(vec![2], vec![0.0, 0.0]);
        let out = run(dynamic_quantize_linear, &n, 11, &[Some(&z)]).unwrap();
        assert_eq!(out[0].data(), &TensorData::U8(vec![0, 0].into()));
    }

    /// Sixteen running extremes and the vector code loop give the scalar definition's codes:
    /// extremes in the lanes and in the tail, a NaN (its code is the zero point).
    #[test]
    fn dynamic_quantize_of_many_values_is_the_scalar_definition() {
        let n = node("DynamicQuantizeLinear", &[]);
        for (lo_at, hi_at) in [(3usize, 37usize), (36, 5), (20, 21)] {
            let mut v: Vec<f32> = (0..38).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3).collect();
            v[lo_at] = -4.25;
            v[hi_at] = 6.5;
            v[9] = f32::NAN;
            let x = Tensor::from_f32(vec![38], v.clone());
            let out = run(dynamic_quantize_linear, &n, 11, &[Some(&x)]).unwrap();
            let scale = (6.5f32 - -4.25) / 255.0;
            let zp = (0.0 - -4.25f32 / scale).clamp(0.0, 255.0).round_ties_even();
            let want: Vec<u8> = v
                .iter()
                .map(|&x| {
                    let q = x / scale;
                    let q = if q.is_nan() { 0.0 } else { q.round_ties_even() };
                    (q + zp).clamp(0.0, 255.0) as u8
                })
                .collect();
            assert_eq!(
                out[0].data(),
                &TensorData::U8(want.into()),
                "{lo_at} {hi_at}"
            );
            assert_eq!(out[1].as_f32().unwrap()[0], scale);
            assert_eq!(out[2].data(), &TensorData::U8(vec![zp as u8].into()));
        }
    }

    /// The vector extremes are the definition's — `f32::min`/`f32::max` over the values and
    /// 0, NaNs skipped — wherever the extremes, NaNs and infinities fall (lanes, tail).
    #[test]
    fn range_with_zero_is_the_nan_skipping_fold() {
        let definition = |xs: &[f32]| {
            xs.iter()
                .fold((0.0f32, 0.0f32), |(lo, hi), &x| (lo.min(x), hi.max(x)))
        };
        for n in [0usize, 1, 31, 32, 33, 64, 95, 1000] {
            for case in 0..6 {
                let mut v: Vec<f32> = (0..n)
                    .map(|i| ((i * 37 % 101) as f32 - 30.0) * 0.7)
                    .collect();
                match case {
                    1 => v.iter_mut().for_each(|x| *x = x.abs() + 1.0),
                    2 => v.iter_mut().for_each(|x| *x = -x.abs() - 1.0),
                    3 => v.iter_mut().step_by(3).for_each(|x| *x = f32::NAN),
                    4 if n > 0 => {
                        v[n - 1] = f32::INFINITY;
                        v[n / 2] = f32::NEG_INFINITY;
                    }
                    5 => v.iter_mut().for_each(|x| *x = f32::NAN),
                    _ => {}
                }
                let got = range_with_zero(&v);
                assert_eq!(got, definition(&v), "{n} values, case {case}");
                assert_eq!(got, extremes_with_zero(&v, 0.0, 0.0), "{n}, case {case}");
            }
        }
    }

    #[test]
    fn int4_saturates_and_float8_follows_saturate() {
        let n = node("QuantizeLinear", &[]);
        let x = Tensor::from_f32(vec![4], vec![100.0, -100.0, 2.5, 3.5]);
        let s = Tensor::scalar_f32(1.0);
        let z = Tensor::from_parts(vec![], TensorData::I4(vec![I4::wrapping(0)].into()));
        let y = run(quantize_linear, &n, 21, &[Some(&x), Some(&s), Some(&z)]).unwrap();
        assert_eq!(y[0].to_i64_vec().unwrap(), vec![7, -8, 2, 4]);
        let z = Tensor::from_parts(
            vec![],
            TensorData::F8E4M3FN(vec![F8E4M3FN::from_bits(0)].into()),
        );
        let x = Tensor::from_f32(vec![2], vec![1000.0, 1.0625]);
        let y = run(quantize_linear, &n, 19, &[Some(&x), Some(&s), Some(&z)]).unwrap();
        assert_eq!(y[0].to_f32_vec().unwrap(), vec![448.0, 1.0]);
        let ns = node("QuantizeLinear", &[("saturate", 0)]);
        let y = run(quantize_linear, &ns, 19, &[Some(&x), Some(&s), Some(&z)]).unwrap();
        assert!(y[0].to_f32_vec().unwrap()[0].is_nan());
        // A float8 zero point must be zero.
        let z1 = Tensor::from_parts(
            vec![],
            TensorData::F8E4M3FN(vec![F8E4M3FN::from_f32(1.0, true)].into()),
        );
        let e = run(quantize_linear, &n, 19, &[Some(&x), Some(&s), Some(&z1)]).unwrap_err();
        assert!(e.0.contains("must be 0"), "{e}");
        let dn = node("DequantizeLinear", &[]);
        let e = run(
            dequantize_linear,
            &dn,
            19,
            &[Some(&y[0]), Some(&s), Some(&z1)],
        )
        .unwrap_err();
        assert!(e.0.contains("must be 0"), "{e}");
    }

    #[test]
    fn float4_quantizes_through_output_dtype_and_dequantizes() {
        let n = node("QuantizeLinear", &[("output_dtype", 23)]);
        let x = Tensor::from_f32(vec![4], vec![5.0, -100.0, 0.5, 0.25]);
        let s = Tensor::scalar_f32(0.5);
        let q = run(quantize_linear, &n, 23, &[Some(&x), Some(&s)])
            .unwrap()
            .remove(0);
        assert_eq!(q.dtype(), DType::F4E2M1);
        assert_eq!(q.to_f32_vec().unwrap(), vec![6.0, -6.0, 1.0, 0.5]);
        let dn = node("DequantizeLinear", &[]);
        let y = run(dequantize_linear, &dn, 23, &[Some(&q), Some(&s)]).unwrap();
        assert_eq!(y[0].as_f32().unwrap(), &[3.0, -3.0, 0.5, 0.25]);
        // Unsupported output types are named.
        let bad = node("QuantizeLinear", &[("output_dtype", 1)]);
        let e = run(quantize_linear, &bad, 23, &[Some(&x), Some(&s)]).unwrap_err();
        assert!(e.0.contains("float32 is not supported"), "{e}");
    }

    #[test]
    fn blocked_uint4_dequantize() {
        let n = node("DequantizeLinear", &[("axis", 0), ("block_size", 2)]);
        let x = Tensor::from_parts(
            vec![3, 1],
            TensorData::U4([15, 0, 9].iter().map(|&v| U4::wrapping(v)).collect()),
        );
        let s = Tensor::from_f32(vec![2, 1], vec![1.0, 0.5]);
        let z = Tensor::from_parts(vec![2, 1], TensorData::U4(vec![U4::wrapping(8); 2].into()));
        let y = run(dequantize_linear, &n, 21, &[Some(&x), Some(&s), Some(&z)]).unwrap();
        assert_eq!(y[0].as_f32().unwrap(), &[7.0, -8.0, 0.5]);
    }

    #[test]
    fn bad_attributes_are_load_errors() {
        use crate::ops::attrs::testing::{assert_rejected, load_error};
        assert_rejected(
            "QuantizeLinear",
            &[("block_size", Attribute::Int(-2))],
            "block_size",
            ">= 0",
        );
        assert_rejected(
            "QuantizeLinear",
            &[("output_dtype", Attribute::Int(1))],
            "output_dtype",
            "float32 is not supported",
        );
        crate::ops::attrs::testing::assert_rejected_at(
            "DequantizeLinear",
            &[("output_dtype", Attribute::Int(3))],
            23,
            "output_dtype",
            "int8 is not supported",
        );
        assert_rejected(
            "QuantizeLinear",
            &[("axis", Attribute::Float(1.0))],
            "axis",
            "expected an int, got a float",
        );
        // Attributes of later opsets are not read.
        assert!(load_error("QuantizeLinear", &[("output_dtype", Attribute::Int(1))], 19).is_none());
    }
}
