//! Reductions (ReduceMean, ReduceSum, ... ReduceLogSumExp), ArgMax/ArgMin and TopK.
//!
//! Float reductions accumulate in f64; integer ones in i64. Axes come from the attribute
//! before opset 18 (13 for ReduceSum) and from the optional second input after.

use super::attrs::{boxed, AttrError, Attrs};
use super::cast::cast_tensor;
use super::util::{input, norm_axes, norm_axis, opt_input};
use super::{OpCtx, OpError, OpResult, Registry};
use crate::tensor::{strides_of, Tensor};
use rayon::prelude::*;

pub fn register(r: &mut Registry) {
    r.add("ReduceSum", |c, i| reduce(c, i, Red::Sum, 13));
    r.add("ReduceMean", |c, i| reduce(c, i, Red::Mean, 18));
    r.add("ReduceMax", |c, i| reduce(c, i, Red::Max, 18));
    r.add("ReduceMin", |c, i| reduce(c, i, Red::Min, 18));
    r.add("ReduceProd", |c, i| reduce(c, i, Red::Prod, 18));
    r.add("ReduceL1", |c, i| reduce(c, i, Red::L1, 18));
    r.add("ReduceL2", |c, i| reduce(c, i, Red::L2, 18));
    r.add("ReduceSumSquare", |c, i| reduce(c, i, Red::SumSquare, 18));
    r.add("ReduceLogSum", |c, i| reduce(c, i, Red::LogSum, 18));
    r.add("ReduceLogSumExp", |c, i| reduce(c, i, Red::LogSumExp, 18));
    r.add("ArgMax", |c, i| arg_extreme(c, i, true));
    r.add("ArgMin", |c, i| arg_extreme(c, i, false));
    r.add("TopK", top_k);
    for (op, from) in [
        ("ReduceSum", 13),
        ("ReduceMean", 18),
        ("ReduceMax", 18),
        ("ReduceMin", 18),
        ("ReduceProd", 18),
        ("ReduceL1", 18),
        ("ReduceL2", 18),
        ("ReduceSumSquare", 18),
        ("ReduceLogSum", 18),
        ("ReduceLogSumExp", 18),
    ] {
        let d = r
            .def_mut(op)
            .parse(|n, _| boxed(ReduceAttrs::parse(n)))
            .roles(&[super::InputRole::Data, super::InputRole::Param]);
        d.infer(if from == 13 {
            |c, i| reduce_facts(c, i, 13)
        } else {
            |c, i| reduce_facts(c, i, 18)
        });
    }
    for op in ["ArgMax", "ArgMin"] {
        r.def_mut(op)
            .parse(|n, _| boxed(ArgAttrs::parse(n)))
            .infer(arg_facts);
    }
    r.def_mut("TopK")
        .parse(|n, opset| boxed(TopKAttrs::parse(n, opset)))
        .roles(&[super::InputRole::Data, super::InputRole::Param])
        .infer(top_k_facts);
    // A reduction reads every input element once.
    for op in [
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ArgMax",
        "ArgMin",
        "TopK",
    ] {
        r.def_mut(op).flops(|_, ins, _| {
            ins.first()
                .cloned()
                .flatten()
                .map_or(0, |s| s.iter().product::<usize>() as u64)
        });
    }
}

use crate::graph::fact::{DimFact, Fact};
use crate::tensor::DType;

/// The Reduce* ops' attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct ReduceAttrs {
    pub keepdims: bool,
    pub noop_with_empty_axes: bool,
    /// The `axes` attribute (read before the opset that makes axes an input).
    pub axes: Option<Vec<i64>>,
}

impl ReduceAttrs {
    fn parse(node: &crate::graph::Node) -> Result<ReduceAttrs, AttrError> {
        let a = Attrs::new(node);
        Ok(ReduceAttrs {
            keepdims: a.flag("keepdims", true)?,
            noop_with_empty_axes: a.flag("noop_with_empty_axes", false)?,
            axes: distinct_axes(&a, "axes")?,
        })
    }
}

/// An int-list axes attribute without repeats.
pub fn distinct_axes(a: &Attrs, name: &str) -> Result<Option<Vec<i64>>, AttrError> {
    let axes = a.ints(name)?;
    if let Some(v) = &axes {
        if let Some(d) = v.iter().enumerate().find(|(i, x)| v[..*i].contains(x)) {
            return Err(AttrError::new(
                name,
                format!("{} appears twice in {v:?}", d.1),
            ));
        }
    }
    Ok(axes)
}

/// ArgMax's and ArgMin's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct ArgAttrs {
    pub axis: i64,
    pub keepdims: bool,
    pub select_last_index: bool,
}

impl ArgAttrs {
    fn parse(node: &crate::graph::Node) -> Result<ArgAttrs, AttrError> {
        let a = Attrs::new(node);
        Ok(ArgAttrs {
            axis: a.int_or("axis", 0)?,
            keepdims: a.flag("keepdims", true)?,
            select_last_index: a.flag("select_last_index", false)?,
        })
    }
}

/// TopK's attributes (`k` is an attribute before opset 10).
#[derive(Clone, Debug, PartialEq)]
pub struct TopKAttrs {
    pub k: Option<i64>,
    pub axis: i64,
    pub largest: bool,
}

impl TopKAttrs {
    fn parse(node: &crate::graph::Node, opset: i64) -> Result<TopKAttrs, AttrError> {
        let a = Attrs::new(node);
        let k = if opset < 10 {
            let k = a.required_int("k")?;
            if k < 0 {
                return Err(AttrError::new("k", format!("must be >= 0, got {k}")));
            }
            Some(k)
        } else {
            None
        };
        Ok(TopKAttrs {
            k,
            axis: a.int_or("axis", -1)?,
            largest: a.flag("largest", true)?,
        })
    }
}

fn reduce_facts(
    ctx: &super::InferCtx,
    ins: &[Option<&Fact>],
    axes_input_from: i64,
) -> super::shape::FactsResult {
    let x = super::shape::fact(ins, 0)?;
    let attrs = ctx.attrs::<ReduceAttrs>()?;
    let (keepdims, noop) = (attrs.keepdims, attrs.noop_with_empty_axes);
    let Some(s) = &x.shape else {
        return Ok(vec![Fact::new(x.dtype, None)]);
    };
    let axes: Option<Vec<i64>> = if ctx.opset >= axes_input_from {
        match super::shape::opt_fact(ins, 1) {
            None => Some(Vec::new()),
            Some(f) => f.int_values(),
        }
    } else {
        Some(attrs.axes.clone().unwrap_or_default())
    };
    let Some(axes) = axes else {
        // Axes computed at run time: the rank is known only when dims are kept.
        return Ok(vec![if keepdims {
            super::shape::unknown_dims(ctx, x.dtype, s.len())
        } else {
            Fact::new(x.dtype, None)
        }]);
    };
    if axes.is_empty() && noop {
        return Ok(vec![Fact::new(x.dtype, x.shape.clone())]);
    }
    let axes = if axes.is_empty() {
        None
    } else {
        Some(norm_axes(&axes, s.len())?)
    };
    Ok(vec![Fact::new(
        x.dtype,
        Some(super::shape::reduced_shape(s, axes.as_deref(), keepdims)),
    )])
}

fn arg_facts(ctx: &super::InferCtx, ins: &[Option<&Fact>]) -> super::shape::FactsResult {
    let x = super::shape::fact(ins, 0)?;
    let attrs = ctx.attrs::<ArgAttrs>()?;
    let keepdims = attrs.keepdims;
    let shape = match &x.shape {
        Some(s) => {
            let axis = norm_axis(attrs.axis, s.len())?;
            Some(super::shape::reduced_shape(s, Some(&[axis]), keepdims))
        }
        None => None,
    };
    Ok(vec![Fact::new(Some(DType::I64), shape)])
}

fn top_k_facts(ctx: &super::InferCtx, ins: &[Option<&Fact>]) -> super::shape::FactsResult {
    let x = super::shape::fact(ins, 0)?;
    let attrs = ctx.attrs::<TopKAttrs>()?;
    let k: Option<i64> = if ctx.opset < 10 {
        attrs.k
    } else {
        super::shape::fact(ins, 1)?
            .int_values()
            .and_then(|v| v.first().copied())
    };
    let shape = match &x.shape {
        Some(s) => {
            let axis = norm_axis(attrs.axis, s.len())?;
            let mut o = s.clone();
            o[axis] = match k {
                Some(k) => {
                    if k < 0 || s[axis].as_known().is_some_and(|d| k as usize > d) {
                        return Err(OpError(format!(
                            "k = {k} does not fit axis {axis} of {}",
                            x.shape_string()
                        )));
                    }
                    DimFact::known(k as usize)
                }
                None => ctx.unknown_dim(),
            };
            Some(o)
        }
        None => None,
    };
    Ok(vec![
        Fact::new(x.dtype, shape.clone()),
        Fact::new(Some(DType::I64), shape),
    ])
}

#[derive(Clone, Copy, PartialEq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    SumSquare,
    LogSum,
    LogSumExp,
}

/// The input split as (outer, reduced, inner) index groups for every output element.
struct Plan {
    out_shape: Vec<usize>,
    /// For each output element (in keepdims order), the input offsets of its reduced group are
    /// `base + r_offsets[k]`.
    bases: Vec<usize>,
    r_offsets: Vec<usize>,
}

fn plan(shape: &[usize], axes: &[usize], keepdims: bool) -> Plan {
    let st = strides_of(shape);
    let out_shape: Vec<usize> = if keepdims {
        (0..shape.len())
            .map(|d| if axes.contains(&d) { 1 } else { shape[d] })
            .collect()
    } else {
        (0..shape.len())
            .filter(|d| !axes.contains(d))
            .map(|d| shape[d])
            .collect()
    };
    let offsets = |dims: &[usize], sizes: &[usize]| -> Vec<usize> {
        let n: usize = dims.iter().map(|&d| sizes[d]).product();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; dims.len()];
        for _ in 0..n {
            out.push(dims.iter().zip(&idx).map(|(&d, &i)| i * st[d]).sum());
            for k in (0..dims.len()).rev() {
                idx[k] += 1;
                if idx[k] < sizes[dims[k]] {
                    break;
                }
                idx[k] = 0;
            }
        }
        out
    };
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    Plan {
        bases: offsets(&kept, shape),
        r_offsets: offsets(axes, shape),
        out_shape,
    }
}

/// Rows a task of [`trailing_f32_sums`] sums at once: independent chains the core overlaps.
const ROWS_AT_ONCE: usize = 8;

/// The sums (Sum, Mean, SumSquare, L1, L2) of a float32 tensor straight from its values,
/// where the axes allow ([`trailing_f32_sums`], [`middle_f32_sums`]); None where the general
/// path is needed (other reductions or axes, f16 accumulation, empty rows). Each term function
/// gets its own loops: through a function pointer, a call per value cost 10× ONNX Runtime's
/// time on a [1, 2048, 64] sum.
fn f32_sums(x: &Tensor, axes: &[usize], red: Red, f16_acc: bool) -> Option<Vec<f64>> {
    fn with<T: Fn(f64) -> f64 + Sync + Copy>(
        x: &Tensor,
        axes: &[usize],
        red: Red,
        f16_acc: bool,
        term: T,
    ) -> Option<Vec<f64>> {
        trailing_f32_sums(x, axes, red, f16_acc, term)
            .or_else(|| middle_f32_sums(x, axes, red, f16_acc, term))
    }
    match red {
        Red::Sum | Red::Mean => with(x, axes, red, f16_acc, |v| v),
        Red::SumSquare | Red::L2 => with(x, axes, red, f16_acc, |v| v * v),
        Red::L1 => with(x, axes, red, f16_acc, f64::abs),
        _ => None,
    }
}

/// The sums of a float32 tensor over its trailing axes, each value's term `term`: each row's
/// f64 chain in order from its first term, as the general path adds them (the same bits),
/// eight rows' chains interleaved, rows in parallel.
fn trailing_f32_sums(
    x: &Tensor,
    axes: &[usize],
    red: Red,
    f16_acc: bool,
    term: impl Fn(f64) -> f64 + Sync + Copy,
) -> Option<Vec<f64>> {
    let r = x.rank();
    let trailing = axes.iter().all(|&a| a >= r - axes.len());
    let width: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let v = x.as_f32()?;
    if f16_acc || !trailing || width == 0 {
        return None;
    }
    let sums = |group: &[f32]| {
        let n = group.len() / width;
        let mut acc = [0f64; ROWS_AT_ONCE];
        for (a, row) in acc.iter_mut().zip(group.chunks_exact(width)) {
            *a = term(row[0] as f64);
        }
        for k in 1..width {
            for (rw, a) in acc.iter_mut().enumerate().take(n) {
                *a += term(group[rw * width + k] as f64);
            }
        }
        acc.into_iter().take(n).map(move |a| match red {
            Red::Mean => a / width as f64,
            Red::L2 => a.sqrt(),
            _ => a,
        })
    };
    let chunk = width * ROWS_AT_ONCE;
    Some(if v.len() >= 1 << 16 {
        v.par_chunks(chunk).flat_map_iter(sums).collect()
    } else {
        v.chunks(chunk).flat_map(sums).collect()
    })
}

/// The sums (as [`trailing_f32_sums`]) of a float32 tensor over one run of consecutive axes
/// followed by others (`[outer, reduced, inner]`, inner > 1: Magika's LayerNorm sums a
/// [1, 2048, 64] tensor over its middle axis): per output the same f64 chain in order from its
/// first term as the general path (the same bits), but a whole inner row of chains at a time,
/// reading the input's rows in place instead of a strided gather per output from an f64 copy
/// (0.12 → 0.02 ms; ONNX Runtime 0.036).
fn middle_f32_sums(
    x: &Tensor,
    axes: &[usize],
    red: Red,
    f16_acc: bool,
    term: impl Fn(f64) -> f64 + Sync + Copy,
) -> Option<Vec<f64>> {
    let (first, last) = (*axes.iter().min()?, *axes.iter().max()?);
    let v = x.as_f32()?;
    let shape = x.shape();
    if f16_acc || last + 1 - first != axes.len() || last + 1 >= shape.len() {
        return None;
    }
    let outer: usize = shape[..first].iter().product();
    let reduced: usize = shape[first..=last].iter().product();
    let inner: usize = shape[last + 1..].iter().product();
    if reduced == 0 || inner < 2 {
        return None;
    }
    let finish = move |a: f64| match red {
        Red::Mean => a / reduced as f64,
        Red::L2 => a.sqrt(),
        _ => a,
    };
    // Per outer block and a part of its inner columns: every chain over the reduced rows.
    let columns = |o: usize, cols: std::ops::Range<usize>| -> Vec<f64> {
        let block = &v[o * reduced * inner..(o + 1) * reduced * inner];
        let mut acc: Vec<f64> = block[cols.clone()]
            .iter()
            .map(|&x| term(x as f64))
            .collect();
        for row in block.chunks_exact(inner).skip(1) {
            for (a, &x) in acc.iter_mut().zip(&row[cols.clone()]) {
                *a += term(x as f64);
            }
        }
        acc.into_iter().map(finish).collect()
    };
    const PART: usize = 256;
    let parts: Vec<(usize, usize)> = (0..outer)
        .flat_map(|o| (0..inner).step_by(PART).map(move |c| (o, c)))
        .collect();
    let part = |&(o, c): &(usize, usize)| columns(o, c..(c + PART).min(inner));
    Some(if v.len() >= 1 << 16 && parts.len() > 1 {
        parts.par_iter().flat_map_iter(part).collect()
    } else {
        parts.iter().flat_map(part).collect()
    })
}

fn reduce(ctx: &OpCtx, inputs: &[Option<&Tensor>], red: Red, axes_input_from: i64) -> OpResult {
    let x = input(inputs, 0)?;
    let attrs = ctx.attrs::<ReduceAttrs>()?;
    let (keepdims, noop) = (attrs.keepdims, attrs.noop_with_empty_axes);
    let axes: Vec<i64> = if ctx.opset >= axes_input_from {
        match opt_input(inputs, 1) {
            Some(t) => t
                .to_i64_vec()
                .ok_or_else(|| OpError("axes must be integers".into()))?,
            None => Vec::new(),
        }
    } else {
        attrs.axes.clone().unwrap_or_default()
    };
    if axes.is_empty() && noop {
        return Ok(vec![x.clone()]);
    }
    let axes: Vec<usize> = if axes.is_empty() {
        (0..x.rank()).collect()
    } else {
        norm_axes(&axes, x.rank())?
    };
    let f16_acc = ctx.accumulate == crate::numeric::Accumulator::F16;
    if let Some(out) = f32_sums(x, &axes, red, f16_acc) {
        let out_shape = (0..x.rank())
            .filter_map(|d| match axes.contains(&d) {
                false => Some(x.shape()[d]),
                true => keepdims.then_some(1),
            })
            .collect();
        return Ok(vec![cast_tensor(
            &Tensor::from_f64(out_shape, out),
            x.dtype(),
        )]);
    }
    let p = plan(x.shape(), &axes, keepdims);
    let n = p.r_offsets.len();
    let dtype = x.dtype();
    if dtype.is_int()
        && matches!(
            red,
            Red::Sum | Red::Max | Red::Min | Red::Prod | Red::SumSquare | Red::L1
        )
    {
        let v = x.to_i64_vec().expect("int");
        let out: Vec<i64> = p
            .bases
            .iter()
            .map(|&b| {
                let it = p.r_offsets.iter().map(|&o| v[b + o]);
                match red {
                    Red::Sum => it.fold(0i64, |a, x| a.wrapping_add(x)),
                    Red::Max => it.max().unwrap_or(i64::MIN),
                    Red::Min => it.min().unwrap_or(i64::MAX),
                    Red::Prod => it.fold(1i64, |a, x| a.wrapping_mul(x)),
                    Red::SumSquare => it.fold(0i64, |a, x| a.wrapping_add(x.wrapping_mul(x))),
                    _ => it.fold(0i64, |a, x| a.wrapping_add(x.wrapping_abs())),
                }
            })
            .collect();
        return Ok(vec![cast_tensor(
            &Tensor::from_i64(p.out_shape, out),
            dtype,
        )]);
    }
    let v = x
        .to_f64_vec()
        .ok_or_else(|| OpError(format!("dtype {dtype} is not supported")))?;
    // Sums accumulate in f64 (the reference), or in an f16 register when a reduced-precision
    // layer asks for f16 accumulation (`--accumulate f16`): each addition rounded to f16.
    // An empty sum is +0 (ONNX Runtime, numpy); `Iterator::sum` starts from -0.0, so it is
    // folded from the first element instead (the same additions, the same bits otherwise).
    let total = |it: &mut dyn Iterator<Item = f64>| -> f64 {
        if f16_acc {
            it.fold(0.0, |a, x| half::f16::from_f64(a + x).to_f64())
        } else {
            match it.next() {
                None => 0.0,
                Some(first) => it.fold(first, |a, x| a + x),
            }
        }
    };
    let out: Vec<f64> = p
        .bases
        .iter()
        .map(|&b| {
            let mut it = p.r_offsets.iter().map(|&o| v[b + o]);
            match red {
                Red::Sum => total(&mut it),
                Red::Mean => total(&mut it) / n as f64,
                Red::Max => it.fold(f64::NEG_INFINITY, |a, x| {
                    if x.is_nan() || a.is_nan() {
                        f64::NAN
                    } else {
                        a.max(x)
                    }
                }),
                Red::Min => it.fold(f64::INFINITY, |a, x| {
                    if x.is_nan() || a.is_nan() {
                        f64::NAN
                    } else {
                        a.min(x)
                    }
                }),
                Red::Prod => it.product(),
                Red::L1 => total(&mut it.map(f64::abs)),
                Red::L2 => total(&mut it.map(|x| x * x)).sqrt(),
                Red::SumSquare => total(&mut it.map(|x| x * x)),
                Red::LogSum => total(&mut it).ln(),
                Red::LogSumExp => {
                    let vals: Vec<f64> = it.collect();
                    let m = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    if m.is_infinite() {
                        m
                    } else {
                        m + vals.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
                    }
                }
            }
        })
        .collect();
    Ok(vec![cast_tensor(
        &Tensor::from_f64(p.out_shape, out),
        dtype,
    )])
}

fn arg_extreme(ctx: &OpCtx, inputs: &[Option<&Tensor>], max: bool) -> OpResult {
    let x = input(inputs, 0)?;
    let attrs = ctx.attrs::<ArgAttrs>()?;
    let axis = norm_axis(attrs.axis, x.rank())?;
    let (keepdims, last) = (attrs.keepdims, attrs.select_last_index);
    let v = x
        .to_f64_vec()
        .ok_or_else(|| OpError(format!("dtype {} is not supported", x.dtype())))?;
    let p = plan(x.shape(), &[axis], keepdims);
    let out: Vec<i64> = p
        .bases
        .iter()
        .map(|&b| {
            let mut best = 0usize;
            for (k, &o) in p.r_offsets.iter().enumerate() {
                let (cur, top) = (v[b + o], v[b + p.r_offsets[best]]);
                let better = if max { cur > top } else { cur < top };
                if better || (last && cur == top) {
                    best = k;
                }
            }
            best as i64
        })
        .collect();
    Ok(vec![Tensor::from_i64(p.out_shape, out)])
}

fn top_k(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let attrs = ctx.attrs::<TopKAttrs>()?;
    let k = if ctx.opset < 10 {
        attrs
            .k
            .ok_or_else(|| OpError("attribute 'k' is required".into()))?
    } else {
        let kt = input(inputs, 1)?;
        let kv = kt
            .to_i64_vec()
            .ok_or_else(|| OpError("K must be an integer tensor".into()))?;
        *kv.first().ok_or_else(|| OpError("K is empty".into()))?
    };
    let axis = norm_axis(attrs.axis, x.rank())?;
    let largest = attrs.largest;
    let len = x.shape()[axis];
    if k < 0 || k as usize > len {
        return Err(OpError(format!(
            "K={k} is out of range for axis of size {len}"
        )));
    }
    let k = k as usize;
    let v = x
        .to_f64_vec()
        .ok_or_else(|| OpError(format!("dtype {} is not supported", x.dtype())))?;
    let p = plan(x.shape(), &[axis], true);
    let mut out_shape = x.shape().to_vec();
    out_shape[axis] = k;
    let ost = strides_of(&out_shape);
    let n_out: usize = out_shape.iter().product();
    let mut vals = vec![0f64; n_out];
    let mut idxs = vec![0i64; n_out];
    let ist = strides_of(x.shape());
    for &b in &p.bases {
        let mut order: Vec<usize> = (0..len).collect();
        // Stable sort: among equal values the lower index comes first, as ONNX requires.
        order.sort_by(|&i, &j| {
            let (a, c) = (v[b + i * ist[axis]], v[b + j * ist[axis]]);
            if largest {
                c.total_cmp(&a)
            } else {
                a.total_cmp(&c)
            }
        });
        // Output base: same coordinates with the axis index 0.
        let mut rem = b;
        let mut ob = 0;
        for d in 0..x.rank() {
            let i = rem / ist[d];
            rem %= ist[d];
            if d != axis {
                ob += i * ost[d];
            }
        }
        for (r, &i) in order.iter().take(k).enumerate() {
            vals[ob + r * ost[axis]] = v[b + i * ist[axis]];
            idxs[ob + r * ost[axis]] = i as i64;
        }
    }
    let values = cast_tensor(&Tensor::from_f64(out_shape.clone(), vals), x.dtype());
    Ok(vec![values, Tensor::from_i64(out_shape, idxs)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Attribute, Node};

    fn run(op: &str, opset: i64, attrs: &[(&str, Attribute)], inputs: &[&Tensor]) -> Vec<Tensor> {
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
        k(&OpCtx::new(&node, opset), &args).unwrap()
    }

    #[test]
    fn reduce_mean_axes_attr_and_input() {
        let x = Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let y = run(
            "ReduceMean",
            13,
            &[("axes", Attribute::Ints(vec![1]))],
            &[&x],
        );
        assert_eq!(y[0].shape(), &[2, 1]);
        assert_eq!(y[0].as_f32().unwrap(), &[2., 5.]);
        let axes = Tensor::from_i64(vec![1], vec![0]);
        let y = run(
            "ReduceMean",
            18,
            &[("keepdims", Attribute::Int(0))],
            &[&x, &axes],
        );
        assert_eq!(y[0].shape(), &[3]);
        assert_eq!(y[0].as_f32().unwrap(), &[2.5, 3.5, 4.5]);
        let y = run(
            "ReduceSum",
            13,
            &[("noop_with_empty_axes", Attribute::Int(1))],
            &[&x],
        );
        assert_eq!(y[0], x);
    }

    /// Float32 sums over trailing axes (rows summed straight from the f32 values, eight at
    /// once, in parallel when large) give the general path's bits: the same reduction of the
    /// values as float64, rounded to f32. Rows of one −0 keep it; NaN and inf propagate.
    #[test]
    fn float32_sums_are_the_general_paths() {
        // Trailing axes, then a run of axes in the middle (inner rows narrower and wider than
        // a part, serial and in parallel), then axes that are no run (the general path).
        for (shape, axes) in [
            (vec![13usize, 7], vec![1i64]),
            (vec![3, 1, 5], vec![1, 2]),
            (vec![5, 1], vec![-1]),
            (vec![300, 230], vec![1]),
            (vec![4, 6], vec![0, 1]),
            (vec![2, 300, 70], vec![1]),
            (vec![1, 2048, 64], vec![1]),
            (vec![3, 4, 5, 6], vec![1, 2]),
            (vec![2, 3, 300], vec![0, 1]),
            (vec![3, 4, 5], vec![0, 2]),
        ] {
            let len: usize = shape.iter().product();
            let mut v: Vec<f32> = (0..len)
                .map(|i| ((i * 7919 % 1013) as f32 - 500.0) / 37.0)
                .collect();
            v[0] = -0.0;
            if len > 40 {
                v[20] = f32::NAN;
                v[33] = f32::INFINITY;
            }
            let x = Tensor::from_f32(shape.clone(), v.clone());
            let x64 = Tensor::from_f64(shape.clone(), v.iter().map(|&a| a as f64).collect());
            let axes = Tensor::from_i64(vec![axes.len()], axes.clone());
            for op in [
                "ReduceSum",
                "ReduceMean",
                "ReduceSumSquare",
                "ReduceL1",
                "ReduceL2",
            ] {
                let got = run(op, 18, &[], &[&x, &axes]).remove(0);
                let want = run(op, 18, &[], &[&x64, &axes]).remove(0);
                let want = cast_tensor(&want, DType::F32);
                assert_eq!(got.shape(), want.shape(), "{op} {shape:?}");
                let bits = |t: &Tensor| -> Vec<u32> {
                    t.as_f32().unwrap().iter().map(|a| a.to_bits()).collect()
                };
                assert_eq!(bits(&got), bits(&want), "{op} {shape:?}");
            }
        }
        // One −0 summed over a row of one stays −0 (the chain starts from its first term).
        let x = Tensor::from_f32(vec![2, 1], vec![-0.0, 1.0]);
        let axes = Tensor::from_i64(vec![1], vec![1]);
        let y = run("ReduceSum", 18, &[], &[&x, &axes]);
        assert!(y[0].as_f32().unwrap()[0].is_sign_negative());
    }

    #[test]
    fn specials_in_reductions() {
        // An empty sum is +0 (ONNX Runtime, numpy), not the -0 of Rust's `Iterator::sum`.
        let empty = Tensor::from_f32(vec![2, 0], vec![]);
        let axes = Tensor::from_i64(vec![1], vec![1]);
        for op in ["ReduceSum", "ReduceL1", "ReduceL2", "ReduceSumSquare"] {
            let y = run(op, 18, &[], &[&empty, &axes]);
            for &v in y[0].as_f32().unwrap() {
                assert!(v == 0.0 && v.is_sign_positive(), "{op}: {v}");
            }
        }
        // Max/Min propagate NaN wherever it is; sums of +inf and -inf are NaN.
        let x = Tensor::from_f32(vec![2, 2], vec![f32::NAN, 1., 2., f32::NAN]);
        for op in ["ReduceMax", "ReduceMin"] {
            let y = run(op, 18, &[], &[&x, &axes]);
            assert!(y[0].as_f32().unwrap().iter().all(|v| v.is_nan()), "{op}");
        }
        let x = Tensor::from_f32(vec![1, 2], vec![f32::INFINITY, f32::NEG_INFINITY]);
        assert!(run("ReduceSum", 18, &[], &[&x, &axes])[0].as_f32().unwrap()[0].is_nan());
    }

    #[test]
    fn top_k_ties_prefer_lower_index() {
        let x = Tensor::from_f32(vec![4], vec![1., 3., 3., 2.]);
        let k = Tensor::from_i64(vec![1], vec![2]);
        let y = run("TopK", 11, &[], &[&x, &k]);
        assert_eq!(y[0].as_f32().unwrap(), &[3., 3.]);
        assert_eq!(y[1].as_i64().unwrap(), &[1, 2]);
    }

    #[test]
    fn argmax_last_index() {
        let x = Tensor::from_f32(vec![3], vec![5., 1., 5.]);
        assert_eq!(run("ArgMax", 13, &[], &[&x])[0].as_i64().unwrap(), &[0]);
        let y = run(
            "ArgMax",
            13,
            &[("select_last_index", Attribute::Int(1))],
            &[&x],
        );
        assert_eq!(y[0].as_i64().unwrap(), &[2]);
    }

    #[test]
    fn bad_attributes_are_load_errors() {
        use crate::graph::Attribute;
        use crate::ops::attrs::testing::{assert_rejected, load_error};
        assert_rejected(
            "ReduceMean",
            &[("axes", Attribute::Ints(vec![1, -1, 1]))],
            "axes",
            "1 appears twice",
        );
        assert_rejected(
            "ReduceSum",
            &[("keepdims", Attribute::Float(1.0))],
            "keepdims",
            "expected an int, got a float",
        );
        assert_rejected(
            "ArgMax",
            &[("axis", Attribute::Ints(vec![0]))],
            "axis",
            "an int",
        );
        assert!(load_error("TopK", &[], 1).is_some_and(|e| e.contains("'k': missing")));
        assert!(load_error("TopK", &[], 11).is_none());
    }
}
