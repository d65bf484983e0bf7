#!/usr/bin/env python3
"""Quantizes models with ONNX Runtime's quantize_static (QDQ), NVIDIA ModelOpt
(python -m modelopt.onnx.quantization --quantize_mode int8) and `mixprec quantize --int8`, on
the same calibration data, and prints per model and tool: the quantized layers, the task-level
error against FP32 (cosine similarity of the outputs; top-1 agreement on classifiers), all
measured with one runner (ONNX Runtime CPU, graph optimizations disabled: docs/export.md), and
`mixprec debug precision` on each tool's model (layers excluded to reach a criterion, search
time). Driven by bench/quantize.sh, which sets up the venv.

Usage: quantize_compare.py --mixprec BIN --work DIR [--calib N] [--eval N] NAME=MODEL.onnx...
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

# Input ranges of the generated models (scripts/gen_models.py's INPUT_RANGES).
RANGES = {"cnn": (-1.0, 1.0), "transformer": (-1.0, 1.0), "mlp": (-2.0, 2.0), "needs_constraints": (1.0, 2.0)}
QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Spec:
    """One model of the table: where it is, how to draw its inputs (as arrays, and as the
    mixprec options that generate the same kind of input for the search column)."""

    def __init__(self, name, path, shapes=None, gen=None):
        self.name, self.path = name, path
        self.shapes = shapes  # {input: shape} overriding the declared ones (corpus models)
        self.gen = gen  # corpus "gen": ["[lo,hi]"] / ["name:[lo,hi]", ...] / ["@function"]

    def inputs(self):
        m = onnx.load(self.path, load_external_data=False)
        inits = {t.name for t in m.graph.initializer}
        out = []
        for i in m.graph.input:
            if i.name in inits:
                continue
            shape = [d.dim_value if d.dim_value > 0 else 1 for d in i.type.tensor_type.shape.dim]
            out.append((i.name, (self.shapes or {}).get(i.name, shape)))
        return out

    def data(self, n, seed):
        if self.gen and self.gen[0].startswith("@"):
            sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures"))
            import real_model_inputs

            fn = getattr(real_model_inputs, self.gen[0][1:])
            return [next(iter(fn(seed=seed * 1000 + k))) for k in range(n)]
        rng = np.random.RandomState(seed)
        return [{k: rng.uniform(*self.range_of(k), size=s).astype(np.float32) for k, s in self.inputs()}
                for _ in range(n)]

    def range_of(self, inp):
        if self.gen is None:
            return RANGES.get(self.name.removesuffix("_example"), (-1.0, 1.0))
        for g in self.gen:
            key, _, rng = g.rpartition(":")
            if key in ("", inp):
                lo, hi = json.loads(rng)
                return float(lo), float(hi)
        return (-1.0, 1.0)

    def mixprec_args(self):
        """Options that make `mixprec run`/`debug precision` draw this model's kind of input."""
        a = ["--input-shapes", *(f"{k}:{json.dumps(v).replace(' ', '')}" for k, v in self.shapes.items())] \
            if self.shapes else []
        if self.gen and self.gen[0].startswith("@"):
            return a + ["--data-loader-script", f"{ROOT}/tests/fixtures/real_model_inputs.py:{self.gen[0][1:]}"]
        if self.gen:
            return a + ["--val-range", *self.gen]
        lo, hi = self.range_of(None)
        return a + ["--val-range", f"[{lo},{hi}]"]


def corpus_spec(name, cache):
    """A model of the real-model corpus (tests/fixtures/real_models.json, fetched into CACHE by
    scripts/real_models.sh) with its input shapes and generator."""
    table = {m["name"]: m for m in json.load(open(os.path.join(ROOT, "tests", "fixtures", "real_models.json")))}
    m = table[name]
    shapes = {}
    for s in m["shapes"]:
        k, _, v = s.rpartition(":")
        shapes[k] = json.loads(v)
    return Spec(name, os.path.join(cache, m["file"]), shapes, m["gen"])


def session(path):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_all(path, data):
    s = session(path)
    return [s.run(None, d) for d in data]


def quantized_layers(path):
    """Op types of the compute nodes (not Q/DQ) that read a DequantizeLinear output."""
    m = onnx.load(path, load_external_data=False)
    dq = {o for n in m.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [n.op_type for n in m.graph.node if n.op_type not in QDQ_OPS and any(i in dq for i in n.input)]


def op_counts(ops):
    counts = {}
    for o in ops:
        counts[o] = counts.get(o, 0) + 1
    return " ".join(f"{o} {k}" for o, k in sorted(counts.items(), key=lambda x: (-x[1], x[0]))) or "none"


def metrics(ref, got):
    a = np.concatenate([np.asarray(o, np.float64).ravel() for r in ref for o in r])
    b = np.concatenate([np.asarray(o, np.float64).ravel() for r in got for o in r])
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))
    top1 = None
    first = np.asarray(ref[0][0])
    if first.ndim == 2 and first.shape[-1] > 1 and first.shape[-1] <= 1000:
        agree = [np.argmax(np.asarray(r[0]), -1) == np.argmax(np.asarray(g[0]), -1) for r, g in zip(ref, got)]
        top1 = float(np.mean(np.concatenate(agree)))
    return cos, top1


def ort_quantize(model, out, data):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    quantize_static(model, out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})


def modelopt_quantize(model, out, data, work):
    names = list(data[0])
    if len(names) == 1:
        calib = os.path.join(work, "calib.npy")
        np.save(calib, np.concatenate([d[names[0]] for d in data], axis=0))
    else:
        calib = os.path.join(work, "calib.npz")
        np.savez(calib, **{k: np.concatenate([d[k] for d in data], axis=0) for k in names})
    cmd = [sys.executable, "-m", "modelopt.onnx.quantization", "--onnx_path", model, "--quantize_mode", "int8",
           "--calibration_data", calib, "--calibration_eps", "cpu", "--output_path", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(out):
        raise RuntimeError((r.stderr or r.stdout).strip().splitlines()[-1] if (r.stderr or r.stdout).strip() else f"exit {r.returncode}")


def mixprec_quantize(mixprec, model, out, data, work, algo=None):
    files = []
    for k, d in enumerate(data):
        p = os.path.join(work, f"calib_{k}.npz")
        np.savez(p, **d)
        files.append(p)
    cmd = [mixprec, "quantize", model, "-o", out, "--int8", "--data", *files]
    if algo:
        cmd += ["--calibration-algo", algo]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError((r.stderr or r.stdout).strip().splitlines()[-1])


# The stated criterion of the search column: the outputs' cosine similarity to the FP32
# model's outputs (`--golden`) at least 0.9999, on
# mixprec's default input set; the tolerance check is switched off (--atol 1e9) so the metric
# alone decides. QDQ_SEARCH_ARGS replaces it (the arguments after the model); "off" skips it.
DEFAULT_SEARCH_ARGS = "--mode minimal --atol 1e9 --metric cosine:0.9999"


def search_column(mixprec, qmodel, spec, work):
    """`mixprec debug precision` on a tool's Q/DQ model (no precision flag: the candidates are
    its quantized layers): how many layers must leave quantization to reach the criterion, the
    evaluations and the wall time of the whole command."""
    args = os.environ.get("QDQ_SEARCH_ARGS", DEFAULT_SEARCH_ARGS)
    if args == "off":
        return "(off)"
    if not quantized_layers(qmodel):
        return "nothing quantized"
    vr = spec.mixprec_args()
    # The reference is the user's float model (its outputs as a golden file, on the same
    # generated inputs), not the Q/DQ model with its pairs removed: that one keeps the weights'
    # quantization error, which no exclusion of activations can remove.
    golden = os.path.join(work, "fp32_golden.json")
    if not os.path.exists(golden):
        subprocess.run([mixprec, "run", spec.path, *vr, "--save-outputs", golden], capture_output=True, check=True)
    result = os.path.join(work, os.path.basename(qmodel) + ".result.json")
    t0 = time.time()
    r = subprocess.run([mixprec, "debug", "precision", qmodel, *args.split(), *vr, "--golden", golden,
                        "--save-result", result],
                       capture_output=True, text=True)
    secs = time.time() - t0
    if not os.path.exists(result):
        return f"failed (exit {r.returncode})"
    saved = json.load(open(result))
    layers = saved.get("layers", [])
    evals = saved.get("stats", {}).get("evaluations", "?")
    kind = saved.get("outcome", {}).get("kind")
    if kind == "reference-fails":
        # Every pair removed still misses the criterion: the stored weights' own quantization
        # error (no exclusion gives the float weights back).
        summary = saved["trials"][0].get("summary", "") if saved.get("trials") else ""
        cos = summary.split("Cosine Similarity:")[-1].split("(")[0].strip() if "Cosine" in summary else "?"
        return f"unreachable: all {len(quantized_layers(qmodel))} excluded reach cosine {cos} / {evals} evals / {secs:.1f} s"
    return f"{len(layers)} / {evals} evals / {secs:.1f} s"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixprec", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--calib", type=int, default=16, help="calibration samples (default 16)")
    ap.add_argument("--eval", type=int, default=32, help="evaluation samples (default 32, another seed)")
    ap.add_argument("--corpus-cache", help="the real-model corpus cache (scripts/real_models.sh)")
    ap.add_argument("models", nargs="+", metavar="NAME=MODEL | corpus:NAME")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rows = []
    for arg in args.models:
        if arg.startswith("corpus:"):
            spec = corpus_spec(arg.split(":", 1)[1], args.corpus_cache)
        else:
            name, path = arg.split("=", 1)
            spec = Spec(name, path)
        name = spec.name
        work = os.path.join(args.work, name)
        os.makedirs(work, exist_ok=True)
        # The tools get a private copy: ModelOpt writes shape-inferred value_info back into
        # the model file it is given.
        copy = os.path.join(work, "fp32.onnx")
        shutil.copyfile(spec.path, copy)
        model = spec.path = copy
        calib = spec.data(args.calib, seed=1)
        evald = spec.data(args.eval, seed=2)
        ref = run_all(model, evald)
        tools = [
            ("ort quantize_static", "minmax", "ort", lambda o: ort_quantize(model, o, calib)),
            ("modelopt 0.47 int8", "entropy", "modelopt", lambda o: modelopt_quantize(model, o, calib, work)),
            ("mixprec quantize", "minmax (default)", "mixprec",
             lambda o: mixprec_quantize(args.mixprec, model, o, calib, work)),
            # The calibration the default was chosen against (docs/quantize.md, "Calibration").
            ("mixprec quantize", "entropy", "mixprec_entropy",
             lambda o: mixprec_quantize(args.mixprec, model, o, calib, work, "entropy")),
        ]
        for tool, algo, file, fn in tools:
            out = os.path.join(work, file + ".onnx")
            t0 = time.time()
            try:
                fn(out)
            except Exception as e:  # report and go on with the next tool
                rows.append((name, tool, algo, "-", "-", "-", "-", "-", f"failed: {str(e)[:80]}"))
                continue
            qsecs = time.time() - t0
            layers = quantized_layers(out)
            try:
                cos, top1 = metrics(ref, run_all(out, evald))
                cos_s, top_s = f"{cos:.6f}", "-" if top1 is None else f"{top1:.3f}"
            except Exception as e:
                cos_s, top_s = f"ORT failed: {str(e).splitlines()[0][:60]}", "-"
            rows.append((name, tool, algo, str(len(layers)), op_counts(layers), f"{qsecs:.1f}", cos_s, top_s,
                         search_column(args.mixprec, out, spec, work)))
    head = ("model", "tool", "calibration", "quantized layers", "by op", "quantize s", "cosine vs FP32", "top-1 agree",
            "debug precision (cosine 0.9999): excluded / evals / s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
