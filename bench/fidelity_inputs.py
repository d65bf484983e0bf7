#!/usr/bin/env python3
"""Inputs of bench/fidelity.sh for the models whose inputs mixprec's generator cannot make:
a decoder LLM's prompt (token ids of real text, its attention mask, position ids 0..n-1 and an
empty KV cache).

Usage: fidelity_inputs.py prompt MODEL.onnx TOKENS.json OUT.json

  prompt   SmolLM2 plain (scripts/smollm2_to_onnx.py's plain/ export): eight chat turns spelled
           in the GGUF's own tokens (TOKENS.json, token strings by id), one input set each:
           input_ids and attention_mask [1, n] (all ones), position_ids [1, n] = 0..n-1, and
           every past_key_values.* input empty ([1, kv_heads, 0, head_size], its declared type).

Writes Polygraphy JSON (a list of feed dicts), the format of `mixprec run --load-inputs`.
Deterministic: the same files give the same bytes.
"""
import json
import os
import sys

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from gpu_reference import _encode_array  # noqa: E402

# `<|im_start|>user\n` + a seven-token question + `<|im_end|>\n<|im_start|>assistant\n`, 16 tokens each
# (gpu_reference.py compiles for the first input set's shapes), spelled in the GGUF's own tokens
# (Ġ a leading space, Ċ a newline); the first is the prompt of tests/integration/transformers.rs.
# Eight prompts: a logit's error is one token's hidden-state error projected on the vocabulary,
# so the median over the logits is a median over the prompts' tokens (16 each).
QUESTIONS = [
    ["What", "Ġis", "Ġthe", "Ġcapital", "Ġof", "ĠFrance", "?"],
    ["Write", "Ġa", "Ġshort", "Ġpoem", "Ġabout", "Ġthe", "Ġsea"],
    ["How", "Ġdo", "Ġplants", "Ġmake", "Ġtheir", "Ġfood", "?"],
    ["Name", "Ġthree", "Ġcolors", "Ġof", "Ġthe", "Ġrainbow", "."],
    ["Why", "Ġis", "Ġthe", "Ġsky", "Ġblue", "Ġtoday", "?"],
    ["Give", "Ġme", "Ġa", "Ġrecipe", "Ġfor", "Ġsoup", "."],
    ["Say", "Ġhello", "Ġin", "ĠFrench", ",", "Ġplease", "."],
    ["What", "Ġyear", "Ġdid", "Ġthe", "Ġwar", "Ġend", "?"],
]
PROMPTS = [["<|im_start|>", "user", "Ċ"] + q + ["<|im_end|>", "Ċ", "<|im_start|>", "ass", "istant", "Ċ"]
           for q in QUESTIONS]

NP_TYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
            onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32}


def prompt_feeds(model_path, tokens_path):
    vocab = json.load(open(tokens_path))
    index = {t: i for i, t in enumerate(vocab)}
    graph = onnx.load(model_path, load_external_data=False).graph
    inits = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    feeds = []
    for prompt in PROMPTS:
        missing = [t for t in prompt if t not in index]
        if missing:
            raise SystemExit(f"fidelity_inputs.py: tokens {missing} are not in {tokens_path}")
        ids = np.array([[index[t] for t in prompt]], np.int64)
        n = ids.shape[1]
        feed = {}
        for vi in inputs:
            tt = vi.type.tensor_type
            dt = NP_TYPES[tt.elem_type]
            if vi.name == "input_ids":
                feed[vi.name] = ids.astype(dt)
            elif vi.name == "attention_mask":
                feed[vi.name] = np.ones((1, n), dt)
            elif vi.name == "position_ids":
                feed[vi.name] = np.arange(n, dtype=dt).reshape(1, n)
            elif vi.name.startswith("past_key_values."):
                dims = [d.dim_value for d in tt.shape.dim]
                feed[vi.name] = np.zeros((1, dims[1], 0, dims[3]), dt)
            else:
                raise SystemExit(f"fidelity_inputs.py: input '{vi.name}' is not a decoder LLM's")
        feeds.append(feed)
    return feeds


def main(argv):
    if len(argv) != 5 or argv[1] != "prompt":
        print(__doc__, file=sys.stderr)
        return 2
    feeds = prompt_feeds(argv[2], argv[3])
    with open(argv[4], "w") as f:
        json.dump([{k: _encode_array(v) for k, v in feed.items()} for feed in feeds], f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
