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
//!   `--objective flops`), bisect to the shortest passing prefix of the ranking, then drop
//!   marked layers again by adaptive group testing (the most expensive first with
//!   `--objective flops`; [`Searcher::prune`]) and try each remaining layer once more
//!   ([`Searcher::confirm`]): the result passes and dropping any single layer of it fails,
//!   whether or not the criterion is monotone.
//!
//! Every strategy first checks the two ends: all candidates marked must pass (else the golden
//! data or the tolerance is wrong) and none marked must fail (else nothing needs marking).

pub mod builtin;
pub mod check;
pub mod driver;
pub mod formats;
pub mod groups;
pub mod plans;
pub mod qdq;
pub mod remote;
pub mod replay;
pub mod report;
pub mod space;

use crate::error::{Error, Result};
pub use groups::Grouping;
use serde::Serialize;
use std::borrow::Cow;
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

    /// Modes that rank the candidates ([`Ranking`]).
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

/// What worst-first and minimal rank candidates by (`--ranking`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ranking {
    /// Each candidate alone in its low precision, every other candidate in the high one,
    /// judged under the criterion: the tolerance it needs at the outputs. One run per
    /// candidate, each re-running only what lies after that layer (the rest comes from the
    /// cached reference): about half an inference per candidate.
    Sensitivity,
    /// The error a layer adds to its inputs' in the all-low plan (relative error growth,
    /// [`builtin::relative_growth`]): one run for all candidates, blind to what happens to
    /// that error on its way to the outputs.
    Growth,
}

impl Ranking {
    pub fn name(self) -> &'static str {
        match self {
            Ranking::Sensitivity => "sensitivity",
            Ranking::Growth => "growth",
        }
    }
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

    /// Judges several independent sets (`--jobs`): the first is the one the search needs now,
    /// the others are speculative. One result per set, in order; an oracle that can work in
    /// parallel overrides this (the default evaluates them one after another).
    fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        sets.iter().map(|s| self.evaluate(s)).collect()
    }

    /// [`evaluate_batch`](Self::evaluate_batch), telling `done` of each set's result (its
    /// position, the result) as soon as it is known: the debug replay records and saves each
    /// verdict then. An oracle whose sets finish one by one (workers elsewhere) overrides it;
    /// by default `done` hears of them all after the batch, in order.
    fn evaluate_batch_each(
        &mut self,
        sets: &[Vec<usize>],
        done: &mut dyn FnMut(usize, &Result<Evaluation>),
    ) -> Vec<Result<Evaluation>> {
        let results = self.evaluate_batch(sets);
        for (k, r) in results.iter().enumerate() {
            done(k, r);
        }
        results
    }

    /// Whether [`evaluate_batch`](Self::evaluate_batch) evaluates its sets at the same time;
    /// the search speculates (`--jobs` > 1) only with such an oracle.
    fn parallel(&self) -> bool {
        false
    }

    /// The candidates' ranking scores, for a search space that defers them
    /// ([`SearchSpace::deferred`]): asked at most once, by worst-first or minimal once both
    /// reference checks left something to search (a search that needs no layer, or whose
    /// reference fails, ranks nothing).
    fn rank(&mut self) -> Result<Scores> {
        Err(Error::Invalid(
            "this oracle cannot rank the candidates of a deferred ranking".into(),
        ))
    }
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

/// What a ranking measured of the candidates.
#[derive(Clone, Debug, Default)]
pub struct Scores {
    /// Score per candidate (node index → how much keeping it in low precision costs the
    /// criterion: the tolerance it needs alone, or its error growth; see [`Ranking`]). Larger
    /// ranks first.
    pub by_layer: HashMap<usize, f64>,
    /// The candidates whose plan alone in low precision (every other candidate high) failed
    /// the search's own criterion: the sensitivity ranking's verdicts. Under a monotone
    /// criterion each is needed in every passing set, so galloping starts at their count
    /// ([`Searcher::gallop`]). Empty where the ranking judged nothing (growth) or judged
    /// under another criterion than the search's (a `--check` search ranks in the emulation).
    pub failing_alone: Vec<usize>,
}

impl From<HashMap<usize, f64>> for Scores {
    fn from(by_layer: HashMap<usize, f64>) -> Scores {
        Scores {
            by_layer,
            failing_alone: Vec::new(),
        }
    }
}

/// What the strategy searches over.
#[derive(Clone, Debug)]
pub struct SearchSpace {
    /// Candidate layers (node indices) in topological order.
    pub candidates: Vec<usize>,
    /// FLOPs by node index (0 where unknown).
    pub flops: Vec<u64>,
    /// What the ranking measured of each candidate, for worst-first and minimal.
    pub scores: Scores,
    /// The scores are not known yet: the search asks the oracle ([`Oracle::rank`]) when it
    /// needs them.
    pub deferred: bool,
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

    /// Candidates by decreasing score (per FLOP with the flops objective); ties and layers
    /// without a score keep topological order, the latter last.
    pub fn ranking(&self, objective: Objective) -> Vec<usize> {
        self.ranking_by(&self.scores.by_layer, objective)
    }

    /// The candidates that failed alone ([`Scores::failing_alone`]): the deferred ranking's,
    /// `scores`, once known, else the space's own.
    fn failing_alone<'s>(&'s self, scores: Option<&'s Scores>) -> &'s [usize] {
        &scores.unwrap_or(&self.scores).failing_alone
    }

    /// [`ranking`](Self::ranking) by `scores` instead of the space's own.
    pub fn ranking_by(&self, scores: &HashMap<usize, f64>, objective: Objective) -> Vec<usize> {
        let key = |i: usize| -> f64 {
            let g = match scores.get(&i) {
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
    /// What the ranking modes rank by; the search space carries the scores
    /// ([`SearchSpace::scores`]), this says which they are.
    pub ranking: Ranking,
    /// Candidate sets evaluated at the same time (`--jobs`): besides the set the strategy
    /// needs next, the sets it would need after each likely verdict. The strategy consumes
    /// verdicts in its own order, so answers and trials are the same for any value.
    pub jobs: usize,
    /// Whether the strategy moves layers or roles first (`--group`; [`groups::phased`]).
    pub group: Grouping,
}

/// A finished search: the outcome and every evaluation made.
#[derive(Clone, Debug, Serialize)]
pub struct SearchResult {
    pub outcome: Outcome,
    pub trials: Vec<Trial>,
    /// For bisect/linear: the number of layers marked from the chosen end.
    pub contiguous_count: Option<usize>,
    /// Sets evaluated ahead of need (`--jobs` > 1) that the strategy never asked for.
    pub speculative: usize,
    /// The ranking's candidates that failed alone under the search's criterion
    /// ([`Scores::failing_alone`]; empty without such verdicts).
    pub failing_alone: Vec<usize>,
}

impl SearchResult {
    /// The trial that evaluated exactly `marked`.
    pub fn trial_of(&self, marked: &[usize]) -> Option<&Trial> {
        self.trials.iter().rev().find(|t| t.marked == marked)
    }

    /// The evidence, among its trials and the ranking's verdicts, that the search's criterion
    /// is not monotone.
    pub fn contradictions(&self) -> Contradictions {
        contradictions(&self.trials, &self.failing_alone)
    }
}

/// Runs the search. `on_trial` sees every evaluation as the strategy takes it (progress
/// display); `stop` interrupts between evaluations (Ctrl-C), returning the best passing set so
/// far. With `opts.jobs` > 1 and a [`parallel`](Oracle::parallel) oracle, sets are evaluated
/// in batches (see [`SearchOptions::jobs`]).
pub fn search(
    space: &SearchSpace,
    opts: &SearchOptions,
    oracle: &mut dyn Oracle,
    on_trial: &mut dyn FnMut(&Trial),
    stop: &AtomicBool,
) -> Result<SearchResult> {
    if opts.jobs > 1 && oracle.parallel() {
        return search_in_batches(space, opts, oracle, on_trial, stop);
    }
    let mut s = Searcher {
        space,
        answers: Answers::Oracle(oracle),
        on_trial,
        stop,
        trials: Vec::new(),
        memo: HashMap::new(),
        scores: None,
    };
    let (outcome, contiguous_count) = match s.run(opts) {
        Ok(r) => r,
        Err(Stop::Interrupted) => (Outcome::Interrupted(s.best()), None),
        Err(Stop::Failed(e)) => return Err(e),
        Err(Stop::Need(..) | Stop::NeedRanking) => {
            unreachable!("an oracle answers every set and ranks")
        }
    };
    let failing_alone = s.failing_alone().to_vec();
    Ok(SearchResult {
        outcome,
        trials: s.trials,
        contiguous_count,
        speculative: 0,
        failing_alone,
    })
}

/// The strategy replayed over the verdicts known so far (and some assumed ones).
enum Replay {
    /// It finished: the outcome, the contiguous count and the trials it took.
    Done(Outcome, Option<usize>, Vec<Trial>),
    /// It needs this unknown set next (in this phase); the trials it took before.
    Need(Vec<usize>, &'static str, Vec<Trial>),
    /// It needs the deferred ranking next; the trials it took before.
    NeedRanking(Vec<Trial>),
}

/// Replays the strategy from the start: every set in `known` is answered with its verdict
/// (and becomes a trial), every set in `assumed` with the assumed verdict (no trial); the
/// first other set stops it. Strategies are deterministic functions of their verdicts, so
/// the replay with every needed verdict known is the search a single evaluator would make.
fn replay(
    space: &SearchSpace,
    opts: &SearchOptions,
    known: &HashMap<Vec<usize>, Evaluation>,
    assumed: &HashMap<Vec<usize>, bool>,
    scores: Option<&Scores>,
) -> Replay {
    let never = AtomicBool::new(false);
    let mut ignore = |_: &Trial| {};
    let mut s = Searcher {
        space,
        answers: Answers::Known { known, assumed },
        on_trial: &mut ignore,
        stop: &never,
        trials: Vec::new(),
        memo: HashMap::new(),
        scores: scores.map(Cow::Borrowed),
    };
    match s.run(opts) {
        Ok((outcome, count)) => Replay::Done(outcome, count, s.trials),
        Err(Stop::Need(set, phase)) => Replay::Need(set, phase, s.trials),
        Err(Stop::NeedRanking) => Replay::NeedRanking(s.trials),
        Err(Stop::Interrupted | Stop::Failed(_)) => {
            unreachable!("a replay neither evaluates nor watches the stop flag")
        }
    }
}

/// The search with `opts.jobs` evaluations at a time. Each round replays the strategy over
/// the verdicts known so far to find the set it needs next, then looks ahead: it assumes a
/// verdict for a needed set and replays again to find the set needed after it, most probable
/// branch first (each phase's verdicts so far give the odds of a pass), until the batch holds
/// `jobs` sets. The batch is evaluated at once; verdicts the strategy never asks for are
/// counted as speculative and otherwise ignored.
fn search_in_batches(
    space: &SearchSpace,
    opts: &SearchOptions,
    oracle: &mut dyn Oracle,
    on_trial: &mut dyn FnMut(&Trial),
    stop: &AtomicBool,
) -> Result<SearchResult> {
    let mut known: HashMap<Vec<usize>, Evaluation> = HashMap::new();
    let mut reported = 0usize;
    let no_assumptions = HashMap::new();
    // The deferred ranking, once asked for (the oracle ranks once; replays reuse it).
    let mut scores: Option<Scores> = None;
    loop {
        let (need, phase, trials) =
            match replay(space, opts, &known, &no_assumptions, scores.as_ref()) {
                Replay::Done(outcome, contiguous_count, trials) => {
                    trials[reported..].iter().for_each(&mut *on_trial);
                    let speculative = known.len() - trials.len();
                    return Ok(SearchResult {
                        outcome,
                        trials,
                        contiguous_count,
                        speculative,
                        failing_alone: space.failing_alone(scores.as_ref()).to_vec(),
                    });
                }
                Replay::Need(set, phase, trials) => (set, phase, trials),
                Replay::NeedRanking(trials) => {
                    trials[reported..].iter().for_each(&mut *on_trial);
                    reported = trials.len();
                    scores = Some(oracle.rank()?);
                    continue;
                }
            };
        trials[reported..].iter().for_each(&mut *on_trial);
        reported = trials.len();
        if stop.load(Ordering::SeqCst) {
            let best = best_of(&trials);
            let speculative = known.len() - trials.len();
            return Ok(SearchResult {
                outcome: Outcome::Interrupted(best),
                trials,
                contiguous_count: None,
                speculative,
                failing_alone: space.failing_alone(scores.as_ref()).to_vec(),
            });
        }
        let batch = look_ahead(
            space,
            opts,
            &known,
            scores.as_ref(),
            &trials,
            need,
            phase,
            opts.jobs,
        );
        let verdicts = oracle.evaluate_batch(&batch);
        if stop.load(Ordering::SeqCst) {
            // Interrupted during the batch: its verdicts may come from cut-short evaluations
            // and are not taken; the next round reports the best so far.
            continue;
        }
        for (k, (set, verdict)) in batch.into_iter().zip(verdicts).enumerate() {
            match verdict {
                Ok(e) => {
                    known.insert(set, e);
                }
                // The needed set's error ends the search as it would without --jobs; a
                // speculative set's is forgotten (should the strategy need that set, it is
                // evaluated again as the needed one).
                Err(e) if k == 0 => return Err(e),
                Err(_) => {}
            }
        }
    }
}

/// The sets to evaluate together: `need` first, then the sets needed after the most probable
/// assumed verdicts, up to `jobs` sets.
#[allow(clippy::too_many_arguments)]
fn look_ahead(
    space: &SearchSpace,
    opts: &SearchOptions,
    known: &HashMap<Vec<usize>, Evaluation>,
    scores: Option<&Scores>,
    trials: &[Trial],
    need: Vec<usize>,
    phase: &'static str,
    jobs: usize,
) -> Vec<Vec<usize>> {
    // The odds of a pass in a phase, from its trials so far (Laplace's rule: 1/2 at first).
    let pass_odds = |phase: &str| -> f64 {
        let (n, passed) = trials
            .iter()
            .filter(|t| t.phase == phase)
            .fold((0usize, 0usize), |(n, p), t| (n + 1, p + t.passed as usize));
        (passed as f64 + 1.0) / (n as f64 + 2.0)
    };
    // Open branches: (probability, assumed verdicts); the likeliest is explored first, ties
    // in the order they were opened.
    let mut open: Vec<(f64, HashMap<Vec<usize>, bool>)> = Vec::new();
    let branch = |open: &mut Vec<(f64, HashMap<Vec<usize>, bool>)>,
                  p: f64,
                  assumed: &HashMap<Vec<usize>, bool>,
                  set: &[usize],
                  phase: &str| {
        let odds = pass_odds(phase);
        for (verdict, q) in [(false, 1.0 - odds), (true, odds)] {
            let mut a = assumed.clone();
            a.insert(set.to_vec(), verdict);
            open.push((p * q, a));
        }
    };
    branch(&mut open, 1.0, &HashMap::new(), &need, phase);
    let mut batch = vec![need];
    // Each replay costs microseconds; the bound only guards against branches that all end.
    let mut replays = 0usize;
    while batch.len() < jobs && !open.is_empty() && replays < 16 * jobs {
        let best = (0..open.len())
            .max_by(|&a, &b| open[a].0.total_cmp(&open[b].0).then(b.cmp(&a)))
            .expect("not empty");
        let (p, assumed) = open.remove(best);
        replays += 1;
        // A branch that reaches the deferred ranking before it is known ends there.
        if let Replay::Need(set, phase, _) = replay(space, opts, known, &assumed, scores) {
            if !batch.contains(&set) {
                batch.push(set.clone());
            }
            branch(&mut open, p, &assumed, &set, phase);
        }
    }
    batch
}

/// Evidence that the criterion is not monotone: failing trials that marked every layer of a
/// passing trial, and more (keeping more layers in high precision made it fail).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Contradictions {
    /// Failing trials that are a strict superset of some passing trial.
    pub failing_supersets: usize,
    /// One such pair, (failing iteration, passing iteration): the failing trial that marks
    /// the most layers beyond the smallest passing set it contains.
    pub example: Option<(usize, usize)>,
    /// Layers whose sensitivity ranking run failed ([`Scores::failing_alone`]: the plan with
    /// every other candidate high, a superset of every plan that leaves the layer low) although
    /// a passing trial leaves them in low precision.
    pub failing_alone: usize,
    /// One such pair, (layer, passing iteration): the first such layer in topological order
    /// and the passing trial that marks the fewest layers without it.
    pub failing_alone_example: Option<(usize, usize)>,
}

impl Contradictions {
    /// Whether the search saw the criterion contradict itself.
    pub fn any(&self) -> bool {
        self.failing_supersets + self.failing_alone > 0
    }
}

/// The [`Contradictions`] among `trials` and the ranking's verdicts (`failing_alone`, judged
/// under the same criterion). Group testing and the 1-minimal confirmation assume nothing
/// about them (the confirmation is there because they happen), but a search with many takes
/// more evaluations and its answer depends on its path: the CLI says so.
pub fn contradictions(trials: &[Trial], failing_alone: &[usize]) -> Contradictions {
    let width = trials
        .iter()
        .flat_map(|t| t.marked.iter().copied())
        .max()
        .map_or(0, |m| m / 64 + 1);
    let bits = |t: &Trial| -> Vec<u64> {
        let mut b = vec![0u64; width];
        t.marked.iter().for_each(|&i| b[i / 64] |= 1 << (i % 64));
        b
    };
    let mut passing: Vec<(&Trial, Vec<u64>)> = trials
        .iter()
        .filter(|t| t.passed)
        .map(|t| (t, bits(t)))
        .collect();
    // Smallest first: the first contained passing set is the smallest.
    passing.sort_by_key(|(t, _)| (t.marked.len(), t.iteration));
    let mut found = Contradictions::default();
    let mut widest = 0usize;
    for f in trials.iter().filter(|t| !t.passed) {
        let fb = bits(f);
        let inside = passing.iter().find(|(p, pb)| {
            p.marked.len() < f.marked.len() && pb.iter().zip(&fb).all(|(a, b)| a & !b == 0)
        });
        if let Some((p, _)) = inside {
            found.failing_supersets += 1;
            let more = f.marked.len() - p.marked.len();
            if more > widest {
                widest = more;
                found.example = Some((f.iteration, p.iteration));
            }
        }
    }
    let mut alone = failing_alone.to_vec();
    alone.sort_unstable();
    for layer in alone {
        // Passing trials are sorted smallest first.
        if let Some((p, _)) = passing.iter().find(|(p, _)| !p.marked.contains(&layer)) {
            found.failing_alone += 1;
            found
                .failing_alone_example
                .get_or_insert((layer, p.iteration));
        }
    }
    found
}

/// The passing trial with the fewest marked layers (then FLOPs).
fn best_of(trials: &[Trial]) -> Option<Vec<usize>> {
    trials
        .iter()
        .filter(|t| t.passed)
        .min_by_key(|t| (t.marked.len(), t.marked_flops, t.iteration))
        .map(|t| t.marked.clone())
}

enum Stop {
    Interrupted,
    Failed(Error),
    /// A replay reached a set whose verdict is unknown (and which phase asked for it).
    Need(Vec<usize>, &'static str),
    /// A replay reached the deferred ranking before it was known.
    NeedRanking,
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Failed(e)
    }
}

/// Where a strategy's verdicts come from.
enum Answers<'a> {
    /// The oracle, one set at a time.
    Oracle(&'a mut dyn Oracle),
    /// Verdicts evaluated so far, and verdicts assumed while looking ahead.
    Known {
        known: &'a HashMap<Vec<usize>, Evaluation>,
        assumed: &'a HashMap<Vec<usize>, bool>,
    },
}

struct Searcher<'a> {
    space: &'a SearchSpace,
    answers: Answers<'a>,
    on_trial: &'a mut dyn FnMut(&Trial),
    stop: &'a AtomicBool,
    trials: Vec<Trial>,
    /// Verdicts by marked set: a set is never evaluated twice.
    memo: HashMap<Vec<usize>, bool>,
    /// The deferred ranking's scores, once known ([`SearchSpace::deferred`]): the oracle's,
    /// or a batched search's borrowed by its replays.
    scores: Option<Cow<'a, Scores>>,
}

impl Searcher<'_> {
    fn eval(&mut self, phase: &'static str, marked: &[usize]) -> std::result::Result<bool, Stop> {
        let mut key = marked.to_vec();
        key.sort_unstable();
        if let Some(&p) = self.memo.get(&key) {
            return Ok(p);
        }
        let e = match &mut self.answers {
            Answers::Oracle(oracle) => {
                if self.stop.load(Ordering::SeqCst) {
                    return Err(Stop::Interrupted);
                }
                let e = oracle.evaluate(&key)?;
                // Interrupted meanwhile: the evaluation may have been cut short (Ctrl-C reaches
                // a --check command too, which then fails), so its verdict is not taken.
                if self.stop.load(Ordering::SeqCst) {
                    return Err(Stop::Interrupted);
                }
                e
            }
            Answers::Known { known, assumed } => match (known.get(&key), assumed.get(&key)) {
                (Some(e), _) => e.clone(),
                (None, Some(&p)) => {
                    self.memo.insert(key, p);
                    return Ok(p);
                }
                (None, None) => return Err(Stop::Need(key, phase)),
            },
        };
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
        best_of(&self.trials)
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
            Mode::WorstFirst => self.ranking(Objective::Layers)?,
            Mode::Minimal => self.ranking(opts.objective)?,
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

    /// The candidates in ranking order: by the space's scores, or by the deferred ranking's,
    /// which the oracle computes now (after the reference checks, so a search that needs no
    /// layer ranks nothing).
    fn ranking(&mut self, objective: Objective) -> std::result::Result<Vec<usize>, Stop> {
        if !self.space.deferred {
            return Ok(self.space.ranking(objective));
        }
        if self.scores.is_none() {
            match &mut self.answers {
                Answers::Oracle(oracle) => self.scores = Some(Cow::Owned(oracle.rank()?)),
                Answers::Known { .. } => return Err(Stop::NeedRanking),
            }
        }
        let scores = self.scores.as_ref().expect("ranked above");
        Ok(self.space.ranking_by(&scores.by_layer, objective))
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
    /// then binary search between the last failure and that pass. Where the ranking's own
    /// runs failed m candidates alone ([`Scores::failing_alone`]), N starts at m (doubling
    /// from there): under a monotone criterion every passing set holds all m, so a shorter
    /// prefix fails and is not tried. That is an assumption about where to look, never about
    /// the answer: [`Searcher::prune`] and [`Searcher::confirm`] still evaluate every drop.
    /// (Starting past the last of them in the ranking would assume more: on
    /// silero-16k-sequence, whose criterion is not monotone, a layer that passes alone ranks
    /// among them, and the answer grew from 6 layers to 8.)
    fn gallop(&mut self, order: &[usize]) -> std::result::Result<Option<usize>, Stop> {
        let max = order.len();
        let start = self.gallop_start(order);
        let (mut bad, mut good) = (start - 1, None);
        let mut n = start;
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

    /// Where [`gallop`](Self::gallop) starts: the number of candidates that failed alone, at
    /// least 1 and at most the whole ranking.
    fn gallop_start(&self, order: &[usize]) -> usize {
        self.failing_alone().len().clamp(1, order.len().max(1))
    }

    fn failing_alone(&self) -> &[usize] {
        self.space.failing_alone(self.scores.as_deref())
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

    /// Drops marked layers that are not needed: adaptive group testing (Hwang's generalized
    /// binary splitting). `marked` is the shortest passing prefix of the ranking, so its last
    /// layer is needed (the prefix without it fails). The others are tested in the order they
    /// may go — the least sensitive first (layers objective) or the most expensive first
    /// (flops objective) — in groups whose size follows the share of needed layers found so
    /// far: a group whose removal passes goes at once; one whose removal fails holds a needed
    /// layer, found by halving (a half that cannot go is searched further, the other half goes
    /// back to the untested layers, to be tested in a later group). [`Searcher::confirm`] then
    /// makes the result 1-minimal whatever the criterion: it passes, and dropping any one of
    /// its layers fails.
    fn prune(
        &mut self,
        marked: Vec<usize>,
        objective: Objective,
    ) -> std::result::Result<Vec<usize>, Stop> {
        let Some((&last, others)) = marked.split_last() else {
            return Ok(marked);
        };
        let mut untested: Vec<usize> = others.iter().rev().copied().collect();
        if objective == Objective::Flops {
            untested
                .sort_by_key(|&i| std::cmp::Reverse(self.space.flops.get(i).copied().unwrap_or(0)));
        }
        let position: HashMap<usize, usize> =
            untested.iter().enumerate().map(|(p, &l)| (l, p)).collect();
        let mut needed = vec![last];
        let (mut found, mut resolved) = (0usize, 0usize);
        // The marked set is always `needed` plus `untested`, and it passes.
        let with = |needed: &[usize], parts: &[&[usize]]| -> Vec<usize> {
            let mut v: Vec<usize> = needed.to_vec();
            parts.iter().for_each(|p| v.extend_from_slice(p));
            v.sort_unstable();
            v
        };
        while !untested.is_empty() {
            let size = group_size(untested.len(), found, resolved);
            let mut rest = untested.split_off(size);
            let mut group = std::mem::take(&mut untested);
            if self.eval("prune", &with(&needed, &[&rest]))? {
                resolved += group.len();
                untested = rest;
                continue;
            }
            // The group holds a needed layer: halve it down to one.
            while group.len() > 1 {
                let second = group.split_off(group.len() / 2);
                if self.eval("prune", &with(&needed, &[&rest, &second]))? {
                    // The first half went; the needed layer is in the second.
                    resolved += group.len();
                    group = second;
                } else {
                    rest.extend(second);
                    rest.sort_by_key(|l| position[l]);
                }
            }
            needed.extend(group);
            found += 1;
            resolved += 1;
            untested = rest;
        }
        self.confirm(needed)
    }

    /// Tries to drop each layer of a passing set again, against the set as it is now, until
    /// no layer can go. Group testing finds a layer needed while other layers were still
    /// marked; under a monotone criterion it stays needed, but real criteria at the edge of
    /// float16's noise are not monotone (a strict tolerance on PP-OCRv4 rec passes and fails
    /// by a hair as layers come and go), and such a layer may go once the others went. A set
    /// evaluated before is not evaluated again, so a layer tested after the last drop costs
    /// nothing on the next round: the rounds end with a round of repeats.
    fn confirm(&mut self, mut needed: Vec<usize>) -> std::result::Result<Vec<usize>, Stop> {
        loop {
            let mut dropped = false;
            for layer in needed.clone() {
                let without: Vec<usize> = needed.iter().copied().filter(|&l| l != layer).collect();
                if self.eval("confirm", &without)? {
                    needed = without;
                    dropped = true;
                }
            }
            if !dropped {
                return Ok(needed);
            }
        }
    }
}

/// The size of the next group of `n` untested layers (Hwang's rule): with `d` of them
/// expected to be needed — the share found so far, `found` of `resolved` (Laplace's rule: one
/// half before any) — one layer at a time when at least about half are needed, else the
/// largest power of two not above (n − d + 1)/d, which holds about one needed layer.
fn group_size(n: usize, found: usize, resolved: usize) -> usize {
    let share = (found as f64 + 1.0) / (resolved as f64 + 2.0);
    let d = ((share * n as f64).round() as usize).max(1);
    if n + 2 <= 2 * d {
        return 1;
    }
    let ratio = (n - d + 1) as f64 / d as f64;
    (1usize << ratio.log2().floor().max(0.0) as u32).min(n)
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::testing::Planted;
    use super::*;

    fn opts(mode: Mode, direction: Direction, jobs: usize) -> SearchOptions {
        SearchOptions {
            mode,
            direction,
            objective: Objective::Layers,
            ranking: Ranking::Growth,
            jobs,
            group: Grouping::None,
        }
    }

    fn space(n: usize, growth: &[(usize, f64)]) -> SearchSpace {
        SearchSpace {
            candidates: (0..n).collect(),
            flops: (0..n).map(|i| 100 + i as u64).collect(),
            scores: HashMap::from_iter(growth.iter().copied()).into(),
            deferred: false,
        }
    }

    fn run(
        space: &SearchSpace,
        mode: Mode,
        dir: Direction,
        needed: &[usize],
    ) -> (SearchResult, usize) {
        let mut o = Planted::new(needed, &[]);
        let stop = AtomicBool::new(false);
        let r = search(space, &opts(mode, dir, 1), &mut o, &mut |_| {}, &stop).unwrap();
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

    /// The bound on evaluations for an answer of k of n candidates.
    fn evaluation_bound(k: usize, n: usize) -> f64 {
        1.2 * (k as f64 * (n as f64 / k as f64).log2() + k as f64)
    }

    #[test]
    fn minimal_stays_within_the_group_testing_bound_where_the_ranking_helps() {
        // Rankings as real models give them: the needed layers among the first ranks (dense
        // or sparse there), or all but a few of a small model needed. Growth ranks layer i
        // at position i. Group testing stays within issue 10's bound; the confirmation then
        // adds at most one evaluation per answered layer (under this monotone criterion one
        // round, every drop failing).
        let growth =
            |n: usize| -> Vec<(usize, f64)> { (0..n).map(|i| (i, (n - i) as f64)).collect() };
        let cases: [(usize, Vec<usize>); 4] = [
            // 19 of 200, all in the first 60 ranks (PP-OCR cls-like).
            (200, (0..60).step_by(3).take(19).collect()),
            // 28 of 40 (a small dynamically quantized model).
            (40, (0..40).filter(|i| i % 10 < 7).collect()),
            // The first 5 of 200.
            (200, (0..5).collect()),
            // 69 of 285, spread over the first 120 ranks.
            (285, (0..120).filter(|i| i % 7 < 4).take(69).collect()),
        ];
        for (n, needed) in cases {
            let k = needed.len();
            let sp = space(n, &growth(n));
            let (r, calls) = run(&sp, Mode::Minimal, Direction::Forward, &needed);
            assert_eq!(r.outcome, Outcome::Found(needed.clone()), "{k} of {n}");
            let confirmations: Vec<&Trial> =
                r.trials.iter().filter(|t| t.phase == "confirm").collect();
            assert!(confirmations.len() <= k && confirmations.iter().all(|t| !t.passed));
            let searching = calls - confirmations.len();
            let bound = evaluation_bound(k, n);
            assert!(
                searching as f64 <= bound,
                "{k} of {n}: {searching} evaluations before the confirmation, bound {bound:.1}"
            );
        }
        // A misleading ranking (the second needed layer ranked 146th of 209, as YOLOv8n's
        // strict search has it): no longer twice the bound.
        let sp = space(209, &growth(209));
        let (r, calls) = run(&sp, Mode::Minimal, Direction::Forward, &[0, 145]);
        assert_eq!(r.outcome, Outcome::Found(vec![0, 145]));
        assert!(
            calls <= 32,
            "{calls} evaluations (bound {:.1})",
            evaluation_bound(2, 209)
        );
    }

    #[test]
    fn galloping_starts_at_the_number_of_layers_that_fail_alone() {
        // Layer i ranks i-th. Layers 0, 1, 2 and 4 fail alone (the ranking's verdicts); 9 is
        // needed too, as its error only counts together with others'.
        let growth: Vec<(usize, f64)> = (0..40).map(|i| (i, (40 - i) as f64)).collect();
        let needed = [0, 1, 2, 4, 9];
        // Minimal, with the ranking's verdicts failing these layers alone.
        let minimal = |failing: &[usize]| {
            let mut sp = space(40, &growth);
            sp.scores.failing_alone = failing.to_vec();
            run(&sp, Mode::Minimal, Direction::Forward, &needed)
        };
        let (plain, plain_calls) = minimal(&[]);
        let (seeded, seeded_calls) = minimal(&[4, 0, 2, 1]);
        assert_eq!(plain.outcome, Outcome::Found(needed.to_vec()));
        assert_eq!(seeded.outcome, Outcome::Found(needed.to_vec()));
        let first_gallop = |r: &SearchResult| {
            r.trials
                .iter()
                .find(|t| t.phase == "rank-gallop")
                .map(|t| t.marked.clone())
        };
        assert_eq!(first_gallop(&plain), Some(vec![0]));
        assert_eq!(first_gallop(&seeded), Some((0..4).collect()));
        assert!(
            seeded_calls < plain_calls,
            "{seeded_calls} evaluations, {plain_calls} without"
        );
        // Verdicts that do not hold in the search (layers 6, 7 and 8 failed alone, yet the
        // criterion passes without them) move where galloping starts, not the answer.
        let (r, _) = minimal(&[0, 1, 2, 4, 6, 7, 8]);
        assert_eq!(r.outcome, Outcome::Found(needed.to_vec()));
        assert_eq!(first_gallop(&r), Some((0..7).collect()));
        // Every layer failing alone: the whole ranking is the prefix (marking every layer
        // passed in the reference check), and pruning finds the answer.
        let every: Vec<usize> = (0..40).collect();
        let (r, _) = minimal(&every);
        assert_eq!(r.outcome, Outcome::Found(needed.to_vec()));
        assert_eq!(first_gallop(&r), None);
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
            stop_after: Some((4, &STOP)),
            ..Planted::new(&[10], &[])
        };
        let r = search(
            &sp,
            &opts(Mode::Bisect, Direction::Forward, 1),
            &mut o,
            &mut |_| {},
            &STOP,
        )
        .unwrap();
        assert_eq!(o.calls, 4);
        // check-all (40) passed, none failed, first 20 passed; the interrupt came during the
        // fourth evaluation (first 10), whose verdict is not taken.
        assert_eq!(r.outcome, Outcome::Interrupted(Some((0..20).collect())));
        assert_eq!(r.trials.len(), 3);
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
                ranking: Ranking::Growth,
                jobs: 1,
                group: Grouping::None,
            },
            &mut Either,
            &mut |_| {},
            &stop,
        )
        .unwrap();
        assert_eq!(r.outcome, Outcome::Found(vec![7]));
    }

    /// Passes when every needed layer is marked and, to make the criterion non-monotone, the
    /// set's hash is not a multiple of `quirk` (0: monotone); evaluates batches "in parallel".
    struct Batching {
        needed: Vec<usize>,
        quirk: u64,
        batches: usize,
        evaluated: usize,
        fail_on: Option<Vec<usize>>,
        /// Sets this flag during the given batch (1-based).
        stop_in_batch: Option<(usize, &'static AtomicBool)>,
    }

    impl Oracle for Batching {
        fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
            self.evaluated += 1;
            if self.fail_on.as_deref() == Some(marked) {
                return Err(Error::Invalid("the oracle broke".into()));
            }
            let h = marked
                .iter()
                .fold(17u64, |h, &m| h.wrapping_mul(31).wrapping_add(m as u64));
            let quirky = self.quirk > 0 && !marked.is_empty() && h % self.quirk == 0;
            let missing = self.needed.iter().filter(|n| !marked.contains(n)).count();
            Ok(Evaluation {
                passed: missing == 0 && !quirky,
                error: missing as f64,
                summary: format!("{missing} missing"),
            })
        }
        fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
            self.batches += 1;
            if let Some((b, flag)) = self.stop_in_batch {
                if self.batches == b {
                    flag.store(true, Ordering::SeqCst);
                }
            }
            sets.iter().map(|s| self.evaluate(s)).collect()
        }
        fn parallel(&self) -> bool {
            true
        }
    }

    fn batching(needed: &[usize], quirk: u64) -> Batching {
        Batching {
            needed: needed.to_vec(),
            quirk,
            batches: 0,
            evaluated: 0,
            fail_on: None,
            stop_in_batch: None,
        }
    }

    fn run_jobs(
        sp: &SearchSpace,
        mode: Mode,
        dir: Direction,
        o: &mut Batching,
        jobs: usize,
    ) -> Result<(SearchResult, Vec<usize>)> {
        let stop = AtomicBool::new(false);
        let mut seen = Vec::new();
        let r = search(
            sp,
            &opts(mode, dir, jobs),
            o,
            &mut |t| seen.push(t.iteration),
            &stop,
        )?;
        Ok((r, seen))
    }

    #[test]
    fn minimal_answers_are_1_minimal_under_a_non_monotone_criterion() {
        // The quirk fails one set in three or seven whatever it marks: a layer found needed
        // while others were marked may go once they went, as at float16's edge.
        let growth: Vec<(usize, f64)> = (0..60).map(|i| (i, ((i * 37) % 11) as f64)).collect();
        let sp = space(60, &growth);
        let planted: [&[usize]; 3] = [&[5], &[3, 17, 40], &[0, 1, 2, 9, 20, 21, 33, 47]];
        let mut dropped = 0;
        for needed in planted {
            for quirk in [3u64, 7] {
                let mut o = batching(needed, quirk);
                let (r, _) = run_jobs(&sp, Mode::Minimal, Direction::Forward, &mut o, 1).unwrap();
                let Outcome::Found(answer) = r.outcome else {
                    panic!("{needed:?}/{quirk}: {:?}", r.outcome)
                };
                let mut judge = batching(needed, quirk);
                assert!(judge.evaluate(&answer).unwrap().passed);
                for layer in &answer {
                    let without: Vec<usize> =
                        answer.iter().copied().filter(|l| l != layer).collect();
                    assert!(
                        !judge.evaluate(&without).unwrap().passed,
                        "{needed:?}/{quirk}: {answer:?} passes without {layer}"
                    );
                }
                let drops = r.trials.iter().any(|t| t.phase == "confirm" && t.passed);
                dropped += drops as usize;
                // A drop is a passing set inside the failing one that had found the layer
                // needed: the search reports the contradiction.
                if drops {
                    assert!(contradictions(&r.trials, &r.failing_alone).failing_supersets > 0);
                }
            }
        }
        // The confirmation dropped layers group testing had found needed.
        assert!(dropped > 0);
    }

    #[test]
    fn contradictions_are_failing_supersets_of_passing_sets() {
        let t = |iteration: usize, marked: &[usize], passed: bool| Trial {
            iteration,
            phase: "prune",
            marked: marked.to_vec(),
            marked_flops: 0,
            passed,
            error: 0.0,
            summary: String::new(),
        };
        let trials = [
            t(1, &[1, 2], true),
            t(2, &[1, 2, 3], false),
            t(3, &[1, 3], false),
            t(4, &[70], true),
            t(5, &[1, 2, 70, 130, 131], false),
            t(6, &[2, 3, 4], true),
        ];
        let c = contradictions(&trials, &[]);
        assert_eq!(c.failing_supersets, 2);
        // Trial 5 holds trial 1 (2 layers) and trial 4 (1 layer): the smallest passing set
        // inside it is taken (4 layers more, against trial 2's one more than trial 1).
        assert_eq!(c.example, Some((5, 4)));
        assert_eq!((c.failing_alone, c.failing_alone_example), (0, None));
        // Layers the ranking failed alone, left low by a passing trial: 3 and 9 by trial 4
        // (the smallest such), 70 by trial 1. Trial 1 alone marks 1 and 2: no contradiction.
        let c = contradictions(&trials, &[70, 9, 3]);
        assert_eq!(
            (c.failing_alone, c.failing_alone_example),
            (3, Some((3, 4)))
        );
        assert_eq!(c.failing_supersets, 2);
        let c = contradictions(&trials[..1], &[1, 2]);
        assert_eq!(c, Contradictions::default());
        assert!(!c.any());
        assert_eq!(contradictions(&trials[..1], &[]), Contradictions::default());
        assert_eq!(contradictions(&[], &[]), Contradictions::default());
        // A monotone criterion never contradicts itself.
        let sp = space(60, &[(12, 5.0), (30, 9.0), (40, 0.5)]);
        for mode in [Mode::Minimal, Mode::WorstFirst, Mode::Bisect, Mode::Linear] {
            let (r, _) = run(&sp, mode, Direction::Forward, &[12, 30, 41]);
            assert_eq!(r.contradictions(), Contradictions::default());
        }
    }

    #[test]
    fn any_number_of_jobs_gives_the_same_search() {
        let growth: Vec<(usize, f64)> = (0..48).map(|i| (i, ((i * 37) % 11) as f64)).collect();
        let sp = space(48, &growth);
        let modes = [
            (Mode::Bisect, Direction::Forward),
            (Mode::Bisect, Direction::Reverse),
            (Mode::Linear, Direction::Forward),
            (Mode::WorstFirst, Direction::Forward),
            (Mode::Minimal, Direction::Forward),
        ];
        let planted: [&[usize]; 4] = [&[], &[5], &[3, 17, 40], &[0, 1, 2, 9, 20, 21, 33, 47]];
        for (mode, dir) in modes {
            for needed in planted {
                for quirk in [0u64, 3, 7] {
                    let mut one = batching(needed, quirk);
                    let (base, _) = run_jobs(&sp, mode, dir, &mut one, 1).unwrap();
                    assert_eq!(base.speculative, 0);
                    let key = |r: &SearchResult| -> Vec<(usize, &'static str, Vec<usize>, bool)> {
                        r.trials
                            .iter()
                            .map(|t| (t.iteration, t.phase, t.marked.clone(), t.passed))
                            .collect()
                    };
                    for jobs in [2, 3, 4, 8] {
                        let mut o = batching(needed, quirk);
                        let (r, seen) = run_jobs(&sp, mode, dir, &mut o, jobs).unwrap();
                        let what = format!("{mode:?} {dir:?} {needed:?} quirk {quirk} jobs {jobs}");
                        assert_eq!(r.outcome, base.outcome, "{what}");
                        assert_eq!(r.contiguous_count, base.contiguous_count, "{what}");
                        assert_eq!(key(&r), key(&base), "{what}");
                        // Every trial reported once, in order.
                        assert_eq!(seen, (1..=r.trials.len()).collect::<Vec<_>>(), "{what}");
                        assert_eq!(o.evaluated, r.trials.len() + r.speculative, "{what}");
                        assert!(o.batches <= r.trials.len(), "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn batches_take_fewer_rounds_than_evaluations() {
        let sp = space(64, &[]);
        let mut one = batching(&[37], 0);
        let (base, _) = run_jobs(&sp, Mode::Bisect, Direction::Forward, &mut one, 1).unwrap();
        let mut three = batching(&[37], 0);
        let (r, _) = run_jobs(&sp, Mode::Bisect, Direction::Forward, &mut three, 3).unwrap();
        assert_eq!(r.outcome, base.outcome);
        // Both verdicts of each probe are looked ahead: two bisection steps per round.
        assert!(
            three.batches * 2 <= base.trials.len() + 2,
            "{} rounds for {} evaluations",
            three.batches,
            base.trials.len()
        );
    }

    #[test]
    fn only_the_needed_sets_error_ends_a_batched_search() {
        let sp = space(32, &[]);
        // With two jobs the first round looks ahead at the first 16 layers while the ends are
        // checked; make a set the strategy never needs break: the search is unaffected.
        let mut base = batching(&[3], 0);
        let (want, _) = run_jobs(&sp, Mode::Bisect, Direction::Forward, &mut base, 1).unwrap();
        let taken: Vec<Vec<usize>> = want.trials.iter().map(|t| t.marked.clone()).collect();
        let mut o = batching(&[3], 0);
        let mut probe = batching(&[3], 0);
        let (r, _) = run_jobs(&sp, Mode::Bisect, Direction::Forward, &mut probe, 4).unwrap();
        assert!(r.speculative > 0);
        // A speculative set: evaluated with four jobs but not taken.
        let all_sets: Vec<Vec<usize>> = (0..=32).map(|n| (0..n).collect()).collect();
        let spare = all_sets
            .into_iter()
            .find(|s| !taken.contains(s))
            .expect("bisection takes few prefixes");
        o.fail_on = Some(spare);
        let (r, _) = run_jobs(&sp, Mode::Bisect, Direction::Forward, &mut o, 4).unwrap();
        assert_eq!(r.outcome, want.outcome);
        // A needed set's error is the search's error.
        let mut o = batching(&[3], 0);
        o.fail_on = Some(taken[2].clone());
        let e = run_jobs(&sp, Mode::Bisect, Direction::Forward, &mut o, 4).unwrap_err();
        assert!(e.to_string().contains("the oracle broke"), "{e}");
    }

    #[test]
    fn an_interrupted_batch_is_not_taken() {
        static STOP: AtomicBool = AtomicBool::new(false);
        let sp = space(40, &[]);
        let mut o = batching(&[23], 0);
        o.stop_in_batch = Some((3, &STOP));
        let r = search(
            &sp,
            &opts(Mode::Bisect, Direction::Forward, 3),
            &mut o,
            &mut |_| {},
            &STOP,
        )
        .unwrap();
        // Two batches taken; the third one's verdicts (evaluated) are dropped.
        let mut full = batching(&[23], 0);
        let (all, _) = run_jobs(&sp, Mode::Bisect, Direction::Forward, &mut full, 3).unwrap();
        assert!(matches!(r.outcome, Outcome::Interrupted(_)));
        assert!(r.trials.len() < all.trials.len());
        let taken: Vec<_> = r.trials.iter().map(|t| t.marked.clone()).collect();
        let prefix: Vec<_> = all.trials[..taken.len()]
            .iter()
            .map(|t| t.marked.clone())
            .collect();
        assert_eq!(taken, prefix);
        assert!(o.evaluated > r.trials.len() + r.speculative);
    }

    #[test]
    fn a_sequential_oracle_is_not_asked_to_speculate() {
        let sp = space(40, &[]);
        let mut o = Planted::new(&[23], &[]);
        let stop = AtomicBool::new(false);
        let r = search(
            &sp,
            &opts(Mode::Bisect, Direction::Forward, 4),
            &mut o,
            &mut |_| {},
            &stop,
        )
        .unwrap();
        assert_eq!(r.speculative, 0);
        assert_eq!(o.calls, r.trials.len());
    }
}
