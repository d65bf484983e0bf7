//! `mixprec run`: FP32 inference with Polygraphy's data options, saving and comparing outputs.

use super::compare_args::CompareArgs;
use super::precision_args::{precision_counts_line, precision_table, PrecisionArgs};
use super::style::{Out, StyleArgs};
use crate::compare::html::HtmlReport;
use crate::compare::layerwise::{
    aggregate as aggregate_layers, layerwise, table as layerwise_table, LayerError,
};
use crate::compare::report::{self, Log, Severity};
use crate::compare::{compare_output, fmt_g, Criterion};
use crate::data::loader::{self, DataLoaderConfig};
use crate::data::npz;
use crate::data::polygraphy::{self, IterationResult, RunResults};
use crate::exec::Feeds;
use crate::exec::RunOptions;
use crate::tensor::fmt_shape;
use crate::{load_model, Interpreter};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Where inputs come from: Polygraphy's data-loader options.
#[derive(Args, Debug, Clone)]
pub struct DataArgs {
    /// Value range of generated inputs: `name:[lo,hi]` per input, or `[lo,hi]` for all (default [0,1]).
    #[arg(long = "val-range", num_args = 1.., value_name = "RANGE")]
    pub val_range: Vec<String>,
    /// Seed of the input generator (Polygraphy's default is 1).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Number of generated input sets.
    #[arg(long, default_value_t = 1)]
    pub iterations: usize,
    /// Shapes for inputs with dynamic dimensions: `name:[1,3,224,224]`.
    #[arg(long = "input-shapes", num_args = 1.., value_name = "SHAPE")]
    pub input_shapes: Vec<String>,
    /// Load inputs instead of generating them: Polygraphy JSON (a list of feed dicts) or `.npz`.
    #[arg(long = "load-inputs", num_args = 1.., value_name = "FILE")]
    pub load_inputs: Vec<PathBuf>,
}

impl DataArgs {
    /// The input sets: loaded, or generated from the model's declared inputs.
    pub fn feeds(&self, graph: &crate::Graph) -> Result<Vec<Feeds>> {
        if !self.load_inputs.is_empty() {
            let mut all = Vec::new();
            for p in &self.load_inputs {
                if is_npz(p) {
                    all.push(npz::read_npz(p)?.into_iter().collect());
                } else {
                    all.extend(polygraphy::load_inputs(p)?);
                }
            }
            // float8/int4/float4 inputs arrive as uint8/int8 arrays (NumPy has no such types).
            return all
                .into_iter()
                .map(|f| Ok(crate::data::npy::as_declared(f, &graph.inputs)?))
                .collect();
        }
        let mut cfg = DataLoaderConfig::default();
        if let Some(s) = self.seed {
            cfg.seed = s;
        }
        cfg.iterations = self.iterations.max(1);
        for r in &self.val_range {
            loader::parse_val_range_into(r, &mut cfg.val_ranges)?;
        }
        for s in &self.input_shapes {
            cfg.input_shapes.extend(loader::parse_input_shapes(s)?);
        }
        let (feeds, warnings) = loader::generate(&graph.inputs, &cfg)?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        Ok(feeds)
    }
}

fn is_npz(p: &Path) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case("npz"))
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The ONNX model.
    model: PathBuf,
    #[command(flatten)]
    data: DataArgs,
    /// Save the inputs used: Polygraphy JSON (loadable by `polygraphy run --load-inputs`) or `.npz`.
    #[arg(long = "save-inputs", value_name = "FILE")]
    save_inputs: Option<PathBuf>,
    /// Save the outputs as a Polygraphy RunResults JSON (loadable by `polygraphy run --load-outputs`).
    #[arg(long = "save-outputs", alias = "save-results", value_name = "FILE")]
    save_outputs: Option<PathBuf>,
    /// Compare the outputs against golden outputs from this RunResults JSON (e.g. `polygraphy run --save-outputs`).
    #[arg(long = "load-outputs", alias = "load-results", value_name = "FILE")]
    load_outputs: Option<PathBuf>,
    #[command(flatten)]
    compare: CompareArgs,
    /// Fail when an output of the model holds NaN or Inf (Polygraphy's --validate).
    #[arg(long)]
    validate: bool,
    /// Write the comparison statistics, required tolerances, metrics and verdicts of every
    /// iteration and output to this JSON file.
    #[arg(long = "save-error-metrics", value_name = "FILE")]
    save_error_metrics: Option<PathBuf>,
    /// Compare only the outputs present both in the model's results and in the golden file
    /// (warn about the others) instead of failing on a golden output the model lacks.
    #[arg(long = "allow-missing")]
    allow_missing: bool,
    /// Name of the runner in saved RunResults (default: mixprec-<precision>-runner).
    #[arg(long = "runner-name")]
    runner_name: Option<String>,
    #[command(flatten)]
    precision: PrecisionArgs,
    /// Print the precision every layer ran in, the histograms of every compared output, and
    /// with --mark-all the layer table of every iteration.
    #[arg(long, short = 'v', conflicts_with = "quiet")]
    verbose: bool,
    #[command(flatten)]
    style: StyleArgs,
    /// Layer-wise comparison (Polygraphy's `--trt-outputs mark all`): compare every layer's
    /// output with the FP32 reference run on every input set, in topological order, with
    /// the error each layer adds over its inputs' error (the growth); uses --atol/--rtol/
    /// --check-error-stat per layer. Prints the table of iteration 0 (of every iteration with
    /// --verbose), a verdict line per other iteration, and with several input sets the worst
    /// per layer over all of them.
    #[arg(long = "mark-all")]
    mark_all: bool,
    /// With --mark-all: stop at the first layer that fails (and compare no further input sets).
    #[arg(long = "fail-fast")]
    fail_fast: bool,
    /// Write a self-contained HTML report (verdict, output comparisons with histograms,
    /// layer-wise plot and table) to this file.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Print one JSON document on stdout (verdict, comparisons, layer-wise rows) instead of
    /// the log; see docs/compare.md for its fields.
    #[arg(long)]
    json: bool,
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let out = Out::new(&args.style, args.json);
    let criterion = args.compare.criterion()?;
    // Read the golden file first: a bad file should fail before a long run.
    let golden = match &args.load_outputs {
        Some(p) => Some(polygraphy::load_run_results(p)?),
        None => None,
    };
    if args.save_error_metrics.is_some() && golden.is_none() {
        bail!("--save-error-metrics needs golden outputs to compare with (--load-outputs)");
    }
    let model = load_model(&args.model)?;
    let graph = &model.graph;
    let feeds = args.data.feeds(graph)?;
    if args.mark_all && feeds.is_empty() {
        bail!("--mark-all needs at least one input set");
    }
    let interp = Interpreter::new(graph)?;
    let mut precision_summary = None;
    let prepared = if args.precision.any() {
        let plan = args.precision.plan(graph)?;
        let amax = super::ranges::ranges_for_plan(&interp, &plan, &args.precision, &feeds)?;
        let counts = precision_counts_line(graph, &plan);
        out.line(&format!("[I] {counts}"));
        precision_summary = Some(counts);
        if args.verbose {
            out.log(&precision_table(graph, &plan));
        }
        Some(args.precision.prepare(graph, &plan, amax.as_ref())?)
    } else {
        None
    };
    let runner_name = args.runner_name.clone().unwrap_or_else(|| {
        format!(
            "mixprec-{}-runner",
            if args.precision.any() {
                args.precision.global().low_precision().name()
            } else {
                "fp32"
            }
        )
    });

    // Inference; with --mark-all every input set also runs the FP32 reference, keeping every
    // layer's output, and is compared layer by layer.
    let stat = criterion.stat.default.name();
    let mut iterations = Vec::with_capacity(feeds.len());
    let mut layer_iters: Vec<LayerIteration> = Vec::new();
    let mut total = 0.0;
    for (i, f) in feeds.iter().enumerate() {
        let stopped = args.fail_fast && layer_iters.iter().any(|it| !it.passed);
        let layers = args.mark_all && !stopped;
        let opts = RunOptions {
            keep_intermediates: layers,
        };
        let start = Instant::now();
        let result = match &prepared {
            Some(p) => interp.run_plan(f, &opts, p)?,
            None => interp.run_with(f, &opts)?,
        };
        let secs = start.elapsed().as_secs_f64();
        total += secs;
        if layers {
            // Without a precision plan the run is the FP32 reference itself.
            let reference = match &prepared {
                Some(_) => Some(interp.run_with(f, &opts)?),
                None => None,
            };
            let rows = layerwise(
                graph,
                &reference.as_ref().unwrap_or(&result).intermediates,
                &result.intermediates,
                &criterion,
                prepared.as_ref().map(|p| &p.plan),
                args.fail_fast,
            );
            let it = LayerIteration::new(i, rows);
            out.log(&layerwise_log(
                &it,
                &runner_name,
                stat,
                i == 0 || args.verbose,
            ));
            layer_iters.push(it);
        } else if args.mark_all && i == layer_iters.len() {
            out.line(&format!(
                "[I] --fail-fast: layer-wise comparison stopped after iteration {}",
                i - 1
            ));
        }
        iterations.push(IterationResult {
            outputs: result.outputs,
            runtime: secs,
            runner_name: runner_name.clone(),
        });
    }
    let layer_report = args
        .mark_all
        .then(|| LayerReport::new(stat, layer_iters, feeds.len()));
    if let Some(lr) = layer_report.as_ref().filter(|lr| lr.iterations.len() > 1) {
        out.log(&aggregate_log(lr, &runner_name));
    }
    out.line(&format!(
        "[I] {} | Completed {} iteration(s) in {} ms | Average inference time: {} ms.",
        runner_name,
        iterations.len(),
        fmt_g(total * 1e3, 4),
        fmt_g(total * 1e3 / iterations.len().max(1) as f64, 4)
    ));
    let output_info: Vec<OutputInfo> = iterations
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
    for o in &output_info {
        out.line(&format!(
            "[I]     output '{}' (dtype={}, shape={})",
            o.name,
            o.dtype,
            fmt_shape(&o.shape)
        ));
    }

    if let Some(p) = &args.save_inputs {
        if is_npz(p) {
            if feeds.len() != 1 {
                bail!(
                    "{}: .npz holds one input set, but there are {} (use a .json file)",
                    p.display(),
                    feeds.len()
                );
            }
            let items: Vec<_> = feeds[0]
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            npz::write_npz(p, &items)?;
        } else {
            polygraphy::save_inputs(p, &feeds)?;
        }
        out.line(&format!("[I] Saved inputs to {}", p.display()));
    }
    let results = RunResults {
        runners: vec![(runner_name.clone(), iterations)],
    };
    if let Some(p) = &args.save_outputs {
        polygraphy::save_run_results(p, &results)?;
        out.line(&format!("[I] Saved outputs to {}", p.display()));
    }

    // A failing layer fails the run, as Polygraphy's comparison of marked outputs does.
    let mut passed = layer_report.as_ref().is_none_or(|lr| lr.passed);
    let validation = args.validate.then(|| {
        let v = validate(&out, &results.runners[0].0, &results.runners[0].1);
        passed &= v.passed;
        v
    });
    let comparison = match (&golden, &args.load_outputs) {
        (Some(golden), Some(path)) => {
            let opts = CompareOptions {
                criterion: &criterion,
                allow_missing: args.allow_missing,
                verbose: args.verbose,
            };
            let c = compare_with_golden(
                &out,
                &runner_name,
                &results.runners[0].1,
                golden,
                path,
                &opts,
            )?;
            passed &= c.passed;
            if let Some(p) = &args.save_error_metrics {
                let json = serde_json::to_vec_pretty(&c).context("serializing error metrics")?;
                crate::data::write_atomic(p, &json)?;
                out.line(&format!("[I] Saved error metrics to {}", p.display()));
            }
            Some(c)
        }
        _ => None,
    };
    let command: Vec<String> = std::env::args().collect();
    let runtime = started.elapsed().as_secs_f64();
    let summary = RunSummary {
        model: args.model.display().to_string(),
        runner: runner_name.clone(),
        passed,
        precision: precision_summary,
        iterations: feeds.len(),
        runtime_s: runtime,
        command: command.join(" "),
        outputs: output_info,
        validation,
        comparison,
        layerwise: layer_report,
    };
    if let Some(p) = &args.report {
        html_report(&summary, &criterion)
            .write(p)
            .context("--report")?;
        out.line(&format!("[I] Saved report to {}", p.display()));
    }
    if args.json {
        let json = serde_json::to_string_pretty(&summary).context("serializing --json")?;
        println!("{json}");
    }
    out.verdict(&format!(
        "[{}] {} | Runtime: {:.3}s | Command: {}",
        if passed { "I" } else { "E" },
        if passed { "PASSED" } else { "FAILED" },
        runtime,
        summary.command
    ));
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The layer-wise comparison of one input set.
#[derive(serde::Serialize)]
struct LayerIteration {
    iteration: usize,
    passed: bool,
    /// Index (in topological order) of the first failing layer.
    first_failing_layer: Option<usize>,
    layers: Vec<LayerError>,
}

impl LayerIteration {
    fn new(iteration: usize, layers: Vec<LayerError>) -> LayerIteration {
        let first = layers.iter().find(|r| !r.passed).map(|r| r.index);
        LayerIteration {
            iteration,
            passed: first.is_none(),
            first_failing_layer: first,
            layers,
        }
    }
}

/// `--mark-all` over every input set, and the worst per layer over all of them.
#[derive(serde::Serialize)]
struct LayerReport {
    stat: &'static str,
    passed: bool,
    passed_iterations: usize,
    /// Input sets compared (fewer than the run's with --fail-fast).
    compared_iterations: usize,
    total_iterations: usize,
    iterations: Vec<LayerIteration>,
    /// Per layer the worst required tolerance and growth over the compared iterations; a
    /// layer fails when it fails in any of them.
    aggregate: LayerIteration,
}

impl LayerReport {
    fn new(stat: &'static str, iterations: Vec<LayerIteration>, total: usize) -> LayerReport {
        let rows: Vec<Vec<LayerError>> = iterations.iter().map(|it| it.layers.clone()).collect();
        let aggregate = LayerIteration::new(0, aggregate_layers(&rows));
        LayerReport {
            stat,
            passed: aggregate.passed,
            passed_iterations: iterations.iter().filter(|it| it.passed).count(),
            compared_iterations: iterations.len(),
            total_iterations: total,
            iterations,
            aggregate,
        }
    }
}

/// The first failing layer's line, or the all-passed line; `all` for the aggregate over
/// several iterations.
fn layer_verdict(it: &LayerIteration, all: bool) -> (bool, String) {
    match it.layers.iter().find(|r| !r.passed) {
        Some(r) => (
            false,
            format!(
                "First failing layer{}: #{} '{}' ({}), output '{}': required tolerance [abs={}] OR [rel={}]",
                if all { " in any iteration" } else { "" },
                r.index,
                r.layer,
                r.op,
                r.output,
                fmt_g(r.required_atol, 5),
                fmt_g(r.required_rtol, 5)
            ),
        ),
        None => (
            true,
            format!(
                "PASSED | All {} compared layers are within tolerance{}",
                it.layers.len(),
                if all { " in all iterations" } else { "" }
            ),
        ),
    }
}

/// One input set's layer-wise log: the table (when `table`), or one verdict line.
fn layerwise_log(it: &LayerIteration, runner: &str, stat: &str, table: bool) -> String {
    let mut log = Log::default();
    let head = format!("Layer-wise comparison (iteration {})", it.iteration);
    if table {
        log.info(
            0,
            &format!("{head}: {runner} vs. FP32 reference | Checking {stat} error per layer"),
        );
        log.text += &layerwise_table(&it.layers, stat);
        let (ok, line) = layer_verdict(it, false);
        log.log(Severity::of(ok), 0, &line);
    } else {
        let (ok, line) = layer_verdict(it, false);
        let line = if ok { line } else { format!("FAILED | {line}") };
        log.log(Severity::of(ok), 0, &format!("{head}: {line}"));
    }
    log.text
}

/// The aggregate over several input sets: the worst per layer, and the summary line.
fn aggregate_log(lr: &LayerReport, runner: &str) -> String {
    let n = lr.iterations.len();
    let mut log = Log::default();
    log.info(
        0,
        &format!(
            "Layer-wise comparison (all {n} iterations, worst per layer): {runner} vs. FP32 reference | Checking {} error per layer",
            lr.stat
        ),
    );
    log.text += &layerwise_table(&lr.aggregate.layers, lr.stat);
    let (ok, line) = layer_verdict(&lr.aggregate, true);
    log.log(Severity::of(ok), 0, &line);
    let rate = lr.passed_iterations as f64 / n.max(1) as f64 * 100.0;
    log.log(
        Severity::of(ok),
        0,
        &format!(
            "Layer-wise Summary | Passed: {}/{n} iterations | Pass Rate: {rate:.2}%",
            lr.passed_iterations
        ),
    );
    log.text
}

#[derive(serde::Serialize)]
struct OutputInfo {
    name: String,
    dtype: String,
    shape: Vec<usize>,
}

/// `--validate`'s findings.
#[derive(serde::Serialize)]
struct Validation {
    passed: bool,
    /// Outputs holding NaN or Inf.
    invalid: Vec<InvalidOutput>,
}

#[derive(serde::Serialize)]
struct InvalidOutput {
    iteration: usize,
    output: String,
    nan: bool,
    inf: bool,
}

/// Everything a run found: the `--json` document and the source of the `--report`.
#[derive(serde::Serialize)]
struct RunSummary {
    model: String,
    runner: String,
    passed: bool,
    /// The precision counts line, when a reduced precision was requested.
    precision: Option<String>,
    iterations: usize,
    runtime_s: f64,
    command: String,
    /// The model's outputs (of the first iteration).
    outputs: Vec<OutputInfo>,
    validation: Option<Validation>,
    /// With --load-outputs: the --save-error-metrics document.
    comparison: Option<ErrorMetricsFile>,
    /// With --mark-all.
    layerwise: Option<LayerReport>,
}

/// The HTML report of a run: the verdict and why, the run's facts, every iteration's output
/// comparisons, and the layer-wise plot and table.
fn html_report(s: &RunSummary, criterion: &Criterion) -> HtmlReport {
    let name = Path::new(&s.model)
        .file_name()
        .map_or_else(|| s.model.clone(), |n| n.to_string_lossy().into_owned());
    let mut r = HtmlReport::new(&format!("mixprec run {name}"));
    let mut details = Vec::new();
    let mut checks = Vec::new();
    if let Some(c) = &s.comparison {
        checks.push(format!(
            "{}/{} iterations match the golden outputs",
            c.passed_iterations, c.total_iterations
        ));
        details.push(format!(
            "Accuracy: {} vs. {} ({}): passed {}/{} iterations",
            c.runner, c.golden_runner, c.golden_file, c.passed_iterations, c.total_iterations
        ));
        for it in c.iterations.iter().filter(|it| !it.passed) {
            let failed: Vec<String> = it
                .outputs
                .iter()
                .filter(|o| !o.passed)
                .map(|o| {
                    format!(
                        "'{}' (needs [abs={}] OR [rel={}] at {} error)",
                        o.name,
                        fmt_g(o.required_atol, 5),
                        fmt_g(o.required_rtol, 5),
                        o.stat.name()
                    )
                })
                .chain(
                    it.failed_to_compare
                        .iter()
                        .map(|n| format!("'{n}' (shape mismatch)")),
                )
                .collect();
            details.push(format!(
                "Iteration {}: mismatched outputs: {}",
                it.iteration,
                failed.join(", ")
            ));
        }
    }
    if let Some(lr) = &s.layerwise {
        let (ok, line) = layer_verdict(&lr.aggregate, lr.iterations.len() > 1);
        checks.push(if ok {
            "all layers within tolerance".to_string()
        } else {
            "a layer exceeds the tolerance".to_string()
        });
        details.push(format!(
            "Layer-wise: {}",
            line.trim_start_matches("PASSED | ")
        ));
    }
    if let Some(v) = &s.validation {
        checks.push(if v.passed {
            "outputs free of NaN and Inf".to_string()
        } else {
            "NaN or Inf in the outputs".to_string()
        });
        for o in &v.invalid {
            details.push(format!(
                "Validation: output '{}' of iteration {} holds {}",
                o.output,
                o.iteration,
                match (o.nan, o.inf) {
                    (true, true) => "NaN and Inf",
                    (true, false) => "NaN",
                    _ => "Inf",
                }
            ));
        }
    }
    if checks.is_empty() {
        checks.push("nothing was checked (use --load-outputs, --mark-all or --validate)".into());
    }
    r.verdict(
        s.passed,
        &format!(" {} — {}", s.runner, checks.join("; ")),
        &details,
    );
    let tol = |p: &crate::compare::PerOutput<f64>| {
        std::iter::once(fmt_g(p.default, 5))
            .chain(
                p.per_output
                    .iter()
                    .map(|(k, v)| format!("{k}:{}", fmt_g(*v, 5))),
            )
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut facts = vec![
        vec!["model".to_string(), s.model.clone()],
        vec!["runner".to_string(), s.runner.clone()],
        vec![
            "precision".to_string(),
            s.precision
                .clone()
                .unwrap_or_else(|| "float32 (reference)".into()),
        ],
        vec!["input sets".to_string(), s.iterations.to_string()],
        vec![
            "criterion".to_string(),
            format!(
                "{} error, atol {}, rtol {}{}",
                criterion.stat.default.name(),
                tol(&criterion.atol),
                tol(&criterion.rtol),
                if criterion.stat.default == crate::compare::ErrorStat::Quantile {
                    format!(", quantile {}", tol(&criterion.quantile))
                } else {
                    String::new()
                }
            ),
        ],
    ];
    for o in &s.outputs {
        facts.push(vec![
            format!("output '{}'", o.name),
            format!("{} {}", o.dtype, fmt_shape(&o.shape)),
        ]);
    }
    facts.push(vec!["runtime".to_string(), format!("{:.3} s", s.runtime_s)]);
    facts.push(vec!["command".to_string(), s.command.clone()]);
    r.table("Run", &[], &facts);
    if let Some(lr) = &s.layerwise {
        let title = if lr.iterations.len() > 1 {
            format!(
                "Layer-wise comparison: worst per layer over {} iterations",
                lr.iterations.len()
            )
        } else {
            "Layer-wise comparison".to_string()
        };
        r.layer_errors(
            &title,
            &lr.aggregate.layers,
            lr.stat,
            Some(criterion.atol.default),
        );
        if lr.iterations.len() > 1 {
            let rows: Vec<Vec<String>> = lr
                .iterations
                .iter()
                .map(|it| {
                    vec![
                        it.iteration.to_string(),
                        if it.passed { "PASSED" } else { "FAILED" }.to_string(),
                        it.first_failing_layer
                            .and_then(|i| it.layers.iter().find(|r| r.index == i))
                            .map_or_else(
                                || "–".to_string(),
                                |r| format!("#{} {}", r.index, r.layer),
                            ),
                        fmt_g(
                            it.layers
                                .iter()
                                .map(|r| r.required_atol)
                                .fold(0.0, f64::max),
                            5,
                        ),
                    ]
                })
                .collect();
            r.table(
                "Layer-wise comparison per iteration",
                &[
                    "iteration",
                    "result",
                    "first failing layer",
                    "largest required abs tolerance",
                ],
                &rows,
            );
        }
    }
    if let Some(c) = &s.comparison {
        for it in &c.iterations {
            r.output_comparisons(it.iteration, &it.outputs);
            let notes: Vec<String> =
                it.failed_to_compare
                    .iter()
                    .map(|n| format!("Output '{n}': shapes differ, not compared (FAILED)"))
                    .chain(it.missing_in_model.iter().map(|n| {
                        format!("Golden output '{n}' is not produced by the model (skipped)")
                    }))
                    .chain(
                        it.missing_in_golden.iter().map(|n| {
                            format!("Output '{n}' is absent from the golden file (skipped)")
                        }),
                    )
                    .collect();
            for n in notes {
                r.paragraph(&n);
            }
        }
    }
    r
}

/// `--validate`: every output of every iteration must be free of NaN and Inf.
fn validate(out: &Out, runner: &str, iterations: &[IterationResult]) -> Validation {
    let mut log = Log::default();
    log.info(0, &format!("Output Validation | Runners: ['{runner}']"));
    let mut invalid = Vec::new();
    for (i, it) in iterations.iter().enumerate() {
        for (name, t) in &it.outputs {
            match t.to_f64_vec() {
                Some(v) => {
                    if !report::validate_output(&mut log, runner, name, &v, t.shape()) {
                        invalid.push(InvalidOutput {
                            iteration: i,
                            output: name.clone(),
                            nan: v.iter().any(|x| x.is_nan()),
                            inf: v.iter().any(|x| x.is_infinite()),
                        });
                    }
                }
                None => log.info(
                    1,
                    &format!(
                        "{runner:35} | Output: {name} has dtype {}: not checked",
                        t.dtype()
                    ),
                ),
            }
        }
    }
    let passed = invalid.is_empty();
    if passed {
        log.info(1, "PASSED | Output Validation");
    } else {
        log.error(1, "FAILED | Output Validation");
    }
    out.log(&log.text);
    Validation { passed, invalid }
}

struct CompareOptions<'a> {
    criterion: &'a Criterion,
    allow_missing: bool,
    verbose: bool,
}

#[derive(serde::Serialize)]
struct IterationMetrics {
    iteration: usize,
    passed: bool,
    outputs: Vec<crate::compare::OutputComparison>,
    /// Outputs that could not be compared (shape mismatch), by name.
    failed_to_compare: Vec<String>,
    /// With --allow-missing: golden outputs the model lacks, and model outputs the golden lacks.
    missing_in_model: Vec<String>,
    missing_in_golden: Vec<String>,
}

/// The `--save-error-metrics` document (also the `comparison` of `--json`).
#[derive(serde::Serialize)]
struct ErrorMetricsFile {
    runner: String,
    golden_runner: String,
    golden_file: String,
    passed: bool,
    passed_iterations: usize,
    total_iterations: usize,
    iterations: Vec<IterationMetrics>,
}

/// Compares every iteration with the golden runner's iteration of the same index (a single
/// golden iteration serves them all), logging as Polygraphy's Comparator does.
fn compare_with_golden(
    out: &Out,
    runner: &str,
    ours: &[IterationResult],
    golden: &RunResults,
    path: &Path,
    opts: &CompareOptions,
) -> Result<ErrorMetricsFile> {
    let Some((gname, giters)) = golden.runners.first() else {
        bail!("{}: the RunResults file holds no runner", path.display());
    };
    if giters.is_empty() {
        bail!("{}: runner '{gname}' has no iterations", path.display());
    }
    out.line(&format!("[I] Accuracy Comparison | {runner} vs. {gname}"));
    let mut per_iter = Vec::with_capacity(ours.len());
    let mut passed_iters = 0;
    for (i, it) in ours.iter().enumerate() {
        let g = &giters[i.min(giters.len() - 1)];
        let mut log = Log::default();
        log.info(0, &format!("Iteration: {i}"));
        let missing_in_model: Vec<String> = g
            .outputs
            .iter()
            .filter(|(n, _)| !it.outputs.iter().any(|(m, _)| m == n))
            .map(|(n, _)| n.clone())
            .collect();
        let missing_in_golden: Vec<String> = it
            .outputs
            .iter()
            .filter(|(n, _)| !g.outputs.iter().any(|(m, _)| m == n))
            .map(|(n, _)| n.clone())
            .collect();
        if !missing_in_model.is_empty() {
            if !opts.allow_missing {
                bail!(
                    "{}: golden output(s) {} are not outputs of the model (its outputs: {}); \
                     use --allow-missing to compare only the common outputs",
                    path.display(),
                    quoted(&missing_in_model),
                    it.outputs
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            log.warn(
                1,
                &format!(
                    "Skipping golden output(s) the model does not produce: {}",
                    quoted(&missing_in_model)
                ),
            );
        }
        if opts.allow_missing && !missing_in_golden.is_empty() {
            log.warn(
                1,
                &format!(
                    "Skipping output(s) absent from the golden file: {}",
                    quoted(&missing_in_golden)
                ),
            );
        }
        let mut outputs = Vec::new();
        let mut failed_to_compare = Vec::new();
        let mut status: Vec<(String, bool)> = Vec::new();
        for (name, out) in &it.outputs {
            let Some((_, reference)) = g.outputs.iter().find(|(n, _)| n == name) else {
                continue;
            };
            if out.shape() != reference.shape() {
                log.info(
                    1,
                    &format!(
                        "Comparing Output: '{name}' (dtype={}, shape={}) with '{name}' (dtype={}, shape={})",
                        out.dtype(),
                        fmt_shape(out.shape()),
                        reference.dtype(),
                        fmt_shape(reference.shape())
                    ),
                );
                report::shape_mismatch(&mut log, name, out.shape(), reference.shape());
                failed_to_compare.push(name.clone());
                status.push((name.clone(), false));
                continue;
            }
            let c = compare_output(name, out, reference, opts.criterion)
                .with_context(|| format!("comparing with {}", path.display()))?;
            report::output_comparison(&mut log, &c, runner, gname, opts.verbose);
            status.push((name.clone(), c.passed));
            outputs.push(c);
        }
        if status.is_empty() {
            bail!(
                "{}: no common outputs to compare: {runner} outputs: {}; {gname} outputs: {}",
                path.display(),
                quoted(
                    &it.outputs
                        .iter()
                        .map(|(n, _)| n.clone())
                        .collect::<Vec<_>>()
                ),
                quoted(&g.outputs.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>())
            );
        }
        let failed: Vec<String> = status
            .iter()
            .filter(|(_, p)| !p)
            .map(|(n, _)| n.clone())
            .collect();
        let iter_passed = failed.is_empty();
        if iter_passed {
            passed_iters += 1;
            let names: Vec<String> = status.iter().map(|(n, _)| n.clone()).collect();
            log.info(
                1,
                &format!(
                    "PASSED | All outputs matched | Outputs: {}",
                    py_list(&names)
                ),
            );
        } else {
            log.error(
                1,
                &format!("FAILED | Mismatched outputs: {}", py_list(&failed)),
            );
        }
        out.log(&log.text);
        per_iter.push(IterationMetrics {
            iteration: i,
            passed: iter_passed,
            outputs,
            failed_to_compare,
            missing_in_model,
            missing_in_golden,
        });
    }
    let total = ours.len();
    let mut log = Log::default();
    report::accuracy_summary(&mut log, runner, gname, passed_iters, total);
    out.log(&log.text);
    Ok(ErrorMetricsFile {
        runner: runner.to_string(),
        golden_runner: gname.clone(),
        golden_file: path.display().to_string(),
        passed: passed_iters == total,
        passed_iterations: passed_iters,
        total_iterations: total,
        iterations: per_iter,
    })
}

/// A Python list of strings: `['a', 'b']`.
fn py_list(names: &[String]) -> String {
    format!(
        "[{}]",
        names
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}
