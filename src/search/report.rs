//! What a search reports: its counters ([`SearchStats`]) and the `--save-result` JSON
//! ([`ResultFile`]), assembled from the search's outcome. The CLI prints and writes them.

use super::{Direction, Mode, Objective, Outcome, SearchResult, SearchSpace, Trial};
use crate::graph::Graph;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use serde::Serialize;

/// Counters of one search, for the report, the JSON result and the benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct SearchStats {
    pub evaluations: usize,
    /// Layers executed, with the incremental cache.
    pub layer_executions: u64,
    /// Layers the same runs execute without it.
    pub layer_executions_without_cache: u64,
    pub cache_peak_bytes: usize,
    pub cache_evictions: u64,
    pub wall_seconds: f64,
    pub fp32_inference_seconds: f64,
}

/// A layer of the answer, by index and name.
#[derive(Clone, Debug, Serialize)]
pub struct LayerRef {
    pub index: usize,
    pub name: String,
    pub op: String,
    pub flops: u64,
}

/// The `--save-result` file (JSON).
#[derive(Serialize)]
pub struct ResultFile<'a> {
    pub model: String,
    pub mode: &'static str,
    pub direction: Direction,
    pub objective: Objective,
    pub higher_precision: &'static str,
    pub low_precisions: Vec<String>,
    pub candidates: usize,
    pub candidate_flops: u64,
    pub outcome: &'a Outcome,
    pub layers: Vec<LayerRef>,
    pub stats: &'a SearchStats,
    pub trials: &'a [Trial],
}

/// How the search was set up, as the result file records it.
pub struct SearchSetup<'a> {
    pub model: &'a str,
    pub mode: Mode,
    pub direction: Direction,
    pub objective: Objective,
    pub high: Precision,
    /// The plan every candidate starts from (all layers in their low precision).
    pub low: &'a PrecisionPlan,
}

impl<'a> ResultFile<'a> {
    pub fn new(
        setup: &SearchSetup<'_>,
        graph: &Graph,
        space: &SearchSpace,
        result: &'a SearchResult,
        stats: &'a SearchStats,
    ) -> ResultFile<'a> {
        ResultFile {
            model: setup.model.to_string(),
            mode: setup.mode.name(),
            direction: setup.direction,
            objective: setup.objective,
            higher_precision: setup.high.name(),
            low_precisions: setup
                .low
                .counts(graph)
                .iter()
                .map(|(p, n)| format!("{n} {}", p.name()))
                .collect(),
            candidates: space.candidates.len(),
            candidate_flops: space.total_flops(),
            outcome: &result.outcome,
            layers: match &result.outcome {
                Outcome::Found(m) | Outcome::Interrupted(Some(m)) => m
                    .iter()
                    .map(|&i| LayerRef {
                        index: i,
                        name: graph.nodes[i].name.clone(),
                        op: graph.nodes[i].op_type.clone(),
                        flops: space.flops[i],
                    })
                    .collect(),
                _ => Vec::new(),
            },
            stats,
            trials: &result.trials,
        }
    }
}
