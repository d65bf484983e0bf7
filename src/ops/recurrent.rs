//! LSTM, GRU and RNN (ONNX opsets 7, 14, 22; `layout` from 14): forward, reverse and
//! bidirectional, `sequence_lens`, initial states, LSTM peepholes and `input_forget`, GRU's
//! `linear_before_reset`, `clip` and every activation of the spec with `activation_alpha`/
//! `activation_beta`.
//!
//! The kernel computes in f32 (float64/float16/bfloat16 inputs are taken to f32 and the outputs
//! converted back). `X·Wᵀ` for all steps is one product, `H·Rᵀ` one per step, both accumulating
//! in the layer's accumulator (`OpCtx::accumulate`, `--accumulate`); the gate nonlinearities run
//! in f32 and the new hidden (and cell) state is rounded to the layer's type after every step
//! (`OpCtx::state`), so a float16 layer carries float16 state from step to step as a float16
//! engine does (docs/numerics.md, "Recurrent layers").
//!
//! Where the spec leaves a choice, mixprec follows ONNX Runtime's CPU kernels (the reference of
//! `tests/integration/recurrent.rs`): activation names are case-insensitive, alpha/beta values
//! are consumed in the order of the activations that take them, with defaults 0.01 (LeakyRelu),
//! 0.2/0.5 (HardSigmoid), 1.0 (Elu) and 0 for the others; `clip` bounds every gate's input
//! before its activation; with `input_forget` the forget gate is `1 - i`; outputs of a batch
//! entry past its sequence length are 0 and its final state is the one after its last step;
//! the reverse direction of a shorter sequence starts at its last element; an entry of length 0
//! has final state 0.

use super::attrs::{boxed, AttrError, Attrs};
use super::matmul::sgemm;
use super::shape::{fact, opt_fact, FactsResult};
use super::util::{float_values as floats, input, opt_input};
use super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use crate::graph::fact::{DimFact, Fact};
use crate::graph::Node;
use crate::tensor::{DType, Tensor};

pub fn register(r: &mut Registry) {
    r.add("LSTM", lstm);
    r.add("GRU", gru);
    r.add("RNN", rnn);
    for op in ["LSTM", "GRU", "RNN"] {
        r.def_mut(op)
            .parse(|n, o| boxed(RecurrentAttrs::parse(n, o)))
            .infer(recurrent_facts)
            .flops(recurrent_flops)
            .roles(&[
                InputRole::Data,  // X
                InputRole::Data,  // W
                InputRole::Data,  // R
                InputRole::Bias,  // B
                InputRole::Param, // sequence_lens
                InputRole::Data,  // initial_h
                InputRole::Data,  // initial_c (LSTM)
                InputRole::Data,  // P (LSTM)
            ]);
    }
}

/// Which recurrent cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    fn of(op: &str) -> Cell {
        match op {
            "LSTM" | "DynamicQuantizeLSTM" => Cell::Lstm,
            "GRU" => Cell::Gru,
            _ => Cell::Rnn,
        }
    }

    /// Gates per direction (the row blocks of W and R).
    pub fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }

    /// Activation functions per direction (f; f, g; f, g, h).
    fn n_activations(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 2,
            Cell::Lstm => 3,
        }
    }

    fn default_activations(self) -> &'static [ActKind] {
        match self {
            Cell::Rnn => &[ActKind::Tanh],
            Cell::Gru => &[ActKind::Sigmoid, ActKind::Tanh],
            Cell::Lstm => &[ActKind::Sigmoid, ActKind::Tanh, ActKind::Tanh],
        }
    }

    /// Outputs: Y, Y_h (and Y_c for LSTM).
    fn n_outputs(self) -> usize {
        if self == Cell::Lstm {
            3
        } else {
            2
        }
    }
}

/// The activation functions the recurrent ops accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    Relu,
    Tanh,
    Sigmoid,
    Affine,
    LeakyRelu,
    ThresholdedRelu,
    ScaledTanh,
    HardSigmoid,
    Elu,
    Softsign,
    Softplus,
}

/// Name (lower case), kind, whether it takes alpha and beta, and their defaults (ONNX Runtime's).
const ACTIVATIONS: &[(&str, ActKind, bool, bool, f32, f32)] = &[
    ("relu", ActKind::Relu, false, false, 0.0, 0.0),
    ("tanh", ActKind::Tanh, false, false, 0.0, 0.0),
    ("sigmoid", ActKind::Sigmoid, false, false, 0.0, 0.0),
    ("affine", ActKind::Affine, true, true, 0.0, 0.0),
    ("leakyrelu", ActKind::LeakyRelu, true, false, 0.01, 0.0),
    (
        "thresholdedrelu",
        ActKind::ThresholdedRelu,
        true,
        false,
        0.0,
        0.0,
    ),
    ("scaledtanh", ActKind::ScaledTanh, true, true, 0.0, 0.0),
    ("hardsigmoid", ActKind::HardSigmoid, true, true, 0.2, 0.5),
    ("elu", ActKind::Elu, true, false, 1.0, 0.0),
    ("softsign", ActKind::Softsign, false, false, 0.0, 0.0),
    ("softplus", ActKind::Softplus, false, false, 0.0, 0.0),
];

/// One activation with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Activation {
    pub kind: ActKind,
    pub alpha: f32,
    pub beta: f32,
}

impl Activation {
    fn plain(kind: ActKind) -> Activation {
        Activation {
            kind,
            alpha: 0.0,
            beta: 0.0,
        }
    }

    /// The function over a gate's row as ONNX Runtime's LSTM applies it
    /// (rnn_helpers.cc `ActivationFuncByName` / `LstmMergeGatesFuncByName`): sigmoid and tanh
    /// are MLAS's `MlasComputeLogistic` / `MlasComputeTanh` (`ops::logistic`, bit for bit, in
    /// vectors), the others the scalar functions.
    fn apply_ort_lstm(&self, v: &mut [f32]) {
        match self.kind {
            ActKind::Sigmoid => super::logistic::map_in_place(v, &super::logistic::logistic),
            ActKind::Tanh => super::logistic::map_in_place(v, &super::logistic::tanh),
            _ => v.iter_mut().for_each(|x| *x = self.apply(*x)),
        }
    }

    /// The function at `x`, in f32 (NaN propagates; see docs/numerics.md).
    pub fn apply(&self, x: f32) -> f32 {
        let (a, b) = (self.alpha, self.beta);
        match self.kind {
            ActKind::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            ActKind::Tanh => x.tanh(),
            ActKind::Sigmoid => sigmoid(x),
            ActKind::Affine => a * x + b,
            ActKind::LeakyRelu => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            ActKind::ThresholdedRelu => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            ActKind::ScaledTanh => a * (b * x).tanh(),
            ActKind::HardSigmoid => {
                let y = a * x + b;
                if y.is_nan() {
                    y
                } else {
                    y.clamp(0.0, 1.0)
                }
            }
            ActKind::Elu => {
                if x >= 0.0 {
                    x
                } else {
                    a * x.exp_m1()
                }
            }
            ActKind::Softsign => x / (1.0 + x.abs()),
            ActKind::Softplus => {
                // log(1 + e^x) without overflow for large x.
                if x > 20.0 {
                    x + (-x).exp().ln_1p()
                } else {
                    x.exp().ln_1p()
                }
            }
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `direction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Reverse,
    Bidirectional,
}

/// The recurrent ops' attributes, validated once.
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentAttrs {
    pub cell: Cell,
    pub direction: Direction,
    /// `hidden_size` (>= 1); when absent the kernel takes it from R's shape.
    pub hidden_size: Option<usize>,
    /// The activations of each direction (`cell.n_activations()` each).
    pub activations: Vec<Vec<Activation>>,
    /// `clip` (> 0): every gate's input is bounded to [-clip, clip] before its activation.
    pub clip: Option<f32>,
    /// `layout` 1 (opset 14+): batch first.
    pub batch_first: bool,
    /// GRU's `linear_before_reset`.
    pub linear_before_reset: bool,
    /// LSTM's `input_forget`: the forget gate is `1 - i`.
    pub input_forget: bool,
    /// com.microsoft DynamicQuantizeLSTM: W and R are 8-bit codes laid out
    /// `[num_directions, K, 4*hidden_size]` (see `contrib/dynamic_quantize_lstm.rs`).
    pub quantized: bool,
}

impl RecurrentAttrs {
    pub fn num_directions(&self) -> usize {
        if self.direction == Direction::Bidirectional {
            2
        } else {
            1
        }
    }

    pub(crate) fn parse(node: &Node, opset: i64) -> Result<RecurrentAttrs, AttrError> {
        let a = Attrs::new(node);
        let cell = Cell::of(&node.op_type);
        let direction = a.choice(
            "direction",
            Direction::Forward,
            &[
                ("forward", Direction::Forward),
                ("reverse", Direction::Reverse),
                ("bidirectional", Direction::Bidirectional),
            ],
        )?;
        let dirs = if direction == Direction::Bidirectional {
            2
        } else {
            1
        };
        let hidden_size = match a.int("hidden_size")? {
            None => None,
            Some(h) if h >= 1 => Some(h as usize),
            Some(h) => {
                return Err(AttrError::new(
                    "hidden_size",
                    format!("must be >= 1, got {h}"),
                ))
            }
        };
        let n = cell.n_activations();
        let alphas = a.floats("activation_alpha")?.unwrap_or_default();
        let betas = a.floats("activation_beta")?.unwrap_or_default();
        let activations = match a.strings("activations")? {
            None => vec![
                cell.default_activations()
                    .iter()
                    .map(|&k| Activation::plain(k))
                    .collect::<Vec<_>>();
                dirs
            ],
            Some(names) => {
                if !(names.len() == n * dirs || (dirs == 2 && names.len() == n)) {
                    let want = if dirs == 2 {
                        format!("{n} (one set for both directions) or {}", 2 * n)
                    } else {
                        n.to_string()
                    };
                    return Err(AttrError::new(
                        "activations",
                        format!(
                            "{} needs {want} names for direction {:?}, got {}",
                            node.op_type,
                            direction,
                            names.len()
                        ),
                    ));
                }
                let (mut ai, mut bi) = (alphas.iter(), betas.iter());
                let mut parsed = Vec::with_capacity(names.len());
                for name in names {
                    let lower = name.to_ascii_lowercase();
                    let Some(&(_, kind, takes_alpha, takes_beta, da, db)) =
                        ACTIVATIONS.iter().find(|e| e.0 == lower)
                    else {
                        return Err(AttrError::new(
                            "activations",
                            format!(
                                "'{name}' is not one of Relu, Tanh, Sigmoid, Affine, LeakyRelu, \
                                 ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus"
                            ),
                        ));
                    };
                    let alpha = if takes_alpha {
                        ai.next().copied().unwrap_or(da)
                    } else {
                        0.0
                    };
                    let beta = if takes_beta {
                        bi.next().copied().unwrap_or(db)
                    } else {
                        0.0
                    };
                    parsed.push(Activation { kind, alpha, beta });
                }
                if parsed.len() == n * dirs {
                    parsed.chunks(n).map(<[Activation]>::to_vec).collect()
                } else {
                    vec![parsed; dirs]
                }
            }
        };
        let clip = match a.float("clip")? {
            Some(c) if c.is_nan() || c <= 0.0 => {
                return Err(AttrError::new("clip", format!("must be > 0, got {c}")))
            }
            c => c,
        };
        let batch_first = if opset >= 14 {
            match a.int_or("layout", 0)? {
                0 => false,
                1 => true,
                l => return Err(AttrError::new("layout", format!("must be 0 or 1, got {l}"))),
            }
        } else {
            false
        };
        let linear_before_reset = cell == Cell::Gru && a.flag("linear_before_reset", false)?;
        let input_forget = cell == Cell::Lstm && a.flag("input_forget", false)?;
        Ok(RecurrentAttrs {
            cell,
            direction,
            hidden_size,
            activations,
            clip,
            batch_first,
            linear_before_reset,
            input_forget,
            quantized: node.op_type == "DynamicQuantizeLSTM",
        })
    }
}

/// Output facts: Y `[seq, dirs, batch, hidden]` (layout 1: `[batch, seq, dirs, hidden]`), Y_h
/// and Y_c `[dirs, batch, hidden]` (layout 1: `[batch, dirs, hidden]`), in X's type.
pub(crate) fn recurrent_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let a = ctx.attrs::<RecurrentAttrs>()?;
    let x = fact(ins, 0)?;
    let dirs = DimFact::known(a.num_directions());
    let hidden = match a.hidden_size {
        Some(h) => DimFact::known(h),
        None => match fact(ins, 2)?.shape.as_deref() {
            Some([_, h, _]) if a.quantized => h.clone(),
            Some([_, _, h]) if !a.quantized => h.clone(),
            _ => ctx.unknown_dim(),
        },
    };
    // Weights whose shapes are known must agree with the attributes.
    for (i, name) in [(1, "W"), (2, "R")] {
        if let Some(s) = fact(ins, i)?.shape.as_deref() {
            if s.len() != 3 {
                return Err(OpError(format!(
                    "{name} must have rank 3, got rank {}",
                    s.len()
                )));
            }
            if s[0].as_known().is_some_and(|d| d != a.num_directions()) {
                return Err(OpError(format!(
                    "{name} has {} directions, direction {:?} needs {}",
                    s[0],
                    a.direction,
                    a.num_directions()
                )));
            }
        }
    }
    let _ = opt_fact(ins, 3);
    let (y, state) = match x.shape.as_deref() {
        Some(s) if s.len() == 3 => {
            let (seq, batch) = if a.batch_first {
                (s[1].clone(), s[0].clone())
            } else {
                (s[0].clone(), s[1].clone())
            };
            if a.batch_first {
                (
                    Some(vec![batch.clone(), seq, dirs.clone(), hidden.clone()]),
                    Some(vec![batch, dirs, hidden]),
                )
            } else {
                (
                    Some(vec![seq, dirs.clone(), batch.clone(), hidden.clone()]),
                    Some(vec![dirs, batch, hidden]),
                )
            }
        }
        Some(s) => return Err(OpError(format!("X must have rank 3, got rank {}", s.len()))),
        None => (None, None),
    };
    let mut out = vec![Fact::new(x.dtype, y), Fact::new(x.dtype, state.clone())];
    if a.cell == Cell::Lstm {
        out.push(Fact::new(x.dtype, state));
    }
    Ok(out)
}

/// 2 FLOPs per multiply-add of `X·Wᵀ` and `H·Rᵀ` over every step and direction, plus the gate
/// arithmetic (about 8 per gate element).
pub(crate) fn recurrent_flops(node: &Node, ins: &[Option<Vec<usize>>], _: &[Vec<usize>]) -> u64 {
    let (Some(Some(x)), Some(Some(w)), Some(Some(r))) = (ins.first(), ins.get(1), ins.get(2))
    else {
        return 0;
    };
    if x.len() != 3 || w.len() != 3 || r.len() != 3 {
        return 0;
    }
    let rows = (x[0] * x[1]) as u64;
    let (dirs, gh, input, hidden) = if node.op_type == "DynamicQuantizeLSTM" {
        (w[0] as u64, w[2] as u64, w[1] as u64, r[1] as u64)
    } else {
        (w[0] as u64, w[1] as u64, w[2] as u64, r[2] as u64)
    };
    rows * dirs * gh * (2 * (input + hidden) + 8)
}

/// Checks that tensor `what` has `want` as its shape, naming it otherwise.
fn expect_shape(t: &Tensor, what: &str, want: &[usize], meaning: &str) -> Result<(), OpError> {
    if t.shape() != want {
        return Err(OpError(format!(
            "{what} has shape {:?}, expected {want:?} ({meaning})",
            t.shape()
        )));
    }
    Ok(())
}

/// Transposes the first two axes of a `[a, b, rest]` buffer.
fn swap01(v: &[f32], a: usize, b: usize, rest: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for i in 0..a {
        for j in 0..b {
            let src = (i * b + j) * rest;
            let dst = (j * a + i) * rest;
            out[dst..dst + rest].copy_from_slice(&v[src..src + rest]);
        }
    }
    out
}

fn lstm(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    run(ctx, inputs)
}

fn gru(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    run(ctx, inputs)
}

fn rnn(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    run(ctx, inputs)
}

/// A direction's weight matrix `W` or `R`.
pub(crate) enum Weights<'a> {
    /// ONNX's layout: f32 `[gates·hidden, K]`, multiplied transposed; with its transpose
    /// `[K, gates·hidden]` where the kernel keeps one (an f32 accumulator).
    Float(&'a [f32], Option<&'a [f32]>),
    /// DynamicQuantizeLSTM's: codes `[K, gates·hidden]`, multiplied after the rows of the
    /// other operand are quantized (`contrib/dynamic_quantize_lstm.rs`).
    Quant(QuantWeights<'a>),
}

/// One direction's quantized weights.
pub(crate) struct QuantWeights<'a> {
    /// Codes minus the zero point, `[K, gates·hidden]`.
    pub shifted: &'a [i32],
    /// The same integers as f32 (exact: at most 510 in magnitude).
    pub float: &'a [f32],
    /// The largest sum of |shifted| over one column: with the largest |code| of the other
    /// operand, a bound of every partial sum of the product.
    pub max_column_sum: u64,
    /// One scale, or one per column.
    pub scales: &'a [f32],
}

impl Weights<'_> {
    /// `C[m×n] (+)= A[m×k] · W`: the f32 product accumulating in `acc`, or the dynamically
    /// quantized integer product.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        acc: crate::numeric::Accumulator,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        c: &mut [f32],
        accumulate: bool,
    ) {
        match self {
            Weights::Float(_, Some(wt)) if acc == crate::numeric::Accumulator::F32 => {
                // mixprec's product, B's rows read where they lie: each element the in-order
                // chain over k, then added to C (product first, as the `gemm` crate and
                // ORT's MLAS add it). The `gemm` crate's one-row path ran Silero's
                // [1,128]·[128,512] at ~16 GFLOP/s.
                let b = super::sgemm::StridedB {
                    data: wt,
                    n,
                    rs: n,
                    cs: 1,
                };
                if accumulate {
                    let mut product = vec![0f32; m * n];
                    super::sgemm::gemm(m, n, k, a, k, 1, &b, &mut product, n, false);
                    c[..m * n]
                        .iter_mut()
                        .zip(&product)
                        .for_each(|(c, p)| *c += p);
                } else {
                    super::sgemm::gemm(m, n, k, a, k, 1, &b, c, n, false);
                }
            }
            Weights::Float(w, _) => sgemm(acc, m, n, k, a, false, w, true, c, accumulate),
            Weights::Quant(q) => super::contrib::dynamic_quantize_lstm::quantized_product(
                m, n, k, a, q, c, accumulate,
            ),
        }
    }

    /// The f32 weights; only LSTM takes quantized ones, and only through this type's product.
    fn float(&self) -> &[f32] {
        match self {
            Weights::Float(w, _) => w,
            Weights::Quant(_) => unreachable!("quantized weights are LSTM-only"),
        }
    }
}

/// All directions' `W` or `R`: f32 values or quantized codes.
#[derive(Debug)]
pub(crate) enum WeightSet<'t> {
    /// Borrowed from an f32 tensor, converted from other float types; with every direction's
    /// transpose where the kernel keeps one.
    Float(
        std::borrow::Cow<'t, [f32]>,
        Option<std::sync::Arc<Vec<f32>>>,
    ),
    /// Kept with the weight where its codes, scales and zero points are constants.
    Quant(std::sync::Arc<QuantSet>),
}

/// All directions' quantized `W` or `R` (DynamicQuantizeLSTM).
#[derive(Debug)]
pub(crate) struct QuantSet {
    /// Codes minus their direction's zero point, `[dirs, K, gates·hidden]`.
    pub shifted: Vec<i32>,
    /// `shifted` as f32 (exact).
    pub float: Vec<f32>,
    /// Per direction: the largest sum of |shifted| over one column.
    pub max_column_sums: Vec<u64>,
    /// `[dirs, 1]` or `[dirs, gates·hidden]`.
    pub scales: Vec<f32>,
}

impl QuantSet {
    /// The set of `dirs` directions of `[K, cols]` codes minus their zero points.
    pub fn new(shifted: Vec<i32>, scales: Vec<f32>, dirs: usize, cols: usize) -> QuantSet {
        let per_dir = shifted.len() / dirs.max(1);
        let max_column_sums = shifted
            .chunks(per_dir.max(1))
            .map(|d| {
                let mut sums = vec![0u64; cols];
                for row in d.chunks(cols.max(1)) {
                    for (s, v) in sums.iter_mut().zip(row) {
                        *s += v.unsigned_abs() as u64;
                    }
                }
                sums.into_iter().max().unwrap_or(0)
            })
            .collect();
        let float = shifted.iter().map(|&v| v as f32).collect();
        QuantSet {
            shifted,
            float,
            max_column_sums,
            scales,
        }
    }
}

impl WeightSet<'_> {
    fn dir(&self, d: usize, dirs: usize) -> Weights<'_> {
        match self {
            WeightSet::Float(v, t) => {
                let n = v.len() / dirs;
                Weights::Float(
                    &v[d * n..(d + 1) * n],
                    t.as_ref().map(|t| &t[d * n..(d + 1) * n]),
                )
            }
            WeightSet::Quant(q) => {
                let (n, ns) = (q.shifted.len() / dirs, q.scales.len() / dirs);
                Weights::Quant(QuantWeights {
                    shifted: &q.shifted[d * n..(d + 1) * n],
                    float: &q.float[d * n..(d + 1) * n],
                    max_column_sum: q.max_column_sums[d],
                    scales: &q.scales[d * ns..(d + 1) * ns],
                })
            }
        }
    }
}

/// One direction's parameters, as f32 slices (the weights possibly quantized).
struct DirParams<'a> {
    w: Weights<'a>,
    r: Weights<'a>,
    /// `Wb` and `Rb`, each `gates × hidden` (zeros when B is omitted).
    wb: &'a [f32],
    rb: &'a [f32],
    /// LSTM peepholes `P[iof]`.
    p: Option<&'a [f32]>,
    acts: &'a [Activation],
    reverse: bool,
}

/// Shapes of one call.
struct Dims {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
}

pub(crate) fn run(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<RecurrentAttrs>()?;
    let cell = attrs.cell;
    let g = cell.gates();
    let dirs = attrs.num_directions();
    let x_t = input(inputs, 0)?;
    if x_t.rank() != 3 {
        return Err(OpError(format!(
            "X has shape {:?}, expected rank 3 ({})",
            x_t.shape(),
            if attrs.batch_first {
                "[batch_size, seq_length, input_size]"
            } else {
                "[seq_length, batch_size, input_size]"
            }
        )));
    }
    let dtype = x_t.dtype();
    let (seq, batch, input_size) = if attrs.batch_first {
        (x_t.shape()[1], x_t.shape()[0], x_t.shape()[2])
    } else {
        (x_t.shape()[0], x_t.shape()[1], x_t.shape()[2])
    };
    let w_t = input(inputs, 1)?;
    let r_t = input(inputs, 2)?;
    let hidden = match attrs.hidden_size {
        Some(h) => h,
        None if r_t.rank() == 3 && attrs.quantized => r_t.shape()[1],
        None if r_t.rank() == 3 => r_t.shape()[2],
        None => {
            return Err(OpError(format!(
            "R has shape {:?}, expected rank 3 ([num_directions, {g}*hidden_size, hidden_size])",
            r_t.shape()
        )))
        }
    };
    let gh = g * hidden;
    let (w, r) = if attrs.quantized {
        use super::contrib::dynamic_quantize_lstm::quantized_weights;
        (
            quantized_weights(ctx, inputs, 1, "W", [dirs, input_size, gh], "input_size")?,
            quantized_weights(ctx, inputs, 2, "R", [dirs, hidden, gh], "hidden_size")?,
        )
    } else {
        expect_shape(
            w_t,
            "W",
            &[dirs, gh, input_size],
            &format!("[num_directions, {g}*hidden_size, input_size]"),
        )?;
        expect_shape(
            r_t,
            "R",
            &[dirs, gh, hidden],
            &format!("[num_directions, {g}*hidden_size, hidden_size]"),
        )?;
        let (w, r) = (
            super::util::float_slice(w_t, "W")?,
            super::util::float_slice(r_t, "R")?,
        );
        // Each direction's [gh, K] as [K, gh], for mixprec's product (kept with a constant
        // weight, made per run otherwise; an f16 accumulator keeps the emulating product).
        let transposed = |v: &[f32], k: usize, i: usize| {
            (ctx.accumulate == crate::numeric::Accumulator::F32).then(|| {
                super::prepacked::kept_or_made(
                    ctx.prepacked(i),
                    super::prepacked::tag::RECURRENT_TRANSPOSED,
                    || super::movement::permute::permute_f32(v, &[dirs, gh, k], &[0, 2, 1]),
                )
            })
        };
        // GRU's recurrent products read R's gate blocks as stored (`direction`): no transpose.
        let rt = if cell == Cell::Gru {
            None
        } else {
            transposed(&r, hidden, 2)
        };
        let wt = transposed(&w, input_size, 1);
        (WeightSet::Float(w, wt), WeightSet::Float(r, rt))
    };
    let mut x = floats(x_t, "X")?;
    if attrs.batch_first {
        x = swap01(&x, batch, seq, input_size);
    }
    let b = match opt_input(inputs, 3) {
        Some(t) => {
            expect_shape(
                t,
                "B",
                &[dirs, 2 * gh],
                &format!("[num_directions, {}*hidden_size]", 2 * g),
            )?;
            floats(t, "B")?
        }
        None => vec![0.0; dirs * 2 * gh],
    };
    let lens: Vec<usize> = match opt_input(inputs, 4) {
        Some(t) => {
            if !t.dtype().is_int() {
                return Err(OpError(format!(
                    "sequence_lens has dtype {}, expected int32",
                    t.dtype()
                )));
            }
            expect_shape(t, "sequence_lens", &[batch], "[batch_size]")?;
            let v = t.to_i64_vec().expect("integer");
            let mut out = Vec::with_capacity(v.len());
            for (i, &l) in v.iter().enumerate() {
                if l < 0 || l as usize > seq {
                    return Err(OpError(format!(
                        "sequence_lens[{i}] is {l}, expected a length in [0, {seq}]"
                    )));
                }
                out.push(l as usize);
            }
            out
        }
        None => vec![seq; batch],
    };
    let state_shape = if attrs.batch_first {
        [batch, dirs, hidden]
    } else {
        [dirs, batch, hidden]
    };
    let state_meaning = if attrs.batch_first {
        "[batch_size, num_directions, hidden_size]"
    } else {
        "[num_directions, batch_size, hidden_size]"
    };
    // Initial states as [dirs, batch, hidden].
    let initial = |i: usize, what: &str| -> Result<Option<Vec<f32>>, OpError> {
        match opt_input(inputs, i) {
            None => Ok(None),
            Some(t) => {
                expect_shape(t, what, &state_shape, state_meaning)?;
                let v = floats(t, what)?;
                Ok(Some(if attrs.batch_first {
                    swap01(&v, batch, dirs, hidden)
                } else {
                    v
                }))
            }
        }
    };
    let h0 = initial(5, "initial_h")?;
    let (c0, p) = if cell == Cell::Lstm {
        let c0 = initial(6, "initial_c")?;
        let p = match opt_input(inputs, 7) {
            Some(t) => {
                expect_shape(
                    t,
                    "P",
                    &[dirs, 3 * hidden],
                    "[num_directions, 3*hidden_size]",
                )?;
                Some(floats(t, "P")?)
            }
            None => None,
        };
        (c0, p)
    } else {
        (None, None)
    };
    // The buffers the kernel allocates: X·Wᵀ for every step and Y.
    super::util::checked_len(&[seq, batch, gh])?;
    super::util::checked_len(&[seq, dirs, batch, hidden])?;
    let dims = Dims {
        seq,
        batch,
        input: input_size,
        hidden,
    };
    let mut y = vec![0.0f32; seq * dirs * batch * hidden];
    let mut y_h = vec![0.0f32; dirs * batch * hidden];
    let mut y_c = vec![0.0f32; dirs * batch * hidden];
    for d in 0..dirs {
        let params = DirParams {
            w: w.dir(d, dirs),
            r: r.dir(d, dirs),
            wb: &b[d * 2 * gh..d * 2 * gh + gh],
            rb: &b[d * 2 * gh + gh..(d + 1) * 2 * gh],
            p: p.as_ref().map(|p| &p[d * 3 * hidden..(d + 1) * 3 * hidden]),
            acts: &attrs.activations[d],
            reverse: attrs.direction == Direction::Reverse || d == 1,
        };
        let sb = batch * hidden;
        let mut h = h0
            .as_ref()
            .map_or_else(|| vec![0.0; sb], |v| v[d * sb..(d + 1) * sb].to_vec());
        let mut c = c0
            .as_ref()
            .map_or_else(|| vec![0.0; sb], |v| v[d * sb..(d + 1) * sb].to_vec());
        // A float16/bfloat16 layer holds its initial state in its type (the plan rounded the
        // inputs already; this keeps kernels called directly consistent).
        h.iter_mut().for_each(|v| *v = ctx.state.round(*v));
        c.iter_mut().for_each(|v| *v = ctx.state.round(*v));
        direction(
            ctx, attrs, &params, &dims, &x, &lens, &mut h, &mut c, d, dirs, &mut y,
        );
        // A batch entry of length 0 runs no step: its final state is 0, as ONNX Runtime gives
        // (the spec does not say).
        for (bi, _) in lens.iter().enumerate().filter(|(_, &l)| l == 0) {
            h[bi * hidden..(bi + 1) * hidden].fill(0.0);
            c[bi * hidden..(bi + 1) * hidden].fill(0.0);
        }
        y_h[d * sb..(d + 1) * sb].copy_from_slice(&h);
        y_c[d * sb..(d + 1) * sb].copy_from_slice(&c);
    }
    let (y_shape, st_shape) = if attrs.batch_first {
        // [seq, dirs, batch, hidden] -> [batch, seq, dirs, hidden].
        let mut yb = vec![0.0f32; y.len()];
        for t in 0..seq {
            for d in 0..dirs {
                for bi in 0..batch {
                    let src = ((t * dirs + d) * batch + bi) * hidden;
                    let dst = ((bi * seq + t) * dirs + d) * hidden;
                    yb[dst..dst + hidden].copy_from_slice(&y[src..src + hidden]);
                }
            }
        }
        y = yb;
        y_h = swap01(&y_h, dirs, batch, hidden);
        y_c = swap01(&y_c, dirs, batch, hidden);
        (vec![batch, seq, dirs, hidden], vec![batch, dirs, hidden])
    } else {
        (vec![seq, dirs, batch, hidden], vec![dirs, batch, hidden])
    };
    let back = |shape: Vec<usize>, v: Vec<f32>| {
        let t = Tensor::from_f32(shape, v);
        if dtype == DType::F32 {
            t
        } else {
            super::cast::cast_tensor(&t, dtype)
        }
    };
    let mut outs = vec![back(y_shape, y), back(st_shape.clone(), y_h)];
    if cell == Cell::Lstm {
        outs.push(back(st_shape, y_c));
    }
    outs.truncate(ctx.node.outputs.len().clamp(1, cell.n_outputs()));
    Ok(outs)
}

/// Runs one direction over the sequence: `h` and `c` (`[batch, hidden]`) hold the initial state
/// and end holding the final one; each step's hidden state is written into `y`
/// (`[seq, dirs, batch, hidden]`) at direction `d`.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn direction(
    ctx: &OpCtx,
    attrs: &RecurrentAttrs,
    p: &DirParams,
    dims: &Dims,
    x: &[f32],
    lens: &[usize],
    h: &mut [f32],
    c: &mut [f32],
    d: usize,
    dirs: usize,
    y: &mut [f32],
) {
    let Dims {
        seq,
        batch,
        input,
        hidden,
    } = *dims;
    let cell = attrs.cell;
    let gh = cell.gates() * hidden;
    let acc = ctx.accumulate;
    let st = ctx.state;
    let clip = |v: f32| match attrs.clip {
        Some(b) => {
            if v > b {
                b
            } else if v < -b {
                -b
            } else {
                v
            }
        }
        None => v,
    };
    // X·Wᵀ for every step at once, [seq*batch, gates*hidden]: the rows of the steps any
    // sequence reaches (ONNX Runtime's quantized kernel takes its input range from those).
    let steps = lens.iter().copied().max().unwrap_or(0);
    let mut xw = vec![0.0f32; seq * batch * gh];
    p.w.product(
        acc,
        steps * batch,
        gh,
        input,
        &x[..steps * batch * input],
        &mut xw[..steps * batch * gh],
        false,
    );
    // ONNX Runtime writes 0 as the state of an entry past its length when Y is an output, and
    // that row enters the next step's product (and a quantized product's input range).
    let zero_finished =
        matches!(p.r, Weights::Quant(_)) && ctx.node.outputs.first().is_some_and(|o| !o.is_empty());
    let mut gates = vec![0.0f32; batch * gh];
    // LSTM: Wb + Rb (summed once, as ONNX Runtime does), the gates' activations of one batch
    // entry and h(C).
    let bias: Vec<f32> = match cell {
        Cell::Lstm => p.wb.iter().zip(p.rb).map(|(w, r)| w + r).collect(),
        _ => Vec::new(),
    };
    let mut pre = vec![0.0f32; if cell == Cell::Lstm { gh } else { 0 }];
    let mut c_act = vec![0.0f32; if cell == Cell::Lstm { hidden } else { 0 }];
    // GRU: the hidden gate's recurrent product, [batch, hidden].
    let mut hr = vec![0.0f32; batch * hidden];
    let mut rh = vec![0.0f32; batch * hidden];
    let (f, g2, h_act) = (
        p.acts[0],
        p.acts.get(1).copied().unwrap_or(p.acts[0]),
        p.acts.get(2).copied().unwrap_or(p.acts[0]),
    );
    for s in 0..seq {
        // Each batch entry's time position at this step, None once its sequence ended.
        let pos: Vec<Option<usize>> = lens
            .iter()
            .map(|&l| (s < l).then(|| if p.reverse { l - 1 - s } else { s }))
            .collect();
        if pos.iter().all(Option::is_none) {
            continue;
        }
        for (bi, t) in pos.iter().enumerate() {
            let row = &mut gates[bi * gh..(bi + 1) * gh];
            match t {
                Some(t) => {
                    row.copy_from_slice(&xw[(t * batch + bi) * gh..(t * batch + bi + 1) * gh])
                }
                None => row.fill(0.0),
            }
        }
        match cell {
            Cell::Rnn | Cell::Lstm => {
                let zeroed;
                let h_in: &[f32] = if zero_finished && lens.iter().any(|&l| l < s) {
                    let mut z = h.to_vec();
                    for (bi, _) in lens.iter().enumerate().filter(|(_, &l)| l < s) {
                        z[bi * hidden..(bi + 1) * hidden].fill(0.0);
                    }
                    zeroed = z;
                    &zeroed
                } else {
                    h
                };
                p.r.product(acc, batch, gh, hidden, h_in, &mut gates, true);
            }
            Cell::Gru => {
                // z and r take H·R[zr]ᵀ into their running sums; the hidden gate's product
                // comes after the reset gate (or separately, with linear_before_reset).
                let mut zr = vec![0.0f32; batch * 2 * hidden];
                for bi in 0..batch {
                    zr[bi * 2 * hidden..(bi + 1) * 2 * hidden]
                        .copy_from_slice(&gates[bi * gh..bi * gh + 2 * hidden]);
                }
                sgemm(
                    acc,
                    batch,
                    2 * hidden,
                    hidden,
                    h,
                    false,
                    &p.r.float()[..2 * hidden * hidden],
                    true,
                    &mut zr,
                    true,
                );
                for bi in 0..batch {
                    gates[bi * gh..bi * gh + 2 * hidden]
                        .copy_from_slice(&zr[bi * 2 * hidden..(bi + 1) * 2 * hidden]);
                }
            }
        }
        if cell == Cell::Gru {
            let rh_w = &p.r.float()[2 * hidden * hidden..];
            // z and r first (the reset gate feeds the hidden gate).
            for bi in 0..batch {
                let row = &mut gates[bi * gh..(bi + 1) * gh];
                for k in 0..2 * hidden {
                    row[k] = f.apply(clip(row[k] + p.wb[k] + p.rb[k]));
                }
            }
            if attrs.linear_before_reset {
                sgemm(
                    acc, batch, hidden, hidden, h, false, rh_w, true, &mut hr, false,
                );
            } else {
                for bi in 0..batch {
                    for k in 0..hidden {
                        rh[bi * hidden + k] = gates[bi * gh + hidden + k] * h[bi * hidden + k];
                    }
                }
                // The hidden gate's sum continues from X·Whᵀ.
                for bi in 0..batch {
                    hr[bi * hidden..(bi + 1) * hidden]
                        .copy_from_slice(&gates[bi * gh + 2 * hidden..(bi + 1) * gh]);
                }
                sgemm(
                    acc, batch, hidden, hidden, &rh, false, rh_w, true, &mut hr, true,
                );
            }
        }
        for (bi, t) in pos.iter().enumerate() {
            let Some(t) = *t else { continue };
            let row = &gates[bi * gh..(bi + 1) * gh];
            let hb = &mut h[bi * hidden..(bi + 1) * hidden];
            let cb = &mut c[bi * hidden..(bi + 1) * hidden];
            match cell {
                Cell::Rnn => {
                    for k in 0..hidden {
                        hb[k] = st.round(f.apply(clip(row[k] + p.wb[k] + p.rb[k])));
                    }
                }
                Cell::Gru => {
                    let (z, rg) = (&row[..hidden], &row[hidden..2 * hidden]);
                    for k in 0..hidden {
                        let (wbh, rbh) = (p.wb[2 * hidden + k], p.rb[2 * hidden + k]);
                        let pre = if attrs.linear_before_reset {
                            row[2 * hidden + k] + wbh + rg[k] * (hr[bi * hidden + k] + rbh)
                        } else {
                            hr[bi * hidden + k] + wbh + rbh
                        };
                        let cand = g2.apply(clip(pre));
                        hb[k] = st.round((1.0 - z[k]) * cand + z[k] * hb[k]);
                    }
                }
                Cell::Lstm => {
                    // As ONNX Runtime's LSTM (deep_cpu_lstm.cc GateComputations): a gate's
                    // pre-activation is (X·Wᵀ + H·Rᵀ + peephole) + (Wb + Rb), clipped; each gate's
                    // row then goes through its activation at once (sigmoid and tanh as MLAS
                    // computes them, in vectors); C = C·f + i·g, then H = h(C)·o.
                    // Gate blocks in W/R/B: i, o, f, c; peepholes P: i, o, f.
                    let gate = |blk: usize, k: usize, peep_c: Option<f32>| {
                        let at = blk * hidden + k;
                        let sum = match (p.p, peep_c) {
                            (Some(pp), Some(cv)) => row[at] + pp[at] * cv,
                            _ => row[at],
                        };
                        clip(sum + bias[at])
                    };
                    let (i_pre, rest) = pre.split_at_mut(hidden);
                    let (o_pre, rest) = rest.split_at_mut(hidden);
                    let (f_pre, c_pre) = rest.split_at_mut(hidden);
                    for k in 0..hidden {
                        let cp = cb[k];
                        i_pre[k] = gate(0, k, Some(cp));
                        f_pre[k] = gate(2, k, Some(cp));
                        c_pre[k] = gate(3, k, None);
                    }
                    f.apply_ort_lstm(i_pre);
                    if attrs.input_forget {
                        for (fg, &i) in f_pre.iter_mut().zip(i_pre.iter()) {
                            *fg = 1.0 - i;
                        }
                    } else {
                        f.apply_ort_lstm(f_pre);
                    }
                    g2.apply_ort_lstm(c_pre);
                    for k in 0..hidden {
                        let cn = st.round(cb[k] * f_pre[k] + i_pre[k] * c_pre[k]);
                        cb[k] = cn;
                        o_pre[k] = gate(1, k, Some(cn));
                    }
                    f.apply_ort_lstm(o_pre);
                    c_act.copy_from_slice(cb);
                    h_act.apply_ort_lstm(&mut c_act);
                    for k in 0..hidden {
                        hb[k] = st.round(c_act[k] * o_pre[k]);
                    }
                }
            }
            let at = ((t * dirs + d) * batch + bi) * hidden;
            y[at..at + hidden].copy_from_slice(hb);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Attribute;
    use crate::numeric::StateType;

    fn node(op: &str, attrs: &[(&str, Attribute)], n_out: usize) -> Node {
        let mut n = crate::graph::testing::node("rec", op, &[], &[]);
        n.outputs = (0..n_out).map(|i| format!("y{i}")).collect();
        n.attrs = attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        n
    }

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec())
    }

    /// A one-unit RNN by hand: h1 = tanh(x1·w + h0·r + wb + rb), h2 likewise.
    #[test]
    fn rnn_steps_by_hand() {
        let n = node("RNN", &[("hidden_size", Attribute::Int(1))], 2);
        let ctx = OpCtx::new(&n, 14);
        let x = t(&[2, 1, 1], &[0.5, -1.0]);
        let (w, r, b) = (
            t(&[1, 1, 1], &[2.0]),
            t(&[1, 1, 1], &[0.5]),
            t(&[1, 2], &[0.1, 0.2]),
        );
        let outs = rnn(&ctx, &[Some(&x), Some(&w), Some(&r), Some(&b)]).unwrap();
        let h1 = (0.5f32 * 2.0 + 0.3).tanh();
        let h2 = (-2.0f32 + h1 * 0.5 + 0.3).tanh();
        let y = outs[0].as_f32().unwrap();
        assert!(
            (y[0] - h1).abs() < 1e-6 && (y[1] - h2).abs() < 1e-6,
            "{y:?}"
        );
        assert_eq!(outs[0].shape(), &[2, 1, 1, 1]);
        assert_eq!(outs[1].as_f32().unwrap(), &[y[1]]);
    }

    /// A one-unit LSTM step with peepholes by hand, and `input_forget`.
    #[test]
    fn lstm_step_by_hand() {
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        // W rows i, o, f, c; R zero; P i, o, f.
        let w = t(&[1, 4, 1], &[1.0, 2.0, 3.0, 4.0]);
        let r = t(&[1, 4, 1], &[0.0; 4]);
        let x = t(&[1, 1, 1], &[0.5]);
        let c0 = t(&[1, 1, 1], &[2.0]);
        let p = t(&[1, 3], &[0.1, 0.2, 0.3]);
        for input_forget in [false, true] {
            let n = node(
                "LSTM",
                &[
                    ("hidden_size", Attribute::Int(1)),
                    ("input_forget", Attribute::Int(input_forget as i64)),
                ],
                3,
            );
            let ctx = OpCtx::new(&n, 14);
            let outs = lstm(
                &ctx,
                &[
                    Some(&x),
                    Some(&w),
                    Some(&r),
                    None,
                    None,
                    None,
                    Some(&c0),
                    Some(&p),
                ],
            )
            .unwrap();
            let i = sig(0.5 + 0.1 * 2.0);
            let f = if input_forget {
                1.0 - i
            } else {
                sig(1.5 + 0.3 * 2.0)
            };
            let c = f * 2.0 + i * 2.0f32.tanh();
            let o = sig(1.0 + 0.2 * c);
            let h = o * c.tanh();
            let (yh, yc) = (outs[1].as_f32().unwrap()[0], outs[2].as_f32().unwrap()[0]);
            assert!((yc - c).abs() < 1e-6 && (yh - h).abs() < 1e-6, "{yh} {yc}");
        }
    }

    /// GRU by hand, both `linear_before_reset` forms, and the reverse direction with sequence
    /// lengths (entry 1 is one step long: it starts at its own last element).
    #[test]
    fn gru_by_hand_and_sequence_lens_reverse() {
        let sig = |v: f32| 1.0 / (1.0 + (-v).exp());
        let w = t(&[1, 3, 1], &[1.0, 0.5, 2.0]);
        let r = t(&[1, 3, 1], &[0.3, 0.2, 0.4]);
        let b = t(&[1, 6], &[0.0, 0.0, 0.1, 0.0, 0.0, 0.2]);
        let h0 = t(&[1, 1, 1], &[0.5]);
        let x = t(&[1, 1, 1], &[1.0]);
        for lbr in [0, 1] {
            let n = node(
                "GRU",
                &[
                    ("hidden_size", Attribute::Int(1)),
                    ("linear_before_reset", Attribute::Int(lbr)),
                ],
                2,
            );
            let outs = gru(
                &OpCtx::new(&n, 14),
                &[Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0)],
            )
            .unwrap();
            let z = sig(1.0 + 0.3 * 0.5);
            let rg = sig(0.5 + 0.2 * 0.5);
            let cand = if lbr == 1 {
                (2.0 + 0.1 + rg * (0.4 * 0.5 + 0.2)).tanh()
            } else {
                (2.0 + 0.1 + 0.2 + 0.4 * rg * 0.5).tanh()
            };
            let h = (1.0 - z) * cand + z * 0.5;
            let got = outs[1].as_f32().unwrap()[0];
            assert!((got - h).abs() < 1e-6, "lbr {lbr}: {got} vs {h}");
        }
        // Reverse RNN with W = 1, R = 0, identity activation: Y is X where the sequence runs.
        let n = node(
            "RNN",
            &[
                ("hidden_size", Attribute::Int(1)),
                ("direction", Attribute::String("reverse".into())),
                ("activations", Attribute::Strings(vec!["Affine".into()])),
                ("activation_alpha", Attribute::Floats(vec![1.0])),
                ("activation_beta", Attribute::Floats(vec![0.0])),
            ],
            2,
        );
        let x = t(&[3, 2, 1], &[1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
        let lens = Tensor::from_i64(vec![2], vec![3, 1]);
        let (w, r) = (t(&[1, 1, 1], &[1.0]), t(&[1, 1, 1], &[0.0]));
        let outs = rnn(
            &OpCtx::new(&n, 14),
            &[Some(&x), Some(&w), Some(&r), None, Some(&lens)],
        )
        .unwrap();
        assert_eq!(outs[0].as_f32().unwrap(), &[1.0, 10.0, 2.0, 0.0, 3.0, 0.0]);
        // The final state of the reverse direction is at the sequence's first element.
        assert_eq!(outs[1].as_f32().unwrap(), &[1.0, 10.0]);
    }

    fn indices4(
        a: usize,
        b: usize,
        c: usize,
        d: usize,
    ) -> impl Iterator<Item = (usize, usize, usize, usize)> {
        (0..a).flat_map(move |i| {
            (0..b).flat_map(move |j| (0..c).flat_map(move |k| (0..d).map(move |l| (i, j, k, l))))
        })
    }

    /// Layout 1 equals layout 0 transposed.
    #[test]
    fn batch_first_layout_is_the_transpose() {
        let x0: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
        let w = t(
            &[2, 8, 2],
            &(0..32).map(|i| (i as f32 * 0.11).cos()).collect::<Vec<_>>(),
        );
        let r = t(
            &[2, 8, 2],
            &(0..32).map(|i| (i as f32 * 0.07).sin()).collect::<Vec<_>>(),
        );
        let bidir = ("direction", Attribute::String("bidirectional".into()));
        let run_with = |layout: i64, x: Tensor| {
            let n = node(
                "LSTM",
                &[bidir.clone(), ("layout", Attribute::Int(layout))],
                3,
            );
            lstm(&OpCtx::new(&n, 14), &[Some(&x), Some(&w), Some(&r)]).unwrap()
        };
        // [seq 3, batch 2, input 2] and its [batch, seq, input] transpose.
        let a = run_with(0, t(&[3, 2, 2], &x0));
        let b = run_with(1, t(&[2, 3, 2], &swap01(&x0, 3, 2, 2)));
        assert_eq!(b[0].shape(), &[2, 3, 2, 2]);
        assert_eq!(b[1].shape(), &[2, 2, 2]);
        // Y: [seq 3, dirs 2, batch 2, hidden 2] against [batch, seq, dirs, hidden].
        let (ya, yb) = (a[0].as_f32().unwrap(), b[0].as_f32().unwrap());
        for (s, d, bi, k) in indices4(3, 2, 2, 2) {
            assert_eq!(
                yb[((bi * 3 + s) * 2 + d) * 2 + k],
                ya[((s * 2 + d) * 2 + bi) * 2 + k]
            );
        }
        let ha = a[1].as_f32().unwrap();
        assert_eq!(b[1].as_f32().unwrap(), swap01(ha, 2, 2, 2).as_slice());
    }

    /// Under a float16 layer the state is rounded to float16 after every step, so a state that
    /// grows by less than half a float16 ulp per step stagnates (f32 state keeps growing).
    #[test]
    fn float16_state_is_rounded_every_step() {
        // h_t = h_{t-1} + x_t (Affine 1, 0; W = R = 1) starting at 1024 with x = 0.25.
        let n = node(
            "RNN",
            &[
                ("hidden_size", Attribute::Int(1)),
                ("activations", Attribute::Strings(vec!["Affine".into()])),
                ("activation_alpha", Attribute::Floats(vec![1.0])),
                ("activation_beta", Attribute::Floats(vec![0.0])),
            ],
            2,
        );
        let x = t(&[8, 1, 1], &[0.25; 8]);
        let one = t(&[1, 1, 1], &[1.0]);
        let h0 = t(&[1, 1, 1], &[1024.0]);
        let ins = [Some(&x), Some(&one), Some(&one), None, None, Some(&h0)];
        let mut ctx = OpCtx::new(&n, 14);
        assert_eq!(rnn(&ctx, &ins).unwrap()[1].as_f32().unwrap(), &[1026.0]);
        ctx.state = StateType::F16;
        // 1024 + 0.25 rounds back to 1024 in float16 (ulp 1) at every step.
        assert_eq!(rnn(&ctx, &ins).unwrap()[1].as_f32().unwrap(), &[1024.0]);
        ctx.state = StateType::BF16;
        assert_eq!(rnn(&ctx, &ins).unwrap()[1].as_f32().unwrap(), &[1024.0]);
    }

    /// The gates' products accumulate in the layer's accumulator: 4096 ones summed in an f16
    /// register stagnate at 2048 (f32: 4096).
    #[test]
    fn gates_accumulate_in_the_layers_accumulator() {
        let n = node(
            "RNN",
            &[
                ("hidden_size", Attribute::Int(1)),
                ("activations", Attribute::Strings(vec!["Affine".into()])),
                ("activation_alpha", Attribute::Floats(vec![1.0])),
                ("activation_beta", Attribute::Floats(vec![0.0])),
            ],
            2,
        );
        let x = t(&[1, 1, 4096], &[1.0; 4096]);
        let w = t(&[1, 1, 4096], &[1.0; 4096]);
        let r = t(&[1, 1, 1], &[0.0]);
        let ins = [Some(&x), Some(&w), Some(&r)];
        let mut ctx = OpCtx::new(&n, 14);
        assert_eq!(rnn(&ctx, &ins).unwrap()[1].as_f32().unwrap(), &[4096.0]);
        ctx.accumulate = crate::numeric::Accumulator::F16;
        assert_eq!(rnn(&ctx, &ins).unwrap()[1].as_f32().unwrap(), &[2048.0]);
    }

    #[test]
    fn activations_follow_the_spec() {
        let act = |kind, alpha, beta| Activation { kind, alpha, beta };
        assert_eq!(act(ActKind::Affine, 2.0, 1.0).apply(3.0), 7.0);
        assert_eq!(act(ActKind::LeakyRelu, 0.1, 0.0).apply(-2.0), -0.2);
        assert_eq!(act(ActKind::ThresholdedRelu, 1.0, 0.0).apply(1.0), 0.0);
        assert_eq!(act(ActKind::ThresholdedRelu, 1.0, 0.0).apply(1.5), 1.5);
        assert!((act(ActKind::ScaledTanh, 2.0, 0.5).apply(1.0) - 2.0 * 0.5f32.tanh()).abs() < 1e-7);
        assert_eq!(act(ActKind::HardSigmoid, 0.2, 0.5).apply(10.0), 1.0);
        assert_eq!(act(ActKind::HardSigmoid, 0.2, 0.5).apply(0.0), 0.5);
        assert!((act(ActKind::Elu, 1.0, 0.0).apply(-1.0) - (-1f32).exp_m1()).abs() < 1e-7);
        assert_eq!(act(ActKind::Softsign, 0.0, 0.0).apply(1.0), 0.5);
        assert!((act(ActKind::Softplus, 0.0, 0.0).apply(0.0) - 2f32.ln()).abs() < 1e-7);
        assert_eq!(act(ActKind::Softplus, 0.0, 0.0).apply(100.0), 100.0);
        assert!(act(ActKind::Relu, 0.0, 0.0).apply(f32::NAN).is_nan());
        assert_eq!(sigmoid(-200.0), 0.0);
        assert_eq!(sigmoid(200.0), 1.0);
    }

    /// Inconsistent weights and states are errors naming the tensor, never a panic.
    #[test]
    fn inconsistent_shapes_name_the_tensor() {
        let n = node("LSTM", &[("hidden_size", Attribute::Int(2))], 3);
        let ctx = OpCtx::new(&n, 14);
        let x = t(&[3, 1, 4], &[0.0; 12]);
        let w = t(&[1, 8, 4], &[0.0; 32]);
        let r = t(&[1, 8, 2], &[0.0; 16]);
        let err = |ins: &[Option<&Tensor>]| lstm(&ctx, ins).unwrap_err().0;
        let bad_w = t(&[1, 8, 3], &[0.0; 24]);
        let e = err(&[Some(&x), Some(&bad_w), Some(&r)]);
        assert!(
            e.starts_with("W has shape [1, 8, 3], expected [1, 8, 4]"),
            "{e}"
        );
        let bad_r = t(&[1, 6, 2], &[0.0; 12]);
        assert!(err(&[Some(&x), Some(&w), Some(&bad_r)]).starts_with("R has shape"));
        let bad_b = t(&[1, 8], &[0.0; 8]);
        let e = err(&[Some(&x), Some(&w), Some(&r), Some(&bad_b)]);
        assert!(e.starts_with("B has shape [1, 8], expected [1, 16]"), "{e}");
        let lens = Tensor::from_i64(vec![1], vec![4]);
        let e = err(&[Some(&x), Some(&w), Some(&r), None, Some(&lens)]);
        assert!(e.contains("sequence_lens[0] is 4"), "{e}");
        let h0 = t(&[1, 2, 2], &[0.0; 4]);
        let e = err(&[Some(&x), Some(&w), Some(&r), None, None, Some(&h0)]);
        assert!(
            e.starts_with("initial_h has shape [1, 2, 2], expected [1, 1, 2]"),
            "{e}"
        );
        let c0 = t(&[1, 1, 3], &[0.0; 3]);
        let e = err(&[Some(&x), Some(&w), Some(&r), None, None, None, Some(&c0)]);
        assert!(e.starts_with("initial_c has shape"), "{e}");
        let p = t(&[1, 5], &[0.0; 5]);
        let e = err(&[
            Some(&x),
            Some(&w),
            Some(&r),
            None,
            None,
            None,
            None,
            Some(&p),
        ]);
        assert!(e.starts_with("P has shape [1, 5], expected [1, 6]"), "{e}");
        // A product too large to allocate is an error, not an abort.
        // (2^21 steps x 2^11 hidden units of X·Wᵀ: 2^32 values.)
        let big = node("RNN", &[], 2);
        let xb = t(&[1 << 21, 1, 1], &vec![0.0; 1 << 21]);
        let wb = t(&[1, 1 << 11, 1], &vec![0.0; 1 << 11]);
        let rb = t(&[1, 1 << 11, 1 << 11], &vec![0.0; 1 << 22]);
        let e = rnn(&OpCtx::new(&big, 14), &[Some(&xb), Some(&wb), Some(&rb)])
            .unwrap_err()
            .0;
        assert!(e.contains("more than"), "{e}");
        let x2 = t(&[3, 4], &[0.0; 12]);
        assert!(err(&[Some(&x2), Some(&w), Some(&r)]).starts_with("X has shape [3, 4]"));
        let wi = Tensor::from_i64(vec![1, 8, 4], vec![0; 32]);
        assert!(err(&[Some(&x), Some(&wi), Some(&r)]).contains("W has dtype int64"));
        // Without hidden_size, R gives it; an R of the wrong rank is named.
        let n2 = node("LSTM", &[], 3);
        let r1 = t(&[8], &[0.0; 8]);
        let e = lstm(&OpCtx::new(&n2, 14), &[Some(&x), Some(&w), Some(&r1)])
            .unwrap_err()
            .0;
        assert!(e.starts_with("R has shape [8]"), "{e}");
    }

    #[test]
    fn bad_attributes_are_load_errors() {
        use crate::ops::attrs::testing::{assert_rejected, load_error};
        assert_rejected(
            "LSTM",
            &[("direction", Attribute::String("sideways".into()))],
            "direction",
            "'sideways' is not one of",
        );
        assert_rejected(
            "GRU",
            &[("hidden_size", Attribute::Int(0))],
            "hidden_size",
            ">= 1",
        );
        assert_rejected("RNN", &[("clip", Attribute::Float(-1.0))], "clip", "> 0");
        assert_rejected("LSTM", &[("layout", Attribute::Int(2))], "layout", "0 or 1");
        assert_rejected(
            "LSTM",
            &[("activations", Attribute::Strings(vec!["Tanh".into()]))],
            "activations",
            "needs 3 names",
        );
        assert_rejected(
            "RNN",
            &[("activations", Attribute::Strings(vec!["Swish".into()]))],
            "activations",
            "'Swish' is not one of",
        );
        // Names are case-insensitive; a bidirectional layer may give one set for both.
        let ok = |op: &str, attrs: &[(&str, Attribute)]| load_error(op, attrs, 14).is_none();
        assert!(ok(
            "GRU",
            &[
                ("direction", Attribute::String("bidirectional".into())),
                (
                    "activations",
                    Attribute::Strings(vec!["sigmoid".into(), "TANH".into()])
                ),
            ]
        ));
    }

    /// alpha/beta are consumed in order by the activations that take them; defaults as ORT.
    #[test]
    fn alphas_and_betas_are_consumed_in_order() {
        let n = node(
            "LSTM",
            &[
                ("direction", Attribute::String("bidirectional".into())),
                (
                    "activations",
                    Attribute::Strings(
                        [
                            "HardSigmoid",
                            "Tanh",
                            "LeakyRelu",
                            "Affine",
                            "ScaledTanh",
                            "Elu",
                        ]
                        .map(String::from)
                        .to_vec(),
                    ),
                ),
                ("activation_alpha", Attribute::Floats(vec![1.0, 2.0, 3.0])),
                ("activation_beta", Attribute::Floats(vec![5.0])),
            ],
            3,
        );
        let a = crate::ops::attrs::of::<RecurrentAttrs>(&n, 14).unwrap();
        let got: Vec<(ActKind, f32, f32)> = a
            .activations
            .iter()
            .flatten()
            .map(|x| (x.kind, x.alpha, x.beta))
            .collect();
        assert_eq!(
            got,
            vec![
                (ActKind::HardSigmoid, 1.0, 5.0),
                (ActKind::Tanh, 0.0, 0.0),
                (ActKind::LeakyRelu, 2.0, 0.0),
                (ActKind::Affine, 3.0, 0.0),
                (ActKind::ScaledTanh, 0.0, 0.0),
                (ActKind::Elu, 1.0, 0.0),
            ]
        );
    }
}
