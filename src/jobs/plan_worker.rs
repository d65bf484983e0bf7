//! One worker of a `plan` whose points are judged elsewhere (the Python API's `executor=`;
//! docs/scale-out.md). A worker is built from the same [`Config`] as the driver's plan and
//! the driver's calibrated ranges: it loads the model (memory-mapped), its input sets and
//! golden outputs, runs the reference, and judges points exactly as the driver would
//! ([`super::plan::emulation_judge`]: the emulation under the criterion, or the user's
//! criterion, through its own incremental value cache). A point travels as its layers'
//! precisions ([`PlanPoint`]), never as a model; the driver's
//! [`crate::search::remote::RemotePlanJudge`] gathers the verdicts.
//!
//! The ranges come from the driver so that no worker calibrates: every worker judges with
//! the very scales the driver exports.

use super::debug_precision::GoldenSource;
use super::plan::{emulation_judge, Config, Judging, Validated};
use super::worker_thread::{Server, WorkerThread};
use crate::decode::Decoder;
use crate::error::Result;
use crate::search::remote::PlanPoint;
use crate::search::Evaluation;
use crate::{load_model, Interpreter};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

/// A prepared plan's judge, answering points.
pub struct PlanWorker(WorkerThread<PlanPoint>);

impl PlanWorker {
    /// Loads and prepares what `v` describes, judging with the driver's ranges `amax`;
    /// returns once the worker can judge, or the error that stopped it.
    pub fn start(v: Validated, amax: Option<BTreeMap<String, f32>>) -> Result<PlanWorker> {
        WorkerThread::start("mixprec-plan-worker", move |server| serve(v, amax, server))
            .map(PlanWorker)
    }

    /// Judges `points`; one result per point, in order.
    pub fn evaluate_batch(&self, points: Vec<PlanPoint>) -> Vec<Result<Evaluation>> {
        self.0.evaluate_batch(points)
    }
}

fn serve(
    v: Validated,
    amax: Option<BTreeMap<String, f32>>,
    server: &Server<PlanPoint>,
) -> Result<()> {
    let Validated {
        config,
        high,
        criterion,
        cache_budget,
        fusion,
        ..
    } = v;
    let golden = config.golden.as_ref().map(GoldenSource::load).transpose()?;
    let model = load_model(&config.model)?;
    let graph = &model.graph;
    let interp = Interpreter::new(graph)?;
    let decoder = config.decode.map(|n| Decoder::new(graph, n)).transpose()?;
    // The driver reported the inputs' warnings already.
    let feeds = config
        .inputs
        .first_runs(graph, decoder.as_ref(), &mut |_| {})?;
    let stop = AtomicBool::new(false);
    let mut oracle = emulation_judge(
        &interp,
        &feeds,
        Judging {
            criterion,
            high,
            amax: amax.as_ref(),
            cache_budget,
            jobs: 1,
            stop: &stop,
            user: config.user_criterion.clone(),
            decoder: decoder.as_ref(),
            golden: golden.as_ref(),
            fusion,
        },
        &mut |_| {},
    )?;
    let nodes = graph.nodes.len();
    server.serve(&mut |points| {
        points
            .iter()
            .map(|p| {
                // The fusion model is the run's: the worker has it from the settings.
                let mut plan = p.plan(nodes, high)?;
                plan.fusion = fusion;
                if p.uncached {
                    oracle.evaluate_plan_uncached(&plan)
                } else {
                    oracle
                        .evaluate_plans(std::slice::from_ref(&plan))
                        .pop()
                        .unwrap_or_else(|| {
                            Err(crate::error::Error::Invalid(
                                "the emulation answered no verdict".into(),
                            ))
                        })
                }
            })
            .collect()
    })
}

/// What a worker needs from a [`Config`]: everything but the driver's own options (its
/// workers, its `--check` command, which runs on the driver, and `--jobs`).
pub fn worker_config(mut config: Config) -> Config {
    config.remote = None;
    config.check = None;
    config.verbose = false;
    config.jobs = 1;
    config
}

#[cfg(test)]
mod tests;
