"""Candidates judged on other processes or machines: ``debug_precision(executor=...)`` and
``plan(executor=...)`` (docs/scale-out.md).

The job runs in the calling process (one driver, the library's); every batch it would
evaluate at once (``jobs``: the needed candidate and the ones it speculates on, or plan's
points) goes to ``_Dispatch``, which hands each candidate to a worker and returns the
verdicts **in the batch's order**, whatever order they finished in. A worker holds the job
prepared once (``mixprec._native.Worker`` or ``PlanWorker``: the model memory-mapped,
inputs, golden outputs, plans, ranges and its value cache), so a candidate travels as a
description: a search's marked node indices, or a plan point's ``([(node, precision),
...], uncached, check)``. A ``check`` (a command or a function) travels in the settings and
runs on the worker.

Workers: a ``concurrent.futures.Executor`` (one prepared search per worker process and
thread, cached under the search's fingerprint), or Ray actors (``"ray"`` or ``RayWorkers``),
created once per search. A worker that dies mid-candidate has the candidate run again on
another (``retries`` times), then the search stops with ``WorkerLostError`` naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
import threading
from concurrent.futures import (
    BrokenExecutor,
    Executor,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    as_completed,
)
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _native

Verdict = Tuple[bool, float, str]
"""(passed, error, summary) of one candidate."""

Spec = Dict[str, Any]
"""The keyword arguments of ``_native.debug_precision`` (or, with ``job="plan"``,
``_native.plan``) a worker is built from."""

Candidate = Any
"""A search's marked node indices (``List[int]``) or a plan point (``(List[Tuple[int, str]],
bool, bool)``): what the native worker's ``evaluate`` takes."""

#: The text ``python/src/lib.rs`` recognises a lost candidate by.
_LOST = "worker(s) died evaluating it"


class WorkerLostError(RuntimeError):
    """The workers evaluating a candidate died more often than ``retries`` allows (the
    message names the candidate's marked layers)."""


class RayWorkers:
    """Ray actors as the search's workers: ``workers`` of them (default: the cluster's
    CPUs), each created with ``actor_options`` (``ray.remote``'s, e.g. ``num_gpus=1`` for a
    criterion that builds an engine on the worker's GPU). ``address`` is given to
    ``ray.init`` when no cluster is connected yet (None: Ray's own default, a running
    cluster or a local one)."""

    def __init__(
        self,
        workers: Optional[int] = None,
        *,
        address: Optional[str] = None,
        **actor_options: Any,
    ) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"RayWorkers: workers={workers}: expected at least 1")
        self.workers = workers
        self.address = address
        self.actor_options = actor_options

    def __repr__(self) -> str:
        return f"RayWorkers(workers={self.workers!r}, address={self.address!r})"


ExecutorLike = Union[str, Executor, RayWorkers]
"""``"ray"``, a ``RayWorkers`` or any ``concurrent.futures.Executor``."""


# ---------------------------------------------------------------------------------------
# The worker's side


def _build_worker(spec: Spec) -> Any:
    """A prepared job (``_native.Worker`` or ``_native.PlanWorker``) from the driver's keyword
    arguments."""
    kwargs = dict(spec)
    model = kwargs.pop("model")
    data = kwargs.pop("model_bytes", None)
    build = _native.plan if kwargs.pop("job", None) == "plan" else _native.debug_precision
    if data is None:
        return build(model, **kwargs, as_worker=True)
    # A model given as bytes travels as bytes; the worker maps its own file, unlinked once
    # loaded (the mapping stays valid).
    fd, path = tempfile.mkstemp(suffix=".onnx", prefix="mixprec-worker-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return build(path, **kwargs, as_worker=True)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


_WORKERS: Dict[Tuple[str, int], Any] = {}
_WORKERS_LOCK = threading.Lock()


def _cached_worker(key: str, spec: Union[bytes, Spec]) -> Any:
    """This process's (and thread's) prepared search for ``key``: built on its first
    candidate, kept for the next; a new search's key drops the others."""
    slot = (key, threading.get_ident())
    with _WORKERS_LOCK:
        worker = _WORKERS.get(slot)
    if worker is None:
        worker = _build_worker(pickle.loads(spec) if isinstance(spec, bytes) else spec)
        with _WORKERS_LOCK:
            for old in [s for s in _WORKERS if s[0] != key]:
                del _WORKERS[old]
            _WORKERS[slot] = worker
    return worker


def _evaluate_task(key: str, spec: Union[bytes, Spec], candidate: Candidate) -> Verdict:
    """One candidate on an executor's worker."""
    passed, error, summary = _cached_worker(key, spec).evaluate(candidate)
    return bool(passed), float(error), str(summary)


class _RayActor:
    """One Ray actor: a prepared search (made a Ray actor class by ``ray.remote`` on use, so
    this module imports without Ray)."""

    def __init__(self, spec: Spec) -> None:
        self.worker = _build_worker(spec)

    def ready(self) -> int:
        return os.getpid()

    def evaluate(self, candidate: Candidate) -> Verdict:
        passed, error, summary = self.worker.evaluate(candidate)
        return bool(passed), float(error), str(summary)


# ---------------------------------------------------------------------------------------
# The driver's side


def _fingerprint(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:32]


def _lost(tries: int, cause: BaseException, spec: Spec) -> WorkerLostError:
    after = (
        "the plan stops here"
        if spec.get("job") == "plan"
        else "the search stops here: its debug replay holds every verdict so far"
    )
    return WorkerLostError(f"{tries} {_LOST} (the last: {type(cause).__name__}: {cause}); {after}")


def _refuse_fork(executor: Executor) -> None:
    if isinstance(executor, ProcessPoolExecutor):
        context = getattr(executor, "_mp_context", None)
        method = context.get_start_method() if context is not None else None
        if method == "fork":
            raise ValueError(
                "executor: this ProcessPoolExecutor forks its workers from a process whose "
                "mixprec thread pool is running; a forked copy has the pool without its "
                "threads and would hang. Create it with "
                "mp_context=multiprocessing.get_context(\"spawn\") (or \"forkserver\")"
            )


def _pickled(executor: Executor, spec: Spec) -> Optional[bytes]:
    """``spec`` pickled for ``executor``'s worker processes; None for a thread pool that
    cannot pickle it (threads take it as it is); else the ``TypeError`` that says why."""
    try:
        return pickle.dumps(spec)
    except Exception as e:  # pickling raises many types (PicklingError, AttributeError...)
        if isinstance(executor, ThreadPoolExecutor):
            return None
        raise TypeError(
            "executor: the search's settings cannot be sent to the executor's worker "
            f"processes ({type(e).__name__}: {e}); define the criterion and the check at "
            "module level (a lambda or a local function does not pickle), or use "
            'executor="ray", which pickles closures'
        ) from e


def refuse(executor: ExecutorLike, spec: Spec) -> None:
    """Raises what ``dispatcher(executor, spec, ...)`` would refuse ``executor`` or ``spec``
    for, without starting any worker (``plan`` starts its workers only once calibrated)."""
    executor = _checked(executor)
    if isinstance(executor, Executor):
        _refuse_fork(executor)
        _pickled(executor, spec)


class _FuturesBackend:
    """Candidates as tasks of a ``concurrent.futures.Executor``."""

    def __init__(self, executor: Executor, spec: Spec, retries: int) -> None:
        _refuse_fork(executor)
        self.executor = executor
        self.owned: Optional[ProcessPoolExecutor] = None
        self.retries = retries
        self.settings = spec
        pickled = _pickled(executor, spec)
        if pickled is None:
            blob = repr(sorted(spec)).encode() + str(id(spec)).encode()
            self.spec: Union[bytes, Spec] = spec
        else:
            blob = pickled
            # Threads share this process: they take the settings as they are.
            self.spec = spec if isinstance(executor, ThreadPoolExecutor) else blob
        self.key = _fingerprint(blob)

    def _current(self) -> Executor:
        return self.owned if self.owned is not None else self.executor

    def _replace_broken_pool(self) -> None:
        """A process pool whose worker died is broken for good: a new one of the same size
        (owned here, shut down with the search) takes its place."""
        current = self._current()
        if isinstance(current, ProcessPoolExecutor):
            workers = getattr(current, "_max_workers", None)
            context = getattr(current, "_mp_context", None)
            if self.owned is not None:
                self.owned.shutdown(wait=False, cancel_futures=True)
            self.owned = ProcessPoolExecutor(max_workers=workers, mp_context=context)

    def run(self, sets: Sequence[Candidate]) -> Iterator[Tuple[int, Any]]:
        """(position, verdict or exception) for each candidate, as each finishes."""
        tries = [0] * len(sets)
        pending = list(range(len(sets)))
        while pending:
            submitted: Dict[Future, int] = {}
            lost: List[Tuple[int, BaseException]] = []
            for k in pending:
                try:
                    future = self._current().submit(_evaluate_task, self.key, self.spec, sets[k])
                except BrokenExecutor as e:
                    lost.append((k, e))
                else:
                    submitted[future] = k
            for future in as_completed(submitted):
                k = submitted[future]
                try:
                    verdict: Any = future.result()
                except BrokenExecutor as e:
                    lost.append((k, e))
                    continue
                except KeyboardInterrupt:
                    raise
                except BaseException as e:  # the criterion's or the engine's: a verdict's error
                    verdict = e
                yield k, verdict
            pending = []
            if lost:
                self._replace_broken_pool()
            for k, cause in sorted(lost, key=lambda x: x[0]):
                tries[k] += 1
                if tries[k] > self.retries:
                    yield k, _lost(tries[k], cause, self.settings)
                else:
                    pending.append(k)

    def close(self) -> None:
        if self.owned is not None:
            self.owned.shutdown(wait=True, cancel_futures=True)
            self.owned = None


def _ray_death_errors(ray: Any) -> Tuple[type, ...]:
    names = ("RayActorError", "WorkerCrashedError", "ActorUnavailableError", "NodeDiedError")
    return tuple(getattr(ray.exceptions, n) for n in names if hasattr(ray.exceptions, n))


class _RayBackend:
    """Candidates on Ray actors, one prepared search each, created once per search."""

    def __init__(self, how: RayWorkers, spec: Spec, workers: int, retries: int) -> None:
        try:
            import ray
        except ImportError as e:
            raise ImportError(
                'executor="ray" needs Ray: pip install "mixprec[ray]"'
            ) from e
        if not ray.is_initialized():
            ray.init(address=how.address, include_dashboard=False, log_to_driver=False)
        self.ray = ray
        self.deaths = _ray_death_errors(ray)
        self.retries = retries
        self.options = dict(how.actor_options)
        self.cls = ray.remote(_RayActor)
        self.settings = spec
        self.spec_ref = ray.put(spec)
        self.actors = [self._new_actor() for _ in range(workers)]
        # Every actor prepared (or the error that stopped one, as itself).
        try:
            ray.get([a.ready.remote() for a in self.actors])
        except self.deaths as e:
            self.close()
            cause = getattr(e, "cause", None) or e
            raise RuntimeError(f"mixprec: a Ray worker could not prepare the search: {cause}") from e

    def _new_actor(self) -> Any:
        return self.cls.options(max_restarts=0, max_task_retries=0, **self.options).remote(self.spec_ref)

    def run(self, sets: Sequence[Candidate]) -> Iterator[Tuple[int, Any]]:
        """(position, verdict or exception) for each candidate, as each finishes."""
        ray = self.ray
        tries = [0] * len(sets)
        waiting: Dict[Any, Tuple[int, int, Any]] = {}

        def submit(k: int, slot: int) -> None:
            actor = self.actors[slot]
            waiting[actor.evaluate.remote(sets[k])] = (k, slot, actor)

        # The k-th set on the k-th actor (a batch is at most `jobs` sets, one per actor; a
        # longer one queues on the actors in turn).
        for k in range(len(sets)):
            submit(k, k % len(self.actors))
        while waiting:
            done, _ = ray.wait(list(waiting), num_returns=1)
            ref = done[0]
            k, slot, actor = waiting.pop(ref)
            try:
                verdict: Any = tuple(ray.get(ref))
            except self.deaths as e:
                # A dead actor is replaced once, by whichever of its calls noticed it first.
                if self.actors[slot] is actor:
                    self.actors[slot] = self._new_actor()
                tries[k] += 1
                if tries[k] > self.retries:
                    yield k, _lost(tries[k], e, self.settings)
                else:
                    submit(k, slot)
                continue
            except KeyboardInterrupt:
                raise
            except ray.exceptions.RayTaskError as e:
                # The criterion's exception, as itself.
                cause = getattr(e, "cause", None)
                verdict = cause if isinstance(cause, BaseException) else e
            yield k, verdict

    def close(self) -> None:
        for a in self.actors:
            try:
                self.ray.kill(a)
            except Exception:
                pass
        self.actors = []


class _Dispatch:
    """What the native job calls with each batch: it yields (position, verdict) as each
    candidate finishes; the native side puts them back in the batch's order."""

    def __init__(self, backend: Union[_FuturesBackend, _RayBackend]) -> None:
        self.backend = backend
        self.batches = 0
        self.candidates = 0

    def __call__(self, sets: List[Candidate]) -> Iterator[Tuple[int, Any]]:
        self.batches += 1
        self.candidates += len(sets)
        return self.backend.run(sets)

    def close(self) -> None:
        self.backend.close()


def _checked(executor: Any) -> Union[Executor, RayWorkers]:
    """``executor`` as an ``Executor`` or ``RayWorkers`` (``"ray"`` is ``RayWorkers()``), or
    the error that names what was given."""
    if isinstance(executor, str):
        if executor != "ray":
            raise ValueError(
                f"executor '{executor}': expected \"ray\", a mixprec.RayWorkers or a "
                "concurrent.futures.Executor"
            )
        return RayWorkers()
    if isinstance(executor, (RayWorkers, Executor)):
        return executor
    raise TypeError(
        f"executor: expected \"ray\", a mixprec.RayWorkers or a concurrent.futures.Executor, "
        f"got {type(executor).__name__}"
    )


def default_workers(executor: ExecutorLike) -> int:
    """The batch size (``jobs``) an executor's workers take by default: its worker count."""
    executor = _checked(executor)
    if isinstance(executor, RayWorkers):
        if executor.workers is not None:
            return executor.workers
        try:
            import ray
        except ImportError as e:
            raise ImportError('executor="ray" needs Ray: pip install "mixprec[ray]"') from e
        if not ray.is_initialized():
            ray.init(address=executor.address, include_dashboard=False, log_to_driver=False)
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    workers = getattr(executor, "_max_workers", None)
    return int(workers) if workers else (os.cpu_count() or 1)


def dispatcher(executor: ExecutorLike, spec: Spec, jobs: int, retries: int) -> _Dispatch:
    """The dispatcher of a search's batches to ``executor``'s workers."""
    if retries < 0:
        raise ValueError(f"retries={retries}: expected 0 or more")
    executor = _checked(executor)
    if isinstance(executor, RayWorkers):
        return _Dispatch(_RayBackend(executor, spec, executor.workers or jobs, retries))
    return _Dispatch(_FuturesBackend(executor, spec, retries))


# What depends on how a search was spread, not on its answer: the driver's own work (candidates
# evaluated ahead of need with jobs > 1, the layers its cache executed) and the times.
DRIVER_COUNTERS = (
    "wall_seconds",
    "fp32_inference_seconds",
    "speculative_evaluations",
    "layer_executions",
    "layer_executions_without_cache",
    "cache_peak_bytes",
    "cache_evictions",
)


def comparable(result: Dict[str, Any]) -> Dict[str, Any]:
    """A search's ``--save-result`` dict without the model path and the driver's counters:
    what is the same for any executor and number of workers (the tests', the two-node
    script's and the benchmark's check)."""
    r: Dict[str, Any] = json.loads(json.dumps(result))
    r.pop("model", None)
    for k in DRIVER_COUNTERS:
        r["stats"].pop(k, None)
    return r
