//! `mixprec debug precision` (and Polygraphy's older `mixprec precision bisect|linear|worst-first
//! --mode forward|reverse`): find the layers that must stay in higher precision.

use super::style::{paint, use_color, ColorChoice};
use anyhow::Result;
use clap::{Args, Subcommand, ValueEnum};
use mixprec::export::write_model;
use mixprec::jobs::debug_precision;
use mixprec::precision::fusion::FusionModel;
use mixprec::search::space::Found;
use mixprec::search::{Direction, Mode};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

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
    #[arg(long, default_value = "bisect", value_parser = args::modes())]
    mode: Mode,
    /// Where bisect/linear start marking: forward from the inputs, reverse from the outputs.
    #[arg(long, alias = "dir", default_value = "forward", value_parser = args::directions())]
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
    #[arg(long = "mode", default_value = "forward", value_parser = args::directions())]
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

mod args;
mod groups;
mod hooks;
mod plans;
mod qdq;
mod report;

pub use args::SearchArgs;
use hooks::CliHooks;

/// Set by Ctrl-C; the search stops between evaluations and reports the best plan so far.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// First Ctrl-C: stop after the current evaluation; a second one kills as usual
/// (SA_RESETHAND restores the default action once the handler ran).
fn install_interrupt_handler() {
    // SIGTERM too; running --check groups and data loaders are ended (docs/search.md).
    mixprec::process::install_stop_handler(&INTERRUPTED);
}

fn search_command(args: SearchArgs, mode: Mode, direction: Direction) -> Result<ExitCode> {
    args.data.check_trt_options()?;
    for (path, flag) in [
        (&args.output, "-o"),
        (&args.report, "--report"),
        (&args.save_result, "--save-result"),
    ] {
        if let Some(path) = path {
            mixprec::data::check_destination(path, flag)?;
        }
    }
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
    let qdq = outcome.is_qdq();
    let fused_note = if qdq || outcome.fusion.is_none() {
        String::new()
    } else {
        format!(" ({})", answer_label(outcome.fusion))
    };
    let mut written = None;
    // Exported only when written: the export converts every weight of the answer's model.
    let exported = match &args.output {
        Some(_) => outcome.export()?,
        None => None,
    };
    if let (Some(out), Some(exported)) = (&args.output, exported) {
        for n in &exported.notes {
            eprintln!("note: {n}");
        }
        write_model(out, &exported.model)?;
        match &outcome.last().run.found {
            Found::Qdq {
                answer: Some(a), ..
            } => out!(
                p,
                "[I] Saved the Q/DQ model without the answer's {} Q/DQ pair(s) and {} quantized weight(s) to {}",
                a.activations,
                a.weights,
                out.display()
            ),
            _ => out!(
                p,
                "[I] Saved mixed-precision model{fused_note} to {}",
                out.display()
            ),
        }
        written = Some(out.display().to_string());
    }
    if let Some(path) = &args.report {
        outcome.html().write(path)?;
        out!(p, "[I] Saved report{fused_note} to {}", path.display());
    }
    if let Some(path) = &args.save_result {
        mixprec::data::write_atomic(path, &outcome.result_json(written.as_deref())?)?;
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
