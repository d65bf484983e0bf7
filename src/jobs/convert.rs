//! `convert` as a library job: a precision plan written as a deployable mixed-precision ONNX
//! model (Casts around float16/bfloat16 layers, QuantizeLinear/DequantizeLinear for int8/fp8,
//! with ranges from a calibration cache or calibrated on the inputs).

use super::options::{Inputs, PrecisionOptions};
use super::ranges::ranges_for_plan;
use crate::error::{Error, Result};
use crate::event::{Event, Progress};
use crate::export::{export, ExportOptions};
use crate::onnx::Model;
use crate::precision::plan::PrecisionPlan;
use crate::{load_model, Interpreter};
use std::path::PathBuf;
use std::sync::Arc;

/// What to convert.
#[derive(Clone, Debug)]
pub struct Config {
    pub model: PathBuf,
    pub precision: PrecisionOptions,
    /// Inputs to calibrate on when int8/fp8 layers have no calibration cache.
    pub inputs: Inputs,
    /// Graph inputs and outputs keep their types (Casts inside the model); `--no-keep-io-types`
    /// clears it.
    pub keep_io_types: bool,
    /// Keep a float16/bfloat16 layer in float32 (with a note) when its op has no such type in
    /// the model's opset, instead of failing.
    pub fallback: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            model: PathBuf::new(),
            precision: PrecisionOptions::default(),
            inputs: Inputs::default(),
            keep_io_types: true,
            fallback: false,
        }
    }
}

/// The converted model and what the conversion did.
pub struct Outcome {
    /// The model converted (as loaded).
    pub source: Model,
    pub plan: PrecisionPlan,
    pub model: Arc<crate::onnx::proto::ModelProto>,
    /// Layers kept in float32 (`fallback`) and other notes on the conversion.
    pub notes: Vec<String>,
    pub casts: usize,
    pub quantized_activations: usize,
    pub quantized_weights: usize,
}

/// Converts the model; notes go to `events`, a calibration's progress to `progress`.
pub fn run(
    config: &Config,
    events: &mut dyn FnMut(Event),
    progress: &dyn Progress,
) -> Result<Outcome> {
    if !config.precision.any() {
        return Err(Error::Invalid("nothing to convert: give a precision (--fp16, --bf16, --int8, --fp8 or --layer-precisions)".into()));
    }
    let source = load_model(&config.model)?;
    let graph = &source.graph;
    let plan = config.precision.plan(graph, events)?;
    let amax = if PrecisionOptions::needs_ranges(&plan) {
        let interp = Interpreter::new(graph)?;
        let cached = config
            .precision
            .calibration_cache
            .as_ref()
            .is_some_and(|p| p.exists());
        let feeds = if cached {
            Vec::new()
        } else {
            config.inputs.feeds(graph, events)?
        };
        ranges_for_plan(&interp, &plan, &config.precision, &feeds, events, progress)?
    } else {
        None
    };
    let exported = export(
        &source,
        &plan,
        amax.as_ref(),
        &ExportOptions {
            keep_io_types: config.keep_io_types,
            fallback: config.fallback,
        },
    )?;
    Ok(Outcome {
        plan,
        model: Arc::new(exported.model),
        notes: exported.notes,
        casts: exported.casts,
        quantized_activations: exported.quantized_activations,
        quantized_weights: exported.quantized_weights,
        source,
    })
}
