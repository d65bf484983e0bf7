#!/usr/bin/env python3
"""Writes small LSTM/GRU/RNN models covering what the ONNX conformance data lacks.

Usage: gen_recurrent_cases.py OUT_DIR

For each case: OUT_DIR/<name>/model.onnx and OUT_DIR/<name>/inputs/input_K.pb (deterministic
random data, NumPy seed fixed per case). tests/integration/recurrent.rs runs ONNX Runtime on them
through scripts/ort_batch.py and compares mixprec's outputs with ORT's. Covered: bidirectional
and reverse with sequence_lens, layout 1, clip, every activation with alpha/beta, peepholes,
input_forget, linear_before_reset, initial states, omitted outputs, opsets 7, 14 and 22.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def case(out, name, op, *, seq=5, batch=3, inp=4, hidden=3, direction="forward", layout=0,
         lens=None, init_h=False, init_c=False, peep=False, bias=True, outputs=("Y", "Y_h", "Y_c"),
         opset=14, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    x_shape = [batch, seq, inp] if layout else [seq, batch, inp]
    st_shape = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    feeds = {"X": rng.uniform(-1.5, 1.5, x_shape).astype(np.float32)}
    inits = {
        "W": rng.uniform(-0.8, 0.8, [dirs, g * hidden, inp]).astype(np.float32),
        "R": rng.uniform(-0.8, 0.8, [dirs, g * hidden, hidden]).astype(np.float32),
    }
    names = ["X", "W", "R"]
    if bias:
        inits["B"] = rng.uniform(-0.5, 0.5, [dirs, 2 * g * hidden]).astype(np.float32)
    names.append("B" if bias else "")
    if lens is not None:
        feeds["sequence_lens"] = np.array(lens, dtype=np.int32)
    names.append("sequence_lens" if lens is not None else "")
    if init_h:
        feeds["initial_h"] = rng.uniform(-1, 1, st_shape).astype(np.float32)
    names.append("initial_h" if init_h else "")
    if op == "LSTM":
        if init_c:
            feeds["initial_c"] = rng.uniform(-1, 1, st_shape).astype(np.float32)
        names.append("initial_c" if init_c else "")
        if peep:
            inits["P"] = rng.uniform(-0.5, 0.5, [dirs, 3 * hidden]).astype(np.float32)
        names.append("P" if peep else "")
    while names and names[-1] == "":
        names.pop()
    all_outs = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    node_outs = [o if o in outputs else "" for o in all_outs]
    while node_outs and node_outs[-1] == "":
        node_outs.pop()
    kw = dict(attrs)
    kw["hidden_size"] = hidden
    kw["direction"] = direction
    y_shape = [batch, seq, dirs, hidden] if layout else [seq, dirs, batch, hidden]
    out_shapes = {"Y": y_shape, "Y_h": st_shape, "Y_c": st_shape}

    def model_of(nodes):
        graph = helper.make_graph(
            nodes,
            name,
            [helper.make_tensor_value_info(k, TensorProto.INT32 if k == "sequence_lens"
                                           else TensorProto.FLOAT, list(v.shape))
             for k, v in feeds.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, out_shapes[o])
             for o in node_outs if o],
            [numpy_helper.from_array(v, k) for k, v in inits.items()],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model

    if opset >= 14:
        kw["layout"] = layout
    model = model_of([helper.make_node(op, names, node_outs, name="rec", **kw)])
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    onnx.save(model, os.path.join(d, "model.onnx"))
    if layout:
        # ONNX Runtime's CPU kernels refuse layout 1: its reference is the layout-0 node between
        # exact Transposes (ort_model.onnx).
        kw["layout"] = 0
        pre, ins0 = [], []
        for n in names:
            if n in ("X", "initial_h", "initial_c"):
                pre.append(helper.make_node("Transpose", [n], [n + "_t"], perm=[1, 0, 2]))
                ins0.append(n + "_t")
            else:
                ins0.append(n)
        outs0 = [o + "_t" if o else "" for o in node_outs]
        post = [helper.make_node("Transpose", [o + "_t"], [o],
                                 perm=[2, 0, 1, 3] if o == "Y" else [1, 0, 2])
                for o in node_outs if o]
        onnx.save(model_of(pre + [helper.make_node(op, ins0, outs0, name="rec", **kw)] + post),
                  os.path.join(d, "ort_model.onnx"))
    for i, (k, v) in enumerate(feeds.items()):
        with open(os.path.join(d, "inputs", f"input_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, k).SerializeToString())


def main():
    out = sys.argv[1]
    # LSTM
    case(out, "lstm_bidirectional_seq_lens", "LSTM", direction="bidirectional", lens=[5, 2, 3],
         init_h=True, init_c=True, peep=True, seed=1)
    case(out, "lstm_layout1_bidirectional", "LSTM", direction="bidirectional", layout=1,
         lens=[4, 5, 1], init_h=True, init_c=True, seed=2)
    case(out, "lstm_reverse_peepholes", "LSTM", direction="reverse", lens=[3, 5, 2],
         peep=True, init_c=True, seed=3)
    case(out, "lstm_clip_input_forget_activations", "LSTM", clip=0.7, input_forget=1,
         activations=["HardSigmoid", "Softsign", "Elu"], activation_alpha=[0.3, 0.8],
         activation_beta=[0.45], init_h=True, seed=4)
    case(out, "lstm_bidirectional_activations", "LSTM", direction="bidirectional",
         activations=["Sigmoid", "ScaledTanh", "Softplus", "HardSigmoid", "Tanh", "Affine"],
         activation_alpha=[1.2, 0.25, 0.9], activation_beta=[0.7, 0.5, 0.1], seed=5)
    case(out, "lstm_only_final_states", "LSTM", outputs=("Y_h", "Y_c"), lens=[2, 5, 4], seed=6)
    case(out, "lstm_opset7_no_bias", "LSTM", opset=7, bias=False, init_h=True, seed=7)
    case(out, "lstm_opset22_layout1", "LSTM", opset=22, layout=1, direction="reverse",
         init_h=True, init_c=True, seed=8)
    case(out, "lstm_zero_length_entry", "LSTM", direction="bidirectional", lens=[0, 5, 2],
         init_h=True, init_c=True, seed=9)
    # GRU
    case(out, "gru_bidirectional_linear_before_reset", "GRU", direction="bidirectional",
         linear_before_reset=1, lens=[5, 3, 1], init_h=True, seed=11)
    case(out, "gru_reverse_layout1_clip", "GRU", direction="reverse", layout=1, clip=0.6,
         lens=[2, 5, 4], activations=["LeakyRelu", "ScaledTanh"], activation_alpha=[0.2, 0.9],
         activation_beta=[1.3], seed=12)
    case(out, "gru_activations", "GRU", direction="bidirectional",
         activations=["Sigmoid", "ThresholdedRelu", "HardSigmoid", "Softplus"],
         activation_alpha=[0.1, 0.25], activation_beta=[0.6], init_h=True, seed=13)
    case(out, "gru_only_y", "GRU", outputs=("Y",), opset=22, seed=14)
    case(out, "gru_opset7", "GRU", opset=7, linear_before_reset=1, seed=15)
    # RNN
    case(out, "rnn_bidirectional_seq_lens_layout1", "RNN", direction="bidirectional", layout=1,
         lens=[1, 5, 3], activations=["Relu", "Tanh"], init_h=True, seed=21)
    case(out, "rnn_reverse_clip_thresholded_relu", "RNN", direction="reverse", clip=0.9,
         activations=["ThresholdedRelu"], activation_alpha=[0.2], lens=[5, 4, 2], seed=22)
    case(out, "rnn_zero_length_entry", "RNN", lens=[3, 0, 5], init_h=True, seed=26)
    case(out, "rnn_elu", "RNN", activations=["Elu"], activation_alpha=[0.5], seed=23)
    case(out, "rnn_softsign_bidirectional", "RNN", direction="bidirectional",
         activations=["Softsign", "Softsign"], opset=22, init_h=True, seed=24)
    case(out, "rnn_affine_leakyrelu", "RNN", direction="bidirectional",
         activations=["Affine", "LeakyRelu"], activation_alpha=[0.5], activation_beta=[0.1],
         seed=25)


if __name__ == "__main__":
    main()
