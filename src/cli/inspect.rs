//! `mixprec inspect`: inputs, outputs, opset and the layer table.

use super::run::DataArgs;
use crate::exec::RunOptions;
use crate::inspect::{si, summarize};
use crate::tensor::fmt_shape;
use crate::{load_model, Interpreter};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Shapes come from one run on generated inputs; these options shape that input.
    #[command(flatten)]
    data: DataArgs,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InspectArgs) -> Result<ExitCode> {
    let model = load_model(&args.model)?;
    let g = &model.graph;
    let feeds = args.data.feeds(g)?;
    let interp = Interpreter::new(g)?;
    let first = feeds.first().cloned().unwrap_or_default();
    let run = interp.run_with(
        &first,
        &RunOptions {
            keep_intermediates: true,
        },
    )?;
    let summary = summarize(g, &run);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("Model: {}", args.model.display());
    let opsets: Vec<String> = g
        .opsets
        .iter()
        .map(|(d, v)| format!("{}={v}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect();
    println!(
        "    ir_version={} | opset {} | producer: {}",
        g.ir_version,
        opsets.join(", "),
        if model.producer.is_empty() {
            "unknown"
        } else {
            &model.producer
        }
    );
    println!("\n---- {} Graph Input(s) ----", g.inputs.len());
    for vi in &g.inputs {
        let actual = first
            .get(&vi.name)
            .map(|t| fmt_shape(t.shape()))
            .unwrap_or_default();
        println!(
            "{{{} [dtype={}, shape={}]}}  (ran with {actual})",
            vi.name,
            vi.dtype.map(|d| d.name()).unwrap_or("?"),
            vi.shape_string()
        );
    }
    println!("\n---- {} Graph Output(s) ----", g.outputs.len());
    for vi in &g.outputs {
        let actual = run
            .output(&vi.name)
            .map(|t| fmt_shape(t.shape()))
            .unwrap_or_default();
        println!(
            "{{{} [dtype={}, shape={}]}}  (ran as {actual})",
            vi.name,
            vi.dtype.map(|d| d.name()).unwrap_or("?"),
            vi.shape_string()
        );
    }
    println!("\n---- {} Layer(s) ----", summary.layers.len());
    let name_w = summary
        .layers
        .iter()
        .map(|l| l.name.len())
        .max()
        .unwrap_or(4)
        .clamp(4, 48);
    let op_w = summary
        .layers
        .iter()
        .map(|l| l.op.len())
        .max()
        .unwrap_or(2)
        .max(2);
    println!(
        "{:>5}  {:<name_w$}  {:<op_w$}  {:<24}  {:>10}  {:>9}",
        "#", "name", "op", "output shape(s)", "FLOPs", "params"
    );
    for l in &summary.layers {
        let shapes: Vec<String> = l.output_shapes.iter().map(|s| fmt_shape(s)).collect();
        println!(
            "{:>5}  {:<name_w$}  {:<op_w$}  {:<24}  {:>10}  {:>9}{}",
            l.index,
            l.name,
            l.op,
            shapes.join(" "),
            si(l.flops),
            l.params,
            if l.computes { "" } else { "  (data movement)" }
        );
    }
    let candidates = summary.layers.iter().filter(|l| l.computes).count();
    println!(
        "\nTotals: {} layers ({candidates} compute, {} data movement) | {}FLOPs | {} parameters",
        summary.layers.len(),
        summary.layers.len() - candidates,
        si(summary.total_flops),
        summary.total_params
    );
    println!(
        "Weights: {}B as float32 | {}B as float16/bfloat16 | {}B as int8/fp8",
        si(summary.weight_bytes_fp32),
        si(summary.weight_bytes_fp16),
        si(summary.weight_bytes_int8)
    );
    Ok(ExitCode::SUCCESS)
}
