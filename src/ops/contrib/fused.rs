//! com.microsoft FusedConv and FusedMatMul, the fusions ONNX Runtime's graph optimizer saves
//! into optimized models.
//!
//! FusedConv is Conv plus an optional residual `Z` and an activation in one kernel:
//! `Y = activation(Conv(X, W, B) + Z)` (ONNX Runtime's Conv<float> writes `Z` into the output
//! and accumulates onto it, then applies the MLAS activation). The activations are those of
//! contrib_ops/cpu/fused_activation.cc: Relu, Silu, Tanh, Sigmoid, LeakyRelu (alpha), Clip
//! (min, max), HardSigmoid (alpha, beta), their parameters in `activation_params`.
//!
//! FusedMatMul is `alpha · A' × B'` with NumPy broadcasting, where `transBatchX` first moves
//! X's leading axis behind the other batch axes (`[d0, d1.., M, K]` → `[d1.., d0, M, K]`
//! read as `[d1.., d0·…]`, i.e. the permutation `[1, .., r-2, 0, r-1]`) and `transX` then
//! swaps the last two axes — checked against ONNX Runtime.

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::conv::{conv, conv_facts, conv_flops, ConvAttrs};
use super::super::matmul::{matmul, matmul_facts, permute};
use super::super::shape::{fact, FactsResult};
use super::super::util::{float_values, in_dtype, input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::tensor::Tensor;
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    use InputRole::{Bias, Data};
    r.add_in(MS_DOMAIN, "FusedConv", fused_conv)
        .parse(|n, _| {
            FusedActivation::parse(n)?;
            boxed(ConvAttrs::parse_node(n))
        })
        .roles(&[Data, Data, Bias, Data])
        .infer(conv_facts)
        .flops(conv_flops);
    r.add_in(MS_DOMAIN, "FusedMatMul", fused_matmul)
        .parse(|n, _| boxed(FusedMatMulAttrs::parse(n)))
        .infer(fused_matmul_facts)
        .flops(fused_matmul_flops);
}

/// The activation a fused kernel applies to its output, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FusedActivation {
    Identity,
    Relu,
    Silu,
    Tanh,
    Sigmoid,
    LeakyRelu { alpha: f32 },
    Clip { min: f32, max: f32 },
    HardSigmoid { alpha: f32, beta: f32 },
}

impl FusedActivation {
    /// The `activation` and `activation_params` attributes (no activation: identity).
    pub fn parse(node: &Node) -> Result<FusedActivation, AttrError> {
        let a = Attrs::new(node);
        let Some(name) = a.string("activation")? else {
            return Ok(FusedActivation::Identity);
        };
        let params = |n: usize| -> Result<Vec<f32>, AttrError> {
            let p = a.floats("activation_params")?.unwrap_or_default();
            if p.len() != n {
                return Err(AttrError::new(
                    "activation_params",
                    format!("{name} takes {n} parameters, got {}", p.len()),
                ));
            }
            Ok(p)
        };
        Ok(match name {
            "Relu" => FusedActivation::Relu,
            "Silu" => FusedActivation::Silu,
            "Tanh" => FusedActivation::Tanh,
            "Sigmoid" => FusedActivation::Sigmoid,
            "LeakyRelu" => FusedActivation::LeakyRelu {
                alpha: params(1)?[0],
            },
            "Clip" => {
                let p = params(2)?;
                FusedActivation::Clip {
                    min: p[0],
                    max: p[1],
                }
            }
            "HardSigmoid" => {
                let p = params(2)?;
                FusedActivation::HardSigmoid {
                    alpha: p[0],
                    beta: p[1],
                }
            }
            other => {
                return Err(AttrError::new(
                    "activation",
                    format!(
                        "'{other}' is not one of Relu, Silu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid"
                    ),
                ))
            }
        })
    }

    /// The activation of one value; NaN propagates.
    pub fn apply(self, x: f32) -> f32 {
        use super::super::elementwise::{relu, sigmoid};
        match self {
            FusedActivation::Identity => x,
            FusedActivation::Relu => relu(x),
            FusedActivation::Silu => x * sigmoid(x),
            FusedActivation::Tanh => x.tanh(),
            FusedActivation::Sigmoid => super::super::logistic::logistic(x),
            FusedActivation::LeakyRelu { alpha } => {
                if x < 0.0 {
                    alpha * x
                } else {
                    x
                }
            }
            FusedActivation::Clip { min, max } => {
                if x.is_nan() {
                    x
                } else {
                    x.max(min).min(max)
                }
            }
            FusedActivation::HardSigmoid { alpha, beta } => {
                let y = alpha * x + beta;
                if y.is_nan() {
                    y
                } else {
                    y.clamp(0.0, 1.0)
                }
            }
        }
    }
}

/// `activation(Conv(X, W, B) + Z)`.
fn fused_conv(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<ConvAttrs>()?;
    let act = FusedActivation::parse(ctx.node).map_err(|e| OpError(e.to_string()))?;
    let x = input(inputs, 0)?;
    let y = conv(
        ctx,
        attrs,
        x,
        input(inputs, 1)?,
        opt_input(inputs, 2),
        None,
        None,
        ctx.prepacked(1),
    )?;
    let mut v = float_values(&y, "Y")?;
    if let Some(z) = opt_input(inputs, 3) {
        if z.shape() != y.shape() {
            return Err(OpError(format!(
                "Z {:?} must have the convolution's output shape {:?}",
                z.shape(),
                y.shape()
            )));
        }
        let zv = float_values(z, "Z")?;
        v.par_iter_mut().zip(&zv).for_each(|(y, z)| *y += z);
    }
    if act != FusedActivation::Identity {
        v.par_iter_mut().for_each(|y| *y = act.apply(*y));
    }
    Ok(vec![in_dtype(
        Tensor::from_f32(y.shape().to_vec(), v),
        x.dtype(),
    )])
}

/// FusedMatMul's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedMatMulAttrs {
    pub alpha: f32,
    pub trans_a: bool,
    pub trans_b: bool,
    pub trans_batch_a: bool,
    pub trans_batch_b: bool,
}

impl FusedMatMulAttrs {
    fn parse(node: &Node) -> Result<FusedMatMulAttrs, AttrError> {
        let a = Attrs::new(node);
        Ok(FusedMatMulAttrs {
            alpha: a.float_or("alpha", 1.0)?,
            trans_a: a.flag("transA", false)?,
            trans_b: a.flag("transB", false)?,
            trans_batch_a: a.flag("transBatchA", false)?,
            trans_batch_b: a.flag("transBatchB", false)?,
        })
    }

    /// The axis permutation operand `a` (0) or `b` (1) of rank `rank` goes through before
    /// the product; an error when a batch transpose meets an operand of rank < 3.
    fn perm(&self, operand: usize, rank: usize) -> Result<Vec<usize>, OpError> {
        let (batch, last) = match operand {
            0 => (self.trans_batch_a, self.trans_a),
            _ => (self.trans_batch_b, self.trans_b),
        };
        let mut p: Vec<usize> = (0..rank).collect();
        if batch {
            if rank < 3 {
                return Err(OpError(format!(
                    "transBatch{} needs an operand of rank >= 3, got rank {rank}",
                    ["A", "B"][operand]
                )));
            }
            p = (1..rank - 1).chain([0, rank - 1]).collect();
        }
        if last && rank >= 2 {
            p.swap(rank - 2, rank - 1);
        }
        Ok(p)
    }
}

fn fused_matmul(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<FusedMatMulAttrs>()?;
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    let operand = |t: &Tensor, k: usize, what: &str| -> Result<Tensor, OpError> {
        let f = Tensor::from_f32(t.shape().to_vec(), float_values(t, what)?);
        Ok(permute(&f, &attrs.perm(k, t.rank())?))
    };
    let y = matmul(ctx.accumulate, &operand(a, 0, "A")?, &operand(b, 1, "B")?)?;
    let mut v = float_values(&y, "Y")?;
    if attrs.alpha != 1.0 {
        v.par_iter_mut().for_each(|y| *y *= attrs.alpha);
    }
    Ok(vec![in_dtype(
        Tensor::from_f32(y.shape().to_vec(), v),
        a.dtype(),
    )])
}

/// Two per multiply-add: the output's elements times the shared dimension K (A's last axis
/// after its permutation).
fn fused_matmul_flops(node: &Node, ins: &[Option<Vec<usize>>], outs: &[Vec<usize>]) -> u64 {
    let out = outs
        .first()
        .map_or(0, |s| s.iter().product::<usize>() as u64);
    let k = ins.first().cloned().flatten().and_then(|a| {
        let attrs = super::super::attrs::opset_free::<FusedMatMulAttrs>(node)?;
        let p = attrs.perm(0, a.len()).ok()?;
        Some(a[*p.last()?] as u64)
    });
    2 * out * k.unwrap_or(0)
}

/// MatMul's rule on the permuted operand facts.
fn fused_matmul_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let attrs = ctx.attrs::<FusedMatMulAttrs>()?;
    let permuted = |k: usize| -> Result<Fact, OpError> {
        let f = fact(ins, k)?;
        Ok(match &f.shape {
            Some(s) => {
                let p = attrs.perm(k, s.len())?;
                let dims: Vec<DimFact> = p.iter().map(|&i| s[i].clone()).collect();
                Fact::new(f.dtype, Some(dims))
            }
            None => f.clone(),
        })
    };
    let (a, b) = (permuted(0)?, permuted(1)?);
    matmul_facts(ctx, &[Some(&a), Some(&b)])
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

    #[test]
    fn activations_follow_mlas() {
        let leaky = FusedActivation::LeakyRelu { alpha: 0.1 };
        assert_eq!(leaky.apply(-2.0), -0.2);
        assert_eq!(leaky.apply(3.0), 3.0);
        let clip = FusedActivation::Clip { min: 0.0, max: 6.0 };
        assert_eq!((clip.apply(-1.0), clip.apply(7.0)), (0.0, 6.0));
        assert!(clip.apply(f32::NAN).is_nan());
        let hs = FusedActivation::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        };
        assert_eq!(
            (hs.apply(-10.0), hs.apply(0.0), hs.apply(10.0)),
            (0.0, 0.5, 1.0)
        );
        assert!(FusedActivation::Relu.apply(f32::NAN).is_nan());
    }

    #[test]
    fn bad_activations_are_named() {
        let n = ms_node(
            "FusedConv",
            &[("activation", Attribute::String("Gelu".into()))],
        );
        let e = FusedActivation::parse(&n).unwrap_err().to_string();
        assert!(e.contains("activation") && e.contains("Gelu"), "{e}");
        let n = ms_node(
            "FusedConv",
            &[
                ("activation", Attribute::String("Clip".into())),
                ("activation_params", Attribute::Floats(vec![0.0])),
            ],
        );
        let e = FusedActivation::parse(&n).unwrap_err().to_string();
        assert!(
            e.contains("activation_params") && e.contains("2 parameters"),
            "{e}"
        );
    }

    /// A 1x1 convolution plus Z through Relu, against the arithmetic by hand.
    #[test]
    fn fused_conv_adds_z_before_the_activation() {
        let n = ms_node(
            "FusedConv",
            &[("activation", Attribute::String("Relu".into()))],
        );
        let x = Tensor::from_f32(vec![1, 1, 1, 3], vec![1.0, -2.0, 3.0]);
        let w = Tensor::from_f32(vec![1, 1, 1, 1], vec![2.0]);
        let b = Tensor::from_f32(vec![1], vec![0.5]);
        let z = Tensor::from_f32(vec![1, 1, 1, 3], vec![1.0, 1.0, -10.0]);
        let k = Registry::global().get(MS_DOMAIN, "FusedConv").unwrap();
        let y = k(
            &OpCtx::new(&n, 1),
            &[Some(&x), Some(&w), Some(&b), Some(&z)],
        )
        .unwrap();
        // 2x + 0.5 + z = 3.5, -2.5, -3.5 → relu.
        assert_eq!(y[0].as_f32().unwrap(), &[3.5, 0.0, 0.0]);
        let bad = Tensor::from_f32(vec![1, 1, 1, 2], vec![0.0; 2]);
        let e = k(
            &OpCtx::new(&n, 1),
            &[Some(&x), Some(&w), Some(&b), Some(&bad)],
        )
        .unwrap_err();
        assert!(e.0.contains("Z [1, 1, 1, 2]"), "{e}");
    }

    #[test]
    fn fused_matmul_transposes_batches_then_matrices() {
        let n = ms_node(
            "FusedMatMul",
            &[
                ("transBatchA", Attribute::Int(1)),
                ("transB", Attribute::Int(1)),
                ("alpha", Attribute::Float(0.5)),
            ],
        );
        let a = FusedMatMulAttrs::parse(&n).unwrap();
        assert_eq!(a.perm(0, 4).unwrap(), vec![1, 2, 0, 3]);
        assert_eq!(a.perm(1, 3).unwrap(), vec![0, 2, 1]);
        assert!(a.perm(0, 2).unwrap_err().0.contains("transBatchA"));
        // A [2, 1, 2] → [1, 2, 2] (rows: batch 0's row, batch 1's row); B [1, 1, 2]ᵀ.
        let x = Tensor::from_f32(vec![2, 1, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let w = Tensor::from_f32(vec![1, 1, 2], vec![1.0, 1.0]);
        let k = Registry::global().get(MS_DOMAIN, "FusedMatMul").unwrap();
        let y = k(&OpCtx::new(&n, 1), &[Some(&x), Some(&w)])
            .unwrap()
            .remove(0);
        assert_eq!(y.shape(), &[1, 2, 1]);
        assert_eq!(y.as_f32().unwrap(), &[1.5, 3.5]);
    }
}
