//! Reduced-precision emulation: how a layer runs under a [`PrecisionPlan`] (docs/numerics.md).
//!
//! A float16/bfloat16 layer sees its float inputs and weights rounded to its type, computes in
//! f32 (the accumulator; `--accumulate f16` switches matmul/conv to an f16 running sum) and
//! rounds its float outputs to its type. For + − × ÷ √ this is bit-identical to native
//! arithmetic in the type, since f32 carries more than twice the bits of f16/bf16. An
//! int8/fp8 layer quantizes its activation operands per tensor (calibrated scale) and its
//! weights per output channel, and computes on the dequantized values. Data-movement layers
//! run untouched: they carry whatever precision their input has.
//!
//! Weights are converted once, when the plan is prepared, not on every run.

use super::fusion::{FusionAnalysis, Topology};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::ops::{computes_in_integers, is_data_movement};
use crate::precision::fusion::FusionModel;
use crate::precision::plan::ResolvedRegion;
use crate::precision::quant::{
    channel_scales, fake_quant, fake_quant_channels, is_quantized_operand, scale_from_amax,
    weight_channel_axis,
};
use crate::precision::{
    clamp_finite_to_f16, input_follows_layer_precision, plan::PrecisionPlan, round_slice,
    Accumulator, Precision,
};
use crate::tensor::{DType, Tensor};
use std::collections::BTreeMap;

/// What happens to one input of a layer before its kernel runs.
#[derive(Clone, Debug)]
pub(crate) enum InputPrep {
    /// Passed as is.
    Keep,
    /// An f32 activation rounded to a float type.
    Round(Precision),
    /// An f32 activation quantized per tensor with this scale, then dequantized.
    Quantize { scale: f32, precision: Precision },
    /// A weight converted in advance (shared: plans composed from other plans reuse it).
    /// An f32 weight rounded to float16/bfloat16 is kept in that 16-bit type (half the
    /// memory) and widened back to f32, exactly, only for the kernel call
    /// ([`prepare_input`]). With it, what kernels derive from it once (their packed weights;
    /// shared as the weight is).
    Converted(
        std::sync::Arc<Tensor>,
        std::sync::Arc<crate::ops::prepacked::Prepacked>,
    ),
    /// A constant float32 weight the kernel rounds to this type as it reads it (its op
    /// rounds weights itself, `OpDef::rounds_weight`): the interpreter hands it over as
    /// stored, so the plan keeps no rounded copy (an LLM's weights once, not twice). Where
    /// no kernel does, [`prepare_input`] makes the rounded copy.
    RoundedByKernel(crate::numeric::Rounding),
}

impl InputPrep {
    /// A weight converted in advance.
    pub(crate) fn converted(t: Tensor) -> InputPrep {
        InputPrep::Converted(std::sync::Arc::new(t), Default::default())
    }
}

/// One layer's treatment.
#[derive(Clone, Debug)]
pub(crate) struct LayerPrep {
    /// None for data-movement layers, which run untouched.
    pub precision: Option<Precision>,
    pub inputs: Vec<InputPrep>,
    /// For a node with subgraphs: the plan of each (in [`Node::subgraphs`] order), every
    /// layer in the node's precision (float32 when that is int8/fp8: no subgraph op has a
    /// quantized kernel of its own) unless the plan sets it by path.
    ///
    /// [`Node::subgraphs`]: crate::graph::Node::subgraphs
    pub subplans: Vec<PreparedPlan>,
    /// The layer's place in a fusion region, if it is in one.
    pub fusion: Option<RegionPrep>,
    /// The treatment of each input outside any region (`inputs` is this with the inputs
    /// produced inside the layer's region kept as computed): what composing plans under a
    /// fusion model starts from when the regions change.
    pub outside: Vec<InputPrep>,
    /// The quantized kernel that replaces the op's own (`--fusion tensorrt`: a Q/DQ model's
    /// quantized Conv/MatMul/Gemm, or an int8/fp8 layer of the plan; `exec/qdq.rs`).
    pub integer: Option<std::sync::Arc<super::qdq::IntegerKernel>>,
    /// The weights TensorRT's conversion clamped to float16's range for this layer (`--fusion
    /// tensorrt`): (weight path, layer path, values clamped). What [`PreparedPlan::weight_events`] warns about.
    pub clamped: Vec<(String, String, usize)>,
}

/// A layer of a fusion region (docs/numerics.md, "Fusion regions"): the region runs as one
/// kernel, so the values its layers pass each other stay in f32 and only the values that
/// leave it are rounded to its precision.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RegionPrep {
    /// The region's index in [`PreparedPlan::regions`].
    pub region: usize,
    /// The region's first node (graph order): identifies it across plans for the cache.
    pub first: usize,
    pub precision: Precision,
    /// Per output: leaves the region (read by a node outside it or a graph output), so it is
    /// materialized in the region's precision.
    pub exits: Vec<bool>,
    /// Per output: leaves the region and is also read inside it, where the f32 value is used.
    pub shared: Vec<bool>,
    /// Per input: produced inside the region (read as computed, in f32).
    pub internal: Vec<bool>,
    /// The node's values are declared in this 16-bit type (a strongly typed float16 or
    /// bfloat16 model): its 16-bit inputs are widened to f32 for the kernel, the values it
    /// passes inside the region stay f32 tensors and those that leave are stored back in
    /// this type (rounded once, as the region's precision says).
    pub native: Option<DType>,
    /// Per input: an operand the region's float16 kernel reads in float16 although the plan
    /// keeps the layer float32 (an upcast attention region, [`ResolvedRegion::upcast_attention`]):
    /// every value entering the region, and the probabilities the second MatMul reads.
    pub float16_operands: Vec<bool>,
}

/// Options of a plan that are not per layer.
#[derive(Clone, Debug, Default)]
pub struct PlanOptions<'a> {
    pub accumulate: Accumulator,
    /// Activation ranges (absolute max per tensor name) for int8/fp8 layers.
    pub amax: Option<&'a BTreeMap<String, f32>>,
    /// The shapes of the graph inputs the plan runs on (TensorRT's optimization profile):
    /// the fusion rules read the shapes inference gives from them. None: the declared shapes,
    /// where a dimension computed from a symbolic one (a convolution's output height) is
    /// unknown and leaves its nodes unfused.
    pub input_shapes: Option<&'a BTreeMap<String, Vec<usize>>>,
}

/// A precision plan made ready to run on one graph.
#[derive(Clone, Debug)]
pub struct PreparedPlan {
    pub(crate) layers: Vec<LayerPrep>,
    pub(crate) accumulate: Accumulator,
    pub plan: PrecisionPlan,
    /// The fusion regions of the graph this plan runs with: the plan's own (`plan.regions`,
    /// the first `explicit`), then those its fusion model derived for its precisions.
    regions: Vec<ResolvedRegion>,
    explicit: usize,
    /// The fusion model's reading of the graph (None without one), kept to derive the regions
    /// of composed plans.
    analysis: Option<std::sync::Arc<FusionAnalysis>>,
    /// The epilogues this plan's runs made (empty in a clone; shared by the plans composed
    /// from it, see `origins`).
    pub(super) epilogues: super::epilogue::Cache,
    /// Per layer: which prepared plan made its `LayerPrep` (a number unique in the process).
    /// Layers with one origin are prepared alike, so composed plans key shared epilogues by
    /// the origins of a chain's layers.
    pub(super) origins: Vec<u64>,
    /// Which values a run may quantize as their producer writes them (derived from the
    /// layers on a run's first use; empty in a clone, whose layers may change).
    pub(super) quantized_on_write: QuantizedOnWrite,
}

/// Per value slot of the interpreter: the per-tensor quantization (scale, precision) that
/// every layer reading it applies to it, where they all apply the same one and nothing else
/// reads it (see `Interpreter::quantized_on_write`).
#[derive(Default)]
pub(super) struct QuantizedOnWrite(pub std::sync::OnceLock<Vec<Option<(f32, Precision)>>>);

impl Clone for QuantizedOnWrite {
    fn clone(&self) -> Self {
        QuantizedOnWrite::default()
    }
}

impl std::fmt::Debug for QuantizedOnWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QuantizedOnWrite")
    }
}

/// A number for each prepared plan (and each re-derivation of one's regions).
fn new_origin() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl PreparedPlan {
    /// Prepares `plan` for `graph`: converts weights, looks up activation scales. Fails when an
    /// int8/fp8 layer has an activation operand without a calibrated range.
    pub fn new(graph: &Graph, plan: &PrecisionPlan, opts: &PlanOptions) -> Result<PreparedPlan> {
        Self::new_in(&Scope::top(graph), plan, opts)
    }

    /// [`new`](Self::new) for the graph of `scope`: activation ranges are looked up by the
    /// value's path (`Loop_0/body/x`; a value read from an enclosing graph by its path there),
    /// and a weight of an enclosing graph is a weight.
    fn new_in(scope: &Scope, plan: &PrecisionPlan, opts: &PlanOptions) -> Result<PreparedPlan> {
        let graph = scope.graph;
        if plan.layers.len() != graph.nodes.len() {
            return Err(Error::Invalid(format!(
                "the precision plan has {} layers, the graph {}",
                plan.layers.len(),
                graph.nodes.len()
            )));
        }
        let explicit = plan.resolve_regions(graph)?;
        let n_explicit = explicit.len();
        let analysis = match plan.fusion {
            FusionModel::None => None,
            FusionModel::TensorRt => Some(std::sync::Arc::new(FusionAnalysis::new(
                graph,
                opts.input_shapes.unwrap_or(&BTreeMap::new()),
            ))),
        };
        let regions = with_derived(analysis.as_deref(), &plan.layers, explicit);
        let mut fusion = if regions.is_empty() {
            vec![None; graph.nodes.len()]
        } else {
            match &analysis {
                Some(a) => region_preps(&a.topo, &regions, &a.native),
                None => region_preps(&Topology::new(graph), &regions, &[]),
            }
        };
        let mut layers = Vec::with_capacity(graph.nodes.len());
        for (k, (node, &p)) in graph.nodes.iter().zip(&plan.layers).enumerate() {
            let fusion = fusion[k].take();
            // Integer ops of operator-style quantization run as written whatever the plan says
            // (ops::computes_in_integers): the export leaves them so too.
            let p = if computes_in_integers(node) {
                Precision::Float32
            } else {
                p
            };
            let body = if p.is_scaled() { Precision::Float32 } else { p };
            let subplans = node
                .subgraphs()
                .map(|(attr, g)| {
                    let sub = plan.subgraph_plan(node, attr, g, body);
                    // Nodes inside subgraphs are named by path.
                    let inner = scope.child(&node.name, attr, g);
                    PreparedPlan::new_in(&inner, &sub, opts)
                        .map_err(|e| e.in_subgraph(&node.name, attr))
                })
                .collect::<Result<Vec<_>>>()?;
            // Data movement and folded weight nodes run untouched (their weights are
            // converted where a layer reads them).
            let untouched = is_data_movement(node) || graph.is_folded(node);
            // A Q/DQ model's quantized layer runs as TensorRT's quantized kernel.
            let qdq_kernel = match &analysis {
                Some(a) if !untouched && !p.is_scaled() => a.qdq[k].clone(),
                _ => None,
            };
            if untouched || p == Precision::Float32 {
                layers.push(LayerPrep {
                    precision: (!untouched).then_some(p),
                    inputs: vec![InputPrep::Keep; node.inputs.len()],
                    subplans,
                    fusion,
                    outside: vec![InputPrep::Keep; node.inputs.len()],
                    integer: qdq_kernel,
                    clamped: Vec::new(),
                });
                continue;
            }
            let mut inputs = Vec::with_capacity(node.inputs.len());
            let mut outside = Vec::with_capacity(node.inputs.len());
            let mut clamped = Vec::new();
            for (idx, name) in node.inputs.iter().enumerate() {
                // Initializers and folded values (a Transpose or DequantizeLinear of an
                // initializer) are weights, converted here once.
                let (init, path) = scope.resolve(name);
                let prep = if name.is_empty() || !input_follows_layer_precision(node, idx) {
                    InputPrep::Keep
                } else if p.is_scaled() {
                    if !is_quantized_operand(node, idx) {
                        // Biases stay in f32, added after dequantization.
                        InputPrep::Keep
                    } else if let Some(w) = init.filter(|w| is_float_storage(w.dtype())) {
                        let axis =
                            weight_channel_axis(node, idx, w.rank()).ok_or_else(|| Error::Op {
                                node: node.name.clone(),
                                op: node.op_type.clone(),
                                msg: format!(
                                    "weight '{name}' of rank {} cannot be quantized per channel",
                                    w.rank()
                                ),
                            })?;
                        let q = through_f32(w, |v| {
                            let scales = channel_scales(v, w.shape(), axis, p);
                            fake_quant_channels(v, w.shape(), axis, &scales, p);
                        })
                        .expect("float weight");
                        InputPrep::converted(q)
                    } else if init.is_some() {
                        InputPrep::Keep
                    } else {
                        let amax = opts.amax.and_then(|m| m.get(&path)).ok_or_else(|| Error::Op {
                            node: node.name.clone(),
                            op: node.op_type.clone(),
                            msg: format!(
                                "runs in {p} but tensor '{path}' has no calibrated range (pass --calibration-cache, or let mixprec calibrate)"
                            ),
                        })?;
                        InputPrep::Quantize {
                            scale: scale_from_amax(*amax, p),
                            precision: p,
                        }
                    }
                } else if let Some(r) = init.and_then(|w| {
                    rounded_by_kernel(node, idx, w, p, saturates(w, p, scope.is_constant(name)))
                }) {
                    InputPrep::RoundedByKernel(r)
                } else if let Some(w) = init {
                    let saturate = saturates(w, p, scope.is_constant(name));
                    let mut n = 0;
                    let r = through_f32(w, |v| {
                        if saturate {
                            n = clamp_finite_to_f16(v);
                        }
                        round_slice(p, v)
                    });
                    if n > 0 {
                        clamped.push((path.clone(), format!("{}{}", scope.prefix, node.name), n));
                    }
                    match r {
                        Some(r) if !already_in(w.dtype(), p) => InputPrep::converted(narrow(r, p)),
                        _ => InputPrep::Keep,
                    }
                } else {
                    InputPrep::Round(p)
                };
                // Inside a fused kernel a value made by the region is read as computed.
                let internal = fusion.as_ref().is_some_and(|f| f.internal[idx]);
                inputs.push(if internal {
                    InputPrep::Keep
                } else {
                    prep.clone()
                });
                outside.push(prep);
            }
            // Under TensorRT's fusion model an int8/fp8 layer runs the quantized kernel its
            // exported Q/DQ model runs there: exact integer accumulation, then the rescale.
            let integer = if p.is_scaled() && plan.fusion == FusionModel::TensorRt {
                let operand = |i: usize| -> (Option<f32>, Option<&Tensor>) {
                    match outside.get(i) {
                        Some(InputPrep::Quantize { scale, .. }) => (Some(*scale), None),
                        Some(InputPrep::Converted(..)) => {
                            (None, node.inputs.get(i).and_then(|n| scope.resolve(n).0))
                        }
                        _ => (None, None),
                    }
                };
                super::qdq::IntegerKernel::for_plan_layer(node, p, [operand(0), operand(1)])
                    .map(std::sync::Arc::new)
            } else {
                qdq_kernel
            };
            layers.push(LayerPrep {
                precision: Some(p),
                inputs,
                subplans,
                fusion,
                outside,
                integer,
                clamped,
            });
        }
        let origins = vec![new_origin(); layers.len()];
        Ok(PreparedPlan {
            layers,
            accumulate: opts.accumulate,
            plan: plan.clone(),
            regions,
            explicit: n_explicit,
            analysis,
            epilogues: Default::default(),
            quantized_on_write: Default::default(),
            origins,
        })
    }

    /// The fusion regions this plan runs with in the main graph: the plan's own, then those
    /// its fusion model derived (`--fusion`). Regions inside subgraphs are not listed.
    pub fn regions(&self) -> &[ResolvedRegion] {
        &self.regions
    }

    /// The regions the fusion model derived for this plan's precisions.
    pub fn derived_regions(&self) -> &[ResolvedRegion] {
        &self.regions[self.explicit..]
    }

    /// Notes of the fusion model (nodes its rules could not apply to, and why): what `-v`
    /// shows, as events.
    pub fn fusion_events(&self) -> Vec<crate::event::Event> {
        let mut out: Vec<crate::event::Event> = self
            .analysis
            .iter()
            .flat_map(|a| a.notes.iter())
            .map(|n| crate::event::Event::Verbose(n.clone()))
            .collect();
        for (k, l) in self.layers.iter().enumerate() {
            if let (Some(q), Some(a)) = (&l.integer, &self.analysis) {
                out.push(crate::event::Event::Verbose(format!(
                    "fusion (tensorrt): '{}' ({}) runs as a quantized kernel: {}",
                    a.names[k],
                    a.ops[k],
                    q.describe()
                )));
            }
        }
        out
    }

    /// Warnings for the weights this plan's float16 layers read clamped to float16's range
    /// (as the export stores them and TensorRT's builder converts them; docs/numerics.md,
    /// "Weights beyond float16's range"), one per (layer, weight), subgraph layers included,
    /// in graph order.
    pub fn weight_events(&self) -> Vec<crate::event::Event> {
        let mut out = Vec::new();
        for l in &self.layers {
            for (name, layer, n) in &l.clamped {
                out.push(crate::event::Event::Warning(format!(
                    "weight '{name}' of float16 layer '{}' has {n} finite float32 value{} \
                     beyond float16's range: clamped to ±65504, as the export stores it and \
                     TensorRT converts weights (a Cast would make {} ±inf)",
                    layer,
                    if *n == 1 { "" } else { "s" },
                    if *n == 1 { "it" } else { "them" },
                )));
            }
            for sub in &l.subplans {
                out.extend(sub.weight_events());
            }
        }
        out
    }

    /// Derives the regions again for the current precisions (a composed plan under a fusion
    /// model) and updates every layer's region treatment.
    fn rederive_regions(&mut self) -> Result<()> {
        // Epilogues made under the old regions may no longer apply: the layers are prepared
        // anew.
        self.epilogues = Default::default();
        self.origins = vec![new_origin(); self.layers.len()];
        let Some(a) = self.analysis.clone() else {
            return Ok(());
        };
        let mut explicit: Vec<ResolvedRegion> = self.regions[..self.explicit].to_vec();
        for r in &mut explicit {
            let compute: Vec<usize> = r
                .nodes
                .iter()
                .copied()
                .filter(|&i| a.topo.compute[i])
                .collect();
            let p = compute
                .first()
                .map_or(Precision::Float32, |&i| self.plan.layers[i]);
            if compute.iter().any(|&i| self.plan.layers[i] != p) {
                return Err(Error::Invalid(format!(
                    "fusion region '{}': the composed plan gives its nodes different precisions",
                    r.name
                )));
            }
            r.precision = p;
        }
        self.regions = with_derived(Some(&a), &self.plan.layers, explicit);
        let preps = region_preps(&a.topo, &self.regions, &a.native);
        for (l, f) in self.layers.iter_mut().zip(preps) {
            l.inputs = l
                .outside
                .iter()
                .enumerate()
                .map(|(i, prep)| match &f {
                    Some(f) if f.internal[i] => InputPrep::Keep,
                    _ => prep.clone(),
                })
                .collect();
            l.fusion = f;
        }
        Ok(())
    }

    /// This plan with the layers `take` treated as in `other` (a plan for the same graph):
    /// composing prepared plans reuses their converted weights instead of converting again,
    /// which is what a precision search does for every candidate.
    pub fn with_layers_of(&self, other: &PreparedPlan, take: &[usize]) -> Result<PreparedPlan> {
        if other.layers.len() != self.layers.len() || other.accumulate != self.accumulate {
            return Err(Error::Invalid(
                "composed plans must be prepared for the same graph and accumulator".into(),
            ));
        }
        if other.plan.regions != self.plan.regions || other.plan.fusion != self.plan.fusion {
            return Err(Error::Invalid(
                "composed plans must have the same fusion regions and fusion model".into(),
            ));
        }
        let mut out = self.clone();
        out.epilogues = self.epilogues.share();
        for &i in take {
            let (Some(l), Some(&p)) = (other.layers.get(i), other.plan.layers.get(i)) else {
                return Err(Error::Invalid(format!("layer {i} is not in the plan")));
            };
            out.layers[i] = l.clone();
            out.plan.layers[i] = p;
            out.origins[i] = other.origins[i];
        }
        if out.analysis.is_some() {
            // Under a fusion model every plan has its own regions.
            out.rederive_regions()?;
            return Ok(out);
        }
        // A region whose layers now come from plans of different precisions is not one kernel.
        let mut seen: BTreeMap<usize, Precision> = BTreeMap::new();
        for f in out.layers.iter().filter_map(|l| l.fusion.as_ref()) {
            if *seen.entry(f.region).or_insert(f.precision) != f.precision {
                return Err(Error::Invalid(format!(
                    "fusion region '{}': the composed plan gives its nodes different precisions",
                    out.regions[f.region].name
                )));
            }
        }
        Ok(out)
    }

    /// The precision layer `i` computes in (None: data movement, carries its input's).
    pub fn layer_precision(&self, i: usize) -> Option<Precision> {
        self.layers.get(i).and_then(|l| l.precision)
    }
}

/// The fusion regions `plan` runs with in the main graph of `graph` (its own, then those its
/// fusion model derives for its precisions) and the fusion model's notes (`-v`), without
/// preparing the plan (no weight is converted).
pub fn plan_regions(
    graph: &Graph,
    plan: &PrecisionPlan,
    input_shapes: &BTreeMap<String, Vec<usize>>,
) -> Result<(Vec<ResolvedRegion>, Vec<crate::event::Event>)> {
    let explicit = plan.resolve_regions(graph)?;
    let analysis = match plan.fusion {
        FusionModel::None => None,
        FusionModel::TensorRt => Some(FusionAnalysis::new(graph, input_shapes)),
    };
    let events = analysis
        .iter()
        .flat_map(|a| a.notes.iter())
        .map(|n| crate::event::Event::Verbose(n.clone()))
        .collect();
    Ok((
        with_derived(analysis.as_ref(), &plan.layers, explicit),
        events,
    ))
}

/// The plan's own regions followed by those `analysis` derives for `layers` (none without a
/// fusion model); derived regions leave out the nodes of the plan's own.
fn with_derived(
    analysis: Option<&FusionAnalysis>,
    layers: &[Precision],
    explicit: Vec<ResolvedRegion>,
) -> Vec<ResolvedRegion> {
    let Some(a) = analysis else {
        return explicit;
    };
    let mut taken = vec![false; layers.len()];
    for r in &explicit {
        for &i in &r.nodes {
            taken[i] = true;
        }
    }
    let derived = a.regions(layers, &taken, explicit.len());
    let mut all = explicit;
    all.extend(derived);
    all
}

/// The fusion-region treatment of every node (None outside regions) for resolved `regions`;
/// `native` gives the declared 16-bit type of natively typed nodes (empty: none is).
fn region_preps(
    topo: &Topology,
    regions: &[ResolvedRegion],
    native: &[Option<Precision>],
) -> Vec<Option<RegionPrep>> {
    let n = topo.deps.len();
    let mut out: Vec<Option<RegionPrep>> = vec![None; n];
    let mut region_of: Vec<Option<usize>> = vec![None; n];
    for (k, r) in regions.iter().enumerate() {
        for &i in &r.nodes {
            region_of[i] = Some(k);
        }
    }
    for (k, r) in regions.iter().enumerate() {
        for &i in &r.nodes {
            let mut exits = Vec::new();
            let mut shared = Vec::new();
            for (o, rs) in topo.readers[i].iter().enumerate() {
                let inside = rs.iter().any(|&j| region_of[j] == Some(k));
                let exit = topo.graph_output[i][o] || rs.iter().any(|&j| region_of[j] != Some(k));
                exits.push(exit);
                shared.push(exit && inside);
            }
            let internal: Vec<bool> = topo.producer_of_input[i]
                .iter()
                .map(|u| u.is_some_and(|u| region_of[u] == Some(k)))
                .collect();
            // TensorRT 11.3's float16 attention with FP32 accumulation reads Q, K, V (and the
            // scale and mask) in float16, and feeds the probabilities to ·V as float16 (its
            // last node); the scores stay in the f32 accumulator.
            let last = r.nodes.last() == Some(&i);
            let float16_operands = internal
                .iter()
                .map(|&inside| r.upcast_attention && (!inside || last))
                .collect();
            out[i] = Some(RegionPrep {
                region: k,
                first: r.nodes[0],
                precision: r.precision,
                exits,
                shared,
                internal,
                native: native
                    .get(i)
                    .copied()
                    .flatten()
                    .and_then(Precision::dtype_16bit),
                float16_operands,
            });
        }
    }
    out
}

/// Finishes the outputs of a fused layer: the outputs that leave the region are rounded to
/// its precision (float types; int8/fp8 outputs stay dequantized f32, as for any quantized
/// layer), the others stay as computed. Returns, per output, the precision the stored value is
/// rounded to (`carried`: what a data-movement layer's inputs were rounded to) and, for an
/// output that leaves the region and is also read inside it, the f32 value inside readers use.
pub(crate) fn finish_fused_outputs(
    f: &RegionPrep,
    kept: &[usize],
    compute: bool,
    carried: Option<Precision>,
    outs: &mut [Tensor],
) -> (Vec<Option<Precision>>, Vec<Option<Tensor>>) {
    let p = f.precision;
    let rounds = p != Precision::Float32 && !p.is_scaled();
    let mut marks = Vec::with_capacity(outs.len());
    let mut inner = Vec::with_capacity(outs.len());
    for (i, t) in outs.iter_mut().enumerate() {
        if kept.contains(&i) {
            // Its own type (a float32 recurrent state), inside the region and out of it.
            inner.push(None);
            marks.push(None);
            continue;
        }
        let exit = f.exits.get(i).copied().unwrap_or(false);
        inner
            .push((exit && rounds && f.shared.get(i).copied().unwrap_or(false)).then(|| t.clone()));
        let unrounded = if compute { None } else { carried };
        if exit && rounds {
            match f.native {
                // Stored back in the declared type: the conversion rounds it once.
                Some(d) if t.dtype() == DType::F32 => {
                    *t = crate::ops::cast::cast_tensor(t, d);
                }
                _ => round_outputs(p, std::slice::from_mut(t)),
            }
            marks.push(Some(p));
        } else {
            marks.push(unrounded);
        }
    }
    (marks, inner)
}

/// A cache signature term for a layer's fusion treatment (0 outside regions).
pub(crate) fn fusion_signature(layer: Option<&LayerPrep>) -> u64 {
    use super::cache::mix;
    let Some(f) = layer.and_then(|l| l.fusion.as_ref()) else {
        return 0;
    };
    let mut h = mix(
        mix(0x0066_7573_6564, f.first as u64),
        f.precision as u64 + 1,
    );
    for flags in [&f.exits, &f.shared, &f.internal, &f.float16_operands] {
        h = mix(h, flags.len() as u64);
        for &b in flags.iter() {
            h = mix(h, b as u64);
        }
    }
    h
}

/// A fusion region runs as one kernel, so the cache serves it whole or not at all: a layer of
/// a region counts as a hit only when every layer of its region does.
pub(crate) fn whole_regions(plan: Option<&PreparedPlan>, hit: &mut [bool]) {
    let Some(plan) = plan else { return };
    let mut missed = std::collections::BTreeSet::new();
    for (l, &h) in plan.layers.iter().zip(hit.iter()) {
        if let (Some(f), false) = (&l.fusion, h) {
            missed.insert(f.region);
        }
    }
    for (l, h) in plan.layers.iter().zip(hit.iter_mut()) {
        if l.fusion
            .as_ref()
            .is_some_and(|f| missed.contains(&f.region))
        {
            *h = false;
        }
    }
}

/// The activation tensors whose calibrated ranges a plan needs: non-initializer operands of
/// its int8/fp8 layers, in graph order, each once; inside subgraphs by path
/// (`Loop_0/body/x`, see [`crate::exec::Interpreter::run_observed`]).
pub fn required_ranges(graph: &Graph, plan: &PrecisionPlan) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    ranges_in(&Scope::top(graph), plan, &mut out);
    out
}

fn ranges_in(scope: &Scope, plan: &PrecisionPlan, out: &mut Vec<String>) {
    for (node, &p) in scope.graph.nodes.iter().zip(&plan.layers) {
        for (attr, g) in node.subgraphs() {
            let body = if p.is_scaled() { Precision::Float32 } else { p };
            let sub = plan.subgraph_plan(node, attr, g, body);
            ranges_in(&scope.child(&node.name, attr, g), &sub, out);
        }
        if !p.is_scaled() || is_data_movement(node) || scope.graph.is_folded(node) {
            continue;
        }
        for (idx, name) in node.inputs.iter().enumerate() {
            if name.is_empty() || !is_quantized_operand(node, idx) {
                continue;
            }
            if let (None, path) = scope.resolve(name) {
                if !out.contains(&path) {
                    out.push(path);
                }
            }
        }
    }
}

/// A graph and the graphs enclosing it, to resolve the names its nodes read.
struct Scope<'s> {
    graph: &'s Graph,
    /// `node/attr/` segments from the main graph down to this one ("" for the main graph).
    prefix: String,
    parent: Option<&'s Scope<'s>>,
}

impl<'s> Scope<'s> {
    fn top(graph: &'s Graph) -> Scope<'s> {
        Scope {
            graph,
            prefix: String::new(),
            parent: None,
        }
    }

    fn child(&'s self, node: &str, attr: &str, graph: &'s Graph) -> Scope<'s> {
        Scope {
            graph,
            prefix: format!("{}{node}/{attr}/", self.prefix),
            parent: Some(self),
        }
    }

    /// What `name` is where it is read: an initializer (of this graph or an enclosing one),
    /// and the value's path (its name in the graph that defines it, prefixed by that graph's
    /// path).
    fn resolve(&self, name: &str) -> (Option<&'s Tensor>, String) {
        let g = self.graph;
        if let Some(t) = g.weight(name) {
            return (Some(t), format!("{}{name}", self.prefix));
        }
        match self.parent {
            Some(p) if !g.values().defines(name) => p.resolve(name),
            _ => (None, format!("{}{name}", self.prefix)),
        }
    }

    /// Whether `name` is, where it is read, a constant initializer of the graph defining it
    /// ([`Graph::constant_initializer`]): a weight the export stores converted, not one
    /// converted at run time.
    fn is_constant(&self, name: &str) -> bool {
        let g = self.graph;
        if g.weight(name).is_some() {
            return g.constant_initializer(name).is_some();
        }
        match self.parent {
            Some(p) if !g.values().defines(name) => p.is_constant(name),
            _ => false,
        }
    }
}

/// An f32 operand of an upcast attention region as its float16 kernel reads it
/// ([`RegionPrep::float16_operands`]): rounded to float16, a weight first clamped to ±65504
/// as TensorRT converts weights (docs/numerics.md, "Weights beyond float16's range"). None
/// for values of other types (a Reshape's shape) and for values already float16.
pub(crate) fn float16_operand(t: &Tensor, weight: bool) -> Option<Tensor> {
    let v = t.as_f32()?;
    if v.iter()
        .all(|&x| half::f16::from_f32(x).to_f32() == x || x.is_nan())
    {
        return None;
    }
    let mut v = v.to_vec();
    if weight {
        clamp_finite_to_f16(&mut v);
    }
    round_slice(Precision::Float16, &mut v);
    Some(Tensor::from_f32(t.shape().to_vec(), v))
}

/// Applies an activation treatment; None means "use the original tensor" (also for
/// `Converted`, which the caller takes from the plan by reference, unless it is stored
/// narrower than the original: then the widened copy, dropped after the kernel call).
pub(crate) fn prepare_input(prep: &InputPrep, t: &Tensor) -> Option<Tensor> {
    match prep {
        InputPrep::Converted(c, _) if c.dtype() != t.dtype() => {
            Some(crate::ops::cast::cast_tensor(c, t.dtype()))
        }
        InputPrep::Keep | InputPrep::Converted(..) => None,
        InputPrep::RoundedByKernel(r) => through_f32(t, |v| r.round_slice(v)),
        InputPrep::Round(p) if already_in(t.dtype(), *p) => None,
        InputPrep::Round(p) => through_f32(t, |v| round_slice(*p, v)),
        InputPrep::Quantize { scale, precision } => match t.as_f32() {
            Some(v) => Some(Tensor::from_f32(
                t.shape().to_vec(),
                crate::precision::quant::fake_quantized(v, *scale, *precision),
            )),
            None => through_f32(t, |v| fake_quant(v, *scale, *precision)),
        },
    }
}

/// The rounding a kernel applies itself to weight `w` at input `idx` of a `p` layer: for a
/// float32 weight of an op that rounds its weights ([`crate::ops::OpDef::rounds_weight`]),
/// unless TensorRT's conversion would also clamp it (then it is converted in advance).
fn rounded_by_kernel(
    node: &crate::graph::Node,
    idx: usize,
    w: &Tensor,
    p: Precision,
    saturate: bool,
) -> Option<crate::numeric::Rounding> {
    let r = p.float_rounding()?;
    let v = w.as_f32()?;
    if !crate::ops::def_of(node).is_some_and(|d| d.rounds_weight(idx)) {
        return None;
    }
    let clamps = saturate && v.iter().any(|x| x.is_finite() && x.abs() >= 65520.0);
    (!clamps).then_some(r)
}

/// Whether weight `w` of a `p` layer is converted as the export stores it and TensorRT's
/// builder converts it — finite values beyond float16's range clamped to ±65504 before the
/// rounding — rather than as a Cast, which makes them ±inf: a float32 constant initializer
/// (`constant`, [`Graph::constant_initializer`]) read by a float16 layer, under every fusion
/// model (the exported file is what any engine runs). A weight the export converts at run
/// time (folded, or an initializer a graph input overrides) goes through its Cast; bfloat16
/// keeps the Cast's rule. docs/numerics.md, "Weights beyond float16's range".
fn saturates(w: &Tensor, p: Precision, constant: bool) -> bool {
    constant && p == Precision::Float16 && w.dtype() == DType::F32
}

/// Weights with fewer elements keep their rounded copy in f32: widening on every call costs
/// more than the memory saved (it doubled the emulated float16 latency of the small CNN of
/// benches/latency.rs when every weight was narrowed).
const NARROW_MIN_ELEMENTS: usize = 1 << 20;

/// An f32 weight already rounded to float16/bfloat16, stored in that type when it has at least
/// [`NARROW_MIN_ELEMENTS`] elements: every value is exactly representable, so widening it back
/// gives the same bits. Weights holding a NaN stay in f32 (its payload would not survive the
/// round trip).
fn narrow(r: Tensor, p: Precision) -> Tensor {
    if r.len() < NARROW_MIN_ELEMENTS {
        return r;
    }
    let Some(to) = p.dtype_16bit() else {
        return r;
    };
    match r.as_f32() {
        Some(v) if !v.iter().any(|x| x.is_nan()) => crate::ops::cast::cast_tensor(&r, to),
        _ => r,
    }
}

/// Float types a model stores tensors in, which a plan rounds or quantizes.
fn is_float_storage(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// A tensor stored in `d` already holds values of precision `p` (a float16 model under a
/// float16 plan): rounding it again changes nothing.
fn already_in(d: DType, p: Precision) -> bool {
    matches!(
        (d, p),
        (DType::F16, Precision::Float16) | (DType::BF16, Precision::BFloat16)
    )
}

/// Applies `f` to a float tensor's values in f32 and stores the result back in the tensor's
/// own type (f32 as is; float16/bfloat16 rounded to nearest even, as a Cast back would). A
/// float16 model under an int8 or bfloat16 plan is quantized or rounded this way, exactly as
/// its exported Q/DQ or Cast pairs compute. None for other dtypes.
pub(crate) fn through_f32(t: &Tensor, f: impl FnOnce(&mut [f32])) -> Option<Tensor> {
    match t.dtype() {
        DType::F32 => {
            let mut c = t.clone();
            f(c.as_f32_mut()?);
            Some(c)
        }
        DType::F16 | DType::BF16 => {
            let mut v = t.to_f32_vec()?;
            f(&mut v);
            let f32t = Tensor::from_f32(t.shape().to_vec(), v);
            Some(crate::ops::cast::cast_tensor(&f32t, t.dtype()))
        }
        _ => None,
    }
}

/// The type a layer of precision `p` keeps a multi-step kernel's state in (a recurrent layer's
/// hidden and cell state are rounded to it after every step): float16/bfloat16 for those
/// layers, f32 for float32, int8/fp8 (no recurrent op has a quantized kernel) and no plan.
pub(crate) fn state_type(p: Option<Precision>) -> crate::numeric::StateType {
    match p {
        Some(Precision::Float16) => crate::numeric::StateType::F16,
        Some(Precision::BFloat16) => crate::numeric::StateType::BF16,
        _ => crate::numeric::StateType::F32,
    }
}

/// Rounds the outputs of a layer in `p`, but those its op keeps in their own type (`kept`,
/// the op's `OpDef::keeps_output_types`: a recurrent state ONNX Runtime's 16-bit kernels keep
/// in float32). Returns, per output, the precision its value is rounded to.
pub(crate) fn round_layer_outputs(
    p: Precision,
    kept: &[usize],
    outs: &mut [Tensor],
    kernel_rounded: bool,
) -> Vec<Option<Precision>> {
    let m = (!p.is_scaled() && p != Precision::Float32).then_some(p);
    (outs.iter_mut().enumerate())
        .map(|(i, t)| {
            if kept.contains(&i) {
                return None;
            }
            if !kernel_rounded {
                round_outputs(p, std::slice::from_mut(t));
            }
            m
        })
        .collect()
}

/// Rounds a float layer's f32 outputs to its precision (quantized layers output f32).
pub(crate) fn round_outputs(p: Precision, outs: &mut [Tensor]) {
    if p == Precision::Float32 || p.is_scaled() {
        return;
    }
    for t in outs {
        if let Some(v) = t.as_f32_mut() {
            round_slice(p, v);
        } else if matches!(t.dtype(), DType::F16 | DType::BF16) && !already_in(t.dtype(), p) {
            if let Some(r) = through_f32(t, |v| round_slice(p, v)) {
                *t = r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{Feeds, Interpreter, RunOptions};
    use crate::graph::testing::{node, vi};
    use crate::graph::{Node, ValueInfo};
    use half::{bf16, f16};
    use std::collections::BTreeMap;

    fn graph(
        nodes: Vec<Node>,
        inputs: Vec<ValueInfo>,
        out: ValueInfo,
        inits: Vec<(&str, Tensor)>,
    ) -> Graph {
        crate::graph::testing::graph(nodes, inputs, vec![out], inits)
    }

    fn run(g: &Graph, plan: Vec<Precision>, opts: &PlanOptions, feeds: Feeds) -> Result<Vec<f32>> {
        let plan = PreparedPlan::new(g, &PrecisionPlan::from_layers(plan), opts)?;
        let r = Interpreter::new(g)?.run_plan(&feeds, &RunOptions::default(), &plan)?;
        Ok(r.outputs[0].1.as_f32().unwrap().to_vec())
    }

    /// Pseudo-random values spread over many binades (deterministic).
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut rng = crate::data::loader::Mt19937::new(seed);
        (0..n)
            .map(|_| {
                let m = rng.random_sample() * 2.0 - 1.0;
                let e = (rng.random_sample() * 16.0 - 8.0).floor();
                (m * 2f64.powf(e)) as f32
            })
            .collect()
    }

    #[test]
    fn float16_and_bfloat16_arithmetic_is_bit_exact() {
        // Reference: round(a op b) with a, b already in the type, computed exactly in f64.
        let n = 4096;
        let (a, b) = (values(n, 1), values(n, 2));
        for (op, f) in [
            ("Add", (|x, y| x + y) as fn(f64, f64) -> f64),
            ("Sub", |x, y| x - y),
            ("Mul", |x, y| x * y),
            ("Div", |x, y| x / y),
        ] {
            let g = graph(
                vec![node("op", op, &["a", "b"], &["y"])],
                vec![vi("a", &[n]), vi("b", &[n])],
                vi("y", &[n]),
                vec![],
            );
            let mut feeds = Feeds::new();
            feeds.insert("a".into(), Tensor::from_f32(vec![n], a.clone()));
            feeds.insert("b".into(), Tensor::from_f32(vec![n], b.clone()));
            let got16 = run(
                &g,
                vec![Precision::Float16],
                &PlanOptions::default(),
                feeds.clone(),
            )
            .unwrap();
            let gotbf = run(
                &g,
                vec![Precision::BFloat16],
                &PlanOptions::default(),
                feeds,
            )
            .unwrap();
            for i in 0..n {
                let (x, y) = (f16::from_f32(a[i]).to_f64(), f16::from_f32(b[i]).to_f64());
                let want = f16::from_f64(f(x, y)).to_f32();
                assert!(
                    want.to_bits() == got16[i].to_bits() || (want.is_nan() && got16[i].is_nan()),
                    "{op} f16 {x} {y}: {want} vs {}",
                    got16[i]
                );
                let (x, y) = (bf16::from_f32(a[i]).to_f64(), bf16::from_f32(b[i]).to_f64());
                let want = bf16::from_f64(f(x, y)).to_f32();
                assert!(
                    want.to_bits() == gotbf[i].to_bits() || (want.is_nan() && gotbf[i].is_nan()),
                    "{op} bf16 {x} {y}: {want} vs {}",
                    gotbf[i]
                );
            }
        }
    }

    /// Kernels that round their own outputs as they write them (map, binary, Sigmoid, Conv,
    /// BatchNormalization: `OpCtx::rounder`) give the bits of the plain rule — every input
    /// and weight rounded, the op in f32, every output rounded — which the reference here
    /// applies node by node with kernels that do not round. Tensors of 147 456 values take the
    /// kernels' parallel paths.
    #[test]
    fn kernels_that_round_as_they_write_equal_a_rounding_pass() {
        use crate::graph::Attribute;
        // 16 channels: the convolution puts them across the vector lanes (and rounds as it
        // moves its blocks into planes).
        let (c, hw) = (16usize, 96usize);
        let shape = [1, c, hw, hw];
        let n = c * hw * hw;
        let with = |mut nd: Node, attrs: &[(&str, Attribute)]| {
            for (k, v) in attrs {
                nd.attrs.insert(k.to_string(), v.clone());
            }
            nd
        };
        let pads = ("pads", Attribute::Ints(vec![1, 1, 1, 1]));
        let nodes = vec![
            with(
                node("conv", "Conv", &["x", "w", "b"], &["c1"]),
                std::slice::from_ref(&pads),
            ),
            with(
                node("dw", "Conv", &["c1", "wd"], &["c2"]),
                &[pads, ("group", Attribute::Int(c as i64))],
            ),
            node(
                "bn",
                "BatchNormalization",
                &["c2", "s", "bb", "m", "v"],
                &["c3"],
            ),
            with(
                node("clip", "Clip", &["c3"], &["c4"]),
                &[
                    ("min", Attribute::Float(-3.0)),
                    ("max", Attribute::Float(3.0)),
                ],
            ),
            node("sig", "Sigmoid", &["c4"], &["c5"]),
            node("mul", "Mul", &["c4", "c5"], &["c6"]),
            node("add", "Add", &["c6", "x"], &["c7"]),
            node("tanh", "Tanh", &["c7"], &["y"]),
        ];
        let per_c = |seed: u32, lo: f32| -> Tensor {
            let v = values(c, seed)
                .iter()
                .map(|x| lo + x.abs().min(4.0))
                .collect();
            Tensor::from_f32(vec![c], v)
        };
        let inits = vec![
            (
                "w",
                Tensor::from_f32(vec![c, c, 3, 3], values(c * c * 9, 3)),
            ),
            ("b", per_c(4, -1.0)),
            ("wd", Tensor::from_f32(vec![c, 1, 3, 3], values(c * 9, 5))),
            ("s", per_c(6, 0.5)),
            ("bb", per_c(7, -1.0)),
            ("m", per_c(8, -0.5)),
            ("v", per_c(9, 0.1)),
        ];
        let mut g = graph(nodes, vec![vi("x", &shape)], vi("y", &shape), inits);
        // Clip's bounds as attributes (opset 6).
        g.opsets.insert(String::new(), 10);
        let x = Tensor::from_f32(shape.to_vec(), values(n, 10));
        for p in [Precision::Float16, Precision::BFloat16] {
            let mut feeds = Feeds::new();
            feeds.insert("x".into(), x.clone());
            let got = run(&g, vec![p; g.nodes.len()], &PlanOptions::default(), feeds).unwrap();
            // The reference, node by node.
            let rounded = |t: &Tensor| {
                let mut v = t.as_f32().unwrap().to_vec();
                crate::precision::round_slice(p, &mut v);
                Tensor::from_f32(t.shape().to_vec(), v)
            };
            let mut env: BTreeMap<String, Tensor> = g
                .initializers
                .iter()
                .map(|(k, t)| (k.clone(), rounded(t)))
                .collect();
            env.insert("x".into(), rounded(&x));
            for nd in &g.nodes {
                let kernel = crate::ops::Registry::global().get("", &nd.op_type).unwrap();
                let args: Vec<Option<&Tensor>> = nd.inputs.iter().map(|i| env.get(i)).collect();
                let ctx = crate::ops::OpCtx::new(nd, 10);
                let out = kernel(&ctx, &args).unwrap().remove(0);
                assert!(!ctx.did_round(), "{}: a reference kernel rounded", nd.name);
                env.insert(nd.outputs[0].clone(), rounded(&out));
            }
            let want = env["y"].as_f32().unwrap();
            let differ = want
                .iter()
                .zip(&got)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{p:?}: {differ} of {n} values differ");
        }
    }

    /// A convolution keeps its packed weights with the weight they were packed from: the
    /// graph's initializer for float32 runs, the plan's converted copy for float16. One
    /// interpreter alternating the two plans gives what fresh interpreters give, and the
    /// float16 result differs from the float32 one (so a pack reused across them would show).
    #[test]
    fn packed_weights_are_kept_with_the_weight_they_were_packed_from() {
        use crate::graph::Attribute;
        let (c, m, hw) = (3usize, 16usize, 9usize);
        let mut conv = node("conv", "Conv", &["x", "w", "b"], &["y"]);
        conv.attrs
            .insert("pads".into(), Attribute::Ints(vec![1, 1, 1, 1]));
        let g = graph(
            vec![conv],
            vec![vi("x", &[1, c, hw, hw])],
            vi("y", &[1, m, hw, hw]),
            vec![
                (
                    "w",
                    Tensor::from_f32(vec![m, c, 3, 3], values(m * c * 9, 3)),
                ),
                ("b", Tensor::from_f32(vec![m], values(m, 4))),
            ],
        );
        let mut feeds = Feeds::new();
        feeds.insert(
            "x".into(),
            Tensor::from_f32(vec![1, c, hw, hw], values(c * hw * hw, 5)),
        );
        let fp16 = PreparedPlan::new(
            &g,
            &PrecisionPlan::uniform(&g, Precision::Float16),
            &PlanOptions::default(),
        )
        .unwrap();
        let bits = |r: crate::exec::RunResult| -> Vec<u32> {
            let y = r.outputs[0].1.as_f32().unwrap();
            y.iter().map(|v| v.to_bits()).collect()
        };
        let opts = RunOptions::default();
        let interp = Interpreter::new(&g).unwrap();
        let f32_first = bits(interp.run(&feeds).unwrap());
        let f16_first = bits(interp.run_plan(&feeds, &opts, &fp16).unwrap());
        assert_eq!(bits(interp.run(&feeds).unwrap()), f32_first);
        assert_eq!(
            bits(interp.run_plan(&feeds, &opts, &fp16).unwrap()),
            f16_first
        );
        let fresh = Interpreter::new(&g).unwrap();
        assert_eq!(
            bits(fresh.run_plan(&feeds, &opts, &fp16).unwrap()),
            f16_first
        );
        assert_ne!(f32_first, f16_first);
        assert_eq!(interp.steps[0].prepacked[1].len(), 1);
        let InputPrep::Converted(_, kept) = &fp16.layers[0].inputs[1] else {
            panic!("the float16 plan converts the weight in advance")
        };
        assert_eq!(kept.len(), 1);
    }

    fn ones_matmul(k: usize) -> Graph {
        graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![vi("x", &[1, k])],
            vi("y", &[1, 1]),
            vec![("w", Tensor::from_f32(vec![k, 1], vec![1.0; k]))],
        )
    }

    #[test]
    fn rounded_weights_are_stored_in_16_bits_and_compute_as_before() {
        // A Gemm weight under float16/bfloat16 plans: the prepared copy is F16/BF16 (half the
        // memory of an f32 copy), and the result is bit-identical to computing with the
        // weight rounded in f32 (the reference: a graph whose weight is pre-rounded). (A
        // MatMul's weight is rounded by its kernel instead, below.)
        let (k, n) = (1024, NARROW_MIN_ELEMENTS / 1024);
        let wv = values(k * n, 3);
        for (p, dt) in [
            (Precision::Float16, DType::F16),
            (Precision::BFloat16, DType::BF16),
        ] {
            let mm = |w: Vec<f32>| {
                graph(
                    vec![node("mm", "Gemm", &["x", "w"], &["y"])],
                    vec![vi("x", &[2, k])],
                    vi("y", &[2, n]),
                    vec![("w", Tensor::from_f32(vec![k, n], w))],
                )
            };
            let g = mm(wv.clone());
            let plan = PreparedPlan::new(
                &g,
                &PrecisionPlan::from_layers(vec![p]),
                &PlanOptions::default(),
            )
            .unwrap();
            let InputPrep::Converted(c, _) = &plan.layers[0].inputs[1] else {
                panic!("the weight is converted in advance")
            };
            assert_eq!(c.dtype(), dt);
            let mut rounded = wv.clone();
            round_slice(p, &mut rounded);
            assert_eq!(c.to_f32_vec().unwrap(), rounded);
            let mut feeds = Feeds::new();
            feeds.insert("x".into(), Tensor::from_f32(vec![2, k], values(2 * k, 4)));
            let got = run(&g, vec![p], &PlanOptions::default(), feeds.clone()).unwrap();
            let want = run(&mm(rounded), vec![p], &PlanOptions::default(), feeds).unwrap();
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
        // A weight holding a NaN, or a small one, keeps its f32 copy.
        let mut w = vec![1.0f32; k * n];
        w[1] = f32::from_bits(0x7fc0_1234);
        for (w, shape) in [(w, [k, n]), (vec![1.0; 4], [2, 2])] {
            let g = graph(
                vec![node("mm", "Gemm", &["x", "w"], &["y"])],
                vec![vi("x", &[1, shape[0]])],
                vi("y", &[1, shape[1]]),
                vec![("w", Tensor::from_f32(shape.to_vec(), w))],
            );
            let plan = PreparedPlan::new(
                &g,
                &PrecisionPlan::from_layers(vec![Precision::Float16]),
                &PlanOptions::default(),
            )
            .unwrap();
            let InputPrep::Converted(c, _) = &plan.layers[0].inputs[1] else {
                panic!("converted")
            };
            assert_eq!(c.dtype(), DType::F32);
        }
    }

    #[test]
    fn a_matmul_rounds_its_weight_as_it_packs_it_and_keeps_no_copy() {
        // Under float16/bfloat16 a MatMul's f32 weight is handed to the kernel as stored and
        // rounded in its packed panels: the same bits as the in-order product of the rounded
        // weight, for one row, a few rows (packed per run) and many rows (packed once and
        // kept), and for a batched product reading a rounded copy.
        use crate::ops::sgemm::{gemm, StridedB};
        let (k, n) = (300, 40);
        let wv = values(k * n, 3);
        for p in [Precision::Float16, Precision::BFloat16] {
            let mut rounded = wv.clone();
            round_slice(p, &mut rounded);
            for m in [1, 5, 80] {
                let g = graph(
                    vec![node("mm", "MatMul", &["x", "w"], &["y"])],
                    vec![vi("x", &[m, k])],
                    vi("y", &[m, n]),
                    vec![("w", Tensor::from_f32(vec![k, n], wv.clone()))],
                );
                let plan = PreparedPlan::new(
                    &g,
                    &PrecisionPlan::from_layers(vec![p]),
                    &PlanOptions::default(),
                )
                .unwrap();
                assert!(
                    matches!(plan.layers[0].inputs[1], InputPrep::RoundedByKernel(r) if Some(r) == p.float_rounding()),
                    "{p}"
                );
                let mut x = values(m * k, 4);
                round_slice(p, &mut x);
                let mut want = vec![0f32; m * n];
                let b = StridedB {
                    data: &rounded,
                    n,
                    rs: n,
                    cs: 1,
                };
                gemm(m, n, k, &x, k, 1, &b, &mut want, n, false);
                round_slice(p, &mut want);
                let mut feeds = Feeds::new();
                feeds.insert("x".into(), Tensor::from_f32(vec![m, k], values(m * k, 4)));
                let interp = Interpreter::new(&g).unwrap();
                let opts = RunOptions::default();
                for _ in 0..2 {
                    let got = interp.run_plan(&feeds, &opts, &plan).unwrap();
                    let got = got.outputs[0].1.as_f32().unwrap();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(got), bits(&want), "{p} m={m}");
                }
                // A product of more than one row keeps a packed form, with the stored
                // weight; one row (a decode step) streams it.
                assert_eq!(interp.steps[0].prepacked[1].len(), usize::from(m > 1));
            }
            // A batch of B matrices is no single product: it reads a rounded copy.
            let g = graph(
                vec![node("mm", "MatMul", &["x", "w"], &["y"])],
                vec![vi("x", &[2, 3, k])],
                vi("y", &[2, 3, 20]),
                vec![(
                    "w",
                    Tensor::from_f32(vec![2, k, 20], wv[..2 * k * 20].to_vec()),
                )],
            );
            let mut feeds = Feeds::new();
            feeds.insert(
                "x".into(),
                Tensor::from_f32(vec![2, 3, k], values(6 * k, 5)),
            );
            let got = run(&g, vec![p], &PlanOptions::default(), feeds.clone()).unwrap();
            let mut w = wv[..2 * k * 20].to_vec();
            round_slice(p, &mut w);
            let pre = graph(
                vec![node("mm", "MatMul", &["x", "w"], &["y"])],
                vec![vi("x", &[2, 3, k])],
                vi("y", &[2, 3, 20]),
                vec![("w", Tensor::from_f32(vec![2, k, 20], w))],
            );
            let mut x = feeds["x"].clone();
            round_slice(p, x.as_f32_mut().unwrap());
            let mut xf = Feeds::new();
            xf.insert("x".into(), x);
            let mut want =
                run(&pre, vec![Precision::Float32], &PlanOptions::default(), xf).unwrap();
            round_slice(p, &mut want);
            assert_eq!(got, want, "{p}");
        }
    }

    #[test]
    fn f16_accumulator_stagnates_where_f32_does_not() {
        // 4096 ones: an f16 running sum stops at 2048 (2048 + 1 ties to even), f32 reaches 4096.
        let k = 4096;
        let g = ones_matmul(k);
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![1, k], vec![1.0; k]));
        let f32acc = run(
            &g,
            vec![Precision::Float16],
            &PlanOptions::default(),
            feeds.clone(),
        )
        .unwrap();
        assert_eq!(f32acc, vec![4096.0]);
        let opts = PlanOptions {
            accumulate: Accumulator::F16,
            amax: None,
            input_shapes: None,
        };
        let f16acc = run(&g, vec![Precision::Float16], &opts, feeds).unwrap();
        assert_eq!(f16acc, vec![2048.0]);
    }

    #[test]
    fn f16_accumulation_applies_to_reductions() {
        let k = 4096;
        let mut sum = node("sum", "ReduceSum", &["x"], &["y"]);
        sum.attrs
            .insert("keepdims".into(), crate::graph::Attribute::Int(0));
        let g = graph(vec![sum], vec![vi("x", &[k])], vi("y", &[]), vec![]);
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![k], vec![1.0; k]));
        let opts = PlanOptions {
            accumulate: Accumulator::F16,
            amax: None,
            input_shapes: None,
        };
        let got = run(&g, vec![Precision::Float16], &opts, feeds.clone()).unwrap();
        assert_eq!(got, vec![2048.0]);
        let got = run(&g, vec![Precision::Float16], &PlanOptions::default(), feeds).unwrap();
        assert_eq!(got, vec![4096.0]);
    }

    #[test]
    fn int8_matmul_quantizes_activations_per_tensor_and_weights_per_channel() {
        let w = Tensor::from_f32(vec![2, 2], vec![0.5, -1.0, 0.25, 2.0]);
        let g = graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![vi("x", &[1, 2])],
            vi("y", &[1, 2]),
            vec![("w", w)],
        );
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![1, 2], vec![0.3, -0.7]));
        let mut amax = BTreeMap::new();
        amax.insert("x".to_string(), 1.0f32);
        let opts = PlanOptions {
            accumulate: Accumulator::F32,
            amax: Some(&amax),
            input_shapes: None,
        };
        let got = run(&g, vec![Precision::Int8], &opts, feeds.clone()).unwrap();
        // By hand: s_x = 1/127; column scales 0.5/127 and 2/127.
        let q = |v: f32, s: f32| crate::precision::round_half_even(v / s).clamp(-128.0, 127.0) * s;
        let (sx, s0, s1) = (1.0 / 127.0, 0.5 / 127.0, 2.0 / 127.0);
        let (x0, x1) = (q(0.3, sx), q(-0.7, sx));
        let want = [
            x0 * q(0.5, s0) + x1 * q(0.25, s0),
            x0 * q(-1.0, s1) + x1 * q(2.0, s1),
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-6, "{got:?} vs {want:?}");
        }
        // Without a range for x the plan cannot be prepared, and the error names the tensor.
        let e = run(&g, vec![Precision::Int8], &PlanOptions::default(), feeds).unwrap_err();
        assert!(e.to_string().contains("'x'"), "{e}");
    }

    #[test]
    fn subgraphs_run_in_the_precision_of_their_node() {
        // Both branches compute (x + d) - x, reading x and d = 2^-12 from the main graph. In
        // float16 and bfloat16, 1 + 2^-12 rounds to 1 and the branch returns 0; a float32 body
        // returns 2^-12, a float16 value, so rounding the If's output alone would keep it.
        let branch = graph(
            vec![
                node("add", "Add", &["x", "d"], &["s"]),
                node("sub", "Sub", &["s", "x"], &["t"]),
            ],
            vec![],
            vi("t", &[1]),
            vec![],
        );
        let mut iff = node("if", "If", &["c"], &["y"]);
        for b in ["then_branch", "else_branch"] {
            iff.attrs.insert(
                b.into(),
                crate::graph::Attribute::Graph(std::sync::Arc::new(branch.clone())),
            );
        }
        let c = ValueInfo {
            name: "c".into(),
            dtype: Some(DType::Bool),
            shape: Some(vec![]),
        };
        let d = 2f32.powi(-12);
        let g = graph(
            vec![iff],
            vec![c, vi("x", &[1])],
            vi("y", &[1]),
            vec![("d", Tensor::from_f32(vec![1], vec![d]))],
        );
        let mut feeds = Feeds::new();
        feeds.insert("c".into(), Tensor::from_bool(vec![], vec![true]));
        feeds.insert("x".into(), Tensor::from_f32(vec![1], vec![1.0]));
        let opts = PlanOptions::default();
        for (p, want) in [
            (Precision::Float32, d),
            (Precision::Float16, 0.0),
            (Precision::BFloat16, 0.0),
            // No subgraph op has a quantized kernel: the body runs in float32.
            (Precision::Int8, d),
        ] {
            let got = run(&g, vec![p], &opts, feeds.clone()).unwrap();
            assert_eq!(got, vec![want], "{p}");
        }
        // Nodes inside a float16 If set by path: both in float32 keep 2^-12; the Add alone in
        // float16 loses it (1 + 2^-12 rounds to 1 before the float32 Sub).
        let interp = Interpreter::new(&g).unwrap();
        for (inner, want) in [
            (vec!["if/then_branch/add", "if/then_branch/sub"], d),
            (vec!["if/then_branch/sub"], 0.0),
            (vec!["if/else_branch/add", "if/else_branch/sub"], 0.0),
        ] {
            let mut plan = PrecisionPlan::from_layers(vec![Precision::Float16]);
            for path in &inner {
                plan.inner.insert(path.to_string(), Precision::Float32);
            }
            let prepared = PreparedPlan::new(&g, &plan, &opts).unwrap();
            let r = interp
                .run_plan(&feeds, &RunOptions::default(), &prepared)
                .unwrap();
            assert_eq!(r.outputs[0].1.as_f32().unwrap(), &[want], "{inner:?}");
        }
    }

    #[test]
    fn data_movement_carries_the_rounded_values() {
        // Relu (fp16) -> Reshape -> Relu (fp32): the fp32 Relu sees fp16-rounded values.
        let g = graph(
            vec![
                node("r1", "Relu", &["x"], &["a"]),
                node("reshape", "Reshape", &["a", "shape"], &["b"]),
                node("r2", "Relu", &["b"], &["y"]),
            ],
            vec![vi("x", &[2])],
            vi("y", &[2, 1]),
            vec![("shape", Tensor::from_i64(vec![2], vec![2, 1]))],
        );
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![2], vec![1.0001, 70000.0]));
        let got = run(
            &g,
            vec![Precision::Float16, Precision::Float32, Precision::Float32],
            &PlanOptions::default(),
            feeds,
        )
        .unwrap();
        assert_eq!(got[0], 1.0);
        assert!(got[1].is_infinite(), "70000 overflows fp16 to inf");
    }

    /// A model stored in float16: a bfloat16 plan rounds its weights and activations to
    /// bfloat16 (stored back in float16), an int8 plan quantizes them; a float16 plan leaves
    /// them alone. Without this, a float16 model would run unchanged under every plan.
    #[test]
    fn float16_stored_models_are_rounded_and_quantized() {
        let f16v = |v: &[f32]| {
            crate::ops::cast::cast_tensor(
                &Tensor::from_f32(vec![1, v.len()], v.to_vec()),
                DType::F16,
            )
        };
        let xs = [1.0039062f32, 0.3339844, -2.0078125, 0.7];
        let ws = [0.1000977f32, 1.0009766, 0.3330078, -0.25];
        let w =
            crate::ops::cast::cast_tensor(&Tensor::from_f32(vec![4, 1], ws.to_vec()), DType::F16);
        let g = graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![ValueInfo {
                name: "x".into(),
                dtype: Some(DType::F16),
                shape: None,
            }],
            vi("y", &[1, 1]),
            vec![("w", w)],
        );
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), f16v(&xs));
        let out = |plan: Precision, amax: Option<&BTreeMap<String, f32>>| -> f32 {
            let plan = PreparedPlan::new(
                &g,
                &PrecisionPlan::from_layers(vec![plan]),
                &PlanOptions {
                    amax,
                    ..Default::default()
                },
            )
            .unwrap();
            let r = Interpreter::new(&g)
                .unwrap()
                .run_plan(&feeds, &RunOptions::default(), &plan)
                .unwrap();
            assert_eq!(
                r.outputs[0].1.dtype(),
                DType::F16,
                "the model's type is kept"
            );
            r.outputs[0].1.to_f32_vec().unwrap()[0]
        };
        let x16: Vec<f32> = xs.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        let w16: Vec<f32> = ws.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        // float16 plan: the stored values as they are.
        let plain = f16::from_f32(dot(&x16, &w16)).to_f32();
        assert_eq!(out(Precision::Float16, None), plain);
        // bfloat16 plan: inputs rounded to bfloat16, output rounded to bfloat16, stored in f16.
        let xb: Vec<f32> = x16.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        let wb: Vec<f32> = w16.iter().map(|&v| bf16::from_f32(v).to_f32()).collect();
        let want = f16::from_f32(bf16::from_f32(dot(&xb, &wb)).to_f32()).to_f32();
        let got = out(Precision::BFloat16, None);
        assert_eq!(got, want);
        assert_ne!(got, plain, "bfloat16 must change this product");
        // int8 plan: activation per tensor (amax 2.5), weight per output channel.
        let mut amax = BTreeMap::new();
        amax.insert("x".to_string(), 2.5f32);
        let sx = 2.5 / 127.0;
        let wmax = w16.iter().fold(0f32, |m, v| m.max(v.abs()));
        let sw = wmax / 127.0;
        let q = |v: f32, s: f32| ((v / s).round_ties_even().clamp(-128.0, 127.0)) * s;
        let xq: Vec<f32> = x16
            .iter()
            .map(|&v| f16::from_f32(q(v, sx)).to_f32())
            .collect();
        let wq: Vec<f32> = w16
            .iter()
            .map(|&v| f16::from_f32(q(v, sw)).to_f32())
            .collect();
        let want = f16::from_f32(dot(&xq, &wq)).to_f32();
        let got = out(Precision::Int8, Some(&amax));
        assert_eq!(got, want);
        assert_ne!(got, plain, "int8 must change this product");
    }
}

#[cfg(test)]
mod fusion_tests {
    use super::*;
    use crate::exec::{Feeds, Interpreter, RunOptions, ValueCache};
    use crate::graph::testing::{graph, node, vi};
    use crate::precision::plan::FusionRegion;
    use half::f16;

    /// x → Add(c) → a → Sub(c) → y, plus Relu(a) → r when `tap`: Add's output overflows
    /// float16 for x near 60000, Sub brings it back into range.
    fn add_sub(tap: bool) -> Graph {
        let mut nodes = vec![
            node("Add", "Add", &["x", "c"], &["a"]),
            node("Sub", "Sub", &["a", "c"], &["y"]),
        ];
        let mut outs = vec![vi("y", &[3])];
        if tap {
            nodes.push(node("Relu", "Relu", &["a"], &["r"]));
            outs.push(vi("r", &[3]));
        }
        graph(
            nodes,
            vec![vi("x", &[3])],
            outs,
            vec![("c", Tensor::from_f32(vec![1], vec![10000.0]))],
        )
    }

    fn feeds() -> Feeds {
        let mut f = Feeds::new();
        // 60000.3 is not a float16 value: the region's output is rounded once.
        f.insert(
            "x".into(),
            Tensor::from_f32(vec![3], vec![60000.3, 1.0004, -3.25]),
        );
        f
    }

    fn plan(g: &Graph, p: Vec<Precision>, regions: &[&[&str]]) -> PrecisionPlan {
        let mut plan = PrecisionPlan::from_layers(p);
        for (i, r) in regions.iter().enumerate() {
            plan.regions.push(FusionRegion {
                name: format!("r{i}"),
                nodes: r.iter().map(|s| s.to_string()).collect(),
            });
        }
        assert_eq!(plan.layers.len(), g.nodes.len());
        plan
    }

    fn run_all(g: &Graph, plan: &PrecisionPlan) -> crate::exec::RunResult {
        let prepared = PreparedPlan::new(g, plan, &PlanOptions::default()).unwrap();
        let keep = RunOptions {
            keep_intermediates: true,
        };
        Interpreter::new(g)
            .unwrap()
            .run_plan(&feeds(), &keep, &prepared)
            .unwrap()
    }

    fn f32s(r: &crate::exec::RunResult, name: &str) -> Vec<f32> {
        r.intermediates[name].as_f32().unwrap().to_vec()
    }

    #[test]
    fn a_fused_float16_region_keeps_its_intermediate_in_f32() {
        let g = add_sub(false);
        let fp32 = Interpreter::new(&g)
            .unwrap()
            .run_with(
                &feeds(),
                &RunOptions {
                    keep_intermediates: true,
                },
            )
            .unwrap();
        let half = vec![Precision::Float16; 2];
        // Unfused: Add's 70000 overflows float16 to inf, and Sub keeps it.
        let unfused = run_all(&g, &plan(&g, half.clone(), &[]));
        assert!(f32s(&unfused, "a")[0].is_infinite());
        assert!(f32s(&unfused, "y")[0].is_infinite());
        // Fused: the intermediate is the FP32 run's, bit for bit; the output is the f32
        // result rounded once to float16 (the input rounded to float16 first, as it enters).
        let fused = run_all(&g, &plan(&g, half, &[&["Add", "Sub"]]));
        let (a, a32) = (f32s(&fused, "a"), f32s(&fp32, "a"));
        let xs = [60000.3f32, 1.0004, -3.25];
        for i in 0..3 {
            let x16 = f16::from_f32(xs[i]).to_f32();
            assert_eq!(a[i].to_bits(), (x16 + 10000.0).to_bits(), "{i}");
            let want = f16::from_f32((x16 + 10000.0) - 10000.0).to_f32();
            assert_eq!(f32s(&fused, "y")[i].to_bits(), want.to_bits(), "{i}");
        }
        assert!(a[0].is_finite() && a32[0] == 70000.3);
        assert_eq!(f32s(&fused, "y")[0], 60000.0);
        // With an input already in float16 the intermediate equals the FP32 run bit for bit.
        assert_eq!(a[2].to_bits(), a32[2].to_bits());
        // A float32 region changes nothing.
        let fp32_region = run_all(
            &g,
            &plan(&g, vec![Precision::Float32; 2], &[&["Add", "Sub"]]),
        );
        assert_eq!(f32s(&fp32_region, "y"), f32s(&fp32, "y"));
    }

    #[test]
    fn a_value_leaving_the_region_is_rounded_for_outside_readers_only() {
        // `a` is read by Sub (inside) and Relu (outside) (outside):
        // Sub sees f32 70000.3, Relu sees float16 inf.
        let g = add_sub(true);
        let p = plan(&g, vec![Precision::Float16; 3], &[&["Add", "Sub"]]);
        let r = run_all(&g, &p);
        assert_eq!(f32s(&r, "y")[0], 60000.0);
        assert!(f32s(&r, "a")[0].is_infinite(), "stored as materialized");
        assert!(f32s(&r, "r")[0].is_infinite());
        // The cache serves the same bits, and keys differ from the unfused plan's.
        let interp = Interpreter::new(&g).unwrap();
        let mut cache = ValueCache::new(1 << 20);
        let opts = RunOptions::default();
        let unfused = plan(&g, vec![Precision::Float16; 3], &[]);
        for pl in [&unfused, &p, &unfused, &p] {
            let prepared = PreparedPlan::new(&g, pl, &PlanOptions::default()).unwrap();
            let got = interp
                .run_cached(&feeds(), 0, &opts, Some(&prepared), &mut cache)
                .unwrap();
            let want = interp.run_plan(&feeds(), &opts, &prepared).unwrap();
            for k in 0..2 {
                let (a, b) = (
                    got.outputs[k].1.as_f32().unwrap(),
                    want.outputs[k].1.as_f32().unwrap(),
                );
                assert_eq!(format!("{a:?}"), format!("{b:?}"));
            }
        }
        assert_eq!(cache.stats.executed, 6, "each plan executed once");
        assert_eq!(cache.stats.reused, 6);
        // Fused y is finite: the unfused run's cached inf did not leak into it.
        let prepared = PreparedPlan::new(&g, &p, &PlanOptions::default()).unwrap();
        let got = interp
            .run_cached(&feeds(), 0, &opts, Some(&prepared), &mut cache)
            .unwrap();
        assert_eq!(got.outputs[0].1.as_f32().unwrap()[0], 60000.0);
    }

    #[test]
    fn bad_regions_are_errors_naming_region_and_nodes() {
        let g = add_sub(true);
        let err = |p: PrecisionPlan| {
            PreparedPlan::new(&g, &p, &PlanOptions::default())
                .unwrap_err()
                .to_string()
        };
        // Mixed precisions.
        let e = err(plan(
            &g,
            vec![Precision::Float16, Precision::Float32, Precision::Float16],
            &[&["Add", "Sub"]],
        ));
        assert!(
            e.contains("'r0'") && e.contains("Add float16") && e.contains("Sub float32"),
            "{e}"
        );
        // Unknown node, node in two regions.
        let half = vec![Precision::Float16; 3];
        let e = err(plan(&g, half.clone(), &[&["Add", "Nope"]]));
        assert!(e.contains("'r0'") && e.contains("'Nope'"), "{e}");
        let e = err(plan(&g, half.clone(), &[&["Add", "Sub"], &["Sub", "Relu"]]));
        assert!(
            e.contains("'r1'") && e.contains("'Sub'") && e.contains("'r0'"),
            "{e}"
        );
        // Not convex: x → A → B (outside) → C, with A and C in one region.
        let g = graph(
            vec![
                node("A", "Relu", &["x"], &["a"]),
                node("B", "Neg", &["a"], &["b"]),
                node("C", "Add", &["a", "b"], &["y"]),
            ],
            vec![vi("x", &[1])],
            vec![vi("y", &[1])],
            vec![],
        );
        let p = plan(&g, vec![Precision::Float16; 3], &[&["A", "C"]]);
        let e = PreparedPlan::new(&g, &p, &PlanOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not convex") && e.contains("'A'") && e.contains("'B'") && e.contains("'C'"),
            "{e}"
        );
        let p = plan(&g, vec![Precision::Float16; 3], &[&["A", "B", "C"]]);
        assert!(PreparedPlan::new(&g, &p, &PlanOptions::default()).is_ok());
    }

    #[test]
    fn regions_round_trip_through_plan_json() {
        let g = add_sub(true);
        let p = plan(
            &g,
            vec![Precision::Float16, Precision::Float16, Precision::Float32],
            &[&["Add", "Sub"]],
        );
        let text = p.to_json();
        assert!(text.contains("\"regions\""), "{text}");
        assert_eq!(PrecisionPlan::from_json(&text, &g).unwrap(), p);
        // Hand-written, with aliases; errors name what is wrong.
        let hand = r#"{"layers": ["fp16", "half", "fp32"],
                       "regions": [{"name": "add+sub", "nodes": ["Add", "Sub"]}]}"#;
        let q = PrecisionPlan::from_json(hand, &g).unwrap();
        assert_eq!(q.layers, p.layers);
        assert_eq!(q.regions[0].name, "add+sub");
        let bad = r#"{"layers": ["fp16", "fp32", "fp32"], "regions": [{"nodes": ["Add", "Sub"]}]}"#;
        let e = PrecisionPlan::from_json(bad, &g).unwrap_err().to_string();
        assert!(
            e.contains("'region_0'") && e.contains("share one precision"),
            "{e}"
        );
        let e = PrecisionPlan::from_json(r#"{"layers": ["fp16"]}"#, &g)
            .unwrap_err()
            .to_string();
        assert!(e.contains("1 entries") && e.contains("3 nodes"), "{e}");
    }

    #[test]
    fn fusion_model_round_trips_through_plan_json() {
        let g = add_sub(false);
        let mut p = plan(&g, vec![Precision::Float16; 2], &[]);
        assert!(
            !p.to_json().contains("fusion"),
            "none is the default, not written"
        );
        p.fusion = FusionModel::TensorRt;
        let text = p.to_json();
        assert!(text.contains("\"fusion\": \"tensorrt\""), "{text}");
        assert_eq!(PrecisionPlan::from_json(&text, &g).unwrap(), p);
        let e = PrecisionPlan::from_json(r#"{"layers": ["fp16", "fp16"], "fusion": "xla"}"#, &g)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'xla'"), "{e}");
    }

    #[test]
    fn the_tensorrt_model_fuses_the_seed_pattern_unless_a_precision_boundary_splits_it() {
        let g = add_sub(false);
        let mut p = plan(&g, vec![Precision::Float16; 2], &[]);
        // No fusion: Add's output overflows float16 and Sub cannot bring it back.
        let unfused = f32s(&run_all(&g, &p), "y");
        assert!(unfused[0].is_infinite(), "{unfused:?}");
        p.fusion = FusionModel::TensorRt;
        let prepared = PreparedPlan::new(&g, &p, &PlanOptions::default()).unwrap();
        assert_eq!(prepared.derived_regions().len(), 1);
        assert_eq!(prepared.derived_regions()[0].nodes, vec![0, 1]);
        let fused = f32s(&run_all(&g, &p), "y");
        assert_eq!(
            fused[0],
            f16::from_f32(60000.3f32 + 10000.0 - 10000.0).to_f32()
        );
        // Add:float16, Sub:float32: two kernels, the overflow is back.
        p.layers[1] = Precision::Float32;
        let prepared = PreparedPlan::new(&g, &p, &PlanOptions::default()).unwrap();
        assert!(prepared.derived_regions().is_empty());
        assert!(f32s(&run_all(&g, &p), "y")[0].is_infinite());
    }

    #[test]
    fn explicit_regions_keep_working_beside_the_fusion_model() {
        let g = add_sub(true);
        let mut p = plan(&g, vec![Precision::Float16; 3], &[]);
        p.fusion = FusionModel::TensorRt;
        let prepared = PreparedPlan::new(&g, &p, &PlanOptions::default()).unwrap();
        assert_eq!(prepared.derived_regions().len(), 1);
        assert_eq!(prepared.derived_regions()[0].nodes, vec![0, 1, 2]);
        // The plan's own region {Add, Sub}: the rules leave its nodes alone (Relu alone is no
        // region).
        let mut p = plan(&g, vec![Precision::Float16; 3], &[&["Add", "Sub"]]);
        p.fusion = FusionModel::TensorRt;
        let prepared = PreparedPlan::new(&g, &p, &PlanOptions::default()).unwrap();
        assert_eq!(prepared.regions().len(), 1);
        assert_eq!(prepared.regions()[0].name, "r0");
        assert!(prepared.derived_regions().is_empty());
    }

    /// Composed plans under the TensorRT model get their own regions, and cached runs equal
    /// uncached ones bit for bit.
    #[test]
    fn composed_plans_derive_their_own_regions_and_cache_bit_for_bit() {
        let g = crate::graph::testing::chain(16, 3);
        let mut low = PrecisionPlan::uniform(&g, Precision::Float16);
        low.fusion = FusionModel::TensorRt;
        let mut high = PrecisionPlan::uniform(&g, Precision::Float32);
        high.fusion = FusionModel::TensorRt;
        let opts = PlanOptions::default();
        let lp = PreparedPlan::new(&g, &low, &opts).unwrap();
        let hp = PreparedPlan::new(&g, &high, &opts).unwrap();
        assert_eq!(
            lp.derived_regions().len(),
            1,
            "one pointwise group of 9 layers"
        );
        assert_eq!(lp.derived_regions()[0].nodes.len(), 9);
        let interp = Interpreter::new(&g).unwrap();
        let mut feeds = Feeds::new();
        feeds.insert(
            "x".into(),
            Tensor::from_f32(vec![16], (0..16).map(|i| 0.37 * i as f32 - 2.9).collect()),
        );
        let mut cache = ValueCache::new(1 << 30);
        let opts_run = RunOptions::default();
        let mut seen_regions = std::collections::BTreeSet::new();
        for marked in [
            vec![],
            vec![4],
            vec![0, 1],
            vec![4],
            vec![8],
            vec![],
            vec![3, 4, 5],
        ] {
            let c = lp.with_layers_of(&hp, &marked).unwrap();
            // The float32 layers split the group: no region holds a marked layer.
            for r in c.derived_regions() {
                assert!(r.nodes.iter().all(|i| !marked.contains(i)), "{marked:?}");
            }
            let fresh = PreparedPlan::new(&g, &c.plan, &opts).unwrap();
            assert_eq!(c.regions(), fresh.regions(), "composed == prepared anew");
            seen_regions.insert(format!("{:?}", c.regions()));
            let cached = interp
                .run_cached(&feeds, 0, &opts_run, Some(&c), &mut cache)
                .unwrap();
            let plain = interp.run_plan(&feeds, &opts_run, &fresh).unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
            };
            assert_eq!(
                bits(&cached.outputs[0].1),
                bits(&plain.outputs[0].1),
                "{marked:?}"
            );
        }
        assert!(seen_regions.len() >= 4, "{seen_regions:?}");
        assert!(cache.stats.reused > 0, "the cache served something");
    }

    /// scores + mask → Softmax with BERT's float32-min mask constant: row 0 masks two of four
    /// positions, row 1 all four (docs/numerics.md, "Weights beyond float16's range").
    fn masked_softmax() -> Graph {
        const MIN: f32 = -3.402_823_5e38;
        graph(
            vec![
                node("add", "Add", &["x", "mask"], &["s"]),
                node("softmax", "Softmax", &["s"], &["y"]),
            ],
            vec![vi("x", &[2, 4])],
            vec![vi("y", &[2, 4])],
            vec![(
                "mask",
                Tensor::from_f32(vec![2, 4], vec![0.0, MIN, 0.0, MIN, MIN, MIN, MIN, MIN]),
            )],
        )
    }

    /// Every emulation of a float16 layer converts a float32 constant initializer (or a
    /// Constant node's value) as the export stores it and TensorRT's builder converts it:
    /// finite values beyond float16's range clamped to ±65504, with a warning per (weight,
    /// layer). A weight converted at run
    /// time (folded, or an initializer a graph input overrides) and a bfloat16 layer keep the
    /// Cast's rule: ±inf.
    #[test]
    fn float16_layers_clamp_constant_weights_beyond_float16_a_cast_makes_them_infinite() {
        let mut f = Feeds::new();
        f.insert(
            "x".into(),
            Tensor::from_f32(vec![2, 4], vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]),
        );
        let prepare = |g: &Graph, p: Precision, fusion: FusionModel| {
            let mut plan = PrecisionPlan::uniform(g, p);
            plan.fusion = fusion;
            PreparedPlan::new(g, &plan, &PlanOptions::default()).unwrap()
        };
        let out = |g: &Graph, p: &PreparedPlan| {
            let r = Interpreter::new(g)
                .unwrap()
                .run_plan(&f, &RunOptions::default(), p)
                .unwrap();
            r.outputs[0].1.as_f32().unwrap().to_vec()
        };
        let w = 1.0 / (1.0 + (-2f32).exp());
        let row0 = [1.0 - w, 0.0, w, 0.0];
        // (bfloat16's 8-bit significand: within 1e-2.)
        let row0_masks = |y: &[f32], tol: f32| {
            for (a, b) in y[..4].iter().zip(row0) {
                assert!((a - b).abs() < tol, "{y:?}");
            }
        };
        // The same mask as a Constant node's value (MiniLM's): a constant of the file too.
        let mut constant_node = masked_softmax();
        let m = constant_node.initializers.remove("mask").unwrap();
        let mut c = node("mask_const", "Constant", &[], &["mask"]);
        c.attrs
            .insert("value".into(), crate::graph::Attribute::Tensor(m));
        constant_node.nodes.insert(0, c);
        crate::fold::fold_weights(&mut constant_node);
        assert!(constant_node.constant_initializer("mask").is_some());
        for (g, fusion) in [masked_softmax(), constant_node]
            .into_iter()
            .flat_map(|g| [(g.clone(), FusionModel::None), (g, FusionModel::TensorRt)])
        {
            // -65504 (a warning names the weight and its layer); the masked positions still
            // vanish and the fully masked row stays finite, as in float32.
            let p = prepare(&g, Precision::Float16, fusion);
            let ev = p.weight_events();
            assert_eq!(ev.len(), 1, "{fusion:?}: {ev:?}");
            let crate::event::Event::Warning(msg) = &ev[0] else {
                panic!("{ev:?}")
            };
            assert!(msg.contains("'mask'") && msg.contains("'add'") && msg.contains("6 finite"));
            let y = out(&g, &p);
            row0_masks(&y, 1e-3);
            // (Under --fusion tensorrt Add and Softmax may run as one kernel, where x - 65504
            // stays in f32: the row is softmax(x), not uniform; finite either way.)
            assert!(y[4..].iter().all(|v| v.is_finite()), "{fusion:?}: {y:?}");
            assert!((y[4..].iter().sum::<f32>() - 1.0).abs() < 1e-3, "{y:?}");
            // A float32 layer reads the weight as it is: nothing clamped.
            let p = prepare(&g, Precision::Float32, fusion);
            assert!(p.weight_events().is_empty());
        }
        // The Cast's rule: the mask becomes -inf; exp(-inf) = 0 masks as in float32, and the
        // fully masked row is -inf - (-inf) = NaN (IEEE), as ONNX Runtime gives for the Cast.
        let cast_rule = |g: &Graph, p: Precision, fusion: FusionModel| {
            let prepared = prepare(g, p, fusion);
            assert!(prepared.weight_events().is_empty(), "{p} {fusion:?}");
            let y = out(g, &prepared);
            row0_masks(&y, if p == Precision::BFloat16 { 1e-2 } else { 1e-3 });
            assert!(y[4..].iter().all(|v| v.is_nan()), "{p} {fusion:?}: {y:?}");
        };
        // An initializer a graph input overrides: the export casts it at run time.
        let mut overridable = masked_softmax();
        overridable.overridable.insert("mask".into());
        // A folded weight (computed from an initializer by a node the export keeps).
        let mut folded = masked_softmax();
        let m = folded.initializers.remove("mask").unwrap();
        folded.initializers.insert("m".into(), m);
        folded
            .nodes
            .insert(0, node("id", "Identity", &["m"], &["mask"]));
        crate::fold::fold_weights(&mut folded);
        assert!(folded.folded.contains_key("mask"));
        assert!(folded.constant_initializer("mask").is_none());
        let g = masked_softmax();
        for fusion in [FusionModel::None, FusionModel::TensorRt] {
            cast_rule(&overridable, Precision::Float16, fusion);
            cast_rule(&folded, Precision::Float16, fusion);
            // bfloat16: -3.4028235e38 rounds to -inf (bfloat16's largest is 3.3895e38).
            cast_rule(&g, Precision::BFloat16, fusion);
        }
    }

    /// TensorRT 11.3's float16 attention with FP32 accumulation (docs/numerics.md, "Fusion
    /// rules", row "attention, upcast"): a float32 attention between float16 projections
    /// runs, under `--fusion tensorrt`, as the same graph with the kernel's roundings written
    /// out as Casts through float16 — the mask and the scale as it reads them, the
    /// probabilities before ·V and the output — with f32 accumulation whatever `--accumulate`
    /// says, and no longer as the plain float32 layers it runs as without fusion.
    #[test]
    fn an_upcast_attention_reads_its_operands_and_probabilities_in_float16() {
        use crate::exec::fusion::tests::{projected_attention_block, ATTENTION};
        use crate::graph::Attribute;
        let g = projected_attention_block();
        let cast = |name: &str, x: &str, y: &str, to: DType| {
            let mut n = node(name, "Cast", &[x], &[y]);
            n.attrs
                .insert("to".into(), Attribute::Int(to.onnx_code() as i64));
            n
        };
        // The same graph with the roundings as Casts (float16 and back).
        let mut explicit = g.clone();
        let through_f16 = |g: &mut Graph, at: usize, v: &str| {
            let (h, r) = (format!("{v}_h"), format!("{v}_r"));
            g.nodes
                .insert(at, cast(&format!("{v}_up"), &h, &r, DType::F32));
            g.nodes
                .insert(at, cast(&format!("{v}_down"), v, &h, DType::F16));
            r
        };
        let pos = |g: &Graph, n: &str| g.nodes.iter().position(|x| x.name == n).unwrap();
        let at = pos(&explicit, "o_proj");
        let a = through_f16(&mut explicit, at, "a");
        let at = pos(&explicit, "o_proj");
        explicit.nodes[at].inputs[0] = a;
        let at = pos(&explicit, "av");
        let p = through_f16(&mut explicit, at, "p");
        let at = pos(&explicit, "av");
        explicit.nodes[at].inputs[0] = p;
        let at = pos(&explicit, "mask");
        let m = through_f16(&mut explicit, at, "m");
        let at = pos(&explicit, "mask");
        explicit.nodes[at].inputs[1] = m;
        let sc = explicit.initializers["sc"].as_f32().unwrap()[0];
        assert_ne!(f16::from_f32(sc).to_f32(), sc, "√8 is no float16 value");
        explicit.initializers.insert(
            "sc".into(),
            Tensor::from_f32(vec![1], vec![f16::from_f32(sc).to_f32()]),
        );
        let explicit = crate::graph::testing::graph(
            explicit.nodes.clone(),
            explicit.inputs.clone(),
            explicit.outputs.clone(),
            explicit
                .initializers
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect(),
        );
        let mut feeds = Feeds::new();
        let x = (0..128)
            .map(|i| ((i * 53 % 97) as f32 / 97.0 - 0.5) * 3.0)
            .collect();
        feeds.insert("x".into(), Tensor::from_f32(vec![1, 8, 16], x));
        // An additive mask of values float16 does not hold.
        let m: Vec<f32> = (0..64).map(|i| -((i % 5) as f32) * 0.3 - 0.01).collect();
        feeds.insert("m".into(), Tensor::from_f32(vec![1, 8, 8], m));
        let run = |g: &Graph, fusion: FusionModel, accumulate: Accumulator| {
            let layers = g
                .nodes
                .iter()
                .map(|n| {
                    if ATTENTION.contains(&n.name.as_str()) || is_data_movement(n) {
                        Precision::Float32
                    } else {
                        Precision::Float16
                    }
                })
                .collect();
            let mut plan = PrecisionPlan::from_layers(layers);
            plan.fusion = fusion;
            let opts = PlanOptions {
                accumulate,
                ..Default::default()
            };
            let prepared = PreparedPlan::new(g, &plan, &opts).unwrap();
            let upcast: Vec<bool> = prepared
                .derived_regions()
                .iter()
                .map(|r| r.upcast_attention)
                .collect();
            let r = Interpreter::new(g)
                .unwrap()
                .run_plan(&feeds, &RunOptions::default(), &prepared)
                .unwrap();
            let y: Vec<u32> = r.outputs[0]
                .1
                .as_f32()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect();
            (y, upcast)
        };
        for acc in [Accumulator::F32, Accumulator::F16] {
            let (fused, regions) = run(&g, FusionModel::TensorRt, acc);
            assert_eq!(regions, [true], "{acc:?}");
            let (want, regions) = run(&explicit, FusionModel::None, acc);
            assert!(regions.is_empty());
            assert_eq!(fused, want, "{acc:?}: the roundings of the float16 kernel");
            let (plain, _) = run(&g, FusionModel::None, acc);
            assert_ne!(fused, plain, "{acc:?}: the float32 layers round nothing");
        }
    }
}
