#!/usr/bin/env python3
"""Generates the realistic test and benchmark models, with ONNX Runtime reference outputs.

For each model NAME it writes, under --out:
  NAME.onnx                          the model
  NAME/input_K.pb, NAME/output_K.pb  one input set and ONNX Runtime's CPU outputs (TensorProto)

Models (all weights from a fixed NumPy seed, so the files are identical on every machine):
  cnn               ResNet-like CNN: conv/BN/ReLU stem, max pool, 4 residual stages, GAP, Gemm
  transformer       2-layer transformer encoder: LayerNorm, multi-head attention, Softmax, GELU
  mlp               Gemm/ReLU/Tanh/Softmax classifier with a dynamic batch dimension
  needs_constraints Polygraphy's FP16 overflow example: MatMul (flip), Add FP16_MAX, Sub FP16_MAX, MatMul
  planted_cnn       cnn with one FP32-only layer planted after stage 3 ('planted_div': its divisor is inf in FP16)
  planted_transformer transformer with an FP16 overflow planted between the layers ('planted_scale_up'
                    overflows, 'planted_scale_down' reads it): the precision search's planted faults
  control_flow      Conv, then two If nodes on a data-dependent condition (branches of different output
                    shapes, reading outer Conv output and weights), then a Loop whose body reads outer
                    values (MatMul/Add/Tanh) and holds an If reading the main graph two levels up
  planted_square    small CNN with an FP16 overflow planted in a pointwise chain: Conv, Mul x4096,
                    square (Mul x*x, ~1e7 > 65504), Mul 1/4096^2, Relu, Conv, GlobalAveragePool: fails
                    unfused in float16, passes when the chain is fused (intermediates in f32)
  planted_addsub    elementwise only: (x + 65504) - 65504 (the seed's Add/Sub cancellation without
                    the MatMuls): float16 loses x when Add and Sub are separate kernels
  planted_twins     planted_addsub plus a second output 1000 * (x/3 - x/3) from two identical Muls
                    ('planted_twin_a', 'planted_twin_b'): either alone in float16 fails (its rounding
                    against the other's float32), both in float16 cancel exactly: a criterion that is
                    not monotone, as real ones near float16's noise are
  decomposed_ln     LayerNorm from ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add on activations
                    of magnitude ~300 (x * 300): Pow overflows float16 unless the statistics run in f32
  qdq_cnn           cnn quantized by ONNX Runtime's quantize_static (QDQ, uint8/int8 per channel) with the
                    range in front of '/Conv_7' planted 64x too wide: the Q/DQ search's planted fault

Usage: gen_models.py --out DIR [--size test|bench] [--only NAME[,NAME]] [--no-ort]
"""
import argparse
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Builder:
    """Small graph builder: names every node and value after its op, in creation order."""

    def __init__(self, seed):
        self.rng = np.random.RandomState(seed)
        self.nodes, self.inits, self.counts = [], [], {}

    def name(self, op):
        k = self.counts.get(op, 0)
        self.counts[op] = k + 1
        return f"/{op}_{k}" if k else f"/{op}"

    def const(self, arr, hint="w"):
        n = self.name(hint)[1:] + "_const"
        self.inits.append(numpy_helper.from_array(np.asarray(arr), n))
        return n

    def op(self, op, inputs, n_out=1, node_name=None, **attrs):
        name = node_name or self.name(op)
        outs = [f"{name}_out{i}" if n_out > 1 else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs if n_out > 1 else outs[0]

    def weight(self, *shape, fan_in=None, scale=1.0):
        fan_in = fan_in or int(np.prod(shape[1:]))
        return (self.rng.randn(*shape) * scale * np.sqrt(2.0 / fan_in)).astype(np.float32)

    def model(self, inputs, outputs, opset=OPSET):
        g = helper.make_graph(self.nodes, "mixprec_test", inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="mixprec-gen")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


def conv_bn_relu(b, x, cin, cout, k, stride, relu=True):
    w = b.const(b.weight(cout, cin, k, k), "conv_w")
    y = b.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    scale = b.const((1.0 + 0.1 * b.rng.randn(cout)).astype(np.float32), "bn_scale")
    bias = b.const((0.1 * b.rng.randn(cout)).astype(np.float32), "bn_bias")
    mean = b.const((0.1 * b.rng.randn(cout)).astype(np.float32), "bn_mean")
    var = b.const((1.0 + 0.1 * np.abs(b.rng.randn(cout))).astype(np.float32), "bn_var")
    y = b.op("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)
    return b.op("Relu", [y]) if relu else y


def cnn(size, planted=False):
    hw = 224 if size == "bench" else 64
    widths = [32, 64, 128, 256]
    b = Builder(1)
    x = conv_bn_relu(b, "input", 3, widths[0], 7, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = widths[0]
    for i, c in enumerate(widths):
        stride = 1 if i == 0 else 2
        y = conv_bn_relu(b, x, cin, c, 3, stride)
        y = conv_bn_relu(b, y, c, c, 3, 1, relu=False)
        short = x if (stride == 1 and cin == c) else conv_bn_relu(b, x, cin, c, 1, stride, relu=False)
        x = b.op("Relu", [b.op("Add", [y, short])])
        cin = c
        if planted and i == 2:
            # A layer that only works in FP32: its divisor (1e5) is beyond float16's range —
            # clamped to 65504 as a float16 weight (TensorRT's builder, mixprec's export), so
            # in float16 it outputs 1.53x too much (a Cast would make it inf: zeros); its
            # inputs (x * 1000) and outputs (x / 100) fit.
            up = b.op("Mul", [x, b.const(np.array(1000.0, np.float32), "k")], node_name="scale_1000")
            down = b.op("Div", [up, b.const(np.array(1e5, np.float32), "k")], node_name="planted_div")
            x = b.op("Mul", [down, b.const(np.array(100.0, np.float32), "k")], node_name="scale_100")
    x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x], axis=1)
    w = b.const(b.weight(10, cin), "fc_w")
    bias = b.const(np.zeros(10, np.float32), "fc_b")
    x = b.op("Gemm", [x, w, bias], transB=1)
    b.nodes[-1].output[0] = "logits"
    return b.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
    )


def transformer(size, planted=False):
    seq, d, heads, ff, layers = (128, 256, 4, 1024, 2) if size == "bench" else (32, 64, 4, 128, 2)
    dh = d // heads
    b = Builder(2)

    def layer_norm(x):
        g = b.const((1.0 + 0.1 * b.rng.randn(d)).astype(np.float32), "ln_g")
        beta = b.const((0.1 * b.rng.randn(d)).astype(np.float32), "ln_b")
        return b.op("LayerNormalization", [x, g, beta], axis=-1, epsilon=1e-5)

    def linear(x, din, dout):
        w = b.const(b.weight(din, dout, fan_in=din, scale=0.7), "lin_w")
        bias = b.const((0.02 * b.rng.randn(dout)).astype(np.float32), "lin_b")
        return b.op("Add", [b.op("MatMul", [x, w]), bias])

    split_shape = b.const(np.array([1, seq, heads, dh], np.int64), "shape")
    merge_shape = b.const(np.array([1, seq, d], np.int64), "shape")
    scale = b.const(np.array(np.sqrt(dh), np.float32), "scale")
    half = b.const(np.array(0.5, np.float32), "half")
    one = b.const(np.array(1.0, np.float32), "one")
    sqrt2 = b.const(np.array(np.sqrt(2.0), np.float32), "sqrt2")

    x = "tokens"
    for layer in range(layers):
        if planted and layer == 1:
            # The residual stream scaled by 1e5 and back: the first layer overflows float16
            # (|x| > 0.65; > 1 with the factor clamped to 65504 as a float16 weight), the
            # second reads that overflow; both must stay in FP32.
            up = b.op("Mul", [x, b.const(np.array(1e5, np.float32), "k")], node_name="planted_scale_up")
            x = b.op("Mul", [up, b.const(np.array(1e-5, np.float32), "k")], node_name="planted_scale_down")
        h = layer_norm(x)
        q, k, v = (b.op("Transpose", [b.op("Reshape", [linear(h, d, d), split_shape])], perm=[0, 2, 1, 3]) for _ in range(3))
        kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
        att = b.op("Softmax", [b.op("Div", [b.op("MatMul", [q, kt]), scale])], axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [att, v])], perm=[0, 2, 1, 3])
        x = b.op("Add", [x, linear(b.op("Reshape", [ctx, merge_shape]), d, d)])
        h = linear(layer_norm(x), d, ff)
        # GELU as its exact Erf form (what exporters emit before opset 20).
        gelu = b.op("Mul", [b.op("Mul", [h, half]), b.op("Add", [b.op("Erf", [b.op("Div", [h, sqrt2])]), one])])
        x = b.op("Add", [x, linear(gelu, ff, d)])
    x = layer_norm(x)
    b.nodes[-1].output[0] = "hidden"
    return b.model(
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [1, seq, d])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, seq, d])],
    )


def mlp(size):
    b = Builder(3)
    w1, b1 = b.const(b.weight(64, 128, fan_in=64)), b.const(np.full(128, 0.01, np.float32))
    w2, b2 = b.const(b.weight(128, 64, fan_in=128)), b.const(np.zeros(64, np.float32))
    w3, b3 = b.const(b.weight(64, 10, fan_in=64)), b.const(np.zeros(10, np.float32))
    x = b.op("Relu", [b.op("Gemm", ["x", w1, b1])])
    x = b.op("Tanh", [b.op("Gemm", [x, w2, b2])])
    x = b.op("Softmax", [b.op("Gemm", [x, w3, b3])], axis=-1)
    b.nodes[-1].output[0] = "probs"
    return b.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
    )


def needs_constraints(size):
    """Polygraphy's examples/cli/run/08_adding_precision_constraints model, rebuilt."""
    n = 256
    flip = np.flip(np.identity(n, dtype=np.float32), axis=1).copy()
    fp16_max = np.array(np.finfo(np.float16).max, np.float32)
    inits = [
        numpy_helper.from_array(flip, "flip"),
        numpy_helper.from_array(fp16_max, "fp16_max"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "flip"], ["matmul_out"], name="MatMul"),
        helper.make_node("Add", ["matmul_out", "fp16_max"], ["add_out"], name="Add"),
        helper.make_node("Sub", ["add_out", "fp16_max"], ["sub_out"], name="Sub"),
        helper.make_node("MatMul", ["sub_out", "flip"], ["output"], name="MatMul_1"),
    ]
    g = helper.make_graph(
        nodes,
        "needs_constraints",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, n, n])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1, n, n])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="mixprec-gen")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def decomposed_layernorm(size):
    """A LayerNorm written out as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add (what
    exporters emit before opset 17), between two MatMuls: under --fusion tensorrt the nine
    nodes are one region whose statistics stay in f32."""
    seq, d = (128, 256) if size == "bench" else (16, 64)
    b = Builder(4)
    x = b.op("MatMul", ["x", b.const(b.weight(d, d, fan_in=d), "w_in")], node_name="proj_in")
    mean = b.op("ReduceMean", [x], node_name="ln_mean", axes=[-1])
    dev = b.op("Sub", [x, mean], node_name="ln_sub")
    sq = b.op("Pow", [dev, b.const(np.array(2.0, np.float32), "two")], node_name="ln_pow")
    var = b.op("ReduceMean", [sq], node_name="ln_var", axes=[-1])
    var = b.op("Add", [var, b.const(np.array(1e-5, np.float32), "eps")], node_name="ln_eps")
    std = b.op("Sqrt", [var], node_name="ln_sqrt")
    y = b.op("Div", [dev, std], node_name="ln_div")
    y = b.op("Mul", [y, b.const((1.0 + 0.1 * b.rng.randn(d)).astype(np.float32), "ln_g")], node_name="ln_gamma")
    y = b.op("Add", [y, b.const((0.1 * b.rng.randn(d)).astype(np.float32), "ln_b")], node_name="ln_beta")
    b.op("MatMul", [y, b.const(b.weight(d, d, fan_in=d), "w_out")], node_name="proj_out")
    b.nodes[-1].output[0] = "y"
    return b.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d])],
        opset=17,
    )


def control_flow(size):
    """Subgraphs reading outer-scope values, as exported voice-activity and decoder models do."""
    rng = np.random.RandomState(7)
    f32 = lambda a: np.asarray(a, np.float32)
    w = lambda *shape: f32(rng.randn(*shape) * 0.5)
    inits = [
        numpy_helper.from_array(w(4, 3, 3, 3), "conv0_w"),
        numpy_helper.from_array(w(4), "conv0_b"),
        numpy_helper.from_array(w(4, 4, 3, 3), "conv1_w"),
        numpy_helper.from_array(f32(1.5), "else_scale"),
        numpy_helper.from_array(f32(0.0), "zero"),
        numpy_helper.from_array(w(4, 4), "wh"),
        numpy_helper.from_array(w(4, 4), "wf"),
        numpy_helper.from_array(w(4), "loop_bias"),
        numpy_helper.from_array(np.array(3, np.int64), "trip"),
        numpy_helper.from_array(np.array(True), "true"),
    ]
    vi = helper.make_tensor_value_info
    dyn4 = ["n", "c", "h", "w"]
    # then: Relu(Conv(c0, conv1_w)) [1,4,8,8]; else: mean over H, W of c0 * else_scale + local bias [1,4,1,1].
    then_g = helper.make_graph(
        [
            helper.make_node("Conv", ["c0", "conv1_w"], ["t_conv"], name="then_conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["t_conv"], ["t_out"], name="then_relu"),
        ],
        "then",
        [],
        [vi("t_out", TensorProto.FLOAT, dyn4)],
    )
    else_g = helper.make_graph(
        [
            helper.make_node("Mul", ["c0", "else_scale"], ["e_mul"], name="else_mul"),
            helper.make_node("ReduceMean", ["e_mul"], ["e_mean"], name="else_mean", axes=[2, 3], keepdims=1),
            helper.make_node("Add", ["e_mean", "e_bias"], ["e_out"], name="else_add"),
        ],
        "else",
        [],
        [vi("e_out", TensorProto.FLOAT, dyn4)],
        [numpy_helper.from_array(f32([[[[0.25]]]]), "e_bias")],
    )
    then_g2, else_g2 = onnx.GraphProto(), onnx.GraphProto()
    then_g2.CopyFrom(then_g)
    else_g2.CopyFrom(else_g)
    for g, suffix in ((then_g2, "2"), (else_g2, "2")):
        g.name += suffix
        for n in g.node:
            n.name += suffix
            n.output[:] = [o + suffix for o in n.output]
            n.input[:] = [i + suffix if i in ("t_conv", "e_mul", "e_mean") else i for i in n.input]
        for o in g.output:
            o.name += suffix
        for t in g.initializer:
            t.name += suffix
        for n in g.node:
            n.input[:] = [i + suffix if i == "e_bias" else i for i in n.input]
    # Loop body: h' = Tanh(h @ wh + feat @ wf + i * 0.1); nested If: i < 2 ? h' + feat : h' - loop_bias.
    inner_then = helper.make_graph(
        [helper.make_node("Add", ["h_new", "feat"], ["in_then"], name="inner_add")],
        "inner_then",
        [],
        [vi("in_then", TensorProto.FLOAT, [1, 4])],
    )
    inner_else = helper.make_graph(
        [helper.make_node("Sub", ["h_new", "loop_bias"], ["in_else"], name="inner_sub")],
        "inner_else",
        [],
        [vi("in_else", TensorProto.FLOAT, [1, 4])],
    )
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["h", "wh"], ["hw"], name="body_matmul_h"),
            helper.make_node("MatMul", ["feat", "wf"], ["fw"], name="body_matmul_f"),
            helper.make_node("Add", ["hw", "fw"], ["pre"], name="body_add"),
            helper.make_node("Cast", ["i"], ["i_f"], name="body_cast", to=TensorProto.FLOAT),
            helper.make_node("Mul", ["i_f", "tenth"], ["i_s"], name="body_scale"),
            helper.make_node("Add", ["pre", "i_s"], ["pre2"], name="body_add_i"),
            helper.make_node("Tanh", ["pre2"], ["h_new"], name="body_tanh"),
            helper.make_node("Less", ["i", "two"], ["early"], name="body_less"),
            helper.make_node("If", ["early"], ["h_out"], name="body_if", then_branch=inner_then, else_branch=inner_else),
            helper.make_node("Identity", ["c_in"], ["c_out"], name="body_cond"),
            helper.make_node("Identity", ["h_out"], ["h_scan"], name="body_scan"),
        ],
        "body",
        [vi("i", TensorProto.INT64, []), vi("c_in", TensorProto.BOOL, []), vi("h", TensorProto.FLOAT, [1, 4])],
        [vi("c_out", TensorProto.BOOL, []), vi("h_out", TensorProto.FLOAT, [1, 4]), vi("h_scan", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(f32(0.1), "tenth"), numpy_helper.from_array(np.array(2, np.int64), "two")],
    )
    nodes = [
        helper.make_node("Conv", ["x", "conv0_w", "conv0_b"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c0"], ["m"], name="mean", keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["pos"], name="greater"),
        helper.make_node("Not", ["pos"], ["neg"], name="not"),
        helper.make_node("If", ["pos"], ["y1"], name="if_pos", then_branch=then_g, else_branch=else_g),
        helper.make_node("If", ["neg"], ["y2"], name="if_neg", then_branch=then_g2, else_branch=else_g2),
        helper.make_node("Add", ["y1", "y2"], ["y"], name="add_branches"),
        helper.make_node("GlobalAveragePool", ["y"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["feat"], name="flatten"),
        helper.make_node("Loop", ["trip", "true", "feat"], ["h_final", "hs"], name="loop", body=body),
    ]
    g = helper.make_graph(
        nodes,
        "control_flow",
        [vi("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [vi("y", TensorProto.FLOAT, dyn4), vi("h_final", TensorProto.FLOAT, [1, 4]), vi("hs", TensorProto.FLOAT, [3, 1, 4])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="mixprec-gen")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def planted_square(size):
    hw = 64 if size == "bench" else 16
    b = Builder(4)
    w1 = b.const(b.weight(8, 3, 3, 3), "conv_w")
    x = b.op("Conv", ["input", w1, b.const(np.zeros(8, np.float32), "conv_b")], kernel_shape=[3, 3], pads=[1] * 4)
    up = b.op("Mul", [x, b.const(np.array(4096.0, np.float32), "k")], node_name="planted_scale_4096")
    sq = b.op("Mul", [up, up], node_name="planted_square")
    down = b.op("Mul", [sq, b.const(np.array(1.0 / 4096.0**2, np.float32), "k")], node_name="planted_unscale")
    y = b.op("Relu", [down])
    w2 = b.const(b.weight(4, 8, 3, 3), "conv_w")
    y = b.op("Conv", [y, w2, b.const(np.zeros(4, np.float32), "conv_b")], kernel_shape=[3, 3], pads=[1] * 4)
    y = b.op("GlobalAveragePool", [y])
    b.nodes[-1].output[0] = "pooled"
    return b.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 4, 1, 1])],
    )


def add_sub_cancellation(b):
    """Output 'y' = (x + 65504) - 65504 from the nodes 'Add' and 'Sub'."""
    big = b.const(np.array(np.finfo(np.float16).max, np.float32), "fp16_max")
    b.op("Sub", [b.op("Add", ["x", big], node_name="Add"), big], node_name="Sub")
    b.nodes[-1].output[0] = "y"


def planted_addsub(size):
    n = 256 if size == "bench" else 64
    b = Builder(5)
    add_sub_cancellation(b)
    return b.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n, n])],
    )


def planted_twins(size):
    n = 256 if size == "bench" else 64
    b = Builder(7)
    add_sub_cancellation(b)
    third = b.const(np.array(1.0 / 3.0, np.float32), "third")
    ta = b.op("Mul", ["x", third], node_name="planted_twin_a")
    tb = b.op("Mul", ["x", third], node_name="planted_twin_b")
    d = b.op("Sub", [ta, tb], node_name="twin_difference")
    b.op("Mul", [d, b.const(np.array(1000.0, np.float32), "k")], node_name="twin_scale")
    b.nodes[-1].output[0] = "twins"
    return b.model(
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n, n]),
         helper.make_tensor_value_info("twins", TensorProto.FLOAT, [1, n, n])],
    )


def decomposed_ln(size):
    seq, d = (128, 256) if size == "bench" else (16, 64)
    b = Builder(6)
    x = b.op("Mul", ["tokens", b.const(np.array(300.0, np.float32), "k")], node_name="activation_scale")
    mean = b.op("ReduceMean", [x], axes=[-1], keepdims=1)
    cen = b.op("Sub", [x, mean])
    var = b.op("ReduceMean", [b.op("Pow", [cen, b.const(np.array(2.0, np.float32), "two")])], axes=[-1], keepdims=1)
    std = b.op("Sqrt", [b.op("Add", [var, b.const(np.array(1e-5, np.float32), "eps")])])
    y = b.op("Div", [cen, std])
    y = b.op("Mul", [y, b.const((1.0 + 0.1 * b.rng.randn(d)).astype(np.float32), "ln_g")])
    y = b.op("Add", [y, b.const((0.1 * b.rng.randn(d)).astype(np.float32), "ln_b")])
    b.nodes[-1].output[0] = "normed"
    return b.model(
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [1, seq, d])],
        [helper.make_tensor_value_info("normed", TensorProto.FLOAT, [1, seq, d])],
    )


def qdq_cnn(size):
    """cnn quantized by ONNX Runtime's quantize_static (QDQ, uint8 activations, per-channel int8
    weights, minmax calibration on 8 inputs in [-1, 1]), then one activation range planted 64x too
    wide: the scale of the Q/DQ pair in front of '/Conv_7' (stage 3's second conv) is multiplied by
    64, as a calibration on the wrong data would leave it. The Q/DQ search must find '/Conv_7'."""
    import logging
    import tempfile

    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's advice on pre-processing
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    float_model = cnn(size)
    shape = [d.dim_value for d in float_model.graph.input[0].type.tensor_type.shape.dim]

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.RandomState(7)
            self.data = iter([{"input": rng.uniform(-1, 1, size=shape).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "float.onnx"), os.path.join(d, "qdq.onnx")
        onnx.save(float_model, src)
        quantize_static(src, dst, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        m = onnx.load(dst)
    producers = {o: n for n in m.graph.node for o in n.output}
    target = next(n for n in m.graph.node if n.name == "/Conv_7")
    dq = producers[target.input[0]]
    inits = {t.name: t for t in m.graph.initializer}
    scale = inits[dq.input[1]]
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(64.0), scale.name))
    m.producer_name = "onnxruntime.quantization (mixprec-gen, planted range)"
    onnx.checker.check_model(m)
    return m



def opset11_cnn(size):
    """A small CNN at ONNX opset 11 using every op whose meaning changed before 13 (PaddleOCR and
    older exporters write opset 11): Split with a `split` attribute, ReduceSum/Squeeze/Unsqueeze
    with `axes` attributes, Dropout with a `ratio` attribute, Softmax and LogSoftmax with the old
    coerce-to-2-D `axis`. `mixprec quantize --int8` must raise it to 13 without changing it."""
    b = Builder(11)
    x = b.op("Conv", ["input", b.const(b.weight(8, 3, 3, 3), "conv_w")], kernel_shape=[3, 3], pads=[1] * 4)
    x = b.op("Relu", [x])
    x = b.op("Conv", [x, b.const(b.weight(8, 8, 3, 3), "conv_w")], kernel_shape=[3, 3], pads=[1] * 4)
    a, c = b.op("Split", [x], n_out=2, axis=1, split=[3, 5])
    r = b.op("ReduceSum", [c], axes=[2, 3], keepdims=0)
    r = b.op("Squeeze", [b.op("Unsqueeze", [r], axes=[2])], axes=[2])
    r = b.op("Dropout", [r], ratio=0.2)
    logits = b.op("MatMul", [r, b.const(b.weight(5, 4), "fc_w")])
    probs = b.op("Softmax", [logits])
    maps = b.op("Conv", [a, b.const(b.weight(4, 3, 1, 1), "conv_w")], kernel_shape=[1, 1])
    logp = b.op("LogSoftmax", [maps], axis=1)
    b.nodes[-1].output[0] = "log_probs"
    for n in b.nodes:
        if n.output[0] == probs:
            n.output[0] = "probs"
    return b.model(
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, [1, 4, 16, 16])],
        opset=11,
    )

MODELS = {
    "cnn": cnn,
    "transformer": transformer,
    "mlp": mlp,
    "needs_constraints": needs_constraints,
    "planted_cnn": lambda size: cnn(size, planted=True),
    "planted_transformer": lambda size: transformer(size, planted=True),
    "control_flow": control_flow,
    "planted_square": planted_square,
    "planted_addsub": planted_addsub,
    "planted_twins": planted_twins,
    "decomposed_ln": decomposed_ln,
    "decomposed_layernorm": decomposed_layernorm,
    "qdq_cnn": qdq_cnn,
    "opset11_cnn": opset11_cnn,
}
INPUT_RANGES = {
    "cnn": (-1.0, 1.0),
    "transformer": (-1.0, 1.0),
    "mlp": (-2.0, 2.0),
    "needs_constraints": (1.0, 2.0),
    "planted_cnn": (-1.0, 1.0),
    "planted_transformer": (-1.0, 1.0),
    "control_flow": (-1.0, 1.0),
    "planted_square": (-1.0, 1.0),
    "planted_addsub": (1.0, 2.0),
    "planted_twins": (1.0, 2.0),
    "decomposed_ln": (-1.0, 1.0),
    "decomposed_layernorm": (-1.0, 1.0),
    "qdq_cnn": (-1.0, 1.0),
    "opset11_cnn": (-1.0, 1.0),
}


def reference(model_path, name, out_dir):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    rng = np.random.RandomState(123)
    lo, hi = INPUT_RANGES[name]
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 4 for d in i.shape]
        feeds[i.name] = rng.uniform(lo, hi, size=shape).astype(np.float32)
    outs = sess.run(None, feeds)
    os.makedirs(out_dir, exist_ok=True)
    for k, (n, v) in enumerate(feeds.items()):
        with open(os.path.join(out_dir, f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, n).SerializeToString())
    for k, (o, v) in enumerate(zip(sess.get_outputs(), outs)):
        with open(os.path.join(out_dir, f"output_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, o.name).SerializeToString())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=["test", "bench"], default="test")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-ort", action="store_true", help="write models only, no reference data")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    for name in names:
        path = os.path.join(args.out, f"{name}.onnx")
        tmp = path + ".tmp"
        onnx.save(MODELS[name](args.size), tmp)
        os.replace(tmp, path)
        if not args.no_ort:
            reference(path, name, os.path.join(args.out, name))
        print(path)
        if name == "mlp":
            # The same model with its weights in an external data file, to test that path.
            ext = os.path.join(args.out, "mlp_external.onnx")
            onnx.save(onnx.load(path), ext, save_as_external_data=True, all_tensors_to_one_file=True,
                      location="mlp_external.weights", size_threshold=0)
            print(ext)


if __name__ == "__main__":
    main()
