//! `mixprec plan` as a library job: the cheapest format per layer (fp8, int8, fp16, bf16 or
//! the high precision) under an accuracy criterion and a cost model (docs/plan.md). A
//! [`Config`] is validated once, [`run`] returns an [`Outcome`] that holds the front and
//! writes the files a user asks for (the mixed-precision model, `--save-result` JSON, the
//! HTML report). The walk itself is [`crate::search::formats`].

use super::check::{check_oracle, CheckLimits, CheckOptions, TempDir};
use super::debug_precision::GoldenSource;
use super::options::{CalibOptions, CompareOptions, Inputs, PrecisionOptions};
use super::ranges::ranges_for_plan;
use crate::compare::{fmt_g, Criterion};
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::event::{Event, Progress};
use crate::exec::cache::parse_bytes;
use crate::exec::ValueCache;
use crate::export::{export, ExportOptions};
use crate::golden::GoldenFile;
use crate::numeric::Accumulator;
use crate::onnx::Model;
use crate::precision::fusion::FusionModel;
use crate::precision::plan::{PrecisionPlan, ResolvedRegion};
use crate::precision::Precision;
use crate::search::builtin::{BuiltinOracle, UserCriterion};
use crate::search::check::ModelCandidate;
use crate::search::driver::AUTO_BUDGET_MAX;
use crate::search::formats::cost::{Cost, CostModel, CostObjective, Target};
use crate::search::formats::{
    check_front, cost_layers, decision_groups, walk_front, CheckVerdict, DecisionGroup,
    FormatSpace, FrontPoint, FrontWalk, PlanJudge, Sensitivity, Step, WalkOptions,
};
use crate::search::remote::{RemotePlanJudge, RemotePlanWorkers};
use crate::tensor::Feeds;
use crate::{load_model, Interpreter};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Everything `plan` is asked to do, as the user gave it.
#[derive(Clone, Debug)]
pub struct Config {
    pub model: PathBuf,
    pub inputs: Inputs,
    /// `--formats`: the formats layers may take besides the high precision.
    pub formats: Vec<String>,
    /// `--high`: the safest format (float32 by default).
    pub high: String,
    /// `--objective`: latency, bytes or effective-bits.
    pub objective: String,
    /// `--target`: h100, b200 or a JSON cost file.
    pub target: String,
    /// Golden outputs (`--golden`); None: the model's own FP32 run.
    pub golden: Option<GoldenSource>,
    pub compare: CompareOptions,
    /// A user criterion that decides every verdict instead of the tolerances (the Python
    /// API's `criterion=`); the tolerances still measure the error points report.
    pub user_criterion: Option<UserCriterion>,
    pub calibration_cache: Option<PathBuf>,
    pub calib: CalibOptions,
    /// Evaluations at the same time (`--jobs`); the front is the same for any number.
    pub jobs: usize,
    /// `--cache-budget`: `auto` or a size such as `512M`.
    pub cache_budget: String,
    /// A user command or function that judges the chosen point and its neighbours
    /// (`--check`, [`crate::search::formats::check_front`]); with remote workers, it runs
    /// on them.
    pub check: Option<CheckOptions>,
    /// Report each `--check` command and its output.
    pub verbose: bool,
    /// `--decode N`: every evaluation generates N tokens greedily from each input set's prompt
    /// (models with ONNX Runtime GenAI's names; [`crate::decode`]).
    pub decode: Option<usize>,
    /// `--full-front`: walk on to the safest assignment instead of stopping at the first
    /// point that costs as much as the cheapest passing one (always with `--check`, which
    /// may need the safer points).
    pub full_front: bool,
    /// `--fusion`: the engine fusion every point is emulated under (`none` or `tensorrt`,
    /// docs/numerics.md "Fusion rules").
    pub fusion: String,
    /// Workers that judge every point instead of this process (the Python API's `executor=`,
    /// [`crate::search::remote::RemotePlanJudge`]); started once the ranges are calibrated.
    pub remote: Option<RemotePlanWorkers>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            model: PathBuf::new(),
            inputs: Inputs::default(),
            formats: vec!["fp8".into(), "int8".into(), "fp16".into()],
            high: "float32".into(),
            objective: "latency".into(),
            target: "h100".into(),
            golden: None,
            compare: CompareOptions::default(),
            user_criterion: None,
            calibration_cache: None,
            calib: CalibOptions::default(),
            jobs: 1,
            cache_budget: "auto".into(),
            check: None,
            verbose: false,
            decode: None,
            full_front: false,
            fusion: "none".into(),
            remote: None,
        }
    }
}

/// A [`Config`] checked.
pub struct Validated {
    pub config: Config,
    pub formats: Vec<Precision>,
    pub high: Precision,
    pub objective: CostObjective,
    pub target: Target,
    pub criterion: Criterion,
    pub cache_budget: Option<usize>,
    pub fusion: FusionModel,
    pub(crate) check_limits: CheckLimits,
}

impl Config {
    /// Parses and checks every option that needs no model; an error names the option.
    pub fn validate(self) -> Result<Validated> {
        let high = Precision::parse(&self.high)?;
        if high.is_scaled() {
            return Err(Error::Invalid(format!(
                "--high {}: the high precision is a float format (float32, float16 or bfloat16)",
                high.name()
            )));
        }
        let mut formats = Vec::new();
        for f in self
            .formats
            .iter()
            .flat_map(|f| f.split(','))
            .map(str::trim)
        {
            let p = Precision::parse(f).map_err(|_| {
                Error::Invalid(format!(
                    "--formats: unknown format '{f}' (valid: fp8, int8, fp16, bf16)"
                ))
            })?;
            if p == high {
                return Err(Error::Invalid(format!(
                    "--formats {f}: {} is the high precision (--high); list the lower formats",
                    high.name()
                )));
            }
            if p == Precision::Float32 {
                return Err(Error::Invalid(
                    "--formats float32: float32 is never a lower format".into(),
                ));
            }
            if formats.contains(&p) {
                return Err(Error::Invalid(format!("--formats: {f} is listed twice")));
            }
            formats.push(p);
        }
        if formats.is_empty() {
            return Err(Error::Invalid(
                "--formats: give at least one format (e.g. fp8,int8,fp16)".into(),
            ));
        }
        let objective = CostObjective::parse(&self.objective)?;
        let target = Target::resolve(&self.target)?;
        let criterion = self.compare.criterion()?;
        let cache_budget = match self.cache_budget.trim() {
            "auto" => None,
            b => Some(parse_bytes(b).ok_or_else(|| {
                Error::Invalid(format!(
                    "--cache-budget '{}': expected auto or a size such as 512M or 4G",
                    self.cache_budget
                ))
            })?),
        };
        if self.jobs == 0 {
            return Err(Error::Invalid("--jobs: expected at least 1".into()));
        }
        let check_limits = match &self.check {
            Some(c) => c.validate(self.jobs)?,
            None => CheckLimits::default(),
        };
        let fusion = FusionModel::parse(&self.fusion)?;
        if self.check.is_some() && !fusion.is_none() {
            // As debug precision: the command's engine fuses as it does; a point the fused
            // emulation found would be judged under a fusion nobody predicted.
            return Err(Error::Invalid(format!(
                "--fusion {fusion} has no effect with --check: the command judges every point on its own engine (leave --fusion out)"
            )));
        }
        let costless = CostModel {
            layers: Vec::new(),
            target: target.clone(),
        };
        if let Some(p) = costless.unsupported(&formats).first() {
            return Err(Error::Invalid(format!(
                "--target {}: it has no {} math (its peak is 0); leave {} out of --formats",
                target.name,
                p.name(),
                p.name()
            )));
        }
        Ok(Validated {
            config: self,
            formats,
            high,
            objective,
            target,
            criterion,
            cache_budget,
            fusion,
            check_limits,
        })
    }
}

/// A uniform assignment (every layer that can take the format in it, the rest in the high
/// precision) with its cost and verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Baseline {
    pub format: Precision,
    /// Its point on the front.
    pub point: usize,
    pub cost: Cost,
    pub passed: bool,
    pub error: f64,
    pub summary: String,
    /// Its plan (one precision per node), as `plan` exports it.
    #[serde(skip)]
    pub plan: PrecisionPlan,
}

/// What `plan` found.
pub struct Outcome {
    pub model: Model,
    pub model_name: String,
    pub formats: Vec<Precision>,
    pub high: Precision,
    pub objective: CostObjective,
    pub target: Target,
    /// Per decision group: its node indices and formats from cheapest to safest.
    pub groups: Vec<(Vec<usize>, Vec<Precision>)>,
    pub front: FrontWalk,
    pub baselines: Vec<Baseline>,
    /// Per point of the front, its plan (one precision per node).
    plans: Vec<PrecisionPlan>,
    pub amax: Option<BTreeMap<String, f32>>,
    pub input_sets: usize,
    /// The engine fusion every point was emulated under.
    pub fusion: FusionModel,
    /// The fusion regions the chosen point ran with (derived for its precisions; empty
    /// without a fusion model or a chosen point).
    pub chosen_regions: Vec<ResolvedRegion>,
}

/// Every layer `plan` decides (its groups' layers, group by group).
pub(crate) fn decided_layers(groups: &[DecisionGroup]) -> Vec<usize> {
    groups
        .iter()
        .flat_map(|g| g.layers.iter().copied())
        .collect()
}

/// A front point as the check judges it: `plan` exported with the ranges `amax` (what
/// `plan -o` writes for it), the `decided` layers it keeps in `high` (for the
/// layer-precision placeholders) and every decided layer's format.
pub(crate) fn point_candidate(
    model: &Model,
    decided: &[usize],
    plan: &PrecisionPlan,
    amax: Option<&BTreeMap<String, f32>>,
    high: Precision,
) -> Result<ModelCandidate> {
    let exported = export(model, plan, amax, &ExportOptions::default())?;
    Ok(ModelCandidate {
        high_layers: decided
            .iter()
            .copied()
            .filter(|&i| plan.layers[i] == high)
            .collect(),
        layers: decided.iter().map(|&i| (i, plan.layers[i])).collect(),
        model: Arc::new(exported.model),
    })
}

/// Runs `plan`: calibration when a format is int8/fp8, the cost facts from one FP32 run, the
/// sensitivities, the walk and the uniform baselines. Notes and progress lines go to
/// `events`, the calibration's progress to `progress`; `stop` (Ctrl-C) ends the walk early.
pub fn run(
    v: Validated,
    events: &mut dyn FnMut(Event),
    progress: &dyn Progress,
    stop: &AtomicBool,
) -> Result<Outcome> {
    let Validated {
        config,
        formats,
        high,
        objective,
        target,
        criterion,
        cache_budget,
        fusion,
        check_limits,
    } = v;
    let golden = config.golden.as_ref().map(GoldenSource::load).transpose()?;
    let model = load_model(&config.model)?;
    let graph = &model.graph;
    if crate::export::qdq::is_qdq_quantized(graph) {
        return Err(Error::Invalid(format!(
            "{}: already quantized (Q/DQ pairs on activations); plan chooses formats for a float model",
            config.model.display()
        )));
    }
    let interp = Interpreter::new(graph)?;
    // A generation starts from each input set's prompt with an empty cache: the calibration
    // and the cost facts see those first steps' feeds.
    let decoder = config.decode.map(|n| Decoder::new(graph, n)).transpose()?;
    let feeds = config
        .inputs
        .first_runs(graph, decoder.as_ref(), &mut |e| events(e))?;
    let candidates = PrecisionPlan::candidates(graph);
    let groups = decision_groups(graph, &candidates);
    if groups.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no layer computes in a float format (nothing to plan)",
            config.model.display()
        )));
    }
    // Ranges for every quantizable layer's inputs, once (the cache, or calibrated here).
    let amax = match formats.iter().find(|f| f.is_scaled()) {
        Some(&q) => {
            let mut plan = PrecisionPlan::uniform(graph, high);
            for &i in &candidates {
                if crate::precision::has_quantized_kernel(&graph.nodes[i]) {
                    plan.layers[i] = q;
                }
            }
            let options = PrecisionOptions {
                int8: q == Precision::Int8,
                fp8: q != Precision::Int8,
                calibration_cache: config.calibration_cache.clone(),
                calib: config.calib.clone(),
                ..Default::default()
            };
            ranges_for_plan(&interp, &plan, &options, &feeds, events, progress)?
        }
        None => None,
    };
    let costs = cost_model(&interp, &feeds[0], &candidates, &target)?;
    let space =
        FormatSpace::new(graph, groups, &formats, high, costs, objective).with_fusion(fusion);
    // Every format must export before any is searched: a format the opset cannot hold fails
    // here, not after the search.
    for &f in &formats {
        export(
            &model,
            &space.plan(&space.uniform(f)),
            amax.as_ref(),
            &ExportOptions::default(),
        )
        .map_err(|e| Error::Invalid(format!("--formats {}: cannot export: {e}", f.name())))?;
    }
    // The points are judged here, or by remote workers given these ranges.
    let (mut local, mut remote) = (None, None);
    let judge: &mut dyn PlanJudge = match &config.remote {
        Some(workers) => remote.insert(RemotePlanJudge {
            remote: workers.0.start(amax.as_ref())?,
            graph,
            high,
        }),
        None => local.insert(emulation_judge(
            &interp,
            &feeds,
            Judging {
                criterion,
                high,
                amax: amax.as_ref(),
                cache_budget,
                jobs: config.jobs,
                stop,
                user: config.user_criterion.clone(),
                decoder: decoder.as_ref(),
                golden: golden.as_ref(),
                fusion,
            },
            events,
        )?),
    };
    let walk = WalkOptions {
        jobs: config.jobs,
        full: config.full_front || config.check.is_some(),
    };
    let mut front = walk_front(&space, judge, walk, stop, &mut |line| {
        events(Event::Verbose(line.to_string()))
    })?;
    if let Some(c) = &config.check {
        let points = front.points.clone();
        let plan_of = |k: usize| space.plan(&points[k].formats);
        match remote.as_ref() {
            // The workers export each point with the ranges they were given (the driver's)
            // and run the check on it, where the user's tools are.
            Some(workers) => check_front(
                &space,
                &mut front,
                config.jobs,
                stop,
                &mut |ks: &[usize]| {
                    workers.check(&ks.iter().map(|&k| plan_of(k)).collect::<Vec<_>>())
                },
            )?,
            None => {
                let workdir = TempDir::new()?;
                let mut check = check_oracle(
                    c,
                    &check_limits,
                    graph,
                    high,
                    Box::new(|_| {
                        Err(Error::Invalid(
                            "plan's --check judges front points, not marked sets".into(),
                        ))
                    }),
                    Vec::new(),
                    workdir.0.clone(),
                    config.jobs,
                    config.verbose,
                    Box::new(&mut *events),
                );
                let decided = decided_layers(&space.groups);
                check_front(
                    &space,
                    &mut front,
                    config.jobs,
                    stop,
                    &mut |ks: &[usize]| {
                        let mut candidates = Vec::new();
                        for &k in ks {
                            match point_candidate(
                                &model,
                                &decided,
                                &plan_of(k),
                                amax.as_ref(),
                                high,
                            ) {
                                Ok(c) => candidates.push(c),
                                Err(e) => return vec![Err(e)],
                            }
                        }
                        check.evaluate_models(&candidates)
                    },
                )?;
            }
        }
    }
    let baselines = space
        .formats
        .iter()
        .zip(&front.baselines)
        .map(|(&format, &k)| {
            let p = &front.points[k];
            Baseline {
                format,
                point: k,
                cost: p.cost,
                passed: p.passed,
                error: p.error,
                summary: p.summary.clone(),
                plan: space.plan(&p.formats),
            }
        })
        .collect();
    let plans: Vec<PrecisionPlan> = front
        .points
        .iter()
        .map(|p| space.plan(&p.formats))
        .collect();
    let groups = space
        .groups
        .iter()
        .zip(&space.orders)
        .map(|(g, o)| (g.layers.clone(), o.clone()))
        .collect();
    // The regions the chosen point ran with, and the fusion model's notes on nodes it left
    // unfused (`-v`), read from the shapes the emulation derived them from.
    let chosen_regions = match front.chosen {
        Some(k) if !fusion.is_none() => {
            let (regions, notes) = crate::exec::emulate::plan_regions(
                graph,
                &plans[k],
                &crate::exec::feed_shapes(&feeds[0]),
            )?;
            notes.into_iter().for_each(&mut *events);
            regions
        }
        _ => Vec::new(),
    };
    drop(local);
    drop(remote);
    drop(interp);
    Ok(Outcome {
        model_name: config.model.display().to_string(),
        model,
        formats,
        high,
        objective,
        target,
        groups,
        front,
        baselines,
        plans,
        amax,
        input_sets: feeds.len(),
        fusion,
        chosen_regions,
    })
}

/// How plan's emulation judges a point: what [`emulation_judge`] needs besides the model and
/// its input sets.
pub(crate) struct Judging<'a> {
    pub criterion: Criterion,
    pub high: Precision,
    pub amax: Option<&'a BTreeMap<String, f32>>,
    pub cache_budget: Option<usize>,
    /// Points evaluated at the same time (forks of the value cache).
    pub jobs: usize,
    pub stop: &'a AtomicBool,
    pub user: Option<UserCriterion>,
    pub decoder: Option<&'a Decoder>,
    /// Golden outputs given by the user; None: the model's own reference run.
    pub golden: Option<&'a GoldenFile>,
    /// The fusion model every point is emulated under: the judge composes plans under it
    /// and derives each point's regions from its precisions.
    pub fusion: FusionModel,
}

/// Plan's emulation judge, its golden outputs set: the driver's without workers, and each
/// remote worker's ([`super::plan_worker`]), so both judge a point alike.
pub(crate) fn emulation_judge<'a>(
    interp: &'a Interpreter<'a>,
    feeds: &'a [Feeds],
    j: Judging<'a>,
    events: &mut dyn FnMut(Event),
) -> Result<BuiltinOracle<'a>> {
    let mut all_high = PrecisionPlan::uniform(interp.graph(), j.high);
    all_high.fusion = j.fusion;
    let mut oracle = BuiltinOracle::new(
        interp,
        feeds,
        j.criterion,
        all_high,
        j.high,
        Accumulator::default(),
        j.amax,
        ValueCache::new(j.cache_budget.unwrap_or(AUTO_BUDGET_MAX)),
    )?;
    oracle.ranking_in_jobs(j.jobs);
    oracle.stopping_on(j.stop);
    oracle.judging_by(j.user);
    oracle.generating(j.decoder);
    let reference = oracle.reference_outputs()?;
    let golden = match j.golden {
        Some(g) => g.reference_for(&reference[0], events)?,
        None => reference,
    };
    oracle.set_golden(golden)?;
    Ok(oracle)
}

/// The cost model of `interp`'s graph on `target`: the elements of every value and the FLOPs
/// of every layer from one FP32 run of `feeds` (dynamic shapes are priced at them).
pub(crate) fn cost_model(
    interp: &Interpreter<'_>,
    feeds: &crate::tensor::Feeds,
    candidates: &[usize],
    target: &Target,
) -> Result<CostModel> {
    let graph = interp.graph();
    let mut elements: HashMap<String, u64> = HashMap::new();
    let mut facts = ValueCache::new(0);
    interp.run_cached_observed(feeds, 0, None, &mut facts, &mut |name, t| {
        elements.insert(name.to_string(), t.len() as u64);
    })?;
    for i in &graph.inputs {
        if let Some(t) = feeds.get(&i.name) {
            elements.insert(i.name.clone(), t.len() as u64);
        }
    }
    Ok(CostModel {
        layers: cost_layers(graph, candidates, &elements, &facts.layer_flops),
        target: target.clone(),
    })
}

/// The result file's view of a front point.
#[derive(Serialize)]
struct PointJson<'a> {
    index: usize,
    /// Per candidate layer (by name) its format.
    layers: BTreeMap<&'a str, Precision>,
    cost: f64,
    costs: Cost,
    error: f64,
    passed: bool,
    predicted_pass: bool,
    step: &'a Step,
    summary: &'a str,
    /// The `--check` command's verdict, when it judged the point.
    check: Option<&'a CheckVerdict>,
}

#[derive(Serialize)]
struct GroupJson<'a> {
    name: String,
    layers: Vec<&'a str>,
    formats: &'a [Precision],
    sensitivity: &'a [Sensitivity],
}

#[derive(Serialize)]
struct RegionJson<'a> {
    name: &'a str,
    precision: Precision,
    nodes: Vec<&'a str>,
}

#[derive(Serialize)]
struct ResultJson<'a> {
    model: &'a str,
    target: &'a Target,
    objective: CostObjective,
    unit: &'static str,
    formats: &'a [Precision],
    high: Precision,
    /// The engine fusion every point was emulated under.
    fusion: FusionModel,
    /// The regions the chosen point ran with under it.
    fusion_regions: Vec<RegionJson<'a>>,
    input_sets: usize,
    groups: Vec<GroupJson<'a>>,
    front: Vec<PointJson<'a>>,
    chosen: Option<usize>,
    verified: Option<bool>,
    baselines: &'a [Baseline],
    evaluations: usize,
    interrupted: bool,
    log: &'a [String],
}

impl Outcome {
    /// The chosen point's plan (None: no point passed).
    pub fn chosen_plan(&self) -> Option<&PrecisionPlan> {
        self.front.chosen.map(|k| &self.plans[k])
    }

    /// A point's cost by the objective.
    pub fn cost_of(&self, c: &Cost) -> f64 {
        c.by(self.objective)
    }

    /// The group's name (its first layer's, with how many more it holds).
    pub fn group_name(&self, g: usize) -> String {
        let layers = &self.groups[g].0;
        let first = &self.model.graph.nodes[layers[0]].name;
        match layers.len() {
            1 => first.clone(),
            n => format!("{first} (+{} fused)", n - 1),
        }
    }

    /// The chosen plan as a strongly typed mixed-precision model (Casts, Q/DQ with the
    /// calibrated scales); None when no point passed.
    pub fn export(&self) -> Result<Option<crate::export::Exported>> {
        let Some(plan) = self.chosen_plan() else {
            return Ok(None);
        };
        export(
            &self.model,
            plan,
            self.amax.as_ref(),
            &ExportOptions::default(),
        )
        .map(Some)
    }

    /// How to build the exported model with TensorRT 11 (strongly typed).
    pub fn deploy_lines(&self, written: &str) -> Vec<String> {
        vec![
            format!("trtexec --onnx={written} --stronglyTyped"),
            format!("polygraphy run {written} --trt --strongly-typed"),
        ]
    }

    /// The `--save-result` JSON.
    pub fn result_json(&self) -> Result<Vec<u8>> {
        let graph = &self.model.graph;
        let name = |i: usize| graph.nodes[i].name.as_str();
        let groups = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, (layers, formats))| GroupJson {
                name: self.group_name(g),
                layers: layers.iter().map(|&i| name(i)).collect(),
                formats,
                sensitivity: &self.front.sensitivity[g],
            })
            .collect();
        let front = self
            .front
            .points
            .iter()
            .zip(&self.plans)
            .enumerate()
            .map(|(index, (p, plan))| PointJson {
                index,
                layers: self
                    .groups
                    .iter()
                    .flat_map(|(l, _)| l.iter().map(|&i| (name(i), plan.layers[i])))
                    .collect(),
                cost: p.cost.by(self.objective),
                costs: p.cost,
                error: p.error,
                passed: p.passed,
                predicted_pass: p.predicted_pass,
                step: &p.step,
                summary: &p.summary,
                check: p.check.as_ref(),
            })
            .collect();
        let file = ResultJson {
            model: &self.model_name,
            target: &self.target,
            objective: self.objective,
            unit: self.objective.unit(),
            formats: &self.formats,
            high: self.high,
            fusion: self.fusion,
            fusion_regions: self
                .chosen_regions
                .iter()
                .map(|r| RegionJson {
                    name: &r.name,
                    precision: r.precision,
                    nodes: r.nodes.iter().map(|&i| name(i)).collect(),
                })
                .collect(),
            input_sets: self.input_sets,
            groups,
            front,
            chosen: self.front.chosen,
            verified: self.front.verified.as_ref().map(|e| e.passed),
            baselines: &self.baselines,
            evaluations: self.front.evaluations,
            interrupted: self.front.interrupted,
            log: &self.front.log,
        };
        // serde_json writes non-finite numbers as null.
        serde_json::to_vec_pretty(&file)
            .map_err(|e| Error::Invalid(format!("serializing the result: {e}")))
    }

    /// The HTML report: the front plotted (modeled cost against measured error, the chosen
    /// point ringed, failing points hollow, the uniform baselines as squares), then one row
    /// per decision group with its format at the chosen point and its sensitivities.
    pub fn html(&self) -> String {
        use crate::compare::html::esc;
        let (w, h, pad) = (640.0, 360.0, 48.0);
        let costs: Vec<f64> = self
            .front
            .points
            .iter()
            .map(|p| p.cost.by(self.objective))
            .collect();
        // Errors on a log axis (a required tolerance spans decades); 0 and non-finite at the
        // axis' ends.
        let errors: Vec<f64> = self
            .front
            .points
            .iter()
            .map(|p| p.error)
            .filter(|e| e.is_finite() && *e > 0.0)
            .collect();
        let (cmin, cmax) = costs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &c| {
                (a.min(c), b.max(c))
            });
        let (emin, emax) = errors
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &e| {
                (a.min(e), b.max(e))
            });
        let (emin, emax) = if errors.is_empty() {
            (1e-6, 1.0)
        } else {
            (emin, emax)
        };
        let (lmin, lmax) = (emin.log10() - 0.5, emax.log10() + 0.5);
        let x = |c: f64| {
            let span = (cmax - cmin).max(f64::MIN_POSITIVE);
            pad + (c - cmin) / span * (w - 2.0 * pad)
        };
        let y = |e: f64| {
            let l = if e.is_nan() || e == f64::INFINITY {
                lmax
            } else if e <= 0.0 {
                lmin
            } else {
                e.log10()
            };
            h - pad - (l - lmin) / (lmax - lmin) * (h - 2.0 * pad)
        };
        let mut svg = format!(
            "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' style='border:1px solid #ccc'>\n\
             <text x='{}' y='{}' text-anchor='middle'>modeled cost ({}, {})</text>\n\
             <text x='14' y='{}' transform='rotate(-90 14 {})' text-anchor='middle'>measured error (log)</text>\n",
            w / 2.0,
            h - 10.0,
            self.objective.name(),
            self.objective.unit(),
            h / 2.0,
            h / 2.0
        );
        // The walk's path; the baselines are squares off it.
        let is_baseline = |p: &FrontPoint| matches!(p.step, Step::Uniform { .. });
        let path: Vec<String> = self
            .front
            .points
            .iter()
            .filter(|p| !is_baseline(p))
            .map(|p| format!("{:.1},{:.1}", x(p.cost.by(self.objective)), y(p.error)))
            .collect();
        svg.push_str(&format!(
            "<polyline points='{}' fill='none' stroke='#999' stroke-dasharray='3,3'/>\n",
            path.join(" ")
        ));
        for (k, p) in self.front.points.iter().enumerate() {
            let (cx, cy) = (x(p.cost.by(self.objective)), y(p.error));
            let fill = if p.passed { "#2a7" } else { "none" };
            if !is_baseline(p) {
                svg.push_str(&format!(
                "<circle cx='{cx:.1}' cy='{cy:.1}' r='5' fill='{fill}' stroke='#2a7'><title>point {k}: cost {}, error {}, {}</title></circle>\n",
                fmt_g(p.cost.by(self.objective), 4),
                fmt_g(p.error, 3),
                if p.passed { "passed" } else { "failed" }
                ));
            }
            if Some(k) == self.front.chosen {
                svg.push_str(&format!(
                    "<circle cx='{cx:.1}' cy='{cy:.1}' r='10' fill='none' stroke='#d33' stroke-width='2'/>\n\
                     <text x='{:.1}' y='{:.1}' fill='#d33'>chosen</text>\n",
                    cx + 12.0,
                    cy - 8.0
                ));
            }
        }
        for b in &self.baselines {
            let (cx, cy) = (x(b.cost.by(self.objective)), y(b.error));
            svg.push_str(&format!(
                "<rect x='{:.1}' y='{:.1}' width='9' height='9' fill='{}' stroke='#36c'><title>all {}</title></rect>\n\
                 <text x='{:.1}' y='{:.1}' font-size='11' fill='#36c'>all {}</text>\n",
                cx - 4.5,
                cy - 4.5,
                if b.passed { "#36c" } else { "none" },
                b.format.name(),
                cx + 7.0,
                cy + 14.0,
                b.format.name()
            ));
        }
        // The criterion line: the largest error that passed and the smallest that failed
        // bound it (the criterion itself is per output and statistic).
        let passed_max = self
            .front
            .points
            .iter()
            .filter(|p| p.passed && p.error.is_finite())
            .map(|p| p.error)
            .fold(f64::NEG_INFINITY, f64::max);
        if passed_max.is_finite() && passed_max > 0.0 {
            let cy = y(passed_max);
            svg.push_str(&format!(
                "<line x1='{pad}' x2='{}' y1='{cy:.1}' y2='{cy:.1}' stroke='#d33' stroke-dasharray='6,3'/>\n\
                 <text x='{}' y='{:.1}' font-size='11' fill='#d33' text-anchor='end'>criterion (largest passing error)</text>\n",
                w - pad,
                w - pad,
                cy - 4.0
            ));
        }
        svg.push_str("</svg>");
        let mut rows = String::new();
        let plan = self.chosen_plan();
        for (g, (layers, formats)) in self.groups.iter().enumerate() {
            let sens: Vec<String> = self.front.sensitivity[g]
                .iter()
                .map(|s| {
                    format!(
                        "{}: {} {}",
                        s.format.name(),
                        fmt_g(s.error, 3),
                        if s.passed { "✓" } else { "✗" }
                    )
                })
                .collect();
            let names: Vec<String> = layers
                .iter()
                .map(|&i| esc(&self.model.graph.nodes[i].name))
                .collect();
            rows.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                names.join("<br>"),
                plan.map_or("—".to_string(), |p| p.layers[layers[0]]
                    .name()
                    .to_string()),
                formats
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(" → "),
                esc(&sens.join(", "))
            ));
        }
        let verdict = match self.front.chosen {
            Some(k) => format!(
                "Chosen: point {k}, {} {} (the cheapest point that passed, verified outside the cache).",
                fmt_g(self.front.points[k].cost.by(self.objective), 4),
                self.objective.unit()
            ),
            None => "No assignment meets the criterion.".to_string(),
        };
        format!(
            "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>mixprec plan: {model}</title>\n\
             <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}}</style></head><body>\n\
             <h1>mixprec plan: {model}</h1>\n<p>Target {target} ({source}); objective {objective}; formats {formats} (high {high}); fusion {fusion}; {points} front point(s), {evals} evaluation(s).</p>\n\
             <p>{verdict}</p>\n{svg}\n<h2>Layers</h2>\n<table><tr><th>layers (one decision)</th><th>chosen</th><th>formats, cheapest to safest</th><th>sensitivity (error alone)</th></tr>\n{rows}</table>\n</body></html>\n",
            model = esc(&self.model_name),
            target = esc(&self.target.name),
            source = esc(&self.target.source),
            objective = self.objective.name(),
            formats = self.formats.iter().map(|f| f.name()).collect::<Vec<_>>().join(","),
            high = self.high.name(),
            fusion = self.fusion.name(),
            points = self.front.points.len(),
            evals = self.front.evaluations,
        )
    }

    /// What was searched: groups, formats, objective, target and fusion model.
    pub fn summary_line(&self) -> String {
        let formats: Vec<&str> = self.formats.iter().map(|p| p.name()).collect();
        format!(
            "Plan: {} decision group(s), formats {} (high {}), objective {} on {}, fusion {}",
            self.groups.len(),
            formats.join(","),
            self.high.name(),
            self.objective.name(),
            self.target.name,
            self.fusion
        )
    }

    /// One line per front point: index, cost, verdict, how it was reached.
    pub fn front_lines(&self) -> Vec<String> {
        let unit = self.objective.unit();
        self.front
            .points
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let how = match &p.step {
                    Step::Uniform { format } => format!("all {}", format.name()),
                    Step::Start => "cheapest".to_string(),
                    Step::Raise { group, from, to } => {
                        format!(
                            "{}: {} → {}",
                            self.group_name(*group),
                            from.name(),
                            to.name()
                        )
                    }
                    Step::Repair { group, from, to } => format!(
                        "repair {}: {} → {}",
                        self.group_name(*group),
                        from.name(),
                        to.name()
                    ),
                    Step::Lower {
                        from,
                        lowered,
                        phase,
                    } => format!("point {from}, {lowered} group(s) lowered ({phase})"),
                };
                let check = match &p.check {
                    Some(c) if c.passed => "  check PASSED",
                    Some(_) => "  check FAILED",
                    None => "",
                };
                format!(
                    "{}{k:>3}  {:>10} {unit}  error {:>9}  {}{check}  {how}",
                    if Some(k) == self.front.chosen {
                        "*"
                    } else {
                        " "
                    },
                    fmt_g(p.cost.by(self.objective), 4),
                    fmt_g(p.error, 3),
                    if p.passed { "PASSED" } else { "FAILED" },
                )
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests;
