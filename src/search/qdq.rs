//! Searching a Q/DQ model (docs/search.md, "Searching a Q/DQ model"): which quantized layers
//! must leave quantization for the model to stay accurate.
//!
//! The candidates are the model's quantized layers ([`crate::export::qdq::quantized_layers`]);
//! marking one removes its input Q/DQ pairs so it runs in the high precision (float32, or
//! float16 with Casts), everything else stays as quantized. Each candidate is the model
//! [`strip`] writes, run as it is (under the plan's fusion model); the reference is the model
//! with every Q/DQ pair removed ([`strip_all`]) run in float32, or golden outputs. The
//! strategies, the `--check` oracle and the debug replay are the float search's; only what a
//! candidate is differs. There is no incremental re-execution: each evaluation runs its
//! candidate model whole.

use super::builtin::{judge_sets, relative_error, Golden, UserCriterion};
use super::driver::SearchHooks;
use super::report::{QdqInputError, QdqReason, SearchStats};
use super::space::{CandidateModel, CandidateSpace, Found, Prepared};
use super::{Evaluation, Oracle, Outcome, Ranking, SearchResult, SearchSpace};
use crate::compare::Criterion;
use crate::error::{Error, Result};
use crate::exec::{Interpreter, PlanOptions, PreparedPlan, RunOptions, RunResult};
use crate::export::qdq::{quantized_layers, strip, strip_all, QdqKind, QdqLayer, Stripped};
use crate::golden::GoldenFile;
use crate::onnx::Model;
use crate::precision::fusion::FusionModel;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use crate::tensor::{DType, Feeds, Tensor};
use std::collections::HashMap;

/// Everything a Q/DQ model's search space needs.
pub struct QdqSpaceConfig<'a> {
    /// The Q/DQ model as loaded.
    pub model: &'a Model,
    pub feeds: &'a [Feeds],
    pub criterion: Criterion,
    /// A user criterion that decides the verdicts instead of `criterion`.
    pub user: Option<UserCriterion>,
    /// The precision marked layers run in (float32 or float16).
    pub high: Precision,
    /// The fusion model every run uses (`--fusion`).
    pub fusion: FusionModel,
}

/// Runs the graph of `interp` as it is on `feeds` (under `fusion`, its regions derived for
/// these inputs' shapes; no precision is emulated besides it).
fn run_with(
    interp: &Interpreter<'_>,
    feeds: &Feeds,
    fusion: FusionModel,
    keep: bool,
) -> Result<RunResult> {
    let opts = RunOptions {
        keep_intermediates: keep,
    };
    match fusion_plan(interp.graph(), feeds, fusion)? {
        None => interp.run_with(feeds, &opts),
        Some(prepared) => interp.run_plan(feeds, &opts, &prepared),
    }
}

/// The plan a Q/DQ model runs with: none without a fusion model, else float32 everywhere
/// under `fusion`, its regions derived for the shapes of `feeds`.
fn fusion_plan(
    graph: &crate::graph::Graph,
    feeds: &Feeds,
    fusion: FusionModel,
) -> Result<Option<PreparedPlan>> {
    if fusion.is_none() {
        return Ok(None);
    }
    let mut plan = PrecisionPlan::uniform(graph, Precision::Float32);
    plan.fusion = fusion;
    let shapes = crate::exec::feed_shapes(feeds);
    let opts = PlanOptions {
        input_shapes: Some(&shapes),
        ..PlanOptions::default()
    };
    Ok(Some(PreparedPlan::new(graph, &plan, &opts)?))
}

/// Evaluates candidate sets of quantized layers by running their stripped models.
pub struct QdqOracle<'a> {
    model: &'a Model,
    feeds: &'a [Feeds],
    golden: Vec<Golden>,
    criterion: Criterion,
    /// A user criterion that decides the verdicts instead of `criterion`.
    user: Option<UserCriterion>,
    high: Precision,
    fusion: FusionModel,
    pub evaluations: usize,
    /// Nodes executed by every run so far.
    pub executions: u64,
}

impl<'a> QdqOracle<'a> {
    /// Runs every input set through `model`, counting its nodes.
    fn run_all(&mut self, model: &Model, keep: bool) -> Result<Vec<RunResult>> {
        let interp = Interpreter::new(&model.graph)?;
        let mut out = Vec::with_capacity(self.feeds.len());
        for f in self.feeds {
            out.push(run_with(&interp, f, self.fusion, keep)?);
            self.executions += model.graph.nodes.len() as u64;
        }
        Ok(out)
    }
}

impl QdqOracle<'_> {
    /// The verdict on `marked` and the nodes its runs executed.
    fn judge(&self, marked: &[usize]) -> Result<(Evaluation, u64)> {
        if self.golden.is_empty() {
            return Err(Error::Invalid(
                "no golden outputs were set for the search".into(),
            ));
        }
        let candidate = strip(self.model, marked, self.high)?;
        let interp = Interpreter::new(&candidate.model.graph)?;
        let (e, sets) = judge_sets(
            self.feeds.len(),
            &self.golden,
            &self.criterion,
            self.user.as_ref(),
            false,
            |k| Ok(run_with(&interp, &self.feeds[k], self.fusion, false)?.outputs),
        )?;
        Ok((e, sets * candidate.model.graph.nodes.len() as u64))
    }
}

impl Oracle for QdqOracle<'_> {
    fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
        self.evaluations += 1;
        let (e, executions) = self.judge(marked)?;
        self.executions += executions;
        Ok(e)
    }

    /// The sets run at the same time on the thread pool (each candidate is its own model:
    /// there is no cache to share).
    fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        use rayon::prelude::*;
        let verdicts: Vec<Result<(Evaluation, u64)>> =
            sets.par_iter().map(|s| self.judge(s)).collect();
        verdicts
            .into_iter()
            .map(|v| {
                self.evaluations += 1;
                let (e, executions) = v?;
                self.executions += executions;
                Ok(e)
            })
            .collect()
    }

    fn parallel(&self) -> bool {
        true
    }
}

/// The candidate models of a Q/DQ search (what `--check` runs as `{model}`): `model` with the
/// marked layers' pairs removed, those layers in `high`.
pub fn qdq_candidates(model: &Model, high: Precision) -> CandidateModel<'_> {
    Box::new(move |marked: &[usize]| Ok(strip(model, marked, high)?.model.proto))
}

/// Every quantized layer (a Q/DQ search's candidates) with the format it computes in while
/// it stays quantized ([`crate::export::qdq::layer_format`]).
pub fn qdq_decided(model: &Model) -> Result<Vec<(usize, String)>> {
    let graph = &model.graph;
    Ok(quantized_layers(graph)?
        .iter()
        .map(|l| {
            (
                l.node,
                crate::export::qdq::layer_format(graph, l).to_string(),
            )
        })
        .collect())
}

/// Per quantized layer: its output's relative error in the Q/DQ model minus the largest
/// relative error of the float values it reads (for a quantized activation, the tensor in
/// front of its QuantizeLinear: the quantization is the layer's own error), against the
/// reference runs; the largest over input sets. Inf/NaN outputs rank as infinite.
fn growth(
    layers: &[QdqLayer],
    model: &Model,
    quantized: &[RunResult],
    reference: &[RunResult],
) -> HashMap<usize, f64> {
    let graph = &model.graph;
    let mut out: HashMap<usize, f64> = HashMap::new();
    for (q, r) in quantized.iter().zip(reference) {
        let err = |name: &str| -> Option<f64> {
            relative_error(r.intermediates.get(name)?, q.intermediates.get(name)?)
        };
        for l in layers {
            let node = &graph.nodes[l.node];
            let Some(e) = node
                .outputs
                .iter()
                .filter(|o| !o.is_empty())
                .filter_map(|o| err(o))
                .reduce(f64::max)
            else {
                continue;
            };
            let input = node
                .inputs
                .iter()
                .enumerate()
                .filter(|(_, n)| !n.is_empty())
                .filter_map(|(slot, n)| match l.inputs.iter().find(|i| i.slot == slot) {
                    Some(i) => match &i.kind {
                        QdqKind::Activation { source, .. } => err(source),
                        QdqKind::Weight => None,
                    },
                    None => err(n),
                })
                .fold(0.0f64, f64::max);
            let g = if e.is_infinite() { e } else { e - input };
            let slot = out.entry(l.node).or_insert(f64::NEG_INFINITY);
            if g > *slot || g.is_nan() {
                *slot = g;
            }
        }
    }
    out
}

/// FLOPs of every node, from the shapes of one run with its intermediates.
fn flops_of(model: &Model, run: &RunResult, feeds: &Feeds) -> Vec<u64> {
    let graph = &model.graph;
    let shape = |n: &str| -> Option<Vec<usize>> {
        run.intermediates
            .get(n)
            .or_else(|| feeds.get(n))
            .or_else(|| graph.weight(n))
            .map(|t: &Tensor| t.shape().to_vec())
    };
    graph
        .nodes
        .iter()
        .map(|n| {
            let ins: Vec<Option<Vec<usize>>> = n.inputs.iter().map(|i| shape(i)).collect();
            let outs: Option<Vec<Vec<usize>>> = n.outputs.iter().map(|o| shape(o)).collect();
            match outs {
                Some(outs) => crate::inspect::node_flops(n, &ins, &outs),
                None => 0,
            }
        })
        .collect()
}

/// A Q/DQ model's quantized layers, each candidate its stripped model run as it is.
pub struct QdqSpace<'a> {
    oracle: QdqOracle<'a>,
    /// The quantized layers, known once [`CandidateSpace::prepare`] ran.
    layers: Vec<QdqLayer>,
}

impl<'a> QdqSpace<'a> {
    pub fn new(c: QdqSpaceConfig<'a>) -> Result<QdqSpace<'a>> {
        if c.feeds.is_empty() {
            return Err(Error::Invalid(
                "the search needs at least one input set".into(),
            ));
        }
        if !matches!(c.high, Precision::Float32 | Precision::Float16) {
            return Err(Error::Invalid(format!(
                "--precision {}: layers taken out of quantization run in float32 or float16",
                c.high.name()
            )));
        }
        Ok(QdqSpace {
            oracle: QdqOracle {
                model: c.model,
                feeds: c.feeds,
                golden: Vec::new(),
                criterion: c.criterion,
                user: c.user,
                high: c.high,
                fusion: c.fusion,
                evaluations: 0,
                executions: 0,
            },
            layers: Vec::new(),
        })
    }

    /// The model's quantized layers; warns of operator-style quantized nodes (no pair to
    /// remove: not candidates), an error when there is nothing else.
    fn quantized_layers(
        &self,
        golden: Option<&GoldenFile>,
        hooks: &mut dyn SearchHooks,
    ) -> Result<Vec<QdqLayer>> {
        let graph = &self.oracle.model.graph;
        let layers = quantized_layers(graph)?;
        let operator_style: Vec<String> = graph
            .nodes
            .iter()
            .filter(|n| crate::export::qdq::is_operator_quantized(n))
            .map(|n| format!("'{}' ({})", n.name, n.op_type))
            .collect();
        if operator_style.is_empty() {
            return Ok(layers);
        }
        let shown = format!(
            "{}{}",
            operator_style[..operator_style.len().min(6)].join(", "),
            if operator_style.len() > 6 {
                ", ..."
            } else {
                ""
            }
        );
        if layers.is_empty() {
            return Err(Error::Invalid(format!(
                "no layer of the model is quantized with Q/DQ pairs: its quantization is operator-style ({} node(s): {shown}), which computes on codes with no pair to remove. Search the float model with --int8, or quantize it with Q/DQ pairs (ONNX Runtime's QuantFormat.QDQ, ModelOpt, `mixprec quantize`)",
                operator_style.len()
            )));
        }
        hooks.event(crate::event::Event::Warning(format!(
            "the model mixes quantization styles: {} operator-style quantized node(s) ({shown}) are not candidates and stay quantized in every candidate{}",
            operator_style.len(),
            if golden.is_none() {
                " and in the reference (the model with its Q/DQ pairs removed); give --golden outputs of the float model to judge against it"
            } else {
                ""
            }
        )));
        Ok(layers)
    }
}

impl CandidateSpace for QdqSpace<'_> {
    fn prepare(
        &mut self,
        ranking: Option<Ranking>,
        golden: Option<&GoldenFile>,
        hooks: &mut dyn SearchHooks,
    ) -> Result<Prepared> {
        let layers = self.quantized_layers(golden, hooks)?;
        let oracle = &mut self.oracle;
        let (model, feeds, fusion) = (oracle.model, oracle.feeds, oracle.fusion);
        let graph = &model.graph;
        let reference_model = strip_all(model)?;
        if let Some(r) = ranking.filter(|&r| r != Ranking::Growth) {
            return Err(Error::Invalid(format!(
                "a Q/DQ model's search ranks its quantized layers by growth, not by {}",
                r.name()
            )));
        }
        let ranked = ranking.is_some();
        let reference = oracle.run_all(&reference_model.model, ranked)?;
        // One FP32 inference, warm, on an interpreter of the reference model; left out of the
        // search's time.
        let (fp32_inference, timing) = {
            let interp = Interpreter::new(&reference_model.model.graph)?;
            super::report::time_warm_inference(|| {
                run_with(&interp, &feeds[0], fusion, false).map(drop)
            })?
        };
        let golden: Vec<Golden> = match golden {
            Some(g) => g.reference_for(&reference[0].outputs, &mut |e| hooks.event(e))?,
            None => reference.iter().map(|r| r.outputs.clone()).collect(),
        };
        if golden.len() != 1 && golden.len() < feeds.len() {
            return Err(Error::Invalid(format!(
                "the golden outputs hold {} iterations but there are {} input sets",
                golden.len(),
                feeds.len()
            )));
        }
        oracle.golden = golden;
        // The Q/DQ model as it is: FLOPs from its shapes, and the ranking.
        let quantized = if ranked {
            oracle.run_all(model, true)?
        } else {
            let interp = Interpreter::new(graph)?;
            let r = run_with(&interp, &feeds[0], fusion, true)?;
            oracle.executions += graph.nodes.len() as u64;
            vec![r]
        };
        let flops = flops_of(model, &quantized[0], &feeds[0]);
        let scores = if ranked {
            growth(&layers, model, &quantized, &reference)
        } else {
            HashMap::new()
        };
        let space = SearchSpace {
            candidates: layers.iter().map(|l| l.node).collect(),
            flops,
            scores: scores.into(),
            deferred: false,
        };
        self.layers = layers;
        Ok(Prepared {
            space,
            fp32_inference,
            timing,
        })
    }

    fn oracle(&mut self) -> &mut dyn Oracle {
        &mut self.oracle
    }

    fn stats(&self, result: &SearchResult, wall_seconds: f64, fp32_inference: f64) -> SearchStats {
        SearchStats {
            evaluations: result.trials.len(),
            speculative_evaluations: result.speculative,
            ranking_runs: 0,
            layer_executions: self.oracle.executions,
            layer_executions_without_cache: self.oracle.executions,
            cache_peak_bytes: 0,
            cache_evictions: 0,
            wall_seconds,
            fp32_inference_seconds: fp32_inference,
            contradictions: result.contradictions(),
        }
    }

    fn conclude(&mut self, result: &SearchResult, _layer_errors: bool) -> Result<Found> {
        let o = &self.oracle;
        let answer = match &result.outcome {
            Outcome::Found(m) | Outcome::Interrupted(Some(m)) => {
                Some(Box::new(strip(o.model, m, o.high)?))
            }
            _ => None,
        };
        let reasons = match (&result.outcome, &answer) {
            (Outcome::Found(m), Some(a)) => answer_reasons(
                o.model,
                &self.layers,
                &o.feeds[0],
                o.high,
                o.fusion,
                m,
                a,
                result,
            )?,
            _ => Vec::new(),
        };
        Ok(Found::Qdq {
            layers: std::mem::take(&mut self.layers),
            answer,
            reasons,
        })
    }
}

/// Why each layer of `answer` must leave quantization: the model with `answer` stripped
/// against the same without that one layer (it alone back in quantization), on one input
/// set: how far the layer's output moves, and what quantizing each of its activations costs
/// (saturated values, rounding error). Each layer's model runs only up to that layer, the
/// layers on the thread pool.
#[allow(clippy::too_many_arguments)]
fn answer_reasons(
    model: &Model,
    layers: &[QdqLayer],
    feeds: &Feeds,
    high: Precision,
    fusion: FusionModel,
    answer: &[usize],
    stripped: &Stripped,
    result: &SearchResult,
) -> Result<Vec<QdqReason>> {
    use rayon::prelude::*;
    let graph = &model.graph;
    let outputs: std::collections::HashSet<String> = answer
        .iter()
        .flat_map(|&i| graph.nodes[i].outputs.iter().cloned())
        .collect();
    let reference = observe(&stripped.model, feeds, fusion, None, &outputs)?;
    let reasons: Vec<Result<Option<QdqReason>>> = answer
        .par_iter()
        .map(|&i| {
            let Some(layer) = layers.iter().find(|l| l.node == i) else {
                return Ok(None);
            };
            let node = &graph.nodes[i];
            let others: Vec<usize> = answer.iter().copied().filter(|&j| j != i).collect();
            let back = strip(model, &others, high)?;
            let mut names: std::collections::HashSet<String> =
                node.inputs.iter().chain(&node.outputs).cloned().collect();
            for q in &layer.inputs {
                if let QdqKind::Activation { source, .. } = &q.kind {
                    names.insert(source.clone());
                }
            }
            let last = back
                .model
                .graph
                .nodes
                .iter()
                .position(|n| n.name == node.name);
            let values = observe(&back.model, feeds, fusion, last, &names)?;
            let value = |m: &HashMap<String, Tensor>, name: &str| -> Option<Tensor> {
                m.get(name).or_else(|| feeds.get(name)).cloned()
            };
            let Some((output, atol, rel)) = node.outputs.iter().find_map(|o| {
                let (a, b) = (value(&reference, o)?, value(&values, o)?);
                let rel = relative_error(&a, &b)?;
                let (a, b) = (a.to_f64_vec()?, b.to_f64_vec()?);
                let atol = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f64, |m, d| if d.is_nan() { f64::NAN } else { m.max(d) });
                Some((o.clone(), atol, rel))
            }) else {
                return Ok(None);
            };
            let mut inputs = Vec::new();
            for q in &layer.inputs {
                let QdqKind::Activation { q: qn, source } = &q.kind else {
                    continue;
                };
                let (Some(x), Some(y)) =
                    (value(&values, source), value(&values, &node.inputs[q.slot]))
                else {
                    continue;
                };
                let Some(relative_error) = relative_error(&x, &y) else {
                    continue;
                };
                let qnode = &graph.nodes[*qn];
                let scale = qnode
                    .inputs
                    .get(1)
                    .and_then(|n| graph.weight(n))
                    .and_then(|t| t.to_f64_vec())
                    .map(|v| v.iter().fold(0.0f64, |m, s| m.max(s.abs())))
                    .unwrap_or(f64::NAN);
                inputs.push(QdqInputError {
                    tensor: source.clone(),
                    scale,
                    clipped: clipped_fraction(&x, scale, qnode, graph),
                    relative_error,
                });
            }
            let alone = result.trial_of(&others).map(|t| {
                format!(
                    "{}: {}",
                    if t.passed { "passes" } else { "fails" },
                    t.summary
                )
            });
            Ok(Some(QdqReason {
                layer: node.name.clone(),
                op: node.op_type.clone(),
                output,
                required_atol: atol,
                relative_error: rel,
                inputs,
                alone,
            }))
        })
        .collect();
    let mut out = Vec::with_capacity(answer.len());
    for r in reasons {
        out.extend(r?);
    }
    Ok(out)
}

/// The values `names` of one run of `model` as it is (under `fusion`), up to node `last` of
/// its graph (None: the whole graph); graph inputs included.
fn observe(
    model: &Model,
    feeds: &Feeds,
    fusion: FusionModel,
    last: Option<usize>,
    names: &std::collections::HashSet<String>,
) -> Result<HashMap<String, Tensor>> {
    let graph = &model.graph;
    let interp = Interpreter::new(graph)?;
    let prepared = fusion_plan(graph, feeds, fusion)?;
    let mut cache = crate::exec::ValueCache::new(0);
    let mut got = HashMap::new();
    let mut keep = |name: &str, t: &Tensor| {
        if names.contains(name) {
            got.insert(name.to_string(), t.clone());
        }
    };
    match last {
        Some(last) => {
            interp.run_cached_until(feeds, 0, prepared.as_ref(), &mut cache, last, &mut keep)?
        }
        None => {
            interp.run_cached_observed(feeds, 0, prepared.as_ref(), &mut cache, &mut keep)?;
        }
    }
    Ok(got)
}

/// The fraction of `x` that an integer grid saturates: values beyond its range
/// `[(qmin − zp)·s, (qmax − zp)·s]` by more than half a step. A grid that starts at zero
/// (uint8 with zero point 0) maps negative values to zero on purpose — ONNX Runtime's
/// quantizer drops a Relu in front of such a pair — so only its top counts. None for a grid
/// that is not integer (float8) or per axis, or a scale that is not known.
fn clipped_fraction(
    x: &Tensor,
    scale: f64,
    q: &crate::graph::Node,
    graph: &crate::graph::Graph,
) -> Option<f64> {
    let (dtype, zp) = match q.inputs.get(2).filter(|n| !n.is_empty()) {
        Some(z) => {
            let z = graph.weight(z)?;
            if z.len() != 1 {
                return None;
            }
            (z.dtype(), z.to_f64_vec()?[0])
        }
        // Without a zero point the codes are uint8 unless `output_dtype` says otherwise.
        None if !q.attrs.contains_key("output_dtype") => (DType::U8, 0.0),
        None => return None,
    };
    let (qmin, qmax) = match dtype {
        DType::I8 => (-128.0, 127.0),
        DType::U8 => (0.0, 255.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::U16 => (0.0, 65535.0),
        DType::I4 => (-8.0, 7.0),
        DType::U4 => (0.0, 15.0),
        _ => return None,
    };
    if !scale.is_finite() || scale <= 0.0 {
        return None;
    }
    let x = x.to_f64_vec()?;
    if x.is_empty() {
        return None;
    }
    let half = 0.5 * scale;
    let (lo, hi) = ((qmin - zp) * scale - half, (qmax - zp) * scale + half);
    let relu = qmin == zp;
    let n = x.iter().filter(|&&v| v > hi || (!relu && v < lo)).count();
    Some(n as f64 / x.len() as f64)
}

/// Node names of `marked` as the quantizers' exclusion options take them: ModelOpt's
/// `--nodes_to_exclude n1 n2` and ONNX Runtime's `quantize_static(..., nodes_to_exclude=[...])`.
pub fn exclusion_lines(model: &Model, marked: &[usize]) -> Vec<String> {
    let names: Vec<&str> = marked
        .iter()
        .map(|&i| model.graph.nodes[i].name.as_str())
        .collect();
    let shell: Vec<String> = names.iter().map(|n| super::report::shell_word(n)).collect();
    let py: Vec<String> = names
        .iter()
        .map(|n| serde_json::to_string(n).unwrap_or_else(|_| format!("'{n}'")))
        .collect();
    vec![
        format!(
            "python -m modelopt.onnx.quantization --onnx_path <float model> ... --nodes_to_exclude {}",
            shell.join(" ")
        ),
        format!(
            "onnxruntime.quantization.quantize_static(..., nodes_to_exclude=[{}])",
            py.join(", ")
        ),
    ]
}

/// Names of `marked` that the model file does not hold (the node is unnamed there; mixprec
/// named it): a quantizer cannot exclude them by these names.
pub fn unnamed_in_file(model: &Model, marked: &[usize]) -> Vec<String> {
    let Some(g) = model.proto.graph.as_ref() else {
        return Vec::new();
    };
    marked
        .iter()
        .filter_map(|&i| {
            let n = &model.graph.nodes[i];
            let pos = n.pos?;
            let file_name = g.node.get(pos)?.name.clone().unwrap_or_default();
            (file_name != n.name).then(|| n.name.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests;
