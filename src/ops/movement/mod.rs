//! Data movement and shape ops. Every op here serves every dtype: values are moved, never
//! computed, by building a list of source indices and gathering them (`TensorData::gather`).

mod facts;
pub mod permute;

use super::util::{
    broadcast_shapes, broadcast_to, input, input_i64s, norm_axes, norm_axis, opt_input,
};
use super::{OpCtx, OpError, OpResult, Registry};
use crate::graph::Attribute;
use crate::tensor::{strides_of, DType, Tensor, TensorData};

pub fn register(r: &mut Registry) {
    r.add("Reshape", reshape);
    r.add("Transpose", transpose);
    r.add("Flatten", flatten);
    r.add("Squeeze", squeeze);
    r.add("Unsqueeze", unsqueeze);
    r.add("Concat", concat);
    r.add("Split", split);
    r.add("Slice", slice);
    r.add("Gather", gather);
    r.add("GatherElements", gather_elements);
    r.add("Shape", shape_op);
    r.add("Size", |_, i| {
        Ok(vec![Tensor::scalar_i64(input(i, 0)?.len() as i64)])
    });
    r.add("Constant", constant);
    r.add("ConstantOfShape", constant_of_shape);
    r.add("Expand", expand);
    r.add("Tile", tile);
    r.add("Identity", |_, i| Ok(vec![input(i, 0)?.clone()]));
    r.add("Dropout", dropout);
    r.add("Range", range);
    r.add("Pad", pad);
    r.add("DepthToSpace", depth_to_space);
    r.add("SpaceToDepth", space_to_depth);
    r.add("Trilu", trilu);
    r.add("NonZero", non_zero);
    r.add("CumSum", |c, i| cumulate(c, i, false));
    r.add("CumProd", |c, i| cumulate(c, i, true));
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
        "Constant",
        "ConstantOfShape",
        "Pad",
        "DepthToSpace",
        "SpaceToDepth",
        "Trilu",
        "CumSum",
        "CumProd",
    ] {
        r.def_mut(op)
            .parse(|n, opset| super::attrs::boxed(MovementAttrs::parse(n, opset)));
    }
    facts::register(r);
}

/// The attributes of the movement ops, validated for the node's op and opset (each op reads
/// the fields its schema defines; the others keep their defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct MovementAttrs {
    /// Flatten (default 1), Concat (required), Split, Gather, GatherElements (default 0).
    pub axis: i64,
    /// Squeeze/Unsqueeze before opset 13, Slice before 10: distinct.
    pub axes: Option<Vec<i64>>,
    /// Reshape-1's `shape`.
    pub shape: Option<Vec<i64>>,
    pub allowzero: bool,
    /// Transpose's `perm`: a permutation of 0..n.
    pub perm: Option<Vec<usize>>,
    /// Split before opset 13: sizes >= 0.
    pub split: Option<Vec<i64>>,
    /// Split-18's `num_outputs` (>= 1).
    pub num_outputs: Option<i64>,
    /// Slice before opset 10 (required there, same length as each other and `axes`).
    pub starts: Option<Vec<i64>>,
    pub ends: Option<Vec<i64>>,
    /// Shape-15's `start` and `end`.
    pub start: i64,
    pub end: Option<i64>,
    /// Pad's `mode` (constant, reflect, edge, wrap), `pads` and `value` before opset 11.
    pub pad_mode: &'static str,
    pub pads: Option<Vec<i64>>,
    pub pad_value: f32,
    /// DepthToSpace/SpaceToDepth `blocksize` (required, >= 1) and DepthToSpace's CRD mode.
    pub blocksize: usize,
    pub crd: bool,
    /// Constant: the attribute that holds the value (exactly one is set).
    pub constant_from: &'static str,
    /// ConstantOfShape's `value`: a one-element tensor (f32 0 when absent).
    pub fill: Option<Tensor>,
    /// Trilu's `upper`; CumSum's and CumProd's `exclusive` and `reverse`.
    pub upper: bool,
    pub exclusive: bool,
    pub reverse: bool,
}

impl MovementAttrs {
    pub(crate) fn parse(
        node: &crate::graph::Node,
        opset: i64,
    ) -> Result<MovementAttrs, super::attrs::AttrError> {
        use super::attrs::{AttrError, Attrs};
        let a = Attrs::new(node);
        let op = node.op_type.as_str();
        let required = |name: &str| AttrError::new(name, "missing (the op needs it)");
        let mut m = MovementAttrs {
            axis: a.int_or("axis", if op == "Flatten" { 1 } else { 0 })?,
            axes: super::reduce::distinct_axes(&a, "axes")?,
            shape: a.ints("shape")?,
            allowzero: a.flag("allowzero", false)?,
            perm: None,
            split: a.ints_at_least("split", 0)?,
            num_outputs: a.int("num_outputs")?,
            starts: None,
            ends: None,
            start: a.int_or("start", 0)?,
            end: a.int("end")?,
            pad_mode: "constant",
            pads: None,
            pad_value: 0.0,
            blocksize: 1,
            crd: false,
            constant_from: "",
            fill: None,
            upper: a.flag("upper", true)?,
            exclusive: a.flag("exclusive", false)?,
            reverse: a.flag("reverse", false)?,
        };
        if op == "Concat" && !a.has("axis") {
            return Err(required("axis"));
        }
        if let Some(n) = m.num_outputs {
            if n < 1 {
                return Err(AttrError::new(
                    "num_outputs",
                    format!("must be >= 1, got {n}"),
                ));
            }
        }
        if let Some(p) = a.ints("perm")? {
            let mut seen = vec![false; p.len()];
            for &x in &p {
                if x < 0 || x as usize >= p.len() || std::mem::replace(&mut seen[x as usize], true)
                {
                    return Err(AttrError::new(
                        "perm",
                        format!("{p:?} is not a permutation of 0..{}", p.len()),
                    ));
                }
            }
            m.perm = Some(p.iter().map(|&x| x as usize).collect());
        }
        if op == "Slice" && opset < 10 {
            let starts = a.ints("starts")?.ok_or_else(|| required("starts"))?;
            let ends = a.ints("ends")?.ok_or_else(|| required("ends"))?;
            if ends.len() != starts.len() {
                return Err(AttrError::new(
                    "ends",
                    format!("has {} values, 'starts' {}", ends.len(), starts.len()),
                ));
            }
            if let Some(axes) = &m.axes {
                if axes.len() != starts.len() {
                    return Err(AttrError::new(
                        "axes",
                        format!("has {} values, 'starts' {}", axes.len(), starts.len()),
                    ));
                }
            }
            m.starts = Some(starts);
            m.ends = Some(ends);
        }
        if op == "Pad" {
            m.pad_mode = a.choice(
                "mode",
                "constant",
                &[
                    ("constant", "constant"),
                    ("reflect", "reflect"),
                    ("edge", "edge"),
                    ("wrap", "wrap"),
                ],
            )?;
            if opset < 11 {
                m.pads = Some(a.ints("pads")?.ok_or_else(|| required("pads"))?);
                m.pad_value = a.float_or("value", 0.0)?;
            }
        }
        if op == "DepthToSpace" || op == "SpaceToDepth" {
            let b = a.required_int("blocksize")?;
            if b < 1 {
                return Err(AttrError::new(
                    "blocksize",
                    format!("must be >= 1, got {b}"),
                ));
            }
            m.blocksize = b as usize;
            m.crd = a.choice("mode", false, &[("DCR", false), ("CRD", true)])?;
        }
        if op == "Constant" {
            let names = [
                "value",
                "value_float",
                "value_floats",
                "value_int",
                "value_ints",
                "value_string",
                "value_strings",
                "sparse_value",
            ];
            let set: Vec<&'static str> = names.into_iter().filter(|n| a.has(n)).collect();
            match set.as_slice() {
                [one] => m.constant_from = one,
                [] => return Err(required("value")),
                [first, second, ..] => {
                    return Err(AttrError::new(
                        second,
                        format!("Constant takes one value attribute, '{first}' is set too"),
                    ))
                }
            }
            // Type checks: the kernel reads the value with these types.
            match m.constant_from {
                "value" | "sparse_value" => drop(a.tensor(m.constant_from)?),
                "value_float" => drop(a.float(m.constant_from)?),
                "value_floats" => drop(a.floats(m.constant_from)?),
                "value_int" => drop(a.int(m.constant_from)?),
                "value_ints" => drop(a.ints(m.constant_from)?),
                "value_string" => drop(a.string(m.constant_from)?),
                _ => drop(a.strings(m.constant_from)?),
            }
        }
        if op == "ConstantOfShape" {
            if let Some(t) = a.tensor("value")? {
                if t.len() != 1 {
                    return Err(AttrError::new(
                        "value",
                        format!("must hold exactly one element, has {}", t.len()),
                    ));
                }
                m.fill = Some(t.clone());
            }
        }
        Ok(m)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, OpError> {
    Err(OpError(msg.into()))
}

/// A tensor whose element at each output position is `x`'s element at `idx[position]`.
fn gathered(x: &Tensor, shape: Vec<usize>, idx: &[usize]) -> Tensor {
    Tensor::from_parts(shape, x.data().gather(idx))
}

fn reshape(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let attrs = ctx.attrs::<MovementAttrs>()?;
    let spec: Vec<i64> = if ctx.opset < 5 {
        attrs.shape.clone().unwrap_or_default()
    } else {
        input_i64s(inputs, 1)?
    };
    let allowzero = attrs.allowzero;
    let mut shape = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                shape.push(1);
            }
            -1 => return err(format!("shape {spec:?} has more than one -1")),
            0 if !allowzero => match x.shape().get(i) {
                Some(&s) => shape.push(s),
                None => {
                    return err(format!(
                        "shape {spec:?} copies dim {i}, but the input has rank {}",
                        x.rank()
                    ))
                }
            },
            d if d < 0 => return err(format!("invalid dimension {d} in shape {spec:?}")),
            d => shape.push(d as usize),
        }
    }
    if let Some(i) = infer {
        let known: usize = shape.iter().product();
        if known == 0 || x.len() % known != 0 {
            return err(format!(
                "cannot reshape {:?} ({} elements) to {spec:?}",
                x.shape(),
                x.len()
            ));
        }
        shape[i] = x.len() / known;
    }
    if shape.iter().product::<usize>() != x.len() {
        return err(format!(
            "cannot reshape {:?} ({} elements) to {spec:?}",
            x.shape(),
            x.len()
        ));
    }
    Ok(vec![Tensor::from_parts(shape, x.data().clone())])
}

/// Source offsets for a transpose: output axis `i` is input axis `perm[i]`.
pub fn transpose_indices(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let st = strides_of(shape);
    let src_st: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let n: usize = shape.iter().product();
    let mut idx = Vec::with_capacity(n);
    let r = out_shape.len();
    if r == 0 {
        return (out_shape, (0..n).collect());
    }
    let mut pos = vec![0usize; r];
    let mut off = 0usize;
    let inner = out_shape[r - 1];
    let inner_st = src_st[r - 1];
    if n == 0 {
        return (out_shape, idx);
    }
    loop {
        for k in 0..inner {
            idx.push(off + k * inner_st);
        }
        let mut d = r - 1;
        loop {
            if d == 0 {
                return (out_shape, idx);
            }
            d -= 1;
            pos[d] += 1;
            off += src_st[d];
            if pos[d] < out_shape[d] {
                break;
            }
            off -= src_st[d] * out_shape[d];
            pos[d] = 0;
        }
    }
}

fn transpose(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let r = x.rank();
    let perm: Vec<usize> = match &ctx.attrs::<MovementAttrs>()?.perm {
        Some(p) => {
            let p = p.clone();
            if p.len() != r {
                return err(format!("perm {p:?} must list all {r} axes"));
            }
            p
        }
        None => (0..r).rev().collect(),
    };
    if let TensorData::F32(_) = x.data() {
        return Ok(vec![super::matmul::permute(x, &perm)]);
    }
    let (shape, idx) = transpose_indices(x.shape(), &perm);
    Ok(vec![gathered(x, shape, &idx)])
}

fn flatten(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let r = x.rank() as i64;
    let mut axis = ctx.attrs::<MovementAttrs>()?.axis;
    if axis < 0 {
        axis += r;
    }
    if axis < 0 || axis > r {
        return err(format!("axis {axis} is out of range for rank {r}"));
    }
    let a = axis as usize;
    let outer: usize = x.shape()[..a].iter().product();
    let inner: usize = x.shape()[a..].iter().product();
    Ok(vec![Tensor::from_parts(
        vec![outer, inner],
        x.data().clone(),
    )])
}

fn axes_from(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    input_from: i64,
) -> Result<Option<Vec<i64>>, OpError> {
    if ctx.opset >= input_from {
        match opt_input(inputs, 1) {
            Some(t) => Ok(Some(
                t.to_i64_vec()
                    .ok_or_else(|| OpError("axes must be integers".into()))?,
            )),
            None => Ok(None),
        }
    } else {
        Ok(ctx.attrs::<MovementAttrs>()?.axes.clone())
    }
}

fn squeeze(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let shape: Vec<usize> = match axes_from(ctx, inputs, 13)? {
        Some(axes) => {
            let axes = norm_axes(&axes, x.rank())?;
            for &a in &axes {
                if x.shape()[a] != 1 {
                    return err(format!("cannot squeeze axis {a} of size {}", x.shape()[a]));
                }
            }
            (0..x.rank())
                .filter(|d| !axes.contains(d))
                .map(|d| x.shape()[d])
                .collect()
        }
        None => x.shape().iter().copied().filter(|&d| d != 1).collect(),
    };
    Ok(vec![Tensor::from_parts(shape, x.data().clone())])
}

fn unsqueeze(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let axes = axes_from(ctx, inputs, 13)?.ok_or_else(|| OpError("axes are required".into()))?;
    let out_rank = x.rank() + axes.len();
    let axes = norm_axes(&axes, out_rank)?;
    let mut shape = Vec::with_capacity(out_rank);
    let mut it = x.shape().iter();
    for d in 0..out_rank {
        if axes.contains(&d) {
            shape.push(1);
        } else {
            shape.push(
                *it.next()
                    .ok_or_else(|| OpError("axes do not fit the input rank".into()))?,
            );
        }
    }
    Ok(vec![Tensor::from_parts(shape, x.data().clone())])
}

fn concat(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let parts: Vec<&Tensor> = inputs.iter().flatten().copied().collect();
    let first = *parts.first().ok_or_else(|| OpError("no inputs".into()))?;
    let axis = norm_axis(ctx.attrs::<MovementAttrs>()?.axis, first.rank())?;
    let mut out_shape = first.shape().to_vec();
    out_shape[axis] = 0;
    for p in &parts {
        if p.rank() != first.rank()
            || p.dtype() != first.dtype()
            || (0..p.rank()).any(|d| d != axis && p.shape()[d] != first.shape()[d])
        {
            return err(format!(
                "inputs {:?} ({}) and {:?} ({}) cannot be concatenated on axis {axis}",
                first.shape(),
                first.dtype(),
                p.shape(),
                p.dtype()
            ));
        }
        out_shape[axis] += p.shape()[axis];
    }
    let outer: usize = first.shape()[..axis].iter().product();
    let inner: usize = first.shape()[axis + 1..].iter().product();
    // Each part's block of each outer index, in output order, copied once (with outer > 1 the
    // parts were joined whole and then gathered block by block: two copies of the output).
    let blocks: Vec<usize> = parts.iter().map(|p| p.shape()[axis] * inner).collect();
    let all = TensorData::concat_blocks(
        &parts.iter().map(|p| p.data()).collect::<Vec<_>>(),
        &blocks,
        outer,
    )
    .expect("same dtype, and shapes checked above");
    Ok(vec![Tensor::from_parts(out_shape, all)])
}

/// Copies the sub-range `[start, start+len)` of `axis`.
fn take_range(x: &Tensor, axis: usize, start: usize, len: usize) -> Tensor {
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let dim = x.shape()[axis];
    // One contiguous run per outer index (not an index per value).
    let runs: Vec<(usize, usize)> = (0..outer)
        .map(|o| ((o * dim + start) * inner, len * inner))
        .collect();
    let mut shape = x.shape().to_vec();
    shape[axis] = len;
    Tensor::from_parts(shape, x.data().gather_runs(&runs))
}

fn split(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let attrs = ctx.attrs::<MovementAttrs>()?;
    let axis = norm_axis(attrs.axis, x.rank())?;
    let dim = x.shape()[axis];
    let n_out = ctx.node.outputs.len();
    let sizes: Vec<usize> = {
        let given = if ctx.opset >= 13 {
            match opt_input(inputs, 1) {
                Some(t) => Some(
                    t.to_i64_vec()
                        .ok_or_else(|| OpError("split must be integers".into()))?,
                ),
                None => None,
            }
        } else {
            attrs.split.clone()
        };
        match given {
            Some(s) => {
                if s.iter().any(|&v| v < 0) || s.iter().sum::<i64>() as usize != dim {
                    return err(format!("split {s:?} does not add up to dimension {dim}"));
                }
                s.into_iter().map(|v| v as usize).collect()
            }
            None => {
                let parts = attrs.num_outputs.unwrap_or(n_out as i64);
                if parts < 1 || parts as usize != n_out {
                    return err(format!(
                        "num_outputs {parts} differs from the node's {n_out} outputs"
                    ));
                }
                let parts = parts as usize;
                let chunk = dim.div_ceil(parts);
                let mut v = Vec::new();
                let mut left = dim;
                for _ in 0..parts {
                    let c = chunk.min(left);
                    v.push(c);
                    left -= c;
                }
                v
            }
        }
    };
    let mut start = 0;
    let mut outs = Vec::with_capacity(sizes.len());
    for s in sizes {
        outs.push(take_range(x, axis, start, s));
        start += s;
    }
    Ok(outs)
}

fn slice(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let r = x.rank();
    let (starts, ends, axes, steps) = if ctx.opset < 10 {
        let attrs = ctx.attrs::<MovementAttrs>()?;
        let starts = attrs
            .starts
            .clone()
            .ok_or_else(|| OpError("starts is required".into()))?;
        let ends = attrs
            .ends
            .clone()
            .ok_or_else(|| OpError("ends is required".into()))?;
        (starts, ends, attrs.axes.clone(), None)
    } else {
        let opt = |i: usize| -> Result<Option<Vec<i64>>, OpError> {
            match opt_input(inputs, i) {
                Some(t) => {
                    Ok(Some(t.to_i64_vec().ok_or_else(|| {
                        OpError(format!("input #{i} must be integers"))
                    })?))
                }
                None => Ok(None),
            }
        };
        (
            input_i64s(inputs, 1)?,
            input_i64s(inputs, 2)?,
            opt(3)?,
            opt(4)?,
        )
    };
    let axes = match axes {
        Some(a) => norm_axes(&a, r)?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return err("starts, ends, axes and steps must have the same length");
    }
    let mut begin = vec![0i64; r];
    let mut step = vec![1i64; r];
    let mut count = x.shape().to_vec();
    for k in 0..starts.len() {
        let a = axes[k];
        let dim = x.shape()[a] as i64;
        let s = steps[k];
        if s == 0 {
            return err("slice step cannot be 0");
        }
        let clampi = |v: i64, lo: i64, hi: i64| v.max(lo).min(hi);
        let mut st = if starts[k] < 0 {
            starts[k] + dim
        } else {
            starts[k]
        };
        let mut en = if ends[k] < 0 { ends[k] + dim } else { ends[k] };
        if s > 0 {
            st = clampi(st, 0, dim);
            en = clampi(en, 0, dim);
        } else {
            st = clampi(st, 0, dim - 1);
            en = clampi(en, -1, dim - 1);
        }
        let n = if s > 0 {
            (en - st + s - 1) / s
        } else {
            (st - en + (-s) - 1) / (-s)
        };
        begin[a] = st;
        step[a] = s;
        count[a] = n.max(0) as usize;
    }
    let r = x.rank();
    // Trailing axes taken whole (from 0, step 1, every index) are contiguous in each row:
    // they fold into one axis, so a row is one run however small the innermost axis is
    // (Magika's [1, 512, 508, 1] slices were 260,000 runs of one value).
    let shape = x.shape();
    let whole = |d: usize| begin[d] == 0 && step[d] == 1 && count[d] == shape[d];
    let k = (0..r).rev().find(|&d| !whole(d)).map_or(0, |d| d + 1);
    if k == 0 {
        return Ok(vec![x.clone()]);
    }
    let inner: usize = shape[k..].iter().product();
    if step[k - 1] == 1 || inner > 1 {
        // Rows of the folded slice: its last axis has step 1.
        let (mut f_shape, mut f_begin, mut f_step, mut f_count) = (
            shape[..k].to_vec(),
            begin[..k].to_vec(),
            step[..k].to_vec(),
            count[..k].to_vec(),
        );
        if step[k - 1] == 1 {
            f_shape[k - 1] *= inner;
            f_begin[k - 1] *= inner as i64;
            f_count[k - 1] *= inner;
        } else {
            f_shape.push(inner);
            f_begin.push(0);
            f_step.push(1);
            f_count.push(inner);
        }
        let run = *f_count.last().expect("k > 0");
        let mut runs = Vec::new();
        slice_rows(&f_shape, &f_begin, &f_step, &f_count, |row| {
            runs.push((row, run))
        });
        return Ok(vec![Tensor::from_parts(count, x.data().gather_runs(&runs))]);
    }
    let idx = slice_offsets(x.shape(), &begin, &step, &count);
    Ok(vec![gathered(x, count, &idx)])
}

/// Calls `f` with the source offset of the first element of every row (innermost axis) of a
/// strided slice (`begin`, `step` and `count` per axis), in order; the offset is carried from
/// row to row, so a row costs one addition.
fn slice_rows(
    shape: &[usize],
    begin: &[i64],
    step: &[i64],
    count: &[usize],
    mut f: impl FnMut(usize),
) {
    let r = shape.len();
    if count.contains(&0) {
        return;
    }
    if r == 0 {
        return f(0);
    }
    let st = strides_of(shape);
    // Per axis: the offset delta of one step.
    let delta: Vec<i64> = (0..r).map(|d| step[d] * st[d] as i64).collect();
    let mut row: i64 = (0..r).map(|d| begin[d] * st[d] as i64).sum();
    let mut pos = vec![0usize; r - 1];
    loop {
        f(row as usize);
        // The next row: advance the odometer over the outer axes.
        let mut d = r - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            pos[d] += 1;
            row += delta[d];
            if pos[d] < count[d] {
                break;
            }
            row -= delta[d] * count[d] as i64;
            pos[d] = 0;
        }
    }
}

/// The source offset of every element of a strided slice, in order.
fn slice_offsets(shape: &[usize], begin: &[i64], step: &[i64], count: &[usize]) -> Vec<usize> {
    let r = shape.len();
    let mut idx = Vec::with_capacity(count.iter().product());
    if r == 0 {
        idx.push(0);
        return idx;
    }
    let (inner, inner_delta) = (count[r - 1], step[r - 1] * strides_of(shape)[r - 1] as i64);
    slice_rows(shape, begin, step, count, |row| {
        idx.extend((0..inner as i64).map(|k| (row as i64 + k * inner_delta) as usize))
    });
    idx
}

fn gather(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let ind = input(inputs, 1)?;
    let axis = norm_axis(ctx.attrs::<MovementAttrs>()?.axis, x.rank())?;
    let iv = ind
        .to_i64_vec()
        .ok_or_else(|| OpError("indices must be integers".into()))?;
    let dim = x.shape()[axis] as i64;
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let mut idx = Vec::with_capacity(outer * iv.len() * inner);
    for o in 0..outer {
        for &i in &iv {
            let j = if i < 0 { i + dim } else { i };
            if j < 0 || j >= dim {
                return err(format!(
                    "index {i} is out of bounds for axis {axis} of size {dim}"
                ));
            }
            let base = (o * dim as usize + j as usize) * inner;
            idx.extend(base..base + inner);
        }
    }
    let mut shape = x.shape()[..axis].to_vec();
    shape.extend(ind.shape());
    shape.extend(&x.shape()[axis + 1..]);
    Ok(vec![gathered(x, shape, &idx)])
}

fn gather_elements(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let ind = input(inputs, 1)?;
    let axis = norm_axis(ctx.attrs::<MovementAttrs>()?.axis, x.rank())?;
    if ind.rank() != x.rank() {
        return err("indices must have the same rank as data");
    }
    if let Some(d) = (0..x.rank()).find(|&d| d != axis && ind.shape()[d] > x.shape()[d]) {
        return err(format!(
            "indices {:?} are larger than data {:?} along axis {d}",
            ind.shape(),
            x.shape()
        ));
    }
    let iv = ind
        .to_i64_vec()
        .ok_or_else(|| OpError("indices must be integers".into()))?;
    let xst = strides_of(x.shape());
    let ist = strides_of(ind.shape());
    let dim = x.shape()[axis] as i64;
    let mut idx = Vec::with_capacity(iv.len());
    for (flat, &i) in iv.iter().enumerate() {
        let j = if i < 0 { i + dim } else { i };
        if j < 0 || j >= dim {
            return err(format!(
                "index {i} is out of bounds for axis {axis} of size {dim}"
            ));
        }
        let mut off = 0;
        let mut rem = flat;
        for d in 0..x.rank() {
            let c = rem / ist[d];
            rem %= ist[d];
            off += if d == axis { j as usize } else { c } * xst[d];
        }
        idx.push(off);
    }
    Ok(vec![gathered(x, ind.shape().to_vec(), &idx)])
}

fn shape_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let r = x.rank() as i64;
    let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let attrs = ctx.attrs::<MovementAttrs>()?;
    let start = clampi(attrs.start);
    let end = clampi(attrs.end.unwrap_or(r));
    let dims: Vec<i64> = x.shape()[start..end.max(start)]
        .iter()
        .map(|&d| d as i64)
        .collect();
    Ok(vec![Tensor::from_i64(vec![dims.len()], dims)])
}

fn constant(ctx: &OpCtx, _inputs: &[Option<&Tensor>]) -> OpResult {
    // The value is data, not a parameter: read from the attribute the parse checked.
    let from = ctx.attrs::<MovementAttrs>()?.constant_from;
    let t = match ctx.node.attr(from) {
        Some(Attribute::Tensor(t)) => t.clone(),
        Some(Attribute::Float(f)) => Tensor::scalar_f32(*f),
        Some(Attribute::Floats(v)) => Tensor::from_f32(vec![v.len()], v.to_vec()),
        Some(Attribute::Int(i)) => Tensor::scalar_i64(*i),
        Some(Attribute::Ints(v)) => Tensor::from_i64(vec![v.len()], v.to_vec()),
        Some(Attribute::String(s)) => {
            Tensor::from_parts(vec![], TensorData::Str(vec![s.clone()].into()))
        }
        Some(Attribute::Strings(v)) => {
            Tensor::from_parts(vec![v.len()], TensorData::Str(v.to_vec().into()))
        }
        _ => return err("Constant has no value attribute"),
    };
    Ok(vec![t])
}

fn constant_of_shape(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let dims = input_i64s(inputs, 0)?;
    if dims.iter().any(|&d| d < 0) {
        return err(format!("negative dimension in {dims:?}"));
    }
    let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    let n = super::util::checked_len(&shape)?;
    let value = ctx
        .attrs::<MovementAttrs>()?
        .fill
        .clone()
        .unwrap_or_else(|| Tensor::from_f32(vec![1], vec![0.0]));
    if value.len() != 1 {
        return err("value must hold exactly one element");
    }
    Ok(vec![Tensor::from_parts(
        shape,
        value.data().gather(&vec![0; n]),
    )])
}

fn expand(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let dims = input_i64s(inputs, 1)?;
    let target: Vec<usize> = dims.iter().map(|&d| d.max(0) as usize).collect();
    let shape = broadcast_shapes(&[x.shape(), &target])?;
    super::util::checked_len(&shape)?;
    let src: Vec<usize> = (0..x.len()).collect();
    let idx = broadcast_to(&src, x.shape(), &shape);
    Ok(vec![gathered(x, shape, &idx)])
}

fn tile(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let reps = input_i64s(inputs, 1)?;
    if reps.len() != x.rank() || reps.iter().any(|&r| r < 0) {
        return err(format!(
            "repeats {reps:?} must be {} non-negative values",
            x.rank()
        ));
    }
    let shape: Vec<usize> = x
        .shape()
        .iter()
        .zip(&reps)
        .map(|(&d, &r)| d.saturating_mul(r as usize))
        .collect();
    let st = strides_of(x.shape());
    let n = super::util::checked_len(&shape)?;
    let ost = strides_of(&shape);
    let idx: Vec<usize> = (0..n)
        .map(|flat| {
            (0..shape.len())
                .map(|d| (flat / ost[d] % shape[d]) % x.shape()[d] * st[d])
                .sum()
        })
        .collect();
    Ok(vec![gathered(x, shape, &idx)])
}

fn dropout(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    if let Some(t) = opt_input(inputs, 2) {
        if t.to_i64_vec().is_some_and(|v| v.first() == Some(&1)) {
            return err("training_mode=true is not supported (inference only)");
        }
    }
    let mut outs = vec![x.clone()];
    if ctx.node.outputs.len() > 1 {
        outs.push(Tensor::from_bool(x.shape().to_vec(), vec![true; x.len()]));
    }
    Ok(outs)
}

/// The single element of a scalar parameter (Range's start, limit, delta) as f64 and i64.
fn scalar_param(t: &Tensor, name: &str, dtype: DType) -> Result<(f64, i64), OpError> {
    if t.dtype() != dtype {
        return err(format!(
            "{name} has dtype {}, start has {dtype}: all three must have one type",
            t.dtype()
        ));
    }
    if t.len() != 1 {
        return err(format!(
            "{name} must hold exactly one value, got shape {:?}",
            t.shape()
        ));
    }
    let f = t
        .to_f64_vec()
        .ok_or_else(|| OpError(format!("{name} is not numeric")))?[0];
    let i = if dtype.is_int() {
        t.to_i64_vec().expect("integer tensor")[0]
    } else {
        0
    };
    Ok((f, i))
}

/// Ranges longer than this are refused rather than allocated.
const RANGE_MAX_LEN: f64 = super::util::MAX_ELEMENTS as f64;

fn range(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let dtype = input(inputs, 0)?.dtype();
    let (s, si) = scalar_param(input(inputs, 0)?, "start", dtype)?;
    let (l, li) = scalar_param(input(inputs, 1)?, "limit", dtype)?;
    let (d, di) = scalar_param(input(inputs, 2)?, "delta", dtype)?;
    let count = ((l - s) / d).ceil();
    if d != 0.0 && count > RANGE_MAX_LEN {
        return err(format!("Range({s}, {l}, {d}) would have {count} elements"));
    }
    if dtype.is_int() {
        let (s, l, d) = (si, li, di);
        if d == 0 {
            return err("delta cannot be 0");
        }
        let n = ((l as f64 - s as f64) / d as f64).ceil().max(0.0) as usize;
        let v: Vec<i64> = (0..n as i64).map(|i| s + i * d).collect();
        return Ok(vec![super::cast::cast_tensor(
            &Tensor::from_i64(vec![n], v),
            dtype,
        )]);
    }
    if d == 0.0 {
        return err("delta cannot be 0");
    }
    let n = ((l - s) / d).ceil().max(0.0) as usize;
    if dtype == DType::F32 {
        let (s, d) = (s as f32, d as f32);
        return Ok(vec![Tensor::from_f32(
            vec![n],
            (0..n).map(|i| s + i as f32 * d).collect(),
        )]);
    }
    let v: Vec<f64> = (0..n).map(|i| s + i as f64 * d).collect();
    Ok(vec![super::cast::cast_tensor(
        &Tensor::from_f64(vec![n], v),
        dtype,
    )])
}

fn pad(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let r = x.rank();
    let attrs = ctx.attrs::<MovementAttrs>()?;
    let mode = attrs.pad_mode.to_string();
    let (pads, value, axes): (Vec<i64>, Option<Tensor>, Option<Vec<usize>>) = if ctx.opset < 11 {
        let p = attrs
            .pads
            .clone()
            .ok_or_else(|| OpError("pads is required".into()))?;
        let v = attrs.pad_value;
        (
            p,
            Some(super::cast::cast_tensor(&Tensor::scalar_f32(v), x.dtype())),
            None,
        )
    } else {
        let axes = match opt_input(inputs, 3) {
            Some(t) => Some(norm_axes(
                &t.to_i64_vec()
                    .ok_or_else(|| OpError("axes must be integers".into()))?,
                r,
            )?),
            None => None,
        };
        (input_i64s(inputs, 1)?, opt_input(inputs, 2).cloned(), axes)
    };
    let axes = axes.unwrap_or_else(|| (0..r).collect());
    if pads.len() != 2 * axes.len() {
        return err(format!("pads {pads:?} must have {} values", 2 * axes.len()));
    }
    let mut before = vec![0i64; r];
    let mut after = vec![0i64; r];
    for (k, &a) in axes.iter().enumerate() {
        before[a] = pads[k];
        after[a] = pads[k + axes.len()];
    }
    let out_shape: Vec<usize> = (0..r)
        .map(|d| (x.shape()[d] as i64 + before[d] + after[d]).max(0) as usize)
        .collect();
    let mode = PadMode::parse(&mode)?;
    if let Some(d) = (0..r).find(|&d| x.shape()[d] == 0 && (before[d] > 0 || after[d] > 0)) {
        if mode != PadMode::Constant {
            return err(format!(
                "axis {d} of X {:?} is empty: there is nothing to pad it with in mode {mode:?}",
                x.shape()
            ));
        }
    }
    // Gather from x's buffer, followed by the fill value where the mode has one.
    let fill = match value {
        Some(v) if !v.is_empty() => v.data().gather(&[0]),
        _ => TensorData::zeros(x.dtype(), 1),
    };
    if fill.dtype() != x.dtype() {
        return err(format!(
            "constant_value has dtype {}, data has {}",
            fill.dtype(),
            x.dtype()
        ));
    }
    let runs = pad_runs(x.shape(), &out_shape, &before, mode);
    let both = match mode {
        PadMode::Constant => TensorData::concat(&[x.data(), &fill]).expect("same dtype"),
        _ => x.data().clone(),
    };
    Ok(vec![Tensor::from_parts(out_shape, both.gather_runs(&runs))])
}

/// Pad's modes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum PadMode {
    Constant,
    Edge,
    Reflect,
    Wrap,
}

impl PadMode {
    fn parse(mode: &str) -> Result<PadMode, OpError> {
        Ok(match mode {
            "constant" => PadMode::Constant,
            "edge" => PadMode::Edge,
            "reflect" => PadMode::Reflect,
            "wrap" => PadMode::Wrap,
            other => return err(format!("unknown pad mode '{other}'")),
        })
    }

    /// The input index that output index `o` (counted from the input's first, so negative in
    /// the padding before it) reads along an axis of `dim` values; None for the constant fill.
    fn source(self, o: i64, dim: i64) -> Option<i64> {
        if (0..dim).contains(&o) {
            return Some(o);
        }
        match self {
            PadMode::Constant => None,
            PadMode::Edge => Some(o.clamp(0, dim - 1)),
            PadMode::Reflect if dim == 1 => Some(0),
            PadMode::Reflect => {
                let period = 2 * (dim - 1);
                let m = o.rem_euclid(period);
                Some(if m < dim { m } else { period - m })
            }
            PadMode::Wrap => Some(o.rem_euclid(dim)),
        }
    }
}

/// The runs (start, length) of the input buffer, followed by one fill value at index
/// `product(shape)`, that make Pad's output in order: per output row (every axis but the
/// last), the padding before it value by value, the input's part of the row as one run, the
/// padding after it value by value (a per-value index was 12 % of Silero's run).
fn pad_runs(
    shape: &[usize],
    out_shape: &[usize],
    before: &[i64],
    mode: PadMode,
) -> Vec<(usize, usize)> {
    let end = shape.iter().product::<usize>();
    let r = shape.len();
    if r == 0 {
        return vec![(0, 1)];
    }
    let st = strides_of(shape);
    let (last, dim) = (r - 1, shape[r - 1] as i64);
    let width = out_shape[last];
    let rows: usize = out_shape[..last].iter().product();
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut push = |start: usize, len: usize| match runs.last_mut() {
        // A run continuing the previous one (not the fill value, which repeats) joins it.
        Some(prev) if prev.0 + prev.1 == start && start != end && len > 0 => prev.1 += len,
        _ if len > 0 => runs.push((start, len)),
        _ => {}
    };
    // Output columns j read input column j − before: inside [0, dim) for j in lo..hi. The
    // columns outside it read the same input columns (or the fill) in every row: worked out
    // once, not per row and value (a `rem_euclid` per padded value was most of a reflect Pad).
    let lo = before[last].clamp(0, width as i64) as usize;
    let hi = (dim + before[last]).clamp(lo as i64, width as i64) as usize;
    let border: Vec<Option<usize>> = (0..lo)
        .chain(hi..width)
        .map(|j| {
            mode.source(j as i64 - before[last], dim)
                .map(|i| i as usize)
        })
        .collect();
    let (border_before, border_after) = border.split_at(lo);
    for row in 0..rows {
        // The row's offset in the input, or None where an outer axis reads the fill.
        let mut base = Some(0usize);
        let mut rem = row;
        for d in (0..last).rev() {
            let o = (rem % out_shape[d]) as i64 - before[d];
            rem /= out_shape[d];
            base = match (base, mode.source(o, shape[d] as i64)) {
                (Some(b), Some(i)) => Some(b + i as usize * st[d]),
                _ => None,
            };
        }
        let Some(base) = base else {
            (0..width).for_each(|_| push(end, 1));
            continue;
        };
        let one = |i: &Option<usize>| i.map_or(end, |i| base + i);
        border_before.iter().for_each(|i| push(one(i), 1));
        if hi > lo {
            push(base + (lo as i64 - before[last]) as usize, hi - lo);
        }
        border_after.iter().for_each(|i| push(one(i), 1));
    }
    runs
}

fn depth_to_space(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let attrs = ctx.attrs::<MovementAttrs>()?;
    let b = attrs.blocksize;
    if x.rank() != 4 || x.shape()[1] % (b * b) != 0 {
        return err(format!("input {:?} does not fit blocksize {b}", x.shape()));
    }
    let (n, c, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let crd = attrs.crd;
    let c2 = c / (b * b);
    // Reshape to 6-D, transpose, reshape back.
    let (shape6, perm) = if crd {
        (vec![n, c2, b, b, h, w], vec![0, 1, 4, 2, 5, 3])
    } else {
        (vec![n, b, b, c2, h, w], vec![0, 3, 4, 1, 5, 2])
    };
    let (_, idx) = transpose_indices(&shape6, &perm);
    Ok(vec![gathered(x, vec![n, c2, h * b, w * b], &idx)])
}

fn space_to_depth(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let b = ctx.attrs::<MovementAttrs>()?.blocksize;
    if x.rank() != 4 || x.shape()[2] % b != 0 || x.shape()[3] % b != 0 {
        return err(format!("input {:?} does not fit blocksize {b}", x.shape()));
    }
    let (n, c, h, w) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let shape6 = vec![n, c, h / b, b, w / b, b];
    let (_, idx) = transpose_indices(&shape6, &[0, 3, 5, 1, 2, 4]);
    Ok(vec![gathered(x, vec![n, c * b * b, h / b, w / b], &idx)])
}

fn trilu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    if x.rank() < 2 {
        return err("input must have rank >= 2");
    }
    let k = match opt_input(inputs, 1) {
        Some(t) => t.to_i64_vec().and_then(|v| v.first().copied()).unwrap_or(0),
        None => 0,
    };
    let upper = ctx.attrs::<MovementAttrs>()?.upper;
    let (rows, cols) = (x.shape()[x.rank() - 2], x.shape()[x.rank() - 1]);
    let end = x.len();
    let idx: Vec<usize> = (0..x.len())
        .map(|flat| {
            let (i, j) = ((flat / cols % rows) as i64, (flat % cols) as i64);
            let keep = if upper { j - i >= k } else { j - i <= k };
            if keep {
                flat
            } else {
                end
            }
        })
        .collect();
    let both =
        TensorData::concat(&[x.data(), &TensorData::zeros(x.dtype(), 1)]).expect("same dtype");
    Ok(vec![Tensor::from_parts(
        x.shape().to_vec(),
        both.gather(&idx),
    )])
}

fn non_zero(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let v = x
        .to_f64_vec()
        .ok_or_else(|| OpError(format!("dtype {} is not supported", x.dtype())))?;
    let st = strides_of(x.shape());
    let hits: Vec<usize> = (0..v.len()).filter(|&i| v[i] != 0.0).collect();
    let r = x.rank().max(1);
    let mut out = vec![0i64; r * hits.len()];
    for (k, &flat) in hits.iter().enumerate() {
        for d in 0..x.rank() {
            out[d * hits.len() + k] = (flat / st[d] % x.shape()[d]) as i64;
        }
    }
    Ok(vec![Tensor::from_i64(
        vec![x.rank(), hits.len()],
        if x.rank() == 0 { Vec::new() } else { out },
    )])
}

/// CumSum, or CumProd (`product`): running sums/products along an axis, in f64.
fn cumulate(ctx: &OpCtx, inputs: &[Option<&Tensor>], product: bool) -> OpResult {
    let x = input(inputs, 0)?;
    let axis = input(inputs, 1)?
        .to_i64_vec()
        .and_then(|v| v.first().copied())
        .ok_or_else(|| OpError("axis must be an integer".into()))?;
    let axis = norm_axis(axis, x.rank())?;
    let attrs = ctx.attrs::<MovementAttrs>()?;
    let (exclusive, reverse) = (attrs.exclusive, attrs.reverse);
    let v = x
        .to_f64_vec()
        .ok_or_else(|| OpError(format!("dtype {} is not supported", x.dtype())))?;
    let outer: usize = x.shape()[..axis].iter().product();
    let len = x.shape()[axis];
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let mut out = vec![0f64; v.len()];
    let step_with = |acc: f64, e: f64| if product { acc * e } else { acc + e };
    for o in 0..outer {
        for i in 0..inner {
            // Inclusive sums start from -0, so the first output is the first input to the
            // sign of zero (as ONNX Runtime); an exclusive sum's first output is +0, an
            // exclusive product's 1.
            let mut acc = match (product, exclusive) {
                (true, _) => 1f64,
                (false, true) => 0f64,
                (false, false) => -0f64,
            };
            for step in 0..len {
                let k = if reverse { len - 1 - step } else { step };
                let at = (o * len + k) * inner + i;
                if exclusive {
                    out[at] = acc;
                    acc = step_with(acc, v[at]);
                } else {
                    acc = step_with(acc, v[at]);
                    out[at] = acc;
                }
            }
        }
    }
    let t = if x.dtype().is_int() {
        Tensor::from_i64(x.shape().to_vec(), out.iter().map(|&f| f as i64).collect())
    } else {
        Tensor::from_f64(x.shape().to_vec(), out)
    };
    Ok(vec![super::cast::cast_tensor(&t, x.dtype())])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row-wise slice offsets equal the per-element formula for every sign of step.
    #[test]
    fn slice_offsets_equal_the_per_element_formula() {
        let shape = [3usize, 4, 5];
        for (begin, step, count) in [
            ([0i64, 0, 0], [1i64, 1, 1], [3usize, 4, 5]),
            ([2, 3, 4], [-1, -2, -3], [3, 2, 2]),
            ([1, 0, 1], [1, 3, 2], [2, 2, 2]),
            ([0, 1, 0], [2, 1, 1], [2, 0, 5]),
        ] {
            let st = strides_of(&shape);
            let mut want = Vec::new();
            for a in 0..count[0] {
                for b in 0..count[1] {
                    for c in 0..count[2] {
                        let p = [a, b, c];
                        let off: i64 = (0..3)
                            .map(|d| (begin[d] + p[d] as i64 * step[d]) * st[d] as i64)
                            .sum();
                        want.push(off as usize);
                    }
                }
            }
            assert_eq!(slice_offsets(&shape, &begin, &step, &count), want);
            // Row starts expand to the same offsets when the innermost step is 1.
            if step[2] == 1 {
                let mut rows = Vec::new();
                slice_rows(&shape, &begin, &step, &count, |r| {
                    rows.extend(r..r + count[2])
                });
                assert_eq!(rows, want);
            }
        }
        assert_eq!(slice_offsets(&[], &[], &[], &[]), vec![0]);
    }
    use crate::graph::Node;

    fn run(op: &str, opset: i64, attrs: &[(&str, Attribute)], inputs: &[&Tensor]) -> Vec<Tensor> {
        try_run(op, opset, attrs, inputs).unwrap()
    }

    fn try_run(
        op: &str,
        opset: i64,
        attrs: &[(&str, Attribute)],
        inputs: &[&Tensor],
    ) -> Result<Vec<Tensor>, OpError> {
        let node = Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec!["y".into()],
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        };
        let k = Registry::global().get("", op).unwrap();
        let args: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        k(&OpCtx::new(&node, opset), &args)
    }

    fn i64s(v: &[i64]) -> Tensor {
        Tensor::from_i64(vec![v.len()], v.to_vec())
    }

    #[test]
    fn reshape_zero_and_minus_one() {
        let x = Tensor::from_f32(vec![2, 3, 4], vec![0.0; 24]);
        let y = run("Reshape", 14, &[], &[&x, &i64s(&[0, -1])]);
        assert_eq!(y[0].shape(), &[2, 12]);
    }

    /// Slices whose trailing axes are taken whole (folded into one run per row), with and
    /// without a step on the axis before them, the whole tensor, and an empty slice: the values
    /// of the per-element offsets.
    #[test]
    fn slices_with_whole_trailing_axes_take_the_values_of_every_offset() {
        let shape = [2usize, 5, 3, 1];
        let x = Tensor::from_i64(shape.to_vec(), (0..30).collect());
        for (starts, ends, steps) in [
            ([0i64, 0, 0, 0], [2i64, 5, 3, 1], [1i64, 1, 1, 1]),
            ([0, 1, 0, 0], [2, 4, 3, 1], [1, 1, 1, 1]),
            ([1, 4, 0, 0], [0, 0, 3, 1], [-1, -2, 1, 1]),
            ([0, 0, 1, 0], [2, 5, 3, 1], [1, 2, 1, 1]),
            ([0, 0, 0, 0], [2, 5, 2, 1], [1, 1, 2, 1]),
            ([0, 2, 0, 0], [2, 2, 3, 1], [1, 1, 1, 1]),
        ] {
            let y = run(
                "Slice",
                13,
                &[],
                &[
                    &x,
                    &i64s(&starts),
                    &i64s(&ends),
                    &i64s(&[0, 1, 2, 3]),
                    &i64s(&steps),
                ],
            );
            let count: Vec<usize> = (0..4)
                .map(|d| {
                    let n = (ends[d] - starts[d] + steps[d] - steps[d].signum()) / steps[d];
                    n.max(0) as usize
                })
                .collect();
            let want: Vec<i64> = slice_offsets(&shape, &starts, &steps, &count)
                .into_iter()
                .map(|o| o as i64)
                .collect();
            assert_eq!(y[0].shape(), count.as_slice(), "{starts:?} {steps:?}");
            assert_eq!(
                y[0].as_i64().unwrap(),
                want.as_slice(),
                "{starts:?} {steps:?}"
            );
        }
    }

    #[test]
    fn slice_negative_steps_and_clamping() {
        let x = Tensor::from_i64(vec![5], vec![0, 1, 2, 3, 4]);
        let y = run(
            "Slice",
            13,
            &[],
            &[
                &x,
                &i64s(&[-1]),
                &i64s(&[i64::MIN]),
                &i64s(&[0]),
                &i64s(&[-2]),
            ],
        );
        assert_eq!(y[0].as_i64().unwrap(), &[4, 2, 0]);
        let y = run("Slice", 13, &[], &[&x, &i64s(&[1]), &i64s(&[i64::MAX])]);
        assert_eq!(y[0].as_i64().unwrap(), &[1, 2, 3, 4]);
    }

    #[test]
    fn pad_reflect_and_constant() {
        let x = Tensor::from_f32(vec![3], vec![1., 2., 3.]);
        let y = run(
            "Pad",
            13,
            &[("mode", Attribute::String("reflect".into()))],
            &[&x, &i64s(&[2, 2])],
        );
        assert_eq!(y[0].as_f32().unwrap(), &[3., 2., 1., 2., 3., 2., 1.]);
        let c = Tensor::scalar_f32(9.0);
        let y = run("Pad", 13, &[], &[&x, &i64s(&[1, 0]), &c]);
        assert_eq!(y[0].as_f32().unwrap(), &[9., 1., 2., 3.]);
        // An empty axis pads with the constant only: the other modes have nothing to copy.
        let empty = Tensor::from_f32(vec![0], vec![]);
        let y = run("Pad", 13, &[], &[&empty, &i64s(&[1, 1]), &c]);
        assert_eq!(y[0].as_f32().unwrap(), &[9., 9.]);
        for mode in ["edge", "reflect", "wrap"] {
            let attrs = [("mode", Attribute::String(mode.into()))];
            let e = try_run("Pad", 13, &attrs, &[&empty, &i64s(&[1, 1])]).unwrap_err();
            assert!(e.0.contains("empty"), "{mode}: {}", e.0);
        }
    }

    /// The runs give, for every output element, the input element (or the fill) that the
    /// per-element definition reads: every mode, pads and crops on each axis, axes of 1.
    #[test]
    fn pad_runs_read_what_each_output_element_reads() {
        let mut rng = crate::data::loader::Mt19937::new(17);
        let mut pick = |n: u32| (rng.next_u32() % n) as i64;
        for mode in [
            PadMode::Constant,
            PadMode::Edge,
            PadMode::Reflect,
            PadMode::Wrap,
        ] {
            for _ in 0..200 {
                let rank = 1 + pick(3) as usize;
                let shape: Vec<usize> = (0..rank).map(|_| 1 + pick(4) as usize).collect();
                let lowest = |d: usize| {
                    if mode == PadMode::Constant {
                        -(shape[d] as i64 - 1)
                    } else {
                        0
                    }
                };
                let before: Vec<i64> = (0..rank).map(|d| lowest(d).max(pick(7) - 2)).collect();
                let after: Vec<i64> = (0..rank).map(|d| lowest(d).max(pick(7) - 2)).collect();
                let out: Vec<usize> = (0..rank)
                    .map(|d| (shape[d] as i64 + before[d] + after[d]).max(0) as usize)
                    .collect();
                let end: usize = shape.iter().product();
                let got: Vec<usize> = pad_runs(&shape, &out, &before, mode)
                    .iter()
                    .flat_map(|&(s, l)| {
                        if s == end {
                            vec![end; l]
                        } else {
                            (s..s + l).collect()
                        }
                    })
                    .collect();
                let st = strides_of(&shape);
                let ost = strides_of(&out);
                let n: usize = out.iter().product();
                let want: Vec<usize> = (0..n)
                    .map(|flat| {
                        let mut off = Some(0usize);
                        for d in 0..rank {
                            let o = (flat / ost[d] % out[d]) as i64 - before[d];
                            off = match (off, mode.source(o, shape[d] as i64)) {
                                (Some(b), Some(i)) => Some(b + i as usize * st[d]),
                                _ => None,
                            };
                        }
                        off.unwrap_or(end)
                    })
                    .collect();
                assert_eq!(got, want, "{mode:?} {shape:?} {before:?} {after:?}");
            }
        }
    }

    #[test]
    fn transpose_gather_concat() {
        let x = Tensor::from_i64(vec![2, 3], vec![1, 2, 3, 4, 5, 6]);
        let y = run("Transpose", 13, &[], &[&x]);
        assert_eq!(y[0].as_i64().unwrap(), &[1, 4, 2, 5, 3, 6]);
        let y = run(
            "Gather",
            13,
            &[("axis", Attribute::Int(1))],
            &[&x, &i64s(&[-1, 0])],
        );
        assert_eq!(y[0].as_i64().unwrap(), &[3, 1, 6, 4]);
        let y = run("Concat", 13, &[("axis", Attribute::Int(0))], &[&x, &x]);
        assert_eq!(y[0].shape(), &[4, 3]);
        let y = run("Concat", 13, &[("axis", Attribute::Int(1))], &[&x, &x]);
        assert_eq!(
            y[0].as_i64().unwrap(),
            &[1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6]
        );
    }
}
