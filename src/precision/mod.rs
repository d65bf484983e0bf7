//! Precisions a layer can run in, and faithful rounding of f32 values into each float type.
//!
//! This is the rounding primitive of the numerics model (docs/numerics.md): round to nearest
//! even, overflow to ±inf where the type has infinities (float16, bfloat16, fp8e5m2), NaN
//! propagated. fp8e4m3 has no infinity: values beyond ±448 saturate, as TensorRT's and ONNX's
//! saturating FP8 conversion does; callers scale into range before converting (fp8 layers are
//! scaled like int8).

pub mod fusion;
pub mod plan;
pub mod quant;
pub mod summary;

use crate::error::{Error, Result};
use half::bf16;
use serde::Serialize;

/// The precision of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Float32,
    Float16,
    BFloat16,
    Fp8E4M3,
    Fp8E5M2,
    Int8,
}

impl Precision {
    pub const ALL: [Precision; 6] = [
        Precision::Float32,
        Precision::Float16,
        Precision::BFloat16,
        Precision::Fp8E4M3,
        Precision::Fp8E5M2,
        Precision::Int8,
    ];

    /// Parses the names Polygraphy and TensorRT users write (`float32`, `fp16`, `half`, `int8`...).
    pub fn parse(s: &str) -> Result<Precision> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "float32" | "fp32" | "float" => Precision::Float32,
            "float16" | "fp16" | "half" => Precision::Float16,
            "bfloat16" | "bf16" => Precision::BFloat16,
            "fp8e4m3" | "fp8" | "float8e4m3" | "float8e4m3fn" | "e4m3" => Precision::Fp8E4M3,
            "fp8e5m2" | "float8e5m2" | "e5m2" => Precision::Fp8E5M2,
            "int8" => Precision::Int8,
            _ => {
                return Err(Error::Invalid(format!(
                    "unknown precision '{s}': valid are float32, float16, bfloat16, fp8e4m3, fp8e5m2, int8"
                )))
            }
        })
    }

    /// The canonical name (Polygraphy's `--layer-precisions` spelling).
    pub fn name(self) -> &'static str {
        match self {
            Precision::Float32 => "float32",
            Precision::Float16 => "float16",
            Precision::BFloat16 => "bfloat16",
            Precision::Fp8E4M3 => "fp8e4m3",
            Precision::Fp8E5M2 => "fp8e5m2",
            Precision::Int8 => "int8",
        }
    }

    /// The 16-bit float precision values of element type `d` are in (float16, bfloat16), if
    /// `d` is one of those: a strongly typed 16-bit model's layers compute in it.
    pub fn of_16bit_dtype(d: crate::tensor::DType) -> Option<Precision> {
        match d {
            crate::tensor::DType::F16 => Some(Precision::Float16),
            crate::tensor::DType::BF16 => Some(Precision::BFloat16),
            _ => None,
        }
    }

    /// The element type that stores values of this precision when it is a 16-bit float one.
    pub fn dtype_16bit(self) -> Option<crate::tensor::DType> {
        match self {
            Precision::Float16 => Some(crate::tensor::DType::F16),
            Precision::BFloat16 => Some(crate::tensor::DType::BF16),
            _ => None,
        }
    }

    /// Largest finite value (for the scaled types: the quantization range).
    pub fn max_finite(self) -> f32 {
        match self {
            Precision::Float32 => f32::MAX,
            Precision::Float16 => 65504.0,
            Precision::BFloat16 => bf16::MAX.to_f32(),
            Precision::Fp8E4M3 => 448.0,
            Precision::Fp8E5M2 => 57344.0,
            Precision::Int8 => 127.0,
        }
    }

    /// True for types that use a calibrated scale (int8 and both fp8 types).
    pub fn is_scaled(self) -> bool {
        matches!(
            self,
            Precision::Int8 | Precision::Fp8E4M3 | Precision::Fp8E5M2
        )
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The accumulator of matmul and conv kernels lives in [`crate::numeric`] (ops use it, and
/// `precision` depends on `ops`, not the other way round).
pub use crate::numeric::Accumulator;

/// Whether an op has int8/fp8 kernels (others fall back to a float type under `--int8`/`--fp8`);
/// read from the op's definition.
pub fn has_quantized_kernel(node: &crate::graph::Node) -> bool {
    crate::ops::def_of(node).is_some_and(|d| d.has_quantized_kernel())
}

/// Whether input `index` of an op carries the layer's data type, i.e. is converted to the
/// layer's precision: data and bias inputs do, and so do the scales of weight-only quantized
/// ops, typed as their activation (`InputRole::WeightScale`); other scales, zero points and
/// parameters keep their type (ONNX gives them their own). Integer and bool inputs never are
/// (callers check the dtype). Read from the op's input roles.
pub fn input_follows_layer_precision(node: &crate::graph::Node, index: usize) -> bool {
    use crate::ops::InputRole;
    crate::ops::def_of(node).is_none_or(|d| {
        matches!(
            d.role(index),
            InputRole::Data | InputRole::Bias | InputRole::WeightScale
        )
    })
}

/// Rounds one f32 to the nearest value representable in `p` (int8: to the integer grid,
/// clamped to [-128, 127], no scaling: callers divide by the scale first).
#[inline]
pub fn round_value(p: Precision, x: f32) -> f32 {
    match p {
        Precision::Float32 => x,
        Precision::Float16 => round_to_f16(x),
        Precision::BFloat16 => round_to_bf16(x),
        Precision::Fp8E4M3 => crate::numeric::round_to_fp8e4m3(x),
        // float8's conversion saturates; e5m2 has infinities, so finite overflow goes to ±inf
        // (the non-saturating behaviour native e5m2 arithmetic has).
        Precision::Fp8E5M2 => crate::numeric::round_to_fp8e5m2(x),
        Precision::Int8 => {
            if x.is_nan() {
                0.0
            } else {
                round_half_even(x).clamp(-128.0, 127.0)
            }
        }
    }
}

pub use crate::numeric::{round_to_bf16, round_to_f16};

impl Precision {
    /// The kernels' rounding of a 16-bit float precision (what a layer in it rounds its
    /// float32 outputs to); None for every other precision.
    pub fn float_rounding(self) -> Option<crate::numeric::Rounding> {
        match self {
            Precision::Float16 => Some(crate::numeric::Rounding::F16),
            Precision::BFloat16 => Some(crate::numeric::Rounding::BF16),
            _ => None,
        }
    }
}

/// Rounds every value of a buffer in place.
pub fn round_slice(p: Precision, v: &mut [f32]) {
    match p {
        Precision::Float32 => {}
        Precision::Float16 => crate::numeric::Rounding::F16.round_slice(v),
        Precision::BFloat16 => crate::numeric::Rounding::BF16.round_slice(v),
        _ => v.iter_mut().for_each(|x| *x = round_value(p, *x)),
    }
}

/// TensorRT's conversion of a float32 weight to a float16 layer's type: finite values that
/// would round to ±inf (|x| ≥ 65520, the tie that rounds up to 2^16) become ±65504, the closest
/// finite float16 ("Finite FP32 values which would overflow in FP16 detected. Converting to
/// closest finite FP16 value.", TensorRT's builder warning; docs/numerics.md, "Weights beyond
/// float16's range"). ±inf and NaN are kept, as TensorRT's "finite" says, and so is every
/// value in range: rounding them afterwards gives what a plain conversion gives. Returns how
/// many values were clamped.
pub fn clamp_finite_to_f16(v: &mut [f32]) -> usize {
    const OVERFLOWS: f32 = 65520.0;
    let max = Precision::Float16.max_finite();
    let mut n = 0;
    for x in v.iter_mut() {
        if x.is_finite() && x.abs() >= OVERFLOWS {
            *x = max.copysign(*x);
            n += 1;
        }
    }
    n
}

/// Round half to even (banker's rounding), as `QuantizeLinear` and TensorRT use. Branch-free,
/// so quantization loops vectorize: below 2²³ adding 2²³ leaves no fraction bits, and the
/// addition rounds to nearest even; from 2²³ on every f32 is an integer (and NaN, ±inf pass
/// through). The sign is kept, so −0.4 and −0.5 → −0: IEEE 754's roundTiesToEven
/// (`f32::round_ties_even`, which the baseline x86-64 target can only call out of line).
#[inline]
pub fn round_half_even(x: f32) -> f32 {
    const TWO_23: f32 = 8_388_608.0;
    let a = x.abs();
    let r = ((a + TWO_23) - TWO_23).copysign(x);
    if a < TWO_23 {
        r
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn finite_weights_beyond_f16_clamp_to_its_largest_value() {
        let mut v = vec![
            -3.402_823_5e38,
            3.402_823_5e38,
            65520.0,
            -65520.0,
            65519.0,
            65504.0,
            1.5,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        assert_eq!(clamp_finite_to_f16(&mut v), 4);
        assert_eq!(
            &v[..7],
            &[-65504.0, 65504.0, 65504.0, -65504.0, 65519.0, 65504.0, 1.5]
        );
        assert_eq!(v[7], f32::INFINITY);
        assert_eq!(v[8], f32::NEG_INFINITY);
        assert!(v[9].is_nan());
        // Rounded afterwards, nothing overflows: 65519 rounds to 65504 as before.
        round_slice(Precision::Float16, &mut v);
        assert!(v[..7].iter().all(|x| x.is_finite()));
    }

    #[test]
    fn fp16_rounding_and_overflow() {
        assert_eq!(round_value(Precision::Float16, 65504.0 + 1.5), 65504.0);
        // 65520 is the midpoint between 65504 and the next (unrepresentable) step: rounds to inf.
        assert!(round_value(Precision::Float16, 65520.0).is_infinite());
        assert_eq!(round_value(Precision::Float16, 65519.0), 65504.0);
        // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even mantissa wins (1).
        assert_eq!(round_value(Precision::Float16, 1.0 + 2f32.powi(-11)), 1.0);
        assert!(round_value(Precision::Float16, f32::NAN).is_nan());
    }

    /// A recurrent kernel's state rounding (`numeric::StateType`, for `ops`) is this module's
    /// rounding, bit for bit.
    #[test]
    fn state_rounding_equals_round_value() {
        use crate::numeric::StateType;
        for i in 0..200_000u32 {
            let x = f32::from_bits(i.wrapping_mul(2_654_435_761));
            for (st, p) in [
                (StateType::F16, Precision::Float16),
                (StateType::BF16, Precision::BFloat16),
                (StateType::F32, Precision::Float32),
            ] {
                let (a, b) = (st.round(x), round_value(p, x));
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{x:e}: {a:e} vs {b:e} ({p:?})"
                );
            }
        }
    }

    #[test]
    fn fast_rounding_equals_half_everywhere() {
        // Every f16 value, the midpoints between neighbours and points just around them,
        // plus a sweep over all f32 exponents.
        let check = |x: f32| {
            let want16 = f16::from_f32(x).to_f32();
            let got16 = round_to_f16(x);
            // Bit for bit, NaN payloads included.
            assert!(
                want16.to_bits() == got16.to_bits(),
                "f16 {x:e} ({:#x}): half {want16:e}, fast {got16:e}",
                x.to_bits()
            );
            let wantb = bf16::from_f32(x).to_f32();
            let gotb = round_to_bf16(x);
            assert!(
                wantb.to_bits() == gotb.to_bits() || (wantb.is_nan() && gotb.is_nan()),
                "bf16 {x:e}: half {wantb:e}, fast {gotb:e}"
            );
        };
        for bits in 0u16..=u16::MAX {
            let v = f16::from_bits(bits).to_f32();
            let next = f16::from_bits(bits.wrapping_add(1)).to_f32();
            check(v);
            if v.is_finite() && next.is_finite() && next.abs() > v.abs() {
                let mid = ((v as f64 + next as f64) / 2.0) as f32;
                for d in [-2i32, -1, 0, 1, 2] {
                    check(f32::from_bits((mid.to_bits() as i32 + d) as u32));
                }
            }
        }
        let mut r = crate::data::loader::Mt19937::new(9);
        for _ in 0..2_000_000 {
            check(f32::from_bits(r.next_u32()));
        }
        for x in [
            f32::MAX,
            f32::MIN_POSITIVE,
            65519.99,
            65520.0,
            -65520.0,
            f32::INFINITY,
            3.4e38,
        ] {
            check(x);
        }
    }

    #[test]
    fn slice_rounding_equals_the_scalar_rounding_bit_for_bit() {
        // Every 61st f32 bit pattern (70 million values: all exponents, both signs, NaNs with
        // payloads, subnormals), through the slice path (F16C where the CPU has it).
        let all: Vec<f32> = (0..=u32::MAX / 61)
            .map(|i| f32::from_bits(i * 61))
            .collect();
        // Whole vectors, then slices of 7 and 3 (only the tail path: an epilogue's short
        // planes).
        let short = all[..1 << 20]
            .chunks(7)
            .chain(all[1 << 20..2 << 20].chunks(3));
        for part in all.chunks(1 << 20).chain(short) {
            let mut got = part.to_vec();
            round_slice(Precision::Float16, &mut got);
            for (x, g) in part.iter().zip(&got) {
                let want = round_to_f16(*x);
                assert_eq!(g.to_bits(), want.to_bits(), "{x:e} ({:#x})", x.to_bits());
            }
        }
    }

    #[test]
    fn round_half_even_is_ieee_round_ties_even() {
        let textbook = f32::round_ties_even;
        let mut r = crate::data::loader::Mt19937::new(3);
        let halves = (-600..600).map(|i| i as f32 * 0.5);
        let near = (0..200_000).map(|_| (r.next_u32() as f32 / 4e6) - 512.0);
        let any = (0..2_000_000).map(|i| f32::from_bits(i * 2147));
        for x in halves.chain(near).chain(any).chain([
            8_388_607.5,
            -8_388_607.5,
            8_388_608.0,
            16_777_217.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            -0.4,
        ]) {
            let (got, want) = (round_half_even(x), textbook(x));
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{x:e}: {got:e}, textbook {want:e}"
            );
        }
    }

    #[test]
    fn bf16_rounding() {
        // bf16 has 7 mantissa bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1 (even).
        assert_eq!(round_value(Precision::BFloat16, 1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(
            round_value(Precision::BFloat16, 1.0 + 3.0 * 2f32.powi(-8)),
            1.0 + 2.0 * 2f32.powi(-7)
        );
    }

    #[test]
    fn fp8_ranges() {
        assert_eq!(round_value(Precision::Fp8E4M3, 1000.0), 448.0);
        assert_eq!(round_value(Precision::Fp8E4M3, 1.0625), 1.0); // 3 mantissa bits: tie -> even
        assert_eq!(round_value(Precision::Fp8E5M2, 57344.0), 57344.0);
        assert!(round_value(Precision::Fp8E5M2, 70000.0).is_infinite());
    }

    #[test]
    fn int8_grid() {
        assert_eq!(round_value(Precision::Int8, 2.5), 2.0);
        assert_eq!(round_value(Precision::Int8, 3.5), 4.0);
        assert_eq!(round_value(Precision::Int8, -2.5), -2.0);
        assert_eq!(round_value(Precision::Int8, 300.0), 127.0);
        assert_eq!(round_value(Precision::Int8, -300.0), -128.0);
    }

    #[test]
    fn names_parse() {
        for p in Precision::ALL {
            assert_eq!(Precision::parse(p.name()).unwrap(), p);
        }
        assert!(Precision::parse("float64").is_err());
    }
}
