//! com.microsoft GatedAdd (ONNX Runtime GenAI's Qwen-MoE shared-expert gate) as ONNX Runtime
//! 1.32's CPU kernel computes it (contrib_ops/cpu/bert/gated_add.cc): `X + Y·gate`, with
//! `gate` one value per row (`[..., 1]`, the leading dimensions X's, no broadcasting), the
//! product rounded to the input's type before the add (f32 for float32; float16 rounds it, as
//! separate Mul and Add would). The projected mode (`gate_weight`: a sigmoid of a dot product)
//! is CUDA bfloat16 only; ONNX Runtime's CPU kernel refuses it, and so does this one.

use super::super::shape::{fact, opt_fact, FactsResult};
use super::super::util::{float_slice, in_dtype, input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::Fact;
use crate::tensor::Tensor;
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Param};
    r.add_in(MS_DOMAIN, "GatedAdd", gated_add)
        .roles(&[Data, Data, Data, Param])
        .infer(gated_add_facts);
}

const PROJECTED_MODE: &str = "gate_weight is given: the projected gate (sigmoid of gate · \
                              gate_weight) has no CPU kernel in ONNX Runtime (CUDA bfloat16 only)";

/// Checks what ONNX Runtime checks of X, Y and gate's shapes: Y is X's shape, gate is X's
/// with a last dimension of 1, X's last dimension is positive.
fn check_shapes(x: &[usize], y: &[usize], gate: &[usize]) -> Result<(), OpError> {
    let Some((&c, lead)) = x.split_last() else {
        return Err(OpError("X is a scalar; it must have rank >= 1".into()));
    };
    if c == 0 {
        return Err(OpError(format!("X {x:?} has an empty last dimension")));
    }
    if y != x {
        return Err(OpError(format!("Y {y:?} must have X's shape {x:?}")));
    }
    if gate.split_last() != Some((&1, lead)) {
        return Err(OpError(format!(
            "gate {gate:?} must be X's shape {x:?} with a last dimension of 1 (one gate per row)"
        )));
    }
    Ok(())
}

fn gated_add(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    if opt_input(inputs, 3).is_some() {
        return Err(OpError(PROJECTED_MODE.into()));
    }
    let (x, y, gate) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    check_shapes(x.shape(), y.shape(), gate.shape())?;
    let c = *x.shape().last().unwrap_or(&1);
    let (xv, yv, gv) = (
        float_slice(x, "X")?,
        float_slice(y, "Y")?,
        float_slice(gate, "gate")?,
    );
    let rounding = super::type_rounding(ctx, x.dtype());
    let mut out = vec![0f32; xv.len()];
    out.par_chunks_mut(c)
        .zip(xv.par_chunks(c).zip(yv.par_chunks(c)))
        .zip(gv.par_iter())
        .for_each(|((o, (xr, yr)), &g)| {
            for ((o, &a), &b) in o.iter_mut().zip(xr).zip(yr) {
                let product = b * g;
                *o = a + rounding.map_or(product, |r| r.round(product));
            }
        });
    Ok(vec![in_dtype(
        Tensor::from_f32(x.shape().to_vec(), out),
        x.dtype(),
    )])
}

/// The output has X's type and shape; known ranks and dimensions of Y and gate must agree.
fn gated_add_facts(_: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (x, y, gate) = (fact(ins, 0)?, fact(ins, 1)?, fact(ins, 2)?);
    if opt_fact(ins, 3).is_some() {
        return Err(OpError(PROJECTED_MODE.into()));
    }
    if let (Some(xs), Some(gs)) = (&x.shape, &gate.shape) {
        if xs.is_empty()
            || gs.len() != xs.len()
            || gs
                .last()
                .is_some_and(|d| d.as_known().is_some_and(|d| d != 1))
        {
            return Err(OpError(format!(
                "gate of rank {} must be X's shape (rank {}) with a last dimension of 1",
                gs.len(),
                xs.len()
            )));
        }
    }
    if let (Some(xs), Some(ys)) = (&x.shape, &y.shape) {
        if ys.len() != xs.len() {
            return Err(OpError(format!(
                "Y of rank {} must have X's shape (rank {})",
                ys.len(),
                xs.len()
            )));
        }
    }
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Node;
    use crate::numeric::Rounding;

    fn node() -> Node {
        let mut n = crate::graph::testing::node("g", "GatedAdd", &[], &["y"]);
        n.domain = MS_DOMAIN.into();
        n
    }

    fn run(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
        let k = Registry::global().get(MS_DOMAIN, "GatedAdd").unwrap();
        k(ctx, inputs).map(|mut v| v.remove(0))
    }

    #[test]
    fn rows_add_y_times_their_gate() {
        let n = node();
        let x = Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let y = Tensor::from_f32(vec![2, 3], vec![1.0, -1.0, 0.5, 2.0, 2.0, 2.0]);
        let g = Tensor::from_f32(vec![2, 1], vec![2.0, -0.25]);
        let out = run(&OpCtx::new(&n, 1), &[Some(&x), Some(&y), Some(&g)]).unwrap();
        assert_eq!(out.as_f32().unwrap(), &[3.0, 0.0, 4.0, 3.5, 4.5, 5.5]);
    }

    /// Under a float16 layer the product is rounded to float16 before the add, as ONNX
    /// Runtime's float16 kernel rounds it: 1 + 1/3 reads 1 + 0.33325195 (1/3 in float16).
    #[test]
    fn a_float16_layer_rounds_the_product() {
        let n = node();
        let x = Tensor::from_f32(vec![1, 1], vec![1.0]);
        let y = Tensor::from_f32(vec![1, 1], vec![1.0]);
        let g = Tensor::from_f32(vec![1, 1], vec![1.0 / 3.0]);
        let mut ctx = OpCtx::new(&n, 1);
        let plain = run(&ctx, &[Some(&x), Some(&y), Some(&g)]).unwrap();
        assert_eq!(plain.as_f32().unwrap(), &[1.0 + 1.0 / 3.0]);
        ctx.round_to = Some(Rounding::F16);
        let rounded = run(&ctx, &[Some(&x), Some(&y), Some(&g)]).unwrap();
        let third = half::f16::from_f32(1.0 / 3.0).to_f32();
        assert_eq!(rounded.as_f32().unwrap(), &[1.0 + third]);
    }

    #[test]
    fn bad_shapes_and_the_projected_gate_are_refused() {
        let n = node();
        let ctx = OpCtx::new(&n, 1);
        let t = |s: &[usize]| Tensor::from_f32(s.to_vec(), vec![1.0; s.iter().product()]);
        let (x, g) = (t(&[2, 3]), t(&[2, 1]));
        let e = |ins: &[Option<&Tensor>]| run(&ctx, ins).unwrap_err().0;
        let msg = e(&[Some(&x), Some(&t(&[3, 2])), Some(&g)]);
        assert!(msg.contains("Y [3, 2] must have X's shape [2, 3]"), "{msg}");
        let msg = e(&[Some(&x), Some(&x), Some(&t(&[1, 1]))]);
        assert!(msg.contains("gate [1, 1]"), "{msg}");
        let msg = e(&[Some(&x), Some(&x), Some(&t(&[2, 3]))]);
        assert!(msg.contains("gate [2, 3]"), "{msg}");
        let msg = e(&[Some(&x), Some(&x), Some(&g), Some(&t(&[1, 1]))]);
        assert!(msg.contains("gate_weight is given"), "{msg}");
        let msg = e(&[Some(&t(&[2, 0])), Some(&t(&[2, 0])), Some(&g)]);
        assert!(msg.contains("empty last dimension"), "{msg}");
    }
}
