//! The modeled cost of any mixed-precision model (`mixprec plan --cost-of`, `mixprec.plan_cost`):
//! a model another tool wrote (ModelOpt's Q/DQ, AutoCast's Casts, Quark's) priced by the
//! cost model `plan` minimizes, so that tools can be compared at one measure.
//!
//! The layers and their facts (elements, FLOPs, weights) are the float model's, from one FP32
//! run as in `plan`; the precision of each layer is read from the mixed model's own types
//! ([`crate::engine::verify::compute_types_of_model`]: an int8/fp8 kernel behind a
//! DequantizeLinear of int8/uint8/float8 data, else the float type it computes in), matched to
//! the float model's layers by node name. Layers the mixed model added (Casts, Q/DQ) are the
//! reformats the cost model prices at format boundaries; it does not read them.

use super::options::Inputs;
use super::plan::cost_model;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use crate::search::formats::cost::{Cost, CostObjective, Target};
use crate::{load_model, Interpreter};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// What to price, as the user gave it.
#[derive(Clone, Debug)]
pub struct Config {
    /// The float model (`plan`'s input).
    pub model: PathBuf,
    /// The mixed-precision model to price: the float model's layers under the same node
    /// names, with Q/DQ and Casts added.
    pub mixed: PathBuf,
    /// The input set the shapes come from (the first set is used).
    pub inputs: Inputs,
    /// latency, bytes or effective-bits.
    pub objective: String,
    /// h100, b200 or a JSON cost file.
    pub target: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            model: PathBuf::new(),
            mixed: PathBuf::new(),
            inputs: Inputs::default(),
            objective: "latency".into(),
            target: "h100".into(),
        }
    }
}

/// The mixed model's modeled cost.
#[derive(Clone, Debug, Serialize)]
pub struct ModelCost {
    pub model: String,
    pub mixed: String,
    pub target: String,
    pub objective: CostObjective,
    pub unit: &'static str,
    /// The cost by the objective.
    pub cost: f64,
    /// The cost by every objective (latency, bytes, effective bits, reformats).
    pub costs: Cost,
    /// Layers per format (the format's name: float32, float16, int8, fp8e4m3...), and
    /// `integer`: layers that compute in integers in the float model (shape arithmetic; the
    /// mixed model may have folded them), priced as float32 layers.
    pub formats: BTreeMap<&'static str, usize>,
    /// Per candidate layer (by node name) its format in the mixed model.
    pub layers: BTreeMap<String, Precision>,
}

impl ModelCost {
    /// As JSON (what `plan --cost-of --save-result` writes, `mixprec.plan_cost` returns).
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self)
            .map_err(|e| Error::Invalid(format!("serializing the cost: {e}")))
    }
}

/// The [`ModelCost::formats`] key of layers that compute in integers.
pub const INTEGER: &str = "integer";

/// Prices `config.mixed` by the cost model of `config.model` (module docs). Errors name the
/// file and the node: a layer of the float model the mixed one lacks, a compute layer of the
/// mixed model the float one lacks, one whose op differs, one whose type cannot be told.
pub fn run(config: &Config, events: &mut dyn FnMut(Event)) -> Result<ModelCost> {
    let objective = CostObjective::parse(&config.objective)?;
    let target = Target::resolve(&config.target)?;
    let model = load_model(&config.model)?;
    let mixed = load_model(&config.mixed)?;
    let graph = &model.graph;
    if crate::export::qdq::is_qdq_quantized(graph) {
        return Err(Error::data(
            &config.model,
            "already quantized (Q/DQ pairs on activations); give the float model the mixed one was made from",
        ));
    }
    let candidates = PrecisionPlan::candidates(graph);
    let types = crate::engine::verify::compute_types_of_model(&mixed.graph)
        .map_err(|e| Error::data(&config.mixed, format!("cannot infer its types: {e}")))?;
    let by_name: HashMap<&str, usize> = mixed
        .graph
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| !n.name.is_empty())
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    // Layers that compute in integers (shape arithmetic) take no format in any tool's model;
    // they are priced as float32 layers, the same in every model.
    let facts = crate::infer::infer_graph(
        graph,
        &crate::infer::declared_input_facts(graph, &BTreeMap::new()),
    )
    .map_err(|e| Error::data(&config.model, format!("cannot infer its types: {e}")))?;
    let integer: Vec<bool> = graph
        .nodes
        .iter()
        .map(|n| {
            n.outputs
                .first()
                .and_then(|o| facts.get(o))
                .and_then(|f| f.dtype)
                .is_some_and(|t| !t.is_float())
        })
        .collect();
    let mut precisions = vec![Precision::Float32; graph.nodes.len()];
    let mut layers = BTreeMap::new();
    let mut formats: BTreeMap<&'static str, usize> = BTreeMap::new();
    for &i in &candidates {
        let n = &graph.nodes[i];
        if n.name.is_empty() {
            return Err(Error::data(
                &config.model,
                format!(
                    "node {i} ({}) has no name; the mixed model's layers are matched to the float model's by node name",
                    n.op_type
                ),
            ));
        }
        let Some(&j) = by_name.get(n.name.as_str()) else {
            // Shape arithmetic the tool folded into constants: the same in every model.
            if integer[i] {
                *formats.entry(INTEGER).or_default() += 1;
                continue;
            }
            return Err(Error::data(
                &config.mixed,
                format!(
                    "no node named '{}' (a {} of {}); the mixed model's layers are matched to the float model's by node name",
                    n.name,
                    n.op_type,
                    config.model.display()
                ),
            ));
        };
        let m = &mixed.graph.nodes[j];
        if m.op_type != n.op_type {
            return Err(Error::data(
                &config.mixed,
                format!(
                    "node '{}' is a {}, a {} in {}",
                    n.name,
                    m.op_type,
                    n.op_type,
                    config.model.display()
                ),
            ));
        }
        let Some(p) = types[j].or_else(|| integer[i].then_some(Precision::Float32)) else {
            return Err(Error::data(
                &config.mixed,
                format!(
                    "node '{}' ({}): cannot tell its precision (no float, int8 or fp8 type on it)",
                    n.name, n.op_type
                ),
            ));
        };
        precisions[i] = p;
        if types[j].is_none() {
            *formats.entry(INTEGER).or_default() += 1;
            continue;
        }
        layers.insert(n.name.clone(), p);
        *formats.entry(p.name()).or_default() += 1;
    }
    // Every layer of the mixed model that computes in a precision must be one of the float
    // model's: a layer priced nowhere would make the tool look cheaper than it is.
    let known: std::collections::HashSet<&str> = candidates
        .iter()
        .map(|&i| graph.nodes[i].name.as_str())
        .collect();
    let folded: std::collections::HashSet<&str> =
        graph.nodes.iter().map(|n| n.name.as_str()).collect();
    for (j, m) in mixed.graph.nodes.iter().enumerate() {
        if types[j].is_none() || known.contains(m.name.as_str()) {
            continue;
        }
        // A node of the float model that is not a candidate there (folded weights, integer
        // math) costs the same in every assignment.
        if !m.name.is_empty() && folded.contains(m.name.as_str()) {
            continue;
        }
        return Err(Error::data(
            &config.mixed,
            format!(
                "node '{}' ({}) is not a layer of {}; the mixed model's layers are matched to the float model's by node name",
                m.name,
                m.op_type,
                config.model.display()
            ),
        ));
    }
    let interp = Interpreter::new(graph)?;
    let feeds = config.inputs.feeds(graph, events)?;
    let costs = cost_model(&interp, &feeds[0], &candidates, &target)?.cost(&precisions);
    Ok(ModelCost {
        model: config.model.display().to_string(),
        mixed: config.mixed.display().to_string(),
        target: target.name,
        objective,
        unit: objective.unit(),
        cost: costs.by(objective),
        costs,
        formats,
        layers,
    })
}

#[cfg(test)]
mod tests;
