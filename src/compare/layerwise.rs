//! Layer-wise comparison (`--mark-all`, Polygraphy's `--trt-outputs mark all`): every layer's
//! output in the reduced-precision run against the same tensor in the FP32 reference run, in
//! topological order, with the error each layer adds over the error already in its inputs.
//!
//! The growth figure (required absolute tolerance of the layer's output minus the largest
//! required tolerance among its inputs) is what a worst-first search ranks layers by. Each
//! row also carries the cause of the layer's error, measured on its data
//! ([`super::cause`]).

use super::cause::{self, Cause, CauseFacts};
use super::{check_output, compare_output, Criterion};
use crate::exec::PreparedPlan;
use crate::graph::Graph;
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
    /// Why the layer's output differs from the reference (see [`super::cause`]).
    pub cause: Cause,
    /// What the cause was decided from; measured, under a precision plan, for layers with a
    /// precision whose output differs from the reference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub facts: Option<CauseFacts>,
}

impl LayerError {
    /// The cause and what was measured, in words.
    pub fn reason(&self) -> String {
        cause::describe(
            self.cause,
            self.precision,
            &self.facts.clone().unwrap_or_default(),
        )
    }
}

/// Compares every float layer output present in both runs. With `fail_fast`, stops after the
/// first failing layer.
pub fn layerwise(
    graph: &Graph,
    reference: &HashMap<String, Tensor>,
    candidate: &HashMap<String, Tensor>,
    criterion: &Criterion,
    plan: Option<&PreparedPlan>,
    fail_fast: bool,
) -> Vec<LayerError> {
    let criterion_full = criterion;
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
        let row = finish_row(
            graph,
            index,
            (output, required_atol, required_rtol, passed),
            input_err,
            (reference, candidate),
            criterion_full,
            plan,
        );
        rows.push(row);
        if fail_fast && !passed {
            break;
        }
    }
    rows
}

/// A layer's row from its compared output and its inputs' largest error: growth, precision
/// and cause.
fn finish_row(
    graph: &Graph,
    index: usize,
    (output, required_atol, required_rtol, passed): (String, f64, f64, bool),
    input_err: f64,
    (reference, candidate): (&HashMap<String, Tensor>, &HashMap<String, Tensor>),
    criterion: &Criterion,
    plan: Option<&PreparedPlan>,
) -> LayerError {
    let node = &graph.nodes[index];
    let growth = if required_atol.is_infinite() && input_err.is_infinite() {
        0.0
    } else {
        required_atol - input_err
    };
    let precision = if crate::ops::is_data_movement(node) || graph.is_folded(node) {
        None
    } else {
        plan.and_then(|p| p.plan.layers.get(index).copied())
    };
    let facts = match plan {
        // Layers whose output differs: range faults are theirs whatever the growth; the
        // accumulator re-run only where the layer adds error.
        Some(p) if precision.is_some() && required_atol != 0.0 => Some(cause::measure(
            graph,
            index,
            &output,
            reference,
            candidate,
            p,
            criterion,
            growth > 0.0,
        )),
        _ => None,
    };
    let cause = cause::classify(
        growth,
        required_atol,
        precision,
        &facts.clone().unwrap_or_default(),
    );
    LayerError {
        index,
        layer: node.name.clone(),
        op: node.op_type.clone(),
        output,
        precision,
        required_atol,
        required_rtol,
        growth,
        passed,
        cause,
        facts,
    }
}

/// The row of layer `index` alone (its largest-error output, growth over its inputs' error,
/// cause), as [`layerwise`] computes it, without comparing the other layers.
pub fn layer_row(
    graph: &Graph,
    index: usize,
    reference: &HashMap<String, Tensor>,
    candidate: &HashMap<String, Tensor>,
    criterion: &Criterion,
    plan: Option<&PreparedPlan>,
) -> Option<LayerError> {
    let node = graph.nodes.get(index)?;
    let crit = Criterion {
        metrics: Vec::new(),
        ..criterion.clone()
    };
    let err = |name: &str| -> Option<(f64, f64, bool)> {
        let (r, c) = (reference.get(name)?, candidate.get(name)?);
        if !r.dtype().is_float() || r.shape() != c.shape() {
            return None;
        }
        let chk = check_output(name, c, r, &crit).ok()?;
        let a = if chk.required_atol.is_nan() {
            f64::INFINITY
        } else {
            chk.required_atol
        };
        Some((a, chk.required_rtol, chk.passed))
    };
    let mut best: Option<(String, f64, f64, bool)> = None;
    for out in node.outputs.iter().filter(|o| !o.is_empty()) {
        if let Some((a, r, p)) = err(out) {
            if best.as_ref().is_none_or(|b| a > b.1) {
                best = Some((out.clone(), a, r, p));
            }
        }
    }
    let input_err = node
        .inputs
        .iter()
        .filter_map(|i| err(i).map(|e| e.0))
        .fold(0.0f64, f64::max);
    Some(finish_row(
        graph,
        index,
        best?,
        input_err,
        (reference, candidate),
        criterion,
        plan,
    ))
}

/// The layer-wise comparison over several input sets: per layer (matched by index, in
/// topological order) the worst of every figure across iterations — the largest required
/// absolute and relative tolerance (NaN counts as worst) and growth — and the output of the
/// iteration with the largest required absolute tolerance, and the cause of the iteration with
/// the largest growth. A layer fails when it fails in any
/// iteration. Layers missing from some iterations (`--fail-fast`) are aggregated over the
/// iterations that have them.
pub fn aggregate(iterations: &[Vec<LayerError>]) -> Vec<LayerError> {
    let worse = |a: f64, b: f64| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    };
    let mut by_index: std::collections::BTreeMap<usize, LayerError> = Default::default();
    for rows in iterations {
        for r in rows {
            match by_index.get_mut(&r.index) {
                None => {
                    by_index.insert(r.index, r.clone());
                }
                Some(acc) => {
                    if r.required_atol > acc.required_atol
                        || (r.required_atol.is_nan() && !acc.required_atol.is_nan())
                    {
                        acc.output = r.output.clone();
                    }
                    // The cause of the iteration where the layer adds the most error.
                    if r.growth > acc.growth || (r.growth.is_nan() && !acc.growth.is_nan()) {
                        acc.cause = r.cause;
                        acc.facts = r.facts.clone();
                    }
                    acc.required_atol = worse(acc.required_atol, r.required_atol);
                    acc.required_rtol = worse(acc.required_rtol, r.required_rtol);
                    acc.growth = worse(acc.growth, r.growth);
                    acc.passed &= r.passed;
                }
            }
        }
    }
    by_index.into_values().collect()
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
        "    {:>5}  {:<name_w$}  {:<op_w$}  {:<10}  {:>12}  {:>12}  {:>12}  {:<12}  result\n",
        "#",
        "layer",
        "op",
        "precision",
        format!("{stat} abs"),
        format!("{stat} rel"),
        "growth",
        "cause"
    );
    let first_fail = rows.iter().position(|r| !r.passed);
    for (k, r) in rows.iter().enumerate() {
        let prec = r.precision.map(|p| p.name()).unwrap_or("(carried)");
        s.push_str(&format!(
            "    {:>5}  {:<name_w$}  {:<op_w$}  {:<10}  {:>12}  {:>12}  {:>12}  {:<12}  {}{}\n",
            r.index,
            r.layer,
            r.op,
            prec,
            super::fmt_g(r.required_atol, 5),
            super::fmt_g(r.required_rtol, 5),
            super::fmt_g(r.growth, 5),
            r.cause.name(),
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
            ..Default::default()
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
        let t = table(&rows, "max");
        assert!(t.contains("<-- first failing layer"));
        // Without a plan there are no precisions: the error is carried, not caused here.
        assert!(t.lines().next().unwrap().contains("cause"), "{t}");
        assert_eq!(rows[1].cause, Cause::Inherited, "{t}");
    }

    fn row(index: usize, atol: f64, rtol: f64, growth: f64, passed: bool) -> LayerError {
        LayerError {
            index,
            layer: format!("l{index}"),
            op: "Relu".into(),
            output: format!("y{index}_{atol}"),
            precision: None,
            required_atol: atol,
            required_rtol: rtol,
            growth,
            passed,
            cause: if growth > 0.0 {
                Cause::Rounding
            } else {
                Cause::Inherited
            },
            facts: None,
        }
    }

    #[test]
    fn aggregate_takes_the_worst_of_every_iteration() {
        let it0 = vec![
            row(0, 1e-4, 1e-3, 1e-4, true),
            row(2, 0.5, 0.1, 0.4, false),
            row(3, 0.2, 0.3, 0.0, true),
        ];
        let it1 = vec![
            row(0, 2e-4, 5e-4, 2e-4, true),
            row(2, 0.1, f64::NAN, 0.05, true),
            row(3, 0.3, 0.1, -0.1, false),
        ];
        let agg = aggregate(&[it0.clone(), it1]);
        assert_eq!(
            agg.iter().map(|r| r.index).collect::<Vec<_>>(),
            vec![0, 2, 3]
        );
        // Layer 0: the largest of each figure, passes in both.
        assert_eq!(agg[0].required_atol, 2e-4);
        assert_eq!(agg[0].required_rtol, 1e-3);
        assert_eq!(agg[0].growth, 2e-4);
        assert_eq!(agg[0].output, "y0_0.0002", "output of the worst iteration");
        assert!(agg[0].passed);
        // Layer 2 fails in iteration 0 only: it fails; a NaN is the worst value.
        assert!(!agg[2 - 1].passed);
        assert_eq!(agg[1].required_atol, 0.5);
        assert!(agg[1].required_rtol.is_nan());
        assert_eq!(agg[1].output, "y2_0.5");
        // Layer 3 fails in iteration 1 only.
        assert!(!agg[2].passed);
        assert_eq!((agg[2].required_atol, agg[2].growth), (0.3, 0.0));
        // The cause comes from the iteration with the largest growth.
        assert_eq!(agg[0].cause, Cause::Rounding);
        assert_eq!(agg[2].cause, Cause::Inherited);
        // One iteration aggregates to itself; layers cut off by --fail-fast still appear.
        let one = aggregate(std::slice::from_ref(&it0));
        assert_eq!(one.len(), 3);
        assert_eq!(one[1].required_atol, 0.5);
        let cut = aggregate(&[it0[..2].to_vec(), it0.clone()]);
        assert_eq!(cut.len(), 3);
        assert!(aggregate(&[]).is_empty());
    }
}
