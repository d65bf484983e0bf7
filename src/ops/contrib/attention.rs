//! com.microsoft Attention, MultiHeadAttention and RotaryEmbedding as ONNX Runtime's CPU
//! kernels compute them (contrib_ops/cpu/bert/attention*.h, multihead_attention.cc,
//! rotary_embedding.cc).
//!
//! Both attentions reduce to one core: per batch and head, `scores = scale·Q·Kᵀ +
//! attention_bias + mask`, a softmax over the keys, `probs·V`, heads concatenated back to
//! `[B, S, N·H_v]`. The mask is additive, as ONNX Runtime builds it: a masked key position
//! adds `mask_filter_value` (−10000 by default, so a fully masked row still averages its keys),
//! a causal (`unidirectional`) position adds the lowest f32. Mask forms: 1-D `[B]` key lengths
//! (positions from the length on are masked), 1-D `[2B]` end then start positions, 2-D
//! `[B, T]` 0/1 key padding (`[B, 1]`/`[1, 1]` is ONNX Runtime's dummy: no mask), 3-D
//! `[B, S, T]`. MultiHeadAttention's `qk` output is the scores after bias and mask, before the
//! softmax (`[B, N, S, T]`, as ONNX Runtime 1.32's CPU kernel writes it). The 4-D Megatron
//! mask, packed QKV/KV inputs, beam-search cache indirection, shared past/present buffers and
//! Attention's `do_rotary` are refused with an error; ONNX Runtime 1.32's CPU kernel refuses
//! packed QKV and KV too ("not implemented for CPU").

use super::super::attention::{
    attend, rotary_caches, rotate, Heads, QkStage, RotaryAttrs, RotaryInput, ScoreRule,
};
use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::matmul::sgemm;
use super::super::shape::{fact, FactsResult};
use super::super::util::{checked_len, float_values, in_dtype, input, input_i64s, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::tensor::Tensor;

pub fn register(r: &mut Registry) {
    use InputRole::{Bias, Data, Param};
    r.add_in(MS_DOMAIN, "Attention", attention)
        .parse(|n, _| boxed(AttentionAttrs::parse(n, true)))
        .roles(&[Data, Data, Bias, Param, Data, Data, Param])
        .infer(attention_facts);
    r.add_in(MS_DOMAIN, "MultiHeadAttention", multi_head_attention)
        .parse(|n, _| boxed(AttentionAttrs::parse(n, false)))
        .roles(&[
            Data, Data, Data, Bias, Param, Data, Data, Data, Param, Param,
        ])
        .infer(mha_facts);
    r.add_in(MS_DOMAIN, "RotaryEmbedding", rotary_embedding)
        .parse(|n, _| boxed(RotaryAttrs::parse(n)))
        .roles(&[Data, Param, Data, Data])
        .infer(super::super::shape::same_as_input);
}

/// The attributes both attentions share (Attention's own are checked here too).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionAttrs {
    pub num_heads: usize,
    pub unidirectional: bool,
    /// 0: `1/√head_size`.
    pub scale: f32,
    pub mask_filter_value: f32,
    /// Attention's `qkv_hidden_sizes` (Q, K, V widths); None: the weights' width in thirds.
    pub qkv_hidden_sizes: Option<[usize; 3]>,
}

impl AttentionAttrs {
    fn parse(node: &Node, fused_qkv: bool) -> Result<AttentionAttrs, AttrError> {
        let a = Attrs::new(node);
        let num_heads = a.required_int("num_heads")?;
        if num_heads < 1 {
            return Err(AttrError::new(
                "num_heads",
                format!("must be >= 1, got {num_heads}"),
            ));
        }
        for unsupported in ["do_rotary", "past_present_share_buffer"] {
            if a.flag(unsupported, false)? {
                return Err(AttrError::new(
                    unsupported,
                    "is not supported (mixprec runs the plain attention only)",
                ));
            }
        }
        let qkv_hidden_sizes = match a.ints("qkv_hidden_sizes")? {
            Some(v) if fused_qkv => {
                if v.len() != 3 || v.iter().any(|&d| d < 1 || d % num_heads != 0) {
                    return Err(AttrError::new(
                        "qkv_hidden_sizes",
                        format!("must be 3 positive multiples of num_heads {num_heads}, got {v:?}"),
                    ));
                }
                Some([v[0] as usize, v[1] as usize, v[2] as usize])
            }
            _ => None,
        };
        Ok(AttentionAttrs {
            num_heads: num_heads as usize,
            unidirectional: a.flag("unidirectional", false)?,
            scale: a.float_or("scale", 0.0)?,
            mask_filter_value: a.float_or("mask_filter_value", -10000.0)?,
            qkv_hidden_sizes,
        })
    }
}

/// The additive mask `[B, S, T]` ONNX Runtime builds from `mask` and causality (None: neither).
fn additive_mask(
    mask: Option<&Tensor>,
    (b, s, past, t): (usize, usize, usize, usize),
    causal: bool,
    filter: f32,
) -> Result<Option<Vec<f32>>, OpError> {
    let causal = causal && s > 1;
    let dims = mask.map(|m| m.shape().to_vec());
    let dummy = matches!(dims.as_deref(), Some([bb, 1]) if (*bb == 1 || *bb == b) && t != 1);
    let mask = mask.filter(|_| !dummy);
    if mask.is_none() && !causal {
        return Ok(None);
    }
    let mut out = vec![0f32; checked_len(&[b, s, t])?];
    if let Some(m) = mask {
        let idx = input_i64s(&[Some(m)], 0)
            .map_err(|_| OpError(format!("the mask has dtype {}, expected int32", m.dtype())))?;
        let shape = m.shape();
        match shape {
            [n] if *n == b || *n == 2 * b => {
                for bi in 0..b {
                    let row = &mut out[bi * s * t..][..t];
                    let end = idx[bi].clamp(0, t as i64) as usize;
                    row[end..].iter_mut().for_each(|x| *x = filter);
                    if *n == 2 * b {
                        let start = idx[b + bi].clamp(0, t as i64) as usize;
                        row[..start].iter_mut().for_each(|x| *x = filter);
                    }
                }
            }
            [bb, tt] if *bb == b && *tt == t => {
                for bi in 0..b {
                    for j in 0..t {
                        if idx[bi * t + j] <= 0 {
                            out[bi * s * t + j] = filter;
                        }
                    }
                }
            }
            [bb, ss, tt] if *bb == b && *ss == s && *tt == t => {
                for (o, &m) in out.iter_mut().zip(&idx) {
                    if m <= 0 {
                        *o = filter;
                    }
                }
            }
            _ => {
                return Err(OpError(format!(
                    "mask {shape:?} is not one of [B], [2B], [B, T], [B, S, T] for B {b}, S {s}, T {t} (the 4-D Megatron mask is not supported)"
                )))
            }
        }
        // 1-D and 2-D masks are one row per batch: every query position shares it.
        if shape.len() < 3 {
            for bi in 0..b {
                let (first, rest) = out[bi * s * t..(bi + 1) * s * t].split_at_mut(t);
                rest.chunks_mut(t).for_each(|r| r.copy_from_slice(first));
            }
        }
    }
    if causal {
        for bi in 0..b {
            for i in 0..s {
                for j in (past + i + 1).min(t)..t {
                    out[(bi * s + i) * t + j] = f32::MIN;
                }
            }
        }
    }
    Ok(Some(out))
}

/// ONNX Runtime's attention on heads: `scale·Q·Kᵀ + attention_bias + mask`, softmax, ·V, the
/// additive mask built from the mask input and causality; returns `[B, S, N·H_v]`.
fn ort_attend(
    ctx: &OpCtx,
    attrs: &AttentionAttrs,
    (q, k, v): (&Heads, &Heads, &Heads),
    past_len: usize,
    mask: Option<&Tensor>,
    attention_bias: Option<&Tensor>,
    keep_scores: bool,
) -> Result<(Vec<f32>, Option<Vec<f32>>), OpError> {
    let mask = additive_mask(
        mask,
        (q.b, q.len, past_len, k.len),
        attrs.unidirectional,
        attrs.mask_filter_value,
    )?;
    let rule = ScoreRule {
        scale: attrs.scale,
        scale_operands: false,
        softcap: 0.0,
        mask: mask.as_deref(),
        bias: attention_bias,
        // MultiHeadAttention's qk output: the scores after bias and mask, before the softmax
        // (what ONNX Runtime 1.32's CPU kernel writes).
        keep: keep_scores.then_some(QkStage::Masked),
        masked_rows_zero: false,
    };
    let (heads, kept) = attend(ctx.accumulate, q, k, v, &rule)?;
    Ok((heads.merged(), kept))
}

/// Attention: `input [B, S, D_in]` × `weights [D_in, D_q + D_k + D_v]` + `bias` gives Q, K, V;
/// `past [2, B, N, P, H]` is prepended to K and V; outputs `[B, S, D_v]` and `present
/// [2, B, N, P + S, H]`.
fn attention(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<AttentionAttrs>()?;
    let (x, w) = (input(inputs, 0)?, input(inputs, 1)?);
    let (xs, ws) = (x.shape(), w.shape());
    if xs.len() != 3 || ws.len() != 2 || ws[0] != xs[2] {
        return Err(OpError(format!(
            "input {xs:?} must be [B, S, D] and weights {ws:?} [D, D_q + D_k + D_v]"
        )));
    }
    let (b, s, d_in) = (xs[0], xs[1], xs[2]);
    let [dq, dk, dv] = attrs.qkv_hidden_sizes.unwrap_or([ws[1] / 3; 3]);
    let n = attrs.num_heads;
    if dq + dk + dv != ws[1] || dq != dk || dq % n != 0 || dv % n != 0 {
        return Err(OpError(format!(
            "weights {ws:?} do not hold Q, K, V of widths {dq}, {dk}, {dv} for {n} heads"
        )));
    }
    let width = ws[1];
    // One product for Q, K and V together: [B·S, D_in] × [D_in, width].
    let xv = float_values(x, "input")?;
    let wv = float_values(w, "weights")?;
    let mut qkv = vec![0f32; checked_len(&[b, s, width])?];
    sgemm(
        ctx.accumulate,
        b * s,
        width,
        d_in,
        &xv,
        false,
        &wv,
        false,
        &mut qkv,
        false,
    );
    let bias = match opt_input(inputs, 2) {
        Some(t) if t.shape() == [width] => Some(float_values(t, "bias")?),
        Some(t) => return Err(OpError(format!("bias {:?} must be [{width}]", t.shape()))),
        None => None,
    };
    let dims = (b, s, width);
    let q = Heads::split(&qkv, dims, 0, (n, dq / n), bias.as_deref());
    let k = Heads::split(&qkv, dims, dq, (n, dk / n), bias.as_deref());
    let v = Heads::split(&qkv, dims, dq + dk, (n, dv / n), bias.as_deref());
    let (past_k, past_v) = match opt_input(inputs, 4) {
        Some(p) => {
            let ps = p.shape();
            if ps.len() != 5 || ps[0] != 2 {
                return Err(OpError(format!("past {ps:?} must be [2, B, N, P, H]")));
            }
            let pv = float_values(p, "past")?;
            let half = pv.len() / 2;
            let mk = |v: Vec<f32>| Heads {
                b: ps[1],
                n: ps[2],
                len: ps[3],
                h: ps[4],
                v,
            };
            (Some(mk(pv[..half].to_vec())), Some(mk(pv[half..].to_vec())))
        }
        None => (None, None),
    };
    let past_len = past_k.as_ref().map_or(0, |p| p.len);
    let k = k.after(past_k, "past")?;
    let v = v.after(past_v, "past")?;
    let (out, _) = ort_attend(
        ctx,
        attrs,
        (&q, &k, &v),
        past_len,
        opt_input(inputs, 3),
        opt_input(inputs, 5),
        false,
    )?;
    let mut outs = vec![in_dtype(Tensor::from_f32(vec![b, s, dv], out), x.dtype())];
    if ctx.node.outputs.get(1).is_some_and(|o| !o.is_empty()) {
        if k.h != v.h {
            return Err(OpError(
                "present needs K and V of the same head size".into(),
            ));
        }
        let mut present = k.v.clone();
        present.extend_from_slice(&v.v);
        outs.push(in_dtype(
            Tensor::from_f32(vec![2, b, n, k.len, k.h], present),
            x.dtype(),
        ));
    }
    Ok(outs)
}

/// MultiHeadAttention: query `[B, S, D]`, key/value `[B, L, D]` (with `bias` and
/// `past_key`/`past_value [B, N, P, H]` prepended) or already split `[B, N, L, H]`;
/// outputs `[B, S, D_v]`, `present_key`, `present_value`.
fn multi_head_attention(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<AttentionAttrs>()?;
    let n = attrs.num_heads;
    let query = input(inputs, 0)?;
    let (Some(key), Some(value)) = (opt_input(inputs, 1), opt_input(inputs, 2)) else {
        return Err(OpError(
            "packed QKV or KV inputs (no key or value) are not supported".into(),
        ));
    };
    if opt_input(inputs, 9).is_some() {
        return Err(OpError(
            "cache_indirection (beam search) is not supported".into(),
        ));
    }
    let want_qk = ctx.node.outputs.get(3).is_some_and(|o| !o.is_empty());
    let qs = query.shape();
    if qs.len() != 3 || qs[2] % n != 0 {
        return Err(OpError(format!(
            "query {qs:?} must be [B, S, D] with D a multiple of num_heads {n}"
        )));
    }
    let (b, s, d) = (qs[0], qs[1], qs[2]);
    let bias = opt_input(inputs, 3)
        .map(|t| float_values(t, "bias").map(|v| (t.shape().to_vec(), v)))
        .transpose()?;
    let qv = float_values(query, "query")?;
    let (q, k, v, past_len) = if key.rank() == 4 {
        if bias.is_some() || opt_input(inputs, 6).is_some() {
            return Err(OpError(
                "4-D key/value [B, N, L, H] take no bias and no past_key".into(),
            ));
        }
        if key.shape() != value.shape() {
            return Err(OpError(format!(
                "4-D key {:?} and value {:?} must have the same shape [B, N, L, H]",
                key.shape(),
                value.shape()
            )));
        }
        let q = Heads::split(&qv, (b, s, d), 0, (n, d / n), None);
        (
            q,
            Heads::from_bnsh(key, "key")?,
            Heads::from_bnsh(value, "value")?,
            0,
        )
    } else {
        let (ks, vs) = (key.shape(), value.shape());
        if ks.len() != 3
            || vs.len() != 3
            || ks[0] != b
            || vs[0] != b
            || ks[1] != vs[1]
            || ks[2] != d
            || vs[2] % n != 0
        {
            return Err(OpError(format!(
                "key {ks:?} and value {vs:?} must be [B, L, D] and [B, L, D_v] for query {qs:?}"
            )));
        }
        let (l, dv) = (ks[1], vs[2]);
        let (bq, bk, bv) = match &bias {
            Some((shape, v)) if shape.as_slice() == [2 * d + dv] => {
                (Some(&v[..d]), Some(&v[d..2 * d]), Some(&v[2 * d..]))
            }
            Some((shape, _)) => {
                return Err(OpError(format!(
                    "bias {shape:?} must be [{}] (Q, K and V biases)",
                    2 * d + dv
                )))
            }
            None => (None, None, None),
        };
        let q = Heads::split(&qv, (b, s, d), 0, (n, d / n), bq);
        let k = Heads::split(&float_values(key, "key")?, (b, l, d), 0, (n, d / n), bk);
        let v = Heads::split(
            &float_values(value, "value")?,
            (b, l, dv),
            0,
            (n, dv / n),
            bv,
        );
        let past = |i: usize, what: &str| {
            opt_input(inputs, i)
                .map(|t| Heads::from_bnsh(t, what))
                .transpose()
        };
        let (pk, pv) = (past(6, "past_key")?, past(7, "past_value")?);
        if pk.is_some() != pv.is_some() {
            return Err(OpError("past_key and past_value come together".into()));
        }
        let past_len = pk.as_ref().map_or(0, |p| p.len);
        (
            q,
            k.after(pk, "past_key")?,
            v.after(pv, "past_value")?,
            past_len,
        )
    };
    let (out, scores) = ort_attend(
        ctx,
        attrs,
        (&q, &k, &v),
        past_len,
        opt_input(inputs, 4),
        opt_input(inputs, 5),
        want_qk,
    )?;
    let dv = v.n * v.h;
    let dtype = query.dtype();
    let mut outs = vec![
        in_dtype(Tensor::from_f32(vec![b, s, dv], out), dtype),
        in_dtype(k.tensor(), dtype),
        in_dtype(v.tensor(), dtype),
    ];
    if let Some(qk) = scores {
        outs.push(in_dtype(Tensor::from_f32(vec![b, n, s, k.len], qk), dtype));
    }
    Ok(outs)
}

fn known(f: &Fact, i: usize) -> Option<usize> {
    f.shape.as_ref()?.get(i)?.as_known()
}

fn dim(ctx: &InferCtx, d: Option<usize>) -> DimFact {
    d.map_or_else(|| ctx.unknown_dim(), DimFact::known)
}

fn attention_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (x, w) = (fact(ins, 0)?, fact(ins, 1)?);
    let attrs = ctx.attrs::<AttentionAttrs>()?;
    let dv = attrs
        .qkv_hidden_sizes
        .map(|s| s[2])
        .or_else(|| known(w, 1).map(|c| c / 3));
    let batch = x.shape.as_ref().and_then(|s| s.first().cloned());
    let seq = x.shape.as_ref().and_then(|s| s.get(1).cloned());
    let out = vec![
        batch.clone().unwrap_or_else(|| ctx.unknown_dim()),
        seq.unwrap_or_else(|| ctx.unknown_dim()),
        dim(ctx, dv),
    ];
    let present = vec![
        DimFact::known(2),
        batch.unwrap_or_else(|| ctx.unknown_dim()),
        DimFact::known(attrs.num_heads),
        ctx.unknown_dim(),
        dim(ctx, dv.map(|d| d / attrs.num_heads)),
    ];
    Ok(vec![
        Fact::new(x.dtype, Some(out)),
        Fact::new(x.dtype, Some(present)),
    ])
}

fn mha_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let q = fact(ins, 0)?;
    let attrs = ctx.attrs::<AttentionAttrs>()?;
    let n = attrs.num_heads;
    let value = super::super::shape::opt_fact(ins, 2);
    let dv = value.and_then(|v| match v.rank() {
        Some(3) => known(v, 2),
        Some(4) => known(v, 3).map(|h| h * n),
        _ => None,
    });
    let dk = known(q, 2);
    let batch = || {
        q.shape
            .as_ref()
            .and_then(|s| s.first().cloned())
            .unwrap_or_else(|| ctx.unknown_dim())
    };
    let seq = q
        .shape
        .as_ref()
        .and_then(|s| s.get(1).cloned())
        .unwrap_or_else(|| ctx.unknown_dim());
    let present = |h: Option<usize>| {
        Fact::new(
            q.dtype,
            Some(vec![
                batch(),
                DimFact::known(n),
                ctx.unknown_dim(),
                dim(ctx, h.map(|d| d / n)),
            ]),
        )
    };
    let qk = Fact::new(
        q.dtype,
        Some(vec![
            batch(),
            DimFact::known(n),
            seq.clone(),
            ctx.unknown_dim(),
        ]),
    );
    Ok(vec![
        Fact::new(q.dtype, Some(vec![batch(), seq, dim(ctx, dv)])),
        present(dk),
        present(dv),
        qk,
    ])
}

/// com.microsoft RotaryEmbedding: input, position_ids (`[B, S]`, or `[1]`: an offset added to
/// each sequence position), cos_cache and sin_cache `[max_position, r/2]`. A 3-D input without
/// `num_heads` takes its head size from the rotary dimension (ONNX Runtime's rule).
fn rotary_embedding(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<RotaryAttrs>()?;
    let x = input(inputs, 0)?;
    let pos = input_i64s(inputs, 1)?;
    let (cos, sin, half) = rotary_caches(input(inputs, 2)?, input(inputs, 3)?, 2)?;
    let max_pos = cos.len() / half.max(1);
    let num_heads = match (attrs.num_heads, x.shape()) {
        (0, &[_, _, d]) => {
            let rd = if attrs.rotary_dim > 0 {
                attrs.rotary_dim
            } else {
                2 * half
            };
            Some(d / rd.max(1))
        }
        (0, _) => None,
        (n, _) => Some(n),
    };
    let r = RotaryInput {
        x,
        num_heads,
        rotary_dim: attrs.rotary_dim,
        interleaved: attrs.interleaved,
        cos: &cos,
        sin: &sin,
        half,
    };
    let y = rotate(&r, |bi, si, s| {
        let p = match pos.len() {
            1 => pos[0] + si as i64,
            n if n == x.shape()[0] * s => pos[bi * s + si],
            n => {
                return Err(OpError(format!(
                    "position_ids has {n} values, expected 1 or B·S"
                )))
            }
        };
        usize::try_from(p)
            .ok()
            .filter(|&p| p < max_pos)
            .ok_or_else(|| {
                OpError(format!(
                    "position {p} is outside the caches' {max_pos} rows"
                ))
            })
    })?;
    Ok(vec![y])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::Accumulator;

    /// One head, two keys: the softmax weights follow the scaled scores, a masked key gets
    /// exp(-10000) ≈ 0, a causal position gets none.
    #[test]
    fn attention_weights_follow_scores_and_masks() {
        let heads = |len: usize, v: Vec<f32>| Heads {
            b: 1,
            n: 1,
            len,
            h: 1,
            v,
        };
        let q = heads(2, vec![1.0, 2.0]);
        let k = heads(2, vec![1.0, -1.0]);
        let v = heads(2, vec![10.0, 20.0]);
        let run = |mask: Option<&[f32]>| {
            let rule = ScoreRule {
                scale: 1.0,
                scale_operands: false,
                softcap: 0.0,
                mask,
                bias: None,
                keep: None,
                masked_rows_zero: false,
            };
            attend(Accumulator::F32, &q, &k, &v, &rule).unwrap().0.v
        };
        let out = run(None);
        // Row 0: scores (1, -1) → weights e/(e + 1/e).
        let w0 = 1.0 / (1.0 + (-2f32).exp());
        assert!((out[0] - (10.0 * w0 + 20.0 * (1.0 - w0))).abs() < 1e-5);
        let len_mask = Tensor::from_parts(vec![1], crate::tensor::TensorData::I32(vec![1].into()));
        let m = additive_mask(Some(&len_mask), (1, 2, 0, 2), false, -10000.0)
            .unwrap()
            .unwrap();
        assert_eq!(m, vec![0.0, -10000.0, 0.0, -10000.0]);
        let out = run(Some(&m));
        assert_eq!(out, vec![10.0, 10.0]);
        let causal = additive_mask(None, (1, 2, 0, 2), true, -10000.0)
            .unwrap()
            .unwrap();
        assert_eq!(causal, vec![0.0, f32::MIN, 0.0, 0.0]);
        let raw = Tensor::from_parts(
            vec![1, 2],
            crate::tensor::TensorData::I32(vec![0, 1].into()),
        );
        let m = additive_mask(Some(&raw), (1, 2, 0, 2), false, -1.0)
            .unwrap()
            .unwrap();
        assert_eq!(m, vec![-1.0, 0.0, -1.0, 0.0]);
        let dummy = Tensor::from_parts(vec![1, 1], crate::tensor::TensorData::I32(vec![1].into()));
        assert!(additive_mask(Some(&dummy), (1, 2, 0, 2), false, -1.0)
            .unwrap()
            .is_none());
        let bad = Tensor::from_parts(
            vec![1, 3],
            crate::tensor::TensorData::I32(vec![1; 3].into()),
        );
        let e = additive_mask(Some(&bad), (1, 2, 0, 2), false, -1.0).unwrap_err();
        assert!(e.0.contains("mask [1, 3]"), "{e}");
    }

    #[test]
    fn rotary_rotates_pairs_by_position() {
        let mut n = crate::graph::testing::node("n", "RotaryEmbedding", &[], &["y"]);
        n.domain = MS_DOMAIN.into();
        // One head of 4 features, positions 0 and 1; angle 0 at 0, 90° at 1 for pair 0.
        let x = Tensor::from_f32(vec![1, 2, 4], vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
        let pos = Tensor::from_i64(vec![1], vec![0]);
        let cos = Tensor::from_f32(vec![2, 2], vec![1.0, 1.0, 0.0, 1.0]);
        let sin = Tensor::from_f32(vec![2, 2], vec![0.0, 0.0, 1.0, 0.0]);
        let k = Registry::global()
            .get(MS_DOMAIN, "RotaryEmbedding")
            .unwrap();
        let y = k(
            &OpCtx::new(&n, 1),
            &[Some(&x), Some(&pos), Some(&cos), Some(&sin)],
        )
        .unwrap()
        .remove(0);
        // Position 1, pair (x0, x2) = (1, 3) by 90°: (-3, 1); pair (x1, x3) unchanged.
        assert_eq!(
            y.as_f32().unwrap(),
            &[1.0, 2.0, 3.0, 4.0, -3.0, 2.0, 1.0, 4.0]
        );
        let far = Tensor::from_i64(vec![1], vec![5]);
        let e = k(
            &OpCtx::new(&n, 1),
            &[Some(&x), Some(&far), Some(&cos), Some(&sin)],
        )
        .unwrap_err();
        assert!(e.0.contains("position 5"), "{e}");
    }
}
