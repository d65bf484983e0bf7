#!/usr/bin/env python3
"""Writes models whose LLM ops contradict their inputs, for the bad-input CLI test
(tests/integration/cli.rs, `llm_ops_that_contradict_their_inputs_fail_naming_the_node`).

Usage: gen_bad_llm_ops.py OUT_DIR

- gqa_heads.onnx: a GroupQueryAttention (node `attn_bad_heads`) whose key and value widths
  contradict kv_num_heads times the query's head size.
- gqa_past.onnx: a GroupQueryAttention (`attn_bad_past`) whose past key has another head
  size than the query and the past value.
- nbits_blob.onnx: a MatMulNBits (`proj_bad_blob`) whose packed weight is half the size K, N,
  bits and block_size give.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"


def save(out, name, nodes, inputs, inits):
    graph = helper.make_graph(
        nodes, name, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    onnx.save(model, os.path.join(out, name + ".onnx"))


def main(out):
    os.makedirs(out, exist_ok=True)
    f = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
    i32 = lambda n, v: numpy_helper.from_array(np.array(v, dtype=np.int32), n)
    gqa = lambda name, inputs: helper.make_node(
        "GroupQueryAttention", inputs, ["y", "present_key", "present_value"], name=name,
        domain=MS, num_heads=4, kv_num_heads=2)
    save(out, "gqa_heads", [gqa("attn_bad_heads", ["q", "k", "v", "", "", "seqlens_k", "total"])],
         [f("q", [1, 5, 64]), f("k", [1, 5, 48]), f("v", [1, 5, 48])],
         [i32("seqlens_k", [4]), i32("total", 5)])
    save(out, "gqa_past",
         [gqa("attn_bad_past", ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total"])],
         [f("q", [1, 1, 64]), f("k", [1, 1, 32]), f("v", [1, 1, 32]),
          f("past_key", [1, 2, 6, 8]), f("past_value", [1, 2, 6, 16])],
         [i32("seqlens_k", [6]), i32("total", 7)])
    nbits = helper.make_node("MatMulNBits", ["a", "w_q", "w_scales"], ["y"], name="proj_bad_blob",
                             domain=MS, K=64, N=8, bits=4, block_size=32)
    save(out, "nbits_blob", [nbits], [f("a", [1, 3, 64])],
         [numpy_helper.from_array(np.zeros((8, 2, 8), dtype=np.uint8), "w_q"),
          numpy_helper.from_array(np.ones(16, dtype=np.float32), "w_scales")])


if __name__ == "__main__":
    main(sys.argv[1])
