//! `mixprec calibrate`: per-tensor int8 ranges from FP32 runs over calibration data, written
//! as a TensorRT calibration cache (`trtexec --calib`, `polygraphy --calibration-cache`).

use super::precision_args::CalibAlgoArgs;
use super::run::DataArgs;
use anyhow::Result;
use clap::Args;
use mixprec::calib::{self, CalibAlgo, CalibrationReport};
use mixprec::compare::fmt_g;
use mixprec::jobs::calibrate;
use mixprec::jobs::options::Inputs;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Calibration data: Polygraphy inputs JSON (a list of feed dicts, e.g. from
    /// `--save-inputs`) or `.npz` (one feed set per file). Without it, inputs are generated
    /// from --val-range/--seed/--iterations/--input-shapes.
    #[arg(long, num_args = 1.., value_name = "FILE")]
    data: Vec<PathBuf>,
    #[command(flatten)]
    inputs: DataArgs,
    /// Calibration algorithm: entropy (TensorRT's EntropyCalibration2, the default), minmax,
    /// or percentile (also spelled --calibration-algo; or Polygraphy's
    /// --calibration-base-class IInt8MinMaxCalibrator ...).
    #[arg(long, value_name = "ALGO")]
    algo: Option<String>,
    #[command(flatten)]
    calib: CalibAlgoArgs,
    /// Percentile of |x| for `--algo percentile`, in (0, 100].
    #[arg(long, value_name = "P")]
    percentile: Option<f64>,
    /// Where to write the calibration cache (TensorRT's text format).
    #[arg(long, alias = "calibration-cache", value_name = "FILE")]
    cache: PathBuf,
    /// Header line of the cache instead of `TRT-8601-<algorithm>` (e.g.
    /// `TRT-8601-EntropyCalibration2` so trtexec's entropy calibrator accepts minmax ranges).
    #[arg(long = "cache-header", value_name = "HEADER")]
    cache_header: Option<String>,
    /// Print every tensor's max |x|, amax and scale.
    #[arg(short, long)]
    verbose: bool,
}

pub fn run(args: CalibrateArgs) -> Result<ExitCode> {
    args.inputs.check_trt_options()?;
    let config = calibrate::Config {
        model: args.model.clone(),
        files: args.data.clone(),
        inputs: Inputs::Options(args.inputs.options()),
        algo: args.algo.clone(),
        calib: args.calib.options(),
        percentile: args.percentile,
        cache: Some(args.cache.clone()),
        cache_header: args.cache_header.clone(),
    };
    let bar = super::progress::Bar::calibration(std::io::stderr().is_terminal());
    let done = calibrate::run(&config, &mut super::progress::print_event, &bar)?;
    print_summary(&done.report, done.seconds, args.verbose);
    println!(
        "[I] Wrote calibration cache {} ({}, {} tensor(s))",
        args.cache.display(),
        done.cache.header,
        done.cache.len()
    );
    Ok(ExitCode::SUCCESS)
}

fn print_summary(r: &CalibrationReport, secs: f64, verbose: bool) {
    let in_cache = r.tensors.iter().filter(|t| t.in_cache).count();
    let clipped = r
        .tensors
        .iter()
        .filter(|t| t.in_cache && t.amax < t.max_abs)
        .count();
    println!(
        "[I] Calibrated {in_cache} tensor(s) with {} over {} batch(es) ({} run(s)) in {} ms{}",
        r.algo,
        r.batches,
        r.runs,
        fmt_g(secs * 1e3, 4),
        if matches!(r.algo, CalibAlgo::MinMax) {
            String::new()
        } else {
            format!(" | {clipped} range(s) clipped below max |x|")
        }
    );
    for t in &r.tensors {
        if !t.in_cache {
            eprintln!(
                "warning: tensor '{}' held no finite value; it is not in the cache",
                t.name
            );
        } else if t.infinite > 0 {
            eprintln!(
                "warning: tensor '{}' held {} infinite value(s); they were left out of its range",
                t.name, t.infinite
            );
        }
    }
    if verbose {
        let width = r
            .tensors
            .iter()
            .map(|t| t.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(6);
        println!(
            "[I]     {:<width$}  {:>12}  {:>12}  {:>12}  {:>8}",
            "tensor", "max|x|", "amax", "scale", "hex"
        );
        for t in r.tensors.iter().filter(|t| t.in_cache) {
            println!(
                "[I]     {:<width$}  {:>12}  {:>12}  {:>12}  {:>8}",
                t.name,
                fmt_g(t.max_abs as f64, 6),
                fmt_g(t.amax as f64, 6),
                fmt_g(t.scale as f64, 6),
                calib::cache::scale_to_hex(t.scale)
            );
        }
    }
}
