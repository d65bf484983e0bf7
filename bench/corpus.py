#!/usr/bin/env python3
"""The real-model corpus benchmark, driven by bench/corpus.sh (see there).

Usage: corpus.py MIXPREC_BIN CACHE_DIR WORK_DIR THREADS

For every model of tests/fixtures/real_models.json: does it load; FP32 max error against ONNX
Runtime on the same inputs (max |mixprec - ort| / max |ort|); FP32 median latency of mixprec
and ORT (benches/latency.rs and bench/ort_latency.py, same inputs and thread count); the
emulated all-float16 run's verdict under the task-level criterion and its error against FP32;
`debug precision --fp16 --mode minimal` with the strict and the task-level criterion: answer
size, evaluations and wall time of the command. Prints a Markdown table.
"""
import json
import math
import os
import re
import subprocess
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from polygraphy.json import load_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gen_args(m):
    a = ["--input-shapes", *m["shapes"]]
    g = m["gen"]
    if len(g) == 1 and g[0].startswith("@"):
        a += ["--data-loader-script", f"{ROOT}/tests/fixtures/real_model_inputs.py:{g[0][1:]}"]
    else:
        a += ["--val-range", *g]
    return a


TIME = "/usr/bin/time"


def run(cmd, env=None):
    """Runs `cmd`; returns the completed process, its wall time and its peak RSS in MB.

    The RSS comes from GNU time when it is installed: wait4's figure for a child forked from
    this Python process counts Python's own pages (up to ~60 MB) until the child execs."""
    timed = os.path.exists(TIME)
    full = [TIME, "-f", "MIXPREC_PEAK_RSS_KB %M", *cmd] if timed else cmd
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(full, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        p = subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status), out.read(), err.read())
    p.rss_mb = usage.ru_maxrss / 1024
    if timed:
        m = re.search(r"MIXPREC_PEAK_RSS_KB (\d+)\s*$", p.stderr)
        if m:
            p.rss_mb = int(m.group(1)) / 1024
            p.stderr = p.stderr[: m.start()]
        p.stderr = re.sub(r"Command (exited with non-zero status \d+|terminated by signal \d+)\n$", "", p.stderr)
    return p, wall


def search_bound(k, n):
    """Issue 10's evaluation bound for an answer of k of n candidates: 1.2·(k·log2(n/k) + k)."""
    return 1.2 * (k * math.log2(n / k) + k) if k else 1.2


def scaled(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    s = max(np.abs(b).max(initial=0.0), 1e-30)
    return float(np.abs(a - b).max(initial=0.0) / s)


def main():
    mix, cache, work, threads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    table = json.load(open(f"{ROOT}/tests/fixtures/real_models.json"))
    os.makedirs(work, exist_ok=True)
    rows, timed = [], []
    for m in table:
        name, path = m["name"], os.path.join(cache, m["file"])
        row = {"name": name}
        rows.append(row)
        d = os.path.join(work, name)
        os.makedirs(d, exist_ok=True)
        link = os.path.join(work, f"{name}.onnx")
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(path, link)
        npz, fp32_json = os.path.join(d, "inputs.npz"), os.path.join(d, "fp32.json")
        p, _ = run([mix, "run", path, *gen_args(m), "--threads", threads, "--save-inputs", npz, "--save-outputs", fp32_json])
        row["run_rss"] = p.rss_mb
        if p.returncode != 0:
            err = (p.stdout + p.stderr).strip().splitlines()
            row["loads"] = "no: " + ", ".join(re.findall(r"'([A-Za-z]+)' \(domain", err[-1] if err else "")) or "no"
            continue
        row["loads"] = "yes"
        # Inputs as input_K.pb in the session's input order (benches/latency.rs, ort_latency.py).
        feeds = dict(np.load(npz))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads)
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        for k, meta in enumerate(sess.get_inputs()):
            with open(os.path.join(d, f"input_{k}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(feeds[meta.name], meta.name).SerializeToString())
        want = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
        results = load_json(fp32_json)
        got = results[0][1][0]  # first runner, first iteration
        row["fp32_err"] = max(scaled(got[o.name], w) for o, w in zip(sess.get_outputs(), want))
        timed.append(name)
        # Emulated float16 under the task-level criterion.
        metrics = os.path.join(d, "fp16.json")
        p, _ = run([mix, "run", path, "--load-inputs", npz, "--threads", threads, "--trt", "--fp16", "--onnxrt",
                    *m["task"], "--save-error-metrics", metrics])
        v = json.load(open(metrics))
        row["fp16_pass"] = v["passed"]
        errs = []
        for o in v["iterations"][0]["outputs"]:
            ref = o["reference_stats"]
            mx = max(abs(ref["min"] or 0), abs(ref["max"] or 0), 1e-30)
            errs.append(float("inf") if o["max_absdiff"] is None else o["max_absdiff"] / mx)
        row["fp16_err"] = max(errs)
        for kind in ("strict", "task"):
            res = os.path.join(d, f"{kind}.json")
            p, wall = run([mix, "debug", "precision", path, "--load-inputs", npz, "--threads", threads, "--fp16",
                           "--mode", "minimal", *m[kind], "--save-result", res])
            ev = re.search(r"Search: (\d+) evaluation", p.stdout)
            saved = json.load(open(res)) if p.returncode == 0 and os.path.exists(res) else None
            layers = None if saved is None else saved["layers"]
            row[kind] = (None if layers is None else len(layers), ev and int(ev.group(1)), wall,
                         saved and saved.get("candidates"), p.rss_mb)
    # Latency: both engines on the same input files and thread count.
    # ROUNDS (default 3) alternating runs of the two engines, each engine's lowest median kept
    # (bench/run.sh says why); the emulated runs are timed in every round, each against that
    # round's FP32 run, and the median of those ratios is kept.
    lat_mix, lat_ort = {}, {}
    emulated_ratios = {}
    if timed:
        env = dict(os.environ, RAYON_NUM_THREADS=threads)

        def keep_lowest(into, stdout):
            for j in map(json.loads, stdout.strip().splitlines()):
                for p in ("fp16", "bf16", "int8", "fp8"):
                    if j.get(p + "_median_ms"):
                        emulated_ratios.setdefault((j["model"], p), []).append(j[p + "_median_ms"] / j["median_ms"])
                if j["model"] not in into:
                    into[j["model"]] = j
                else:
                    b = into[j["model"]]
                    b["median_ms"] = min(b["median_ms"], j["median_ms"])
                    b["min_ms"] = min(b["min_ms"], j["min_ms"])

        def round_trip():
            # benches/latency.rs `round_trip`: 40-110 ns with a shared L3, ~350 in the slow mode.
            p = subprocess.run(["cargo", "bench", "--quiet", "--bench", "latency", "--", "--core-round-trip"],
                               capture_output=True, text=True, cwd=ROOT)
            return json.loads(p.stdout)["core_round_trip_ns"] if p.returncode == 0 else None

        trips = [round_trip()]
        for _ in range(int(os.environ.get("ROUNDS", "3"))):
            p = subprocess.run(["cargo", "bench", "--quiet", "--bench", "latency", "--", work, *timed],
                               capture_output=True, text=True, env=env, cwd=ROOT)
            keep_lowest(lat_mix, p.stdout)
            p = subprocess.run([sys.executable, f"{ROOT}/bench/ort_latency.py", work, threads, *timed],
                               capture_output=True, text=True)
            keep_lowest(lat_ort, p.stdout)
        trips.append(round_trip())

    # The CPU and the instruction sets mixprec's kernels run with on it (src/ops/isa.rs).
    p = subprocess.run(["cargo", "bench", "--quiet", "--bench", "latency", "--", "--cpu"],
                       capture_output=True, text=True, cwd=ROOT)
    print("cpu: " + (json.loads(p.stdout)["kernels"] if p.returncode == 0 else "unknown"))
    print(f"threads={threads}")
    if timed and None not in trips:
        slow = max(trips) >= 250
        print(f"core round trip before / after the latency runs: {trips[0]:.0f} / {trips[1]:.0f} ns"
              + (" (>= 250: the cores have separate L3 caches, the machine's slow mode; mixprec's two-thread"
                 " times inflate ~1.4x, ORT's ~1.1x)" if slow else ""))
    print("| model | loads | FP32 err vs ORT | mixprec ms | ORT ms | ratio | emulated FP16 / BF16 / INT8 / FP8 ÷ FP32 | FP16 (task) | FP16 err | strict: layers / evals (bound) / s / RSS × run | task: layers / evals (bound) / s / RSS × run |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        n = r["name"]
        if r["loads"] != "yes":
            print(f"| {n} | {r['loads']} | | | | | | | | | |")
            continue
        a, o = lat_mix.get(n, {}).get("median_ms"), lat_ort.get(n, {}).get("median_ms")
        lat = f"{a:.2f} | {o:.2f} | {a / o:.2f}" if a and o else "? | ? | ?"
        emulated = [emulated_ratios.get((n, p)) for p in ("fp16", "bf16", "int8", "fp8")]
        emul = " / ".join(f"{statistics.median(r):.2f}" if r else "-" for r in emulated) if n in lat_mix else "?"

        def s(t):
            k, e, w, cands, rss = t
            if k is None:
                return "failed"
            bound = f" ({search_bound(k, cands):.0f})" if cands else ""
            rel = f" / {rss / r['run_rss']:.1f}" if rss and r.get("run_rss") else ""
            return f"{k} / {e}{bound} / {w:.1f}{rel}"

        print(f"| {n} | yes | {r['fp32_err']:.1e} | {lat} | {emul} | {'pass' if r['fp16_pass'] else 'fail'} | "
              f"{r['fp16_err']:.1e} | {s(r['strict'])} | {s(r['task'])} |")


if __name__ == "__main__":
    main()
