//! One worker of a search whose candidates are judged elsewhere (the Python API's
//! `executor=`; docs/scale-out.md). A worker is built from the same [`Config`] as the search:
//! it loads the model (memory-mapped), its inputs and golden outputs, the low plan and its
//! calibrated ranges, runs the reference, and then judges marked sets as the search's own
//! oracle would — the emulation under the criterion (or the user's criterion) through its own
//! incremental value cache, or the check (a `--check` command or the caller's function) on
//! the candidate's model — so a candidate travels as its marked node indices, never as a
//! model. The search's
//! [`crate::search::remote::RemoteOracle`] gathers the verdicts.
//!
//! The prepared state borrows the model, so it lives on a thread of its own
//! ([`super::worker_thread`]).

use super::check::{check_oracle, TempDir};
use super::debug_precision::{load, Config, Hooks, Loaded, Validated};
use super::ranges::ranges_for_plan;
use super::worker_thread::{Server, WorkerThread};
use crate::error::Result;
use crate::event::{Event, NoProgress};
use crate::search::driver::SearchHooks;
use crate::search::plans::{plan_candidates, plan_decided, PlanSpace, PlanSpaceConfig};
use crate::search::qdq::{qdq_candidates, qdq_decided, QdqSpace, QdqSpaceConfig};
use crate::search::remote::MarkedSet;
use crate::search::space::CandidateSpace;
use crate::search::{Evaluation, Oracle};
use crate::Interpreter;
use std::sync::atomic::AtomicBool;

/// A prepared search's oracle, answering marked sets.
pub struct Worker(WorkerThread<MarkedSet>);

impl Worker {
    /// Loads and prepares everything `v` describes (its replay and progress options are the
    /// driver's and ignored here); returns once the worker can judge, or the error that
    /// stopped it.
    pub fn start(v: Validated) -> Result<Worker> {
        WorkerThread::start("mixprec-search-worker", move |server| serve(v, server)).map(Worker)
    }

    /// Judges `sets` (marked node indices); one result per set, in order.
    pub fn evaluate_batch(&self, sets: Vec<MarkedSet>) -> Vec<Result<Evaluation>> {
        self.0.evaluate_batch(sets)
    }
}

/// A worker reports nothing: the driver reported the same load and warnings.
struct Quiet;

impl SearchHooks for Quiet {
    fn event(&mut self, _e: Event) {}
    fn log(&mut self, _line: String) {}
}

impl Hooks for Quiet {}

fn serve(v: Validated, server: &Server<MarkedSet>) -> Result<()> {
    let Validated {
        config,
        criterion,
        high,
        cache_budget,
        check_limits,
    } = v;
    let mut quiet = Quiet;
    let Loaded {
        model,
        golden,
        feeds,
        decoder,
        qdq,
    } = load(&config, high, &mut quiet)?;
    let graph = &model.graph;
    let stop = AtomicBool::new(false);
    let workdir = match config.check {
        Some(_) => Some(TempDir::new()?),
        None => None,
    };
    let check = |candidate, decided| {
        let (c, dir) = (config.check.as_ref()?, workdir.as_ref()?);
        Some(check_oracle(
            c,
            &check_limits,
            graph,
            high,
            candidate,
            decided,
            dir.0.clone(),
            1,
            false,
            Box::new(|_| {}),
        ))
    };
    if qdq {
        let mut space = QdqSpace::new(QdqSpaceConfig {
            model: &model,
            feeds: &feeds,
            criterion,
            user: config.user_criterion.clone(),
            high,
            fusion: config.precision.fusion_model()?,
        })?;
        space.prepare(None, golden.as_ref(), &mut quiet)?;
        let decided = match workdir {
            Some(_) => qdq_decided(&model)?,
            None => Vec::new(),
        };
        let mut check = check(qdq_candidates(&model, high), decided);
        let oracle: &mut dyn Oracle = match check.as_mut() {
            Some(c) => c,
            None => space.oracle(),
        };
        return server.serve(&mut |sets| oracle.evaluate_batch(&sets));
    }
    let interp = Interpreter::new(graph)?;
    // The plan of the search the workers judge: with a fusion model, the last one (the job's
    // first search, without fusion, runs on the driver).
    let low = config.precision.plan(graph, &mut |_| {})?;
    let amax = ranges_for_plan(
        &interp,
        &low,
        &config.precision,
        &feeds,
        &mut |_| {},
        &NoProgress,
    )?;
    let mut space = PlanSpace::new(PlanSpaceConfig {
        interp: &interp,
        feeds: &feeds,
        criterion,
        user: config.user_criterion.clone(),
        low: low.clone(),
        high,
        accumulate: config.precision.accumulator()?,
        amax: amax.as_ref(),
        cache_budget,
        jobs: 1,
        stop: &stop,
        decode: decoder.as_ref(),
    })?;
    space.prepare(None, golden.as_ref(), &mut quiet)?;
    let decided = plan_decided(graph, &low, high);
    let mut check = check(plan_candidates(&model, low, high, amax.as_ref()), decided);
    let oracle: &mut dyn Oracle = match check.as_mut() {
        Some(c) => c,
        None => space.oracle(),
    };
    server.serve(&mut |sets| oracle.evaluate_batch(&sets))
}

/// What a worker needs from a [`Config`]: everything but the driver's own options.
pub fn worker_config(mut config: Config) -> Config {
    config.load_debug_replay = None;
    config.save_debug_replay = None;
    config.remote = None;
    config.layer_errors = false;
    config.jobs = 1;
    config
}
