//! Control flow: If, Loop, Scan. Their bodies are subgraph attributes, which the kernel runs
//! through the context's [`SubgraphRunner`] (the interpreter, in the enclosing scope and under
//! the node's precision; docs/numerics.md). Semantics follow the ONNX operator specification:
//!
//! - **If**: runs `then_branch` or `else_branch` on the single element of `cond`; the branches
//!   may produce outputs of different shapes.
//! - **Loop**: inputs `M` (trip count, optional), `cond` (optional), `N` loop-carried values;
//!   the body takes `(iteration_num, cond, v_1..v_N)` and returns `(cond, v_1..v_N,
//!   scan_1..scan_K)`. It runs while `i < M` and `cond` holds (each test skipped when its
//!   input is omitted); the node returns the final `N` values, then each scan output stacked
//!   over the iterations on a new first axis. With no iteration the loop-carried outputs are
//!   the initial values and each scan output has a leading dimension of 0.
//! - **Scan** (opset 9+): `N` state values then `num_scan_inputs` scan inputs, sliced along
//!   `scan_input_axes` (forward, or backward where `scan_input_directions` is 1); the body
//!   takes `(s_1..s_N, x_1..x_M)` and returns `(s_1..s_N, y_1..y_K)`; each `y` is stacked along
//!   `scan_output_axes` (in reverse iteration order where `scan_output_directions` is 1).
//!   Opset 8's batched form (a leading batch axis on every input, `sequence_lens`,
//!   `directions`) runs as one opset-9 scan per batch entry. A batch entry whose
//!   `sequence_lens` is shorter than the scan axis runs that many iterations; Scan-8 says its
//!   scan outputs still have the full length with "undefined" values past the sequence:
//!   mixprec writes zeros there. A shorter sequence scanned in reverse is refused: the spec
//!   does not say whether the reversed scan starts at the sequence's last element or at the
//!   end of the axis (docs/numerics.md).

use super::util::{input, norm_axis, opt_input};
use super::{InferCtx, OpCtx, OpError, OpResult, Registry, SubgraphRunner};
use crate::graph::fact::Fact;
use crate::graph::{Dim, Graph};
use crate::tensor::{DType, Tensor, TensorData};

pub fn register(r: &mut Registry) {
    r.add("If", if_op).infer(body_facts);
    r.add("Loop", loop_op).infer(body_facts);
    r.add("Scan", scan).infer(body_facts);
    for op in ["If", "Loop", "Scan"] {
        r.def_mut(op)
            .parse(|n, _| super::attrs::boxed(ControlAttrs::parse(n)));
    }
}

/// The non-graph attributes of If, Loop and Scan (Scan's), and the check that the bodies are
/// graph attributes (If: `then_branch` and `else_branch`; Loop, Scan: `body`).
#[derive(Clone, Debug, PartialEq)]
pub struct ControlAttrs {
    /// Scan's `num_scan_inputs` (required there, >= 1).
    pub num_scan_inputs: i64,
    pub scan_input_axes: Vec<i64>,
    /// 0 (forward) or 1 (backward), one per scan input / output.
    pub scan_input_directions: Vec<i64>,
    pub scan_output_axes: Vec<i64>,
    pub scan_output_directions: Vec<i64>,
    /// Scan-8's `directions`.
    pub directions: Vec<i64>,
}

impl ControlAttrs {
    fn parse(node: &crate::graph::Node) -> Result<ControlAttrs, super::attrs::AttrError> {
        use super::attrs::{AttrError, Attrs};
        let a = Attrs::new(node);
        match node.op_type.as_str() {
            "If" => {
                a.graph("then_branch", true)?;
                a.graph("else_branch", true)?;
            }
            _ => a.graph("body", true)?,
        }
        let mut c = ControlAttrs {
            num_scan_inputs: 0,
            scan_input_axes: Vec::new(),
            scan_input_directions: Vec::new(),
            scan_output_axes: Vec::new(),
            scan_output_directions: Vec::new(),
            directions: Vec::new(),
        };
        if node.op_type != "Scan" {
            return Ok(c);
        }
        c.num_scan_inputs = a.required_int("num_scan_inputs")?;
        if c.num_scan_inputs < 1 {
            return Err(AttrError::new(
                "num_scan_inputs",
                format!("must be >= 1, got {}", c.num_scan_inputs),
            ));
        }
        let dirs = |name: &str| -> Result<Vec<i64>, AttrError> {
            let v = a.ints(name)?.unwrap_or_default();
            if v.iter().any(|&d| d != 0 && d != 1) {
                return Err(AttrError::new(
                    name,
                    format!("every value must be 0 (forward) or 1 (backward), got {v:?}"),
                ));
            }
            Ok(v)
        };
        c.scan_input_directions = dirs("scan_input_directions")?;
        c.scan_output_directions = dirs("scan_output_directions")?;
        c.directions = dirs("directions")?;
        c.scan_input_axes = a.ints("scan_input_axes")?.unwrap_or_default();
        c.scan_output_axes = a.ints("scan_output_axes")?.unwrap_or_default();
        for (name, v) in [
            ("scan_input_axes", &c.scan_input_axes),
            ("scan_input_directions", &c.scan_input_directions),
        ] {
            if !v.is_empty() && v.len() as i64 != c.num_scan_inputs {
                return Err(AttrError::new(
                    name,
                    format!(
                        "expected {} values (one per scan input), got {}",
                        c.num_scan_inputs,
                        v.len()
                    ),
                ));
            }
        }
        Ok(c)
    }
}

/// Output facts: the element types the body declares for the node's outputs (If: the then
/// branch; Loop: after the condition). Shapes depend on the data (branch taken, iteration
/// count) and stay open; the model's own declarations fill them where it has them.
fn body_facts(ctx: &InferCtx, _inputs: &[Option<&Fact>]) -> Result<Vec<Fact>, OpError> {
    let (attr, skip) = match ctx.node.op_type.as_str() {
        "If" => ("then_branch", 0),
        "Loop" => ("body", 1),
        _ => ("body", 0),
    };
    let outs = ctx.node.outputs.len();
    let dtypes: Vec<Option<DType>> = match ctx.node.attr_graph(attr) {
        Some(g) => g.outputs.iter().skip(skip).map(|o| o.dtype).collect(),
        None => Vec::new(),
    };
    Ok((0..outs)
        .map(|i| Fact::new(dtypes.get(i).copied().flatten(), None))
        .collect())
}

fn err<T>(msg: impl Into<String>) -> Result<T, OpError> {
    Err(OpError(msg.into()))
}

fn runner<'a>(ctx: &OpCtx<'a>) -> Result<&'a dyn SubgraphRunner, OpError> {
    ctx.subgraphs
        .ok_or_else(|| OpError("control flow needs the interpreter to run its subgraphs".into()))
}

fn body<'a>(ctx: &OpCtx<'a>, attr: &str) -> Result<&'a Graph, OpError> {
    ctx.node
        .attr_graph(attr)
        .ok_or_else(|| OpError(format!("graph attribute '{attr}' is required")))
}

/// The truth of a one-element condition tensor.
fn truth(t: &Tensor, what: &str) -> Result<bool, OpError> {
    if t.len() != 1 {
        return err(format!(
            "{what} must have one element, it has shape {:?}",
            t.shape()
        ));
    }
    match t.data() {
        TensorData::Bool(v) => Ok(v[0]),
        d => match d.to_f64_vec() {
            Some(v) => Ok(v[0] != 0.0),
            None => err(format!("{what} has dtype {}, expected bool", t.dtype())),
        },
    }
}

fn if_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let cond = truth(input(inputs, 0)?, "cond")?;
    let attr = if cond { "then_branch" } else { "else_branch" };
    body(ctx, attr)?;
    let outs = runner(ctx)?.run(attr, Vec::new())?;
    if outs.len() != ctx.node.outputs.len() {
        return err(format!(
            "{attr} returns {} outputs, the node declares {}",
            outs.len(),
            ctx.node.outputs.len()
        ));
    }
    Ok(outs)
}

/// The slice `index` of `axis`, without that axis.
pub fn slice_axis(x: &Tensor, axis: usize, index: usize) -> Tensor {
    let shape = x.shape();
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let dim = shape[axis];
    let mut idx = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        let base = (o * dim + index) * inner;
        idx.extend(base..base + inner);
    }
    let mut out_shape = shape.to_vec();
    out_shape.remove(axis);
    Tensor::from_parts(out_shape, x.data().gather(&idx))
}

/// Stacks tensors of one shape and dtype along a new `axis` (at most their rank).
pub fn stack(parts: &[Tensor], axis: usize) -> Result<Tensor, OpError> {
    let first = parts
        .first()
        .ok_or_else(|| OpError("nothing to stack".into()))?;
    for p in parts {
        if p.shape() != first.shape() || p.dtype() != first.dtype() {
            return err(format!(
                "iterations produced {} {:?} and {} {:?}: scan outputs must keep their shape and type",
                first.dtype(),
                first.shape(),
                p.dtype(),
                p.shape()
            ));
        }
    }
    let outer: usize = first.shape()[..axis].iter().product();
    let inner: usize = first.shape()[axis..].iter().product();
    // Each iteration's block of each outer index, in output order (Concat's copy).
    let all = TensorData::concat_blocks(
        &parts.iter().map(|p| p.data()).collect::<Vec<_>>(),
        &vec![inner; parts.len()],
        outer,
    )
    .expect("same dtype and shape, checked above");
    let mut shape = first.shape().to_vec();
    shape.insert(axis, parts.len());
    Ok(Tensor::from_parts(shape, all))
}

/// A scan output of zero iterations: 0 on the scan axis, the body output's declared dims
/// elsewhere where all are fixed, its declared dtype (float32 when undeclared).
fn empty_scan_output(g: &Graph, output: usize, axis: Option<i64>) -> Result<Tensor, OpError> {
    let vi = &g.outputs[output];
    let dims: Vec<usize> = match &vi.shape {
        Some(d) if d.iter().all(|d| matches!(d, Dim::Fixed(_))) => d
            .iter()
            .map(|d| match d {
                Dim::Fixed(f) => *f,
                _ => unreachable!("checked"),
            })
            .collect(),
        _ => Vec::new(),
    };
    let axis = norm_axis(axis.unwrap_or(0), dims.len() + 1)?;
    let mut shape = dims;
    shape.insert(axis, 0);
    Ok(Tensor::zeros(vi.dtype.unwrap_or(DType::F32), shape))
}

fn loop_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let g = body(ctx, "body")?;
    let run = runner(ctx)?;
    let trip = opt_input(inputs, 0)
        .map(|m| super::util::scalar_int(m, "M"))
        .transpose()?;
    let mut cond = match opt_input(inputs, 1) {
        Some(c) => truth(c, "cond")?,
        None => true,
    };
    let n = inputs.len().saturating_sub(2);
    let mut carried: Vec<Tensor> = Vec::with_capacity(n);
    for i in 0..n {
        carried.push(input(inputs, 2 + i)?.clone());
    }
    if g.inputs.len() != 2 + n {
        return err(format!(
            "the body takes {} inputs, the loop gives it 2 + {n}",
            g.inputs.len()
        ));
    }
    let k = match g.outputs.len().checked_sub(1 + n) {
        Some(k) => k,
        None => {
            return err(format!(
                "the body returns {} outputs, it must return cond and {n} loop-carried values",
                g.outputs.len()
            ))
        }
    };
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); k];
    let mut i: i64 = 0;
    while trip.is_none_or(|m| i < m) && cond {
        let mut args = Vec::with_capacity(2 + n);
        args.push(Tensor::from_i64(vec![], vec![i]));
        args.push(Tensor::from_bool(vec![], vec![cond]));
        args.append(&mut carried);
        let mut outs = run.run("body", args)?.into_iter();
        cond = truth(
            &outs.next().expect("checked count"),
            "the body's cond output",
        )?;
        carried = outs.by_ref().take(n).collect();
        for (s, t) in scans.iter_mut().zip(outs) {
            s.push(t);
        }
        i += 1;
    }
    let mut result = carried;
    for (j, s) in scans.iter().enumerate() {
        result.push(if s.is_empty() {
            empty_scan_output(g, 1 + n + j, None)?
        } else {
            stack(s, 0)?
        });
    }
    Ok(result)
}

/// One (opset-9) scan over `states` and `xs`; returns the final states and the scan outputs.
#[allow(clippy::too_many_arguments)]
fn scan_core(
    ctx: &OpCtx,
    g: &Graph,
    mut states: Vec<Tensor>,
    xs: &[&Tensor],
    in_axes: &[i64],
    in_dirs: &[i64],
    out_axes: &[i64],
    out_dirs: &[i64],
) -> Result<Vec<Tensor>, OpError> {
    let run = runner(ctx)?;
    let n = states.len();
    if g.inputs.len() != n + xs.len() {
        return err(format!(
            "the body takes {} inputs, the scan gives it {n} states and {} scan inputs",
            g.inputs.len(),
            xs.len()
        ));
    }
    let k = g.outputs.len().checked_sub(n).ok_or_else(|| {
        OpError(format!(
            "the body returns {} outputs, fewer than the {n} states",
            g.outputs.len()
        ))
    })?;
    let mut axes = Vec::with_capacity(xs.len());
    let mut len = None;
    for (j, x) in xs.iter().enumerate() {
        let a = norm_axis(in_axes.get(j).copied().unwrap_or(0), x.rank())?;
        let l = x.shape()[a];
        if len.is_some_and(|m| m != l) {
            return err(format!(
                "scan input #{j} has {l} steps on axis {a}, an earlier one {}",
                len.unwrap_or(0)
            ));
        }
        len = Some(l);
        axes.push(a);
    }
    let len = len.unwrap_or(0);
    let mut scans: Vec<Vec<Tensor>> = vec![Vec::new(); k];
    for t in 0..len {
        let mut args = std::mem::take(&mut states);
        for (j, x) in xs.iter().enumerate() {
            let at = if in_dirs.get(j).copied().unwrap_or(0) == 1 {
                len - 1 - t
            } else {
                t
            };
            args.push(slice_axis(x, axes[j], at));
        }
        let mut outs = run.run("body", args)?.into_iter();
        states = outs.by_ref().take(n).collect();
        for (s, y) in scans.iter_mut().zip(outs) {
            s.push(y);
        }
    }
    let mut result = states;
    for (j, mut s) in scans.into_iter().enumerate() {
        let axis = out_axes.get(j).copied().unwrap_or(0);
        if s.is_empty() {
            result.push(empty_scan_output(g, n + j, Some(axis))?);
            continue;
        }
        if out_dirs.get(j).copied().unwrap_or(0) == 1 {
            s.reverse();
        }
        let a = norm_axis(axis, s[0].rank() + 1)?;
        result.push(stack(&s, a)?);
    }
    Ok(result)
}

fn scan(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let g = body(ctx, "body")?;
    let attrs = ctx.attrs::<ControlAttrs>()?;
    let m = attrs.num_scan_inputs;
    if ctx.opset < 9 {
        return scan8(ctx, g, inputs, m);
    }
    let m = usize::try_from(m)
        .ok()
        .filter(|&m| m <= inputs.len())
        .ok_or_else(|| {
            OpError(format!(
                "num_scan_inputs {m} does not fit the {} inputs",
                inputs.len()
            ))
        })?;
    let n = inputs.len() - m;
    let mut states = Vec::with_capacity(n);
    for i in 0..n {
        states.push(input(inputs, i)?.clone());
    }
    let xs: Vec<&Tensor> = (n..inputs.len())
        .map(|i| input(inputs, i))
        .collect::<Result<_, _>>()?;
    scan_core(
        ctx,
        g,
        states,
        &xs,
        &attrs.scan_input_axes,
        &attrs.scan_input_directions,
        &attrs.scan_output_axes,
        &attrs.scan_output_directions,
    )
}

/// Opset 8: every input has a leading batch axis, the scan axis is 1; one scan per batch entry.
fn scan8(ctx: &OpCtx, g: &Graph, inputs: &[Option<&Tensor>], m: i64) -> OpResult {
    let rest = inputs.get(1..).unwrap_or(&[]);
    let m = usize::try_from(m)
        .ok()
        .filter(|&m| m <= rest.len())
        .ok_or_else(|| {
            OpError(format!(
                "num_scan_inputs {m} does not fit the {} inputs",
                rest.len()
            ))
        })?;
    let n = rest.len() - m;
    let all: Vec<&Tensor> = (0..rest.len())
        .map(|i| input(rest, i))
        .collect::<Result<_, _>>()?;
    let batch = match all.first() {
        Some(t) if t.rank() > 0 => t.shape()[0],
        _ => return err("opset-8 Scan needs batched inputs"),
    };
    for (j, t) in all.iter().enumerate() {
        if t.rank() == 0 || t.shape()[0] != batch || (j >= n && t.rank() < 2) {
            return err(format!(
                "input #{} of shape {:?} is not batched like the first ({batch})",
                j + 1,
                t.shape()
            ));
        }
    }
    let dirs = ctx.attrs::<ControlAttrs>()?.directions.clone();
    let steps = all.get(n).map_or(0, |x| x.shape()[1]);
    let lens: Vec<usize> = match opt_input(inputs, 0) {
        None => vec![steps; batch],
        Some(t) => {
            let lens = t
                .to_i64_vec()
                .filter(|_| t.dtype().is_int())
                .ok_or_else(|| OpError("sequence_lens must be integers".into()))?;
            if lens.len() != batch {
                return err(format!(
                    "sequence_lens has {} entries, the batch {batch}",
                    lens.len()
                ));
            }
            let mut out = Vec::with_capacity(batch);
            for (b, &l) in lens.iter().enumerate() {
                let l = usize::try_from(l)
                    .ok()
                    .filter(|&l| l <= steps)
                    .ok_or_else(|| {
                        OpError(format!(
                            "sequence_lens[{b}] = {l} is outside [0, {steps}] (the scan axis)"
                        ))
                    })?;
                if l > 0 && l < steps && dirs.contains(&1) {
                    return err(format!(
                        "sequence_lens[{b}] = {l} is shorter than the scan axis ({steps}) and a scan input runs in reverse: Scan-8 does not say whether a reversed scan of a shorter sequence starts at its last element or at the end of the axis, so mixprec refuses to guess"
                    ));
                }
                out.push(l);
            }
            out
        }
    };
    let mut per_batch: Vec<Vec<Tensor>> = Vec::with_capacity(batch);
    for (b, &len) in lens.iter().enumerate() {
        let states = all[..n].iter().map(|t| slice_axis(t, 0, b)).collect();
        // The first `len` steps of this entry (the scan axis is now the first).
        let xs: Vec<Tensor> = all[n..]
            .iter()
            .map(|t| first_rows(&slice_axis(t, 0, b), len))
            .collect();
        let xr: Vec<&Tensor> = xs.iter().collect();
        per_batch.push(scan_core(ctx, g, states, &xr, &[], &dirs, &[], &[])?);
    }
    // Scan outputs of shorter sequences: zeros up to the full length.
    for o in n..g.outputs.len() {
        let row: Option<(Vec<usize>, DType)> = per_batch
            .iter()
            .map(|r| &r[o])
            .find(|t| t.rank() > 0 && t.shape()[0] > 0)
            .map(|t| (t.shape()[1..].to_vec(), t.dtype()));
        for (b, r) in per_batch.iter_mut().enumerate() {
            if r[o].rank() > 0 && r[o].shape()[0] == steps {
                continue;
            }
            let (row, dtype) = match &row {
                Some(x) => x.clone(),
                None if declared_fixed(g, o) => (r[o].shape()[1..].to_vec(), r[o].dtype()),
                None => {
                    return err(format!(
                        "no batch entry ran an iteration (sequence_lens[{b}] = {}) and the body does not declare the shape of output '{}': the padded scan output has no known shape",
                        lens[b], g.outputs[o].name
                    ))
                }
            };
            r[o] = pad_rows(&r[o], steps, &row, dtype)?;
        }
    }
    let outs = g.outputs.len();
    (0..outs)
        .map(|o| {
            let parts: Vec<Tensor> = per_batch.iter().map(|r| r[o].clone()).collect();
            stack(&parts, 0)
        })
        .collect()
}

/// The first `len` entries of `x` along axis 0.
fn first_rows(x: &Tensor, len: usize) -> Tensor {
    if x.shape()[0] == len {
        return x.clone();
    }
    let inner: usize = x.shape()[1..].iter().product();
    let idx: Vec<usize> = (0..len * inner).collect();
    let mut shape = x.shape().to_vec();
    shape[0] = len;
    Tensor::from_parts(shape, x.data().gather(&idx))
}

/// Whether body output `o` declares a fully static shape.
fn declared_fixed(g: &Graph, o: usize) -> bool {
    g.outputs[o]
        .shape
        .as_ref()
        .is_some_and(|d| d.iter().all(|d| matches!(d, Dim::Fixed(_))))
}

/// `t` (rows of shape `row` on axis 0, possibly none) followed by zero rows up to `steps`.
fn pad_rows(t: &Tensor, steps: usize, row: &[usize], dtype: DType) -> Result<Tensor, OpError> {
    let have = if t.rank() > 0 { t.shape()[0] } else { 0 };
    let inner: usize = row.iter().product();
    if have > 0 && (t.shape()[1..] != *row || t.dtype() != dtype) {
        return err(format!(
            "batch entries produced scan outputs of {} {:?} and {dtype} {row:?}",
            t.dtype(),
            &t.shape()[1..]
        ));
    }
    let zeros = TensorData::zeros(dtype, (steps - have) * inner);
    let data = if have == 0 {
        zeros
    } else {
        TensorData::concat(&[t.data(), &zeros]).expect("same dtype")
    };
    let mut shape = vec![steps];
    shape.extend_from_slice(row);
    Ok(Tensor::from_parts(shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Feeds, Interpreter};
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, ValueInfo};
    use std::sync::Arc;

    fn any(name: &str) -> ValueInfo {
        ValueInfo {
            name: name.into(),
            dtype: None,
            shape: None,
        }
    }

    fn run(g: &Graph, feeds: Vec<(&str, Tensor)>) -> Result<Vec<Tensor>, String> {
        let feeds: Feeds = feeds.into_iter().map(|(n, t)| (n.to_string(), t)).collect();
        let r = Interpreter::new(g)
            .and_then(|i| i.run(&feeds))
            .map_err(|e| e.to_string())?;
        Ok(r.outputs.into_iter().map(|(_, t)| t).collect())
    }

    /// Loop body: (i, c, acc) -> (i + 1 < stop, acc + x * (i + 1), acc + x * (i + 1) as a scan
    /// output), reading `x` and `stop` from the main graph.
    fn loop_graph(m: Option<i64>, cond: Option<bool>) -> Graph {
        let body = graph(
            vec![
                node("one", "Add", &["i", "one_i"], &["i1"]),
                node("cast", "Cast", &["i1"], &["i1f"]),
                node("scale", "Mul", &["x", "i1f"], &["xi"]),
                node("acc", "Add", &["acc_in", "xi"], &["acc_out"]),
                node("less", "Less", &["i1", "stop"], &["c_out"]),
                node("scan", "Identity", &["acc_out"], &["s"]),
            ],
            vec![any("i"), any("c_in"), any("acc_in")],
            vec![any("c_out"), any("acc_out"), vi("s", &[2])],
            vec![("one_i", Tensor::scalar_i64(1))],
        );
        let mut body = body;
        body.nodes[1]
            .attrs
            .insert("to".into(), Attribute::Int(DType::F32.onnx_code() as i64));
        let mut lp = node("loop", "Loop", &["m", "cond", "acc0"], &["acc", "scans"]);
        if m.is_none() {
            lp.inputs[0] = String::new();
        }
        if cond.is_none() {
            lp.inputs[1] = String::new();
        }
        lp.attrs
            .insert("body".into(), Attribute::Graph(Arc::new(body)));
        let mut inits = vec![("stop", Tensor::scalar_i64(3))];
        if let Some(m) = m {
            inits.push(("m", Tensor::scalar_i64(m)));
        }
        if let Some(c) = cond {
            inits.push(("cond", Tensor::from_bool(vec![], vec![c])));
        }
        graph(
            vec![lp],
            vec![vi("x", &[2]), vi("acc0", &[2])],
            vec![any("acc"), any("scans")],
            inits,
        )
    }

    fn loop_feeds() -> Vec<(&'static str, Tensor)> {
        vec![
            ("x", Tensor::from_f32(vec![2], vec![1.0, 10.0])),
            ("acc0", Tensor::from_f32(vec![2], vec![0.5, 0.5])),
        ]
    }

    #[test]
    fn loop_stops_on_trip_count_or_condition() {
        // M = 2 stops first: acc = 0.5 + x·1 + x·2.
        let out = run(&loop_graph(Some(2), Some(true)), loop_feeds()).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[3.5, 30.5]);
        assert_eq!(out[1].shape(), &[2, 2]);
        assert_eq!(out[1].as_f32().unwrap(), &[1.5, 10.5, 3.5, 30.5]);
        // No M: the body's condition (i + 1 < 3) stops after 3 iterations.
        let out = run(&loop_graph(None, Some(true)), loop_feeds()).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[6.5, 60.5]);
        assert_eq!(out[1].shape(), &[3, 2]);
        // Neither: the same (the condition input defaults to true).
        let out = run(&loop_graph(None, None), loop_feeds()).unwrap();
        assert_eq!(out[1].shape(), &[3, 2]);
        // M = 10 with the condition: the condition wins.
        let out = run(&loop_graph(Some(10), None), loop_feeds()).unwrap();
        assert_eq!(out[1].shape(), &[3, 2]);
    }

    #[test]
    fn loop_without_iterations_returns_the_initial_values() {
        for (m, c) in [(Some(0), Some(true)), (Some(5), Some(false))] {
            let out = run(&loop_graph(m, c), loop_feeds()).unwrap();
            assert_eq!(out[0].as_f32().unwrap(), &[0.5, 0.5]);
            // The scan output: 0 iterations of the body's declared [2].
            assert_eq!(out[1].shape(), &[0, 2]);
            assert_eq!(out[1].dtype(), DType::F32);
        }
    }

    #[test]
    fn scan_follows_axes_and_directions() {
        // State: running sum; scan input x [2, 3] scanned along axis 1, backwards; the scan
        // output (the running sum) stacked on axis 1, prepended.
        let body = graph(
            vec![
                node("add", "Add", &["s_in", "x_t"], &["s_out"]),
                node("y", "Identity", &["s_out"], &["y"]),
            ],
            vec![any("s_in"), any("x_t")],
            vec![any("s_out"), any("y")],
            vec![],
        );
        let mut sc = node("scan", "Scan", &["s0", "x"], &["s", "ys"]);
        sc.attrs
            .insert("body".into(), Attribute::Graph(Arc::new(body)));
        sc.attrs.insert("num_scan_inputs".into(), Attribute::Int(1));
        sc.attrs
            .insert("scan_input_axes".into(), Attribute::Ints(vec![-1]));
        sc.attrs
            .insert("scan_input_directions".into(), Attribute::Ints(vec![1]));
        sc.attrs
            .insert("scan_output_axes".into(), Attribute::Ints(vec![1]));
        sc.attrs
            .insert("scan_output_directions".into(), Attribute::Ints(vec![1]));
        let g = graph(
            vec![sc],
            vec![vi("s0", &[2]), vi("x", &[2, 3])],
            vec![any("s"), any("ys")],
            vec![],
        );
        let out = run(
            &g,
            vec![
                ("s0", Tensor::from_f32(vec![2], vec![0.0, 100.0])),
                (
                    "x",
                    Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]),
                ),
            ],
        )
        .unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[6.0, 115.0]);
        // Sums in iteration order (x read backwards): [3, 5, 6] and [106, 111, 115];
        // prepended, so reversed along the output axis.
        assert_eq!(out[1].shape(), &[2, 3]);
        assert_eq!(
            out[1].as_f32().unwrap(),
            &[6.0, 5.0, 3.0, 115.0, 111.0, 106.0]
        );
    }

    #[test]
    fn if_branches_may_differ_in_shape_and_read_outer_values() {
        let then_g = graph(
            vec![node("t", "Add", &["x", "x"], &["t_out"])],
            vec![],
            vec![any("t_out")],
            vec![],
        );
        let else_g = graph(
            vec![node("e", "ReduceSum", &["x"], &["e_out"])],
            vec![],
            vec![any("e_out")],
            vec![],
        );
        let mut iff = node("if", "If", &["c"], &["y"]);
        iff.attrs
            .insert("then_branch".into(), Attribute::Graph(Arc::new(then_g)));
        iff.attrs
            .insert("else_branch".into(), Attribute::Graph(Arc::new(else_g)));
        let g = graph(
            vec![iff],
            vec![any("c"), vi("x", &[3])],
            vec![any("y")],
            vec![],
        );
        let x = || Tensor::from_f32(vec![3], vec![1.0, 2.0, 3.0]);
        let out = run(
            &g,
            vec![("c", Tensor::from_bool(vec![], vec![true])), ("x", x())],
        )
        .unwrap();
        assert_eq!(out[0].as_f32().unwrap(), &[2.0, 4.0, 6.0]);
        let out = run(
            &g,
            vec![("c", Tensor::from_bool(vec![1], vec![false])), ("x", x())],
        )
        .unwrap();
        assert_eq!(out[0].shape(), &[1]);
        assert_eq!(out[0].as_f32().unwrap(), &[6.0]);
    }

    #[test]
    fn slice_and_stack_are_inverse() {
        let x = Tensor::from_f32(vec![2, 3, 2], (0..12).map(|v| v as f32).collect());
        for axis in 0..3 {
            let parts: Vec<Tensor> = (0..x.shape()[axis])
                .map(|i| slice_axis(&x, axis, i))
                .collect();
            assert_eq!(stack(&parts, axis).unwrap(), x, "axis {axis}");
        }
        let s = slice_axis(&x, 1, 2);
        assert_eq!(s.shape(), &[2, 2]);
        assert_eq!(s.as_f32().unwrap(), &[4.0, 5.0, 10.0, 11.0]);
    }

    #[test]
    fn stack_refuses_changing_shapes() {
        let a = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
        let b = Tensor::from_f32(vec![3], vec![1.0, 2.0, 3.0]);
        assert!(stack(&[a, b], 0)
            .unwrap_err()
            .0
            .contains("keep their shape"));
    }

    #[test]
    fn an_unsupported_op_in_a_body_is_named_by_its_path() {
        let branch = graph(
            vec![node("odd", "NoSuchOp", &["x"], &["t"])],
            vec![],
            vec![any("t")],
            vec![],
        );
        let mut iff = node("if", "If", &["c"], &["y"]);
        for b in ["then_branch", "else_branch"] {
            iff.attrs
                .insert(b.into(), Attribute::Graph(Arc::new(branch.clone())));
        }
        let g = graph(vec![iff], vec![any("c"), any("x")], vec![any("y")], vec![]);
        let e = Interpreter::new(&g).err().expect("unsupported").to_string();
        assert!(e.contains("'if/else_branch/odd'"), "{e}");
    }

    #[test]
    fn control_flow_without_an_interpreter_is_an_error() {
        let mut n = crate::graph::testing::node("if", "If", &["c"], &["y"]);
        for b in ["then_branch", "else_branch"] {
            n.attrs.insert(
                b.into(),
                crate::graph::Attribute::Graph(std::sync::Arc::new(Graph::default())),
            );
        }
        let c = Tensor::from_bool(vec![], vec![true]);
        let e = if_op(&OpCtx::new(&n, 17), &[Some(&c)]).unwrap_err();
        assert!(e.0.contains("interpreter"), "{e}");
    }

    /// Opset-8 Scan: running sum over x[batch, steps, 2] with state s0[batch, 2], scan output
    /// the running sum; `lens` the optional `sequence_lens`, `reverse` the direction.
    fn scan8_graph(with_lens: bool, reverse: bool) -> Graph {
        let body = graph(
            vec![
                node("add", "Add", &["s_in", "x_t"], &["s_out"]),
                node("y", "Identity", &["s_out"], &["y"]),
            ],
            vec![any("s_in"), any("x_t")],
            vec![any("s_out"), vi("y", &[2])],
            vec![],
        );
        let lens = if with_lens { "lens" } else { "" };
        let mut sc = node("scan", "Scan", &[lens, "s0", "x"], &["s", "ys"]);
        sc.attrs
            .insert("body".into(), Attribute::Graph(Arc::new(body)));
        sc.attrs.insert("num_scan_inputs".into(), Attribute::Int(1));
        if reverse {
            sc.attrs
                .insert("directions".into(), Attribute::Ints(vec![1]));
        }
        let mut inputs = vec![vi("s0", &[3, 2]), vi("x", &[3, 4, 2])];
        if with_lens {
            inputs.insert(
                0,
                ValueInfo {
                    name: "lens".into(),
                    dtype: Some(DType::I64),
                    shape: None,
                },
            );
        }
        let mut g = graph(vec![sc], inputs, vec![any("s"), any("ys")], vec![]);
        g.opsets.insert(String::new(), 8);
        g
    }

    fn scan8_run(g: &Graph, lens: Option<Vec<i64>>) -> Result<Vec<Tensor>, String> {
        let x: Vec<f32> = (1..=24).map(|v| v as f32).collect();
        let mut feeds = vec![
            ("s0", Tensor::from_f32(vec![3, 2], vec![0.0; 6])),
            ("x", Tensor::from_f32(vec![3, 4, 2], x)),
        ];
        if let Some(l) = lens {
            feeds.push(("lens", Tensor::from_i64(vec![3], l)));
        }
        run(g, feeds)
    }

    #[test]
    fn scan8_runs_each_batch_entry_for_its_sequence_length() {
        // Scan-8's pseudo-code: batch entry b runs sequence_lens[b] iterations over the first
        // elements of its sequence; the final state is the state after them; scan outputs keep
        // the full length, "undefined" past the sequence (zeros here).
        let g = scan8_graph(true, false);
        let out = scan8_run(&g, Some(vec![4, 2, 0])).unwrap();
        // Entry 0: x = [1,2],[3,4],[5,6],[7,8] → sums [1,2],[4,6],[9,12],[16,20].
        // Entry 1: [9,10],[11,12] (2 of 4 steps) → [9,10],[20,22]. Entry 2: no step.
        assert_eq!(out[0].shape(), &[3, 2]);
        assert_eq!(out[0].as_f32().unwrap(), &[16., 20., 20., 22., 0., 0.]);
        assert_eq!(out[1].shape(), &[3, 4, 2]);
        assert_eq!(
            out[1].as_f32().unwrap(),
            &[
                1., 2., 4., 6., 9., 12., 16., 20., // entry 0
                9., 10., 20., 22., 0., 0., 0., 0., // entry 1, padded
                0., 0., 0., 0., 0., 0., 0., 0., // entry 2
            ]
        );
        // Full lengths (or no sequence_lens) equal the unbatched scan of every entry.
        let full = scan8_run(&g, Some(vec![4, 4, 4])).unwrap();
        let none = scan8_run(&scan8_graph(false, false), None).unwrap();
        assert_eq!(full[1].as_f32(), none[1].as_f32());
        assert_eq!(none[0].as_f32().unwrap(), &[16., 20., 48., 52., 80., 84.]);
        // Out of range lengths and a shorter reversed sequence (ambiguous in the spec) are
        // errors that say why.
        let e = scan8_run(&g, Some(vec![4, 5, 0])).unwrap_err();
        assert!(e.contains("sequence_lens[1] = 5"), "{e}");
        let e = scan8_run(&g, Some(vec![4, -1, 0])).unwrap_err();
        assert!(e.contains("sequence_lens[1] = -1"), "{e}");
        let rev = scan8_graph(true, true);
        let e = scan8_run(&rev, Some(vec![4, 2, 4])).unwrap_err();
        assert!(
            e.contains("reverse") && e.contains("sequence_lens[1] = 2"),
            "{e}"
        );
        // Reversed full-length sequences run: entry 0 sums backwards, ending at the same total.
        let out = scan8_run(&rev, Some(vec![4, 4, 4])).unwrap();
        assert_eq!(&out[1].as_f32().unwrap()[..2], &[7., 8.]);
        assert_eq!(out[0].as_f32().unwrap(), none[0].as_f32().unwrap());
    }
}
