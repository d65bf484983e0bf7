//! Weight-only block quantization: int4 (DequantizeLinear with `block_size`, opset 21) and
//! NVFP4 (float4e2m1 values whose float8e4m3fn block scales are themselves dequantized by a
//! float32 global scale, NVIDIA ModelOpt's two-DequantizeLinear form, opset 23).
//!
//! Blocks run along the weight's reduction axis (MatMul `B[K, N]`: axis 0; Gemm `B` by
//! `transB`), so one scale covers `block_size` consecutive products of one output; the last
//! block may be shorter (ONNX: the scale's dimension is `ceil(K / block_size)`).
//!
//! Every function returns both what is stored and the values a DequantizeLinear computes from
//! it (`q * scale` in f32, as ONNX defines it), so tests and callers can check the written
//! model against the intended weights.

use crate::error::{Error, Result};
use crate::lowbit::{F4E2M1, F8E4M3FN, I4};
use crate::precision::round_value;
use crate::precision::Precision;
use crate::tensor::{Tensor, TensorData};

/// NVFP4's block size (TensorRT's and ModelOpt's).
pub const NVFP4_BLOCK: usize = 16;
/// ModelOpt's default int4 block size.
pub const INT4_BLOCK: usize = 128;
/// The largest float4e2m1 value.
const FP4_MAX: f32 = 6.0;
/// The largest float8e4m3fn value.
const FP8_MAX: f32 = 448.0;

/// A block-quantized 2-D weight.
#[derive(Clone, Debug)]
pub struct BlockQuantized {
    /// The stored values (int4 or float4e2m1), the weight's shape.
    pub values: Tensor,
    /// int4: float32 scales; NVFP4: float8e4m3fn block scales. Shape: the weight's with the
    /// blocked axis divided by the block size (rounded up).
    pub scales: Tensor,
    /// NVFP4 only: the float32 scalar that dequantizes `scales`.
    pub global_scale: Option<f32>,
    /// The weight as DequantizeLinear gives it back (f32, the weight's shape).
    pub dequantized: Vec<f32>,
}

/// Index of the block-scale entry for element `i` of a `[rows, cols]` weight blocked along
/// `axis` (0: blocks of rows within a column; 1: blocks of columns within a row).
fn scale_index(i: usize, cols: usize, axis: usize, block: usize) -> usize {
    let (r, c) = (i / cols, i % cols);
    if axis == 0 {
        (r / block) * cols + c
    } else {
        r * cols.div_ceil(block) + c / block
    }
}

fn scale_shape(rows: usize, cols: usize, axis: usize, block: usize) -> Vec<usize> {
    if axis == 0 {
        vec![rows.div_ceil(block), cols]
    } else {
        vec![rows, cols.div_ceil(block)]
    }
}

fn block_amax(w: &[f32], rows: usize, cols: usize, axis: usize, block: usize) -> Vec<f32> {
    let shape = scale_shape(rows, cols, axis, block);
    let mut amax = vec![0f32; shape[0] * shape[1]];
    for (i, &x) in w.iter().enumerate() {
        let s = scale_index(i, cols, axis, block);
        if x.abs() > amax[s] {
            amax[s] = x.abs();
        }
    }
    amax
}

fn check(name: &str, w: &[f32], shape: &[usize], axis: usize, block: usize) -> Result<()> {
    if shape.len() != 2 || axis > 1 {
        return Err(Error::Invalid(format!(
            "weight '{name}': block quantization needs a 2-D weight, got shape {shape:?}"
        )));
    }
    if block == 0 {
        return Err(Error::Invalid("--block-size must be at least 1".into()));
    }
    if let Some(x) = w.iter().find(|x| !x.is_finite()) {
        return Err(Error::Invalid(format!(
            "weight '{name}' holds {x}: a non-finite weight cannot be block-quantized"
        )));
    }
    Ok(())
}

/// Symmetric int4: per block `scale = amax / 7` (an all-zero block gets scale 1),
/// `q = clamp(round_half_even(w / scale), -8, 7)`, as QuantizeLinear to int4 computes it.
pub fn quantize_int4(
    name: &str,
    w: &[f32],
    shape: &[usize],
    axis: usize,
    block: usize,
) -> Result<BlockQuantized> {
    check(name, w, shape, axis, block)?;
    let (rows, cols) = (shape[0], shape[1]);
    let scales: Vec<f32> = block_amax(w, rows, cols, axis, block)
        .into_iter()
        .map(|a| if a > 0.0 { a / 7.0 } else { 1.0 })
        .collect();
    let mut q = Vec::with_capacity(w.len());
    let mut deq = Vec::with_capacity(w.len());
    for (i, &x) in w.iter().enumerate() {
        let s = scales[scale_index(i, cols, axis, block)];
        let v = I4::saturating(round_value(Precision::Int8, x / s) as i64);
        q.push(v);
        deq.push(v.get() as f32 * s);
    }
    Ok(BlockQuantized {
        values: Tensor::from_parts(shape.to_vec(), TensorData::I4(q.into())),
        scales: Tensor::from_f32(scale_shape(rows, cols, axis, block), scales),
        global_scale: None,
        dequantized: deq,
    })
}

/// NVFP4 as ModelOpt computes it (`get_weights_scaling_factor_2`, `get_weights_scaling_factor`,
/// `quantize`): global scale `g = amax(w) / (6 · 448)` (1 for an all-zero weight); per block
/// `s = fp8e4m3(amax_block / (6 · g))` (an all-zero block gets 1; a scale that rounds to zero
/// gets the smallest float8 value instead, so no division by zero); `q = fp4e2m1(w / (s · g))`
/// rounded to nearest even, saturating at ±6.
pub fn quantize_nvfp4(
    name: &str,
    w: &[f32],
    shape: &[usize],
    axis: usize,
    block: usize,
) -> Result<BlockQuantized> {
    check(name, w, shape, axis, block)?;
    let (rows, cols) = (shape[0], shape[1]);
    let amax = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    let global = if amax > 0.0 {
        amax / (FP4_MAX * FP8_MAX)
    } else {
        1.0
    };
    let smallest = F8E4M3FN::from_bits(1);
    let fp8: Vec<F8E4M3FN> = block_amax(w, rows, cols, axis, block)
        .into_iter()
        .map(|a| {
            let s = a / (FP4_MAX * global);
            let s = if s == 0.0 { 1.0 } else { s };
            let e = F8E4M3FN::from_f32(s, true);
            if e.to_f32() == 0.0 {
                smallest
            } else {
                e
            }
        })
        .collect();
    // What the first DequantizeLinear computes: (s - 0) * g in f32.
    let block_scales: Vec<f32> = fp8.iter().map(|e| e.to_f32() * global).collect();
    let mut q = Vec::with_capacity(w.len());
    let mut deq = Vec::with_capacity(w.len());
    for (i, &x) in w.iter().enumerate() {
        let s = block_scales[scale_index(i, cols, axis, block)];
        let v = F4E2M1::from_f32(x / s, true);
        q.push(v);
        deq.push(v.to_f32() * s);
    }
    Ok(BlockQuantized {
        values: Tensor::from_parts(shape.to_vec(), TensorData::F4E2M1(q.into())),
        scales: Tensor::from_parts(
            scale_shape(rows, cols, axis, block),
            TensorData::F8E4M3FN(fp8.into()),
        ),
        global_scale: Some(global),
        dequantized: deq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int4_blocks_run_along_the_reduction_axis() {
        // B[K=4, N=2], blocks of 2 along K (axis 0): column 0 holds 7, 3.5 | 1.75, -0.625.
        let w = [7.0, 0.1, 3.5, 0.2, 1.75, 0.7, -0.625, -0.35];
        let q = quantize_int4("w", &w, &[4, 2], 0, 2).unwrap();
        assert_eq!(q.scales.shape(), &[2, 2]);
        let s = q.scales.as_f32().unwrap();
        assert_eq!(s, &[1.0, 0.2 / 7.0, 0.25, 0.7 / 7.0]);
        assert_eq!(q.dequantized[0], 7.0);
        // 3.5 is a tie: half to even gives 4.
        assert_eq!(q.dequantized[2], 4.0);
        assert_eq!(q.dequantized[4], 1.75);
        // -0.625 / 0.25 = -2.5 -> -2 (even).
        assert_eq!(q.dequantized[6], -0.5);
        let TensorData::I4(v) = q.values.data() else {
            panic!()
        };
        assert_eq!(v[0].get(), 7);
        assert_eq!(v[6].get(), -2);
    }

    #[test]
    fn int4_along_axis_one_and_a_short_last_block() {
        // Gemm B[N=1, K=5] with transB: blocks along axis 1 of 2, 2, 1.
        let w = [1.0, -2.0, 0.5, 0.25, 3.0];
        let q = quantize_int4("w", &w, &[1, 5], 1, 2).unwrap();
        assert_eq!(q.scales.shape(), &[1, 3]);
        assert_eq!(
            q.scales.as_f32().unwrap(),
            &[2.0 / 7.0, 0.5 / 7.0, 3.0 / 7.0]
        );
        assert_eq!(q.dequantized[4], 3.0);
        // An all-zero block gets scale 1 and stays zero.
        let z = quantize_int4("z", &[0.0, 0.0], &[2, 1], 0, 2).unwrap();
        assert_eq!(z.scales.as_f32().unwrap(), &[1.0]);
        assert_eq!(z.dequantized, vec![0.0, 0.0]);
    }

    #[test]
    fn nvfp4_follows_modelopt_two_level_scales() {
        // One block of 4 along axis 1 holding amax 6: global = 6 / 2688, block scale
        // 6 / (6 g) = 448 (exact in e4m3), so w / (448 g) = w: 6, 3, 1.5 and 0.75 -> 1 (tie to
        // even between 0.5 and 1).
        let w = [6.0, 3.0, 1.5, 0.75];
        let q = quantize_nvfp4("w", &w, &[1, 4], 1, 4).unwrap();
        let g = q.global_scale.unwrap();
        assert_eq!(g, 6.0 / 2688.0);
        let TensorData::F8E4M3FN(s) = q.scales.data() else {
            panic!()
        };
        assert_eq!(s[0].to_f32(), 448.0);
        let bs = 448.0 * g;
        assert_eq!(q.dequantized, vec![6.0 * bs, 3.0 * bs, 1.5 * bs, 1.0 * bs]);
        let TensorData::F4E2M1(v) = q.values.data() else {
            panic!()
        };
        assert_eq!(v[3].to_f32(), 1.0);
    }

    #[test]
    fn nvfp4_small_blocks_get_a_rounded_fp8_scale_and_zero_blocks_scale_one() {
        // Block 0 amax 6 (scale 448), block 1 amax 0.01 (scale 0.01*448/6 = 0.7466 -> e4m3
        // 0.75), block 2 all zero (scale 1).
        let w = [6.0, -1.0, 0.01, -0.005, 0.0, 0.0];
        let q = quantize_nvfp4("w", &w, &[3, 2], 1, 2).unwrap();
        let TensorData::F8E4M3FN(s) = q.scales.data() else {
            panic!()
        };
        let got: Vec<f32> = s.iter().map(|e| e.to_f32()).collect();
        assert_eq!(got, vec![448.0, 0.75, 1.0]);
        assert_eq!(&q.dequantized[4..], &[0.0, 0.0]);
        // Every dequantized value is within half a step of fp4 (relative 1/4 for |q| >= 1).
        let rel = (q.dequantized[2] - 0.01).abs() / 0.01;
        assert!(rel < 0.25, "{rel}");
    }

    #[test]
    fn bad_weights_are_errors() {
        let e = quantize_int4("w3", &[0.0; 8], &[2, 2, 2], 0, 2).unwrap_err();
        assert!(e.to_string().contains("'w3'") && e.to_string().contains("2-D"));
        let e = quantize_nvfp4("wn", &[f32::NAN, 1.0], &[1, 2], 1, 2).unwrap_err();
        assert!(e.to_string().contains("'wn'") && e.to_string().contains("NaN"));
        assert!(quantize_int4("w", &[1.0], &[1, 1], 0, 0).is_err());
    }
}
