//! Shape and type rules, roles and data-movement marks of the data-movement family.
//!
//! Rules follow dimension values through shape arithmetic (`Shape`, `Gather`, `Concat`,
//! `Unsqueeze`, `Slice` keep the dims they hold), so a Reshape target computed from a
//! symbolic input shape still gives an exact output shape.

use super::super::util::{norm_axes, norm_axis};
use super::super::{OpError, Registry};
use crate::tensor::{DType, Tensor};

/// Roles, data-movement marks and shape rules of the family.
pub(super) fn register(r: &mut Registry) {
    use super::super::shape::same_as_input;
    use super::super::InputRole::{Data, Param};
    for op in [
        "Reshape",
        "Transpose",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Concat",
        "Split",
        "Slice",
        "Gather",
        "GatherElements",
        "Shape",
        "Size",
        "Constant",
        "ConstantOfShape",
        "Expand",
        "Tile",
        "Identity",
        "Dropout",
        "Range",
        "Pad",
        "DepthToSpace",
        "SpaceToDepth",
        "Trilu",
        "NonZero",
    ] {
        r.def_mut(op).movement();
    }
    for op in [
        "Reshape",
        "Squeeze",
        "Unsqueeze",
        "Split",
        "Slice",
        "Gather",
        "GatherElements",
        "Expand",
        "Tile",
        "Dropout",
        "Trilu",
        "CumSum",
        "CumProd",
    ] {
        r.def_mut(op).roles(&[Data, Param, Param, Param, Param]);
    }
    r.def_mut("Pad").roles(&[Data, Param, Data, Param]);
    r.def_mut("ConstantOfShape").roles(&[Param]);
    for op in ["Shape", "Size", "NonZero", "Constant", "ConstantOfShape"] {
        r.def_mut(op).own_output_type();
    }
    r.def_mut("Reshape").infer(reshape_facts);
    r.def_mut("Transpose").infer(transpose_facts);
    r.def_mut("Flatten").infer(flatten_facts);
    r.def_mut("Squeeze").infer(squeeze_facts);
    r.def_mut("Unsqueeze").infer(unsqueeze_facts);
    r.def_mut("Concat").infer(concat_facts);
    r.def_mut("Split").infer(split_facts);
    r.def_mut("Slice").infer(slice_facts);
    r.def_mut("Gather").infer(gather_facts);
    r.def_mut("GatherElements").infer(|_, i| {
        let (x, idx) = (fact(i, 0)?, fact(i, 1)?);
        Ok(vec![Fact::new(x.dtype, idx.shape.clone())])
    });
    r.def_mut("Shape").infer(shape_facts);
    r.def_mut("Size").infer(|_, i| {
        let x = fact(i, 0)?;
        let mut f = Fact::typed(DType::I64, vec![]);
        f.dims = x.shape.as_deref().map(|s| vec![product(s)]);
        Ok(vec![f])
    });
    r.def_mut("ConstantOfShape").infer(|ctx, i| {
        let dtype = ctx
            .attrs::<super::MovementAttrs>()?
            .fill
            .as_ref()
            .map_or(DType::F32, Tensor::dtype);
        let shape = fact(i, 0)?;
        Ok(vec![Fact::new(
            Some(dtype),
            shape_input(ctx, shape)?.map(|d| d.into_iter().collect()),
        )])
    });
    r.def_mut("Expand").infer(|ctx, i| {
        let x = fact(i, 0)?;
        let target = shape_input(ctx, fact(i, 1)?)?;
        let shape = match (&x.shape, &target) {
            (Some(a), Some(b)) => super::super::shape::broadcast(ctx, &[Some(a), Some(b)])?,
            _ => None,
        };
        Ok(vec![Fact::new(x.dtype, shape)])
    });
    r.def_mut("Tile").infer(|ctx, i| {
        let x = fact(i, 0)?;
        let shape = match (&x.shape, fact(i, 1)?.int_values()) {
            (Some(s), Some(rep)) if rep.len() == s.len() => Some(
                s.iter()
                    .zip(&rep)
                    .map(|(d, &k)| d.mul(&DimFact::known(k.max(0) as usize)))
                    .collect(),
            ),
            (Some(s), None) => Some(s.iter().map(|_| ctx.unknown_dim()).collect()),
            (Some(s), Some(rep)) => {
                return Err(OpError(format!(
                    "repeats has {} values for an input of rank {}",
                    rep.len(),
                    s.len()
                )))
            }
            (None, _) => None,
        };
        Ok(vec![Fact::new(x.dtype, shape)])
    });
    r.def_mut("Identity").infer(|_, i| {
        let x = fact(i, 0)?;
        let mut f = Fact::new(x.dtype, x.shape.clone());
        f.dims = x.dims.clone();
        Ok(vec![f])
    });
    r.def_mut("Dropout").infer(|_, i| {
        let x = fact(i, 0)?;
        Ok(vec![
            Fact::new(x.dtype, x.shape.clone()),
            Fact::new(Some(DType::Bool), x.shape.clone()),
        ])
    });
    r.def_mut("Range").infer(|ctx, i| {
        let x = fact(i, 0)?;
        let scalar = |k: usize| -> Option<f64> {
            let v = fact(i, k).ok()?.value.as_ref()?.to_f64_vec()?;
            (v.len() == 1).then(|| v[0])
        };
        let len = match (scalar(0), scalar(1), scalar(2)) {
            (Some(s), Some(l), Some(d)) if d != 0.0 => {
                let n = ((l - s) / d).ceil();
                DimFact::known(if n > 0.0 {
                    n.min(u32::MAX as f64) as usize
                } else {
                    0
                })
            }
            _ => ctx.unknown_dim(),
        };
        Ok(vec![Fact::new(x.dtype, Some(vec![len]))])
    });
    r.def_mut("Pad").infer(pad_facts);
    r.def_mut("DepthToSpace")
        .infer(|ctx, i| block_facts(ctx, i, true));
    r.def_mut("SpaceToDepth")
        .infer(|ctx, i| block_facts(ctx, i, false));
    r.def_mut("Trilu").infer(same_as_input);
    r.def_mut("CumSum").infer(same_as_input);
    r.def_mut("CumProd").infer(same_as_input);
    r.def_mut("NonZero").infer(|ctx, i| {
        let x = fact(i, 0)?;
        Ok(vec![Fact::new(
            Some(DType::I64),
            x.rank().map(|r| vec![DimFact::known(r), ctx.unknown_dim()]),
        )])
    });
}

use super::super::shape::{fact, opt_fact, product, FactsResult};
use super::super::InferCtx;
use crate::graph::fact::{DimFact, Fact, ShapeFact};

/// A shape given as a 1-D integer input: its dims when known (values or a Shape
/// computation), else a shape of known rank with unknown dims, else None.
fn shape_input(ctx: &InferCtx, f: &Fact) -> Result<Option<Vec<DimFact>>, OpError> {
    if let Some(v) = f.int_values() {
        if v.iter().any(|&d| d < 0) {
            return Err(OpError(format!("negative dimension in {v:?}")));
        }
        return Ok(Some(
            v.iter().map(|&d| DimFact::known(d as usize)).collect(),
        ));
    }
    if let Some(d) = f
        .dims
        .as_ref()
        .filter(|d| !d.iter().any(DimFact::is_infer_marker))
    {
        return Ok(Some(d.clone()));
    }
    Ok(match f.known_shape().as_deref() {
        Some([n]) => Some((0..*n).map(|_| ctx.unknown_dim()).collect()),
        _ => None,
    })
}

/// Reshape's target: `-1` and `0` entries from a known value, or dims from a Shape computation.
enum ReshapeEntry {
    Dim(DimFact),
    Infer,
    Copy,
}

fn reshape_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let attrs = ctx.attrs::<super::MovementAttrs>()?;
    let allowzero = attrs.allowzero;
    let spec: Option<Vec<ReshapeEntry>> = if ctx.opset < 5 {
        attrs.shape.as_deref().map(|v| entries(v, allowzero))
    } else {
        let s = fact(ins, 1)?;
        match (s.int_values(), &s.dims) {
            (Some(v), _) => Some(entries(&v, allowzero)),
            (None, Some(d)) => Some(
                d.iter()
                    .map(|d| {
                        if d.is_infer_marker() {
                            ReshapeEntry::Infer
                        } else if d.is(0) && !allowzero {
                            ReshapeEntry::Copy
                        } else {
                            ReshapeEntry::Dim(d.clone())
                        }
                    })
                    .collect(),
            ),
            _ => None,
        }
    };
    let Some(spec) = spec else {
        let rank = fact(ins, 1)
            .ok()
            .and_then(|s| match s.known_shape().as_deref() {
                Some([n]) => Some(*n),
                _ => None,
            });
        if let Some(r) = rank.filter(|&r| r > super::super::util::MAX_RANK) {
            return Err(OpError(format!(
                "the shape input has {r} entries: more axes than any tensor has (at most {})",
                super::super::util::MAX_RANK
            )));
        }
        return Ok(vec![match rank {
            Some(r) => super::super::shape::unknown_dims(ctx, x.dtype, r),
            None => Fact::new(x.dtype, None),
        }]);
    };
    let mut out: Vec<Option<DimFact>> = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, e) in spec.iter().enumerate() {
        match e {
            ReshapeEntry::Dim(d) => out.push(Some(d.clone())),
            ReshapeEntry::Infer => {
                if infer_at.replace(i).is_some() {
                    return Err(OpError("the target shape has more than one -1".into()));
                }
                out.push(None);
            }
            ReshapeEntry::Copy => match x.shape.as_ref().map(|s| s.get(i)) {
                Some(Some(d)) => out.push(Some(d.clone())),
                Some(None) => {
                    return Err(OpError(format!(
                        "the target shape copies dim {i}, but the input has rank {}",
                        x.rank().unwrap_or(0)
                    )))
                }
                None => out.push(Some(ctx.unknown_dim())),
            },
        }
    }
    let total = x.shape.as_deref().map(product);
    if let Some(i) = infer_at {
        let known = product(&out.iter().flatten().cloned().collect::<Vec<_>>());
        out[i] = Some(match total.as_ref().and_then(|t| t.div(&known)) {
            Some(d) => d,
            None => {
                if let (Some(t), Some(k)) =
                    (total.as_ref().and_then(DimFact::as_known), known.as_known())
                {
                    return Err(OpError(format!(
                        "cannot reshape {} ({t} elements) to a shape with -1 and {k} other elements",
                        x.shape_string()
                    )));
                }
                ctx.unknown_dim()
            }
        });
    }
    let out: ShapeFact = out.into_iter().flatten().collect();
    if let (Some(t), Some(o)) = (
        total.as_ref().and_then(DimFact::as_known),
        product(&out).as_known(),
    ) {
        if t != o {
            return Err(OpError(format!(
                "cannot reshape {} ({t} elements) to {} ({o} elements)",
                x.shape_string(),
                crate::graph::fact::fmt_shape_fact(&out)
            )));
        }
    }
    let mut f = Fact::new(x.dtype, Some(out));
    f.dims = x.dims.clone();
    Ok(vec![f])
}

fn entries(v: &[i64], allowzero: bool) -> Vec<ReshapeEntry> {
    v.iter()
        .map(|&d| match d {
            -1 => ReshapeEntry::Infer,
            0 if !allowzero => ReshapeEntry::Copy,
            d => ReshapeEntry::Dim(DimFact::known(d.max(0) as usize)),
        })
        .collect()
}

fn transpose_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let Some(s) = &x.shape else {
        return Ok(vec![Fact::new(x.dtype, None)]);
    };
    let perm: Vec<usize> = match &ctx.attrs::<super::MovementAttrs>()?.perm {
        // A permutation of 0..n (checked at load): it must fit the rank.
        Some(p) => {
            if p.len() != s.len() {
                return Err(OpError(format!(
                    "perm {p:?} does not fit an input of rank {}",
                    s.len()
                )));
            }
            p.clone()
        }
        None => (0..s.len()).rev().collect(),
    };
    Ok(vec![Fact::new(
        x.dtype,
        Some(perm.iter().map(|&p| s[p].clone()).collect()),
    )])
}

fn flatten_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let Some(s) = &x.shape else {
        return Ok(vec![super::super::shape::unknown_dims(ctx, x.dtype, 2)]);
    };
    let r = s.len() as i64;
    let mut axis = ctx.attrs::<super::MovementAttrs>()?.axis;
    if axis < 0 {
        axis += r;
    }
    if axis < 0 || axis > r {
        return Err(OpError(format!("axis {axis} is out of range for rank {r}")));
    }
    let a = axis as usize;
    Ok(vec![Fact::new(
        x.dtype,
        Some(vec![product(&s[..a]), product(&s[a..])]),
    )])
}

/// Axes from the attribute (before `input_from`) or the known value of input 1.
/// `Ok(None)`: no axes given; `Err`: given as an input whose value is not known.
fn axes_fact(
    ctx: &InferCtx,
    ins: &[Option<&Fact>],
    input_from: i64,
) -> Result<Option<Vec<i64>>, ()> {
    if ctx.opset >= input_from {
        match opt_fact(ins, 1) {
            None => Ok(None),
            Some(f) => f.int_values().map(Some).ok_or(()),
        }
    } else {
        Ok(ctx
            .attrs::<super::MovementAttrs>()
            .map_err(|_| ())?
            .axes
            .clone())
    }
}

fn squeeze_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let mut f = Fact::new(x.dtype, None);
    f.dims = x.dims.clone();
    let Some(s) = &x.shape else {
        return Ok(vec![f]);
    };
    f.shape = match axes_fact(ctx, ins, 13) {
        Ok(Some(axes)) => {
            let axes = norm_axes(&axes, s.len())?;
            for &a in &axes {
                if let Some(d) = s[a].as_known().filter(|&d| d != 1) {
                    return Err(OpError(format!("cannot squeeze axis {a} of size {d}")));
                }
            }
            Some(
                (0..s.len())
                    .filter(|d| !axes.contains(d))
                    .map(|d| s[d].clone())
                    .collect(),
            )
        }
        Ok(None) if s.iter().all(DimFact::is_known) => {
            Some(s.iter().filter(|d| !d.is(1)).cloned().collect())
        }
        _ => None,
    };
    Ok(vec![f])
}

fn unsqueeze_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let mut f = Fact::new(x.dtype, None);
    f.dims = x.dims.clone();
    let (Some(s), Ok(Some(axes))) = (&x.shape, axes_fact(ctx, ins, 13)) else {
        return Ok(vec![f]);
    };
    let out_rank = s.len() + axes.len();
    let axes = norm_axes(&axes, out_rank)?;
    let mut it = s.iter();
    let mut out = Vec::with_capacity(out_rank);
    for d in 0..out_rank {
        if axes.contains(&d) {
            out.push(DimFact::known(1));
        } else {
            out.push(
                it.next()
                    .cloned()
                    .ok_or_else(|| OpError("axes do not fit the input rank".into()))?,
            );
        }
    }
    f.shape = Some(out);
    Ok(vec![f])
}

fn concat_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let parts: Vec<&Fact> = ins.iter().flatten().copied().collect();
    let first = *parts.first().ok_or_else(|| OpError("no inputs".into()))?;
    let axis = ctx.attrs::<super::MovementAttrs>()?.axis;
    let mut f = Fact::new(first.dtype, None);
    if parts.iter().all(|p| p.dims.is_some()) {
        f.dims = Some(parts.iter().flat_map(|p| p.dims.clone().unwrap()).collect());
    }
    let Some(rank) = parts.iter().find_map(|p| p.rank()) else {
        return Ok(vec![f]);
    };
    let a = norm_axis(axis, rank)?;
    let mut out: Vec<DimFact> = (0..rank).map(|_| ctx.unknown_dim()).collect();
    let mut total = Some(DimFact::known(0));
    for p in &parts {
        let Some(s) = &p.shape else {
            total = None;
            continue;
        };
        if s.len() != rank {
            return Err(OpError(format!("inputs have ranks {rank} and {}", s.len())));
        }
        total = total.and_then(|t| t.add(&s[a]));
        for (i, d) in s.iter().enumerate() {
            if i == a {
                continue;
            }
            if let (Some(x), Some(y)) = (out[i].as_known(), d.as_known()) {
                if x != y {
                    return Err(OpError(format!(
                        "inputs differ in dimension {i} ({x} and {y}), not only along axis {a}"
                    )));
                }
            } else if !out[i].is_known() {
                out[i] = d.clone();
            }
        }
    }
    out[a] = total.unwrap_or_else(|| ctx.unknown_dim());
    f.shape = Some(out);
    Ok(vec![f])
}

fn split_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let n_out = ctx.node.outputs.len();
    let Some(s) = &x.shape else {
        return Ok(vec![Fact::new(x.dtype, None); n_out]);
    };
    let attrs = ctx.attrs::<super::MovementAttrs>()?;
    let axis = norm_axis(attrs.axis, s.len())?;
    let given: Option<Option<Vec<i64>>> = if ctx.opset >= 13 {
        match opt_fact(ins, 1) {
            None => Some(None),
            Some(f) => f.int_values().map(Some),
        }
    } else {
        Some(attrs.split.clone())
    };
    let sizes: Vec<DimFact> = match given {
        None => (0..n_out).map(|_| ctx.unknown_dim()).collect(),
        Some(Some(v)) => {
            if let Some(d) = s[axis].as_known() {
                if v.iter().any(|&x| x < 0) || v.iter().sum::<i64>() as usize != d {
                    return Err(OpError(format!(
                        "split {v:?} does not add up to dimension {d}"
                    )));
                }
            }
            v.iter()
                .map(|&x| DimFact::known(x.max(0) as usize))
                .collect()
        }
        Some(None) => {
            let parts = attrs.num_outputs.unwrap_or(n_out as i64);
            if parts < 1 || parts as usize != n_out {
                return Err(OpError(format!(
                    "num_outputs {parts} differs from the node's {n_out} outputs"
                )));
            }
            let parts = parts as usize;
            match s[axis].as_known() {
                Some(d) => {
                    let chunk = d.div_ceil(parts);
                    (0..parts)
                        .map(|i| DimFact::known(chunk.min(d.saturating_sub(i * chunk))))
                        .collect()
                }
                None => match s[axis].div(&DimFact::known(parts)) {
                    Some(q) => vec![q; parts],
                    None => (0..parts).map(|_| ctx.unknown_dim()).collect(),
                },
            }
        }
    };
    Ok(sizes
        .into_iter()
        .map(|d| {
            let mut o = s.clone();
            o[axis] = d;
            Fact::new(x.dtype, Some(o))
        })
        .collect())
}

fn slice_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let mut f = Fact::new(x.dtype, None);
    let Some(s) = &x.shape else {
        return Ok(vec![f]);
    };
    let params = if ctx.opset < 10 {
        let attrs = ctx.attrs::<super::MovementAttrs>()?;
        match (&attrs.starts, &attrs.ends) {
            (Some(a), Some(b)) => Some((a.clone(), b.clone(), attrs.axes.clone(), None)),
            _ => return Err(OpError("starts and ends are required".into())),
        }
    } else {
        let opt = |i: usize| -> Option<Option<Vec<i64>>> {
            match opt_fact(ins, i) {
                None => Some(None),
                Some(f) => f.int_values().map(Some),
            }
        };
        match (
            fact(ins, 1)?.int_values(),
            fact(ins, 2)?.int_values(),
            opt(3),
            opt(4),
        ) {
            (Some(a), Some(b), Some(c), Some(d)) => Some((a, b, c, d)),
            _ => None,
        }
    };
    let Some((starts, ends, axes, steps)) = params else {
        f.shape = Some(s.iter().map(|_| ctx.unknown_dim()).collect());
        return Ok(vec![f]);
    };
    let axes = match axes {
        Some(a) => norm_axes(&a, s.len())?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(OpError(
            "starts, ends, axes and steps must have the same length".into(),
        ));
    }
    let mut out = s.clone();
    // (begin, step, count) along axis 0 of a 1-D value, for the dims it may hold.
    let mut first_axis = None;
    for k in 0..starts.len() {
        let a = axes[k];
        if steps[k] == 0 {
            return Err(OpError("slice step cannot be 0".into()));
        }
        let Some(dim) = s[a].as_known() else {
            // Whole-axis slices of a symbolic dim keep it.
            let whole = steps[k] == 1 && starts[k] == 0 && ends[k] >= i32::MAX as i64;
            out[a] = if whole {
                s[a].clone()
            } else {
                ctx.unknown_dim()
            };
            continue;
        };
        let (st, n) = slice_range(starts[k], ends[k], steps[k], dim as i64);
        out[a] = DimFact::known(n);
        if a == 0 {
            first_axis = Some((st, steps[k], n));
        }
    }
    if let (Some(d), 1) = (&x.dims, s.len()) {
        let (st, step, n) = first_axis.unwrap_or((0, 1, d.len()));
        let picked: Option<Vec<DimFact>> = (0..n)
            .map(|i| d.get((st + i as i64 * step) as usize).cloned())
            .collect();
        f.dims = picked;
    }
    f.shape = Some(out);
    Ok(vec![f])
}

/// First index and element count of a slice along an axis of size `dim` (ONNX's clamping).
fn slice_range(start: i64, end: i64, step: i64, dim: i64) -> (i64, usize) {
    let mut st = if start < 0 { start + dim } else { start };
    let mut en = if end < 0 { end + dim } else { end };
    if step > 0 {
        st = st.clamp(0, dim);
        en = en.clamp(0, dim);
    } else {
        st = st.clamp(0, dim - 1);
        en = en.clamp(-1, dim - 1);
    }
    let n = if step > 0 {
        (en - st + step - 1) / step
    } else {
        (st - en + (-step) - 1) / (-step)
    };
    (st, n.max(0) as usize)
}

fn gather_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (x, idx) = (fact(ins, 0)?, fact(ins, 1)?);
    let mut f = Fact::new(x.dtype, None);
    let (Some(s), Some(is)) = (&x.shape, &idx.shape) else {
        return Ok(vec![f]);
    };
    let axis = norm_axis(ctx.attrs::<super::MovementAttrs>()?.axis, s.len())?;
    let mut out: ShapeFact = s[..axis].to_vec();
    out.extend(is.iter().cloned());
    out.extend(s[axis + 1..].iter().cloned());
    if let (Some(d), Some(iv), 1) = (&x.dims, idx.int_values(), s.len()) {
        let n = d.len() as i64;
        f.dims = iv
            .iter()
            .map(|&i| d.get((if i < 0 { i + n } else { i }) as usize).cloned())
            .collect();
    }
    f.shape = Some(out);
    Ok(vec![f])
}

fn shape_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let Some(s) = &x.shape else {
        return Ok(vec![Fact::typed(DType::I64, vec![ctx.unknown_dim()])]);
    };
    let r = s.len() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let attrs = ctx.attrs::<super::MovementAttrs>()?;
    let start = clampi(attrs.start);
    let end = clampi(attrs.end.unwrap_or(r)).max(start);
    let mut f = Fact::typed(DType::I64, vec![DimFact::known(end - start)]);
    f.dims = Some(s[start..end].to_vec());
    Ok(vec![f])
}

fn pad_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let Some(s) = &x.shape else {
        return Ok(vec![Fact::new(x.dtype, None)]);
    };
    let r = s.len();
    let (pads, axes) = if ctx.opset < 11 {
        (
            ctx.attrs::<super::MovementAttrs>()?.pads.clone(),
            Some(None),
        )
    } else {
        let axes = match opt_fact(ins, 3) {
            None => Some(None),
            Some(f) => f.int_values().map(Some),
        };
        (fact(ins, 1)?.int_values(), axes)
    };
    let (Some(pads), Some(axes)) = (pads, axes) else {
        return Ok(vec![super::super::shape::unknown_dims(ctx, x.dtype, r)]);
    };
    let axes = match axes {
        Some(a) => norm_axes(&a, r)?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(OpError(format!(
            "pads {pads:?} must have {} values",
            2 * axes.len()
        )));
    }
    let mut out = s.clone();
    for (k, &a) in axes.iter().enumerate() {
        let delta = pads[k] + pads[k + axes.len()];
        out[a] = match s[a].as_known() {
            Some(d) => {
                let n = d as i64 + delta;
                if n < 0 {
                    return Err(OpError(format!(
                        "pads {pads:?} remove more than axis {a} holds"
                    )));
                }
                DimFact::known(n as usize)
            }
            None if delta >= 0 => s[a]
                .add(&DimFact::known(delta as usize))
                .unwrap_or_else(|| ctx.unknown_dim()),
            None => ctx.unknown_dim(),
        };
    }
    Ok(vec![Fact::new(x.dtype, Some(out))])
}

/// DepthToSpace (`to_space`) and SpaceToDepth.
fn block_facts(ctx: &InferCtx, ins: &[Option<&Fact>], to_space: bool) -> FactsResult {
    let x = fact(ins, 0)?;
    let b = ctx.attrs::<super::MovementAttrs>()?.blocksize;
    let Some(s) = &x.shape else {
        return Ok(vec![super::super::shape::unknown_dims(ctx, x.dtype, 4)]);
    };
    if s.len() != 4 {
        return Err(OpError(format!("input {} is not 4-D", x.shape_string())));
    }
    let bb = DimFact::known(b);
    let b2 = DimFact::known(b * b);
    let div = |d: &DimFact, by: &DimFact| -> Result<DimFact, OpError> {
        match d.div(by) {
            Some(q) => Ok(q),
            None if d.is_known() => Err(OpError(format!(
                "input {} does not fit blocksize {b}",
                x.shape_string()
            ))),
            None => Ok(ctx.unknown_dim()),
        }
    };
    let out = if to_space {
        vec![s[0].clone(), div(&s[1], &b2)?, s[2].mul(&bb), s[3].mul(&bb)]
    } else {
        vec![
            s[0].clone(),
            s[1].mul(&b2),
            div(&s[2], &bb)?,
            div(&s[3], &bb)?,
        ]
    };
    Ok(vec![Fact::new(x.dtype, Some(out))])
}
