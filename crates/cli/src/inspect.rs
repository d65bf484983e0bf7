//! `mixprec inspect`: inputs, outputs, opset and the layer table.

use anyhow::Result;
use clap::Args;
use mixprec::inspect::si;
use mixprec::jobs::inspect::{self, Config, Outcome};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Resolve dynamic dims: `name:[d0,d1,...]` per input (Polygraphy's syntax). Without it,
    /// dynamic dims stay symbolic. Nothing is executed either way.
    #[arg(long = "input-shapes", num_args = 1.., value_name = "SHAPE")]
    input_shapes: Vec<String>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InspectArgs) -> Result<ExitCode> {
    let config = Config {
        model: args.model,
        input_shapes: args.input_shapes,
    };
    let Outcome {
        model,
        summary,
        unsupported,
    } = inspect::run(&config)?;
    let g = &model.graph;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("Model: {}", config.model.display());
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
    for (vi, v) in g.inputs.iter().zip(&summary.inputs) {
        println!(
            "{{{} [dtype={}, shape={}]}}",
            vi.name,
            vi.dtype.map(|d| d.name()).unwrap_or("?"),
            v.shape_text()
        );
    }
    println!("\n---- {} Graph Output(s) ----", g.outputs.len());
    for (vi, v) in g.outputs.iter().zip(&summary.outputs) {
        println!(
            "{{{} [dtype={}, shape={}]}}",
            vi.name,
            v.dtype
                .as_deref()
                .or(vi.dtype.map(|d| d.name()))
                .unwrap_or("?"),
            v.shape_text()
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
        let shapes: Vec<String> = l.outputs.iter().map(|v| v.shape_text()).collect();
        println!(
            "{:>5}  {:<name_w$}  {:<op_w$}  {:<24}  {:>10}  {:>9}{}",
            l.index,
            l.name,
            l.op,
            shapes.join(" "),
            l.flops.map_or("?".to_string(), si),
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
    if summary.layers_without_flops > 0 {
        println!(
            "        ({} layer(s) without a FLOP count: their shapes are not static; resolve them with --input-shapes)",
            summary.layers_without_flops
        );
    }
    println!(
        "Weights: {}B as float32 | {}B as float16/bfloat16 | {}B as int8/fp8",
        si(summary.weight_bytes_fp32),
        si(summary.weight_bytes_fp16),
        si(summary.weight_bytes_int8)
    );
    // inspect still shows such a model (what it holds, what is missing); run, convert and
    // debug precision stop on it with the same list.
    if !unsupported.is_empty() {
        println!(
            "Unsupported: {}",
            mixprec::error::Error::UnsupportedOps(unsupported)
        );
    }
    Ok(ExitCode::SUCCESS)
}
