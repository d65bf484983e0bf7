//! `mixprec run`: FP32 inference with Polygraphy's data options, saving and comparing outputs.

use super::precision_args::{precision_counts_line, precision_table, PrecisionArgs};
use crate::compare::{compare_output, fmt_g, Criterion, ErrorStat, PerOutput};
use crate::data::loader::{self, DataLoaderConfig};
use crate::data::npz;
use crate::data::polygraphy::{self, IterationResult, RunResults};
use crate::exec::Feeds;
use crate::tensor::fmt_shape;
use crate::{load_model, Interpreter};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Where inputs come from: Polygraphy's data-loader options.
#[derive(Args, Debug, Clone)]
pub struct DataArgs {
    /// Value range of generated inputs: `name:[lo,hi]` per input, or `[lo,hi]` for all (default [0,1]).
    #[arg(long = "val-range", num_args = 1.., value_name = "RANGE")]
    pub val_range: Vec<String>,
    /// Seed of the input generator (Polygraphy's default is 1).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Number of generated input sets.
    #[arg(long, default_value_t = 1)]
    pub iterations: usize,
    /// Shapes for inputs with dynamic dimensions: `name:[1,3,224,224]`.
    #[arg(long = "input-shapes", num_args = 1.., value_name = "SHAPE")]
    pub input_shapes: Vec<String>,
    /// Load inputs instead of generating them: Polygraphy JSON (a list of feed dicts) or `.npz`.
    #[arg(long = "load-inputs", num_args = 1.., value_name = "FILE")]
    pub load_inputs: Vec<PathBuf>,
}

impl DataArgs {
    /// The input sets: loaded, or generated from the model's declared inputs.
    pub fn feeds(&self, graph: &crate::Graph) -> Result<Vec<Feeds>> {
        if !self.load_inputs.is_empty() {
            let mut all = Vec::new();
            for p in &self.load_inputs {
                if is_npz(p) {
                    all.push(npz::read_npz(p)?.into_iter().collect());
                } else {
                    all.extend(polygraphy::load_inputs(p)?);
                }
            }
            return Ok(all);
        }
        let mut cfg = DataLoaderConfig::default();
        if let Some(s) = self.seed {
            cfg.seed = s;
        }
        cfg.iterations = self.iterations.max(1);
        for r in &self.val_range {
            loader::parse_val_range_into(r, &mut cfg.val_ranges)?;
        }
        for s in &self.input_shapes {
            cfg.input_shapes.extend(loader::parse_input_shapes(s)?);
        }
        let (feeds, warnings) = loader::generate(&graph.inputs, &cfg)?;
        for w in warnings {
            eprintln!("warning: {w}");
        }
        Ok(feeds)
    }
}

fn is_npz(p: &Path) -> bool {
    p.extension().is_some_and(|e| e.eq_ignore_ascii_case("npz"))
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The ONNX model.
    model: PathBuf,
    #[command(flatten)]
    data: DataArgs,
    /// Save the inputs used: Polygraphy JSON (loadable by `polygraphy run --load-inputs`) or `.npz`.
    #[arg(long = "save-inputs", value_name = "FILE")]
    save_inputs: Option<PathBuf>,
    /// Save the outputs as a Polygraphy RunResults JSON (loadable by `polygraphy run --load-outputs`).
    #[arg(long = "save-outputs", alias = "save-results", value_name = "FILE")]
    save_outputs: Option<PathBuf>,
    /// Compare the outputs against golden outputs from this RunResults JSON (e.g. `polygraphy run --save-outputs`).
    #[arg(long = "load-outputs", alias = "load-results", value_name = "FILE")]
    load_outputs: Option<PathBuf>,
    /// Absolute tolerance: a value, or `output:value` per output (default 1e-5).
    #[arg(long, num_args = 1.., value_name = "TOL")]
    atol: Vec<String>,
    /// Relative tolerance: a value, or `output:value` per output (default 1e-5).
    #[arg(long, num_args = 1.., value_name = "TOL")]
    rtol: Vec<String>,
    /// Statistic checked against the tolerances: elemwise, max, mean, median (or `output:stat`).
    #[arg(long = "check-error-stat", num_args = 1.., value_name = "STAT")]
    check_error_stat: Vec<String>,
    /// Name of the runner in saved RunResults (default: mixprec-<precision>-runner).
    #[arg(long = "runner-name")]
    runner_name: Option<String>,
    #[command(flatten)]
    precision: PrecisionArgs,
    /// Print the precision every layer ran in.
    #[arg(long, short = 'v')]
    verbose: bool,
}

pub fn run(args: RunArgs) -> Result<ExitCode> {
    let criterion = Criterion {
        atol: PerOutput::parse_list(&args.atol, 1e-5, "--atol", |s| s.parse().ok())?,
        rtol: PerOutput::parse_list(&args.rtol, 1e-5, "--rtol", |s| s.parse().ok())?,
        stat: PerOutput::parse_list(
            &args.check_error_stat,
            ErrorStat::Elemwise,
            "--check-error-stat",
            |s| ErrorStat::parse(s).ok(),
        )?,
    };
    // Read the golden file first: a bad file should fail before a long run.
    let golden = match &args.load_outputs {
        Some(p) => Some(polygraphy::load_run_results(p)?),
        None => None,
    };
    let model = load_model(&args.model)?;
    let graph = &model.graph;
    let feeds = args.data.feeds(graph)?;
    let interp = Interpreter::new(graph)?;
    let prepared = if args.precision.any() {
        let plan = args.precision.plan(graph)?;
        let amax = super::ranges::ranges_for_plan(&interp, &plan, &args.precision, &feeds)?;
        println!("[I] {}", precision_counts_line(graph, &plan));
        if args.verbose {
            print!("{}", precision_table(graph, &plan));
        }
        Some(args.precision.prepare(graph, &plan, amax.as_ref())?)
    } else {
        None
    };
    let runner_name = args.runner_name.clone().unwrap_or_else(|| {
        format!(
            "mixprec-{}-runner",
            if args.precision.any() {
                args.precision.global().low_precision().name()
            } else {
                "fp32"
            }
        )
    });

    let mut iterations = Vec::with_capacity(feeds.len());
    let mut total = 0.0;
    for f in &feeds {
        let start = Instant::now();
        let result = match &prepared {
            Some(p) => interp.run_plan(f, &Default::default(), p)?,
            None => interp.run(f)?,
        };
        let secs = start.elapsed().as_secs_f64();
        total += secs;
        iterations.push(IterationResult {
            outputs: result.outputs,
            runtime: secs,
            runner_name: runner_name.clone(),
        });
    }
    println!(
        "[I] {} | Completed {} iteration(s) in {} ms | Average inference time: {} ms.",
        runner_name,
        iterations.len(),
        fmt_g(total * 1e3, 4),
        fmt_g(total * 1e3 / iterations.len().max(1) as f64, 4)
    );
    if let Some(it) = iterations.first() {
        for (name, t) in &it.outputs {
            println!(
                "[I]     output '{name}' (dtype={}, shape={})",
                t.dtype(),
                fmt_shape(t.shape())
            );
        }
    }

    if let Some(p) = &args.save_inputs {
        if is_npz(p) {
            if feeds.len() != 1 {
                bail!(
                    "{}: .npz holds one input set, but there are {} (use a .json file)",
                    p.display(),
                    feeds.len()
                );
            }
            let items: Vec<_> = feeds[0]
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            npz::write_npz(p, &items)?;
        } else {
            polygraphy::save_inputs(p, &feeds)?;
        }
        println!("[I] Saved inputs to {}", p.display());
    }
    let results = RunResults {
        runners: vec![(runner_name.clone(), iterations)],
    };
    if let Some(p) = &args.save_outputs {
        polygraphy::save_run_results(p, &results)?;
        println!("[I] Saved outputs to {}", p.display());
    }

    let Some(golden) = golden else {
        return Ok(ExitCode::SUCCESS);
    };
    let path = args.load_outputs.as_ref().expect("golden implies a path");
    let passed = compare_with_golden(&results.runners[0].1, &golden, path, &criterion)?;
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Compares every iteration with the golden runner's iteration of the same index.
fn compare_with_golden(
    ours: &[IterationResult],
    golden: &RunResults,
    path: &Path,
    criterion: &Criterion,
) -> Result<bool> {
    let Some((gname, giters)) = golden.runners.first() else {
        bail!("{}: the RunResults file holds no runner", path.display());
    };
    if giters.is_empty() {
        bail!("{}: runner '{gname}' has no iterations", path.display());
    }
    let mut all_passed = true;
    for (i, it) in ours.iter().enumerate() {
        // Polygraphy pairs iterations by index; a single golden iteration serves them all.
        let g = &giters[i.min(giters.len() - 1)];
        println!(
            "[I] Comparing iteration {i} against '{gname}' ({})",
            path.display()
        );
        for (name, reference) in &g.outputs {
            let Some((_, out)) = it.outputs.iter().find(|(n, _)| n == name) else {
                bail!(
                    "{}: golden output '{name}' is not an output of the model (its outputs: {})",
                    path.display(),
                    it.outputs
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            };
            let c = compare_output(name, out, reference, criterion)
                .with_context(|| format!("comparing with {}", path.display()))?;
            println!(
                "[I]     Comparing Output: '{name}' (dtype={}, shape={}) with '{name}' (dtype={}, shape={})",
                out.dtype(),
                fmt_shape(out.shape()),
                reference.dtype(),
                fmt_shape(reference.shape())
            );
            println!(
                "[I]         Tolerance: [abs={}, rel={}] | Checking {} error",
                fmt_g(c.atol, 5),
                fmt_g(c.rtol, 5),
                c.stat.name()
            );
            println!(
                "[I]         Minimum Required Tolerance: {} error | [abs={}] OR [rel={}]",
                c.stat.name(),
                fmt_g(c.required_atol, 5),
                fmt_g(c.required_rtol, 5)
            );
            if c.passed {
                println!(
                    "[I]         PASSED | Output: '{name}' | Difference is within tolerance (rel={}, abs={})",
                    fmt_g(c.rtol, 5),
                    fmt_g(c.atol, 5)
                );
            } else {
                all_passed = false;
                println!(
                    "[E]         FAILED | Output: '{name}' | Difference exceeds tolerance (rel={}, abs={})",
                    fmt_g(c.rtol, 5),
                    fmt_g(c.atol, 5)
                );
            }
        }
    }
    println!(
        "[{}] {}",
        if all_passed { "I" } else { "E" },
        if all_passed {
            "PASSED | All outputs matched"
        } else {
            "FAILED | Mismatched outputs"
        }
    );
    Ok(all_passed)
}
