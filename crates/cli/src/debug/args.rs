//! `debug precision`'s search options and their validation into the job's config.

use crate::check_args::CheckArgs;
use crate::compare_args::CompareArgs;
use crate::precision_args::PrecisionArgs;
use crate::run::DataArgs;
use crate::style::ColorChoice;
use anyhow::Result;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::Args;
use mixprec::jobs::debug_precision::{Config, GoldenSource, Inputs};
use mixprec::search::{Direction, Grouping, Mode, Objective, Ranking};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SearchArgs {
    /// The ONNX model.
    pub(super) model: PathBuf,
    #[command(flatten)]
    pub(super) data: DataArgs,
    #[command(flatten)]
    pub(super) precision: PrecisionArgs,
    /// The precision marked layers run in.
    #[arg(
        long = "precision",
        short = 'p',
        default_value = "float32",
        value_name = "DTYPE"
    )]
    pub(super) higher_precision: String,
    /// What a smaller answer means: fewer layers, or fewer FLOPs in high precision (minimal
    /// mode ranks and prunes by it; every mode reports both).
    #[arg(long, default_value = "layers", value_parser = objectives())]
    pub(super) objective: Objective,
    /// What worst-first and minimal rank candidate layers by. sensitivity (default for a
    /// precision search): each layer alone in low precision, the rest in high, judged under
    /// the criterion (one partial run per candidate). growth: the error each layer adds to
    /// its inputs' in the all-low plan (one run; the default, and the only ranking, for a Q/DQ
    /// model's search).
    #[arg(long, value_name = "RANKING", value_parser = rankings())]
    pub(super) ranking: Option<Ranking>,
    /// roles: layers that play the same role in repeated blocks (the name with the block
    /// index abstracted, the same op and shapes) are one candidate first; the search then
    /// refines inside the roles it needs. none (default): every layer is a candidate.
    #[arg(long, default_value = "none", value_name = "GROUPING", value_parser = groupings())]
    pub(super) group: Grouping,
    /// Candidates evaluated at the same time: besides the one the search needs next, the ones
    /// it would need after the likeliest verdicts (bisection probes, pruning groups); the
    /// sensitivity ranking's runs likewise. The answer and the trials are the same for any N;
    /// with --check each command runs in its own working directory. 1 (default): one at a time.
    #[arg(long, short = 'j', default_value_t = 1, value_name = "N", value_parser = parse_jobs)]
    pub(super) jobs: usize,
    /// Golden outputs (Polygraphy RunResults JSON, e.g. from `polygraphy run --save-outputs` or
    /// `mixprec run --save-outputs`); default: mixprec's FP32 run on the same inputs.
    #[arg(long, alias = "load-outputs", value_name = "FILE")]
    pub(super) golden: Option<PathBuf>,
    #[command(flatten)]
    pub(super) compare: CompareArgs,
    /// Memory for cached layer outputs (incremental re-execution), e.g. 512M, 4G; 0 disables;
    /// auto (default): 1.25 times one FP32 run's values, at most 3 times what a plain run
    /// holds at once, within 1 MiB..2 GiB. Changes speed and memory, never the answer.
    #[arg(long = "cache-budget", default_value = "auto", value_name = "SIZE")]
    pub(super) cache_budget: String,
    /// Generate N tokens greedily through the KV cache from each input set's prompt
    /// (`input_ids`, from --load-inputs), as ONNX Runtime GenAI does, for models with its names
    /// (past_key_values.* / present.*, logits). Every candidate generates; the outputs compared are `tokens` [batch, N] and
    /// `logits` [batch, N, vocab] (each step's last position); see docs/search.md: the tokens are judged, the logits when a criterion names them.
    #[arg(long, value_name = "N")]
    pub(super) decode: Option<usize>,
    /// --check judges each candidate instead of the built-in comparison.
    #[command(flatten)]
    pub(super) check: CheckArgs,
    /// Write the verdict of every evaluated candidate to this JSON file after each evaluation
    /// (Polygraphy's debug replay), so an interrupted search can resume.
    #[arg(long = "save-debug-replay", value_name = "FILE")]
    pub(super) save_debug_replay: Option<PathBuf>,
    /// Resume from a debug replay: candidates it holds are not evaluated again (the model and
    /// the settings that decide a verdict must be the same; the mode may differ). Give the
    /// same file to --save-debug-replay to keep recording into it.
    #[arg(long = "load-debug-replay", value_name = "FILE")]
    pub(super) load_debug_replay: Option<PathBuf>,
    /// Write the answer as a mixed-precision ONNX model (as `mixprec convert` would).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub(super) output: Option<PathBuf>,
    /// Write the result and the search history (every candidate: layers, error, verdict) as JSON.
    #[arg(long = "save-result", value_name = "FILE")]
    pub(super) save_result: Option<PathBuf>,
    /// Write an HTML report: the answer, the search history (every candidate's error and
    /// verdict) and the layer-wise error of the final plan.
    #[arg(long, value_name = "FILE")]
    pub(super) report: Option<PathBuf>,
    /// Print only the result (no per-iteration lines, no progress bar).
    #[arg(long, short = 'q')]
    pub(super) quiet: bool,
    /// Colour the log: auto (when printing to a terminal and NO_COLOR is not set), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    pub(super) color: ColorChoice,
    /// Print the marked layers of every iteration (and --check commands with their output).
    #[arg(long, short = 'v')]
    pub(super) verbose: bool,
}

impl SearchArgs {
    /// The ranking worst-first and minimal use on a float model: `--ranking`, by default
    /// sensitivity (a Q/DQ model's search ranks by growth: `cli/debug/qdq.rs`).
    pub(super) fn ranking(&self) -> Ranking {
        self.ranking.unwrap_or(Ranking::Sensitivity)
    }
}

/// `--jobs`: a whole number of at least 1.
fn parse_jobs(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "'{s}' is not a number of jobs (a whole number, at least 1)"
        )),
    }
}

impl SearchArgs {
    /// The job's configuration; flags that apply to `--check` only are refused without it.
    pub(super) fn config(&self, mode: Mode, direction: Direction) -> Result<Config> {
        let check = self.check.options()?;
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
            group: self.group,
            golden: self.golden.clone().map(GoldenSource::File),
            compare: self.compare.options(),
            user_criterion: None,
            cache_budget: self.cache_budget.clone(),
            check,
            load_debug_replay: self.load_debug_replay.clone(),
            save_debug_replay: self.save_debug_replay.clone(),
            layer_errors: self.report.is_some(),
            verbose: self.verbose,
            decode: self.decode,
            remote: None,
        })
    }
}

/// A clap parser for one of the library's enums (which know nothing of clap): its values by
/// name, each with its help, mapped back to the enum.
fn choice<T: Copy + Send + Sync + 'static>(
    values: &'static [(T, &'static str, &'static str)],
) -> impl TypedValueParser<Value = T> {
    let possible = values.iter().map(|&(_, name, help)| {
        let p = PossibleValue::new(name);
        if help.is_empty() {
            p
        } else {
            p.help(help)
        }
    });
    PossibleValuesParser::new(possible).map(move |name| {
        values
            .iter()
            .find(|v| v.1 == name)
            .expect("clap accepts only the listed names")
            .0
    })
}

pub(super) fn modes() -> impl TypedValueParser<Value = Mode> {
    choice(&[
        (Mode::Bisect, "bisect", ""),
        (Mode::Linear, "linear", ""),
        (Mode::WorstFirst, "worst-first", ""),
        (Mode::Minimal, "minimal", ""),
    ])
}

pub(super) fn directions() -> impl TypedValueParser<Value = Direction> {
    choice(&[
        (Direction::Forward, "forward", ""),
        (Direction::Reverse, "reverse", ""),
    ])
}

fn rankings() -> impl TypedValueParser<Value = Ranking> {
    choice(&[
        (
            Ranking::Sensitivity,
            "sensitivity",
            "Each layer alone in low precision, judged under the criterion",
        ),
        (
            Ranking::Growth,
            "growth",
            "The error each layer adds in the all-low plan (one run)",
        ),
    ])
}

fn groupings() -> impl TypedValueParser<Value = Grouping> {
    choice(&[
        (Grouping::None, "none", "Every layer is a candidate"),
        (
            Grouping::Roles,
            "roles",
            "Each role of repeated blocks one candidate, then refined inside",
        ),
    ])
}

fn objectives() -> impl TypedValueParser<Value = Objective> {
    choice(&[
        (
            Objective::Layers,
            "layers",
            "Fewest layers in high precision",
        ),
        (Objective::Flops, "flops", "Fewest FLOPs in high precision"),
    ])
}
