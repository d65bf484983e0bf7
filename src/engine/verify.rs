//! Comparing the engine's layer types with the precisions the plan or the exported model asked
//! for: which ONNX nodes did the engine run in another precision?

use super::layers::{EngineLayer, EngineType, LayerInfo};
use super::names::{LayerRole, NameIndex};
use crate::error::Result;
use crate::graph::Graph;
use crate::precision::plan::PrecisionPlan;
use crate::precision::{has_quantized_kernel, Precision};
use crate::tensor::DType;
use serde::Serialize;
use std::collections::BTreeMap;

/// Ops whose output type is set by the op itself or that compute nothing in a precision: not
/// compared (their neighbours are).
const NOT_COMPARED: &[&str] = &[
    "Cast",
    "CastLike",
    "QuantizeLinear",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "Constant",
    "ConstantOfShape",
    "Shape",
    "Size",
    "NonZero",
    "ArgMax",
    "ArgMin",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "Not",
    "And",
    "Or",
    "Xor",
    "IsNaN",
    "IsInf",
    "Range",
];

/// The precision each layer of `graph` should run in, from a plan: None for layers not
/// compared (data movement, folded weights, Casts, Q/DQ, shape and comparison ops).
pub fn expected_from_plan(graph: &Graph, plan: &PrecisionPlan) -> Vec<Option<Precision>> {
    graph
        .nodes
        .iter()
        .zip(&plan.layers)
        .map(|(n, &p)| compared(graph, n).then_some(p))
        .collect()
}

fn compared(graph: &Graph, n: &crate::graph::Node) -> bool {
    !crate::ops::is_data_movement(n)
        && !graph.is_folded(n)
        && !NOT_COMPARED.contains(&n.op_type.as_str())
}

/// The precision each layer of a strongly typed model (the exported mixed-precision model)
/// runs in, from the model's own types: an op with an int8/fp8 kernel whose quantized operand
/// comes from a DequantizeLinear of int8/float8 data runs in that type; any other layer in the
/// float type of its first output (float32, float16, bfloat16). Types come from shape/type
/// inference of the declared inputs.
pub fn expected_from_model(graph: &Graph) -> Result<Vec<Option<Precision>>> {
    model_types(graph, false)
}

/// [`expected_from_model`] for every node that computes in a float type, also those it does
/// not compare: a comparison or another op whose output type is not its precision (Equal,
/// ArgMax...) runs in the float type of its first float input, and uint8 Q/DQ data (not a
/// TensorRT type) counts as int8. Data movement, folded weights, Casts and Q/DQ stay None.
pub fn compute_types_of_model(graph: &Graph) -> Result<Vec<Option<Precision>>> {
    model_types(graph, true)
}

fn model_types(graph: &Graph, by_inputs: bool) -> Result<Vec<Option<Precision>>> {
    let inputs = crate::infer::declared_input_facts(graph, &BTreeMap::new());
    let facts = crate::infer::infer_graph(graph, &inputs)?;
    let dtype = |v: &str| -> Option<DType> {
        facts
            .get(v)
            .and_then(|f| f.dtype)
            .or_else(|| graph.weight(v).map(|t| t.dtype()))
    };
    let float = |t: Option<DType>| match t {
        Some(DType::F32) => Some(Precision::Float32),
        Some(DType::F16) => Some(Precision::Float16),
        Some(DType::BF16) => Some(Precision::BFloat16),
        _ => None,
    };
    let values = graph.values();
    Ok(graph
        .nodes
        .iter()
        .map(|n| {
            if !compared(graph, n) {
                let typed_elsewhere = by_inputs
                    && !crate::ops::is_data_movement(n)
                    && !graph.is_folded(n)
                    && !matches!(
                        n.op_type.as_str(),
                        "Cast"
                            | "CastLike"
                            | "QuantizeLinear"
                            | "DequantizeLinear"
                            | "DynamicQuantizeLinear"
                    );
                return if typed_elsewhere {
                    n.inputs
                        .iter()
                        .filter(|x| !x.is_empty())
                        .find_map(|x| float(dtype(x)))
                } else {
                    None
                };
            }
            if has_quantized_kernel(n) {
                for x in n.inputs.iter().take(2) {
                    let Some(dq) = values.producer_node(x).map(|p| &graph.nodes[p]) else {
                        continue;
                    };
                    if dq.op_type != "DequantizeLinear" {
                        continue;
                    }
                    match dq.inputs.first().and_then(|q| dtype(q)) {
                        Some(DType::I8) => return Some(Precision::Int8),
                        // uint8 activations (ONNX Runtime's and Quark's default): 8-bit
                        // integer math all the same, for the cost model.
                        Some(DType::U8) if by_inputs => return Some(Precision::Int8),
                        Some(DType::F8E4M3FN) => return Some(Precision::Fp8E4M3),
                        Some(DType::F8E5M2) => return Some(Precision::Fp8E5M2),
                        _ => {}
                    }
                }
            }
            float(n.outputs.first().and_then(|o| dtype(o)))
        })
        .collect())
}

/// What the engine did with one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Runs in the expected precision.
    Obeys,
    /// Runs in another precision.
    Disobeys,
    /// Only inside a Myelin `{ForeignNode[...]}` range, whose layer reports the types at its
    /// boundary, not the node's: not judged.
    InsideMyelin,
    /// No layer with type information names it (fused into a constant, removed, or in a layer
    /// whose types are unknown).
    NotSeen,
}

/// One compared ONNX node.
#[derive(Clone, Debug, Serialize)]
pub struct NodeCheck {
    pub index: usize,
    pub node: String,
    pub op: String,
    pub expected: &'static str,
    /// The engine's type for it (`Half`, `Float`, `Int8`...), when seen.
    pub engine: Option<String>,
    /// The engine layers that run it.
    pub layers: Vec<String>,
    pub verdict: Verdict,
}

/// One input or output tensor of the engine (the file's `Bindings` or `I/O Tensors`).
#[derive(Clone, Debug, Serialize)]
pub struct IoCheck {
    pub name: String,
    /// `Input`/`Output` (TensorRT 11's `IOMode`).
    pub mode: Option<String>,
    /// The engine's type for it (TensorRT 11's `DataType`).
    pub engine: Option<String>,
    /// The model's declared type of the input/output of that name; None when the model has
    /// none of that name.
    pub model: Option<String>,
}

/// The outcome of `verify-engine`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EngineReport {
    /// Layers in the file.
    pub engine_layers: usize,
    /// False when the file has names only (no `--profilingVerbosity=detailed`).
    pub detailed: bool,
    /// Layers that mapped to at least one ONNX node.
    pub mapped_layers: usize,
    /// Reformat/copy layers (not layers of the model; listed with the layer they serve).
    pub reformats: Vec<String>,
    /// Layers TensorRT made for weights or bookkeeping (Constant, NoOp, signal/wait) that name
    /// no node: ignored.
    pub ignored: Vec<String>,
    /// One line per layer (or part of a fused name) that maps to no ONNX node.
    pub warnings: Vec<String>,
    /// Every compared node, in graph order.
    pub nodes: Vec<NodeCheck>,
    /// The engine's I/O tensors, when the file lists them.
    pub io_tensors: Vec<IoCheck>,
}

impl EngineReport {
    pub fn disobeying(&self) -> impl Iterator<Item = &NodeCheck> {
        self.nodes.iter().filter(|n| n.verdict == Verdict::Disobeys)
    }

    pub fn count(&self, v: Verdict) -> usize {
        self.nodes.iter().filter(|n| n.verdict == v).count()
    }

    /// Layers that map to no node at all (each also a warning).
    pub fn unmapped_layers(&self) -> usize {
        self.engine_layers - self.mapped_layers - self.reformats.len() - self.ignored.len()
    }
}

fn engine_name(p: Precision) -> EngineType {
    match p {
        Precision::Float32 => EngineType::Float,
        Precision::Float16 => EngineType::Half,
        Precision::BFloat16 => EngineType::BFloat16,
        Precision::Int8 => EngineType::Int8,
        Precision::Fp8E4M3 | Precision::Fp8E5M2 => EngineType::Fp8,
    }
}

/// The type a layer computes in, from its tensors: int8/fp8 when a (numeric) input is
/// quantized (an integer kernel; its output may be float), otherwise the first numeric
/// output's type, or, when the layer ends in a Cast fused into it (`cast_at_output`: the
/// Cast's output is the layer's output, so the output has the Cast's type), the first numeric
/// input's type.
pub fn layer_type(layer: &EngineLayer, cast_at_output: bool) -> Option<EngineType> {
    let num = |ts: &[super::layers::EngineTensor]| -> Vec<EngineType> {
        ts.iter()
            .filter_map(|t| t.dtype.clone())
            .filter(EngineType::is_numeric)
            .collect()
    };
    let ins = num(&layer.inputs);
    let outs = num(&layer.outputs);
    for q in [
        EngineType::Int8,
        EngineType::Fp8,
        EngineType::Int4,
        EngineType::Fp4,
    ] {
        if ins.contains(&q) {
            return Some(q);
        }
    }
    if cast_at_output {
        ins.first().or(outs.first()).cloned()
    } else {
        outs.first().or(ins.first()).cloned()
    }
}

/// Compares the engine's layers with the expected precision of each node (`expected[i]` for
/// `graph.nodes[i]`; None: not compared).
pub fn verify(graph: &Graph, expected: &[Option<Precision>], info: &LayerInfo) -> EngineReport {
    let index = NameIndex::new(graph);
    let mut report = EngineReport {
        engine_layers: info.layers.len(),
        detailed: info.detailed,
        warnings: info.warnings.clone(),
        ..Default::default()
    };
    // Per node: (layer name, engine type, only through a Myelin range).
    let mut seen: Vec<Vec<(String, Option<EngineType>, bool)>> =
        vec![Vec::new(); graph.nodes.len()];
    let bookkeeping = ["Constant", "NoOp", "signal", "wait"];
    for layer in &info.layers {
        let m = index.map(
            &layer.name,
            layer.layer_type.as_deref(),
            layer.metadata.as_deref(),
        );
        let nodes = match m.role {
            LayerRole::Reformat { target } => {
                report
                    .reformats
                    .push(format!("{} (for {target})", layer.name));
                continue;
            }
            LayerRole::Nodes(n) => n,
        };
        let weights_only =
            !m.unmapped.is_empty() && m.unmapped.iter().all(|u| graph.weight(u).is_some());
        if nodes.is_empty() {
            if weights_only
                || layer
                    .layer_type
                    .as_deref()
                    .is_some_and(|t| bookkeeping.contains(&t))
            {
                report.ignored.push(layer.name.clone());
            } else {
                report.warnings.push(format!(
                    "engine layer {} '{}' maps to no ONNX node of the model",
                    layer.index, layer.name
                ));
            }
            continue;
        }
        report.mapped_layers += 1;
        for u in &m.unmapped {
            if graph.weight(u).is_none() {
                report.warnings.push(format!(
                    "engine layer {} '{}': '{u}' names no ONNX node of the model",
                    layer.index, layer.name
                ));
            }
        }
        let range = layer.name.contains("{ForeignNode[") && layer.metadata.is_none();
        // A Cast fused at the layer's output gives the output its type; one fused at the
        // input (its input is the layer's input) does not change what the output shows.
        let names = |ts: &[super::layers::EngineTensor]| -> Vec<String> {
            ts.iter().map(|t| t.name.clone()).collect()
        };
        let (ins, outs) = (names(&layer.inputs), names(&layer.outputs));
        let casts = nodes
            .iter()
            .map(|&i| &graph.nodes[i])
            .filter(|n| matches!(n.op_type.as_str(), "Cast" | "CastLike"));
        let (mut cast_in, mut cast_out) = (false, false);
        for c in casts {
            cast_in |= c.inputs.first().is_some_and(|x| ins.contains(x));
            cast_out |= c.outputs.first().is_some_and(|x| outs.contains(x));
        }
        let t = layer_type(layer, cast_out && !cast_in);
        for i in nodes {
            seen[i].push((layer.name.clone(), t.clone(), range));
        }
    }
    report.io_tensors = check_io(graph, info, &mut report.warnings);
    for (i, (node, want)) in graph.nodes.iter().zip(expected).enumerate() {
        let Some(want) = *want else { continue };
        let hits = &seen[i];
        let explicit: Vec<_> = hits.iter().filter(|h| !h.2 && h.1.is_some()).collect();
        let want_t = engine_name(want);
        let (verdict, engine, layers) = if !explicit.is_empty() {
            let bad = explicit.iter().find(|h| h.1.as_ref() != Some(&want_t));
            let shown = bad.unwrap_or(&explicit[0]);
            (
                if bad.is_some() {
                    Verdict::Disobeys
                } else {
                    Verdict::Obeys
                },
                shown.1.as_ref().map(|t| t.name().to_string()),
                explicit.iter().map(|h| h.0.clone()).collect(),
            )
        } else if let Some(h) = hits.iter().find(|h| h.2) {
            (
                Verdict::InsideMyelin,
                h.1.as_ref().map(|t| t.name().to_string()),
                vec![h.0.clone()],
            )
        } else {
            (
                Verdict::NotSeen,
                None,
                hits.iter().map(|h| h.0.clone()).collect(),
            )
        };
        report.nodes.push(NodeCheck {
            index: i,
            node: node.name.clone(),
            op: node.op_type.clone(),
            expected: want.name(),
            engine,
            layers,
            verdict,
        });
    }
    report
}

/// The engine's I/O tensors against the model's inputs and outputs: a name the model does
/// not have (layer information of another model?) and, where the file gives types (TensorRT
/// 11), a type other than the model's are warnings. Names lose their `[profile N]` suffix.
fn check_io(graph: &Graph, info: &LayerInfo, warnings: &mut Vec<String>) -> Vec<IoCheck> {
    let suffix = regex::Regex::new(r"\s*\[profile \d+\]$").expect("valid regex");
    let mut out = Vec::new();
    for t in &info.io_tensors {
        let name = suffix.replace(t.name.trim(), "").into_owned();
        let what = format!(
            "engine I/O tensor '{}'{}",
            t.name,
            t.mode
                .as_deref()
                .map(|m| format!(" ({m})"))
                .unwrap_or_default()
        );
        let declared = graph
            .inputs
            .iter()
            .chain(&graph.outputs)
            .find(|v| v.name == name);
        let model = declared.and_then(|v| v.dtype);
        match declared {
            None => warnings.push(format!(
                "{what} is not an input or output of the model (layer information of another model?)"
            )),
            Some(_) if t.shape_io => {}
            Some(_) => {
                if let (Some(e), Some(m)) = (&t.dtype, model) {
                    if EngineType::parse(m.name()).as_ref() != Some(e) {
                        warnings.push(format!(
                            "{what} is {} in the engine, {m} in the model",
                            e.name()
                        ));
                    }
                }
            }
        }
        out.push(IoCheck {
            name: t.name.clone(),
            mode: t.mode.clone(),
            engine: t.dtype.as_ref().map(|e| e.name().to_string()),
            model: model.map(|m| m.name().to_string()),
        });
    }
    out
}
