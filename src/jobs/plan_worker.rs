//! One worker of a `plan` whose points are judged elsewhere (the Python API's `executor=`;
//! docs/scale-out.md). A worker is built from the same [`Config`] as the driver's plan and
//! the driver's calibrated ranges: it loads the model (memory-mapped), its input sets and
//! golden outputs, runs the reference, and judges points exactly as the driver would
//! ([`super::plan::emulation_judge`]: the emulation under the criterion, or the user's
//! criterion, through its own incremental value cache). A point the check judges (`--check`
//! or the caller's function, [`PlanPoint::check`]) is exported here with the driver's ranges,
//! as the driver would, and judged by the check on this machine. A point travels as its
//! layers' precisions ([`PlanPoint`]), never as a model; the driver's
//! [`crate::search::remote::RemotePlanJudge`] gathers the verdicts.
//!
//! The ranges come from the driver so that no worker calibrates: every worker judges with
//! the very scales the driver exports.

use super::check::{check_oracle, TempDir};
use super::debug_precision::GoldenSource;
use super::plan::{decided_layers, emulation_judge, point_candidate, Config, Judging, Validated};
use super::worker_thread::{Server, WorkerThread};
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::precision::plan::PrecisionPlan;
use crate::search::formats::decision_groups;
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
        check_limits,
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
    // The check's points are exported here; its candidate models live in `workdir`.
    let workdir = config.check.as_ref().map(|_| TempDir::new()).transpose()?;
    let decided = match &config.check {
        Some(_) => decided_layers(&decision_groups(graph, &PrecisionPlan::candidates(graph))),
        None => Vec::new(),
    };
    let mut check = match (&config.check, &workdir) {
        (Some(c), Some(dir)) => Some(check_oracle(
            c,
            &check_limits,
            graph,
            high,
            Box::new(|_| {
                Err(Error::Invalid(
                    "plan's check judges front points, not marked sets".into(),
                ))
            }),
            Vec::new(),
            dir.0.clone(),
            1,
            false,
            Box::new(|_| {}),
        )),
        _ => None,
    };
    let nodes = graph.nodes.len();
    server.serve(&mut |points| {
        points
            .iter()
            .map(|p| {
                // The fusion model is the run's: the worker has it from the settings.
                let mut plan = p.plan(nodes, high)?;
                plan.fusion = fusion;
                if p.check {
                    let check = check.as_mut().ok_or_else(|| {
                        Error::Invalid(
                            "a plan point to check, but this worker was given no check".into(),
                        )
                    })?;
                    let candidate = point_candidate(&model, &decided, &plan, amax.as_ref(), high)?;
                    return check
                        .evaluate_models(&[candidate])
                        .pop()
                        .unwrap_or_else(|| {
                            Err(Error::Invalid("the check answered no verdict".into()))
                        });
                }
                if p.uncached {
                    oracle.evaluate_plan_uncached(&plan)
                } else {
                    oracle
                        .evaluate_plans(std::slice::from_ref(&plan))
                        .pop()
                        .unwrap_or_else(|| {
                            Err(Error::Invalid("the emulation answered no verdict".into()))
                        })
                }
            })
            .collect()
    })
}

/// What a worker needs from a [`Config`]: everything but the driver's own options (its
/// workers and `--jobs`).
pub fn worker_config(mut config: Config) -> Config {
    config.remote = None;
    config.verbose = false;
    config.jobs = 1;
    config
}

#[cfg(test)]
mod tests;
