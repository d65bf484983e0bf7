//! com.microsoft GroupQueryAttention as ONNX Runtime 1.32's CPU kernel computes it
//! (contrib_ops/cpu/bert/group_query_attention.cc, gqa_attention_base.h,
//! group_query_attention_helper.h; the semantics below were checked case by case against the
//! 1.32 binary, tests/integration/contrib.rs).
//!
//! Inputs: `query [B, S, N·H]` with `key`/`value [B, S, N_kv·H]`, or packed QKV `[B, S,
//! (N + 2·N_kv)·H]` with key and value omitted; `past_key`/`past_value [B, N_kv, P, H]` (BNSH,
//! possibly a buffer sized to the maximum length); `seqlens_k [B]` (int32, each batch's total
//! length T_b − 1); `total_sequence_length` (int32 scalar, the batch's maximum total);
//! `cos_cache`/`sin_cache [rows, r/2]`; `position_ids [B, S]`; `attention_bias [B or 1, N or
//! 1, S, total]`; `head_sink [N]`.
//!
//! - The first prompt is `S == total_sequence_length`: every batch starts at position 0 (its
//!   rows from T_b on are right padding). Otherwise batch b's new rows sit at `P_b = T_b − S`
//!   after the first P_b rows of its past (ONNX Runtime then needs `B = 1` when `S > 1`).
//! - present is `[B, N_kv, max(total, P), H]`: the past's first P_b rows, the S new rows
//!   (padding included), zeros after.
//! - Query row s sees keys `[0, min(P_b + s + 1, T_b))` (all T_b keys when `causal = 0`); a
//!   local window W ≥ 0 keeps the last W positions before `P_b + s + 1`, so a padding row
//!   can see none: its output is 0.
//! - Scores are `scale·q·kᵀ` (scale `1/√H` unless given), `softcap·tanh(x/softcap)`, plus the
//!   bias column of each key's absolute position; the softmax runs over the visible keys only,
//!   with `exp(head_sink − m)` (or `exp(−m)` under `smooth_softmax`) added to its denominator.
//! - `do_rotary` rotates Q and K (not V) at position `P_b + s`, or at `position_ids[b, s]`
//!   (the first prompt: `position_ids[0, 0] + s` for every batch).
//!
//! ONNX Runtime's own restrictions on head sizes (multiples of 8, rotary widths multiples of 8)
//! are not repeated: those shapes compute what the formulas say. Refused with an error: the
//! quantized KV cache (`k_scale`, `v_scale`, `k_quant_type`), `q_norm_weight`/`k_norm_weight`
//! (ONNX Runtime's CPU provider refuses them too), `query_seqlens`, `sliding_window_cache` and
//! the `output_qk` output.

use super::super::attention::{rotary_caches, rotate, softcap, Heads, RotaryInput};
use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::matmul::sgemm;
use super::super::mlas_sgemm;
use super::super::shape::{fact, opt_fact, FactsResult};
use super::super::softmax::{mlas_softmax_row, mlas_sum_exp, smooth_softmax_row, softmax_row};
use super::super::util::{checked_len, float_values, in_dtype, input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::numeric::Accumulator;
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Param, Scale};
    r.add_in(MS_DOMAIN, "GroupQueryAttention", group_query_attention)
        .parse(|n, _| boxed(GqaAttrs::parse(n)))
        .roles(&[
            Data, Data, Data, Data, Data, Param, Param, Data, Data, Param, Data, Data, Scale,
            Scale, Param, Param, Param,
        ])
        .infer(gqa_facts);
}

/// GroupQueryAttention's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct GqaAttrs {
    pub num_heads: usize,
    pub kv_num_heads: usize,
    /// 0: `1/√head_size`.
    pub scale: f32,
    /// 0: none.
    pub softcap: f32,
    /// The number of past positions a query sees (`local_window_size` ≥ 0); None: all.
    pub local_window: Option<usize>,
    pub do_rotary: bool,
    pub rotary_interleaved: bool,
    pub smooth_softmax: bool,
    pub causal: bool,
}

impl GqaAttrs {
    fn parse(node: &Node) -> Result<GqaAttrs, AttrError> {
        let a = Attrs::new(node);
        let heads = |name: &str| -> Result<usize, AttrError> {
            let v = a.required_int(name)?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v >= 1)
                .ok_or_else(|| AttrError::new(name, format!("must be >= 1, got {v}")))
        };
        let softcap = a.float_or("softcap", 0.0)?;
        if softcap.is_nan() || softcap < 0.0 {
            return Err(AttrError::new(
                "softcap",
                format!("must be >= 0, got {softcap}"),
            ));
        }
        let lws = a.int_or("local_window_size", -1)?;
        let causal = a.int_or("causal", 1)? != 0;
        if !causal && lws != -1 {
            return Err(AttrError::new(
                "local_window_size",
                "needs causal = 1 (as in ONNX Runtime)",
            ));
        }
        for (name, off) in [("qk_output", 0), ("sliding_window_cache", 0)] {
            if a.int_or(name, off)? != off {
                return Err(AttrError::new(name, "is not supported"));
            }
        }
        for name in ["k_quant_type", "v_quant_type"] {
            if let Some(q) = a.string(name)?.filter(|q| *q != "NONE") {
                return Err(AttrError::new(
                    name,
                    format!("{q}: the quantized KV cache is not supported"),
                ));
            }
        }
        Ok(GqaAttrs {
            num_heads: heads("num_heads")?,
            kv_num_heads: heads("kv_num_heads")?,
            scale: a.float_or("scale", 0.0)?,
            softcap,
            local_window: usize::try_from(lws).ok(),
            do_rotary: a.flag("do_rotary", false)?,
            rotary_interleaved: a.flag("rotary_interleaved", false)?,
            smooth_softmax: a.int_or("smooth_softmax", -1)? == 1,
            causal,
        })
    }
}

/// The problem's sizes once the inputs are checked.
struct Dims {
    b: usize,
    s: usize,
    n: usize,
    nk: usize,
    h: usize,
    /// `total_sequence_length`.
    total: usize,
    /// The present buffers' length.
    present: usize,
    first_prompt: bool,
}

impl Dims {
    /// Batch `bi`'s total length T_b and the position of its first new row P_b.
    fn lengths(&self, seqlens: &[usize], bi: usize) -> (usize, usize) {
        let t = seqlens[bi] + 1;
        (t, if self.first_prompt { 0 } else { t - self.s })
    }
}

/// An int32 input's values, or an error naming it.
/// One head's scores Q·Kᵀ, [s, t] from Q [s, h] and K [t, h] (the cache's rows from the
/// first): with `exact`, MLAS's GEMM with `scale` applied inside it, as ONNX Runtime computes
/// them; otherwise the layer's GEMM, unscaled (the caller scales in the layer's arithmetic).
pub(super) fn head_scores(
    exact: bool,
    acc: Accumulator,
    (s, t, h): (usize, usize, usize),
    scale: f32,
    qh: &[f32],
    kh: &[f32],
) -> Vec<f32> {
    let mut probs = vec![0f32; s * t];
    if exact {
        mlas_sgemm::sgemm(true, s, t, h, scale, qh, h, kh, h, false, &mut probs, t);
    } else {
        sgemm(acc, s, t, h, qh, false, kh, true, &mut probs, false);
    }
    probs
}

/// One head's output P·V, [s, h] from the probabilities [s, t] and V [t, h]: MLAS's GEMM
/// with `exact` (ONNX Runtime's bits), else the layer's.
pub(super) fn head_values(
    exact: bool,
    acc: Accumulator,
    (s, t, h): (usize, usize, usize),
    probs: &[f32],
    vh: &[f32],
) -> Vec<f32> {
    let mut o = vec![0f32; s * h];
    if exact {
        mlas_sgemm::sgemm(false, s, h, t, 1.0, probs, t, vh, h, false, &mut o, h);
    } else {
        sgemm(acc, s, h, t, probs, false, vh, false, &mut o, false);
    }
    o
}

pub(super) fn int32_values(t: &Tensor, what: &str) -> Result<Vec<i64>, OpError> {
    if t.dtype() != DType::I32 {
        return Err(OpError(format!(
            "{what} has dtype {}, expected int32",
            t.dtype()
        )));
    }
    Ok(t.to_i64_vec().expect("int32 tensor"))
}

/// Q, K and V as heads `[B, N, S, H]` / `[B, N_kv, S, H]`, from separate or packed inputs
/// (inputs 0–2; `n` query and `nk` key/value heads). SparseAttention shares the layout.
pub(super) fn split_qkv(
    inputs: &[Option<&Tensor>],
    (n, nk): (usize, usize),
) -> Result<(Heads, Heads, Heads), OpError> {
    let query = input(inputs, 0)?;
    let qs = query.shape();
    let &[b, s, d] = qs else {
        return Err(OpError(format!("query {qs:?} must be [B, S, D]")));
    };
    if n % nk != 0 {
        return Err(OpError(format!(
            "num_heads {n} is not a multiple of kv_num_heads {nk}"
        )));
    }
    let qv = float_values(query, "query")?;
    match (opt_input(inputs, 1), opt_input(inputs, 2)) {
        (None, None) => {
            let heads = n + 2 * nk;
            if d % heads != 0 {
                return Err(OpError(format!(
                    "packed QKV {qs:?}: width {d} does not split into {n} + 2·{nk} heads"
                )));
            }
            let h = d / heads;
            let dims = (b, s, d);
            Ok((
                Heads::split(&qv, dims, 0, (n, h), None),
                Heads::split(&qv, dims, n * h, (nk, h), None),
                Heads::split(&qv, dims, (n + nk) * h, (nk, h), None),
            ))
        }
        (Some(key), Some(value)) => {
            if d % n != 0 {
                return Err(OpError(format!(
                    "query {qs:?}: hidden size {d} does not split into {n} heads"
                )));
            }
            let h = d / n;
            let want = [b, s, nk * h];
            if key.shape() != want || value.shape() != want {
                return Err(OpError(format!(
                    "key {:?} and value {:?} must be {want:?} ({nk} KV heads of {h}) for query {qs:?}",
                    key.shape(),
                    value.shape()
                )));
            }
            let kv = |t: &Tensor, what: &str| -> Result<Heads, OpError> {
                Ok(Heads::split(
                    &float_values(t, what)?,
                    (b, s, nk * h),
                    0,
                    (nk, h),
                    None,
                ))
            };
            Ok((
                Heads::split(&qv, (b, s, d), 0, (n, h), None),
                kv(key, "key")?,
                kv(value, "value")?,
            ))
        }
        _ => Err(OpError(
            "key and value come together (both omitted: packed QKV)".into(),
        )),
    }
}

/// Checks the cache and lengths against Q; returns the sizes and each batch's T_b − 1.
fn check_lengths(
    inputs: &[Option<&Tensor>],
    q: &Heads,
    nk: usize,
) -> Result<(Dims, Vec<usize>), OpError> {
    let (b, s, h) = (q.b, q.len, q.h);
    let past = match (opt_input(inputs, 3), opt_input(inputs, 4)) {
        (Some(pk), Some(pv)) => {
            let want = [b, nk, pk.shape().get(2).copied().unwrap_or(0), h];
            if pk.shape() != want || pv.shape() != want {
                return Err(OpError(format!(
                    "past_key {:?} and past_value {:?} must both be [B, N_kv, P, H] = [{b}, {nk}, P, {h}]",
                    pk.shape(),
                    pv.shape()
                )));
            }
            Some(want[2])
        }
        (None, None) => None,
        _ => return Err(OpError("past_key and past_value come together".into())),
    };
    let seqlens_t = input(inputs, 5)?;
    if seqlens_t.shape() != [b] {
        return Err(OpError(format!(
            "seqlens_k {:?} must be [B] = [{b}]",
            seqlens_t.shape()
        )));
    }
    let seqlens = int32_values(seqlens_t, "seqlens_k")?;
    let total = match int32_values(input(inputs, 6)?, "total_sequence_length")?.as_slice() {
        &[t] if t >= 1 => t as usize,
        v => {
            return Err(OpError(format!(
                "total_sequence_length must be one positive value, got {v:?}"
            )))
        }
    };
    let p = past.unwrap_or(0);
    if total != p + s && (past.is_none() || total > p) {
        return Err(OpError(format!(
            "total_sequence_length {total} must be past length {p} + sequence length {s} (or at most {p}, a shared cache buffer)"
        )));
    }
    let first_prompt = s == total;
    if !first_prompt && s > 1 && b > 1 {
        return Err(OpError(format!(
            "{s} new tokens after a past need batch size 1 (ONNX Runtime's rule), got {b}"
        )));
    }
    let seqlens = seqlens
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let lo = if first_prompt { 0 } else { s as i64 - 1 };
            if v < lo || v >= total as i64 {
                Err(OpError(format!(
                    "seqlens_k[{i}] = {v} is outside [{lo}, {total}) for sequence length {s}"
                )))
            } else {
                Ok(v as usize)
            }
        })
        .collect::<Result<Vec<usize>, OpError>>()?;
    let dims = Dims {
        b,
        s,
        n: q.n,
        nk,
        h,
        total,
        present: total.max(p),
        first_prompt,
    };
    Ok((dims, seqlens))
}

/// Rotates Q and K in place at each row's position.
fn apply_rotary(
    inputs: &[Option<&Tensor>],
    attrs: &GqaAttrs,
    d: &Dims,
    seqlens: &[usize],
    heads: [&mut Heads; 2],
) -> Result<(), OpError> {
    let (Some(cos), Some(sin)) = (opt_input(inputs, 7), opt_input(inputs, 8)) else {
        return Err(OpError("do_rotary needs cos_cache and sin_cache".into()));
    };
    let (cos, sin, half) = rotary_caches(cos, sin, 2)?;
    let rows = cos.len() / half.max(1);
    if rows < d.total {
        return Err(OpError(format!(
            "cos_cache has {rows} rows, fewer than total_sequence_length {}",
            d.total
        )));
    }
    let given = opt_input(inputs, 9)
        .map(|t| {
            let v = t.to_i64_vec().filter(|_| t.dtype().is_int());
            match v {
                Some(v) if v.len() == d.b * d.s => Ok(v),
                _ => Err(OpError(format!(
                    "position_ids {} {:?} must be [B, S] = [{}, {}] integers",
                    t.dtype(),
                    t.shape(),
                    d.b,
                    d.s
                ))),
            }
        })
        .transpose()?;
    let mut pos = Vec::with_capacity(d.b * d.s);
    for bi in 0..d.b {
        let (_, past) = d.lengths(seqlens, bi);
        for si in 0..d.s {
            let p = match &given {
                Some(g) if d.first_prompt => g[0].saturating_add(si as i64),
                Some(g) => g[bi * d.s + si],
                None => (past + si) as i64,
            };
            match usize::try_from(p).ok().filter(|&p| p < rows) {
                Some(p) => pos.push(p),
                None => {
                    return Err(OpError(format!(
                        "position {p} (batch {bi}, row {si}) is outside the caches' {rows} rows"
                    )))
                }
            }
        }
    }
    rotate_heads(
        heads,
        attrs.rotary_interleaved,
        (&cos, &sin, half),
        &|bi, si, s| Ok(pos[bi * s + si]),
    )
}

/// Rotates each of `heads` ([B, N, S, H] rows) in place with the rotary caches `cos`/`sin`
/// (`half` columns each): row `si` of batch `bi` (of `s` rows) at `position(bi, si, s)`.
pub(super) fn rotate_heads<const N: usize>(
    heads: [&mut Heads; N],
    interleaved: bool,
    (cos, sin, half): (&[f32], &[f32], usize),
    position: &dyn Fn(usize, usize, usize) -> Result<usize, OpError>,
) -> Result<(), OpError> {
    for x in heads {
        let t = Tensor::from_f32(vec![x.b, x.n, x.len, x.h], std::mem::take(&mut x.v));
        let r = RotaryInput {
            x: &t,
            num_heads: None,
            rotary_dim: 2 * half,
            interleaved,
            cos,
            sin,
            half,
        };
        let y = rotate(&r, position)?;
        x.v = y
            .to_f32_vec()
            .ok_or_else(|| OpError("rotary embedding gave a non-float32 tensor".into()))?;
    }
    Ok(())
}

/// The present cache `[B, N_kv, L, H]`: each batch's first P_b past rows, then the new rows,
/// zeros after.
fn present(
    past: Option<&Tensor>,
    new: &Heads,
    d: &Dims,
    seqlens: &[usize],
) -> Result<Heads, OpError> {
    let (l, h, s) = (d.present, d.h, d.s);
    let mut v = vec![0f32; checked_len(&[d.b, d.nk, l, h])?];
    // Checked to be [B, N_kv, P, H].
    let p_len = past.map_or(0, |t| t.shape()[2]);
    let past = past.map(|t| float_values(t, "past")).transpose()?;
    for bi in 0..d.b {
        let (_, from) = d.lengths(seqlens, bi);
        for ki in 0..d.nk {
            let bk = bi * d.nk + ki;
            let dst = &mut v[bk * l * h..(bk + 1) * l * h];
            if let Some(p) = &past {
                dst[..from * h].copy_from_slice(&p[bk * p_len * h..][..from * h]);
            }
            dst[from * h..(from + s) * h].copy_from_slice(&new.v[bk * s * h..(bk + 1) * s * h]);
        }
    }
    Ok(Heads {
        b: d.b,
        n: d.nk,
        len: l,
        h,
        v,
    })
}

/// `attention_bias [B or 1, N or 1, S, total]` and whether it varies along B and N.
fn attention_bias(t: Option<&Tensor>, d: &Dims) -> Result<Option<(Vec<f32>, bool, bool)>, OpError> {
    let Some(t) = t else { return Ok(None) };
    let sh = t.shape();
    let fits = sh.len() == 4
        && (sh[0] == 1 || sh[0] == d.b)
        && (sh[1] == 1 || sh[1] == d.n)
        && sh[2] == d.s
        && sh[3] == d.total;
    if !fits {
        return Err(OpError(format!(
            "attention_bias {sh:?} must be [B or 1, N or 1, S, total] = [{}, {}, {}, {}]",
            d.b, d.n, d.s, d.total
        )));
    }
    Ok(Some((
        float_values(t, "attention_bias")?,
        sh[0] != 1,
        sh[1] != 1,
    )))
}

fn group_query_attention(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<GqaAttrs>()?;
    for (i, what) in [
        (12, "k_scale (quantized KV cache)"),
        (13, "v_scale (quantized KV cache)"),
        (14, "q_norm_weight"),
        (15, "k_norm_weight"),
        (16, "query_seqlens"),
    ] {
        if opt_input(inputs, i).is_some() {
            return Err(OpError(format!("{what} is not supported")));
        }
    }
    if ctx.node.outputs.get(3).is_some_and(|o| !o.is_empty()) {
        return Err(OpError("the output_qk output is not supported".into()));
    }
    let dtype = input(inputs, 0)?.dtype();
    let (mut q, mut k, v) = split_qkv(inputs, (attrs.num_heads, attrs.kv_num_heads))?;
    let (d, seqlens) = check_lengths(inputs, &q, attrs.kv_num_heads)?;
    if attrs.do_rotary {
        apply_rotary(inputs, attrs, &d, &seqlens, [&mut q, &mut k])?;
    }
    let pk = present(opt_input(inputs, 3), &k, &d, &seqlens)?;
    let pv = present(opt_input(inputs, 4), &v, &d, &seqlens)?;
    let bias = attention_bias(opt_input(inputs, 10), &d)?;
    let sink = opt_input(inputs, 11)
        .map(|t| {
            if t.shape() != [d.n] {
                return Err(OpError(format!(
                    "head_sink {:?} must be [num_heads] = [{}]",
                    t.shape(),
                    d.n
                )));
            }
            float_values(t, "head_sink")
        })
        .transpose()?;
    checked_len(&[d.b, d.n, d.s, d.present])?;
    let scale = if attrs.scale == 0.0 {
        1.0 / (d.h as f32).sqrt()
    } else {
        attrs.scale
    };
    let (s, h, l, group) = (d.s, d.h, d.present, d.n / d.nk);
    let acc = ctx.accumulate;
    // ONNX Runtime's own arithmetic, bit for bit, for a float32 layer outside a precision plan:
    // its flash kernel where it takes it, else its materializing kernel with MLAS's GEMM and
    // softmax.
    let exact = dtype == DType::F32 && ctx.round_to.is_none() && acc == Accumulator::F32;
    let presents = (1..3).all(|i| ctx.node.outputs.get(i).is_some_and(|o| !o.is_empty()));
    let flash = exact
        && d.total > 1
        && attrs.softcap == 0.0
        && !attrs.smooth_softmax
        && sink.is_none()
        && presents
        && attrs.causal;
    let bias_row = |bi: usize, ni: usize, si: usize| -> Option<&[f32]> {
        bias.as_ref().map(|(bias, per_batch, per_head)| {
            let bb = if *per_batch { bi } else { 0 };
            let (nb, nn) = if *per_head { (d.n, ni) } else { (1, 0) };
            let r = ((bb * nb + nn) * s + si) * d.total;
            &bias[r..r + d.total]
        })
    };
    let per_head: Vec<Vec<f32>> = (0..d.b * d.n)
        .into_par_iter()
        .map(|bn| {
            let (bi, ni) = (bn / d.n, bn % d.n);
            let (t, past) = d.lengths(&seqlens, bi);
            let kv = (bi * d.nk + ni / group) * l * h;
            let (qh, kh, vh) = (&q.v[bn * s * h..(bn + 1) * s * h], &pk.v[kv..], &pv.v[kv..]);
            if flash {
                let head = FlashHead {
                    h,
                    t,
                    past,
                    scale,
                    window: attrs.local_window,
                    bias: &|si| bias_row(bi, ni, si),
                };
                return if s == 1 {
                    head.decode(qh, kh, vh)
                } else {
                    head.prefill(qh, kh, vh, s)
                };
            }
            let mut probs = head_scores(exact, acc, (s, t, h), scale, qh, kh);
            for (si, row) in probs.chunks_mut(t).enumerate() {
                let full = if attrs.causal { past + si + 1 } else { t };
                let end = full.min(t);
                let start = match attrs.local_window {
                    Some(w) if full > w => (full - w).min(end),
                    _ => 0,
                };
                let window = &mut row[start..end];
                if !exact {
                    window.iter_mut().for_each(|x| *x *= scale);
                }
                softcap(window, attrs.softcap);
                if let Some(b) = bias_row(bi, ni, si) {
                    window
                        .iter_mut()
                        .zip(&b[start..])
                        .for_each(|(x, b)| *x += b);
                }
                if !window.is_empty() {
                    match &sink {
                        Some(sink) => smooth_softmax_row(window, sink[ni]),
                        None if attrs.smooth_softmax => smooth_softmax_row(window, 0.0),
                        None if exact => mlas_softmax_row(window),
                        None => softmax_row(window),
                    }
                }
                row[..start].fill(0.0);
                row[end..].fill(0.0);
            }
            head_values(exact, acc, (s, t, h), &probs, vh)
        })
        .collect();
    let out = Heads {
        b: d.b,
        n: d.n,
        len: s,
        h,
        v: per_head.concat(),
    };
    Ok(vec![
        in_dtype(Tensor::from_f32(vec![d.b, s, d.n * h], out.merged()), dtype),
        in_dtype(pk.tensor(), dtype),
        in_dtype(pv.tensor(), dtype),
    ])
}

/// The L2 cache size ONNX Runtime sizes its flash-attention blocks by (`Env::GetL2CacheSize`:
/// `sysconf(_SC_LEVEL2_CACHE_SIZE)` on Linux; 512 KiB assumed elsewhere).
fn l2_cache_size() -> i64 {
    static L2: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *L2.get_or_init(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // SAFETY: sysconf only reads a system parameter.
            unsafe { libc::sysconf(libc::_SC_LEVEL2_CACHE_SIZE) as i64 }
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        {
            512 * 1024
        }
    })
}

/// One (batch, head) of ONNX Runtime 1.32's flash attention for a float32 KV cache
/// (`contrib_ops/cpu/bert/gqa_attention_base.h` `ApplyAttentionFlash`, MLAS's
/// `flashattn_gqa.cpp`), bit for bit on an AVX2 CPU. The path ORT takes for float32 when the
/// batch's total length is above 1 and there is no softcap, smooth softmax, head sink or QK
/// output.
struct FlashHead<'a> {
    h: usize,
    /// This batch's total length T and the position of its first new row.
    t: usize,
    past: usize,
    scale: f32,
    window: Option<usize>,
    /// The attention bias row of query row `si` (`total` columns).
    bias: &'a dyn Fn(usize) -> Option<&'a [f32]>,
}

impl FlashHead<'_> {
    /// The KV block length: `L2 / (4·4·2H)` (at least 1), at most T.
    fn kv_block(&self) -> usize {
        let per = (4 * 4 * 2 * self.h) as i64;
        (l2_cache_size() / per).max(1) as usize
    }

    /// One query token (`MlasGQADecodeGQAThreaded`): `scores[t] = (Σ q·k in 8 lanes of plain
    /// multiply-adds, lanes added ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)), the tail in order) ·
    /// scale`, the bias, the local window (`lowest` before `T − W`), MLAS's sum of
    /// exponentials, `out[h] = Σ_t e_t·v_t[h]` in order (plain multiply-adds), times `1/sum`.
    fn decode(&self, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let (h, t) = (self.h, self.t);
        let mut scores: Vec<f32> = (0..t)
            .map(|ti| {
                let row = &k[ti * h..(ti + 1) * h];
                let mut lanes = [0f32; 8];
                let full = h / 8 * 8;
                for base in (0..full).step_by(8) {
                    for (j, l) in lanes.iter_mut().enumerate() {
                        *l += q[base + j] * row[base + j];
                    }
                }
                let mut sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
                    + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
                for hi in full..h {
                    sum += q[hi] * row[hi];
                }
                sum * self.scale
            })
            .collect();
        if let Some(b) = (self.bias)(0) {
            scores.iter_mut().zip(b).for_each(|(x, b)| *x += b);
        }
        if let Some(w) = self.window {
            if t > w {
                scores[..t - w].fill(f32::MIN);
            }
        }
        let mut out = vec![0f32; h];
        let max = scores.iter().copied().fold(f32::MIN, f32::max);
        if max == f32::MIN {
            return out;
        }
        let sum = mlas_sum_exp(&mut scores, -max);
        for (ti, &e) in scores.iter().enumerate() {
            for (o, &x) in out.iter_mut().zip(&v[ti * h..(ti + 1) * h]) {
                *o += e * x;
            }
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        out.iter_mut().for_each(|o| *o *= inv);
        out
    }

    /// S > 1 query rows (`MlasFlashAttentionGQAThreaded`): blocks of `min(kv_block, 2H, S)`
    /// query rows and `min(kv_block, T)` keys; per block `scale·Q·Kᵀ` and `S_exp·V` through
    /// MLAS's SGEMM ([`mlas_sgemm`]), the bias, masked keys (causal, local window) set to
    /// `lowest`, a row's running max and sum updated online (`exp` of the max's change by
    /// libm's `expf`, the sum `e·l + rowsum`, the row's output scaled by `e`), the outputs
    /// times `1/l` at the end. Key blocks past the query block's last position are skipped.
    fn prefill(&self, q: &[f32], k: &[f32], v: &[f32], s: usize) -> Vec<f32> {
        let (h, t, past) = (self.h, self.t, self.past);
        let kv0 = self.kv_block();
        let qb = kv0.min(2 * h).min(s);
        let kvb = kv0.min(t);
        let mut out = vec![0f32; s * h];
        let mut scores = vec![0f32; qb * kvb];
        let mut acc = vec![0f32; qb * h];
        for q0 in (0..s).step_by(qb) {
            let rq = qb.min(s - q0);
            let mut m = vec![f32::MIN; rq];
            let mut l = vec![0f32; rq];
            acc[..rq * h].fill(0.0);
            let limit = past + q0 + rq;
            for ir in (0..t).step_by(kvb) {
                if ir >= limit {
                    break;
                }
                let rk = kvb.min(t - ir);
                let sc = &mut scores[..rq * rk];
                mlas_sgemm::sgemm(
                    true,
                    rq,
                    rk,
                    h,
                    self.scale,
                    &q[q0 * h..],
                    h,
                    &k[ir * h..],
                    h,
                    false,
                    sc,
                    rk,
                );
                for (r, row) in sc.chunks_mut(rk).enumerate() {
                    if let Some(b) = (self.bias)(q0 + r) {
                        row.iter_mut().zip(&b[ir..]).for_each(|(x, b)| *x += b);
                    }
                    let causal = past + q0 + r + 1;
                    let from = self.window.map_or(0, |w| causal.saturating_sub(w));
                    for (j, x) in row.iter_mut().enumerate() {
                        if ir + j >= causal || ir + j < from {
                            *x = f32::MIN;
                        }
                    }
                    let max = row.iter().copied().fold(f32::MIN, f32::max);
                    if max == f32::MIN {
                        row.fill(0.0);
                        continue;
                    }
                    let m_old = m[r];
                    m[r] = m[r].max(max);
                    let diff = m_old - m[r];
                    let sum = mlas_sum_exp(row, -m[r]);
                    if ir != 0 {
                        let e = diff.exp();
                        l[r] = e * l[r] + sum;
                        acc[r * h..(r + 1) * h].iter_mut().for_each(|o| *o *= e);
                    } else {
                        l[r] = sum;
                    }
                }
                mlas_sgemm::sgemm(
                    false,
                    rq,
                    h,
                    rk,
                    1.0,
                    sc,
                    rk,
                    &v[ir * h..],
                    h,
                    ir != 0,
                    &mut acc[..rq * h],
                    h,
                );
            }
            for r in 0..rq {
                let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
                for (o, &a) in out[(q0 + r) * h..(q0 + r + 1) * h]
                    .iter_mut()
                    .zip(&acc[r * h..(r + 1) * h])
                {
                    *o = a * inv;
                }
            }
        }
        out
    }
}

fn gqa_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let q = fact(ins, 0)?;
    let a = ctx.attrs::<GqaAttrs>()?;
    let (n, nk) = (a.num_heads, a.kv_num_heads);
    let heads = if opt_fact(ins, 1).is_none() {
        n + 2 * nk
    } else {
        n
    };
    let h = q
        .shape
        .as_ref()
        .and_then(|s| s.get(2)?.as_known())
        .filter(|d| d % heads == 0)
        .map(|d| d / heads);
    let dim = |i: usize| {
        q.shape
            .as_ref()
            .and_then(|s| s.get(i).cloned())
            .unwrap_or_else(|| ctx.unknown_dim())
    };
    let known = |v: Option<usize>| v.map_or_else(|| ctx.unknown_dim(), DimFact::known);
    let present = || {
        Fact::new(
            q.dtype,
            Some(vec![
                dim(0),
                DimFact::known(nk),
                ctx.unknown_dim(),
                known(h),
            ]),
        )
    };
    Ok(vec![
        Fact::new(q.dtype, Some(vec![dim(0), dim(1), known(h.map(|h| h * n))])),
        present(),
        present(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;
    use crate::tensor::TensorData;

    fn gqa_node(attrs: &[(&str, Attribute)]) -> Node {
        let mut n = node_with("GroupQueryAttention", attrs);
        n.domain = MS_DOMAIN.into();
        n.outputs = vec!["y".into(), "present_key".into(), "present_value".into()];
        n
    }

    fn heads(n: i64, nk: i64) -> Vec<(&'static str, Attribute)> {
        vec![
            ("num_heads", Attribute::Int(n)),
            ("kv_num_heads", Attribute::Int(nk)),
        ]
    }

    fn i32s(shape: Vec<usize>, v: Vec<i32>) -> Tensor {
        Tensor::from_parts(shape, TensorData::I32(v.into()))
    }

    fn run(node: &Node, inputs: &[Option<&Tensor>]) -> OpResult {
        let k = Registry::global()
            .get(MS_DOMAIN, "GroupQueryAttention")
            .unwrap();
        k(&OpCtx::new(node, 1), inputs)
    }

    /// One head of size 1 and a zero query: every visible key weighs the same, so each output
    /// row is the mean of the values its row sees.
    fn means(attrs: &[(&str, Attribute)], seqlen_k: i32, sink: Option<f32>) -> Vec<f32> {
        let mut a = heads(1, 1);
        a.extend_from_slice(attrs);
        let q = Tensor::from_f32(vec![1, 3, 1], vec![0.0; 3]);
        let k = Tensor::from_f32(vec![1, 3, 1], vec![5.0, -1.0, 7.0]);
        let v = Tensor::from_f32(vec![1, 3, 1], vec![1.0, 2.0, 6.0]);
        let (lens, total) = (i32s(vec![1], vec![seqlen_k]), i32s(vec![], vec![3]));
        let sink = sink.map(|s| Tensor::from_f32(vec![1], vec![s]));
        let mut ins = vec![
            Some(&q),
            Some(&k),
            Some(&v),
            None,
            None,
            Some(&lens),
            Some(&total),
        ];
        if let Some(s) = &sink {
            ins.extend([None, None, None, None, Some(s)]);
        }
        let out = run(&gqa_node(&a), &ins).unwrap();
        out[0].as_f32().unwrap().to_vec()
    }

    #[test]
    fn rows_see_the_causal_window_of_their_batch() {
        assert_eq!(means(&[], 2, None), vec![1.0, 1.5, 3.0]);
        // Not causal: every row sees the three keys.
        assert_eq!(
            means(&[("causal", Attribute::Int(0))], 2, None),
            vec![3.0; 3]
        );
        // A window of one position: each row sees its own key only.
        let w1 = [("local_window_size", Attribute::Int(1))];
        assert_eq!(means(&w1, 2, None), vec![1.0, 2.0, 6.0]);
        // Batch length 2: the padding row 2 sees keys 0 and 1, or none inside a window of 1.
        assert_eq!(means(&[], 1, None), vec![1.0, 1.5, 1.5]);
        assert_eq!(means(&w1, 1, None), vec![1.0, 2.0, 0.0]);
        // A sink of 0 with zero scores: one more share in each denominator.
        let s = means(&[], 2, Some(0.0));
        let want = [0.5, 1.5 * 2.0 / 3.0, 3.0 * 3.0 / 4.0];
        assert!(
            s.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
            "{s:?}"
        );
        assert_eq!(s, means(&[("smooth_softmax", Attribute::Int(1))], 2, None));
    }

    /// present holds each batch's first T_b − 1 past rows, then the new row, then zeros; a
    /// float16 query gives float16 outputs.
    #[test]
    fn present_follows_each_batch_length() {
        let n = gqa_node(&heads(2, 1));
        let q = Tensor::from_f32(vec![2, 1, 2], vec![0.0; 4]);
        let k = Tensor::from_f32(vec![2, 1, 1], vec![10.0, 20.0]);
        let pk = Tensor::from_f32(vec![2, 1, 3, 1], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let (lens, total) = (i32s(vec![2], vec![3, 1]), i32s(vec![], vec![4]));
        let out = run(
            &n,
            &[
                Some(&q),
                Some(&k),
                Some(&k),
                Some(&pk),
                Some(&pk),
                Some(&lens),
                Some(&total),
            ],
        )
        .unwrap();
        assert_eq!(out[1].shape(), &[2, 1, 4, 1]);
        assert_eq!(
            out[1].as_f32().unwrap(),
            &[1.0, 2.0, 3.0, 10.0, 4.0, 20.0, 0.0, 0.0]
        );
        // Batch 0 averages 1, 2, 3, 10; batch 1 averages 4, 20.
        assert_eq!(out[0].as_f32().unwrap(), &[4.0, 4.0, 12.0, 12.0]);
        let q16 = crate::ops::cast::cast_tensor(&q, DType::F16);
        let k16 = crate::ops::cast::cast_tensor(&k, DType::F16);
        let p16 = crate::ops::cast::cast_tensor(&pk, DType::F16);
        let out = run(
            &n,
            &[
                Some(&q16),
                Some(&k16),
                Some(&k16),
                Some(&p16),
                Some(&p16),
                Some(&lens),
                Some(&total),
            ],
        )
        .unwrap();
        assert!(out.iter().all(|t| t.dtype() == DType::F16));
    }

    /// Inputs that contradict each other or the attributes: one-line errors, no panic.
    #[test]
    fn bad_inputs_are_one_line_errors() {
        let f =
            |shape: &[usize]| Tensor::from_f32(shape.to_vec(), vec![0.5; shape.iter().product()]);
        let (q, kv) = (f(&[1, 1, 32]), f(&[1, 1, 16]));
        let past = f(&[1, 2, 4, 8]);
        let lens = i32s(vec![1], vec![4]);
        let total = i32s(vec![], vec![5]);
        let ok: Vec<Option<&Tensor>> = vec![
            Some(&q),
            Some(&kv),
            Some(&kv),
            Some(&past),
            Some(&past),
            Some(&lens),
            Some(&total),
        ];
        let n = gqa_node(&heads(4, 2));
        assert!(run(&n, &ok).is_ok());
        let with = |i: usize, t: Option<&Tensor>| {
            let mut v = ok.clone();
            if v.len() <= i {
                v.resize(i + 1, None);
            }
            v[i] = t;
            run(&n, &v).unwrap_err().0
        };
        let (q30, kv3) = (f(&[1, 1, 30]), f(&[1, 1, 24]));
        let (past3, past_short) = (f(&[1, 3, 4, 8]), f(&[1, 2, 3, 8]));
        let lens2d = i32s(vec![1, 1], vec![4]);
        let lens64 = Tensor::from_i64(vec![1], vec![4]);
        let (lens_big, total_big) = (i32s(vec![1], vec![5]), i32s(vec![], vec![9]));
        let total_2 = i32s(vec![2], vec![5, 5]);
        let cases = [
            (
                run(&gqa_node(&heads(3, 2)), &ok).unwrap_err().0,
                "num_heads 3 is not a multiple of kv_num_heads 2",
            ),
            (with(0, Some(&q30)), "does not split into 4 heads"),
            (with(1, Some(&kv3)), "must be [1, 1, 16]"),
            (with(2, None), "key and value come together"),
            (with(3, Some(&past3)), "past_key [1, 3, 4, 8]"),
            (with(4, Some(&past_short)), "past_value [1, 2, 3, 8]"),
            (with(4, None), "past_key and past_value come together"),
            (with(5, Some(&lens2d)), "seqlens_k [1, 1] must be [B] = [1]"),
            (
                with(5, Some(&lens64)),
                "seqlens_k has dtype int64, expected int32",
            ),
            (
                with(5, Some(&lens_big)),
                "seqlens_k[0] = 5 is outside [0, 5)",
            ),
            (with(6, Some(&total_big)), "total_sequence_length 9 must be"),
            (with(6, Some(&total_2)), "must be one positive value"),
            (with(10, Some(&past)), "attention_bias [1, 2, 4, 8] must be"),
            (
                with(11, Some(&kv)),
                "head_sink [1, 1, 16] must be [num_heads] = [4]",
            ),
            (with(16, Some(&lens)), "query_seqlens is not supported"),
            (
                with(12, Some(&q)),
                "k_scale (quantized KV cache) is not supported",
            ),
        ];
        for (e, want) in cases {
            assert!(e.contains(want) && !e.contains('\n'), "{e} (want {want})");
        }
        // Rotary: caches required, long enough, positions inside them.
        let mut a = heads(4, 2);
        a.push(("do_rotary", Attribute::Int(1)));
        let rn = gqa_node(&a);
        let e = run(&rn, &ok).unwrap_err().0;
        assert!(e.contains("do_rotary needs cos_cache and sin_cache"), "{e}");
        let (cos4, cos8) = (f(&[4, 4]), f(&[8, 4]));
        let mut r = ok.clone();
        r.extend([Some(&cos4), Some(&cos4)]);
        let e = run(&rn, &r).unwrap_err().0;
        assert!(
            e.contains("4 rows, fewer than total_sequence_length 5"),
            "{e}"
        );
        let pos = Tensor::from_i64(vec![1, 1], vec![8]);
        let mut r = ok.clone();
        r.extend([Some(&cos8), Some(&cos8), Some(&pos)]);
        let e = run(&rn, &r).unwrap_err().0;
        assert!(e.contains("position 8 (batch 0, row 0) is outside"), "{e}");
        // Several new tokens after a past need batch size 1, as in ONNX Runtime.
        let (q2, kv2) = (f(&[2, 2, 32]), f(&[2, 2, 16]));
        let past2 = f(&[2, 2, 4, 8]);
        let (lens2, total6) = (i32s(vec![2], vec![5, 5]), i32s(vec![], vec![6]));
        let e = run(
            &n,
            &[
                Some(&q2),
                Some(&kv2),
                Some(&kv2),
                Some(&past2),
                Some(&past2),
                Some(&lens2),
                Some(&total6),
            ],
        )
        .unwrap_err()
        .0;
        assert!(e.contains("need batch size 1"), "{e}");
    }

    #[test]
    fn unsupported_attributes_are_refused_at_load() {
        let parse = |extra: &[(&str, Attribute)]| {
            let mut a = heads(4, 2);
            a.extend_from_slice(extra);
            GqaAttrs::parse(&gqa_node(&a))
        };
        let d = parse(&[]).unwrap();
        assert_eq!((d.local_window, d.causal, d.softcap), (None, true, 0.0));
        for (attrs, what) in [
            (vec![("softcap", Attribute::Float(-1.0))], "softcap"),
            (
                vec![
                    ("causal", Attribute::Int(0)),
                    ("local_window_size", Attribute::Int(2)),
                ],
                "local_window_size",
            ),
            (vec![("qk_output", Attribute::Int(1))], "qk_output"),
            (
                vec![("sliding_window_cache", Attribute::Int(1))],
                "sliding_window_cache",
            ),
            (
                vec![("k_quant_type", Attribute::String("PER_TENSOR".into()))],
                "k_quant_type",
            ),
            (vec![("kv_num_heads", Attribute::Int(0))], "kv_num_heads"),
        ] {
            let e = parse(&attrs).unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
    }
}
