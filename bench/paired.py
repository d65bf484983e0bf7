#!/usr/bin/env python3
"""mixprec against ONNX Runtime in interleaved blocks, for a machine whose speed drifts.

Usage: paired.py LATENCY_BIN DIR NAME [NAME...] [--threads T] [--seconds S] [--layers]
  LATENCY_BIN  the `latency` bench binary (cargo build --release --bench latency; it is
               target/release/deps/latency-<hash>, or a kit's bin/latency)
  DIR          holds NAME.onnx and NAME/input_K.pb (as bench/run.sh and the kits write them)
  --threads    both engines' thread count (default 2); pin the script (`taskset -c 0,1`), the
               mixprec process inherits it
  --seconds    per model, both engines together (default 20)
  --layers     per layer too: mixprec's profiled runs (its layers in the order they ran) and
               ONNX Runtime's node profiler (its nodes, which it names after their outputs),
               both as medians over the same blocks

A shared virtual machine moves by 10-50 % over seconds to minutes (other guests, CPU steal), so
two engines timed one after the other, even in alternating rounds of seconds, compare two
machine states. Here ONNX Runtime runs in this process and mixprec in a child process that
serves blocks of runs on request (`latency --serve`): blocks of about 50 ms each, one engine
then the other, each block's first run untimed, a 5 ms pause between blocks so that the other
engine's spinning threads have gone to sleep. Each pair of blocks gives a ratio of their
medians; the line reports the median of those ratios (the paired ratio), beside both engines'
overall medians. The engines never run at the same time.
"""
from __future__ import annotations

import bisect
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

BLOCK_S = 0.05
PAUSE_S = 0.02


def feeds_of(sess: ort.InferenceSession, d: str, name: str) -> dict[str, np.ndarray]:
    feeds = {}
    for k, i in enumerate(sess.get_inputs()):
        t = TensorProto()
        with open(os.path.join(d, name, f"input_{k}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        feeds[i.name] = numpy_helper.to_array(t)
    return feeds


FLUSH = np.zeros(int(os.environ.get("FLUSH_MB", "0")) << 20, dtype=np.uint8)


def ort_block(sess: ort.InferenceSession, feeds: dict[str, np.ndarray], n: int) -> list[float]:
    sess.run(None, feeds)
    times = []
    for _ in range(n):
        np.add(FLUSH, 1, out=FLUSH)
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e6)
    return times


def node_medians(sess: ort.InferenceSession, skip: int) -> list[tuple[str, float]]:
    """ONNX Runtime's node times in its runs after the first `skip` (the profiler's clock, µs),
    median per node, in the order the nodes first ran."""
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    os.remove(f.name)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")[skip:]
    starts = [r[0] for r in runs]
    order: list[str] = []
    times: dict[str, list[float]] = {}
    for e in sorted((e for e in events if e.get("cat") == "Node"), key=lambda e: e["ts"]):
        if not e["name"].endswith("_kernel_time"):
            continue
        i = bisect.bisect_right(starts, e["ts"]) - 1
        if i < 0 or e["ts"] > runs[i][1]:
            continue
        key = f'{e["name"][: -len("_kernel_time")]} ({e["args"]["op_name"]})'
        if key not in times:
            order.append(key)
            times[key] = []
        times[key].append(e["dur"])
    return [(k, statistics.median(times[k])) for k in order]


def paired(binary: str, d: str, name: str, threads: int, seconds: float, layers: bool) -> str:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    cmd = [binary, "--serve", d, name] + (["--layers"] if layers else [])
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdin and child.stdout
    layer_names = json.loads(child.stdout.readline())

    def mixprec_block(n: int) -> list:
        child.stdin.write(f"{n + 1}\n")
        child.stdin.flush()
        line = child.stdout.readline()
        if not line:
            raise SystemExit(f"{name}: the latency process ended ({child.wait()})")
        return json.loads(line)[1:]

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if layers:
        opts.enable_profiling = True
        opts.profile_file_prefix = f"/tmp/paired_ort_{os.getpid()}"
    sess = ort.InferenceSession(os.path.join(d, f"{name}.onnx"), opts, providers=["CPUExecutionProvider"])
    feeds = feeds_of(sess, d, name)
    # Warm-up, and each engine's block size (about BLOCK_S of runs).
    # Warm-up (one-time work: weights packed, buffers allocated), and a block size of about
    # BLOCK_S for the slower engine, from each one's median of 20 runs.
    ort_us = statistics.median(ort_block(sess, feeds, 20))
    warm = mixprec_block(20)
    mix_us = statistics.median(r[0] for r in warm) if layers else statistics.median(warm)
    n = max(3, int(BLOCK_S * 1e6 / max(ort_us, mix_us, 1.0)))
    mix_all: list[float] = []
    ort_all: list[float] = []
    ratios: list[float] = []
    mix_layers: list[list[float]] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(ratios) < 5:
        time.sleep(PAUSE_S)
        rows = mixprec_block(n)
        m = [r[0] for r in rows] if layers else rows
        if layers:
            mix_layers.extend(r[1:] for r in rows)
        time.sleep(PAUSE_S)
        o = ort_block(sess, feeds, n)
        mix_all += m
        ort_all += o
        ratios.append(statistics.median(m) / statistics.median(o))
    child.stdin.close()
    child.wait()
    mm, om = statistics.median(mix_all), statistics.median(ort_all)
    out = json.dumps(
        {
            "model": name,
            "threads": threads,
            "mixprec_median_ms": round(mm / 1e3, 4),
            "ort_median_ms": round(om / 1e3, 4),
            "ratio_of_medians": round(mm / om, 3),
            "paired_ratio": round(statistics.median(ratios), 3),
            "pairs": len(ratios),
            "runs_per_block": n,
        }
    )
    if layers:
        out += f"\n  mixprec layers (median µs, {len(mix_layers)} runs; its run total {mm:.1f}):\n"
        for i, layer in enumerate(layer_names):
            out += f"  {statistics.median(r[i] for r in mix_layers):9.1f}  {layer}\n"
        nodes = node_medians(sess, 21)
        out += f"  ONNX Runtime nodes (median µs, profiled; its run total {om:.1f}):\n"
        for node, us in nodes:
            out += f"  {us:9.1f}  {node}\n"
    return out


def main() -> None:
    args = sys.argv[1:]
    layers = "--layers" in args
    args = [a for a in args if a != "--layers"]
    threads, seconds = 2, 20.0
    for flag in ("--threads", "--seconds"):
        if flag in args:
            i = args.index(flag)
            value = args[i + 1]
            del args[i : i + 2]
            if flag == "--threads":
                threads = int(value)
            else:
                seconds = float(value)
    if len(args) < 3:
        raise SystemExit(__doc__)
    binary, d, names = args[0], args[1], args[2:]
    isa = subprocess.run([binary, "--cpu"], capture_output=True, text=True)
    print(f"cpu: {json.loads(isa.stdout)['kernels'] if isa.returncode == 0 else '?'}; onnxruntime {ort.__version__}")
    for name in names:
        print(paired(binary, d, name, threads, seconds, layers), flush=True)


if __name__ == "__main__":
    main()
