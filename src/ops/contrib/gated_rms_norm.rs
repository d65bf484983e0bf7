//! com.microsoft GatedRMSNorm (the output norm of ONNX Runtime GenAI's Qwen3.5 / Qwen3-Next
//! linear-attention layers) as ONNX Runtime 1.32's CPU kernel computes it
//! (contrib_ops/cpu/bert/linear_attention_gates.cc): over each group of `C` = len(scale)
//! consecutive values of X (X's last dimension a multiple of C: a per-head norm of a packed
//! `[..., H·C]` tensor),
//!
//! `Y = (x · inv_rms) · scale · g(gate)`, `inv_rms = 1 / √(Σx²/C + epsilon)`,
//!
//! all in f32: the squares summed in order from 0 (each product rounded, no fused multiply-add),
//! `g` = `z · σ(z)` for `silu`/`swish` (the default) or `σ(z)` for `sigmoid`, σ MLAS's logistic
//! (`ops::logistic`). Float16 inputs are read as f32 and the output rounded once, as ORT's
//! float16 kernel does. Bit for bit with ORT in float32 and float16 (tests/integration/contrib.rs).

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::logistic::logistic;
use super::super::shape::{fact, FactsResult};
use super::super::util::{float_slice, in_dtype, input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::Fact;
use crate::graph::Node;
use crate::tensor::Tensor;
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    use InputRole::Data;
    r.add_in(MS_DOMAIN, "GatedRMSNorm", gated_rms_norm)
        .parse(|n, _| boxed(GatedNormAttrs::parse(n)))
        .roles(&[Data, Data, Data])
        .infer(gated_rms_norm_facts);
}

#[derive(Clone, Debug, PartialEq)]
struct GatedNormAttrs {
    /// `silu`/`swish`: the gate is `z·σ(z)`; `sigmoid`: `σ(z)`.
    silu: bool,
    epsilon: f32,
}

impl GatedNormAttrs {
    fn parse(node: &Node) -> Result<GatedNormAttrs, AttrError> {
        let a = Attrs::new(node);
        Ok(GatedNormAttrs {
            silu: a.choice(
                "activation",
                true,
                &[("silu", true), ("swish", true), ("sigmoid", false)],
            )?,
            epsilon: a.float_or("epsilon", 1e-5)?,
        })
    }
}

/// Rows of at most this many values share one parallel task.
const ROWS_PER_TASK: usize = 1 << 12;

fn gated_rms_norm(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<GatedNormAttrs>()?;
    let (x, scale, gate) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    let shape = x.shape();
    let Some(&last) = shape.last() else {
        return Err(OpError("X is a scalar; it must have rank >= 1".into()));
    };
    if gate.shape() != shape {
        return Err(OpError(format!(
            "gate {:?} must have X's shape {shape:?}",
            gate.shape()
        )));
    }
    let n = scale.len();
    if n == 0 {
        return Err(OpError(format!("scale {:?} is empty", scale.shape())));
    }
    if last % n != 0 {
        return Err(OpError(format!(
            "X's last dimension {last} must be a multiple of the scale's length {n}"
        )));
    }
    let xv = float_slice(x, "X")?;
    let gv = float_slice(gate, "gate")?;
    let sv = float_slice(scale, "scale")?;
    let (eps, silu) = (attrs.epsilon, attrs.silu);
    let mut out = vec![0f32; xv.len()];
    let per_task = (ROWS_PER_TASK / n).max(1) * n;
    out.par_chunks_mut(per_task)
        .zip(xv.par_chunks(per_task).zip(gv.par_chunks(per_task)))
        .for_each(|(o, (xs, gs))| {
            for ((o, xr), gr) in o.chunks_mut(n).zip(xs.chunks(n)).zip(gs.chunks(n)) {
                let mut sum_sq = 0f32;
                for &v in xr {
                    sum_sq += v * v;
                }
                let inv_rms = 1.0 / (sum_sq / n as f32 + eps).sqrt();
                for (((o, &v), &z), &s) in o.iter_mut().zip(xr).zip(gr).zip(sv.iter()) {
                    let normalized = v * inv_rms * s;
                    let g = if silu { z * logistic(z) } else { logistic(z) };
                    *o = normalized * g;
                }
            }
        });
    Ok(vec![in_dtype(
        Tensor::from_f32(shape.to_vec(), out),
        x.dtype(),
    )])
}

/// Y has X's type and shape.
fn gated_rms_norm_facts(_: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    if x.shape.as_ref().is_some_and(|s| s.is_empty()) {
        return Err(OpError("X is a scalar; it must have rank >= 1".into()));
    }
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;

    fn run(attrs: &[(&str, Attribute)], inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
        let mut n = node_with("GatedRMSNorm", attrs);
        n.domain = MS_DOMAIN.into();
        crate::ops::attrs::parse_node(&n, 1).map_err(|e| OpError(e.to_string()))?;
        let k = Registry::global().get(MS_DOMAIN, "GatedRMSNorm").unwrap();
        k(&OpCtx::new(&n, 1), inputs).map(|mut v| v.remove(0))
    }

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec())
    }

    /// Each group of len(scale) values is normalized on its own; the gate is z·σ(z) (silu) or
    /// σ(z) (sigmoid).
    #[test]
    fn groups_are_normalized_and_gated() {
        // Two groups of 2: [3, 4] (rms² = 12.5) and [1, 1] (rms² = 1).
        let x = t(&[1, 4], &[3.0, 4.0, 1.0, 1.0]);
        let scale = t(&[2], &[1.0, 2.0]);
        let gate = t(&[1, 4], &[0.0, 1.0, 2.0, -1.0]);
        let eps = Attribute::Float(0.0);
        let inv_a = 1.0 / (25.0f32 / 2.0).sqrt();
        let gates = [0.0f32, 1.0, 2.0, -1.0];
        let sig = run(
            &[
                ("epsilon", eps.clone()),
                ("activation", Attribute::String("sigmoid".into())),
            ],
            &[Some(&x), Some(&scale), Some(&gate)],
        )
        .unwrap();
        let normalized = [3.0 * inv_a, 4.0 * inv_a * 2.0, 1.0, 2.0];
        let want: Vec<f32> = normalized
            .iter()
            .zip(gates)
            .map(|(n, z)| n * logistic(z))
            .collect();
        assert_eq!(sig.as_f32().unwrap(), want.as_slice());
        let silu = run(&[("epsilon", eps)], &[Some(&x), Some(&scale), Some(&gate)]).unwrap();
        let want: Vec<f32> = normalized
            .iter()
            .zip(gates)
            .map(|(n, z)| n * (z * logistic(z)))
            .collect();
        assert_eq!(silu.as_f32().unwrap(), want.as_slice());
        // epsilon's default is 1e-5.
        let d = run(
            &[],
            &[
                Some(&t(&[1], &[2.0])),
                Some(&t(&[1], &[1.0])),
                Some(&t(&[1], &[30.0])),
            ],
        )
        .unwrap();
        assert_eq!(d.as_f32().unwrap(), &[2.0 / (4.0f32 + 1e-5).sqrt() * 30.0]);
    }

    #[test]
    fn bad_shapes_and_activations_are_refused() {
        let x = t(&[2, 4], &[1.0; 8]);
        let e = |ins: &[Option<&Tensor>]| run(&[], ins).unwrap_err().0;
        let msg = e(&[Some(&x), Some(&t(&[3], &[1.0; 3])), Some(&x)]);
        assert!(msg.contains("multiple of the scale's length 3"), "{msg}");
        let msg = e(&[
            Some(&x),
            Some(&t(&[2], &[1.0; 2])),
            Some(&t(&[1, 4], &[1.0; 4])),
        ]);
        assert!(msg.contains("gate [1, 4]"), "{msg}");
        let msg = e(&[Some(&x), Some(&t(&[0], &[])), Some(&x)]);
        assert!(msg.contains("scale [0] is empty"), "{msg}");
        let s = Tensor::scalar_f32(1.0);
        let msg = e(&[Some(&s), Some(&t(&[1], &[1.0])), Some(&s)]);
        assert!(msg.contains("scalar"), "{msg}");
        let msg = run(
            &[("activation", Attribute::String("relu".into()))],
            &[Some(&x), Some(&t(&[2], &[1.0; 2])), Some(&x)],
        )
        .unwrap_err()
        .0;
        assert!(
            msg.contains("activation") && msg.contains("'relu'"),
            "{msg}"
        );
    }
}
