//! Epilogues: the pointwise layers after a convolution run inside it, on each finished channel
//! of its output while that is still in the cache of the core that computed it, instead of as
//! passes of their own over the whole tensor (ONNX Runtime fuses Conv + activation, TensorRT
//! Conv + BatchNormalization + activation the same way).
//!
//! [`find_chains`] reads a graph once: after each kernel that applies an epilogue
//! ([`crate::ops::OpDef::epilogue`]), the longest run of pointwise nodes with an epilogue stage
//! ([`crate::ops::OpDef::stage`]) whose values nothing else reads: their other inputs are
//! weights, the values they pass each other are read only inside the chain and are not graph
//! outputs, so no one can tell they were never stored (Conv → BatchNormalization → Relu;
//! Conv → Sigmoid, Mul = SiLU; a decomposed HardSwish). [`Epilogue::prepare`] makes a chain's
//! stages for one run where that run cannot tell either: no observer, no kept intermediates,
//! no fusion regions (a value cache keeps the chain's result only), and no chain value that
//! layers of two precisions read (an int8/fp8 layer writes float32: its inputs are quantized
//! before the kernel, so an int8 Conv takes its float32 Relu as an epilogue; so does a
//! quantized kernel of `exec/qdq.rs` that writes float32). Each stage computes exactly its
//! kernel's float32 values, each layer's output is rounded to its own precision as the
//! interpreter would round it, and a chain value whose readers are in another precision is
//! rounded as their input would be, so the results are the same bits as running the layers
//! one by one (`tests`).

use super::emulate::{prepare_input, InputPrep, LayerPrep};
use super::{slot_readers, Source, Step};
use crate::graph::{Graph, ValueId, ValueIndex};
use crate::numeric::Rounding;
use crate::ops::lanewise::{Binary, Lanewise};
use crate::ops::{ChainShape, OpCtx, Piece, Registry, Stage, StoreRounds};
use crate::precision::Precision;
use crate::tensor::Tensor;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Most layers one epilogue takes.
const MAX_STAGES: usize = 8;

/// Values an epilogue works on at a time (per register): with 256 a float16 chain of eight
/// stages made ~80 calls per 2 Ki values, each stage and each rounding one; 2048 (32 KiB of
/// temporaries, L1-resident) took PP-OCRv4 rec's emulated float16 run −5 %, FP32 −2 %.
const CHUNK: usize = 2048;

/// A run of pointwise layers fused into the kernel before them.
#[derive(Clone, Debug)]
pub(super) struct Chain {
    /// The step whose output is register 0: the anchor, or the Mul of the scaled product
    /// the anchor computes (`exec/scaled.rs`: its Cast and Mul, then the chain).
    pub head: usize,
    pub stages: Vec<ChainStage>,
    /// The values from outside the chain its stages read ([`ChainInput::Operand`]), each
    /// once, in the order they are first read.
    pub operands: Vec<ValueId>,
    /// Where a stage reads an operand: the chain's layers before the first that does (the
    /// longest run of them whose values nothing else reads), the epilogue where the operands
    /// do not fit the output.
    pub fallback: Option<Box<Chain>>,
}

/// One layer of a chain. Register 0 holds the kernel's output, register k + 1 stage k's.
#[derive(Clone, Debug)]
pub(super) struct ChainStage {
    /// The layer's step (node index).
    pub step: usize,
    /// Per explicit input: where it comes from, where it is not a constant.
    pub regs: Vec<Option<ChainInput>>,
}

/// Where a stage's input comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ChainInput {
    /// A value of the chain, in this register.
    Reg(usize),
    /// A value computed before the anchor runs, of the anchor's output shape, read where
    /// each piece of the output lies (a residual Add's other operand): an operand.
    Operand(ValueId),
}

impl Chain {
    /// Every step whose work the chain does, the anchor's excluded.
    pub fn steps(&self) -> impl Iterator<Item = usize> + '_ {
        self.stages.iter().map(|s| s.step)
    }
}

/// The operands `stages` read, each once, in the order they are first read.
fn operands_of(stages: &[ChainStage]) -> Vec<ValueId> {
    let mut out: Vec<ValueId> = Vec::new();
    for input in stages.iter().flat_map(|st| st.regs.iter().flatten()) {
        if let ChainInput::Operand(v) = input {
            if !out.contains(v) {
                out.push(*v);
            }
        }
    }
    out
}

/// Per step: the chain fused into it, if it anchors one. `values`: the graph's, whose ids
/// are the steps' slots; `scaled`: per step, the Cast and Mul its kernel may compute
/// ([`super::scaled::find`]), after which its chain starts.
pub(super) fn find_chains(
    graph: &Graph,
    values: &ValueIndex,
    steps: &[Step],
    scaled: &[Option<super::scaled::ScaledProduct>],
) -> Vec<Option<Chain>> {
    let registry = Registry::global();
    let readers = |s: ValueId| slot_readers(values, steps, s);
    // The step that writes each value (graph inputs: none, there before any step).
    let mut written_by: HashMap<ValueId, usize> = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        for &s in step.outputs.iter().flatten() {
            written_by.insert(s, i);
        }
    }
    let single_output = |i: usize| -> Option<ValueId> {
        match steps[i].outputs.as_slice() {
            [Some(s)] if steps[i].subs.is_empty() && steps[i].explicit == steps[i].inputs.len() => {
                Some(*s)
            }
            _ => None,
        }
    };
    (0..steps.len())
        .map(|a| {
            let node = &graph.nodes[a];
            let def = registry.def(&node.domain, &node.op_type)?;
            def.epilogue?;
            // The layers the anchor computes before the chain: itself, or itself and the
            // Cast and Mul of its scaled product.
            let (head, fused) = match scaled.get(a).and_then(Option::as_ref) {
                Some(sp) => (sp.mul, vec![a, sp.cast, sp.mul]),
                None => (a, vec![a]),
            };
            let first = single_output(head)?;
            // Chain values by slot → register.
            let mut reg_of: HashMap<ValueId, usize> = HashMap::from([(first, 0)]);
            let mut stages: Vec<ChainStage> = Vec::new();
            let mut best = 0;
            // The longest whole chain before the first stage that reads an operand.
            let mut best_plain: Option<usize> = None;
            while stages.len() < MAX_STAGES {
                let inside = |i: usize| fused.contains(&i) || stages.iter().any(|s| s.step == i);
                let Some(next) = reg_of
                    .keys()
                    .flat_map(|&s| readers(s))
                    .filter(|&i| !inside(i))
                    .min()
                else {
                    break;
                };
                let node = &graph.nodes[next];
                let staged = registry
                    .def(&node.domain, &node.op_type)
                    .is_some_and(|d| d.stage.is_some());
                let Some(out) = single_output(next).filter(|_| staged) else {
                    break;
                };
                let mut regs = Vec::new();
                let mut ok = true;
                for src in &steps[next].inputs {
                    regs.push(match src {
                        Source::Slot(s) => match reg_of.get(s) {
                            Some(&r) => Some(ChainInput::Reg(r)),
                            // A value there before the anchor runs: an operand (whether it
                            // has the output's shape, the run tells: `OpCtx::epilogue_for`).
                            None if written_by.get(s).is_none_or(|&w| w < a) => {
                                Some(ChainInput::Operand(*s))
                            }
                            None => {
                                ok = false;
                                None
                            }
                        },
                        Source::Initializer(..) | Source::Absent => None,
                        Source::Outer(_) => {
                            ok = false;
                            None
                        }
                    });
                }
                let chained = |r: &Option<ChainInput>| matches!(r, Some(ChainInput::Reg(_)));
                if !ok || !regs.iter().any(chained) {
                    break;
                }
                let operand = |r: &Option<ChainInput>| matches!(r, Some(ChainInput::Operand(_)));
                if best_plain.is_none() && regs.iter().any(operand) {
                    best_plain = Some(best);
                }
                stages.push(ChainStage { step: next, regs });
                reg_of.insert(out, stages.len());
                // Whole: every value but the newest read only inside the chain.
                let whole = reg_of.keys().filter(|&&s| s != out).all(|&s| {
                    !values.is_graph_output(s)
                        && readers(s).next().is_some()
                        && readers(s)
                            .all(|i| fused.contains(&i) || stages.iter().any(|st| st.step == i))
                });
                if whole {
                    best = stages.len();
                }
            }
            let fallback = match best_plain {
                Some(plain) if plain < best && plain > 0 => Some(Box::new(Chain {
                    head,
                    stages: stages[..plain].to_vec(),
                    operands: Vec::new(),
                    fallback: None,
                })),
                _ => None,
            };
            stages.truncate(best);
            let operands = operands_of(&stages);
            (!stages.is_empty()).then_some(Chain {
                head,
                stages,
                operands,
                fallback,
            })
        })
        .collect()
}

/// A chain's stages made for one run: what the anchor's kernel applies to each finished
/// channel ([`crate::ops::OpCtx::epilogue`]).
pub(super) struct Epilogue {
    ops: Vec<Op>,
    /// Buffers besides the output itself (buffer 0) the stages need: values read again
    /// after a stage that does not end their life (SiLU's input).
    temps: usize,
    /// Where the result is (moved to buffer 0 at the end).
    result: usize,
    /// The anchor's output rounding, and the rounding its readers in the chain take its
    /// values with (a layer in another precision than the anchor's).
    round: Option<Rounding>,
    then: Option<Rounding>,
    /// Whether a stage reads an operand ([`ChainInput::Operand`]): pieces then go through
    /// the stages CHUNK values at a time.
    reads_operands: bool,
    /// Where the chain is an affine stage (BatchNormalization), then maybe the Add of an
    /// operand, then maybe one lanewise stage (Relu, Clip): those stages as one pass — over a
    /// channel's piece where none rounds (float32), and in the kernel's registers as it
    /// stores its values ([`Epilogue::store_form`]) with or without roundings ([`SinglePass`]).
    single_pass: Option<SinglePass>,
}

/// The stages after the affine first one of an epilogue that runs in one pass: the operand
/// added (its index) and the lanewise stage, where there are, and where the values are
/// rounded (an emulated plan's layers).
#[derive(Clone, Copy, Debug, PartialEq)]
struct SinglePass {
    operand: Option<usize>,
    /// Whether the operand is the Add's first input (`Add(operand, x)`): the sum is then
    /// written `operand + x`, as the Add's own kernel computes it (where both are NaN, the
    /// first's payload comes out).
    operand_first: bool,
    last: Option<Lanewise>,
    rounds: StoreRounds,
}

impl SinglePass {
    /// The pass for `ops` where they are such a chain: each stage reads the value the one
    /// before it wrote (the first, the anchor's output in buffer 0, rounded by `anchor`), the
    /// Add the operand too, and the last one's buffer is the result. Which buffers the stages
    /// use does not matter: the pass runs in place on the values (an Add of the operand first
    /// writes a temporary in the stage-by-stage run). Each rounding of the stage-by-stage run
    /// is the pass's at the same point ([`StoreRounds`]).
    fn of(ops: &[Op], result: usize, anchor: [Option<Rounding>; 2]) -> Option<SinglePass> {
        if ops.is_empty() || ops.len() > 3 {
            return None;
        }
        let first = &ops[0];
        if !matches!(first.stage, Stage::Affine { .. }) || first.inputs[..] != [Arg::Reg(0)] {
            return None;
        }
        // The buffer holding the chain's value so far.
        let mut at = first.out;
        let mut pass = SinglePass {
            operand: None,
            operand_first: false,
            last: None,
            rounds: StoreRounds {
                product: anchor,
                affine: [first.round, first.then],
                ..StoreRounds::default()
            },
        };
        let mut rest = &ops[1..];
        if let Some(op) = rest.first() {
            let operand = |a: &Arg| match a {
                Arg::Operand { index, round } => Some((*index, *round)),
                _ => None,
            };
            if let (Stage::Zip(Binary::Add), [a, b]) = (&op.stage, &op.inputs[..]) {
                let read = if let Some(read) = operand(b).filter(|_| *a == Arg::Reg(at)) {
                    Some(read)
                } else if let Some(read) = operand(a).filter(|_| *b == Arg::Reg(at)) {
                    pass.operand_first = true;
                    Some(read)
                } else {
                    None
                };
                if let Some((index, round)) = read {
                    pass.operand = Some(index);
                    pass.rounds.operand = round;
                    // The Add's kernel rounds the sum as it computes it.
                    pass.rounds.sum = [op.round, op.then];
                    at = op.out;
                    rest = &rest[1..];
                }
            }
        }
        match rest {
            [] => {}
            [op] => match op.stage {
                Stage::Lanewise(l) if op.inputs[..] == [Arg::Reg(at)] => {
                    pass.last = Some(l);
                    // As `Lanewise::run` rounds: not where the operation keeps the grid.
                    pass.rounds.last = [op.round.filter(|&r| !l.keeps(r)), op.then];
                    at = op.out;
                }
                _ => return None,
            },
            _ => return None,
        }
        (result == at).then_some(pass)
    }

    /// `v = last((v·a + b) + operand)` in one pass: each step the IEEE operation its stage
    /// computes, in the stages' order (`tests::one_pass_is_the_stages_in_turn`).
    fn run(self, v: &mut [f32], a: f32, b: f32, operand: Option<&[f32]>) {
        use crate::ops::vector::{map_in_place, zip_in_place};
        if let (Some(o), true) = (operand, self.operand_first) {
            return match self.last {
                None => zip_in_place(v, o, |x, y| y + (x * a + b)),
                Some(Lanewise::Relu) => {
                    zip_in_place(v, o, |x, y| Lanewise::Relu.apply(y + (x * a + b)))
                }
                Some(l) => zip_in_place(v, o, |x, y| l.apply(y + (x * a + b))),
            };
        }
        match (operand, self.last) {
            (None, None) => map_in_place(v, |x| x * a + b),
            (None, Some(Lanewise::Relu)) => map_in_place(v, |x| Lanewise::Relu.apply(x * a + b)),
            (None, Some(l)) => map_in_place(v, |x| l.apply(x * a + b)),
            (Some(o), None) => zip_in_place(v, o, |x, y| (x * a + b) + y),
            (Some(o), Some(Lanewise::Relu)) => {
                zip_in_place(v, o, |x, y| Lanewise::Relu.apply((x * a + b) + y))
            }
            (Some(o), Some(l)) => zip_in_place(v, o, |x, y| l.apply((x * a + b) + y)),
        }
    }
}

/// A value of another layer that an epilogue reads (a residual Add's other operand): its
/// values, of the anchor's output shape, and the grid they are on where their layer rounded
/// them as it wrote them (a stage that reads them in that precision takes them as they are:
/// rounding them again would change nothing and cost a copy and a pass).
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    pub values: &'a [f32],
    pub on: Option<Rounding>,
}

impl<'a> Operand<'a> {
    /// Values on no known grid: read as each stage's layer takes them.
    #[cfg(test)]
    fn float32(values: &'a [f32]) -> Self {
        Operand { values, on: None }
    }

    /// The rounding a reader that takes the values rounded by `round` still has to apply.
    fn still_to_round(&self, round: Option<Rounding>) -> Option<Rounding> {
        round.filter(|&r| self.on != Some(r))
    }
}

/// What a stage reads: a register (before buffers are assigned; a buffer after), or operand
/// `index` of the chain's [`Chain::operands`], rounded as the stage's layer takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arg {
    Reg(usize),
    Operand {
        index: usize,
        round: Option<Rounding>,
    },
}

/// A stage before buffers are assigned: the registers it reads, its layer's output rounding,
/// and the rounding the stages that read its value take it with (see [`Op`]).
struct Staged {
    stage: Stage,
    regs: Vec<Arg>,
    round: Option<Rounding>,
    then: Option<Rounding>,
}

/// The epilogues a graph's runs (or a plan's) made, by anchor step and the anchor's output
/// shape: the same chain, weights, plan and shape make the same stages, so a run takes those
/// an earlier run made (making them — per-channel constants, stage closures — was 5–9 % of a
/// run of PP-OCRv4 det, rec and the classifier: 0.07–0.25 ms). `None` (the chain runs layer
/// by layer under this plan) is kept too. A clone starts empty: what it belongs to (a
/// plan) may then change. Plans composed from others ([`super::PreparedPlan::with_layers_of`],
/// a search's candidates) [`share`](Self::share) one: their key also names where each layer
/// of the chain was prepared, so a chain whose layers come from the same prepared plans takes
/// the stages made for an earlier candidate.
#[derive(Default)]
pub(super) struct Cache(Arc<Mutex<HashMap<CacheKey, Option<Arc<Epilogue>>>>>);

/// An epilogue's anchor step, its number of stages (a chain's fallback has fewer), the
/// anchor's output shape, and the prepared plans the anchor's and the chain's layers come
/// from (empty without a plan).
type CacheKey = (usize, usize, ChainShape, smallvec::SmallVec<[u64; 9]>);

impl Clone for Cache {
    fn clone(&self) -> Self {
        Cache::default()
    }
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("epilogue::Cache")
    }
}

impl Cache {
    /// The same cache (not a copy): for a plan whose layers are prepared as those of the
    /// plans it was composed from.
    pub(super) fn share(&self) -> Cache {
        Cache(Arc::clone(&self.0))
    }

    /// The epilogue of `chain` (anchored at `anchor`) for output `shape`: kept, or made by
    /// `make` and kept (an error is not kept).
    pub(super) fn get_or_make(
        &self,
        anchor: usize,
        shape: ChainShape,
        chain: &Chain,
        origins: smallvec::SmallVec<[u64; 9]>,
        make: impl FnOnce() -> crate::error::Result<Option<Epilogue>>,
    ) -> crate::error::Result<Option<Arc<Epilogue>>> {
        let key = (anchor, chain.stages.len(), shape, origins);
        if let Some(e) = self.0.lock().expect("epilogue cache").get(&key) {
            return Ok(e.clone());
        }
        let made = make()?.map(Arc::new);
        self.0
            .lock()
            .expect("epilogue cache")
            .insert(key, made.clone());
        Ok(made)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().expect("epilogue cache").len()
    }
}

/// A stage with the buffers it reads (its chained inputs, in input order: `Arg::Reg` a
/// buffer, or an operand) and writes.
struct Op {
    stage: Stage,
    inputs: Vec<Arg>,
    out: usize,
    /// The layer's output rounding.
    round: Option<Rounding>,
    /// Then the rounding its value's readers in the chain take it with, where their layers'
    /// precision differs from this one's (they all take it the same way): done once, as
    /// the value is written, since nothing else reads it.
    then: Option<Rounding>,
}

/// Most temporary buffers an epilogue uses.
const MAX_TEMPS: usize = 4;

thread_local! {
    /// Each thread's temporaries, zeroed once: [`Epilogue::apply`] runs per channel of every
    /// finished block (often a few hundred values), and a fresh zeroed 4 KiB array per call
    /// was ~10 % of YOLOv8n's run (memset).
    /// The last one is for an operand's values ([`Epilogue::run`]).
    static TEMPS: std::cell::RefCell<[[f32; CHUNK]; MAX_TEMPS + 1]> =
        const { std::cell::RefCell::new([[0.0; CHUNK]; MAX_TEMPS + 1]) };
}

/// The rounding a layer's outputs get under a plan, for the layers an epilogue may take:
/// Some(None) for float32 (or no plan), Some(Some(r)) for float16/bfloat16, None for the rest.
/// An int8/fp8 layer outside fusion regions writes float32 (its quantized inputs are prepared
/// before the kernel; its output is the f32 accumulation, unrounded: docs/numerics.md), so it
/// counts as float32, as does one that runs a quantized kernel of its own (`exec/qdq.rs`:
/// the rescaled accumulation in f32; the kernel applies an epilogue only where it writes
/// float32 and leaves the layers to run on their own otherwise).
fn output_rounding(layer: Option<&LayerPrep>) -> Option<Option<Rounding>> {
    let Some(l) = layer else {
        return Some(None);
    };
    if l.fusion.is_some() {
        return None;
    }
    match l.precision? {
        Precision::Float32 => Some(None),
        p if p.is_scaled() => Some(None),
        p => p.float_rounding().map(Some),
    }
}

impl Epilogue {
    /// The chain's stages for this run, or None where the run must execute its layers one
    /// by one (see the module's introduction); `layers`: the plan's layers, if any; `shape`:
    /// the anchor's output.
    pub fn prepare(
        chain: &Chain,
        anchor: usize,
        graph: &Graph,
        steps: &[Step],
        layers: Option<&[LayerPrep]>,
        shape: ChainShape,
    ) -> crate::error::Result<Option<Epilogue>> {
        let Some(anchor_round) = output_rounding(layers.map(|l| &l[anchor])) else {
            return Ok(None);
        };
        // Per register (0: the anchor's output, k + 1: stage k's): the rounding its layer
        // writes it with, and how the stages that read it take it (None: no reader yet;
        // Some(None): as written; Some(Some(r)): rounded to r, as a layer in another
        // precision rounds its input).
        let mut written: Vec<Option<Rounding>> = vec![anchor_round];
        let mut read_as: Vec<Option<Option<Rounding>>> = vec![None];
        let mut stages: Vec<Staged> = Vec::with_capacity(chain.stages.len());
        let operands = &chain.operands;
        for st in &chain.stages {
            let layer = layers.map(|l| &l[st.step]);
            let Some(round) = output_rounding(layer) else {
                return Ok(None);
            };
            let node = &graph.nodes[st.step];
            let step = &steps[st.step];
            // The layer's constant inputs as its kernel would get them under the plan.
            let mut args: Vec<Option<Cow<Tensor>>> = Vec::with_capacity(st.regs.len());
            let mut regs: Vec<Arg> = Vec::with_capacity(st.regs.len());
            for (i, (src, reg)) in step.inputs.iter().zip(&st.regs).enumerate() {
                let prep = layer.and_then(|l| l.inputs.get(i));
                if let Some(ChainInput::Operand(v)) = *reg {
                    // Read as the layer reads it: as it is, or rounded to the layer's
                    // precision (a value already in it is left as it is).
                    let round = match prep {
                        None | Some(InputPrep::Keep) => None,
                        Some(InputPrep::Round(Precision::Float32)) => None,
                        Some(InputPrep::Round(p)) => match p.float_rounding() {
                            Some(r) => Some(r),
                            None => return Ok(None),
                        },
                        _ => return Ok(None),
                    };
                    let index = operands.iter().position(|&o| o == v).expect("listed");
                    regs.push(Arg::Operand { index, round });
                    args.push(None);
                    continue;
                }
                if let Some(ChainInput::Reg(r)) = *reg {
                    regs.push(Arg::Reg(r));
                    // A chain value: read as its layer wrote it, or rounded to this layer's
                    // precision where that differs. One register holds one form, so its
                    // readers must agree (they do unless one chain value feeds layers of two
                    // precisions).
                    let want = match prep {
                        None | Some(InputPrep::Keep) => None,
                        Some(InputPrep::Round(p)) => {
                            p.float_rounding().filter(|&q| Some(q) != written[r])
                        }
                        _ => return Ok(None),
                    };
                    match read_as[r] {
                        None => read_as[r] = Some(want),
                        Some(w) if w == want => {}
                        Some(_) => return Ok(None),
                    }
                    args.push(None);
                    continue;
                }
                let base = match src {
                    Source::Initializer(_, t) => Some(*t),
                    _ => None,
                };
                args.push(base.map(
                    |t| match prep.and_then(|p| prepare_input(p, t).map(|o| (p, o))) {
                        Some((_, owned)) => Cow::Owned(owned),
                        None => match prep {
                            Some(InputPrep::Converted(c, _)) => Cow::Borrowed(&**c),
                            _ => Cow::Borrowed(t),
                        },
                    },
                ));
            }
            let refs: Vec<Option<&Tensor>> = args.iter().map(|a| a.as_deref()).collect();
            let chained: Vec<bool> = st.regs.iter().map(Option::is_some).collect();
            let reads_operand = regs.iter().any(|r| matches!(r, Arg::Operand { .. }));
            let def = Registry::global()
                .def(&node.domain, &node.op_type)
                .and_then(|d| d.stage)
                .expect("chains hold staged ops");
            let ctx = OpCtx::new(node, step.opset);
            let stage = def(&ctx, &refs, &chained, shape).map_err(|e| crate::error::Error::Op {
                node: node.name.clone(),
                op: node.op_type.clone(),
                msg: e.0,
            })?;
            match stage {
                // An operand is read by a stage of two values (Zip, Combine) only.
                Some(Stage::Map(_) | Stage::Affine { .. } | Stage::Lanewise(_))
                    if reads_operand =>
                {
                    return Ok(None)
                }
                Some(s) => stages.push(Staged {
                    stage: s,
                    regs,
                    round,
                    then: None,
                }),
                None => return Ok(None),
            }
            written.push(round);
            read_as.push(None);
        }
        // The result (the last register) is read outside, as written.
        for (k, s) in stages.iter_mut().enumerate() {
            s.then = read_as[k + 1].flatten();
        }
        let ops: Vec<Option<&str>> = (chain.stages.iter())
            .map(|st| {
                let node = &graph.nodes[st.step];
                (node.domain.is_empty() || node.domain == "ai.onnx")
                    .then_some(node.op_type.as_str())
            })
            .collect();
        let stages = fuse_silu(stages, &ops);
        let then = read_as[0].flatten();
        Ok(assign_buffers(stages).map(|(ops, temps, result)| Epilogue {
            single_pass: SinglePass::of(&ops, result, [anchor_round, then]),
            ops,
            temps,
            result,
            round: anchor_round,
            then,
            reads_operands: !operands.is_empty(),
        }))
    }

    /// This epilogue after a kernel that writes the anchor's values rounded as the anchor's
    /// layer writes them (a scaled product's Mul, computed in the integer kernel's store):
    /// that rounding is not applied a second time (it would change nothing).
    pub fn after_rounded_anchor(mut self) -> Self {
        self.round = None;
        if let Some(pass) = &mut self.single_pass {
            pass.rounds.product[0] = None;
        }
        self
    }

    /// The epilogue as a kernel may compute it while storing each value, where it is a
    /// [`SinglePass`] (an affine stage, perhaps an operand's Add, perhaps one lanewise stage,
    /// each value rounded where its layer rounds it); `operands` as [`Epilogue::apply`] takes
    /// them.
    pub fn store_form<'a>(
        &'a self,
        operands: &[Operand<'a>],
    ) -> Option<crate::ops::StoreEpilogue<'a>> {
        let pass = self.single_pass?;
        let Stage::Affine { scale, shift } = &self.ops.first()?.stage else {
            return None;
        };
        let mut rounds = pass.rounds;
        let operand = match pass.operand {
            Some(i) => {
                let o = operands.get(i)?;
                rounds.operand = o.still_to_round(rounds.operand);
                Some(o.values)
            }
            None => None,
        };
        Some(crate::ops::StoreEpilogue {
            scale,
            shift,
            operand,
            operand_first: pass.operand_first,
            last: pass.last,
            rounds,
            affine_done: false,
        })
    }

    /// Applies the anchor's rounding and every stage to one piece of finished values;
    /// `operands`: the values of the chain's [`Chain::operands`], each of the output's shape.
    pub fn apply(&self, piece: Piece, values: &mut [f32], operands: &[Operand<'_>]) {
        if let (Some(pass), crate::ops::Channels::One(ch), 1) = (
            self.single_pass.filter(|p| p.rounds.is_empty()),
            piece.channels,
            piece.step,
        ) {
            if let Stage::Affine { scale, shift } = &self.ops[0].stage {
                let operand = pass
                    .operand
                    .map(|i| &operands[i].values[piece.start..piece.start + values.len()]);
                return pass.run(values, scale[ch], shift[ch], operand);
            }
        }
        if self.temps == 0 && !self.reads_operands {
            // Every stage in place on the output itself.
            return self.run(piece, values, &mut [], &mut [], operands);
        }
        let apply = |buffers: &mut [[f32; CHUNK]; MAX_TEMPS + 1]| {
            let (scratch, temps) = buffers.split_last_mut().expect("MAX_TEMPS + 1 buffers");
            let temps = &mut temps[..self.temps];
            for (k, part) in values.chunks_mut(CHUNK).enumerate() {
                self.run(piece.skip(k * CHUNK), part, temps, scratch, operands);
            }
        };
        crate::ops::util::with_scratch(&TEMPS, || [[0.0; CHUNK]; MAX_TEMPS + 1], apply)
    }

    /// The stages on `part` (buffer 0; at most CHUNK values where there are temporaries or
    /// operands, `scratch` then CHUNK values for an operand's).
    fn run(
        &self,
        piece: Piece,
        part: &mut [f32],
        temps: &mut [[f32; CHUNK]],
        scratch: &mut [f32],
        operands: &[Operand<'_>],
    ) {
        let n = part.len();
        let round = |v: &mut [f32], r: Option<Rounding>| {
            if let Some(r) = r {
                r.round_slice(v)
            }
        };
        round(part, self.round);
        round(part, self.then);
        // Both operands one value (x·x): the second through a copy.
        let squared = |out: &mut [f32], f: &dyn Fn(&mut [f32], &[f32])| {
            for chunk in out.chunks_mut(CHUNK) {
                let mut b = [0f32; CHUNK];
                b[..chunk.len()].copy_from_slice(chunk);
                f(chunk, &b[..chunk.len()]);
            }
        };
        for op in &self.ops {
            match op.inputs[0] {
                Arg::Reg(first) if first == op.out => {}
                Arg::Reg(first) => {
                    // Into a temporary (only with temporaries: n <= CHUNK): the value is read
                    // again.
                    let (to, from) = pair(part, temps, op.out, first);
                    to.copy_from_slice(from);
                }
                Arg::Operand { index, round } => {
                    let from = operand_piece(operands[index], piece, n, round, scratch);
                    buffer(part, temps, op.out).copy_from_slice(from);
                }
            }
            // A two-value stage `f` on the output buffer and the op's second input.
            let with_second = |part: &mut [f32],
                               temps: &mut [[f32; CHUNK]],
                               scratch: &mut [f32],
                               f: &dyn Fn(&mut [f32], &[f32])| {
                match op.inputs[1] {
                    Arg::Reg(b) if b == op.out => squared(buffer(part, temps, op.out), f),
                    Arg::Reg(b) => {
                        let (a, b) = pair(part, temps, op.out, b);
                        f(a, b)
                    }
                    Arg::Operand { index, round } => {
                        let b = operand_piece(operands[index], piece, n, round, scratch);
                        f(buffer(part, temps, op.out), b)
                    }
                }
            };
            // Lanewise and Zip stages round as they go (or keep the format).
            let rounds_itself = match &op.stage {
                Stage::Map(f) => {
                    f(piece.channels, buffer(part, temps, op.out));
                    false
                }
                Stage::Affine { scale, shift } => {
                    let v = buffer(part, temps, op.out);
                    crate::ops::norm::affine_stage(piece.channels, v, scale, shift);
                    false
                }
                Stage::Lanewise(l) => {
                    l.run(buffer(part, temps, op.out), op.round);
                    true
                }
                Stage::Zip(z) => {
                    with_second(part, temps, scratch, &|a, b| z.run(a, b, op.round));
                    true
                }
                Stage::Combine(f) => {
                    with_second(part, temps, scratch, &|a, b| f(a, b));
                    false
                }
            };
            let out = buffer(part, temps, op.out);
            if !rounds_itself {
                round(out, op.round);
            }
            round(out, op.then);
        }
        if self.result != 0 {
            part.copy_from_slice(&temps[self.result - 1][..n]);
        }
    }
}

/// An operand's `n` values for `piece`: in place where they are consecutive and read as they
/// are, else gathered (and rounded as its reader takes them) into `scratch`.
fn operand_piece<'a>(
    operand: Operand<'a>,
    piece: Piece,
    n: usize,
    round: Option<Rounding>,
    scratch: &'a mut [f32],
) -> &'a [f32] {
    let (src, round) = (operand.values, operand.still_to_round(round));
    if piece.step == 1 && round.is_none() {
        return &src[piece.start..piece.start + n];
    }
    let to = &mut scratch[..n];
    for (i, v) in to.iter_mut().enumerate() {
        *v = src[piece.start + i * piece.step];
    }
    if let Some(r) = round {
        r.round_slice(to);
    }
    to
}

/// SiLU (`x·σ(x)`, exported as a Sigmoid and a Mul of its input and output: YOLO's every
/// convolution) as one stage: the product in the pass that computes σ, no register between
/// them. The same bits: σ's values rounded as its layer writes them, then the Mul's product of
/// the same two operands in the same order, where both layers round to one precision (so the
/// Mul takes σ as written). `ops[k]`: stage k's op (default domain). Stages after the pair
/// read registers one lower (register k + 1 is stage k's).
fn fuse_silu(stages: Vec<Staged>, ops: &[Option<&str>]) -> Vec<Staged> {
    let regs: Vec<Vec<Arg>> = stages.iter().map(|s| s.regs.clone()).collect();
    let rounds: Vec<(Option<Rounding>, Option<Rounding>)> =
        stages.iter().map(|s| (s.round, s.then)).collect();
    // Stage k is a Sigmoid of x whose output only stage k + 1, a Mul of x and it, reads.
    let pair_at = |k: usize| -> Option<bool> {
        if k + 1 >= regs.len() {
            return None;
        }
        let (sig, x) = (Arg::Reg(k + 1), *regs[k].first()?);
        if !matches!(x, Arg::Reg(_)) {
            return None;
        }
        let read_later = regs[k + 2..].iter().flatten().any(|&r| r == sig);
        // σ as its layer writes it is what the Mul reads.
        let one_form = rounds[k].0 == rounds[k + 1].0 && rounds[k].1.is_none();
        match (ops[k], ops.get(k + 1).copied().flatten(), regs.get(k + 1)) {
            (Some("Sigmoid"), Some("Mul"), Some(m))
                if !read_later && one_form && regs[k].len() == 1 =>
            {
                // The Mul's operand order: x·σ(x) or σ(x)·x.
                if m[..] == [x, sig] {
                    Some(true)
                } else if m[..] == [sig, x] {
                    Some(false)
                } else {
                    None
                }
            }
            _ => None,
        }
    };
    let mut out: Vec<Staged> = Vec::with_capacity(stages.len());
    // Registers of the input stages → of the output's (usize::MAX: a fused Sigmoid's, which
    // nothing reads).
    let mut new_reg: Vec<usize> = vec![0];
    let mut it = stages.into_iter().enumerate();
    while let Some((k, st)) = it.next() {
        let remap = |r: &[Arg], new_reg: &[usize]| {
            r.iter()
                .map(|&a| match a {
                    Arg::Reg(q) => Arg::Reg(new_reg[q]),
                    operand => operand,
                })
                .collect()
        };
        if let Some(x_first) = pair_at(k) {
            let x = remap(&st.regs[..1], &new_reg);
            let mul = it.next().expect("pair_at saw the Mul").1;
            let round = mul.round;
            let fused = Stage::Map(Box::new(move |_, v: &mut [f32]| {
                crate::ops::logistic::silu_in_place(v, round, x_first)
            }));
            // silu_in_place rounds σ; the product is rounded after it, as the Mul's layer
            // writes it.
            out.push(Staged {
                stage: fused,
                regs: x,
                round,
                then: mul.then,
            });
            // The Sigmoid's register is read by nothing now; the Mul's is the fused stage's.
            new_reg.push(usize::MAX);
            new_reg.push(out.len());
            continue;
        }
        let regs = remap(&st.regs, &new_reg);
        out.push(Staged { regs, ..st });
        new_reg.push(out.len());
    }
    out
}

/// Two different buffers of an epilogue: `x` to write, `y` to read.
fn pair<'a>(
    part: &'a mut [f32],
    temps: &'a mut [[f32; CHUNK]],
    x: usize,
    y: usize,
) -> (&'a mut [f32], &'a [f32]) {
    let n = part.len();
    match (x, y) {
        (0, y) => (part, &temps[y - 1][..n]),
        (x, 0) => (&mut temps[x - 1][..n], part),
        (x, y) if x < y => {
            let (lo, hi) = temps.split_at_mut(y - 1);
            (&mut lo[x - 1][..n], &hi[0][..n])
        }
        (x, y) => {
            let (lo, hi) = temps.split_at_mut(x - 1);
            (&mut hi[0][..n], &lo[y - 1][..n])
        }
    }
}

/// Buffer `b` of an epilogue: the output's values (0) or a temporary.
fn buffer<'a>(part: &'a mut [f32], temps: &'a mut [[f32; CHUNK]], b: usize) -> &'a mut [f32] {
    let n = part.len();
    if b == 0 {
        part
    } else {
        &mut temps[b - 1][..n]
    }
}

/// Buffers for a chain's values: a stage writes over its first chained input where it is that
/// value's last reader, otherwise into a free temporary. Returns the ops, the temporaries used
/// and the result's buffer; None past [`MAX_TEMPS`].
fn assign_buffers(stages: Vec<Staged>) -> Option<(Vec<Op>, usize, usize)> {
    // Register 0: the anchor's output; register k + 1: stage k's. Operands are read where
    // they lie (or through the scratch buffer): no buffer of their own.
    let mut last_read = vec![0usize; stages.len() + 1];
    for (k, st) in stages.iter().enumerate() {
        for &a in &st.regs {
            if let Arg::Reg(r) = a {
                last_read[r] = last_read[r].max(k);
            }
        }
    }
    let mut buf_of = vec![0usize; stages.len() + 1];
    let (mut free, mut temps) = (Vec::new(), 0);
    let mut ops = Vec::with_capacity(stages.len());
    for (k, st) in stages.into_iter().enumerate() {
        let Staged {
            stage,
            regs,
            round,
            then,
        } = st;
        let out = match regs[0] {
            Arg::Reg(first) if last_read[first] == k => buf_of[first],
            _ => match free.pop() {
                Some(b) => b,
                None => {
                    temps += 1;
                    temps
                }
            },
        };
        for &a in &regs {
            let Arg::Reg(r) = a else { continue };
            if last_read[r] == k && buf_of[r] != out && !free.contains(&buf_of[r]) && buf_of[r] != 0
            {
                free.push(buf_of[r]);
            }
        }
        buf_of[k + 1] = out;
        let inputs = regs
            .iter()
            .map(|&a| match a {
                Arg::Reg(r) => Arg::Reg(buf_of[r]),
                operand => operand,
            })
            .collect();
        ops.push(Op {
            stage,
            inputs,
            out,
            round,
            then,
        });
    }
    (temps <= MAX_TEMPS).then(|| (ops, temps, buf_of[buf_of.len() - 1]))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{Arg, Epilogue, Op, Operand, SinglePass};
    use crate::exec::{Feeds, Interpreter, PlanOptions, PreparedPlan, RunOptions};
    use crate::graph::testing::{graph, node, vi};
    use crate::graph::{Attribute, Graph, Node};
    use crate::numeric::Rounding;
    use crate::ops::lanewise::{Binary, Lanewise};
    use crate::ops::{Piece, Stage, StoreRounds};
    use crate::precision::plan::PrecisionPlan;
    use crate::precision::Precision;
    use crate::tensor::Tensor;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut rng = crate::data::loader::Mt19937::new(seed);
        (0..n)
            .map(|_| (rng.random_sample() * 4.0 - 2.0) as f32)
            .collect()
    }

    fn conv(name: &str, inputs: &[&str], out: &str, pad: i64) -> Node {
        let mut n = node(name, "Conv", inputs, &[out]);
        n.attrs.insert("pads".into(), Attribute::Ints(vec![pad; 4]));
        n
    }

    /// Four convolutions, each followed by a chain: BatchNormalization → Relu; Sigmoid, Mul of it
    /// by its input
    /// (SiLU); Mul, Add by constants → HardSigmoid, Mul (a decomposed HardSwish); Sub from a
    /// per-channel constant → Div by a scalar → Tanh. `extra`: more nodes and outputs.
    fn model(extra: Vec<Node>, outputs: &[&str]) -> Graph {
        model_of(extra, outputs, 9)
    }

    /// [`model`] on a [1, 3, hw, hw] input.
    fn model_of(extra: Vec<Node>, outputs: &[&str], hw: usize) -> Graph {
        let c = 3usize;
        let mut hs = node("hsig", "HardSigmoid", &["u3"], &["u4"]);
        hs.attrs.insert("alpha".into(), Attribute::Float(0.2));
        let mut nodes = vec![
            conv("c1", &["x", "w1", "b1"], "y1", 1),
            node(
                "bn",
                "BatchNormalization",
                &["y1", "s", "bb", "mu", "var"],
                &["y2"],
            ),
            node("relu", "Relu", &["y2"], &["y3"]),
            conv("c2", &["y3", "w2"], "z1", 1),
            node("sig", "Sigmoid", &["z1"], &["z2"]),
            node("silu", "Mul", &["z2", "z1"], &["z3"]),
            conv("c3", &["z3", "w3"], "u1", 0),
            node("scale", "Mul", &["u1", "k"], &["u2"]),
            node("shift", "Add", &["u2", "three"], &["u3"]),
            hs,
            node("hswish", "Mul", &["u3", "u4"], &["u5"]),
            conv("c4", &["u5", "w4"], "v1", 1),
            node("sub", "Sub", &["d", "v1"], &["v2"]),
            node("div", "Div", &["v2", "two"], &["v3"]),
            node("tanh", "Tanh", &["v3"], &["out"]),
        ];
        nodes.extend(extra);
        let t = |shape: Vec<usize>, seed| {
            let n = shape.iter().product();
            Tensor::from_f32(shape, values(n, seed))
        };
        let positive = |n: usize, seed| {
            Tensor::from_f32(
                vec![n],
                values(n, seed).iter().map(|v| v.abs() + 0.1).collect(),
            )
        };
        graph(
            nodes,
            vec![vi("x", &[1, c, hw, hw])],
            outputs.iter().map(|o| vi(o, &[])).collect(),
            vec![
                ("w1", t(vec![16, c, 3, 3], 1)),
                ("b1", t(vec![16], 2)),
                ("s", t(vec![16], 3)),
                ("bb", t(vec![16], 4)),
                ("mu", t(vec![16], 5)),
                ("var", positive(16, 6)),
                ("w2", t(vec![20, 16, 3, 3], 7)),
                ("w3", t(vec![16, 20, 1, 1], 8)),
                ("k", t(vec![1, 16, 1, 1], 9)),
                ("three", Tensor::from_f32(vec![], vec![3.0])),
                ("w4", t(vec![4, 16, 3, 3], 10)),
                ("d", t(vec![4, 1, 1], 11)),
                ("two", Tensor::from_f32(vec![1], vec![2.0])),
            ],
        )
    }

    fn feeds() -> Feeds {
        feeds_of(9)
    }

    fn feeds_of(hw: usize) -> Feeds {
        let mut f = Feeds::new();
        f.insert(
            "x".into(),
            Tensor::from_f32(vec![1, 3, hw, hw], values(3 * hw * hw, 12)),
        );
        f
    }

    fn chain_lengths(interp: &Interpreter) -> Vec<(String, usize)> {
        interp
            .chains
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                Some((interp.graph.nodes[i].name.clone(), c.as_ref()?.stages.len()))
            })
            .collect()
    }

    #[test]
    fn chains_take_the_pointwise_layers_whose_values_nothing_else_reads() {
        let g = model(Vec::new(), &["out"]);
        let interp = Interpreter::new(&g).unwrap();
        let want = [("c1", 2), ("c2", 2), ("c3", 4), ("c4", 3)];
        let want: Vec<(String, usize)> = want.iter().map(|(n, k)| (n.to_string(), *k)).collect();
        assert_eq!(chain_lengths(&interp), want);
        // A value read outside (the BatchNormalization's by a second output, the SiLU's
        // product input by another node) ends the chain before the layer that needs it.
        let g = model(
            vec![node("peek", "Neg", &["z1"], &["p"])],
            &["out", "y2", "p"],
        );
        let interp = Interpreter::new(&g).unwrap();
        let got = chain_lengths(&interp);
        assert_eq!(got[0], ("c1".to_string(), 1));
        assert_eq!(got[1].0, "c3");
    }

    /// A matrix product with a decomposed GELU after it: bias Add, Div by √2, Erf, Add 1, Mul
    /// by the biased product, Mul by ½ — then a per-column Mul.
    fn gelu_model() -> Graph {
        let (k, n) = (8usize, 80usize);
        let nodes = vec![
            node("mm", "MatMul", &["x", "w"], &["h"]),
            node("bias", "Add", &["bv", "h"], &["hb"]),
            node("div", "Div", &["hb", "sqrt2"], &["q"]),
            node("erf", "Erf", &["q"], &["e"]),
            node("one", "Add", &["e", "one_c"], &["e1"]),
            node("gate", "Mul", &["hb", "e1"], &["g"]),
            node("half", "Mul", &["g", "half_c"], &["g2"]),
            node("cols", "Mul", &["g2", "colw"], &["out"]),
        ];
        let scalar = |v: f32| Tensor::from_f32(vec![], vec![v]);
        graph(
            nodes,
            vec![vi("x", &[2, 5, k])],
            vec![vi("out", &[2, 5, n])],
            vec![
                ("w", Tensor::from_f32(vec![k, n], values(k * n, 20))),
                ("bv", Tensor::from_f32(vec![n], values(n, 21))),
                ("sqrt2", scalar(std::f32::consts::SQRT_2)),
                ("one_c", scalar(1.0)),
                ("half_c", scalar(0.5)),
                ("colw", Tensor::from_f32(vec![1, n], values(n, 22))),
            ],
        )
    }

    /// GELU's tanh form of `x` written as its eight layers, ½x · (1 + tanh(√(2/π) · (x +
    /// 0.044715 · x³))), the cube a Pow by 3, the result `out`; and its constants.
    pub(crate) fn gelu_tanh_nodes(x: &str, out: &str) -> (Vec<Node>, Vec<(&'static str, Tensor)>) {
        let nodes = vec![
            node("gelu_half", "Mul", &[x, "half_c"], &["gelu_h"]),
            node("gelu_cube", "Pow", &[x, "three"], &["gelu_x3"]),
            node("gelu_cubic", "Mul", &["k1", "gelu_x3"], &["gelu_c"]),
            node("gelu_inner", "Add", &[x, "gelu_c"], &["gelu_i"]),
            node("gelu_scaled", "Mul", &["gelu_i", "k2"], &["gelu_a"]),
            node("gelu_tanh", "Tanh", &["gelu_a"], &["gelu_t"]),
            node("gelu_plus1", "Add", &["gelu_t", "one_c"], &["gelu_t1"]),
            node("gelu", "Mul", &["gelu_h", "gelu_t1"], &[out]),
        ];
        let scalar = |v: f32| Tensor::from_f32(vec![], vec![v]);
        let constants = vec![
            ("half_c", scalar(0.5)),
            ("three", scalar(3.0)),
            ("k1", scalar(0.044715)),
            ("k2", scalar(0.797_884_6)),
            ("one_c", scalar(1.0)),
        ];
        (nodes, constants)
    }

    /// A matrix product with GELU's tanh form after it ([`gelu_tanh_nodes`]).
    fn gelu_tanh_model() -> Graph {
        let (k, n) = (8usize, 80usize);
        let (gelu, constants) = gelu_tanh_nodes("h", "out");
        let mut nodes = vec![node("mm", "MatMul", &["x", "w"], &["h"])];
        nodes.extend(gelu);
        let mut inits = vec![("w", Tensor::from_f32(vec![k, n], values(k * n, 24)))];
        inits.extend(constants);
        graph(
            nodes,
            vec![vi("x", &[2, 5, k])],
            vec![vi("out", &[2, 5, n])],
            inits,
        )
    }

    /// GELU's tanh form, its cube a Pow stage: NaN, infinities and values whose cube
    /// overflows float16 go through it as through the layers alone.
    #[test]
    fn gelu_in_its_tanh_form_is_a_matrix_products_epilogue() {
        let g = gelu_tanh_model();
        let interp = Interpreter::new(&g).unwrap();
        assert_eq!(chain_lengths(&interp), vec![("mm".to_string(), 8)]);
        let mut x = values(80, 25);
        x[3] = f32::NAN;
        x[17] = f32::INFINITY;
        x[30] = 40.0;
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![2, 5, 8], x));
        fused_is_alone(&g, &interp, &feeds);
        // An integer exponent (Pow's kernel computes it in f64): no stage, no epilogue.
        let mut g = gelu_tanh_model();
        (g.initializers).insert("three".into(), Tensor::from_i64(vec![], vec![3]));
        let interp = Interpreter::new(&g).unwrap();
        let (_, times) = interp.run_profiled(&feeds, None).unwrap();
        assert!(times.iter().all(|t| t.fused.is_empty()));
        fused_is_alone(&g, &interp, &feeds);
    }

    #[test]
    fn a_matrix_product_takes_its_columns_constants_and_gelu_as_its_epilogue() {
        let g = gelu_model();
        let interp = Interpreter::new(&g).unwrap();
        assert_eq!(chain_lengths(&interp), vec![("mm".to_string(), 7)]);
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![2, 5, 8], values(80, 23)));
        fused_is_alone(&g, &interp, &feeds);
    }

    /// A profiled run gives the same outputs and times each executed layer once, the fused ones
    /// listed with the layer they ran in.
    #[test]
    fn a_profiled_run_times_each_layer_once_with_its_epilogue() {
        let g = model(Vec::new(), &["out"]);
        let interp = Interpreter::new(&g).unwrap();
        let feeds = feeds();
        let (r, times) = interp.run_profiled(&feeds, None).unwrap();
        assert_eq!(
            bits(&r.outputs[0].1),
            bits(&interp.run(&feeds).unwrap().outputs[0].1)
        );
        let ran: Vec<usize> = times.iter().map(|t| t.node).collect();
        assert_eq!(ran, vec![0, 3, 6, 11]);
        let fused: Vec<Vec<usize>> = times.iter().map(|t| t.fused.clone()).collect();
        assert_eq!(
            fused,
            vec![vec![1, 2], vec![4, 5], vec![7, 8, 9, 10], vec![12, 13, 14]]
        );
        assert!(times.iter().all(|t| t.seconds >= 0.0));
    }

    /// Asserts that the fused run of `g` gives the bits of its layers run one by one (kept
    /// intermediates turn epilogues off), in float32 and under all-float16 and all-bfloat16
    /// plans; returns the fused float32 output.
    fn fused_is_alone(g: &Graph, interp: &Interpreter, feeds: &Feeds) -> Tensor {
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let mut fused = interp.run(feeds).unwrap();
        let alone = interp.run_with(feeds, &keep).unwrap();
        assert_eq!(bits(&fused.outputs[0].1), bits(&alone.outputs[0].1));
        for p in [Precision::Float16, Precision::BFloat16] {
            let plan = PreparedPlan::new(g, &PrecisionPlan::uniform(g, p), &PlanOptions::default())
                .unwrap();
            let f = interp
                .run_plan(feeds, &RunOptions::default(), &plan)
                .unwrap();
            let a = interp.run_plan(feeds, &keep, &plan).unwrap();
            assert_eq!(bits(&f.outputs[0].1), bits(&a.outputs[0].1), "{p:?}");
        }
        fused.outputs.remove(0).1
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.as_f32().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    /// Asserts that a run of `plan` gives the bits of its layers run one by one (kept
    /// intermediates turn epilogues off).
    fn plan_fuses_as_alone(interp: &Interpreter, feeds: &Feeds, plan: &PreparedPlan, what: &str) {
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let fused = interp
            .run_plan(feeds, &RunOptions::default(), plan)
            .unwrap();
        let alone = interp.run_plan(feeds, &keep, plan).unwrap();
        assert_eq!(
            bits(&fused.outputs[0].1),
            bits(&alone.outputs[0].1),
            "{what}"
        );
    }

    /// Plans that give the layers of one chain different precisions (a search's plans: a
    /// few layers back in float32 among float16 ones) still run the chain as an epilogue —
    /// each stage rounds its output to its own layer's precision, and a value whose readers
    /// are in another precision is rounded as they would round it — with the bits of the
    /// layers run one by one.
    #[test]
    fn chains_in_mixed_precisions_fuse_with_the_bits_of_their_layers_alone() {
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let mut x = values(243, 31);
        x[40] = f32::NAN;
        x[41] = 1e30;
        let mut hs_feeds = Feeds::new();
        hs_feeds.insert("x".into(), Tensor::from_f32(vec![1, 3, 9, 9], x));
        let mut gelu_feeds = Feeds::new();
        gelu_feeds.insert("x".into(), Tensor::from_f32(vec![2, 5, 8], values(80, 23)));
        let mut gelu_tanh_feeds = Feeds::new();
        gelu_tanh_feeds.insert("x".into(), Tensor::from_f32(vec![2, 5, 8], values(80, 26)));
        let cases = [
            (model(Vec::new(), &["out"]), feeds()),
            (hard_swish_graph(), hs_feeds),
            (gelu_model(), gelu_feeds),
            (gelu_tanh_model(), gelu_tanh_feeds),
        ];
        let choices = [Precision::Float32, Precision::Float16, Precision::BFloat16];
        let mut rng = crate::data::loader::Mt19937::new(7);
        let mut mixed_and_fused = 0;
        for (g, feeds) in &cases {
            let interp = Interpreter::new(g).unwrap();
            for _ in 0..40 {
                let layers: Vec<Precision> = (0..g.nodes.len())
                    .map(|_| choices[(rng.random_sample() * 3.0) as usize % 3])
                    .collect();
                let plan = PreparedPlan::new(
                    g,
                    &PrecisionPlan::from_layers(layers.clone()),
                    &PlanOptions::default(),
                )
                .unwrap();
                let (fused, times) = interp.run_profiled(feeds, Some(&plan)).unwrap();
                let alone = interp.run_plan(feeds, &keep, &plan).unwrap();
                assert_eq!(
                    bits(&fused.outputs[0].1),
                    bits(&alone.outputs[0].1),
                    "{layers:?}"
                );
                // Count the epilogues that took layers of more than one precision.
                mixed_and_fused += times
                    .iter()
                    .filter(|t| {
                        t.fused.iter().any(|&j| {
                            layers[j] != layers[t.node] || layers[j] != layers[t.fused[0]]
                        })
                    })
                    .count();
            }
        }
        assert!(mixed_and_fused > 20, "{mixed_and_fused} mixed epilogues");
    }

    /// Plans composed from two prepared plans (a search's candidates) share one epilogue
    /// cache, keyed by where each layer of a chain was prepared: a chain whose layers come
    /// from the same plans takes the stages made for an earlier candidate, one whose layers
    /// changed gets its own, and every run gives the bits of its layers run one by one.
    #[test]
    fn composed_plans_share_epilogues_by_where_their_layers_were_prepared() {
        let g = model(Vec::new(), &["out"]);
        let interp = Interpreter::new(&g).unwrap();
        let feeds = feeds();
        let prepare = |p| {
            PreparedPlan::new(&g, &PrecisionPlan::uniform(&g, p), &PlanOptions::default()).unwrap()
        };
        let (low, high) = (prepare(Precision::Float16), prepare(Precision::Float32));
        // The SiLU's Mul (node 5) back in float32: only c2's chain changes.
        let first = low.with_layers_of(&high, &[5]).unwrap();
        interp
            .run_plan(&feeds, &RunOptions::default(), &first)
            .unwrap();
        let made = low.epilogues.len();
        assert_eq!(made, 4);
        // The tanh (node 14) instead: c1, c2 and c3 have the layers of before, c4 not.
        let second = low.with_layers_of(&high, &[14]).unwrap();
        interp
            .run_plan(&feeds, &RunOptions::default(), &second)
            .unwrap();
        assert_eq!(low.epilogues.len(), made + 2);
        let mut rng = crate::data::loader::Mt19937::new(3);
        for _ in 0..20 {
            let marked: Vec<usize> = (0..g.nodes.len())
                .filter(|_| rng.random_sample() < 0.3)
                .collect();
            let p = low.with_layers_of(&high, &marked).unwrap();
            plan_fuses_as_alone(&interp, &feeds, &p, &format!("{marked:?}"));
        }
    }

    /// Runs through a cache (a search's evaluations) take epilogues too: the cache keeps a
    /// chain's result only, and a later run whose chain is unchanged takes that result without
    /// running the convolution or its layers. Random plans in turn, with a budget that keeps
    /// everything and with one that keeps almost nothing, give the bits of the layers run one
    /// by one.
    #[test]
    fn cached_runs_take_epilogues_and_skip_chains_whose_result_is_cached() {
        use crate::exec::ValueCache;
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let g = model(Vec::new(), &["out"]);
        let interp = Interpreter::new(&g).unwrap();
        let feeds = feeds();
        let choices = [Precision::Float32, Precision::Float16, Precision::BFloat16];
        let mut rng = crate::data::loader::Mt19937::new(11);
        for budget in [1 << 30, 4096] {
            let mut cache = ValueCache::new(budget);
            let mut layers = vec![Precision::Float16; g.nodes.len()];
            for _ in 0..30 {
                // One layer changes at a time, as between a search's evaluations.
                let i = (rng.random_sample() * g.nodes.len() as f64) as usize % g.nodes.len();
                layers[i] = choices[(rng.random_sample() * 3.0) as usize % 3];
                let plan = PreparedPlan::new(
                    &g,
                    &PrecisionPlan::from_layers(layers.clone()),
                    &PlanOptions::default(),
                )
                .unwrap();
                let cached = interp
                    .run_cached(&feeds, 0, &RunOptions::default(), Some(&plan), &mut cache)
                    .unwrap();
                let alone = interp.run_plan(&feeds, &keep, &plan).unwrap();
                assert_eq!(
                    bits(&cached.outputs[0].1),
                    bits(&alone.outputs[0].1),
                    "{layers:?} budget {budget}"
                );
            }
        }
        // The same plan again: nothing runs, the output comes from the cache.
        let mut cache = ValueCache::new(1 << 30);
        let plan = PreparedPlan::new(
            &g,
            &PrecisionPlan::uniform(&g, Precision::Float16),
            &PlanOptions::default(),
        )
        .unwrap();
        interp
            .run_cached(&feeds, 0, &RunOptions::default(), Some(&plan), &mut cache)
            .unwrap();
        // Four convolutions with their chains: 15 layers counted as run.
        assert_eq!(cache.stats.executed, 15);
        let before = cache.stats.executed;
        let again = interp
            .run_cached(&feeds, 0, &RunOptions::default(), Some(&plan), &mut cache)
            .unwrap();
        assert_eq!(cache.stats.executed, before);
        let alone = interp.run_plan(&feeds, &keep, &plan).unwrap();
        assert_eq!(bits(&again.outputs[0].1), bits(&alone.outputs[0].1));
    }

    /// A Sigmoid and a Mul of its input and output become one SiLU stage (either operand
    /// order) where nothing else reads the sigmoid, with the bits of the two stages run one by
    /// one, rounded or not; where a later stage reads the sigmoid they stay two.
    #[test]
    fn sigmoid_then_mul_of_its_input_is_one_silu_stage_with_the_same_bits() {
        use super::{assign_buffers, fuse_silu, Arg, Epilogue, Staged};
        use crate::numeric::Rounding;
        use crate::ops::logistic::logistic_in_place;
        use crate::ops::{Piece, Stage};
        let stage = |op: &str| -> Stage {
            match op {
                "Sigmoid" => Stage::Map(Box::new(|_, v: &mut [f32]| logistic_in_place(v))),
                "Mul" => Stage::Combine(Box::new(|a: &mut [f32], b: &[f32]| {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x *= *y)
                })),
                "Add" => Stage::Combine(Box::new(|a: &mut [f32], b: &[f32]| {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x += *y)
                })),
                _ => Stage::Map(Box::new(|_, v: &mut [f32]| {
                    v.iter_mut().for_each(|x| *x = x.max(0.0))
                })),
            }
        };
        // (op, registers read) per stage, register k + 1 being stage k's output; the number
        // of stages after fusion.
        type Spec<'a> = Vec<(&'a str, Vec<usize>)>;
        let cases: Vec<(Spec, usize)> = vec![
            // Relu, then SiLU of its output (σ·x order), then Relu.
            (
                vec![
                    ("Relu", vec![0]),
                    ("Sigmoid", vec![1]),
                    ("Mul", vec![2, 1]),
                    ("Relu", vec![3]),
                ],
                3,
            ),
            // x·σ(x) on the kernel's output.
            (vec![("Sigmoid", vec![0]), ("Mul", vec![0, 1])], 1),
            // σ read again later: no fusion.
            (
                vec![
                    ("Sigmoid", vec![0]),
                    ("Mul", vec![0, 1]),
                    ("Add", vec![2, 1]),
                ],
                3,
            ),
        ];
        let values: Vec<f32> = (0..1000)
            .map(|i| (i as f32 * 0.37).sin() * 12.0)
            .chain([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 1e-40])
            .collect();
        for (spec, fused_len) in cases {
            let ops: Vec<Option<&str>> = spec.iter().map(|(op, _)| Some(*op)).collect();
            for round in [None, Some(Rounding::F16), Some(Rounding::BF16)] {
                let make = || -> Vec<Staged> {
                    spec.iter()
                        .map(|(op, r)| Staged {
                            stage: stage(op),
                            regs: r.iter().map(|&r| Arg::Reg(r)).collect(),
                            round,
                            then: None,
                        })
                        .collect()
                };
                let run = |stages: Vec<Staged>| {
                    let (ops, temps, result) = assign_buffers(stages).unwrap();
                    let e = Epilogue {
                        ops,
                        temps,
                        result,
                        round,
                        then: None,
                        reads_operands: false,
                        single_pass: None,
                    };
                    let mut v = values.clone();
                    e.apply(Piece::plane(0, 0), &mut v, &[]);
                    v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                let fused = fuse_silu(make(), &ops);
                assert_eq!(fused.len(), fused_len, "{ops:?}");
                assert_eq!(run(fused), run(make()), "{ops:?} {round:?}");
            }
        }
    }

    /// paddle2onnx's HardSwish, `x · Clip(x + 3, 0, 6) / 6`, then a Clip with only a lower
    /// bound: the Clips take their bounds from inputs, keep NaN, and fuse bit for bit.
    #[test]
    fn clips_with_constant_bounds_run_as_stages() {
        let g = hard_swish_graph();
        let interp = Interpreter::new(&g).unwrap();
        assert_eq!(chain_lengths(&interp), vec![("c".to_string(), 5)]);
        let mut x = values(243, 31);
        x[40] = f32::NAN;
        x[41] = 1e30;
        let mut feeds = Feeds::new();
        feeds.insert("x".into(), Tensor::from_f32(vec![1, 3, 9, 9], x));
        let fused = fused_is_alone(&g, &interp, &feeds);
        let out = fused.as_f32().unwrap();
        assert!(out.iter().any(|v| v.is_nan()));
        assert!(out.iter().filter(|v| !v.is_nan()).all(|&v| v >= -0.25));
    }

    /// A residual block: `c1` (3×3) → Relu → `c2` (3×3, `group` groups; then a
    /// BatchNormalization where `bn`), plus the block's input `x` (`shortcut` None) or a 1×1
    /// convolution of it (`Some(true)`: written before `c2`, `Some(false)`: after it), added in
    /// that order (`x_first`: the other way round), then a Relu.
    fn residual_graph(
        c: usize,
        side: usize,
        n: usize,
        group: usize,
        shortcut: Option<bool>,
        x_first: bool,
        bn: bool,
    ) -> Graph {
        let t = |shape: Vec<usize>, seed| {
            let len = shape.iter().product();
            Tensor::from_f32(shape, values(len, seed))
        };
        let mut c2 = conv("c2", &["a1", "w2", "b2"], if bn { "b0" } else { "b" }, 1);
        c2.attrs
            .insert("group".into(), Attribute::Int(group as i64));
        let other = if shortcut.is_some() { "t" } else { "x" };
        let sum = if x_first { [other, "b"] } else { ["b", other] };
        let mut nodes = vec![
            conv("c1", &["x", "w1"], "a", 1),
            node("relu1", "Relu", &["a"], &["a1"]),
        ];
        let cs = conv("cs", &["x", "ws"], "t", 0);
        let mut c2 = vec![c2];
        if bn {
            let inputs = ["b0", "s", "bb", "mu", "var"];
            c2.push(node("bn", "BatchNormalization", &inputs, &["b"]));
        }
        match shortcut {
            Some(true) => nodes.extend([cs].into_iter().chain(c2)),
            Some(false) => nodes.extend(c2.into_iter().chain([cs])),
            None => nodes.extend(c2),
        }
        nodes.push(node("sum", "Add", &sum, &["s"]));
        nodes.push(node("relu2", "Relu", &["s"], &["out"]));
        graph(
            nodes,
            vec![vi("x", &[n, c, side, side])],
            vec![vi("out", &[n, c, side, side])],
            vec![
                ("w1", t(vec![c, c, 3, 3], 41)),
                ("w2", t(vec![c, c / group, 3, 3], 42)),
                ("b2", t(vec![c], 43)),
                ("ws", t(vec![c, c, 1, 1], 44)),
                ("s", t(vec![c], 46)),
                ("bb", t(vec![c], 47)),
                ("mu", t(vec![c], 48)),
                (
                    "var",
                    Tensor::from_f32(
                        vec![c],
                        values(c, 49).iter().map(|v| v.abs() + 0.1).collect(),
                    ),
                ),
            ],
        )
    }

    /// Residual blocks: a convolution's output plus an earlier value (the block's input, or a
    /// shortcut convolution's output), then a Relu — the Add and the Relu run as the epilogue
    /// of whichever of the two convolutions runs later, reading the other operand where each
    /// piece of the output lies, on each path of the convolution (the gathered product's
    /// short planes' block rows, pieces and whole planes, batches of images, both depthwise
    /// loops): the bits of the layers run one by one in float32, all-float16 and
    /// all-bfloat16, and under random mixed plans (an Add in float16 rounds a float32
    /// operand as it reads it). A wrong offset into the operand fails every case.
    #[test]
    fn residual_adds_run_in_the_epilogue_with_the_bits_of_their_layers_alone() {
        let choices = [Precision::Float32, Precision::Float16, Precision::BFloat16];
        let mut rng = crate::data::loader::Mt19937::new(5);
        // (channels, side, images, c2's groups, shortcut, x first, a BatchNormalization after
        // c2: the chain then is the affine stage, the Add and the Relu, which the gathered
        // product computes in registers as it stores its blocks)
        let cases = [
            (16, 6, 1, 1, None, false, false),
            (16, 6, 1, 1, None, false, true),
            (16, 20, 1, 1, None, true, false),
            (16, 20, 2, 1, None, true, true),
            (24, 9, 1, 2, Some(true), false, true),
            (8, 10, 1, 1, Some(true), false, false),
            (8, 30, 2, 1, Some(false), false, false),
            (16, 30, 1, 1, Some(false), true, true),
            (16, 12, 1, 16, None, false, false),
            (16, 5, 2, 16, Some(true), true, false),
            (8, 12, 2, 8, None, false, false),
            // Rows of 48 and pointwise planes of 48² (the planar product, on AVX-512 CPUs).
            (16, 48, 1, 1, None, true, false),
            (8, 48, 2, 1, Some(true), false, false),
        ];
        // On one thread and on two: the product's blocks (and so whether the epilogue takes
        // pieces or whole planes) depend on the threads.
        let pools: Vec<rayon::ThreadPool> = [1, 2]
            .map(|t| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .unwrap()
            })
            .into();
        for ((c, side, n, group, shortcut, x_first, bn), pool) in cases
            .into_iter()
            .flat_map(|case| pools.iter().map(move |p| (case, p)))
        {
            pool.install(|| {
                let what = format!(
                    "{c}×{side}², {n} images, {group} groups, {shortcut:?} {x_first}, bn {bn}, \
                     {} threads",
                    pool.current_num_threads()
                );
                let g = residual_graph(c, side, n, group, shortcut, x_first, bn);
                let interp = Interpreter::new(&g).unwrap();
                let anchor = if shortcut == Some(false) { "cs" } else { "c2" };
                let with_bn = bn && anchor == "c2";
                let lengths = chain_lengths(&interp);
                assert!(
                    lengths.contains(&(anchor.to_string(), 2 + with_bn as usize)),
                    "{what}: {lengths:?}"
                );
                let mut feeds = Feeds::new();
                let x = values(n * c * side * side, 45);
                feeds.insert("x".into(), Tensor::from_f32(vec![n, c, side, side], x));
                fused_is_alone(&g, &interp, &feeds);
                // The Add and the second Relu ran inside the later convolution.
                let (_, times) = interp.run_profiled(&feeds, None).unwrap();
                let sum = g.nodes.iter().position(|n| n.name == "sum").unwrap();
                let a = g.nodes.iter().position(|n| n.name == anchor).unwrap();
                let t = times.iter().find(|t| t.node == a).unwrap();
                let first = sum - with_bn as usize;
                assert_eq!(t.fused, (first..sum + 2).collect::<Vec<_>>(), "{what}");
                for _ in 0..6 {
                    let layers: Vec<Precision> = (0..g.nodes.len())
                        .map(|_| choices[(rng.random_sample() * 3.0) as usize % 3])
                        .collect();
                    let plan = PreparedPlan::new(
                        &g,
                        &PrecisionPlan::from_layers(layers.clone()),
                        &PlanOptions::default(),
                    )
                    .unwrap();
                    plan_fuses_as_alone(&interp, &feeds, &plan, &format!("{what} {layers:?}"));
                }
            });
        }
    }

    /// An operand of another shape than the convolution's output (a per-channel bias fed as
    /// an input, which the Add broadcasts): the kernel takes the chain's layers before the
    /// Add as its epilogue (the SiLU) and leaves the rest to run on their own; an operand of
    /// the output's shape takes the whole chain. The bits are those of the layers alone.
    #[test]
    fn an_operand_of_another_shape_leaves_the_layers_from_its_reader_to_run_alone() {
        for (shape, ran, fused) in [
            (vec![1, 8, 1, 1], vec![0, 3, 4], vec![1, 2]),
            (vec![1, 8, 10, 10], vec![0], vec![1, 2, 3, 4]),
        ] {
            let w = Tensor::from_f32(vec![8, 8, 3, 3], values(576, 51));
            let g = graph(
                vec![
                    conv("c", &["x", "w"], "y", 1),
                    node("sig", "Sigmoid", &["y"], &["y1"]),
                    node("silu", "Mul", &["y", "y1"], &["y2"]),
                    node("sum", "Add", &["y2", "other"], &["s"]),
                    node("relu", "Relu", &["s"], &["out"]),
                ],
                vec![vi("x", &[1, 8, 10, 10]), vi("other", &shape)],
                vec![vi("out", &[1, 8, 10, 10])],
                vec![("w", w)],
            );
            let interp = Interpreter::new(&g).unwrap();
            assert_eq!(chain_lengths(&interp), vec![("c".to_string(), 4)]);
            let mut feeds = Feeds::new();
            feeds.insert(
                "x".into(),
                Tensor::from_f32(vec![1, 8, 10, 10], values(800, 52)),
            );
            let len = shape.iter().product();
            feeds.insert(
                "other".into(),
                Tensor::from_f32(shape.clone(), values(len, 53)),
            );
            let out = fused_is_alone(&g, &interp, &feeds);
            assert_eq!(out.shape(), &[1, 8, 10, 10]);
            let (_, times) = interp.run_profiled(&feeds, None).unwrap();
            assert_eq!(
                times.iter().map(|t| t.node).collect::<Vec<_>>(),
                ran,
                "{shape:?}"
            );
            assert_eq!(times[0].fused, fused, "{shape:?}");
        }
    }

    /// A transformer's residual: MatMul, bias Add, then the block's input added — the two
    /// Adds as the product's epilogue, reading the input row by row.
    #[test]
    fn a_matrix_products_residual_add_is_its_epilogue() {
        let g = graph(
            vec![
                node("mm", "MatMul", &["x", "w"], &["h"]),
                node("bias", "Add", &["h", "bv"], &["hb"]),
                node("res", "Add", &["x", "hb"], &["out"]),
            ],
            vec![vi("x", &[2, 5, 16])],
            vec![vi("out", &[2, 5, 16])],
            vec![
                ("w", Tensor::from_f32(vec![16, 16], values(256, 61))),
                ("bv", Tensor::from_f32(vec![16], values(16, 62))),
            ],
        );
        let interp = Interpreter::new(&g).unwrap();
        assert_eq!(chain_lengths(&interp), vec![("mm".to_string(), 2)]);
        let mut feeds = Feeds::new();
        feeds.insert(
            "x".into(),
            Tensor::from_f32(vec![2, 5, 16], values(160, 63)),
        );
        fused_is_alone(&g, &interp, &feeds);
        let (_, times) = interp.run_profiled(&feeds, None).unwrap();
        assert_eq!(times.iter().map(|t| t.node).collect::<Vec<_>>(), vec![0]);
    }

    /// A decomposed HardSwish after a convolution and a Clip with a lower bound only.
    fn hard_swish_graph() -> Graph {
        let scalar = |v: f32| Tensor::from_f32(vec![], vec![v]);
        graph(
            vec![
                conv("c", &["x", "w"], "y", 1),
                node("add", "Add", &["y", "three"], &["a"]),
                node("clip", "Clip", &["a", "zero", "six"], &["b"]),
                node("mul", "Mul", &["y", "b"], &["m"]),
                node("div", "Div", &["m", "six"], &["d"]),
                node("floor", "Clip", &["d", "low"], &["out"]),
            ],
            vec![vi("x", &[1, 3, 9, 9])],
            vec![vi("out", &[])],
            vec![
                ("w", Tensor::from_f32(vec![16, 3, 3, 3], values(432, 30))),
                ("three", scalar(3.0)),
                ("zero", scalar(0.0)),
                ("six", scalar(6.0)),
                ("low", scalar(-0.25)),
            ],
        )
    }

    /// The decomposed HardSwish's stages are the lanewise kinds that round in their own pass
    /// (a one-value constant, Clip; the product of two chain values), not closures that the
    /// epilogue rounds in a pass after them.
    #[test]
    fn one_value_constants_and_chain_products_make_lanewise_stages() {
        use crate::ops::lanewise::{Binary, Lanewise};
        use crate::ops::{ChainShape, Stage};
        let g = hard_swish_graph();
        let interp = Interpreter::new(&g).unwrap();
        let chain = interp.chains[0].as_ref().unwrap();
        let shape = ChainShape {
            rank: 4,
            channels: 16,
            axis: 1,
        };
        let e = super::Epilogue::prepare(chain, 0, &g, &interp.steps, None, shape)
            .unwrap()
            .unwrap();
        let kinds: Vec<String> = (e.ops.iter())
            .map(|op| match &op.stage {
                Stage::Lanewise(l) => format!("{l:?}"),
                Stage::Zip(b) => format!("{b:?}"),
                Stage::Map(_) => "Map".into(),
                Stage::Affine { .. } => "Affine".into(),
                Stage::Combine(_) => "Combine".into(),
            })
            .collect();
        let want = [
            format!("{:?}", Lanewise::Add(3.0)),
            format!("{:?}", Lanewise::Clip(0.0, 6.0)),
            format!("{:?}", Binary::Mul),
            format!("{:?}", Lanewise::Div(6.0)),
            format!("{:?}", Lanewise::Clip(-0.25, f32::MAX)),
        ];
        assert_eq!(kinds, want);
    }

    /// Weights given as Constant nodes (as paddle2onnx writes them) are folded weights: the
    /// chains fuse as with initializers, the Constant nodes do not run, the values are the
    /// same; a run that keeps intermediates still runs them and shows their values.
    #[test]
    fn constant_node_weights_are_weights_of_the_chains() {
        let with_inits = model(Vec::new(), &["out"]);
        let mut g = with_inits.clone();
        let mut constants = Vec::new();
        for name in ["w1", "s", "bb", "mu", "var", "w2", "k", "d"] {
            let mut c = node(&format!("const_{name}"), "Constant", &[], &[name]);
            let t = g.initializers.remove(name).unwrap();
            c.attrs.insert("value".into(), Attribute::Tensor(t));
            constants.push(c);
        }
        let n = constants.len();
        constants.append(&mut g.nodes);
        g.nodes = constants;
        crate::fold::fold_weights(&mut g);
        let interp = Interpreter::new(&g).unwrap();
        let reference = Interpreter::new(&with_inits).unwrap();
        assert_eq!(chain_lengths(&interp), chain_lengths(&reference));
        // What a plain run executes (a search's "without the cache" count): not the Constants.
        assert_eq!(interp.layers_per_run(), reference.layers_per_run());
        assert_eq!(interp.layers_per_run(), g.nodes.len() as u64 - n as u64);
        let feeds = feeds();
        let (r, times) = interp.run_profiled(&feeds, None).unwrap();
        let ran: Vec<usize> = times.iter().map(|t| t.node).collect();
        assert_eq!(ran, vec![n, n + 3, n + 6, n + 11]);
        let want = bits(&reference.run(&feeds).unwrap().outputs[0].1);
        assert_eq!(bits(&r.outputs[0].1), want);
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let kept = interp.run_with(&feeds, &keep).unwrap();
        assert_eq!(bits(&kept.outputs[0].1), want);
        assert_eq!(
            bits(&kept.intermediates["w2"]),
            bits(&with_inits.initializers["w2"])
        );
    }

    /// A run with epilogues gives the bits of the run that executes every layer on its own
    /// (kept intermediates turn epilogues off): float32, float16, bfloat16, and a plan that
    /// mixes precisions inside chains.
    /// A run keeps the epilogues it made (one per chain; under a plan, in the plan) and the
    /// next run takes them, with the same bits; a clone of a plan starts without them.
    #[test]
    fn runs_reuse_the_epilogues_they_made() {
        let g = model(Vec::new(), &["out"]);
        let interp = Interpreter::new(&g).unwrap();
        let feeds = feeds();
        let chains = chain_lengths(&interp).len();
        assert!(chains > 0);
        assert_eq!(interp.epilogues.len(), 0);
        let first = interp.run(&feeds).unwrap();
        assert_eq!(interp.epilogues.len(), chains);
        let second = interp.run(&feeds).unwrap();
        assert_eq!(interp.epilogues.len(), chains);
        assert_eq!(bits(&first.outputs[0].1), bits(&second.outputs[0].1));
        let plan = PrecisionPlan::uniform(&g, Precision::Float16);
        let p = PreparedPlan::new(&g, &plan, &PlanOptions::default()).unwrap();
        let first = interp.run_plan(&feeds, &RunOptions::default(), &p).unwrap();
        assert_eq!(p.epilogues.len(), chains);
        assert_eq!(interp.epilogues.len(), chains);
        let copy = p.clone();
        assert_eq!(copy.epilogues.len(), 0);
        let second = interp.run_plan(&feeds, &RunOptions::default(), &p).unwrap();
        let third = interp
            .run_plan(&feeds, &RunOptions::default(), &copy)
            .unwrap();
        assert_eq!(bits(&first.outputs[0].1), bits(&second.outputs[0].1));
        assert_eq!(bits(&first.outputs[0].1), bits(&third.outputs[0].1));
    }

    const NO_ROUNDS: [Option<Rounding>; 2] = [None, None];

    /// The one-pass form with roundings (an emulated plan's BatchNormalization → Add → Relu or
    /// Clip, each layer in float32, float16 or bfloat16, the operand read on another grid, a
    /// reader in another precision): each value a kernel stores through it
    /// ([`crate::ops::StoreEpilogue::value`]) has the bits of the stages run in turn.
    #[test]
    fn the_store_form_rounds_where_the_stages_do() {
        let specials = [
            f32::NAN,
            f32::from_bits(0x7fc0_1234),
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            6.0e-8,
            65519.0,
            65520.0,
            3.0e38,
            -2.5,
            0.1,
            1.0 / 3.0,
            16_777_215.0,
            -1.0e-3,
        ];
        let v: Vec<f32> = (0..320)
            .map(|i| specials[i % 16] * if i % 5 == 0 { 1.0 } else { 1.37 })
            .collect();
        let o: Vec<f32> = (0..320).map(|i| specials[(i * 7 + 3) % 16] * 0.9).collect();
        let grids = [None, Some(Rounding::F16), Some(Rounding::BF16)];
        let mut rng = crate::data::loader::Mt19937::new(11);
        let mut pick = || grids[(rng.random_sample() * 3.0) as usize % 3];
        let (scale, shift) = (vec![1.5f32, 0.1], vec![-0.25f32, 1.0 / 3.0]);
        let mut rounded = 0;
        for case in 0..400 {
            let last = [None, Some(Lanewise::Relu), Some(Lanewise::Clip(-1.0, 6.1))][case % 3];
            let (with_operand, operand_first) =
                [(false, false), (true, false), (true, true)][case / 3 % 3];
            let anchor = [pick(), pick()];
            let (affine, sum, after) = ([pick(), pick()], [pick(), pick()], [pick(), pick()]);
            let operand = Arg::Operand {
                index: 0,
                round: pick(),
            };
            // As `assign_buffers` lays them out: an Add of the operand first writes a
            // temporary, and the stages after it work there.
            let temps = (with_operand && operand_first) as usize;
            let op = |stage: Stage, inputs: Vec<Arg>, out: usize, r: [Option<Rounding>; 2]| Op {
                stage,
                inputs,
                out,
                round: r[0],
                then: r[1],
            };
            let mut ops = vec![op(
                Stage::Affine {
                    scale: scale.clone(),
                    shift: shift.clone(),
                },
                vec![Arg::Reg(0)],
                0,
                affine,
            )];
            if with_operand {
                let inputs = match operand_first {
                    true => vec![operand, Arg::Reg(0)],
                    false => vec![Arg::Reg(0), operand],
                };
                ops.push(op(Stage::Zip(Binary::Add), inputs, temps, sum));
            }
            if let Some(l) = last {
                ops.push(op(Stage::Lanewise(l), vec![Arg::Reg(temps)], temps, after));
            }
            let pass = SinglePass::of(&ops, temps, anchor).expect("one pass");
            rounded += !pass.rounds.is_empty() as usize;
            let e = Epilogue {
                ops,
                temps,
                result: temps,
                round: anchor[0],
                then: anchor[1],
                reads_operands: with_operand,
                single_pass: Some(pass),
            };
            // The operand on a grid of its own (its layer rounded it as it wrote it), said
            // or not: the stages in turn read it on no known grid (a pass with roundings is not
            // taken here), the store form knowing where it is (a rounding to its own grid
            // left out).
            let on = pick();
            let mut o = o.clone();
            if let Some(r) = on {
                r.round_slice(&mut o);
            }
            let said = [Operand::float32(&o), Operand { values: &o, on }][case / 9 % 2];
            let mut want = v.clone();
            e.apply(Piece::plane(1, 0), &mut want, &[Operand::float32(&o)]);
            let store = e.store_form(&[said]).expect("the store form");
            let mut by_stages = v.clone();
            e.apply(Piece::plane(1, 0), &mut by_stages, &[said]);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
            assert_eq!(
                bits(&by_stages),
                bits(&want),
                "case {case}: the stages, on {on:?}"
            );
            for (i, (&x, &w)) in v.iter().zip(&want).enumerate() {
                let got = store.value(x, 1, i);
                // Where two NaNs meet in the Add, either may come out.
                assert!(
                    got.to_bits() == w.to_bits() || got.is_nan() && w.is_nan(),
                    "case {case}: {:?}, value {i} ({x}): {got} against {w}",
                    store.rounds
                );
            }
        }
        assert!(rounded > 390, "{rounded} of 400 cases round");
    }

    /// The one-pass affine chain computes what its stages compute in turn, bit for bit, on
    /// NaNs (payloads and signs; where two meet, a NaN), infinities, signed zeros, subnormals
    /// and large values, with
    /// and without an operand and each lanewise stage; an epilogue of BatchNormalization →
    /// Add → Relu takes it, and notes where its stages round.
    #[test]
    fn one_pass_is_the_stages_in_turn() {
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fc0_1234),
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            3.0e38,
            -2.5,
            0.75,
            0.1,
            1.0 / 3.0,
            16_777_215.0,
            -1.0e-3,
        ];
        let v: Vec<f32> = (0..300)
            .map(|i| specials[i % 16] * if i % 5 == 0 { 1.0 } else { 1.5 })
            .collect();
        let o: Vec<f32> = (0..300).map(|i| specials[(i * 7 + 3) % 16]).collect();
        let lasts = [
            None,
            Some(Lanewise::Relu),
            Some(Lanewise::Clip(-1.0, 6.0)),
            Some(Lanewise::Add(0.5)),
        ];
        for (a, b) in [
            (1.5f32, -0.25f32),
            (0.0, -0.0),
            (f32::INFINITY, 1.0),
            (-2.0, f32::NAN),
            (0.1, 1.0 / 3.0),
        ] {
            for last in lasts {
                for (operand, operand_first) in
                    [(None, false), (Some(&o[..]), false), (Some(&o[..]), true)]
                {
                    let mut want = v.clone();
                    crate::ops::norm::affine_stage(
                        crate::ops::Channels::One(1),
                        &mut want,
                        &[9.0, a],
                        &[9.0, b],
                    );
                    match (operand, operand_first) {
                        (Some(o), false) => Binary::Add.run(&mut want, o, None),
                        (Some(o), true) => {
                            let mut sum = o.to_vec();
                            Binary::Add.run(&mut sum, &want, None);
                            want = sum;
                        }
                        (None, _) => {}
                    }
                    if let Some(l) = last {
                        l.run(&mut want, None);
                    }
                    let mut got = v.clone();
                    let pass = SinglePass {
                        operand: operand.map(|_| 0),
                        operand_first,
                        last,
                        rounds: StoreRounds::default(),
                    };
                    pass.run(&mut got, a, b, operand);
                    // Where two NaNs meet in the Add, either may come out (the compiler may
                    // swap an addition's operands): a NaN then, the same bits elsewhere.
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(),
                            "{a} {b} {last:?} {}: value {i} {g} against {w}",
                            operand.is_some()
                        );
                    }
                }
            }
        }
        let affine = || Stage::Affine {
            scale: vec![1.0],
            shift: vec![0.0],
        };
        let op = |stage: Stage, inputs: Vec<Arg>, round: Option<Rounding>| Op {
            stage,
            inputs,
            out: 0,
            round,
            then: None,
        };
        let operand = Arg::Operand {
            index: 0,
            round: None,
        };
        let chain = vec![
            op(affine(), vec![Arg::Reg(0)], None),
            op(Stage::Zip(Binary::Add), vec![Arg::Reg(0), operand], None),
            op(Stage::Lanewise(Lanewise::Relu), vec![Arg::Reg(0)], None),
        ];
        let plain = SinglePass {
            operand: Some(0),
            operand_first: false,
            last: Some(Lanewise::Relu),
            rounds: StoreRounds::default(),
        };
        assert_eq!(SinglePass::of(&chain, 0, NO_ROUNDS), Some(plain));
        // The anchor's roundings are the product's; a stage's, its value's.
        let (f16, bf16) = (Some(Rounding::F16), Some(Rounding::BF16));
        let anchored = SinglePass::of(&chain, 0, [f16, bf16]).unwrap();
        assert_eq!(anchored.rounds.product, [f16, bf16]);
        let rounded = vec![op(affine(), vec![Arg::Reg(0)], Some(Rounding::F16))];
        let pass = SinglePass::of(&rounded, 0, NO_ROUNDS).unwrap();
        assert_eq!(pass.rounds.affine, [f16, None]);
        // The operand first (Add(operand, x)): the pass adds in that order.
        let swapped = vec![
            op(affine(), vec![Arg::Reg(0)], None),
            op(Stage::Zip(Binary::Add), vec![operand, Arg::Reg(0)], None),
        ];
        assert_eq!(
            SinglePass::of(&swapped, 0, NO_ROUNDS),
            Some(SinglePass {
                operand: Some(0),
                operand_first: true,
                last: None,
                rounds: StoreRounds::default(),
            })
        );
        // A Sub of the chain value from the operand does not commute: the stages in turn.
        let subtracted = vec![
            op(affine(), vec![Arg::Reg(0)], None),
            op(Stage::Zip(Binary::Sub), vec![operand, Arg::Reg(0)], None),
        ];
        assert_eq!(SinglePass::of(&subtracted, 0, NO_ROUNDS), None);
        // As `assign_buffers` lays out BatchNormalization → Add(operand, x) → Relu (the bench
        // CNN's shortcuts): the Add writes a temporary, the Relu reads it, the result is there.
        let in_temp = |stage: Stage, inputs: Vec<Arg>| Op {
            out: 1,
            ..op(stage, inputs, None)
        };
        let laid_out = vec![
            op(affine(), vec![Arg::Reg(0)], None),
            in_temp(Stage::Zip(Binary::Add), vec![operand, Arg::Reg(0)]),
            in_temp(Stage::Lanewise(Lanewise::Relu), vec![Arg::Reg(1)]),
        ];
        let want = SinglePass {
            operand: Some(0),
            operand_first: true,
            last: Some(Lanewise::Relu),
            rounds: StoreRounds::default(),
        };
        assert_eq!(SinglePass::of(&laid_out, 1, NO_ROUNDS), Some(want));
        // Not where the result lies elsewhere, or a stage reads a value before the last.
        assert_eq!(SinglePass::of(&laid_out, 0, NO_ROUNDS), None);
        let rereads = vec![
            op(affine(), vec![Arg::Reg(0)], None),
            in_temp(Stage::Zip(Binary::Add), vec![operand, Arg::Reg(0)]),
            in_temp(Stage::Lanewise(Lanewise::Relu), vec![Arg::Reg(0)]),
        ];
        assert_eq!(SinglePass::of(&rereads, 1, NO_ROUNDS), None);
    }

    #[test]
    fn an_epilogue_computes_the_bits_of_its_layers_run_one_by_one() {
        let keep = RunOptions {
            keep_intermediates: true,
        };
        // 7×7 planes (49 positions): the convolutions apply their chains in the product's
        // blocks, a position's channels at a time, instead of per plane.
        let mut seen_at_9 = Vec::new();
        for hw in [9, 7] {
            let g = model_of(Vec::new(), &["out"], hw);
            let interp = Interpreter::new(&g).unwrap();
            let feeds = feeds_of(hw);
            let fused = interp.run(&feeds).unwrap();
            let alone = interp.run_with(&feeds, &keep).unwrap();
            assert_eq!(bits(&fused.outputs[0].1), bits(&alone.outputs[0].1));
            let mut mixed: Vec<Precision> = vec![Precision::Float16; g.nodes.len()];
            mixed[1] = Precision::Float32; // the BatchNormalization
            mixed[4] = Precision::BFloat16; // the SiLU's Sigmoid
            let plans = [
                PrecisionPlan::uniform(&g, Precision::Float16),
                PrecisionPlan::uniform(&g, Precision::BFloat16),
                PrecisionPlan::from_layers(mixed),
            ];
            let mut seen = vec![bits(&fused.outputs[0].1)];
            for plan in plans {
                let p = PreparedPlan::new(&g, &plan, &PlanOptions::default()).unwrap();
                let fused = interp.run_plan(&feeds, &RunOptions::default(), &p).unwrap();
                let alone = interp.run_plan(&feeds, &keep, &p).unwrap();
                assert_eq!(bits(&fused.outputs[0].1), bits(&alone.outputs[0].1), "{hw}");
                seen.push(bits(&fused.outputs[0].1));
            }
            if hw == 9 {
                seen_at_9 = seen;
            }
        }
        let mut seen = seen_at_9;
        let g = model(Vec::new(), &["out"]);
        let interp = Interpreter::new(&g).unwrap();
        let feeds = feeds();
        // Int8 convolutions with their chains in int8 (which writes float32) or float32:
        // the chains are epilogues, and give the bits of the layers run alone.
        let amax: std::collections::BTreeMap<String, f32> = ["x", "y3", "z3", "u5"]
            .iter()
            .map(|n| (n.to_string(), 3.0))
            .collect();
        let opts = PlanOptions {
            amax: Some(&amax),
            ..Default::default()
        };
        let mut int8_convs = vec![Precision::Float32; g.nodes.len()];
        for c in [0, 3, 6, 11] {
            int8_convs[c] = Precision::Int8;
        }
        for plan in [
            PrecisionPlan::uniform(&g, Precision::Int8),
            PrecisionPlan::from_layers(int8_convs),
        ] {
            let p = PreparedPlan::new(&g, &plan, &opts).unwrap();
            let (fused, times) = interp.run_profiled(&feeds, Some(&p)).unwrap();
            let in_epilogues: usize = times.iter().map(|t| t.fused.len()).sum();
            assert_eq!(in_epilogues, 11);
            let alone = interp.run_plan(&feeds, &keep, &p).unwrap();
            assert_eq!(bits(&fused.outputs[0].1), bits(&alone.outputs[0].1));
            seen.push(bits(&fused.outputs[0].1));
        }
        assert_eq!(
            seen[4], seen[5],
            "int8 layers without a kernel of their own are float32"
        );
        seen.pop();
        // The plans' results differ, so each compared what its precision computes.
        for i in 0..seen.len() {
            for j in 0..i {
                assert_ne!(seen[i], seen[j], "plans {i} and {j}");
            }
        }
    }
}
