//! What a search reports: its counters ([`SearchStats`]), the `--save-result` JSON
//! ([`ResultFile`]) and the HTML report ([`html_report`]), assembled from the search's
//! outcome. The CLI prints and writes them.

use super::builtin::BuiltinOracle;
use super::check::trtexec_spec;
use super::groups::{answer_rules, Rule};
use super::{Direction, Mode, Objective, Outcome, SearchResult, SearchSpace, Trial};
use crate::compare::html::{HLine, HtmlReport, PlotPoint, PlotSeries};
use crate::error::Result;
use crate::graph::Graph;
use crate::inspect::si;
use crate::precision::plan::{GlobalPrecision, PrecisionConstraints, PrecisionPlan};
use crate::precision::Precision;
use serde::Serialize;

/// Counters of one search, for the report, the JSON result and the benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct SearchStats {
    /// Evaluations the strategy took (the trials).
    pub evaluations: usize,
    /// Evaluations made ahead of need (`--jobs` > 1) that the strategy never took.
    pub speculative_evaluations: usize,
    /// Runs the sensitivity ranking made before the search: one per candidate, each with it
    /// alone in low precision (emulated and judged like an evaluation, but not one of the
    /// strategy's: their verdicts rank, they do not answer). 0 for other rankings.
    pub ranking_runs: usize,
    /// Layers executed, with the incremental cache.
    pub layer_executions: u64,
    /// Layers the same runs execute without it.
    pub layer_executions_without_cache: u64,
    pub cache_peak_bytes: usize,
    pub cache_evictions: u64,
    pub wall_seconds: f64,
    /// One FP32 inference: a plain run of the first input set, warm (the fastest of the few
    /// the search times after its reference run and leaves out of `wall_seconds`).
    pub fp32_inference_seconds: f64,
    /// Failing trials that marked every layer of a passing one, and more: the criterion is
    /// not monotone on this model ([`super::contradictions`]).
    pub contradictions: super::Contradictions,
}

/// What [`SearchStats::fp32_inference_seconds`] holds: the fastest of at least two runs of
/// `run` (the first after a reference run still pays for packing weights or for the memory
/// the cache took: PP-OCRv4 rec 4.2–4.7 ms, then 3.7–4.4), more while they took under 20 ms
/// in all, up to ten (a sub-millisecond model's single runs varied 10×), and the time they
/// took, which the search leaves out of its own.
pub(crate) fn time_warm_inference(
    mut run: impl FnMut() -> Result<()>,
) -> Result<(f64, std::time::Duration)> {
    let all = std::time::Instant::now();
    let mut best = f64::INFINITY;
    let mut runs = 0;
    while runs < 2 || (runs < 10 && all.elapsed() < std::time::Duration::from_millis(20)) {
        let t = std::time::Instant::now();
        run()?;
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    Ok((best, all.elapsed()))
}

impl SearchStats {
    /// The counters of a finished search over the emulating oracle (its cache saw every
    /// layer execution, also those of a `--check` search's reference and ranking):
    /// `wall_seconds` from the reference run on, `fp32_inference_seconds` one plain warm FP32
    /// run of the first input set ([`BuiltinOracle::time_fp32_inference`]).
    pub fn new(
        result: &SearchResult,
        oracle: &BuiltinOracle<'_>,
        wall_seconds: f64,
        fp32_inference_seconds: f64,
    ) -> SearchStats {
        SearchStats {
            evaluations: result.trials.len(),
            speculative_evaluations: result.speculative,
            ranking_runs: oracle.ranking_runs,
            layer_executions: oracle.cache.stats.executed,
            layer_executions_without_cache: oracle.full_executions,
            cache_peak_bytes: oracle.cache.stats.peak_bytes,
            cache_evictions: oracle.cache.stats.evictions,
            wall_seconds,
            fp32_inference_seconds,
            contradictions: result.contradictions(),
        }
    }
}

/// What the sensitivity ranking ran, for the `Search:` lines: empty without one.
pub fn ranked_note(stats: &SearchStats) -> String {
    match stats.ranking_runs {
        0 => String::new(),
        n => format!(
            " after ranking by sensitivity ({n} run(s): each candidate alone in low precision)"
        ),
    }
}

/// A layer of the answer, by index and name.
#[derive(Clone, Debug, Serialize)]
pub struct LayerRef {
    pub index: usize,
    pub name: String,
    pub op: String,
    pub flops: u64,
    /// Why the layer must run in high precision: its error, growth and cause with it alone
    /// back in low precision, the rest of the answer as found (first input set, emulated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<LayerReason>,
}

/// A layer's error alone in low precision and its cause (see [`crate::compare::cause`]).
#[derive(Clone, Debug, Serialize)]
pub struct LayerReason {
    pub precision: Option<Precision>,
    pub output: String,
    pub required_atol: f64,
    pub required_rtol: f64,
    pub growth: f64,
    pub cause: crate::compare::cause::Cause,
    /// The cause and what was measured, in words.
    pub explanation: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub facts: Option<crate::compare::cause::CauseFacts>,
}

impl LayerReason {
    pub fn new(r: &crate::compare::layerwise::LayerError) -> LayerReason {
        LayerReason {
            precision: r.precision,
            output: r.output.clone(),
            required_atol: r.required_atol,
            required_rtol: r.required_rtol,
            growth: r.growth,
            cause: r.cause,
            explanation: r.reason(),
            facts: r.facts.clone(),
        }
    }
}

/// One rule of the answer in the result file.
#[derive(Clone, Debug, Serialize)]
pub struct GroupRef {
    #[serde(flatten)]
    pub rule: Rule,
    /// The `--layer-precisions` item that sets the rule's layers to the high precision
    /// (`re:REGEX:float32`, or `NAME:float32` for a layer of its own); None for a Q/DQ
    /// model's search, whose answer leaves quantization instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer_precisions: Option<String>,
}

impl GroupRef {
    pub fn new(rule: Rule, high: Precision) -> GroupRef {
        GroupRef {
            layer_precisions: Some(layer_precisions_item(&rule, high)),
            rule,
        }
    }
}

/// The `--layer-precisions` item of a rule: its regex, or a lone layer's name where the name
/// reads as itself (no glob characters, no `re:` prefix).
pub fn layer_precisions_item(rule: &Rule, high: Precision) -> String {
    match rule.layers.as_slice() {
        [name] if !name.contains(['*', '?']) && !name.starts_with("re:") && !name.is_empty() => {
            format!("{name}:{}", high.name())
        }
        _ => format!("re:{}:{}", rule.regex, high.name()),
    }
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
    /// The answer as rules: one per role and set of blocks, a layer without a block index
    /// on its own ([`super::groups::rules`]).
    pub groups: Vec<GroupRef>,
    pub stats: &'a SearchStats,
    pub trials: &'a [Trial],
    /// The fusion model this answer assumes (`none`: safe on any engine).
    pub fusion: &'static str,
    /// With `--fusion tensorrt`: the answer under that fusion model, in the same form (the
    /// top level is then the answer without fusion).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with_fusion: Option<Box<ResultFile<'a>>>,
    /// A search over a Q/DQ model's quantized layers (`debug precision` on a Q/DQ model
    /// without a precision flag): what the answer takes out of quantization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qdq: Option<QdqResult>,
}

/// The Q/DQ part of a result file (docs/search.md, "Searching a Q/DQ model").
#[derive(Clone, Debug, Serialize)]
pub struct QdqResult {
    /// Quantized layers of the model (the candidates).
    pub quantized_layers: usize,
    /// The answer's node names, as quantizers take them (ModelOpt `--nodes_to_exclude`, ONNX
    /// Runtime `nodes_to_exclude`); the same names as `layers[].name`.
    pub nodes_to_exclude: Vec<String>,
    /// Per layer of the answer: the Q/DQ pairs and quantized weights it no longer reads.
    pub removed: Vec<QdqRemoved>,
    /// Where the stripped model was written (`-o`), if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stripped_model: Option<String>,
    /// Per layer of the answer: why it must leave quantization.
    pub reasons: Vec<QdqReason>,
}

/// Why a layer of a Q/DQ answer must leave quantization: the layer alone back in
/// quantization, the rest as answered (the first input set, emulated).
#[derive(Clone, Debug, Serialize)]
pub struct QdqReason {
    pub layer: String,
    pub op: String,
    /// The layer's first float output, and how far it moves: the absolute error that a
    /// tolerance would have to allow there, and the error relative to its mean magnitude.
    pub output: String,
    pub required_atol: f64,
    pub relative_error: f64,
    /// Its quantized activations: what quantizing each costs.
    pub inputs: Vec<QdqInputError>,
    /// The criterion's verdict on the answer without this layer, when the search evaluated
    /// that set (minimal mode's last phase does, for every layer of its answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alone: Option<String>,
}

/// The quantization of one activation of a layer: `source → QuantizeLinear →
/// DequantizeLinear`, measured on the values the layer reads.
#[derive(Clone, Debug, Serialize)]
pub struct QdqInputError {
    /// The float value in front of the QuantizeLinear.
    pub tensor: String,
    /// The quantization step (the largest scale, for a per-axis pair).
    pub scale: f64,
    /// Fraction of values the grid saturates (outside `[(qmin − zp)·s, (qmax − zp)·s]` by
    /// more than half a step; for a grid starting at zero only above it, since negative
    /// values there stand for a dropped Relu): the range is too small. None for float8 and
    /// per-axis grids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clipped: Option<f64>,
    /// mean |DQ(Q(x)) − x| over mean |x|: the rounding (and clipping) error.
    pub relative_error: f64,
}

impl QdqReason {
    /// The likelier cause, in words: saturation when more than 0.1 % of an input's values
    /// are clipped, else the rounding of the input with the largest relative error.
    pub fn cause(&self) -> String {
        let clipped = self
            .inputs
            .iter()
            .filter(|i| i.clipped.is_some_and(|c| c > 1e-3))
            .max_by(|a, b| a.clipped.partial_cmp(&b.clipped).expect("finite"));
        if let Some(i) = clipped {
            return format!(
                "saturation: {:.1}% of '{}' clipped (its range is too small)",
                100.0 * i.clipped.unwrap_or(0.0),
                i.tensor
            );
        }
        match self
            .inputs
            .iter()
            .max_by(|a, b| a.relative_error.total_cmp(&b.relative_error))
        {
            Some(i) => format!(
                "rounding of '{}' (relative error {})",
                i.tensor,
                crate::compare::fmt_g(i.relative_error, 3)
            ),
            None => "its quantized weights".to_string(),
        }
    }
}

/// One dequantized input of an answered layer that the stripped model no longer has.
#[derive(Clone, Debug, Serialize)]
pub struct QdqRemoved {
    pub layer: String,
    /// The layer's input (the DequantizeLinear's output).
    pub input: String,
    /// `activation` (a QuantizeLinear → DequantizeLinear pair) or `weight` (a stored
    /// quantized weight, now a float initializer).
    pub kind: &'static str,
    /// The QuantizeLinear node (activations).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantize: Option<String>,
    pub dequantize: String,
    /// The float tensor the layer reads instead (activations).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reads: Option<String>,
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
        reasons: &[crate::compare::layerwise::LayerError],
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
                        reason: reasons.iter().find(|r| r.index == i).map(LayerReason::new),
                    })
                    .collect(),
                _ => Vec::new(),
            },
            groups: match &result.outcome {
                Outcome::Found(m) | Outcome::Interrupted(Some(m)) => {
                    answer_rules(graph, &space.candidates, m)
                        .into_iter()
                        .map(|r| GroupRef::new(r, setup.high))
                        .collect()
                }
                _ => Vec::new(),
            },
            stats,
            trials: &result.trials,
            fusion: setup.low.fusion.name(),
            with_fusion: None,
            qdq: None,
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
    reasons: &[crate::compare::layerwise::LayerError],
) -> HtmlReport {
    let mut r = HtmlReport::new(&format!("mixprec debug precision: {model}"));
    let mut rules: Vec<Rule> = Vec::new();
    let execs = format!(
        "Search: {} evaluations{}, {} layer executions ({} without the incremental cache), {:.2} s",
        stats.evaluations,
        ranked_note(stats),
        stats.layer_executions,
        stats.layer_executions_without_cache,
        stats.wall_seconds
    );
    match &result.outcome {
        Outcome::Found(m) | Outcome::Interrupted(Some(m)) => {
            let f = space.flops_of(m);
            rules = answer_rules(graph, &space.candidates, m);
            let by_role = rules.iter().any(Rule::is_group);
            let mut details = vec![
                if by_role {
                    format!(
                        "Layers, by role ({} rule(s); the groups below list them): {}",
                        rules.len(),
                        rules
                            .iter()
                            .map(Rule::describe)
                            .collect::<Vec<_>>()
                            .join("; ")
                    )
                } else {
                    format!("Layers: {}", names(graph, m))
                },
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
            details.push(
                "TensorRT 11 (strongly typed): the answer's mixed-precision model (`mixprec convert`, or `debug precision -o`), built with `trtexec --onnx=model_mixed.onnx --stronglyTyped`".to_string(),
            );
            details.push(format!(
                "TensorRT <= 10 only: trtexec --layerPrecisions={} --precisionConstraints=obey",
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
    if rules.iter().any(Rule::is_group) {
        r.raw(groups_html(&rules, high));
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
    let stat = criterion.stat.default.name();
    if !reasons.is_empty() {
        let rows: Vec<Vec<String>> = reasons
            .iter()
            .map(|x| {
                vec![
                    x.index.to_string(),
                    x.layer.clone(),
                    x.op.clone(),
                    x.precision.map_or("(carried)", |p| p.name()).to_string(),
                    crate::compare::fmt_g(x.required_atol, 5),
                    crate::compare::fmt_g(x.growth, 5),
                    x.cause.name().to_string(),
                    x.reason(),
                ]
            })
            .collect();
        r.table(
            "Why these layers: each alone back in its low precision, the rest as answered (first input set)",
            &[
                "#",
                "layer",
                "op",
                "low precision",
                &format!("{stat} abs"),
                "growth",
                "cause",
                "what was measured",
            ],
            &rows,
        );
    }
    if let Some(rows) = layer_rows {
        let outputs: Vec<String> = graph.outputs.iter().map(|v| v.name.clone()).collect();
        r.layer_errors_with(
            "Layer-wise error of the final plan (first input set)",
            rows,
            stat,
            Some(criterion.atol.default),
            crate::compare::html::LayerVerdicts::OutputsOnly(&outputs),
        );
    }
    r
}

/// Lists longer than this fold into a `<details>` in the HTML report.
const FOLD_AFTER: usize = 6;

/// The answer's rules as an HTML table: the rule, its ops, its layers (folded when long) and
/// the regex that names them, as `--layer-precisions` and ModelOpt's `--nodes_to_exclude`
/// take it.
fn groups_html(rules: &[Rule], high: Precision) -> String {
    use crate::compare::html::esc;
    use std::fmt::Write;
    let mut s = String::from(
        "<h2>Groups: the answer by role (layers that play the same role in repeated blocks)</h2>\n<div class=\"scroll\"><table><thead><tr><th class=\"l\">rule</th><th class=\"l\">op</th><th>layers</th><th class=\"l\">names</th><th class=\"l\">--layer-precisions / --nodes_to_exclude</th></tr></thead><tbody>\n",
    );
    for rule in rules {
        let names: Vec<String> = rule
            .layers
            .iter()
            .map(|n| format!("<span class=\"mono\">{}</span>", esc(n)))
            .collect();
        let listed = if names.len() > FOLD_AFTER {
            format!(
                "<details><summary>{} layers</summary>{}</details>",
                names.len(),
                names.join("<br>")
            )
        } else {
            names.join("<br>")
        };
        let mut ops: Vec<&str> = Vec::new();
        for op in &rule.ops {
            if !ops.contains(&op.as_str()) {
                ops.push(op);
            }
        }
        let _ = writeln!(
            s,
            "<tr><td class=\"l mono\">{}</td><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l mono wrap\">{}<br>{}</td></tr>",
            esc(&rule.describe()),
            esc(&ops.join(", ")),
            rule.layers.len(),
            listed,
            esc(&layer_precisions_item(rule, high)),
            esc(&rule.regex)
        );
    }
    s.push_str("</tbody></table></div>\n");
    s
}

/// What the deploy lines of an answer are made from.
pub struct DeploySetup<'a> {
    /// The searched model, as the user named it.
    pub model: &'a str,
    pub graph: &'a Graph,
    /// The global precision flags of the search (`--fp16 --int8 ...`).
    pub flags: GlobalPrecision,
    /// The answer's plan (the low plan with the marked layers in `high`).
    pub answer: &'a PrecisionPlan,
    pub marked: &'a [usize],
    pub high: Precision,
    /// Where this command writes the answer's mixed-precision model (`-o`), if it does.
    pub written: Option<&'a str>,
    /// Arguments `mixprec convert` needs besides the precisions to write the same model: the
    /// calibration cache, or the inputs the search calibrated on.
    pub convert_extra: Vec<String>,
    /// The TensorRT <= 10 global flags, as `polygraphy run` and `trtexec` spell them.
    pub polygraphy_flags: String,
    pub trtexec_flags: String,
}

/// The mixed-precision model the TensorRT 11 lines name when `-o` did not write one.
pub const MIXED_MODEL: &str = "model_mixed.onnx";

/// How to deploy an answer, TensorRT 11 first: TensorRT 11 is strongly typed only (no
/// `--fp16`, `--layerPrecisions`, `--precisionConstraints`), so the answer ships as the
/// mixed-precision model whose Casts and Q/DQ carry every precision, built with
/// `trtexec --stronglyTyped`. Every line is true after the command ran: the model they name
/// is the `-o` file, or the first line is the `mixprec convert` command that writes it with
/// the answer's precisions. The TensorRT <= 10 lines (weak typing, the original model) follow.
pub fn deploy_lines(s: &DeploySetup<'_>) -> Result<Vec<String>> {
    let mut lines = vec![
        "TensorRT 11 (strongly typed: the model's Casts and Q/DQ set every precision):".to_string(),
    ];
    let mixed = match s.written {
        Some(path) => {
            lines.push(format!(
                "  {}: the answer as a mixed-precision model (written by -o)",
                shell_word(path)
            ));
            shell_word(path)
        }
        None => {
            let mut cmd = vec![
                "mixprec".to_string(),
                "convert".to_string(),
                shell_word(s.model),
            ];
            cmd.extend(global_flag_words(&s.flags));
            let items = convert_items(s.graph, &s.flags, s.answer)?;
            if !items.is_empty() {
                cmd.push("--layer-precisions".into());
                cmd.extend(items.iter().map(|i| shell_word(i)));
            }
            cmd.extend(s.convert_extra.iter().map(|a| shell_word(a)));
            cmd.extend(["-o".to_string(), MIXED_MODEL.to_string()]);
            lines.push(format!("  {}", cmd.join(" ")));
            MIXED_MODEL.to_string()
        }
    };
    lines.push(format!("  trtexec --onnx={mixed} --stronglyTyped"));
    lines.push(format!("  polygraphy run {mixed} --trt --strongly-typed"));
    lines.push("TensorRT <= 10 only (weakly typed, the original model):".to_string());
    let items = super::check::polygraphy_items(s.graph, s.marked, s.high)
        .iter()
        .map(|i| shell_word(i))
        .collect::<Vec<_>>();
    let model = shell_word(s.model);
    lines.push(format!(
        "  polygraphy run {model} --trt {} --layer-precisions {} --precision-constraints obey",
        s.polygraphy_flags,
        items.join(" ")
    ));
    lines.push(format!(
        "  trtexec --onnx={model} {} --layerPrecisions={} --precisionConstraints=obey",
        s.trtexec_flags,
        shell_word(&trtexec_spec(s.graph, s.marked, s.high))
    ));
    Ok(lines)
}

/// `--fp16 --bf16 --int8 --fp8` as set.
fn global_flag_words(f: &GlobalPrecision) -> Vec<String> {
    [
        (f.fp16, "--fp16"),
        (f.bf16, "--bf16"),
        (f.int8, "--int8"),
        (f.fp8, "--fp8"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, w)| w.to_string())
    .collect()
}

/// The `--layer-precisions` items that, with the global flags, give exactly `answer`: one
/// `name:dtype` per layer (and per subgraph node, by path) whose precision differs from what
/// the flags alone give. A name that a glob would read as a pattern (`*`, `?`) or that starts
/// with `re:` is written as an anchored regex, so the item names that layer only.
pub fn convert_items(
    graph: &Graph,
    flags: &GlobalPrecision,
    answer: &PrecisionPlan,
) -> Result<Vec<String>> {
    let (base, _) = PrecisionPlan::resolve(graph, flags, &[], PrecisionConstraints::Prefer)?;
    let item = |name: &str, p: Precision| {
        if name.contains(['*', '?']) || name.starts_with("re:") {
            format!("re:^{}$:{}", regex::escape(name), p.name())
        } else {
            format!("{name}:{}", p.name())
        }
    };
    let mut items = Vec::new();
    for (i, (&want, &got)) in answer.layers.iter().zip(&base.layers).enumerate() {
        if want != got {
            items.push(item(&graph.nodes[i].name, want));
        }
    }
    for (path, &want) in &answer.inner {
        if base.inner.get(path) != Some(&want) {
            items.push(item(path, want));
        }
    }
    Ok(items)
}

/// `s` as one POSIX shell word: unchanged when it needs no quoting, else in single quotes.
pub fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=,@%+".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod deploy_tests {
    use super::*;
    use crate::graph::Node;
    use crate::precision::plan::parse_layer_precisions;

    #[test]
    fn convert_items_give_back_the_answer_and_quote_for_the_shell() {
        let mut g = Graph::default();
        for name in ["conv*1", "add", "re:x", "it's"] {
            g.nodes.push(Node {
                name: name.into(),
                op_type: "Relu".into(),
                ..Default::default()
            });
        }
        g.nodes.push(Node {
            name: "conv10".into(),
            op_type: "Relu".into(),
            ..Default::default()
        });
        let flags = GlobalPrecision {
            fp16: true,
            ..Default::default()
        };
        let (base, _) =
            PrecisionPlan::resolve(&g, &flags, &[], PrecisionConstraints::Prefer).unwrap();
        let answer = base.marking(&[0, 2, 3], Precision::Float32);
        let items = convert_items(&g, &flags, &answer).unwrap();
        assert_eq!(items.len(), 3, "{items:?}");
        // The items resolve to exactly the answer: `conv*1` does not catch `conv10`.
        let overrides = parse_layer_precisions(&items).unwrap();
        let (again, _) =
            PrecisionPlan::resolve(&g, &flags, &overrides, PrecisionConstraints::Prefer).unwrap();
        assert_eq!(again.layers, answer.layers);
        assert_eq!(shell_word("a/b.onnx"), "a/b.onnx");
        assert_eq!(shell_word("[-1,1]"), "'[-1,1]'");
        assert_eq!(shell_word("it's:float32"), r"'it'\''s:float32'");
    }

    /// The HTML report's groups: one row per rule with its ops, count, names and items; a
    /// rule of more than FOLD_AFTER layers folds its names into a `<details>`, a short one
    /// lists them; names are escaped.
    #[test]
    fn the_groups_table_lists_each_rule_and_folds_long_ones() {
        let rule = |role: &str, blocks: std::ops::Range<u64>, ops: &[&str]| {
            let layers: Vec<String> = blocks
                .clone()
                .flat_map(|b| {
                    ops.iter()
                        .map(move |op| format!("/model/layers.{b}/{op}<x>"))
                })
                .collect();
            Rule {
                role: role.into(),
                scope: "/model/layers".into(),
                block_indices: blocks.clone().collect(),
                blocks: format!("{}–{}", blocks.start, blocks.end - 1),
                ops: ops.iter().map(|s| s.to_string()).collect(),
                indices: (0..layers.len()).collect(),
                regex: format!("^/model/layers\\.{role}$"),
                layers,
            }
        };
        let long = rule("norm/{Pow,Sqrt}", 2..6, &["Pow", "Sqrt"]);
        let short = rule("mask/Mul", 0..3, &["Mul"]);
        let html = groups_html(&[long, short], Precision::Float32);
        assert_eq!(html.matches("<tr><td").count(), 2, "{html}");
        assert!(
            html.contains("norm/{Pow,Sqrt} in /model/layers 2–5"),
            "{html}"
        );
        assert!(
            html.contains("<td class=\"l\">Pow, Sqrt</td><td>8</td>"),
            "{html}"
        );
        assert_eq!(
            html.matches("<details><summary>8 layers</summary>").count(),
            1,
            "{html}"
        );
        assert!(html.contains("/model/layers.5/Sqrt&lt;x&gt;"), "{html}");
        assert!(!html.contains("<x>"), "{html}");
        // The short rule lists its three names unfolded, with its item.
        let short_row = html.split("<tr>").find(|r| r.contains("mask/Mul")).unwrap();
        assert!(!short_row.contains("<details>"), "{short_row}");
        assert_eq!(
            short_row.matches("/model/layers.").count(),
            3,
            "{short_row}"
        );
        assert!(
            short_row.contains(r"re:^/model/layers\.mask/Mul$:float32"),
            "{short_row}"
        );
    }
}
