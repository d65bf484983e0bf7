//! What `mixprec run` finds, as data: the `--json` document ([`RunSummary`]), the
//! `--save-error-metrics` file ([`ErrorMetricsFile`]), `--validate` and the layer-wise
//! (`--mark-all`) results, their Polygraphy-style log text and the HTML report. The CLI
//! decides where the text goes (`emit` callbacks) and writes the files.

use super::html::HtmlReport;
use super::layerwise::{aggregate as aggregate_layers, table as layerwise_table, LayerError};
use super::report::{self, Log, Severity};
use super::{compare_output, fmt_g, Criterion};
use crate::data::polygraphy::IterationResult;
use crate::error::{Error, Result};
use crate::tensor::fmt_shape;
use std::path::Path;

/// The layer-wise comparison of one input set.
#[derive(serde::Serialize)]
pub struct LayerIteration {
    pub iteration: usize,
    pub passed: bool,
    /// Index (in topological order) of the first failing layer.
    pub first_failing_layer: Option<usize>,
    pub layers: Vec<LayerError>,
}

impl LayerIteration {
    pub fn new(iteration: usize, layers: Vec<LayerError>) -> LayerIteration {
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
pub struct LayerReport {
    pub stat: &'static str,
    pub passed: bool,
    pub passed_iterations: usize,
    /// Input sets compared (fewer than the run's with --fail-fast).
    pub compared_iterations: usize,
    pub total_iterations: usize,
    pub iterations: Vec<LayerIteration>,
    /// Per layer the worst required tolerance and growth over the compared iterations; a
    /// layer fails when it fails in any of them.
    pub aggregate: LayerIteration,
}

impl LayerReport {
    pub fn new(stat: &'static str, iterations: Vec<LayerIteration>, total: usize) -> LayerReport {
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
pub fn layer_verdict(it: &LayerIteration, all: bool) -> (bool, String) {
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
pub fn layerwise_log(it: &LayerIteration, runner: &str, stat: &str, table: bool) -> String {
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
pub fn aggregate_log(lr: &LayerReport, runner: &str) -> String {
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
pub struct OutputInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// `--validate`'s findings.
#[derive(serde::Serialize)]
pub struct Validation {
    pub passed: bool,
    /// Outputs holding NaN or Inf.
    pub invalid: Vec<InvalidOutput>,
}

#[derive(serde::Serialize)]
pub struct InvalidOutput {
    pub iteration: usize,
    pub output: String,
    pub nan: bool,
    pub inf: bool,
}

/// Everything a run found: the `--json` document and the source of the `--report`.
#[derive(serde::Serialize)]
pub struct RunSummary {
    pub model: String,
    pub runner: String,
    pub passed: bool,
    /// The precision counts line, when a reduced precision was requested.
    pub precision: Option<String>,
    pub iterations: usize,
    pub runtime_s: f64,
    pub command: String,
    /// The model's outputs (of the first iteration).
    pub outputs: Vec<OutputInfo>,
    pub validation: Option<Validation>,
    /// With --load-outputs: the --save-error-metrics document.
    pub comparison: Option<ErrorMetricsFile>,
    /// With --mark-all.
    pub layerwise: Option<LayerReport>,
}

/// The HTML report of a run: the verdict and why, the run's facts, every iteration's output
/// comparisons, and the layer-wise plot and table.
pub fn html_report(s: &RunSummary, criterion: &Criterion) -> HtmlReport {
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
pub fn validate(
    emit: &mut dyn FnMut(&str),
    runner: &str,
    iterations: &[IterationResult],
) -> Validation {
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
    emit(&log.text);
    Validation { passed, invalid }
}

pub struct CompareOptions<'a> {
    pub criterion: &'a Criterion,
    pub allow_missing: bool,
    pub verbose: bool,
    /// Stop at the first failing output and compare no further iterations.
    pub fail_fast: bool,
}

#[derive(serde::Serialize)]
pub struct IterationMetrics {
    pub iteration: usize,
    pub passed: bool,
    pub outputs: Vec<crate::compare::OutputComparison>,
    /// Outputs that could not be compared (shape mismatch), by name.
    pub failed_to_compare: Vec<String>,
    /// With --allow-missing: golden outputs the model lacks, and model outputs the golden lacks.
    pub missing_in_model: Vec<String>,
    pub missing_in_golden: Vec<String>,
}

/// The `--save-error-metrics` document (also the `comparison` of `--json`).
#[derive(serde::Serialize)]
pub struct ErrorMetricsFile {
    pub runner: String,
    pub golden_runner: String,
    pub golden_file: String,
    pub passed: bool,
    pub passed_iterations: usize,
    pub total_iterations: usize,
    pub iterations: Vec<IterationMetrics>,
}

/// Compares every iteration with the golden runner's iteration of the same index (a single
/// golden iteration serves them all), logging as Polygraphy's Comparator does.
pub fn compare_runs(
    emit: &mut dyn FnMut(&str),
    runner: &str,
    ours: &[IterationResult],
    gname: &str,
    giters: &[IterationResult],
    source: &str,
    opts: &CompareOptions,
) -> Result<ErrorMetricsFile> {
    emit(&format!("[I] Accuracy Comparison | {runner} vs. {gname}\n"));
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
                return Err(Error::Invalid(format!(
                    "{}: golden output(s) {} are not outputs of the model (its outputs: {}); \
                     use --allow-missing to compare only the common outputs",
                    source,
                    quoted(&missing_in_model),
                    it.outputs
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            log.warn(
                1,
                &format!(
                    "Skipping golden output(s) the model does not produce: {}",
                    quoted_few(&missing_in_model)
                ),
            );
        }
        if opts.allow_missing && !missing_in_golden.is_empty() {
            log.warn(
                1,
                &format!(
                    "Skipping output(s) absent from the golden file: {}",
                    quoted_few(&missing_in_golden)
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
                .map_err(|e| Error::Invalid(format!("comparing with {source}: {e}")))?;
            report::output_comparison(&mut log, &c, runner, gname, opts.verbose);
            let ok = c.passed;
            status.push((name.clone(), ok));
            outputs.push(c);
            if opts.fail_fast && !ok {
                log.error(
                    1,
                    &format!("--fail-fast: stopping at the first failing output '{name}'"),
                );
                break;
            }
        }
        if status.is_empty() {
            return Err(Error::Invalid(format!(
                "{}: no common outputs to compare: {runner} outputs: {}; {gname} outputs: {}",
                source,
                quoted(
                    &it.outputs
                        .iter()
                        .map(|(n, _)| n.clone())
                        .collect::<Vec<_>>()
                ),
                quoted(&g.outputs.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>())
            )));
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
        emit(&log.text);
        per_iter.push(IterationMetrics {
            iteration: i,
            passed: iter_passed,
            outputs,
            failed_to_compare,
            missing_in_model,
            missing_in_golden,
        });
        if opts.fail_fast && !iter_passed {
            break;
        }
    }
    let total = per_iter.len();
    let mut log = Log::default();
    report::accuracy_summary(&mut log, runner, gname, passed_iters, total);
    emit(&log.text);
    Ok(ErrorMetricsFile {
        runner: runner.to_string(),
        golden_runner: gname.to_string(),
        golden_file: source.to_string(),
        passed: passed_iters == total,
        passed_iterations: passed_iters,
        total_iterations: total,
        iterations: per_iter,
    })
}

/// A Python list of strings: `['a', 'b']`.
pub fn py_list(names: &[String]) -> String {
    format!(
        "[{}]",
        names
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// At most 8 quoted names, then how many more (marked tensors can be thousands).
pub fn quoted_few(names: &[String]) -> String {
    if names.len() <= 8 {
        return quoted(names);
    }
    format!("{} and {} more", quoted(&names[..8]), names.len() - 8)
}

pub fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}
