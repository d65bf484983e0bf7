//! Elementwise ops: unary math and activations, binary arithmetic with NumPy broadcasting,
//! comparisons, logic, Where and Clip.
//!
//! Floats: f32 computes in f32, f64 in f64, f16/bf16 in f32 rounded back. Integers compute in
//! i64 (wrapping) and are narrowed back to their type, so int64 shape arithmetic is exact.

use super::cast::cast_tensor;
use super::lanewise::{Binary, Lanewise};
use super::util::{
    broadcast_binary, broadcast_binary_finished, broadcast_ternary, input, opt_input, PAR_CHUNK,
};
use super::{OpCtx, OpError, OpResult, Registry, Stage};
use crate::graph::fact::{DimFact, Fact};
use crate::tensor::{DType, Tensor, TensorData};
use num_traits::Float;
use rayon::prelude::*;
use std::cmp::Ordering;

pub fn register(r: &mut Registry) {
    // Unary math.
    r.add("Abs", |c, i| {
        unary_int(
            c,
            i,
            |x: f64| x.abs(),
            |x| x.abs(),
            |x: i64| x.wrapping_abs(),
        )
    });
    r.add("Neg", |c, i| {
        unary_int(c, i, |x: f64| -x, |x: f32| -x, |x: i64| x.wrapping_neg())
    });
    r.add("Sign", |c, i| {
        unary_int(c, i, sign, sign, |x: i64| x.signum())
    });
    r.add("Reciprocal", |c, i| {
        unary(c, i, |x: f64| 1.0 / x, |x: f32| 1.0 / x)
    });
    r.add("Sqrt", |c, i| unary(c, i, f64::sqrt, f32::sqrt));
    r.add("Exp", |c, i| unary(c, i, f64::exp, f32::exp));
    r.add("Log", |c, i| unary(c, i, f64::ln, f32::ln));
    r.add("Floor", |c, i| unary(c, i, f64::floor, f32::floor));
    r.add("Ceil", |c, i| unary(c, i, f64::ceil, f32::ceil));
    r.add("Round", |c, i| {
        unary(c, i, f64::round_ties_even, f32::round_ties_even)
    });
    r.add("Sin", |c, i| unary(c, i, f64::sin, f32::sin));
    r.add("Cos", |c, i| unary(c, i, f64::cos, f32::cos));
    r.add("Tan", |c, i| unary(c, i, f64::tan, f32::tan));
    r.add("Asin", |c, i| unary(c, i, f64::asin, f32::asin));
    r.add("Acos", |c, i| unary(c, i, f64::acos, f32::acos));
    r.add("Atan", |c, i| unary(c, i, f64::atan, f32::atan));
    r.add("Sinh", |c, i| unary(c, i, f64::sinh, f32::sinh));
    r.add("Cosh", |c, i| unary(c, i, f64::cosh, f32::cosh));
    r.add("Asinh", |c, i| unary(c, i, asinh, asinh));
    r.add("Acosh", |c, i| unary(c, i, acosh, acosh));
    r.add("Atanh", |c, i| unary(c, i, f64::atanh, f32::atanh));
    r.add("Erf", |c, i| {
        mlas_unary(
            c,
            i,
            super::logistic::erf_slice,
            libm::erf,
            super::logistic::erf,
        )
    });
    r.add("IsNaN", |_, i| predicate(i, |x| x.is_nan()));
    r.add("IsInf", is_inf);
    // Activations.
    r.add("Relu", |c, i| {
        unary_int(c, i, relu, relu, |x: i64| x.max(0))
    });
    r.add("Tanh", tanh_op);
    r.add("Sigmoid", sigmoid_op);
    r.add("Softplus", |c, i| unary(c, i, softplus, softplus));
    r.add("Softsign", |c, i| {
        unary(
            c,
            i,
            |x: f64| x / (1.0 + x.abs()),
            |x: f32| x / (1.0 + x.abs()),
        )
    });
    r.add("Mish", |c, i| {
        unary(
            c,
            i,
            |x: f64| x * softplus(x).tanh(),
            |x: f32| x * softplus(x).tanh(),
        )
    });
    r.add("HardSwish", |c, i| {
        unary(
            c,
            i,
            |x: f64| x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            hard_swish,
        )
    });
    r.add("LeakyRelu", leaky_relu);
    r.add("PRelu", prelu);
    r.add("Elu", elu);
    r.add("Celu", celu);
    r.add("Selu", selu);
    r.add("HardSigmoid", hard_sigmoid);
    r.add("Swish", swish);
    r.add("Shrink", shrink);
    r.add("ThresholdedRelu", thresholded_relu);
    r.add("Gelu", gelu);
    // Binary arithmetic.
    r.add("Add", |c, i| {
        arith(c, i, |a, b| a + b, f32_add, |a, b| Ok(a.wrapping_add(b)))
    });
    r.add("Sub", |c, i| {
        arith(c, i, |a, b| a - b, f32_sub, |a, b| Ok(a.wrapping_sub(b)))
    });
    r.add("Mul", |c, i| {
        arith(c, i, |a, b| a * b, f32_mul, |a, b| Ok(a.wrapping_mul(b)))
    });
    r.add("Div", |c, i| {
        arith(
            c,
            i,
            |a, b| a / b,
            f32_div,
            |a, b| {
                if b == 0 {
                    Err(OpError("integer division by zero".into()))
                } else {
                    Ok(a.wrapping_div(b))
                }
            },
        )
    });
    r.add("Pow", pow);
    r.add("Mod", mod_op);
    r.add("BitShift", bit_shift);
    r.add("Max", |_, i| {
        variadic(i, max_nan, max_nan, |a: i64, b| Ok(a.max(b)), None)
    });
    r.add("Min", |_, i| {
        variadic(i, min_nan, min_nan, |a: i64, b| Ok(a.min(b)), None)
    });
    r.add("Sum", |_, i| {
        variadic(
            i,
            |a, b| a + b,
            |a, b| a + b,
            |a: i64, b| Ok(a.wrapping_add(b)),
            None,
        )
    });
    r.add("Mean", |_, i| {
        let n = i.len();
        variadic(
            i,
            |a, b| a + b,
            |a, b| a + b,
            |a: i64, b| Ok(a + b),
            Some(n),
        )
    });
    // Comparisons and logic.
    r.add("Equal", |_, i| compare(i, |o| o == Some(Ordering::Equal)));
    r.add("Less", |_, i| compare(i, |o| o == Some(Ordering::Less)));
    r.add("Greater", |_, i| {
        compare(i, |o| o == Some(Ordering::Greater))
    });
    r.add("LessOrEqual", |_, i| {
        compare(i, |o| matches!(o, Some(Ordering::Less | Ordering::Equal)))
    });
    r.add("GreaterOrEqual", |_, i| {
        compare(i, |o| {
            matches!(o, Some(Ordering::Greater | Ordering::Equal))
        })
    });
    r.add("Not", not);
    r.add("And", |_, i| logic(i, |a, b| a && b));
    r.add("Or", |_, i| logic(i, |a, b| a || b));
    r.add("Xor", |_, i| logic(i, |a, b| a ^ b));
    r.add("Where", where_op).infer(where_facts);
    r.add("Clip", clip);
    for op in [
        "IsInf",
        "LeakyRelu",
        "Elu",
        "Celu",
        "Selu",
        "HardSigmoid",
        "Swish",
        "Shrink",
        "ThresholdedRelu",
        "Gelu",
        "Mod",
        "BitShift",
        "Clip",
    ] {
        r.def_mut(op)
            .parse(|n, opset| super::attrs::boxed(ElementwiseAttrs::parse(n, opset)));
    }
    facts(r);
    register_stages(r);
}

/// Shape rules and costs of the elementwise family.
fn facts(r: &mut Registry) {
    use super::shape::{bool_like_input, broadcast_bool, broadcast_like_first, same_as_input};
    const SAME: &[&str] = &[
        "Abs",
        "Neg",
        "Sign",
        "Reciprocal",
        "Sqrt",
        "Exp",
        "Log",
        "Floor",
        "Ceil",
        "Round",
        "Sin",
        "Cos",
        "Tan",
        "Asin",
        "Acos",
        "Atan",
        "Sinh",
        "Cosh",
        "Asinh",
        "Acosh",
        "Atanh",
        "Erf",
        "Relu",
        "Tanh",
        "Sigmoid",
        "Softplus",
        "Softsign",
        "Mish",
        "HardSwish",
        "LeakyRelu",
        "Elu",
        "Celu",
        "Selu",
        "HardSigmoid",
        "Swish",
        "Shrink",
        "ThresholdedRelu",
        "Gelu",
        "Clip",
    ];
    for op in SAME {
        r.def_mut(op).infer(same_as_input);
    }
    for op in ["IsNaN", "IsInf", "Not"] {
        r.def_mut(op).infer(bool_like_input);
    }
    for op in [
        "Pow", "Mod", "BitShift", "Max", "Min", "Sum", "Mean", "PRelu",
    ] {
        r.def_mut(op).infer(broadcast_like_first);
    }
    r.def_mut("Add")
        .infer(|c, i| dim_arith(c, i, |a, b| a.add(b)));
    r.def_mut("Sub").infer(|c, i| dim_arith(c, i, |_, _| None));
    r.def_mut("Mul")
        .infer(|c, i| dim_arith(c, i, |a, b| Some(a.mul(b))));
    r.def_mut("Div")
        .infer(|c, i| dim_arith(c, i, |a, b| a.div(b)));
    for op in [
        "Equal",
        "Less",
        "Greater",
        "LessOrEqual",
        "GreaterOrEqual",
        "And",
        "Or",
        "Xor",
    ] {
        r.def_mut(op).infer(broadcast_bool);
    }
    // Transcendental activations cost a few operations per element.
    for op in [
        "Gelu",
        "Erf",
        "Sigmoid",
        "Tanh",
        "HardSwish",
        "Mish",
        "Softplus",
    ] {
        r.def_mut(op).flops(|_, _, outs| {
            4 * outs
                .first()
                .map_or(0, |s| s.iter().product::<usize>() as u64)
        });
    }
}

/// The attributes of the elementwise ops that have any, with each op's defaults (LeakyRelu's
/// alpha 0.01, Selu's 1.673..., HardSigmoid's 0.2...).
#[derive(Clone, Debug, PartialEq)]
pub struct ElementwiseAttrs {
    pub alpha: f32,
    pub beta: f32,
    /// Selu's `gamma`.
    pub gamma: f32,
    /// Shrink's `lambd` and `bias`.
    pub lambd: f32,
    pub bias: f32,
    /// IsInf's `detect_positive` and `detect_negative`.
    pub detect_positive: bool,
    pub detect_negative: bool,
    /// Gelu's `approximate` is 'tanh' (else 'none').
    pub gelu_tanh: bool,
    /// Mod's `fmod`.
    pub fmod: bool,
    /// BitShift's `direction` is LEFT (required: LEFT or RIGHT).
    pub shift_left: bool,
    /// Clip's `min` and `max` before opset 11.
    pub min: Option<f32>,
    pub max: Option<f32>,
}

impl ElementwiseAttrs {
    fn parse(
        node: &crate::graph::Node,
        opset: i64,
    ) -> Result<ElementwiseAttrs, super::attrs::AttrError> {
        let a = super::attrs::Attrs::new(node);
        let op = node.op_type.as_str();
        let alpha = match op {
            "LeakyRelu" => 0.01,
            "Selu" => 1.673_263_2,
            "HardSigmoid" => 0.2,
            _ => 1.0,
        };
        let shift_left = if op == "BitShift" {
            if !a.has("direction") {
                return Err(super::attrs::AttrError::new(
                    "direction",
                    "missing (the op needs it)",
                ));
            }
            a.choice("direction", true, &[("LEFT", true), ("RIGHT", false)])?
        } else {
            false
        };
        let (min, max) = if op == "Clip" && opset < 11 {
            (a.float("min")?, a.float("max")?)
        } else {
            (None, None)
        };
        Ok(ElementwiseAttrs {
            alpha: a.float_or("alpha", alpha)?,
            beta: a.float_or("beta", 0.5)?,
            gamma: a.float_or("gamma", 1.050_701)?,
            lambd: a.float_or("lambd", 0.5)?,
            bias: a.float_or("bias", 0.0)?,
            detect_positive: a.flag("detect_positive", true)?,
            detect_negative: a.flag("detect_negative", true)?,
            gelu_tanh: a.choice("approximate", false, &[("none", false), ("tanh", true)])?,
            fmod: a.flag("fmod", false)?,
            shift_left,
            min,
            max,
        })
    }
}

/// Broadcast arithmetic that also follows dimension values (a `Shape` element times 2, divided
/// by the head count...), so shapes computed from symbolic dims stay exact.
fn dim_arith(
    ctx: &super::InferCtx,
    ins: &[Option<&Fact>],
    op: fn(&DimFact, &DimFact) -> Option<DimFact>,
) -> super::shape::FactsResult {
    let mut out = super::shape::broadcast_like_first(ctx, ins)?;
    let (Some(a), Some(b)) = (
        super::shape::opt_fact(ins, 0).and_then(|f| f.dims.as_ref()),
        super::shape::opt_fact(ins, 1).and_then(|f| f.dims.as_ref()),
    ) else {
        return Ok(out);
    };
    let n = a.len().max(b.len());
    if (a.len() == n || a.len() == 1) && (b.len() == n || b.len() == 1) {
        let dims: Option<Vec<DimFact>> = (0..n)
            .map(|i| op(&a[i.min(a.len() - 1)], &b[i.min(b.len() - 1)]))
            .collect();
        out[0].dims = dims;
    }
    Ok(out)
}

/// Where: the three inputs broadcast; the values' type.
fn where_facts(ctx: &super::InferCtx, ins: &[Option<&Fact>]) -> super::shape::FactsResult {
    let x = super::shape::fact(ins, 1)?;
    let shapes: Vec<_> = ins.iter().flatten().map(|f| f.shape.as_ref()).collect();
    Ok(vec![Fact::new(
        x.dtype,
        super::shape::broadcast(ctx, &shapes)?,
    )])
}

/// 1, -1, NaN for NaN, and +0 for either zero (ONNX Runtime).
fn sign<T: Float>(x: T) -> T {
    if x > T::zero() {
        T::one()
    } else if x < T::zero() {
        -T::one()
    } else if x.is_nan() {
        x
    } else {
        T::zero()
    }
}

/// `max(x, 0)` as ONNX Runtime computes it: NaN stays NaN (Rust's `max` would drop it and give
/// 0, healing an overflow the GPU reports) and -0 stays -0.
pub(crate) fn relu<T: Float>(x: T) -> T {
    if x < T::zero() {
        T::zero()
    } else {
        x
    }
}

/// Max of two floats that propagates NaN (ONNX Runtime's Max since 1.19, numpy's `maximum`,
/// IEEE 754-2019 `maximum`); `f32::max` returns the other operand. Of equal operands (+0 and
/// -0) the second, as ONNX Runtime.
fn max_nan<T: Float>(a: T, b: T) -> T {
    if a.is_nan() {
        a
    } else if b.is_nan() || a <= b {
        b
    } else {
        a
    }
}

/// Min of two floats that propagates NaN (see [`max_nan`]); of equal operands the first, as
/// ONNX Runtime.
fn min_nan<T: Float>(a: T, b: T) -> T {
    if a.is_nan() {
        a
    } else if b.is_nan() || b < a {
        b
    } else {
        a
    }
}

/// asinh that stays finite for large |x| (`x + sqrt(x² + 1)` overflows past 1.8e19 in f32):
/// there asinh(x) = sign(x)·(ln|x| + ln 2) to the last bit. Elsewhere the standard library's.
fn asinh<T: Float>(x: T) -> T {
    let big = T::from(268_435_456.0).expect("2^28");
    if x.abs() >= big {
        (x.abs().ln() + T::from(std::f64::consts::LN_2).expect("ln 2")).copysign(x)
    } else {
        x.asinh()
    }
}

/// acosh for large x as [`asinh`] (ln x + ln 2); NaN below 1 as the standard library.
fn acosh<T: Float>(x: T) -> T {
    let big = T::from(268_435_456.0).expect("2^28");
    if x >= big {
        x.ln() + T::from(std::f64::consts::LN_2).expect("ln 2")
    } else {
        x.acosh()
    }
}

pub(crate) fn sigmoid<T: Float>(x: T) -> T {
    // Stable for large |x|: never exponentiates a large positive number.
    if x >= T::zero() {
        T::one() / (T::one() + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::one() + e)
    }
}

/// Sigmoid: float32 as ONNX Runtime computes it (MLAS's rational approximation, see
/// `ops::logistic`), float64 exactly; float16/bfloat16 through float32.
fn sigmoid_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    mlas_unary(
        ctx,
        inputs,
        super::logistic::logistic_slice,
        sigmoid,
        super::logistic::logistic,
    )
}

/// Tanh: float32 as ONNX Runtime computes it (MLAS's rational approximation, see
/// `ops::logistic`), float64 exactly; float16/bfloat16 through float32.
fn tanh_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    mlas_unary(
        ctx,
        inputs,
        super::logistic::tanh_slice,
        f64::tanh,
        super::logistic::tanh,
    )
}

/// A unary op whose float32 values go through one of `ops::logistic`'s vectorized slice
/// kernels (rounding each finished chunk as it is written); other types as [`unary`] does.
fn mlas_unary(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    slice: fn(&[f32], &super::Finish) -> Vec<f32>,
    f64f: fn(f64) -> f64,
    f32f: fn(f32) -> f32,
) -> OpResult {
    let x = input(inputs, 0)?;
    if let TensorData::F32(v) = x.data() {
        let y = slice(v, &ctx.rounder());
        ctx.outputs_rounded();
        return Ok(vec![Tensor::from_f32(x.shape().to_vec(), y)]);
    }
    unary(ctx, inputs, f64f, f32f)
}

fn softplus<T: Float>(x: T) -> T {
    // log(1 + e^x) without overflow.
    x.max(T::zero()) + (-x.abs()).exp().ln_1p()
}

/// Parallel map for big f32 buffers (the hot path of CNN and transformer activations), in
/// tasks of [`PAR_CHUNK`] values (below twice that, one task); each
/// finished piece goes through `finish` (the layer's output rounding) while still in cache.
pub(crate) fn map_f32(
    v: &[f32],
    f: impl Fn(f32) -> f32 + Sync,
    finish: &super::Finish,
) -> Vec<f32> {
    if v.len() < 2 * PAR_CHUNK {
        let mut out: Vec<f32> = v.iter().map(|&x| f(x)).collect();
        finish(&mut out);
        return out;
    }
    let fill = |out: &mut [std::mem::MaybeUninit<f32>]| {
        out.par_chunks_mut(PAR_CHUNK)
            .zip(v.par_chunks(PAR_CHUNK))
            .for_each(|(d, s)| {
                d.iter_mut().zip(s).for_each(|(d, &x)| {
                    d.write(f(x));
                });
                // SAFETY: every value of `d` was written just now (d and s have one length).
                let d = unsafe { super::util::assume_written(d) };
                finish(d);
            });
    };
    // SAFETY: the chunks of `out` cover it and each is written whole (s as long as d).
    unsafe { super::util::unzeroed_f32(v.len(), fill) }
}

/// Applies a float function, keeping the dtype; the pieces of a float32 result go through
/// `finish` as they are written.
fn map_float(
    t: &Tensor,
    f64f: impl Fn(f64) -> f64,
    f32f: impl Fn(f32) -> f32 + Sync,
    finish: &super::Finish,
) -> Result<Tensor, OpError> {
    let shape = t.shape().to_vec();
    Ok(match t.data() {
        TensorData::F32(v) => Tensor::from_f32(shape, map_f32(v, f32f, finish)),
        TensorData::F64(v) => Tensor::from_f64(shape, v.iter().map(|&x| f64f(x)).collect()),
        TensorData::F16(_) | TensorData::BF16(_) => {
            let v = t.to_f32_vec().expect("float");
            cast_tensor(
                &Tensor::from_f32(shape, map_f32(&v, f32f, &|_| {})),
                t.dtype(),
            )
        }
        _ => {
            return Err(OpError(format!(
                "dtype {} is not supported (float types only)",
                t.dtype()
            )))
        }
    })
}

fn unary(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    f64f: impl Fn(f64) -> f64,
    f32f: impl Fn(f32) -> f32 + Sync,
) -> OpResult {
    map_op(ctx, input(inputs, 0)?, f64f, f32f)
}

/// A float map as a layer's kernel: a float32 output is rounded to the layer's precision as
/// it is written.
fn map_op(
    ctx: &OpCtx,
    x: &Tensor,
    f64f: impl Fn(f64) -> f64,
    f32f: impl Fn(f32) -> f32 + Sync,
) -> OpResult {
    let y = map_float(x, f64f, f32f, &ctx.rounder())?;
    if x.dtype() == DType::F32 {
        ctx.outputs_rounded();
    }
    Ok(vec![y])
}

/// Unary op that also accepts integer tensors.
fn unary_int(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    f64f: impl Fn(f64) -> f64,
    f32f: impl Fn(f32) -> f32 + Sync,
    intf: impl Fn(i64) -> i64,
) -> OpResult {
    let x = input(inputs, 0)?;
    if x.dtype().is_int() {
        let v: Vec<i64> = x.to_i64_vec().expect("int").into_iter().map(intf).collect();
        return Ok(vec![cast_tensor(
            &Tensor::from_i64(x.shape().to_vec(), v),
            x.dtype(),
        )]);
    }
    map_op(ctx, x, f64f, f32f)
}

fn predicate(inputs: &[Option<&Tensor>], f: impl Fn(f64) -> bool) -> OpResult {
    let x = input(inputs, 0)?;
    let v = x
        .to_f64_vec()
        .ok_or_else(|| OpError(format!("dtype {} is not supported", x.dtype())))?;
    Ok(vec![Tensor::from_bool(
        x.shape().to_vec(),
        v.into_iter().map(f).collect(),
    )])
}

fn is_inf(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<ElementwiseAttrs>()?;
    let (pos, neg) = (attrs.detect_positive, attrs.detect_negative);
    predicate(inputs, |x| {
        (pos && x == f64::INFINITY) || (neg && x == f64::NEG_INFINITY)
    })
}

fn leaky_relu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a = ctx.attrs::<ElementwiseAttrs>()?.alpha;
    unary(
        ctx,
        inputs,
        |x| if x >= 0.0 { x } else { a as f64 * x },
        leaky_relu_f32(a),
    )
}

fn leaky_relu_f32(a: f32) -> impl Fn(f32) -> f32 + Copy + Send + Sync + 'static {
    move |x| if x >= 0.0 { x } else { a * x }
}

fn elu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a = ctx.attrs::<ElementwiseAttrs>()?.alpha;
    unary(
        ctx,
        inputs,
        |x| if x >= 0.0 { x } else { a as f64 * x.exp_m1() },
        |x| if x >= 0.0 { x } else { a * x.exp_m1() },
    )
}

fn celu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a = ctx.attrs::<ElementwiseAttrs>()?.alpha;
    unary(
        ctx,
        inputs,
        // NaN stays NaN (`max`/`min` would drop it).
        |x| {
            if x.is_nan() {
                x
            } else {
                x.max(0.0) + (a as f64 * (x / a as f64).exp_m1()).min(0.0)
            }
        },
        |x| {
            if x.is_nan() {
                x
            } else {
                x.max(0.0) + (a * (x / a).exp_m1()).min(0.0)
            }
        },
    )
}

fn selu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<ElementwiseAttrs>()?;
    let (a, g) = (attrs.alpha, attrs.gamma);
    unary(
        ctx,
        inputs,
        // `+ 0.0`: Selu(-0) is +0 as in the spec's gamma·(alpha·e^x − alpha) (and ORT); it
        // changes no other value.
        |x| {
            g as f64
                * if x > 0.0 {
                    x
                } else {
                    a as f64 * x.exp_m1() + 0.0
                }
        },
        |x| g * if x > 0.0 { x } else { a * x.exp_m1() + 0.0 },
    )
}

fn hard_sigmoid(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<ElementwiseAttrs>()?;
    let (a, b) = (attrs.alpha, attrs.beta);
    unary(
        ctx,
        inputs,
        |x| (a as f64 * x + b as f64).clamp(0.0, 1.0),
        hard_sigmoid_f32(a, b),
    )
}

fn hard_sigmoid_f32(a: f32, b: f32) -> impl Fn(f32) -> f32 + Copy + Send + Sync + 'static {
    move |x| (a * x + b).clamp(0.0, 1.0)
}

fn hard_swish(x: f32) -> f32 {
    x * (x / 6.0 + 0.5).clamp(0.0, 1.0)
}

fn f32_add(a: f32, b: f32) -> f32 {
    a + b
}

fn f32_sub(a: f32, b: f32) -> f32 {
    a - b
}

fn f32_mul(a: f32, b: f32) -> f32 {
    a * b
}

fn f32_div(a: f32, b: f32) -> f32 {
    a / b
}

/// Epilogue stages (docs/architecture.md, "Epilogues"): each the float32 function its kernel
/// maps with, so a fused layer computes the same bits.
fn register_stages(r: &mut Registry) {
    use super::logistic::{erf, logistic_in_place, map_in_place, tanh};
    r.def_mut("Relu").stage(|_, _, chained, _| {
        Ok((chained == [true]).then_some(Stage::Lanewise(Lanewise::Relu)))
    });
    r.def_mut("Sigmoid")
        .stage(|_, _, chained, _| Ok(slice_stage(chained, logistic_in_place)));
    r.def_mut("Tanh")
        .stage(|_, _, chained, _| Ok(slice_stage(chained, |v| map_in_place(v, &tanh))));
    r.def_mut("Erf")
        .stage(|_, _, chained, _| Ok(slice_stage(chained, |v| map_in_place(v, &erf))));
    r.def_mut("HardSwish")
        .stage(|_, _, chained, _| Ok(map_stage(chained, hard_swish)));
    r.def_mut("LeakyRelu").stage(|ctx, _, chained, _| {
        let a = ctx.attrs::<ElementwiseAttrs>()?.alpha;
        Ok(map_stage(chained, leaky_relu_f32(a)))
    });
    r.def_mut("HardSigmoid").stage(|ctx, _, chained, _| {
        let attrs = ctx.attrs::<ElementwiseAttrs>()?;
        Ok(map_stage(
            chained,
            hard_sigmoid_f32(attrs.alpha, attrs.beta),
        ))
    });
    r.def_mut("Clip").stage(|ctx, i, chained, _| {
        if chained.first() != Some(&true) || chained[1..].contains(&true) {
            return Ok(None);
        }
        let (lo, hi) = clip_bounds(ctx, i, DType::F32)?;
        Ok(Some(Stage::Lanewise(Lanewise::Clip(lo as f32, hi as f32))))
    });
    r.def_mut("Pow").stage(|_, i, chained, shape| {
        // A float32 base to one float32 exponent (RMSNorm's x², GELU's tanh form's x³): the
        // kernel's own float32 function. An exponent of another type is computed in f64 by
        // the kernel: not a stage.
        let exponent = i.get(1).copied().flatten().and_then(|t| {
            let v = t
                .as_f32()
                .filter(|v| v.len() == 1 && t.rank() <= shape.rank)?;
            Some(v[0])
        });
        Ok(match (chained, exponent) {
            ([true, false], Some(y)) => map_stage(&chained[..1], move |x| pow_f32(x, y)),
            _ => None,
        })
    });
    r.def_mut("Add")
        .stage(|_, i, chained, shape| Ok(binary_stage(i, chained, shape, Binary::Add, f32_add)));
    r.def_mut("Sub")
        .stage(|_, i, chained, shape| Ok(binary_stage(i, chained, shape, Binary::Sub, f32_sub)));
    r.def_mut("Mul")
        .stage(|_, i, chained, shape| Ok(binary_stage(i, chained, shape, Binary::Mul, f32_mul)));
    r.def_mut("Div")
        .stage(|_, i, chained, shape| Ok(binary_stage(i, chained, shape, Binary::Div, f32_div)));
}

/// `x = g(x, c[channel of x])` for values of the given channels.
fn per_channel_map(chans: super::Channels, v: &mut [f32], c: &[f32], g: impl Fn(f32, f32) -> f32) {
    match chans {
        super::Channels::One(ch) => {
            let k = c[ch];
            super::vector::map_in_place(v, move |x| g(x, k))
        }
        super::Channels::From(first) => super::vector::zip_in_place(v, &c[first..], g),
    }
}

/// A unary op whose kernel runs one of `ops::logistic`'s vectorized slice loops, on its one
/// chained input.
fn slice_stage(chained: &[bool], f: fn(&mut [f32])) -> Option<Stage> {
    (chained == [true]).then(|| Stage::Map(Box::new(move |_, v: &mut [f32]| f(v))))
}

/// A unary float map on its one chained input.
fn map_stage(
    chained: &[bool],
    f: impl Fn(f32) -> f32 + Copy + Send + Sync + 'static,
) -> Option<Stage> {
    (chained == [true]).then(|| {
        Stage::Map(Box::new(move |_, v: &mut [f32]| {
            super::vector::map_in_place(v, f)
        }))
    })
}

/// A binary op (`op`, computing `f`) on two chained values, or on one and a float32 constant
/// with one value per channel (or one value): the constant on the side its input is on. A
/// one-value constant on a side the operation allows makes a [`Lanewise`] stage.
fn binary_stage<F: Fn(f32, f32) -> f32 + Copy + Send + Sync + 'static>(
    inputs: &[Option<&Tensor>],
    chained: &[bool],
    shape: super::ChainShape,
    op: Binary,
    f: F,
) -> Option<Stage> {
    let one_value = |i: usize| -> Option<f32> {
        let t = inputs.get(i).copied().flatten()?;
        let v = t
            .as_f32()
            .filter(|v| v.len() == 1 && t.rank() <= shape.rank)?;
        Some(v[0])
    };
    let constant = match (chained, op) {
        ([true, true], _) => return Some(Stage::Zip(op)),
        ([true, false], _) => one_value(1),
        ([false, true], Binary::Add | Binary::Mul) => one_value(0),
        _ => None,
    };
    // Not a NaN constant: which operand's payload the result keeps would then depend on
    // the side (the per-channel map below keeps the node's order).
    if let Some(c) = constant.filter(|c| !c.is_nan()) {
        return Some(Stage::Lanewise(match op {
            Binary::Add => Lanewise::Add(c),
            Binary::Sub => Lanewise::Sub(c),
            Binary::Mul => Lanewise::Mul(c),
            Binary::Div => Lanewise::Div(c),
        }));
    }
    match chained {
        [true, false] => {
            let c = super::util::per_channel(inputs.get(1).copied().flatten()?, shape)?;
            Some(Stage::Map(Box::new(move |chans, v| {
                per_channel_map(chans, v, &c, f)
            })))
        }
        [false, true] => {
            let c = super::util::per_channel(inputs.first().copied().flatten()?, shape)?;
            Some(Stage::Map(Box::new(move |chans, v| {
                per_channel_map(chans, v, &c, move |x, k| f(k, x))
            })))
        }
        _ => None,
    }
}

/// Swish (opset 24): `x * sigmoid(alpha * x)`.
fn swish(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a = ctx.attrs::<ElementwiseAttrs>()?.alpha;
    unary(
        ctx,
        inputs,
        |x| x * sigmoid(a as f64 * x),
        |x| x * sigmoid(a * x),
    )
}

/// Shrink: `x + bias` below `-lambd`, `x - bias` above `lambd`, 0 between (ints too).
fn shrink(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let attrs = ctx.attrs::<ElementwiseAttrs>()?;
    let (l, b) = (attrs.lambd as f64, attrs.bias as f64);
    let f = move |x: f64| {
        if x < -l {
            x + b
        } else if x > l {
            x - b
        } else {
            0.0
        }
    };
    unary_int(
        ctx,
        inputs,
        f,
        move |x: f32| f(x as f64) as f32,
        move |x: i64| f(x as f64) as i64,
    )
}

fn thresholded_relu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a = ctx.attrs::<ElementwiseAttrs>()?.alpha;
    unary(
        ctx,
        inputs,
        |x| if x > a as f64 { x } else { 0.0 },
        |x| if x > a { x } else { 0.0 },
    )
}

/// Gelu: float32 as ONNX Runtime's kernel computes it (`logistic::gelu_erf`/`gelu_tanh`, MLAS's
/// erf and tanh), other types by the formula in f64.
fn gelu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    use super::logistic::{gelu_erf, gelu_erf_slice, gelu_tanh, gelu_tanh_slice};
    match ctx.attrs::<ElementwiseAttrs>()?.gelu_tanh {
        false => mlas_unary(
            ctx,
            inputs,
            gelu_erf_slice,
            |x| 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            gelu_erf,
        ),
        true => mlas_unary(
            ctx,
            inputs,
            gelu_tanh_slice,
            |x| {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            },
            gelu_tanh,
        ),
    }
}

fn prelu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    arith(
        ctx,
        inputs,
        |x, s| if x < 0.0 { x * s } else { x },
        |x, s| if x < 0.0 { x * s } else { x },
        |x, s| Ok(if x < 0 { x.wrapping_mul(s) } else { x }),
    )
}

fn same_dtype(a: &Tensor, b: &Tensor) -> Result<(), OpError> {
    if a.dtype() != b.dtype() {
        return Err(OpError(format!(
            "inputs have different dtypes ({} and {})",
            a.dtype(),
            b.dtype()
        )));
    }
    Ok(())
}

/// Binary op on two tensors of one dtype, with broadcasting.
/// Generic over the element functions (not `dyn`) so each op's loops are monomorphized and
/// vectorized.
/// A broadcasting binary op; the pieces of a float32 result go through `finish` as they are
/// written.
fn binary<F64F, F32F, IntF>(
    a: &Tensor,
    b: &Tensor,
    f64f: &F64F,
    f32f: &F32F,
    intf: &IntF,
    finish: &super::Finish,
) -> Result<Tensor, OpError>
where
    F64F: Fn(f64, f64) -> f64 + Sync,
    F32F: Fn(f32, f32) -> f32 + Sync,
    IntF: Fn(i64, i64) -> Result<i64, OpError> + Sync,
{
    same_dtype(a, b)?;
    let dtype = a.dtype();
    match (a.data(), b.data()) {
        (TensorData::F32(x), TensorData::F32(y)) => {
            let (s, v) = broadcast_binary_finished(x, a.shape(), y, b.shape(), f32f, finish)?;
            Ok(Tensor::from_f32(s, v))
        }
        (TensorData::F64(x), TensorData::F64(y)) => {
            let (s, v) = broadcast_binary(x, a.shape(), y, b.shape(), f64f)?;
            Ok(Tensor::from_f64(s, v))
        }
        _ if dtype == DType::F16 || dtype == DType::BF16 => {
            let (x, y) = (
                a.to_f32_vec().expect("float"),
                b.to_f32_vec().expect("float"),
            );
            let (s, v) = broadcast_binary(&x, a.shape(), &y, b.shape(), f32f)?;
            Ok(cast_tensor(&Tensor::from_f32(s, v), dtype))
        }
        _ if dtype.is_int() => {
            let (x, y) = (a.to_i64_vec().expect("int"), b.to_i64_vec().expect("int"));
            let (s, v) = broadcast_binary(&x, a.shape(), &y, b.shape(), intf)?;
            let v: Vec<i64> = v.into_iter().collect::<Result<_, _>>()?;
            Ok(cast_tensor(&Tensor::from_i64(s, v), dtype))
        }
        _ => Err(OpError(format!("dtype {dtype} is not supported"))),
    }
}

/// A binary op as a layer's kernel: a float32 output is rounded to the layer's precision as
/// it is written.
fn arith(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    f64f: impl Fn(f64, f64) -> f64 + Sync,
    f32f: impl Fn(f32, f32) -> f32 + Sync,
    intf: impl Fn(i64, i64) -> Result<i64, OpError> + Sync,
) -> OpResult {
    let y = binary(
        input(inputs, 0)?,
        input(inputs, 1)?,
        &f64f,
        &f32f,
        &intf,
        &ctx.rounder(),
    )?;
    if y.dtype() == DType::F32 {
        ctx.outputs_rounded();
    }
    Ok(vec![y])
}

/// Max/Min/Sum/Mean over any number of inputs (Mean divides by `mean_of` at the end).
fn variadic(
    inputs: &[Option<&Tensor>],
    f64f: impl Fn(f64, f64) -> f64 + Sync,
    f32f: impl Fn(f32, f32) -> f32 + Sync,
    intf: impl Fn(i64, i64) -> Result<i64, OpError> + Sync,
    mean_of: Option<usize>,
) -> OpResult {
    let mut acc = input(inputs, 0)?.clone();
    for i in 1..inputs.len() {
        acc = binary(&acc, input(inputs, i)?, &f64f, &f32f, &intf, &|_| {})?;
    }
    if let Some(n) = mean_of {
        let n = n as f64;
        acc = map_float(&acc, |x| x / n, |x| x / n as f32, &|_| {})?;
    }
    Ok(vec![acc])
}

fn pow(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a = input(inputs, 0)?;
    let b = input(inputs, 1)?;
    if a.dtype() == DType::F32 && b.dtype() == DType::F32 {
        return arith(ctx, inputs, f64::powf, pow_f32, |x, y| Ok(int_pow(x, y)));
    }
    // Mixed dtypes (e.g. float base, int exponent): compute in f64, keep the base's dtype.
    let x = a
        .to_f64_vec()
        .ok_or_else(|| OpError("non-numeric base".into()))?;
    let y = b
        .to_f64_vec()
        .ok_or_else(|| OpError("non-numeric exponent".into()))?;
    let (s, v) = if a.dtype().is_int() {
        let (xi, yi) = (
            a.to_i64_vec().expect("int"),
            b.to_i64_vec().expect("numeric"),
        );
        let (s, v) = broadcast_binary(&xi, a.shape(), &yi, b.shape(), int_pow)?;
        return Ok(vec![cast_tensor(&Tensor::from_i64(s, v), a.dtype())]);
    } else {
        broadcast_binary(&x, a.shape(), &y, b.shape(), f64::powf)?
    };
    Ok(vec![cast_tensor(&Tensor::from_f64(s, v), a.dtype())])
}

fn pow_f32(x: f32, y: f32) -> f32 {
    // x² and x³ are common (GELU tanh form, variance): exact multiplications are faster and
    // as accurate.
    if y == 2.0 {
        x * x
    } else if y == 3.0 {
        x * x * x
    } else {
        x.powf(y)
    }
}

fn int_pow(x: i64, y: i64) -> i64 {
    if y < 0 {
        return if x == 1 { 1 } else { 0 };
    }
    x.wrapping_pow(y.min(u32::MAX as i64) as u32)
}

fn mod_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let fmod = ctx.attrs::<ElementwiseAttrs>()?.fmod;
    let a = input(inputs, 0)?;
    if a.dtype().is_float() && !fmod {
        return Err(OpError("Mod on floats requires fmod=1".into()));
    }
    arith(
        ctx,
        inputs,
        |x, y| x % y,
        |x, y| x % y,
        move |x, y| {
            if y == 0 {
                return Err(OpError("integer modulo by zero".into()));
            }
            let r = x.wrapping_rem(y);
            // Python-style: the result takes the divisor's sign unless fmod.
            Ok(if !fmod && r != 0 && ((r < 0) != (y < 0)) {
                r + y
            } else {
                r
            })
        },
    )
}

fn bit_shift(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let left = ctx.attrs::<ElementwiseAttrs>()?.shift_left;
    let a = input(inputs, 0)?;
    let b = input(inputs, 1)?;
    same_dtype(a, b)?;
    if !matches!(a.dtype(), DType::U8 | DType::U16 | DType::U32 | DType::U64) {
        return Err(OpError(format!(
            "BitShift needs unsigned integers, got {}",
            a.dtype()
        )));
    }
    let bits = a.dtype().size() as u32 * 8;
    let (x, y) = (a.to_i64_vec().expect("int"), b.to_i64_vec().expect("int"));
    let (s, v) = broadcast_binary(&x, a.shape(), &y, b.shape(), |p, q| {
        let (p, q) = (p as u64, q as u64);
        if q >= bits as u64 {
            0
        } else if left {
            (p << q) as i64
        } else {
            (p >> q) as i64
        }
    })?;
    Ok(vec![cast_tensor(&Tensor::from_i64(s, v), a.dtype())])
}

/// Equal, Less, Greater, LessOrEqual, GreaterOrEqual: `f` of the two values' order (`None`
/// where either is NaN, so every comparison with NaN is false, as in IEEE), on the values in
/// their own type — exact for every integer (int64 and uint64 beyond 2^53 included) and
/// vectorized; float16, bfloat16 and the float8 types through float32, which holds them
/// exactly.
fn compare(inputs: &[Option<&Tensor>], f: impl Fn(Option<Ordering>) -> bool + Sync) -> OpResult {
    let a = input(inputs, 0)?;
    let b = input(inputs, 1)?;
    same_dtype(a, b)?;
    fn typed<T: PartialOrd + Copy + Sync>(
        x: &[T],
        x_shape: &[usize],
        y: &[T],
        y_shape: &[usize],
        f: &(impl Fn(Option<Ordering>) -> bool + Sync),
    ) -> OpResult {
        let (s, v) = broadcast_binary(x, x_shape, y, y_shape, |p: T, q: T| f(p.partial_cmp(&q)))?;
        Ok(vec![Tensor::from_bool(s, v)])
    }
    let (sa, sb) = (a.shape(), b.shape());
    match (a.data(), b.data()) {
        (TensorData::F32(x), TensorData::F32(y)) => typed(x, sa, y, sb, &f),
        (TensorData::F64(x), TensorData::F64(y)) => typed(x, sa, y, sb, &f),
        (TensorData::I8(x), TensorData::I8(y)) => typed(x, sa, y, sb, &f),
        (TensorData::U8(x), TensorData::U8(y)) => typed(x, sa, y, sb, &f),
        (TensorData::I16(x), TensorData::I16(y)) => typed(x, sa, y, sb, &f),
        (TensorData::U16(x), TensorData::U16(y)) => typed(x, sa, y, sb, &f),
        (TensorData::I32(x), TensorData::I32(y)) => typed(x, sa, y, sb, &f),
        (TensorData::U32(x), TensorData::U32(y)) => typed(x, sa, y, sb, &f),
        (TensorData::I64(x), TensorData::I64(y)) => typed(x, sa, y, sb, &f),
        (TensorData::U64(x), TensorData::U64(y)) => typed(x, sa, y, sb, &f),
        (TensorData::Bool(x), TensorData::Bool(y)) => typed(x, sa, y, sb, &f),
        (TensorData::Str(x), TensorData::Str(y)) => {
            let idx: Vec<usize> = (0..x.len()).collect();
            let jdx: Vec<usize> = (0..y.len()).collect();
            let (s, v) = broadcast_binary(&idx, sa, &jdx, sb, |i, j| f(Some(x[i].cmp(&y[j]))))?;
            Ok(vec![Tensor::from_bool(s, v)])
        }
        _ => {
            let x = a
                .to_f32_vec()
                .ok_or_else(|| OpError(format!("dtype {} is not supported", a.dtype())))?;
            let y = b.to_f32_vec().expect("same dtype");
            typed(&x, sa, &y, sb, &f)
        }
    }
}

fn bools(t: &Tensor) -> Result<&[bool], OpError> {
    t.as_bool()
        .ok_or_else(|| OpError(format!("expected a bool tensor, got {}", t.dtype())))
}

fn not(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    Ok(vec![Tensor::from_bool(
        x.shape().to_vec(),
        bools(x)?.iter().map(|b| !b).collect(),
    )])
}

fn logic(inputs: &[Option<&Tensor>], f: impl Fn(bool, bool) -> bool + Sync) -> OpResult {
    let a = input(inputs, 0)?;
    let b = input(inputs, 1)?;
    let (s, v) = broadcast_binary(bools(a)?, a.shape(), bools(b)?, b.shape(), f)?;
    Ok(vec![Tensor::from_bool(s, v)])
}

fn where_op(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let c = input(inputs, 0)?;
    let x = input(inputs, 1)?;
    let y = input(inputs, 2)?;
    same_dtype(x, y)?;
    let cond = bools(c)?;
    let ci: Vec<usize> = (0..x.len()).collect();
    let cj: Vec<usize> = (0..y.len()).collect();
    // Select indices, then gather from whichever buffer: one generic path for every dtype.
    let (s, picks) = broadcast_ternary(
        (cond, c.shape()),
        (&ci, x.shape()),
        (&cj, y.shape()),
        |k, i, j| {
            if k {
                (true, i)
            } else {
                (false, j)
            }
        },
    )?;
    let data = match (x.data(), y.data()) {
        (TensorData::F32(a), TensorData::F32(b)) => TensorData::F32(
            picks
                .iter()
                .map(|&(t, i)| if t { a[i] } else { b[i] })
                .collect(),
        ),
        (xd, yd) => {
            // Any dtype: index into x's buffer followed by y's.
            let both = TensorData::concat(&[xd, yd]).expect("same dtype checked");
            let n = x.len();
            let idx: Vec<usize> = picks
                .iter()
                .map(|&(t, i)| if t { i } else { n + i })
                .collect();
            both.gather(&idx)
        }
    };
    Ok(vec![Tensor::from_parts(s, data)])
}

fn clip(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let (lo, hi) = clip_bounds(ctx, inputs, x.dtype())?;
    if x.dtype().is_int() {
        let v: Vec<i64> = x
            .to_i64_vec()
            .expect("int")
            .into_iter()
            .map(|v| (v as f64).max(lo).min(hi) as i64)
            .collect();
        return Ok(vec![cast_tensor(
            &Tensor::from_i64(x.shape().to_vec(), v),
            x.dtype(),
        )]);
    }
    let (lo32, hi32) = (lo as f32, hi as f32);
    map_op(
        ctx,
        x,
        // The same compares in f64 as `lanewise::clip` in f32 (a tie keeps the input).
        |v| {
            let v = if v < lo { lo } else { v };
            if v > hi {
                hi
            } else {
                v
            }
        },
        move |v| super::lanewise::clip(v, lo32, hi32),
    )
}

/// Clip's bounds for values of `dtype`: attributes before opset 11, optional scalar inputs
/// from 11; a missing bound is the type's lowest/largest finite value.
fn clip_bounds(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    dtype: DType,
) -> Result<(f64, f64), OpError> {
    // Opset < 11: min/max attributes; from 11: optional scalar inputs.
    let (lo, hi) = if ctx.opset < 11 {
        let attrs = ctx.attrs::<ElementwiseAttrs>()?;
        (attrs.min.map(|v| v as f64), attrs.max.map(|v| v as f64))
    } else {
        let scalar = |i: usize| -> Result<Option<f64>, OpError> {
            match opt_input(inputs, i) {
                None => Ok(None),
                Some(t) if t.len() == 1 => Ok(t.to_f64_vec().map(|v| v[0])),
                Some(t) => Err(OpError(format!(
                    "bound #{i} must be a scalar, got shape {:?}",
                    t.shape()
                ))),
            }
        };
        (scalar(1)?, scalar(2)?)
    };
    // A missing bound is the type's lowest/largest finite value (the spec's
    // numeric_limits::lowest()/max(), as ONNX Runtime): Clip(-inf) without `min` is -MAX.
    let (lowest, largest) = match dtype {
        DType::F32 => (f32::MIN as f64, f32::MAX as f64),
        DType::F16 => (half::f16::MIN.to_f64(), half::f16::MAX.to_f64()),
        DType::BF16 => (half::bf16::MIN.to_f64(), half::bf16::MAX.to_f64()),
        DType::F64 => (f64::MIN, f64::MAX),
        _ => (f64::NEG_INFINITY, f64::INFINITY),
    };
    Ok((lo.unwrap_or(lowest), hi.unwrap_or(largest)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Node;

    fn ctx_node(op: &str) -> Node {
        Node {
            name: "n".into(),
            op_type: op.into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec!["y".into()],
            attrs: Default::default(),
            ..Default::default()
        }
    }

    fn run(op: &str, inputs: &[&Tensor]) -> Tensor {
        let node = ctx_node(op);
        let k = Registry::global().get("", op).unwrap();
        let args: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        k(&OpCtx::new(&node, 17), &args).unwrap().remove(0)
    }

    #[test]
    fn int64_division_truncates_and_broadcasts() {
        let a = Tensor::from_i64(vec![3], vec![7, -7, 9]);
        let b = Tensor::from_i64(vec![], vec![2]);
        assert_eq!(run("Div", &[&a, &b]).as_i64().unwrap(), &[3, -3, 4]);
        assert_eq!(run("Mod", &[&a, &b]).as_i64().unwrap(), &[1, 1, 1]);
    }

    #[test]
    fn where_mixes_by_condition() {
        let c = Tensor::from_bool(vec![2], vec![true, false]);
        let x = Tensor::from_i64(vec![2], vec![1, 2]);
        let y = Tensor::from_i64(vec![], vec![9]);
        assert_eq!(run("Where", &[&c, &x, &y]).as_i64().unwrap(), &[1, 9]);
    }

    #[test]
    fn erf_and_gelu_are_accurate() {
        let x = Tensor::from_f32(vec![3], vec![0.5, -1.0, 2.0]);
        let y = run("Erf", &[&x]);
        let want = [0.520_499_9, -0.842_700_8, 0.995_322_3];
        for (a, b) in y.as_f32().unwrap().iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        let g = run("Gelu", &[&x]);
        assert!((g.as_f32().unwrap()[0] - 0.345_731_1).abs() < 1e-6);
    }

    #[test]
    fn comparisons_give_bools() {
        let a = Tensor::from_f32(vec![3], vec![1., 2., 3.]);
        let b = Tensor::from_f32(vec![], vec![2.]);
        assert_eq!(
            run("Less", &[&a, &b]).as_bool().unwrap(),
            &[true, false, false]
        );
        assert_eq!(
            run("Equal", &[&a, &b]).as_bool().unwrap(),
            &[false, true, false]
        );
    }

    /// Each comparison in the inputs' own type: int64/uint64 values 2^53 apart that float64
    /// would make equal, NaN unordered, int32 broadcast over a big output (the parallel
    /// path), float16 through float32.
    #[test]
    fn comparisons_are_exact_in_every_type() {
        let ops = ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"];
        fn truth(op: &str, o: Option<Ordering>) -> bool {
            match op {
                "Equal" => o == Some(Ordering::Equal),
                "Less" => o == Some(Ordering::Less),
                "Greater" => o == Some(Ordering::Greater),
                "LessOrEqual" => matches!(o, Some(Ordering::Less | Ordering::Equal)),
                _ => matches!(o, Some(Ordering::Greater | Ordering::Equal)),
            }
        }
        fn truths<T: PartialOrd>(op: &str, x: &[T], y: &[T]) -> Vec<bool> {
            x.iter()
                .zip(y)
                .map(|(p, q)| truth(op, p.partial_cmp(q)))
                .collect()
        }
        let big = 1i64 << 60;
        let i64s = (vec![big, big + 1, -3], vec![big + 1, big + 1, -3]);
        let u64s = (
            vec![u64::MAX, u64::MAX - 1, 0],
            vec![u64::MAX - 1, u64::MAX - 1, 1],
        );
        let f32s = (
            vec![f32::NAN, 1.0, f32::NEG_INFINITY],
            vec![f32::NAN, f32::NAN, -1e38],
        );
        for op in ops {
            let pairs: Vec<(Tensor, Tensor, Vec<bool>)> = vec![
                (
                    Tensor::from_i64(vec![3], i64s.0.clone()),
                    Tensor::from_i64(vec![3], i64s.1.clone()),
                    truths(op, &i64s.0, &i64s.1),
                ),
                (
                    Tensor::new(vec![3], TensorData::U64(u64s.0.clone().into())).unwrap(),
                    Tensor::new(vec![3], TensorData::U64(u64s.1.clone().into())).unwrap(),
                    truths(op, &u64s.0, &u64s.1),
                ),
                (
                    Tensor::from_f32(vec![3], f32s.0.clone()),
                    Tensor::from_f32(vec![3], f32s.1.clone()),
                    truths(op, &f32s.0, &f32s.1),
                ),
                (
                    cast_tensor(&Tensor::from_f32(vec![2], vec![0.1, 65504.0]), DType::F16),
                    cast_tensor(
                        &Tensor::from_f32(vec![2], vec![0.1, f32::INFINITY]),
                        DType::F16,
                    ),
                    vec![
                        truth(op, Some(Ordering::Equal)),
                        truth(op, Some(Ordering::Less)),
                    ],
                ),
            ];
            for (a, b, expected) in pairs {
                assert_eq!(
                    run(op, &[&a, &b]).as_bool().unwrap(),
                    &expected[..],
                    "{op} {}",
                    a.dtype()
                );
            }
            // [1, 2048, 1] against [257] (a one-hot's Equal): 526 336 values, several tasks.
            let a: Vec<i32> = (0..2048).map(|i| i % 300).collect();
            let b: Vec<i32> = (0..257).collect();
            let ta = Tensor::new(vec![1, 2048, 1], TensorData::I32(a.clone().into())).unwrap();
            let tb = Tensor::new(vec![257], TensorData::I32(b.clone().into())).unwrap();
            let got = run(op, &[&ta, &tb]);
            assert_eq!(got.shape(), &[1, 2048, 257]);
            let expected: Vec<bool> = a
                .iter()
                .flat_map(|p| b.iter().map(move |q| truth(op, p.partial_cmp(q))))
                .collect();
            assert!(got.as_bool().unwrap() == &expected[..], "{op} broadcast");
        }
    }

    #[test]
    fn swish_and_shrink() {
        let x = Tensor::from_f32(vec![3], vec![-2.0, 0.0, 3.0]);
        let y = run("Swish", &[&x]);
        let v = y.as_f32().unwrap();
        assert!((v[0] + 2.0 / (1.0 + 2f32.exp())).abs() < 1e-6 && v[1] == 0.0);
        let y = run("Shrink", &[&x]);
        assert_eq!(y.as_f32().unwrap(), &[-2.0, 0.0, 3.0]);
        let xi = Tensor::from_i64(vec![3], vec![-2, 0, 3]);
        assert_eq!(run("Shrink", &[&xi]).as_i64().unwrap(), &[-2, 0, 3]);
    }

    #[test]
    fn sigmoid_is_stable() {
        let x = Tensor::from_f32(vec![2], vec![-1000.0, 1000.0]);
        assert_eq!(run("Sigmoid", &[&x]).as_f32().unwrap(), &[0.0, 1.0]);
    }

    #[test]
    fn nan_and_infinities_propagate_as_in_onnxruntime() {
        let nan = f32::NAN;
        let x = Tensor::from_f32(vec![4], vec![nan, -0.0, f32::NEG_INFINITY, 2.0]);
        let relu = run("Relu", &[&x]);
        let r = relu.as_f32().unwrap();
        assert!(r[0].is_nan(), "Relu(NaN) is NaN, not 0");
        assert!(r[1] == 0.0 && r[1].is_sign_negative() && r[2] == 0.0 && r[3] == 2.0);
        let one = Tensor::from_f32(vec![4], vec![1.0; 4]);
        for op in ["Max", "Min"] {
            for args in [[&x, &one], [&one, &x]] {
                let y = run(op, &args);
                assert!(y.as_f32().unwrap()[0].is_nan(), "{op}(NaN, 1) is NaN");
            }
        }
        let clip = run("Clip", &[&x]);
        let c = clip.as_f32().unwrap();
        assert!(c[0].is_nan(), "Clip(NaN) is NaN");
        assert_eq!(
            c[2],
            f32::MIN,
            "Clip without min is bounded by the lowest float"
        );
        // A zero equal to a bound of the other sign keeps its sign (ONNX Runtime's compares),
        // in float32 and float64 alike.
        let zero = Tensor::from_f32(vec![], vec![0.0]);
        let six = Tensor::from_f32(vec![], vec![6.0]);
        let c = run("Clip", &[&x, &zero, &six]);
        assert!(
            c.as_f32().unwrap()[1].is_sign_negative(),
            "Clip(-0, 0, 6) = -0"
        );
        let x64 = Tensor::from_f64(vec![2], vec![-0.0, 7.0]);
        let (zero64, six64) = (
            Tensor::from_f64(vec![], vec![0.0]),
            Tensor::from_f64(vec![], vec![6.0]),
        );
        let c = run("Clip", &[&x64, &zero64, &six64]);
        let c = c.to_f64_vec().unwrap();
        assert!(
            c[0] == 0.0 && c[0].is_sign_negative() && c[1] == 6.0,
            "{c:?}"
        );
        let sign = run("Sign", &[&x]);
        let s = sign.as_f32().unwrap();
        assert!(s[0].is_nan() && s[1] == 0.0 && s[1].is_sign_positive() && s[2] == -1.0);
        let big = Tensor::from_f32(vec![2], vec![1e30, -3e38]);
        let a = run("Asinh", &[&big]);
        let want = [(1e30f64).asinh(), -(3e38f64).asinh()];
        for (&got, want) in a.as_f32().unwrap().iter().zip(want) {
            assert!(
                ((got as f64 - want) / want).abs() < 1e-6,
                "asinh {got} vs {want}"
            );
        }
        let node = Node {
            attrs: [("alpha".to_string(), crate::graph::Attribute::Float(1.0))].into(),
            ..ctx_node("Celu")
        };
        let k = Registry::global().get("", "Celu").unwrap();
        let y = k(&OpCtx::new(&node, 17), &[Some(&x)]).unwrap().remove(0);
        assert!(y.as_f32().unwrap()[0].is_nan(), "Celu(NaN) is NaN");
    }

    #[test]
    fn bad_attributes_are_load_errors() {
        use crate::graph::Attribute;
        use crate::ops::attrs::testing::{assert_rejected, load_error};
        assert_rejected(
            "LeakyRelu",
            &[("alpha", Attribute::Int(1))],
            "alpha",
            "expected a float, got an int",
        );
        assert_rejected(
            "Gelu",
            &[("approximate", Attribute::String("fast".into()))],
            "approximate",
            "'fast' is not one of 'none', 'tanh'",
        );
        assert_rejected("BitShift", &[], "direction", "missing");
        crate::ops::attrs::testing::assert_rejected_at(
            "Clip",
            &[("min", Attribute::Ints(vec![0]))],
            6,
            "min",
            "expected a float",
        );
        // Clip's min/max are inputs from opset 11: the attributes are not read.
        assert!(load_error("Clip", &[("min", Attribute::Ints(vec![0]))], 13).is_none());
    }
}
