//! Layer-wise comparison (`--mark-all`, Polygraphy's `--trt-outputs mark all`): every layer's
//! output in the reduced-precision run against the same tensor in the FP32 reference run, in
//! topological order, with the error each layer adds over the error already in its inputs.
//!
//! The growth figure (required absolute tolerance of the layer's output minus the largest
//! required tolerance among its inputs) is what a worst-first search ranks layers by.

use super::{compare_output, Criterion};
use crate::graph::Graph;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use crate::tensor::Tensor;
use serde::Serialize;
use std::collections::HashMap;

/// The comparison of one layer's output.
#[derive(Clone, Debug, Serialize)]
pub struct LayerError {
    pub index: usize,
    pub layer: String,
    pub op: String,
    /// The output compared (the layer's output with the largest error).
    pub output: String,
    /// None for data-movement layers (they carry their input's precision).
    pub precision: Option<Precision>,
    pub required_atol: f64,
    pub required_rtol: f64,
    /// required_atol minus the largest required_atol among the layer's inputs.
    pub growth: f64,
    pub passed: bool,
}

/// Compares every float layer output present in both runs. With `fail_fast`, stops after the
/// first failing layer.
pub fn layerwise(
    graph: &Graph,
    reference: &HashMap<String, Tensor>,
    candidate: &HashMap<String, Tensor>,
    criterion: &Criterion,
    plan: Option<&PrecisionPlan>,
    fail_fast: bool,
) -> Vec<LayerError> {
    // Layer-wise, only the tolerance matters: metrics are for final outputs.
    let criterion = Criterion {
        metrics: Vec::new(),
        ..criterion.clone()
    };
    let mut err_of: HashMap<&str, f64> = HashMap::new();
    let mut rows = Vec::new();
    for (index, node) in graph.nodes.iter().enumerate() {
        let mut best: Option<(String, f64, f64, bool)> = None;
        for out in node.outputs.iter().filter(|o| !o.is_empty()) {
            let (Some(r), Some(c)) = (reference.get(out), candidate.get(out)) else {
                continue;
            };
            if !r.dtype().is_float() || r.shape() != c.shape() {
                continue;
            }
            let Ok(cmp) = compare_output(out, c, r, &criterion) else {
                continue;
            };
            let a = if cmp.required_atol.is_nan() {
                f64::INFINITY
            } else {
                cmp.required_atol
            };
            err_of.insert(out.as_str(), a);
            if best.as_ref().is_none_or(|b| a > b.1) {
                best = Some((out.clone(), a, cmp.required_rtol, cmp.tolerance_passed));
            }
        }
        let Some((output, required_atol, required_rtol, passed)) = best else {
            continue;
        };
        let input_err = node
            .inputs
            .iter()
            .filter_map(|i| err_of.get(i.as_str()).copied())
            .fold(0.0f64, f64::max);
        let growth = if required_atol.is_infinite() && input_err.is_infinite() {
            0.0
        } else {
            required_atol - input_err
        };
        rows.push(LayerError {
            index,
            layer: node.name.clone(),
            op: node.op_type.clone(),
            output,
            precision: if crate::ops::is_data_movement(&node.op_type) {
                None
            } else {
                plan.and_then(|p| p.layers.get(index).copied())
            },
            required_atol,
            required_rtol,
            growth,
            passed,
        });
        if fail_fast && !passed {
            break;
        }
    }
    rows
}

/// The table `run --mark-all` prints; the first failing layer is marked.
pub fn table(rows: &[LayerError], stat: &str) -> String {
    let name_w = rows
        .iter()
        .map(|r| r.layer.len())
        .max()
        .unwrap_or(5)
        .clamp(5, 48);
    let op_w = rows.iter().map(|r| r.op.len()).max().unwrap_or(2).max(2);
    let mut s = format!(
        "    {:>5}  {:<name_w$}  {:<op_w$}  {:<10}  {:>12}  {:>12}  {:>12}  result\n",
        "#",
        "layer",
        "op",
        "precision",
        format!("{stat} abs"),
        format!("{stat} rel"),
        "growth"
    );
    let first_fail = rows.iter().position(|r| !r.passed);
    for (k, r) in rows.iter().enumerate() {
        let prec = r.precision.map(|p| p.name()).unwrap_or("(carried)");
        s.push_str(&format!(
            "    {:>5}  {:<name_w$}  {:<op_w$}  {:<10}  {:>12}  {:>12}  {:>12}  {}{}\n",
            r.index,
            r.layer,
            r.op,
            prec,
            super::fmt_g(r.required_atol, 5),
            super::fmt_g(r.required_rtol, 5),
            super::fmt_g(r.growth, 5),
            if r.passed { "PASSED" } else { "FAILED" },
            if Some(k) == first_fail {
                "   <-- first failing layer"
            } else {
                ""
            }
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::ErrorStat;
    use crate::compare::PerOutput;
    use crate::graph::Node;
    use std::collections::BTreeMap;

    fn node(name: &str, op: &str, i: &[&str], o: &[&str]) -> Node {
        Node {
            name: name.into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: i.iter().map(|s| s.to_string()).collect(),
            outputs: o.iter().map(|s| s.to_string()).collect(),
            attrs: BTreeMap::new(),
        }
    }

    #[test]
    fn growth_is_measured_against_the_inputs_error() {
        let g = Graph {
            nodes: vec![
                node("a", "Relu", &["x"], &["ya"]),
                node("b", "Relu", &["ya"], &["yb"]),
                node("c", "Relu", &["yb"], &["yc"]),
            ],
            ..Default::default()
        };
        let t = |v: f32| Tensor::from_f32(vec![2], vec![v, v]);
        let reference: HashMap<String, Tensor> = [("ya", t(1.0)), ("yb", t(1.0)), ("yc", t(1.0))]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        // Layer b adds 0.5 of error; c passes it on unchanged.
        let candidate: HashMap<String, Tensor> = [("ya", t(1.0)), ("yb", t(1.5)), ("yc", t(1.5))]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let crit = Criterion {
            stat: PerOutput::new(ErrorStat::Max),
            ..Default::default()
        };
        let rows = layerwise(&g, &reference, &candidate, &crit, None, false);
        assert_eq!(rows.len(), 3);
        assert!(rows[0].passed && !rows[1].passed && !rows[2].passed);
        assert_eq!(rows[1].growth, 0.5);
        assert_eq!(rows[2].growth, 0.0);
        let rows = layerwise(&g, &reference, &candidate, &crit, None, true);
        assert_eq!(rows.len(), 2, "fail-fast stops at the first failing layer");
        assert!(table(&rows, "max").contains("<-- first failing layer"));
    }
}
