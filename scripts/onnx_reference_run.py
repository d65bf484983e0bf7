#!/usr/bin/env python3
"""Runs an ONNX model in the ONNX reference evaluator (onnx.reference), for models ONNX Runtime
has no CPU kernel for (e.g. DequantizeLinear of float4e2m1 at opset 23, NVFP4 weights).

Usage: onnx_reference_run.py MODEL --inputs DIR --out DIR

Same files as scripts/ort_run.py: reads DIR/input_K.pb, writes OUT/output_K.pb. Runs the ONNX
checker first (full_check=True). Exit status: 0 ok, 2 the checker rejected the model, 3 the
evaluator failed.
"""
import argparse
import glob
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    try:
        onnx.checker.check_model(args.model, full_check=True)
    except Exception as e:
        print(f"checker: {e}", file=sys.stderr)
        return 2
    from onnx.reference import ReferenceEvaluator

    m = onnx.load(args.model)
    try:
        sess = ReferenceEvaluator(m)
        files = sorted(glob.glob(os.path.join(args.inputs, "input_*.pb")), key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
        feeds = {}
        for vi, path in zip(m.graph.input, files):
            t = onnx.TensorProto()
            with open(path, "rb") as f:
                t.ParseFromString(f.read())
            feeds[vi.name] = numpy_helper.to_array(t)
        outs = sess.run(None, feeds)
    except Exception as e:
        print(f"onnx.reference: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 3
    os.makedirs(args.out, exist_ok=True)
    for k, (vi, v) in enumerate(zip(m.graph.output, outs)):
        with open(os.path.join(args.out, f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(v), vi.name).SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main())
