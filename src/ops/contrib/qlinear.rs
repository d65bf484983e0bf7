//! com.microsoft QLinearSigmoid, QLinearLeakyRelu and QLinearConcat, QOperator-format ops ONNX
//! Runtime's `quantize_static` writes, and the code-level arithmetic the other QLinear files
//! (`qlinear_binary.rs`, `qlinear_pool.rs`) share.
//!
//! As ONNX Runtime's CPU kernels (contrib_ops/cpu/quantization/qlinear_lookup_table.cc,
//! qlinear_concat.cc) the three map each of the 256 input codes through a table: the code is
//! dequantized (`x_scale · (q − x_zero_point)` in f32), the activation (identity for Concat)
//! applied, the result quantized as MLAS does (`x / y_scale` clamped to the code range less the
//! zero point — a NaN becomes the lowest code — rounded half to even, plus the zero point).
//! Concat copies an input whose scale and zero point equal the output's. The results are
//! exact whatever the precision plan: the ops have no float operand.

use super::super::attrs::{boxed, AttrError, Attrs};
use super::super::shape::{fact, opt_fact, FactsResult};
use super::super::util::{input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::Fact;
use crate::tensor::{DType, Tensor, TensorData};

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Scale, ZeroPoint};
    r.add_in(MS_DOMAIN, "QLinearSigmoid", |_, i| {
        lookup(i, &super::super::logistic::logistic)
    })
    .roles(&[Data, Scale, ZeroPoint, Scale, ZeroPoint])
    .infer(same_codes);
    r.add_in(MS_DOMAIN, "QLinearLeakyRelu", leaky_relu)
        .parse(|n, _| boxed(Attrs::new(n).float_or("alpha", 0.01)))
        .roles(&[Data, Scale, ZeroPoint, Scale, ZeroPoint])
        .infer(same_codes);
    r.add_in(MS_DOMAIN, "QLinearConcat", concat)
        .parse(|n, opset| boxed(concat_attrs(n, opset)))
        .roles(&CONCAT_ROLES)
        .infer(concat_facts);
}

/// A tensor's quantization: (scale, zero point).
pub(super) type Quant = (f32, i32);

/// The code type of a quantized tensor: its range and element type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct CodeType {
    pub lo: i32,
    pub hi: i32,
    pub dtype: DType,
}

impl CodeType {
    /// The code type of `t` (uint8 or int8), or an error naming `what`.
    pub fn of(t: &Tensor, what: &str) -> Result<CodeType, OpError> {
        let (lo, hi) = match t.dtype() {
            DType::U8 => (0, 255),
            DType::I8 => (-128, 127),
            other => {
                return Err(OpError(format!(
                    "{what} has dtype {other}, expected uint8 or int8"
                )))
            }
        };
        Ok(CodeType {
            lo,
            hi,
            dtype: t.dtype(),
        })
    }

    /// A tensor of these codes (each already within `lo..=hi`).
    pub fn tensor(self, shape: Vec<usize>, codes: Vec<i32>) -> Tensor {
        let data = match self.dtype {
            DType::U8 => TensorData::U8(codes.iter().map(|&v| v as u8).collect::<Vec<_>>().into()),
            _ => TensorData::I8(codes.iter().map(|&v| v as i8).collect::<Vec<_>>().into()),
        };
        Tensor::from_parts(shape, data)
    }

    /// An x86 `cvtps2dq` of `v` (round half to even; NaN and values outside i32 give
    /// i32::MIN) followed by the saturating packs to the code type, as MLAS's SSE/AVX kernels
    /// store their results.
    pub fn convert_saturate(self, v: f32) -> i32 {
        let r = v.round_ties_even();
        let i = if r.is_nan() || !(-2147483648.0..2147483648.0).contains(&r) {
            i32::MIN
        } else {
            r as i32
        };
        i.clamp(self.lo, self.hi)
    }

    /// MLAS's quantization of `v` (already divided by the scale): clamped to the code range
    /// less the zero point (a NaN takes the lower bound, as MAXPS returns its second operand),
    /// rounded half to even, plus the zero point.
    pub fn quantize(self, v: f32, zero_point: i32) -> i32 {
        let (min, max) = ((self.lo - zero_point) as f32, (self.hi - zero_point) as f32);
        let v = if v.is_nan() || v < min {
            min
        } else {
            v.min(max)
        };
        (v.round_ties_even() as i32 + zero_point).clamp(self.lo, self.hi)
    }
}

/// The codes of an integer tensor as i32.
pub(crate) fn codes(t: &Tensor) -> Vec<i32> {
    match t.data() {
        TensorData::U8(v) => v.iter().map(|&x| x as i32).collect(),
        TensorData::I8(v) => v.iter().map(|&x| x as i32).collect(),
        other => other
            .to_i64_vec()
            .unwrap_or_default()
            .into_iter()
            .map(|x| x as i32)
            .collect(),
    }
}

/// A scalar (or one-element) f32 scale, or an error naming it.
pub(super) fn scale(inputs: &[Option<&Tensor>], i: usize, what: &str) -> Result<f32, OpError> {
    let t = input(inputs, i)?;
    match t.as_f32() {
        Some([s]) => Ok(*s),
        _ => Err(OpError(format!(
            "{what} must be one float32 value, got {} {:?}",
            t.dtype(),
            t.shape()
        ))),
    }
}

/// A scalar zero point of the codes' type (0 when omitted), or an error naming it.
pub(super) fn zero_point(
    inputs: &[Option<&Tensor>],
    i: usize,
    codes: CodeType,
    what: &str,
) -> Result<i32, OpError> {
    let Some(t) = opt_input(inputs, i) else {
        return Ok(0);
    };
    if t.dtype() != codes.dtype || t.len() != 1 {
        return Err(OpError(format!(
            "{what} must be one {} value, got {} {:?}",
            codes.dtype,
            t.dtype(),
            t.shape()
        )));
    }
    Ok(self::codes(t)[0])
}

/// The output of a op whose output codes have the input's type and shape.
fn same_codes(_: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

fn leaky_relu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let alpha = *ctx.attrs::<f32>()?;
    lookup(inputs, &move |x: f32| if x >= 0.0 { x } else { alpha * x })
}

/// ONNX Runtime's lookup table (QlinearBuildLookupTable): `table[q − lo]` for every code `q`.
fn table(
    codes: CodeType,
    (xs, xz): (f32, i32),
    (ys, yz): (f32, i32),
    f: &dyn Fn(f32) -> f32,
) -> Vec<i32> {
    (codes.lo..=codes.hi)
        .map(|q| codes.quantize(f(xs * (q - xz) as f32) / ys, yz))
        .collect()
}

/// QLinearSigmoid / QLinearLeakyRelu: X, X_scale, X_zero_point, Y_scale, Y_zero_point.
fn lookup(inputs: &[Option<&Tensor>], f: &dyn Fn(f32) -> f32) -> OpResult {
    let x = input(inputs, 0)?;
    let ct = CodeType::of(x, "X")?;
    let xq = (
        scale(inputs, 1, "X_scale")?,
        zero_point(inputs, 2, ct, "X_zero_point")?,
    );
    let yq = (
        scale(inputs, 3, "Y_scale")?,
        zero_point(inputs, 4, ct, "Y_zero_point")?,
    );
    let t = table(ct, xq, yq, f);
    let out = codes(x).iter().map(|&q| t[(q - ct.lo) as usize]).collect();
    Ok(vec![ct.tensor(x.shape().to_vec(), out)])
}

/// QLinearConcat's input roles: Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) for
/// up to 64 inputs (more are read as data, which only matters under a float plan: their
/// scales would be rounded).
const CONCAT_ROLES: [InputRole; 2 + 3 * 64] = {
    let mut r = [InputRole::Data; 2 + 3 * 64];
    r[0] = InputRole::Scale;
    r[1] = InputRole::ZeroPoint;
    let mut i = 2;
    while i < r.len() {
        r[i + 1] = InputRole::Scale;
        r[i + 2] = InputRole::ZeroPoint;
        i += 3;
    }
    r
};

/// QLinearConcat's attributes: Concat's (a required `axis`).
fn concat_attrs(
    node: &crate::graph::Node,
    opset: i64,
) -> Result<super::super::movement::MovementAttrs, AttrError> {
    if !Attrs::new(node).has("axis") {
        return Err(AttrError::new("axis", "missing (the op needs it)"));
    }
    super::super::movement::MovementAttrs::parse(node, opset)
}

/// The data inputs (X of every tuple) of a QLinearConcat with `n` inputs, or an error when the
/// inputs are not Y_scale, Y_zero_point and whole (X, X_scale, X_zero_point) tuples.
fn concat_data(n: usize) -> Result<impl Iterator<Item = usize>, OpError> {
    if n < 5 || !(n - 2).is_multiple_of(3) {
        return Err(OpError(format!(
            "has {n} inputs; expected Y_scale, Y_zero_point and (X, X_scale, X_zero_point) \
             tuples"
        )));
    }
    Ok((2..n).step_by(3))
}

fn concat_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let mut out = super::super::shape::infer_as("Concat", ctx, ins, concat_data(ins.len())?)?;
    if let Some(zp) = opt_fact(ins, 1) {
        out[0].dtype = zp.dtype;
    }
    Ok(out)
}

fn concat(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let y_zero = input(inputs, 1)?;
    let ct = CodeType::of(y_zero, "Y_zero_point")?;
    let yq = (
        scale(inputs, 0, "Y_scale")?,
        zero_point(inputs, 1, ct, "Y_zero_point")?,
    );
    let mut mapped = Vec::new();
    for (k, i) in concat_data(inputs.len())?.enumerate() {
        let x = input(inputs, i)?;
        if x.dtype() != ct.dtype {
            return Err(OpError(format!(
                "input {k} has dtype {}, the output's zero point {}",
                x.dtype(),
                ct.dtype
            )));
        }
        let xq = (
            scale(inputs, i + 1, &format!("the scale of input {k}"))?,
            zero_point(inputs, i + 2, ct, &format!("the zero point of input {k}"))?,
        );
        // ONNX Runtime copies an input quantized as the output is (compared by value).
        if xq == yq {
            mapped.push(x.clone());
        } else {
            let t = table(ct, xq, yq, &|v| v);
            let out = codes(x).iter().map(|&q| t[(q - ct.lo) as usize]).collect();
            mapped.push(ct.tensor(x.shape().to_vec(), out));
        }
    }
    let kernel = Registry::global()
        .def("", "Concat")
        .map(|d| d.kernel)
        .ok_or_else(|| OpError("Concat has no kernel".into()))?;
    let refs: Vec<Option<&Tensor>> = mapped.iter().map(Some).collect();
    kernel(ctx, &refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_through_the_activation() {
        // uint8 codes 0, 128, 255 with scale 1/32, zero point 128: -4, 0, 3.97.
        let x = Tensor::from_parts(vec![3], TensorData::U8(vec![0u8, 128, 255].into()));
        let s = Tensor::from_f32(vec![], vec![1.0 / 32.0]);
        let zp = Tensor::from_parts(vec![], TensorData::U8(vec![128u8].into()));
        let ys = Tensor::from_f32(vec![], vec![1.0 / 256.0]);
        let y0 = Tensor::from_parts(vec![], TensorData::U8(vec![0u8].into()));
        let ins = [Some(&x), Some(&s), Some(&zp), Some(&ys), Some(&y0)];
        let y = lookup(&ins, &super::super::super::logistic::logistic).unwrap();
        // sigmoid(-4)·256 = 4.6 → 5; sigmoid(0)·256 = 128; sigmoid(3.97)·256 = 251.3 → 251.
        assert_eq!(y[0].to_i64_vec().unwrap(), vec![5, 128, 251]);
        let bad = Tensor::from_f32(vec![1], vec![0.0]);
        let e = lookup(&[Some(&bad), Some(&s), None, Some(&ys), None], &|v| v).unwrap_err();
        assert!(e.0.contains("uint8 or int8"), "{e}");
    }

    #[test]
    fn saturating_conversion_follows_cvtps2dq() {
        let u8 = CodeType {
            lo: 0,
            hi: 255,
            dtype: DType::U8,
        };
        assert_eq!(u8.convert_saturate(2.5), 2);
        assert_eq!(u8.convert_saturate(3.5), 4);
        assert_eq!(u8.convert_saturate(300.0), 255);
        // NaN and values past i32 become i32::MIN: the lowest code, even for +3e9.
        assert_eq!(u8.convert_saturate(f32::NAN), 0);
        assert_eq!(u8.convert_saturate(3e9), 0);
        assert_eq!(u8.quantize(f32::NAN, 10), 0);
        assert_eq!(u8.quantize(1e9, 10), 255);
        assert_eq!(u8.quantize(-0.5, 10), 10);
    }

    #[test]
    fn concat_requantizes_each_input_to_the_output_grid() {
        use crate::graph::testing::node_with;
        use crate::graph::Attribute;
        let mut node = node_with("QLinearConcat", &[("axis", Attribute::Int(1))]);
        node.domain = MS_DOMAIN.into();
        let ctx = OpCtx::new(&node, 1);
        let u8s =
            |shape: Vec<usize>, v: Vec<u8>| Tensor::from_parts(shape, TensorData::U8(v.into()));
        let (ys, yz) = (Tensor::from_f32(vec![], vec![0.5]), u8s(vec![], vec![10]));
        // Input 0 on the output's grid (copied), input 1 with scale 1.0, zero point 0.
        let a = u8s(vec![2, 1], vec![7, 200]);
        let b = u8s(vec![2, 2], vec![1, 2, 3, 250]);
        let (bs, bz) = (Tensor::from_f32(vec![], vec![1.0]), u8s(vec![], vec![0]));
        let ins = [
            Some(&ys),
            Some(&yz),
            Some(&a),
            Some(&ys),
            Some(&yz),
            Some(&b),
            Some(&bs),
            Some(&bz),
        ];
        let y = concat(&ctx, &ins).unwrap();
        assert_eq!(y[0].shape(), &[2, 3]);
        // b's codes q become 2q + 10, saturating at 255.
        assert_eq!(y[0].to_i64_vec().unwrap(), vec![7, 12, 14, 200, 16, 255]);
        let e = concat(&ctx, &ins[..7]).unwrap_err();
        assert!(e.0.contains("tuples"), "{e}");
    }
}
