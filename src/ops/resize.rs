//! Resize (opsets 10, 11, 13, 18, 19) and the older Upsample (7, 9).
//!
//! Semantics follow the ONNX spec and its reference implementation
//! (`onnx/reference/ops/op_resize.py`): every resized axis maps each output index to a source
//! coordinate (`coordinate_transformation_mode`), then reads one input element (`nearest`) or
//! a weighted window of them (`linear`, `cubic`, optionally antialiased). Interpolation is
//! separable, so linear and cubic run one pass per resized axis over precomputed per-axis
//! index/weight tables; nearest is a single gather over per-axis offset tables.
//!
//! Where the spec is silent or the reference differs from it:
//! - With `scales`, an output extent is `floor(in * scale)` (roi not applied), as the reference
//!   and onnxruntime compute it.
//! - `align_corners`, `tf_crop_and_resize` and `half_pixel_symmetric` use the fractional
//!   resized length `in * scale`, as the reference does (the conformance data depend on it:
//!   downsampling 4 by 0.6 with align_corners divides by 1.4, not 1; onnxruntime, which
//!   divides by the integer length, fails those tests).
//! - `pytorch_half_pixel` maps an output of length 1 to 0, as the spec and onnxruntime do (the
//!   reference maps a fractional length of exactly 1 to -0.5, onnx/onnx#4275; nearest and
//!   linear give the same value either way).
//! - Resize-10 and Upsample have no `nearest_mode` and use `asymmetric` coordinates; like
//!   onnxruntime they take floor when upsampling and ceil when downsampling an axis.
//! - `antialias` only affects linear and cubic (the reference rejects it for nearest; it is
//!   ignored there).
//! - Linear and cubic compute in f32 for f32/f16/bf16 inputs and in f64 for f64 and integer
//!   inputs; integer results round half to even and saturate (the reference's `saturate_cast`).

use super::attrs::{boxed, AttrError, Attrs};
use super::util::{input, norm_axes, opt_input};
use super::{OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::{DimFact, Fact};
use crate::op_bail;
use crate::tensor::{strides_of, DType, Tensor, TensorData};
use half::{bf16, f16};
use num_traits::Float;
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    r.add("Resize", resize);
    r.add("Upsample", upsample);
    use super::InputRole::{Data, Param};
    r.def_mut("Resize")
        .parse(|n, opset| boxed(ResizeAttrs::parse(n, opset)))
        .roles(&[Data, Param, Param, Param])
        .infer(resize_facts);
    r.def_mut("Upsample")
        .parse(|n, opset| boxed(ResizeAttrs::parse(n, opset)))
        .roles(&[Data, Param])
        .infer(resize_facts);
}

/// Resize's and Upsample's attributes, validated for the node's opset.
#[derive(Clone, Debug)]
pub struct ResizeAttrs {
    /// Mode, coordinate transformation, nearest rounding, cubic coefficient, antialias...
    params: Params,
    /// The resized axes (Resize-18 and later).
    axes: Option<Vec<i64>>,
    /// `keep_aspect_ratio_policy` (Resize-18 and later; stretch before).
    policy: AspectPolicy,
    /// Upsample-7's `scales` attribute.
    scales: Option<Vec<f64>>,
}

impl ResizeAttrs {
    fn parse(node: &crate::graph::Node, opset: i64) -> Result<ResizeAttrs, AttrError> {
        let a = Attrs::new(node);
        let mut attrs = ResizeAttrs {
            params: Params::legacy(Mode::Nearest),
            axes: None,
            policy: AspectPolicy::Stretch,
            scales: None,
        };
        let modes: &[(&str, Mode)] = &[("nearest", Mode::Nearest), ("linear", Mode::Linear)];
        if node.op_type == "Upsample" {
            let modes = [modes, &[("bilinear", Mode::Linear)]].concat();
            attrs.params = Params::legacy(a.choice("mode", Mode::Nearest, &modes)?);
            if opset < 9 {
                let s = a
                    .floats("scales")?
                    .ok_or_else(|| AttrError::new("scales", "missing (Upsample-7 needs it)"))?;
                attrs.scales = Some(s.iter().map(|&v| v as f64).collect());
            }
            return Ok(attrs);
        }
        if opset < 11 {
            attrs.params = Params::legacy(a.choice("mode", Mode::Nearest, modes)?);
            return Ok(attrs);
        }
        let modes = [modes, &[("cubic", Mode::Cubic)]].concat();
        attrs.params = Params {
            mode: a.choice("mode", Mode::Nearest, &modes)?,
            coord: a.choice(
                "coordinate_transformation_mode",
                Coord::HalfPixel,
                &[
                    ("half_pixel", Coord::HalfPixel),
                    ("half_pixel_symmetric", Coord::HalfPixelSymmetric),
                    ("pytorch_half_pixel", Coord::PytorchHalfPixel),
                    ("align_corners", Coord::AlignCorners),
                    ("asymmetric", Coord::Asymmetric),
                    ("tf_half_pixel_for_nn", Coord::TfHalfPixelForNn),
                    ("tf_crop_and_resize", Coord::TfCropAndResize),
                ],
            )?,
            nearest: a.choice(
                "nearest_mode",
                NearestMode::RoundPreferFloor,
                &[
                    ("round_prefer_floor", NearestMode::RoundPreferFloor),
                    ("round_prefer_ceil", NearestMode::RoundPreferCeil),
                    ("floor", NearestMode::Floor),
                    ("ceil", NearestMode::Ceil),
                ],
            )?,
            cubic_a: a.float_or("cubic_coeff_a", -0.75)? as f64,
            exclude_outside: a.flag("exclude_outside", false)?,
            antialias: opset >= 18 && a.flag("antialias", false)?,
            extrapolation: a.float_or("extrapolation_value", 0.0)? as f64,
        };
        if opset >= 18 {
            attrs.axes = a.ints("axes")?;
            attrs.policy = a.choice(
                "keep_aspect_ratio_policy",
                AspectPolicy::Stretch,
                &[
                    ("stretch", AspectPolicy::Stretch),
                    ("not_larger", AspectPolicy::NotLarger),
                    ("not_smaller", AspectPolicy::NotSmaller),
                ],
            )?;
        }
        Ok(attrs)
    }
}

/// The output shape when X's shape and the scales or sizes are known; else X's rank.
fn resize_facts(ctx: &super::InferCtx, ins: &[Option<&Fact>]) -> super::shape::FactsResult {
    let x = super::shape::fact(ins, 0)?;
    let unknown = |rank: Option<usize>| {
        Ok(vec![match rank {
            Some(r) => super::shape::unknown_dims(ctx, x.dtype, r),
            None => Fact::new(x.dtype, None),
        }])
    };
    let Some(shape) = x.known_shape() else {
        return unknown(x.rank());
    };
    let node = ctx.node;
    let attrs = ctx.attrs::<ResizeAttrs>()?;
    let floats = |i: usize| -> Option<Option<Vec<f64>>> {
        match super::shape::opt_fact(ins, i) {
            None => Some(None),
            Some(f)
                if f.known_shape()
                    .is_some_and(|s| s.iter().product::<usize>() == 0) =>
            {
                Some(None)
            }
            Some(f) => f.value.as_ref().and_then(|t| t.to_f64_vec()).map(Some),
        }
    };
    let all_axes: Vec<usize> = (0..shape.len()).collect();
    let specs = if node.op_type == "Upsample" || ctx.opset < 11 {
        let scales = if ctx.opset < 9 && node.op_type == "Upsample" {
            attrs.scales.clone()
        } else {
            floats(1).flatten()
        };
        match scales {
            Some(s) => specs_from_scales(&shape, &all_axes, &s)?,
            None => return unknown(Some(shape.len())),
        }
    } else {
        let axes = match &attrs.axes {
            Some(a) => norm_axes(a, shape.len())?,
            None => all_axes,
        };
        let sizes = match super::shape::opt_fact(ins, 3) {
            None => Some(None),
            Some(f)
                if f.known_shape()
                    .is_some_and(|s| s.iter().product::<usize>() == 0) =>
            {
                Some(None)
            }
            Some(f) => f.int_values().map(Some),
        };
        match (floats(2), sizes) {
            (Some(Some(s)), Some(None)) => specs_from_scales(&shape, &axes, &s)?,
            (Some(None), Some(Some(s))) => specs_from_sizes(&shape, &axes, &s, attrs.policy)?,
            (Some(None), Some(None)) => {
                return Err(OpError(
                    "one of 'scales' and 'sizes' is required (both are empty or omitted)".into(),
                ))
            }
            _ => return unknown(Some(shape.len())),
        }
    };
    Ok(vec![Fact::typed(
        x.dtype.unwrap_or(DType::F32),
        specs.iter().map(|s| DimFact::known(s.out_len)).collect(),
    )])
}

/// Outputs with at least this many elements are computed on the rayon pool.
const PARALLEL_MIN: usize = 1 << 15;
/// Rough number of output elements each parallel task handles.
const TASK_ELEMS: usize = 1 << 12;
/// Offset-table entry of an extrapolated position (tf_crop_and_resize outside the input).
const MISSING: usize = usize::MAX;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Coord {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfHalfPixelForNn,
    TfCropAndResize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Resize-10 and Upsample: floor when upsampling an axis, ceil when downsampling it.
    Legacy,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum AspectPolicy {
    Stretch,
    NotLarger,
    NotSmaller,
}

#[derive(Clone, Copy, Debug)]
struct Params {
    mode: Mode,
    coord: Coord,
    nearest: NearestMode,
    cubic_a: f64,
    exclude_outside: bool,
    antialias: bool,
    extrapolation: f64,
}

impl Params {
    /// Resize-10 and Upsample: only a mode, asymmetric coordinates.
    fn legacy(mode: Mode) -> Params {
        Params {
            mode,
            coord: Coord::Asymmetric,
            nearest: NearestMode::Legacy,
            cubic_a: -0.75,
            exclude_outside: false,
            antialias: false,
            extrapolation: 0.0,
        }
    }
}

/// How one axis is resampled.
#[derive(Clone, Copy, Debug)]
struct AxisSpec {
    in_len: usize,
    out_len: usize,
    scale: f64,
    /// Normalised (start, end) of the region of interest (tf_crop_and_resize only).
    roi: (f64, f64),
}

impl AxisSpec {
    fn unchanged(len: usize) -> AxisSpec {
        AxisSpec {
            in_len: len,
            out_len: len,
            scale: 1.0,
            roi: (0.0, 1.0),
        }
    }

    /// Whether the axis is copied as is (the reference skips these axes too).
    fn is_identity(&self, coord: Coord) -> bool {
        is_close(self.scale, 1.0)
            && self.out_len == self.in_len
            && (coord != Coord::TfCropAndResize || (self.roi.0 == 0.0 && is_close(self.roi.1, 1.0)))
    }
}

/// Python's `math.isclose` with its default tolerance.
fn is_close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

// ---------------------------------------------------------------------------------------------
// Kernels: argument parsing.

fn resize(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<ResizeAttrs>()?;
    let x = input(inputs, 0)?;
    let all_axes: Vec<usize> = (0..x.rank()).collect();
    if ctx.opset < 11 {
        if inputs.len() != 2 {
            op_bail!(
                "Resize-{} takes 2 inputs (X, scales), got {}",
                ctx.opset,
                inputs.len()
            );
        }
        let scales = float_list(input(inputs, 1)?, "scales")?;
        let specs = specs_from_scales(x.shape(), &all_axes, &scales)?;
        return run(x, &attrs.params, &specs, &all_axes);
    }
    if inputs.is_empty() || inputs.len() > 4 {
        op_bail!(
            "Resize takes 1 to 4 inputs (X, roi, scales, sizes), got {}",
            inputs.len()
        );
    }
    let params = attrs.params;
    let axes = match &attrs.axes {
        Some(a) => norm_axes(a, x.rank())?,
        None => all_axes,
    };
    let roi = present(opt_input(inputs, 1));
    let scales = present(opt_input(inputs, 2));
    let sizes = present(opt_input(inputs, 3));
    let mut specs = match (scales, sizes) {
        (Some(_), Some(_)) => {
            op_bail!("only one of 'scales' and 'sizes' may be given (the other must be empty or omitted)")
        }
        (None, None) => {
            op_bail!("one of 'scales' and 'sizes' is required (both are empty or omitted)")
        }
        (Some(s), None) => specs_from_scales(x.shape(), &axes, &float_list(s, "scales")?)?,
        (None, Some(s)) => {
            specs_from_sizes(x.shape(), &axes, &int_list(s, "sizes")?, attrs.policy)?
        }
    };
    if params.coord == Coord::TfCropAndResize {
        let roi = match roi {
            Some(r) => float_list(r, "roi")?,
            None => {
                op_bail!("coordinate_transformation_mode 'tf_crop_and_resize' needs input 'roi'")
            }
        };
        if roi.len() != 2 * axes.len() {
            op_bail!(
                "roi has {} values, expected {} (start and end for each of {} axes)",
                roi.len(),
                2 * axes.len(),
                axes.len()
            );
        }
        for (i, &a) in axes.iter().enumerate() {
            specs[a].roi = (roi[i], roi[axes.len() + i]);
        }
    }
    run(x, &params, &specs, &axes)
}

fn upsample(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<ResizeAttrs>()?;
    let x = input(inputs, 0)?;
    let scales: Vec<f64> = if ctx.opset < 9 {
        if inputs.len() != 1 {
            op_bail!(
                "Upsample-{} takes 1 input (X), got {}",
                ctx.opset,
                inputs.len()
            );
        }
        match &attrs.scales {
            Some(s) => s.clone(),
            None => op_bail!("Upsample-{} needs attribute 'scales'", ctx.opset),
        }
    } else {
        if inputs.len() != 2 {
            op_bail!(
                "Upsample-{} takes 2 inputs (X, scales), got {}",
                ctx.opset,
                inputs.len()
            );
        }
        float_list(input(inputs, 1)?, "scales")?
    };
    let all_axes: Vec<usize> = (0..x.rank()).collect();
    let specs = specs_from_scales(x.shape(), &all_axes, &scales)?;
    run(x, &attrs.params, &specs, &all_axes)
}

/// An optional input, None when omitted or empty (an empty tensor means "not given").
fn present(t: Option<&Tensor>) -> Option<&Tensor> {
    t.filter(|t| !t.is_empty())
}

fn float_list(t: &Tensor, name: &str) -> Result<Vec<f64>, OpError> {
    if !t.dtype().is_float() {
        op_bail!("'{name}' has dtype {}, expected a float tensor", t.dtype());
    }
    t.to_f64_vec()
        .ok_or_else(|| OpError(format!("'{name}' is not numeric")))
}

fn int_list(t: &Tensor, name: &str) -> Result<Vec<i64>, OpError> {
    if !t.dtype().is_int() {
        op_bail!("'{name}' has dtype {}, expected int64", t.dtype());
    }
    t.to_i64_vec()
        .ok_or_else(|| OpError(format!("'{name}' is not numeric")))
}

fn specs_from_scales(
    shape: &[usize],
    axes: &[usize],
    scales: &[f64],
) -> Result<Vec<AxisSpec>, OpError> {
    if scales.len() != axes.len() {
        op_bail!(
            "'scales' has {} values, expected {} (one per resized axis of input {shape:?})",
            scales.len(),
            axes.len()
        );
    }
    let mut specs: Vec<AxisSpec> = shape.iter().map(|&d| AxisSpec::unchanged(d)).collect();
    for (&a, &s) in axes.iter().zip(scales) {
        if !(s > 0.0 && s.is_finite()) {
            op_bail!("scale {s} for axis {a} must be a positive finite number");
        }
        let out = (s * shape[a] as f64).floor();
        if out > (u32::MAX as f64) {
            op_bail!("scale {s} makes axis {a} of length {} too large", shape[a]);
        }
        specs[a].scale = s;
        specs[a].out_len = out as usize;
    }
    Ok(specs)
}

fn specs_from_sizes(
    shape: &[usize],
    axes: &[usize],
    sizes: &[i64],
    policy: AspectPolicy,
) -> Result<Vec<AxisSpec>, OpError> {
    if sizes.len() != axes.len() {
        op_bail!(
            "'sizes' has {} values, expected {} (one per resized axis of input {shape:?})",
            sizes.len(),
            axes.len()
        );
    }
    let mut specs: Vec<AxisSpec> = shape.iter().map(|&d| AxisSpec::unchanged(d)).collect();
    for (&a, &size) in axes.iter().zip(sizes) {
        if !(0..=u32::MAX as i64).contains(&size) {
            op_bail!("size {size} for axis {a} is out of range");
        }
        let size = size as usize;
        if shape[a] == 0 {
            if size != 0 {
                op_bail!("axis {a} is empty and cannot be resized to {size}");
            }
            continue;
        }
        specs[a].out_len = size;
        specs[a].scale = size as f64 / shape[a] as f64;
    }
    if policy != AspectPolicy::Stretch {
        let pick = |acc: f64, s: f64| match policy {
            AspectPolicy::NotLarger => acc.min(s),
            _ => acc.max(s),
        };
        let scale = axes
            .iter()
            .filter(|&&a| shape[a] != 0)
            .map(|&a| specs[a].scale)
            .reduce(pick);
        if let Some(scale) = scale {
            for &a in axes {
                if shape[a] != 0 {
                    specs[a].scale = scale;
                    // round_int: halves round up.
                    specs[a].out_len = (scale * shape[a] as f64 + 0.5).floor() as usize;
                }
            }
        }
    }
    Ok(specs)
}

// ---------------------------------------------------------------------------------------------
// Coordinate mapping and filter windows.

/// The source coordinate of output index `y` along an axis.
fn source_coord(coord: Coord, s: &AxisSpec, y: usize) -> f64 {
    let y = y as f64;
    let in_f = s.in_len as f64;
    // The resized length before flooring, as the reference uses it.
    let resized = s.scale * in_f;
    match coord {
        Coord::HalfPixel => (y + 0.5) / s.scale - 0.5,
        Coord::HalfPixelSymmetric => {
            let adjustment = s.out_len as f64 / resized;
            let offset = in_f / 2.0 * (1.0 - adjustment);
            offset + (y + 0.5) / s.scale - 0.5
        }
        Coord::PytorchHalfPixel => {
            if s.out_len > 1 {
                (y + 0.5) / s.scale - 0.5
            } else {
                0.0
            }
        }
        Coord::AlignCorners => {
            if resized == 1.0 {
                0.0
            } else {
                y * (in_f - 1.0) / (resized - 1.0)
            }
        }
        Coord::Asymmetric => y / s.scale,
        Coord::TfHalfPixelForNn => (y + 0.5) / s.scale,
        Coord::TfCropAndResize => {
            let (start, end) = s.roi;
            let v = if resized == 1.0 {
                (end - start) * (in_f - 1.0) / 2.0
            } else {
                y * (end - start) * (in_f - 1.0) / (resized - 1.0)
            };
            v + start * (in_f - 1.0)
        }
    }
}

/// Whether a source coordinate lies outside the input (only tf_crop_and_resize extrapolates).
fn extrapolated(coord: Coord, s: &AxisSpec, x: f64) -> bool {
    coord == Coord::TfCropAndResize && (x < 0.0 || x > s.in_len as f64 - 1.0)
}

/// The input index nearest to source coordinate `x`, clamped into the axis.
fn nearest_index(m: NearestMode, x: f64, s: &AxisSpec) -> usize {
    let fl = x.floor();
    let i = if x == fl {
        fl
    } else {
        let frac = x - fl;
        let up = match m {
            NearestMode::RoundPreferFloor => frac > 0.5,
            NearestMode::RoundPreferCeil => frac >= 0.5,
            NearestMode::Floor => false,
            NearestMode::Ceil => true,
            NearestMode::Legacy => s.scale < 1.0,
        };
        if up {
            fl + 1.0
        } else {
            fl
        }
    };
    // `max` maps NaN to 0.
    i.max(0.0).min(s.in_len.saturating_sub(1) as f64) as usize
}

/// First tap offset (relative to the sample left of the coordinate) and tap count.
fn window(p: &Params, scale: f64) -> (i64, usize) {
    let support = match p.mode {
        Mode::Cubic => 2.0,
        _ => 1.0,
    };
    let start = if p.antialias {
        // The filter is stretched by 1/scale when downsampling.
        (-support / scale.min(1.0)).floor() as i64 + 1
    } else {
        1 - support as i64
    };
    (start, (2 - 2 * start) as usize)
}

/// The filter weights for a coordinate `ratio` in (0, 1] right of sample `base`: `w[k]` is
/// the weight of sample `base + start + k`.
fn weights(p: &Params, scale: f64, start: i64, ratio: f64, w: &mut [f64]) {
    let a = p.cubic_a;
    match (p.mode, p.antialias) {
        (Mode::Linear, false) => {
            w[0] = 1.0 - ratio;
            w[1] = ratio;
        }
        (Mode::Cubic, false) => {
            // Keys' kernel at distances ratio+1, ratio, 1-ratio, 2-ratio (reference formulas).
            let r1 = ratio + 1.0;
            let c = 1.0 - ratio;
            let c1 = c + 1.0;
            w[0] = ((a * r1 - 5.0 * a) * r1 + 8.0 * a) * r1 - 4.0 * a;
            w[1] = ((a + 2.0) * ratio - (a + 3.0)) * ratio * ratio + 1.0;
            w[2] = ((a + 2.0) * c - (a + 3.0)) * c * c + 1.0;
            w[3] = ((a * c1 - 5.0 * a) * c1 + 8.0 * a) * c1 - 4.0 * a;
        }
        (_, true) => {
            let s = scale.min(1.0);
            for (k, wk) in w.iter_mut().enumerate() {
                let d = (start + k as i64) as f64 - ratio;
                *wk = if p.mode == Mode::Linear {
                    (1.0 - (d * s).abs()).clamp(0.0, 1.0)
                } else {
                    cubic_kernel((s * d).abs(), a)
                };
            }
            normalise(w);
        }
        // Nearest reads one sample and never asks for weights.
        (Mode::Nearest, false) => {}
    }
}

fn cubic_kernel(x: f64, a: f64) -> f64 {
    let x2 = x * x;
    let x3 = x * x2;
    if x <= 1.0 {
        (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
    } else if x < 2.0 {
        a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
    } else {
        0.0
    }
}

/// Scales `w` to sum to 1 (left as is when it sums to 0).
fn normalise(w: &mut [f64]) {
    let sum: f64 = w.iter().sum();
    if sum != 0.0 {
        for v in w {
            *v /= sum;
        }
    }
}

/// Per-axis interpolation tables: for output `o`, taps `o*n..(o+1)*n` of `idx`/`w`.
struct Taps<T> {
    n: usize,
    idx: Vec<usize>,
    w: Vec<T>,
    extrap: Vec<bool>,
}

fn build_taps<T: Float>(p: &Params, s: &AxisSpec) -> Taps<T> {
    let (start, n) = window(p, s.scale);
    let last = s.in_len as i64 - 1;
    let mut idx = Vec::with_capacity(s.out_len * n);
    let mut w = Vec::with_capacity(s.out_len * n);
    let mut extrap = Vec::with_capacity(s.out_len);
    let mut wk = vec![0f64; n];
    for y in 0..s.out_len {
        let x = source_coord(p.coord, s, y);
        extrap.push(extrapolated(p.coord, s, x));
        // The sample left of x and x's offset from it, in (0, 1]: an integer coordinate
        // counts as 1 right of its left neighbour, as in the reference.
        let fl = x.floor();
        let (base, ratio) = if x == fl {
            ((fl as i64).saturating_sub(1), 1.0)
        } else {
            (fl as i64, x - fl)
        };
        weights(p, s.scale, start, ratio, &mut wk);
        let first = base.saturating_add(start);
        if p.exclude_outside {
            for (k, v) in wk.iter_mut().enumerate() {
                let i = first.saturating_add(k as i64);
                if i < 0 || i > last {
                    *v = 0.0;
                }
            }
            normalise(&mut wk);
        }
        for (k, &v) in wk.iter().enumerate() {
            // Samples past the edges repeat the edge (the reference pads in 'edge' mode).
            idx.push(first.saturating_add(k as i64).clamp(0, last) as usize);
            w.push(T::from(v).unwrap_or_else(T::nan));
        }
    }
    Taps { n, idx, w, extrap }
}

// ---------------------------------------------------------------------------------------------
// Execution.

/// Resamples `x`; linear and cubic resize the axes in `order` (the reference's order, which
/// decides only rounding), every other axis being unchanged.
fn run(x: &Tensor, p: &Params, specs: &[AxisSpec], order: &[usize]) -> OpResult {
    let out_shape: Vec<usize> = specs.iter().map(|s| s.out_len).collect();
    let count = super::util::checked_len(&out_shape)?;
    if count == 0 {
        return Ok(vec![Tensor::zeros(x.dtype(), out_shape)]);
    }
    let data = match p.mode {
        Mode::Nearest => nearest(x, p, specs, &out_shape)?,
        Mode::Linear | Mode::Cubic => interpolate(x, p, specs, order)?,
    };
    Ok(vec![Tensor::from_parts(out_shape, data)])
}

/// Calls `f(row_number, row)` for every `row_len`-long row of `out`, on the rayon pool when
/// the output is large.
fn for_rows<T: Send>(out: &mut [T], row_len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if out.len() < PARALLEL_MIN || out.len() == row_len {
        for (r, row) in out.chunks_mut(row_len).enumerate() {
            f(r, row);
        }
        return;
    }
    let per_task = (TASK_ELEMS / row_len).max(1);
    out.par_chunks_mut(row_len * per_task)
        .enumerate()
        .for_each(|(t, chunk)| {
            for (j, row) in chunk.chunks_mut(row_len).enumerate() {
                f(t * per_task + j, row);
            }
        });
}

fn nearest(
    x: &Tensor,
    p: &Params,
    specs: &[AxisSpec],
    out_shape: &[usize],
) -> Result<TensorData, OpError> {
    // Per axis: the input offset (index * stride) each output index reads, or MISSING.
    let strides = strides_of(x.shape());
    let tables: Vec<Vec<usize>> = specs
        .iter()
        .zip(&strides)
        .map(|(s, &st)| {
            if s.is_identity(p.coord) {
                return (0..s.out_len).map(|i| i * st).collect();
            }
            (0..s.out_len)
                .map(|y| {
                    let c = source_coord(p.coord, s, y);
                    if extrapolated(p.coord, s, c) {
                        MISSING
                    } else {
                        nearest_index(p.nearest, c, s) * st
                    }
                })
                .collect()
        })
        .collect();
    let fill = match x.dtype() {
        DType::Str => TensorData::Str(vec![String::new()].into()),
        dt => from_f64(dt, vec![p.extrapolation])
            .ok_or_else(|| OpError(format!("dtype {dt} is not supported")))?,
    };
    if let (TensorData::F32(src), true) = (x.data(), tables.iter().all(|t| !t.contains(&MISSING))) {
        if let Some(out) = repeat_planes_f32(src, x.shape(), out_shape, &tables) {
            return Ok(TensorData::F32(out.into()));
        }
        return Ok(TensorData::F32(
            gather_rows_f32(src, out_shape, &tables).into(),
        ));
    }
    macro_rules! by_dtype {
        ($($v:ident),*) => {
            match (x.data(), fill) {
                $((TensorData::$v(src), TensorData::$v(f)) => {
                    TensorData::$v(gather_nd(src, out_shape, &tables, f[0].clone()).into())
                })*
                _ => op_bail!("dtype {} is not supported", x.dtype()),
            }
        };
    }
    Ok(by_dtype!(
        F32, F64, F16, BF16, I8, U8, I16, U16, I32, U32, I64, U64, Bool, Str
    ))
}

/// How many times each input index repeats along an axis whose offset table reads index
/// `i / f` (times `stride`) for output index i, the table of an integer upsampling (nearest,
/// floor, asymmetric or half-pixel coordinates: YOLO's and FPNs' ×2 Upsample): f, or None.
fn repeat_factor(table: &[usize], in_len: usize, stride: usize) -> Option<usize> {
    let f = table.len() / in_len.max(1);
    (f >= 1
        && f * in_len == table.len()
        && table.iter().enumerate().all(|(i, &t)| t == i / f * stride))
    .then_some(f)
}

/// [`gather_rows_f32`] where every axis but the last two is copied as it is and the last two
/// are integer upsamplings ([`repeat_factor`]): each input row is widened once (each value
/// written f times) and the widened row copied to the next rows it repeats into, plane by
/// plane, with no offset lookups (the gather took 0.8 ns a value on YOLOv8n's 5×5 → 10×10
/// planes, 3.6× ONNX Runtime's time). None where the tables are not of that form.
fn repeat_planes_f32(
    src: &[f32],
    in_shape: &[usize],
    out_shape: &[usize],
    tables: &[Vec<usize>],
) -> Option<Vec<f32>> {
    let r = out_shape.len();
    if r < 2 || in_shape.len() != r {
        return None;
    }
    let (ih, iw) = (in_shape[r - 2], in_shape[r - 1]);
    let (oh, ow) = (out_shape[r - 2], out_shape[r - 1]);
    let strides = strides_of(in_shape);
    let copied = (0..r - 2).all(|d| {
        in_shape[d] == out_shape[d]
            && tables[d]
                .iter()
                .enumerate()
                .all(|(i, &t)| t == i * strides[d])
    });
    if !copied || ih * iw == 0 {
        return None;
    }
    let fh = repeat_factor(&tables[r - 2], ih, iw)?;
    let fw = repeat_factor(&tables[r - 1], iw, 1)?;
    let (in_plane, out_plane) = (ih * iw, oh * ow);
    let n = out_plane * out_shape[..r - 2].iter().product::<usize>();
    #[cfg(target_arch = "x86_64")]
    let vectors = 16 % fw == 0 && std::arch::is_x86_feature_detected!("avx512f");
    let planes = |first: usize, out: &mut [f32]| {
        for (p, plane) in out.chunks_exact_mut(out_plane).enumerate() {
            let img = &src[(first + p) * in_plane..][..in_plane];
            #[cfg(target_arch = "x86_64")]
            if vectors {
                // SAFETY: the CPU has AVX-512F; fw divides 16; the plane holds ih·fh rows of
                // iw·fw values.
                unsafe { widen_plane_avx512(img, iw, fh, fw, plane) };
                continue;
            }
            for (rows, row) in plane.chunks_exact_mut(fh * ow).zip(img.chunks_exact(iw)) {
                let (wide, copies) = rows.split_at_mut(ow);
                for (values, &v) in wide.chunks_exact_mut(fw).zip(row) {
                    values.fill(v);
                }
                for copy in copies.chunks_exact_mut(ow) {
                    copy.copy_from_slice(wide);
                }
            }
        }
    };
    let per_task = (TASK_ELEMS / out_plane).max(1);
    // SAFETY: every plane is written whole below (each row widened or copied) before the
    // vector is returned.
    Some(unsafe {
        super::util::unzeroed_f32(n, |out| {
            let out = super::util::assume_written(out);
            if n < PARALLEL_MIN {
                planes(0, out);
            } else {
                out.par_chunks_mut(out_plane * per_task)
                    .enumerate()
                    .for_each(|(t, chunk)| planes(t * per_task, chunk));
            }
        })
    })
}

/// [`repeat_planes_f32`]'s plane in AVX-512 where fw divides 16: 16 / fw input values at a
/// time widened into a vector by one permute and stored fh times, once in each output row it
/// repeats into (the per-value fills and per-row copies were calls on runs of 10–40 values).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn widen_plane_avx512(img: &[f32], iw: usize, fh: usize, fw: usize, plane: &mut [f32]) {
    use std::arch::x86_64::*;
    let ow = iw * fw;
    assert!(16 % fw == 0 && img.len().is_multiple_of(iw) && plane.len() >= img.len() * fh * fw);
    let lanes: [i32; 16] = std::array::from_fn(|l| (l / fw) as i32);
    let spread = _mm512_loadu_si512(lanes.as_ptr().cast());
    for (r, row) in img.chunks_exact(iw).enumerate() {
        let out = plane.as_mut_ptr().add(r * fh * ow);
        for x0 in (0..ow).step_by(16) {
            let j0 = x0 / fw;
            // Lanes past the row's end are not read, nor stored.
            let v = _mm512_maskz_loadu_ps(crate::numeric::lanes16(j0, iw), row.as_ptr().add(j0));
            let wide = _mm512_permutexvar_ps(spread, v);
            let keep = crate::numeric::lanes16(x0, ow);
            for k in 0..fh {
                _mm512_mask_storeu_ps(out.add(k * ow + x0), keep, wide);
            }
        }
    }
}

/// [`gather_nd`] of float32 values where no table entry is MISSING (no extrapolation): the
/// output is not filled first, and a row that reads the same input row as the row before it
/// (an upsampled axis) is a copy of that row instead of a gather — YOLOv8n's and PP-OCRv4
/// det's nearest ×2…×8 upsamplings took 3.5× ONNX Runtime's time element by element.
fn gather_rows_f32(src: &[f32], out_shape: &[usize], tables: &[Vec<usize>]) -> Vec<f32> {
    let Some((&row_len, outer_shape)) = out_shape.split_last() else {
        return src.to_vec(); // a scalar
    };
    let n: usize = out_shape.iter().product();
    let last = &tables[out_shape.len() - 1];
    let reach = last.iter().max().copied().unwrap_or(0);
    let base_of = |r: usize| {
        let mut rem = r;
        let mut base = 0usize;
        for (d, &len) in outer_shape.iter().enumerate().rev() {
            base += tables[d][rem % len];
            rem /= len;
        }
        base
    };
    let gather = |first_row: usize, rows: &mut [f32]| {
        let mut previous = None;
        for j in 0..rows.len() / row_len {
            let base = base_of(first_row + j);
            assert!(base + reach < src.len());
            let (done, row) = rows.split_at_mut(j * row_len);
            let row = &mut row[..row_len];
            if previous == Some(base) {
                row.copy_from_slice(&done[(j - 1) * row_len..]);
                continue;
            }
            let from = &src[base..];
            for (d, &t) in row.iter_mut().zip(last) {
                *d = from[t];
            }
            previous = Some(base);
        }
    };
    let per_task = (TASK_ELEMS / row_len.max(1)).max(1);
    // SAFETY: every row is written below (gathered or copied) before the vector is returned.
    unsafe {
        super::util::unzeroed_f32(n, |out| {
            let out = super::util::assume_written(out);
            if n < PARALLEL_MIN || n == row_len {
                gather(0, out);
            } else {
                out.par_chunks_mut(row_len * per_task)
                    .enumerate()
                    .for_each(|(t, chunk)| gather(t * per_task, chunk));
            }
        })
    }
}

/// `out[o] = src[sum_d tables[d][o_d]]`, or `fill` where any table entry is MISSING.
fn gather_nd<T: Clone + Send + Sync>(
    src: &[T],
    out_shape: &[usize],
    tables: &[Vec<usize>],
    fill: T,
) -> Vec<T> {
    let Some((&row_len, outer_shape)) = out_shape.split_last() else {
        return src.to_vec(); // a scalar
    };
    let n: usize = out_shape.iter().product();
    let mut out = vec![fill; n];
    let last = &tables[out_shape.len() - 1];
    for_rows(&mut out, row_len, |r, row| {
        let mut rem = r;
        let mut base = 0usize;
        for (d, &len) in outer_shape.iter().enumerate().rev() {
            let t = tables[d][rem % len];
            if t == MISSING {
                return; // the row keeps the fill value
            }
            rem /= len;
            base += t;
        }
        for (dst, &t) in row.iter_mut().zip(last) {
            if t != MISSING {
                *dst = src[base + t].clone();
            }
        }
    });
    out
}

fn interpolate(
    x: &Tensor,
    p: &Params,
    specs: &[AxisSpec],
    order: &[usize],
) -> Result<TensorData, OpError> {
    let shape = x.shape();
    Ok(match x.data() {
        TensorData::F32(v) => TensorData::F32(interpolate_typed(v, shape, p, specs, order).into()),
        TensorData::F64(v) => TensorData::F64(interpolate_typed(v, shape, p, specs, order).into()),
        TensorData::F16(_) | TensorData::BF16(_) => {
            let v = x.to_f32_vec().unwrap_or_default();
            let r = interpolate_typed(&v, shape, p, specs, order);
            match x.dtype() {
                DType::F16 => TensorData::F16(r.into_iter().map(f16::from_f32).collect()),
                _ => TensorData::BF16(r.into_iter().map(bf16::from_f32).collect()),
            }
        }
        TensorData::Bool(_) | TensorData::Str(_) => op_bail!(
            "{:?} interpolation needs a numeric input, got dtype {}",
            p.mode,
            x.dtype()
        ),
        _ => {
            let v = x.to_f64_vec().unwrap_or_default();
            let r = interpolate_typed(&v, shape, p, specs, order);
            from_f64(x.dtype(), r)
                .ok_or_else(|| OpError(format!("dtype {} is not supported", x.dtype())))?
        }
    })
}

/// Linear or cubic resampling, one separable pass per resized axis.
fn interpolate_typed<T: Float + Send + Sync>(
    src: &[T],
    shape: &[usize],
    p: &Params,
    specs: &[AxisSpec],
    order: &[usize],
) -> Vec<T> {
    let fill = T::from(p.extrapolation).unwrap_or_else(T::nan);
    let mut dims = shape.to_vec();
    let mut cur: Option<Vec<T>> = None;
    for &a in order {
        let s = &specs[a];
        if s.is_identity(p.coord) {
            continue;
        }
        let outer: usize = dims[..a].iter().product();
        let inner: usize = dims[a + 1..].iter().product();
        let taps = build_taps::<T>(p, s);
        let next = pass(
            cur.as_deref().unwrap_or(src),
            outer,
            s.in_len,
            inner,
            &taps,
            fill,
        );
        dims[a] = s.out_len;
        cur = Some(next);
    }
    cur.unwrap_or_else(|| src.to_vec())
}

/// Resamples the middle axis of `src` viewed as `[outer, in_len, inner]`.
fn pass<T: Float + Send + Sync>(
    src: &[T],
    outer: usize,
    in_len: usize,
    inner: usize,
    taps: &Taps<T>,
    fill: T,
) -> Vec<T> {
    let out_len = taps.extrap.len();
    let mut dst = vec![T::zero(); outer * out_len * inner];
    if dst.is_empty() {
        return dst;
    }
    let n = taps.n;
    if inner == 1 {
        // Resampling the innermost axis: each output is a dot product of `n` gathered inputs.
        for_rows(&mut dst, out_len, |ob, out| {
            let line = &src[ob * in_len..(ob + 1) * in_len];
            let rows = out
                .iter_mut()
                .zip(taps.idx.chunks_exact(n))
                .zip(taps.w.chunks_exact(n))
                .zip(&taps.extrap);
            if n == 2 {
                for (((d, i), w), &ext) in rows {
                    *d = if ext {
                        fill
                    } else {
                        w[0] * line[i[0]] + w[1] * line[i[1]]
                    };
                }
            } else {
                for (((d, i), w), &ext) in rows {
                    *d = if ext {
                        fill
                    } else {
                        i.iter()
                            .zip(w)
                            .fold(T::zero(), |acc, (&i, &w)| acc + w * line[i])
                    };
                }
            }
        });
        return dst;
    }
    // Otherwise each output row of `inner` elements is a weighted sum of `n` input rows.
    let one_row = |ob: usize, o: usize, row: &mut [T]| {
        if taps.extrap[o] {
            row.fill(fill);
            return;
        }
        let block = &src[ob * in_len * inner..(ob + 1) * in_len * inner];
        let idx = &taps.idx[o * n..(o + 1) * n];
        let w = &taps.w[o * n..(o + 1) * n];
        for (k, (&i, &wk)) in idx.iter().zip(w).enumerate() {
            let s = &block[i * inner..(i + 1) * inner];
            if k == 0 {
                for (d, &v) in row.iter_mut().zip(s) {
                    *d = wk * v;
                }
            } else {
                for (d, &v) in row.iter_mut().zip(s) {
                    *d = *d + wk * v;
                }
            }
        }
    };
    if inner >= 16 {
        for_rows(&mut dst, inner, |r, row| {
            one_row(r / out_len, r % out_len, row)
        });
    } else {
        for_rows(&mut dst, out_len * inner, |ob, blk| {
            for (o, row) in blk.chunks_mut(inner).enumerate() {
                one_row(ob, o, row);
            }
        });
    }
    dst
}

/// Values computed in f64 stored as `dtype`: integers round half to even and saturate
/// (the reference's `saturate_cast`). None for strings.
fn from_f64(dtype: DType, v: Vec<f64>) -> Option<TensorData> {
    macro_rules! ints {
        ($t:ty) => {
            v.into_iter().map(|x| x.round_ties_even() as $t).collect()
        };
    }
    Some(match dtype {
        DType::F32 => TensorData::F32(v.into_iter().map(|x| x as f32).collect()),
        DType::F64 => TensorData::F64(v.into()),
        DType::F16 => TensorData::F16(v.into_iter().map(f16::from_f64).collect()),
        DType::BF16 => TensorData::BF16(v.into_iter().map(bf16::from_f64).collect()),
        DType::I8 => TensorData::I8(ints!(i8)),
        DType::U8 => TensorData::U8(ints!(u8)),
        DType::I16 => TensorData::I16(ints!(i16)),
        DType::U16 => TensorData::U16(ints!(u16)),
        DType::I32 => TensorData::I32(ints!(i32)),
        DType::U32 => TensorData::U32(ints!(u32)),
        DType::I64 => TensorData::I64(ints!(i64)),
        DType::U64 => TensorData::U64(ints!(u64)),
        DType::Bool => TensorData::Bool(v.into_iter().map(|x| x != 0.0).collect()),
        // Resize does not take strings or the low-bit storage types (ONNX's type constraints).
        DType::Str
        | DType::F8E4M3FN
        | DType::F8E4M3FNUZ
        | DType::F8E5M2
        | DType::F8E5M2FNUZ
        | DType::U4
        | DType::I4
        | DType::F4E2M1 => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Attribute, Node};

    fn node(op: &str, attrs: &[(&str, Attribute)]) -> Node {
        crate::graph::testing::node_with(op, attrs)
    }

    fn call(
        op: &str,
        opset: i64,
        attrs: &[(&str, Attribute)],
        inputs: &[Option<&Tensor>],
    ) -> OpResult {
        let n = node(op, attrs);
        let k = Registry::global().get("", op).unwrap();
        k(&OpCtx::new(&n, opset), inputs)
    }

    fn s(v: &str) -> Attribute {
        Attribute::String(v.into())
    }

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec())
    }

    fn assert_close(got: &Tensor, shape: &[usize], want: &[f32]) {
        assert_eq!(got.shape(), shape);
        let g = got.as_f32().unwrap();
        for (i, (a, b)) in g.iter().zip(want).enumerate() {
            assert!((a - b).abs() <= 1e-5, "element {i}: {a} != {b}");
        }
    }

    #[test]
    fn nearest_upsample_repeats() {
        let x = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let sc = f32s(&[4], &[1.0, 1.0, 2.0, 3.0]);
        let want = [
            1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 4.0, 4.0,
            4.0, 3.0, 3.0, 3.0, 4.0, 4.0, 4.0,
        ];
        let y = call("Upsample", 9, &[], &[Some(&x), Some(&sc)]).unwrap();
        assert_close(&y[0], &[1, 1, 4, 6], &want);
        // half_pixel (the default) maps 6 outputs onto 2 inputs the same way.
        let y = call("Resize", 13, &[], &[Some(&x), None, Some(&sc)]).unwrap();
        assert_close(&y[0], &[1, 1, 4, 6], &want);
    }

    /// Integer upsamplings of the last two axes are widened and copied plane by plane
    /// (`repeat_planes_f32`): each output the input at (y / fh, x / fw), over several images
    /// and channels, small and parallel (above PARALLEL_MIN values), under both coordinate
    /// modes whose tables are such repeats; other tables are not taken for one.
    #[test]
    fn integer_upsampling_repeats_every_value() {
        for (shape, fh, fw, mode) in [
            ([2usize, 3, 5, 7], 2usize, 3usize, ("asymmetric", "floor")),
            ([1, 128, 10, 10], 2, 2, ("asymmetric", "floor")),
            ([1, 2, 3, 4], 1, 4, ("half_pixel", "round_prefer_floor")),
            ([1, 256, 5, 5], 2, 2, ("half_pixel", "round_prefer_floor")),
            // Rows of whole and partial vectors: 23 inputs widened 2× (46 outputs), 4× and 8×.
            ([1, 3, 4, 23], 3, 2, ("asymmetric", "floor")),
            ([2, 2, 3, 23], 1, 4, ("asymmetric", "floor")),
            ([1, 1, 2, 9], 2, 8, ("half_pixel", "round_prefer_floor")),
        ] {
            let len: usize = shape.iter().product();
            let v: Vec<f32> = (0..len).map(|i| (i * 7 % 31) as f32 - 15.5).collect();
            let x = f32s(&shape, &v);
            let sc = f32s(&[4], &[1.0, 1.0, fh as f32, fw as f32]);
            let attrs = [
                ("coordinate_transformation_mode", s(mode.0)),
                ("nearest_mode", s(mode.1)),
            ];
            let y = call("Resize", 13, &attrs, &[Some(&x), None, Some(&sc)]).unwrap();
            let [n, c, h, w] = shape;
            let (oh, ow) = (h * fh, w * fw);
            assert_eq!(y[0].shape(), &[n, c, oh, ow]);
            let got = y[0].as_f32().unwrap();
            for (i, &g) in got.iter().enumerate() {
                let (p, yy, xx) = (i / (oh * ow), i / ow % oh, i % ow);
                assert_eq!(
                    g,
                    v[p * h * w + yy / fh * w + xx / fw],
                    "{shape:?} {mode:?} at {i}"
                );
            }
        }
        assert_eq!(repeat_factor(&[0, 0, 1, 1, 2, 2], 3, 1), Some(2));
        assert_eq!(repeat_factor(&[0, 4, 8], 3, 4), Some(1));
        assert_eq!(repeat_factor(&[0, 0, 1, 2], 3, 1), None);
        assert_eq!(repeat_factor(&[0, 1, 1, 2], 2, 1), None);
        assert_eq!(repeat_factor(&[0, 0, 2, 2], 2, 1), None);
    }

    #[test]
    fn linear_half_pixel_upsample() {
        // Coordinates (y + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25, clamped at the edges.
        let x = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let sc = f32s(&[4], &[1.0, 1.0, 2.0, 2.0]);
        let y = call(
            "Resize",
            19,
            &[("mode", s("linear"))],
            &[Some(&x), None, Some(&sc)],
        );
        #[rustfmt::skip]
        let want = [
            1.0, 1.25, 1.75, 2.0,
            1.5, 1.75, 2.25, 2.5,
            2.5, 2.75, 3.25, 3.5,
            3.0, 3.25, 3.75, 4.0,
        ];
        assert_close(&y.unwrap()[0], &[1, 1, 4, 4], &want);
    }

    #[test]
    fn align_corners_uses_fractional_length() {
        // 4 * 0.6 = 2.4 output length: x = 1 * 3 / 1.4 = 2.142857 -> 3.142857.
        let x = f32s(&[1, 4], &[1.0, 2.0, 3.0, 4.0]);
        let sc = f32s(&[2], &[1.0, 0.6]);
        let attrs = [
            ("mode", s("linear")),
            ("coordinate_transformation_mode", s("align_corners")),
        ];
        let y = call("Resize", 13, &attrs, &[Some(&x), None, Some(&sc)]).unwrap();
        assert_close(&y[0], &[1, 2], &[1.0, 3.142857]);
    }

    #[test]
    fn crop_and_resize_extrapolates() {
        // x = 1.5 + 1.5 * y over [0, 1, 2, 3]: 1.5, 3.0, then 4.5 lies outside.
        let x = f32s(&[4], &[0.0, 1.0, 2.0, 3.0]);
        let roi = f32s(&[2], &[0.5, 1.5]);
        let sizes = Tensor::from_i64(vec![1], vec![3]);
        let attrs = [
            ("mode", s("linear")),
            ("coordinate_transformation_mode", s("tf_crop_and_resize")),
            ("extrapolation_value", Attribute::Float(9.0)),
        ];
        let y = call(
            "Resize",
            19,
            &attrs,
            &[Some(&x), Some(&roi), None, Some(&sizes)],
        );
        assert_close(&y.unwrap()[0], &[3], &[1.5, 3.0, 9.0]);
    }

    #[test]
    fn nearest_keeps_integer_dtype() {
        let x = Tensor::from_parts(vec![1, 3], TensorData::U8(vec![10, 20, 30].into()));
        let sizes = Tensor::from_i64(vec![2], vec![1, 2]);
        let empty = f32s(&[0], &[]);
        // half_pixel: (y + 0.5) * 1.5 - 0.5 = 0.25, 1.75 -> 0, 2.
        let y = call(
            "Resize",
            13,
            &[],
            &[Some(&x), Some(&empty), Some(&empty), Some(&sizes)],
        );
        assert_eq!(y.unwrap()[0].data(), &TensorData::U8(vec![10, 30].into()));
    }

    #[test]
    fn legacy_nearest_ceils_when_downsampling() {
        // Resize-10: x = y / 0.6 = 0, 1.67, 3.33 -> ceil -> 0, 2, 4; upsampling floors.
        let x = f32s(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        let y = call("Resize", 10, &[], &[Some(&x), Some(&f32s(&[1], &[0.6]))]).unwrap();
        assert_close(&y[0], &[3], &[1.0, 3.0, 5.0]);
        let y = call("Resize", 10, &[], &[Some(&x), Some(&f32s(&[1], &[1.5]))]).unwrap();
        assert_close(&y[0], &[7], &[1.0, 1.0, 2.0, 3.0, 3.0, 4.0, 5.0]);
    }

    #[test]
    fn bad_arguments_are_errors() {
        let x = f32s(&[1, 2], &[1.0, 2.0]);
        let sc = f32s(&[2], &[1.0, 2.0]);
        let sizes = Tensor::from_i64(vec![2], vec![1, 4]);
        let both = call(
            "Resize",
            13,
            &[],
            &[Some(&x), None, Some(&sc), Some(&sizes)],
        );
        assert!(both.unwrap_err().0.contains("only one"));
        assert!(call("Resize", 13, &[], &[Some(&x)]).is_err());
        let bad_mode = call(
            "Resize",
            13,
            &[("mode", s("area"))],
            &[Some(&x), None, Some(&sc)],
        );
        assert!(bad_mode.unwrap_err().0.contains("area"));
        let cubic10 = call(
            "Resize",
            10,
            &[("mode", s("cubic"))],
            &[Some(&x), Some(&sc)],
        );
        assert!(cubic10.is_err());
        let short = f32s(&[1], &[2.0]);
        assert!(call("Resize", 13, &[], &[Some(&x), None, Some(&short)]).is_err());
        let crop = [("coordinate_transformation_mode", s("tf_crop_and_resize"))];
        assert!(call("Resize", 13, &crop, &[Some(&x), None, Some(&sc)]).is_err());
    }

    #[test]
    fn bad_attributes_are_load_errors() {
        use crate::ops::attrs::testing::{assert_rejected, load_error};
        assert_rejected(
            "Resize",
            &[("mode", s("area"))],
            "mode",
            "'area' is not one of 'nearest', 'linear', 'cubic'",
        );
        assert_rejected(
            "Resize",
            &[("coordinate_transformation_mode", s("centre"))],
            "coordinate_transformation_mode",
            "'centre' is not one of",
        );
        assert_rejected(
            "Resize",
            &[("cubic_coeff_a", Attribute::Int(1))],
            "cubic_coeff_a",
            "a float",
        );
        assert_rejected(
            "Resize",
            &[("axes", Attribute::Floats(vec![1.0]))],
            "axes",
            "ints",
        );
        assert!(load_error("Resize", &[("mode", s("cubic"))], 10).is_some());
        assert!(load_error("Upsample", &[("mode", s("bilinear"))], 9).is_none());
        assert!(load_error("Upsample", &[], 7).is_some_and(|e| e.contains("'scales'")));
    }
}
