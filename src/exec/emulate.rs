//! Reduced-precision emulation: how a layer runs under a [`PrecisionPlan`] (docs/numerics.md).
//!
//! A float16/bfloat16 layer sees its float inputs and weights rounded to its type, computes in
//! f32 (the accumulator; `--accumulate f16` switches matmul/conv to an f16 running sum) and
//! rounds its float outputs to its type. For + − × ÷ √ this is bit-identical to native
//! arithmetic in the type, since f32 carries more than twice the bits of f16/bf16. An
//! int8/fp8 layer quantizes its activation operands per tensor (calibrated scale) and its
//! weights per output channel, and computes on the dequantized values. Data-movement layers
//! run untouched: they carry whatever precision their input has.
//!
//! Weights are converted once, when the plan is prepared, not on every run.

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::ops::is_data_movement;
use crate::precision::quant::{
    channel_scales, fake_quant, fake_quant_channels, is_quantized_operand, scale_from_amax,
    weight_channel_axis,
};
use crate::precision::{
    input_follows_layer_precision, plan::PrecisionPlan, round_slice, Accumulator, Precision,
};
use crate::tensor::{DType, Tensor};
use std::collections::BTreeMap;

/// What happens to one input of a layer before its kernel runs.
#[derive(Clone, Debug)]
pub(crate) enum InputPrep {
    /// Passed as is.
    Keep,
    /// An f32 activation rounded to a float type.
    Round(Precision),
    /// An f32 activation quantized per tensor with this scale, then dequantized.
    Quantize { scale: f32, precision: Precision },
    /// A weight converted in advance (shared: plans composed from other plans reuse it).
    Converted(std::sync::Arc<Tensor>),
}

/// One layer's treatment.
#[derive(Clone, Debug)]
pub(crate) struct LayerPrep {
    /// None for data-movement layers, which run untouched.
    pub precision: Option<Precision>,
    pub inputs: Vec<InputPrep>,
    /// For a node with subgraphs: the plan of each (in [`Node::subgraphs`] order), every
    /// layer in the node's precision (float32 when that is int8/fp8: no subgraph op has a
    /// quantized kernel of its own) unless the plan sets it by path.
    ///
    /// [`Node::subgraphs`]: crate::graph::Node::subgraphs
    pub subplans: Vec<PreparedPlan>,
}

/// Options of a plan that are not per layer.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions<'a> {
    pub accumulate: Accumulator,
    /// Activation ranges (absolute max per tensor name) for int8/fp8 layers.
    pub amax: Option<&'a BTreeMap<String, f32>>,
}

/// A precision plan made ready to run on one graph.
#[derive(Clone, Debug)]
pub struct PreparedPlan {
    pub(crate) layers: Vec<LayerPrep>,
    pub(crate) accumulate: Accumulator,
    pub plan: PrecisionPlan,
}

impl PreparedPlan {
    /// Prepares `plan` for `graph`: converts weights, looks up activation scales. Fails when an
    /// int8/fp8 layer has an activation operand without a calibrated range.
    pub fn new(graph: &Graph, plan: &PrecisionPlan, opts: &PlanOptions) -> Result<PreparedPlan> {
        if plan.layers.len() != graph.nodes.len() {
            return Err(Error::Invalid(format!(
                "the precision plan has {} layers, the graph {}",
                plan.layers.len(),
                graph.nodes.len()
            )));
        }
        let mut layers = Vec::with_capacity(graph.nodes.len());
        for (node, &p) in graph.nodes.iter().zip(&plan.layers) {
            let body = if p.is_scaled() { Precision::Float32 } else { p };
            let subplans = node
                .subgraphs()
                .map(|(attr, g)| {
                    let sub = plan.subgraph_plan(node, attr, g, body);
                    // Nodes inside subgraphs are named by path.
                    PreparedPlan::new(g, &sub, opts).map_err(|e| e.in_subgraph(&node.name, attr))
                })
                .collect::<Result<Vec<_>>>()?;
            // Data movement and folded weight nodes run untouched (their weights are
            // converted where a layer reads them).
            let untouched = is_data_movement(&node.op_type) || graph.is_folded(node);
            if untouched || p == Precision::Float32 {
                layers.push(LayerPrep {
                    precision: (!untouched).then_some(p),
                    inputs: vec![InputPrep::Keep; node.inputs.len()],
                    subplans,
                });
                continue;
            }
            let mut inputs = Vec::with_capacity(node.inputs.len());
            for (idx, name) in node.inputs.iter().enumerate() {
                // Initializers and folded values (a Transpose or DequantizeLinear of an
                // initializer) are weights, converted here once.
                let init = graph.weight(name);
                let prep = if name.is_empty() || !input_follows_layer_precision(&node.op_type, idx)
                {
                    InputPrep::Keep
                } else if p.is_scaled() {
                    if !is_quantized_operand(&node.op_type, idx) {
                        // Biases stay in f32, added after dequantization.
                        InputPrep::Keep
                    } else if let Some(w) = init.filter(|w| is_float_storage(w.dtype())) {
                        let axis =
                            weight_channel_axis(node, idx, w.rank()).ok_or_else(|| Error::Op {
                                node: node.name.clone(),
                                op: node.op_type.clone(),
                                msg: format!(
                                    "weight '{name}' of rank {} cannot be quantized per channel",
                                    w.rank()
                                ),
                            })?;
                        let q = through_f32(w, |v| {
                            let scales = channel_scales(v, w.shape(), axis, p);
                            fake_quant_channels(v, w.shape(), axis, &scales, p);
                        })
                        .expect("float weight");
                        InputPrep::Converted(std::sync::Arc::new(q))
                    } else if init.is_some() {
                        InputPrep::Keep
                    } else {
                        let amax = opts.amax.and_then(|m| m.get(name)).ok_or_else(|| Error::Op {
                            node: node.name.clone(),
                            op: node.op_type.clone(),
                            msg: format!(
                                "runs in {p} but tensor '{name}' has no calibrated range (pass --calibration-cache, or let mixprec calibrate)"
                            ),
                        })?;
                        InputPrep::Quantize {
                            scale: scale_from_amax(*amax, p),
                            precision: p,
                        }
                    }
                } else if let Some(w) = init {
                    match through_f32(w, |v| round_slice(p, v)) {
                        Some(r) if !already_in(w.dtype(), p) => {
                            InputPrep::Converted(std::sync::Arc::new(r))
                        }
                        _ => InputPrep::Keep,
                    }
                } else {
                    InputPrep::Round(p)
                };
                inputs.push(prep);
            }
            layers.push(LayerPrep {
                precision: Some(p),
                inputs,
                subplans,
            });
        }
        Ok(PreparedPlan {
            layers,
            accumulate: opts.accumulate,
            plan: plan.clone(),
        })
    }

    /// This plan with the layers `take` treated as in `other` (a plan for the same graph):
    /// composing prepared plans reuses their converted weights instead of converting again,
    /// which is what a precision search does for every candidate.
    pub fn with_layers_of(&self, other: &PreparedPlan, take: &[usize]) -> Result<PreparedPlan> {
        if other.layers.len() != self.layers.len() || other.accumulate != self.accumulate {
            return Err(Error::Invalid(
                "composed plans must be prepared for the same graph and accumulator".into(),
            ));
        }
        let mut out = self.clone();
        for &i in take {
            let (Some(l), Some(&p)) = (other.layers.get(i), other.plan.layers.get(i)) else {
                return Err(Error::Invalid(format!("layer {i} is not in the plan")));
            };
            out.layers[i] = l.clone();
            out.plan.layers[i] = p;
        }
        Ok(out)
    }

    /// The precision layer `i` computes in (None: data movement, carries its input's).
    pub fn layer_precision(&self, i: usize) -> Option<Precision> {
        self.layers.get(i).and_then(|l| l.precision)
    }
}

/// The activation tensors whose calibrated ranges a plan needs: non-initializer operands of
/// its int8/fp8 layers, in graph order, each once.
pub fn required_ranges(graph: &Graph, plan: &PrecisionPlan) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (node, p) in graph.nodes.iter().zip(&plan.layers) {
        if !p.is_scaled() || is_data_movement(&node.op_type) || graph.is_folded(node) {
            continue;
        }
        for (idx, name) in node.inputs.iter().enumerate() {
            if !name.is_empty()
                && is_quantized_operand(&node.op_type, idx)
                && graph.weight(name).is_none()
                && !out.contains(name)
            {
                out.push(name.clone());
            }
        }
    }
    out
}

/// Applies an activation treatment; None means "use the original tensor" (also for
/// `Converted`, which the caller takes from the plan by reference).
pub(crate) fn prepare_input(prep: &InputPrep, t: &Tensor) -> Option<Tensor> {
    match prep {
        InputPrep::Keep | InputPrep::Converted(_) => None,
        InputPrep::Round(p) if already_in(t.dtype(), *p) => None,
        InputPrep::Round(p) => through_f32(t, |v| round_slice(*p, v)),
        InputPrep::Quantize { scale, precision } => {
            through_f32(t, |v| fake_quant(v, *scale, *precision))
        }
    }
}

/// Float types a model stores tensors in, which a plan rounds or quantizes.
fn is_float_storage(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// A tensor stored in `d` already holds values of precision `p` (a float16 model under a
/// float16 plan): rounding it again changes nothing.
fn already_in(d: DType, p: Precision) -> bool {
    matches!(
        (d, p),
        (DType::F16, Precision::Float16) | (DType::BF16, Precision::BFloat16)
    )
}

/// Applies `f` to a float tensor's values in f32 and stores the result back in the tensor's
/// own type (f32 as is; float16/bfloat16 rounded to nearest even, as a Cast back would). A
/// float16 model under an int8 or bfloat16 plan is quantized or rounded this way, exactly as
/// its exported Q/DQ or Cast pairs compute. None for other dtypes.
pub(crate) fn through_f32(t: &Tensor, f: impl FnOnce(&mut [f32])) -> Option<Tensor> {
    match t.dtype() {
        DType::F32 => {
            let mut c = t.clone();
            f(c.as_f32_mut()?);
            Some(c)
        }
        DType::F16 | DType::BF16 => {
            let mut v = t.to_f32_vec()?;
            f(&mut v);
            let f32t = Tensor::from_f32(t.shape().to_vec(), v);
            Some(crate::ops::cast::cast_tensor(&f32t, t.dtype()))
        }
        _ => None,
    }
}

/// Rounds a float layer's f32 outputs to its precision (quantized layers output f32).
pub(crate) fn round_outputs(p: Precision, outs: &mut [Tensor]) {
    if p == Precision::Float32 || p.is_scaled() {
        return;
    }
    for t in outs {
        if let Some(v) = t.as_f32_mut() {
            round_slice(p, v);
        } else if matches!(t.dtype(), DType::F16 | DType::BF16) && !already_in(t.dtype(), p) {
            if let Some(r) = through_f32(t, |v| round_slice(p, v)) {
                *t = r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Feeds, Interpreter, RunOptions};
    use crate::graph::testing::{node, vi};
    use crate::graph::{Node, ValueInfo};
    use half::{bf16, f16};
    use std::collections::BTreeMap;

    fn graph(
        nodes: Vec<Node>,
        inputs: Vec<ValueInfo>,
        out: ValueInfo,
        inits: Vec<(&str, Tensor)>,
    ) -> Graph {
        crate::graph::testing::graph(nodes, inputs, vec![out], inits)
    }

    fn run(g: &Graph, plan: Vec<Precision>, opts: &PlanOptions, feeds: Feeds) -> Result<Vec<f32>> {
        let plan = PreparedPlan::new(g, &PrecisionPlan::from_layers(plan), opts)?;
        let r = Interpreter::new(g)?.run_plan(&feeds, &RunOptions::default(), &plan)?;
        Ok(r.outputs[0].1.as_f32().unwrap().to_vec())
    }

    /// Pseudo-random values spread over many binades (deterministic).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut rng = crate::data::loader::Mt19937::new(seed);
        (0..n)
            .map(|_| {
                let m = rng.random_sample() * 2.0 - 1.0;
                let e = (rng.random_sample() * 16.0 - 8.0).floor();
                (m * 2f64.powf(e)) as f32
            })
            .collect()
    }

    #[test]
    fn float16_and_bfloat16_arithmetic_is_bit_exact() {
        // Reference: round(a op b) with a, b already in the type, computed exactly in f64.
        let n = 4096;
        let (a, b) = (values(n, 1), values(n, 2));
        for (op, f) in [
            ("Add", (|x, y| x + y) as fn(f64, f64) -> f64),
            ("Sub", |x, y| x - y),
            ("Mul", |x, y| x * y),
            ("Div", |x, y| x / y),
        ] {
            let g = graph(
                vec![node("op", op, &["a", "b"], &["y"])],
                vec![vi("a", &[n]), vi("b", &[n])],
                vi("y", &[n]),
                vec![],
            );
            let mut feeds = Feeds::new();
            feeds.insert("a".into(), Tensor::from_f32(vec![n], a.clone()));
            feeds.insert("b".into(), Tensor::from_f32(vec![n], b.clone()));
            let got16 = run(
                &g,
                vec![Precision::Float16],
                &PlanOptions::default(),
                feeds.clone(),
            )
            .unwrap();
            let gotbf = run(
                &g,
                vec![Precision::BFloat16],
                &PlanOptions::default(),
                feeds,
            )
            .unwrap();
            for i in 0..n {
                let (x, y) = (f16::from_f32(a[i]).to_f64(), f16::from_f32(b[i]).to_f64());
                let want = f16::from_f64(f(x, y)).to_f32();
                assert!(
                    want.to_bits() == got16[i].to_bits() || (want.is_nan() && got16[i].is_nan()),
                    "{op} f16 {x} {y}: {want} vs {}",
                    got16[i]
                );
                let (x, y) = (bf16::from_f32(a[i]).to_f64(), bf16::from_f32(b[i]).to_f64());
                let want = bf16::from_f64(f(x, y)).to_f32();
                assert!(
                    want.to_bits() == gotbf[i].to_bits() || (want.is_nan() && gotbf[i].is_nan()),
                    "{op} bf16 {x} {y}: {want} vs {}",
                    gotbf[i]
                );
            }
        }
    }

    fn ones_matmul(k: usize) -> Graph {
        graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![vi("x", &[1, k])],
            vi("y", &[1, 1]),
            vec![("w", Tensor::from_f32(vec![k, 1], vec![1.0; k]))],
        )
    }

    #[test]
    fn f16_accumulator_stagnates_where_f32_does_not() {
        // 4096 ones: an f16 running sum stops at 2048 (2048 + 1 ties to even), f32 reaches 4096.
        let k = 4096;
        let g = ones_matmul(k);
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![1, k], vec![1.0; k]));
        let f32acc = run(
            &g,
            vec![Precision::Float16],
            &PlanOptions::default(),
            feeds.clone(),
        )
        .unwrap();
        assert_eq!(f32acc, vec![4096.0]);
        let opts = PlanOptions {
            accumulate: Accumulator::F16,
            amax: None,
        };
        let f16acc = run(&g, vec![Precision::Float16], &opts, feeds).unwrap();
        assert_eq!(f16acc, vec![2048.0]);
    }

    #[test]
    fn f16_accumulation_applies_to_reductions() {
        let k = 4096;
        let mut sum = node("sum", "ReduceSum", &["x"], &["y"]);
        sum.attrs
            .insert("keepdims".into(), crate::graph::Attribute::Int(0));
        let g = graph(vec![sum], vec![vi("x", &[k])], vi("y", &[]), vec![]);
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![k], vec![1.0; k]));
        let opts = PlanOptions {
            accumulate: Accumulator::F16,
            amax: None,
        };
        let got = run(&g, vec![Precision::Float16], &opts, feeds.clone()).unwrap();
        assert_eq!(got, vec![2048.0]);
        let got = run(&g, vec![Precision::Float16], &PlanOptions::default(), feeds).unwrap();
        assert_eq!(got, vec![4096.0]);
    }

    #[test]
    fn int8_matmul_quantizes_activations_per_tensor_and_weights_per_channel() {
        let w = Tensor::from_f32(vec![2, 2], vec![0.5, -1.0, 0.25, 2.0]);
        let g = graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![vi("x", &[1, 2])],
            vi("y", &[1, 2]),
            vec![("w", w)],
        );
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![1, 2], vec![0.3, -0.7]));
        let mut amax = BTreeMap::new();
        amax.insert("x".to_string(), 1.0f32);
        let opts = PlanOptions {
            accumulate: Accumulator::F32,
            amax: Some(&amax),
        };
        let got = run(&g, vec![Precision::Int8], &opts, feeds.clone()).unwrap();
        // By hand: s_x = 1/127; column scales 0.5/127 and 2/127.
        let q = |v: f32, s: f32| crate::precision::round_half_even(v / s).clamp(-128.0, 127.0) * s;
        let (sx, s0, s1) = (1.0 / 127.0, 0.5 / 127.0, 2.0 / 127.0);
        let (x0, x1) = (q(0.3, sx), q(-0.7, sx));
        let want = [
            x0 * q(0.5, s0) + x1 * q(0.25, s0),
            x0 * q(-1.0, s1) + x1 * q(2.0, s1),
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-6, "{got:?} vs {want:?}");
        }
        // Without a range for x the plan cannot be prepared, and the error names the tensor.
        let e = run(&g, vec![Precision::Int8], &PlanOptions::default(), feeds).unwrap_err();
        assert!(e.to_string().contains("'x'"), "{e}");
    }

    #[test]
    fn subgraphs_run_in_the_precision_of_their_node() {
        // Both branches compute (x + d) - x, reading x and d = 2^-12 from the main graph. In
        // float16 and bfloat16, 1 + 2^-12 rounds to 1 and the branch returns 0; a float32 body
        // returns 2^-12, a float16 value, so rounding the If's output alone would keep it.
        let branch = graph(
            vec![
                node("add", "Add", &["x", "d"], &["s"]),
                node("sub", "Sub", &["s", "x"], &["t"]),
            ],
            vec![],
            vi("t", &[1]),
            vec![],
        );
        let mut iff = node("if", "If", &["c"], &["y"]);
        for b in ["then_branch", "else_branch"] {
            iff.attrs.insert(
                b.into(),
                crate::graph::Attribute::Graph(std::sync::Arc::new(branch.clone())),
            );
        }
        let c = ValueInfo {
            name: "c".into(),
            dtype: Some(DType::Bool),
            shape: Some(vec![]),
        };
        let d = 2f32.powi(-12);
        let g = graph(
            vec![iff],
            vec![c, vi("x", &[1])],
            vi("y", &[1]),
            vec![("d", Tensor::from_f32(vec![1], vec![d]))],
        );
        let mut feeds = Feeds::new();
        feeds.insert("c".into(), Tensor::from_bool(vec![], vec![true]));
        feeds.insert("x".into(), Tensor::from_f32(vec![1], vec![1.0]));
        let opts = PlanOptions::default();
        for (p, want) in [
            (Precision::Float32, d),
            (Precision::Float16, 0.0),
            (Precision::BFloat16, 0.0),
            // No subgraph op has a quantized kernel: the body runs in float32.
            (Precision::Int8, d),
        ] {
            let got = run(&g, vec![p], &opts, feeds.clone()).unwrap();
            assert_eq!(got, vec![want], "{p}");
        }
        // Nodes inside a float16 If set by path: both in float32 keep 2^-12; the Add alone in
        // float16 loses it (1 + 2^-12 rounds to 1 before the float32 Sub).
        let interp = Interpreter::new(&g).unwrap();
        for (inner, want) in [
            (vec!["if/then_branch/add", "if/then_branch/sub"], d),
            (vec!["if/then_branch/sub"], 0.0),
            (vec!["if/else_branch/add", "if/else_branch/sub"], 0.0),
        ] {
            let mut plan = PrecisionPlan::from_layers(vec![Precision::Float16]);
            for path in &inner {
                plan.inner.insert(path.to_string(), Precision::Float32);
            }
            let prepared = PreparedPlan::new(&g, &plan, &opts).unwrap();
            let r = interp
                .run_plan(&feeds, &RunOptions::default(), &prepared)
                .unwrap();
            assert_eq!(r.outputs[0].1.as_f32().unwrap(), &[want], "{inner:?}");
        }
    }

    #[test]
    fn data_movement_carries_the_rounded_values() {
        // Relu (fp16) -> Reshape -> Relu (fp32): the fp32 Relu sees fp16-rounded values.
        let g = graph(
            vec![
                node("r1", "Relu", &["x"], &["a"]),
                node("reshape", "Reshape", &["a", "shape"], &["b"]),
                node("r2", "Relu", &["b"], &["y"]),
            ],
            vec![vi("x", &[2])],
            vi("y", &[2, 1]),
            vec![("shape", Tensor::from_i64(vec![2], vec![2, 1]))],
        );
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![2], vec![1.0001, 70000.0]));
        let got = run(
            &g,
            vec![Precision::Float16, Precision::Float32, Precision::Float32],
            &PlanOptions::default(),
            feeds,
        )
        .unwrap();
        assert_eq!(got[0], 1.0);
        assert!(got[1].is_infinite(), "70000 overflows fp16 to inf");
    }

    /// A model stored in float16: a bfloat16 plan rounds its weights and activations to
    /// bfloat16 (stored back in float16), an int8 plan quantizes them; a float16 plan leaves
    /// them alone. Without this, a float16 model would run unchanged under every plan.
    #[test]
    fn float16_stored_models_are_rounded_and_quantized() {
        let f16v = |v: &[f32]| {
            crate::ops::cast::cast_tensor(
                &Tensor::from_f32(vec![1, v.len()], v.to_vec()),
                DType::F16,
            )
        };
        let xs = [1.0039062f32, 0.3339844, -2.0078125, 0.7];
        let ws = [0.1000977f32, 1.0009766, 0.3330078, -0.25];
        let w =
            crate::ops::cast::cast_tensor(&Tensor::from_f32(vec![4, 1], ws.to_vec()), DType::F16);
        let g = graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![ValueInfo {
                name: "x".into(),
                dtype: Some(DType::F16),
                shape: None,
            }],
            vi("y", &[1, 1]),
            vec![("w", w)],
        );
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), f16v(&xs));
        let out = |plan: Precision, amax: Option<&BTreeMap<String, f32>>| -> f32 {
            let plan = PreparedPlan::new(
                &g,
                &PrecisionPlan::from_layers(vec![plan]),
                &PlanOptions {
                    amax,
                    ..Default::default()
                },
            )
            .unwrap();
            let r = Interpreter::new(&g)
                .unwrap()
                .run_plan(&feeds, &RunOptions::default(), &plan)
                .unwrap();
            assert_eq!(
                r.outputs[0].1.dtype(),
                DType::F16,
                "the model's type is kept"
            );
            r.outputs[0].1.to_f32_vec().unwrap()[0]
        };
        let x16: Vec<f32> = xs.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        let w16: Vec<f32> = ws.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        // float16 plan: the stored values as they are.
        let plain = f16::from_f32(dot(&x16, &w16)).to_f32();
        assert_eq!(out(Precision::Float16, None), plain);
        // bfloat16 plan: inputs rounded to bfloat16, output rounded to bfloat16, stored in f16.
        let xb: Vec<f32> = x16.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        let wb: Vec<f32> = w16.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        let want = f16::from_f32(bf16::from_f32(dot(&xb, &wb)).to_f32()).to_f32();
        let got = out(Precision::BFloat16, None);
        assert_eq!(got, want);
        assert_ne!(got, plain, "bfloat16 must change this product");
        // int8 plan: activation per tensor (amax 2.5), weight per output channel.
        let mut amax = BTreeMap::new();
        amax.insert("x".to_string(), 2.5f32);
        let sx = 2.5 / 127.0;
        let wmax = w16.iter().fold(0f32, |m, v| m.max(v.abs()));
        let sw = wmax / 127.0;
        let q = |v: f32, s: f32| ((v / s).round_ties_even().clamp(-128.0, 127.0)) * s;
        let xq: Vec<f32> = x16
            .iter()
            .map(|&v| f16::from_f32(q(v, sx)).to_f32())
            .collect();
        let wq: Vec<f32> = w16
            .iter()
            .map(|&v| f16::from_f32(q(v, sw)).to_f32())
            .collect();
        let want = f16::from_f32(dot(&xq, &wq)).to_f32();
        let got = out(Precision::Int8, Some(&amax));
        assert_eq!(got, want);
        assert_ne!(got, plain, "int8 must change this product");
    }
}
