//! `mixprec quantize`: writes a float model with explicit quantization (Q/DQ): int8/fp8 with
//! calibrated activations and per-channel weights, or int4/NVFP4 weight-only. A shell over
//! `mixprec::jobs::quantize`: flags in, the model written and the summary printed.

use super::precision_args::CalibAlgoArgs;
use super::progress::{print_event, Bar};
use super::run::DataArgs;
use anyhow::{bail, Result};
use clap::Args;
use mixprec::export::write_model;
use mixprec::jobs::options::Inputs;
use mixprec::jobs::quantize::{self, Config};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The float ONNX model.
    model: PathBuf,
    /// Where to write the quantized model (written to a temporary file and renamed: no partial
    /// output on failure).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// int8: Conv, ConvTranspose, Gemm, MatMul get QuantizeLinear/DequantizeLinear on their
    /// activations (per tensor, calibrated) and per-channel int8 weights.
    #[arg(long)]
    int8: bool,
    /// fp8 (e4m3): as --int8, with float8e4m3fn values (opset 19).
    #[arg(long)]
    fp8: bool,
    /// Weight-only int4: MatMul/Gemm weights in blocks of --block-size (default 128) along the
    /// reduction axis, DequantizeLinear with block_size (opset 21). No calibration.
    #[arg(long = "int4-weights")]
    int4_weights: bool,
    /// Weight-only NVFP4: MatMul/Gemm weights as float4e2m1 with float8e4m3fn block scales
    /// (blocks of --block-size, default 16) and a float32 global scale (ModelOpt's form,
    /// opset 23). No calibration.
    #[arg(long = "nvfp4-weights")]
    nvfp4_weights: bool,
    /// Block size of --int4-weights / --nvfp4-weights.
    #[arg(long = "block-size", value_name = "N")]
    block_size: Option<usize>,
    /// Op types left in float32 (e.g. `Gemm ConvTranspose`).
    #[arg(long = "exclude-op-types", num_args = 1.., value_name = "OP")]
    exclude_op_types: Vec<String>,
    /// Regular expressions: nodes whose names match (anywhere; anchor with ^...$) stay float32.
    #[arg(long = "exclude-nodes", num_args = 1.., value_name = "REGEX")]
    exclude_nodes: Vec<String>,
    /// A `mixprec debug precision --save-result` file: the layers of its answer (top-level
    /// `layers[].name`) stay float32.
    #[arg(long = "exclude-from", value_name = "RESULT.json")]
    exclude_from: Option<PathBuf>,
    /// TensorRT calibration cache with the activation ranges (int8/fp8). A path that does not
    /// exist yet is written with the ranges calibrated now. Here the calibration algorithm
    /// defaults to minmax (docs/quantize.md, "Calibration"), not entropy.
    #[arg(long = "calibration-cache", value_name = "FILE")]
    calibration_cache: Option<PathBuf>,
    #[command(flatten)]
    calib: CalibAlgoArgs,
    /// Percentile of |x| for `--calibration-algo percentile`, in (0, 100].
    #[arg(long, value_name = "P")]
    percentile: Option<f64>,
    /// Calibration data: Polygraphy inputs JSON (a list of feed dicts) or `.npz` files (same
    /// as --load-inputs). int8/fp8 need data, a data-loader script, an existing
    /// --calibration-cache, or an explicit --val-range for generated inputs.
    #[arg(long, num_args = 1.., value_name = "FILE")]
    data: Vec<PathBuf>,
    #[command(flatten)]
    inputs: DataArgs,
    /// Print every layer and what was done with it.
    #[arg(short, long)]
    verbose: bool,
}

pub fn run(args: QuantizeArgs) -> Result<ExitCode> {
    args.inputs.check_trt_options()?;
    let mut data = args.inputs.options();
    data.load_inputs.extend(args.data);
    let config = Config {
        model: args.model,
        int8: args.int8,
        fp8: args.fp8,
        int4_weights: args.int4_weights,
        nvfp4_weights: args.nvfp4_weights,
        block_size: args.block_size,
        exclude_op_types: args.exclude_op_types,
        exclude_nodes: args.exclude_nodes,
        exclude_from: args.exclude_from,
        calibration_cache: args.calibration_cache,
        calib: args.calib.options(),
        percentile: args.percentile,
        inputs: Inputs::Options(data),
    };
    config.scheme()?;
    if args.output == config.model {
        bail!(
            "{}: the output would overwrite the input model; choose another -o",
            args.output.display()
        );
    }
    let bar = Bar::calibration(std::io::stderr().is_terminal());
    let q = quantize::run(&config, &mut print_event, &bar)?;
    write_model(&args.output, &q.model)?;
    for n in &q.notes {
        println!("[W] {n}");
    }
    if args.verbose {
        for (name, op, what) in q.layers() {
            println!("[I]     {name:<40} {op:<14} {what}");
        }
    }
    println!("[I] {}", q.summary());
    println!(
        "[I] Wrote {} ({} activation(s) and {} weight(s) quantized)",
        args.output.display(),
        q.quantized_activations,
        q.quantized_weights
    );
    Ok(ExitCode::SUCCESS)
}
