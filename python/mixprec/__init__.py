"""mixprec: find which layers of an ONNX network must stay in higher precision.

The same native engine as the ``mixprec`` command, in process: FP16/BF16/FP8/INT8 emulated
bit-faithfully on the CPU, Polygraphy's ``debug precision`` search, and the answer as a
deployable mixed-precision ONNX model.

    import mixprec
    result = mixprec.debug_precision("model.onnx", precision="float16", inputs=batches,
                                     criterion=lambda outputs, golden: my_metric(...) >= 0.99)
    print(result.layers)
    result.export("model_mixed.onnx")

Keyword arguments take the CLI's option names in snake_case (``--check-error-stat`` is
``check_error_stat``); docs/python.md maps every one.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

import numpy as np

from . import _native, _scale
from ._scale import ExecutorLike, RayWorkers, WorkerLostError

__all__ = [
    "Candidate",
    "MixprecWarning",
    "RayWorkers",
    "SearchResult",
    "WorkerLostError",
    "calibrate",
    "compare",
    "convert",
    "debug_precision",
    "plan",
    "plan_cost",
    "PlanResult",
    "quantize",
    "run",
    "runtime",
]

__version__ = "0.1.0"

Arrays = Dict[str, np.ndarray]
"""One input set (or one set of outputs): tensor name to array."""

ModelLike = Union[str, "os.PathLike[str]", bytes, Any]
"""A path, serialized ONNX bytes, or an ``onnx.ModelProto``."""

DataLike = Union[
    str,
    "os.PathLike[str]",
    Mapping[str, Any],
    Iterable[Mapping[str, Any]],
    Callable[[], Any],
]
"""Input sets (or golden outputs): a Polygraphy JSON / ``.npz`` path, one dict, an iterable
of dicts (a list, a generator, a ``DataLoader`` yielding dicts), or a callable returning one
of those."""

Criterion = Callable[[List[Arrays], List[Arrays]], bool]
"""``criterion(outputs, golden) -> bool``: one dict per input set in each list."""

Candidate = _native.Candidate
"""What a ``check`` function is given: ``export(path)`` writes the candidate's strongly typed
mixed-precision ONNX model (what a check command's ``{model}`` is; all or nothing) and
returns ``path``; ``model_bytes()`` the same model as bytes; ``layer_precisions`` layer name
to precision for every layer the search decides; ``marked`` the layers in the high
precision; ``iteration`` the 1-based count of candidates this check judged (a worker's own
count on a worker)."""

Check = Union[str, Sequence[str], Callable[[Any], bool]]
"""A check command (a string or a list, with ``{model}`` and the other placeholders) or a
function ``check(candidate) -> bool`` given a ``Candidate``."""


def _tolerances(
    atol: Any, rtol: Any, check_error_stat: Any, error_quantile: Any, metrics: Any
) -> Dict[str, Any]:
    """The comparison's criterion options (``--atol``, ``--rtol``, ``--check-error-stat``,
    ``--error-quantile``, ``--metric``) as the native functions take them."""
    return dict(
        atol=_items(atol, "atol"),
        rtol=_items(rtol, "rtol"),
        check_error_stat=_items(check_error_stat, "check_error_stat"),
        error_quantile=_items(error_quantile, "error_quantile"),
        metrics=_items(metrics, "metrics"),
    )


def _check_kwargs(check: Optional[Check]) -> Dict[str, Any]:
    """``check`` as the native job's arguments: a command's words, or the function."""
    if check is not None and callable(check):
        return dict(check=[], check_function=check)
    if isinstance(check, str):
        import shlex

        check = shlex.split(check)
    return dict(check=list(check or []), check_function=None)

_log = logging.getLogger("mixprec")


class MixprecWarning(UserWarning):
    """A warning from the mixprec engine (what the CLI prints as ``warning: ...``)."""


class _Model:
    """A model argument as a file the engine can read (a temporary one for bytes or a
    ModelProto, removed when this is)."""

    def __init__(self, model: ModelLike) -> None:
        self._tmp: Optional[str] = None
        # The bytes of a model given in memory (what travels to an executor's workers).
        self.data: Optional[bytes] = None
        if isinstance(model, (str, os.PathLike)):
            self.path = os.fspath(model)
            return
        if isinstance(model, (bytes, bytearray, memoryview)):
            data = bytes(model)
        elif hasattr(model, "SerializeToString"):
            data = model.SerializeToString()
        else:
            raise TypeError(
                "model: expected a path, ONNX bytes or an onnx.ModelProto, got "
                f"{type(model).__name__}"
            )
        self.data = data
        fd, self._tmp = tempfile.mkstemp(suffix=".onnx", prefix="mixprec-model-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        self.path = self._tmp

    def __del__(self) -> None:
        if self._tmp is not None:
            try:
                os.unlink(self._tmp)
            except OSError:
                pass


def _as_array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        arr = value.detach().cpu().numpy()
    else:
        arr = np.asarray(value)
    if arr.dtype == object:
        raise TypeError(f"input '{name}': cannot make a numeric array of {type(value).__name__}")
    return np.ascontiguousarray(arr)


def _as_set(item: Any, what: str, k: int) -> Arrays:
    if not isinstance(item, Mapping):
        raise TypeError(
            f"{what} {k}: expected a dict of {{name: array}}, got {type(item).__name__}"
        )
    return {str(name): _as_array(str(name), v) for name, v in item.items()}


def _data(value: Optional[DataLike], what: str) -> tuple[Optional[List[Arrays]], Optional[str]]:
    """(in-memory sets, path): one of them, or neither for None."""
    if value is None:
        return None, None
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{what}: {path}: no such file or directory")
        return None, path
    if callable(value) and not isinstance(value, Mapping):
        value = value()
    if isinstance(value, Mapping):
        return [_as_set(value, what, 0)], None
    sets = [_as_set(item, what, k) for k, item in enumerate(value)]
    if not sets:
        raise ValueError(f"{what}: no input set was given (an empty iterable)")
    return sets, None


def _input_kwargs(
    inputs: Optional[DataLike],
    seed: Optional[int],
    iterations: Optional[int],
    val_range: Any,
    input_shapes: Any,
    data_loader_script: Optional[str],
) -> Dict[str, Any]:
    """Where the native jobs take their input sets from: in memory, a file, or generated."""
    sets, path = _data(inputs, "inputs")
    return dict(
        inputs=sets,
        load_inputs=[path] if path else [],
        seed=seed,
        iterations=iterations,
        val_range=_items(val_range, "val_range"),
        input_shapes=_items(input_shapes, "input_shapes"),
        data_loader_script=data_loader_script,
    )


def _items(value: Any, what: str) -> List[str]:
    """A tolerance-like option as the CLI's items: ``1e-3``, ``{"out": 1e-3}``,
    ``["1e-3", "out:1e-2"]``."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [f"{k}:{v}" for k, v in value.items()]
    if isinstance(value, (str, int, float)):
        return [str(value)]
    try:
        return [str(v) for v in value]
    except TypeError:
        raise TypeError(f"{what}: expected a value, a list or a dict, got {type(value).__name__}")


def _precisions(precision: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(precision, str):
        return [p.strip() for p in precision.replace("+", ",").split(",") if p.strip()]
    return list(precision)


def _on_event(kind: str, text: str) -> None:
    if kind == "warning":
        warnings.warn(text, MixprecWarning, stacklevel=3)
    elif kind == "verbose":
        _log.debug(text)
    else:
        _log.info(text.rstrip("\n"))


def _progress_sink(progress: Union[bool, Callable[[Dict[str, Any]], None], None]):
    """(callback for each evaluated candidate, close) for ``progress=``."""
    if callable(progress):
        return progress, lambda: None
    if progress is False:
        return None, lambda: None
    try:
        from tqdm.auto import tqdm  # type: ignore[import-not-found]
    except ImportError:
        return None, lambda: None
    bar = tqdm(desc="mixprec", unit="eval")
    best: List[Optional[int]] = [None]

    def update(t: Dict[str, Any]) -> None:
        if t["passed"]:
            best[0] = t["marked"] if best[0] is None else min(best[0], t["marked"])
        bar.update(1)
        bar.set_postfix_str(
            f"{t['phase']} | best: {'none' if best[0] is None else str(best[0]) + ' layer(s)'}"
        )

    return update, bar.close


class SearchResult:
    """What :func:`debug_precision` found.

    ``layers`` are the names of the layers that must stay in the higher precision (for a
    Q/DQ model: leave quantization); ``to_dict()`` is the CLI's ``--save-result`` JSON.
    """

    def __init__(self, native: Any, model: _Model) -> None:
        self._native = native
        self._model = model  # keeps a temporary model file alive with the result
        self._dict: Dict[str, Any] = json.loads(native.result_json())

    @property
    def outcome(self) -> str:
        """``found``, ``nothing-needed``, ``not-found``, ``reference-fails`` or
        ``interrupted``."""
        return str(self._dict["outcome"]["kind"])

    @property
    def layers(self) -> List[str]:
        """The answer: layer names (empty when nothing is needed or nothing was found)."""
        return [layer["name"] for layer in self._dict["layers"]]

    @property
    def evaluations(self) -> int:
        """Candidates evaluated (the speculative ones of ``jobs > 1`` not counted)."""
        return int(self._dict["stats"]["evaluations"])

    @property
    def history(self) -> List[Dict[str, Any]]:
        """Every evaluated candidate: iteration, phase, marked layers, error, verdict."""
        return list(self._dict["trials"])

    @property
    def reasons(self) -> Dict[str, Any]:
        """Why each layer of the answer is needed (its error alone in low precision and the
        cause), by layer name."""
        return {
            layer["name"]: layer["reason"]
            for layer in self._dict["layers"]
            if layer.get("reason") is not None
        }

    @property
    def groups(self) -> List[Dict[str, Any]]:
        """The answer as rules: one dict per role and set of blocks (``role``, ``scope``,
        ``blocks``, ``block_indices``, ``ops``, ``layers``, ``indices``, ``regex``,
        ``layer_precisions``), a layer without a block index on its own."""
        return list(self._dict.get("groups", []))

    def to_dict(self) -> Dict[str, Any]:
        """The ``--save-result`` JSON as a dict (a copy)."""
        return json.loads(json.dumps(self._dict))

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the ``--save-result`` JSON."""
        _write(path, self._native.result_json().encode())

    def export(self, path: Union[str, "os.PathLike[str]", None] = None) -> Any:
        """The answer as a mixed-precision ONNX model (Casts for float16/bfloat16, Q/DQ for
        int8/fp8; for a Q/DQ model, the model without the answer's pairs): written to
        ``path`` when given; returned as an ``onnx.ModelProto`` when onnx is importable,
        else as bytes. None when the search found no answer."""
        data = self._native.export()
        if data is None:
            return None
        return _deliver_model(data, self._native.export_notes(), path)

    def report(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the HTML report (the answer, every candidate's error and verdict)."""
        _write(path, self._native.html().encode())

    def _repr_html_(self) -> str:
        return str(self._native.html())

    def __repr__(self) -> str:
        return (
            f"SearchResult(outcome={self.outcome!r}, layers={self.layers!r}, "
            f"evaluations={self.evaluations})"
        )


def _deliver_model(
    data: bytes, notes: Sequence[str], path: Union[str, "os.PathLike[str]", None]
) -> Any:
    """A written model handed back: its notes logged, written to ``path`` when given, returned
    as an ``onnx.ModelProto`` when onnx is importable, else as bytes."""
    for note in notes:
        _log.info(note)
    if path is not None:
        _write(path, data)
    try:
        import onnx  # type: ignore[import-not-found]
    except ImportError:
        return data
    return onnx.load_model_from_string(data)


def _write(path: Union[str, "os.PathLike[str]"], data: bytes) -> None:
    """Writes all or nothing: a temporary file beside ``path``, then renamed over it."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".mixprec-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp makes the file private; a written model gets the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def debug_precision(
    model: ModelLike,
    *,
    precision: Union[str, Sequence[str]] = "float16",
    higher_precision: str = "float32",
    inputs: Optional[DataLike] = None,
    golden: Optional[DataLike] = None,
    criterion: Optional[Criterion] = None,
    check_error_stat: Any = None,
    atol: Any = None,
    rtol: Any = None,
    error_quantile: Any = None,
    metrics: Optional[Sequence[str]] = None,
    mode: str = "minimal",
    direction: str = "forward",
    objective: str = "layers",
    ranking: Optional[str] = None,
    layer_precisions: Union[Mapping[str, str], Sequence[str], None] = None,
    fusion: str = "none",
    calibration_cache: Union[str, "os.PathLike[str]", None] = None,
    calibration_algo: Optional[str] = None,
    seed: Optional[int] = None,
    iterations: Optional[int] = None,
    val_range: Any = None,
    input_shapes: Any = None,
    data_loader_script: Optional[str] = None,
    cache_budget: str = "auto",
    check: Optional[Check] = None,
    check_timeout: Optional[float] = None,
    load_debug_replay: Union[str, "os.PathLike[str]", None] = None,
    save_debug_replay: Union[str, "os.PathLike[str]", None] = None,
    layer_errors: bool = False,
    jobs: Optional[int] = None,
    group: str = "none",
    decode: Optional[int] = None,
    progress: Union[bool, Callable[[Dict[str, Any]], None], None] = None,
    executor: Optional[ExecutorLike] = None,
    retries: int = 3,
) -> SearchResult:
    """Finds the layers that must stay in ``higher_precision`` for the model to stay
    accurate with the rest in ``precision`` (Polygraphy's ``debug precision``; the CLI's
    ``mixprec debug precision``). A Q/DQ model with ``precision=None``: which quantized layers
    must leave quantization.

    ``precision``: the low precision(s), ``"float16"``, ``"bfloat16"``, ``"int8"``,
    ``"fp8"`` or a list (``["int8", "float16"]``: TensorRT's ``--int8 --fp16``).
    ``inputs``: the input sets (see ``DataLike``); None generates them like Polygraphy
    (``seed``, ``iterations``, ``val_range``, ``input_shapes``). ``golden``: reference
    outputs in the same forms; None runs the model in FP32 on ``inputs``.
    ``criterion(outputs, golden) -> bool`` judges each candidate instead of the tolerances
    (``atol``, ``rtol``, ``check_error_stat``, ``metrics``), which still measure the error
    each trial reports. ``mode``: ``minimal`` (default), ``bisect``, ``linear`` or
    ``worst-first``. ``group="roles"``: layers that play the same role in repeated blocks
    are one candidate first, refined inside the roles that are needed (``--group roles``);
    ``groups`` then reads the answer as rules either way. ``decode=N``: each input set is a
    prompt (``input_ids``) and every candidate generates N tokens greedily through the KV
    cache (ONNX Runtime GenAI's names, the CLI's ``--decode``); its outputs are ``tokens``
    (judged: ``metrics=["tokens:0.9"]`` lets a share differ) and ``logits`` (judged only
    when a criterion names them, e.g. ``atol={"logits": 0.05}``). ``progress``: a callable
    given a dict per evaluated candidate, False for none; by default a tqdm bar when tqdm is
    installed.

    ``check`` judges each candidate instead of the emulation (Polygraphy's ``--check``): a
    command (a string or a list; ``{model}`` is the candidate's strongly typed model, see
    docs/search.md for the other placeholders; ``check_timeout`` seconds before its process
    group is killed) or a function ``check(candidate) -> bool`` given a ``Candidate``:
    ``candidate.export(path)`` writes the model ``{model}`` would be and returns ``path``,
    ``candidate.layer_precisions`` maps every candidate layer to its precision (the marked
    ones in ``higher_precision``), ``candidate.marked`` names the marked ones. Without an
    executor the function runs in this process, one candidate at a time in the serial
    search's order (``jobs`` judges none ahead for it); with one, on the workers. A function
    takes no ``check_timeout``: Python cannot kill it (time out inside it).

    ``jobs``: candidates evaluated at the same time (default 1; with an ``executor``, its
    worker count). ``executor``: judge the candidates on other processes or machines — any
    ``concurrent.futures.Executor``, ``"ray"`` (the connected Ray cluster, or ``ray.init()``)
    or ``RayWorkers(n, **actor_options)``. Each worker prepares the search once (model,
    inputs, plans, cache) and runs ``criterion`` / ``check`` itself; the answer, the trials
    and ``to_dict()`` are those of the same search without an executor (docs/scale-out.md).
    A candidate whose worker dies runs again on another, ``retries`` times, then
    ``WorkerLostError`` names it.

    Raises ``FileNotFoundError`` for a missing file, ``ValueError`` for a bad option or an
    input that does not fit the model (naming it), ``TypeError`` when ``criterion`` or
    ``check`` returns something other than a bool; an exception raised by ``criterion``, by
    ``check`` (on a worker too) or by an input iterable reaches the caller as itself. Ctrl-C stops the search after the running evaluation and
    raises ``KeyboardInterrupt`` whose ``result`` attribute is the best answer so far.
    """
    m = _Model(model)
    data = _input_kwargs(inputs, seed, iterations, val_range, input_shapes, data_loader_script)
    golden_sets, golden_path = _data(golden, "golden")
    if jobs is None:
        jobs = 1 if executor is None else _scale.default_workers(executor)
    # What decides a verdict: the driver's search and every worker's are built from it.
    settings: Dict[str, Any] = dict(
        low=_precisions(precision) if precision is not None else [],
        higher_precision=higher_precision,
        mode=mode,
        direction=direction,
        objective=objective,
        ranking=ranking,
        jobs=jobs,
        group=group,
        **data,
        golden=golden_sets,
        golden_path=golden_path,
        criterion=criterion,
        **_tolerances(atol, rtol, check_error_stat, error_quantile, metrics),
        layer_precisions=_items(layer_precisions, "layer_precisions"),
        fusion=fusion,
        calibration_cache=None if calibration_cache is None else os.fspath(calibration_cache),
        calibration_algo=calibration_algo,
        cache_budget=cache_budget,
        **_check_kwargs(check),
        check_timeout=check_timeout,
        layer_errors=layer_errors,
        decode=decode,
    )
    dispatch = None
    if executor is not None:
        spec = dict(settings, model=m.path, load_debug_replay=None, save_debug_replay=None,
                    progress=None, on_event=None)
        if m.data is not None:
            spec["model_bytes"] = m.data
        dispatch = _scale.dispatcher(executor, spec, jobs, retries)
    on_trial, close = _progress_sink(progress)
    try:
        native = _native.debug_precision(
            m.path,
            **settings,
            load_debug_replay=None if load_debug_replay is None else os.fspath(load_debug_replay),
            save_debug_replay=None if save_debug_replay is None else os.fspath(save_debug_replay),
            progress=on_trial,
            on_event=_on_event,
            remote=dispatch,
        )
    finally:
        close()
        if dispatch is not None:
            dispatch.close()
    result = SearchResult(native, m)
    if native.interrupted:
        interrupt = KeyboardInterrupt("mixprec: the search was interrupted")
        interrupt.result = result  # type: ignore[attr-defined]
        raise interrupt
    return result


def run(
    model: ModelLike,
    inputs: Optional[DataLike] = None,
    *,
    precision: Union[str, Sequence[str], None] = None,
    layer_precisions: Union[Mapping[str, str], Sequence[str], None] = None,
    mark_all: bool = False,
    fusion: str = "none",
    calibration_cache: Union[str, "os.PathLike[str]", None] = None,
    calibration_algo: Optional[str] = None,
    seed: Optional[int] = None,
    iterations: Optional[int] = None,
    val_range: Any = None,
    input_shapes: Any = None,
    data_loader_script: Optional[str] = None,
    decode: Optional[int] = None,
) -> List[Arrays]:
    """Runs the model on each input set, in FP32 (ONNX Runtime's results) or with
    ``precision`` / ``layer_precisions`` emulated; one dict of outputs per set (the graph
    outputs, then with ``mark_all`` every other value in execution order). Types numpy
    lacks (bfloat16, float8) come back as float32. ``decode=N``: each set is a prompt and
    the model generates N tokens greedily through its KV cache (ONNX Runtime GenAI's
    names); the dict holds ``tokens`` [batch, N] and ``logits`` [batch, N, vocab]."""
    m = _Model(model)
    data = _input_kwargs(inputs, seed, iterations, val_range, input_shapes, data_loader_script)
    with warnings.catch_warnings():
        warnings.simplefilter("default", MixprecWarning)
        return list(
            _native.run(
                m.path,
                **data,
                low=_precisions(precision) if precision is not None else [],
                layer_precisions=_items(layer_precisions, "layer_precisions"),
                fusion=fusion,
                calibration_cache=None if calibration_cache is None else os.fspath(calibration_cache),
                calibration_algo=calibration_algo,
                mark_all=mark_all,
                decode=decode,
            )
        )


def _emit_warnings(call: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("default", MixprecWarning)
        return call()


def convert(
    model: ModelLike,
    output: Union[str, "os.PathLike[str]", None] = None,
    *,
    precision: Union[str, Sequence[str], None] = None,
    layer_precisions: Union[Mapping[str, str], Sequence[str], None] = None,
    fusion: str = "none",
    calibration_cache: Union[str, "os.PathLike[str]", None] = None,
    calibration_algo: Optional[str] = None,
    inputs: Optional[DataLike] = None,
    seed: Optional[int] = None,
    iterations: Optional[int] = None,
    val_range: Any = None,
    input_shapes: Any = None,
    data_loader_script: Optional[str] = None,
    keep_io_types: bool = True,
    fallback: bool = False,
) -> Any:
    """The model with ``precision`` / ``layer_precisions`` written into it (``mixprec
    convert``): Casts around float16/bfloat16 layers, QuantizeLinear/DequantizeLinear for
    int8/fp8 with ranges from ``calibration_cache`` or calibrated on ``inputs``. Written to
    ``output`` when given; returned as an ``onnx.ModelProto`` when onnx is importable, else as
    bytes. Layers kept in float32 by ``fallback`` are logged."""
    m = _Model(model)
    data = _input_kwargs(inputs, seed, iterations, val_range, input_shapes, data_loader_script)
    data, notes = _emit_warnings(
        lambda: _native.convert(
            m.path,
            low=_precisions(precision) if precision is not None else [],
            layer_precisions=_items(layer_precisions, "layer_precisions"),
            fusion=fusion,
            calibration_cache=None if calibration_cache is None else os.fspath(calibration_cache),
            calibration_algo=calibration_algo,
            **data,
            keep_io_types=keep_io_types,
            fallback=fallback,
        )
    )
    return _deliver_model(data, notes, output)


def quantize(
    model: ModelLike,
    output: Union[str, "os.PathLike[str]", None] = None,
    *,
    scheme: str = "int8",
    block_size: Optional[int] = None,
    exclude_op_types: Optional[Sequence[str]] = None,
    exclude_nodes: Optional[Sequence[str]] = None,
    exclude_from: Union[str, "os.PathLike[str]", "SearchResult", None] = None,
    calibration_cache: Union[str, "os.PathLike[str]", None] = None,
    calibration_algo: Optional[str] = None,
    percentile: Optional[float] = None,
    inputs: Optional[DataLike] = None,
    seed: Optional[int] = None,
    iterations: Optional[int] = None,
    val_range: Any = None,
    input_shapes: Any = None,
    data_loader_script: Optional[str] = None,
) -> Any:
    """The float model with explicit quantization (``mixprec quantize``): ``scheme="int8"`` or
    ``"fp8"`` puts QuantizeLinear/DequantizeLinear on the activations of Conv, ConvTranspose,
    Gemm and MatMul (ranges calibrated on ``inputs``, minmax by default, or read from
    ``calibration_cache``) and stores their weights per channel; ``"int4_weights"`` and
    ``"nvfp4_weights"`` quantize MatMul/Gemm weights only, in blocks of ``block_size``.
    ``exclude_op_types``, ``exclude_nodes`` (regular expressions on node names) and
    ``exclude_from`` (a ``debug_precision`` result, or its saved JSON) keep layers in float32.
    Written to ``output`` when given; returned as an ``onnx.ModelProto`` when onnx is
    importable, else as bytes. Notes on the written model are logged."""
    m = _Model(model)
    data = _input_kwargs(inputs, seed, iterations, val_range, input_shapes, data_loader_script)
    with tempfile.TemporaryDirectory(prefix="mixprec-") as tmp:
        excluded: Optional[str] = None
        if isinstance(exclude_from, SearchResult):
            excluded = os.path.join(tmp, "result.json")
            exclude_from.save(excluded)
        elif exclude_from is not None:
            excluded = os.fspath(exclude_from)
        blob, _layers, notes = _emit_warnings(
            lambda: _native.quantize(
                m.path,
                scheme=scheme,
                block_size=block_size,
                exclude_op_types=list(exclude_op_types or []),
                exclude_nodes=list(exclude_nodes or []),
                exclude_from=excluded,
                calibration_cache=None if calibration_cache is None else os.fspath(calibration_cache),
                calibration_algo=calibration_algo,
                percentile=percentile,
                **data,
            )
        )
    return _deliver_model(blob, notes, output)


def calibrate(
    model: ModelLike,
    inputs: Optional[DataLike] = None,
    *,
    algo: Optional[str] = None,
    percentile: Optional[float] = None,
    cache: Union[str, "os.PathLike[str]", None] = None,
    cache_header: Optional[str] = None,
    seed: Optional[int] = None,
    iterations: Optional[int] = None,
    val_range: Any = None,
    input_shapes: Any = None,
    data_loader_script: Optional[str] = None,
) -> Dict[str, float]:
    """Activation ranges from FP32 runs over ``inputs`` (``mixprec calibrate``): tensor name
    to amax, by ``algo`` (``entropy``, TensorRT's EntropyCalibration2, the default;
    ``minmax``; ``percentile``). With ``cache``, also writes TensorRT's calibration cache
    (``trtexec --calib``, ``calibration_cache=`` of the other functions)."""
    m = _Model(model)
    data = _input_kwargs(inputs, seed, iterations, val_range, input_shapes, data_loader_script)
    return dict(
        _emit_warnings(
            lambda: _native.calibrate(
                m.path,
                **data,
                algo=algo,
                percentile=percentile,
                cache=None if cache is None else os.fspath(cache),
                cache_header=cache_header,
            )
        )
    )


def compare(
    outputs: DataLike,
    reference: DataLike,
    *,
    atol: Any = None,
    rtol: Any = None,
    check_error_stat: Any = None,
    error_quantile: Any = None,
    metrics: Optional[Sequence[str]] = None,
) -> List[Dict[str, Dict[str, Any]]]:
    """Compares ``outputs`` with ``reference`` (each one dict of arrays, or a list of them:
    one per input set) the way
    ``mixprec run --load-outputs`` and the search do (Polygraphy's comparator: ``atol``,
    ``rtol``, ``check_error_stat``, ``error_quantile``, ``metrics``). Per input set, per
    reference output: ``passed``, the checked ``stat``, the ``atol``/``rtol`` applied, the
    ``required_atol``/``required_rtol`` that would pass, and each metric's value and verdict."""
    outs, _ = _data(outputs, "outputs")
    refs, _ = _data(reference, "reference")
    if outs is None or refs is None:
        raise TypeError("compare: outputs and reference are dicts of arrays (or lists of them)")
    return [
        dict(d)
        for d in _native.compare(
            outs,
            refs,
            **_tolerances(atol, rtol, check_error_stat, error_quantile, metrics),
        )
    ]


class PlanResult:
    """A finished ``plan``: ``front`` (every evaluated point: the uniform baselines, then the
    walk from the cheapest), ``chosen`` (the index of the cheapest point that passed, a walked
    point or a baseline; None when none passed), ``baselines`` (the uniform assignments, each
    with its ``point`` on the front), ``assignment`` (the chosen point's format per layer); ``export()``,
    ``report()``, ``save()`` as the CLI's ``-o``, ``--report``, ``--save-result``."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self._dict: Dict[str, Any] = json.loads(native.result_json())

    @property
    def front(self) -> List[Dict[str, Any]]:
        return list(self._dict["front"])

    @property
    def chosen(self) -> Optional[int]:
        c = self._dict.get("chosen")
        return None if c is None else int(c)

    @property
    def baselines(self) -> List[Dict[str, Any]]:
        return list(self._dict["baselines"])

    @property
    def fusion(self) -> str:
        """The engine fusion every point was emulated under: ``"none"`` or ``"tensorrt"``."""
        return str(self._dict["fusion"])

    @property
    def fusion_regions(self) -> List[Dict[str, Any]]:
        """The fusion regions the chosen point ran with (``name``, ``precision``, ``nodes``);
        empty without a fusion model or a chosen point."""
        return list(self._dict["fusion_regions"])

    @property
    def assignment(self) -> Dict[str, str]:
        """The chosen point's format of each layer (empty when no point passed)."""
        if self.chosen is None:
            return {}
        return dict(self._dict["front"][self.chosen]["layers"])

    def to_dict(self) -> Dict[str, Any]:
        """The ``--save-result`` JSON as a dict (a copy)."""
        return json.loads(json.dumps(self._dict))

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        _write(path, self._native.result_json().encode())

    def export(self, path: Union[str, "os.PathLike[str]", None] = None) -> Any:
        """The chosen point as a strongly typed ONNX model (Q/DQ for int8/fp8, Casts for
        float16/bfloat16): written to ``path`` when given; an ``onnx.ModelProto`` when onnx is
        importable, else bytes. None when no point passed."""
        out = self._native.export()
        if out is None:
            return None
        data, notes = out
        return _deliver_model(data, notes, path)

    def report(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the HTML report (the front plotted, the per-layer table)."""
        _write(path, self._native.html().encode())

    def _repr_html_(self) -> str:
        return str(self._native.html())

    def __repr__(self) -> str:
        return f"PlanResult(points={len(self.front)}, chosen={self.chosen!r})"


def plan(
    model: ModelLike,
    *,
    formats: Union[str, Sequence[str]] = ("fp8", "int8", "fp16"),
    high: str = "float32",
    objective: str = "latency",
    target: Union[str, "os.PathLike[str]"] = "h100",
    inputs: Optional[DataLike] = None,
    seed: Optional[int] = None,
    iterations: Optional[int] = None,
    val_range: Any = None,
    input_shapes: Any = None,
    data_loader_script: Optional[str] = None,
    golden: Optional[DataLike] = None,
    criterion: Optional[Criterion] = None,
    atol: Any = None,
    rtol: Any = None,
    check_error_stat: Any = None,
    error_quantile: Any = None,
    metrics: Any = None,
    calibration_cache: Union[str, "os.PathLike[str]", None] = None,
    calibration_algo: Optional[str] = None,
    jobs: Optional[int] = None,
    cache_budget: str = "auto",
    check: Optional[Check] = None,
    check_timeout: Optional[float] = None,
    decode: Optional[int] = None,
    full_front: bool = False,
    fusion: str = "none",
    executor: Optional[ExecutorLike] = None,
    retries: int = 3,
) -> PlanResult:
    """The cheapest format for every layer (``mixprec plan``, docs/plan.md): ``formats`` among
    fp8, int8, fp16, bf16 (``high``, float32 by default, the safest), ``objective`` latency,
    bytes or effective-bits on ``target`` (h100, b200 or a JSON cost file), under the same
    criterion and data arguments as ``debug_precision`` (``golden``: reference outputs instead of
    the FP32 run; ``criterion(outputs, golden) -> bool`` judges every point instead of the
    tolerances, which still measure its error). Every point of the returned front was
    evaluated; the chosen one (the cheapest that passed) was verified again. ``check``: a
    command (``--check``; ``{model}`` is each point's strongly typed model, e.g. ``"trtexec
    --onnx={model} --stronglyTyped ..."``) or a function ``check(candidate) -> bool`` given a
    ``Candidate`` (as in ``debug_precision``; its ``layer_precisions`` hold every group
    layer's format, ``marked`` the layers in ``high``, ``export(path)`` writes the point's
    model) judges the chosen point and its neighbours by cost,
    then safer points until one passes; the chosen point is then the cheapest it passed, and
    each judged point of ``front`` has its ``"check"`` verdict. ``decode=N``: each input set
    is a prompt and every point generates N tokens (as in ``debug_precision``). The uniform
    baselines (all of one format) are candidates too; the walk stops at the first point that
    costs as much as the cheapest passing one unless ``full_front`` (``--full-front``; always
    with ``check``). ``fusion``: ``"none"`` (every layer rounds its outputs, as ONNX Runtime
    does) or ``"tensorrt"`` (every point emulated under TensorRT's fusion, its regions derived
    from its formats; not with ``check``); ``fusion`` and ``fusion_regions`` of the result say
    what the chosen point assumed.

    ``jobs``: points evaluated at the same time (default 1; with an ``executor``, its worker
    count). ``executor``: judge the points on other processes or machines, as in
    ``debug_precision`` — any ``concurrent.futures.Executor`` (a process pool must spawn its
    workers), ``"ray"`` or ``RayWorkers(n, **actor_options)``. The driver calibrates once and
    sends its ranges to the workers; each worker prepares the plan once (model, inputs,
    golden outputs, cache) and runs ``criterion`` itself on the sensitivity pass, the uniform
    baselines, the walk's and the descent's points and the chosen point's verification; a
    point travels as its layers' precisions. ``check`` (a command or a function, which must
    pickle as ``criterion`` does) runs on the workers too: a worker exports the point with the
    driver's ranges and runs the check there, where the GPU and TensorRT are. The result and
    ``to_dict()`` are those of the same plan without an executor (docs/scale-out.md). A point
    whose worker dies runs again on another, ``retries`` times, then ``WorkerLostError`` names
    it.

    Raises ``ValueError`` on a bad format, target, cost file, objective or fusion model (one
    line naming it), ``TypeError`` when ``criterion`` or ``check`` returns something other
    than a bool; an exception raised by ``criterion`` or ``check`` (on a worker too) reaches
    the caller as itself."""
    m = _Model(model)
    if isinstance(formats, str):
        formats = [f.strip() for f in formats.split(",") if f.strip()]
    if retries < 0:
        raise ValueError(f"retries={retries}: expected 0 or more")
    if jobs is None:
        jobs = 1 if executor is None else _scale.default_workers(executor)
    data = _input_kwargs(inputs, seed, iterations, val_range, input_shapes, data_loader_script)
    golden_sets, golden_path = _data(golden, "golden")
    # What decides a verdict: the driver's plan and every worker's are built from it.
    settings: Dict[str, Any] = dict(
        formats=list(formats),
        high=high,
        objective=objective,
        target=os.fspath(target),
        **data,
        golden=golden_sets,
        golden_path=golden_path,
        criterion=criterion,
        **_tolerances(atol, rtol, check_error_stat, error_quantile, metrics),
        calibration_cache=None if calibration_cache is None else os.fspath(calibration_cache),
        calibration_algo=calibration_algo,
        jobs=jobs,
        cache_budget=cache_budget,
        **_check_kwargs(check),
        check_timeout=check_timeout,
        decode=decode,
        full_front=full_front,
        fusion=fusion,
    )
    started: List[Any] = []
    start: Optional[Callable[[Optional[Dict[str, float]]], Any]] = None
    if executor is not None:
        # The workers' settings, the check with them: it runs on the workers.
        spec = dict(settings, model=m.path, job="plan")
        if m.data is not None:
            spec["model_bytes"] = m.data
        # Refused before any work (calibration), not once the workers start.
        _scale.refuse(executor, dict(spec, amax=None))

        def start_workers(amax: Optional[Dict[str, float]]) -> Any:
            """The workers, started once the driver has calibrated: its ranges travel."""
            dispatch = _scale.dispatcher(executor, dict(spec, amax=amax), jobs, retries)
            started.append(dispatch)
            return dispatch

        start = start_workers

    try:
        native = _emit_warnings(lambda: _native.plan(m.path, **settings, remote=start))
    finally:
        for dispatch in started:
            dispatch.close()
    return PlanResult(native)


def runtime() -> Dict[str, str]:
    """The CPU and the instruction sets the engine's kernels run with on it, as each kernel
    family chose them when the module loaded — what to print beside a timing or attach to a
    report (the same code runs different kernels on different CPUs; numpy's
    ``show_runtime`` answers the same question for numpy).

    Returns a dict: ``cpu`` (the CPU's name, family and model), ``float_kernels`` (the float
    products and convolutions: ``avx512 (...)``, ``avx2+fma`` or ``scalar``),
    ``integer_kernels`` (``avx512-vnni``, ``avx-vnni``, ``avx2`` or ``portable``),
    ``rounding_kernels`` (the emulation's float16/bfloat16 rounding) and ``summary`` (the line
    the benchmarks print)."""
    return dict(_native.kernel_isa())


def plan_cost(
    model: ModelLike,
    mixed: ModelLike,
    *,
    target: Union[str, "os.PathLike[str]"] = "h100",
    objective: str = "latency",
    inputs: Optional[DataLike] = None,
    seed: Optional[int] = None,
    val_range: Any = None,
    input_shapes: Any = None,
    data_loader_script: Optional[str] = None,
) -> Dict[str, Any]:
    """The modeled cost of any mixed-precision model (``mixprec plan MODEL --cost-of MIXED``,
    docs/plan.md): ``mixed`` (another tool's Q/DQ or Casts, or ``plan``'s own export) priced by
    the cost model ``plan`` minimizes, with ``model``'s layers (the float model it was made
    from; layers are matched by node name) on ``target`` (h100, b200 or a JSON cost file).
    The shapes come from the first input set (``inputs`` or the generated one).

    Returns a dict: ``cost`` in ``unit`` by ``objective`` (latency in us, bytes, or
    effective-bits); ``costs`` with every objective (``latency_us``, ``bytes``,
    ``effective_bits``, ``reformats``); ``formats`` (layers per format name) and ``layers``
    (each layer's format). Raises ``FileNotFoundError`` for a missing file and ``ValueError``
    naming the file and the node when the mixed model lacks a layer of ``model`` or holds one
    ``model`` has not."""
    m, x = _Model(model), _Model(mixed)
    data = _input_kwargs(inputs, seed, 1, val_range, input_shapes, data_loader_script)
    text = _emit_warnings(
        lambda: _native.plan_cost(
            m.path,
            x.path,
            objective=objective,
            target=os.fspath(target),
            **data,
        )
    )
    return dict(json.loads(text))
