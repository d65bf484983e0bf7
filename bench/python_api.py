#!/usr/bin/env python3
"""The Python API against the CLI on the corpus searches (bench/python_api.sh).

Usage: python_api.py MIXPREC_BIN THREADS CORPUS_CACHE [ROUNDS]

Per real-corpus model (tests/fixtures/real_models.json, strict criterion, --mode minimal, the
inputs saved once as .npz and loaded by both):
- the CLI (`mixprec debug precision ... --save-result`, a process) and `mixprec.debug_precision`
  (in this process) in alternating rounds, each's fastest wall time, their ratio (the Python
  path's overhead), and whether both answer the same JSON (times and the model path aside);
- a criterion callback's cost: the same search under `--check-error-stat max --rtol 0` (pass
  iff max |out - golden| <= atol) built in and as a Python `criterion=` giving the same
  verdicts (so both take the same trials), the difference in wall time divided by the
  criterion's calls: the cost of handing the outputs to Python (numpy arrays) plus the
  numpy check itself, which is timed apart inside the callback.
Prints a Markdown table and the CPU it ran on.
"""
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import ROOT, gen_args, run  # noqa: E402

import mixprec  # noqa: E402


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def kwargs_of(flags):
    """CLI criterion flags as debug_precision's keyword arguments."""
    out, key = {}, None
    for f in flags:
        if f.startswith("--"):
            key, _, value = f[2:].partition("=")
            key = {"metric": "metrics"}.get(key.replace("-", "_"), key.replace("-", "_"))
            out[key] = []
            if value:
                out[key].append(value)
        else:
            out[key].append(f)
    return out


def comparable(result):
    r = json.loads(json.dumps(result))
    r.pop("model", None)
    for k in ("wall_seconds", "fp32_inference_seconds"):
        r["stats"].pop(k, None)
    return r


def main():
    mix, threads, cache = sys.argv[1], sys.argv[2], sys.argv[3]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    work = os.path.join(ROOT, "target", "bench-python")
    os.makedirs(work, exist_ok=True)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical cores; threads={threads}; best of {rounds} alternating rounds")
    print()
    print("| model | evals | CLI s | Python s | Python / CLI | same JSON | criterion calls | built-in s | callback s | per call ms (numpy check ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ratios = []
    for m in json.load(open(f"{ROOT}/tests/fixtures/real_models.json")):
        name, path = m["name"], os.path.join(cache, m["file"])
        npz = os.path.join(work, f"{name}.npz")
        p, _ = run([mix, "run", path, *gen_args(m), "--threads", threads, "--save-inputs", npz])
        if p.returncode != 0:
            print(f"| {name} | does not run | | | | | | | | |")
            continue
        strict = m["strict"]
        res = os.path.join(work, f"{name}.json")
        cli_cmd = [mix, "debug", "precision", path, "--load-inputs", npz, "--threads", threads, "--fp16",
                   "--mode", "minimal", *strict, "--save-result", res]
        kw = dict(precision="float16", inputs=npz, mode="minimal", progress=False, **kwargs_of(strict))
        cli_t, py_t, py = [], [], None
        for _ in range(rounds):
            p, wall = run(cli_cmd)
            cli_t.append(wall if p.returncode == 0 else float("nan"))
            t = time.perf_counter()
            py = mixprec.debug_precision(path, **kw)
            py_t.append(time.perf_counter() - t)
        same = os.path.exists(res) and comparable(json.load(open(res))) == comparable(py.to_dict())
        ratio = min(py_t) / min(cli_t)
        ratios.append(ratio)
        # The callback's cost: identical verdicts built in and in Python.
        atol = float(kwargs_of(strict).get("atol", ["1e-5"])[0])
        maxabs = dict(kw, check_error_stat="max", atol=atol, rtol=0)
        calls, inside = [0], [0.0]

        def criterion(outputs, golden):
            t0 = time.perf_counter()
            calls[0] += 1
            ok = all(
                float(np.max(np.abs(o[k].astype(np.float64) - g[k].astype(np.float64)), initial=0.0)) <= atol
                for o, g in zip(outputs, golden) for k in g
            )
            inside[0] += time.perf_counter() - t0
            return ok

        built, cb = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            a = mixprec.debug_precision(path, **maxabs)
            built.append(time.perf_counter() - t)
            calls[0], inside[0] = 0, 0.0
            t = time.perf_counter()
            b = mixprec.debug_precision(path, criterion=criterion, **maxabs)
            cb.append(time.perf_counter() - t)
        same_trials = [(t["marked"], t["passed"]) for t in a.history] == [(t["marked"], t["passed"]) for t in b.history]
        per_call = (min(cb) - min(built)) / max(calls[0], 1) * 1e3
        print(f"| {name} | {py.evaluations} | {min(cli_t):.3f} | {min(py_t):.3f} | {ratio:.3f} | {'yes' if same else 'NO'} "
              f"| {calls[0]}{'' if same_trials else ' (trials differ)'} | {min(built):.3f} | {min(cb):.3f} "
              f"| {per_call:.2f} ({inside[0] / max(calls[0], 1) * 1e3:.2f}) |")
    if ratios:
        ratios.sort()
        print()
        print(f"Python / CLI wall time: median {ratios[len(ratios) // 2]:.3f}, max {ratios[-1]:.3f} over {len(ratios)} searches")


if __name__ == "__main__":
    main()
