//! How `debug precision` prints its answer: the layers, the deploy lines, the statistics.

use super::{Printer, SearchArgs};
use crate::compare::fmt_g;
use crate::compare::layerwise::LayerError;
use crate::inspect::si;
use crate::jobs::options::PrecisionOptions;
use crate::precision::fusion::FusionModel;
use crate::precision::Precision;
use crate::search::report::{deploy_lines, percent, DeploySetup, SearchStats};
use crate::search::{Direction, Outcome, SearchResult, SearchSpace};
use crate::Graph;
use anyhow::Result;
use std::process::ExitCode;

/// Prints the outcome; returns the exit code.
#[allow(clippy::too_many_arguments)]
pub(super) fn report(
    p: &Printer,
    args: &SearchArgs,
    graph: &Graph,
    space: &SearchSpace,
    low: &crate::precision::plan::PrecisionPlan,
    high: Precision,
    direction: Direction,
    result: &SearchResult,
    stats: &SearchStats,
    fusion: Option<FusionModel>,
    (reasons, stat): (&[LayerError], &str),
) -> Result<ExitCode> {
    let (marked, interrupted) = match &result.outcome {
        Outcome::Found(m) => (m.clone(), false),
        Outcome::Interrupted(Some(m)) => (m.clone(), true),
        Outcome::Interrupted(None) => {
            out!(
                p,
                "[W] Interrupted after {} evaluation(s), before any candidate passed",
                result.trials.len()
            );
            return Ok(ExitCode::from(130));
        }
        Outcome::NothingNeeded => {
            out!(p,
                "[I] The plan with every candidate layer in low precision already passes: no layer needs {}",
                high.name()
            );
            print_stats(p, stats, graph);
            return Ok(ExitCode::SUCCESS);
        }
        Outcome::ReferenceFails => {
            let why = result
                .trials
                .first()
                .map(|t| t.summary.as_str())
                .unwrap_or("");
            let advice = if high == Precision::Float32 {
                "the golden outputs or the tolerances are wrong for this model".to_string()
            } else {
                format!(
                    "{} is not enough for this model (try --precision float32), or the golden outputs or the tolerances are wrong",
                    high.name()
                )
            };
            out!(
                p,
                "[E] Even with all {} candidate layer(s) in {} the criterion fails ({why}): {advice}",
                space.candidates.len(),
                high.name()
            );
            return Ok(ExitCode::FAILURE);
        }
        Outcome::NotFound => {
            out!(
                p,
                "[E] Could not find a configuration that satisfied accuracy requirements."
            );
            print_stats(p, stats, graph);
            return Ok(ExitCode::FAILURE);
        }
    };
    if interrupted {
        out!(
            p,
            "[W] Interrupted after {} evaluation(s); the best passing plan so far:",
            result.trials.len()
        );
    }
    let model = args.model.display();
    match (result.contiguous_count, interrupted) {
        (Some(n), false) => out!(p,
            "[I] To achieve acceptable accuracy, try running the {} {n} layer(s) in higher precision ({})",
            match direction {
                Direction::Forward => "first",
                Direction::Reverse => "last",
            },
            high.name()
        ),
        _ => out!(p,
            "[I] To achieve acceptable accuracy, try running these {} layer(s) in higher precision ({})",
            marked.len(),
            high.name()
        ),
    }
    if let Some(f) = fusion {
        out!(
            p,
            "[I]     This answer is {}",
            match f {
                FusionModel::None => "safe on any engine (it assumes no fusion)",
                FusionModel::TensorRt => "for TensorRT with its fusions (--fusion tensorrt)",
            }
        );
    }
    super::groups::print_layers(p, graph, space, &marked, Some(high));
    print_reasons(p, reasons, stat);
    let f = space.flops_of(&marked);
    out!(
        p,
        "[I]     In {}: {} of {} candidate layers ({}), {}FLOP of {}FLOP ({})",
        high.name(),
        marked.len(),
        space.candidates.len(),
        percent(marked.len() as u64, space.candidates.len() as u64),
        si(f),
        si(space.total_flops()),
        percent(f, space.total_flops())
    );
    if let Some(t) = result.trial_of(&marked) {
        out!(p, "[I]     Achieved: {}", t.summary);
    }
    let answer = low.marking(&marked, high);
    let written = args.output.as_ref().map(|o| o.display().to_string());
    let setup = DeploySetup {
        model: &model.to_string(),
        graph,
        flags: args.precision.global(),
        answer: &answer,
        marked: &marked,
        high,
        // -o writes only a finished answer's model, and with fusion the fused answer's.
        written: written
            .as_deref()
            .filter(|_| !interrupted && fusion.is_none_or(|f| !f.is_none())),
        convert_extra: convert_extra(args, &answer, fusion),
        polygraphy_flags: args.precision.options().flags(),
        trtexec_flags: args.precision.options().trtexec_flags(),
    };
    for line in deploy_lines(&setup)? {
        out!(p, "[I]     {line}");
    }
    print_stats(p, stats, graph);
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// Why each layer of the answer is needed: its error alone in low precision and the cause.
pub(super) fn print_reasons(p: &Printer, reasons: &[LayerError], stat: &str) {
    if reasons.is_empty() {
        return;
    }
    out!(
        p,
        "[I]     Why: each layer alone back in its low precision, the rest as answered (emulated, first input set):"
    );
    for r in reasons {
        out!(
            p,
            "[I]       {} ({}, {}): {} | {stat} abs {}, growth {} | {}",
            r.layer,
            r.op,
            r.precision.map_or("carried", |p| p.name()),
            r.cause.name(),
            fmt_g(r.required_atol, 5),
            fmt_g(r.growth, 5),
            r.reason()
        );
    }
}

/// What `mixprec convert` needs besides the precisions: `--fusion` for a fused answer (the file
/// is the same; convert then prints the regions the answer assumed) and the calibration.
pub(super) fn convert_extra(
    args: &SearchArgs,
    answer: &crate::precision::plan::PrecisionPlan,
    fusion: Option<FusionModel>,
) -> Vec<String> {
    let mut w = match fusion {
        Some(f) if !f.is_none() => vec!["--fusion".to_string(), f.to_string()],
        _ => Vec::new(),
    };
    w.extend(convert_calibration(args, answer));
    w
}

/// What `mixprec convert` needs to write the answer's model exactly as `-o` would: for int8/fp8
/// layers the same activation ranges, read from the calibration cache the search read or wrote,
/// or calibrated again on the same inputs with the same algorithm.
pub(super) fn convert_calibration(
    args: &SearchArgs,
    answer: &crate::precision::plan::PrecisionPlan,
) -> Vec<String> {
    if !PrecisionOptions::needs_ranges(answer) {
        return Vec::new();
    }
    args.precision
        .options()
        .calibration_flags(Some(&args.data.options()))
}

pub(super) fn print_stats(p: &Printer, s: &SearchStats, graph: &Graph) {
    let ahead = match s.speculative_evaluations {
        0 => String::new(),
        n => format!(" (+{n} evaluated ahead and not needed)"),
    };
    out!(p,
        "[I] Search: {} evaluation(s){ahead}{}, {} layer executions ({} without the incremental cache: {:.2}x), {:.2}s = {:.1}x one FP32 inference ({:.1} ms)",
        s.evaluations,
        crate::search::report::ranked_note(s),
        s.layer_executions,
        s.layer_executions_without_cache,
        s.layer_executions as f64 / s.layer_executions_without_cache.max(1) as f64,
        s.wall_seconds,
        s.wall_seconds / s.fp32_inference_seconds.max(1e-9),
        s.fp32_inference_seconds * 1e3
    );
    let c = &s.contradictions;
    if c.any() {
        let mut evidence = Vec::new();
        if c.failing_supersets > 0 {
            let example = c.example.map_or(String::new(), |(f, p)| {
                format!(" (iteration {f} fails although it marks every layer of iteration {p}, which passes)")
            });
            evidence.push(format!(
                "{} failing evaluation(s) marked every layer of a passing one, and more{example}",
                c.failing_supersets
            ));
        }
        if c.failing_alone > 0 {
            let example = c.failing_alone_example.map_or(String::new(), |(l, p)| {
                format!(
                    " ({} fails alone, yet iteration {p} passes with it and more in low precision)",
                    graph.nodes[l].name
                )
            });
            evidence.push(format!(
                "{} layer(s) failed the criterion alone in low precision in the ranking, yet a passing evaluation leaves them low{example}",
                c.failing_alone
            ));
        }
        out!(p,
            "[W] The criterion is not monotone on this model: {}. Which layers the search answers depends on its path, and it takes more evaluations; a tolerance further from the low precision's rounding noise, or a task-level --metric, gives steadier answers",
            evidence.join("; ")
        );
    }
}
