//! What a search marks and how its candidates are judged, as one interface that the driver
//! ([`super::driver::run_search`]) runs over whatever the candidates are: a float model's
//! precision plans ([`super::plans::PlanSpace`]: a marked layer leaves its low precision) and
//! a Q/DQ model's quantized layers ([`super::qdq::QdqSpace`]: a marked layer loses its input
//! Q/DQ pairs). The strategies, `--check`, the debug replay, the statistics and every report
//! above the driver are the same for both; a space only says what a candidate is.

use super::driver::SearchHooks;
use super::report::{QdqReason, SearchStats};
use super::{Oracle, Ranking, SearchResult, SearchSpace};
use crate::compare::layerwise::LayerError;
use crate::error::Result;
use crate::export::qdq::{QdqLayer, Stripped};
use crate::golden::GoldenFile;
use crate::onnx::proto::ModelProto;
use crate::precision::plan::PrecisionPlan;
use std::sync::Arc;
use std::time::Duration;

/// The candidates of one search and how they are judged.
pub trait CandidateSpace {
    /// Runs the reference (FP32, or the model without its Q/DQ pairs), sets the golden outputs
    /// the candidates are judged against (`golden`'s when given, else the reference's) and
    /// returns the candidates with their FLOPs and, under `ranking`, their scores (now, or
    /// deferred to [`Oracle::rank`]).
    fn prepare(
        &mut self,
        ranking: Option<Ranking>,
        golden: Option<&GoldenFile>,
        hooks: &mut dyn SearchHooks,
    ) -> Result<Prepared>;

    /// The built-in oracle: the emulation under the criterion (it also ranks a deferred space,
    /// for a `--check` search too).
    fn oracle(&mut self) -> &mut dyn Oracle;

    /// The statistics of a finished search.
    fn stats(&self, result: &SearchResult, wall_seconds: f64, fp32_inference: f64) -> SearchStats;

    /// The answer of a finished search and why each of its layers is needed;
    /// `layer_errors`: also the answer's layer-wise errors (for the HTML report).
    fn conclude(&mut self, result: &SearchResult, layer_errors: bool) -> Result<Found>;
}

/// What [`CandidateSpace::prepare`] found.
pub struct Prepared {
    pub space: SearchSpace,
    /// One warm FP32 inference of the first input set, in seconds.
    pub fp32_inference: f64,
    /// The time spent measuring it (left out of the search's time).
    pub timing: Duration,
}

/// The candidate a marked set stands for, as a model (what `--check` runs as `{model}`).
pub type CandidateModel<'a> = Box<dyn Fn(&[usize]) -> Result<Arc<ModelProto>> + 'a>;

/// What a finished search answers, by the kind of its space.
pub enum Found {
    /// A float model's precision plans.
    Plans {
        /// The answer's plan (`Outcome::Found`; the all-low plan for `Outcome::NothingNeeded`).
        answer: Option<PrecisionPlan>,
        /// The layer-wise errors of the answer, or of an interrupted search's best plan, when
        /// asked for.
        layer_errors: Option<Vec<LayerError>>,
        /// Why each layer of the answer (or of an interrupted search's best plan) must run in
        /// high precision: its row with that layer alone back in low precision; empty without
        /// an answer.
        reasons: Vec<LayerError>,
    },
    /// A Q/DQ model's quantized layers.
    Qdq {
        /// Every quantized layer (the candidates, with how each input is quantized).
        layers: Vec<QdqLayer>,
        /// The model of the answer (or of an interrupted search's best set): the Q/DQ model
        /// with the answer's pairs removed, exactly as it was evaluated.
        answer: Option<Box<Stripped>>,
        /// Why each layer of a found answer must leave quantization (empty otherwise).
        reasons: Vec<QdqReason>,
    },
}

impl Found {
    /// Whether the candidates were a Q/DQ model's quantized layers.
    pub fn is_qdq(&self) -> bool {
        matches!(self, Found::Qdq { .. })
    }

    /// The reasons of a float search's answer (empty for a Q/DQ search: its reasons are
    /// [`QdqReason`]s).
    pub fn layer_reasons(&self) -> &[LayerError] {
        match self {
            Found::Plans { reasons, .. } => reasons,
            Found::Qdq { .. } => &[],
        }
    }
}
