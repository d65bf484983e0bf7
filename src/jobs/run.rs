//! `run` as a library job: Polygraphy's runners over the input sets — the FP32 reference
//! (`--onnxrt`) and the emulated engine under a precision plan (`--trt`) — with marked
//! tensors, layer-wise comparison (`--mark-all`), profiling, saved inputs and outputs, and
//! every run compared with the next (live runners, then loaded results). The CLI's `run` is
//! a shell over [`run`]; the Python API's `mixprec.run` over [`outputs`].

use super::options::{CompareOptions, Inputs, PrecisionOptions};
use super::ranges::ranges_for_plan;
use crate::compare::fmt_g;
use crate::compare::layerwise::layerwise;
use crate::compare::run_report::{
    aggregate_log, compare_runs, html_report, layerwise_log, validate, CompareOptions as Pair,
    LayerIteration, LayerReport, OutputInfo, RunSummary, Validation,
};
use crate::data::npz;
use crate::data::polygraphy::{self, IterationResult, RunResults};
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::event::{Event, Progress};
use crate::exec::{Feeds, PreparedPlan, RunOptions, RunResult};
use crate::golden::{GoldenFile, Outputs};
use crate::precision::summary::{
    fusion_line, fusion_table, precision_counts_line, precision_table,
};
use crate::tensor::fmt_shape;
use crate::{load_model, Graph, Interpreter};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The runners: Polygraphy's `--onnxrt` (FP32 reference) and `--trt` (the emulated engine).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunnerKind {
    Onnxrt,
    Trt,
}

/// What `run` does.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub model: PathBuf,
    pub inputs: Inputs,
    /// The --trt runner's precisions (none given: FP32).
    pub precision: PrecisionOptions,
    pub compare: CompareOptions,
    /// `--onnxrt` / `--trt`; neither: the emulated engine when a precision is given, else FP32.
    pub onnxrt: bool,
    pub trt: bool,
    /// `--trt` came before `--onnxrt` on the command line (runs are compared in that order).
    pub trt_first: bool,
    /// `--trt-outputs` / `--onnx-outputs`: names, or `mark all`; and their exclusions.
    pub trt_outputs: Vec<String>,
    pub trt_exclude_outputs: Vec<String>,
    pub onnx_outputs: Vec<String>,
    pub onnx_exclude_outputs: Vec<String>,
    /// Saved results to compare with, after the live runners.
    pub load_outputs: Vec<PathBuf>,
    pub save_inputs: Option<PathBuf>,
    pub save_outputs: Option<PathBuf>,
    pub save_error_metrics: Option<PathBuf>,
    /// The HTML report.
    pub report: Option<PathBuf>,
    pub validate: bool,
    pub allow_missing: bool,
    pub runner_name: Option<String>,
    /// Layer-wise comparison with the FP32 reference.
    pub mark_all: bool,
    pub fail_fast: bool,
    pub profile: bool,
    pub warm_up: usize,
    /// Log every layer's precision, fusion region and (with `mark_all`) every iteration's table.
    pub verbose: bool,
    /// The command line, as the summary records it.
    pub command: String,
    /// `--decode N`: each input set is a prompt; every runner generates N tokens greedily
    /// through the KV cache, and its outputs are `tokens` and `logits` ([`crate::decode`]).
    pub decode: Option<usize>,
}

/// What a run found.
pub struct Outcome {
    pub summary: RunSummary,
    pub results: RunResults,
}

/// Where the job reports: Polygraphy-style log text (whole lines: `[I]`, `[W]`, tables) and
/// the library's events (input warnings, fusion notes).
pub struct Sinks<'a> {
    pub log: &'a mut dyn FnMut(&str),
    pub events: &'a mut dyn FnMut(Event),
    pub progress: &'a dyn Progress,
}

impl Sinks<'_> {
    fn line(&mut self, line: &str) {
        (self.log)(&format!("{line}\n"));
    }
}

/// One runner of the job.
struct Runner {
    kind: RunnerKind,
    name: String,
    /// The tensors it returns, in order; None: the graph outputs.
    marked: Option<Vec<String>>,
}

/// Polygraphy's runner name: `<prefix>-N<count>-<%x>-<%X>` in local time
/// (e.g. `trt-runner-N0-04/01/24-15:29:00`).
fn polygraphy_runner_name(prefix: &str) -> String {
    format!("{prefix}-N0-{}", polygraphy::runner_stamp())
}

/// The tensors `--trt-outputs`/`--onnx-outputs` select: `mark all` (every layer output in
/// topological order, less `exclude`) or names; None when no option was given.
pub fn marked_tensors(
    graph: &Graph,
    spec: &[String],
    exclude: &[String],
    flag: &str,
) -> Result<Option<Vec<String>>> {
    let invalid = |m: String| Err(Error::Invalid(m));
    if spec.is_empty() {
        if !exclude.is_empty() {
            return invalid(format!(
                "{flag}-exclude-outputs needs {flag}-outputs mark all"
            ));
        }
        return Ok(None);
    }
    let produced: Vec<&str> = graph
        .nodes
        .iter()
        .flat_map(|n| n.outputs.iter())
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .collect();
    let mark_all = spec.len() >= 2 && spec[0] == "mark" && spec[1] == "all";
    let values = graph.values();
    let known = |n: &str| {
        values
            .id(n)
            .is_some_and(|id| values.producer(id).is_some() || values.is_graph_output(id))
    };
    if let Some(n) = exclude.iter().find(|n| !known(n)) {
        return invalid(format!(
            "{flag}-exclude-outputs: the model has no tensor '{n}'"
        ));
    }
    if mark_all {
        if let Some(extra) = spec.get(2) {
            return invalid(format!(
                "{flag}-outputs mark all: unexpected '{extra}' after 'mark all'"
            ));
        }
        let mut names: Vec<String> = Vec::new();
        for n in produced.iter().copied() {
            if !exclude.iter().any(|e| e == n) && !names.iter().any(|m| m == n) {
                names.push(n.to_string());
            }
        }
        // Graph outputs that no node produces (inputs or initializers passed through).
        for o in &graph.outputs {
            if !names.contains(&o.name) && !exclude.contains(&o.name) {
                names.push(o.name.clone());
            }
        }
        return Ok(Some(names));
    }
    if let Some(n) = spec.iter().find(|n| !known(n)) {
        return invalid(format!(
            "{flag}-outputs: the model has no tensor '{n}' (use tensor names, or `mark all`)"
        ));
    }
    if !exclude.is_empty() {
        return invalid(format!(
            "{flag}-exclude-outputs only applies to {flag}-outputs mark all"
        ));
    }
    Ok(Some(spec.to_vec()))
}

/// A runner's outputs: the marked tensors (from the kept intermediates), or the graph outputs.
fn select_outputs(result: crate::exec::RunResult, marked: Option<&Vec<String>>) -> Outputs {
    let Some(names) = marked else {
        return result.outputs;
    };
    let mut inter = result.intermediates;
    names
        .iter()
        .filter_map(|n| {
            inter
                .remove(n)
                .or_else(|| {
                    result
                        .outputs
                        .iter()
                        .find(|(o, _)| o == n)
                        .map(|(_, t)| t.clone())
                })
                .map(|t| (n.clone(), t))
        })
        .collect()
}

/// One layer of the `--profile` table: its path (subgraph layers as `If_0/then_branch/Add`),
/// op type, the op types that ran inside it as its epilogue, and its summed time.
struct ProfiledLayer {
    path: String,
    op_type: String,
    fused_ops: Vec<String>,
    seconds: f64,
}

/// A runner's `--profile` rows, one per layer path (a Loop body's layers recur).
#[derive(Default)]
struct Profile {
    layers: Vec<ProfiledLayer>,
    rows: HashMap<String, usize>,
}

impl Profile {
    fn add(&mut self, times: Vec<crate::exec::LayerTime>) {
        for t in times {
            let path = format!("{}{}", t.scope, t.name);
            let layers = &mut self.layers;
            let row = *self.rows.entry(path.clone()).or_insert_with(|| {
                layers.push(ProfiledLayer {
                    path,
                    op_type: t.op_type,
                    fused_ops: t.fused_ops,
                    seconds: 0.0,
                });
                layers.len() - 1
            });
            layers[row].seconds += t.seconds;
        }
    }

    /// The table: layers by average milliseconds per iteration (the layers that ran inside
    /// one as its epilogue after its name), then the totals per op type.
    fn log(&self, iterations: usize) -> String {
        let layers = &self.layers;
        let total: f64 = layers.iter().map(|t| t.seconds).sum();
        let share = |s: f64| if total > 0.0 { 100.0 * s / total } else { 0.0 };
        let ms = |s: f64| s * 1e3 / iterations as f64;
        let mut order: Vec<&ProfiledLayer> = layers.iter().filter(|l| l.seconds > 0.0).collect();
        // By time, ties in execution order (the sort is stable).
        order.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        let mut lines = vec![format!(
            "[I]     Layer profile: {} layer(s), {} ms per iteration (average of {iterations})",
            order.len(),
            fmt_g(ms(total), 4)
        )];
        for l in &order {
            let with: String = l.fused_ops.iter().map(|o| format!(" + {o}")).collect();
            lines.push(format!(
                "[I]         {:>9.4} ms {:>5.1} %  {} ({}{with})",
                ms(l.seconds),
                share(l.seconds),
                l.path,
                l.op_type
            ));
        }
        let mut by_op: Vec<(&str, f64)> = Vec::new();
        for l in &order {
            match by_op.iter_mut().find(|(o, _)| *o == l.op_type) {
                Some(e) => e.1 += l.seconds,
                None => by_op.push((&l.op_type, l.seconds)),
            }
        }
        by_op.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
        lines.push("[I]     By op type:".to_string());
        for (op, s) in by_op {
            lines.push(format!(
                "[I]         {:>9.4} ms {:>5.1} %  {op}",
                ms(s),
                share(s)
            ));
        }
        lines.join("\n") + "\n"
    }
}

impl Config {
    /// The runners in comparison order.
    fn kinds(&self) -> Result<Vec<RunnerKind>> {
        let fused = self.fused()?;
        Ok(match (self.onnxrt, self.trt) {
            (true, true) if self.trt_first => vec![RunnerKind::Trt, RunnerKind::Onnxrt],
            (true, true) => vec![RunnerKind::Onnxrt, RunnerKind::Trt],
            (true, false) => vec![RunnerKind::Onnxrt],
            (false, true) => vec![RunnerKind::Trt],
            (false, false) if self.precision.any() || fused => vec![RunnerKind::Trt],
            (false, false) => vec![RunnerKind::Onnxrt],
        })
    }

    /// `--fusion tensorrt` alone also runs the emulated engine: a Q/DQ model runs TensorRT's
    /// quantized kernels (docs/numerics.md, "Q/DQ under TensorRT").
    fn fused(&self) -> Result<bool> {
        Ok(self.precision.fusion_model()? != crate::precision::fusion::FusionModel::None)
    }

    /// Option combinations that cannot work, refused before any file is read.
    fn check(&self, live_runs: usize) -> Result<()> {
        let invalid = |m: &str| Err(Error::Invalid(m.to_string()));
        if self.save_error_metrics.is_some() && live_runs + self.load_outputs.len() < 2 {
            return invalid("--save-error-metrics needs two runs to compare (--onnxrt and --trt, or --load-outputs)");
        }
        if self.runner_name.is_some() && live_runs > 1 {
            return invalid("--runner-name names a single runner; with --trt and --onnxrt the names are Polygraphy's");
        }
        Ok(())
    }

    fn runner_name(&self, kind: RunnerKind) -> String {
        match (&self.runner_name, self.onnxrt || self.trt) {
            (Some(n), _) => n.clone(),
            (None, true) => polygraphy_runner_name(match kind {
                RunnerKind::Trt => "trt-runner",
                RunnerKind::Onnxrt => "onnxrt-runner",
            }),
            (None, false) => format!(
                "mixprec-{}-runner",
                if self.precision.any() {
                    self.precision.global().low_precision().name()
                } else {
                    "fp32"
                }
            ),
        }
    }
}

/// The emulated engine's plan, ranges and kernels, with its summary lines logged; returns the
/// prepared plan and its precision-counts line.
fn prepare_trt(
    config: &Config,
    graph: &Graph,
    interp: &Interpreter,
    feeds: &[Feeds],
    sinks: &mut Sinks,
) -> Result<(PreparedPlan, String)> {
    let precision = &config.precision;
    let plan = precision.plan(graph, sinks.events)?;
    let amax = ranges_for_plan(
        interp,
        &plan,
        precision,
        feeds,
        sinks.events,
        sinks.progress,
    )?;
    let counts = precision_counts_line(graph, &plan);
    sinks.line(&format!("[I] {counts}"));
    if config.verbose {
        (sinks.log)(&precision_table(graph, &plan));
    }
    let shapes = match feeds.first() {
        Some(f) => crate::exec::feed_shapes(f),
        None => config.inputs.shape_overrides()?,
    };
    let prepared = precision.prepare(graph, &plan, amax.as_ref(), &shapes)?;
    // Weights clamped to float16's range, as the export stores them: TensorRT's builder warns
    // too.
    for e in prepared.weight_events() {
        (sinks.events)(e);
    }
    if let Some(line) = fusion_line(graph, plan.fusion, prepared.regions()) {
        sinks.line(&format!("[I] {line}"));
        if config.verbose {
            (sinks.log)(&fusion_table(graph, prepared.regions()));
            for e in prepared.fusion_events() {
                (sinks.events)(e);
            }
        }
    }
    Ok((prepared, counts))
}

/// Runs the job: every runner on every input set, then the comparisons and the files asked for.
pub fn run(config: &Config, sinks: &mut Sinks) -> Result<Outcome> {
    let started = Instant::now();
    let criterion = config.compare.criterion()?;
    let kinds = config.kinds()?;
    config.check(kinds.len())?;
    // Read the golden files first: a bad file should fail before a long run.
    let mut loaded: Vec<(PathBuf, RunResults)> = Vec::new();
    for p in &config.load_outputs {
        loaded.push((p.clone(), GoldenFile::load(p)?.results));
    }
    let (fused, any) = (config.fused()?, config.precision.any());
    if config.trt && !any && !fused {
        sinks.line("[W] --trt without --fp16/--bf16/--fp8/--int8/--layer-precisions: the emulated engine runs in float32");
    }
    if config.onnxrt && !config.trt && any {
        sinks.line("[W] precision options (--fp16, --int8, --layer-precisions, ...) apply to the --trt runner; --onnxrt runs in float32");
    }
    let model = load_model(&config.model)?;
    let graph = &model.graph;
    let trt_marked = marked_tensors(
        graph,
        &config.trt_outputs,
        &config.trt_exclude_outputs,
        "--trt",
    )?;
    let onnx_marked = marked_tensors(
        graph,
        &config.onnx_outputs,
        &config.onnx_exclude_outputs,
        "--onnx",
    )?;
    let sets = config.inputs.given(graph, sinks.events)?;
    let decoder = match config.decode {
        Some(n) => {
            if config.mark_all || trt_marked.is_some() || onnx_marked.is_some() || config.profile {
                return Err(Error::Invalid(
                    "--decode gives the generated tokens and logits: it cannot be combined with --mark-all, marked outputs or --profile".into(),
                ));
            }
            Some(Decoder::new(graph, n)?)
        }
        None => None,
    };
    let feeds = match &decoder {
        Some(d) => sets
            .iter()
            .map(|f| d.first_feeds(f))
            .collect::<Result<Vec<_>>>()?,
        None => sets.clone(),
    };
    config.inputs.check(graph, &feeds)?;
    if config.mark_all && feeds.is_empty() {
        return Err(Error::Invalid(
            "--mark-all needs at least one input set".into(),
        ));
    }
    let interp = Interpreter::new(graph)?;
    let (prepared, precision_summary) = if kinds.contains(&RunnerKind::Trt) && (any || fused) {
        let (p, counts) = prepare_trt(config, graph, &interp, &feeds, sinks)?;
        (Some(p), Some(counts))
    } else {
        (None, None)
    };
    let polygraphy_style = config.onnxrt || config.trt;
    let runners: Vec<Runner> = kinds
        .iter()
        .map(|&kind| {
            // Without runner options the single runner takes whichever marking was given.
            let (own, other) = match kind {
                RunnerKind::Trt => (&trt_marked, &onnx_marked),
                RunnerKind::Onnxrt => (&onnx_marked, &trt_marked),
            };
            let marked = own
                .clone()
                .or_else(|| (!polygraphy_style).then(|| other.clone()).flatten());
            Runner {
                kind,
                name: config.runner_name(kind),
                marked,
            }
        })
        .collect();
    if config.onnxrt && !config.trt && trt_marked.is_some() {
        sinks
            .line("[W] --trt-outputs applies to the --trt runner, which this command does not run");
    }
    if config.trt && !config.onnxrt && onnx_marked.is_some() {
        sinks.line(
            "[W] --onnx-outputs applies to the --onnxrt runner, which this command does not run",
        );
    }
    if config.profile && (config.mark_all || runners.iter().any(|r| r.marked.is_some())) {
        return Err(Error::Invalid(
            "--profile times plain runs: it cannot be combined with --mark-all or marked outputs"
                .into(),
        ));
    }
    // The runner whose layers --mark-all compares with the FP32 reference.
    let primary = runners
        .iter()
        .position(|r| r.kind == RunnerKind::Trt)
        .unwrap_or(0);
    let plan_of = |r: &Runner| match r.kind {
        RunnerKind::Trt => prepared.as_ref(),
        RunnerKind::Onnxrt => None,
    };

    if let Some(first) = feeds.first() {
        for runner in &runners {
            for _ in 0..config.warm_up {
                match plan_of(runner) {
                    Some(p) => interp.run_plan(first, &RunOptions::default(), p)?,
                    None => interp.run(first)?,
                };
            }
        }
    }
    // Inference; with --mark-all every input set also runs the FP32 reference, keeping every
    // layer's output, and is compared layer by layer.
    let stat = criterion.stat.default.name();
    let mut per_runner: Vec<Vec<IterationResult>> = runners
        .iter()
        .map(|_| Vec::with_capacity(feeds.len()))
        .collect();
    let mut totals = vec![0.0f64; runners.len()];
    let mut profiles: Vec<Profile> = runners.iter().map(|_| Profile::default()).collect();
    let mut layer_iters: Vec<LayerIteration> = Vec::new();
    for (i, f) in feeds.iter().enumerate() {
        let stopped = config.fail_fast && layer_iters.iter().any(|it| !it.passed);
        let layers = config.mark_all && !stopped;
        for (r, runner) in runners.iter().enumerate() {
            let plan = plan_of(runner);
            let layerwise_here = layers && r == primary;
            let opts = RunOptions {
                keep_intermediates: layerwise_here || runner.marked.is_some(),
            };
            let start = Instant::now();
            let result = match plan {
                _ if decoder.is_some() => RunResult {
                    outputs: generate(&interp, decoder.as_ref(), f, plan)?,
                    ..Default::default()
                },
                _ if config.profile => {
                    let (result, times) = interp.run_profiled(f, plan)?;
                    profiles[r].add(times);
                    result
                }
                Some(p) => interp.run_plan(f, &opts, p)?,
                None => interp.run_with(f, &opts)?,
            };
            let secs = start.elapsed().as_secs_f64();
            totals[r] += secs;
            if layerwise_here {
                // Without a precision plan the run is the FP32 reference itself.
                let reference = match plan {
                    Some(_) => Some(interp.run_with(f, &opts)?),
                    None => None,
                };
                let rows = layerwise(
                    graph,
                    &reference.as_ref().unwrap_or(&result).intermediates,
                    &result.intermediates,
                    &criterion,
                    plan,
                    config.fail_fast,
                );
                let it = LayerIteration::new(i, rows);
                let table = i == 0 || config.verbose;
                (sinks.log)(&layerwise_log(&it, &runner.name, stat, table));
                layer_iters.push(it);
            } else if config.mark_all && r == primary && i == layer_iters.len() {
                sinks.line(&format!(
                    "[I] --fail-fast: layer-wise comparison stopped after iteration {}",
                    i - 1
                ));
            }
            per_runner[r].push(IterationResult {
                outputs: select_outputs(result, runner.marked.as_ref()),
                runtime: secs,
                runner_name: runner.name.clone(),
            });
        }
    }
    let layer_report = config
        .mark_all
        .then(|| LayerReport::new(stat, layer_iters, feeds.len()));
    let runner_name = runners[primary].name.clone();
    if let Some(lr) = layer_report.as_ref().filter(|lr| lr.iterations.len() > 1) {
        (sinks.log)(&aggregate_log(lr, &runner_name));
    }
    let mut output_info: Vec<OutputInfo> = Vec::new();
    for (r, (runner, iterations)) in runners.iter().zip(&per_runner).enumerate() {
        let total = totals[r];
        sinks.line(&format!(
            "[I] {} | Completed {} iteration(s) in {} ms | Average inference time: {} ms.",
            runner.name,
            iterations.len(),
            fmt_g(total * 1e3, 4),
            fmt_g(total * 1e3 / iterations.len().max(1) as f64, 4)
        ));
        if config.profile {
            (sinks.log)(&profiles[r].log(iterations.len().max(1)));
        }
        let info: Vec<OutputInfo> = iterations
            .first()
            .map(|it| {
                it.outputs
                    .iter()
                    .map(|(name, t)| OutputInfo {
                        name: name.clone(),
                        dtype: t.dtype().to_string(),
                        shape: t.shape().to_vec(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        for o in &info {
            sinks.line(&format!(
                "[I]     output '{}' (dtype={}, shape={})",
                o.name,
                o.dtype,
                fmt_shape(&o.shape)
            ));
        }
        if output_info.is_empty() {
            output_info = info;
        }
    }
    if let Some(p) = &config.save_inputs {
        save_inputs(p, &sets)?;
        sinks.line(&format!("[I] Saved inputs to {}", p.display()));
    }
    let results = RunResults {
        runners: runners
            .iter()
            .map(|r| r.name.clone())
            .zip(per_runner)
            .collect(),
    };
    if let Some(p) = &config.save_outputs {
        polygraphy::save_run_results(p, &results)?;
        sinks.line(&format!("[I] Saved outputs to {}", p.display()));
    }

    // A failing layer fails the run, as Polygraphy's comparison of marked outputs does.
    let mut passed = layer_report.as_ref().is_none_or(|lr| lr.passed);
    let validation = config.validate.then(|| {
        let mut all = Validation {
            passed: true,
            invalid: Vec::new(),
        };
        for (name, iters) in &results.runners {
            let v = validate(&mut |t| (sinks.log)(t), name, iters);
            all.passed &= v.passed;
            all.invalid.extend(v.invalid);
        }
        passed &= all.passed;
        all
    });
    // Every run is compared with the next one: live runners in command-line order, then the
    // loaded runs (Polygraphy's default comparisons).
    let any_marked = runners.iter().any(|r| r.marked.is_some());
    let mut runs: Vec<(String, &[IterationResult], String, bool)> = results
        .runners
        .iter()
        .map(|(n, it)| (n.clone(), it.as_slice(), "this run".to_string(), true))
        .collect();
    for (p, r) in &loaded {
        for (n, it) in &r.runners {
            runs.push((n.clone(), it.as_slice(), p.display().to_string(), false));
        }
    }
    let mut comparisons = Vec::new();
    for pair in runs.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if b.1.is_empty() {
            return Err(Error::Invalid(format!(
                "{}: runner '{}' has no iterations",
                b.2, b.0
            )));
        }
        let opts = Pair {
            criterion: &criterion,
            // Runs with marked tensors, or two runs of this command, compare the tensors they
            // share (Polygraphy's behaviour); a golden file must match the model's outputs.
            allow_missing: config.allow_missing || any_marked || (a.3 && b.3),
            verbose: config.verbose,
            fail_fast: config.fail_fast,
        };
        let c = compare_runs(&mut |t| (sinks.log)(t), &a.0, a.1, &b.0, b.1, &b.2, &opts)?;
        passed &= c.passed;
        comparisons.push(c);
    }
    if let (Some(p), Some(c)) = (&config.save_error_metrics, comparisons.first()) {
        let json = serde_json::to_vec_pretty(c)
            .map_err(|e| Error::Invalid(format!("serializing error metrics: {e}")))?;
        crate::data::write_atomic(p, &json)?;
        sinks.line(&format!("[I] Saved error metrics to {}", p.display()));
    }
    let summary = RunSummary {
        model: config.model.display().to_string(),
        runner: runner_name,
        passed,
        precision: precision_summary,
        iterations: feeds.len(),
        runtime_s: started.elapsed().as_secs_f64(),
        command: config.command.clone(),
        outputs: output_info,
        validation,
        comparison: comparisons.into_iter().next(),
        layerwise: layer_report,
    };
    if let Some(p) = &config.report {
        html_report(&summary, &criterion)
            .write(p)
            .map_err(|e| Error::Invalid(format!("--report: {e}")))?;
        sinks.line(&format!("[I] Saved report to {}", p.display()));
    }
    Ok(Outcome { summary, results })
}

/// A generation from `first` (a prompt's first-step feeds) under `plan`, or one run when
/// there is no decoder: its outputs.
fn generate(
    interp: &Interpreter,
    decoder: Option<&Decoder>,
    first: &Feeds,
    plan: Option<&PreparedPlan>,
) -> Result<Vec<(String, crate::Tensor)>> {
    let opts = RunOptions::default();
    let mut once = |_: usize, f: &Feeds| {
        Ok(match plan {
            Some(p) => interp.run_plan(f, &opts, p)?,
            None => interp.run_with(f, &opts)?,
        }
        .outputs)
    };
    match decoder {
        Some(d) => d.generate(first.clone(), &mut once),
        None => once(0, first),
    }
}

/// `--save-inputs`: Polygraphy JSON, or `.npz` (one input set).
fn save_inputs(p: &Path, feeds: &[Feeds]) -> Result<()> {
    if !p.extension().is_some_and(|e| e.eq_ignore_ascii_case("npz")) {
        return polygraphy::save_inputs(p, feeds);
    }
    if feeds.len() != 1 {
        return Err(Error::Invalid(format!(
            "{}: .npz holds one input set, but there are {} (use a .json file)",
            p.display(),
            feeds.len()
        )));
    }
    let items: Vec<_> = feeds[0]
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    npz::write_npz(p, &items)
}

/// The outputs of every input set in FP32 or under a precision plan, and with `mark_all`
/// every node output after the graph outputs (in execution order): the Python API's
/// `mixprec.run`. Notes go to `events`, a calibration's progress to `progress`.
#[allow(clippy::too_many_arguments)]
pub fn outputs(
    model: &Path,
    inputs: &Inputs,
    precision: &PrecisionOptions,
    mark_all: bool,
    decode: Option<usize>,
    events: &mut dyn FnMut(Event),
    progress: &dyn Progress,
) -> Result<Vec<Outputs>> {
    let model = load_model(model)?;
    let graph = &model.graph;
    let decoder =
        match decode {
            Some(_) if mark_all => return Err(Error::Invalid(
                "decode gives the generated tokens and logits: it cannot be combined with mark_all"
                    .into(),
            )),
            Some(n) => Some(Decoder::new(graph, n)?),
            None => None,
        };
    let feeds = inputs.first_runs(graph, decoder.as_ref(), events)?;
    let interp = Interpreter::new(graph)?;
    let prepared = if precision.any() {
        let plan = precision.plan(graph, events)?;
        let amax = ranges_for_plan(&interp, &plan, precision, &feeds, events, progress)?;
        let shapes = crate::exec::feed_shapes(&feeds[0]);
        Some(precision.prepare(graph, &plan, amax.as_ref(), &shapes)?)
    } else {
        None
    };
    let opts = RunOptions {
        keep_intermediates: mark_all,
    };
    let mut all = Vec::with_capacity(feeds.len());
    for f in &feeds {
        if decoder.is_some() {
            all.push(generate(&interp, decoder.as_ref(), f, prepared.as_ref())?);
            continue;
        }
        let mut r = match &prepared {
            Some(p) => interp.run_plan(f, &opts, p)?,
            None => interp.run_with(f, &opts)?,
        };
        let mut outputs = std::mem::take(&mut r.outputs);
        if mark_all {
            for name in graph.nodes.iter().flat_map(|n| &n.outputs) {
                if outputs.iter().all(|(n, _)| n != name) {
                    if let Some(t) = r.intermediates.remove(name) {
                        outputs.push((name.clone(), t));
                    }
                }
            }
        }
        all.push(outputs);
    }
    Ok(all)
}
