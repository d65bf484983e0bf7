//! How `debug precision` prints a search's outcome — the verdict, the answer's headline, the
//! statistics — for either space; the answer's body is the space's (`plans.rs`, `qdq.rs`).

use super::{Printer, SearchArgs};
use anyhow::Result;
use mixprec::inspect::si;
use mixprec::jobs::debug_precision::SearchPass;
use mixprec::onnx::Model;
use mixprec::precision::Precision;
use mixprec::search::report::{percent, SearchStats};
use mixprec::search::space::Found;
use mixprec::search::{Direction, Outcome, SearchResult, SearchSpace};
use mixprec::Graph;
use std::process::ExitCode;

/// Prints the outcome of one search (a float model's or a Q/DQ model's); returns the exit
/// code.
pub(super) fn report(
    p: &Printer,
    args: &SearchArgs,
    model: &Model,
    search: &SearchPass,
    (high, direction): (Precision, Direction),
    stat: &str,
) -> Result<ExitCode> {
    let graph = &model.graph;
    let (space, result, stats) = (&search.run.space, &search.run.result, &search.run.stats);
    let qdq = search.run.found.is_qdq();
    if let (true, Some(f)) = (qdq, search.fusion) {
        out!(p, "[I] Every run used --fusion {f}");
    }
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
            if qdq {
                out!(
                    p,
                    "[I] The Q/DQ model as it is already passes: no quantized layer needs {}",
                    high.name()
                );
            } else {
                out!(p,
                    "[I] The plan with every candidate layer in low precision already passes: no layer needs {}",
                    high.name()
                );
            }
            print_stats(p, stats, graph);
            return Ok(ExitCode::SUCCESS);
        }
        Outcome::ReferenceFails => {
            let why = result
                .trials
                .first()
                .map(|t| t.summary.as_str())
                .unwrap_or("");
            let mut advice = if high == Precision::Float32 {
                "the golden outputs or the tolerances are wrong for this model".to_string()
            } else {
                format!(
                    "{} is not enough for this model (try --precision float32), or the golden outputs or the tolerances are wrong",
                    high.name()
                )
            };
            let n = space.candidates.len();
            let all = if qdq {
                if high == Precision::Float32 {
                    advice += ", or Q/DQ pairs that feed no quantized layer (data movement, graph outputs) lose too much";
                }
                format!(
                    "{n} quantized layer(s) out of quantization, in {},",
                    high.name()
                )
            } else {
                format!("{n} candidate layer(s) in {}", high.name())
            };
            out!(
                p,
                "[E] Even with all {all} the criterion fails ({why}): {advice}"
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
            "[W] Interrupted after {} evaluation(s); the best passing {} so far:",
            result.trials.len(),
            if qdq { "set" } else { "plan" }
        );
    }
    let which = match (result.contiguous_count, interrupted) {
        (Some(n), false) => format!(
            "the {} {n}",
            match direction {
                Direction::Forward => "first",
                Direction::Reverse => "last",
            }
        ),
        _ => format!("these {}", marked.len()),
    };
    if qdq {
        out!(p,
            "[I] To achieve acceptable accuracy, take {which} quantized layer(s) out of quantization (they run in {})",
            high.name()
        );
    } else {
        out!(p,
            "[I] To achieve acceptable accuracy, try running {which} layer(s) in higher precision ({})",
            high.name()
        );
    }
    match &search.run.found {
        Found::Plans { reasons, .. } => super::plans::answer(
            p,
            args,
            graph,
            search,
            high,
            &marked,
            interrupted,
            (reasons, stat),
        )?,
        Found::Qdq { reasons, .. } => {
            super::qdq::answer(p, args, model, space, result, &marked, interrupted, reasons)
        }
    }
    print_stats(p, stats, graph);
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// The answer's share of the candidates, in layers and FLOPs (`label`: what the marked layers
/// are, `candidates`: what the candidates are called), and what its evaluation achieved.
pub(super) fn print_share(
    p: &Printer,
    space: &SearchSpace,
    result: &SearchResult,
    marked: &[usize],
    (label, candidates): (&str, &str),
) {
    let f = space.flops_of(marked);
    out!(
        p,
        "[I]     {label}: {} of {} {candidates} ({}), {}FLOP of {}FLOP ({})",
        marked.len(),
        space.candidates.len(),
        percent(marked.len() as u64, space.candidates.len() as u64),
        si(f),
        si(space.total_flops()),
        percent(f, space.total_flops())
    );
    if let Some(t) = result.trial_of(marked) {
        out!(p, "[I]     Achieved: {}", t.summary);
    }
}

pub(super) fn print_stats(p: &Printer, s: &SearchStats, graph: &Graph) {
    let ahead = match s.speculative_evaluations {
        0 => String::new(),
        n => format!(" (+{n} evaluated ahead and not needed)"),
    };
    out!(p,
        "[I] Search: {} evaluation(s){ahead}{}, {} layer executions ({} without the incremental cache: {:.2}x), {:.2}s = {:.1}x one FP32 inference ({:.1} ms)",
        s.evaluations,
        mixprec::search::report::ranked_note(s),
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
