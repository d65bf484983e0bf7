#!/usr/bin/env python3
"""ONNX Runtime CPU latency of the models gen_models.py wrote; same protocol as benches/latency.rs.

Usage: ort_latency.py DIR THREADS NAME [NAME...]  -> one JSON line per model.
"""
import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import numpy_helper, TensorProto


def input_set(sess, d, name):
    """DIR/NAME/input_K.pb as the session's feeds, in its input order."""
    feeds = {}
    for k, i in enumerate(sess.get_inputs()):
        t = TensorProto()
        with open(os.path.join(d, name, f"input_{k}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        feeds[i.name] = numpy_helper.to_array(t)
    return feeds


def main():
    d, threads, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    for name in names:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(os.path.join(d, f"{name}.onnx"), opts, providers=["CPUExecutionProvider"])
        feeds = input_set(sess, d, name)
        for _ in range(3):
            sess.run(None, feeds)
        times, start = [], time.perf_counter()
        while len(times) < 20 or time.perf_counter() - start < 2.0:
            t = time.perf_counter()
            sess.run(None, feeds)
            times.append((time.perf_counter() - t) * 1e3)
            if len(times) >= 500:
                break
        times.sort()
        print(json.dumps({"model": name, "median_ms": times[len(times) // 2], "min_ms": times[0], "runs": len(times)}))


if __name__ == "__main__":
    main()
