//! Running a model as a library job: the outputs of every input set in FP32 or under a
//! precision plan (emulated), optionally every intermediate value (`--mark-all`). The Python
//! API's `mixprec.run` is this job; the CLI's `run` adds Polygraphy's runners, comparisons
//! and reports around the same steps.

use super::options::{Inputs, PrecisionOptions};
use super::ranges::ranges_for_plan;
use crate::error::Result;
use crate::event::{Event, Progress};
use crate::exec::RunOptions;
use crate::golden::Outputs;
use crate::{load_model, Interpreter};
use std::path::PathBuf;

/// What to run.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub model: PathBuf,
    pub inputs: Inputs,
    /// The precisions (none given: FP32).
    pub precision: PrecisionOptions,
    /// Return every node output too, in execution order after the graph outputs.
    pub mark_all: bool,
}

/// Runs the model on every input set; one map of outputs per set, graph outputs first in the
/// model's order. Notes go to `events`, a calibration's progress to `progress`.
pub fn run(
    config: &Config,
    events: &mut dyn FnMut(Event),
    progress: &dyn Progress,
) -> Result<Vec<Outputs>> {
    let model = load_model(&config.model)?;
    let graph = &model.graph;
    let feeds = config.inputs.feeds(graph, events)?;
    let interp = Interpreter::new(graph)?;
    let prepared = if config.precision.any() {
        let plan = config.precision.plan(graph, events)?;
        let amax = ranges_for_plan(&interp, &plan, &config.precision, &feeds, events, progress)?;
        let shapes = crate::exec::feed_shapes(&feeds[0]);
        Some(
            config
                .precision
                .prepare(graph, &plan, amax.as_ref(), &shapes)?,
        )
    } else {
        None
    };
    let opts = RunOptions {
        keep_intermediates: config.mark_all,
    };
    let mut all = Vec::with_capacity(feeds.len());
    for f in &feeds {
        let mut r = match &prepared {
            Some(p) => interp.run_plan(f, &opts, p)?,
            None => interp.run_with(f, &opts)?,
        };
        let mut outputs = std::mem::take(&mut r.outputs);
        if config.mark_all {
            for node in &graph.nodes {
                for name in &node.outputs {
                    if outputs.iter().any(|(n, _)| n == name) {
                        continue;
                    }
                    if let Some(t) = r.intermediates.remove(name) {
                        outputs.push((name.clone(), t));
                    }
                }
            }
        }
        all.push(outputs);
    }
    Ok(all)
}
