//! Numeric settings shared by the kernels (`ops`) and the precision plans (`precision`): kept
//! in their own small module so that `ops` does not depend on `precision`.

use crate::error::{Error, Result};
use serde::Serialize;

/// Accumulator type of matmul and conv kernels (`--accumulate`): f32 models the usual
/// tensor-core kernels, f16 models fp16-accumulating kernels (HGEMM with an f16 accumulator).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Accumulator {
    #[default]
    F32,
    F16,
}

impl Accumulator {
    pub fn parse(s: &str) -> Result<Accumulator> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(Accumulator::F32),
            "f16" | "fp16" | "float16" => Ok(Accumulator::F16),
            _ => Err(Error::Invalid(format!(
                "--accumulate '{s}': valid choices are f32, f16"
            ))),
        }
    }
}

/// The float type a layer keeps its state in between the steps of a multi-step kernel (a
/// recurrent layer's hidden and cell state): the layer's own type under a float16/bfloat16
/// plan, f32 otherwise. Rounding is to nearest, ties to even, overflow to ±inf (as
/// `precision::round_value`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StateType {
    #[default]
    F32,
    F16,
    BF16,
}

impl StateType {
    /// `x` rounded to the state type.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            StateType::F32 => x,
            // `half`'s own bits (`round_to_f16` is tested against it), inlined: `half` picks
            // its F16C path at run time on every call, a call per value of each step's state.
            StateType::F16 => round_to_f16(x),
            StateType::BF16 => half::bf16::from_f32(x).to_f32(),
        }
    }
}

/// What a layer's float32 outputs are rounded to under a float16 or bfloat16 plan (the
/// kernels' side of `precision::Precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    F16,
    BF16,
}

impl Rounding {
    /// `x` rounded.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Rounding::F16 => round_to_f16(x),
            Rounding::BF16 => round_to_bf16(x),
        }
    }

    /// Rounds every value of a buffer in place.
    pub fn round_slice(self, v: &mut [f32]) {
        match self {
            Rounding::F16 => round_slice_to_f16(v),
            Rounding::BF16 => round_slice_to_bf16(v),
        }
    }
}

/// The instruction set [`round_slice_to_f16`] and [`round_slice_to_bf16`] run with on this CPU
/// (`ops::isa`'s report).
pub fn rounding_instruction_set() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("avx") && std::arch::is_x86_feature_detected!("f16c")
        {
            return "f16c (float16; bfloat16 scalar)";
        }
    }
    "scalar"
}

/// Rounds a buffer to bfloat16 values: [`round_to_bf16`] on every element, 16 at a time with
/// AVX-512 where the CPU has it (the same integer steps; a NaN is kept as it is, which the
/// conversion instruction `vcvtneps2bf16` would quiet). The scalar loop, with its early return
/// for NaN, did not vectorize: emulated bfloat16 took 1.2–1.6× float16's time on the corpus.
pub fn round_slice_to_bf16(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { round_slice_avx512::<true>(v) };
    }
    v.iter_mut().for_each(|x| *x = round_to_bf16(*x));
}

/// 16 values rounded to float16 and back (`vcvtps2ph` rounds to nearest even).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn f16_x16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// 16 values rounded to bfloat16 as [`round_to_bf16`] does it (NaNs unchanged).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn bf16_x16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let b = _mm512_castps_si512(x);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(b), _mm512_set1_epi32(1));
    let up = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), odd);
    let r = _mm512_and_si512(up, _mm512_set1_epi32(0xFFFF_0000u32 as i32));
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    _mm512_mask_mov_ps(_mm512_castsi512_ps(r), nan, x)
}

/// 16 values rounded by each of `rounds` in turn ([`crate::ops::rounded_by`] in registers).
///
/// # Safety
/// The CPU has AVX-512F (inlined into a function compiled for it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn rounded_by_x16(
    x: std::arch::x86_64::__m512,
    rounds: [Option<Rounding>; 2],
) -> std::arch::x86_64::__m512 {
    // Plain code, no closures: they would be compiled without AVX-512.
    let mut x = x;
    for r in [rounds[0], rounds[1]] {
        x = match r {
            Some(Rounding::F16) => f16_x16(x),
            Some(Rounding::BF16) => bf16_x16(x),
            None => x,
        };
    }
    x
}

/// 8 values rounded by each of `rounds` in turn ([`rounded_by_x16`] in AVX registers).
///
/// # Safety
/// The CPU has AVX2 and F16C (inlined into a function compiled for them).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn rounded_by_x8(
    x: std::arch::x86_64::__m256,
    rounds: [Option<Rounding>; 2],
) -> std::arch::x86_64::__m256 {
    // No closures or iterator adapters: they would be functions of their own, compiled
    // without the caller's F16C and AVX2, and the intrinsics in them calls.
    let mut x = x;
    for r in [rounds[0], rounds[1]] {
        x = match r {
            Some(Rounding::F16) => f16_x8(x),
            Some(Rounding::BF16) => bf16_x8(x),
            None => x,
        };
    }
    x
}

/// A rounding as a constant of a vector loop's type, so that each rounding (or none) is a
/// loop of its own rather than a choice per vector: [`rounded_x16`]'s `R`.
pub(crate) mod grid {
    pub const NONE: u8 = 0;
    pub const F16: u8 = 1;
    pub const BF16: u8 = 2;

    /// `r` as such a constant.
    pub fn of(r: Option<super::Rounding>) -> u8 {
        match r {
            None => NONE,
            Some(super::Rounding::F16) => F16,
            Some(super::Rounding::BF16) => BF16,
        }
    }
}

/// 16 values rounded as `R` ([`grid`]) says: [`f16_x16`], [`bf16_x16`], or left as they are.
///
/// # Safety
/// The CPU has AVX-512F (the caller is compiled for it, so that this inlines there).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn rounded_x16<const R: u8>(
    x: std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    // SAFETY: the caller's.
    unsafe {
        match R {
            grid::F16 => f16_x16(x),
            grid::BF16 => bf16_x16(x),
            _ => x,
        }
    }
}

/// The mask of the 16 lanes from `at` that lie below `n` (`at < n`): a masked loop's last
/// vector.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn lanes16(at: usize, n: usize) -> std::arch::x86_64::__mmask16 {
    if n - at >= 16 {
        u16::MAX
    } else {
        (1u16 << (n - at)) - 1
    }
}

/// 8 values rounded to float16 and back (`vcvtps2ph`, to nearest even, as [`f16_x16`]).
///
/// # Safety
/// The CPU has F16C.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn f16_x8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

/// 8 values rounded to bfloat16 as [`round_to_bf16`] does it (NaNs unchanged): the AVX2 form
/// of [`bf16_x16`], for kernels that round a weight as they load it.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn bf16_x8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let b = _mm256_castps_si256(x);
    let odd = _mm256_and_si256(_mm256_srli_epi32::<16>(b), _mm256_set1_epi32(1));
    let up = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), odd);
    let r = _mm256_and_si256(up, _mm256_set1_epi32(0xFFFF_0000u32 as i32));
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
    _mm256_blendv_ps(_mm256_castsi256_ps(r), x, nan)
}

/// Every 16 values of `v` rounded in place (to bfloat16 if `BF16`, else float16), the last 1–15
/// through one masked load and store (AVX-512 masks, not the microcoded AVX `vmaskmovps`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn round_slice_avx512<const BF16: bool>(v: &mut [f32]) {
    use std::arch::x86_64::*;
    let round = |x| if BF16 { bf16_x16(x) } else { f16_x16(x) };
    let mut chunks = v.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: `c` holds 16 f32 (unaligned load and store); the feature is enabled.
        unsafe { _mm512_storeu_ps(c.as_mut_ptr(), round(_mm512_loadu_ps(c.as_ptr()))) };
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mask: __mmask16 = (1u16 << rest.len()) - 1;
        // SAFETY: the mask covers the `rest.len()` values of `rest` only (masked-off lanes
        // are neither read nor written).
        unsafe {
            let x = _mm512_maskz_loadu_ps(mask, rest.as_ptr());
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), mask, round(x));
        }
    }
}

/// Rounds a buffer to float16 values: [`round_to_f16`] on every element, through the CPU's
/// float16 conversions (F16C: `vcvtps2ph` with round-to-nearest-even, `vcvtph2ps`) where it
/// has them. Same bits either way (IEEE conversions round as `round_to_f16` does, and both
/// quiet a NaN and keep the top of its payload), and the conversion instructions are two per
/// 8 values where the bit arithmetic takes about 25 per 4: the emulator rounds every tensor a
/// float16 layer writes. (Keeping NaNs unchanged instead took a blend that LLVM turns into a
/// masked store, microcoded on AMD: 7× slower.) With AVX-512, 16 values per conversion: half
/// the time per value (0.021 against 0.042 ns on an L1-resident 2 Ki buffer, Zen 5).
pub fn round_slice_to_f16(v: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has the feature the function was compiled for.
        return unsafe { round_slice_avx512::<false>(v) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the CPU has the features the function was compiled for.
        return unsafe { round_slice_to_f16_f16c(v) };
    }
    v.iter_mut().for_each(|x| *x = round_to_f16(*x));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn round_slice_to_f16_f16c(v: &mut [f32]) {
    use std::arch::x86_64::*;
    // Eight values to float16 and back, in place.
    let round8 = |c: &mut [f32; 8]| {
        // SAFETY: `c` holds 8 f32 (unaligned loads and stores); the features are enabled.
        unsafe {
            let x = _mm256_loadu_ps(c.as_ptr());
            let r = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x));
            _mm256_storeu_ps(c.as_mut_ptr(), r);
        }
    };
    let mut chunks = v.chunks_exact_mut(8);
    for c in &mut chunks {
        round8(c.try_into().expect("8 values"));
    }
    // The last 1–7 values through one more conversion of a stack copy: an epilogue rounds
    // planes as short as 4 values (Silero's convolutions), where the bit arithmetic per value
    // was 17 % of an emulated float16 run.
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let mut buf = [0f32; 8];
        buf[..rest.len()].copy_from_slice(rest);
        round8(&mut buf);
        rest.copy_from_slice(&buf[..rest.len()]);
    }
}

/// `f16::from_f32(x).to_f32()` without leaving f32: round-to-nearest-even by integer
/// arithmetic on the bits, which the compiler vectorizes (the emulator's hottest loop).
/// Tested against `half` over every f16 boundary and millions of values.
#[inline]
pub fn round_to_f16(x: f32) -> f32 {
    // Branch-free (selects, not jumps) so that slice loops vectorize.
    let a = x.abs();
    let b = x.to_bits();
    let normal = f32::from_bits(b.wrapping_add(0x0FFF + ((b >> 13) & 1)) & !0x1FFF);
    // f16 subnormals (and zero) sit on a fixed grid of 2^-24: scale (exactly), round to an
    // integer with the 1.5·2^23 trick (round-to-nearest-even in f32), scale back.
    let y = x * 16_777_216.0;
    let sub = (((y + 12_582_912.0) - 12_582_912.0) * (1.0 / 16_777_216.0)).copysign(x);
    let r = if a < 6.103_515_6e-5 { sub } else { normal };
    // 65520 is the tie between 65504 and 2^16, which rounds to even: overflow.
    let r = if a >= 65520.0 {
        f32::INFINITY.copysign(x)
    } else {
        r
    };
    // A NaN is quieted and keeps the top 9 bits of its payload, as the IEEE conversion to
    // float16 and back (F16C, `half`) gives it.
    if x.is_nan() {
        f32::from_bits((b | 0x0040_0000) & !0x1FFF)
    } else {
        r
    }
}

/// `float8::F8E4M3::from_f32(x).to_f32()` (the `fn` variant: no infinity, saturating at ±448;
/// NaN → the crate's canonical NaN, `0x7FFF_E000`) without its per-value branches, so that
/// quantization loops vectorize: fp8 fake quantization through the crate was 6–12× an FP32
/// run (2026-11-27). Tested against the crate over every 61st f32 bit pattern.
#[inline(always)]
pub fn round_to_fp8e4m3(x: f32) -> f32 {
    round_to_fp8(x.clamp(-448.0, 448.0), 127 - 6, 20)
}

/// `float8::F8E5M2::from_f32(x).to_f32()` below 61440 in magnitude and for ±inf (which the
/// crate saturates to ±57344); finite values from 61440 on (the tie above 57344) overflow to
/// ±inf, as native e5m2 arithmetic does. NaN → `0x7FFF_E000`. See [`round_to_fp8e4m3`].
#[inline(always)]
pub fn round_to_fp8e5m2(x: f32) -> f32 {
    let r = round_to_fp8(x.clamp(-57344.0, 57344.0), 127 - 14, 21);
    if x.is_finite() && x.abs() >= 61440.0 {
        f32::INFINITY.copysign(x)
    } else {
        r
    }
}

/// `x` (finite, within the format's range, or NaN) rounded to nearest even on a grid of
/// `23 − drop` significant bits with `min_exp` the smallest normal exponent (biased): adding
/// `m = 2^(max(e, min_exp) + drop)`, whose ulp is the format's step at `x`, rounds in the f32
/// addition itself, and subtracting it again is exact (below the smallest normal the step is
/// fixed, as the format's subnormals are). The sign goes back on at the end (a value that
/// rounds to zero keeps it, as the crate's conversion does).
#[inline(always)]
fn round_to_fp8(x: f32, min_exp: u32, drop: u32) -> f32 {
    let b = x.to_bits();
    let e = (b & 0x7F80_0000).max(min_exp << 23);
    let m = f32::from_bits(e.wrapping_add(drop << 23));
    let a = f32::from_bits(b & 0x7FFF_FFFF);
    let r = f32::from_bits(((a + m) - m).to_bits() | (b & 0x8000_0000));
    if x.is_nan() {
        f32::from_bits(0x7FFF_E000)
    } else {
        r
    }
}

/// `bf16::from_f32(x).to_f32()` by integer arithmetic on the bits (see [`round_to_f16`]).
#[inline]
pub fn round_to_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let b = x.to_bits();
    // A carry out of the exponent turns the largest values into ±inf, as it should.
    f32::from_bits((b.wrapping_add(0x7FFF + ((b >> 16) & 1))) & 0xFFFF_0000)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each float16 and bfloat16 slice path this CPU has (the dispatch picks one; the others
    /// run on other machines) gives the scalar rounding's bits, on whole vectors and on every
    /// tail length.
    #[test]
    fn every_slice_rounding_path_gives_the_scalar_bits() {
        // Every 8191st f32 bit pattern: all exponents, both signs, NaNs, subnormals, ties.
        let values: Vec<f32> = (0..=u32::MAX / 8191)
            .map(|i| f32::from_bits(i.wrapping_mul(8191)))
            .chain([65504.0, 65519.99, 65520.0, -65520.0, 6.1e-5, 2.98e-8, -0.0])
            .chain([f32::MAX, 3.3961776e38, f32::from_bits(0x7f80_0001)])
            .collect();
        /// A path's name, the path and the scalar rule it must equal.
        type Path = (&'static str, unsafe fn(&mut [f32]), fn(f32) -> f32);
        let mut paths: Vec<Path> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx") && has!("f16c") {
                paths.push(("f16c", round_slice_to_f16_f16c, round_to_f16));
            }
            if has!("avx512f") {
                paths.push(("avx512", round_slice_avx512::<false>, round_to_f16));
                paths.push(("avx512 bf16", round_slice_avx512::<true>, round_to_bf16));
            }
        }
        paths.push(("dispatch", |v| round_slice_to_f16(v), round_to_f16));
        paths.push(("dispatch bf16", |v| round_slice_to_bf16(v), round_to_bf16));
        for (name, path, scalar) in paths {
            // The whole set, then pieces of 1–17 values (every tail length).
            let pieces = (1..=17).flat_map(|len| values[..4096].chunks(len));
            for part in std::iter::once(&values[..]).chain(pieces) {
                let mut got = part.to_vec();
                // SAFETY: only paths whose features the CPU has are listed.
                unsafe { path(&mut got) };
                for (x, g) in part.iter().zip(&got) {
                    let want = scalar(*x).to_bits();
                    assert_eq!(g.to_bits(), want, "{name}: {x:e} ({:#x})", x.to_bits());
                }
            }
        }
    }

    /// The branch-free fp8 roundings give the `float8` crate's bits (e5m2 with its overflow
    /// rule) on every 61st f32 bit pattern and on every fp8 value, midpoint and neighbour.
    #[test]
    fn fp8_rounding_equals_the_float8_crate() {
        let e4m3 = |x: f32| float8::F8E4M3::from_f32(x).to_f32();
        let e5m2 = |x: f32| {
            if x.is_finite() && x.abs() >= 61440.0 {
                f32::INFINITY.copysign(x)
            } else {
                float8::F8E5M2::from_f32(x).to_f32()
            }
        };
        // Every fp8 value, the midpoints between neighbours and one f32 step either side.
        let mut special = Vec::new();
        for bits in 0..=255u8 {
            for v in [
                float8::F8E4M3::from_bits(bits).to_f32(),
                float8::F8E5M2::from_bits(bits).to_f32(),
            ] {
                let next = f32::from_bits(v.to_bits().wrapping_add(1));
                special.extend([v, next, f32::from_bits(v.to_bits().wrapping_sub(1))]);
            }
            let (a, b) = (
                float8::F8E4M3::from_bits(bits).to_f32(),
                float8::F8E4M3::from_bits(bits.wrapping_add(1)).to_f32(),
            );
            special.push((a + b) / 2.0);
        }
        let all = (0..=u32::MAX / 61).map(|i| f32::from_bits(i * 61));
        for x in all
            .chain(special)
            .chain([61440.0, -61440.0, 61439.996, 464.0, -464.0])
        {
            for (name, fast, slow) in [
                (
                    "e4m3",
                    round_to_fp8e4m3 as fn(f32) -> f32,
                    &e4m3 as &dyn Fn(f32) -> f32,
                ),
                ("e5m2", round_to_fp8e5m2, &e5m2),
            ] {
                let (got, want) = (fast(x), slow(x));
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{name} {x:e} ({:#x})",
                    x.to_bits()
                );
            }
        }
    }
}
