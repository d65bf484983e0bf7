//! `mixprec inspect`: the layer table (op, output types and shapes, FLOPs, parameters) and
//! what the weights cost in each precision.
//!
//! Nothing runs: shapes come from the shape and type inference ([`crate::infer`]), with
//! dynamic dimensions kept symbolic unless `--input-shapes` resolves them. FLOPs are counted
//! where every shape they need is static.

use crate::graph::fact::{DimFact, Fact};
use crate::graph::{Graph, Node};
use crate::infer::GraphFacts;
use crate::ops::{is_data_movement, Registry};
use serde::Serialize;
use std::collections::HashSet;

/// One dimension in JSON: a number, or the symbol's text (`batch`, `2*seq`, `?`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum DimJson {
    Known(usize),
    Symbol(String),
}

impl From<&DimFact> for DimJson {
    fn from(d: &DimFact) -> Self {
        match d.as_known() {
            Some(n) => DimJson::Known(n),
            None => DimJson::Symbol(d.to_string()),
        }
    }
}

/// A value's inferred type and shape (None: unknown).
#[derive(Clone, Debug, Serialize)]
pub struct ValueSummary {
    pub name: String,
    pub dtype: Option<String>,
    pub shape: Option<Vec<DimJson>>,
}

impl ValueSummary {
    fn of(name: &str, f: Option<&Fact>) -> ValueSummary {
        ValueSummary {
            name: name.to_string(),
            dtype: f.and_then(|f| f.dtype).map(|d| d.name().to_string()),
            shape: f
                .and_then(|f| f.shape.as_ref())
                .map(|s| s.iter().map(DimJson::from).collect()),
        }
    }

    /// `[batch, 3, 224, 224]`, or `?` when not even the rank is known.
    pub fn shape_text(&self) -> String {
        match &self.shape {
            None => "?".to_string(),
            Some(dims) => {
                let parts: Vec<String> = dims
                    .iter()
                    .map(|d| match d {
                        DimJson::Known(n) => n.to_string(),
                        DimJson::Symbol(s) => s.clone(),
                    })
                    .collect();
                format!("[{}]", parts.join(", "))
            }
        }
    }
}

/// One row of the layer table.
#[derive(Clone, Debug, Serialize)]
pub struct LayerInfo {
    pub index: usize,
    pub name: String,
    pub op: String,
    pub outputs: Vec<ValueSummary>,
    /// None when a shape it needs is not static (pass `--input-shapes`).
    pub flops: Option<u64>,
    pub params: u64,
    /// False for pure data movement (Reshape, Transpose...): never a precision candidate.
    pub computes: bool,
}

/// Everything `inspect` reports.
#[derive(Clone, Debug, Serialize)]
pub struct ModelSummary {
    pub inputs: Vec<ValueSummary>,
    pub outputs: Vec<ValueSummary>,
    pub layers: Vec<LayerInfo>,
    /// Sum over the layers whose FLOPs are known.
    pub total_flops: u64,
    /// Layers whose FLOPs could not be counted (shapes not static).
    pub layers_without_flops: usize,
    pub total_params: u64,
    /// Bytes of float weights stored as float32 / float16 / int8.
    pub weight_bytes_fp32: u64,
    pub weight_bytes_fp16: u64,
    pub weight_bytes_int8: u64,
}

/// Builds the layer table from the graph's inferred facts.
pub fn summarize(graph: &Graph, facts: &GraphFacts) -> ModelSummary {
    let static_shape = |name: &str| -> Option<Vec<usize>> {
        match graph.weight(name) {
            Some(t) => Some(t.shape().to_vec()),
            None => facts.known_shape(name),
        }
    };
    let mut counted: HashSet<&str> = HashSet::new();
    let mut layers = Vec::with_capacity(graph.nodes.len());
    let mut weight_elems = 0u64;
    for (index, node) in graph.nodes.iter().enumerate() {
        let in_shapes: Vec<Option<Vec<usize>>> = node
            .inputs
            .iter()
            .map(|n| if n.is_empty() { None } else { static_shape(n) })
            .collect();
        let out_shapes: Option<Vec<Vec<usize>>> = node
            .outputs
            .iter()
            .filter(|n| !n.is_empty())
            .map(|n| static_shape(n))
            .collect();
        // FLOPs need the static shapes of every present input and every output.
        let inputs_static = node
            .inputs
            .iter()
            .zip(&in_shapes)
            .all(|(n, s)| n.is_empty() || s.is_some());
        let flops = match out_shapes {
            Some(outs) if inputs_static => Some(node_flops(node, &in_shapes, &outs)),
            _ => None,
        };
        // Parameters: the float weights a layer reads, initializers or folded values (a
        // Transpose or DequantizeLinear of an initializer, a Constant); the folding nodes
        // themselves have none, so each weight counts once, where it is used.
        let mut params = 0u64;
        let folded = graph.is_folded(node);
        for inp in node.inputs.iter().filter(|_| !folded) {
            if let Some(t) = graph.weight(inp) {
                if t.dtype().is_float() {
                    params += t.len() as u64;
                    if counted.insert(inp.as_str()) {
                        weight_elems += t.len() as u64;
                    }
                }
            }
        }
        layers.push(LayerInfo {
            index,
            name: node.name.clone(),
            op: node.op_type.clone(),
            outputs: node
                .outputs
                .iter()
                .filter(|n| !n.is_empty())
                .map(|n| ValueSummary::of(n, facts.get(n)))
                .collect(),
            flops,
            params,
            computes: !is_data_movement(node) && !folded,
        });
    }
    ModelSummary {
        inputs: graph
            .inputs
            .iter()
            .map(|v| ValueSummary::of(&v.name, facts.get(&v.name)))
            .collect(),
        outputs: graph
            .outputs
            .iter()
            .map(|v| ValueSummary::of(&v.name, facts.get(&v.name)))
            .collect(),
        total_flops: layers.iter().filter_map(|l| l.flops).sum(),
        layers_without_flops: layers.iter().filter(|l| l.flops.is_none()).count(),
        total_params: layers.iter().map(|l| l.params).sum(),
        weight_bytes_fp32: weight_elems * 4,
        weight_bytes_fp16: weight_elems * 2,
        weight_bytes_int8: weight_elems,
        layers,
    }
}

/// Floating-point operations of one node (a multiply-add counts 2), from its shapes: the op's
/// own count ([`crate::ops::OpDef::node_flops`]); one per output element for ops mixprec
/// does not know.
pub fn node_flops(node: &Node, ins: &[Option<Vec<usize>>], outs: &[Vec<usize>]) -> u64 {
    match Registry::global().def(&node.domain, &node.op_type) {
        Some(def) => def.node_flops(node, ins, outs),
        None => outs
            .first()
            .map(|s| s.iter().product::<usize>() as u64)
            .unwrap_or(0),
    }
}

/// Formats a FLOP or byte count with an SI suffix (`1.23 G`).
pub fn si(x: u64) -> String {
    let x = x as f64;
    for (div, suffix) in [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")] {
        if x >= div {
            return format!("{:.2} {suffix}", x / div);
        }
    }
    format!("{x:.0} ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(op: &str, attrs: BTreeMap<String, crate::graph::Attribute>) -> Node {
        Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec![],
            attrs,
            ..Default::default()
        }
    }

    #[test]
    fn conv_and_matmul_flops() {
        // 3x3 conv 64->64 on 56x56: 2 * 64*56*56 * 64*9
        let f = node_flops(
            &node("Conv", BTreeMap::new()),
            &[Some(vec![1, 64, 56, 56]), Some(vec![64, 64, 3, 3])],
            &[vec![1, 64, 56, 56]],
        );
        assert_eq!(f, 2 * 64 * 56 * 56 * 64 * 9);
        let f = node_flops(
            &node("MatMul", BTreeMap::new()),
            &[Some(vec![2, 8, 16]), Some(vec![16, 4])],
            &[vec![2, 8, 4]],
        );
        assert_eq!(f, 2 * 2 * 8 * 4 * 16);
        assert_eq!(
            node_flops(&node("Reshape", BTreeMap::new()), &[], &[vec![10]]),
            0
        );
    }

    #[test]
    fn einsum_counts_every_index() {
        let mut a = BTreeMap::new();
        a.insert(
            "equation".into(),
            crate::graph::Attribute::String("bij,bjk->bik".into()),
        );
        let f = node_flops(
            &node("Einsum", a),
            &[Some(vec![2, 3, 4]), Some(vec![2, 4, 5])],
            &[vec![2, 3, 5]],
        );
        assert_eq!(f, 2 * 2 * 3 * 4 * 5);
    }
}
