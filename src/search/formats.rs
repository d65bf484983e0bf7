//! `mixprec plan`'s candidate space: a format per decision group (fp8, int8, fp16, bf16 or
//! the high precision), priced by a cost model ([`cost`]) and judged by the emulation.
//!
//! An assignment is not a marked set: a candidate is one format per group among several, so
//! the walk below is its own loop over a cost–error front. It judges through the driver's
//! judge, [`super::builtin::BuiltinOracle`] (prepared plans composed per precision, the
//! incremental value cache, `--jobs` forks of it), or remote workers, through [`PlanJudge`].
//! The question that *is* a marked set — from a passing point, which groups must keep their
//! format — is the driver's ([`super::driver::run_search`]) third candidate space
//! ([`descent`]):
//!
//! 1. Sensitivity: every (group, format) alone, the rest in the high precision.
//! 2. The uniform baselines (all fp8, all int8, all fp16): points of the front too.
//! 3. The walk (AIMET AMP's phase 2): from the cheapest assignment (every group in its
//!    cheapest format), raise one group one format at a time — a group whose format failed
//!    alone first, then the best error saved (its sensitivity) per cost added — until a point
//!    costs as much as the cheapest that passed (or, `--full-front`, up to every group in the
//!    high precision). Each point is evaluated under the criterion. A point that the
//!    sensitivities predict to pass (each group's format passed alone) but that fails is
//!    repaired: its worst group (largest error alone) is raised next, and the log says so.
//! 4. The descent from the cheapest point that passed ([`descent`]): the driver's `minimal`
//!    search over the groups that passed alone in a cheaper format.
//! 5. The chosen point is the cheapest that passed; it is evaluated again outside the cache.
//! 6. With a `--check` command ([`check_front`]): the command judges the chosen point and
//!    its neighbours by cost, then safer points until one passes; the chosen point becomes
//!    the cheapest the command passed.

pub mod cost;
mod descent;

use crate::compare::fmt_g;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::ops::{def_of, is_data_movement};
use crate::precision::fusion::FusionModel;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use cost::{Cost, CostInput, CostLayer, CostModel, CostObjective, CostWeight, LayerKind, Source};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};

use super::builtin::BuiltinOracle;
use super::Evaluation;
use descent::Descent;

/// Most pointwise layers one epilogue takes (as the emulation's epilogues).
const MAX_EPILOGUE: usize = 8;

/// Layers that share one format decision: a layer, with the pointwise epilogue TensorRT
/// fuses into a Conv/GEMM, and the GEMMs that read one input (Q/K/V, gate/up projections),
/// as ModelOpt groups them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DecisionGroup {
    /// Node indices, ascending.
    pub layers: Vec<usize>,
    /// Whether it holds a layer with an int8/fp8 kernel (then every format applies).
    pub quantizable: bool,
}

impl DecisionGroup {
    /// The group's name: its first layer's, with how many more it holds.
    pub fn name(&self, graph: &Graph) -> String {
        let first = &graph.nodes[self.layers[0]].name;
        match self.layers.len() {
            1 => first.clone(),
            n => format!("{first} (+{} fused)", n - 1),
        }
    }

    /// The precision of layer `i` of this group when the group is in `format`: an int8/fp8
    /// group's layers without an integer kernel (its epilogue) run in `high`, as the
    /// quantized layer's float32 output feeds them.
    fn layer_precision(
        &self,
        graph: &Graph,
        i: usize,
        format: Precision,
        high: Precision,
    ) -> Precision {
        if format.is_scaled() && !crate::precision::has_quantized_kernel(&graph.nodes[i]) {
            high
        } else {
            format
        }
    }
}

/// The decision groups of `candidates` (compute layers), in topological order of their first
/// layers.
pub fn decision_groups(graph: &Graph, candidates: &[usize]) -> Vec<DecisionGroup> {
    let values = graph.values();
    let is_candidate = {
        let mut v = vec![false; graph.nodes.len()];
        candidates.iter().for_each(|&i| v[i] = true);
        v
    };
    let mut parent: Vec<usize> = (0..graph.nodes.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let join = |parent: &mut Vec<usize>, a: usize, b: usize| {
        let (ra, rb) = (root(parent, a), root(parent, b));
        parent[ra.max(rb)] = ra.min(rb);
    };
    // Epilogues: after a kernel that takes one, the pointwise layers whose input is the
    // previous layer's only reader and whose other inputs are weights.
    for (_, chain) in epilogue_chains(graph, &is_candidate) {
        for w in chain.windows(2) {
            join(&mut parent, w[0], w[1]);
        }
    }
    // GEMMs that read one activation (its data input) share the decision.
    let mut by_input: BTreeMap<&str, usize> = BTreeMap::new();
    for &i in candidates {
        let n = &graph.nodes[i];
        if !crate::precision::has_quantized_kernel(n) {
            continue;
        }
        let Some(x) = n
            .inputs
            .first()
            .filter(|x| !x.is_empty() && graph.weight(x).is_none())
        else {
            continue;
        };
        // Its value must be one (a name could repeat across subgraphs; main graph only).
        if values.id(x).is_none() {
            continue;
        }
        match by_input.get(x.as_str()) {
            Some(&first) => join(&mut parent, first, i),
            None => {
                by_input.insert(x, i);
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &i in candidates {
        let r = root(&mut parent, i);
        groups.entry(r).or_default().push(i);
    }
    let mut out: Vec<DecisionGroup> = groups
        .into_values()
        .map(|mut layers| {
            layers.sort_unstable();
            DecisionGroup {
                quantizable: layers
                    .iter()
                    .any(|&i| crate::precision::has_quantized_kernel(&graph.nodes[i])),
                layers,
            }
        })
        .collect();
    out.sort_by_key(|g| g.layers[0]);
    out
}

/// Per anchor (a candidate whose op takes an epilogue): the chain, anchor first, of the
/// pointwise candidates fused after it.
fn epilogue_chains(graph: &Graph, is_candidate: &[bool]) -> Vec<(usize, Vec<usize>)> {
    let values = graph.values();
    let outputs: std::collections::HashSet<&str> =
        graph.outputs.iter().map(|o| o.name.as_str()).collect();
    let mut chains = Vec::new();
    for (a, node) in graph.nodes.iter().enumerate() {
        if !is_candidate[a] || def_of(node).is_none_or(|d| d.epilogue.is_none()) {
            continue;
        }
        let mut chain = vec![a];
        let mut last = a;
        while chain.len() <= MAX_EPILOGUE {
            let n = &graph.nodes[last];
            let [out] = n.outputs.as_slice() else { break };
            if outputs.contains(out.as_str()) {
                break;
            }
            let Some(id) = values.id(out) else { break };
            let [reader] = values.consumers(id) else {
                break;
            };
            let next = reader.node;
            let m = &graph.nodes[next];
            let fits = is_candidate[next]
                && reader.input.is_some()
                && def_of(m).is_some_and(|d| d.stage.is_some())
                && m.inputs.iter().enumerate().all(|(k, x)| {
                    Some(k) == reader.input || x.is_empty() || graph.weight(x).is_some()
                });
            if !fits {
                break;
            }
            chain.push(next);
            last = next;
        }
        if chain.len() > 1 {
            chains.push((a, chain));
        }
    }
    chains
}

/// The cost model's view of `graph`: `elements` of each value and `flops` of each node (from
/// one FP32 run of the first input set), the epilogues of `groups` fused.
pub fn cost_layers(
    graph: &Graph,
    candidates: &[usize],
    elements: &HashMap<String, u64>,
    flops: &HashMap<usize, u64>,
) -> Vec<CostLayer> {
    let mut is_candidate = vec![false; graph.nodes.len()];
    candidates.iter().for_each(|&i| is_candidate[i] = true);
    let kind = |i: usize| {
        let n = &graph.nodes[i];
        if is_candidate[i] {
            LayerKind::Compute
        } else if is_data_movement(n) && !graph.is_folded(n) {
            LayerKind::Movement
        } else {
            LayerKind::Fixed
        }
    };
    // (producer, reader) pairs inside a fused kernel.
    let mut internal: std::collections::HashSet<(usize, usize)> = Default::default();
    for (_, chain) in epilogue_chains(graph, &is_candidate) {
        for w in chain.windows(2) {
            internal.insert((w[0], w[1]));
        }
    }
    let values = graph.values();
    (0..graph.nodes.len())
        .map(|i| {
            let n = &graph.nodes[i];
            let def = def_of(n);
            let quantized = |k: usize| {
                def.is_some_and(|d| d.has_quantized_kernel() && d.is_quantized_operand(k))
            };
            let mut inputs = Vec::new();
            let mut weights = Vec::new();
            for (k, x) in n.inputs.iter().enumerate().filter(|(_, x)| !x.is_empty()) {
                if let Some(w) = graph.weight(x) {
                    weights.push(CostWeight {
                        elements: w.len() as u64,
                        quantized_operand: quantized(k),
                    });
                    continue;
                }
                let producer = values.producer_node(x);
                let source = match producer {
                    Some(j) if kind(j) != LayerKind::Fixed => Source::Layer(j),
                    _ => Source::Fixed,
                };
                inputs.push(CostInput {
                    value: values.id(x).map_or(usize::MAX, |id| id.index()),
                    source,
                    elements: elements.get(x).copied().unwrap_or(0),
                    quantized_operand: quantized(k),
                    internal: producer.is_some_and(|j| internal.contains(&(j, i))),
                });
            }
            CostLayer {
                kind: kind(i),
                flops: flops.get(&i).copied().unwrap_or(0),
                inputs,
                weights,
                output_elements: n
                    .outputs
                    .iter()
                    .map(|o| elements.get(o).copied().unwrap_or(0))
                    .sum(),
                internal_output: internal.iter().any(|&(p, _)| p == i),
            }
        })
        .collect()
}

/// Judges whole plans: the emulation ([`BuiltinOracle::evaluate_plans`]) or, in tests, a
/// planted answer.
pub trait PlanJudge {
    /// One verdict per plan, in order (they may run at the same time).
    fn judge(&mut self, plans: &[PrecisionPlan]) -> Vec<Result<Evaluation>>;
    /// `plan` judged again from scratch (no cached value).
    fn verify(&mut self, plan: &PrecisionPlan) -> Result<Evaluation>;
}

impl PlanJudge for BuiltinOracle<'_> {
    fn judge(&mut self, plans: &[PrecisionPlan]) -> Vec<Result<Evaluation>> {
        self.evaluate_plans(plans)
    }

    fn verify(&mut self, plan: &PrecisionPlan) -> Result<Evaluation> {
        self.evaluate_plan_uncached(plan)
    }
}

/// The search's setting: the groups, the formats each may take and how assignments cost.
pub struct FormatSpace<'g> {
    pub graph: &'g Graph,
    pub groups: Vec<DecisionGroup>,
    /// The formats besides the high precision, in the user's order (one uniform baseline
    /// each).
    pub formats: Vec<Precision>,
    /// Per group: its formats from cheapest to safest (the high precision last).
    pub orders: Vec<Vec<Precision>>,
    pub high: Precision,
    pub costs: CostModel,
    pub objective: CostObjective,
    /// The engine fusion every plan of the space is emulated under (`--fusion`): each plan
    /// carries it, and the emulation derives that plan's regions from its precisions, so a
    /// precision boundary between two groups splits a region as it does on the engine.
    pub fusion: FusionModel,
}

impl<'g> FormatSpace<'g> {
    /// `formats` in the user's order (ties in cost keep it); a group without an int8/fp8
    /// kernel takes only the float ones.
    pub fn new(
        graph: &'g Graph,
        groups: Vec<DecisionGroup>,
        formats: &[Precision],
        high: Precision,
        costs: CostModel,
        objective: CostObjective,
    ) -> FormatSpace<'g> {
        let mut space = FormatSpace {
            graph,
            groups,
            formats: formats.iter().copied().filter(|&f| f != high).collect(),
            orders: Vec::new(),
            high,
            costs,
            objective,
            fusion: FusionModel::None,
        };
        space.orders = (0..space.groups.len())
            .map(|g| {
                let mut own: Vec<(f64, usize, Precision)> = formats
                    .iter()
                    .enumerate()
                    .filter(|(_, &f)| f != high && (space.groups[g].quantizable || !f.is_scaled()))
                    .map(|(k, &f)| (space.group_alone_cost(g, f), k, f))
                    .collect();
                own.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                own.into_iter()
                    .map(|(_, _, f)| f)
                    .chain(std::iter::once(high))
                    .collect()
            })
            .collect();
        space
    }

    /// The space with every plan under `fusion` (the cost model is the same: it prices
    /// TensorRT's epilogue fusion whatever the emulation assumes).
    pub fn with_fusion(mut self, fusion: FusionModel) -> FormatSpace<'g> {
        self.fusion = fusion;
        self
    }

    /// The cost of group `g` in `f` with every other group in the high precision.
    fn group_alone_cost(&self, g: usize, f: Precision) -> f64 {
        let mut formats = vec![self.high; self.groups.len()];
        formats[g] = f;
        self.cost(&formats).by(self.objective)
    }

    /// Per node, the precision an assignment (one format per group) gives it.
    pub fn layer_precisions(&self, formats: &[Precision]) -> Vec<Precision> {
        let mut layers = vec![self.high; self.graph.nodes.len()];
        for (g, &f) in self.groups.iter().zip(formats) {
            for &i in &g.layers {
                layers[i] = g.layer_precision(self.graph, i, f, self.high);
            }
        }
        layers
    }

    /// The plan of an assignment, under the space's fusion model.
    pub fn plan(&self, formats: &[Precision]) -> PrecisionPlan {
        let mut plan = PrecisionPlan::from_layers(self.layer_precisions(formats));
        plan.fusion = self.fusion;
        plan
    }

    pub fn cost(&self, formats: &[Precision]) -> Cost {
        self.costs.cost(&self.layer_precisions(formats))
    }

    /// Every group in `f` where it can take it, else in the high precision (a uniform
    /// baseline: all fp16, all int8, ...).
    pub fn uniform(&self, f: Precision) -> Vec<Precision> {
        self.orders
            .iter()
            .map(|o| if o.contains(&f) { f } else { self.high })
            .collect()
    }
}

/// A (group, format) run alone, the rest in the high precision.
#[derive(Clone, Debug, Serialize)]
pub struct Sensitivity {
    pub format: Precision,
    /// The criterion's required tolerance ([`Evaluation::error`]; infinite for NaN).
    pub error: f64,
    pub passed: bool,
}

/// How the walk got to a point.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Step {
    /// A uniform baseline: every group in `format` where it can take it (all fp16, all
    /// int8, ...), evaluated before the walk.
    Uniform { format: Precision },
    /// The cheapest assignment.
    Start,
    /// The greedy move: `group` raised from `from` to `to`.
    Raise {
        group: usize,
        from: Precision,
        to: Precision,
    },
    /// The previous point was predicted to pass and failed: its worst group raised.
    Repair {
        group: usize,
        from: Precision,
        to: Precision,
    },
    /// The descent: point `from` (the cheapest that passed the walk and the baselines) with
    /// `lowered` groups in their cheaper formats, a trial of the driver's `minimal` search in
    /// its `phase` (`check-none`, `rank-gallop`, `rank-bisect`, `prune`, `confirm`).
    Lower {
        from: usize,
        lowered: usize,
        phase: &'static str,
    },
}

/// One evaluated point of the front.
#[derive(Clone, Debug, Serialize)]
pub struct FrontPoint {
    /// One format per group.
    pub formats: Vec<Precision>,
    pub cost: Cost,
    pub passed: bool,
    /// The measured error (required tolerance; NaN when unknown).
    pub error: f64,
    pub summary: String,
    /// Whether the sensitivities predicted it to pass (every group's format passed alone).
    pub predicted_pass: bool,
    pub step: Step,
    /// A `--check` command's verdict, when it judged this point ([`check_front`]).
    pub check: Option<CheckVerdict>,
}

/// A `--check` command's verdict on a front point.
#[derive(Clone, Debug, Serialize)]
pub struct CheckVerdict {
    pub passed: bool,
    pub summary: String,
}

/// What the walk found.
#[derive(Clone, Debug)]
pub struct FrontWalk {
    /// Per group, its formats other than the high precision, alone.
    pub sensitivity: Vec<Vec<Sensitivity>>,
    pub points: Vec<FrontPoint>,
    /// The cheapest point that passed (by the objective; the earliest of equals), a walked
    /// point or a uniform baseline.
    pub chosen: Option<usize>,
    /// Per format of [`FormatSpace::formats`], the point of its uniform baseline.
    pub baselines: Vec<usize>,
    /// The chosen point evaluated again outside the cache.
    pub verified: Option<Evaluation>,
    /// Evaluations made (sensitivity, walk, verification).
    pub evaluations: usize,
    /// What the walk did that a user should know (repairs), in order.
    pub log: Vec<String>,
    /// Stopped (Ctrl-C) before the walk reached the safest point.
    pub interrupted: bool,
}

/// How far [`walk_front`] goes.
#[derive(Clone, Copy, Debug)]
pub struct WalkOptions {
    /// Evaluations at the same time where they are independent.
    pub jobs: usize,
    /// Walk on to the safest assignment; otherwise the walk stops at the first point that
    /// costs as much as the cheapest point that passed (no later point can be chosen).
    pub full: bool,
}

/// Runs the sensitivity pass, the uniform baselines and the walk, `options.jobs` evaluations
/// at a time where they are independent; `stop` (Ctrl-C) ends the walk at the next point.
/// The front's points are the baselines (in [`FormatSpace::formats`]' order), then the walk's
/// points; a walked assignment equal to an evaluated point is that point, not a second one.
pub fn walk_front(
    space: &FormatSpace<'_>,
    judge: &mut dyn PlanJudge,
    options: WalkOptions,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(&str),
) -> Result<FrontWalk> {
    let n = space.groups.len();
    let jobs = options.jobs.max(1);
    let objective = space.objective;
    let mut evaluations = 0;
    // 1. Sensitivity of every (group, format).
    let pairs: Vec<(usize, Precision)> = (0..n)
        .flat_map(|g| {
            space.orders[g]
                .iter()
                .filter(|&&f| f != space.high)
                .map(move |&f| (g, f))
        })
        .collect();
    progress(&format!(
        "Sensitivity: {} (layer group, format) pair(s), each alone...",
        pairs.len()
    ));
    let mut sensitivity: Vec<Vec<Sensitivity>> = vec![Vec::new(); n];
    for chunk in pairs.chunks(jobs) {
        if stop.load(Ordering::SeqCst) {
            return Err(Error::Invalid(
                "interrupted during the sensitivity pass: no front yet".into(),
            ));
        }
        let plans: Vec<PrecisionPlan> = chunk
            .iter()
            .map(|&(g, f)| {
                let mut formats = vec![space.high; n];
                formats[g] = f;
                space.plan(&formats)
            })
            .collect();
        for (&(g, f), e) in chunk.iter().zip(judge.judge(&plans)) {
            let e = e?;
            evaluations += 1;
            sensitivity[g].push(Sensitivity {
                format: f,
                error: if e.error.is_nan() {
                    f64::INFINITY
                } else {
                    e.error
                },
                passed: e.passed,
            });
        }
    }
    let alone = |g: usize, f: Precision| alone(space, &sensitivity, g, f);
    let predicts_pass = |formats: &[Precision]| predicts_pass(space, &sensitivity, formats);
    // 2. The uniform baselines: what a one-format tool (AutoCast, ModelOpt's PTQ) writes, so
    // candidates too — the walk's path need not cross them.
    let mut points: Vec<FrontPoint> = Vec::new();
    let uniform: Vec<(Precision, Vec<Precision>)> = space
        .formats
        .iter()
        .map(|&f| (f, space.uniform(f)))
        .collect();
    progress(&format!(
        "Baselines: {} uniform assignment(s)...",
        uniform.len()
    ));
    for chunk in uniform.chunks(jobs) {
        if stop.load(Ordering::SeqCst) {
            return Err(Error::Invalid(
                "interrupted during the uniform baselines: no front yet".into(),
            ));
        }
        let plans: Vec<PrecisionPlan> = chunk.iter().map(|(_, u)| space.plan(u)).collect();
        for ((f, u), e) in chunk.iter().zip(judge.judge(&plans)) {
            let e = e?;
            evaluations += 1;
            progress(&format!(
                "Baseline all {}: cost {} {} | {} | {}",
                f.name(),
                fmt_g(space.cost(u).by(objective), 4),
                objective.unit(),
                if e.passed { "passed" } else { "failed" },
                e.summary
            ));
            points.push(FrontPoint {
                formats: u.clone(),
                cost: space.cost(u),
                passed: e.passed,
                error: e.error,
                summary: e.summary,
                predicted_pass: predicts_pass(u),
                step: Step::Uniform { format: *f },
                check: None,
            });
        }
    }
    let baselines: Vec<usize> = (0..points.len()).collect();
    // The cheapest passing point so far (cost, index): no point that costs as much can be
    // chosen.
    let cheapest_passed = |points: &[FrontPoint]| -> Option<(f64, usize)> {
        points
            .iter()
            .enumerate()
            .filter(|(_, p)| p.passed)
            .map(|(k, p)| (p.cost.by(objective), k))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
    };
    // 3. The walk.
    let top = |g: usize| space.orders[g].len() - 1;
    let mut levels = vec![0usize; n];
    let mut step = Step::Start;
    let mut log = Vec::new();
    let mut interrupted = false;
    loop {
        let formats: Vec<Precision> = (0..n).map(|g| space.orders[g][levels[g]]).collect();
        let predicted_pass = predicts_pass(&formats);
        let cost = space.cost(&formats);
        if !options.full {
            if let Some((bound, k)) = cheapest_passed(&points) {
                if cost.by(objective) >= bound {
                    log.push(format!(
                        "The walk stopped at cost {} {}: point {k} passed at {}, and the walk's later points raise more formats (--full-front walks on to the safest point)",
                        fmt_g(cost.by(objective), 4),
                        objective.unit(),
                        fmt_g(bound, 4),
                    ));
                    break;
                }
            }
        }
        let at = Front {
            space,
            sensitivity: &sensitivity,
            points: &mut points,
            evaluations: &mut evaluations,
        }
        .point_of(judge, formats.clone(), step.clone(), "", progress)?;
        let passed = points[at].passed;
        let failed_prediction = predicted_pass && !passed;
        if (0..n).all(|g| levels[g] == top(g)) {
            break;
        }
        if stop.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        let open: Vec<usize> = (0..n).filter(|&g| levels[g] < top(g)).collect();
        let g = if failed_prediction {
            // Interactions: every format passed alone, together they fail. Raise the group
            // whose format erred most alone.
            let worst = *open
                .iter()
                .max_by(|&&a, &&b| {
                    alone(a, formats[a])
                        .0
                        .total_cmp(&alone(b, formats[b]).0)
                        .then(b.cmp(&a))
                })
                .expect("a point below the safest has a group to raise");
            let to = space.orders[worst][levels[worst] + 1];
            log.push(format!(
                "Repair: point {at} was predicted to pass (each group's format passed alone) but failed; raising its worst group '{}' from {} to {}",
                space.groups[worst].name(space.graph),
                formats[worst].name(),
                to.name()
            ));
            step = Step::Repair {
                group: worst,
                from: formats[worst],
                to,
            };
            worst
        } else {
            let now = cost.by(objective);
            let key = |g: usize| {
                let (from, to) = (formats[g], space.orders[g][levels[g] + 1]);
                let mut next = formats.clone();
                next[g] = to;
                let added = space.cost(&next).by(objective) - now;
                let (e_from, fails) = {
                    let (e, passed) = alone(g, from);
                    (e, !passed)
                };
                let saved = e_from - alone(g, to).0;
                let saved = if saved.is_nan() { 0.0 } else { saved };
                (fails, saved / added.max(f64::MIN_POSITIVE), added)
            };
            let g = *open
                .iter()
                .max_by(|&&a, &&b| {
                    let (ka, kb) = (key(a), key(b));
                    ka.0.cmp(&kb.0)
                        .then(ka.1.total_cmp(&kb.1))
                        .then(kb.2.total_cmp(&ka.2))
                        .then(b.cmp(&a))
                })
                .expect("a point below the safest has a group to raise");
            step = Step::Raise {
                group: g,
                from: formats[g],
                to: space.orders[g][levels[g] + 1],
            };
            g
        };
        levels[g] += 1;
    }
    // 4. The descent from the cheapest point that passed.
    if let Some((_, from)) = cheapest_passed(&points).filter(|_| !interrupted) {
        let mut descent = Descent {
            front: Front {
                space,
                sensitivity: &sensitivity,
                points: &mut points,
                evaluations: &mut evaluations,
            },
            log: &mut log,
        };
        interrupted = descent.run(judge, from, jobs, stop, progress)?;
    }
    // 5. The cheapest passing point, verified.
    let chosen = cheapest_passed(&points).map(|(_, k)| k);
    let verified = match chosen {
        Some(k) => {
            let e = judge.verify(&space.plan(&points[k].formats))?;
            evaluations += 1;
            if !e.passed {
                log.push(format!(
                    "Verification: point {k} failed when evaluated again outside the cache ({}); nothing is chosen",
                    e.summary
                ));
            }
            Some(e)
        }
        None => None,
    };
    let chosen = chosen.filter(|_| verified.as_ref().is_none_or(|e| e.passed));
    Ok(FrontWalk {
        sensitivity,
        points,
        chosen,
        baselines,
        verified,
        evaluations,
        log,
        interrupted,
    })
}

/// Group `g`'s error and verdict in `f` alone (the rest high): the sensitivity pass's, or no
/// error in the high precision.
fn alone(
    space: &FormatSpace<'_>,
    sensitivity: &[Vec<Sensitivity>],
    g: usize,
    f: Precision,
) -> (f64, bool) {
    if f == space.high {
        return (0.0, true);
    }
    sensitivity[g]
        .iter()
        .find(|s| s.format == f)
        .map_or((f64::INFINITY, false), |s| (s.error, s.passed))
}

/// Whether every group's format passed alone.
fn predicts_pass(
    space: &FormatSpace<'_>,
    sensitivity: &[Vec<Sensitivity>],
    formats: &[Precision],
) -> bool {
    (0..space.groups.len()).all(|g| alone(space, sensitivity, g, formats[g]).1)
}

/// The front as the walk and the descent add to it.
struct Front<'s, 'g> {
    space: &'s FormatSpace<'g>,
    sensitivity: &'s [Vec<Sensitivity>],
    points: &'s mut Vec<FrontPoint>,
    evaluations: &'s mut usize,
}

impl Front<'_, '_> {
    /// The index of the point of `formats`: the one already on the front, or judged now and
    /// added with `step` (`label` follows its index in the progress line).
    fn point_of(
        &mut self,
        judge: &mut dyn PlanJudge,
        formats: Vec<Precision>,
        step: Step,
        label: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<usize> {
        if let Some(k) = self.points.iter().position(|p| p.formats == formats) {
            return Ok(k);
        }
        let space = self.space;
        let e = judge
            .judge(&[space.plan(&formats)])
            .pop()
            .expect("one verdict per plan")?;
        *self.evaluations += 1;
        let cost = space.cost(&formats);
        progress(&format!(
            "Front point {}{label}: cost {} {} | {} | {}",
            self.points.len(),
            fmt_g(cost.by(space.objective), 4),
            space.objective.unit(),
            if e.passed { "passed" } else { "failed" },
            e.summary
        ));
        self.points.push(FrontPoint {
            predicted_pass: predicts_pass(space, self.sensitivity, &formats),
            formats,
            cost,
            passed: e.passed,
            error: e.error,
            summary: e.summary,
            step,
            check: None,
        });
        Ok(self.points.len() - 1)
    }
}

/// A `--check` command on front points: judges the points at these indices (one verdict each,
/// in order).
pub type PointCheck<'c> = dyn FnMut(&[usize]) -> Vec<Result<Evaluation>> + 'c;

/// Lets a user command (real TensorRT, a task metric) decide among the points the emulation
/// found: it judges the chosen point and its neighbours by cost (the next cheaper point and
/// the next safer one), then, while none of them has passed, the safer points that passed the
/// emulation in order of cost, `jobs` at a time. The chosen point becomes the cheapest one the
/// command passed (None when it passed none); each judged point keeps the verdict, and the log
/// says what changed. Without a chosen point there is nothing to judge. `stop` (Ctrl-C) ends
/// it between batches.
pub fn check_front(
    space: &FormatSpace<'_>,
    walk: &mut FrontWalk,
    jobs: usize,
    stop: &AtomicBool,
    check: &mut PointCheck<'_>,
) -> Result<()> {
    let Some(chosen) = walk.chosen else {
        walk.log
            .push("--check: no point passed the emulation; the command judged none".into());
        return Ok(());
    };
    let costs: Vec<f64> = walk
        .points
        .iter()
        .map(|p| p.cost.by(space.objective))
        .collect();
    let cost = |k: usize| costs[k];
    let mut order: Vec<usize> = (0..walk.points.len()).collect();
    order.sort_by(|&a, &b| cost(a).total_cmp(&cost(b)).then(a.cmp(&b)));
    let at = order
        .iter()
        .position(|&k| k == chosen)
        .expect("the chosen point is on the front");
    let mut queue: Vec<usize> = vec![chosen];
    queue.extend(at.checked_sub(1).map(|p| order[p]));
    queue.extend(order.get(at + 1).copied());
    let safer: Vec<usize> = order[(at + 2).min(order.len())..]
        .iter()
        .copied()
        .filter(|&k| walk.points[k].passed)
        .collect();
    let mut next_safer = safer.into_iter();
    let mut judged = 0;
    loop {
        for batch in queue.chunks(jobs.max(1)) {
            if stop.load(Ordering::SeqCst) {
                walk.interrupted = true;
                break;
            }
            // An error (a point that would not export, a command that would not start) ends
            // it as itself, wherever it stands in the batch.
            let mut verdicts = 0;
            for (&k, e) in batch.iter().zip(check(batch)) {
                let e = e?;
                verdicts += 1;
                walk.points[k].check = Some(CheckVerdict {
                    passed: e.passed,
                    summary: e.summary,
                });
            }
            if verdicts != batch.len() {
                return Err(Error::Invalid(format!(
                    "--check: {verdicts} verdict(s) for {} point(s)",
                    batch.len()
                )));
            }
            judged += verdicts;
        }
        let any_passed = walk
            .points
            .iter()
            .any(|p| p.check.as_ref().is_some_and(|c| c.passed));
        if any_passed || walk.interrupted {
            break;
        }
        match next_safer.next() {
            Some(k) => queue = vec![k],
            None => break,
        }
    }
    walk.evaluations += judged;
    let now = walk
        .points
        .iter()
        .enumerate()
        .filter(|(_, p)| p.check.as_ref().is_some_and(|c| c.passed))
        .min_by(|(a, _), (b, _)| cost(*a).total_cmp(&cost(*b)).then(a.cmp(b)))
        .map(|(k, _)| k);
    walk.log.push(match now {
        Some(k) if k == chosen => format!(
            "--check: judged {judged} point(s); it passed point {chosen}, which stays chosen"
        ),
        Some(k) => format!(
            "--check: judged {judged} point(s); it {} point {chosen}, the emulation's choice, and passed point {k}, chosen instead",
            if walk.points[chosen].check.as_ref().is_some_and(|c| c.passed) {
                "passed"
            } else {
                "failed"
            }
        ),
        None => format!(
            "--check: judged {judged} point(s) and passed none{}; nothing is chosen",
            if walk.interrupted { " before Ctrl-C" } else { "" }
        ),
    });
    walk.chosen = now;
    Ok(())
}

#[cfg(test)]
mod tests;
