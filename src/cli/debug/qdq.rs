//! `debug precision` on a Q/DQ model without a precision flag: which quantized layers must
//! leave quantization (docs/search.md, "Searching a Q/DQ model").

use super::{
    install_interrupt_handler, print_stats, CliHooks, Printer, SearchArgs, TempDir, INTERRUPTED,
};
use crate::compare::{fmt_g, Criterion};
use crate::export::qdq::QdqKind;
use crate::export::write_model;
use crate::golden::GoldenFile;
use crate::inspect::si;
use crate::onnx::Model;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use crate::search::check::CheckOracle;
use crate::search::qdq::{exclusion_lines, run_qdq_search, unnamed_in_file, QdqJob, QdqRun};
use crate::search::replay::DebugReplay;
use crate::search::report::{
    html_report, names, percent, shell_word, QdqRemoved, QdqResult, ResultFile, SearchSetup,
};
use crate::search::{Direction, Mode, Outcome, SearchOptions};
use crate::tensor::Feeds;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// What `search_command` prepared before it knew the model holds Q/DQ nodes.
pub(super) struct Setup<'a> {
    pub model: &'a Model,
    pub feeds: &'a [Feeds],
    pub criterion: Criterion,
    pub high: Precision,
    pub mode: Mode,
    pub direction: Direction,
    pub replay: Option<DebugReplay>,
    pub golden: Option<&'a GoldenFile>,
    /// With `--check`: its `--fail-regex` and `--check-timeout`.
    pub check: Option<(Option<regex::Regex>, Option<Duration>)>,
}

pub(super) fn search(args: &SearchArgs, p: &Printer, s: Setup<'_>) -> Result<ExitCode> {
    if !args.precision.layer_precisions.is_empty() {
        bail!("--layer-precisions sets the precisions of a float model's layers; on a Q/DQ model the search marks quantized layers (leave it out)");
    }
    let fusion = args.precision.fusion_model()?;
    if args.ranking == Some(crate::search::Ranking::Sensitivity) {
        bail!(
            "--ranking sensitivity is not available for a Q/DQ model's search yet (each \
             candidate there is a model of its own); its quantized layers are ranked by growth"
        );
    }
    if s.check.is_some() && !fusion.is_none() {
        bail!(
            "--fusion {fusion} has no effect with --check: the command judges every candidate on its own engine (leave --fusion out)"
        );
    }
    let model = s.model;
    let graph = &model.graph;
    let workdir;
    let check = match s.check {
        None => None,
        Some((fail_regex, timeout)) => {
            workdir = TempDir::new()?;
            Some(CheckOracle {
                model,
                graph,
                low: PrecisionPlan::uniform(graph, Precision::Float32),
                high: s.high,
                amax: None,
                command: args.check.clone(),
                fail_regex,
                timeout,
                workdir: workdir.0.clone(),
                jobs: args.jobs,
                verbose: args.verbose,
                evaluations: 0,
                iter_artifact: args.iter_artifact.clone().or_else(|| {
                    (!args.check.iter().any(|a| a.contains("{model}")))
                        .then(|| PathBuf::from("polygraphy_debug.onnx"))
                }),
                keep_iter_artifact: args.no_remove_intermediate,
                artifacts: args.artifacts.clone(),
                artifacts_dir: args.artifacts_dir.clone(),
                artifact_stamp: super::super::run::polygraphy_stamp().replace(['/', ':'], "-"),
                show_output: args.show_output,
                hide_fail_output: args.hide_fail_output,
                events: Box::new(super::print_event),
            })
        }
    };
    install_interrupt_handler();
    let job = QdqJob {
        model,
        feeds: s.feeds,
        criterion: s.criterion.clone(),
        high: s.high,
        fusion,
        golden: s.golden,
        options: SearchOptions {
            mode: s.mode,
            direction: s.direction,
            objective: args.objective,
            ranking: crate::search::Ranking::Growth,
            jobs: args.jobs,
        },
        check,
        replay: s.replay.map(|r| (r, args.save_debug_replay.clone())),
        stop: &INTERRUPTED,
    };
    let mut hooks = CliHooks {
        p,
        args,
        graph,
        feeds: s.feeds.len(),
        criterion: &s.criterion,
        high: s.high,
        mode: s.mode,
        direction: s.direction,
        say: !args.quiet,
        bar: indicatif::ProgressBar::hidden(),
        best: None,
        qdq: true,
    };
    let run = run_qdq_search(job, &mut hooks)?;
    hooks.bar.finish_and_clear();
    if !fusion.is_none() {
        out!(p, "[I] Every run used --fusion {fusion}");
    }
    let code = report(p, args, model, &run, s.high, s.direction)?;
    write_files(
        p,
        args,
        model,
        &run,
        &s.criterion,
        s.high,
        s.mode,
        s.direction,
    )?;
    Ok(code)
}

/// Prints the outcome; returns the exit code.
fn report(
    p: &Printer,
    args: &SearchArgs,
    model: &Model,
    run: &QdqRun,
    high: Precision,
    direction: Direction,
) -> Result<ExitCode> {
    let (graph, space, result, stats) = (&model.graph, &run.space, &run.result, &run.stats);
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
            out!(
                p,
                "[I] The Q/DQ model as it is already passes: no quantized layer needs {}",
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
            out!(
                p,
                "[E] Even with all {} quantized layer(s) out of quantization, in {}, the criterion fails ({why}): {}",
                space.candidates.len(),
                high.name(),
                if high == Precision::Float32 {
                    "the golden outputs or the tolerances are wrong for this model, or Q/DQ pairs that feed no quantized layer (data movement, graph outputs) lose too much"
                } else {
                    "float16 is not enough for this model (try --precision float32), or the golden outputs or the tolerances are wrong"
                }
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
            "[W] Interrupted after {} evaluation(s); the best passing set so far:",
            result.trials.len()
        );
    }
    match (result.contiguous_count, interrupted) {
        (Some(n), false) => out!(
            p,
            "[I] To achieve acceptable accuracy, take the {} {n} quantized layer(s) out of quantization (they run in {})",
            match direction {
                Direction::Forward => "first",
                Direction::Reverse => "last",
            },
            high.name()
        ),
        _ => out!(
            p,
            "[I] To achieve acceptable accuracy, take these {} quantized layer(s) out of quantization (they run in {})",
            marked.len(),
            high.name()
        ),
    }
    out!(p, "[I]     Layers: {}", names(graph, &marked));
    let f = space.flops_of(&marked);
    out!(
        p,
        "[I]     Out of quantization: {} of {} quantized layers ({}), {}FLOP of {}FLOP ({})",
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
    if !run.reasons.is_empty() {
        out!(
            p,
            "[I]     Why: each layer alone back in quantization, the rest as answered (first input set):"
        );
        for r in &run.reasons {
            let inputs: Vec<String> = r
                .inputs
                .iter()
                .map(|i| {
                    let clipped = i
                        .clipped
                        .map(|c| format!("{:.2}% clipped, ", 100.0 * c))
                        .unwrap_or_default();
                    format!(
                        "'{}' step {}: {clipped}rounding {}",
                        i.tensor,
                        fmt_g(i.scale, 3),
                        fmt_g(i.relative_error, 3)
                    )
                })
                .collect();
            out!(
                p,
                "[I]       {} ({}): {} | output '{}' abs {}, relative {}{}",
                r.layer,
                r.op,
                r.cause(),
                r.output,
                fmt_g(r.required_atol, 5),
                fmt_g(r.relative_error, 3),
                if inputs.is_empty() {
                    String::new()
                } else {
                    format!(" | {}", inputs.join("; "))
                }
            );
            if let Some(a) = &r.alone {
                out!(p, "[I]         without it the answer {a}");
            }
        }
    }
    out!(
        p,
        "[I]     Re-quantize the float model without them (node names as the quantizers take them):"
    );
    for line in exclusion_lines(model, &marked) {
        out!(p, "[I]       {line}");
    }
    let unnamed = unnamed_in_file(model, &marked);
    if !unnamed.is_empty() {
        out!(
            p,
            "[W]     {} of these node(s) have no name in the model file (mixprec named them: {}); a quantizer cannot exclude them by name",
            unnamed.len(),
            unnamed.join(", ")
        );
    }
    let written = args.output.as_ref().filter(|_| !interrupted);
    let deployed = match written {
        Some(o) => {
            out!(
                p,
                "[I]     Or deploy the Q/DQ model with their pairs removed (TensorRT 11, strongly typed; written by -o):"
            );
            shell_word(&o.display().to_string())
        }
        None => {
            out!(
                p,
                "[I]     Or deploy the Q/DQ model with their pairs removed (TensorRT 11, strongly typed; add -o FILE to write it):"
            );
            "model_stripped.onnx".to_string()
        }
    };
    out!(p, "[I]       trtexec --onnx={deployed} --stronglyTyped");
    out!(
        p,
        "[I]       polygraphy run {deployed} --trt --strongly-typed"
    );
    print_stats(p, stats, graph);
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

#[allow(clippy::too_many_arguments)]
fn write_files(
    p: &Printer,
    args: &SearchArgs,
    model: &Model,
    run: &QdqRun,
    criterion: &Criterion,
    high: Precision,
    mode: Mode,
    direction: Direction,
) -> Result<()> {
    let graph = &model.graph;
    let found = matches!(run.result.outcome, Outcome::Found(_));
    let mut written = None;
    if let (Some(out), Some(answer), true) = (&args.output, &run.answer, found) {
        for n in &answer.notes {
            eprintln!("note: {n}");
        }
        write_model(out, &answer.model.proto)?;
        out!(
            p,
            "[I] Saved the Q/DQ model without the answer's {} Q/DQ pair(s) and {} quantized weight(s) to {}",
            answer.activations,
            answer.weights,
            out.display()
        );
        written = Some(out.display().to_string());
    }
    if let Some(path) = &args.report {
        let html = html_report(
            &args.model.display().to_string(),
            graph,
            &run.space,
            criterion,
            high,
            mode,
            &run.result,
            &run.stats,
            None,
            &[],
        );
        html.write(path)?;
        out!(p, "[I] Saved report to {}", path.display());
    }
    if let Some(path) = &args.save_result {
        let model_name = args.model.display().to_string();
        let low = PrecisionPlan::uniform(graph, Precision::Float32);
        let setup = SearchSetup {
            model: &model_name,
            mode,
            direction,
            objective: args.objective,
            high,
            low: &low,
        };
        let mut file = ResultFile::new(&setup, graph, &run.space, &run.result, &run.stats, &[]);
        file.low_precisions = vec![format!("{} quantized", run.space.candidates.len())];
        file.fusion = args.precision.fusion_model()?.name();
        let marked: Vec<usize> = file.layers.iter().map(|l| l.index).collect();
        let mut removed = Vec::new();
        for &i in &marked {
            let Some(l) = run.layers.iter().find(|l| l.node == i) else {
                continue;
            };
            let node = &graph.nodes[i];
            for q in &l.inputs {
                let (kind, quantize, reads) = match &q.kind {
                    QdqKind::Activation { q, source } => (
                        "activation",
                        Some(graph.nodes[*q].name.clone()),
                        Some(source.clone()),
                    ),
                    QdqKind::Weight => ("weight", None, None),
                };
                removed.push(QdqRemoved {
                    layer: node.name.clone(),
                    input: node.inputs[q.slot].clone(),
                    kind,
                    quantize,
                    dequantize: graph.nodes[q.dq].name.clone(),
                    reads,
                });
            }
        }
        file.qdq = Some(QdqResult {
            quantized_layers: run.space.candidates.len(),
            nodes_to_exclude: marked
                .iter()
                .map(|&i| graph.nodes[i].name.clone())
                .collect(),
            removed,
            stripped_model: written,
            reasons: run.reasons.clone(),
        });
        let json = serde_json::to_vec_pretty(&file).context("serializing the result")?;
        crate::data::write_atomic(path, &json)?;
        out!(p, "[I] Saved result to {}", path.display());
    }
    Ok(())
}
