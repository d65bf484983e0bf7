//! com.microsoft DynamicQuantizeLSTM, the LSTM ONNX Runtime's `quantize_dynamic` writes: W
//! `[num_directions, input_size, 4*hidden_size]` and R `[num_directions, hidden_size,
//! 4*hidden_size]` are uint8/int8 codes with per-direction or per-column scales and zero points
//! (inputs 8–11); the rest is LSTM (`ops/recurrent.rs` runs it, with these weights).
//!
//! Each product with a quantized weight runs as ONNX Runtime's CPU kernel runs it
//! (core/providers/cpu/rnn/rnn_helpers.cc `ComputeGemm`, core/util/qmath.h): the float operand
//! — X for all steps a sequence reaches at once, then the previous hidden state at every step —
//! is quantized to uint8 with its own range (min and max widened to include 0, scale
//! `(max − min)/255`, zero point `round_half_even(clamp(−min/scale, 0, 255))`, MLAS's
//! quantization), multiplied with the codes exactly in i32, and scaled by `scale · W_scale`
//! (per column when per-channel). The gates then run in f32 as in LSTM.

use super::super::util::{input, opt_input};
use super::super::{InputRole, OpError, Registry};
use super::qlinear::{codes, CodeType};
use super::MS_DOMAIN;
use crate::ops::prepacked::tag::QUANTIZED_WEIGHTS;
use crate::ops::recurrent::{QuantSet, QuantWeights, WeightSet};
use crate::ops::OpCtx;
use crate::tensor::{DType, Tensor};

pub fn register(r: &mut Registry) {
    use super::super::attrs::boxed;
    use super::super::recurrent::{recurrent_facts, recurrent_flops, run, RecurrentAttrs};
    use InputRole::{Bias, Data, Param, Scale, ZeroPoint};
    r.add_in(MS_DOMAIN, "DynamicQuantizeLSTM", run)
        .parse(|n, o| boxed(RecurrentAttrs::parse(n, o)))
        .infer(recurrent_facts)
        .flops(recurrent_flops)
        .roles(&[
            Data, Data, Data, Bias, Param, Data, Data, Data, Scale, ZeroPoint, Scale, ZeroPoint,
        ]);
}

/// W (`data` 1, parameters 8 and 9) or R (2; 10 and 11) of a DynamicQuantizeLSTM: its codes
/// minus their zero point and its scales, checked as ONNX Runtime checks them; derived once
/// and kept with the weight where the codes, scales and zero points are all constants.
pub(crate) fn quantized_weights(
    ctx: &OpCtx,
    inputs: &[Option<&Tensor>],
    data: usize,
    what: &str,
    want: [usize; 3],
    k_name: &str,
) -> Result<WeightSet<'static>, OpError> {
    let t = input(inputs, data)?;
    // Checked on every run: the expected shape follows X's.
    if t.shape() != want {
        return Err(OpError(format!(
            "{what} has shape {:?}, expected {want:?} ([num_directions, {k_name}, \
             4*hidden_size])",
            t.shape()
        )));
    }
    let (si, zi) = if data == 1 { (8, 9) } else { (10, 11) };
    let keep = ctx.prepacked(data).filter(|_| {
        ctx.prepacked(si).is_some()
            && (opt_input(inputs, zi).is_none() || ctx.prepacked(zi).is_some())
    });
    let make = || quantized_set(inputs, data, what, want);
    Ok(WeightSet::Quant(match keep {
        Some(kept) => kept.get_or_try_insert(QUANTIZED_WEIGHTS, make)?,
        None => std::sync::Arc::new(make()?),
    }))
}

/// [`quantized_weights`]' set, made from the inputs.
fn quantized_set(
    inputs: &[Option<&Tensor>],
    data: usize,
    what: &str,
    want: [usize; 3],
) -> Result<QuantSet, OpError> {
    let t = input(inputs, data)?;
    let ct = CodeType::of(t, what)?;
    let [dirs, k, gh] = want;
    let (si, zi) = if data == 1 { (8, 9) } else { (10, 11) };
    let (sname, zname) = (format!("{what}_scale"), format!("{what}_zero_point"));
    let scale_t = input(inputs, si)?;
    let per_column = match scale_t.shape() {
        [d] if *d == dirs => false,
        [d, c] if *d == dirs && *c == gh => true,
        s => {
            return Err(OpError(format!(
                "{sname} has shape {s:?}, expected [{dirs}] (per tensor) or [{dirs}, {gh}] \
                 (per column)"
            )))
        }
    };
    let scales = scale_t
        .as_f32()
        .ok_or_else(|| {
            OpError(format!(
                "{sname} has dtype {}, expected float32",
                scale_t.dtype()
            ))
        })?
        .to_vec();
    let n_params = scales.len() / dirs;
    let zeros = match opt_input(inputs, zi) {
        Some(z) => {
            if z.dtype() != ct.dtype || z.shape() != scale_t.shape() {
                return Err(OpError(format!(
                    "{zname} is {} {:?}; it must have {what}'s type {} and {sname}'s shape {:?}",
                    z.dtype(),
                    z.shape(),
                    ct.dtype,
                    scale_t.shape()
                )));
            }
            codes(z)
        }
        None => vec![0; scales.len()],
    };
    // ONNX Runtime's kernel takes one zero point per direction: int8 per-column zero points
    // must be 0, uint8 ones all equal.
    let mut dir_zero = Vec::with_capacity(dirs);
    for d in 0..dirs {
        let zs = &zeros[d * n_params..(d + 1) * n_params];
        if per_column && zs.iter().any(|&z| z != zs[0]) {
            return Err(OpError(format!(
                "{zname} differs between columns of direction {d}; ONNX Runtime's kernel takes \
                 one zero point per direction"
            )));
        }
        if per_column && ct.dtype == DType::I8 && zs[0] != 0 {
            return Err(OpError(format!(
                "{zname} of int8 weights must be 0 per column (ONNX Runtime's rule), got {}",
                zs[0]
            )));
        }
        dir_zero.push(zs[0]);
    }
    let per_dir = k * gh;
    let shifted = codes(t)
        .iter()
        .enumerate()
        .map(|(i, &q)| q - dir_zero[i / per_dir])
        .collect();
    Ok(QuantSet::new(shifted, scales, dirs, gh))
}

/// ONNX Runtime's dynamic uint8 quantization parameters of `a` (core/util/qmath.h).
fn dynamic_params(a: &[f32]) -> (f32, i32) {
    let (min, max) = a
        .iter()
        .fold((0f32, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let scale = if max == min { 1.0 } else { (max - min) / 255.0 };
    let zero = (0.0 - min / scale).clamp(0.0, 255.0).round_ties_even();
    (scale, zero as i32)
}

/// `C[m×n] (+)= A[m×k] · W` with `A` quantized dynamically (see the module comment).
pub(crate) fn quantized_product(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    w: &QuantWeights,
    c: &mut [f32],
    accumulate: bool,
) {
    let a = &a[..m * k];
    let (scale, zero) = dynamic_params(a);
    let u8s = CodeType {
        lo: 0,
        hi: 255,
        dtype: DType::U8,
    };
    let qa: Vec<i32> = a
        .iter()
        .map(|&v| u8s.quantize(v / scale, zero) - zero)
        .collect();
    let max_qa = qa
        .iter()
        .map(|v| v.unsigned_abs() as u64)
        .max()
        .unwrap_or(0);
    // The exact integer products as f32 values: where every partial sum stays within 2^24
    // in magnitude, the f32 product of the same integers (the MatMul kernel, with the kept f32
    // weights) holds each exactly, in any order; the i32 product otherwise.
    let prod: Vec<f32> = if max_qa.saturating_mul(w.max_column_sum) <= 1 << 24 {
        let qf: Vec<f32> = qa.iter().map(|&v| v as f32).collect();
        let mut prod = vec![0f32; m * n];
        // mixprec's product, the weights' rows read where they lie (exact, so the order is
        // free; one-row steps run the 1×128 tiles: Silero's quantized LSTM 26.6 → 21.5 µs).
        let b = crate::ops::sgemm::StridedB {
            data: w.float,
            n,
            rs: n,
            cs: 1,
        };
        crate::ops::sgemm::gemm(m, n, k, &qf, k, 1, &b, &mut prod, n, false);
        prod
    } else {
        let mut prod = vec![0i32; m * n];
        super::super::integer::igemm(m, n, k, &qa, w.shifted, &mut prod);
        prod.into_iter().map(|p| p as f32).collect()
    };
    for (i, (dst, &p)) in c[..m * n].iter_mut().zip(&prod).enumerate() {
        let s = scale * w.scales[if w.scales.len() == 1 { 0 } else { i % n }];
        let v = p * s;
        *dst = if accumulate { *dst + v } else { v };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_parameters_include_zero() {
        // [0.5, 2.0]: widened to [0, 2]; scale 2/255, zero point 0.
        assert_eq!(dynamic_params(&[0.5, 2.0]), (2.0 / 255.0, 0));
        // [-1, 3]: scale 4/255, zero point 63.75 → 64.
        assert_eq!(dynamic_params(&[-1.0, 3.0]), (4.0 / 255.0, 64));
        // All zeros: scale 1, zero point 0.
        assert_eq!(dynamic_params(&[0.0; 3]), (1.0, 0));
    }

    #[test]
    fn inconsistent_weight_parameters_are_errors_naming_the_tensor() {
        use crate::tensor::TensorData;
        let u8s =
            |shape: Vec<usize>, v: Vec<u8>| Tensor::from_parts(shape, TensorData::U8(v.into()));
        let w = u8s(vec![1, 1, 4], vec![1, 2, 3, 4]);
        let scales = Tensor::from_f32(vec![1, 4], vec![0.1; 4]);
        let good = u8s(vec![1, 4], vec![5; 4]);
        let mixed = u8s(vec![1, 4], vec![5, 5, 6, 5]);
        fn ins<'a>(w: &'a Tensor, s: &'a Tensor, z: &'a Tensor) -> Vec<Option<&'a Tensor>> {
            let mut v = vec![None; 12];
            v[1] = Some(w);
            v[8] = Some(s);
            v[9] = Some(z);
            v
        }
        let node = crate::graph::testing::node_with("DynamicQuantizeLSTM", &[]);
        let ctx = OpCtx::new(&node, 17);
        let w_of = |z: &Tensor, want: [usize; 3]| {
            quantized_weights(&ctx, &ins(&w, &scales, z), 1, "W", want, "input_size")
        };
        let WeightSet::Quant(q) = w_of(&good, [1, 1, 4]).unwrap() else {
            panic!("quantized weights expected")
        };
        assert_eq!(q.shifted, vec![-4, -3, -2, -1]);
        assert_eq!(q.float, vec![-4.0, -3.0, -2.0, -1.0]);
        assert_eq!(q.max_column_sums, vec![4]);
        let e = w_of(&mixed, [1, 1, 4]).unwrap_err();
        assert!(e.0.contains("W_zero_point differs"), "{e}");
        let e = w_of(&good, [1, 2, 4]).unwrap_err();
        assert!(e.0.contains("W has shape [1, 1, 4]"), "{e}");
    }

    #[test]
    fn the_product_is_exact_on_the_quantized_grid() {
        // A = [[0, 1]] (scale 1/255, zero point 0): codes 0 and 255; W = [[2], [-3]] · 0.5.
        let set = QuantSet::new(vec![2, -3], vec![0.5], 1, 1);
        let w = QuantWeights {
            shifted: &set.shifted,
            float: &set.float,
            max_column_sum: set.max_column_sums[0],
            scales: &[0.5],
        };
        let mut c = [10.0f32];
        quantized_product(1, 1, 2, &[0.0, 1.0], &w, &mut c, true);
        // 10 + (255 · −3) · (1/255 · 0.5) = 10 − 1.5.
        assert!((c[0] - 8.5).abs() < 1e-6, "{}", c[0]);
    }

    /// The f32 product of the codes (taken while every partial sum stays within 2^24) gives
    /// the bits of the i32 one, per-column scales included.
    #[test]
    fn the_f32_product_of_the_codes_is_the_integer_product() {
        let (m, n, k) = (4, 64, 128);
        let mut s = 7u64;
        let mut next = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let shifted: Vec<i32> = (0..k * n).map(|_| (next() % 511) as i32 - 255).collect();
        let scales: Vec<f32> = (0..n).map(|j| 0.001 + j as f32 * 1e-4).collect();
        let a: Vec<f32> = (0..m * k).map(|_| next() as f32 / 4e8 - 3.0).collect();
        let set = QuantSet::new(shifted, scales.clone(), 1, n);
        assert!(
            set.max_column_sums[0] * 255 <= 1 << 24,
            "the f32 path must be taken"
        );
        let product = |max_column_sum: u64| {
            let w = QuantWeights {
                shifted: &set.shifted,
                float: &set.float,
                max_column_sum,
                scales: &scales,
            };
            let mut c = vec![0.5f32; m * n];
            quantized_product(m, n, k, &a, &w, &mut c, true);
            c
        };
        // A bound beyond 2^24 forces the i32 product.
        assert_eq!(product(set.max_column_sums[0]), product(1 << 30));
    }
}
