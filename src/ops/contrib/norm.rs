//! Residual layer normalizations ONNX Runtime's transformer optimizer fuses: com.microsoft
//! SkipLayerNormalization and SkipSimplifiedLayerNormalization (`s = input + skip + bias`,
//! then LayerNorm or RMS norm of `s` over the last axis), and SimplifiedLayerNormalization
//! (RMS norm over `axis..`), which ONNX Runtime registers in the *default* domain.
//!
//! Float32 inputs are normalized as ONNX Runtime's CPU kernels do it, bit for bit
//! (`ops::ort_norm`: Skip… in f32 in order, Welford's recurrence for the full form;
//! SimplifiedLayerNormalization through MLAS's AVX2 kernel); float16/bfloat16 ones with f64
//! statistics of the f32 values. Optional outputs follow ONNX Runtime's CPU kernel (contrib_ops/cpu/skip_layer_norm.cc): `mean` and `inv_std_var` have
//! the input's shape with the last axis 1 — the simplified form writes a mean of 0, as ONNX
//! Runtime does, since it never computes one — and `input_skip_bias_sum` is `s`.

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::ort_norm;
use super::super::shape::{fact, FactsResult};
use super::super::util::{broadcast_to, float_values, in_dtype, input, norm_axis, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::{check_bias, MS_DOMAIN};
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::tensor::{DType, Tensor};
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    // gamma/beta (and SimplifiedLayerNormalization's scale) are typed T with the input in
    // ONNX Runtime's schemas: a float16 layer reads them in float16, as LayerNormalization's.
    use InputRole::{Bias, Data};
    r.add_in(MS_DOMAIN, "SkipLayerNormalization", |c, i| {
        skip_norm(c, i, false)
    })
    .parse(|n, _| boxed(Attrs::new(n).float_or("epsilon", 1e-12)))
    .roles(&[Data, Data, Data, Data, Bias])
    .infer(skip_norm_facts);
    r.add_in(MS_DOMAIN, "SkipSimplifiedLayerNormalization", |c, i| {
        skip_norm(c, i, true)
    })
    .parse(|n, _| boxed(Attrs::new(n).float_or("epsilon", 1e-12)))
    .roles(&[Data, Data, Data, Bias])
    .infer(skip_norm_facts);
    r.add("SimplifiedLayerNormalization", simplified_norm)
        .parse(|n, _| boxed(SimplifiedAttrs::parse(n)))
        .roles(&[Data, Data])
        .infer(simplified_facts);
}

/// One row normalized in place: `(x - mean) · inv` (or `x · inv` for RMS), then `· gamma
/// (+ beta)`; returns (mean, inv) — mean 0 for RMS.
fn normalize_row(
    row: &mut [f32],
    rms: bool,
    eps: f64,
    gamma: &[f32],
    beta: Option<&[f32]>,
) -> (f32, f32) {
    let n = row.len() as f64;
    let mean = if rms {
        0.0
    } else {
        row.iter().map(|&x| x as f64).sum::<f64>() / n
    };
    let var = row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for (i, x) in row.iter_mut().enumerate() {
        let mut y = ((*x as f64 - mean) * inv) as f32 * gamma[i];
        if let Some(b) = beta {
            y += b[i];
        }
        *x = y;
    }
    (mean as f32, inv as f32)
}

/// The shape of `mean`/`inv_std_var`: `x`'s with every axis from `axis` on 1.
fn stats_shape(x: &[usize], axis: usize) -> Vec<usize> {
    x.iter()
        .enumerate()
        .map(|(i, &d)| if i < axis { d } else { 1 })
        .collect()
}

fn skip_norm(ctx: &OpCtx, inputs: &[Option<&Tensor>], rms: bool) -> OpResult {
    let eps = *ctx.attrs::<f32>()? as f64;
    let (x, skip, gamma) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let (beta, bias) = if rms {
        (None, opt_input(inputs, 3))
    } else {
        (opt_input(inputs, 3), opt_input(inputs, 4))
    };
    let shape = x.shape();
    if !(2..=3).contains(&shape.len()) {
        return Err(OpError(format!(
            "input {shape:?} must be 3-D [batch, sequence, hidden] or 2-D [tokens, hidden]"
        )));
    }
    // skip is the input's shape, or one batch of it ([1, S, H] or [S, H]) that every batch adds.
    let per_batch: usize = shape[shape.len() - 2..].iter().product();
    let skip_ok = skip.shape() == shape
        || (skip.len() == per_batch && skip.shape().ends_with(&shape[shape.len() - 2..]));
    if !skip_ok {
        return Err(OpError(format!(
            "skip {:?} must be the input's shape {shape:?} or one batch of it",
            skip.shape()
        )));
    }
    let h = check_bias(shape, gamma.shape(), "gamma")?;
    let g = float_values(gamma, "gamma")?;
    let b = beta
        .map(|t| check_bias(shape, t.shape(), "beta").and(float_values(t, "beta")))
        .transpose()?;
    let bias = bias
        .map(|t| check_bias(shape, t.shape(), "bias").and(float_values(t, "bias")))
        .transpose()?;
    let mut sum = float_values(x, "input")?;
    let sk = float_values(skip, "skip")?;
    // Per batch (skip is one batch, or as long as the input: then one chunk), `input + skip`,
    // then `+ bias` per row: the same two additions per value in the same order.
    sum.par_chunks_mut(sk.len().max(1)).for_each(|batch| {
        batch.iter_mut().zip(sk.iter()).for_each(|(s, k)| *s += k);
        if let (Some(bias), true) = (&bias, h > 0) {
            for row in batch.chunks_mut(h) {
                row.iter_mut().zip(bias.iter()).for_each(|(s, b)| *s += b);
            }
        }
    });
    let mut y = sum.clone();
    let exact = x.dtype() == DType::F32;
    let stats: Vec<(f32, f32)> = if h == 0 {
        Vec::new()
    } else if exact {
        y.par_chunks_mut(h)
            .map(|row| ort_norm::skip_norm_row(row, &g, b.as_deref(), eps as f32, rms))
            .collect()
    } else {
        y.par_chunks_mut(h)
            .map(|row| normalize_row(row, rms, eps, &g, b.as_deref()))
            .collect()
    };
    let (mean, inv): (Vec<f32>, Vec<f32>) = stats.into_iter().unzip();
    let st = stats_shape(shape, shape.len() - 1);
    Ok(vec![
        in_dtype(Tensor::from_f32(shape.to_vec(), y), x.dtype()),
        Tensor::from_f32(st.clone(), mean),
        Tensor::from_f32(st, inv),
        in_dtype(Tensor::from_f32(shape.to_vec(), sum), x.dtype()),
    ])
}

fn skip_norm_facts(_: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let stats = x.shape.as_ref().map(|s| {
        let mut st = s.clone();
        if let Some(last) = st.last_mut() {
            *last = DimFact::known(1);
        }
        st
    });
    Ok(vec![
        Fact::new(x.dtype, x.shape.clone()),
        Fact::new(Some(DType::F32), stats.clone()),
        Fact::new(Some(DType::F32), stats),
        Fact::new(x.dtype, x.shape.clone()),
    ])
}

/// SimplifiedLayerNormalization's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct SimplifiedAttrs {
    pub axis: i64,
    pub epsilon: f32,
}

impl SimplifiedAttrs {
    fn parse(node: &Node) -> Result<SimplifiedAttrs, AttrError> {
        let a = Attrs::new(node);
        let stash = a.int_or("stash_type", 1)?;
        if stash != 1 {
            return Err(AttrError::new(
                "stash_type",
                format!("{stash} is not supported (only 1, float32)"),
            ));
        }
        Ok(SimplifiedAttrs {
            axis: a.int_or("axis", -1)?,
            epsilon: a.float_or("epsilon", 1e-5)?,
        })
    }
}

/// `X / sqrt(mean(X², axes axis..) + epsilon) · scale`, and `inv_std_var`.
fn simplified_norm(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<SimplifiedAttrs>()?;
    let (x, scale) = (input(inputs, 0)?, input(inputs, 1)?);
    let axis = norm_axis(attrs.axis, x.rank())?;
    let inner = &x.shape()[axis..];
    let width: usize = inner.iter().product();
    if super::super::util::broadcast_shapes(&[scale.shape(), inner])
        .ok()
        .as_deref()
        != Some(inner)
    {
        return Err(OpError(format!(
            "scale {:?} does not broadcast to the normalized dimensions {inner:?}",
            scale.shape()
        )));
    }
    let s = broadcast_to(&float_values(scale, "scale")?, scale.shape(), inner);
    let mut v = float_values(x, "X")?;
    let inv: Vec<f32> = if x.dtype() == DType::F32 {
        super::super::norm::ort_rows(&mut v, width, &s, None, attrs.epsilon, true).1
    } else if width == 0 {
        Vec::new()
    } else {
        v.par_chunks_mut(width)
            .map(|row| normalize_row(row, true, attrs.epsilon as f64, &s, None).1)
            .collect()
    };
    Ok(vec![
        in_dtype(Tensor::from_f32(x.shape().to_vec(), v), x.dtype()),
        Tensor::from_f32(stats_shape(x.shape(), axis), inv),
    ])
}

fn simplified_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let attrs = ctx.attrs::<SimplifiedAttrs>()?;
    let stats = x
        .shape
        .as_ref()
        .map(|s| super::super::norm::stats_dims(s, attrs.axis))
        .transpose()?;
    Ok(vec![
        Fact::new(x.dtype, x.shape.clone()),
        Fact::new(Some(DType::F32), stats),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node;

    fn run(domain: &str, op: &str, ins: &[Option<&Tensor>]) -> OpResult {
        let mut n = node("n", op, &[], &["y"]);
        n.domain = domain.into();
        let k = Registry::global().get(domain, op).unwrap();
        k(&OpCtx::new(&n, 1), ins)
    }

    #[test]
    fn skip_layer_norm_normalizes_the_sum() {
        let x = Tensor::from_f32(vec![1, 2, 2], vec![1.0, 3.0, 0.0, 0.0]);
        let skip = Tensor::from_f32(vec![2, 2], vec![1.0, 1.0, 0.0, 4.0]);
        let gamma = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
        let beta = Tensor::from_f32(vec![2], vec![0.5, 0.5]);
        let out = run(
            MS_DOMAIN,
            "SkipLayerNormalization",
            &[Some(&x), Some(&skip), Some(&gamma), Some(&beta)],
        )
        .unwrap();
        // Row sums: (2, 4) mean 3, std 1; (0, 4) mean 2, std 2.
        let y = out[0].as_f32().unwrap();
        let want = [-0.5f32, 2.5, -0.5, 2.5];
        assert!(
            y.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-5),
            "{y:?}"
        );
        assert_eq!(out[1].shape(), &[1, 2, 1]);
        assert_eq!(out[1].as_f32().unwrap(), &[3.0, 2.0]);
        assert_eq!(out[3].as_f32().unwrap(), &[2.0, 4.0, 0.0, 4.0]);
        let rms = run(
            MS_DOMAIN,
            "SkipSimplifiedLayerNormalization",
            &[Some(&x), Some(&skip), Some(&gamma)],
        )
        .unwrap();
        // RMS of (2, 4) is sqrt(10).
        let r = 10f32.sqrt();
        let y = rms[0].as_f32().unwrap();
        assert!((y[0] - 2.0 / r).abs() < 1e-6 && (y[1] - 8.0 / r).abs() < 1e-6);
        assert_eq!(rms[1].as_f32().unwrap(), &[0.0, 0.0]);
        // Two batches, one batch of skip that both add, and a bias: sum = input + skip + bias.
        let x = Tensor::from_f32(vec![2, 2, 2], vec![1.0, 3.0, 0.0, 0.0, 2.0, 2.0, -1.0, 5.0]);
        let bias = Tensor::from_f32(vec![2], vec![0.25, -0.5]);
        let out = run(
            MS_DOMAIN,
            "SkipLayerNormalization",
            &[
                Some(&x),
                Some(&skip),
                Some(&gamma),
                Some(&beta),
                Some(&bias),
            ],
        )
        .unwrap();
        let want = [2.25f32, 3.5, 0.25, 3.5, 3.25, 2.5, -0.75, 8.5];
        assert_eq!(out[3].as_f32().unwrap(), &want);
        assert_eq!(out[3].shape(), &[2, 2, 2]);
    }

    #[test]
    fn bad_skip_and_gamma_are_named() {
        let x = Tensor::from_f32(vec![1, 2, 2], vec![0.0; 4]);
        let g = Tensor::from_f32(vec![2], vec![1.0; 2]);
        let bad = Tensor::from_f32(vec![1, 3], vec![0.0; 3]);
        let e = run(
            MS_DOMAIN,
            "SkipLayerNormalization",
            &[Some(&x), Some(&bad), Some(&g)],
        )
        .unwrap_err();
        assert!(e.0.contains("skip [1, 3]"), "{e}");
        let e = run(
            MS_DOMAIN,
            "SkipLayerNormalization",
            &[Some(&x), Some(&x), Some(&bad)],
        )
        .unwrap_err();
        assert!(e.0.contains("gamma [1, 3]"), "{e}");
    }

    #[test]
    fn simplified_layer_norm_is_rms_norm_with_its_inverse() {
        let x = Tensor::from_f32(vec![2, 2], vec![3.0, 4.0, 0.0, 0.0]);
        let s = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
        let out = run("", "SimplifiedLayerNormalization", &[Some(&x), Some(&s)]).unwrap();
        let r = (12.5f64 + 1e-5).sqrt();
        let y = out[0].as_f32().unwrap();
        assert!((y[0] as f64 - 3.0 / r).abs() < 1e-6 && (y[1] as f64 - 8.0 / r).abs() < 1e-6);
        assert_eq!(y[2], 0.0);
        assert_eq!(out[1].shape(), &[2, 1]);
        assert!((out[1].as_f32().unwrap()[0] as f64 - 1.0 / r).abs() < 1e-6);
    }
}
