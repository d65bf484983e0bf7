"""ONNX Runtime's time per op type on one model and feed, from its own profiler: the peer's
side of `mixprec run MODEL --load-inputs FEED --profile` ("By op type").

With a model in ONNX Runtime GenAI's input names and no feed file, it writes a prefill feed
first (SmolLM2's 16-token chat prompt, empty KV cache, all-ones mask) to FEED, which mixprec
then loads: both engines time the same inputs.

With --nodes it also prints each node's time (mean and median) (ONNX Runtime's node names: a fused or NCHWc
node is named after the output it writes, e.g. `/Relu_1_out_nchwc` for a Conv+BN+Relu), the
peer's side of mixprec's per-layer list; run both at 1 and at 2 threads to see how each layer
scales (docs/benchmarks.md, profile recipe step 4).

Usage: target/venv/bin/python bench/ort_op_profile.py MODEL FEED.npz [RUNS] [THREADS] [--nodes]
"""

from __future__ import annotations

import collections
import json
import os
import sys

import numpy as np
import onnxruntime as ort

WARM_UP = 2
PROMPT = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]


def prefill_feed(sess: ort.InferenceSession) -> dict[str, np.ndarray]:
    """A prompt step's inputs for a model with GenAI's names (past_key_values.* empty)."""
    names = {i.name for i in sess.get_inputs()}
    feed: dict[str, np.ndarray] = {}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values."):
            shape = [1 if d == "batch_size" else (0 if isinstance(d, str) else d) for d in i.shape]
            feed[i.name] = np.zeros(shape, dtype=np.float32)
    feed["input_ids"] = np.array([PROMPT], dtype=np.int64)
    feed["attention_mask"] = np.ones((1, len(PROMPT)), dtype=np.int64)
    if "position_ids" in names:
        feed["position_ids"] = np.arange(len(PROMPT), dtype=np.int64)[None]
    return feed


def main() -> None:
    nodes = "--nodes" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--nodes"]
    model, feed_path = args[0], args[1]
    runs = int(args[2]) if len(args) > 2 else 25
    threads = int(args[3]) if len(args) > 3 else 2
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(os.path.dirname(os.path.abspath(feed_path)), "ort_profile")
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    if os.path.exists(feed_path):
        feed = dict(np.load(feed_path))
    else:
        feed = prefill_feed(sess)
        np.savez(feed_path, **feed)
    # Two untimed runs first (ORT's one-time work: weight prepacking); the profiler records
    # every run, so only node events inside the timed runs are counted below.
    for _ in range(WARM_UP + runs):
        sess.run(None, feed)
    profile = sess.end_profiling()
    with open(profile) as f:
        events = json.load(f)
    os.remove(profile)
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    timed = spans[WARM_UP:]
    per_op: collections.Counter[str] = collections.Counter()
    per_node: collections.Counter[tuple[str, str]] = collections.Counter()
    node_times: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            if any(start <= e["ts"] <= end for start, end in timed):
                per_op[e["args"]["op_name"]] += e["dur"]
                key = e["name"][: -len("_kernel_time")], e["args"]["op_name"]
                per_node[key] += e["dur"]
                node_times[key].append(e["dur"])
    total = sum(per_op.values())
    print(
        f"ONNX Runtime, {threads} threads, {runs} runs after {WARM_UP} untimed ones"
        " (profiled: each node adds the profiler's overhead)"
    )
    print(f"  {total / runs / 1000:9.3f} ms per run in nodes")
    for op, us in per_op.most_common():
        print(f"  {us / runs / 1000:9.3f} ms  {100 * us / total:5.1f} %  {op}")
    if nodes:
        # The mean moves with every slow run on a shared machine; the median per node is the
        # one to set beside `latency --layers` (benches/latency.rs), which prints medians.
        print("  per node (mean, share, median):")
        for (name, op), us in per_node.most_common():
            times = sorted(node_times[name, op])
            median = times[len(times) // 2]
            print(
                f"  {us / runs / 1000:9.4f} ms  {100 * us / total:5.1f} %  {median:8.1f} µs"
                f"  {name} ({op})"
            )


if __name__ == "__main__":
    main()
