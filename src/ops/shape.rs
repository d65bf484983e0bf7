//! Shape and type rules shared by many ops (same-as-input, NumPy broadcasting, reductions)
//! and helpers the per-family rules use to read input facts.

use super::{InferCtx, OpError};
use crate::graph::fact::{DimFact, Fact, ShapeFact};
use crate::tensor::DType;

pub type FactsResult = Result<Vec<Fact>, OpError>;

/// Input `i`'s fact (an error when a required input is omitted).
pub fn fact<'a>(ins: &[Option<&'a Fact>], i: usize) -> Result<&'a Fact, OpError> {
    match ins.get(i) {
        Some(Some(f)) => Ok(f),
        _ => Err(OpError(format!("required input #{i} is missing"))),
    }
}

/// The optional input `i`'s fact.
pub fn opt_fact<'a>(ins: &[Option<&'a Fact>], i: usize) -> Option<&'a Fact> {
    ins.get(i).copied().flatten()
}

/// A fact of known rank whose every dimension is unknown.
pub fn unknown_dims(ctx: &InferCtx, dtype: Option<DType>, rank: usize) -> Fact {
    Fact::new(dtype, Some((0..rank).map(|_| ctx.unknown_dim()).collect()))
}

/// Output 0 has input 0's type and shape.
pub fn same_as_input(_: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

/// Output 0 has input 0's shape and type bool (IsNaN, Not...).
pub fn bool_like_input(_: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    Ok(vec![Fact::new(Some(DType::Bool), x.shape.clone())])
}

/// The NumPy-broadcast of two dimensions. A symbolic dimension against a static one other
/// than 1 is taken to be that static one (as ONNX Runtime's inference does).
pub fn broadcast_dim(ctx: &InferCtx, a: &DimFact, b: &DimFact) -> Result<DimFact, OpError> {
    if a == b || b.is(1) {
        return Ok(a.clone());
    }
    if a.is(1) {
        return Ok(b.clone());
    }
    match (a.as_known(), b.as_known()) {
        (Some(x), Some(y)) => Err(OpError(format!(
            "dimensions {x} and {y} cannot be broadcast together"
        ))),
        (Some(_), None) => Ok(a.clone()),
        (None, Some(_)) => Ok(b.clone()),
        (None, None) => Ok(ctx.unknown_dim()),
    }
}

/// Another default-domain op's shape rule applied to the inputs `pick` of `ins`: for ops whose
/// output is shaped as a standard op's (ConvInteger and QLinearConv as Conv, MatMulInteger and
/// QLinearMatMul as MatMul, QLinearConcat as Concat).
pub fn infer_as(
    op: &str,
    ctx: &InferCtx,
    ins: &[Option<&Fact>],
    pick: impl IntoIterator<Item = usize>,
) -> FactsResult {
    let rule = super::Registry::global()
        .def("", op)
        .and_then(|d| d.infer)
        .ok_or_else(|| OpError(format!("{op} has no shape rule")))?;
    let picked: Vec<Option<&Fact>> = pick.into_iter().map(|i| opt_fact(ins, i)).collect();
    rule(ctx, &picked)
}

/// The NumPy-broadcast shape of several shapes (None when any rank is unknown).
pub fn broadcast(
    ctx: &InferCtx,
    shapes: &[Option<&ShapeFact>],
) -> Result<Option<ShapeFact>, OpError> {
    let mut known = Vec::with_capacity(shapes.len());
    for s in shapes {
        match s {
            Some(s) => known.push(*s),
            None => return Ok(None),
        }
    }
    let rank = known.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![DimFact::known(1); rank];
    for s in &known {
        let off = rank - s.len();
        for (i, d) in s.iter().enumerate() {
            out[off + i] = broadcast_dim(ctx, &out[off + i], d).map_err(|e| {
                OpError(format!(
                    "{} (shapes {})",
                    e.0,
                    known
                        .iter()
                        .map(|s| crate::graph::fact::fmt_shape_fact(s))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ))
            })?;
        }
    }
    Ok(Some(out))
}

fn broadcast_inputs(ctx: &InferCtx, ins: &[Option<&Fact>]) -> Result<Option<ShapeFact>, OpError> {
    let shapes: Vec<Option<&ShapeFact>> = ins.iter().flatten().map(|f| f.shape.as_ref()).collect();
    broadcast(ctx, &shapes)
}

/// Every input broadcast; the output has input 0's type (Add, Max, Pow, PRelu...).
pub fn broadcast_like_first(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    Ok(vec![Fact::new(x.dtype, broadcast_inputs(ctx, ins)?)])
}

/// Every input broadcast; the output is bool (comparisons, And/Or/Xor).
pub fn broadcast_bool(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    fact(ins, 0)?;
    Ok(vec![Fact::new(
        Some(DType::Bool),
        broadcast_inputs(ctx, ins)?,
    )])
}

/// The shape a reduction leaves: `axes` (None: all) removed or kept as 1.
pub fn reduced_shape(shape: &[DimFact], axes: Option<&[usize]>, keepdims: bool) -> ShapeFact {
    let mut out = Vec::with_capacity(shape.len());
    for (i, d) in shape.iter().enumerate() {
        let reduced = axes.is_none_or(|a| a.contains(&i));
        if !reduced {
            out.push(d.clone());
        } else if keepdims {
            out.push(DimFact::known(1));
        }
    }
    out
}

/// The product of dimensions.
pub fn product(dims: &[DimFact]) -> DimFact {
    dims.iter().fold(DimFact::known(1), |acc, d| acc.mul(d))
}
