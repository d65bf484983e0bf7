//! A float model's search space: precision plans. Every candidate layer starts in its low
//! precision (the plan `--fp16`/`--int8`/... and `--layer-precisions` give); a marked layer
//! runs in the high precision. Candidates run in the emulator, incrementally through the
//! built-in oracle's value cache.

use super::builtin::{BuiltinOracle, UserCriterion};
use super::driver::{auto_cache_budget, SearchHooks, AUTO_BUDGET_MAX};
use super::report::SearchStats;
use super::space::{CandidateModel, CandidateSpace, Found, Prepared};
use super::{Oracle, Outcome, Ranking, SearchResult};
use crate::compare::Criterion;
use crate::error::Result;
use crate::exec::{Interpreter, ValueCache};
use crate::export::{export, ExportOptions};
use crate::golden::GoldenFile;
use crate::numeric::Accumulator;
use crate::onnx::Model;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use crate::tensor::Feeds;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Everything a float model's search space needs.
pub struct PlanSpaceConfig<'a> {
    pub interp: &'a Interpreter<'a>,
    pub feeds: &'a [Feeds],
    pub criterion: Criterion,
    /// A user criterion that decides the verdicts instead of `criterion`.
    pub user: Option<UserCriterion>,
    /// The plan with every layer in its low precision.
    pub low: PrecisionPlan,
    /// The precision marked layers run in.
    pub high: Precision,
    pub accumulate: Accumulator,
    pub amax: Option<&'a BTreeMap<String, f32>>,
    /// The re-execution cache's budget in bytes; None: adapted to the model
    /// ([`auto_cache_budget`]).
    pub cache_budget: Option<usize>,
    /// Sensitivity ranking runs made at the same time (`--jobs`).
    pub jobs: usize,
    /// Set (Ctrl-C) to cut a sensitivity ranking short.
    pub stop: &'a AtomicBool,
    /// Every evaluation a generation (`--decode`); `feeds` are then each input set's first
    /// step ([`crate::decode::Decoder::first_feeds`]).
    pub decode: Option<&'a crate::decode::Decoder>,
}

/// Precision plans judged by emulation.
pub struct PlanSpace<'a> {
    oracle: BuiltinOracle<'a>,
    feeds: usize,
    auto_budget: bool,
}

impl<'a> PlanSpace<'a> {
    pub fn new(c: PlanSpaceConfig<'a>) -> Result<PlanSpace<'a>> {
        let mut oracle = BuiltinOracle::new(
            c.interp,
            c.feeds,
            c.criterion,
            c.low,
            c.high,
            c.accumulate,
            c.amax,
            ValueCache::new(c.cache_budget.unwrap_or(AUTO_BUDGET_MAX)),
        )?;
        oracle.judging_by(c.user);
        oracle.stopping_on(c.stop);
        oracle.ranking_in_jobs(c.jobs);
        oracle.generating(c.decode);
        Ok(PlanSpace {
            oracle,
            feeds: c.feeds.len(),
            auto_budget: c.cache_budget.is_none(),
        })
    }
}

impl CandidateSpace for PlanSpace<'_> {
    fn prepare(
        &mut self,
        ranking: Option<Ranking>,
        golden: Option<&GoldenFile>,
        hooks: &mut dyn SearchHooks,
    ) -> Result<Prepared> {
        let oracle = &mut self.oracle;
        if self.auto_budget {
            let (values, peak) = oracle.value_bytes()?;
            let budget = auto_cache_budget(values.saturating_mul(self.feeds), peak);
            oracle.cache.set_budget(budget);
        }
        let reference = oracle.reference_outputs()?;
        let (fp32_inference, timing) = oracle.time_fp32_inference()?;
        let golden = match golden {
            Some(g) => g.reference_for(&reference[0], &mut |e| hooks.event(e))?,
            None => reference,
        };
        oracle.set_golden(golden)?;
        Ok(Prepared {
            space: oracle.deferred_search_space(ranking)?,
            fp32_inference,
            timing,
        })
    }

    fn oracle(&mut self) -> &mut dyn Oracle {
        &mut self.oracle
    }

    fn stats(&self, result: &SearchResult, wall_seconds: f64, fp32_inference: f64) -> SearchStats {
        SearchStats::new(result, &self.oracle, wall_seconds, fp32_inference)
    }

    fn conclude(&mut self, result: &SearchResult, layer_errors: bool) -> Result<Found> {
        let oracle = &mut self.oracle;
        let answer = match &result.outcome {
            Outcome::Found(marked) => Some(oracle.plan_for(marked)),
            // Every candidate in low precision already passes: that plan is the answer (`-o`
            // writes it).
            Outcome::NothingNeeded => Some(oracle.plan_for(&[])),
            _ => None,
        };
        let best = match &result.outcome {
            Outcome::Found(m) | Outcome::Interrupted(Some(m)) => Some(m),
            _ => None,
        };
        let layer_errors = match best {
            Some(m) if layer_errors => Some(oracle.layer_errors(m)?),
            _ => None,
        };
        let reasons = match best {
            Some(m) => oracle.answer_reasons(m)?,
            None => Vec::new(),
        };
        Ok(Found::Plans {
            answer,
            layer_errors,
            reasons,
        })
    }
}

/// Every layer a float search over `low` decides (its candidates: the layers `low` runs below
/// `high`), with its precision in `low`.
pub fn plan_decided(
    graph: &crate::graph::Graph,
    low: &PrecisionPlan,
    high: Precision,
) -> Vec<(usize, String)> {
    PrecisionPlan::candidates(graph)
        .into_iter()
        .filter(|&i| low.layers[i] != high)
        .map(|i| (i, low.layers[i].name().to_string()))
        .collect()
}

/// The candidate models of a float search: `low` with the marked layers in `high`, exported
/// as `mixprec convert` writes it (Casts, Q/DQ with the ranges `amax`).
pub fn plan_candidates<'a>(
    model: &'a Model,
    low: PrecisionPlan,
    high: Precision,
    amax: Option<&'a BTreeMap<String, f32>>,
) -> CandidateModel<'a> {
    Box::new(move |marked: &[usize]| {
        let plan = low.marking(marked, high);
        let exported = export(
            model,
            &plan,
            amax,
            &ExportOptions {
                fallback: true,
                ..Default::default()
            },
        )?;
        Ok(Arc::new(exported.model))
    })
}
