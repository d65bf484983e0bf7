//! TensorRT-style fusion rules (`--fusion tensorrt`; docs/numerics.md, "Fusion rules").
//!
//! [`FusionAnalysis::new`] reads a graph once: what kind of kernel each node is, whether the
//! rules can apply to it (float types, shapes of known rank without unknown dimensions),
//! which reductions belong to a normalization or softmax, and who reads what.
//! [`FusionAnalysis::regions`] then groups the nodes of one plan into regions, greedily in
//! graph order, so that every plan (every candidate of a search) gets its own regions:
//!
//! - **epilogue**: a Conv/ConvTranspose/Gemm/MatMul and the pointwise chain after it (bias
//!   Add, BatchNormalization, activation, residual Add), each link read by its next node
//!   only;
//! - **pointwise**: a connected group of elementwise and activation nodes (decomposed GELU,
//!   SiLU, Mish included) with the data-only views (Reshape, Squeeze, ...) between them;
//! - **normalization / softmax**: a reduction whose result is combined again with the values
//!   it reduced (ReduceMean → Sub, ReduceSum → Div, ...), with the pointwise nodes around
//!   it: decomposed LayerNorm/RMSNorm/GroupNorm/InstanceNorm and Softmax, their statistics
//!   in f32;
//! - **attention**: MatMul → pointwise (scale, mask) → Softmax → MatMul as one region.
//!
//! Nodes in different precisions never share a region, only float16/bfloat16 nodes are fused
//! (a float32 region changes nothing; int8/fp8 layers of a plan are not grouped), a
//! region stays convex, and nodes inside subgraphs are not fused. A node the model declares in
//! float16/bfloat16 computes in that type whatever the plan says; in a 16-bit region a
//! per-tensor QuantizeLinear reading the kernel's value and the DequantizeLinears feeding it
//! join it as its int8 output and input stages (docs/numerics.md, rule 7 of "Q/DQ under
//! TensorRT").

use crate::graph::fact::Fact;
use crate::graph::{Graph, Producer, ValueId};
use crate::infer::{declared_input_facts, infer_graph, GraphFacts};
use crate::ops::is_data_movement;
use crate::precision::plan::ResolvedRegion;
use crate::precision::Precision;
use crate::tensor::DType;
use std::collections::{BTreeMap, HashSet};

/// What kind of kernel a node is, for the fusion rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Never fused (or the rules cannot apply to it).
    Other,
    /// Conv, ConvTranspose, Gemm, MatMul: a kernel with a fusable epilogue.
    Anchor,
    /// Elementwise arithmetic and activations.
    Pointwise,
    /// A reduction over the values it is later combined with (normalization statistics,
    /// softmax's max and sum).
    NormReduce,
    /// Softmax, LogSoftmax.
    Softmax,
    /// Reshape, Squeeze, Unsqueeze, Flatten, Identity: the same elements, another shape.
    View,
    /// A per-tensor QuantizeLinear of a float activation: the int8/fp8 output stage of the
    /// kernel whose value it reads (TensorRT fuses `… → Q` into that kernel).
    Quantize,
    /// A per-tensor DequantizeLinear of an activation: the input stage of the kernel that
    /// reads it (`DQ → …`).
    Dequantize,
}

const ANCHORS: &[&str] = &["Conv", "ConvTranspose", "Gemm", "MatMul"];
const POINTWISE: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "Neg",
    "Abs",
    "Exp",
    "Log",
    "Erf",
    "Tanh",
    "Sigmoid",
    "Relu",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "HardSigmoid",
    "HardSwish",
    "Softplus",
    "Softsign",
    "ThresholdedRelu",
    "Clip",
    "Max",
    "Min",
    "Mean",
    "Sum",
    "PRelu",
    "Gelu",
    "Mish",
    "BatchNormalization",
    "Sin",
    "Cos",
    "Where",
];
const REDUCTIONS: &[&str] = &[
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceSumSquare",
    "ReduceL2",
];
const VIEWS: &[&str] = &[
    "Reshape",
    "Squeeze",
    "Unsqueeze",
    "Flatten",
    "Identity",
    "Expand",
];

/// Who produces and who reads every value of a graph, by node index.
#[derive(Clone, Debug, Default)]
pub(crate) struct Topology {
    /// Per node, per input: the node producing it (None: graph input, weight, absent).
    pub producer_of_input: Vec<Vec<Option<usize>>>,
    /// Per node, per output: the nodes reading it (subgraphs reading it by name included).
    pub readers: Vec<Vec<Vec<usize>>>,
    /// Per node, per output: a graph output.
    pub graph_output: Vec<Vec<bool>>,
    /// Per node: every node it reads from (implicit inputs of subgraphs included).
    pub deps: Vec<Vec<usize>>,
    /// Per node: compute node (not data movement, not a folded weight).
    pub compute: Vec<bool>,
}

impl Topology {
    pub fn new(graph: &Graph) -> Topology {
        let values = graph.values();
        let n = graph.nodes.len();
        let mut t = Topology {
            producer_of_input: Vec::with_capacity(n),
            readers: Vec::with_capacity(n),
            graph_output: Vec::with_capacity(n),
            deps: Vec::with_capacity(n),
            compute: graph
                .nodes
                .iter()
                .map(|nd| !is_data_movement(nd) && !graph.is_folded(nd))
                .collect(),
        };
        for j in 0..n {
            let mut readers = Vec::new();
            let mut graph_output = Vec::new();
            for (k, out) in values.node_outputs(j).iter().enumerate() {
                // A value written twice (not valid ONNX) is read from its last writer only.
                let written_here =
                    |id: &ValueId| values.producer(*id) == Some(Producer { node: j, output: k });
                let mut nodes: Vec<usize> = Vec::new();
                if let Some(id) = out.filter(written_here) {
                    for c in values.consumers(id) {
                        if !nodes.contains(&c.node) {
                            nodes.push(c.node);
                        }
                    }
                }
                readers.push(nodes);
                graph_output.push(out.is_some_and(|id| values.is_graph_output(id)));
            }
            t.readers.push(readers);
            t.graph_output.push(graph_output);
            let reads = values.node_inputs(j).iter().flatten();
            let mut deps: Vec<usize> = reads
                .chain(values.node_implicit_inputs(j))
                .filter_map(|&id| values.producer(id).map(|p| p.node))
                .collect();
            deps.sort_unstable();
            deps.dedup();
            t.deps.push(deps);
            t.producer_of_input
                .push(values.input_producers(j).collect());
        }
        t
    }

    /// The distinct nodes reading any output of node `u`, and whether one is a graph output.
    fn consumers(&self, u: usize) -> (Vec<usize>, bool) {
        let mut c: Vec<usize> = self.readers[u].iter().flatten().copied().collect();
        c.sort_unstable();
        c.dedup();
        (c, self.graph_output[u].iter().any(|&b| b))
    }
}

/// The precision-independent part of the TensorRT rules for one graph.
#[derive(Clone, Debug)]
pub(crate) struct FusionAnalysis {
    pub topo: Topology,
    kind: Vec<Kind>,
    /// Node names and op types, for region names and rules (the graph is not kept).
    pub(crate) names: Vec<String>,
    pub(crate) ops: Vec<String>,
    /// Notes for `-v`: nodes the rules could not apply to, and why.
    pub notes: Vec<String>,
    /// Per node: the quantized kernel TensorRT runs a Q/DQ model's Conv/MatMul/Gemm with
    /// (`exec/qdq.rs`), for layers the plan gives a float precision.
    pub qdq: Vec<Option<std::sync::Arc<super::qdq::IntegerKernel>>>,
    /// Per node: the 16-bit float type its values are declared in (a strongly typed float16
    /// or bfloat16 model: `convert --fp16` exports, ModelOpt's float16 Q/DQ models), None for
    /// float32 or unknown. Such a node computes in that type whatever the plan says.
    pub native: Vec<Option<Precision>>,
}

/// The second MatMul of every attention that TensorRT 11.3 runs as a float16 kernel with
/// FP32 accumulation under `layers` (docs/numerics.md, "Fusion rules", row "attention,
/// upcast"), read with the graph's declared shapes: where the export puts the Cast down.
pub(crate) fn upcast_attention_outputs(graph: &Graph, layers: &[Precision]) -> Vec<usize> {
    let a = FusionAnalysis::new(graph, &BTreeMap::new());
    a.regions(layers, &vec![false; layers.len()], 0)
        .into_iter()
        .filter(|r| r.upcast_attention)
        .filter_map(|r| r.nodes.last().copied())
        .collect()
}

/// The precision node computes in for the fusion rules: its declared 16-bit type when the
/// plan leaves it in float32 or says the same type, else the plan's (None: a plan that asks
/// a natively 16-bit node for another type, which the rules do not fuse).
pub(crate) fn effective_precision(plan: Precision, native: Option<Precision>) -> Option<Precision> {
    match native {
        None => Some(plan),
        Some(n) if plan == Precision::Float32 || plan == n => Some(n),
        Some(_) => None,
    }
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Why the rules cannot apply to a value (None: they can).
fn value_problem(name: &str, fact: Option<&Fact>) -> Option<String> {
    let Some(f) = fact else {
        return Some(format!("nothing is known about '{name}'"));
    };
    match &f.shape {
        None => Some(format!("the rank of '{name}' is unknown")),
        Some(s) => s
            .iter()
            .any(|d| {
                d.symbols()
                    .any(|s| s.starts_with('?') || s.starts_with("unk__"))
            })
            .then(|| {
                format!(
                    "'{name}' has a dimension nothing is known about ({})",
                    f.shape_string()
                )
            }),
    }
}

impl FusionAnalysis {
    /// Reads `graph`: its inputs, with the shapes of `input_shapes` where given (the shapes a
    /// run uses: TensorRT builds for them) and the declared ones otherwise, give the facts the
    /// rules check.
    pub fn new(graph: &Graph, input_shapes: &BTreeMap<String, Vec<usize>>) -> FusionAnalysis {
        let topo = Topology::new(graph);
        let mut notes = Vec::new();
        let facts = match infer_graph(graph, &declared_input_facts(graph, input_shapes)) {
            Ok(f) => Some(f),
            Err(e) => {
                notes.push(format!(
                    "fusion (tensorrt): no region is formed, the model's shapes cannot be inferred: {e}"
                ));
                None
            }
        };
        let mut kind: Vec<Kind> = graph
            .nodes
            .iter()
            .map(|n| {
                let op = n.op_type.as_str();
                let foreign = !n.domain.is_empty() && n.domain != "ai.onnx";
                if foreign || n.has_subgraphs() || graph.is_folded(n) {
                    Kind::Other
                } else if ANCHORS.contains(&op) {
                    Kind::Anchor
                } else if op == "BatchNormalization" && n.outputs.len() > 1 {
                    Kind::Other // training mode
                } else if POINTWISE.contains(&op) {
                    Kind::Pointwise
                } else if REDUCTIONS.contains(&op) {
                    Kind::NormReduce // confirmed below
                } else if op == "Softmax" || op == "LogSoftmax" {
                    Kind::Softmax
                } else if VIEWS.contains(&op) {
                    Kind::View
                } else {
                    match crate::ops::qdq(n) {
                        Some(crate::ops::Qdq::Quantize) => Kind::Quantize,
                        Some(crate::ops::Qdq::Dequantize) => Kind::Dequantize,
                        None => Kind::Other,
                    }
                }
            })
            .collect();
        let dtype = |n: &str| facts.as_ref().and_then(|f| f.get(n)?.dtype);
        let sixteen = |d: Option<DType>| d.and_then(Precision::of_16bit_dtype);
        let mut native = vec![None; graph.nodes.len()];
        for (i, node) in graph.nodes.iter().enumerate() {
            if kind[i] == Kind::Other {
                continue;
            }
            if matches!(kind[i], Kind::Quantize | Kind::Dequantize) {
                // Per tensor only (one scale), between a float value and its codes.
                let per_tensor = node
                    .inputs
                    .get(1)
                    .and_then(|s| graph.weight(s))
                    .is_some_and(|s| s.len() == 1);
                let float = if kind[i] == Kind::Quantize {
                    node.inputs.first().map(|x| dtype(x))
                } else {
                    node.outputs.first().map(|y| dtype(y))
                };
                match float.flatten() {
                    Some(d) if per_tensor && is_float(d) => native[i] = sixteen(Some(d)),
                    _ => kind[i] = Kind::Other,
                }
                continue;
            }
            match check_node(graph, i, facts.as_ref()) {
                Check::Ok => {
                    native[i] = sixteen(node.outputs.first().and_then(|o| dtype(o)));
                }
                Check::NotFloat => kind[i] = Kind::Other,
                Check::Problem(why) => {
                    kind[i] = Kind::Other;
                    if facts.is_some() {
                        notes.push(format!(
                            "fusion (tensorrt): '{}' ({}) stays unfused: {why}",
                            node.name, node.op_type
                        ));
                    }
                }
            }
        }
        let dtype_of = |n: &str| {
            graph
                .weight(n)
                .map(|t| t.dtype())
                .or_else(|| facts.as_ref()?.get(n)?.dtype)
        };
        let qdq = super::qdq::analyze(graph, &dtype_of);
        notes.extend(qdq.notes);
        let mut a = FusionAnalysis {
            topo,
            kind,
            names: graph.nodes.iter().map(|n| n.name.clone()).collect(),
            ops: graph.nodes.iter().map(|n| n.op_type.clone()).collect(),
            notes,
            qdq: qdq.kernels,
            native,
        };
        for i in 0..graph.nodes.len() {
            if a.kind[i] == Kind::NormReduce && !a.reduces_for_normalization(graph, i) {
                a.kind[i] = Kind::Other;
            }
        }
        a
    }

    /// A reduction belongs to a normalization or softmax when a pointwise node after it also
    /// reads the values it reduced (or the values they were computed from): x → ReduceMean →
    /// Sub(x, ·), exp → ReduceSum → Div(exp, ·), x² → ReduceMean → ... → Div(x, ·),
    /// x² → ReduceSum → ... → Mul(x − mean, ·). A global average pool feeding a classifier is
    /// not one.
    fn reduces_for_normalization(&self, graph: &Graph, r: usize) -> bool {
        const DEPTH: usize = 8;
        const DERIVED_DEPTH: usize = 2;
        let Some(&Some(x)) = self.topo.producer_of_input[r].first() else {
            // Reducing a graph input: its readers are the nodes reading that input.
            return self.reads_value_after(graph, r, &[graph.nodes[r].inputs[0].as_str()]);
        };
        // The values the reduced one is computed from, through pointwise steps.
        let mut values: Vec<&str> = vec![graph.nodes[r].inputs[0].as_str()];
        let mut frontier = vec![x];
        for _ in 0..DEPTH {
            let mut next = Vec::new();
            for u in frontier {
                if !matches!(
                    self.kind[u],
                    Kind::Pointwise | Kind::View | Kind::NormReduce
                ) {
                    continue;
                }
                for (k, name) in graph.nodes[u].inputs.iter().enumerate() {
                    if name.is_empty() || graph.weight(name).is_some() {
                        continue;
                    }
                    values.push(name.as_str());
                    if let Some(p) = self.topo.producer_of_input[u][k] {
                        next.push(p);
                    }
                }
            }
            frontier = next;
        }
        // And the values computed elementwise from them: a LayerNorm written as E[x²] − E[x]²
        // scales x − mean (not x) by its statistic (jax2tf's LayerNorm in Magika).
        for _ in 0..DERIVED_DEPTH {
            let mut next: Vec<&str> = Vec::new();
            for (c, node) in graph.nodes.iter().enumerate() {
                if !matches!(self.kind[c], Kind::Pointwise | Kind::View)
                    || !node.inputs.iter().any(|i| values.contains(&i.as_str()))
                {
                    continue;
                }
                for o in &node.outputs {
                    if !o.is_empty() && !values.contains(&o.as_str()) && !next.contains(&o.as_str())
                    {
                        next.push(o.as_str());
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            values.extend(next);
        }
        self.reads_value_after(graph, r, &values)
    }

    /// Whether a pointwise node reached from `r` through pointwise steps reads one of `values`.
    fn reads_value_after(&self, graph: &Graph, r: usize, values: &[&str]) -> bool {
        let mut seen = HashSet::new();
        // A LayerNorm's variance reaches x − mean through its Sub, Max, epsilon Add, Sqrt,
        // Reciprocal, scale Mul and the broadcasting views between them.
        const DEPTH: usize = 12;
        let mut frontier = vec![r];
        for _ in 0..DEPTH {
            let mut next = Vec::new();
            for u in frontier {
                for &c in self.topo.readers[u].iter().flatten() {
                    if !seen.insert(c) {
                        continue;
                    }
                    if !matches!(
                        self.kind[c],
                        Kind::Pointwise | Kind::View | Kind::NormReduce | Kind::Softmax
                    ) {
                        continue;
                    }
                    if self.kind[c] == Kind::Pointwise
                        && graph.nodes[c]
                            .inputs
                            .iter()
                            .any(|i| values.contains(&i.as_str()))
                    {
                        return true;
                    }
                    next.push(c);
                }
            }
            frontier = next;
        }
        false
    }

    /// The regions the TensorRT rules form under `layers` (one precision per node), leaving
    /// out the nodes in `taken` (explicit regions); region indices start at `first_index`.
    pub fn regions(
        &self,
        layers: &[Precision],
        taken: &[bool],
        first_index: usize,
    ) -> Vec<ResolvedRegion> {
        let n = self.kind.len();
        let mut gid: Vec<Option<usize>> = vec![None; n];
        let mut groups: Vec<Group> = Vec::new();
        for c in 0..n {
            let kind = self.kind[c];
            if kind == Kind::Other || taken.get(c).copied().unwrap_or(false) {
                continue;
            }
            if kind == Kind::Dequantize {
                continue; // Joins the kernel that reads it, below.
            }
            let p = effective_precision(layers[c], self.native[c]);
            let fusable_precision = matches!(p, Some(Precision::Float16 | Precision::BFloat16));
            let carrier = matches!(kind, Kind::View | Kind::Quantize);
            if !carrier && !fusable_precision {
                continue;
            }
            // A view carries its input's values and a QuantizeLinear turns them into codes:
            // their own precision is never compared.
            let p = p.unwrap_or(layers[c]);
            // Groups this node may join through one of its inputs, latest first (a
            // QuantizeLinear through its data input only).
            let data_inputs = if kind == Kind::Quantize {
                1
            } else {
                usize::MAX
            };
            let mut cands: Vec<usize> = Vec::new();
            for &u in self.topo.producer_of_input[c]
                .iter()
                .take(data_inputs)
                .flatten()
            {
                let Some(g) = gid[u] else { continue };
                let grp = &groups[g];
                if cands.contains(&g) || !self.may_join(grp, u, c, kind, p) {
                    continue;
                }
                cands.push(g);
            }
            if carrier && cands.len() != 1 {
                continue; // A view joins the group of its one data input, or none.
            }
            cands.sort_by_key(|&g| std::cmp::Reverse(groups[g].last));
            let mut joined = None;
            for &g in &cands {
                if self.convex_with(&groups[g].nodes, &[c]) {
                    joined = Some(g);
                    break;
                }
            }
            match joined {
                Some(g) => {
                    groups[g].add(c, kind, &self.ops[c]);
                    gid[c] = Some(g);
                    // Merge the other candidate groups when the result is still one kernel.
                    for &h in cands.iter().filter(|&&h| h != g) {
                        // A kernel with an epilogue has no prologue: groups holding a
                        // Conv/Gemm/MatMul are not merged with others.
                        if groups[h].nodes.is_empty()
                            || groups[g].anchors > 0
                            || groups[h].anchors > 0
                            || groups[g].closed
                            || groups[h].closed
                            || !self.convex_with(&groups[g].nodes, &groups[h].nodes)
                        {
                            continue;
                        }
                        let moved = std::mem::take(&mut groups[h].nodes);
                        for &m in &moved {
                            gid[m] = Some(g);
                        }
                        let (anchors, softmax, last) =
                            (groups[h].anchors, groups[h].softmax, groups[h].last);
                        let op = groups[h].anchor_op.clone();
                        let grp = &mut groups[g];
                        grp.nodes.extend(moved);
                        grp.nodes.sort_unstable();
                        grp.anchors += anchors;
                        grp.softmax |= softmax;
                        grp.last = grp.last.max(last);
                        if grp.anchor_op.is_none() {
                            grp.anchor_op = op;
                        }
                    }
                }
                None if !carrier => {
                    let mut grp = Group {
                        nodes: Vec::new(),
                        precision: p,
                        anchors: 0,
                        anchor_op: None,
                        softmax: false,
                        closed: false,
                        last: c,
                    };
                    grp.add(c, kind, &self.ops[c]);
                    gid[c] = Some(groups.len());
                    groups.push(grp);
                }
                None => {}
            }
        }
        // A DequantizeLinear of an activation read only by one group is that kernel's input
        // stage: the dequantized values stay f32 inside it (TensorRT fuses `DQ → kernel`).
        for d in 0..n {
            if self.kind[d] != Kind::Dequantize || taken.get(d).copied().unwrap_or(false) {
                continue;
            }
            let (readers, out) = self.topo.consumers(d);
            let Some(&first) = readers.first() else {
                continue;
            };
            let Some(g) = gid[first] else { continue };
            if out
                || readers.iter().any(|&r| gid[r] != Some(g))
                || !self.convex_with(&groups[g].nodes, &[d])
            {
                continue;
            }
            let grp = &mut groups[g];
            grp.nodes.push(d);
            grp.nodes.sort_unstable();
            gid[d] = Some(g);
        }
        let mut out = Vec::new();
        // TensorRT 11.3's FP32-accumulating float16 attention, among the float32 nodes no
        // group holds.
        let mut upcast = Vec::new();
        let free = |i: usize| gid[i].is_none() && !taken.get(i).copied().unwrap_or(false);
        for c in 0..n {
            if let Some(nodes) = self.upcast_attention_from(c, layers, &free) {
                upcast.push(nodes);
            }
        }
        for g in groups {
            let compute = g.nodes.iter().filter(|&&i| self.topo.compute[i]).count();
            if compute < 2 {
                continue; // One kernel alone: the region would change nothing.
            }
            let first = &self.names[g.nodes[0]];
            let last = &self.names[*g.nodes.last().expect("non-empty")];
            let name = if g.nodes.len() == 2 {
                format!("{first}+{last}")
            } else {
                format!("{first}..{last}")
            };
            out.push(ResolvedRegion {
                index: first_index + out.len(),
                name,
                nodes: g.nodes,
                precision: g.precision,
                upcast_attention: false,
            });
        }
        for nodes in upcast {
            let name = format!(
                "{}..{}",
                self.names[nodes[0]],
                self.names[*nodes.last().expect("non-empty")]
            );
            out.push(ResolvedRegion {
                index: first_index + out.len(),
                name,
                nodes,
                precision: Precision::Float16,
                upcast_attention: true,
            });
        }
        out
    }

    /// The nodes of an attention graph starting at MatMul `b1` that TensorRT 11.3 runs as a
    /// float16 fused attention accumulating in FP32 (docs/numerics.md, "Fusion rules", row
    /// "attention, upcast"): Q·Kᵀ → pointwise (scale, mask) → Softmax → ·V, every node float32
    /// under `layers` and free, where Q, K and V are float16 values (a float16 layer's output
    /// through data movement only, so the export's Casts up stand directly in front) and the
    /// output is read, through data movement, by float16 layers only (one Cast down after
    /// it). The release note names FP16 only: bfloat16 is left as it was.
    pub(crate) fn upcast_attention_from(
        &self,
        b1: usize,
        layers: &[Precision],
        free: &dyn Fn(usize) -> bool,
    ) -> Option<Vec<usize>> {
        const MAX_CHAIN: usize = 12;
        let float32 = |i: usize| {
            free(i)
                && self.kind[i] != Kind::Other
                && effective_precision(layers[i], self.native[i]) == Some(Precision::Float32)
        };
        if self.ops[b1] != "MatMul" || !float32(b1) {
            return None;
        }
        // (A MatMul missing an input is the kernel's error to report, not a pattern.)
        let from_float16 = |k: usize| {
            let u = self.topo.producer_of_input[b1].get(k).copied().flatten();
            self.float16_source(u, layers)
        };
        if !(from_float16(0) && from_float16(1)) {
            return None;
        }
        let mut nodes = vec![b1];
        let mut softmax = false;
        let mut cur = b1;
        for _ in 0..MAX_CHAIN {
            // The scores and probabilities pass along a chain: each read by the next node only.
            let (readers, out) = self.topo.consumers(cur);
            let [next] = readers[..] else { return None };
            if out || !free(next) {
                return None;
            }
            match self.kind[next] {
                Kind::View => {}
                Kind::Pointwise if !softmax && float32(next) => {}
                Kind::Softmax if !softmax && self.ops[next] == "Softmax" && float32(next) => {
                    softmax = true;
                }
                Kind::Anchor
                    if softmax
                        && self.ops[next] == "MatMul"
                        && float32(next)
                        && self.topo.producer_of_input[next].first() == Some(&Some(cur)) =>
                {
                    let v = self.topo.producer_of_input[next].get(1).copied().flatten();
                    if !self.float16_source(v, layers) || !self.read_in_float16(next, layers) {
                        return None;
                    }
                    nodes.push(next);
                    nodes.sort_unstable();
                    return Some(nodes);
                }
                _ => return None,
            }
            nodes.push(next);
            cur = next;
        }
        None
    }

    /// Whether the value node `u` produces is float16: a layer computing in float16 (by the
    /// plan, or as the model declares it) reached back through data movement (Reshape,
    /// Transpose, a Cast up) only. A graph input or a weight is not.
    fn float16_source(&self, mut u: Option<usize>, layers: &[Precision]) -> bool {
        const MAX_MOVES: usize = 8;
        for _ in 0..=MAX_MOVES {
            let Some(n) = u else { return false };
            if self.topo.compute[n] {
                return effective_precision(layers[n], self.native[n]) == Some(Precision::Float16);
            }
            u = self.topo.producer_of_input[n].first().copied().flatten();
        }
        false
    }

    /// Whether every reader of node `u`'s outputs, through data movement, is a layer
    /// computing in float16 (none a graph output): the value is cast down right after it.
    fn read_in_float16(&self, u: usize, layers: &[Precision]) -> bool {
        let mut stack = vec![u];
        let mut seen = HashSet::new();
        while let Some(x) = stack.pop() {
            let (readers, out) = self.topo.consumers(x);
            if out || readers.is_empty() {
                return false;
            }
            for r in readers {
                if !seen.insert(r) {
                    continue;
                }
                if !self.topo.compute[r] {
                    stack.push(r);
                } else if effective_precision(layers[r], self.native[r]) != Some(Precision::Float16)
                {
                    return false;
                }
            }
        }
        true
    }

    /// Whether node `c` (of `kind`, in precision `p`) may join `grp` through the value it reads
    /// from `u`, a node of the group.
    fn may_join(&self, grp: &Group, u: usize, c: usize, kind: Kind, p: Precision) -> bool {
        let carrier = matches!(kind, Kind::View | Kind::Quantize);
        if grp.closed || (!carrier && grp.precision != p) {
            return false;
        }
        // An epilogue is a chain: the value the kernel passes on is read by the next node only,
        // or also by pointwise nodes that combine it with the next node's result (x·σ(x),
        // x·Φ(x): the decomposed SiLU and GELU after a convolution).
        let (readers, out) = self.topo.consumers(u);
        let chain = !out && (readers == [c] || self.rejoins(&readers, c));
        let matmul_anchor = grp.anchors == 1 && grp.anchor_op.as_deref() == Some("MatMul");
        match kind {
            Kind::View => grp.anchors == 0 || grp.softmax || chain,
            Kind::Pointwise => grp.anchors == 0 || grp.softmax || chain,
            Kind::NormReduce | Kind::Softmax => {
                grp.anchors == 0 || (matmul_anchor && !grp.softmax && chain)
            }
            // Attention: the second MatMul reads the softmax of the first.
            Kind::Anchor => matmul_anchor && grp.softmax && chain,
            // The kernel's output stage: it quantizes the value the kernel would write.
            Kind::Quantize => chain,
            Kind::Other | Kind::Dequantize => false,
        }
    }

    /// Whether every reader but `c` of a value is a pointwise node that reads, within a few
    /// pointwise steps, what `c` computes: the value forks into `c` and joins again after it.
    fn rejoins(&self, readers: &[usize], c: usize) -> bool {
        const DEPTH: usize = 4;
        if self.kind[c] != Kind::Pointwise {
            return false;
        }
        readers.iter().filter(|&&r| r != c).all(|&r| {
            if self.kind[r] != Kind::Pointwise {
                return false;
            }
            let mut frontier = vec![r];
            for _ in 0..DEPTH {
                let mut next = Vec::new();
                for &f in &frontier {
                    for &d in &self.topo.deps[f] {
                        if d == c {
                            return true;
                        }
                        if d > c && self.kind[d] == Kind::Pointwise {
                            next.push(d);
                        }
                    }
                }
                frontier = next;
            }
            false
        })
    }

    /// Whether `a ∪ b` is convex: no path leaves it and comes back (a backward walk from the
    /// outside nodes it reads, within the set's span of the graph order).
    fn convex_with(&self, a: &[usize], b: &[usize]) -> bool {
        let set: HashSet<usize> = a.iter().chain(b).copied().collect();
        let Some(&lo) = set.iter().min() else {
            return true;
        };
        let mut stack: Vec<usize> = set
            .iter()
            .flat_map(|&s| self.topo.deps[s].iter().copied())
            .filter(|u| !set.contains(u) && *u >= lo)
            .collect();
        let mut seen: HashSet<usize> = stack.iter().copied().collect();
        while let Some(u) = stack.pop() {
            for &d in &self.topo.deps[u] {
                if d < lo {
                    continue;
                }
                if set.contains(&d) {
                    return false;
                }
                if seen.insert(d) {
                    stack.push(d);
                }
            }
        }
        true
    }
}

#[derive(Clone, Debug)]
struct Group {
    nodes: Vec<usize>,
    precision: Precision,
    anchors: usize,
    anchor_op: Option<String>,
    /// Holds a softmax or a normalization's reduction.
    softmax: bool,
    /// Attention complete: nothing joins any more.
    closed: bool,
    last: usize,
}

impl Group {
    fn add(&mut self, c: usize, kind: Kind, op: &str) {
        self.nodes.push(c);
        self.last = self.last.max(c);
        match kind {
            Kind::Anchor => {
                self.anchors += 1;
                if self.anchor_op.is_none() {
                    self.anchor_op = Some(op.to_string());
                }
                if self.anchors == 2 {
                    self.closed = true;
                }
            }
            Kind::NormReduce | Kind::Softmax => self.softmax = true,
            // Codes leave the kernel: nothing computes after them in it.
            Kind::Quantize => self.closed = true,
            _ => {}
        }
    }
}

enum Check {
    Ok,
    /// Integer or boolean arithmetic: not a precision matter, no note.
    NotFloat,
    Problem(String),
}

/// Whether the rules can apply to node `i`: its float values have one element type and
/// shapes of known rank with no unknown dimension.
fn check_node(graph: &Graph, i: usize, facts: Option<&GraphFacts>) -> Check {
    let Some(facts) = facts else {
        return Check::NotFloat;
    };
    let node = &graph.nodes[i];
    let out = node.outputs.first().map(String::as_str).unwrap_or("");
    let Some(of) = facts.get(out) else {
        return Check::Problem(format!("nothing is known about its output '{out}'"));
    };
    match of.dtype {
        Some(d) if is_float(d) => {}
        Some(_) => return Check::NotFloat,
        None => return Check::Problem(format!("the element type of '{out}' is unknown")),
    }
    let mut types: Vec<DType> = Vec::new();
    for name in node.inputs.iter().chain(node.outputs.iter().take(1)) {
        if name.is_empty() {
            continue;
        }
        let f = facts.get(name);
        if let Some(d) = f.and_then(|f| f.dtype) {
            if !is_float(d) {
                continue; // Shapes, axes, Where's condition.
            }
            if !types.contains(&d) {
                types.push(d);
            }
        }
        if graph.weight(name).is_none() {
            if let Some(p) = value_problem(name, f) {
                return Check::Problem(p);
            }
        }
    }
    if types.len() > 1 {
        let names: Vec<String> = types.iter().map(|d| format!("{d:?}")).collect();
        return Check::Problem(format!("it mixes element types ({})", names.join(", ")));
    }
    Check::Ok
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::graph::testing::*;
    use crate::graph::{Attribute, Dim, Node};
    use crate::precision::Precision::{Float16 as H, Float32 as F};
    use crate::tensor::Tensor;

    /// The regions the TensorRT rules form for `g` with every layer in float16 except the
    /// named ones (in float32), as lists of node names.
    pub(crate) fn regions_of(g: &Graph, fp32: &[&str]) -> Vec<Vec<String>> {
        let a = FusionAnalysis::new(g, &BTreeMap::new());
        let layers: Vec<Precision> = g
            .nodes
            .iter()
            .map(|n| {
                if fp32.contains(&n.name.as_str()) {
                    F
                } else {
                    H
                }
            })
            .collect();
        a.regions(&layers, &vec![false; g.nodes.len()], 0)
            .into_iter()
            .map(|r| r.nodes.iter().map(|&i| g.nodes[i].name.clone()).collect())
            .collect()
    }

    fn w(shape: &[usize], v: f32) -> Tensor {
        Tensor::from_f32(shape.to_vec(), vec![v; shape.iter().product()])
    }

    fn with_ints(mut n: Node, attr: &str, v: &[i64]) -> Node {
        n.attrs.insert(attr.into(), Attribute::Ints(v.to_vec()));
        n
    }

    fn with_int(mut n: Node, attr: &str, v: i64) -> Node {
        n.attrs.insert(attr.into(), Attribute::Int(v));
        n
    }

    fn bn(name: &str, x: &str, y: &str) -> Node {
        node(name, "BatchNormalization", &[x, "s", "b", "m", "v"], &[y])
    }

    fn bn_inits() -> Vec<(&'static str, Tensor)> {
        vec![
            ("s", w(&[2], 1.5)),
            ("b", w(&[2], 0.1)),
            ("m", w(&[2], 0.2)),
            ("v", w(&[2], 2.0)),
            ("w1", w(&[2, 2, 1, 1], 0.5)),
            ("w2", w(&[2, 2, 1, 1], 0.25)),
        ]
    }

    /// x → conv1 → bn1 → relu1 → conv2 → bn2 → add(·, relu1) → relu2 → y.
    pub(crate) fn conv_block() -> Graph {
        graph(
            vec![
                node("conv1", "Conv", &["x", "w1"], &["c1"]),
                bn("bn1", "c1", "n1"),
                node("relu1", "Relu", &["n1"], &["r1"]),
                node("conv2", "Conv", &["r1", "w2"], &["c2"]),
                bn("bn2", "c2", "n2"),
                node("add", "Add", &["n2", "r1"], &["a"]),
                node("relu2", "Relu", &["a"], &["y"]),
            ],
            vec![vi("x", &[1, 2, 3, 3])],
            vec![vi("y", &[1, 2, 3, 3])],
            bn_inits(),
        )
    }

    /// conv_block with conv1's output also a graph output.
    fn conv_block_with_tap() -> Graph {
        let mut g = conv_block();
        g.outputs.push(vi("c1", &[1, 2, 3, 3]));
        g
    }

    /// Polygraphy's needs_constraints: MatMul → Add(c) → Sub(c) → MatMul_1.
    fn seed_model() -> Graph {
        graph(
            vec![
                node("MatMul", "MatMul", &["x", "flip"], &["m"]),
                node("Add", "Add", &["m", "c"], &["a"]),
                node("Sub", "Sub", &["a", "c"], &["s"]),
                node("MatMul_1", "MatMul", &["s", "flip"], &["y"]),
            ],
            vec![vi("x", &[2, 2])],
            vec![vi("y", &[2, 2])],
            vec![("flip", w(&[2, 2], 1.0)), ("c", w(&[1], 65504.0))],
        )
    }

    fn gemm_relu() -> Graph {
        graph(
            vec![
                node("gemm", "Gemm", &["x", "wt", "bias"], &["g"]),
                node("relu", "Relu", &["g"], &["y"]),
            ],
            vec![vi("x", &[2, 2])],
            vec![vi("y", &[2, 2])],
            vec![("wt", w(&[2, 2], 1.0)), ("bias", w(&[2], 1.0))],
        )
    }

    fn gelu_silu() -> Graph {
        graph(
            vec![
                node("div", "Div", &["x", "sqrt2"], &["d"]),
                node("erf", "Erf", &["d"], &["e"]),
                node("add1", "Add", &["e", "one"], &["e1"]),
                node("mul", "Mul", &["x", "e1"], &["xm"]),
                node("half", "Mul", &["xm", "h"], &["gelu"]),
                node("sig", "Sigmoid", &["gelu"], &["sg"]),
                node("silu", "Mul", &["gelu", "sg"], &["y"]),
            ],
            vec![vi("x", &[4])],
            vec![vi("y", &[4])],
            vec![
                ("sqrt2", w(&[1], std::f32::consts::SQRT_2)),
                ("one", w(&[1], 1.0)),
                ("h", w(&[1], 0.5)),
            ],
        )
    }

    fn mish() -> Graph {
        graph(
            vec![
                node("sp", "Softplus", &["x"], &["s"]),
                node("tanh", "Tanh", &["s"], &["t"]),
                node("mish", "Mul", &["x", "t"], &["y"]),
            ],
            vec![vi("x", &[4])],
            vec![vi("y", &[4])],
            vec![],
        )
    }

    /// A decomposed LayerNorm over the last axis of [2, 4].
    pub(crate) fn layernorm_block() -> Graph {
        graph(
            vec![
                with_ints(node("mean", "ReduceMean", &["x"], &["mu"]), "axes", &[-1]),
                node("sub", "Sub", &["x", "mu"], &["d"]),
                node("pow", "Pow", &["d", "two"], &["d2"]),
                with_ints(node("var", "ReduceMean", &["d2"], &["v"]), "axes", &[-1]),
                node("add_eps", "Add", &["v", "eps"], &["ve"]),
                node("sqrt", "Sqrt", &["ve"], &["sd"]),
                node("div", "Div", &["d", "sd"], &["n"]),
                node("gamma", "Mul", &["n", "g"], &["ng"]),
                node("beta", "Add", &["ng", "bt"], &["y"]),
            ],
            vec![vi("x", &[2, 4])],
            vec![vi("y", &[2, 4])],
            vec![
                ("two", w(&[1], 2.0)),
                ("eps", w(&[1], 1e-5)),
                ("g", w(&[4], 1.5)),
                ("bt", w(&[4], 0.25)),
            ],
        )
    }

    /// jax2tf's LayerNorm (Magika's): variance as E[x²] − E[x]², the statistics broadcast
    /// back through Reshape and Expand, x − mean scaled by the reciprocal deviation.
    fn broadcast_layernorm_block() -> Graph {
        let keep0 = |n: Node| with_int(with_ints(n, "axes", &[-1]), "keepdims", 0);
        let shape = |v: &[i64]| Tensor::from_i64(vec![v.len()], v.to_vec());
        graph(
            vec![
                keep0(node("mean", "ReduceMean", &["x"], &["mu"])),
                node("sq", "Mul", &["x", "x"], &["x2"]),
                keep0(node("msq", "ReduceMean", &["x2"], &["m2"])),
                node("mu2", "Mul", &["mu", "mu"], &["musq"]),
                node("var", "Sub", &["m2", "musq"], &["v"]),
                node("var_col", "Reshape", &["v", "col"], &["vc"]),
                node("var_wide", "Expand", &["vc", "wide"], &["vb"]),
                node("add_eps", "Add", &["vb", "eps"], &["ve"]),
                node("sqrt", "Sqrt", &["ve"], &["sd"]),
                node("inv", "Reciprocal", &["sd"], &["is"]),
                node("mean_col", "Reshape", &["mu", "col"], &["mc"]),
                node("mean_wide", "Expand", &["mc", "wide"], &["mb"]),
                node("sub", "Sub", &["x", "mb"], &["d"]),
                node("norm", "Mul", &["d", "is"], &["y"]),
            ],
            vec![vi("x", &[2, 4])],
            vec![vi("y", &[2, 4])],
            vec![
                ("eps", w(&[1], 1e-5)),
                ("col", shape(&[2, 1])),
                ("wide", shape(&[2, 4])),
            ],
        )
    }

    fn rmsnorm_block() -> Graph {
        graph(
            vec![
                node("sq", "Mul", &["x", "x"], &["x2"]),
                with_ints(node("ms", "ReduceMean", &["x2"], &["m"]), "axes", &[-1]),
                node("eps", "Add", &["m", "e"], &["me"]),
                node("rsqrt", "Sqrt", &["me"], &["r"]),
                node("norm", "Div", &["x", "r"], &["n"]),
                node("scale", "Mul", &["n", "g"], &["y"]),
            ],
            vec![vi("x", &[2, 4])],
            vec![vi("y", &[2, 4])],
            vec![("e", w(&[1], 1e-6)), ("g", w(&[4], 2.0))],
        )
    }

    fn softmax_block() -> Graph {
        graph(
            vec![
                with_ints(node("max", "ReduceMax", &["x"], &["mx"]), "axes", &[-1]),
                node("sub", "Sub", &["x", "mx"], &["d"]),
                node("exp", "Exp", &["d"], &["e"]),
                node("sum", "ReduceSum", &["e", "ax"], &["s"]),
                node("div", "Div", &["e", "s"], &["y"]),
            ],
            vec![vi("x", &[2, 4])],
            vec![vi("y", &[2, 4])],
            vec![("ax", Tensor::from_i64(vec![1], vec![-1]))],
        )
    }

    fn pool_block() -> Graph {
        graph(
            vec![
                with_ints(node("pool", "ReduceMean", &["x"], &["p"]), "axes", &[-1]),
                node("relu", "Relu", &["p"], &["y"]),
            ],
            vec![vi("x", &[2, 4])],
            vec![vi("y", &[2, 1])],
            vec![],
        )
    }

    /// softmax(q·kᵀ / s + mask)·v with kᵀ, v and mask graph inputs.
    fn attention_block() -> Graph {
        graph(
            vec![
                node("qk", "MatMul", &["q", "kt"], &["s"]),
                node("scale", "Div", &["s", "sc"], &["ss"]),
                node("mask", "Add", &["ss", "m"], &["sm"]),
                with_int(node("softmax", "Softmax", &["sm"], &["p"]), "axis", -1),
                node("av", "MatMul", &["p", "v"], &["y"]),
            ],
            vec![
                vi("q", &[1, 3, 4]),
                vi("kt", &[1, 4, 3]),
                vi("m", &[1, 3, 3]),
                vi("v", &[1, 3, 4]),
            ],
            vec![vi("y", &[1, 3, 4])],
            vec![("sc", w(&[1], 2.0))],
        )
    }

    /// Deterministic weights of many values (a constant weight makes every column alike).
    pub(crate) fn varied(shape: &[usize], seed: usize) -> Tensor {
        let n: usize = shape.iter().product();
        let v = (0..n)
            .map(|i| (((i * 37 + seed * 11) % 101) as f32 / 101.0 - 0.5) * 0.7)
            .collect();
        Tensor::from_f32(shape.to_vec(), v)
    }

    /// x → q, k, v projections → softmax(q·kᵀ / √8 + m)·v → output projection: the
    /// attention graph a plan may keep float32 between float16 projections.
    pub(crate) fn projected_attention_block() -> Graph {
        graph(
            vec![
                node("q_proj", "MatMul", &["x", "wq"], &["q"]),
                node("k_proj", "MatMul", &["x", "wk"], &["k"]),
                with_ints(
                    node("k_t", "Transpose", &["k"], &["kt"]),
                    "perm",
                    &[0, 2, 1],
                ),
                node("v_proj", "MatMul", &["x", "wv"], &["v"]),
                node("qk", "MatMul", &["q", "kt"], &["s"]),
                node("scale", "Div", &["s", "sc"], &["ss"]),
                node("mask", "Add", &["ss", "m"], &["sm"]),
                with_int(node("softmax", "Softmax", &["sm"], &["p"]), "axis", -1),
                node("av", "MatMul", &["p", "v"], &["a"]),
                node("o_proj", "MatMul", &["a", "wo"], &["y"]),
            ],
            vec![vi("x", &[1, 8, 16]), vi("m", &[1, 8, 8])],
            vec![vi("y", &[1, 8, 16])],
            vec![
                ("wq", varied(&[16, 16], 1)),
                ("wk", varied(&[16, 16], 2)),
                ("wv", varied(&[16, 16], 3)),
                ("wo", varied(&[16, 16], 4)),
                ("sc", w(&[1], 8f32.sqrt())),
            ],
        )
    }

    /// The attention layers of [`projected_attention_block`].
    pub(crate) const ATTENTION: [&str; 5] = ["qk", "scale", "mask", "softmax", "av"];

    /// relu → neg → floor → add(·, neg) → relu2: Floor is no fusable kernel, so add cannot
    /// join relu's group (the path through floor would leave it and come back).
    fn diamond() -> Graph {
        graph(
            vec![
                node("relu", "Relu", &["x"], &["r"]),
                node("neg", "Neg", &["r"], &["n"]),
                node("floor", "Floor", &["n"], &["f"]),
                node("add", "Add", &["f", "n"], &["a"]),
                node("relu2", "Relu", &["a"], &["y"]),
            ],
            vec![vi("x", &[4])],
            vec![vi("y", &[4])],
            vec![],
        )
    }

    fn unknown_shape_chain() -> Graph {
        let mut g = graph(
            vec![
                node("relu", "Relu", &["x"], &["r"]),
                node("neg", "Neg", &["r"], &["y"]),
            ],
            vec![vi("x", &[4])],
            vec![vi("y", &[4])],
            vec![],
        );
        g.inputs[0].shape = None;
        g
    }

    fn mixed_types_chain() -> Graph {
        let mut g = graph(
            vec![
                node("add", "Add", &["x", "x16"], &["a"]),
                node("neg", "Neg", &["a"], &["y"]),
            ],
            vec![vi("x", &[4]), vi("x16", &[4])],
            vec![vi("y", &[4])],
            vec![],
        );
        g.inputs[1].dtype = Some(DType::F16);
        g
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn conv_bias_batchnorm_activation_and_residual_add_are_one_epilogue() {
        let g = conv_block();
        assert_eq!(
            regions_of(&g, &[]),
            vec![
                names(&["conv1", "bn1", "relu1"]),
                names(&["conv2", "bn2", "add", "relu2"])
            ]
        );
        // conv1's output also a graph output: the epilogue cannot run inside conv1, its
        // BatchNormalization and Relu are a pointwise kernel of their own.
        let g = conv_block_with_tap();
        assert_eq!(
            regions_of(&g, &[]),
            vec![
                names(&["bn1", "relu1"]),
                names(&["conv2", "bn2", "add", "relu2"])
            ]
        );
    }

    #[test]
    fn a_precision_boundary_splits_a_region() {
        let g = seed_model();
        assert_eq!(regions_of(&g, &[]), vec![names(&["MatMul", "Add", "Sub"])]);
        assert_eq!(regions_of(&g, &["Sub"]), vec![names(&["MatMul", "Add"])]);
        assert!(regions_of(&g, &["Add"]).is_empty());
    }

    #[test]
    fn gemm_and_matmul_take_their_bias() {
        let g = gemm_relu();
        assert_eq!(regions_of(&g, &[]), vec![names(&["gemm", "relu"])]);
    }

    #[test]
    fn pointwise_groups_are_maximal_and_include_decomposed_activations() {
        // GELU (x/√2 → Erf → +1 → ·x → ·½) and SiLU (x·sigmoid(x)) on a graph input.
        let g = gelu_silu();
        assert_eq!(
            regions_of(&g, &[]),
            vec![names(&["div", "erf", "add1", "mul", "half", "sig", "silu"])]
        );
        // Mish: x·tanh(softplus(x)).
        let g = mish();
        assert_eq!(regions_of(&g, &[]), vec![names(&["sp", "tanh", "mish"])]);
    }

    #[test]
    fn decomposed_layernorm_and_rmsnorm_are_one_region_each() {
        let g = layernorm_block();
        assert_eq!(
            regions_of(&g, &[]),
            vec![names(&[
                "mean", "sub", "pow", "var", "add_eps", "sqrt", "div", "gamma", "beta"
            ])]
        );
        let g = rmsnorm_block();
        assert_eq!(
            regions_of(&g, &[]),
            vec![names(&["sq", "ms", "eps", "rsqrt", "norm", "scale"])]
        );
    }

    #[test]
    fn a_layernorm_broadcasting_its_statistics_through_expand_is_one_region() {
        let g = broadcast_layernorm_block();
        let all: Vec<String> = g.nodes.iter().map(|n| n.name.clone()).collect();
        let mut got = regions_of(&g, &[]);
        assert_eq!(got.len(), 1, "{got:?}");
        got[0].sort();
        let mut want = all;
        want.sort();
        assert_eq!(got[0], want);
    }

    #[test]
    fn decomposed_softmax_is_one_region_and_a_pooling_reduction_is_not_fused() {
        let g = softmax_block();
        assert_eq!(
            regions_of(&g, &[]),
            vec![names(&["max", "sub", "exp", "sum", "div"])]
        );
        // ReduceMean as global pooling feeding a Relu: no statistics combined with x again.
        let g = pool_block();
        assert!(regions_of(&g, &[]).is_empty(), "{:?}", regions_of(&g, &[]));
    }

    #[test]
    fn attention_is_one_region() {
        let g = attention_block();
        assert_eq!(
            regions_of(&g, &[]),
            vec![names(&["qk", "scale", "mask", "softmax", "av"])]
        );
        // The softmax in float32: the region stops before it.
        assert_eq!(
            regions_of(&g, &["softmax"]),
            vec![names(&["qk", "scale", "mask"])]
        );
    }

    /// The regions of `g` with the named layers float32 and the rest float16: (node names,
    /// precision, upcast attention).
    fn regions_with_kind(g: &Graph, fp32: &[&str]) -> Vec<(Vec<String>, Precision, bool)> {
        let a = FusionAnalysis::new(g, &BTreeMap::new());
        let layers: Vec<Precision> = g
            .nodes
            .iter()
            .map(|n| {
                if fp32.contains(&n.name.as_str()) {
                    F
                } else {
                    H
                }
            })
            .collect();
        a.regions(&layers, &vec![false; g.nodes.len()], 0)
            .into_iter()
            .map(|r| {
                let names = r.nodes.iter().map(|&i| g.nodes[i].name.clone()).collect();
                (names, r.precision, r.upcast_attention)
            })
            .collect()
    }

    #[test]
    fn a_float32_attention_between_float16_projections_is_an_upcast_float16_region() {
        let g = projected_attention_block();
        assert_eq!(
            regions_with_kind(&g, &ATTENTION),
            vec![(names(&ATTENTION), H, true)]
        );
        // All float16: the plain attention region.
        assert_eq!(
            regions_with_kind(&g, &[]),
            vec![(names(&ATTENTION), H, false)]
        );
        // The output read in float32, or Q, K or V not float16: no Cast down after it or no
        // Cast up in front, so not TensorRT 11.3's pattern.
        for extra in ["o_proj", "q_proj", "k_proj", "v_proj"] {
            let mut fp32 = ATTENTION.to_vec();
            fp32.push(extra);
            assert_eq!(regions_with_kind(&g, &fp32), vec![], "{extra} in float32");
        }
        // A float16 softmax splits the attention: no upcast region.
        let fp32: Vec<&str> = ATTENTION
            .iter()
            .copied()
            .filter(|&n| n != "softmax")
            .collect();
        assert!(
            regions_with_kind(&g, &fp32).iter().all(|r| !r.2),
            "{:?}",
            regions_with_kind(&g, &fp32)
        );
    }

    #[test]
    fn regions_stay_convex() {
        // relu → conv → add and relu → add: add may not join relu's group around the conv.
        let g = diamond();
        assert_eq!(
            regions_of(&g, &[]),
            vec![names(&["relu", "neg"]), names(&["add", "relu2"])]
        );
    }

    #[test]
    fn unknown_shapes_and_mixed_types_leave_nodes_unfused_with_a_note() {
        let g = unknown_shape_chain();
        let a = FusionAnalysis::new(&g, &BTreeMap::new());
        assert!(regions_of(&g, &[]).is_empty());
        assert!(
            a.notes
                .iter()
                .any(|n| n.contains("'relu'") && n.contains("rank of 'x' is unknown")),
            "{:?}",
            a.notes
        );
        let g = mixed_types_chain();
        let a = FusionAnalysis::new(&g, &BTreeMap::new());
        assert!(regions_of(&g, &[]).is_empty());
        assert!(
            a.notes
                .iter()
                .any(|n| n.contains("'add'") && n.contains("mixes element types")),
            "{:?}",
            a.notes
        );
    }

    /// A convolution's output height computed from a symbolic input height is unknown to
    /// shape inference; the shapes a run uses (TensorRT's optimization profile) make it known.
    #[test]
    fn the_shapes_of_the_run_make_dimensions_computed_from_symbols_known() {
        let mut g = conv_block();
        g.inputs[0].shape = Some(vec![
            Dim::Fixed(1),
            Dim::Fixed(2),
            Dim::Param("h".into()),
            Dim::Param("w".into()),
        ]);
        let layers = vec![H; g.nodes.len()];
        let declared = FusionAnalysis::new(&g, &BTreeMap::new());
        assert!(declared
            .regions(&layers, &vec![false; g.nodes.len()], 0)
            .is_empty());
        assert!(
            declared
                .notes
                .iter()
                .any(|n| n.contains("'conv1'") && n.contains("nothing is known about")),
            "{:?}",
            declared.notes
        );
        let shapes: BTreeMap<String, Vec<usize>> = [("x".to_string(), vec![1, 2, 3, 3])].into();
        let run = FusionAnalysis::new(&g, &shapes);
        assert!(run.notes.is_empty(), "{:?}", run.notes);
        assert_eq!(
            run.regions(&layers, &vec![false; g.nodes.len()], 0).len(),
            regions_of(&conv_block(), &[]).len()
        );
    }

    /// Conv → Sigmoid → Mul(conv, sigmoid): YOLOv8's SiLU is the convolution's epilogue, though
    /// the convolution's output is read twice (both readers are in the region).
    #[test]
    fn a_decomposed_silu_after_a_convolution_is_its_epilogue() {
        let g = graph(
            vec![
                node("conv", "Conv", &["x", "w1"], &["c"]),
                node("sig", "Sigmoid", &["c"], &["sg"]),
                node("silu", "Mul", &["c", "sg"], &["mo"]),
                node("conv2", "Conv", &["mo", "w2"], &["c2"]),
                node("sig2", "Sigmoid", &["c2"], &["sg2"]),
                node("silu2", "Mul", &["c2", "sg2"], &["y"]),
                node("tap", "Relu", &["c2"], &["t"]),
            ],
            vec![vi("x", &[1, 2, 3, 3])],
            vec![vi("y", &[1, 2, 3, 3]), vi("t", &[1, 2, 3, 3])],
            bn_inits(),
        );
        // The second convolution's output is also read by a node outside the activation (the
        // kernel would have to write it): its SiLU is a pointwise region of its own.
        assert_eq!(
            regions_of(&g, &[]),
            vec![names(&["conv", "sig", "silu"]), names(&["sig2", "silu2"])]
        );
    }
}
