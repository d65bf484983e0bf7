//! `quantize` as a library job: a float model given explicit quantization (Q/DQ) — int8/fp8
//! with calibrated activations and per-channel weights, or int4/NVFP4 weight-only. The work is
//! `crate::quantize`; this job picks the scheme, the exclusions and the calibration.

use super::options::{CalibOptions, Inputs, PrecisionOptions};
use super::ranges::ranges_for_plan;
use crate::calib::CalibAlgo;
use crate::error::{Error, Result};
use crate::event::{Event, Progress};
use crate::onnx::proto::ModelProto;
use crate::onnx::Model;
use crate::quantize::{self, weights, QuantizeOptions, Scheme, Selection};
use crate::{load_model, Interpreter};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What to quantize and how.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub model: PathBuf,
    /// Exactly one of the four schemes.
    pub int8: bool,
    pub fp8: bool,
    pub int4_weights: bool,
    pub nvfp4_weights: bool,
    /// Block size of the weight-only schemes (defaults: int4 128, NVFP4 16).
    pub block_size: Option<usize>,
    /// Op types left in float32.
    pub exclude_op_types: Vec<String>,
    /// Regular expressions on node names: matches stay float32.
    pub exclude_nodes: Vec<String>,
    /// A `debug precision --save-result` file whose answer's layers stay float32.
    pub exclude_from: Option<PathBuf>,
    /// TensorRT calibration cache: read when it exists, else written with the ranges found.
    pub calibration_cache: Option<PathBuf>,
    /// The calibration algorithm (default here: minmax).
    pub calib: CalibOptions,
    /// Percentile of |x| for the percentile algorithm.
    pub percentile: Option<f64>,
    /// Calibration data.
    pub inputs: Inputs,
}

/// The quantized model and what was done.
pub struct Outcome {
    /// The model quantized (as loaded).
    pub source: Model,
    pub scheme: Scheme,
    pub model: ModelProto,
    pub selection: Selection,
    /// The activation ranges used (int8/fp8), tensor name → amax.
    pub ranges: Option<BTreeMap<String, f32>>,
    /// Notes on the written model (weights that could not be stored quantized, ...).
    pub notes: Vec<String>,
    pub quantized_activations: usize,
    pub quantized_weights: usize,
}

impl Config {
    /// The scheme the flags ask for.
    pub fn scheme(&self) -> Result<Scheme> {
        let invalid = |m: String| Err(Error::Invalid(m));
        let given = [self.int8, self.fp8, self.int4_weights, self.nvfp4_weights]
            .iter()
            .filter(|&&b| b)
            .count();
        if given != 1 {
            return invalid(format!(
                "give exactly one of --int8, --fp8, --int4-weights, --nvfp4-weights ({given} given)"
            ));
        }
        if self.block_size.is_some() && (self.int8 || self.fp8) {
            return invalid(
                "--block-size applies to --int4-weights and --nvfp4-weights only".into(),
            );
        }
        if self.block_size == Some(0) {
            return invalid("--block-size must be at least 1".into());
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

    /// Calibration data was given (files, a script or in-memory sets).
    fn has_data(&self) -> bool {
        match &self.inputs {
            Inputs::Feeds(_) => true,
            Inputs::Options(d) => !d.load_inputs.is_empty() || d.data_loader_script.is_some(),
        }
    }

    fn calibration_options_given(&self) -> bool {
        self.calibration_cache.is_some()
            || self.calib.calibration_algo.is_some()
            || self.calib.base_class.is_some()
            || self.percentile.is_some()
            || self.has_data()
    }

    /// The calibration options with quantize's defaults: minmax, not the entropy the
    /// TensorRT-calibration commands default to — on all eight models of bench/quantize.sh it
    /// was as close to FP32 or closer (docs/quantize.md, "Calibration").
    fn calibration(&self, events: &mut dyn FnMut(Event)) -> Result<CalibOptions> {
        let mut calib = self.calib.clone();
        if calib.calibration_algo.is_none() && calib.base_class.is_none() {
            calib.calibration_algo = Some("minmax".into());
        }
        if let Some(p) = self.percentile {
            match calib.algo(None, events)? {
                CalibAlgo::Percentile(_) => {
                    calib.calibration_algo = Some(format!("percentile:{p}"));
                    calib.base_class = None;
                }
                a => {
                    return Err(Error::Invalid(format!(
                    "--percentile {p} only applies to --calibration-algo percentile (the algorithm is {a})"
                )))
                }
            }
        }
        Ok(calib)
    }
}

/// Quantizes the model; warnings go to `events`, a calibration's progress to `progress`.
pub fn run(
    config: &Config,
    events: &mut dyn FnMut(Event),
    progress: &dyn Progress,
) -> Result<Outcome> {
    let scheme = config.scheme()?;
    if scheme.is_weight_only() && config.calibration_options_given() {
        events(Event::Warning(format!(
            "{} quantization needs no calibration: the calibration options are ignored",
            scheme.name()
        )));
    }
    let source = load_model(&config.model)?;
    let graph = &source.graph;
    quantize::check_not_quantized(graph)
        .map_err(|e| Error::Invalid(format!("{}: {e}", config.model.display())))?;

    let mut opts = QuantizeOptions::new(scheme);
    opts.exclude_op_types = config.exclude_op_types.clone();
    opts.exclude_nodes = config.exclude_nodes.clone();
    if let Some(p) = &config.exclude_from {
        opts.exclude_names = quantize::result_file_layers(p)?;
        opts.exclude_names_source = p.display().to_string();
        if opts.exclude_names.is_empty() {
            events(Event::Warning(format!(
                "{}: the answer lists no layer; nothing is excluded by it",
                p.display()
            )));
        }
    }
    let selection = quantize::select(graph, &opts)?;
    for n in &selection.notes {
        events(Event::Warning(n.clone()));
    }
    let ranges = match quantize::plan(graph, &selection, scheme) {
        Some(plan) if !selection.quantized.is_empty() => {
            let interp = Interpreter::new(graph)?;
            let cached = config
                .calibration_cache
                .as_ref()
                .is_some_and(|p| p.exists());
            let feeds = if cached {
                Vec::new()
            } else {
                let generated_range = match &config.inputs {
                    Inputs::Options(d) => !d.val_range.is_empty(),
                    Inputs::Feeds(_) => false,
                };
                if !config.has_data() && !generated_range {
                    return Err(Error::Invalid(format!(
                        "{} quantization needs calibration data: give --data/--load-inputs FILE..., --data-loader-script, an existing --calibration-cache, or --val-range to calibrate on generated inputs",
                        scheme.name()
                    )));
                }
                let feeds = config.inputs.feeds(graph, events)?;
                for (i, f) in feeds.iter().enumerate() {
                    interp
                        .check_feeds(f)
                        .map_err(|e| Error::Invalid(format!("calibration input set {i}: {e}")))?;
                }
                feeds
            };
            let precision = PrecisionOptions {
                int8: scheme == Scheme::Int8,
                fp8: scheme == Scheme::Fp8,
                calibration_cache: config.calibration_cache.clone(),
                calib: config.calibration(events)?,
                ..Default::default()
            };
            ranges_for_plan(&interp, &plan, &precision, &feeds, events, progress)?
        }
        _ => None,
    };
    let q = quantize::quantize(&source, scheme, &selection, ranges.as_ref())?;
    Ok(Outcome {
        scheme,
        model: q.model,
        selection,
        ranges,
        notes: q.notes,
        quantized_activations: q.quantized_activations,
        quantized_weights: q.quantized_weights,
        source,
    })
}

impl Outcome {
    /// Every layer of a quantized op type and what was done with it: (name, op type, what).
    pub fn layers(&self) -> Vec<(String, String, String)> {
        let sel = &self.selection;
        let mut rows = Vec::new();
        for (k, node) in self.source.graph.nodes.iter().enumerate() {
            let what = if sel.quantized.contains(&k) {
                self.scheme.name().to_string()
            } else if let Some(e) = sel.excluded.iter().find(|e| e.index == k) {
                format!("float32 (excluded: {})", e.reason)
            } else if let Some(e) = sel.skipped.iter().find(|e| e.index == k) {
                format!("float32 ({})", e.reason)
            } else {
                continue;
            };
            rows.push((node.name.clone(), node.op_type.clone(), what));
        }
        rows
    }

    /// Names of the layers quantized.
    pub fn quantized(&self) -> Vec<String> {
        let nodes = &self.source.graph.nodes;
        self.selection
            .quantized
            .iter()
            .map(|&k| nodes[k].name.clone())
            .collect()
    }

    /// The summary: how many layers were quantized, which were excluded, how many skipped.
    pub fn summary(&self) -> String {
        let sel = &self.selection;
        let excluded: Vec<&str> = sel
            .excluded
            .iter()
            .map(|e| self.source.graph.nodes[e.index].name.as_str())
            .collect();
        let listed = if excluded.is_empty() {
            String::new()
        } else {
            let first: Vec<&str> = excluded.iter().take(8).copied().collect();
            let more = if excluded.len() > 8 { ", ..." } else { "" };
            format!(" ({}{more})", first.join(", "))
        };
        let skipped = if sel.skipped.is_empty() {
            String::new()
        } else {
            format!(
                "; {} without a quantizable weight left in float32 (-v lists them)",
                sel.skipped.len()
            )
        };
        format!(
            "Quantized {} layer(s) to {}; {} excluded{listed}{skipped}",
            sel.quantized.len(),
            self.scheme.name(),
            excluded.len(),
        )
    }
}
