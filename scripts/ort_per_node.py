#!/usr/bin/env python3
"""Runs an ONNX model in ONNX Runtime (CPU) one node at a time, as an unfused GPU engine does.

Usage: ort_per_node.py MODEL INPUT_PB OUT_DIR

MODEL has one graph input, read from INPUT_PB (a TensorProto, converted to float32: the input
of a `mixprec convert --fp16` export, which keeps float32 I/O). Each node runs as its own model
whose outputs have the types the exported model gives them (ONNX shape inference), so every
float16 value is materialized in float16 between nodes. Run whole, ORT's CPU provider executes
float16 ops it has no float16 kernel for (Mul, Relu, Sub, Add...) in float32 between inserted
Casts and removes the Cast pairs between two of them: a float16 overflow inside such a chain
would never show. Writes OUT_DIR/output_K.pb (float32) for the model's outputs in order.

Used by tests/integration/nanprop.rs (a planted float16 overflow vs mixprec's emulation).
"""
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx import shape_inference


def main():
    model, input_pb, out = sys.argv[1:4]
    m = shape_inference.infer_shapes(onnx.load(model), strict_mode=True)
    g = m.graph
    types = {v.name: v.type for v in list(g.input) + list(g.output) + list(g.value_info)}
    vals = {t.name: nh.to_array(t) for t in g.initializer}
    vals[g.input[0].name] = nh.to_array(onnx.load_tensor(input_pb)).astype(np.float32)
    for n in g.node:
        ins = [i for i in n.input if i]
        gi = [h.make_tensor_value_info(i, h.np_dtype_to_tensor_dtype(vals[i].dtype), vals[i].shape) for i in ins]
        go = [h.make_value_info(o, types[o]) for o in n.output]
        sub = h.make_model(h.make_graph([n], n.name or "node", gi, go), opset_imports=m.opset_import)
        sub.ir_version = m.ir_version
        sess = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
        with np.errstate(all="ignore"):
            for o, v in zip(n.output, sess.run(None, {i: vals[i] for i in ins})):
                vals[o] = v
    for k, o in enumerate(g.output):
        onnx.save_tensor(nh.from_array(vals[o.name].astype(np.float32), o.name), f"{out}/output_{k}.pb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
