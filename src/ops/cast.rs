//! Cast and CastLike: dtype conversion with ONNX semantics (floats to ints truncate toward
//! zero and saturate, to bool is `x != 0`, float narrowing rounds to nearest even).
//!
//! The low-bit types (src/lowbit.rs): to float8 rounds to nearest even and, with the
//! `saturate` attribute (opset 19+, default 1), clamps out-of-range values and infinities to
//! ±max; `saturate=0` gives inf/NaN per ONNX's table. To float4e2m1 always saturates. To
//! int4/uint4 truncates floats toward zero and keeps the low 4 bits (ONNX's rule for
//! out-of-range fixed point: "discard higher bits"), NaN and ±inf give 0 (as the ONNX
//! reference, ml_dtypes, does).

use super::util::input;
use super::{OpCtx, OpError, OpResult, Registry};
use crate::lowbit::{F4E2M1, F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, I4, U4};
use crate::tensor::{DType, Tensor, TensorData};
use half::{bf16, f16};

pub fn register(r: &mut Registry) {
    r.add("Cast", cast_op);
    r.add("CastLike", cast_like_op);
    for op in ["Cast", "CastLike"] {
        r.def_mut(op)
            .movement()
            .own_output_type()
            .roles(&[super::InputRole::Data, super::InputRole::Param])
            .parse(|n, opset| super::attrs::boxed(CastAttrs::parse(n, opset)));
    }
    r.def_mut("Cast").infer(|ctx, ins| {
        let x = super::shape::fact(ins, 0)?;
        let dtype = cast_to(ctx.attrs::<CastAttrs>()?)?;
        let mut f = crate::graph::fact::Fact::new(Some(dtype), x.shape.clone());
        if dtype.is_int() {
            f.dims = x.dims.clone();
        }
        Ok(vec![f])
    });
    r.def_mut("CastLike").infer(|_, ins| {
        let (x, like) = (super::shape::fact(ins, 0)?, super::shape::fact(ins, 1)?);
        Ok(vec![crate::graph::fact::Fact::new(
            like.dtype,
            x.shape.clone(),
        )])
    });
}

/// Cast's and CastLike's attributes: `to` (Cast: required, a type mixprec knows) and
/// `saturate` (opset 19+, float8 targets only; default 1; always on before 19).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CastAttrs {
    pub to: Option<DType>,
    pub saturate: bool,
}

impl CastAttrs {
    fn parse(node: &crate::graph::Node, opset: i64) -> Result<CastAttrs, super::attrs::AttrError> {
        let a = super::attrs::Attrs::new(node);
        let to = a.dtype("to")?;
        if to.is_none() && node.op_type == "Cast" {
            return Err(super::attrs::AttrError::new(
                "to",
                "missing (the op needs it)",
            ));
        }
        Ok(CastAttrs {
            to,
            saturate: opset < 19 || a.flag("saturate", true)?,
        })
    }
}

fn cast_to(a: &CastAttrs) -> Result<DType, OpError> {
    a.to.ok_or_else(|| OpError("attribute 'to' is required".into()))
}

fn cast_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let attrs = ctx.attrs::<CastAttrs>()?;
    Ok(vec![checked_cast(x, cast_to(attrs)?, attrs.saturate)?])
}

fn cast_like_op(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let x = input(inputs, 0)?;
    let like = input(inputs, 1)?;
    Ok(vec![checked_cast(
        x,
        like.dtype(),
        ctx.attrs::<CastAttrs>()?.saturate,
    )?])
}

fn checked_cast(x: &Tensor, to: DType, saturate: bool) -> Result<Tensor, OpError> {
    if (x.dtype() == DType::Str) != (to == DType::Str) {
        return Err(OpError(format!(
            "cast between {} and {to} is not supported",
            x.dtype()
        )));
    }
    Ok(cast_tensor_saturate(x, to, saturate))
}

/// Converts a tensor to `to`. Numeric only (strings cast to strings unchanged). Float8
/// targets saturate (ONNX's default).
pub fn cast_tensor(x: &Tensor, to: DType) -> Tensor {
    cast_tensor_saturate(x, to, true)
}

/// [`cast_tensor`] with ONNX's `saturate` choice for float8 targets (see the module docs).
pub fn cast_tensor_saturate(x: &Tensor, to: DType, saturate: bool) -> Tensor {
    if x.dtype() == to {
        return x.clone();
    }
    let shape = x.shape().to_vec();
    let d = x.data();
    // Integer sources go through i64 (exact), float sources through f64 (exact for all).
    let data = match to {
        DType::F32 => TensorData::F32(match d {
            TensorData::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            TensorData::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            // Exact in f64 and in f32 alike: straight, without the f64 copy (a one-hot
            // mask's bool → float is a large tensor in Magika).
            TensorData::Bool(v) => v.iter().map(|&x| x as u8 as f32).collect(),
            TensorData::U8(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I8(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I16(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U16(v) => v.iter().map(|&x| x as f32).collect(),
            // Rounded once, to nearest even, as C's conversion in ONNX Runtime's Cast: through
            // f64 a 64-bit value beyond 2^53 would be rounded twice (2^60 + 2^36 + 1 to 2^60
            // instead of 2^60 + 2^37).
            TensorData::I32(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U32(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f32).collect(),
            TensorData::U64(v) => v.iter().map(|&x| x as f32).collect(),
            _ => num(d).into_iter().map(|x| x as f32).collect(),
        }),
        DType::F64 => TensorData::F64(num(d).into()),
        // Every other source goes through f32 first, rounded twice as ONNX Runtime's Cast
        // rounds it (`static_cast<float>`, then float → half): double 2049.00001 is 2048 in
        // float16 there (2049.0 in f32, a tie), not 2050; int64 2^25 + 131073 is 2^25 in
        // bfloat16, not 2^25 + 2^18.
        DType::F16 => TensorData::F16(match d {
            TensorData::F32(v) => v.iter().map(|&x| f16::from_f32(x)).collect(),
            TensorData::BF16(v) => v.iter().map(|x| f16::from_f32(x.to_f32())).collect(),
            _ => through_f32(x).iter().map(|&x| f16::from_f32(x)).collect(),
        }),
        DType::BF16 => TensorData::BF16(match d {
            TensorData::F32(v) => v.iter().map(|&x| bf16::from_f32(x)).collect(),
            TensorData::F16(v) => v.iter().map(|x| bf16::from_f32(x.to_f32())).collect(),
            _ => through_f32(x).iter().map(|&x| bf16::from_f32(x)).collect(),
        }),
        DType::Bool => TensorData::Bool(num(d).into_iter().map(|x| x != 0.0).collect()),
        DType::I8 => TensorData::I8(ints(d).into_iter().map(|x| x as i8).collect()),
        DType::U8 => TensorData::U8(ints(d).into_iter().map(|x| x as u8).collect()),
        DType::I16 => TensorData::I16(ints(d).into_iter().map(|x| x as i16).collect()),
        DType::U16 => TensorData::U16(ints(d).into_iter().map(|x| x as u16).collect()),
        DType::I32 => TensorData::I32(ints(d).into_iter().map(|x| x as i32).collect()),
        DType::U32 => TensorData::U32(ints(d).into_iter().map(|x| x as u32).collect()),
        DType::I64 => TensorData::I64(ints(d).into_iter().map(|x| x as i64).collect()),
        DType::U64 => TensorData::U64(match d {
            TensorData::U64(v) => v.clone(),
            _ => ints(d).into_iter().map(|x| x as u64).collect(),
        }),
        DType::Str => d.clone(),
        DType::F8E4M3FN => TensorData::F8E4M3FN(
            small_float_source(x)
                .into_iter()
                .map(|x| F8E4M3FN::from_f64(x, saturate))
                .collect(),
        ),
        DType::F8E4M3FNUZ => TensorData::F8E4M3FNUZ(
            small_float_source(x)
                .into_iter()
                .map(|x| F8E4M3FNUZ::from_f64(x, saturate))
                .collect(),
        ),
        DType::F8E5M2 => TensorData::F8E5M2(
            small_float_source(x)
                .into_iter()
                .map(|x| F8E5M2::from_f64(x, saturate))
                .collect(),
        ),
        DType::F8E5M2FNUZ => TensorData::F8E5M2FNUZ(
            small_float_source(x)
                .into_iter()
                .map(|x| F8E5M2FNUZ::from_f64(x, saturate))
                .collect(),
        ),
        DType::F4E2M1 => TensorData::F4E2M1(
            small_float_source(x)
                .into_iter()
                .map(|x| F4E2M1::from_f64(x, true))
                .collect(),
        ),
        DType::I4 => TensorData::I4(
            ints_finite(d)
                .into_iter()
                .map(|x| I4::wrapping(x as i64))
                .collect(),
        ),
        DType::U4 => TensorData::U4(
            ints_finite(d)
                .into_iter()
                .map(|x| U4::wrapping(x as i64))
                .collect(),
        ),
    };
    Tensor::from_parts(shape, data)
}

/// [`ints`] with ±inf as 0 (4-bit targets, as ml_dtypes casts them).
fn ints_finite(d: &TensorData) -> Vec<i128> {
    if is_float_data(d) {
        num(d)
            .into_iter()
            .map(|x| if x.is_finite() { x.trunc() as i128 } else { 0 })
            .collect()
    } else {
        ints(d)
    }
}

fn is_float_data(d: &TensorData) -> bool {
    d.dtype().is_float() || matches!(d.dtype(), DType::F4E2M1) || d.dtype().is_fp8()
}

/// The values a cast to a float8/float4 type rounds: exact for float32 and narrower float
/// sources; a double or an integer rounded to f32 first, as ONNX Runtime's Cast does
/// (measured: double 1.0625 + 2^-27 is 1.0 in float8e4m3fn there, a tie in f32, not 1.125).
fn small_float_source(x: &Tensor) -> Vec<f64> {
    match x.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => num(x.data()),
        _ => through_f32(x).into_iter().map(f64::from).collect(),
    }
}

/// `x` as f32 values, each rounded once (the F32 arm of [`cast_tensor_saturate`]).
fn through_f32(x: &Tensor) -> Vec<f32> {
    cast_tensor_saturate(x, DType::F32, true)
        .to_f32_vec()
        .unwrap_or_default()
}

fn num(d: &TensorData) -> Vec<f64> {
    d.to_f64_vec().unwrap_or_default()
}

/// Integer view for int targets: ints exactly (as i128 so u64 survives), floats truncated.
fn ints(d: &TensorData) -> Vec<i128> {
    match d {
        TensorData::U64(v) => v.iter().map(|&x| x as i128).collect(),
        _ if is_float_data(d) => num(d)
            .into_iter()
            .map(|x| if x.is_nan() { 0 } else { x.trunc() as i128 })
            .collect(),
        _ => d
            .to_i64_vec()
            .unwrap_or_default()
            .into_iter()
            .map(|x| x as i128)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    /// Measured in ONNX Runtime 1.32 (Cast to float16/bfloat16/float8, then to double): a
    /// double or an integer is rounded to f32 first, then to the narrow type.
    #[test]
    fn doubles_and_integers_reach_16_and_8_bits_through_f32_as_in_onnxruntime() {
        use super::*;
        let to = |x: Tensor, d: DType| cast_tensor(&x, d).to_f32_vec().unwrap();
        let doubles = || {
            Tensor::from_f64(
                vec![3],
                vec![2049.00001, 1.0 + 2f64.powi(-11) + 2f64.powi(-30), 1e6],
            )
        };
        assert_eq!(to(doubles(), DType::F16), [2048.0, 1.0, f32::INFINITY]);
        let big = (1i64 << 25) + 131_073;
        let ints = Tensor::from_i64(vec![2], vec![big, 2049]);
        assert_eq!(to(ints.clone(), DType::BF16), [33_554_432.0, 2048.0]);
        assert_eq!(to(ints, DType::F16), [f32::INFINITY, 2048.0]);
        let b = (1u64 << 25) + 131_073;
        let u = Tensor::new(vec![1], TensorData::U64(vec![b].into())).unwrap();
        assert_eq!(to(u, DType::BF16), [33_554_432.0]);
        // float8 the same way.
        let d = Tensor::from_f64(vec![1], vec![1.0625 + 2f64.powi(-27)]);
        assert_eq!(to(d, DType::F8E4M3FN), [1.0]);
    }

    use super::*;

    #[test]
    fn a_wide_integer_is_rounded_to_float_once() {
        let x = (1i64 << 60) + (1 << 36) + 1;
        let y = cast_tensor(&Tensor::from_i64(vec![2], vec![x, -x]), DType::F32);
        let want = ((1u64 << 60) + (1 << 37)) as f32;
        assert_eq!(y.as_f32().unwrap(), &[want, -want]);
        let u = Tensor::from_parts(vec![1], TensorData::U64(vec![x as u64].into()));
        assert_eq!(cast_tensor(&u, DType::F32).as_f32().unwrap(), &[want]);
        let i = Tensor::from_parts(
            vec![2],
            TensorData::I32(vec![16_777_217, -16_777_219].into()),
        );
        assert_eq!(
            cast_tensor(&i, DType::F32).as_f32().unwrap(),
            &[16_777_216.0, -16_777_220.0]
        );
    }

    #[test]
    fn float_to_int_truncates() {
        let t = Tensor::from_f32(vec![3], vec![1.7, -1.7, 300.0]);
        let c = cast_tensor(&t, DType::I64);
        assert_eq!(c.as_i64().unwrap(), &[1, -1, 300]);
    }

    #[test]
    fn float_to_f16_rounds_to_nearest_even() {
        let t = Tensor::from_f32(vec![2], vec![65504.0 + 1.5, 65520.0]);
        let c = cast_tensor(&t, DType::F16);
        let v = c.to_f32_vec().unwrap();
        assert_eq!(v[0], 65504.0);
        assert!(v[1].is_infinite());
    }

    #[test]
    fn to_bool_is_nonzero() {
        let t = Tensor::from_f32(vec![3], vec![0.0, -0.5, 2.0]);
        assert_eq!(
            cast_tensor(&t, DType::Bool).as_bool().unwrap(),
            &[false, true, true]
        );
    }

    #[test]
    fn saturate_attribute_picks_the_overflow_rule() {
        use crate::graph::{Attribute, Node};
        let node = |sat: Option<i64>| Node {
            name: "c".into(),
            op_type: "Cast".into(),
            domain: String::new(),
            inputs: vec!["x".into()],
            outputs: vec!["y".into()],
            attrs: [("to".to_string(), Attribute::Int(17))]
                .into_iter()
                .chain(sat.map(|s| ("saturate".to_string(), Attribute::Int(s))))
                .collect(),
            ..Default::default()
        };
        let x = Tensor::from_f32(vec![3], vec![1000.0, f32::NEG_INFINITY, 1.0625]);
        let run = |n: &Node, opset| {
            cast_op(&OpCtx::new(n, opset), &[Some(&x)]).unwrap()[0]
                .to_f32_vec()
                .unwrap()
        };
        assert_eq!(run(&node(None), 19), vec![448.0, -448.0, 1.0]);
        let v = run(&node(Some(0)), 19);
        assert!(v[0].is_nan() && v[1].is_nan() && v[2] == 1.0, "{v:?}");
        // Before opset 19 there is no saturate attribute: the default rule applies.
        assert_eq!(run(&node(Some(0)), 13), vec![448.0, -448.0, 1.0]);
    }

    #[test]
    fn bad_attributes_are_load_errors() {
        use crate::graph::Attribute;
        use crate::ops::attrs::testing::{assert_rejected, load_error};
        assert_rejected("Cast", &[], "to", "missing");
        assert_rejected(
            "Cast",
            &[("to", Attribute::Int(99))],
            "to",
            "99 is not an element type mixprec knows",
        );
        assert_rejected(
            "Cast",
            &[("to", Attribute::String("FLOAT".into()))],
            "to",
            "expected an int, got a string",
        );
        assert!(load_error("CastLike", &[], 19).is_none());
    }

    #[test]
    fn low_bit_casts() {
        let t = Tensor::from_f32(vec![6], vec![-9.0, 8.0, 7.9, f32::NAN, f32::INFINITY, -0.5]);
        let c = cast_tensor(&t, DType::I4);
        assert_eq!(c.to_i64_vec().unwrap(), vec![7, -8, 7, 0, 0, 0]);
        let c = cast_tensor(&t, DType::U4);
        assert_eq!(c.to_i64_vec().unwrap(), vec![7, 8, 7, 0, 0, 0]);
        let c = cast_tensor(&t, DType::F4E2M1).to_f32_vec().unwrap();
        assert_eq!(&c[..3], &[-6.0, 6.0, 6.0]);
        assert_eq!(c[5], -0.5);
        // Integers narrow by keeping the low bits; float8 to float16 is exact.
        let i = Tensor::from_i64(vec![2], vec![200, -56]);
        assert_eq!(
            cast_tensor(&i, DType::I4).to_i64_vec().unwrap(),
            vec![-8, -8]
        );
        let f8 = cast_tensor(&Tensor::from_f32(vec![1], vec![0.1]), DType::F8E5M2);
        let h = cast_tensor(&f8, DType::F16);
        assert_eq!(h.to_f32_vec().unwrap(), f8.to_f32_vec().unwrap());
        assert_eq!(f8.to_f32_vec().unwrap(), vec![0.09375]);
    }
}
