#!/usr/bin/env python3
"""Greedy generation with a decoder LLM in ONNX Runtime or in ONNX Runtime GenAI (the clients
tests/integration/transformers.rs compares mixprec with).

Usage:
  llm_generate.py ort MODEL.onnx --prompt 1,2,3 --new N --eos ID --out DIR
  llm_generate.py genai MODEL_DIR --prompt 1,2,3 --new N --eos ID --out DIR

ort: an InferenceSession (CPU, one thread) runs the prompt, then one token at a time through
the KV cache: every `present.K.key/value` output is fed back as `past_key_values.K.key/value`,
attention_mask grows by one, and position_ids (when the model has that input) count on. The
first step's past is empty ([batch, kv_heads, 0, head_size], in the input's declared type).
Stops after --new steps or at --eos. Writes DIR/tokens.json (the generated ids before EOS) and
DIR/logits.npz (`step_K`: the last position's logits of step K, float32 [vocab], the EOS step
included).

genai: onnxruntime_genai's Model/Generator over MODEL_DIR (model.onnx + genai_config.json),
greedy (do_sample false), max_length = prompt + N; GenAI stops at genai_config.json's
eos_token_id itself. Writes DIR/tokens.json (the ids after the prompt, before --eos).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bfloat16)": np.float32}


def before_eos(ids: list[int], eos: int) -> list[int]:
    return ids[: ids.index(eos)] if eos in ids else ids


def run_ort(model: str, prompt: list[int], new: int, eos: int, out: str) -> None:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    outputs = [o.name for o in sess.get_outputs()]
    feeds: dict[str, np.ndarray] = {}
    for name, meta in inputs.items():
        if name.startswith("past_key_values."):
            shape = [1 if isinstance(d, str) and "batch" in d else 0 if isinstance(d, str) else d for d in meta.shape]
            feeds[name] = np.zeros(shape, dtype=NP_TYPES[meta.type])
    ids = list(prompt)
    generated: list[int] = []
    logits_steps: dict[str, np.ndarray] = {}
    step_ids = ids
    for step in range(new):
        total = len(ids)
        feeds["input_ids"] = np.array([step_ids], dtype=np.int64)
        feeds["attention_mask"] = np.ones((1, total), dtype=np.int64)
        if "position_ids" in inputs:
            feeds["position_ids"] = np.arange(total - len(step_ids), total, dtype=np.int64)[None]
        results = dict(zip(outputs, sess.run(outputs, feeds)))
        last = np.asarray(results["logits"][0, -1], dtype=np.float32)
        logits_steps[f"step_{step}"] = last
        token = int(last.argmax())
        if token == eos:
            break
        generated.append(token)
        for name in outputs:
            if name.startswith("present."):
                feeds["past_key_values." + name[len("present."):]] = results[name]
        ids.append(token)
        step_ids = [token]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump(generated, f)
    np.savez(os.path.join(out, "logits.npz"), **logits_steps)


def run_genai(model_dir: str, prompt: list[int], new: int, eos: int, out: str) -> None:
    import onnxruntime_genai as og

    model = og.Model(model_dir)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + new)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array(prompt, dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    seq = [int(t) for t in gen.get_sequence(0)]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump(before_eos(seq[len(prompt):], eos), f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("client", choices=["ort", "genai"])
    ap.add_argument("model")
    ap.add_argument("--prompt", required=True, help="token ids, comma-separated")
    ap.add_argument("--new", type=int, required=True, help="tokens to generate")
    ap.add_argument("--eos", type=int, required=True, help="the end-of-turn token id")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    prompt = [int(t) for t in args.prompt.split(",")]
    try:
        if args.client == "ort":
            run_ort(args.model, prompt, args.new, args.eos, args.out)
        else:
            run_genai(args.model, prompt, args.new, args.eos, args.out)
    except Exception as e:  # ORT and GenAI raise their own exception types
        print(f"llm_generate.py {args.client}: {type(e).__name__}: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
