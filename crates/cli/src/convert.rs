//! `mixprec convert`: writes a precision plan as a deployable mixed-precision ONNX model
//! (Cast nodes around float16/bfloat16 layers, QuantizeLinear/DequantizeLinear for int8/fp8).

use super::precision_args::PrecisionArgs;
use super::progress::{print_event, Bar};
use super::run::DataArgs;
use anyhow::{bail, Result};
use clap::Args;
use mixprec::exec::emulate::plan_regions;
use mixprec::export::write_model;
use mixprec::jobs::convert;
use mixprec::jobs::options::Inputs;
use mixprec::precision::summary::{
    fusion_line, fusion_table, precision_counts_line, precision_table,
};
use std::io::IsTerminal;
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
    if args.output == args.model {
        bail!(
            "{}: the output would overwrite the input model; choose another -o",
            args.output.display()
        );
    }
    let config = convert::Config {
        model: args.model.clone(),
        precision: args.precision.options(),
        inputs: Inputs::Options(args.data.options()),
        keep_io_types: !args.no_keep_io_types,
        fallback: args.fallback,
    };
    let bar = Bar::calibration(std::io::stderr().is_terminal());
    let exported = convert::run(&config, &mut print_event, &bar)?;
    let (graph, plan) = (&exported.source.graph, &exported.plan);
    write_model(&args.output, &exported.model)?;
    println!("[I] {}", precision_counts_line(graph, plan));
    if args.verbose {
        print!("{}", precision_table(graph, plan));
    }
    if !plan.fusion.is_none() {
        // The exported model cannot state fusion: the engine decides it when it builds.
        let (regions, events) = plan_regions(graph, plan, &args.data.shape_overrides()?)?;
        if let Some(line) = fusion_line(graph, plan.fusion, &regions) {
            println!("[I] {line}");
        }
        println!("[I] The exported model cannot state fusion (TensorRT fuses when it builds the engine): these are the regions mixprec's prediction assumed, for these layer precisions");
        if args.verbose {
            print!("{}", fusion_table(graph, &regions));
            for e in events {
                print_event(e);
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
