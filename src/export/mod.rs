//! Export: writes a precision plan out as a deployable mixed-precision ONNX model
//! (docs/export.md).
//!
//! - float16/bfloat16 layers get their float32 inputs converted to their type: initializers
//!   used only in that type are converted in place (round to nearest even), every other tensor
//!   through one shared `Cast` per (tensor, type). Their outputs are of that type; consumers
//!   that need float32 get a `Cast` back.
//! - int8/fp8 layers (Conv, ConvTranspose, MatMul, Gemm) get explicit quantization in the QDQ
//!   format: `QuantizeLinear → DequantizeLinear` on each activation operand (per-tensor scale
//!   from its calibrated range), weights stored quantized with per-channel
//!   `DequantizeLinear`. The layer computes in float32 on the dequantized values; biases stay
//!   float32.
//! - Data-movement layers run in the type of their data input; when several data inputs
//!   disagree they all run in float32 (exact: it adds no rounding the emulation does not have).
//!
//! Quantization uses `precision::quant`, the same functions as the emulation, so the exported
//! model computes the values mixprec emulated.

pub mod external;
pub mod qdq;
pub mod schema;
mod schemas;
pub mod types;

use crate::error::{Error, Result};
use crate::graph::{Graph, Node};
use crate::onnx::{proto, tensor_to_proto, Model};
use crate::ops::cast::cast_tensor;
use crate::ops::is_data_movement;
use crate::precision::fusion::FusionModel;
use crate::precision::plan::PrecisionPlan;
use crate::precision::quant::{
    channel_scales, is_quantized_operand, quantize, scale_from_amax, weight_channel_axis,
};
use crate::precision::{has_quantized_kernel, input_follows_layer_precision, Precision};
use crate::tensor::{DType, Tensor};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// How to write the model.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// Graph inputs and outputs keep their original element types (default). When false, a
    /// float32 input read only in one reduced type takes that type, and outputs keep the type
    /// their producer computes in.
    pub keep_io_types: bool,
    /// A float16/bfloat16 layer whose op has no such type in the model's ONNX opset (e.g.
    /// bfloat16 Conv before opset 22) stays float32, with a note, instead of failing.
    pub fallback: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            keep_io_types: true,
            fallback: false,
        }
    }
}

/// An exported model and what the export did.
#[derive(Clone, Debug)]
pub struct Exported {
    pub model: proto::ModelProto,
    /// Things the user should know (fallbacks, opset changes), one line each.
    pub notes: Vec<String>,
    /// `Cast` nodes added.
    pub casts: usize,
    /// Activations given QuantizeLinear/DequantizeLinear.
    pub quantized_activations: usize,
    /// Weights stored quantized.
    pub quantized_weights: usize,
}

/// Exports `plan` (indexed like the layers of `model.graph`) as an ONNX model. The export
/// starts from the protobuf the model was loaded from (`model.proto`): it does not read the
/// file again, and maps each layer to its protobuf node through [`Node::pos`].
/// `amax`: activation ranges (absolute max per tensor name), required for int8/fp8 layers.
pub fn export_model(
    model: &Model,
    plan: &PrecisionPlan,
    amax: Option<&BTreeMap<String, f32>>,
    opts: &ExportOptions,
) -> Result<proto::ModelProto> {
    export(model, plan, amax, opts).map(|e| e.model)
}

/// [`export_model`] with the notes and counts of what was done.
pub fn export(
    model: &Model,
    plan: &PrecisionPlan,
    amax: Option<&BTreeMap<String, f32>>,
    opts: &ExportOptions,
) -> Result<Exported> {
    Exporter::new(model, plan, amax, opts)?.run()
}

/// Writes a model atomically (a temporary file renamed into place). A model over protobuf's
/// 2 GiB limit is written with its large tensors in `<file name>.data` beside it (ONNX
/// external data; see [`external::write_model_limit`]).
pub fn write_model(path: &Path, model: &proto::ModelProto) -> Result<()> {
    external::write_model_limit(path, model, external::PROTOBUF_LIMIT).map(|_| ())
}

/// A model as ONNX bytes (the protobuf encoding; weights inline, so at most 2 GiB).
pub fn model_bytes(model: &proto::ModelProto) -> Vec<u8> {
    use prost::Message;
    model.encode_to_vec()
}

/// What a layer does in the exported graph.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    /// Pure data movement (and Cast): runs in its data input's type.
    Movement,
    /// A float layer computing in this type (F32, F16 or BF16).
    Float(DType),
    /// An int8/fp8 layer: QDQ on its operands, computes in float32.
    Quant(Precision),
}

fn float_dtype(p: Precision) -> Option<DType> {
    match p {
        Precision::Float32 => Some(DType::F32),
        Precision::Float16 => Some(DType::F16),
        Precision::BFloat16 => Some(DType::BF16),
        _ => None,
    }
}

fn suffix(t: DType) -> &'static str {
    match t {
        DType::F32 => "fp32",
        DType::F16 => "fp16",
        DType::BF16 => "bf16",
        other => other.name(),
    }
}

/// ONNX `TensorProto.DataType` of a quantized precision.
fn quant_code(p: Precision) -> i32 {
    match p {
        Precision::Fp8E4M3 => proto::tensor_proto::DataType::Float8e4m3fn as i32,
        Precision::Fp8E5M2 => proto::tensor_proto::DataType::Float8e5m2 as i32,
        _ => DType::I8.onnx_code(),
    }
}

/// The stored byte of one quantized value (already on the grid of `p`).
fn quant_byte(p: Precision, q: f32) -> u8 {
    match p {
        Precision::Fp8E4M3 => crate::lowbit::F8E4M3FN::from_f32(q, true).to_bits(),
        Precision::Fp8E5M2 => crate::lowbit::F8E5M2::from_f32(q, true).to_bits(),
        _ => (q as i8) as u8,
    }
}

fn quant_tensor(name: &str, p: Precision, dims: &[usize], q: &[f32]) -> proto::TensorProto {
    proto::TensorProto {
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: Some(quant_code(p)),
        name: Some(name.to_string()),
        raw_data: Some(q.iter().map(|&x| quant_byte(p, x)).collect()),
        ..Default::default()
    }
}

fn is_default_domain(d: &str) -> bool {
    d.is_empty() || d == "ai.onnx"
}

fn node_has_subgraph(n: &proto::NodeProto) -> bool {
    n.attribute
        .iter()
        .any(|a| a.g.is_some() || !a.graphs.is_empty())
}

/// Every name read inside the subgraphs of a node list (outer-scope references included).
fn subgraph_reads(nodes: &[proto::NodeProto], inside: bool, out: &mut HashSet<String>) {
    for n in nodes {
        if inside {
            out.extend(n.input.iter().filter(|s| !s.is_empty()).cloned());
        }
        for a in &n.attribute {
            if let Some(g) = &a.g {
                subgraph_reads(&g.node, true, out);
                out.extend(g.output.iter().filter_map(|v| v.name.clone()));
            }
            for g in &a.graphs {
                subgraph_reads(&g.node, true, out);
                out.extend(g.output.iter().filter_map(|v| v.name.clone()));
            }
        }
    }
}

/// Makes a subgraph (and the subgraphs inside it) read `to` wherever it reads the outer value
/// `from` (names are not shadowed in ONNX, so every read of `from` is the outer one).
fn rename_outer_read(g: &mut proto::GraphProto, from: &str, to: &str) {
    for n in &mut g.node {
        for i in &mut n.input {
            if i == from {
                *i = to.to_string();
            }
        }
        for a in &mut n.attribute {
            for sg in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                rename_outer_read(sg, from, to);
            }
        }
    }
    for o in &mut g.output {
        if o.name.as_deref() == Some(from) {
            // A subgraph output that is the outer value itself: pass the Cast's output through.
            let vi = o.clone();
            let id = format!("{to}_passthrough");
            g.node.push(proto::NodeProto {
                op_type: Some("Identity".into()),
                input: vec![to.to_string()],
                output: vec![id.clone()],
                ..Default::default()
            });
            *o = proto::ValueInfoProto {
                name: Some(id),
                ..vi
            };
        }
    }
}

/// Every name defined anywhere (tensors and nodes, subgraphs included), for fresh names.
fn collect_names(g: &proto::GraphProto, out: &mut HashSet<String>) {
    for v in g.input.iter().chain(&g.output).chain(&g.value_info) {
        out.extend(v.name.clone());
    }
    for t in &g.initializer {
        out.extend(t.name.clone());
    }
    for st in &g.sparse_initializer {
        out.extend(st.values.as_ref().and_then(|v| v.name.clone()));
    }
    for n in &g.node {
        out.extend(n.name.clone());
        out.extend(n.input.iter().cloned());
        out.extend(n.output.iter().cloned());
        for a in &n.attribute {
            if let Some(sg) = &a.g {
                collect_names(sg, out);
            }
            for sg in &a.graphs {
                collect_names(sg, out);
            }
        }
    }
}

/// The position in the proto's node list of each node of `graph` (its [`Node::pos`]),
/// checked against the protobuf: the node there must have the same outputs.
fn proto_order(g: &proto::GraphProto, graph: &Graph) -> Result<Vec<usize>> {
    graph
        .nodes
        .iter()
        .map(|n| {
            n.pos
                .filter(|&p| g.node.get(p).is_some_and(|pn| pn.output == n.outputs))
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "export: layer '{}' has no matching node in the loaded model's protobuf",
                        n.name
                    ))
                })
        })
        .collect()
}

/// Which inputs of a data-movement op carry the data (share the output's type): the op's
/// definition says.
fn movement_data_inputs(node: &Node, n: usize) -> Vec<usize> {
    crate::ops::def_of(node)
        .map(|d| d.type_shared_inputs(n))
        .unwrap_or_else(|| vec![0])
}

/// "s" after a count other than one.
fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

struct Exporter<'a> {
    model: &'a proto::ModelProto,
    graph: &'a Graph,
    plan: &'a PrecisionPlan,
    amax: Option<&'a BTreeMap<String, f32>>,
    opts: &'a ExportOptions,
    /// Position of IR node k in the proto's node list.
    order: Vec<usize>,
    /// Default-domain opset of the exported model.
    opset: i64,
    /// Element types in the original model (unknown types are absent).
    orig: HashMap<String, DType>,
    /// Element types in the exported model.
    cur: HashMap<String, DType>,
    /// Initializers the export may convert (not overridable graph inputs).
    foldable: HashSet<String>,
    names: HashSet<String>,
    nodes: Vec<proto::NodeProto>,
    inits: Vec<proto::TensorProto>,
    /// (tensor, type) -> converted tensor (a Cast output or a converted initializer).
    converted: HashMap<(String, DType), String>,
    /// Original initializer -> its converted copies.
    init_copies: HashMap<String, Vec<String>>,
    /// Names of the Cast nodes the export added.
    added_casts: HashSet<String>,
    /// (tensor, precision, axis) -> dequantized tensor.
    quantized: HashMap<(String, Precision, Option<usize>), String>,
    notes: Vec<String>,
    casts: usize,
    quantized_activations: usize,
    quantized_weights: usize,
}

impl<'a> Exporter<'a> {
    fn new(
        loaded: &'a Model,
        plan: &'a PrecisionPlan,
        amax: Option<&'a BTreeMap<String, f32>>,
        opts: &'a ExportOptions,
    ) -> Result<Exporter<'a>> {
        let graph = &loaded.graph;
        let model = &*loaded.proto;
        if plan.layers.len() != graph.nodes.len() {
            return Err(Error::Invalid(format!(
                "the precision plan has {} layers, the model {}",
                plan.layers.len(),
                graph.nodes.len()
            )));
        }
        let g = model.graph.as_ref().ok_or_else(|| Error::Model {
            path: loaded.path.clone(),
            msg: "the model has no graph".into(),
        })?;
        let order = proto_order(g, graph)?;
        let mut names = HashSet::new();
        collect_names(g, &mut names);
        for n in &graph.nodes {
            names.insert(n.name.clone());
        }
        // The emulation converts exactly these weights as the export stores them
        // (`Graph::constant_initializer`; docs/numerics.md, "Weights beyond float16's range").
        let foldable = graph
            .initializers
            .keys()
            .chain(graph.folded.keys())
            .filter(|k| graph.constant_initializer(k).is_some())
            .cloned()
            .collect();
        let mut ex = Exporter {
            opset: graph.opset(),
            model,
            graph,
            plan,
            amax,
            opts,
            order,
            orig: HashMap::new(),
            cur: HashMap::new(),
            foldable,
            names,
            nodes: Vec::new(),
            inits: Vec::new(),
            converted: HashMap::new(),
            init_copies: HashMap::new(),
            added_casts: HashSet::new(),
            quantized: HashMap::new(),
            notes: Vec::new(),
            casts: 0,
            quantized_activations: 0,
            quantized_weights: 0,
        };
        ex.type_original()?;
        Ok(ex)
    }

    /// Element types of every tensor of the original model: declared ones (graph inputs,
    /// outputs, value_info, initializers) first, else inferred from the op.
    fn type_original(&mut self) -> Result<()> {
        self.orig = types::scope_types(self.graph, &HashMap::new());
        self.cur = self.orig.clone();
        Ok(())
    }

    fn fresh(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut k = 0;
        while self.names.contains(&name) {
            k += 1;
            name = format!("{base}_{k}");
        }
        self.names.insert(name.clone());
        name
    }

    fn op_err(node: &Node, msg: String) -> Error {
        Error::Op {
            node: node.name.clone(),
            op: node.op_type.clone(),
            msg,
        }
    }

    /// The treatment of every layer, checked against the ONNX schemas at the target opset.
    fn roles(&mut self) -> Result<Vec<Role>> {
        let mut roles = Vec::with_capacity(self.graph.nodes.len());
        if !self.plan.inner.is_empty() {
            self.notes.push(format!(
                "the precisions the plan sets inside subgraphs ({} node(s)) are not exported: subgraphs stay as they are",
                self.plan.inner.len()
            ));
        }
        if self.opset > schemas::MAX_OPSET {
            self.notes.push(format!(
                "the model's opset {} is newer than mixprec's ONNX schema table (opset {}): type support is taken from opset {}",
                self.opset,
                schemas::MAX_OPSET,
                schemas::MAX_OPSET
            ));
        }
        for (k, node) in self.graph.nodes.iter().enumerate() {
            let pnode = &self.model.graph.as_ref().expect("graph").node[self.order[k]];
            let op = node.op_type.as_str();
            // Folded weight nodes stay as they are: the layers reading them convert.
            if is_data_movement(node) || self.graph.is_folded(node) {
                roles.push(Role::Movement);
                continue;
            }
            // Integer ops of operator-style quantization stay as written (their float
            // inputs and outputs are float32 in every schema defining them); the emulation
            // runs them so whatever the plan says (ops::computes_in_integers).
            if crate::ops::computes_in_integers(node) {
                roles.push(Role::Float(DType::F32));
                continue;
            }
            let p = self.plan.layers[k];
            if p != Precision::Float32 {
                let runtime_float16 = p == Precision::Float16 && types::has_float16_kernel(node);
                if !is_default_domain(&node.domain) && !runtime_float16 {
                    // A contrib op's types are its runtime's business: float32 is the one type
                    // every runtime that has the op accepts (ONNX Runtime's CPU kernels of the
                    // ops `has_float16_kernel` lists take float16 too).
                    let why = format!(
                        "ops of domain '{}' keep the types their runtime defines",
                        node.domain
                    );
                    if !self.opts.fallback {
                        return Err(Self::op_err(
                            node,
                            format!("cannot be exported in {p}: {why}; keep it in float32 (export fallback)"),
                        ));
                    }
                    self.notes.push(format!(
                        "layer '{}' ({}.{op}) stays float32: {why} (the emulation ran it in {p})",
                        node.name, node.domain
                    ));
                    roles.push(Role::Float(DType::F32));
                    continue;
                }
                if node_has_subgraph(pnode) {
                    self.notes.push(format!(
                        "layer '{}' ({op}) is exported in float32 with its subgraphs unchanged (the emulation ran it in {p})",
                        node.name
                    ));
                    roles.push(Role::Float(DType::F32));
                    continue;
                }
            }
            let role = if p.is_scaled() {
                if has_quantized_kernel(node) {
                    Role::Quant(p)
                } else {
                    self.notes.push(format!(
                        "layer '{}' ({op}) has no {p} kernel (only Conv, ConvTranspose, MatMul and Gemm do): exported in float32",
                        node.name
                    ));
                    Role::Float(DType::F32)
                }
            } else {
                let t = float_dtype(p).expect("float precision");
                if t != DType::F32 {
                    let bad = node.inputs.iter().enumerate().find(|(i, name)| {
                        !name.is_empty()
                            && self.orig.get(name.as_str()) == Some(&DType::F32)
                            && input_follows_layer_precision(node, *i)
                            // (ONNX's schemas; ONNX Runtime's own ops say for themselves.)
                            && !(t == DType::F16 && types::has_float16_kernel(node))
                            && !schema::input_accepts(op, self.opset, *i, t)
                    });
                    if let Some((i, name)) = bad {
                        let why = format!(
                            "ONNX opset {} has no {} {op} (input {i} '{name}')",
                            self.opset,
                            t.name()
                        );
                        if !self.opts.fallback {
                            return Err(Self::op_err(
                                node,
                                format!("cannot run in {p}: {why}; keep it in float32 (export fallback) or raise the model's opset"),
                            ));
                        }
                        self.notes
                            .push(format!("layer '{}' ({op}) stays float32: {why}", node.name));
                        roles.push(Role::Float(DType::F32));
                        continue;
                    }
                }
                Role::Float(t)
            };
            roles.push(role);
        }
        Ok(roles)
    }

    fn cur_type(&self, t: &str, node: &Node) -> Result<DType> {
        self.cur.get(t).copied().ok_or_else(|| {
            Self::op_err(
                node,
                format!(
                    "the element type of its input '{t}' is unknown; run ONNX shape inference on the model first"
                ),
            )
        })
    }

    /// `t` as type `to`: itself, a converted initializer, or the output of a (shared) Cast.
    fn get_as(&mut self, t: &str, to: DType, node: &Node) -> Result<String> {
        if t.is_empty() || self.cur_type(t, node)? == to {
            return Ok(t.to_string());
        }
        let key = (t.to_string(), to);
        if let Some(n) = self.converted.get(&key) {
            return Ok(n.clone());
        }
        let name = self.fresh(&format!("{t}_{}", suffix(to)));
        if let Some(w) = self
            .foldable
            .contains(t)
            .then(|| self.graph.constant_initializer(t))
            .flatten()
        {
            let what = if self.graph.initializers.contains_key(t) {
                "initializer"
            } else {
                "Constant value"
            };
            // A float16 initializer never holds an infinity the float32 one did not: finite
            // values beyond ±65504 are clamped to it, as TensorRT, onnxconverter-common and
            // ModelOpt AutoCast convert weights (docs/numerics.md, "Weights beyond float16's
            // range"); a Cast would make them ±inf.
            let clamped = match (to, w.as_f32()) {
                (DType::F16, Some(v)) => {
                    let mut v = v.to_vec();
                    let n = crate::precision::clamp_finite_to_f16(&mut v);
                    (n > 0).then(|| (n, Tensor::from_f32(w.shape().to_vec(), v)))
                }
                _ => None,
            };
            let c = match &clamped {
                Some((n, v)) => {
                    self.notes.push(format!(
                        "{what} '{t}' (read by float16 layer '{}') has {n} finite value{} beyond float16's range: stored clamped to ±65504, as TensorRT converts weights",
                        node.name,
                        plural(*n)
                    ));
                    cast_tensor(v, to)
                }
                None => cast_tensor(w, to),
            };
            // Infinities the converted copy holds (the float32 ones, which TensorRT's builder
            // keeps too; bfloat16's overflows, which a Cast makes) are said, never written
            // silently.
            if let (Some(v), DType::F16 | DType::BF16) = (w.as_f32(), to) {
                let ty = to.name();
                let kept = v.iter().filter(|x| x.is_infinite()).count();
                let made = match to {
                    DType::BF16 => v
                        .iter()
                        .filter(|x| x.is_finite() && half::bf16::from_f32(**x).is_infinite())
                        .count(),
                    _ => 0,
                };
                if kept > 0 {
                    self.notes.push(format!(
                        "{what} '{t}' (read by {ty} layer '{}') holds {kept} infinite value{}: stored as ±inf in {ty}, as TensorRT keeps them",
                        node.name,
                        plural(kept)
                    ));
                }
                if made > 0 {
                    self.notes.push(format!(
                        "{what} '{t}' (read by {ty} layer '{}') has {made} finite value{} beyond {ty}'s range: stored as ±inf, as a Cast rounds them (keep the layer in float32 to avoid it)",
                        node.name,
                        plural(made)
                    ));
                }
            }
            self.inits.push(tensor_to_proto(&name, &c));
            self.init_copies
                .entry(t.to_string())
                .or_default()
                .push(name.clone());
        } else {
            // A weight computed by nodes the export keeps (or an initializer a graph input can
            // override) is converted at run time: a Cast makes its values beyond ±65504 ±inf.
            let overflows = to == DType::F16
                && self
                    .graph
                    .weight(t)
                    .and_then(Tensor::as_f32)
                    .is_some_and(|v| v.iter().any(|x| x.is_finite() && x.abs() >= 65520.0));
            if overflows {
                self.notes.push(format!(
                    "weight '{t}' (read by float16 layer '{}') has finite values beyond float16's range: its Cast to float16 makes them ±inf at run time (keep the layer in float32 to avoid it)",
                    node.name
                ));
            }
            let node_name = self.fresh(&format!("{t}_Cast_{}", suffix(to)));
            self.nodes.push(proto::NodeProto {
                name: Some(node_name.clone()),
                op_type: Some("Cast".into()),
                input: vec![t.to_string()],
                output: vec![name.clone()],
                attribute: vec![schema::int_attr("to", to.onnx_code() as i64)],
                ..Default::default()
            });
            self.added_casts.insert(node_name);
            self.casts += 1;
        }
        self.cur.insert(name.clone(), to);
        self.converted.insert(key, name.clone());
        Ok(name)
    }

    /// Whether constant `t` ([`Graph::constant_initializer`]) converts to `to` without changing
    /// any value.
    fn exact_in(&self, t: &str, to: DType) -> bool {
        let Some(w) = self.graph.constant_initializer(t) else {
            return false;
        };
        let Some(v) = w.to_f32_vec() else {
            return false;
        };
        let c = cast_tensor(w, to).to_f32_vec().unwrap_or_default();
        v.len() == c.len()
            && v.iter()
                .zip(&c)
                .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()))
    }

    /// Per-channel quantized weight; returns the float32 output. An initializer is stored
    /// quantized, read through DequantizeLinear; a folded weight (computed by nodes the export
    /// keeps, e.g. a Transpose or DequantizeLinear of an initializer) gets a per-channel
    /// QuantizeLinear → DequantizeLinear with the scales the emulation computes from its value.
    fn quant_weight(&mut self, node: &Node, index: usize, t: &str, p: Precision) -> Result<String> {
        let graph = self.graph;
        let stored = graph.initializers.contains_key(t);
        let w = graph
            .weight(t)
            .ok_or_else(|| Self::op_err(node, format!("weight '{t}' has no value")))?;
        let axis = weight_channel_axis(node, index, w.rank()).ok_or_else(|| {
            Self::op_err(
                node,
                format!(
                    "weight '{t}' of rank {} cannot be quantized per channel",
                    w.rank()
                ),
            )
        })?;
        if axis >= w.rank() {
            return Err(Self::op_err(
                node,
                format!(
                    "weight '{t}' of rank {} has no channel axis {axis}",
                    w.rank()
                ),
            ));
        }
        let key = (t.to_string(), p, Some(axis));
        if let Some(n) = self.quantized.get(&key) {
            return Ok(n.clone());
        }
        let v = w
            .as_f32()
            .ok_or_else(|| Self::op_err(node, format!("weight '{t}' is not float32")))?;
        let shape = w.shape();
        let scales = channel_scales(v, shape, axis, p);
        let channels = shape[axis];
        if !stored {
            return Ok(self.qdq_folded_weight(t, p, axis, scales));
        }
        let inner: usize = shape[axis + 1..].iter().product();
        let q: Vec<f32> = v
            .iter()
            .enumerate()
            .map(|(i, &x)| quantize(x, scales[(i / inner.max(1)) % channels.max(1)], p))
            .collect();
        let qn = self.fresh(&format!("{t}_quantized"));
        let sn = self.fresh(&format!("{t}_scale"));
        let zn = self.fresh(&format!("{t}_zero_point"));
        self.inits.push(quant_tensor(&qn, p, shape, &q));
        self.inits.push(tensor_to_proto(
            &sn,
            &Tensor::from_f32(vec![channels], scales),
        ));
        self.inits
            .push(quant_tensor(&zn, p, &[channels], &vec![0.0; channels]));
        let out = self.fresh(&format!("{t}_dequantized"));
        let dq = self.fresh(&format!("{t}_DequantizeLinear"));
        self.nodes.push(proto::NodeProto {
            name: Some(dq),
            op_type: Some("DequantizeLinear".into()),
            input: vec![qn, sn, zn],
            output: vec![out.clone()],
            attribute: vec![schema::int_attr("axis", axis as i64)],
            ..Default::default()
        });
        self.cur.insert(out.clone(), DType::F32);
        self.quantized.insert(key, out.clone());
        self.quantized_weights += 1;
        Ok(out)
    }

    /// QuantizeLinear -> DequantizeLinear along `axis` on the folded weight `t` (float32, its
    /// per-channel `scales`); returns the float32 output.
    fn qdq_folded_weight(
        &mut self,
        t: &str,
        p: Precision,
        axis: usize,
        scales: Vec<f32>,
    ) -> String {
        let channels = scales.len();
        let sn = self.fresh(&format!("{t}_scale"));
        let zn = self.fresh(&format!("{t}_zero_point"));
        self.inits.push(tensor_to_proto(
            &sn,
            &Tensor::from_f32(vec![channels], scales),
        ));
        self.inits
            .push(quant_tensor(&zn, p, &[channels], &vec![0.0; channels]));
        let qn = self.fresh(&format!("{t}_quantized"));
        let out = self.fresh(&format!("{t}_dequantized"));
        let qnode = self.fresh(&format!("{t}_QuantizeLinear"));
        let dqnode = self.fresh(&format!("{t}_DequantizeLinear"));
        let axis_attr = schema::int_attr("axis", axis as i64);
        self.nodes.push(proto::NodeProto {
            name: Some(qnode),
            op_type: Some("QuantizeLinear".into()),
            input: vec![t.to_string(), sn.clone(), zn.clone()],
            output: vec![qn.clone()],
            attribute: vec![axis_attr.clone()],
            ..Default::default()
        });
        self.nodes.push(proto::NodeProto {
            name: Some(dqnode),
            op_type: Some("DequantizeLinear".into()),
            input: vec![qn, sn, zn],
            output: vec![out.clone()],
            attribute: vec![axis_attr],
            ..Default::default()
        });
        self.cur.insert(out.clone(), DType::F32);
        self.quantized
            .insert((t.to_string(), p, Some(axis)), out.clone());
        self.quantized_weights += 1;
        out
    }

    /// Per-tensor QuantizeLinear -> DequantizeLinear on an activation; returns the float32 output.
    fn quant_activation(&mut self, node: &Node, t: &str, p: Precision) -> Result<String> {
        let key = (t.to_string(), p, None);
        if let Some(n) = self.quantized.get(&key) {
            return Ok(n.clone());
        }
        let amax = match self.amax {
            None => {
                return Err(Self::op_err(
                    node,
                    format!("runs in {p}, which needs activation ranges (amax), and none were given (tensor '{t}')"),
                ))
            }
            Some(m) => *m.get(t).ok_or_else(|| {
                Self::op_err(
                    node,
                    format!("runs in {p} but tensor '{t}' has no calibrated range (amax)"),
                )
            })?,
        };
        let x = self.get_as(t, DType::F32, node)?;
        let scale = scale_from_amax(amax, p);
        let sn = self.fresh(&format!("{t}_scale"));
        let zn = self.fresh(&format!("{t}_zero_point"));
        self.inits
            .push(tensor_to_proto(&sn, &Tensor::scalar_f32(scale)));
        self.inits.push(quant_tensor(&zn, p, &[], &[0.0]));
        let qn = self.fresh(&format!("{t}_quantized"));
        let out = self.fresh(&format!("{t}_dequantized"));
        let qnode = self.fresh(&format!("{t}_QuantizeLinear"));
        let dqnode = self.fresh(&format!("{t}_DequantizeLinear"));
        self.nodes.push(proto::NodeProto {
            name: Some(qnode),
            op_type: Some("QuantizeLinear".into()),
            input: vec![x, sn.clone(), zn.clone()],
            output: vec![qn.clone()],
            ..Default::default()
        });
        self.nodes.push(proto::NodeProto {
            name: Some(dqnode),
            op_type: Some("DequantizeLinear".into()),
            input: vec![qn, sn, zn],
            output: vec![out.clone()],
            ..Default::default()
        });
        self.cur.insert(out.clone(), DType::F32);
        self.quantized.insert(key, out.clone());
        self.quantized_activations += 1;
        Ok(out)
    }

    /// The inputs of a data-movement node: all data inputs in one type (see module docs).
    fn movement_inputs(&mut self, node: &Node) -> Result<Vec<String>> {
        let mut inputs = node.inputs.clone();
        let op = node.op_type.as_str();
        if op == "CastLike" {
            // The output type follows input 1: keep it in its original type.
            if let Some(like) = node.inputs.get(1).filter(|s| !s.is_empty()) {
                if let Some(&o) = self.orig.get(like) {
                    inputs[1] = self.get_as(like, o, node)?;
                }
            }
            return Ok(inputs);
        }
        let data: Vec<usize> = movement_data_inputs(node, inputs.len())
            .into_iter()
            .filter(|&i| {
                inputs.get(i).is_some_and(|s| !s.is_empty())
                    && self.orig.get(&inputs[i]) == Some(&DType::F32)
                    && input_follows_layer_precision(node, i)
            })
            .collect();
        if data.is_empty() {
            return Ok(inputs);
        }
        // Types of the inputs computed at run time (initializers can be converted).
        let mut act_types = Vec::new();
        for &i in &data {
            let name = &inputs[i];
            if !self.foldable.contains(name) {
                let t = self.cur_type(name, node)?;
                if !act_types.contains(&t) {
                    act_types.push(t);
                }
            }
        }
        let mut to = match act_types.as_slice() {
            [t] => *t,
            _ => DType::F32,
        };
        if to != DType::F32 {
            let ok = data.iter().all(|&i| {
                schema::input_accepts(op, self.opset, i, to)
                    && (!self.foldable.contains(&inputs[i]) || self.exact_in(&inputs[i], to))
            });
            if !ok {
                to = DType::F32;
            }
        }
        for &i in &data {
            inputs[i] = self.get_as(&node.inputs[i], to, node)?;
        }
        Ok(inputs)
    }

    fn float_inputs(&mut self, node: &Node, to: DType) -> Result<Vec<String>> {
        let mut inputs = node.inputs.clone();
        for (i, name) in node.inputs.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            match self.orig.get(name).copied() {
                Some(DType::F32) if input_follows_layer_precision(node, i) => {
                    inputs[i] = self.get_as(name, to, node)?;
                }
                Some(o) if o.is_float() => inputs[i] = self.get_as(name, o, node)?,
                _ => {}
            }
        }
        // QuantizeLinear's x and y_scale share one type (opset 19+), and its scale stays
        // float32 as in the emulation, which quantizes the rounded x in float32: x goes
        // through the layer's type and back to float32.
        if node.op_type == "QuantizeLinear" && to != DType::F32 {
            if let Some(x) = inputs.first().filter(|x| !x.is_empty()).cloned() {
                if self.cur.get(&x) == Some(&to) {
                    inputs[0] = self.get_as(&x, DType::F32, node)?;
                }
            }
        }
        Ok(inputs)
    }

    fn quant_inputs(&mut self, node: &Node, p: Precision) -> Result<Vec<String>> {
        let mut inputs = node.inputs.clone();
        for (i, name) in node.inputs.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            match self.orig.get(name).copied() {
                Some(DType::F32)
                    if input_follows_layer_precision(node, i) && is_quantized_operand(node, i) =>
                {
                    inputs[i] = if self.graph.weight(name).is_some() {
                        self.quant_weight(node, i, name, p)?
                    } else {
                        self.quant_activation(node, name, p)?
                    };
                }
                Some(o) if o.is_float() => inputs[i] = self.get_as(name, o, node)?,
                _ => {}
            }
        }
        Ok(inputs)
    }

    /// Types of a node's outputs once its inputs are `inputs`.
    fn output_types(&self, node: &Node, inputs: &[String]) -> Result<Vec<Option<DType>>> {
        let orig_in: Vec<Option<DType>> = node
            .inputs
            .iter()
            .map(|s| self.orig.get(s).copied())
            .collect();
        let new_in: Vec<Option<DType>> = inputs.iter().map(|s| self.cur.get(s).copied()).collect();
        let orig_out: Vec<Option<DType>> = node
            .outputs
            .iter()
            .map(|s| self.orig.get(s).copied())
            .collect();
        if orig_in == new_in {
            return Ok(orig_out);
        }
        let unknown = || {
            Self::op_err(
                node,
                "mixprec cannot tell the types of its outputs once its inputs change type".into(),
            )
        };
        let rule_orig = types::infer_outputs(node, &orig_in).ok_or_else(unknown)?;
        let rule_new = types::infer_outputs(node, &new_in).ok_or_else(unknown)?;
        let mut out = Vec::with_capacity(orig_out.len());
        for (j, o) in orig_out.iter().enumerate() {
            let ro = rule_orig.get(j).copied().flatten();
            let rn = rule_new.get(j).copied().flatten();
            let t = if o.is_some() && ro == *o { rn } else { *o };
            if let (Some(o), Some(t)) = (o, t) {
                if o != &t && !(o.is_float() && t.is_float()) {
                    return Err(unknown());
                }
            }
            out.push(t);
        }
        Ok(out)
    }

    fn run(mut self) -> Result<Exported> {
        // Target opset: per-axis DequantizeLinear needs 13, float8 types 19.
        let mut target = self.opset;
        for (k, node) in self.graph.nodes.iter().enumerate() {
            if is_data_movement(node) || self.graph.is_folded(node) || !has_quantized_kernel(node) {
                continue;
            }
            match self.plan.layers[k] {
                Precision::Int8 => target = target.max(13),
                Precision::Fp8E4M3 | Precision::Fp8E5M2 => target = target.max(19),
                _ => {}
            }
        }
        let from = self.opset;
        if target > from {
            let g = self.model.graph.as_ref().expect("graph");
            schema::check_upgrade(&g.node, from, target)?;
            self.notes.push(format!(
                "raised the model's ONNX opset from {from} to {target} for QuantizeLinear/DequantizeLinear"
            ));
        }
        self.opset = target;
        let roles = self.roles()?;
        // TensorRT 11.3 runs a float32 attention between float16 values as a float16 kernel
        // with FP32 accumulation when Q, K and V are cast up around it: the Cast down goes
        // directly after it (docs/export.md, "Attention kept in float32").
        let cast_down_after: HashSet<usize> = match self.plan.fusion {
            FusionModel::TensorRt => {
                crate::exec::fusion::upcast_attention_outputs(self.graph, &self.plan.layers)
                    .into_iter()
                    .collect()
            }
            FusionModel::None => HashSet::new(),
        };

        let pgraph = self.model.graph.clone().expect("graph");
        for (k, node) in self.graph.nodes.iter().enumerate() {
            let mut out = pgraph.node[self.order[k]].clone();
            out.name = Some(node.name.clone());
            let inputs = match roles[k] {
                Role::Movement => self.movement_inputs(node)?,
                Role::Float(t) => self.float_inputs(node, t)?,
                Role::Quant(p) => self.quant_inputs(node, p)?,
            };
            let outs = self.output_types(node, &inputs)?;
            for (o, t) in node.outputs.iter().zip(outs) {
                if o.is_empty() {
                    continue;
                }
                match t {
                    Some(t) => self.cur.insert(o.clone(), t),
                    None => self.cur.remove(o),
                };
            }
            out.input = inputs;
            // Subgraphs read outer values by name in their original type: where the export
            // changed a value's type, they read a Cast back instead.
            for r in node.implicit_inputs() {
                if let Some(&o) = self.orig.get(&r) {
                    if o.is_float() && self.cur.get(&r) != Some(&o) {
                        let c = self.get_as(&r, o, node)?;
                        for a in &mut out.attribute {
                            for g in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                                rename_outer_read(g, &r, &c);
                            }
                        }
                    }
                }
            }
            self.nodes.push(out);
            if cast_down_after.contains(&k) {
                self.cast_down_after_last(node);
            }
        }
        self.finish(pgraph, from)
    }

    /// The attention output `node` (the node just written) writes in float32 leaves it in
    /// float16 through a Cast directly after it: the node writes `<o>_fp32`, the Cast `o`, so
    /// the data movement after it (Transpose, Reshape) runs in float16 and TensorRT 11.3 sees
    /// the attention graph between Casts up and one Cast down.
    fn cast_down_after_last(&mut self, node: &Node) {
        let Some(o) = node.outputs.first().filter(|o| !o.is_empty()) else {
            return;
        };
        if self.cur.get(o) != Some(&DType::F32) {
            return;
        }
        let inner = self.fresh(&format!("{o}_fp32"));
        let last = self.nodes.last_mut().expect("the node was just written");
        last.output[0] = inner.clone();
        let node_name = self.fresh(&format!("{o}_Cast_fp16"));
        self.nodes.push(proto::NodeProto {
            name: Some(node_name.clone()),
            op_type: Some("Cast".into()),
            input: vec![inner.clone()],
            output: vec![o.clone()],
            attribute: vec![schema::int_attr("to", DType::F16.onnx_code() as i64)],
            ..Default::default()
        });
        self.added_casts.insert(node_name);
        self.casts += 1;
        self.cur.insert(inner, DType::F32);
        self.cur.insert(o.clone(), DType::F16);
    }

    fn rename(&mut self, from: &str, to: &str) {
        for n in &mut self.nodes {
            for s in n.input.iter_mut().chain(n.output.iter_mut()) {
                if s == from {
                    *s = to.to_string();
                }
            }
        }
    }

    fn finish(mut self, pgraph: proto::GraphProto, from: i64) -> Result<Exported> {
        let mut g = pgraph;
        let mut sub_reads = HashSet::new();
        subgraph_reads(&self.nodes, false, &mut sub_reads);

        // Graph outputs.
        let mut outputs = g.output.clone();
        for vi in &mut outputs {
            let o = vi.name.clone().unwrap_or_default();
            let (Some(&orig), Some(&cur)) = (self.orig.get(&o), self.cur.get(&o)) else {
                continue;
            };
            if orig == cur {
                continue;
            }
            if !self.opts.keep_io_types {
                set_elem_type(vi, cur);
                continue;
            }
            if sub_reads.contains(&o) {
                return Err(Error::Invalid(format!(
                    "graph output '{o}' is also read inside a subgraph; mixprec cannot change its type"
                )));
            }
            let internal = self.fresh(&format!("{o}_{}", suffix(cur)));
            self.rename(&o, &internal);
            let existing = self.converted.get(&(o.clone(), orig)).cloned();
            match existing {
                // A Cast back to the original type exists: it now produces the output itself.
                Some(c) => self.rename(&c, &o),
                None => {
                    let node_name = self.fresh(&format!("{o}_Cast_{}", suffix(orig)));
                    self.nodes.push(proto::NodeProto {
                        name: Some(node_name.clone()),
                        op_type: Some("Cast".into()),
                        input: vec![internal.clone()],
                        output: vec![o.clone()],
                        attribute: vec![schema::int_attr("to", orig.onnx_code() as i64)],
                        ..Default::default()
                    });
                    self.added_casts.insert(node_name);
                    self.casts += 1;
                }
            }
            self.cur.insert(internal, cur);
            self.cur.insert(o.clone(), orig);
        }
        g.output = outputs;

        // Graph inputs read only through one added Cast take that Cast's type.
        if !self.opts.keep_io_types {
            let out_names: HashSet<String> =
                g.output.iter().filter_map(|v| v.name.clone()).collect();
            for vi in &mut g.input {
                let x = vi.name.clone().unwrap_or_default();
                if self.foldable.contains(&x) || out_names.contains(&x) || sub_reads.contains(&x) {
                    continue;
                }
                let readers: Vec<usize> = (0..self.nodes.len())
                    .filter(|&i| self.nodes[i].input.contains(&x))
                    .collect();
                let [r] = readers.as_slice() else { continue };
                let n = &self.nodes[*r];
                if !self.added_casts.contains(n.name.as_deref().unwrap_or("")) {
                    continue;
                }
                let cast_out = n.output[0].clone();
                let Some(&t) = self.cur.get(&cast_out) else {
                    continue;
                };
                self.nodes.remove(*r);
                self.casts -= 1;
                self.rename(&cast_out, &x);
                set_elem_type(vi, t);
                self.cur.insert(x, t);
            }
        }

        // Subgraphs read outer tensors by name: their types must not change.
        for name in &sub_reads {
            if let (Some(o), Some(c)) = (self.orig.get(name), self.cur.get(name)) {
                if o != c {
                    return Err(Error::Invalid(format!(
                        "tensor '{name}' is read inside a subgraph; exporting its producer in {} would change its type",
                        c.name()
                    )));
                }
            }
        }

        // Initializers: drop the ones nothing reads any more, convert in place where a single
        // converted copy replaced the original, inline external data.
        let mut read: HashSet<String> = sub_reads.clone();
        for n in &self.nodes {
            read.extend(n.input.iter().cloned());
        }
        read.extend(g.output.iter().filter_map(|v| v.name.clone()));
        let graph_inputs: HashSet<String> = g.input.iter().filter_map(|v| v.name.clone()).collect();
        // Read by a node of the model as loaded (its nodes are the graph's, input for input).
        let values = self.graph.values();
        let orig_read = |name: &str| {
            values
                .id(name)
                .is_some_and(|id| values.consumers(id).iter().any(|c| c.input.is_some()))
        };
        let dropped =
            |name: &str| orig_read(name) && !read.contains(name) && !graph_inputs.contains(name);
        // A Constant node whose every reader now reads its converted copy goes, like an
        // initializer nothing reads any more.
        self.nodes.retain(|n| {
            n.op_type.as_deref() != Some("Constant")
                || !n.domain.as_deref().unwrap_or("").is_empty()
                || !n.output.iter().all(|o| dropped(o))
        });
        let mut initializers = Vec::with_capacity(g.initializer.len() + self.inits.len());
        let mut renames = Vec::new();
        for t in std::mem::take(&mut g.initializer) {
            let name = t.name.clone().unwrap_or_default();
            if dropped(&name) {
                if let Some([copy]) = self.init_copies.get(&name).map(Vec::as_slice) {
                    renames.push((copy.clone(), name.clone()));
                }
                continue;
            }
            let external =
                t.data_location == Some(proto::tensor_proto::DataLocation::External as i32);
            match self.graph.initializers.get(&name) {
                Some(w) if external => initializers.push(tensor_to_proto(&name, w)),
                _ => initializers.push(t),
            }
        }
        let mut sparse = Vec::new();
        for st in std::mem::take(&mut g.sparse_initializer) {
            let name = st
                .values
                .as_ref()
                .and_then(|v| v.name.clone())
                .unwrap_or_default();
            if dropped(&name) {
                continue;
            }
            let external = [st.values.as_ref(), st.indices.as_ref()].iter().any(|t| {
                t.is_some_and(|t| {
                    t.data_location == Some(proto::tensor_proto::DataLocation::External as i32)
                })
            });
            match self.graph.initializers.get(&name) {
                Some(w) if external => initializers.push(tensor_to_proto(&name, w)),
                _ => sparse.push(st),
            }
        }
        initializers.append(&mut self.inits);
        let renames: HashMap<String, String> = renames.into_iter().collect();
        if !renames.is_empty() {
            for t in &mut initializers {
                if let Some(to) = t.name.as_ref().and_then(|n| renames.get(n)) {
                    t.name = Some(to.clone());
                }
            }
            for n in &mut self.nodes {
                for s in n.input.iter_mut() {
                    if let Some(to) = renames.get(s.as_str()) {
                        *s = to.clone();
                    }
                }
            }
            for (copy, name) in &renames {
                if let Some(t) = self.cur.remove(copy) {
                    self.cur.insert(name.clone(), t);
                }
            }
        }
        g.initializer = initializers;
        g.sparse_initializer = sparse;

        // value_info: keep entries of tensors that still exist, with their current type.
        let produced: HashSet<String> = self
            .nodes
            .iter()
            .flat_map(|n| n.output.iter().cloned())
            .collect();
        let mut value_info = Vec::new();
        for mut vi in std::mem::take(&mut g.value_info) {
            let name = vi.name.clone().unwrap_or_default();
            if !produced.contains(&name) {
                continue;
            }
            if let Some(&t) = self.cur.get(&name) {
                set_elem_type(&mut vi, t);
            }
            value_info.push(vi);
        }
        g.value_info = value_info;

        // Opset (and the rewrites an upgrade needs), IR version.
        let to = self.opset;
        let mut nodes = std::mem::take(&mut self.nodes);
        if to > from {
            let mut inits = Vec::new();
            let mut fresh = |b: &str| self.fresh(b);
            schema::upgrade_nodes(&mut nodes, from, to, &mut fresh, Some(&mut inits));
            g.initializer.extend(inits);
        }
        g.node = nodes;
        let mut model = without_graph(self.model);
        let mut found = false;
        for o in &mut model.opset_import {
            if is_default_domain(o.domain.as_deref().unwrap_or("")) {
                o.version = Some(o.version.unwrap_or(1).max(to));
                found = true;
            }
        }
        if !found {
            model.opset_import.push(proto::OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(to),
            });
        }
        let ir = model.ir_version.unwrap_or(0);
        model.ir_version = Some(ir.max(schema::min_ir_version(to)));
        model.graph = Some(g);
        Ok(Exported {
            model,
            notes: self.notes,
            casts: self.casts,
            quantized_activations: self.quantized_activations,
            quantized_weights: self.quantized_weights,
        })
    }
}

/// A copy of `m` without its graph (which the export rebuilds).
fn without_graph(m: &proto::ModelProto) -> proto::ModelProto {
    proto::ModelProto {
        ir_version: m.ir_version,
        opset_import: m.opset_import.clone(),
        producer_name: m.producer_name.clone(),
        producer_version: m.producer_version.clone(),
        domain: m.domain.clone(),
        model_version: m.model_version,
        doc_string: m.doc_string.clone(),
        graph: None,
        metadata_props: m.metadata_props.clone(),
        training_info: m.training_info.clone(),
        functions: m.functions.clone(),
        configuration: m.configuration.clone(),
    }
}

fn set_elem_type(vi: &mut proto::ValueInfoProto, t: DType) {
    if let Some(proto::type_proto::Value::TensorType(tt)) =
        vi.r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        tt.elem_type = Some(t.onnx_code());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::tensor_from_proto;

    use crate::onnx::testing::{node, vi};

    fn model(
        nodes: Vec<proto::NodeProto>,
        inits: Vec<(&str, Tensor)>,
        outputs: &[&str],
        opset: i64,
    ) -> proto::ModelProto {
        let outs: Vec<(&str, &[i64])> = outputs.iter().map(|o| (*o, &[2i64, 2][..])).collect();
        crate::onnx::testing::model_proto(nodes, inits, &[("x", &[2, 2])], &outs, opset)
    }

    fn w() -> Tensor {
        Tensor::from_f32(vec![2, 2], vec![1.0, -0.5, 0.1, 2.0])
    }

    /// x -> MatMul(W) -> Add(b) -> Relu -> y
    fn mlp() -> proto::ModelProto {
        model(
            vec![
                node("MatMul", "mm", &["x", "W"], &["h"]),
                node("Add", "add", &["h", "b"], &["a"]),
                node("Relu", "relu", &["a"], &["y"]),
            ],
            vec![("W", w()), ("b", Tensor::from_f32(vec![2], vec![0.1, 0.2]))],
            &["y"],
            17,
        )
    }

    fn plan(ps: &[Precision]) -> PrecisionPlan {
        PrecisionPlan::from_layers(ps.to_vec())
    }

    fn run(
        m: proto::ModelProto,
        ps: &[Precision],
        amax: Option<&BTreeMap<String, f32>>,
        opts: &ExportOptions,
    ) -> Result<Exported> {
        let m = crate::onnx::model_from_proto(m, Path::new("t.onnx"), Path::new("."))?;
        export(&m, &plan(ps), amax, opts)
    }

    fn graph(e: &Exported) -> &proto::GraphProto {
        e.model.graph.as_ref().unwrap()
    }

    fn find<'g>(g: &'g proto::GraphProto, name: &str) -> &'g proto::NodeProto {
        g.node
            .iter()
            .find(|n| n.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    fn init<'g>(g: &'g proto::GraphProto, name: &str) -> &'g proto::TensorProto {
        g.initializer
            .iter()
            .find(|t| t.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no initializer {name}"))
    }

    fn ops(g: &proto::GraphProto) -> Vec<&str> {
        g.node
            .iter()
            .map(|n| n.op_type.as_deref().unwrap())
            .collect()
    }

    use Precision::*;

    #[test]
    fn float16_initializers_beyond_its_range_are_clamped_with_a_note() {
        // BERT's attention-mask constant (float32's lowest), an infinity and an in-range value:
        // the float16 copy holds -65504 for the finite overflow, keeps -inf, and a note names
        // the initializer; a float32 layer keeps it as it is.
        let mask = Tensor::from_f32(vec![2], vec![-3.402_823_5e38, 0.5]);
        let inf = Tensor::from_f32(vec![2], vec![f32::NEG_INFINITY, 70000.0]);
        let m = || {
            model(
                vec![
                    node("Add", "add", &["x", "mask"], &["a"]),
                    node("Add", "add2", &["a", "inf"], &["y"]),
                ],
                vec![("mask", mask.clone()), ("inf", inf.clone())],
                &["y"],
                17,
            )
        };
        let e = run(m(), &[Float16; 2], None, &ExportOptions::default()).unwrap();
        let g = graph(&e);
        let v = |n: &str| {
            tensor_from_proto(init(g, n), None)
                .unwrap()
                .to_f32_vec()
                .unwrap()
        };
        assert_eq!(init(g, "mask").data_type, Some(DType::F16.onnx_code()));
        assert_eq!(v("mask"), [-65504.0, 0.5]);
        assert_eq!(v("inf"), [f32::NEG_INFINITY, 65504.0]);
        let notes: Vec<&String> = e.notes.iter().filter(|n| n.contains("clamped")).collect();
        assert_eq!(notes.len(), 2, "{:?}", e.notes);
        assert!(notes[0].contains("'mask'") && notes[0].contains("'add'"));
        assert!(notes[1].contains("'inf'") && notes[1].contains("1 finite value "));
        // The infinity the float16 copy keeps is said too.
        let inf_notes: Vec<&String> = e.notes.iter().filter(|n| n.contains("infinite")).collect();
        assert_eq!(inf_notes.len(), 1, "{:?}", e.notes);
        assert!(inf_notes[0].contains("'inf'") && inf_notes[0].contains("'add2'"));
        assert!(inf_notes[0].contains("1 infinite value:"), "{inf_notes:?}");
        // bfloat16 converts as a Cast does (float32's lowest rounds to -inf there): said.
        let e = run(m(), &[BFloat16; 2], None, &ExportOptions::default()).unwrap();
        assert_eq!(v_of(&e, "mask"), [f32::NEG_INFINITY, 0.5]);
        let made: Vec<&String> = e
            .notes
            .iter()
            .filter(|n| n.contains("stored as ±inf, as a Cast"))
            .collect();
        assert_eq!(made.len(), 1, "{:?}", e.notes);
        assert!(made[0].contains("'mask'") && made[0].contains("bfloat16 layer 'add'"));
        assert!(e
            .notes
            .iter()
            .any(|n| n.contains("'inf'") && n.contains("holds 1 infinite value")));
        let e = run(m(), &[Float32; 2], None, &ExportOptions::default()).unwrap();
        assert_eq!(
            init(graph(&e), "mask").data_type,
            Some(DType::F32.onnx_code())
        );
        assert!(e.notes.iter().all(|n| !n.contains("clamped")));
    }

    fn v_of(e: &Exported, name: &str) -> Vec<f32> {
        tensor_from_proto(init(graph(e), name), None)
            .unwrap()
            .to_f32_vec()
            .unwrap()
    }

    /// The exported float16 model, run as typed, computes what the emulation of its plan
    /// computes, bit for bit, for weights beyond float16's range: a constant initializer
    /// clamped to -65504 in both (the fully masked row finite), a Constant node's value alike,
    /// an initializer a graph input overrides cast at run time to -inf in both (that row NaN).
    #[test]
    fn float16_exports_compute_the_emulated_weights_beyond_its_range_bit_for_bit() {
        use crate::exec::{Feeds, Interpreter, PlanOptions, PreparedPlan, RunOptions};
        const MIN: f32 = -3.402_823_5e38;
        let mask = || Tensor::from_f32(vec![2, 4], vec![0.0, MIN, 0.0, MIN, MIN, MIN, MIN, MIN]);
        let m = crate::onnx::testing::model_proto(
            vec![
                node("Add", "add", &["x", "mask"], &["s"]),
                node("Softmax", "softmax", &["s"], &["y"]),
                node("Add", "add_over", &["x", "over"], &["t"]),
                node("Softmax", "softmax_over", &["t"], &["z"]),
                schema::constant_node("mask_const".into(), tensor_to_proto("cmask", &mask())),
                node("Add", "add_const", &["x", "cmask"], &["u"]),
                node("Softmax", "softmax_const", &["u"], &["w"]),
            ],
            vec![("mask", mask()), ("over", mask())],
            &[("x", &[2, 4]), ("over", &[2, 4])],
            &[("y", &[2, 4]), ("z", &[2, 4]), ("w", &[2, 4])],
            17,
        );
        let original = crate::onnx::testing::load(m);
        assert!(original.graph.overridable.contains("over"));
        let plan = PrecisionPlan::uniform(&original.graph, Float16);
        let e = export(&original, &plan, None, &ExportOptions::default()).unwrap();
        assert_eq!(v_of(&e, "mask")[1], -65504.0);
        // The Constant node's value (MiniLM's mask) is stored converted the same way; the
        // node, read by nothing any more, goes.
        assert_eq!(v_of(&e, "cmask_fp16")[1], -65504.0);
        assert!(
            !ops(graph(&e)).contains(&"Constant"),
            "{:?}",
            ops(graph(&e))
        );
        assert!(e
            .notes
            .iter()
            .any(|n| n.contains("'cmask'") && n.contains("stored clamped")));
        assert!(
            e.notes
                .iter()
                .any(|n| n.contains("'over'") && n.contains("Cast to float16 makes them ±inf")),
            "{:?}",
            e.notes
        );
        let mut feeds = Feeds::new();
        feeds.insert(
            "x".into(),
            Tensor::from_f32(vec![2, 4], vec![1.0, 2.0, 3.0, 4.0, 0.5, -1.0, 7.0, 2.5]),
        );
        let prepared = PreparedPlan::new(&original.graph, &plan, &PlanOptions::default()).unwrap();
        let emulated = Interpreter::new(&original.graph)
            .unwrap()
            .run_plan(&feeds, &RunOptions::default(), &prepared)
            .unwrap()
            .outputs;
        let exported = crate::onnx::testing::load(e.model);
        let typed = Interpreter::new(&exported.graph)
            .unwrap()
            .run(&feeds)
            .unwrap()
            .outputs;
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_f32_vec()
                .unwrap()
                .iter()
                .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                .collect()
        };
        assert_eq!(typed.len(), 3);
        for ((name, a), (_, b)) in typed.iter().zip(&emulated) {
            assert_eq!(bits(a), bits(b), "{name}: {a:?} vs {b:?}");
        }
        let y = emulated[0].1.to_f32_vec().unwrap();
        let z = emulated[1].1.to_f32_vec().unwrap();
        let w = emulated[2].1.to_f32_vec().unwrap();
        assert!(y[4..].iter().all(|v| v.is_finite()), "{y:?}");
        assert!(z[4..].iter().all(|v| v.is_nan()), "{z:?}");
        assert!(w[4..].iter().all(|v| v.is_finite()), "{w:?}");
    }

    #[test]
    fn all_fp16_converts_weights_in_place_and_casts_at_the_edges() {
        let e = run(mlp(), &[Float16; 3], None, &ExportOptions::default()).unwrap();
        let g = graph(&e);
        assert_eq!(ops(g), ["Cast", "MatMul", "Add", "Relu", "Cast"]);
        // Weights converted in place: same names, float16, rounded.
        let wp = init(g, "W");
        assert_eq!(wp.data_type, Some(DType::F16.onnx_code()));
        let wt = tensor_from_proto(wp, None).unwrap();
        assert_eq!(
            wt.to_f32_vec().unwrap(),
            vec![1.0, -0.5, half::f16::from_f32(0.1).to_f32(), 2.0]
        );
        assert_eq!(init(g, "b").data_type, Some(DType::F16.onnx_code()));
        assert_eq!(g.initializer.len(), 2);
        // The input is cast once, the output cast back under its own name.
        assert_eq!(find(g, "mm").input, ["x_fp16", "W"]);
        let last = g.node.last().unwrap();
        assert_eq!(last.output, ["y"]);
        assert_eq!(last.attribute[0].i, Some(1));
        assert_eq!(find(g, "relu").output, ["y_fp16"]);
        assert_eq!(e.casts, 2);
        assert_eq!(g.output[0].name.as_deref(), Some("y"));
    }

    #[test]
    fn mixed_plan_casts_between_precisions_and_keeps_shared_weights() {
        // MatMul fp16, Add fp32, Relu fp16; b read by the fp32 Add stays fp32.
        let e = run(
            mlp(),
            &[Float16, Float32, Float16],
            None,
            &ExportOptions::default(),
        )
        .unwrap();
        let g = graph(&e);
        assert_eq!(
            ops(g),
            ["Cast", "MatMul", "Cast", "Add", "Cast", "Relu", "Cast"]
        );
        assert_eq!(find(g, "add").input, ["h_fp32", "b"]);
        assert_eq!(init(g, "b").data_type, Some(1));
        assert_eq!(init(g, "W").data_type, Some(10));
        assert_eq!(find(g, "relu").input, ["a_fp16"]);

        // A weight read by an fp16 and an fp32 layer: the original stays, fp16 gets a copy.
        let m = model(
            vec![
                node("MatMul", "mm", &["x", "W"], &["h"]),
                node("MatMul", "mm2", &["h", "W"], &["y"]),
            ],
            vec![("W", w())],
            &["y"],
            17,
        );
        let e = run(m, &[Float16, Float32], None, &ExportOptions::default()).unwrap();
        let g = graph(&e);
        assert_eq!(find(g, "mm").input, ["x_fp16", "W_fp16"]);
        assert_eq!(find(g, "mm2").input, ["h_fp32", "W"]);
        assert_eq!(init(g, "W").data_type, Some(1));
        assert_eq!(init(g, "W_fp16").data_type, Some(10));
    }

    #[test]
    fn keep_io_types_off_moves_the_casts_into_the_interface() {
        let opts = ExportOptions {
            keep_io_types: false,
            ..Default::default()
        };
        let e = run(mlp(), &[Float16; 3], None, &opts).unwrap();
        let g = graph(&e);
        assert_eq!(ops(g), ["MatMul", "Add", "Relu"]);
        let elem = |v: &proto::ValueInfoProto| match v.r#type.as_ref().unwrap().value.as_ref() {
            Some(proto::type_proto::Value::TensorType(t)) => t.elem_type,
            _ => None,
        };
        assert_eq!(elem(&g.input[0]), Some(10));
        assert_eq!(elem(&g.output[0]), Some(10));
        assert_eq!(find(g, "mm").input, ["x", "W"]);
    }

    #[test]
    fn movement_runs_in_its_input_type_and_concat_agrees_on_one() {
        // Transpose after an fp16 MatMul stays fp16; Concat of an fp16 and an fp32 tensor runs
        // in fp32; the Identity of the fp32 branch carries fp32.
        let mut concat = node("Concat", "cat", &["t", "r"], &["y"]);
        concat.attribute.push(schema::int_attr("axis", 0));
        let m = model(
            vec![
                node("MatMul", "mm", &["x", "W"], &["h"]),
                node("Transpose", "tr", &["h"], &["t"]),
                node("Relu", "relu", &["x"], &["r"]),
                concat,
            ],
            vec![("W", w())],
            &["y"],
            17,
        );
        let e = run(
            m,
            &[Float16, Float16, Float32, Float16],
            None,
            &ExportOptions::default(),
        )
        .unwrap();
        let g = graph(&e);
        assert_eq!(find(g, "tr").input, ["h"]);
        assert_eq!(find(g, "cat").input, ["t_fp32", "r"]);
        // Concat's output is fp32 already: no Cast at the graph output.
        assert_eq!(g.node.last().unwrap().name.as_deref(), Some("cat"));
    }

    #[test]
    fn original_casts_keep_their_target_type() {
        // x -> Cast(to float32) -> Relu(fp16) -> y: the Cast still yields float32, the fp16
        // Relu gets its own Cast.
        let mut cast = node("Cast", "c", &["x"], &["xc"]);
        cast.attribute.push(schema::int_attr("to", 1));
        let m = model(
            vec![cast, node("Relu", "relu", &["xc"], &["y"])],
            vec![],
            &["y"],
            17,
        );
        let e = run(m, &[Float32, Float16], None, &ExportOptions::default()).unwrap();
        let g = graph(&e);
        assert_eq!(find(g, "c").attribute[0].i, Some(1));
        assert_eq!(find(g, "relu").input, ["xc_fp16"]);
        assert_eq!(g.node.last().unwrap().output, ["y"]);
    }

    #[test]
    fn int8_layers_get_qdq_with_the_emulation_scales() {
        let mut amax = BTreeMap::new();
        amax.insert("x".to_string(), 2.0f32);
        let e = run(
            mlp(),
            &[Int8, Float32, Float32],
            Some(&amax),
            &ExportOptions::default(),
        )
        .unwrap();
        let g = graph(&e);
        assert_eq!(
            ops(g),
            [
                "QuantizeLinear",
                "DequantizeLinear",
                "DequantizeLinear",
                "MatMul",
                "Add",
                "Relu"
            ]
        );
        assert_eq!(find(g, "mm").input, ["x_dequantized", "W_dequantized"]);
        // Activation: per-tensor scale amax/127, int8 zero point.
        let s = tensor_from_proto(init(g, "x_scale"), None).unwrap();
        assert_eq!(s.to_f32_vec().unwrap(), vec![2.0 / 127.0]);
        assert_eq!(s.shape(), &[] as &[usize]);
        assert_eq!(init(g, "x_zero_point").data_type, Some(3));
        // Weight: MatMul B channels on the last axis, scale max|w[:, c]| / 127.
        let dq = find(g, "W_DequantizeLinear");
        assert_eq!(dq.attribute[0].i, Some(1));
        let ws = tensor_from_proto(init(g, "W_scale"), None).unwrap();
        assert_eq!(ws.to_f32_vec().unwrap(), vec![1.0 / 127.0, 2.0 / 127.0]);
        let wq = tensor_from_proto(init(g, "W_quantized"), None).unwrap();
        assert_eq!(wq.dtype(), DType::I8);
        // 1.0 / (1/127) = 127; -0.5 / (2/127) = -31.75 -> -32; 0.1*127 = 12.7 -> 13; 2 -> 127.
        assert_eq!(wq.to_f32_vec().unwrap(), vec![127.0, -32.0, 13.0, 127.0]);
        // The float weight is gone; the bias stays float32.
        assert!(g.initializer.iter().all(|t| t.name.as_deref() != Some("W")));
        assert_eq!(init(g, "b").data_type, Some(1));
        assert_eq!(e.model.opset_import[0].version, Some(17));
        assert_eq!((e.quantized_activations, e.quantized_weights), (1, 1));
    }

    #[test]
    fn folded_weights_keep_their_nodes_and_get_qdq_or_a_cast() {
        // x -> MatMul(DequantizeLinear(Wq int8, per column)) -> y: a Q/DQ model.
        let mut dq = node("DequantizeLinear", "dq", &["Wq", "Ws", "Wz"], &["W"]);
        dq.attribute.push(schema::int_attr("axis", 1));
        let m = model(
            vec![dq, node("MatMul", "mm", &["x", "W"], &["y"])],
            vec![
                (
                    "Wq",
                    Tensor::from_parts(
                        vec![2, 2],
                        crate::tensor::TensorData::I8(vec![127, -20, 64, 127].into()),
                    ),
                ),
                ("Ws", Tensor::from_f32(vec![2], vec![0.5, 0.25])),
                (
                    "Wz",
                    Tensor::from_parts(vec![2], crate::tensor::TensorData::I8(vec![0, 0].into())),
                ),
            ],
            &["y"],
            13,
        );
        let mut amax = BTreeMap::new();
        amax.insert("x".to_string(), 2.0f32);
        let e = run(
            m.clone(),
            &[Float32, Int8],
            Some(&amax),
            &ExportOptions::default(),
        )
        .unwrap();
        let g = graph(&e);
        assert_eq!(
            ops(g),
            [
                "DequantizeLinear",
                "QuantizeLinear",
                "DequantizeLinear",
                "QuantizeLinear",
                "DequantizeLinear",
                "MatMul"
            ]
        );
        // The stored int8 weight and its DequantizeLinear stay; the folded value W gets a
        // per-channel Q/DQ with the emulation's scales (max |W[:, c]| / 127).
        assert_eq!(find(g, "dq").input, ["Wq", "Ws", "Wz"]);
        assert_eq!(init(g, "Wq").data_type, Some(3));
        let q = find(g, "W_QuantizeLinear");
        assert_eq!(q.input[0], "W");
        assert_eq!(q.attribute[0].i, Some(1));
        let ws = tensor_from_proto(init(g, "W_scale"), None).unwrap();
        assert_eq!(ws.to_f32_vec().unwrap(), vec![0.5, 0.25 * 127.0 / 127.0]);
        assert_eq!(find(g, "mm").input, ["x_dequantized", "W_dequantized"]);
        // No float copy of the weight is stored.
        assert!(g
            .initializer
            .iter()
            .all(|t| t.data_type != Some(1) || t.dims.len() < 2));
        assert_eq!((e.quantized_activations, e.quantized_weights), (1, 1));
        // Float16: a Cast of the folded value; the Q/DQ chain stays.
        let e = run(m, &[Float16, Float16], None, &ExportOptions::default()).unwrap();
        let g = graph(&e);
        assert_eq!(find(g, "dq").input, ["Wq", "Ws", "Wz"]);
        assert_eq!(init(g, "Wq").data_type, Some(3));
        assert_eq!(find(g, "mm").input[1], "W_fp16");
    }

    #[test]
    fn float16_quantize_linear_keeps_x_and_scale_in_one_type() {
        // Opset 19: QuantizeLinear's x and y_scale must share a type. x is rounded to
        // float16 (the emulation rounds it) and quantized in float32 with the float32 scale.
        let m = model(
            vec![
                node("Relu", "relu", &["x"], &["r"]),
                node("QuantizeLinear", "q", &["r", "s", "z"], &["rq"]),
                node("DequantizeLinear", "dq", &["rq", "s", "z"], &["y"]),
            ],
            vec![
                ("s", Tensor::scalar_f32(0.1)),
                (
                    "z",
                    Tensor::from_parts(vec![], crate::tensor::TensorData::I8(vec![0].into())),
                ),
            ],
            &["y"],
            19,
        );
        let e = run(
            m,
            &[Float16, Float16, Float16],
            None,
            &ExportOptions::default(),
        )
        .unwrap();
        let g = graph(&e);
        let q = find(g, "q");
        assert_eq!(q.input[1], "s");
        assert_eq!(init(g, "s").data_type, Some(1));
        let cast = g
            .node
            .iter()
            .find(|n| n.output.first() == Some(&q.input[0]))
            .expect("x of QuantizeLinear comes from a Cast");
        assert_eq!(cast.op_type.as_deref(), Some("Cast"));
        assert_eq!(cast.attribute[0].i, Some(DType::F32.onnx_code() as i64));
        assert_eq!(cast.input[0], "r");
        assert_eq!(find(g, "relu").input[0], "x_fp16");
    }

    #[test]
    fn fp8_raises_the_opset_to_19() {
        let mut amax = BTreeMap::new();
        amax.insert("x".to_string(), 448.0f32);
        let m = mlp();
        let mut m13 = m.clone();
        m13.opset_import[0].version = Some(13);
        let e = run(
            m13,
            &[Fp8E4M3, Float32, Float32],
            Some(&amax),
            &ExportOptions::default(),
        )
        .unwrap();
        assert_eq!(e.model.opset_import[0].version, Some(19));
        assert_eq!(e.model.ir_version, Some(9));
        let g = graph(&e);
        assert_eq!(init(g, "x_zero_point").data_type, Some(17));
        let wq = init(g, "W_quantized");
        assert_eq!(wq.data_type, Some(17));
        // 1.0 / (1/448) = 448 -> 0x7E in e4m3fn.
        assert_eq!(wq.raw_data.as_ref().unwrap()[0], 0x7e);
        assert!(
            e.notes.iter().any(|n| n.contains("from 13 to 19")),
            "{:?}",
            e.notes
        );
        // e5m2 zero points have their own type code.
        let e = run(
            m,
            &[Fp8E5M2, Float32, Float32],
            Some(&amax),
            &ExportOptions::default(),
        )
        .unwrap();
        assert_eq!(init(graph(&e), "x_zero_point").data_type, Some(19));
    }

    #[test]
    fn missing_ranges_and_bad_plans_are_clear_errors() {
        let e = run(
            mlp(),
            &[Int8, Float32, Float32],
            None,
            &ExportOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("'mm'") && e.contains("'x'") && e.contains("amax"),
            "{e}"
        );
        let amax = BTreeMap::from([("other".to_string(), 1.0f32)]);
        let e = run(
            mlp(),
            &[Int8, Float32, Float32],
            Some(&amax),
            &ExportOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("'mm'") && e.contains("tensor 'x'"), "{e}");
        let e = run(mlp(), &[Float16], None, &ExportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 layers") && e.contains("3"), "{e}");
        // int8 below opset 11 (the oldest the upgrade adapts): refused with the way out.
        let mut m = mlp();
        m.opset_import[0].version = Some(10);
        let amax = BTreeMap::from([("x".to_string(), 1.0f32)]);
        let e = run(
            m,
            &[Int8, Float32, Float32],
            Some(&amax),
            &ExportOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("convert_version"), "{e}");
        // From opset 11 it is raised to 13 (schema::upgrade_nodes adapts what changed).
        let mut m = mlp();
        m.opset_import[0].version = Some(11);
        let e = run(
            m,
            &[Int8, Float32, Float32],
            Some(&amax),
            &ExportOptions::default(),
        )
        .unwrap();
        assert_eq!(e.model.opset_import[0].version, Some(13));
        assert!(
            e.notes.iter().any(|n| n.contains("from 11 to 13")),
            "{:?}",
            e.notes
        );
    }

    #[test]
    fn int8_on_an_op_without_integer_kernel_exports_float32() {
        let e = run(
            mlp(),
            &[Float32, Int8, Float32],
            None,
            &ExportOptions::default(),
        )
        .unwrap();
        assert_eq!(ops(graph(&e)), ["MatMul", "Add", "Relu"]);
        assert!(e.notes[0].contains("'add'"), "{:?}", e.notes);
    }

    #[test]
    fn bfloat16_conv_needs_opset_22_or_falls_back() {
        let mut conv = node("Conv", "conv", &["x4", "K"], &["c"]);
        conv.attribute.push(proto::AttributeProto {
            name: Some("kernel_shape".into()),
            r#type: Some(proto::attribute_proto::AttributeType::Ints as i32),
            ints: vec![1, 1],
            ..Default::default()
        });
        let mut m = model(
            vec![conv, node("Relu", "relu", &["c"], &["y"])],
            vec![("K", Tensor::from_f32(vec![1, 1, 1, 1], vec![0.5]))],
            &["y"],
            17,
        );
        let g = m.graph.as_mut().unwrap();
        g.input = vec![vi("x4", DType::F32, &[1, 1, 2, 2])];
        g.output = vec![vi("y", DType::F32, &[1, 1, 2, 2])];
        let e = run(m.clone(), &[BFloat16; 2], None, &ExportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'conv'") && e.contains("opset 17") && e.contains("bfloat16"),
            "{e}"
        );
        let opts = ExportOptions {
            fallback: true,
            ..Default::default()
        };
        let e = run(m, &[BFloat16; 2], None, &opts).unwrap();
        let g = graph(&e);
        assert_eq!(find(g, "conv").input, ["x4", "K"]);
        assert_eq!(find(g, "relu").input, ["c_bf16"]);
        assert!(e.notes[0].contains("stays float32"), "{:?}", e.notes);
    }

    #[test]
    fn if_outputs_without_declared_types_are_typed_by_inference() {
        // Exporters (silero-vad's) leave an If's branch outputs untyped; the export must still
        // know the If's output is float32 and convert it for a float16 reader.
        let untyped = |name: &str| proto::ValueInfoProto {
            name: Some(name.into()),
            ..Default::default()
        };
        let branch = |name: &str, op: &str| proto::GraphProto {
            name: Some(name.into()),
            node: vec![node(
                op,
                &format!("{name}_n"),
                &["x"],
                &[&format!("{name}_out")],
            )],
            output: vec![untyped(&format!("{name}_out"))],
            ..Default::default()
        };
        let mut cond_if = node("If", "if", &["c"], &["i"]);
        for (attr, g) in [
            ("then_branch", branch("then", "Neg")),
            ("else_branch", branch("else", "Abs")),
        ] {
            cond_if.attribute.push(proto::AttributeProto {
                name: Some(attr.into()),
                r#type: Some(proto::attribute_proto::AttributeType::Graph as i32),
                g: Some(g),
                ..Default::default()
            });
        }
        let mut m = model(
            vec![cond_if, node("Add", "add", &["i", "x"], &["y"])],
            vec![],
            &["y"],
            17,
        );
        m.graph
            .as_mut()
            .unwrap()
            .input
            .push(vi("c", DType::Bool, &[1]));
        let e = run(m, &[Float32, Float16], None, &ExportOptions::default()).unwrap();
        let g = graph(&e);
        let add = find(g, "add");
        let producer = |t: &str| g.node.iter().find(|n| n.output.iter().any(|o| o == t));
        for input in &add.input {
            let cast = producer(input).expect("a Cast feeds the float16 Add");
            assert_eq!(cast.op_type.as_deref(), Some("Cast"), "input {input}");
        }
    }

    #[test]
    fn value_info_follows_the_new_types() {
        let mut m = mlp();
        m.graph.as_mut().unwrap().value_info =
            vec![vi("h", DType::F32, &[2, 2]), vi("a", DType::F32, &[2, 2])];
        let e = run(
            m,
            &[Float16, Float32, Float32],
            None,
            &ExportOptions::default(),
        )
        .unwrap();
        let g = graph(&e);
        let elem = |name: &str| {
            g.value_info
                .iter()
                .find(|v| v.name.as_deref() == Some(name))
                .and_then(|v| match v.r#type.as_ref()?.value.as_ref()? {
                    proto::type_proto::Value::TensorType(t) => t.elem_type,
                    _ => None,
                })
        };
        assert_eq!(elem("h"), Some(10));
        assert_eq!(elem("a"), Some(1));
    }

    #[test]
    fn an_output_read_inside_the_graph_reuses_the_cast_back() {
        // r is a graph output and read by an fp32 Add: the Cast back produces r itself.
        let m = model(
            vec![
                node("Relu", "relu", &["x"], &["r"]),
                node("Add", "add", &["r", "b"], &["y"]),
            ],
            vec![("b", Tensor::from_f32(vec![2], vec![0.5, 0.25]))],
            &["r", "y"],
            17,
        );
        let e = run(m, &[Float16, Float32], None, &ExportOptions::default()).unwrap();
        let g = graph(&e);
        assert_eq!(ops(g), ["Cast", "Relu", "Cast", "Add"]);
        assert_eq!(find(g, "relu").output, ["r_fp16"]);
        assert_eq!(g.node[2].input, ["r_fp16"]);
        assert_eq!(g.node[2].output, ["r"]);
        assert_eq!(find(g, "add").input, ["r", "b"]);
        assert_eq!(e.casts, 2);
    }

    #[test]
    fn constant_data_inputs_of_movement_convert_only_when_exact() {
        // Pad(fp16 data, pads, constant 0.0): the constant converts exactly, Pad stays fp16.
        // With a constant of 0.1 (not exact in fp16) Pad runs in fp32.
        for (value, pad_in) in [(0.0f32, "c_fp16"), (0.1, "h_fp32")] {
            let m = model(
                vec![
                    node("Relu", "relu", &["x"], &["h"]),
                    node("Pad", "pad", &["h", "pads", "c"], &["p"]),
                    node("Relu", "relu2", &["p"], &["y"]),
                ],
                vec![
                    ("pads", Tensor::from_i64(vec![4], vec![0, 0, 0, 0])),
                    ("c", Tensor::scalar_f32(value)),
                ],
                &["y"],
                17,
            );
            let e = run(
                m,
                &[Float16, Float32, Float16],
                None,
                &ExportOptions::default(),
            )
            .unwrap();
            let g = graph(&e);
            let pad = find(g, "pad");
            if value == 0.0 {
                assert_eq!(pad.input, ["h", "pads", "c"]);
                assert_eq!(init(g, "c").data_type, Some(10));
            } else {
                assert_eq!(pad.input[0], pad_in);
                assert_eq!(pad.input[2], "c");
            }
        }
    }

    #[test]
    fn written_models_load_back() {
        let e = run(mlp(), &[Float16; 3], None, &ExportOptions::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.onnx");
        write_model(&p, &e.model).unwrap();
        let back = crate::onnx::load_model(&p).unwrap();
        assert_eq!(back.graph.nodes.len(), 5);
        assert_eq!(back.graph.initializers["W"].dtype(), DType::F16);
    }
}
