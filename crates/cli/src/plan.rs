//! `mixprec plan`: the cheapest format per layer under an accuracy criterion and a cost model
//! (docs/plan.md).

use super::check_args::CheckArgs;
use super::compare_args::CompareArgs;
use super::precision_args::CalibAlgoArgs;
use super::progress::{print_event, Bar};
use super::run::DataArgs;
use anyhow::{bail, Result};
use clap::Args;
use mixprec::event::Event;
use mixprec::export::write_model;
use mixprec::jobs::debug_precision::GoldenSource;
use mixprec::jobs::options::Inputs;
use mixprec::jobs::plan;
use mixprec::precision::summary::{fusion_line, fusion_table};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The ONNX model (float32).
    model: PathBuf,
    /// The formats layers may take besides --high, comma-separated: fp8, int8, fp16, bf16.
    /// int8/fp8 apply to Conv/MatMul/Gemm layers; other layers take the float ones.
    #[arg(long, num_args = 1.., value_delimiter = ',', default_value = "fp8,int8,fp16")]
    formats: Vec<String>,
    /// The safest format, which the walk ends in: float32 (default), float16 or bfloat16.
    #[arg(long, default_value = "float32", value_name = "DTYPE")]
    high: String,
    /// What is minimized: latency (roofline on --target), bytes (moved per inference) or
    /// effective-bits (weight bits weighted by parameters, as ModelOpt's).
    #[arg(long, default_value = "latency", value_name = "OBJECTIVE")]
    objective: String,
    /// The GPU the cost model prices: h100, b200, or a JSON cost file (docs/plan.md).
    #[arg(long, default_value = "h100", value_name = "TARGET")]
    target: String,
    #[command(flatten)]
    data: DataArgs,
    /// Generate N tokens greedily through the KV cache from each input set's prompt
    /// (`input_ids`, from --load-inputs), as ONNX Runtime GenAI does, for models with its names;
    /// every point generates and is judged on `tokens` (and `logits` when a criterion names
    /// them), as in `debug precision --decode`.
    #[arg(long, value_name = "N")]
    decode: Option<usize>,
    /// Kernel fusion every point is emulated under: none (every layer rounds its outputs, as
    /// ONNX Runtime and TensorRT without fusion do: the default) or tensorrt (TensorRT's
    /// fusions, derived per point from its formats: values passed inside a fused kernel stay
    /// in f32; groups in different formats are never fused). Not with --check (docs/plan.md).
    #[arg(long, default_value = "none", value_name = "MODEL")]
    fusion: String,
    /// Golden outputs (Polygraphy RunResults JSON, e.g. from `polygraphy run --save-outputs` or
    /// `mixprec run --save-outputs`); default: mixprec's FP32 run on the same inputs.
    #[arg(long, alias = "load-outputs", value_name = "FILE")]
    golden: Option<PathBuf>,
    #[command(flatten)]
    compare: CompareArgs,
    /// TensorRT calibration cache for int8/fp8 ranges (read if it exists, else written).
    #[arg(long = "calibration-cache", value_name = "FILE")]
    calibration_cache: Option<PathBuf>,
    #[command(flatten)]
    calib: CalibAlgoArgs,
    /// Evaluations at the same time (the sensitivity pass and the baselines); the front is the
    /// same for any N.
    #[arg(long, short = 'j', default_value_t = 1, value_name = "N")]
    jobs: usize,
    /// Memory for cached layer outputs, e.g. 512M; auto (default). Never changes the answer.
    #[arg(long = "cache-budget", default_value = "auto", value_name = "SIZE")]
    cache_budget: String,
    /// Walk the front on to the safest assignment (for the whole cost-error curve); by
    /// default the walk stops at the first point that costs as much as the cheapest point
    /// that passed. Always on with --check.
    #[arg(long = "full-front")]
    full_front: bool,
    /// Write the chosen assignment as a strongly typed mixed-precision model.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Write the front, the chosen point and the uniform baselines as JSON.
    #[arg(long = "save-result", value_name = "FILE")]
    save_result: Option<PathBuf>,
    /// Write an HTML report: the front plotted (cost against error) and the per-layer table.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Price this mixed-precision model (another tool's Q/DQ or Casts, matched to MODEL's
    /// layers by node name) by the cost model instead of searching: its cost on --target by
    /// --objective, and its layers per format (docs/plan.md, "Pricing any mixed model").
    #[arg(long = "cost-of", value_name = "MIXED.onnx")]
    cost_of: Option<PathBuf>,
    /// Print every evaluation of the sensitivity pass and the walk (and --check commands
    /// with their output).
    #[arg(long, short = 'v')]
    verbose: bool,
    /// --check: a command judges the emulation's chosen point and its neighbours by cost
    /// (then safer points until one passes); the chosen point is the cheapest it passed
    /// (docs/plan.md). {model} is each point's strongly typed model.
    #[command(flatten)]
    check: CheckArgs,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn run(args: PlanArgs) -> Result<ExitCode> {
    args.data.check_trt_options()?;
    if let Some(mixed) = &args.cost_of {
        return cost_of(&args, mixed);
    }
    for (path, flag) in [
        (&args.output, "-o"),
        (&args.report, "--report"),
        (&args.save_result, "--save-result"),
    ] {
        if let Some(path) = path {
            mixprec::data::check_destination(path, flag)?;
        }
    }
    if args.output.as_ref() == Some(&args.model) {
        bail!(
            "{}: the output would overwrite the input model; choose another -o",
            args.model.display()
        );
    }
    let config = plan::Config {
        model: args.model.clone(),
        inputs: Inputs::Options(args.data.options()),
        formats: args.formats.clone(),
        high: args.high.clone(),
        objective: args.objective.clone(),
        target: args.target.clone(),
        golden: args.golden.clone().map(GoldenSource::File),
        compare: args.compare.options(),
        user_criterion: None,
        calibration_cache: args.calibration_cache.clone(),
        calib: args.calib.options(),
        jobs: args.jobs,
        cache_budget: args.cache_budget.clone(),
        check: args.check.options()?,
        verbose: args.verbose,
        decode: args.decode,
        full_front: args.full_front,
        fusion: args.fusion.clone(),
        remote: None,
    };
    let validated = config.validate()?;
    mixprec::process::install_stop_handler(&INTERRUPTED);
    let bar = Bar::calibration(std::io::stderr().is_terminal());
    let verbose = args.verbose;
    let mut events = |e: Event| match e {
        Event::Verbose(_) if !verbose => {}
        e => print_event(e),
    };
    let outcome = plan::run(validated, &mut events, &bar, &INTERRUPTED)?;
    print_outcome(&outcome, verbose);
    let Some(k) = outcome.front.chosen else {
        if outcome.front.points.iter().any(|p| p.check.is_some()) {
            bail!("the --check command passed none of the points it judged (above); nothing was written");
        }
        bail!(
            "no assignment meets the criterion: every point of the front above failed (the safest, all {}, too); nothing was written",
            outcome.high.name()
        );
    };
    let written = match &args.output {
        Some(path) => {
            let exported = outcome.export()?.expect("a point was chosen");
            write_model(path, &exported.model)?;
            for n in &exported.notes {
                println!("[W] {n}");
            }
            println!(
                "[I] Wrote {} (point {k}: {} Cast node(s), {} activation(s) and {} weight(s) quantized)",
                path.display(),
                exported.casts,
                exported.quantized_activations,
                exported.quantized_weights
            );
            Some(path.display().to_string())
        }
        None => None,
    };
    println!("[I] TensorRT 11 (strongly typed: the model's Casts and Q/DQ set every precision):");
    let name = written.unwrap_or_else(|| "model_mixed.onnx".into());
    if args.output.is_none() {
        println!("[I]   (write it with -o {name})");
    }
    for line in outcome.deploy_lines(&name) {
        println!("[I]   {line}");
    }
    if let Some(path) = &args.save_result {
        mixprec::data::write_atomic(path, &outcome.result_json()?)?;
        println!("[I] Saved the front to {}", path.display());
    }
    if let Some(path) = &args.report {
        mixprec::data::write_atomic(path, outcome.html().as_bytes())?;
        println!("[I] Wrote the report to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn print_outcome(o: &plan::Outcome, verbose: bool) {
    let f = &o.front;
    println!("[I] {}", o.summary_line());
    println!(
        "[I] Front ({} point(s): the uniform baselines, then the walk from the cheapest; * chosen):",
        f.points.len()
    );
    for line in o.front_lines() {
        println!("[I]   {line}");
    }
    for line in &f.log {
        println!("[I] {line}");
    }
    if f.interrupted {
        println!("[W] Interrupted: the front stops before the safest point");
    }
    if let (Some(k), Some(plan)) = (f.chosen, o.chosen_plan()) {
        let p = &f.points[k];
        println!(
            "[I] Chosen: point {k}, {} {} ({} reformat(s); effective bits {}), {}",
            mixprec::compare::fmt_g(o.cost_of(&p.cost), 4),
            o.objective.unit(),
            p.cost.reformats,
            mixprec::compare::fmt_g(p.cost.effective_bits, 4),
            if p.check.is_some() {
                "passed by --check"
            } else {
                "verified outside the cache"
            }
        );
        for (g, (layers, _)) in o.groups.iter().enumerate() {
            println!(
                "[I]   {:<40} {}",
                o.group_name(g),
                plan.layers[layers[0]].name()
            );
        }
        let graph = &o.model.graph;
        if let Some(line) = fusion_line(graph, o.fusion, &o.chosen_regions) {
            println!("[I] {line}");
            println!("[I] The exported model cannot state fusion (TensorRT fuses when it builds the engine): the chosen point's errors assume these regions");
            if verbose {
                print!("{}", fusion_table(graph, &o.chosen_regions));
            }
        }
    }
    println!("[I] {} evaluation(s)", f.evaluations);
}

/// `--cost-of`: the mixed model priced, one line per fact; `--save-result` writes it as JSON.
fn cost_of(args: &PlanArgs, mixed: &std::path::Path) -> Result<ExitCode> {
    if args.output.is_some() || args.report.is_some() {
        bail!("--cost-of prices a model and writes none: leave out -o and --report");
    }
    let fusion = mixprec::precision::fusion::FusionModel::parse(&args.fusion)?;
    if !fusion.is_none() {
        bail!("--fusion {fusion} has no effect with --cost-of: the cost model prices TensorRT's epilogue fusion whatever the emulation assumes (leave --fusion out)");
    }
    if let Some(path) = &args.save_result {
        mixprec::data::check_destination(path, "--save-result")?;
    }
    let config = mixprec::jobs::plan_cost::Config {
        model: args.model.clone(),
        mixed: mixed.to_path_buf(),
        inputs: Inputs::Options(args.data.options()),
        objective: args.objective.clone(),
        target: args.target.clone(),
    };
    let c = mixprec::jobs::plan_cost::run(&config, &mut print_event)?;
    let formats: Vec<String> = c.formats.iter().map(|(f, n)| format!("{f} {n}")).collect();
    println!(
        "[I] {} on {} ({}): {} {}",
        c.mixed,
        c.target,
        c.objective.name(),
        mixprec::compare::fmt_g(c.cost, 4),
        c.unit
    );
    println!(
        "[I]   latency {} us, {} bytes moved, effective bits {}, {} reformat(s)",
        mixprec::compare::fmt_g(c.costs.latency_us, 4),
        mixprec::compare::fmt_g(c.costs.bytes, 4),
        mixprec::compare::fmt_g(c.costs.effective_bits, 4),
        c.costs.reformats
    );
    println!("[I]   layers: {}", formats.join(", "));
    if let Some(path) = &args.save_result {
        std::fs::write(path, c.to_json()?)
            .map_err(|e| anyhow::anyhow!("{}: cannot write: {e}", path.display()))?;
        println!("[I] Wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
