//! `mixprec debug precision` (and Polygraphy's older `mixprec precision bisect|linear|worst-first
//! --mode forward|reverse`): find the layers that must stay in higher precision.

use super::compare_args::CompareArgs;
use super::precision_args::PrecisionArgs;
use super::precision_args::{fusion_line, fusion_table};
use super::progress::print_event;
use super::run::DataArgs;
use super::style::{paint, use_color, ColorChoice};
use crate::compare::layerwise::LayerError;
use crate::compare::{fmt_g, Criterion};
use crate::event::Event;
use crate::exec::cache::parse_bytes;
use crate::exec::emulate::plan_regions;
use crate::export::{export, write_model, ExportOptions};
use crate::golden::GoldenFile;
use crate::inspect::si;
use crate::precision::fusion::FusionModel;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use crate::search::check::CheckOracle;
use crate::search::driver::{run_search, SearchHooks, SearchJob, SearchRun};
use crate::search::replay::{DebugReplay, ModelId};
use crate::search::report::{
    deploy_lines, html_report, names, percent, DeploySetup, ResultFile, SearchSetup, SearchStats,
};
use crate::search::{
    Direction, Mode, Objective, Outcome, Ranking, SearchOptions, SearchResult, SearchSpace, Trial,
};
use crate::{load_model, Graph, Interpreter};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
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

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

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
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as *const () as usize;
        sa.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// What decides a candidate's verdict, for debug replays: precisions, criterion, inputs,
/// golden outputs and the check command (not the strategy).
fn replay_settings(args: &SearchArgs) -> BTreeMap<String, String> {
    let pr = &args.precision;
    let d = &args.data;
    let c = &args.compare;
    let paths = |v: &[PathBuf]| {
        v.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let flags: Vec<&str> = [
        (pr.fp16, "--fp16"),
        (pr.bf16, "--bf16"),
        (pr.int8, "--int8"),
        (pr.fp8, "--fp8"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, f)| *f)
    .collect();
    let mut m = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        m.insert(k.to_string(), v);
    };
    put("precision", flags.join(" "));
    put("layer-precisions", pr.layer_precisions.join(" "));
    put("precision-constraints", pr.precision_constraints.clone());
    if pr.fusion != "none" {
        // Only then: replays saved before --fusion existed keep matching.
        put("fusion", pr.fusion.clone());
    }
    put("accumulate", pr.accumulate.clone());
    put(
        "calibration-cache",
        pr.calibration_cache
            .as_ref()
            .map_or_else(String::new, |p| p.display().to_string()),
    );
    put(
        "calibration",
        format!(
            "{} {} {:?} {:?}",
            pr.calib.calibration_algo.as_deref().unwrap_or(""),
            pr.calib.base_class.as_deref().unwrap_or(""),
            pr.calib.quantile,
            pr.calib.regression_cutoff
        )
        .trim()
        .to_string(),
    );
    put("precision (marked layers)", args.higher_precision.clone());
    put("atol", c.atol.join(" "));
    put("rtol", c.rtol.join(" "));
    put("check-error-stat", c.check_error_stat.join(" "));
    put("error-quantile", c.error_quantile.join(" "));
    put("metric", c.metric.join(" "));
    put(
        "golden",
        args.golden
            .as_ref()
            .map_or_else(String::new, |p| p.display().to_string()),
    );
    put(
        "inputs",
        format!(
            "val-range [{}] seed {:?} iterations {:?} input-shapes [{}] opt-shapes [{}] load-inputs [{}] data-loader-script {}",
            d.val_range.join(" "),
            d.seed,
            d.iterations,
            d.input_shapes.join(" "),
            d.trt.trt_opt_shapes.join(" "),
            paths(&d.load_inputs),
            d.data_loader_script.as_deref().unwrap_or("-")
        ),
    );
    put("check", args.check.join(" "));
    put("fail-regex", args.fail_regex.clone().unwrap_or_default());
    m
}

fn search_command(args: SearchArgs, mode: Mode, direction: Direction) -> Result<ExitCode> {
    args.data.check_trt_options()?;
    let p = &Printer::new(args.color);
    let criterion = args.compare.criterion()?;
    // A replay from another model or with other settings fails before any work.
    let replay = if args.load_debug_replay.is_some() || args.save_debug_replay.is_some() {
        let id = ModelId::of_file(&args.model)?;
        let settings = replay_settings(&args);
        Some(match &args.load_debug_replay {
            Some(path) => {
                let r = DebugReplay::load(path, &id, &settings)?;
                out!(
                    p,
                    "[I] Loaded debug replay {} ({} evaluation(s))",
                    path.display(),
                    r.evaluations.len()
                );
                r
            }
            None => DebugReplay::new(id, settings),
        })
    } else {
        None
    };
    let high = Precision::parse(&args.higher_precision)?;
    if !matches!(high, Precision::Float32 | Precision::Float16) {
        bail!(
            "--precision {}: marked layers run in float32 or float16",
            high.name()
        );
    }
    let any_precision =
        args.precision.fp16 || args.precision.bf16 || args.precision.int8 || args.precision.fp8;
    let budget = match args.cache_budget.trim() {
        "auto" => None,
        b => Some(parse_bytes(b).with_context(|| {
            format!(
                "--cache-budget '{}': expected auto or a size such as 512M or 4G",
                args.cache_budget
            )
        })?),
    };
    let fail_regex = match &args.fail_regex {
        Some(r) => Some(regex::Regex::new(r).with_context(|| format!("--fail-regex '{r}'"))?),
        None => None,
    };
    if args.check.is_empty()
        && (args.fail_regex.is_some()
            || args.check_timeout.is_some()
            || args.iter_artifact.is_some()
            || !args.artifacts.is_empty()
            || args.show_output
            || args.hide_fail_output)
    {
        bail!("--fail-regex, --check-timeout, --iter-artifact, --artifacts, --show-output and --hide-fail-output apply to --check, which is not given");
    }
    if args.jobs > 1 {
        // Commands running at the same time each work in their own directory; a file named
        // by an absolute path would be written by all of them.
        let absolute = args
            .iter_artifact
            .iter()
            .chain(&args.artifacts)
            .find(|p| p.is_absolute());
        if let Some(p) = absolute {
            bail!(
                "--jobs {}: {} is an absolute path, which every command running at once would write; give it relative to the command's working directory (each job has its own)",
                args.jobs,
                p.display()
            );
        }
    }
    let check_timeout = match args.check_timeout {
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => bail!("--check-timeout {s}: expected a positive number of seconds"),
        None => None,
    };
    let golden_file = match &args.golden {
        Some(p) => Some(GoldenFile::load(p)?),
        None => None,
    };
    let model = load_model(&args.model)?;
    let graph = &model.graph;
    // A Q/DQ model without a precision flag: search its quantized layers (docs/search.md,
    // "Searching a Q/DQ model").
    let qdq = crate::export::qdq::has_qdq(graph);
    if qdq && any_precision {
        bail!(
            "{} holds QuantizeLinear/DequantizeLinear nodes: it is already quantized, so --fp16/--bf16/--int8/--fp8 do not apply. \
             Two workflows: (1) leave the precision flags out to search which of its quantized layers must leave quantization \
             (they then run in --precision, float32 or float16; the rest stays as quantized); \
             (2) search precisions with the flags on the float model it was quantized from",
            args.model.display()
        );
    }
    if !qdq && !any_precision {
        bail!("enable at least one precision besides float32 to search over (--fp16, --bf16, --int8 or --fp8), or give a Q/DQ model to search its quantized layers");
    }
    if !qdq && high == Precision::Float16 && !args.precision.fp16 {
        bail!("--precision float16 needs --fp16 as well (e.g. --int8 --fp16 --precision float16)");
    }
    let feeds = args.data.feeds(graph)?;
    if qdq {
        return qdq::search(
            &args,
            p,
            qdq::Setup {
                model: &model,
                feeds: &feeds,
                criterion,
                high,
                mode,
                direction,
                replay,
                golden: golden_file.as_ref(),
                check: if args.check.is_empty() {
                    None
                } else {
                    Some((fail_regex, check_timeout))
                },
            },
        );
    }
    let interp = Interpreter::new(graph)?;
    let low = args.precision.plan(graph)?;
    if !args.check.is_empty() && !low.fusion.is_none() {
        bail!(
            "--fusion {} has no effect with --check: the command judges every candidate on its own engine (leave --fusion out)",
            low.fusion
        );
    }
    let amax = super::ranges::ranges_for_plan(&interp, &low, &args.precision, &feeds)?;
    let say = !args.quiet;

    let workdir;
    let check = if args.check.is_empty() {
        None
    } else {
        workdir = TempDir::new()?;
        Some(CheckOracle {
            model: &model,
            graph,
            low: low.clone(),
            high,
            amax: amax.as_ref(),
            command: args.check.clone(),
            fail_regex,
            timeout: check_timeout,
            workdir: workdir.0.clone(),
            jobs: args.jobs,
            verbose: args.verbose,
            evaluations: 0,
            iter_artifact: args.iter_artifact.clone().or_else(|| {
                (!args.check.iter().any(|a| a.contains("{model}")))
                    .then(|| PathBuf::from("polygraphy_debug.onnx"))
            }),
            keep_iter_artifact: args.no_remove_intermediate,
            artifacts: args.artifacts.clone(),
            artifacts_dir: args.artifacts_dir.clone(),
            artifact_stamp: super::run::polygraphy_stamp().replace(['/', ':'], "-"),
            show_output: args.show_output,
            hide_fail_output: args.hide_fail_output,
            events: Box::new(print_event),
        })
    };

    install_interrupt_handler();
    // With a fusion model, two searches: the answer without fusion (safe on any engine) and
    // the answer under the model; files (--output, --report, --save-debug-replay) follow the
    // second, --save-result holds both.
    let models: Vec<FusionModel> = if low.fusion.is_none() {
        vec![FusionModel::None]
    } else {
        vec![FusionModel::None, low.fusion]
    };
    let mut check = check;
    let mut replay = replay;
    let mut answers: Vec<(SearchRun, PrecisionPlan)> = Vec::new();
    let mut code = ExitCode::SUCCESS;
    for (k, &model_k) in models.iter().enumerate() {
        let last = k + 1 == models.len();
        let mut low_k = low.clone();
        low_k.fusion = model_k;
        if models.len() > 1 {
            out!(p, "[I] ==== {} ====", answer_label(model_k));
            let (regions, events) =
                plan_regions(graph, &low_k, &crate::exec::feed_shapes(&feeds[0]))?;
            if let Some(line) = fusion_line(graph, model_k, &regions) {
                out!(p, "[I] {line}, in the plan with no layer marked");
            }
            if args.verbose {
                print!("{}", fusion_table(graph, &regions));
                for e in events {
                    print_event(e);
                }
            }
        }
        let job = SearchJob {
            interp: &interp,
            feeds: &feeds,
            criterion: criterion.clone(),
            low: low_k.clone(),
            high,
            accumulate: args.precision.accumulator()?,
            amax: amax.as_ref(),
            cache_budget: budget,
            golden: golden_file.as_ref(),
            options: SearchOptions {
                mode,
                direction,
                objective: args.objective,
                ranking: args.ranking(),
                jobs: args.jobs,
            },
            check: if last { check.take() } else { None },
            replay: if last {
                replay.take().map(|r| (r, args.save_debug_replay.clone()))
            } else {
                None
            },
            layer_errors: args.report.is_some() && last,
            stop: &INTERRUPTED,
        };
        let mut hooks = CliHooks {
            p,
            args: &args,
            graph,
            feeds: feeds.len(),
            criterion: &criterion,
            high,
            mode,
            direction,
            say,
            bar: indicatif::ProgressBar::hidden(),
            best: None,
            qdq: false,
        };
        let run = run_search(job, &mut hooks)?;
        hooks.bar.finish_and_clear();
        code = report(
            p,
            &args,
            graph,
            &run.space,
            &low_k,
            high,
            direction,
            &run.result,
            &run.stats,
            (models.len() > 1).then_some(model_k),
            (&run.reasons, criterion.stat.default.name()),
        )?;
        answers.push((run, low_k));
        if INTERRUPTED.load(Ordering::SeqCst) {
            break;
        }
    }
    let (last_run, last_low) = answers.last().expect("at least one search ran");
    let SearchRun {
        space,
        result,
        stats,
        answer,
        layer_errors,
        reasons,
    } = last_run;
    let fused_note = if last_low.fusion.is_none() {
        String::new()
    } else {
        format!(" ({})", answer_label(last_low.fusion))
    };

    if let (Some(out), Some(plan)) = (&args.output, &answer) {
        let exported = export(
            &model,
            plan,
            amax.as_ref(),
            &ExportOptions {
                fallback: true,
                ..Default::default()
            },
        )?;
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
    if let Some(path) = &args.report {
        let html = html_report(
            &args.model.display().to_string(),
            graph,
            space,
            &criterion,
            high,
            mode,
            result,
            stats,
            layer_errors.as_deref(),
            reasons,
        );
        html.write(path)?;
        out!(p, "[I] Saved report{fused_note} to {}", path.display());
    }
    if let Some(path) = &args.save_result {
        let model_name = args.model.display().to_string();
        let files: Vec<ResultFile> = answers
            .iter()
            .map(|(run, low_k)| {
                let setup = SearchSetup {
                    model: &model_name,
                    mode,
                    direction,
                    objective: args.objective,
                    high,
                    low: low_k,
                };
                ResultFile::new(
                    &setup,
                    graph,
                    &run.space,
                    &run.result,
                    &run.stats,
                    &run.reasons,
                )
            })
            .collect();
        let mut files = files.into_iter();
        let mut file = files.next().expect("at least one search ran");
        file.with_fusion = files.next().map(Box::new);
        let json = serde_json::to_vec_pretty(&file).context("serializing the result")?;
        crate::data::write_atomic(path, &json)?;
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
    graph: &'a Graph,
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
        let (p, args, criterion, high) = (self.p, self.args, self.criterion, self.high);
        if self.say && self.qdq {
            out!(p,
                "[I] Q/DQ model: {} quantized layer(s) of {} are the candidates; a marked layer loses its input Q/DQ pairs and runs in {} | mode {}{} | {} input set(s)",
                space.candidates.len(),
                self.graph.nodes.len(),
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
                self.graph.nodes.len(),
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
            let line = trial_line(self.graph, t, space.total_flops(), self.args.verbose);
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

/// A temporary directory removed on drop (candidate models for --check).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let base = std::env::temp_dir();
        for k in 0..1000 {
            let p = base.join(format!("mixprec-check-{}-{k}", std::process::id()));
            if std::fs::create_dir(&p).is_ok() {
                return Ok(TempDir(p));
            }
        }
        bail!("cannot create a temporary directory in {}", base.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn trial_line(graph: &Graph, t: &Trial, total_flops: u64, verbose: bool) -> String {
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
        s.push_str(&format!("\n[V]     marked: {}", names(graph, &t.marked)));
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
        polygraphy_flags: precision_flags(&args.precision),
        trtexec_flags: trtexec_flags(&args.precision),
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
    let mut w: Vec<String> = Vec::new();
    if !PrecisionArgs::needs_ranges(answer) {
        return w;
    }
    let pr = &args.precision;
    if let Some(c) = &pr.calibration_cache {
        w.extend(["--calibration-cache".into(), c.display().to_string()]);
        return w;
    }
    let c = &pr.calib;
    if let Some(a) = &c.calibration_algo {
        w.extend(["--calibration-algo".into(), a.clone()]);
    }
    if let Some(b) = &c.base_class {
        w.extend(["--calibration-base-class".into(), b.clone()]);
    }
    if let Some(q) = c.quantile {
        w.extend(["--quantile".into(), q.to_string()]);
    }
    let d = &args.data;
    let mut many = |flag: &str, v: &[String]| {
        if !v.is_empty() {
            w.push(flag.to_string());
            w.extend(v.iter().cloned());
        }
    };
    many("--val-range", &d.val_range);
    many("--input-shapes", &d.input_shapes);
    many("--trt-opt-shapes", &d.trt.trt_opt_shapes);
    many(
        "--load-inputs",
        &d.load_inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>(),
    );
    if let Some(s) = d.seed {
        w.extend(["--seed".into(), s.to_string()]);
    }
    if let Some(n) = d.iterations {
        w.extend(["--iterations".into(), n.to_string()]);
    }
    if let Some(s) = &d.data_loader_script {
        w.extend(["--data-loader-script".into(), s.clone()]);
    }
    if let Some(f) = &d.data_loader_func_name {
        w.extend(["--data-loader-func-name".into(), f.clone()]);
    }
    w
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

/// The global precision flags as mixprec/Polygraphy spell them.
fn precision_flags(p: &PrecisionArgs) -> String {
    let mut f = Vec::new();
    if p.fp16 {
        f.push("--fp16");
    }
    if p.bf16 {
        f.push("--bf16");
    }
    if p.int8 {
        f.push("--int8");
    }
    if p.fp8 {
        f.push("--fp8");
    }
    let mut s = f.join(" ");
    if let Some(c) = &p.calibration_cache {
        s.push_str(&format!(" --calibration-cache {}", c.display()));
    }
    s
}

fn trtexec_flags(p: &PrecisionArgs) -> String {
    let mut f = Vec::new();
    if p.fp16 {
        f.push("--fp16".to_string());
    }
    if p.bf16 {
        f.push("--bf16".to_string());
    }
    if p.int8 {
        f.push("--int8".to_string());
        if let Some(c) = &p.calibration_cache {
            f.push(format!("--calib={}", c.display()));
        }
    }
    if p.fp8 {
        f.push("--fp8".to_string());
    }
    f.join(" ")
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
