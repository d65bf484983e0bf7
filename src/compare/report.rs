//! Polygraphy's comparison log, line for line: `[I]`/`[W]`/`[E]` severity prefixes, four spaces
//! per indentation level, continuation lines of a multi-line message indented under the text.

use super::stats::{fmt_index, str_histogram, Stats};
use super::{fmt_g, OutputComparison};
use crate::tensor::fmt_shape;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Severity {
    Info,
    Warning,
    Error,
}

impl Severity {
    fn tag(self) -> &'static str {
        match self {
            Severity::Info => "[I] ",
            Severity::Warning => "[W] ",
            Severity::Error => "[E] ",
        }
    }

    pub fn of(passed: bool) -> Severity {
        if passed {
            Severity::Info
        } else {
            Severity::Error
        }
    }
}

/// A log being built as text, Polygraphy's layout.
#[derive(Default, Debug)]
pub struct Log {
    pub text: String,
}

impl Log {
    pub fn log(&mut self, sev: Severity, level: usize, msg: &str) {
        let indent = "    ".repeat(level);
        for (i, line) in msg.lines().enumerate() {
            if i == 0 {
                self.text += sev.tag();
            } else {
                self.text += "    ";
            }
            self.text += &indent;
            self.text += line;
            self.text.push('\n');
        }
    }

    pub fn info(&mut self, level: usize, msg: &str) {
        self.log(Severity::Info, level, msg);
    }

    pub fn warn(&mut self, level: usize, msg: &str) {
        self.log(Severity::Warning, level, msg);
    }

    pub fn error(&mut self, level: usize, msg: &str) {
        self.log(Severity::Error, level, msg);
    }
}

/// Python's `repr(float)`: shortest round-trip digits, `1e-05`, `0.001`, `100.0`, `1e+16`.
pub fn py_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{x:e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if x == 0.0 || (-4..16).contains(&exp) {
        let s = format!("{x}");
        if s.contains('.') {
            s
        } else {
            s + ".0"
        }
    } else {
        format!("{mant}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// `log_output_stats`: the stats line, then (when `show`) the values of a small array and the
/// histogram, one level deeper.
pub fn output_stats(
    log: &mut Log,
    level: usize,
    label: Option<&str>,
    stats: &Stats,
    values: Option<(&[f64], &[usize])>,
    hist: &super::Histogram,
    show: bool,
) {
    let line = match label {
        Some(l) => format!("{l} | Stats: {}", stats.line()),
        None => stats.line(),
    };
    log.info(level, &line);
    if !show {
        return;
    }
    if let Some((v, shape)) = values {
        log.info(
            level + 1,
            &format!("---- Values ----\n{}", fmt_array(v, shape)),
        );
    }
    let h = str_histogram(hist);
    if !h.is_empty() {
        log.info(level + 1, &h);
    }
}

/// One output's comparison, as `SimpleCompareFunc` logs it (level 1 = "Comparing Output").
/// Histograms and values are shown when the output failed or `verbose` is set (Polygraphy
/// shows them at INFO only for failures).
pub fn output_comparison(
    log: &mut Log,
    c: &OutputComparison,
    runner: &str,
    golden_runner: &str,
    verbose: bool,
) {
    let name = &c.name;
    let shape = fmt_shape(&c.shape);
    log.info(
        1,
        &format!(
            "Comparing Output: '{name}' (dtype={}, shape={shape}) with '{name}' (dtype={}, shape={shape})",
            c.dtype, c.reference_dtype
        ),
    );
    log.info(
        2,
        &format!(
            "Tolerance: [abs={}, rel={}] | Checking {} error",
            fmt_g(c.atol, 5),
            fmt_g(c.rtol, 5),
            c.stat.name()
        ),
    );
    let show = !c.passed || verbose;
    let vals = |i: usize| {
        c.values
            .as_ref()
            .map(|v| (v[i].as_slice(), c.shape.as_slice()))
    };
    output_stats(
        log,
        2,
        Some(&format!("{runner}: {name}")),
        &c.output_stats,
        vals(0),
        &c.histograms[0],
        show,
    );
    output_stats(
        log,
        2,
        Some(&format!("{golden_runner}: {name}")),
        &c.reference_stats,
        vals(1),
        &c.histograms[1],
        show,
    );
    log.info(2, &format!("Error Metrics: {name}"));
    let mut msg = format!(
        "Minimum Required Tolerance: {} error | [abs={}] OR [rel={}]",
        c.stat.name(),
        fmt_g(c.required_atol, 5),
        fmt_g(c.required_rtol, 5)
    );
    if c.stat == super::ErrorStat::Elemwise {
        msg += " (requirements may be lower if both abs/rel tolerances are set)";
    }
    log.info(3, &msg);
    output_stats(
        log,
        3,
        Some("Absolute Difference"),
        &c.absdiff_stats,
        vals(2),
        &c.histograms[2],
        show,
    );
    output_stats(
        log,
        3,
        Some("Relative Difference"),
        &c.reldiff_stats,
        vals(3),
        &c.histograms[3],
        show,
    );
    let tol = format!("(rel={}, abs={})", py_repr(c.rtol), py_repr(c.atol));
    if c.tolerance_passed {
        log.info(
            2,
            &format!("PASSED | Output: '{name}' | Difference is within tolerance {tol}"),
        );
    } else {
        log.error(
            2,
            &format!("FAILED | Output: '{name}' | Difference exceeds tolerance {tol}"),
        );
    }
    for m in &c.metrics {
        log.log(Severity::of(m.passed), 2, &m.line());
    }
}

/// A shape mismatch, as Polygraphy reports it (the output fails, the comparison goes on).
pub fn shape_mismatch(log: &mut Log, name: &str, a: &[usize], b: &[usize]) {
    log.error(
        2,
        &format!(
            "FAILED | Output: `{name}` | Will not compare outputs of different shapes.\n\
             Note: Output shapes are {} and {}.",
            fmt_shape(a),
            fmt_shape(b)
        ),
    );
}

/// `Accuracy Summary | a vs. b | Passed: 1/2 iterations | Pass Rate: 50.00%`.
pub fn accuracy_summary(log: &mut Log, runner: &str, golden: &str, passed: usize, total: usize) {
    let rate = if total == 0 {
        100.0
    } else {
        passed as f64 / total as f64 * 100.0
    };
    log.log(
        Severity::of(passed == total),
        0,
        &format!(
            "Accuracy Summary | {runner} vs. {golden} | Passed: {passed}/{total} iterations | Pass Rate: {rate:.2}%"
        ),
    );
}

/// `--validate` of one output (Polygraphy's `Comparator.validate` with check_inf and
/// check_nan): returns whether it is free of NaN and Inf.
pub fn validate_output(
    log: &mut Log,
    runner: &str,
    name: &str,
    values: &[f64],
    shape: &[usize],
) -> bool {
    log.info(
        1,
        &format!("{runner:35} | Validating output: {name} (check_inf=True, check_nan=True)"),
    );
    log.info(2, &Stats::compute(values, shape, true).line());
    let has_nan = values.iter().any(|x| x.is_nan());
    let has_inf = values.iter().any(|x| x.is_infinite());
    if has_nan {
        log.error(
            2,
            "NaN Detected | One or more NaNs were encountered in this output",
        );
        if let Some(i) = values.iter().position(|x| x.is_nan()) {
            log.info(
                2,
                &format!(
                    "Note: first NaN at {}",
                    fmt_index(&super::stats::unravel(i, shape))
                ),
            );
        }
    }
    if has_inf {
        log.error(
            2,
            "Inf Detected | One or more non-finite values were encountered in this output",
        );
        if let Some(i) = values.iter().position(|x| x.is_infinite()) {
            log.info(
                2,
                &format!(
                    "Note: first Inf at {}",
                    fmt_index(&super::stats::unravel(i, shape))
                ),
            );
        }
    }
    let ok = !has_nan && !has_inf;
    if ok {
        log.info(2, &format!("PASSED | Output: {name} is valid"));
    } else {
        log.error(2, &format!("FAILED | Errors detected in output: {name}"));
    }
    ok
}

/// A NumPy-style rendering of a small array (`str(ndarray)` with NumPy's defaults: precision 8,
/// `maxprec` float mode, scientific notation when values span more than 1e3 or leave
/// [1e-4, 1e8), lines wrapped at 75 characters). An approximation of NumPy's printer that
/// agrees on the common cases.
pub fn fmt_array(v: &[f64], shape: &[usize]) -> String {
    let finite: Vec<f64> = v
        .iter()
        .filter(|x| x.is_finite() && **x != 0.0)
        .map(|x| x.abs())
        .collect();
    let (mn, mx) = finite
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
    let sci = !finite.is_empty() && (mx >= 1e8 || mn < 1e-4 || mx / mn > 1e3);
    let special = |x: f64| -> Option<String> {
        if x.is_nan() {
            Some("nan".into())
        } else if x.is_infinite() {
            Some(if x > 0.0 { "inf" } else { "-inf" }.into())
        } else {
            None
        }
    };
    let cells: Vec<String> = if sci {
        // Mantissas trimmed to their significant digits, then zero-padded to a common width.
        let parts: Vec<Option<(String, String)>> = v
            .iter()
            .map(|&x| {
                special(x).map_or_else(
                    || {
                        let s = format!("{:.8e}", shortest(x));
                        let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
                        let m = m.trim_end_matches('0');
                        let e: i32 = e.parse().unwrap_or(0);
                        let exp = format!("e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
                        Some((m.to_string(), exp))
                    },
                    |_| None,
                )
            })
            .collect();
        let frac = parts
            .iter()
            .flatten()
            .map(|(m, _)| m.find('.').map_or(0, |p| m.len() - p - 1))
            .max()
            .unwrap_or(0)
            .max(1);
        let raw: Vec<String> = v
            .iter()
            .zip(&parts)
            .map(|(&x, p)| match p {
                Some((m, e)) => {
                    let f = m.find('.').map_or(0, |p| m.len() - p - 1);
                    format!("{m}{}{e}", "0".repeat(frac - f))
                }
                None => special(x).unwrap_or_default(),
            })
            .collect();
        let w = raw.iter().map(|s| s.len()).max().unwrap_or(0);
        raw.iter().map(|s| format!("{s:>w$}")).collect()
    } else {
        let strs: Vec<String> = v
            .iter()
            .map(|&x| {
                special(x).unwrap_or_else(|| {
                    let s = format!("{:.8}", shortest(x));
                    let s = s.trim_end_matches('0');
                    s.to_string()
                })
            })
            .collect();
        let int_w = strs
            .iter()
            .map(|s| s.find('.').unwrap_or(s.len()))
            .max()
            .unwrap_or(0);
        let frac_w = strs
            .iter()
            .map(|s| s.find('.').map_or(0, |p| s.len() - p - 1))
            .max()
            .unwrap_or(0);
        strs.iter()
            .map(|s| {
                let ip = s.find('.').unwrap_or(s.len());
                let fp = s.find('.').map_or(0, |p| s.len() - p - 1);
                let mut c = " ".repeat(int_w.saturating_sub(ip));
                c += s;
                c += &" ".repeat(frac_w.saturating_sub(fp));
                c
            })
            .collect()
    };
    fn rec(cells: &[String], shape: &[usize], depth: usize) -> String {
        const WIDTH: usize = 75;
        match shape.split_first() {
            None => cells
                .first()
                .cloned()
                .unwrap_or_default()
                .trim()
                .to_string(),
            Some((_, [])) => {
                let indent = " ".repeat(depth + 1);
                let mut out = String::new();
                let mut line = String::from("[");
                for (i, c) in cells.iter().enumerate() {
                    let last = i + 1 == cells.len();
                    let need = c.len() + if last { 1 } else { 0 };
                    if line.len() + depth + need > WIDTH && line.trim().len() > 1 {
                        out += line.trim_end();
                        out.push('\n');
                        line = indent.clone();
                    }
                    line += c;
                    if !last {
                        line.push(' ');
                    }
                }
                out += &line;
                out.push(']');
                out
            }
            Some((&n, rest)) => {
                let per: usize = rest.iter().product();
                let blank = "\n".repeat(rest.len());
                let pad = " ".repeat(depth + 1);
                let parts: Vec<String> = (0..n)
                    .map(|i| rec(&cells[i * per..(i + 1) * per], rest, depth + 1))
                    .collect();
                format!("[{}]", parts.join(&format!("{blank}{pad}")))
            }
        }
    }
    rec(&cells, shape, 0)
}

/// The value as its f32 (outputs are mostly f32; NumPy prints their shortest f32 digits).
fn shortest(x: f64) -> f64 {
    let f = x as f32;
    if f as f64 == x {
        format!("{f}").parse().unwrap_or(x)
    } else {
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NUMPY_ARANGE_30_DIV_7: &str = "[0.         0.14285715 0.2857143  0.42857143 0.5714286  0.71428573\n 0.85714287 1.         1.1428572  1.2857143  1.4285715  1.5714285\n 1.7142857  1.8571428  2.         2.142857   2.2857144  2.4285715\n 2.5714285  2.7142856  2.857143   3.         3.142857   3.2857144\n 3.4285715  3.5714285  3.7142856  3.857143   4.         4.142857  ]";

    #[test]
    fn python_float_repr() {
        assert_eq!(py_repr(1e-5), "1e-05");
        assert_eq!(py_repr(0.001), "0.001");
        assert_eq!(py_repr(100.0), "100.0");
        assert_eq!(py_repr(1e16), "1e+16");
        assert_eq!(py_repr(1.5e-7), "1.5e-07");
        assert_eq!(py_repr(0.0), "0.0");
    }

    // str(np.array([1.5, 2., 3.25], dtype=np.float32)) == '[1.5  2.   3.25]'
    // str(np.array([[1., 2.], [3., 4.]], dtype=np.float32)) == '[[1. 2.]\n [3. 4.]]'
    #[test]
    fn numpy_like_arrays() {
        assert_eq!(fmt_array(&[1.5, 2.0, 3.25], &[3]), "[1.5  2.   3.25]");
        assert_eq!(
            fmt_array(&[1.0, 2.0, 3.0, 4.0], &[2, 2]),
            "[[1. 2.]\n [3. 4.]]"
        );
        // str(np.array([[[1., 2.], [3., 4.]], [[1, 2], [3, 4]]], dtype=np.float32))
        assert_eq!(
            fmt_array(&[1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0], &[2, 2, 2]),
            "[[[1. 2.]\n  [3. 4.]]\n\n [[1. 2.]\n  [3. 4.]]]"
        );
        assert_eq!(fmt_array(&[-1.5, 20.0, 3.25], &[3]), "[-1.5  20.    3.25]");
        // str(np.array([1e-5, 2.5e-6], dtype=np.float32)) == '[1.0e-05 2.5e-06]'
        assert_eq!(
            fmt_array(&[1e-5f32 as f64, 2.5e-6f32 as f64], &[2]),
            "[1.0e-05 2.5e-06]"
        );
        // str(np.array([0.093322754, 0.027297974], dtype=np.float32)) == '[0.09332275 0.02729797]'
        assert_eq!(
            fmt_array(&[0.093322754f32 as f64, 0.027297974f32 as f64], &[2]),
            "[0.09332275 0.02729797]"
        );
        // str(np.arange(30, dtype=np.float32) / 7)
        let v: Vec<f64> = (0..30).map(|i| (i as f32 / 7.0) as f64).collect();
        assert_eq!(fmt_array(&v, &[30]), NUMPY_ARANGE_30_DIV_7);
    }

    #[test]
    fn continuation_lines_are_indented() {
        let mut log = Log::default();
        log.info(3, "---- Histogram ----\nBin Range");
        assert_eq!(
            log.text,
            "[I]             ---- Histogram ----\n                Bin Range\n"
        );
    }
}
