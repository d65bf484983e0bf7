//! Operator kernels, one file per op family, and the registry that maps an ONNX `op_type`
//! to its kernel.
//!
//! A kernel receives the node (for attributes), the opset of its domain and its inputs
//! (`None` for an omitted optional input) and returns its outputs. Kernels compute in the
//! precision of their inputs' dtype (f32 for f32 tensors); reduced-precision emulation wraps
//! kernels from the outside (see docs/numerics.md).

pub mod attention;
pub mod attrs;
pub mod bitwise;
pub mod cast;
pub mod contrib;
pub mod control;
pub mod conv;
pub mod detection;
pub mod elementwise;
pub mod indexing;
pub mod int_gemm;
pub mod integer;
pub mod isa;
pub mod lanewise;
pub(crate) mod logistic;
pub mod matmul;
pub(crate) mod mlas_sgemm;
pub mod movement;
pub mod norm;
pub(crate) mod ort_norm;
pub mod pool;
pub mod prepacked;
pub mod qlinear;
pub mod quantize;
pub mod recurrent;
pub mod reduce;
pub mod resize;
pub(crate) mod rms_decomposed;
pub mod sampling;
pub mod sgemm;
pub mod shape;
pub mod signal;
pub mod softmax;
pub mod unique;
pub mod util;
pub(crate) mod vector;

use crate::graph::fact::{DimFact, Fact};
use crate::graph::{Graph, Node};
use crate::numeric::Rounding;
use crate::tensor::Tensor;
use std::collections::HashMap;
use std::sync::OnceLock;

/// What a kernel applies to each finished piece of a float32 output while it is still in
/// cache: a layer's output rounding ([`OpCtx::rounder`]), or nothing.
pub type Finish = dyn Fn(&mut [f32]) + Sync;

/// Which channels the values handed to an epilogue belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channels {
    /// Every value is of this channel (a plane of an [N, C, ...] output).
    One(usize),
    /// Value i is of channel `first + i` (a row of an output whose last axis is the channel).
    From(usize),
}

impl Channels {
    /// The channels of the values from `offset` on.
    pub fn skip(self, offset: usize) -> Channels {
        match self {
            Channels::One(c) => Channels::One(c),
            Channels::From(f) => Channels::From(f + offset),
        }
    }
}

/// Finished values of a kernel's output handed to its epilogue: their channels, and where they
/// lie in the output (value i at flat index `start + i·step`), so that a stage that reads
/// another value of the output's shape (a residual Add) finds its operand's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub channels: Channels,
    pub start: usize,
    pub step: usize,
}

impl Piece {
    /// A run of consecutive values of one channel's plane from flat index `start`.
    pub fn plane(channel: usize, start: usize) -> Piece {
        Piece {
            channels: Channels::One(channel),
            start,
            step: 1,
        }
    }

    /// Consecutive values of channels `first`, `first + 1`, … from flat index `start`, each
    /// `step` values after the one before (a row of an output whose last axis is the channel:
    /// step 1; a position's channels of an [N, C, ...] output: step = the plane's size).
    pub fn row(first: usize, start: usize, step: usize) -> Piece {
        Piece {
            channels: Channels::From(first),
            start,
            step,
        }
    }

    /// The values from `offset` on.
    pub fn skip(self, offset: usize) -> Piece {
        Piece {
            channels: self.channels.skip(offset),
            start: self.start + offset * self.step,
            step: self.step,
        }
    }
}

/// A pointwise function applied in place to finished float32 values: a layer's epilogue
/// ([`OpCtx::epilogue`]).
pub type ChannelFn<'a> = dyn Fn(Piece, &mut [f32]) + Sync + 'a;

/// A layer's epilogue in the one form a kernel may compute as it stores each value, in
/// registers, instead of calling [`OpCtx::epilogue`] on pieces afterwards: for the value of
/// output channel `c` at flat index `i`, `x·scale[c] + shift[c]` (a product, then a sum), then
/// the sum with `operand[i]`, then `last`, each value rounded where `rounds` says — the
/// operations the epilogue applies, in its order, so the same bits
/// ([`OpCtx::store_epilogue`]).
#[derive(Clone, Copy, Debug)]
pub struct StoreEpilogue<'a> {
    pub scale: &'a [f32],
    pub shift: &'a [f32],
    /// A value of the output's shape added (a residual Add's other operand).
    pub operand: Option<&'a [f32]>,
    /// Whether the sum is `operand[i] + v` (the Add's first input is the operand) rather than
    /// `v + operand[i]`: the same value, but where both are NaN the first's payload comes out.
    pub operand_first: bool,
    pub last: Option<lanewise::Lanewise>,
    pub rounds: StoreRounds,
    /// Whether the values handed over already went through the affine stage and the
    /// roundings before and after it (a kernel's pass over them first: see
    /// [`StoreEpilogue::after_affine`]); the store then starts at the operand.
    pub affine_done: bool,
}

/// Where a [`StoreEpilogue`] rounds (an emulated float16 or bfloat16 plan's layers): per value
/// of the chain, its layer's output rounding, then the rounding its reader in the chain takes
/// it with where that layer's precision differs (each None: float32, as computed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreRounds {
    /// The kernel's output (the bias added).
    pub product: [Option<Rounding>; 2],
    /// The affine stage's value.
    pub affine: [Option<Rounding>; 2],
    /// The operand as the Add reads it.
    pub operand: Option<Rounding>,
    /// The sum with the operand.
    pub sum: [Option<Rounding>; 2],
    /// `last`'s value (none where `last` keeps the values on the layer's grid, as its own
    /// kernel then skips the rounding).
    pub last: [Option<Rounding>; 2],
}

impl StoreRounds {
    /// Whether nothing is rounded.
    pub fn is_empty(&self) -> bool {
        *self == StoreRounds::default()
    }
}

/// `v` rounded by each of `rounds` in turn.
#[inline(always)]
pub fn rounded_by(v: f32, rounds: [Option<Rounding>; 2]) -> f32 {
    let mut v = v;
    for r in [rounds[0], rounds[1]].into_iter().flatten() {
        v = r.round(v);
    }
    v
}

impl StoreEpilogue<'_> {
    /// The rest of the epilogue for values that went through its affine stage already (the
    /// kernel output's rounding, the affine stage, its rounding).
    pub fn after_affine(&self) -> Self {
        let mut rest = *self;
        rest.affine_done = true;
        (rest.rounds.product, rest.rounds.affine) = ([None, None], [None, None]);
        rest
    }

    /// The finished value of `x`, output channel `ch`, flat index `i`.
    #[inline(always)]
    // The sum is the same value either way; written in the Add's order for the NaN payload
    // where two NaNs meet (which the compiler may still swap: docs/numerics.md).
    #[allow(clippy::if_same_then_else)]
    pub fn value(&self, x: f32, ch: usize, i: usize) -> f32 {
        let r = &self.rounds;
        let mut v = match self.affine_done {
            true => x,
            false => rounded_by(
                rounded_by(x, r.product) * self.scale[ch] + self.shift[ch],
                r.affine,
            ),
        };
        if let Some(o) = self.operand {
            let o = r.operand.map_or(o[i], |r| r.round(o[i]));
            v = rounded_by(if self.operand_first { o + v } else { v + o }, r.sum);
        }
        match self.last {
            Some(l) => rounded_by(l.apply(v), r.last),
            None => v,
        }
    }
}

/// What a pointwise op computes as a stage of the epilogue of the kernel before it
/// (docs/architecture.md, "Epilogues"): exactly the float32 values its own kernel computes,
/// before the layer's output rounding.
pub enum Stage {
    /// In place on values of the chained value (their channels, values).
    Map(Box<MapFn>),
    /// `x · scale[c] + shift[c]` for channel c, a product then a sum, each rounded to f32
    /// (BatchNormalization's kernel): a Map the epilogue can fuse with the stages after it
    /// into one pass ([`crate::exec`]'s epilogues).
    Affine { scale: Vec<f32>, shift: Vec<f32> },
    /// Two chained values of the same shape combined elementwise, `a[i] = f(a[i], b[i])`, `a`
    /// the op's first input (slices of the same length).
    Combine(Box<CombineFn>),
    /// One IEEE operation per value with constants the same for every channel: the epilogue
    /// rounds each result in the same pass, or not at all where the operation keeps values
    /// in the format ([`lanewise`]).
    Lanewise(lanewise::Lanewise),
    /// Two chained values combined by one IEEE operation, `a[i] = a[i] op b[i]` (as
    /// `Combine`, rounded in the same pass).
    Zip(lanewise::Binary),
}

/// `v[i] = f(v[i])` for an epilogue's one-input stage, told the values' channels (Send:
/// interpreters keep epilogues for later runs, `exec::epilogue::Cache`).
pub type MapFn = dyn Fn(Channels, &mut [f32]) + Send + Sync;

/// `a[i] = f(a[i], b[i])` for an epilogue's two-input stage.
pub type CombineFn = dyn Fn(&mut [f32], &[f32]) + Send + Sync;

/// The chained values of an epilogue: float32 tensors of this rank with `channels` values
/// along `axis` (1 for [N, C, ...], rank − 1 for a matrix product's columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChainShape {
    pub rank: usize,
    pub channels: usize,
    pub axis: usize,
}

/// Makes a node's epilogue stage: `inputs` as its kernel would get them, None for the inputs
/// that are chained values (`chained[i]`, of shape `shape`, never materialized). None where
/// the op cannot be a stage on these inputs (its kernel then runs on its own); an error where
/// its kernel would fail.
pub type StageFn =
    fn(&OpCtx, &[Option<&Tensor>], &[bool], ChainShape) -> Result<Option<Stage>, OpError>;

/// The shape of the output an epilogue anchor will produce from these inputs.
pub type EpilogueShapeFn = fn(&[Option<&Tensor>]) -> Option<ChainShape>;

/// An integer kernel's output converted to float32 and multiplied by `scale`, in one pass:
/// what the layers `Cast(to=FLOAT) → Mul(scale)` after it compute (ONNX Runtime's dynamic
/// quantization writes them; its MatMulIntegerToFloat fuses them the same way), the same bits:
/// `(float)acc · scale`, one rounding each. `scale`: the Mul's other input, as the Mul reads
/// it. [`ScaledRounding`]: what a reduced-precision Mul rounds, which the kernel then applies
/// in the same pass. Ok(None) where that scale would broadcast the output to another shape, or
/// is not float32 (the layers then run one by one). The kernel then applies the epilogue
/// [`OpCtx::epilogue_for`] hands it, if any: the pointwise chain after the Mul.
pub type ScaledFn =
    fn(&OpCtx, &[Option<&Tensor>], &Tensor, ScaledRounding) -> Result<Option<Tensor>, OpError>;

/// The float16/bfloat16 roundings of a reduced-precision Mul fused into a [`ScaledFn`]:
/// `cast` of the Cast's values as the Mul reads them (`(float)acc` rounded before the
/// product), `output` of the product (the Mul's output, which the interpreter then leaves as
/// it is). None: not rounded.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScaledRounding {
    pub cast: Option<crate::numeric::Rounding>,
    pub output: Option<crate::numeric::Rounding>,
}

/// What a kernel knows about the node it runs.
pub struct OpCtx<'a> {
    pub node: &'a Node,
    /// Opset version of the node's domain.
    pub opset: i64,
    /// Runs the node's subgraphs (If/Loop/Scan bodies) in the enclosing scope; None outside
    /// an interpreter.
    pub subgraphs: Option<&'a dyn SubgraphRunner>,
    /// What matmul/conv products and sums accumulate in: the layer's accumulator under a
    /// precision plan (`--accumulate`), f32 otherwise.
    pub accumulate: crate::numeric::Accumulator,
    /// What a multi-step kernel (LSTM, GRU, RNN) rounds its state to after every step: the
    /// layer's float16/bfloat16 under a precision plan, f32 otherwise.
    pub state: crate::numeric::StateType,
    /// What the layer's float32 outputs are rounded to: float16 or bfloat16 under a precision
    /// plan, None otherwise. A kernel may round each piece of its output as it finishes it,
    /// while the piece is still in the cache of the thread that wrote it
    /// ([`OpCtx::rounder`]), and then say so ([`OpCtx::outputs_rounded`]); the interpreter
    /// rounds the outputs of every other kernel in a pass of its own. The values are the same
    /// either way (rounding is elementwise); a separate pass reads every output once more,
    /// mostly from the other core's cache.
    pub round_to: Option<crate::numeric::Rounding>,
    /// Set by [`OpCtx::outputs_rounded`].
    pub rounded: std::sync::atomic::AtomicBool,
    /// Per input of the node: where the kernel may keep forms derived from it, for an input
    /// whose values are the same on every run ([`prepacked`]); shorter than the inputs, or
    /// None, where there is no such place.
    pub prepacked: &'a [Option<&'a prepacked::Prepacked>],
    /// The pointwise layers after this one, fused into it (a kernel registered with
    /// [`OpDef::epilogue`] only): applied to each finished channel of its float32 output in
    /// place of `round_to`, which the interpreter puts into it. The kernel says it did with
    /// [`OpCtx::epilogue_applied`]. Kernels take it through [`OpCtx::epilogue_for`].
    pub epilogue: Option<&'a ChannelFn<'a>>,
    /// The only output shape the epilogue may be applied to, where it reads other values of
    /// that shape (a residual Add's operand); None where any shape will do.
    pub epilogue_shape: Option<&'a [usize]>,
    /// The epilogue for an output of another shape than `epilogue_shape` (fewer layers).
    pub epilogue_otherwise: Option<&'a ChannelFn<'a>>,
    /// Set by [`OpCtx::epilogue_for`] where it handed out `epilogue_otherwise`.
    pub took_otherwise: std::sync::atomic::AtomicBool,
    /// `epilogue` in the form a kernel may compute as it stores its values, where it has one
    /// (kernels take it through [`OpCtx::store_epilogue`]).
    pub epilogue_store: Option<StoreEpilogue<'a>>,
    /// Per input of the node: a constant float32 weight handed over as stored, which the
    /// kernel rounds to this type as it reads it (only inputs its op registered with
    /// [`OpDef::rounds_weights`]; shorter than the inputs, or empty, where there is none).
    /// The layer's values are those of the rounded weight; no rounded copy is kept.
    pub weight_rounding: &'a [Option<crate::numeric::Rounding>],
}

impl<'a> OpCtx<'a> {
    /// The context of a node without subgraphs.
    pub fn new(node: &'a Node, opset: i64) -> OpCtx<'a> {
        OpCtx {
            node,
            opset,
            subgraphs: None,
            accumulate: crate::numeric::Accumulator::F32,
            state: crate::numeric::StateType::F32,
            round_to: None,
            rounded: std::sync::atomic::AtomicBool::new(false),
            prepacked: &[],
            epilogue: None,
            epilogue_shape: None,
            epilogue_otherwise: None,
            took_otherwise: std::sync::atomic::AtomicBool::new(false),
            epilogue_store: None,
            weight_rounding: &[],
        }
    }

    /// The epilogue, for a kernel about to write an output of `shape`: `epilogue`, or
    /// `epilogue_otherwise` where that was made for another shape (None where there is none:
    /// the kernel then leaves the fused layers to run on their own). The kernel applies what
    /// it gets to every value of that output, or to none.
    pub fn epilogue_for(&self, shape: &[usize]) -> Option<&'a ChannelFn<'a>> {
        self.epilogue?;
        if self.epilogue_shape.is_none_or(|s| s == shape) {
            return self.epilogue;
        }
        self.took_otherwise
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.epilogue_otherwise
    }

    /// The epilogue [`OpCtx::epilogue_for`] handed out, in its store form where it has one (not
    /// for `epilogue_otherwise`): a kernel that stores its values with it applies it to every
    /// value and does not call the epilogue itself.
    pub fn store_epilogue(&self) -> Option<StoreEpilogue<'a>> {
        self.epilogue_store.filter(|_| !self.took_otherwise())
    }

    /// Whether [`OpCtx::epilogue_for`] handed out `epilogue_otherwise`.
    pub fn took_otherwise(&self) -> bool {
        self.took_otherwise
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The rounding the kernel applies to constant input `i` as it reads it, if any
    /// ([`OpCtx::weight_rounding`]).
    pub fn weight_rounding(&self, i: usize) -> Option<crate::numeric::Rounding> {
        self.weight_rounding.get(i).copied().flatten()
    }

    /// Where forms derived from input `i` may be kept, if its values are constant.
    pub fn prepacked(&self, i: usize) -> Option<&'a prepacked::Prepacked> {
        self.prepacked.get(i).copied().flatten()
    }

    /// What rounds a finished piece of a float32 output to the layer's precision (nothing
    /// outside a reduced-precision layer); `Sync`, for a kernel's parallel loops.
    pub fn rounder(&self) -> impl Fn(&mut [f32]) + Sync + Send + Copy {
        let p = self.round_to;
        move |v: &mut [f32]| {
            if let Some(p) = p {
                p.round_slice(v);
            }
        }
    }

    /// The kernel has rounded every float32 output it returns with [`OpCtx::rounder`] (but
    /// those its op keeps in their own type, [`OpDef::keeps_output_types`], which it leaves
    /// as computed).
    pub fn outputs_rounded(&self) {
        if self.round_to.is_some() {
            self.rounded
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The kernel has applied what [`OpCtx::epilogue_for`] gave it to every value of its
    /// output.
    pub fn epilogue_applied(&self) {
        if self.epilogue.is_some() {
            self.rounded
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Whether the kernel rounded its outputs (or applied its epilogue) itself.
    pub fn did_round(&self) -> bool {
        self.rounded.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The node's typed attributes (see [`attrs`]), parsed once.
    pub fn attrs<T: std::any::Any>(&self) -> Result<&'a T, OpError> {
        attrs::of(self.node, self.opset)
    }
}

/// Runs the subgraphs of the node a kernel executes, with the interpreter, under the
/// precision the enclosing plan gives that node (see docs/numerics.md).
pub trait SubgraphRunner {
    /// Runs the subgraph of attribute `attr` with its formal inputs bound to `inputs`, in
    /// order; returns its outputs in declared order.
    fn run(&self, attr: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, OpError>;
}

/// A kernel's failure, in words a user can act on; the interpreter adds node name and op.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct OpError(pub String);

pub type OpResult = Result<Vec<Tensor>, OpError>;

/// A kernel function.
pub type Kernel = fn(&OpCtx, &[Option<&Tensor>]) -> OpResult;

/// Returns early from a kernel with a formatted [`OpError`].
#[macro_export]
macro_rules! op_bail {
    ($($arg:tt)*) => {
        return Err($crate::ops::OpError(format!($($arg)*)))
    };
}

/// Ops that only move, select or reshape data, or compute shapes: they never change a value, so
/// they carry their input's precision and are never candidates in a precision search. Derived
/// from each op's definition ([`OpDef::movement`]).
pub fn is_data_movement(node: &Node) -> bool {
    def_of(node).is_some_and(|d| d.movement)
}

/// Ops of operator-style quantization that compute on integer codes (ONNX Runtime's dynamic
/// quantization: DynamicQuantizeLinear, MatMulInteger, ConvInteger, com.microsoft's
/// MatMulIntegerToFloat, DynamicQuantizeMatMul, DynamicQuantizeLSTM; static: QLinear*, QGemm).
/// A float precision plan leaves them as they are: their float inputs and outputs (scales,
/// the float side of DynamicQuantizeLinear) are float32 in every schema that defines them, and
/// their products are exact integers, so only the float layers around them take the plan's
/// precision. Weight-only MatMulNBits is not one: it multiplies a float activation.
pub fn computes_in_integers(node: &Node) -> bool {
    let op = node.op_type.as_str();
    matches!(
        op,
        "DynamicQuantizeLinear"
            | "MatMulInteger"
            | "ConvInteger"
            | "QGemm"
            | "MatMulIntegerToFloat"
            | "DynamicQuantizeMatMul"
            | "DynamicQuantizeLSTM"
    ) || op.starts_with("QLinear")
}

/// A Q/DQ node: which of the two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qdq {
    Quantize,
    Dequantize,
}

/// THE rule for "is this node Q/DQ?": a QuantizeLinear or DequantizeLinear of the default
/// ONNX domain (`""`, also spelled `ai.onnx`), the ones the registry runs. Whether a model is
/// Q/DQ-quantized (`export::qdq::is_qdq_quantized`), Q/DQ absorbed into integer kernels
/// (`exec::qdq`), fusion regions, the Q/DQ strip and `quantize`'s refusal of a quantized
/// model all ask it here.
pub fn qdq(node: &Node) -> Option<Qdq> {
    if !domain_key(&node.domain).is_empty() {
        return None;
    }
    match node.op_type.as_str() {
        "QuantizeLinear" => Some(Qdq::Quantize),
        "DequantizeLinear" => Some(Qdq::Dequantize),
        _ => None,
    }
}

/// The definition of a node's op, looked up by its domain and type.
pub fn def_of(node: &Node) -> Option<&'static OpDef> {
    Registry::global().def(&node.domain, &node.op_type)
}

/// The outputs of `node` that keep their own type under a float16/bfloat16 plan (none for an
/// op without a kernel).
pub fn kept_outputs(node: &Node) -> &'static [usize] {
    def_of(node).map_or(&[], |d| d.kept_outputs())
}

/// What an input of an op is, for precision and quantization: only `Data`, `Bias` and
/// `WeightScale` inputs take the layer's precision; scales, zero points and parameters keep
/// their own type (ONNX gives them their own type constraint, and rounding a scale would move
/// the quantization grid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputRole {
    /// An activation or weight operand.
    Data,
    /// Added after the product (Conv/Gemm `B`/`C`): follows a float precision, stays f32 under
    /// int8/fp8.
    Bias,
    /// A quantization scale.
    Scale,
    /// A quantization zero point.
    ZeroPoint,
    /// A scale (or float zero point) of a weight-only quantized op whose schema gives it the
    /// activation's type (MatMulNBits' and GatherBlockQuantized's `T1`/`T2`): follows a float
    /// precision as a bias does — ONNX Runtime's float16 kernels take float16 scales —, keeps
    /// its type under int8/fp8 (docs/numerics.md, "Weight-only quantized ops").
    WeightScale,
    /// A shape, index, axis, ratio or other parameter.
    Param,
}

/// The axis of a weight operand that indexes output channels: `(node, input index, rank)`.
pub type ChannelAxisFn = fn(&Node, usize, usize) -> Option<usize>;

/// Floating-point operations of a node from its input and output shapes (a multiply-add counts
/// 2).
pub type FlopsFn = fn(&Node, &[Option<Vec<usize>>], &[Vec<usize>]) -> u64;

/// What the shape/type inference knows about the node it asks an op about.
pub struct InferCtx<'a> {
    pub node: &'a Node,
    /// Opset version of the node's domain.
    pub opset: i64,
    next_unknown: &'a std::cell::Cell<u64>,
}

impl<'a> InferCtx<'a> {
    pub fn new(node: &'a Node, opset: i64, next_unknown: &'a std::cell::Cell<u64>) -> Self {
        InferCtx {
            node,
            opset,
            next_unknown,
        }
    }

    /// The node's typed attributes (see [`attrs`]), parsed once.
    pub fn attrs<T: std::any::Any>(&self) -> Result<&'a T, OpError> {
        attrs::of(self.node, self.opset)
    }

    /// A fresh dimension that equals no other.
    pub fn unknown_dim(&self) -> DimFact {
        let id = self.next_unknown.get();
        self.next_unknown.set(id + 1);
        DimFact::unknown(id)
    }
}

/// An op's shape and type rule: output facts from input facts (`None` for an omitted optional
/// input). An error means the inputs contradict the op (the inference names the node).
pub type InferFn = fn(&InferCtx, &[Option<&Fact>]) -> Result<Vec<Fact>, OpError>;

/// Everything mixprec knows about one op, in one place: its kernel, its shape and type rule,
/// its cost, the role of each input, whether it only moves data, whether it has int8/fp8
/// kernels. Every table that used to list ops (data movement, precision input roles, weight
/// channel axes, FLOPs, export's data inputs) reads it.
#[derive(Clone)]
pub struct OpDef {
    pub op_type: &'static str,
    pub kernel: Kernel,
    /// Parses and validates the node's attributes into the op's typed value, once (None: the
    /// op has no attributes).
    pub parse: Option<attrs::ParseFn>,
    pub infer: Option<InferFn>,
    pub flops: Option<FlopsFn>,
    /// Only moves, selects or reshapes data, or computes shapes.
    pub movement: bool,
    /// Roles of the first inputs; inputs past the list are `Data`.
    roles: &'static [InputRole],
    /// Inputs quantized by an int8/fp8 kernel, and the channel axis of weight operands; None
    /// when the op has no quantized kernel (it falls back to a float type).
    quantized: Option<(&'static [usize], ChannelAxisFn)>,
    /// The output type is set by the op (an attribute or a fixed type), not by its data inputs.
    own_output_type: bool,
    /// How the op runs as a stage of the epilogue of the kernel before it.
    pub stage: Option<StageFn>,
    /// The kernel applies [`OpCtx::epilogue`] (it may anchor an epilogue), to an output of
    /// this shape.
    pub epilogue: Option<EpilogueShapeFn>,
    /// The kernel's integer output converted to float32 and scaled, for the Cast and Mul
    /// after it ([`ScaledFn`]).
    pub scaled: Option<ScaledFn>,
    /// Inputs the kernel rounds itself when a float16/bfloat16 plan hands it a constant
    /// float32 weight as stored ([`OpCtx::weight_rounding`]).
    rounds_weights: &'static [usize],
    /// Outputs that keep the type the op gives them whatever the layer's precision: never
    /// rounded to a float16/bfloat16 layer's type ([`OpDef::keeps_output_types`]).
    kept_outputs: &'static [usize],
}

impl OpDef {
    fn new(op_type: &'static str, kernel: Kernel) -> OpDef {
        OpDef {
            op_type,
            kernel,
            parse: None,
            infer: None,
            flops: None,
            movement: false,
            roles: &[],
            quantized: None,
            own_output_type: false,
            stage: None,
            epilogue: None,
            scaled: None,
            rounds_weights: &[],
            kept_outputs: &[],
        }
    }

    /// Outputs `outputs` keep their own type under a float16/bfloat16 plan: a recurrent state
    /// ONNX Runtime's 16-bit kernels keep in float32 (GatedDeltaNet's `final_state`), which
    /// the interpreter neither rounds nor marks as rounded.
    pub fn keeps_output_types(&mut self, outputs: &'static [usize]) -> &mut Self {
        self.kept_outputs = outputs;
        self
    }

    /// Whether output `index` keeps its own type under a 16-bit plan.
    pub fn keeps_output_type(&self, index: usize) -> bool {
        self.kept_outputs.contains(&index)
    }

    /// The outputs that keep their own type under a 16-bit plan ([`Self::keeps_output_types`]).
    pub fn kept_outputs(&self) -> &'static [usize] {
        self.kept_outputs
    }

    /// The kernel rounds constant float32 weights at `inputs` to a float16/bfloat16 layer's
    /// type as it reads them ([`OpCtx::weight_rounding`]), so a plan keeps no rounded copy.
    pub fn rounds_weights(&mut self, inputs: &'static [usize]) -> &mut Self {
        self.rounds_weights = inputs;
        self
    }

    /// Whether the kernel rounds a constant weight at input `index` itself.
    pub fn rounds_weight(&self, index: usize) -> bool {
        self.rounds_weights.contains(&index)
    }

    /// How the op runs as an epilogue stage.
    pub fn stage(&mut self, f: StageFn) -> &mut Self {
        self.stage = Some(f);
        self
    }

    /// Marks the kernel as applying [`OpCtx::epilogue`] to its float32 output, whose shape
    /// `shape` tells before it runs.
    pub fn epilogue(&mut self, shape: EpilogueShapeFn) -> &mut Self {
        self.epilogue = Some(shape);
        self
    }

    /// The kernel can write its integer output converted to float32 and scaled
    /// ([`ScaledFn`]).
    pub fn scaled(&mut self, f: ScaledFn) -> &mut Self {
        self.scaled = Some(f);
        self
    }

    pub fn parse(&mut self, f: attrs::ParseFn) -> &mut Self {
        self.parse = Some(f);
        self
    }

    pub fn infer(&mut self, f: InferFn) -> &mut Self {
        self.infer = Some(f);
        self
    }

    pub fn flops(&mut self, f: FlopsFn) -> &mut Self {
        self.flops = Some(f);
        self
    }

    /// Marks the op as data movement: it never changes a value.
    pub fn movement(&mut self) -> &mut Self {
        self.movement = true;
        self
    }

    pub fn roles(&mut self, roles: &'static [InputRole]) -> &mut Self {
        self.roles = roles;
        self
    }

    /// The op has int8/fp8 kernels quantizing `operands`; `axis` gives a weight's channel axis.
    pub fn quantized(&mut self, operands: &'static [usize], axis: ChannelAxisFn) -> &mut Self {
        self.quantized = Some((operands, axis));
        self
    }

    /// The output's element type is the op's own (Cast's `to`, Shape's int64...).
    pub fn own_output_type(&mut self) -> &mut Self {
        self.own_output_type = true;
        self
    }

    pub fn role(&self, index: usize) -> InputRole {
        self.roles.get(index).copied().unwrap_or(InputRole::Data)
    }

    /// Whether the op has an int8/fp8 kernel.
    pub fn has_quantized_kernel(&self) -> bool {
        self.quantized.is_some()
    }

    /// Whether input `index` is quantized by the op's int8/fp8 kernel.
    pub fn is_quantized_operand(&self, index: usize) -> bool {
        self.quantized.is_some_and(|(ops, _)| ops.contains(&index))
    }

    /// The channel axis of a weight operand of rank `rank` (per-channel quantization).
    pub fn weight_channel_axis(&self, node: &Node, index: usize, rank: usize) -> Option<usize> {
        match self.quantized {
            Some((ops, axis)) if ops.contains(&index) && rank > 0 => axis(node, index, rank),
            _ => None,
        }
    }

    /// For a data-movement op: the inputs whose element type the outputs share (the data, not
    /// shapes or indices). Empty when the op sets its output type itself.
    pub fn type_shared_inputs(&self, n_inputs: usize) -> Vec<usize> {
        if self.own_output_type {
            return Vec::new();
        }
        (0..n_inputs)
            .filter(|&i| self.role(i) == InputRole::Data)
            .collect()
    }

    /// FLOPs of one node from its shapes: the op's own count, 0 for data movement, else one per
    /// output element.
    pub fn node_flops(&self, node: &Node, ins: &[Option<Vec<usize>>], outs: &[Vec<usize>]) -> u64 {
        if let Some(f) = self.flops {
            return f(node, ins, outs);
        }
        if self.movement {
            return 0;
        }
        outs.first()
            .map(|s| s.iter().product::<usize>() as u64)
            .unwrap_or(0)
    }
}

/// The registry's key for a domain: the default ONNX domain is `""` (also spelled `ai.onnx`).
pub(crate) fn domain_key(domain: &str) -> &str {
    if domain == "ai.onnx" {
        ""
    } else {
        domain
    }
}

/// Maps `(domain, op_type)` to op definitions: the default ONNX domain (`""`, also spelled
/// `ai.onnx`) and others such as `com.microsoft`. An op of one domain is never found under
/// another (com.microsoft `Gelu` is not ONNX `Gelu`).
#[derive(Default)]
pub struct Registry {
    /// Domain (`""` for the default ONNX domain) → op type → definition.
    defs: HashMap<&'static str, HashMap<&'static str, OpDef>>,
}

impl Registry {
    /// Adds an op of the default ONNX domain with its kernel; the returned definition takes
    /// the op's other facts.
    pub fn add(&mut self, op_type: &'static str, kernel: Kernel) -> &mut OpDef {
        self.add_in("", op_type, kernel)
    }

    /// Adds an op of `domain` (`""` for the default ONNX domain) with its kernel.
    pub fn add_in(
        &mut self,
        domain: &'static str,
        op_type: &'static str,
        kernel: Kernel,
    ) -> &mut OpDef {
        let ops = self.defs.entry(domain_key(domain)).or_default();
        ops.insert(op_type, OpDef::new(op_type, kernel));
        ops.get_mut(op_type).expect("just inserted")
    }

    /// The definition of an op of the default domain registered earlier, to add facts to it.
    ///
    /// # Panics
    /// When `op_type` was not registered: a mistake in mixprec's own registry, caught by
    /// `every_op_has_a_definition`.
    pub fn def_mut(&mut self, op_type: &str) -> &mut OpDef {
        self.defs
            .get_mut("")
            .and_then(|ops| ops.get_mut(op_type))
            .unwrap_or_else(|| panic!("op {op_type} is not registered"))
    }

    /// The definition of an op of a domain, if mixprec has one.
    pub fn def(&self, domain: &str, op_type: &str) -> Option<&OpDef> {
        self.defs.get(domain_key(domain))?.get(op_type)
    }

    /// The kernel for an op of a domain, if mixprec has one.
    pub fn get(&self, domain: &str, op_type: &str) -> Option<Kernel> {
        self.def(domain, op_type).map(|d| d.kernel)
    }

    /// Every op of `graph` and its subgraphs that has no kernel here, each once, in order of
    /// first use, with its node count and first node (by path inside subgraphs).
    pub fn unsupported_in(&self, graph: &Graph) -> Vec<crate::error::UnsupportedOp> {
        fn walk(r: &Registry, g: &Graph, prefix: &str, out: &mut Vec<crate::error::UnsupportedOp>) {
            for n in &g.nodes {
                if r.get(&n.domain, &n.op_type).is_none() {
                    let domain = if n.domain.is_empty() || n.domain == "ai.onnx" {
                        "ai.onnx".to_string()
                    } else {
                        n.domain.clone()
                    };
                    let opset = g.opset_of(&n.domain);
                    match out
                        .iter_mut()
                        .find(|u| u.op == n.op_type && u.domain == domain && u.opset == opset)
                    {
                        Some(u) => u.count += 1,
                        None => out.push(crate::error::UnsupportedOp {
                            domain,
                            op: n.op_type.clone(),
                            opset,
                            count: 1,
                            first_node: format!("{prefix}{}", n.name),
                        }),
                    }
                }
                for (attr, sg) in n.subgraphs() {
                    walk(r, sg, &format!("{prefix}{}/{attr}/", n.name), out);
                }
            }
        }
        let mut out = Vec::new();
        walk(self, graph, "", &mut out);
        out
    }

    /// The op types of the default ONNX domain, sorted.
    pub fn op_types(&self) -> Vec<&'static str> {
        self.op_types_in("")
    }

    /// The op types of `domain` (`""` for the default ONNX domain), sorted.
    pub fn op_types_in(&self, domain: &str) -> Vec<&'static str> {
        let mut v: Vec<_> = self
            .defs
            .get(domain_key(domain))
            .map(|ops| ops.keys().copied().collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// The registry with every kernel mixprec ships.
    pub fn global() -> &'static Registry {
        static REGISTRY: OnceLock<Registry> = OnceLock::new();
        REGISTRY.get_or_init(|| {
            let mut r = Registry::default();
            attention::register(&mut r);
            bitwise::register(&mut r);
            cast::register(&mut r);
            control::register(&mut r);
            contrib::register(&mut r);
            conv::register(&mut r);
            detection::register(&mut r);
            elementwise::register(&mut r);
            indexing::register(&mut r);
            integer::register(&mut r);
            matmul::register(&mut r);
            movement::register(&mut r);
            norm::register(&mut r);
            pool::register(&mut r);
            qlinear::register(&mut r);
            quantize::register(&mut r);
            recurrent::register(&mut r);
            reduce::register(&mut r);
            resize::register(&mut r);
            sampling::register(&mut r);
            signal::register(&mut r);
            softmax::register(&mut r);
            unique::register(&mut r);
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every unsupported op is named once with its count and first node, subgraphs included.
    #[test]
    fn unsupported_ops_are_listed_all_at_once() {
        use crate::graph::testing::{graph, node};
        use crate::graph::Attribute;
        let mut inner = graph(
            vec![
                node("deep", "FancyOp", &["a"], &["b"]),
                node("ok", "Relu", &["b"], &["c"]),
            ],
            vec![],
            vec![],
            vec![],
        );
        inner.opsets.insert("com.microsoft".into(), 1);
        let mut iff = node("if0", "If", &["cond"], &["y"]);
        iff.attrs.insert(
            "then_branch".into(),
            Attribute::Graph(std::sync::Arc::new(inner)),
        );
        let mut ms = node("g1", "WordConvEmbedding", &["x"], &["a"]);
        ms.domain = "com.microsoft".into();
        let mut g = graph(
            vec![
                node("f1", "FancyOp", &["x"], &["x1"]),
                ms,
                iff,
                node("r", "Relu", &["x"], &["z"]),
            ],
            vec![],
            vec![],
            vec![],
        );
        g.opsets.insert("com.microsoft".into(), 1);
        let u = Registry::global().unsupported_in(&g);
        let got: Vec<(&str, &str, i64, usize, &str)> = u
            .iter()
            .map(|u| {
                (
                    u.domain.as_str(),
                    u.op.as_str(),
                    u.opset,
                    u.count,
                    u.first_node.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("ai.onnx", "FancyOp", 17, 2, "f1"),
                ("com.microsoft", "WordConvEmbedding", 1, 1, "g1"),
            ]
        );
        let msg = crate::Error::UnsupportedOps(u).to_string();
        assert!(
            msg.starts_with("2 ops of the model are not supported"),
            "{msg}"
        );
        assert!(msg.contains("2 nodes, first 'f1'"), "{msg}");
        // A supported model lists nothing.
        let fine = graph(
            vec![node("r", "Relu", &["x"], &["y"])],
            vec![],
            vec![],
            vec![],
        );
        assert!(Registry::global().unsupported_in(&fine).is_empty());
    }

    /// Every op answers for its output shapes (Constant needs no rule: it is always folded).
    #[test]
    fn every_op_has_a_shape_rule() {
        let r = Registry::global();
        let missing: Vec<&str> = r
            .op_types()
            .into_iter()
            .filter(|op| *op != "Constant" && r.def("", op).is_some_and(|d| d.infer.is_none()))
            .collect();
        assert!(missing.is_empty(), "ops without a shape rule: {missing:?}");
    }

    #[test]
    fn facts_come_from_the_definitions() {
        let moves = |op: &str| is_data_movement(&crate::graph::testing::node("n", op, &[], &[]));
        assert!(moves("Reshape") && moves("Cast"));
        assert!(!moves("Conv") && !moves("CumSum"));
        assert!(!moves("NoSuchOp"));
        // The domain decides: an op of another domain with a movement op's name is not one.
        let mut foreign = crate::graph::testing::node("n", "Reshape", &[], &[]);
        foreign.domain = "com.example".into();
        assert!(!is_data_movement(&foreign));
        let r = Registry::global();
        let q = r.def("", "QuantizeLinear").unwrap();
        assert_eq!(q.role(1), InputRole::Scale);
        assert_eq!(q.role(2), InputRole::ZeroPoint);
        let conv = r.def("", "Conv").unwrap();
        assert!(conv.has_quantized_kernel() && conv.is_quantized_operand(1));
        assert!(!conv.is_quantized_operand(2), "biases stay f32 under int8");
        assert_eq!(r.def("", "Pad").unwrap().type_shared_inputs(4), vec![0, 2]);
        assert!(r.def("", "Shape").unwrap().type_shared_inputs(1).is_empty());
        assert!(r.def("com.microsoft", "Conv").is_none());
        assert!(r.def("ai.onnx", "Conv").is_some());
    }

    /// Ops are keyed by (domain, op_type): an op of one domain is never found under another
    /// of the same name, and `ai.onnx` is the default domain.
    #[test]
    fn ops_are_registered_per_domain() {
        fn onnx(_: &OpCtx, _: &[Option<&Tensor>]) -> OpResult {
            Ok(vec![Tensor::from_f32(vec![], vec![1.0])])
        }
        fn ms(_: &OpCtx, _: &[Option<&Tensor>]) -> OpResult {
            Ok(vec![Tensor::from_f32(vec![], vec![2.0])])
        }
        let mut r = Registry::default();
        r.add("Gelu", onnx);
        assert!(r.def("com.microsoft", "Gelu").is_none());
        r.add_in("com.microsoft", "Gelu", ms);
        r.add_in("com.microsoft", "FusedMatMul", ms);
        let run = |d: &str| {
            let node = crate::graph::testing::node("n", "Gelu", &[], &["y"]);
            let k = r.get(d, "Gelu").unwrap();
            k(&OpCtx::new(&node, 1), &[]).unwrap()[0].clone()
        };
        assert_eq!(run(""), Tensor::from_f32(vec![], vec![1.0]));
        assert_eq!(run("ai.onnx"), Tensor::from_f32(vec![], vec![1.0]));
        assert_eq!(run("com.microsoft"), Tensor::from_f32(vec![], vec![2.0]));
        assert!(r.def("", "FusedMatMul").is_none());
        assert!(r.def("com.example", "Gelu").is_none());
        assert_eq!(r.op_types(), vec!["Gelu"]);
        assert_eq!(r.op_types_in("com.microsoft"), vec!["FusedMatMul", "Gelu"]);
    }
}
