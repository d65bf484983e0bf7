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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map_avx2<F: Fn(f32) -> f32>(v: &mut [f32], f: &F) {
    map_body(v, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn zip_avx2<F: Fn(f32, f32) -> f32>(a: &mut [f32], b: &[f32], f: &F) {
    zip_body(a, b, f)
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
        // A product and a sum, each rounded (BatchNormalization's): the FMA loop must not fuse
        // them (0.1 · 3 + c differs from fma(0.1, 3, c) in the last bit for many c).
        let affine = |x: f32| x * 0.1 + 0.3;
        let (mut clip_base, mut swish_base, mut zip_base) = (xs.clone(), xs.clone(), xs.clone());
        let mut affine_base = xs.clone();
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
            // SAFETY: the CPU has the features (checked above).
            unsafe {
                map_avx2(&mut clip_got, &clip);
                map_avx2(&mut swish_got, &hard_swish);
                zip_avx2(&mut zip_got, &ys, &divide);
                map_avx2(&mut affine_got, &affine);
            }
            assert_eq!(bits(&affine_got), bits(&affine_base), "affine");
            assert_eq!(bits(&clip_got), bits(&clip_base), "clip");
            assert_eq!(bits(&swish_got), bits(&swish_base), "hard swish");
            assert_eq!(bits(&zip_got), bits(&zip_base), "division");
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
