//! The logistic function (Sigmoid) and the hyperbolic tangent (Tanh) as ONNX Runtime computes
//! them in float32.
//!
//! ORT's Sigmoid, FusedConv's Sigmoid activation and QuickGelu call MLAS's
//! `MlasComputeLogistic`: not `1/(1+e^-x)` but Eigen's rational approximation, a degree-9 odd
//! numerator over a degree-10 even denominator on `x` clamped to [-18, 18], evaluated with fused
//! multiply-adds (`LogisticKernelFma3.S`, the kernel ORT picks on any x86-64 CPU with FMA3).
//! Computing the same expression, fma for fma, gives ORT's float32 results bit for bit (checked
//! on 200 000 values in [-25, 25] against ORT 1.32: 0 differ, while the correctly rounded
//! logistic differs from ORT on 63 % of them); it is also branch-free, so it vectorizes.
//!
//! ORT's Tanh calls `MlasComputeTanh` (onnxruntime/core/mlas/lib/tanh.cpp, Eigen's
//! coefficients): a degree-13 odd numerator over a degree-6 even denominator on `x` clamped to
//! [-9, 9], Horner steps as fused multiply-adds. The same expression gives ORT 1.32's results
//! bit for bit on 200 000 values in [-12, 12] plus ±0, ±1e-30, ±9, 9.5, ±inf and NaN (libm's
//! `tanhf` differs on 55 % of them), and it replaces two libm calls per value (`tanhf` calls
//! `expm1f`): 20 % of Magika's inference time.
//!
//! Determinism: `f32::mul_add` is a single correctly rounded fma everywhere. The
//! `avx2,fma` build of the loop is the same arithmetic in vector registers, so every machine
//! computes the same bits; machines without FMA take the scalar loop (slower, same result).

// The coefficients are written digit for digit as MLAS writes them.
#![allow(clippy::excessive_precision)]

use rayon::prelude::*;
use std::mem::MaybeUninit;

// Eigen's / MLAS's coefficients (onnxruntime/core/mlas/lib/logistic.cpp), written as there so
// they round to the same f32.
const LOWER: f32 = -18.0;
const UPPER: f32 = 18.0;
const ALPHA_9: f32 = 4.37031012579801e-11;
const ALPHA_7: f32 = 1.15627324459942e-07;
const ALPHA_5: f32 = 6.08574864600143e-05;
const ALPHA_3: f32 = 8.51377133304701e-03;
const ALPHA_1: f32 = 2.48287947061529e-01;
const BETA_10: f32 = 6.10247389755681e-13;
const BETA_8: f32 = 5.76102136993427e-09;
const BETA_6: f32 = 6.29106785017040e-06;
const BETA_4: f32 = 1.70198817374094e-03;
const BETA_2: f32 = 1.16817656904453e-01;
const BETA_0: f32 = 9.93151921023180e-01;

/// Elements per parallel task: below this a tensor is one task (a rayon hand-off costs more
/// than the arithmetic).
const CHUNK: usize = 1 << 14;

/// The logistic of one value, as MLAS computes it. NaN stays NaN (the clamps keep it, as
/// `vmaxps`/`vminps` return their second operand when either is NaN); ±inf → 1 / 0.
#[inline(always)]
pub(crate) fn logistic(x: f32) -> f32 {
    // `vmaxps lower, x` then `vminps upper, x`: the select form is what those compute.
    let x = if LOWER > x { LOWER } else { x };
    let x = if UPPER < x { UPPER } else { x };
    let x2 = x * x;
    let mut p = x2.mul_add(ALPHA_9, ALPHA_7);
    p = x2.mul_add(p, ALPHA_5);
    p = x2.mul_add(p, ALPHA_3);
    p = x2.mul_add(p, ALPHA_1);
    p *= x;
    let mut q = x2.mul_add(BETA_10, BETA_8);
    q = x2.mul_add(q, BETA_6);
    q = x2.mul_add(q, BETA_4);
    q = x2.mul_add(q, BETA_2);
    q = x2.mul_add(q, BETA_0);
    let y = p / q + 0.5;
    // `vmaxps zero, y`: only the lower clamp (the FMA3 kernel has no upper one); NaN passes.
    if 0.0 > y {
        0.0
    } else {
        y
    }
}

/// Tanh's clamp and Eigen's / MLAS's coefficients (onnxruntime/core/mlas/lib/tanh.cpp).
const TANH_LOWER: f32 = -9.0;
const TANH_UPPER: f32 = 9.0;
const TANH_ALPHA_13: f32 = -2.76076847742355e-16;
const TANH_ALPHA_11: f32 = 2.00018790482477e-13;
const TANH_ALPHA_9: f32 = -8.60467152213735e-11;
const TANH_ALPHA_7: f32 = 5.12229709037114e-08;
const TANH_ALPHA_5: f32 = 1.48572235717979e-05;
const TANH_ALPHA_3: f32 = 6.37261928875436e-04;
const TANH_ALPHA_1: f32 = 4.89352455891786e-03;
const TANH_BETA_6: f32 = 1.19825839466702e-06;
const TANH_BETA_4: f32 = 1.18534705686654e-04;
const TANH_BETA_2: f32 = 2.26843463243900e-03;
const TANH_BETA_0: f32 = 4.89352518554385e-03;

/// The hyperbolic tangent of one value, as MLAS computes it. NaN stays NaN (the clamps keep
/// it); ±inf → ±1.
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let x = if TANH_LOWER > x { TANH_LOWER } else { x };
    let x = if TANH_UPPER < x { TANH_UPPER } else { x };
    let x2 = x * x;
    let mut p = x2.mul_add(TANH_ALPHA_13, TANH_ALPHA_11);
    p = p.mul_add(x2, TANH_ALPHA_9);
    p = p.mul_add(x2, TANH_ALPHA_7);
    p = p.mul_add(x2, TANH_ALPHA_5);
    p = p.mul_add(x2, TANH_ALPHA_3);
    p = p.mul_add(x2, TANH_ALPHA_1);
    p *= x;
    let mut q = x2.mul_add(TANH_BETA_6, TANH_BETA_4);
    q = q.mul_add(x2, TANH_BETA_2);
    q = q.mul_add(x2, TANH_BETA_0);
    p / q
}

// MLAS's error function (onnxruntime/core/mlas/lib/erf.cpp and its AVX2+FMA kernel
// `MlasErfKernelFma3`): njuffa's faithfully rounded erff — an odd polynomial below 0.921875,
// 1 − exp(−q(|x|)) above, the exponential by MLAS's own range reduction and degree-6
// polynomial. |x| is clamped where erf is 1 in f32: the source read says 3.725, but ONNX
// Runtime 1.32 computes the larger values (0.99999994 up to about 3.92); any clamp from 3.92
// up gives its bits (checked on 43k values in [-12, 12]).
const ERF_UPPER: f32 = 3.925;
const ERF_SPLIT: f32 = 0.921875;
const ERF_SMALL: [f32; 6] = [
    -5.99104969e-4,
    4.99339588e-3,
    -2.67667342e-2,
    1.12818025e-1,
    -3.76124859e-1,
    1.28379151e-1,
];
const ERF_BIG: [f32; 7] = [
    1.72948930e-5,
    -3.83208680e-4,
    3.88393435e-3,
    -2.42545605e-2,
    1.06777847e-1,
    6.34846687e-1,
    1.28717512e-1,
];
#[allow(clippy::excessive_precision)]
const EXP_LOWER: f32 = -88.3762626647949;
const EXP_LOG2_RECIPROCAL: f32 = std::f32::consts::LOG2_E;
const EXP_LOG2_HI: f32 = -6.93145752e-1;
const EXP_LOG2_LO: f32 = -1.42860677e-6;
const EXP_POLY: [f32; 7] = [
    1.38319808e-3,
    8.37550033e-3,
    4.16689515e-2,
    1.66664466e-1,
    4.99999851e-1,
    1.0,
    1.0,
];
/// 1.5·2^23: adding and subtracting it rounds an f32 to an integer (ties to even).
const EXP_ROUND: f32 = 12_582_912.0;

/// MLAS's softmax exponential polynomial (`MlasExpConstants.poly_0..poly_4`, hex floats there).
const SOFTMAX_EXP_POLY: [f32; 5] = [
    f32::from_bits(0x3ab4_a000), // 0x1.694000p-10
    f32::from_bits(0x3c09_2f6e), // 0x1.125edcp-7
    f32::from_bits(0x3d2a_adad), // 0x1.555b5ap-5
    f32::from_bits(0x3e2a_aa28), // 0x1.555450p-3
    f32::from_bits(0x3eff_fffb), // 0x1.fffff6p-2
];

/// `exp(x − max)` as MLAS's softmax computes it (`MlasComputeSumExpVector`, given
/// `neg_max` = −max): `x + neg_max` clamped below at −88.376 (a NaN passes, as through
/// MAXPS), reduced by m·ln 2 in two fma steps (the range reduction erf uses), a degree-6
/// polynomial in fmas, scaled by 2^m built from the exponent bits. Branch-free, so row loops
/// vectorize; every step one IEEE f32 operation, so every machine gives the same bits.
#[inline(always)]
pub(crate) fn softmax_exp(x: f32, neg_max: f32) -> f32 {
    let v = x + neg_max;
    let v = if EXP_LOWER > v { EXP_LOWER } else { v };
    let biased = v.mul_add(EXP_LOG2_RECIPROCAL, EXP_ROUND);
    let m = biased - EXP_ROUND;
    let v = m.mul_add(EXP_LOG2_HI, v);
    let v = m.mul_add(EXP_LOG2_LO, v);
    // The low bits of `biased` are m: shifted into the exponent field and biased by 127.
    let scale = ((biased.to_bits() as i32) << 23).wrapping_add(0x3F80_0000);
    let mut p = SOFTMAX_EXP_POLY[0].mul_add(v, SOFTMAX_EXP_POLY[1]);
    for c in &SOFTMAX_EXP_POLY[2..] {
        p = p.mul_add(v, *c);
    }
    p = p.mul_add(v, 1.0);
    p = p.mul_add(v, 1.0);
    p * f32::from_bits(scale as u32)
}

/// The error function of one value, as MLAS's AVX2+FMA kernel computes it: every step is one
/// IEEE f32 operation (fused where MLAS fuses), so the vector loop and the scalar fallback give
/// the same bits. NaN stays NaN (as in ONNX Runtime 1.32); ±inf → ±1.
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let sign = x.to_bits() & 0x8000_0000;
    let a = f32::from_bits(x.to_bits() & 0x7fff_ffff);
    let a = if a < ERF_UPPER { a } else { ERF_UPPER };
    // Below the split: a + a·p(a²).
    let s = a * a;
    let mut r = ERF_SMALL[0].mul_add(s, ERF_SMALL[1]);
    for c in &ERF_SMALL[2..] {
        r = r.mul_add(s, *c);
    }
    r = r.mul_add(a, a);
    let big = ERF_SPLIT <= a;
    let small = if big { 0.0 } else { r };
    // Above it: 1 − exp(−(a + a·q(a))), the other lanes computing exp(0) = 1 → +0.
    let b = if big { a } else { 0.0 };
    let mut q = ERF_BIG[0].mul_add(b, ERF_BIG[1]);
    for c in &ERF_BIG[2..] {
        q = q.mul_add(b, *c);
    }
    q = q.mul_add(b, b);
    let e = -q;
    let e = if e > EXP_LOWER { e } else { EXP_LOWER };
    let biased = EXP_LOG2_RECIPROCAL.mul_add(e, EXP_ROUND);
    let n = biased - EXP_ROUND;
    let f = EXP_LOG2_HI.mul_add(n, e);
    let f = n.mul_add(EXP_LOG2_LO, f);
    let mut p = EXP_POLY[0].mul_add(f, EXP_POLY[1]);
    for c in &EXP_POLY[2..] {
        p = p.mul_add(f, *c);
    }
    // 2^n from the low bits of `biased` (n in [-127, 0]: e is clamped and never NaN), which
    // vectorizes, where `n as i32` (a saturating conversion) is checked lane by lane.
    let scale = f32::from_bits((biased.to_bits() << 23).wrapping_add(0x3F80_0000));
    let y = 1.0 - p * scale;
    let y = f32::from_bits(y.to_bits() | small.to_bits() | sign);
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// GELU with erf as ONNX Runtime's Gelu kernels (ai.onnx Gelu and com.microsoft
/// Gelu/BiasGelu) compute it: `0.5·x·(erf(x·(1/√2)) + 1)`, erf as above.
#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (erf(x * std::f32::consts::FRAC_1_SQRT_2) + 1.0)
}

/// GELU's tanh approximation as ONNX Runtime's Gelu(approximate="tanh") and FastGelu compute
/// it: `0.5·x·(tanh(x·(C·x·x + B)) + 1)` with B = √(2/π), C = 0.044715·B, tanh as above.
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const B: f32 = 0.797_884_560_802_865_4_f64 as f32;
    const C: f32 = 0.035_677_408_136_300_125_f64 as f32;
    0.5 * x * (tanh(x * (C * x * x + B)) + 1.0)
}

#[inline(always)]
fn map_into_generic<F: Fn(f32) -> f32>(src: &[f32], dst: &mut [MaybeUninit<f32>], f: &F) {
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(f(s));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map_into_fma<F: Fn(f32) -> f32>(src: &[f32], dst: &mut [MaybeUninit<f32>], f: &F) {
    map_into_generic(src, dst, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn map_into_avx512<F: Fn(f32) -> f32>(src: &[f32], dst: &mut [MaybeUninit<f32>], f: &F) {
    map_into_generic(src, dst, f)
}

/// `dst[i] = f(src[i])`, the loop compiled for AVX-512 or AVX2+FMA where the CPU has them (`f`
/// is one of this file's branch-free functions, inlined into the vector loop; the same IEEE
/// steps in lanes of either width, so the same bits).
fn map_into<F: Fn(f32) -> f32>(src: &[f32], dst: &mut [MaybeUninit<f32>], f: &F) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU has the features the function was compiled for.
        return unsafe { map_into_avx512(src, dst, f) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features the function was compiled for.
        return unsafe { map_into_fma(src, dst, f) };
    }
    map_into_generic(src, dst, f)
}

/// `f` of every value, in parallel chunks for big tensors; each finished chunk goes through
/// `finish` (the layer's output rounding) while still in cache. The loop is compiled for
/// AVX2+FMA where the CPU has them: `f` must be branch-free IEEE steps (as this file's
/// functions, or int8 fake quantization) to vectorize and give the same bits everywhere.
pub(crate) fn map_slice<F: Fn(f32) -> f32 + Sync>(
    src: &[f32],
    finish: &super::Finish,
    f: &F,
) -> Vec<f32> {
    let fill = |out: &mut [MaybeUninit<f32>]| {
        if src.len() <= CHUNK {
            map_into(src, out, f);
            // SAFETY: map_into wrote every value (out is as long as src).
            finish(unsafe { super::util::assume_written(out) });
        } else {
            out.par_chunks_mut(CHUNK)
                .zip(src.par_chunks(CHUNK))
                .for_each(|(d, s)| {
                    map_into(s, d, f);
                    // SAFETY: as above, chunk by chunk.
                    finish(unsafe { super::util::assume_written(d) });
                });
        }
    };
    // SAFETY: the map writes every value (see above).
    unsafe { super::util::unzeroed_f32(src.len(), fill) }
}

/// The logistic of every value (see [`map_slice`]).
pub(crate) fn logistic_slice(src: &[f32], finish: &super::Finish) -> Vec<f32> {
    map_slice(src, finish, &logistic)
}

/// The hyperbolic tangent of every value (see [`map_slice`]).
pub(crate) fn tanh_slice(src: &[f32], finish: &super::Finish) -> Vec<f32> {
    map_slice(src, finish, &tanh)
}

/// The error function of every value (see [`map_slice`]).
pub(crate) fn erf_slice(src: &[f32], finish: &super::Finish) -> Vec<f32> {
    map_slice(src, finish, &erf)
}

/// GELU (erf) of every value (see [`map_slice`]).
pub(crate) fn gelu_erf_slice(src: &[f32], finish: &super::Finish) -> Vec<f32> {
    map_slice(src, finish, &gelu_erf)
}

/// GELU (tanh approximation) of every value (see [`map_slice`]).
pub(crate) fn gelu_tanh_slice(src: &[f32], finish: &super::Finish) -> Vec<f32> {
    map_slice(src, finish, &gelu_tanh)
}

/// The logistic of every value, in place.
pub(crate) fn logistic_in_place(v: &mut [f32]) {
    map_in_place(v, &logistic)
}

/// SiLU as its exported Sigmoid and Mul compute it, in place: `x·s` (`x_first`) or `s·x` with
/// `s` = [`logistic`]`(x)` rounded by `round` (the Sigmoid layer's output rounding), each
/// product one IEEE multiplication: the bits of the two layers run one by one.
pub(crate) fn silu_in_place(v: &mut [f32], round: Option<crate::numeric::Rounding>, x_first: bool) {
    let mut buf = [0.0f32; 256];
    for part in v.chunks_mut(buf.len()) {
        let s = &mut buf[..part.len()];
        // SAFETY: MaybeUninit<f32> has f32's layout, and map_into only writes values.
        map_into(
            part,
            unsafe { &mut *(s as *mut [f32] as *mut [MaybeUninit<f32>]) },
            &logistic,
        );
        if let Some(r) = round {
            r.round_slice(s);
        }
        if x_first {
            super::vector::zip_in_place(part, s, |x, s| x * s);
        } else {
            super::vector::zip_in_place(part, s, |x, s| s * x);
        }
    }
}

/// `f` of every value in place on this thread (a piece of a kernel's parallel loop, often a
/// few dozen values: no staging buffer; `f` as in [`map_in_place`]).
pub(crate) fn map_piece_in_place<F: Fn(f32) -> f32>(v: &mut [f32], f: &F) {
    fn generic<F: Fn(f32) -> f32>(v: &mut [f32], f: &F) {
        v.iter_mut().for_each(|x| *x = f(*x));
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn avx512<F: Fn(f32) -> f32>(v: &mut [f32], f: &F) {
        generic(v, f)
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma<F: Fn(f32) -> f32>(v: &mut [f32], f: &F) {
        generic(v, f)
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: the CPU has the features the function was compiled for.
        return unsafe { avx512(v, f) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features the function was compiled for.
        return unsafe { fma(v, f) };
    }
    generic(v, f)
}

/// `f` of every value in place, in parallel chunks for big buffers (`f` one of this file's
/// functions, inlined into the AVX2+FMA loop where the CPU has it).
pub(crate) fn map_in_place<F: Fn(f32) -> f32 + Sync>(v: &mut [f32], f: &F) {
    let run = |chunk: &mut [f32]| {
        // The kernel reads a source and writes a destination; in place goes through a small
        // stack buffer so the vector loop still sees two slices.
        let mut buf = [0.0f32; 256];
        for part in chunk.chunks_mut(buf.len()) {
            let b = &mut buf[..part.len()];
            b.copy_from_slice(part);
            // SAFETY: MaybeUninit<f32> has f32's layout, and map_into only writes values.
            let part = unsafe { &mut *(part as *mut [f32] as *mut [MaybeUninit<f32>]) };
            map_into(b, part, f);
        }
    };
    if v.len() <= CHUNK {
        run(v);
    } else {
        v.par_chunks_mut(CHUNK).for_each(run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The correctly rounded logistic, in f64.
    fn exact(x: f32) -> f32 {
        (1.0 / (1.0 + (-(x as f64)).exp())) as f32
    }

    #[test]
    fn close_to_the_exact_logistic_and_in_range() {
        let xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 0.01).collect();
        let ys = logistic_slice(&xs, &|_| {});
        for (&x, &y) in xs.iter().zip(&ys) {
            assert!(
                (y - exact(x)).abs() <= 2e-7,
                "logistic({x}) = {y}, exact {}",
                exact(x)
            );
            assert!((0.0..=1.0).contains(&y));
        }
        // MLAS's values at a few points (ORT 1.32, FMA3 kernel): not the correctly rounded ones.
        assert_eq!(logistic(0.0), 0.5);
        assert_eq!(logistic(-0.0), 0.5);
    }

    #[test]
    fn special_values_as_in_onnxruntime() {
        let ys = logistic_slice(
            &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 18.5, -30.0],
            &|_| {},
        );
        assert!(ys[0].is_nan());
        assert_eq!(ys[1], logistic(18.0));
        assert_eq!(ys[2], logistic(-18.0));
        assert_eq!(ys[3], logistic(18.0));
        assert!(ys[4] >= 0.0 && ys[4] < 1e-6);
    }

    #[test]
    fn vector_scalar_and_parallel_paths_agree_bit_for_bit() {
        let xs: Vec<f32> = (0..(3 * CHUNK + 17))
            .map(|i| ((i as f32) * 0.618_034).sin() * 25.0)
            .collect();
        let scalar: Vec<u32> = xs.iter().map(|&x| logistic(x).to_bits()).collect();
        let mut out = vec![MaybeUninit::new(f32::NAN); xs.len()];
        map_into_generic(&xs, &mut out, &logistic);
        assert!(out
            .iter()
            .map(|y| unsafe { y.assume_init() }.to_bits())
            .eq(scalar.iter().copied()));
        let par: Vec<u32> = logistic_slice(&xs, &|_| {})
            .iter()
            .map(|y| y.to_bits())
            .collect();
        assert_eq!(par, scalar);
        let mut inplace = xs.clone();
        logistic_in_place(&mut inplace);
        assert!(inplace
            .iter()
            .map(|y| y.to_bits())
            .eq(scalar.iter().copied()));
    }

    /// MLAS's tanh stays within 3 float32 ulps of the exact tanh on [-9, 9] (then ±1 within
    /// one ulp), keeps NaN, maps ±inf to ±1 and is odd; the vector, scalar and parallel paths
    /// agree bit for bit.
    #[test]
    fn tanh_is_close_odd_and_the_same_on_every_path() {
        let xs: Vec<f32> = (0..(3 * CHUNK + 17))
            .map(|i| ((i as f32) * 0.618_034).sin() * 12.0)
            .collect();
        for &x in &xs {
            let (y, e) = (tanh(x), (x as f64).tanh());
            let ulp = (e.abs() as f32).max(f32::MIN_POSITIVE) * f32::EPSILON;
            assert!(
                ((y as f64) - e).abs() <= 3.0 * ulp as f64,
                "tanh({x}) = {y}, exact {e}"
            );
            assert_eq!(tanh(-x).to_bits(), (-y).to_bits(), "odd at {x}");
        }
        assert!(tanh(f32::NAN).is_nan());
        assert_eq!((tanh(f32::INFINITY), tanh(f32::NEG_INFINITY)), (1.0, -1.0));
        assert_eq!(tanh(0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        let scalar: Vec<u32> = xs.iter().map(|&x| tanh(x).to_bits()).collect();
        let par: Vec<u32> = tanh_slice(&xs, &|_| {})
            .iter()
            .map(|y| y.to_bits())
            .collect();
        assert_eq!(par, scalar);
    }

    #[test]
    fn every_function_gives_the_same_bits_in_scalar_avx2_and_avx512_loops() {
        let mut xs: Vec<f32> = (0..4099)
            .map(|i| ((i as f32) * 0.618_034).sin() * 12.0)
            .collect();
        xs.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -88.5,
            88.5,
        ]);
        /// The function's loop on every path the CPU has (generic over `F`, so that `f` is
        /// inlined into each loop and vectorized with its features).
        fn check<F: Fn(f32) -> f32>(name: &str, xs: &[f32], f: F) {
            let bits = |out: &mut [MaybeUninit<f32>]| -> Vec<u32> {
                // SAFETY: every path writes every value.
                unsafe { crate::ops::util::assume_written(out) }
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            let mut out = vec![MaybeUninit::<f32>::uninit(); xs.len()];
            map_into_generic(xs, &mut out, &f);
            let scalar = bits(&mut out);
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has the features.
                unsafe { map_into_fma(xs, &mut out, &f) };
                assert_eq!(bits(&mut out), scalar, "{name}: AVX2");
                if is_x86_feature_detected!("avx512f") {
                    // SAFETY: as above.
                    unsafe { map_into_avx512(xs, &mut out, &f) };
                    assert_eq!(bits(&mut out), scalar, "{name}: AVX-512");
                }
            }
        }
        check("logistic", &xs, logistic);
        check("tanh", &xs, tanh);
        check("erf", &xs, erf);
        check("gelu_erf", &xs, gelu_erf);
        check("gelu_tanh", &xs, gelu_tanh);
    }

    #[test]
    fn erf_is_faithful_odd_and_the_same_on_every_path() {
        let xs: Vec<f32> = (0..(3 * CHUNK + 17))
            .map(|i| ((i as f32) * 0.618_034).sin() * 5.0)
            .collect();
        for &x in &xs {
            let (y, e) = (erf(x), libm::erf(x as f64));
            let ulp = (e.abs() as f32).max(f32::MIN_POSITIVE) * f32::EPSILON;
            assert!(
                ((y as f64) - e).abs() <= 2.0 * ulp as f64,
                "erf({x}) = {y}, exact {e}"
            );
            assert_eq!(erf(-x).to_bits(), (-y).to_bits(), "odd at {x}");
        }
        assert!(erf(f32::NAN).is_nan());
        assert_eq!((erf(f32::INFINITY), erf(f32::NEG_INFINITY)), (1.0, -1.0));
        assert_eq!((erf(4.0), erf(3.8)), (1.0, 0.99999994));
        assert_eq!(erf(-0.0).to_bits(), (-0.0f32).to_bits());
        let scalar: Vec<u32> = xs.iter().map(|&x| erf(x).to_bits()).collect();
        let par: Vec<u32> = erf_slice(&xs, &|_| {})
            .iter()
            .map(|y| y.to_bits())
            .collect();
        assert_eq!(par, scalar);
    }
}
