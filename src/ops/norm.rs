//! BatchNormalization (inference), LayerNormalization, InstanceNormalization, LRN,
//! GroupNormalization, RMSNormalization, MeanVarianceNormalization and LpNormalization.
//!
//! LayerNormalization and RMSNormalization of float32 tensors compute what ONNX Runtime's CPU
//! provider computes, bit for bit (`ort_norm`: MLAS's AVX2 kernel, its scalar loop on short
//! rows). Elsewhere means and variances are accumulated in f64 (two passes), so the reference
//! stays accurate on long rows; results are rounded to f32.

use super::attrs::{boxed, AttrError, Attrs};
use super::util::{input, norm_axes, norm_axis, opt_input};
use super::{OpCtx, OpError, OpResult, Registry};
use crate::tensor::Tensor;
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    r.add("BatchNormalization", batch_norm)
        .stage(batch_norm_stage);
    r.add("LayerNormalization", layer_norm);
    r.add("InstanceNormalization", instance_norm);
    r.add("GroupNormalization", group_norm);
    r.add("LpNormalization", lp_norm);
    r.add("RMSNormalization", rms_norm);
    r.add("MeanVarianceNormalization", mvn);
    r.add("LRN", lrn)
        .parse(|n, _| boxed(LrnAttrs::parse(n)))
        .infer(same_as_input);
    use super::shape::same_as_input;
    for op in [
        "BatchNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "LpNormalization",
        "RMSNormalization",
        "MeanVarianceNormalization",
    ] {
        r.def_mut(op)
            .parse(|n, _| boxed(NormAttrs::parse(n)))
            .infer(same_as_input);
    }
    r.def_mut("LayerNormalization")
        .parse(|n, _| boxed(NormAttrs::parse(n)))
        .infer(layer_norm_facts);
    r.def_mut("BatchNormalization").flops(|_, _, outs| {
        2 * outs
            .first()
            .map_or(0, |s| s.iter().product::<usize>() as u64)
    });
    for op in [
        "LayerNormalization",
        "InstanceNormalization",
        "GroupNormalization",
    ] {
        r.def_mut(op).flops(|_, _, outs| {
            8 * outs
                .first()
                .map_or(0, |s| s.iter().product::<usize>() as u64)
        });
    }
}

/// The normalizations' attributes (each op reads those its schema defines).
#[derive(Clone, Debug, PartialEq)]
pub struct NormAttrs {
    /// The first normalized axis (Layer, RMS, Lp: default -1).
    pub axis: i64,
    pub epsilon: f64,
    /// The statistics' element type code (Layer, RMS; default 1, float32).
    pub stash_type: i64,
    /// BatchNormalization's `training_mode`.
    pub training_mode: bool,
    /// GroupNormalization's `num_groups` (required there, >= 1).
    pub num_groups: i64,
    /// LpNormalization's `p`: 1 or 2.
    pub p: i64,
    /// MeanVarianceNormalization's `axes` (default [0, 2, 3]).
    pub axes: Vec<i64>,
}

impl NormAttrs {
    fn parse(node: &crate::graph::Node) -> Result<NormAttrs, AttrError> {
        let a = Attrs::new(node);
        let op = node.op_type.as_str();
        let stash_type = a.int_or("stash_type", 1)?;
        if a.has("stash_type") {
            a.dtype("stash_type")?;
        }
        let num_groups = if op == "GroupNormalization" {
            let g = a.required_int("num_groups")?;
            if g < 1 {
                return Err(AttrError::new(
                    "num_groups",
                    format!("must be >= 1, got {g}"),
                ));
            }
            g
        } else {
            1
        };
        let p = a.int_or("p", 2)?;
        if op == "LpNormalization" && p != 1 && p != 2 {
            return Err(AttrError::new("p", format!("must be 1 or 2, got {p}")));
        }
        Ok(NormAttrs {
            axis: a.int_or("axis", -1)?,
            epsilon: a.float_or("epsilon", 1e-5)? as f64,
            stash_type,
            training_mode: a.flag("training_mode", false)?,
            num_groups,
            p,
            axes: super::reduce::distinct_axes(&a, "axes")?.unwrap_or_else(|| vec![0, 2, 3]),
        })
    }
}

/// Y like X; the optional Mean and InvStdDev keep X's leading dims up to `axis`, 1 after, in
/// the stash type.
/// The shape of a normalization's saved statistics: the input's dimensions before `axis`, 1
/// from it on.
pub(crate) fn stats_dims(
    s: &[crate::graph::fact::DimFact],
    axis: i64,
) -> Result<Vec<crate::graph::fact::DimFact>, OpError> {
    let axis = super::util::norm_axis(axis, s.len())?;
    Ok(s.iter()
        .enumerate()
        .map(|(i, d)| {
            if i < axis {
                d.clone()
            } else {
                crate::graph::fact::DimFact::known(1)
            }
        })
        .collect())
}

fn layer_norm_facts(
    ctx: &super::InferCtx,
    ins: &[Option<&crate::graph::fact::Fact>],
) -> super::shape::FactsResult {
    use crate::graph::fact::Fact;
    let x = super::shape::fact(ins, 0)?;
    let attrs = ctx.attrs::<NormAttrs>()?;
    let stats = x
        .shape
        .as_ref()
        .map(|s| stats_dims(s, attrs.axis))
        .transpose()?;
    let stash = crate::tensor::DType::from_onnx(attrs.stash_type as i32);
    Ok(vec![
        Fact::new(x.dtype, x.shape.clone()),
        Fact::new(stash, stats.clone()),
        Fact::new(stash, stats),
    ])
}

use super::util::{float_values as floats, in_dtype as back};

fn batch_norm(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    if x.rank() < 2 {
        return Err(OpError(format!(
            "input must have rank >= 2, got {:?}",
            x.shape()
        )));
    }
    let c = x.shape()[1];
    let (a, b) = batch_norm_coefficients(ctx, inputs, c)?;
    let sp: usize = x.shape()[2..].iter().product();
    let mut v = floats(x, "X")?;
    // A float32 output is rounded to the layer's precision plane by plane, as it is written.
    let f32_out = x.dtype() == crate::tensor::DType::F32;
    let round = ctx.rounder();
    if sp > 0 {
        v.par_chunks_mut(sp).enumerate().for_each(|(i, plane)| {
            affine(plane, a[i % c], b[i % c]);
            if f32_out {
                round(plane);
            }
        });
    }
    if f32_out {
        ctx.outputs_rounded();
    }
    Ok(vec![back(
        Tensor::from_f32(x.shape().to_vec(), v),
        x.dtype(),
    )])
}

/// BatchNormalization (inference) folded per channel into `y = a·x + b`:
/// `a = scale / √(var + eps)`, `b = bias − mean·a`, each in f64 and rounded to f32 once.
fn batch_norm_coefficients(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    c: usize,
) -> Result<(Vec<f32>, Vec<f32>), OpError> {
    let attrs = ctx.attrs::<NormAttrs>()?;
    if attrs.training_mode {
        return Err(OpError(
            "training_mode=1 is not supported (inference only)".into(),
        ));
    }
    let eps = attrs.epsilon;
    let get = |i: usize, what: &str| -> Result<Vec<f32>, OpError> {
        let t = input(inputs, i)?;
        if t.len() != c {
            return Err(OpError(format!(
                "{what} has {} values, expected {c}",
                t.len()
            )));
        }
        floats(t, what)
    };
    let (scale, bias, mean, var) = (
        get(1, "scale")?,
        get(2, "B")?,
        get(3, "mean")?,
        get(4, "var")?,
    );
    let a: Vec<f32> = (0..c)
        .map(|i| (scale[i] as f64 / (var[i] as f64 + eps).sqrt()) as f32)
        .collect();
    let b: Vec<f32> = (0..c)
        .map(|i| (bias[i] as f64 - mean[i] as f64 * a[i] as f64) as f32)
        .collect();
    Ok((a, b))
}

/// `x·a + b` for every value of one channel: a product and a sum, each rounded (no fused
/// multiply-add), in the kernel and as an epilogue stage alike.
fn affine(plane: &mut [f32], a: f32, b: f32) {
    super::vector::map_in_place(plane, move |p| p * a + b);
}

/// BatchNormalization as an epilogue stage: the same `x·a + b` per channel as its kernel.
fn batch_norm_stage(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    chained: &[bool],
    shape: super::ChainShape,
) -> Result<Option<super::Stage>, OpError> {
    if shape.rank < 2
        || shape.axis != 1
        || chained.first() != Some(&true)
        || chained[1..].contains(&true)
    {
        return Ok(None);
    }
    let (scale, shift) = batch_norm_coefficients(ctx, inputs, shape.channels)?;
    Ok(Some(super::Stage::Affine { scale, shift }))
}

/// An [`Stage::Affine`](super::Stage::Affine) stage on values of `channels`: `x·a + b` with
/// each channel's coefficients.
pub(crate) fn affine_stage(channels: super::Channels, v: &mut [f32], a: &[f32], b: &[f32]) {
    match channels {
        super::Channels::One(ch) => affine(v, a[ch], b[ch]),
        super::Channels::From(first) => {
            for (i, x) in v.iter_mut().enumerate() {
                *x = *x * a[first + i] + b[first + i];
            }
        }
    }
}

/// Normalizes each row of `width` values: (x - mean) / sqrt(var + eps); returns mean and
/// inverse std-dev per row.
/// Rows a task of [`normalize_rows`] takes at once: their sums are independent chains, so the
/// core adds eight of them in the time of one.
const ROWS_AT_ONCE: usize = 8;

/// Normalizes each row of `width` values in place, `(x − mean) · (1/√(var + eps))` with mean
/// and variance summed in f64 in order, then (LayerNormalization) `· scale[i] + bias[i]` in f32
/// in the same pass; returns each row's mean and 1/√(var + eps).
fn normalize_rows(
    v: &mut [f32],
    width: usize,
    eps: f64,
    affine: Option<(&[f32], Option<&[f32]>)>,
) -> (Vec<f32>, Vec<f32>) {
    if width == 0 {
        return (Vec::new(), Vec::new());
    }
    let stats: Vec<(f32, f32)> = v
        .par_chunks_mut(width * ROWS_AT_ONCE)
        .flat_map_iter(|group| {
            let n = group.len() / width;
            // Sequential f64 sums per row, the rows' chains interleaved.
            let mut sum = [0f64; ROWS_AT_ONCE];
            for k in 0..width {
                for (r, s) in sum.iter_mut().enumerate().take(n) {
                    *s += group[r * width + k] as f64;
                }
            }
            let mean: [f64; ROWS_AT_ONCE] = std::array::from_fn(|r| sum[r] / width as f64);
            let mut sq = [0f64; ROWS_AT_ONCE];
            for k in 0..width {
                for (r, s) in sq.iter_mut().enumerate().take(n) {
                    *s += (group[r * width + k] as f64 - mean[r]).powi(2);
                }
            }
            let inv: [f64; ROWS_AT_ONCE] =
                std::array::from_fn(|r| 1.0 / (sq[r] / width as f64 + eps).sqrt());
            for (r, row) in group.chunks_exact_mut(width).enumerate() {
                let (m, i) = (mean[r], inv[r]);
                match affine {
                    Some((scale, bias)) => {
                        for (k, x) in row.iter_mut().enumerate() {
                            let y = ((*x as f64 - m) * i) as f32;
                            *x = y * scale[k] + bias.map_or(0.0, |b| b[k]);
                        }
                    }
                    None => row
                        .iter_mut()
                        .for_each(|x| *x = ((*x as f64 - m) * i) as f32),
                }
            }
            (0..n).map(move |r| (mean[r] as f32, inv[r] as f32))
        })
        .collect();
    stats.into_iter().unzip()
}

/// Each row of `width` f32 values normalized in place as ONNX Runtime's CPU LayerNorm
/// (`simplified`: RMS norm) computes it, bit for bit (`ort_norm`); returns each row's mean and
/// 1/d.
pub(crate) fn ort_rows(
    v: &mut [f32],
    width: usize,
    scale: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    simplified: bool,
) -> (Vec<f32>, Vec<f32>) {
    if width == 0 {
        return (Vec::new(), Vec::new());
    }
    v.par_chunks_mut(width)
        .map(|row| super::ort_norm::layer_norm_row(row, scale, bias, eps, simplified))
        .unzip()
}

fn layer_norm(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let scale = input(inputs, 1)?;
    let bias = opt_input(inputs, 2);
    let attrs = ctx.attrs::<NormAttrs>()?;
    let axis = norm_axis(attrs.axis, x.rank())?;
    let eps = attrs.epsilon;
    let width: usize = x.shape()[axis..].iter().product();
    let inner = &x.shape()[axis..];
    let mut v = floats(x, "X")?;
    let bcast = |t: &Tensor, what: &str| -> Result<Vec<f32>, OpError> {
        let tv = floats(t, what)?;
        let shape = super::util::broadcast_shapes(&[t.shape(), inner])?;
        if shape != inner {
            return Err(OpError(format!(
                "{what} {:?} does not broadcast to {inner:?}",
                t.shape()
            )));
        }
        Ok(super::util::broadcast_to(&tv, t.shape(), inner))
    };
    let s = bcast(scale, "Scale")?;
    let b = match bias {
        Some(b) => Some(bcast(b, "B")?),
        None => None,
    };
    let (mean, inv) = if x.dtype() == crate::tensor::DType::F32 {
        ort_rows(&mut v, width, &s, b.as_deref(), eps as f32, false)
    } else {
        normalize_rows(&mut v, width, eps, Some((&s, b.as_deref())))
    };
    let mut stat_shape = x.shape().to_vec();
    for d in stat_shape.iter_mut().skip(axis) {
        *d = 1;
    }
    let mut outs = vec![back(Tensor::from_f32(x.shape().to_vec(), v), x.dtype())];
    if ctx.node.outputs.len() > 1 {
        outs.push(Tensor::from_f32(stat_shape.clone(), mean));
    }
    if ctx.node.outputs.len() > 2 {
        outs.push(Tensor::from_f32(stat_shape, inv));
    }
    Ok(outs)
}

/// `scale` broadcast to `inner` (the normalized dims), as LayerNormalization's scale and bias.
fn broadcast_param(t: &Tensor, what: &str, inner: &[usize]) -> Result<Vec<f32>, OpError> {
    let tv = floats(t, what)?;
    let shape = super::util::broadcast_shapes(&[t.shape(), inner]).ok();
    if shape.as_deref() != Some(inner) {
        return Err(OpError(format!(
            "{what} {:?} does not broadcast to the normalized dimensions {inner:?}",
            t.shape()
        )));
    }
    Ok(super::util::broadcast_to(&tv, t.shape(), inner))
}

/// RMSNormalization (opset 23): `X / sqrt(mean(X², axes axis..) + epsilon) * scale`; float32
/// as ONNX Runtime computes it (`ort_norm`), other types with the mean of squares in f64.
fn rms_norm(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let scale = input(inputs, 1)?;
    let attrs = ctx.attrs::<NormAttrs>()?;
    let axis = norm_axis(attrs.axis, x.rank())?;
    let eps = attrs.epsilon;
    let stash = attrs.stash_type;
    if stash != 1 {
        return Err(OpError(format!(
            "stash_type {stash} is not supported (only 1, float32)"
        )));
    }
    let inner = &x.shape()[axis..];
    let width: usize = inner.iter().product();
    let s = broadcast_param(scale, "scale", inner)?;
    let mut v = floats(x, "X")?;
    if x.dtype() == crate::tensor::DType::F32 {
        ort_rows(&mut v, width, &s, None, eps as f32, true);
    } else if width > 0 {
        v.par_chunks_mut(width).for_each(|row| {
            let ms = row.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / width as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            for (x, &si) in row.iter_mut().zip(&s) {
                *x = ((*x as f64 * inv) as f32) * si;
            }
        });
    }
    Ok(vec![back(
        Tensor::from_f32(x.shape().to_vec(), v),
        x.dtype(),
    )])
}

/// MeanVarianceNormalization: `(X - mean) / (sqrt(var) + 1e-9)` over `axes` (default
/// `[0, 2, 3]`), statistics in f64.
fn mvn(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let axes = norm_axes(&ctx.attrs::<NormAttrs>()?.axes, x.rank())?;
    let shape = x.shape();
    // Each element's statistics slot: its index with the reduced dims dropped.
    let mut red = shape.to_vec();
    for &a in &axes {
        red[a] = 1;
    }
    let st = crate::tensor::strides_of(&red);
    let groups: usize = red.iter().product();
    let n = x.len();
    let count = n.checked_div(groups).unwrap_or(0);
    let mut slot = vec![0usize; n];
    let mut idx = vec![0usize; shape.len()];
    for s in slot.iter_mut() {
        *s = idx
            .iter()
            .zip(&red)
            .zip(&st)
            .map(|((&i, &r), &k)| if r == 1 { 0 } else { i * k })
            .sum();
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    let mut v = floats(x, "X")?;
    let mut mean = vec![0f64; groups];
    for (&xi, &g) in v.iter().zip(&slot) {
        mean[g] += xi as f64;
    }
    mean.iter_mut().for_each(|m| *m /= count as f64);
    let mut var = vec![0f64; groups];
    for (&xi, &g) in v.iter().zip(&slot) {
        var[g] += (xi as f64 - mean[g]).powi(2);
    }
    var.iter_mut().for_each(|m| *m /= count as f64);
    for (xi, &g) in v.iter_mut().zip(&slot) {
        *xi = ((*xi as f64 - mean[g]) / (var[g].sqrt() + 1e-9)) as f32;
    }
    Ok(vec![back(Tensor::from_f32(shape.to_vec(), v), x.dtype())])
}

fn instance_norm(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    if x.rank() < 3 {
        return Err(OpError(format!(
            "input must have rank >= 3, got {:?}",
            x.shape()
        )));
    }
    let c = x.shape()[1];
    let scale = floats(input(inputs, 1)?, "scale")?;
    let bias = floats(input(inputs, 2)?, "B")?;
    if scale.len() != c || bias.len() != c {
        return Err(OpError(format!("scale and B must have {c} values")));
    }
    let eps = ctx.attrs::<NormAttrs>()?.epsilon;
    let sp: usize = x.shape()[2..].iter().product();
    let mut v = floats(x, "X")?;
    normalize_rows(&mut v, sp, eps, None);
    if sp > 0 {
        v.par_chunks_mut(sp).enumerate().for_each(|(i, plane)| {
            let (s, b) = (scale[i % c], bias[i % c]);
            plane.iter_mut().for_each(|p| *p = *p * s + b);
        });
    }
    Ok(vec![back(
        Tensor::from_f32(x.shape().to_vec(), v),
        x.dtype(),
    )])
}

fn group_norm(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    if x.rank() < 3 {
        return Err(OpError(format!(
            "input must have rank >= 3, got {:?}",
            x.shape()
        )));
    }
    let attrs = ctx.attrs::<NormAttrs>()?;
    let groups = attrs.num_groups;
    let c = x.shape()[1];
    if groups < 1 || c % groups as usize != 0 {
        return Err(OpError(format!("{c} channels cannot form {groups} groups")));
    }
    let groups = groups as usize;
    let scale = floats(input(inputs, 1)?, "scale")?;
    let bias = floats(input(inputs, 2)?, "bias")?;
    // Opset 18 has per-group scale/bias; opset 21 per-channel.
    let per_channel = scale.len() == c;
    if !(per_channel || scale.len() == groups) || bias.len() != scale.len() {
        return Err(OpError(format!(
            "scale/bias must have {c} (or {groups}) values"
        )));
    }
    let eps = attrs.epsilon;
    let sp: usize = x.shape()[2..].iter().product();
    let cpg = c / groups;
    let mut v = floats(x, "X")?;
    normalize_rows(&mut v, cpg * sp, eps, None);
    if sp > 0 {
        v.par_chunks_mut(sp).enumerate().for_each(|(i, plane)| {
            let ch = i % c;
            let k = if per_channel { ch } else { ch / cpg };
            plane.iter_mut().for_each(|p| *p = *p * scale[k] + bias[k]);
        });
    }
    Ok(vec![back(
        Tensor::from_f32(x.shape().to_vec(), v),
        x.dtype(),
    )])
}

fn lp_norm(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let attrs = ctx.attrs::<NormAttrs>()?;
    let axis = norm_axis(attrs.axis, x.rank())?;
    let p = attrs.p;
    if p != 1 && p != 2 {
        return Err(OpError(format!("p must be 1 or 2, got {p}")));
    }
    let shape = x.shape();
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut v = floats(x, "X")?;
    for o in 0..outer {
        for i in 0..inner {
            let idx = |k: usize| (o * len + k) * inner + i;
            let norm: f64 = if p == 1 {
                (0..len).map(|k| (v[idx(k)] as f64).abs()).sum()
            } else {
                (0..len)
                    .map(|k| (v[idx(k)] as f64).powi(2))
                    .sum::<f64>()
                    .sqrt()
            };
            if norm > 0.0 {
                for k in 0..len {
                    v[idx(k)] = (v[idx(k)] as f64 / norm) as f32;
                }
            }
        }
    }
    Ok(vec![back(Tensor::from_f32(shape.to_vec(), v), x.dtype())])
}

/// LRN's attributes (`size` required, odd or even, >= 1).
#[derive(Clone, Debug, PartialEq)]
pub struct LrnAttrs {
    pub alpha: f32,
    pub beta: f32,
    pub bias: f32,
    pub size: usize,
}

impl LrnAttrs {
    fn parse(node: &crate::graph::Node) -> Result<LrnAttrs, AttrError> {
        let a = Attrs::new(node);
        let size = a.required_int("size")?;
        if size < 1 {
            return Err(AttrError::new("size", format!("must be >= 1, got {size}")));
        }
        Ok(LrnAttrs {
            alpha: a.float_or("alpha", 1e-4)?,
            beta: a.float_or("beta", 0.75)?,
            bias: a.float_or("bias", 1.0)?,
            size: size as usize,
        })
    }
}

/// Local response normalization across channels (AlexNet, GoogLeNet):
/// `y = x · (bias + alpha/size · Σ x²)^(−beta)`, the sum over channels
/// `c − ⌊(size−1)/2⌋ ..= c + ⌈(size−1)/2⌉` inside `[0, C)`. Computed as ONNX Runtime's CPU
/// kernel does, in f32 with a running sum over channels (the next channel's square added, the
/// one leaving the window subtracted), so an infinite square makes NaN (`inf − inf`) in the
/// channels after it as in ORT (docs/numerics.md).
fn lrn(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let at = ctx.attrs::<LrnAttrs>()?;
    if x.rank() < 3 {
        return Err(OpError(format!(
            "X must be [N, C, D1, ...], got shape {:?}",
            x.shape()
        )));
    }
    let xv = x
        .to_f32_vec()
        .ok_or_else(|| OpError(format!("X must be float, got {:?}", x.dtype())))?;
    let c = x.shape()[1];
    let inner: usize = x.shape()[2..].iter().product();
    let pre = (at.size - 1) / 2;
    let k = at.alpha / at.size as f32;
    let mut out = vec![0f32; xv.len()];
    out.par_chunks_mut(c * inner)
        .zip(xv.par_chunks(c * inner))
        .for_each(|(o, img)| {
            // Squares with `pre` zero channels before and `size − 1 − pre` after.
            let mut sq = vec![0f32; (c + at.size - 1) * inner];
            for (d, v) in sq[pre * inner..(pre + c) * inner].iter_mut().zip(img) {
                *d = v * v;
            }
            let mut scale = vec![at.bias; c * inner];
            for ch in 0..at.size {
                for (s, q) in scale[..inner].iter_mut().zip(&sq[ch * inner..]) {
                    *s += k * q;
                }
            }
            for ch in 1..c {
                let (prev, cur) = scale.split_at_mut(ch * inner);
                let cur = &mut cur[..inner];
                cur.copy_from_slice(&prev[(ch - 1) * inner..]);
                let head = &sq[(ch + at.size - 1) * inner..(ch + at.size) * inner];
                let tail = &sq[(ch - 1) * inner..ch * inner];
                for ((s, h), t) in cur.iter_mut().zip(head).zip(tail) {
                    *s += k * h;
                    *s += -k * t;
                }
            }
            for ((y, s), v) in o.iter_mut().zip(&scale).zip(img) {
                *y = s.powf(-at.beta) * v;
            }
        });
    Ok(vec![back(
        Tensor::from_f32(x.shape().to_vec(), out),
        x.dtype(),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Node;

    fn node(op: &str) -> Node {
        Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec!["y".into()],
            attrs: Default::default(),
            ..Default::default()
        }
    }

    #[test]
    fn layer_norm_rows() {
        let x = Tensor::from_f32(vec![2, 2], vec![1., 3., 10., 10.]);
        let s = Tensor::from_f32(vec![2], vec![1., 2.]);
        let b = Tensor::from_f32(vec![2], vec![0., 1.]);
        let n = node("LayerNormalization");
        let y = layer_norm(&OpCtx::new(&n, 17), &[Some(&x), Some(&s), Some(&b)])
            .unwrap()
            .remove(0);
        let v = y.as_f32().unwrap();
        assert!(
            (v[0] + 1.0).abs() < 1e-4 && (v[1] - 3.0).abs() < 1e-4,
            "{v:?}"
        );
        assert_eq!(&v[2..], &[0.0, 1.0]);
    }

    #[test]
    fn rms_norm_rows_and_errors() {
        let x = Tensor::from_f32(vec![2, 2], vec![3., 4., 0., 0.]);
        let s = Tensor::from_f32(vec![2], vec![1., 2.]);
        let mut n = node("RMSNormalization");
        n.attrs
            .insert("epsilon".into(), crate::graph::Attribute::Float(0.0));
        let ctx = OpCtx::new(&n, 23);
        let y = rms_norm(&ctx, &[Some(&x), Some(&s)]).unwrap().remove(0);
        // rms of (3, 4) is sqrt(12.5).
        let r = 12.5f32.sqrt();
        let v = y.as_f32().unwrap();
        assert!((v[0] - 3.0 / r).abs() < 1e-6 && (v[1] - 8.0 / r).abs() < 1e-6);
        // A zero row with epsilon 0 divides 0 by 0.
        assert!(v[2].is_nan());
        let bad = Tensor::from_f32(vec![3], vec![1.; 3]);
        let e = rms_norm(&ctx, &[Some(&x), Some(&bad)]).unwrap_err();
        assert!(e.0.contains("does not broadcast"), "{e}");
    }

    #[test]
    fn mvn_over_axes() {
        let x = Tensor::from_f32(vec![1, 2, 2, 1], vec![1., 10., 3., 30.]);
        let n = node("MeanVarianceNormalization");
        let y = mvn(&OpCtx::new(&n, 13), &[Some(&x)]).unwrap().remove(0);
        // Channel 0 holds (1, 10), channel 1 (3, 30): each becomes (-1, 1).
        let v = y.as_f32().unwrap();
        for (got, want) in v.iter().zip([-1., 1., -1., 1.]) {
            assert!((got - want).abs() < 1e-6, "{v:?}");
        }
    }

    /// Rows normalized eight at a time are, bit for bit, each row on its own: mean and
    /// variance summed in f64 in order, then the scale and bias (row counts around 8).
    #[test]
    fn rows_taken_together_are_normalized_as_each_on_its_own() {
        for (rows, width) in [(1usize, 5usize), (7, 33), (8, 256), (19, 100)] {
            let x: Vec<f32> = (0..rows * width)
                .map(|i| ((i * 37 % 1009) as f32 - 500.0) / 13.0)
                .collect();
            let scale: Vec<f32> = (0..width).map(|i| 0.5 + i as f32 / 64.0).collect();
            let bias: Vec<f32> = (0..width).map(|i| i as f32 / 32.0 - 1.0).collect();
            let mut want = x.clone();
            let mut want_stats = Vec::new();
            for row in want.chunks_mut(width) {
                let mean = row.iter().map(|&v| v as f64).sum::<f64>() / width as f64;
                let var =
                    row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / width as f64;
                let inv = 1.0 / (var + 1e-5).sqrt();
                for (k, v) in row.iter_mut().enumerate() {
                    *v = ((*v as f64 - mean) * inv) as f32 * scale[k] + bias[k];
                }
                want_stats.push((mean as f32, inv as f32));
            }
            let mut got = x.clone();
            let (mean, inv) = normalize_rows(&mut got, width, 1e-5, Some((&scale, Some(&bias))));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{rows}x{width}");
            let stats: Vec<(f32, f32)> = mean.into_iter().zip(inv).collect();
            assert_eq!(stats, want_stats);
        }
    }

    #[test]
    fn batch_norm_folds() {
        let x = Tensor::from_f32(vec![1, 2, 1], vec![2., 2.]);
        let one = |v: [f32; 2]| Tensor::from_f32(vec![2], v.to_vec());
        let n = node("BatchNormalization");
        let (s, b, m, var) = (one([1., 2.]), one([0., 1.]), one([1., 0.]), one([1., 4.]));
        let y = batch_norm(
            &OpCtx::new(&n, 15),
            &[Some(&x), Some(&s), Some(&b), Some(&m), Some(&var)],
        )
        .unwrap()
        .remove(0);
        let v = y.as_f32().unwrap();
        assert!((v[0] - 1.0 / (1.0f32 + 1e-5).sqrt()).abs() < 1e-6);
        assert!((v[1] - (2.0 * 2.0 / (4.0f32 + 1e-5).sqrt() + 1.0)).abs() < 1e-5);
    }

    #[test]
    fn bad_attributes_are_load_errors() {
        use crate::graph::Attribute;
        use crate::ops::attrs::testing::assert_rejected;
        assert_rejected("GroupNormalization", &[], "num_groups", "missing");
        assert_rejected(
            "GroupNormalization",
            &[("num_groups", Attribute::Int(0))],
            "num_groups",
            ">= 1",
        );
        assert_rejected(
            "LpNormalization",
            &[("p", Attribute::Int(3))],
            "p",
            "1 or 2",
        );
        assert_rejected(
            "LayerNormalization",
            &[("epsilon", Attribute::Int(0))],
            "epsilon",
            "expected a float, got an int",
        );
        assert_rejected(
            "LayerNormalization",
            &[("stash_type", Attribute::Int(99))],
            "stash_type",
            "99 is not an element type",
        );
    }
}
