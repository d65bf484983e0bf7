//! Why a layer adds error: the cause of each layer's error, measured on the layer's own data
//! (its output against the FP32 reference, the inputs it read, its calibrated scales and, for
//! accumulating float16 layers, a re-run of its kernel with the other accumulator). See
//! docs/compare.md, "Causes".
//!
//! The facts ([`CauseFacts`]) are counts and fractions; the cause ([`Cause`]) is a decision
//! rule on them ([`classify`]):
//!
//! 1. `overflow`: a value left the layer's type's range here (whatever the growth: a layer
//!    that scales down can overflow on entry and still need less absolute tolerance than its
//!    input): an input (activation as read,
//!    or weight) beyond the type's largest finite value (it rounds to ±inf or to that value), an output that is ±inf or NaN where
//!    the reference is finite (unless an input already was), or an output saturated at the
//!    type's largest value where the reference is beyond it.
//! 2. `none` / `inherited`: the layer adds no error (growth ≤ 0); `inherited` when its output
//!    still differs from the reference (the error came with its inputs).
//! 3. int8/fp8 layers: `clipping` when at least half of the quantization error of the
//!    activations it quantizes comes from values beyond the calibrated range, `resolution`
//!    otherwise (the step size).
//! 4. `accumulation`: a float16 layer that accumulates in float16 (`--accumulate f16`) and
//!    whose output with f16 accumulators differs from its output with f32 accumulators, on
//!    the same inputs, by at least half its growth.
//! 5. `underflow`: at least half of the nonzero reference output values lie below the type's
//!    smallest normal (they flush to zero or to subnormals), or those values carry at least
//!    half of the layer's absolute error, or at least half of the nonzero values the layer
//!    rounds on entry flush. (Not the share of relative error: near-zero values dominate any
//!    sum of relative errors, flushed or not.)
//! 6. `rounding`: growth without any of those: rounding, or the error already in the inputs
//!    amplified (cancellation, scaling up; a float32 layer's growth is always this).

use super::check_output;
use super::Criterion;
use crate::exec::emulate::{finish_fused_outputs, prepare_input, round_layer_outputs, InputPrep};
use crate::exec::PreparedPlan;
use crate::graph::Graph;
use crate::ops::{OpCtx, Registry};
use crate::precision::quant::{qmax, quantize};
use crate::precision::{round_value, Accumulator, Precision};
use crate::tensor::Tensor;
use serde::Serialize;
use std::collections::HashMap;

/// The cause of a layer's error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cause {
    /// The layer's output equals the reference's.
    #[default]
    None,
    /// The layer adds no error; its output carries its inputs' error.
    Inherited,
    Overflow,
    Underflow,
    /// Rounding, or the inputs' error amplified (cancellation, scaling up).
    Rounding,
    Accumulation,
    /// int8/fp8: values beyond the calibrated range.
    Clipping,
    /// int8/fp8: the quantization step.
    Resolution,
}

impl Cause {
    pub fn name(self) -> &'static str {
        match self {
            Cause::None => "none",
            Cause::Inherited => "inherited",
            Cause::Overflow => "overflow",
            Cause::Underflow => "underflow",
            Cause::Rounding => "rounding",
            Cause::Accumulation => "accumulation",
            Cause::Clipping => "clipping",
            Cause::Resolution => "resolution",
        }
    }
}

/// What was measured on one layer (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CauseFacts {
    /// Elements of the compared output.
    pub elements: usize,
    /// Output elements that are ±inf or NaN where the reference is finite.
    pub nonfinite_outputs: usize,
    /// Output elements at the type's largest finite magnitude where the reference is beyond it.
    pub saturated_outputs: usize,
    /// Finite input values (activations as the layer read them, and weights) beyond the
    /// layer's type's largest finite value: they round to ±inf or saturate at that value.
    pub overflowing_inputs: usize,
    /// Input elements that are ±inf or NaN where the reference is finite (faults that arrived
    /// with the inputs).
    pub inherited_nonfinite_inputs: usize,
    /// Fraction of the nonzero finite reference output values below the type's smallest
    /// normal value (flushed to zero or to a subnormal in the layer's type).
    pub underflow_output: f64,
    /// Share of the layer's absolute error (sum over elements) on those values.
    pub underflow_error_share: f64,
    /// Fraction of the nonzero finite values the layer rounds on entry that become zero or
    /// subnormal in its type.
    pub underflow_inputs: f64,
    /// int8/fp8: fraction of the quantized activation values beyond the calibrated range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clipped: Option<f64>,
    /// int8/fp8: share of the activations' quantization error (sum of |x − q(x)|) from
    /// clipped values; the rest is the step size (resolution).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clipping_error_share: Option<f64>,
    /// Accumulating float16 layers: the required tolerance (the criterion's statistic)
    /// between the layer's output with f16 and with f32 accumulators, same inputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accumulation_delta: Option<f64>,
    /// The accumulator the run used, when `accumulation_delta` is measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accumulator: Option<&'static str>,
}

/// The smallest positive normal value of a float type.
pub fn min_normal(p: Precision) -> f64 {
    match p {
        Precision::Float16 => 6.103_515_625e-5,
        Precision::Fp8E4M3 => 0.015625,
        Precision::Fp8E5M2 => 6.103_515_625e-5,
        // bfloat16 has float32's exponent range; int8 has no exponent (not used).
        Precision::Float32 | Precision::BFloat16 | Precision::Int8 => f32::MIN_POSITIVE as f64,
    }
}

/// Ops whose kernels read the accumulator (`OpCtx::accumulate`).
fn accumulates(op: &str) -> bool {
    matches!(op, "Conv" | "ConvTranspose" | "MatMul" | "Gemm" | "Einsum")
        || op.starts_with("Reduce")
}

/// The cause the facts point to (the rule in the module documentation).
pub fn classify(
    growth: f64,
    required_atol: f64,
    precision: Option<Precision>,
    f: &CauseFacts,
) -> Cause {
    let carried = if required_atol > 0.0 || required_atol.is_nan() {
        Cause::Inherited
    } else {
        Cause::None
    };
    if precision.is_none() {
        return carried;
    }
    // A range fault made here is this layer's, whatever its growth: a layer that scales its
    // input down can overflow on entry and still need less absolute tolerance than its input.
    let new_nonfinite = f.nonfinite_outputs > 0 && f.inherited_nonfinite_inputs == 0;
    if f.overflowing_inputs > 0 || f.saturated_outputs > 0 || new_nonfinite {
        return Cause::Overflow;
    }
    if growth <= 0.0 {
        return carried;
    }
    if let Some(share) = f.clipping_error_share {
        return if share >= 0.5 {
            Cause::Clipping
        } else {
            Cause::Resolution
        };
    }
    if let (Some(d), Some("f16")) = (f.accumulation_delta, f.accumulator) {
        if d >= 0.5 * growth {
            return Cause::Accumulation;
        }
    }
    if f.underflow_output >= 0.5 || f.underflow_error_share >= 0.5 || f.underflow_inputs >= 0.5 {
        return Cause::Underflow;
    }
    Cause::Rounding
}

/// One line on what was measured, for the text answer and the report's tooltips.
pub fn describe(cause: Cause, p: Option<Precision>, f: &CauseFacts) -> String {
    let ty = p.map_or("its type", |p| p.name());
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let mut parts: Vec<String> = Vec::new();
    if f.overflowing_inputs > 0 {
        parts.push(format!(
            "{} input value(s) beyond {ty}'s range (→ ±inf or its max)",
            f.overflowing_inputs
        ));
    }
    if f.nonfinite_outputs > 0 {
        parts.push(format!(
            "{} of {} output(s) inf/NaN where the reference is finite{}",
            f.nonfinite_outputs,
            f.elements,
            if f.inherited_nonfinite_inputs > 0 {
                format!(
                    " ({} inf/NaN input value(s) arrived with the inputs)",
                    f.inherited_nonfinite_inputs
                )
            } else {
                String::new()
            }
        ));
    }
    if f.saturated_outputs > 0 {
        parts.push(format!(
            "{} output(s) saturated at {ty}'s max",
            f.saturated_outputs
        ));
    }
    if let (Some(c), Some(s)) = (f.clipped, f.clipping_error_share) {
        parts.push(format!(
            "{} of the quantized values clipped at the calibrated range, carrying {} of the quantization error",
            pct(c),
            pct(s)
        ));
    }
    if let (Some(d), Some(a)) = (f.accumulation_delta, f.accumulator) {
        parts.push(format!(
            "f16 vs f32 accumulators differ by {} (this run: {a})",
            super::fmt_g(d, 3)
        ));
    }
    if cause == Cause::Underflow || f.underflow_output >= 0.01 || f.underflow_inputs >= 0.01 {
        parts.push(format!(
            "{} of nonzero outputs below {ty}'s smallest normal ({} of the absolute error), {} of rounded inputs flushed",
            pct(f.underflow_output),
            pct(f.underflow_error_share),
            pct(f.underflow_inputs)
        ));
    }
    let what = match cause {
        Cause::None => "no error",
        Cause::Inherited => "adds no error (its error comes with its inputs)",
        Cause::Rounding => "rounding or amplified input error, no range fault",
        _ => "",
    };
    match (what.is_empty(), parts.is_empty()) {
        (true, _) => parts.join("; "),
        (false, true) => what.to_string(),
        (false, false) => format!("{what}; {}", parts.join("; ")),
    }
}

/// Counts over the output: (elements, nonfinite, saturated, underflow fraction, its share of
/// the absolute error).
fn output_facts(r: &[f64], c: &[f64], p: Precision) -> (usize, usize, usize, f64, f64) {
    let max = p.max_finite() as f64;
    let tiny = min_normal(p);
    let float = !p.is_scaled();
    let (mut nonfinite, mut saturated) = (0usize, 0usize);
    let (mut nonzero, mut flushed) = (0usize, 0usize);
    let (mut err_all, mut err_flushed) = (0.0f64, 0.0f64);
    for (&r, &c) in r.iter().zip(c) {
        if !r.is_finite() {
            continue;
        }
        if !c.is_finite() {
            nonfinite += 1;
            continue;
        }
        if float && r.abs() > max && c.abs() == max {
            saturated += 1;
        }
        let err = (c - r).abs();
        err_all += err;
        if r != 0.0 {
            nonzero += 1;
            if float && r.abs() < tiny {
                flushed += 1;
                err_flushed += err;
            }
        }
    }
    let frac = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let share = if err_all > 0.0 {
        err_flushed / err_all
    } else {
        0.0
    };
    (r.len(), nonfinite, saturated, frac(flushed, nonzero), share)
}

/// The tensor's values as f32 (None for non-float tensors).
fn floats(t: &Tensor) -> Option<Vec<f32>> {
    if !t.dtype().is_float() {
        return None;
    }
    t.to_f32_vec()
}

/// Measures the facts of layer `index` (its compared output `output`) in a run under `plan`
/// against the FP32 reference; `criterion` gives the statistic of the accumulation delta,
/// which is measured (two kernel calls) only with `accumulation`.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    graph: &Graph,
    index: usize,
    output: &str,
    reference: &HashMap<String, Tensor>,
    candidate: &HashMap<String, Tensor>,
    plan: &PreparedPlan,
    criterion: &Criterion,
    accumulation: bool,
) -> CauseFacts {
    let mut f = CauseFacts::default();
    let (Some(node), Some(p), Some(layer)) = (
        graph.nodes.get(index),
        plan.layer_precision(index),
        plan.layers.get(index),
    ) else {
        return f;
    };
    if let (Some(r), Some(c)) = (
        reference.get(output).and_then(Tensor::to_f64_vec),
        candidate.get(output).and_then(Tensor::to_f64_vec),
    ) {
        let (n, nonfinite, saturated, under, share) = output_facts(&r, &c, p);
        f.elements = n;
        f.nonfinite_outputs = nonfinite;
        f.saturated_outputs = saturated;
        f.underflow_output = under;
        f.underflow_error_share = share;
    }
    // The inputs, as the layer read them (activations of the run; weights as stored).
    let (mut nonzero, mut flushed) = (0usize, 0usize);
    let (mut clip_n, mut quant_n) = (0usize, 0usize);
    let (mut clip_err, mut res_err) = (0.0f64, 0.0f64);
    let mut quantized = false;
    let tiny = min_normal(p);
    for (k, name) in node.inputs.iter().enumerate() {
        if name.is_empty() {
            continue;
        }
        let activation = candidate.get(name);
        if let (Some(c), Some(r)) = (activation, reference.get(name)) {
            if let (Some(c), Some(r)) = (floats(c), floats(r)) {
                f.inherited_nonfinite_inputs += c
                    .iter()
                    .zip(&r)
                    .filter(|(c, r)| !c.is_finite() && r.is_finite())
                    .count();
            }
        }
        let Some(value) = activation.or_else(|| graph.weight(name)) else {
            continue;
        };
        match layer.inputs.get(k) {
            Some(
                InputPrep::Round(_) | InputPrep::Converted(..) | InputPrep::RoundedByKernel(_),
            ) if !p.is_scaled() => {
                let Some(v) = floats(value) else { continue };
                let max = p.max_finite();
                for x in v.into_iter().filter(|x| x.is_finite()) {
                    // Beyond the largest finite value: rounds to ±inf, or (up to half a
                    // step beyond it) saturates at it.
                    if x.abs() > max || round_value(p, x).is_infinite() {
                        f.overflowing_inputs += 1;
                    }
                    if x != 0.0 {
                        nonzero += 1;
                        if (x.abs() as f64) < tiny {
                            flushed += 1;
                        }
                    }
                }
            }
            Some(InputPrep::Quantize { scale, precision }) => {
                let Some(v) = floats(value) else { continue };
                quantized = true;
                let limit = qmax(*precision) * scale;
                for x in v.into_iter().filter(|x| x.is_finite()) {
                    let e = (x - quantize(x, *scale, *precision) * scale).abs() as f64;
                    quant_n += 1;
                    if x.abs() > limit {
                        clip_n += 1;
                        clip_err += e;
                    } else {
                        res_err += e;
                    }
                }
            }
            _ => {}
        }
    }
    if nonzero > 0 {
        f.underflow_inputs = flushed as f64 / nonzero as f64;
    }
    if quantized {
        f.clipped = Some(if quant_n == 0 {
            0.0
        } else {
            clip_n as f64 / quant_n as f64
        });
        let total = clip_err + res_err;
        f.clipping_error_share = Some(if total > 0.0 { clip_err / total } else { 0.0 });
    }
    if accumulation
        && p == Precision::Float16
        && accumulates(&node.op_type)
        && node.subgraphs().next().is_none()
    {
        let out = node.outputs.iter().position(|o| o == output);
        let run = |acc| rerun(graph, index, candidate, plan, acc);
        if let (Some(o), Some(a), Some(b)) = (out, run(Accumulator::F16), run(Accumulator::F32)) {
            if let (Some(a), Some(b)) = (a.get(o), b.get(o)) {
                let crit = Criterion {
                    metrics: Vec::new(),
                    ..criterion.clone()
                };
                if let Ok(chk) = check_output(output, a, b, &crit) {
                    f.accumulation_delta = Some(chk.required_atol);
                    f.accumulator = Some(match plan.accumulate {
                        Accumulator::F16 => "f16",
                        Accumulator::F32 => "f32",
                    });
                }
            }
        }
    }
    f
}

/// Layer `index`'s kernel re-run on the inputs it read in the candidate run, prepared as the
/// plan prepares them, with accumulator `acc`; its outputs finished as the run finishes them.
/// None when an input is missing or the kernel fails.
fn rerun(
    graph: &Graph,
    index: usize,
    candidate: &HashMap<String, Tensor>,
    plan: &PreparedPlan,
    acc: Accumulator,
) -> Option<Vec<Tensor>> {
    let node = graph.nodes.get(index)?;
    let layer = plan.layers.get(index)?;
    let p = layer.precision?;
    let mut args: Vec<Option<Tensor>> = Vec::with_capacity(node.inputs.len());
    for (k, name) in node.inputs.iter().enumerate() {
        if name.is_empty() {
            args.push(None);
            continue;
        }
        let base = candidate
            .get(name)
            .or_else(|| graph.initializers.get(name))
            .or_else(|| graph.weight(name))?;
        let prep = layer.inputs.get(k).unwrap_or(&InputPrep::Keep);
        let arg = match prep {
            InputPrep::Converted(c, _) if c.dtype() == base.dtype() => (**c).clone(),
            // Handed over as stored, rounded by the kernel as in the run (`weight_rounding`).
            InputPrep::RoundedByKernel(_) => base.clone(),
            _ => prepare_input(prep, base).unwrap_or_else(|| base.clone()),
        };
        args.push(Some(arg));
    }
    let weight_rounding: Vec<Option<crate::numeric::Rounding>> = layer
        .inputs
        .iter()
        .map(|prep| match prep {
            InputPrep::RoundedByKernel(r) => Some(*r),
            _ => None,
        })
        .collect();
    let kernel = Registry::global().get(&node.domain, &node.op_type)?;
    let ctx = OpCtx {
        node,
        opset: graph.opset_of(&node.domain),
        subgraphs: None,
        accumulate: acc,
        state: crate::exec::emulate::state_type(Some(p)),
        // The caller rounds (or not) as the fusion says.
        round_to: None,
        rounded: Default::default(),
        prepacked: &[],
        epilogue: None,
        epilogue_shape: None,
        epilogue_otherwise: None,
        epilogue_store: None,
        took_otherwise: Default::default(),
        weight_rounding: &weight_rounding,
    };
    let refs: Vec<Option<&Tensor>> = args.iter().map(Option::as_ref).collect();
    let mut outs = kernel(&ctx, &refs).ok()?;
    match &layer.fusion {
        Some(fu) => {
            finish_fused_outputs(fu, crate::ops::kept_outputs(node), true, None, &mut outs);
        }
        None => {
            round_layer_outputs(p, crate::ops::kept_outputs(node), &mut outs, false);
        }
    }
    Some(outs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::layerwise::layerwise;
    use crate::compare::{ErrorStat, PerOutput};
    use crate::exec::{Feeds, Interpreter, PlanOptions, RunOptions};
    use crate::graph::testing::{graph, node, vi};
    use crate::precision::plan::PrecisionPlan;
    use std::collections::BTreeMap;

    fn max_crit() -> Criterion {
        Criterion {
            stat: PerOutput::new(ErrorStat::Max),
            ..Default::default()
        }
    }

    /// Runs `g` in FP32 and under `plan` on `x`, and returns the layer-wise rows.
    fn rows(
        g: &Graph,
        plan: Vec<Precision>,
        opts: &PlanOptions,
        x: Vec<f32>,
    ) -> Vec<crate::compare::layerwise::LayerError> {
        let interp = Interpreter::new(g).unwrap();
        let mut feeds = Feeds::new();
        let n = x.len();
        feeds.insert("x".into(), Tensor::from_f32(vec![1, n], x));
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let prepared = PreparedPlan::new(g, &PrecisionPlan::from_layers(plan), opts).unwrap();
        let r = interp.run_with(&feeds, &keep).unwrap();
        let c = interp.run_plan(&feeds, &keep, &prepared).unwrap();
        layerwise(
            g,
            &r.intermediates,
            &c.intermediates,
            &max_crit(),
            Some(&prepared),
            false,
        )
    }

    fn scalar(v: f32) -> Tensor {
        Tensor::from_f32(vec![], vec![v])
    }

    #[test]
    fn planted_overflow_is_overflow_and_the_reader_inherits_it() {
        // ×1000 overflows float16 for x ≈ 70 (70000 > 65504); ×0.001 reads the inf.
        let g = graph(
            vec![
                node("up", "Mul", &["x", "big"], &["m"]),
                node("down", "Mul", &["m", "small"], &["y"]),
            ],
            vec![vi("x", &[1, 4])],
            vec![vi("y", &[1, 4])],
            vec![("big", scalar(1000.0)), ("small", scalar(0.001))],
        );
        let x = vec![70.0, 1.0, 2.0, 3.0];
        let r = rows(
            &g,
            vec![Precision::Float16; 2],
            &PlanOptions::default(),
            x.clone(),
        );
        assert_eq!(r[0].cause, Cause::Overflow, "{:?}", r[0]);
        let f = r[0].facts.as_ref().unwrap();
        assert_eq!((f.nonfinite_outputs, f.inherited_nonfinite_inputs), (1, 0));
        assert_eq!(r[1].cause, Cause::Inherited, "{:?}", r[1]);
        // A weight beyond the range overflows on entry, even if no output is inf.
        let g = graph(
            vec![node("div", "Div", &["x", "k"], &["y"])],
            vec![vi("x", &[1, 4])],
            vec![vi("y", &[1, 4])],
            vec![("k", scalar(1e5))],
        );
        let r = rows(&g, vec![Precision::Float16], &PlanOptions::default(), x);
        assert_eq!(r[0].cause, Cause::Overflow, "{:?}", r[0]);
        assert_eq!(r[0].facts.as_ref().unwrap().overflowing_inputs, 1);
        assert!(
            describe(r[0].cause, r[0].precision, r[0].facts.as_ref().unwrap())
                .contains("1 input value(s) beyond float16's range")
        );
    }

    #[test]
    fn planted_underflow_is_underflow_and_plain_rounding_is_rounding() {
        // ×1e-6 of values around 1: the products (≈1e-6) are subnormal in float16.
        let mul = |k: f32| {
            graph(
                vec![node("scale", "Mul", &["x", "k"], &["y"])],
                vec![vi("x", &[1, 64])],
                vec![vi("y", &[1, 64])],
                vec![("k", scalar(k))],
            )
        };
        let x: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 / 97.0).collect();
        let r = rows(
            &mul(1e-6),
            vec![Precision::Float16],
            &PlanOptions::default(),
            x.clone(),
        );
        let f = r[0].facts.as_ref().unwrap();
        assert_eq!(r[0].cause, Cause::Underflow, "{:?}", r[0]);
        assert_eq!(f.underflow_output, 1.0);
        assert!(f.underflow_error_share > 0.99);
        // The same values scaled by 3: no range fault, only rounding.
        let r = rows(
            &mul(3.0),
            vec![Precision::Float16],
            &PlanOptions::default(),
            x,
        );
        let f = r[0].facts.as_ref().unwrap();
        assert!(r[0].growth > 0.0);
        assert_eq!(r[0].cause, Cause::Rounding, "{:?}", r[0]);
        assert_eq!((f.underflow_output, f.overflowing_inputs), (0.0, 0));
    }

    fn int8_conv(amax: f32, x: Vec<f32>) -> crate::compare::layerwise::LayerError {
        // A 1x1 Conv (a quantized kernel) reading x with the given calibrated range.
        let n = x.len();
        let g = graph(
            vec![node("conv", "Conv", &["x4", "w"], &["y"])],
            vec![vi("x4", &[1, 1, 1, n])],
            vec![vi("y", &[1, 1, 1, n])],
            vec![("w", Tensor::from_f32(vec![1, 1, 1, 1], vec![1.0]))],
        );
        let amax_map: BTreeMap<String, f32> = [("x4".to_string(), amax)].into();
        let opts = PlanOptions {
            amax: Some(&amax_map),
            ..Default::default()
        };
        let interp = Interpreter::new(&g).unwrap();
        let mut feeds = Feeds::new();
        feeds.insert("x4".into(), Tensor::from_f32(vec![1, 1, 1, n], x));
        let keep = RunOptions {
            keep_intermediates: true,
        };
        let prepared = PreparedPlan::new(
            &g,
            &PrecisionPlan::from_layers(vec![Precision::Int8]),
            &opts,
        )
        .unwrap();
        let r = interp.run_with(&feeds, &keep).unwrap();
        let c = interp.run_plan(&feeds, &keep, &prepared).unwrap();
        layerwise(
            &g,
            &r.intermediates,
            &c.intermediates,
            &max_crit(),
            Some(&prepared),
            false,
        )
        .remove(0)
    }

    #[test]
    fn int8_clipping_and_resolution_are_told_apart() {
        let x: Vec<f32> = (0..100).map(|i| i as f32 / 10.0).collect(); // 0 .. 9.9
                                                                       // A range far too small: most values are clipped.
        let r = int8_conv(1.0, x.clone());
        let f = r.facts.as_ref().unwrap();
        assert_eq!(r.cause, Cause::Clipping, "{r:?}");
        let clipped = f.clipped.unwrap();
        assert!((0.89..=0.9).contains(&clipped), "{f:?}");
        assert!(f.clipping_error_share.unwrap() > 0.99);
        // The full range: nothing clipped, the error is the step size.
        let r = int8_conv(10.0, x);
        let f = r.facts.as_ref().unwrap();
        assert_eq!(r.cause, Cause::Resolution, "{r:?}");
        assert_eq!((f.clipped, f.clipping_error_share), (Some(0.0), Some(0.0)));
    }

    #[test]
    fn accumulation_is_measured_by_rerunning_the_kernel() {
        // A dot product of 4096 values near 1 with weights 1: f16 partial sums above 2048 lose
        // the fractional parts (their step is 2 or more), f32 ones do not; the output's own
        // float16 rounding step there is 4.
        let k = 4096;
        let g = graph(
            vec![node("mm", "MatMul", &["x", "w"], &["y"])],
            vec![vi("x", &[1, k])],
            vec![vi("y", &[1, 1])],
            vec![("w", Tensor::from_f32(vec![k, 1], vec![1.0; k]))],
        );
        let x: Vec<f32> = (0..k).map(|i| 1.0 + (i % 7) as f32 / 1024.0).collect();
        for (acc, want) in [
            (Accumulator::F16, Cause::Accumulation),
            (Accumulator::F32, Cause::Rounding),
        ] {
            let r = rows(
                &g,
                vec![Precision::Float16],
                &PlanOptions {
                    accumulate: acc,
                    ..Default::default()
                },
                x.clone(),
            );
            let f = r[0].facts.as_ref().unwrap();
            assert!(f.accumulation_delta.unwrap() > 4.0, "{f:?}");
            assert_eq!(r[0].cause, want, "{acc:?}: {:?}", r[0]);
        }
    }

    #[test]
    fn classify_follows_the_documented_order() {
        let mut f = CauseFacts::default();
        let p = Some(Precision::Float16);
        // Overflow on entry counts even where the layer needs less tolerance than its input.
        f.overflowing_inputs = 2;
        assert_eq!(classify(-3.0, 0.5, p, &f), Cause::Overflow);
        assert_eq!(classify(-3.0, 0.5, None, &f), Cause::Inherited);
        f.overflowing_inputs = 0;
        assert_eq!(classify(0.0, 0.0, p, &f), Cause::None);
        assert_eq!(classify(-1.0, 0.5, p, &f), Cause::Inherited);
        assert_eq!(classify(1.0, 1.0, None, &f), Cause::Inherited);
        assert_eq!(classify(1.0, 1.0, p, &f), Cause::Rounding);
        f.underflow_inputs = 0.6;
        assert_eq!(classify(1.0, 1.0, p, &f), Cause::Underflow);
        f.accumulation_delta = Some(0.6);
        f.accumulator = Some("f16");
        assert_eq!(classify(1.0, 1.0, p, &f), Cause::Accumulation);
        f.accumulator = Some("f32");
        assert_eq!(classify(1.0, 1.0, p, &f), Cause::Underflow);
        // An inf that arrived with the inputs is not this layer's overflow.
        f.nonfinite_outputs = 3;
        f.inherited_nonfinite_inputs = 3;
        assert_eq!(classify(1.0, 1.0, p, &f), Cause::Underflow);
        f.inherited_nonfinite_inputs = 0;
        assert_eq!(classify(1.0, 1.0, p, &f), Cause::Overflow);
    }
}
