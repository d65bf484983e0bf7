//! Q/DQ absorbed into integer kernels, as TensorRT runs explicitly quantized models
//! (`--fusion tensorrt`; docs/numerics.md, "Q/DQ under TensorRT").
//!
//! A Conv, ConvTranspose, MatMul or Gemm whose two data operands are both quantized — an
//! activation that arrives from a per-tensor DequantizeLinear (directly or through data
//! movement and MaxPool, which commute with Q/DQ), a weight that is the DequantizeLinear of
//! stored codes (per tensor or per output channel) — runs as one quantized kernel
//! ([`IntegerKernel`]): the products of the codes (minus zero points) are summed exactly in
//! i32 (`ops::integer`), or for float8 codes multiplied exactly and summed in f32, and the
//! sum is rescaled once, `acc · (s_x · s_w[c])`, in f32, before the bias. The epilogue and a
//! following QuantizeLinear then run on that value as the graph says (requantization of the
//! f32 result). Under an int8/fp8 *plan* the same kernel runs the emulated quantized layers
//! ([`IntegerKernel::for_plan_layer`]): they are what their exported Q/DQ model computes on
//! TensorRT.
//!
//! The kernel reads activation codes back from the dequantized values it receives: a value
//! `v = fl((q − zp) · s)` (or that value rounded to float16, or quantized by a plan with scale
//! `s`) requantizes to exactly `q` with the same `s` and `zp`, since `|v/s − (q − zp)| ≤ 255 ·
//! 2^-11 < 1/2` for 8-bit codes (test `codes_are_read_back_exactly`).

use crate::graph::{Graph, Node, ValueIndex};
use crate::ops::conv::ConvAttrs;
use crate::ops::integer::{iconv, iconv_transpose, imatmul, FloatWeights};
use crate::ops::prepacked::{tag, tag::FLOAT_WEIGHTS, Prepacked};
use crate::ops::{Channels, OpCtx, OpError, OpResult};
use crate::precision::quant::{quantize, weight_channel_axis};
use crate::precision::Precision;
use crate::tensor::{DType, Tensor};
use std::sync::Arc;

/// How the products of an operand pair are computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    /// Integer codes, exact i32 accumulation.
    Int,
    /// float8 codes, exact products, f32 accumulation.
    Fp8,
}

/// A quantization grid: integer codes in `[lo, hi]`, or a float8 type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Grid {
    Int { lo: i32, hi: i32 },
    Float8(Precision),
}

impl Grid {
    fn of(d: DType) -> Option<Grid> {
        Some(match d {
            DType::I8 => Grid::Int { lo: -128, hi: 127 },
            DType::U8 => Grid::Int { lo: 0, hi: 255 },
            DType::I4 => Grid::Int { lo: -8, hi: 7 },
            DType::U4 => Grid::Int { lo: 0, hi: 15 },
            DType::F8E4M3FN => Grid::Float8(Precision::Fp8E4M3),
            DType::F8E5M2 => Grid::Float8(Precision::Fp8E5M2),
            _ => return None,
        })
    }

    fn arith(&self) -> Arith {
        match self {
            Grid::Int { .. } => Arith::Int,
            Grid::Float8(_) => Arith::Fp8,
        }
    }
}

/// An activation operand quantized per tensor: its codes are read back from the dequantized
/// values the kernel receives.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ActQuant {
    pub scale: f32,
    pub zp: i32,
    pub grid: Grid,
}

/// The codes of an operand (minus zero points) in the arithmetic of the kernel.
#[derive(Clone, Debug)]
pub(crate) enum Codes {
    Int(Vec<i32>),
    Float(Vec<f32>),
}

/// A weight operand: its codes (minus zero points) prepared once, and its scales (one, or one
/// per slice along `axis`, the output-channel axis of the operand).
#[derive(Clone, Debug)]
pub(crate) struct WeightQuant {
    pub codes: Codes,
    pub shape: Vec<usize>,
    pub scales: Vec<f32>,
    pub axis: usize,
}

#[derive(Clone, Debug)]
pub(crate) enum Operand {
    Act(ActQuant),
    Weight(WeightQuant),
}

/// One layer's quantized kernel: operands 0 and 1 of a Conv, ConvTranspose, MatMul or Gemm.
#[derive(Clone, Debug)]
pub(crate) struct IntegerKernel {
    pub arith: Arith,
    pub operands: [Operand; 2],
    /// Forms of the weight operand derived once (its codes as f32, the convolution's packed
    /// panels of them), shared by every plan that holds the kernel.
    kept: Arc<Prepacked>,
}

/// An operand's codes, shape and per-index scale lookup.
struct Prepared {
    codes: Codes,
    shape: Vec<usize>,
    scales: Vec<f32>,
    /// The axis the scales run along (None: one scale).
    axis: Option<usize>,
}

/// Reads the codes of a dequantized activation back (see the module documentation): integer
/// grids through [`ActQuant::float_codes`] (one rule for both paths).
fn act_codes(q: &ActQuant, t: &Tensor) -> Result<Codes, OpError> {
    Ok(match q.grid {
        Grid::Int { lo, hi } => {
            let codes = q.float_codes(t, lo, hi)?;
            // The codes are integers inside the grid less the zero point: exact as i32.
            let codes = codes.as_f32().expect("f32");
            Codes::Int(codes.iter().map(|&c| c as i32).collect())
        }
        Grid::Float8(p) => {
            let v = t
                .to_f32_vec()
                .ok_or_else(|| OpError(format!("a quantized operand has dtype {}", t.dtype())))?;
            Codes::Float(v.iter().map(|&x| quantize(x, q.scale, p)).collect())
        }
    })
}

impl ActQuant {
    /// The largest magnitude a code minus the zero point can have on the grid `lo..=hi`.
    fn farthest_code(&self, lo: i32, hi: i32) -> u64 {
        (hi - self.zp).max(self.zp - lo).unsigned_abs() as u64
    }

    /// The codes (minus the zero point) of an integer grid read back from `t` as f32 values:
    /// the same codes as [`act_codes`], in the vectorized map (a branch-free select instead of
    /// the early return for NaN).
    fn float_codes(&self, t: &Tensor, lo: i32, hi: i32) -> Result<Tensor, OpError> {
        let owned;
        let v = match t.as_f32() {
            Some(v) => v,
            None => {
                owned = t.to_f32_vec().ok_or_else(|| {
                    OpError(format!("a quantized operand has dtype {}", t.dtype()))
                })?;
                &owned[..]
            }
        };
        let (s, zp) = (self.scale, self.zp as f32);
        let (lo, hi) = (lo as f32, hi as f32);
        let code = |x: f32| {
            let q = x / s;
            // Integers below 2^24 in magnitude are exact in every step; beyond, the code
            // saturates as the i32 path's does.
            let c = (q.round_ties_even() + zp).max(lo).min(hi) - zp;
            if q.is_nan() {
                0.0
            } else {
                c
            }
        };
        let codes = crate::ops::logistic::map_slice(v, &|_| {}, &code);
        Ok(Tensor::from_f32(t.shape().to_vec(), codes))
    }
}

/// The largest magnitude among float codes (integers, no NaN): compared as the bits of |c|,
/// which order as the values do and reduce in integer vectors (an f32 `max` fold runs one
/// value at a time).
fn largest_code(codes: &[f32]) -> u64 {
    let bits = codes.iter().map(|c| c.to_bits() & 0x7fff_ffff).max();
    f32::from_bits(bits.unwrap_or(0)) as u64
}

/// An operand's integer codes as f32 values, and a bound on their magnitudes.
struct FloatOperand {
    codes: Tensor,
    max_abs: u64,
    /// Whether `max_abs` is the largest magnitude itself (not only a bound).
    scanned: bool,
}

impl FloatOperand {
    /// The largest magnitude among the codes.
    fn largest(&self) -> u64 {
        if self.scanned {
            self.max_abs
        } else {
            largest_code(self.codes.as_f32().expect("f32"))
        }
    }
}

impl Operand {
    fn prepare(&self, t: Option<&Tensor>) -> Result<Prepared, OpError> {
        match self {
            Operand::Weight(w) => Ok(Prepared {
                codes: w.codes.clone(),
                shape: w.shape.clone(),
                axis: (w.scales.len() > 1).then_some(w.axis),
                scales: w.scales.clone(),
            }),
            Operand::Act(a) => {
                let t = t.ok_or_else(|| OpError("a quantized operand is missing".into()))?;
                Ok(Prepared {
                    codes: act_codes(a, t)?,
                    shape: t.shape().to_vec(),
                    scales: vec![a.scale],
                    axis: None,
                })
            }
        }
    }
}

impl Prepared {
    fn ints(&self) -> &[i32] {
        match &self.codes {
            Codes::Int(v) => v,
            Codes::Float(_) => &[],
        }
    }

    fn floats(&self) -> Tensor {
        let v = match &self.codes {
            Codes::Float(v) => v.clone(),
            Codes::Int(v) => v.iter().map(|&x| x as f32).collect(),
        };
        Tensor::from_f32(self.shape.clone(), v)
    }

    /// The scale of slice `i` along the operand's scale axis.
    fn scale(&self, i: usize) -> f32 {
        if self.scales.len() == 1 {
            self.scales[0]
        } else {
            self.scales[i % self.scales.len()]
        }
    }

    /// Transposed copy of a 2-D operand.
    fn transposed(&self) -> Prepared {
        let (r, c) = (self.shape[0], self.shape[1]);
        let codes = match &self.codes {
            Codes::Int(v) => Codes::Int((0..r * c).map(|i| v[(i % r) * c + i / r]).collect()),
            Codes::Float(v) => Codes::Float((0..r * c).map(|i| v[(i % r) * c + i / r]).collect()),
        };
        Prepared {
            codes,
            shape: vec![c, r],
            scales: self.scales.clone(),
            axis: self.axis.map(|a| 1 - a),
        }
    }
}

/// A product's accumulation (as f32 values) and its shape.
type Accumulation = (Vec<f32>, Vec<usize>);

/// The sum of products: exact i32 (as f32 values) or f32 over float8 codes.
fn accumulate_matmul(arith: Arith, a: &Prepared, b: &Prepared) -> Result<Accumulation, OpError> {
    match arith {
        Arith::Int => {
            let (acc, shape) = imatmul(a.ints(), &a.shape, b.ints(), &b.shape)?;
            Ok((acc.into_iter().map(|x| x as f32).collect(), shape))
        }
        Arith::Fp8 => {
            let t = crate::ops::matmul::matmul(
                crate::numeric::Accumulator::F32,
                &a.floats(),
                &b.floats(),
            )?;
            Ok((t.as_f32().expect("f32").to_vec(), t.shape().to_vec()))
        }
    }
}

impl IntegerKernel {
    /// What the kernel computes, in words (`-v`).
    pub fn describe(&self) -> &'static str {
        match self.arith {
            Arith::Int => "integer codes, exact i32 accumulation, rescaled in f32",
            Arith::Fp8 => "float8 codes, f32 accumulation, rescaled in f32",
        }
    }

    /// Runs the layer `ctx.node` on `args` (the layer's inputs as the interpreter prepared
    /// them; weight operands are taken from the kernel).
    pub fn run(&self, ctx: &OpCtx, args: &[Option<&Tensor>]) -> OpResult {
        let node = ctx.node;
        let out_dtype = args
            .iter()
            .take(2)
            .flatten()
            .map(|t| t.dtype())
            .find(|d| matches!(d, DType::F16 | DType::BF16))
            .unwrap_or(DType::F32);
        if let Some(y) = self.conv_in_f32(ctx, args, out_dtype == DType::F32)? {
            return Ok(vec![output_in(y, out_dtype)]);
        }
        let prepare = || -> Result<(Prepared, Prepared), OpError> {
            Ok((
                self.operands[0].prepare(args.first().copied().flatten())?,
                self.operands[1].prepare(args.get(1).copied().flatten())?,
            ))
        };
        let (y, shape) = match node.op_type.as_str() {
            "Conv" | "ConvTranspose" => {
                let (a, b) = prepare()?;
                let attrs = ctx.attrs::<ConvAttrs>()?;
                let transpose = node.op_type == "ConvTranspose";
                let (acc, shape): (Vec<f32>, Vec<usize>) = match self.arith {
                    Arith::Int => {
                        let f = if transpose { iconv_transpose } else { iconv };
                        let (acc, shape) = f(attrs, a.ints(), &a.shape, b.ints(), &b.shape)?;
                        (acc.into_iter().map(|x| x as f32).collect(), shape)
                    }
                    Arith::Fp8 => {
                        let def = crate::ops::def_of(node)
                            .ok_or_else(|| OpError("no float kernel".into()))?;
                        let f32ctx = OpCtx::new(node, ctx.opset);
                        let (xa, wb) = (a.floats(), b.floats());
                        let t = (def.kernel)(&f32ctx, &[Some(&xa), Some(&wb)])?.remove(0);
                        (t.as_f32().expect("f32").to_vec(), t.shape().to_vec())
                    }
                };
                let m = shape[1];
                let o_sz: usize = shape[2..].iter().product();
                let bias = conv_bias(args, m)?;
                let sx = a.scale(0);
                let mut y = acc;
                for (i, ch) in y.chunks_mut(o_sz.max(1)).enumerate() {
                    let c = i % m;
                    let r = sx * b.scale(c);
                    let bc = bias.as_ref().map(|b| b[c]);
                    for v in ch.iter_mut() {
                        *v *= r;
                        if let Some(bc) = bc {
                            *v += bc;
                        }
                    }
                }
                (y, shape)
            }
            "MatMul" => {
                let (acc, shape) = match self.matmul_in_f32(args, None)? {
                    Some(product) => product,
                    None => {
                        let (a, b) = prepare()?;
                        accumulate_matmul(self.arith, &a, &b)?
                    }
                };
                let shape_of = |i: usize| self.operand_shape(i, args);
                let (a_shape, b_shape) = (shape_of(0)?, shape_of(1)?);
                let n = if b_shape.len() == 1 {
                    1
                } else {
                    b_shape[b_shape.len() - 1]
                };
                let m = if a_shape.len() == 1 {
                    1
                } else {
                    a_shape[a_shape.len() - 2]
                };
                let mut y = acc;
                let col_scales: Vec<f32> = (0..n).map(|col| self.scale(1, col)).collect();
                // A float32 output takes the layer's epilogue row by row (a column is a
                // channel), as the float MatMul's does.
                let epilogue = ctx.epilogue_for(&shape).filter(|_| out_dtype == DType::F32);
                for (r, row) in y.chunks_mut(n.max(1)).enumerate() {
                    let row_scale = self.scale(0, r % m.max(1));
                    for (v, &col_scale) in row.iter_mut().zip(&col_scales) {
                        *v *= row_scale * col_scale;
                    }
                    if let Some(e) = epilogue {
                        e(crate::ops::Piece::row(0, r * n, 1), row);
                    }
                }
                if epilogue.is_some() {
                    ctx.epilogue_applied();
                }
                (y, shape)
            }
            "Gemm" => {
                let attrs = ctx.attrs::<crate::ops::matmul::GemmAttrs>()?;
                let (acc, shape) = match self.matmul_in_f32(args, Some(attrs))? {
                    Some(product) => product,
                    None => {
                        let (a, b) = prepare()?;
                        if a.shape.len() != 2 || b.shape.len() != 2 {
                            return Err(OpError("Gemm operands must be 2-D".into()));
                        }
                        let a2 = if attrs.trans_a { a.transposed() } else { a };
                        let b2 = if attrs.trans_b { b.transposed() } else { b };
                        accumulate_matmul(self.arith, &a2, &b2)?
                    }
                };
                let n = shape[1];
                let c = args.get(2).copied().flatten();
                let cv = c.map(|t| t.to_f32_vec().unwrap_or_default());
                let cs = c.map(|t| crate::ops::util::broadcast_strides(t.shape(), &shape));
                let mut y = acc;
                let col_scales: Vec<f32> = (0..n).map(|col| self.scale(1, col)).collect();
                for (i, v) in y.iter_mut().enumerate() {
                    let (row, col) = (i / n, i % n);
                    *v *= self.scale(0, row) * col_scales[col];
                    if attrs.alpha != 1.0 {
                        *v *= attrs.alpha;
                    }
                    if let (Some(cv), Some(cs)) = (&cv, &cs) {
                        let k = row * cs[0] + col * cs[1];
                        *v += if attrs.beta == 1.0 {
                            cv[k]
                        } else {
                            attrs.beta * cv[k]
                        };
                    }
                }
                (y, shape)
            }
            op => return Err(OpError(format!("{op} has no quantized kernel"))),
        };
        Ok(vec![output_in(Tensor::from_f32(shape, y), out_dtype)])
    }

    /// The scale of slice `i` of operand `idx` along its scale axis (a transposed operand's
    /// axis moves with it: the index is the same).
    fn scale(&self, idx: usize, i: usize) -> f32 {
        match &self.operands[idx] {
            Operand::Act(a) => a.scale,
            Operand::Weight(w) if w.scales.len() == 1 => w.scales[0],
            Operand::Weight(w) => w.scales[i % w.scales.len()],
        }
    }

    /// The shape of operand `idx` (a weight's, or the input's), before any transposition.
    fn operand_shape(&self, idx: usize, args: &[Option<&Tensor>]) -> Result<Vec<usize>, OpError> {
        match &self.operands[idx] {
            Operand::Weight(w) => Ok(w.shape.clone()),
            Operand::Act(_) => args
                .get(idx)
                .copied()
                .flatten()
                .map(|t| t.shape().to_vec())
                .ok_or_else(|| OpError("a quantized operand is missing".into())),
        }
    }

    /// The codes of operand `idx` of an integer grid as f32 (transposed for Gemm's `trans`)
    /// and a bound on their magnitudes: a weight's made once and kept with the kernel, an
    /// activation's read back from its input with the grid's farthest code as the bound.
    fn float_operand(
        &self,
        idx: usize,
        args: &[Option<&Tensor>],
        transpose: bool,
    ) -> Result<Option<Arc<FloatOperand>>, OpError> {
        match &self.operands[idx] {
            Operand::Weight(w) => {
                let Codes::Int(codes) = &w.codes else {
                    return Ok(None);
                };
                let make = || {
                    let t = Tensor::from_f32(
                        w.shape.clone(),
                        codes.iter().map(|&c| c as f32).collect(),
                    );
                    let t = if transpose {
                        crate::ops::matmul::permute(&t, &[1, 0])
                    } else {
                        t
                    };
                    let max_abs = codes
                        .iter()
                        .map(|c| c.unsigned_abs() as u64)
                        .max()
                        .unwrap_or(0);
                    FloatOperand {
                        codes: t,
                        max_abs,
                        scanned: true,
                    }
                };
                Ok(Some(
                    self.kept.get_or_insert(tag::QDQ_OPERAND_CODES[idx], make),
                ))
            }
            Operand::Act(a) => {
                let Grid::Int { lo, hi } = a.grid else {
                    return Ok(None);
                };
                let x = args
                    .get(idx)
                    .copied()
                    .flatten()
                    .ok_or_else(|| OpError("a quantized operand is missing".into()))?;
                let t = a.float_codes(x, lo, hi)?;
                let t = if transpose {
                    if t.rank() != 2 {
                        return Err(OpError("Gemm operands must be 2-D".into()));
                    }
                    crate::ops::matmul::permute(&t, &[1, 0])
                } else {
                    t
                };
                let max_abs = a.farthest_code(lo, hi);
                Ok(Some(Arc::new(FloatOperand {
                    codes: t,
                    max_abs,
                    scanned: false,
                })))
            }
        }
    }

    /// The exact integer product of a MatMul (or Gemm, with its transpositions) of integer
    /// codes through the float32 MatMul kernel, where every partial sum is an integer f32
    /// holds exactly (at most 2^24: the operands' largest magnitudes times the inner
    /// dimension bound them; an activation's codes are scanned where its grid's bound is not
    /// enough). The accumulation (as f32) and its shape, None where this does not apply.
    fn matmul_in_f32(
        &self,
        args: &[Option<&Tensor>],
        gemm: Option<&crate::ops::matmul::GemmAttrs>,
    ) -> Result<Option<Accumulation>, OpError> {
        if self.arith != Arith::Int {
            return Ok(None);
        }
        let (ta, tb) = gemm.map_or((false, false), |g| (g.trans_a, g.trans_b));
        let (Some(a), Some(b)) = (
            self.float_operand(0, args, ta)?,
            self.float_operand(1, args, tb)?,
        ) else {
            return Ok(None);
        };
        if gemm.is_some() && (a.codes.rank() != 2 || b.codes.rank() != 2) {
            return Err(OpError("Gemm operands must be 2-D".into()));
        }
        let a_shape = a.codes.shape();
        let k = a_shape[a_shape.len() - 1] as u64;
        let exact = |ma: u64, mb: u64| ma.saturating_mul(mb).saturating_mul(k) <= 1 << 24;
        if !exact(a.max_abs, b.max_abs) && !exact(a.largest(), b.largest()) {
            return Ok(None);
        }
        let y = crate::ops::matmul::matmul(crate::numeric::Accumulator::F32, &a.codes, &b.codes)?;
        let (shape, data) = y.into_parts();
        let crate::tensor::TensorData::F32(v) = data else {
            unreachable!("a float32 product");
        };
        Ok(Some((v.into_vec(), shape)))
    }

    /// A Conv of activation codes by weight codes of an integer grid through the float32
    /// convolution kernel, where that is exact ([`FloatWeights::exact_with`]: the f32 sums
    /// are the i32 sums): the codes as f32, the weight's (and its packed panels) kept with the
    /// kernel, the rescale `acc · (s_x · s_w[c])` and the bias applied to each finished plane
    /// in the kernel's output loop — the values of the i32 path — then, for a float32 output
    /// (`f32_out`), the layer's epilogue (the pointwise layers after it). None where it does
    /// not apply.
    fn conv_in_f32(
        &self,
        ctx: &OpCtx,
        args: &[Option<&Tensor>],
        f32_out: bool,
    ) -> Result<Option<Tensor>, OpError> {
        let (Arith::Int, "Conv", [Operand::Act(aq), Operand::Weight(wq)]) =
            (self.arith, ctx.node.op_type.as_str(), &self.operands)
        else {
            return Ok(None);
        };
        let (Grid::Int { lo, hi }, Codes::Int(w_codes)) = (aq.grid, &wq.codes) else {
            return Ok(None);
        };
        // The float kernel's sums must be f32 sums (exact below 2^24), not float16 ones.
        if ctx.accumulate != crate::numeric::Accumulator::F32 {
            return Ok(None);
        }
        let x = args
            .first()
            .copied()
            .flatten()
            .ok_or_else(|| OpError("a quantized operand is missing".into()))?;
        let fw = self
            .kept
            .get_or_insert(FLOAT_WEIGHTS, || FloatWeights::new(w_codes, &wq.shape));
        let xc = aq.float_codes(x, lo, hi)?;
        // No code is farther from the zero point than the grid's ends: where that bound
        // already makes the product exact, the codes need no scan.
        if !fw.exact_with(aq.farthest_code(lo, hi))
            && !fw.exact_with(largest_code(xc.as_f32().expect("f32")))
        {
            return Ok(None);
        }
        let m = wq.shape[0];
        let bias = conv_bias(args, m)?;
        let rescale: Vec<f32> = (0..m)
            .map(|c| aq.scale * wq.scales[c % wq.scales.len()])
            .collect();
        let attrs = ctx.attrs::<ConvAttrs>()?;
        let epilogue = ctx
            .epilogue
            .and_then(|_| crate::ops::conv::conv_output_shape(attrs, &xc, &fw.w))
            .and_then(|shape| ctx.epilogue_for(&shape))
            .filter(|_| f32_out);
        let finish = |piece: crate::ops::Piece, v: &mut [f32]| {
            let channel = |i: usize| match piece.channels {
                Channels::One(c) => c,
                Channels::From(f) => f + i,
            };
            for (i, v) in v.iter_mut().enumerate() {
                let c = channel(i);
                *v *= rescale[c];
                if let Some(b) = &bias {
                    *v += b[c];
                }
            }
            if let Some(e) = epilogue {
                e(piece, v);
            }
        };
        let y = crate::ops::conv::conv(
            ctx,
            attrs,
            &xc,
            &fw.w,
            None,
            Some(&finish),
            None,
            Some(&self.kept),
        )?;
        if epilogue.is_some() {
            ctx.epilogue_applied();
        }
        Ok(Some(y))
    }

    /// The kernel of an int8/fp8 layer of a plan, from its prepared operands: activations
    /// quantized per tensor with `scale`, weights `w` (the original values) per channel.
    pub fn for_plan_layer(
        node: &Node,
        p: Precision,
        operands: [(Option<f32>, Option<&Tensor>); 2],
    ) -> Option<IntegerKernel> {
        let grid = match p {
            Precision::Int8 => Grid::Int { lo: -128, hi: 127 },
            Precision::Fp8E4M3 | Precision::Fp8E5M2 => Grid::Float8(p),
            _ => return None,
        };
        let mut out = Vec::with_capacity(2);
        for (idx, (scale, w)) in operands.into_iter().enumerate() {
            out.push(match (scale, w) {
                (Some(scale), _) => Operand::Act(ActQuant { scale, zp: 0, grid }),
                (None, Some(w)) => {
                    let axis = weight_channel_axis(node, idx, w.rank())?;
                    let v = w.to_f32_vec()?;
                    let scales = crate::precision::quant::channel_scales(&v, w.shape(), axis, p);
                    let inner: usize = w.shape()[axis + 1..].iter().product();
                    let ch = w.shape()[axis];
                    let q = v
                        .iter()
                        .enumerate()
                        .map(|(i, &x)| quantize(x, scales[(i / inner.max(1)) % ch], p));
                    let codes = match grid {
                        Grid::Int { .. } => Codes::Int(q.map(|x| x as i32).collect()),
                        Grid::Float8(_) => Codes::Float(q.collect()),
                    };
                    Operand::Weight(WeightQuant {
                        codes,
                        shape: w.shape().to_vec(),
                        scales,
                        axis,
                    })
                }
                _ => return None,
            });
        }
        let b = out.pop()?;
        let a = out.pop()?;
        Some(IntegerKernel {
            arith: grid.arith(),
            operands: [a, b],
            kept: Default::default(),
        })
    }
}

/// A convolution's bias (input 2) as f32 values, checked to hold one per output channel.
fn conv_bias(args: &[Option<&Tensor>], channels: usize) -> Result<Option<Vec<f32>>, OpError> {
    let bias = args
        .get(2)
        .copied()
        .flatten()
        .map(|t| t.to_f32_vec().unwrap_or_default());
    match &bias {
        Some(b) if b.len() != channels => Err(OpError(format!(
            "bias has {} values, expected {channels}",
            b.len()
        ))),
        _ => Ok(bias),
    }
}

/// A float32 result in the layer's output type (float16/bfloat16 where its operands are).
fn output_in(t: Tensor, dtype: DType) -> Tensor {
    if dtype == DType::F32 {
        t
    } else {
        crate::ops::cast::cast_tensor(&t, dtype)
    }
}

/// Ops that commute with Q/DQ (TensorRT's Q/DQ propagation: data movement and max-pooling),
/// and the inputs their data comes from.
fn commuting_inputs(node: &Node) -> Option<Vec<usize>> {
    match node.op_type.as_str() {
        "Reshape" | "Transpose" | "Flatten" | "Squeeze" | "Unsqueeze" | "Identity" | "Slice"
        | "Gather" | "Split" | "Expand" | "Tile" | "DepthToSpace" | "SpaceToDepth" | "MaxPool" => {
            Some(vec![0])
        }
        "Concat" => Some((0..node.inputs.len()).collect()),
        _ => None,
    }
}

/// A reading of a graph for Q/DQ fusion: the quantized kernel of every layer that has one,
/// and notes (`-v`) for the layers the rules could not apply to.
pub(crate) struct QdqAnalysis {
    pub kernels: Vec<Option<Arc<IntegerKernel>>>,
    pub notes: Vec<String>,
}

/// The type of a value: from the facts, or the value itself.
type DtypeOf<'a> = dyn Fn(&str) -> Option<DType> + 'a;

struct Tracer<'g> {
    graph: &'g Graph,
    values: std::sync::Arc<ValueIndex>,
}

impl<'g> Tracer<'g> {
    fn param(&self, name: Option<&String>) -> Option<&'g Tensor> {
        name.filter(|n| !n.is_empty())
            .and_then(|n| self.graph.weight(n))
    }

    /// The per-tensor quantization an activation arrives with: Ok(None) when it is not
    /// dequantized, Err(why) when it is but the rule cannot use it.
    fn act(
        &self,
        name: &str,
        dtype_of: &DtypeOf,
        depth: usize,
    ) -> Result<Option<ActQuant>, String> {
        let Some(p) = self.values.producer_node(name) else {
            return Ok(None);
        };
        let node = &self.graph.nodes[p];
        if depth > 32 {
            return Ok(None);
        }
        if crate::ops::qdq(node) == Some(crate::ops::Qdq::Dequantize) {
            let scale = self
                .param(node.inputs.get(1))
                .ok_or_else(|| format!("the scale of '{}' is not a constant", node.name))?;
            let sv = scale.to_f32_vec().unwrap_or_default();
            if sv.len() != 1 {
                return Err(format!(
                    "'{}' dequantizes an activation per axis or per block (TensorRT quantizes activations per tensor)",
                    node.name
                ));
            }
            let s = sv[0];
            if !(s.is_finite() && s >= f32::MIN_POSITIVE) {
                return Err(format!("'{}' has scale {s}", node.name));
            }
            let codes = node.inputs.first().map(String::as_str).unwrap_or("");
            let dt = dtype_of(codes).ok_or_else(|| format!("the type of '{codes}' is unknown"))?;
            let grid = Grid::of(dt).ok_or_else(|| {
                format!(
                    "'{}' dequantizes {dt}, which has no quantized kernel here",
                    node.name
                )
            })?;
            let zp = match self.param(node.inputs.get(2)) {
                Some(z) => z
                    .to_f32_vec()
                    .and_then(|v| v.first().copied())
                    .unwrap_or(0.0) as i32,
                None => 0,
            };
            return Ok(Some(ActQuant { scale: s, zp, grid }));
        }
        let Some(ins) = commuting_inputs(node) else {
            return Ok(None);
        };
        let mut found: Option<ActQuant> = None;
        for i in ins {
            let Some(n) = node.inputs.get(i).filter(|n| !n.is_empty()) else {
                continue;
            };
            let q = match self.graph.weight(n) {
                // A constant concatenated with quantized values is not dequantized.
                Some(_) => None,
                None => self.act(n, dtype_of, depth + 1)?,
            };
            let Some(q) = q else { return Ok(None) };
            match &found {
                Some(f) if *f != q => {
                    return Err(format!(
                        "the inputs of '{}' ({}) are dequantized with different scales",
                        node.name, node.op_type
                    ))
                }
                _ => found = Some(q),
            }
        }
        Ok(found)
    }

    /// A weight operand that is the DequantizeLinear of stored codes: Ok(None) when the weight
    /// is not quantized (plain float, or weight-only quantization the rule leaves to the float
    /// kernel), Err(why) when the rule cannot use it.
    fn weight(&self, anchor: &Node, idx: usize, name: &str) -> Result<Option<WeightQuant>, String> {
        let Some(w) = self.graph.weight(name) else {
            return Ok(None);
        };
        let Some(p) = self.values.producer_node(name) else {
            return Ok(None); // a float initializer
        };
        let dq = &self.graph.nodes[p];
        if crate::ops::qdq(dq) != Some(crate::ops::Qdq::Dequantize) {
            // A DequantizeLinear further up (DQ → Transpose → MatMul) is not modelled.
            let mut cur = dq;
            for _ in 0..8 {
                let Some(u) = cur
                    .inputs
                    .first()
                    .and_then(|i| self.values.producer_node(i))
                else {
                    break;
                };
                cur = &self.graph.nodes[u];
                if crate::ops::qdq(cur) == Some(crate::ops::Qdq::Dequantize) {
                    return Err(format!(
                        "its weight '{name}' reaches it from '{}' through '{}' ({})",
                        cur.name, dq.name, dq.op_type
                    ));
                }
            }
            return Ok(None);
        }
        let attrs = crate::ops::attrs::of::<crate::ops::quantize::QuantAttrs>(
            dq,
            self.graph.opset_of(&dq.domain),
        )
        .map_err(|e| e.0)?;
        let codes_t = self
            .param(dq.inputs.first())
            .ok_or_else(|| format!("the codes of '{}' are not constant", dq.name))?;
        let grid = Grid::of(codes_t.dtype()).ok_or_else(|| {
            format!(
                "'{}' dequantizes {}, which has no quantized kernel here",
                dq.name,
                codes_t.dtype()
            )
        })?;
        if attrs.block_size > 0 {
            return Err(format!(
                "'{}' has block-wise scales (block_size {}): weight-only quantization, run as DequantizeLinear then the float kernel",
                dq.name, attrs.block_size
            ));
        }
        let scale = self
            .param(dq.inputs.get(1))
            .ok_or_else(|| format!("the scale of '{}' is not a constant", dq.name))?;
        let scales = scale.to_f32_vec().unwrap_or_default();
        if let Some(s) = scales
            .iter()
            .find(|s| !(s.is_finite() && **s >= f32::MIN_POSITIVE))
        {
            return Err(format!("'{}' has scale {s}", dq.name));
        }
        let rank = codes_t.rank();
        let axis = weight_channel_axis(anchor, idx, rank)
            .ok_or_else(|| format!("weight '{name}' of rank {rank} has no output-channel axis"))?;
        if scales.len() > 1 {
            let dq_axis = if attrs.axis < 0 {
                attrs.axis + rank as i64
            } else {
                attrs.axis
            };
            if dq_axis != axis as i64 || codes_t.shape()[axis] != scales.len() {
                return Err(format!(
                    "'{}' scales weight '{name}' along axis {dq_axis}, not its output-channel axis {axis}",
                    dq.name
                ));
            }
        }
        let zps: Vec<f32> = match self.param(dq.inputs.get(2)) {
            Some(z) => z.to_f32_vec().unwrap_or_default(),
            None => vec![0.0],
        };
        if zps.len() != 1 && zps.len() != scales.len() {
            return Err(format!(
                "the zero point of '{}' does not fit its scale",
                dq.name
            ));
        }
        let inner: usize = codes_t.shape()[axis + 1..].iter().product();
        let ch = codes_t.shape()[axis].max(1);
        let zp_of = |i: usize| {
            zps[if zps.len() == 1 {
                0
            } else {
                (i / inner.max(1)) % ch
            }]
        };
        let v = codes_t.to_f32_vec().ok_or("unreadable codes")?;
        let codes = match grid {
            Grid::Int { .. } => Codes::Int(
                v.iter()
                    .enumerate()
                    .map(|(i, &x)| (x - zp_of(i)) as i32)
                    .collect(),
            ),
            Grid::Float8(_) => {
                if zps.iter().any(|&z| z != 0.0) {
                    return Err(format!("'{}' has a nonzero float8 zero point", dq.name));
                }
                Codes::Float(v)
            }
        };
        let _ = w;
        Ok(Some(WeightQuant {
            codes,
            shape: codes_t.shape().to_vec(),
            scales,
            axis,
        }))
    }
}

/// Finds the layers of `graph` that TensorRT runs as quantized kernels (module documentation).
pub(crate) fn analyze(graph: &Graph, dtype_of: &DtypeOf) -> QdqAnalysis {
    let tracer = Tracer {
        graph,
        values: graph.values(),
    };
    let mut kernels = vec![None; graph.nodes.len()];
    let mut notes = Vec::new();
    for (k, node) in graph.nodes.iter().enumerate() {
        if !node.domain.is_empty()
            || !matches!(
                node.op_type.as_str(),
                "Conv" | "ConvTranspose" | "MatMul" | "Gemm"
            )
        {
            continue;
        }
        let mut ops: Vec<Option<Operand>> = Vec::new();
        let mut problem = None;
        for idx in 0..2 {
            let name = node.inputs.get(idx).map(String::as_str).unwrap_or("");
            let r = if graph.weight(name).is_some() {
                tracer
                    .weight(node, idx, name)
                    .map(|w| w.map(Operand::Weight))
            } else {
                tracer.act(name, dtype_of, 0).map(|a| a.map(Operand::Act))
            };
            match r {
                Ok(o) => ops.push(o),
                Err(why) => {
                    problem = Some(why);
                    ops.push(None);
                }
            }
        }
        let quantized = ops.iter().filter(|o| o.is_some()).count();
        if quantized == 0 {
            continue;
        }
        let note = |why: String| {
            format!(
                "fusion (tensorrt): '{}' ({}) runs unfused (DequantizeLinear, then the float kernel): {why}",
                node.name, node.op_type
            )
        };
        if let Some(why) = problem {
            notes.push(note(why));
            continue;
        }
        if quantized == 1 {
            // Weight-only quantization (or one quantized operand): TensorRT dequantizes the
            // weight and runs the float kernel, which is the plain semantics.
            continue;
        }
        let grid = |o: &Operand| match o {
            Operand::Act(a) => a.grid.arith(),
            Operand::Weight(w) => match w.codes {
                Codes::Int(_) => Arith::Int,
                Codes::Float(_) => Arith::Fp8,
            },
        };
        let b = ops.pop().flatten().expect("quantized");
        let a = ops.pop().flatten().expect("quantized");
        if grid(&a) != grid(&b) {
            notes.push(note("its operands mix integer and float8 codes".into()));
            continue;
        }
        kernels[k] = Some(Arc::new(IntegerKernel {
            arith: grid(&a),
            operands: [a, b],
            kept: Default::default(),
        }));
    }
    QdqAnalysis { kernels, notes }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_read_back_exactly() {
        // Every int8/uint8 code, many scales, as DequantizeLinear computes the value, and that
        // value rounded to float16: requantizing gives the code back.
        let mut s = 1e-6f32;
        while s < 1e4 {
            for (lo, hi, zp) in [(-128, 127, 0), (0, 255, 128), (0, 255, 3), (-8, 7, 0)] {
                let q = ActQuant {
                    scale: s,
                    zp,
                    grid: Grid::Int { lo, hi },
                };
                let vals: Vec<f32> = (lo..=hi).map(|c| (c - zp) as f32 * s).collect();
                let want: Vec<i32> = (lo..=hi).map(|c| c - zp).collect();
                let t = Tensor::from_f32(vec![vals.len()], vals.clone());
                let Codes::Int(got) = act_codes(&q, &t).unwrap() else {
                    panic!()
                };
                assert_eq!(got, want, "scale {s}");
                // Beyond the grid the codes saturate; NaN reads as the zero point.
                let odd = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30]
                    .into_iter()
                    .chain([(hi - zp) as f32 + 0.6, (lo - zp) as f32 - 0.6].map(|c| c * s));
                let t = Tensor::from_f32(vec![7], odd.collect());
                let Codes::Int(got) = act_codes(&q, &t).unwrap() else {
                    panic!()
                };
                let (top, bottom) = (hi - zp, lo - zp);
                assert_eq!(got, [0, top, bottom, top, bottom, top, bottom], "scale {s}");
                if s < 100.0 {
                    let h: Vec<f32> = vals
                        .iter()
                        .map(|&v| half::f16::from_f32(v).to_f32())
                        .collect();
                    let t = Tensor::from_f32(vec![h.len()], h);
                    let Codes::Int(got) = act_codes(&q, &t).unwrap() else {
                        panic!()
                    };
                    assert_eq!(got, want, "scale {s}, float16");
                }
            }
            s *= 1.37;
        }
        // float8 codes: every finite e4m3fn value.
        let q = ActQuant {
            scale: 0.013,
            zp: 0,
            grid: Grid::Float8(Precision::Fp8E4M3),
        };
        let codes: Vec<f32> = (0..=255u8)
            .map(|b| float8::F8E4M3::from_bits(b).to_f32())
            .filter(|v| v.is_finite())
            .collect();
        let vals: Vec<f32> = codes.iter().map(|c| c * 0.013).collect();
        let Codes::Float(got) = act_codes(&q, &Tensor::from_f32(vec![vals.len()], vals)).unwrap()
        else {
            panic!()
        };
        for (g, c) in got.iter().zip(&codes) {
            assert_eq!(g.to_bits() & 0x7fff_ffff, c.to_bits() & 0x7fff_ffff, "{c}");
        }
    }

    const SX: f32 = 0.031;

    fn sw(m: usize) -> f32 {
        0.002 + m as f32 * 0.0007
    }

    /// An int8 activation (codes `x`, zero point 0) and per-channel int8 weights (`w`, output
    /// channel first) as an integer kernel.
    fn kernel(w: Vec<i32>, w_shape: Vec<usize>) -> IntegerKernel {
        let m = w_shape[0];
        IntegerKernel {
            arith: Arith::Int,
            operands: [
                Operand::Act(ActQuant {
                    scale: SX,
                    zp: 0,
                    grid: Grid::Int { lo: -128, hi: 127 },
                }),
                Operand::Weight(WeightQuant {
                    codes: Codes::Int(w),
                    shape: w_shape,
                    scales: (0..m).map(sw).collect(),
                    axis: 0,
                }),
            ],
            kept: Default::default(),
        }
    }

    /// Codes for the three regimes of the float32 paths: products exact by the grid's bound
    /// alone (`small` weights), exact once the activation's codes are scanned (large weights,
    /// activations of magnitude <= 40) and beyond 2^24, where only the i32 sums are exact
    /// (large weights, activations near 127: partial sums up to 127 · 127 · taps, and f32 would
    /// round them).
    fn regimes(taps: usize) -> [(Vec<i32>, Vec<i32>); 3] {
        let act = |amp: i32| (0..taps).map(|i| amp - (i as i32 * 7 % 5)).collect();
        let weights = |amp: i32| (0..2 * taps).map(|i| amp - (i as i32 * 3 % 4)).collect();
        [
            (act(127), weights(9)),
            (act(40), weights(127)),
            (act(127), weights(127)),
        ]
    }

    #[test]
    fn the_float32_paths_of_conv_and_matmul_give_the_exact_integer_sums() {
        // 2048 taps: 127 · 127 · 2048 ≈ 3.3e7 > 2^24 in the third regime.
        let taps = 2048;
        for (i, (x, w)) in regimes(taps).into_iter().enumerate() {
            let want = |m: usize| {
                let acc: i64 = (0..taps)
                    .map(|p| x[p] as i64 * w[m * taps + p] as i64)
                    .sum();
                acc as f32 * (SX * sw(m))
            };
            if i == 2 {
                let f32_sum = (0..taps).fold(0f32, |a, p| a + (x[p] * w[p]) as f32);
                let exact: i64 = (0..taps).map(|p| x[p] as i64 * w[p] as i64).sum();
                assert_ne!(f32_sum as i64, exact, "the third regime must round in f32");
            }
            let xs: Vec<f32> = x.iter().map(|&c| c as f32 * SX).collect();
            // Conv: x [1, taps, 2, 8] (each channel one value) by w [2, taps, 1, 1]: 16
            // positions, so that the product runs through the kernel's tiles, which sum each
            // output along the taps in one accumulator.
            let conv_node = crate::graph::testing::node("c", "Conv", &["x", "w"], &["y"]);
            let ctx = OpCtx::new(&conv_node, 21);
            let k = kernel(w.clone(), vec![2, taps, 1, 1]);
            let planes: Vec<f32> = xs.iter().flat_map(|&v| [v; 16]).collect();
            let xt = Tensor::from_f32(vec![1, taps, 2, 8], planes);
            let y = k.run(&ctx, &[Some(&xt), None]).unwrap().remove(0);
            let planes_want: Vec<f32> = [want(0), want(1)].iter().flat_map(|&v| [v; 16]).collect();
            assert_eq!(y.as_f32().unwrap(), planes_want, "Conv, regime {i}");
            // MatMul: x [1, taps] by w [taps, 2] (scales along the columns).
            let mm_node = crate::graph::testing::node("m", "MatMul", &["x", "w"], &["y"]);
            let ctx = OpCtx::new(&mm_node, 21);
            let wt: Vec<i32> = (0..2 * taps).map(|j| w[(j % 2) * taps + j / 2]).collect();
            let mut k = kernel(wt, vec![taps, 2]);
            if let Operand::Weight(wq) = &mut k.operands[1] {
                wq.axis = 1;
            }
            let xt = Tensor::from_f32(vec![1, taps], xs);
            let y = k.run(&ctx, &[Some(&xt), None]).unwrap().remove(0);
            assert_eq!(
                y.as_f32().unwrap(),
                [want(0), want(1)],
                "MatMul, regime {i}"
            );
        }
    }
}

#[cfg(test)]
mod graph_tests {
    use crate::exec::emulate::{PlanOptions, PreparedPlan};
    use crate::exec::{Feeds, Interpreter, RunOptions, ValueCache};
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, Graph};
    use crate::precision::fusion::FusionModel;
    use crate::precision::plan::PrecisionPlan;
    use crate::precision::Precision;
    use crate::tensor::{Tensor, TensorData};

    const K: usize = 4096;
    const N: usize = 3;
    const SX: f32 = 0.0123;

    fn sw(j: usize) -> f32 {
        0.0071 + 0.0013 * j as f32
    }

    /// Weight codes: mostly near ±127 so that the sums pass 2^24.
    fn wq(p: usize, j: usize) -> i8 {
        let v = 100 + ((p * 31 + j * 17) % 28) as i32;
        (if (p + j).is_multiple_of(7) { -v } else { v }) as i8
    }

    fn xq(p: usize) -> i8 {
        (99 + (p * 13 % 29) as i32) as i8
    }

    /// x [1, K] → QuantizeLinear(SX) → DequantizeLinear → MatMul(DequantizeLinear(W int8
    /// [K, N], per column)) → y [1, N], opset 21; `block`: the weight's scales are blocked.
    fn qdq_matmul(block: bool) -> Graph {
        let mut dqw = node("dqw", "DequantizeLinear", &["wq", "ws"], &["w"]);
        dqw.attrs
            .insert("axis".into(), Attribute::Int(if block { 0 } else { 1 }));
        let ws = if block {
            dqw.attrs.insert("block_size".into(), Attribute::Int(2048));
            Tensor::from_f32(vec![2, N], (0..2 * N).map(|i| sw(i % N)).collect())
        } else {
            Tensor::from_f32(vec![N], (0..N).map(sw).collect())
        };
        let codes: Vec<i8> = (0..K * N).map(|i| wq(i / N, i % N)).collect();
        let mut g = graph(
            vec![
                node("q", "QuantizeLinear", &["x", "sx", "zx"], &["xq"]),
                node("dq", "DequantizeLinear", &["xq", "sx", "zx"], &["xd"]),
                dqw,
                node("mm", "MatMul", &["xd", "w"], &["y"]),
            ],
            vec![vi("x", &[1, K])],
            vec![vi("y", &[1, N])],
            vec![
                ("sx", Tensor::scalar_f32(SX)),
                (
                    "zx",
                    Tensor::from_parts(vec![], TensorData::I8(vec![0].into())),
                ),
                ("ws", ws),
                (
                    "wq",
                    Tensor::from_parts(vec![K, N], TensorData::I8(codes.into())),
                ),
            ],
        );
        g.opsets.insert(String::new(), 21);
        crate::fold::fold_weights(&mut g);
        g
    }

    fn feeds() -> Feeds {
        let mut f = Feeds::new();
        let x: Vec<f32> = (0..K).map(|p| xq(p) as f32 * SX).collect();
        f.insert("x".into(), Tensor::from_f32(vec![1, K], x));
        f
    }

    fn run(g: &Graph, fusion: FusionModel) -> (Vec<f32>, PreparedPlan) {
        let mut plan = PrecisionPlan::uniform(g, Precision::Float32);
        plan.fusion = fusion;
        let p = PreparedPlan::new(g, &plan, &PlanOptions::default()).unwrap();
        let r = Interpreter::new(g)
            .unwrap()
            .run_plan(&feeds(), &RunOptions::default(), &p)
            .unwrap();
        (r.outputs[0].1.as_f32().unwrap().to_vec(), p)
    }

    /// The TensorRT result by hand: the exact sum of code products (i64), rescaled once.
    fn reference() -> Vec<f32> {
        (0..N)
            .map(|j| {
                let acc: i64 = (0..K).map(|p| xq(p) as i64 * wq(p, j) as i64).sum();
                assert!(acc.abs() > 1 << 24);
                acc as f32 * (SX * sw(j))
            })
            .collect()
    }

    #[test]
    fn a_qdq_matmul_runs_as_an_exact_integer_kernel_only_under_tensorrt() {
        let g = qdq_matmul(false);
        let (trt, p) = run(&g, FusionModel::TensorRt);
        assert!(
            p.layers[3].integer.is_some(),
            "the MatMul has a quantized kernel"
        );
        assert_eq!(
            trt.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            reference().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        // Plain ONNX semantics: f32 products of dequantized values, summed in f32.
        let (none, p) = run(&g, FusionModel::None);
        assert!(p.layers.iter().all(|l| l.integer.is_none()));
        let plain = Interpreter::new(&g).unwrap().run(&feeds()).unwrap();
        let plain = plain.outputs[0].1.as_f32().unwrap().to_vec();
        assert_eq!(none, plain);
        assert_ne!(none, trt, "the two semantics differ on this model");
        for (a, b) in none.iter().zip(&trt) {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} vs {b}");
        }
    }

    #[test]
    fn a_quantized_matmul_takes_its_pointwise_layers_as_an_epilogue_with_the_same_bits() {
        // MatMul (quantized kernel) → Add bias → Sigmoid → Mul (SiLU, the Mul reads the Add).
        let mut g = qdq_matmul(false);
        g.nodes[3].outputs = vec!["mm".into()];
        g.nodes.push(node("add", "Add", &["mm", "bias"], &["a"]));
        g.nodes.push(node("sig", "Sigmoid", &["a"], &["s"]));
        g.nodes.push(node("silu", "Mul", &["a", "s"], &["y"]));
        g.initializers.insert(
            "bias".into(),
            Tensor::from_f32(vec![N], (0..N).map(|j| j as f32 * 0.25 - 1.0).collect()),
        );
        let mut plan = PrecisionPlan::uniform(&g, Precision::Float32);
        plan.fusion = FusionModel::TensorRt;
        let p = PreparedPlan::new(&g, &plan, &PlanOptions::default()).unwrap();
        let interp = Interpreter::new(&g).unwrap();
        assert!(p.layers[3].integer.is_some());
        let (fused, times) = interp.run_profiled(&feeds(), Some(&p)).unwrap();
        let mm = times.iter().find(|t| t.name == "mm").unwrap();
        assert_eq!(
            mm.fused_ops,
            ["Add", "Sigmoid", "Mul"],
            "the chain ran as its epilogue"
        );
        // Kept intermediates: every layer on its own.
        let opts = RunOptions {
            keep_intermediates: true,
        };
        let alone = interp.run_plan(&feeds(), &opts, &p).unwrap();
        let bits = |r: &crate::exec::RunResult| -> Vec<u32> {
            let y = r.outputs.iter().find(|(n, _)| n == "y").unwrap();
            y.1.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
        };
        assert_eq!(bits(&fused), bits(&alone));
    }

    #[test]
    fn blocked_weight_scales_with_a_quantized_activation_fall_back_with_a_note() {
        let g = qdq_matmul(true);
        let (trt, p) = run(&g, FusionModel::TensorRt);
        assert!(p.layers[3].integer.is_none());
        let notes: Vec<String> = p
            .fusion_events()
            .into_iter()
            .map(|e| format!("{e:?}"))
            .collect();
        assert!(
            notes
                .iter()
                .any(|n| n.contains("'mm' (MatMul) runs unfused") && n.contains("block")),
            "{notes:?}"
        );
        let (none, _) = run(&g, FusionModel::None);
        assert_eq!(trt, none, "unfused: the plain semantics");
    }

    #[test]
    fn cached_runs_and_composed_plans_equal_fresh_runs_bit_for_bit() {
        let g = qdq_matmul(false);
        let mut low = PrecisionPlan::uniform(&g, Precision::Float32);
        low.fusion = FusionModel::TensorRt;
        let mut high = low.clone();
        high.layers[3] = Precision::Float16;
        let opts = PlanOptions::default();
        let lp = PreparedPlan::new(&g, &low, &opts).unwrap();
        let hp = PreparedPlan::new(&g, &high, &opts).unwrap();
        assert!(
            hp.layers[3].integer.is_some(),
            "float16 plans keep the kernel"
        );
        let interp = Interpreter::new(&g).unwrap();
        let mut cache = ValueCache::new(1 << 30);
        let ro = RunOptions::default();
        for marked in [vec![], vec![3], vec![], vec![3], vec![1, 3]] {
            let c = lp.with_layers_of(&hp, &marked).unwrap();
            let fresh = PreparedPlan::new(&g, &c.plan, &opts).unwrap();
            let cached = interp
                .run_cached(&feeds(), 0, &ro, Some(&c), &mut cache)
                .unwrap();
            let plain = interp.run_plan(&feeds(), &ro, &fresh).unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
            };
            assert_eq!(
                bits(&cached.outputs[0].1),
                bits(&plain.outputs[0].1),
                "{marked:?}"
            );
        }
        assert!(cache.stats.reused > 0);
    }

    #[test]
    fn int8_plan_layers_use_the_integer_kernel_under_tensorrt() {
        // A float MatMul marked int8: its exported Q/DQ model, run by TensorRT.
        let w: Vec<f32> = (0..K * N).map(|i| wq(i / N, i % N) as f32 * 0.01).collect();
        let g = graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![vi("x", &[1, K])],
            vec![vi("y", &[1, N])],
            vec![("w", Tensor::from_f32(vec![K, N], w.clone()))],
        );
        let amax: std::collections::BTreeMap<String, f32> =
            [("x".to_string(), 127.0 * SX)].into_iter().collect();
        let opts = PlanOptions {
            amax: Some(&amax),
            ..Default::default()
        };
        let mut plan = PrecisionPlan::uniform(&g, Precision::Int8);
        let out = |plan: &PrecisionPlan| {
            let p = PreparedPlan::new(&g, plan, &opts).unwrap();
            let r = Interpreter::new(&g)
                .unwrap()
                .run_plan(&feeds(), &RunOptions::default(), &p)
                .unwrap();
            r.outputs[0].1.as_f32().unwrap().to_vec()
        };
        let none = out(&plan);
        plan.fusion = FusionModel::TensorRt;
        let trt = out(&plan);
        let sx = crate::precision::quant::scale_from_amax(127.0 * SX, Precision::Int8);
        let want: Vec<f32> = (0..N)
            .map(|j| {
                let col: Vec<f32> = (0..K).map(|p| w[p * N + j]).collect();
                let amax = col.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = crate::precision::quant::scale_from_amax(amax, Precision::Int8);
                let acc: i64 = (0..K)
                    .map(|p| {
                        let q = crate::precision::quant::quantize(col[p], s, Precision::Int8);
                        let xcode = crate::precision::quant::quantize(
                            xq(p) as f32 * SX,
                            sx,
                            Precision::Int8,
                        );
                        xcode as i64 * q as i64
                    })
                    .sum();
                acc as f32 * (sx * s)
            })
            .collect();
        assert_eq!(trt, want);
        assert_ne!(none, trt);
    }
}

#[cfg(test)]
mod conv_tests {
    use crate::exec::emulate::{PlanOptions, PreparedPlan};
    use crate::exec::{Feeds, Interpreter, RunOptions};
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, Graph};
    use crate::precision::fusion::FusionModel;
    use crate::precision::plan::PrecisionPlan;
    use crate::precision::Precision;
    use crate::tensor::{Tensor, TensorData};

    const SX: f32 = 0.05;

    fn sw(c: usize) -> f32 {
        0.011 * (c + 1) as f32
    }

    /// x [1, 2, 4, 4] → Q(SX) → DQ → MaxPool 2x2 → (Concat with a second DQ of scale `s2`
    /// when given) → Conv 1x1 (int8 W [3, C, 1, 1] per output channel, bias) → y.
    fn model(concat: Option<f32>) -> Graph {
        let c_in = if concat.is_some() { 4 } else { 2 };
        let mut pool = node("pool", "MaxPool", &["xd"], &["p"]);
        pool.attrs
            .insert("kernel_shape".into(), Attribute::Ints(vec![2, 2]));
        pool.attrs
            .insert("strides".into(), Attribute::Ints(vec![2, 2]));
        let mut dqw = node("dqw", "DequantizeLinear", &["wq", "ws"], &["w"]);
        dqw.attrs.insert("axis".into(), Attribute::Int(0));
        let mut nodes = vec![
            node("q", "QuantizeLinear", &["x", "sx"], &["xq"]),
            node("dq", "DequantizeLinear", &["xq", "sx"], &["xd"]),
            pool,
            dqw,
        ];
        let mut conv_in = "p";
        if concat.is_some() {
            nodes.push(node("q2", "QuantizeLinear", &["x", "s2"], &["xq2"]));
            nodes.push(node("dq2", "DequantizeLinear", &["xq2", "s2"], &["xd2"]));
            let mut pool2 = node("pool2", "MaxPool", &["xd2"], &["p2"]);
            pool2.attrs = nodes[2].attrs.clone();
            nodes.push(pool2);
            let mut cat = node("cat", "Concat", &["p", "p2"], &["pc"]);
            cat.attrs.insert("axis".into(), Attribute::Int(1));
            nodes.push(cat);
            conv_in = "pc";
        }
        nodes.push(node("conv", "Conv", &[conv_in, "w", "b"], &["y"]));
        let codes: Vec<i8> = (0..3 * c_in)
            .map(|i| (i as i32 * 37 % 255 - 127) as i8)
            .collect();
        let mut g = graph(
            nodes,
            vec![vi("x", &[1, 2, 4, 4])],
            vec![vi("y", &[1, 3, 2, 2])],
            vec![
                ("sx", Tensor::scalar_f32(SX)),
                ("s2", Tensor::scalar_f32(concat.unwrap_or(SX))),
                ("ws", Tensor::from_f32(vec![3], (0..3).map(sw).collect())),
                (
                    "wq",
                    Tensor::from_parts(vec![3, c_in, 1, 1], TensorData::I8(codes.into())),
                ),
                ("b", Tensor::from_f32(vec![3], vec![0.5, -0.25, 0.125])),
            ],
        );
        g.opsets.insert(String::new(), 21);
        crate::fold::fold_weights(&mut g);
        g
    }

    fn x() -> Vec<f32> {
        (0..32)
            .map(|i| ((i * 29 % 31) as f32 - 15.0) * 0.37)
            .collect()
    }

    fn run(g: &Graph) -> (Vec<f32>, PreparedPlan) {
        let mut plan = PrecisionPlan::uniform(g, Precision::Float32);
        plan.fusion = FusionModel::TensorRt;
        let p = PreparedPlan::new(g, &plan, &PlanOptions::default()).unwrap();
        let mut f = Feeds::new();
        f.insert("x".into(), Tensor::from_f32(vec![1, 2, 4, 4], x()));
        let r = Interpreter::new(g)
            .unwrap()
            .run_plan(&f, &RunOptions::default(), &p)
            .unwrap();
        (r.outputs[0].1.as_f32().unwrap().to_vec(), p)
    }

    #[test]
    fn a_quantized_conv_reads_codes_through_max_pooling_with_per_channel_scales_and_bias() {
        let g = model(None);
        let (y, p) = run(&g);
        let conv = g.nodes.iter().position(|n| n.name == "conv").unwrap();
        assert!(p.layers[conv].integer.is_some());
        // By hand: uint8 codes of x (QuantizeLinear without a zero point), 2x2 max over
        // codes, 1x1 conv in i64, one rescale, bias.
        let q: Vec<i64> = x()
            .iter()
            .map(|v| (v / SX).round_ties_even().clamp(0.0, 255.0) as i64)
            .collect();
        let wq = |m: usize, c: usize| ((m * 2 + c) as i64 * 37 % 255 - 127) as i8 as i64;
        let bias = [0.5f32, -0.25, 0.125];
        for m in 0..3 {
            for oh in 0..2 {
                for ow in 0..2 {
                    let mut acc = 0i64;
                    for c in 0..2 {
                        let mx = (0..4)
                            .map(|t| q[c * 16 + (oh * 2 + t / 2) * 4 + ow * 2 + t % 2])
                            .max()
                            .unwrap();
                        acc += mx * wq(m, c);
                    }
                    let want = acc as f32 * (SX * sw(m)) + bias[m];
                    assert_eq!(y[m * 4 + oh * 2 + ow], want, "channel {m} ({oh}, {ow})");
                }
            }
        }
    }

    #[test]
    fn a_quantized_conv_takes_its_pointwise_layers_as_an_epilogue_with_the_same_bits() {
        // Conv (quantized kernel) → Sigmoid → Mul (SiLU).
        let mut g = model(None);
        let conv = g.nodes.iter().position(|n| n.name == "conv").unwrap();
        g.nodes[conv].outputs = vec!["c".into()];
        g.nodes.push(node("sig", "Sigmoid", &["c"], &["s"]));
        g.nodes.push(node("silu", "Mul", &["c", "s"], &["y"]));
        let mut plan = PrecisionPlan::uniform(&g, Precision::Float32);
        plan.fusion = FusionModel::TensorRt;
        let p = PreparedPlan::new(&g, &plan, &PlanOptions::default()).unwrap();
        assert!(p.layers[conv].integer.is_some());
        let mut f = Feeds::new();
        f.insert("x".into(), Tensor::from_f32(vec![1, 2, 4, 4], x()));
        let interp = Interpreter::new(&g).unwrap();
        let (fused, times) = interp.run_profiled(&f, Some(&p)).unwrap();
        let c = times.iter().find(|t| t.name == "conv").unwrap();
        assert_eq!(
            c.fused_ops,
            ["Sigmoid", "Mul"],
            "the chain ran as its epilogue"
        );
        let opts = RunOptions {
            keep_intermediates: true,
        };
        let alone = interp.run_plan(&f, &opts, &p).unwrap();
        let bits = |r: &crate::exec::RunResult| -> Vec<u32> {
            let y = r.outputs.iter().find(|(n, _)| n == "y").unwrap();
            y.1.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
        };
        assert_eq!(bits(&fused), bits(&alone));
    }

    #[test]
    fn a_concat_of_differently_scaled_values_does_not_commute_and_falls_back_with_a_note() {
        let (_, p) = run(&model(Some(SX)));
        assert!(
            p.layers.iter().any(|l| l.integer.is_some()),
            "equal scales commute through Concat"
        );
        let g = model(Some(0.07));
        let (_, p) = run(&g);
        assert!(p.layers.iter().all(|l| l.integer.is_none()));
        let notes: Vec<String> = p
            .fusion_events()
            .into_iter()
            .map(|e| format!("{e:?}"))
            .collect();
        assert!(
            notes
                .iter()
                .any(|n| n.contains("'conv' (Conv) runs unfused") && n.contains("different scales")),
            "{notes:?}"
        );
    }
}

/// A float16 Q/DQ model as ModelOpt writes it (float16 activations, scales and biases around
/// int8 codes) under `--fusion tensorrt`: the kernel's input DequantizeLinear, its epilogue and
/// its output QuantizeLinear are one region, so the value quantized is the f32 result, not
/// that value rounded to float16 (docs/numerics.md, "Q/DQ under TensorRT", rule 7).
#[cfg(test)]
pub(crate) mod float16_tests {
    use crate::exec::emulate::{PlanOptions, PreparedPlan};
    use crate::exec::{Feeds, Interpreter, RunOptions};
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, Graph};
    use crate::ops::cast::cast_tensor;
    use crate::precision::fusion::FusionModel;
    use crate::precision::plan::PrecisionPlan;
    use crate::precision::Precision;
    use crate::tensor::{DType, Tensor, TensorData};
    use half::f16;

    const K: usize = 64;
    const N: usize = 512;

    fn h(v: f32) -> f32 {
        f16::from_f32(v).to_f32()
    }
    fn half(shape: Vec<usize>, v: Vec<f32>) -> Tensor {
        cast_tensor(&Tensor::from_f32(shape, v), DType::F16)
    }
    fn i8s(shape: Vec<usize>, v: Vec<i8>) -> Tensor {
        Tensor::from_parts(shape, TensorData::I8(v.into()))
    }
    fn f16_vi(name: &str, shape: &[usize]) -> crate::graph::ValueInfo {
        let mut v = vi(name, shape);
        v.dtype = Some(DType::F16);
        v
    }
    fn sx() -> f32 {
        h(0.0123)
    }
    fn sy() -> f32 {
        h(0.0377)
    }
    fn sw(j: usize) -> f32 {
        h(0.0041 + 0.00003 * j as f32)
    }
    fn wq(p: usize, j: usize) -> i8 {
        ((p * 31 + j * 17) % 255) as i32 as u8 as i8
    }
    fn bias(j: usize) -> f32 {
        h(0.5 - (j % 13) as f32 * 0.07)
    }
    fn xq(p: usize) -> i8 {
        ((p * 13 % 61) as i32 - 30) as i8
    }

    /// x (float16) → Q → DQ → MatMul(DQ(W int8, per column)) → Add(bias) → Relu → Q → DQ → y.
    fn matmul_block() -> Graph {
        let mut dqw = node("dqw", "DequantizeLinear", &["wq", "ws"], &["w"]);
        dqw.attrs.insert("axis".into(), Attribute::Int(1));
        let codes: Vec<i8> = (0..K * N).map(|i| wq(i / N, i % N)).collect();
        let mut g = graph(
            vec![
                node("q_x", "QuantizeLinear", &["x", "sx", "z"], &["xq"]),
                node("dq_x", "DequantizeLinear", &["xq", "sx", "z"], &["xd"]),
                dqw,
                node("mm", "MatMul", &["xd", "w"], &["m"]),
                node("add", "Add", &["m", "b"], &["mb"]),
                node("relu", "Relu", &["mb"], &["r"]),
                node("q_y", "QuantizeLinear", &["r", "sy", "z"], &["rq"]),
                node("dq_y", "DequantizeLinear", &["rq", "sy", "z"], &["y"]),
            ],
            vec![f16_vi("x", &[1, K])],
            vec![f16_vi("y", &[1, N])],
            vec![
                ("sx", half(vec![], vec![sx()])),
                ("sy", half(vec![], vec![sy()])),
                ("z", i8s(vec![], vec![0])),
                ("ws", half(vec![N], (0..N).map(sw).collect())),
                ("wq", i8s(vec![K, N], codes)),
                ("b", half(vec![N], (0..N).map(bias).collect())),
            ],
        );
        g.opsets.insert(String::new(), 21);
        crate::fold::fold_weights(&mut g);
        g
    }

    fn run(
        g: &Graph,
        feeds: &Feeds,
        fusion: FusionModel,
    ) -> (crate::exec::RunResult, PreparedPlan) {
        let mut plan = PrecisionPlan::uniform(g, Precision::Float32);
        plan.fusion = fusion;
        let p = PreparedPlan::new(g, &plan, &PlanOptions::default()).unwrap();
        let opts = RunOptions {
            keep_intermediates: true,
        };
        let r = Interpreter::new(g)
            .unwrap()
            .run_plan(feeds, &opts, &p)
            .unwrap();
        (r, p)
    }

    pub(crate) fn codes(r: &crate::exec::RunResult, name: &str) -> Vec<i64> {
        r.intermediates[name].to_i64_vec().unwrap()
    }

    fn region_names(g: &Graph, p: &PreparedPlan) -> Vec<Vec<String>> {
        p.derived_regions()
            .iter()
            .map(|r| r.nodes.iter().map(|&i| g.nodes[i].name.clone()).collect())
            .collect()
    }

    #[test]
    fn the_output_quantizer_reads_the_f32_result_of_the_integer_kernel() {
        let g = matmul_block();
        let mut feeds = Feeds::new();
        let x: Vec<f32> = (0..K).map(|p| xq(p) as f32 * sx()).collect();
        feeds.insert("x".into(), half(vec![1, K], x));
        let (trt, p) = run(&g, &feeds, FusionModel::TensorRt);
        assert_eq!(
            region_names(&g, &p),
            vec![vec!["dq_x", "mm", "add", "relu", "q_y"]],
            "the weight's DequantizeLinear is folded; the last DequantizeLinear feeds the output"
        );
        assert!(p.layers[3].integer.is_some(), "mm is a quantized kernel");
        // By hand: the exact sum of code products, rescaled once, the bias and Relu in f32,
        // then quantized from the f32 value.
        let want: Vec<i64> = (0..N)
            .map(|j| {
                let acc: i64 = (0..K).map(|k| xq(k) as i64 * wq(k, j) as i64).sum();
                let y = (acc as f32 * (sx() * sw(j)) + bias(j)).max(0.0);
                ((y / sy()).round_ties_even() as i64).clamp(-128, 127)
            })
            .collect();
        assert_eq!(codes(&trt, "rq"), want);
        // Inside the region the values are f32 tensors; the region's exit is the codes.
        assert_eq!(trt.intermediates["r"].dtype(), DType::F32);
        assert_eq!(trt.intermediates["rq"].dtype(), DType::I8);
        assert_eq!(
            trt.outputs[0].1.dtype(),
            DType::F16,
            "y keeps its declared type"
        );
        // Per node (`none`: what ONNX Runtime computes) the Relu output is a float16 value
        // and the quantizer divides in float16: some codes differ.
        let (plain, _) = run(&g, &feeds, FusionModel::None);
        assert_eq!(plain.intermediates["r"].dtype(), DType::F16);
        let differ = codes(&plain, "rq")
            .iter()
            .zip(&want)
            .filter(|(a, b)| a != b)
            .count();
        assert!(differ > 0 && differ < N / 4, "{differ} of {N} codes differ");
    }

    /// float16 a, b → Q → DQ each → Add → Q → DQ → y, its inputs, and the codes of the Add's
    /// QuantizeLinear as TensorRT's int8-I/O addition computes them: round((q_a s_a + q_b s_b) / s_s).
    pub(crate) fn residual_add() -> (Graph, Feeds, Vec<i64>) {
        let (sa, sb, ss) = (h(0.0133), h(0.0219), h(0.0311));
        let mut g = graph(
            vec![
                node("q_a", "QuantizeLinear", &["a", "sa", "z"], &["aq"]),
                node("dq_a", "DequantizeLinear", &["aq", "sa", "z"], &["ad"]),
                node("q_b", "QuantizeLinear", &["b", "sb", "z"], &["bq"]),
                node("dq_b", "DequantizeLinear", &["bq", "sb", "z"], &["bd"]),
                node("add", "Add", &["ad", "bd"], &["s"]),
                node("q_s", "QuantizeLinear", &["s", "ss", "z"], &["sq"]),
                node("dq_s", "DequantizeLinear", &["sq", "ss", "z"], &["y"]),
            ],
            vec![f16_vi("a", &[1, N]), f16_vi("b", &[1, N])],
            vec![f16_vi("y", &[1, N])],
            vec![
                ("sa", half(vec![], vec![sa])),
                ("sb", half(vec![], vec![sb])),
                ("ss", half(vec![], vec![ss])),
                ("z", i8s(vec![], vec![0])),
            ],
        );
        g.opsets.insert(String::new(), 21);
        let qa = |i: usize| ((i * 7 % 251) as i32 - 125) as i8;
        let qb = |i: usize| ((i * 11 % 241) as i32 - 120) as i8;
        let mut feeds = Feeds::new();
        feeds.insert(
            "a".into(),
            half(vec![1, N], (0..N).map(|i| qa(i) as f32 * sa).collect()),
        );
        feeds.insert(
            "b".into(),
            half(vec![1, N], (0..N).map(|i| qb(i) as f32 * sb).collect()),
        );
        let want: Vec<i64> = (0..N)
            .map(|i| {
                let s = qa(i) as f32 * sa + qb(i) as f32 * sb;
                ((s / ss).round_ties_even() as i64).clamp(-128, 127)
            })
            .collect();
        (g, feeds, want)
    }

    #[test]
    fn a_residual_add_of_two_dequantized_values_runs_with_int8_io() {
        let (g, feeds, want) = residual_add();
        let (trt, p) = run(&g, &feeds, FusionModel::TensorRt);
        assert_eq!(
            region_names(&g, &p),
            vec![vec!["dq_a", "dq_b", "add", "q_s"]]
        );
        assert_eq!(codes(&trt, "sq"), want);
        let (plain, p) = run(&g, &feeds, FusionModel::None);
        assert!(p.derived_regions().is_empty());
        let differ = codes(&plain, "sq")
            .iter()
            .zip(&want)
            .filter(|(a, b)| a != b)
            .count();
        assert!(differ > 0, "float16 dequantized inputs move some codes");
        // A float32 Q/DQ model forms no region: its per-node run already is the f32 result.
        let mut g32 = g.clone();
        for t in g32.initializers.values_mut() {
            if t.dtype() == DType::F16 {
                *t = cast_tensor(t, DType::F32);
            }
        }
        for v in g32.inputs.iter_mut().chain(g32.outputs.iter_mut()) {
            v.dtype = Some(DType::F32);
        }
        let feeds32: Feeds = feeds
            .iter()
            .map(|(k, t)| (k.clone(), cast_tensor(t, DType::F32)))
            .collect();
        let (r32, p32) = run(&g32, &feeds32, FusionModel::TensorRt);
        assert!(p32.derived_regions().is_empty());
        assert_eq!(codes(&r32, "sq"), want);
    }
}
