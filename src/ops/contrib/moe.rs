//! com.microsoft MoE and QMoE: a mixture of experts, the feed-forward block ONNX Runtime GenAI's
//! model builder writes for the MoE LLMs (Phi-3.5-MoE, Qwen-MoE, gpt-oss; QMoE with int4/int8
//! experts). Each token's router row picks `k` experts; each picked expert computes
//! `act(x·W1ᵀ + b1)·W2ᵀ + b2`; the token's output is the routing-weighted sum.
//!
//! What ONNX Runtime 1.32's CPU kernels compute (`contrib_ops/cpu/moe/moe_cpu.cc`,
//! `moe_quantization_cpu.cc`, `moe_utils.cc`), measured against them
//! (scripts/gen_contrib_cases.py, cases `moe_*` and `qmoe_*`):
//! - Routing, MoE: a softmax over all experts of the router row in f32 (max, `exp(l − max)`,
//!   the sum in order, each divided by it), the `k` largest (ties to the larger expert index,
//!   `std::partial_sort` with `std::greater` on (p, index)), optionally divided by their sum
//!   (`normalize_routing_weights`). A route whose weight is not `> 0` is dropped: a NaN or
//!   infinite router row (its softmax all NaN) gives the token an output of 0.
//! - Routing, QMoE: the `k` largest logits, then a softmax over those `k` alone —
//!   `normalize_routing_weights` is not read (the weights are always normalized) unless
//!   `router_weights` is given: then its values at the picked experts are the weights,
//!   divided by their sum when `normalize_routing_weights` is set. Routes of weight ≤ 1e-8
//!   are dropped.
//! - `use_sparse_mixer` (Phi-3.5-MoE) needs `k = 2` and changes nothing on the CPU.
//! - Activations: relu (`max(0, x)`: a NaN becomes 0, as `std::max(0.0f, x)`), gelu (the tanh
//!   form), silu, identity, and swiglu with FC1's gate and linear rows interleaved (gate even):
//!   `min(g, limit)·σ(α·min(g, limit))·(clamp(l, −limit, limit) + β)`. The CPU kernels refuse
//!   swiglu with `swiglu_fusion` 0 or 2, FC3, geglu and relu2 (CUDA only), and so does this file.
//! - QMoE's experts: uint8 codes `[E, N, K·bits/8]` (4-bit codes two per byte, the even
//!   element in the low nibble), one scale per row (`[E, N]`) or per block of K
//!   (`[E, N, K/block_size]`), zero points packed as the codes (per row: along N; per block:
//!   along the blocks), default `2^(bits−1)`. Block-wise experts that are initializers (ORT
//!   prepacks only constant ones for MLAS's QNBit kernels) with 8 bits, or 4 bits and
//!   `accuracy_level` 4, take MLAS's int8 path, MatMulNBits' `SQNBIT_CompInt8`
//!   (`matmul_nbits::int8_matmul`: each row of activations quantized to int8 per block, exact
//!   integer block sums). Every other expert is dequantized to `(q − zp)·s` in f32 and
//!   multiplied in f32.
//!
//! The products run in f32 (`sgemm` with the layer's accumulator) and each token sums its
//! experts' weighted outputs in f32 in ascending expert order, as ORT's kernel with one
//! thread; ORT's MLAS GEMM sums in its own order, so the result agrees within f32 rounding, not
//! bit for bit. Under a float16/bfloat16 plan the inputs (scales and biases included) arrive
//! rounded. MoE rounds FC1's product, FC1's output after its bias, the activation, FC2's
//! product and its output after its bias to the layer's type (ORT 1.32's float16 MoE keeps
//! them in float16 buffers, `contrib_ops/cpu/moe/moe_cpu.cc`); QMoE computes in f32 and only
//! its output is rounded (ORT's float16 QMoE converts the input and scales to f32 and runs the
//! f32 kernel, int8 path included: bit for bit with ORT's f32 QMoE on the rounded inputs);
//! the routing weights and the weighted sum stay f32.

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::matmul::sgemm;
use super::super::shape::{fact, FactsResult};
use super::super::util::{float_slice, in_dtype, input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::Fact;
use crate::graph::Node;
use crate::tensor::{Tensor, TensorData};
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    use InputRole::{Bias, Data, Param, WeightScale};
    // The expert weights of MoE are T, the activation's type; QMoE's scales are T too (its CPU
    // kernel reads them as T), so they follow a float precision as MatMulNBits' do.
    r.add_in(MS_DOMAIN, "MoE", |c, i| moe(c, i, false))
        .parse(|n, _| boxed(MoeAttrs::parse(n, false)))
        .roles(&[Data, Data, Data, Bias, Data, Bias, Data, Bias])
        .infer(moe_facts)
        .flops(moe_flops);
    r.add_in(MS_DOMAIN, "QMoE", |c, i| moe(c, i, true))
        .parse(|n, _| boxed(MoeAttrs::parse(n, true)))
        .roles(&[
            Data,
            Data,
            Param,
            WeightScale,
            Bias,
            Param,
            WeightScale,
            Bias,
            Param,
            WeightScale,
            Bias,
            Param,
            Param,
            Param,
            Data,
        ])
        .infer(moe_facts)
        .flops(moe_flops);
}

/// The expert activation (`activation_type`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Activation {
    Relu,
    Gelu,
    Silu,
    Identity,
    SwiGlu,
}

/// MoE's and QMoE's attributes.
#[derive(Clone, Debug, PartialEq)]
struct MoeAttrs {
    k: usize,
    activation: Activation,
    alpha: f32,
    beta: f32,
    limit: f32,
    normalize: bool,
    /// QMoE only: bits per code and the block size along K (None: one scale per row).
    bits: usize,
    block_size: Option<usize>,
    accuracy_level: i64,
}

impl MoeAttrs {
    fn parse(node: &Node, quantized: bool) -> Result<MoeAttrs, AttrError> {
        let a = Attrs::new(node);
        let k = a.int_or("k", 1)?;
        if k < 1 {
            return Err(AttrError::new("k", format!("must be at least 1, got {k}")));
        }
        let activation = match a.string("activation_type")?.unwrap_or("relu") {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            "silu" => Activation::Silu,
            "identity" => Activation::Identity,
            "swiglu" => Activation::SwiGlu,
            other @ ("geglu" | "relu2") => {
                return Err(AttrError::new(
                    "activation_type",
                    format!("'{other}' has only a CUDA kernel in ONNX Runtime 1.32, not emulated"),
                ))
            }
            other => {
                return Err(AttrError::new(
                    "activation_type",
                    format!("must be relu, gelu, silu, identity or swiglu, got '{other}'"),
                ))
            }
        };
        let fusion = a.int_or("swiglu_fusion", 0)?;
        if activation == Activation::SwiGlu && fusion != 1 {
            return Err(AttrError::new(
                "swiglu_fusion",
                format!(
                    "is {fusion}: ONNX Runtime's CPU kernel runs swiglu only with FC1's gate and \
                     linear rows interleaved (swiglu_fusion=1)"
                ),
            ));
        }
        if a.int_or("swiglu_limit_after_activation", 0)? != 0 {
            return Err(AttrError::new(
                "swiglu_limit_after_activation",
                "is CUDA-only in ONNX Runtime 1.32, not emulated",
            ));
        }
        if a.int_or("use_sparse_mixer", 0)? == 1 && k != 2 {
            return Err(AttrError::new(
                "use_sparse_mixer",
                format!("needs k=2 (ONNX Runtime's sparse mixer), got k={k}"),
            ));
        }
        let (mut bits, mut block_size) = (0, None);
        if quantized {
            let quant_type = a.string("quant_type")?.unwrap_or("int");
            if quant_type != "int" {
                return Err(AttrError::new(
                    "quant_type",
                    format!("'{quant_type}' (FP4/FP8 experts) is not emulated; only 'int'"),
                ));
            }
            let b = a.int_or("expert_weight_bits", 4)?;
            if b != 4 && b != 8 {
                return Err(AttrError::new(
                    "expert_weight_bits",
                    format!("{b} is not emulated; 4 and 8 are"),
                ));
            }
            for name in [
                "fc1_expert_weight_bits",
                "fc2_expert_weight_bits",
                "fc3_expert_weight_bits",
            ] {
                if let Some(v) = a.int(name)? {
                    if v != b {
                        return Err(AttrError::new(
                            name,
                            format!(
                                "{v} differs from expert_weight_bits={b}: mixed-width experts \
                                 have no CPU kernel in ONNX Runtime 1.32"
                            ),
                        ));
                    }
                }
            }
            bits = b as usize;
            if let Some(bs) = a.int("block_size")? {
                if bs < 16 || !(bs as u64).is_power_of_two() {
                    return Err(AttrError::new(
                        "block_size",
                        format!("must be a power of 2 and at least 16, got {bs}"),
                    ));
                }
                block_size = Some(bs as usize);
            }
            let prepacked = a.int_or("weights_prepacked", -1)?;
            if prepacked == 1 {
                return Err(AttrError::new(
                    "weights_prepacked",
                    "1 selects a CUDA-prepacked layout, not emulated (use -1 or 0: raw [E, N, K·bits/8])",
                ));
            }
        }
        Ok(MoeAttrs {
            k: k as usize,
            activation,
            alpha: a.float_or("activation_alpha", 1.0)?,
            beta: a.float_or("activation_beta", 0.0)?,
            limit: a.float_or("swiglu_limit", f32::INFINITY)?,
            normalize: a.int_or("normalize_routing_weights", 0)? == 1,
            bits,
            block_size,
            accuracy_level: a.int_or("accuracy_level", 0)?,
        })
    }

    fn fusion(&self) -> usize {
        if self.activation == Activation::SwiGlu {
            2
        } else {
            1
        }
    }
}

/// The picked experts of every token: `(expert, weight)` per route, `k` per token, dropped
/// routes as None.
type Routes = Vec<Option<(usize, f32)>>;

/// MoE's routing: a softmax over all experts, the top k, optionally normalized; routes of
/// weight not > 0 (NaN included) dropped.
fn route_softmax_all(logits: &[f32], e: usize, k: usize, normalize: bool) -> Routes {
    let mut routes = Vec::with_capacity(logits.len() / e * k);
    for row in logits.chunks(e) {
        // std::max(max, l) keeps max when l is NaN; a NaN first value stays.
        let max = row[1..]
            .iter()
            .fold(row[0], |m, &l| if m < l { l } else { m });
        let exps: Vec<f32> = row.iter().map(|&l| (l - max).exp()).collect();
        let sum = exps.iter().fold(0f32, |s, &v| s + v);
        let p: Vec<f32> = exps.iter().map(|&v| v / sum).collect();
        let top = top_k(&p, k);
        let top_sum = top.iter().fold(0f32, |s, &j| s + p[j]);
        for &j in &top {
            let w = if normalize { p[j] / top_sum } else { p[j] };
            routes.push((w > 0.0).then_some((j, w)));
        }
    }
    routes
}

/// QMoE's routing: the top k of the logits, weighted by a softmax over those k, or by
/// `router_weights` at them (divided by their sum when `normalize`); routes of weight ≤ 1e-8
/// dropped.
fn route_top_k_softmax(
    logits: &[f32],
    router_weights: Option<&[f32]>,
    e: usize,
    k: usize,
    normalize: bool,
) -> Routes {
    let mut routes = Vec::with_capacity(logits.len() / e * k);
    for (t, row) in logits.chunks(e).enumerate() {
        let top = top_k(row, k);
        let w: Vec<f32> = match router_weights {
            Some(rw) => {
                let vals: Vec<f32> = top.iter().map(|&j| rw[t * e + j]).collect();
                if normalize {
                    let sum = vals.iter().fold(0f32, |s, &v| s + v);
                    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                    vals.iter().map(|&v| v * inv).collect()
                } else {
                    vals
                }
            }
            None => {
                let max = row[top[0]];
                let exps: Vec<f32> = top.iter().map(|&j| (row[j] - max).exp()).collect();
                let sum = exps.iter().fold(0f32, |s, &v| s + v);
                let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                exps.iter().map(|&v| v * inv).collect()
            }
        };
        for (&j, &w) in top.iter().zip(&w) {
            routes.push((w > 1e-8).then_some((j, w)));
        }
    }
    routes
}

/// The indices of the `k` largest values, largest first, ties to the larger index (as
/// `std::partial_sort` with `std::greater` on (value, index) pairs). NaN sorts above every
/// number here (a total order; ORT's comparison is undefined for NaN).
fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(b.cmp(&a)));
    idx.truncate(k);
    idx
}

/// The expert activation over one route's FC1 output `h` (`fusion·I` values) into `out` (I).
fn activate(attrs: &MoeAttrs, h: &[f32], out: &mut [f32]) {
    let sigmoid = |x: f32| 1.0 / (1.0 + (-x).exp());
    match attrs.activation {
        Activation::SwiGlu => {
            for (o, gl) in out.iter_mut().zip(h.chunks_exact(2)) {
                // std::min(g, limit) and std::clamp keep a NaN.
                let g = if attrs.limit < gl[0] {
                    attrs.limit
                } else {
                    gl[0]
                };
                let l = if gl[1] < -attrs.limit {
                    -attrs.limit
                } else if attrs.limit < gl[1] {
                    attrs.limit
                } else {
                    gl[1]
                };
                *o = g * sigmoid(attrs.alpha * g) * (l + attrs.beta);
            }
        }
        act => {
            for (o, &x) in out.iter_mut().zip(h) {
                *o = match act {
                    // std::max(0.0f, x): 0 for NaN.
                    Activation::Relu => {
                        if 0.0 < x {
                            x
                        } else {
                            0.0
                        }
                    }
                    Activation::Gelu => {
                        0.5 * x * (1.0 + (0.797_884_6_f32 * (x + 0.044715 * x * x * x)).tanh())
                    }
                    Activation::Silu => x * sigmoid(x),
                    _ => x,
                };
            }
        }
    }
}

/// Where an expert's weight matrix `[N, K]` comes from.
enum Weights<'a> {
    /// MoE: float values, `[E, N, K]`.
    Float(std::borrow::Cow<'a, [f32]>),
    /// QMoE: codes `[E, N, K·bits/8]`, scales, optional packed zero points.
    Quantized {
        codes: &'a [u8],
        scales: std::borrow::Cow<'a, [f32]>,
        zero_points: Option<&'a [u8]>,
    },
}

/// One projection (FC1 or FC2) of every expert: `[E, n, k]`, its bias `[E, n]`.
struct Projection<'a> {
    weights: Weights<'a>,
    /// ORT's int8 path: A quantized to int8 per block, MLAS's `SQNBIT_CompInt8`.
    int8: bool,
    bias: Option<std::borrow::Cow<'a, [f32]>>,
    n: usize,
    k: usize,
}

impl Projection<'_> {
    /// Expert `e`'s weights as f32 `[n, k]`.
    fn expert(&self, attrs: &MoeAttrs, e: usize) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        match &self.weights {
            Weights::Float(w) => w[e * n * k..(e + 1) * n * k].to_vec(),
            Weights::Quantized {
                codes,
                scales,
                zero_points,
            } => {
                let bits = attrs.bits;
                let row_bytes = k * bits / 8;
                let default_zp = (1u32 << (bits - 1)) as f32;
                let blocks = attrs.block_size.map_or(1, |bs| k.div_ceil(bs));
                let nibble = |bytes: &[u8], i: usize| -> u8 {
                    if bits == 8 {
                        bytes[i]
                    } else {
                        (bytes[i / 2] >> (4 * (i & 1))) & 0x0F
                    }
                };
                let mut w = vec![0f32; n * k];
                w.par_chunks_mut(k).enumerate().for_each(|(row, out)| {
                    let q = &codes[(e * n + row) * row_bytes..(e * n + row + 1) * row_bytes];
                    for (i, o) in out.iter_mut().enumerate() {
                        let blk = attrs.block_size.map_or(0, |bs| i / bs);
                        let s = scales[(e * n + row) * blocks + blk];
                        let zp = match (zero_points, attrs.block_size) {
                            (None, _) => default_zp,
                            // Per block: the row's blocks packed.
                            (Some(z), Some(_)) => {
                                let per_row = (blocks * bits).div_ceil(8);
                                nibble(&z[(e * n + row) * per_row..], blk) as f32
                            }
                            // Per row: the expert's rows packed.
                            (Some(z), None) => {
                                let per_expert = (n * bits).div_ceil(8);
                                nibble(&z[e * per_expert..], row) as f32
                            }
                        };
                        *o = (nibble(q, i) as f32 - zp) * s;
                    }
                });
                w
            }
        }
    }
}

impl Projection<'_> {
    /// Expert `e`'s product with `a` (`[m, k]`) on ORT's int8 path, bias included.
    fn int8_product(&self, attrs: &MoeAttrs, e: usize, a: &[f32], m: usize) -> Vec<f32> {
        let Weights::Quantized {
            codes,
            scales,
            zero_points,
        } = &self.weights
        else {
            unreachable!("only quantized experts take the int8 path")
        };
        let (n, k, bits) = (self.n, self.k, attrs.bits);
        let bs = attrs.block_size.expect("the int8 path is block-wise");
        let blocks = k / bs;
        let row_bytes = k * bits / 8;
        let zp_row = (blocks * bits).div_ceil(8);
        super::matmul_nbits::int8_matmul(
            (k, n, bits, bs),
            &codes[e * n * row_bytes..(e + 1) * n * row_bytes],
            &scales[e * n * blocks..(e + 1) * n * blocks],
            zero_points.map(|z| &z[e * n * zp_row..(e + 1) * n * zp_row]),
            self.bias.as_ref().map(|b| &b[e * n..(e + 1) * n]),
            a,
            m,
        )
    }
}

/// Checks a float input's shape, naming it.
fn float_input<'a>(
    inputs: &[Option<&'a Tensor>],
    i: usize,
    name: &str,
    want: &[usize],
) -> Result<std::borrow::Cow<'a, [f32]>, OpError> {
    let t = input(inputs, i)?;
    if !t.dtype().is_float() || t.shape() != want {
        return Err(OpError(format!(
            "{name} is {} {:?}, expected a float {want:?}",
            t.dtype(),
            t.shape()
        )));
    }
    float_slice(t, name)
}

fn opt_float_input<'a>(
    inputs: &[Option<&'a Tensor>],
    i: usize,
    name: &str,
    want: &[usize],
) -> Result<Option<std::borrow::Cow<'a, [f32]>>, OpError> {
    match opt_input(inputs, i) {
        None => Ok(None),
        Some(_) => float_input(inputs, i, name, want).map(Some),
    }
}

/// QMoE's projection at inputs `w, w+1` (codes, scales), its bias at `bias_at` and zero
/// points at `zp_at`: `[E, n, k]`.
#[allow(clippy::too_many_arguments)]
fn quantized_projection<'a>(
    ctx: &OpCtx,
    attrs: &MoeAttrs,
    inputs: &[Option<&'a Tensor>],
    name: &'static str,
    at: usize,
    bias_at: usize,
    zp_at: usize,
    e: usize,
    n: usize,
    k: usize,
) -> Result<Projection<'a>, OpError> {
    let bits = attrs.bits;
    if !(k * bits).is_multiple_of(8) {
        return Err(OpError(format!(
            "{name}: its K={k} times {bits} bits is not whole bytes"
        )));
    }
    let wt = input(inputs, at)?;
    let want = [e, n, k * bits / 8];
    let codes = match wt.data() {
        TensorData::U8(v) if wt.shape() == want => &v[..],
        _ => {
            return Err(OpError(format!(
            "{name}_experts_weights is {} {:?}, expected uint8 {want:?} (experts, N, K·{bits}/8)",
            wt.dtype(),
            wt.shape()
        )))
        }
    };
    let scales_want: Vec<usize> = match attrs.block_size {
        Some(bs) => {
            if !k.is_multiple_of(bs) {
                return Err(OpError(format!(
                    "{name}: K={k} is not a multiple of block_size={bs}"
                )));
            }
            vec![e, n, k / bs]
        }
        None => vec![e, n],
    };
    let scales = float_input(inputs, at + 1, &format!("{name}_scales"), &scales_want)?;
    let zero_points = match opt_input(inputs, zp_at) {
        None => None,
        Some(z) => {
            let zw: Vec<usize> = match attrs.block_size {
                Some(bs) => vec![e, n, (k / bs * bits).div_ceil(8)],
                None => vec![e, (n * bits).div_ceil(8)],
            };
            match z.data() {
                TensorData::U8(v) if z.shape() == zw => Some(&v[..]),
                _ => {
                    return Err(OpError(format!(
                        "{name}_zero_points is {} {:?}, expected uint8 {zw:?}",
                        z.dtype(),
                        z.shape()
                    )))
                }
            }
        }
    };
    // ONNX Runtime prepacks constant block-wise experts for MLAS's QNBit kernels: 8-bit ones
    // have only the int8 kernel, 4-bit ones take it with accuracy_level 4, in float16 layers
    // too (its float16 QMoE converts the input to f32 and runs the f32 kernel).
    // (A single block per row takes it too: ORT prepacks by the block_size attribute.)
    let int8 = ctx.prepacked(at).is_some()
        && attrs.block_size.is_some_and(|bs| bs <= 256)
        && (bits == 8 || attrs.accuracy_level == 4);
    Ok(Projection {
        int8,
        weights: Weights::Quantized {
            codes,
            scales,
            zero_points,
        },
        bias: opt_float_input(inputs, bias_at, &format!("{name}_experts_bias"), &[e, n])?,
        n,
        k,
    })
}

fn moe(ctx: &OpCtx, inputs: &[Option<&Tensor>], quantized: bool) -> OpResult {
    let attrs = ctx.attrs::<MoeAttrs>()?;
    let x = input(inputs, 0)?;
    if !x.dtype().is_float() || !(2..=3).contains(&x.rank()) {
        return Err(OpError(format!(
            "input is {} {:?}, expected a float [tokens, hidden] or [batch, sequence, hidden]",
            x.dtype(),
            x.shape()
        )));
    }
    let h = x.shape()[x.rank() - 1];
    let tokens = x.len() / h.max(1);
    let router = input(inputs, 1)?;
    if !router.dtype().is_float() || router.rank() != 2 || router.shape()[0] != tokens {
        return Err(OpError(format!(
            "router_probs is {} {:?}, expected a float [{tokens}, experts] (one row per token)",
            router.dtype(),
            router.shape()
        )));
    }
    let e = router.shape()[1];
    if attrs.k > e {
        return Err(OpError(format!(
            "k={} exceeds the {e} experts of router_probs",
            attrs.k
        )));
    }
    let fusion = attrs.fusion();
    // FC3 (a separate gate projection) has no CPU kernel in ONNX Runtime 1.32.
    let fc3 = if quantized { 8..=10 } else { 6..=7 };
    if fc3.clone().any(|i| opt_input(inputs, i).is_some())
        || (quantized && opt_input(inputs, 13).is_some())
    {
        return Err(OpError(
            "FC3 inputs are given: ONNX Runtime's CPU kernel has no FC3 (a gated MLP is FC1 with \
             swiglu_fusion=1)"
                .into(),
        ));
    }
    if quantized && (15..inputs.len()).any(|i| opt_input(inputs, i).is_some()) {
        return Err(OpError(
            "inputs past router_weights (FP4/FP8 global and activation scales) are given; only \
             integer experts are emulated"
                .into(),
        ));
    }
    let fc2_w = input(inputs, if quantized { 5 } else { 4 })?;
    if fc2_w.rank() != 3 || fc2_w.shape()[0] != e || fc2_w.shape()[1] != h {
        return Err(OpError(format!(
            "fc2_experts_weights {:?} must be [{e}, {h}, …] (experts, hidden, inter)",
            fc2_w.shape()
        )));
    }
    let inter = if quantized {
        fc2_w.shape()[2] * 8 / attrs.bits
    } else {
        fc2_w.shape()[2]
    };
    let f1 = fusion * inter;
    let (fc1, fc2) = if quantized {
        (
            quantized_projection(ctx, attrs, inputs, "fc1", 2, 4, 11, e, f1, h)?,
            quantized_projection(ctx, attrs, inputs, "fc2", 5, 7, 12, e, h, inter)?,
        )
    } else {
        let w1 = float_input(inputs, 2, "fc1_experts_weights", &[e, f1, h])?;
        let w2 = float_input(inputs, 4, "fc2_experts_weights", &[e, h, inter])?;
        (
            Projection {
                int8: false,
                weights: Weights::Float(w1),
                bias: opt_float_input(inputs, 3, "fc1_experts_bias", &[e, f1])?,
                n: f1,
                k: h,
            },
            Projection {
                int8: false,
                weights: Weights::Float(w2),
                bias: opt_float_input(inputs, 5, "fc2_experts_bias", &[e, h])?,
                n: h,
                k: inter,
            },
        )
    };
    let logits = float_slice(router, "router_probs")?;
    let routes = if quantized {
        let rw = opt_float_input(inputs, 14, "router_weights", &[tokens, e])?;
        route_top_k_softmax(&logits, rw.as_deref(), e, attrs.k, attrs.normalize)
    } else {
        route_softmax_all(&logits, e, attrs.k, attrs.normalize)
    };
    let xs = float_slice(x, "input")?;
    // Per expert, its routes (route index = token·k + j), in token order.
    let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); e];
    for (r, route) in routes.iter().enumerate() {
        if let Some((ex, _)) = route {
            by_expert[*ex].push(r);
        }
    }
    // ONNX Runtime's float16 MoE keeps FC1's output, the activation and FC2's output in
    // float16 buffers, the bias added to the rounded product and rounded again; its float16
    // QMoE converts the input to f32, runs the f32 kernel and rounds the output only.
    let rounder = ctx.rounder();
    let round = |v: &mut [f32]| {
        if !quantized {
            rounder(v)
        }
    };
    let acc = ctx.accumulate;
    let k = attrs.k;
    // Each active expert's outputs for its routes: [routes, h].
    let expert_out: Vec<Vec<f32>> = by_expert
        .par_iter()
        .enumerate()
        .map(|(ex, rs)| {
            if rs.is_empty() {
                return Vec::new();
            }
            let m = rs.len();
            let mut a = Vec::with_capacity(m * h);
            for &r in rs {
                let t = r / k;
                a.extend_from_slice(&xs[t * h..(t + 1) * h]);
            }
            let project = |p: &Projection, a: &[f32]| -> Vec<f32> {
                if p.int8 {
                    return p.int8_product(attrs, ex, a, m);
                }
                let w = p.expert(attrs, ex);
                let mut y = vec![0f32; m * p.n];
                sgemm(acc, m, p.n, p.k, a, false, &w, true, &mut y, false);
                if let Some(b) = &p.bias {
                    round(&mut y);
                    let b = &b[ex * p.n..(ex + 1) * p.n];
                    for row in y.chunks_mut(p.n) {
                        row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
                    }
                }
                round(&mut y);
                y
            };
            let h1 = project(&fc1, &a);
            let mut act = vec![0f32; m * inter];
            for (o, hrow) in act.chunks_mut(inter).zip(h1.chunks(f1)) {
                activate(attrs, hrow, o);
            }
            round(&mut act);
            project(&fc2, &act)
        })
        .collect();
    // Where each route's output row is: (expert, row in its batch).
    let mut at = vec![(0usize, 0usize); routes.len()];
    for (ex, rs) in by_expert.iter().enumerate() {
        for (i, &r) in rs.iter().enumerate() {
            at[r] = (ex, i);
        }
    }
    let mut y = vec![0f32; tokens * h];
    y.par_chunks_mut(h.max(1)).enumerate().for_each(|(t, out)| {
        // ORT adds a token's experts in ascending expert order, from 0.
        let mut picked: Vec<(usize, f32, usize)> = (t * k..(t + 1) * k)
            .filter_map(|r| routes[r].map(|(ex, w)| (ex, w, r)))
            .collect();
        picked.sort_by_key(|p| p.0);
        for (ex, w, r) in picked {
            let row = &expert_out[ex][at[r].1 * h..(at[r].1 + 1) * h];
            out.iter_mut().zip(row).for_each(|(o, v)| *o += w * v);
        }
    });
    Ok(vec![in_dtype(
        Tensor::from_f32(x.shape().to_vec(), y),
        x.dtype(),
    )])
}

/// The output is the input's type and shape.
fn moe_facts(_: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

/// Two per multiply-add: each token's k experts, FC1 (`fusion·I × H`) and FC2 (`H × I`).
fn moe_flops(node: &Node, ins: &[Option<Vec<usize>>], outs: &[Vec<usize>]) -> u64 {
    let k = Attrs::new(node).int_or("k", 1).unwrap_or(1).max(1) as u64;
    let out = outs
        .first()
        .map_or(0, |s| s.iter().product::<usize>() as u64);
    // FC1's rows (fusion·I) are its weights' second dimension in both ops.
    let f1 = ins
        .get(2)
        .and_then(|s| s.as_ref())
        .and_then(|s| s.get(1).copied())
        .unwrap_or(0) as u64;
    let swiglu = Attrs::new(node)
        .string("activation_type")
        .ok()
        .flatten()
        .is_some_and(|a| a == "swiglu");
    let inter = if swiglu { f1 / 2 } else { f1 };
    2 * k * out * (f1 + inter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;

    fn ms_node(op: &str, attrs: &[(&str, Attribute)]) -> Node {
        let mut n = node_with(op, attrs);
        n.domain = MS_DOMAIN.into();
        n
    }

    fn run(node: &Node, inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
        crate::ops::attrs::parse_node(node, 1).map_err(|e| OpError(e.to_string()))?;
        let k = Registry::global().get(MS_DOMAIN, &node.op_type).unwrap();
        k(&OpCtx::new(node, 1), inputs).map(|mut v| v.remove(0))
    }

    fn int(k: &str, v: i64) -> (&str, Attribute) {
        (k, Attribute::Int(v))
    }

    fn act(a: &str) -> (&'static str, Attribute) {
        ("activation_type", Attribute::String(a.into()))
    }

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec())
    }

    /// MoE: a softmax over all experts, the top k (ties to the larger index), normalized on
    /// request; a NaN or infinite router row drops the token's routes.
    #[test]
    fn moe_routes_by_a_softmax_over_all_experts() {
        let r = route_softmax_all(&[0.0, 1.0, 2.0], 3, 2, false);
        let e: Vec<f32> = [0.0f32, 1.0, 2.0]
            .iter()
            .map(|&l| (l - 2.0).exp())
            .collect();
        let s = e[0] + e[1] + e[2];
        assert_eq!(r, vec![Some((2, e[2] / s)), Some((1, e[1] / s))]);
        let r = route_softmax_all(&[0.0, 1.0, 2.0], 3, 2, true);
        let top = e[2] / s + e[1] / s;
        assert_eq!(
            r,
            vec![Some((2, e[2] / s / top)), Some((1, e[1] / s / top))]
        );
        // Ties: the larger index first.
        let r = route_softmax_all(&[1.0, 1.0, 0.0], 3, 1, false);
        assert_eq!(r[0].unwrap().0, 1);
        for bad in [f32::NAN, f32::INFINITY] {
            let r = route_softmax_all(&[0.0, bad, 1.0], 3, 2, true);
            assert_eq!(r, vec![None, None], "{bad}");
        }
    }

    /// QMoE: the top k logits, a softmax over them alone (always normalized), or
    /// router_weights at them; weights ≤ 1e-8 dropped.
    #[test]
    fn qmoe_routes_by_a_softmax_over_the_top_k() {
        let r = route_top_k_softmax(&[0.0, 1.0, 3.0], None, 3, 2, false);
        let (a, b) = (1f32, (-2f32).exp());
        assert_eq!(
            r,
            vec![Some((2, a / (a + b))), Some((1, b * (1.0 / (a + b))))]
        );
        let rw = [0.5, 0.25, 0.75];
        let r = route_top_k_softmax(&[0.0, 1.0, 3.0], Some(&rw), 3, 2, false);
        assert_eq!(r, vec![Some((2, 0.75)), Some((1, 0.25))]);
        let r = route_top_k_softmax(&[0.0, 1.0, 3.0], Some(&rw), 3, 2, true);
        assert_eq!(r, vec![Some((2, 0.75)), Some((1, 0.25))]);
        let r = route_top_k_softmax(&[0.0, 1.0, 3.0], Some(&[0.5, 1e-9, 0.5]), 3, 2, true);
        assert_eq!(r[1], None);
    }

    /// Two experts of hidden size 2 and one inner unit, by hand: each token's weighted sum
    /// of its experts, the biases inside.
    #[test]
    fn moe_sums_the_picked_experts_weighted() {
        let x = t(&[2, 2], &[1.0, 2.0, -1.0, 0.5]);
        // Token 0 prefers expert 1, token 1 expert 0; k=2 normalized → softmax weights.
        let router = t(&[2, 2], &[0.0, 1.0, 2.0, 0.0]);
        let w1 = t(&[2, 1, 2], &[1.0, 1.0, 2.0, -1.0]);
        let b1 = t(&[2, 1], &[0.5, 0.0]);
        let w2 = t(&[2, 2, 1], &[1.0, -1.0, 3.0, 0.5]);
        let b2 = t(&[2, 2], &[0.0, 0.0, 1.0, 1.0]);
        let node = ms_node("MoE", &[int("k", 2), act("identity")]);
        let y = run(
            &node,
            &[
                Some(&x),
                Some(&router),
                Some(&w1),
                Some(&b1),
                Some(&w2),
                Some(&b2),
            ],
        )
        .unwrap();
        let expert = |e: usize, x: [f32; 2]| -> [f32; 2] {
            let w1 = [[1.0, 1.0], [2.0, -1.0]][e];
            let h = w1[0] * x[0] + w1[1] * x[1] + [0.5, 0.0][e];
            let w2 = [[1.0, -1.0], [3.0, 0.5]][e];
            let b2 = [[0.0, 0.0], [1.0, 1.0]][e];
            [w2[0] * h + b2[0], w2[1] * h + b2[1]]
        };
        let soft = |l: [f32; 2]| {
            let m = l[0].max(l[1]);
            let e = [(l[0] - m).exp(), (l[1] - m).exp()];
            [e[0] / (e[0] + e[1]), e[1] / (e[0] + e[1])]
        };
        let mut want = Vec::new();
        for (tok, l) in [([1.0, 2.0], [0.0, 1.0]), ([-1.0, 0.5], [2.0, 0.0])] {
            let p = soft(l);
            let (y0, y1) = (expert(0, tok), expert(1, tok));
            for j in 0..2 {
                want.push(0.0 + p[0] * y0[j] + p[1] * y1[j]);
            }
        }
        let got = y.as_f32().unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        // k=1: only the preferred expert, weight p (not normalized).
        let node = ms_node("MoE", &[int("k", 1), act("identity")]);
        let y = run(
            &node,
            &[Some(&x), Some(&router), Some(&w1), None, Some(&w2), None],
        )
        .unwrap();
        let p = soft([0.0, 1.0])[1];
        let h = 2.0 * 1.0 - 2.0;
        assert_eq!(&y.as_f32().unwrap()[..2], &[p * (3.0 * h), p * (0.5 * h)]);
    }

    /// SwiGLU reads FC1's rows interleaved, the gate first, clamps with the limit; relu turns
    /// a NaN into 0, the others keep it.
    #[test]
    fn activations_follow_the_cpu_kernel() {
        let attrs = |a: Activation, limit: f32| MoeAttrs {
            k: 1,
            activation: a,
            alpha: 1.702,
            beta: 1.0,
            limit,
            normalize: false,
            bits: 0,
            block_size: None,
            accuracy_level: 0,
        };
        let mut o = [0f32; 2];
        activate(
            &attrs(Activation::SwiGlu, 7.0),
            &[2.0, 3.0, 9.0, -8.0],
            &mut o,
        );
        let sw = |g: f32, l: f32| g * (1.0 / (1.0 + (-1.702 * g).exp())) * (l + 1.0);
        assert_eq!(o, [sw(2.0, 3.0), sw(7.0, -7.0)]);
        activate(
            &attrs(Activation::SwiGlu, f32::INFINITY),
            &[f32::NAN, 1.0, 1.0, f32::NAN],
            &mut o,
        );
        assert!(o[0].is_nan() && o[1].is_nan());
        let mut o = [0f32; 3];
        activate(
            &attrs(Activation::Relu, 0.0),
            &[f32::NAN, -1.0, 2.0],
            &mut o,
        );
        assert_eq!(o, [0.0, 0.0, 2.0]);
        for a in [Activation::Gelu, Activation::Silu, Activation::Identity] {
            activate(&attrs(a, 0.0), &[f32::NAN, 0.0, 1.0], &mut o);
            assert!(o[0].is_nan(), "{a:?}");
        }
    }

    /// Packs [E][N][K] codes as QMoE's uint8 weights, low nibble first for 4 bits.
    fn pack(codes: &[Vec<Vec<u8>>], bits: usize) -> Tensor {
        let (e, n, k) = (codes.len(), codes[0].len(), codes[0][0].len());
        let mut b = Vec::new();
        for ex in codes {
            for row in ex {
                if bits == 8 {
                    b.extend_from_slice(row);
                } else {
                    b.extend(row.chunks(2).map(|p| p[0] | (p[1] << 4)));
                }
            }
        }
        Tensor::from_parts(vec![e, n, k * bits / 8], TensorData::U8(b.into()))
    }

    /// QMoE equals MoE on the dequantized weights `(q − zp)·s`: per row and per block, zero
    /// points default and packed (per row along N, per block along the blocks).
    #[test]
    #[allow(clippy::needless_range_loop)] // indices name experts, rows and columns
    fn qmoe_is_moe_on_the_dequantized_experts() {
        // E=2, H=32, I=2 (FC1 [2, 2, 32], FC2 [2, 32, 2]): codes from a formula.
        let (e, h, i) = (2usize, 32usize, 2usize);
        let code = |a: usize, b: usize, c: usize| ((a * 7 + b * 3 + c * 5) % 16) as u8;
        let c1: Vec<Vec<Vec<u8>>> = (0..e)
            .map(|a| {
                (0..i)
                    .map(|b| (0..h).map(|c| code(a, b, c)).collect())
                    .collect()
            })
            .collect();
        let c2: Vec<Vec<Vec<u8>>> = (0..e)
            .map(|a| {
                (0..h)
                    .map(|b| (0..i).map(|c| code(a, b + 1, c)).collect())
                    .collect()
            })
            .collect();
        let x = t(
            &[3, h],
            &(0..3 * h)
                .map(|v| (v as f32 * 0.37).sin())
                .collect::<Vec<_>>(),
        );
        let router = t(&[3, e], &[0.3, -0.2, 1.0, 1.5, -0.4, 0.1]);
        // Per block of 16 along H for FC1; FC2's K (I=2) has one scale per row.
        let s1: Vec<f32> = (0..e * i * 2).map(|v| 0.05 + 0.01 * v as f32).collect();
        let s2: Vec<f32> = (0..e * h).map(|v| 0.02 + 0.001 * v as f32).collect();
        // FC1 zero points per block: 2 blocks → one byte per row; FC2 per row along N (32
        // rows → 16 bytes per expert).
        let z1: Vec<u8> = (0..e * i)
            .map(|v| (3 + v as u8) | ((9 - v as u8) << 4))
            .collect();
        let z2: Vec<u8> = (0..e * h / 2).map(|v| (v % 16) as u8 | 0x70).collect();
        for zp in [false, true] {
            let zp1 = |a: usize, b: usize, blk: usize| -> f32 {
                if zp {
                    ((z1[a * i + b] >> (4 * blk)) & 15) as f32
                } else {
                    8.0
                }
            };
            let zp2 = |a: usize, b: usize| -> f32 {
                if zp {
                    ((z2[a * h / 2 + b / 2] >> (4 * (b & 1))) & 15) as f32
                } else {
                    8.0
                }
            };
            let mut d1 = Vec::new();
            for a in 0..e {
                for b in 0..i {
                    for c in 0..h {
                        let blk = c / 16;
                        d1.push((c1[a][b][c] as f32 - zp1(a, b, blk)) * s1[(a * i + b) * 2 + blk]);
                    }
                }
            }
            let mut d2 = Vec::new();
            for a in 0..e {
                for b in 0..h {
                    for c in 0..i {
                        d2.push((c2[a][b][c] as f32 - zp2(a, b)) * s2[a * h + b]);
                    }
                }
            }
            // FC2 per row needs QMoE without block_size: run FC1 per block through a model
            // with block_size 16 needs FC2 blocked too, so compare each form separately.
            let w1 = pack(&c1, 4);
            let w2 = pack(&c2, 4);
            let z1t = Tensor::from_parts(vec![e, i, 1], TensorData::U8(z1.clone().into()));
            let z2t = Tensor::from_parts(vec![e, h / 2], TensorData::U8(z2.clone().into()));
            // Per row for both: FC1's scales [E, I] (one per row: the first block's).
            let s1_row: Vec<f32> = (0..e * i).map(|r| s1[r * 2]).collect();
            let z1_row: Vec<u8> = (0..e)
                .map(|a| (z1[a * i] & 15) | (z1[a * i + 1] & 15) << 4)
                .collect();
            let d1_row: Vec<f32> = (0..e * i * h)
                .map(|v| {
                    let (r, c) = (v / h, v % h);
                    let zp = if zp {
                        ((z1_row[r / 2] >> (4 * (r & 1))) & 15) as f32
                    } else {
                        8.0
                    };
                    (c1[r / i][r % i][c] as f32 - zp) * s1_row[r]
                })
                .collect();
            let node = ms_node(
                "QMoE",
                &[int("k", 2), act("silu"), int("expert_weight_bits", 4)],
            );
            let z1r = Tensor::from_parts(vec![e, 1], TensorData::U8(z1_row.clone().into()));
            let mut ins: Vec<Option<&Tensor>> = vec![None; 13];
            let (s1t, s2t) = (t(&[e, i], &s1_row), t(&[e, h], &s2));
            ins[0] = Some(&x);
            ins[1] = Some(&router);
            ins[2] = Some(&w1);
            ins[3] = Some(&s1t);
            ins[5] = Some(&w2);
            ins[6] = Some(&s2t);
            if zp {
                ins[11] = Some(&z1r);
                ins[12] = Some(&z2t);
            }
            let q = run(&node, &ins).unwrap();
            // The same weights dequantized, through MoE; QMoE's routing is always
            // normalized, MoE's on request.
            let moe_node = ms_node(
                "MoE",
                &[
                    int("k", 2),
                    act("silu"),
                    int("normalize_routing_weights", 1),
                ],
            );
            let (w1f, w2f) = (t(&[e, i, h], &d1_row), t(&[e, h, i], &d2));
            let m = run(
                &moe_node,
                &[Some(&x), Some(&router), Some(&w1f), None, Some(&w2f)],
            )
            .unwrap();
            let close = |a: &Tensor, b: &Tensor| {
                a.as_f32()
                    .unwrap()
                    .iter()
                    .zip(b.as_f32().unwrap())
                    .all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + q.abs()))
            };
            assert!(close(&q, &m), "per row, zp {zp}: {q:?} vs {m:?}");
            // Per block for FC1 (block 16: 2 blocks of H), FC2's K=2 cannot be blocked by 16:
            // check FC1's dequantization on its own.
            let attrs = MoeAttrs {
                k: 2,
                activation: Activation::Silu,
                alpha: 1.0,
                beta: 0.0,
                limit: f32::INFINITY,
                normalize: false,
                bits: 4,
                block_size: Some(16),
                accuracy_level: 0,
            };
            let s1b = t(&[e, i, 2], &s1);
            let mut ins = vec![None; 12];
            ins[2] = Some(&w1);
            ins[3] = Some(&s1b);
            if zp {
                ins[11] = Some(&z1t);
            }
            let ctx = OpCtx::new(&node, 1);
            let p = quantized_projection(&ctx, &attrs, &ins, "fc1", 2, 4, 11, e, i, h).unwrap();
            assert!(
                !p.int8,
                "weights that are no initializer take the float path"
            );
            let got: Vec<f32> = (0..e).flat_map(|a| p.expert(&attrs, a)).collect();
            assert_eq!(got, d1, "per block, zp {zp}");
        }
    }

    /// Attributes and inputs the CPU kernels refuse are refused, naming what is wrong.
    /// Under a float16 plan QMoE computes in f32 and leaves only its output to be rounded
    /// (ONNX Runtime 1.32's float16 QMoE: the f32 kernel on the converted input), while MoE
    /// rounds its products, biased outputs and activation as its float16 buffers do.
    #[test]
    fn a_float16_qmoe_computes_in_f32_and_a_float16_moe_rounds_its_buffers() {
        let (e, h, i) = (2usize, 32usize, 4usize);
        let f16 = |v: f32| half::f16::from_f32(v).to_f32();
        let x = t(
            &[3, h],
            &(0..3 * h)
                .map(|v| f16((v as f32 * 0.37).sin() * 1.7))
                .collect::<Vec<_>>(),
        );
        let router = t(&[3, e], &[0.3, -0.2, 1.0, 1.5, -0.4, 0.1]);
        let with_f16 = |node: &Node, ins: &[Option<&Tensor>]| {
            let mut ctx = OpCtx::new(node, 1);
            ctx.round_to = Some(crate::numeric::Rounding::F16);
            let k = Registry::global().get(MS_DOMAIN, &node.op_type).unwrap();
            k(&ctx, ins).unwrap().remove(0)
        };
        // QMoE, 8-bit codes, one scale per row (float16 values, as the plan rounds them).
        let codes: Vec<Vec<Vec<u8>>> = (0..e)
            .map(|a| {
                (0..i)
                    .map(|b| {
                        (0..h)
                            .map(|c| ((a * 31 + b * 17 + c * 13) % 256) as u8)
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let codes2: Vec<Vec<Vec<u8>>> = (0..e)
            .map(|a| {
                (0..h)
                    .map(|b| {
                        (0..i)
                            .map(|c| ((a * 7 + b * 29 + c * 11) % 256) as u8)
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let (w1, w2) = (pack(&codes, 8), pack(&codes2, 8));
        let s1 = t(
            &[e, i],
            &[f16(0.0131), f16(0.0217), f16(0.0173), f16(0.0119)].repeat(e),
        );
        let s2 = t(&[e, h], &vec![f16(0.0097); e * h]);
        let qnode = ms_node(
            "QMoE",
            &[int("k", 2), act("silu"), int("expert_weight_bits", 8)],
        );
        let mut ins: Vec<Option<&Tensor>> = vec![None; 7];
        ins[0] = Some(&x);
        ins[1] = Some(&router);
        ins[2] = Some(&w1);
        ins[3] = Some(&s1);
        ins[5] = Some(&w2);
        ins[6] = Some(&s2);
        let (plain, half) = (run(&qnode, &ins).unwrap(), with_f16(&qnode, &ins));
        assert_eq!(plain.as_f32().unwrap(), half.as_f32().unwrap());
        // MoE on float weights: the rounded buffers change the result.
        let w1f = t(
            &[e, i, h],
            &(0..e * i * h)
                .map(|v| f16((v as f32 * 0.11).cos() * 0.3))
                .collect::<Vec<_>>(),
        );
        let w2f = t(
            &[e, h, i],
            &(0..e * h * i)
                .map(|v| f16((v as f32 * 0.23).sin() * 0.3))
                .collect::<Vec<_>>(),
        );
        let mnode = ms_node("MoE", &[int("k", 2), act("silu")]);
        let ins = [Some(&x), Some(&router), Some(&w1f), None, Some(&w2f)];
        let (plain, half) = (run(&mnode, &ins).unwrap(), with_f16(&mnode, &ins));
        assert_ne!(plain.as_f32().unwrap(), half.as_f32().unwrap());
    }

    #[test]
    fn refuses_what_the_cpu_kernel_refuses() {
        let x = t(&[1, 2], &[1.0, 2.0]);
        let router = t(&[1, 2], &[0.0, 1.0]);
        let w1 = t(&[2, 2, 2], &[0.5; 8]);
        let w2 = t(&[2, 2, 1], &[0.5; 4]);
        let w3 = t(&[2, 1, 2], &[0.5; 4]);
        let err = |node: &Node, ins: &[Option<&Tensor>]| run(node, ins).unwrap_err().0;
        let ins = [Some(&x), Some(&router), Some(&w1), None, Some(&w2)];
        for (attrs, want) in [
            (vec![act("swiglu")], "swiglu_fusion"),
            (vec![act("swiglu"), int("swiglu_fusion", 2)], "interleaved"),
            (vec![act("geglu"), int("swiglu_fusion", 1)], "CUDA"),
            (vec![int("k", 0)], "at least 1"),
            (vec![int("use_sparse_mixer", 1)], "k=2"),
        ] {
            let e = err(&ms_node("MoE", &attrs), &ins);
            assert!(e.contains(want), "{attrs:?}: {e}");
        }
        let swiglu = ms_node(
            "MoE",
            &[act("swiglu"), int("swiglu_fusion", 1), int("k", 3)],
        );
        let e = err(&swiglu, &ins);
        assert!(e.contains("k=3 exceeds the 2 experts"), "{e}");
        let relu = ms_node("MoE", &[]);
        let w1r = t(&[2, 1, 2], &[0.5; 4]);
        let e = err(
            &relu,
            &[
                Some(&x),
                Some(&router),
                Some(&w1r),
                None,
                Some(&w2),
                None,
                Some(&w3),
            ],
        );
        assert!(e.contains("FC3"), "{e}");
        // FC1 of the wrong width for swiglu (needs 2·I rows).
        let e = err(
            &swiglu.clone(),
            &[Some(&x), Some(&router), Some(&w1r), None, Some(&w2)],
        );
        assert!(
            e.contains("fc1_experts_weights") || e.contains("k=3"),
            "{e}"
        );
        let sw = ms_node("MoE", &[act("swiglu"), int("swiglu_fusion", 1)]);
        let e = err(&sw, &[Some(&x), Some(&router), Some(&w1r), None, Some(&w2)]);
        assert!(
            e.contains("fc1_experts_weights") && e.contains("[2, 2, 2]"),
            "{e}"
        );
        let bad_router = t(&[2, 2], &[0.0; 4]);
        let e = err(
            &relu,
            &[Some(&x), Some(&bad_router), Some(&w1r), None, Some(&w2)],
        );
        assert!(
            e.contains("router_probs") && e.contains("[1, experts]"),
            "{e}"
        );
        for (attrs, want) in [
            (vec![int("expert_weight_bits", 2)], "expert_weight_bits"),
            (vec![int("fc1_expert_weight_bits", 8)], "mixed-width"),
            (
                vec![("quant_type", Attribute::String("fp4".into()))],
                "FP4/FP8",
            ),
            (vec![int("weights_prepacked", 1)], "CUDA-prepacked"),
            (vec![int("block_size", 24)], "power of 2"),
        ] {
            let e = err(&ms_node("QMoE", &attrs), &[Some(&x)]);
            assert!(e.contains(want), "{attrs:?}: {e}");
        }
        // QMoE codes of the wrong shape name the input.
        let q = ms_node("QMoE", &[]);
        let codes = Tensor::from_parts(vec![2, 1, 2], TensorData::U8(vec![0u8; 4].into()));
        let codes2 = Tensor::from_parts(vec![2, 2, 1], TensorData::U8(vec![0u8; 4].into()));
        let s = t(&[2, 1], &[1.0; 2]);
        let s2 = t(&[2, 2], &[1.0; 4]);
        let e = err(
            &q,
            &[
                Some(&x),
                Some(&router),
                Some(&codes),
                Some(&s),
                None,
                Some(&codes2),
                Some(&s2),
            ],
        );
        assert!(e.contains("fc1_experts_weights is uint8 [2, 1, 2]"), "{e}");
    }
}
