//! The option groups several jobs share — the comparison criterion, the precisions, the
//! calibration algorithm, where inputs come from — held as the command line spells them (the
//! CLI fills them from its flags, the Python package from keyword arguments), validated into
//! the library's types here, and written back as flags here (replays, `mixprec convert` lines,
//! deploy lines): a new option is one edit in this file.

use crate::calib::CalibAlgo;
use crate::compare::{Criterion, ErrorStat, Metric, PerOutput, DEFAULT_QUANTILE};
use crate::data::loader::{self, DataLoaderConfig};
use crate::data::script::DataLoaderScript;
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::exec::{Feeds, PlanOptions, PreparedPlan};
use crate::precision::fusion::FusionModel;
use crate::precision::plan::{
    parse_layer_precisions, GlobalPrecision, PrecisionConstraints, PrecisionPlan,
};
use crate::precision::Accumulator;
use crate::Graph;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Tolerances, the checked error statistic and extra metrics (Polygraphy's comparator
/// options): `--atol`, `--rtol`, `--check-error-stat`, `--error-quantile`, `--metric`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompareOptions {
    pub atol: Vec<String>,
    pub rtol: Vec<String>,
    pub check_error_stat: Vec<String>,
    pub error_quantile: Vec<String>,
    pub metric: Vec<String>,
}

impl CompareOptions {
    /// The criterion these options describe (defaults: atol = rtol = 1e-5, elemwise).
    pub fn criterion(&self) -> Result<Criterion> {
        Ok(Criterion {
            atol: PerOutput::parse_list(&self.atol, 1e-5, "--atol", |s| s.parse().ok())?,
            rtol: PerOutput::parse_list(&self.rtol, 1e-5, "--rtol", |s| s.parse().ok())?,
            stat: PerOutput::parse_list(
                &self.check_error_stat,
                ErrorStat::Elemwise,
                "--check-error-stat",
                |s| ErrorStat::parse(s).ok(),
            )?,
            quantile: PerOutput::parse_list(
                &self.error_quantile,
                DEFAULT_QUANTILE,
                "--error-quantile (a number in [0, 1])",
                |s| s.parse().ok().filter(|q: &f64| (0.0..=1.0).contains(q)),
            )?,
            metrics: self
                .metric
                .iter()
                .map(|m| Metric::parse(m))
                .collect::<Result<_>>()?,
        })
    }
}

/// How activation ranges are calibrated when no cache holds them: mixprec's algorithm names
/// (`--calibration-algo`) or Polygraphy's TensorRT calibrator classes
/// (`--calibration-base-class`, `--quantile`, `--regression-cutoff`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CalibOptions {
    pub calibration_algo: Option<String>,
    pub base_class: Option<String>,
    pub quantile: Option<f64>,
    pub regression_cutoff: Option<f64>,
}

impl CalibOptions {
    /// The algorithm: `algo` (a command's own option) or `calibration_algo`, else the base
    /// class, else entropy; notes go to `events`.
    pub fn algo(&self, algo: Option<&str>, events: &mut dyn FnMut(Event)) -> Result<CalibAlgo> {
        let named = algo.or(self.calibration_algo.as_deref());
        match (named, &self.base_class) {
            (Some(_), Some(c)) => Err(Error::Invalid(format!(
                "give either a calibration algorithm or --calibration-base-class {c}, not both"
            ))),
            (Some(a), None) => {
                if self.quantile.is_some() || self.regression_cutoff.is_some() {
                    events(Event::Warning("--quantile/--regression-cutoff apply to --calibration-base-class IInt8LegacyCalibrator only; they have no effect".into()));
                }
                CalibAlgo::parse(a)
                    .map_err(|e| Error::Invalid(format!("calibration algorithm: {e}")))
            }
            (None, Some(c)) => {
                let (a, notes) =
                    CalibAlgo::from_trt_calibrator(c, self.quantile, self.regression_cutoff)?;
                for n in notes {
                    events(Event::Warning(n));
                }
                Ok(a)
            }
            (None, None) => Ok(CalibAlgo::Entropy),
        }
    }
}

/// The precisions a plan is resolved from: `--fp16/--bf16/--int8/--fp8`, `--layer-precisions`,
/// `--precision-constraints`, `--accumulate`, `--fusion`, `--calibration-cache` and the
/// calibration algorithm.
#[derive(Clone, Debug, PartialEq)]
pub struct PrecisionOptions {
    pub fp16: bool,
    pub bf16: bool,
    pub int8: bool,
    pub fp8: bool,
    pub layer_precisions: Vec<String>,
    pub precision_constraints: String,
    pub accumulate: String,
    pub fusion: String,
    pub calibration_cache: Option<PathBuf>,
    pub calib: CalibOptions,
}

impl Default for PrecisionOptions {
    fn default() -> Self {
        PrecisionOptions {
            fp16: false,
            bf16: false,
            int8: false,
            fp8: false,
            layer_precisions: Vec::new(),
            precision_constraints: "prefer".into(),
            accumulate: "f32".into(),
            fusion: "none".into(),
            calibration_cache: None,
            calib: CalibOptions::default(),
        }
    }
}

impl PrecisionOptions {
    pub fn global(&self) -> GlobalPrecision {
        GlobalPrecision {
            fp16: self.fp16,
            bf16: self.bf16,
            int8: self.int8,
            fp8: self.fp8,
        }
    }

    /// Whether a global precision other than float32 is on.
    pub fn any_global(&self) -> bool {
        self.fp16 || self.bf16 || self.int8 || self.fp8
    }

    /// True when anything asks for a precision other than float32.
    pub fn any(&self) -> bool {
        self.any_global() || !self.layer_precisions.is_empty()
    }

    pub fn accumulator(&self) -> Result<Accumulator> {
        Accumulator::parse(&self.accumulate)
    }

    /// `--fusion`.
    pub fn fusion_model(&self) -> Result<FusionModel> {
        FusionModel::parse(&self.fusion)
    }

    /// The resolved plan; warnings go to `events`.
    pub fn plan(&self, graph: &Graph, events: &mut dyn FnMut(Event)) -> Result<PrecisionPlan> {
        let overrides = parse_layer_precisions(&self.layer_precisions)?;
        let constraints = PrecisionConstraints::parse(&self.precision_constraints)?;
        let (mut plan, warnings) =
            PrecisionPlan::resolve(graph, &self.global(), &overrides, constraints)?;
        for w in warnings {
            events(Event::Warning(w));
        }
        plan.fusion = self.fusion_model()?;
        Ok(plan)
    }

    /// Whether the plan needs activation ranges.
    pub fn needs_ranges(plan: &PrecisionPlan) -> bool {
        plan.layers.iter().any(|p| p.is_scaled()) || plan.inner.values().any(|p| p.is_scaled())
    }

    /// Prepares the plan with the given activation ranges, for inputs of `input_shapes`.
    pub fn prepare(
        &self,
        graph: &Graph,
        plan: &PrecisionPlan,
        amax: Option<&BTreeMap<String, f32>>,
        input_shapes: &BTreeMap<String, Vec<usize>>,
    ) -> Result<PreparedPlan> {
        PreparedPlan::new(
            graph,
            plan,
            &PlanOptions {
                accumulate: self.accumulator()?,
                amax,
                input_shapes: Some(input_shapes),
            },
        )
    }

    /// The global precision flags as mixprec and Polygraphy spell them, with the
    /// calibration cache (`--fp16 --int8 --calibration-cache c.cache`).
    pub fn flags(&self) -> String {
        let mut s = self.global_flags().join(" ");
        if let Some(c) = &self.calibration_cache {
            s.push_str(&format!(" --calibration-cache {}", c.display()));
        }
        s
    }

    fn global_flags(&self) -> Vec<&'static str> {
        [
            (self.fp16, "--fp16"),
            (self.bf16, "--bf16"),
            (self.int8, "--int8"),
            (self.fp8, "--fp8"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, f)| *f)
        .collect()
    }

    /// The same as TensorRT <= 10's trtexec spells them (`--fp16 --int8 --calib=c.cache`).
    pub fn trtexec_flags(&self) -> String {
        let mut f = Vec::new();
        if self.fp16 {
            f.push("--fp16".to_string());
        }
        if self.bf16 {
            f.push("--bf16".to_string());
        }
        if self.int8 {
            f.push("--int8".to_string());
            if let Some(c) = &self.calibration_cache {
                f.push(format!("--calib={}", c.display()));
            }
        }
        if self.fp8 {
            f.push("--fp8".to_string());
        }
        f.join(" ")
    }

    /// What decides a plan's numbers, for debug replays' settings (key → value).
    pub fn replay_settings(&self, put: &mut dyn FnMut(&str, String)) {
        put("precision", self.global_flags().join(" "));
        put("layer-precisions", self.layer_precisions.join(" "));
        put("precision-constraints", self.precision_constraints.clone());
        if self.fusion != "none" {
            // Only then: replays saved before --fusion existed keep matching.
            put("fusion", self.fusion.clone());
        }
        put("accumulate", self.accumulate.clone());
        put(
            "calibration-cache",
            self.calibration_cache
                .as_ref()
                .map_or_else(String::new, |p| p.display().to_string()),
        );
        let c = &self.calib;
        put(
            "calibration",
            format!(
                "{} {} {:?} {:?}",
                c.calibration_algo.as_deref().unwrap_or(""),
                c.base_class.as_deref().unwrap_or(""),
                c.quantile,
                c.regression_cutoff
            )
            .trim()
            .to_string(),
        );
    }

    /// The calibration flags `mixprec convert` needs to compute the same ranges again (the
    /// cache, else the algorithm); `data` adds the inputs they are calibrated on.
    pub fn calibration_flags(&self, data: Option<&DataOptions>) -> Vec<String> {
        let mut w: Vec<String> = Vec::new();
        if let Some(c) = &self.calibration_cache {
            w.extend(["--calibration-cache".into(), c.display().to_string()]);
            return w;
        }
        let c = &self.calib;
        if let Some(a) = &c.calibration_algo {
            w.extend(["--calibration-algo".into(), a.clone()]);
        }
        if let Some(b) = &c.base_class {
            w.extend(["--calibration-base-class".into(), b.clone()]);
        }
        if let Some(q) = c.quantile {
            w.extend(["--quantile".into(), q.to_string()]);
        }
        if let Some(d) = data {
            w.extend(d.flags());
        }
        w
    }
}

/// Where input sets come from (Polygraphy's data-loader options): generated from the
/// model's declared inputs (`--val-range`, `--seed`, `--iterations`, `--input-shapes`,
/// `--trt-opt-shapes`), loaded (`--load-inputs`: Polygraphy JSON or `.npz`), or from a
/// data-loader script.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DataOptions {
    pub val_range: Vec<String>,
    pub seed: Option<u64>,
    pub iterations: Option<usize>,
    pub input_shapes: Vec<String>,
    /// TensorRT's optimization-profile shapes (`--trt-opt-shapes`): used as input shapes.
    pub opt_shapes: Vec<String>,
    pub load_inputs: Vec<PathBuf>,
    pub data_loader_script: Option<String>,
    pub data_loader_func_name: Option<String>,
}

impl DataOptions {
    /// The input shapes `--input-shapes` and `--trt-opt-shapes` set (opt is the shape a
    /// TensorRT engine is tuned for).
    pub fn shape_overrides(&self) -> Result<BTreeMap<String, Vec<usize>>> {
        let mut shapes = BTreeMap::new();
        for s in self.opt_shapes.iter().chain(&self.input_shapes) {
            shapes.extend(loader::parse_input_shapes(s)?);
        }
        Ok(shapes)
    }

    /// The input sets: loaded, from a data-loader script, or generated from the model's
    /// declared inputs. Warnings and the script's own output go to `events`.
    pub fn feeds(&self, graph: &Graph, events: &mut dyn FnMut(Event)) -> Result<Vec<Feeds>> {
        if let Some(spec) = &self.data_loader_script {
            if !self.load_inputs.is_empty() {
                return Err(Error::Invalid(
                    "give either --data-loader-script or --load-inputs, not both".into(),
                ));
            }
            let mut script = DataLoaderScript::parse(spec);
            if let Some(f) = &self.data_loader_func_name {
                script.func = f.clone();
            }
            let python = std::env::var_os("MIXPREC_PYTHON")
                .map_or_else(|| PathBuf::from("python3"), PathBuf::from);
            let limit = self.iterations.filter(|&n| n > 0);
            let (feeds, log) = script.load(&python, &graph.inputs, limit)?;
            if !log.trim().is_empty() {
                events(Event::Output(log));
            }
            return Ok(feeds);
        }
        if !self.load_inputs.is_empty() {
            let mut all = Vec::new();
            for p in &self.load_inputs {
                // By content: JSON, or .npz, whatever the file is named.
                all.extend(crate::data::load_input_sets(p)?);
            }
            // float8/int4/float4 inputs arrive as uint8/int8 arrays (NumPy has no such types).
            return all
                .into_iter()
                .map(|f| crate::data::npy::as_declared(f, &graph.inputs))
                .collect();
        }
        let mut cfg = DataLoaderConfig::default();
        if let Some(s) = self.seed {
            cfg.seed = s;
        }
        cfg.iterations = self.iterations.unwrap_or(1).max(1);
        for r in &self.val_range {
            loader::parse_val_range_into(r, &mut cfg.val_ranges)?;
        }
        cfg.input_shapes = self.shape_overrides()?;
        let (feeds, warnings) = loader::generate(&graph.inputs, &cfg)?;
        for w in warnings {
            events(Event::Warning(w));
        }
        Ok(feeds)
    }

    /// These options as flags (what a `mixprec convert` line repeats to see the same inputs).
    pub fn flags(&self) -> Vec<String> {
        let mut w: Vec<String> = Vec::new();
        let mut many = |flag: &str, v: &[String]| {
            if !v.is_empty() {
                w.push(flag.to_string());
                w.extend(v.iter().cloned());
            }
        };
        many("--val-range", &self.val_range);
        many("--input-shapes", &self.input_shapes);
        many("--trt-opt-shapes", &self.opt_shapes);
        many(
            "--load-inputs",
            &self
                .load_inputs
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>(),
        );
        if let Some(s) = self.seed {
            w.extend(["--seed".into(), s.to_string()]);
        }
        if let Some(n) = self.iterations {
            w.extend(["--iterations".into(), n.to_string()]);
        }
        if let Some(s) = &self.data_loader_script {
            w.extend(["--data-loader-script".into(), s.clone()]);
        }
        if let Some(f) = &self.data_loader_func_name {
            w.extend(["--data-loader-func-name".into(), f.clone()]);
        }
        w
    }

    /// What decides the input sets, for debug replays' settings.
    pub fn replay_setting(&self) -> String {
        let paths = self
            .load_inputs
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ");
        format!(
            "val-range [{}] seed {:?} iterations {:?} input-shapes [{}] opt-shapes [{}] load-inputs [{}] data-loader-script {}",
            self.val_range.join(" "),
            self.seed,
            self.iterations,
            self.input_shapes.join(" "),
            self.opt_shapes.join(" "),
            paths,
            self.data_loader_script.as_deref().unwrap_or("-")
        )
    }
}

/// Where a job's input sets come from.
#[derive(Clone, Debug)]
pub enum Inputs {
    /// Generated, loaded from files or from a data-loader script (the CLI's data options).
    Options(DataOptions),
    /// Given in memory (the Python API's `inputs`).
    Feeds(Vec<Feeds>),
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs::Options(DataOptions::default())
    }
}

impl Inputs {
    /// The input sets; in-memory ones are checked against the model's inputs (names, types,
    /// shapes), and there must be at least one.
    pub fn feeds(&self, graph: &Graph, events: &mut dyn FnMut(Event)) -> Result<Vec<Feeds>> {
        let feeds = self.sets(graph, events)?;
        if feeds.is_empty() {
            return Err(Error::Invalid("inputs: no input set was given".into()));
        }
        Ok(feeds)
    }

    /// The input sets as [`feeds`](Self::feeds) gives them, possibly none (`--iterations 0`:
    /// a run that only compares saved results).
    pub fn sets(&self, graph: &Graph, events: &mut dyn FnMut(Event)) -> Result<Vec<Feeds>> {
        let sets = self.given(graph, events)?;
        self.check(graph, &sets)?;
        Ok(sets)
    }

    /// The input sets as given, before in-memory ones are checked ([`check`](Self::check)).
    pub fn given(&self, graph: &Graph, events: &mut dyn FnMut(Event)) -> Result<Vec<Feeds>> {
        Ok(match self {
            Inputs::Options(d) => d.feeds(graph, events)?,
            Inputs::Feeds(f) => f.clone(),
        })
    }

    /// Checks in-memory feeds against the model's inputs (names, types, shapes); loaded and
    /// generated sets were made for them.
    pub fn check(&self, graph: &Graph, feeds: &[Feeds]) -> Result<()> {
        if let Inputs::Feeds(_) = self {
            for feed in feeds {
                crate::data::script::validate_feed(&graph.inputs, feed)?;
            }
        }
        Ok(())
    }

    /// The feeds of each input set's first run, at least one: the set itself, or under
    /// `--decode` its prompt completed by `decoder` (mask, positions, empty KV cache). In-memory
    /// sets are checked once completed, so a prompt needs only its `input_ids`.
    pub fn first_runs(
        &self,
        graph: &Graph,
        decoder: Option<&Decoder>,
        events: &mut dyn FnMut(Event),
    ) -> Result<Vec<Feeds>> {
        let sets = self.given(graph, events)?;
        if sets.is_empty() {
            return Err(Error::Invalid("inputs: no input set was given".into()));
        }
        let runs = match decoder {
            Some(d) => sets
                .iter()
                .map(|s| d.first_feeds(s))
                .collect::<Result<Vec<_>>>()?,
            None => sets,
        };
        self.check(graph, &runs)?;
        Ok(runs)
    }

    /// The shapes `--input-shapes` and `--trt-opt-shapes` set (none for in-memory inputs).
    pub fn shape_overrides(&self) -> Result<BTreeMap<String, Vec<usize>>> {
        match self {
            Inputs::Options(d) => d.shape_overrides(),
            Inputs::Feeds(_) => Ok(BTreeMap::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_flags_repeat_the_cache_or_the_algorithm_and_the_inputs() {
        let data = DataOptions {
            val_range: vec!["x:[0,2]".into()],
            seed: Some(7),
            iterations: Some(3),
            ..Default::default()
        };
        let mut p = PrecisionOptions {
            int8: true,
            calib: CalibOptions {
                calibration_algo: Some("minmax".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            p.calibration_flags(Some(&data)).join(" "),
            "--calibration-algo minmax --val-range x:[0,2] --seed 7 --iterations 3"
        );
        p.calibration_cache = Some("c.cache".into());
        assert_eq!(
            p.calibration_flags(Some(&data)).join(" "),
            "--calibration-cache c.cache"
        );
        assert_eq!(p.flags(), "--int8 --calibration-cache c.cache");
        assert_eq!(p.trtexec_flags(), "--int8 --calib=c.cache");
    }

    #[test]
    fn a_bad_tolerance_names_its_flag() {
        let c = CompareOptions {
            atol: vec!["out:abc".into()],
            ..Default::default()
        };
        let e = c.criterion().unwrap_err().to_string();
        assert!(e.contains("--atol") && e.contains("abc"), "{e}");
    }
}
