//! Extra pass criteria beyond the elementwise tolerances (`--metric`).
//!
//! | spec                          | value                                              | passes when      |
//! |-------------------------------|----------------------------------------------------|------------------|
//! | `cosine:MIN`                  | cosine similarity of output and reference           | value >= MIN     |
//! | `snr:MIN_DB`                  | 10·log10(mean(ref²) / mean((out-ref)²)) in dB        | value >= MIN_DB  |
//! | `topk:K:MIN`                  | mean over rows of the last axis of the share of the reference's top-K indices that are also in the output's top-K | value >= MIN |
//! | `max-rel-above:FLOOR:MAX`     | max of \|out-ref\|/\|ref\| over elements with \|ref\| > FLOOR (0 if none) | value <= MAX |
//! | `kl:MAX`                      | mean over rows of the last axis of KL(softmax(ref) ‖ softmax(out)) in nats | value <= MAX |
//! | `tokens:MIN`                  | the share of elements equal to the reference's      | value >= MIN     |
//!
//! Any spec may be prefixed by an output name (`logits:topk:5:0.99`) to apply to that output
//! only. A bare `tokens:MIN` applies to the output named `tokens` (what `--decode` generates);
//! on an output it applies to, it replaces the tolerance check (equal ids are the criterion,
//! not their numeric distance). A NaN value fails. Cosine follows Polygraphy's `CosineSimilarityCompareFunc` (1 when
//! both are all-zero, 0 when one is, clamped to [-1, 1]); SNR follows its `SnrCompareFunc` (inf
//! for identical arrays, -inf for a zero signal) with the reference as the signal.

use crate::error::{Error, Result};
use rayon::prelude::*;
use serde::Serialize;

const PAR_MIN: usize = 1 << 16;
const CHUNK: usize = 1 << 15;

/// The output a bare `tokens:MIN` applies to: the ids `--decode` generates
/// (`TOKENS` of the decode module).
pub const TOKENS_OUTPUT: &str = "tokens";

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "metric", rename_all = "kebab-case")]
pub enum MetricKind {
    Cosine { min: f64 },
    Snr { min_db: f64 },
    Topk { k: usize, min: f64 },
    MaxRelAbove { floor: f64, max: f64 },
    Kl { max: f64 },
    Tokens { min: f64 },
}

/// One `--metric` criterion, for every output or for one.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub output: Option<String>,
    pub kind: MetricKind,
}

/// A metric's value on one output and its verdict.
#[derive(Clone, Debug, Serialize)]
pub struct MetricResult {
    pub name: String,
    #[serde(flatten)]
    pub kind: MetricKind,
    pub value: f64,
    pub passed: bool,
}

fn num(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|x| !x.is_nan())
}

impl MetricKind {
    fn parse(s: &str) -> Option<MetricKind> {
        let parts: Vec<&str> = s.split(':').collect();
        Some(match parts.as_slice() {
            ["cosine", v] => MetricKind::Cosine { min: num(v)? },
            ["snr", v] => MetricKind::Snr { min_db: num(v)? },
            ["topk", k, v] => MetricKind::Topk {
                k: k.trim().parse().ok().filter(|&k: &usize| k > 0)?,
                min: num(v)?,
            },
            ["max-rel-above", f, v] => MetricKind::MaxRelAbove {
                floor: num(f)?,
                max: num(v)?,
            },
            ["kl", v] => MetricKind::Kl { max: num(v)? },
            ["tokens", v] => MetricKind::Tokens {
                min: num(v).filter(|f| (0.0..=1.0).contains(f))?,
            },
            _ => return None,
        })
    }

    pub fn label(&self) -> String {
        match self {
            MetricKind::Cosine { .. } => "Cosine Similarity".into(),
            MetricKind::Snr { .. } => "SNR".into(),
            MetricKind::Topk { k, .. } => format!("Top-{k} Agreement"),
            MetricKind::MaxRelAbove { floor, .. } => {
                format!("Max Relative Error (|ref| > {})", super::fmt_g(*floor, 5))
            }
            MetricKind::Kl { .. } => "KL Divergence".into(),
            MetricKind::Tokens { .. } => "Token Agreement".into(),
        }
    }

    pub fn threshold(&self) -> f64 {
        match *self {
            MetricKind::Cosine { min }
            | MetricKind::Topk { min, .. }
            | MetricKind::Tokens { min } => min,
            MetricKind::Snr { min_db } => min_db,
            MetricKind::MaxRelAbove { max, .. } | MetricKind::Kl { max } => max,
        }
    }

    pub fn higher_is_better(&self) -> bool {
        !matches!(self, MetricKind::MaxRelAbove { .. } | MetricKind::Kl { .. })
    }

    pub fn unit(&self) -> &'static str {
        match self {
            MetricKind::Snr { .. } => " dB",
            _ => "",
        }
    }

    /// The metric of `out` against `reference` (same length; `shape` for top-k rows).
    pub fn compute(&self, out: &[f64], reference: &[f64], shape: &[usize]) -> f64 {
        match *self {
            MetricKind::Cosine { .. } => cosine(out, reference),
            MetricKind::Snr { .. } => snr(out, reference),
            MetricKind::Topk { k, .. } => topk_agreement(out, reference, shape, k),
            MetricKind::MaxRelAbove { floor, .. } => max_rel_above(out, reference, floor),
            MetricKind::Kl { .. } => kl_divergence(out, reference, shape),
            MetricKind::Tokens { .. } => agreement(out, reference),
        }
    }

    pub fn passed(&self, value: f64) -> bool {
        if self.higher_is_better() {
            value >= self.threshold()
        } else {
            value <= self.threshold()
        }
    }
}

impl Metric {
    /// Parses `[output:]kind:args`. Output names may contain colons: the first split whose rest
    /// is a valid metric wins.
    pub fn parse(s: &str) -> Result<Metric> {
        if let Some(kind) = MetricKind::parse(s) {
            return Ok(Metric { output: None, kind });
        }
        for (i, _) in s.match_indices(':') {
            if let Some(kind) = MetricKind::parse(&s[i + 1..]) {
                return Ok(Metric {
                    output: Some(s[..i].to_string()),
                    kind,
                });
            }
        }
        Err(Error::Invalid(format!(
            "--metric: cannot parse '{s}': expected [OUTPUT:]cosine:MIN, snr:MIN_DB, \
             topk:K:MIN, max-rel-above:FLOOR:MAX, kl:MAX or tokens:MIN (MIN in [0, 1])"
        )))
    }

    pub fn applies_to(&self, output: &str) -> bool {
        match (&self.output, self.kind) {
            (Some(o), _) => o == output,
            (None, MetricKind::Tokens { .. }) => output == TOKENS_OUTPUT,
            (None, _) => true,
        }
    }

    /// Whether the metric replaces the tolerance check on the outputs it applies to.
    pub fn replaces_tolerance(&self) -> bool {
        matches!(self.kind, MetricKind::Tokens { .. })
    }

    pub fn evaluate(&self, out: &[f64], reference: &[f64], shape: &[usize]) -> MetricResult {
        let value = self.kind.compute(out, reference, shape);
        MetricResult {
            name: self.kind.label(),
            kind: self.kind,
            value,
            passed: self.kind.passed(value),
        }
    }
}

impl MetricResult {
    /// Polygraphy's metric line: `Cosine Similarity: 0.99 (min required: 0.999) | FAILED`.
    pub fn line(&self) -> String {
        let label = if self.kind.higher_is_better() {
            "min required"
        } else {
            "tolerance"
        };
        let (v, t) = format_pair(self.value, self.kind.threshold());
        let unit = self.kind.unit();
        format!(
            "{}: {v}{unit} ({label}: {t}{unit}) | {}",
            self.name,
            if self.passed { "PASSED" } else { "FAILED" }
        )
    }
}

/// Enough significant digits that a value and its threshold print differently when they differ.
fn format_pair(value: f64, threshold: f64) -> (String, String) {
    for p in 5..18 {
        let (a, b) = (super::fmt_g(value, p), super::fmt_g(threshold, p));
        if value == threshold || a != b {
            return (a, b);
        }
    }
    (super::fmt_g(value, 17), super::fmt_g(threshold, 17))
}

/// Sums of three products over pairs, in parallel for large arrays.
fn sums3(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> [f64; 3] + Sync) -> [f64; 3] {
    let g = |x: &[f64], y: &[f64]| {
        let mut s = [0.0; 3];
        for (&p, &q) in x.iter().zip(y) {
            let t = f(p, q);
            s[0] += t[0];
            s[1] += t[1];
            s[2] += t[2];
        }
        s
    };
    if a.len() < PAR_MIN {
        return g(a, b);
    }
    a.par_chunks(CHUNK)
        .zip(b.par_chunks(CHUNK))
        .map(|(x, y)| g(x, y))
        .reduce(|| [0.0; 3], |u, v| [u[0] + v[0], u[1] + v[1], u[2] + v[2]])
}

pub fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let [dot, na, nb] = sums3(a, b, |x, y| [x * y, x * x, y * y]);
    let (na, nb) = (na.sqrt(), nb.sqrt());
    if na == 0.0 && nb == 0.0 {
        return 1.0;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    let c = dot / (na * nb);
    if c.is_nan() {
        c
    } else {
        c.clamp(-1.0, 1.0)
    }
}

/// SNR in dB with `reference` as the signal.
pub fn snr(out: &[f64], reference: &[f64]) -> f64 {
    if out.is_empty() {
        return f64::INFINITY;
    }
    let [signal, noise, _] = sums3(out, reference, |x, y| [y * y, (x - y) * (x - y), 0.0]);
    if noise.is_nan() || signal.is_nan() {
        return f64::NAN;
    }
    if noise == 0.0 {
        return f64::INFINITY;
    }
    if signal == 0.0 {
        return f64::NEG_INFINITY;
    }
    10.0 * (signal / noise).log10()
}

/// Indices of the k largest values (ties: lower index first; NaN counts as largest).
fn topk_set(row: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    let cmp = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_unstable();
    idx
}

/// Mean over rows of the last axis of |topk(out) ∩ topk(ref)| / k (k clamped to the row length).
pub fn topk_agreement(out: &[f64], reference: &[f64], shape: &[usize], k: usize) -> f64 {
    let row = shape.last().copied().unwrap_or(1).max(1);
    if out.is_empty() {
        return 1.0;
    }
    let k = k.min(row);
    let rows = out.len() / row;
    let agree = |(a, b): (&[f64], &[f64])| {
        let (x, y) = (topk_set(a, k), topk_set(b, k));
        let common = x.iter().filter(|i| y.binary_search(i).is_ok()).count();
        common as f64 / k as f64
    };
    let total: f64 = if out.len() < PAR_MIN {
        out.chunks(row).zip(reference.chunks(row)).map(agree).sum()
    } else {
        out.par_chunks(row)
            .zip(reference.par_chunks(row))
            .map(agree)
            .sum()
    };
    total / rows.max(1) as f64
}

/// Max of |out-ref|/|ref| over elements with |ref| > floor; NaN if any such difference is NaN.
pub fn max_rel_above(out: &[f64], reference: &[f64], floor: f64) -> f64 {
    let f = |x: &[f64], y: &[f64]| {
        let mut m = 0.0f64;
        for (&p, &q) in x.iter().zip(y) {
            if q.abs() > floor || q.is_nan() {
                let r = (p - q).abs() / q.abs();
                if r.is_nan() {
                    return f64::NAN;
                }
                m = m.max(r);
            }
        }
        m
    };
    let nan_max = |a: f64, b: f64| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    };
    if out.len() < PAR_MIN {
        f(out, reference)
    } else {
        out.par_chunks(CHUNK)
            .zip(reference.par_chunks(CHUNK))
            .map(|(x, y)| f(x, y))
            .reduce(|| 0.0, nan_max)
    }
}

/// The share of elements equal in both (1 for none); NaN never equals.
pub fn agreement(out: &[f64], reference: &[f64]) -> f64 {
    if out.is_empty() {
        return 1.0;
    }
    let same = out.iter().zip(reference).filter(|(a, b)| a == b).count();
    same as f64 / out.len() as f64
}

/// Mean over rows of the last axis of KL(softmax(reference) ‖ softmax(out)) in nats: how
/// much the candidate's distribution over classes departs from the reference's (0 when equal).
/// A NaN anywhere makes it NaN; a class the reference gives weight and the output none makes
/// it infinite; classes the reference gives none (−inf logits) add nothing.
pub fn kl_divergence(out: &[f64], reference: &[f64], shape: &[usize]) -> f64 {
    let row = shape.last().copied().unwrap_or(1).max(1);
    if out.is_empty() {
        return 0.0;
    }
    let log_softmax = |x: &[f64]| -> Vec<f64> {
        let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if x.iter().any(|v| v.is_nan()) || m == f64::INFINITY {
            return vec![f64::NAN; x.len()];
        }
        let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        x.iter().map(|v| v - lse).collect()
    };
    let kl = |(a, b): (&[f64], &[f64])| {
        let (lq, lp) = (log_softmax(a), log_softmax(b));
        let mut s = 0.0;
        for (q, p) in lq.iter().zip(&lp) {
            if p.is_nan() || q.is_nan() {
                return f64::NAN;
            }
            if *p == f64::NEG_INFINITY {
                continue;
            }
            s += p.exp() * (p - q);
        }
        s.max(0.0)
    };
    let rows = out.len() / row;
    let total: f64 = if out.len() < PAR_MIN {
        out.chunks(row).zip(reference.chunks(row)).map(kl).sum()
    } else {
        out.par_chunks(row)
            .zip(reference.par_chunks(row))
            .map(kl)
            .sum()
    };
    total / rows.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    // NumPy: x=[1,2,3,4], y=[1.1,1.9,3.2,3.8]
    //   (x*y).sum()/sqrt((x*x).sum())/sqrt((y*y).sum()) = 0.9983545784974293
    //   10*log10(mean(x**2)/mean((x-y)**2)) = 24.77121254719662 (x as the reference)
    #[test]
    fn cosine_and_snr_match_numpy() {
        let x = [1.0, 2.0, 3.0, 4.0];
        let y = [1.1, 1.9, 3.2, 3.8];
        assert!((cosine(&y, &x) - 0.9983545784974293).abs() < 1e-12);
        assert!((snr(&y, &x) - 24.77121254719662).abs() < 1e-9);
        assert_eq!(snr(&x, &x), f64::INFINITY);
        assert_eq!(cosine(&[0.0, 0.0], &[0.0, 0.0]), 1.0);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert!(cosine(&[f64::NAN], &[1.0]).is_nan());
    }

    #[test]
    fn topk_and_max_rel() {
        // Row 0: top-2 of ref {3, 2}, of out {3, 1} -> 1/2; row 1: identical -> 1.
        let r = [0.1, 0.2, 0.3, 0.9, 5.0, 4.0, 3.0, 2.0];
        let o = [0.1, 0.35, 0.3, 0.9, 5.0, 4.0, 3.0, 2.0];
        assert_eq!(topk_agreement(&o, &r, &[2, 4], 2), 0.75);
        assert_eq!(topk_agreement(&o, &r, &[2, 4], 10), 1.0);
        // |ref| > 0.15: 0.2 -> 0.75, 0.3 -> 0, ...: max 0.75; the 0.1 element is ignored.
        assert!((max_rel_above(&o, &r, 0.15) - 0.75).abs() < 1e-12);
        assert_eq!(max_rel_above(&o, &r, 100.0), 0.0);
        assert!(max_rel_above(&[f64::NAN], &[1.0], 0.0).is_nan());
    }

    #[test]
    fn parse_specs() {
        let m = Metric::parse("cosine:0.999").unwrap();
        assert_eq!(
            (m.output, m.kind),
            (None, MetricKind::Cosine { min: 0.999 })
        );
        let m = Metric::parse("a:b:topk:5:0.99").unwrap();
        assert_eq!(m.output.as_deref(), Some("a:b"));
        assert_eq!(m.kind, MetricKind::Topk { k: 5, min: 0.99 });
        let m = Metric::parse("max-rel-above:1e-3:0.01").unwrap();
        assert_eq!(
            m.kind,
            MetricKind::MaxRelAbove {
                floor: 1e-3,
                max: 0.01
            }
        );
        assert_eq!(
            Metric::parse("tokens:0.9").unwrap().kind,
            MetricKind::Tokens { min: 0.9 }
        );
        assert!(Metric::parse("tokens:1.5").is_err());
        assert_eq!(
            Metric::parse("kl:0.01").unwrap().kind,
            MetricKind::Kl { max: 0.01 }
        );
        assert!(Metric::parse("cosine").is_err());
        assert!(Metric::parse("topk:0:1").is_err());
        assert!(Metric::parse("out:psnr:3").is_err());
        let r = Metric::parse("snr:40")
            .unwrap()
            .evaluate(&[1.0], &[1.0], &[1]);
        assert_eq!(r.line(), "SNR: inf dB (min required: 40 dB) | PASSED");
    }

    // NumPy: x=[1,2,3], y=[1.1,1.9,3.3] as logits, p=softmax(y), q=softmax(x):
    //   (p*np.log(p/q)).sum() = 0.013041542029393699 (what scipy.stats.entropy(p, q) computes).
    #[test]
    fn kl_divergence_of_softmaxes_matches_scipy() {
        let (x, y) = ([1.0, 2.0, 3.0], [1.1, 1.9, 3.3]);
        let got = kl_divergence(&x, &y, &[3]);
        assert!((got - 0.013041542029393699).abs() < 1e-12, "{got}");
        assert_eq!(kl_divergence(&x, &x, &[3]), 0.0);
        // Two rows: the mean.
        let got = kl_divergence(
            &[1.0, 2.0, 3.0, 0.0, 0.0, 0.0],
            &[1.1, 1.9, 3.3, 0.0, 0.0, 0.0],
            &[2, 3],
        );
        assert!((got - 0.013041542029393699 / 2.0).abs() < 1e-12);
        assert!(kl_divergence(&[f64::NAN, 0.0], &[0.0, 0.0], &[2]).is_nan());
        // A class the reference excludes adds nothing; one the output excludes is infinite.
        assert!(kl_divergence(&[0.0, 5.0], &[0.0, f64::NEG_INFINITY], &[2]).is_finite());
        assert_eq!(
            kl_divergence(&[0.0, f64::NEG_INFINITY], &[0.0, 0.0], &[2]),
            f64::INFINITY
        );
    }

    #[test]
    fn token_agreement_counts_equal_ids_and_applies_to_tokens_by_default() {
        assert_eq!(
            agreement(&[1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 5.0, 4.0]),
            0.75
        );
        assert_eq!(agreement(&[], &[]), 1.0);
        let m = Metric::parse("tokens:0.75").unwrap();
        assert!(m.applies_to("tokens") && !m.applies_to("logits"));
        assert!(m.replaces_tolerance());
        let named = Metric::parse("ids:tokens:1").unwrap();
        assert!(named.applies_to("ids") && !named.applies_to("tokens"));
        assert!(
            m.evaluate(&[1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 5.0, 4.0], &[4])
                .passed
        );
    }
}
