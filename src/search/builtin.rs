//! The built-in oracle: runs each candidate plan in the emulator (incrementally, through a
//! [`ValueCache`]) and compares its outputs with the golden outputs under a [`Criterion`].

use super::{Evaluation, Oracle, Ranking, Scores};
use crate::compare::{check_output, fmt_g, Criterion};
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::exec::{Feeds, Interpreter, PlanOptions, PreparedPlan, RunOptions, ValueCache};
use crate::precision::plan::PrecisionPlan;
use crate::precision::{Accumulator, Precision};
use crate::tensor::Tensor;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Golden outputs of one input set, by output name.
pub type Golden = Vec<(String, Tensor)>;

/// Evaluates candidate sets by emulation.
pub struct BuiltinOracle<'a> {
    interp: &'a Interpreter<'a>,
    feeds: &'a [Feeds],
    golden: Vec<Golden>,
    criterion: Criterion,
    /// The plan with nothing marked.
    pub low: PrecisionPlan,
    /// The precision marked layers run in.
    pub high: Precision,
    accumulate: Accumulator,
    amax: Option<&'a BTreeMap<String, f32>>,
    pub cache: ValueCache,
    /// Layer executions the same runs would have cost without the cache.
    pub full_executions: u64,
    /// Candidate plans evaluated.
    pub evaluations: usize,
    /// Plans run to rank the candidates ([`sensitivity`](Self::sensitivity)).
    pub ranking_runs: usize,
    /// The ranking a deferred search space asks for ([`Oracle::rank`]).
    deferred: Option<Ranking>,
    /// Set (Ctrl-C) to cut the sensitivity ranking short: the search stops at its next
    /// evaluation anyway.
    stop: Option<&'a AtomicBool>,
    /// The low plan and the all-high plan, prepared once: candidates are composed from them.
    prepared: Option<(PreparedPlan, PreparedPlan)>,
    /// Sensitivity ranking runs made at the same time (`--jobs`).
    ranking_jobs: usize,
    /// A user criterion that decides the verdicts instead of `criterion`.
    user: Option<UserCriterion>,
    /// Each input set is a prompt generated from (`--decode`); `feeds` are its first steps'.
    decode: Option<&'a Decoder>,
    /// Plans with every layer in one precision, prepared once each: assignments of several
    /// precisions ([`evaluate_plans`](Self::evaluate_plans)) are composed from them.
    uniform: BTreeMap<Precision, PreparedPlan>,
}

impl<'a> BuiltinOracle<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        interp: &'a Interpreter<'a>,
        feeds: &'a [Feeds],
        criterion: Criterion,
        low: PrecisionPlan,
        high: Precision,
        accumulate: Accumulator,
        amax: Option<&'a BTreeMap<String, f32>>,
        cache: ValueCache,
    ) -> Result<BuiltinOracle<'a>> {
        if feeds.is_empty() {
            return Err(Error::Invalid(
                "the search needs at least one input set".into(),
            ));
        }
        Ok(BuiltinOracle {
            interp,
            feeds,
            golden: Vec::new(),
            criterion,
            low,
            high,
            accumulate,
            amax,
            cache,
            full_executions: 0,
            evaluations: 0,
            ranking_runs: 0,
            deferred: None,
            stop: None,
            prepared: None,
            ranking_jobs: 1,
            user: None,
            decode: None,
            uniform: BTreeMap::new(),
        })
    }

    /// Makes every evaluation a generation (`--decode`): each input set's feeds are the first
    /// step's ([`Decoder::first_feeds`]); the first step runs through the cache, the next ones
    /// (fed from the candidate's own outputs) outside it.
    pub fn generating(&mut self, decode: Option<&'a Decoder>) {
        self.decode = decode;
    }

    /// Model runs in one evaluation of an input set.
    fn runs_per_set(&self) -> u64 {
        self.decode.map_or(1, |d| d.steps() as u64)
    }

    /// The layers an uncached plain run executes (an evaluation, the reference).
    fn nodes(&self) -> u64 {
        self.interp.layers_per_run()
    }

    /// The layers an uncached observed run executes (the ranking's, the value sizes'): every
    /// node, those that compute folded weights too.
    fn observed_nodes(&self) -> u64 {
        self.interp.graph().nodes.len() as u64
    }

    /// What one FP32 run on the first input set holds: the bytes of all its values, and the
    /// most it holds at once ([`Interpreter::peak_value_bytes`]). One uncached run, before the
    /// reference run, so the cache budget can be set from it.
    pub fn value_bytes(&mut self) -> Result<(usize, usize)> {
        let mut sizes: HashMap<String, usize> = HashMap::new();
        self.interp.run_cached_observed(
            &self.feeds[0],
            0,
            None,
            &mut ValueCache::new(0),
            &mut |name, t| {
                sizes.insert(name.to_string(), t.len() * t.dtype().size().max(1));
            },
        )?;
        self.full_executions += self.observed_nodes();
        let peak = self
            .interp
            .peak_value_bytes(&|name| sizes.get(name).copied().unwrap_or(0));
        Ok((sizes.values().sum(), peak))
    }

    /// One plain FP32 inference on the first input set, outside the cache, after
    /// [`reference_outputs`](Self::reference_outputs): what the search's time is a multiple
    /// of ([`super::report::time_warm_inference`]: the fastest of a few runs, and the time
    /// they took). The reference run is no measure of it: a first run makes its one-time work
    /// (packed weights, epilogues) and fills the cache.
    pub fn time_fp32_inference(&self) -> Result<(f64, std::time::Duration)> {
        let mut cache = ValueCache::new(0);
        super::report::time_warm_inference(|| {
            run_set(
                self.interp,
                &self.feeds[0],
                0,
                None,
                &mut cache,
                self.decode,
            )
            .map(drop)
        })
    }

    /// Runs the FP32 reference on every input set (seeding the cache) and returns its outputs.
    pub fn reference_outputs(&mut self) -> Result<Vec<Golden>> {
        let mut all = Vec::with_capacity(self.feeds.len());
        for (k, f) in self.feeds.iter().enumerate() {
            let outputs = run_set(self.interp, f, k as u64, None, &mut self.cache, self.decode)?;
            self.full_executions += self.nodes() * self.runs_per_set();
            all.push(outputs);
        }
        Ok(all)
    }

    /// Sets the outputs candidates are compared with: one set per input set, or a single set
    /// that serves every input set.
    pub fn set_golden(&mut self, golden: Vec<Golden>) -> Result<()> {
        if golden.is_empty() {
            return Err(Error::Invalid("no golden outputs".into()));
        }
        if golden.len() != 1 && golden.len() < self.feeds.len() {
            return Err(Error::Invalid(format!(
                "the golden outputs hold {} iterations but there are {} input sets",
                golden.len(),
                self.feeds.len()
            )));
        }
        self.golden = golden;
        Ok(())
    }

    /// The plan with `marked` layers in the high precision.
    pub fn plan_for(&self, marked: &[usize]) -> PrecisionPlan {
        self.low.marking(marked, self.high)
    }

    /// The prepared plan with `marked` layers in high precision, composed from the low and
    /// all-high plans (weights are converted once per search, not once per candidate).
    fn prepared_for(&mut self, marked: &[usize]) -> Result<PreparedPlan> {
        if self.prepared.is_none() {
            let low = self.prepare(&self.low)?;
            // Same regions and fusion model as the low plan: composing needs them equal.
            let mut all_high = PrecisionPlan::uniform(self.interp.graph(), self.high);
            all_high.regions = self.low.regions.clone();
            all_high.fusion = self.low.fusion;
            let high = self.prepare(&all_high)?;
            self.prepared = Some((low, high));
        }
        let (low, high) = self.prepared.as_ref().expect("prepared above");
        low.with_layers_of(high, marked)
    }

    /// `plan` (any precision per layer) prepared by composing plans of one precision each,
    /// prepared once per search (weights converted once per precision, not per candidate).
    /// The plan's regions and fusion model must be the low plan's.
    fn prepared_assignment(&mut self, plan: &PrecisionPlan) -> Result<PreparedPlan> {
        // The composition starts from plans under the low plan's fusion model and regions: a
        // plan under another would be judged under the wrong one.
        if plan.fusion != self.low.fusion || plan.regions != self.low.regions {
            return Err(Error::Invalid(format!(
                "a plan under fusion model '{}' judged by a search under '{}' (with its regions)",
                plan.fusion, self.low.fusion
            )));
        }
        let mut by_precision: BTreeMap<Precision, Vec<usize>> = BTreeMap::new();
        for (i, &p) in plan.layers.iter().enumerate() {
            if p != self.high {
                by_precision.entry(p).or_default().push(i);
            }
        }
        let mut composed = self.uniform_prepared(self.high)?.clone();
        for (p, layers) in by_precision {
            composed = composed.with_layers_of(self.uniform_prepared(p)?, &layers)?;
        }
        Ok(composed)
    }

    /// The plan with every layer in `p` (the low plan's regions and fusion model), prepared
    /// on first use.
    fn uniform_prepared(&mut self, p: Precision) -> Result<&PreparedPlan> {
        if !self.uniform.contains_key(&p) {
            let mut plan = PrecisionPlan::uniform(self.interp.graph(), p);
            plan.regions = self.low.regions.clone();
            plan.fusion = self.low.fusion;
            let prepared = self.prepare(&plan)?;
            self.uniform.insert(p, prepared);
        }
        Ok(&self.uniform[&p])
    }

    /// Judges whole plans (one precision per layer, e.g. the per-layer formats of `mixprec
    /// plan`) through the cache, `--jobs` at a time as [`Oracle::evaluate_batch`] does; each
    /// counts as an evaluation.
    pub fn evaluate_plans(&mut self, plans: &[PrecisionPlan]) -> Vec<Result<Evaluation>> {
        if let Err(e) = self.check_golden() {
            return plans.iter().map(|_| Err(clone_error(&e))).collect();
        }
        let prepared: Vec<Result<PreparedPlan>> =
            plans.iter().map(|p| self.prepared_assignment(p)).collect();
        let verdicts = self.judge_prepared(prepared);
        self.evaluations += verdicts.iter().filter(|v| v.is_ok()).count();
        verdicts
    }

    /// `plan` judged outside the value cache (every layer run again): what re-verifies an
    /// answer the cache helped find; one evaluation.
    pub fn evaluate_plan_uncached(&mut self, plan: &PrecisionPlan) -> Result<Evaluation> {
        self.check_golden()?;
        let prepared = self.prepared_assignment(plan)?;
        let judge = Judge {
            interp: self.interp,
            feeds: self.feeds,
            golden: &self.golden,
            criterion: &self.criterion,
            user: self.user.as_ref(),
            decode: self.decode,
        };
        let (e, sets) = judge.judge(&prepared, &mut ValueCache::new(0))?;
        self.full_executions += sets * self.nodes() * self.runs_per_set();
        self.evaluations += 1;
        Ok(e)
    }

    fn prepare(&self, plan: &PrecisionPlan) -> Result<PreparedPlan> {
        PreparedPlan::new(
            self.interp.graph(),
            plan,
            &PlanOptions {
                accumulate: self.accumulate,
                amax: self.amax,
                input_shapes: Some(&crate::exec::feed_shapes(&self.feeds[0])),
            },
        )
    }

    /// What the search runs over: the compute layers whose low precision differs from the high
    /// one, their FLOPs (known after [`reference_outputs`](Self::reference_outputs)) and, with
    /// a `ranking`, their scores under it ([`sensitivity`](Self::sensitivity) needs the golden
    /// outputs set).
    pub fn search_space(&mut self, ranking: Option<Ranking>) -> Result<super::SearchSpace> {
        let graph = self.interp.graph();
        let candidates = self.candidates();
        let flops: Vec<u64> = (0..graph.nodes.len())
            .map(|i| self.cache.layer_flops.get(&i).copied().unwrap_or(0))
            .collect();
        let scores = match ranking {
            Some(Ranking::Sensitivity) => self.sensitivity(&candidates)?,
            Some(Ranking::Growth) => self.growth()?.into(),
            None => Scores::default(),
        };
        Ok(super::SearchSpace {
            candidates,
            flops,
            scores,
            deferred: false,
        })
    }

    /// [`search_space`](Self::search_space) with the ranking deferred: the search asks for it
    /// ([`Oracle::rank`], also through a `--check` search: [`RankedBy`]) once both reference
    /// checks leave something to search, so a search that needs no layer, or whose reference
    /// fails, costs no ranking (the sensitivity ranking's N runs were most of a task-level
    /// search that needs nothing: PP-OCRv4 rec 2.1 s).
    pub fn deferred_search_space(
        &mut self,
        ranking: Option<Ranking>,
    ) -> Result<super::SearchSpace> {
        let mut space = self.search_space(None)?;
        space.deferred = ranking.is_some();
        self.deferred = ranking;
        Ok(space)
    }

    /// The compute layers whose low precision differs from the high one, in topological order.
    fn candidates(&self) -> Vec<usize> {
        PrecisionPlan::candidates(self.interp.graph())
            .into_iter()
            .filter(|&i| self.low.layers[i] != self.high)
            .collect()
    }

    /// The plan with `marked` in high precision, judged through the cache (what an evaluation
    /// and a sensitivity ranking run do; the caller counts which it was).
    fn judge_marked(&mut self, marked: &[usize]) -> Result<Evaluation> {
        let prepared = self.prepared_for(marked)?;
        let judge = Judge {
            interp: self.interp,
            feeds: self.feeds,
            golden: &self.golden,
            criterion: &self.criterion,
            user: self.user.as_ref(),
            decode: self.decode,
        };
        let (e, sets) = judge.judge(&prepared, &mut self.cache)?;
        self.full_executions += sets * self.nodes() * self.runs_per_set();
        Ok(e)
    }

    /// Judges every candidate (and every sensitivity ranking run) by `user` instead of the
    /// criterion.
    pub fn judging_by(&mut self, user: Option<UserCriterion>) {
        self.user = user;
    }

    /// Makes the sensitivity ranking's runs `jobs` at a time (`--jobs`; the scores are the
    /// same for any number).
    pub fn ranking_in_jobs(&mut self, jobs: usize) {
        self.ranking_jobs = jobs.max(1);
    }

    /// Cuts a sensitivity ranking short when `stop` is set.
    pub fn stopping_on(&mut self, stop: &'a AtomicBool) {
        self.stop = Some(stop);
    }

    /// What [`Oracle::rank`] answers: the deferred ranking's scores.
    fn deferred_scores(&mut self) -> Result<Scores> {
        match self.deferred.take() {
            Some(Ranking::Sensitivity) => self.sensitivity(&self.candidates()),
            Some(Ranking::Growth) => Ok(self.growth()?.into()),
            None => Err(Error::Invalid(
                "the search asked for a ranking its space did not defer".into(),
            )),
        }
    }

    /// The layer-wise comparison of the plan with `marked` layers in high precision against
    /// the FP32 reference, on the first input set (for reports).
    pub fn layer_errors(
        &mut self,
        marked: &[usize],
    ) -> Result<Vec<crate::compare::layerwise::LayerError>> {
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let prepared = self.prepared_for(marked)?;
        let f = &self.feeds[0];
        let r = self.interp.run_cached(f, 0, &keep, None, &mut self.cache)?;
        let c = self
            .interp
            .run_cached(f, 0, &keep, Some(&prepared), &mut self.cache)?;
        Ok(crate::compare::layerwise::layerwise(
            self.interp.graph(),
            &r.intermediates,
            &c.intermediates,
            &self.criterion,
            Some(&prepared),
            false,
        ))
    }

    /// Why each layer of an answer must run in high precision: the row of layer `i` in the
    /// plan with every other layer of `marked` in high precision and `i` in its low
    /// precision (the counterfactual the search rejected), on the first input set.
    ///
    /// A row reads only the layer's inputs and outputs, so only those values are kept, and
    /// each counterfactual run stops after layer `i`: its upstream equals the answer's plan
    /// and comes from the cache. (Whole runs keeping every value made this the bulk of a
    /// search with a large answer: PP-OCRv4 rec, 173 layers, 5 s and 300 MB after a 0.4 s
    /// search.)
    pub fn answer_reasons(
        &mut self,
        marked: &[usize],
    ) -> Result<Vec<crate::compare::layerwise::LayerError>> {
        let graph = self.interp.graph();
        let f = &self.feeds[0];
        let values_of = |i: usize| -> HashSet<&str> {
            let node = &graph.nodes[i];
            node.inputs
                .iter()
                .chain(&node.outputs)
                .map(String::as_str)
                .filter(|n| !n.is_empty())
                .collect()
        };
        // The observer sees the graph inputs and every value up to the stop.
        let all: HashSet<&str> = marked.iter().flat_map(|&i| values_of(i)).collect();
        let mut r = HashMap::new();
        self.interp
            .run_cached_observed(f, 0, None, &mut self.cache, &mut |name, t| {
                if all.contains(name) {
                    r.insert(name.to_string(), t.clone());
                }
            })?;
        let mut rows = Vec::with_capacity(marked.len());
        for &i in marked {
            let others: Vec<usize> = marked.iter().copied().filter(|&j| j != i).collect();
            let prepared = self.prepared_for(&others)?;
            let names = values_of(i);
            let mut c = HashMap::new();
            self.interp.run_cached_until(
                f,
                0,
                Some(&prepared),
                &mut self.cache,
                i,
                &mut |name, t| {
                    if names.contains(name) {
                        c.insert(name.to_string(), t.clone());
                    }
                },
            )?;
            if let Some(row) = crate::compare::layerwise::layer_row(
                graph,
                i,
                &r,
                &c,
                &self.criterion,
                Some(&prepared),
            ) {
                rows.push(row);
            }
        }
        Ok(rows)
    }

    /// The [`Ranking::Sensitivity`] score of every candidate: the plan with it alone in its
    /// low precision and every other candidate in the high one, judged under the criterion as
    /// an evaluation is — the tolerance its outputs need ([`Evaluation::error`]; infinite
    /// where unknown, as for NaN outputs). Such a plan differs from the all-high one only from
    /// that layer on, so its run takes the rest from the cache (the reference run's values,
    /// within the budget). These runs are not evaluations of the search: they rank, and their
    /// verdicts are not taken as answers ([`ranking_runs`](Self::ranking_runs) counts them);
    /// the candidates whose run failed tell the search where to start galloping
    /// ([`Scores::failing_alone`]).
    /// YOLOv8n's strict search needed 32 evaluations on the growth ranking, whose 146th layer
    /// was needed (its error reaches the outputs through a cancellation and the stride Mul),
    /// and 9 on this one; PP-OCRv4 rec's 614 (31 layers) and 3 (1 layer).
    pub fn sensitivity(&mut self, candidates: &[usize]) -> Result<Scores> {
        self.check_golden()?;
        let mut scores = Scores::default();
        for chunk in candidates.chunks(self.ranking_jobs) {
            if self
                .stop
                .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst))
            {
                // Interrupted: the rest rank last; the search stops before its next evaluation.
                break;
            }
            let plans: Vec<Vec<usize>> = chunk
                .iter()
                .map(|&layer| candidates.iter().copied().filter(|&c| c != layer).collect())
                .collect();
            for (&layer, verdict) in chunk.iter().zip(self.judge_batch(&plans)) {
                let e = verdict?;
                self.ranking_runs += 1;
                scores.by_layer.insert(
                    layer,
                    if e.error.is_nan() {
                        f64::INFINITY
                    } else {
                        e.error
                    },
                );
                if !e.passed {
                    scores.failing_alone.push(layer);
                }
            }
        }
        Ok(scores)
    }

    /// The error growth of every layer in the all-low plan against the FP32 reference (the
    /// largest over input sets): what worst-first and minimal rank by. The error of a value is
    /// relative (mean |low − ref| over mean |ref|), so that a layer that only rescales its
    /// input does not look like it adds error; see [`relative_growth`].
    ///
    /// Memory stays bounded and the ranking complete: the reference values are compared in
    /// windows of at most the cache budget (at least [`RANKING_WINDOW_MIN`]), in execution
    /// order: a pass keeps the reference values of one window, then runs the low plan up to
    /// the window's last layer, comparing each value as it appears and dropping its reference.
    /// A model whose values fit in the budget (the automatic budget is sized so) takes one
    /// pass; a smaller budget takes more passes (more runs), never a shorter ranking.
    pub fn growth(&mut self) -> Result<HashMap<usize, f64>> {
        self.growth_in_windows(self.cache.budget().max(RANKING_WINDOW_MIN))
    }

    /// [`growth`](Self::growth) comparing at most `window` bytes of reference values at once.
    fn growth_in_windows(&mut self, window: usize) -> Result<HashMap<usize, f64>> {
        let prepared = self.prepared_for(&[])?;
        let graph = self.interp.graph();
        let values = graph.values();
        let mut growth: HashMap<usize, f64> = HashMap::new();
        for (k, f) in self.feeds.iter().enumerate() {
            let mut err: HashMap<String, f64> = HashMap::new();
            // Ordinal (among observed float values) of the first value this pass keeps.
            let mut start = 0usize;
            loop {
                let mut refs: HashMap<String, Tensor> = HashMap::new();
                let mut bytes = 0usize;
                let mut ordinal = 0usize;
                let mut next: Option<usize> = None;
                let mut last_node: Option<usize> = None;
                self.interp.run_cached_observed(
                    f,
                    k as u64,
                    None,
                    &mut self.cache,
                    &mut |name, t| {
                        if !t.dtype().is_float() {
                            return;
                        }
                        let at = ordinal;
                        ordinal += 1;
                        if at < start || next.is_some() {
                            return;
                        }
                        let size = t.len() * t.dtype().size();
                        // The first value of a pass is kept even alone above the window.
                        if bytes + size > window && !refs.is_empty() {
                            next = Some(at);
                            return;
                        }
                        bytes += size;
                        refs.insert(name.to_string(), t.clone());
                        if let Some(i) = values.producer_node(name) {
                            last_node = Some(last_node.map_or(i, |l: usize| l.max(i)));
                        }
                    },
                )?;
                self.full_executions += self.observed_nodes();
                let mut compare = |name: &str, t: &Tensor| {
                    // Each value appears once: its reference goes as soon as it is compared.
                    if let Some(e) = refs.remove(name).and_then(|r| relative_error(&r, t)) {
                        err.insert(name.to_string(), e);
                    }
                };
                match (next, last_node) {
                    // More windows follow: nothing past this one's last layer is needed.
                    (Some(_), Some(last)) => self.interp.run_cached_until(
                        f,
                        k as u64,
                        Some(&prepared),
                        &mut self.cache,
                        last,
                        &mut compare,
                    )?,
                    _ => {
                        self.interp.run_cached_observed(
                            f,
                            k as u64,
                            Some(&prepared),
                            &mut self.cache,
                            &mut compare,
                        )?;
                    }
                }
                self.full_executions += self.observed_nodes();
                match next {
                    Some(n) => start = n,
                    None => break,
                }
            }
            for (i, g) in relative_growth(graph, &err) {
                let e = growth.entry(i).or_insert(f64::NEG_INFINITY);
                if g > *e {
                    *e = g;
                }
            }
        }
        Ok(growth)
    }
}

/// The smallest window of reference values the ranking compares at once (see
/// [`BuiltinOracle::growth`]): below it, passes would multiply for little memory saved.
pub const RANKING_WINDOW_MIN: usize = 16 << 20;

/// Mean absolute difference over mean absolute reference value; infinite when the candidate
/// is NaN or infinite where the reference is finite. None for non-float or mismatched values.
pub fn relative_error(reference: &Tensor, candidate: &Tensor) -> Option<f64> {
    if !reference.dtype().is_float() || reference.shape() != candidate.shape() {
        return None;
    }
    let (r, c) = (reference.to_f64_vec()?, candidate.to_f64_vec()?);
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (x, y) in c.iter().zip(&r) {
        if !y.is_finite() {
            continue;
        }
        if !x.is_finite() {
            return Some(f64::INFINITY);
        }
        num += (x - y).abs();
        den += y.abs();
    }
    Some(if num == 0.0 {
        0.0
    } else if den == 0.0 {
        f64::INFINITY
    } else {
        num / den
    })
}

/// Per layer (node index): its output's relative error minus the largest relative error among
/// its inputs (graph inputs and weights count as exact). A layer whose output is infinitely
/// wrong (overflow, NaN) ranks as infinite even when its input already was: layers that read an
/// overflowed value and keep it overflowed (the consumer of an overflowing layer rounds its
/// input again) are usually part of the fix; ties keep topological order, so the source of an
/// overflow ranks first and its direct consumers next.
/// `err` holds the relative error of every value compared (by name).
pub fn relative_growth(graph: &crate::Graph, err: &HashMap<String, f64>) -> Vec<(usize, f64)> {
    let mut out = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let mut worst: Option<f64> = None;
        for o in node.outputs.iter().filter(|o| !o.is_empty()) {
            if let Some(&e) = err.get(o.as_str()) {
                worst = Some(worst.map_or(e, |w: f64| w.max(e)));
            }
        }
        let Some(e) = worst else { continue };
        let input = node
            .inputs
            .iter()
            .filter_map(|n| err.get(n.as_str()).copied())
            .fold(0.0f64, f64::max);
        out.push((i, if e.is_infinite() { e } else { e - input }));
    }
    out
}

/// A user's pass criterion over whole outputs (the Python API's `criterion=`): every input
/// set's outputs and the golden outputs they are judged against in, pass or fail out. It
/// decides each verdict; the built-in comparison still measures the error a trial reports and
/// the sensitivity ranking scores by.
#[derive(Clone)]
pub struct UserCriterion(pub Arc<UserCriterionFn>);

/// What a [`UserCriterion`] calls: (the candidate's outputs per input set, the golden outputs
/// per input set) → passed.
pub type UserCriterionFn = dyn Fn(Vec<Golden>, &[&Golden]) -> Result<bool> + Send + Sync;

impl std::fmt::Debug for UserCriterion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserCriterion(..)")
    }
}

/// Judges a candidate on `sets` input sets, `run(k)` giving set k's outputs; returns the
/// verdict and the sets run. Under the built-in criterion the first failing set ends it (the
/// rest cannot make it pass); a user criterion sees every set's outputs at once.
pub(crate) fn judge_sets(
    sets: usize,
    golden: &[Golden],
    criterion: &Criterion,
    user: Option<&UserCriterion>,
    decoded: bool,
    mut run: impl FnMut(usize) -> Result<Golden>,
) -> Result<(Evaluation, u64)> {
    let golden_of = |k: usize| &golden[k.min(golden.len() - 1)];
    let mut verdict = if decoded {
        Verdict::decoded()
    } else {
        Verdict::new()
    };
    let mut ran = 0;
    let mut outputs = Vec::new();
    for k in 0..sets {
        let out = run(k)?;
        ran += 1;
        let passing = verdict.add(&out, golden_of(k), criterion)?;
        if user.is_some() {
            outputs.push(out);
        } else if !passing {
            break;
        }
    }
    let mut e = verdict.finish();
    if let Some(u) = user {
        let golden: Vec<&Golden> = (0..sets).map(golden_of).collect();
        let passed = (u.0)(outputs, &golden)?;
        e.summary = format!(
            "criterion {} | {}",
            if passed { "passed" } else { "failed" },
            e.summary
        );
        e.passed = passed;
    }
    Ok((e, ran))
}

/// What judging a candidate reads, shared by the evaluations of a batch.
struct Judge<'j> {
    interp: &'j Interpreter<'j>,
    feeds: &'j [Feeds],
    golden: &'j [Golden],
    criterion: &'j Criterion,
    user: Option<&'j UserCriterion>,
    decode: Option<&'j Decoder>,
}

/// The outputs of input set `key` (`feeds`) under `plan`, its values through `cache`; with
/// `decode`, the generation from it (its first step through the cache, the next ones
/// outside: their feeds come from the candidate's own outputs).
fn run_set(
    interp: &Interpreter<'_>,
    feeds: &Feeds,
    key: u64,
    plan: Option<&PreparedPlan>,
    cache: &mut ValueCache,
    decode: Option<&Decoder>,
) -> Result<Golden> {
    let opts = RunOptions::default();
    let Some(d) = decode else {
        return Ok(interp.run_cached(feeds, key, &opts, plan, cache)?.outputs);
    };
    d.generate(feeds.clone(), &mut |step, f| {
        let r = match (step, plan) {
            (0, _) => interp.run_cached(f, key, &opts, plan, cache)?,
            (_, Some(p)) => interp.run_plan(f, &opts, p)?,
            (_, None) => interp.run_with(f, &opts)?,
        };
        Ok(r.outputs)
    })
}

impl Judge<'_> {
    /// Runs `prepared` on the input sets (until the verdict is known) through `cache`;
    /// returns the verdict and the input sets run.
    fn judge(&self, prepared: &PreparedPlan, cache: &mut ValueCache) -> Result<(Evaluation, u64)> {
        judge_sets(
            self.feeds.len(),
            self.golden,
            self.criterion,
            self.user,
            self.decode.is_some(),
            |k| {
                run_set(
                    self.interp,
                    &self.feeds[k],
                    k as u64,
                    Some(prepared),
                    cache,
                    self.decode,
                )
            },
        )
    }
}

impl BuiltinOracle<'_> {
    fn check_golden(&self) -> Result<()> {
        if self.golden.is_empty() {
            return Err(Error::Invalid(
                "no golden outputs were set for the search".into(),
            ));
        }
        Ok(())
    }

    /// The plans with `sets` marked, judged at the same time on the thread pool: the first
    /// through the search's cache, the others each through a [`fork`](ValueCache::fork) of it
    /// whose new values join the cache afterwards (one set: as [`judge_marked`]). Verdicts do
    /// not depend on the cache (a cached value has the bits a run would compute). The caller
    /// counts what they were.
    ///
    /// [`judge_marked`]: BuiltinOracle::judge_marked
    fn judge_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        if sets.len() < 2 {
            return sets.iter().map(|s| self.judge_marked(s)).collect();
        }
        let prepared: Vec<Result<PreparedPlan>> =
            sets.iter().map(|s| self.prepared_for(s)).collect();
        self.judge_prepared(prepared)
    }

    /// [`judge_batch`](Self::judge_batch) over plans already prepared.
    fn judge_prepared(&mut self, prepared: Vec<Result<PreparedPlan>>) -> Vec<Result<Evaluation>> {
        let n = prepared.len();
        if n == 1 {
            // On the calling thread, as one evaluation runs (worker 0 of the kernels' pool).
            let judge = Judge {
                interp: self.interp,
                feeds: self.feeds,
                golden: &self.golden,
                criterion: &self.criterion,
                user: self.user.as_ref(),
                decode: self.decode,
            };
            let nodes = self.nodes() * self.runs_per_set();
            let verdict = match &prepared[0] {
                Ok(p) => judge.judge(p, &mut self.cache),
                Err(e) => Err(clone_error(e)),
            };
            return vec![verdict.map(|(e, sets)| {
                self.full_executions += sets * nodes;
                e
            })];
        }
        let mut forks: Vec<ValueCache> = (1..n).map(|_| self.cache.fork()).collect();
        let judge = Judge {
            interp: self.interp,
            feeds: self.feeds,
            golden: &self.golden,
            criterion: &self.criterion,
            user: self.user.as_ref(),
            decode: self.decode,
        };
        let mut verdicts: Vec<Option<Result<(Evaluation, u64)>>> = (0..n).map(|_| None).collect();
        let caches = std::iter::once(&mut self.cache).chain(forks.iter_mut());
        rayon::scope(|scope| {
            for ((slot, plan), cache) in verdicts.iter_mut().zip(&prepared).zip(caches) {
                let judge = &judge;
                scope.spawn(move |_| {
                    *slot = Some(match plan {
                        Ok(p) => judge.judge(p, cache),
                        Err(e) => Err(clone_error(e)),
                    });
                });
            }
        });
        for fork in forks {
            self.cache.absorb(fork);
        }
        let nodes = self.nodes() * self.runs_per_set();
        verdicts
            .into_iter()
            .map(|v| {
                let (e, sets) = v.expect("every spawned evaluation ran")?;
                self.full_executions += sets * nodes;
                Ok(e)
            })
            .collect()
    }
}

impl Oracle for BuiltinOracle<'_> {
    fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
        self.check_golden()?;
        self.evaluations += 1;
        self.judge_marked(marked)
    }

    /// The sets run at the same time ([`judge_batch`](BuiltinOracle::judge_batch)).
    fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        if let Err(e) = self.check_golden() {
            return sets.iter().map(|_| Err(clone_error(&e))).collect();
        }
        let verdicts = self.judge_batch(sets);
        self.evaluations += verdicts.iter().filter(|v| v.is_ok()).count();
        verdicts
    }

    fn parallel(&self) -> bool {
        true
    }

    fn rank(&mut self) -> Result<Scores> {
        self.deferred_scores()
    }
}

/// A search oracle whose deferred ranking comes from the emulation: a `--check` search judges
/// candidates by the user's command and ranks them in the built-in oracle.
pub struct RankedBy<'o> {
    pub judge: &'o mut dyn Oracle,
    /// The space's own oracle.
    pub ranker: &'o mut dyn Oracle,
    /// Whether `judge` decides as `ranker` does (the same emulation and criterion run
    /// elsewhere: [`super::remote::RemoteOracle`]): the ranking's verdicts then pass on, as
    /// they would without it; else (a `--check` command) only its scores do.
    pub same_criterion: bool,
}

impl Oracle for RankedBy<'_> {
    fn evaluate(&mut self, marked: &[usize]) -> Result<Evaluation> {
        self.judge.evaluate(marked)
    }

    fn evaluate_batch(&mut self, sets: &[Vec<usize>]) -> Vec<Result<Evaluation>> {
        self.judge.evaluate_batch(sets)
    }

    fn evaluate_batch_each(
        &mut self,
        sets: &[Vec<usize>],
        done: &mut dyn FnMut(usize, &Result<Evaluation>),
    ) -> Vec<Result<Evaluation>> {
        self.judge.evaluate_batch_each(sets, done)
    }

    fn parallel(&self) -> bool {
        self.judge.parallel()
    }

    fn rank(&mut self) -> Result<Scores> {
        // The emulation's verdicts are under the built-in criterion, not the user's command:
        // they rank, but say nothing about which plans the command fails.
        let mut scores = self.ranker.rank()?;
        if !self.same_criterion {
            scores.failing_alone.clear();
        }
        Ok(scores)
    }
}

/// The same error again (errors are not `Clone`: they may hold an I/O error).
fn clone_error(e: &Error) -> Error {
    Error::Invalid(e.to_string())
}

/// What an output counts for in a [`Verdict`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Its check decides, and its error is reported.
    Judged,
    /// Its error is reported (and ranks), its check does not decide.
    Measured,
    /// Its check decides; its numeric error means nothing (token ids).
    Ids,
}

/// The verdict on one candidate, built up over its input sets: every golden output compared
/// under the criterion, the worst one described.
pub struct Verdict {
    passed: bool,
    /// The worst output: (required atol, line describing it).
    worst: (f64, String),
    failing_metrics: Vec<String>,
    /// The outputs are a generation's (`--decode`): tokens, and logits judged step by step
    /// when the criterion names them ([`crate::decode::judges_logits`]).
    decoded: bool,
}

impl Default for Verdict {
    fn default() -> Self {
        Verdict::new()
    }
}

impl Verdict {
    pub fn new() -> Verdict {
        Verdict {
            passed: true,
            worst: (f64::NEG_INFINITY, String::new()),
            failing_metrics: Vec::new(),
            decoded: false,
        }
    }

    /// The verdict on generations (`--decode`).
    pub fn decoded() -> Verdict {
        Verdict {
            decoded: true,
            ..Verdict::new()
        }
    }

    /// Compares the outputs of one input set with its golden outputs; returns whether the
    /// candidate still passes.
    pub fn add(
        &mut self,
        outputs: &[(String, Tensor)],
        golden: &Golden,
        criterion: &Criterion,
    ) -> Result<bool> {
        for (name, reference) in golden {
            let out = outputs
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t)
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "golden output '{name}' is not an output of the model"
                    ))
                })?;
            if !self.decoded {
                self.add_output(
                    name,
                    &format!("'{name}'"),
                    out,
                    reference,
                    criterion,
                    Role::Judged,
                )?;
            } else if name == crate::decode::LOGITS {
                // Measured even when not judged: the error the trials report and the
                // sensitivity ranking scores by.
                let role = if crate::decode::judges_logits(criterion) {
                    Role::Judged
                } else {
                    Role::Measured
                };
                let steps = |t: &Tensor| {
                    crate::decode::logit_steps(t).ok_or_else(|| {
                        Error::Invalid(format!(
                            "'{name}' of a generation must be [batch, steps, vocab], not {}",
                            crate::tensor::fmt_shape(t.shape())
                        ))
                    })
                };
                let (outs, refs) = (steps(out)?, steps(reference)?);
                if outs.len() != refs.len() {
                    return Err(Error::Invalid(format!(
                        "'{name}': the generation has {} steps, the reference {}",
                        outs.len(),
                        refs.len()
                    )));
                }
                for (k, (o, r)) in outs.iter().zip(&refs).enumerate() {
                    self.add_output(name, &format!("'{name}' step {k}"), o, r, criterion, role)?;
                }
            } else {
                self.add_output(
                    name,
                    &format!("'{name}'"),
                    out,
                    reference,
                    criterion,
                    Role::Ids,
                )?;
            }
        }
        Ok(self.passed)
    }

    fn add_output(
        &mut self,
        name: &str,
        label: &str,
        out: &Tensor,
        reference: &Tensor,
        criterion: &Criterion,
        role: Role,
    ) -> Result<()> {
        let c = check_output(name, out, reference, criterion)?;
        if role != Role::Measured {
            self.passed &= c.passed;
            for m in c.metrics.iter().filter(|m| !m.passed) {
                self.failing_metrics.push(format!("{label} {}", m.line()));
            }
        }
        if role == Role::Ids {
            if !c.passed && c.metrics.iter().all(|m| m.passed) {
                let (a, b) = (out.to_f64_vec(), reference.to_f64_vec());
                let same = a
                    .zip(b)
                    .map_or(0.0, |(a, b)| crate::compare::metrics::agreement(&a, &b));
                self.failing_metrics.push(format!(
                    "{label} {} of {} equal",
                    (same * out.len() as f64).round(),
                    out.len()
                ));
            }
            return Ok(());
        }
        let e = if c.required_atol.is_nan() {
            f64::INFINITY
        } else {
            c.required_atol
        };
        if e > self.worst.0 || self.worst.1.is_empty() {
            let judged = if role == Role::Measured {
                " (not judged)"
            } else {
                ""
            };
            self.worst = (
                e,
                format!(
                    "{label}{judged} {} error needs atol {} (have {}) or rtol {} (have {})",
                    c.stat.name(),
                    fmt_g(c.required_atol, 5),
                    fmt_g(c.atol, 5),
                    fmt_g(c.required_rtol, 5),
                    fmt_g(c.rtol, 5)
                ),
            );
        }
        Ok(())
    }

    pub fn finish(self) -> Evaluation {
        let mut summary = self.worst.1;
        if !self.failing_metrics.is_empty() {
            summary.push_str("; failing: ");
            summary.push_str(&self.failing_metrics.join("; "));
        }
        Evaluation {
            passed: self.passed,
            error: self.worst.0,
            summary,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::testing::{graph, node, vi};

    /// x → Relu → ×1000 → ×0.0013 → + x → Tanh: the product overflows float16 for x ≈ 70.
    fn overflow_chain() -> crate::Graph {
        graph(
            vec![
                node("relu", "Relu", &["x"], &["r"]),
                node("mul_big", "Mul", &["r", "big"], &["m"]),
                node("mul_small", "Mul", &["m", "small"], &["s"]),
                node("add", "Add", &["s", "x"], &["a"]),
                node("tanh", "Tanh", &["a"], &["y"]),
            ],
            vec![vi("x", &[6])],
            vec![vi("y", &[6])],
            vec![
                ("big", Tensor::from_f32(vec![1], vec![1000.0])),
                ("small", Tensor::from_f32(vec![1], vec![0.0013])),
            ],
        )
    }

    /// The oracle of a float16 search (float32 marked layers, a 1 MiB cache) with its golden
    /// outputs from its own FP32 reference run.
    fn fp16_oracle<'a>(
        interp: &'a Interpreter<'a>,
        feeds: &'a [Feeds],
        criterion: Criterion,
    ) -> BuiltinOracle<'a> {
        let mut oracle = BuiltinOracle::new(
            interp,
            feeds,
            criterion,
            PrecisionPlan::uniform(interp.graph(), Precision::Float16),
            Precision::Float32,
            Accumulator::F32,
            None,
            ValueCache::new(1 << 20),
        )
        .unwrap();
        let golden = oracle.reference_outputs().unwrap();
        oracle.set_golden(golden).unwrap();
        oracle
    }

    /// The partial runs of `answer_reasons` (only the layer's values, stopping after it) give
    /// the rows that whole runs keeping every value give: the same errors, growth and cause,
    /// for layers fed by the graph input, by an initializer and by other marked layers.
    #[test]
    fn answer_reasons_from_partial_runs_equal_whole_runs() {
        let g = overflow_chain();
        let interp = Interpreter::new(&g).unwrap();
        let mut feeds = Feeds::new();
        let x = vec![70.0, -3.3, 71.0, 0.1234, 72.0, 5.678];
        feeds.insert("x".into(), Tensor::from_f32(vec![6], x));
        let feeds = vec![feeds];
        let criterion = Criterion {
            atol: crate::compare::PerOutput::new(1e-4),
            rtol: crate::compare::PerOutput::new(1e-4),
            ..Default::default()
        };
        let mut oracle = fp16_oracle(&interp, &feeds, criterion.clone());
        let marked = [0, 1, 2, 3, 4];
        oracle.evaluate(&marked).unwrap();
        let got = oracle.answer_reasons(&marked).unwrap();
        // Whole runs, every value kept.
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let r = interp.run_with(&feeds[0], &keep).unwrap();
        let mut want = Vec::new();
        for &i in &marked {
            let others: Vec<usize> = marked.iter().copied().filter(|&j| j != i).collect();
            let prepared = oracle.prepared_for(&others).unwrap();
            let c = interp.run_plan(&feeds[0], &keep, &prepared).unwrap();
            want.extend(crate::compare::layerwise::layer_row(
                &g,
                i,
                &r.intermediates,
                &c.intermediates,
                &criterion,
                Some(&prepared),
            ));
        }
        assert_eq!(got.len(), marked.len());
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
    }

    /// The ranking in small windows (one value per pass, a few values per pass) equals the
    /// ranking in one pass, bit for bit, over two input sets; the value sizes give a plain
    /// run's peak as its liveness says.
    #[test]
    fn the_ranking_in_windows_equals_the_ranking_in_one_pass() {
        let g = overflow_chain();
        let interp = Interpreter::new(&g).unwrap();
        let feeds: Vec<Feeds> = [[70.0f32, -3.3, 71.0, 0.1234, 72.0, 5.678], [0.5; 6]]
            .iter()
            .map(|x| {
                let mut f = Feeds::new();
                f.insert("x".into(), Tensor::from_f32(vec![6], x.to_vec()));
                f
            })
            .collect();
        let growth = |window: usize, budget: usize| {
            let mut oracle = BuiltinOracle::new(
                &interp,
                &feeds,
                Criterion::default(),
                PrecisionPlan::uniform(&g, Precision::Float16),
                Precision::Float32,
                Accumulator::F32,
                None,
                ValueCache::new(budget),
            )
            .unwrap();
            oracle.reference_outputs().unwrap();
            let mut g: Vec<(usize, u64)> = oracle
                .growth_in_windows(window)
                .unwrap()
                .into_iter()
                .map(|(i, e)| (i, e.to_bits()))
                .collect();
            g.sort_unstable();
            (g, oracle.full_executions)
        };
        let (whole, runs_whole) = growth(1 << 20, 1 << 20);
        assert_eq!(whole.len(), 5);
        for (window, budget) in [(1, 1 << 20), (30, 0), (60, 1 << 20)] {
            let (parts, runs) = growth(window, budget);
            assert_eq!(parts, whole, "window {window}");
            assert!(runs > runs_whole, "window {window}: {runs} runs");
        }
        // x, r, m, s: 24 bytes each; x is read by add, so x, s and a are alive together.
        let sizes = |_: &str| 24usize;
        assert_eq!(interp.peak_value_bytes(&sizes), 72);
    }

    /// A box decoding in miniature: `a = x + 1000` rounds x's digits away in float16 and
    /// `b = a − 1000` brings the loss to the output; four side branches (`x · 1e-9`, which
    /// float16 flushes to 0: relative error 1) reach the output as nothing. Growth ranks the
    /// side branches first (a's own growth is 2.4e-4); sensitivity ranks a and b first, so
    /// minimal finds them in fewer evaluations. Each sensitivity score is the evaluation of
    /// its candidate alone in low precision.
    #[test]
    fn sensitivity_ranks_by_what_reaches_the_outputs() {
        let mut nodes = vec![
            node("a", "Add", &["x", "k"], &["va"]),
            node("b", "Sub", &["va", "k"], &["vb"]),
        ];
        let mut sum = "vb".to_string();
        for i in 0..4 {
            let (d, s) = (format!("d{i}"), format!("s{i}"));
            nodes.push(node(&d, "Mul", &["x", "tiny"], &[&format!("v{d}")]));
            nodes.push(node(
                &s,
                "Add",
                &[&sum, &format!("v{d}")],
                &[&format!("v{s}")],
            ));
            sum = format!("v{s}");
        }
        nodes.push(node("out", "Identity", &[&sum], &["y"]));
        let g = graph(
            nodes,
            vec![vi("x", &[8])],
            vec![vi("y", &[8])],
            vec![
                ("k", Tensor::from_f32(vec![1], vec![1000.0])),
                ("tiny", Tensor::from_f32(vec![1], vec![1e-9])),
            ],
        );
        let interp = Interpreter::new(&g).unwrap();
        let mut f = Feeds::new();
        let x: Vec<f32> = (0..8).map(|i| 0.1 + 0.1173 * i as f32).collect();
        f.insert("x".into(), Tensor::from_f32(vec![8], x));
        let feeds = vec![f];
        let criterion = Criterion {
            atol: crate::compare::PerOutput::new(1e-3),
            rtol: crate::compare::PerOutput::new(0.0),
            ..Default::default()
        };
        let search = |ranking: Ranking| {
            let mut oracle = fp16_oracle(&interp, &feeds, criterion.clone());
            let space = oracle.search_space(Some(ranking)).unwrap();
            let order = space.ranking(super::super::Objective::Layers);
            if ranking == Ranking::Sensitivity {
                assert_eq!(oracle.ranking_runs, space.candidates.len());
                for &l in &space.candidates {
                    let others: Vec<usize> = space
                        .candidates
                        .iter()
                        .copied()
                        .filter(|&c| c != l)
                        .collect();
                    let e = oracle.evaluate(&others).unwrap();
                    assert_eq!(
                        space.scores.by_layer[&l].to_bits(),
                        e.error.to_bits(),
                        "layer {l}"
                    );
                    assert_eq!(
                        space.scores.failing_alone.contains(&l),
                        !e.passed,
                        "layer {l}"
                    );
                }
                assert!(!space.scores.failing_alone.is_empty());
                // Runs made three at a time (--jobs 3) rank alike, bit for bit.
                let mut in_jobs = fp16_oracle(&interp, &feeds, criterion.clone());
                in_jobs.ranking_in_jobs(3);
                let jobs_space = in_jobs.search_space(Some(ranking)).unwrap();
                assert_eq!(in_jobs.ranking_runs, space.candidates.len());
                assert_eq!(jobs_space.scores.failing_alone, space.scores.failing_alone);
                for (l, g) in &space.scores.by_layer {
                    assert_eq!(jobs_space.scores.by_layer[l].to_bits(), g.to_bits());
                }
                // A --check search ranks in the emulation but is judged by the user's command:
                // the scores pass on, the emulation's verdicts do not.
                let mut judge = fp16_oracle(&interp, &feeds, criterion.clone());
                let mut ranker = fp16_oracle(&interp, &feeds, criterion.clone());
                ranker.deferred_search_space(Some(ranking)).unwrap();
                let mut by_check = RankedBy {
                    judge: &mut judge,
                    ranker: &mut ranker,
                    same_criterion: false,
                };
                let ranked = by_check.rank().unwrap();
                assert_eq!(ranked.by_layer, space.scores.by_layer);
                assert!(ranked.failing_alone.is_empty());
            }
            let opts = super::super::SearchOptions {
                mode: super::super::Mode::Minimal,
                direction: super::super::Direction::Forward,
                objective: super::super::Objective::Layers,
                ranking,
                jobs: 1,
                group: super::super::Grouping::None,
            };
            let stop = std::sync::atomic::AtomicBool::new(false);
            let r = super::super::search(&space, &opts, &mut oracle, &mut |_| {}, &stop).unwrap();
            (order, r)
        };
        let name = |i: usize| g.nodes[i].name.as_str();
        let (growth_order, by_growth) = search(Ranking::Growth);
        let (sens_order, by_sensitivity) = search(Ranking::Sensitivity);
        assert!(growth_order[..4].iter().all(|&i| name(i).starts_with('d')));
        let mut top: Vec<&str> = sens_order[..2].iter().map(|&i| name(i)).collect();
        top.sort_unstable();
        assert_eq!(top, ["a", "b"]);
        for r in [&by_growth, &by_sensitivity] {
            assert_eq!(r.outcome, super::super::Outcome::Found(vec![0, 1]));
        }
        assert!(
            by_sensitivity.trials.len() < by_growth.trials.len(),
            "sensitivity {} evaluations, growth {}",
            by_sensitivity.trials.len(),
            by_growth.trials.len()
        );
    }
}
