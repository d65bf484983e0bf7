//! The input generator behind `--val-range`, `--seed`, `--iterations` and `--input-shapes`.
//!
//! It reproduces Polygraphy's default data loader bit for bit: iteration `i` draws from
//! NumPy's legacy `RandomState(seed + i)` (MT19937), inputs in the model's order; floats are
//! `random_sample(shape) * (hi - lo) + lo` cast to the input's dtype, integers and bools are
//! `randint(lo, hi + 1)` with NumPy's masked rejection sampling. So `mixprec run --seed 1`
//! feeds a model exactly what `polygraphy run --seed 1` feeds it, and golden outputs from one
//! tool match the other's without saving inputs.

use crate::error::{Error, Result};
use crate::graph::{Dim, ValueInfo};
use crate::lowbit::{F4E2M1, F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, I4, U4};
use crate::tensor::Feeds;
use crate::tensor::{fmt_shape, DType, Tensor, TensorData};
use half::{bf16, f16};
use std::collections::BTreeMap;

/// Polygraphy's default seed (`constants.DEFAULT_SEED`).
pub const DEFAULT_SEED: u64 = 1;
/// Polygraphy's default value range.
pub const DEFAULT_VAL_RANGE: (f64, f64) = (0.0, 1.0);

/// Value ranges: one default and per-input overrides.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ValRanges {
    pub default: Option<(f64, f64)>,
    pub per_input: BTreeMap<String, (f64, f64)>,
}

impl ValRanges {
    pub fn get(&self, name: &str) -> (f64, f64) {
        self.per_input
            .get(name)
            .copied()
            .or(self.default)
            .unwrap_or(DEFAULT_VAL_RANGE)
    }
}

/// How to generate inputs.
#[derive(Clone, Debug)]
pub struct DataLoaderConfig {
    pub seed: u64,
    pub iterations: usize,
    pub val_ranges: ValRanges,
    /// Shapes for inputs with dynamic dimensions (or to restate fixed ones).
    pub input_shapes: BTreeMap<String, Vec<usize>>,
}

impl Default for DataLoaderConfig {
    fn default() -> Self {
        DataLoaderConfig {
            seed: DEFAULT_SEED,
            iterations: 1,
            val_ranges: ValRanges::default(),
            input_shapes: BTreeMap::new(),
        }
    }
}

/// Splits Polygraphy's `name:value` argument at the last colon (names may contain colons,
/// values never do); a bare value has an empty name.
fn split_arg(arg: &str) -> (&str, &str) {
    match arg.rfind(':') {
        Some(i) => (&arg[..i], &arg[i + 1..]),
        None => ("", arg),
    }
}

fn parse_number(s: &str) -> Option<f64> {
    match s.trim().to_ascii_lowercase().as_str() {
        "inf" | "+inf" | "float('inf')" => Some(f64::INFINITY),
        "-inf" | "float('-inf')" => Some(f64::NEG_INFINITY),
        "true" => Some(1.0),
        "false" => Some(0.0),
        t => t.parse::<f64>().ok().filter(|v| !v.is_nan()),
    }
}

/// Parses one `--val-range` argument (`x:[1,2]`, `[0,5]`, `input:0:(-1, 1)`) into `ranges`.
pub fn parse_val_range_into(arg: &str, ranges: &mut ValRanges) -> Result<()> {
    let bad = |why: &str| {
        Error::Invalid(format!(
            "--val-range '{arg}': {why} (expected [min,max] or name:[min,max])"
        ))
    };
    let (name, val) = split_arg(arg.trim());
    let val = val.trim();
    let inner = val
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .or_else(|| val.strip_prefix('(').and_then(|v| v.strip_suffix(')')))
        .ok_or_else(|| bad("the range must be in brackets"))?;
    let parts: Vec<&str> = inner.split(',').collect();
    if parts.len() != 2 {
        return Err(bad("the range needs exactly two numbers"));
    }
    let lo = parse_number(parts[0]).ok_or_else(|| bad("the minimum is not a number"))?;
    let hi = parse_number(parts[1]).ok_or_else(|| bad("the maximum is not a number"))?;
    if lo > hi {
        return Err(bad("the minimum is greater than the maximum"));
    }
    if name.is_empty() {
        ranges.default = Some((lo, hi));
    } else {
        ranges.per_input.insert(name.to_string(), (lo, hi));
    }
    Ok(())
}

/// Parses one `--input-shapes` argument: `x:[1,3,224,224]` (also `x:(1,3)`, `x:[]`).
pub fn parse_input_shapes(arg: &str) -> Result<Vec<(String, Vec<usize>)>> {
    let bad = |why: &str| {
        Error::Invalid(format!(
            "--input-shapes '{arg}': {why} (expected name:[d0,d1,...])"
        ))
    };
    let (name, val) = split_arg(arg.trim());
    if name.is_empty() {
        return Err(bad("the input name is missing"));
    }
    let val = val.trim();
    let inner = val
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .or_else(|| val.strip_prefix('(').and_then(|v| v.strip_suffix(')')))
        .ok_or_else(|| bad("the shape must be in brackets"))?;
    let dims = inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            d.parse::<usize>()
                .map_err(|_| bad(&format!("'{d}' is not a non-negative integer dimension")))
        })
        .collect::<Result<Vec<usize>>>()?;
    Ok(vec![(name.to_string(), dims)])
}

/// The concrete shape to generate for an input: the user's shape if given (checked against the
/// declared one), else the declared shape with dynamic dimensions set to 1, as Polygraphy does.
fn resolve_shape(
    vi: &ValueInfo,
    user: Option<&Vec<usize>>,
    warnings: &mut Vec<String>,
) -> Result<Vec<usize>> {
    let declared = vi.shape.clone().unwrap_or_default();
    if let Some(shape) = user {
        if vi.shape.is_some() {
            let mismatch = shape.len() != declared.len()
                || declared
                    .iter()
                    .zip(shape)
                    .any(|(d, &s)| matches!(d, Dim::Fixed(f) if *f != s));
            if mismatch {
                return Err(Error::input(
                    &vi.name,
                    format!(
                        "--input-shapes gives {}, which does not fit the declared shape {}",
                        fmt_shape(shape),
                        vi.shape_string()
                    ),
                ));
            }
        }
        return Ok(shape.clone());
    }
    if vi.shape.is_none() {
        warnings.push(format!(
            "input '{}' declares no shape: generating a scalar; use --input-shapes to set one",
            vi.name
        ));
        return Ok(vec![]);
    }
    let shape: Vec<usize> = declared
        .iter()
        .map(|d| match d {
            Dim::Fixed(f) => *f,
            _ => 1,
        })
        .collect();
    if declared.iter().any(|d| !matches!(d, Dim::Fixed(_))) {
        warnings.push(format!(
            "input '{}' has shape {}: generating data of shape {}; use --input-shapes to choose another",
            vi.name,
            vi.shape_string(),
            fmt_shape(&shape)
        ));
    }
    Ok(shape)
}

/// Generates `cfg.iterations` input sets for the given graph inputs, plus warnings to show.
pub fn generate(inputs: &[ValueInfo], cfg: &DataLoaderConfig) -> Result<(Vec<Feeds>, Vec<String>)> {
    for name in cfg.val_ranges.per_input.keys() {
        if !inputs.iter().any(|v| &v.name == name) {
            return Err(unknown_input("--val-range", name, inputs));
        }
    }
    for name in cfg.input_shapes.keys() {
        if !inputs.iter().any(|v| &v.name == name) {
            return Err(unknown_input("--input-shapes", name, inputs));
        }
    }
    let mut warnings = Vec::new();
    let mut shapes = Vec::with_capacity(inputs.len());
    for vi in inputs {
        shapes.push(resolve_shape(
            vi,
            cfg.input_shapes.get(&vi.name),
            &mut warnings,
        )?);
    }
    let mut all = Vec::with_capacity(cfg.iterations);
    for it in 0..cfg.iterations {
        let seed = cfg.seed + it as u64;
        if seed > u32::MAX as u64 {
            return Err(Error::Invalid(format!(
                "--seed {}: seeds must be below 2^32 (NumPy's limit)",
                cfg.seed
            )));
        }
        let mut rng = Mt19937::new(seed as u32);
        let mut feeds = Feeds::new();
        for (vi, shape) in inputs.iter().zip(&shapes) {
            let dtype = vi.dtype.unwrap_or(DType::F32);
            let (lo, hi) = cfg.val_ranges.get(&vi.name);
            let n: usize = shape.iter().product();
            let data = sample(&mut rng, dtype, n, lo, hi).map_err(|e| Error::input(&vi.name, e))?;
            feeds.insert(vi.name.clone(), Tensor::from_parts(shape.clone(), data));
        }
        all.push(feeds);
    }
    Ok((all, warnings))
}

fn unknown_input(flag: &str, name: &str, inputs: &[ValueInfo]) -> Error {
    let known: Vec<&str> = inputs.iter().map(|v| v.name.as_str()).collect();
    Error::input(
        name,
        format!(
            "{flag} names an input the model does not have (its inputs: {})",
            known.join(", ")
        ),
    )
}

fn f32s(v: Vec<f64>) -> impl Iterator<Item = f32> {
    v.into_iter().map(|x| x as f32)
}

/// Draws `n` values of `dtype` in `[lo, hi]` as Polygraphy's `ArraySampler` does.
fn sample(
    rng: &mut Mt19937,
    dtype: DType,
    n: usize,
    lo: f64,
    hi: f64,
) -> std::result::Result<TensorData, String> {
    // Polygraphy's handling of infinite bounds (two infinities must not collapse to NaN).
    let (mut scale, mut shift) = (hi - lo, lo);
    if lo.is_infinite() {
        scale = lo;
        shift = 0.0;
    }
    if hi.is_infinite() {
        scale = hi;
    }
    let floats = |rng: &mut Mt19937| -> Vec<f64> {
        (0..n)
            .map(|_| rng.random_sample() * scale + shift)
            .collect()
    };
    let int_range = |lo: f64, hi: f64| -> std::result::Result<(i128, i128), String> {
        if !lo.is_finite() || !hi.is_finite() {
            return Err(format!(
                "value range [{lo}, {hi}] is not finite: integer inputs need finite bounds"
            ));
        }
        // Python's int() truncates toward zero.
        Ok((lo.trunc() as i128, hi.trunc() as i128))
    };
    Ok(match dtype {
        DType::F32 => TensorData::F32(floats(rng).into_iter().map(|x| x as f32).collect()),
        DType::F64 => TensorData::F64(floats(rng).into()),
        DType::F16 => TensorData::F16(floats(rng).into_iter().map(f16::from_f64).collect()),
        DType::BF16 => TensorData::BF16(floats(rng).into_iter().map(bf16::from_f64).collect()),
        DType::Bool => {
            // bool(lo), bool(hi): any non-zero bound is True.
            let (l, h) = ((lo != 0.0) as u32, (hi != 0.0) as u32);
            if l > h {
                return Err(format!(
                    "value range [{lo}, {hi}] is empty for a bool input"
                ));
            }
            let mut bits = BufferedBits::default();
            TensorData::Bool(
                (0..n)
                    .map(|_| if h == l { l != 0 } else { bits.next_bit(rng) })
                    .collect(),
            )
        }
        DType::Str => {
            return Err("string inputs cannot be generated; load them with --load-inputs".into())
        }
        // NumPy (so Polygraphy) has no float8/float4: drawn as float32 inputs are, then rounded
        // to nearest even, saturating (docs/numerics.md).
        DType::F8E4M3FN => TensorData::F8E4M3FN(
            f32s(floats(rng))
                .map(|x| F8E4M3FN::from_f32(x, true))
                .collect(),
        ),
        DType::F8E4M3FNUZ => TensorData::F8E4M3FNUZ(
            f32s(floats(rng))
                .map(|x| F8E4M3FNUZ::from_f32(x, true))
                .collect(),
        ),
        DType::F8E5M2 => TensorData::F8E5M2(
            f32s(floats(rng))
                .map(|x| F8E5M2::from_f32(x, true))
                .collect(),
        ),
        DType::F8E5M2FNUZ => TensorData::F8E5M2FNUZ(
            f32s(floats(rng))
                .map(|x| F8E5M2FNUZ::from_f32(x, true))
                .collect(),
        ),
        DType::F4E2M1 => TensorData::F4E2M1(
            f32s(floats(rng))
                .map(|x| F4E2M1::from_f32(x, true))
                .collect(),
        ),
        int => {
            let (l, h) = int_range(lo, hi)?;
            let (min, max): (i128, i128) = match int {
                DType::I8 => (i8::MIN as i128, i8::MAX as i128),
                DType::U8 => (0, u8::MAX as i128),
                DType::I16 => (i16::MIN as i128, i16::MAX as i128),
                DType::U16 => (0, u16::MAX as i128),
                DType::I32 => (i32::MIN as i128, i32::MAX as i128),
                DType::U32 => (0, u32::MAX as i128),
                DType::I64 => (i64::MIN as i128, i64::MAX as i128),
                DType::I4 => (-8, 7),
                DType::U4 => (0, 15),
                _ => (0, u64::MAX as i128),
            };
            if l < min || h > max {
                return Err(format!("value range [{l}, {h}] does not fit dtype {int}"));
            }
            let rng_width = (h - l) as u64;
            let width_bits = match int {
                // int4/uint4 (no NumPy type): drawn as int8/uint8 would be.
                DType::I8 | DType::U8 | DType::I4 | DType::U4 => 8,
                DType::I16 | DType::U16 => 16,
                DType::I32 | DType::U32 => 32,
                _ => 64,
            };
            let vals: Vec<i128> = bounded_ints(rng, rng_width, width_bits, n)
                .into_iter()
                .map(|v| l + v as i128)
                .collect();
            match int {
                DType::I8 => TensorData::I8(vals.iter().map(|&v| v as i8).collect()),
                DType::U8 => TensorData::U8(vals.iter().map(|&v| v as u8).collect()),
                DType::I16 => TensorData::I16(vals.iter().map(|&v| v as i16).collect()),
                DType::U16 => TensorData::U16(vals.iter().map(|&v| v as u16).collect()),
                DType::I32 => TensorData::I32(vals.iter().map(|&v| v as i32).collect()),
                DType::U32 => TensorData::U32(vals.iter().map(|&v| v as u32).collect()),
                DType::I64 => TensorData::I64(vals.iter().map(|&v| v as i64).collect()),
                DType::I4 => {
                    TensorData::I4(vals.iter().map(|&v| I4::saturating(v as i64)).collect())
                }
                DType::U4 => {
                    TensorData::U4(vals.iter().map(|&v| U4::saturating(v as i64)).collect())
                }
                _ => TensorData::U64(vals.iter().map(|&v| v as u64).collect()),
            }
        }
    })
}

/// NumPy's `gen_mask`: the smallest all-ones mask covering `max`.
fn gen_mask(max: u64) -> u64 {
    let mut m = max;
    for s in [1, 2, 4, 8, 16, 32] {
        m |= m >> s;
    }
    m
}

/// Offsets in `[0, width]` drawn as NumPy's legacy `randint` draws them for an integer type of
/// `bits` bits (`random_bounded_uint{8,16,32,64}_fill` with masked rejection).
fn bounded_ints(rng: &mut Mt19937, width: u64, bits: u32, n: usize) -> Vec<u64> {
    if width == 0 {
        return vec![0; n];
    }
    let mask = gen_mask(width);
    let mut out = Vec::with_capacity(n);
    match bits {
        8 | 16 => {
            // Small types take 8 or 16 bits at a time from one buffered 32-bit draw.
            let per = 32 / bits;
            let lane_mask = (1u64 << bits) - 1;
            let (mut buf, mut left) = (0u32, 0u32);
            let mut next = |rng: &mut Mt19937| -> u64 {
                if left == 0 {
                    buf = rng.next_u32();
                    left = per - 1;
                } else {
                    buf >>= bits;
                    left -= 1;
                }
                buf as u64 & lane_mask
            };
            for _ in 0..n {
                out.push(if width == lane_mask {
                    next(rng)
                } else {
                    loop {
                        let v = next(rng) & mask;
                        if v <= width {
                            break v;
                        }
                    }
                });
            }
        }
        _ if width <= u32::MAX as u64 => {
            for _ in 0..n {
                out.push(if width == u32::MAX as u64 {
                    rng.next_u32() as u64
                } else {
                    loop {
                        let v = rng.next_u32() as u64 & mask;
                        if v <= width {
                            break v;
                        }
                    }
                });
            }
        }
        _ => {
            for _ in 0..n {
                out.push(if width == u64::MAX {
                    rng.next_u64()
                } else {
                    loop {
                        let v = rng.next_u64() & mask;
                        if v <= width {
                            break v;
                        }
                    }
                });
            }
        }
    }
    out
}

/// NumPy's `buffered_bounded_bool`: one bit at a time from a 32-bit draw.
#[derive(Default)]
struct BufferedBits {
    buf: u32,
    left: u32,
}

impl BufferedBits {
    fn next_bit(&mut self, rng: &mut Mt19937) -> bool {
        if self.left == 0 {
            self.buf = rng.next_u32();
            self.left = 31;
        } else {
            self.buf >>= 1;
            self.left -= 1;
        }
        self.buf & 1 != 0
    }
}

/// The Mersenne Twister MT19937 as NumPy's legacy `RandomState` seeds and uses it.
pub struct Mt19937 {
    state: [u32; 624],
    pos: usize,
}

impl Mt19937 {
    /// `RandomState(seed)` for an integer seed (NumPy's `mt19937_seed`).
    pub fn new(seed: u32) -> Mt19937 {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, pos: 624 }
    }

    fn twist(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        for i in 0..624 {
            let y = (self.state[i] & UPPER) | (self.state[(i + 1) % 624] & LOWER);
            let mut v = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= 0x9908_b0df;
            }
            self.state[i] = v;
        }
        self.pos = 0;
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.pos >= 624 {
            self.twist();
        }
        let mut y = self.state[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    pub fn next_u64(&mut self) -> u64 {
        let hi = self.next_u32() as u64;
        (hi << 32) | self.next_u32() as u64
    }

    /// `random_sample()`: a double in [0, 1) from 53 random bits.
    pub fn random_sample(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67_108_864.0 + b) / 9_007_199_254_740_992.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference values printed by NumPy 2.4 (`np.random.RandomState(seed)`).

    #[test]
    fn random_sample_matches_numpy() {
        let mut r = Mt19937::new(1);
        let got: Vec<u64> = (0..3).map(|_| r.random_sample().to_bits()).collect();
        assert_eq!(
            got,
            vec![
                0x3FDA_B07D_0FFA_3C06,
                0x3FE7_0CE5_F3BA_F051,
                0x3F1D_FB90_6661_C000
            ]
        );
    }

    #[test]
    fn float16_generation_matches_numpy() {
        // (RandomState(7).random_sample(5) * 4 - 2).astype(np.float16).view(np.uint16)
        let mut r = Mt19937::new(7);
        let got = sample(&mut r, DType::F16, 5, -2.0, 2.0).unwrap();
        let TensorData::F16(v) = got else { panic!() };
        let bits: Vec<u16> = v.iter().map(|x| x.to_bits()).collect();
        assert_eq!(bits, vec![48839, 15483, 46050, 15143, 16294]);
    }

    #[test]
    fn randint_matches_numpy_for_each_width() {
        // RandomState(2).randint(-3, 6, size=6, dtype=np.int64)
        let mut r = Mt19937::new(2);
        let t = sample(&mut r, DType::I64, 6, -3.0, 5.0).unwrap();
        assert_eq!(TensorData::I64(vec![5, 5, 3, -1, 5, 4].into()), t);
        // RandomState(2).randint(0, 2, size=6, dtype=np.int32)
        let mut r = Mt19937::new(2);
        let t = sample(&mut r, DType::I32, 6, 0.0, 1.0).unwrap();
        assert_eq!(TensorData::I32(vec![0, 1, 1, 0, 0, 1].into()), t);
        // RandomState(4).randint(0, 201, size=8, dtype=np.uint8)
        let mut r = Mt19937::new(4);
        let t = sample(&mut r, DType::U8, 8, 0.0, 200.0).unwrap();
        assert_eq!(
            TensorData::U8(vec![122, 68, 143, 174, 32, 143, 183, 105].into()),
            t
        );
        // RandomState(5).randint(-10**12, 10**12 + 1, size=3, dtype=np.int64): 64-bit draws.
        let mut r = Mt19937::new(5);
        let t = sample(&mut r, DType::I64, 3, -1e12, 1e12).unwrap();
        assert_eq!(
            TensorData::I64(vec![524950386894, 722193602633, -965254483228].into()),
            t
        );
    }

    #[test]
    fn bool_generation_matches_numpy() {
        // RandomState(3).randint(False, True + 1, size=40, dtype=bool)
        let want = [
            0, 1, 0, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0,
            0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 1,
        ];
        let mut r = Mt19937::new(3);
        let TensorData::Bool(v) = sample(&mut r, DType::Bool, 40, 0.0, 1.0).unwrap() else {
            panic!()
        };
        let got: Vec<i32> = v.iter().map(|&b| b as i32).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn parses_polygraphy_range_and_shape_syntax() {
        let mut r = ValRanges::default();
        parse_val_range_into("x:[1,2]", &mut r).unwrap();
        parse_val_range_into("[-1, 1.5]", &mut r).unwrap();
        parse_val_range_into("input:0:(0,inf)", &mut r).unwrap();
        assert_eq!(r.get("x"), (1.0, 2.0));
        assert_eq!(r.get("y"), (-1.0, 1.5));
        assert_eq!(r.get("input:0"), (0.0, f64::INFINITY));
        for bad in ["x:[1,", "x:[a,b]", "x:[2,1]", "x:1,2", "x:[1,2,3]"] {
            let e = parse_val_range_into(bad, &mut r).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
        assert_eq!(
            parse_input_shapes("x:[1,3,224,224]").unwrap(),
            vec![("x".to_string(), vec![1, 3, 224, 224])]
        );
        assert!(parse_input_shapes("[1,2]").is_err());
        assert!(parse_input_shapes("x:[1,-1]").is_err());
    }

    #[test]
    fn dynamic_dims_default_to_one_and_overrides_are_checked() {
        let vi = ValueInfo {
            name: "x".into(),
            dtype: Some(DType::F32),
            shape: Some(vec![Dim::Param("batch".into()), Dim::Fixed(4)]),
        };
        let cfg = DataLoaderConfig::default();
        let (feeds, warnings) = generate(std::slice::from_ref(&vi), &cfg).unwrap();
        assert_eq!(feeds[0]["x"].shape(), &[1, 4]);
        assert_eq!(warnings.len(), 1);
        let mut cfg = DataLoaderConfig::default();
        cfg.input_shapes.insert("x".into(), vec![2, 5]);
        let e = generate(std::slice::from_ref(&vi), &cfg)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'x'") && e.contains("[batch, 4]"), "{e}");
        let mut cfg = DataLoaderConfig::default();
        cfg.val_ranges.per_input.insert("nope".into(), (0.0, 1.0));
        let e = generate(std::slice::from_ref(&vi), &cfg)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope"), "{e}");
    }

    #[test]
    fn iterations_use_consecutive_seeds() {
        let vi = ValueInfo {
            name: "x".into(),
            dtype: Some(DType::F32),
            shape: Some(vec![Dim::Fixed(3)]),
        };
        let cfg = DataLoaderConfig {
            iterations: 2,
            ..Default::default()
        };
        let (feeds, _) = generate(std::slice::from_ref(&vi), &cfg).unwrap();
        let mut r = Mt19937::new(2);
        let want: Vec<f32> = (0..3).map(|_| r.random_sample() as f32).collect();
        assert_eq!(feeds[1]["x"].as_f32().unwrap(), &want[..]);
    }
}
