//! `debug precision` on a Q/DQ model without a precision flag: which quantized layers must
//! leave quantization (docs/search.md, "Searching a Q/DQ model").

use super::{print_stats, Printer, SearchArgs};
use crate::compare::fmt_g;
use crate::export::write_model;
use crate::inspect::si;
use crate::jobs::debug_precision;
use crate::onnx::Model;
use crate::precision::Precision;
use crate::search::qdq::{exclusion_lines, unnamed_in_file, QdqRun};
use crate::search::report::{percent, shell_word};
use crate::search::{Direction, Outcome};
use anyhow::Result;
use std::process::ExitCode;

/// After a Q/DQ model's search: the outcome printed and the files written.
pub(super) fn finish(
    args: &SearchArgs,
    p: &Printer,
    outcome: &debug_precision::Outcome,
    run: &QdqRun,
) -> Result<ExitCode> {
    if !outcome.fusion.is_none() {
        out!(p, "[I] Every run used --fusion {}", outcome.fusion);
    }
    let code = report(
        p,
        args,
        &outcome.model,
        run,
        outcome.high,
        outcome.direction,
    )?;
    write_files(p, args, outcome, run)?;
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
    super::groups::print_layers(p, graph, space, &marked, None);
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
    print_reasons(p, run);
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

/// Why each answered layer is needed: its error alone back in quantization, with its inputs'
/// quantization steps and clipping.
fn print_reasons(p: &Printer, run: &QdqRun) {
    if run.reasons.is_empty() {
        return;
    }
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

fn write_files(
    p: &Printer,
    args: &SearchArgs,
    outcome: &debug_precision::Outcome,
    run: &QdqRun,
) -> Result<()> {
    let mut written = None;
    if let (Some(out), Some(exported)) = (&args.output, outcome.export()?) {
        for n in &exported.notes {
            eprintln!("note: {n}");
        }
        write_model(out, &exported.model)?;
        let answer = run.answer.as_ref().expect("an exported answer");
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
        outcome.html().write(path)?;
        out!(p, "[I] Saved report to {}", path.display());
    }
    if let Some(path) = &args.save_result {
        crate::data::write_atomic(path, &outcome.result_json(written.as_deref())?)?;
        out!(p, "[I] Saved result to {}", path.display());
    }
    Ok(())
}
