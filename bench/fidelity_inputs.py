#!/usr/bin/env python3
"""Inputs of bench/fidelity.sh for the models whose inputs mixprec's generator cannot make:
a decoder LLM's prompt (token ids of real text, its attention mask, position ids 0..n-1 and an
empty KV cache); and mixprec's own generated inputs written again from a recipe, on a machine
the inputs are too large to carry to (the device tool's 64 MiB a call: 64 ViT images are 51 MB
of JSON beside a 50 MB export).

Usage: fidelity_inputs.py prompt MODEL.onnx TOKENS.json OUT.json
       fidelity_inputs.py recipe IN.json RANGES SEED OUT.recipe
       fidelity_inputs.py regen RECIPE OUT.json
       fidelity_inputs.py digest IN.json

  prompt   SmolLM2 plain (scripts/smollm2_to_onnx.py's plain/ export): eight chat turns spelled
           in the GGUF's own tokens (TOKENS.json, token strings by id), one input set each:
           input_ids and attention_mask [1, n] (all ones), position_ids [1, n] = 0..n-1, and
           every past_key_values.* input empty ([1, kv_heads, 0, head_size], its declared type).

  recipe   IN.json (`mixprec run --val-range RANGES --seed SEED --save-inputs`, float inputs
           only) as a recipe: per input set and input the name, dtype, shape and range, and the
           digest of IN.json's arrays; refused when regen does not give those arrays back.
  regen    the inputs again from a recipe, as mixprec's generator draws them (Polygraphy's
           default data loader, src/data/loader.rs): set i from NumPy's legacy
           RandomState(SEED + i), the inputs in order, random_sample(n) * (hi - lo) + lo cast
           to the dtype; checks the digest (exit status 1 when it differs).
  digest   a sha256 of the arrays (names, dtypes, shapes, bytes) of every input set, in order.

Writes Polygraphy JSON (a list of feed dicts), the format of `mixprec run --load-inputs`.
Deterministic: the same files give the same bytes.
"""
import hashlib
import json
import os
import sys

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # beside it on the GPU machine
from gpu_reference import _decode_array, _encode_array  # noqa: E402

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


FLOAT_TYPES = {"float32": np.float32, "float64": np.float64, "float16": np.float16}


def load_feeds(path):
    with open(path) as f:
        doc = json.load(f)
    if isinstance(doc, dict):
        doc = [doc]
    return [{k: _decode_array(v) for k, v in feed.items()} for feed in doc]


def digest(feeds):
    h = hashlib.sha256()
    for feed in feeds:
        for name, a in feed.items():
            a = np.ascontiguousarray(a)
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def parse_ranges(text):
    """bench/fidelity.sh's value-range column: '[lo,hi]' for every input, or 'name:[lo,hi]'
    items separated by ';' (mixprec's --val-range)."""
    ranges = {}
    for item in text.split(";"):
        name, rng = item.split(":[", 1) if ":[" in item else ("", item)
        lo, hi = (float(x) for x in rng.strip().strip("[]").split(","))
        ranges[name] = (lo, hi)
    return ranges


def make_recipe(in_path, ranges_text, seed):
    feeds = load_feeds(in_path)
    ranges = parse_ranges(ranges_text)
    inputs = []
    for name, a in feeds[0].items():
        if a.dtype.name not in FLOAT_TYPES:
            raise SystemExit(f"fidelity_inputs.py: input '{name}' is {a.dtype}: regen draws float inputs only")
        lo, hi = ranges.get(name, ranges.get("", (0.0, 1.0)))  # Polygraphy's default range
        inputs.append({"name": name, "dtype": a.dtype.name, "shape": list(a.shape), "range": [lo, hi]})
    recipe = {"seed": seed, "sets": len(feeds), "inputs": inputs, "digest": digest(feeds)}
    if digest(regen_feeds(recipe)) != recipe["digest"]:
        raise SystemExit(f"fidelity_inputs.py: regen does not give {in_path}'s arrays back; no recipe")
    return recipe


def regen_feeds(recipe):
    feeds = []
    for i in range(recipe["sets"]):
        rng = np.random.RandomState(recipe["seed"] + i)
        feed = {}
        for vi in recipe["inputs"]:
            lo, hi = vi["range"]
            n = int(np.prod(vi["shape"], dtype=np.int64))
            x = rng.random_sample(n) * (hi - lo) + lo
            feed[vi["name"]] = x.astype(FLOAT_TYPES[vi["dtype"]]).reshape(vi["shape"])
        feeds.append(feed)
    return feeds


def write_feeds(path, feeds):
    with open(path, "w") as f:
        json.dump([{k: _encode_array(v) for k, v in feed.items()} for feed in feeds], f)


def main(argv):
    if len(argv) == 5 and argv[1] == "prompt":
        write_feeds(argv[4], prompt_feeds(argv[2], argv[3]))
        return 0
    if len(argv) == 6 and argv[1] == "recipe":
        with open(argv[5], "w") as f:
            json.dump(make_recipe(argv[2], argv[3], int(argv[4])), f, indent=1)
        return 0
    if len(argv) == 4 and argv[1] == "regen":
        recipe = json.load(open(argv[2]))
        feeds = regen_feeds(recipe)
        if digest(feeds) != recipe["digest"]:
            print(f"fidelity_inputs.py: the regenerated inputs differ from the recipe's digest", file=sys.stderr)
            return 1
        write_feeds(argv[3], feeds)
        return 0
    if len(argv) == 3 and argv[1] == "digest":
        print(digest(load_feeds(argv[2])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
