//! `mixprec convert`: writes a precision plan as a deployable mixed-precision ONNX model
//! (Cast nodes around float16/bfloat16 layers, QuantizeLinear/DequantizeLinear for int8/fp8).

use super::precision_args::{
    fusion_line, fusion_table, precision_counts_line, precision_table, PrecisionArgs,
};
use super::ranges::ranges_for_plan;
use super::run::DataArgs;
use crate::exec::emulate::plan_regions;
use crate::export::{export, write_model, ExportOptions};
use crate::{load_model, Interpreter};
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Where to write the mixed-precision model.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    #[command(flatten)]
    precision: PrecisionArgs,
    /// Inputs to calibrate on when int8/fp8 layers have no --calibration-cache.
    #[command(flatten)]
    data: DataArgs,
    /// Let graph inputs and outputs change type too (by default they keep their original
    /// types, with Casts inside the model).
    #[arg(long = "no-keep-io-types")]
    no_keep_io_types: bool,
    /// Keep a float16/bfloat16 layer in float32 (with a note) when its op has no such type in
    /// the model's opset, instead of failing.
    #[arg(long)]
    fallback: bool,
    /// Print the precision of every layer.
    #[arg(long, short = 'v')]
    verbose: bool,
}

pub fn run(args: ConvertArgs) -> Result<ExitCode> {
    args.data.check_trt_options()?;
    if !args.precision.any() {
        bail!("nothing to convert: give a precision (--fp16, --bf16, --int8, --fp8 or --layer-precisions)");
    }
    if args.output == args.model {
        bail!(
            "{}: the output would overwrite the input model; choose another -o",
            args.output.display()
        );
    }
    let model = load_model(&args.model)?;
    let graph = &model.graph;
    let plan = args.precision.plan(graph)?;
    let amax = if PrecisionArgs::needs_ranges(&plan) {
        let interp = Interpreter::new(graph)?;
        let feeds = if args
            .precision
            .calibration_cache
            .as_ref()
            .is_some_and(|p| p.exists())
        {
            Vec::new()
        } else {
            args.data.feeds(graph)?
        };
        ranges_for_plan(&interp, &plan, &args.precision, &feeds)?
    } else {
        None
    };
    let exported = export(
        &model,
        &plan,
        amax.as_ref(),
        &ExportOptions {
            keep_io_types: !args.no_keep_io_types,
            fallback: args.fallback,
        },
    )?;
    write_model(&args.output, &exported.model)?;
    println!("[I] {}", precision_counts_line(graph, &plan));
    if args.verbose {
        print!("{}", precision_table(graph, &plan));
    }
    if !plan.fusion.is_none() {
        // The exported model cannot state fusion: the engine decides it when it builds.
        let (regions, events) = plan_regions(graph, &plan, &args.data.shape_overrides()?)?;
        if let Some(line) = fusion_line(graph, plan.fusion, &regions) {
            println!("[I] {line}");
        }
        println!("[I] The exported model cannot state fusion (TensorRT fuses when it builds the engine): these are the regions mixprec's prediction assumed, for these layer precisions");
        if args.verbose {
            print!("{}", fusion_table(graph, &regions));
            for e in events {
                super::progress::print_event(e);
            }
        }
    }
    for n in &exported.notes {
        println!("[W] {n}");
    }
    println!(
        "[I] Wrote {} ({} Cast node(s) added, {} activation(s) and {} weight(s) quantized)",
        args.output.display(),
        exported.casts,
        exported.quantized_activations,
        exported.quantized_weights
    );
    Ok(ExitCode::SUCCESS)
}
