//! Scaled integer products: an integer kernel whose only reader is `Cast(to=FLOAT)`, whose
//! only reader is a `Mul` by a scale, runs as one kernel writing the float32 result
//! ([`crate::ops::ScaledFn`]). ONNX Runtime's dynamic quantization writes this chain after
//! every MatMulInteger (`(float)acc · (x_scale · w_scale)`), and ONNX Runtime runs it fused
//! (MatMulIntegerToFloat); as three layers it is two more passes over the output and two more
//! layers to dispatch, for a product of a few rows.
//!
//! [`find`] reads a graph once; [`ScaledProduct::applies`] tells whether one run can fuse it:
//! nothing shows the two values never stored (no observer, no kept intermediates: the caller
//! checks), no fusion region or quantized kernel takes any of the three layers, and the Cast
//! runs in float32 (or int8/fp8, which it has no kernel for: float32) reading its input as
//! stored; the Mul likewise, or in float16/bfloat16 with its roundings applied by the kernel.
//! The kernel computes exactly the two layers' values, so the result is the same bits
//! (`tests`).

use super::emulate::{InputPrep, LayerPrep};
use super::{sole_reader, Source, Step};
use crate::graph::{Graph, ValueIndex};
use crate::ops::{domain_key, Registry};
use crate::precision::Precision;

/// The two layers after an integer kernel that it computes itself.
#[derive(Clone, Debug)]
pub(super) struct ScaledProduct {
    /// The Cast's step.
    pub cast: usize,
    /// The Mul's step.
    pub mul: usize,
    /// Which input of the Mul is the scale (the other is the Cast's output).
    pub scale: usize,
    /// The anchor's kernel that computes them.
    pub kernel: crate::ops::ScaledFn,
}

/// Per step: the Cast and Mul it may compute, where its op can ([`crate::ops::OpDef::scaled`]).
pub(super) fn find(
    graph: &Graph,
    values: &ValueIndex,
    steps: &[Step],
) -> Vec<Option<ScaledProduct>> {
    let registry = Registry::global();
    let sole_reader = |i: usize| sole_reader(values, steps, i);
    let plain = |i: usize, op: &str| {
        let n = &graph.nodes[i];
        n.op_type == op && domain_key(&n.domain).is_empty() && steps[i].subs.is_empty()
    };
    (0..steps.len())
        .map(|a| {
            let node = &graph.nodes[a];
            let kernel = registry.def(&node.domain, &node.op_type)?.scaled?;
            let cast = sole_reader(a).filter(|&c| plain(c, "Cast"))?;
            if graph.nodes[cast].attr_int("to")
                != Some(i64::from(crate::tensor::DType::F32.onnx_code()))
            {
                return None;
            }
            let mul = sole_reader(cast).filter(|&m| plain(m, "Mul"))?;
            let [Some(out)] = steps[cast].outputs.as_slice() else {
                return None;
            };
            let [Some(_)] = steps[mul].outputs.as_slice() else {
                return None;
            };
            let scale = match steps[mul].inputs.as_slice() {
                [Source::Slot(x), other] if x == out => (1, other),
                [other, Source::Slot(x)] if x == out => (0, other),
                _ => return None,
            };
            matches!(scale.1, Source::Slot(_) | Source::Initializer(..)).then_some(ScaledProduct {
                cast,
                mul,
                scale: scale.0,
                kernel,
            })
        })
        .collect()
}

impl ScaledProduct {
    /// The layers the kernel computes, in graph order.
    pub fn steps(&self) -> [usize; 2] {
        [self.cast, self.mul]
    }

    /// Whether a run under `layers` (a plan's, if any) may fuse the Cast and Mul into the
    /// kernel at `anchor` (see the module's introduction), and if so what the Mul rounds as it
    /// reads its inputs.
    pub fn applies(&self, anchor: usize, layers: Option<&[LayerPrep]>) -> Option<MulRounding> {
        let Some(layers) = layers else {
            return Some(MulRounding::default());
        };
        let plain = |l: &LayerPrep| l.fusion.is_none() && l.integer.is_none();
        let as_stored =
            |l: &LayerPrep| plain(l) && l.inputs.iter().all(|p| matches!(p, InputPrep::Keep));
        // Float32, or int8/fp8 on these layers, which have no quantized kernel: they then
        // compute in float32 (reading their inputs as stored, which `as_stored` checks).
        let float32 = |l: &LayerPrep| match l.precision {
            None | Some(Precision::Float32) => true,
            Some(p) => p.is_scaled(),
        };
        let (cast, mul) = (&layers[self.cast], &layers[self.mul]);
        if !(as_stored(&layers[anchor]) && as_stored(cast) && float32(cast) && plain(mul)) {
            return None;
        }
        if float32(mul) {
            return as_stored(mul).then_some(MulRounding::default());
        }
        // A float16/bfloat16 Mul: each input kept or rounded to its precision, its product
        // rounded to it after (by the kernel, in the same pass).
        let p = mul.precision.filter(|p| p.float_rounding().is_some())?;
        let rounds = |i: usize| match mul.inputs.get(i) {
            None | Some(InputPrep::Keep) => Some(false),
            Some(InputPrep::Round(q)) if *q == p => Some(true),
            Some(_) => None,
        };
        let (by_scale, by_cast) = (rounds(self.scale)?, rounds(1 - self.scale)?);
        Some(MulRounding {
            cast: by_cast.then_some(p),
            scale: by_scale.then_some(p),
            output: Some(p),
        })
    }
}

/// What a reduced-precision Mul rounds its inputs to as it reads them (None: read as they
/// are): the Cast's values and the scale; and its product (None: float32).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct MulRounding {
    pub cast: Option<Precision>,
    pub scale: Option<Precision>,
    pub output: Option<Precision>,
}

#[cfg(test)]
mod tests {
    use crate::exec::{Feeds, Interpreter, PlanOptions, PreparedPlan, RunOptions};
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, Graph, Node};
    use crate::precision::plan::PrecisionPlan;
    use crate::precision::Precision;
    use crate::tensor::{Tensor, TensorData};

    const K: usize = 1024;
    const N: usize = 24;

    fn cast(name: &str, input: &str, out: &str, to: i64) -> Node {
        let mut n = node(name, "Cast", &[input], &[out]);
        n.attrs.insert("to".into(), Attribute::Int(to));
        n
    }

    /// ONNX Runtime's dynamic quantization of `x · w`: DynamicQuantizeLinear, MatMulInteger,
    /// Cast, Mul by `x_scale · w_scale` (`scale`: "s", computed per run; or a constant per
    /// column). B's codes are 128–255, most of x's near its maximum and K 1024, so accumulators pass 2^24 and the Cast
    /// rounds. `extra`: more nodes; `outputs`: the graph's.
    fn model(scale: &str, extra: Vec<Node>, outputs: &[&str]) -> Graph {
        let mut nodes = vec![
            node("dql", "DynamicQuantizeLinear", &["x"], &["xq", "xs", "xz"]),
            node("scales", "Mul", &["xs", "ws"], &["s"]),
            node("mmi", "MatMulInteger", &["xq", "wq", "xz", "wz"], &["acc"]),
            cast("cast", "acc", "accf", 1),
            node("rescale", "Mul", &[scale, "accf"], &["y"]),
        ];
        nodes.extend(extra);
        let mut rng = crate::data::loader::Mt19937::new(5);
        let codes: Vec<u8> = (0..K * N)
            .map(|i| {
                if i % 7 == 0 {
                    255
                } else {
                    128 + (rng.random_sample() * 128.0) as u8
                }
            })
            .collect();
        let per_column: Vec<f32> = (0..N).map(|j| 1e-3 * (j as f32 + 0.3)).collect();
        graph(
            nodes,
            vec![vi("x", &[2, 5, K])],
            outputs.iter().map(|o| vi(o, &[])).collect(),
            vec![
                (
                    "wq",
                    Tensor::from_parts(vec![K, N], TensorData::U8(codes.into())),
                ),
                (
                    "wz",
                    Tensor::from_parts(vec![], TensorData::U8(vec![0].into())),
                ),
                ("ws", Tensor::from_f32(vec![], vec![0.013])),
                ("cols", Tensor::from_f32(vec![1, N], per_column)),
                ("rows", Tensor::from_f32(vec![2, 1, 1], vec![0.5, 2.0])),
            ],
        )
    }

    fn feeds() -> Feeds {
        let mut rng = crate::data::loader::Mt19937::new(9);
        let mut x: Vec<f32> = (0..10 * K)
            .map(|_| (rng.random_sample() * 2.0 + 3.0) as f32)
            .collect();
        // The extremes, so codes span 0..=255.
        x[0] = -3.0;
        x[1] = 5.0;
        let mut f = Feeds::new();
        f.insert("x".into(), Tensor::from_f32(vec![2, 5, K], x));
        f
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// The steps the profiled run fused into the MatMulInteger (step 2).
    fn fused_into_product(interp: &Interpreter, plan: Option<&PreparedPlan>) -> Vec<usize> {
        let (_, times) = interp.run_profiled(&feeds(), plan).unwrap();
        let t = times.iter().find(|t| t.node == 2).unwrap();
        t.fused.clone()
    }

    /// The fused run gives the bits of the layers run one by one (kept intermediates turn
    /// fusion off), and the profile lists the Cast and Mul with the product.
    fn fused_is_alone(g: &Graph, plan: Option<&PreparedPlan>) -> Vec<usize> {
        let interp = Interpreter::new(g).unwrap();
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let (fused, alone) = match plan {
            None => (interp.run(&feeds()), interp.run_with(&feeds(), &keep)),
            Some(p) => (
                interp.run_plan(&feeds(), &RunOptions::default(), p),
                interp.run_plan(&feeds(), &keep, p),
            ),
        };
        let (fused, alone) = (fused.unwrap(), alone.unwrap());
        assert_eq!(fused.outputs.len(), alone.outputs.len());
        for ((n, f), (_, a)) in fused.outputs.iter().zip(&alone.outputs) {
            assert_eq!(bits(f), bits(a), "{n}");
        }
        fused_into_product(&interp, plan)
    }

    #[test]
    fn the_cast_and_the_scaling_after_an_integer_product_are_found() {
        let g = model("s", Vec::new(), &["y"]);
        let interp = Interpreter::new(&g).unwrap();
        let found: Vec<Option<(usize, usize, usize)>> = (interp.scaled.iter())
            .map(|p| p.as_ref().map(|p| (p.cast, p.mul, p.scale)))
            .collect();
        assert_eq!(found, vec![None, None, Some((3, 4, 0)), None, None]);
        // Not where the product or the Cast is read elsewhere, or the Cast is to float16.
        let peek = node("peek", "Neg", &["accf"], &["p"]);
        let g = model("s", vec![peek], &["y", "p"]);
        assert!(Interpreter::new(&g)
            .unwrap()
            .scaled
            .iter()
            .all(Option::is_none));
        let g = model("s", Vec::new(), &["y", "acc"]);
        assert!(Interpreter::new(&g)
            .unwrap()
            .scaled
            .iter()
            .all(Option::is_none));
        let mut g = model("s", Vec::new(), &["y"]);
        g.nodes[3] = cast("cast", "acc", "accf", 10);
        assert!(Interpreter::new(&g)
            .unwrap()
            .scaled
            .iter()
            .all(Option::is_none));
    }

    #[test]
    fn a_scaled_product_has_the_bits_of_its_three_layers() {
        // The scale computed in the run (a scalar), and a constant one per column.
        for scale in ["s", "cols"] {
            let g = model(scale, Vec::new(), &["y"]);
            assert_eq!(fused_is_alone(&g, None), vec![3, 4], "{scale}");
        }
        // A Cast that rounds: some accumulator is above 2^24 and not a multiple of 2^k.
        let g = model("s", vec![], &["y"]);
        let interp = Interpreter::new(&g).unwrap();
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let r = interp.run_with(&feeds(), &keep).unwrap();
        let TensorData::I32(acc) = r.intermediates["acc"].data() else {
            panic!("MatMulInteger writes int32");
        };
        let acc = acc.as_slice();
        assert!(acc
            .iter()
            .any(|&v| v.abs() > 1 << 24 && v as f32 as i32 != v));
        // A NaN or infinite scale propagates as the Mul propagates it.
        let mut g = model("cols", vec![], &["y"]);
        let mut cols = vec![0.5f32; N];
        cols[3] = f32::NAN;
        cols[4] = f32::INFINITY;
        g.initializers
            .insert("cols".into(), Tensor::from_f32(vec![N], cols));
        assert_eq!(fused_is_alone(&g, None), vec![3, 4]);
    }

    #[test]
    fn a_scale_that_broadcasts_the_output_or_comes_later_leaves_the_layers_alone() {
        let g = model("rows", Vec::new(), &["y"]);
        assert_eq!(fused_is_alone(&g, None), Vec::<usize>::new());
        // The scale computed after the product (graph order): not known when it runs.
        let mut g = model("s", Vec::new(), &["y"]);
        g.nodes.swap(1, 2);
        let interp = Interpreter::new(&g).unwrap();
        assert!(interp.scaled[1].is_some());
        let (r, times) = interp.run_profiled(&feeds(), None).unwrap();
        assert!(times.iter().all(|t| t.fused.is_empty()));
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let alone = interp.run_with(&feeds(), &keep).unwrap();
        assert_eq!(bits(&r.outputs[0].1), bits(&alone.outputs[0].1));
    }

    #[test]
    fn plans_fuse_a_cast_and_a_scaling_that_read_their_values_as_stored_or_rounded() {
        let prepared = |g: &Graph, layers: Vec<Precision>| {
            let plan = PrecisionPlan::from_layers(layers);
            PreparedPlan::new(g, &plan, &PlanOptions::default()).unwrap()
        };
        // The scale computed in the run (rounded by its float16/bfloat16 Mul already), and a
        // constant per column (converted in advance for a float16/bfloat16 Mul).
        for scale in ["s", "cols"] {
            let g = model(scale, Vec::new(), &["y"]);
            let fused = if scale == "s" { vec![3, 4] } else { vec![] };
            for p in [Precision::Float16, Precision::BFloat16] {
                // A float16/bfloat16 Mul rounds the Cast's values and the scale, then its
                // product: fused with the same bits.
                let all = prepared(&g, vec![p; 5]);
                assert_eq!(fused_is_alone(&g, Some(&all)), fused, "{scale} {p:?}");
                // Float32 among float16/bfloat16 layers.
                let mut layers = vec![p; 5];
                layers[3] = Precision::Float32;
                layers[4] = Precision::Float32;
                let plan = prepared(&g, layers);
                assert_eq!(fused_is_alone(&g, Some(&plan)), vec![3, 4], "{scale} {p:?}");
                // Only the Mul reduced.
                let mut layers = vec![Precision::Float32; 5];
                layers[4] = p;
                let plan = prepared(&g, layers);
                assert_eq!(fused_is_alone(&g, Some(&plan)), fused, "{scale} {p:?}");
            }
        }
        // An int8 or fp8 plan: the Cast and the Mul have no quantized kernel and compute in
        // float32 (their inputs as stored), so they fuse as under no plan.
        for scale in ["s", "cols"] {
            let g = model(scale, Vec::new(), &["y"]);
            for p in [Precision::Int8, Precision::Fp8E4M3] {
                let all = prepared(&g, vec![p; 5]);
                assert_eq!(fused_is_alone(&g, Some(&all)), vec![3, 4], "{scale} {p:?}");
            }
        }
        // A bfloat16 product stays finite here (float16's overflows: its bits are checked
        // too, above), and the Cast's values are not all on bfloat16's grid: the rounding
        // before the product shows.
        let g = model("s", Vec::new(), &["y"]);
        let plan = prepared(&g, vec![Precision::BFloat16; 5]);
        let r = Interpreter::new(&g)
            .unwrap()
            .run_plan(&feeds(), &RunOptions::default(), &plan)
            .unwrap();
        assert!(r.outputs[0]
            .1
            .as_f32()
            .unwrap()
            .iter()
            .all(|v| v.is_finite()));
    }

    /// GELU's tanh form ([`crate::exec::epilogue::tests::gelu_tanh_nodes`], steps 5–12) after
    /// the scaled product of [`model`] (its "y", of both signs and made small by a small
    /// weight scale), the last writing "g"; `exponent` the Pow's.
    fn gelu_tanh_after(exponent: Tensor) -> Graph {
        let (extra, constants) = crate::exec::epilogue::tests::gelu_tanh_nodes("y", "g");
        let mut g = model("s", extra, &["g"]);
        for (name, t) in constants {
            g.initializers.insert(name.into(), t);
        }
        g.initializers.insert("three".into(), exponent);
        g.initializers
            .insert("ws".into(), Tensor::from_f32(vec![], vec![1e-4]));
        // B's codes centred on 200: products of both signs.
        g.initializers.insert(
            "wz".into(),
            Tensor::from_parts(vec![], TensorData::U8(vec![200].into())),
        );
        g
    }

    #[test]
    fn the_pointwise_chain_after_a_scaled_product_runs_in_its_kernel() {
        let g = gelu_tanh_after(Tensor::from_f32(vec![], vec![3.0]));
        let interp = Interpreter::new(&g).unwrap();
        let chain = interp.chains[2].as_ref().expect("a chain after the Mul");
        assert_eq!(chain.head, 4);
        assert_eq!(
            chain.steps().collect::<Vec<_>>(),
            (5..13).collect::<Vec<_>>()
        );
        // The values span GELU's curve, not only its linear ends.
        let r = interp.run(&feeds()).unwrap();
        let g_out = r.outputs[0].1.as_f32().unwrap();
        assert!(g_out.iter().any(|&v| v < -0.05) && g_out.iter().any(|&v| v > 0.5));
        let fused: Vec<usize> = (3..13).collect();
        assert_eq!(fused_is_alone(&g, None), fused);
        let prepared = |layers: Vec<Precision>| {
            PreparedPlan::new(
                &g,
                &PrecisionPlan::from_layers(layers),
                &PlanOptions::default(),
            )
            .unwrap()
        };
        let n = g.nodes.len();
        for p in [Precision::Float16, Precision::BFloat16, Precision::Int8] {
            assert_eq!(
                fused_is_alone(&g, Some(&prepared(vec![p; n]))),
                fused,
                "{p:?}"
            );
        }
        // Layers of the chain in other precisions than the scaled Mul's: the same bits.
        let choices = [Precision::Float32, Precision::Float16, Precision::BFloat16];
        let mut rng = crate::data::loader::Mt19937::new(3);
        for _ in 0..12 {
            let layers: Vec<Precision> = (0..n)
                .map(|_| choices[(rng.random_sample() * 3.0) as usize % 3])
                .collect();
            fused_is_alone(&g, Some(&prepared(layers)));
        }
        // A scale that broadcasts the output: no scaled product, no chain; an exponent of
        // another type (computed in f64 by Pow's kernel): no stage, the layers run alone.
        let mut g = gelu_tanh_after(Tensor::from_f32(vec![], vec![3.0]));
        g.nodes[4] = node("rescale", "Mul", &["rows", "accf"], &["y"]);
        assert_eq!(fused_is_alone(&g, None), Vec::<usize>::new());
        let g = gelu_tanh_after(Tensor::from_i64(vec![], vec![3]));
        assert_eq!(fused_is_alone(&g, None), vec![3, 4]);
    }

    /// A residual Add of a value computed before the product (the Flan-T5 encoder's `wo`
    /// projection plus its block's input) after the scaled Mul: read at each row's own place.
    #[test]
    fn a_residual_add_after_a_scaled_product_reads_its_operand_in_place() {
        let add = node("residual", "Add", &["r", "y"], &["out"]);
        let mut g = model("s", vec![add], &["out"]);
        g.inputs.push(crate::graph::testing::vi("r", &[2, 5, N]));
        let interp = Interpreter::new(&g).unwrap();
        let mut feeds = feeds();
        let r: Vec<f32> = (0..10 * N).map(|i| (i as f32 * 0.37).sin() * 1e5).collect();
        feeds.insert("r".into(), Tensor::from_f32(vec![2, 5, N], r));
        let (fused, times) = interp.run_profiled(&feeds, None).unwrap();
        let t = times.iter().find(|t| t.node == 2).unwrap();
        assert_eq!(t.fused, vec![3, 4, 5]);
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let alone = interp.run_with(&feeds, &keep).unwrap();
        assert_eq!(bits(&fused.outputs[0].1), bits(&alone.outputs[0].1));
        // An operand of another shape (broadcast over the rows): the Add runs on its own.
        let mut g = g;
        g.inputs[1] = crate::graph::testing::vi("r", &[N]);
        let interp = Interpreter::new(&g).unwrap();
        feeds.insert("r".into(), Tensor::from_f32(vec![N], vec![0.5; N]));
        let (fused, times) = interp.run_profiled(&feeds, None).unwrap();
        let t = times.iter().find(|t| t.node == 2).unwrap();
        assert_eq!(t.fused, vec![3, 4]);
        let alone = interp.run_with(&feeds, &keep).unwrap();
        assert_eq!(bits(&fused.outputs[0].1), bits(&alone.outputs[0].1));
    }
}
