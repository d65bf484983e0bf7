//! `mixprec verify-engine`: did the engine run every layer in the precision it was asked for?
//! A shell over `jobs::verify_engine`: flags in, the report printed (docs/verify-engine.md).

use super::precision_args::PrecisionArgs;
use super::progress::print_event;
use anyhow::{Context, Result};
use clap::Args;
use mixprec::engine::Verdict;
use mixprec::jobs::verify_engine::{self, Config, Status};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct VerifyEngineArgs {
    /// The ONNX model the engine was built from: the exported mixed-precision model
    /// (TensorRT 11, `--stronglyTyped`), or the original model with the plan's precision
    /// options (TensorRT <= 10, `--layerPrecisions`).
    model: PathBuf,
    /// The engine's layer information: `trtexec --exportLayerInfo=FILE
    /// --profilingVerbosity=detailed` JSON, or the text of `polygraphy inspect model ENGINE
    /// --show layers` (built with detailed profiling verbosity).
    #[arg(long = "layer-info", value_name = "FILE")]
    layer_info: PathBuf,
    /// The expected precisions as a plan JSON file (`PrecisionPlan::to_json`).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["fp16", "bf16", "int8", "fp8", "layer_precisions"])]
    plan: Option<PathBuf>,
    /// The expected precisions as `run`/`convert` take them (--fp16, --int8,
    /// --layer-precisions ...). Without --plan or these, the model's own types are expected
    /// (a strongly typed, exported mixed-precision model).
    #[command(flatten)]
    precision: PrecisionArgs,
    /// Print every compared node, not only those that disobey.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

/// Exit status: 0 when every compared node runs in its expected precision, 1 when a node
/// disobeys (or on an error), 2 when nothing could be compared (no detailed layer
/// information, or no layer maps to a node of the model).
pub fn run(args: VerifyEngineArgs) -> Result<ExitCode> {
    let config = Config {
        model: args.model,
        layer_info: args.layer_info,
        plan: args.plan,
        precision: args.precision.options(),
    };
    let outcome = verify_engine::run(&config, &mut print_event)?;
    let (report, source) = (&outcome.report, &outcome.source);
    let file = config.layer_info.display();
    println!(
        "[I] {file}: {} engine layer(s): {} mapped to ONNX nodes, {} reformat, {} ignored (constants, no-ops), {} unmapped",
        report.engine_layers,
        report.mapped_layers,
        report.reformats.len(),
        report.ignored.len(),
        report.unmapped_layers()
    );
    for r in &report.reformats {
        println!("[I]     reformat layer: {r}");
    }
    if !report.io_tensors.is_empty() {
        let io: Vec<String> = report
            .io_tensors
            .iter()
            .map(|t| {
                let about: Vec<&str> = [t.mode.as_deref(), t.engine.as_deref()]
                    .into_iter()
                    .flatten()
                    .collect();
                if about.is_empty() {
                    t.name.clone()
                } else {
                    format!("{} ({})", t.name, about.join(", "))
                }
            })
            .collect();
        println!("[I]     engine I/O tensors: {}", io.join(", "));
    }
    if outcome.status() == Status::NoDetail {
        println!("[E] {file} holds layer names only, no types: rebuild the engine with `trtexec --profilingVerbosity=detailed --exportLayerInfo=FILE`");
        return Ok(ExitCode::from(2));
    }
    let disobeying: Vec<_> = report.disobeying().collect();
    println!(
        "[I] Expected precisions from {source}: {} node(s) compared: {} obey, {} disobey, {} only inside Myelin regions (not judged), {} not seen in the engine",
        report.count(Verdict::Obeys) + report.count(Verdict::Disobeys),
        report.count(Verdict::Obeys),
        disobeying.len(),
        report.count(Verdict::InsideMyelin),
        report.count(Verdict::NotSeen)
    );
    for n in &report.nodes {
        let show = n.verdict == Verdict::Disobeys || args.verbose;
        if !show {
            continue;
        }
        println!(
            "[{}]     {} ({}): expected {}, engine {} in {}",
            if n.verdict == Verdict::Disobeys {
                "E"
            } else {
                "I"
            },
            n.node,
            n.op,
            n.expected,
            n.engine.as_deref().unwrap_or("-"),
            if n.layers.is_empty() {
                "no layer".to_string()
            } else {
                n.layers
                    .iter()
                    .map(|l| format!("'{l}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    if let Some(p) = &args.json {
        let json = serde_json::to_vec_pretty(&report).context("serializing the report")?;
        mixprec::data::write_atomic(p, &json)?;
        println!("[I] Saved report to {}", p.display());
    }
    if outcome.status() == Status::Disobeyed {
        println!(
            "[E] {} node(s) do not run in the precision asked for: the engine did not obey",
            disobeying.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    if outcome.status() == Status::NothingCompared {
        println!("[E] No node could be compared: no engine layer maps to a node of this model with type information");
        return Ok(ExitCode::from(2));
    }
    println!("[I] Every compared node runs in the precision asked for");
    Ok(ExitCode::SUCCESS)
}
