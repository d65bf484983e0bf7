//! `mixprec debug precision` (and Polygraphy's older `mixprec precision bisect|linear|worst-first
//! --mode forward|reverse`): find the layers that must stay in higher precision.

use super::compare_args::CompareArgs;
use super::precision_args::PrecisionArgs;
use super::progress::print_event;
use super::run::DataArgs;
use super::style::{paint, use_color, ColorChoice};
use crate::compare::layerwise::LayerError;
use crate::compare::{fmt_g, Criterion};
use crate::event::Event;
use crate::export::write_model;
use crate::inspect::si;
use crate::jobs::debug_precision::{
    self, CheckOptions, Config, FloatSearch, GoldenSource, Hooks, Inputs, Searched,
};
use crate::jobs::options::PrecisionOptions;
use crate::precision::fusion::FusionModel;
use crate::precision::plan::ResolvedRegion;
use crate::precision::summary::{fusion_line, fusion_table};
use crate::precision::Precision;
use crate::search::driver::SearchHooks;
use crate::search::report::{deploy_lines, names, percent, DeploySetup, SearchStats};
use crate::search::{
    Direction, Mode, Objective, Outcome, Ranking, SearchResult, SearchSpace, Trial,
};
use crate::Graph;
use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

#[derive(Args, Debug)]
pub struct DebugArgs {
    #[command(subcommand)]
    command: DebugCommand,
}

#[derive(Subcommand, Debug)]
enum DebugCommand {
    /// Find which layers must run in higher precision for the outputs to stay accurate
    /// (Polygraphy's `debug precision`, on the emulator or driving a --check command).
    Precision(Box<DebugPrecisionArgs>),
}

#[derive(Args, Debug)]
pub struct DebugPrecisionArgs {
    /// bisect: binary search over the number of layers marked from one end; linear: one more
    /// layer at a time; worst-first: the N layers the ranking puts first (--ranking), N by
    /// binary search; minimal: a non-contiguous set (rank, bisect, then drop every layer that
    /// is not needed).
    #[arg(long, value_enum, default_value = "bisect")]
    mode: Mode,
    /// Where bisect/linear start marking: forward from the inputs, reverse from the outputs.
    #[arg(long, alias = "dir", value_enum, default_value = "forward")]
    direction: Direction,
    #[command(flatten)]
    search: SearchArgs,
}

/// Polygraphy's older spelling: `precision bisect MODEL --mode forward`.
#[derive(Args, Debug)]
pub struct LegacyPrecisionArgs {
    /// The strategy (what `debug precision --mode` says).
    #[arg(value_enum)]
    strategy: LegacyStrategy,
    /// The direction (what `debug precision --direction` says).
    #[arg(long = "mode", value_enum, default_value = "forward")]
    direction: Direction,
    #[command(flatten)]
    search: SearchArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LegacyStrategy {
    Bisect,
    Linear,
    WorstFirst,
    Minimal,
}

#[derive(Args, Debug)]
pub struct SearchArgs {
    /// The ONNX model.
    model: PathBuf,
    #[command(flatten)]
    data: DataArgs,
    #[command(flatten)]
    precision: PrecisionArgs,
    /// The precision marked layers run in.
    #[arg(
        long = "precision",
        short = 'p',
        default_value = "float32",
        value_name = "DTYPE"
    )]
    higher_precision: String,
    /// What a smaller answer means: fewer layers, or fewer FLOPs in high precision (minimal
    /// mode ranks and prunes by it; every mode reports both).
    #[arg(long, value_enum, default_value = "layers")]
    objective: Objective,
    /// What worst-first and minimal rank candidate layers by. sensitivity (default for a
    /// precision search): each layer alone in low precision, the rest in high, judged under
    /// the criterion (one partial run per candidate). growth: the error each layer adds to
    /// its inputs' in the all-low plan (one run; the default, and the only ranking, for a Q/DQ
    /// model's search).
    #[arg(long, value_enum, value_name = "RANKING")]
    ranking: Option<Ranking>,
    /// Candidates evaluated at the same time: besides the one the search needs next, the ones
    /// it would need after the likeliest verdicts (bisection probes, pruning groups); the
    /// sensitivity ranking's runs likewise. The answer and the trials are the same for any N;
    /// with --check each command runs in its own working directory. 1 (default): one at a time.
    #[arg(long, short = 'j', default_value_t = 1, value_name = "N", value_parser = parse_jobs)]
    jobs: usize,
    /// Golden outputs (Polygraphy RunResults JSON, e.g. from `polygraphy run --save-outputs` or
    /// `mixprec run --save-outputs`); default: mixprec's FP32 run on the same inputs.
    #[arg(long, alias = "load-outputs", value_name = "FILE")]
    golden: Option<PathBuf>,
    #[command(flatten)]
    compare: CompareArgs,
    /// Memory for cached layer outputs (incremental re-execution), e.g. 512M, 4G; 0 disables;
    /// auto (default): 1.25 times one FP32 run's values, at most 3 times what a plain run
    /// holds at once, within 1 MiB..2 GiB. Changes speed and memory, never the answer.
    #[arg(long = "cache-budget", default_value = "auto", value_name = "SIZE")]
    cache_budget: String,
    /// Judge each candidate with this command instead of the built-in comparison (must be the
    /// last option: everything after it belongs to the command). Placeholders: {model} (the
    /// candidate as a mixed-precision ONNX file, written for each candidate: TensorRT 11
    /// builds it as typed, `--check trtexec --onnx={model} --stronglyTyped`),
    /// {layer_precisions} (name:float32 items for polygraphy run --layer-precisions),
    /// {trtexec_layer_precisions} (name:fp32,... for TensorRT <= 10's trtexec
    /// --layerPrecisions=), {iteration}, {marked_count}. Exit status 0 = pass.
    #[arg(long, num_args = 1.., allow_hyphen_values = true, value_name = "CMD")]
    check: Vec<String>,
    /// With --check: a candidate also fails when the command's output matches this regex.
    #[arg(long = "fail-regex", value_name = "REGEX")]
    fail_regex: Option<String>,
    /// With --check: seconds before the command is killed and the candidate counted as failing.
    #[arg(long = "check-timeout", value_name = "SECS")]
    check_timeout: Option<f64>,
    /// With --check: where each candidate model is written (Polygraphy's iteration artifact);
    /// default `polygraphy_debug.onnx` when the command has no {model} placeholder.
    #[arg(
        long = "iter-artifact",
        alias = "intermediate-artifact",
        value_name = "FILE"
    )]
    iter_artifact: Option<PathBuf>,
    /// Keep the iteration artifact between candidates (by default it is removed after each).
    #[arg(long = "no-remove-intermediate")]
    no_remove_intermediate: bool,
    /// With --check: files the command writes, moved after each candidate into
    /// `<artifacts-dir>/good` or `/bad` with the start time and iteration in their name.
    #[arg(long, num_args = 1.., value_name = "FILE")]
    artifacts: Vec<PathBuf>,
    /// Where --artifacts are sorted (default polygraphy_artifacts).
    #[arg(
        long = "artifacts-dir",
        alias = "art-dir",
        default_value = "polygraphy_artifacts",
        value_name = "DIR"
    )]
    artifacts_dir: PathBuf,
    /// Write the verdict of every evaluated candidate to this JSON file after each evaluation
    /// (Polygraphy's debug replay), so an interrupted search can resume.
    #[arg(long = "save-debug-replay", value_name = "FILE")]
    save_debug_replay: Option<PathBuf>,
    /// Resume from a debug replay: candidates it holds are not evaluated again (the model and
    /// the settings that decide a verdict must be the same; the mode may differ). Give the
    /// same file to --save-debug-replay to keep recording into it.
    #[arg(long = "load-debug-replay", value_name = "FILE")]
    load_debug_replay: Option<PathBuf>,
    /// Print the --check command's output for passing candidates too.
    #[arg(long = "show-output", conflicts_with = "hide_fail_output")]
    show_output: bool,
    /// Do not print the --check command's output for failing candidates (printed by default).
    #[arg(long = "hide-fail-output")]
    hide_fail_output: bool,
    /// Write the answer as a mixed-precision ONNX model (as `mixprec convert` would).
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    /// Write the result and the search history (every candidate: layers, error, verdict) as JSON.
    #[arg(long = "save-result", value_name = "FILE")]
    save_result: Option<PathBuf>,
    /// Write an HTML report: the answer, the search history (every candidate's error and
    /// verdict) and the layer-wise error of the final plan.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Print only the result (no per-iteration lines, no progress bar).
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Colour the log: auto (when printing to a terminal and NO_COLOR is not set), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    color: ColorChoice,
    /// Print the marked layers of every iteration (and --check commands with their output).
    #[arg(long, short = 'v')]
    verbose: bool,
}

impl SearchArgs {
    /// The ranking worst-first and minimal use on a float model: `--ranking`, by default
    /// sensitivity (a Q/DQ model's search ranks by growth: `cli/debug/qdq.rs`).
    fn ranking(&self) -> Ranking {
        self.ranking.unwrap_or(Ranking::Sensitivity)
    }
}

pub fn run(args: DebugArgs) -> Result<ExitCode> {
    match args.command {
        DebugCommand::Precision(a) => search_command(a.search, a.mode, a.direction),
    }
}

pub fn run_legacy(args: LegacyPrecisionArgs) -> Result<ExitCode> {
    let mode = match args.strategy {
        LegacyStrategy::Bisect => Mode::Bisect,
        LegacyStrategy::Linear => Mode::Linear,
        LegacyStrategy::WorstFirst => Mode::WorstFirst,
        LegacyStrategy::Minimal => Mode::Minimal,
    };
    search_command(args.search, mode, args.direction)
}

/// Prints log lines, coloured as `run` colours them when stdout is a terminal (or --color).
struct Printer {
    color: bool,
}

impl Printer {
    fn new(choice: ColorChoice) -> Printer {
        let no_color = std::env::var("NO_COLOR").ok();
        Printer {
            color: use_color(choice, std::io::stdout().is_terminal(), no_color.as_deref()),
        }
    }

    fn line(&self, line: &str) {
        if self.color {
            println!("{}", paint(line));
        } else {
            println!("{line}");
        }
    }
}

macro_rules! out {
    ($p:expr, $($t:tt)*) => {
        $p.line(&format!($($t)*))
    };
}

mod qdq;

/// Set by Ctrl-C; the search stops between evaluations and reports the best plan so far.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// First Ctrl-C: stop after the current evaluation; a second one kills as usual
/// (SA_RESETHAND restores the default action once the handler ran).
/// `--jobs`: a whole number of at least 1.
fn parse_jobs(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "'{s}' is not a number of jobs (a whole number, at least 1)"
        )),
    }
}

fn install_interrupt_handler() {
    // SIGTERM too; running --check groups and data loaders are ended (docs/search.md).
    crate::process::install_stop_handler(&INTERRUPTED);
}

impl SearchArgs {
    /// The job's configuration; flags that apply to `--check` only are refused without it.
    fn config(&self, mode: Mode, direction: Direction) -> Result<Config> {
        let check = if self.check.is_empty() {
            if self.fail_regex.is_some()
                || self.check_timeout.is_some()
                || self.iter_artifact.is_some()
                || !self.artifacts.is_empty()
                || self.show_output
                || self.hide_fail_output
            {
                bail!("--fail-regex, --check-timeout, --iter-artifact, --artifacts, --show-output and --hide-fail-output apply to --check, which is not given");
            }
            None
        } else {
            Some(CheckOptions {
                command: self.check.clone(),
                fail_regex: self.fail_regex.clone(),
                timeout: self.check_timeout,
                iter_artifact: self.iter_artifact.clone(),
                keep_iter_artifact: self.no_remove_intermediate,
                artifacts: self.artifacts.clone(),
                artifacts_dir: self.artifacts_dir.clone(),
                show_output: self.show_output,
                hide_fail_output: self.hide_fail_output,
            })
        };
        Ok(Config {
            model: self.model.clone(),
            inputs: Inputs::Options(self.data.options()),
            precision: self.precision.options(),
            higher_precision: self.higher_precision.clone(),
            mode,
            direction,
            objective: self.objective,
            ranking: self.ranking,
            jobs: self.jobs,
            golden: self.golden.clone().map(GoldenSource::File),
            compare: self.compare.options(),
            user_criterion: None,
            cache_budget: self.cache_budget.clone(),
            check,
            load_debug_replay: self.load_debug_replay.clone(),
            save_debug_replay: self.save_debug_replay.clone(),
            layer_errors: self.report.is_some(),
            verbose: self.verbose,
        })
    }
}

fn search_command(args: SearchArgs, mode: Mode, direction: Direction) -> Result<ExitCode> {
    args.data.check_trt_options()?;
    let p = &Printer::new(args.color);
    let config = args.config(mode, direction)?.validate()?;
    let (criterion, high) = (config.criterion.clone(), config.high);
    let mut hooks = CliHooks {
        p,
        args: &args,
        layers: Vec::new(),
        feeds: 0,
        criterion: &criterion,
        high,
        mode,
        direction,
        say: !args.quiet,
        bar: indicatif::ProgressBar::hidden(),
        best: None,
        qdq: false,
        code: ExitCode::SUCCESS,
    };
    let outcome = debug_precision::run(config, &mut hooks, &INTERRUPTED)?;
    hooks.bar.finish_and_clear();
    let code = hooks.code;
    if let Searched::Qdq(run) = &outcome.searched {
        return qdq::finish(&args, p, &outcome, run);
    }
    let fused_note = if outcome.fusion.is_none() {
        String::new()
    } else {
        format!(" ({})", answer_label(outcome.fusion))
    };
    if let Some(out) = &args.output {
        if let Some(exported) = outcome.export()? {
            for n in &exported.notes {
                eprintln!("note: {n}");
            }
            write_model(out, &exported.model)?;
            out!(
                p,
                "[I] Saved mixed-precision model{fused_note} to {}",
                out.display()
            );
        }
    }
    if let Some(path) = &args.report {
        outcome.html().write(path)?;
        out!(p, "[I] Saved report{fused_note} to {}", path.display());
    }
    if let Some(path) = &args.save_result {
        crate::data::write_atomic(path, &outcome.result_json(None)?)?;
        out!(p, "[I] Saved result to {}", path.display());
    }
    Ok(code)
}

/// What an answer under a fusion model is called in the output.
fn answer_label(model: FusionModel) -> &'static str {
    match model {
        FusionModel::None => {
            "Answer safe on any engine (no fusion: ONNX Runtime, PyTorch eager, TensorRT without fusion)"
        }
        FusionModel::TensorRt => "Answer with TensorRT fusion (--fusion tensorrt)",
    }
}

/// How `debug precision` shows a running search: the header once the search space is known,
/// a line per evaluation (and a spinner on a terminal), events on stderr.
struct CliHooks<'a> {
    p: &'a Printer,
    args: &'a SearchArgs,
    /// The model's layer names, by node index.
    layers: Vec<String>,
    feeds: usize,
    criterion: &'a Criterion,
    high: Precision,
    mode: Mode,
    direction: Direction,
    say: bool,
    bar: indicatif::ProgressBar,
    best: Option<usize>,
    /// Searching a Q/DQ model's quantized layers.
    qdq: bool,
    /// The exit code of the last search's report.
    code: ExitCode,
}

impl Hooks for CliHooks<'_> {
    fn model_loaded(&mut self, graph: &Graph) {
        self.layers = graph.nodes.iter().map(|n| n.name.clone()).collect();
    }

    fn inputs_ready(&mut self, sets: usize) {
        self.feeds = sets;
    }

    fn search_starting(&mut self, qdq: bool) {
        self.qdq = qdq;
        install_interrupt_handler();
    }

    fn section(
        &mut self,
        graph: &Graph,
        fusion: FusionModel,
        regions: &[ResolvedRegion],
        events: Vec<Event>,
    ) {
        let p = self.p;
        out!(p, "[I] ==== {} ====", answer_label(fusion));
        if let Some(line) = fusion_line(graph, fusion, regions) {
            out!(p, "[I] {line}, in the plan with no layer marked");
        }
        if self.args.verbose {
            print!("{}", fusion_table(graph, regions));
            for e in events {
                print_event(e);
            }
        }
    }

    fn finished(&mut self, graph: &Graph, s: &FloatSearch) -> crate::Result<()> {
        self.bar.finish_and_clear();
        self.bar = indicatif::ProgressBar::hidden();
        self.code = report(
            self.p,
            self.args,
            graph,
            &s.run.space,
            &s.low,
            self.high,
            self.direction,
            &s.run.result,
            &s.run.stats,
            s.fusion,
            (&s.run.reasons, self.criterion.stat.default.name()),
        )
        .map_err(|e| crate::Error::Invalid(format!("{e:#}")))?;
        Ok(())
    }

    fn calibration_progress(&self) -> Box<dyn crate::event::Progress + '_> {
        Box::new(super::progress::Bar::calibration(
            std::io::stderr().is_terminal(),
        ))
    }
}

impl SearchHooks for CliHooks<'_> {
    fn event(&mut self, e: Event) {
        self.bar.suspend(|| print_event(e));
    }

    fn log(&mut self, line: String) {
        let p = self.p;
        self.bar.suspend(|| out!(p, "{line}"));
    }

    fn started(&mut self, space: &SearchSpace) {
        self.best = None;
        let (p, args, criterion, high) = (self.p, self.args, self.criterion, self.high);
        if self.say && self.qdq {
            out!(p,
                "[I] Q/DQ model: {} quantized layer(s) of {} are the candidates; a marked layer loses its input Q/DQ pairs and runs in {} | mode {}{} | {} input set(s)",
                space.candidates.len(),
                self.layers.len(),
                high.name(),
                self.mode.name(),
                if self.mode.is_contiguous() {
                    match self.direction {
                        Direction::Forward => ", forward",
                        Direction::Reverse => ", reverse",
                    }
                } else {
                    ""
                },
                self.feeds
            );
        }
        if self.say && !self.qdq {
            out!(p,
                "[I] Using {} as higher precision | mode {}{} | {} candidate layer(s) of {} (data-movement layers and layers already in {} are not candidates) | {} input set(s)",
                high.name(),
                self.mode.name(),
                if self.mode.is_contiguous() {
                    format!(
                        ", {}",
                        match self.direction {
                            Direction::Forward => "forward",
                            Direction::Reverse => "reverse",
                        }
                    )
                } else {
                    String::new()
                },
                space.candidates.len(),
                self.layers.len(),
                high.name(),
                self.feeds
            );
        }
        if self.say {
            out!(
                p,
                "[I] Pass criterion: {}{}",
                if args.check.is_empty() {
                    format!(
                        "{} error within atol {} or rtol {}",
                        criterion.stat.default.name(),
                        crate::compare::fmt_g(criterion.atol.default, 5),
                        crate::compare::fmt_g(criterion.rtol.default, 5),
                    )
                } else {
                    format!("--check {}", args.check.join(" "))
                },
                if criterion.metrics.is_empty() || !args.check.is_empty() {
                    String::new()
                } else {
                    format!(
                        " and {}",
                        criterion
                            .metrics
                            .iter()
                            .map(|m| m.kind.label())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            );
        }
        if self.say && std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new_spinner();
            b.set_style(
                indicatif::ProgressStyle::with_template("{spinner} [{elapsed}] {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            self.bar = b;
        }
    }

    fn trial(&mut self, space: &SearchSpace, t: &Trial) {
        if t.passed {
            self.best = Some(self.best.map_or(t.marked.len(), |b| b.min(t.marked.len())));
        }
        self.bar.set_message(format!(
            "iteration {} | best so far: {}",
            t.iteration,
            self.best
                .map_or("none".to_string(), |b| format!("{b} layer(s)"))
        ));
        if self.say {
            let line = trial_line(&self.layers, t, space.total_flops(), self.args.verbose);
            let p = self.p;
            self.bar.suspend(|| out!(p, "{line}"));
        }
        // The deferred ranking runs next (by sensitivity about half an inference per candidate):
        // say so, or a long ranking looks like a stalled search.
        if t.phase == "check-none" && !t.passed && space.deferred && self.mode.needs_ranking() {
            let n = space.candidates.len();
            let ranking = self.args.ranking();
            self.bar.set_message(format!(
                "ranking {n} candidate layer(s) by {}",
                ranking.name()
            ));
            if self.say && ranking == Ranking::Sensitivity {
                let p = self.p;
                self.bar.suspend(|| {
                    out!(p,
                        "[I] Ranking {n} candidate layer(s) by sensitivity: each alone in low precision, judged under the criterion (emulated)"
                    )
                });
            }
        }
    }
}

fn trial_line(layers: &[String], t: &Trial, total_flops: u64, verbose: bool) -> String {
    let mut s = format!(
        "[{}] Iteration {:>3} ({}) | {} layer(s) in high precision ({}FLOP, {}) | {} | {}",
        if t.passed { "I" } else { "W" },
        t.iteration,
        t.phase,
        t.marked.len(),
        si(t.marked_flops),
        percent(t.marked_flops, total_flops),
        if t.passed { "PASSED" } else { "FAILED" },
        t.summary
    );
    if verbose {
        let marked: Vec<&str> = t.marked.iter().map(|&i| layers[i].as_str()).collect();
        s.push_str(&format!("\n[V]     marked: {}", marked.join(", ")));
    }
    s
}

/// Prints the outcome; returns the exit code.
#[allow(clippy::too_many_arguments)]
fn report(
    p: &Printer,
    args: &SearchArgs,
    graph: &Graph,
    space: &SearchSpace,
    low: &crate::precision::plan::PrecisionPlan,
    high: Precision,
    direction: Direction,
    result: &SearchResult,
    stats: &SearchStats,
    fusion: Option<FusionModel>,
    (reasons, stat): (&[LayerError], &str),
) -> Result<ExitCode> {
    let (marked, interrupted) = match &result.outcome {
        Outcome::Found(m) => (m.clone(), false),
        Outcome::Interrupted(Some(m)) => (m.clone(), true),
        Outcome::Interrupted(None) => {
            out!(
                p,
                "[W] Interrupted after {} evaluation(s), before any candidate passed",
                result.trials.len()
            );
            return Ok(ExitCode::from(130));
        }
        Outcome::NothingNeeded => {
            out!(p,
                "[I] The plan with every candidate layer in low precision already passes: no layer needs {}",
                high.name()
            );
            print_stats(p, stats, graph);
            return Ok(ExitCode::SUCCESS);
        }
        Outcome::ReferenceFails => {
            let why = result
                .trials
                .first()
                .map(|t| t.summary.as_str())
                .unwrap_or("");
            let advice = if high == Precision::Float32 {
                "the golden outputs or the tolerances are wrong for this model".to_string()
            } else {
                format!(
                    "{} is not enough for this model (try --precision float32), or the golden outputs or the tolerances are wrong",
                    high.name()
                )
            };
            out!(
                p,
                "[E] Even with all {} candidate layer(s) in {} the criterion fails ({why}): {advice}",
                space.candidates.len(),
                high.name()
            );
            return Ok(ExitCode::FAILURE);
        }
        Outcome::NotFound => {
            out!(
                p,
                "[E] Could not find a configuration that satisfied accuracy requirements."
            );
            print_stats(p, stats, graph);
            return Ok(ExitCode::FAILURE);
        }
    };
    if interrupted {
        out!(
            p,
            "[W] Interrupted after {} evaluation(s); the best passing plan so far:",
            result.trials.len()
        );
    }
    let model = args.model.display();
    match (result.contiguous_count, interrupted) {
        (Some(n), false) => out!(p,
            "[I] To achieve acceptable accuracy, try running the {} {n} layer(s) in higher precision ({})",
            match direction {
                Direction::Forward => "first",
                Direction::Reverse => "last",
            },
            high.name()
        ),
        _ => out!(p,
            "[I] To achieve acceptable accuracy, try running these {} layer(s) in higher precision ({})",
            marked.len(),
            high.name()
        ),
    }
    if let Some(f) = fusion {
        out!(
            p,
            "[I]     This answer is {}",
            match f {
                FusionModel::None => "safe on any engine (it assumes no fusion)",
                FusionModel::TensorRt => "for TensorRT with its fusions (--fusion tensorrt)",
            }
        );
    }
    out!(p, "[I]     Layers: {}", names(graph, &marked));
    print_reasons(p, reasons, stat);
    let f = space.flops_of(&marked);
    out!(
        p,
        "[I]     In {}: {} of {} candidate layers ({}), {}FLOP of {}FLOP ({})",
        high.name(),
        marked.len(),
        space.candidates.len(),
        percent(marked.len() as u64, space.candidates.len() as u64),
        si(f),
        si(space.total_flops()),
        percent(f, space.total_flops())
    );
    if let Some(t) = result.trial_of(&marked) {
        out!(p, "[I]     Achieved: {}", t.summary);
    }
    let answer = low.marking(&marked, high);
    let written = args.output.as_ref().map(|o| o.display().to_string());
    let setup = DeploySetup {
        model: &model.to_string(),
        graph,
        flags: args.precision.global(),
        answer: &answer,
        marked: &marked,
        high,
        // -o writes only a finished answer's model, and with fusion the fused answer's.
        written: written
            .as_deref()
            .filter(|_| !interrupted && fusion.is_none_or(|f| !f.is_none())),
        convert_extra: convert_extra(args, &answer, fusion),
        polygraphy_flags: args.precision.options().flags(),
        trtexec_flags: args.precision.options().trtexec_flags(),
    };
    for line in deploy_lines(&setup)? {
        out!(p, "[I]     {line}");
    }
    print_stats(p, stats, graph);
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// Why each layer of the answer is needed: its error alone in low precision and the cause.
fn print_reasons(p: &Printer, reasons: &[LayerError], stat: &str) {
    if reasons.is_empty() {
        return;
    }
    out!(
        p,
        "[I]     Why: each layer alone back in its low precision, the rest as answered (emulated, first input set):"
    );
    for r in reasons {
        out!(
            p,
            "[I]       {} ({}, {}): {} | {stat} abs {}, growth {} | {}",
            r.layer,
            r.op,
            r.precision.map_or("carried", |p| p.name()),
            r.cause.name(),
            fmt_g(r.required_atol, 5),
            fmt_g(r.growth, 5),
            r.reason()
        );
    }
}

/// What `mixprec convert` needs besides the precisions: `--fusion` for a fused answer (the file
/// is the same; convert then prints the regions the answer assumed) and the calibration.
fn convert_extra(
    args: &SearchArgs,
    answer: &crate::precision::plan::PrecisionPlan,
    fusion: Option<FusionModel>,
) -> Vec<String> {
    let mut w = match fusion {
        Some(f) if !f.is_none() => vec!["--fusion".to_string(), f.to_string()],
        _ => Vec::new(),
    };
    w.extend(convert_calibration(args, answer));
    w
}

/// What `mixprec convert` needs to write the answer's model exactly as `-o` would: for int8/fp8
/// layers the same activation ranges, read from the calibration cache the search read or wrote,
/// or calibrated again on the same inputs with the same algorithm.
fn convert_calibration(
    args: &SearchArgs,
    answer: &crate::precision::plan::PrecisionPlan,
) -> Vec<String> {
    if !PrecisionOptions::needs_ranges(answer) {
        return Vec::new();
    }
    args.precision
        .options()
        .calibration_flags(Some(&args.data.options()))
}

fn print_stats(p: &Printer, s: &SearchStats, graph: &Graph) {
    let ahead = match s.speculative_evaluations {
        0 => String::new(),
        n => format!(" (+{n} evaluated ahead and not needed)"),
    };
    out!(p,
        "[I] Search: {} evaluation(s){ahead}{}, {} layer executions ({} without the incremental cache: {:.2}x), {:.2}s = {:.1}x one FP32 inference ({:.1} ms)",
        s.evaluations,
        crate::search::report::ranked_note(s),
        s.layer_executions,
        s.layer_executions_without_cache,
        s.layer_executions as f64 / s.layer_executions_without_cache.max(1) as f64,
        s.wall_seconds,
        s.wall_seconds / s.fp32_inference_seconds.max(1e-9),
        s.fp32_inference_seconds * 1e3
    );
    let c = &s.contradictions;
    if c.any() {
        let mut evidence = Vec::new();
        if c.failing_supersets > 0 {
            let example = c.example.map_or(String::new(), |(f, p)| {
                format!(" (iteration {f} fails although it marks every layer of iteration {p}, which passes)")
            });
            evidence.push(format!(
                "{} failing evaluation(s) marked every layer of a passing one, and more{example}",
                c.failing_supersets
            ));
        }
        if c.failing_alone > 0 {
            let example = c.failing_alone_example.map_or(String::new(), |(l, p)| {
                format!(
                    " ({} fails alone, yet iteration {p} passes with it and more in low precision)",
                    graph.nodes[l].name
                )
            });
            evidence.push(format!(
                "{} layer(s) failed the criterion alone in low precision in the ranking, yet a passing evaluation leaves them low{example}",
                c.failing_alone
            ));
        }
        out!(p,
            "[W] The criterion is not monotone on this model: {}. Which layers the search answers depends on its path, and it takes more evaluations; a tolerance further from the low precision's rounding noise, or a task-level --metric, gives steadier answers",
            evidence.join("; ")
        );
    }
}

// The search's choices as clap values (the library's enums know nothing of clap).
impl ValueEnum for Mode {
    fn value_variants<'a>() -> &'a [Self] {
        &[Mode::Bisect, Mode::Linear, Mode::WorstFirst, Mode::Minimal]
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

impl ValueEnum for Direction {
    fn value_variants<'a>() -> &'a [Self] {
        &[Direction::Forward, Direction::Reverse]
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(match self {
            Direction::Forward => "forward",
            Direction::Reverse => "reverse",
        }))
    }
}

impl ValueEnum for Ranking {
    fn value_variants<'a>() -> &'a [Self] {
        &[Ranking::Sensitivity, Ranking::Growth]
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(match self {
            Ranking::Sensitivity => clap::builder::PossibleValue::new("sensitivity")
                .help("Each layer alone in low precision, judged under the criterion"),
            Ranking::Growth => clap::builder::PossibleValue::new("growth")
                .help("The error each layer adds in the all-low plan (one run)"),
        })
    }
}

impl ValueEnum for Objective {
    fn value_variants<'a>() -> &'a [Self] {
        &[Objective::Layers, Objective::Flops]
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(match self {
            Objective::Layers => {
                clap::builder::PossibleValue::new("layers").help("Fewest layers in high precision")
            }
            Objective::Flops => {
                clap::builder::PossibleValue::new("flops").help("Fewest FLOPs in high precision")
            }
        })
    }
}
