#!/usr/bin/env python3
"""Checks an ONNX model with the ONNX checker and runs it in ONNX Runtime (CPU).

Usage: ort_run.py MODEL --inputs DIR --out DIR [--no-run] [--opt-level all|extended|basic|disable]
                  [--values DIR]
       ort_run.py MODEL --infer-shapes OUT_MODEL

Reads DIR/input_K.pb (TensorProto files, in the model's input order; converted to the input's
declared type, e.g. float16 for a model exported without keep_io_types), writes ORT's outputs
as OUT/output_K.pb (TensorProto, in the model's output order). --values DIR runs the model a
second time, in another session, with every node output made a graph output too, and writes
each value as DIR/value_K.pb (the TensorProto's name is the value's; float8 and bfloat16
values keep their declared type). A graph output changes what ORT may rewrite: its
RemoveDuplicateCastTransformer keeps a Cast whose output is a graph output, so float32 ->
float16 -> float32 Cast pairs that the first session drops are computed in the second. --infer-shapes writes a copy of
the model with ONNX shape inference's value_info instead.

Exit status: 0 ok, 2 the checker rejected the model (full_check=True), 3 ONNX Runtime could not
load or run it (the first line of its error goes to stderr, e.g. NOT_IMPLEMENTED for an op
without a CPU kernel for the type).
"""
import argparse
import glob
import os
import sys

import numpy as np
import onnx
from onnx import numpy_helper

NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}

LEVELS = {
    "all": "ORT_ENABLE_ALL",
    "extended": "ORT_ENABLE_EXTENDED",
    "basic": "ORT_ENABLE_BASIC",
    "disable": "ORT_DISABLE_ALL",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--inputs")
    ap.add_argument("--out")
    ap.add_argument("--no-run", action="store_true", help="only run the checker")
    ap.add_argument("--opt-level", choices=sorted(LEVELS), default="all")
    ap.add_argument("--infer-shapes", metavar="OUT_MODEL")
    ap.add_argument("--values", metavar="DIR", help="also write every node output (a second session)")
    args = ap.parse_args()

    if args.infer_shapes:
        onnx.save(onnx.shape_inference.infer_shapes(onnx.load(args.model), strict_mode=True), args.infer_shapes)
        return 0

    try:
        onnx.checker.check_model(args.model, full_check=True)
    except Exception as e:  # the checker raises several exception types
        print(f"checker: {e}", file=sys.stderr)
        return 2
    if args.no_run:
        return 0

    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[args.opt_level])
    try:
        sess = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
        feeds = {}
        files = sorted(glob.glob(os.path.join(args.inputs, "input_*.pb")), key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
        for meta, path in zip(sess.get_inputs(), files):
            t = onnx.TensorProto()
            with open(path, "rb") as f:
                t.ParseFromString(f.read())
            a = numpy_helper.to_array(t)
            feeds[meta.name] = a.astype(NP_TYPES.get(meta.type, a.dtype))
        outs = sess.run(None, feeds)
    except Exception as e:
        print(f"onnxruntime: {str(e).splitlines()[0]}", file=sys.stderr)
        return 3
    os.makedirs(args.out, exist_ok=True)
    for k, (meta, v) in enumerate(zip(sess.get_outputs(), outs)):
        with open(os.path.join(args.out, f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(v), meta.name).SerializeToString())
    if args.values:
        from ort_batch import to_proto

        m = onnx.load(args.model)
        have = {o.name for o in m.graph.output}
        for n in m.graph.node:
            m.graph.output.extend(onnx.ValueInfoProto(name=o) for o in n.output if o and o not in have)
        try:
            every = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            values = every.run(None, feeds)
        except Exception as e:
            print(f"onnxruntime (--values): {str(e).splitlines()[0]}", file=sys.stderr)
            return 3
        os.makedirs(args.values, exist_ok=True)
        for k, (meta, v) in enumerate(zip(every.get_outputs(), values)):
            with open(os.path.join(args.values, f"value_{k}.pb"), "wb") as f:
                f.write(to_proto(meta, v).SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main())
