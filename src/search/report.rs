//! What a search reports: its counters ([`SearchStats`]), the `--save-result` JSON
//! ([`ResultFile`]) and the HTML report ([`html_report`]), assembled from the search's
//! outcome. The CLI prints and writes them.

use super::builtin::BuiltinOracle;
use super::check::trtexec_spec;
use super::{Direction, Mode, Objective, Outcome, SearchResult, SearchSpace, Trial};
use crate::compare::html::{HLine, HtmlReport, PlotPoint, PlotSeries};
use crate::graph::Graph;
use crate::inspect::si;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use serde::Serialize;

/// Counters of one search, for the report, the JSON result and the benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct SearchStats {
    pub evaluations: usize,
    /// Layers executed, with the incremental cache.
    pub layer_executions: u64,
    /// Layers the same runs execute without it.
    pub layer_executions_without_cache: u64,
    pub cache_peak_bytes: usize,
    pub cache_evictions: u64,
    pub wall_seconds: f64,
    pub fp32_inference_seconds: f64,
}

impl SearchStats {
    /// The counters of a finished search over the emulating oracle (its cache saw every
    /// layer execution, also those of a `--check` search's reference and ranking):
    /// `wall_seconds` from the reference run on, `fp32_inference_seconds` per input set.
    pub fn new(
        result: &SearchResult,
        oracle: &BuiltinOracle<'_>,
        wall_seconds: f64,
        fp32_inference_seconds: f64,
    ) -> SearchStats {
        SearchStats {
            evaluations: result.trials.len(),
            layer_executions: oracle.cache.stats.executed,
            layer_executions_without_cache: oracle.full_executions,
            cache_peak_bytes: oracle.cache.stats.peak_bytes,
            cache_evictions: oracle.cache.stats.evictions,
            wall_seconds,
            fp32_inference_seconds,
        }
    }
}

/// A layer of the answer, by index and name.
#[derive(Clone, Debug, Serialize)]
pub struct LayerRef {
    pub index: usize,
    pub name: String,
    pub op: String,
    pub flops: u64,
}

/// The `--save-result` file (JSON).
#[derive(Serialize)]
pub struct ResultFile<'a> {
    pub model: String,
    pub mode: &'static str,
    pub direction: Direction,
    pub objective: Objective,
    pub higher_precision: &'static str,
    pub low_precisions: Vec<String>,
    pub candidates: usize,
    pub candidate_flops: u64,
    pub outcome: &'a Outcome,
    pub layers: Vec<LayerRef>,
    pub stats: &'a SearchStats,
    pub trials: &'a [Trial],
    /// The fusion model this answer assumes (`none`: safe on any engine).
    pub fusion: &'static str,
    /// With `--fusion tensorrt`: the answer under that fusion model, in the same form (the
    /// top level is then the answer without fusion).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with_fusion: Option<Box<ResultFile<'a>>>,
}

/// How the search was set up, as the result file records it.
pub struct SearchSetup<'a> {
    pub model: &'a str,
    pub mode: Mode,
    pub direction: Direction,
    pub objective: Objective,
    pub high: Precision,
    /// The plan every candidate starts from (all layers in their low precision).
    pub low: &'a PrecisionPlan,
}

impl<'a> ResultFile<'a> {
    pub fn new(
        setup: &SearchSetup<'_>,
        graph: &Graph,
        space: &SearchSpace,
        result: &'a SearchResult,
        stats: &'a SearchStats,
    ) -> ResultFile<'a> {
        ResultFile {
            model: setup.model.to_string(),
            mode: setup.mode.name(),
            direction: setup.direction,
            objective: setup.objective,
            higher_precision: setup.high.name(),
            low_precisions: setup
                .low
                .counts(graph)
                .iter()
                .map(|(p, n)| format!("{n} {}", p.name()))
                .collect(),
            candidates: space.candidates.len(),
            candidate_flops: space.total_flops(),
            outcome: &result.outcome,
            layers: match &result.outcome {
                Outcome::Found(m) | Outcome::Interrupted(Some(m)) => m
                    .iter()
                    .map(|&i| LayerRef {
                        index: i,
                        name: graph.nodes[i].name.clone(),
                        op: graph.nodes[i].op_type.clone(),
                        flops: space.flops[i],
                    })
                    .collect(),
                _ => Vec::new(),
            },
            stats,
            trials: &result.trials,
            fusion: setup.low.fusion.name(),
            with_fusion: None,
        }
    }
}

/// The layers' names, comma-separated.
pub fn names(graph: &Graph, marked: &[usize]) -> String {
    marked
        .iter()
        .map(|&i| graph.nodes[i].name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `part` as a percentage of `whole` (`12.5%`; `0%` of nothing).
pub fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0%".into();
    }
    format!("{:.1}%", 100.0 * part as f64 / whole as f64)
}

/// The HTML report: the answer, the search history and the final plan's layer-wise errors.
#[allow(clippy::too_many_arguments)]
pub fn html_report(
    model: &str,
    graph: &Graph,
    space: &SearchSpace,
    criterion: &crate::compare::Criterion,
    high: Precision,
    mode: Mode,
    result: &SearchResult,
    stats: &SearchStats,
    layer_rows: Option<&[crate::compare::layerwise::LayerError]>,
) -> HtmlReport {
    let mut r = HtmlReport::new(&format!("mixprec debug precision: {model}"));
    let execs = format!(
        "Search: {} evaluations, {} layer executions ({} without the incremental cache), {:.2} s",
        stats.evaluations,
        stats.layer_executions,
        stats.layer_executions_without_cache,
        stats.wall_seconds
    );
    match &result.outcome {
        Outcome::Found(m) | Outcome::Interrupted(Some(m)) => {
            let f = space.flops_of(m);
            let mut details = vec![
                format!("Layers: {}", names(graph, m)),
                format!(
                    "{} of {} candidate layers ({}), {}FLOP of {}FLOP ({}) in {}",
                    m.len(),
                    space.candidates.len(),
                    percent(m.len() as u64, space.candidates.len() as u64),
                    si(f),
                    si(space.total_flops()),
                    percent(f, space.total_flops()),
                    high.name()
                ),
            ];
            if let Some(t) = result.trial_of(m) {
                details.push(format!("Achieved: {}", t.summary));
            }
            details.push(format!(
                "trtexec: --layerPrecisions={} --precisionConstraints=obey",
                trtexec_spec(graph, m, high)
            ));
            details.push(execs);
            let interrupted = matches!(result.outcome, Outcome::Interrupted(_));
            r.verdict(
                !interrupted,
                &format!(
                    "{}{} layer(s) must run in {} ({} mode)",
                    if interrupted {
                        "Interrupted: best so far: "
                    } else {
                        ""
                    },
                    m.len(),
                    high.name(),
                    mode.name()
                ),
                &details,
            );
        }
        other => {
            let headline = match other {
                Outcome::NothingNeeded => "The low-precision plan already passes: no layer needs marking",
                Outcome::ReferenceFails => "Even the all-high-precision plan fails: the golden outputs or the tolerances are wrong",
                _ => "No configuration satisfied the accuracy requirements",
            };
            r.verdict(matches!(other, Outcome::NothingNeeded), headline, &[execs]);
        }
    }
    let mut passed = PlotSeries::new("passed");
    passed.color = Some("#2ca02c".into());
    let mut failed = PlotSeries::new("failed");
    failed.color = Some("#d62728".into());
    for t in &result.trials {
        let pt = PlotPoint {
            x: t.iteration as f64,
            y: t.error,
            passed: Some(t.passed),
            label: Some(format!(
                "#{} {}: {} layer(s) marked: {}",
                t.iteration,
                t.phase,
                t.marked.len(),
                t.summary
            )),
        };
        if t.passed {
            passed.points.push(pt);
        } else {
            failed.points.push(pt);
        }
    }
    let hline = HLine {
        y: criterion.atol.default,
        label: format!("atol {}", crate::compare::fmt_g(criterion.atol.default, 5)),
    };
    r.line_plot_with(
        "Search history: achieved error per candidate",
        "iteration",
        "required abs tolerance",
        true,
        &[passed, failed],
        &[hline],
        None,
    );
    let rows: Vec<Vec<String>> = result
        .trials
        .iter()
        .map(|t| {
            vec![
                t.iteration.to_string(),
                t.phase.to_string(),
                t.marked.len().to_string(),
                percent(t.marked_flops, space.total_flops()),
                if t.passed { "PASSED" } else { "FAILED" }.to_string(),
                t.summary.clone(),
            ]
        })
        .collect();
    r.table(
        "Candidates",
        &[
            "#",
            "phase",
            "layers marked",
            "FLOPs marked",
            "verdict",
            "error",
        ],
        &rows,
    );
    if let Some(rows) = layer_rows {
        r.layer_errors(
            "Layer-wise error of the final plan (first input set)",
            rows,
            criterion.stat.default.name(),
            Some(criterion.atol.default),
        );
    }
    r
}
