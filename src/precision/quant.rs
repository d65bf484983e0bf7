//! Symmetric quantization as int8 and fp8 layers use it (docs/numerics.md):
//! activations per tensor with a calibrated scale `s = amax / qmax`, weights per output
//! channel with `s[c] = max|w[c, ...]| / qmax`; `q = saturate(round(x / s))`, then `q · s`.
//!
//! The emulation (exec) and the export (QuantizeLinear/DequantizeLinear) share these functions,
//! so an exported model computes exactly the values mixprec emulated.

use super::{round_value, Precision};
use crate::graph::Node;

/// The largest quantized magnitude: 127 for int8, the largest finite value for fp8.
#[inline]
pub fn qmax(p: Precision) -> f32 {
    match p {
        Precision::Int8 => 127.0,
        Precision::Fp8E4M3 => 448.0,
        Precision::Fp8E5M2 => 57344.0,
        _ => f32::MAX,
    }
}

/// The scale for a range. A range that is zero or not finite gets scale 1 (every value then
/// quantizes to itself or saturates), so the scale is always usable as a divisor.
pub fn scale_from_amax(amax: f32, p: Precision) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / qmax(p)
    } else {
        1.0
    }
}

/// One quantized value (before dequantization): `saturate(round(x / s))` in the grid of `p`.
/// NaN stays NaN for fp8 and becomes 0 for int8 (as QuantizeLinear to int8 does). Always
/// inlined: with a constant `p` (the fp8 fake-quantization loops) it folds to one branch-free
/// rounding, and the loop vectorizes.
#[inline(always)]
pub fn quantize(x: f32, scale: f32, p: Precision) -> f32 {
    let v = x / scale;
    match p {
        Precision::Int8 => round_value(Precision::Int8, v),
        // Saturating conversion (QuantizeLinear's default saturate=1 for fp8).
        _ => {
            let m = qmax(p);
            // (`clamp` keeps a NaN.)
            round_value(p, v.clamp(-m, m))
        }
    }
}

/// `quantize(x)·scale` for int8, spelled out branch-free so that loops over it vectorize
/// (same values: `fake_quant_is_quantize_times_scale`).
#[inline(always)]
fn fake_quant_int8(x: f32, scale: f32) -> f32 {
    let q = x / scale;
    let r = super::round_half_even(q);
    let r = if q.is_nan() {
        0.0
    } else {
        r.clamp(-128.0, 127.0)
    };
    r * scale
}

/// `quantize(x)·scale` of every value of `$v` through the in-place map `$map`, with the
/// precision a constant in each loop, so `quantize` folds to its branch-free rounding and the
/// loop vectorizes (a macro: a closure passed as `dyn Fn` would not be inlined into it).
macro_rules! fake_quant_through {
    ($map:path, $v:expr, $scale:expr, $p:expr) => {{
        let (scale, p) = ($scale, $p);
        match p {
            Precision::Int8 => $map($v, &|x| fake_quant_int8(x, scale)),
            Precision::Fp8E4M3 => $map($v, &|x| quantize(x, scale, Precision::Fp8E4M3) * scale),
            Precision::Fp8E5M2 => $map($v, &|x| quantize(x, scale, Precision::Fp8E5M2) * scale),
            _ => $map($v, &|x| quantize(x, scale, p) * scale),
        }
    }};
}

/// Quantizes and dequantizes a buffer in place with one scale: `quantize(x)·scale` for every
/// value, through the logistic family's in-place map (AVX2 vectors where the CPU has them,
/// parallel pieces for big buffers).
pub fn fake_quant(v: &mut [f32], scale: f32, p: Precision) {
    fake_quant_through!(crate::ops::logistic::map_in_place, v, scale, p)
}

/// [`fake_quant`] on this thread: a piece of a kernel's parallel loop (a layer's output
/// quantized as its epilogue writes it, where every reader quantizes it alike).
pub fn fake_quant_piece(v: &mut [f32], scale: f32, p: Precision) {
    fake_quant_through!(crate::ops::logistic::map_piece_in_place, v, scale, p)
}

/// [`fake_quant`] of a copy, in one pass that reads `v` and writes the copy (an int8 or fp8
/// layer's activation input: the copy is what its kernel reads), in AVX2 vectors where the CPU
/// has them (int8 ran in SSE ones, 15 % of an int8 run of PP-OCR's classifier; fp8 through the
/// `float8` crate's per-value conversions, 6–12× an FP32 run).
pub fn fake_quantized(v: &[f32], scale: f32, p: Precision) -> Vec<f32> {
    use crate::ops::logistic::map_slice;
    let keep = |_: &mut [f32]| {};
    match p {
        Precision::Int8 => map_slice(v, &keep, &|x| fake_quant_int8(x, scale)),
        Precision::Fp8E4M3 => map_slice(v, &keep, &|x| {
            quantize(x, scale, Precision::Fp8E4M3) * scale
        }),
        Precision::Fp8E5M2 => map_slice(v, &keep, &|x| {
            quantize(x, scale, Precision::Fp8E5M2) * scale
        }),
        _ => crate::ops::elementwise::map_f32(v, |x| quantize(x, scale, p) * scale, &keep),
    }
}

/// The axis of a weight operand that indexes output channels, for an operand that is an
/// initializer of a quantized layer (Conv `W[M, C/g, ...]` axis 0, ConvTranspose
/// `W[C, M/g, ...]` axis 1, MatMul `B[..., K, N]` the last axis and `A[..., M, K]` the one
/// before it, Gemm `A`/`B` by `transA`/`transB`); None for inputs that are not weights. Each
/// op's definition says it.
pub fn weight_channel_axis(node: &Node, index: usize, rank: usize) -> Option<usize> {
    crate::ops::Registry::global()
        .def(&node.domain, &node.op_type)?
        .weight_channel_axis(node, index, rank)
}

/// Inputs of a quantized layer that are quantized at all (data operands; not biases).
pub fn is_quantized_operand(node: &Node, index: usize) -> bool {
    crate::ops::def_of(node).is_some_and(|d| d.is_quantized_operand(index))
}

/// Per-channel scales of a weight along `axis`.
pub fn channel_scales(w: &[f32], shape: &[usize], axis: usize, p: Precision) -> Vec<f32> {
    let channels = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut amax = vec![0f32; channels];
    for (i, &x) in w.iter().enumerate() {
        let c = (i / inner) % channels;
        if x.abs() > amax[c] {
            amax[c] = x.abs();
        }
    }
    amax.into_iter().map(|a| scale_from_amax(a, p)).collect()
}

/// Quantizes and dequantizes a weight in place with per-channel scales along `axis`.
pub fn fake_quant_channels(
    w: &mut [f32],
    shape: &[usize],
    axis: usize,
    scales: &[f32],
    p: Precision,
) {
    let channels = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    for (i, x) in w.iter_mut().enumerate() {
        let s = scales[(i / inner) % channels];
        *x = quantize(*x, s, p) * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_quant_is_quantize_times_scale() {
        let mut r = crate::data::loader::Mt19937::new(5);
        let mut v: Vec<f32> = (0..200_000)
            .map(|i| match i % 4 {
                0 => f32::from_bits(r.next_u32()),
                _ => (r.next_u32() as f32 / 2e7) - 107.0,
            })
            .collect();
        v.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.25,
            -0.25,
        ]);
        for p in [Precision::Int8, Precision::Fp8E4M3, Precision::Fp8E5M2] {
            for scale in [0.37f32, 1.0, 3e-3] {
                let mut in_place = v.clone();
                fake_quant(&mut in_place, scale, p);
                let mut piece = v.clone();
                fake_quant_piece(&mut piece, scale, p);
                let copied = fake_quantized(&v, scale, p);
                for got in [in_place, piece, copied] {
                    for (x, g) in v.iter().zip(&got) {
                        let want = quantize(*x, scale, p) * scale;
                        assert!(
                            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                            "{p:?} {x:e} / {scale}: {g:e} vs {want:e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn int8_symmetric_quantization() {
        let s = scale_from_amax(127.0, Precision::Int8);
        assert_eq!(s, 1.0);
        let mut v = vec![0.5, 1.5, -2.5, 200.0, -200.0, 3.2];
        fake_quant(&mut v, s, Precision::Int8);
        assert_eq!(v, vec![0.0, 2.0, -2.0, 127.0, -128.0, 3.0]);
    }

    #[test]
    fn fp8_saturates_beyond_the_range() {
        let s = scale_from_amax(448.0, Precision::Fp8E4M3);
        assert_eq!(quantize(1000.0, s, Precision::Fp8E4M3), 448.0);
        let s = scale_from_amax(57344.0, Precision::Fp8E5M2);
        assert_eq!(quantize(1e6, s, Precision::Fp8E5M2), 57344.0);
        assert!(quantize(f32::NAN, s, Precision::Fp8E5M2).is_nan());
    }

    #[test]
    fn per_channel_scales_follow_the_axis() {
        // Conv weight [2 out channels, 1, 1, 2].
        let w = [1.0, -4.0, 0.5, 0.25];
        let s = channel_scales(&w, &[2, 1, 1, 2], 0, Precision::Int8);
        assert_eq!(s, vec![4.0 / 127.0, 0.5 / 127.0]);
        // MatMul B [2, 2], channels on the last axis.
        let s = channel_scales(&w, &[2, 2], 1, Precision::Int8);
        assert_eq!(s, vec![1.0 / 127.0, 4.0 / 127.0]);
        // An all-zero channel gets scale 1, not a division by zero.
        let s = channel_scales(&[0.0, 0.0], &[2, 1], 0, Precision::Int8);
        assert_eq!(s, vec![1.0, 1.0]);
    }
}
