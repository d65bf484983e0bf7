//! Output comparison with Polygraphy's semantics.
//!
//! `absdiff = |out - ref|`, `reldiff = absdiff / |ref|` (a zero reference value gets 2.22e-16
//! added first, as Polygraphy does). A scalar statistic (mean, median, max) passes unless both
//! its absolute and its relative value exceed their tolerances (NaN fails). `elemwise` fails
//! when any element exceeds both tolerances. `quantile` checks `numpy.quantile` of the
//! differences at `--error-quantile` (default 0.99). Defaults are Polygraphy's: atol = rtol =
//! 1e-5, elemwise.

pub mod cause;
pub mod html;
pub mod layerwise;
pub mod metrics;
pub mod report;
pub mod run_report;
pub mod stats;

pub use metrics::{Metric, MetricKind, MetricResult};
pub use stats::Stats;

use crate::error::{Error, Result};
use crate::tensor::{fmt_shape, DType, Tensor, TensorData};
use rayon::prelude::*;
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
    /// The `Criterion::quantile`-th quantile of the differences (Polygraphy's `quantile`).
    Quantile,
}

impl ErrorStat {
    pub fn parse(s: &str) -> Result<ErrorStat> {
        Ok(match s {
            "elemwise" => ErrorStat::Elemwise,
            "max" => ErrorStat::Max,
            "mean" => ErrorStat::Mean,
            "median" => ErrorStat::Median,
            "quantile" => ErrorStat::Quantile,
            _ => {
                return Err(Error::Invalid(format!(
                "invalid --check-error-stat '{s}': valid choices are elemwise, max, mean, median, quantile"
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
            ErrorStat::Quantile => "quantile",
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

/// The pass criterion for outputs: tolerances on an error statistic, plus optional metrics
/// (`--metric`) that must pass as well.
#[derive(Clone, Debug)]
pub struct Criterion {
    pub atol: PerOutput<f64>,
    pub rtol: PerOutput<f64>,
    pub stat: PerOutput<ErrorStat>,
    /// The quantile checked by `ErrorStat::Quantile`, in [0, 1] (`--error-quantile`, default
    /// 0.99 as in Polygraphy).
    pub quantile: PerOutput<f64>,
    pub metrics: Vec<Metric>,
}

impl Default for Criterion {
    fn default() -> Self {
        Criterion {
            atol: PerOutput::new(1e-5),
            rtol: PerOutput::new(1e-5),
            stat: PerOutput::new(ErrorStat::Elemwise),
            quantile: PerOutput::new(DEFAULT_QUANTILE),
            metrics: Vec::new(),
        }
    }
}

/// Polygraphy's default `--error-quantile`.
pub const DEFAULT_QUANTILE: f64 = 0.99;

/// A histogram: the counts of 10 bins and their 11 edges.
pub type Histogram = Option<(Vec<u64>, Vec<f64>)>;

/// Difference statistics of one output against its reference.
#[derive(Clone, Debug, Serialize)]
pub struct OutputComparison {
    pub name: String,
    pub shape: Vec<usize>,
    pub dtype: String,
    pub reference_dtype: String,
    pub stat: ErrorStat,
    pub atol: f64,
    pub rtol: f64,
    pub max_absdiff: f64,
    pub max_reldiff: f64,
    pub mean_absdiff: f64,
    pub mean_reldiff: f64,
    pub median_absdiff: f64,
    pub median_reldiff: f64,
    /// With `--check-error-stat quantile`: the quantile and the differences' values at it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_quantile: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantile_absdiff: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantile_reldiff: Option<f64>,
    /// The tolerance the chosen statistic needs: `[abs] OR [rel]`.
    pub required_atol: f64,
    pub required_rtol: f64,
    /// Stats of the output, the reference, and the absolute and relative differences.
    pub output_stats: Stats,
    pub reference_stats: Stats,
    pub absdiff_stats: Stats,
    pub reldiff_stats: Stats,
    /// Histograms of output and reference over their common range, and of the differences.
    #[serde(skip)]
    pub histograms: [Histogram; 4],
    /// The elements of output, reference, absdiff and reldiff, kept for outputs of at most
    /// [`SMALL_OUTPUT`] elements (which Polygraphy prints in full).
    #[serde(skip)]
    pub values: Option<[Vec<f64>; 4]>,
    /// Whether the tolerance check passed.
    pub tolerance_passed: bool,
    pub metrics: Vec<MetricResult>,
    /// Tolerance and every metric passed.
    pub passed: bool,
}

/// Outputs of at most this many elements are printed in full (Polygraphy's threshold).
pub const SMALL_OUTPUT: usize = 100;

/// A tensor's values as f64, or an error naming the output and which side it is.
fn numeric(name: &str, t: &Tensor, which: &str) -> Result<Vec<f64>> {
    to_f64(t).ok_or_else(|| {
        Error::Invalid(format!(
            "output '{name}': the {which} has dtype {}, which cannot be compared numerically",
            t.dtype()
        ))
    })
}

/// Both tensors' values as f64 and their elementwise absolute and relative differences; an
/// error when the shapes differ or a side is not numeric.
#[allow(clippy::type_complexity)]
fn values_and_diffs(
    name: &str,
    out: &Tensor,
    reference: &Tensor,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>)> {
    if out.shape() != reference.shape() {
        return Err(Error::Invalid(format!(
            "output '{name}': shape {} does not match the reference shape {}",
            fmt_shape(out.shape()),
            fmt_shape(reference.shape())
        )));
    }
    // Polygraphy's files (from ONNX Runtime's Python API, or mixprec's own) hold float8 and
    // float4 outputs as uint8 bit patterns and int4 as int8: read such a reference in the
    // output's type (src/data/npy.rs).
    let converted;
    let reference =
        if out.dtype().is_low_bit() && matches!(reference.dtype(), DType::U8 | DType::I8) {
            converted = crate::data::npy::as_low_bit(reference.clone(), out.dtype())
                .map_err(|e| Error::Invalid(format!("output '{name}': the reference: {e}")))?;
            &converted
        } else {
            reference
        };
    let a = numeric(name, out, "output")?;
    let b = numeric(name, reference, "reference")?;
    let (absdiff, reldiff) = diff_values(out, reference, &a, &b);
    Ok((a, b, absdiff, reldiff))
}

/// The elementwise check: no element fails both the absolute and the relative tolerance.
fn elementwise_passed(absdiff: &[f64], reldiff: &[f64], atol: f64, rtol: f64) -> bool {
    !absdiff
        .par_iter()
        .zip(reldiff.par_iter())
        .any(|(&x, &r)| stat_failed(x, atol) && stat_failed(r, rtol))
}

/// Whether a metric that applies to this output replaces its tolerance check (`tokens:MIN`:
/// equal ids are the criterion, not their numeric distance).
fn tolerance_replaced(criterion: &Criterion, name: &str) -> bool {
    criterion
        .metrics
        .iter()
        .any(|m| m.replaces_tolerance() && m.applies_to(name))
}

/// The criterion's metrics that apply to this output, evaluated.
fn evaluate_metrics(
    criterion: &Criterion,
    name: &str,
    a: &[f64],
    b: &[f64],
    shape: &[usize],
) -> Vec<MetricResult> {
    criterion
        .metrics
        .iter()
        .filter(|m| m.applies_to(name))
        .map(|m| m.evaluate(a, b, shape))
        .collect()
}

/// The verdict on one output and the tolerances it needs, as [`compare_output`] computes them
/// (the same numbers) but without the statistics of both sides and the histograms: what a
/// precision search needs for every candidate, at a fraction of the cost.
#[derive(Clone, Debug)]
pub struct OutputCheck {
    pub stat: ErrorStat,
    pub atol: f64,
    pub rtol: f64,
    pub required_atol: f64,
    pub required_rtol: f64,
    pub metrics: Vec<MetricResult>,
    /// Tolerance and every metric passed.
    pub passed: bool,
}

/// Checks one output against its reference under the criterion (see [`OutputCheck`]).
pub fn check_output(
    name: &str,
    out: &Tensor,
    reference: &Tensor,
    criterion: &Criterion,
) -> Result<OutputCheck> {
    if let Some(c) = check_max_f32(name, out, reference, criterion) {
        return Ok(c);
    }
    check_output_general(name, out, reference, criterion)
}

/// [`check_output`] for any statistic, dtypes and metrics, through f64 copies of both sides.
fn check_output_general(
    name: &str,
    out: &Tensor,
    reference: &Tensor,
    criterion: &Criterion,
) -> Result<OutputCheck> {
    let (a, b, absdiff, reldiff) = values_and_diffs(name, out, reference)?;
    let stat = criterion.stat.get(name);
    let atol = criterion.atol.get(name);
    let rtol = criterion.rtol.get(name);
    let required = |v: &[f64]| -> f64 {
        let (mean, min, max) = stats::mean_min_max(v);
        match stat {
            ErrorStat::Elemwise | ErrorStat::Max => max,
            ErrorStat::Mean => mean,
            ErrorStat::Median => stats::quantile_in_range(v, 0.5, min, max),
            ErrorStat::Quantile => {
                stats::quantile_in_range(v, criterion.quantile.get(name), min, max)
            }
        }
    };
    let (required_atol, required_rtol) = rayon::join(|| required(&absdiff), || required(&reldiff));
    let tolerance_passed = tolerance_replaced(criterion, name)
        || match stat {
            ErrorStat::Elemwise => elementwise_passed(&absdiff, &reldiff, atol, rtol),
            _ => !(stat_failed(required_atol, atol) && stat_failed(required_rtol, rtol)),
        };
    let metrics = evaluate_metrics(criterion, name, &a, &b, out.shape());
    let passed = tolerance_passed && metrics.iter().all(|m| m.passed);
    Ok(OutputCheck {
        stat,
        atol,
        rtol,
        required_atol,
        required_rtol,
        metrics,
        passed,
    })
}

/// [`check_output`] in one pass, without the four f64 copies of the general path, where the
/// answer is a maximum: two float32 tensors of one shape, the elementwise or max statistic,
/// no metric for this output. A search compares every candidate's outputs this way
/// (PP-OCRv4 rec's [1, 20, 6625] output: ~0.5 ms an evaluation through the copies). The same
/// numbers as the general path: each element's [`difference`], maxima that are NaN when any
/// value is (`check_max_f32_gives_the_numbers_of_the_general_path`).
fn check_max_f32(
    name: &str,
    out: &Tensor,
    reference: &Tensor,
    criterion: &Criterion,
) -> Option<OutputCheck> {
    let stat = criterion.stat.get(name);
    if !matches!(stat, ErrorStat::Elemwise | ErrorStat::Max)
        || criterion.metrics.iter().any(|m| m.applies_to(name))
        || out.shape() != reference.shape()
    {
        return None;
    }
    let (TensorData::F32(a), TensorData::F32(b)) = (out.data(), reference.data()) else {
        return None;
    };
    let (atol, rtol) = (criterion.atol.get(name), criterion.rtol.get(name));
    // (largest absolute difference, largest relative one, an element fails both tolerances);
    // a NaN difference makes its maximum NaN.
    let fold = |acc: (f64, f64, bool), (&x, &y): (&f32, &f32)| {
        let (abs, rel) = difference(x as f64, y as f64, true);
        (
            nan_max(acc.0, abs),
            nan_max(acc.1, rel),
            acc.2 || (stat_failed(abs, atol) && stat_failed(rel, rtol)),
        )
    };
    let start = (f64::NEG_INFINITY, f64::NEG_INFINITY, false);
    let merge = |p: (f64, f64, bool), q: (f64, f64, bool)| {
        (nan_max(p.0, q.0), nan_max(p.1, q.1), p.2 || q.2)
    };
    let (max_abs, max_rel, elem_failed) = if a.len() >= 1 << 16 {
        a.par_iter()
            .zip(b.par_iter())
            .fold(|| start, fold)
            .reduce(|| start, merge)
    } else {
        a.iter().zip(b.iter()).fold(start, fold)
    };
    // An empty output: the general path's statistics are zero.
    let (max_abs, max_rel) = if a.is_empty() {
        (0.0, 0.0)
    } else {
        (max_abs, max_rel)
    };
    let passed = match stat {
        ErrorStat::Elemwise => !elem_failed,
        _ => !(stat_failed(max_abs, atol) && stat_failed(max_rel, rtol)),
    };
    Some(OutputCheck {
        stat,
        atol,
        rtol,
        required_atol: max_abs,
        required_rtol: max_rel,
        metrics: Vec::new(),
        passed,
    })
}

/// The larger of two values, NaN when either is.
fn nan_max(p: f64, q: f64) -> f64 {
    if p.is_nan() || q.is_nan() {
        f64::NAN
    } else {
        p.max(q)
    }
}

/// Compares one output with its reference under the criterion.
pub fn compare_output(
    name: &str,
    out: &Tensor,
    reference: &Tensor,
    criterion: &Criterion,
) -> Result<OutputComparison> {
    let (a, b, absdiff, reldiff) = values_and_diffs(name, out, reference)?;
    let shape = out.shape();
    let stat = criterion.stat.get(name);
    let atol = criterion.atol.get(name);
    let rtol = criterion.rtol.get(name);
    let is_bool = out.dtype() == DType::Bool;
    let ref_bool = reference.dtype() == DType::Bool;
    let (((sa, sb), (sabs, srel)), elem_ok) = rayon::join(
        || {
            rayon::join(
                || {
                    rayon::join(
                        || Stats::compute(&a, shape, !is_bool),
                        || Stats::compute(&b, shape, !ref_bool),
                    )
                },
                || {
                    rayon::join(
                        || Stats::compute(&absdiff, shape, true),
                        || Stats::compute(&reldiff, shape, true),
                    )
                },
            )
        },
        || stat != ErrorStat::Elemwise || elementwise_passed(&absdiff, &reldiff, atol, rtol),
    );
    let quantile = (stat == ErrorStat::Quantile).then(|| {
        let q = criterion.quantile.get(name);
        (
            q,
            stats::quantile_in_range(&absdiff, q, sabs.min, sabs.max),
            stats::quantile_in_range(&reldiff, q, srel.min, srel.max),
        )
    });
    let (req_a, req_r) = match (stat, quantile) {
        (ErrorStat::Quantile, Some((_, qa, qr))) => (qa, qr),
        (ErrorStat::Mean, _) => (sabs.mean, srel.mean),
        (ErrorStat::Median, _) => (sabs.median, srel.median),
        _ => (sabs.max, srel.max),
    };
    let tolerance_passed = tolerance_replaced(criterion, name)
        || match stat {
            ErrorStat::Elemwise => elem_ok,
            _ => !(stat_failed(req_a, atol) && stat_failed(req_r, rtol)),
        };
    // Both sides' histograms share a range, so they can be read against each other.
    let lo = sa.min.min(sb.min);
    let hi = sa.max.max(sb.max);
    let side_range = (!(sa.min.is_nan() || sb.min.is_nan())).then_some((lo, hi));
    let side_hist = |v: &[f64], bool_dtype: bool| {
        side_range
            .filter(|_| !bool_dtype)
            .and_then(|r| stats::histogram(v, Some(r)))
    };
    let histograms = [
        side_hist(&a, is_bool),
        side_hist(&b, ref_bool),
        stats::histogram(&absdiff, Some((sabs.min, sabs.max))),
        stats::histogram(&reldiff, Some((srel.min, srel.max))),
    ];
    let metrics = evaluate_metrics(criterion, name, &a, &b, shape);
    let passed = tolerance_passed && metrics.iter().all(|m| m.passed);
    let values = (a.len() <= SMALL_OUTPUT).then_some([a, b, absdiff, reldiff]);
    Ok(OutputComparison {
        name: name.to_string(),
        shape: shape.to_vec(),
        dtype: out.dtype().to_string(),
        reference_dtype: reference.dtype().to_string(),
        stat,
        atol,
        rtol,
        max_absdiff: sabs.max,
        max_reldiff: srel.max,
        mean_absdiff: sabs.mean,
        mean_reldiff: srel.mean,
        median_absdiff: sabs.median,
        median_reldiff: srel.median,
        error_quantile: quantile.map(|q| q.0),
        quantile_absdiff: quantile.map(|q| q.1),
        quantile_reldiff: quantile.map(|q| q.2),
        required_atol: req_a,
        required_rtol: req_r,
        output_stats: sa,
        reference_stats: sb,
        absdiff_stats: sabs,
        reldiff_stats: srel,
        histograms,
        values,
        tolerance_passed,
        metrics,
        passed,
    })
}

/// Polygraphy's `_simple_stat_failed`: NaN fails.
fn stat_failed(v: f64, tol: f64) -> bool {
    v.is_nan() || v > tol
}

/// Elementwise absolute and relative differences, as f64. When both sides are float32 or
/// float16, they are computed in f32 arithmetic, as Polygraphy (NumPy on float32 arrays) does.
/// A zero reference value gets 2.22e-16 added first; matching infinities compare equal.
pub fn diffs(name: &str, out: &Tensor, reference: &Tensor) -> Result<(Vec<f64>, Vec<f64>)> {
    if let (TensorData::Bool(a), TensorData::Bool(b)) = (out.data(), reference.data()) {
        let abs: Vec<f64> = a.iter().zip(b).map(|(x, y)| (x ^ y) as u8 as f64).collect();
        let rel = abs.iter().map(|&d| d / EPSILON).collect();
        return Ok((abs, rel));
    }
    let a = numeric(name, out, "output")?;
    let b = numeric(name, reference, "reference")?;
    Ok(diff_values(out, reference, &a, &b))
}

/// `diffs` of the tensors' values already widened to f64.
fn diff_values(out: &Tensor, reference: &Tensor, a: &[f64], b: &[f64]) -> (Vec<f64>, Vec<f64>) {
    if let (TensorData::Bool(_), TensorData::Bool(_)) = (out.data(), reference.data()) {
        let abs: Vec<f64> = a.iter().zip(b).map(|(x, y)| (x - y).abs()).collect();
        let rel = abs.iter().map(|&d| d / EPSILON).collect();
        return (abs, rel);
    }
    let f32ish = |t: &Tensor| matches!(t.dtype(), DType::F32 | DType::F16);
    let single = f32ish(out) && f32ish(reference);
    let one = |(&x, &y): (&f64, &f64)| difference(x, y, single);
    if a.len() >= 1 << 16 {
        a.par_iter().zip(b.par_iter()).map(one).unzip()
    } else {
        a.iter().zip(b).map(one).unzip()
    }
}

/// One element's absolute and relative difference (`x` the output, `y` the reference):
/// matching infinities differ by 0, a zero reference counts as 2.22e-16; with `single` (both
/// sides float32 or float16) in f32 arithmetic, as NumPy on float32 arrays.
fn difference(x: f64, y: f64, single: bool) -> (f64, f64) {
    let d = if x.is_infinite() && x == y {
        0.0
    } else {
        (x - y).abs()
    };
    let denom = if y == 0.0 { EPSILON } else { y.abs() };
    if single {
        let d32 = d as f32;
        (d32 as f64, (d32 / denom as f32) as f64)
    } else {
        (d, d / denom)
    }
}

const EPSILON: f64 = 2.220446049250313e-16;

/// The elements as f64 (None for strings), in parallel for large f32 tensors.
fn to_f64(t: &Tensor) -> Option<Vec<f64>> {
    match t.data() {
        TensorData::F32(v) if v.len() >= 1 << 16 => Some(v.par_iter().map(|&x| x as f64).collect()),
        _ => t.to_f64_vec(),
    }
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
    /// The one-pass check gives the general path's numbers and verdict, bit for bit: NaN,
    /// infinities, zeros of both signs and subnormals on either side, both statistics it
    /// takes, tolerances around the differences, below and above the parallel size.
    #[test]
    fn check_max_f32_gives_the_numbers_of_the_general_path() {
        let mut rng = crate::data::loader::Mt19937::new(5);
        let special = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            65504.0,
        ];
        let mut checked = 0;
        for n in [0usize, 1, 7, 1000, 70_000] {
            for with_special in [false, true] {
                let mut draw = |scale: f64| -> Vec<f32> {
                    (0..n)
                        .map(|_| {
                            let u = rng.random_sample();
                            if with_special && u < 0.01 {
                                special[(u * 700.0) as usize % special.len()]
                            } else {
                                ((rng.random_sample() - 0.5) * scale) as f32
                            }
                        })
                        .collect()
                };
                let reference = draw(4.0);
                let noise = draw(0.01);
                let out: Vec<f32> = if with_special {
                    draw(4.0)
                } else {
                    reference.iter().zip(&noise).map(|(r, e)| r + e).collect()
                };
                let (o, r) = (
                    Tensor::from_f32(vec![n], out),
                    Tensor::from_f32(vec![n], reference),
                );
                for stat in [ErrorStat::Elemwise, ErrorStat::Max] {
                    for tol in [1e-3, 3e-3, 1e-2, 1.0] {
                        let criterion = Criterion {
                            atol: PerOutput::new(tol),
                            rtol: PerOutput::new(tol),
                            stat: PerOutput::new(stat),
                            ..Criterion::default()
                        };
                        let fast = super::check_max_f32("y", &o, &r, &criterion).unwrap();
                        let general = super::check_output_general("y", &o, &r, &criterion).unwrap();
                        assert_eq!(
                            fast.required_atol.to_bits(),
                            general.required_atol.to_bits(),
                            "{n} {stat:?} {tol}"
                        );
                        assert_eq!(
                            fast.required_rtol.to_bits(),
                            general.required_rtol.to_bits(),
                            "{n} {stat:?} {tol}"
                        );
                        assert_eq!(fast.passed, general.passed, "{n} {stat:?} {tol}");
                        checked += usize::from(general.passed);
                    }
                }
            }
        }
        // Both verdicts occur.
        assert!(checked > 0 && checked < 80, "{checked}");
    }

    use super::*;

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_f32(vec![v.len()], v.to_vec())
    }

    #[test]
    fn check_output_agrees_with_compare_output() {
        // Values around the tolerances, with and without NaN and inf, every statistic.
        let n = 70_001; // above the parallel thresholds
        let r: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 1001) as f32 - 500.0) / 97.0)
            .collect();
        let mut o: Vec<f32> = r
            .iter()
            .enumerate()
            .map(|(i, x)| x + ((i * 13 % 17) as f32 - 8.0) * 1e-4)
            .collect();
        let cases: Vec<Vec<f32>> = vec![o.clone(), {
            o[5] = f32::NAN;
            o[9] = f32::INFINITY;
            o.clone()
        }];
        for out in cases {
            for stat in [
                ErrorStat::Elemwise,
                ErrorStat::Max,
                ErrorStat::Mean,
                ErrorStat::Median,
                ErrorStat::Quantile,
            ] {
                for tol in [1e-5, 5e-4, 1e-3] {
                    let c = Criterion {
                        atol: PerOutput::new(tol),
                        rtol: PerOutput::new(tol),
                        stat: PerOutput::new(stat),
                        ..Default::default()
                    };
                    let full = compare_output("y", &t(&out), &t(&r), &c).unwrap();
                    let fast = check_output("y", &t(&out), &t(&r), &c).unwrap();
                    let same = |a: f64, b: f64| a == b || (a.is_nan() && b.is_nan());
                    assert!(same(full.required_atol, fast.required_atol), "{stat:?}");
                    assert!(same(full.required_rtol, fast.required_rtol), "{stat:?}");
                    assert_eq!(full.passed, fast.passed, "{stat:?} {tol}");
                }
            }
        }
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
    fn quantile_stat_is_numpys_quantile_of_the_differences() {
        // absdiff = 0, 1, ..., 9 (reference 100, so reldiff = absdiff / 100).
        let out: Vec<f32> = (0..10).map(|i| 100.0 + i as f32).collect();
        let reference = [100.0f32; 10];
        let mut c = Criterion {
            stat: PerOutput::new(ErrorStat::Quantile),
            atol: PerOutput::new(8.0),
            rtol: PerOutput::new(0.0),
            ..Default::default()
        };
        // numpy.quantile(np.arange(10), 0.99) == 8.91: fails atol 8.
        let r = compare_output("y", &t(&out), &t(&reference), &c).unwrap();
        assert!((r.required_atol - 8.91).abs() < 1e-12, "{r:?}");
        assert!((r.required_rtol - 0.0891).abs() < 1e-8, "{r:?}");
        assert_eq!(r.error_quantile, Some(0.99));
        assert_eq!(r.quantile_absdiff, Some(r.required_atol));
        assert!(!r.passed);
        // numpy.quantile(np.arange(10), 0.85) == 7.65: passes; per output, as Polygraphy.
        c.quantile =
            PerOutput::parse_list(&["y:0.85".into()], 0.99, "q", |s| s.parse().ok()).unwrap();
        let r = compare_output("y", &t(&out), &t(&reference), &c).unwrap();
        assert!((r.required_atol - 7.65).abs() < 1e-12 && r.passed, "{r:?}");
        let r = compare_output("z", &t(&out), &t(&reference), &c).unwrap();
        assert!(!r.passed, "other outputs keep the default 0.99");
        // q = 0.5 is the median; q = 1 the max; a NaN difference fails.
        c.quantile = PerOutput::new(0.5);
        let r = compare_output("y", &t(&out), &t(&reference), &c).unwrap();
        assert_eq!(r.required_atol, r.median_absdiff);
        c.quantile = PerOutput::new(1.0);
        let r = compare_output("y", &t(&out), &t(&reference), &c).unwrap();
        assert_eq!(r.required_atol, 9.0);
        let r = compare_output("y", &t(&[f32::NAN, 1.0]), &t(&[1.0, 1.0]), &c).unwrap();
        assert!(r.required_atol.is_nan() && !r.passed);
        // Other statistics leave the quantile fields out of the JSON.
        let r = compare_output("y", &t(&out), &t(&reference), &Criterion::default()).unwrap();
        assert!(r.quantile_absdiff.is_none());
        assert!(!serde_json::to_string(&r).unwrap().contains("quantile"));
        assert_eq!(ErrorStat::parse("quantile").unwrap(), ErrorStat::Quantile);
        assert!(ErrorStat::parse("p99")
            .unwrap_err()
            .to_string()
            .contains("quantile"));
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
