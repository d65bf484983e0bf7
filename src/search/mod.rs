//! The precision search (`debug precision`): which layers must stay in higher precision.
//!
//! A search proposes sets of *marked* layers (run in the higher precision; the rest stay in the
//! low precision) and asks an [`Oracle`] whether each passes: the built-in one
//! ([`builtin::BuiltinOracle`]) runs the emulated model and compares it with the golden outputs,
//! the external one ([`check::CheckOracle`]) runs a user command. The strategies:
//!
//! - `bisect` (Polygraphy's): binary search over N, marking the first N candidate layers
//!   (`forward`) or the last N (`reverse`);
//! - `linear` (Polygraphy's): mark 1, 2, 3… layers from the chosen end until one passes;
//! - `worst-first`: rank layers by the error they add over their inputs' error (the growth of
//!   the layer-wise comparison), then bisect over N marking the N worst;
//! - `minimal`: non-contiguous. Rank as worst-first (by growth per FLOP with
//!   `--objective flops`), bisect to the shortest passing prefix of the ranking, then try to
//!   drop every marked layer again (the most expensive first with `--objective flops`): the
//!   result passes and dropping any single layer of it fails.
//!
//! Every strategy first checks the two ends: all candidates marked must pass (else the golden
//! data or the tolerance is wrong) and none marked must fail (else nothing needs marking).

pub mod builtin;
pub mod check;
pub mod driver;
pub mod qdq;
pub mod replay;
pub mod report;

use crate::error::{Error, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// How candidate sets are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Bisect,
    Linear,
    WorstFirst,
    Minimal,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Bisect => "bisect",
            Mode::Linear => "linear",
            Mode::WorstFirst => "worst-first",
            Mode::Minimal => "minimal",
        }
    }

    /// Modes that mark a contiguous run of layers from one end.
    pub fn is_contiguous(self) -> bool {
        matches!(self, Mode::Bisect | Mode::Linear)
    }

    /// Modes that need the layer-wise growth ranking.
    pub fn needs_ranking(self) -> bool {
        matches!(self, Mode::WorstFirst | Mode::Minimal)
    }
}

/// Which end contiguous modes mark from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Forward,
    Reverse,
}

/// What a smaller answer means for `minimal` (and what every mode reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// Fewest layers in high precision.
    Layers,
    /// Fewest FLOPs in high precision.
    Flops,
}

/// The verdict on one candidate set.
#[derive(Clone, Debug, Serialize)]
pub struct Evaluation {
    pub passed: bool,
    /// The achieved error (the largest required absolute tolerance over outputs and input
    /// sets; NaN when unknown, e.g. for an external check).
    pub error: f64,
    /// One line saying what was measured.
    pub summary: String,
}

/// Judges candidate sets of marked layers (node indices, ascending).
pub trait Oracle {
    fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation>;
}

/// One evaluated candidate.
#[derive(Clone, Debug, Serialize)]
pub struct Trial {
    /// 1-based, in evaluation order.
    pub iteration: usize,
    /// What the strategy was doing: "check-all", "check-none", "bisect", "linear", "prune"…
    pub phase: &'static str,
    /// Marked layers (node indices, ascending).
    pub marked: Vec<usize>,
    pub marked_flops: u64,
    pub passed: bool,
    pub error: f64,
    pub summary: String,
}

/// How a search ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", content = "layers", rename_all = "kebab-case")]
pub enum Outcome {
    /// These layers (node indices) in high precision pass.
    Found(Vec<usize>),
    /// The low-precision plan already passes.
    NothingNeeded,
    /// Even with every candidate in high precision the criterion fails.
    ReferenceFails,
    /// No candidate set the strategy tried passed.
    NotFound,
    /// Stopped by the user; the best passing set so far, if any.
    Interrupted(Option<Vec<usize>>),
}

/// What the strategy searches over.
#[derive(Clone, Debug)]
pub struct SearchSpace {
    /// Candidate layers (node indices) in topological order.
    pub candidates: Vec<usize>,
    /// FLOPs by node index (0 where unknown).
    pub flops: Vec<u64>,
    /// Growth per candidate (node index → error growth), for worst-first and minimal.
    pub growth: HashMap<usize, f64>,
}

impl SearchSpace {
    pub fn flops_of(&self, marked: &[usize]) -> u64 {
        marked
            .iter()
            .map(|&i| self.flops.get(i).copied().unwrap_or(0))
            .sum()
    }

    pub fn total_flops(&self) -> u64 {
        self.flops_of(&self.candidates)
    }

    /// Candidates by decreasing growth (per FLOP with the flops objective); ties and layers
    /// without a growth figure keep topological order, the latter last.
    pub fn ranking(&self, objective: Objective) -> Vec<usize> {
        let key = |i: usize| -> f64 {
            let g = match self.growth.get(&i) {
                Some(g) if !g.is_nan() => *g,
                _ => return f64::NEG_INFINITY,
            };
            match objective {
                Objective::Layers => g,
                Objective::Flops => {
                    let f = self.flops.get(i).copied().unwrap_or(0).max(1) as f64;
                    if g.is_infinite() {
                        g
                    } else {
                        g / f
                    }
                }
            }
        };
        let mut order: Vec<(usize, usize)> = self.candidates.iter().copied().enumerate().collect();
        order.sort_by(|(pa, a), (pb, b)| key(*b).total_cmp(&key(*a)).then(pa.cmp(pb)));
        if objective == Objective::Flops {
            // Among equally sensitive layers (e.g. several overflowing ones), cheap ones first.
            order.sort_by(|(pa, a), (pb, b)| {
                key(*b).total_cmp(&key(*a)).then_with(|| {
                    let fa = self.flops.get(*a).copied().unwrap_or(0);
                    let fb = self.flops.get(*b).copied().unwrap_or(0);
                    fa.cmp(&fb).then(pa.cmp(pb))
                })
            });
        }
        order.into_iter().map(|(_, i)| i).collect()
    }
}

/// Options of one search.
#[derive(Clone, Copy, Debug)]
pub struct SearchOptions {
    pub mode: Mode,
    pub direction: Direction,
    pub objective: Objective,
}

/// A finished search: the outcome and every evaluation made.
#[derive(Clone, Debug, Serialize)]
pub struct SearchResult {
    pub outcome: Outcome,
    pub trials: Vec<Trial>,
    /// For bisect/linear: the number of layers marked from the chosen end.
    pub contiguous_count: Option<usize>,
}

impl SearchResult {
    /// The trial that evaluated exactly `marked`.
    pub fn trial_of(&self, marked: &[usize]) -> Option<&Trial> {
        self.trials.iter().rev().find(|t| t.marked == marked)
    }
}

/// Runs the search. `on_trial` sees every evaluation as it completes (progress display);
/// `stop` interrupts between evaluations (Ctrl-C), returning the best passing set so far.
pub fn search(
    space: &SearchSpace,
    opts: &SearchOptions,
    oracle: &mut dyn Oracle,
    on_trial: &mut dyn FnMut(&Trial),
    stop: &AtomicBool,
) -> Result<SearchResult> {
    let mut s = Searcher {
        space,
        oracle,
        on_trial,
        stop,
        trials: Vec::new(),
        memo: HashMap::new(),
    };
    let (outcome, contiguous_count) = match s.run(opts) {
        Ok(r) => r,
        Err(Stop::Interrupted) => (Outcome::Interrupted(s.best()), None),
        Err(Stop::Failed(e)) => return Err(e),
    };
    Ok(SearchResult {
        outcome,
        trials: s.trials,
        contiguous_count,
    })
}

enum Stop {
    Interrupted,
    Failed(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Failed(e)
    }
}

struct Searcher<'a> {
    space: &'a SearchSpace,
    oracle: &'a mut dyn Oracle,
    on_trial: &'a mut dyn FnMut(&Trial),
    stop: &'a AtomicBool,
    trials: Vec<Trial>,
    /// Verdicts by marked set: a set is never evaluated twice.
    memo: HashMap<Vec<usize>, bool>,
}

impl Searcher<'_> {
    fn eval(&mut self, phase: &'static str, marked: &[usize]) -> std::result::Result<bool, Stop> {
        let mut key = marked.to_vec();
        key.sort_unstable();
        if let Some(&p) = self.memo.get(&key) {
            return Ok(p);
        }
        if self.stop.load(Ordering::SeqCst) {
            return Err(Stop::Interrupted);
        }
        let e = self.oracle.evaluate(&key)?;
        let trial = Trial {
            iteration: self.trials.len() + 1,
            phase,
            marked_flops: self.space.flops_of(&key),
            marked: key.clone(),
            passed: e.passed,
            error: e.error,
            summary: e.summary,
        };
        (self.on_trial)(&trial);
        self.trials.push(trial);
        self.memo.insert(key, e.passed);
        Ok(e.passed)
    }

    /// The passing trial with the fewest marked layers (then FLOPs).
    fn best(&self) -> Option<Vec<usize>> {
        self.trials
            .iter()
            .filter(|t| t.passed)
            .min_by_key(|t| (t.marked.len(), t.marked_flops, t.iteration))
            .map(|t| t.marked.clone())
    }

    fn run(&mut self, opts: &SearchOptions) -> std::result::Result<(Outcome, Option<usize>), Stop> {
        let all = self.space.candidates.clone();
        if !self.eval("check-all", &all)? {
            return Ok((Outcome::ReferenceFails, None));
        }
        if all.is_empty() || self.eval("check-none", &[])? {
            return Ok((Outcome::NothingNeeded, None));
        }
        let order = match opts.mode {
            Mode::Bisect | Mode::Linear => match opts.direction {
                Direction::Forward => all.clone(),
                Direction::Reverse => all.iter().rev().copied().collect(),
            },
            Mode::WorstFirst => self.space.ranking(Objective::Layers),
            Mode::Minimal => self.space.ranking(opts.objective),
        };
        let n = match opts.mode {
            Mode::Linear => self.linear(&order)?,
            Mode::Bisect => self.bisect(&order, "bisect")?,
            Mode::WorstFirst | Mode::Minimal => self.gallop(&order)?,
        };
        let Some(n) = n else {
            return Ok((Outcome::NotFound, None));
        };
        let mut marked: Vec<usize> = order[..n].to_vec();
        if opts.mode == Mode::Minimal {
            marked = self.prune(marked, opts.objective)?;
        }
        marked.sort_unstable();
        let count = opts.mode.is_contiguous().then_some(n);
        Ok((Outcome::Found(marked), count))
    }

    /// Polygraphy's BisectMarker: `good` starts past the end (as if marking everything
    /// passed), `bad` at 0; each step halves the interval, rounding towards `bad` after a
    /// pass and towards `good` after a failure. Returns the smallest passing N found.
    fn bisect(
        &mut self,
        order: &[usize],
        phase: &'static str,
    ) -> std::result::Result<Option<usize>, Stop> {
        let max = order.len();
        let (mut good, mut bad) = (max + 1, 0usize);
        let mut n = max;
        loop {
            let ok = self.eval(phase, &order[..n])?;
            let next = if ok {
                good = n;
                (good + bad) / 2
            } else {
                bad = n;
                (good + bad).div_ceil(2)
            };
            if next == n || good - bad <= 1 || next > max {
                break;
            }
            n = next;
        }
        Ok((good <= max).then_some(good))
    }

    /// For rankings, where the answer is usually a few layers: N = 1, 2, 4, 8… until a pass,
    /// then binary search between the last failure and that pass.
    fn gallop(&mut self, order: &[usize]) -> std::result::Result<Option<usize>, Stop> {
        let max = order.len();
        let (mut bad, mut good) = (0usize, None);
        let mut n = 1usize;
        while n < max {
            if self.eval("rank-gallop", &order[..n])? {
                good = Some(n);
                break;
            }
            bad = n;
            n *= 2;
        }
        // Marking every candidate passed (checked first).
        let mut good = good.unwrap_or(max);
        while good - bad > 1 {
            let mid = (good + bad) / 2;
            if self.eval("rank-bisect", &order[..mid])? {
                good = mid;
            } else {
                bad = mid;
            }
        }
        Ok(Some(good))
    }

    /// Polygraphy's LinearMarker: 1, 2, 3… layers until one passes.
    fn linear(&mut self, order: &[usize]) -> std::result::Result<Option<usize>, Stop> {
        for n in 1..=order.len() {
            if self.eval("linear", &order[..n])? {
                return Ok(Some(n));
            }
        }
        Ok(None)
    }

    /// Drops marked layers that are not needed, trying groups first (delta-debugging style):
    /// a group whose removal still passes goes at once; a group that cannot go is split in
    /// halves, down to single layers. Groups follow the least sensitive first (layers
    /// objective) or the most expensive first (flops objective). Under a monotone criterion the
    /// result is 1-minimal: dropping any one of its layers fails.
    fn prune(
        &mut self,
        marked: Vec<usize>,
        objective: Objective,
    ) -> std::result::Result<Vec<usize>, Stop> {
        let mut order: Vec<usize> = marked.iter().rev().copied().collect();
        if objective == Objective::Flops {
            order
                .sort_by_key(|&i| std::cmp::Reverse(self.space.flops.get(i).copied().unwrap_or(0)));
        }
        let mut keep = marked;
        let mut groups: std::collections::VecDeque<Vec<usize>> = std::collections::VecDeque::new();
        // The whole set is known to be needed as a group (nothing marked fails): start halved.
        let (a, b) = order.split_at(order.len() / 2);
        groups.push_back(a.to_vec());
        groups.push_back(b.to_vec());
        while let Some(group) = groups.pop_front() {
            let group: Vec<usize> = group.into_iter().filter(|g| keep.contains(g)).collect();
            if group.is_empty() || group.len() == keep.len() {
                if group.len() > 1 {
                    let (a, b) = group.split_at(group.len() / 2);
                    groups.push_front(b.to_vec());
                    groups.push_front(a.to_vec());
                }
                continue;
            }
            let without: Vec<usize> = keep
                .iter()
                .copied()
                .filter(|k| !group.contains(k))
                .collect();
            if self.eval("prune", &without)? {
                keep = without;
            } else if group.len() > 1 {
                let (a, b) = group.split_at(group.len() / 2);
                groups.push_front(b.to_vec());
                groups.push_front(a.to_vec());
            }
        }
        Ok(keep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes when every layer of `needed` is marked; error = number of needed layers missing.
    struct Planted {
        needed: Vec<usize>,
        calls: usize,
        stop_after: Option<(usize, &'static AtomicBool)>,
    }

    impl Oracle for Planted {
        fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
            self.calls += 1;
            if let Some((n, flag)) = self.stop_after {
                if self.calls >= n {
                    flag.store(true, Ordering::SeqCst);
                }
            }
            let missing = self.needed.iter().filter(|n| !marked.contains(n)).count();
            Ok(Evaluation {
                passed: missing == 0,
                error: missing as f64,
                summary: format!("{missing} missing"),
            })
        }
    }

    fn space(n: usize, growth: &[(usize, f64)]) -> SearchSpace {
        SearchSpace {
            candidates: (0..n).collect(),
            flops: (0..n).map(|i| 100 + i as u64).collect(),
            growth: growth.iter().copied().collect(),
        }
    }

    fn run(
        space: &SearchSpace,
        mode: Mode,
        dir: Direction,
        needed: &[usize],
    ) -> (SearchResult, usize) {
        let mut o = Planted {
            needed: needed.to_vec(),
            calls: 0,
            stop_after: None,
        };
        let stop = AtomicBool::new(false);
        let r = search(
            space,
            &SearchOptions {
                mode,
                direction: dir,
                objective: Objective::Layers,
            },
            &mut o,
            &mut |_| {},
            &stop,
        )
        .unwrap();
        (r, o.calls)
    }

    #[test]
    fn bisect_forward_marks_everything_up_to_the_planted_layer() {
        let sp = space(40, &[]);
        let (r, calls) = run(&sp, Mode::Bisect, Direction::Forward, &[23]);
        assert_eq!(r.outcome, Outcome::Found((0..24).collect()));
        assert_eq!(r.contiguous_count, Some(24));
        assert!(calls <= 2 + 7, "{calls} evaluations");
    }

    #[test]
    fn bisect_reverse_marks_from_the_end() {
        let sp = space(40, &[]);
        let (r, _) = run(&sp, Mode::Bisect, Direction::Reverse, &[23]);
        assert_eq!(r.outcome, Outcome::Found((23..40).collect()));
        assert_eq!(r.contiguous_count, Some(17));
    }

    #[test]
    fn bisect_matches_polygraphy_on_every_position() {
        // Polygraphy's marker finds the exact boundary for any monotone criterion.
        for n in [1usize, 2, 3, 7, 16, 33] {
            let sp = space(n, &[]);
            for planted in 0..n {
                let (r, _) = run(&sp, Mode::Bisect, Direction::Forward, &[planted]);
                assert_eq!(
                    r.contiguous_count,
                    Some(planted + 1),
                    "n={n} planted={planted}"
                );
            }
        }
    }

    #[test]
    fn linear_stops_at_the_first_pass() {
        let sp = space(10, &[]);
        let (r, calls) = run(&sp, Mode::Linear, Direction::Forward, &[3]);
        assert_eq!(r.outcome, Outcome::Found(vec![0, 1, 2, 3]));
        assert_eq!(calls, 2 + 4);
    }

    #[test]
    fn minimal_finds_exactly_the_planted_layers() {
        // Growth points at 30 and 12 (and some noise elsewhere).
        let sp = space(40, &[(30, f64::INFINITY), (12, 5.0), (3, 0.5), (31, 0.0)]);
        let (r, _) = run(&sp, Mode::Minimal, Direction::Forward, &[12, 30]);
        assert_eq!(r.outcome, Outcome::Found(vec![12, 30]));
        // Even when the ranking is misleading, pruning leaves only what is needed.
        let sp = space(20, &[(5, 9.0), (6, 8.0), (7, 7.0)]);
        let (r, _) = run(&sp, Mode::Minimal, Direction::Forward, &[15]);
        assert_eq!(r.outcome, Outcome::Found(vec![15]));
    }

    #[test]
    fn worst_first_marks_the_worst_layers() {
        let sp = space(40, &[(30, f64::INFINITY), (12, 5.0)]);
        let (r, _) = run(&sp, Mode::WorstFirst, Direction::Forward, &[30]);
        assert_eq!(r.outcome, Outcome::Found(vec![30]));
    }

    #[test]
    fn ends_are_checked_first() {
        let sp = space(5, &[]);
        let (r, calls) = run(&sp, Mode::Bisect, Direction::Forward, &[]);
        assert_eq!(r.outcome, Outcome::NothingNeeded);
        assert_eq!(calls, 2);
        let (r, calls) = run(&sp, Mode::Bisect, Direction::Forward, &[9]);
        assert_eq!(r.outcome, Outcome::ReferenceFails);
        assert_eq!(calls, 1);
    }

    #[test]
    fn interruption_returns_the_best_so_far() {
        static STOP: AtomicBool = AtomicBool::new(false);
        let sp = space(40, &[]);
        let mut o = Planted {
            needed: vec![10],
            calls: 0,
            stop_after: Some((4, &STOP)),
        };
        let r = search(
            &sp,
            &SearchOptions {
                mode: Mode::Bisect,
                direction: Direction::Forward,
                objective: Objective::Layers,
            },
            &mut o,
            &mut |_| {},
            &STOP,
        )
        .unwrap();
        assert_eq!(o.calls, 4);
        // check-all (40) passed, none failed, first 20 passed, first 10 failed; then stopped.
        assert_eq!(r.outcome, Outcome::Interrupted(Some((0..20).collect())));
    }

    #[test]
    fn flops_objective_prefers_cheap_layers() {
        // Two interchangeable fixes: either 2 or 7 must be marked. FLOPs: 7 is dearer.
        struct Either;
        impl Oracle for Either {
            fn evaluate(&mut self, m: &[usize]) -> Result<Evaluation> {
                let ok = m.contains(&2) || m.contains(&7);
                Ok(Evaluation {
                    passed: ok,
                    error: 0.0,
                    summary: String::new(),
                })
            }
        }
        let mut sp = space(10, &[(2, 1.0), (7, 1.0)]);
        sp.flops[2] = 1000;
        sp.flops[7] = 10;
        let stop = AtomicBool::new(false);
        let r = search(
            &sp,
            &SearchOptions {
                mode: Mode::Minimal,
                direction: Direction::Forward,
                objective: Objective::Flops,
            },
            &mut Either,
            &mut |_| {},
            &stop,
        )
        .unwrap();
        assert_eq!(r.outcome, Outcome::Found(vec![7]));
    }
}
