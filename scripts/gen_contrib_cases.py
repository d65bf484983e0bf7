#!/usr/bin/env python3
"""Writes one-node models of the com.microsoft ops mixprec runs, for comparison with ONNX Runtime.

Usage: gen_contrib_cases.py OUT_DIR

For each case: OUT_DIR/<name>/model.onnx and OUT_DIR/<name>/inputs/input_K.pb (deterministic
random data, NumPy seed fixed per case). tests/integration/contrib.rs runs ONNX Runtime on them
through scripts/ort_batch.py and compares mixprec's outputs with ORT's. Covered: the Gelu family,
FusedConv with every activation but Silu and the residual Z (ONNX Runtime 1.32's CPU provider
rewrites FusedConv to its NCHWc kernel, which refuses Silu; BiasAdd has no CPU kernel at all:
unit tests check those two), FusedMatMul with every
transpose flag, SkipLayerNormalization / SkipSimplifiedLayerNormalization with their optional
inputs and outputs, SimplifiedLayerNormalization, Attention and MultiHeadAttention with every
mask form, causality, past/present, attention bias, scale and filter value, RotaryEmbedding
(3-D and 4-D, interleaved, partial, position offset), MatMulNBits (4 and 8 bits, blocks 16-128,
K not a multiple of the block, zero points default/packed/float, g_idx, bias, accuracy_level 0
and 4, 3-D A) and GatherBlockQuantized (uint8, uint4, int4; gather_axis 0 and 1). Two chains
are also cases: `chain` (contrib ops of a transformer block) and `int4_chain` (ONNX Runtime
GenAI's int4 layout in small), which tests/integration/contrib.rs also exports in float16.
MoE and QMoE (ONNX Runtime GenAI's mixture-of-experts layers): every activation ONNX Runtime's
CPU kernels run, k 1-3, normalized routing or not, biases, 2-D and 3-D input, ties and -inf in
the router, sparse mixer; QMoE with 4 and 8 bits, per-row and per-block scales, zero points,
router_weights and accuracy_level 4. MRotaryEmbedding (M-RoPE of ONNX Runtime GenAI's Qwen2.5-VL
and Qwen3-VL: sectioned and interleaved layouts, 3-D and 4-D input, interleaved pairs, partial
rotary dimension with a scale, text positions) and GatedAdd (plain mode, NaN and infinities), all
bit for bit; the `rope_gate_chain` (the two in a row) is also exported in float16 by
tests/integration/contrib.rs. SparseAttention (Phi-3-small's block-sparse layouts: local blocks
and a vertical stride per layout, prompts, tokens and a chunk after a past, grouped KV heads,
packed QKV, rotary inside), bit for bit; ONNX Runtime runs these with present bound to past's
buffer (`ort_shared_buffers` in the model's metadata, scripts/ort_batch.py).
CausalConvWithState, VarlenCausalConvWithState and GatedRMSNorm (ONNX Runtime GenAI's Qwen3.5 /
Qwen3-Next linear-attention convolution and output norm, LFM2's short convolution): prompts with
and without a past, decode steps, dilation, channels-last, packed sequences (an empty one too),
the compact state capture, both gates, NaN and infinities, float32 and float16, all bit for bit;
the `conv_norm_chain` (the three in a row) is also exported in float16 by
tests/integration/contrib.rs.
LinearAttentionGate, LinearAttention and GatedDeltaNet (Qwen3.5 / Qwen3-Next linear attention:
prompts and decode steps after a past state, grouped and inverse-grouped heads, every update
rule, per-key-dimension decay, the three product orders of LinearAttention, GatedDeltaNet's
rank 3/4 layouts, ragged cu_seqlens, the builder's qwen gate, sigmoid beta, qk_l2_norm,
float16 data with a float32 state), bit for bit; the `linear_attention_chain` (the gate, then
GatedDeltaNet) is also exported in float16 by tests/integration/contrib.rs.
"""
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"


def case(out, name, op, inputs, n_outputs=1, domain=MS, seed=0, weights=(),
         out_type=onnx.TensorProto.FLOAT, omit_outputs=(), exact=False, metadata=None, **attrs):
    """inputs: list of (name, shape) or None for an omitted optional input; names in
    `weights` become initializers; outputs whose index is in `omit_outputs` are not asked
    for; `exact` asks the harness to compare float outputs bit for bit (an `exact` file in the
    case's directory; "avx2" or "avx512" there: only on hosts where ORT's MLAS runs that
    instruction set's kernels); `metadata` (a dict) goes into the model's metadata_props
    (scripts/ort_batch.py reads `ort_shared_buffers` there)."""
    rng = np.random.default_rng(seed)
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    names, graph_inputs, inits, k = [], [], [], 0
    for spec in inputs:
        if spec is None:
            names.append("")
            continue
        n, shape = spec[:2]
        v = spec[2] if len(spec) > 2 else rng.uniform(-2.0, 2.0, shape).astype(np.float32)
        names.append(n)
        if n in weights:
            inits.append(numpy_helper.from_array(v, n))
        else:
            elem = helper.np_dtype_to_tensor_dtype(v.dtype)
            graph_inputs.append(helper.make_tensor_value_info(n, elem, list(v.shape)))
            with open(os.path.join(d, "inputs", f"input_{k}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(v, n).SerializeToString())
            k += 1
    while names and names[-1] == "":
        names.pop()
    outs = ["" if i in omit_outputs else f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, name=name, domain=domain, **attrs)
    # out_type: one element type for every output, or a list of one per output.
    types = out_type if isinstance(out_type, (list, tuple)) else [out_type] * n_outputs
    graph = helper.make_graph(
        [node], name, graph_inputs,
        [helper.make_tensor_value_info(o, ty, None) for o, ty in zip(outs, types) if o],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    if metadata:
        onnx.helper.set_model_props(model, metadata)
    onnx.save(model, os.path.join(d, "model.onnx"))
    if exact:
        # True: bit for bit on every host. "avx2" / "avx512": bit for bit where ONNX Runtime's
        # MLAS runs that instruction set's kernels (their summation orders differ; mixprec's
        # answer is the same on every host), within the tolerance elsewhere.
        with open(os.path.join(d, "exact"), "w") as f:
            f.write("" if exact is True else exact)


def main():
    out = sys.argv[1]
    x = ("X", [2, 3, 8])
    # Activations.
    case(out, "gelu", "Gelu", [x])
    case(out, "fast_gelu", "FastGelu", [x])
    case(out, "fast_gelu_bias", "FastGelu", [x, ("bias", [8])], weights=("bias",))
    case(out, "bias_gelu", "BiasGelu", [x, ("B", [8])], weights=("B",))
    case(out, "quick_gelu", "QuickGelu", [x])
    case(out, "quick_gelu_alpha", "QuickGelu", [x], alpha=1.3)
    # Sigmoid and QuickGelu through MLAS's logistic (ops/logistic.rs): bit for bit, over the
    # whole clamp range and beyond, with NaN and infinities.
    wide = np.concatenate([np.random.default_rng(7).uniform(-25.0, 25.0, 4093),
                           [np.nan, np.inf, -np.inf]]).astype(np.float32)
    case(out, "sigmoid_bitexact", "Sigmoid", [("X", None, wide)], domain="", exact=True)
    case(out, "quick_gelu_bitexact", "QuickGelu", [("X", None, wide)], exact=True, alpha=1.702)
    # Tanh through MLAS's tanh (ops/logistic.rs): bit for bit, over its clamp range [-9, 9]
    # and beyond, with NaN and infinities.
    case(out, "tanh_bitexact", "Tanh", [("X", None, wide)], domain="", exact=True)
    # Erf through MLAS's erf (ops/logistic.rs): bit for bit around both branches, the split
    # at 0.921875, where erf reaches 1 (3.7-3.95), NaN and infinities.
    erf_x = np.concatenate([np.random.default_rng(8).uniform(-5.0, 5.0, 3790),
                            np.linspace(3.7, 3.95, 300),
                            [0.921875, -0.921875, np.nextafter(0.921875, 0), 3.725, -0.0,
                             np.nan, np.inf, -np.inf]]).astype(np.float32)
    case(out, "erf_bitexact", "Erf", [("X", None, erf_x)], domain="", exact=True)
    # Gelu/BiasGelu (erf) and FastGelu (tanh) through the same MLAS functions: bit for bit.
    gelu_x = (erf_x * np.float32(1.41421356)).astype(np.float32)
    case(out, "gelu_bitexact", "Gelu", [("X", None, gelu_x)], exact=True)
    case(out, "fast_gelu_bitexact", "FastGelu", [("X", None, wide)], exact=True)
    # Softmax along the last axis: MLAS's exponentials (each one ORT's bits); the sum they are
    # divided by is f64 in a fixed order in mixprec, f32 in the CPU's vector-lane order in ORT,
    # so a row's probabilities may differ from ORT's by the last bit of the normalizer.
    rows = np.random.default_rng(9).uniform(-30.0, 30.0, (64, 128)).astype(np.float32)
    rows[5, 7] = -np.inf
    case(out, "softmax_rows", "Softmax", [("X", None, rows)], domain="")
    long_rows = np.random.default_rng(10).normal(0.0, 4.0, (7, 1000)).astype(np.float32)
    case(out, "softmax_long_rows", "Softmax", [("X", None, long_rows)], domain="")
    # BiasAdd has no CPU kernel in ONNX Runtime (CUDA only): its unit test checks the formula.
    # FusedConv.
    conv = [("X", [1, 4, 7, 6]), ("W", [6, 4, 3, 3]), ("B", [6])]
    for act, params in [(None, None), ("Relu", None), ("Tanh", None),
                        ("Sigmoid", None), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.8]),
                        ("HardSigmoid", [0.3, 0.4])]:
        kw = {"pads": [1, 1, 1, 1]}
        if act:
            kw["activation"] = act
        if params:
            kw["activation_params"] = params
        case(out, f"fused_conv_{(act or 'none').lower()}", "FusedConv", conv,
             weights=("W", "B"), **kw)
    case(out, "fused_conv_relu_z", "FusedConv", conv + [("Z", [1, 6, 4, 3])],
         weights=("W", "B"), activation="Relu", strides=[2, 2], pads=[1, 1, 1, 1])
    case(out, "fused_conv_grouped_no_bias", "FusedConv",
         [("X", [2, 4, 5, 5]), ("W", [4, 2, 3, 3])], weights=("W",), group=2,
         activation="LeakyRelu", activation_params=[0.01])
    # FusedMatMul.
    case(out, "fused_matmul_alpha", "FusedMatMul", [("A", [2, 3, 4]), ("B", [4, 5])], alpha=0.125)
    case(out, "fused_matmul_trans", "FusedMatMul", [("A", [2, 4, 3]), ("B", [2, 5, 4])],
         transA=1, transB=1)
    case(out, "fused_matmul_trans_batch_a", "FusedMatMul",
         [("A", [2, 3, 4, 5]), ("B", [3, 4, 5, 6])], transBatchA=1)
    case(out, "fused_matmul_trans_batch_both", "FusedMatMul",
         [("A", [2, 3, 5, 4]), ("B", [6, 3, 5, 2])], transBatchA=1, transA=1, transBatchB=1,
         transB=1, alpha=0.5)
    # Normalizations.
    h = [2, 3, 16]
    case(out, "skip_layer_norm", "SkipLayerNormalization",
         [("input", h), ("skip", h), ("gamma", [16]), ("beta", [16])],
         weights=("gamma", "beta"), epsilon=1e-5)
    case(out, "skip_layer_norm_all_outputs", "SkipLayerNormalization",
         [("input", h), ("skip", [3, 16]), ("gamma", [16]), ("beta", [16]), ("bias", [16])],
         n_outputs=4, weights=("gamma", "beta", "bias"))
    case(out, "skip_layer_norm_no_beta_bias", "SkipLayerNormalization",
         [("input", [5, 16]), ("skip", [5, 16]), ("gamma", [16]), None, ("bias", [16])],
         weights=("gamma", "bias"))
    case(out, "skip_simplified_layer_norm", "SkipSimplifiedLayerNormalization",
         [("input", h), ("skip", [1, 3, 16]), ("gamma", [16]), ("bias", [16])],
         n_outputs=4, weights=("gamma", "bias"), epsilon=1e-6)
    case(out, "simplified_layer_norm", "SimplifiedLayerNormalization",
         [("X", h), ("scale", [16])], n_outputs=2, domain="", weights=("scale",))
    case(out, "simplified_layer_norm_axis1", "SimplifiedLayerNormalization",
         [("X", [2, 3, 4]), ("scale", [3, 4])], domain="", weights=("scale",), axis=1,
         epsilon=1e-3)
    ort_norm_cases(out)
    attention_cases(out)
    gqa_cases(out)
    qlinear_cases(out)
    qlinear_binary_cases(out)
    qlinear_concat_pool_cases(out)
    dq_lstm_cases(out)
    qlinear_conv_cases(out)
    nbits_cases(out)
    chain(out)
    int4_chain(out)
    rope_gate_chain(out)
    moe_cases(out)
    mrotary_cases(out)
    gated_add_cases(out)
    sparse_attention_cases(out)
    linear_attention_conv_norm_cases(out)
    linear_attention_cases(out)


def qlinear_cases(out):
    rng = np.random.default_rng(3)
    f32 = lambda v: np.array(v, dtype=np.float32)
    for t, lo, hi in [(np.uint8, 0, 256), (np.int8, -128, 128)]:
        x = ("X", [2, 3, 8], rng.integers(lo, hi, [2, 3, 8]).astype(t))
        zp = lambda v: np.array(v, dtype=t)
        name = t.__name__
        code = helper.np_dtype_to_tensor_dtype(np.dtype(t))
        case(out, f"qlinear_sigmoid_{name}", "QLinearSigmoid",
             [x, ("X_scale", [], f32(0.05)), ("X_zero_point", [], zp(3)),
              ("Y_scale", [], f32(1 / 256)), ("Y_zero_point", [], zp(lo))], out_type=code)
        case(out, f"qlinear_leaky_relu_{name}", "QLinearLeakyRelu",
             [x, ("X_scale", [], f32(0.07)), ("X_zero_point", [], zp(-5 if lo else 100)),
              ("Y_scale", [], f32(0.05)), ("Y_zero_point", [], zp(10))], alpha=0.13,
             out_type=code)
    # X_zero_point omitted (ONNX Runtime 1.32 aborts when the trailing Y_zero_point is).
    case(out, "qlinear_sigmoid_no_x_zero_point", "QLinearSigmoid",
         [("X", [4, 5], rng.integers(0, 256, [4, 5]).astype(np.uint8)),
          ("X_scale", [], f32(0.1)), None, ("Y_scale", [], f32(1 / 255)),
          ("Y_zero_point", [], np.array(0, dtype=np.uint8))],
         out_type=onnx.TensorProto.UINT8)


def qlinear_binary_cases(out):
    """QLinearAdd / QLinearMul: every broadcast loop of ONNX Runtime (both operands spanning,
    B or A constant along the innermost axis, a scalar), scale ratios that make exact ties
    (0.1 / 0.2 / 0.25) and ones that do not, more than 32 elements (the AVX2 loop and its
    tail)."""
    rng = np.random.default_rng(5)
    f32 = lambda v: np.array(v, dtype=np.float32)
    shapes = {"same": ([8, 16, 64], [8, 16, 64]), "row": ([2, 3, 40], [40]),
              "col": ([2, 3, 40], [2, 3, 1]), "scalar_a": ([], [2, 3, 40]),
              "col_a": ([2, 3, 1], [2, 3, 40])}
    scales = {"ties": (0.1, 0.2, 0.25), "odd": (0.0371, 0.0523, 0.0611)}
    for t, lo, hi in [(np.uint8, 0, 256), (np.int8, -128, 128)]:
        code = helper.np_dtype_to_tensor_dtype(np.dtype(t))
        zp = lambda v: np.array(v, dtype=t)
        for sname, (sa, sb, sc) in scales.items():
            for shname, (ash, bsh) in shapes.items():
                a = rng.integers(lo, hi, ash).astype(t)
                b = rng.integers(lo, hi, bsh).astype(t)
                zs = (zp(lo + 7), zp(lo + 130), zp(lo + 100))
                for op in ["QLinearAdd", "QLinearMul"]:
                    case(out, f"{op}_{t.__name__}_{sname}_{shname}".lower(), op,
                         [("A", ash, a), ("A_scale", [], f32(sa)), ("A_zero_point", [], zs[0]),
                          ("B", bsh, b), ("B_scale", [], f32(sb)), ("B_zero_point", [], zs[1]),
                          ("C_scale", [], f32(sc)), ("C_zero_point", [], zs[2])],
                         out_type=code)


def qlinear_concat_pool_cases(out):
    """QLinearConcat (an input on the output's grid is copied, others requantized) and the two
    quantized average pools: NCHW and channels_last, pads, strides, ceil_mode,
    count_include_pad, 1-D and 2-D windows, and a window covering the whole image (ONNX
    Runtime's integer global path)."""
    rng = np.random.default_rng(6)
    f32 = lambda v: np.array(v, dtype=np.float32)
    for t, lo, hi in [(np.uint8, 0, 256), (np.int8, -128, 128)]:
        code = helper.np_dtype_to_tensor_dtype(np.dtype(t))
        zp = lambda v: np.array(v, dtype=t)
        name = t.__name__
        xs = [rng.integers(lo, hi, [2, c, 5]).astype(t) for c in (3, 1, 4)]
        case(out, f"qlinear_concat_{name}", "QLinearConcat",
             [("Y_scale", [], f32(0.05)), ("Y_zero_point", [], zp(lo + 120)),
              ("X0", [2, 3, 5], xs[0]), ("S0", [], f32(0.05)), ("Z0", [], zp(lo + 120)),
              ("X1", [2, 1, 5], xs[1]), ("S1", [], f32(0.1)), ("Z1", [], zp(lo + 3)),
              ("X2", [2, 4, 5], xs[2]), ("S2", [], f32(0.0377)), ("Z2", [], zp(lo + 200))],
             out_type=code, axis=1)
        q = lambda xs_, xz, ys_, yz: [("x_scale", [], f32(xs_)), ("x_zero_point", [], zp(xz)),
                                     ("y_scale", [], f32(ys_)), ("y_zero_point", [], zp(yz))]
        for last, shape in [(0, [2, 3, 5, 7]), (1, [2, 5, 7, 3])]:
            x = ("X", shape, rng.integers(lo, hi, shape).astype(t))
            case(out, f"qlinear_global_avg_pool_{name}_{last}", "QLinearGlobalAveragePool",
                 [x] + q(0.07, lo + 50, 0.05, lo + 9), out_type=code, channels_last=last)
        pool_shapes = {0: [1, 3, 9, 8], 1: [1, 9, 8, 3]}
        for last, shape in pool_shapes.items():
            x = ("X", shape, rng.integers(lo, hi, shape).astype(t))
            for k, attrs in enumerate([
                    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
                    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2],
                         count_include_pad=1),
                    dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1),
                    dict(kernel_shape=[3, 2], auto_pad="SAME_UPPER")]):
                case(out, f"qlinear_avg_pool_{name}_{last}_{k}", "QLinearAveragePool",
                     [x] + q(0.03, lo + 40, 0.02, lo + 100), out_type=code,
                     channels_last=last, **attrs)
        x = ("X", [1, 2, 10], rng.integers(lo, hi, [1, 2, 10]).astype(t))
        case(out, f"qlinear_avg_pool_{name}_1d", "QLinearAveragePool",
             [x] + q(0.1, lo + 10, 0.3, lo + 20), out_type=code, kernel_shape=[3], strides=[2],
             pads=[1, 1])
        x = ("X", [1, 2, 4, 4], rng.integers(lo, hi, [1, 2, 4, 4]).astype(t))
        case(out, f"qlinear_avg_pool_{name}_whole", "QLinearAveragePool",
             [x] + q(0.1, lo + 10, 0.03, lo + 20), out_type=code, kernel_shape=[4, 4])


def qlinear_conv_cases(out):
    """ONNX's QLinearConv against ONNX Runtime's kernel: uint8 per tensor with bias, pads and
    strides; int8 activations with per-channel int8 weights (zero point 0) and groups."""
    rng = np.random.default_rng(8)
    f32 = lambda v: np.array(v, dtype=np.float32)
    x = rng.integers(0, 256, [1, 4, 9, 8]).astype(np.uint8)
    w = rng.integers(0, 256, [6, 4, 3, 3]).astype(np.uint8)
    b = rng.integers(-2000, 2000, [6]).astype(np.int32)
    case(out, "qlinear_conv_uint8", "QLinearConv",
         [("x", [1, 4, 9, 8], x), ("x_scale", [], f32(0.02)),
          ("x_zero_point", [], np.array(120, np.uint8)), ("w", [6, 4, 3, 3], w),
          ("w_scale", [], f32(0.005)), ("w_zero_point", [], np.array(131, np.uint8)),
          ("y_scale", [], f32(0.03)), ("y_zero_point", [], np.array(100, np.uint8)),
          ("B", [6], b)],
         domain="", weights=("w", "w_scale", "w_zero_point", "B"),
         out_type=onnx.TensorProto.UINT8, pads=[1, 1, 1, 1], strides=[2, 1])
    x = rng.integers(-128, 128, [2, 4, 7, 7]).astype(np.int8)
    w = rng.integers(-127, 128, [8, 2, 3, 3]).astype(np.int8)
    ws = rng.uniform(0.002, 0.01, [8]).astype(np.float32)
    case(out, "qlinear_conv_int8_per_channel_group", "QLinearConv",
         [("x", [2, 4, 7, 7], x), ("x_scale", [], f32(0.05)),
          ("x_zero_point", [], np.array(-3, np.int8)), ("w", [8, 2, 3, 3], w),
          ("w_scale", [8], ws), ("w_zero_point", [8], np.zeros(8, np.int8)),
          ("y_scale", [], f32(0.04)), ("y_zero_point", [], np.array(5, np.int8))],
         domain="", weights=("w", "w_scale", "w_zero_point"),
         out_type=onnx.TensorProto.INT8, group=2, pads=[1, 1, 1, 1])


def dq_lstm_cases(out):
    """DynamicQuantizeLSTM as ONNX Runtime's quantize_dynamic writes it: uint8 weights per
    direction or per column (constant zero point), int8 per column (zero point 0); every
    direction, sequence_lens (Y's zero rows enter the next step's quantized product),
    initial states, peepholes, clip, input_forget, and Y not asked for."""
    rng = np.random.default_rng(7)

    def quant(w, signed, per_column):
        # w: [dirs, K, 4H] floats -> codes, scales, zero points.
        axis = (1,) if per_column else (1, 2)
        lo = np.minimum(w.min(axis=axis, keepdims=True), 0)
        hi = np.maximum(w.max(axis=axis, keepdims=True), 0)
        if signed:
            # 7-bit codes, as quantize_dynamic's reduce_range writes them: with 8-bit codes
            # ONNX Runtime's u8s8 products saturate on AVX2 CPUs without VNNI (vpmaddubsw
            # adds two u8*s8 products in int16), so its bits would depend on the CPU.
            scale = np.maximum(hi, -lo) / 63
            zp = np.zeros_like(scale)
            q = np.clip(np.round(w / scale), -63, 63).astype(np.int8)
        else:
            scale = (hi - lo) / 255
            zp = np.round(-lo / scale).max(axis=axis, keepdims=True) if per_column \
                else np.round(-lo / scale)
            zp = np.broadcast_to(zp.max(axis=-1, keepdims=True), scale.shape) \
                if per_column else zp
            q = np.clip(np.round(w / scale) + zp, 0, 255).astype(np.uint8)
        shape = (w.shape[0], w.shape[2]) if per_column else (w.shape[0],)
        zt = np.int8 if signed else np.uint8
        return (q, scale.reshape(shape).astype(np.float32),
                np.ascontiguousarray(zp.reshape(shape)).astype(zt))

    def lstm(name, seq, batch, inp, hid, direction, signed, per_column, lens=None,
             states=False, peep=False, omit=(), **attrs):
        dirs = 2 if direction == "bidirectional" else 1
        w = rng.uniform(-0.6, 0.6, [dirs, inp, 4 * hid]).astype(np.float32)
        r = rng.uniform(-0.6, 0.6, [dirs, hid, 4 * hid]).astype(np.float32)
        wq, ws, wz = quant(w, signed, per_column)
        rq, rs, rz = quant(r, signed, per_column)
        f32 = lambda shape: rng.uniform(-1, 1, shape).astype(np.float32)
        ins = [("X", [seq, batch, inp], f32([seq, batch, inp])),
               ("W", list(wq.shape), wq), ("R", list(rq.shape), rq),
               ("B", [dirs, 8 * hid], f32([dirs, 8 * hid])),
               ("sequence_lens", [batch], np.array(lens, dtype=np.int32))
               if lens is not None else None,
               ("initial_h", [dirs, batch, hid], f32([dirs, batch, hid])) if states else None,
               ("initial_c", [dirs, batch, hid], f32([dirs, batch, hid])) if states else None,
               ("P", [dirs, 3 * hid], f32([dirs, 3 * hid])) if peep else None,
               ("W_scale", list(ws.shape), ws), ("W_zero_point", list(wz.shape), wz),
               ("R_scale", list(rs.shape), rs), ("R_zero_point", list(rz.shape), rz)]
        # Bit for bit: the products are exact integer sums (any order), the gates follow ORT's
        # kernel expression for expression (MLAS sigmoid/tanh, Wb + Rb summed first).
        case(out, name, "DynamicQuantizeLSTM", ins, n_outputs=3, omit_outputs=omit,
             weights=("W", "R", "W_scale", "W_zero_point", "R_scale", "R_zero_point"),
             exact=True, hidden_size=hid, direction=direction, **attrs)

    lstm("dq_lstm_forward_u8", 5, 2, 4, 3, "forward", False, False, states=True)
    lstm("dq_lstm_bidirectional_i8_per_column", 6, 2, 5, 4, "bidirectional", True, True,
         lens=[6, 3], peep=True, clip=2.5)
    lstm("dq_lstm_reverse_u8_per_column", 4, 3, 3, 2, "reverse", False, True, lens=[4, 1, 3],
         states=True, input_forget=1, omit=(0,))
    lstm("dq_lstm_forward_lens_u8", 5, 3, 4, 3, "forward", False, False, lens=[5, 2, 4])


def attention_cases(out):
    i32 = lambda v: np.array(v, dtype=np.int32)
    x = ("input", [2, 3, 8])
    w = [("weights", [8, 24]), ("bias", [24])]
    att = dict(weights=("weights", "bias"), num_heads=2)
    case(out, "attention", "Attention", [x] + w, **att)
    case(out, "attention_mask_lengths", "Attention",
         [x] + w + [("mask_index", [2], i32([3, 2]))], **att)
    case(out, "attention_mask_end_start", "Attention",
         [x] + w + [("mask_index", [4], i32([3, 3, 0, 1]))], **att)
    case(out, "attention_mask_raw", "Attention",
         [x] + w + [("mask_index", [2, 3], i32([[1, 1, 0], [0, 1, 1]]))], **att)
    case(out, "attention_mask_3d", "Attention",
         [x] + w + [("mask_index", [2, 3, 3], i32(np.tril(np.ones([2, 3, 3]))))], **att)
    case(out, "attention_unidirectional", "Attention", [x] + w, unidirectional=1, **att)
    case(out, "attention_scale_filter", "Attention",
         [x] + w + [("mask_index", [2, 3], i32([[1, 0, 0], [0, 0, 0]]))], scale=0.3,
         mask_filter_value=-100.0, **att)
    case(out, "attention_qkv_hidden_sizes", "Attention",
         [x, ("weights", [8, 20]), ("bias", [20])], qkv_hidden_sizes=[8, 8, 4], **att)
    case(out, "attention_past_present", "Attention",
         [x] + w + [None, ("past", [2, 2, 2, 4, 4])], n_outputs=2, unidirectional=1, **att)
    case(out, "attention_bias", "Attention",
         [x] + w + [None, None, ("attention_bias", [1, 2, 3, 3])], **att)
    q, k, v = ("query", [2, 3, 8]), ("key", [2, 5, 8]), ("value", [2, 5, 4])
    case(out, "mha", "MultiHeadAttention", [q, k, v], num_heads=2)
    case(out, "mha_bias_padding", "MultiHeadAttention",
         [q, k, v, ("bias", [20]),
          ("key_padding_mask", [2, 5], i32([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))],
         weights=("bias",), num_heads=2, scale=0.5)
    case(out, "mha_lengths_bias", "MultiHeadAttention",
         [q, k, v, None, ("key_padding_mask", [2], i32([4, 2])),
          ("attention_bias", [2, 2, 3, 5])], num_heads=2)
    case(out, "mha_past", "MultiHeadAttention",
         [("query", [2, 1, 8]), ("key", [2, 1, 8]), ("value", [2, 1, 8]), None, None, None,
          ("past_key", [2, 2, 4, 4]), ("past_value", [2, 2, 4, 4])], n_outputs=3, num_heads=2)
    case(out, "mha_bnsh_key_value", "MultiHeadAttention",
         [q, ("key", [2, 2, 5, 4]), ("value", [2, 2, 5, 4])], num_heads=2)
    # The qk output (scores after bias and mask), with a padding mask and attention bias, and
    # causal with a past.
    case(out, "mha_qk_output", "MultiHeadAttention",
         [q, k, v, None, ("key_padding_mask", [2, 5], i32([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1]])),
          ("attention_bias", [1, 2, 3, 5])], n_outputs=4, omit_outputs=(1, 2), num_heads=2)
    case(out, "mha_qk_output_causal_past", "MultiHeadAttention",
         [("query", [2, 2, 8]), ("key", [2, 2, 8]), ("value", [2, 2, 8]), None, None, None,
          ("past_key", [2, 2, 3, 4]), ("past_value", [2, 2, 3, 4])], n_outputs=4,
         num_heads=2, unidirectional=1)
    # RotaryEmbedding, bit for bit (MLAS's rotary kernel: fma(x1, cos, -x2·sin)).
    pos = ("position_ids", [2, 3], np.array([[0, 1, 2], [5, 3, 9]], dtype=np.int64))
    cache = [("cos_cache", [10, 4]), ("sin_cache", [10, 4])]
    case(out, "rotary", "RotaryEmbedding", [("input", [2, 3, 16]), pos] + cache, num_heads=2,
         exact=True)
    # Interleaved heads of 8 (not a multiple of the kernel's 16-wide step): ORT's last bits
    # follow neither the fused nor the plain rotation (not explained): within tolerance.
    case(out, "rotary_interleaved", "RotaryEmbedding", [("input", [2, 3, 16]), pos] + cache,
         interleaved=1, num_heads=2)
    case(out, "rotary_4d_offset", "RotaryEmbedding",
         [("input", [2, 2, 3, 8]), ("position_ids", [1], np.array([4], dtype=np.int64))] + cache,
         exact=True)
    case(out, "rotary_partial", "RotaryEmbedding",
         [("input", [2, 3, 16]), pos, ("cos_cache", [10, 2]), ("sin_cache", [10, 2])],
         num_heads=2, rotary_embedding_dim=4, exact=True)


def ort_norm_cases(out):
    """The normalizations bit for bit (src/ops/ort_norm.rs): row lengths on both sides of
    MLAS's AVX2 dispatch threshold (16 for RMS, 8 for LayerNorm) and of whole groups of 8 and
    4, rows of different scales (a last-bit difference here turns into another int8 code in a
    MatMulNBits with accuracy_level 4 after it)."""
    rng = np.random.default_rng(21)

    def rows(n, w):
        return (rng.standard_normal((n, w)) * rng.uniform(0.05, 20.0, (n, 1))
                + rng.uniform(-2.0, 2.0, (n, 1))).astype(np.float32)

    for w in (7, 15, 16, 23, 28, 31, 576):
        case(out, f"ort_norm_rms_{w}", "SimplifiedLayerNormalization",
             [("X", None, rows(40, w)), ("scale", [w])], n_outputs=2, domain="",
             weights=("scale",), exact=True)
    for w in (4, 7, 8, 15, 20, 23, 576):
        case(out, f"ort_norm_ln_{w}", "LayerNormalization",
             [("X", None, rows(40, w)), ("scale", [w]), ("B", [w])], n_outputs=3, domain="",
             weights=("scale", "B"), exact=True)
    case(out, "ort_norm_ln_no_bias_31", "LayerNormalization",
         [("X", None, rows(40, 31)), ("scale", [31])], n_outputs=3, domain="",
         weights=("scale",), exact=True)
    for w in (5, 23, 576):
        x = rows(30, w)
        case(out, f"ort_norm_skip_rms_{w}", "SkipSimplifiedLayerNormalization",
             [("input", None, x), ("skip", None, rows(30, w)), ("gamma", [w]), ("bias", [w])],
             n_outputs=4, weights=("gamma", "bias"), exact=True, epsilon=1e-5)
        case(out, f"ort_norm_skip_ln_{w}", "SkipLayerNormalization",
             [("input", None, x), ("skip", None, rows(30, w)), ("gamma", [w]), ("beta", [w]),
              ("bias", [w])], n_outputs=4, weights=("gamma", "beta", "bias"), exact=True,
             epsilon=1e-5)


def gqa_cases(out):
    """GroupQueryAttention, compared bit for bit (but head sinks and smooth softmax): prompt
    (right-padded batches, rows past a batch's length), token with a past (separate and
    shared-size buffers, different lengths per batch), a later prompt chunk, packed QKV, rotary
    (interleaved or not, partial, position_ids), local window (rows that see no key give 0),
    softcap, scale, head sinks, smooth softmax, attention bias, causal=0, kv_num_heads 1, and
    ONNX Runtime's flash kernel over several key and query blocks."""
    i32 = lambda v: np.array(v, dtype=np.int32)
    n, nk, h = 4, 2, 16
    heads = dict(num_heads=n, kv_num_heads=nk)

    def qkv(b, s, kv=nk, hs=h, packed=False):
        if packed:
            return [("query", [b, s, (n + 2 * kv) * hs]), None, None]
        return [("query", [b, s, n * hs]), ("key", [b, s, kv * hs]), ("value", [b, s, kv * hs])]

    def past(b, p, kv=nk, hs=h):
        return [("past_key", [b, kv, p, hs]), ("past_value", [b, kv, p, hs])]

    def lens(seqlens, total):
        return [("seqlens_k", [len(seqlens)], i32(seqlens)), ("total_sequence_length", [], i32(total))]

    rot = [("cos_cache", [16, h // 2]), ("sin_cache", [16, h // 2])]
    # Bit for bit (src/ops/contrib/group_query_attention.rs), but for the smooth softmax and
    # head sinks, whose scalar loop is not modelled (within the tolerance).
    g = lambda name, inputs, exact=True, **kw: case(out, name, "GroupQueryAttention", inputs,
                                                    n_outputs=3, exact=exact, **{**heads, **kw})
    g("gqa_prompt", qkv(1, 5) + [None, None] + lens([4], 5))
    g("gqa_prompt_batch2_padded", qkv(2, 5) + [None, None] + lens([4, 2], 5))
    g("gqa_token_past", qkv(2, 1) + past(2, 6) + lens([6, 3], 7))
    g("gqa_token_shared_buffer", qkv(2, 1) + past(2, 10) + lens([6, 3], 7))
    g("gqa_token_first", qkv(2, 1) + past(2, 6) + lens([0, 3], 7))
    g("gqa_prompt_chunk_after_past", qkv(1, 3) + past(1, 4) + lens([6], 7))
    g("gqa_packed_prompt", qkv(2, 5, packed=True) + [None, None] + lens([4, 2], 5))
    g("gqa_packed_token_rotary", qkv(2, 1, packed=True) + past(2, 6) + lens([6, 3], 7) + rot,
      do_rotary=1)
    g("gqa_rotary_prompt", qkv(2, 5) + [None, None] + lens([4, 2], 5) + rot, do_rotary=1)
    g("gqa_rotary_interleaved_token", qkv(2, 1) + past(2, 10) + lens([6, 3], 7) + rot,
      do_rotary=1, rotary_interleaved=1)
    g("gqa_rotary_interleaved_prompt", qkv(2, 5) + [None, None] + lens([4, 2], 5) + rot,
      do_rotary=1, rotary_interleaved=1)
    g("gqa_rotary_partial", qkv(2, 1, hs=32) + past(2, 6, hs=32) + lens([6, 3], 7)
      + [("cos_cache", [16, 8]), ("sin_cache", [16, 8])], do_rotary=1)
    g("gqa_rotary_position_ids", qkv(2, 1) + past(2, 6) + lens([6, 3], 7) + rot
      + [("position_ids", [2, 1], np.array([[2], [5]], dtype=np.int64))], do_rotary=1)
    g("gqa_local_window_prompt", qkv(2, 6) + [None, None] + lens([5, 1], 6),
      local_window_size=2)
    g("gqa_local_window_token", qkv(2, 1) + past(2, 6) + lens([6, 3], 7), local_window_size=3)
    g("gqa_softcap_scale", qkv(2, 5) + [None, None] + lens([4, 2], 5), softcap=1.5, scale=0.3)
    g("gqa_kv_heads_1", qkv(2, 1, kv=1) + past(2, 5, kv=1) + lens([5, 2], 6) + rot,
      kv_num_heads=1, do_rotary=1)
    g("gqa_head_sink", qkv(2, 1) + past(2, 6) + lens([6, 3], 7) + [None] * 4
      + [("head_sink", [n])], local_window_size=2, exact=False)
    g("gqa_smooth_softmax", qkv(2, 5) + [None, None] + lens([4, 2], 5), smooth_softmax=1,
      exact=False)
    g("gqa_attention_bias", qkv(2, 1) + past(2, 6) + lens([6, 3], 7) + [None] * 3
      + [("attention_bias", [1, n, 1, 7])], softcap=0.8)
    g("gqa_attention_bias_prompt", qkv(2, 5) + [None, None] + lens([4, 2], 5) + [None] * 3
      + [("attention_bias", [2, 1, 5, 5])])
    g("gqa_not_causal", qkv(2, 5) + [None, None] + lens([4, 2], 5), causal=0)
    # ONNX Runtime's flash kernel with several key and query blocks (blocks sized by the L2
    # cache: 128 keys for head size 128 with a 512 KiB L2), a last query block of one row, and
    # a token over a long past.
    big = dict(num_heads=2, kv_num_heads=1)
    qkv_big = lambda s: [("query", [1, s, 256]), ("key", [1, s, 128]), ("value", [1, s, 128])]
    for s_len in (300, 257):
        case(out, f"gqa_flash_blocks_prompt_{s_len}", "GroupQueryAttention",
             qkv_big(s_len) + [None, None] + lens([s_len - 1], s_len), n_outputs=3,
             exact="avx2", **big)
    case(out, "gqa_flash_blocks_token", "GroupQueryAttention",
         qkv_big(1) + [("past_key", [1, 1, 299, 128]), ("past_value", [1, 1, 299, 128])]
         + lens([299], 300), n_outputs=3, exact=True, **big)


def nbits_case(out, name, M, K, N, bits, bs, acc=0, zp=None, g_idx=False, bias=False, a_shape=None,
               seed=0, exact=False):
    """One MatMulNBits node: B, scales, zero points, g_idx and bias are initializers (ONNX
    Runtime's CompInt8 path, accuracy_level 4, needs a constant B). zp: None, "packed" (uint8)
    or "float"."""
    rng = np.random.default_rng(seed)
    kb = (K + bs - 1) // bs
    q = rng.integers(0, 2 ** bits, (N, kb * bs)).astype(np.uint8)
    if bits == 4:
        b = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(N, kb, bs // 2)
    else:
        b = q.reshape(N, kb, bs)
    # Scales keep |Y| near 10, so that the harness's 1e-4 relative tolerance is f32-sized.
    scales = rng.uniform(0.01, 0.1, (N, kb)).astype(np.float32) * (16.0 / 2 ** bits)
    inputs = [("A", a_shape or [M, K]), ("B", None, b), ("scales", None, scales)]
    weights = ["B", "scales"]
    if zp == "packed":
        z = rng.integers(0, 2 ** bits, (N, kb)).astype(np.uint8)
        if bits == 4:
            zz = np.zeros((N, (kb + 1) // 2), np.uint8)
            for j in range(kb):
                zz[:, j // 2] |= z[:, j] << (4 * (j % 2))
            z = zz
        inputs.append(("zero_points", None, z))
    elif zp == "float":
        inputs.append(("zero_points", None,
                       rng.uniform(0, 2 ** bits - 1, (N, kb)).astype(np.float32)))
    else:
        inputs.append(None)
    weights.append("zero_points")
    if g_idx:
        inputs.append(("g_idx", None, rng.permutation(np.arange(K) // bs).astype(np.int32)))
    else:
        inputs.append(None)
    weights.append("g_idx")
    if bias:
        inputs.append(("bias", [N]))
        weights.append("bias")
    case(out, name, "MatMulNBits", inputs, weights=tuple(weights), seed=seed, K=K, N=N,
         bits=bits, block_size=bs, accuracy_level=acc, exact=exact)


def nbits_cases(out):
    """MatMulNBits and GatherBlockQuantized against ONNX Runtime 1.32's CPU kernels."""
    nbits_case(out, "nbits_4b_bs32", 3, 64, 12, 4, 32)
    nbits_case(out, "nbits_4b_bs16_zp_bias", 2, 200, 10, 4, 16, zp="packed", bias=True, seed=1)
    nbits_case(out, "nbits_4b_bs128_k300_3d", 0, 300, 9, 4, 128, a_shape=[2, 3, 300], seed=2)
    nbits_case(out, "nbits_8b_bs32_zp", 4, 100, 7, 8, 32, zp="packed", seed=3)
    nbits_case(out, "nbits_8b_bs16_bias", 1, 48, 20, 8, 16, bias=True, seed=4)
    nbits_case(out, "nbits_4b_float_zp", 3, 96, 8, 4, 32, zp="float", seed=5)
    nbits_case(out, "nbits_4b_g_idx", 3, 80, 8, 4, 16, g_idx=True, seed=6)
    nbits_case(out, "nbits_4b_g_idx_float_zp", 2, 64, 6, 4, 32, zp="float", g_idx=True, seed=7)
    # With g_idx, ORT 1.32 ignores packed uint8 zero points (the default 8 applies).
    nbits_case(out, "nbits_4b_g_idx_packed_zp", 2, 64, 6, 4, 32, zp="packed", g_idx=True, seed=8)
    # accuracy_level 4: A quantized to int8 per block (MLAS CompInt8), M = 1 and M > 1.
    nbits_case(out, "nbits_acc4_4b_bs32", 3, 100, 12, 4, 32, acc=4, seed=9, exact="avx2")
    nbits_case(out, "nbits_acc4_4b_bs16_zp_bias", 1, 72, 10, 4, 16, acc=4, zp="packed", bias=True,
               seed=10)
    nbits_case(out, "nbits_acc4_4b_bs128_3d", 0, 256, 8, 4, 128, acc=4, a_shape=[2, 2, 256],
               seed=11)
    nbits_case(out, "nbits_acc4_8b_bs32_zp", 4, 96, 6, 8, 32, acc=4, zp="packed", seed=12)
    nbits_case(out, "nbits_acc4_8b_bs64", 2, 130, 5, 8, 64, acc=4, seed=13)
    # 4 bits in blocks of 32 with accuracy_level 4, bit for bit (ONNX Runtime GenAI's int4
    # layout): MLAS's AVX2 kernels for M = 1 (B's codes minus the zero point in the products)
    # and M > 1 (unsigned codes, the zero points added by a second GEMM), pairs of blocks and a
    # last odd one, columns in whole groups of four and the rest, zero points and bias.
    nbits_case(out, "nbits_exact_m1", 1, 576, 13, 4, 32, acc=4, seed=14, exact="avx2")
    nbits_case(out, "nbits_exact_m1_odd_zp_bias", 1, 160, 14, 4, 32, acc=4, zp="packed",
               bias=True, seed=15, exact="avx2")
    nbits_case(out, "nbits_exact_m16_bias", 16, 100, 15, 4, 32, acc=4, bias=True, seed=16,
               exact="avx2")
    nbits_case(out, "nbits_exact_m5_odd_zp", 5, 96, 9, 4, 32, acc=4, zp="packed", seed=17,
               exact="avx2")
    nbits_case(out, "nbits_exact_3d", 0, 1536, 8, 4, 32, acc=4, a_shape=[2, 3, 1536], seed=18,
               exact="avx2")
    # GatherBlockQuantized.
    rng = np.random.default_rng(20)
    idx = np.array([[3, 0], [-1, 2]], np.int64)
    packed = rng.integers(0, 256, (5, 32)).astype(np.uint8)  # 5 rows of 64 4-bit codes
    case(out, "gbq_uint8_4b", "GatherBlockQuantized",
         [("data", None, packed), ("indices", None, idx),
          ("scales", None, rng.uniform(0.1, 1, (5, 4)).astype(np.float32))],
         weights=("data", "scales"), block_size=16, bits=4, quantize_axis=1)
    case(out, "gbq_uint8_4b_zp", "GatherBlockQuantized",
         [("data", None, packed), ("indices", None, idx.astype(np.int32)),
          ("scales", None, rng.uniform(0.1, 1, (5, 2)).astype(np.float32)),
          ("zero_points", None, rng.integers(0, 256, (5, 1)).astype(np.uint8))],
         weights=("data", "scales", "zero_points"), block_size=32, bits=4, quantize_axis=1)
    case(out, "gbq_uint8_8b_zp", "GatherBlockQuantized",
         [("data", None, rng.integers(0, 256, (4, 40)).astype(np.uint8)),
          ("indices", None, np.array([1, 3, 1], np.int64)),
          ("scales", None, rng.uniform(0.01, 0.1, (4, 3)).astype(np.float32)),
          ("zero_points", None, rng.integers(0, 256, (4, 3)).astype(np.uint8))],
         weights=("data", "scales", "zero_points"), block_size=16, bits=8, quantize_axis=1)
    i4 = helper.make_tensor("data", onnx.TensorProto.INT4, [32, 6],
                            rng.integers(-8, 8, 32 * 6).tolist())
    u4 = helper.make_tensor("data", onnx.TensorProto.UINT4, [3, 40],
                            rng.integers(0, 16, 3 * 40).tolist())
    u4_zp = helper.make_tensor("zero_points", onnx.TensorProto.UINT4, [3, 3],
                               rng.integers(0, 16, 9).tolist())
    lowbit_case(out, "gbq_int4_gather_axis_1", i4,
                [("indices", None, np.array([5, 0, 5], np.int64)),
                 ("scales", None, rng.uniform(0.1, 1, (2, 6)).astype(np.float32))],
                gather_axis=1, quantize_axis=0, block_size=16)
    lowbit_case(out, "gbq_uint4_zp", u4,
                [("indices", None, np.array([[2], [0]], np.int32)),
                 ("scales", None, rng.uniform(0.1, 1, (3, 3)).astype(np.float32))],
                zp=u4_zp, gather_axis=0, quantize_axis=1, block_size=16)


def lowbit_case(out, name, data, rest, zp=None, **attrs):
    """GatherBlockQuantized with int4/uint4 data (and zero points) as initializers: NumPy has
    no 4-bit type, so they are made with onnx.helper and added to the model afterwards."""
    inputs = [("data", None, np.zeros(1, np.float32))] + rest
    weights = ["data", "scales"]
    if zp is not None:
        inputs.append(("zero_points", None, np.zeros(1, np.float32)))
        weights.append("zero_points")
    case(out, name, "GatherBlockQuantized", inputs, weights=tuple(weights), **attrs)
    path = os.path.join(out, name, "model.onnx")
    model = onnx.load(path)
    for i, init in enumerate(model.graph.initializer):
        if init.name == "data":
            model.graph.initializer[i].CopyFrom(data)
        elif init.name == "zero_points":
            model.graph.initializer[i].CopyFrom(zp)
    onnx.save(model, path)


def chain(out):
    """The ops chained as an optimized transformer block holds them, then a FusedConv: for
    the float16 plan, the search and the export (tests/integration/contrib.rs)."""
    rng = np.random.default_rng(7)
    d = os.path.join(out, "chain")
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)

    def w(n, shape):
        return numpy_helper.from_array(rng.uniform(-1, 1, shape).astype(np.float32), n)

    inits = [w("W", [16, 16]), w("b", [16]), w("g", [16]), w("be", [16]), w("s", [16]),
             w("CW", [8, 8, 1, 1]), w("CB", [8]),
             numpy_helper.from_array(np.array([3], np.int64), "ax")]
    nodes = [
        helper.make_node("FusedMatMul", ["X", "W"], ["mm"], domain=MS, name="mm", alpha=0.5),
        helper.make_node("BiasGelu", ["mm", "b"], ["bg"], domain=MS, name="bg"),
        helper.make_node("SkipLayerNormalization", ["bg", "X", "g", "be"], ["ln"], domain=MS,
                         name="ln"),
        helper.make_node("FastGelu", ["ln"], ["fg"], domain=MS, name="fg"),
        helper.make_node("SimplifiedLayerNormalization", ["fg", "s"], ["sl"], name="sl"),
        helper.make_node("Unsqueeze", ["sl", "ax"], ["u"], name="u"),
        helper.make_node("FusedConv", ["u", "CW", "CB"], ["Y"], domain=MS, name="fc",
                         activation="Relu"),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [1, 8, 16])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    onnx.save(model, os.path.join(d, "model.onnx"))
    x = rng.uniform(-1, 1, [1, 8, 16]).astype(np.float32)
    with open(os.path.join(d, "inputs", "input_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(x, "X").SerializeToString())


def rope_gate_chain(out):
    """ONNX Runtime GenAI's M-RoPE and shared-expert gate in small: MRotaryEmbedding (Qwen3-VL's
    interleaved sections) on X, then GatedAdd of the rotated X onto X. The float16 plan's
    export runs in ONNX Runtime (tests/integration/contrib.rs)."""
    rng = np.random.default_rng(24)
    d = os.path.join(out, "rope_gate_chain")
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    b, s, half, max_pos = 1, 4, 8, 10
    angles = rng.uniform(0.0, 6.0, (max_pos, half))
    inits = [numpy_helper.from_array(mrope_positions(rng, b, s, max_pos), "pos"),
             numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin"),
             numpy_helper.from_array(rng.uniform(-1, 1, (b, s, 1)).astype(np.float32), "gate")]
    nodes = [
        helper.make_node("MRotaryEmbedding", ["X", "pos", "cos", "sin"], ["rot"], domain=MS,
                         name="mrope", num_heads=2, mrope_section=[4, 2, 2], mrope_layout=1),
        helper.make_node("GatedAdd", ["X", "rot", "gate"], ["Y"], domain=MS, name="gate_add"),
    ]
    graph = helper.make_graph(
        nodes, "rope_gate_chain",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [b, s, 32])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    onnx.save(model, os.path.join(d, "model.onnx"))
    x = rng.uniform(-4, 4, [b, s, 32]).astype(np.float32)
    with open(os.path.join(d, "inputs", "input_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(x, "X").SerializeToString())


def int4_chain(out):
    """ONNX Runtime GenAI's int4 layout in small: a GatherBlockQuantized embedding (4 bits in
    uint8, zero points), two MatMulNBits with accuracy_level 4 in blocks of 32 (zero points and
    bias on the first; MLAS's AVX2 kernels, bit for bit), output `y_exact`, then an 8-bit
    accuracy_level 0 MatMulNBits (the float path), output `y`. For the float16 plan's export
    (tests/integration/contrib.rs); in float32 one more case of the harness."""
    rng = np.random.default_rng(21)
    d = os.path.join(out, "int4_chain")
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    vocab, k = 50, 64

    def pack4(q):
        return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)

    def nbits(name, a, y, k, n, bits, bs, acc, zp=False, bias=False):
        kb = (k + bs - 1) // bs
        q = rng.integers(0, 2 ** bits, (n, kb * bs)).astype(np.uint8)
        b = pack4(q).reshape(n, kb, bs // 2) if bits == 4 else q.reshape(n, kb, bs)
        s = rng.uniform(0.01, 0.1, (n, kb)).astype(np.float32) * (16.0 / 2 ** bits)
        inits = [numpy_helper.from_array(b, f"{name}.B"),
                 numpy_helper.from_array(s, f"{name}.scales")]
        ins = [a, f"{name}.B", f"{name}.scales"]
        if zp:
            inits.append(numpy_helper.from_array(
                pack4(rng.integers(0, 16, (n, kb + kb % 2)).astype(np.uint8)), f"{name}.zp"))
            ins.append(f"{name}.zp")
        if bias:
            ins += [""] * (5 - len(ins)) + [f"{name}.bias"]
            inits.append(numpy_helper.from_array(
                rng.uniform(-1, 1, n).astype(np.float32), f"{name}.bias"))
        node = helper.make_node("MatMulNBits", ins, [y], name=name, domain=MS, K=k, N=n,
                                bits=bits, block_size=bs, accuracy_level=acc)
        return node, inits

    emb_inits = [
        numpy_helper.from_array(pack4(rng.integers(0, 16, (vocab, k)).astype(np.uint8)), "emb.data"),
        numpy_helper.from_array(rng.uniform(0.05, 0.5, (vocab, k // 32)).astype(np.float32),
                                "emb.scales"),
        numpy_helper.from_array(pack4(rng.integers(0, 16, (vocab, 2)).astype(np.uint8)), "emb.zp"),
    ]
    nodes = [helper.make_node("GatherBlockQuantized", ["emb.data", "ids", "emb.scales", "emb.zp"],
                              ["e"], name="emb", domain=MS, bits=4, block_size=32, gather_axis=0,
                              quantize_axis=1)]
    inits = emb_inits
    for spec in [("qkv", "e", "h", k, 96, 4, 32, 4, True, True),
                 ("o_proj", "h", "y_exact", 96, 24, 4, 32, 4),
                 ("head", "y_exact", "y", 24, 10, 8, 16, 0)]:
        node, w = nbits(*spec)
        nodes.append(node)
        inits += w
    graph = helper.make_graph(
        nodes, "int4_chain", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in ("y_exact", "y")],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    onnx.save(model, os.path.join(d, "model.onnx"))
    ids = rng.integers(0, vocab, (2, 3)).astype(np.int64)
    with open(os.path.join(d, "inputs", "input_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(ids, "ids").SerializeToString())


def pack_codes(q: np.ndarray, bits: int) -> np.ndarray:
    """Codes along the last axis as QMoE stores them: 8-bit as is, 4-bit two per byte, the even
    element in the low nibble."""
    if bits == 8:
        return q.astype(np.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def moe_case(out: str, name: str, tokens: int, e: int, h: int, inter: int, seed: int,
             bits: int = 0, block_size: int = 0, zp: bool = False, bias: bool = False,
             x_shape: "list[int] | None" = None, router: "np.ndarray | None" = None,
             router_weights: bool = False, **attrs: object) -> None:
    """One MoE node (bits 0) or QMoE node (bits 4 or 8): the input and router logits are graph
    inputs, the experts initializers, FC1 of 2*inter rows for swiglu."""
    rng = np.random.default_rng(seed)
    f1 = 2 * inter if attrs.get("activation_type") == "swiglu" else inter
    x = rng.uniform(-2.0, 2.0, x_shape or [tokens, h]).astype(np.float32)
    logits = router if router is not None else rng.normal(0.0, 1.5, (tokens, e)).astype(np.float32)
    inputs: list = [("input", None, x), ("router_probs", None, logits)]
    weights = []

    def add(n: str, v: "np.ndarray | None") -> None:
        if v is None:
            inputs.append(None)
        else:
            inputs.append((n, None, v))
            weights.append(n)

    def quantized(n: str, rows: int, k: int) -> "tuple[np.ndarray, np.ndarray, np.ndarray | None]":
        """Random codes, scales per row or block, packed zero points (or None)."""
        blocks = k // block_size if block_size else 1
        q = rng.integers(0, 2 ** bits, (e, rows, k)).astype(np.uint8)
        scales = rng.uniform(0.005, 0.05, (e, rows, blocks) if block_size else (e, rows))
        z = None
        # Zero points near the middle of the codes, as a quantizer writes them: 8-bit codes
        # minus a zero point far off would give f32 sums whose rounding order shows.
        lo, hi = (0, 16) if bits == 4 else (120, 136)
        if zp:
            if block_size:
                z = pack_codes(rng.integers(lo, hi, (e, rows, blocks + blocks % 2)), bits)
                z = z[..., :(blocks * bits + 7) // 8]
            else:
                z = pack_codes(rng.integers(lo, hi, (e, rows + rows % 2)), bits)
                z = z[..., :(rows * bits + 7) // 8]
        return pack_codes(q, bits), scales.astype(np.float32), z

    b1 = rng.uniform(-0.5, 0.5, (e, f1)).astype(np.float32) if bias else None
    b2 = rng.uniform(-0.5, 0.5, (e, h)).astype(np.float32) if bias else None
    if bits == 0:
        add("fc1", rng.normal(0.0, 0.2, (e, f1, h)).astype(np.float32))
        add("fc1_bias", b1)
        add("fc2", rng.normal(0.0, 0.2, (e, h, inter)).astype(np.float32))
        add("fc2_bias", b2)
        op = "MoE"
    else:
        w1, s1, z1 = quantized("fc1", f1, h)
        w2, s2, z2 = quantized("fc2", h, inter)
        add("fc1", w1)
        add("fc1_scales", s1)
        add("fc1_bias", b1)
        add("fc2", w2)
        add("fc2_scales", s2)
        add("fc2_bias", b2)
        inputs += [None, None, None]
        add("fc1_zp", z1)
        add("fc2_zp", z2)
        if router_weights:
            inputs.append(None)
            inputs.append(("router_weights", None,
                           rng.uniform(0.0, 1.0, (tokens, e)).astype(np.float32)))
        attrs["expert_weight_bits"] = bits
        if block_size:
            attrs["block_size"] = block_size
        op = "QMoE"
    case(out, name, op, inputs, weights=tuple(weights), seed=seed, **attrs)


def moe_cases(out: str) -> None:
    """MoE and QMoE against ONNX Runtime 1.32's CPU kernels (`contrib_ops/cpu/moe/`)."""
    gptoss = dict(activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.702,
                  activation_beta=1.0, swiglu_limit=7.0, normalize_routing_weights=1, k=2)
    qwen = dict(activation_type="swiglu", swiglu_fusion=1, normalize_routing_weights=1, k=2)
    moe_case(out, "moe_relu_default", 6, 4, 32, 16, 1)
    moe_case(out, "moe_gelu_k2_bias", 7, 4, 32, 16, 2, bias=True, activation_type="gelu", k=2)
    moe_case(out, "moe_silu_k2_norm_3d", 6, 8, 32, 24, 3, x_shape=[2, 3, 32],
             activation_type="silu", k=2, normalize_routing_weights=1)
    moe_case(out, "moe_identity_k3", 5, 6, 16, 8, 4, bias=True, activation_type="identity", k=3)
    moe_case(out, "moe_swiglu_gptoss", 9, 8, 32, 16, 5, bias=True, **gptoss)
    moe_case(out, "moe_swiglu_qwen", 9, 8, 32, 16, 6, **qwen)
    # Phi-3.5-MoE's sparse mixer (k = 2): no effect on the CPU kernel.
    moe_case(out, "moe_sparse_mixer", 6, 4, 32, 16, 7, activation_type="silu", k=2,
             use_sparse_mixer=1)
    # Ties go to the larger expert index; a zero probability (-inf logit) drops the route, its
    # bias included.
    tie = np.array([[0.0, 0.0, 0.0, 0.0], [1.0, 0.5, 1.0, 0.5], [-np.inf, 0.0, -np.inf, -np.inf],
                    [2.0, -np.inf, 1.0, 0.0]], np.float32)
    moe_case(out, "moe_router_ties_and_inf", 4, 4, 16, 8, 8, bias=True, router=tie,
             activation_type="relu", k=2)
    moe_case(out, "qmoe_4b_row_gptoss", 7, 4, 64, 32, 9, bits=4, bias=True, **gptoss)
    moe_case(out, "qmoe_4b_bs32_zp_silu", 6, 4, 64, 32, 10, bits=4, block_size=32, zp=True,
             activation_type="silu", k=2)
    moe_case(out, "qmoe_4b_bs16_qwen", 8, 8, 64, 32, 11, bits=4, block_size=16, **qwen)
    moe_case(out, "qmoe_8b_bs32_qwen_3d", 6, 4, 64, 32, 12, bits=8, block_size=32,
             x_shape=[3, 2, 64], **qwen)
    moe_case(out, "qmoe_8b_row_zp_relu_k1", 5, 4, 32, 16, 13, bits=8, zp=True, bias=True,
             activation_type="relu", k=1)
    moe_case(out, "qmoe_4b_row_zp_gelu_k3", 5, 6, 32, 16, 14, bits=4, zp=True,
             activation_type="gelu", k=3)
    moe_case(out, "qmoe_8b_bs16_zp_identity", 5, 4, 32, 32, 15, bits=8, block_size=16, zp=True,
             activation_type="identity", k=2)
    # normalize_routing_weights is read only with router_weights (DeepSeek-style routing).
    moe_case(out, "qmoe_router_weights", 5, 4, 32, 16, 16, bits=4, block_size=16,
             router_weights=True, activation_type="silu", k=2)
    moe_case(out, "qmoe_router_weights_norm", 5, 4, 32, 16, 17, bits=4, block_size=16,
             router_weights=True, activation_type="silu", k=2, normalize_routing_weights=1)
    moe_case(out, "qmoe_acc4_4b_bs32", 6, 4, 64, 32, 18, bits=4, block_size=32,
             accuracy_level=4, **qwen)
    moe_case(out, "qmoe_router_ties", 4, 4, 32, 16, 19, bits=4, block_size=16, router=tie,
             activation_type="silu", k=2)


def mrope_positions(rng, b, s, max_pos, text_only=False):
    """position_ids `[3, B, S]` (T, H, W): distinct per stream, or one stream three times."""
    if text_only:
        t = np.arange(s, dtype=np.int64)[None, :] + np.arange(b, dtype=np.int64)[:, None]
        return np.stack([t, t, t])
    return rng.integers(0, max_pos, (3, b, s)).astype(np.int64)


def mrotary_cases(out: str) -> None:
    """MRotaryEmbedding (Qwen2.5-VL's sectioned and Qwen3-VL's interleaved M-RoPE) against
    ONNX Runtime 1.32's CPU kernel (`contrib_ops/cpu/bert/mrotary_embedding.cc`): bit for bit
    (MLAS's rotary kernel, the angles gathered per column from the T, H or W row)."""
    rng = np.random.default_rng(21)

    def mr(name, x_shape, b, s, half, section, max_pos=12, text_only=False, exact=True,
           **attrs):
        pos = ("position_ids", [3, b, s], mrope_positions(rng, b, s, max_pos, text_only))
        cache = [("cos_cache", [max_pos, half]), ("sin_cache", [max_pos, half])]
        case(out, name, "MRotaryEmbedding", [("input", x_shape), pos] + cache,
             mrope_section=section, exact=exact, **attrs)

    # Qwen2.5-VL: contiguous sections, 3-D input.
    mr("mrotary_sectioned", [2, 3, 32], 2, 3, 8, [2, 3, 3], num_heads=2)
    # Qwen3-VL: interleaved sections (H and W every third column), 4-D input.
    mr("mrotary_layout_interleaved", [2, 2, 3, 16], 2, 3, 8, [4, 2, 2], mrope_layout=1)
    # Interleaved H/W sections shorter than the columns they could reach.
    mr("mrotary_layout_interleaved_short", [1, 4, 48], 1, 4, 12, [8, 3, 1], num_heads=2,
       mrope_layout=1)
    # Rotated pairs interleaved (x[2i], x[2i+1]), heads of 16.
    mr("mrotary_pairs_interleaved", [2, 3, 32], 2, 3, 8, [2, 3, 3], num_heads=2, interleaved=1)
    # A partial rotary dimension (the rest copied) and a scale on the gathered angles.
    mr("mrotary_partial_scale", [2, 4, 32], 2, 4, 4, [2, 1, 1], num_heads=2,
       rotary_embedding_dim=8, scale=0.75)
    # Text tokens: T = H = W (RotaryEmbedding's result); one stream holding every column.
    mr("mrotary_text_positions", [1, 5, 24], 1, 5, 4, [1, 2, 1], num_heads=3, text_only=True)
    mr("mrotary_one_section", [2, 2, 4, 8], 2, 4, 4, [0, 4, 0], max_pos=6)


def gated_add_cases(out: str) -> None:
    """GatedAdd (Qwen-MoE's shared-expert gate, plain mode) against ONNX Runtime 1.32's CPU
    kernel (`contrib_ops/cpu/bert/gated_add.cc`): `X + Y·gate` bit for bit, NaN and
    infinities included."""
    case(out, "gated_add", "GatedAdd", [("X", [2, 3, 16]), ("Y", [2, 3, 16]), ("gate", [2, 3, 1])],
         exact=True)
    odd = np.random.default_rng(22).uniform(-2.0, 2.0, (6, 1)).astype(np.float32)
    odd[1, 0], odd[2, 0], odd[3, 0] = np.inf, np.nan, 0.0
    y = np.random.default_rng(23).uniform(-2.0, 2.0, (6, 7)).astype(np.float32)
    y[3, 2] = np.inf
    case(out, "gated_add_2d_nan_inf", "GatedAdd",
         [("X", [6, 7]), ("Y", [6, 7], y), ("gate", [6, 1], odd)], seed=1, exact=True)
    case(out, "gated_add_4d", "GatedAdd",
         [("X", [2, 2, 3, 5]), ("Y", [2, 2, 3, 5]), ("gate", [2, 2, 3, 1])], seed=2, exact=True)


def block_mask(max_blocks, local, stride, layouts):
    """Phi-3-small's block-sparse layouts in CSR form: block row r sees column blocks c <= r
    with r - c < `local` or (c + 1 + shift) % `stride` == 0, layout l shifting its vertical
    stride by l (heads cycle through the layouts); column lists padded with -1."""
    rows, cols = [], []
    for shift in range(layouts):
        r_idx, c_idx = [0], []
        for r in range(max_blocks):
            c_idx += [c for c in range(r + 1) if r - c < local or (c + 1 + shift) % stride == 0]
            r_idx.append(len(c_idx))
        rows.append(r_idx)
        cols.append(c_idx)
    nnz = max(len(c) for c in cols)
    cols = [c + [-1] * (nnz - len(c)) for c in cols]
    return np.array(rows, np.int32), np.array(cols, np.int32)


def sparse_attention_cases(out: str) -> None:
    """SparseAttention (Phi-3-small) against ONNX Runtime 1.32's CPU kernel
    (`contrib_ops/cpu/sparse/`), which needs present_key/value to share past's buffer: the
    models ask scripts/ort_batch.py to bind them so (`ort_shared_buffers`). Bit for bit (MLAS's
    GEMM and softmax, its rotary kernel)."""
    rng = np.random.default_rng(25)
    # The outputs are y0 (output), y1 (present_key), y2 (present_value).
    shared = {"ort_shared_buffers": "past_key:y1,past_value:y2"}

    def sa(name, b, s, total, n, nk, h, bs, max_blocks, local, stride, layouts, m=None,
           packed=False, rot=0, exact=True, **attrs):
        m = m or max_blocks * bs
        row, col = block_mask(max_blocks, local, stride, layouts)
        qkv = ([("query", [b, s, (n + 2 * nk) * h]), None, None] if packed else
               [("query", [b, s, n * h]), ("key", [b, s, nk * h]), ("value", [b, s, nk * h])])
        inputs = qkv + [
            ("past_key", [b, nk, m, h]), ("past_value", [b, nk, m, h]),
            ("block_row_indices", list(row.shape), row), ("block_col_indices", list(col.shape), col),
            ("total_sequence_length", [1], np.array([total], np.int32)),
            ("key_total_sequence_lengths", [b], np.full([b], total, np.int32))]
        if rot:
            angles = rng.uniform(0.0, 6.0, (m, rot))
            inputs += [("cos_cache", [m, rot], np.cos(angles).astype(np.float32)),
                       ("sin_cache", [m, rot], np.sin(angles).astype(np.float32))]
            attrs["do_rotary"] = 1
        case(out, name, "SparseAttention", inputs, n_outputs=3, exact=exact, metadata=shared,
             seed=int(rng.integers(1 << 30)), num_heads=n, kv_num_heads=nk, sparse_block_size=bs,
             **attrs)

    # Prompts: two layouts (heads alternate), grouped KV heads, a local window of 2 blocks and
    # every third block; one layout of blocks of 16.
    sa("sparse_prompt_gqa", 1, 24, 24, 4, 2, 16, 4, 8, 2, 3, 2)
    sa("sparse_prompt_bs16", 1, 40, 40, 2, 1, 16, 16, 4, 1, 2, 1, exact="avx2")
    # Tokens after a past (the cache a buffer of M rows), batch 2; a chunk of 5 after a past.
    sa("sparse_token_past", 2, 1, 21, 4, 2, 16, 4, 8, 2, 3, 2)
    sa("sparse_chunk_after_past", 1, 5, 13, 2, 2, 8, 4, 6, 1, 2, 2, m=30)
    # A dense layout (the whole lower triangle) and a scale.
    sa("sparse_dense_layout_scale", 1, 9, 9, 2, 1, 8, 4, 3, 3, 1, 1, scale=0.2)
    # Rotary inside: the prompt (positions 0..S), a token (position T-1) interleaved with a
    # partial rotary width, packed QKV.
    sa("sparse_rotary_prompt", 1, 12, 12, 2, 1, 32, 4, 4, 1, 2, 1, rot=16)
    sa("sparse_rotary_token_interleaved_partial", 2, 1, 14, 4, 2, 32, 4, 4, 2, 2, 2, rot=8,
       rotary_interleaved=1)
    sa("sparse_packed_rotary_token", 1, 1, 10, 2, 1, 16, 4, 4, 1, 2, 1, packed=True, rot=8)
    sa("sparse_packed_prompt", 2, 8, 8, 2, 2, 16, 4, 2, 1, 2, 2, packed=True)


def linear_attention_conv_norm_cases(out: str) -> None:
    """CausalConvWithState, VarlenCausalConvWithState and GatedRMSNorm (ONNX Runtime GenAI's
    Qwen3.5 / Qwen3-Next linear-attention convolution and output norm, LFM2's short
    convolution), bit for bit in float32 and float16."""
    rng = np.random.default_rng(41)
    f16 = np.float16

    def u(shape, lo=-2.0, hi=2.0, dtype=np.float32):
        return rng.uniform(lo, hi, shape).astype(dtype)

    def conv(name, b, c, l, k, past=True, bias=True, dtype=np.float32, channels_last=None,
             x=None, **attrs):
        pad = (k - 1) * attrs.get("dilation", 1)
        if channels_last is None:
            x_shape, s_shape = [b, c, l], [b, c, pad]
        else:
            x_shape, s_shape = [b, l] + channels_last, [b, pad] + channels_last
            attrs["channels_last"] = 1
        inputs = [("x", None, u(x_shape, dtype=dtype) if x is None else x),
                  ("weight", None, u([c, 1, k], -1.0, 1.0, dtype)),
                  ("bias", None, u([c], dtype=dtype)) if bias else None,
                  ("past_state", None, u(s_shape, dtype=dtype)) if past else None]
        out_type = onnx.TensorProto.FLOAT16 if dtype == f16 else onnx.TensorProto.FLOAT
        case(out, name, "CausalConvWithState", inputs, n_outputs=2, weights=("weight", "bias"),
             out_type=out_type, exact=True, **attrs)

    # Qwen3.5's layer (K 4, SiLU, a zero-or-trained bias): a prompt after a past, a prompt
    # without one, decode steps (ORT's fixed-K path; without a past only the last tap), a
    # prompt shorter than the state, K 6 (ORT's generic decode path).
    conv("causal_conv_prompt_past", 2, 16, 9, 4, activation="silu")
    conv("causal_conv_prompt_no_past", 1, 12, 7, 4, past=False, activation="silu")
    conv("causal_conv_decode_past", 3, 16, 1, 4, activation="silu")
    conv("causal_conv_decode_no_past", 2, 8, 1, 4, past=False, activation="swish")
    conv("causal_conv_short_prompt", 2, 8, 2, 4, activation="silu")
    conv("causal_conv_decode_k6", 1, 8, 1, 6, activation="silu")
    # LFM2's block (K 3, no activation, no bias).
    conv("causal_conv_lfm2_none_no_bias", 2, 12, 5, 3, bias=False)
    # Dilation: a prompt and a decode step (the generic path).
    conv("causal_conv_dilation2", 1, 8, 6, 3, activation="silu", dilation=2)
    conv("causal_conv_decode_dilation3", 2, 6, 1, 3, activation="silu", dilation=3)
    # Channels last with two trailing channel axes; a decode step channels last.
    conv("causal_conv_channels_last", 2, 12, 5, 4, channels_last=[2, 6], activation="silu")
    conv("causal_conv_channels_last_decode", 1, 8, 1, 4, channels_last=[8], activation="silu")
    # NaN and infinities propagate (SiLU of -inf is NaN there as in ORT: -inf / inf).
    bad = u([1, 4, 6])
    bad[0, 0, 1], bad[0, 1, 4], bad[0, 2, 0], bad[0, 3, 5] = np.nan, np.inf, -np.inf, 1e30
    conv("causal_conv_nan_inf", 1, 4, 6, 4, x=bad, activation="silu")
    # Float16 (ORT runs its float32 kernel between Casts).
    conv("causal_conv_f16_prompt", 2, 8, 5, 4, dtype=f16, activation="silu")
    conv("causal_conv_f16_decode", 2, 8, 1, 4, dtype=f16, activation="silu")

    def varlen(name, lens, c, k, bias=True, dtype=np.float32, capacity=0, counts=None, **attrs):
        n = len(lens)
        pad = (k - 1) * attrs.get("dilation", 1)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        inputs = [("x", None, u([int(cu[-1]), c], dtype=dtype)),
                  ("weight", None, u([c, 1, k], -1.0, 1.0, dtype)),
                  ("cu_seqlens", None, cu),
                  ("bias", None, u([c], dtype=dtype)) if bias else None,
                  ("initial_state", None, u([n, c, pad], dtype=dtype))]
        if capacity:
            inputs.append(("capture_count", None, np.array(counts, np.int32)))
            attrs["state_update_capacity"] = capacity
        out_type = onnx.TensorProto.FLOAT16 if dtype == f16 else onnx.TensorProto.FLOAT
        case(out, name, "VarlenCausalConvWithState", inputs, n_outputs=3 if capacity else 2,
             weights=("weight", "bias"), out_type=out_type, exact=True, **attrs)

    # Packed prompts of different lengths, decode steps (one token each), an empty sequence
    # (keeps its state), dilation without bias or activation, the compact state capture
    # (counts clamped to [0, min(capacity, length)]), float16.
    varlen("varlen_conv_prompts", [3, 5, 1], 12, 4, activation="silu")
    varlen("varlen_conv_decode", [1, 1, 1, 1], 16, 4, activation="silu")
    varlen("varlen_conv_empty_sequence", [2, 0, 3], 8, 4, activation="silu")
    varlen("varlen_conv_dilation2_none_no_bias", [4, 6], 8, 3, bias=False, dilation=2)
    varlen("varlen_conv_capture", [2, 1, 6, 3], 8, 4, capacity=3, counts=[5, -1, 2, 3],
           activation="silu")
    varlen("varlen_conv_f16", [3, 1, 4], 8, 4, dtype=f16, activation="silu")

    def norm(name, x_shape, c, dtype=np.float32, x=None, gate=None, **attrs):
        x = u(x_shape, -3.0, 3.0, dtype) if x is None else x
        gate = u(x_shape, -6.0, 6.0, dtype) if gate is None else gate
        out_type = onnx.TensorProto.FLOAT16 if dtype == f16 else onnx.TensorProto.FLOAT
        case(out, name, "GatedRMSNorm",
             [("X", None, x), ("scale", None, u([c], dtype=dtype)), ("gate", None, gate)],
             weights=("scale",), out_type=out_type, exact=True, **attrs)

    # Per-head norm of a packed [B, S, H*C] tensor (Qwen3.5: epsilon 1e-6, SiLU gate), whole
    # rows, the sigmoid gate, swish, the default epsilon on 1-D X, gates past MLAS's logistic
    # clamp, NaN and infinities, float16.
    norm("gated_rms_norm_heads", [2, 3, 64], 16, epsilon=1e-6)
    norm("gated_rms_norm_rows_sigmoid", [5, 48], 48, activation="sigmoid", epsilon=1e-6)
    norm("gated_rms_norm_swish", [7, 128], 32, activation="swish", epsilon=1e-5)
    norm("gated_rms_norm_1d_default_eps", [24], 8)
    wide = u([4, 32], -30.0, 30.0)
    wide[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    xs = u([4, 32], -3.0, 3.0)
    xs[1, 3], xs[2, 0], xs[3, 7] = np.nan, np.inf, 0.0
    xs[3, :] = 0.0
    norm("gated_rms_norm_nan_inf_zero_rows", [4, 32], 16, x=xs, gate=wide, epsilon=1e-6)
    norm("gated_rms_norm_f16", [2, 4, 32], 16, dtype=f16, epsilon=1e-6)
    norm("gated_rms_norm_f16_sigmoid", [6, 24], 24, dtype=f16, activation="sigmoid")
    conv_norm_chain(out)


def conv_norm_chain(out):
    """A Qwen3.5-style linear-attention tail in small: VarlenCausalConvWithState (two packed
    sequences) on X, GatedRMSNorm of it gated by X, then a channels-last CausalConvWithState.
    Its float16 export keeps the CausalConvWithState in float32 (ORT's CPU kernel is float32
    only) and runs in ONNX Runtime (tests/integration/contrib.rs)."""
    rng = np.random.default_rng(42)
    d = os.path.join(out, "conv_norm_chain")
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    t, c, k = 6, 16, 4
    u = lambda shape, lo=-1.0, hi=1.0: rng.uniform(lo, hi, shape).astype(np.float32)
    inits = [numpy_helper.from_array(u([c, 1, k]), "w1"),
             numpy_helper.from_array(np.array([0, 2, t], np.int32), "cu"),
             numpy_helper.from_array(u([c]), "b1"),
             numpy_helper.from_array(u([2, c, k - 1]), "state"),
             numpy_helper.from_array(u([8], 0.5, 1.5), "scale"),
             numpy_helper.from_array(np.array([1, t, c], np.int64), "shape"),
             numpy_helper.from_array(u([c, 1, 3]), "w2")]
    nodes = [
        helper.make_node("VarlenCausalConvWithState", ["X", "w1", "cu", "b1", "state"],
                         ["conv", "final_state"], domain=MS, name="varlen_conv",
                         activation="silu"),
        helper.make_node("GatedRMSNorm", ["conv", "scale", "X"], ["normed"], domain=MS,
                         name="gated_norm", epsilon=1e-6),
        helper.make_node("Reshape", ["normed", "shape"], ["normed3"], name="reshape"),
        helper.make_node("CausalConvWithState", ["normed3", "w2"], ["Y", "present"], domain=MS,
                         name="short_conv", channels_last=1),
    ]
    graph = helper.make_graph(
        nodes, "conv_norm_chain",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [t, c])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    onnx.save(model, os.path.join(d, "model.onnx"))
    x = rng.uniform(-2, 2, [t, c]).astype(np.float32)
    with open(os.path.join(d, "inputs", "input_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(x, "X").SerializeToString())
def linear_attention_cases(out: str) -> None:
    """LinearAttentionGate, LinearAttention and GatedDeltaNet (ONNX Runtime GenAI's Qwen3.5 /
    Qwen3-Next linear-attention layers), bit for bit with ONNX Runtime 1.32's CPU kernels:
    prompts and decode steps after a past state, grouped and inverse-grouped heads, every
    update rule, per-key-dimension decay, each of LinearAttention's three product orders (head
    sizes 16x32 vector, 72x64 MLAS, 8x8 and 48x48 scalar, 128x128 Qwen's), GatedDeltaNet's
    rank 3/4 layouts, ragged cu_seqlens and the builder's fused gate (softplus/qwen), sigmoid
    beta and qk_l2_norm."""
    def gate(name, shape, seed, b=True, dtype=np.float32):
        rng = np.random.default_rng(seed)
        h = shape[-1]
        a = rng.uniform(-25.0, 25.0, shape).astype(dtype)
        ins = [("a", None, a), ("dt_bias", None, rng.uniform(-2, 2, h).astype(np.float32)),
               ("decay_scale", None, -np.exp(rng.uniform(-3, 1, h)).astype(np.float32))]
        if b:
            ins.append(("b", None, rng.uniform(-20.0, 20.0, shape).astype(dtype)))
        out_type = onnx.TensorProto.FLOAT16 if dtype == np.float16 else onnx.TensorProto.FLOAT
        case(out, name, "LinearAttentionGate", ins, n_outputs=2 if b else 1, exact=True,
             out_type=out_type)
    gate("la_gate", [2, 5, 7], 1)
    gate("la_gate_no_beta", [3, 4], 2, b=False)
    gate("la_gate_f16", [2, 3, 6], 3, dtype=np.float16)

    def la(name, b, t, hq, hkv, dk, dv, seed, rule="gated_delta", past=True, per_key=False,
           beta_one=False, nk=None, **attrs):
        rng = np.random.default_rng(seed)
        nk = nk or hkv
        u = lambda *s: rng.uniform(-1.0, 1.0, s).astype(np.float32)
        k = u(b, t, nk, dk)
        k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(np.float32)
        ins = [("query", None, (u(b, t, hq * dk) / np.sqrt(dk)).astype(np.float32)),
               ("key", None, k.reshape(b, t, nk * dk)), ("value", None, u(b, t, hkv * dv)),
               ("past_state", None, u(b, hkv, dk, dv)) if past else None]
        gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        w = hkv * dk if per_key else hkv
        ins.append(("decay", None, -rng.uniform(0.0, 1.0, (b, t, w)).astype(np.float32))
                   if gated else None)
        ins.append(("beta", None, rng.uniform(0.0, 1.0, (b, t, 1 if beta_one else hkv))
                    .astype(np.float32)) if delta else None)
        # The vector path (dk a multiple of 16, dv of 32) and the MLAS path (dk·dv ≥ 4096)
        # were measured on an AVX-512 host; the scalar loops are the same everywhere.
        vector = dk % 16 == 0 and dv % 32 == 0
        isa = "avx512" if vector or dk * dv >= 4096 else True
        case(out, name, "LinearAttention", ins, n_outputs=2, exact=isa, q_num_heads=hq,
             kv_num_heads=hkv, update_rule=rule, **attrs)
    la("la_prompt_scalar", 2, 5, 4, 2, 8, 8, 10)
    la("la_token_scalar_48", 1, 1, 1, 1, 48, 48, 11, scale=1.0)
    la("la_prompt_vector", 1, 6, 2, 2, 16, 32, 12)
    la("la_token_vector_gqa", 2, 1, 4, 2, 32, 32, 13, scale=0.5)
    la("la_prompt_vector_inverse_gqa", 1, 4, 2, 4, 16, 32, 14, scale=1.0)
    la("la_prompt_mlas", 1, 3, 1, 1, 72, 64, 15)
    la("la_token_mlas_scale", 1, 1, 2, 2, 72, 64, 16, scale=0.7)
    la("la_qwen_128", 1, 3, 2, 4, 128, 128, 17, scale=1.0)
    la("la_prompt_no_past", 1, 4, 2, 2, 16, 32, 18, past=False)
    la("la_linear", 1, 4, 2, 2, 8, 8, 19, rule="linear")
    la("la_linear_vector", 1, 3, 1, 1, 16, 32, 20, rule="linear")
    la("la_gated_per_key", 1, 4, 2, 2, 8, 8, 21, rule="gated", per_key=True)
    la("la_gated_per_key_vector", 1, 3, 1, 1, 16, 32, 22, rule="gated", per_key=True)
    la("la_delta_beta_one", 1, 4, 2, 2, 8, 8, 23, rule="delta", beta_one=True)
    la("la_delta_vector", 1, 3, 2, 2, 16, 32, 24, rule="delta")
    la("la_key_heads_shared", 1, 3, 2, 4, 8, 8, 25, nk=2)

    # Float16 query, key, value, decay and beta with a float32 state: ORT 1.32 runs it as its
    # float32 kernel between Casts it inserts, the state left float32 (measured).
    f16, F16, F32 = np.float16, onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    rng = np.random.default_rng(26)
    b, t, h, dk, dv = 1, 4, 2, 16, 32
    u = lambda *s: rng.uniform(-1.0, 1.0, s)
    k = u(b, t, h, dk)
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).reshape(b, t, h * dk)
    case(out, "la_f16_state_f32", "LinearAttention",
         [("query", None, (u(b, t, h * dk) / 4).astype(f16)), ("key", None, k.astype(f16)),
          ("value", None, u(b, t, h * dv).astype(f16)),
          ("past_state", None, u(b, h, dk, dv).astype(np.float32)),
          ("decay", None, -rng.uniform(0, 1, (b, t, h)).astype(f16)),
          ("beta", None, rng.uniform(0, 1, (b, t, h)).astype(f16))],
         n_outputs=2, exact="avx512", out_type=[F16, F32], q_num_heads=h, kv_num_heads=h)

    def gdn(name, lead, hq, hv, dk, dv, seed, cu=None, qwen=False, l2=False, rule="gated_delta",
            state=True, per_key=False, dtype=np.float32, gate_dtype=None, **attrs):
        rng = np.random.default_rng(seed)
        u = lambda *s: rng.uniform(-1.0, 1.0, s).astype(np.float32)
        n = int(np.prod(lead))
        batch = len(cu) - 1 if cu is not None else (lead[0] if len(lead) == 2 else attrs.pop("batch"))
        k = u(*lead, hq, dk)
        if not l2:
            k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(np.float32)
        ins = [("query", None, u(*lead, hq, dk)), ("key", None, k), ("value", None, u(*lead, hv, dv)),
               ("cu_seqlens", None, np.array(cu, np.int32)) if cu is not None else None]
        gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        gshape = [*lead, hv, dk] if per_key else [*lead, hv]
        if qwen:
            ins.append(("decay", None, rng.uniform(-3.0, 3.0, gshape).astype(np.float32)))
        else:
            ins.append(("decay", None, -rng.uniform(0.0, 1.0, gshape).astype(np.float32))
                       if gated else None)
        beta = rng.uniform(-3.0, 3.0, [*lead, hv]) if qwen else rng.uniform(0.0, 1.0, [*lead, hv])
        ins.append(("beta", None, beta.astype(np.float32)) if delta else None)
        ins.append(("initial_state", None, u(batch, hv, dv, dk)) if state else None)
        if qwen:
            ins += [("a_log", None, rng.uniform(-2.0, 1.0, hv).astype(np.float32)),
                    ("dt_bias", None, rng.uniform(-1.0, 1.0, hv).astype(np.float32))]
            attrs.update(gate_activation="qwen", beta_activation="sigmoid")
        if l2:
            attrs["qk_l2_norm"] = 1
        # A float16 query, key and value (T); decay and beta (TG) float16 or float32; the state
        # float32 (TS) always.
        gate_dtype = gate_dtype or dtype
        typed = {"query": dtype, "key": dtype, "value": dtype, "decay": gate_dtype,
                 "beta": gate_dtype}
        ins = [x if x is None or x[0] not in typed else (x[0], None, x[2].astype(typed[x[0]]))
               for x in ins]
        out_type = [F16 if dtype == f16 else F32, F32]
        case(out, name, "GatedDeltaNet", ins, n_outputs=2, exact=True, update_rule=rule,
             out_type=out_type, **attrs)
    # The builder's dense layout: [B, S, H, D], qwen gate, sigmoid beta, qk_l2_norm, scale 0.
    gdn("gdn_builder_prompt", [2, 5], 2, 4, 16, 8, 30, qwen=True, l2=True, scale=0.0)
    gdn("gdn_builder_token", [2, 1], 2, 4, 16, 8, 31, qwen=True, l2=True)
    gdn("gdn_builder_128", [1, 3], 1, 2, 128, 128, 32, qwen=True, l2=True)
    # The builder's packed layout: ragged cu_seqlens (one empty request).
    gdn("gdn_varlen", [7], 2, 2, 16, 16, 33, cu=[0, 3, 3, 7], qwen=True, l2=True)
    gdn("gdn_uniform_rank3", [6], 1, 2, 8, 8, 34, batch=2, scale=0.5)
    gdn("gdn_no_state", [1, 4], 1, 1, 8, 8, 35, state=False)
    gdn("gdn_linear", [1, 4], 2, 2, 8, 8, 36, rule="linear")
    gdn("gdn_gated_per_key", [1, 4], 1, 1, 8, 8, 37, rule="gated", per_key=True)
    gdn("gdn_delta", [1, 4], 1, 2, 8, 8, 38, rule="delta")
    # ORT 1.32's float16 kernel: f32 inside from the widened inputs, the output rounded once,
    # the state float32 (measured bit for bit), with float16 and with float32 decay and beta.
    gdn("gdn_f16_builder", [2, 3], 2, 4, 16, 8, 39, qwen=True, l2=True, dtype=f16)
    gdn("gdn_f16_gates_f32", [6], 1, 2, 8, 8, 40, cu=[0, 2, 6], dtype=f16, gate_dtype=np.float32)
    linear_attention_chain(out)


def linear_attention_chain(out):
    """ONNX Runtime GenAI's Qwen3.5 linear attention in small: LinearAttentionGate makes the
    decay and beta that GatedDeltaNet (dense [B, S, H, D] layout, qk_l2_norm) reads with a
    float32 state, over a 5-token prompt after a past state. Outputs Y and the final state. Its
    float16 export writes both ops in float16 with the state float32 (tests/integration/
    contrib.rs)."""
    rng = np.random.default_rng(43)
    d = os.path.join(out, "linear_attention_chain")
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    b, t, hq, hv, dk, dv = 1, 5, 2, 4, 16, 16
    u = lambda shape, lo=-1.0, hi=1.0: rng.uniform(lo, hi, shape).astype(np.float32)
    inits = [numpy_helper.from_array(u([hv], -1.0, 1.0), "dt_bias"),
             numpy_helper.from_array(-np.exp(u([hv], -3.0, 0.0)), "decay_scale")]
    nodes = [
        helper.make_node("LinearAttentionGate", ["a", "dt_bias", "decay_scale", "b"],
                         ["decay", "beta"], domain=MS, name="gate"),
        helper.make_node("GatedDeltaNet", ["q", "k", "v", "", "decay", "beta", "state"],
                         ["Y", "final_state"], domain=MS, name="gdn", qk_l2_norm=1),
    ]
    feeds = [("q", u([b, t, hq, dk])), ("k", u([b, t, hq, dk])), ("v", u([b, t, hv, dv])),
             ("a", u([b, t, hv], -4.0, 4.0)), ("b", u([b, t, hv], -4.0, 4.0)),
             ("state", u([b, hv, dv, dk]))]
    vi = lambda n, v: helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(v.shape))
    graph = helper.make_graph(
        nodes, "linear_attention_chain", [vi(n, v) for n, v in feeds],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("final_state", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    onnx.save(model, os.path.join(d, "model.onnx"))
    for k, (n, v) in enumerate(feeds):
        with open(os.path.join(d, "inputs", f"input_{k}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, n).SerializeToString())
    with open(os.path.join(d, "exact"), "w") as f:
        f.write("")


if __name__ == "__main__":
    main()
