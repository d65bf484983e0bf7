//! The row normalizations of ONNX Runtime 1.32's CPU provider on an x86-64 CPU with AVX2, bit
//! for bit: LayerNormalization, RMSNormalization and SimplifiedLayerNormalization
//! (`core/providers/cpu/nn/layer_norm_impl.cc`, which hands float32 rows to MLAS's
//! `MlasLayerNormF32` — `core/mlas/lib/layernorm.cpp`, `layernorm_kernel_avx2.cpp` — and keeps
//! a scalar loop for short rows) and SkipLayerNormalization / SkipSimplifiedLayerNormalization
//! (`contrib_ops/cpu/skip_layer_norm.cc`, scalar).
//!
//! Why bit for bit: a model whose MatMulNBits quantize their input to int8 per block
//! (`accuracy_level = 4`) turns a last-bit difference of a normalization into a different int8
//! code now and then, and from there into a difference of the size of the quantization itself
//! (docs/numerics.md, MatMulNBits).
//!
//! The rules, measured against the 1.32 binary (`ort_norm` cases of
//! scripts/gen_contrib_cases.py, compared bit for bit):
//! - **RMS (simplified), rows of 16 or more**: the sum of squares in 8 lanes of fused
//!   multiply-adds over the row's full groups of 8 (lane j takes elements j, j+8, …), the lanes
//!   added as `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`, then the tail in order: its first
//!   `4·⌊t/4⌋` elements as `s + round(x·x)` (the compiler's 4-wide vector of squares), the rest
//!   as `fma(x, x, s)`; `d = √(s/n + ε)`, `inv = 1/d`, `y = (x·inv)·scale`.
//! - **LayerNorm, rows of 8 or more**: `mean = f32(Σx in f64 / n)`, then the same sum of
//!   squares over `c = x − mean`; `d = √(s/n + ε)`, `inv = 1/d`, `y = fma(c·inv, scale, bias)`
//!   (`(c·inv)·scale` without a bias).
//! - **Shorter rows** (`layer_norm_impl.cc`'s own loop): RMS `s += x·x` in order,
//!   `y = x/d·scale`; LayerNorm Welford's recurrence in f32 (`δ = x − mean`,
//!   `mean += δ/(h+1)`, `m2 += δ·(x − mean)`), `d = √(m2/n + ε)`, `y = (x − mean)/d·scale
//!   (+ bias)`.
//! - **Skip…Normalization**, every length: `v = input + skip (+ bias)`; the simplified form
//!   `s += v·v` in order, `y = v/d·gamma`; the full form Welford as above, `y = (v − mean)/d ·
//!   gamma (+ beta)`.
//!
//! Every `·`, `/` and `+` above is one f32 operation, rounded; `fma` is one rounding.

/// The eight lanes of an AVX register added as MLAS's horizontal reduction does: high half
/// onto low half, then lanes 2–3 onto 0–1, then lane 1 onto lane 0.
#[inline(always)]
fn hsum8(l: [f32; 8]) -> f32 {
    let r = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// MLAS's AVX2 sum of squares of `f(i)` over `n` elements (see the module doc).
#[inline(always)]
fn sum_squares_avx2(n: usize, f: impl Fn(usize) -> f32) -> f32 {
    let mut lanes = [0f32; 8];
    let full = n / 8 * 8;
    for base in (0..full).step_by(8) {
        for (j, l) in lanes.iter_mut().enumerate() {
            let x = f(base + j);
            *l = x.mul_add(x, *l);
        }
    }
    let mut s = hsum8(lanes);
    let quads = full + (n - full) / 4 * 4;
    for i in full..quads {
        let x = f(i);
        s += x * x;
    }
    for i in quads..n {
        let x = f(i);
        s = x.mul_add(x, s);
    }
    s
}

/// Rows shorter than this take `layer_norm_impl.cc`'s scalar loop (`layernorm.cpp`'s
/// dispatch threshold: 16 for RMS, 8 for LayerNorm).
fn kernel_threshold(simplified: bool) -> usize {
    if simplified {
        16
    } else {
        8
    }
}

/// Welford's recurrence in f32 as the scalar loops run it: (mean, m2).
fn welford(n: usize, f: impl Fn(usize) -> f32) -> (f32, f32) {
    let (mut mean, mut m2) = (0f32, 0f32);
    for h in 0..n {
        let x = f(h);
        let delta = x - mean;
        mean += delta / (h + 1) as f32;
        m2 += delta * (x - mean);
    }
    (mean, m2)
}

/// One f32 row normalized in place as ONNX Runtime's LayerNormalization (`simplified`:
/// RMSNormalization, SimplifiedLayerNormalization) computes it; returns (mean, 1/d) — mean 0
/// for the simplified form, which has none. `scale` and `bias` have the row's length.
pub(crate) fn layer_norm_row(
    row: &mut [f32],
    scale: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    simplified: bool,
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { layer_norm_row_fma(row, scale, bias, eps, simplified) };
    }
    layer_norm_row_with(row, scale, bias, eps, simplified)
}

/// [`layer_norm_row`] compiled with FMA: its fused multiply-adds are instructions (the
/// portable build calls libm's `fmaf` for each, 3-4× the row's time). The same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn layer_norm_row_fma(
    row: &mut [f32],
    scale: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    simplified: bool,
) -> (f32, f32) {
    layer_norm_row_with(row, scale, bias, eps, simplified)
}

#[inline(always)]
fn layer_norm_row_with(
    row: &mut [f32],
    scale: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    simplified: bool,
) -> (f32, f32) {
    let n = row.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let nf = n as f32;
    if n < kernel_threshold(simplified) {
        return scalar_norm_row(row, scale, bias, eps, simplified);
    }
    if simplified {
        let s = sum_squares_avx2(n, |i| row[i]);
        let inv = 1.0 / (s / nf + eps).sqrt();
        for (x, &g) in row.iter_mut().zip(scale) {
            *x = (*x * inv) * g;
        }
        return (0.0, inv);
    }
    let mean = (row.iter().map(|&x| x as f64).sum::<f64>() / n as f64) as f32;
    let s = sum_squares_avx2(n, |i| row[i] - mean);
    let inv = 1.0 / (s / nf + eps).sqrt();
    for (i, x) in row.iter_mut().enumerate() {
        let c = (*x - mean) * inv;
        *x = match bias {
            Some(b) => c.mul_add(scale[i], b[i]),
            None => c * scale[i],
        };
    }
    (mean, inv)
}

/// One f32 row of `v = input + skip (+ bias)` (already summed) normalized in place as
/// `skip_layer_norm.cc` does; returns (mean, 1/d) — mean 0 for the simplified form.
pub(crate) fn skip_norm_row(
    row: &mut [f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    simplified: bool,
) -> (f32, f32) {
    if row.is_empty() {
        return (0.0, 0.0);
    }
    scalar_norm_row(row, gamma, beta, eps, simplified)
}

/// The scalar loop both ONNX Runtime kernels share: `layer_norm_impl.cc` below the MLAS
/// kernel's threshold and `skip_layer_norm.cc` always — f32 in order (the sum of squares, or
/// Welford's mean and M2), then `(x − mean) / d · scale (+ bias)`; returns (mean, 1/d), mean 0
/// for the simplified form. `row` is not empty.
fn scalar_norm_row(
    row: &mut [f32],
    scale: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
    simplified: bool,
) -> (f32, f32) {
    let n = row.len();
    let nf = n as f32;
    if simplified {
        let mut s = 0f32;
        for &x in row.iter() {
            s += x * x;
        }
        let d = (s / nf + eps).sqrt();
        for (x, &g) in row.iter_mut().zip(scale) {
            *x = *x / d * g;
        }
        return (0.0, 1.0 / d);
    }
    let (mean, m2) = welford(n, |i| row[i]);
    let d = (m2 / nf + eps).sqrt();
    for (i, x) in row.iter_mut().enumerate() {
        let y = (*x - mean) / d * scale[i];
        *x = bias.map_or(y, |b| y + b[i]);
    }
    (mean, 1.0 / d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lanes, their fold and the tail: a row of 16 + 7 whose squares are exact small
    /// integers sums exactly; the order shows where the sum rounds.
    #[test]
    fn sum_of_squares_follows_mlas_lanes_and_tail() {
        let v: Vec<f32> = (1..=23).map(|i| i as f32).collect();
        let want: f32 = (1..=23).map(|i| (i * i) as f32).sum();
        assert_eq!(sum_squares_avx2(23, |i| v[i]), want);
        // 2^24 in lane 0 absorbs the 1 added to it (an odd sum rounds to even), the other
        // lanes gather 2 each before the fold meets lane 0: 2^24 + 14, not 2^24 + 15.
        let mut w = [1f32; 16];
        w[0] = 4096.0;
        let s = sum_squares_avx2(16, |i| w[i]);
        let mut l = [2f32; 8];
        l[0] = 16_777_216.0;
        assert_eq!(s, hsum8(l));
        assert_eq!(s, 16_777_216.0 + 14.0);
    }

    /// The row compiled with FMA (where the CPU has it) gives the portable build's bits:
    /// rows of 7–300 values with a tail, both forms, with and without a bias.
    #[test]
    fn the_fma_build_gives_the_portable_bits() {
        for n in [7usize, 8, 23, 256, 300] {
            let x: Vec<f32> = (0..n)
                .map(|i| (i as f32 * 0.731).sin() * 5.0 + 0.3)
                .collect();
            let g: Vec<f32> = (0..n).map(|i| 0.5 + (i % 7) as f32 * 0.21).collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 0.1 - 0.2).collect();
            for (simplified, bias) in [(true, None), (false, None), (false, Some(&b[..]))] {
                let (mut fast, mut portable) = (x.clone(), x.clone());
                let got = layer_norm_row(&mut fast, &g, bias, 1e-5, simplified);
                let want = layer_norm_row_with(&mut portable, &g, bias, 1e-5, simplified);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&fast),
                    bits(&portable),
                    "n {n}, {simplified}, {bias:?}"
                );
                assert_eq!(got.0.to_bits(), want.0.to_bits());
                assert_eq!(got.1.to_bits(), want.1.to_bits());
            }
        }
    }

    /// Short rows take the scalar loops; a row of 16 (RMS) or 8 (LayerNorm) the kernel.
    #[test]
    fn short_rows_take_the_scalar_loops() {
        let x: Vec<f32> = (0..15).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let g = vec![1.5f32; 16];
        let mut a = x.clone();
        let (_, inv) = layer_norm_row(&mut a, &g, None, 1e-5, true);
        let s: f32 = x.iter().fold(0.0, |s, &v| s + v * v);
        let d = (s / 15.0 + 1e-5).sqrt();
        assert_eq!(inv, 1.0 / d);
        assert_eq!(a[3], x[3] / d * 1.5);
        let mut b = x[..7].to_vec();
        let (mean, _) = layer_norm_row(&mut b, &g, Some(&g), 1e-5, false);
        assert_eq!(mean, welford(7, |i| x[i]).0);
        // The kernel: y = (x·inv)·scale.
        let x16: Vec<f32> = (0..16).map(|i| i as f32 - 7.5).collect();
        let mut c = x16.clone();
        let (_, inv) = layer_norm_row(&mut c, &g, None, 1e-5, true);
        assert_eq!(c[1], (x16[1] * inv) * 1.5);
    }
}
