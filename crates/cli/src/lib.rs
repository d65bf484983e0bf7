//! The command line: argument parsing and printing only; all work is done by the library.

mod calibrate;
mod check_args;
mod compare_args;
mod convert;
mod debug;
mod inspect;
mod plan;
mod precision_args;
mod progress;
mod quantize;
mod run;
mod style;
mod trt_args;
mod verify_engine;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "mixprec",
    version,
    about = "Find which layers of an ONNX network must stay in higher precision.",
    long_about = "mixprec runs ONNX models in a native FP32 reference interpreter (matching ONNX Runtime), \
with Polygraphy-compatible inputs, golden outputs and comparisons."
)]
pub struct Cli {
    /// Worker threads for kernels (default: all cores; RAYON_NUM_THREADS also works).
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Show a model's inputs, outputs, opset and layer table (op, output shapes, FLOPs, parameters).
    Inspect(inspect::InspectArgs),
    /// Run a model in FP32 or reduced precision on generated or loaded inputs; save or compare outputs (Polygraphy-style).
    Run(Box<run::RunArgs>),
    /// Calibrate int8/fp8 ranges over FP32 runs (minmax, entropy, percentile); write a TensorRT calibration cache.
    Calibrate(Box<calibrate::CalibrateArgs>),
    /// Write a precision plan as a mixed-precision ONNX model (Casts for fp16/bf16, Q/DQ for int8/fp8).
    Convert(Box<convert::ConvertArgs>),
    /// Insert explicit quantization (Q/DQ) into a float model: int8/fp8 with calibration, or int4/NVFP4 weight-only; exclusions by op type, name or a search's answer.
    Quantize(Box<quantize::QuantizeArgs>),
    /// The cheapest format per layer (fp8, int8, fp16, bf16) under an accuracy criterion and a cost model (latency, bytes or effective bits on a target GPU); writes the strongly typed mixed-precision model.
    Plan(Box<plan::PlanArgs>),
    /// Debugging tools: `debug precision` finds the layers that must stay in higher precision.
    Debug(debug::DebugArgs),
    /// Polygraphy's older spelling of `debug precision`: `precision bisect|linear|worst-first|minimal MODEL --mode forward|reverse`.
    Precision(Box<debug::LegacyPrecisionArgs>),
    /// Did the engine obey? Map a TensorRT engine's layer information (trtexec --exportLayerInfo JSON or polygraphy inspect text) to ONNX nodes and list every node whose engine precision differs from the plan or the exported model.
    VerifyEngine(Box<verify_engine::VerifyEngineArgs>),
}

/// Runs the CLI and maps errors to one line on stderr and exit code 1.
pub fn main() -> ExitCode {
    main_from(std::env::args_os())
}

/// [`main`] on these arguments (the program name first), as the Python package's `mixprec`
/// command runs it in process.
pub fn main_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = Cli::command().get_matches_from(args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Polygraphy runs and compares runners in command-line order.
    let trt_first = matches.subcommand_matches("run").is_none_or(run::trt_first);
    // Models run on this thread, as worker 0 of the kernels' pool (mixprec::threads).
    if let Err(e) = mixprec::threads::run_kernels_on_the_calling_thread(cli.threads) {
        eprintln!("warning: the kernels' thread pool was not set up: {e}");
    }
    let result = match cli.command {
        Command::Inspect(a) => inspect::run(a),
        Command::Run(a) => run::run(*a, trt_first),
        Command::Calibrate(a) => calibrate::run(*a),
        Command::Convert(a) => convert::run(*a),
        Command::Quantize(a) => quantize::run(*a),
        Command::Plan(a) => plan::run(*a),
        Command::Debug(a) => debug::run(a),
        Command::Precision(a) => debug::run_legacy(*a),
        Command::VerifyEngine(a) => verify_engine::run(*a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definitions_are_consistent() {
        // Duplicate flags across flattened groups (Polygraphy's many options) panic here.
        Cli::command().debug_assert();
    }

    #[test]
    fn runner_order_follows_the_command_line() {
        let order = |args: &[&str]| {
            let m = Cli::command().get_matches_from(args);
            run::trt_first(m.subcommand_matches("run").unwrap())
        };
        assert!(order(&[
            "mixprec", "run", "m.onnx", "--trt", "--fp16", "--onnxrt"
        ]));
        assert!(!order(&["mixprec", "run", "m.onnx", "--onnxrt", "--trt"]));
    }
}
