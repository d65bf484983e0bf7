//! A self-contained HTML report: one file with inline CSS and inline SVG charts, no scripts,
//! fonts or anything else fetched from elsewhere, so it opens offline and can be attached to a
//! bug report or a CI artifact as it is.
//!
//! [`HtmlReport`] is a builder of sections that any command can reuse: a verdict banner,
//! Polygraphy-style output comparisons with their histograms as bar charts, the layer-wise
//! required tolerances as a plot and a table, generic tables and a generic scatter/line plot
//! (for instance a search history). Every string that comes from a model or a user (layer and
//! output names, labels) is escaped.

use super::cause::Cause;
use super::layerwise::LayerError;
use super::stats::Stats;
use super::{fmt_g, Histogram, OutputComparison};
use crate::error::Result;
use crate::precision::Precision;
use crate::tensor::fmt_shape;
use std::fmt::Write as _;
use std::path::Path;

/// Which rows of a layer-wise table carry a pass/fail verdict.
#[derive(Clone, Copy, Debug)]
pub enum LayerVerdicts<'a> {
    /// Every layer against the tolerance (`run --mark-all`, as Polygraphy's `--mark-all`).
    EveryLayer,
    /// Only the layers whose compared output is one of these graph outputs; the others are
    /// shown, not judged (a search report: the criterion is the outputs').
    OutputsOnly(&'a [String]),
}

/// One point of a [`PlotSeries`].
#[derive(Clone, Debug, PartialEq)]
pub struct PlotPoint {
    pub x: f64,
    /// May be 0, negative, infinite or NaN: such values are drawn in bands at the bottom (0 or
    /// below on a log axis) or the top (inf, NaN) of the plot.
    pub y: f64,
    /// Some(false) draws the point as a square (failed), Some(true) or None as a circle.
    pub passed: Option<bool>,
    /// Shown as the point's tooltip.
    pub label: Option<String>,
}

/// A named set of points drawn in one colour, optionally joined by a line.
#[derive(Clone, Debug, PartialEq)]
pub struct PlotSeries {
    pub label: String,
    /// A CSS colour (`#1f77b4`, `steelblue`); None picks one from the palette.
    pub color: Option<String>,
    pub points: Vec<PlotPoint>,
    /// Join the points (in the given order) with a line.
    pub line: bool,
}

impl PlotSeries {
    pub fn new(label: &str) -> PlotSeries {
        PlotSeries {
            label: label.to_string(),
            color: None,
            points: Vec::new(),
            line: false,
        }
    }
}

/// A horizontal reference line (a tolerance, a threshold) on a plot.
#[derive(Clone, Debug, PartialEq)]
pub struct HLine {
    pub y: f64,
    pub label: String,
}

/// A point to ring and annotate (the first failing layer).
#[derive(Clone, Debug, PartialEq)]
pub struct Highlight {
    pub x: f64,
    pub y: f64,
    pub label: String,
}

/// The report being built. Sections appear in the order they are added.
#[derive(Clone, Debug)]
pub struct HtmlReport {
    title: String,
    sections: Vec<String>,
    plots: usize,
}

/// Escapes text for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

const PALETTE: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
];
const RED: &str = "#c62828";

/// The colour of a precision in the layer plot and its legend.
pub fn precision_color(p: Option<Precision>) -> &'static str {
    match p {
        Some(Precision::Float32) => "#1f77b4",
        Some(Precision::Float16) => "#ff7f0e",
        Some(Precision::BFloat16) => "#9467bd",
        Some(Precision::Int8) => "#2ca02c",
        Some(Precision::Fp8E4M3) => "#17becf",
        Some(Precision::Fp8E5M2) => "#8c564b",
        None => "#9e9e9e",
    }
}

/// A user-given CSS colour, or None when it holds anything but a plain colour's characters.
fn safe_color(c: &str) -> Option<&str> {
    let ok = !c.is_empty()
        && c.len() <= 40
        && c.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "#(),.% ".contains(ch));
    ok.then_some(c)
}

/// A number for an SVG coordinate: two decimals, no NaN.
fn n(x: f64) -> String {
    if x.is_finite() {
        format!("{:.2}", x)
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        "0".into()
    }
}

fn g(x: f64) -> String {
    fmt_g(x, 5)
}

const CSS: &str = r#"
*{box-sizing:border-box}
body{font-family:-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;padding:24px 32px;color:#212121;background:#fafafa;font-size:14px;line-height:1.4}
h1{font-size:22px;margin:0 0 16px}
h2{font-size:18px;margin:28px 0 10px;padding-bottom:4px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:0}
.verdict{border-radius:6px;padding:14px 18px;margin-bottom:8px;border-left:8px solid}
.verdict.pass{background:#e8f5e9;border-color:#2e7d32}
.verdict.fail{background:#ffebee;border-color:#c62828}
.verdict .big{font-size:20px;font-weight:700;margin-right:10px}
.verdict.pass .big{color:#2e7d32}.verdict.fail .big{color:#c62828}
.verdict ul{margin:8px 0 0;padding-left:20px;overflow-wrap:anywhere}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:700;color:#fff;vertical-align:middle}
.badge.pass{background:#2e7d32}.badge.fail{background:#c62828}
.card{background:#fff;border:1px solid #e0e0e0;border-radius:6px;margin:10px 0;padding:0}
.card>summary{padding:10px 14px;cursor:pointer;list-style-position:inside}
.card>.body{padding:0 14px 12px}
.meta{color:#555;margin:6px 0}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
table{border-collapse:collapse;margin:8px 0;background:#fff}
th,td{border:1px solid #e0e0e0;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f5f5f5;font-weight:600}
td.l,th.l{text-align:left}
table.facts td{white-space:normal;overflow-wrap:anywhere;max-width:1000px}
table.facts td:first-child{white-space:nowrap;color:#555}
td.name{text-align:left;max-width:360px;overflow:hidden;text-overflow:ellipsis}
tr.fail td{background:#fff5f5}
tr.first td{background:#ffe0e0;font-weight:600}
td.pass{color:#2e7d32;font-weight:600}td.fail{color:#c62828;font-weight:600}
.charts{display:flex;flex-wrap:wrap;gap:12px;margin-top:8px}
.chart{background:#fff;border:1px solid #eee;border-radius:4px}
.scroll{max-height:520px;overflow:auto;display:block;width:max-content;max-width:100%;background:linear-gradient(to right,#fafafa 30%,rgba(250,250,250,0)) left/24px 100% no-repeat local,linear-gradient(to left,#fafafa 30%,rgba(250,250,250,0)) right/24px 100% no-repeat local,radial-gradient(farthest-side at 0 50%,rgba(0,0,0,.2),rgba(0,0,0,0)) left/10px 100% no-repeat scroll,radial-gradient(farthest-side at 100% 50%,rgba(0,0,0,.2),rgba(0,0,0,0)) right/10px 100% no-repeat scroll}
.scroll table{margin:0;background:transparent}
.scroll thead th{position:sticky;top:0;z-index:1}
td.wrap{white-space:normal;min-width:320px;max-width:640px;overflow-wrap:anywhere}
td.cause{font-weight:600}td.cause.overflow,td.cause.clipping{color:#c62828}td.cause.underflow,td.cause.accumulation{color:#ef6c00}td.cause.inherited,td.cause.none{color:#9e9e9e;font-weight:400}
.chart{max-width:100%;height:auto}
.swatch{display:inline-block;width:10px;height:10px;border-radius:50%;margin-right:4px;vertical-align:middle}
footer{margin-top:32px;color:#777;font-size:12px}
"#;

impl HtmlReport {
    pub fn new(title: &str) -> HtmlReport {
        HtmlReport {
            title: title.to_string(),
            sections: Vec::new(),
            plots: 0,
        }
    }

    /// Adds raw HTML (already escaped) as a section: for callers composing their own parts.
    pub fn raw(&mut self, html: String) -> &mut Self {
        self.sections.push(html);
        self
    }

    /// A section heading.
    pub fn heading(&mut self, text: &str) -> &mut Self {
        self.sections.push(format!("<h2>{}</h2>\n", esc(text)));
        self
    }

    /// A paragraph of text.
    pub fn paragraph(&mut self, text: &str) -> &mut Self {
        self.sections
            .push(format!("<p class=\"meta\">{}</p>\n", esc(text)));
        self
    }

    /// The verdict banner: PASSED or FAILED, a headline and a list of details.
    pub fn verdict(&mut self, passed: bool, headline: &str, details: &[String]) -> &mut Self {
        let (class, word) = if passed {
            ("pass", "PASSED")
        } else {
            ("fail", "FAILED")
        };
        let mut s = format!(
            "<div class=\"verdict {class}\" id=\"verdict\"><span class=\"big\">{word}</span>{}",
            esc(headline)
        );
        if !details.is_empty() {
            s.push_str("<ul>");
            for d in details {
                let _ = write!(s, "<li>{}</li>", esc(d));
            }
            s.push_str("</ul>");
        }
        s.push_str("</div>\n");
        self.sections.push(s);
        self
    }

    /// A table with a title (may be empty), column headers (none: no header row) and rows of
    /// cells (plain text).
    pub fn table(&mut self, title: &str, headers: &[&str], rows: &[Vec<String>]) -> &mut Self {
        let mut s = String::new();
        if !title.is_empty() {
            let _ = writeln!(s, "<h2>{}</h2>", esc(title));
        }
        s.push_str(if headers.is_empty() {
            "<div class=\"scroll\"><table class=\"facts\">"
        } else {
            "<div class=\"scroll\"><table>"
        });
        if !headers.is_empty() {
            s.push_str("<thead><tr>");
            for h in headers {
                let _ = write!(s, "<th class=\"l\">{}</th>", esc(h));
            }
            s.push_str("</tr></thead>");
        }
        s.push_str("<tbody>\n");
        for r in rows {
            s.push_str("<tr>");
            for c in r {
                // Long text (an explanation) wraps instead of widening the table.
                let class = if c.chars().count() > 80 {
                    "l wrap"
                } else {
                    "l"
                };
                let _ = write!(s, "<td class=\"{class}\">{}</td>", esc(c));
            }
            s.push_str("</tr>\n");
        }
        s.push_str("</tbody></table></div>\n");
        self.sections.push(s);
        self
    }

    /// One iteration's output comparisons: per output its shapes and dtypes, the criterion,
    /// the required tolerance, the statistics of both sides and of the differences, their
    /// histograms as bar charts, the metrics and the verdict. Passed outputs start collapsed.
    pub fn output_comparisons(
        &mut self,
        iteration: usize,
        outputs: &[OutputComparison],
    ) -> &mut Self {
        let all = outputs.iter().all(|c| c.passed);
        let mut s = format!(
            "<h2 id=\"iteration-{iteration}\">Iteration {iteration} {}</h2>\n",
            badge(all)
        );
        for c in outputs {
            s.push_str(&self.output_card(c));
        }
        self.sections.push(s);
        self
    }

    fn output_card(&mut self, c: &OutputComparison) -> String {
        let mut s = format!(
            "<details class=\"card\"{}><summary><h3 style=\"display:inline\">Output <span class=\"mono\">{}</span></h3> {} <span class=\"meta\">{} {} vs. reference {}</span></summary><div class=\"body\">\n",
            if c.passed { "" } else { " open" },
            esc(&c.name),
            badge(c.passed),
            esc(&c.dtype),
            esc(&fmt_shape(&c.shape)),
            esc(&c.reference_dtype),
        );
        let stat = match c.error_quantile {
            Some(q) => format!("{} error (q={})", c.stat.name(), g(q)),
            None => format!("{} error", c.stat.name()),
        };
        let _ = writeln!(
            s,
            "<p class=\"meta\">Checking {} | Tolerance: [abs={}, rel={}] | Minimum required tolerance: <b>[abs={}] OR [rel={}]</b> | Tolerance check: {}</p>",
            esc(&stat),
            g(c.atol),
            g(c.rtol),
            g(c.required_atol),
            g(c.required_rtol),
            badge(c.tolerance_passed)
        );
        if !c.metrics.is_empty() {
            s.push_str("<ul class=\"meta\">");
            for m in &c.metrics {
                let _ = write!(s, "<li>{} {}</li>", esc(&m.line()), badge(m.passed));
            }
            s.push_str("</ul>\n");
        }
        s.push_str(&stats_table(&[
            ("output", &c.output_stats),
            ("reference", &c.reference_stats),
            ("absolute difference", &c.absdiff_stats),
            ("relative difference", &c.reldiff_stats),
        ]));
        s.push_str("<div class=\"charts\">");
        s.push_str(&self.histogram_chart(
            "Values: output vs. reference",
            &[
                ("output", PALETTE[1], &c.histograms[0]),
                ("reference", PALETTE[0], &c.histograms[1]),
            ],
        ));
        s.push_str(&self.histogram_chart(
            "Absolute difference",
            &[("|out − ref|", "#546e7a", &c.histograms[2])],
        ));
        s.push_str(&self.histogram_chart(
            "Relative difference",
            &[("|out − ref| / |ref|", "#8d6e63", &c.histograms[3])],
        ));
        s.push_str("</div></div></details>\n");
        s
    }

    /// 10-bin histograms as a bar chart; several histograms over the same edges are drawn as
    /// grouped bars.
    fn histogram_chart(&mut self, title: &str, hists: &[(&str, &str, &Histogram)]) -> String {
        let (w, h) = (350.0, 210.0);
        let (left, right, top, bottom) = (52.0, 10.0, 34.0, 40.0);
        let pw = w - left - right;
        let ph = h - top - bottom;
        let mut s = svg_open(w, h, title);
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"16\" font-size=\"13\" font-weight=\"600\">{}</text>",
            n(left),
            esc(title)
        );
        let present: Vec<&(&str, &str, &Histogram)> =
            hists.iter().filter(|(_, _, h)| h.is_some()).collect();
        let Some((_, _, Some((_, edges)))) = present.first().map(|x| **x) else {
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"#777\" text-anchor=\"middle\">no histogram (NaN or infinite values)</text></svg>",
                n(w / 2.0),
                n(top + ph / 2.0)
            );
            return s;
        };
        let max_count = present
            .iter()
            .filter_map(|(_, _, h)| h.as_ref())
            .flat_map(|(c, _)| c.iter().copied())
            .max()
            .unwrap_or(0)
            .max(1);
        // Legend for grouped bars.
        if present.len() > 1 {
            let mut lx = left + pw;
            for (label, color, _) in present.iter().rev() {
                lx -= 8.0 * label.chars().count() as f64 + 22.0;
                let _ = write!(
                    s,
                    "<rect x=\"{}\" y=\"21\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"30\" font-size=\"11\">{}</text>",
                    n(lx),
                    color,
                    n(lx + 13.0),
                    esc(label)
                );
            }
        }
        // Axes and count ticks.
        let _ = write!(
            s,
            "<line x1=\"{l}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#999\"/><line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{b}\" stroke=\"#999\"/>",
            l = n(left),
            r = n(left + pw),
            t = n(top),
            b = n(top + ph)
        );
        for frac in [0.0, 0.5, 1.0] {
            let y = top + ph - frac * ph;
            let v = (max_count as f64 * frac).round() as u64;
            let _ = write!(
                s,
                "<text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\" fill=\"#555\">{}</text><line x1=\"{}\" y1=\"{y2}\" x2=\"{}\" y2=\"{y2}\" stroke=\"#eee\"/>",
                n(left - 4.0),
                n(y + 3.0),
                v,
                n(left + 1.0),
                n(left + pw),
                y2 = n(y)
            );
        }
        let bins = edges.len().saturating_sub(1).max(1);
        let bw = pw / bins as f64;
        let group = present.len() as f64;
        for (k, (label, color, hist)) in present.iter().enumerate() {
            let Some((counts, e)) = hist else { continue };
            for (i, &cnt) in counts.iter().enumerate() {
                let bh = cnt as f64 / max_count as f64 * ph;
                let x = left + i as f64 * bw + 1.0 + k as f64 * (bw - 2.0) / group;
                let y = top + ph - bh;
                let lo = e.get(i).copied().unwrap_or(f64::NAN);
                let hi = e.get(i + 1).copied().unwrap_or(f64::NAN);
                let _ = write!(
                    s,
                    "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}: [{}, {}{} : {} elements</title></rect>",
                    n(x),
                    n(y),
                    n(((bw - 2.0) / group).max(1.0)),
                    n(bh),
                    color,
                    esc(label),
                    fmt_g(lo, 5),
                    fmt_g(hi, 5),
                    if i + 1 == counts.len() { "]" } else { ")" },
                    cnt
                );
            }
        }
        // Edge labels: first, middle, last.
        for i in [0, bins / 2, bins] {
            let x = left + i as f64 * bw;
            let anchor = if i == 0 {
                "start"
            } else if i == bins {
                "end"
            } else {
                "middle"
            };
            let _ = write!(
                s,
                "<line x1=\"{x}\" y1=\"{b}\" x2=\"{x}\" y2=\"{b2}\" stroke=\"#999\"/><text x=\"{x}\" y=\"{ty}\" font-size=\"10\" text-anchor=\"{anchor}\" fill=\"#555\">{}</text>",
                fmt_g(edges.get(i).copied().unwrap_or(f64::NAN), 3),
                x = n(x),
                b = n(top + ph),
                b2 = n(top + ph + 4.0),
                ty = n(top + ph + 15.0),
            );
        }
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\" fill=\"#777\">value (10 bins; hover a bar for its range)</text></svg>",
            n(left + pw / 2.0),
            n(h - 6.0)
        );
        self.plots += 1;
        s
    }

    /// The layer-wise comparison, every layer judged against the tolerance (`run --mark-all`,
    /// as Polygraphy's `--mark-all`): see [`layer_errors_with`](Self::layer_errors_with).
    pub fn layer_errors(
        &mut self,
        title: &str,
        rows: &[LayerError],
        stat: &str,
        atol: Option<f64>,
    ) -> &mut Self {
        self.layer_errors_with(title, rows, stat, atol, LayerVerdicts::EveryLayer)
    }

    /// The layer-wise comparison: the required absolute tolerance of every compared layer
    /// against its index (log y axis), coloured by the layer's precision, then the table of
    /// every layer's error, growth and cause (hover the cause for what was measured).
    /// `verdicts` says which rows are judged: with [`LayerVerdicts::EveryLayer`] failing
    /// layers are squares and red rows and the first failing layer is ringed; with
    /// [`LayerVerdicts::OutputsOnly`] only the graph outputs carry PASSED/FAILED and the
    /// other layers are shown, not judged (the tolerance is the outputs' criterion).
    pub fn layer_errors_with(
        &mut self,
        title: &str,
        rows: &[LayerError],
        stat: &str,
        atol: Option<f64>,
        verdicts: LayerVerdicts<'_>,
    ) -> &mut Self {
        let judged = |r: &LayerError| match verdicts {
            LayerVerdicts::EveryLayer => true,
            LayerVerdicts::OutputsOnly(outs) => outs.contains(&r.output),
        };
        let mut s = format!("<h2>{}</h2>\n", esc(title));
        let verdict_rows: Vec<&LayerError> = rows.iter().filter(|r| judged(r)).collect();
        let passed = verdict_rows.iter().all(|r| r.passed);
        let first = rows.iter().find(|r| judged(r) && !r.passed);
        let mut causes: Vec<(Cause, usize)> = Vec::new();
        for r in rows.iter().filter(|r| r.growth > 0.0) {
            match causes.iter_mut().find(|(c, _)| *c == r.cause) {
                Some(e) => e.1 += 1,
                None => causes.push((r.cause, 1)),
            }
        }
        let cause_summary = if causes.is_empty() {
            " No layer adds error.".to_string()
        } else {
            format!(
                " Layers that add error, by cause: {}.",
                causes
                    .iter()
                    .map(|(c, k)| format!("{} {k}", c.name()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        match verdicts {
            LayerVerdicts::EveryLayer => {
                let _ = writeln!(
                    s,
                    "<p class=\"meta\">{} {} of {} compared layers within tolerance, checking the {} error per layer.{}{}</p>",
                    badge(passed),
                    verdict_rows.iter().filter(|r| r.passed).count(),
                    verdict_rows.len(),
                    esc(stat),
                    match first {
                        Some(r) => format!(
                            " First failing layer: <b>#{} <span class=\"mono\">{}</span></b> ({}), required [abs={}] OR [rel={}].",
                            r.index,
                            esc(&r.layer),
                            esc(&r.op),
                            g(r.required_atol),
                            g(r.required_rtol)
                        ),
                        None => String::new(),
                    },
                    esc(&cause_summary)
                );
            }
            LayerVerdicts::OutputsOnly(_) => {
                let _ = writeln!(
                    s,
                    "<p class=\"meta\">Each layer's {} error against the FP32 reference, the error it adds (growth) and its cause, for information: the criterion applies to the graph outputs only{}.{}</p>",
                    esc(stat),
                    if verdict_rows.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " ({} {} of {} within tolerance)",
                            badge(passed),
                            verdict_rows.iter().filter(|r| r.passed).count(),
                            verdict_rows.len()
                        )
                    },
                    esc(&cause_summary)
                );
            }
        }
        // One series per precision, in a fixed order.
        let mut keys: Vec<Option<Precision>> = rows.iter().map(|r| r.precision).collect();
        keys.sort_by_key(|p| p.map_or(usize::MAX, |p| p as usize));
        keys.dedup();
        let series: Vec<PlotSeries> = keys
            .iter()
            .map(|&p| PlotSeries {
                label: p
                    .map_or("carried (data movement)", |p| p.name())
                    .to_string(),
                color: Some(precision_color(p).to_string()),
                points: rows
                    .iter()
                    .filter(|r| r.precision == p)
                    .map(|r| PlotPoint {
                        x: r.index as f64,
                        y: r.required_atol,
                        passed: judged(r).then_some(r.passed),
                        label: Some(format!(
                            "#{} {} ({}) {}: {stat} abs={} rel={} growth={} cause={}{}",
                            r.index,
                            r.layer,
                            r.op,
                            r.precision.map_or("carried", |p| p.name()),
                            g(r.required_atol),
                            g(r.required_rtol),
                            g(r.growth),
                            r.cause.name(),
                            if judged(r) {
                                if r.passed {
                                    " PASSED"
                                } else {
                                    " FAILED"
                                }
                            } else {
                                ""
                            }
                        )),
                    })
                    .collect(),
                line: false,
            })
            .collect();
        let hlines: Vec<HLine> = atol
            .into_iter()
            .map(|a| HLine {
                y: a,
                label: match verdicts {
                    LayerVerdicts::EveryLayer => format!("atol {}", g(a)),
                    LayerVerdicts::OutputsOnly(_) => format!("outputs' atol {}", g(a)),
                },
            })
            .collect();
        let highlight = first.map(|r| Highlight {
            x: r.index as f64,
            y: r.required_atol,
            label: format!("first failing: #{} {}", r.index, r.layer),
        });
        s.push_str(&self.plot_svg(
            &format!("Required tolerance per layer ({stat} abs)"),
            "layer index (topological order)",
            &format!("required abs tolerance ({stat})"),
            true,
            &series,
            &hlines,
            highlight.as_ref(),
        ));
        // The table.
        s.push_str("<div class=\"scroll\"><table class=\"layers\"><thead><tr>");
        for (h, l) in [
            ("#", false),
            ("layer", true),
            ("op", true),
            ("output", true),
            ("precision", true),
            (&*format!("{stat} abs"), false),
            (&*format!("{stat} rel"), false),
            ("growth", false),
            ("cause", true),
            ("result", true),
        ] {
            let _ = write!(
                s,
                "<th{}>{}</th>",
                if l { " class=\"l\"" } else { "" },
                esc(h)
            );
        }
        s.push_str("</tr></thead><tbody>\n");
        for r in rows {
            let is_first = first.is_some_and(|f| std::ptr::eq(f, r));
            let class = if is_first {
                " class=\"first\""
            } else if judged(r) && !r.passed {
                " class=\"fail\""
            } else {
                ""
            };
            let prec = r.precision;
            let (result_class, result) = match (judged(r), r.passed) {
                (false, _) => ("l", "–"),
                (true, true) => ("pass", "PASSED"),
                (true, false) => ("fail", "FAILED"),
            };
            let _ = writeln!(
                s,
                "<tr{class}><td>{}</td><td class=\"name mono\" title=\"{}\">{}</td><td class=\"l\">{}</td><td class=\"name mono\">{}</td><td class=\"l\"><span class=\"swatch\" style=\"background:{}\"></span>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l cause {}\" title=\"{}\">{}</td><td class=\"{result_class}\">{result}{}</td></tr>",
                r.index,
                esc(&r.layer),
                esc(&r.layer),
                esc(&r.op),
                esc(&r.output),
                precision_color(prec),
                prec.map_or("(carried)", |p| p.name()),
                g(r.required_atol),
                g(r.required_rtol),
                g(r.growth),
                r.cause.name(),
                esc(&r.reason()),
                r.cause.name(),
                if is_first { " ← first failing layer" } else { "" }
            );
        }
        s.push_str("</tbody></table></div>\n");
        self.sections.push(s);
        self
    }

    /// A generic scatter plot (lines where a series asks for them), for instance the
    /// accuracy of every candidate of a search against its step.
    pub fn line_plot(
        &mut self,
        title: &str,
        x_label: &str,
        y_label: &str,
        log_y: bool,
        series: &[PlotSeries],
    ) -> &mut Self {
        self.line_plot_with(title, x_label, y_label, log_y, series, &[], None)
    }

    /// [`line_plot`](Self::line_plot) with horizontal reference lines and a ringed point.
    #[allow(clippy::too_many_arguments)]
    pub fn line_plot_with(
        &mut self,
        title: &str,
        x_label: &str,
        y_label: &str,
        log_y: bool,
        series: &[PlotSeries],
        hlines: &[HLine],
        highlight: Option<&Highlight>,
    ) -> &mut Self {
        let svg = self.plot_svg(title, x_label, y_label, log_y, series, hlines, highlight);
        self.sections
            .push(format!("<h2>{}</h2>\n{svg}", esc(title)));
        self
    }

    #[allow(clippy::too_many_arguments)]
    fn plot_svg(
        &mut self,
        title: &str,
        x_label: &str,
        y_label: &str,
        log_y: bool,
        series: &[PlotSeries],
        hlines: &[HLine],
        highlight: Option<&Highlight>,
    ) -> String {
        self.plots += 1;
        let legend_w = 230.0;
        let (w, h) = (1000.0, 400.0);
        let (left, top, bottom) = (78.0, 34.0, 50.0);
        let right = legend_w + 20.0;
        let pw = w - left - right;
        let all: Vec<&PlotPoint> = series.iter().flat_map(|s| &s.points).collect();
        let ys: Vec<f64> = all
            .iter()
            .map(|p| p.y)
            .chain(hlines.iter().map(|l| l.y))
            .collect();
        let yaxis = YAxis::new(&ys, log_y);
        // Bands: 0 (or below, on a log axis) at the bottom; inf and NaN at the top.
        let band = 22.0;
        let top_band = all.iter().any(|p| !p.y.is_finite());
        let low_band = log_y && all.iter().any(|p| p.y.is_finite() && p.y <= 0.0);
        let plot_top = top + if top_band { band } else { 0.0 };
        let plot_bottom = h - bottom - if low_band { band } else { 0.0 };
        let ph = plot_bottom - plot_top;
        let xs: Vec<f64> = all.iter().map(|p| p.x).filter(|x| x.is_finite()).collect();
        let (mut x0, mut x1) = xs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 - x0 < 1e-12 {
            x0 -= 0.5;
            x1 += 0.5;
        }
        let pad = (x1 - x0) * 0.02;
        let (x0, x1) = (x0 - pad, x1 + pad);
        let px = |x: f64| left + (x - x0) / (x1 - x0) * pw;
        let py = |y: f64| -> f64 {
            if y.is_nan() || y == f64::INFINITY {
                top + band / 2.0
            } else if y == f64::NEG_INFINITY || (log_y && y <= 0.0) {
                h - bottom - band / 2.0
            } else {
                plot_bottom - yaxis.frac(y) * ph
            }
        };
        let mut s = svg_open(w, h, title);
        // Grid and y ticks.
        for t in &yaxis.ticks {
            let y = plot_bottom - yaxis.frac(*t) * ph;
            let _ = write!(
                s,
                "<line x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">{}</text>",
                n(left),
                n(left + pw),
                n(left - 6.0),
                n(y + 4.0),
                fmt_g(*t, 3),
                y = n(y)
            );
        }
        if top_band {
            let _ = write!(
                s,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fff3e0\"/><text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\" fill=\"#e65100\">inf / nan</text>",
                n(left),
                n(top),
                n(pw),
                n(band),
                n(left - 6.0),
                n(top + band / 2.0 + 4.0)
            );
        }
        if low_band {
            let _ = write!(
                s,
                "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#f1f8e9\"/><text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\" fill=\"#33691e\">0</text>",
                n(left),
                n(h - bottom - band),
                n(pw),
                n(band),
                n(left - 6.0),
                n(h - bottom - band / 2.0 + 4.0)
            );
        }
        // Axes.
        let _ = write!(
            s,
            "<line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{b}\" stroke=\"#999\"/><line x1=\"{l}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#999\"/>",
            l = n(left),
            r = n(left + pw),
            t = n(top),
            b = n(h - bottom)
        );
        let integer_x = xs.iter().all(|x| x.fract() == 0.0);
        for t in nice_ticks(x0, x1, 10)
            .into_iter()
            .filter(|t| !integer_x || t.fract() == 0.0)
        {
            let x = px(t);
            let _ = write!(
                s,
                "<line x1=\"{x}\" y1=\"{b}\" x2=\"{x}\" y2=\"{b2}\" stroke=\"#999\"/><text x=\"{x}\" y=\"{ty}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
                fmt_g(t, 6),
                x = n(x),
                b = n(h - bottom),
                b2 = n(h - bottom + 4.0),
                ty = n(h - bottom + 17.0)
            );
        }
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#333\">{}</text><text transform=\"translate(16 {}) rotate(-90)\" font-size=\"12\" text-anchor=\"middle\" fill=\"#333\">{}</text>",
            n(left + pw / 2.0),
            n(h - 12.0),
            esc(x_label),
            n(top + (h - top - bottom) / 2.0),
            esc(y_label)
        );
        // Reference lines.
        for l in hlines
            .iter()
            .filter(|l| l.y.is_finite() && !(log_y && l.y <= 0.0))
        {
            let y = py(l.y);
            let _ = write!(
                s,
                "<line x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{RED}\" stroke-dasharray=\"6 4\" stroke-width=\"1.2\"/><text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\" fill=\"{RED}\">{}</text>",
                n(left),
                n(left + pw),
                n(left + pw - 4.0),
                n(y - 4.0),
                esc(&l.label),
                y = n(y)
            );
        }
        // Series.
        let r = if all.len() > 400 { 2.5 } else { 4.0 };
        for (k, se) in series.iter().enumerate() {
            let color = se
                .color
                .as_deref()
                .and_then(safe_color)
                .unwrap_or(PALETTE[k % PALETTE.len()]);
            if se.line {
                let pts: Vec<String> = se
                    .points
                    .iter()
                    .filter(|p| p.x.is_finite())
                    .map(|p| format!("{},{}", n(px(p.x)), n(py(p.y))))
                    .collect();
                let _ = write!(
                    s,
                    "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" opacity=\"0.7\"/>",
                    pts.join(" ")
                );
            }
            for p in se.points.iter().filter(|p| p.x.is_finite()) {
                let (cx, cy) = (px(p.x), py(p.y));
                let tip = p
                    .label
                    .as_deref()
                    .map(|t| format!("<title>{}</title>", esc(t)))
                    .unwrap_or_default();
                if p.passed == Some(false) {
                    let _ = write!(
                        s,
                        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{color}\" stroke=\"{RED}\" stroke-width=\"1.5\">{tip}</rect>",
                        n(cx - r),
                        n(cy - r),
                        n(2.0 * r),
                        n(2.0 * r)
                    );
                } else {
                    let _ = write!(
                        s,
                        "<circle cx=\"{}\" cy=\"{}\" r=\"{}\" fill=\"{color}\" stroke=\"#fff\" stroke-width=\"0.8\">{tip}</circle>",
                        n(cx),
                        n(cy),
                        n(r)
                    );
                }
            }
        }
        if let Some(hl) = highlight.filter(|hl| hl.x.is_finite()) {
            // Ring the point; the label sits in the top margin, clear of the data, with a
            // leader line down to the ring.
            let (cx, cy) = (px(hl.x), py(hl.y));
            let right_side = cx < left + pw * 0.6;
            let label: String = hl.label.chars().take(60).collect();
            let ly = top - 12.0;
            let _ = write!(
                s,
                "<circle cx=\"{}\" cy=\"{}\" r=\"{}\" fill=\"none\" stroke=\"{RED}\" stroke-width=\"2\"/><line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{RED}\" stroke-width=\"1\" stroke-dasharray=\"2 2\"/><text x=\"{}\" y=\"{}\" font-size=\"12\" font-weight=\"600\" fill=\"{RED}\" text-anchor=\"{}\" paint-order=\"stroke\" stroke=\"#fff\" stroke-width=\"3\">{}</text>",
                n(cx),
                n(cy),
                n(r + 6.0),
                n(cx),
                n(cy - r - 6.0),
                n(cx),
                n(ly + 4.0),
                n(if right_side { cx - 4.0 } else { cx + 4.0 }),
                n(ly),
                if right_side { "start" } else { "end" },
                esc(&label)
            );
        }
        // Legend.
        let lx = w - legend_w;
        let mut ly = top + 6.0;
        for (k, se) in series.iter().enumerate() {
            let color = se
                .color
                .as_deref()
                .and_then(safe_color)
                .unwrap_or(PALETTE[k % PALETTE.len()]);
            let label: String = se.label.chars().take(26).collect();
            let _ = write!(
                s,
                "<circle cx=\"{}\" cy=\"{}\" r=\"5\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\" font-size=\"12\">{} ({})</text>",
                n(lx + 6.0),
                n(ly),
                n(lx + 16.0),
                n(ly + 4.0),
                esc(&label),
                se.points.len()
            );
            ly += 18.0;
        }
        if all.iter().any(|p| p.passed.is_some()) {
            ly += 6.0;
            let _ = write!(
                s,
                "<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"#bbb\"/><text x=\"{}\" y=\"{}\" font-size=\"12\">passed</text><rect x=\"{}\" y=\"{}\" width=\"8\" height=\"8\" fill=\"#bbb\" stroke=\"{RED}\" stroke-width=\"1.5\"/><text x=\"{}\" y=\"{}\" font-size=\"12\">failed</text>",
                n(lx + 6.0),
                n(ly),
                n(lx + 16.0),
                n(ly + 4.0),
                n(lx + 2.0),
                n(ly + 14.0),
                n(lx + 16.0),
                n(ly + 22.0)
            );
        }
        s.push_str("</svg>\n");
        s
    }

    /// The whole document.
    pub fn render(&self) -> String {
        let mut s = String::from("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
        let _ = writeln!(s, "<title>{}</title>", esc(&self.title));
        let _ = writeln!(s, "<style>{CSS}</style>\n</head>\n<body>");
        let _ = writeln!(s, "<h1>{}</h1>", esc(&self.title));
        for sec in &self.sections {
            s.push_str(sec);
        }
        let _ = writeln!(
            s,
            "<footer>Generated by mixprec {}. Self-contained: no scripts, fonts or remote resources.</footer>\n</body>\n</html>",
            env!("CARGO_PKG_VERSION")
        );
        s
    }

    /// Writes the document atomically (a failed write leaves no partial file).
    pub fn write(&self, path: &Path) -> Result<()> {
        crate::data::write_atomic(path, self.render().as_bytes())
    }
}

fn badge(passed: bool) -> &'static str {
    if passed {
        "<span class=\"badge pass\">PASSED</span>"
    } else {
        "<span class=\"badge fail\">FAILED</span>"
    }
}

fn svg_open(w: f64, h: f64, title: &str) -> String {
    format!(
        "<svg class=\"chart\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{}\" font-family=\"sans-serif\">",
        esc(title)
    )
}

fn stats_table(rows: &[(&str, &Stats)]) -> String {
    let mut s = String::from("<div class=\"scroll\"><table><thead><tr><th class=\"l\"></th>");
    for h in [
        "mean", "std-dev", "median", "min", "at", "max", "at", "p90", "p95", "p99",
    ] {
        let _ = write!(s, "<th>{h}</th>");
    }
    s.push_str("</tr></thead><tbody>");
    let q = |x: Option<f64>| x.map_or_else(|| "–".to_string(), g);
    for (label, st) in rows {
        let _ = write!(
            s,
            "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td><td>{}</td><td class=\"mono\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(label),
            g(st.mean),
            g(st.std_dev),
            g(st.median),
            g(st.min),
            esc(&super::stats::fmt_index(&st.argmin)),
            g(st.max),
            esc(&super::stats::fmt_index(&st.argmax)),
            q(st.p90),
            q(st.p95),
            q(st.p99)
        );
    }
    s.push_str("</tbody></table></div>\n");
    s
}

/// The y axis: linear, or log10 over the finite positive values (whole decades).
struct YAxis {
    log: bool,
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl YAxis {
    fn new(ys: &[f64], log: bool) -> YAxis {
        let finite: Vec<f64> = ys
            .iter()
            .copied()
            .filter(|y| y.is_finite() && (!log || *y > 0.0))
            .collect();
        let (mn, mx) = finite
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &y| {
                (a.min(y), b.max(y))
            });
        if log {
            let (mut lo, mut hi) = if finite.is_empty() {
                (-6.0, 0.0)
            } else {
                // A little headroom, so points and lines do not sit on the frame.
                ((mn.log10() - 0.25).floor(), (mx.log10() + 0.25).ceil())
            };
            if hi <= lo {
                lo -= 1.0;
                hi += 1.0;
            }
            let decades = (hi - lo) as usize;
            let step = decades.div_ceil(8).max(1);
            let ticks = (0..=decades)
                .step_by(step)
                .map(|k| 10f64.powi(lo as i32 + k as i32))
                .collect();
            YAxis { log, lo, hi, ticks }
        } else {
            let (mut lo, mut hi) = if finite.is_empty() {
                (0.0, 1.0)
            } else {
                (mn.min(0.0), mx.max(0.0))
            };
            if hi - lo < 1e-300 {
                hi = lo + 1.0;
            }
            let ticks = nice_ticks(lo, hi, 6);
            if let (Some(&a), Some(&b)) = (ticks.first(), ticks.last()) {
                lo = lo.min(a);
                hi = hi.max(b);
            }
            YAxis { log, lo, hi, ticks }
        }
    }

    /// Where `y` sits between the axis' ends, 0 to 1.
    fn frac(&self, y: f64) -> f64 {
        let v = if self.log { y.log10() } else { y };
        ((v - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0)
    }
}

/// Round-numbered ticks (steps of 1, 2 or 5 times a power of ten) within [lo, hi].
fn nice_ticks(lo: f64, hi: f64, max_ticks: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return Vec::new();
    }
    let raw = (hi - lo) / max_ticks.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() <= max_ticks * 2 + 2 {
        // Snap tiny float noise (0.30000000000000004) to the grid.
        let k = (t / step).round() * step;
        // `+ 0.0` turns -0 into 0.
        out.push(format!("{k:.10e}").parse().unwrap_or(k) + 0.0);
        t += step;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{compare_output, Criterion, ErrorStat, PerOutput};
    use crate::tensor::Tensor;

    /// Checks that every non-void element is closed in order (the report is XHTML-clean
    /// enough for any parser) and returns the number of elements of each given name.
    pub(crate) fn check_well_formed(html: &str, count: &[&str]) -> Vec<usize> {
        const VOID: [&str; 6] = ["meta", "br", "hr", "img", "input", "link"];
        let mut stack: Vec<String> = Vec::new();
        let mut counts = vec![0; count.len()];
        let mut rest = html;
        while let Some(i) = rest.find('<') {
            rest = &rest[i + 1..];
            let end = rest.find('>').expect("unterminated tag");
            let tag = &rest[..end];
            rest = &rest[end + 1..];
            if tag.starts_with('!') {
                continue;
            }
            if let Some(name) = tag.strip_prefix('/') {
                let open = stack.pop().unwrap_or_else(|| panic!("stray </{name}>"));
                assert_eq!(open, name.trim(), "mismatched close tag");
                continue;
            }
            let name: String = tag
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            assert!(!name.is_empty(), "bad tag <{tag}>");
            if let Some(k) = count.iter().position(|c| *c == name) {
                counts[k] += 1;
            }
            if tag.ends_with('/') || VOID.contains(&name.as_str()) {
                continue;
            }
            // Raw text inside <style>: skip to its end.
            if name == "style" {
                let close = rest.find("</style>").expect("closed style");
                rest = &rest[close + "</style>".len()..];
                continue;
            }
            stack.push(name);
        }
        assert!(stack.is_empty(), "unclosed: {stack:?}");
        counts
    }

    fn rows() -> Vec<LayerError> {
        let row =
            |index: usize, layer: &str, p: Option<Precision>, a: f64, passed: bool| LayerError {
                index,
                layer: layer.into(),
                op: "Add".into(),
                output: format!("{layer}_out"),
                precision: p,
                required_atol: a,
                required_rtol: a,
                growth: a,
                passed,
                cause: crate::compare::cause::Cause::Rounding,
                facts: None,
            };
        vec![
            row(0, "MatMul", Some(Precision::Float16), 2.4e-4, true),
            row(
                1,
                "<script>alert('x')</script> & \"q\"",
                Some(Precision::Float16),
                1.5,
                false,
            ),
            row(2, "Sub", Some(Precision::Float32), 0.0, true),
            row(3, "Reshape", None, f64::INFINITY, false),
            row(4, "nan", Some(Precision::Float32), f64::NAN, false),
        ]
    }

    #[test]
    fn renders_a_well_formed_self_contained_document() {
        let t = |v: &[f32]| Tensor::from_f32(vec![v.len()], v.to_vec());
        let c = Criterion {
            stat: PerOutput::new(ErrorStat::Max),
            ..Default::default()
        };
        let a = compare_output("out<1>", &t(&[1.0, 2.0, 3.5]), &t(&[1.0, 2.0, 3.0]), &c).unwrap();
        let b = compare_output("ok", &t(&[1.0, 2.0]), &t(&[1.0, 2.0]), &c).unwrap();
        let mut r = HtmlReport::new("mixprec run <model.onnx>");
        r.verdict(
            false,
            "1 of 2 outputs failed",
            &["Output 'out<1>' failed".into()],
        )
        .output_comparisons(0, &[a, b])
        .layer_errors("Layer-wise comparison", &rows(), "median", Some(1e-3))
        .table(
            "Run",
            &["key", "value"],
            &[vec!["model".into(), "a&b.onnx".into()]],
        );
        let mut s = PlotSeries::new("accuracy");
        s.line = true;
        s.color = Some("red\" onload=\"x".into());
        s.points = vec![
            PlotPoint {
                x: 0.0,
                y: 0.5,
                passed: Some(false),
                label: Some("step <0>".into()),
            },
            PlotPoint {
                x: 1.0,
                y: 1e-4,
                passed: Some(true),
                label: None,
            },
        ];
        r.line_plot("Search history", "step", "error", true, &[s]);
        let html = r.render();
        let counts = check_well_formed(&html, &["svg", "rect", "circle", "table", "details"]);
        assert_eq!(counts[0], 2 * 3 + 2, "3 histograms per output, 2 plots");
        assert!(counts[1] > 20 && counts[2] > 5, "{counts:?}");
        assert_eq!(counts[4], 2);
        // Escaping: no raw markup from names; the unsafe colour was dropped.
        assert!(!html.contains("<script"), "layer name must be escaped");
        assert!(
            html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;")
        );
        assert!(html.contains("out&lt;1&gt;") && html.contains("a&amp;b.onnx"));
        assert!(!html.contains("onload"));
        // Nothing remote: no URL, no src= or href= at all.
        for needle in ["http://", "https://", "src=", "href=", "url(", "@import"] {
            assert!(!html.contains(needle), "{needle}");
        }
        // The failed output is open, the passed one collapsed; the first failing layer is marked.
        assert!(html.contains("<details class=\"card\" open>"));
        assert!(html.contains("first failing: #1"));
        assert!(html.contains("← first failing layer"));
        // Infinite and NaN tolerances land in the top band, zero in the bottom band.
        assert!(html.contains(">inf / nan</text>") && html.contains(">0</text>"));
        assert!(!html.contains("NaN"), "no NaN coordinates");
    }

    #[test]
    fn outputs_only_judges_only_the_graph_outputs() {
        let mut r = HtmlReport::new("search");
        let outs = ["Sub_out".to_string()];
        r.layer_errors_with(
            "Layer-wise error of the final plan",
            &rows(),
            "median",
            Some(1e-3),
            LayerVerdicts::OutputsOnly(&outs),
        );
        let html = r.render();
        check_well_formed(&html, &[]);
        // Failing intermediate layers are shown, not judged; the passing output is.
        assert!(
            !html.contains("badge fail") && !html.contains("FAILED"),
            "{html}"
        );
        assert!(!html.contains("first failing"));
        assert!(html.contains("<td class=\"pass\">PASSED</td>"));
        assert_eq!(html.matches("<td class=\"l\">–</td>").count(), 4);
        assert!(html.contains("<th class=\"l\">cause</th>"));
        assert!(html.contains("<td class=\"l cause rounding\""));
        // Judging every layer, as run --mark-all does, marks them.
        let mut r = HtmlReport::new("run");
        r.layer_errors("Layer-wise comparison", &rows(), "median", Some(1e-3));
        assert!(r.render().contains("badge fail"));
    }

    #[test]
    fn axes_cover_the_data() {
        let y = YAxis::new(&[2.4e-4, 1.5, 0.0, f64::INFINITY], true);
        assert_eq!((y.lo, y.hi), (-4.0, 1.0));
        assert_eq!(y.frac(1e-4), 0.0);
        assert_eq!(y.frac(10.0), 1.0);
        let y = YAxis::new(&[5.0, 5.0], true);
        assert!(y.lo < 5f64.log10() && y.hi > 5f64.log10());
        assert_eq!(
            nice_ticks(0.0, 10.0, 5),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        assert_eq!(nice_ticks(-0.5, 0.5, 4), vec![-0.5, 0.0, 0.5]);
        assert_eq!(nice_ticks(0.0, 0.3, 3), vec![0.0, 0.1, 0.2, 0.3]);
        assert!(nice_ticks(1.0, f64::NAN, 5).is_empty());
    }

    #[test]
    fn writes_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.html");
        HtmlReport::new("t")
            .verdict(true, "ok", &[])
            .write(&p)
            .unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.starts_with("<!DOCTYPE html>") && s.contains("PASSED"));
        assert!(HtmlReport::new("t")
            .write(&dir.path().join("missing/r.html"))
            .is_err());
    }
}
