//! com.microsoft LinearAttentionGate, LinearAttention and GatedDeltaNet (ONNX Runtime GenAI
//! 0.18's Qwen3.5 / Qwen3-Next linear-attention layers) as ONNX Runtime 1.32's CPU kernels
//! compute them (`contrib_ops/cpu/bert/linear_attention_gates.cc`, `linear_attention.cc`,
//! `gated_delta_net.cc`). ORT 1.32's sources of the last two were not at hand: the orders below
//! were measured against the 1.32 binary, case by case (docs/numerics.md, "Linear attention").
//!
//! - **LinearAttentionGate**: `decay = decay_scale·softplus(a + dt_bias)` with ORT's softplus
//!   (`x > 0 ? x + log(exp(−x) + 1) : log(exp(x) + 1)`, libm's expf/logf), `beta =
//!   sigmoid(b)` by MLAS's logistic; f32 inside, rounded once to the input's type.
//! - **LinearAttention** (3-D packed `[B, T, H·D]`, state `[B, H_kv, d_k, d_v]`): per token
//!   `S ← exp(g)·S`, retrieval `r = Sᵀk`, `δ = β(v − r)`, `S ← S + k⊗δ`, `o = scale·qᵀS`, in one
//!   of three orders ORT picks by shape: *vector* (`d_k % 16 == 0` and `d_v % 32 == 0`: fused
//!   multiply-adds, the output from the old state as `fma(q·k, δ, Sᵀ(g·q))`, `q·k` over the
//!   vector lanes), *MLAS* (`d_k·d_v ≥ 4096`: the products by MLAS's M = 1 GEMM) or *scalar*.
//! - **GatedDeltaNet** (token-major `[N, H, D]` or `[B, S, H, D]`, V-major f32 state `[B, H_v,
//!   d_v, d_k]`, ragged `cu_seqlens`): the scalar recurrence, with the fused gate
//!   (`softplus`/`qwen`: `−exp(a_log)·softplus(decay + dt_bias)`), `sigmoid` beta and per-head L2
//!   normalization of q and k.

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::mlas_sgemm;
use super::super::shape::{fact, opt_fact, FactsResult};
use super::super::util::{float_values, in_dtype, input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::tensor::{DType, Tensor};

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Param};
    r.add_in(MS_DOMAIN, "LinearAttentionGate", linear_attention_gate)
        .roles(&[Data, Param, Param, Data])
        .infer(gate_facts);
    // The state (past_state, present_state: type S) keeps its own type under a 16-bit plan:
    // ORT 1.32 runs a float16 LinearAttention with a float32 state as its float32 kernel
    // between Casts of query, key, value, decay, beta and output only (measured).
    r.add_in(MS_DOMAIN, "LinearAttention", linear_attention)
        .parse(|n, _| boxed(LaAttrs::parse(n)))
        .roles(&[Data, Data, Data, Param, Data, Data])
        .keeps_output_types(&[1])
        .infer(la_facts);
    // initial_state, final_state and state_update are float32 (TS) in every kernel; decay and
    // beta (TG) may stay float32 beside a float16 query (measured: ORT 1.32's float16 kernel
    // takes them so, bit for bit as float16 ones holding the same values).
    r.add_in(MS_DOMAIN, "GatedDeltaNet", gated_delta_net)
        .parse(|n, _| boxed(GdnAttrs::parse(n)))
        .roles(&[
            Data, Data, Data, Param, Param, Param, Param, Param, Param, Param, Param,
        ])
        .keeps_output_types(&[1, 2])
        .infer(gdn_facts);
}

/// ORT's softplus of LinearAttentionGate.
fn gate_softplus(x: f32) -> f32 {
    if x > 0.0 {
        x + ((-x).exp() + 1.0).ln()
    } else {
        (x.exp() + 1.0).ln()
    }
}

/// GatedDeltaNet's softplus of its fused gate (measured: `log1p(exp(x))`, x past 20 itself).
fn gdn_softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// GatedDeltaNet's sigmoid (measured on its `beta_activation`): the stable two-branch form.
fn gdn_sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

fn linear_attention_gate(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a = input(inputs, 0)?;
    let (dt, ds) = (input(inputs, 1)?, input(inputs, 2)?);
    let b = opt_input(inputs, 3);
    let Some(&h) = a.shape().last() else {
        return Err(OpError("a must have rank >= 1".into()));
    };
    if h == 0 {
        return Err(OpError("a's last dimension must be positive".into()));
    }
    let (dtv, dsv) = (
        float_values(dt, "dt_bias")?,
        float_values(ds, "decay_scale")?,
    );
    if dtv.len() != h || dsv.len() != h {
        return Err(OpError(format!(
            "dt_bias ({}) and decay_scale ({}) must have {h} elements (a's last dimension)",
            dtv.len(),
            dsv.len()
        )));
    }
    let av = float_values(a, "a")?;
    let decay: Vec<f32> = av
        .iter()
        .enumerate()
        .map(|(i, &x)| dsv[i % h] * gate_softplus(x + dtv[i % h]))
        .collect();
    let mut outs = vec![in_dtype(
        Tensor::from_f32(a.shape().to_vec(), decay),
        a.dtype(),
    )];
    if let Some(b) = b {
        if b.shape() != a.shape() {
            return Err(OpError(format!(
                "b {:?} must have a's shape {:?}",
                b.shape(),
                a.shape()
            )));
        }
        let beta: Vec<f32> = float_values(b, "b")?
            .iter()
            .map(|&x| super::super::logistic::logistic(x))
            .collect();
        outs.push(in_dtype(
            Tensor::from_f32(a.shape().to_vec(), beta),
            a.dtype(),
        ));
    } else if ctx.node.outputs.get(1).is_some_and(|o| !o.is_empty()) {
        return Err(OpError(
            "the b input is required when the beta output is requested".into(),
        ));
    }
    Ok(outs)
}

fn gate_facts(_: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let a = fact(ins, 0)?;
    let f = Fact::new(a.dtype, a.shape.clone());
    Ok(vec![f.clone(), f])
}

/// The recurrence's terms.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rule {
    Linear,
    Gated,
    Delta,
    GatedDelta,
}

impl Rule {
    fn parse(a: &Attrs) -> Result<Rule, AttrError> {
        Ok(match a.string("update_rule")?.unwrap_or("gated_delta") {
            "linear" => Rule::Linear,
            "gated" => Rule::Gated,
            "delta" => Rule::Delta,
            "gated_delta" => Rule::GatedDelta,
            s => {
                return Err(AttrError::new(
                    "update_rule",
                    format!("must be one of linear, gated, delta, gated_delta; got {s:?}"),
                ))
            }
        })
    }
    fn decays(self) -> bool {
        matches!(self, Rule::Gated | Rule::GatedDelta)
    }
    fn deltas(self) -> bool {
        matches!(self, Rule::Delta | Rule::GatedDelta)
    }
    fn name(self) -> &'static str {
        match self {
            Rule::Linear => "linear",
            Rule::Gated => "gated",
            Rule::Delta => "delta",
            Rule::GatedDelta => "gated_delta",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct LaAttrs {
    q_heads: usize,
    kv_heads: usize,
    rule: Rule,
    scale: f32,
}

impl LaAttrs {
    fn parse(node: &Node) -> Result<LaAttrs, AttrError> {
        let a = Attrs::new(node);
        let heads = |name: &str| -> Result<usize, AttrError> {
            let v = a.required_int(name)?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| AttrError::new(name, format!("must be positive, got {v}")))
        };
        let w = a.int_or("state_window", 0)?;
        if w != 0 {
            return Err(AttrError::new(
                "state_window",
                format!("is {w}: ONNX Runtime's CPU LinearAttention supports only 0 (CUDA only)"),
            ));
        }
        Ok(LaAttrs {
            q_heads: heads("q_num_heads")?,
            kv_heads: heads("kv_num_heads")?,
            rule: Rule::parse(&a)?,
            scale: a.float_or("scale", 0.0)?,
        })
    }
}

/// How ORT 1.32's LinearAttention orders a head's products (measured by shape).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Order {
    /// `d_k % 16 == 0 && d_v % 32 == 0`: fused multiply-adds; `lanes` for `q·k`.
    Vector { lanes: usize },
    /// `d_k·d_v ≥ 4096`: MLAS's M = 1 GEMM for `Sᵀk` and `qᵀS`.
    Mlas,
    /// Plain loops: sums over `d_k` in order, products rounded.
    Scalar,
}

impl Order {
    fn of(dk: usize, dv: usize) -> Order {
        if dk.is_multiple_of(16) && dv.is_multiple_of(32) {
            Order::Vector {
                lanes: vector_lanes(),
            }
        } else if dk * dv >= 4096 {
            Order::Mlas
        } else {
            Order::Scalar
        }
    }
}

/// The vector width (f32 lanes) of ORT's vector path on this CPU: 16 with AVX-512F (measured),
/// else 8 (AVX2; not measured).
fn vector_lanes() -> usize {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        return 16;
    }
    8
}

/// `Σ a[i]·b[i]` in `lanes` fused multiply-add lanes (lane `i mod lanes`), reduced by halves.
fn lane_dot(a: &[f32], b: &[f32], lanes: usize) -> f32 {
    let mut l = vec![0f32; lanes];
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        l[i % lanes] = x.mul_add(y, l[i % lanes]);
    }
    let mut n = lanes;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            l[i] += l[i + n];
        }
    }
    l[0]
}

/// One token's step of one (batch, KV head) state `s [d_k, d_v]`. `g` per key row (`exp` of
/// the decay; 1 without decay), `beta` (None: no retrieval), `qs` the query heads reading this
/// state with their output rows.
#[allow(clippy::too_many_arguments)]
fn la_step(
    order: Order,
    s: &mut [f32],
    (dk, dv): (usize, usize),
    k: &[f32],
    v: &[f32],
    g: Option<&[f32]>,
    beta: Option<f32>,
    qs: &mut [(&[f32], &mut [f32])],
    scale: f32,
) {
    let gi = |i: usize| g.map_or(1.0, |g| g[i]);
    match order {
        Order::Vector { lanes } => {
            let delta: Vec<f32> = match beta {
                Some(bt) => {
                    let mut r = vec![0f32; dv];
                    for i in 0..dk {
                        let kg = k[i] * gi(i);
                        for (rj, &sij) in r.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                            *rj = sij.mul_add(kg, *rj);
                        }
                    }
                    v.iter().zip(&r).map(|(&vj, &rj)| bt * (vj - rj)).collect()
                }
                None => v.to_vec(),
            };
            for (q, o) in qs.iter_mut() {
                let qk = lane_dot(q, k, lanes);
                let mut base = vec![0f32; dv];
                for i in 0..dk {
                    let qg = q[i] * gi(i);
                    for (bj, &sij) in base.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                        *bj = sij.mul_add(qg, *bj);
                    }
                }
                for ((oj, &bj), &dj) in o.iter_mut().zip(&base).zip(&delta) {
                    *oj = qk.mul_add(dj, bj) * scale;
                }
            }
            // With a decay `fma(S, g, k·δ)`; without one `fma(k, δ, S)` (measured).
            for i in 0..dk {
                let ki = k[i];
                let row = s[i * dv..(i + 1) * dv].iter_mut().zip(&delta);
                match g {
                    Some(g) => row.for_each(|(sij, &dj)| *sij = sij.mul_add(g[i], ki * dj)),
                    None => row.for_each(|(sij, &dj)| *sij = ki.mul_add(dj, *sij)),
                }
            }
        }
        Order::Mlas | Order::Scalar => {
            if let Some(g) = g {
                for i in 0..dk {
                    s[i * dv..(i + 1) * dv].iter_mut().for_each(|x| *x *= g[i]);
                }
            }
            let dot_rows = |w: &[f32], s: &[f32], out: &mut [f32]| {
                if order == Order::Mlas {
                    mlas_sgemm::sgemm(false, 1, dv, dk, 1.0, w, dk, s, dv, false, out, dv);
                } else {
                    for (j, oj) in out.iter_mut().enumerate() {
                        let mut acc = 0f32;
                        for i in 0..dk {
                            acc += s[i * dv + j] * w[i];
                        }
                        *oj = acc;
                    }
                }
            };
            let delta: Vec<f32> = match beta {
                Some(bt) => {
                    let mut r = vec![0f32; dv];
                    dot_rows(k, s, &mut r);
                    v.iter().zip(&r).map(|(&vj, &rj)| bt * (vj - rj)).collect()
                }
                None => v.to_vec(),
            };
            for i in 0..dk {
                let ki = k[i];
                for (sij, &dj) in s[i * dv..(i + 1) * dv].iter_mut().zip(&delta) {
                    *sij += ki * dj;
                }
            }
            for (q, o) in qs.iter_mut() {
                dot_rows(q, s, o);
                if order == Order::Scalar || scale != 1.0 {
                    o.iter_mut().for_each(|x| *x *= scale);
                }
            }
        }
    }
}

fn linear_attention(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let at: &LaAttrs = super::super::attrs::of(ctx.node, ctx.opset)?;
    let (q, k, v) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let (past, decay, beta) = (
        opt_input(inputs, 3),
        opt_input(inputs, 4),
        opt_input(inputs, 5),
    );
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    if qs.len() != 3 || ks.len() != 3 || vs.len() != 3 {
        return Err(OpError(format!(
            "query {qs:?}, key {ks:?} and value {vs:?} must be 3-D [B, T, H·D]"
        )));
    }
    let (b, t) = (qs[0], qs[1]);
    if ks[..2] != qs[..2] || vs[..2] != qs[..2] {
        return Err(OpError(format!(
            "key {ks:?} and value {vs:?} must share query's batch and length {:?}",
            &qs[..2]
        )));
    }
    let (hq, hkv) = (at.q_heads, at.kv_heads);
    if qs[2] % hq != 0 || vs[2] % hkv != 0 || qs[2] == 0 || vs[2] == 0 {
        return Err(OpError(format!(
            "query's last dimension {} must be a multiple of q_num_heads {hq} and value's {} of \
             kv_num_heads {hkv}",
            qs[2], vs[2]
        )));
    }
    let (dk, dv) = (qs[2] / hq, vs[2] / hkv);
    if ks[2] % dk != 0 || ks[2] == 0 || hkv % (ks[2] / dk) != 0 {
        return Err(OpError(format!(
            "key's last dimension {} must be a multiple of d_k {dk} with a head count dividing \
             kv_num_heads {hkv}",
            ks[2]
        )));
    }
    let nk = ks[2] / dk;
    if (hq >= hkv && hq % hkv != 0) || (hq < hkv && hkv % hq != 0) {
        return Err(OpError(format!(
            "q_num_heads {hq} and kv_num_heads {hkv}: one must be a multiple of the other"
        )));
    }
    if at.rule.decays() && decay.is_none() {
        return Err(OpError(format!(
            "decay is required for update_rule={}",
            at.rule.name()
        )));
    }
    if at.rule.deltas() && beta.is_none() {
        return Err(OpError(format!(
            "beta is required for update_rule={}",
            at.rule.name()
        )));
    }
    let decay = decay.filter(|_| at.rule.decays());
    let beta = beta.filter(|_| at.rule.deltas());
    let per_key = match decay {
        Some(d) if d.shape() == [b, t, hkv * dk] => true,
        Some(d) if d.shape() == [b, t, hkv] => false,
        Some(d) => {
            return Err(OpError(format!(
                "decay {:?} must be [B, T, kv_num_heads] or [B, T, kv_num_heads·d_k]",
                d.shape()
            )))
        }
        None => false,
    };
    let beta_per_head = match beta {
        Some(x) if x.shape() == [b, t, hkv] => true,
        Some(x) if x.shape() == [b, t, 1] => false,
        Some(x) => {
            return Err(OpError(format!(
                "beta {:?} must be [B, T, kv_num_heads] or [B, T, 1]",
                x.shape()
            )))
        }
        None => false,
    };
    let state_shape = [b, hkv, dk, dv];
    let mut state = match past {
        Some(p) if p.shape() == state_shape => float_values(p, "past_state")?,
        Some(p) => {
            return Err(OpError(format!(
                "past_state {:?} must be (B, H_kv, d_k, d_v) {state_shape:?}",
                p.shape()
            )))
        }
        None => vec![0f32; b * hkv * dk * dv],
    };
    let (qv, kv, vv) = (
        float_values(q, "query")?,
        float_values(k, "key")?,
        float_values(v, "value")?,
    );
    let dec: Option<Vec<f32>> = decay
        .map(|d| float_values(d, "decay").map(|x| x.iter().map(|g| g.exp()).collect()))
        .transpose()?;
    let bet = beta.map(|x| float_values(x, "beta")).transpose()?;
    let scale = if at.scale == 0.0 {
        1.0 / (dk as f32).sqrt()
    } else {
        at.scale
    };
    let out_heads = hq.max(hkv);
    let mut out = vec![0f32; b * t * out_heads * dv];
    let order = Order::of(dk, dv);
    let per_group = hq / hkv; // 0: inverse GQA
    let kv_per_k = hkv / nk;
    let head = dk * dv;
    for bi in 0..b {
        for h in 0..hkv {
            let s = &mut state[(bi * hkv + h) * head..(bi * hkv + h + 1) * head];
            let hk = h / kv_per_k;
            let q_heads: Vec<(usize, usize)> = if per_group > 0 {
                (0..per_group)
                    .map(|g| (h * per_group + g, h * per_group + g))
                    .collect()
            } else {
                vec![(h * hq / hkv, h)]
            };
            for ti in 0..t {
                let row = bi * t + ti;
                let kt = &kv[row * nk * dk + hk * dk..][..dk];
                let vt = &vv[row * hkv * dv + h * dv..][..dv];
                let g: Option<Vec<f32>> = dec.as_ref().map(|d| {
                    if per_key {
                        d[row * hkv * dk + h * dk..][..dk].to_vec()
                    } else {
                        vec![d[row * hkv + h]; dk]
                    }
                });
                let bt = bet.as_ref().map(|x| {
                    if beta_per_head {
                        x[row * hkv + h]
                    } else {
                        x[row]
                    }
                });
                let mut rows: Vec<(&[f32], Vec<f32>)> = q_heads
                    .iter()
                    .map(|&(qh, _)| (&qv[row * hq * dk + qh * dk..][..dk], vec![0f32; dv]))
                    .collect();
                {
                    let mut refs: Vec<(&[f32], &mut [f32])> = rows
                        .iter_mut()
                        .map(|(q, o)| (*q, o.as_mut_slice()))
                        .collect();
                    la_step(
                        order,
                        s,
                        (dk, dv),
                        kt,
                        vt,
                        g.as_deref(),
                        bt,
                        &mut refs,
                        scale,
                    );
                }
                for ((_, oh), (_, o)) in q_heads.iter().zip(&rows) {
                    out[row * out_heads * dv + oh * dv..][..dv].copy_from_slice(o);
                }
            }
        }
    }
    // Under a 16-bit plan the output is rounded once, the state left as computed (a float16
    // ORT model with a float32 state: Casts around the float32 kernel, measured).
    if q.dtype() == DType::F32 {
        ctx.rounder()(&mut out);
        ctx.outputs_rounded();
    }
    let state_dtype = past.map_or(q.dtype(), |p| p.dtype());
    Ok(vec![
        in_dtype(Tensor::from_f32(vec![b, t, out_heads * dv], out), q.dtype()),
        in_dtype(Tensor::from_f32(state_shape.to_vec(), state), state_dtype),
    ])
}

fn la_facts(ictx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let at: &LaAttrs = super::super::attrs::of(ictx.node, ictx.opset)?;
    let (q, v) = (fact(ins, 0)?, fact(ins, 2)?);
    let out_shape = match (&q.shape, &v.shape) {
        (Some(qs), Some(vs)) if qs.len() == 3 && vs.len() == 3 => {
            let dv = vs[2].as_known().map(|n| n / at.kv_heads);
            Some(vec![
                qs[0].clone(),
                qs[1].clone(),
                dv.map_or_else(
                    || DimFact::unknown(0),
                    |dv| DimFact::known(dv * at.q_heads.max(at.kv_heads)),
                ),
            ])
        }
        _ => None,
    };
    let state = opt_fact(ins, 3).map_or_else(
        || Fact::new(q.dtype, None),
        |p| Fact::new(p.dtype, p.shape.clone()),
    );
    Ok(vec![Fact::new(q.dtype, out_shape), state])
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum GateAct {
    None,
    Softplus,
    Sigmoid,
}

#[derive(Clone, Debug, PartialEq)]
struct GdnAttrs {
    rule: Rule,
    scale: f32,
    gate: GateAct,
    lower_bound: f32,
    beta_sigmoid: bool,
    l2: bool,
    capacity: i64,
}

impl GdnAttrs {
    fn parse(node: &Node) -> Result<GdnAttrs, AttrError> {
        let a = Attrs::new(node);
        let gate = match a.string("gate_activation")?.unwrap_or("none") {
            "none" => GateAct::None,
            "softplus" | "qwen" => GateAct::Softplus,
            "sigmoid" | "kda" => GateAct::Sigmoid,
            s => {
                return Err(AttrError::new(
                    "gate_activation",
                    format!("must be one of none, softplus (qwen), sigmoid (kda); got {s:?}"),
                ))
            }
        };
        let beta_sigmoid = match a.string("beta_activation")?.unwrap_or("none") {
            "none" => false,
            "sigmoid" => true,
            s => {
                return Err(AttrError::new(
                    "beta_activation",
                    format!("must be none or sigmoid, got {s:?}"),
                ))
            }
        };
        let lower_bound = a.float_or("gate_lower_bound", -5.0)?;
        if !(lower_bound.is_finite() && lower_bound < 0.0) {
            return Err(AttrError::new(
                "gate_lower_bound",
                format!("must be finite and negative, got {lower_bound}"),
            ));
        }
        let chunk = a.int_or("chunk_size", 64)?;
        if chunk <= 0 || chunk > i64::from(i32::MAX) {
            return Err(AttrError::new(
                "chunk_size",
                format!("must be positive and fit in int32, got {chunk}"),
            ));
        }
        let capacity = a.int_or("state_update_capacity", 0)?;
        if !(0..=8).contains(&capacity) {
            return Err(AttrError::new(
                "state_update_capacity",
                format!("must be in [0, 8], got {capacity}"),
            ));
        }
        Ok(GdnAttrs {
            rule: Rule::parse(&a)?,
            scale: a.float_or("scale", 0.0)?,
            gate,
            lower_bound,
            beta_sigmoid,
            l2: a.int_or("qk_l2_norm", 0)? != 0,
            capacity,
        })
    }
}

const NO_CAPTURE: &str = "GatedDeltaNet: compact state-update capture (state_update_capacity > 0, \
                          capture_count, state_update) is not supported by mixprec";

/// `x·(1/√(Σx² + 1e-12))` (measured; the sum in order).
fn l2_normalize(x: &mut [f32]) {
    let mut ss = 0f32;
    for &e in x.iter() {
        ss += e * e;
    }
    let inv = 1.0 / (ss + 1e-12).sqrt();
    x.iter_mut().for_each(|e| *e *= inv);
}

fn gated_delta_net(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let at: &GdnAttrs = super::super::attrs::of(ctx.node, ctx.opset)?;
    if at.capacity > 0 || opt_input(inputs, 9).is_some() {
        return Err(OpError(NO_CAPTURE.into()));
    }
    let q = input(inputs, 0)?;
    let (Some(k), Some(v)) = (opt_input(inputs, 1), opt_input(inputs, 2)) else {
        return Err(OpError(
            "GatedDeltaNet: packed QKV (key and value omitted) is not supported by mixprec".into(),
        ));
    };
    let (cu, decay, beta, init, a_log, dt_bias) = (
        opt_input(inputs, 3),
        opt_input(inputs, 4),
        opt_input(inputs, 5),
        opt_input(inputs, 6),
        opt_input(inputs, 7),
        opt_input(inputs, 8),
    );
    if at.rule.decays() != decay.is_some() {
        return Err(OpError(format!(
            "decay input presence must match update_rule={}",
            at.rule.name()
        )));
    }
    if at.rule.deltas() != beta.is_some() {
        return Err(OpError(format!(
            "beta input presence must match update_rule={}",
            at.rule.name()
        )));
    }
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    let rank = qs.len();
    if !(rank == 3 || rank == 4) || ks.len() != rank || vs.len() != rank {
        return Err(OpError(format!(
            "query {qs:?}, key {ks:?} and value {vs:?} must all be rank 3 [tokens, heads, size] \
             or rank 4 [batch, sequence, heads, size]"
        )));
    }
    let td = rank - 2;
    let n: usize = qs[..td].iter().product();
    if ks[..td].iter().product::<usize>() != n || vs[..td].iter().product::<usize>() != n || n == 0
    {
        return Err(OpError(format!(
            "query {qs:?}, key {ks:?} and value {vs:?} must agree on a positive token count"
        )));
    }
    let (hq, hk, hv, dk, dv) = (qs[td], ks[td], vs[td], qs[td + 1], vs[td + 1]);
    if ks[td + 1] != dk || hq != hk || hq == 0 || hv == 0 || hv % hq != 0 || dk == 0 || dv == 0 {
        return Err(OpError(format!(
            "query {qs:?}, key {ks:?}, value {vs:?}: key heads must equal query heads, key head \
             size query's, value heads a positive multiple of query heads"
        )));
    }
    // Each batch's token range.
    let ranges: Vec<(usize, usize)> = if let Some(cu) = cu {
        if rank != 3 {
            return Err(OpError(
                "cu_seqlens describes ragged packing, so query/key/value must be rank 3".into(),
            ));
        }
        if cu.dtype() != DType::I32 || cu.shape().len() != 1 || cu.shape()[0] < 2 {
            return Err(OpError(format!(
                "cu_seqlens must be int32 rank 1 with at least 2 elements, got {} {:?}",
                cu.dtype(),
                cu.shape()
            )));
        }
        let c = cu
            .to_i64_vec()
            .ok_or_else(|| OpError("cu_seqlens holds no integers".into()))?;
        if c.first() != Some(&0) || c.last() != Some(&(n as i64)) {
            return Err(OpError(format!(
                "cu_seqlens must start at 0 and end at total_tokens {n}, got {c:?}"
            )));
        }
        if c.windows(2).any(|w| w[1] < w[0]) {
            return Err(OpError(format!(
                "cu_seqlens must be non-decreasing, got {c:?}"
            )));
        }
        c.windows(2)
            .map(|w| (w[0] as usize, w[1] as usize))
            .collect()
    } else {
        let batch = if rank == 4 {
            qs[0]
        } else {
            match init {
                Some(s) if s.shape().len() == 4 => s.shape()[0],
                Some(s) => {
                    return Err(OpError(format!(
                        "initial_state {:?} must be rank 4",
                        s.shape()
                    )))
                }
                None => {
                    return Err(OpError(
                        "cu_seqlens is absent, so initial_state is required to determine the \
                         batch size"
                            .into(),
                    ))
                }
            }
        };
        if batch == 0 || !n.is_multiple_of(batch) {
            return Err(OpError(format!(
                "total_tokens ({n}) must be divisible by batch ({batch})"
            )));
        }
        let per = n / batch;
        (0..batch).map(|i| (i * per, (i + 1) * per)).collect()
    };
    let batch = ranges.len();
    let state_shape = [batch, hv, dv, dk];
    let mut state = match init {
        Some(s) if s.shape() == state_shape => float_values(s, "initial_state")?,
        Some(s) => {
            return Err(OpError(format!(
                "initial_state {:?} must be [batch, num_heads_v, head_size_v, head_size_qk] \
                 {state_shape:?} (V-major)",
                s.shape()
            )))
        }
        None => vec![0f32; batch * hv * dv * dk],
    };
    let per_key = match decay {
        Some(d) if d.shape().len() == td + 2 && d.shape()[td..] == [hv, dk] => true,
        Some(d) if d.shape().len() == td + 1 && d.shape()[td] == hv => false,
        Some(d) => {
            return Err(OpError(format!(
                "decay {:?} must be [...tokens, num_heads_v] or [...tokens, num_heads_v, \
                 head_size_qk]",
                d.shape()
            )))
        }
        None => false,
    };
    if let Some(bt) = beta {
        if bt.shape().len() != td + 1 || bt.shape()[td] != hv {
            return Err(OpError(format!(
                "beta {:?} must be [...tokens, num_heads_v]",
                bt.shape()
            )));
        }
    }
    let gw = if per_key { hv * dk } else { hv };
    let mut g: Option<Vec<f32>> = decay.map(|d| float_values(d, "decay")).transpose()?;
    if let Some(g) = g.as_mut() {
        if g.len() != n * gw {
            return Err(OpError("decay's token count must be query's".into()));
        }
    }
    match (at.gate, a_log, dt_bias) {
        (GateAct::None, None, None) => {}
        (GateAct::None, _, _) => {
            return Err(OpError(
                "a_log and dt_bias require gate_activation=softplus or sigmoid".into(),
            ))
        }
        (_, Some(al), Some(db)) => {
            let al = float_values(al, "a_log")?;
            let db = float_values(db, "dt_bias")?;
            if al.len() != hv || !(db.len() == hv || (per_key && db.len() == hv * dk)) {
                return Err(OpError(format!(
                    "a_log ({}) must be [num_heads_v] {hv} and dt_bias ({}) [num_heads_v] or, \
                     for per-key-dim decay, [num_heads_v·head_size_qk]",
                    al.len(),
                    db.len()
                )));
            }
            let Some(g) = g.as_mut() else {
                return Err(OpError("gate_activation needs the decay input".into()));
            };
            for (i, x) in g.iter_mut().enumerate() {
                let c = i % gw;
                let h = if per_key { c / dk } else { c };
                let bias = if db.len() == gw { db[c] } else { db[h] };
                let z = *x + bias;
                *x = match at.gate {
                    GateAct::Softplus => -al[h].exp() * gdn_softplus(z),
                    _ => at.lower_bound * gdn_sigmoid(al[h].exp() * z),
                };
            }
        }
        _ => {
            return Err(OpError(
                "gate_activation=softplus/sigmoid requires a_log and dt_bias".into(),
            ))
        }
    }
    let g: Option<Vec<f32>> = g.map(|g| g.iter().map(|x| x.exp()).collect());
    let bet: Option<Vec<f32>> = beta.map(|x| float_values(x, "beta")).transpose()?.map(|b| {
        if at.beta_sigmoid {
            b.iter().map(|&x| gdn_sigmoid(x)).collect()
        } else {
            b
        }
    });
    if bet.as_ref().is_some_and(|b| b.len() != n * hv) {
        return Err(OpError("beta's token count must be query's".into()));
    }
    let (mut qv, mut kv, vv) = (
        float_values(q, "query")?,
        float_values(k, "key")?,
        float_values(v, "value")?,
    );
    if at.l2 {
        qv.chunks_mut(dk).for_each(l2_normalize);
        kv.chunks_mut(dk).for_each(l2_normalize);
    }
    let scale = if at.scale == 0.0 {
        1.0 / (dk as f32).sqrt()
    } else {
        at.scale
    };
    let mut out = vec![0f32; n * hv * dv];
    let ratio = hv / hq;
    let head = dv * dk;
    let mut r = vec![0f32; dv];
    for (bi, &(t0, t1)) in ranges.iter().enumerate() {
        for h in 0..hv {
            let s = &mut state[(bi * hv + h) * head..][..head];
            let hh = h / ratio;
            for t in t0..t1 {
                let qt = &qv[(t * hq + hh) * dk..][..dk];
                let kt = &kv[(t * hq + hh) * dk..][..dk];
                let vt = &vv[(t * hv + h) * dv..][..dv];
                if let Some(g) = g.as_ref() {
                    if per_key {
                        let gr = &g[(t * hv + h) * dk..][..dk];
                        for row in s.chunks_mut(dk) {
                            row.iter_mut().zip(gr).for_each(|(x, &e)| *x *= e);
                        }
                    } else {
                        let e = g[t * hv + h];
                        s.iter_mut().for_each(|x| *x *= e);
                    }
                }
                let delta: &[f32] = if let Some(b) = bet.as_ref() {
                    let bt = b[t * hv + h];
                    for (j, row) in s.chunks(dk).enumerate() {
                        let mut acc = 0f32;
                        for (&x, &kk) in row.iter().zip(kt) {
                            acc += x * kk;
                        }
                        r[j] = bt * (vt[j] - acc);
                    }
                    &r
                } else {
                    vt
                };
                for (row, &dj) in s.chunks_mut(dk).zip(delta) {
                    row.iter_mut().zip(kt).for_each(|(x, &kk)| *x += kk * dj);
                }
                let o = &mut out[(t * hv + h) * dv..][..dv];
                for (oj, row) in o.iter_mut().zip(s.chunks(dk)) {
                    let mut acc = 0f32;
                    for (&x, &qq) in row.iter().zip(qt) {
                        acc += x * qq;
                    }
                    *oj = scale * acc;
                }
            }
        }
    }
    // ORT 1.32's float16 and bfloat16 kernels compute in f32 from the widened inputs and
    // round the output once; the state stays float32 (measured, bit for bit).
    if q.dtype() == DType::F32 {
        ctx.rounder()(&mut out);
        ctx.outputs_rounded();
    }
    let mut out_shape = qs[..td].to_vec();
    out_shape.extend([hv, dv]);
    Ok(vec![
        in_dtype(Tensor::from_f32(out_shape, out), q.dtype()),
        Tensor::from_f32(state_shape.to_vec(), state),
    ])
}

fn gdn_facts(ictx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let at: &GdnAttrs = super::super::attrs::of(ictx.node, ictx.opset)?;
    if at.capacity > 0 {
        return Err(OpError(NO_CAPTURE.into()));
    }
    let (q, v) = (fact(ins, 0)?, opt_fact(ins, 2));
    let out_shape = match (&q.shape, v.and_then(|v| v.shape.as_ref())) {
        (Some(qs), Some(vs)) if qs.len() == vs.len() && qs.len() >= 3 => {
            let mut s = qs[..qs.len() - 2].to_vec();
            s.extend(vs[vs.len() - 2..].iter().cloned());
            Some(s)
        }
        _ => None,
    };
    let state = opt_fact(ins, 6).map_or_else(
        || Fact::new(Some(DType::F32), None),
        |s| Fact::new(Some(DType::F32), s.shape.clone()),
    );
    Ok(vec![Fact::new(q.dtype, out_shape), state])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Node;

    fn node(op: &str, attrs: Vec<(&str, crate::graph::Attribute)>) -> Node {
        let mut n = crate::graph::testing::node("n", op, &[], &["y", "s"]);
        n.domain = MS_DOMAIN.into();
        for (k, v) in attrs {
            n.attrs.insert(k.into(), v);
        }
        n
    }

    fn run(n: &Node, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        super::super::super::attrs::parse_node(n, 1).map_err(|e| OpError(e.to_string()))?;
        let k = Registry::global().get(MS_DOMAIN, &n.op_type).unwrap();
        k(&OpCtx::new(n, 1), inputs)
    }

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec())
    }

    /// One head, d_k = 2, d_v = 1, two tokens of the gated delta rule by hand: S₀ = [1, 2]ᵀ,
    /// token 1: g = ln ½, β = ½, k = [1, 0], v = 3, q = [1, 1]: S·½ = [½, 1], r = ½,
    /// δ = ½(3 − ½) = 1.25, S = [1.75, 1], o = 2.75 (scale 1).
    #[test]
    fn a_gated_delta_step_by_hand() {
        use crate::graph::Attribute::{Float, Int};
        let n = node(
            "LinearAttention",
            vec![
                ("q_num_heads", Int(1)),
                ("kv_num_heads", Int(1)),
                ("scale", Float(1.0)),
            ],
        );
        let q = t(&[1, 1, 2], &[1.0, 1.0]);
        let k = t(&[1, 1, 2], &[1.0, 0.0]);
        let v = t(&[1, 1, 1], &[3.0]);
        let s0 = t(&[1, 1, 2, 1], &[1.0, 2.0]);
        let g = t(&[1, 1, 1], &[0.5f32.ln()]);
        let b = t(&[1, 1, 1], &[0.5]);
        let out = run(
            &n,
            &[Some(&q), Some(&k), Some(&v), Some(&s0), Some(&g), Some(&b)],
        )
        .unwrap();
        let o = out[0].as_f32().unwrap()[0];
        assert!((o - 2.75).abs() < 1e-6, "{o}");
        let s = out[1].as_f32().unwrap();
        assert!(
            (s[0] - 1.75).abs() < 1e-6 && (s[1] - 1.0).abs() < 1e-6,
            "{s:?}"
        );
        // GatedDeltaNet: the same step with the V-major state [1, 1, 1, 2].
        let n = node("GatedDeltaNet", vec![("scale", Float(1.0))]);
        let (q, k) = (t(&[1, 1, 2], &[1.0, 1.0]), t(&[1, 1, 2], &[1.0, 0.0]));
        let v = t(&[1, 1, 1], &[3.0]);
        let s0 = t(&[1, 1, 1, 2], &[1.0, 2.0]);
        let (g, b) = (t(&[1, 1], &[0.5f32.ln()]), t(&[1, 1], &[0.5]));
        let ins = [
            Some(&q),
            Some(&k),
            Some(&v),
            None,
            Some(&g),
            Some(&b),
            Some(&s0),
        ];
        let out = run(&n, &ins).unwrap();
        assert!((out[0].as_f32().unwrap()[0] - 2.75).abs() < 1e-6);
        assert_eq!(out[1].shape(), &[1, 1, 1, 2]);
    }

    #[test]
    fn shapes_and_unsupported_features_are_refused() {
        use crate::graph::Attribute::Int;
        let la = node(
            "LinearAttention",
            vec![("q_num_heads", Int(2)), ("kv_num_heads", Int(1))],
        );
        let z = |s: &[usize]| Tensor::from_f32(s.to_vec(), vec![0.5; s.iter().product()]);
        let e = run(
            &la,
            &[
                Some(&z(&[1, 2, 8])),
                Some(&z(&[1, 2, 4])),
                Some(&z(&[1, 3, 4])),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("batch and length"), "{e}");
        let e = run(
            &la,
            &[
                Some(&z(&[1, 2, 8])),
                Some(&z(&[1, 2, 4])),
                Some(&z(&[1, 2, 4])),
            ],
        )
        .unwrap_err();
        assert!(e.0.contains("decay is required"), "{e}");
        let w = node(
            "LinearAttention",
            vec![
                ("q_num_heads", Int(1)),
                ("kv_num_heads", Int(1)),
                ("state_window", Int(2)),
            ],
        );
        let e = run(&w, &[]).unwrap_err();
        assert!(e.0.contains("state_window"), "{e}");
        let g = node("GatedDeltaNet", vec![("state_update_capacity", Int(2))]);
        let x = z(&[2, 1, 4]);
        let e = run(&g, &[Some(&x), Some(&x), Some(&x)]).unwrap_err();
        assert!(e.0.contains("capture"), "{e}");
        let g = node("GatedDeltaNet", vec![]);
        let e = run(&g, &[Some(&x), Some(&x), Some(&x)]).unwrap_err();
        assert!(e.0.contains("decay input presence"), "{e}");
        let gate = node("LinearAttentionGate", vec![]);
        let e = run(&gate, &[Some(&z(&[2, 3])), Some(&z(&[2])), Some(&z(&[3]))]).unwrap_err();
        assert!(e.0.contains("must have 3 elements"), "{e}");
    }

    /// Values in [-1, 1) (deterministic), not all float16.
    fn vals(n: usize, seed: u32) -> Vec<f32> {
        let mut rng = crate::data::loader::Mt19937::new(seed);
        (0..n)
            .map(|_| (rng.random_sample() * 2.0 - 1.0) as f32)
            .collect()
    }

    fn f16_rounded(v: &[f32]) -> Vec<f32> {
        v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A float16 layer's GatedDeltaNet and LinearAttention (OpCtx::round_to F16): the output
    /// is the f32 one rounded once, the state the f32 one as computed (ORT 1.32's float16
    /// kernels, measured: docs/numerics.md, "Linear attention"); both kernels say they rounded.
    #[test]
    fn under_float16_the_output_is_rounded_once_and_the_state_kept() {
        use crate::graph::Attribute::{Int, String as Str};
        let (n, h, dk, dv) = (5usize, 2usize, 16usize, 8usize);
        let q = t(&[n, h, dk], &vals(n * h * dk, 1));
        let k = t(&[n, h, dk], &vals(n * h * dk, 2));
        let v = t(&[n, h, dv], &vals(n * h * dv, 3));
        let decay = t(&[n, h], &vals(n * h, 4));
        let beta = t(&[n, h], &vals(n * h, 5));
        let s0 = t(&[1, h, dv, dk], &vals(h * dv * dk, 6));
        let (al, db) = (t(&[h], &vals(h, 7)), t(&[h], &vals(h, 8)));
        let gdn = node(
            "GatedDeltaNet",
            vec![
                ("gate_activation", Str("qwen".into())),
                ("beta_activation", Str("sigmoid".into())),
                ("qk_l2_norm", Int(1)),
            ],
        );
        let gdn_ins = [
            Some(&q),
            Some(&k),
            Some(&v),
            None,
            Some(&decay),
            Some(&beta),
            Some(&s0),
            Some(&al),
            Some(&db),
        ];
        let la = node(
            "LinearAttention",
            vec![
                ("q_num_heads", Int(h as i64)),
                ("kv_num_heads", Int(h as i64)),
            ],
        );
        let (q3, k3) = (
            t(&[1, n, h * dk], q.as_f32().unwrap()),
            t(&[1, n, h * dk], k.as_f32().unwrap()),
        );
        let v3 = t(&[1, n, h * dv], v.as_f32().unwrap());
        let past = t(&[1, h, dk, dv], s0.as_f32().unwrap());
        let g3 = t(
            &[1, n, h],
            &vals(n * h, 9).iter().map(|x| -x.abs()).collect::<Vec<_>>(),
        );
        let b3 = t(
            &[1, n, h],
            &vals(n * h, 10).iter().map(|x| x.abs()).collect::<Vec<_>>(),
        );
        let la_ins = [
            Some(&q3),
            Some(&k3),
            Some(&v3),
            Some(&past),
            Some(&g3),
            Some(&b3),
        ];
        for (nd, ins) in [(&gdn, &gdn_ins[..]), (&la, &la_ins[..])] {
            // (Parses the node's attributes too.)
            let want = run(nd, ins).unwrap();
            let kernel = Registry::global().get(MS_DOMAIN, &nd.op_type).unwrap();
            let mut ctx = OpCtx::new(nd, 1);
            ctx.round_to = Some(crate::numeric::Rounding::F16);
            let got = kernel(&ctx, ins).unwrap();
            assert!(ctx.did_round(), "{}", nd.op_type);
            let (o, o32) = (got[0].as_f32().unwrap(), want[0].as_f32().unwrap());
            assert_eq!(bits(o), bits(&f16_rounded(o32)), "{} output", nd.op_type);
            let (s, s32) = (got[1].as_f32().unwrap(), want[1].as_f32().unwrap());
            assert_eq!(bits(s), bits(s32), "{} state", nd.op_type);
            assert_ne!(
                bits(s),
                bits(&f16_rounded(s)),
                "{}: a float16 state",
                nd.op_type
            );
            let def = crate::ops::def_of(nd).unwrap();
            assert!(!def.keeps_output_type(0) && def.keeps_output_type(1));
        }
    }

    /// Under a float16 plan the interpreter leaves GatedDeltaNet's state float32 and marks it
    /// so: a float16 layer reading it rounds it first (a mark saying "rounded" would skip that).
    /// The reader subtracts the rounded state, so it gives zeros only if it rounded its input.
    #[test]
    fn a_float16_plan_keeps_the_state_and_its_reader_rounds_it() {
        use crate::exec::{Feeds, Interpreter, PlanOptions, PreparedPlan, RunOptions};
        use crate::graph::testing::{graph, node as gnode, vi};
        use crate::precision::{plan::PrecisionPlan, Precision};
        let (n, h, dk, dv) = (6usize, 2usize, 16usize, 16usize);
        let sshape = vec![1, h, dv, dk];
        let mut g_node = gnode(
            "gdn",
            "GatedDeltaNet",
            &["q", "k", "v", "", "g", "b", "s0"],
            &["y", "s"],
        );
        g_node.domain = MS_DOMAIN.into();
        let feeds_v = [
            ("q", vec![n, h, dk], vals(n * h * dk, 11)),
            ("k", vec![n, h, dk], vals(n * h * dk, 12)),
            ("v", vec![n, h, dv], vals(n * h * dv, 13)),
            (
                "g",
                vec![n, h],
                vals(n * h, 14).iter().map(|x| -x.abs()).collect(),
            ),
            (
                "b",
                vec![n, h],
                vals(n * h, 15).iter().map(|x| x.abs()).collect(),
            ),
            ("s0", sshape.clone(), vals(h * dv * dk, 16)),
        ];
        // The reference: q, k, v rounded (data inputs), decay, beta and the state as given.
        let tensors: Vec<Tensor> = feeds_v
            .iter()
            .map(|(name, shape, v)| {
                let v = if ["q", "k", "v"].contains(name) {
                    f16_rounded(v)
                } else {
                    v.clone()
                };
                Tensor::from_f32(shape.clone(), v)
            })
            .collect();
        let ins = [
            Some(&tensors[0]),
            Some(&tensors[1]),
            Some(&tensors[2]),
            None,
            Some(&tensors[3]),
            Some(&tensors[4]),
            Some(&tensors[5]),
        ];
        let want = run(&g_node, &ins).unwrap();
        let (y32, s32) = (want[0].as_f32().unwrap(), want[1].as_f32().unwrap());
        let rounded_state = f16_rounded(s32);
        assert_ne!(bits(s32), bits(&rounded_state), "a float16 state");
        let g = {
            let sub = gnode("sub", "Sub", &["s", "r"], &["diff"]);
            let mut g = graph(
                vec![g_node.clone(), sub],
                feeds_v
                    .iter()
                    .map(|(name, shape, _)| vi(name, shape))
                    .chain([vi("r", &sshape)])
                    .collect(),
                vec![vi("y", &[n, h, dv]), vi("s", &sshape), vi("diff", &sshape)],
                vec![],
            );
            g.opsets.insert(MS_DOMAIN.into(), 1);
            g
        };
        let mut feeds = Feeds::new();
        for (name, shape, v) in &feeds_v {
            feeds.insert(name.to_string(), Tensor::from_f32(shape.clone(), v.clone()));
        }
        feeds.insert("r".into(), Tensor::from_f32(sshape.clone(), rounded_state));
        let plan = PrecisionPlan::from_layers(vec![Precision::Float16; 2]);
        let prepared = PreparedPlan::new(&g, &plan, &PlanOptions::default()).unwrap();
        let r = Interpreter::new(&g)
            .unwrap()
            .run_plan(&feeds, &RunOptions::default(), &prepared)
            .unwrap();
        let out = |name: &str| {
            let t = &r.outputs.iter().find(|(o, _)| o == name).unwrap().1;
            bits(t.as_f32().unwrap())
        };
        assert_eq!(out("y"), bits(&f16_rounded(y32)));
        assert_eq!(out("s"), bits(s32));
        assert_eq!(out("diff"), vec![0u32; s32.len()]);
    }

    #[test]
    fn the_gate_is_scale_times_softplus_and_a_sigmoid() {
        let gate = node("LinearAttentionGate", vec![]);
        let a = t(&[1, 2], &[0.0, 30.0]);
        let (dt, ds) = (t(&[2], &[0.0, 0.0]), t(&[2], &[-2.0, -1.0]));
        let b = t(&[1, 2], &[0.0, 100.0]);
        let out = run(&gate, &[Some(&a), Some(&dt), Some(&ds), Some(&b)]).unwrap();
        let d = out[0].as_f32().unwrap();
        assert!((d[0] + 2.0 * 2f32.ln()).abs() < 1e-6 && (d[1] + 30.0).abs() < 1e-5);
        assert_eq!(out[1].as_f32().unwrap(), &[0.5, 1.0]);
    }
}
