//! Q/DQ models: their quantized layers, and the rewrite that takes a layer's quantization away
//! (docs/search.md, "Searching a Q/DQ model").
//!
//! A *quantized layer* is a node (Conv, MatMul, Gemm, Add, MaxPool, ... and data movement
//! too: anything but QuantizeLinear, DequantizeLinear and folded weight nodes) with at least
//! one input produced by a `DequantizeLinear` that reads either
//! - a `QuantizeLinear` output (an activation: `x → Q → DQ → layer`), or
//! - a weight (an initializer or a folded constant: `w_int8 → DQ → layer`).
//!
//! Per-tensor, per-axis and blocked scales and every quantized element type the kernels know
//! (int8/uint8/int16/uint16/int4/uint4, the float8 types, float4e2m1) are covered: the rewrite
//! never interprets the quantization itself, it rewires the layer and dequantizes weights
//! with the model's own `DequantizeLinear` kernel.
//!
//! [`strip`] removes the *input* Q/DQ pairs of the marked layers: each reads the float tensor
//! that went into its `QuantizeLinear` (only that consumer is rewired when the pair is shared),
//! a quantized weight becomes a float initializer holding its dequantized value, and Q, DQ and
//! Constant nodes nobody reads any more are dropped with the initializers only they read. With
//! [`Precision::Float16`] the marked layers then compute in float16: the float32 result is
//! exported through [`crate::export::export`] with those layers in float16 (Casts at their
//! boundaries, weights stored in float16), exactly as `mixprec convert` writes float16 layers.
//! The same function builds the model the search evaluates and the model `-o` writes.
//!
//! A pair whose range starts at exactly 0 (uint8 with zero point 0, int8 with -128) clamps
//! negative values as a Relu does, and quantizers use that: ONNX Runtime's QDQ quantizer drops
//! a Relu whose output such a pair quantizes. Where such a pair is removed a `Relu` takes its
//! place (one per float tensor), so the float model's activation is back; a Relu that was not
//! dropped makes it a no-op (its input is then never negative). A dropped Clip (Relu6) is not
//! restored.
//!
//! [`strip_all`] removes every Q/DQ pair (every consumer of a dequantized value reads the
//! float tensor), float32: the reference of a Q/DQ search.

use super::{export, ExportOptions};
use crate::error::{Error, Result};
use crate::graph::{Graph, ValueIndex};
use crate::onnx::{model_from_proto, proto, tensor_to_proto, Model};
use crate::ops::{OpCtx, Qdq, Registry};
use crate::precision::plan::PrecisionPlan;
use crate::precision::Precision;
use crate::tensor::{DType, Tensor};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// How one input of a quantized layer is quantized.
#[derive(Clone, Debug, PartialEq)]
pub enum QdqKind {
    /// `source → QuantizeLinear (node q) → DequantizeLinear → layer`.
    Activation { q: usize, source: String },
    /// `weight → DequantizeLinear → layer` (the weight an initializer or a folded constant).
    Weight,
}

/// One dequantized input of a quantized layer.
#[derive(Clone, Debug, PartialEq)]
pub struct QdqInput {
    /// The input's position in the layer's input list.
    pub slot: usize,
    /// The DequantizeLinear node (index in `graph.nodes`).
    pub dq: usize,
    pub kind: QdqKind,
}

/// A layer whose inputs arrive through DequantizeLinear.
#[derive(Clone, Debug, PartialEq)]
pub struct QdqLayer {
    /// Index in `graph.nodes`.
    pub node: usize,
    pub inputs: Vec<QdqInput>,
}

/// Whether a node computes on quantized codes itself, without Q/DQ pairs to remove
/// ("operator-oriented" quantization: QLinearConv/QLinearMatMul and com.microsoft's QLinear*
/// and QGemm, dynamic quantization's DynamicQuantizeLinear, MatMulInteger, ConvInteger,
/// MatMulIntegerToFloat, DynamicQuantizeMatMul, DynamicQuantizeLSTM, weight-only MatMulNBits).
pub fn is_operator_quantized(n: &crate::graph::Node) -> bool {
    crate::ops::computes_in_integers(n) || n.op_type == "MatMulNBits"
}

/// THE rule for "is this model Q/DQ-quantized?" (issues 42, 43): some `DequantizeLinear`, in
/// the main graph or a subgraph, reads a `QuantizeLinear` output: an activation Q/DQ pair
/// (`x → Q → DQ → layer`), what ONNX Runtime's QDQ format, ModelOpt and `mixprec quantize
/// --int8/--fp8` write. Such a model is already quantized: the precision flags do not apply to
/// it and `debug precision` runs the Q/DQ search. Nothing else makes a model Q/DQ-quantized:
/// operator-style integer ops ([`is_operator_quantized`]: dynamic quantization's
/// DynamicQuantizeLinear → MatMulInteger) and weight-only `DequantizeLinear` (an int8
/// embedding table or int4 weights dequantized from an initializer) leave a float model whose
/// float layers `--fp16`/`--bf16` run in low precision (a "hybrid", docs/numerics.md).
pub fn is_qdq_quantized(graph: &Graph) -> bool {
    let values = graph.values();
    graph.nodes.iter().enumerate().any(|(j, n)| {
        (is_dq(n)
            && values
                .input_producers(j)
                .next()
                .flatten()
                .is_some_and(|p| is_q(&graph.nodes[p])))
            || n.subgraphs().any(|(_, g)| is_qdq_quantized(g))
    })
}

/// Whether the main graph holds QuantizeLinear or DequantizeLinear nodes.
pub fn has_qdq(graph: &Graph) -> bool {
    graph.nodes.iter().any(|n| is_q(n) || is_dq(n))
}

fn is_q(n: &crate::graph::Node) -> bool {
    crate::ops::qdq(n) == Some(Qdq::Quantize)
}

fn is_dq(n: &crate::graph::Node) -> bool {
    crate::ops::qdq(n) == Some(Qdq::Dequantize)
}

/// The dequantized input of `node`'s slot, if it is one.
fn dequantized_input(
    graph: &Graph,
    values: &ValueIndex,
    name: &str,
    slot: usize,
) -> Option<QdqInput> {
    let dq = values.producer_node(name)?;
    let d = &graph.nodes[dq];
    if !is_dq(d) {
        return None;
    }
    let x = d.inputs.first()?;
    if graph.weight(x).is_some() || graph.initializers.contains_key(x) {
        return Some(QdqInput {
            slot,
            dq,
            kind: QdqKind::Weight,
        });
    }
    // A weight DequantizeLinear whose kernel rejected its constant inputs is not folded: it
    // still reads only constants.
    if d.inputs
        .iter()
        .all(|n| n.is_empty() || graph.initializers.contains_key(n) || graph.folded.contains_key(n))
    {
        return Some(QdqInput {
            slot,
            dq,
            kind: QdqKind::Weight,
        });
    }
    let q = values.producer_node(x)?;
    let qn = &graph.nodes[q];
    if !is_q(qn) {
        return None;
    }
    let source = qn.inputs.first()?.clone();
    Some(QdqInput {
        slot,
        dq,
        kind: QdqKind::Activation { q, source },
    })
}

/// The quantized layers of the main graph, in topological order, after checking every
/// QuantizeLinear/DequantizeLinear node ([`check_qdq`]).
pub fn quantized_layers(graph: &Graph) -> Result<Vec<QdqLayer>> {
    check_qdq(graph)?;
    let values = graph.values();
    let mut out = Vec::new();
    for (i, n) in graph.nodes.iter().enumerate() {
        if is_q(n) || is_dq(n) || graph.is_folded(n) {
            continue;
        }
        let inputs: Vec<QdqInput> = n
            .inputs
            .iter()
            .enumerate()
            .filter(|(_, name)| !name.is_empty())
            .filter_map(|(slot, name)| dequantized_input(graph, &values, name, slot))
            .collect();
        if !inputs.is_empty() {
            out.push(QdqLayer { node: i, inputs });
        }
    }
    Ok(out)
}

/// The format a quantized layer computes in, by the element type of its dequantized inputs
/// (the first one whose type is known): `int8` (int8/uint8), `int4` (int4/uint4), `fp8e4m3`,
/// `fp8e5m2` or `fp4e2m1`; `quantized` when no input's type is known.
pub fn layer_format(graph: &Graph, layer: &QdqLayer) -> &'static str {
    let typed = layer.inputs.iter().find_map(|i| {
        let dq = &graph.nodes[i.dq];
        match &i.kind {
            QdqKind::Activation { q, .. } => q_output_type(graph, &graph.nodes[*q]),
            QdqKind::Weight => {
                let x = dq.inputs.first()?;
                graph
                    .weight(x)
                    .map(Tensor::dtype)
                    .or_else(|| graph.value_info.get(x).and_then(|v| v.dtype))
            }
        }
    });
    match typed {
        Some(DType::I8 | DType::U8) => "int8",
        Some(DType::I4 | DType::U4) => "int4",
        Some(DType::F8E4M3FN | DType::F8E4M3FNUZ) => Precision::Fp8E4M3.name(),
        Some(DType::F8E5M2 | DType::F8E5M2FNUZ) => Precision::Fp8E5M2.name(),
        Some(DType::F4E2M1) => "fp4e2m1",
        _ => "quantized",
    }
}

/// The element type a QuantizeLinear produces: its zero point's type, else its `output_dtype`,
/// else uint8.
fn q_output_type(graph: &Graph, q: &crate::graph::Node) -> Option<DType> {
    if let Some(zp) = q.inputs.get(2).filter(|n| !n.is_empty()) {
        return graph.weight(zp).map(Tensor::dtype);
    }
    match q.attr_int("output_dtype") {
        Some(c) if c != 0 => DType::from_onnx(c as i32),
        _ => Some(DType::U8),
    }
}

/// Whether a QuantizeLinear's range starts at exactly 0 (its zero point is its integer type's
/// minimum: uint8 with zero point 0, the default): it clamps negative values to 0, as a Relu
/// does. Quantizers use this to drop the Relu in front of it (ONNX Runtime's QDQ quantizer
/// removes a Relu whose output it quantizes so), so taking such a pair away needs a Relu
/// in its place.
fn clamps_at_zero(graph: &Graph, q: &crate::graph::Node) -> bool {
    let Some(t) = q_output_type(graph, q) else {
        return false;
    };
    let qmin = match t {
        DType::U8 | DType::U16 | DType::U4 => 0.0,
        DType::I8 => -128.0,
        DType::I16 => -32768.0,
        DType::I4 => -8.0,
        _ => return false,
    };
    match q.inputs.get(2).filter(|n| !n.is_empty()) {
        Some(zp) => graph
            .weight(zp)
            .and_then(Tensor::to_f64_vec)
            .is_some_and(|v| !v.is_empty() && v.iter().all(|&z| z == qmin)),
        None => qmin == 0.0,
    }
}

fn op_error(n: &crate::graph::Node, msg: String) -> Error {
    Error::Op {
        node: n.name.clone(),
        op: n.op_type.clone(),
        msg,
    }
}

/// Checks what a Q/DQ search relies on, for every QuantizeLinear and DequantizeLinear of the
/// main graph, with an error naming the node:
/// - constant scales hold only positive, finite values;
/// - a DequantizeLinear's zero point has the type of the value it dequantizes (a
///   QuantizeLinear's output type, or the stored weight's type);
/// - the scale fits the tensor: per tensor, one value per index of `axis`, or blocks of
///   `block_size` along it (weights: the model's own kernel decides; activations: when
///   shape inference knows the shape).
pub fn check_qdq(graph: &Graph) -> Result<()> {
    let values = graph.values();
    let facts = crate::infer::infer_graph(
        graph,
        &crate::infer::declared_input_facts(graph, &BTreeMap::new()),
    )
    .ok();
    for n in graph.nodes.iter().filter(|n| is_q(n) || is_dq(n)) {
        let (Some(x), Some(scale)) = (n.inputs.first(), n.inputs.get(1)) else {
            return Err(op_error(n, "needs inputs x and scale".into()));
        };
        if let Some(s) = graph.weight(scale) {
            if !s.dtype().is_float() {
                return Err(op_error(
                    n,
                    format!(
                        "scale '{scale}' has type {}, expected a float type",
                        s.dtype()
                    ),
                ));
            }
            let v = s.to_f64_vec().unwrap_or_default();
            if let Some((k, bad)) = v
                .iter()
                .enumerate()
                .find(|(_, v)| !(v.is_finite() && **v > 0.0))
            {
                return Err(op_error(
                    n,
                    format!(
                        "scale '{scale}' holds {bad} (element {k} of {}): scales must be positive and finite",
                        v.len()
                    ),
                ));
            }
        }
        if is_dq(n) {
            let x_type = match values.producer_node(x).map(|p| &graph.nodes[p]) {
                Some(q) if is_q(q) => q_output_type(graph, q).map(|t| (t, Some(q))),
                _ => graph
                    .weight(x)
                    .or_else(|| graph.initializers.get(x))
                    .map(|t| (t.dtype(), None)),
            };
            let zp = n
                .inputs
                .get(2)
                .filter(|z| !z.is_empty())
                .and_then(|z| graph.weight(z).map(|t| (z, t.dtype())));
            if let (Some((xt, q)), Some((z, zt))) = (x_type, zp) {
                if xt != zt {
                    return Err(op_error(
                        n,
                        format!(
                            "zero point '{z}' is {zt} but the value it dequantizes, '{x}', is {xt}{}: a DequantizeLinear's zero point has the quantized type",
                            q.map_or(String::new(), |q| format!(
                                " (the output of QuantizeLinear '{}')",
                                q.name
                            ))
                        ),
                    ));
                }
            }
        }
        // The scale's shape against the tensor's: the kernel decides for weights (run once),
        // the shape facts for activations.
        let constant_inputs: Option<Vec<Option<&Tensor>>> = n
            .inputs
            .iter()
            .map(|i| {
                if i.is_empty() {
                    Some(None)
                } else {
                    graph.weight(i).map(Some)
                }
            })
            .collect();
        match constant_inputs {
            Some(args) if is_dq(n) && !graph.folded.contains_key(&n.outputs[0]) => {
                run_kernel(graph, n, &args)?;
            }
            Some(_) => {}
            None => {
                let x_shape = facts.as_ref().and_then(|f| f.known_shape(x));
                let scale_shape = graph.weight(scale).map(|t| t.shape().to_vec());
                if let (Some(xs), Some(ss)) = (x_shape, scale_shape) {
                    check_layout(graph, n, &xs, &ss)?;
                }
            }
        }
    }
    Ok(())
}

/// The scale's shape against the input's (what the Q/DQ kernels check when they run).
fn check_layout(graph: &Graph, n: &crate::graph::Node, x: &[usize], scale: &[usize]) -> Result<()> {
    let len: usize = scale.iter().product();
    if len == 1 && scale.len() <= 1 {
        return Ok(());
    }
    let axis = n.attr_int_or("axis", 1);
    let r = x.len() as i64;
    if axis < -r || axis >= r {
        return Err(op_error(
            n,
            format!("axis {axis} is out of range for its input of shape {x:?}"),
        ));
    }
    let axis = if axis < 0 { axis + r } else { axis } as usize;
    let block = if graph.opset_of(&n.domain) >= 21 {
        n.attr_int_or("block_size", 0)
    } else {
        0
    };
    if block <= 0 {
        if scale.len() != 1 || scale[0] != x[axis] {
            return Err(op_error(
                n,
                format!(
                    "scale has shape {scale:?}: per-axis quantization along axis {axis} of input {x:?} needs a 1-D scale of {} values",
                    x[axis]
                ),
            ));
        }
        return Ok(());
    }
    let mut want = x.to_vec();
    want[axis] = x[axis].div_ceil(block as usize);
    if scale != want.as_slice() {
        return Err(op_error(
            n,
            format!(
                "scale has shape {scale:?}: blocked quantization of input {x:?} with block_size {block} along axis {axis} needs shape {want:?}"
            ),
        ));
    }
    Ok(())
}

/// Runs a node's kernel on constant inputs; an error names the node.
fn run_kernel(graph: &Graph, n: &crate::graph::Node, args: &[Option<&Tensor>]) -> Result<Tensor> {
    let def = Registry::global()
        .def(&n.domain, &n.op_type)
        .ok_or_else(|| op_error(n, "no kernel".into()))?;
    let ctx = OpCtx::new(n, graph.opset_of(&n.domain));
    let mut outs = (def.kernel)(&ctx, args).map_err(|e| op_error(n, e.0))?;
    if outs.is_empty() {
        return Err(op_error(n, "produced no output".into()));
    }
    Ok(outs.swap_remove(0))
}

/// The float value of a dequantized weight (the DequantizeLinear `dq`'s output).
fn dequantized_weight(graph: &Graph, dq: usize) -> Result<Tensor> {
    let n = &graph.nodes[dq];
    if let Some(t) = graph.folded.get(&n.outputs[0]) {
        return Ok(t.clone());
    }
    let args: Vec<Option<&Tensor>> = n
        .inputs
        .iter()
        .map(|i| {
            if i.is_empty() {
                Ok(None)
            } else {
                graph
                    .weight(i)
                    .map(Some)
                    .ok_or_else(|| op_error(n, format!("weight input '{i}' is not a constant")))
            }
        })
        .collect::<Result<_>>()?;
    run_kernel(graph, n, &args)
}

/// A model with Q/DQ pairs removed, and what was done.
#[derive(Clone, Debug)]
pub struct Stripped {
    pub model: Model,
    /// Notes of the float16 export (fallbacks), one line each.
    pub notes: Vec<String>,
    /// Layer inputs rewired to the float tensor in front of their QuantizeLinear.
    pub activations: usize,
    /// Relu nodes added where a removed pair clamped at 0 (see the module docs).
    pub relus: usize,
    /// Quantized weights replaced by float initializers.
    pub weights: usize,
    /// QuantizeLinear/DequantizeLinear/Constant nodes dropped because nobody reads them.
    pub removed_nodes: usize,
}

/// The model with the input Q/DQ pairs of `marked` (quantized layers: indices in
/// `model.graph.nodes`) removed, those layers running in `precision` (float32 or float16);
/// every other node as it was. See the module docs.
pub fn strip(model: &Model, marked: &[usize], precision: Precision) -> Result<Stripped> {
    if !matches!(precision, Precision::Float32 | Precision::Float16) {
        return Err(Error::Invalid(format!(
            "layers taken out of quantization run in float32 or float16, not {}",
            precision.name()
        )));
    }
    let graph = &model.graph;
    let values = graph.values();
    let mut edges = Vec::new();
    for &i in marked {
        let node = graph.nodes.get(i).ok_or_else(|| {
            Error::Invalid(format!(
                "layer {i} does not exist (the model has {} nodes)",
                graph.nodes.len()
            ))
        })?;
        let inputs: Vec<QdqInput> = node
            .inputs
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.is_empty())
            .filter_map(|(slot, n)| dequantized_input(graph, &values, n, slot))
            .collect();
        if inputs.is_empty() {
            return Err(op_error(
                node,
                "is not a quantized layer (no input arrives through DequantizeLinear)".into(),
            ));
        }
        edges.extend(inputs.into_iter().map(|q| (i, q)));
    }
    let mut stripped = rewrite(model, &edges, false)?;
    if precision == Precision::Float16 && !marked.is_empty() {
        let m32 = &stripped.model;
        // The marked layers in the rewritten graph, found by their first output.
        let values = m32.graph.values();
        let mut plan = PrecisionPlan::uniform(&m32.graph, Precision::Float32);
        for &i in marked {
            let o = graph.nodes[i]
                .outputs
                .first()
                .map(String::as_str)
                .unwrap_or("");
            let writer = values.id(o).and_then(|id| values.producer(id));
            let k = writer
                .filter(|p| p.output == 0)
                .map(|p| p.node)
                .ok_or_else(|| {
                    Error::Invalid(format!(
                        "layer '{}' is missing from the rewritten model",
                        graph.nodes[i].name
                    ))
                })?;
            plan.layers[k] = Precision::Float16;
        }
        let exported = export(
            m32,
            &plan,
            None,
            &ExportOptions {
                fallback: true,
                ..Default::default()
            },
        )?;
        stripped.notes = exported.notes;
        stripped.model = reload(model, exported.model)?;
    }
    Ok(stripped)
}

/// The model with every Q/DQ pair removed, float32: every reader of a dequantized activation
/// reads the float tensor in front of its QuantizeLinear, every quantized weight is a float
/// initializer. A dequantized value that is a graph output stays as it is.
pub fn strip_all(model: &Model) -> Result<Stripped> {
    check_qdq(&model.graph)?;
    let graph = &model.graph;
    let values = graph.values();
    let mut edges = Vec::new();
    // Every reader, folded weight nodes too (a DequantizeLinear feeding a Transpose of the
    // weight: the Transpose then reads the float weight).
    for (i, n) in graph.nodes.iter().enumerate() {
        for (slot, name) in n.inputs.iter().enumerate().filter(|(_, n)| !n.is_empty()) {
            if let Some(q) = dequantized_input(graph, &values, name, slot) {
                edges.push((i, q));
            }
        }
    }
    rewrite(model, &edges, true)
}

fn reload(original: &Model, p: proto::ModelProto) -> Result<Model> {
    let base = original
        .path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    model_from_proto(p, &original.path, &base)
}

/// Rewires the layer inputs `edges` (node index, its dequantized input) on the protobuf,
/// drops what nobody reads any more and loads the result. With `through`, an activation's
/// float source that is itself a dequantized value is followed back to the float tensor in
/// front of that pair too (for [`strip_all`]).
fn rewrite(model: &Model, edges: &[(usize, QdqInput)], through: bool) -> Result<Stripped> {
    let graph = &model.graph;
    let mut p = (*model.proto).clone();
    let g = p
        .graph
        .as_mut()
        .ok_or_else(|| Error::Invalid("the model has no graph".into()))?;
    let values = graph.values();
    // Every name in use, for the names of new initializers.
    let mut used: HashSet<String> = HashSet::new();
    for n in &graph.nodes {
        used.extend(n.inputs.iter().cloned());
        used.extend(n.outputs.iter().cloned());
    }
    used.extend(graph.initializers.keys().cloned());
    used.extend(graph.inputs.iter().map(|v| v.name.clone()));
    used.extend(g.initializer.iter().filter_map(|t| t.name.clone()));
    let mut new_weights: HashMap<usize, String> = HashMap::new();
    // Float tensor → the Relu output standing in for the pairs that clamped it at 0.
    let mut relus: BTreeMap<String, String> = BTreeMap::new();
    let mut added: Vec<proto::TensorProto> = Vec::new();
    let (mut activations, mut weights) = (0usize, 0usize);
    for (i, q) in edges {
        let node = &graph.nodes[*i];
        let pos = node
            .pos
            .ok_or_else(|| op_error(node, "was not loaded from the model file".into()))?;
        let name = match &q.kind {
            QdqKind::Activation { source, q: qn } => {
                activations += 1;
                let mut s = source.clone();
                let mut relu = clamps_at_zero(graph, &graph.nodes[*qn]);
                // x → Q → DQ → Q' → DQ' → layer: the float tensor in front of the first pair.
                let mut guard = 0;
                while through && guard < graph.nodes.len() {
                    guard += 1;
                    match dequantized_input(graph, &values, &s, 0) {
                        Some(QdqInput {
                            kind: QdqKind::Activation { source, q },
                            ..
                        }) => {
                            relu |= clamps_at_zero(graph, &graph.nodes[q]);
                            s = source
                        }
                        _ => break,
                    }
                }
                if relu {
                    // One Relu per float tensor, for every reader that loses such a pair.
                    match relus.get(&s) {
                        Some(r) => r.clone(),
                        None => {
                            let r = unique(&mut used, &format!("{s}_relu"));
                            relus.insert(s.clone(), r.clone());
                            r
                        }
                    }
                } else {
                    s
                }
            }
            QdqKind::Weight => {
                weights += 1;
                match new_weights.get(&q.dq) {
                    Some(n) => n.clone(),
                    None => {
                        let value = dequantized_weight(graph, q.dq)?;
                        let n = unique(
                            &mut used,
                            &format!("{}_dequantized", graph.nodes[q.dq].outputs[0]),
                        );
                        added.push(tensor_to_proto(&n, &value));
                        new_weights.insert(q.dq, n.clone());
                        n
                    }
                }
            }
        };
        let pn = g
            .node
            .get_mut(pos)
            .ok_or_else(|| op_error(node, format!("protobuf node {pos} does not exist")))?;
        match pn.input.get_mut(q.slot) {
            Some(slot) => *slot = name,
            None => return Err(op_error(node, format!("has no input {}", q.slot))),
        }
    }
    // The Relus, each right after the node that produces its input (or first).
    for (src, out) in &relus {
        let at = g
            .node
            .iter()
            .position(|n| n.output.iter().any(|o| o == src))
            .map_or(0, |k| k + 1);
        let name = unique(&mut used, &format!("{src}_relu_node"));
        g.node.insert(
            at,
            proto::NodeProto {
                name: Some(name),
                op_type: Some("Relu".into()),
                input: vec![src.clone()],
                output: vec![out.clone()],
                ..Default::default()
            },
        );
    }
    let read_before = names_read(g);
    g.initializer.extend(added);
    let removed_nodes = drop_dead(g);
    // Initializers only the dropped nodes read.
    let read = names_read(g);
    let outputs: HashSet<String> = g.output.iter().filter_map(|o| o.name.clone()).collect();
    g.initializer.retain(|t| {
        let n = t.name.clone().unwrap_or_default();
        read.contains(&n) || outputs.contains(&n) || !read_before.contains(&n)
    });
    let defined: HashSet<String> = g
        .node
        .iter()
        .flat_map(|n| n.output.iter().cloned())
        .chain(g.input.iter().filter_map(|v| v.name.clone()))
        .chain(g.initializer.iter().filter_map(|t| t.name.clone()))
        .collect();
    g.value_info
        .retain(|v| v.name.as_ref().is_some_and(|n| defined.contains(n)));
    let m = reload(model, p)?;
    Ok(Stripped {
        model: m,
        notes: Vec::new(),
        activations,
        relus: relus.len(),
        weights,
        removed_nodes,
    })
}

/// `base`, or `base_1`, `base_2`... : the first not in `used` (then added to it).
fn unique(used: &mut HashSet<String>, base: &str) -> String {
    let mut n = base.to_string();
    let mut k = 0;
    while used.contains(&n) {
        k += 1;
        n = format!("{base}_{k}");
    }
    used.insert(n.clone());
    n
}

/// Every name a node of `g` reads, subgraphs included (outer references).
fn names_read(g: &proto::GraphProto) -> HashSet<String> {
    let mut s = HashSet::new();
    fn walk(g: &proto::GraphProto, s: &mut HashSet<String>) {
        for n in &g.node {
            s.extend(n.input.iter().filter(|i| !i.is_empty()).cloned());
            for a in &n.attribute {
                if let Some(sub) = &a.g {
                    walk(sub, s);
                    s.extend(sub.output.iter().filter_map(|o| o.name.clone()));
                }
                for sub in &a.graphs {
                    walk(sub, s);
                    s.extend(sub.output.iter().filter_map(|o| o.name.clone()));
                }
            }
        }
    }
    walk(g, &mut s);
    s
}

/// Drops QuantizeLinear, DequantizeLinear and Constant nodes none of whose outputs is read
/// (by a node, a subgraph or as a graph output), until none is left; returns how many.
fn drop_dead(g: &mut proto::GraphProto) -> usize {
    let outputs: HashSet<String> = g.output.iter().filter_map(|o| o.name.clone()).collect();
    let mut removed = 0;
    loop {
        let read = names_read(g);
        let before = g.node.len();
        g.node.retain(|n| {
            let op = n.op_type.as_deref().unwrap_or("");
            let domain = n.domain.as_deref().unwrap_or("");
            let droppable = (domain.is_empty() || domain == "ai.onnx")
                && matches!(op, "QuantizeLinear" | "DequantizeLinear" | "Constant");
            !droppable
                || n.output
                    .iter()
                    .any(|o| !o.is_empty() && (read.contains(o) || outputs.contains(o)))
        });
        let gone = before - g.node.len();
        if gone == 0 {
            return removed;
        }
        removed += gone;
    }
}

#[cfg(test)]
pub(crate) mod tests;
