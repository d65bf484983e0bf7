//! Weight folding: the weight-only subgraphs of a graph are evaluated once, at load.
//!
//! A node of a [`FOLDABLE`] op (Constant, Identity, Cast, Transpose, Reshape, Unsqueeze,
//! Squeeze, Flatten, DequantizeLinear, Slice, Concat — the last two re-order an LSTM's gate
//! weights in Silero's exports) whose inputs are all initializers or values folded
//! before it has its outputs computed here and stored in [`Graph::folded`]. A value there is a
//! *weight* like an initializer: precision plans convert or quantize it once when they are
//! prepared (per channel for int8/fp8), calibration needs no range for it, inspect counts it as
//! parameters.
//!
//! The folding nodes stay in [`Graph::nodes`], so layer indices (plans, `--layer-precisions`,
//! search output, golden files) are the same with or without folding, and export keeps them
//! as they are (a Q/DQ model stays a Q/DQ model). They are no layers of their own: they run
//! untouched under every plan (like data movement) and are never search candidates.
//!
//! A node whose kernel rejects its constant inputs is simply not folded: it stays an ordinary
//! node, and running it reports the error with its name.

use crate::graph::{Attribute, Graph, Node, Origin};
use crate::ops::{OpCtx, Registry};
use crate::tensor::Tensor;
use std::sync::Arc;

/// The ops whose weight-only instances are folded.
pub const FOLDABLE: &[&str] = &[
    "Constant",
    "Identity",
    "Cast",
    "Transpose",
    "Reshape",
    "Unsqueeze",
    "Squeeze",
    "Flatten",
    "DequantizeLinear",
    "Slice",
    "Concat",
];

fn foldable_op(node: &Node) -> bool {
    (node.domain.is_empty() || node.domain == "ai.onnx")
        && FOLDABLE.contains(&node.op_type.as_str())
        && !node.has_subgraphs()
}

/// Fills `graph.folded` (see the module docs), and that of every subgraph inside it: a
/// subgraph's node folds over its own weights and those of the graphs enclosing it (Silero's
/// exports slice an LSTM's gate weights, initializers of the main graph, inside an If branch).
pub fn fold_weights(graph: &mut Graph) {
    fold_in(graph, &[]);
}

/// Folds `graph`, whose enclosing graphs are `enclosing` (outermost first), then its subgraphs.
fn fold_in(graph: &mut Graph, enclosing: &[&Graph]) {
    let registry = Registry::global();
    let mut folded = std::mem::take(&mut graph.folded);
    folded.clear();
    // What this graph reads from enclosing graphs; anything else it defines itself.
    let values = graph.values();
    let outer = |name: &str| {
        values
            .id(name)
            .is_some_and(|id| values.origin(id) == Origin::Outer)
    };
    for node in &graph.nodes {
        if !foldable_op(node) || node.outputs.iter().all(|o| o.is_empty()) {
            continue;
        }
        let Some(def) = registry.def(&node.domain, &node.op_type) else {
            continue;
        };
        let outs = {
            let args: Option<Vec<Option<&Tensor>>> = node
                .inputs
                .iter()
                .map(|n| {
                    if n.is_empty() {
                        Some(None)
                    } else if outer(n) {
                        crate::graph::enclosing_weight(enclosing, n).map(Some)
                    } else {
                        graph
                            .initializers
                            .get(n)
                            .or_else(|| folded.get(n))
                            .map(Some)
                    }
                })
                .collect();
            let Some(args) = args else { continue };
            let ctx = OpCtx::new(node, graph.opset_of(&node.domain));
            match (def.kernel)(&ctx, &args) {
                Ok(outs) => outs,
                Err(_) => continue,
            }
        };
        for (o, t) in node.outputs.iter().zip(outs) {
            if !o.is_empty() {
                folded.insert(o.clone(), t);
            }
        }
    }
    graph.folded = folded;
    for i in 0..graph.nodes.len() {
        if !graph.nodes[i].has_subgraphs() {
            continue;
        }
        // Each subgraph is taken out of its node while it folds, so this graph can be read
        // as one of its enclosing graphs meanwhile.
        let attrs = std::mem::take(&mut graph.nodes[i].attrs);
        let mut subs: Vec<(String, Attribute)> = Vec::new();
        let mut rest = std::collections::BTreeMap::new();
        for (k, a) in attrs {
            match a {
                Attribute::Graph(_) | Attribute::Graphs(_) => subs.push((k, a)),
                other => {
                    rest.insert(k, other);
                }
            }
        }
        {
            let mut scope: Vec<&Graph> = enclosing.to_vec();
            scope.push(graph);
            for (_, a) in &mut subs {
                match a {
                    Attribute::Graph(g) => fold_in(Arc::make_mut(g), &scope),
                    Attribute::Graphs(gs) => {
                        for g in gs {
                            fold_in(Arc::make_mut(g), &scope);
                        }
                    }
                    _ => {}
                }
            }
        }
        rest.extend(subs);
        graph.nodes[i].attrs = rest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::{graph, node, vi};

    #[test]
    fn folds_chains_of_weight_only_nodes_and_nothing_else() {
        let mut t = node("t", "Transpose", &["w"], &["wt"]);
        t.attrs.insert("perm".into(), Attribute::Ints(vec![1, 0]));
        let mut g = graph(
            vec![
                t,
                node("id", "Identity", &["wt"], &["wt2"]),
                node("mm", "MatMul", &["x", "wt2"], &["y"]),
                node("act", "Identity", &["y"], &["z"]),
            ],
            vec![vi("x", &[1, 3])],
            vec![vi("z", &[1, 2])],
            vec![(
                "w",
                Tensor::from_f32(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            )],
        );
        fold_weights(&mut g);
        let mut keys: Vec<&str> = g.folded.keys().map(|s| s.as_str()).collect();
        keys.sort();
        assert_eq!(keys, ["wt", "wt2"]);
        assert_eq!(g.folded["wt2"].shape(), &[3, 2]);
        assert_eq!(
            g.folded["wt2"].as_f32().unwrap(),
            &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
        assert!(g.is_folded(&g.nodes[0]) && g.is_folded(&g.nodes[1]));
        assert!(!g.is_folded(&g.nodes[2]) && !g.is_folded(&g.nodes[3]));
        assert_eq!(g.weight("wt2").map(|t| t.len()), Some(6));
        assert!(g.weight("y").is_none());
    }

    /// Silero's re-ordering of gate weights: the halves of `w` swapped by two Slices and a
    /// Concat (`w2`), a Slice of the activation `x` (`x2`) and their MatMul into `out`.
    fn gate_reorder(out: &str) -> Vec<Node> {
        let mut cat = node("cat", "Concat", &["w_hi", "w_lo"], &["w2"]);
        cat.attrs.insert("axis".into(), Attribute::Int(0));
        vec![
            node("lo", "Slice", &["w", "zero", "two"], &["w_lo"]),
            node("hi", "Slice", &["w", "two", "four"], &["w_hi"]),
            cat,
            node("act", "Slice", &["x", "zero", "two"], &["x2"]),
            node("mm", "MatMul", &["x2", "w2"], &[out]),
        ]
    }

    /// Silero's exports re-order an LSTM's gate weights with Slices of the weight and a Concat
    /// of them: weight-only, so folded, with the values the nodes compute; a Slice of an
    /// activation is not.
    #[test]
    fn slices_and_concats_of_weights_are_folded() {
        let i64s = |v: &[i64]| Tensor::from_i64(vec![v.len()], v.to_vec());
        let mut g = graph(
            gate_reorder("y"),
            vec![vi("x", &[4, 4])],
            vec![vi("y", &[2, 2])],
            vec![
                (
                    "w",
                    Tensor::from_f32(vec![4, 2], (0..8).map(|v| v as f32).collect()),
                ),
                ("zero", i64s(&[0])),
                ("two", i64s(&[2])),
                ("four", i64s(&[4])),
            ],
        );
        fold_weights(&mut g);
        let mut keys: Vec<&str> = g.folded.keys().map(|s| s.as_str()).collect();
        keys.sort();
        assert_eq!(keys, ["w2", "w_hi", "w_lo"]);
        assert_eq!(
            g.folded["w2"].as_f32().unwrap(),
            &[4.0, 5.0, 6.0, 7.0, 0.0, 1.0, 2.0, 3.0]
        );
        assert!(!g.is_folded(&g.nodes[3]));
    }

    use crate::exec::emulate::{required_ranges, PlanOptions, PreparedPlan};
    use crate::exec::{Feeds, Interpreter, RunOptions};
    use crate::precision::plan::PrecisionPlan;
    use crate::precision::Precision;
    use crate::tensor::TensorData;

    /// Runs `g` under a uniform `p` plan (ranges for the graph input `x` only) and returns the
    /// output and the prepared plan.
    fn run_uniform(g: &Graph, p: Precision, x: Tensor) -> (Vec<f32>, PreparedPlan) {
        let amax = [("x".to_string(), 3.0f32)].into_iter().collect();
        let opts = PlanOptions {
            amax: Some(&amax),
            ..Default::default()
        };
        let plan = PreparedPlan::new(g, &PrecisionPlan::uniform(g, p), &opts).unwrap();
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), x);
        let r = Interpreter::new(g)
            .unwrap()
            .run_plan(&feeds, &RunOptions::default(), &plan)
            .unwrap();
        (r.outputs[0].1.as_f32().unwrap().to_vec(), plan)
    }

    fn param_count(g: &Graph) -> (Vec<u64>, u64) {
        let facts = crate::infer::infer_graph(
            g,
            &crate::infer::declared_input_facts(g, &Default::default()),
        )
        .unwrap();
        let s = crate::inspect::summarize(g, &facts);
        (s.layers.iter().map(|l| l.params).collect(), s.total_params)
    }

    #[test]
    fn a_transposed_weight_is_quantized_per_channel_once_like_an_initializer() {
        let w: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) * 0.37).collect();
        let x = Tensor::from_f32(vec![2, 4], (0..8).map(|i| i as f32 * 0.3 - 1.1).collect());
        // Through Transpose: w is stored [3, 4] and read as [4, 3].
        let mut t = node("t", "Transpose", &["w"], &["wt"]);
        t.attrs.insert("perm".into(), Attribute::Ints(vec![1, 0]));
        let mut through = graph(
            vec![t, node("mm", "MatMul", &["x", "wt"], &["y"])],
            vec![vi("x", &[2, 4])],
            vec![vi("y", &[2, 3])],
            vec![("w", Tensor::from_f32(vec![3, 4], w.clone()))],
        );
        fold_weights(&mut through);
        // The same weight as a [4, 3] initializer.
        let wt: Vec<f32> = (0..12).map(|i| w[(i % 3) * 4 + i / 3]).collect();
        let direct = graph(
            vec![node("mm", "MatMul", &["x", "wt"], &["y"])],
            vec![vi("x", &[2, 4])],
            vec![vi("y", &[2, 3])],
            vec![("wt", Tensor::from_f32(vec![4, 3], wt))],
        );
        for p in [Precision::Int8, Precision::Fp8E4M3, Precision::Float16] {
            let (a, plan) = run_uniform(&through, p, x.clone());
            let (b, _) = run_uniform(&direct, p, x.clone());
            assert_eq!(a, b, "{p}");
            // Converted when the plan was prepared, not quantized on every run.
            assert!(matches!(
                plan.layers[1].inputs[1],
                crate::exec::emulate::InputPrep::Converted(..)
                    | crate::exec::emulate::InputPrep::RoundedByKernel(_)
            ));
            assert_eq!(plan.layer_precision(0), None);
        }
        // The int8 quantization is per channel: it differs from a per-tensor one.
        let (int8, _) = run_uniform(&through, Precision::Int8, x.clone());
        let (f32_out, _) = run_uniform(&through, Precision::Float32, x.clone());
        assert_ne!(int8, f32_out);
        // No calibrated range is needed for the weight; the Transpose is no candidate.
        let plan = PrecisionPlan::uniform(&through, Precision::Int8);
        assert_eq!(required_ranges(&through, &plan), ["x"]);
        assert_eq!(PrecisionPlan::candidates(&through), [1]);
        // Inspect counts the weight once, at the MatMul.
        assert_eq!(param_count(&through), (vec![0, 12], 12));
    }

    #[test]
    fn a_dequantized_int8_weight_is_a_weight() {
        // Conv weight [2, 1, 1, 2] stored int8 with per-output-channel scales.
        let q: Vec<i8> = vec![127, -64, 30, -127];
        let scales = [0.02f32, 0.5];
        let mut dq = node("dq", "DequantizeLinear", &["wq", "ws", "wz"], &["w"]);
        dq.attrs.insert("axis".into(), Attribute::Int(0));
        let mut through = graph(
            vec![dq, node("conv", "Conv", &["x", "w"], &["y"])],
            vec![vi("x", &[1, 1, 2, 3])],
            vec![vi("y", &[1, 2, 2, 2])],
            vec![
                (
                    "wq",
                    Tensor::from_parts(vec![2, 1, 1, 2], TensorData::I8(q.clone().into())),
                ),
                ("ws", Tensor::from_f32(vec![2], scales.to_vec())),
                (
                    "wz",
                    Tensor::from_parts(vec![2], TensorData::I8(vec![0, 0].into())),
                ),
            ],
        );
        fold_weights(&mut through);
        let wf: Vec<f32> = q
            .iter()
            .enumerate()
            .map(|(i, &v)| v as f32 * scales[i / 2])
            .collect();
        assert_eq!(through.folded["w"].as_f32().unwrap(), &wf[..]);
        let direct = graph(
            vec![node("conv", "Conv", &["x", "w"], &["y"])],
            vec![vi("x", &[1, 1, 2, 3])],
            vec![vi("y", &[1, 2, 2, 2])],
            vec![("w", Tensor::from_f32(vec![2, 1, 1, 2], wf))],
        );
        let x = Tensor::from_f32(vec![1, 1, 2, 3], vec![0.5, -1.0, 2.0, 0.25, 3.0, -2.5]);
        for p in [Precision::Int8, Precision::Fp8E4M3] {
            let (a, plan) = run_uniform(&through, p, x.clone());
            let (b, _) = run_uniform(&direct, p, x.clone());
            assert_eq!(a, b, "{p}");
            assert!(matches!(
                plan.layers[1].inputs[1],
                crate::exec::emulate::InputPrep::Converted(..)
                    | crate::exec::emulate::InputPrep::RoundedByKernel(_)
            ));
        }
        let plan = PrecisionPlan::uniform(&through, Precision::Int8);
        assert_eq!(required_ranges(&through, &plan), ["x"]);
        assert_eq!(PrecisionPlan::candidates(&through), [1]);
        // The int8 weight was not counted before folding (not float); now the Conv has it.
        assert_eq!(param_count(&through), (vec![0, 4], 4));
    }

    /// Silero's decoder slices the main graph's LSTM weights inside an If branch: the branch
    /// folds over the enclosing graph's initializers (a Slice of an outer activation does not
    /// fold), and runs give the bits they gave unfolded — the FP16 plan converts the folded
    /// weight once, as it converts an initializer.
    #[test]
    fn a_subgraph_folds_over_the_weights_of_enclosing_graphs() {
        let i64s = |v: &[i64]| Tensor::from_i64(vec![v.len()], v.to_vec());
        let then_branch = graph(
            gate_reorder("y_then"),
            vec![],
            vec![vi("y_then", &[2, 2])],
            vec![],
        );
        let else_branch = graph(
            vec![node("mm_else", "MatMul", &["x", "w"], &["y_else"])],
            vec![],
            vec![vi("y_else", &[3, 2])],
            vec![],
        );
        let mut cf = node("if", "If", &["cond"], &["y"]);
        cf.attrs.insert(
            "then_branch".into(),
            Attribute::Graph(Arc::new(then_branch)),
        );
        cf.attrs.insert(
            "else_branch".into(),
            Attribute::Graph(Arc::new(else_branch)),
        );
        let cond = crate::graph::ValueInfo {
            name: "cond".into(),
            dtype: Some(crate::tensor::DType::Bool),
            shape: Some(vec![]),
        };
        let w: Vec<f32> = (0..8).map(|v| v as f32 * 0.3337 - 1.1).collect();
        let plain = graph(
            vec![cf],
            vec![cond, vi("x", &[3, 4])],
            vec![vi("y", &[2, 2])],
            vec![
                ("w", Tensor::from_f32(vec![4, 2], w)),
                ("zero", i64s(&[0])),
                ("two", i64s(&[2])),
                ("four", i64s(&[4])),
            ],
        );
        let mut g = plain.clone();
        fold_weights(&mut g);
        assert!(g.folded.is_empty());
        let branch = |g: &Graph| -> Graph {
            g.nodes[0]
                .subgraphs()
                .find(|(a, _)| *a == "then_branch")
                .unwrap()
                .1
                .clone()
        };
        let then_folded = branch(&g);
        let mut keys: Vec<&str> = then_folded.folded.keys().map(|s| s.as_str()).collect();
        keys.sort();
        assert_eq!(keys, ["w2", "w_hi", "w_lo"]);
        assert!(!then_folded.is_folded(&then_folded.nodes[3]));
        assert!(branch(&plain).folded.is_empty());

        let mut feeds = Feeds::new();
        feeds.insert("cond".into(), Tensor::from_bool(vec![], vec![true]));
        feeds.insert(
            "x".into(),
            Tensor::from_f32(vec![3, 4], (0..12).map(|i| i as f32 * 0.71 - 3.3).collect()),
        );
        let run = |g: &Graph, p: Precision| -> (Vec<f32>, PreparedPlan) {
            let plan =
                PreparedPlan::new(g, &PrecisionPlan::uniform(g, p), &Default::default()).unwrap();
            let r = Interpreter::new(g)
                .unwrap()
                .run_plan(&feeds, &RunOptions::default(), &plan)
                .unwrap();
            (r.outputs[0].1.as_f32().unwrap().to_vec(), plan)
        };
        for p in [Precision::Float32, Precision::Float16] {
            let (a, plan) = run(&g, p);
            let (b, plain_plan) = run(&plain, p);
            assert_eq!(a, b, "{p}");
            // Subplans follow the attribute names: else_branch, then_branch.
            let mm_input = |plan: &PreparedPlan| {
                matches!(
                    plan.layers[0].subplans[1].layers[4].inputs[1],
                    crate::exec::emulate::InputPrep::Converted(..)
                        | crate::exec::emulate::InputPrep::RoundedByKernel(_)
                )
            };
            if p == Precision::Float16 {
                assert!(mm_input(&plan) && !mm_input(&plain_plan));
            }
        }
    }

    #[test]
    fn a_node_its_kernel_rejects_is_left_to_run_time() {
        let mut t = node("t", "Transpose", &["w"], &["wt"]);
        t.attrs.insert("perm".into(), Attribute::Ints(vec![0, 0]));
        let mut g = graph(
            vec![t],
            vec![],
            vec![vi("wt", &[2, 3])],
            vec![("w", Tensor::from_f32(vec![2, 3], vec![0.0; 6]))],
        );
        fold_weights(&mut g);
        assert!(g.folded.is_empty());
    }
}
