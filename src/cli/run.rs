//! `mixprec run`: FP32 inference with Polygraphy's data options, saving and comparing outputs.

use super::compare_args::CompareArgs;
use super::precision_args::{
    fusion_line, fusion_table, precision_counts_line, precision_table, PrecisionArgs,
};
use super::style::{Out, StyleArgs};
use super::trt_args::TrtOnlyArgs;
use crate::compare::fmt_g;
use crate::compare::layerwise::layerwise;
use crate::compare::run_report::{
    aggregate_log, compare_runs, html_report, layerwise_log, validate, CompareOptions,
    LayerIteration, LayerReport, OutputInfo, RunSummary, Validation,
};
use crate::data::loader::{self, DataLoaderConfig};
use crate::data::npz;
use crate::data::polygraphy::{self, IterationResult, RunResults};
use crate::data::script::DataLoaderScript;
use crate::exec::Feeds;
use crate::exec::RunOptions;
use crate::golden::GoldenFile;
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
    /// Number of generated input sets (default 1); with --data-loader-script, the most feed
    /// dicts taken from the script (default: all it yields).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// Shapes for inputs with dynamic dimensions: `name:[1,3,224,224]`.
    #[arg(long = "input-shapes", num_args = 1.., value_name = "SHAPE")]
    pub input_shapes: Vec<String>,
    /// Load inputs instead of generating them: Polygraphy JSON (a list of feed dicts, or a
    /// directory of per-iteration files) or `.npz`.
    #[arg(long = "load-inputs", alias = "load-input-data", num_args = 1.., value_name = "FILE")]
    pub load_inputs: Vec<PathBuf>,
    /// Polygraphy's data-loader script: `file.py[:func]`, where `func` (default `load_data`)
    /// returns an iterable of feed dicts `{input name: numpy array}`. Runs in a child Python
    /// (`MIXPREC_PYTHON`, else `python3`) that streams the arrays back.
    #[arg(long = "data-loader-script", value_name = "FILE.py[:FUNC]")]
    pub data_loader_script: Option<String>,
    /// Polygraphy's older way to name the script's function (`--data-loader-script f.py:func`
    /// is the same).
    #[arg(long = "data-loader-func-name", value_name = "FUNC", hide = true)]
    pub data_loader_func_name: Option<String>,
    #[command(flatten)]
    pub trt: Box<TrtOnlyArgs>,
}

impl DataArgs {
    /// Refuses TensorRT options without a counterpart and prints one warning naming those
    /// with no effect. Every command with these options calls it first.
    pub fn check_trt_options(&self) -> Result<()> {
        if let Some(w) = self.trt.check()? {
            eprintln!("warning: {w}");
        }
        Ok(())
    }

    /// The input sets: loaded, from a data-loader script, or generated from the model's
    /// declared inputs.
    /// The input shapes `--input-shapes` and `--trt-opt-shapes` set (TensorRT's
    /// optimization-profile shapes: opt is the shape the engine is tuned for).
    pub fn shape_overrides(&self) -> Result<std::collections::BTreeMap<String, Vec<usize>>> {
        let mut shapes = std::collections::BTreeMap::new();
        for s in self.trt.trt_opt_shapes.iter().chain(&self.input_shapes) {
            shapes.extend(loader::parse_input_shapes(s)?);
        }
        Ok(shapes)
    }

    pub fn feeds(&self, graph: &crate::Graph) -> Result<Vec<Feeds>> {
        if let Some(spec) = &self.data_loader_script {
            if !self.load_inputs.is_empty() {
                bail!("give either --data-loader-script or --load-inputs, not both");
            }
            let mut script = DataLoaderScript::parse(spec);
            if let Some(f) = &self.data_loader_func_name {
                script.func = f.clone();
            }
            let python = std::env::var_os("MIXPREC_PYTHON")
                .map_or_else(|| PathBuf::from("python3"), PathBuf::from);
            let limit = self.iterations.filter(|&n| n > 0);
            let (feeds, log) = script.load(&python, &graph.inputs, limit)?;
            if !log.trim().is_empty() {
                eprint!("{log}");
            }
            return Ok(feeds);
        }
        if !self.load_inputs.is_empty() {
            let mut all = Vec::new();
            for p in &self.load_inputs {
                // By content: JSON, or .npz, whatever the file is named.
                all.extend(crate::data::load_input_sets(p)?);
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
        cfg.iterations = self.iterations.unwrap_or(1).max(1);
        for r in &self.val_range {
            loader::parse_val_range_into(r, &mut cfg.val_ranges)?;
        }
        cfg.input_shapes = self.shape_overrides()?;
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
    /// Save every runner's outputs (every marked tensor) as a Polygraphy RunResults JSON
    /// (loadable by `polygraphy run --load-outputs`); a path without an extension is a
    /// directory with one JSON per iteration, as Polygraphy 0.53 writes it.
    #[arg(long = "save-outputs", alias = "save-results", value_name = "FILE")]
    save_outputs: Option<PathBuf>,
    /// Compare against saved results (RunResults JSON files or per-iteration directories, e.g.
    /// from `polygraphy run --save-outputs`): each run is compared with the next one, live
    /// runners first, as Polygraphy does.
    #[arg(long = "load-outputs", alias = "load-results", num_args = 1.., value_name = "FILE")]
    load_outputs: Vec<PathBuf>,
    /// Polygraphy's ONNX-Runtime runner: mixprec's FP32 reference interpreter.
    #[arg(long)]
    onnxrt: bool,
    /// Polygraphy's TensorRT runner: the emulated engine under --fp16/--bf16/--fp8/--int8/
    /// --layer-precisions (float32 without them). With --onnxrt too, the runs are compared in
    /// command-line order (`--trt ... --onnxrt`: TensorRT against ONNX-Runtime).
    #[arg(long)]
    trt: bool,
    /// Tensors the --trt runner returns: names, or `mark all` for every layer's output
    /// (in topological order). They are compared, printed and saved like outputs.
    #[arg(long = "trt-outputs", num_args = 1.., value_name = "TENSOR")]
    trt_outputs: Vec<String>,
    /// Tensors left out of --trt-outputs mark all.
    #[arg(long = "trt-exclude-outputs", num_args = 1.., value_name = "TENSOR")]
    trt_exclude_outputs: Vec<String>,
    /// Tensors the --onnxrt runner returns: names, or `mark all`.
    #[arg(long = "onnx-outputs", num_args = 1.., value_name = "TENSOR")]
    onnx_outputs: Vec<String>,
    /// Tensors left out of --onnx-outputs mark all.
    #[arg(long = "onnx-exclude-outputs", num_args = 1.., value_name = "TENSOR")]
    onnx_exclude_outputs: Vec<String>,
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
    /// Name of the runner in saved RunResults (default: mixprec-<precision>-runner; with
    /// --trt/--onnxrt Polygraphy's `trt-runner-N0-<date>-<time>`).
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
    /// Stop at the first output (with marked tensors: the first layer, in topological order)
    /// that fails, and compare no further input sets; with --mark-all, at the first failing layer.
    #[arg(long = "fail-fast")]
    fail_fast: bool,
    /// Time every layer (as ORT's profiler or trtexec --dumpProfile): per runner, the layers
    /// by average time per iteration, then the totals per op type. Layers that ran inside
    /// another as its epilogue are listed with it. The first iteration includes one-time work
    /// (weights packed for the kernels): pass --warm-up or several iterations.
    #[arg(long)]
    profile: bool,
    /// Runs of every runner on the first input set before the timed ones (Polygraphy's
    /// `--warm-up`): their results are discarded, and one-time work (weights packed for the
    /// kernels) leaves the reported times and --profile.
    #[arg(long = "warm-up", value_name = "N", default_value_t = 0)]
    warm_up: usize,
    /// Write a self-contained HTML report (verdict, output comparisons with histograms,
    /// layer-wise plot and table) to this file.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Print one JSON document on stdout (verdict, comparisons, layer-wise rows) instead of
    /// the log; see docs/compare.md for its fields.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum RunnerKind {
    /// The FP32 reference interpreter (Polygraphy's `--onnxrt`).
    Onnxrt,
    /// The emulated engine under the precision plan (Polygraphy's `--trt`).
    Trt,
}

/// One runner of this command.
struct Runner {
    kind: RunnerKind,
    name: String,
    /// The tensors it returns, in order; None: the graph outputs.
    marked: Option<Vec<String>>,
}

/// Whether `--trt` comes before `--onnxrt` on the command line (Polygraphy runs and compares
/// runners in that order).
pub fn trt_first(matches: &clap::ArgMatches) -> bool {
    match (matches.index_of("trt"), matches.index_of("onnxrt")) {
        (Some(t), Some(o)) => t < o,
        _ => true,
    }
}

/// Polygraphy's runner name: `<prefix>-N<count>-<%x>-<%X>` in local time
/// (e.g. `trt-runner-N0-04/01/24-15:29:00`).
fn polygraphy_runner_name(prefix: &str) -> String {
    format!("{prefix}-N0-{}", polygraphy_stamp())
}

/// The local date and time as Polygraphy's `time.strftime('%x')-time.strftime('%X')` in the C
/// locale: `MM/DD/YY-HH:MM:SS`.
pub fn polygraphy_stamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as libc::time_t;
    // SAFETY: localtime_r writes into the zeroed struct we own; `now` outlives the call.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            let secs = now as i64;
            tm.tm_hour = ((secs / 3600) % 24) as i32;
            tm.tm_min = ((secs / 60) % 60) as i32;
            tm.tm_sec = (secs % 60) as i32;
        }
        tm
    };
    format!(
        "{:02}/{:02}/{:02}-{:02}:{:02}:{:02}",
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_year.rem_euclid(100),
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// The tensors `--trt-outputs`/`--onnx-outputs` select: `mark all` (every layer output in
/// topological order, less `exclude`) or names; None when no option was given.
fn marked_tensors(
    graph: &crate::Graph,
    spec: &[String],
    exclude: &[String],
    flag: &str,
) -> Result<Option<Vec<String>>> {
    if spec.is_empty() {
        if !exclude.is_empty() {
            bail!("{flag}-exclude-outputs needs {flag}-outputs mark all");
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
    let known = |n: &str| produced.contains(&n) || graph.outputs.iter().any(|o| o.name == n);
    for n in exclude {
        if !known(n) {
            bail!("{flag}-exclude-outputs: the model has no tensor '{n}'");
        }
    }
    if mark_all {
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
        if let Some(extra) = spec.get(2) {
            bail!("{flag}-outputs mark all: unexpected '{extra}' after 'mark all'");
        }
        return Ok(Some(names));
    }
    for n in spec {
        if !known(n) {
            bail!(
                "{flag}-outputs: the model has no tensor '{n}' (use tensor names, or `mark all`)"
            );
        }
    }
    if !exclude.is_empty() {
        bail!("{flag}-exclude-outputs only applies to {flag}-outputs mark all");
    }
    Ok(Some(spec.to_vec()))
}

/// A runner's outputs: the marked tensors (from the kept intermediates), or the graph outputs.
fn select_outputs(
    result: crate::exec::RunResult,
    marked: Option<&Vec<String>>,
) -> Vec<(String, crate::tensor::Tensor)> {
    match marked {
        None => result.outputs,
        Some(names) => {
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
    }
}

/// One layer of the `--profile` table: its path (subgraph layers as `If_0/then_branch/Add`),
/// op type, the op types that ran inside it as its epilogue, and its summed time.
struct ProfiledLayer {
    path: String,
    op_type: String,
    fused_ops: Vec<String>,
    seconds: f64,
}

/// The `--profile` table: layers by average milliseconds per iteration (the layers that ran
/// inside one as its epilogue after its name), then the totals per op type.
fn profile_log(layers: &[ProfiledLayer], iterations: usize) -> String {
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

pub fn run(args: RunArgs, trt_first: bool) -> Result<ExitCode> {
    let started = Instant::now();
    let out = Out::new(&args.style, args.json);
    args.data.check_trt_options()?;
    let criterion = args.compare.criterion()?;
    // Read the golden files first: a bad file should fail before a long run.
    let mut loaded: Vec<(PathBuf, RunResults)> = Vec::new();
    for p in &args.load_outputs {
        loaded.push((p.clone(), GoldenFile::load(p)?.results));
    }
    let polygraphy_style = args.onnxrt || args.trt;
    // `--fusion tensorrt` alone also runs the emulated engine: a Q/DQ model runs TensorRT's
    // quantized kernels (docs/numerics.md, "Q/DQ under TensorRT").
    let fused = args.precision.fusion_model()? != crate::precision::fusion::FusionModel::None;
    let kinds: Vec<RunnerKind> = match (args.onnxrt, args.trt) {
        (true, true) if trt_first => vec![RunnerKind::Trt, RunnerKind::Onnxrt],
        (true, true) => vec![RunnerKind::Onnxrt, RunnerKind::Trt],
        (true, false) => vec![RunnerKind::Onnxrt],
        (false, true) => vec![RunnerKind::Trt],
        (false, false) if args.precision.any() || fused => vec![RunnerKind::Trt],
        (false, false) => vec![RunnerKind::Onnxrt],
    };
    let live_runs = kinds.len();
    if args.save_error_metrics.is_some() && live_runs + loaded.len() < 2 {
        bail!("--save-error-metrics needs two runs to compare (--onnxrt and --trt, or --load-outputs)");
    }
    if args.runner_name.is_some() && live_runs > 1 {
        bail!("--runner-name names a single runner; with --trt and --onnxrt the names are Polygraphy's");
    }
    if args.trt && !args.precision.any() && !fused {
        out.line("[W] --trt without --fp16/--bf16/--fp8/--int8/--layer-precisions: the emulated engine runs in float32");
    }
    if args.onnxrt && !args.trt && args.precision.any() {
        out.line("[W] precision options (--fp16, --int8, --layer-precisions, ...) apply to the --trt runner; --onnxrt runs in float32");
    }
    let model = load_model(&args.model)?;
    let graph = &model.graph;
    let trt_marked = marked_tensors(graph, &args.trt_outputs, &args.trt_exclude_outputs, "--trt")?;
    let onnx_marked = marked_tensors(
        graph,
        &args.onnx_outputs,
        &args.onnx_exclude_outputs,
        "--onnx",
    )?;
    let feeds = args.data.feeds(graph)?;
    if args.mark_all && feeds.is_empty() {
        bail!("--mark-all needs at least one input set");
    }
    let interp = Interpreter::new(graph)?;
    let mut precision_summary = None;
    let prepared = if kinds.contains(&RunnerKind::Trt) && (args.precision.any() || fused) {
        let plan = args.precision.plan(graph)?;
        let amax = super::ranges::ranges_for_plan(&interp, &plan, &args.precision, &feeds)?;
        let counts = precision_counts_line(graph, &plan);
        out.line(&format!("[I] {counts}"));
        precision_summary = Some(counts);
        if args.verbose {
            out.log(&precision_table(graph, &plan));
        }
        let shapes = match feeds.first() {
            Some(f) => crate::exec::feed_shapes(f),
            None => args.data.shape_overrides()?,
        };
        let prepared = args
            .precision
            .prepare(graph, &plan, amax.as_ref(), &shapes)?;
        if let Some(line) = fusion_line(graph, plan.fusion, prepared.regions()) {
            out.line(&format!("[I] {line}"));
            if args.verbose {
                out.log(&fusion_table(graph, prepared.regions()));
                for e in prepared.fusion_events() {
                    super::progress::print_event(e);
                }
            }
        }
        Some(prepared)
    } else {
        None
    };
    let runners: Vec<Runner> = kinds
        .iter()
        .map(|&kind| {
            let name = match (&args.runner_name, polygraphy_style) {
                (Some(n), _) => n.clone(),
                (None, true) => polygraphy_runner_name(match kind {
                    RunnerKind::Trt => "trt-runner",
                    RunnerKind::Onnxrt => "onnxrt-runner",
                }),
                (None, false) => format!(
                    "mixprec-{}-runner",
                    if args.precision.any() {
                        args.precision.global().low_precision().name()
                    } else {
                        "fp32"
                    }
                ),
            };
            // Without runner options the single runner takes whichever marking was given.
            let marked = match kind {
                RunnerKind::Trt => trt_marked
                    .clone()
                    .or_else(|| (!polygraphy_style).then(|| onnx_marked.clone()).flatten()),
                RunnerKind::Onnxrt => onnx_marked
                    .clone()
                    .or_else(|| (!polygraphy_style).then(|| trt_marked.clone()).flatten()),
            };
            Runner { kind, name, marked }
        })
        .collect();
    if args.onnxrt && !args.trt && trt_marked.is_some() {
        out.line("[W] --trt-outputs applies to the --trt runner, which this command does not run");
    }
    if args.trt && !args.onnxrt && onnx_marked.is_some() {
        out.line(
            "[W] --onnx-outputs applies to the --onnxrt runner, which this command does not run",
        );
    }
    // The runner whose layers --mark-all compares with the FP32 reference.
    let primary = runners
        .iter()
        .position(|r| r.kind == RunnerKind::Trt)
        .unwrap_or(0);
    let runner_name = runners[primary].name.clone();

    // Inference; with --mark-all every input set also runs the FP32 reference, keeping every
    // layer's output, and is compared layer by layer.
    let stat = criterion.stat.default.name();
    let mut per_runner: Vec<Vec<IterationResult>> = runners
        .iter()
        .map(|_| Vec::with_capacity(feeds.len()))
        .collect();
    let mut totals = vec![0.0f64; runners.len()];
    // --profile: per runner, per layer (by path: subgraph layers too), its summed time.
    let mut profiles: Vec<Vec<ProfiledLayer>> = runners.iter().map(|_| Vec::new()).collect();
    // Per runner: where each layer path is in its profile (a Loop body's layers recur).
    let mut profile_rows: Vec<std::collections::HashMap<String, usize>> = runners
        .iter()
        .map(|_| std::collections::HashMap::new())
        .collect();
    if args.profile && (args.mark_all || runners.iter().any(|r| r.marked.is_some())) {
        bail!(
            "--profile times plain runs: it cannot be combined with --mark-all or marked outputs"
        );
    }
    if let Some(first) = feeds.first() {
        for runner in &runners {
            let plan = match runner.kind {
                RunnerKind::Trt => prepared.as_ref(),
                RunnerKind::Onnxrt => None,
            };
            for _ in 0..args.warm_up {
                match plan {
                    Some(p) => interp.run_plan(first, &RunOptions::default(), p)?,
                    None => interp.run(first)?,
                };
            }
        }
    }
    let mut layer_iters: Vec<LayerIteration> = Vec::new();
    for (i, f) in feeds.iter().enumerate() {
        let stopped = args.fail_fast && layer_iters.iter().any(|it| !it.passed);
        let layers = args.mark_all && !stopped;
        for (r, runner) in runners.iter().enumerate() {
            let plan = match runner.kind {
                RunnerKind::Trt => prepared.as_ref(),
                RunnerKind::Onnxrt => None,
            };
            let layerwise_here = layers && r == primary;
            let opts = RunOptions {
                keep_intermediates: layerwise_here || runner.marked.is_some(),
            };
            let start = Instant::now();
            let result = match plan {
                _ if args.profile => {
                    let (result, times) = interp.run_profiled(f, plan)?;
                    for t in times {
                        let path = format!("{}{}", t.scope, t.name);
                        let layers = &mut profiles[r];
                        let row = *profile_rows[r].entry(path.clone()).or_insert_with(|| {
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
                    args.fail_fast,
                );
                let it = LayerIteration::new(i, rows);
                out.log(&layerwise_log(
                    &it,
                    &runner.name,
                    stat,
                    i == 0 || args.verbose,
                ));
                layer_iters.push(it);
            } else if args.mark_all && r == primary && i == layer_iters.len() {
                out.line(&format!(
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
    let layer_report = args
        .mark_all
        .then(|| LayerReport::new(stat, layer_iters, feeds.len()));
    if let Some(lr) = layer_report.as_ref().filter(|lr| lr.iterations.len() > 1) {
        out.log(&aggregate_log(lr, &runner_name));
    }
    let mut output_info: Vec<OutputInfo> = Vec::new();
    for (r, ((runner, iterations), total)) in
        runners.iter().zip(&per_runner).zip(&totals).enumerate()
    {
        out.line(&format!(
            "[I] {} | Completed {} iteration(s) in {} ms | Average inference time: {} ms.",
            runner.name,
            iterations.len(),
            fmt_g(total * 1e3, 4),
            fmt_g(total * 1e3 / iterations.len().max(1) as f64, 4)
        ));
        if args.profile {
            out.log(&profile_log(&profiles[r], iterations.len().max(1)));
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
            out.line(&format!(
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
        runners: runners
            .iter()
            .map(|r| r.name.clone())
            .zip(per_runner)
            .collect(),
    };
    if let Some(p) = &args.save_outputs {
        polygraphy::save_run_results(p, &results)?;
        out.line(&format!("[I] Saved outputs to {}", p.display()));
    }

    // A failing layer fails the run, as Polygraphy's comparison of marked outputs does.
    let mut passed = layer_report.as_ref().is_none_or(|lr| lr.passed);
    let validation = args.validate.then(|| {
        let mut all = Validation {
            passed: true,
            invalid: Vec::new(),
        };
        for (name, iters) in &results.runners {
            let v = validate(&mut |t| out.log(t), name, iters);
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
            bail!("{}: runner '{}' has no iterations", b.2, b.0);
        }
        let opts = CompareOptions {
            criterion: &criterion,
            // Runs with marked tensors, or two runs of this command, compare the tensors they
            // share (Polygraphy's behaviour); a golden file must match the model's outputs.
            allow_missing: args.allow_missing || any_marked || (a.3 && b.3),
            verbose: args.verbose,
            fail_fast: args.fail_fast,
        };
        let c = compare_runs(&mut |t| out.log(t), &a.0, a.1, &b.0, b.1, &b.2, &opts)?;
        passed &= c.passed;
        comparisons.push(c);
    }
    if let (Some(p), Some(c)) = (&args.save_error_metrics, comparisons.first()) {
        let json = serde_json::to_vec_pretty(c).context("serializing error metrics")?;
        crate::data::write_atomic(p, &json)?;
        out.line(&format!("[I] Saved error metrics to {}", p.display()));
    }
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
        comparison: comparisons.into_iter().next(),
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
