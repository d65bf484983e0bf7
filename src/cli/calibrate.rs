//! `mixprec calibrate`: per-tensor int8 ranges from FP32 runs over calibration data, written
//! as a TensorRT calibration cache (`trtexec --calib`, `polygraphy --calibration-cache`).

use super::precision_args::CalibAlgoArgs;
use super::run::DataArgs;
use crate::calib::{self, CalibAlgo, CalibrationReport};
use crate::compare::fmt_g;
use crate::exec::Feeds;
use crate::{load_model, Interpreter};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

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
    let mut algo = args.calib.algo(args.algo.as_deref())?;
    if let Some(p) = args.percentile {
        match algo {
            CalibAlgo::Percentile(_) => algo = CalibAlgo::percentile(p).context("--percentile")?,
            _ => bail!(
                "--percentile {p} only applies to --algo percentile (the algorithm is {algo})"
            ),
        }
    }
    if let Some(h) = &args.cache_header {
        if !h.starts_with("TRT-") || h.contains(['\n', '\r']) || h.contains(": ") {
            bail!("--cache-header '{h}': expected one line such as 'TRT-8601-EntropyCalibration2'");
        }
    }
    let model = load_model(&args.model)?;
    let interp = Interpreter::new(&model.graph)?;

    // Calibration data: files (with where each set came from, for errors) or generated.
    let mut files = args.data.clone();
    files.extend(args.inputs.load_inputs.iter().cloned());
    let batches: Vec<Feeds> = if files.is_empty() {
        let feeds = args.inputs.feeds(&model.graph)?;
        for (i, f) in feeds.iter().enumerate() {
            interp
                .check_feeds(f)
                .with_context(|| format!("generated input set {i}"))?;
        }
        feeds
    } else {
        let mut all = Vec::new();
        for path in &files {
            let sets = load_data_file(path)?;
            let many = sets.len() > 1;
            for (i, f) in sets.into_iter().enumerate() {
                interp.check_feeds(&f).map_err(|e| {
                    if many {
                        anyhow!("{}: input set {i}: {e}", path.display())
                    } else {
                        anyhow!("{}: {e}", path.display())
                    }
                })?;
                all.push(f);
            }
        }
        all
    };

    let start = Instant::now();
    let bar = super::progress::Bar::calibration(std::io::stderr().is_terminal());
    let report = calib::calibrate_report(&interp, &batches, algo, &bar)?;
    let secs = start.elapsed().as_secs_f64();
    let mut cache = report.cache.clone();
    if let Some(h) = &args.cache_header {
        cache.header = h.clone();
    }
    cache.write(&args.cache)?;
    print_summary(&report, secs, args.verbose);
    println!(
        "[I] Wrote calibration cache {} ({}, {} tensor(s))",
        args.cache.display(),
        cache.header,
        cache.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// Input sets from one file, by content: a Polygraphy inputs JSON (a list) or one `.npz`.
fn load_data_file(path: &Path) -> Result<Vec<Feeds>> {
    Ok(crate::data::load_input_sets(path)?)
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
