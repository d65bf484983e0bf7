//! Output comparison with Polygraphy's semantics.
//!
//! `absdiff = |out - ref|`, `reldiff = absdiff / |ref|` (a zero reference value gets 2.22e-16
//! added first, as Polygraphy does). A scalar statistic (mean, median, max) passes unless both
//! its absolute and its relative value exceed their tolerances (NaN fails). `elemwise` fails
//! when any element exceeds both tolerances. Defaults are Polygraphy's: atol = rtol = 1e-5,
//! elemwise.

use crate::error::{Error, Result};
use crate::tensor::{fmt_shape, Tensor, TensorData};
use serde::Serialize;
use std::collections::BTreeMap;

/// Which error statistic decides pass/fail (`--check-error-stat`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorStat {
    Elemwise,
    Max,
    Mean,
    Median,
}

impl ErrorStat {
    pub fn parse(s: &str) -> Result<ErrorStat> {
        Ok(match s {
            "elemwise" => ErrorStat::Elemwise,
            "max" => ErrorStat::Max,
            "mean" => ErrorStat::Mean,
            "median" => ErrorStat::Median,
            _ => {
                return Err(Error::Invalid(format!(
                "invalid --check-error-stat '{s}': valid choices are elemwise, max, mean, median"
            )))
            }
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ErrorStat::Elemwise => "elemwise",
            ErrorStat::Max => "max",
            ErrorStat::Mean => "mean",
            ErrorStat::Median => "median",
        }
    }
}

/// A value that is global or set per output name (`--atol 1e-3 out:1e-2`).
#[derive(Clone, Debug, PartialEq)]
pub struct PerOutput<T> {
    pub default: T,
    pub per_output: BTreeMap<String, T>,
}

impl<T: Clone> PerOutput<T> {
    pub fn new(default: T) -> Self {
        PerOutput {
            default,
            per_output: BTreeMap::new(),
        }
    }

    pub fn get(&self, output: &str) -> T {
        self.per_output
            .get(output)
            .cloned()
            .unwrap_or_else(|| self.default.clone())
    }

    /// Parses Polygraphy's list syntax: items `value` (global) or `name:value` (per output).
    /// The name is everything before the last colon, so names may contain colons.
    pub fn parse_list(
        items: &[String],
        default: T,
        flag: &str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Result<Self> {
        let mut out = PerOutput::new(default);
        for item in items {
            let (name, value) = match item.rsplit_once(':') {
                Some((n, v)) => (Some(n), v),
                None => (None, item.as_str()),
            };
            let v = parse(value.trim()).ok_or_else(|| {
                Error::Invalid(format!("{flag}: cannot parse '{value}' in '{item}'"))
            })?;
            match name {
                Some(n) => {
                    out.per_output.insert(n.to_string(), v);
                }
                None => out.default = v,
            }
        }
        Ok(out)
    }
}

/// The pass criterion for outputs.
#[derive(Clone, Debug)]
pub struct Criterion {
    pub atol: PerOutput<f64>,
    pub rtol: PerOutput<f64>,
    pub stat: PerOutput<ErrorStat>,
}

impl Default for Criterion {
    fn default() -> Self {
        Criterion {
            atol: PerOutput::new(1e-5),
            rtol: PerOutput::new(1e-5),
            stat: PerOutput::new(ErrorStat::Elemwise),
        }
    }
}

/// Difference statistics of one output against its reference.
#[derive(Clone, Debug, Serialize)]
pub struct OutputComparison {
    pub name: String,
    pub shape: Vec<usize>,
    pub stat: ErrorStat,
    pub atol: f64,
    pub rtol: f64,
    pub max_absdiff: f64,
    pub max_reldiff: f64,
    pub mean_absdiff: f64,
    pub mean_reldiff: f64,
    pub median_absdiff: f64,
    pub median_reldiff: f64,
    /// The tolerance the chosen statistic needs: `[abs] OR [rel]`.
    pub required_atol: f64,
    pub required_rtol: f64,
    pub passed: bool,
}

/// Compares one output with its reference under the criterion.
pub fn compare_output(
    name: &str,
    out: &Tensor,
    reference: &Tensor,
    criterion: &Criterion,
) -> Result<OutputComparison> {
    if out.shape() != reference.shape() {
        return Err(Error::Invalid(format!(
            "output '{name}': shape {} does not match the reference shape {}",
            fmt_shape(out.shape()),
            fmt_shape(reference.shape())
        )));
    }
    let (absdiff, reldiff) = diffs(name, out, reference)?;
    let stat = criterion.stat.get(name);
    let atol = criterion.atol.get(name);
    let rtol = criterion.rtol.get(name);
    let (max_a, mean_a, med_a) = (max_of(&absdiff), mean_of(&absdiff), median_of(&absdiff));
    let (max_r, mean_r, med_r) = (max_of(&reldiff), mean_of(&reldiff), median_of(&reldiff));
    let failed = |v: f64, tol: f64| v.is_nan() || v > tol;
    let (req_a, req_r) = match stat {
        ErrorStat::Elemwise | ErrorStat::Max => (max_a, max_r),
        ErrorStat::Mean => (mean_a, mean_r),
        ErrorStat::Median => (med_a, med_r),
    };
    let passed = match stat {
        ErrorStat::Elemwise => !absdiff
            .iter()
            .zip(&reldiff)
            .any(|(&a, &r)| failed(a, atol) && failed(r, rtol)),
        _ => !(failed(req_a, atol) && failed(req_r, rtol)),
    };
    Ok(OutputComparison {
        name: name.to_string(),
        shape: out.shape().to_vec(),
        stat,
        atol,
        rtol,
        max_absdiff: max_a,
        max_reldiff: max_r,
        mean_absdiff: mean_a,
        mean_reldiff: mean_r,
        median_absdiff: med_a,
        median_reldiff: med_r,
        required_atol: req_a,
        required_rtol: req_r,
        passed,
    })
}

/// Elementwise absolute and relative differences, in f64.
pub fn diffs(name: &str, out: &Tensor, reference: &Tensor) -> Result<(Vec<f64>, Vec<f64>)> {
    if let (TensorData::Bool(a), TensorData::Bool(b)) = (out.data(), reference.data()) {
        let abs: Vec<f64> = a.iter().zip(b).map(|(x, y)| (x ^ y) as u8 as f64).collect();
        let rel = abs.iter().map(|&d| d / 2.220446049250313e-16).collect();
        return Ok((abs, rel));
    }
    let numeric = |t: &Tensor, which: &str| {
        t.to_f64_vec().ok_or_else(|| {
            Error::Invalid(format!(
                "output '{name}': the {which} has dtype {}, which cannot be compared numerically",
                t.dtype()
            ))
        })
    };
    let a = numeric(out, "output")?;
    let b = numeric(reference, "reference")?;
    let mut abs = Vec::with_capacity(a.len());
    let mut rel = Vec::with_capacity(a.len());
    for (&x, &y) in a.iter().zip(&b) {
        // Matching infinities compare equal (Polygraphy's infinities_compare_equal default).
        let d = if x.is_infinite() && x == y {
            0.0
        } else {
            (x - y).abs()
        };
        let denom = if y == 0.0 {
            2.220446049250313e-16
        } else {
            y.abs()
        };
        abs.push(d);
        rel.push(d / denom);
    }
    Ok((abs, rel))
}

/// Maximum, NaN if any value is NaN (as NumPy's max).
pub fn max_of(v: &[f64]) -> f64 {
    let mut m = f64::NEG_INFINITY;
    for &x in v {
        if x.is_nan() {
            return f64::NAN;
        }
        m = m.max(x);
    }
    if v.is_empty() {
        0.0
    } else {
        m
    }
}

pub fn mean_of(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// NumPy's median: the mean of the two middle values for an even count; NaN if any is NaN.
pub fn median_of(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    if v.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let mut w = v.to_vec();
    let n = w.len();
    let mid = n / 2;
    let (_, &mut hi, _) = w.select_nth_unstable_by(mid, |a, b| a.total_cmp(b));
    if n % 2 == 1 {
        hi
    } else {
        let lo = w[..mid].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        (lo + hi) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_f32(vec![v.len()], v.to_vec())
    }

    #[test]
    fn median_matches_numpy() {
        assert_eq!(median_of(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_of(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median_of(&[1.0, f64::NAN]).is_nan());
    }

    #[test]
    fn passes_when_abs_or_rel_is_within_tolerance() {
        let c = Criterion::default();
        // abs diff 1e-3 on a value of 1000: rel 1e-6 <= 1e-5 -> passes.
        let r = compare_output("y", &t(&[1000.001]), &t(&[1000.0]), &c).unwrap();
        assert!(r.passed, "{r:?}");
        // abs 1e-3 on 1.0: both exceed -> fails.
        let r = compare_output("y", &t(&[1.001]), &t(&[1.0]), &c).unwrap();
        assert!(!r.passed);
    }

    #[test]
    fn median_stat_tolerates_outliers() {
        let mut c = Criterion {
            stat: PerOutput::new(ErrorStat::Median),
            ..Default::default()
        };
        let r = compare_output("y", &t(&[1.0, 2.0, 30.0]), &t(&[1.0, 2.0, 3.0]), &c).unwrap();
        assert!(r.passed);
        assert_eq!(r.max_absdiff, 27.0);
        c.stat = PerOutput::new(ErrorStat::Max);
        assert!(
            !compare_output("y", &t(&[1.0, 2.0, 30.0]), &t(&[1.0, 2.0, 3.0]), &c)
                .unwrap()
                .passed
        );
    }

    #[test]
    fn nan_fails_and_inf_matches() {
        let c = Criterion::default();
        assert!(
            !compare_output("y", &t(&[f32::NAN]), &t(&[1.0]), &c)
                .unwrap()
                .passed
        );
        assert!(
            compare_output("y", &t(&[f32::INFINITY]), &t(&[f32::INFINITY]), &c)
                .unwrap()
                .passed
        );
    }

    #[test]
    fn per_output_lists_parse() {
        let p = PerOutput::parse_list(&["1e-3".into(), "out:0.5".into()], 1e-5, "--atol", |s| {
            s.parse().ok()
        })
        .unwrap();
        assert_eq!(p.get("out"), 0.5);
        assert_eq!(p.get("other"), 1e-3);
        assert!(
            PerOutput::parse_list(&["x:abc".into()], 1e-5, "--atol", |s| s.parse::<f64>().ok())
                .is_err()
        );
    }
}

/// Formats like Python's `f"{x:.{sig}g}"`, which is how Polygraphy prints every number
/// (`1e-05`, `2.2899e-05`, `65504`, `0.28889`).
pub fn fmt_g(x: f64, sig: usize) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let sig = sig.max(1);
    // The exponent after rounding to `sig` significant digits decides the style.
    let sci = format!("{:.*e}", sig - 1, x);
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if exp < -4 || exp >= sig as i32 {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", strip(mantissa), exp.abs())
    } else {
        let decimals = (sig as i32 - 1 - exp).max(0) as usize;
        strip(&format!("{x:.decimals$}"))
    }
}

#[cfg(test)]
mod fmt_tests {
    use super::fmt_g;

    #[test]
    fn matches_python_g_format() {
        assert_eq!(fmt_g(1e-5, 5), "1e-05");
        assert_eq!(fmt_g(2.2899e-5, 5), "2.2899e-05");
        assert_eq!(fmt_g(65504.0, 5), "65504");
        assert_eq!(fmt_g(65506.4, 5), "65506");
        assert_eq!(fmt_g(0.288888, 5), "0.28889");
        assert_eq!(fmt_g(1.5, 5), "1.5");
        assert_eq!(fmt_g(123456.0, 5), "1.2346e+05");
        assert_eq!(fmt_g(0.0001, 5), "0.0001");
        assert_eq!(fmt_g(-3.0, 5), "-3");
        assert_eq!(fmt_g(9.99999, 3), "10");
        assert_eq!(fmt_g(0.0, 5), "0");
    }
}
