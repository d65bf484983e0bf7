//! `mixprec._native`: the mixprec library's jobs for Python. Arrays cross as numpy arrays,
//! a criterion is a Python callable called with the GIL held, the GIL is released while the
//! library works, and no Rust panic crosses into Python. The Pythonic API (defaults, input
//! forms, tqdm, `SearchResult`) is `python/mixprec/__init__.py`.

/// The allocator the `mixprec` binary runs with (crates/cli/src/main.rs says why): the
/// library's buffers in this module come from it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use mixprec::error::Error;
use mixprec::event::{Event, NoProgress};
use mixprec::golden::Outputs;
use mixprec::jobs::calibrate as calibrate_job;
use mixprec::jobs::convert as convert_job;
use mixprec::jobs::debug_precision::{
    self as dp, CheckOptions, Config, GoldenSource, Hooks, Outcome,
};
use mixprec::jobs::options::{CalibOptions, CompareOptions, DataOptions, Inputs, PrecisionOptions};
use mixprec::jobs::plan as plan_job;
use mixprec::jobs::plan_worker::{
    worker_config as plan_worker_config, PlanWorker as PlanJobWorker,
};
use mixprec::jobs::quantize as quantize_job;
use mixprec::jobs::run as run_job;
use mixprec::jobs::search_worker::{worker_config, Worker as SearchWorker};
use mixprec::precision::Precision;
use mixprec::search::builtin::UserCriterion;
use mixprec::search::check::{Candidate as CheckCandidate, UserCheck};
use mixprec::search::driver::SearchHooks;
use mixprec::search::remote::{
    MarkedSet, PlanPoint, PlanWorkers, Remote, RemoteJudge, RemotePlanWorkers,
};
use mixprec::search::{
    Direction, Evaluation, Grouping, Mode, Objective, Ranking, SearchSpace, Trial,
};
use mixprec::tensor::{Buf, Feeds, Tensor, TensorData};
use numpy::{
    PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{
    PyFileNotFoundError, PyKeyboardInterrupt, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A library error as the Python exception a user expects: a missing file is
/// `FileNotFoundError`, a bad input or option `ValueError`.
fn to_py(e: Error) -> PyErr {
    match &e {
        Error::Io { cause, .. } if cause.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(e.to_string())
        }
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// Runs `f` and turns a panic into a `RuntimeError` (none may unwind into Python).
fn guarded<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(PyRuntimeError::new_err(format!(
                "mixprec {what}: internal error (a bug, please report it): {msg}"
            )))
        }
    }
}

/// A numpy array as a tensor (its elements copied: the library keeps its own buffers).
fn to_tensor(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let arr = obj.cast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!(
            "input '{name}': expected a numpy array, got {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    let shape = arr.shape().to_vec();
    macro_rules! take {
        ($t:ty, $variant:ident) => {{
            let a = obj.cast::<PyArrayDyn<$t>>()?.readonly();
            let v: Vec<$t> = a.as_array().iter().copied().collect();
            TensorData::$variant(Buf::from_vec(v))
        }};
    }
    let dt = arr.dtype();
    let py = obj.py();
    let data = if dt.is_equiv_to(&numpy::dtype::<f32>(py)) {
        take!(f32, F32)
    } else if dt.is_equiv_to(&numpy::dtype::<f64>(py)) {
        take!(f64, F64)
    } else if dt.is_equiv_to(&numpy::dtype::<half::f16>(py)) {
        take!(half::f16, F16)
    } else if dt.is_equiv_to(&numpy::dtype::<i64>(py)) {
        take!(i64, I64)
    } else if dt.is_equiv_to(&numpy::dtype::<i32>(py)) {
        take!(i32, I32)
    } else if dt.is_equiv_to(&numpy::dtype::<i16>(py)) {
        take!(i16, I16)
    } else if dt.is_equiv_to(&numpy::dtype::<i8>(py)) {
        take!(i8, I8)
    } else if dt.is_equiv_to(&numpy::dtype::<u64>(py)) {
        take!(u64, U64)
    } else if dt.is_equiv_to(&numpy::dtype::<u32>(py)) {
        take!(u32, U32)
    } else if dt.is_equiv_to(&numpy::dtype::<u16>(py)) {
        take!(u16, U16)
    } else if dt.is_equiv_to(&numpy::dtype::<u8>(py)) {
        take!(u8, U8)
    } else if dt.is_equiv_to(&numpy::dtype::<bool>(py)) {
        take!(bool, Bool)
    } else {
        return Err(PyValueError::new_err(format!(
            "input '{name}': numpy dtype {dt} is not supported (use float32, float64, float16, an integer type or bool)"
        )));
    };
    Tensor::new(shape, data).map_err(|e| PyValueError::new_err(format!("input '{name}': {e}")))
}

/// A tensor as a numpy array: the buffer moves into numpy without a copy when the tensor owns
/// it; types numpy lacks (bfloat16, float8, int4, float4) arrive as float32.
fn to_numpy(py: Python<'_>, t: Tensor) -> PyResult<Py<PyAny>> {
    let (shape, data) = t.into_parts();
    macro_rules! give {
        ($v:expr) => {{
            let a = numpy::PyArray1::from_vec(py, $v.into_vec());
            Ok(a.reshape(shape)?.into_any().unbind())
        }};
    }
    match data {
        TensorData::F32(v) => give!(v),
        TensorData::F64(v) => give!(v),
        TensorData::F16(v) => give!(v),
        TensorData::I8(v) => give!(v),
        TensorData::U8(v) => give!(v),
        TensorData::I16(v) => give!(v),
        TensorData::U16(v) => give!(v),
        TensorData::I32(v) => give!(v),
        TensorData::U32(v) => give!(v),
        TensorData::I64(v) => give!(v),
        TensorData::U64(v) => give!(v),
        TensorData::Bool(v) => give!(v),
        TensorData::Str(v) => Ok(PyList::new(py, v.into_vec())?.into_any().unbind()),
        other => match other.to_f32_vec() {
            Some(v) => give!(Buf::from_vec(v)),
            None => Err(PyValueError::new_err("an output of unsupported type")),
        },
    }
}

fn outputs_to_py(py: Python<'_>, outputs: Outputs) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    for (name, t) in outputs {
        d.set_item(name, to_numpy(py, t)?)?;
    }
    Ok(d.unbind())
}

fn borrowed_outputs_to_py(py: Python<'_>, outputs: &Outputs) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    for (name, t) in outputs {
        d.set_item(name, to_numpy(py, t.clone())?)?;
    }
    Ok(d.unbind())
}

/// A list of `{name: array}` dicts as input sets (or outputs).
fn to_sets(sets: &Bound<'_, PyList>) -> PyResult<Vec<Feeds>> {
    let mut out = Vec::with_capacity(sets.len());
    for (k, item) in sets.iter().enumerate() {
        let d = item.cast::<PyDict>().map_err(|_| {
            PyTypeError::new_err(format!(
                "input set {k}: expected a dict of {{name: numpy array}}"
            ))
        })?;
        let mut feeds = Feeds::new();
        for (name, value) in d.iter() {
            let name: String = name.extract()?;
            let t = to_tensor(&name, &value)?;
            feeds.insert(name, t);
        }
        out.push(feeds);
    }
    Ok(out)
}

fn parse_mode(s: &str) -> PyResult<Mode> {
    Ok(match s {
        "bisect" => Mode::Bisect,
        "linear" => Mode::Linear,
        "worst-first" | "worst_first" => Mode::WorstFirst,
        "minimal" => Mode::Minimal,
        _ => {
            return Err(PyValueError::new_err(format!(
                "mode '{s}': expected bisect, linear, worst-first or minimal"
            )))
        }
    })
}

fn parse_direction(s: &str) -> PyResult<Direction> {
    match s {
        "forward" => Ok(Direction::Forward),
        "reverse" => Ok(Direction::Reverse),
        _ => Err(PyValueError::new_err(format!(
            "direction '{s}': expected forward or reverse"
        ))),
    }
}

fn parse_objective(s: &str) -> PyResult<Objective> {
    match s {
        "layers" => Ok(Objective::Layers),
        "flops" => Ok(Objective::Flops),
        _ => Err(PyValueError::new_err(format!(
            "objective '{s}': expected layers or flops"
        ))),
    }
}

fn parse_ranking(s: &str) -> PyResult<Ranking> {
    match s {
        "sensitivity" => Ok(Ranking::Sensitivity),
        "growth" => Ok(Ranking::Growth),
        _ => Err(PyValueError::new_err(format!(
            "ranking '{s}': expected sensitivity or growth"
        ))),
    }
}

/// The precision options from the Python keywords (`precision` the low precisions, e.g.
/// `["int8", "float16"]`).
fn precision_options(
    low: &[String],
    layer_precisions: Vec<String>,
    fusion: String,
    calibration_cache: Option<PathBuf>,
    calibration_algo: Option<String>,
) -> PyResult<PrecisionOptions> {
    let mut p = PrecisionOptions {
        layer_precisions,
        fusion,
        calibration_cache,
        calib: CalibOptions {
            calibration_algo,
            ..Default::default()
        },
        ..Default::default()
    };
    for l in low {
        match l.as_str() {
            "float16" | "fp16" => p.fp16 = true,
            "bfloat16" | "bf16" => p.bf16 = true,
            "int8" => p.int8 = true,
            "fp8" | "float8" | "fp8e4m3" => p.fp8 = true,
            "float32" | "fp32" => {}
            other => {
                return Err(PyValueError::new_err(format!(
                    "precision '{other}': expected float16, bfloat16, int8 or fp8"
                )))
            }
        }
    }
    Ok(p)
}

/// Where the inputs come from: in memory, or the CLI's data options.
fn inputs_from(
    inputs: Option<&Bound<'_, PyList>>,
    load_inputs: Vec<PathBuf>,
    seed: Option<u64>,
    iterations: Option<usize>,
    val_range: Vec<String>,
    input_shapes: Vec<String>,
    data_loader_script: Option<String>,
) -> PyResult<Inputs> {
    Ok(match inputs {
        Some(l) => Inputs::Feeds(to_sets(l)?),
        None => Inputs::Options(DataOptions {
            val_range,
            seed,
            iterations,
            input_shapes,
            load_inputs,
            data_loader_script,
            ..Default::default()
        }),
    })
}

/// The job's reports turned into Python calls: trials to `progress`, notes to `on_event`,
/// and Ctrl-C noticed between evaluations (Python only sees signals when it runs).
struct PyHooks {
    progress: Option<Py<PyAny>>,
    on_event: Option<Py<PyAny>>,
    stop: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
    /// The first exception a callback raised (it stops the search).
    failed: Arc<Mutex<Option<PyErr>>>,
    candidates: usize,
}

impl PyHooks {
    fn call(
        &self,
        f: &Option<Py<PyAny>>,
        args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
    ) {
        Python::attach(|py| {
            if let Some(f) = f {
                // The arguments as positional ones: `progress(dict)`, `on_event(kind, text)`.
                let called = args(py).and_then(|a| f.bind(py).call1(a));
                if let Err(e) = called {
                    // Ctrl-C while the callback ran is Ctrl-C; any other exception stops the
                    // search and reaches the caller.
                    if e.is_instance_of::<PyKeyboardInterrupt>(py) {
                        self.interrupted.store(true, Ordering::SeqCst);
                    } else {
                        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
                        failed.get_or_insert(e);
                    }
                    self.stop.store(true, Ordering::SeqCst);
                }
            }
            if py.check_signals().is_err() {
                self.interrupted.store(true, Ordering::SeqCst);
                self.stop.store(true, Ordering::SeqCst);
            }
        });
    }

    fn emit(&self, kind: &str, text: String) {
        let kind = kind.to_string();
        self.call(&self.on_event, move |py| (kind, text).into_pyobject(py));
    }
}

impl SearchHooks for PyHooks {
    fn event(&mut self, e: Event) {
        match e {
            Event::Warning(w) => self.emit("warning", w),
            Event::Info(i) => self.emit("info", i),
            Event::Verbose(v) => self.emit("verbose", v),
            Event::Output(o) => self.emit("output", o),
        }
    }
    fn started(&mut self, space: &SearchSpace) {
        self.candidates = space.candidates.len();
    }
    fn trial(&mut self, _space: &SearchSpace, t: &Trial) {
        let (iteration, phase, marked, passed, error, summary, candidates) = (
            t.iteration,
            t.phase,
            t.marked.len(),
            t.passed,
            t.error,
            t.summary.clone(),
            self.candidates,
        );
        self.call(&self.progress, move |py| {
            let d = PyDict::new(py);
            d.set_item("iteration", iteration)?;
            d.set_item("phase", phase)?;
            d.set_item("marked", marked)?;
            d.set_item("candidates", candidates)?;
            d.set_item("passed", passed)?;
            d.set_item("error", error)?;
            d.set_item("summary", summary)?;
            PyTuple::new(py, [d])
        });
    }
    fn log(&mut self, line: String) {
        self.emit("info", line);
    }
}

impl Hooks for PyHooks {}

/// What a finished `debug_precision` holds: the library's outcome.
#[pyclass(module = "mixprec._native", name = "Search", frozen)]
struct Search {
    outcome: Outcome,
    interrupted: bool,
}

#[pymethods]
impl Search {
    /// The `--save-result` JSON (`written`: where the answer's model was written, if it was).
    #[pyo3(signature = (written=None))]
    fn result_json(&self, written: Option<String>) -> PyResult<String> {
        let bytes = self
            .outcome
            .result_json(written.as_deref())
            .map_err(to_py)?;
        String::from_utf8(bytes).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The answer's model as serialized ONNX bytes; None without an answer.
    fn export<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let exported = py.detach(|| self.outcome.export()).map_err(to_py)?;
        Ok(match exported {
            Some(e) => Some(PyBytes::new(py, &mixprec::export::model_bytes(&e.model))),
            None => None,
        })
    }

    /// The exporter's notes on the answer's model.
    fn export_notes(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let exported = py.detach(|| self.outcome.export()).map_err(to_py)?;
        Ok(exported.map(|e| e.notes).unwrap_or_default())
    }

    /// The HTML report.
    fn html(&self) -> String {
        self.outcome.html().render()
    }

    /// Whether Ctrl-C stopped the search.
    #[getter]
    fn interrupted(&self) -> bool {
        self.interrupted
    }
}

/// `debug precision` in process. See `mixprec.debug_precision` for the arguments.
#[pyfunction]
#[pyo3(signature = (
    model, *, low, higher_precision, mode, direction, objective, ranking, jobs, group,
    inputs, load_inputs, seed, iterations, val_range, input_shapes, data_loader_script,
    golden, golden_path, criterion, atol, rtol, check_error_stat, error_quantile, metrics,
    layer_precisions, fusion, calibration_cache, calibration_algo, cache_budget,
    check, check_timeout, load_debug_replay, save_debug_replay, layer_errors, decode,
    progress, on_event, check_function=None, remote=None, as_worker=false
))]
#[allow(clippy::too_many_arguments)]
fn debug_precision(
    py: Python<'_>,
    model: PathBuf,
    low: Vec<String>,
    higher_precision: String,
    mode: &str,
    direction: &str,
    objective: &str,
    ranking: Option<&str>,
    jobs: usize,
    group: &str,
    inputs: Option<Bound<'_, PyList>>,
    load_inputs: Vec<PathBuf>,
    seed: Option<u64>,
    iterations: Option<usize>,
    val_range: Vec<String>,
    input_shapes: Vec<String>,
    data_loader_script: Option<String>,
    golden: Option<Bound<'_, PyList>>,
    golden_path: Option<PathBuf>,
    criterion: Option<Py<PyAny>>,
    atol: Vec<String>,
    rtol: Vec<String>,
    check_error_stat: Vec<String>,
    error_quantile: Vec<String>,
    metrics: Vec<String>,
    layer_precisions: Vec<String>,
    fusion: String,
    calibration_cache: Option<PathBuf>,
    calibration_algo: Option<String>,
    cache_budget: String,
    check: Vec<String>,
    check_timeout: Option<f64>,
    load_debug_replay: Option<PathBuf>,
    save_debug_replay: Option<PathBuf>,
    layer_errors: bool,
    decode: Option<usize>,
    progress: Option<Py<PyAny>>,
    on_event: Option<Py<PyAny>>,
    check_function: Option<Py<PyAny>>,
    remote: Option<Py<PyAny>>,
    as_worker: bool,
) -> PyResult<Py<PyAny>> {
    let golden = golden_source(golden, golden_path)?;
    // The criterion's exception, kept to be raised as itself once the search has stopped.
    let raised: Arc<Mutex<Option<PyErr>>> = Arc::default();
    let user_criterion = criterion.map(|f| user_criterion(f, raised.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    let remote_errors: Arc<Mutex<Vec<PyErr>>> = Arc::default();
    let remote = remote.map(|dispatch| {
        RemoteJudge(Arc::new(PyRemote {
            dispatch,
            errors: remote_errors.clone(),
            stop: stop.clone(),
            interrupted: interrupted.clone(),
        }))
    });
    let config = Config {
        model,
        inputs: inputs_from(
            inputs.as_ref(),
            load_inputs,
            seed,
            iterations,
            val_range,
            input_shapes,
            data_loader_script,
        )?,
        precision: precision_options(
            &low,
            layer_precisions,
            fusion,
            calibration_cache,
            calibration_algo,
        )?,
        higher_precision,
        mode: parse_mode(mode)?,
        direction: parse_direction(direction)?,
        objective: parse_objective(objective)?,
        ranking: ranking.map(parse_ranking).transpose()?,
        jobs,
        group: Grouping::parse(group).map_err(to_py)?,
        golden,
        compare: CompareOptions {
            atol,
            rtol,
            check_error_stat,
            error_quantile,
            metric: metrics,
        },
        user_criterion,
        cache_budget,
        check: check_options(check, check_timeout, check_function, &raised),
        load_debug_replay,
        save_debug_replay,
        layer_errors,
        verbose: false,
        decode,
        remote,
    };
    if as_worker {
        let validated = worker_config(config).validate().map_err(to_py)?;
        let inner = guarded("debug_precision worker", || {
            py.detach(|| SearchWorker::start(validated)).map_err(to_py)
        });
        if let Some(e) = raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        let worker = Worker {
            inner: inner?,
            raised,
        };
        return Ok(Py::new(py, worker)?.into_any());
    }
    let validated = config.validate().map_err(to_py)?;
    let failed: Arc<Mutex<Option<PyErr>>> = Arc::default();
    let mut hooks = PyHooks {
        progress,
        on_event,
        stop: stop.clone(),
        interrupted: interrupted.clone(),
        failed: failed.clone(),
        candidates: 0,
    };
    let result = guarded("debug_precision", || {
        py.detach(|| dp::run(validated, &mut hooks, &stop))
            .map_err(to_py)
    });
    for slot in [&raised, &failed] {
        if let Some(e) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
    }
    let outcome = match result {
        Ok(o) => o,
        Err(e) => return Err(remote_error(py, e, &remote_errors)),
    };
    Ok(Py::new(
        py,
        Search {
            outcome,
            interrupted: interrupted.load(Ordering::SeqCst),
        },
    )?
    .into_any())
}

/// Golden outputs given in memory (one dict of arrays per input set) or as a file.
fn golden_source(
    golden: Option<Bound<'_, PyList>>,
    golden_path: Option<PathBuf>,
) -> PyResult<Option<GoldenSource>> {
    Ok(match (golden, golden_path) {
        (Some(g), _) => Some(GoldenSource::Outputs(
            to_sets(&g)?
                .into_iter()
                .map(|m| m.into_iter().collect())
                .collect(),
        )),
        (None, Some(p)) => Some(GoldenSource::File(p)),
        (None, None) => None,
    })
}

/// A Python criterion `f(outputs, golden) -> bool` as the library's; an exception it raises is
/// kept in `raised`, to be raised as itself once the job has stopped.
fn user_criterion(f: Py<PyAny>, raised: Arc<Mutex<Option<PyErr>>>) -> UserCriterion {
    let calls = Arc::new(AtomicUsize::new(0));
    UserCriterion(Arc::new(
        move |outputs: Vec<Outputs>, golden: &[&Outputs]| {
            let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
            Python::attach(|py| {
                let judged = (|| -> PyResult<bool> {
                    let outs = PyList::empty(py);
                    for o in outputs {
                        outs.append(outputs_to_py(py, o)?)?;
                    }
                    let gold = PyList::empty(py);
                    for g in golden {
                        gold.append(borrowed_outputs_to_py(py, g)?)?;
                    }
                    as_verdict(&f.bind(py).call1((outs, gold))?, "criterion")
                })();
                judged.map_err(|e| {
                let note = format!(
                    "raised by the criterion on its call {call} (judging a candidate plan of the search)"
                );
                let _ = e.value(py).call_method1("add_note", (note.clone(),));
                *raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                Error::Invalid(format!("criterion: {note}"))
            })
            })
        },
    ))
}

/// A callback's answer as a verdict: a bool (numpy's too), else the `TypeError` that names
/// what `who` returned.
fn as_verdict(verdict: &Bound<'_, PyAny>, who: &str) -> PyResult<bool> {
    if let Ok(b) = verdict.cast::<pyo3::types::PyBool>() {
        return Ok(b.is_true());
    }
    // numpy's bool scalar (what `np.all(...)` returns) is a bool too.
    if verdict.is_instance(&verdict.py().import("numpy")?.getattr("bool_")?)? {
        return verdict.is_truthy();
    }
    Err(PyTypeError::new_err(format!(
        "the {who} returned {} ({}), not a bool",
        verdict.repr()?,
        verdict.get_type().name()?
    )))
}

/// The check as the library takes it: the command (`--check` and its timeout), or a Python
/// function, whose exception is kept in `raised`. Both at once, or a timeout with a
/// function, is refused by the job's validation.
fn check_options(
    command: Vec<String>,
    timeout: Option<f64>,
    function: Option<Py<PyAny>>,
    raised: &Arc<Mutex<Option<PyErr>>>,
) -> Option<CheckOptions> {
    if command.is_empty() && function.is_none() {
        return None;
    }
    Some(CheckOptions {
        command,
        user: function.map(|f| user_check(f, raised.clone())),
        timeout,
        artifacts_dir: "polygraphy_artifacts".into(),
        ..Default::default()
    })
}

/// A Python check `f(candidate) -> bool` as the library's: `candidate` a [`Candidate`]; an
/// exception it raises is kept in `raised`, to be raised as itself once the job has stopped.
fn user_check(f: Py<PyAny>, raised: Arc<Mutex<Option<PyErr>>>) -> UserCheck {
    UserCheck(Arc::new(move |candidate: &CheckCandidate| {
        Python::attach(|py| {
            let iteration = candidate.iteration;
            let judged = (|| -> PyResult<bool> {
                let c = Py::new(
                    py,
                    Candidate {
                        inner: candidate.clone(),
                    },
                )?;
                as_verdict(&f.bind(py).call1((c,))?, "check")
            })();
            judged.map_err(|e| {
                let note = format!("raised by the check on candidate {iteration}");
                let _ = e.value(py).call_method1("add_note", (note.clone(),));
                *raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                Error::Invalid(format!("check: {note}"))
            })
        })
    }))
}

/// A candidate as a `check` function is given it: its model (written with `export`), the
/// precision of every layer the search decides, the layers in the high precision.
#[pyclass(module = "mixprec._native", name = "Candidate", frozen)]
struct Candidate {
    inner: CheckCandidate,
}

#[pymethods]
impl Candidate {
    /// 1-based count of the candidates judged by this check (the command's `{iteration}`;
    /// on a worker, that worker's count).
    #[getter]
    fn iteration(&self) -> usize {
        self.inner.iteration
    }

    /// The names of the layers in the high precision.
    #[getter]
    fn marked(&self) -> Vec<String> {
        self.inner.marked.clone()
    }

    /// Layer name to precision name for every layer the search decides.
    #[getter]
    fn layer_precisions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, p) in &self.inner.layer_precisions {
            d.set_item(name, p)?;
        }
        Ok(d)
    }

    /// Writes the candidate's strongly typed mixed-precision model to `path` (what a
    /// command's `{model}` is), all or nothing; returns `path`.
    fn export<'py>(&self, py: Python<'py>, path: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let file: PathBuf = path.extract()?;
        py.detach(|| self.inner.export(&file)).map_err(to_py)?;
        Ok(path)
    }

    /// The candidate's model as serialized ONNX bytes.
    fn model_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = py.detach(|| self.inner.model_bytes()).map_err(to_py)?;
        Ok(PyBytes::new(py, &bytes))
    }

    fn __repr__(&self) -> String {
        format!(
            "Candidate(iteration={}, {} of {} layer(s) in the high precision)",
            self.inner.iteration,
            self.inner.marked.len(),
            self.inner.layer_precisions.len()
        )
    }
}

/// The words that tie a library error to the exception a worker raised.
const RAISED_ON_A_WORKER: &str = "raised on a worker; exception #";

/// The exception a search that failed on a worker's verdict raises: the one the worker raised
/// (the criterion's, as itself), `mixprec.WorkerLostError` when the candidate's workers kept
/// dying, else the library error as usual.
fn remote_error(py: Python<'_>, e: PyErr, errors: &Mutex<Vec<PyErr>>) -> PyErr {
    let msg = e.value(py).to_string();
    let mut errors = errors.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(at) = msg.find(RAISED_ON_A_WORKER) {
        let digits: String = msg[at + RAISED_ON_A_WORKER.len()..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        if let Some(k) = digits.parse::<usize>().ok().filter(|&k| k < errors.len()) {
            let raised = errors.swap_remove(k);
            let _ = raised
                .value(py)
                .call_method1("add_note", (format!("mixprec: {msg}"),));
            return raised;
        }
    }
    if msg.contains(WORKER_LOST) {
        if let Ok(class) = py
            .import("mixprec._scale")
            .and_then(|m| m.getattr("WorkerLostError"))
        {
            if let Ok(v) = class.call1((msg,)) {
                return PyErr::from_value(v);
            }
        }
    }
    e
}

/// What python/mixprec/_scale.py's lost candidates say (`WorkerLostError`).
const WORKER_LOST: &str = "worker(s) died evaluating it";

/// The driver's side of `executor=`: each batch goes to the Python dispatcher
/// (`mixprec._scale`), which hands its sets to the executor's workers and returns one entry
/// per set, in order: `(passed, error, summary)`, or the exception its evaluation raised
/// (a criterion's, or `WorkerLostError`).
struct PyRemote {
    dispatch: Py<PyAny>,
    /// Exceptions raised on workers, raised as themselves if the search ends on one.
    errors: Arc<Mutex<Vec<PyErr>>>,
    stop: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
}

impl PyRemote {
    fn keep(&self, e: PyErr, py: Python<'_>) -> Error {
        let text = e.value(py).to_string();
        let kind = e
            .get_type(py)
            .name()
            .map_or_else(|_| "Exception".into(), |n| n.to_string());
        if kind == "WorkerLostError" {
            return Error::Invalid(text);
        }
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        errors.push(e);
        Error::Invalid(format!(
            "{kind}: {text} ({RAISED_ON_A_WORKER}{})",
            errors.len() - 1
        ))
    }
}

impl PyRemote {
    fn verdict(&self, entry: Bound<'_, PyAny>) -> mixprec::error::Result<Evaluation> {
        if entry.is_instance_of::<pyo3::exceptions::PyBaseException>() {
            return Err(self.keep(PyErr::from_value(entry.clone()), entry.py()));
        }
        let (passed, error, summary) = entry
            .extract::<(bool, f64, String)>()
            .map_err(|e| Error::Invalid(format!("executor: a verdict {e}")))?;
        Ok(Evaluation {
            passed,
            error,
            summary,
        })
    }
}

impl Remote<MarkedSet> for PyRemote {
    /// A marked set travels as a list of node indices.
    fn evaluate_batch(
        &self,
        sets: &[MarkedSet],
        done: &mut dyn FnMut(usize, &mixprec::error::Result<Evaluation>),
    ) -> Vec<mixprec::error::Result<Evaluation>> {
        self.dispatched(sets.to_vec(), done)
    }
}

/// A plan point as it travels to a worker: `(layers, uncached, check)`.
type TravellingPoint<'a> = (Vec<(usize, &'a str)>, bool, bool);

impl Remote<PlanPoint> for PyRemote {
    /// A plan point travels as `([(node index, precision name), ...], uncached, check)`.
    fn evaluate_batch(
        &self,
        points: &[PlanPoint],
        done: &mut dyn FnMut(usize, &mixprec::error::Result<Evaluation>),
    ) -> Vec<mixprec::error::Result<Evaluation>> {
        let points: Vec<TravellingPoint<'_>> = points
            .iter()
            .map(|p| {
                (
                    p.layers.iter().map(|&(i, q)| (i, q.name())).collect(),
                    p.uncached,
                    p.check,
                )
            })
            .collect();
        self.dispatched(points, done)
    }
}

impl PyRemote {
    /// Hands `candidates` to the dispatcher, which yields `(position, entry)` as each
    /// finishes; one result per candidate, in order.
    fn dispatched<C>(
        &self,
        candidates: Vec<C>,
        done: &mut dyn FnMut(usize, &mixprec::error::Result<Evaluation>),
    ) -> Vec<mixprec::error::Result<Evaluation>>
    where
        for<'py> C: IntoPyObject<'py>,
    {
        let n = candidates.len();
        Python::attach(|py| {
            let mut out: Vec<Option<mixprec::error::Result<Evaluation>>> =
                (0..n).map(|_| None).collect();
            let mut failure: Option<String> = None;
            let answered = self
                .dispatch
                .bind(py)
                .call1((candidates,))
                .and_then(|r| r.try_iter());
            match answered {
                Err(e) => failure = Some(self.failed(e, py)),
                Ok(items) => {
                    for item in items {
                        let item = item.and_then(|i| i.extract::<(usize, Bound<'_, PyAny>)>());
                        match item {
                            Ok((k, entry)) if k < out.len() => {
                                let r = self.verdict(entry);
                                done(k, &r);
                                out[k] = Some(r);
                            }
                            Ok((k, _)) => {
                                failure = Some(format!(
                                    "executor: a verdict for candidate {k} of a batch of {n}"
                                ));
                                break;
                            }
                            Err(e) => {
                                failure = Some(self.failed(e, py));
                                break;
                            }
                        }
                    }
                }
            }
            out.into_iter()
                .map(|r| {
                    r.unwrap_or_else(|| {
                        Err(Error::Invalid(
                            failure
                                .clone()
                                .unwrap_or_else(|| "executor: no verdict came back".into()),
                        ))
                    })
                })
                .collect()
        })
    }
}

impl PyRemote {
    /// The dispatcher itself raised: Ctrl-C stops the search (its batch is not taken); any
    /// other exception is kept to be raised as itself.
    fn failed(&self, e: PyErr, py: Python<'_>) -> String {
        if e.is_instance_of::<PyKeyboardInterrupt>(py) {
            self.interrupted.store(true, Ordering::SeqCst);
            self.stop.store(true, Ordering::SeqCst);
            return "interrupted".into();
        }
        self.keep(e, py).to_string()
    }
}

/// One worker of a search judged elsewhere (`executor=`): the model, inputs, golden outputs,
/// plans and value cache of the search, prepared once; `evaluate` judges a marked set.
#[pyclass(module = "mixprec._native", name = "Worker", frozen)]
struct Worker {
    inner: SearchWorker,
    /// The criterion's exception, raised as itself.
    raised: Arc<Mutex<Option<PyErr>>>,
}

#[pymethods]
impl Worker {
    /// The verdict on `marked` (node indices): (passed, error, summary).
    fn evaluate(&self, py: Python<'_>, marked: Vec<usize>) -> PyResult<(bool, f64, String)> {
        let verdict = guarded("debug_precision worker", || {
            Ok(py.detach(|| self.inner.evaluate_batch(vec![marked])).pop())
        })?;
        if let Some(e) = self.raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        match verdict {
            Some(Ok(e)) => Ok((e.passed, e.error, e.summary)),
            Some(Err(e)) => Err(to_py(e)),
            None => Err(PyRuntimeError::new_err("mixprec worker: no verdict")),
        }
    }
}

/// Runs a model; one dict of outputs per input set.
#[pyfunction]
#[pyo3(signature = (
    model, *, inputs, load_inputs, seed, iterations, val_range, input_shapes,
    data_loader_script, low, layer_precisions, fusion, calibration_cache, calibration_algo,
    mark_all, decode
))]
#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    model: PathBuf,
    inputs: Option<Bound<'_, PyList>>,
    load_inputs: Vec<PathBuf>,
    seed: Option<u64>,
    iterations: Option<usize>,
    val_range: Vec<String>,
    input_shapes: Vec<String>,
    data_loader_script: Option<String>,
    low: Vec<String>,
    layer_precisions: Vec<String>,
    fusion: String,
    calibration_cache: Option<PathBuf>,
    calibration_algo: Option<String>,
    mark_all: bool,
    decode: Option<usize>,
) -> PyResult<Vec<Py<PyDict>>> {
    let inputs = inputs_from(
        inputs.as_ref(),
        load_inputs,
        seed,
        iterations,
        val_range,
        input_shapes,
        data_loader_script,
    )?;
    let precision = precision_options(
        &low,
        layer_precisions,
        fusion,
        calibration_cache,
        calibration_algo,
    )?;
    let mut events = Vec::new();
    let outputs = guarded("run", || {
        py.detach(|| {
            run_job::outputs(
                &model,
                &inputs,
                &precision,
                mark_all,
                decode,
                &mut |e| events.push(e),
                &NoProgress,
            )
        })
        .map_err(to_py)
    })?;
    warn_events(py, events)?;
    outputs.into_iter().map(|o| outputs_to_py(py, o)).collect()
}

/// `convert` in process: the model with `precision` written as Casts and Q/DQ; returns
/// (the ONNX bytes, the exporter's notes).
#[pyfunction]
#[pyo3(signature = (
    model, *, low, layer_precisions, fusion, calibration_cache, calibration_algo,
    inputs, load_inputs, seed, iterations, val_range, input_shapes, data_loader_script,
    keep_io_types, fallback
))]
#[allow(clippy::too_many_arguments)]
fn convert<'py>(
    py: Python<'py>,
    model: PathBuf,
    low: Vec<String>,
    layer_precisions: Vec<String>,
    fusion: String,
    calibration_cache: Option<PathBuf>,
    calibration_algo: Option<String>,
    inputs: Option<Bound<'py, PyList>>,
    load_inputs: Vec<PathBuf>,
    seed: Option<u64>,
    iterations: Option<usize>,
    val_range: Vec<String>,
    input_shapes: Vec<String>,
    data_loader_script: Option<String>,
    keep_io_types: bool,
    fallback: bool,
) -> PyResult<(Bound<'py, PyBytes>, Vec<String>)> {
    let config = convert_job::Config {
        model,
        precision: precision_options(
            &low,
            layer_precisions,
            fusion,
            calibration_cache,
            calibration_algo,
        )?,
        inputs: inputs_from(
            inputs.as_ref(),
            load_inputs,
            seed,
            iterations,
            val_range,
            input_shapes,
            data_loader_script,
        )?,
        keep_io_types,
        fallback,
    };
    let mut events = Vec::new();
    let (bytes, notes) = guarded("convert", || {
        py.detach(|| {
            let done = convert_job::run(&config, &mut |e| events.push(e), &NoProgress)?;
            Ok((mixprec::export::model_bytes(&done.model), done.notes))
        })
        .map_err(to_py)
    })?;
    warn_events(py, events)?;
    Ok((PyBytes::new(py, &bytes), notes))
}

/// `calibrate` in process: the activation ranges (tensor name → amax) and, with `cache`, the
/// TensorRT calibration cache written.
#[pyfunction]
#[pyo3(signature = (
    model, *, inputs, load_inputs, seed, iterations, val_range, input_shapes,
    data_loader_script, algo, percentile, cache, cache_header
))]
#[allow(clippy::too_many_arguments)]
fn calibrate(
    py: Python<'_>,
    model: PathBuf,
    inputs: Option<Bound<'_, PyList>>,
    load_inputs: Vec<PathBuf>,
    seed: Option<u64>,
    iterations: Option<usize>,
    val_range: Vec<String>,
    input_shapes: Vec<String>,
    data_loader_script: Option<String>,
    algo: Option<String>,
    percentile: Option<f64>,
    cache: Option<PathBuf>,
    cache_header: Option<String>,
) -> PyResult<std::collections::BTreeMap<String, f32>> {
    let config = calibrate_job::Config {
        model,
        files: Vec::new(),
        inputs: inputs_from(
            inputs.as_ref(),
            load_inputs,
            seed,
            iterations,
            val_range,
            input_shapes,
            data_loader_script,
        )?,
        algo,
        calib: CalibOptions::default(),
        percentile,
        cache,
        cache_header,
    };
    let mut events = Vec::new();
    let done = guarded("calibrate", || {
        py.detach(|| calibrate_job::run(&config, &mut |e| events.push(e), &NoProgress))
            .map_err(to_py)
    })?;
    warn_events(py, events)?;
    Ok(done.cache.amax_map())
}

/// A finished `plan`: the front, the chosen point, the baselines; its model on demand.
#[pyclass(module = "mixprec._native", name = "Plan", frozen)]
struct Plan {
    outcome: plan_job::Outcome,
}

#[pymethods]
impl Plan {
    /// The `--save-result` JSON.
    fn result_json(&self) -> PyResult<String> {
        let bytes = self.outcome.result_json().map_err(to_py)?;
        String::from_utf8(bytes).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The chosen point's model as serialized ONNX bytes, and the exporter's notes; None when
    /// no point passed.
    fn export<'py>(&self, py: Python<'py>) -> PyResult<Option<(Bound<'py, PyBytes>, Vec<String>)>> {
        let exported = py.detach(|| self.outcome.export()).map_err(to_py)?;
        Ok(exported.map(|e| {
            (
                PyBytes::new(py, &mixprec::export::model_bytes(&e.model)),
                e.notes,
            )
        }))
    }

    /// The HTML report (the front plotted, the per-layer table).
    fn html(&self) -> String {
        self.outcome.html()
    }

    /// The front as the CLI prints it.
    fn front_lines(&self) -> Vec<String> {
        self.outcome.front_lines()
    }
}

/// `plan` in process. See `mixprec.plan` for the arguments.
#[pyfunction]
#[pyo3(signature = (
    model, *, formats, high, objective, target, inputs, load_inputs, seed, iterations,
    val_range, input_shapes, data_loader_script, golden, golden_path, criterion, atol, rtol,
    check_error_stat,
    error_quantile, metrics, calibration_cache, calibration_algo, jobs, cache_budget, check,
    check_timeout, decode, full_front, fusion, check_function=None, remote=None,
    as_worker=false, amax=None
))]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    model: PathBuf,
    formats: Vec<String>,
    high: String,
    objective: String,
    target: String,
    inputs: Option<Bound<'_, PyList>>,
    load_inputs: Vec<PathBuf>,
    seed: Option<u64>,
    iterations: Option<usize>,
    val_range: Vec<String>,
    input_shapes: Vec<String>,
    data_loader_script: Option<String>,
    golden: Option<Bound<'_, PyList>>,
    golden_path: Option<PathBuf>,
    criterion: Option<Py<PyAny>>,
    atol: Vec<String>,
    rtol: Vec<String>,
    check_error_stat: Vec<String>,
    error_quantile: Vec<String>,
    metrics: Vec<String>,
    calibration_cache: Option<PathBuf>,
    calibration_algo: Option<String>,
    jobs: usize,
    cache_budget: String,
    check: Vec<String>,
    check_timeout: Option<f64>,
    decode: Option<usize>,
    full_front: bool,
    fusion: String,
    check_function: Option<Py<PyAny>>,
    remote: Option<Py<PyAny>>,
    as_worker: bool,
    amax: Option<std::collections::BTreeMap<String, f32>>,
) -> PyResult<Py<PyAny>> {
    let raised: Arc<Mutex<Option<PyErr>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let interrupted = Arc::new(AtomicBool::new(false));
    let remote_errors: Arc<Mutex<Vec<PyErr>>> = Arc::default();
    let remote = remote.map(|start| {
        RemotePlanWorkers(Arc::new(PyPlanWorkers {
            start,
            errors: remote_errors.clone(),
            stop: stop.clone(),
            interrupted: interrupted.clone(),
        }))
    });
    let config = plan_job::Config {
        golden: golden_source(golden, golden_path)?,
        user_criterion: criterion.map(|f| user_criterion(f, raised.clone())),
        model,
        inputs: inputs_from(
            inputs.as_ref(),
            load_inputs,
            seed,
            iterations,
            val_range,
            input_shapes,
            data_loader_script,
        )?,
        formats,
        high,
        objective,
        target,
        compare: CompareOptions {
            atol,
            rtol,
            check_error_stat,
            error_quantile,
            metric: metrics,
        },
        calibration_cache,
        calib: CalibOptions {
            calibration_algo,
            ..Default::default()
        },
        jobs,
        cache_budget,
        check: check_options(check, check_timeout, check_function, &raised),
        verbose: false,
        decode,
        full_front,
        fusion,
        remote,
    };
    if as_worker {
        let validated = plan_worker_config(config).validate().map_err(to_py)?;
        let inner = guarded("plan worker", || {
            py.detach(|| PlanJobWorker::start(validated, amax))
                .map_err(to_py)
        });
        if let Some(e) = raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        let worker = PlanWorker {
            inner: inner?,
            raised,
        };
        return Ok(Py::new(py, worker)?.into_any());
    }
    let validated = config.validate().map_err(to_py)?;
    let mut events = Vec::new();
    let outcome = guarded("plan", || {
        py.detach(|| plan_job::run(validated, &mut |e| events.push(e), &NoProgress, &stop))
            .map_err(to_py)
    });
    if let Some(e) = raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    if interrupted.load(Ordering::SeqCst) {
        return Err(PyKeyboardInterrupt::new_err(
            "mixprec: plan was interrupted while its workers judged a point",
        ));
    }
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return Err(remote_error(py, e, &remote_errors)),
    };
    warn_events(py, events)?;
    Ok(Py::new(py, Plan { outcome })?.into_any())
}

/// `plan`'s workers (`executor=`): once the driver has calibrated, the Python `start(ranges)`
/// (`mixprec.plan`'s) creates the dispatcher of python/mixprec/_scale.py with the ranges in
/// the workers' settings; its batches then go through [`PyRemote`].
struct PyPlanWorkers {
    start: Py<PyAny>,
    errors: Arc<Mutex<Vec<PyErr>>>,
    stop: Arc<AtomicBool>,
    interrupted: Arc<AtomicBool>,
}

impl PlanWorkers for PyPlanWorkers {
    fn start(
        &self,
        amax: Option<&std::collections::BTreeMap<String, f32>>,
    ) -> mixprec::error::Result<Arc<dyn Remote<PlanPoint>>> {
        Python::attach(|py| {
            let remote = PyRemote {
                dispatch: py.None(),
                errors: self.errors.clone(),
                stop: self.stop.clone(),
                interrupted: self.interrupted.clone(),
            };
            match self.start.bind(py).call1((amax.cloned(),)) {
                Ok(dispatch) => Ok(Arc::new(PyRemote {
                    dispatch: dispatch.unbind(),
                    ..remote
                }) as Arc<dyn Remote<PlanPoint>>),
                // Refused settings (a criterion that does not pickle, a forking pool, Ray
                // missing): raised as themselves once the plan has stopped.
                Err(e) => Err(Error::Invalid(remote.failed(e, py))),
            }
        })
    }
}

/// One worker of a `plan` judged elsewhere (`executor=`): the model, inputs, golden outputs,
/// the driver's ranges and a value cache, prepared once; `evaluate` judges a point.
#[pyclass(module = "mixprec._native", name = "PlanWorker", frozen)]
struct PlanWorker {
    inner: PlanJobWorker,
    /// The criterion's exception, raised as itself.
    raised: Arc<Mutex<Option<PyErr>>>,
}

#[pymethods]
impl PlanWorker {
    /// The verdict on a point `(layers, uncached, check)`: `layers` the `(node index,
    /// precision)` of every layer below the high precision, `uncached` to judge it outside
    /// the value cache, `check` to judge it with the check instead of the emulation.
    fn evaluate(
        &self,
        py: Python<'_>,
        point: (Vec<(usize, String)>, bool, bool),
    ) -> PyResult<(bool, f64, String)> {
        let (layers, uncached, check) = point;
        let layers = layers
            .into_iter()
            .map(|(i, p)| Ok((i, Precision::parse(&p)?)))
            .collect::<mixprec::error::Result<Vec<_>>>()
            .map_err(to_py)?;
        let point = PlanPoint {
            layers,
            uncached,
            check,
        };
        let verdict = guarded("plan worker", || {
            Ok(py.detach(|| self.inner.evaluate_batch(vec![point])).pop())
        })?;
        if let Some(e) = self.raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        match verdict {
            Some(Ok(e)) => Ok((e.passed, e.error, e.summary)),
            Some(Err(e)) => Err(to_py(e)),
            None => Err(PyRuntimeError::new_err("mixprec plan worker: no verdict")),
        }
    }
}

/// `plan --cost-of` in process: the mixed model priced by the cost model of the float one, as
/// the JSON of `mixprec::jobs::plan_cost::ModelCost`.
#[pyfunction]
#[pyo3(signature = (
    model, mixed, *, objective, target, inputs, load_inputs, seed, iterations, val_range,
    input_shapes, data_loader_script
))]
#[allow(clippy::too_many_arguments)]
fn plan_cost(
    py: Python<'_>,
    model: PathBuf,
    mixed: PathBuf,
    objective: String,
    target: String,
    inputs: Option<Bound<'_, PyList>>,
    load_inputs: Vec<PathBuf>,
    seed: Option<u64>,
    iterations: Option<usize>,
    val_range: Vec<String>,
    input_shapes: Vec<String>,
    data_loader_script: Option<String>,
) -> PyResult<String> {
    let config = mixprec::jobs::plan_cost::Config {
        model,
        mixed,
        inputs: inputs_from(
            inputs.as_ref(),
            load_inputs,
            seed,
            iterations,
            val_range,
            input_shapes,
            data_loader_script,
        )?,
        objective,
        target,
    };
    let mut events = Vec::new();
    let cost = guarded("plan_cost", || {
        py.detach(|| mixprec::jobs::plan_cost::run(&config, &mut |e| events.push(e)))
            .map_err(to_py)
    })?;
    warn_events(py, events)?;
    cost.to_json().map_err(to_py)
}

/// `quantize` in process: the model with Q/DQ (int8/fp8 calibrated, or int4/NVFP4 weight-only)
/// as bytes, the layers quantized, and the notes on the written model.
#[pyfunction]
#[pyo3(signature = (
    model, *, scheme, block_size, exclude_op_types, exclude_nodes, exclude_from,
    calibration_cache, calibration_algo, percentile, inputs, load_inputs, seed, iterations,
    val_range, input_shapes, data_loader_script
))]
#[allow(clippy::too_many_arguments)]
fn quantize<'py>(
    py: Python<'py>,
    model: PathBuf,
    scheme: String,
    block_size: Option<usize>,
    exclude_op_types: Vec<String>,
    exclude_nodes: Vec<String>,
    exclude_from: Option<PathBuf>,
    calibration_cache: Option<PathBuf>,
    calibration_algo: Option<String>,
    percentile: Option<f64>,
    inputs: Option<Bound<'py, PyList>>,
    load_inputs: Vec<PathBuf>,
    seed: Option<u64>,
    iterations: Option<usize>,
    val_range: Vec<String>,
    input_shapes: Vec<String>,
    data_loader_script: Option<String>,
) -> PyResult<(Bound<'py, PyBytes>, Vec<String>, Vec<String>)> {
    let mut config = quantize_job::Config {
        model,
        block_size,
        exclude_op_types,
        exclude_nodes,
        exclude_from,
        calibration_cache,
        calib: CalibOptions {
            calibration_algo,
            ..Default::default()
        },
        percentile,
        inputs: inputs_from(
            inputs.as_ref(),
            load_inputs,
            seed,
            iterations,
            val_range,
            input_shapes,
            data_loader_script,
        )?,
        ..Default::default()
    };
    match scheme.as_str() {
        "int8" => config.int8 = true,
        "fp8" | "float8" => config.fp8 = true,
        "int4_weights" | "int4" => config.int4_weights = true,
        "nvfp4_weights" | "nvfp4" => config.nvfp4_weights = true,
        other => {
            return Err(PyValueError::new_err(format!(
                "scheme: expected 'int8', 'fp8', 'int4_weights' or 'nvfp4_weights', got '{other}'"
            )))
        }
    }
    let mut events = Vec::new();
    let (bytes, layers, notes) = guarded("quantize", || {
        py.detach(|| {
            let done = quantize_job::run(&config, &mut |e| events.push(e), &NoProgress)?;
            Ok((
                mixprec::export::model_bytes(&done.model),
                done.quantized(),
                done.notes,
            ))
        })
        .map_err(to_py)
    })?;
    warn_events(py, events)?;
    Ok((PyBytes::new(py, &bytes), layers, notes))
}

/// Compares outputs with reference outputs as `run --load-outputs` and the search do: per input
/// set, per reference output, the verdict under the criterion with the tolerances it would
/// need and every metric.
#[pyfunction]
#[pyo3(signature = (outputs, reference, *, atol, rtol, check_error_stat, error_quantile, metrics))]
#[allow(clippy::too_many_arguments)]
fn compare<'py>(
    py: Python<'py>,
    outputs: Bound<'py, PyList>,
    reference: Bound<'py, PyList>,
    atol: Vec<String>,
    rtol: Vec<String>,
    check_error_stat: Vec<String>,
    error_quantile: Vec<String>,
    metrics: Vec<String>,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let criterion = CompareOptions {
        atol,
        rtol,
        check_error_stat,
        error_quantile,
        metric: metrics,
    }
    .criterion()
    .map_err(to_py)?;
    let (outputs, reference) = (to_sets(&outputs)?, to_sets(&reference)?);
    if outputs.len() != reference.len() {
        return Err(PyValueError::new_err(format!(
            "{} output set(s) against {} reference set(s): give one reference per set",
            outputs.len(),
            reference.len()
        )));
    }
    let mut all = Vec::with_capacity(outputs.len());
    for (k, (out, refs)) in outputs.iter().zip(&reference).enumerate() {
        let d = PyDict::new(py);
        for (name, r) in refs {
            let o = out.get(name).ok_or_else(|| {
                PyValueError::new_err(format!("set {k}: output '{name}' is missing"))
            })?;
            let c = guarded("compare", || {
                mixprec::compare::check_output(name, o, r, &criterion).map_err(to_py)
            })?;
            let row = PyDict::new(py);
            row.set_item("passed", c.passed)?;
            row.set_item("stat", c.stat.name())?;
            row.set_item("atol", c.atol)?;
            row.set_item("rtol", c.rtol)?;
            row.set_item("required_atol", c.required_atol)?;
            row.set_item("required_rtol", c.required_rtol)?;
            let ms = PyList::empty(py);
            for m in &c.metrics {
                let md = PyDict::new(py);
                md.set_item("metric", m.line())?;
                md.set_item("value", m.value)?;
                md.set_item("passed", m.passed)?;
                ms.append(md)?;
            }
            row.set_item("metrics", ms)?;
            d.set_item(name, row)?;
        }
        all.push(d);
    }
    Ok(all)
}

/// The library's warnings as Python warnings.
fn warn_events(py: Python<'_>, events: Vec<Event>) -> PyResult<()> {
    let warnings = py.import("warnings")?;
    for e in events {
        if let Event::Warning(w) = e {
            warnings.call_method1("warn", (w,))?;
        }
    }
    Ok(())
}

/// The `mixprec` command in this process: `argv` as `sys.argv` (the program name first);
/// returns the exit status. The host process's signal dispositions are left as they are
/// (the console script, `mixprec._cli.main`, restores SIGPIPE's default before calling this).
#[pyfunction]
fn main(argv: Vec<String>) -> i32 {
    let code = mixprec_cli::main_from(argv);
    (0..=255u8)
        .find(|&k| std::process::ExitCode::from(k) == code)
        .map_or(1, i32::from)
}

/// The CPU and the instruction sets the engine's kernels run with on it, as each kernel family
/// chose them at run time (`mixprec.runtime()`; `mixprec::ops::isa`).
#[pyfunction]
fn kernel_isa(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let isa = mixprec::ops::isa::kernel_isa();
    let info = PyDict::new(py);
    info.set_item("cpu", &isa.cpu)?;
    info.set_item("float_kernels", isa.float)?;
    info.set_item("integer_kernels", isa.integer)?;
    info.set_item("rounding_kernels", isa.rounding)?;
    info.set_item("summary", isa.to_string())?;
    Ok(info)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Search>()?;
    m.add_class::<Worker>()?;
    m.add_class::<PlanWorker>()?;
    m.add_class::<Candidate>()?;
    m.add_function(wrap_pyfunction!(debug_precision, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    m.add_function(wrap_pyfunction!(calibrate, m)?)?;
    m.add_function(wrap_pyfunction!(quantize, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan_cost, m)?)?;
    m.add_class::<Plan>()?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_isa, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add("KeyboardInterrupt", py_keyboard_interrupt(m.py()))?;
    Ok(())
}

fn py_keyboard_interrupt(py: Python<'_>) -> Bound<'_, pyo3::types::PyType> {
    py.get_type::<PyKeyboardInterrupt>()
}
