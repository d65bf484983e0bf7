//! com.microsoft QLinearAdd and QLinearMul: `C = quantize(op(dequantize(A), dequantize(B)))`
//! with NumPy broadcasting, computed as ONNX Runtime's x86 MLAS kernels compute it, so the
//! codes agree with ONNX Runtime exactly (tests/integration/contrib.rs):
//!
//! - QLinearAdd (mlas/lib/intrinsics/avx2/qladd_avx2.cpp): with `r_A = A_scale / C_scale`,
//!   `r_B = B_scale / C_scale` and `fixed = C_zp − (r_A·A_zp + r_B·B_zp)` in f32, a pair of
//!   codes gives `fma(a, r_A, fma(b, r_B, fixed))`. Where broadcasting makes one operand
//!   constant along the innermost axis, ONNX Runtime folds it into the fixed part first
//!   (`fixed + b·r_B`, a product and a sum; for A it swaps the operands, so the fixed part is
//!   `C_zp − (r_B·B_zp + r_A·A_zp)`).
//! - QLinearMul (mlas/lib/qlmul.cpp, SSE2): `(a − A_zp)·(b − B_zp)` exactly in i32, then
//!   `p · (A_scale·B_scale / C_scale) + C_zp` in f32.
//!
//! The float result becomes a code as `cvtps2dq` and the saturating packs make it
//! ([`CodeType::convert_saturate`]). Both ops are exact whatever the precision plan: they have
//! no float operand.

use super::super::shape::{broadcast, fact, FactsResult};
use super::super::util::{broadcast_binary, input};
use super::super::{InferCtx, InputRole, OpCtx, OpError, OpResult, Registry};
use super::qlinear::{codes, scale, zero_point, CodeType};
use super::MS_DOMAIN;
use crate::graph::fact::Fact;
use crate::tensor::Tensor;

pub fn register(r: &mut Registry) {
    use InputRole::{Data, Scale, ZeroPoint};
    const ROLES: &[InputRole] = &[
        Data, Scale, ZeroPoint, Data, Scale, ZeroPoint, Scale, ZeroPoint,
    ];
    r.add_in(MS_DOMAIN, "QLinearAdd", add)
        .roles(ROLES)
        .infer(binary_facts);
    r.add_in(MS_DOMAIN, "QLinearMul", mul)
        .roles(ROLES)
        .infer(binary_facts);
}

/// A and B broadcast; C has A's code type.
fn binary_facts(ctx: &InferCtx, ins: &[Option<&Fact>]) -> FactsResult {
    let (a, b) = (fact(ins, 0)?, fact(ins, 3)?);
    Ok(vec![Fact::new(
        a.dtype,
        broadcast(ctx, &[a.shape.as_ref(), b.shape.as_ref()])?,
    )])
}

/// The quantization parameters of QLinearAdd/QLinearMul, read and checked.
struct Operands<'a> {
    a: &'a Tensor,
    b: &'a Tensor,
    codes: CodeType,
    /// (scale, zero point) of A, B and C.
    qa: (f32, i32),
    qb: (f32, i32),
    qc: (f32, i32),
}

fn operands<'a>(inputs: &[Option<&'a Tensor>]) -> Result<Operands<'a>, OpError> {
    let (a, b) = (input(inputs, 0)?, input(inputs, 3)?);
    let ct = CodeType::of(a, "A")?;
    if b.dtype() != a.dtype() {
        return Err(OpError(format!(
            "A is {} but B is {}: both operands must have one code type",
            a.dtype(),
            b.dtype()
        )));
    }
    Ok(Operands {
        a,
        b,
        codes: ct,
        qa: (
            scale(inputs, 1, "A_scale")?,
            zero_point(inputs, 2, ct, "A_zero_point")?,
        ),
        qb: (
            scale(inputs, 4, "B_scale")?,
            zero_point(inputs, 5, ct, "B_zero_point")?,
        ),
        qc: (
            scale(inputs, 6, "C_scale")?,
            zero_point(inputs, 7, ct, "C_zero_point")?,
        ),
    })
}

/// Which of ONNX Runtime's three broadcast loops computes an output: its broadcaster walks
/// spans along the innermost axis where the output is longer than 1, and an operand of
/// length 1 on that axis is a scalar for the whole span.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Span {
    Both,
    ScalarA,
    ScalarB,
}

fn span(a: &[usize], b: &[usize], out: &[usize]) -> Span {
    let dim = |s: &[usize], i: usize| {
        let off = out.len() - s.len();
        if i < off {
            1
        } else {
            s[i - off]
        }
    };
    match (0..out.len()).rev().find(|&i| out[i] > 1) {
        None => Span::ScalarA,
        Some(i) if dim(a, i) == 1 => Span::ScalarA,
        Some(i) if dim(b, i) == 1 => Span::ScalarB,
        Some(_) => Span::Both,
    }
}

fn add(_: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let o = operands(inputs)?;
    let ct = o.codes;
    let ((sa, za), (sb, zb), (sc, zc)) = (o.qa, o.qb, o.qc);
    let (ca, cb) = (codes(o.a), codes(o.b));
    let (ra, rb) = (sa / sc, sb / sc);
    let fixed =
        |(r1, z1): (f32, i32), (r2, z2): (f32, i32)| zc as f32 - (r1 * z1 as f32 + r2 * z2 as f32);
    let out_shape = super::super::util::broadcast_shapes(&[o.a.shape(), o.b.shape()])?;
    let span_kind = span(o.a.shape(), o.b.shape(), &out_shape);
    let (shape, out) = match span_kind {
        Span::Both => {
            let f = fixed((ra, za), (rb, zb));
            broadcast_binary(&ca, o.a.shape(), &cb, o.b.shape(), |x, y| {
                let t = (y as f32).mul_add(rb, f);
                ct.convert_saturate((x as f32).mul_add(ra, t))
            })?
        }
        // One operand constant over the span: ORT's scalar loop folds it into the fixed part
        // by a product and a sum (and swaps the operands when it is A).
        Span::ScalarB | Span::ScalarA => {
            let (spanning, constant) = if span_kind == Span::ScalarB {
                ((ra, za), (rb, zb))
            } else {
                ((rb, zb), (ra, za))
            };
            let f = fixed(spanning, constant);
            let code = |s: i32, c: i32| {
                let t = f + c as f32 * constant.0;
                ct.convert_saturate((s as f32).mul_add(spanning.0, t))
            };
            broadcast_binary(&ca, o.a.shape(), &cb, o.b.shape(), |x, y| {
                if span_kind == Span::ScalarB {
                    code(x, y)
                } else {
                    code(y, x)
                }
            })?
        }
    };
    Ok(vec![ct.tensor(shape, out)])
}

fn mul(_: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let o = operands(inputs)?;
    let ct = o.codes;
    let ((sa, za), (sb, zb), (sc, zc)) = (o.qa, o.qb, o.qc);
    let ratio = sa * sb / sc;
    let (ca, cb) = (codes(o.a), codes(o.b));
    let (shape, out) = broadcast_binary(&ca, o.a.shape(), &cb, o.b.shape(), |x, y| {
        let p = (x - za) * (y - zb);
        ct.convert_saturate(p as f32 * ratio + zc as f32)
    })?;
    Ok(vec![ct.tensor(shape, out)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorData;

    fn u8s(shape: Vec<usize>, v: Vec<u8>) -> Tensor {
        Tensor::from_parts(shape, TensorData::U8(v.into()))
    }

    fn run(k: fn(&OpCtx, &[Option<&Tensor>]) -> OpResult, a: &Tensor, b: &Tensor) -> Vec<i64> {
        let node = crate::graph::testing::node_with("QLinearAdd", &[]);
        let (sa, za) = (Tensor::from_f32(vec![], vec![0.1]), u8s(vec![], vec![10]));
        let (sb, zb) = (Tensor::from_f32(vec![], vec![0.2]), u8s(vec![], vec![20]));
        let (sc, zc) = (Tensor::from_f32(vec![], vec![0.25]), u8s(vec![], vec![5]));
        let ins = [a, &sa, &za, b, &sb, &zb, &sc, &zc].map(Some);
        k(&OpCtx::new(&node, 1), &ins).unwrap()[0]
            .to_i64_vec()
            .unwrap()
    }

    #[test]
    fn add_and_mul_requantize_to_the_output_grid() {
        let a = u8s(vec![2, 2], vec![10, 20, 0, 255]);
        let b = u8s(vec![2, 2], vec![20, 30, 0, 255]);
        // (0.1·(a − 10) + 0.2·(b − 20)) / 0.25 + 5: 5, 17, -1 → 0, 5 + 98 + 188 → 255.
        assert_eq!(run(add, &a, &b), vec![5, 17, 0, 255]);
        // 0.02·(a − 10)(b − 20) / 0.25 + 5: 5, 13, 5 + 0.08·200 = 21, 0.08·245·235 → 255.
        assert_eq!(run(mul, &a, &b), vec![5, 13, 21, 255]);
        // Broadcasting a scalar B and a row of A.
        let row = u8s(vec![2], vec![30, 40]);
        assert_eq!(run(add, &a, &u8s(vec![], vec![20])), vec![5, 9, 1, 103]);
        assert_eq!(run(add, &row, &b), vec![13, 25, 0, 205]);
    }

    #[test]
    fn the_broadcast_loop_is_chosen_by_the_innermost_long_axis() {
        assert_eq!(span(&[2, 3], &[2, 3], &[2, 3]), Span::Both);
        assert_eq!(span(&[2, 3], &[3], &[2, 3]), Span::Both);
        assert_eq!(span(&[2, 3], &[2, 1], &[2, 3]), Span::ScalarB);
        assert_eq!(span(&[], &[4], &[4]), Span::ScalarA);
        assert_eq!(span(&[2, 1], &[2, 1], &[2, 1]), Span::Both);
        assert_eq!(span(&[1], &[1], &[1]), Span::ScalarA);
    }

    #[test]
    fn mismatched_code_types_are_errors() {
        let node = crate::graph::testing::node_with("QLinearMul", &[]);
        let a = u8s(vec![1], vec![1]);
        let b = Tensor::from_parts(vec![1], TensorData::I8(vec![1i8].into()));
        let s = Tensor::from_f32(vec![], vec![1.0]);
        let ins = [
            Some(&a),
            Some(&s),
            None,
            Some(&b),
            Some(&s),
            None,
            Some(&s),
            None,
        ];
        let e = mul(&OpCtx::new(&node, 1), &ins).unwrap_err();
        assert!(e.0.contains("one code type"), "{e}");
    }
}
