//! `inspect` as a library job: the model's inputs, outputs, opsets and layer table with
//! inferred shapes, FLOPs and parameters (nothing is executed), and the ops mixprec lacks.

use crate::data::loader::parse_input_shapes;
use crate::error::{Error, Result, UnsupportedOp};
use crate::infer::{declared_input_facts, infer_graph};
use crate::inspect::{summarize, ModelSummary};
use crate::load_model;
use crate::onnx::Model;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What to inspect.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub model: PathBuf,
    /// Dynamic dims resolved: `name:[d0,d1,...]` per input (Polygraphy's syntax).
    pub input_shapes: Vec<String>,
}

/// The model and its summary.
pub struct Outcome {
    pub model: Model,
    pub summary: ModelSummary,
    /// Ops without a kernel in mixprec (run, convert and debug precision stop on them).
    pub unsupported: Vec<UnsupportedOp>,
}

pub fn run(config: &Config) -> Result<Outcome> {
    let model = load_model(&config.model)?;
    let g = &model.graph;
    let mut shapes = BTreeMap::new();
    for s in &config.input_shapes {
        for (name, dims) in parse_input_shapes(s)? {
            if g.input(&name).is_none() {
                return Err(Error::Invalid(format!(
                    "--input-shapes: the model has no input '{name}'"
                )));
            }
            shapes.insert(name, dims);
        }
    }
    let facts = infer_graph(g, &declared_input_facts(g, &shapes))?;
    let summary = summarize(g, &facts);
    let unsupported = crate::ops::Registry::global().unsupported_in(g);
    Ok(Outcome {
        model,
        summary,
        unsupported,
    })
}
