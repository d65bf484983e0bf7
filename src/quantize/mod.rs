//! `mixprec quantize`: inserts explicit quantization (QuantizeLinear/DequantizeLinear) into a
//! float model, as ModelOpt's `modelopt.onnx.quantization` and ONNX Runtime's
//! `quantize_static` do (docs/quantize.md).
//!
//! - int8 / fp8 (e4m3): the layers TensorRT's explicit quantization and ModelOpt's default
//!   int8 mode quantize — Conv, ConvTranspose, Gemm, MatMul (every op with a quantized kernel
//!   in mixprec, [`DEFAULT_OP_TYPES`]) — get per-tensor activation Q/DQ from calibrated ranges
//!   and per-channel weights. This is the export of the precision plan "those layers in
//!   int8/fp8, the rest float32" ([`crate::export`]), so the written model computes exactly
//!   what mixprec's emulation of that plan computes.
//! - int4 / NVFP4 weight-only: MatMul and Gemm weights (2-D float32 initializers) stored
//!   block-quantized with DequantizeLinear ([`weights`]); activations stay float32.
//!
//! Layers are excluded by op type, by node-name regex, or by the answer of a precision search
//! (`debug precision --save-result`: the layers it keeps in higher precision). A model that
//! already holds Q/DQ nodes is refused.

pub mod weights;

use crate::error::{Error, Result};
use crate::export::{export, schema, ExportOptions};
use crate::graph::{Graph, Node};
use crate::onnx::{proto, tensor_to_proto, Model};
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use crate::tensor::DType;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// The op types int8/fp8 quantization covers by default: those TensorRT's explicit
/// quantization runs as int8/fp8 kernels and ModelOpt's int8 mode quantizes by default.
pub const DEFAULT_OP_TYPES: [&str; 4] = ["Conv", "ConvTranspose", "Gemm", "MatMul"];
/// The op types weight-only quantization covers (ModelOpt's int4 mode: MatMul and Gemm).
pub const WEIGHT_ONLY_OP_TYPES: [&str; 2] = ["Gemm", "MatMul"];

/// What to quantize to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// int8 activations (per tensor, calibrated) and weights (per channel).
    Int8,
    /// float8e4m3fn activations (per tensor, calibrated) and weights (per channel).
    Fp8,
    /// int4 weights in blocks along the reduction axis; activations stay float32.
    Int4Weights { block_size: usize },
    /// NVFP4 weights (float4e2m1, float8e4m3fn block scales, float32 global scale).
    Nvfp4Weights { block_size: usize },
}

impl Scheme {
    pub fn name(&self) -> &'static str {
        match self {
            Scheme::Int8 => "int8",
            Scheme::Fp8 => "fp8e4m3",
            Scheme::Int4Weights { .. } => "int4 weight-only",
            Scheme::Nvfp4Weights { .. } => "nvfp4 weight-only",
        }
    }

    pub fn is_weight_only(&self) -> bool {
        matches!(
            self,
            Scheme::Int4Weights { .. } | Scheme::Nvfp4Weights { .. }
        )
    }

    /// The emulated precision of an int8/fp8 scheme.
    pub fn precision(&self) -> Option<Precision> {
        match self {
            Scheme::Int8 => Some(Precision::Int8),
            Scheme::Fp8 => Some(Precision::Fp8E4M3),
            _ => None,
        }
    }

    fn op_types(&self) -> &'static [&'static str] {
        if self.is_weight_only() {
            &WEIGHT_ONLY_OP_TYPES
        } else {
            &DEFAULT_OP_TYPES
        }
    }
}

/// What to quantize and what to leave out.
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    pub scheme: Scheme,
    /// Op types left in float32 (`--exclude-op-types`).
    pub exclude_op_types: Vec<String>,
    /// Regular expressions: a node whose name matches one (anywhere in the name; anchor with
    /// `^...$`) stays float32 (`--exclude-nodes`).
    pub exclude_nodes: Vec<String>,
    /// Exact node names that stay float32, with where they came from (`--exclude-from`).
    pub exclude_names: Vec<String>,
    pub exclude_names_source: String,
}

impl QuantizeOptions {
    pub fn new(scheme: Scheme) -> QuantizeOptions {
        QuantizeOptions {
            scheme,
            exclude_op_types: Vec::new(),
            exclude_nodes: Vec::new(),
            exclude_names: Vec::new(),
            exclude_names_source: String::new(),
        }
    }
}

/// A layer left out, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Excluded {
    pub index: usize,
    pub reason: String,
}

/// Which layers are quantized.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Layer indices (of `graph.nodes`) to quantize.
    pub quantized: Vec<usize>,
    /// Layers of a quantized op type that the exclusions keep in float32.
    pub excluded: Vec<Excluded>,
    /// Layers of a quantized op type that cannot be quantized by this scheme (weight-only:
    /// no 2-D float32 initializer weight), with why.
    pub skipped: Vec<Excluded>,
    /// Things the user should know (an exclusion that matched nothing, ...).
    pub notes: Vec<String>,
}

/// A quantized model and what was done.
#[derive(Clone, Debug)]
pub struct Quantized {
    pub model: proto::ModelProto,
    pub notes: Vec<String>,
    /// Activations given QuantizeLinear/DequantizeLinear.
    pub quantized_activations: usize,
    /// Weights stored quantized.
    pub quantized_weights: usize,
}

/// Ops that make a model "already quantized": Q/DQ nodes ([`crate::ops::qdq`]), operator-style
/// integer ops, and the quantization ops of runtimes mixprec does not run, which quantizing
/// again would stack on too.
fn is_quantization_op(n: &Node) -> bool {
    crate::ops::qdq(n).is_some()
        || crate::export::qdq::is_operator_quantized(n)
        || is_foreign_quantization_op(n)
}

/// TensorRT's quantization plugins, and QuantizeLinear/DequantizeLinear of other domains than
/// the default one (ONNX Runtime's com.microsoft): ops mixprec does not run.
fn is_foreign_quantization_op(n: &Node) -> bool {
    let op = n.op_type.as_str();
    (op.starts_with("TRT_") && op.contains("Quantize"))
        || op == "TRT_FP4QDQ"
        || matches!(op, "QuantizeLinear" | "DequantizeLinear")
}

fn qdq_nodes<'a>(graph: &'a Graph, prefix: &str, out: &mut Vec<(String, &'a str)>) {
    for n in &graph.nodes {
        if is_quantization_op(n) {
            out.push((format!("{prefix}{}", n.name), n.op_type.as_str()));
        }
        for (attr, g) in n.subgraphs() {
            qdq_nodes(g, &format!("{prefix}{}/{attr}/", n.name), out);
        }
    }
}

/// Refuses a model that already holds quantization nodes, naming them: quantizing it again
/// would stack a second Q/DQ on layers that already have one.
pub fn check_not_quantized(graph: &Graph) -> Result<()> {
    let mut found = Vec::new();
    qdq_nodes(graph, "", &mut found);
    if found.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = found
        .iter()
        .take(8)
        .map(|(n, op)| format!("'{n}' ({op})"))
        .collect();
    Err(Error::Invalid(format!(
        "the model is already quantized: {} quantization node(s) ({}{}). Quantize the float model instead, or search this one as it is with `mixprec debug precision`",
        found.len(),
        names.join(", "),
        if found.len() > 8 { ", ..." } else { "" }
    )))
}

/// The layer names of a `debug precision --save-result` file: its top-level `layers[].name`
/// (the answer without fusion; `with_fusion` is not read).
pub fn result_file_layers(path: &Path) -> Result<Vec<String>> {
    let bad = |msg: String| Error::Data {
        path: path.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        cause: e,
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let layers = v.get("layers").and_then(|l| l.as_array()).ok_or_else(|| {
        bad("no 'layers' list: expected a `mixprec debug precision --save-result` file".into())
    })?;
    layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            l.get("name")
                .and_then(|n| n.as_str())
                .map(str::to_string)
                .ok_or_else(|| bad(format!("layers[{i}] has no string 'name'")))
        })
        .collect()
}

fn is_candidate_op(scheme: Scheme, node: &Node) -> bool {
    node.domain.is_empty() && scheme.op_types().contains(&node.op_type.as_str())
}

/// For weight-only schemes: the weight input of a MatMul/Gemm and its blocked (reduction)
/// axis, or why the layer cannot be quantized.
pub fn weight_operand(graph: &Graph, node: &Node) -> std::result::Result<(usize, usize), String> {
    let axis = match node.op_type.as_str() {
        "MatMul" => 0,
        "Gemm" => {
            if node.attr_int_or("transB", 0) != 0 {
                1
            } else {
                0
            }
        }
        op => return Err(format!("{op} has no weight-only form")),
    };
    let Some(name) = node.inputs.get(1).filter(|s| !s.is_empty()) else {
        return Err("it has no input B".into());
    };
    if graph.inputs.iter().any(|i| &i.name == name) {
        return Err(format!(
            "its weight '{name}' is also a graph input (it can be overridden at run time)"
        ));
    }
    let Some(t) = graph.initializers.get(name) else {
        return Err(format!(
            "its input B '{name}' is not an initializer (computed at run time or by other nodes)"
        ));
    };
    if t.dtype() != DType::F32 || t.shape().len() != 2 {
        return Err(format!(
            "its weight '{name}' is {} {:?}, not a 2-D float32 tensor",
            t.dtype(),
            t.shape()
        ));
    }
    Ok((1, axis))
}

/// Which layers the options quantize. Errors: an unknown op type, a bad regular expression,
/// a name from a result file that is not a node of the model.
pub fn select(graph: &Graph, opts: &QuantizeOptions) -> Result<Selection> {
    let mut sel = Selection::default();
    let scheme = opts.scheme;
    let registry = crate::ops::Registry::global();
    let model_ops: HashSet<&str> = graph.nodes.iter().map(|n| n.op_type.as_str()).collect();
    for op in &opts.exclude_op_types {
        if registry.def("", op).is_none() && !model_ops.contains(op.as_str()) {
            return Err(Error::Invalid(format!(
                "--exclude-op-types: unknown op type '{op}' (op types are case-sensitive ONNX names; this scheme quantizes {})",
                scheme.op_types().join(", ")
            )));
        }
        if !scheme.op_types().contains(&op.as_str()) {
            sel.notes.push(format!(
                "--exclude-op-types {op}: {} quantization never quantizes {op} (it quantizes {}); nothing to exclude",
                scheme.name(),
                scheme.op_types().join(", ")
            ));
        } else if !model_ops.contains(op.as_str()) {
            sel.notes.push(format!(
                "--exclude-op-types {op}: the model has no {op} node"
            ));
        }
    }
    let patterns = opts
        .exclude_nodes
        .iter()
        .map(|p| {
            regex::Regex::new(p)
                .map(|r| (p.as_str(), r))
                .map_err(|e| Error::Invalid(format!("--exclude-nodes '{p}': {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    for (p, r) in &patterns {
        if !graph.nodes.iter().any(|n| r.is_match(&n.name)) {
            sel.notes.push(format!(
                "--exclude-nodes '{p}' matches no node of the model"
            ));
        }
    }
    let names: HashSet<&str> = graph.nodes.iter().map(|n| n.name.as_str()).collect();
    let unknown: Vec<&str> = opts
        .exclude_names
        .iter()
        .map(String::as_str)
        .filter(|n| !names.contains(n))
        .collect();
    if !unknown.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: {} of its {} layer(s) are not nodes of this model ({}{}); is the result from another model?",
            opts.exclude_names_source,
            unknown.len(),
            opts.exclude_names.len(),
            unknown
                .iter()
                .take(8)
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(", "),
            if unknown.len() > 8 { ", ..." } else { "" }
        )));
    }
    let listed: HashSet<&str> = opts.exclude_names.iter().map(String::as_str).collect();
    for (k, node) in graph.nodes.iter().enumerate() {
        if !is_candidate_op(scheme, node) || graph.is_folded(node) {
            if listed.contains(node.name.as_str()) {
                sel.notes.push(format!(
                    "{}: '{}' ({}) is not a layer {} quantization quantizes; nothing to exclude",
                    opts.exclude_names_source,
                    node.name,
                    node.op_type,
                    scheme.name()
                ));
            }
            continue;
        }
        let reason = if opts.exclude_op_types.contains(&node.op_type) {
            Some(format!("--exclude-op-types {}", node.op_type))
        } else if let Some((p, _)) = patterns.iter().find(|(_, r)| r.is_match(&node.name)) {
            Some(format!("--exclude-nodes '{p}'"))
        } else if listed.contains(node.name.as_str()) {
            Some(format!("listed in {}", opts.exclude_names_source))
        } else {
            None
        };
        if let Some(reason) = reason {
            sel.excluded.push(Excluded { index: k, reason });
            continue;
        }
        if scheme.is_weight_only() {
            if let Err(why) = weight_operand(graph, node) {
                sel.skipped.push(Excluded {
                    index: k,
                    reason: why,
                });
                continue;
            }
        }
        sel.quantized.push(k);
    }
    Ok(sel)
}

/// The precision plan an int8/fp8 selection exports (and that `mixprec run MODEL --int8
/// --layer-precisions <excluded>:float32` emulates): the selected layers in the scheme's
/// precision, every other layer float32. None for weight-only schemes.
pub fn plan(graph: &Graph, sel: &Selection, scheme: Scheme) -> Option<PrecisionPlan> {
    let p = scheme.precision()?;
    let mut layers = vec![Precision::Float32; graph.nodes.len()];
    for &k in &sel.quantized {
        layers[k] = p;
    }
    Some(PrecisionPlan::from_layers(layers))
}

/// Quantizes the selected layers. `amax` (activation ranges by tensor name) is required for
/// int8/fp8 and ignored by weight-only schemes.
pub fn quantize(
    model: &Model,
    scheme: Scheme,
    sel: &Selection,
    amax: Option<&BTreeMap<String, f32>>,
) -> Result<Quantized> {
    check_not_quantized(&model.graph)?;
    if sel.quantized.is_empty() {
        return Err(Error::Invalid(format!(
            "nothing to quantize: no layer is left for {} quantization ({} excluded, {} without a quantizable weight)",
            scheme.name(),
            sel.excluded.len(),
            sel.skipped.len()
        )));
    }
    match scheme {
        Scheme::Int8 | Scheme::Fp8 => {
            let plan = plan(&model.graph, sel, scheme).expect("int8/fp8 plan");
            let e = export(model, &plan, amax, &ExportOptions::default())?;
            Ok(Quantized {
                model: e.model,
                notes: e.notes,
                quantized_activations: e.quantized_activations,
                quantized_weights: e.quantized_weights,
            })
        }
        Scheme::Int4Weights { block_size } => quantize_weights(model, sel, false, block_size),
        Scheme::Nvfp4Weights { block_size } => quantize_weights(model, sel, true, block_size),
    }
}

fn names_in(g: &proto::GraphProto, out: &mut HashSet<String>) {
    for n in &g.node {
        out.extend(n.input.iter().cloned());
        out.extend(n.output.iter().cloned());
        out.extend(n.name.clone());
        for a in &n.attribute {
            for sg in a.g.iter().chain(a.graphs.iter()) {
                names_in(sg, out);
            }
        }
    }
    out.extend(g.initializer.iter().filter_map(|t| t.name.clone()));
    for vi in g.input.iter().chain(&g.output).chain(&g.value_info) {
        out.extend(vi.name.clone());
    }
}

/// Every name read by the nodes (subgraphs included) and the graph outputs.
fn reads_in(g: &proto::GraphProto, out: &mut HashSet<String>) {
    for n in &g.node {
        out.extend(n.input.iter().cloned());
        for a in &n.attribute {
            for sg in a.g.iter().chain(a.graphs.iter()) {
                reads_in(sg, out);
            }
        }
    }
    out.extend(g.output.iter().filter_map(|v| v.name.clone()));
}

fn dq_node(
    name: String,
    inputs: Vec<String>,
    output: String,
    attrs: &[(&str, i64)],
) -> proto::NodeProto {
    proto::NodeProto {
        name: Some(name),
        op_type: Some("DequantizeLinear".into()),
        input: inputs,
        output: vec![output],
        attribute: attrs.iter().map(|(k, v)| schema::int_attr(k, *v)).collect(),
        ..Default::default()
    }
}

/// Weight-only: each selected layer's weight becomes block-quantized values and scales read
/// through DequantizeLinear; the original initializer goes when nothing else reads it.
fn quantize_weights(
    model: &Model,
    sel: &Selection,
    nvfp4: bool,
    block: usize,
) -> Result<Quantized> {
    let graph = &model.graph;
    let mut g = model
        .proto
        .graph
        .clone()
        .ok_or_else(|| Error::Invalid("the model has no graph".into()))?;
    let mut notes = Vec::new();
    if nvfp4 && block != weights::NVFP4_BLOCK {
        notes.push(format!(
            "NVFP4 block size {block}: TensorRT's NVFP4 kernels and ModelOpt use blocks of {}",
            weights::NVFP4_BLOCK
        ));
    }
    let mut taken = HashSet::new();
    names_in(&g, &mut taken);
    let mut fresh = |base: &str| -> String {
        let mut name = base.to_string();
        let mut k = 1;
        while taken.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        taken.insert(name.clone());
        name
    };
    // Exported nodes carry the names mixprec gives them (unnamed nodes: Op_<index>).
    for node in &graph.nodes {
        if let Some(p) = node.pos {
            if let Some(pn) = g.node.get_mut(p) {
                pn.name = Some(node.name.clone());
            }
        }
    }
    let mut prefix: Vec<proto::NodeProto> = Vec::new();
    let mut done: HashMap<(String, usize), String> = HashMap::new();
    let mut replaced: HashSet<String> = HashSet::new();
    for &k in &sel.quantized {
        let node = &graph.nodes[k];
        let (widx, axis) = weight_operand(graph, node).map_err(|why| Error::Op {
            node: node.name.clone(),
            op: node.op_type.clone(),
            msg: why,
        })?;
        let w = &node.inputs[widx];
        let pos = node.pos.ok_or_else(|| Error::Op {
            node: node.name.clone(),
            op: node.op_type.clone(),
            msg: "the node is not in the model file (built in code)".into(),
        })?;
        let dq_out = match done.get(&(w.clone(), axis)) {
            Some(o) => o.clone(),
            None => {
                let t = &graph.initializers[w];
                let data = t.as_f32().expect("float32 weight");
                let q = if nvfp4 {
                    weights::quantize_nvfp4(w, data, t.shape(), axis, block)?
                } else {
                    weights::quantize_int4(w, data, t.shape(), axis, block)?
                };
                let tag = if nvfp4 { "fp4" } else { "int4" };
                let values = fresh(&format!("{w}_{tag}"));
                let out = fresh(&format!("{w}_dequantized"));
                let dq_name = fresh(&format!("{w}_DequantizeLinear"));
                g.initializer.push(tensor_to_proto(&values, &q.values));
                let block_attrs = [("axis", axis as i64), ("block_size", block as i64)];
                if let Some(global) = q.global_scale {
                    let s8 = fresh(&format!("{w}_fp8_scale"));
                    let gs = fresh(&format!("{w}_global_scale"));
                    let s32 = fresh(&format!("{w}_block_scale"));
                    g.initializer.push(tensor_to_proto(&s8, &q.scales));
                    g.initializer
                        .push(tensor_to_proto(&gs, &crate::Tensor::scalar_f32(global)));
                    prefix.push(dq_node(
                        fresh(&format!("{w}_scale_DequantizeLinear")),
                        vec![s8, gs],
                        s32.clone(),
                        &[],
                    ));
                    prefix.push(dq_node(
                        dq_name,
                        vec![values, s32],
                        out.clone(),
                        &block_attrs,
                    ));
                } else {
                    let s = fresh(&format!("{w}_scale"));
                    g.initializer.push(tensor_to_proto(&s, &q.scales));
                    prefix.push(dq_node(dq_name, vec![values, s], out.clone(), &block_attrs));
                }
                done.insert((w.clone(), axis), out.clone());
                replaced.insert(w.clone());
                out
            }
        };
        g.node[pos].input[widx] = dq_out;
    }
    // Originals nothing reads any more go.
    let mut reads = HashSet::new();
    reads_in(&g, &mut reads);
    let keep = |n: &str| !replaced.contains(n) || reads.contains(n);
    g.initializer
        .retain(|t| keep(t.name.as_deref().unwrap_or("")));
    g.value_info
        .retain(|v| keep(v.name.as_deref().unwrap_or("")));
    prefix.append(&mut g.node);
    g.node = prefix;

    // Opset: blocked DequantizeLinear needs 21, float4e2m1 23.
    let from = graph.opset();
    let target: i64 = if nvfp4 { 23 } else { 21 };
    let mut m = (*model.proto).clone();
    if from < target {
        schema::check_upgrade(&g.node, from, target)?;
        let mut inits = Vec::new();
        let mut fresh_up = |b: &str| fresh(b);
        schema::upgrade_nodes(&mut g.node, from, target, &mut fresh_up, Some(&mut inits));
        g.initializer.extend(inits);
        notes.push(format!(
            "raised the model's ONNX opset from {from} to {target} for DequantizeLinear with {}",
            if nvfp4 {
                "float4e2m1 values"
            } else {
                "block_size"
            }
        ));
        let mut found = false;
        for o in &mut m.opset_import {
            let d = o.domain.as_deref().unwrap_or("");
            if d.is_empty() || d == "ai.onnx" {
                o.version = Some(target);
                found = true;
            }
        }
        if !found {
            m.opset_import.push(proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(target),
            });
        }
        m.ir_version = Some(
            m.ir_version
                .unwrap_or(0)
                .max(schema::min_ir_version(target)),
        );
    }
    m.graph = Some(g);
    Ok(Quantized {
        model: m,
        notes,
        quantized_activations: 0,
        quantized_weights: done.len(),
    })
}

#[cfg(test)]
mod tests;
