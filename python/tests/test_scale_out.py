"""A search whose candidates run on other processes and machines (``executor=``,
docs/scale-out.md): the answer, the trials and the result file are those of the serial
search, workers that die lose nothing, and the CLI's ``--check`` runs through a stand-in for
Slurm's ``srun``. The Ray tests run on a real local Ray instance (skipped only where Ray is
not installed: scripts/setup-python.sh installs it for the test suite)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import pytest

import mixprec
from mixprec._scale import comparable

ROOT = Path(__file__).resolve().parents[2]
RANGE = "[1,2]"
# Worker processes start fresh: a forked one would copy the driver's thread pool without its
# threads (mixprec refuses a forking pool, see test_bad_executors_are_refused).
SPAWN = multiprocessing.get_context("spawn")


def pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(workers, mp_context=SPAWN)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gen_models.py"),
            "--out",
            str(out),
            "--only",
            "needs_constraints,planted_square",
            "--no-ort",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


class Close:
    """A picklable criterion: every output within 1e-2 of the golden one. ``die`` names a
    marker file: the first worker process (never the driver, ``driver``) that finds it
    missing creates it and dies at once, mid-candidate; ``always_die`` kills every worker."""

    def __init__(self, driver: int, die: Optional[str] = None, always_die: bool = False) -> None:
        self.driver = driver
        self.die = die
        self.always_die = always_die

    def __call__(self, outputs: List[Dict[str, np.ndarray]], golden: List[Dict[str, np.ndarray]]) -> bool:
        if os.getpid() != self.driver:
            if self.always_die:
                os._exit(3)
            if self.die is not None:
                try:
                    fd = os.open(self.die, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass
                else:
                    os.close(fd)
                    os._exit(3)
        return all(
            np.allclose(o[k], g[k], rtol=1e-2, atol=1e-2) for o, g in zip(outputs, golden) for k in g
        )


class Broken:
    """A criterion that raises on the workers (on the driver, where the ranking runs, it
    judges as ``Close``)."""

    def __init__(self, driver: int) -> None:
        self.driver = driver

    def __call__(self, outputs: Any, golden: Any) -> bool:
        if os.getpid() != self.driver:
            raise ZeroDivisionError("my metric divided by zero on a worker")
        return Close(self.driver)(outputs, golden)


def search(model: Path, **kw: Any) -> mixprec.SearchResult:
    kw.setdefault("criterion", Close(os.getpid()))
    return mixprec.debug_precision(
        model, precision="float16", val_range=RANGE, iterations=2, progress=False, **kw
    )


@pytest.mark.parametrize("mode", ["minimal", "bisect"])
def test_a_process_pool_gives_the_serial_search(models: Path, mode: str) -> None:
    model = models / "planted_square.onnx"
    serial = search(model, mode=mode)
    assert serial.outcome == "found" and serial.layers
    with pool(2) as workers:
        pooled = search(model, mode=mode, executor=workers)
        # More workers than one batch needs: the same search again (the workers kept the
        # prepared search of the first: same fingerprint).
        pooled4 = search(model, mode=mode, executor=workers, jobs=4)
    with ThreadPoolExecutor(3) as threads:
        threaded = search(model, mode=mode, executor=threads)
    for other in (pooled, pooled4, threaded):
        assert comparable(other.to_dict()) == comparable(serial.to_dict())
        assert other.history == serial.history


def test_the_built_in_comparison_and_a_model_in_memory_on_workers(models: Path) -> None:
    model = models / "needs_constraints.onnx"
    serial = mixprec.debug_precision(model, precision="float16", val_range=RANGE, atol=1e-2, progress=False)
    with pool(2) as workers:
        pooled = mixprec.debug_precision(
            model.read_bytes(), precision="float16", val_range=RANGE, atol=1e-2, progress=False,
            executor=workers,
        )
    assert serial.outcome == "found"
    assert comparable(pooled.to_dict()) == comparable(serial.to_dict())


def test_a_criterion_error_on_a_worker_reaches_the_caller_as_itself(models: Path) -> None:
    with pool(2) as workers:
        with pytest.raises(ZeroDivisionError, match="on a worker") as info:
            search(models / "planted_square.onnx", criterion=Broken(os.getpid()), executor=workers)
    if sys.version_info >= (3, 11):
        # The search says which candidate it was.
        assert any("marked layer(s)" in n for n in info.value.__notes__), info.value.__notes__


def test_a_dead_process_pool_worker_loses_nothing(models: Path, tmp_path: Path) -> None:
    model = models / "planted_square.onnx"
    serial = search(model)
    marker = tmp_path / "died"
    with pool(2) as workers:
        r = search(model, criterion=Close(os.getpid(), die=str(marker)), executor=workers)
    assert marker.exists(), "a worker died mid-candidate"
    assert comparable(r.to_dict()) == comparable(serial.to_dict())


def test_workers_that_keep_dying_stop_the_search_naming_the_candidate(models: Path) -> None:
    with pool(2) as workers:
        with pytest.raises(mixprec.WorkerLostError, match=r"marked layer\(s\).*2 worker\(s\) died"):
            search(
                models / "planted_square.onnx",
                criterion=Close(os.getpid(), always_die=True),
                executor=workers,
                retries=1,
            )


def test_a_resumed_search_evaluates_no_known_candidate_again(models: Path, tmp_path: Path) -> None:
    model = models / "planted_square.onnx"
    replay = tmp_path / "replay.json"
    with pool(2) as workers:
        first = search(model, executor=workers, save_debug_replay=replay)
        recorded = json.loads(replay.read_text())["evaluations"]
        assert len(recorded) >= first.evaluations
        # Every worker evaluation now raises: the resumed search must answer from the replay.
        resumed = search(
            model, criterion=Broken(os.getpid()), executor=workers, load_debug_replay=replay
        )
    def verdicts(r: mixprec.SearchResult) -> List[Any]:
        return [{k: v for k, v in t.items() if k != "summary"} for t in r.history]

    assert verdicts(resumed) == verdicts(first)
    assert all(t["summary"].startswith("(replayed)") for t in resumed.history)
    assert resumed.layers == first.layers


def test_bad_executors_are_refused(models: Path) -> None:
    with pytest.raises(ValueError, match="executor 'dask'"):
        search(models / "planted_square.onnx", executor="dask")
    with pytest.raises(TypeError, match="executor: expected"):
        search(models / "planted_square.onnx", executor=42)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as forking:
        with pytest.raises(ValueError, match="forks its workers"):
            search(models / "planted_square.onnx", executor=forking)
    with pool(1) as workers:
        with pytest.raises(TypeError, match="cannot be sent to the executor's worker processes"):
            search(models / "planted_square.onnx", criterion=lambda o, g: True, executor=workers)


# ---------------------------------------------------------------------------------------
# Ray


def test_a_two_node_ray_cluster(models: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    if shutil.which("ray", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("the ray command is not installed beside the interpreter")
    p = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ray_two_nodes.sh"), str(models / "planted_square.onnx")],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"),
    )
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    assert "two-node search: the serial answer" in p.stdout, p.stdout[-4000:]


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    # The criteria of this module travel by value (Ray's workers cannot import it).
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # A new local instance ("local"), whatever cluster this machine ran before.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def test_ray_actors_give_the_serial_search(models: Path, ray_local: Any) -> None:
    model = models / "planted_square.onnx"
    serial = search(model)
    on_ray = search(model, executor="ray")
    assert on_ray.history == serial.history
    assert comparable(on_ray.to_dict()) == comparable(serial.to_dict())
    # A closure travels too (Ray pickles it with cloudpickle).
    driver = os.getpid()
    three = search(
        model,
        executor=mixprec.RayWorkers(3),
        criterion=lambda o, g: Close(driver)(o, g),
    )
    assert comparable(three.to_dict()) == comparable(serial.to_dict())


def test_a_ray_worker_killed_mid_candidate_loses_nothing(
    models: Path, ray_local: Any, tmp_path: Path
) -> None:
    model = models / "planted_square.onnx"
    serial = search(model)
    marker = tmp_path / "died"
    r = search(model, criterion=Close(os.getpid(), die=str(marker)), executor=mixprec.RayWorkers(2))
    assert marker.exists(), "a Ray worker died mid-candidate"
    assert comparable(r.to_dict()) == comparable(serial.to_dict())
    with pytest.raises(mixprec.WorkerLostError, match=r"marked layer\(s\)"):
        search(
            model,
            criterion=Close(os.getpid(), always_die=True),
            executor=mixprec.RayWorkers(2),
            retries=1,
        )


def test_a_criterion_error_on_a_ray_worker_reaches_the_caller_as_itself(
    models: Path, ray_local: Any
) -> None:
    with pytest.raises(ZeroDivisionError, match="on a worker"):
        search(models / "planted_square.onnx", criterion=Broken(os.getpid()), executor="ray")


def test_plan_on_ray_actors_gives_the_serial_plan(ray_local: Any) -> None:
    serial = plan(criterion=Snr(os.getpid()))
    assert plan(criterion=Snr(os.getpid()), executor="ray").to_dict() == serial.to_dict()
    driver = os.getpid()
    three = plan(criterion=lambda o, g: Snr(driver)(o, g), executor=mixprec.RayWorkers(3))
    assert three.to_dict() == serial.to_dict()


# ---------------------------------------------------------------------------------------
# plan(executor=...): the sensitivity pass, the walk, the verification and the baselines on
# workers


PLAN_MODEL = ROOT / "examples" / "transformer.onnx"


class Snr:
    """A picklable plan criterion: every output's SNR above ``db`` (the driver never judges
    with an executor; ``die`` and ``always_die`` kill workers as ``Close``'s do)."""

    def __init__(self, driver: int, db: float = 30.0, die: Optional[str] = None,
                 always_die: bool = False) -> None:
        self.driver = driver
        self.db = db
        self.close = Close(driver, die=die, always_die=always_die)

    def __call__(self, outputs: List[Dict[str, np.ndarray]], golden: List[Dict[str, np.ndarray]]) -> bool:
        if os.getpid() != self.driver and (self.close.always_die or self.close.die):
            self.close(outputs, golden)  # dies where Close would
        for o, g in zip(outputs, golden):
            for k in g:
                ref = g[k].astype(np.float64)
                noise = float(np.sum((o[k].astype(np.float64) - ref) ** 2))
                if noise > 0 and 10 * np.log10(float(np.sum(ref**2)) / noise) < self.db:
                    return False
        return True


def plan(**kw: Any) -> mixprec.PlanResult:
    kw.setdefault("metrics", ["snr:30"])
    return mixprec.plan(
        PLAN_MODEL, formats="fp8,int8,fp16", seed=1, iterations=2, atol=1e30, **kw
    )


def test_plan_on_a_process_pool_and_threads_gives_the_serial_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    serial = plan()
    assert serial.chosen is not None and len(serial.front) > 1
    assert serial.to_dict() == plan(jobs=3).to_dict()
    # The workers' settings carry the driver's calibrated ranges (the workers never calibrate).
    specs: List[Dict[str, Any]] = []
    dispatcher = mixprec._scale.dispatcher

    def recording(executor: Any, spec: Dict[str, Any], jobs: int, retries: int) -> Any:
        specs.append(spec)
        return dispatcher(executor, spec, jobs, retries)

    monkeypatch.setattr(mixprec._scale, "dispatcher", recording)
    with pool(2) as workers:
        pooled = plan(executor=workers)
    assert len(specs) == 1 and specs[0]["job"] == "plan" and specs[0]["amax"]
    assert all(isinstance(v, float) for v in specs[0]["amax"].values())
    with pool(2) as workers:
        # More jobs than workers: the same plan, from the workers' kept preparation.
        pooled3 = plan(executor=workers, jobs=3)
    with ThreadPoolExecutor(3) as threads:
        threaded = plan(executor=threads)
    for other in (pooled, pooled3, threaded):
        assert other.to_dict() == serial.to_dict()


def test_plan_runs_a_user_criterion_on_the_workers() -> None:
    serial = plan(criterion=Snr(os.getpid()))
    # The criterion decides: some point fails it, the chosen one passes it.
    assert serial.chosen is not None and not all(p["passed"] for p in serial.front)
    with pool(2) as workers:
        pooled = plan(criterion=Snr(os.getpid()), executor=workers)
    assert pooled.to_dict() == serial.to_dict()
    with ThreadPoolExecutor(2) as threads:
        # Threads need no pickling: a local function works.
        def loose(o: Any, g: Any) -> bool:
            return Snr(os.getpid())(o, g)

        assert plan(criterion=loose, executor=threads).to_dict() == serial.to_dict()


def test_plan_workers_dying_lose_nothing_then_stop_naming_the_point(tmp_path: Path) -> None:
    serial = plan(criterion=Snr(os.getpid()))
    marker = tmp_path / "died"
    with pool(2) as workers:
        survived = plan(criterion=Snr(os.getpid(), die=str(marker)), executor=workers)
    assert marker.exists(), "a worker process died mid-point"
    assert survived.to_dict() == serial.to_dict()
    with pool(2) as workers:
        with pytest.raises(mixprec.WorkerLostError, match=r"the plan point with \d+ layer\(s\) below float32"):
            plan(criterion=Snr(os.getpid(), always_die=True), executor=workers, retries=1)


def test_a_plan_criterion_error_on_a_worker_reaches_the_caller_as_itself() -> None:
    with pool(1) as workers:
        with pytest.raises(ZeroDivisionError, match="on a worker"):
            plan(criterion=Broken(os.getpid()), executor=workers)


def test_plan_refuses_bad_executors_before_any_work() -> None:
    with pytest.raises(ValueError, match="executor 'dask'"):
        plan(executor="dask")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as forking:
        with pytest.raises(ValueError, match="forks its workers"):
            plan(executor=forking)
    with pool(1) as workers:
        with pytest.raises(TypeError, match="cannot be sent to the executor's worker processes"):
            plan(criterion=lambda o, g: True, executor=workers)
    with pytest.raises(ValueError, match="retries"):
        plan(executor="ray", retries=-1)


# ---------------------------------------------------------------------------------------
# The CLI on a cluster scheduler: `--check 'srun ...'`


FAKE_SRUN = """#!/usr/bin/env bash
# A stand-in for Slurm's srun: takes srun's options, picks a "node" (a directory of its own),
# records the allocation and runs the command there as srun runs it (same working directory,
# SLURM_* variables set), exiting with the command's status.
set -u
gres=""
while [ $# -gt 0 ]; do
  case "$1" in
    --gres=*) gres="${1#--gres=}"; shift ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
nodes="$FAKE_SRUN_NODES"
for n in 0 1 2 3; do
  if mkdir "$nodes/node$n.busy" 2>/dev/null; then node=$n; break; fi
done
if [ -z "${node:-}" ]; then echo "fake srun: no free node" >&2; exit 1; fi
echo "node$node gres=$gres $*" >> "$nodes/log"
SLURM_JOB_ID=$$ SLURMD_NODENAME="node$node" CUDA_VISIBLE_DEVICES=0 "$@"
status=$?
rmdir "$nodes/node$node.busy"
exit $status
"""

# The candidate judged as a deployment check would: its mixed-precision model ({model}) run on
# fixed inputs against the FP32 model's outputs (here by mixprec's own runner in a child
# process, standing in for an engine build and run on the node's GPU).
RUN_CHECK = """
import sys
import numpy as np
import mixprec
candidate, reference = sys.argv[1], sys.argv[2]
def run(path):
    return mixprec.run(path, val_range="[1,2]", seed=7, iterations=2)
ok = all(np.allclose(a[k], b[k], rtol=1e-2, atol=1e-2)
         for a, b in zip(run(candidate), run(reference)) for k in b)
sys.exit(0 if ok else 1)
"""


def test_the_cli_checks_through_a_stand_in_srun(models: Path, tmp_path: Path) -> None:
    exe = shutil.which("mixprec", path=str(Path(sys.executable).parent))
    assert exe
    model = models / "planted_square.onnx"
    srun = tmp_path / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(srun.stat().st_mode | stat.S_IEXEC)
    check = tmp_path / "ort_check.py"
    check.write_text(RUN_CHECK)
    nodes = tmp_path / "nodes"
    nodes.mkdir()

    def cli(jobs: int, through_srun: bool) -> Dict[str, Any]:
        out = tmp_path / f"result-{jobs}-{through_srun}.json"
        command = [sys.executable, str(check), "{model}", str(model)]
        if through_srun:
            command = [str(srun), "--gres=gpu:1", "--ntasks=1", *command]
        p = subprocess.run(
            [exe, "debug", "precision", str(model), "--fp16", "--mode", "bisect",
             "--jobs", str(jobs), "--save-result", str(out), "--check", *command],
            capture_output=True,
            text=True,
            env=dict(os.environ, FAKE_SRUN_NODES=str(nodes)),
        )
        assert p.returncode == 0, p.stdout + p.stderr
        return json.loads(out.read_text())

    plain = cli(1, False)
    assert plain["outcome"]["kind"] == "found"
    on_nodes = cli(2, True)
    assert comparable(on_nodes) == comparable(plain)
    log = (nodes / "log").read_text().splitlines()
    # Every candidate (needed or evaluated ahead) went through srun, on its own node.
    evaluated = on_nodes["stats"]["evaluations"] + on_nodes["stats"]["speculative_evaluations"]
    assert len(log) == evaluated, log
    assert all(" gres=gpu:1 " in line for line in log)
    assert {line.split()[0] for line in log} <= {"node0", "node1"}
    assert not list(nodes.glob("*.busy"))


# ---------------------------------------------------------------------------------------
# A check function (`check=callable`): on the driver without an executor, on the workers with
# one


class RunsCandidate:
    """A picklable check function, as a deployment check would be: it writes the candidate's
    model with ``candidate.export`` and runs it on fixed inputs against the FP32 model's
    outputs (mixprec's own runner standing in for a TensorRT engine on the worker's GPU),
    exactly as ``RUN_CHECK`` does for a command. Each call leaves a file named by the process
    that made it in ``calls``."""

    def __init__(self, reference: str, calls: str) -> None:
        self.reference = reference
        self.calls = calls

    def __call__(self, candidate: Any) -> bool:
        import tempfile
        import uuid

        Path(self.calls, f"{os.getpid()}-{uuid.uuid4().hex}").touch()
        assert set(candidate.marked) <= set(candidate.layer_precisions)
        with tempfile.TemporaryDirectory() as d:
            path = candidate.export(os.path.join(d, "candidate.onnx"))
            assert Path(path).read_bytes() == candidate.model_bytes()

            def run(p: str) -> List[Dict[str, np.ndarray]]:
                return mixprec.run(p, val_range="[1,2]", seed=7, iterations=2)

            return all(
                np.allclose(a[k], b[k], rtol=1e-2, atol=1e-2)
                for a, b in zip(run(path), run(self.reference))
                for k in b
            )


class FailsOnWorkers:
    """A check function that raises, or answers ``answer`` (not a bool)."""

    def __init__(self, answer: Any = None) -> None:
        self.answer = answer

    def __call__(self, candidate: Any) -> Any:
        if self.answer is None:
            raise ZeroDivisionError(f"my check divided by zero on candidate {candidate.iteration}")
        return self.answer


def checked(model: Path, check: Any, **kw: Any) -> mixprec.SearchResult:
    return mixprec.debug_precision(
        model, precision="float16", mode="bisect", val_range=RANGE, progress=False,
        check=check, **kw
    )


def callers(calls: Path) -> List[int]:
    return [int(p.name.split("-")[0]) for p in calls.iterdir()]


def verdicts(r: mixprec.SearchResult) -> List[Any]:
    return [{k: v for k, v in t.items() if k != "summary"} for t in r.history]


def test_a_check_function_judges_as_the_same_check_command(models: Path, tmp_path: Path) -> None:
    model = models / "planted_square.onnx"
    script = tmp_path / "ort_check.py"
    script.write_text(RUN_CHECK)
    command = checked(model, [sys.executable, str(script), "{model}", str(model)])
    assert command.outcome == "found" and command.layers
    calls = tmp_path / "serial"
    calls.mkdir()
    serial = checked(model, RunsCandidate(str(model), str(calls)))
    # The same verdicts, answer and trials; only the summaries say who judged.
    assert serial.layers == command.layers
    assert verdicts(serial) == verdicts(command)
    assert all(t["summary"] in ("check returned True", "check returned False") for t in serial.history)
    # On the driver, once per evaluated candidate (jobs judges none ahead for a function).
    assert callers(calls) == [os.getpid()] * serial.evaluations
    ahead = checked(model, RunsCandidate(str(model), str(calls)), jobs=3)
    assert comparable(ahead.to_dict()) == comparable(serial.to_dict())
    assert ahead.to_dict()["stats"]["speculative_evaluations"] == 0
    # On a process pool: the workers call it, with the serial search's answer and trials.
    pooled_calls = tmp_path / "pooled"
    pooled_calls.mkdir()
    with pool(2) as workers:
        pooled = checked(model, RunsCandidate(str(model), str(pooled_calls)), executor=workers)
    assert comparable(pooled.to_dict()) == comparable(serial.to_dict())
    assert pooled.history == serial.history
    assert callers(pooled_calls) and os.getpid() not in callers(pooled_calls)


def test_a_check_function_error_or_non_bool_reaches_the_caller(models: Path) -> None:
    model = models / "planted_square.onnx"
    with pytest.raises(ZeroDivisionError, match="on candidate 1") as info:
        checked(model, FailsOnWorkers())
    if sys.version_info >= (3, 11):
        assert any("raised by the check on candidate 1" in n for n in info.value.__notes__)
    with pytest.raises(TypeError, match=r"the check returned 'yes' \(str\), not a bool"):
        checked(model, FailsOnWorkers("yes"))
    # numpy's bool is a bool.
    passing = checked(model, FailsOnWorkers(np.bool_(True)))
    assert passing.history and all(t["passed"] for t in passing.history)
    with pool(1) as workers:
        with pytest.raises(ZeroDivisionError, match="divided by zero"):
            checked(model, FailsOnWorkers(), executor=workers)
        with pytest.raises(TypeError, match="not a bool"):
            checked(model, FailsOnWorkers(1), executor=workers)


def test_a_check_function_is_refused_where_it_cannot_work(models: Path) -> None:
    model = models / "planted_square.onnx"
    with pytest.raises(ValueError, match="check: a function takes no check_timeout.*cannot be killed"):
        checked(model, FailsOnWorkers(True), check_timeout=60)
    with pytest.raises(ValueError, match="check: a function takes no check_timeout"):
        mixprec.plan(PLAN_MODEL, formats="fp16", seed=1, iterations=1,
                     check=FailsOnWorkers(True), check_timeout=5)
    with pool(1) as workers:
        with pytest.raises(TypeError, match="cannot be sent to the executor's worker processes.*the check"):
            checked(model, lambda c: True, executor=workers)
        with pytest.raises(TypeError, match="cannot be sent to the executor's worker processes"):
            plan(check=lambda c: True, executor=workers)


class NoFp8:
    """A picklable plan check: fails every point with an fp8 layer; writes the point's model
    (it must load as ONNX) and leaves a file named by its process in ``calls``."""

    def __init__(self, calls: str) -> None:
        self.calls = calls

    def __call__(self, candidate: Any) -> bool:
        import tempfile
        import uuid

        import onnx

        Path(self.calls, f"{os.getpid()}-{uuid.uuid4().hex}").touch()
        with tempfile.TemporaryDirectory() as d:
            onnx.checker.check_model(onnx.load(candidate.export(os.path.join(d, "point.onnx"))))
        precisions = candidate.layer_precisions
        assert all(precisions[n] == "float32" for n in candidate.marked)
        return "fp8e4m3" not in precisions.values()


def check_verdicts(r: mixprec.PlanResult) -> List[Any]:
    return [p["check"] for p in r.front]


def test_plan_runs_its_check_on_the_workers(tmp_path: Path) -> None:
    calls = tmp_path / "serial"
    calls.mkdir()
    serial = plan(check=NoFp8(str(calls)))
    judged = [c for c in check_verdicts(serial) if c is not None]
    assert judged and all(c["summary"].startswith("check returned") for c in judged)
    assert callers(calls) == [os.getpid()] * len(judged)
    for n, jobs in [(2, None), (2, 3)]:
        pooled_calls = tmp_path / f"pooled-{n}-{jobs}"
        pooled_calls.mkdir()
        with pool(n) as workers:
            pooled = plan(check=NoFp8(str(pooled_calls)), executor=workers, jobs=jobs)
        assert pooled.to_dict() == serial.to_dict()
        assert check_verdicts(pooled) == check_verdicts(serial)
        assert len(callers(pooled_calls)) == len(judged)
        assert os.getpid() not in callers(pooled_calls)
    # A check command runs on the workers too, with the serial verdicts.
    command = ["sh", "-c", 'test -s "$0"', "{model}"]
    with pool(2) as workers:
        assert plan(check=command, executor=workers).to_dict() == plan(check=command).to_dict()
    # Its exception on a worker reaches the caller as itself.
    with pool(1) as workers:
        with pytest.raises(ZeroDivisionError, match="my check divided by zero"):
            plan(check=FailsOnWorkers(), executor=workers)


def test_check_functions_on_ray_actors(models: Path, ray_local: Any, tmp_path: Path) -> None:
    model = models / "planted_square.onnx"
    calls = tmp_path / "search"
    calls.mkdir()
    serial = checked(model, RunsCandidate(str(model), str(tmp_path)))
    on_ray = checked(model, RunsCandidate(str(model), str(calls)), executor=mixprec.RayWorkers(2))
    assert comparable(on_ray.to_dict()) == comparable(serial.to_dict())
    assert on_ray.history == serial.history
    assert callers(calls) and os.getpid() not in callers(calls)
    plan_calls = tmp_path / "plan"
    plan_calls.mkdir()
    serial_plan = plan(check=NoFp8(str(tmp_path)))
    # A closure travels to Ray's actors (cloudpickle).
    judge = NoFp8(str(plan_calls))
    on_ray_plan = plan(check=lambda c: judge(c), executor=mixprec.RayWorkers(2))
    assert on_ray_plan.to_dict() == serial_plan.to_dict()
    assert callers(plan_calls) and os.getpid() not in callers(plan_calls)
    with pytest.raises(ZeroDivisionError, match="my check divided by zero"):
        checked(model, FailsOnWorkers(), executor="ray")
