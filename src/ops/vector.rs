//! Elementwise loops compiled for AVX2 + FMA where the CPU has them. The crate is built for the
//! x86-64 baseline (SSE2), so a plain loop over f32 runs 4 lanes at a time; these helpers
//! compile the same loop body twice — for AVX2 + FMA and for the baseline — and pick one at run
//! time (`is_x86_feature_detected!` is a cached load). The function `f` is inlined into each
//! loop, so it must be branch-free IEEE steps for the loop to vectorize (min/max, compares and
//! selects, arithmetic) and must hold its constants by value (`move` closures): a constant read
//! through a reference may alias the slice being written, and the loop then stays scalar. The
//! steps are the same in every lane width and the compiler never fuses a multiply and an add it
//! was not told to, so both paths give the same bits (test below).
//!
//! Used by the epilogue stages with one chained input (Clip, Add/Sub/Mul/Div by a per-channel
//! constant, BatchNormalization's `x·a + b`, Relu, LeakyRelu, HardSigmoid, HardSwish): a
//! decomposed HardSwish after each convolution made them ~24 % of PP-OCRv4 rec's single-thread
//! run in SSE2 loops; in AVX2 ones rec −10 % and the angle classifier −3 to −10 % (min of 3
//! alternating, 1 and 2 threads; 2026-11-27). The fused SiLU stage's product
//! (`logistic::silu_in_place`, since 2026-11-27 09:50) runs in `zip_in_place`: that stage, σ
//! and product in one pass, made YOLOv8n −3.6 %. Measured and not taken: the generic
//! two-operand stage (`Stage::Combine`, then also SiLU's product) in this AVX2 loop made
//! YOLOv8n +8 % (two A/Bs; not understood), and an
//! AVX-512 build of these loops was no faster (det +3 %, cls −3 %: their selects become masked
//! stores, which AMD microcodes).

/// `v[i] = f(v[i])`.
#[inline]
pub(crate) fn map_in_place<F: Fn(f32) -> f32>(v: &mut [f32], f: F) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features the function was compiled for.
        return unsafe { map_avx2(v, &f) };
    }
    map_body(v, &f)
}

/// `a[i] = f(a[i], b[i])` (over the shorter of the two).
#[inline]
pub(crate) fn zip_in_place<F: Fn(f32, f32) -> f32>(a: &mut [f32], b: &[f32], f: F) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features the function was compiled for.
        return unsafe { zip_avx2(a, b, &f) };
    }
    zip_body(a, b, &f)
}

#[cfg(target_arch = "x86_64")]
fn avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[inline(always)]
fn map_body<F: Fn(f32) -> f32>(v: &mut [f32], f: &F) {
    for x in v {
        *x = f(*x);
    }
}

#[inline(always)]
fn zip_body<F: Fn(f32, f32) -> f32>(a: &mut [f32], b: &[f32], f: &F) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x = f(*x, y);
    }
}

/// Eight values at a time, each vector of inputs made opaque to the compiler before `f` runs
/// on its lanes. Why: where `f` gives back its input on one side of a compare (Relu: `x < 0 ?
/// 0 : x`; LeakyRelu), the compiler proves that those lanes store what they loaded and turns
/// the loop's stores into masked stores (`vmaskmovps`), which AMD cores microcode: Relu ran at
/// 2.3 values a ns on Zen 4, 24 with whole-vector stores, and the Relu after the bench CNN's
/// stem convolution was 14 % of that convolution. An opaque input is no longer known to be
/// what memory holds, so every lane is stored. The lanes of `f` are combined into vector
/// instructions by the compiler's straight-line vectorizer (the same IEEE steps per lane). The
/// last 1–7 values go through a buffer of eight (a loop over them would be vectorized with
/// masked stores again).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map_avx2<F: Fn(f32) -> f32>(v: &mut [f32], f: &F) {
    // `zip8` with an unused second operand (constant zeros, folded away).
    let g = |x: f32, _: f32| f(x);
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        zip8(c, &[0.0; 8], &g);
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut buf = [0f32; 8];
        buf[..rest.len()].copy_from_slice(rest);
        zip8(&mut buf, &[0.0; 8], &g);
        rest.copy_from_slice(&buf[..rest.len()]);
    }
}

/// As [`map_avx2`], with a second operand.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn zip_avx2<F: Fn(f32, f32) -> f32>(a: &mut [f32], b: &[f32], f: &F) {
    let n = a.len().min(b.len());
    let (a, b) = (&mut a[..n], &b[..n]);
    let mut chunks = a.chunks_exact_mut(8);
    for (c, y) in (&mut chunks).zip(b.chunks_exact(8)) {
        zip8(c, y, f);
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let (mut buf, mut ys) = ([0f32; 8], [0f32; 8]);
        buf[..rest.len()].copy_from_slice(rest);
        ys[..rest.len()].copy_from_slice(&b[n - rest.len()..]);
        zip8(&mut buf, &ys, f);
        rest.copy_from_slice(&buf[..rest.len()]);
    }
}

/// `f` on the eight values at `c` and `y` (eight or more each), stored whole into `c` (the
/// input vector made opaque first: [`map_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn zip8<F: Fn(f32, f32) -> f32>(c: &mut [f32], y: &[f32], f: &F) {
    use std::arch::x86_64::*;
    assert!(c.len() >= 8 && y.len() >= 8);
    let x: [f32; 8] = std::mem::transmute(opaque(_mm256_loadu_ps(c.as_ptr())));
    let r = [
        f(x[0], y[0]),
        f(x[1], y[1]),
        f(x[2], y[2]),
        f(x[3], y[3]),
        f(x[4], y[4]),
        f(x[5], y[5]),
        f(x[6], y[6]),
        f(x[7], y[7]),
    ];
    _mm256_storeu_ps(c.as_mut_ptr(), std::mem::transmute::<[f32; 8], __m256>(r));
}

/// `x`, through an empty `asm!` the compiler cannot see into (no instruction is emitted).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn opaque(mut x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    // SAFETY: an empty template; the register is read and written as it is.
    std::arch::asm!("/* {0} */", inout(ymm_reg) x, options(pure, nomem, nostack, preserves_flags));
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Both loops give the baseline's bits on functions with compares, selects, a division and
    /// NaN handling (Clip's and HardSwish's kind), over values with NaN, infinities, signed
    /// zeros and subnormals, in a length no multiple of a vector.
    #[test]
    fn the_avx2_loops_give_the_bits_of_the_baseline_loops() {
        let mut xs: Vec<f32> = (0..1037)
            .map(|i| ((i as f32) * 0.618_034).sin() * 9.0)
            .collect();
        xs.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -1e-40,
        ]);
        let ys: Vec<f32> = xs.iter().map(|x| x * 0.75 - 1.0).collect();
        let (lo, hi) = (-1.5f32, 2.5f32);
        let clip = move |x: f32| if x.is_nan() { x } else { x.max(lo).min(hi) };
        let hard_swish = |x: f32| x * ((x + 3.0).clamp(0.0, 6.0) / 6.0);
        let divide = |a: f32, b: f32| a / b;
        // Functions that give back their input on one side of a compare (the loop's inputs
        // are opaque to the compiler for them: `map_avx2`).
        let relu = super::super::elementwise::relu::<f32>;
        let leaky = |x: f32| if x < 0.0 { x * 0.01 } else { x };
        let keep_larger = |a: f32, b: f32| if a < b { b } else { a };
        // A product and a sum, each rounded (BatchNormalization's): the FMA loop must not fuse
        // them (0.1 · 3 + c differs from fma(0.1, 3, c) in the last bit for many c).
        let affine = |x: f32| x * 0.1 + 0.3;
        let (mut clip_base, mut swish_base, mut zip_base) = (xs.clone(), xs.clone(), xs.clone());
        let mut affine_base = xs.clone();
        let (mut relu_base, mut leaky_base, mut larger_base) = (xs.clone(), xs.clone(), xs.clone());
        map_body(&mut relu_base, &relu);
        map_body(&mut leaky_base, &leaky);
        zip_body(&mut larger_base, &ys, &keep_larger);
        map_body(&mut clip_base, &clip);
        map_body(&mut swish_base, &hard_swish);
        zip_body(&mut zip_base, &ys, &divide);
        map_body(&mut affine_base, &affine);
        let fused: Vec<u32> = xs.iter().map(|x| x.mul_add(0.1, 0.3).to_bits()).collect();
        assert_ne!(
            bits(&affine_base),
            fused,
            "the values tell a fused multiply-add apart"
        );
        #[cfg(target_arch = "x86_64")]
        if avx2_fma() {
            let (mut clip_got, mut swish_got, mut zip_got) = (xs.clone(), xs.clone(), xs.clone());
            let mut affine_got = xs.clone();
            let (mut relu_got, mut leaky_got, mut larger_got) =
                (xs.clone(), xs.clone(), xs.clone());
            // SAFETY: the CPU has the features (checked above).
            unsafe {
                map_avx2(&mut relu_got, &relu);
                map_avx2(&mut leaky_got, &leaky);
                zip_avx2(&mut larger_got, &ys, &keep_larger);
                map_avx2(&mut clip_got, &clip);
                map_avx2(&mut swish_got, &hard_swish);
                zip_avx2(&mut zip_got, &ys, &divide);
                map_avx2(&mut affine_got, &affine);
            }
            assert_eq!(bits(&affine_got), bits(&affine_base), "affine");
            assert_eq!(bits(&clip_got), bits(&clip_base), "clip");
            assert_eq!(bits(&swish_got), bits(&swish_base), "hard swish");
            assert_eq!(bits(&zip_got), bits(&zip_base), "division");
            assert_eq!(bits(&relu_got), bits(&relu_base), "relu");
            assert_eq!(bits(&leaky_got), bits(&leaky_base), "leaky relu");
            assert_eq!(bits(&larger_got), bits(&larger_base), "larger of two");
        }
        // The entry points take the CPU's path.
        let mut got = xs.clone();
        map_in_place(&mut got, clip);
        assert_eq!(bits(&got), bits(&clip_base));
        let mut got = xs.clone();
        zip_in_place(&mut got, &ys, divide);
        assert_eq!(bits(&got), bits(&zip_base));
    }
}
