//! Greedy generation through a KV cache (`--decode N`), as ONNX Runtime GenAI drives a decoder
//! model: the prompt first with an empty cache, then one token at a time, each step's
//! `present.*` fed back as `past_key_values.*` and the attention mask grown by one. What a
//! generation gives back are two outputs: the generated ids ([`TOKENS`], `[batch, N]`, the
//! type of `input_ids`) and each step's last-position logits ([`LOGITS`], `[batch, N, vocab]`,
//! float32). Verdicts on them: [`judges_logits`] and [`logit_steps`].
//!
//! Every step takes the argmax of its own logits (free running, no teacher forcing), exactly
//! N tokens, with no stop at an end-of-sequence id: every candidate's outputs have the
//! reference's shapes, and a candidate whose token differs goes on from its own token.

use crate::compare::{Criterion, MetricKind};
use crate::error::{Error, Result};
use crate::graph::{Dim, Graph};
use crate::tensor::{DType, Feeds, Tensor, TensorData};

/// The generated ids.
pub const TOKENS: &str = crate::compare::metrics::TOKENS_OUTPUT;
/// Each step's logits at the last position.
pub const LOGITS: &str = "logits";

const IDS: &str = "input_ids";
const MASK: &str = "attention_mask";
const POSITIONS: &str = "position_ids";
const PAST: &str = "past_key_values.";
const PRESENT: &str = "present.";

fn genai_names() -> &'static str {
    "--decode drives models with ONNX Runtime GenAI's names: inputs input_ids, attention_mask, \
     past_key_values.N.key/.value; outputs logits, present.N.key/.value"
}

/// One past/present pair of the KV cache.
#[derive(Clone, Debug)]
struct Cache {
    past: String,
    present: String,
    heads: usize,
    head_size: usize,
    dtype: DType,
}

/// One model run's outputs, by name.
pub type StepOutputs = Vec<(String, Tensor)>;

/// What runs the model for a generation: (step, feeds) → outputs.
pub type StepRun<'r> = dyn FnMut(usize, &Feeds) -> Result<StepOutputs> + 'r;

/// A model's generation loop, checked against its inputs and outputs once.
#[derive(Clone, Debug)]
pub struct Decoder {
    steps: usize,
    ids: DType,
    mask: Option<DType>,
    positions: Option<DType>,
    caches: Vec<Cache>,
}

impl Decoder {
    /// The loop generating `steps` tokens with `graph`; an error names what the model lacks.
    pub fn new(graph: &Graph, steps: usize) -> Result<Decoder> {
        if steps == 0 {
            return Err(Error::Invalid("--decode: expected at least 1 token".into()));
        }
        let input = |name: &str| graph.inputs.iter().find(|v| v.name == name);
        let int_type = |name: &str| -> Result<Option<DType>> {
            let Some(v) = input(name) else {
                return Ok(None);
            };
            match v.dtype {
                Some(t @ (DType::I64 | DType::I32)) => Ok(Some(t)),
                t => Err(Error::Invalid(format!(
                    "--decode: input '{name}' has type {}, expected int64 or int32",
                    t.map_or("unknown", DType::name)
                ))),
            }
        };
        let ids = int_type(IDS)?.ok_or_else(|| {
            Error::Invalid(format!(
                "--decode: the model has no input '{IDS}' ({})",
                genai_names()
            ))
        })?;
        if !graph.outputs.iter().any(|v| v.name == LOGITS) {
            return Err(Error::Invalid(format!(
                "--decode: the model has no output '{LOGITS}' ({})",
                genai_names()
            )));
        }
        let mut caches = Vec::new();
        for v in graph.inputs.iter().filter(|v| v.name.starts_with(PAST)) {
            let present = format!("{PRESENT}{}", &v.name[PAST.len()..]);
            if !graph.outputs.iter().any(|o| o.name == present) {
                return Err(Error::Invalid(format!(
                    "--decode: input '{}' has no output '{present}' to be fed from",
                    v.name
                )));
            }
            let fixed = |k: usize| match v.shape.as_deref().and_then(|s| s.get(k)) {
                Some(Dim::Fixed(n)) if v.shape.as_ref().is_some_and(|s| s.len() == 4) => Some(*n),
                _ => None,
            };
            let (Some(heads), Some(head_size)) = (fixed(1), fixed(3)) else {
                return Err(Error::Invalid(format!(
                    "--decode: input '{}' must be declared [batch, kv_heads, past_sequence_length, head_size] with kv_heads and head_size fixed (it is {})",
                    v.name,
                    v.shape_string()
                )));
            };
            let dtype = v.dtype.filter(|t| t.is_float()).ok_or_else(|| {
                Error::Invalid(format!(
                    "--decode: input '{}' must be a float tensor",
                    v.name
                ))
            })?;
            caches.push(Cache {
                past: v.name.clone(),
                present,
                heads,
                head_size,
                dtype,
            });
        }
        if caches.is_empty() {
            return Err(Error::Invalid(format!(
                "--decode: the model has no KV cache input '{PAST}*' ({})",
                genai_names()
            )));
        }
        Ok(Decoder {
            steps,
            ids,
            mask: int_type(MASK)?,
            positions: int_type(POSITIONS)?,
            caches,
        })
    }

    /// The tokens each generation makes.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// The first step's feeds for an input set: its `input_ids` (the prompt, `[batch, length]`)
    /// with an empty cache, its `attention_mask` and `position_ids` where they have the
    /// prompt's shape (else all ones, and the positions of the ones), every other input as it
    /// is. The set's own `past_key_values.*`, if any, are replaced by the empty cache.
    pub fn first_feeds(&self, set: &Feeds) -> Result<Feeds> {
        let prompt = set.get(IDS).ok_or_else(|| {
            Error::Invalid(format!(
                "--decode: the input set has no '{IDS}' (the prompt's token ids; give them with --load-inputs)"
            ))
        })?;
        let (batch, length) = match prompt.shape() {
            &[b, l] if b > 0 && l > 0 => (b, l),
            s => {
                return Err(Error::Invalid(format!(
                    "--decode: '{IDS}' has shape {}, expected [batch, length] with both at least 1",
                    crate::tensor::fmt_shape(s)
                )))
            }
        };
        let mut feeds: Feeds = set
            .iter()
            .filter(|(k, _)| !k.starts_with(PAST))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        feeds.insert(IDS.into(), cast_ids(prompt, self.ids)?);
        let own = |name: &str| set.get(name).filter(|t| t.shape() == [batch, length]);
        let mask = match own(MASK) {
            Some(m) => m
                .to_i64_vec()
                .ok_or_else(|| Error::Invalid(format!("--decode: '{MASK}' must hold integers")))?,
            None => vec![1; batch * length],
        };
        if let Some(t) = self.mask {
            feeds.insert(MASK.into(), ints(t, vec![batch, length], mask.clone()));
        }
        if let Some(t) = self.positions {
            let positions = match own(POSITIONS) {
                Some(p) => cast_ids(p, t)?,
                None => ints(t, vec![batch, length], prompt_positions(&mask, length)),
            };
            feeds.insert(POSITIONS.into(), positions);
        }
        for c in &self.caches {
            feeds.insert(
                c.past.clone(),
                Tensor::zeros(c.dtype, vec![batch, c.heads, 0, c.head_size]),
            );
        }
        Ok(feeds)
    }

    /// Generates from the first step's feeds ([`first_feeds`](Self::first_feeds)):
    /// `run(step, feeds)` runs the model once and returns its outputs. Returns [`TOKENS`] and
    /// [`LOGITS`].
    pub fn generate(&self, first: Feeds, run: &mut StepRun<'_>) -> Result<StepOutputs> {
        let mut feeds = first;
        if !feeds.contains_key(IDS) {
            return Err(Error::Invalid(format!(
                "--decode: no '{IDS}' to start from"
            )));
        }
        let batch = feeds[IDS].shape()[0];
        let mut mask: Vec<Vec<i64>> = match feeds.get(MASK) {
            Some(m) => {
                let v = m.to_i64_vec().expect("written as integers");
                v.chunks(v.len() / batch).map(<[i64]>::to_vec).collect()
            }
            None => vec![Vec::new(); batch],
        };
        let mut tokens: Vec<Vec<i64>> = vec![Vec::with_capacity(self.steps); batch];
        let mut logits: Vec<f32> = Vec::new();
        let mut vocab = 0;
        for step in 0..self.steps {
            let mut outputs = run(step, &feeds)?;
            let at = outputs
                .iter()
                .position(|(n, _)| n == LOGITS)
                .ok_or_else(|| Error::Invalid(format!("--decode: no output '{LOGITS}'")))?;
            let (_, l) = outputs.swap_remove(at);
            let (rows, v) = last_positions(&l, batch)?;
            if step > 0 && v != vocab {
                return Err(Error::Invalid(format!(
                    "--decode: step {step}'s '{LOGITS}' has {v} classes, step 0's {vocab}"
                )));
            }
            vocab = v;
            for (b, row) in rows.chunks(v).enumerate() {
                tokens[b].push(argmax(row) as i64);
            }
            logits.extend_from_slice(&rows);
            if step + 1 == self.steps {
                break;
            }
            let next: Vec<i64> = tokens.iter().map(|t| *t.last().expect("pushed")).collect();
            feeds.insert(IDS.into(), ints(self.ids, vec![batch, 1], next));
            for row in &mut mask {
                row.push(1);
            }
            if let Some(t) = self.mask {
                let total = mask[0].len();
                feeds.insert(MASK.into(), ints(t, vec![batch, total], mask.concat()));
            }
            if let Some(t) = self.positions {
                let p = mask
                    .iter()
                    .map(|r| r.iter().filter(|&&m| m != 0).count() as i64 - 1)
                    .collect();
                feeds.insert(POSITIONS.into(), ints(t, vec![batch, 1], p));
            }
            for c in &self.caches {
                let at = outputs
                    .iter()
                    .position(|(n, _)| *n == c.present)
                    .ok_or_else(|| {
                        Error::Invalid(format!("--decode: no output '{}'", c.present))
                    })?;
                let (_, t) = outputs.swap_remove(at);
                feeds.insert(c.past.clone(), t);
            }
        }
        // Per batch row, its steps: [batch, steps, vocab] from the step-major rows.
        let mut by_row = Vec::with_capacity(logits.len());
        for b in 0..batch {
            for s in 0..self.steps {
                let at = (s * batch + b) * vocab;
                by_row.extend_from_slice(&logits[at..at + vocab]);
            }
        }
        Ok(vec![
            (
                TOKENS.into(),
                ints(self.ids, vec![batch, self.steps], tokens.concat()),
            ),
            (
                LOGITS.into(),
                Tensor::from_f32(vec![batch, self.steps, vocab], by_row),
            ),
        ])
    }
}

/// Each batch row's logits at its last position, `[batch, vocab]` row-major, from logits of
/// shape `[batch, length, vocab]`.
fn last_positions(logits: &Tensor, batch: usize) -> Result<(Vec<f32>, usize)> {
    let (b, length, vocab) = match logits.shape() {
        &[b, l, v] if l > 0 && v > 0 => (b, l, v),
        s => {
            return Err(Error::Invalid(format!(
                "--decode: '{LOGITS}' has shape {}, expected [batch, length, vocab]",
                crate::tensor::fmt_shape(s)
            )))
        }
    };
    if b != batch {
        return Err(Error::Invalid(format!(
            "--decode: '{LOGITS}' has batch {b}, the prompt {batch}"
        )));
    }
    // Only the last positions are read: a prefill's logits are length × vocab values per row
    // (3 MB for 16 tokens of a 49k vocabulary), a copy of them all a fresh allocation per step.
    let runs: Vec<(usize, usize)> = (0..batch)
        .map(|r| ((r * length + length - 1) * vocab, vocab))
        .collect();
    let rows = match logits.data().gather_runs(&runs) {
        crate::tensor::TensorData::F32(v) => v.into_vec(),
        other => other.to_f32_vec().ok_or_else(|| {
            Error::Invalid(format!(
                "--decode: '{LOGITS}' has type {}, expected a float type",
                logits.dtype()
            ))
        })?,
    };
    Ok((rows, vocab))
}

/// NumPy's argmax: the first largest value, or the first NaN (NaN compares as the largest).
fn argmax(row: &[f32]) -> usize {
    if let Some(i) = row.iter().position(|x| x.is_nan()) {
        return i;
    }
    let mut best = 0;
    for (i, x) in row.iter().enumerate() {
        if *x > row[best] {
            best = i;
        }
    }
    best
}

/// Positions of a prompt from its mask: the count of ones before each position, 1 where the
/// mask is 0 (Hugging Face's `cumsum(mask) - 1` with masked positions set to 1).
fn prompt_positions(mask: &[i64], length: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(mask.len());
    for row in mask.chunks(length) {
        let mut seen = 0i64;
        for &m in row {
            if m != 0 {
                seen += 1;
                out.push(seen - 1);
            } else {
                out.push(1);
            }
        }
    }
    out
}

fn ints(dtype: DType, shape: Vec<usize>, v: Vec<i64>) -> Tensor {
    match dtype {
        DType::I32 => Tensor::from_parts(
            shape,
            TensorData::I32(v.into_iter().map(|x| x as i32).collect::<Vec<_>>().into()),
        ),
        _ => Tensor::from_i64(shape, v),
    }
}

fn cast_ids(t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == dtype {
        return Ok(t.clone());
    }
    let v = t
        .to_i64_vec()
        .filter(|_| t.dtype().is_int())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "--decode: token ids must be integers, got {}",
                t.dtype()
            ))
        })?;
    Ok(ints(dtype, t.shape().to_vec(), v))
}

/// Whether a decode verdict compares the logits: only when the criterion names them (a
/// tolerance, statistic or quantile for `logits`, or a metric other than `tokens` that
/// applies to them). The generated tokens are always compared; the default tolerances alone
/// judge the text, not the logits.
pub fn judges_logits(criterion: &Criterion) -> bool {
    criterion.atol.per_output.contains_key(LOGITS)
        || criterion.rtol.per_output.contains_key(LOGITS)
        || criterion.stat.per_output.contains_key(LOGITS)
        || criterion.quantile.per_output.contains_key(LOGITS)
        || criterion
            .metrics
            .iter()
            .any(|m| !matches!(m.kind, MetricKind::Tokens { .. }) && m.applies_to(LOGITS))
}

/// What a decode verdict judges under `criterion`, in words (for logs).
pub fn judged_outputs(criterion: &Criterion) -> &'static str {
    if judges_logits(criterion) {
        "'tokens' and each step's 'logits' judged"
    } else {
        "'tokens' judged; 'logits' measured, not judged (name them to judge them: --atol logits:…)"
    }
}

/// The logits of each step, `[batch, vocab]`, from a generation's `[batch, steps, vocab]`
/// (what a decode verdict compares step by step); None for another shape.
pub fn logit_steps(logits: &Tensor) -> Option<Vec<Tensor>> {
    let &[batch, steps, vocab] = logits.shape() else {
        return None;
    };
    let all = logits.to_f32_vec()?;
    Some(
        (0..steps)
            .map(|s| {
                let mut v = Vec::with_capacity(batch * vocab);
                for b in 0..batch {
                    let at = (b * steps + s) * vocab;
                    v.extend_from_slice(&all[at..at + vocab]);
                }
                Tensor::from_f32(vec![batch, vocab], v)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests;
