//! Decomposed RMS normalizations: the layers T5 and Llama-style exports write for one —
//! `Pow(x, 2)` or `Mul(x, x)`, `ReduceMean` over the last axis (kept), `Add` of a one-value
//! ε, `Sqrt`, then `Div(1, ·)` or `Reciprocal` and `Mul` with x, or `Div(x, ·)`; then perhaps a
//! `Mul` by a constant weight per column — run as one kernel at the first layer
//! ([`crate::ops::rms_decomposed`]), each value between them read by the next layer only.
//!
//! [`find`] reads a graph once; [`RmsNorm::layers`] tells whether one run can fuse them:
//! nothing shows the values never stored (no observer, no kept intermediates: the caller
//! checks), no fusion region or quantized kernel takes any of the layers, each computes in
//! float32 (int8/fp8 layers, which have no quantized kernel here, included) reading its inputs
//! as stored, or in float16/bfloat16 with its roundings, which the kernel applies; the
//! input is float32, the mean over its last axis, the weight one value per column. The kernel
//! computes exactly the layers' values, so the result is the same bits (`tests`).

use super::emulate::{InputPrep, LayerPrep};
use super::{sole_reader, Args, Source, Step};
use crate::graph::{Graph, ValueId, ValueIndex};
use crate::numeric::Rounding;
use crate::ops::cast::cast_tensor;
use crate::ops::domain_key;
use crate::ops::rms_decomposed::{RmsLayers, Rounds, Rounds2, Scale};
use crate::precision::{Accumulator, Precision};
use crate::tensor::{DType, Tensor};
use std::borrow::Cow;

/// How the row's root mean square divides the values.
#[derive(Clone, Debug, PartialEq)]
enum ScaleSteps {
    /// `Div(1, root)` (`divides`) or `Reciprocal(root)`, then `Mul` with x (x its input
    /// `x_at`).
    Reciprocal {
        reciprocal: usize,
        divides: bool,
        mul: usize,
        x_at: usize,
    },
    /// `Div(x, root)`.
    Divide(usize),
}

/// The layers after a square that compute one RMS normalization with it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct RmsNorm {
    /// The value normalized.
    x: ValueId,
    /// The square is `Mul(x, x)` (else `Pow(x, 2)`).
    mul_square: bool,
    mean: usize,
    /// The axis `ReduceMean` reduces, as written (-1 or the last: checked per run).
    axis: i64,
    add: usize,
    /// ε, and which input of the Add it is.
    epsilon: (f32, usize),
    sqrt: usize,
    scale: ScaleSteps,
    /// The `Mul` by a weight per column, and which of its inputs is the weight.
    weight: Option<(usize, usize)>,
}

/// The one value of a float32 weight.
fn one_value(src: &Source) -> Option<f32> {
    match src {
        Source::Initializer(_, t) if t.dtype() == DType::F32 && t.len() == 1 => {
            t.as_f32().map(|v| v[0])
        }
        _ => None,
    }
}

/// Per step: the normalization it starts, where it is the square of one.
pub(super) fn find(graph: &Graph, values: &ValueIndex, steps: &[Step]) -> Vec<Option<RmsNorm>> {
    (0..steps.len())
        .map(|i| find_at(graph, values, steps, i))
        .collect()
}

fn find_at(graph: &Graph, values: &ValueIndex, steps: &[Step], square: usize) -> Option<RmsNorm> {
    let plain = |i: usize, op: &str| {
        let n = &graph.nodes[i];
        n.op_type == op && domain_key(&n.domain).is_empty() && steps[i].subs.is_empty()
    };
    let out = |i: usize| steps[i].outputs.first().copied().flatten();
    let next = |i: usize, op: &str| sole_reader(values, steps, i).filter(|&j| plain(j, op));
    let (x, mul_square) = match steps[square].inputs.as_slice() {
        [Source::Slot(x), e] if plain(square, "Pow") && one_value(e) == Some(2.0) => (*x, false),
        [Source::Slot(x), Source::Slot(y)] if plain(square, "Mul") && x == y => (*x, true),
        _ => return None,
    };
    let mean = next(square, "ReduceMean")?;
    let node = &graph.nodes[mean];
    let axes = match steps[mean].inputs.as_slice() {
        [_] => node.attr_ints("axes").map(<[i64]>::to_vec),
        [_, Source::Initializer(_, t)] if node.attr_ints("axes").is_none() => t.to_i64_vec(),
        _ => None,
    }?;
    let ([axis], 1) = (axes.as_slice(), node.attr_int_or("keepdims", 1)) else {
        return None;
    };
    let add = next(mean, "Add")?;
    let epsilon = match steps[add].inputs.as_slice() {
        [Source::Slot(m), e] if Some(*m) == out(mean) => (one_value(e)?, 1),
        [e, Source::Slot(m)] if Some(*m) == out(mean) => (one_value(e)?, 0),
        _ => return None,
    };
    let sqrt = next(add, "Sqrt")?;
    let root = out(sqrt)?;
    let after = sole_reader(values, steps, sqrt)?;
    // `Mul(x, r)` or `Mul(r, x)` after the reciprocal's step: the Mul and x's input.
    let times_x = |r: usize| -> Option<(usize, usize)> {
        let (mul, rv) = (next(r, "Mul")?, out(r)?);
        match steps[mul].inputs.as_slice() {
            [Source::Slot(a), Source::Slot(b)] if (*a, *b) == (x, rv) => Some((mul, 0)),
            [Source::Slot(a), Source::Slot(b)] if (*a, *b) == (rv, x) => Some((mul, 1)),
            _ => None,
        }
    };
    let reciprocal = |divides: bool| -> Option<ScaleSteps> {
        let (mul, x_at) = times_x(after)?;
        Some(ScaleSteps::Reciprocal {
            reciprocal: after,
            divides,
            mul,
            x_at,
        })
    };
    let scale = match steps[after].inputs.as_slice() {
        [one, Source::Slot(s)]
            if plain(after, "Div") && *s == root && one_value(one) == Some(1.0) =>
        {
            reciprocal(true)?
        }
        [Source::Slot(a), Source::Slot(s)] if plain(after, "Div") && *a == x && *s == root => {
            ScaleSteps::Divide(after)
        }
        [Source::Slot(s)] if plain(after, "Reciprocal") && *s == root => reciprocal(false)?,
        _ => return None,
    };
    let scaled = match scale {
        ScaleSteps::Reciprocal { mul, .. } => mul,
        ScaleSteps::Divide(div) => div,
    };
    let weight = next(scaled, "Mul").and_then(|w| {
        let y = out(scaled)?;
        let weight = |s: &Source| matches!(s, Source::Initializer(_, t) if t.dtype() == DType::F32);
        match steps[w].inputs.as_slice() {
            [Source::Slot(a), b] if *a == y && weight(b) => Some((w, 1)),
            [a, Source::Slot(b)] if *b == y && weight(a) => Some((w, 0)),
            _ => None,
        }
    });
    Some(RmsNorm {
        x,
        mul_square,
        mean,
        axis: *axis,
        add,
        epsilon,
        sqrt,
        scale,
        weight,
    })
}

/// How a layer of a plan reads one of its inputs.
enum Read<'a> {
    AsStored,
    Rounded(Rounding),
    /// A weight converted in advance: these values instead.
    Converted(&'a Tensor),
}

/// A layer's roundings under a plan (no reads listed: every input as stored).
#[derive(Default)]
struct LayerRounds<'a> {
    /// Inline: the layers have one or two inputs, and this runs on every run of a plan.
    reads: Args<Read<'a>>,
    writes: Option<Rounding>,
}

impl<'a> LayerRounds<'a> {
    /// The rounding of an activation at input `at` (None: the layer cannot read it so).
    fn activation(&self, at: usize) -> Option<Option<Rounding>> {
        match self.reads.get(at) {
            None | Some(Read::AsStored) => Some(None),
            Some(Read::Rounded(r)) => Some(Some(*r)),
            Some(Read::Converted(_)) => None,
        }
    }

    /// A one-value constant at input `at` as the layer reads it.
    fn constant(&self, at: usize, v: f32) -> Option<f32> {
        match self.reads.get(at) {
            None | Some(Read::AsStored) => Some(v),
            Some(Read::Rounded(r)) => Some(r.round(v)),
            Some(Read::Converted(c)) if c.len() == 1 => {
                Some(*cast_tensor(c, DType::F32).as_f32()?.first()?)
            }
            Some(Read::Converted(_)) => None,
        }
    }

    /// The float32 weight `w` at input `at` as the layer reads it.
    fn weight(&self, at: usize, w: &'a Tensor) -> Option<Cow<'a, [f32]>> {
        match self.reads.get(at) {
            None | Some(Read::AsStored) => Some(Cow::Borrowed(w.as_f32()?)),
            Some(Read::Rounded(r)) => Some(Cow::Owned(
                w.as_f32()?.iter().map(|&v| r.round(v)).collect(),
            )),
            Some(Read::Converted(c)) => match c.as_f32() {
                Some(v) => Some(Cow::Borrowed(v)),
                None => Some(Cow::Owned(cast_tensor(c, DType::F32).as_f32()?.to_vec())),
            },
        }
    }
}

impl RmsNorm {
    /// The layers the kernel computes after the square, in graph order.
    pub fn steps(&self) -> Args<usize> {
        let mut s: Args<usize> = [self.mean, self.add, self.sqrt].into_iter().collect();
        match self.scale {
            ScaleSteps::Reciprocal {
                reciprocal, mul, ..
            } => s.extend([reciprocal, mul]),
            ScaleSteps::Divide(div) => s.push(div),
        }
        s.extend(self.weight.map(|(w, _)| w));
        s
    }

    /// The value normalized.
    pub fn x(&self) -> ValueId {
        self.x
    }

    /// The shape of value `s` of the layers (x's shape `x`): the statistics' one per row
    /// (the mean's, the Add's, the Sqrt's, the reciprocal's), the rest x's.
    pub fn shape_of(&self, s: ValueId, x: &[usize], steps: &[Step]) -> Vec<usize> {
        let mut per_row = vec![self.mean, self.add, self.sqrt];
        if let ScaleSteps::Reciprocal { reciprocal, .. } = self.scale {
            per_row.push(reciprocal);
        }
        let mut shape = x.to_vec();
        if per_row
            .iter()
            .any(|&i| steps[i].outputs.first() == Some(&Some(s)))
        {
            if let Some(last) = shape.last_mut() {
                *last = 1;
            }
        }
        shape
    }

    /// The kernel's layers for a run of `x` (on the grid of `x_on`, if any) under `layers` (a
    /// plan's, if any; `accumulate` its accumulator), the square at step `square`; None where they must run one by one
    /// (the module's introduction), or the weight does not hold one value per column of `x`.
    pub fn layers<'a>(
        &self,
        square: usize,
        steps: &'a [Step],
        x: &Tensor,
        x_on: Option<Precision>,
        layers: Option<&'a [LayerPrep]>,
        accumulate: Accumulator,
    ) -> Option<RmsLayers<'a>> {
        let rank = x.rank();
        let width = *x.shape().last()?;
        if x.dtype() != DType::F32
            || width == 0
            || !(self.axis == -1 || self.axis + 1 == rank as i64)
        {
            return None;
        }
        // Per layer: how it reads each input and what it rounds its output to.
        let layer = |i: usize| -> Option<LayerRounds<'a>> {
            let Some(layers) = layers else {
                return Some(LayerRounds::default());
            };
            let l = &layers[i];
            if l.fusion.is_some() || l.integer.is_some() {
                return None;
            }
            let writes = match l.precision {
                None | Some(Precision::Float32) => None,
                Some(p) if p.is_scaled() => None,
                Some(p) => Some(p.float_rounding()?),
            };
            let reads = (l.inputs.iter())
                .map(|prep| match (prep, writes) {
                    (InputPrep::Keep, _) => Some(Read::AsStored),
                    (InputPrep::Round(q), Some(_)) => q.float_rounding().map(Read::Rounded),
                    (InputPrep::RoundedByKernel(r), Some(_)) => Some(Read::Rounded(*r)),
                    (InputPrep::Converted(c, _), Some(_)) => Some(Read::Converted(c)),
                    _ => None,
                })
                .collect::<Option<Args<Read>>>()?;
            Some(LayerRounds { reads, writes })
        };
        let one_input = |l: &LayerRounds, at: usize| -> Option<Rounds> {
            Some(Rounds {
                reads: l.activation(at)?,
                writes: l.writes,
            })
        };
        // The square reads x at both inputs of a Mul alike; a Pow's exponent 2 stays 2 in
        // every rounding and conversion.
        let sq = layer(square)?;
        if self.mul_square && sq.activation(1)? != sq.activation(0)? {
            return None;
        }
        let mean = layer(self.mean)?;
        if mean.writes.is_some() && accumulate == Accumulator::F16 {
            return None;
        }
        let add = layer(self.add)?;
        let (epsilon, at) = self.epsilon;
        let scale = match self.scale {
            ScaleSteps::Reciprocal {
                reciprocal,
                divides,
                mul,
                x_at,
            } => {
                let r = layer(reciprocal)?;
                // The Div's 1 as the layer reads it (1 on every grid, or a converted copy).
                let (one, reads) = match divides {
                    true => (r.constant(0, 1.0)?, r.activation(1)?),
                    false => (1.0, r.activation(0)?),
                };
                let m = layer(mul)?;
                Scale::Reciprocal {
                    one,
                    reciprocal: Rounds {
                        reads,
                        writes: r.writes,
                    },
                    mul: Rounds2 {
                        reads_x: m.activation(x_at)?,
                        reads_scale: m.activation(1 - x_at)?,
                        writes: m.writes,
                    },
                }
            }
            ScaleSteps::Divide(div) => {
                let d = layer(div)?;
                Scale::Divide(Rounds2 {
                    reads_x: d.activation(0)?,
                    reads_scale: d.activation(1)?,
                    writes: d.writes,
                })
            }
        };
        let weight = match self.weight {
            None => None,
            Some((w, at)) => {
                let l = layer(w)?;
                let Source::Initializer(_, t) = &steps[w].inputs[at] else {
                    return None;
                };
                let shape = t.shape();
                if t.len() != width || shape.len() > rank || shape.last() != Some(&width) {
                    return None;
                }
                Some((l.weight(at, t)?, one_input(&l, 1 - at)?))
            }
        };
        let layers = RmsLayers {
            square: one_input(&sq, 0)?,
            mean: one_input(&mean, 0)?,
            epsilon: add.constant(at, epsilon)?,
            add: one_input(&add, 1 - at)?,
            sqrt: one_input(&layer(self.sqrt)?, 0)?,
            scale,
            weight,
        };
        Some(layers.without_repeated_roundings(x_on.and_then(Precision::float_rounding)))
    }
}

#[cfg(test)]
mod tests {
    use crate::exec::{Feeds, Interpreter, PlanOptions, PreparedPlan, RunOptions, ValueCache};
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, Graph, Node};
    use crate::precision::plan::PrecisionPlan;
    use crate::precision::Precision;
    use crate::tensor::Tensor;

    /// The ways exports write the normalization.
    #[derive(Clone, Copy, Debug)]
    enum Form {
        /// T5: Pow, ReduceMean, Add, Sqrt, Div(1, ·), Mul(x, ·), Mul(weight, ·).
        T5,
        /// Llama: Pow, ReduceMean, Add(ε first), Sqrt, Div(x, ·), Mul(·, weight).
        Llama,
        /// Mul(x, x), ReduceMean, Add, Sqrt, Reciprocal, Mul(·, x); no weight.
        Reciprocal,
    }

    fn reduce_mean(axes: &[i64], keepdims: i64) -> Node {
        let mut n = node("mean", "ReduceMean", &["sq"], &["ms"]);
        n.attrs
            .insert("axes".into(), Attribute::Ints(axes.to_vec()));
        n.attrs.insert("keepdims".into(), Attribute::Int(keepdims));
        n
    }

    /// The normalization of "x" ([.., width]) in `form`, writing "y".
    fn model(form: Form, shape: &[usize]) -> Graph {
        let width = *shape.last().unwrap();
        let mut nodes = match form {
            Form::Reciprocal => vec![node("square", "Mul", &["x", "x"], &["sq"])],
            _ => vec![node("square", "Pow", &["x", "two"], &["sq"])],
        };
        nodes.push(reduce_mean(&[-1], 1));
        nodes.push(match form {
            Form::Llama => node("add", "Add", &["eps", "ms"], &["v"]),
            _ => node("add", "Add", &["ms", "eps"], &["v"]),
        });
        nodes.push(node("sqrt", "Sqrt", &["v"], &["root"]));
        match form {
            Form::T5 => {
                nodes.push(node("inv", "Div", &["one", "root"], &["r"]));
                nodes.push(node("scale", "Mul", &["x", "r"], &["n"]));
                nodes.push(node("weigh", "Mul", &["w", "n"], &["y"]));
            }
            Form::Llama => {
                nodes.push(node("scale", "Div", &["x", "root"], &["n"]));
                nodes.push(node("weigh", "Mul", &["n", "w"], &["y"]));
            }
            Form::Reciprocal => {
                nodes.push(node("inv", "Reciprocal", &["root"], &["r"]));
                nodes.push(node("scale", "Mul", &["r", "x"], &["y"]));
            }
        }
        let w: Vec<f32> = (0..width).map(|i| 0.5 + (i as f32 * 0.61).sin()).collect();
        graph(
            nodes,
            vec![vi("x", shape)],
            vec![vi("y", &[])],
            vec![
                ("two", Tensor::from_f32(vec![], vec![2.0])),
                ("eps", Tensor::from_f32(vec![1], vec![1e-6])),
                ("one", Tensor::from_f32(vec![], vec![1.0])),
                ("w", Tensor::from_f32(vec![width], w)),
            ],
        )
    }

    /// Rows of every kind: ordinary values, a NaN, an infinity, zeros, squares that overflow
    /// float32 and float16, squares that underflow, values off the 16-bit grids.
    fn feeds(shape: &[usize]) -> Feeds {
        let width = *shape.last().unwrap();
        let n: usize = shape.iter().product();
        let mut rng = crate::data::loader::Mt19937::new(11);
        let mut x: Vec<f32> = (0..n)
            .map(|_| (rng.random_sample() * 6.0 - 3.0) as f32)
            .collect();
        let rows = n / width;
        let row = |r: usize| r.min(rows - 1) * width;
        x[row(1)] = f32::NAN;
        x[row(2) + 3] = f32::INFINITY;
        x[row(3)..row(3) + width].fill(0.0);
        x[row(4) + 1] = 3e20;
        x[row(5)..row(5) + width]
            .iter_mut()
            .for_each(|v| *v *= 1e-23);
        x[row(6)..row(6) + width]
            .iter_mut()
            .for_each(|v| *v *= 300.0);
        let mut f = Feeds::new();
        f.insert("x".into(), Tensor::from_f32(shape.to_vec(), x));
        f
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// The fused run gives the bits of the layers run one by one (kept intermediates turn
    /// fusion off); returns the steps the square's profiled run computed with it.
    fn fused_is_alone(g: &Graph, feeds: &Feeds, plan: Option<&PreparedPlan>) -> Vec<usize> {
        let interp = Interpreter::new(g).unwrap();
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let (fused, alone) = match plan {
            None => (interp.run(feeds), interp.run_with(feeds, &keep)),
            Some(p) => (
                interp.run_plan(feeds, &RunOptions::default(), p),
                interp.run_plan(feeds, &keep, p),
            ),
        };
        let (fused, alone) = (fused.unwrap(), alone.unwrap());
        assert_eq!(bits(&fused.outputs[0].1), bits(&alone.outputs[0].1));
        let (_, times) = interp.run_profiled(feeds, plan).unwrap();
        let square = g.nodes.iter().position(|n| n.name == "square").unwrap();
        times
            .iter()
            .find(|t| t.node == square)
            .unwrap()
            .fused
            .clone()
    }

    fn prepared(g: &Graph, layers: Vec<Precision>) -> PreparedPlan {
        PreparedPlan::new(
            g,
            &PrecisionPlan::from_layers(layers),
            &PlanOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn every_form_of_the_decomposed_normalization_has_the_bits_of_its_layers() {
        // 10 rows (a group of 8 and one of 2), long rows, and enough values for threads.
        for shape in [&[2usize, 5, 64][..], &[1, 9, 1000], &[3, 70, 320]] {
            let feeds = feeds(shape);
            let t5 = model(Form::T5, shape);
            assert_eq!(fused_is_alone(&t5, &feeds, None), vec![1, 2, 3, 4, 5, 6]);
            let llama = model(Form::Llama, shape);
            assert_eq!(fused_is_alone(&llama, &feeds, None), vec![1, 2, 3, 4, 5]);
            let recip = model(Form::Reciprocal, shape);
            assert_eq!(fused_is_alone(&recip, &feeds, None), vec![1, 2, 3, 4, 5]);
        }
        // The NaN row stays NaN, the zero row zero (√ε is finite), the overflowing one
        // NaN or zero as the layers give it.
        let shape = [2usize, 5, 64];
        let r = Interpreter::new(&model(Form::T5, &shape))
            .unwrap()
            .run(&feeds(&shape))
            .unwrap();
        let y = r.outputs[0].1.as_f32().unwrap().to_vec();
        assert!(y[64..128].iter().all(|v| v.is_nan()));
        assert!(y[192..256].iter().all(|&v| v == 0.0));
        // ReduceMean's axes as an input (opset 18).
        let mut g = model(Form::Llama, &shape);
        g.opsets.insert(String::new(), 18);
        g.nodes[1] = node("mean", "ReduceMean", &["sq", "last"], &["ms"]);
        g.initializers
            .insert("last".into(), Tensor::from_i64(vec![1], vec![2]));
        assert_eq!(
            fused_is_alone(&g, &feeds(&shape), None),
            vec![1, 2, 3, 4, 5]
        );
    }

    #[test]
    fn plans_fuse_the_normalization_with_each_layers_roundings() {
        let shape = [2usize, 5, 64];
        let feeds = feeds(&shape);
        for form in [Form::T5, Form::Llama, Form::Reciprocal] {
            // An ε off the 16-bit grids and large enough that rounding the mean before the
            // Add shows in the sum.
            let mut g = model(form, &shape);
            g.initializers
                .insert("eps".into(), Tensor::from_f32(vec![1], vec![0.3]));
            let n = g.nodes.len();
            let all: Vec<usize> = (1..n).collect();
            for p in [
                Precision::Float16,
                Precision::BFloat16,
                Precision::Int8,
                Precision::Fp8E4M3,
            ] {
                let plan = prepared(&g, vec![p; n]);
                assert_eq!(
                    fused_is_alone(&g, &feeds, Some(&plan)),
                    all,
                    "{form:?} {p:?}"
                );
            }
            let choices = [Precision::Float32, Precision::Float16, Precision::BFloat16];
            let mut rng = crate::data::loader::Mt19937::new(5);
            for _ in 0..16 {
                let layers: Vec<Precision> = (0..n)
                    .map(|_| choices[(rng.random_sample() * 3.0) as usize % 3])
                    .collect();
                let plan = prepared(&g, layers.clone());
                assert_eq!(
                    fused_is_alone(&g, &feeds, Some(&plan)),
                    all,
                    "{form:?} {layers:?}"
                );
            }
        }
        // x written by a layer of the plan (on its grid, or another's): the roundings of x
        // the layers skip or apply as they read it (where none is left, the squares and the
        // scaling run in one pass each, rounding in registers: every form, rows of 64 and of
        // 67 values, a vector's tail), then random plans for the rest.
        let choices = [Precision::Float32, Precision::Float16, Precision::BFloat16];
        let mut rng = crate::data::loader::Mt19937::new(7);
        for (form, shape) in [Form::T5, Form::Llama, Form::Reciprocal]
            .into_iter()
            .flat_map(|f| [(f, [2usize, 5, 64]), (f, [1, 9, 67])])
        {
            let feeds = self::feeds(&shape);
            let mut g = model(form, &shape);
            g.nodes.iter_mut().for_each(|n| {
                n.inputs
                    .iter_mut()
                    .filter(|i| *i == "x")
                    .for_each(|i| *i = "x1".into());
            });
            g.nodes
                .insert(0, node("pre", "Mul", &["x", "three"], &["x1"]));
            g.initializers
                .insert("three".into(), Tensor::from_f32(vec![], vec![1.37]));
            let n = g.nodes.len();
            let all: Vec<usize> = (2..n).collect();
            let mut plans = vec![
                (Precision::Float16, Precision::Float16),
                (Precision::BFloat16, Precision::BFloat16),
                (Precision::BFloat16, Precision::Float16),
                (Precision::Float16, Precision::BFloat16),
                (Precision::Float32, Precision::Float16),
            ]
            .into_iter()
            .map(|(pre, rest)| {
                let mut layers = vec![rest; n];
                layers[0] = pre;
                layers
            })
            .collect::<Vec<_>>();
            // The squares' roundings seen whole (every layer after them in float32); the
            // scaled values' (the weights' layer, the last, in float32; the scaling's before
            // it too).
            let after_square: Vec<usize> = (2..n).collect();
            for p in [Precision::Float16, Precision::BFloat16] {
                for float32 in [&after_square[..], &[n - 1], &[n - 2, n - 1]] {
                    let mut layers = vec![p; n];
                    float32.iter().for_each(|&i| layers[i] = Precision::Float32);
                    plans.push(layers);
                }
            }
            for _ in 0..12 {
                plans.push(
                    (0..n)
                        .map(|_| choices[(rng.random_sample() * 3.0) as usize % 3])
                        .collect(),
                );
            }
            for layers in plans {
                let plan = prepared(&g, layers.clone());
                assert_eq!(
                    fused_is_alone(&g, &feeds, Some(&plan)),
                    all,
                    "{form:?} {shape:?} {layers:?}"
                );
            }
        }
        // Float16 accumulation of a float16 mean: ReduceMean's own order, not fused.
        let g = model(Form::T5, &shape);
        let options = PlanOptions {
            accumulate: crate::precision::Accumulator::F16,
            ..PlanOptions::default()
        };
        let plan = PrecisionPlan::from_layers(vec![Precision::Float16; g.nodes.len()]);
        let plan = PreparedPlan::new(&g, &plan, &options).unwrap();
        assert_eq!(fused_is_alone(&g, &feeds, Some(&plan)), Vec::<usize>::new());
    }

    #[test]
    fn layers_that_are_no_normalization_of_the_last_axis_run_alone() {
        let shape = [2usize, 5, 64];
        let feeds = feeds(&shape);
        let none: Vec<usize> = Vec::new();
        // The mean over another axis, over two, or not kept (a cube: it still broadcasts).
        for mean in [reduce_mean(&[1], 1), reduce_mean(&[1, 2], 1)] {
            let mut g = model(Form::T5, &shape);
            g.nodes[1] = mean;
            assert_eq!(fused_is_alone(&g, &feeds, None), none);
        }
        let mut g = model(Form::T5, &[8, 8, 8]);
        g.nodes[1] = reduce_mean(&[-1], 0);
        assert_eq!(fused_is_alone(&g, &self::feeds(&[8, 8, 8]), None), none);
        // ε of two values; an exponent of 3; a Div by something else than 1.
        let mut g = model(Form::T5, &shape);
        g.initializers.insert(
            "eps".into(),
            Tensor::from_f32(vec![2, 1, 1], vec![1e-6, 1.0]),
        );
        assert_eq!(fused_is_alone(&g, &feeds, None), none);
        let mut g = model(Form::T5, &shape);
        g.initializers
            .insert("two".into(), Tensor::from_f32(vec![], vec![3.0]));
        assert_eq!(fused_is_alone(&g, &feeds, None), none);
        let mut g = model(Form::T5, &shape);
        g.initializers
            .insert("one".into(), Tensor::from_f32(vec![], vec![2.0]));
        assert_eq!(fused_is_alone(&g, &feeds, None), none);
        // A value inside read by another layer too, or a graph output.
        let mut g = model(Form::T5, &shape);
        g.nodes.push(node("peek", "Neg", &["root"], &["p"]));
        g.outputs.push(vi("p", &[]));
        assert_eq!(fused_is_alone(&g, &feeds, None), none);
        let mut g = model(Form::Llama, &shape);
        g.outputs.push(vi("ms", &[]));
        assert_eq!(fused_is_alone(&g, &feeds, None), none);
        // A weight that is not one per column: the normalization without the Mul.
        let mut g = model(Form::Llama, &shape);
        g.initializers.insert(
            "w".into(),
            Tensor::from_f32(vec![5, 1], vec![0.5, 1.0, 1.5, 2.0, 2.5]),
        );
        assert_eq!(fused_is_alone(&g, &feeds, None), none);
        // The normalized value's last Mul read twice: fused up to it.
        let mut g = model(Form::Llama, &shape);
        g.nodes.push(node("peek", "Neg", &["n"], &["p"]));
        g.outputs.push(vi("p", &[]));
        assert_eq!(fused_is_alone(&g, &feeds, None), vec![1, 2, 3, 4]);
    }

    #[test]
    fn a_cached_run_counts_each_fused_layers_work_as_alone() {
        let shape = [2usize, 5, 64];
        let feeds = feeds(&shape);
        for form in [Form::T5, Form::Llama, Form::Reciprocal] {
            let g = model(form, &shape);
            let interp = Interpreter::new(&g).unwrap();
            let flops = |keep: bool| {
                let mut cache = ValueCache::new(1 << 20);
                let opts = RunOptions {
                    keep_intermediates: keep,
                };
                interp
                    .run_cached(&feeds, 1, &opts, None, &mut cache)
                    .unwrap();
                let mut f: Vec<(usize, u64)> = cache.layer_flops.into_iter().collect();
                f.sort();
                f
            };
            assert_eq!(flops(false), flops(true), "{form:?}");
        }
    }
}
