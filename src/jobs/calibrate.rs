//! `calibrate` as a library job: per-tensor int8 ranges from FP32 runs over calibration data,
//! as a TensorRT calibration cache (`trtexec --calib`, `polygraphy --calibration-cache`).

use super::options::{CalibOptions, DataOptions, Inputs};
use crate::calib::{self, CalibAlgo, CalibrationCache, CalibrationReport};
use crate::error::{Error, Result};
use crate::event::{Event, Progress};
use crate::exec::Feeds;
use crate::{load_model, Interpreter};
use std::path::PathBuf;
use std::time::Instant;

/// What to calibrate.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub model: PathBuf,
    /// Calibration data files (Polygraphy inputs JSON or `.npz`, read by content); with none,
    /// `inputs`.
    pub files: Vec<PathBuf>,
    pub inputs: Inputs,
    /// The algorithm by mixprec's name (`--algo`), else `calib`'s.
    pub algo: Option<String>,
    pub calib: CalibOptions,
    /// Percentile of |x| for the percentile algorithm, in (0, 100].
    pub percentile: Option<f64>,
    /// Where to write the cache.
    pub cache: Option<PathBuf>,
    /// The cache's header line instead of `TRT-8601-<algorithm>`.
    pub cache_header: Option<String>,
}

/// What a calibration measured.
pub struct Outcome {
    pub report: CalibrationReport,
    /// The cache as written (its header set).
    pub cache: CalibrationCache,
    /// The calibration's own time (loading aside).
    pub seconds: f64,
}

impl Config {
    /// The algorithm, checked with the percentile and the header.
    fn algo(&self, events: &mut dyn FnMut(Event)) -> Result<CalibAlgo> {
        let mut algo = self.calib.algo(self.algo.as_deref(), events)?;
        if let Some(p) = self.percentile {
            match algo {
                CalibAlgo::Percentile(_) => {
                    algo = CalibAlgo::percentile(p)
                        .map_err(|e| Error::Invalid(format!("--percentile: {e}")))?
                }
                _ => {
                    return Err(Error::Invalid(format!(
                    "--percentile {p} only applies to --algo percentile (the algorithm is {algo})"
                )))
                }
            }
        }
        if let Some(h) = &self.cache_header {
            if !h.starts_with("TRT-") || h.contains(['\n', '\r']) || h.contains(": ") {
                return Err(Error::Invalid(format!(
                    "--cache-header '{h}': expected one line such as 'TRT-8601-EntropyCalibration2'"
                )));
            }
        }
        Ok(algo)
    }
}

/// Calibrates; notes go to `events`, the passes' progress to `progress`.
pub fn run(
    config: &Config,
    events: &mut dyn FnMut(Event),
    progress: &dyn Progress,
) -> Result<Outcome> {
    let algo = config.algo(events)?;
    let model = load_model(&config.model)?;
    let interp = Interpreter::new(&model.graph)?;
    let mut files = config.files.clone();
    if let Inputs::Options(DataOptions { load_inputs, .. }) = &config.inputs {
        files.extend(load_inputs.iter().cloned());
    }
    // Each set is checked before the (long) passes; an error names where the set came from.
    let batches: Vec<Feeds> = if files.is_empty() {
        let feeds = config.inputs.feeds(&model.graph, events)?;
        for (i, f) in feeds.iter().enumerate() {
            interp
                .check_feeds(f)
                .map_err(|e| Error::Invalid(format!("generated input set {i}: {e}")))?;
        }
        feeds
    } else {
        let mut all = Vec::new();
        for path in &files {
            let sets = crate::data::load_input_sets(path)?;
            let many = sets.len() > 1;
            for (i, f) in sets.into_iter().enumerate() {
                interp.check_feeds(&f).map_err(|e| Error::Data {
                    path: path.clone(),
                    msg: if many {
                        format!("input set {i}: {e}")
                    } else {
                        e.to_string()
                    },
                })?;
                all.push(f);
            }
        }
        all
    };
    let start = Instant::now();
    let report = calib::calibrate_report(&interp, &batches, algo, progress)?;
    let seconds = start.elapsed().as_secs_f64();
    let mut cache = report.cache.clone();
    if let Some(h) = &config.cache_header {
        cache.header = h.clone();
    }
    if let Some(path) = &config.cache {
        cache.write(path)?;
    }
    Ok(Outcome {
        report,
        cache,
        seconds,
    })
}
