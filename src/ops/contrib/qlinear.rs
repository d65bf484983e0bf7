//! com.microsoft QLinearSigmoid and QLinearLeakyRelu, two of the QOperator-format ops ONNX
//! Runtime's `quantize_static` writes. As ONNX Runtime's CPU kernel (contrib_ops/cpu/
//! quantization/qlinear_lookup_table.cc) they map each of the 256 input codes through a table:
//! the code is dequantized (`x_scale · (q − x_zero_point)` in f32), the activation applied,
//! the result quantized as MLAS does (`x / y_scale` clamped to the code range less the zero
//! point — a NaN becomes the lowest code — rounded half to even, plus the zero point). The
//! result is exact whatever the precision plan: the op has no float operand.

use super::super::attrs::{boxed, Attrs};
use super::super::shape::{fact, FactsResult};
use super::super::util::{input, opt_input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::MS_DOMAIN;
use crate::graph::fact::Fact;
use crate::tensor::{Tensor, TensorData};

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Scale, ZeroPoint};
    r.add_in(MS_DOMAIN, "QLinearSigmoid", |_, i| {
        lookup(i, super::super::elementwise::sigmoid)
    })
    .roles(&[Data, Scale, ZeroPoint, Scale, ZeroPoint])
    .infer(same_codes);
    r.add_in(MS_DOMAIN, "QLinearLeakyRelu", leaky_relu)
        .parse(|n, _| boxed(Attrs::new(n).float_or("alpha", 0.01)))
        .roles(&[Data, Scale, ZeroPoint, Scale, ZeroPoint])
        .infer(same_codes);
}

fn same_codes(_: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let x = fact(ins, 0)?;
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

fn leaky_relu(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let alpha = *ctx.attrs::<f32>()?;
    let f = move |x: f32| if x >= 0.0 { x } else { alpha * x };
    lookup_with(inputs, &f)
}

fn lookup(inputs: &[Option<&Tensor>], f: fn(f32) -> f32) -> OpResult {
    lookup_with(inputs, &f)
}

/// A scalar f32 scale, or an error naming it.
fn scale(inputs: &[Option<&Tensor>], i: usize, what: &str) -> Result<f32, OpError> {
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

/// A scalar zero point of the codes' type (0 when omitted).
fn zero_point(
    inputs: &[Option<&Tensor>],
    i: usize,
    x: &Tensor,
    what: &str,
) -> Result<i32, OpError> {
    let Some(t) = opt_input(inputs, i) else {
        return Ok(0);
    };
    if t.dtype() != x.dtype() || t.len() != 1 {
        return Err(OpError(format!(
            "{what} must be one {} value, got {} {:?}",
            x.dtype(),
            t.dtype(),
            t.shape()
        )));
    }
    Ok(t.to_i64_vec().expect("integer")[0] as i32)
}

fn lookup_with(inputs: &[Option<&Tensor>], f: &dyn Fn(f32) -> f32) -> OpResult {
    let x = input(inputs, 0)?;
    let (lo, hi, offset) = match x.data() {
        TensorData::U8(_) => (0i32, 255i32, 0i32),
        TensorData::I8(_) => (-128, 127, -128),
        _ => {
            return Err(OpError(format!(
                "X has dtype {}, expected uint8 or int8",
                x.dtype()
            )))
        }
    };
    let (xs, ys) = (scale(inputs, 1, "X_scale")?, scale(inputs, 3, "Y_scale")?);
    let (xz, yz) = (
        zero_point(inputs, 2, x, "X_zero_point")?,
        zero_point(inputs, 4, x, "Y_zero_point")?,
    );
    // table[code - offset] for every code lo..=hi.
    let table: Vec<i32> = (lo..=hi)
        .map(|q| {
            let y = f(xs * (q - xz) as f32) / ys;
            // MLAS: max/min against the range less the zero point (a NaN takes the bound).
            let (min, max) = ((lo - yz) as f32, (hi - yz) as f32);
            let y = if y.is_nan() || y < min {
                min
            } else {
                y.min(max)
            };
            (y.round_ties_even() as i32 + yz).clamp(lo, hi)
        })
        .collect();
    let codes = x.to_i64_vec().expect("integer");
    let out: Vec<i32> = codes
        .iter()
        .map(|&q| table[(q as i32 - offset) as usize])
        .collect();
    let data = match x.data() {
        TensorData::U8(_) => {
            TensorData::U8(out.iter().map(|&v| v as u8).collect::<Vec<_>>().into())
        }
        _ => TensorData::I8(out.iter().map(|&v| v as i8).collect::<Vec<_>>().into()),
    };
    Ok(vec![Tensor::from_parts(x.shape().to_vec(), data)])
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
        let y = lookup(&ins, super::super::super::elementwise::sigmoid).unwrap();
        // sigmoid(-4)·256 = 4.6 → 5; sigmoid(0)·256 = 128; sigmoid(3.97)·256 = 251.3 → 251.
        assert_eq!(y[0].to_i64_vec().unwrap(), vec![5, 128, 251]);
        let bad = Tensor::from_f32(vec![1], vec![0.0]);
        let e = lookup(&[Some(&bad), Some(&s), None, Some(&ys), None], |v| v).unwrap_err();
        assert!(e.0.contains("uint8 or int8"), "{e}");
    }
}
