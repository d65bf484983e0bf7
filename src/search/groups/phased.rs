//! The search over roles (`--group roles`): each role one candidate first, then the layers
//! inside the roles that are needed.
//!
//! Phase 1 runs the strategy over roles ([`super::roles`] of the candidates): a set of roles
//! is judged as the set of their layers. Phase 2 runs it again inside each role phase 1
//! kept, one role at a time, with the layers kept of the other roles marked throughout. With
//! `minimal`, a last round tries to drop each layer of the answer once more, as the plain
//! search's confirmation does. Every evaluation goes through one ledger: a set of layers is
//! never evaluated twice across the phases, and every trial is recorded in layer terms (the
//! `--save-result` history, the debug replay and the HTML report read them as they read the
//! plain search's).
//!
//! What it guarantees: the answer is a set of layers that was evaluated and passed (each
//! phase starts from the set the previous one ended with, which passed). With `minimal`,
//! dropping any single layer of it fails, as with the plain search. It is not always the
//! plain search's answer: the roles are searched first, so among several passing answers it
//! finds one made of whole roles where it can.

use super::super::{
    search, Evaluation, Mode, Oracle, Outcome, Ranking, Scores, SearchOptions, SearchResult,
    SearchSpace, Trial,
};
use super::{roles, shape_facts, Grouping};
use crate::error::Result;
use crate::graph::Graph;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

/// The strategy as `options.group` asks: over layers ([`search`]), or over roles
/// ([`search_by_roles`], the roles of the space's candidates in `graph`).
pub fn search_as_grouped(
    space: &SearchSpace,
    options: &SearchOptions,
    graph: &Graph,
    oracle: &mut dyn Oracle,
    on_trial: &mut dyn FnMut(&Trial),
    stop: &AtomicBool,
) -> Result<SearchResult> {
    match options.group {
        Grouping::None => search(space, options, oracle, on_trial, stop),
        Grouping::Roles => {
            let facts = shape_facts(graph);
            let roles = roles(graph, facts.as_ref(), &space.candidates);
            search_by_roles(space, options, &roles.layer_sets(), oracle, on_trial, stop)
        }
    }
}

/// Every evaluation of a grouped search, in layer terms: verdicts by set of layers, and the
/// trials in evaluation order.
struct Ledger<'a> {
    inner: &'a mut dyn Oracle,
    flops: &'a [u64],
    known: HashMap<Vec<usize>, Evaluation>,
    trials: Vec<Trial>,
    recorded: HashSet<Vec<usize>>,
    on_trial: &'a mut dyn FnMut(&Trial),
}

impl Ledger<'_> {
    fn evaluate(&mut self, layers: Vec<usize>) -> Result<Evaluation> {
        if let Some(e) = self.known.get(&layers) {
            return Ok(e.clone());
        }
        let e = self.inner.evaluate(&layers)?;
        self.known.insert(layers, e.clone());
        Ok(e)
    }

    fn evaluate_batch(&mut self, sets: Vec<Vec<usize>>) -> Vec<Result<Evaluation>> {
        let mut unknown: Vec<Vec<usize>> = Vec::new();
        for s in &sets {
            if !self.known.contains_key(s) && !unknown.contains(s) {
                unknown.push(s.clone());
            }
        }
        let fresh = if unknown.is_empty() {
            Vec::new()
        } else {
            self.inner.evaluate_batch(&unknown)
        };
        let mut failed: HashMap<Vec<usize>, String> = HashMap::new();
        let mut fresh = fresh.into_iter();
        for set in unknown {
            match fresh.next() {
                Some(Ok(e)) => {
                    self.known.insert(set, e);
                }
                Some(Err(e)) => {
                    failed.insert(set, e.to_string());
                }
                None => {
                    failed.insert(
                        set,
                        "the oracle answered fewer sets than it was given".into(),
                    );
                }
            }
        }
        sets.into_iter()
            .map(|s| match self.known.get(&s) {
                Some(e) => Ok(e.clone()),
                None => Err(crate::error::Error::Invalid(
                    failed.get(&s).cloned().unwrap_or_default(),
                )),
            })
            .collect()
    }

    /// Records an evaluation as a trial, unless that set of layers is recorded already (a
    /// later phase asking again: the verdict came from the ledger, not a new evaluation).
    fn record(&mut self, phase: &'static str, layers: Vec<usize>, e: &Evaluation) {
        if !self.recorded.insert(layers.clone()) {
            return;
        }
        let trial = Trial {
            iteration: self.trials.len() + 1,
            phase,
            marked_flops: layers
                .iter()
                .map(|&i| self.flops.get(i).copied().unwrap_or(0))
                .sum(),
            marked: layers,
            passed: e.passed,
            error: e.error,
            summary: e.summary.clone(),
        };
        (self.on_trial)(&trial);
        self.trials.push(trial);
    }
}

/// Sorted union of `parts`.
fn union<'p>(parts: impl IntoIterator<Item = &'p [usize]>) -> Vec<usize> {
    let mut v: Vec<usize> = parts.into_iter().flatten().copied().collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Phase 1's name for a strategy phase: the reference checks keep theirs (they judge the same
/// sets as the plain search's), the others say they moved roles.
fn roles_phase(phase: &str) -> &'static str {
    match phase {
        "check-all" => "check-all",
        "check-none" => "check-none",
        "bisect" => "roles-bisect",
        "linear" => "roles-linear",
        "rank-gallop" => "roles-gallop",
        "rank-bisect" => "roles-bisect",
        "prune" => "roles-prune",
        "confirm" => "roles-confirm",
        _ => "roles",
    }
}

/// Phase 2's name for a strategy phase.
fn refine_phase(phase: &str) -> &'static str {
    match phase {
        "check-all" => "refine-check-all",
        "check-none" => "refine-check-none",
        "bisect" | "rank-bisect" => "refine-bisect",
        "linear" => "refine-linear",
        "rank-gallop" => "refine-gallop",
        "prune" => "refine-prune",
        "confirm" => "refine-confirm",
        _ => "refine",
    }
}

/// The oracle of both phases: judges sets of something other than layers — roles (indices
/// into `groups`) in phase 1, one role's layers beside the other roles' kept ones in phase 2 —
/// as the layers `layers` makes of each, through the ledger. Phase 1 ranks roles too.
struct Through<'r, 'l, 'a> {
    ledger: &'l RefCell<Ledger<'a>>,
    layers: &'l dyn Fn(&[usize]) -> Vec<usize>,
    ranking: Option<&'r mut RoleRanking<'l>>,
}

impl Oracle for Through<'_, '_, '_> {
    fn evaluate(&mut self, set: &[usize]) -> Result<Evaluation> {
        let layers = (self.layers)(set);
        self.ledger.borrow_mut().evaluate(layers)
    }

    fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        let sets = sets.iter().map(|s| (self.layers)(s)).collect();
        self.ledger.borrow_mut().evaluate_batch(sets)
    }

    fn parallel(&self) -> bool {
        self.ledger.borrow().inner.parallel()
    }

    fn rank(&mut self) -> Result<Scores> {
        match self.ranking.as_deref_mut() {
            Some(r) => r.rank(self.ledger),
            None => Err(crate::error::Error::Invalid(
                "a role's refinement is given its layers' scores: it ranks nothing".into(),
            )),
        }
    }
}

/// Phase 1's ranking of roles, and what it learnt that phase 2 reads.
struct RoleRanking<'l> {
    groups: &'l [Vec<usize>],
    /// Every candidate layer (the sensitivity ranking's plans mark all but one role).
    all: &'l [usize],
    ranking: Ranking,
    jobs: usize,
    stop: &'l AtomicBool,
    /// The layers' scores, when the deferred ranking gave them (growth): phase 2 ranks by them.
    layer_scores: Option<Scores>,
    /// Roles whose plan alone in low precision failed (the sensitivity ranking's verdicts).
    failing_alone: Vec<usize>,
}

impl RoleRanking<'_> {
    fn rank(&mut self, ledger: &RefCell<Ledger<'_>>) -> Result<Scores> {
        match self.ranking {
            Ranking::Sensitivity => self.rank_roles_by_sensitivity(ledger),
            Ranking::Growth => {
                // One run ranks every layer; a role ranks by its worst layer.
                let layer_scores = ledger.borrow_mut().inner.rank()?;
                let scores = role_scores(&layer_scores, self.groups);
                self.layer_scores = Some(layer_scores);
                Ok(scores)
            }
        }
    }

    /// The sensitivity ranking over roles: each role alone in low precision, every other
    /// candidate high, judged through the oracle — one evaluation per role instead of one run
    /// per layer. Its evaluations are trials (`rank-roles`): verdicts on sets of layers like
    /// any other, which the debug replay keeps.
    fn rank_roles_by_sensitivity(&mut self, ledger: &RefCell<Ledger<'_>>) -> Result<Scores> {
        let mut scores = Scores::default();
        let order: Vec<usize> = (0..self.groups.len()).collect();
        for chunk in order.chunks(self.jobs.max(1)) {
            if self.stop.load(Ordering::SeqCst) {
                // Interrupted: the rest rank last; the search stops before its next evaluation.
                break;
            }
            let plans: Vec<Vec<usize>> = chunk
                .iter()
                .map(|&g| {
                    let role: HashSet<usize> = self.groups[g].iter().copied().collect();
                    self.all
                        .iter()
                        .copied()
                        .filter(|l| !role.contains(l))
                        .collect()
                })
                .collect();
            let verdicts = ledger.borrow_mut().evaluate_batch(plans.clone());
            for ((&g, plan), verdict) in chunk.iter().zip(plans).zip(verdicts) {
                let e = verdict?;
                ledger.borrow_mut().record("rank-roles", plan, &e);
                let score = if e.error.is_nan() {
                    f64::INFINITY
                } else {
                    e.error
                };
                scores.by_layer.insert(g, score);
                if !e.passed {
                    scores.failing_alone.push(g);
                }
            }
        }
        self.failing_alone = scores.failing_alone.clone();
        Ok(scores)
    }
}

/// Scores of roles from their layers': a role scores its worst layer's score, and fails alone
/// when one of its layers does (the role alone in low precision marks fewer layers than that
/// layer alone: under a monotone criterion it fails too).
fn role_scores(layers: &Scores, groups: &[Vec<usize>]) -> Scores {
    let failing: HashSet<usize> = layers.failing_alone.iter().copied().collect();
    let mut scores = Scores::default();
    for (g, members) in groups.iter().enumerate() {
        let worst = members
            .iter()
            .filter_map(|l| layers.by_layer.get(l).copied())
            .filter(|s| !s.is_nan())
            .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))));
        if let Some(w) = worst {
            scores.by_layer.insert(g, w);
        }
        if members.iter().any(|l| failing.contains(l)) {
            scores.failing_alone.push(g);
        }
    }
    scores
}

/// Runs the strategy over roles, then inside the roles it needs (see the module's docs).
/// `groups` partitions `space.candidates` (each a role's layers, ascending), in topological
/// order of their first layer. The result is in layer terms: the answer, and every
/// evaluation as a trial in the order it was made; `contiguous_count` is None (an answer
/// made of roles is not a run of layers from one end).
pub fn search_by_roles(
    space: &SearchSpace,
    options: &SearchOptions,
    groups: &[Vec<usize>],
    oracle: &mut dyn Oracle,
    on_trial: &mut dyn FnMut(&Trial),
    stop: &AtomicBool,
) -> Result<SearchResult> {
    let ledger = RefCell::new(Ledger {
        inner: oracle,
        flops: &space.flops,
        known: HashMap::new(),
        trials: Vec::new(),
        recorded: HashSet::new(),
        on_trial,
    });
    let plain = SearchOptions {
        group: Grouping::None,
        ..*options
    };
    let role_space = SearchSpace {
        candidates: (0..groups.len()).collect(),
        flops: groups.iter().map(|g| space.flops_of(g)).collect(),
        scores: role_scores(&space.scores, groups),
        deferred: space.deferred,
    };
    let mut role_ranking = RoleRanking {
        groups,
        all: &space.candidates,
        ranking: options.ranking,
        jobs: if ledger.borrow().inner.parallel() {
            options.jobs
        } else {
            1
        },
        stop,
        layer_scores: None,
        failing_alone: Vec::new(),
    };
    let roles_layers = |roles: &[usize]| union(roles.iter().map(|&g| groups[g].as_slice()));
    let phase1 = search(
        &role_space,
        &plain,
        &mut Through {
            ledger: &ledger,
            layers: &roles_layers,
            ranking: Some(&mut role_ranking),
        },
        &mut |t: &Trial| {
            ledger
                .borrow_mut()
                .record(roles_phase(t.phase), roles_layers(&t.marked), &t.into());
        },
        stop,
    )?;
    // A role of one layer that failed alone is a layer that failed alone (its plan is the
    // layer's own sensitivity plan).
    let failing_alone: Vec<usize> = role_ranking
        .failing_alone
        .iter()
        .filter(|&&g| groups[g].len() == 1)
        .map(|&g| groups[g][0])
        .collect();
    let layer_scores = role_ranking
        .layer_scores
        .take()
        .unwrap_or_else(|| space.scores.clone());
    let needed: Vec<usize> = match phase1.outcome {
        Outcome::Found(roles) => roles,
        other => {
            let outcome = match other {
                Outcome::Interrupted(best) => Outcome::Interrupted(best.map(|b| roles_layers(&b))),
                o => o,
            };
            return Ok(finish(ledger, outcome, failing_alone));
        }
    };
    // Phase 2: the kept layers of each needed role, refined one role at a time.
    let mut kept: Vec<Vec<usize>> = needed.iter().map(|&g| groups[g].clone()).collect();
    let refinement = Refinement {
        options,
        layer_scores: &layer_scores,
        flops: &space.flops,
        ledger: &ledger,
        stop,
    };
    let mut interrupted = if options.mode == Mode::Minimal {
        // First each role's least likely needed layers go together (the trim, then runs of
        // blocks inside it), then each role is pruned in the context of the others' reduced
        // sets: most drops happen before the single-layer tests, so those are made in the
        // answer's final context and the last confirmation finds them judged already.
        refinement.each(&mut kept, Step::Trim)?
            || refinement.each(&mut kept, Step::Holes)?
            || refinement.each(&mut kept, Step::Prune)?
    } else {
        refinement.each(&mut kept, Step::Mode)?
    };
    let mut answer = union(kept.iter().map(|v| v.as_slice()));
    if !interrupted && options.mode == Mode::Minimal {
        let (confirmed, finished) = confirm(&ledger, answer, stop)?;
        answer = confirmed;
        interrupted = !finished;
    }
    let outcome = if interrupted {
        Outcome::Interrupted(Some(answer))
    } else {
        Outcome::Found(answer)
    };
    Ok(finish(ledger, outcome, failing_alone))
}

/// What a step of phase 2 runs inside a role.
#[derive(Clone, Copy, PartialEq)]
enum Step {
    /// The mode as asked (contiguous modes and worst-first).
    Mode,
    /// Minimal's first step: the shortest passing prefix of the role's layers in ranking
    /// order by the layers' own scores (galloping, as minimal does); without them, the
    /// shortest passing run of blocks ([`Refinement::trim`] from each end).
    Trim,
    /// Minimal's second step, without per-layer scores: runs of blocks inside the trimmed
    /// set that can go together ([`Refinement::open_holes`]), in the roles where finding
    /// one pays ([`HOLE_WORTH`]). With scores, nothing (the trim went by the scores, not by
    /// blocks).
    Holes,
    /// Minimal's last step: group testing and confirmation from the reduced set.
    Prune,
}

/// How many times [`Refinement::open_holes`] halves a role's interior: a role needed in every
/// block costs 2^levels − 1 evaluations (7), a run of at least an eighth of its blocks that
/// can go is found whole.
const HOLE_LEVELS: u32 = 3;

/// A hole found while pruning a role costs the last confirmation one evaluation per layer of
/// the roles pruned before it (their drops were judged beside the role whole). Looking for
/// holes first costs up to 2^[`HOLE_LEVELS`] − 1 evaluations a role, so a role is searched
/// only where a hole would save at least 8 times that: after roles holding 56 layers or more.
const HOLE_WORTH: usize = 8 * ((1 << HOLE_LEVELS) - 1);

/// Phase 2: the strategy inside each needed role, beside the others' kept layers.
struct Refinement<'r, 'a> {
    options: &'r SearchOptions,
    /// The layers' scores where the ranking gave them (growth); empty otherwise.
    layer_scores: &'r Scores,
    flops: &'r [u64],
    ledger: &'r RefCell<Ledger<'a>>,
    stop: &'r AtomicBool,
}

impl Refinement<'_, '_> {
    /// Runs `step` inside each role of `kept` in turn, each with the others' layers as they
    /// stand marked. Returns whether it was interrupted (then `kept` holds the best set).
    fn each(&self, kept: &mut [Vec<usize>], step: Step) -> Result<bool> {
        let by_depth = self.layer_scores.by_layer.is_empty();
        for k in 0..kept.len() {
            let fixed = union(
                kept.iter()
                    .enumerate()
                    .filter(|&(j, _)| j != k)
                    .map(|(_, v)| v.as_slice()),
            );
            if step == Step::Holes {
                let before: usize = kept[..k].iter().map(Vec::len).sum();
                if !by_depth || before < HOLE_WORTH {
                    continue;
                }
                let (rest, finished) = self.open_holes(&kept[k], &fixed)?;
                kept[k] = rest;
                if !finished {
                    return Ok(true);
                }
                continue;
            }
            if step == Step::Trim && by_depth {
                // From the earliest block, then from the latest.
                let late_first: Vec<usize> = kept[k].iter().rev().copied().collect();
                let (rest, finished) = self.trim(late_first, &fixed, "refine-trim")?;
                let (rest, finished) = if finished {
                    self.trim(union([rest.as_slice()]), &fixed, "refine-trim")?
                } else {
                    (rest, false)
                };
                kept[k] = union([rest.as_slice()]);
                if !finished {
                    return Ok(true);
                }
                continue;
            }
            let with_fixed = |marked: &[usize]| union([fixed.as_slice(), marked]);
            let (inside, options) = self.inside(&kept[k], step);
            let r = search(
                &inside,
                &options,
                &mut Through {
                    ledger: self.ledger,
                    layers: &with_fixed,
                    ranking: None,
                },
                &mut |t: &Trial| {
                    self.ledger.borrow_mut().record(
                        refine_phase(t.phase),
                        with_fixed(&t.marked),
                        &t.into(),
                    );
                },
                self.stop,
            )?;
            match r.outcome {
                Outcome::Found(m) => kept[k] = m,
                Outcome::NothingNeeded => kept[k].clear(),
                // Every set this search judged failed but the whole role (it passed before:
                // the ledger's verdict): the role stays whole.
                Outcome::ReferenceFails | Outcome::NotFound => {}
                Outcome::Interrupted(best) => {
                    if let Some(b) = best {
                        kept[k] = b;
                    }
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Drops a role's layers from the end of `order` while the rest passes beside `fixed`:
    /// galloping down from the whole role (1, 2, 4… layers dropped) to the first failure,
    /// then bisecting between it and the last pass. Returns the shortest passing prefix of
    /// `order` found — its last layer needed (the prefix without it was evaluated and
    /// failed), or nothing when the role is not needed at all — and whether it finished
    /// (false: interrupted, the prefix is the last that passed).
    ///
    /// Galloping down costs one evaluation where the whole role is needed (the stack of
    /// RMSNorms of an LLM), about 2·log₂ d where d layers can go; the whole role with the
    /// others passed before (the set phase 1 or the previous step ended with).
    fn trim(
        &self,
        order: Vec<usize>,
        fixed: &[usize],
        phase: &'static str,
    ) -> Result<(Vec<usize>, bool)> {
        let n = order.len();
        let judge = |len: usize| -> Result<Option<bool>> {
            if self.stop.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let layers = union([fixed, &order[..len]]);
            let e = self.ledger.borrow_mut().evaluate(layers.clone())?;
            if self.stop.load(Ordering::SeqCst) {
                // The evaluation may have been cut short: its verdict is not taken.
                return Ok(None);
            }
            self.ledger.borrow_mut().record(phase, layers, &e);
            Ok(Some(e.passed))
        };
        let (mut good, mut bad) = (n, None);
        let mut dropped = 1;
        while bad.is_none() && good > 0 {
            let len = n.saturating_sub(dropped);
            match judge(len)? {
                None => return Ok((order[..good].to_vec(), false)),
                Some(true) => good = len,
                Some(false) => bad = Some(len),
            }
            dropped *= 2;
        }
        if let Some(mut bad) = bad {
            while good - bad > 1 {
                let mid = (good + bad) / 2;
                match judge(mid)? {
                    None => return Ok((order[..good].to_vec(), false)),
                    Some(true) => good = mid,
                    Some(false) => bad = mid,
                }
            }
        }
        Ok((order[..good].to_vec(), true))
    }

    /// Drops runs of blocks from the inside of a trimmed role (`role` ascending, in block
    /// order; both ends needed, the trims found): the interior whole, then its halves,
    /// quarters… down to [`HOLE_LEVELS`] levels, each run dropped when the rest passes beside
    /// `fixed` and then widened on both sides ([`Refinement::trim`] towards each neighbour).
    /// A run that fails holds a needed layer and is halved at the next level; runs of one
    /// layer are pruning's. Returns the layers kept (a passing set) and whether it finished.
    ///
    /// Without it, a hole in the middle of a role (an LLM's post-attention norms needed in
    /// the early and the late blocks only) opens one layer at a time during pruning — after
    /// the earlier roles were pruned beside it whole, so the last confirmation tests each of
    /// their layers again.
    fn open_holes(&self, role: &[usize], fixed: &[usize]) -> Result<(Vec<usize>, bool)> {
        let n = role.len();
        let mut kept: Vec<usize> = role.to_vec();
        if n < 4 {
            return Ok((kept, true));
        }
        let mut runs = vec![(1, n - 1)];
        for level in 0..HOLE_LEVELS {
            let mut halves = Vec::new();
            for (a, b) in runs {
                let run: Vec<usize> = role[a..b]
                    .iter()
                    .copied()
                    .filter(|l| kept.contains(l))
                    .collect();
                if run.len() < 2 {
                    continue;
                }
                if self.stop.load(Ordering::SeqCst) {
                    return Ok((kept, false));
                }
                let without: Vec<usize> =
                    kept.iter().copied().filter(|l| !run.contains(l)).collect();
                let layers = union([fixed, &without]);
                let e = self.ledger.borrow_mut().evaluate(layers.clone())?;
                if self.stop.load(Ordering::SeqCst) {
                    return Ok((kept, false));
                }
                self.ledger.borrow_mut().record("refine-holes", layers, &e);
                if !e.passed {
                    if level + 1 < HOLE_LEVELS {
                        let mid = (a + b) / 2;
                        halves.extend([(a, mid), (mid, b)]);
                    }
                    continue;
                }
                kept = without;
                // Widen the hole: the kept layers before it, nearest last (the trim drops from
                // the end of its order), then those after it, nearest last. The role's ends
                // stay (the trims found them needed).
                let (first, last) = (role[0], role[n - 1]);
                let before: Vec<usize> = kept
                    .iter()
                    .copied()
                    .filter(|&l| l != first && l < run[0])
                    .collect();
                let after: Vec<usize> = kept
                    .iter()
                    .rev()
                    .copied()
                    .filter(|&l| l != last && l > run[run.len() - 1])
                    .collect();
                for side in [before, after] {
                    if side.is_empty() {
                        continue;
                    }
                    let others: Vec<usize> =
                        kept.iter().copied().filter(|l| !side.contains(l)).collect();
                    let (rest, finished) =
                        self.trim(side, &union([fixed, &others]), "refine-holes")?;
                    kept = union([others.as_slice(), rest.as_slice()]);
                    if !finished {
                        return Ok((kept, false));
                    }
                }
            }
            runs = halves;
        }
        Ok((kept, true))
    }

    /// The search space and options of `step` over a role's kept layers `role` (ascending).
    ///
    /// Without per-layer scores (the sensitivity ranking ranked roles, not layers) minimal
    /// ranks a role's layers by depth, the later block first: in a stack of repeated blocks
    /// activations grow with depth (residual streams), so a later block's layer is the more
    /// likely needed, and pruning tests the earlier ones first. That says where to look,
    /// never what the answer is: pruning and confirmation evaluate every drop. (The trim
    /// without scores is [`Refinement::trim`], from both ends.)
    fn inside(&self, role: &[usize], step: Step) -> (SearchSpace, SearchOptions) {
        let by_depth = self.layer_scores.by_layer.is_empty();
        let failing_in_role: Vec<usize> = self
            .layer_scores
            .failing_alone
            .iter()
            .copied()
            .filter(|l| role.contains(l))
            .collect();
        let by_layer = if by_depth && step != Step::Mode {
            role.iter()
                .enumerate()
                .map(|(depth, &l)| (l, depth as f64))
                .collect()
        } else {
            self.layer_scores.by_layer.clone()
        };
        let scores = Scores {
            by_layer,
            // Pruning starts from the trimmed set, whose last layer in ranking order the trim
            // found needed (the prefix without it failed): galloping starts at the whole set
            // ([`Scores::failing_alone`]'s count) and evaluates nothing.
            failing_alone: if step == Step::Prune {
                role.to_vec()
            } else {
                failing_in_role
            },
        };
        let mode = match step {
            Step::Mode => self.options.mode,
            Step::Trim => Mode::WorstFirst,
            Step::Holes | Step::Prune => Mode::Minimal,
        };
        let options = SearchOptions {
            mode,
            group: Grouping::None,
            ..*self.options
        };
        let space = SearchSpace {
            candidates: role.to_vec(),
            flops: self.flops.to_vec(),
            scores,
            deferred: false,
        };
        (space, options)
    }
}

/// The plain search's last round over the whole answer: drop each layer whose removal passes,
/// until none can go. A layer was confirmed inside its role while later roles were still
/// whole; under a monotone criterion it stays needed, but real criteria are not always
/// monotone. Sets judged before come from the ledger, so layers whose context did not change
/// cost nothing. Returns the answer (it passes) and whether the round finished (false:
/// interrupted).
fn confirm(
    ledger: &RefCell<Ledger<'_>>,
    mut answer: Vec<usize>,
    stop: &AtomicBool,
) -> Result<(Vec<usize>, bool)> {
    loop {
        let mut dropped = false;
        for layer in answer.clone() {
            if stop.load(Ordering::SeqCst) {
                return Ok((answer, false));
            }
            let without: Vec<usize> = answer.iter().copied().filter(|&l| l != layer).collect();
            let e = ledger.borrow_mut().evaluate(without.clone())?;
            ledger.borrow_mut().record("confirm", without.clone(), &e);
            if e.passed {
                answer = without;
                dropped = true;
            }
        }
        if !dropped {
            return Ok((answer, true));
        }
    }
}

/// The result in layer terms. Speculative evaluations (`--jobs`) are the sets evaluated that
/// no phase took: a set one phase evaluated ahead and a later one asked for is a trial.
fn finish(
    ledger: RefCell<Ledger<'_>>,
    outcome: Outcome,
    failing_alone: Vec<usize>,
) -> SearchResult {
    let ledger = ledger.into_inner();
    let speculative = ledger
        .known
        .keys()
        .filter(|s| !ledger.recorded.contains(*s))
        .count();
    SearchResult {
        outcome,
        trials: ledger.trials,
        contiguous_count: None,
        speculative,
        failing_alone,
    }
}

impl From<&Trial> for Evaluation {
    fn from(t: &Trial) -> Evaluation {
        Evaluation {
            passed: t.passed,
            error: t.error,
            summary: t.summary.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
