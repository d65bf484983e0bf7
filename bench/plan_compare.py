#!/usr/bin/env python3
"""`mixprec plan` against its peers on one model at a time (issue 45 item 5; driven by
bench/plan.sh, which sets up the venvs): mixprec plan (--formats fp8,int8,fp16) at a stated
criterion, NVIDIA ModelOpt's ONNX PTQ (int8, fp8; default exclusions and settings) and
ModelOpt AutoCast (fp16), and AMD Quark's ONNX quantizer where its wheel runs on the CPU, all
calibrated on the same input sets. Per written model:

- modeled latency on H100 by mixprec's cost model (`mixprec.plan_cost`: the model's own Q/DQ and
  float types, matched to the float model's layers by node name), and its ratio to all-float32;
- accuracy: the written model run by ONNX Runtime (CPU, graph optimizations disabled) on
  held-out input sets against the FP32 model's outputs, judged by the same criterion through
  `mixprec.compare` (PASSED/FAILED and the worst metric value over sets and outputs);
- the tool's wall time (a peer's includes its Python start and imports: it runs as its CLI).

A tool that cannot run prints why in its row; no number is made up.

Usage: plan_compare.py --work DIR --corpus-cache DIR [--calib N] [--eval N] [--quark-python PY]
       NAME...   (cnn=PATH, or corpus:NAME)
"""
import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np
import onnx
import onnxruntime as ort

import mixprec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NP_TYPES = {1: np.float32, 6: np.int32, 7: np.int64, 10: np.float16, 11: np.float64}


class Spec:
    """A model of the table: its file, input shapes and ranges, and the criterion."""

    def __init__(self, name, path, shapes, ranges, metrics, criterion):
        self.name, self.path, self.shapes, self.ranges = name, path, shapes, ranges
        self.metrics = metrics  # mixprec metric items, e.g. ["461:cosine:0.9999"]
        self.criterion = criterion  # as printed

    def inputs(self):
        m = onnx.load(self.path, load_external_data=False)
        inits = {t.name for t in m.graph.initializer}
        out = []
        for i in m.graph.input:
            if i.name in inits:
                continue
            t = i.type.tensor_type
            shape = [d.dim_value if d.dim_value > 0 else 1 for d in t.shape.dim]
            out.append((i.name, self.shapes.get(i.name, shape), NP_TYPES[t.elem_type]))
        return out

    def data(self, n, seed):
        rng = np.random.RandomState(seed)
        sets = []
        for _ in range(n):
            d = {}
            for name, shape, dt in self.inputs():
                lo, hi = self.ranges.get(name, self.ranges.get("", (-1.0, 1.0)))
                if np.issubdtype(dt, np.integer):
                    d[name] = rng.randint(int(lo), int(hi) + 1, size=shape).astype(dt)
                else:
                    d[name] = rng.uniform(lo, hi, size=shape).astype(dt)
            sets.append(d)
        return sets


def corpus_spec(name, cache):
    table = {m["name"]: m for m in json.load(open(os.path.join(ROOT, "tests", "fixtures", "real_models.json")))}
    m = table[name]
    shapes, ranges = {}, {}
    for s in m["shapes"]:
        k, _, v = s.rpartition(":")
        shapes[k] = json.loads(v)
    for g in m["gen"]:
        k, _, v = g.rpartition(":")
        ranges[k] = tuple(json.loads(v))
    # The corpus's task criterion (tests/integration/real_models.rs): --atol 1e9 --metric ...
    task = m["task"]
    metrics = task[task.index("--metric") + 1:]
    return Spec(name, os.path.join(cache, m["file"]), shapes, ranges, metrics, " ".join(metrics))


def session(path):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_all(path, data):
    s = session(path)
    names = [o.name for o in s.get_outputs()]
    return [dict(zip(names, s.run(None, d))) for d in data]


def judge(spec, outs, refs):
    """The criterion through mixprec.compare: (passed, worst metric value)."""
    as_f32 = lambda sets: [{k: np.asarray(v).astype(np.float32) if np.issubdtype(np.asarray(v).dtype, np.floating)
                            else np.asarray(v) for k, v in s.items()} for s in sets]
    res = mixprec.compare(as_f32(outs), as_f32(refs), atol=1e9, metrics=spec.metrics)
    passed = all(o["passed"] for r in res for o in r.values())
    values = [m["value"] for r in res for o in r.values() for m in o.get("metrics", [])]
    return passed, (min(values) if values else float("nan"))


def short(e):
    text = str(e).strip()
    # ONNX Runtime's run errors: the node and the last "FAIL : ..." (the cause).
    if "Status Message" in text and "FAIL : " in text:
        node = text.split("Name:", 1)[1].split(" Status", 1)[0] if "Name:" in text else ""
        return f"{node} {text.rsplit('FAIL : ', 1)[1]}"[:220]
    lines = [l for l in text.splitlines() if l.strip()]
    return (lines[-1] if lines else type(e).__name__)[:220]


def save_calib(spec, calib, work):
    """The calibration sets as ModelOpt reads them: one .npy (one input) or .npz, sets stacked
    on the batch axis; and one .npz per set (AutoCast's multi-batch directory)."""
    names = list(calib[0])
    if len(names) == 1:
        stacked = os.path.join(work, "calib.npy")
        np.save(stacked, np.concatenate([d[names[0]] for d in calib], axis=0))
    else:
        stacked = os.path.join(work, "calib.npz")
        np.savez(stacked, **{k: np.concatenate([d[k] for d in calib], axis=0) for k in names})
    sets = os.path.join(work, "calib_sets")
    os.makedirs(sets, exist_ok=True)
    for k, d in enumerate(calib):
        np.savez(os.path.join(sets, f"set_{k:03d}.npz"), **d)
    return stacked, sets


def tool(cmd, out, timeout):
    """Runs a peer's CLI; returns its wall time or raises with its last line."""
    t = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"did not finish in {timeout} s")
    wall = time.perf_counter() - t
    if r.returncode != 0 or not os.path.exists(out):
        text = (r.stderr or "") + (r.stdout or "")
        errs = [l for l in text.splitlines() if "Error" in l or "error" in l]
        raise RuntimeError(short(errs[-1] if errs else text or f"exit {r.returncode}"))
    return wall


QUARK_SCRIPT = r"""
import sys, numpy as np
from quark.onnx import ModelQuantizer
from quark.onnx.quantization.config import Config, get_default_config
from onnxruntime.quantization import CalibrationDataReader
model, out, calib, scheme = sys.argv[1:5]
z = np.load(calib)
sets = [{k: z[k][i:i + 1] for k in z.files} for i in range(len(z[z.files[0]]))]
class Reader(CalibrationDataReader):
    def __init__(self): self.it = iter(sets)
    def get_next(self): return next(self.it, None)
config = Config(global_quant_config=get_default_config(scheme))
ModelQuantizer(config).quantize_model(model, out, Reader())
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--corpus-cache", default="")
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--eval", type=int, default=8)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--quark-python", default="")
    ap.add_argument("--quark-scheme", default="XINT8")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", default="")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    rows = []
    for item in a.models:
        if item.startswith("corpus:"):
            spec = corpus_spec(item[len("corpus:"):], a.corpus_cache)
        else:
            name, _, path = item.partition("=")
            spec = Spec(name, path, {}, {"": (-1.0, 1.0)}, ["cosine:0.9999"], "cosine:0.9999")
        work = os.path.join(a.work, spec.name)
        os.makedirs(work, exist_ok=True)
        calib = spec.data(a.calib, seed=0)
        held_out = spec.data(a.eval, seed=1)
        refs = run_all(spec.path, held_out)
        stacked, sets = save_calib(spec, calib, work)
        shapes = [f"{k}:{json.dumps(v).replace(' ', '')}" for k, v in spec.shapes.items()]
        float_cost = mixprec.plan_cost(spec.path, spec.path, inputs=calib[:1])
        print(f"[I] {spec.name}: criterion {spec.criterion} (--atol 1e9); float32 modeled "
              f"{float_cost['cost']:.4g} us on h100", file=sys.stderr, flush=True)

        def row(tool_name, out, wall=None, error=None, note=""):
            r = {"model": spec.name, "tool": tool_name, "criterion": spec.criterion, "wall_s": wall,
                 "float32_us": float_cost["cost"], "note": note}
            if error is None:
                try:
                    c = mixprec.plan_cost(spec.path, out, inputs=calib[:1])
                    r.update(latency_us=c["cost"], formats=c["formats"], effective_bits=c["costs"]["effective_bits"])
                except Exception as e:  # noqa: BLE001 - printed in the table
                    r["cost_error"] = short(e)
                try:
                    r["passed"], r["metric"] = judge(spec, run_all(out, held_out), refs)
                except Exception as e:  # noqa: BLE001
                    r["run_error"] = short(e)
            else:
                r["error"] = error
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)

        # mixprec plan, in process (the same engine as the CLI), the calibration sets as its
        # input sets (calibration and criterion).
        out = os.path.join(work, "mixprec_plan.onnx")
        t = time.perf_counter()
        try:
            result = mixprec.plan(spec.path, formats="fp8,int8,fp16", target="h100", objective="latency",
                                  inputs=calib, atol=1e9, metrics=spec.metrics, jobs=a.jobs)
            wall = time.perf_counter() - t
            if result.chosen is None:
                row("mixprec plan", None, wall, "no assignment meets the criterion")
            else:
                result.export(out)
                chosen = result.front[result.chosen]
                row("mixprec plan", out, wall, note=f"{len(result.front)} front points")
                base = {b["format"]: b for b in result.baselines}
                rows[-1]["baselines"] = {f: {"us": b["cost"]["latency_us"], "passed": b["passed"]} for f, b in base.items()}
                rows[-1]["modeled_chosen_us"] = chosen["costs"]["latency_us"]
        except Exception as e:  # noqa: BLE001
            row("mixprec plan", None, time.perf_counter() - t, short(e))
        # ModelOpt ONNX PTQ: default exclusions, default high precision (fp16 for the rest).
        for mode in ("int8", "fp8"):
            out = os.path.join(work, f"modelopt_{mode}.onnx")
            cmd = [sys.executable, "-m", "modelopt.onnx.quantization", "--onnx_path", spec.path,
                   "--quantize_mode", mode, "--calibration_data_path", stacked, "--calibration_eps", "cpu",
                   "--output_path", out]
            if spec.shapes:
                cmd += ["--override_shapes", ",".join(f"{k}:{'x'.join(map(str, v))}" for k, v in spec.shapes.items())]
            try:
                row(f"ModelOpt PTQ {mode}", out, tool(cmd, out, a.timeout))
            except Exception as e:  # noqa: BLE001
                row(f"ModelOpt PTQ {mode}", None, None, short(e))
        # ModelOpt AutoCast fp16, I/O kept float32 (as plan's export), the calibration sets as its
        # reference runner's data.
        out = os.path.join(work, "autocast_fp16.onnx")
        cmd = [sys.executable, "-m", "modelopt.onnx.autocast", "--onnx_path", spec.path, "--output_path", out,
               "--low_precision_type", "fp16", "--keep_io_types", "--calibration_data", sets, "--providers", "cpu"]
        try:
            row("ModelOpt AutoCast fp16", out, tool(cmd, out, a.timeout))
        except Exception as e:  # noqa: BLE001
            row("ModelOpt AutoCast fp16", None, None, short(e))
        # AMD Quark (ONNX), where its wheel runs here.
        name = f"Quark {a.quark_scheme}"
        if not a.quark_python:
            row(name, None, None, os.environ.get("QUARK_WHY", "not installed"))
        else:
            out = os.path.join(work, "quark.onnx")
            script = os.path.join(work, "quark_run.py")
            open(script, "w").write(QUARK_SCRIPT)
            npz = os.path.join(work, "calib_quark.npz")
            np.savez(npz, **{k: np.concatenate([d[k] for d in calib], axis=0) for k in calib[0]})
            try:
                row(name, out, tool([a.quark_python, script, spec.path, out, npz, a.quark_scheme], out, a.timeout))
            except Exception as e:  # noqa: BLE001
                row(name, None, None, short(e))
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    print_table(rows)


def print_table(rows):
    print(f"{'model':<14} {'tool':<24} {'h100 us':>9} {'/fp32':>6} {'eff bits':>8} {'criterion':<20} "
          f"{'verdict':<7} {'worst':>9} {'wall s':>7}  layers / why")
    for r in rows:
        wall = "-" if r.get("wall_s") is None else f"{r['wall_s']:.1f}"
        if "error" in r:
            print(f"{r['model']:<14} {r['tool']:<24} {'-':>9} {'-':>6} {'-':>8} {r['criterion']:<20} {'-':<7} {'-':>9} {wall:>7}  "
                  f"could not run: {r['error']}")
            continue
        us = r.get("latency_us")
        cost = f"{us:.4g}" if us is not None else "-"
        ratio = f"{us / r['float32_us']:.2f}" if us is not None else "-"
        bits = f"{r['effective_bits']:.2f}" if "effective_bits" in r else "-"
        verdict = "-" if "passed" not in r else ("PASSED" if r["passed"] else "FAILED")
        worst = f"{r['metric']:.6f}" if "metric" in r else "-"
        why = " ".join(f"{f} {n}" for f, n in sorted(r.get("formats", {}).items(), key=lambda x: -x[1]))
        if "cost_error" in r:
            why += f" cost: {r['cost_error']}"
        if "run_error" in r:
            why += f" ORT: {r['run_error']}"
        print(f"{r['model']:<14} {r['tool']:<24} {cost:>9} {ratio:>6} {bits:>8} {r['criterion']:<20} {verdict:<7} {worst:>9} {wall:>7}  {why}")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
