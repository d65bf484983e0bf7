//! `verify-engine` as a library job: did a TensorRT engine run every layer in the precision it
//! was asked for? The expected precisions come from a plan file, precision options, or the
//! model's own types; the comparison is `engine::verify` (docs/verify-engine.md).

use super::options::PrecisionOptions;
use crate::engine::{
    expected_from_model, expected_from_plan, read_layer_info, verify, EngineReport, Verdict,
};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::load_model;
use crate::precision::plan::PrecisionPlan;
use std::path::PathBuf;

/// What to verify.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// The ONNX model the engine was built from.
    pub model: PathBuf,
    /// `trtexec --exportLayerInfo` JSON or `polygraphy inspect model --show layers` text.
    pub layer_info: PathBuf,
    /// The expected precisions as a plan JSON file.
    pub plan: Option<PathBuf>,
    /// The expected precisions as `run`/`convert` take them (used when `plan` is None).
    pub precision: PrecisionOptions,
}

/// The verdict of the whole engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Every compared node runs in its expected precision.
    Obeyed,
    /// A node runs in another precision.
    Disobeyed,
    /// The layer information has names only, no types.
    NoDetail,
    /// No engine layer maps to a node of the model with type information.
    NothingCompared,
}

/// The report and where its expectations came from.
pub struct Outcome {
    pub report: EngineReport,
    /// Where the expected precisions came from, for the log.
    pub source: String,
}

impl Outcome {
    pub fn status(&self) -> Status {
        let r = &self.report;
        if !r.detailed {
            Status::NoDetail
        } else if r.disobeying().next().is_some() {
            Status::Disobeyed
        } else if r.count(Verdict::Obeys) == 0 {
            Status::NothingCompared
        } else {
            Status::Obeyed
        }
    }
}

/// Reads the model and the layer information and compares them; the reader's caveats go to
/// `events`, prefixed with the layer-info file.
pub fn run(config: &Config, events: &mut dyn FnMut(Event)) -> Result<Outcome> {
    let model = load_model(&config.model)?;
    let graph = &model.graph;
    let (expected, source) = if let Some(p) = &config.plan {
        let text = std::fs::read_to_string(p)
            .map_err(|e| Error::Invalid(format!("{}: cannot read the plan: {e}", p.display())))?;
        let plan = PrecisionPlan::from_json(&text, graph)
            .map_err(|e| Error::Invalid(format!("{}: {e}", p.display())))?;
        (
            expected_from_plan(graph, &plan),
            format!("the plan {}", p.display()),
        )
    } else if config.precision.any() {
        let plan = config.precision.plan(graph, events)?;
        (
            expected_from_plan(graph, &plan),
            "the precision options".to_string(),
        )
    } else {
        (
            expected_from_model(graph)?,
            "the model's own types (strongly typed)".to_string(),
        )
    };
    let info = read_layer_info(&config.layer_info)?;
    let report = verify(graph, &expected, &info);
    let file = config.layer_info.display();
    for w in &report.warnings {
        events(Event::Warning(format!("{file}: {w}")));
    }
    Ok(Outcome { report, source })
}
