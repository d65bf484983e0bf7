//! `debug precision` on a Q/DQ model without a precision flag: which quantized layers must
//! leave quantization (docs/search.md, "Searching a Q/DQ model").

use super::report::print_share;
use super::{Printer, SearchArgs};
use mixprec::compare::fmt_g;
use mixprec::onnx::Model;
use mixprec::search::qdq::{exclusion_lines, unnamed_in_file};
use mixprec::search::report::{shell_word, QdqReason};
use mixprec::search::{SearchResult, SearchSpace};

/// A Q/DQ search's answer: its layers, their share, why each is needed, how to re-quantize
/// without them or deploy the model without their pairs.
#[allow(clippy::too_many_arguments)]
pub(super) fn answer(
    p: &Printer,
    args: &SearchArgs,
    model: &Model,
    space: &SearchSpace,
    result: &SearchResult,
    marked: &[usize],
    interrupted: bool,
    reasons: &[QdqReason],
) {
    let graph = &model.graph;
    super::groups::print_layers(p, graph, space, marked, None);
    print_share(
        p,
        space,
        result,
        marked,
        ("Out of quantization", "quantized layers"),
    );
    print_reasons(p, reasons);
    out!(
        p,
        "[I]     Re-quantize the float model without them (node names as the quantizers take them):"
    );
    for line in exclusion_lines(model, marked) {
        out!(p, "[I]       {line}");
    }
    let unnamed = unnamed_in_file(model, marked);
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
}

/// Why each answered layer is needed: its error alone back in quantization, with its inputs'
/// quantization steps and clipping.
fn print_reasons(p: &Printer, reasons: &[QdqReason]) {
    if reasons.is_empty() {
        return;
    }
    out!(
        p,
        "[I]     Why: each layer alone back in quantization, the rest as answered (first input set):"
    );
    for r in reasons {
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
