//! The descent: from the cheapest point that passed, which groups can take a cheaper format
//! together. That is a marked-set question — which groups must *keep* their format for the
//! point to pass — so it is a candidate space of the search driver
//! ([`crate::search::driver::run_search`]), beside a float model's precision plans and a Q/DQ
//! model's quantized layers: a candidate is a group that passed alone in a cheaper format,
//! marked means it keeps the base point's format, unmarked means it takes the cheaper one.
//! The driver's `minimal` strategy searches it (AIMET AMP's bisection over cumulative flips,
//! then pruning): its ranking is the groups' error alone in the cheaper format, so galloping
//! and bisection over the ranking find how many of the most sensitive must keep their format,
//! and pruning then lowers every one of those that need not, down to a set where lowering any
//! one more fails. With `--jobs` the driver evaluates the next probes ahead (speculation); the
//! front gets the strategy's trials only, so it is the same for any `--jobs` or workers.

use super::{alone, predicts_pass, FormatSpace, Front, FrontPoint, PlanJudge, Step};
use crate::compare::fmt_g;
use crate::error::Result;
use crate::event::Event;
use crate::golden::GoldenFile;
use crate::precision::Precision;
use crate::search::driver::{run_search, SearchHooks, SearchJob};
use crate::search::groups::Grouping;
use crate::search::report::SearchStats;
use crate::search::space::{CandidateSpace, Found, Prepared};
use crate::search::{
    Direction, Evaluation, Mode, Objective, Oracle, Outcome, Ranking, Scores, SearchOptions,
    SearchResult, SearchSpace, Trial,
};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The descent from one passing point; its points go on the front.
pub(super) struct Descent<'s, 'g> {
    pub(super) front: Front<'s, 'g>,
    pub(super) log: &'s mut Vec<String>,
}

/// A group that can take a cheaper format at the base point.
#[derive(Clone, Copy, Debug)]
struct Move {
    group: usize,
    /// The format that passed alone and saves the most from the base point.
    to: Precision,
    /// Its error alone.
    error: f64,
}

/// The base point and its moves, by candidate: a candidate is its group's first layer (node
/// index), so the driver's trials name layers of the graph.
struct Moves {
    base: Vec<Precision>,
    moves: Vec<Move>,
    by_candidate: HashMap<usize, usize>,
}

impl Moves {
    /// The assignment with every move lowered but those of the `marked` candidates.
    fn formats(&self, marked: &[usize]) -> Vec<Precision> {
        let mut formats = self.base.clone();
        for m in &self.moves {
            formats[m.group] = m.to;
        }
        for c in marked {
            let m = &self.moves[self.by_candidate[c]];
            formats[m.group] = self.base[m.group];
        }
        formats
    }
}

impl Descent<'_, '_> {
    /// Descends from point `from`, `jobs` evaluations at a time; the strategy's points go on
    /// the front. Returns whether `stop` ended it.
    pub(super) fn run(
        &mut self,
        judge: &mut dyn PlanJudge,
        from: usize,
        jobs: usize,
        stop: &AtomicBool,
        progress: &mut dyn FnMut(&str),
    ) -> Result<bool> {
        let space = self.front.space;
        let objective = space.objective;
        let sensitivity = self.front.sensitivity;
        let base = self.front.points[from].formats.clone();
        let base_cost = self.front.points[from].cost.by(objective);
        // Per group, the format that passed alone and saves the most from this point (its
        // neighbours' formats decide the reformats, so the order by cost alone may not hold
        // here); ties keep the cheaper-alone format.
        let moves: Vec<Move> = (0..space.groups.len())
            .filter_map(|g| {
                let mut best: Option<(Precision, f64)> = None;
                for &f in &space.orders[g] {
                    if f == base[g] || !alone(space, sensitivity, g, f).1 {
                        continue;
                    }
                    let mut next = base.clone();
                    next[g] = f;
                    let saved = base_cost - space.cost(&next).by(objective);
                    if saved > 0.0 && best.is_none_or(|(_, b)| saved > b) {
                        best = Some((f, saved));
                    }
                }
                best.map(|(to, _)| Move {
                    group: g,
                    to,
                    error: alone(space, sensitivity, g, to).0,
                })
            })
            .collect();
        if moves.is_empty() {
            return Ok(false);
        }
        self.log.push(format!(
            "Descent from point {from}: {} group(s) can take a cheaper format that passed alone; searching which must keep their format (minimal, most sensitive first)",
            moves.len()
        ));
        let by_candidate = moves
            .iter()
            .enumerate()
            .map(|(k, m)| (space.groups[m.group].layers[0], k))
            .collect();
        let moves = Moves {
            base,
            moves,
            by_candidate,
        };
        // The points already on the front answer for themselves (the base point is the
        // driver's "every candidate marked" check).
        let known = self
            .front
            .points
            .iter()
            .map(|p| {
                (
                    p.formats.clone(),
                    Evaluation {
                        passed: p.passed,
                        error: p.error,
                        summary: p.summary.clone(),
                    },
                )
            })
            .collect();
        let mut lowering = Lowering {
            moves: &moves,
            space,
            judge,
            known,
            jobs,
        };
        let job = SearchJob {
            graph: space.graph,
            golden: None,
            options: SearchOptions {
                mode: Mode::Minimal,
                direction: Direction::Forward,
                objective: Objective::Layers,
                ranking: Ranking::Sensitivity,
                jobs,
                group: Grouping::None,
            },
            check: None,
            remote: None,
            replay: None,
            layer_errors: false,
            stop,
        };
        let mut trials = OnFront {
            front: &mut self.front,
            moves: &moves,
            from,
            progress,
        };
        let run = run_search(&mut lowering, job, &mut trials)?;
        let total = moves.moves.len();
        let group_name = |c: usize| {
            let m = &moves.moves[moves.by_candidate[&c]];
            format!(
                "'{}' ({})",
                space.groups[m.group].name(space.graph),
                moves.base[m.group].name()
            )
        };
        let (line, interrupted) = match &run.result.outcome {
            Outcome::NothingNeeded => (format!("Descent: all {total} group(s) lowered pass"), false),
            Outcome::Found(kept) => (
                format!(
                    "Descent: {} of {total} group(s) lowered pass; {} keep their format (lowering any one of them too fails): {}",
                    total - kept.len(),
                    kept.len(),
                    kept.iter()
                        .map(|&c| group_name(c))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                false,
            ),
            Outcome::Interrupted(_) => ("Descent: interrupted".to_string(), true),
            // Every candidate marked is the base point, which passed.
            Outcome::ReferenceFails | Outcome::NotFound => (
                format!("Descent: no lowering of point {from} passed"),
                false,
            ),
        };
        self.log.push(line);
        Ok(interrupted)
    }
}

/// The descent's candidate space and oracle: a marked set is the assignment with the other
/// moves lowered, judged by the plan's judge (evaluated once per assignment).
struct Lowering<'m, 'j> {
    moves: &'m Moves,
    space: &'m FormatSpace<'m>,
    judge: &'j mut dyn PlanJudge,
    /// Every assignment judged so far, and the front's points.
    known: HashMap<Vec<Precision>, Evaluation>,
    jobs: usize,
}

impl CandidateSpace for Lowering<'_, '_> {
    fn prepare(
        &mut self,
        _ranking: Option<Ranking>,
        _golden: Option<&GoldenFile>,
        _hooks: &mut dyn SearchHooks,
    ) -> Result<Prepared> {
        let mut candidates: Vec<usize> = self.moves.by_candidate.keys().copied().collect();
        candidates.sort_unstable();
        let nodes = candidates.last().map_or(0, |&c| c + 1);
        let by_layer = self
            .moves
            .by_candidate
            .iter()
            .map(|(&c, &k)| (c, self.moves.moves[k].error))
            .collect();
        Ok(Prepared {
            space: SearchSpace {
                candidates,
                flops: vec![0; nodes],
                // Each move passed alone: none is known to be needed.
                scores: Scores {
                    by_layer,
                    failing_alone: Vec::new(),
                },
                deferred: false,
            },
            fp32_inference: 0.0,
            timing: Duration::ZERO,
        })
    }

    fn oracle(&mut self) -> &mut dyn Oracle {
        self
    }

    fn stats(&self, result: &SearchResult, wall_seconds: f64, _fp32: f64) -> SearchStats {
        SearchStats {
            evaluations: result.trials.len(),
            speculative_evaluations: result.speculative,
            ranking_runs: 0,
            layer_executions: 0,
            layer_executions_without_cache: 0,
            cache_peak_bytes: 0,
            cache_evictions: 0,
            wall_seconds,
            fp32_inference_seconds: 0.0,
            contradictions: result.contradictions(),
        }
    }

    /// The answer is the trial the outcome names, on the front already.
    fn conclude(&mut self, _result: &SearchResult, _layer_errors: bool) -> Result<Found> {
        Ok(Found::Plans {
            answer: None,
            layer_errors: None,
            reasons: Vec::new(),
        })
    }
}

impl Oracle for Lowering<'_, '_> {
    fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
        self.evaluate_batch(&[marked.to_vec()])
            .pop()
            .expect("one verdict per set")
    }

    fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        let formats: Vec<Vec<Precision>> = sets.iter().map(|m| self.moves.formats(m)).collect();
        let mut new: Vec<&Vec<Precision>> = Vec::new();
        for f in &formats {
            if !self.known.contains_key(f) && !new.contains(&f) {
                new.push(f);
            }
        }
        let plans: Vec<_> = new.iter().map(|f| self.space.plan(f)).collect();
        let mut failed: HashMap<Vec<Precision>, crate::error::Error> = HashMap::new();
        for (f, e) in new.iter().zip(self.judge.judge(&plans)) {
            match e {
                Ok(e) => {
                    self.known.insert((*f).clone(), e);
                }
                Err(e) => {
                    failed.insert((*f).clone(), e);
                }
            }
        }
        formats
            .iter()
            .map(|f| match self.known.get(f) {
                Some(e) => Ok(e.clone()),
                None => Err(failed.remove(f).unwrap_or_else(|| {
                    crate::error::Error::Invalid(
                        "the plan's judge gave no verdict for a descent point".into(),
                    )
                })),
            })
            .collect()
    }

    fn parallel(&self) -> bool {
        self.jobs > 1
    }
}

/// Puts each trial the strategy takes on the front, in its order (not the evaluations made
/// ahead of need), and reports it.
struct OnFront<'f, 's, 'g, 'm, 'p> {
    front: &'f mut Front<'s, 'g>,
    moves: &'m Moves,
    from: usize,
    progress: &'p mut dyn FnMut(&str),
}

impl SearchHooks for OnFront<'_, '_, '_, '_, '_> {
    fn event(&mut self, event: Event) {
        match event {
            Event::Warning(s) | Event::Info(s) | Event::Verbose(s) | Event::Output(s) => {
                (self.progress)(&s)
            }
        }
    }

    fn trial(&mut self, _space: &SearchSpace, trial: &Trial) {
        let formats = self.moves.formats(&trial.marked);
        if self.front.points.iter().any(|p| p.formats == formats) {
            return;
        }
        let space = self.front.space;
        let lowered = self.moves.moves.len() - trial.marked.len();
        let cost = space.cost(&formats);
        (self.progress)(&format!(
            "Front point {} (descent {}, {lowered} lowered): cost {} {} | {} | {}",
            self.front.points.len(),
            trial.phase,
            fmt_g(cost.by(space.objective), 4),
            space.objective.unit(),
            if trial.passed { "passed" } else { "failed" },
            trial.summary
        ));
        *self.front.evaluations += 1;
        self.front.points.push(FrontPoint {
            predicted_pass: predicts_pass(space, self.front.sensitivity, &formats),
            formats,
            cost,
            passed: trial.passed,
            error: trial.error,
            summary: trial.summary.clone(),
            step: Step::Lower {
                from: self.from,
                lowered,
                phase: trial.phase,
            },
            check: None,
        });
    }

    fn log(&mut self, line: String) {
        (self.progress)(&line);
    }
}
