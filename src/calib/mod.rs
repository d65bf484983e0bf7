//! INT8/FP8 calibration: per-tensor activation ranges (amax) from FP32 runs over calibration
//! data, with TensorRT's algorithms, written as a TensorRT calibration cache.
//!
//! * `minmax` (`IInt8MinMaxCalibrator`): amax = max |x| over all batches. One pass.
//! * `entropy` (`IInt8EntropyCalibrator2`, TensorRT's default): the threshold that minimises
//!   the KL divergence between the |x| histogram and its int8 quantization ([`entropy`]).
//! * `percentile`: amax = the given percentile of |x| (99.99 by default), as
//!   pytorch-quantization / ModelOpt calibrate.
//!
//! Histogram algorithms run the model twice: pass 1 finds max |x| per tensor, pass 2 fills a
//! 2048-bin histogram of |x| over `[0, max]` per tensor. Values are observed as the interpreter
//! produces them and never kept, so memory is bounded by the model, not by the data. Every
//! float tensor is calibrated — graph inputs and all node outputs, and inside If/Loop/Scan
//! bodies their inputs and node outputs, named by path (`Loop_0/body/x`, as plans name inner
//! nodes; the range covers every iteration and every branch taken); integer and bool tensors
//! (shapes, indices, masks) are not. Results are deterministic: integer counts, fixed bins.
//!
//! The cache stores the int8 scale `amax / 127`; fp8 layers use the same amax with their own
//! range (`amax / 448` for e4m3), see [`crate::precision::quant`].

pub mod cache;
pub mod entropy;
pub mod histogram;

pub use cache::{CalibrationCache, TRT_VERSION_TAG};

use crate::error::{Error, Result};
use crate::event::Progress;
use crate::exec::{Feeds, Interpreter, RunOptions};
use crate::precision::{quant::scale_from_amax, Precision};
use crate::tensor::{Tensor, TensorData};
use histogram::{Histogram, RangeStats};
use rayon::prelude::*;
use std::borrow::Cow;
use std::collections::HashMap;

/// Pytorch-quantization's and ModelOpt's default percentile.
pub const DEFAULT_PERCENTILE: f64 = 99.99;

/// How a tensor's amax is chosen from its values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CalibAlgo {
    /// max |x| (TensorRT's `IInt8MinMaxCalibrator`).
    MinMax,
    /// KL-divergence threshold (TensorRT's `IInt8EntropyCalibrator2`).
    Entropy,
    /// The given percentile of |x|, in (0, 100].
    Percentile(f64),
}

impl CalibAlgo {
    /// Parses `minmax`, `entropy` or `percentile` (99.99), or `percentile:P`/`percentile=P`.
    /// TensorRT's class names (`MinMaxCalibration`, `EntropyCalibration2`) are accepted too.
    pub fn parse(s: &str) -> Result<CalibAlgo> {
        let lower = s.trim().to_ascii_lowercase();
        if let Some(p) = lower
            .strip_prefix("percentile:")
            .or_else(|| lower.strip_prefix("percentile="))
        {
            let v: f64 = p.trim().parse().map_err(|_| {
                Error::Invalid(format!(
                    "calibration algorithm '{s}': '{p}' is not a number"
                ))
            })?;
            return CalibAlgo::percentile(v);
        }
        Ok(match lower.as_str() {
            "minmax" | "max" | "min-max" | "minmaxcalibration" => CalibAlgo::MinMax,
            "entropy" | "entropy2" | "entropycalibration2" | "kl" => CalibAlgo::Entropy,
            "percentile" => CalibAlgo::Percentile(DEFAULT_PERCENTILE),
            _ => {
                return Err(Error::Invalid(format!(
                    "unknown calibration algorithm '{s}': valid are minmax, entropy, percentile"
                )))
            }
        })
    }

    /// A percentile algorithm, checking `p` is in (0, 100].
    pub fn percentile(p: f64) -> Result<CalibAlgo> {
        if p > 0.0 && p <= 100.0 {
            Ok(CalibAlgo::Percentile(p))
        } else {
            Err(Error::Invalid(format!(
                "percentile {p} is out of range: it must be in (0, 100]"
            )))
        }
    }

    /// TensorRT's calibrator classes (Polygraphy's `--calibration-base-class`) as mixprec's
    /// algorithms, with a note where the mapping is not exact. `quantile` and
    /// `regression_cutoff` are `IInt8LegacyCalibrator`'s parameters.
    pub fn from_trt_calibrator(
        class: &str,
        quantile: Option<f64>,
        regression_cutoff: Option<f64>,
    ) -> Result<(CalibAlgo, Vec<String>)> {
        let name = class.trim().trim_start_matches("trt.");
        let mut notes = Vec::new();
        let legacy = name == "IInt8LegacyCalibrator";
        if !legacy && (quantile.is_some() || regression_cutoff.is_some()) {
            notes.push(format!(
                "--quantile/--regression-cutoff apply to IInt8LegacyCalibrator only; they have no effect with {name}"
            ));
        }
        let algo = match name {
            "IInt8EntropyCalibrator2" => CalibAlgo::Entropy,
            "IInt8EntropyCalibrator" => {
                notes.push(
                    "IInt8EntropyCalibrator (TensorRT's first entropy calibrator) runs as EntropyCalibration2, its successor".into(),
                );
                CalibAlgo::Entropy
            }
            "IInt8MinMaxCalibrator" => CalibAlgo::MinMax,
            "IInt8LegacyCalibrator" => {
                let q = quantile.unwrap_or(DEFAULT_PERCENTILE / 100.0);
                if !(q > 0.0 && q <= 1.0) {
                    return Err(Error::Invalid(format!(
                        "--quantile {q}: the quantile must be in (0, 1]"
                    )));
                }
                let algo = CalibAlgo::percentile(q * 100.0)?;
                notes.push(format!(
                    "IInt8LegacyCalibrator runs as percentile calibration at the {}th percentile of |x|{}",
                    q * 100.0,
                    if regression_cutoff.is_some() {
                        "; --regression-cutoff has no counterpart and is ignored"
                    } else {
                        ""
                    }
                ));
                algo
            }
            _ => {
                return Err(Error::Invalid(format!(
                    "calibration base class '{class}': valid are IInt8EntropyCalibrator2, IInt8EntropyCalibrator, IInt8MinMaxCalibrator, IInt8LegacyCalibrator"
                )))
            }
        };
        Ok((algo, notes))
    }

    /// The algorithm's name in cache headers: TensorRT's names where TensorRT has the
    /// algorithm (`EntropyCalibration2`, `MinMaxCalibration`); `PercentileCalibration` otherwise.
    pub fn trt_name(self) -> &'static str {
        match self {
            CalibAlgo::MinMax => "MinMaxCalibration",
            CalibAlgo::Entropy => "EntropyCalibration2",
            CalibAlgo::Percentile(_) => "PercentileCalibration",
        }
    }

    /// The cache header, e.g. `TRT-8601-EntropyCalibration2`.
    pub fn cache_header(self) -> String {
        format!("TRT-{TRT_VERSION_TAG}-{}", self.trt_name())
    }

    /// Model runs per batch: 1 for minmax, 2 for histogram algorithms.
    pub fn passes(self) -> usize {
        match self {
            CalibAlgo::MinMax => 1,
            _ => 2,
        }
    }
}

impl std::str::FromStr for CalibAlgo {
    type Err = Error;
    fn from_str(s: &str) -> Result<CalibAlgo> {
        CalibAlgo::parse(s)
    }
}

impl std::fmt::Display for CalibAlgo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CalibAlgo::MinMax => f.write_str("minmax"),
            CalibAlgo::Entropy => f.write_str("entropy"),
            CalibAlgo::Percentile(p) => write!(f, "percentile({p})"),
        }
    }
}

/// What calibration found for one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorCalibration {
    pub name: String,
    /// Largest finite |x| over all batches.
    pub max_abs: f32,
    /// The calibrated range (≤ `max_abs`).
    pub amax: f32,
    /// The int8 scale written to the cache (`amax / 127`; 1 when amax is 0).
    pub scale: f32,
    /// Finite values seen over all batches.
    pub values: u64,
    /// ±inf values seen; they are left out of the statistics.
    pub infinite: u64,
    /// Whether the tensor is in the cache (not when it never held a finite value).
    pub in_cache: bool,
}

/// The result of a calibration with per-tensor detail (the CLI prints it).
#[derive(Clone, Debug)]
pub struct CalibrationReport {
    pub cache: CalibrationCache,
    /// Every float tensor observed, in the order the model produces them.
    pub tensors: Vec<TensorCalibration>,
    pub algo: CalibAlgo,
    pub batches: usize,
    /// Model runs over all batches (batches · passes).
    pub runs: usize,
}

/// Calibrates every float tensor of the model over `batches` and returns the cache
/// (header `TRT-8601-<algorithm>`). `progress` is told of every run: one step per batch per pass.
pub fn calibrate(
    interp: &Interpreter,
    batches: &[Feeds],
    algo: CalibAlgo,
    progress: &dyn Progress,
) -> Result<CalibrationCache> {
    calibrate_report(interp, batches, algo, progress).map(|r| r.cache)
}

/// [`calibrate`] with per-tensor statistics.
pub fn calibrate_report(
    interp: &Interpreter,
    batches: &[Feeds],
    algo: CalibAlgo,
    progress: &dyn Progress,
) -> Result<CalibrationReport> {
    if let CalibAlgo::Percentile(p) = algo {
        CalibAlgo::percentile(p)?;
    }
    if batches.is_empty() {
        return Err(Error::Invalid(
            "calibration needs at least one batch of input data".into(),
        ));
    }
    // Check every batch before the first (possibly long) run.
    for (i, feeds) in batches.iter().enumerate() {
        interp
            .check_feeds(feeds)
            .map_err(|e| Error::Invalid(format!("calibration batch {i}: {e}")))?;
    }
    let passes = algo.passes();
    let bar = progress;
    bar.start((batches.len() * passes) as u64);

    // Pass 1: ranges. Tensors are kept in the order they are first produced.
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    let mut ranges: Vec<RangeStats> = Vec::new();
    if passes > 1 {
        bar.message(&format!("calibrating ({algo}) pass 1/{passes}: ranges"));
    } else {
        bar.message(&format!("calibrating ({algo}): ranges"));
    }
    for (b, feeds) in batches.iter().enumerate() {
        let mut failure: Option<Error> = None;
        interp
            .run_observed(feeds, &RunOptions::default(), &mut |name, t| {
                if failure.is_some() {
                    return;
                }
                let Some(values) = float_values(t) else {
                    return;
                };
                let k = match index.get(name) {
                    Some(&k) => k,
                    None => {
                        index.insert(name.to_string(), names.len());
                        names.push(name.to_string());
                        ranges.push(RangeStats::default());
                        names.len() - 1
                    }
                };
                let before = ranges[k].nan;
                ranges[k].observe(&values);
                if ranges[k].nan > before {
                    failure = Some(Error::Invalid(format!(
                        "tensor '{name}': {} NaN value(s) in calibration batch {b}; the FP32 \
                         model produces NaN on this data, so no range can be calibrated",
                        ranges[k].nan - before
                    )));
                }
            })
            .map_err(|e| Error::Invalid(format!("calibration batch {b}: {e}")))?;
        if let Some(e) = failure {
            bar.finish(false);
            return Err(e);
        }
        bar.advance(1);
    }

    // Pass 2: histograms over [0, max|x|].
    let mut hists: Vec<Histogram> = Vec::new();
    if passes > 1 {
        bar.message(&format!("calibrating ({algo}) pass 2/{passes}: histograms"));
        hists = ranges.iter().map(|r| Histogram::new(r.max_abs)).collect();
        for (b, feeds) in batches.iter().enumerate() {
            interp
                .run_observed(feeds, &RunOptions::default(), &mut |name, t| {
                    let Some(&k) = index.get(name) else {
                        return;
                    };
                    if let Some(values) = float_values(t) {
                        hists[k].observe(&values);
                    }
                })
                .map_err(|e| Error::Invalid(format!("calibration batch {b}: {e}")))?;
            bar.advance(1);
        }
    }
    bar.finish(true);

    // Amax per tensor (independent per tensor: in parallel, collected in order).
    let amaxes: Vec<f32> = (0..names.len())
        .into_par_iter()
        .map(|k| match algo {
            CalibAlgo::MinMax => ranges[k].max_abs,
            CalibAlgo::Entropy => {
                let h = &hists[k];
                match entropy::entropy_threshold_bin(&h.counts) {
                    Some(i) => h.edge(i),
                    None => h.range,
                }
            }
            CalibAlgo::Percentile(p) => hists[k].percentile_amax(p),
        })
        .collect();

    let mut cache = CalibrationCache::new(algo.cache_header());
    let mut tensors = Vec::with_capacity(names.len());
    for ((name, r), amax) in names.into_iter().zip(&ranges).zip(amaxes) {
        let scale = scale_from_amax(amax, Precision::Int8);
        let in_cache = r.finite > 0;
        if in_cache {
            cache.scales.push((name.clone(), scale));
        }
        tensors.push(TensorCalibration {
            name,
            max_abs: r.max_abs,
            amax,
            scale,
            values: r.finite,
            infinite: r.infinite,
            in_cache,
        });
    }
    Ok(CalibrationReport {
        cache,
        tensors,
        algo,
        batches: batches.len(),
        runs: batches.len() * passes,
    })
}

/// Every value a calibration can name: the main graph's inputs and node outputs, and the
/// inputs and node outputs of every subgraph by path (`Loop_0/body/x`).
pub fn value_names(graph: &crate::graph::Graph) -> std::collections::HashSet<String> {
    fn walk(g: &crate::graph::Graph, prefix: &str, out: &mut std::collections::HashSet<String>) {
        for v in &g.inputs {
            out.insert(format!("{prefix}{}", v.name));
        }
        for n in &g.nodes {
            for o in n.outputs.iter().filter(|o| !o.is_empty()) {
                out.insert(format!("{prefix}{o}"));
            }
            for (attr, sg) in n.subgraphs() {
                walk(sg, &format!("{prefix}{}/{attr}/", n.name), out);
            }
        }
    }
    let mut out = std::collections::HashSet::new();
    walk(graph, "", &mut out);
    out
}

/// A float tensor's values as f32 (borrowed for f32); None for integer, bool, string tensors.
fn float_values(t: &Tensor) -> Option<Cow<'_, [f32]>> {
    match t.data() {
        TensorData::F32(v) => Some(Cow::Borrowed(v.as_slice())),
        TensorData::F64(v) => Some(Cow::Owned(v.iter().map(|&x| x as f32).collect())),
        TensorData::F16(v) => Some(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
        TensorData::BF16(v) => Some(Cow::Owned(v.iter().map(|x| x.to_f32()).collect())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::NoProgress;

    #[test]
    fn trt_calibrator_classes_map_to_algorithms() {
        let m = |c: &str| CalibAlgo::from_trt_calibrator(c, None, None).unwrap().0;
        assert_eq!(m("IInt8EntropyCalibrator2"), CalibAlgo::Entropy);
        assert_eq!(m("trt.IInt8MinMaxCalibrator"), CalibAlgo::MinMax);
        assert_eq!(m("IInt8EntropyCalibrator"), CalibAlgo::Entropy);
        let (a, notes) =
            CalibAlgo::from_trt_calibrator("IInt8LegacyCalibrator", Some(0.999), Some(0.5))
                .unwrap();
        assert!(matches!(a, CalibAlgo::Percentile(p) if (p - 99.9).abs() < 1e-9));
        assert!(notes[0].contains("regression-cutoff"), "{notes:?}");
        let e = CalibAlgo::from_trt_calibrator("Foo", None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("IInt8MinMaxCalibrator"), "{e}");
        assert!(CalibAlgo::from_trt_calibrator("IInt8LegacyCalibrator", Some(2.0), None).is_err());
    }
    use crate::graph::{Graph, Node, ValueInfo};
    use crate::tensor::DType;
    use std::collections::BTreeMap;

    fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> Node {
        Node {
            name: format!("{op}_{}", outputs[0]),
            op_type: op.into(),
            domain: String::new(),
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            attrs: BTreeMap::new(),
            ..Default::default()
        }
    }

    fn vi(name: &str, shape: &[usize]) -> ValueInfo {
        ValueInfo {
            name: name.into(),
            dtype: Some(DType::F32),
            shape: Some(shape.iter().map(|&d| crate::graph::Dim::Fixed(d)).collect()),
        }
    }

    /// x[n] -> y = x * 2 -> z = Relu(y); s = Shape(z) (int64, not calibrated).
    fn tiny_graph(n: usize) -> Graph {
        let mut g = Graph {
            nodes: vec![
                node("Mul", &["x", "two"], &["y"]),
                node("Relu", &["y"], &["z"]),
                node("Shape", &["z"], &["s"]),
            ],
            inputs: vec![vi("x", &[n])],
            outputs: vec![vi("z", &[n])],
            ..Default::default()
        };
        g.initializers
            .insert("two".into(), Tensor::from_f32(vec![], vec![2.0]));
        g.opsets.insert(String::new(), 17);
        g
    }

    fn feeds(v: &[f32]) -> Feeds {
        let mut f = Feeds::new();
        f.insert("x".into(), Tensor::from_f32(vec![v.len()], v.to_vec()));
        f
    }

    #[test]
    fn algo_names_parse() {
        assert_eq!(CalibAlgo::parse("minmax").unwrap(), CalibAlgo::MinMax);
        assert_eq!(CalibAlgo::parse("Entropy").unwrap(), CalibAlgo::Entropy);
        assert_eq!(
            CalibAlgo::parse("percentile").unwrap(),
            CalibAlgo::Percentile(99.99)
        );
        assert_eq!(
            CalibAlgo::parse("percentile:99.9").unwrap(),
            CalibAlgo::Percentile(99.9)
        );
        assert!(CalibAlgo::parse("percentile:120").is_err());
        assert!(CalibAlgo::parse("mse")
            .unwrap_err()
            .to_string()
            .contains("valid are minmax, entropy, percentile"));
        assert_eq!(
            CalibAlgo::Entropy.cache_header(),
            "TRT-8601-EntropyCalibration2"
        );
        assert_eq!(
            CalibAlgo::MinMax.cache_header(),
            "TRT-8601-MinMaxCalibration"
        );
    }

    #[test]
    fn minmax_on_a_tiny_graph() {
        let g = tiny_graph(4);
        let interp = Interpreter::new(&g).unwrap();
        let batches = vec![
            feeds(&[1.0, -3.0, 0.5, 2.0]),
            feeds(&[0.25, 2.5, -1.0, 0.0]),
        ];
        let report = calibrate_report(&interp, &batches, CalibAlgo::MinMax, &NoProgress).unwrap();
        let c = &report.cache;
        assert_eq!(c.header, "TRT-8601-MinMaxCalibration");
        let names: Vec<&str> = c.scales.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x", "y", "z"], "the int64 shape tensor is skipped");
        assert_eq!(c.scale("x"), Some(3.0 / 127.0));
        assert_eq!(c.scale("y"), Some(6.0 / 127.0));
        assert_eq!(c.scale("z"), Some(5.0 / 127.0));
        assert_eq!(c.amax("z"), Some(5.0));
        assert_eq!(report.runs, 2);
        // The same cache from the short form, and deterministic.
        let again = calibrate(&interp, &batches, CalibAlgo::MinMax, &NoProgress).unwrap();
        assert_eq!(&again, c);
    }

    #[test]
    fn histogram_algorithms_on_a_tiny_graph() {
        let n = 4096;
        let g = tiny_graph(n);
        let interp = Interpreter::new(&g).unwrap();
        // Standard normal data, 8 batches; one value of 50 (a far outlier) in the last batch.
        let mut rng = entropy::tests::Rng(3);
        let mut batches: Vec<Feeds> = (0..8)
            .map(|_| feeds(&(0..n).map(|_| rng.normal() as f32).collect::<Vec<_>>()))
            .collect();
        if let Some(TensorData::F32(v)) = batches[7].get_mut("x").map(|t| t.data_mut()) {
            v.make_mut()[100] = 50.0;
        }
        let r =
            calibrate_report(&interp, &batches, CalibAlgo::Percentile(99.9), &NoProgress).unwrap();
        assert_eq!(r.cache.header, "TRT-8601-PercentileCalibration");
        assert_eq!(r.runs, 16);
        let amax = r.cache.amax("x").unwrap();
        // The 99.9th percentile of |N(0,1)| is 3.29.
        assert!(amax > 3.0 && amax < 3.6, "percentile amax of x: {amax}");
        let p100 = calibrate(&interp, &batches, CalibAlgo::Percentile(100.0), &NoProgress).unwrap();
        assert_eq!(p100.amax("x"), Some(50.0));
        assert_eq!(p100.amax("y"), Some(100.0));

        let e = calibrate(&interp, &batches, CalibAlgo::Entropy, &NoProgress).unwrap();
        assert_eq!(e.header, "TRT-8601-EntropyCalibration2");
        let amax = e.amax("x").unwrap();
        assert!(
            amax > 2.0 && amax < 10.0,
            "entropy clips the outlier: amax {amax}"
        );
        let again = calibrate(&interp, &batches, CalibAlgo::Entropy, &NoProgress).unwrap();
        assert_eq!(again, e, "deterministic");
    }

    #[test]
    fn nan_names_the_tensor_and_bad_data_the_batch() {
        let g = tiny_graph(4);
        let interp = Interpreter::new(&g).unwrap();
        let batches = vec![
            feeds(&[1.0, 2.0, 3.0, 4.0]),
            feeds(&[1.0, f32::NAN, 3.0, 4.0]),
        ];
        let e = calibrate(&interp, &batches, CalibAlgo::MinMax, &NoProgress)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tensor 'x'") && e.contains("NaN") && e.contains("batch 1"),
            "{e}"
        );

        let bad = feeds(&[1.0; 3]);
        let e = calibrate(
            &interp,
            &[feeds(&[0.0; 4]), bad],
            CalibAlgo::Entropy,
            &NoProgress,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("batch 1") && e.contains("input 'x'"), "{e}");
        let e = calibrate(&interp, &[], CalibAlgo::Entropy, &NoProgress)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least one batch"), "{e}");
    }

    #[test]
    fn infinities_are_left_out() {
        let g = tiny_graph(4);
        let interp = Interpreter::new(&g).unwrap();
        let batches = vec![feeds(&[1.0, f32::NEG_INFINITY, 3.0, 4.0])];
        let r = calibrate_report(&interp, &batches, CalibAlgo::Entropy, &NoProgress).unwrap();
        let x = &r.tensors[0];
        assert_eq!(
            (x.name.as_str(), x.max_abs, x.infinite, x.values),
            ("x", 4.0, 1, 3)
        );
        assert!(r.cache.amax("x").unwrap() <= 4.0);
    }

    /// A Loop of 3 iterations over v[1, 2]: h = v * 2 (inside the body), v' = MatMul(h, w)
    /// with w an initializer of the main graph.
    fn loop_graph() -> Graph {
        use crate::graph::testing::{graph, node as n};
        let bool_vi = |name: &str| ValueInfo {
            name: name.into(),
            dtype: Some(DType::Bool),
            shape: Some(vec![]),
        };
        let i64_vi = |name: &str| ValueInfo {
            name: name.into(),
            dtype: Some(DType::I64),
            shape: Some(vec![]),
        };
        let body = graph(
            vec![
                n("scale", "Mul", &["v_in", "two"], &["h"]),
                n("mm", "MatMul", &["h", "w"], &["v_out"]),
                n("keep", "Identity", &["cond_in"], &["cond_out"]),
            ],
            vec![i64_vi("iter"), bool_vi("cond_in"), vi("v_in", &[1, 2])],
            vec![bool_vi("cond_out"), vi("v_out", &[1, 2])],
            vec![("two", Tensor::from_f32(vec![], vec![2.0]))],
        );
        let mut lp = n("loop", "Loop", &["trips", "", "x"], &["y"]);
        lp.attrs.insert(
            "body".into(),
            crate::graph::Attribute::Graph(std::sync::Arc::new(body)),
        );
        graph(
            vec![lp],
            vec![vi("x", &[1, 2])],
            vec![vi("y", &[1, 2])],
            vec![
                ("trips", Tensor::from_i64(vec![], vec![3])),
                (
                    "w",
                    Tensor::from_f32(vec![2, 2], vec![0.5, -0.25, 0.125, 1.5]),
                ),
            ],
        )
    }

    #[test]
    fn values_inside_subgraph_bodies_are_calibrated_by_path() {
        use crate::exec::emulate::required_ranges;
        use crate::exec::{PlanOptions, PreparedPlan};
        use crate::precision::plan::PrecisionPlan;
        let g = loop_graph();
        let interp = Interpreter::new(&g).unwrap();
        let mut f = Feeds::new();
        f.insert("x".into(), Tensor::from_f32(vec![1, 2], vec![1.0, -2.0]));
        let c = calibrate(
            &interp,
            std::slice::from_ref(&f),
            CalibAlgo::MinMax,
            &NoProgress,
        )
        .unwrap();
        // By hand: v0 = [1, -2]; h = 2v; v' = h·w. Iterations: h = [2, -4] → v = [0.5, -6.5];
        // h = [1, -13] → v = [-1.125, -19.75]; h = [-2.25, -39.5] → v = [-6.0625, -58.6875].
        assert_eq!(
            c.amax("loop/body/h"),
            Some(39.5),
            "max over every iteration"
        );
        assert_eq!(c.amax("loop/body/v_out"), Some(58.6875));
        assert_eq!(c.amax("loop/body/v_in"), Some(19.75));
        assert_eq!(c.amax("y"), Some(58.6875));
        assert!(c.amax("h").is_none(), "inner values are named by path");
        let known = value_names(&g);
        assert!(c.scales.iter().all(|(n, _)| known.contains(n)), "{c:?}");
        // An int8 plan on the inner MatMul needs (and finds) the range of its activation; the
        // outer-scope weight is quantized per channel, not asked for a range.
        let mut plan = PrecisionPlan::uniform(&g, Precision::Float32);
        plan.inner.insert("loop/body/mm".into(), Precision::Int8);
        assert_eq!(required_ranges(&g, &plan), ["loop/body/h"]);
        let e = PreparedPlan::new(&g, &plan, &PlanOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'loop/body/h'") && e.contains("loop/body/mm"),
            "{e}"
        );
        let amax = c.amax_map();
        let opts = PlanOptions {
            amax: Some(&amax),
            ..Default::default()
        };
        let prepared = PreparedPlan::new(&g, &plan, &opts).unwrap();
        let y = interp
            .run_plan(&f, &RunOptions::default(), &prepared)
            .unwrap();
        let exact = interp.run(&f).unwrap();
        let (y, exact) = (
            y.outputs[0].1.as_f32().unwrap().to_vec(),
            exact.outputs[0].1.as_f32().unwrap().to_vec(),
        );
        assert_ne!(y, exact, "the inner MatMul is quantized");
        for (a, b) in y.iter().zip(&exact) {
            assert!((a - b).abs() < 0.05 * b.abs(), "{y:?} vs {exact:?}");
        }
    }
}
