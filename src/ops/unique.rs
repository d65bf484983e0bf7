//! Unique (opset 11): the distinct elements of a tensor, or the distinct slices along `axis`,
//! with the index of each one's first occurrence, every element's index into the result, and
//! the counts. `sorted = 1` (the default) orders them ascending — slices lexicographically —
//! otherwise by first occurrence, as the ONNX spec and ONNX Runtime do. Floats compare as
//! numbers, so -0 and +0 are one value (the first occurrence's is kept), as in ONNX Runtime;
//! all NaNs are one value, sorted last (the spec does not say; ONNX Runtime's ordering with a
//! NaN is not a strict order).

use super::attrs::{boxed, AttrError, Attrs};
use super::shape::{fact, FactsResult};
use super::util::{input, norm_axis};
use super::{InferCtx, OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::{DimFact, Fact};
use crate::tensor::{DType, Tensor, TensorData};
use std::cmp::Ordering;

pub fn register(r: &mut Registry) {
    // It selects values and never changes one: data movement, carrying its input's precision.
    r.add("Unique", unique)
        .parse(|n, _| boxed(UniqueAttrs::parse(n)))
        .infer(unique_facts)
        .movement();
}

/// Unique's attributes.
#[derive(Clone, Debug, PartialEq)]
pub struct UniqueAttrs {
    pub axis: Option<i64>,
    pub sorted: bool,
}

impl UniqueAttrs {
    fn parse(node: &crate::graph::Node) -> Result<UniqueAttrs, AttrError> {
        let a = Attrs::new(node);
        Ok(UniqueAttrs {
            axis: a.int("axis")?,
            sorted: a.flag("sorted", true)?,
        })
    }
}

/// One element as a sortable key.
#[derive(Clone, Debug)]
enum Key {
    Float(f64),
    Int(i64),
    Text(String),
}

impl Key {
    fn cmp(&self, other: &Key) -> Ordering {
        match (self, other) {
            // -0 equals +0 (ONNX Runtime's `std::map` ordering); NaNs are one value, last.
            (Key::Float(a), Key::Float(b)) => match (a.is_nan(), b.is_nan()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                _ => a.partial_cmp(b).expect("not NaN"),
            },
            (Key::Int(a), Key::Int(b)) => a.cmp(b),
            (Key::Text(a), Key::Text(b)) => a.cmp(b),
            _ => Ordering::Equal,
        }
    }
}

fn keys(t: &Tensor) -> Result<Vec<Key>, OpError> {
    if let TensorData::Str(v) = t.data() {
        return Ok(v.iter().map(|s| Key::Text(s.clone())).collect());
    }
    if t.dtype().is_float() {
        return Ok(t
            .to_f64_vec()
            .expect("float")
            .into_iter()
            .map(Key::Float)
            .collect());
    }
    match t.to_i64_vec() {
        Some(v) => Ok(v.into_iter().map(Key::Int).collect()),
        None => Err(OpError(format!(
            "X has dtype {}, which Unique does not compare",
            t.dtype()
        ))),
    }
}

fn unique(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<UniqueAttrs>()?;
    let x = input(inputs, 0)?;
    let shape = x.shape();
    // Slices: `outer` blocks of `n` slices of `inner` elements each (no axis: every element).
    let (axis, outer, n, inner) = match attrs.axis {
        Some(a) => {
            let axis = norm_axis(a, shape.len())?;
            let outer: usize = shape[..axis].iter().product();
            let inner: usize = shape[axis + 1..].iter().product();
            (Some(axis), outer, shape[axis], inner)
        }
        None => (None, 1, x.len(), 1),
    };
    let k = keys(x)?;
    // The element indices of slice `i`.
    let slice =
        |i: usize| (0..outer).flat_map(move |o| (0..inner).map(move |j| (o * n + i) * inner + j));
    let cmp = |a: usize, b: usize| {
        slice(a)
            .zip(slice(b))
            .map(|(p, q)| k[p].cmp(&k[q]))
            .find(|o| *o != Ordering::Equal)
            .unwrap_or(Ordering::Equal)
    };
    // Slices in order of first occurrence, then sorted if asked (stable: ties keep it).
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| cmp(a, b).then(a.cmp(&b)));
    let mut firsts: Vec<usize> = Vec::new();
    let mut inverse = vec![0usize; n];
    let mut counts: Vec<i64> = Vec::new();
    // Group equal slices (adjacent after the sort); each group's first index is its smallest.
    let mut group_of = vec![0usize; n];
    for (pos, &i) in order.iter().enumerate() {
        if pos == 0 || cmp(order[pos - 1], i) != Ordering::Equal {
            firsts.push(i);
            counts.push(0);
        }
        let g = firsts.len() - 1;
        group_of[i] = g;
        counts[g] += 1;
    }
    // Groups in output order: ascending (sorted) or by first occurrence.
    let mut out_order: Vec<usize> = (0..firsts.len()).collect();
    if !attrs.sorted {
        out_order.sort_by_key(|&g| firsts[g]);
    }
    let mut rank_of = vec![0usize; firsts.len()];
    for (r, &g) in out_order.iter().enumerate() {
        rank_of[g] = r;
    }
    for i in 0..n {
        inverse[i] = rank_of[group_of[i]];
    }
    let picked: Vec<usize> = out_order.iter().map(|&g| firsts[g]).collect();
    let m = picked.len();
    let y = match axis {
        None => Tensor::from_parts(vec![m], x.data().gather(&picked)),
        Some(axis) => {
            let idx: Vec<usize> = (0..outer)
                .flat_map(|o| {
                    picked
                        .iter()
                        .flat_map(move |&i| (0..inner).map(move |j| (o * n + i) * inner + j))
                })
                .collect();
            let mut s = shape.to_vec();
            s[axis] = m;
            Tensor::from_parts(s, x.data().gather(&idx))
        }
    };
    let ints = |v: Vec<i64>| Tensor::from_i64(vec![v.len()], v);
    Ok(vec![
        y,
        ints(picked.iter().map(|&i| i as i64).collect()),
        ints(inverse.iter().map(|&i| i as i64).collect()),
        ints(out_order.iter().map(|&g| counts[g]).collect()),
    ])
}

fn unique_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    let attrs = ctx.attrs::<UniqueAttrs>()?;
    let m = ctx.unknown_dim();
    let y = match (attrs.axis, &x.shape) {
        (None, _) => Some(vec![m.clone()]),
        (Some(a), Some(s)) => {
            let axis = norm_axis(a, s.len())?;
            let mut s = s.clone();
            s[axis] = m.clone();
            Some(s)
        }
        (Some(_), None) => None,
    };
    let inverse = match (attrs.axis, &x.shape) {
        (None, Some(s)) => {
            let n: Option<usize> = s.iter().map(DimFact::as_known).product();
            Some(vec![n.map_or_else(|| ctx.unknown_dim(), DimFact::known)])
        }
        (Some(a), Some(s)) => Some(vec![s[norm_axis(a, s.len())?].clone()]),
        _ => Some(vec![ctx.unknown_dim()]),
    };
    let i64s = |shape| Fact::new(Some(DType::I64), shape);
    Ok(vec![
        Fact::new(x.dtype, y),
        i64s(Some(vec![m.clone()])),
        i64s(inverse),
        i64s(Some(vec![m])),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::node_with;
    use crate::graph::Attribute;

    fn run(attrs: &[(&str, Attribute)], x: &Tensor) -> Vec<Tensor> {
        let n = node_with("Unique", attrs);
        unique(&OpCtx::new(&n, 11), &[Some(x)]).unwrap()
    }

    #[test]
    fn sorted_and_first_occurrence_orders() {
        let x = Tensor::from_f32(vec![6], vec![2.0, 1.0, 1.0, 3.0, 4.0, 3.0]);
        let out = run(&[], &x);
        assert_eq!(out[0].as_f32().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(out[1].to_i64_vec().unwrap(), vec![1, 0, 3, 4]);
        assert_eq!(out[2].to_i64_vec().unwrap(), vec![1, 0, 0, 2, 3, 2]);
        assert_eq!(out[3].to_i64_vec().unwrap(), vec![2, 1, 2, 1]);
        let out = run(&[("sorted", Attribute::Int(0))], &x);
        assert_eq!(out[0].as_f32().unwrap(), &[2.0, 1.0, 3.0, 4.0]);
        assert_eq!(out[2].to_i64_vec().unwrap(), vec![0, 1, 1, 2, 3, 2]);
    }

    /// -0 and +0 are one value (the first kept), NaNs one value sorted last.
    #[test]
    fn zeros_and_nans() {
        let x = Tensor::from_f32(vec![5], vec![f32::NAN, -0.0, 1.0, 0.0, f32::NAN]);
        let out = run(&[], &x);
        let y = out[0].as_f32().unwrap();
        assert_eq!(y.len(), 3);
        assert!(y[0] == 0.0 && y[0].is_sign_negative() && y[1] == 1.0 && y[2].is_nan());
        assert_eq!(out[3].to_i64_vec().unwrap(), vec![2, 1, 2]);
    }

    #[test]
    fn slices_along_an_axis() {
        // Rows (1, 0), (1, 0), (0, 1): two distinct rows, sorted (0, 1) first.
        let x = Tensor::from_i64(vec![3, 2], vec![1, 0, 1, 0, 0, 1]);
        let out = run(&[("axis", Attribute::Int(0))], &x);
        assert_eq!(out[0].shape(), &[2, 2]);
        assert_eq!(out[0].to_i64_vec().unwrap(), vec![0, 1, 1, 0]);
        assert_eq!(out[1].to_i64_vec().unwrap(), vec![2, 0]);
        assert_eq!(out[2].to_i64_vec().unwrap(), vec![1, 1, 0]);
        assert_eq!(out[3].to_i64_vec().unwrap(), vec![1, 2]);
        let n = node_with("Unique", &[("axis", Attribute::Int(2))]);
        let e = unique(&OpCtx::new(&n, 11), &[Some(&x)]).unwrap_err();
        assert!(e.0.contains("axis") || e.0.contains('2'), "{e}");
    }
}
