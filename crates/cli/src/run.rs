//! `mixprec run`: FP32 inference with Polygraphy's data options, saving and comparing outputs.

use super::compare_args::CompareArgs;
use super::precision_args::PrecisionArgs;
use super::progress::{print_event, Bar};
use super::style::{Out, StyleArgs};
use super::trt_args::TrtOnlyArgs;
use anyhow::{Context, Result};
use clap::Args;
use mixprec::jobs::options::{DataOptions, Inputs};
use mixprec::jobs::run::{Config, Sinks};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Where inputs come from: Polygraphy's data-loader options.
#[derive(Args, Debug, Clone)]
pub struct DataArgs {
    /// Value range of generated inputs: `name:[lo,hi]` per input, or `[lo,hi]` for all (default [0,1]).
    #[arg(long = "val-range", num_args = 1.., value_name = "RANGE")]
    pub val_range: Vec<String>,
    /// Seed of the input generator (Polygraphy's default is 1).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Number of generated input sets (default 1); with --data-loader-script, the most feed
    /// dicts taken from the script (default: all it yields).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// Shapes for inputs with dynamic dimensions: `name:[1,3,224,224]`.
    #[arg(long = "input-shapes", num_args = 1.., value_name = "SHAPE")]
    pub input_shapes: Vec<String>,
    /// Load inputs instead of generating them: Polygraphy JSON (a list of feed dicts, or a
    /// directory of per-iteration files) or `.npz`.
    #[arg(long = "load-inputs", alias = "load-input-data", num_args = 1.., value_name = "FILE")]
    pub load_inputs: Vec<PathBuf>,
    /// Polygraphy's data-loader script: `file.py[:func]`, where `func` (default `load_data`)
    /// returns an iterable of feed dicts `{input name: numpy array}`. Runs in a child Python
    /// (`MIXPREC_PYTHON`, else `python3`) that streams the arrays back.
    #[arg(long = "data-loader-script", value_name = "FILE.py[:FUNC]")]
    pub data_loader_script: Option<String>,
    /// Polygraphy's older way to name the script's function (`--data-loader-script f.py:func`
    /// is the same).
    #[arg(long = "data-loader-func-name", value_name = "FUNC", hide = true)]
    pub data_loader_func_name: Option<String>,
    #[command(flatten)]
    pub trt: Box<TrtOnlyArgs>,
}

impl DataArgs {
    /// Refuses TensorRT options without a counterpart and prints one warning naming those
    /// with no effect. Every command with these options calls it first.
    pub fn check_trt_options(&self) -> Result<()> {
        if let Some(w) = self.trt.check()? {
            eprintln!("warning: {w}");
        }
        Ok(())
    }

    /// These options as the library holds them.
    pub fn options(&self) -> DataOptions {
        DataOptions {
            val_range: self.val_range.clone(),
            seed: self.seed,
            iterations: self.iterations,
            input_shapes: self.input_shapes.clone(),
            opt_shapes: self.trt.trt_opt_shapes.clone(),
            load_inputs: self.load_inputs.clone(),
            data_loader_script: self.data_loader_script.clone(),
            data_loader_func_name: self.data_loader_func_name.clone(),
        }
    }

    /// The input shapes `--input-shapes` and `--trt-opt-shapes` set (TensorRT's
    /// optimization-profile shapes: opt is the shape the engine is tuned for).
    pub fn shape_overrides(&self) -> Result<std::collections::BTreeMap<String, Vec<usize>>> {
        Ok(self.options().shape_overrides()?)
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The ONNX model.
    model: PathBuf,
    #[command(flatten)]
    data: DataArgs,
    /// Save the inputs used: Polygraphy JSON (loadable by `polygraphy run --load-inputs`) or `.npz`.
    #[arg(long = "save-inputs", value_name = "FILE")]
    save_inputs: Option<PathBuf>,
    /// Save every runner's outputs (every marked tensor) as a Polygraphy RunResults JSON
    /// (loadable by `polygraphy run --load-outputs`); a path without an extension is a
    /// directory with one JSON per iteration, as Polygraphy 0.53 writes it.
    #[arg(long = "save-outputs", alias = "save-results", value_name = "FILE")]
    save_outputs: Option<PathBuf>,
    /// Compare against saved results (RunResults JSON files or per-iteration directories, e.g.
    /// from `polygraphy run --save-outputs`): each run is compared with the next one, live
    /// runners first, as Polygraphy does.
    #[arg(long = "load-outputs", alias = "load-results", num_args = 1.., value_name = "FILE")]
    load_outputs: Vec<PathBuf>,
    /// Polygraphy's ONNX-Runtime runner: mixprec's FP32 reference interpreter.
    #[arg(long)]
    onnxrt: bool,
    /// Polygraphy's TensorRT runner: the emulated engine under --fp16/--bf16/--fp8/--int8/
    /// --layer-precisions (float32 without them). With --onnxrt too, the runs are compared in
    /// command-line order (`--trt ... --onnxrt`: TensorRT against ONNX-Runtime).
    #[arg(long)]
    trt: bool,
    /// Tensors the --trt runner returns: names, or `mark all` for every layer's output
    /// (in topological order). They are compared, printed and saved like outputs.
    #[arg(long = "trt-outputs", num_args = 1.., value_name = "TENSOR")]
    trt_outputs: Vec<String>,
    /// Tensors left out of --trt-outputs mark all.
    #[arg(long = "trt-exclude-outputs", num_args = 1.., value_name = "TENSOR")]
    trt_exclude_outputs: Vec<String>,
    /// Tensors the --onnxrt runner returns: names, or `mark all`.
    #[arg(long = "onnx-outputs", num_args = 1.., value_name = "TENSOR")]
    onnx_outputs: Vec<String>,
    /// Tensors left out of --onnx-outputs mark all.
    #[arg(long = "onnx-exclude-outputs", num_args = 1.., value_name = "TENSOR")]
    onnx_exclude_outputs: Vec<String>,
    #[command(flatten)]
    compare: CompareArgs,
    /// Fail when an output of the model holds NaN or Inf (Polygraphy's --validate).
    #[arg(long)]
    validate: bool,
    /// Write the comparison statistics, required tolerances, metrics and verdicts of every
    /// iteration and output to this JSON file.
    #[arg(long = "save-error-metrics", value_name = "FILE")]
    save_error_metrics: Option<PathBuf>,
    /// Compare only the outputs present both in the model's results and in the golden file
    /// (warn about the others) instead of failing on a golden output the model lacks.
    #[arg(long = "allow-missing")]
    allow_missing: bool,
    /// Name of the runner in saved RunResults (default: mixprec-<precision>-runner; with
    /// --trt/--onnxrt Polygraphy's `trt-runner-N0-<date>-<time>`).
    #[arg(long = "runner-name")]
    runner_name: Option<String>,
    #[command(flatten)]
    precision: PrecisionArgs,
    /// Print the precision every layer ran in, the histograms of every compared output, and
    /// with --mark-all the layer table of every iteration.
    #[arg(long, short = 'v', conflicts_with = "quiet")]
    verbose: bool,
    #[command(flatten)]
    style: StyleArgs,
    /// Layer-wise comparison (Polygraphy's `--trt-outputs mark all`): compare every layer's
    /// output with the FP32 reference run on every input set, in topological order, with
    /// the error each layer adds over its inputs' error (the growth); uses --atol/--rtol/
    /// --check-error-stat per layer. Prints the table of iteration 0 (of every iteration with
    /// --verbose), a verdict line per other iteration, and with several input sets the worst
    /// per layer over all of them.
    #[arg(long = "mark-all")]
    mark_all: bool,
    /// Stop at the first output (with marked tensors: the first layer, in topological order)
    /// that fails, and compare no further input sets; with --mark-all, at the first failing layer.
    #[arg(long = "fail-fast")]
    fail_fast: bool,
    /// Time every layer (as ORT's profiler or trtexec --dumpProfile): per runner, the layers
    /// by average time per iteration, then the totals per op type. Layers that ran inside
    /// another as its epilogue are listed with it. The first iteration includes one-time work
    /// (weights packed for the kernels): pass --warm-up or several iterations.
    #[arg(long)]
    profile: bool,
    /// Runs of every runner on the first input set before the timed ones (Polygraphy's
    /// `--warm-up`): their results are discarded, and one-time work (weights packed for the
    /// kernels) leaves the reported times and --profile.
    #[arg(long = "warm-up", value_name = "N", default_value_t = 0)]
    warm_up: usize,
    /// Generate N tokens greedily through the KV cache from each input set's prompt
    /// (`input_ids`, from --load-inputs), as ONNX Runtime GenAI does, for models with its names
    /// (past_key_values.* / present.*, logits). The outputs become `tokens` [batch, N] and
    /// `logits` [batch, N, vocab] (each step's last position); see docs/compare.md.
    #[arg(long, value_name = "N")]
    decode: Option<usize>,
    /// Write a self-contained HTML report (verdict, output comparisons with histograms,
    /// layer-wise plot and table) to this file.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Print one JSON document on stdout (verdict, comparisons, layer-wise rows) instead of
    /// the log; see docs/compare.md for its fields.
    #[arg(long)]
    json: bool,
}

/// Whether `--trt` comes before `--onnxrt` on the command line (Polygraphy runs and compares
/// runners in that order).
pub fn trt_first(matches: &clap::ArgMatches) -> bool {
    match (matches.index_of("trt"), matches.index_of("onnxrt")) {
        (Some(t), Some(o)) => t < o,
        _ => true,
    }
}

pub fn run(args: RunArgs, trt_first: bool) -> Result<ExitCode> {
    let out = Out::new(&args.style, args.json);
    args.data.check_trt_options()?;
    let config = Config {
        model: args.model,
        inputs: Inputs::Options(args.data.options()),
        precision: args.precision.options(),
        compare: args.compare.options(),
        onnxrt: args.onnxrt,
        trt: args.trt,
        trt_first,
        trt_outputs: args.trt_outputs,
        trt_exclude_outputs: args.trt_exclude_outputs,
        onnx_outputs: args.onnx_outputs,
        onnx_exclude_outputs: args.onnx_exclude_outputs,
        load_outputs: args.load_outputs,
        save_inputs: args.save_inputs,
        save_outputs: args.save_outputs,
        save_error_metrics: args.save_error_metrics,
        report: args.report,
        validate: args.validate,
        allow_missing: args.allow_missing,
        runner_name: args.runner_name,
        mark_all: args.mark_all,
        fail_fast: args.fail_fast,
        profile: args.profile,
        warm_up: args.warm_up,
        decode: args.decode,
        verbose: args.verbose,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let bar = Bar::calibration(std::io::stderr().is_terminal());
    let outcome = mixprec::jobs::run::run(
        &config,
        &mut Sinks {
            log: &mut |t| out.log(t),
            events: &mut print_event,
            progress: &bar,
        },
    )?;
    let summary = &outcome.summary;
    if args.json {
        let json = serde_json::to_string_pretty(summary).context("serializing --json")?;
        println!("{json}");
    }
    let passed = summary.passed;
    out.verdict(&format!(
        "[{}] {} | Runtime: {:.3}s | Command: {}",
        if passed { "I" } else { "E" },
        if passed { "PASSED" } else { "FAILED" },
        summary.runtime_s,
        summary.command
    ));
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
