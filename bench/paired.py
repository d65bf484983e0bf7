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
  --peer-threads N, --peer-env KEY=VALUE (repeatable)
               the peer is mixprec itself, at N threads or with KEY=VALUE in its environment
               (an experiment's switch, e.g. XALT=1 in a throwaway build), layer by layer
               beside this one: which layers do not scale with threads, which a change moves

A shared virtual machine moves by 10-50 % over seconds to minutes (other guests, CPU steal), so
two engines timed one after the other, even in alternating rounds of seconds, compare two
machine states. Here ONNX Runtime runs in this process and mixprec in a child process that
serves blocks of runs on request (`latency --serve`): blocks of about 50 ms each, one engine
then the other, each block's first run untimed, and before each block a pause until both
processes have used almost no CPU for 10 ms (ONNX Runtime's pool thread spins 30-50 ms after its
runs return; a block started 20 ms after ORT's ran 20-40 % slower on an Intel Xeon). Each
pair of blocks gives a ratio of their medians; the line reports the median of those ratios
(the paired ratio), beside both engines' overall medians and the longest wait for quiet
(`quiet_wait_ms`). The engines never run at the same time.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ort_latency import input_set  # noqa: E402  (beside this script, in bench/ and in a kit)

BLOCK_S = 0.05
PAUSE_S = 0.02
# How long both processes must have used (almost) no CPU before a block starts, and the most
# time to wait for it.
QUIET_S = 0.01
QUIET_MAX_S = 2.0


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


def cpu_seconds(pid: int) -> float:
    """The CPU time all threads of process `pid` have run: its process CPU-time clock (Linux's
    clock id for a pid, MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)), to the nanosecond."""
    return time.clock_gettime(((~pid) << 3) | 2)


def wait_quiet(pids: list[int]) -> float:
    """Waits until the processes `pids` have used less than a fifth of a CPU over QUIET_S (at
    most QUIET_MAX_S) and returns how long it waited: an engine's pool threads may spin on
    after its runs return (ONNX Runtime's for 30-50 ms after `run`, on Zen 5 and Intel alike),
    on the two CPUs the other engine's block then runs on (on an Intel Xeon that block ran
    20-40 % slower)."""
    start = time.perf_counter()
    while True:
        before = sum(cpu_seconds(p) for p in pids)
        time.sleep(QUIET_S)
        used = sum(cpu_seconds(p) for p in pids) - before
        waited = time.perf_counter() - start
        if used < 0.2 * QUIET_S or waited > QUIET_MAX_S:
            return waited


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


class Mixprec:
    """A `latency --serve` child: blocks of runs on request, each run [total µs, layer µs...]."""

    def __init__(self, binary: str, d: str, name: str, threads: int, layers: bool, env: dict[str, str]):
        self.name = name
        cmd = [binary, "--serve", d, name] + (["--layers"] if layers else [])
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads), **env)
        self.child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.child.stdin and self.child.stdout
        self.layer_names: list[str] = json.loads(self.child.stdout.readline())
        self.layers = layers

    def block(self, n: int) -> list[list[float]]:
        assert self.child.stdin and self.child.stdout
        self.child.stdin.write(f"{n + 1}\n")
        self.child.stdin.flush()
        line = self.child.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name}: the latency process ended ({self.child.wait()})")
        rows = json.loads(line)[1:]
        return rows if self.layers else [[r] for r in rows]

    def close(self) -> None:
        assert self.child.stdin
        self.child.stdin.close()
        self.child.wait()


class Ort:
    """ONNX Runtime in this process; per node from its profiler (`nodes`, after the runs)."""

    def __init__(self, d: str, name: str, threads: int, layers: bool):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        if layers:
            opts.enable_profiling = True
            opts.profile_file_prefix = f"/tmp/paired_ort_{os.getpid()}"
        self.sess = ort.InferenceSession(os.path.join(d, f"{name}.onnx"), opts, providers=["CPUExecutionProvider"])
        self.feeds = input_set(self.sess, d, name)

    def block(self, n: int) -> list[list[float]]:
        return [[t] for t in ort_block(self.sess, self.feeds, n)]


def paired(binary: str, d: str, name: str, threads: int, seconds: float, layers: bool,
           peer_threads: int | None, peer_env: dict[str, str]) -> str:
    mix = Mixprec(binary, d, name, threads, layers, {})
    # The peer: ONNX Runtime, or mixprec itself at another thread count or in another
    # environment (an experiment's switch), layer by layer beside this one.
    peer: Mixprec | Ort
    if peer_threads is not None or peer_env:
        peer = Mixprec(binary, d, name, peer_threads or threads, layers, peer_env)
        peer_label = f"mixprec{'' if peer_threads is None else f' at {peer_threads} threads'}{' ' + str(peer_env) if peer_env else ''}"
    else:
        peer = Ort(d, name, threads, layers)
        peer_label = "ort"
    # Warm-up (one-time work: weights packed, buffers allocated), and a block size of about
    # BLOCK_S for the slower engine, from each one's median of 20 runs.
    peer_us = statistics.median(r[0] for r in peer.block(20))
    mix_us = statistics.median(r[0] for r in mix.block(20))
    n = max(3, int(BLOCK_S * 1e6 / max(peer_us, mix_us, 1.0)))
    mix_rows: list[list[float]] = []
    peer_rows: list[list[float]] = []
    ratios: list[float] = []
    # This process (ONNX Runtime's threads, when it is the peer) and the mixprec children.
    pids = [os.getpid(), mix.child.pid] + ([peer.child.pid] if isinstance(peer, Mixprec) else [])
    waits: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or len(ratios) < 5:
        time.sleep(PAUSE_S)
        waits.append(wait_quiet(pids))
        m = mix.block(n)
        time.sleep(PAUSE_S)
        waits.append(wait_quiet(pids))
        o = peer.block(n)
        mix_rows += m
        peer_rows += o
        ratios.append(statistics.median(r[0] for r in m) / statistics.median(r[0] for r in o))
    mix.close()
    mm = statistics.median(r[0] for r in mix_rows)
    om = statistics.median(r[0] for r in peer_rows)
    out = json.dumps(
        {
            "model": name,
            "threads": threads,
            "peer": peer_label,
            "mixprec_median_ms": round(mm / 1e3, 4),
            "peer_median_ms": round(om / 1e3, 4),
            "ratio_of_medians": round(mm / om, 3),
            "paired_ratio": round(statistics.median(ratios), 3),
            "pairs": len(ratios),
            "runs_per_block": n,
            "quiet_wait_ms": round(1e3 * max(waits), 1),
        }
    )
    if not layers:
        return out
    if isinstance(peer, Mixprec):
        peer.close()
        out += f"\n  per layer (median µs): mixprec, {peer_label}, ratio; run totals {mm:.1f} / {om:.1f}\n"
        for i, layer in enumerate(mix.layer_names):
            a = statistics.median(r[i + 1] for r in mix_rows)
            b = statistics.median(r[i + 1] for r in peer_rows)
            out += f"  {a:9.1f} {b:9.1f} {a / b if b else float('nan'):6.2f}  {layer}\n"
        return out
    out += f"\n  mixprec layers (median µs, {len(mix_rows)} runs; its run total {mm:.1f}):\n"
    for i, layer in enumerate(mix.layer_names):
        out += f"  {statistics.median(r[i + 1] for r in mix_rows):9.1f}  {layer}\n"
    nodes = node_medians(peer.sess, 21)
    out += f"  ONNX Runtime nodes (median µs, profiled; its run total {om:.1f}):\n"
    for node, us in nodes:
        out += f"  {us:9.1f}  {node}\n"
    return out


def main() -> None:
    args = sys.argv[1:]
    layers = "--layers" in args
    args = [a for a in args if a != "--layers"]
    threads, seconds, peer_threads = 2, 20.0, None
    peer_env: dict[str, str] = {}
    for flag in ("--threads", "--seconds", "--peer-threads", "--peer-env"):
        while flag in args:
            i = args.index(flag)
            value = args[i + 1]
            del args[i : i + 2]
            if flag == "--threads":
                threads = int(value)
            elif flag == "--seconds":
                seconds = float(value)
            elif flag == "--peer-threads":
                peer_threads = int(value)
            else:
                key, _, v = value.partition("=")
                peer_env[key] = v
    if len(args) < 3:
        raise SystemExit(__doc__)
    binary, d, names = args[0], args[1], args[2:]
    isa = subprocess.run([binary, "--cpu"], capture_output=True, text=True)
    print(f"cpu: {json.loads(isa.stdout)['kernels'] if isa.returncode == 0 else '?'}; onnxruntime {ort.__version__}")
    for name in names:
        print(paired(binary, d, name, threads, seconds, layers, peer_threads, peer_env), flush=True)


if __name__ == "__main__":
    main()
