//! com.microsoft fused activations: Gelu, FastGelu, BiasGelu, QuickGelu, and BiasAdd, as
//! ONNX Runtime's CPU kernels compute them (contrib_ops/cpu/activations.h, bert/bias_gelu.cc,
//! bert/fast_gelu.cc, diffusion/bias_add.cc). The bias of BiasGelu and FastGelu is 1-D along
//! the last axis and added first, in f32.

use super::super::attrs::{boxed, Attrs};
use super::super::shape::same_as_input;
use super::super::util::{float_values, in_dtype, input, opt_input};
use super::super::{OpCtx, OpError, OpResult, Registry};
use super::{check_bias, MS_DOMAIN};
use crate::tensor::Tensor;
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    r.add_in(MS_DOMAIN, "Gelu", |_, i| {
        with_bias(i, None, "bias", erf_gelu)
    })
    .infer(same_as_input);
    r.add_in(MS_DOMAIN, "BiasGelu", |_, i| {
        with_bias(i, Some(input(i, 1)?), "B", erf_gelu)
    })
    .infer(same_as_input);
    r.add_in(MS_DOMAIN, "FastGelu", |_, i| {
        with_bias(i, opt_input(i, 1), "bias", tanh_gelu)
    })
    .infer(same_as_input);
    r.add_in(MS_DOMAIN, "QuickGelu", quick_gelu)
        .parse(|n, _| boxed(Attrs::new(n).float_or("alpha", 1.702)))
        .infer(same_as_input);
    r.add_in(MS_DOMAIN, "BiasAdd", bias_add)
        .infer(same_as_input);
}

use super::super::logistic::{gelu_erf as erf_gelu, gelu_tanh as tanh_gelu, map_in_place};

/// Applies `f` to input 0 plus the optional 1-D `bias` (along the last axis), elementwise.
fn with_bias(
    inputs: &[Option<&Tensor>],
    bias: Option<&Tensor>,
    bias_name: &str,
    f: impl Fn(f32) -> f32 + Sync,
) -> OpResult {
    let x = input(inputs, 0)?;
    let mut v = float_values(x, "X")?;
    if let Some(b) = bias {
        let c = check_bias(x.shape(), b.shape(), bias_name)?;
        let bv = float_values(b, bias_name)?;
        if c > 0 {
            v.par_chunks_mut(c).for_each(|row| {
                row.iter_mut().zip(&bv).for_each(|(x, b)| *x += b);
            });
        }
    }
    // Bias first, then the activation through the vector loop.
    map_in_place(&mut v, &f);
    Ok(vec![in_dtype(
        Tensor::from_f32(x.shape().to_vec(), v),
        x.dtype(),
    )])
}

/// `x·sigmoid(alpha·x)`.
fn quick_gelu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let alpha = *ctx.attrs::<f32>()?;
    let x = input(inputs, 0)?;
    let mut v = float_values(x, "X")?;
    // ORT scales, takes MLAS's logistic of the whole buffer, then multiplies by x.
    let mut s: Vec<f32> = v.iter().map(|&x| alpha * x).collect();
    super::super::logistic::logistic_in_place(&mut s);
    v.iter_mut().zip(&s).for_each(|(x, s)| *x *= s);
    Ok(vec![in_dtype(
        Tensor::from_f32(x.shape().to_vec(), v),
        x.dtype(),
    )])
}

/// `X + bias + skip`: X and skip [N, S, C], bias [C].
fn bias_add(_: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let (x, bias, skip) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    if x.rank() != 3 || skip.shape() != x.shape() {
        return Err(OpError(format!(
            "X {:?} and skip {:?} must be the same 3-D shape [N, S, C]",
            x.shape(),
            skip.shape()
        )));
    }
    let c = check_bias(x.shape(), bias.shape(), "bias")?;
    let mut v = float_values(x, "X")?;
    let (bv, sv) = (float_values(bias, "bias")?, float_values(skip, "skip")?);
    if c > 0 {
        v.par_chunks_mut(c)
            .zip(sv.par_chunks(c))
            .for_each(|(row, skip)| {
                for ((x, b), s) in row.iter_mut().zip(&bv).zip(skip) {
                    *x = *x + b + s;
                }
            });
    }
    Ok(vec![in_dtype(
        Tensor::from_f32(x.shape().to_vec(), v),
        x.dtype(),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node;

    fn run(op: &str, ins: &[&Tensor]) -> Result<Tensor, OpError> {
        let mut n = node("n", op, &[], &["y"]);
        n.domain = MS_DOMAIN.into();
        let k = Registry::global().get(MS_DOMAIN, op).unwrap();
        let ins: Vec<Option<&Tensor>> = ins.iter().map(|t| Some(*t)).collect();
        Ok(k(&OpCtx::new(&n, 1), &ins)?.remove(0))
    }

    #[test]
    fn gelus_match_their_formulas_in_f64() {
        let xs = [-3.0f32, -0.5, 0.0, 0.7, 2.5];
        let x = Tensor::from_f32(vec![5], xs.to_vec());
        let gelu = run("Gelu", &[&x]).unwrap();
        let fast = run("FastGelu", &[&x]).unwrap();
        let quick = run("QuickGelu", &[&x]).unwrap();
        for (i, &v) in xs.iter().enumerate() {
            let v = v as f64;
            let erf = 0.5 * v * (1.0 + libm::erf(v / 2f64.sqrt()));
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let tanh = 0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh());
            let q = v / (1.0 + (-1.702 * v).exp());
            assert!((gelu.as_f32().unwrap()[i] as f64 - erf).abs() < 1e-6);
            assert!((fast.as_f32().unwrap()[i] as f64 - tanh).abs() < 1e-6);
            assert!((quick.as_f32().unwrap()[i] as f64 - q).abs() < 1e-6);
        }
        let nan = Tensor::from_f32(vec![1], vec![f32::NAN]);
        assert!(run("Gelu", &[&nan]).unwrap().as_f32().unwrap()[0].is_nan());
    }

    #[test]
    fn biases_are_added_along_the_last_axis() {
        let x = Tensor::from_f32(vec![2, 2], vec![0.0, 1.0, 2.0, 3.0]);
        let b = Tensor::from_f32(vec![2], vec![10.0, 20.0]);
        let y = run("BiasGelu", &[&x, &b]).unwrap();
        let want: Vec<f32> = [10.0f32, 21.0, 12.0, 23.0]
            .iter()
            .map(|&v| erf_gelu(v))
            .collect();
        assert_eq!(y.as_f32().unwrap(), want.as_slice());
        let x3 = Tensor::from_f32(vec![1, 2, 2], vec![0.0, 1.0, 2.0, 3.0]);
        let y = run("BiasAdd", &[&x3, &b, &x3]).unwrap();
        assert_eq!(y.as_f32().unwrap(), &[10.0, 22.0, 14.0, 26.0]);
        let e = run("BiasGelu", &[&x, &Tensor::from_f32(vec![3], vec![0.0; 3])]).unwrap_err();
        assert!(e.0.contains("B [3]"), "{e}");
        let e = run("BiasAdd", &[&x3, &b, &x]).unwrap_err();
        assert!(e.0.contains("skip"), "{e}");
    }
}
