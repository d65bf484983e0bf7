//! Integer matrix products of ONNX Runtime's QOperator-format models: MatMulInteger and
//! QLinearMatMul. Products are exact: operands minus zero points are multiplied and summed in
//! i64 (the i32 accumulator of real kernels, without its overflow).

use super::int_gemm::{PackedIntB, ProductOut, RowsOfA};
use super::matmul::matmul;
use super::util::{input, opt_input};
use super::{OpCtx, OpError, OpResult, Registry};
use crate::tensor::{DType, Tensor, TensorData};
use half::{bf16, f16};

pub fn register(r: &mut Registry) {
    r.add("MatMulInteger", matmul_integer);
    r.add("QLinearMatMul", qlinear_matmul);
    use super::InputRole::{Data, Scale, ZeroPoint};
    r.def_mut("MatMulInteger")
        .roles(&[Data, Data, ZeroPoint, ZeroPoint])
        .scaled(matmul_integer_scaled)
        // The chain after the scaled product's Mul (`exec/epilogue.rs`): GELU's tanh form
        // after a dynamically quantized projection.
        .epilogue(super::matmul::matmul_epilogue_shape)
        .infer(|ctx, ins| {
            let mut out = super::shape::infer_as("MatMul", ctx, ins, [0, 1])?.remove(0);
            out.dtype = Some(DType::I32);
            Ok(vec![out])
        });
    r.def_mut("QLinearMatMul")
        .roles(&[
            Data, Scale, ZeroPoint, Data, Scale, ZeroPoint, Scale, ZeroPoint,
        ])
        .infer(|ctx, ins| {
            let mut out = super::shape::infer_as("MatMul", ctx, ins, [0, 3])?.remove(0);
            out.dtype = super::shape::opt_fact(ins, 7).and_then(|f| f.dtype);
            Ok(vec![out])
        });
}

/// Which operand a zero point or scale belongs to: A's parameters may be per row (axis -2),
/// B's per column (axis -1).
#[derive(Clone, Copy)]
enum Side {
    A,
    B,
}

/// For every element of `t`, the index of its per-tensor / per-row / per-column parameter
/// (`n` values), or an error naming the shape mismatch.
fn param_index(t: &Tensor, n: usize, side: Side, what: &str) -> Result<Vec<usize>, OpError> {
    if n == 1 {
        return Ok(vec![0; t.len()]);
    }
    let sh = t.shape();
    let (len, inner) = match side {
        Side::A if sh.len() >= 2 => (sh[sh.len() - 2], sh[sh.len() - 1]),
        Side::B if !sh.is_empty() => (sh[sh.len() - 1], 1),
        _ => (1, 1),
    };
    if len != n {
        let kind = match side {
            Side::A => "per-row: the number of rows of A",
            Side::B => "per-column: the number of columns of B",
        };
        return Err(OpError(format!(
            "{what} has {n} values but must have 1 or {len} ({kind}, shape {sh:?})"
        )));
    }
    Ok((0..t.len()).map(|i| (i / inner) % len).collect())
}

/// `t - zero_point` as i32 values (uint8/int8 codes and their zero points differ by at most
/// 255), checking dtypes (uint8/int8, zero point of t's type) and the zero point's shape.
fn shifted_codes(
    t: &Tensor,
    zp: Option<&Tensor>,
    side: Side,
    what: &str,
) -> Result<Vec<i32>, OpError> {
    let (mut v, zv) = super::integer::codes_and_zero_point(t, zp, what)?;
    if let (Some(z), Some(zv)) = (zp, zv) {
        if z.rank() > 1 {
            return Err(OpError(format!(
                "the zero point of {what} has shape {:?}, expected a scalar or a 1-D tensor",
                z.shape()
            )));
        }
        match zv.as_slice() {
            [] => {}
            [z0] => v.iter_mut().for_each(|x| *x -= z0),
            _ => {
                let idx = param_index(t, zv.len(), side, &format!("the zero point of {what}"))?;
                v.iter_mut().zip(idx).for_each(|(x, i)| *x -= zv[i]);
            }
        }
    }
    Ok(v)
}

/// `t - zero_point` as an i64 tensor (see [`shifted_codes`]).
fn shifted(t: &Tensor, zp: Option<&Tensor>, side: Side, what: &str) -> Result<Tensor, OpError> {
    let v = shifted_codes(t, zp, side, what)?;
    Ok(Tensor::from_i64(
        t.shape().to_vec(),
        v.into_iter().map(i64::from).collect(),
    ))
}

fn matmul_integer(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let (c, shape) = integer_product(ctx, inputs)?;
    Ok(vec![Tensor::from_parts(shape, TensorData::I32(c.into()))])
}

/// MatMulInteger's output converted to float32 and multiplied by `scale` ([`super::ScaledFn`]):
/// a single value or one per column, as ONNX Runtime's MatMulIntegerToFloat takes it.
fn matmul_integer_scaled(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    scale: &Tensor,
    rounding: super::ScaledRounding,
) -> Result<Option<Tensor>, OpError> {
    let (a_t, b_t) = (input(inputs, 0)?, input(inputs, 1)?);
    // A 1-D operand drops an axis of the output: left to the layers one by one.
    let ([_, .., n], true) = (b_t.shape(), a_t.rank() >= 2) else {
        return Ok(None);
    };
    let (n, rank, sh) = (*n, a_t.rank().max(b_t.rank()), scale.shape());
    let Some(s) = scale.as_f32() else {
        return Ok(None);
    };
    // Broadcast against the output, the scale must leave its shape as it is.
    let leading_ones = sh.iter().rev().skip(1).all(|&d| d == 1);
    if sh.len() > rank
        || !leading_ones
        || !matches!(sh.last(), None | Some(1)) && sh.last() != Some(&n)
    {
        return Ok(None);
    }
    if let Some((packed, m, shape)) = kept_weight(ctx, inputs)? {
        // The product writes the float32 values from its tiles, scaled and rounded as the Mul
        // rounds them, each tile as it is stored (`int_gemm::scale_tile`).
        let a = rows_of_a(input(inputs, 0)?, opt_input(inputs, 2))?;
        // Not zeroed first: the product writes every value of its m×n output.
        let mut y: Vec<f32> = Vec::with_capacity(m * n);
        // SAFETY: written whole by the product (each task its panels' columns of every row)
        // before `set_len` and before anything reads it.
        let out = unsafe { super::util::assume_written(&mut y.spare_capacity_mut()[..m * n]) };
        // Tests poison it: a value the product misses shows up as a NaN.
        #[cfg(test)]
        out.fill(f32::NAN);
        let out = ProductOut::Scaled {
            out,
            scale: s,
            rounding,
        };
        packed.product(m, a.rows(), out);
        // SAFETY: all m·n values are written (above).
        unsafe { y.set_len(m * n) };
        let mut y = Tensor::from_parts(shape, TensorData::F32(y.into()));
        super::matmul::apply_epilogue_by_rows(ctx, &mut y);
        return Ok(Some(y));
    }
    let (c, shape) = integer_product(ctx, inputs)?;
    let mut y: Vec<f32> = c.into_iter().map(|v| v as f32).collect();
    for row in y.chunks_mut(n.max(1)) {
        super::int_gemm::scale_in_place(row, s, 0, rounding);
    }
    let mut y = Tensor::from_parts(shape, TensorData::F32(y.into()));
    super::matmul::apply_epilogue_by_rows(ctx, &mut y);
    Ok(Some(y))
}

/// A's rows for [`PackedIntB::product`]: uint8 codes with one zero point as they are, any
/// other codes minus their zero points (checked as [`shifted_codes`] checks them).
enum ProductRows<'a> {
    Codes(&'a [u8], i32),
    Shifted(Vec<i32>),
}

impl ProductRows<'_> {
    fn rows(&self) -> RowsOfA<'_> {
        match self {
            ProductRows::Codes(codes, zero_point) => RowsOfA::Codes {
                codes,
                zero_point: *zero_point,
            },
            ProductRows::Shifted(a) => RowsOfA::Shifted(a),
        }
    }
}

fn rows_of_a<'a>(a_t: &'a Tensor, zp: Option<&Tensor>) -> Result<ProductRows<'a>, OpError> {
    if let TensorData::U8(codes) = a_t.data() {
        let zero_point = match zp.map(|z| (z.rank(), z.data())) {
            None => Some(0),
            Some((0 | 1, TensorData::U8(z))) if z.len() == 1 => Some(i32::from(z[0])),
            _ => None,
        };
        if let Some(zero_point) = zero_point {
            return Ok(ProductRows::Codes(codes, zero_point));
        }
    }
    shifted_codes(a_t, zp, Side::A, "A").map(ProductRows::Shifted)
}

/// A kept weight's panels, the product's row count m and its output shape.
type KeptProduct = (std::sync::Arc<PackedIntB>, usize, Vec<usize>);

/// A constant 2-D B (a weight, with a constant zero point), packed once for the integer
/// kernels (ops/int_gemm.rs), with the product's row count and shape; None for any other B.
fn kept_weight(ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> Result<Option<KeptProduct>, OpError> {
    let (a_t, b_t) = (input(inputs, 0)?, input(inputs, 1)?);
    let keep = ctx
        .prepacked(1)
        .filter(|_| opt_input(inputs, 3).is_none() || ctx.prepacked(3).is_some());
    let (Some(kept), [k, n], [.., ka]) = (keep, b_t.shape(), a_t.shape()) else {
        return Ok(None);
    };
    let (k, n) = (*k, *n);
    if *ka != k {
        return Ok(None);
    }
    let packed = kept.get_or_try_insert(super::prepacked::tag::INTEGER_B, || {
        shifted_codes(b_t, opt_input(inputs, 3), Side::B, "B")
            .map(|codes| PackedIntB::new(&codes, k, n))
    })?;
    let m: usize = a_t.shape()[..a_t.rank() - 1].iter().product();
    let mut shape = a_t.shape()[..a_t.rank() - 1].to_vec();
    shape.push(n);
    Ok(Some((packed, m, shape)))
}

/// MatMulInteger's exact product and its shape.
fn integer_product(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
) -> Result<(Vec<i32>, Vec<usize>), OpError> {
    let (a_t, b_t) = (input(inputs, 0)?, input(inputs, 1)?);
    if let Some((packed, m, shape)) = kept_weight(ctx, inputs)? {
        let a = rows_of_a(a_t, opt_input(inputs, 2))?;
        let mut c = vec![0i32; m * shape[shape.len() - 1]];
        packed.product(m, a.rows(), ProductOut::Sums(&mut c));
        return Ok((c, shape));
    }
    let a = shifted_codes(a_t, opt_input(inputs, 2), Side::A, "A")?;
    let b = shifted_codes(b_t, opt_input(inputs, 3), Side::B, "B")?;
    // Exact i32 accumulation whatever the layer's accumulator: the kernel ConvInteger and the
    // fused Q/DQ kernels share (ops/integer.rs).
    super::integer::imatmul(&a, a_t.shape(), &b, b_t.shape())
}

/// A float scale tensor as f32 values, rejecting other dtypes.
fn scale_values(t: &Tensor, what: &str) -> Result<Vec<f32>, OpError> {
    if !matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(OpError(format!(
            "{what} has dtype {}, expected float32, float16 or bfloat16",
            t.dtype()
        )));
    }
    if t.rank() > 1 {
        return Err(OpError(format!(
            "{what} has shape {:?}, expected a scalar or a 1-D tensor",
            t.shape()
        )));
    }
    Ok(t.to_f32_vec().expect("float"))
}

/// Rounds an f32 to the scale's type (the reference computes scale products in that type).
fn round_to(d: DType, x: f32) -> f32 {
    match d {
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

fn qlinear_matmul(_ctx: &OpCtx, inputs: &[Option<&Tensor>]) -> OpResult {
    let a_t = input(inputs, 0)?;
    let b_t = input(inputs, 3)?;
    let a = shifted(a_t, opt_input(inputs, 2), Side::A, "A")?;
    let b = shifted(b_t, opt_input(inputs, 5), Side::B, "B")?;
    // Integer products are exact whatever the layer's accumulator (f32 holds them exactly
    // up to 2^24).
    let c = matmul(crate::numeric::Accumulator::F32, &a, &b)?;
    let cv = c.as_i64().expect("integer product");
    let (sa_t, sb_t, sy_t) = (input(inputs, 1)?, input(inputs, 4)?, input(inputs, 6)?);
    let sa = scale_values(sa_t, "a_scale")?;
    let sb = scale_values(sb_t, "b_scale")?;
    let sy = scale_values(sy_t, "y_scale")?;
    if sy.len() != 1 {
        return Err(OpError(format!(
            "y_scale has {} values, expected one (per-tensor)",
            sy.len()
        )));
    }
    let yzp = opt_input(inputs, 7);
    let out_dtype = yzp.map_or(a_t.dtype(), |z| z.dtype());
    let (qmin, qmax) = match out_dtype {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        other => {
            return Err(OpError(format!(
                "y_zero_point has dtype {other}, expected uint8 or int8"
            )))
        }
    };
    let z = match yzp {
        Some(z) if z.len() == 1 => z.to_f64_vec().expect("integer")[0],
        Some(z) => {
            return Err(OpError(format!(
                "y_zero_point has {} values, expected one (per-tensor)",
                z.len()
            )))
        }
        None => 0.0,
    };
    // Per-row A scales index rows of the output, per-column B scales its columns.
    let ia = param_index(&c, sa.len(), Side::A, "a_scale")?;
    let ib = param_index(&c, sb.len(), Side::B, "b_scale")?;
    let d = if sa_t.dtype() == sb_t.dtype() && sb_t.dtype() == sy_t.dtype() {
        sa_t.dtype()
    } else {
        DType::F32
    };
    let q: Vec<f64> = cv
        .iter()
        .enumerate()
        .map(|(i, &ci)| {
            let f = round_to(d, round_to(d, sa[ia[i]] * sb[ib[i]]) / sy[0]);
            (ci as f64 * f as f64 + z)
                .round_ties_even()
                .clamp(qmin, qmax)
        })
        .collect();
    let data = match out_dtype {
        DType::U8 => TensorData::U8(q.iter().map(|&v| v as u8).collect()),
        _ => TensorData::I8(q.iter().map(|&v| v as i8).collect()),
    };
    Ok(vec![Tensor::from_parts(c.shape().to_vec(), data)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Node;

    fn ctx_run(
        f: fn(&OpCtx, &[Option<&Tensor>]) -> OpResult,
        inputs: &[Option<&Tensor>],
    ) -> OpResult {
        let n = Node {
            name: "n".into(),
            op_type: "Q".into(),
            domain: String::new(),
            inputs: vec![],
            outputs: vec!["y".into()],
            attrs: Default::default(),
            ..Default::default()
        };
        f(&OpCtx::new(&n, 21), inputs)
    }

    fn u8t(shape: &[usize], v: &[u8]) -> Tensor {
        Tensor::from_parts(shape.to_vec(), TensorData::U8(v.to_vec().into()))
    }

    #[test]
    fn matmul_integer_per_row_and_column_zero_points() {
        let a = u8t(&[2, 2], &[1, 2, 3, 4]);
        let b = u8t(&[2, 2], &[5, 6, 7, 8]);
        let za = u8t(&[2], &[1, 3]);
        let zb = u8t(&[2], &[5, 0]);
        let y = ctx_run(matmul_integer, &[Some(&a), Some(&b), Some(&za), Some(&zb)])
            .unwrap()
            .remove(0);
        // A - za = [[0, 1], [0, 1]], B - zb = [[0, 6], [2, 8]].
        assert_eq!(y.data(), &TensorData::I32(vec![2, 8, 2, 8].into()));
        let bad = u8t(&[3], &[0, 0, 0]);
        let e = ctx_run(matmul_integer, &[Some(&a), Some(&b), Some(&bad)]).unwrap_err();
        assert!(e.0.contains("rows of A"), "{e}");
        let i8z = Tensor::from_parts(vec![], TensorData::I8(vec![0].into()));
        let e = ctx_run(matmul_integer, &[Some(&a), Some(&b), Some(&i8z)]).unwrap_err();
        assert!(e.0.contains("must match"), "{e}");
    }

    /// A constant B is packed once and kept; the product equals the i64 product of the
    /// shifted codes wrapped to i32, small sums and sums past 2^24 (where an f32 product
    /// would round) alike.
    #[test]
    fn matmul_integer_with_a_kept_weight_equals_the_exact_product() {
        use crate::ops::prepacked::Prepacked;
        let n = Node {
            name: "mmi".into(),
            op_type: "MatMulInteger".into(),
            inputs: vec!["a".into(), "b".into(), "az".into(), "bz".into()],
            outputs: vec!["y".into()],
            ..Default::default()
        };
        let mut seed = 7u64;
        let mut code = |lo: u8, hi: u8| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + ((seed >> 33) % (u64::from(hi - lo) + 1)) as u8
        };
        // (rows, k, n, A's code range, whether the sums stay below 2^24): the last has 600
        // products of 255·255, whose sums pass it.
        for (m, k, cols, (lo, hi), small) in [
            (3, 40, 20, (100, 140), true),
            (2, 64, 16500, (0, 255), true),
            (2, 600, 17, (255, 255), false),
        ] {
            let kept: Vec<Prepacked> = (0..4).map(|_| Prepacked::default()).collect();
            let kept: Vec<Option<&Prepacked>> = kept.iter().map(Some).collect();
            let mut ctx = OpCtx::new(&n, 21);
            ctx.prepacked = &kept;
            let a = u8t(
                &[1, m, k],
                &(0..m * k).map(|_| code(lo, hi)).collect::<Vec<_>>(),
            );
            let b = Tensor::from_parts(
                vec![k, cols],
                TensorData::I8(
                    (0..k * cols)
                        .map(|i| {
                            if small {
                                code(0, 40) as i8 - 20
                            } else {
                                -128 + (i % 2) as i8
                            }
                        })
                        .collect::<Vec<_>>()
                        .into(),
                ),
            );
            let az = u8t(&[], &[if small { 120 } else { 0 }]);
            let bz = Tensor::from_parts(
                vec![cols],
                TensorData::I8((0..cols).map(|j| (j % 3) as i8).collect::<Vec<_>>().into()),
            );
            let av = shifted_codes(&a, Some(&az), Side::A, "A").unwrap();
            let bv = shifted_codes(&b, Some(&bz), Side::B, "B").unwrap();
            let want: Vec<i32> = (0..m * cols)
                .map(|o| {
                    let (i, j) = (o / cols, o % cols);
                    (0..k)
                        .map(|p| i64::from(av[i * k + p]) * i64::from(bv[p * cols + j]))
                        .sum::<i64>() as i32
                })
                .collect();
            for run in 0..2 {
                let y = matmul_integer(&ctx, &[Some(&a), Some(&b), Some(&az), Some(&bz)])
                    .unwrap()
                    .remove(0);
                assert_eq!(y.shape(), &[1, m, cols]);
                assert_eq!(
                    y.data(),
                    &TensorData::I32(want.clone().into()),
                    "{m}x{k}x{cols} run {run}"
                );
            }
            assert_eq!(kept[1].unwrap().len(), 1, "B is kept packed");
        }
    }

    #[test]
    fn qlinear_matmul_requantizes_half_even_and_saturates() {
        let a = u8t(&[1, 2], &[1, 2]);
        let b = u8t(&[2, 2], &[1, 100, 0, 100]);
        let s = Tensor::scalar_f32(1.0);
        let sy = Tensor::scalar_f32(2.0);
        let zy = u8t(&[], &[0]);
        let z0 = u8t(&[], &[0]);
        let y = ctx_run(
            qlinear_matmul,
            &[
                Some(&a),
                Some(&s),
                Some(&z0),
                Some(&b),
                Some(&s),
                Some(&z0),
                Some(&sy),
                Some(&zy),
            ],
        )
        .unwrap()
        .remove(0);
        // C = [1, 300] / 2 = [0.5, 150] -> [0, 150].
        assert_eq!(y.data(), &TensorData::U8(vec![0, 150].into()));
        let sy = Tensor::scalar_f32(1.0);
        let y = ctx_run(
            qlinear_matmul,
            &[
                Some(&a),
                Some(&s),
                Some(&z0),
                Some(&b),
                Some(&s),
                Some(&z0),
                Some(&sy),
                Some(&zy),
            ],
        )
        .unwrap()
        .remove(0);
        assert_eq!(y.data(), &TensorData::U8(vec![1, 255].into()));
    }
}
