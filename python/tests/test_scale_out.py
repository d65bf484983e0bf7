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
