//! Scaled dot-product attention and rotary position embeddings: ONNX's Attention and
//! RotaryEmbedding (opset 23), and the core com.microsoft Attention, MultiHeadAttention and
//! RotaryEmbedding share (`ops/contrib/attention.rs`).
//!
//! ONNX Attention follows the onnx reference implementation (onnx/reference/ops/
//! op_attention.py): Q and K are each scaled by `√scale` (scale `1/√head_size` unless given)
//! before their product, `softcap·tanh(scores/softcap)` when `softcap` > 0, then the mask: a
//! boolean `attn_mask` masks `false` with −inf, a float one is added, either broadcast to
//! `[B, q_heads, S, T]` and padded to T keys with −inf/`false`; `is_causal` adds −inf above the
//! diagonal shifted by the past length; `nonpad_kv_seqlen` (opset 24) masks keys from each
//! batch's length on. Key/value heads are repeated for grouped-query attention. A row with
//! every key masked gives 0, as ONNX Runtime's kernel does (the reference's softmax gives NaN). `qk_matmul_output_mode` 0/1 returns the
//! (softcapped) product, 2 the masked scores, 3 the probabilities.

use super::attrs::{boxed, AttrError, Attrs};
use super::matmul::sgemm;
use super::shape::{fact, opt_fact, FactsResult};
use super::softmax::softmax_row;
use super::util::{
    broadcast_to, checked_len, float_values, in_dtype, input, input_i64s, opt_input,
};
use super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::numeric::Accumulator;
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;
use std::borrow::Cow;

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Param};
    r.add("Attention", onnx_attention)
        .parse(|n, _| boxed(OnnxAttentionAttrs::parse(n)))
        .roles(&[Data, Data, Data, Data, Data, Data, Param])
        .infer(onnx_attention_facts);
    r.add("RotaryEmbedding", onnx_rotary)
        .parse(|n, _| boxed(RotaryAttrs::parse(n)))
        .roles(&[Data, Data, Data, Param])
        .infer(super::shape::same_as_input);
}

/// Q, K or V split into heads: `[B, N, len, H]`, row-major.
pub(crate) struct Heads {
    pub b: usize,
    pub n: usize,
    pub len: usize,
    pub h: usize,
    pub v: Vec<f32>,
}

impl Heads {
    /// Columns `offset..offset + n·h` of a `[B, len, width]` buffer, plus `bias[offset..]`,
    /// as heads.
    pub(crate) fn split(
        x: &[f32],
        (b, len, width): (usize, usize, usize),
        offset: usize,
        (n, h): (usize, usize),
        bias: Option<&[f32]>,
    ) -> Heads {
        let mut v = vec![0f32; b * n * len * h];
        v.par_chunks_mut(len * h).enumerate().for_each(|(bn, dst)| {
            let (bi, ni) = (bn / n, bn % n);
            for s in 0..len {
                let src = &x[(bi * len + s) * width + offset + ni * h..][..h];
                let d = &mut dst[s * h..(s + 1) * h];
                d.copy_from_slice(src);
                if let Some(bias) = bias {
                    let bias = &bias[offset + ni * h..][..h];
                    d.iter_mut().zip(bias).for_each(|(d, b)| *d += b);
                }
            }
        });
        Heads { b, n, len, h, v }
    }

    /// Heads given as a `[B, N, len, H]` tensor.
    pub(crate) fn from_bnsh(t: &Tensor, what: &str) -> Result<Heads, OpError> {
        let s = t.shape();
        if s.len() != 4 {
            return Err(OpError(format!("{what} {s:?} must be 4-D [B, N, len, H]")));
        }
        Ok(Heads {
            b: s[0],
            n: s[1],
            len: s[2],
            h: s[3],
            v: float_values(t, what)?,
        })
    }

    /// `past` then `self` along the sequence axis (the present state).
    pub(crate) fn after(self, past: Option<Heads>, what: &str) -> Result<Heads, OpError> {
        let Some(p) = past else {
            return Ok(self);
        };
        if (p.b, p.n, p.h) != (self.b, self.n, self.h) {
            return Err(OpError(format!(
                "{what} [{}, {}, {}, {}] does not fit the new keys/values [{}, {}, {}, {}]",
                p.b, p.n, p.len, p.h, self.b, self.n, self.len, self.h
            )));
        }
        let len = p.len + self.len;
        let mut v = Vec::with_capacity(self.b * self.n * len * self.h);
        for bn in 0..self.b * self.n {
            v.extend_from_slice(&p.v[bn * p.len * p.h..(bn + 1) * p.len * p.h]);
            v.extend_from_slice(&self.v[bn * self.len * self.h..(bn + 1) * self.len * self.h]);
        }
        Ok(Heads { len, v, ..self })
    }

    pub(crate) fn tensor(&self) -> Tensor {
        Tensor::from_f32(vec![self.b, self.n, self.len, self.h], self.v.clone())
    }

    /// Each head repeated `reps` times in place (`[h0, h0, h1, h1, ...]`): grouped-query
    /// attention's key/value heads shared by `reps` query heads.
    pub(crate) fn repeated(self, reps: usize) -> Heads {
        if reps == 1 {
            return self;
        }
        let chunk = self.len * self.h;
        let mut v = Vec::with_capacity(self.v.len() * reps);
        for head in self.v.chunks(chunk.max(1)) {
            for _ in 0..reps {
                v.extend_from_slice(head);
            }
        }
        Heads {
            n: self.n * reps,
            v,
            ..self
        }
    }

    /// `[B, len, N·H]`: the heads side by side again.
    pub(crate) fn merged(&self) -> Vec<f32> {
        let (b, n, len, h) = (self.b, self.n, self.len, self.h);
        let mut out = vec![0f32; self.v.len()];
        for bn in 0..b * n {
            let (bi, ni) = (bn / n, bn % n);
            for si in 0..len {
                out[((bi * len + si) * n + ni) * h..][..h]
                    .copy_from_slice(&self.v[(bn * len + si) * h..][..h]);
            }
        }
        out
    }
}

/// Which intermediate of the scores an attention hands back (ONNX's qk_matmul_output).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkStage {
    /// The scaled (and softcapped) product.
    Product,
    /// After the mask and bias.
    Masked,
    /// The softmax probabilities.
    Probabilities,
}

/// How the scores of [`attend`] are formed from Q·Kᵀ.
pub(crate) struct ScoreRule<'a> {
    /// 0: `1/√head_size`.
    pub scale: f32,
    /// Scale Q and K by `√scale` each before the product (ONNX) instead of the product (ORT).
    pub scale_operands: bool,
    /// > 0: `softcap·tanh(scores/softcap)` before the mask.
    pub softcap: f32,
    /// Added to every head's scores: `[B, S, T]`.
    pub mask: Option<&'a [f32]>,
    /// Added too: `[B or 1, N or 1, S, T]`.
    pub bias: Option<&'a Tensor>,
    /// The intermediate to hand back, `[B, N, S, T]`.
    pub keep: Option<QkStage>,
    /// A row whose every score is −inf or the lowest f32 (all keys masked) gets probabilities 0, so its output
    /// is 0 (ONNX Runtime's ONNX Attention kernel), instead of the softmax's NaN (the onnx
    /// reference, and ONNX Runtime's com.microsoft attentions).
    pub masked_rows_zero: bool,
}

/// Softmax attention of every head: returns the heads' outputs `[B, N, S, H_v]` and the
/// kept intermediate.
pub(crate) fn attend(
    acc: Accumulator,
    q: &Heads,
    k: &Heads,
    v: &Heads,
    rule: &ScoreRule,
) -> Result<(Heads, Option<Vec<f32>>), OpError> {
    let (b, n, s, h, t, hv) = (q.b, q.n, q.len, q.h, k.len, v.h);
    if (k.b, k.n, k.h) != (b, n, h) || (v.b, v.n, v.len) != (b, n, t) {
        return Err(OpError(format!(
            "Q [{b}, {n}, {s}, {h}], K [{}, {}, {t}, {}] and V [{}, {}, {}, {hv}] do not fit",
            k.b, k.n, k.h, v.b, v.n, v.len
        )));
    }
    // Scores of all heads, and the outputs: shapes come from several inputs.
    checked_len(&[b, n, s, t])?;
    checked_len(&[b, n, s, hv])?;
    let scale = if rule.scale == 0.0 {
        1.0 / (h as f32).sqrt()
    } else {
        rule.scale
    };
    let bias = match rule.bias {
        Some(t_) => {
            let d = t_.shape();
            let fits = d.len() == 4
                && (d[0] == 1 || d[0] == b)
                && (d[1] == 1 || d[1] == n)
                && d[2] == s
                && d[3] == t;
            if !fits {
                return Err(OpError(format!(
                    "attention bias {d:?} must be [B or 1, N or 1, S, T] = [{b}, {n}, {s}, {t}]"
                )));
            }
            Some((float_values(t_, "attention bias")?, d[0] != 1, d[1] != 1))
        }
        None => None,
    };
    let scaled;
    let (qv, kv, product_scale) = if rule.scale_operands {
        let r = scale.sqrt();
        scaled = (
            q.v.iter().map(|x| x * r).collect::<Vec<f32>>(),
            k.v.iter().map(|x| x * r).collect::<Vec<f32>>(),
        );
        (&scaled.0, &scaled.1, 1.0)
    } else {
        (&q.v, &k.v, scale)
    };
    let per_head: Vec<(Vec<f32>, Vec<f32>)> = (0..b * n)
        .into_par_iter()
        .map(|bn| {
            let (bi, ni) = (bn / n, bn % n);
            let mut scores = vec![0f32; s * t];
            sgemm(
                acc,
                s,
                t,
                h,
                &qv[bn * s * h..],
                false,
                &kv[bn * t * h..],
                true,
                &mut scores,
                false,
            );
            if product_scale != 1.0 {
                scores.iter_mut().for_each(|x| *x *= product_scale);
            }
            softcap(&mut scores, rule.softcap);
            let mut kept = if rule.keep == Some(QkStage::Product) {
                scores.clone()
            } else {
                Vec::new()
            };
            if let Some((bias, per_batch, per_head)) = &bias {
                let off =
                    (if *per_batch { bi * n } else { 0 } + if *per_head { ni } else { 0 }) * s * t;
                scores
                    .iter_mut()
                    .zip(&bias[off..])
                    .for_each(|(x, b)| *x += b);
            }
            if let Some(m) = rule.mask {
                scores
                    .iter_mut()
                    .zip(&m[bi * s * t..])
                    .for_each(|(x, m)| *x += m);
            }
            if rule.keep == Some(QkStage::Masked) {
                kept = scores.clone();
            }
            if t > 0 {
                scores.chunks_mut(t).for_each(|row| {
                    if rule.masked_rows_zero && row.iter().all(|&x| x <= f32::MIN) {
                        row.fill(0.0);
                    } else {
                        softmax_row(row);
                    }
                });
            }
            if rule.keep == Some(QkStage::Probabilities) {
                kept = scores.clone();
            }
            let mut o = vec![0f32; s * hv];
            sgemm(
                acc,
                s,
                hv,
                t,
                &scores,
                false,
                &v.v[bn * t * hv..],
                false,
                &mut o,
                false,
            );
            (o, kept)
        })
        .collect();
    let keep = rule.keep.map(|_| {
        per_head
            .iter()
            .flat_map(|(_, k)| k.iter().copied())
            .collect()
    });
    let out = per_head.into_iter().flat_map(|(o, _)| o).collect();
    Ok((
        Heads {
            b,
            n,
            len: s,
            h: hv,
            v: out,
        },
        keep,
    ))
}

/// `c·tanh(x/c)` of every score when the cap `c` is > 0 (attention's logit softcapping).
pub(crate) fn softcap(scores: &mut [f32], c: f32) {
    if c > 0.0 {
        scores.iter_mut().for_each(|x| *x = c * (*x / c).tanh());
    }
}

/// How a rotary embedding finds each token's angles: the row of the cos/sin caches.
pub(crate) struct RotaryInput<'a> {
    pub x: &'a Tensor,
    /// Heads of a 3-D input (required there).
    pub num_heads: Option<usize>,
    /// 0: the whole head.
    pub rotary_dim: usize,
    pub interleaved: bool,
    /// The caches, `half` values per row.
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    pub half: usize,
}

/// Rotates the first `rotary_dim` features of every head of `[B, S, N·H]` or `[B, N, S, H]`:
/// pairs `(x[i], x[i + r/2])` (or `(x[2i], x[2i+1])` when interleaved) become
/// `(x1·cos − x2·sin, x2·cos + x1·sin)` with the caches' row `row(b, s)`, rounded as ONNX
/// Runtime's MLAS kernel (`MlasRotaryEmbedOneRow`, AVX2) rounds them: `fma(x1, cos,
/// −round(x2·sin))` and `fma(x1, sin, round(x2·cos))`.
pub(crate) fn rotate(
    r: &RotaryInput,
    row: impl Fn(usize, usize, usize) -> Result<usize, OpError>,
) -> Result<Tensor, OpError> {
    let xs = r.x.shape();
    let half = r.half;
    // (batch, seq, heads, head size) and whether heads come before the sequence.
    let (b, s, n, h, bnsh) = match *xs {
        [b, n, s, h] => (b, s, n, h, true),
        [b, s, d] => {
            let n = r.num_heads.unwrap_or(0);
            if n == 0 || d % n != 0 {
                return Err(OpError(format!(
                    "input {xs:?}: hidden size {d} does not split into {n} heads (num_heads)"
                )));
            }
            (b, s, n, d / n, false)
        }
        _ => {
            return Err(OpError(format!(
                "input {xs:?} must be [B, S, D] or [B, N, S, H]"
            )))
        }
    };
    let rd = if r.rotary_dim > 0 { r.rotary_dim } else { h };
    if rd > h || rd % 2 != 0 || rd / 2 != half {
        return Err(OpError(format!(
            "rotary dimension {rd} must be even, at most the head size {h} and twice the caches' width {half}"
        )));
    }
    let mut v = float_values(r.x, "input")?;
    let geometry = RotaryRows {
        b,
        s,
        n,
        h,
        bnsh,
        rd,
        half,
        interleaved: r.interleaved,
    };
    // `mul_add` is one instruction where FMA is enabled, else a call to libm's `fmaf` (the
    // same value: a fused multiply-add is exact before its one rounding).
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the feature the function was compiled for.
        unsafe { rotate_rows_fma(&geometry, r.cos, r.sin, &row, &mut v)? };
        return Ok(in_dtype(Tensor::from_f32(xs.to_vec(), v), r.x.dtype()));
    }
    rotate_rows(&geometry, r.cos, r.sin, &row, &mut v)?;
    Ok(in_dtype(Tensor::from_f32(xs.to_vec(), v), r.x.dtype()))
}

/// Where [`rotate`]'s pairs lie.
struct RotaryRows {
    b: usize,
    s: usize,
    n: usize,
    h: usize,
    /// Heads before the sequence (`[B, N, S, H]`).
    bnsh: bool,
    rd: usize,
    half: usize,
    interleaved: bool,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rotate_rows_fma(
    g: &RotaryRows,
    cos: &[f32],
    sin: &[f32],
    row: &impl Fn(usize, usize, usize) -> Result<usize, OpError>,
    v: &mut [f32],
) -> Result<(), OpError> {
    rotate_rows(g, cos, sin, row, v)
}

#[inline(always)]
fn rotate_rows(
    g: &RotaryRows,
    cos: &[f32],
    sin: &[f32],
    row: &impl Fn(usize, usize, usize) -> Result<usize, OpError>,
    v: &mut [f32],
) -> Result<(), OpError> {
    let (b, s, n, h, half) = (g.b, g.s, g.n, g.h, g.half);
    for bi in 0..b {
        for si in 0..s {
            let p = row(bi, si, s)?;
            let (c, sn) = (&cos[p * half..][..half], &sin[p * half..][..half]);
            for ni in 0..n {
                let off = if g.bnsh {
                    ((bi * n + ni) * s + si) * h
                } else {
                    ((bi * s + si) * n + ni) * h
                };
                let head = &mut v[off..off + g.rd];
                for i in 0..half {
                    let (a, bb) = if g.interleaved {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + half)
                    };
                    let (x1, x2) = (head[a], head[bb]);
                    // MLAS's AVX2 rotary kernel: fmsub(x1, cos, x2·sin), fmadd(x1, sin, x2·cos).
                    head[a] = x1.mul_add(c[i], -(x2 * sn[i]));
                    head[bb] = x1.mul_add(sn[i], x2 * c[i]);
                }
            }
        }
    }
    Ok(())
}

/// RotaryEmbedding's attributes (ONNX's and com.microsoft's).
#[derive(Clone, Debug, PartialEq)]
pub struct RotaryAttrs {
    pub interleaved: bool,
    /// 0: not given.
    pub num_heads: usize,
    /// 0: the whole head.
    pub rotary_dim: usize,
}

impl RotaryAttrs {
    pub(crate) fn parse(node: &Node) -> Result<RotaryAttrs, AttrError> {
        let a = Attrs::new(node);
        if a.flag("is_packed_batching", false)? {
            return Err(AttrError::new("is_packed_batching", "is not supported"));
        }
        let nonneg = |name: &str| -> Result<usize, AttrError> {
            let v = a.int_or(name, 0)?;
            usize::try_from(v).map_err(|_| AttrError::new(name, format!("must be >= 0, got {v}")))
        };
        Ok(RotaryAttrs {
            interleaved: a.flag("interleaved", false)?,
            num_heads: nonneg("num_heads")?,
            rotary_dim: nonneg("rotary_embedding_dim")?,
        })
    }
}

/// A rotary op's cos and sin tables as float32 values (borrowed when stored so) and the
/// length of their rows (half the rotary dimension).
pub(crate) type RotaryCaches<'a> = (Cow<'a, [f32]>, Cow<'a, [f32]>, usize);

/// The caches `[rows, half]` of a rotary embedding, checked alike.
pub(crate) fn rotary_caches<'a>(
    cos: &'a Tensor,
    sin: &'a Tensor,
    rank: usize,
) -> Result<RotaryCaches<'a>, OpError> {
    let cs = cos.shape();
    if cs.len() != rank || sin.shape() != cs {
        return Err(OpError(format!(
            "cos_cache {cs:?} and sin_cache {:?} must have the same rank-{rank} shape",
            sin.shape()
        )));
    }
    let half = *cs.last().unwrap_or(&0);
    // Float32 caches are read where they lie: a GenAI model's are whole [max_position, r/2]
    // tables, copied on every call before (2 MB per layer and step on SmolLM2).
    let values = |t: &'a Tensor, what: &str| -> Result<Cow<'a, [f32]>, OpError> {
        match t.as_f32() {
            Some(v) => Ok(Cow::Borrowed(v)),
            None => float_values(t, what).map(Cow::Owned),
        }
    };
    Ok((values(cos, "cos_cache")?, values(sin, "sin_cache")?, half))
}

/// ONNX RotaryEmbedding: X, cos_cache, sin_cache, position_ids. With position ids the caches
/// are `[max_position, r/2]` tables indexed by them; without, `[B, S, r/2]` angles per token.
fn onnx_rotary(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<RotaryAttrs>()?;
    let x = input(inputs, 0)?;
    let pos = opt_input(inputs, 3)
        .map(|_| input_i64s(inputs, 3))
        .transpose()?;
    let rank = if pos.is_some() { 2 } else { 3 };
    let (cos, sin, half) = rotary_caches(input(inputs, 1)?, input(inputs, 2)?, rank)?;
    let rows = cos.len() / half.max(1);
    let r = RotaryInput {
        x,
        num_heads: (attrs.num_heads > 0).then_some(attrs.num_heads),
        rotary_dim: attrs.rotary_dim,
        interleaved: attrs.interleaved,
        cos: &cos,
        sin: &sin,
        half,
    };
    let y = rotate(&r, |bi, si, s| {
        let row = match &pos {
            Some(p) => {
                let v = *p.get(bi * s + si).ok_or_else(|| {
                    OpError(format!(
                        "position_ids has {} values, fewer than B·S",
                        p.len()
                    ))
                })?;
                usize::try_from(v).map_err(|_| OpError(format!("position {v} is negative")))?
            }
            None => bi * s + si,
        };
        if row >= rows {
            return Err(OpError(format!(
                "position {row} is outside the caches' {rows} rows"
            )));
        }
        Ok(row)
    })?;
    Ok(vec![y])
}

/// ONNX Attention's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct OnnxAttentionAttrs {
    pub is_causal: bool,
    pub q_num_heads: Option<usize>,
    pub kv_num_heads: Option<usize>,
    /// None: `1/√head_size`.
    pub scale: Option<f32>,
    pub softcap: f32,
    pub qk_mode: QkStage,
}

impl OnnxAttentionAttrs {
    fn parse(node: &Node) -> Result<OnnxAttentionAttrs, AttrError> {
        let a = Attrs::new(node);
        let heads = |name: &str| -> Result<Option<usize>, AttrError> {
            match a.int(name)? {
                None => Ok(None),
                Some(v) if v >= 1 => Ok(Some(v as usize)),
                Some(v) => Err(AttrError::new(name, format!("must be >= 1, got {v}"))),
            }
        };
        let qk_mode = match a.int_or("qk_matmul_output_mode", 0)? {
            0 | 1 => QkStage::Product,
            2 => QkStage::Masked,
            3 => QkStage::Probabilities,
            m => {
                return Err(AttrError::new(
                    "qk_matmul_output_mode",
                    format!("must be 0..=3, got {m}"),
                ))
            }
        };
        Ok(OnnxAttentionAttrs {
            is_causal: a.flag("is_causal", false)?,
            q_num_heads: heads("q_num_heads")?,
            kv_num_heads: heads("kv_num_heads")?,
            scale: a.float("scale")?,
            softcap: a.float_or("softcap", 0.0)?,
            qk_mode,
        })
    }
}

/// Q, K or V of ONNX Attention as heads: 4-D as is, 3-D split into `heads`.
fn onnx_heads(t: &Tensor, heads: Option<usize>, what: &str) -> Result<Heads, OpError> {
    match t.shape() {
        [_, _, _, _] => Heads::from_bnsh(t, what),
        &[b, s, d] => {
            let n = heads.ok_or_else(|| {
                OpError(format!(
                    "3-D {what} needs the q_num_heads and kv_num_heads attributes"
                ))
            })?;
            if d % n != 0 {
                return Err(OpError(format!(
                    "{what} width {d} does not split into {n} heads"
                )));
            }
            Ok(Heads::split(
                &float_values(t, what)?,
                (b, s, d),
                0,
                (n, d / n),
                None,
            ))
        }
        s => Err(OpError(format!("{what} {s:?} must be 3-D or 4-D"))),
    }
}

/// The additive mask of ONNX Attention, `[B, Hq, S, T]` (None: nothing masked).
fn onnx_mask(
    mask: Option<&Tensor>,
    nonpad: Option<&[i64]>,
    (b, n, s, t, past): (usize, usize, usize, usize, usize),
    causal: bool,
) -> Result<Option<Tensor>, OpError> {
    if mask.is_none() && nonpad.is_none() && !causal {
        return Ok(None);
    }
    let full = [b, n, s, t];
    let mut out = vec![0f32; checked_len(&full)?];
    if let Some(m) = mask {
        let ms = m.shape();
        let Some(&last) = ms.last() else {
            return Err(OpError("attn_mask must have rank >= 1".into()));
        };
        if last > t || ms.len() > 4 {
            return Err(OpError(format!(
                "attn_mask {ms:?} does not broadcast to [B, q_heads, S, T] = {full:?}"
            )));
        }
        let add: Vec<f32> = match m.dtype() {
            DType::Bool => m
                .to_f32_vec()
                .expect("bool")
                .iter()
                .map(|&x| if x != 0.0 { 0.0 } else { f32::NEG_INFINITY })
                .collect(),
            _ => float_values(m, "attn_mask")?,
        };
        // Pad the key axis to T with −inf (`false`), then broadcast.
        let mut padded_shape = ms.to_vec();
        *padded_shape.last_mut().expect("rank >= 1") = t;
        let mut padded = vec![f32::NEG_INFINITY; checked_len(&[add.len() / last.max(1), t])?];
        if last > 0 {
            for (dst, src) in padded.chunks_mut(t).zip(add.chunks(last)) {
                dst[..last].copy_from_slice(src);
            }
        }
        let mut shape4 = vec![1usize; 4 - padded_shape.len()];
        shape4.extend(&padded_shape);
        let fits = shape4.iter().zip(full).all(|(&d, f)| d == 1 || d == f);
        if !fits {
            return Err(OpError(format!(
                "attn_mask {ms:?} does not broadcast to [B, q_heads, S, T] = {full:?}"
            )));
        }
        out = broadcast_to(&padded, &shape4, &full);
    }
    // ONNX Runtime writes the lowest f32 above the diagonal (the reference adds −inf: the
    // same probabilities, but a +inf bias there gives +inf, not NaN, as in ONNX Runtime).
    if causal {
        for row in 0..b * n {
            for i in 0..s {
                for j in (past + i + 1).min(t)..t {
                    out[(row * s + i) * t + j] = f32::MIN;
                }
            }
        }
    }
    if let Some(lens) = nonpad {
        if lens.len() != b {
            return Err(OpError(format!(
                "nonpad_kv_seqlen has {} values, expected one per batch ({b})",
                lens.len()
            )));
        }
        for (bi, &len) in lens.iter().enumerate() {
            let from = len.clamp(0, t as i64) as usize;
            for row in 0..n * s {
                out[((bi * n * s) + row) * t..][from..t]
                    .iter_mut()
                    .for_each(|x| *x = f32::NEG_INFINITY);
            }
        }
    }
    Ok(Some(Tensor::from_f32(full.to_vec(), out)))
}

/// ONNX Attention: Y, present_key, present_value, qk_matmul_output.
fn onnx_attention(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<OnnxAttentionAttrs>()?;
    let (qt, kt, vt) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    if qt.rank() != kt.rank() || qt.rank() != vt.rank() {
        return Err(OpError(format!(
            "Q {:?}, K {:?} and V {:?} must have the same rank",
            qt.shape(),
            kt.shape(),
            vt.shape()
        )));
    }
    let q = onnx_heads(qt, attrs.q_num_heads, "Q")?;
    let k = onnx_heads(kt, attrs.kv_num_heads, "K")?;
    let v = onnx_heads(vt, attrs.kv_num_heads, "V")?;
    let past = |i: usize, what: &str| {
        opt_input(inputs, i)
            .map(|t| Heads::from_bnsh(t, what))
            .transpose()
    };
    let (pk, pv) = (past(4, "past_key")?, past(5, "past_value")?);
    let past_len = pk.as_ref().map_or(0, |p| p.len);
    let k = k.after(pk, "past_key")?;
    let v = v.after(pv, "past_value")?;
    let (present_k, present_v) = (k.tensor(), v.tensor());
    if k.n == 0 || q.n % k.n != 0 || v.n != k.n {
        return Err(OpError(format!(
            "{} query heads do not share {} key and {} value heads evenly",
            q.n, k.n, v.n
        )));
    }
    let reps = q.n / k.n;
    checked_len(&[k.b, q.n, k.len, k.h.max(v.h)])?;
    let (k, v) = (k.repeated(reps), v.repeated(reps));
    let nonpad = opt_input(inputs, 6)
        .map(|_| input_i64s(inputs, 6))
        .transpose()?;
    let mask = onnx_mask(
        opt_input(inputs, 3),
        nonpad.as_deref(),
        (q.b, q.n, q.len, k.len, past_len),
        attrs.is_causal,
    )?;
    let keep_qk = ctx.node.outputs.get(3).is_some_and(|o| !o.is_empty());
    let rule = ScoreRule {
        scale: attrs.scale.unwrap_or(0.0),
        scale_operands: true,
        softcap: attrs.softcap,
        mask: None,
        bias: mask.as_ref(),
        keep: keep_qk.then_some(attrs.qk_mode),
        masked_rows_zero: true,
    };
    let (y, qk) = attend(ctx.accumulate, &q, &k, &v, &rule)?;
    let dtype = qt.dtype();
    let y = if qt.rank() == 3 {
        Tensor::from_f32(vec![y.b, y.len, y.n * y.h], y.merged())
    } else {
        y.tensor()
    };
    let mut outs = vec![
        in_dtype(y, dtype),
        in_dtype(present_k, dtype),
        in_dtype(present_v, dtype),
    ];
    if let Some(qk) = qk {
        outs.push(in_dtype(
            Tensor::from_f32(vec![q.b, q.n, q.len, k.len], qk),
            dtype,
        ));
    }
    Ok(outs)
}

fn onnx_attention_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (q, v) = (fact(ins, 0)?, fact(ins, 2)?);
    let attrs = ctx.attrs::<OnnxAttentionAttrs>()?;
    let dim = |f: &Fact, i: usize| -> DimFact {
        f.shape
            .as_ref()
            .and_then(|s| s.get(i).cloned())
            .unwrap_or_else(|| ctx.unknown_dim())
    };
    let known = |f: &Fact, i: usize| f.shape.as_ref().and_then(|s| s.get(i)?.as_known());
    let y = match q.rank() {
        Some(3) => {
            let hv = match (known(v, 2), attrs.kv_num_heads, attrs.q_num_heads) {
                (Some(dv), Some(kvn), Some(qn)) if kvn > 0 => Some(DimFact::known(dv / kvn * qn)),
                _ => None,
            };
            Some(vec![
                dim(q, 0),
                dim(q, 1),
                hv.unwrap_or_else(|| ctx.unknown_dim()),
            ])
        }
        Some(4) => Some(vec![dim(q, 0), dim(q, 1), dim(q, 2), dim(v, 3)]),
        _ => None,
    };
    let present = |f: Option<&Fact>| {
        Fact::new(
            q.dtype,
            f.and_then(|f| f.rank())
                .map(|r| (0..r.max(4)).map(|_| ctx.unknown_dim()).collect()),
        )
    };
    Ok(vec![
        Fact::new(q.dtype, y),
        present(opt_fact(ins, 1)),
        present(opt_fact(ins, 2)),
        Fact::new(q.dtype, Some((0..4).map(|_| ctx.unknown_dim()).collect())),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FMA build of the rotation gives the portable build's bits (each `mul_add` one
    /// rounding either way), and those are the fused values, not the product rounded first.
    #[test]
    fn the_fma_build_gives_the_portable_bits() {
        let (b, s, n, h, half) = (2, 3, 2, 8, 4);
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0
        };
        let x: Vec<f32> = (0..b * s * n * h).map(|_| next() * 3.1).collect();
        let cos: Vec<f32> = (0..s * half).map(|_| next()).collect();
        let sin: Vec<f32> = (0..s * half).map(|_| next()).collect();
        for (bnsh, interleaved) in [(true, false), (false, true)] {
            let g = RotaryRows {
                b,
                s,
                n,
                h,
                bnsh,
                rd: 2 * half,
                half,
                interleaved,
            };
            let row = |_: usize, si: usize, _: usize| Ok(si);
            let mut portable = x.clone();
            rotate_rows(&g, &cos, &sin, &row, &mut portable).unwrap();
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("fma") {
                let mut fused = x.clone();
                // SAFETY: the CPU has FMA (checked).
                unsafe { rotate_rows_fma(&g, &cos, &sin, &row, &mut fused).unwrap() };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fused), bits(&portable));
            }
            let mut unfused = x.clone();
            for (bi, si, ni, i) in (0..b * s * n * half).map(|j| {
                (
                    j / (s * n * half),
                    j / (n * half) % s,
                    j / half % n,
                    j % half,
                )
            }) {
                let off = if bnsh {
                    ((bi * n + ni) * s + si) * h
                } else {
                    ((bi * s + si) * n + ni) * h
                };
                let (a, bb) = if interleaved {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + half)
                };
                let (x1, x2) = (x[off + a], x[off + bb]);
                let (c, sn) = (cos[si * half + i], sin[si * half + i]);
                unfused[off + a] = x1 * c - x2 * sn;
                unfused[off + bb] = x1 * sn + x2 * c;
            }
            assert_ne!(unfused, portable, "some pair rounds differently unfused");
            let close = unfused
                .iter()
                .zip(&portable)
                .all(|(u, p)| (u - p).abs() <= 1e-6 * (1.0 + u.abs()));
            assert!(close, "the same rotation");
        }
    }
}
