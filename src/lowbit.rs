//! The 8- and 4-bit element types of ONNX: float8e4m3fn, float8e4m3fnuz, float8e5m2,
//! float8e5m2fnuz (`TensorProto` codes 17–20), uint4, int4 (21, 22) and float4e2m1 (23).
//!
//! In memory every element takes one byte (its bit pattern; 4-bit types in the low nibble);
//! ONNX files pack 4-bit elements two per byte, low nibble first ([`pack_nibbles`],
//! [`unpack_nibbles`]). Conversions from wider floats round to nearest even in one step (from
//! the f64 value, which holds every f32/f16/bf16 exactly) and follow ONNX's Cast tables
//! (onnx.proto's `DataType` comments and the Cast operator's "saturate" tables, whose reference
//! implementation is `ml_dtypes`):
//!
//! | input                | e4m3fn     | e4m3fnuz | e5m2       | e5m2fnuz | e2m1 (fp4)        |
//! | -------------------- | ---------- | -------- | ---------- | -------- | ----------------- |
//! | ±0                   | ±0         | +0       | ±0         | +0       | ±0                |
//! | NaN                  | NaN (sign kept) | NaN (0x80) | NaN (sign kept) | NaN (0x80) | ∓0 (as ml_dtypes) |
//! | ±inf, saturate       | ±max       | ±max     | ±max       | ±max     | ±6                |
//! | ±inf, no saturate    | NaN        | NaN      | ±inf       | NaN      | ±6                |
//! | rounded > max, sat.  | ±max       | ±max     | ±max       | ±max     | ±6                |
//! | rounded > max, no sat. | NaN      | NaN      | ±inf       | NaN      | ±6                |
//!
//! Largest finite values: e4m3fn 448, e4m3fnuz 240, e5m2 and e5m2fnuz 57344, e2m1 6. float4
//! has no NaN or infinity and always saturates (ONNX's `saturate` attribute is for float8).
//! int4/uint4 conversions from other integers keep the low 4 bits (ONNX Cast: "discard higher
//! bits"); QuantizeLinear clamps to [-8, 7] / [0, 15] instead.
//!
//! Tested here on every code and on the rounding ties, and against `ml_dtypes` (the ONNX
//! reference's implementation) on every float16 value in `tests/integration/dtypes.rs`.

/// How a small float format spends its special encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Specials {
    /// IEEE style (e5m2): exponent all ones is inf (mantissa 0) or NaN.
    Ieee,
    /// "fn" (e4m3fn): finite except S.1111.111, which is NaN; no infinity.
    Fn,
    /// "fnuz" (e4m3fnuz, e5m2fnuz): 0x80 (negative zero's code) is the only NaN; no -0, no inf.
    Fnuz,
    /// No NaN, no infinity (e2m1).
    Finite,
}

/// A small binary float format: 1 sign bit, `exp` exponent bits, `man` mantissa bits.
#[derive(Clone, Copy, Debug)]
struct Format {
    exp: u32,
    man: u32,
    bias: i32,
    specials: Specials,
    /// Largest finite code (sign bit clear).
    max_code: u8,
}

const E4M3FN: Format = Format {
    exp: 4,
    man: 3,
    bias: 7,
    specials: Specials::Fn,
    max_code: 0x7E,
};
const E4M3FNUZ: Format = Format {
    exp: 4,
    man: 3,
    bias: 8,
    specials: Specials::Fnuz,
    max_code: 0x7F,
};
const E5M2: Format = Format {
    exp: 5,
    man: 2,
    bias: 15,
    specials: Specials::Ieee,
    max_code: 0x7B,
};
const E5M2FNUZ: Format = Format {
    exp: 5,
    man: 2,
    bias: 16,
    specials: Specials::Fnuz,
    max_code: 0x7F,
};
const E2M1: Format = Format {
    exp: 2,
    man: 1,
    bias: 1,
    specials: Specials::Finite,
    max_code: 0x7,
};

impl Format {
    const fn sign_bit(&self) -> u8 {
        1 << (self.exp + self.man)
    }

    fn nan(&self, negative: bool) -> u8 {
        let s = if negative { self.sign_bit() } else { 0 };
        match self.specials {
            Specials::Fn => 0x7F | s,
            // ml_dtypes writes the quiet NaN with the top mantissa bit set.
            Specials::Ieee => 0x7E | s,
            Specials::Fnuz => 0x80,
            // No NaN: ml_dtypes (the ONNX reference) produces zero with the sign flipped.
            Specials::Finite => s ^ self.sign_bit(),
        }
    }

    /// The code of an out-of-range value (after rounding) of the given sign.
    fn overflow(&self, negative: bool, saturate: bool) -> u8 {
        let s = if negative { self.sign_bit() } else { 0 };
        match (self.specials, saturate) {
            (Specials::Finite, _) | (_, true) => self.max_code | s,
            (Specials::Ieee, false) => 0x7C | s,
            (Specials::Fn, false) | (Specials::Fnuz, false) => self.nan(negative),
        }
    }

    /// Rounds `x` to nearest even and encodes it.
    fn encode(&self, x: f64, saturate: bool) -> u8 {
        let negative = x.is_sign_negative();
        if x.is_nan() {
            return self.nan(negative);
        }
        let s = if negative { self.sign_bit() } else { 0 };
        if x.is_infinite() {
            return self.overflow(negative, saturate);
        }
        let a = x.abs();
        let emin = 1 - self.bias; // exponent of the smallest normal
        let min_sub = (2f64).powi(emin - self.man as i32);
        // At or below half the smallest subnormal: rounds to zero (the tie goes to even 0).
        if a <= min_sub / 2.0 {
            // fnuz has no negative zero: its code is the NaN.
            return if self.specials == Specials::Fnuz {
                0
            } else {
                s
            };
        }
        // The value's binary exponent (a is a normal f64 here: a > 2^-30).
        let e = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
        let mut q = e.max(emin) - self.man as i32; // exponent of one unit in the last place
        let mut r = (a * (2f64).powi(-q)).round_ties_even(); // exact scaling, then RNE
        let one = (1u64 << self.man) as f64;
        if r >= 2.0 * one {
            // Rounded up into the next binade.
            r /= 2.0;
            q += 1;
        }
        let (exp_field, mant) = if r >= one {
            (q + self.man as i32 + self.bias, (r - one) as u32)
        } else {
            (0, r as u32) // subnormal (q is emin - man)
        };
        let max_exp = (self.max_code >> self.man) as i32;
        let max_mant = (self.max_code as u32) & ((1 << self.man) - 1);
        if exp_field > max_exp || (exp_field == max_exp && mant > max_mant) {
            return self.overflow(negative, saturate);
        }
        s | ((exp_field as u8) << self.man) | mant as u8
    }

    /// The exact value of a code.
    fn decode(&self, code: u8) -> f32 {
        let sign_bit = self.sign_bit();
        let code = code & (sign_bit | (sign_bit - 1));
        let negative = code & sign_bit != 0;
        let mag = code & !sign_bit;
        match self.specials {
            Specials::Fn if mag == 0x7F => return f32::NAN,
            Specials::Fnuz if code == 0x80 => return f32::NAN,
            Specials::Ieee if mag >= 0x7C => {
                return if mag == 0x7C {
                    if negative {
                        f32::NEG_INFINITY
                    } else {
                        f32::INFINITY
                    }
                } else {
                    f32::NAN
                }
            }
            _ => {}
        }
        let exp_field = (mag >> self.man) as i32;
        let mant = (mag & ((1 << self.man) - 1)) as f32;
        let v = if exp_field == 0 {
            mant * (2f32).powi(1 - self.bias - self.man as i32)
        } else {
            (mant + (1u32 << self.man) as f32)
                * (2f32).powi(exp_field - self.bias - self.man as i32)
        };
        if negative {
            -v
        } else {
            v
        }
    }
}

macro_rules! small_float {
    ($(#[$doc:meta])* $name:ident, $fmt:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        #[repr(transparent)]
        pub struct $name(u8);

        impl $name {
            /// The element with this bit pattern.
            pub const fn from_bits(bits: u8) -> Self {
                $name(bits)
            }

            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// Rounds to nearest even; out-of-range values saturate to the largest finite
            /// value when `saturate` (ONNX's default), else become inf/NaN (module table).
            pub fn from_f64(x: f64, saturate: bool) -> Self {
                $name($fmt.encode(x, saturate))
            }

            pub fn from_f32(x: f32, saturate: bool) -> Self {
                Self::from_f64(x as f64, saturate)
            }

            /// The exact value (NaN codes give NaN).
            pub fn to_f32(self) -> f32 {
                $fmt.decode(self.0)
            }

            pub fn to_f64(self) -> f64 {
                self.to_f32() as f64
            }

            pub fn is_nan(self) -> bool {
                self.to_f32().is_nan()
            }

            /// Largest finite value.
            pub fn max_finite() -> f32 {
                $fmt.decode($fmt.max_code)
            }
        }
    };
}

small_float!(
    /// float8e4m3fn: bias 7, max 448, NaN but no infinity.
    F8E4M3FN,
    E4M3FN
);
small_float!(
    /// float8e4m3fnuz: bias 8, max 240, one NaN (0x80), no -0, no infinity.
    F8E4M3FNUZ,
    E4M3FNUZ
);
small_float!(
    /// float8e5m2: bias 15, max 57344, IEEE infinities and NaNs.
    F8E5M2,
    E5M2
);
small_float!(
    /// float8e5m2fnuz: bias 16, max 57344, one NaN (0x80), no -0, no infinity.
    F8E5M2FNUZ,
    E5M2FNUZ
);
small_float!(
    /// float4e2m1: bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; code in the
    /// low nibble.
    F4E2M1,
    E2M1
);

// SAFETY: the float8 types are a transparent u8 and every bit pattern is a value, so their
// stored bytes can be read in place (crate::tensor::Buf::from_le_bytes).
unsafe impl crate::tensor::Plain for F8E4M3FN {}
unsafe impl crate::tensor::Plain for F8E4M3FNUZ {}
unsafe impl crate::tensor::Plain for F8E5M2 {}
unsafe impl crate::tensor::Plain for F8E5M2FNUZ {}

/// int4: a two's-complement 4-bit integer in [-8, 7].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct I4(i8);

impl I4 {
    /// Keeps the low 4 bits (two's complement), as ONNX Cast does for out-of-range integers.
    pub const fn wrapping(v: i64) -> I4 {
        I4((((v as u64 & 0xF) as i8) << 4) >> 4)
    }

    /// Clamps to [-8, 7], as QuantizeLinear does.
    pub const fn saturating(v: i64) -> I4 {
        I4(if v < -8 {
            -8
        } else if v > 7 {
            7
        } else {
            v as i8
        })
    }

    pub const fn get(self) -> i8 {
        self.0
    }

    /// From the low nibble of a packed byte.
    pub const fn from_bits(nibble: u8) -> I4 {
        I4::wrapping(nibble as i64)
    }

    /// The 4-bit pattern in the low nibble.
    pub const fn to_bits(self) -> u8 {
        self.0 as u8 & 0xF
    }
}

/// uint4: an unsigned 4-bit integer in [0, 15].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct U4(u8);

impl U4 {
    /// Keeps the low 4 bits, as ONNX Cast does for out-of-range integers.
    pub const fn wrapping(v: i64) -> U4 {
        U4((v as u64 & 0xF) as u8)
    }

    /// Clamps to [0, 15], as QuantizeLinear does.
    pub const fn saturating(v: i64) -> U4 {
        U4(if v < 0 {
            0
        } else if v > 15 {
            15
        } else {
            v as u8
        })
    }

    pub const fn get(self) -> u8 {
        self.0
    }

    pub const fn from_bits(nibble: u8) -> U4 {
        U4(nibble & 0xF)
    }

    pub const fn to_bits(self) -> u8 {
        self.0
    }
}

/// The float8 tensor of one code byte per element (`dtype` one of the four float8 types;
/// None for any other type).
pub fn fp8_from_bits(
    dtype: crate::tensor::DType,
    bytes: &[u8],
) -> Option<crate::tensor::TensorData> {
    use crate::tensor::{DType, TensorData};
    Some(match dtype {
        DType::F8E4M3FN => {
            TensorData::F8E4M3FN(bytes.iter().map(|&b| F8E4M3FN::from_bits(b)).collect())
        }
        DType::F8E4M3FNUZ => {
            TensorData::F8E4M3FNUZ(bytes.iter().map(|&b| F8E4M3FNUZ::from_bits(b)).collect())
        }
        DType::F8E5M2 => TensorData::F8E5M2(bytes.iter().map(|&b| F8E5M2::from_bits(b)).collect()),
        DType::F8E5M2FNUZ => {
            TensorData::F8E5M2FNUZ(bytes.iter().map(|&b| F8E5M2FNUZ::from_bits(b)).collect())
        }
        _ => return None,
    })
}

/// Packs 4-bit codes two per byte, the first element in the low nibble (onnx.proto; an odd
/// count leaves the last high nibble zero).
pub fn pack_nibbles(codes: impl ExactSizeIterator<Item = u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(codes.len().div_ceil(2));
    let mut pending: Option<u8> = None;
    for c in codes {
        match pending.take() {
            None => pending = Some(c & 0xF),
            Some(lo) => out.push(lo | (c & 0xF) << 4),
        }
    }
    if let Some(lo) = pending {
        out.push(lo);
    }
    out
}

/// The first `n` 4-bit codes of packed bytes (low nibble first). The caller checks that
/// `bytes` holds `n.div_ceil(2)` bytes.
pub fn unpack_nibbles(bytes: &[u8], n: usize) -> Vec<u8> {
    bytes
        .iter()
        .flat_map(|&b| [b & 0xF, b >> 4])
        .take(n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_codes() -> impl Iterator<Item = u8> {
        0..=255u8
    }

    #[test]
    fn every_fp8_code_round_trips() {
        for c in all_codes() {
            for (name, fmt) in [
                ("e4m3fn", E4M3FN),
                ("e4m3fnuz", E4M3FNUZ),
                ("e5m2", E5M2),
                ("e5m2fnuz", E5M2FNUZ),
            ] {
                let v = fmt.decode(c);
                if v.is_nan() {
                    assert!(fmt.decode(fmt.encode(v as f64, false)).is_nan());
                    continue;
                }
                if fmt.specials == Specials::Fnuz && c == 0 {
                    assert_eq!(fmt.encode(-0.0, true), 0, "{name}: no negative zero");
                }
                for sat in [true, false] {
                    let back = fmt.encode(v as f64, sat);
                    let same = back == c || (v.is_infinite() && sat && back & 0x7F == 0x7B);
                    assert!(
                        same,
                        "{name} code {c:#04x} = {v} encodes back to {back:#04x}"
                    );
                }
            }
        }
        for c in 0..16u8 {
            assert_eq!(E2M1.encode(E2M1.decode(c) as f64, true), c);
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(F8E4M3FN::max_finite(), 448.0);
        assert_eq!(F8E4M3FNUZ::max_finite(), 240.0);
        assert_eq!(F8E5M2::max_finite(), 57344.0);
        assert_eq!(F8E5M2FNUZ::max_finite(), 57344.0);
        assert_eq!(F4E2M1::max_finite(), 6.0);
        assert_eq!(F8E4M3FN::from_bits(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(F8E4M3FNUZ::from_bits(0x01).to_f32(), 2f32.powi(-10));
        assert_eq!(F8E5M2::from_bits(0x01).to_f32(), 2f32.powi(-16));
        assert_eq!(F8E5M2FNUZ::from_bits(0x01).to_f32(), 2f32.powi(-17));
        assert_eq!(F8E4M3FN::from_f32(1.0, true).to_bits(), 0x38);
        assert_eq!(F8E5M2::from_f32(-2.0, true).to_bits(), 0xC0);
        let fp4: Vec<f32> = (0..16).map(|c| F4E2M1::from_bits(c).to_f32()).collect();
        assert_eq!(
            fp4,
            [
                0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0,
                -6.0
            ]
        );
    }

    #[test]
    fn ties_round_to_even() {
        // e4m3fn around 1: spacing 1/8. 1 + 1/16 is a tie between 1 (even) and 1.125.
        assert_eq!(F8E4M3FN::from_f32(1.0625, true).to_f32(), 1.0);
        assert_eq!(F8E4M3FN::from_f32(1.1875, true).to_f32(), 1.25);
        assert_eq!(F8E4M3FN::from_f32(1.0625001, true).to_f32(), 1.125);
        // Subnormal ties: half the smallest subnormal goes to 0, 1.5 of it to 2 units.
        let tiny = 2f32.powi(-9);
        assert_eq!(F8E4M3FN::from_f32(tiny / 2.0, true).to_bits(), 0);
        assert_eq!(F8E4M3FN::from_f32(-tiny / 2.0, true).to_bits(), 0x80);
        assert_eq!(F8E4M3FN::from_f32(tiny * 1.5, true).to_bits(), 2);
        assert_eq!(F8E4M3FNUZ::from_f32(-1e-10, true).to_bits(), 0);
        // fp4: 2.5 is a tie between 2 (even mantissa) and 3; 3.5 between 3 and 4 (even); 5 -> 4.
        assert_eq!(F4E2M1::from_f32(2.5, true).to_f32(), 2.0);
        assert_eq!(F4E2M1::from_f32(-3.5, true).to_f32(), -4.0);
        assert_eq!(F4E2M1::from_f32(5.0, true).to_f32(), 4.0);
        assert_eq!(F4E2M1::from_f32(0.25, true).to_f32(), 0.0);
        assert_eq!(F4E2M1::from_f32(0.75, true).to_f32(), 1.0);
        // e5m2: 61440 is the tie between 57344 and 65536 (odd mantissa): rounds up, overflows.
        assert_eq!(F8E5M2::from_f32(61439.0, false).to_f32(), 57344.0);
        assert_eq!(F8E5M2::from_f32(61440.0, false).to_f32(), f32::INFINITY);
        assert_eq!(F8E5M2::from_f32(61440.0, true).to_f32(), 57344.0);
    }

    #[test]
    fn saturation_and_specials() {
        // e4m3fn: 464 is the tie between 448 and the NaN code: stays 448; above it overflows.
        assert_eq!(F8E4M3FN::from_f32(464.0, false).to_f32(), 448.0);
        assert!(F8E4M3FN::from_f32(465.0, false).is_nan());
        assert_eq!(F8E4M3FN::from_f32(465.0, true).to_f32(), 448.0);
        assert_eq!(F8E4M3FN::from_f32(-1e9, true).to_f32(), -448.0);
        assert_eq!(F8E4M3FN::from_f32(f32::INFINITY, true).to_f32(), 448.0);
        assert_eq!(F8E4M3FN::from_f32(f32::NEG_INFINITY, false).to_bits(), 0xFF);
        assert_eq!(F8E4M3FN::from_f32(f32::NAN, true).to_bits(), 0x7F);
        assert_eq!(F8E4M3FN::from_f32(-f32::NAN, true).to_bits(), 0xFF);
        assert_eq!(F8E4M3FNUZ::from_f32(-f32::NAN, true).to_bits(), 0x80);
        assert_eq!(F8E4M3FNUZ::from_f32(1000.0, false).to_bits(), 0x80);
        assert_eq!(F8E4M3FNUZ::from_f32(-1000.0, true).to_f32(), -240.0);
        assert_eq!(
            F8E5M2::from_f32(f32::NEG_INFINITY, false).to_f32(),
            f32::NEG_INFINITY
        );
        assert_eq!(F8E5M2::from_f32(f32::NEG_INFINITY, true).to_f32(), -57344.0);
        assert!(F8E5M2::from_bits(0x7D).is_nan());
        assert!(F8E5M2FNUZ::from_f32(f32::INFINITY, false).is_nan());
        assert_eq!(F8E5M2FNUZ::from_f32(-0.0, false).to_bits(), 0);
        // fp4 saturates always; NaN becomes a zero (what the ONNX reference produces).
        assert_eq!(F4E2M1::from_f32(1e6, false).to_f32(), 6.0);
        assert_eq!(F4E2M1::from_f32(f32::NEG_INFINITY, false).to_f32(), -6.0);
        assert_eq!(F4E2M1::from_f32(f32::NAN, true).to_bits(), 0x8);
        assert_eq!(F4E2M1::from_f32(-0.0, true).to_bits(), 0x8);
    }

    #[test]
    fn int4_wraps_or_saturates() {
        assert_eq!(I4::wrapping(8).get(), -8);
        assert_eq!(I4::wrapping(-9).get(), 7);
        assert_eq!(I4::wrapping(200).get(), -8);
        assert_eq!(I4::saturating(200).get(), 7);
        assert_eq!(I4::saturating(-9).get(), -8);
        assert_eq!(I4::from_bits(0xF).get(), -1);
        assert_eq!(I4::wrapping(-1).to_bits(), 0xF);
        assert_eq!(U4::wrapping(17).get(), 1);
        assert_eq!(U4::saturating(17).get(), 15);
        assert_eq!(U4::saturating(-3).get(), 0);
    }

    #[test]
    fn nibbles_pack_low_first() {
        assert_eq!(pack_nibbles([1u8, 2, 3].into_iter()), vec![0x21, 0x03]);
        assert_eq!(unpack_nibbles(&[0x21, 0x03], 3), vec![1, 2, 3]);
        assert_eq!(unpack_nibbles(&[0x21, 0x43], 4), vec![1, 2, 3, 4]);
        assert!(pack_nibbles(std::iter::empty::<u8>()).is_empty());
    }

    #[test]
    fn agrees_with_the_float8_crate_where_it_applies() {
        // The float8 crate implements saturating e4m3fn and e5m2 (CUDA's cuda_fp8.hpp): the
        // two implementations agree on every float16 value and on random f32s.
        let mut seed = 0x1234_5678_9abc_def0u64;
        let mut xs: Vec<f32> = (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect();
        for _ in 0..200_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            xs.push(f32::from_bits((seed >> 32) as u32));
        }
        for x in xs {
            let a = F8E4M3FN::from_f32(x, true).to_f32();
            let b = float8::F8E4M3::from_f32(x).to_f32();
            assert!(
                a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                "e4m3 {x}: {a} vs {b}"
            );
            if x.is_finite() {
                let a = F8E5M2::from_f32(x, true).to_f32();
                let b = float8::F8E5M2::from_f32(x).to_f32();
                assert!(
                    a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                    "e5m2 {x}: {a} vs {b}"
                );
            }
        }
    }
}
