//! `debug precision` on a float model: the answer's body — its layers, why each is needed, its
//! share of the candidates, the deploy lines.

use super::report::print_share;
use super::{Printer, SearchArgs};
use anyhow::Result;
use mixprec::compare::fmt_g;
use mixprec::compare::layerwise::LayerError;
use mixprec::jobs::debug_precision::SearchPass;
use mixprec::jobs::options::PrecisionOptions;
use mixprec::precision::fusion::FusionModel;
use mixprec::precision::Precision;
use mixprec::search::report::{deploy_lines, DeploySetup};
use mixprec::Graph;

/// A float search's answer: its layers, why each is needed, their share, the deploy lines.
#[allow(clippy::too_many_arguments)]
pub(super) fn answer(
    p: &Printer,
    args: &SearchArgs,
    graph: &Graph,
    search: &SearchPass,
    high: Precision,
    marked: &[usize],
    interrupted: bool,
    (reasons, stat): (&[LayerError], &str),
) -> Result<()> {
    let (space, result, fusion) = (&search.run.space, &search.run.result, search.fusion);
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
    super::groups::print_layers(p, graph, space, marked, Some(high));
    print_reasons(p, reasons, stat);
    let share = format!("In {}", high.name());
    print_share(p, space, result, marked, (&share, "candidate layers"));
    let answer = search.low.marking(marked, high);
    let written = args.output.as_ref().map(|o| o.display().to_string());
    let setup = DeploySetup {
        model: &args.model.display().to_string(),
        graph,
        flags: args.precision.global(),
        answer: &answer,
        marked,
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
    Ok(())
}

/// Why each layer of the answer is needed: its error alone in low precision and the cause.
fn print_reasons(p: &Printer, reasons: &[LayerError], stat: &str) {
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
fn convert_extra(
    args: &SearchArgs,
    answer: &mixprec::precision::plan::PrecisionPlan,
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
fn convert_calibration(
    args: &SearchArgs,
    answer: &mixprec::precision::plan::PrecisionPlan,
) -> Vec<String> {
    if !PrecisionOptions::needs_ranges(answer) {
        return Vec::new();
    }
    args.precision
        .options()
        .calibration_flags(Some(&args.data.options()))
}
