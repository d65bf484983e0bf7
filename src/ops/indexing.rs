//! Index-driven ops: GatherND, ScatterND, ScatterElements (and `Scatter`, its name at opsets
//! 9-10), Compress and OneHot. They select or place elements by integer indices, so they serve
//! every element type; only the scatter reductions (`add`, `mul`, `max`, `min`) compute, and
//! those only for numeric types.
//!
//! Indices may be negative (counted from the end of their axis, as ONNX Runtime accepts);
//! an index outside `[-n, n)` is an error naming the index and the axis.

use super::attrs::{boxed, AttrError, Attrs};
use super::shape::{fact, same_as_input, FactsResult};
use super::util::{input, norm_axis};
use super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::{DimFact, Fact, ShapeFact};
use crate::tensor::{Tensor, TensorData};
use half::{bf16, f16};

pub fn register(r: &mut Registry) {
    let parse = |n: &crate::graph::Node, o| boxed(IndexAttrs::parse(n, o));
    r.add("GatherND", gather_nd)
        .parse(parse)
        .infer(gather_nd_facts)
        .roles(&[InputRole::Data, InputRole::Param])
        .movement();
    r.add("ScatterND", scatter_nd)
        .parse(parse)
        .infer(same_as_input)
        .roles(&[InputRole::Data, InputRole::Param, InputRole::Data]);
    for op in ["ScatterElements", "Scatter"] {
        r.add(op, scatter_elements)
            .parse(parse)
            .infer(same_as_input)
            .roles(&[InputRole::Data, InputRole::Param, InputRole::Data]);
    }
    r.add("Compress", compress)
        .parse(parse)
        .infer(compress_facts)
        .roles(&[InputRole::Data, InputRole::Param])
        .movement();
    r.add("OneHot", one_hot)
        .parse(parse)
        .infer(one_hot_facts)
        .roles(&[InputRole::Param, InputRole::Param, InputRole::Data]);
}

/// How a scatter combines an update with the value already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

/// The attributes of the family.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexAttrs {
    /// ScatterElements/Scatter/OneHot (default 0 / -1); Compress (None: flatten first).
    pub axis: Option<i64>,
    /// GatherND-12's `batch_dims` (>= 0).
    pub batch_dims: usize,
    /// ScatterND-16/18, ScatterElements-16/18.
    pub reduction: Reduction,
}

impl IndexAttrs {
    fn parse(node: &crate::graph::Node, opset: i64) -> Result<IndexAttrs, AttrError> {
        let a = Attrs::new(node);
        let batch_dims = a.int_or("batch_dims", 0)?;
        if batch_dims < 0 {
            return Err(AttrError::new(
                "batch_dims",
                format!("must be >= 0, got {batch_dims}"),
            ));
        }
        // `max`/`min` came at opset 18, `add`/`mul` at 16.
        let mut choices = vec![("none", Reduction::None)];
        if opset >= 16 {
            choices.extend([("add", Reduction::Add), ("mul", Reduction::Mul)]);
        }
        if opset >= 18 {
            choices.extend([("max", Reduction::Max), ("min", Reduction::Min)]);
        }
        let axis = match node.op_type.as_str() {
            "OneHot" => Some(a.int_or("axis", -1)?),
            "Compress" => a.int("axis")?,
            _ => Some(a.int_or("axis", 0)?),
        };
        Ok(IndexAttrs {
            axis,
            batch_dims: batch_dims as usize,
            reduction: a.choice("reduction", Reduction::None, &choices)?,
        })
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, OpError> {
    Err(OpError(msg.into()))
}

fn indices_of(t: &Tensor, what: &str) -> Result<Vec<i64>, OpError> {
    if !t.dtype().is_int() {
        return err(format!("{what} must be integers, got {:?}", t.dtype()));
    }
    t.to_i64_vec()
        .ok_or_else(|| OpError(format!("{what} must be integers")))
}

/// `i` wrapped into `[0, n)`, or an error naming the axis.
fn wrap(i: i64, n: usize, axis: usize) -> Result<usize, OpError> {
    let n = n as i64;
    let j = if i < 0 { i + n } else { i };
    if j < 0 || j >= n {
        return err(format!(
            "index {i} is out of bounds for axis {axis} of size {n}"
        ));
    }
    Ok(j as usize)
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

fn gather_nd(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let ind = input(inputs, 1)?;
    let b = ctx.attrs::<IndexAttrs>()?.batch_dims;
    let (xs, is) = (x.shape(), ind.shape());
    let (r, q) = (xs.len(), is.len());
    if q < 1 || r < 1 {
        return err("data and indices must have rank >= 1");
    }
    if b >= q.min(r) {
        return err(format!(
            "batch_dims {b} must be less than the ranks of data ({r}) and indices ({q})"
        ));
    }
    if xs[..b] != is[..b] {
        return err(format!(
            "the first batch_dims={b} dimensions of data {xs:?} and indices {is:?} differ"
        ));
    }
    let k = is[q - 1];
    if k < 1 || b + k > r {
        return err(format!(
            "indices' last dimension {k} must be in 1..={} (data rank {r} minus batch_dims {b})",
            r - b
        ));
    }
    let iv = indices_of(ind, "indices")?;
    let slice: usize = xs[b + k..].iter().product();
    let batch_size: usize = xs[b..].iter().product();
    let per_batch: usize = is[b..q - 1].iter().product();
    let xst = strides(xs);
    let tuples = iv.len() / k;
    let mut idx = Vec::with_capacity(tuples * slice);
    for t in 0..tuples {
        let batch = t.checked_div(per_batch).unwrap_or(0);
        let mut off = batch * batch_size;
        for j in 0..k {
            off += wrap(iv[t * k + j], xs[b + j], b + j)? * xst[b + j];
        }
        idx.extend(off..off + slice);
    }
    let mut shape = is[..q - 1].to_vec();
    shape.extend_from_slice(&xs[b + k..]);
    Ok(vec![Tensor::from_parts(shape, x.data().gather(&idx))])
}

fn gather_nd_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (x, ind) = (fact(ins, 0)?, fact(ins, 1)?);
    let b = ctx.attrs::<IndexAttrs>()?.batch_dims;
    let (Some(xs), Some(is)) = (&x.shape, &ind.shape) else {
        return Ok(vec![Fact::new(x.dtype, None)]);
    };
    let Some(k) = is.last().and_then(DimFact::as_known) else {
        return Ok(vec![Fact::new(x.dtype, None)]);
    };
    if is.is_empty() || b + k > xs.len() || b >= is.len() {
        return err(format!(
            "indices of rank {} with last dimension {k} do not fit data of rank {} (batch_dims {b})",
            is.len(),
            xs.len()
        ));
    }
    let mut shape: ShapeFact = is[..is.len() - 1].to_vec();
    shape.extend(xs[b + k..].iter().cloned());
    Ok(vec![Fact::new(x.dtype, Some(shape))])
}

fn scatter_nd(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let ind = input(inputs, 1)?;
    let upd = input(inputs, 2)?;
    let red = ctx.attrs::<IndexAttrs>()?.reduction;
    let (xs, is) = (x.shape(), ind.shape());
    let q = is.len();
    if q < 1 {
        return err("indices must have rank >= 1");
    }
    let k = is[q - 1];
    if k > xs.len() {
        return err(format!(
            "indices' last dimension {k} exceeds the data rank {}",
            xs.len()
        ));
    }
    let mut want = is[..q - 1].to_vec();
    want.extend_from_slice(&xs[k..]);
    if upd.shape() != want.as_slice() {
        return err(format!(
            "updates have shape {:?}; data {xs:?} and indices {is:?} need {want:?}",
            upd.shape()
        ));
    }
    let iv = indices_of(ind, "indices")?;
    let slice: usize = xs[k..].iter().product();
    let xst = strides(xs);
    let tuples = iv
        .len()
        .checked_div(k)
        .unwrap_or_else(|| is[..q - 1].iter().product());
    let mut pairs = Vec::with_capacity(tuples * slice);
    for t in 0..tuples {
        let mut off = 0;
        for j in 0..k {
            off += wrap(iv[t * k + j], xs[j], j)? * xst[j];
        }
        pairs.extend((0..slice).map(|e| (off + e, t * slice + e)));
    }
    Ok(vec![Tensor::from_parts(
        xs.to_vec(),
        scatter(x.data(), upd.data(), &pairs, red)?,
    )])
}

fn scatter_elements(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let ind = input(inputs, 1)?;
    let upd = input(inputs, 2)?;
    let attrs = ctx.attrs::<IndexAttrs>()?;
    let xs = x.shape();
    let axis = norm_axis(attrs.axis.unwrap_or(0), xs.len())?;
    if ind.shape() != upd.shape() {
        return err(format!(
            "indices {:?} and updates {:?} must have the same shape",
            ind.shape(),
            upd.shape()
        ));
    }
    let is = ind.shape();
    if is.len() != xs.len() {
        return err(format!(
            "indices of rank {} and data of rank {} must have the same rank",
            is.len(),
            xs.len()
        ));
    }
    if let Some(d) = (0..xs.len()).find(|&d| d != axis && is[d] > xs[d]) {
        return err(format!(
            "indices {is:?} are larger than data {xs:?} along axis {d}"
        ));
    }
    let iv = indices_of(ind, "indices")?;
    let xst = strides(xs);
    let ist = strides(is);
    let mut pairs = Vec::with_capacity(iv.len());
    for (flat, &i) in iv.iter().enumerate() {
        let j = wrap(i, xs[axis], axis)?;
        let mut off = 0;
        let mut rem = flat;
        for d in 0..xs.len() {
            let c = rem / ist[d];
            rem %= ist[d];
            off += if d == axis { j } else { c } * xst[d];
        }
        pairs.push((off, flat));
    }
    Ok(vec![Tensor::from_parts(
        xs.to_vec(),
        scatter(x.data(), upd.data(), &pairs, attrs.reduction)?,
    )])
}

/// A numeric element a scatter can reduce with.
trait Reduce: Copy {
    fn reduce(self, other: Self, r: Reduction) -> Self;
}

macro_rules! reduce_int {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            fn reduce(self, o: $t, r: Reduction) -> $t {
                match r {
                    Reduction::None => o,
                    // Integer overflow wraps, as two's-complement hardware (ONNX Runtime) does.
                    Reduction::Add => self.wrapping_add(o),
                    Reduction::Mul => self.wrapping_mul(o),
                    Reduction::Max => self.max(o),
                    Reduction::Min => self.min(o),
                }
            }
        }
    )*};
}
reduce_int!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! reduce_float {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            fn reduce(self, o: $t, r: Reduction) -> $t {
                match r {
                    Reduction::None => o,
                    Reduction::Add => self + o,
                    Reduction::Mul => self * o,
                    // std::max(update, value)/std::min(update, value), as ONNX Runtime's
                    // kernels call them: the update unless the comparison picks the value,
                    // so a NaN update wins and a NaN already in place is replaced (checked
                    // against ORT 1.32: integration::nanprop, unit test below).
                    Reduction::Max => if o < self { self } else { o },
                    Reduction::Min => if self < o { self } else { o },
                }
            }
        }
    )*};
}
reduce_float!(f32, f64);

/// float16/bfloat16 reduce in f32 and round once, as ONNX Runtime's MLFloat16 arithmetic does.
macro_rules! reduce_half {
    ($($t:ty),*) => {$(
        impl Reduce for $t {
            fn reduce(self, o: $t, r: Reduction) -> $t {
                <$t>::from_f32(self.to_f32().reduce(o.to_f32(), r))
            }
        }
    )*};
}
reduce_half!(f16, bf16);

fn place<T: Clone>(data: &[T], upd: &[T], pairs: &[(usize, usize)]) -> Vec<T> {
    let mut out = data.to_vec();
    for &(d, s) in pairs {
        out[d] = upd[s].clone();
    }
    out
}

fn place_reduce<T: Reduce>(
    data: &[T],
    upd: &[T],
    pairs: &[(usize, usize)],
    r: Reduction,
) -> Vec<T> {
    let mut out = data.to_vec();
    for &(d, s) in pairs {
        out[d] = out[d].reduce(upd[s], r);
    }
    out
}

/// `data` with `updates[s]` placed at (or reduced into) `d` for every pair, in order (later
/// duplicates win under `none`, as the reference implementation's loop does).
fn scatter(
    data: &TensorData,
    upd: &TensorData,
    pairs: &[(usize, usize)],
    r: Reduction,
) -> Result<TensorData, OpError> {
    use TensorData as TD;
    if data.dtype() != upd.dtype() {
        return err(format!(
            "updates are {:?} but data is {:?}",
            upd.dtype(),
            data.dtype()
        ));
    }
    macro_rules! numeric {
        ($($v:ident),*) => {
            match (data, upd) {
                $((TD::$v(d), TD::$v(u)) => return Ok(TD::$v(place_reduce(d, u, pairs, r).into())),)*
                _ => {}
            }
        };
    }
    if r != Reduction::None {
        numeric!(F32, F64, F16, BF16, I8, U8, I16, U16, I32, U32, I64, U64);
        return err(format!(
            "reduction {r:?} needs numeric data, got {:?}",
            data.dtype()
        ));
    }
    macro_rules! any {
        ($($v:ident),*) => {
            match (data, upd) {
                $((TD::$v(d), TD::$v(u)) => Ok(TD::$v(place(d, u, pairs).into())),)*
                _ => unreachable!("types checked equal above"),
            }
        };
    }
    any!(
        F32, F64, F16, BF16, I8, U8, I16, U16, I32, U32, I64, U64, Bool, Str, F8E4M3FN, F8E4M3FNUZ,
        F8E5M2, F8E5M2FNUZ, U4, I4, F4E2M1
    )
}

fn compress(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let cond = input(inputs, 1)?;
    let TensorData::Bool(c) = cond.data() else {
        return err(format!("condition must be bool, got {:?}", cond.dtype()));
    };
    if cond.rank() != 1 {
        return err(format!(
            "condition must be 1-D, got shape {:?}",
            cond.shape()
        ));
    }
    let (shape, axis) = match ctx.attrs::<IndexAttrs>()?.axis {
        None => (vec![x.len()], 0),
        Some(a) => (x.shape().to_vec(), norm_axis(a, x.rank())?),
    };
    let n = shape[axis];
    if c.len() > n {
        return err(format!(
            "condition has {} entries but the axis has {n}",
            c.len()
        ));
    }
    let keep: Vec<usize> = (0..c.len()).filter(|&i| c[i]).collect();
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut idx = Vec::with_capacity(outer * keep.len() * inner);
    for o in 0..outer {
        for &k in &keep {
            let base = (o * n + k) * inner;
            idx.extend(base..base + inner);
        }
    }
    let mut out_shape = shape;
    out_shape[axis] = keep.len();
    Ok(vec![Tensor::from_parts(out_shape, x.data().gather(&idx))])
}

fn compress_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (x, cond) = (fact(ins, 0)?, fact(ins, 1)?);
    let kept = cond
        .value
        .as_ref()
        .and_then(|v| match v.data() {
            TensorData::Bool(c) => Some(c.iter().filter(|&&b| b).count()),
            _ => None,
        })
        .map(DimFact::known)
        .unwrap_or_else(|| ctx.unknown_dim());
    let shape = match ctx.attrs::<IndexAttrs>()?.axis {
        None => Some(vec![kept]),
        Some(a) => match &x.shape {
            None => None,
            Some(s) => {
                let mut s = s.clone();
                let axis = norm_axis(a, s.len())?;
                s[axis] = kept;
                Some(s)
            }
        },
    };
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// OneHot's depth: the first value of a float or integer tensor, as f64.
fn depth_value(t: &Tensor) -> Option<f64> {
    t.to_f32_vec()
        .map(|v| v.first().map(|&x| x as f64))
        .or_else(|| t.to_i64_vec().map(|v| v.first().map(|&x| x as f64)))
        .flatten()
}

fn one_hot(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let ind = input(inputs, 0)?;
    let depth = input(inputs, 1)?;
    let values = input(inputs, 2)?;
    if depth.len() != 1 {
        return err(format!(
            "depth must hold one value, got shape {:?}",
            depth.shape()
        ));
    }
    let d = depth_value(depth).ok_or_else(|| OpError("depth must be numeric".into()))?;
    if d.is_nan() || d < 1.0 {
        return err(format!("depth must be >= 1, got {d}"));
    }
    let depth = d as usize;
    if values.len() != 2 {
        return err(format!(
            "values must hold [off_value, on_value], got shape {:?}",
            values.shape()
        ));
    }
    // Float indices are truncated toward zero (ONNX Runtime casts them to int64).
    let iv: Vec<i64> = match ind.to_i64_vec() {
        Some(v) if ind.dtype().is_int() => v,
        _ => ind
            .to_f32_vec()
            .ok_or_else(|| OpError("indices must be numeric".into()))?
            .into_iter()
            .map(|v| v as i64)
            .collect(),
    };
    let rank = ind.rank() + 1;
    let axis = norm_axis(ctx.attrs::<IndexAttrs>()?.axis.unwrap_or(-1), rank)?;
    let outer: usize = ind.shape()[..axis].iter().product();
    let inner: usize = ind.shape()[axis..].iter().product();
    let mut pick = vec![0usize; super::util::checked_len(&[outer, depth, inner])?];
    for o in 0..outer {
        for i in 0..inner {
            let v = iv[o * inner + i];
            let v = if v < 0 { v + depth as i64 } else { v };
            // Out of range: no position is on.
            if (0..depth as i64).contains(&v) {
                pick[(o * depth + v as usize) * inner + i] = 1;
            }
        }
    }
    let mut shape = ind.shape().to_vec();
    shape.insert(axis, depth);
    Ok(vec![Tensor::from_parts(shape, values.data().gather(&pick))])
}

fn one_hot_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (ind, depth, values) = (fact(ins, 0)?, fact(ins, 1)?, fact(ins, 2)?);
    let d = depth
        .value
        .as_deref()
        .and_then(depth_value)
        .filter(|&v| v >= 1.0)
        .map(|v| DimFact::known(v as usize))
        .unwrap_or_else(|| ctx.unknown_dim());
    let shape = match &ind.shape {
        None => None,
        Some(s) => {
            let axis = norm_axis(ctx.attrs::<IndexAttrs>()?.axis.unwrap_or(-1), s.len() + 1)?;
            let mut s = s.clone();
            s.insert(axis, d);
            Some(s)
        }
    };
    Ok(vec![Fact::new(values.dtype, shape)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Attribute, Node};

    fn node(op: &str, attrs: &[(&str, Attribute)]) -> Node {
        crate::graph::testing::node_with(op, attrs)
    }

    fn run(n: &Node, opset: i64, ins: &[&Tensor]) -> Result<Tensor, OpError> {
        let def = super::super::Registry::global()
            .def("", &n.op_type)
            .unwrap();
        let ins: Vec<Option<&Tensor>> = ins.iter().map(|t| Some(*t)).collect();
        (def.kernel)(&OpCtx::new(n, opset), &ins).map(|mut v| v.remove(0))
    }

    fn f(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec())
    }

    fn i(shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::from_i64(shape.to_vec(), v.to_vec())
    }

    #[test]
    fn scatter_nd_reductions_accumulate_duplicates_in_order() {
        let data = f(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let ind = i(&[3, 1], &[0, 2, 0]);
        let upd = f(&[3], &[10.0, 20.0, 30.0]);
        let none = node("ScatterND", &[]);
        assert_eq!(
            run(&none, 18, &[&data, &ind, &upd])
                .unwrap()
                .as_f32()
                .unwrap(),
            &[30.0, 2.0, 20.0, 4.0]
        );
        let add = node(
            "ScatterND",
            &[("reduction", Attribute::String("add".into()))],
        );
        assert_eq!(
            run(&add, 18, &[&data, &ind, &upd])
                .unwrap()
                .as_f32()
                .unwrap(),
            &[41.0, 2.0, 23.0, 4.0]
        );
        // max/min with NaN: the update is std::max's first operand (ONNX Runtime).
        let max = node(
            "ScatterND",
            &[("reduction", Attribute::String("max".into()))],
        );
        let d = f(&[2], &[f32::NAN, 1.0]);
        let u = f(&[2], &[2.0, f32::NAN]);
        let out = run(&max, 18, &[&d, &i(&[2, 1], &[0, 1]), &u]).unwrap();
        let out = out.as_f32().unwrap();
        assert!(out[0] == 2.0 && out[1].is_nan(), "{out:?}");
        // A reduction the opset does not have is a load error.
        assert!(IndexAttrs::parse(&max, 16).is_err());
        // Out-of-range indices name the axis.
        let bad = i(&[1, 1], &[4]);
        let e = run(&none, 18, &[&data, &bad, &f(&[1], &[0.0])]).unwrap_err();
        assert!(e.0.contains("axis 0 of size 4"), "{e}");
    }

    #[test]
    fn gather_nd_with_batch_dims() {
        // data [2,2,2], batch_dims 1, indices [2,1]: per batch, row idx.
        let data = f(&[2, 2, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        let ind = i(&[2, 1], &[1, 0]);
        let n = node("GatherND", &[("batch_dims", Attribute::Int(1))]);
        let out = run(&n, 13, &[&data, &ind]).unwrap();
        assert_eq!(out.shape(), &[2, 2]);
        assert_eq!(out.as_f32().unwrap(), &[2.0, 3.0, 4.0, 5.0]);
        // Negative indices count from the end.
        let n0 = node("GatherND", &[]);
        let out = run(&n0, 13, &[&data, &i(&[1, 3], &[-1, 0, -1])]).unwrap();
        assert_eq!(out.as_f32().unwrap(), &[5.0]);
    }

    #[test]
    fn compress_and_one_hot() {
        let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let c = Tensor::from_parts(vec![2], TensorData::Bool(vec![false, true].into()));
        let n = node("Compress", &[("axis", Attribute::Int(1))]);
        let out = run(&n, 11, &[&x, &c]).unwrap();
        assert_eq!(
            (out.shape(), out.as_f32().unwrap()),
            (&[2, 1][..], &[2.0, 5.0][..])
        );
        let flat = node("Compress", &[]);
        assert_eq!(run(&flat, 11, &[&x, &c]).unwrap().as_f32().unwrap(), &[2.0]);

        let oh = node("OneHot", &[]);
        let out = run(
            &oh,
            11,
            &[
                &i(&[3], &[0, -1, 5]),
                &f(&[], &[3.0]),
                &f(&[2], &[0.0, 1.0]),
            ],
        )
        .unwrap();
        assert_eq!(out.shape(), &[3, 3]);
        assert_eq!(
            out.as_f32().unwrap(),
            &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
        );
    }
}
