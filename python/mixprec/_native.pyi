"""Type stubs of the native module (python/src/lib.rs); use the functions of ``mixprec``."""

from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

class Search:
    """The library's outcome of a ``debug precision`` job."""

    @property
    def interrupted(self) -> bool: ...
    def result_json(self, written: Optional[str] = None) -> str: ...
    def export(self) -> Optional[bytes]: ...
    def export_notes(self) -> List[str]: ...
    def html(self) -> str: ...

def debug_precision(
    model: str,
    *,
    low: Sequence[str],
    higher_precision: str,
    mode: str,
    direction: str,
    objective: str,
    ranking: Optional[str],
    jobs: int,
    group: str,
    inputs: Optional[List[Dict[str, np.ndarray]]],
    load_inputs: Sequence[str],
    seed: Optional[int],
    iterations: Optional[int],
    val_range: Sequence[str],
    input_shapes: Sequence[str],
    data_loader_script: Optional[str],
    golden: Optional[List[Dict[str, np.ndarray]]],
    golden_path: Optional[str],
    criterion: Optional[Callable[[List[Dict[str, np.ndarray]], List[Dict[str, np.ndarray]]], Any]],
    atol: Sequence[str],
    rtol: Sequence[str],
    check_error_stat: Sequence[str],
    error_quantile: Sequence[str],
    metrics: Sequence[str],
    layer_precisions: Sequence[str],
    fusion: str,
    calibration_cache: Optional[str],
    calibration_algo: Optional[str],
    cache_budget: str,
    check: Sequence[str],
    check_timeout: Optional[float],
    load_debug_replay: Optional[str],
    save_debug_replay: Optional[str],
    layer_errors: bool,
    decode: Optional[int],
    progress: Optional[Callable[[Dict[str, Any]], None]],
    on_event: Optional[Callable[[str, str], None]],
    check_function: Optional[Callable[["Candidate"], Any]] = None,
    remote: Optional[Callable[[List[List[int]]], Iterator[Tuple[int, Any]]]] = None,
    as_worker: bool = False,
) -> Any: ...  # a Search; a Worker with as_worker=True

class Candidate:
    """A candidate as a ``check`` function is given it."""

    @property
    def iteration(self) -> int:
        """1-based count of the candidates this check judged (a worker's own on a worker)."""
    @property
    def marked(self) -> List[str]:
        """The layers in the high precision."""
    @property
    def layer_precisions(self) -> Dict[str, str]:
        """Layer name to precision name, for every layer the search decides."""
    def export(self, path: Any) -> Any:
        """Writes the candidate's strongly typed model (a command's ``{model}``), all or
        nothing; returns ``path``."""
    def model_bytes(self) -> bytes:
        """The candidate's model as serialized ONNX bytes."""

class Worker:
    """A search prepared once on a worker (``executor=``): ``evaluate(marked)`` is the verdict
    on the marked node indices, ``(passed, error, summary)``."""

    def evaluate(self, marked: List[int]) -> Tuple[bool, float, str]: ...

def run(
    model: str,
    *,
    inputs: Optional[List[Dict[str, np.ndarray]]],
    load_inputs: Sequence[str],
    seed: Optional[int],
    iterations: Optional[int],
    val_range: Sequence[str],
    input_shapes: Sequence[str],
    data_loader_script: Optional[str],
    low: Sequence[str],
    layer_precisions: Sequence[str],
    fusion: str,
    calibration_cache: Optional[str],
    calibration_algo: Optional[str],
    mark_all: bool,
    decode: Optional[int],
) -> List[Dict[str, np.ndarray]]: ...
def convert(
    model: str,
    *,
    low: Sequence[str],
    layer_precisions: Sequence[str],
    fusion: str,
    calibration_cache: Optional[str],
    calibration_algo: Optional[str],
    inputs: Optional[List[Dict[str, np.ndarray]]],
    load_inputs: Sequence[str],
    seed: Optional[int],
    iterations: Optional[int],
    val_range: Sequence[str],
    input_shapes: Sequence[str],
    data_loader_script: Optional[str],
    keep_io_types: bool,
    fallback: bool,
) -> Tuple[bytes, List[str]]: ...
def quantize(
    model: str,
    *,
    scheme: str,
    block_size: Optional[int],
    exclude_op_types: Sequence[str],
    exclude_nodes: Sequence[str],
    exclude_from: Optional[str],
    calibration_cache: Optional[str],
    calibration_algo: Optional[str],
    percentile: Optional[float],
    inputs: Optional[List[Dict[str, np.ndarray]]],
    load_inputs: Sequence[str],
    seed: Optional[int],
    iterations: Optional[int],
    val_range: Sequence[str],
    input_shapes: Sequence[str],
    data_loader_script: Optional[str],
) -> Tuple[bytes, List[str], List[str]]: ...
def calibrate(
    model: str,
    *,
    inputs: Optional[List[Dict[str, np.ndarray]]],
    load_inputs: Sequence[str],
    seed: Optional[int],
    iterations: Optional[int],
    val_range: Sequence[str],
    input_shapes: Sequence[str],
    data_loader_script: Optional[str],
    algo: Optional[str],
    percentile: Optional[float],
    cache: Optional[str],
    cache_header: Optional[str],
) -> Dict[str, float]: ...
def compare(
    outputs: List[Dict[str, np.ndarray]],
    reference: List[Dict[str, np.ndarray]],
    *,
    atol: Sequence[str],
    rtol: Sequence[str],
    check_error_stat: Sequence[str],
    error_quantile: Sequence[str],
    metrics: Sequence[str],
) -> List[Dict[str, Dict[str, Any]]]: ...
def main(argv: List[str]) -> int: ...

class Plan:
    def result_json(self) -> str: ...
    def export(self) -> Optional[Tuple[bytes, List[str]]]: ...
    def html(self) -> str: ...
    def front_lines(self) -> List[str]: ...

def plan(
    model: str,
    *,
    formats: Sequence[str],
    high: str,
    objective: str,
    target: str,
    inputs: Optional[List[Dict[str, np.ndarray]]],
    load_inputs: Sequence[str],
    seed: Optional[int],
    iterations: Optional[int],
    val_range: Sequence[str],
    input_shapes: Sequence[str],
    data_loader_script: Optional[str],
    golden: Optional[List[Dict[str, np.ndarray]]],
    golden_path: Optional[str],
    criterion: Optional[Callable[[List[Dict[str, np.ndarray]], List[Dict[str, np.ndarray]]], Any]],
    atol: Sequence[str],
    rtol: Sequence[str],
    check_error_stat: Sequence[str],
    error_quantile: Sequence[str],
    metrics: Sequence[str],
    calibration_cache: Optional[str],
    calibration_algo: Optional[str],
    jobs: int,
    cache_budget: str,
    check: Sequence[str],
    check_timeout: Optional[float],
    decode: Optional[int],
    full_front: bool,
    fusion: str,
    check_function: Optional[Callable[["Candidate"], Any]] = None,
    remote: Optional[
        Callable[
            [Optional[Dict[str, float]]],
            Callable[[List[Tuple[List[Tuple[int, str]], bool, bool]]], Iterator[Tuple[int, Any]]],
        ]
    ] = None,
    as_worker: bool = False,
    amax: Optional[Dict[str, float]] = None,
) -> Any: ...  # a Plan; a PlanWorker with as_worker=True

class PlanWorker:
    """A plan prepared once on a worker (``executor=``), with the driver's ranges ``amax``:
    ``evaluate((layers, uncached, check))`` is the verdict on the point whose layers below
    the high precision are ``layers`` (``(node index, precision name)``), judged outside the
    value cache when ``uncached``, by the check (the point exported here) when ``check``:
    ``(passed, error, summary)``."""

    def evaluate(
        self, point: Tuple[List[Tuple[int, str]], bool, bool]
    ) -> Tuple[bool, float, str]: ...

def kernel_isa() -> Dict[str, str]: ...
