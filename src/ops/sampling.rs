//! GridSample and RoiAlign.
//!
//! GridSample (opsets 16 and 20) samples `X [N, C, D1..Dk]` at the normalized coordinates of
//! `grid [N, O1..Om, k]` (the last axis in reverse order: x first, the innermost spatial axis),
//! as the onnx reference implementation and PyTorch's grid_sample compute it.
//!
//! A coordinate `g` in [-1, 1] maps to `(g + 1)/2·(d − 1)` with `align_corners`, else to
//! `((g + 1)·d − 1)/2`. Outside the borders (`[0, d − 1]` with `align_corners`, else
//! `[−0.5, d − 0.5]`) `padding_mode` `border` clamps it to `[0, d − 1]` and `reflection`
//! reflects it at the borders; `zeros` leaves it, and taps outside the tensor read 0 (border:
//! the nearest edge, reflection: the reflected index). `nearest` rounds half to even (the
//! conformance data's rule in 2-D and 3-D; PyTorch's 3-D kernel rounds half away from zero);
//! `linear`/`bilinear` interpolates the 2^k
//! neighbours, `cubic`/`bicubic` the 4^k with Keys' coefficients (a = −0.75).
//!
//! RoiAlign (opsets 10 and 16) follows ONNX Runtime's CPU kernel (cpu/object_detection/
//! roialign.cc): each output bin averages (or, in `max` mode, takes the largest weighted
//! corner of) a grid of bilinear samples — `sampling_ratio` per side, or `ceil(roi size /
//! output size)`; a sample more than one pixel outside the image reads 0, one within clamps to
//! the edge; `half_pixel` (opset 16's default) shifts the box by half a pixel, the legacy
//! `output_half_pixel` makes every box at least one pixel wide.

use super::attrs::{boxed, AttrError, Attrs};
use super::shape::{fact, FactsResult};
use super::util::{checked_len, float_values, in_dtype, input};
use super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::Fact;
use crate::graph::Node;
use crate::tensor::Tensor;
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    r.add("GridSample", grid_sample)
        .parse(|n, _| boxed(GridSampleAttrs::parse(n)))
        .roles(&[InputRole::Data, InputRole::Param])
        .infer(grid_sample_facts);
    r.add("RoiAlign", roi_align)
        .parse(|n, opset| boxed(RoiAlignAttrs::parse(n, opset)))
        .roles(&[InputRole::Data, InputRole::Param, InputRole::Param])
        .infer(roi_align_facts);
}

/// RoiAlign's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct RoiAlignAttrs {
    pub max: bool,
    pub out_h: usize,
    pub out_w: usize,
    pub sampling_ratio: usize,
    pub spatial_scale: f32,
    pub half_pixel: bool,
}

impl RoiAlignAttrs {
    fn parse(node: &Node, opset: i64) -> Result<RoiAlignAttrs, AttrError> {
        let a = Attrs::new(node);
        let max = a.choice("mode", false, &[("avg", false), ("max", true)])?;
        let positive = |name: &str| -> Result<usize, AttrError> {
            let v = a.int_or(name, 1)?;
            if v < 1 {
                return Err(AttrError::new(name, format!("must be >= 1, got {v}")));
            }
            Ok(v as usize)
        };
        let ratio = a.int_or("sampling_ratio", 0)?;
        if ratio < 0 {
            return Err(AttrError::new(
                "sampling_ratio",
                format!("must be >= 0, got {ratio}"),
            ));
        }
        let half_pixel = a.choice(
            "coordinate_transformation_mode",
            opset >= 16,
            &[("half_pixel", true), ("output_half_pixel", false)],
        )?;
        Ok(RoiAlignAttrs {
            max,
            out_h: positive("output_height")?,
            out_w: positive("output_width")?,
            sampling_ratio: ratio as usize,
            spatial_scale: a.float_or("spatial_scale", 1.0)?,
            half_pixel,
        })
    }
}

/// One bilinear sample of RoiAlign: its four corners' offsets and weights.
type Corners = ([usize; 4], [f32; 4]);

/// One bilinear sample of RoiAlign, or None (outside the image).
fn roi_sample(y: f32, x: f32, h: usize, w: usize) -> Option<Corners> {
    if y < -1.0 || y > h as f32 || x < -1.0 || x > w as f32 {
        return None;
    }
    // Clamped to the image: at or past the last row/column both taps are that edge.
    let corner = |v: f32, len: usize| -> (usize, usize, f32) {
        let v = v.max(0.0);
        let low = v as usize;
        if low >= len - 1 {
            (len - 1, len - 1, (len - 1) as f32)
        } else {
            (low, low + 1, v)
        }
    };
    let (y_low, y_high, y) = corner(y, h);
    let (x_low, x_high, x) = corner(x, w);
    let (ly, lx) = (y - y_low as f32, x - x_low as f32);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    Some((
        [
            y_low * w + x_low,
            y_low * w + x_high,
            y_high * w + x_low,
            y_high * w + x_high,
        ],
        [hy * hx, hy * lx, ly * hx, ly * lx],
    ))
}

fn roi_align(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<RoiAlignAttrs>()?;
    let (x, rois, idx) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let xs = x.shape();
    if xs.len() != 4 {
        return Err(OpError(format!("X {xs:?} must be [N, C, H, W]")));
    }
    let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let r = rois.shape().first().copied().unwrap_or(0);
    if rois.shape() != [r, 4] || idx.shape() != [r] {
        return Err(OpError(format!(
            "rois {:?} must be [R, 4] and batch_indices {:?} [R]",
            rois.shape(),
            idx.shape()
        )));
    }
    let batch = super::util::input_i64s(inputs, 2)?;
    if let Some(&b) = batch.iter().find(|&&b| b < 0 || b as usize >= n) {
        return Err(OpError(format!(
            "batch index {b} is outside X's {n} images"
        )));
    }
    let boxes = float_values(rois, "rois")?;
    let xv = float_values(x, "X")?;
    let (oh, ow) = (attrs.out_h, attrs.out_w);
    let out_shape = vec![r, c, oh, ow];
    let mut out = vec![0f32; checked_len(&out_shape)?];
    if h == 0 || w == 0 {
        return Ok(vec![in_dtype(Tensor::from_f32(out_shape, out), x.dtype())]);
    }
    let offset = if attrs.half_pixel { 0.5 } else { 0.0 };
    out.par_chunks_mut((c * oh * ow).max(1))
        .enumerate()
        .for_each(|(ri, dst)| {
            let b = &boxes[ri * 4..ri * 4 + 4];
            let s = attrs.spatial_scale;
            let (x0, y0) = (b[0] * s - offset, b[1] * s - offset);
            let (x1, y1) = (b[2] * s - offset, b[3] * s - offset);
            let (mut rw, mut rh) = (x1 - x0, y1 - y0);
            if !attrs.half_pixel {
                rw = rw.max(1.0);
                rh = rh.max(1.0);
            }
            let (bh, bw) = (rh / oh as f32, rw / ow as f32);
            let grid = |size: f32, out: usize| -> usize {
                if attrs.sampling_ratio > 0 {
                    attrs.sampling_ratio
                } else {
                    (size / out as f32).ceil().max(0.0) as usize
                }
            };
            let (gh, gw) = (grid(rh, oh), grid(rw, ow));
            let count = (gh * gw).max(1) as f32;
            // The samples of every bin: the same for all channels.
            let samples: Vec<Vec<Option<Corners>>> = (0..oh * ow)
                .map(|bin| {
                    let (ph, pw) = (bin / ow, bin % ow);
                    let mut v = Vec::with_capacity(gh * gw);
                    for iy in 0..gh {
                        let yy = y0 + ph as f32 * bh + (iy as f32 + 0.5) * bh / gh as f32;
                        for ix in 0..gw {
                            let xx = x0 + pw as f32 * bw + (ix as f32 + 0.5) * bw / gw as f32;
                            v.push(roi_sample(yy, xx, h, w));
                        }
                    }
                    v
                })
                .collect();
            let img0 = batch[ri] as usize * c;
            for ch in 0..c {
                let img = &xv[(img0 + ch) * h * w..][..h * w];
                for (bin, ss) in samples.iter().enumerate() {
                    let y = &mut dst[ch * oh * ow + bin];
                    if attrs.max {
                        let mut m: Option<f32> = None;
                        for (o, wt) in ss.iter().flatten() {
                            let v = (0..4)
                                .map(|k| wt[k] * img[o[k]])
                                .fold(f32::NEG_INFINITY, f32::max);
                            m = Some(m.map_or(v, |m| m.max(v)));
                        }
                        *y = m.unwrap_or(0.0);
                    } else {
                        let sum: f32 = ss
                            .iter()
                            .flatten()
                            .map(|(o, wt)| (0..4).map(|k| wt[k] * img[o[k]]).sum::<f32>())
                            .sum();
                        *y = sum / count;
                    }
                }
            }
        });
    Ok(vec![in_dtype(Tensor::from_f32(out_shape, out), x.dtype())])
}

fn roi_align_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (x, rois) = (fact(ins, 0)?, fact(ins, 1)?);
    let attrs = ctx.attrs::<RoiAlignAttrs>()?;
    let dim = |f: &Fact, i: usize| {
        f.shape
            .as_ref()
            .and_then(|s| s.get(i).cloned())
            .unwrap_or_else(|| ctx.unknown_dim())
    };
    Ok(vec![Fact::new(
        x.dtype,
        Some(vec![
            dim(rois, 0),
            dim(x, 1),
            crate::graph::fact::DimFact::known(attrs.out_h),
            crate::graph::fact::DimFact::known(attrs.out_w),
        ]),
    )])
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleMode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    Zeros,
    Border,
    Reflection,
}

/// GridSample's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct GridSampleAttrs {
    pub mode: SampleMode,
    pub padding: Padding,
    pub align_corners: bool,
}

impl GridSampleAttrs {
    fn parse(node: &Node) -> Result<GridSampleAttrs, AttrError> {
        let a = Attrs::new(node);
        let mode = a.choice(
            "mode",
            SampleMode::Linear,
            &[
                ("bilinear", SampleMode::Linear),
                ("linear", SampleMode::Linear),
                ("nearest", SampleMode::Nearest),
                ("bicubic", SampleMode::Cubic),
                ("cubic", SampleMode::Cubic),
            ],
        )?;
        let padding = a.choice(
            "padding_mode",
            Padding::Zeros,
            &[
                ("zeros", Padding::Zeros),
                ("border", Padding::Border),
                ("reflection", Padding::Reflection),
            ],
        )?;
        Ok(GridSampleAttrs {
            mode,
            padding,
            align_corners: a.flag("align_corners", false)?,
        })
    }
}

/// Reflects `x` at `lo` and `hi` until it lies between them.
fn reflect(x: f32, lo: f32, hi: f32) -> f32 {
    let range = hi - lo;
    if range <= 0.0 {
        return lo;
    }
    let (dx, from_low) = if x < lo {
        (lo - x, true)
    } else if x > hi {
        (x - hi, false)
    } else {
        return x;
    };
    let n = (dx / range).floor();
    let r = dx - n * range;
    let even = (n as i64) % 2 == 0;
    match (from_low, even) {
        (true, true) | (false, false) => lo + r,
        _ => hi - r,
    }
}

/// Keys' cubic convolution weights of the taps at −1, 0, 1, 2 for a fraction `t`.
fn cubic_weights(t: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let x = t.abs();
    let w0 = ((A * (x + 1.0) - 5.0 * A) * (x + 1.0) + 8.0 * A) * (x + 1.0) - 4.0 * A;
    let w1 = ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let w2 = ((A + 2.0) * (1.0 - x) - (A + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0;
    let w3 = ((A * (2.0 - x) - 5.0 * A) * (2.0 - x) + 8.0 * A) * (2.0 - x) - 4.0 * A;
    [w0, w1, w2, w3]
}

/// The geometry of one spatial axis.
#[derive(Clone, Copy)]
struct Axis {
    len: usize,
    lo: f32,
    hi: f32,
}

impl Axis {
    /// The index a tap at `i` reads, or None for a zero.
    fn tap(self, i: i64, padding: Padding) -> Option<usize> {
        let last = self.len as i64 - 1;
        match padding {
            Padding::Zeros => (0..=last).contains(&i).then_some(i as usize),
            Padding::Border => Some(i.clamp(0, last.max(0)) as usize),
            Padding::Reflection => {
                let r = reflect(i as f32, self.lo, self.hi) as i64;
                Some(r.clamp(0, last.max(0)) as usize)
            }
        }
    }
}

fn grid_sample(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<GridSampleAttrs>()?;
    let (x, grid) = (input(inputs, 0)?, input(inputs, 1)?);
    let (xs, gs) = (x.shape(), grid.shape());
    let k = xs.len().saturating_sub(2);
    if xs.len() < 3 || gs.len() != xs.len() || gs[0] != xs[0] || gs[gs.len() - 1] != k {
        return Err(OpError(format!(
            "X {xs:?} must be [N, C, D1..Dk] and grid {gs:?} [N, O1..Ok, k] with the same N and rank"
        )));
    }
    let (n, c) = (xs[0], xs[1]);
    let spatial = &xs[2..];
    let out_sp = &gs[1..gs.len() - 1];
    let points: usize = out_sp.iter().product();
    let mut out_shape = vec![n, c];
    out_shape.extend(out_sp);
    let total = checked_len(&out_shape)?;
    let axes: Vec<Axis> = spatial
        .iter()
        .map(|&d| {
            let (lo, hi) = if attrs.align_corners {
                (0.0, d as f32 - 1.0)
            } else {
                (-0.5, d as f32 - 0.5)
            };
            Axis { len: d, lo, hi }
        })
        .collect();
    let xv = float_values(x, "X")?;
    let gv = float_values(grid, "grid")?;
    let in_sz: usize = spatial.iter().product();
    let strides: Vec<usize> = (0..k).map(|d| spatial[d + 1..].iter().product()).collect();
    let mut out = vec![0f32; total];
    out.par_chunks_mut(points.max(1))
        .enumerate()
        .filter(|_| points > 0)
        .for_each(|(nc, dst)| {
            let b = nc / c.max(1);
            let img = &xv[nc * in_sz..(nc + 1) * in_sz];
            for (p, y) in dst.iter_mut().enumerate() {
                let g = &gv[(b * points + p) * k..][..k];
                // Continuous coordinates in spatial order (the grid lists them reversed).
                let coords: Vec<f32> = (0..k)
                    .map(|d| {
                        let v = g[k - 1 - d];
                        let len = axes[d].len as f32;
                        let mut u = if attrs.align_corners {
                            (v + 1.0) / 2.0 * (len - 1.0)
                        } else {
                            ((v + 1.0) * len - 1.0) / 2.0
                        };
                        if attrs.mode == SampleMode::Nearest {
                            u = u.round_ties_even();
                        }
                        if u < axes[d].lo || u > axes[d].hi {
                            u = match attrs.padding {
                                Padding::Border => u.clamp(0.0, len - 1.0),
                                Padding::Reflection => reflect(u, axes[d].lo, axes[d].hi),
                                Padding::Zeros => u,
                            };
                        }
                        u
                    })
                    .collect();
                *y = sample(img, &axes, &strides, &coords, attrs.mode, attrs.padding);
            }
        });
    Ok(vec![in_dtype(Tensor::from_f32(out_shape, out), x.dtype())])
}

/// The interpolated value of one image at continuous coordinates.
fn sample(
    img: &[f32],
    axes: &[Axis],
    strides: &[usize],
    coords: &[f32],
    mode: SampleMode,
    padding: Padding,
) -> f32 {
    if coords.iter().any(|u| u.is_nan()) {
        return f32::NAN;
    }
    // Per axis: (first tap, weights).
    let taps: Vec<(i64, Vec<f32>)> = coords
        .iter()
        .map(|&u| match mode {
            SampleMode::Nearest => (u as i64, vec![1.0]),
            SampleMode::Linear => {
                let f = u.floor();
                let t = u - f;
                (f as i64, vec![1.0 - t, t])
            }
            SampleMode::Cubic => {
                let f = u.floor();
                (f as i64 - 1, cubic_weights(u - f).to_vec())
            }
        })
        .collect();
    // Every combination of taps, innermost axis fastest.
    let counts: Vec<usize> = taps.iter().map(|(_, w)| w.len()).collect();
    let combos: usize = counts.iter().product();
    // Every tap adds weight × value, a tap outside the tensor weight × 0 (signed zeros as
    // ONNX Runtime gets them).
    let mut sum: Option<f32> = None;
    let mut idx = vec![0usize; axes.len()];
    for _ in 0..combos {
        let mut weight = 1f32;
        let mut offset = Some(0usize);
        for (d, &i) in idx.iter().enumerate() {
            weight *= taps[d].1[i];
            offset = match (offset, axes[d].tap(taps[d].0 + i as i64, padding)) {
                (Some(o), Some(t)) => Some(o + t * strides[d]),
                _ => None,
            };
        }
        let term = weight * offset.map_or(0.0, |o| img[o]);
        sum = Some(sum.map_or(term, |s| s + term));
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < counts[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    sum.unwrap_or(0.0)
}

fn grid_sample_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (x, grid) = (fact(ins, 0)?, fact(ins, 1)?);
    let shape = match (&x.shape, &grid.shape) {
        (Some(xs), Some(gs)) if xs.len() >= 3 && gs.len() == xs.len() => {
            let mut s = vec![gs[0].clone(), xs[1].clone()];
            s.extend(gs[1..gs.len() - 1].iter().cloned());
            Some(s)
        }
        (_, Some(gs)) if gs.len() >= 3 => {
            let mut s = vec![gs[0].clone(), ctx.unknown_dim()];
            s.extend(gs[1..gs.len() - 1].iter().cloned());
            Some(s)
        }
        _ => None,
    };
    Ok(vec![Fact::new(x.dtype, shape)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;

    fn run(attrs: &[(&str, Attribute)], x: &Tensor, grid: &Tensor) -> Result<Tensor, OpError> {
        let n = node_with("GridSample", attrs);
        Ok(grid_sample(&OpCtx::new(&n, 20), &[Some(x), Some(grid)])?.remove(0))
    }

    /// A 2x2 image sampled at its center, at a corner and outside, by hand.
    #[test]
    fn bilinear_samples_and_padding() {
        let x = Tensor::from_f32(vec![1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let grid = Tensor::from_f32(vec![1, 1, 3, 2], vec![0.0, 0.0, -1.0, -1.0, 3.0, 0.0]);
        let ac = [("align_corners", Attribute::Int(1))];
        let y = run(&ac, &x, &grid).unwrap();
        // Center: the mean 2.5; (-1, -1) with aligned corners: pixel (0, 0); x = 3: outside,
        // zeros padding: 0.
        assert_eq!(y.as_f32().unwrap(), &[2.5, 1.0, 0.0]);
        let border = [
            ("align_corners", Attribute::Int(1)),
            ("padding_mode", Attribute::String("border".into())),
        ];
        // x = 3 clamps to column 1, y = 0 between the rows: (2 + 4) / 2.
        assert_eq!(run(&border, &x, &grid).unwrap().as_f32().unwrap()[2], 3.0);
        let refl = [
            ("align_corners", Attribute::Int(1)),
            ("padding_mode", Attribute::String("reflection".into())),
        ];
        // x = 3 is column 2: reflected at 1 it is 0, and at 0 it stays; (1 + 3) / 2.
        assert_eq!(run(&refl, &x, &grid).unwrap().as_f32().unwrap()[2], 2.0);
    }

    /// One box over a 2x2 image with one sample per bin at its center: bilinear by hand.
    #[test]
    fn roi_align_averages_bilinear_samples() {
        let x = Tensor::from_f32(vec![1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let rois = Tensor::from_f32(vec![1, 4], vec![0.0, 0.0, 2.0, 2.0]);
        let idx = Tensor::from_i64(vec![1], vec![0]);
        let n = node_with("RoiAlign", &[("sampling_ratio", Attribute::Int(1))]);
        let y = roi_align(&OpCtx::new(&n, 16), &[Some(&x), Some(&rois), Some(&idx)]).unwrap();
        // half_pixel: box (-0.5, -0.5)..(1.5, 1.5), its center (0.5, 0.5): the mean 2.5.
        assert_eq!(y[0].shape(), &[1, 1, 1, 1]);
        assert_eq!(y[0].as_f32().unwrap(), &[2.5]);
        let bad = Tensor::from_i64(vec![1], vec![3]);
        let e = roi_align(&OpCtx::new(&n, 16), &[Some(&x), Some(&rois), Some(&bad)]).unwrap_err();
        assert!(e.0.contains("batch index 3"), "{e}");
    }

    #[test]
    fn reflection_folds_back_and_forth() {
        assert_eq!(reflect(-0.5, 0.0, 2.0), 0.5);
        assert_eq!(reflect(2.5, 0.0, 2.0), 1.5);
        assert_eq!(reflect(4.5, 0.0, 2.0), 0.5);
        assert_eq!(reflect(1.0, 0.0, 2.0), 1.0);
    }

    #[test]
    fn bad_grids_are_named() {
        let x = Tensor::from_f32(vec![1, 1, 2, 2], vec![0.0; 4]);
        let grid = Tensor::from_f32(vec![1, 1, 1, 3], vec![0.0; 3]);
        let e = run(&[], &x, &grid).unwrap_err();
        assert!(e.0.contains("grid [1, 1, 1, 3]"), "{e}");
        let n = node_with("GridSample", &[("mode", Attribute::String("area".into()))]);
        let e = GridSampleAttrs::parse(&n).unwrap_err().to_string();
        assert!(e.contains("mode") && e.contains("area"), "{e}");
    }
}
