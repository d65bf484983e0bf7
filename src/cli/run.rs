//! `mixprec run`: FP32 inference with Polygraphy's data options, saving and comparing outputs.

use super::compare_args::CompareArgs;
use super::precision_args::{precision_counts_line, precision_table, PrecisionArgs};
use crate::compare::layerwise::{layerwise, table as layerwise_table};
use crate::compare::report::{self, Log};
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
            return Ok(all);
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
    /// Print the precision every layer ran in.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Layer-wise comparison (Polygraphy's `--trt-outputs mark all`): compare every layer's
    /// output with the FP32 reference run on the first input set, in topological order, with
    /// the error each layer adds over its inputs' error (the growth); uses --atol/--rtol/
    /// --check-error-stat per layer.
    #[arg(long = "mark-all")]
    mark_all: bool,
    /// With --mark-all: stop at the first layer that fails.
    #[arg(long = "fail-fast")]
    fail_fast: bool,
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let started = Instant::now();
    let criterion = args.compare.criterion()?;
    // Read the golden file first: a bad file should fail before a long run.
    let golden = match &args.load_outputs {
        Some(p) => Some(polygraphy::load_run_results(p)?),
        None => None,
    };
    let model = load_model(&args.model)?;
    let graph = &model.graph;
    let feeds = args.data.feeds(graph)?;
    let interp = Interpreter::new(graph)?;
    let prepared = if args.precision.any() {
        let plan = args.precision.plan(graph)?;
        let amax = super::ranges::ranges_for_plan(&interp, &plan, &args.precision, &feeds)?;
        println!("[I] {}", precision_counts_line(graph, &plan));
        if args.verbose {
            print!("{}", precision_table(graph, &plan));
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

    let mut layers_failed = false;
    if args.mark_all {
        let Some(first) = feeds.first() else {
            anyhow::bail!("--mark-all needs at least one input set");
        };
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let reference = interp.run_with(first, &keep)?;
        let candidate = match &prepared {
            Some(p) => interp.run_plan(first, &keep, p)?,
            None => interp.run_with(first, &keep)?,
        };
        let rows = layerwise(
            graph,
            &reference.intermediates,
            &candidate.intermediates,
            &criterion,
            prepared.as_ref().map(|p| &p.plan),
            args.fail_fast,
        );
        let stat = criterion.stat.default.name();
        println!(
            "[I] Layer-wise comparison (iteration 0): {runner_name} vs. FP32 reference | Checking {stat} error per layer"
        );
        print!("{}", layerwise_table(&rows, stat));
        match rows.iter().find(|r| !r.passed) {
            Some(r) => {
                layers_failed = true;
                println!(
                    "[E] First failing layer: #{} '{}' ({}), output '{}': required tolerance [abs={}] OR [rel={}]",
                    r.index,
                    r.layer,
                    r.op,
                    r.output,
                    fmt_g(r.required_atol, 5),
                    fmt_g(r.required_rtol, 5)
                );
            }
            None => println!(
                "[I] PASSED | All {} compared layers are within tolerance",
                rows.len()
            ),
        }
    }

    let mut iterations = Vec::with_capacity(feeds.len());
    let mut total = 0.0;
    for f in &feeds {
        let start = Instant::now();
        let result = match &prepared {
            Some(p) => interp.run_plan(f, &Default::default(), p)?,
            None => interp.run(f)?,
        };
        let secs = start.elapsed().as_secs_f64();
        total += secs;
        iterations.push(IterationResult {
            outputs: result.outputs,
            runtime: secs,
            runner_name: runner_name.clone(),
        });
    }
    println!(
        "[I] {} | Completed {} iteration(s) in {} ms | Average inference time: {} ms.",
        runner_name,
        iterations.len(),
        fmt_g(total * 1e3, 4),
        fmt_g(total * 1e3 / iterations.len().max(1) as f64, 4)
    );
    if let Some(it) = iterations.first() {
        for (name, t) in &it.outputs {
            println!(
                "[I]     output '{name}' (dtype={}, shape={})",
                t.dtype(),
                fmt_shape(t.shape())
            );
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
        println!("[I] Saved inputs to {}", p.display());
    }
    let results = RunResults {
        runners: vec![(runner_name.clone(), iterations)],
    };
    if let Some(p) = &args.save_outputs {
        polygraphy::save_run_results(p, &results)?;
        println!("[I] Saved outputs to {}", p.display());
    }

    // A failing layer fails the run, as Polygraphy's comparison of marked outputs does.
    let mut passed = !layers_failed;
    if args.validate {
        passed &= validate(&results.runners[0].0, &results.runners[0].1);
    }
    if let Some(golden) = golden {
        let path = args.load_outputs.as_ref().expect("golden implies a path");
        let opts = CompareOptions {
            criterion: &criterion,
            allow_missing: args.allow_missing,
            verbose: args.verbose,
            save_error_metrics: args.save_error_metrics.as_deref(),
        };
        passed &= compare_with_golden(&runner_name, &results.runners[0].1, &golden, path, &opts)?;
    } else if args.save_error_metrics.is_some() {
        bail!("--save-error-metrics needs golden outputs to compare with (--load-outputs)");
    }
    let command: Vec<String> = std::env::args().collect();
    println!(
        "[{}] {} | Runtime: {:.3}s | Command: {}",
        if passed { "I" } else { "E" },
        if passed { "PASSED" } else { "FAILED" },
        started.elapsed().as_secs_f64(),
        command.join(" ")
    );
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `--validate`: every output of every iteration must be free of NaN and Inf.
fn validate(runner: &str, iterations: &[IterationResult]) -> bool {
    let mut log = Log::default();
    log.info(0, &format!("Output Validation | Runners: ['{runner}']"));
    let mut all = true;
    for it in iterations {
        for (name, t) in &it.outputs {
            match t.to_f64_vec() {
                Some(v) => all &= report::validate_output(&mut log, runner, name, &v, t.shape()),
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
    if all {
        log.info(1, "PASSED | Output Validation");
    } else {
        log.error(1, "FAILED | Output Validation");
    }
    print!("{}", log.text);
    all
}

struct CompareOptions<'a> {
    criterion: &'a Criterion,
    allow_missing: bool,
    verbose: bool,
    save_error_metrics: Option<&'a Path>,
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

#[derive(serde::Serialize)]
struct ErrorMetricsFile<'a> {
    runner: &'a str,
    golden_runner: &'a str,
    golden_file: String,
    passed: bool,
    passed_iterations: usize,
    total_iterations: usize,
    iterations: Vec<IterationMetrics>,
}

/// Compares every iteration with the golden runner's iteration of the same index (a single
/// golden iteration serves them all), logging as Polygraphy's Comparator does.
fn compare_with_golden(
    runner: &str,
    ours: &[IterationResult],
    golden: &RunResults,
    path: &Path,
    opts: &CompareOptions,
) -> Result<bool> {
    let Some((gname, giters)) = golden.runners.first() else {
        bail!("{}: the RunResults file holds no runner", path.display());
    };
    if giters.is_empty() {
        bail!("{}: runner '{gname}' has no iterations", path.display());
    }
    println!("[I] Accuracy Comparison | {runner} vs. {gname}");
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
        print!("{}", log.text);
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
    print!("{}", log.text);
    let all_passed = passed_iters == total;
    if let Some(p) = opts.save_error_metrics {
        let file = ErrorMetricsFile {
            runner,
            golden_runner: gname,
            golden_file: path.display().to_string(),
            passed: all_passed,
            passed_iterations: passed_iters,
            total_iterations: total,
            iterations: per_iter,
        };
        let json = serde_json::to_vec_pretty(&file).context("serializing error metrics")?;
        crate::data::write_atomic(p, &json)?;
        println!("[I] Saved error metrics to {}", p.display());
    }
    Ok(all_passed)
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
