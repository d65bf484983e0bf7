//! com.microsoft CausalConvWithState and VarlenCausalConvWithState (the short depthwise causal
//! convolutions of ONNX Runtime GenAI's Qwen3.5 / Qwen3-Next linear-attention layers and LFM2's
//! convolution blocks) as ONNX Runtime 1.32's CPU kernels compute them
//! (contrib_ops/cpu/bert/causal_conv_with_state.cc, varlen_causal_conv_with_state.cc).
//!
//! Each channel `c` of a sequence is convolved over its window `[state | input]`, the state the
//! `pad = (K − 1)·dilation` raw samples before the sequence: output position `l` is `bias[c] +
//! Σ_k w[c, k]·window[l + k·dilation]`, summed in f32 from the bias (0 without one) in tap order,
//! each product rounded before its add (no fused multiply-add: ORT's x86-64 build has none here,
//! measured bit for bit), then SiLU as `s / (1 + e^−s)` with libm's `expf` when `activation` is
//! `silu`/`swish`. The new state is the window's last `pad` samples. Float16 and bfloat16 are
//! computed the same way from their f32 values and rounded once at the end: ORT's CPU
//! VarlenCausalConvWithState kernel does that, and it runs a float16 CausalConvWithState (a
//! float32-only kernel) between Casts its graph transformer inserts.
//!
//! - CausalConvWithState: input `[B, C, L]` (or `[B, L, d_1, …]` with `channels_last`, C the
//!   product of the trailing axes), optional bias and `past_state` `[B, C, pad]` (`[B, pad, d_1,
//!   …]` channels-last; zeros when omitted). A single position without a past (ORT's decode path)
//!   adds only the last tap: the missing past's taps are skipped, not multiplied by zero (which
//!   differs for infinite or NaN weights).
//! - VarlenCausalConvWithState: token-major packed input `[T, C]`, `cumulative_sequence_length
//!   [N + 1]` (int32, 0 … T, not falling; an empty sequence keeps its state), required
//!   `initial_state [N, C, pad]`; with `state_update_capacity` > 0 and `capture_count [N]` the
//!   third output `[N, capacity, C]` holds each sequence's first `clamp(count, 0, min(capacity,
//!   len))` input tokens, zeros after.
//!
//! What ONNX Runtime's CPU kernels refuse is refused: `ndim` > 1, `state_window` > 0, the
//! CUDA-only extended channel/state attributes (`input_channels`, `input_channel_offset`,
//! `state_length`, `state_channels_last`, `state_update_capacity` of CausalConvWithState) and
//! VarlenCausalConvWithState's dynamic grouped mode (`kernel_delta`, `previous_mask`).

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::shape::{fact, opt_fact, FactsResult};
use super::super::util::{checked_len, float_slice, in_dtype, input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::group_query_attention::int32_values;
use super::MS_DOMAIN;
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::tensor::Tensor;
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    use InputRole::{Bias, Data, Param};
    r.add_in(MS_DOMAIN, "CausalConvWithState", causal_conv)
        .parse(|n, _| boxed(ConvAttrs::parse(n)))
        .roles(&[Data, Data, Bias, Data])
        .infer(causal_conv_facts);
    r.add_in(MS_DOMAIN, "VarlenCausalConvWithState", varlen_conv)
        .parse(|n, _| boxed(VarlenAttrs::parse(n)))
        .roles(&[Data, Data, Param, Bias, Data, Param, Data, Data])
        .infer(varlen_facts);
}

/// The largest `state_update_capacity` ONNX Runtime accepts.
const MAX_CAPACITY: i64 = 8;

/// `activation`: whether SiLU follows the convolution ('silu'/'swish'), or nothing ('none').
fn parse_silu(a: &Attrs) -> Result<bool, AttrError> {
    a.choice(
        "activation",
        false,
        &[("none", false), ("silu", true), ("swish", true)],
    )
}

fn parse_dilation(a: &Attrs) -> Result<usize, AttrError> {
    let d = a.int_or("dilation", 1)?;
    usize::try_from(d)
        .ok()
        .filter(|&d| d >= 1)
        .ok_or_else(|| AttrError::new("dilation", format!("must be >= 1, got {d}")))
}

#[derive(Clone, Debug, PartialEq)]
struct ConvAttrs {
    silu: bool,
    dilation: usize,
    channels_last: bool,
}

impl ConvAttrs {
    fn parse(node: &Node) -> Result<ConvAttrs, AttrError> {
        let a = Attrs::new(node);
        let ndim = a.int_or("ndim", 1)?;
        if ndim != 1 {
            return Err(AttrError::new(
                "ndim",
                format!("{ndim}: ONNX Runtime's CPU kernel runs only ndim = 1"),
            ));
        }
        let window = a.int_or("state_window", 0)?;
        if window != 0 {
            return Err(AttrError::new(
                "state_window",
                format!(
                    "{window}: ONNX Runtime's CPU kernel has no state window (CUDA only); \
                     it runs state_window = 0"
                ),
            ));
        }
        // The extended channel/state options of ORT's CUDA kernel: its CPU kernel refuses any
        // value but the default.
        for (name, default) in [
            ("input_channels", 0),
            ("input_channel_offset", 0),
            ("state_length", 0),
            ("state_channels_last", -1),
            ("state_update_capacity", 0),
        ] {
            let v = a.int_or(name, default)?;
            if v != default {
                return Err(AttrError::new(
                    name,
                    format!(
                        "{v}: CUDA only (ONNX Runtime's CPU kernel runs only the default \
                         {default})"
                    ),
                ));
            }
        }
        if node.outputs.get(2).is_some_and(|o| !o.is_empty()) {
            return Err(AttrError::new(
                "state_update_capacity",
                "the state_update output is CUDA only (ONNX Runtime's CPU kernel refuses it)",
            ));
        }
        let channels_last = match a.int_or("channels_last", 0)? {
            0 => false,
            1 => true,
            v => {
                return Err(AttrError::new(
                    "channels_last",
                    format!("must be 0 or 1, got {v}"),
                ))
            }
        };
        Ok(ConvAttrs {
            silu: parse_silu(&a)?,
            dilation: parse_dilation(&a)?,
            channels_last,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
struct VarlenAttrs {
    silu: bool,
    dilation: usize,
    capacity: usize,
}

impl VarlenAttrs {
    fn parse(node: &Node) -> Result<VarlenAttrs, AttrError> {
        let a = Attrs::new(node);
        let cap = a.int_or("state_update_capacity", 0)?;
        if !(0..=MAX_CAPACITY).contains(&cap) {
            return Err(AttrError::new(
                "state_update_capacity",
                format!("must be in [0, {MAX_CAPACITY}], got {cap}"),
            ));
        }
        // Attributes of the dynamic grouped mode, which ONNX Runtime's CPU kernel refuses.
        for (name, default) in [("group_size", 1), ("delta_offset", 0)] {
            let v = a.int_or(name, default)?;
            if v != default {
                return Err(AttrError::new(
                    name,
                    format!("{v}: the dynamic grouped mode is CUDA only"),
                ));
            }
        }
        Ok(VarlenAttrs {
            silu: parse_silu(&a)?,
            dilation: parse_dilation(&a)?,
            capacity: cap as usize,
        })
    }
}

/// SiLU as ORT's kernel writes it: `s / (1 + e^−s)`, libm's `expf`.
#[inline]
fn silu(s: f32) -> f32 {
    s / (1.0 + (-s).exp())
}

/// The window's value `p` of one channel-first row: the state below `pad` (zeros without one),
/// the input from there.
#[inline]
fn window_at(p: usize, pad: usize, x: &[f32], state: Option<&[f32]>) -> f32 {
    if p >= pad {
        x[p - pad]
    } else {
        state.map_or(0.0, |s| s[p])
    }
}

/// One channel of the channels-first layout: `out[l]` for every position of `x` (the row's
/// input), `state` its `pad` samples before (None: zeros), `w` the K taps. `skip_state`: the
/// state is absent and the sequence one position long, where ORT adds only the last tap.
#[allow(clippy::too_many_arguments)]
fn conv_row(
    x: &[f32],
    state: Option<&[f32]>,
    w: &[f32],
    bias: f32,
    dilation: usize,
    act: bool,
    skip_state: bool,
    out: &mut [f32],
) {
    let pad = (w.len() - 1) * dilation;
    let first = if skip_state { w.len() - 1 } else { 0 };
    for (l, o) in out.iter_mut().enumerate() {
        let mut sum = bias;
        for (j, &wj) in w.iter().enumerate().skip(first) {
            sum += wj * window_at(l + j * dilation, pad, x, state);
        }
        *o = if act { silu(sum) } else { sum };
    }
}

/// The convolution in the token-major layout (channels last, packed sequences): every value of
/// a token's row is computed in the same order as [`conv_row`]'s, a row at a time, so the loops
/// run across contiguous channels.
struct TokenTaps<'a> {
    /// The taps tap-major, `[K, C]`.
    wt: Vec<f32>,
    bias: &'a [f32],
    k: usize,
    dilation: usize,
    silu: bool,
}

impl<'a> TokenTaps<'a> {
    /// `w` is `[C, 1, K]`.
    fn new(w: &[f32], bias: &'a [f32], k: usize, dilation: usize, silu: bool) -> TokenTaps<'a> {
        let c = bias.len();
        let mut wt = vec![0f32; k * c];
        for ch in 0..c {
            for j in 0..k {
                wt[j * c + ch] = w[ch * k + j];
            }
        }
        TokenTaps {
            wt,
            bias,
            k,
            dilation,
            silu,
        }
    }

    fn pad(&self) -> usize {
        (self.k - 1) * self.dilation
    }

    /// The window's row `p` of a sequence: `state [pad, C]` rows below `pad` (None: zeros),
    /// the input rows `x [len, C]` from there.
    fn window_row<'b>(
        &self,
        p: usize,
        x: &'b [f32],
        state: Option<&'b [f32]>,
    ) -> Option<&'b [f32]> {
        let (c, pad) = (self.bias.len(), self.pad());
        if p >= pad {
            Some(&x[(p - pad) * c..(p - pad + 1) * c])
        } else {
            state.map(|s| &s[p * c..(p + 1) * c])
        }
    }

    /// Output row `l` of a sequence (see [`conv_row`] for `skip_state`).
    fn row(&self, l: usize, x: &[f32], state: Option<&[f32]>, skip_state: bool, out: &mut [f32]) {
        let c = out.len();
        out.copy_from_slice(self.bias);
        let first = if skip_state { self.k - 1 } else { 0 };
        for j in first..self.k {
            let w = &self.wt[j * c..(j + 1) * c];
            match self.window_row(l + j * self.dilation, x, state) {
                Some(src) => {
                    for ((o, &wv), &v) in out.iter_mut().zip(w).zip(src) {
                        *o += wv * v;
                    }
                }
                // ORT multiplies the zero padding too (an infinite weight gives NaN).
                None => {
                    for (o, &wv) in out.iter_mut().zip(w) {
                        *o += wv * 0.0;
                    }
                }
            }
        }
        if self.silu {
            out.iter_mut().for_each(|o| *o = silu(*o));
        }
    }

    /// The state after a sequence of `len` rows, `[pad, C]`: the window's last `pad` rows.
    fn final_state(&self, len: usize, x: &[f32], state: Option<&[f32]>) -> Vec<f32> {
        let (c, pad) = (self.bias.len(), self.pad());
        let mut st = vec![0f32; pad * c];
        for (j, row) in st.chunks_exact_mut(c.max(1)).enumerate().take(pad) {
            if let Some(src) = self.window_row(len + j, x, state) {
                row.copy_from_slice(src);
            }
        }
        st
    }
}

/// `[rows, cols]` → `[cols, rows]`.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; v.len()];
    for (r, row) in v.chunks_exact(cols.max(1)).enumerate().take(rows) {
        for (c, &x) in row.iter().enumerate() {
            t[c * rows + r] = x;
        }
    }
    t
}

/// The weight `[C, 1, K]` checked against the channels: its K (>= 1).
fn kernel_size(weight: &[usize], channels: usize) -> Result<usize, OpError> {
    match *weight {
        [c, 1, k] if c == channels && k >= 1 => Ok(k),
        _ => Err(OpError(format!(
            "weight {weight:?} must be [channels, 1, kernel_size] = [{channels}, 1, K >= 1]"
        ))),
    }
}

fn bias_values(bias: Option<&Tensor>, channels: usize) -> Result<Vec<f32>, OpError> {
    match bias {
        None => Ok(vec![0.0; channels]),
        Some(b) if b.shape() == [channels] => Ok(float_slice(b, "bias")?.into_owned()),
        Some(b) => Err(OpError(format!(
            "bias {:?} must be [channels] = [{channels}]",
            b.shape()
        ))),
    }
}

fn causal_conv(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<ConvAttrs>()?;
    let (x, weight) = (input(inputs, 0)?, input(inputs, 1)?);
    let shape = x.shape();
    let (b, l, c) = if attrs.channels_last {
        if shape.len() < 3 {
            return Err(OpError(format!(
                "input {shape:?} must be [batch, sequence, d_1, ...] (rank >= 3) with \
                 channels_last"
            )));
        }
        (shape[0], shape[1], shape[2..].iter().product::<usize>())
    } else {
        match *shape {
            [b, c, l] => (b, l, c),
            _ => {
                return Err(OpError(format!(
                    "input {shape:?} must be [batch, channels, sequence]"
                )))
            }
        }
    };
    let k = kernel_size(weight.shape(), c)?;
    let bias = bias_values(opt_input(inputs, 2), c)?;
    let pad = (k - 1) * attrs.dilation;
    let state_shape: Vec<usize> = if attrs.channels_last {
        [b, pad].iter().chain(&shape[2..]).copied().collect()
    } else {
        vec![b, c, pad]
    };
    checked_len(&state_shape)?;
    let past = opt_input(inputs, 3);
    if let Some(p) = past {
        if p.shape() != state_shape.as_slice() {
            return Err(OpError(format!(
                "past_state {:?} must be {state_shape:?} ([batch, channels, (K - 1)·dilation]{})",
                p.shape(),
                if attrs.channels_last {
                    ", channels last"
                } else {
                    ""
                }
            )));
        }
    }
    let w = float_slice(weight, "weight")?;
    let xv = float_slice(x, "input")?;
    let pv = past.map(|p| float_slice(p, "past_state")).transpose()?;
    let pv = pv.as_deref();
    let skip_state = pv.is_none() && l == 1;
    let mut out = vec![0f32; b * c * l];
    let mut present = vec![0f32; b * c * pad];
    if attrs.channels_last {
        let taps = TokenTaps::new(&w, &bias, k, attrs.dilation, attrs.silu);
        let per_batch = |i: usize| {
            (
                &xv[i * l * c..(i + 1) * l * c],
                pv.map(|p| &p[i * pad * c..(i + 1) * pad * c]),
            )
        };
        if c > 0 {
            out.par_chunks_mut(c).enumerate().for_each(|(i, o)| {
                let (xb, sb) = per_batch(i / l);
                taps.row(i % l, xb, sb, skip_state, o);
            });
        }
        for i in 0..b {
            let (xb, sb) = per_batch(i);
            present[i * pad * c..(i + 1) * pad * c].copy_from_slice(&taps.final_state(l, xb, sb));
        }
    } else {
        let row = |i: usize| {
            (
                &xv[i * l..(i + 1) * l],
                pv.map(|p| &p[i * pad..(i + 1) * pad]),
            )
        };
        if l > 0 {
            out.par_chunks_mut(l).enumerate().for_each(|(i, o)| {
                let (xr, sr) = row(i);
                let ch = i % c;
                let wc = &w[ch * k..(ch + 1) * k];
                conv_row(
                    xr,
                    sr,
                    wc,
                    bias[ch],
                    attrs.dilation,
                    attrs.silu,
                    skip_state,
                    o,
                );
            });
        }
        if pad > 0 {
            for (i, st) in present.chunks_exact_mut(pad).enumerate() {
                let (xr, sr) = row(i);
                for (j, v) in st.iter_mut().enumerate() {
                    *v = window_at(l + j, pad, xr, sr);
                }
            }
        }
    }
    Ok(vec![
        in_dtype(Tensor::from_f32(shape.to_vec(), out), x.dtype()),
        in_dtype(Tensor::from_f32(state_shape, present), x.dtype()),
    ])
}

fn varlen_conv(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<VarlenAttrs>()?;
    if opt_input(inputs, 6).is_some() || opt_input(inputs, 7).is_some() {
        return Err(OpError(
            "kernel_delta/previous_mask given: the dynamic grouped mode is CUDA only (ONNX \
             Runtime's CPU kernel refuses it)"
                .into(),
        ));
    }
    let (x, weight, cu) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let &[t, c] = x.shape() else {
        return Err(OpError(format!(
            "input {:?} must be [total_tokens, channels]",
            x.shape()
        )));
    };
    let k = kernel_size(weight.shape(), c)?;
    let bias = bias_values(opt_input(inputs, 3), c)?;
    let pad = (k - 1) * attrs.dilation;
    let offsets = int32_values(cu, "cumulative_sequence_length")?;
    if cu.rank() != 1 || offsets.len() < 2 {
        return Err(OpError(format!(
            "cumulative_sequence_length {:?} must be [batch + 1] with batch >= 1",
            cu.shape()
        )));
    }
    let n = offsets.len() - 1;
    if offsets[0] != 0 || offsets[n] != t as i64 || offsets.windows(2).any(|w| w[1] < w[0]) {
        return Err(OpError(format!(
            "cumulative_sequence_length {offsets:?} must start at 0, not fall and end at \
             total_tokens {t}"
        )));
    }
    let offsets: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
    let state = input(inputs, 4).map_err(|_| OpError("initial_state is required".into()))?;
    if state.shape() != [n, c, pad] {
        return Err(OpError(format!(
            "initial_state {:?} must be [batch, channels, (K - 1)·dilation] = [{n}, {c}, {pad}]",
            state.shape()
        )));
    }
    let count = opt_input(inputs, 5);
    if count.is_some() != (attrs.capacity > 0) {
        return Err(OpError(format!(
            "capture_count must be given exactly when state_update_capacity is positive \
             (capacity {}, capture_count {})",
            attrs.capacity,
            if count.is_some() { "given" } else { "omitted" }
        )));
    }
    let counts = match count {
        Some(cc) if cc.shape() != [n] => {
            return Err(OpError(format!(
                "capture_count {:?} must be [batch] = [{n}]",
                cc.shape()
            )))
        }
        Some(cc) => int32_values(cc, "capture_count")?,
        None => Vec::new(),
    };
    let w = float_slice(weight, "weight")?;
    let xv = float_slice(x, "input")?;
    let sv = float_slice(state, "initial_state")?;
    let taps = TokenTaps::new(&w, &bias, k, attrs.dilation, attrs.silu);
    // Each sequence's state token-major, [pad, C].
    let states: Vec<Vec<f32>> = (0..n)
        .map(|s| transpose(&sv[s * c * pad..(s + 1) * c * pad], c, pad))
        .collect();
    let seq = |s: usize| {
        let (start, end) = (offsets[s], offsets[s + 1]);
        (start, end - start, &xv[start * c..end * c])
    };
    // The sequence of every token.
    let mut seq_of = vec![0usize; t];
    for s in 0..n {
        seq_of[offsets[s]..offsets[s + 1]].fill(s);
    }
    let mut out = vec![0f32; t * c];
    if c > 0 {
        out.par_chunks_mut(c).enumerate().for_each(|(tok, o)| {
            let s = seq_of[tok];
            let (start, _, xs) = seq(s);
            taps.row(tok - start, xs, Some(&states[s]), false, o);
        });
    }
    let mut fin = Vec::with_capacity(n * c * pad);
    for (s, st) in states.iter().enumerate() {
        let (_, len, xs) = seq(s);
        fin.extend(transpose(&taps.final_state(len, xs, Some(st)), pad, c));
    }
    let dt = x.dtype();
    let mut outs = vec![
        in_dtype(Tensor::from_f32(vec![t, c], out), dt),
        in_dtype(Tensor::from_f32(vec![n, c, pad], fin), dt),
    ];
    if ctx.node.outputs.get(2).is_some_and(|o| !o.is_empty()) {
        let cap = attrs.capacity;
        let mut update = vec![0f32; n * cap * c];
        for s in 0..n {
            let (_, len, xs) = seq(s);
            let take = (counts.get(s).copied().unwrap_or(0).max(0) as usize)
                .min(cap)
                .min(len);
            update[s * cap * c..s * cap * c + take * c].copy_from_slice(&xs[..take * c]);
        }
        outs.push(in_dtype(Tensor::from_f32(vec![n, cap, c], update), dt));
    }
    Ok(outs)
}

/// `K` from the weight's fact, when known.
fn known_k(w: &Fact) -> Option<usize> {
    match w.shape.as_deref() {
        Some([_, _, k]) => k.as_known(),
        _ => None,
    }
}

fn causal_conv_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let attrs = ctx.attrs::<ConvAttrs>()?;
    let (x, w) = (fact(ins, 0)?, fact(ins, 1)?);
    let pad = known_k(w).map(|k| DimFact::known(k.saturating_sub(1) * attrs.dilation));
    let pad = || pad.clone().unwrap_or_else(|| ctx.unknown_dim());
    let state = match x.shape.as_deref() {
        Some(s) if attrs.channels_last && s.len() >= 3 => {
            let mut st = vec![s[0].clone(), pad()];
            st.extend(s[2..].iter().cloned());
            Some(st)
        }
        Some([b, c, _]) if !attrs.channels_last => Some(vec![b.clone(), c.clone(), pad()]),
        Some(s) => {
            return Err(OpError(format!(
                "input of rank {} must be {}",
                s.len(),
                if attrs.channels_last {
                    "[batch, sequence, d_1, ...] (rank >= 3)"
                } else {
                    "[batch, channels, sequence]"
                }
            )))
        }
        None => opt_fact(ins, 3).and_then(|p| p.shape.clone()),
    };
    Ok(vec![
        Fact::new(x.dtype, x.shape.clone()),
        Fact::new(x.dtype, state),
    ])
}

fn varlen_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let attrs = ctx.attrs::<VarlenAttrs>()?;
    let x = fact(ins, 0)?;
    let channels = match x.shape.as_deref() {
        Some([_, c]) => Some(c.clone()),
        Some(s) => {
            return Err(OpError(format!(
                "input of rank {} must be [total_tokens, channels]",
                s.len()
            )))
        }
        None => None,
    };
    let state = fact(ins, 4)?;
    let batch = match state.shape.as_deref() {
        Some([n, _, _]) => Some(n.clone()),
        _ => None,
    };
    let mut outs = vec![
        Fact::new(x.dtype, x.shape.clone()),
        Fact::new(x.dtype, state.shape.clone()),
    ];
    if ctx.node.outputs.len() > 2 {
        let (n, c) = (
            batch.unwrap_or_else(|| ctx.unknown_dim()),
            channels.unwrap_or_else(|| ctx.unknown_dim()),
        );
        outs.push(Fact::new(
            x.dtype,
            Some(vec![n, DimFact::known(attrs.capacity), c]),
        ));
    }
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;

    fn node(op: &str, attrs: &[(&str, Attribute)], outputs: &[&str]) -> Node {
        let mut n = node_with(op, attrs);
        n.domain = MS_DOMAIN.into();
        n.outputs = outputs.iter().map(|s| s.to_string()).collect();
        n
    }

    fn run(node: &Node, inputs: &[Option<&Tensor>]) -> Result<Vec<Tensor>, OpError> {
        crate::ops::attrs::parse_node(node, 1).map_err(|e| OpError(e.to_string()))?;
        let k = Registry::global().get(MS_DOMAIN, &node.op_type).unwrap();
        k(&OpCtx::new(node, 1), inputs)
    }

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec())
    }

    fn i32s(v: &[i32]) -> Tensor {
        Tensor::from_parts(
            vec![v.len()],
            crate::tensor::TensorData::I32(v.to_vec().into()),
        )
    }

    fn s(v: &str) -> Attribute {
        Attribute::String(v.into())
    }

    /// The output is the taps over [past | input] in order from the bias; the state the last
    /// K-1 samples; with dilation 2 the taps are two apart and the state twice as long.
    #[test]
    fn taps_run_over_the_past_and_the_input() {
        let n = node("CausalConvWithState", &[], &["y", "p"]);
        let x = t(&[1, 1, 3], &[1.0, 2.0, 3.0]);
        let w = t(&[1, 1, 3], &[100.0, 10.0, 1.0]);
        let b = t(&[1], &[0.5]);
        let past = t(&[1, 1, 2], &[4.0, 5.0]);
        let r = run(&n, &[Some(&x), Some(&w), Some(&b), Some(&past)]).unwrap();
        assert_eq!(r[0].as_f32().unwrap(), &[451.5, 512.5, 123.5]);
        assert_eq!(r[1].as_f32().unwrap(), &[2.0, 3.0]);
        // No past: zeros before the input.
        let r = run(&n, &[Some(&x), Some(&w), None, None]).unwrap();
        assert_eq!(r[0].as_f32().unwrap(), &[1.0, 12.0, 123.0]);
        let n = node(
            "CausalConvWithState",
            &[("dilation", Attribute::Int(2))],
            &["y", "p"],
        );
        let w = t(&[1, 1, 2], &[10.0, 1.0]);
        let past = t(&[1, 1, 2], &[4.0, 5.0]);
        let r = run(&n, &[Some(&x), Some(&w), None, Some(&past)]).unwrap();
        assert_eq!(r[0].as_f32().unwrap(), &[41.0, 52.0, 13.0]);
        assert_eq!(r[1].as_f32().unwrap(), &[2.0, 3.0]);
    }

    /// A decode step without a past adds only the last tap (ORT's decode path): an infinite
    /// weight on the missing past leaves the output finite; a longer input multiplies the
    /// zeros (NaN).
    #[test]
    fn a_single_position_without_a_past_skips_the_state_taps() {
        let n = node("CausalConvWithState", &[], &["y", "p"]);
        let w = t(&[1, 1, 2], &[f32::INFINITY, 2.0]);
        let r = run(&n, &[Some(&t(&[1, 1, 1], &[3.0])), Some(&w)]).unwrap();
        assert_eq!(r[0].as_f32().unwrap(), &[6.0]);
        assert_eq!(r[1].as_f32().unwrap(), &[3.0]);
        let r = run(&n, &[Some(&t(&[1, 1, 2], &[3.0, 1.0])), Some(&w)]).unwrap();
        assert!(r[0].as_f32().unwrap()[0].is_nan());
    }

    /// SiLU is `s / (1 + e^-s)`; channels-last input and state give the channels-first values
    /// transposed.
    #[test]
    fn silu_and_channels_last() {
        let n = node(
            "CausalConvWithState",
            &[("activation", s("swish"))],
            &["y", "p"],
        );
        let x = t(&[1, 2, 2], &[1.0, -2.0, 0.5, 3.0]);
        let w = t(&[2, 1, 2], &[1.0, 2.0, -1.0, 0.5]);
        let past = t(&[1, 2, 1], &[0.25, 4.0]);
        let first = run(&n, &[Some(&x), Some(&w), None, Some(&past)]).unwrap();
        let sums = [0.25 + 2.0, 1.0 - 4.0, -4.0 + 0.25, -0.5 + 1.5];
        let want: Vec<f32> = sums.iter().map(|&v: &f32| v / (1.0 + (-v).exp())).collect();
        assert_eq!(first[0].as_f32().unwrap(), want.as_slice());
        let n = node(
            "CausalConvWithState",
            &[
                ("activation", s("silu")),
                ("channels_last", Attribute::Int(1)),
            ],
            &["y", "p"],
        );
        let xl = t(&[1, 2, 2], &[1.0, 0.5, -2.0, 3.0]);
        let pl = t(&[1, 1, 2], &[0.25, 4.0]);
        let last = run(&n, &[Some(&xl), Some(&w), None, Some(&pl)]).unwrap();
        assert_eq!(
            last[0].as_f32().unwrap(),
            &[want[0], want[2], want[1], want[3]]
        );
        assert_eq!(last[1].shape(), &[1, 1, 2]);
        assert_eq!(last[1].as_f32().unwrap(), &[-2.0, 3.0]);
    }

    #[test]
    fn what_the_cpu_kernel_refuses_is_refused() {
        for (attr, v, what) in [
            ("ndim", 2, "ndim = 1"),
            ("state_window", 2, "CUDA only"),
            ("input_channels", 4, "CUDA only"),
            ("state_channels_last", 0, "CUDA only"),
            ("state_length", 6, "CUDA only"),
            ("dilation", 0, ">= 1"),
            ("channels_last", 2, "0 or 1"),
        ] {
            let mut n = node_with("CausalConvWithState", &[(attr, Attribute::Int(v))]);
            n.domain = MS_DOMAIN.into();
            let e = crate::ops::attrs::parse_node(&n, 1)
                .unwrap_err()
                .to_string();
            assert!(e.contains(attr) && e.contains(what), "{e}");
        }
        let n = node(
            "CausalConvWithState",
            &[("activation", s("relu"))],
            &["y", "p"],
        );
        let e = crate::ops::attrs::parse_node(&n, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("activation") && e.contains("'relu'"), "{e}");
        let n = node("CausalConvWithState", &[], &["y", "p", "u"]);
        let e = crate::ops::attrs::parse_node(&n, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("state_update output is CUDA only"), "{e}");
        // Shapes.
        let n = node("CausalConvWithState", &[], &["y", "p"]);
        let x = t(&[1, 2, 3], &[0.0; 6]);
        let e = |ins: &[Option<&Tensor>]| run(&n, ins).unwrap_err().0;
        let msg = e(&[Some(&x), Some(&t(&[3, 1, 2], &[0.0; 6]))]);
        assert!(msg.contains("weight [3, 1, 2]"), "{msg}");
        let msg = e(&[Some(&x), Some(&t(&[2, 1, 0], &[]))]);
        assert!(msg.contains("weight [2, 1, 0]"), "{msg}");
        let w = t(&[2, 1, 2], &[0.0; 4]);
        let msg = e(&[Some(&x), Some(&w), Some(&t(&[3], &[0.0; 3]))]);
        assert!(msg.contains("bias [3]"), "{msg}");
        let msg = e(&[Some(&x), Some(&w), None, Some(&t(&[1, 2, 2], &[0.0; 4]))]);
        assert!(
            msg.contains("past_state [1, 2, 2] must be [1, 2, 1]"),
            "{msg}"
        );
        let msg = e(&[Some(&t(&[2, 3], &[0.0; 6])), Some(&w)]);
        assert!(msg.contains("input [2, 3]"), "{msg}");
    }

    /// An empty input keeps the past as the state; K = 1 has no state.
    #[test]
    fn empty_sequences_and_stateless_kernels() {
        let n = node("CausalConvWithState", &[], &["y", "p"]);
        let w = t(&[1, 1, 3], &[1.0, 1.0, 1.0]);
        let past = t(&[1, 1, 2], &[7.0, 8.0]);
        let r = run(
            &n,
            &[Some(&t(&[1, 1, 0], &[])), Some(&w), None, Some(&past)],
        )
        .unwrap();
        assert_eq!(r[0].shape(), &[1, 1, 0]);
        assert_eq!(r[1].as_f32().unwrap(), &[7.0, 8.0]);
        let w1 = t(&[1, 1, 1], &[2.0]);
        let r = run(&n, &[Some(&t(&[1, 1, 2], &[1.0, 2.0])), Some(&w1)]).unwrap();
        assert_eq!(r[0].as_f32().unwrap(), &[2.0, 4.0]);
        assert_eq!(r[1].shape(), &[1, 1, 0]);
    }

    /// Packed sequences never read across their boundary; each continues its own state; an
    /// empty sequence keeps its state; the capture holds each sequence's first tokens.
    #[test]
    fn varlen_sequences_are_independent() {
        let n = node(
            "VarlenCausalConvWithState",
            &[("state_update_capacity", Attribute::Int(2))],
            &["y", "f", "u"],
        );
        // Two channels; sequences of 2, 0 and 1 tokens.
        let x = t(&[3, 2], &[1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
        let w = t(&[2, 1, 2], &[1.0, 1.0, 1.0, -1.0]);
        let cu = i32s(&[0, 2, 2, 3]);
        let st = t(&[3, 2, 1], &[0.5, 5.0, 0.25, 2.5, 0.125, 1.25]);
        let cc = i32s(&[5, 1, -1]);
        let r = run(
            &n,
            &[Some(&x), Some(&w), Some(&cu), None, Some(&st), Some(&cc)],
        )
        .unwrap();
        // channel 0: seq0 [0.5|1,2] → 1.5, 3; seq2 [0.125|3] → 3.125
        // channel 1 (w = 1, -1): seq0 [5|10,20] → -5, -10; seq2 [1.25|30] → -28.75
        assert_eq!(
            r[0].as_f32().unwrap(),
            &[1.5, -5.0, 3.0, -10.0, 3.125, -28.75]
        );
        assert_eq!(r[1].as_f32().unwrap(), &[2.0, 20.0, 0.25, 2.5, 3.0, 30.0]);
        assert_eq!(r[2].shape(), &[3, 2, 2]);
        assert_eq!(
            r[2].as_f32().unwrap(),
            &[1.0, 10.0, 2.0, 20.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
        // Without a capacity, a requested capture is empty ([N, 0, C]), as in ORT.
        let n = node("VarlenCausalConvWithState", &[], &["y", "f", "u"]);
        let r = run(&n, &[Some(&x), Some(&w), Some(&cu), None, Some(&st)]).unwrap();
        assert_eq!(r[2].shape(), &[3, 0, 2]);
    }

    #[test]
    fn varlen_refusals_name_the_input() {
        let n = node("VarlenCausalConvWithState", &[], &["y", "f"]);
        let x = t(&[3, 1], &[1.0, 2.0, 3.0]);
        let w = t(&[1, 1, 2], &[1.0, 1.0]);
        let st = t(&[1, 1, 1], &[0.0]);
        let cu = i32s;
        let e = |ins: &[Option<&Tensor>]| run(&n, ins).unwrap_err().0;
        for bad in [&[1, 3][..], &[0, 2], &[0]] {
            let c = cu(bad);
            let msg = e(&[Some(&x), Some(&w), Some(&c), None, Some(&st)]);
            assert!(msg.contains("cumulative_sequence_length"), "{msg}");
        }
        let c2 = cu(&[0, 3, 2]);
        let st2 = t(&[2, 1, 1], &[0.0, 0.0]);
        let msg = e(&[Some(&x), Some(&w), Some(&c2), None, Some(&st2)]);
        assert!(msg.contains("not fall"), "{msg}");
        let c = cu(&[0, 3]);
        let msg = e(&[Some(&x), Some(&w), Some(&c), None, Some(&st2)]);
        assert!(msg.contains("initial_state [2, 1, 1]"), "{msg}");
        let msg = e(&[Some(&x), Some(&w), Some(&c), None, None]);
        assert!(msg.contains("initial_state is required"), "{msg}");
        let cc = i32s(&[1]);
        let msg = e(&[Some(&x), Some(&w), Some(&c), None, Some(&st), Some(&cc)]);
        assert!(msg.contains("capture_count must be given exactly"), "{msg}");
        let kd = t(&[3, 2, 1], &[0.0; 6]);
        let msg = e(&[
            Some(&x),
            Some(&w),
            Some(&c),
            None,
            Some(&st),
            None,
            Some(&kd),
            Some(&t(&[3, 1], &[1.0; 3])),
        ]);
        assert!(msg.contains("kernel_delta"), "{msg}");
        for (attr, v) in [
            ("state_update_capacity", 9),
            ("group_size", 2),
            ("dilation", 0),
        ] {
            let mut n = node_with("VarlenCausalConvWithState", &[(attr, Attribute::Int(v))]);
            n.domain = MS_DOMAIN.into();
            let e = crate::ops::attrs::parse_node(&n, 1)
                .unwrap_err()
                .to_string();
            assert!(e.contains(attr), "{e}");
        }
    }
}
