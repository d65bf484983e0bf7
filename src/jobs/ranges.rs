//! Activation ranges for int8/fp8 plans: from a calibration cache, or calibrated on the fly
//! over the run's own inputs (and saved to the cache path when one is given), as Polygraphy
//! does with TensorRT.

use super::options::PrecisionOptions;
use crate::calib::{calibrate, CalibrationCache};
use crate::error::{Error, Result};
use crate::event::{Event, Progress};
use crate::exec::emulate::required_ranges;
use crate::exec::Feeds;
use crate::precision::plan::PrecisionPlan;
use crate::Interpreter;
use std::collections::BTreeMap;

/// The activation ranges `plan` needs (None when it has no quantized layer). Notes go to
/// `events`, the calibration's progress to `progress`.
pub fn ranges_for_plan(
    interp: &Interpreter,
    plan: &PrecisionPlan,
    options: &PrecisionOptions,
    feeds: &[Feeds],
    events: &mut dyn FnMut(Event),
    progress: &dyn Progress,
) -> Result<Option<BTreeMap<String, f32>>> {
    if !PrecisionOptions::needs_ranges(plan) {
        return Ok(None);
    }
    let graph = interp.graph();
    let needed = required_ranges(graph, plan);
    match &options.calibration_cache {
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
                events(Event::Warning(format!(
                    "{}: {} tensor(s) are not in this model ({}); is the cache from another model?",
                    path.display(),
                    foreign.len(),
                    first_few(&foreign)
                )));
            }
            let amax = cache.amax_map();
            let missing: Vec<&str> = needed
                .iter()
                .map(String::as_str)
                .filter(|n| !amax.contains_key(*n))
                .collect();
            if !missing.is_empty() {
                return Err(Error::Data {
                    path: path.clone(),
                    msg: format!(
                        "no range for {} tensor(s) that int8/fp8 layers read ({}); recalibrate with `mixprec calibrate` or delete the cache to calibrate on the fly",
                        missing.len(),
                        first_few(&missing)
                    ),
                });
            }
            Ok(Some(amax))
        }
        other => {
            let algo = options.calib.algo(None, events)?;
            events(Event::Info(format!(
                "Calibrating int8/fp8 ranges ({algo}) over {} input set(s)...",
                feeds.len()
            )));
            let cache = calibrate(interp, feeds, algo, progress)?;
            if let Some(path) = other {
                cache.write(path)?;
                events(Event::Info(format!(
                    "Saved calibration cache to {}",
                    path.display()
                )));
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
