//! The search as one library call over any candidate space ([`CandidateSpace`]): the
//! reference run and the golden outputs (or a golden file), the space's candidates, the
//! `--check` and debug-replay oracles around its oracle, the search itself, its statistics and
//! its answer. `debug precision` (src/jobs/debug_precision.rs) only chooses the space (a float
//! model's precision plans or a Q/DQ model's quantized layers) and reports through
//! [`SearchHooks`].

use super::builtin::RankedBy;
use super::check::CheckOracle;
use super::groups::search_as_grouped;
use super::remote::RemoteOracle;
use super::replay::{DebugReplay, ReplayOracle};
use super::report::SearchStats;
use super::space::{CandidateSpace, Found, Prepared};
use super::{Oracle, SearchOptions, SearchResult, SearchSpace, Trial};
use crate::error::Result;
use crate::event::Event;
use crate::golden::GoldenFile;
use crate::graph::Graph;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Everything one search needs besides its space.
pub struct SearchJob<'a> {
    pub graph: &'a Graph,
    /// Reference outputs from a file instead of the space's reference run (`--golden`).
    pub golden: Option<&'a GoldenFile>,
    pub options: SearchOptions,
    /// Candidates judged by a user command (`--check`) instead of the space's oracle.
    pub check: Option<CheckOracle<'a>>,
    /// Candidates judged by workers elsewhere (the Python API's `executor=`) instead of the
    /// space's oracle or `check`, which the workers then run themselves; the space still
    /// prepares and ranks here.
    pub remote: Option<RemoteOracle<'a>>,
    /// Known evaluations (`--load-debug-replay`, or a new empty replay when one is to be
    /// saved) and where to save the replay (`--save-debug-replay`).
    pub replay: Option<(DebugReplay, Option<PathBuf>)>,
    /// Compute the layer-wise errors of the answer (for the HTML report).
    pub layer_errors: bool,
    /// Set (e.g. by Ctrl-C) to stop between evaluations and report the best plan so far.
    pub stop: &'a AtomicBool,
}

/// How a running search reports to its caller; the library prints nothing.
pub trait SearchHooks {
    /// Warnings and notes (a golden file's caveats, a ranking cut short by the cache budget,
    /// `--check`'s command output).
    fn event(&mut self, event: Event);
    /// The search space is known; the search starts.
    fn started(&mut self, _space: &SearchSpace) {}
    /// A candidate was evaluated.
    fn trial(&mut self, _space: &SearchSpace, _trial: &Trial) {}
    /// A line of the search's log (what was loaded or saved).
    fn log(&mut self, line: String);
}

/// What a finished search found.
pub struct SearchRun {
    pub space: SearchSpace,
    pub result: SearchResult,
    pub stats: SearchStats,
    /// The answer and why its layers are needed, as the space's kind has them.
    pub found: Found,
}

/// The largest automatic cache budget (and the budget the reference run is measured under).
pub const AUTO_BUDGET_MAX: usize = 2 << 30;
/// The smallest automatic cache budget. It was 32 MiB until 2026-11-27, which held every model
/// of the corpus but PP-OCRv4 rec above its own rule: the angle classifier's search took
/// 52 MB peak RSS and 0.12 s at 32 MiB, 30 MB and 0.08 s at the 3 MB its values call for
/// (the larger cache keeps values whose buffers fresh runs cannot reuse); YOLOv8n 103 -> 76 MB,
/// det 68 -> 54 MB, Magika 60 -> 48 MB at the same wall time and the same trials.
pub const AUTO_BUDGET_MIN: usize = 1 << 20;

/// The cache budget when `--cache-budget` is not given: 1.25 times the values of the FP32
/// reference run (every value of one run, times the input sets; measured by an uncached run
/// of the first set, `BuiltinOracle::value_bytes`) — enough to keep all of them —, but at
/// most three times the values a plain run holds at once (`peak_value_bytes`), so
/// a search's memory follows a plain run's (issue 10: peak RSS within four runs plus the
/// weights), within [1 MiB, 2 GiB]. The ranking compares in windows of the budget
/// (`BuiltinOracle::growth`), so the budget changes speed, never the answer. On PP-OCRv4 rec
/// (106 MB of values, about 11 MB at once) the cap gives ~34 MB: peak RSS 191 -> 117 MB, the
/// same answer and trials, the same wall time within noise (docs/search.md has the figures).
pub fn auto_cache_budget(reference_bytes: usize, peak_value_bytes: usize) -> usize {
    (reference_bytes.saturating_mul(5) / 4)
        .min(peak_value_bytes.saturating_mul(3))
        .clamp(AUTO_BUDGET_MIN, AUTO_BUDGET_MAX)
}

/// Runs the search `job` describes over `space`.
pub fn run_search(
    space: &mut dyn CandidateSpace,
    job: SearchJob<'_>,
    hooks: &mut dyn SearchHooks,
) -> Result<SearchRun> {
    let t0 = Instant::now();
    let ranking = job
        .options
        .mode
        .needs_ranking()
        .then_some(job.options.ranking);
    let Prepared {
        space: candidates,
        fp32_inference,
        timing,
    } = space.prepare(ranking, job.golden, hooks)?;
    hooks.started(&candidates);
    let mut check = job.check;
    let mut remote = job.remote;
    let result = {
        let mut ranked;
        let judge: Option<(&mut dyn Oracle, bool)> = match (remote.as_mut(), check.as_mut()) {
            (Some(r), _) => {
                let same = r.same_criterion;
                Some((r as &mut dyn Oracle, same))
            }
            (None, Some(c)) => Some((c as &mut dyn Oracle, false)),
            (None, None) => None,
        };
        let inner: &mut dyn Oracle = match judge {
            Some((judge, same_criterion)) => {
                ranked = RankedBy {
                    judge,
                    ranker: space.oracle(),
                    same_criterion,
                };
                &mut ranked
            }
            None => space.oracle(),
        };
        search_with_replay(
            &candidates,
            &job.options,
            inner,
            job.graph,
            job.replay,
            job.stop,
            hooks,
        )?
    };
    drop(check);
    drop(remote);
    // The search's own time: from the reference run on (not loading or calibrating), less
    // the runs that timed one FP32 inference.
    let wall = t0.elapsed().saturating_sub(timing).as_secs_f64();
    let stats = space.stats(&result, wall, fp32_inference);
    let found = space.conclude(&result, job.layer_errors)?;
    Ok(SearchRun {
        space: candidates,
        result,
        stats,
        found,
    })
}

/// Runs the search over `inner`, through the debug replay when there is one: known candidates
/// are answered from it, and it is saved (also when nothing new was evaluated).
fn search_with_replay(
    space: &SearchSpace,
    options: &SearchOptions,
    inner: &mut dyn Oracle,
    graph: &Graph,
    replay: Option<(DebugReplay, Option<PathBuf>)>,
    stop: &AtomicBool,
    hooks: &mut dyn SearchHooks,
) -> Result<SearchResult> {
    // Running `--check` groups end when `stop` is set, whoever sets it (the CLI's signal
    // handler, the Python binding's KeyboardInterrupt).
    crate::process::with_stop_flag(stop, || {
        search_with_replay_inner(space, options, inner, graph, replay, stop, hooks)
    })
}

fn search_with_replay_inner(
    space: &SearchSpace,
    options: &SearchOptions,
    inner: &mut dyn Oracle,
    graph: &Graph,
    replay: Option<(DebugReplay, Option<PathBuf>)>,
    stop: &AtomicBool,
    hooks: &mut dyn SearchHooks,
) -> Result<SearchResult> {
    let Some((replay, save_to)) = replay else {
        return search_as_grouped(
            space,
            options,
            graph,
            inner,
            &mut |t: &Trial| hooks.trial(space, t),
            stop,
        );
    };
    let mut replay_oracle =
        ReplayOracle::new(inner, graph, replay, save_to.clone())?.stopping_on(stop);
    let result = search_as_grouped(
        space,
        options,
        graph,
        &mut replay_oracle,
        &mut |t: &Trial| hooks.trial(space, t),
        stop,
    )?;
    if let Some(path) = &save_to {
        replay_oracle.replay().save(path)?;
        hooks.log(format!(
            "[I] Saved debug replay ({} evaluation(s)) to {}",
            replay_oracle.replay().evaluations.len(),
            path.display()
        ));
    }
    if replay_oracle.replayed > 0 {
        hooks.log(format!(
            "[I] {} candidate(s) answered from the debug replay without evaluating them",
            replay_oracle.replayed
        ));
    }
    Ok(result)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_automatic_cache_budget_follows_the_reference_run() {
        assert_eq!(auto_cache_budget(100 << 20, 50 << 20), 125 << 20);
        assert_eq!(auto_cache_budget(100 << 20, 20 << 20), 60 << 20);
        assert_eq!(auto_cache_budget(4 << 20, 1 << 20), 3 << 20);
        assert_eq!(auto_cache_budget(1 << 10, 1 << 10), AUTO_BUDGET_MIN);
        assert_eq!(auto_cache_budget(usize::MAX, usize::MAX), AUTO_BUDGET_MAX);
    }

    use super::*;
    use crate::compare::Criterion;
    use crate::error::Error;
    use crate::exec::Interpreter;
    use crate::graph::testing::{graph, node, vi};
    use crate::numeric::Accumulator;
    use crate::precision::plan::PrecisionPlan;
    use crate::precision::Precision;
    use crate::search::builtin::{Golden, UserCriterion};
    use crate::search::plans::{PlanSpace, PlanSpaceConfig};
    use crate::search::Outcome;
    use crate::search::{Direction, Mode, Objective};
    use crate::tensor::Feeds;
    use crate::tensor::Tensor;

    #[derive(Default)]
    struct Recorder {
        started: Vec<usize>,
        trials: usize,
        events: Vec<String>,
        log: Vec<String>,
    }

    impl SearchHooks for Recorder {
        fn event(&mut self, e: Event) {
            self.events.push(format!("{e:?}"));
        }
        fn started(&mut self, space: &SearchSpace) {
            self.started.push(space.candidates.len());
        }
        fn trial(&mut self, _space: &SearchSpace, _t: &Trial) {
            self.trials += 1;
        }
        fn log(&mut self, line: String) {
            self.log.push(line);
        }
    }

    /// x → Relu → ×1000 → ×0.001 → y with x ≈ 70: the product overflows float16 (65504), so
    /// both multiplications must stay in float32 and the Relu need not. The search runs under
    /// `user` when given (the tolerances still measure the error).
    fn overflow_search(user: Option<UserCriterion>) -> (Result<SearchRun>, Recorder) {
        let g = graph(
            vec![
                node("relu", "Relu", &["x"], &["r"]),
                node("mul_big", "Mul", &["r", "big"], &["m"]),
                node("mul_small", "Mul", &["m", "small"], &["y"]),
            ],
            vec![vi("x", &[4])],
            vec![vi("y", &[4])],
            vec![
                ("big", Tensor::from_f32(vec![1], vec![1000.0])),
                ("small", Tensor::from_f32(vec![1], vec![0.001])),
            ],
        );
        let interp = Interpreter::new(&g).unwrap();
        let mut feeds = Feeds::new();
        feeds.insert(
            "x".into(),
            Tensor::from_f32(vec![4], vec![70.0, 70.5, 71.0, 72.0]),
        );
        let feeds = vec![feeds.clone(), feeds];
        let criterion = Criterion {
            atol: crate::compare::PerOutput::new(0.1),
            rtol: crate::compare::PerOutput::new(0.01),
            ..Default::default()
        };
        let stop = AtomicBool::new(false);
        let mut hooks = Recorder::default();
        let mut space = PlanSpace::new(PlanSpaceConfig {
            interp: &interp,
            feeds: &feeds,
            criterion,
            user,
            low: PrecisionPlan::uniform(&g, Precision::Float16),
            high: Precision::Float32,
            accumulate: Accumulator::F32,
            amax: None,
            cache_budget: Some(1 << 20),
            jobs: 1,
            stop: &stop,
            decode: None,
        })
        .unwrap();
        let job = SearchJob {
            graph: &g,
            golden: None,
            options: SearchOptions {
                mode: Mode::Minimal,
                direction: Direction::Forward,
                objective: Objective::Layers,
                ranking: crate::search::Ranking::Sensitivity,
                jobs: 1,
                group: crate::search::Grouping::None,
            },
            check: None,
            remote: None,
            replay: None,
            layer_errors: true,
            stop: &stop,
        };
        (run_search(&mut space, job, &mut hooks), hooks)
    }

    #[test]
    fn the_driver_finds_the_layers_an_overflow_needs_and_reports_through_hooks() {
        let (run, hooks) = overflow_search(None);
        let run = run.unwrap();
        assert_eq!(run.result.outcome, Outcome::Found(vec![1, 2]));
        assert_eq!(hooks.started, vec![3]);
        assert_eq!(hooks.trials, run.result.trials.len());
        assert_eq!(run.stats.evaluations, run.result.trials.len());
        let Found::Plans {
            answer,
            layer_errors,
            reasons,
        } = run.found
        else {
            panic!("a float model's search answers plans")
        };
        let answer = answer.unwrap();
        assert_eq!(
            answer.layers,
            vec![Precision::Float16, Precision::Float32, Precision::Float32]
        );
        assert_eq!(layer_errors.map(|e| e.len()), Some(3));
        // Why: each of the two alone in float16 overflows (the product is beyond 65504; the
        // second reads it and rounds it to inf on entry).
        let why: Vec<(usize, crate::compare::cause::Cause)> =
            reasons.iter().map(|r| (r.index, r.cause)).collect();
        use crate::compare::cause::Cause::Overflow;
        assert_eq!(why, vec![(1, Overflow), (2, Overflow)], "{reasons:?}");
        assert_eq!(reasons[1].facts.as_ref().unwrap().overflowing_inputs, 4);
        assert!(hooks.events.is_empty() && hooks.log.is_empty());
    }

    #[test]
    fn a_user_criterion_decides_every_verdict_and_sees_every_input_set() {
        use std::sync::{Arc, Mutex};
        // Passes when every output value is finite: the overflow makes them inf, so both
        // multiplications are needed, as under the tolerances.
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = calls.clone();
        let finite = UserCriterion(Arc::new(move |outputs: Vec<Golden>, golden: &[&Golden]| {
            seen.lock().unwrap().push((outputs.len(), golden.len()));
            Ok(outputs
                .iter()
                .flatten()
                .all(|(_, t)| t.as_f32().unwrap().iter().all(|v| v.is_finite())))
        }));
        let (run, _) = overflow_search(Some(finite));
        let run = run.unwrap();
        assert_eq!(run.result.outcome, Outcome::Found(vec![1, 2]));
        let calls = calls.lock().unwrap();
        // Every evaluation and every ranking run called it once, with both input sets.
        assert_eq!(
            calls.len(),
            run.result.trials.len() + run.stats.ranking_runs,
            "{:?}",
            run.stats
        );
        assert!(calls.iter().all(|&c| c == (2, 2)));
        assert!(run.result.trials[0].summary.starts_with("criterion "));

        // A criterion that accepts everything: no layer is needed.
        let (run, _) = overflow_search(Some(UserCriterion(Arc::new(|_, _| Ok(true)))));
        assert_eq!(run.unwrap().result.outcome, Outcome::NothingNeeded);

        // An error in the criterion ends the search with that error.
        let (run, _) = overflow_search(Some(UserCriterion(Arc::new(|_, _| {
            Err(Error::Invalid("the criterion broke".into()))
        }))));
        let e = run.err().expect("the criterion's error").to_string();
        assert!(e.contains("the criterion broke"), "{e}");
    }
}
