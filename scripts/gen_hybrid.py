#!/usr/bin/env python3
"""Writes a float model quantized the way ONNX Runtime's quantize_dynamic leaves a T5: a hybrid
of operator-style integer ops, a weight-only DequantizeLinear and float layers (issue 43).

  ids ─► Gather(DequantizeLinear(int8 table)) ─► Add x ─► DynamicQuantizeLinear ─► MatMulInteger
      ─► Cast ─► Mul (activation scale x weight scale) ─► RMSNorm (Pow 2, ReduceMean, Add eps,
      Sqrt, Div, Mul gamma) ─► y

The table's values reach ~1000 and the MatMul's ~1e4, so '/rms/Pow' squares past float16's
65504 (as a T5 RMSNorm's Pow reaches 4e10): under --fp16 it must stay float32.

Usage: gen_hybrid.py OUT_DIR   (writes OUT_DIR/hybrid.onnx, OUT_DIR/hybrid/input_K.pb,
                                OUT_DIR/hybrid/output_0.pb: ONNX Runtime's outputs, and
                                OUT_DIR/hybrid.npz: the inputs for --load-inputs)
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main():
    out = sys.argv[1]
    rng = np.random.RandomState(43)
    vocab, d, seq = 32, 16, 8
    inits = [
        numpy_helper.from_array(rng.randint(-127, 128, size=(vocab, d)).astype(np.int8), "emb_q"),
        numpy_helper.from_array(np.array(8.0, np.float32), "emb_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "emb_zp"),
        numpy_helper.from_array(rng.randint(-127, 128, size=(d, d)).astype(np.int8), "w_q"),
        numpy_helper.from_array(np.array(0.02, np.float32), "w_scale"),
        numpy_helper.from_array(np.array(0, np.int8), "w_zp"),
        numpy_helper.from_array(np.array([2.0], np.float32), "two"),
        numpy_helper.from_array(np.array([1e-6], np.float32), "eps"),
        numpy_helper.from_array((1.0 + 0.1 * rng.randn(d)).astype(np.float32), "gamma"),
    ]
    n = helper.make_node
    nodes = [
        n("DequantizeLinear", ["emb_q", "emb_scale", "emb_zp"], ["emb"], name="/emb/DequantizeLinear"),
        n("Gather", ["emb", "ids"], ["h"], name="/emb/Gather", axis=0),
        n("Add", ["h", "x"], ["h2"], name="/Add"),
        n("DynamicQuantizeLinear", ["h2"], ["h_q", "h_scale", "h_zp"], name="/lin/DynamicQuantizeLinear"),
        n("MatMulInteger", ["h_q", "w_q", "h_zp", "w_zp"], ["mm_i32"], name="/lin/MatMulInteger"),
        n("Mul", ["h_scale", "w_scale"], ["mm_scale"], name="/lin/Mul_scale"),
        n("Cast", ["mm_i32"], ["mm_f"], name="/lin/Cast", to=TensorProto.FLOAT),
        n("Mul", ["mm_f", "mm_scale"], ["mm"], name="/lin/Mul"),
        n("Pow", ["mm", "two"], ["sq"], name="/rms/Pow"),
        n("ReduceMean", ["sq"], ["ms"], name="/rms/ReduceMean", axes=[-1], keepdims=1),
        n("Add", ["ms", "eps"], ["ms_eps"], name="/rms/Add"),
        n("Sqrt", ["ms_eps"], ["rms"], name="/rms/Sqrt"),
        n("Div", ["mm", "rms"], ["normed"], name="/rms/Div"),
        n("Mul", ["normed", "gamma"], ["y"], name="/rms/Mul"),
    ]
    g = helper.make_graph(
        nodes,
        "hybrid",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [2, seq]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, seq, d]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, seq, d])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="mixprec-gen")
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    os.makedirs(os.path.join(out, "hybrid"), exist_ok=True)
    onnx.save(m, os.path.join(out, "hybrid.onnx"))
    feeds = {
        "ids": rng.randint(0, vocab, size=(2, seq)).astype(np.int64),
        "x": rng.randn(2, seq, d).astype(np.float32),
    }
    np.savez(os.path.join(out, "hybrid.npz"), **feeds)
    for k, (name, v) in enumerate(feeds.items()):
        onnx.save_tensor(numpy_helper.from_array(v, name), os.path.join(out, "hybrid", f"input_{k}.pb"))
    import onnxruntime as ort

    s = ort.InferenceSession(os.path.join(out, "hybrid.onnx"), providers=["CPUExecutionProvider"])
    (y,) = s.run(None, feeds)
    onnx.save_tensor(numpy_helper.from_array(y, "y"), os.path.join(out, "hybrid", "output_0.pb"))


if __name__ == "__main__":
    main()
