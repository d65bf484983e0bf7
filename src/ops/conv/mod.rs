//! Conv and ConvTranspose (1-D, 2-D, 3-D, groups, dilations, auto_pad). A 2-D Conv in f32 (and
//! a 1-D one, as 2-D on a [N, C, 1, W] view) is an implicit GEMM: [`super::sgemm::gemm`]
//! packs its panels straight from the padded image (no im2col buffer); pointwise ones
//! read the image in place, depthwise ones sum 16 outputs per vector from a padded copy of
//! each channel; where output rows (pointwise: planes) fill the vector lanes, the planar
//! product ([`planar`]) writes the channel planes directly; 3-D and the float16 accumulator
//! go through im2col / col2im and the shared [`sgemm`](super::matmul::sgemm).

use super::attrs::{boxed, AttrError, Attrs};
use super::matmul::sgemm;
use super::prepacked::tag::{
    DEPTHWISE_TAP_MAJOR, GATHERED_WEIGHTS, PLANAR_WEIGHTS, TRANSPOSED_CONV_WEIGHTS,
};
use super::util::{input, opt_input};
use super::{ChannelFn, OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::tensor::Tensor;
use rayon::prelude::*;

mod depthwise;
use depthwise::{depthwise_2d, DW_LANES};
mod planar;

pub fn register(r: &mut Registry) {
    r.add("Conv", conv_op);
    r.add("ConvTranspose", conv_transpose_op);
    use super::InputRole::{Bias, Data};
    r.def_mut("Conv")
        .parse(|n, _| boxed(ConvAttrs::parse(n)))
        .roles(&[Data, Data, Bias])
        .quantized(&[0, 1], |_, i, _| (i == 1).then_some(0))
        .infer(conv_facts)
        .flops(conv_flops)
        .epilogue(|inputs| {
            let (x, w) = (inputs.first()?.as_ref()?, inputs.get(1)?.as_ref()?);
            Some(super::ChainShape {
                rank: x.rank(),
                channels: *w.shape().first()?,
                axis: 1,
            })
        });
    r.def_mut("ConvTranspose")
        .parse(|n, _| boxed(ConvAttrs::parse(n)))
        .roles(&[Data, Data, Bias])
        .quantized(&[0, 1], |_, i, rank| (i == 1 && rank >= 2).then_some(1))
        .infer(conv_transpose_facts)
        .flops(conv_transpose_flops);
}

/// How the padding of a sliding window is chosen (`auto_pad`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoPad {
    /// Explicit `pads` (zero when absent).
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// The sliding-window attributes Conv, ConvTranspose and the pools share, validated: every
/// value >= 1 (pads >= 0), and the lists agree on the number of spatial axes.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowAttrs {
    pub kernel_shape: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    /// The begin values of every spatial axis, then the end values.
    pub pads: Option<Vec<usize>>,
    pub auto_pad: AutoPad,
}

impl WindowAttrs {
    pub fn parse(a: &Attrs) -> Result<WindowAttrs, AttrError> {
        let auto_pad = a.choice(
            "auto_pad",
            AutoPad::NotSet,
            &[
                ("NOTSET", AutoPad::NotSet),
                ("", AutoPad::NotSet),
                ("SAME_UPPER", AutoPad::SameUpper),
                ("SAME_LOWER", AutoPad::SameLower),
                ("VALID", AutoPad::Valid),
            ],
        )?;
        let usizes = |v: Option<Vec<i64>>| v.map(|v| v.into_iter().map(|x| x as usize).collect());
        let kernel_shape: Option<Vec<usize>> = usizes(a.ints_at_least("kernel_shape", 1)?);
        let strides: Option<Vec<usize>> = usizes(a.ints_at_least("strides", 1)?);
        let dilations: Option<Vec<usize>> = usizes(a.ints_at_least("dilations", 1)?);
        let pads: Option<Vec<usize>> = usizes(a.ints_at_least("pads", 0)?);
        // The number of spatial axes, from the first list that tells it.
        let mut rank: Option<(usize, &str)> = None;
        for (name, v) in [
            ("kernel_shape", &kernel_shape),
            ("strides", &strides),
            ("dilations", &dilations),
        ] {
            if let Some(v) = v {
                match rank {
                    None => rank = Some((v.len(), name)),
                    Some((r, from)) if r != v.len() => {
                        return Err(AttrError::new(
                            name,
                            format!(
                            "expected {r} values (one per spatial dim, as '{from}' has), got {}",
                            v.len()
                        ),
                        ))
                    }
                    _ => {}
                }
            }
        }
        if let Some(p) = &pads {
            match rank {
                Some((r, _)) if p.len() != 2 * r => {
                    return Err(AttrError::new(
                        "pads",
                        format!(
                            "expected {} values ({r} spatial dims x 2), got {}",
                            2 * r,
                            p.len()
                        ),
                    ))
                }
                None if p.len() % 2 != 0 => {
                    return Err(AttrError::new(
                        "pads",
                        format!(
                            "expected an even number of values (begin and end of each spatial dim), got {}",
                            p.len()
                        ),
                    ))
                }
                _ => {}
            }
        }
        Ok(WindowAttrs {
            kernel_shape,
            strides,
            dilations,
            pads,
            auto_pad,
        })
    }
}

/// Conv's and ConvTranspose's attributes (`output_padding` and `output_shape` are
/// ConvTranspose's).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvAttrs {
    pub window: WindowAttrs,
    pub group: usize,
    pub output_padding: Option<Vec<usize>>,
    pub output_shape: Option<Vec<usize>>,
}

impl ConvAttrs {
    /// Conv's, ConvTranspose's and ConvInteger's attributes (opset-independent).
    pub(crate) fn parse_node(node: &Node) -> Result<ConvAttrs, AttrError> {
        Self::parse(node)
    }

    fn parse(node: &Node) -> Result<ConvAttrs, AttrError> {
        let a = Attrs::new(node);
        let window = WindowAttrs::parse(&a)?;
        let group = a.int_or("group", 1)?;
        if group < 1 {
            return Err(AttrError::new(
                "group",
                format!("must be >= 1, got {group}"),
            ));
        }
        let usizes = |v: Option<Vec<i64>>| v.map(|v| v.into_iter().map(|x| x as usize).collect());
        let output_padding: Option<Vec<usize>> = usizes(a.ints_at_least("output_padding", 0)?);
        let output_shape: Option<Vec<usize>> = usizes(a.ints_at_least("output_shape", 0)?);
        Ok(ConvAttrs {
            window,
            group: group as usize,
            output_padding,
            output_shape,
        })
    }
}

/// Each output element: Cin/group * prod(kernel) multiply-adds, plus the bias.
pub(crate) fn conv_flops(_: &Node, ins: &[Option<Vec<usize>>], outs: &[Vec<usize>]) -> u64 {
    let out = outs
        .first()
        .map_or(0, |s| s.iter().product::<usize>() as u64);
    let w = ins.get(1).cloned().flatten().unwrap_or_default();
    let per_out: u64 = w.iter().skip(1).map(|&d| d as u64).product();
    let has_bias = ins.get(2).is_some_and(|s| s.is_some());
    2 * out * per_out + if has_bias { out } else { 0 }
}

/// W is [Cin, Cout/group, k...]: each input element feeds Cout/group * k outputs.
fn conv_transpose_flops(_: &Node, ins: &[Option<Vec<usize>>], _: &[Vec<usize>]) -> u64 {
    let x = ins.first().cloned().flatten().unwrap_or_default();
    let w = ins.get(1).cloned().flatten().unwrap_or_default();
    let cout_per_group = w.get(1).copied().unwrap_or(0) as u64;
    let kernel: u64 = w.iter().skip(2).map(|&d| d as u64).product();
    2 * x.iter().product::<usize>() as u64 * cout_per_group * kernel
}

/// The rank X and W share (>= 3), when either's is known: Conv and ConvTranspose both need it.
fn conv_rank(x: &Fact, w: &Fact) -> Result<Option<usize>, OpError> {
    let Some(rank) = x.rank().or(w.rank()) else {
        return Ok(None);
    };
    if rank < 3 || x.rank().is_some_and(|r| r != rank) || w.rank().is_some_and(|r| r != rank) {
        return Err(OpError(format!(
            "X {} and W {} must have the same rank >= 3",
            x.shape_string(),
            w.shape_string()
        )));
    }
    Ok(Some(rank))
}

/// X [N, C, spatial...] and W [M, C/group, kernel...] give [N, M, out...].
pub(crate) fn conv_facts(
    ctx: &super::InferCtx,
    ins: &[Option<&Fact>],
) -> super::shape::FactsResult {
    let (x, w) = (super::shape::fact(ins, 0)?, super::shape::fact(ins, 1)?);
    let Some(rank) = conv_rank(x, w)? else {
        return Ok(vec![Fact::new(x.dtype, None)]);
    };
    let attrs = ctx.attrs::<ConvAttrs>()?;
    let group = attrs.group;
    let mut out: Vec<DimFact> = (0..rank).map(|_| ctx.unknown_dim()).collect();
    if let Some(s) = &x.shape {
        out[0] = s[0].clone();
    }
    if let Some(ws) = &w.shape {
        out[1] = ws[0].clone();
        if let (Some(c), Some(cg)) = (
            x.shape.as_ref().and_then(|s| s[1].as_known()),
            ws[1].as_known(),
        ) {
            let m = ws[0].as_known();
            if c != cg * group || m.is_some_and(|m| m % group != 0) {
                return Err(OpError(format!(
                    "channels do not fit groups: X has {c} channels, W {}, group {group}",
                    w.shape_string()
                )));
            }
        }
    }
    let kernel: Option<Vec<usize>> = match &attrs.window.kernel_shape {
        Some(k) => Some(k.clone()),
        None => w.known_shape().map(|s| s[2..].to_vec()),
    };
    let spatial: Option<Vec<usize>> = x.shape.as_ref().and_then(|s| {
        s[2..]
            .iter()
            .map(DimFact::as_known)
            .collect::<Option<Vec<_>>>()
    });
    if let (Some(k), Some(sp)) = (kernel, spatial) {
        if k.len() != sp.len() || k.contains(&0) {
            return Err(OpError(format!(
                "kernel {k:?} does not fit X {}",
                x.shape_string()
            )));
        }
        let win = window(&attrs.window, &sp, &k, false)?;
        for (i, o) in win.out.iter().enumerate() {
            out[2 + i] = DimFact::known(*o);
        }
    }
    Ok(vec![Fact::new(x.dtype, Some(out))])
}

/// X [N, C, spatial...] and W [C, M/group, kernel...] give [N, M, out...].
fn conv_transpose_facts(ctx: &super::InferCtx, ins: &[Option<&Fact>]) -> super::shape::FactsResult {
    let (x, w) = (super::shape::fact(ins, 0)?, super::shape::fact(ins, 1)?);
    let Some(rank) = conv_rank(x, w)? else {
        return Ok(vec![Fact::new(x.dtype, None)]);
    };
    let attrs = ctx.attrs::<ConvAttrs>()?;
    let group = attrs.group;
    let mut out: Vec<DimFact> = (0..rank).map(|_| ctx.unknown_dim()).collect();
    if let Some(s) = &x.shape {
        out[0] = s[0].clone();
    }
    if let Some(ws) = &w.shape {
        out[1] = ws[1].mul(&DimFact::known(group));
    }
    let (Some(ws), Some(xs)) = (w.known_shape(), x.known_shape()) else {
        return Ok(vec![Fact::new(x.dtype, Some(out))]);
    };
    if ws.len() != xs.len() || ws[0] != xs[1] || xs[1] % group != 0 {
        return Err(OpError(format!(
            "W {ws:?} does not fit X {xs:?} with group {group}"
        )));
    }
    let g = transpose_geometry(attrs, &xs[2..], &ws[2..])?;
    for (i, o) in g.out.iter().enumerate() {
        out[2 + i] = DimFact::known(*o);
    }
    Ok(vec![Fact::new(x.dtype, Some(out))])
}

/// Spatial geometry of a sliding-window op (Conv, pools).
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    /// Padding at the start and end of each spatial axis.
    pub pad_begin: Vec<usize>,
    pub pad_end: Vec<usize>,
    pub out: Vec<usize>,
}

/// Resolves strides, dilations, pads and auto_pad into output sizes (ONNX Conv/Pool rules).
pub fn window(
    attrs: &WindowAttrs,
    input_sp: &[usize],
    kernel: &[usize],
    ceil_mode: bool,
) -> Result<Window, OpError> {
    let r = input_sp.len();
    if kernel.len() != r || kernel.contains(&0) {
        return Err(OpError(format!(
            "kernel {kernel:?} does not fit {r} spatial axes (every size must be >= 1)"
        )));
    }
    let strides = per_axis("strides", &attrs.strides, r, 1)?;
    let dilations = per_axis("dilations", &attrs.dilations, r, 1)?;
    let auto_pad = attrs.auto_pad;
    let mut pad_begin = vec![0; r];
    let mut pad_end = vec![0; r];
    let mut out = vec![0; r];
    for i in 0..r {
        let eff_k = (kernel[i] - 1) * dilations[i] + 1;
        match auto_pad {
            AutoPad::SameUpper | AutoPad::SameLower => {
                let o = input_sp[i].div_ceil(strides[i]);
                let total = ((o - 1) * strides[i] + eff_k).saturating_sub(input_sp[i]);
                let small = total / 2;
                if auto_pad == AutoPad::SameUpper {
                    pad_begin[i] = small;
                    pad_end[i] = total - small;
                } else {
                    pad_begin[i] = total - small;
                    pad_end[i] = small;
                }
                out[i] = o;
            }
            AutoPad::Valid | AutoPad::NotSet => {
                if auto_pad == AutoPad::NotSet {
                    if let Some(p) = &attrs.pads {
                        if p.len() != 2 * r {
                            return Err(OpError(format!(
                                "pads {p:?} must have {} values for {r} spatial axes",
                                2 * r
                            )));
                        }
                        pad_begin[i] = p[i];
                        pad_end[i] = p[i + r];
                    }
                }
                let padded = input_sp[i] + pad_begin[i] + pad_end[i];
                if padded < eff_k {
                    return Err(OpError(format!(
                        "kernel {} (dilated {eff_k}) is larger than the padded input {padded} on spatial axis {i}",
                        kernel[i]
                    )));
                }
                let span = padded - eff_k;
                out[i] = if ceil_mode {
                    let mut o = span.div_ceil(strides[i]) + 1;
                    // The last window must start inside the input or its begin padding.
                    if (o - 1) * strides[i] >= input_sp[i] + pad_begin[i] {
                        o -= 1;
                    }
                    o
                } else {
                    span / strides[i] + 1
                };
            }
        }
    }
    Ok(Window {
        kernel: kernel.to_vec(),
        strides,
        dilations,
        pad_begin,
        pad_end,
        out,
    })
}

/// A per-axis attribute for `r` spatial axes: its values, or `default` on every axis.
fn per_axis(
    name: &str,
    v: &Option<Vec<usize>>,
    r: usize,
    default: usize,
) -> Result<Vec<usize>, OpError> {
    match v {
        Some(v) if v.len() == r => Ok(v.clone()),
        Some(v) => Err(OpError(format!("{name} {v:?} must have {r} values"))),
        None => Ok(vec![default; r]),
    }
}

/// The bias B of a convolution with `m` output channels as f32, checked to hold `m` values.
fn bias_values(
    bias: Option<&Tensor>,
    m: usize,
) -> Result<Option<std::borrow::Cow<'_, [f32]>>, OpError> {
    match bias {
        Some(b) if b.len() == m => Ok(Some(f32_input(b, "B")?)),
        Some(b) => Err(OpError(format!(
            "bias has {} values, expected {m}",
            b.len()
        ))),
        None => Ok(None),
    }
}

fn f32_input<'a>(t: &'a Tensor, what: &str) -> Result<std::borrow::Cow<'a, [f32]>, OpError> {
    match t.as_f32() {
        Some(v) => Ok(std::borrow::Cow::Borrowed(v)),
        None if t.dtype().is_float() => Ok(std::borrow::Cow::Owned(t.to_f32_vec().expect("float"))),
        None => Err(OpError(format!(
            "{what} has dtype {}, expected a float type",
            t.dtype()
        ))),
    }
}

use super::util::in_dtype as restore_dtype;

/// Fills `col` ([C·prod(k)] rows × prod(out) columns) from one image `x` ([C, *in]); the
/// padding reads `T::default()` (0: for ConvInteger's codes minus zero point, the zero point).
pub(crate) fn im2col<T: Copy + Default + Send + Sync>(
    x: &[T],
    in_sp: &[usize],
    w: &Window,
    col: &mut [T],
) {
    let zero = T::default();
    let k_sz: usize = w.kernel.iter().product();
    let o_sz: usize = w.out.iter().product();
    let in_sz: usize = in_sp.iter().product();
    let r = in_sp.len();
    col.par_chunks_mut(o_sz * k_sz)
        .enumerate()
        .for_each(|(ci, rows)| {
            let img = &x[ci * in_sz..(ci + 1) * in_sz];
            for ki in 0..k_sz {
                let row = &mut rows[ki * o_sz..(ki + 1) * o_sz];
                if r == 2 {
                    let (kh, kw) = (ki / w.kernel[1], ki % w.kernel[1]);
                    let (ih_n, iw_n) = (in_sp[0] as isize, in_sp[1] as isize);
                    let (oh_n, ow_n) = (w.out[0], w.out[1]);
                    for oh in 0..oh_n {
                        let ih = (oh * w.strides[0] + kh * w.dilations[0]) as isize
                            - w.pad_begin[0] as isize;
                        let dst = &mut row[oh * ow_n..(oh + 1) * ow_n];
                        if ih < 0 || ih >= ih_n {
                            dst.fill(zero);
                            continue;
                        }
                        let src = &img[ih as usize * iw_n as usize..];
                        let off = (kw * w.dilations[1]) as isize - w.pad_begin[1] as isize;
                        // Column ow reads input ow·s + off: copy the part inside the image,
                        // zero the padding on either side.
                        let st = w.strides[1] as isize;
                        let ceil_div = |a: isize, b: isize| (a + b - 1).div_euclid(b);
                        let lo = ceil_div(-off, st).clamp(0, ow_n as isize) as usize;
                        let hi =
                            ceil_div(iw_n - off, st).clamp(lo as isize, ow_n as isize) as usize;
                        dst[..lo].fill(zero);
                        dst[hi..].fill(zero);
                        if hi == lo {
                            // The whole kernel column lies in the padding.
                            continue;
                        }
                        let s0 = (lo as isize * st + off) as usize;
                        if st == 1 {
                            dst[lo..hi].copy_from_slice(&src[s0..s0 + (hi - lo)]);
                        } else {
                            let st = st as usize;
                            for (j, d) in dst[lo..hi].iter_mut().enumerate() {
                                *d = src[s0 + j * st];
                            }
                        }
                    }
                } else {
                    // Any spatial rank: decompose kernel and output indices.
                    let mut kidx = vec![0usize; r];
                    let mut rem = ki;
                    for d in (0..r).rev() {
                        kidx[d] = rem % w.kernel[d];
                        rem /= w.kernel[d];
                    }
                    for (oi, dst) in row.iter_mut().enumerate() {
                        let mut rem = oi;
                        let mut off = 0usize;
                        let mut inside = true;
                        let mut mul = 1usize;
                        for d in (0..r).rev() {
                            let o = rem % w.out[d];
                            rem /= w.out[d];
                            let i = (o * w.strides[d] + kidx[d] * w.dilations[d]) as isize
                                - w.pad_begin[d] as isize;
                            if i < 0 || i >= in_sp[d] as isize {
                                inside = false;
                                break;
                            }
                            off += i as usize * mul;
                            mul *= in_sp[d];
                        }
                        *dst = if inside { img[off] } else { zero };
                    }
                }
            }
        });
}

/// The B operand of a 2-D convolution's product, read from one image of one group padded
/// once ([`PaddedImage`]): row p is (channel, kernel row, kernel column) as im2col orders them,
/// column j the output position. Every tap lies inside the padded image and reads a
/// contiguous run, so packing a panel is a few short copies.
struct Im2colPanels<'a> {
    image: &'a PaddedImage,
    /// Per row p: where its tap for output (0, 0) lies in `image.data`.
    offsets: Vec<usize>,
    out_w: usize,
    stride_h: usize,
    n: usize,
}

impl<'a> Im2colPanels<'a> {
    fn new(image: &'a PaddedImage, channels: usize, w: &Window) -> Self {
        Im2colPanels {
            image,
            offsets: image.tap_offsets(channels, w),
            out_w: w.out[1],
            stride_h: w.strides[0],
            n: w.out[0] * w.out[1],
        }
    }
}

impl super::sgemm::PackB for Im2colPanels<'_> {
    fn pack(&self, j0: usize, p0: usize, kc: usize, dst: &mut [f32]) {
        use super::sgemm::NR;
        let cols = NR.min(self.n - j0);
        // The panel's columns as runs within one output row: (offset of output (oh, ow0) from
        // output (0, 0) in the image, length, offset in the panel).
        let mut runs = [(0usize, 0usize, 0usize); NR];
        let mut n_runs = 0;
        let mut j = j0;
        while j < j0 + cols {
            let (oh, ow) = (j / self.out_w, j % self.out_w);
            let len = (self.out_w - ow).min(j0 + cols - j);
            runs[n_runs] = (oh * self.stride_h * self.image.row + ow, len, j - j0);
            n_runs += 1;
            j += len;
        }
        let src = &self.image.data;
        let rows = dst.chunks_exact_mut(NR).zip(&self.offsets[p0..p0 + kc]);
        if n_runs == 1 && cols == NR {
            // The common case: the whole panel in one output row.
            let at = runs[0].0;
            for (row, &base) in rows {
                super::sgemm::copy_panel_row(row, &src[base + at..]);
            }
            return;
        }
        for (row, &base) in rows {
            row[cols..].fill(0.0);
            for &(at, len, d0) in &runs[..n_runs] {
                for (d, &v) in row[d0..d0 + len].iter_mut().zip(&src[base + at..]) {
                    *d = v;
                }
            }
        }
    }
}

/// Per output position (row-major): where its one tap lies in an unpadded input plane of
/// shape `in_sp`, read at `strides`.
fn strided_origins(in_sp: &[usize], strides: &[usize], out: &[usize]) -> Vec<usize> {
    // Each axis's step in the plane: its stride times the values per index of that axis.
    let mut steps = vec![0; in_sp.len()];
    let mut per_index = 1;
    for a in (0..in_sp.len()).rev() {
        steps[a] = strides[a] * per_index;
        per_index *= in_sp[a];
    }
    let mut origins = vec![0usize];
    for (&n, &step) in out.iter().zip(&steps) {
        origins = origins
            .iter()
            .flat_map(|&o| (0..n).map(move |i| o + i * step))
            .collect();
    }
    origins
}

/// Whether a 2-D f32 convolution with `mg` output channels per group puts its channels
/// across the vector lanes ([`super::sgemm::gemm_gathered`]: the image read where it lies, the
/// weights packed once per model) rather than its output positions ([`Im2colPanels`]: the image
/// packed on every run): when its channels fill at least 3/4 of the lanes they take. Measured:
/// a 3×3 conv of [1,256,7,7] 0.80 → 0.35 ms, of [1,128,14,14] 0.52 → 0.35 ms, bench CNN
/// −15 %, YOLOv8n −25 % (2 threads; same bits either way).
fn channels_across_lanes(mg: usize) -> bool {
    let nr = super::sgemm::NR;
    4 * mg >= 3 * mg.div_ceil(nr) * nr
}

/// Per group, the group's weights ([mg, rows] of `wv`) transposed and packed as the B operand
/// of [`super::sgemm::gemm_gathered`]: row p (a tap), column an output channel.
fn weight_panels(wv: &[f32], group: usize, mg: usize, rows: usize) -> Vec<super::sgemm::PackedB> {
    (0..group)
        .map(|g| {
            let wt = super::sgemm::StridedB {
                data: &wv[g * mg * rows..(g + 1) * mg * rows],
                n: mg,
                rs: 1,
                cs: rows,
            };
            super::sgemm::PackedB::new(rows, mg, &wt)
        })
        .collect()
}

/// Per group, a ConvTranspose's weights ([cg, rows] of `wv`: an input channel's row of output
/// channel × kernel tap values) packed as the B operand of [`super::sgemm::gemm_gathered`]:
/// row ci an input channel, column an (output channel, tap) row of col.
fn transposed_weight_panels(
    wv: &[f32],
    group: usize,
    cg: usize,
    rows: usize,
) -> Vec<super::sgemm::PackedB> {
    (0..group)
        .map(|g| {
            let w = super::sgemm::StridedB {
                data: &wv[g * cg * rows..(g + 1) * cg * rows],
                n: rows,
                rs: rows,
                cs: 1,
            };
            super::sgemm::PackedB::new(cg, rows, &w)
        })
        .collect()
}

/// Moves a finished block of the product (positions × channels, [position, channel]) into
/// `planes` ([channel, position], `n_pos` per plane), adding each channel's bias: 8 positions
/// × 8 channels at a time through registers, the rest one by one. With no bias the value is
/// stored as it is (v + 0 would turn −0 into +0).
///
/// # Safety
/// `planes` holds the block's channels' planes of `n_pos` values each, and no other thread
/// writes the block's part of them.
unsafe fn block_into_planes(
    block: &super::sgemm::GatheredBlock,
    bias: Option<&[f32]>,
    planes: *mut f32,
    n_pos: usize,
    stored: Option<StoredPlanes>,
) {
    let bias_of = |ch: usize| bias.map_or(0.0, |b| b[ch]);
    let how = super::util::Transpose8::detect();
    #[cfg(target_arch = "x86_64")]
    let rounds_in_registers = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c");
    let (p0, p1) = (block.rows.start, block.rows.end);
    let (c0, c1) = (block.columns.start, block.columns.end);
    let c8 = c0 + (c1 - c0) / 8 * 8;
    let q8 = p0 + (p1 - p0) / 8 * 8;
    assert!(p1 <= n_pos && (p1 - p0 - 1) * block.ld + (c1 - c0) <= block.values.len());
    let ct = block.values.as_ptr();
    let at = |pos: usize, ch: usize| (pos - p0) * block.ld + ch - c0;
    for cb in (c0..c8).step_by(8) {
        let b8: Option<[f32; 8]> = bias.map(|_| std::array::from_fn(|j| bias_of(cb + j)));
        for q0 in (p0..q8).step_by(8) {
            let (src, dst) = (ct.add(at(q0, cb)), planes.add(cb * n_pos + q0));
            match (&stored, how) {
                #[cfg(target_arch = "x86_64")]
                (Some(s), super::util::Transpose8::Avx) if s.epilogue.rounds.is_empty() => {
                    transpose_8x8_stored(src, block.ld, dst, n_pos, b8.as_ref(), s, cb, q0)
                }
                #[cfg(target_arch = "x86_64")]
                (Some(s), super::util::Transpose8::Avx) if rounds_in_registers => {
                    transpose_8x8_stored_rounded(src, block.ld, dst, n_pos, b8.as_ref(), s, cb, q0)
                }
                (Some(s), _) => {
                    for j in 0..8 {
                        for i in 0..8 {
                            let v = *src.add(i * block.ld + j);
                            let v = b8.map_or(v, |b| v + b[j]);
                            *dst.add(j * n_pos + i) = s.value(v, cb + j, q0 + i, n_pos);
                        }
                    }
                }
                (None, _) => {
                    super::util::transpose_8x8(src, block.ld, dst, n_pos, b8.as_ref(), how)
                }
            }
        }
    }
    for pos in p0..p1 {
        let rest = if pos < q8 { c8..c1 } else { c0..c1 };
        for ch in rest {
            let v = block.values[at(pos, ch)];
            let v = if bias.is_some() { v + bias_of(ch) } else { v };
            *planes.add(ch * n_pos + pos) = match &stored {
                Some(s) => s.value(v, ch, pos, n_pos),
                None => v,
            };
        }
    }
}

/// Where a gathered block's planes lie in the output, for the epilogue applied as they are
/// stored: the block's column 0 is output channel `first_channel`, and its plane 0 starts at
/// flat index `start` of the output.
struct StoredPlanes<'a> {
    epilogue: &'a super::StoreEpilogue<'a>,
    first_channel: usize,
    start: usize,
}

impl StoredPlanes<'_> {
    /// The finished value of `x` at position `pos` of the block's plane `ch`.
    #[inline(always)]
    fn value(&self, x: f32, ch: usize, pos: usize, n_pos: usize) -> f32 {
        self.epilogue
            .value(x, self.first_channel + ch, self.start + ch * n_pos + pos)
    }
}

/// [`super::util::transpose_8x8`] (plus the bias) with the epilogue applied in registers
/// before each store: channel `cb + j`'s 8 positions from `q0`. Where the epilogue rounds,
/// [`transpose_8x8_stored_rounded`].
///
/// # Safety
/// As `transpose_8x8`; the CPU has AVX; the operand, if any, holds the output's values; the
/// epilogue does not round.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[allow(clippy::too_many_arguments)]
unsafe fn transpose_8x8_stored(
    src: *const f32,
    ld_src: usize,
    dst: *mut f32,
    n_pos: usize,
    bias: Option<&[f32; 8]>,
    stored: &StoredPlanes,
    cb: usize,
    q0: usize,
) {
    stored_8x8::<false>(src, ld_src, dst, n_pos, bias, stored, cb, q0)
}

/// [`transpose_8x8_stored`] for an epilogue that rounds (an emulated plan's layers): each
/// value rounded in registers where the layers round it (`vcvtps2ph` and back for float16,
/// the integer rounding of [`crate::numeric::bf16_x8`] for bfloat16).
///
/// # Safety
/// As `transpose_8x8_stored`, the CPU having AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn transpose_8x8_stored_rounded(
    src: *const f32,
    ld_src: usize,
    dst: *mut f32,
    n_pos: usize,
    bias: Option<&[f32; 8]>,
    stored: &StoredPlanes,
    cb: usize,
    q0: usize,
) {
    stored_8x8::<true>(src, ld_src, dst, n_pos, bias, stored, cb, q0)
}

/// The first steps of a rounding store epilogue on a finished block's rows ([position,
/// channel], in place): each value plus its channel's bias (where there is one), rounded as
/// the kernel's output, times the channel's scale plus its shift, rounded as that stage's —
/// the operations and order of [`StoreEpilogue::value`], 16 channels at a time. Channel `ch`
/// of the block is `first + ch` of the epilogue's constants.
///
/// # Safety
/// The CPU has AVX-512F; `block.values` holds its rows at stride `ld`, each with its columns'
/// values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn affine_rows_avx512(
    block: &mut super::sgemm::GatheredBlock,
    bias: Option<&[f32]>,
    e: &super::StoreEpilogue,
    first: usize,
) {
    use crate::numeric::rounded_by_x16 as rounded16;
    use std::arch::x86_64::*;
    let (c0, c1) = (block.columns.start, block.columns.end);
    let (rows, width, ld) = (block.rows.len(), c1 - c0, block.ld);
    if rows == 0 || width == 0 {
        return;
    }
    assert!((rows - 1) * ld + width <= block.values.len());
    assert!(first + c1 <= e.scale.len() && first + c1 <= e.shift.len());
    assert!(bias.is_none_or(|b| c1 <= b.len()));
    let (scale, shift) = (
        e.scale.as_ptr().add(first + c0),
        e.shift.as_ptr().add(first + c0),
    );
    let bias = bias.map(|b| b.as_ptr().add(c0));
    for r in 0..rows {
        let row = block.values.as_mut_ptr().add(r * ld);
        for c in (0..width).step_by(16) {
            let mask = (u32::MAX >> (32 - (width - c).min(16))) as u16;
            let mut x = _mm512_maskz_loadu_ps(mask, row.add(c));
            if let Some(b) = bias {
                x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask, b.add(c)));
            }
            let x = rounded16(x, e.rounds.product);
            let a = _mm512_maskz_loadu_ps(mask, scale.add(c));
            let s = _mm512_maskz_loadu_ps(mask, shift.add(c));
            let v = rounded16(_mm512_add_ps(_mm512_mul_ps(x, a), s), e.rounds.affine);
            _mm512_mask_storeu_ps(row.add(c), mask, v);
        }
    }
}

/// `x` rounded by `rounds` where the store rounds (ROUNDS), else `x`.
///
/// # Safety
/// With ROUNDS, the CPU has AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn round_if<const ROUNDS: bool>(
    x: std::arch::x86_64::__m256,
    rounds: [Option<crate::numeric::Rounding>; 2],
) -> std::arch::x86_64::__m256 {
    if ROUNDS {
        crate::numeric::rounded_by_x8(x, rounds)
    } else {
        x
    }
}

/// The body of [`transpose_8x8_stored`] (ROUNDS false: `stored` must not round) and of
/// [`transpose_8x8_stored_rounded`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn stored_8x8<const ROUNDS: bool>(
    src: *const f32,
    ld_src: usize,
    dst: *mut f32,
    n_pos: usize,
    bias: Option<&[f32; 8]>,
    stored: &StoredPlanes,
    cb: usize,
    q0: usize,
) {
    use std::arch::x86_64::*;
    let rounds = stored.epilogue.rounds;
    let out = super::util::transpose_8x8_regs(src, ld_src);
    let e = stored.epilogue;
    let first = stored.first_channel + cb;
    let (scale, shift) = (&e.scale[first..first + 8], &e.shift[first..first + 8]);
    let operand = e.operand.map(|o| {
        let at = stored.start + cb * n_pos + q0;
        assert!(at + 7 * n_pos + 8 <= o.len());
        o.as_ptr().add(at)
    });
    let mut v = [_mm256_setzero_ps(); 8];
    for j in 0..8 {
        let x = match bias {
            Some(b) => _mm256_add_ps(out[j], _mm256_set1_ps(b[j])),
            None => out[j],
        };
        if e.affine_done {
            v[j] = x;
            continue;
        }
        let x = round_if::<ROUNDS>(x, rounds.product);
        v[j] = round_if::<ROUNDS>(
            _mm256_add_ps(
                _mm256_mul_ps(x, _mm256_set1_ps(scale[j])),
                _mm256_set1_ps(shift[j]),
            ),
            rounds.affine,
        );
    }
    if let Some(o) = operand {
        for (j, x) in v.iter_mut().enumerate() {
            // In the Add's order (where both are NaN, the first source's payload comes out).
            let y = round_if::<ROUNDS>(_mm256_loadu_ps(o.add(j * n_pos)), [rounds.operand, None]);
            let sum = if e.operand_first {
                _mm256_add_ps(y, *x)
            } else {
                _mm256_add_ps(*x, y)
            };
            *x = round_if::<ROUNDS>(sum, rounds.sum);
        }
    }
    // Relu (nearly every CNN's) as its own arm: `apply8`'s match is then decided at compile
    // time, not once per vector.
    match e.last {
        Some(super::lanewise::Lanewise::Relu) => {
            for x in &mut v {
                let y = super::lanewise::apply8(super::lanewise::Lanewise::Relu, *x);
                *x = round_if::<ROUNDS>(y, rounds.last);
            }
        }
        Some(l) => {
            for x in &mut v {
                *x = round_if::<ROUNDS>(super::lanewise::apply8(l, *x), rounds.last);
            }
        }
        None => {}
    }
    for (j, &x) in v.iter().enumerate() {
        _mm256_storeu_ps(dst.add(j * n_pos), x);
    }
}

/// `finish` on each position's row of channels of a finished block ([position, channel]; the
/// block's first column is channel `first`), each value plus its column's `bias` first where
/// given: a layer's epilogue where the planes are too short to take it plane by plane.
/// `planes`: where the block's rows go in the output (its positions' values lie a plane apart).
fn finish_block_rows(
    block: &mut super::sgemm::GatheredBlock,
    first: usize,
    bias: Option<&[f32]>,
    finish: &ChannelFn,
    planes: PlanesOf,
) {
    let (rows, width, c0) = (block.rows.len(), block.columns.len(), block.columns.start);
    for (r, row) in block.values.chunks_mut(block.ld).take(rows).enumerate() {
        let row = &mut row[..width];
        if let Some(b) = bias {
            row.iter_mut().zip(&b[c0..]).for_each(|(v, b)| *v += b);
        }
        let start = planes.at(block.rows.start + r, first);
        finish(super::Piece::row(first, start, planes.plane), row);
    }
}

/// Where the positions of a block go in an [N, C, positions] output: row r of the block is
/// position r mod `plane` of image `image + r / plane`, each image `channels` planes.
#[derive(Clone, Copy)]
struct PlanesOf {
    plane: usize,
    channels: usize,
    image: usize,
}

impl PlanesOf {
    /// The flat index of row `r`'s value of channel `ch`.
    fn at(self, r: usize, ch: usize) -> usize {
        let image = self.image + r / self.plane;
        (image * self.channels + ch) * self.plane + r % self.plane
    }
}

/// Channels of one image with the convolution's zero padding around each plane and each row
/// split into its column-stride phases (columns x·s + r for r < s: phase r), so a kernel tap
/// reads, for consecutive output columns, consecutive values.
struct PaddedImage {
    data: Vec<f32>,
    /// Values per padded row (all phases) and per padded plane.
    row: usize,
    plane: usize,
    /// Values per phase of a row, and the column stride.
    phase: usize,
    stride_w: usize,
}

impl PaddedImage {
    fn new(x: &[f32], channels: usize, in_sp: &[usize], w: &Window) -> Self {
        let (ih, iw) = (in_sp[0], in_sp[1]);
        let (ph, pw) = (w.pad_begin[0], w.pad_begin[1]);
        // Rows and columns any tap reads: the padding on both sides (the window's output size
        // keeps every tap inside them).
        let hp = ih + ph + w.pad_end[0];
        let wp = iw + pw + w.pad_end[1];
        let sw = w.strides[1];
        let phase = wp.div_ceil(sw);
        let row = phase * sw;
        let plane = hp * row;
        // DW_LANES values of slack: the depthwise kernel reads whole vectors past a row's end
        // (into lanes it does not store).
        let planes_len = channels * plane;
        // Each plane is zeroed by the task that fills it, just before the copy: in parallel and
        // in cache (one memset of the whole buffer ran on one thread while the others waited:
        // 10 % of a lone [1,32,56,56] 3×3/2 convolution). Zeroing only the padding was slower.
        let fill = |(ci, dst): (usize, &mut [std::mem::MaybeUninit<f32>])| {
            dst.fill(std::mem::MaybeUninit::new(0.0));
            // SAFETY: every value was written (zeroed) just above.
            let dst = unsafe { super::util::assume_written(dst) };
            let src = &x[ci * ih * iw..(ci + 1) * ih * iw];
            // Input column c is padded column c + pw.
            let out = &mut dst[ph * row..(ph + ih) * row];
            super::util::split_rows(src, iw, pw, sw, phase, out, row);
        };
        // SAFETY: the slack is zeroed here and each plane by its `fill`, which the loops below
        // run on every plane.
        let data = unsafe {
            super::util::unzeroed_f32(planes_len + DW_LANES, |buf| {
                let (planes, slack) = buf.split_at_mut(planes_len);
                slack.fill(std::mem::MaybeUninit::new(0.0));
                // In parallel from 32 Ki values (128 KiB; 64 Ki before 2026-11-27: the bench
                // CNN's [1,128,14,14] 3×3/2 convolution 89 → 80 µs alone, the CNN 1461 → 1436
                // µs; from 16 Ki YOLOv8n and PP-OCRv4's smaller copies lost more to the fork
                // than they gained).
                if planes_len >= 1 << 15 {
                    planes.par_chunks_mut(plane).enumerate().for_each(fill);
                } else {
                    planes.chunks_mut(plane.max(1)).enumerate().for_each(fill);
                }
            })
        };
        PaddedImage {
            data,
            row,
            plane,
            phase,
            stride_w: sw,
        }
    }

    /// Per im2col row p (channel, kernel row, kernel column): where its tap for output (0, 0)
    /// lies in `data`.
    fn tap_offsets(&self, channels: usize, w: &Window) -> Vec<usize> {
        let (kh_n, kw_n) = (w.kernel[0], w.kernel[1]);
        // One kernel plane's offsets, then each channel's shifted by its plane (the columns'
        // phase arithmetic once per tap, not per channel: it was 5 % of a Silero run).
        let mut offsets = Vec::with_capacity(channels * kh_n * kw_n);
        for kh in 0..kh_n {
            for kw in 0..kw_n {
                offsets.push(kh * w.dilations[0] * self.row + self.column(kw * w.dilations[1]));
            }
        }
        let taps = kh_n * kw_n;
        for ci in 1..channels {
            offsets.extend_from_within(..taps);
            offsets[ci * taps..]
                .iter_mut()
                .for_each(|o| *o += ci * self.plane);
        }
        offsets
    }

    /// Per output position (oh, ow) in row-major order: where its window's origin lies in
    /// `data` (add a tap's offset to reach the tap).
    fn window_origins(&self, w: &Window) -> Vec<usize> {
        let (oh_n, ow_n) = (w.out[0], w.out[1]);
        let mut origins = Vec::with_capacity(oh_n * ow_n);
        for oh in 0..oh_n {
            let first = oh * w.strides[0] * self.row;
            origins.extend(first..first + ow_n);
        }
        origins
    }

    /// Where padded column `x0 + ow·s` lies in a row, less `ow`: the same for every output
    /// column ow.
    fn column(&self, x0: usize) -> usize {
        (x0 % self.stride_w) * self.phase + x0 / self.stride_w
    }
}

fn conv_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<ConvAttrs>()?;
    let x = input(inputs, 0)?;
    let round = ctx.rounder();
    let round_channel = move |_: super::Piece, v: &mut [f32]| round(v);
    // A float32 output: the fused pointwise layers after it, or the layer's rounding.
    let w_in = input(inputs, 1)?;
    // The output's shape is worked out only where there is an epilogue to check it against.
    let epilogue = ctx
        .epilogue
        .and_then(|_| conv_output_shape(attrs, x, w_in))
        .and_then(|shape| ctx.epilogue_for(&shape));
    let finish: Option<&ChannelFn> = match (epilogue, ctx.round_to) {
        _ if x.dtype() != crate::tensor::DType::F32 => None,
        (Some(e), _) => Some(e),
        (None, Some(_)) => Some(&round_channel),
        (None, None) => None,
    };
    // The epilogue in the form the gathered product applies as it stores its values.
    let store = epilogue
        .filter(|_| x.dtype() == crate::tensor::DType::F32)
        .and(ctx.store_epilogue());
    let y = conv(
        ctx,
        attrs,
        x,
        w_in,
        opt_input(inputs, 2),
        finish,
        store,
        ctx.prepacked(1),
    )?;
    if finish.is_some() {
        ctx.outputs_rounded();
        if epilogue.is_some() {
            ctx.epilogue_applied();
        }
    }
    Ok(vec![y])
}

/// The shape [`conv`] gives `x` and `w` under `attrs`, where they are valid (None: the
/// convolution fails on them, or its 1-D / 3-D geometry is not the 2-D one's).
pub(crate) fn conv_output_shape(attrs: &ConvAttrs, x: &Tensor, w: &Tensor) -> Option<Vec<usize>> {
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() < 3 || ws.len() != xs.len() {
        return None;
    }
    let kernel = attrs
        .window
        .kernel_shape
        .clone()
        .unwrap_or_else(|| ws[2..].to_vec());
    let win = window(&attrs.window, &xs[2..], &kernel, false).ok()?;
    Some([&[xs[0], ws[0]][..], &win.out].concat())
}

/// Conv of `x` by `wt` plus `bias` under `attrs` (also the convolution inside fused ops);
/// each finished output plane (the depthwise kernel's, as it is written; the others', after
/// the product) goes through `finish` with its channel (a layer's output rounding, or its
/// epilogue). `store`, where given, is `finish` in the form the gathered product computes in
/// registers as its blocks go into the planes ([`super::StoreEpilogue`]); the other paths
/// call `finish`.
#[allow(clippy::too_many_arguments)]
pub fn conv(
    ctx: &OpCtx,
    attrs: &ConvAttrs,
    x: &Tensor,
    wt: &Tensor,
    bias: Option<&Tensor>,
    finish: Option<&ChannelFn>,
    store: Option<super::StoreEpilogue>,
    prepacked: Option<&super::prepacked::Prepacked>,
) -> Result<Tensor, OpError> {
    if x.rank() < 3 || wt.rank() != x.rank() {
        return Err(OpError(format!(
            "X {:?} and W {:?} must have the same rank >= 3",
            x.shape(),
            wt.shape()
        )));
    }
    if x.rank() == 3 && ctx.accumulate == crate::numeric::Accumulator::F32 {
        // 1-D: the 2-D kernels on a [N, C, 1, W] view with a [1, k] kernel (the same taps in
        // the same order; views share the buffers).
        let lift = |v: &Option<Vec<usize>>| v.as_ref().map(|v| [&[1][..], v].concat());
        let window = &attrs.window;
        let attrs2 = ConvAttrs {
            window: WindowAttrs {
                kernel_shape: lift(&window.kernel_shape),
                strides: lift(&window.strides),
                dilations: lift(&window.dilations),
                pads: window.pads.as_ref().map(|p| vec![0, p[0], 0, p[1]]),
                auto_pad: window.auto_pad,
            },
            ..attrs.clone()
        };
        let view = |t: &Tensor| {
            let s = t.shape();
            t.clone()
                .reshaped(vec![s[0], s[1], 1, s[2]])
                .expect("one more axis of 1")
        };
        let y = conv(
            ctx,
            &attrs2,
            &view(x),
            &view(wt),
            bias,
            finish,
            store,
            prepacked,
        )?;
        let s = y.shape().to_vec();
        return Ok(y
            .reshaped(vec![s[0], s[1], s[3]])
            .expect("the axis of 1 dropped"));
    }
    let group = attrs.group;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let in_sp = &x.shape()[2..];
    let m = wt.shape()[0];
    let cg = wt.shape()[1];
    let kernel: Vec<usize> = match &attrs.window.kernel_shape {
        Some(k) => k.clone(),
        None => wt.shape()[2..].to_vec(),
    };
    if kernel.as_slice() != &wt.shape()[2..] {
        return Err(OpError(format!(
            "kernel_shape {kernel:?} does not match W {:?}",
            wt.shape()
        )));
    }
    if c != cg * group || !m.is_multiple_of(group) {
        return Err(OpError(format!(
            "channels do not fit groups: X has {c} channels, W {:?}, group {group}",
            wt.shape()
        )));
    }
    let w = window(&attrs.window, in_sp, &kernel, false)?;
    let xv = f32_input(x, "X")?;
    let wv = f32_input(wt, "W")?;
    let bv = bias_values(bias, m)?;
    let k_sz: usize = kernel.iter().product();
    let o_sz: usize = w.out.iter().product();
    let in_sz: usize = in_sp.iter().product();
    let mg = m / group;
    let rows = cg * k_sz;
    // The output is not zeroed first: every path below writes each of its values before
    // anything reads it (the depthwise loop each plane's blocks, the products each (channel,
    // position) of their group's planes, a k = 0 product zeros), and the groups and images
    // cover it.
    let total = n * m * o_sz;
    let mut out: Vec<f32> = Vec::with_capacity(total);
    // SAFETY: written whole before read (above); set_len below, once the products are done.
    let out_values = unsafe { super::util::assume_written(&mut out.spare_capacity_mut()[..total]) };
    // A 1×…×1 kernel without padding reads one value per input channel at each output's
    // origin: the image itself serves as the gathered product's A, at any stride.
    let unpadded_1x1 = k_sz == 1 && w.pad_begin.iter().chain(&w.pad_end).all(|&p| p == 0);
    let pointwise = unpadded_1x1 && w.strides.iter().all(|&s| s == 1);
    // Depthwise (one input and one output channel per group, 2-D): a direct loop per channel,
    // in parallel over channels, instead of an im2col and a one-row GEMM per channel.
    // (The float16 accumulator keeps the GEMM path, which emulates it.)
    let direct = group == c
        && mg == 1
        && cg == 1
        && in_sp.len() == 2
        && !pointwise
        && ctx.accumulate == crate::numeric::Accumulator::F32;
    if direct && depthwise::channels_last_pays(c) {
        let weights = super::prepacked::kept_or_made(prepacked, DEPTHWISE_TAP_MAJOR, || {
            depthwise::TapMajor::new(&wv, c, k_sz)
        });
        let bias = bv.as_deref();
        depthwise::depthwise_2d_channels_last(
            &xv, &weights, n, c, in_sp, &w, bias, finish, out_values,
        );
    } else if direct {
        depthwise_2d(&xv, &wv, c, in_sp, &w, bv.as_deref(), finish, out_values);
    }
    let mut col = if pointwise
        || direct
        || (in_sp.len() == 2 && ctx.accumulate == crate::numeric::Accumulator::F32)
    {
        Vec::new()
    } else {
        vec![0f32; rows * o_sz]
    };
    // The depthwise path adds the bias and applies `finish` as it writes the planes, the
    // gathered path adds the bias.
    let mut bias_added = direct;
    let mut packed_weights: Option<std::sync::Arc<Vec<super::sgemm::PackedB>>> = None;
    // The planar product (output positions across the vector lanes, written into the
    // planes), where its runs fill the lanes and the path it replaces gives the same chains:
    // a pointwise convolution's only where the gathered product would run (with fewer
    // channels it takes the `gemm` crate's order, on every CPU).
    let planar_layout = if group == 1
        && !direct
        && ctx.accumulate == crate::numeric::Accumulator::F32
        && ((pointwise && channels_across_lanes(mg)) || !unpadded_1x1)
    {
        planar::layout(pointwise, &w)
    } else {
        None
    };
    let planar = planar_layout.is_some();
    // Its weights in tiles of output channels, once for all images.
    let planar_tiles = planar_layout.map(|_| {
        super::prepacked::kept_or_made(prepacked, PLANAR_WEIGHTS, || {
            planar::ChannelTiles::new(&wv, m, rows)
        })
    });
    // The gathered product (output channels across the vector lanes), where it applies.
    let gathered = (unpadded_1x1 || in_sp.len() == 2)
        && ctx.accumulate == crate::numeric::Accumulator::F32
        && !planar
        && channels_across_lanes(mg);
    // With one group, a batch's images are one gathered product: their output positions are
    // rows of one A (Silero's batches of four short sequences were four products of 4 rows,
    // in tiles of 6 and 12 rows and too small to split over threads). Each output is the
    // same chain either way.
    let images = if gathered && group == 1 { n.max(1) } else { 1 };
    // Planes shorter than this take `finish` in the gathered product's blocks (below).
    const SHORT_PLANE: usize = 64;
    // The epilogue in registers as the planar product's tiles or the gathered product's
    // blocks go into the planes, where it has that form: no pass over the output afterwards,
    // no call per piece. (The planar tiles take the float32 form; an emulated plan's rounding
    // epilogue takes the pass.)
    let planar_store =
        store.filter(|e| planar && finish.is_some() && e.rounds.is_empty() && !e.affine_done);
    let store = store.filter(|_| gathered && finish.is_some());
    // Where it rounds, on AVX-512 CPUs: what the store does after a pass over each block
    // (`affine_rows_avx512`).
    #[cfg(target_arch = "x86_64")]
    let affine_first = store
        .filter(|e| !e.rounds.is_empty() && is_x86_feature_detected!("avx512f"))
        .map(|e| e.after_affine());
    let finish_in_blocks = gathered && finish.is_some() && store.is_none() && o_sz < SHORT_PLANE;
    // Longer planes whose blocks hold at least LONG_PIECE positions take `finish` on each
    // block's piece of each plane as the block goes into the planes, while in cache, instead of
    // in a pass over the whole output afterwards (shorter pieces cost more per value: below).
    const LONG_PIECE: usize = 128;
    let finish_in_pieces = gathered
        && finish.is_some()
        && store.is_none()
        && !finish_in_blocks
        && super::sgemm::gathered_block_rows(images * o_sz, mg, rows) >= LONG_PIECE;
    for b in (0..n).step_by(images).filter(|_| !direct) {
        for g in 0..group {
            let xg = &xv[(b * c + g * cg) * in_sz..((b + images - 1) * c + (g + 1) * cg) * in_sz];
            let wg = &wv[g * mg * rows..(g + 1) * mg * rows];
            let dst = &mut out_values
                [(b * m + g * mg) * o_sz..((b + images - 1) * m + (g + 1) * mg) * o_sz];
            if let (Some(layout), Some(tiles)) = (planar_layout, &planar_tiles) {
                let padded;
                let (image, offsets, runs) = if layout == planar::Layout::Plane {
                    let plane = planar::Run {
                        image: 0,
                        out: 0,
                        len: o_sz,
                    };
                    (xg, (0..cg).map(|ci| ci * in_sz).collect(), vec![plane])
                } else {
                    padded = PaddedImage::new(xg, cg, in_sp, &w);
                    let runs = planar::row_runs(w.out[0], w.out[1], w.strides[0] * padded.row);
                    (&padded.data[..], padded.tap_offsets(cg, &w), runs)
                };
                let finish = planar::Finish {
                    bias: bv.as_deref(),
                    finish,
                    first_channel: 0,
                    plane_start: b * m * o_sz,
                    store: planar_store.as_ref(),
                };
                planar::planar_product(image, &runs, &offsets, tiles, dst, o_sz, &finish);
                bias_added = true;
            } else if gathered {
                // Output channels across the vector lanes: the product reads the image's taps
                // where they lie and writes [position, channel]; then into planes. A 2-D
                // convolution reads a padded, stride-phased copy of the image; a pointwise
                // one (any rank) the image itself, one tap per channel. (Pointwise ones ran
                // the `gemm` crate on [channel, position] before 2026-11-27: the gathered
                // product took YOLOv8n's 1×1 convolutions 0.56–0.89×, PP-OCRv4 rec −15 %.
                // Strided ones read a phase-split copy of the whole image, 4× the values
                // they use at stride 2, before 2026-11-27: the bench CNN's three 1×1 stride-2
                // shortcuts 34–38 µs, ORT 11.)
                let padded;
                // Rows of one image's positions, then the next image's (`images` > 1 only
                // with one group: an image's channels are `cg` = c planes). A padded stride-2
                // convolution reads the padded copy too: reading its input in place (the
                // windows across the edges from small edge buffers) was no faster in a model
                // and slower on two Intel threads, whose reads of the other core's fresh output
                // the copy's streaming hides (docs/performance-history.md).
                let (image, offsets, origins, image_step): (&[f32], Vec<usize>, Vec<usize>, usize) =
                    if unpadded_1x1 {
                        (
                            xg,
                            (0..cg).map(|ci| ci * in_sz).collect(),
                            strided_origins(in_sp, &w.strides, &w.out),
                            cg * in_sz,
                        )
                    } else {
                        padded = PaddedImage::new(xg, images * cg, in_sp, &w);
                        let offsets = padded.tap_offsets(cg, &w);
                        (
                            &padded.data,
                            offsets,
                            padded.window_origins(&w),
                            cg * padded.plane,
                        )
                    };
                let origins: Vec<usize> = if images == 1 {
                    origins
                } else {
                    (0..images)
                        .flat_map(|i| origins.iter().map(move |&o| o + i * image_step))
                        .collect()
                };
                let packed = packed_weights.get_or_insert_with(|| {
                    super::prepacked::kept_or_made(prepacked, GATHERED_WEIGHTS, || {
                        weight_panels(&wv, group, mg, rows)
                    })
                });
                let bias = bv.as_deref().map(|b| &b[g * mg..(g + 1) * mg]);
                assert!(dst.len() >= ((images - 1) * m + mg) * o_sz);
                let planes = super::util::DisjointPtr(dst.as_mut_ptr());
                // Each finished block of the product goes into the planes, bias added, while in
                // the cache of the thread that computed it. `finish` runs there too on the
                // block's piece of each plane where blocks hold at least LONG_PIECE positions,
                // else afterwards on whole planes: an epilogue run on pieces of a few dozen
                // positions cost more than its arithmetic (a SiLU after a [1,64,20,20] 3×3
                // Conv 28 % of the convolution; run per plane, YOLOv8n's convolutions −6 %),
                // while on pieces of 198–384 it saves a pass over the output (bench CNN, one
                // Zen 3 thread, −8 %).
                let done = |mut block: super::sgemm::GatheredBlock| {
                    let (r0, ld) = (block.rows.start, block.ld);
                    // An epilogue that rounds: the bias, the output's rounding, the affine
                    // stage and its rounding in the block's rows first, 16 channels to a
                    // vector (a channel's constants one load away, no shuffles), so that the
                    // 8×8 stores round only the Add's and the last stage's values.
                    #[cfg(target_arch = "x86_64")]
                    let (bias, store) = match (&store, &affine_first) {
                        (Some(e), Some(rest)) => {
                            // SAFETY: the CPU has AVX-512F (`affine_first`); the block holds
                            // its rows of its columns' values.
                            unsafe { affine_rows_avx512(&mut block, bias, e, g * mg) };
                            (None, Some(*rest))
                        }
                        _ => (bias, store),
                    };
                    // Short planes: the bias and `finish` on the block's rows (a position's
                    // channels, `Channels::From`), the same values in the same order; per
                    // plane they were thousands of calls of a few values each (Silero's planes
                    // of 4: the emulated float16 run 1.4× its FP32 one).
                    let bias = match (finish_in_blocks, finish) {
                        (true, Some(f)) => {
                            let first = g * mg + block.columns.start;
                            let planes = PlanesOf {
                                plane: o_sz,
                                channels: m,
                                image: b,
                            };
                            finish_block_rows(&mut block, first, bias, f, planes);
                            None
                        }
                        _ => bias,
                    };
                    // A block's rows may span images: each image's part into its planes.
                    let mut r = r0;
                    while r < block.rows.end {
                        let image = r / o_sz;
                        let end = block.rows.end.min((image + 1) * o_sz);
                        let part = super::sgemm::GatheredBlock {
                            rows: r - image * o_sz..end - image * o_sz,
                            columns: block.columns.clone(),
                            values: &mut block.values[(r - r0) * ld..],
                            ld,
                        };
                        // SAFETY: the product hands each block of positions × channels once,
                        // and blocks are disjoint, so no other thread writes these values of
                        // the planes (dst holds, per image, mg planes of o_sz at m planes
                        // from the previous image's, asserted above).
                        let image_planes = unsafe { planes.get().add(image * m * o_sz) };
                        let stored = store.as_ref().map(|e| StoredPlanes {
                            epilogue: e,
                            first_channel: g * mg,
                            start: ((b + image) * m + g * mg) * o_sz,
                        });
                        unsafe { block_into_planes(&part, bias, image_planes, o_sz, stored) };
                        if let (true, Some(f)) = (finish_in_pieces, finish) {
                            for ch in part.columns.clone() {
                                // SAFETY: this block's positions of its channel's plane, as
                                // written just above: no other thread touches them.
                                let piece = unsafe {
                                    std::slice::from_raw_parts_mut(
                                        image_planes.add(ch * o_sz + part.rows.start),
                                        part.rows.len(),
                                    )
                                };
                                let ch = g * mg + ch;
                                let start = ((b + image) * m + ch) * o_sz + part.rows.start;
                                f(super::Piece::plane(ch, start), piece);
                            }
                        }
                        r = end;
                    }
                };
                super::sgemm::gemm_gathered(image, &origins, &offsets, &packed[g], &done);
                bias_added = true;
            } else if pointwise {
                sgemm(
                    ctx.accumulate,
                    mg,
                    o_sz,
                    rows,
                    wg,
                    false,
                    xg,
                    false,
                    dst,
                    false,
                );
            } else if in_sp.len() == 2 && ctx.accumulate == crate::numeric::Accumulator::F32 {
                // 2-D: the product packs its B panels straight from the image.
                let image = PaddedImage::new(xg, cg, in_sp, &w);
                let panels = Im2colPanels::new(&image, cg, &w);
                super::sgemm::gemm(mg, o_sz, rows, wg, rows, 1, &panels, dst, o_sz, false);
            } else {
                im2col(xg, in_sp, &w, &mut col);
                sgemm(
                    ctx.accumulate,
                    mg,
                    o_sz,
                    rows,
                    wg,
                    false,
                    &col,
                    false,
                    dst,
                    false,
                );
            }
        }
    }
    // SAFETY: every value is written (see where `out` is made).
    unsafe { out.set_len(total) };
    // The bias (where not added yet), then `finish`, one channel plane at a time.
    let bias = bv.as_ref().filter(|_| !bias_added);
    let finish =
        finish.filter(|_| !finish_in_blocks && !finish_in_pieces && !planar && store.is_none());
    if !direct && (bias.is_some() || finish.is_some()) {
        // Tasks of whole planes and at least 8 Ki values: a small output's planes in one
        // task (Silero's [1,128,4] planes were a fork each).
        let planes_per_task = (8192 / o_sz.max(1)).max(1);
        out.par_chunks_mut(o_sz.max(1))
            .with_min_len(planes_per_task)
            .enumerate()
            .for_each(|(i, ch)| {
                if let Some(bv) = bias {
                    let bias = bv[i % m];
                    ch.iter_mut().for_each(|v| *v += bias);
                }
                if let Some(f) = finish {
                    f(super::Piece::plane(i % m, i * o_sz), ch);
                }
            });
    }
    let mut shape = vec![n, m];
    shape.extend(&w.out);
    Ok(restore_dtype(Tensor::from_f32(shape, out), x.dtype()))
}

/// ConvTranspose's geometry as a [`Window`]: strides, dilations, the padding taken off the
/// full output, and the output's spatial size (`output_shape`, SAME_* auto_pad, or the pads).
pub fn transpose_geometry(
    attrs: &ConvAttrs,
    in_sp: &[usize],
    kernel: &[usize],
) -> Result<Window, OpError> {
    let r = in_sp.len();
    let strides = per_axis("strides", &attrs.window.strides, r, 1)?;
    let dilations = per_axis("dilations", &attrs.window.dilations, r, 1)?;
    let out_pad = per_axis("output_padding", &attrs.output_padding, r, 0)?;
    let auto_pad = attrs.window.auto_pad;
    if kernel.contains(&0) || strides.contains(&0) || dilations.contains(&0) {
        return Err(OpError(format!(
            "kernel {kernel:?}, strides {strides:?} and dilations {dilations:?} must be >= 1"
        )));
    }
    let mut pb = vec![0usize; r];
    let mut pe = vec![0usize; r];
    if let Some(p) = &attrs.window.pads {
        if p.len() != 2 * r {
            return Err(OpError(format!("pads {p:?} must have {} values", 2 * r)));
        }
        pb.copy_from_slice(&p[..r]);
        pe.copy_from_slice(&p[r..]);
    }
    let full = |i: usize| {
        strides[i] * in_sp[i].saturating_sub(1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
    };
    let mut out_sp = vec![0usize; r];
    let output_shape = attrs
        .output_shape
        .as_ref()
        .map(|v| v[v.len().saturating_sub(r)..].to_vec());
    if let Some(os) = &output_shape {
        if os.len() != r {
            return Err(OpError(format!(
                "output_shape {os:?} must have {r} spatial values"
            )));
        }
    }
    for i in 0..r {
        if let Some(os) = &output_shape {
            let target = os[i];
            let total = full(i) as isize - target as isize;
            let total = total.max(0) as usize;
            if auto_pad == AutoPad::SameUpper {
                pb[i] = total / 2;
                pe[i] = total - total / 2;
            } else {
                pb[i] = total - total / 2;
                pe[i] = total / 2;
            }
            out_sp[i] = target;
        } else if auto_pad == AutoPad::SameUpper || auto_pad == AutoPad::SameLower {
            let target = in_sp[i] * strides[i];
            let total = full(i).saturating_sub(target);
            if auto_pad == AutoPad::SameUpper {
                pb[i] = total / 2;
                pe[i] = total - total / 2;
            } else {
                pb[i] = total - total / 2;
                pe[i] = total / 2;
            }
            out_sp[i] = target;
        } else {
            if auto_pad == AutoPad::Valid {
                pb[i] = 0;
                pe[i] = 0;
            }
            out_sp[i] = full(i)
                .checked_sub(pb[i] + pe[i])
                .ok_or_else(|| OpError("pads exceed the output size".into()))?;
        }
    }
    Ok(Window {
        kernel: kernel.to_vec(),
        strides,
        dilations,
        pad_begin: pb,
        pad_end: pe,
        out: out_sp,
    })
}

/// ConvTranspose's col2im: every output of `dst` ([M, *out], all zeros on entry) is the sum,
/// from zero, of the entries of `col` ([M·prod(k)] rows × prod(in) columns, one group of one
/// image) that land on it, in kernel tap order, then plus its plane's `bias[m]` where given
/// (ONNX Runtime's order: the scatter-add tap by tap, then the bias).
#[allow(clippy::too_many_arguments)]
pub(crate) fn col2im<T: Copy + Default + Send + Sync + std::ops::AddAssign>(
    col: &[T],
    in_sp: &[usize],
    kernel: &[usize],
    strides: &[usize],
    dilations: &[usize],
    pb: &[usize],
    out_sp: &[usize],
    dst: &mut [T],
    bias: Option<&[T]>,
) {
    let r = in_sp.len();
    let k_sz: usize = kernel.iter().product();
    let in_sz: usize = in_sp.iter().product();
    let o_sz: usize = out_sp.iter().product();
    if r == 2 {
        // 2-D, an output row at a time: the row's sums build up in one buffer per column stride
        // phase (output columns x ≡ q mod the stride), where each kernel tap adds a contiguous run
        // of its col row (vector adds, the row in L1), tap by tap in kernel order; then the phases
        // interleave into the row, plus the bias. Each output gets the same additions in the same
        // order as a scatter tap by tap. A tap that misses an output adds nothing, where a
        // scatter-add over the phases' whole length would add +0: the same bits, as a sum from +0
        // is never −0.
        let (ih_n, iw_n) = (in_sp[0], in_sp[1]);
        let (oh_n, ow_n) = (out_sp[0], out_sp[1]);
        let (kh_n, kw_n) = (kernel[0], kernel[1]);
        let (sh, sw) = (strides[0], strides[1]);
        // Values per phase buffer: the output columns of phase 0, the longest.
        let phase_len = ow_n.div_ceil(sw);
        // Per kernel column: its phase q and the shift d from input column to phase index (output
        // column x = iw·sw + kw·dw − pw = q + (iw + d)·sw), and the input columns that land in the
        // row.
        let taps: Vec<(usize, isize, std::ops::Range<usize>)> = (0..kw_n)
            .map(|kw| {
                let off = (kw * dilations[1]) as isize - pb[1] as isize;
                let q = off.rem_euclid(sw as isize);
                let d = (off - q) / sw as isize;
                let len = ow_n.saturating_sub(q as usize).div_ceil(sw) as isize;
                let first = (-d).clamp(0, iw_n as isize) as usize;
                let end = (len - d).clamp(first as isize, iw_n as isize) as usize;
                (q as usize, d, first..end)
            })
            .collect();
        dst.par_chunks_mut(o_sz.max(1))
            .enumerate()
            .for_each(|(oc, plane)| {
                let mut sums = vec![T::default(); sw * phase_len];
                for (o, row) in plane.chunks_exact_mut(ow_n.max(1)).enumerate().take(oh_n) {
                    sums.fill(T::default());
                    for kh in 0..kh_n {
                        let from = (o + pb[0]) as isize - (kh * dilations[0]) as isize;
                        if from < 0
                            || from % sh as isize != 0
                            || from / sh as isize >= ih_n as isize
                        {
                            continue;
                        }
                        let ih = from as usize / sh;
                        for (kw, (q, d, cols)) in taps.iter().enumerate() {
                            if cols.is_empty() {
                                continue;
                            }
                            let ki = kh * kw_n + kw;
                            let line = &col[(oc * k_sz + ki) * in_sz + ih * iw_n..][..iw_n];
                            let at = q * phase_len + (cols.start as isize + d) as usize;
                            sums[at..at + cols.len()]
                                .iter_mut()
                                .zip(&line[cols.clone()])
                                .for_each(|(y, &v)| *y += v);
                        }
                    }
                    for (q, phase) in sums.chunks_exact(phase_len.max(1)).enumerate() {
                        let columns = row.iter_mut().skip(q).step_by(sw);
                        columns.zip(phase).for_each(|(y, &v)| *y = v);
                    }
                    if let Some(b) = bias {
                        row.iter_mut().for_each(|y| *y += b[oc]);
                    }
                }
            });
        return;
    }
    dst.par_chunks_mut(o_sz)
        .enumerate()
        .for_each(|(oc, plane)| {
            let mut kidx = vec![0usize; r];
            let mut iidx = vec![0usize; r];
            for ki in 0..k_sz {
                let mut rem = ki;
                for d in (0..r).rev() {
                    kidx[d] = rem % kernel[d];
                    rem /= kernel[d];
                }
                let src = &col[(oc * k_sz + ki) * in_sz..(oc * k_sz + ki + 1) * in_sz];
                for (ii, &v) in src.iter().enumerate() {
                    let mut rem = ii;
                    for d in (0..r).rev() {
                        iidx[d] = rem % in_sp[d];
                        rem /= in_sp[d];
                    }
                    let mut off = 0usize;
                    let mut inside = true;
                    for d in 0..r {
                        let o = (iidx[d] * strides[d] + kidx[d] * dilations[d]) as isize
                            - pb[d] as isize;
                        if o < 0 || o >= out_sp[d] as isize {
                            inside = false;
                            break;
                        }
                        off = off * out_sp[d] + o as usize;
                    }
                    if inside {
                        plane[off] += v;
                    }
                }
            }
            if let Some(b) = bias {
                plane.iter_mut().for_each(|y| *y += b[oc]);
            }
        });
}

fn conv_transpose_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let wt = input(inputs, 1)?;
    let bias = opt_input(inputs, 2);
    if x.rank() < 3 || wt.rank() != x.rank() {
        return Err(OpError(format!(
            "X {:?} and W {:?} must have the same rank >= 3",
            x.shape(),
            wt.shape()
        )));
    }
    let attrs = ctx.attrs::<ConvAttrs>()?;
    let group = attrs.group;
    let (n, c) = (x.shape()[0], x.shape()[1]);
    let in_sp = x.shape()[2..].to_vec();
    if wt.shape()[0] != c || c % group != 0 {
        return Err(OpError(format!(
            "W {:?} does not fit X {:?} with group {group}",
            wt.shape(),
            x.shape()
        )));
    }
    let mg = wt.shape()[1];
    let m = mg * group;
    let cg = c / group;
    let kernel: Vec<usize> = wt.shape()[2..].to_vec();
    let Window {
        strides,
        dilations,
        pad_begin: pb,
        out: out_sp,
        ..
    } = transpose_geometry(attrs, &in_sp, &kernel)?;
    let xv = f32_input(x, "X")?;
    let wv = f32_input(wt, "W")?;
    let bv = bias_values(bias, m)?;
    let k_sz: usize = kernel.iter().product();
    let in_sz: usize = in_sp.iter().product();
    let o_sz: usize = out_sp.iter().product();
    let rows = mg * k_sz;
    let mut out = vec![0f32; n * m * o_sz];
    if out.is_empty() {
        let mut shape = vec![n, m];
        shape.extend(&out_sp);
        return Ok(vec![restore_dtype(Tensor::from_f32(shape, out), x.dtype())]);
    }
    // col[mg·k, in] = Wg^T [mg·k, cg] × Xg [cg, in], per image and group, then col2im. A 2-D
    // one in f32 takes the gathered product with its output rows across the vector lanes: A's
    // rows are the input positions (a pointwise convolution's A: each channel plane read
    // where it lies), B the weights packed once per model, each block moved into col's planes
    // while in cache.
    let gathered = in_sp.len() == 2
        && ctx.accumulate == crate::numeric::Accumulator::F32
        && in_sz > 0
        && cg > 0
        && channels_across_lanes(rows);
    let (offsets, origins): (Vec<usize>, Vec<usize>) = if gathered {
        ((0..cg).map(|ci| ci * in_sz).collect(), (0..in_sz).collect())
    } else {
        Default::default()
    };
    let packed = gathered.then(|| {
        super::prepacked::kept_or_made(ctx.prepacked(1), TRANSPOSED_CONV_WEIGHTS, || {
            transposed_weight_panels(&wv, group, cg, rows)
        })
    });
    let mut col: Vec<f32> = if gathered {
        Vec::with_capacity(rows * in_sz)
    } else {
        vec![0f32; rows * in_sz]
    };
    for b in 0..n {
        for g in 0..group {
            let xg = &xv[(b * c + g * cg) * in_sz..(b * c + (g + 1) * cg) * in_sz];
            if let Some(packed) = &packed {
                let planes = super::util::DisjointPtr(col.as_mut_ptr());
                let done = |block: super::sgemm::GatheredBlock| {
                    // SAFETY: col has room for rows planes of in_sz values; the product hands
                    // each block of positions × rows once and the blocks are disjoint.
                    unsafe { block_into_planes(&block, None, planes.get(), in_sz, None) }
                };
                super::sgemm::gemm_gathered(xg, &origins, &offsets, &packed[g], &done);
                // SAFETY: the blocks cover every (position, row) of the product, so all of
                // col's rows · in_sz values are written.
                unsafe { col.set_len(rows * in_sz) };
            } else {
                let wg = &wv[g * cg * rows..(g + 1) * cg * rows];
                sgemm(
                    ctx.accumulate,
                    rows,
                    in_sz,
                    cg,
                    wg,
                    true,
                    xg,
                    false,
                    &mut col,
                    false,
                );
            }
            let dst = &mut out[(b * m + g * mg) * o_sz..(b * m + (g + 1) * mg) * o_sz];
            let bias = bv.as_deref().map(|b| &b[g * mg..(g + 1) * mg]);
            col2im(
                &col, &in_sp, &kernel, &strides, &dilations, &pb, &out_sp, dst, bias,
            );
        }
    }
    let mut shape = vec![n, m];
    shape.extend(&out_sp);
    Ok(vec![restore_dtype(Tensor::from_f32(shape, out), x.dtype())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Attribute;
    use crate::numeric::Rounding;
    use crate::ops::StoreRounds;

    fn node(op: &str, attrs: &[(&str, Attribute)]) -> Node {
        crate::graph::testing::node_with(op, attrs)
    }

    /// A convolution that rounds as it writes (float16 layer) gives its unrounded output
    /// rounded, bias included, on both orientations (4 and 24 output channels), and says so:
    /// planes of 399 positions (the gathered product's blocks of 384 and 15 rows, or of a
    /// batch of two, a block across the images, take the rounding piece by piece) and of 45
    /// (short planes: in the blocks' rows).
    #[test]
    fn rounding_as_the_planes_are_written_is_rounding_afterwards() {
        for (m, batch, (h, w)) in [
            (4usize, 1usize, (19usize, 21usize)),
            (24, 1, (19, 21)),
            (24, 2, (19, 21)),
            (24, 2, (5, 9)),
        ] {
            let c = 3usize;
            let x: Vec<f32> = (0..batch * c * h * w)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let wv: Vec<f32> = (0..m * c * 9)
                .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.3)
                .collect();
            let bias: Vec<f32> = (0..m).map(|i| i as f32 * 0.31 - 0.5).collect();
            let n = node("Conv", &[("pads", Attribute::Ints(vec![1, 1, 1, 1]))]);
            let args = [
                Tensor::from_f32(vec![batch, c, h, w], x),
                Tensor::from_f32(vec![m, c, 3, 3], wv),
                Tensor::from_f32(vec![m], bias),
            ];
            let args: Vec<Option<&Tensor>> = args.iter().map(Some).collect();
            let plain = conv_op(&OpCtx::new(&n, 17), &args).unwrap().remove(0);
            let mut want = plain.as_f32().unwrap().to_vec();
            crate::numeric::Rounding::F16.round_slice(&mut want);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            // One thread: blocks of up to 384 rows; three: shorter ones.
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let (got, rounded) = pool.install(|| {
                    let mut ctx = OpCtx::new(&n, 17);
                    ctx.round_to = Some(crate::numeric::Rounding::F16);
                    (conv_op(&ctx, &args).unwrap().remove(0), ctx.did_round())
                });
                assert!(rounded);
                let case = format!("{m} channels, {batch} images of {h}×{w}, {threads} threads");
                assert_eq!(bits(got.as_f32().unwrap()), bits(&want), "{case}");
            }
            assert_ne!(bits(plain.as_f32().unwrap()), bits(&want));
        }
    }

    /// A fused BatchNormalization chain (its affine stage, perhaps a residual operand, perhaps
    /// Relu or Clip) handed over in its store form: the gathered product applies it in
    /// registers as its blocks go into the planes, never calling the epilogue, with the bits
    /// of the epilogue applied to the plain output afterwards — with a bias or none, one and
    /// two groups, one and two images, whole and partial 8×8 blocks (12 channels a group; 81
    /// and 25 positions), short planes, NaN, −0 (a channel of zero weights and bias −0 scaled by
    /// −1 and shifted by −0) and values past Clip's bounds; on 1 and 3 threads.
    #[test]
    fn an_epilogue_stored_with_the_planes_is_the_epilogue_afterwards() {
        use crate::ops::lanewise::Lanewise;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (m, group, batch, side, with_bias) in [
            (24usize, 1usize, 1usize, 9usize, true),
            (24, 2, 2, 9, false),
            (32, 1, 2, 14, true),
            (16, 1, 1, 5, false),
        ] {
            let c = 4usize;
            let cg = c / group;
            let mut x: Vec<f32> = (0..batch * c * side * side)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            x[side + 2] = f32::NAN;
            let mut wv: Vec<f32> = (0..m * cg * 9)
                .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.3)
                .collect();
            wv[3 * cg * 9..4 * cg * 9].fill(0.0);
            let n = node(
                "Conv",
                &[
                    ("pads", Attribute::Ints(vec![1, 1, 1, 1])),
                    ("group", Attribute::Int(group as i64)),
                ],
            );
            let mut args = vec![
                Tensor::from_f32(vec![batch, c, side, side], x),
                Tensor::from_f32(vec![m, cg, 3, 3], wv),
            ];
            if with_bias {
                let mut bias: Vec<f32> = (0..m).map(|i| i as f32 * 0.31 - 3.5).collect();
                bias[3] = -0.0;
                args.push(Tensor::from_f32(vec![m], bias));
            }
            let args: Vec<Option<&Tensor>> = args.iter().map(Some).collect();
            let plain = conv_op(&OpCtx::new(&n, 17), &args).unwrap().remove(0);
            let plain = plain.as_f32().unwrap();
            let plane = side * side;
            let mut scale: Vec<f32> = (0..m).map(|i| (i as f32 - 7.5) / 5.0).collect();
            let mut shift: Vec<f32> = (0..m).map(|i| i as f32 * 0.2 - 1.0).collect();
            (scale[3], shift[3]) = (-1.0, -0.0);
            let mut operand: Vec<f32> = (0..plain.len())
                .map(|i| ((i * 7 % 23) as f32 - 11.0) / 3.0)
                .collect();
            operand[5] = f32::NAN;
            operand[plane + 1] = -0.0;
            // Float32, then an emulated plan's roundings (the kernel's AVX2 + F16C stores).
            let (f16, bf16) = (Some(Rounding::F16), Some(Rounding::BF16));
            let roundings = [
                StoreRounds::default(),
                StoreRounds {
                    product: [f16, None],
                    affine: [f16, None],
                    operand: None,
                    sum: [f16, None],
                    last: [f16, None],
                },
                StoreRounds {
                    product: [bf16, f16],
                    affine: [None, bf16],
                    operand: f16,
                    sum: [bf16, None],
                    last: [None, f16],
                },
            ];
            let cases = [(false, false), (true, false), (true, true)]
                .into_iter()
                .flat_map(|o| roundings.iter().map(move |r| (o, *r)));
            for ((with_operand, operand_first), rounds) in cases {
                for last in [None, Some(Lanewise::Relu), Some(Lanewise::Clip(-0.5, 0.75))] {
                    let e = crate::ops::StoreEpilogue {
                        scale: &scale,
                        shift: &shift,
                        operand: with_operand.then_some(&operand[..]),
                        operand_first,
                        last,
                        rounds,
                        affine_done: false,
                    };
                    let want: Vec<f32> = (plain.iter().enumerate())
                        .map(|(i, &v)| e.value(v, i / plane % m, i))
                        .collect();
                    let calls = AtomicUsize::new(0);
                    let finish = |piece: crate::ops::Piece, v: &mut [f32]| {
                        calls.fetch_add(1, Ordering::Relaxed);
                        for (k, v) in v.iter_mut().enumerate() {
                            let i = piece.start + k * piece.step;
                            *v = e.value(*v, i / plane % m, i);
                        }
                    };
                    for threads in [1, 3] {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(threads)
                            .build()
                            .unwrap();
                        let got = pool.install(|| {
                            let mut ctx = OpCtx::new(&n, 17);
                            ctx.epilogue = Some(&finish);
                            ctx.epilogue_store = Some(e);
                            let y = conv_op(&ctx, &args).unwrap().remove(0);
                            assert!(ctx.did_round());
                            y
                        });
                        let case = format!(
                            "{m} channels in {group} groups, {batch} images of {side}², bias \
                             {with_bias}, operand {with_operand} (first {operand_first}), \
                             {last:?}, {rounds:?}, {threads} threads"
                        );
                        assert_eq!(bits(got.as_f32().unwrap()), bits(&want), "{case}");
                        assert_eq!(calls.load(Ordering::Relaxed), 0, "{case}");
                    }
                    assert!(want.iter().any(|v| v.is_nan()));
                    if !with_operand {
                        assert!(want.iter().any(|v| v.to_bits() == (-0f32).to_bits()));
                    }
                }
            }
        }
    }

    fn run(op: &str, attrs: &[(&str, Attribute)], x: Tensor, w: Tensor) -> Tensor {
        let n = node(op, attrs);
        let ctx = OpCtx::new(&n, 17);
        let k = if op == "Conv" {
            conv_op
        } else {
            conv_transpose_op
        };
        k(&ctx, &[Some(&x), Some(&w)]).unwrap().remove(0)
    }

    /// A batch of no images (the gathered product takes a batch as one product: none here).
    #[test]
    fn an_empty_batch_gives_an_empty_output() {
        let x = Tensor::from_f32(vec![0, 4, 5, 5], vec![]);
        let w = Tensor::from_f32(vec![16, 4, 3, 3], vec![0.5; 16 * 4 * 9]);
        let y = run("Conv", &[("pads", Attribute::Ints(vec![1, 1, 1, 1]))], x, w);
        assert_eq!(y.shape(), &[0, 16, 5, 5]);
    }

    #[test]
    fn conv_3x3_same_padding() {
        let x = Tensor::from_f32(vec![1, 1, 3, 3], (1..=9).map(|v| v as f32).collect());
        let w = Tensor::from_f32(vec![1, 1, 3, 3], vec![1.0; 9]);
        let y = run(
            "Conv",
            &[("pads", Attribute::Ints(vec![1, 1, 1, 1]))],
            x.clone(),
            w.clone(),
        );
        assert_eq!(y.shape(), &[1, 1, 3, 3]);
        assert_eq!(
            y.as_f32().unwrap(),
            &[12., 21., 16., 27., 45., 33., 24., 39., 28.]
        );
        let y = run(
            "Conv",
            &[("auto_pad", Attribute::String("SAME_UPPER".into()))],
            x.clone(),
            w.clone(),
        );
        assert_eq!(y.as_f32().unwrap()[4], 45.0);
        let y = run("Conv", &[("strides", Attribute::Ints(vec![2, 2]))], x, w);
        assert_eq!(y.shape(), &[1, 1, 1, 1]);
    }

    /// What output (i, j) reads at kernel tap (kh, kw) of one [h, w] `plane` under
    /// (strides, dilations, pads): the input value, or 0 in the padding.
    fn tap(
        plane: &[f32],
        (h, w): (usize, usize),
        (i, j): (usize, usize),
        (kh, kw): (usize, usize),
        (strides, dil, pads): (&[i64], &[i64], &[i64]),
    ) -> f32 {
        let ih = (i as i64 * strides[0] + kh as i64 * dil[0]) - pads[0];
        let iw = (j as i64 * strides[1] + kw as i64 * dil[1]) - pads[1];
        if (0..h as i64).contains(&ih) && (0..w as i64).contains(&iw) {
            plane[ih as usize * w + iw as usize]
        } else {
            0.0
        }
    }

    /// The depthwise kernel as it was first written (2026-11-23): each tap's product added to
    /// the output rows it reaches, row by row. The vector kernel must give its bits.
    fn depthwise_rows(
        x: &[f32],
        wt: &[f32],
        c: usize,
        in_sp: &[usize],
        w: &Window,
        out: &mut [f32],
    ) {
        let (ih_n, iw_n) = (in_sp[0], in_sp[1]);
        let (oh_n, ow_n) = (w.out[0], w.out[1]);
        let (kh_n, kw_n) = (w.kernel[0], w.kernel[1]);
        let in_sz = ih_n * iw_n;
        let o_sz = oh_n * ow_n;
        let st = w.strides[1] as isize;
        out.par_chunks_mut(o_sz).enumerate().for_each(|(bc, dst)| {
            let img = &x[bc * in_sz..(bc + 1) * in_sz];
            let ker = &wt[(bc % c) * kh_n * kw_n..(bc % c + 1) * kh_n * kw_n];
            for oh in 0..oh_n {
                let row = &mut dst[oh * ow_n..(oh + 1) * ow_n];
                for kh in 0..kh_n {
                    let ih = (oh * w.strides[0] + kh * w.dilations[0]) as isize
                        - w.pad_begin[0] as isize;
                    for kw in 0..kw_n {
                        let k = ker[kh * kw_n + kw];
                        let pad_term = 0.0 * k;
                        if ih < 0 || ih >= ih_n as isize {
                            if !k.is_finite() {
                                row.iter_mut().for_each(|v| *v += pad_term);
                            }
                            continue;
                        }
                        let src = &img[ih as usize * iw_n..(ih as usize + 1) * iw_n];
                        let off = (kw * w.dilations[1]) as isize - w.pad_begin[1] as isize;
                        let ceil_div = |a: isize, b: isize| (a + b - 1).div_euclid(b);
                        let lo = ceil_div(-off, st).clamp(0, ow_n as isize) as usize;
                        let hi = ceil_div(iw_n as isize - off, st).clamp(lo as isize, ow_n as isize)
                            as usize;
                        if !k.is_finite() {
                            row[..lo].iter_mut().for_each(|v| *v += pad_term);
                            row[hi..].iter_mut().for_each(|v| *v += pad_term);
                        }
                        if hi == lo {
                            continue;
                        }
                        let s0 = (lo as isize * st + off) as usize;
                        if st == 1 {
                            for (d, &xv) in row[lo..hi].iter_mut().zip(&src[s0..s0 + (hi - lo)]) {
                                *d += xv * k;
                            }
                        } else {
                            let st = st as usize;
                            for (j, d) in row[lo..hi].iter_mut().enumerate() {
                                *d += src[s0 + j * st] * k;
                            }
                        }
                    }
                }
            }
        });
    }

    /// Both vector depthwise kernels give the row loop's bits, bias added after: kernels 3×3,
    /// 5×5 and 1×4, strides 1–3, dilations, asymmetric padding, rows narrower and wider than a
    /// vector and not a multiple of it, batches, NaN and infinite inputs and weights; 5
    /// channels (one plane at a time), 20 and 37 (channels across the lanes: a partial vector
    /// of channels, channels and columns beyond the copy's 8×8 blocks, tasks over blocks and
    /// over rows). Rounded to float16 as
    /// the planes are written (a float16 layer), the output is the same values rounded, on
    /// rows of channels (planes smaller than the channel count) or on planes.
    #[test]
    fn the_vector_depthwise_kernel_gives_the_bits_of_the_row_loop() {
        let ints = |v: &[i64]| Attribute::Ints(v.to_vec());
        let cases = [
            ([7, 6], [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], false),
            ([12, 40], [5, 5], [1, 1], [1, 1], [2, 2, 2, 2], true),
            ([9, 37], [3, 3], [2, 2], [1, 1], [1, 0, 0, 1], false),
            ([11, 16], [3, 3], [1, 3], [2, 1], [2, 1, 0, 2], true),
            ([5, 70], [1, 4], [1, 2], [1, 2], [0, 3, 0, 1], false),
            ([3, 3], [3, 3], [1, 1], [1, 1], [2, 2, 2, 2], true),
            ([16, 33], [3, 3], [2, 1], [1, 1], [0, 0, 0, 0], false),
        ];
        // (channels, batch): one image of 20 channels splits its rows over tasks too.
        let sizes = [(5usize, 2usize), (20, 2), (37, 2), (20, 1)];
        for ((sp, k, strides, dil, pads, special), (c, n)) in cases
            .into_iter()
            .flat_map(|case| sizes.map(|size| (case, size)))
        {
            let len = n * c * sp[0] * sp[1];
            let mut x: Vec<f32> = (0..len)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                .collect();
            let mut wv: Vec<f32> = (0..c * k[0] * k[1])
                .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
                .collect();
            let bias: Vec<f32> = (0..c).map(|i| i as f32 * 0.37 - 0.5).collect();
            if special {
                x[3] = f32::NAN;
                x[len / 2] = f32::INFINITY;
                wv[1] = f32::NEG_INFINITY;
                wv[k[0] * k[1] + 2] = f32::NAN;
            }
            let attrs = [
                ("group", Attribute::Int(c as i64)),
                ("strides", ints(&strides)),
                ("dilations", ints(&dil)),
                ("pads", ints(&pads)),
            ];
            let node = node("Conv", &attrs);
            let ctx = OpCtx::new(&node, 17);
            let (xt, wt) = (
                Tensor::from_f32(vec![n, c, sp[0], sp[1]], x.clone()),
                Tensor::from_f32(vec![c, 1, k[0], k[1]], wv.clone()),
            );
            let bt = Tensor::from_f32(vec![c], bias.clone());
            let got = conv_op(&ctx, &[Some(&xt), Some(&wt), Some(&bt)])
                .unwrap()
                .remove(0);
            let attrs = ConvAttrs::parse(&node).unwrap();
            let w = window(&attrs.window, &sp, &k, false).unwrap();
            let mut want = vec![0f32; n * c * w.out[0] * w.out[1]];
            depthwise_rows(&x, &wv, c, &sp, &w, &mut want);
            for (i, plane) in want.chunks_mut(w.out[0] * w.out[1]).enumerate() {
                plane.iter_mut().for_each(|v| *v += bias[i % c]);
            }
            // Any NaN is a NaN: which operand's sign and payload an add keeps is the
            // compiler's choice (LLVM may commute an fadd).
            let bits = |v: &[f32]| {
                v.iter()
                    .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                    .collect::<Vec<u32>>()
            };
            let case = format!("{c} channels {sp:?} {k:?} {strides:?} {dil:?} {pads:?}");
            assert_eq!(bits(got.as_f32().unwrap()), bits(&want), "{case}");
            let mut ctx = OpCtx::new(&node, 17);
            ctx.round_to = Some(crate::numeric::Rounding::F16);
            let rounded = conv_op(&ctx, &[Some(&xt), Some(&wt), Some(&bt)])
                .unwrap()
                .remove(0);
            assert!(ctx.did_round());
            crate::numeric::Rounding::F16.round_slice(&mut want);
            assert_eq!(
                bits(rounded.as_f32().unwrap()),
                bits(&want),
                "{case}, float16"
            );
            if special {
                assert!(want.iter().any(|v| v.is_nan()));
            }
        }
    }

    /// The direct depthwise kernel against a naive f64 convolution, with strides, dilations,
    /// asymmetric padding and an infinite weight (0 · inf in the padding gives NaN).
    #[test]
    fn depthwise_matches_a_naive_convolution() {
        let (n, c, h, wd) = (2usize, 3usize, 7usize, 6usize);
        let x: Vec<f32> = (0..n * c * h * wd)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        for (strides, dil, pads, inf) in [
            ([1, 1], [1, 1], [1, 1, 1, 1], false),
            ([2, 1], [1, 2], [0, 2, 1, 0], false),
            ([1, 2], [2, 1], [2, 1, 0, 1], true),
        ] {
            let mut wv: Vec<f32> = (0..c * 9)
                .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
                .collect();
            if inf {
                wv[4] = f32::INFINITY;
            }
            let ints = |v: &[i64]| Attribute::Ints(v.to_vec());
            let out = run(
                "Conv",
                &[
                    ("group", Attribute::Int(c as i64)),
                    ("strides", ints(&strides)),
                    ("dilations", ints(&dil)),
                    ("pads", ints(&pads)),
                ],
                Tensor::from_f32(vec![n, c, h, wd], x.clone()),
                Tensor::from_f32(vec![c, 1, 3, 3], wv.clone()),
            );
            let (oh, ow) = (out.shape()[2], out.shape()[3]);
            let got = out.as_f32().unwrap();
            for b in 0..n {
                for ch in 0..c {
                    for i in 0..oh {
                        for j in 0..ow {
                            let mut acc = 0f64;
                            for kh in 0..3 {
                                for kw in 0..3 {
                                    let plane = &x[(b * c + ch) * h * wd..][..h * wd];
                                    let geometry = (&strides[..], &dil[..], &pads[..]);
                                    let xv = tap(plane, (h, wd), (i, j), (kh, kw), geometry) as f64;
                                    acc += xv * wv[ch * 9 + kh * 3 + kw] as f64;
                                }
                            }
                            let g = got[((b * c + ch) * oh + i) * ow + j] as f64;
                            if acc.is_nan() || acc.is_infinite() {
                                assert!(
                                    g.is_nan() == acc.is_nan() && (g.is_nan() || g == acc),
                                    "{g} vs {acc}"
                                );
                            } else {
                                assert!(
                                    (g - acc).abs() <= 1e-5 * (1.0 + acc.abs()),
                                    "{g} vs {acc}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The implicit GEMM (panels packed from the padded, stride-phased image) against the
    /// chain it promises: per output, fused multiply-adds over (channel, kh, kw) in order from
    /// +0, then the bias — bit for bit, with strides 1–3, dilations, asymmetric and SAME
    /// padding, groups, batches, output rows narrower and wider than a panel, and an infinite
    /// weight (0 · inf in the padding gives NaN, as the im2col path).
    #[test]
    fn implicit_gemm_is_the_in_order_chain_of_every_tap() {
        let ints = |v: &[i64]| Attribute::Ints(v.to_vec());
        for (shape, group, m, kernel, strides, dil, pads, inf) in [
            (
                [1usize, 3, 9, 23],
                1usize,
                5usize,
                [3usize, 3],
                [1i64, 1],
                [1i64, 1],
                [1i64, 1, 1, 1],
                false,
            ),
            (
                [2, 4, 11, 10],
                2,
                8,
                [3, 2],
                [2, 3],
                [1, 2],
                [0, 2, 1, 0],
                true,
            ),
            (
                [1, 2, 20, 37],
                1,
                7,
                [7, 7],
                [2, 2],
                [1, 1],
                [3, 3, 3, 3],
                false,
            ),
            (
                [1, 3, 6, 5],
                1,
                4,
                [2, 3],
                [3, 1],
                [2, 1],
                [2, 0, 1, 2],
                false,
            ),
            // Channels across the lanes: a full panel; groups of 12 with batches and an
            // infinite weight; 37 channels (an edge panel) over 288 taps (two k blocks);
            // the 7×7/2 stem.
            (
                [1, 3, 9, 23],
                1,
                16,
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                false,
            ),
            (
                [2, 6, 11, 10],
                2,
                24,
                [3, 2],
                [2, 3],
                [1, 2],
                [0, 2, 1, 0],
                true,
            ),
            (
                [1, 32, 6, 7],
                1,
                37,
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                false,
            ),
            (
                [1, 3, 20, 37],
                1,
                32,
                [7, 7],
                [2, 2],
                [1, 1],
                [3, 3, 3, 3],
                false,
            ),
            // Channels across the lanes, batches of one group as one product (blocks of rows
            // spanning images): strided 3×3, and a 1-D-like [1, 3] kernel on rows of 9.
            (
                [3, 5, 7, 6],
                1,
                24,
                [3, 3],
                [2, 1],
                [1, 1],
                [1, 1, 1, 0],
                true,
            ),
            (
                [4, 16, 1, 9],
                1,
                40,
                [1, 3],
                [1, 1],
                [1, 1],
                [0, 1, 0, 1],
                false,
            ),
            // Column stride 2, channels across the lanes: rows of 28 (runs of twelve in the
            // stride-phased copy) over batches with an infinite weight; groups, dilation 2 and
            // asymmetric padding; a 1-D-like [1, 3] kernel; 64 channels over 1152 taps.
            (
                [2, 8, 17, 56],
                1,
                32,
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                true,
            ),
            (
                [1, 6, 15, 29],
                2,
                48,
                [3, 3],
                [2, 2],
                [2, 2],
                [2, 0, 1, 3],
                false,
            ),
            (
                [2, 16, 1, 41],
                1,
                32,
                [1, 3],
                [1, 2],
                [1, 1],
                [0, 1, 0, 1],
                false,
            ),
            (
                [1, 128, 14, 14],
                1,
                64,
                [3, 3],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                false,
            ),
            // Pointwise, channels across the lanes (the image read in place): batches with an
            // infinite weight, groups of 16, 300 input channels (two k blocks).
            (
                [2, 40, 5, 7],
                1,
                24,
                [1, 1],
                [1, 1],
                [1, 1],
                [0, 0, 0, 0],
                true,
            ),
            (
                [1, 8, 6, 6],
                2,
                32,
                [1, 1],
                [1, 1],
                [1, 1],
                [0, 0, 0, 0],
                false,
            ),
            (
                [1, 300, 3, 5],
                1,
                16,
                [1, 1],
                [1, 1],
                [1, 1],
                [0, 0, 0, 0],
                false,
            ),
            // Positions across the lanes (the planar product, on AVX-512 CPUs): rows of 48,
            // a 7×7/2 stem with batches, an edge tile of channels and an infinite weight;
            // dilated rows of 60 (a masked last vector); pointwise planes of 320.
            (
                [1, 5, 6, 48],
                1,
                16,
                [3, 3],
                [1, 1],
                [1, 1],
                [1, 1, 1, 1],
                false,
            ),
            (
                [2, 3, 9, 96],
                1,
                9,
                [7, 7],
                [2, 2],
                [1, 1],
                [3, 3, 3, 3],
                true,
            ),
            (
                [1, 4, 7, 64],
                1,
                20,
                [3, 3],
                [1, 1],
                [2, 2],
                [0, 0, 0, 0],
                false,
            ),
            (
                [2, 20, 16, 20],
                1,
                28,
                [1, 1],
                [1, 1],
                [1, 1],
                [0, 0, 0, 0],
                true,
            ),
            // Strided 1×1 (the image read in place at the stride): groups, batches, an
            // infinite weight, rows and columns of different strides.
            (
                [2, 8, 9, 11],
                2,
                32,
                [1, 1],
                [2, 3],
                [1, 1],
                [0, 0, 0, 0],
                true,
            ),
        ] {
            for with_bias in [true, false] {
                let [n, c, h, wd] = shape;
                let cg = c / group;
                let x: Vec<f32> = (0..n * c * h * wd)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
                    .collect();
                let ksz = kernel[0] * kernel[1];
                let mut wv: Vec<f32> = (0..m * cg * ksz)
                    .map(|i| ((i * 13 % 29) as f32 - 14.0) / 9.0)
                    .collect();
                if inf {
                    wv[1] = f32::INFINITY;
                }
                let bias: Vec<f32> = (0..m).map(|i| i as f32 * 0.25 - 0.5).collect();
                let node = node(
                    "Conv",
                    &[
                        ("group", Attribute::Int(group as i64)),
                        ("strides", ints(&strides)),
                        ("dilations", ints(&dil)),
                        ("pads", ints(&pads)),
                    ],
                );
                let out = conv_op(
                    &OpCtx::new(&node, 17),
                    &[
                        Some(&Tensor::from_f32(shape.to_vec(), x.clone())),
                        Some(&Tensor::from_f32(
                            vec![m, cg, kernel[0], kernel[1]],
                            wv.clone(),
                        )),
                        with_bias
                            .then(|| Tensor::from_f32(vec![m], bias.clone()))
                            .as_ref(),
                    ],
                )
                .unwrap()
                .remove(0);
                let (oh, ow) = (out.shape()[2], out.shape()[3]);
                let got = out.as_f32().unwrap();
                let mg = m / group;
                for b in 0..n {
                    for o in 0..m {
                        let g = o / mg;
                        for i in 0..oh {
                            for j in 0..ow {
                                let mut acc = 0f32;
                                for ci in 0..cg {
                                    for kh in 0..kernel[0] {
                                        for kw in 0..kernel[1] {
                                            let plane =
                                                &x[(b * c + g * cg + ci) * h * wd..][..h * wd];
                                            let geometry = (&strides[..], &dil[..], &pads[..]);
                                            let xv =
                                                tap(plane, (h, wd), (i, j), (kh, kw), geometry);
                                            let wt = wv[(o * cg + ci) * ksz + kh * kernel[1] + kw];
                                            acc = xv.mul_add(wt, acc);
                                        }
                                    }
                                }
                                let want = if with_bias { acc + bias[o] } else { acc };
                                let got = got[((b * m + o) * oh + i) * ow + j];
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{shape:?} m {m} out ({b}, {o}, {i}, {j}): {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn grouped_conv_is_per_channel() {
        let x = Tensor::from_f32(vec![1, 2, 1, 2], vec![1., 2., 3., 4.]);
        let w = Tensor::from_f32(vec![2, 1, 1, 1], vec![10., 100.]);
        let y = run("Conv", &[("group", Attribute::Int(2))], x, w);
        assert_eq!(y.as_f32().unwrap(), &[10., 20., 300., 400.]);
    }

    /// The 2-D col2im (by output rows and column phases) adds what the N-D walk adds, in the
    /// same order, then the bias: the same bits as the 2-D problem posed in 3-D (a leading
    /// axis of one), with strides, dilations and pads that crop, and columns no tap reaches.
    #[test]
    fn col2im_in_2d_is_the_general_walk() {
        for (in_sp, kernel, strides, dil, pb, out_sp) in [
            (
                [3usize, 4usize],
                [2usize, 2usize],
                [2usize, 2usize],
                [1usize, 1usize],
                [0usize, 0usize],
                [6usize, 8usize],
            ),
            ([4, 3], [3, 2], [1, 2], [2, 1], [1, 0], [6, 6]),
            ([5, 5], [3, 3], [2, 3], [1, 1], [1, 2], [9, 11]),
            ([3, 3], [1, 1], [3, 3], [1, 1], [0, 0], [9, 10]),
            ([4, 4], [4, 4], [2, 2], [1, 1], [3, 2], [4, 5]),
            ([6, 7], [4, 4], [2, 2], [1, 1], [1, 1], [12, 14]),
        ] {
            let (k_sz, in_sz) = (kernel[0] * kernel[1], in_sp[0] * in_sp[1]);
            let planes = 3;
            let col: Vec<f32> = (0..planes * k_sz * in_sz)
                .map(|i| ((i * 7919 % 211) as f32 - 100.0) / 13.0)
                .collect();
            let o_sz = out_sp[0] * out_sp[1];
            let bias: Vec<f32> = (0..planes).map(|p| p as f32 * 0.75 - 0.5).collect();
            let mut got = vec![0f32; planes * o_sz];
            col2im(
                &col,
                &in_sp,
                &kernel,
                &strides,
                &dil,
                &pb,
                &out_sp,
                &mut got,
                Some(&bias),
            );
            let mut want = vec![0f32; planes * o_sz];
            let three = |a: [usize; 2], lead: usize| [lead, a[0], a[1]];
            col2im(
                &col,
                &three(in_sp, 1),
                &three(kernel, 1),
                &three(strides, 1),
                &three(dil, 1),
                &three(pb, 0),
                &three(out_sp, 1),
                &mut want,
                Some(&bias),
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{in_sp:?} {kernel:?} {strides:?}");
        }
    }

    /// A 2-D ConvTranspose in f32 (the gathered product, then col2im): each output is, tap by
    /// tap in kernel order from +0, the in-order chain of fused multiply-adds over the input
    /// channels of its tap's col entry, then plus the bias — on 1 and 3 threads, with batches,
    /// groups, strides, dilations, pads that crop and output padding.
    #[test]
    fn conv_transpose_is_the_in_order_chain_of_each_tap_then_the_bias() {
        // (batch, channels, group, output channels per group, input, kernel, strides,
        // dilations, pads, output_padding)
        type Case = (
            usize,
            usize,
            usize,
            usize,
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 2],
            [usize; 4],
            [usize; 2],
        );
        let cases: [Case; 3] = [
            (
                2,
                5,
                1,
                4,
                [7, 9],
                [4, 4],
                [2, 2],
                [1, 1],
                [1, 1, 1, 1],
                [0, 0],
            ),
            (
                1,
                6,
                2,
                3,
                [5, 6],
                [3, 3],
                [1, 2],
                [2, 1],
                [0, 2, 1, 0],
                [0, 1],
            ),
            (
                1,
                300,
                1,
                2,
                [3, 4],
                [3, 5],
                [3, 1],
                [1, 1],
                [2, 0, 0, 3],
                [1, 0],
            ),
        ];
        for (batch, c, group, mg, in_sp, kernel, strides, dil, pads, out_pad) in cases {
            let (cg, m) = (c / group, mg * group);
            let in_sz = in_sp[0] * in_sp[1];
            let k_sz = kernel[0] * kernel[1];
            let x: Vec<f32> = (0..batch * c * in_sz)
                .map(|i| ((i * 7919 % 211) as f32 - 100.0) / 13.0)
                .collect();
            let wv: Vec<f32> = (0..c * mg * k_sz)
                .map(|i| ((i * 104729 % 197) as f32 - 98.0) / 17.0)
                .collect();
            let bias: Vec<f32> = (0..m).map(|i| i as f32 * 0.37 - 0.9).collect();
            let full =
                |a: usize| strides[a] * (in_sp[a] - 1) + out_pad[a] + (kernel[a] - 1) * dil[a] + 1;
            let out_sp = [full(0) - pads[0] - pads[2], full(1) - pads[1] - pads[3]];
            let o_sz = out_sp[0] * out_sp[1];
            let mut want = vec![0f32; batch * m * o_sz];
            for b in 0..batch {
                for g in 0..group {
                    for oc in 0..mg {
                        let plane = &mut want[(b * m + g * mg + oc) * o_sz..][..o_sz];
                        for ki in 0..k_sz {
                            let (kh, kw) = (ki / kernel[1], ki % kernel[1]);
                            for p in 0..in_sz {
                                let (ih, iw) = (p / in_sp[1], p % in_sp[1]);
                                let mut acc = 0f32;
                                for ci in 0..cg {
                                    let ch = g * cg + ci;
                                    let xv = x[(b * c + ch) * in_sz + p];
                                    acc = xv.mul_add(wv[(ch * mg + oc) * k_sz + ki], acc);
                                }
                                let oh =
                                    (ih * strides[0] + kh * dil[0]) as isize - pads[0] as isize;
                                let ow =
                                    (iw * strides[1] + kw * dil[1]) as isize - pads[1] as isize;
                                if (0..out_sp[0] as isize).contains(&oh)
                                    && (0..out_sp[1] as isize).contains(&ow)
                                {
                                    plane[oh as usize * out_sp[1] + ow as usize] += acc;
                                }
                            }
                        }
                        plane.iter_mut().for_each(|v| *v += bias[g * mg + oc]);
                    }
                }
            }
            let ints = |v: &[usize]| Attribute::Ints(v.iter().map(|&i| i as i64).collect());
            let n = node(
                "ConvTranspose",
                &[
                    ("group", Attribute::Int(group as i64)),
                    ("strides", ints(&strides)),
                    ("dilations", ints(&dil)),
                    ("pads", ints(&pads)),
                    ("output_padding", ints(&out_pad)),
                ],
            );
            let args = [
                Tensor::from_f32(vec![batch, c, in_sp[0], in_sp[1]], x.clone()),
                Tensor::from_f32(vec![c, mg, kernel[0], kernel[1]], wv.clone()),
                Tensor::from_f32(vec![m], bias.clone()),
            ];
            let args: Vec<Option<&Tensor>> = args.iter().map(Some).collect();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let y = pool
                    .install(|| conv_transpose_op(&OpCtx::new(&n, 17), &args))
                    .unwrap()
                    .remove(0);
                assert_eq!(y.shape(), &[batch, m, out_sp[0], out_sp[1]]);
                let case = format!(
                    "{in_sp:?} k {kernel:?} s {strides:?} group {group}, {threads} threads"
                );
                assert_eq!(bits(y.as_f32().unwrap()), bits(&want), "{case}");
            }
        }
    }

    #[test]
    fn conv_transpose_upsamples() {
        let x = Tensor::from_f32(vec![1, 1, 2], vec![1., 2.]);
        let w = Tensor::from_f32(vec![1, 1, 2], vec![1., 1.]);
        let y = run(
            "ConvTranspose",
            &[("strides", Attribute::Ints(vec![2]))],
            x,
            w,
        );
        assert_eq!(y.shape(), &[1, 1, 4]);
        assert_eq!(y.as_f32().unwrap(), &[1., 1., 2., 2.]);
    }

    #[test]
    fn bad_attributes_are_load_errors() {
        use crate::ops::attrs::testing::assert_rejected;
        let ints = |v: &[i64]| Attribute::Ints(v.to_vec());
        assert_rejected(
            "Conv",
            &[("kernel_shape", ints(&[3, 3])), ("pads", ints(&[1, 1, 1]))],
            "pads",
            "expected 4 values (2 spatial dims x 2), got 3",
        );
        assert_rejected("Conv", &[("pads", ints(&[1, 1, 1]))], "pads", "even number");
        assert_rejected(
            "Conv",
            &[("kernel_shape", ints(&[3, 3])), ("strides", ints(&[1]))],
            "strides",
            "expected 2 values",
        );
        assert_rejected("Conv", &[("strides", ints(&[0, 1]))], "strides", ">= 1");
        assert_rejected("ConvTranspose", &[("pads", ints(&[-1, 0]))], "pads", ">= 0");
        assert_rejected(
            "Conv",
            &[("auto_pad", Attribute::String("SAME".into()))],
            "auto_pad",
            "'SAME' is not one of",
        );
        assert_rejected("Conv", &[("group", Attribute::Int(0))], "group", ">= 1");
        assert_rejected(
            "Conv",
            &[("dilations", Attribute::Floats(vec![1.0]))],
            "dilations",
            "expected a list of ints, got a list of floats",
        );
    }

    /// A 5×5 kernel with pads 2 on a 1×1 input: every kernel row but the centre one lies
    /// wholly in the padding. ONNX Runtime returns x · w[2][2] (the one overlapping tap).
    #[test]
    fn kernel_rows_wholly_in_the_padding() {
        let x = Tensor::from_f32(vec![1, 1, 1, 1], vec![3.0]);
        let w = Tensor::from_f32(vec![1, 1, 5, 5], (0..25).map(|i| i as f32).collect());
        let y = run("Conv", &[("pads", Attribute::Ints(vec![2, 2, 2, 2]))], x, w);
        assert_eq!(y.shape(), &[1, 1, 1, 1]);
        assert_eq!(y.as_f32().unwrap(), &[3.0 * 12.0]);
    }
}
