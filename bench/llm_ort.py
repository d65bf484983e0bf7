#!/usr/bin/env python3
"""ONNX Runtime's side of bench/llm.sh (c): greedy generation through the KV cache, as
scripts/llm_generate.py's ort client drives it (present.* fed back as past_key_values.*,
attention_mask grown, position_ids counted on when the model has them), CPU EP.

Usage: llm_ort.py MODEL.onnx PROMPT_IDS THREADS [WARM_UP]
Prints "T1 T9": seconds of a generation of 1 token (the prompt step) and of 9 tokens (the
prompt + 8 decode steps), each after WARM_UP (default 2) untimed generations of the same length,
the same protocol as `mixprec run --decode N --warm-up 2` (whose 'Average inference time' is
the timed generation).
"""
import sys
import time

import numpy as np
import onnxruntime as ort


def generate(sess, inputs, outputs, prompt, new):
    feeds = {}
    for name, meta in inputs.items():
        if name.startswith("past_key_values."):
            shape = [1 if isinstance(d, str) and "batch" in d else 0 if isinstance(d, str) else d for d in meta.shape]
            feeds[name] = np.zeros(shape, dtype=np.float32)
    ids, step_ids = list(prompt), list(prompt)
    for _ in range(new):
        total = len(ids)
        feeds["input_ids"] = np.array([step_ids], dtype=np.int64)
        feeds["attention_mask"] = np.ones((1, total), dtype=np.int64)
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(total - len(step_ids), total, dtype=np.int64)[None]
        results = dict(zip(outputs, sess.run(outputs, feeds)))
        token = int(results["logits"][0, -1].argmax())
        for name in outputs:
            if name.startswith("present."):
                feeds["past_key_values." + name[len("present."):]] = results[name]
        ids.append(token)
        step_ids = [token]
    return ids[len(prompt):]


def main():
    model, prompt, threads = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
    warm_up = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    outputs = [o.name for o in sess.get_outputs()]
    times = []
    for new in (1, 9):
        for _ in range(warm_up):
            generate(sess, inputs, outputs, prompt, new)
        t = time.perf_counter()
        generate(sess, inputs, outputs, prompt, new)
        times.append(time.perf_counter() - t)
    print(f"{times[0]:.6f} {times[1]:.6f}")


if __name__ == "__main__":
    main()
