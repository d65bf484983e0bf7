//! Activation ranges for int8/fp8 plans: from `--calibration-cache`, or calibrated on the fly
//! over the run's own inputs (and saved to the cache path when one is given), as Polygraphy
//! does with TensorRT.

use super::precision_args::PrecisionArgs;
use crate::calib::{calibrate, CalibrationCache};
use crate::exec::emulate::required_ranges;
use crate::exec::Feeds;
use crate::precision::plan::PrecisionPlan;
use crate::Interpreter;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::io::IsTerminal;

/// None when the plan has no quantized layer.
pub fn ranges_for_plan(
    interp: &Interpreter,
    plan: &PrecisionPlan,
    args: &PrecisionArgs,
    feeds: &[Feeds],
) -> Result<Option<BTreeMap<String, f32>>> {
    if !PrecisionArgs::needs_ranges(plan) {
        return Ok(None);
    }
    let graph = interp.graph();
    let needed = required_ranges(graph, plan);
    let progress = std::io::stderr().is_terminal();
    match &args.calibration_cache {
        Some(path) if path.exists() => {
            let cache = CalibrationCache::read(path)?;
            let known = crate::calib::value_names(graph);
            let foreign: Vec<&str> = cache
                .scales
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| !known.contains(*n))
                .collect();
            if !foreign.is_empty() {
                eprintln!(
                    "warning: {}: {} tensor(s) are not in this model ({}); is the cache from another model?",
                    path.display(),
                    foreign.len(),
                    first_few(&foreign)
                );
            }
            let amax = cache.amax_map();
            let missing: Vec<&str> = needed
                .iter()
                .map(String::as_str)
                .filter(|n| !amax.contains_key(*n))
                .collect();
            if !missing.is_empty() {
                bail!(
                    "{}: no range for {} tensor(s) that int8/fp8 layers read ({}); recalibrate with `mixprec calibrate` or delete the cache to calibrate on the fly",
                    path.display(),
                    missing.len(),
                    first_few(&missing)
                );
            }
            Ok(Some(amax))
        }
        other => {
            let algo = args.calib.algo(None)?;
            eprintln!(
                "[I] Calibrating int8/fp8 ranges ({algo}) over {} input set(s)...",
                feeds.len()
            );
            let cache = calibrate(
                interp,
                feeds,
                algo,
                &super::progress::Bar::calibration(progress),
            )?;
            if let Some(path) = other {
                cache.write(path)?;
                eprintln!("[I] Saved calibration cache to {}", path.display());
            }
            Ok(Some(cache.amax_map()))
        }
    }
}

/// The first 8 names, comma-separated, with `...` when there are more.
fn first_few(names: &[&str]) -> String {
    let mut s = names.iter().take(8).copied().collect::<Vec<_>>().join(", ");
    if names.len() > 8 {
        s.push_str(", ...");
    }
    s
}
