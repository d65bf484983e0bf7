//! `debug precision` as a library job: which layers must stay in higher precision (a float
//! model with `--fp16/--bf16/--int8/--fp8`), or which quantized layers must leave quantization
//! (a Q/DQ model without them). A [`Config`] is validated once ([`Config::validate`]), run
//! by [`run`] to an [`Outcome`] that holds every search's answer and writes the files a user
//! asks for (`--save-result` JSON, the mixed-precision model, the HTML report). The CLI and
//! the Python package render the same outcome; the job reports through [`Hooks`].

pub use super::check::CheckOptions;
use super::check::{check_oracle, CheckLimits, TempDir};
pub use super::options::Inputs;
use super::options::{CompareOptions, PrecisionOptions};
use super::ranges::ranges_for_plan;
use crate::compare::html::HtmlReport;
use crate::compare::Criterion;
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::event::{Event, NoProgress, Progress};
use crate::exec::cache::parse_bytes;
use crate::exec::emulate::plan_regions;
use crate::export::qdq::QdqLayer;
use crate::export::{export, ExportOptions};
use crate::golden::GoldenFile;
use crate::onnx::Model;
use crate::precision::fusion::FusionModel;
use crate::precision::plan::{PrecisionPlan, ResolvedRegion};
use crate::precision::Precision;
use crate::search::builtin::UserCriterion;
use crate::search::check::CheckOracle;
use crate::search::driver::{run_search, SearchHooks, SearchJob, SearchRun};
use crate::search::plans::{plan_candidates, plan_decided, PlanSpace, PlanSpaceConfig};
use crate::search::qdq::{qdq_candidates, qdq_decided, QdqSpace, QdqSpaceConfig};
use crate::search::remote::{RemoteJudge, RemoteOracle};
use crate::search::replay::{DebugReplay, ModelId};
use crate::search::report::{html_report, QdqRemoved, QdqResult, ResultFile, SearchSetup};
use crate::search::space::Found;
use crate::search::{
    Direction, Grouping, Mode, Objective, Ranking, SearchOptions, SearchSpace, Trial,
};
use crate::tensor::Feeds;
use crate::{load_model, Interpreter};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// Golden outputs: a Polygraphy RunResults file, or outputs given in memory (one map per
/// input set).
#[derive(Clone, Debug)]
pub enum GoldenSource {
    File(PathBuf),
    Outputs(Vec<crate::golden::Outputs>),
}

/// Everything `debug precision` is asked to do, as the user gave it.
#[derive(Clone, Debug)]
pub struct Config {
    /// The ONNX model.
    pub model: PathBuf,
    pub inputs: Inputs,
    pub precision: PrecisionOptions,
    /// The precision marked layers run in (`--precision`): float32 or float16.
    pub higher_precision: String,
    pub mode: Mode,
    pub direction: Direction,
    pub objective: Objective,
    /// `--ranking`; None: sensitivity on a float model, growth on a Q/DQ model.
    pub ranking: Option<Ranking>,
    /// Candidates evaluated at the same time (`--jobs`).
    pub jobs: usize,
    /// Search roles first, then inside the needed ones (`--group roles`).
    pub group: Grouping,
    /// Golden outputs (`--golden`); None: the model's own FP32 run.
    pub golden: Option<GoldenSource>,
    pub compare: CompareOptions,
    /// A user criterion that decides every verdict instead of the tolerances (the Python
    /// API's `criterion=`); the tolerances still measure the error trials report.
    pub user_criterion: Option<UserCriterion>,
    /// `--cache-budget`: `auto` or a size such as `512M`.
    pub cache_budget: String,
    pub check: Option<CheckOptions>,
    pub load_debug_replay: Option<PathBuf>,
    pub save_debug_replay: Option<PathBuf>,
    /// Compute the answer's layer-wise errors (the HTML report's table).
    pub layer_errors: bool,
    /// Report each `--check` command and its output.
    pub verbose: bool,
    /// `--decode N`: every evaluation generates N tokens greedily from each input set's prompt
    /// (models with ONNX Runtime GenAI's names; [`crate::decode`]).
    pub decode: Option<usize>,
    /// Workers elsewhere that judge the candidates (the Python API's `executor=`,
    /// docs/scale-out.md); they run `check` themselves. The reference, the ranking, the
    /// answer's reasons and a fusion model's first search still run here.
    pub remote: Option<RemoteJudge>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            model: PathBuf::new(),
            inputs: Inputs::default(),
            precision: PrecisionOptions::default(),
            higher_precision: "float32".into(),
            mode: Mode::Bisect,
            direction: Direction::Forward,
            objective: Objective::Layers,
            ranking: None,
            jobs: 1,
            group: Grouping::None,
            golden: None,
            compare: CompareOptions::default(),
            user_criterion: None,
            cache_budget: "auto".into(),
            check: None,
            load_debug_replay: None,
            save_debug_replay: None,
            layer_errors: false,
            verbose: false,
            decode: None,
            remote: None,
        }
    }
}

/// A [`Config`] checked: every option parsed, every combination allowed.
pub struct Validated {
    pub config: Config,
    pub criterion: Criterion,
    pub high: Precision,
    pub cache_budget: Option<usize>,
    pub(crate) check_limits: CheckLimits,
}

impl Config {
    /// Parses and checks every option that needs no model; an error names the option.
    pub fn validate(self) -> Result<Validated> {
        let criterion = self.compare.criterion()?;
        let high = Precision::parse(&self.higher_precision)?;
        if !matches!(high, Precision::Float32 | Precision::Float16) {
            return Err(Error::Invalid(format!(
                "--precision {}: marked layers run in float32 or float16",
                high.name()
            )));
        }
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
        Ok(Validated {
            config: self,
            criterion,
            high,
            cache_budget,
            check_limits,
        })
    }

    /// What decides a candidate's verdict, for debug replays: precisions, criterion, inputs,
    /// golden outputs and the check command (not the strategy).
    pub fn replay_settings(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        self.precision.replay_settings(&mut put);
        put("precision (marked layers)", self.higher_precision.clone());
        let c = &self.compare;
        put("atol", c.atol.join(" "));
        put("rtol", c.rtol.join(" "));
        put("check-error-stat", c.check_error_stat.join(" "));
        put("error-quantile", c.error_quantile.join(" "));
        put("metric", c.metric.join(" "));
        if let Some(n) = self.decode {
            put("decode", n.to_string());
        }
        put(
            "golden",
            match &self.golden {
                None => String::new(),
                Some(GoldenSource::File(p)) => p.display().to_string(),
                Some(GoldenSource::Outputs(o)) => format!(
                    "in memory: {}",
                    digest(
                        o.iter()
                            .map(|v| v.iter().map(|(k, t)| (k.as_str(), t)).collect())
                            .collect()
                    )
                ),
            },
        );
        if self.user_criterion.is_some() {
            // A callback cannot be compared: only replays of callback searches match.
            put("criterion", "user callback".into());
        }
        put(
            "inputs",
            match &self.inputs {
                Inputs::Options(d) => d.replay_setting(),
                Inputs::Feeds(f) => format!(
                    "in memory: {}",
                    digest(
                        f.iter()
                            .map(|m| m.iter().map(|(k, t)| (k.as_str(), t)).collect())
                            .collect()
                    )
                ),
            },
        );
        let check = self.check.as_ref();
        put(
            "check",
            check.map_or_else(String::new, |c| match c.user {
                // A function cannot be compared: only replays of function checks match.
                Some(_) => "user function".into(),
                None => c.command.join(" "),
            }),
        );
        put(
            "fail-regex",
            check.and_then(|c| c.fail_regex.clone()).unwrap_or_default(),
        );
        m
    }

    /// The ranking worst-first and minimal use on a float model: `ranking`, by default
    /// sensitivity (a Q/DQ model's search ranks by growth).
    pub fn float_ranking(&self) -> Ranking {
        self.ranking.unwrap_or(Ranking::Sensitivity)
    }
}

/// FNV-1a over input sets' (or outputs') names, types, shapes and elements: in-memory data in
/// a replay's settings.
fn digest<'t>(sets: Vec<Vec<(&'t str, &'t crate::tensor::Tensor)>>) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for set in &sets {
        for (name, t) in set {
            eat(name.as_bytes());
            // The npy form holds the dtype, the shape and the elements.
            eat(&crate::data::npy::to_npy(t).unwrap_or_default());
        }
    }
    format!("{} set(s), fnv1a {h:016x}", sets.len())
}

impl GoldenSource {
    /// The golden outputs, read and checked.
    pub(crate) fn load(&self) -> Result<GoldenFile> {
        match self {
            GoldenSource::File(p) => GoldenFile::load(p),
            GoldenSource::Outputs(o) => golden_in_memory(o.clone()),
        }
    }
}

/// Golden outputs given in memory, checked as a golden file is.
fn golden_in_memory(outputs: Vec<crate::golden::Outputs>) -> Result<GoldenFile> {
    use crate::data::polygraphy::{IterationResult, RunResults};
    let runner = "golden".to_string();
    let iterations = outputs
        .into_iter()
        .map(|outputs| IterationResult {
            outputs,
            runtime: 0.0,
            runner_name: runner.clone(),
        })
        .collect();
    GoldenFile::new(
        std::path::Path::new("golden outputs (in memory)"),
        RunResults {
            runners: vec![(runner, iterations)],
        },
    )
}

/// How the job reports while it works, besides the search's own hooks.
pub trait Hooks: SearchHooks {
    /// The model is loaded (before its inputs are read).
    fn model_loaded(&mut self, _graph: &crate::Graph) {}
    /// The input sets are ready: how many.
    fn inputs_ready(&mut self, _sets: usize) {}
    /// Everything is prepared (model, inputs, plan, ranges); the search runs next, over a
    /// Q/DQ model's quantized layers (`qdq`) or a float model's layers. A caller that stops
    /// the search on Ctrl-C starts listening here.
    fn search_starting(&mut self, _qdq: bool) {}
    /// With a fusion model two searches run: the next is under `fusion`, whose plan with no
    /// layer marked has `regions` (`events`: notes of the region analysis).
    fn section(
        &mut self,
        _graph: &crate::Graph,
        _fusion: FusionModel,
        _regions: &[ResolvedRegion],
        _events: Vec<Event>,
    ) {
    }
    /// A search of `model` finished (with a fusion model, each of the two).
    fn finished(&mut self, _model: &Model, _search: &SearchPass) -> Result<()> {
        Ok(())
    }
    /// The calibration's progress (int8/fp8 plans calibrated on the fly).
    fn calibration_progress(&self) -> Box<dyn Progress + '_> {
        Box::new(NoProgress)
    }
}

/// One search: its run, the plan it started from (for a Q/DQ model, float32 everywhere: the
/// quantization is in the graph), and the fusion model it assumed: `Some` only when the job
/// was given one (a float model's two searches then say which each assumed; a Q/DQ model's
/// one search ran every candidate under it).
pub struct SearchPass {
    pub run: SearchRun,
    pub low: PrecisionPlan,
    pub fusion: Option<FusionModel>,
}

/// What `debug precision` found.
pub struct Outcome {
    pub model: Model,
    /// The model as the user named it.
    pub model_name: String,
    pub criterion: Criterion,
    pub high: Precision,
    pub mode: Mode,
    pub direction: Direction,
    pub objective: Objective,
    pub fusion: FusionModel,
    /// The searches that ran: one, or for a float model under a fusion model two (without
    /// fusion first). The last one's answer is the job's.
    pub searches: Vec<SearchPass>,
    /// The activation ranges int8/fp8 layers ran with (a float model's).
    pub amax: Option<BTreeMap<String, f32>>,
    /// Input sets the search ran on.
    pub input_sets: usize,
}

/// An exported model and the exporter's notes.
pub struct Exported {
    pub model: std::sync::Arc<crate::onnx::proto::ModelProto>,
    pub notes: Vec<String>,
}

impl Outcome {
    /// The search whose answer is the job's: the last (with fusion, the fused one).
    pub fn last(&self) -> &SearchPass {
        self.searches.last().expect("at least one search ran")
    }

    /// Whether the job searched a Q/DQ model's quantized layers.
    pub fn is_qdq(&self) -> bool {
        self.last().run.found.is_qdq()
    }

    /// The search's result, trials and statistics (the last search's).
    pub fn run_parts(
        &self,
    ) -> (
        &SearchSpace,
        &crate::search::SearchResult,
        &crate::search::report::SearchStats,
    ) {
        let r = &self.last().run;
        (&r.space, &r.result, &r.stats)
    }

    /// The answer's mixed-precision model (the Q/DQ model less the answer's pairs for a Q/DQ
    /// search); None when the search found no answer (or, for a Q/DQ search, was interrupted).
    pub fn export(&self) -> Result<Option<Exported>> {
        let run = &self.last().run;
        match &run.found {
            Found::Plans { answer, .. } => {
                let Some(plan) = answer else {
                    return Ok(None);
                };
                let exported = export(
                    &self.model,
                    plan,
                    self.amax.as_ref(),
                    &ExportOptions {
                        fallback: true,
                        ..Default::default()
                    },
                )?;
                Ok(Some(Exported {
                    model: std::sync::Arc::new(exported.model),
                    notes: exported.notes,
                }))
            }
            Found::Qdq { answer, .. } => {
                let found = matches!(run.result.outcome, crate::search::Outcome::Found(_));
                Ok(answer.as_ref().filter(|_| found).map(|a| Exported {
                    model: a.model.proto.clone(),
                    notes: a.notes.clone(),
                }))
            }
        }
    }

    /// The HTML report of the (last) search.
    pub fn html(&self) -> HtmlReport {
        let run = &self.last().run;
        let layer_errors = match &run.found {
            Found::Plans { layer_errors, .. } => layer_errors.as_deref(),
            Found::Qdq { .. } => None,
        };
        html_report(
            &self.model_name,
            &self.model.graph,
            &run.space,
            &self.criterion,
            self.high,
            self.mode,
            &run.result,
            &run.stats,
            layer_errors,
            run.found.layer_reasons(),
        )
    }

    /// The `--save-result` JSON; `written` is where the answer's model was written, if it was
    /// (a Q/DQ search's file names it).
    pub fn result_json(&self, written: Option<&str>) -> Result<Vec<u8>> {
        let graph = &self.model.graph;
        let mut files = self.searches.iter().map(|s| {
            let setup = SearchSetup {
                model: &self.model_name,
                mode: self.mode,
                direction: self.direction,
                objective: self.objective,
                high: self.high,
                low: &s.low,
            };
            let run = &s.run;
            let mut file = ResultFile::new(
                &setup,
                graph,
                &run.space,
                &run.result,
                &run.stats,
                run.found.layer_reasons(),
            );
            if let Found::Qdq {
                layers, reasons, ..
            } = &run.found
            {
                let quantized = run.space.candidates.len();
                file.low_precisions = vec![format!("{quantized} quantized")];
                // The answer leaves quantization: no --layer-precisions item applies.
                file.groups
                    .iter_mut()
                    .for_each(|g| g.layer_precisions = None);
                file.fusion = self.fusion.name();
                let marked: Vec<usize> = file.layers.iter().map(|l| l.index).collect();
                file.qdq = Some(QdqResult {
                    quantized_layers: quantized,
                    nodes_to_exclude: marked
                        .iter()
                        .map(|&i| graph.nodes[i].name.clone())
                        .collect(),
                    removed: qdq_removed(graph, layers, &marked),
                    stripped_model: written.map(str::to_string),
                    reasons: reasons.clone(),
                });
            }
            file
        });
        let mut file = files.next().expect("at least one search ran");
        file.with_fusion = files.next().map(Box::new);
        serde_json::to_vec_pretty(&file)
            .map_err(|e| Error::Invalid(format!("serializing the result: {e}")))
    }
}

/// Per layer of a Q/DQ answer: the pairs and quantized weights it no longer reads.
fn qdq_removed(graph: &crate::Graph, layers: &[QdqLayer], marked: &[usize]) -> Vec<QdqRemoved> {
    use crate::export::qdq::QdqKind;
    let mut removed = Vec::new();
    for &i in marked {
        let Some(l) = layers.iter().find(|l| l.node == i) else {
            continue;
        };
        let node = &graph.nodes[i];
        for q in &l.inputs {
            let (kind, quantize, reads) = match &q.kind {
                QdqKind::Activation { q, source } => (
                    "activation",
                    Some(graph.nodes[*q].name.clone()),
                    Some(source.clone()),
                ),
                QdqKind::Weight => ("weight", None, None),
            };
            removed.push(QdqRemoved {
                layer: node.name.clone(),
                input: node.inputs[q.slot].clone(),
                kind,
                quantize,
                dequantize: graph.nodes[q.dq].name.clone(),
                reads,
            });
        }
    }
    removed
}

/// Hooks shared by the search and the `--check` oracle's output (both report while the
/// search runs, never at the same moment).
struct Shared<'h>(RefCell<&'h mut dyn Hooks>);

impl SearchHooks for &Shared<'_> {
    fn event(&mut self, e: Event) {
        self.0.borrow_mut().event(e)
    }
    fn started(&mut self, space: &SearchSpace) {
        self.0.borrow_mut().started(space)
    }
    fn trial(&mut self, space: &SearchSpace, t: &Trial) {
        self.0.borrow_mut().trial(space, t)
    }
    fn log(&mut self, line: String) {
        self.0.borrow_mut().log(line)
    }
}

/// What a search works on, loaded and checked once: by the job, and by each of its remote
/// workers ([`super::search_worker`]).
pub(crate) struct Loaded {
    pub(crate) model: Model,
    pub(crate) golden: Option<GoldenFile>,
    pub(crate) feeds: Vec<Feeds>,
    pub(crate) decoder: Option<Decoder>,
    /// The search is over the model's quantized layers (a Q/DQ model without precision
    /// flags), not over precision plans.
    pub(crate) qdq: bool,
}

/// Loads the model, the golden outputs and the inputs, and decides which search runs.
pub(crate) fn load(config: &Config, high: Precision, hooks: &mut dyn Hooks) -> Result<Loaded> {
    let golden_file = config.golden.as_ref().map(GoldenSource::load).transpose()?;
    let model = load_model(&config.model)?;
    let graph = &model.graph;
    hooks.model_loaded(graph);
    // A Q/DQ model without a precision flag: search its quantized layers (docs/search.md,
    // "Searching a Q/DQ model"). Only activation Q/DQ pairs make a model Q/DQ-quantized
    // (export::qdq::is_qdq_quantized); a hybrid of integer ops and weight-only DQ runs its
    // float layers under the flags. Without flags a weight-only DQ model has only its weight
    // quantization to search: the Q/DQ search takes it, as before.
    let any_precision = config.precision.any_global();
    let qdq_quantized = crate::export::qdq::is_qdq_quantized(graph);
    let qdq = qdq_quantized || (!any_precision && crate::export::qdq::has_qdq(graph));
    if qdq_quantized && any_precision {
        return Err(Error::Invalid(format!(
            "{} holds QuantizeLinear→DequantizeLinear pairs on activations: it is already quantized, so --fp16/--bf16/--int8/--fp8 do not apply. \
             Two workflows: (1) leave the precision flags out to search which of its quantized layers must leave quantization \
             (they then run in --precision, float32 or float16; the rest stays as quantized); \
             (2) search precisions with the flags on the float model it was quantized from",
            config.model.display()
        )));
    }
    if !qdq && !any_precision {
        return Err(Error::Invalid("enable at least one precision besides float32 to search over (--fp16, --bf16, --int8 or --fp8), or give a Q/DQ model to search its quantized layers".into()));
    }
    if !qdq && high == Precision::Float16 && !config.precision.fp16 {
        return Err(Error::Invalid(
            "--precision float16 needs --fp16 as well (e.g. --int8 --fp16 --precision float16)"
                .into(),
        ));
    }
    let decoder = config.decode.map(|n| Decoder::new(graph, n)).transpose()?;
    if decoder.is_some() && qdq {
        return Err(Error::Invalid(
            "--decode searches a float model's precisions; a Q/DQ model's search does not generate yet".into(),
        ));
    }
    // A generation starts from each input set's prompt with an empty cache: the search's runs
    // of one step (reference, rankings, layer errors) see those feeds.
    let feeds = config
        .inputs
        .first_runs(graph, decoder.as_ref(), &mut |e| hooks.event(e))?;
    hooks.inputs_ready(feeds.len());
    Ok(Loaded {
        model,
        golden: golden_file,
        feeds,
        decoder,
        qdq,
    })
}

/// Runs `debug precision`; `stop` (Ctrl-C) ends the search between evaluations with the best
/// plan so far.
pub fn run(v: Validated, hooks: &mut dyn Hooks, stop: &AtomicBool) -> Result<Outcome> {
    let Validated {
        config,
        criterion,
        high,
        cache_budget,
        check_limits,
    } = v;
    // A replay from another model or with other settings fails before any work.
    let replay = if config.load_debug_replay.is_some() || config.save_debug_replay.is_some() {
        let id = ModelId::of_file(&config.model)?;
        let settings = config.replay_settings();
        Some(match &config.load_debug_replay {
            Some(path) => {
                let r = DebugReplay::load(path, &id, &settings)?;
                hooks.log(format!(
                    "[I] Loaded debug replay {} ({} evaluation(s))",
                    path.display(),
                    r.evaluations.len()
                ));
                r
            }
            None => DebugReplay::new(id, settings),
        })
    } else {
        None
    };
    let Loaded {
        model,
        golden: golden_file,
        feeds,
        decoder,
        qdq,
    } = load(&config, high, hooks)?;
    let graph = &model.graph;
    let with_check = config.check.is_some();
    let check_and_fusion = |fusion: FusionModel| {
        if with_check && !fusion.is_none() {
            return Err(Error::Invalid(format!(
                "--fusion {fusion} has no effect with --check: the command judges every candidate on its own engine (leave --fusion out)"
            )));
        }
        Ok(())
    };
    let fusion;
    let model_name = config.model.display().to_string();
    // With remote workers, they run the check.
    let workdir = if with_check && config.remote.is_none() {
        Some(TempDir::new()?)
    } else {
        None
    };
    let shared = Shared(RefCell::new(hooks));
    let make_check = |candidate, decided| {
        let (c, dir) = (config.check.as_ref()?, workdir.as_ref()?);
        Some(check_oracle(
            c,
            &check_limits,
            graph,
            high,
            candidate,
            decided,
            dir.0.clone(),
            config.jobs,
            config.verbose,
            Box::new(|e| shared.0.borrow_mut().event(e)),
        ))
    };
    let make_remote = || {
        config.remote.as_ref().map(|r| RemoteOracle {
            remote: r.0.clone(),
            graph,
            same_criterion: config.check.is_none(),
        })
    };
    let replay = replay.map(|r| (r, config.save_debug_replay.clone()));
    let options = |ranking| SearchOptions {
        mode: config.mode,
        direction: config.direction,
        objective: config.objective,
        ranking,
        jobs: config.jobs,
        group: config.group,
    };
    let (searches, amax) = if qdq {
        if !config.precision.layer_precisions.is_empty() {
            return Err(Error::Invalid("--layer-precisions sets the precisions of a float model's layers; on a Q/DQ model the search marks quantized layers (leave it out)".into()));
        }
        fusion = config.precision.fusion_model()?;
        if config.ranking == Some(Ranking::Sensitivity) {
            return Err(Error::Invalid(
                "--ranking sensitivity is not available for a Q/DQ model's search yet (each \
                 candidate there is a model of its own); its quantized layers are ranked by growth"
                    .into(),
            ));
        }
        check_and_fusion(fusion)?;
        shared.0.borrow_mut().search_starting(true);
        let mut space = QdqSpace::new(QdqSpaceConfig {
            model: &model,
            feeds: &feeds,
            criterion: criterion.clone(),
            user: config.user_criterion.clone(),
            high,
            fusion,
        })?;
        let job = SearchJob {
            graph,
            golden: golden_file.as_ref(),
            options: options(Ranking::Growth),
            check: match workdir {
                Some(_) => make_check(qdq_candidates(&model, high), qdq_decided(&model)?),
                None => None,
            },
            remote: make_remote(),
            replay,
            layer_errors: false,
            stop,
        };
        let search = SearchPass {
            run: run_search(&mut space, job, &mut &shared)?,
            low: PrecisionPlan::uniform(graph, Precision::Float32),
            fusion: (!fusion.is_none()).then_some(fusion),
        };
        shared.0.borrow_mut().finished(&model, &search)?;
        (vec![search], None)
    } else {
        let interp = Interpreter::new(graph)?;
        let low = config
            .precision
            .plan(graph, &mut |e| shared.0.borrow_mut().event(e))?;
        fusion = low.fusion;
        check_and_fusion(fusion)?;
        let amax = {
            let mut h = shared.0.borrow_mut();
            let progress = h.calibration_progress();
            let mut buffered = Vec::new();
            let amax = ranges_for_plan(
                &interp,
                &low,
                &config.precision,
                &feeds,
                &mut |e| buffered.push(e),
                progress.as_ref(),
            );
            drop(progress);
            for e in buffered {
                h.event(e);
            }
            amax?
        };
        shared.0.borrow_mut().search_starting(false);
        let searches = float_searches(
            &config,
            &model,
            &interp,
            &feeds,
            &criterion,
            high,
            low,
            amax.as_ref(),
            cache_budget,
            golden_file.as_ref(),
            |low| {
                let decided = plan_decided(graph, &low, high);
                make_check(plan_candidates(&model, low, high, amax.as_ref()), decided)
            },
            make_remote,
            replay,
            &shared,
            stop,
            decoder.as_ref(),
        )?;
        drop(interp);
        (searches, amax)
    };
    let input_sets = feeds.len();
    drop(workdir);
    Ok(Outcome {
        model,
        model_name,
        criterion,
        high,
        mode: config.mode,
        direction: config.direction,
        objective: config.objective,
        fusion,
        searches,
        amax,
        input_sets,
    })
}

/// The float searches: without fusion, and with a fusion model again under it; the check and
/// the replay judge the last one.
#[allow(clippy::too_many_arguments)]
fn float_searches<'a>(
    config: &Config,
    model: &Model,
    interp: &Interpreter<'_>,
    feeds: &[Feeds],
    criterion: &Criterion,
    high: Precision,
    low: PrecisionPlan,
    amax: Option<&BTreeMap<String, f32>>,
    cache_budget: Option<usize>,
    golden: Option<&GoldenFile>,
    make_check: impl Fn(PrecisionPlan) -> Option<CheckOracle<'a>>,
    make_remote: impl Fn() -> Option<RemoteOracle<'a>>,
    mut replay: Option<(DebugReplay, Option<PathBuf>)>,
    shared: &Shared<'_>,
    stop: &AtomicBool,
    decode: Option<&Decoder>,
) -> Result<Vec<SearchPass>> {
    let graph = interp.graph();
    let models: Vec<FusionModel> = if low.fusion.is_none() {
        vec![FusionModel::None]
    } else {
        vec![FusionModel::None, low.fusion]
    };
    let mut searches = Vec::new();
    for (k, &model_k) in models.iter().enumerate() {
        let last = k + 1 == models.len();
        let mut low_k = low.clone();
        low_k.fusion = model_k;
        if models.len() > 1 {
            let (regions, events) =
                plan_regions(graph, &low_k, &crate::exec::feed_shapes(&feeds[0]))?;
            shared
                .0
                .borrow_mut()
                .section(graph, model_k, &regions, events);
        }
        let mut space = PlanSpace::new(PlanSpaceConfig {
            interp,
            feeds,
            criterion: criterion.clone(),
            user: config.user_criterion.clone(),
            low: low_k.clone(),
            high,
            accumulate: config.precision.accumulator()?,
            amax,
            cache_budget,
            jobs: config.jobs,
            stop,
            decode,
        })?;
        let job = SearchJob {
            graph,
            golden,
            options: SearchOptions {
                mode: config.mode,
                direction: config.direction,
                objective: config.objective,
                ranking: config.float_ranking(),
                jobs: config.jobs,
                group: config.group,
            },
            check: if last { make_check(low.clone()) } else { None },
            remote: if last { make_remote() } else { None },
            replay: if last { replay.take() } else { None },
            layer_errors: config.layer_errors && last,
            stop,
        };
        let run = run_search(&mut space, job, &mut &*shared)?;
        if last {
            if let Found::Plans {
                answer: Some(plan), ..
            } = &run.found
            {
                for e in answer_weight_events(config, graph, plan, amax, feeds)? {
                    shared.0.borrow_mut().event(e);
                }
            }
        }
        let search = SearchPass {
            run,
            low: low_k,
            fusion: (models.len() > 1).then_some(model_k),
        };
        shared.0.borrow_mut().finished(model, &search)?;
        searches.push(search);
        if stop.load(Ordering::SeqCst) {
            break;
        }
    }
    Ok(searches)
}

/// Warnings for the weights the answer's float16 layers read clamped to float16's range, as
/// the exported model stores them ([`crate::exec::PreparedPlan::weight_events`]): once per
/// (weight, layer), for the plan the job answers and exports, where every trial's plan ran
/// under the same rule silently.
fn answer_weight_events(
    config: &Config,
    graph: &crate::Graph,
    plan: &PrecisionPlan,
    amax: Option<&BTreeMap<String, f32>>,
    feeds: &[Feeds],
) -> Result<Vec<Event>> {
    let shapes = feeds
        .first()
        .map(crate::exec::feed_shapes)
        .unwrap_or_default();
    Ok(config
        .precision
        .prepare(graph, plan, amax, &shapes)?
        .weight_events())
}
