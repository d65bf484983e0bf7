//! Epilogue stages that are one IEEE operation per value ([`super::Stage::Lanewise`],
//! [`super::Stage::Zip`]): a constant the same for every channel (Add/Sub/Mul/Div by a one-value
//! constant, Clip, Relu), or two chained values combined (Add/Sub/Mul/Div of two values of the
//! chain). Because the epilogue knows what they compute, it can round each result to the
//! layer's float16 in the same pass instead of a pass of its own, and skip the rounding where
//! the operation cannot leave the format (Clip to representable bounds, Relu: their results
//! are their inputs or a bound).
//!
//! Why: an emulated float16 run rounds every tensor each layer writes (docs/numerics.md), and a
//! decomposed HardSwish after each convolution (PP-OCRv4 det/rec, the angle classifier) is four
//! layers: the rounding passes were ~15 % of those runs (perf, 2026-11-27), the float16 ÷
//! float32 ratio 1.18–1.21 against issue 10's 1.15. The rounding itself is conversion
//! throughput (`vcvtps2ph`/`vcvtph2ps`, ~0.015 ns a value in registers on the Zen 5 machine);
//! a pass of its own adds a load and a store (~0.021 ns a value).
//!
//! Every path computes the same bits: the operations are IEEE (no fused multiply-add) and
//! Clip and Relu are written as compares and selects with one meaning (`tests`).

// Relu as its kernel computes it: 0 below zero, anything else (NaN, −0) itself.
use super::elementwise::relu;
use crate::numeric::Rounding;

/// A one-input stage: one operation per value with constants that are the same for every
/// channel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lanewise {
    /// `x + c` (Add with a one-value constant, on either side: IEEE addition commutes).
    Add(f32),
    /// `x − c`.
    Sub(f32),
    /// `x · c` (on either side).
    Mul(f32),
    /// `x / c`.
    Div(f32),
    /// [`clip`] to `[lo, hi]`.
    Clip(f32, f32),
    /// Relu: 0 below zero, anything else (NaN, −0) itself.
    Relu,
}

/// [`Lanewise::apply`] on 8 values in AVX registers: the same results (the same IEEE
/// operation; Clip and Relu as the same compares and selects).
///
/// # Safety
/// The CPU has AVX (inlined into a function compiled for it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn apply8(op: Lanewise, x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // `x < c ? c : x` and `x > c ? c : x` (a NaN or a tie keeps `x`).
    let raise_to = |x: __m256, c: __m256| _mm256_blendv_ps(x, c, _mm256_cmp_ps::<_CMP_LT_OQ>(x, c));
    let lower_to = |x: __m256, c: __m256| _mm256_blendv_ps(x, c, _mm256_cmp_ps::<_CMP_GT_OQ>(x, c));
    match op {
        Lanewise::Add(c) => _mm256_add_ps(x, _mm256_set1_ps(c)),
        Lanewise::Sub(c) => _mm256_sub_ps(x, _mm256_set1_ps(c)),
        Lanewise::Mul(c) => _mm256_mul_ps(x, _mm256_set1_ps(c)),
        Lanewise::Div(c) => _mm256_div_ps(x, _mm256_set1_ps(c)),
        Lanewise::Clip(lo, hi) => lower_to(raise_to(x, _mm256_set1_ps(lo)), _mm256_set1_ps(hi)),
        Lanewise::Relu => raise_to(x, _mm256_setzero_ps()),
    }
}

/// [`Lanewise::apply`] on 16 values in AVX-512 registers: the same results (the same IEEE
/// operation; Clip and Relu as the same compares and selects).
///
/// # Safety
/// The CPU has AVX-512F (inlined into a function compiled for it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn apply16(op: Lanewise, x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use avx512::{lower_to, raise_to};
    use std::arch::x86_64::*;
    match op {
        Lanewise::Add(c) => _mm512_add_ps(x, _mm512_set1_ps(c)),
        Lanewise::Sub(c) => _mm512_sub_ps(x, _mm512_set1_ps(c)),
        Lanewise::Mul(c) => _mm512_mul_ps(x, _mm512_set1_ps(c)),
        Lanewise::Div(c) => _mm512_div_ps(x, _mm512_set1_ps(c)),
        Lanewise::Clip(lo, hi) => lower_to(raise_to(x, _mm512_set1_ps(lo)), _mm512_set1_ps(hi)),
        Lanewise::Relu => raise_to(x, _mm512_setzero_ps()),
    }
}

/// A two-input stage on two chained values: `a[i] = a[i] op b[i]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

/// Clip as ONNX Runtime's kernel computes it (Eigen's `cwiseMin(hi).cwiseMax(lo)`): below
/// `lo` gives `lo`, above `hi` gives `hi`, anything else (a NaN, a zero equal to a bound of
/// the other sign) itself.
#[inline(always)]
pub fn clip(x: f32, lo: f32, hi: f32) -> f32 {
    let y = if x < lo { lo } else { x };
    if y > hi {
        hi
    } else {
        y
    }
}

impl Lanewise {
    /// The operation on one value.
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Lanewise::Add(c) => x + c,
            Lanewise::Sub(c) => x - c,
            Lanewise::Mul(c) => x * c,
            Lanewise::Div(c) => x / c,
            Lanewise::Clip(lo, hi) => clip(x, lo, hi),
            Lanewise::Relu => relu(x),
        }
    }

    /// Whether the result is a value of `r` whenever the input is: it is the input or a
    /// constant that `r` represents.
    pub fn keeps(self, r: Rounding) -> bool {
        let exact = |c: f32| r.round(c).to_bits() == c.to_bits();
        match self {
            Lanewise::Clip(lo, hi) => exact(lo) && exact(hi),
            Lanewise::Relu => true,
            _ => false,
        }
    }

    /// The operation on every value in place, each result rounded by `round`.
    pub fn run(self, v: &mut [f32], round: Option<Rounding>) {
        let round = round.filter(|&r| !self.keeps(r));
        #[cfg(target_arch = "x86_64")]
        if let Some(r) = round.filter(|_| avx512::available()) {
            // SAFETY: the CPU has the feature the function was compiled for.
            return unsafe { avx512::lanewise(self, v, r) };
        }
        match self {
            Lanewise::Add(c) => super::vector::map_in_place(v, move |x| x + c),
            Lanewise::Sub(c) => super::vector::map_in_place(v, move |x| x - c),
            Lanewise::Mul(c) => super::vector::map_in_place(v, move |x| x * c),
            Lanewise::Div(c) => super::vector::map_in_place(v, move |x| x / c),
            Lanewise::Clip(lo, hi) => super::vector::map_in_place(v, move |x| clip(x, lo, hi)),
            Lanewise::Relu => super::vector::map_in_place(v, relu),
        }
        if let Some(r) = round {
            r.round_slice(v);
        }
    }
}

impl Binary {
    /// The operation on two values.
    #[inline(always)]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            Binary::Add => a + b,
            Binary::Sub => a - b,
            Binary::Mul => a * b,
            Binary::Div => a / b,
        }
    }

    /// `a[i] = a[i] op b[i]` over the shorter of the two, each result rounded by `round`.
    pub fn run(self, a: &mut [f32], b: &[f32], round: Option<Rounding>) {
        let n = a.len().min(b.len());
        let (a, b) = (&mut a[..n], &b[..n]);
        #[cfg(target_arch = "x86_64")]
        if let Some(r) = round.filter(|_| avx512::available()) {
            // SAFETY: the CPU has the feature the function was compiled for.
            return unsafe { avx512::binary(self, a, b, r) };
        }
        // Plain loops (one per operation, so each vectorizes): the AVX2 build of the generic
        // two-operand loop made YOLOv8n slower (ops/vector.rs).
        match self {
            Binary::Add => a.iter_mut().zip(b).for_each(|(x, &y)| *x += y),
            Binary::Sub => a.iter_mut().zip(b).for_each(|(x, &y)| *x -= y),
            Binary::Mul => a.iter_mut().zip(b).for_each(|(x, &y)| *x *= y),
            Binary::Div => a.iter_mut().zip(b).for_each(|(x, &y)| *x /= y),
        }
        if let Some(r) = round {
            r.round_slice(a);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Binary, Lanewise};
    use crate::numeric::{bf16_x16, f16_x16, Rounding};
    use std::arch::x86_64::*;

    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx512f")
    }

    /// `f` on every 16 values of `a` (and the same 16 of `b`), rounded (to bfloat16 if `BF16`,
    /// else float16), in place; the last 1–15 through masked loads and stores. Inlined into
    /// functions compiled for AVX-512, with `f` a closure written there (a closure written in
    /// a function without the feature is not inlined: a call per 16 values).
    #[inline(always)]
    unsafe fn pass<const BF16: bool>(
        a: &mut [f32],
        b: Option<&[f32]>,
        f: impl Fn(__m512, __m512) -> __m512,
    ) {
        let g = |x, y| {
            let r = f(x, y);
            if BF16 {
                bf16_x16(r)
            } else {
                f16_x16(r)
            }
        };
        let n = a.len();
        let (pa, pb) = (a.as_mut_ptr(), b.map(|b| b.as_ptr()));
        let mut i = 0;
        while i + 16 <= n {
            let x = _mm512_loadu_ps(pa.add(i));
            let y = pb.map_or(x, |p| _mm512_loadu_ps(p.add(i)));
            _mm512_storeu_ps(pa.add(i), g(x, y));
            i += 16;
        }
        if i < n {
            let mask: __mmask16 = (1u16 << (n - i)) - 1;
            let x = _mm512_maskz_loadu_ps(mask, pa.add(i));
            let y = pb.map_or(x, |p| _mm512_maskz_loadu_ps(mask, p.add(i)));
            _mm512_mask_storeu_ps(pa.add(i), mask, g(x, y));
        }
    }

    /// `x < c ? c : x` (a NaN or a tie keeps `x`).
    #[inline(always)]
    pub(super) unsafe fn raise_to(x: __m512, c: __m512) -> __m512 {
        _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, c), c)
    }

    /// `x > c ? c : x`.
    #[inline(always)]
    pub(super) unsafe fn lower_to(x: __m512, c: __m512) -> __m512 {
        _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, c), c)
    }

    /// [`Lanewise::run`] with rounding, in one pass.
    pub(super) unsafe fn lanewise(op: Lanewise, v: &mut [f32], r: Rounding) {
        // SAFETY: the caller checked the feature.
        match r {
            Rounding::F16 => lanewise_to::<false>(op, v),
            Rounding::BF16 => lanewise_to::<true>(op, v),
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn lanewise_to<const BF16: bool>(op: Lanewise, v: &mut [f32]) {
        // SAFETY (all arms): `pass` reads and writes `v` only; the feature is enabled.
        match op {
            Lanewise::Add(c) => {
                let c = _mm512_set1_ps(c);
                pass::<BF16>(v, None, |x, _| _mm512_add_ps(x, c))
            }
            Lanewise::Sub(c) => {
                let c = _mm512_set1_ps(c);
                pass::<BF16>(v, None, |x, _| _mm512_sub_ps(x, c))
            }
            Lanewise::Mul(c) => {
                let c = _mm512_set1_ps(c);
                pass::<BF16>(v, None, |x, _| _mm512_mul_ps(x, c))
            }
            Lanewise::Div(c) => {
                let c = _mm512_set1_ps(c);
                pass::<BF16>(v, None, |x, _| _mm512_div_ps(x, c))
            }
            Lanewise::Clip(lo, hi) => {
                let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
                pass::<BF16>(v, None, |x, _| lower_to(raise_to(x, lo), hi))
            }
            Lanewise::Relu => pass::<BF16>(v, None, |x, _| raise_to(x, _mm512_setzero_ps())),
        }
    }

    /// [`Binary::run`] with rounding, in one pass (`a` and `b` of one length).
    pub(super) unsafe fn binary(op: Binary, a: &mut [f32], b: &[f32], r: Rounding) {
        debug_assert_eq!(a.len(), b.len());
        // SAFETY: the caller checked the feature.
        match r {
            Rounding::F16 => binary_to::<false>(op, a, b),
            Rounding::BF16 => binary_to::<true>(op, a, b),
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn binary_to<const BF16: bool>(op: Binary, a: &mut [f32], b: &[f32]) {
        match op {
            Binary::Add => pass::<BF16>(a, Some(b), |x, y| _mm512_add_ps(x, y)),
            Binary::Sub => pass::<BF16>(a, Some(b), |x, y| _mm512_sub_ps(x, y)),
            Binary::Mul => pass::<BF16>(a, Some(b), |x, y| _mm512_mul_ps(x, y)),
            Binary::Div => pass::<BF16>(a, Some(b), |x, y| _mm512_div_ps(x, y)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::round_to_f16;

    /// Values with every special case: signed zeros, infinities, NaNs, float16's edges, ties.
    fn specials() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7fa0_0001),
            65504.0,
            65520.0,
            -65520.0,
            6.0,
            -3.0,
            3.0,
            6.1e-5,
            2.98e-8,
            1.0 + f32::EPSILON,
        ];
        let mut rng = crate::data::loader::Mt19937::new(5);
        v.extend((0..3000).map(|_| (rng.random_sample() * 20.0 - 10.0) as f32));
        v.extend((0..3000).map(|i| f32::from_bits(rng.next_u32() ^ i)));
        v
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every operation, rounded or not, on every length up to 40 and a long buffer of values
    /// of the rounding's format: the bits of the scalar definition followed by the scalar
    /// rounding.
    #[test]
    fn every_path_gives_the_scalar_bits() {
        let raw = specials();
        let ops = [
            Lanewise::Add(3.0),
            Lanewise::Sub(-0.0),
            Lanewise::Mul(1.0 / 6.0),
            Lanewise::Div(6.0),
            Lanewise::Div(0.0),
            Lanewise::Clip(0.0, 6.0),
            Lanewise::Clip(-0.0, 0.1),
            Lanewise::Clip(f32::MIN, f32::MAX),
            Lanewise::Relu,
        ];
        let lens = (1..=40).chain([raw.len()]);
        for n in lens {
            for round in [None, Some(Rounding::F16), Some(Rounding::BF16)] {
                let r = |x: f32| round.map_or(x, |r| r.round(x));
                // A rounded chain's values are rounded already.
                let xs: Vec<f32> = raw.iter().map(|&x| r(x)).collect();
                let ys: Vec<f32> = xs.iter().rev().copied().collect();
                for op in ops {
                    let mut got = xs[..n].to_vec();
                    op.run(&mut got, round);
                    let want: Vec<f32> = xs[..n].iter().map(|&x| r(op.apply(x))).collect();
                    assert_eq!(bits(&got), bits(&want), "{op:?} {round:?} n={n}");
                }
                for op in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div] {
                    let mut got = xs[..n].to_vec();
                    op.run(&mut got, &ys[..n], round);
                    let want: Vec<f32> = (xs[..n].iter().zip(&ys[..n]))
                        .map(|(&x, &y)| r(op.apply(x, y)))
                        .collect();
                    assert_eq!(bits(&got), bits(&want), "{op:?} {round:?} n={n}");
                }
            }
        }
    }

    /// The register forms a kernel's store applies ([`apply8`], [`apply16`]) give the bits of
    /// [`Lanewise::apply`] on every special value.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_register_forms_give_the_scalar_bits() {
        use std::arch::x86_64::*;
        #[target_feature(enable = "avx")]
        unsafe fn on8(op: Lanewise, x: &[f32], got: &mut [f32]) {
            _mm256_storeu_ps(got.as_mut_ptr(), apply8(op, _mm256_loadu_ps(x.as_ptr())));
        }
        #[target_feature(enable = "avx512f")]
        unsafe fn on16(op: Lanewise, x: &[f32], got: &mut [f32]) {
            _mm512_storeu_ps(got.as_mut_ptr(), apply16(op, _mm512_loadu_ps(x.as_ptr())));
        }
        let ops = [
            Lanewise::Add(3.0),
            Lanewise::Sub(-0.0),
            Lanewise::Mul(1.0 / 6.0),
            Lanewise::Div(0.0),
            Lanewise::Clip(0.0, 6.0),
            Lanewise::Clip(-0.0, 0.1),
            Lanewise::Relu,
        ];
        let xs = specials();
        for op in ops {
            let want: Vec<f32> = xs.iter().map(|&x| op.apply(x)).collect();
            if is_x86_feature_detected!("avx") {
                for (x, w) in xs.chunks_exact(8).zip(want.chunks_exact(8)) {
                    let mut got = [0f32; 8];
                    // SAFETY: the CPU has AVX; the slices hold 8 values.
                    unsafe { on8(op, x, &mut got) };
                    assert_eq!(bits(&got), bits(w), "{op:?} apply8");
                }
            }
            if is_x86_feature_detected!("avx512f") {
                for (x, w) in xs.chunks_exact(16).zip(want.chunks_exact(16)) {
                    let mut got = [0f32; 16];
                    // SAFETY: the CPU has AVX-512F; the slices hold 16 values.
                    unsafe { on16(op, x, &mut got) };
                    assert_eq!(bits(&got), bits(w), "{op:?} apply16");
                }
            }
        }
    }

    /// Clip and Relu keep ties and NaNs (ONNX Runtime's compares), and skip the rounding only
    /// where it changes nothing.
    #[test]
    fn clip_and_relu_keep_their_input_and_round_only_where_needed() {
        assert_eq!(clip(-0.0, 0.0, 6.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(clip(0.0, -0.0, 6.0).to_bits(), 0.0f32.to_bits());
        assert!(clip(f32::NAN, 0.0, 6.0).is_nan());
        assert_eq!(clip(7.0, 0.0, 6.0), 6.0);
        assert_eq!(clip(-1.0, 0.0, 6.0), 0.0);
        assert_eq!(relu(-0.0f32).to_bits(), (-0.0f32).to_bits());
        assert!(relu(f32::NAN).is_nan());
        assert!(Lanewise::Clip(0.0, 6.0).keeps(Rounding::F16));
        assert!(Lanewise::Relu.keeps(Rounding::BF16));
        // A bound float16 cannot hold (Clip's default bounds are f32's extremes) is rounded:
        // an infinite input clips to f32::MAX, which float16 rounds to infinity.
        assert!(!Lanewise::Clip(f32::MIN, f32::MAX).keeps(Rounding::F16));
        let mut v = vec![f32::INFINITY];
        Lanewise::Clip(f32::MIN, f32::MAX).run(&mut v, Some(Rounding::F16));
        assert_eq!(v[0], round_to_f16(f32::MAX));
        assert!(!Lanewise::Add(3.0).keeps(Rounding::F16));
    }
}
