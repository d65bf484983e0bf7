//! `mixprec quantize`: writes a float model with explicit quantization (Q/DQ): int8/fp8 with
//! calibrated activations and per-channel weights, or int4/NVFP4 weight-only. The work is
//! `crate::quantize`; this file parses, calibrates through the shared options and prints.

use super::precision_args::{CalibAlgoArgs, PrecisionArgs};
use super::ranges::ranges_for_plan;
use super::run::DataArgs;
use crate::calib::CalibAlgo;
use crate::export::write_model;
use crate::quantize::{self, weights, QuantizeOptions, Scheme};
use crate::{load_model, Interpreter};
use anyhow::{bail, Context, Result};
use clap::Args;
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

impl QuantizeArgs {
    fn scheme(&self) -> Result<Scheme> {
        let given = [self.int8, self.fp8, self.int4_weights, self.nvfp4_weights]
            .iter()
            .filter(|&&b| b)
            .count();
        if given != 1 {
            bail!(
                "give exactly one of --int8, --fp8, --int4-weights, --nvfp4-weights ({given} given)"
            );
        }
        if self.block_size.is_some() && (self.int8 || self.fp8) {
            bail!("--block-size applies to --int4-weights and --nvfp4-weights only");
        }
        if self.block_size == Some(0) {
            bail!("--block-size must be at least 1");
        }
        Ok(if self.int8 {
            Scheme::Int8
        } else if self.fp8 {
            Scheme::Fp8
        } else if self.int4_weights {
            Scheme::Int4Weights {
                block_size: self.block_size.unwrap_or(weights::INT4_BLOCK),
            }
        } else {
            Scheme::Nvfp4Weights {
                block_size: self.block_size.unwrap_or(weights::NVFP4_BLOCK),
            }
        })
    }

    fn calibration_options_given(&self) -> bool {
        self.calibration_cache.is_some()
            || self.calib.calibration_algo.is_some()
            || self.calib.base_class.is_some()
            || self.percentile.is_some()
            || !self.data.is_empty()
            || !self.inputs.load_inputs.is_empty()
            || self.inputs.data_loader_script.is_some()
    }
}

pub fn run(mut args: QuantizeArgs) -> Result<ExitCode> {
    args.inputs.check_trt_options()?;
    let scheme = args.scheme()?;
    if args.output == args.model {
        bail!(
            "{}: the output would overwrite the input model; choose another -o",
            args.output.display()
        );
    }
    if scheme.is_weight_only() && args.calibration_options_given() {
        eprintln!(
            "warning: {} quantization needs no calibration: the calibration options are ignored",
            scheme.name()
        );
    }
    let model = load_model(&args.model)?;
    let graph = &model.graph;
    quantize::check_not_quantized(graph).with_context(|| format!("{}", args.model.display()))?;

    let mut opts = QuantizeOptions::new(scheme);
    opts.exclude_op_types = args.exclude_op_types.clone();
    opts.exclude_nodes = args.exclude_nodes.clone();
    if let Some(p) = &args.exclude_from {
        opts.exclude_names = quantize::result_file_layers(p)?;
        opts.exclude_names_source = p.display().to_string();
        if opts.exclude_names.is_empty() {
            eprintln!(
                "warning: {}: the answer lists no layer; nothing is excluded by it",
                p.display()
            );
        }
    }
    let sel = quantize::select(graph, &opts)?;
    for n in &sel.notes {
        eprintln!("warning: {n}");
    }

    let amax = match quantize::plan(graph, &sel, scheme) {
        Some(plan) if !sel.quantized.is_empty() => {
            let interp = Interpreter::new(graph)?;
            let cached = args.calibration_cache.as_ref().is_some_and(|p| p.exists());
            let feeds = if cached {
                Vec::new()
            } else {
                let has_data = !args.data.is_empty()
                    || !args.inputs.load_inputs.is_empty()
                    || args.inputs.data_loader_script.is_some();
                if !has_data && args.inputs.val_range.is_empty() {
                    bail!(
                        "{} quantization needs calibration data: give --data/--load-inputs FILE..., --data-loader-script, an existing --calibration-cache, or --val-range to calibrate on generated inputs",
                        scheme.name()
                    );
                }
                let files = std::mem::take(&mut args.data);
                args.inputs.load_inputs.extend(files);
                let feeds = args.inputs.feeds(graph)?;
                for (i, f) in feeds.iter().enumerate() {
                    interp
                        .check_feeds(f)
                        .with_context(|| format!("calibration input set {i}"))?;
                }
                feeds
            };
            let mut calib = args.calib.clone();
            // quantize's default is minmax, not the entropy the TensorRT-calibration commands
            // default to: on all eight models of bench/quantize.sh it was as close to FP32 or
            // closer (docs/quantize.md, "Calibration").
            if calib.calibration_algo.is_none() && calib.base_class.is_none() {
                calib.calibration_algo = Some("minmax".into());
            }
            if let Some(p) = args.percentile {
                match calib.algo(None)? {
                    CalibAlgo::Percentile(_) => {
                        calib.calibration_algo = Some(format!("percentile:{p}"));
                        calib.base_class = None;
                    }
                    a => bail!(
                        "--percentile {p} only applies to --calibration-algo percentile (the algorithm is {a})"
                    ),
                }
            }
            let pargs = PrecisionArgs {
                int8: scheme == Scheme::Int8,
                fp8: scheme == Scheme::Fp8,
                calibration_cache: args.calibration_cache.clone(),
                calib,
                ..Default::default()
            };
            ranges_for_plan(&interp, &plan, &pargs, &feeds)?
        }
        _ => None,
    };
    let q = quantize::quantize(&model, scheme, &sel, amax.as_ref())?;
    write_model(&args.output, &q.model)?;

    for n in &q.notes {
        println!("[W] {n}");
    }
    if args.verbose {
        for (k, node) in graph.nodes.iter().enumerate() {
            let what = if sel.quantized.contains(&k) {
                scheme.name().to_string()
            } else if let Some(e) = sel.excluded.iter().find(|e| e.index == k) {
                format!("float32 (excluded: {})", e.reason)
            } else if let Some(e) = sel.skipped.iter().find(|e| e.index == k) {
                format!("float32 ({})", e.reason)
            } else {
                continue;
            };
            println!("[I]     {:<40} {:<14} {what}", node.name, node.op_type);
        }
    }
    let excluded: Vec<&str> = sel
        .excluded
        .iter()
        .map(|e| graph.nodes[e.index].name.as_str())
        .collect();
    println!(
        "[I] Quantized {} layer(s) to {}; {} excluded{}{}",
        sel.quantized.len(),
        scheme.name(),
        excluded.len(),
        if excluded.is_empty() {
            String::new()
        } else {
            format!(
                " ({}{})",
                excluded
                    .iter()
                    .take(8)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
                if excluded.len() > 8 { ", ..." } else { "" }
            )
        },
        if sel.skipped.is_empty() {
            String::new()
        } else {
            format!(
                "; {} without a quantizable weight left in float32 (-v lists them)",
                sel.skipped.len()
            )
        }
    );
    println!(
        "[I] Wrote {} ({} activation(s) and {} weight(s) quantized)",
        args.output.display(),
        q.quantized_activations,
        q.quantized_weights
    );
    Ok(ExitCode::SUCCESS)
}
